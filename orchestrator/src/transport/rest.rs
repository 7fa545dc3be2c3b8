//! The REST door's connections: TLS or not, HTTP/1.1 or HTTP/2 by hyper, closed when
//! idle, and requests too large refused before a route sees them.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures::FutureExt as _;
use hyper::body::{Body as HttpBody, Frame, SizeHint};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::WaitForCancellationFutureOwned;
use tokio_util::task::TaskTracker;
use tower::Service;

use super::{
    Gate, Lifecycle, MAX_HEADER_BYTES, MAX_HEADERS, MAX_URI_BYTES, TLS_HANDSHAKE, TransportConfig, accept_loop,
    first_byte, keepalive,
};

/// Headers hyper itself parses before the check of [`MAX_HEADERS`] sees them; past this
/// it answers 431 with an empty body (the JSON shape cannot be given to what is never
/// parsed).
const HYPER_MAX_HEADERS: usize = 4 * MAX_HEADERS;
/// HTTP/2 streams one REST connection may have open at once.
const MAX_H2_STREAMS: u32 = 64;
/// How often an idle HTTP/2 REST connection is pinged, and how long an answer may take.
const H2_KEEPALIVE: Duration = Duration::from_secs(20);

/// The REST door: its router, TLS, timeouts and the body limit its routes read.
#[derive(Clone)]
pub struct RestService {
    /// The routes.
    pub router: axum::Router,
    /// TLS, when the door speaks it.
    pub tls: Option<tokio_rustls::TlsAcceptor>,
    /// Timeouts and caps.
    pub config: TransportConfig,
    /// The largest request body a route reads: a larger declared `Content-Length` is
    /// refused at once.
    pub max_body_bytes: u64,
    /// Its shutdown, and the owner of the tasks it starts beside its connections
    /// (reading what a refused request still sends).
    pub lifecycle: Lifecycle,
}

/// Serves REST on `listener` with `cap` connections at most, until the service's
/// `shutdown` is cancelled and the connections have drained (or the future is dropped).
pub async fn serve_rest(listener: TcpListener, cap: usize, service: RestService) {
    let service = Arc::new(service);
    let shutdown = service.lifecycle.shutdown.clone();
    accept_loop(
        listener,
        Gate::new("REST API", cap),
        shutdown,
        move |stream, peer, permit| {
            let service = Arc::clone(&service);
            async move {
                rest_connection(stream, peer, &service).await;
                drop(permit);
            }
        },
    )
    .await;
}

async fn rest_connection(stream: TcpStream, peer: SocketAddr, service: &RestService) {
    let config = &service.config;
    let first = tokio::select! {
        first = first_byte(&stream, config.header_read_timeout) => first,
        () = service.lifecycle.shutdown.cancelled() => None,
    };
    let Some(first) = first else {
        tracing::debug!(%peer, "closed a REST connection that said nothing");
        return;
    };
    keepalive(&stream);
    match &service.tls {
        None => serve_http(TokioIo::new(stream), service).await,
        Some(_) if first != TLS_HANDSHAKE => plaintext_on_tls(stream, peer).await,
        Some(acceptor) => match tokio::time::timeout(config.header_read_timeout, acceptor.accept(stream)).await {
            Ok(Ok(tls)) => serve_http(TokioIo::new(tls), service).await,
            Ok(Err(error)) => tracing::debug!(%peer, %error, "a TLS handshake failed"),
            Err(_) => tracing::debug!(%peer, "a TLS handshake did not finish in time"),
        },
    }
}

/// Answers a client that speaks plain HTTP to the TLS door with a 400 that says so,
/// then closes.
async fn plaintext_on_tls(mut stream: TcpStream, peer: SocketAddr) {
    tracing::debug!(%peer, "plain HTTP on the TLS port");
    let body = serde_json::json!({
        "error": {
            "code": "tls_required",
            "message": "this port speaks HTTPS only: use https:// (the server printed its certificate's fingerprint at start; pin it with --server-fingerprint)",
        }
    })
    .to_string();
    let answer = format!(
        "HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let write = async {
        stream.write_all(answer.as_bytes()).await?;
        stream.shutdown().await
    };
    let _ = tokio::time::timeout(Duration::from_secs(5), write).await;
}

/// Serves HTTP/1.1 or HTTP/2 on one connection until it ends, is idle too long, or its
/// peer is too slow.
async fn serve_http<I>(io: I, service: &RestService)
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let config = &service.config;
    let activity = Arc::new(Activity::new());
    let router = service.router.clone();
    let max_body = service.max_body_bytes;
    let linger = config.header_read_timeout;
    let requests = Arc::clone(&activity);
    let Lifecycle { shutdown, tasks } = service.lifecycle.clone();
    let hyper_service = hyper::service::service_fn(move |request: hyper::Request<hyper::body::Incoming>| {
        let mut router = router.clone();
        let in_flight = InFlight::begin(&requests);
        let (shutdown, tasks) = (shutdown.clone(), tasks.clone());
        async move {
            let request = request.map(axum::body::Body::new);
            let response = match refusal(&request, max_body) {
                Some(mut refused) => {
                    linger_on(&tasks, request.into_body(), max_body, linger);
                    refused
                        .headers_mut()
                        .insert(header::CONNECTION, header::HeaderValue::from_static("close"));
                    refused
                }
                None => {
                    let (method, path) = (request.method().clone(), request.uri().path().to_owned());
                    // A route that panics costs its request, answered 500, never more.
                    match std::panic::AssertUnwindSafe(router.call(request)).catch_unwind().await {
                        Ok(Ok(response)) => response,
                        Ok(Err(never)) => match never {},
                        Err(_) => {
                            tracing::error!(%method, %path, "a route panicked; answered 500");
                            crate::api::ApiError::internal(
                                "the server failed on this request (it is logged); it is a bug: please report it",
                            )
                            .into_response()
                        }
                    }
                }
            };
            // An event stream has no end of its own: it ends when the server stops.
            let endless = response
                .headers()
                .get(header::CONTENT_TYPE)
                .is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
            let until = endless.then(|| Box::pin(shutdown.cancelled_owned()));
            Ok::<_, Infallible>(response.map(|body| {
                axum::body::Body::new(Tracked {
                    inner: body,
                    _in_flight: in_flight,
                    until,
                })
            }))
        }
    });
    let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(config.header_read_timeout)
        .max_headers(HYPER_MAX_HEADERS);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(MAX_H2_STREAMS)
        .max_header_list_size(u32::try_from(MAX_HEADER_BYTES * 2).unwrap_or(u32::MAX))
        .keep_alive_interval(H2_KEEPALIVE)
        .keep_alive_timeout(H2_KEEPALIVE);
    let connection = builder.serve_connection(io, hyper_service);
    tokio::pin!(connection);
    tokio::select! {
        result = connection.as_mut() => {
            if let Err(error) = result {
                tracing::debug!(%error, "a REST connection ended with an error");
            }
            return;
        }
        () = activity.idle_for(config.idle_timeout) => {}
        () = service.lifecycle.shutdown.cancelled() => {
            // Stopping: the requests in flight are answered (the server bounds how
            // long it waits), then the connection closes.
            connection.as_mut().graceful_shutdown();
            if let Err(error) = connection.await {
                tracing::debug!(%error, "a REST connection ended with an error while the server stopped");
            }
            return;
        }
    }
    // Idle: close it politely (HTTP/2 says GOAWAY), then for good if the peer dawdles.
    connection.as_mut().graceful_shutdown();
    let _ = tokio::time::timeout(config.header_read_timeout, connection).await;
}

/// Reads and drops what a refused request still sends of its body, up to `limit` bytes
/// and for `timeout` at most, while its answer goes out: a client still writing a body
/// when the server closes would get a reset in place of the answer. Past either bound
/// the body is dropped and the connection (marked `Connection: close`) ends.
fn linger_on(tasks: &TaskTracker, body: axum::body::Body, limit: u64, timeout: Duration) {
    use futures::StreamExt as _;
    // Bounded by `timeout`; owned by the door's tracker, which the server waits for.
    tasks.spawn(async move {
        let drain = async {
            let mut stream = body.into_data_stream();
            let mut seen = 0u64;
            while let Some(Ok(chunk)) = stream.next().await {
                seen = seen.saturating_add(chunk.len() as u64);
                if seen > limit {
                    break;
                }
            }
        };
        let _ = tokio::time::timeout(timeout, drain).await;
    });
}

/// The answer to a request refused before its route sees it: a target, headers or a
/// declared body larger than the server reads.
fn refusal(request: &axum::extract::Request, max_body: u64) -> Option<Response> {
    use crate::api::ApiError;
    let target = request.uri().path_and_query().map_or(0, |p| p.as_str().len());
    if target > MAX_URI_BYTES {
        return Some(
            ApiError::new(
                StatusCode::URI_TOO_LONG,
                format!(
                    "the request's target is {target} bytes; at most {MAX_URI_BYTES} are read: send long values in the body"
                ),
            )
            .code("uri_too_long")
            .into_response(),
        );
    }
    let headers = request.headers();
    let header_bytes: usize = headers
        .iter()
        .map(|(name, value)| name.as_str().len() + value.len())
        .sum();
    if headers.len() > MAX_HEADERS || header_bytes > MAX_HEADER_BYTES {
        return Some(
            ApiError::new(
                StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
                format!(
                    "the request has {} headers of {header_bytes} bytes; at most {MAX_HEADERS} headers of {MAX_HEADER_BYTES} bytes in all are read",
                    headers.len()
                ),
            )
            .code("headers_too_large")
            .into_response(),
        );
    }
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    if let Some(declared) = declared
        && declared > max_body
    {
        return Some(
            ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!(
                    "the body is declared as {declared} bytes; the server reads at most {max_body} bytes per request: send less"
                ),
            )
            .into_response(),
        );
    }
    None
}

/// Requests in flight on one connection, and since when it has had none.
struct Activity {
    active: AtomicUsize,
    idle_since: Mutex<Instant>,
    changed: Notify,
}

impl Activity {
    fn new() -> Activity {
        Activity {
            active: AtomicUsize::new(0),
            idle_since: Mutex::new(Instant::now()),
            changed: Notify::new(),
        }
    }

    /// Returns once the connection has had no request in flight for `limit`.
    async fn idle_for(&self, limit: Duration) {
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if self.active.load(Ordering::Acquire) == 0 {
                let since = *self.idle_since.lock().unwrap_or_else(PoisonError::into_inner);
                let deadline = since + limit;
                if Instant::now() >= deadline {
                    return;
                }
                tokio::select! {
                    () = tokio::time::sleep_until(deadline) => {}
                    () = changed => {}
                }
            } else {
                changed.await;
            }
        }
    }
}

/// One request in flight, until its answer's body is sent or dropped.
struct InFlight(Arc<Activity>);

impl InFlight {
    fn begin(activity: &Arc<Activity>) -> InFlight {
        activity.active.fetch_add(1, Ordering::AcqRel);
        activity.changed.notify_waiters();
        InFlight(Arc::clone(activity))
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let activity = &self.0;
        if activity.active.fetch_sub(1, Ordering::AcqRel) == 1 {
            *activity.idle_since.lock().unwrap_or_else(PoisonError::into_inner) = Instant::now();
        }
        activity.changed.notify_waiters();
    }
}

/// An answer's body that keeps its request in flight until it is done; an event
/// stream's also ends when `until` (the server's shutdown) is ready.
struct Tracked {
    inner: axum::body::Body,
    _in_flight: InFlight,
    until: Option<Pin<Box<WaitForCancellationFutureOwned>>>,
}

impl HttpBody for Tracked {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.get_mut();
        if let Some(until) = this.until.as_mut()
            && until.as_mut().poll(cx).is_ready()
        {
            return Poll::Ready(None);
        }
        Pin::new(&mut this.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(uri: &str, headers: &[(&str, &str)]) -> axum::extract::Request {
        let mut builder = axum::http::Request::builder().uri(uri);
        for (name, value) in headers {
            builder = builder.header(*name, *value);
        }
        builder.body(axum::body::Body::empty()).unwrap()
    }

    #[test]
    fn oversized_requests_are_refused_with_what_is_wrong() {
        let long = format!("/v1/runs?q={}", "a".repeat(MAX_URI_BYTES));
        let refused = refusal(&request(&long, &[]), 1024).unwrap();
        assert_eq!(refused.status(), StatusCode::URI_TOO_LONG);

        let many: Vec<(String, String)> = (0..=MAX_HEADERS).map(|i| (format!("x-h{i}"), "v".to_owned())).collect();
        let many: Vec<(&str, &str)> = many.iter().map(|(n, v)| (n.as_str(), v.as_str())).collect();
        let refused = refusal(&request("/", &many), 1024).unwrap();
        assert_eq!(refused.status(), StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE);

        let refused = refusal(&request("/v1/plans", &[("content-length", "99999999999999")]), 1024).unwrap();
        assert_eq!(refused.status(), StatusCode::PAYLOAD_TOO_LARGE);
        assert!(refusal(&request("/v1/plans", &[("content-length", "1024")]), 1024).is_none());
        assert!(refusal(&request("/v1/plans", &[]), 1024).is_none());
    }

    #[tokio::test]
    async fn a_route_that_panics_costs_only_its_request() {
        use tokio::io::AsyncReadExt as _;
        async fn boom() -> &'static str {
            panic!("a bug")
        }
        let router = axum::Router::new()
            .route("/boom", axum::routing::get(boom))
            .route("/ok", axum::routing::get(|| async { "ok" }));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let service = RestService {
            router,
            tls: None,
            config: TransportConfig::default(),
            max_body_bytes: 1024,
            lifecycle: Lifecycle::default(),
        };
        let server = tokio::spawn(serve_rest(listener, 16, service));
        let get = |path: &'static str| async move {
            let mut stream = TcpStream::connect(addr).await.unwrap();
            let request = format!("GET {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n");
            stream.write_all(request.as_bytes()).await.unwrap();
            let mut answer = String::new();
            stream.read_to_string(&mut answer).await.unwrap();
            answer
        };
        let boom = get("/boom").await;
        assert!(boom.starts_with("HTTP/1.1 500"), "{boom}");
        assert!(boom.contains(r#""code":"internal""#), "{boom}");
        let ok = get("/ok").await;
        assert!(ok.starts_with("HTTP/1.1 200"), "{ok}");
        server.abort();
    }

    #[tokio::test(start_paused = true)]
    async fn a_connection_is_idle_only_with_nothing_in_flight() {
        let activity = Arc::new(Activity::new());
        let limit = Duration::from_secs(60);
        let request = InFlight::begin(&activity);
        // A long answer (a stream of events) keeps it busy far past the limit.
        let waited = tokio::time::timeout(limit * 10, activity.idle_for(limit)).await;
        assert!(waited.is_err(), "idle while a request was in flight");
        drop(request);
        let waited = tokio::time::timeout(limit * 2, activity.idle_for(limit)).await;
        assert!(waited.is_ok(), "never idle after the request ended");
    }
}
