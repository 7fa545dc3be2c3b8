//! The server's two listeners as connections: who gets one, how long a silent or idle
//! one stays, and what is refused before a request reaches a route.
//!
//! Both listeners accept through a loop of ours so that each holds at most
//! [`TransportConfig::max_connections`] connections (beyond that a new connection is
//! closed at once: it never waits in the kernel's queue holding a descriptor), and a
//! connection that says nothing within [`TransportConfig::header_read_timeout`] is
//! closed before any protocol sees it. The open-file limit is raised to its hard limit
//! at start ([`raise_open_files_limit`]) and the caps are sized so that both listeners
//! together stay well below it ([`connection_cap`]): a flood of connections to one door
//! can no longer take the descriptors the other door, the database and the agents'
//! engines need.
//!
//! REST ([`serve_rest`]) is served by hyper (HTTP/1.1, and HTTP/2 by ALPN or prior
//! knowledge), optionally over TLS ([`tls`]):
//! - headers must arrive within the header-read timeout;
//! - a connection with no request in flight for [`TransportConfig::idle_timeout`] is
//!   closed (a streamed answer, server-sent events included, is a request in flight:
//!   it is never cut);
//! - a request whose URI, headers or declared `Content-Length` exceed the limits is
//!   answered 414, 431 or 413 in the API's JSON error shape before its body is read.
//!
//! gRPC ([`grpc_incoming`]) hands tonic the admitted connections; tonic then applies
//! its own HTTP/2 keepalive, stream and request limits (set in `server.rs`).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::http::{StatusCode, header};
use axum::response::Response;
use futures::FutureExt as _;
use hyper::body::{Body as HttpBody, Frame, SizeHint};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, mpsc};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};
use tokio_util::task::TaskTracker;
use tonic::transport::server::Connected;
use tower::Service;

pub mod tls;

/// How long a client has to send a request's headers by default (and a new connection
/// to send its first byte).
pub const DEFAULT_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a connection with no request in flight stays open by default.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// The longest request target (path and query) read, bytes: longer is 414.
pub const MAX_URI_BYTES: usize = 8 << 10;
/// The most request headers read: more is 431.
pub const MAX_HEADERS: usize = 100;
/// The most bytes of request headers (names and values) read: more is 431.
pub const MAX_HEADER_BYTES: usize = 64 << 10;
/// Headers hyper itself parses before the check above sees them; past this it answers
/// 431 with an empty body (the JSON shape cannot be given to what is never parsed).
const HYPER_MAX_HEADERS: usize = 4 * MAX_HEADERS;
/// Open files kept for everything but the two listeners: the database, engines' logs,
/// outgoing connections (hub, engines), at least this many or a quarter of the limit.
pub const RESERVED_FILES: u64 = 256;
/// The smallest connection cap, whatever the open-file limit.
const MIN_CONNECTIONS: usize = 16;
/// HTTP/2 streams one REST connection may have open at once.
const MAX_H2_STREAMS: u32 = 64;
/// How often an idle HTTP/2 REST connection is pinged, and how long an answer may take.
const H2_KEEPALIVE: Duration = Duration::from_secs(20);
/// Admitted gRPC connections waiting for tonic to take them.
const GRPC_BACKLOG: usize = 64;
/// How long the accept loop waits after an accept error (out of descriptors) before
/// trying again, so that it does not spin.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(100);

/// What stops the doors and owns the tasks they start: the server's shutdown token and
/// task tracker (cheap to clone; clones share them).
#[derive(Debug, Clone, Default)]
pub struct Lifecycle {
    /// Cancelled when the server stops: the doors stop accepting, every connection
    /// finishes the requests in flight and closes, and event streams end.
    pub shutdown: CancellationToken,
    /// Owns the doors' tasks (accept loops, what runs beside a connection); the server
    /// waits for it, within its drain timeout, before it exits.
    pub tasks: TaskTracker,
}

/// Timeouts and caps of both listeners.
#[derive(Debug, Clone)]
pub struct TransportConfig {
    /// How long a client has to send a request's headers, and a new connection its
    /// first byte (TLS handshake included).
    pub header_read_timeout: Duration,
    /// How long a connection with no request in flight stays open.
    pub idle_timeout: Duration,
    /// Connections each listener holds at most; `None`: as many as the open-file limit
    /// allows ([`connection_cap`]). A larger number is lowered to that.
    pub max_connections: Option<usize>,
}

impl Default for TransportConfig {
    fn default() -> TransportConfig {
        TransportConfig {
            header_read_timeout: DEFAULT_HEADER_READ_TIMEOUT,
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
            max_connections: None,
        }
    }
}

/// Raises this process's soft limit of open files to its hard limit, and returns the
/// soft limit now in force (`None` when it is unlimited or cannot be read).
pub fn raise_open_files_limit() -> Option<u64> {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let limit = getrlimit(Resource::Nofile);
    if let (Some(soft), Some(hard)) = (limit.current, limit.maximum)
        && soft < hard
    {
        let raised = Rlimit {
            current: Some(hard),
            maximum: Some(hard),
        };
        match setrlimit(Resource::Nofile, raised) {
            Ok(()) => {
                tracing::info!(from = soft, to = hard, "raised the open-file limit");
                return Some(hard);
            }
            Err(error) => {
                tracing::warn!(%error, soft, hard, "cannot raise the open-file limit; connection caps follow the soft limit");
            }
        }
    }
    limit.current
}

/// The connections one listener may hold when the process may open `open_files` files
/// (`None`: unlimited) and `asked` were asked for: half of what is left after
/// [`RESERVED_FILES`] (or a quarter of the limit, if more), so that both listeners full
/// still leave that much; never under 16.
pub fn connection_cap(open_files: Option<u64>, asked: Option<usize>) -> usize {
    let budget = open_files.map_or(usize::MAX, |limit| {
        let reserved = RESERVED_FILES.max(limit / 4);
        usize::try_from(limit.saturating_sub(reserved) / 2).unwrap_or(usize::MAX)
    });
    let cap = match asked {
        Some(asked) if asked > budget => {
            tracing::warn!(
                asked,
                allowed = budget,
                "--max-connections is more than the open-file limit allows; lowered"
            );
            budget
        }
        Some(asked) => asked,
        // Unlimited files: a cap still bounds memory.
        None => budget.min(1 << 16),
    };
    cap.max(MIN_CONNECTIONS)
}

/// Admits connections to one listener up to its cap; says once when it starts
/// refusing, and again when it admits again.
struct Gate {
    what: &'static str,
    permits: Arc<Semaphore>,
    cap: usize,
    refusing: AtomicBool,
    refused: AtomicU64,
}

impl Gate {
    fn new(what: &'static str, cap: usize) -> Gate {
        Gate {
            what,
            permits: Arc::new(Semaphore::new(cap)),
            cap,
            refusing: AtomicBool::new(false),
            refused: AtomicU64::new(0),
        }
    }

    /// A permit, or `None` at the cap (the caller closes the connection).
    fn admit(&self) -> Option<OwnedSemaphorePermit> {
        match Arc::clone(&self.permits).try_acquire_owned() {
            Ok(permit) => {
                if self.refusing.swap(false, Ordering::Relaxed) {
                    let refused = self.refused.swap(0, Ordering::Relaxed);
                    tracing::info!(door = self.what, refused, "accepting connections again");
                }
                Some(permit)
            }
            Err(_) => {
                self.refused.fetch_add(1, Ordering::Relaxed);
                if !self.refusing.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        door = self.what,
                        cap = self.cap,
                        "connection cap reached: new connections are closed until some end (--max-connections)"
                    );
                }
                None
            }
        }
    }
}

/// Accepts connections on `listener` until `shutdown` is cancelled (or the loop is
/// dropped), admitting each through the gate and handing it to `serve` on a task of
/// `tasks` (which the loop owns, so dropping the loop closes every connection). On
/// shutdown the listener is closed at once and the loop returns once every connection
/// has ended (each sees `shutdown` too, and finishes what is in flight).
async fn accept_loop<F, Fut>(listener: TcpListener, gate: Gate, shutdown: CancellationToken, mut serve: F)
where
    F: FnMut(TcpStream, SocketAddr, OwnedSemaphorePermit) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let mut tasks = JoinSet::new();
    let mut failing = false;
    loop {
        tokio::select! {
            () = shutdown.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    failing = false;
                    match gate.admit() {
                        Some(permit) => {
                            tasks.spawn(serve(stream, peer, permit));
                        }
                        // Dropped: closed at once.
                        None => drop(stream),
                    }
                }
                Err(error) => {
                    if !failing {
                        tracing::warn!(door = gate.what, %error, "cannot accept a connection");
                        failing = true;
                    }
                    tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
                }
            },
            Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
        }
    }
    drop(listener);
    tracing::debug!(
        door = gate.what,
        connections = tasks.len(),
        "stopped accepting; draining connections"
    );
    while tasks.join_next().await.is_some() {}
}

/// Waits up to `timeout` for the connection's first byte and returns it; `None` when
/// the peer said nothing in time or closed.
async fn first_byte(stream: &TcpStream, timeout: Duration) -> Option<u8> {
    let mut byte = [0u8; 1];
    match tokio::time::timeout(timeout, stream.peek(&mut byte)).await {
        Ok(Ok(1)) => Some(byte[0]),
        _ => None,
    }
}

/// Sets TCP keepalive probes on an accepted connection, so that a peer that vanished
/// without closing is found out.
fn keepalive(stream: &TcpStream) {
    let probes = socket2::TcpKeepalive::new()
        .with_time(Duration::from_secs(60))
        .with_interval(Duration::from_secs(10));
    if let Err(error) = socket2::SockRef::from(stream).set_tcp_keepalive(&probes) {
        tracing::debug!(%error, "cannot set TCP keepalive");
    }
}

/// The first byte of a TLS handshake record.
const TLS_HANDSHAKE: u8 = 0x16;

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
                            crate::api::error_with_code(
                                StatusCode::INTERNAL_SERVER_ERROR,
                                "internal",
                                "the server failed on this request (it is logged); it is a bug: please report it",
                            )
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
    use crate::api::error_with_code;
    let target = request.uri().path_and_query().map_or(0, |p| p.as_str().len());
    if target > MAX_URI_BYTES {
        return Some(error_with_code(
            StatusCode::URI_TOO_LONG,
            "uri_too_long",
            &format!(
                "the request's target is {target} bytes; at most {MAX_URI_BYTES} are read: send long values in the body"
            ),
        ));
    }
    let headers = request.headers();
    let header_bytes: usize = headers
        .iter()
        .map(|(name, value)| name.as_str().len() + value.len())
        .sum();
    if headers.len() > MAX_HEADERS || header_bytes > MAX_HEADER_BYTES {
        return Some(error_with_code(
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            "headers_too_large",
            &format!(
                "the request has {} headers of {header_bytes} bytes; at most {MAX_HEADERS} headers of {MAX_HEADER_BYTES} bytes in all are read",
                headers.len()
            ),
        ));
    }
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    if let Some(declared) = declared
        && declared > max_body
    {
        return Some(error_with_code(
            StatusCode::PAYLOAD_TOO_LARGE,
            "too_large",
            &format!(
                "the body is declared as {declared} bytes; the server reads at most {max_body} bytes per request: send less"
            ),
        ));
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

/// The gRPC door's admitted connections, for tonic's `serve_with_incoming_shutdown`,
/// and the task that accepts them (owned by the lifecycle's tracker), which stops
/// accepting when its shutdown is cancelled (the stream then ends).
pub fn grpc_incoming(
    listener: TcpListener,
    cap: usize,
    config: TransportConfig,
    tls: bool,
    lifecycle: &Lifecycle,
) -> (
    impl futures::Stream<Item = Result<Admitted, std::io::Error>> + Send + 'static,
    tokio::task::JoinHandle<()>,
) {
    let Lifecycle { shutdown, tasks } = lifecycle;
    let (sender, receiver) = mpsc::channel(GRPC_BACKLOG);
    let task = tasks.spawn(accept_loop(
        listener,
        Gate::new("agent service (gRPC)", cap),
        shutdown.clone(),
        move |stream, peer, permit| {
            let sender = sender.clone();
            let timeout = config.header_read_timeout;
            async move {
                match first_byte(&stream, timeout).await {
                    None => {
                        tracing::debug!(%peer, "closed an agent connection that said nothing");
                        return;
                    }
                    Some(first) if tls && first != TLS_HANDSHAKE => {
                        tracing::debug!(%peer, "plaintext on the TLS agent port; closed (the agent should join with https://)");
                        return;
                    }
                    Some(_) => {}
                }
                keepalive(&stream);
                let admitted = Admitted {
                    stream,
                    _permit: permit,
                };
                // The server is stopping when tonic no longer takes connections.
                let _ = tokio::time::timeout(timeout, sender.send(Ok(admitted))).await;
            }
        },
    ));
    let incoming = futures::stream::unfold(receiver, |mut receiver| async move {
        receiver.recv().await.map(|item| (item, receiver))
    });
    (incoming, task)
}

/// A connection admitted to the gRPC door: it holds its place under the cap until
/// tonic drops it.
pub struct Admitted {
    stream: TcpStream,
    _permit: OwnedSemaphorePermit,
}

impl Connected for Admitted {
    type ConnectInfo = tonic::transport::server::TcpConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.stream.connect_info()
    }
}

impl AsyncRead for Admitted {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for Admitted {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caps_leave_room_for_everything_else() {
        // The common default soft limit, after a raise that was not allowed.
        assert_eq!(connection_cap(Some(1024), None), (1024 - 256) / 2);
        // A generous limit keeps a quarter for the rest.
        assert_eq!(connection_cap(Some(20_000), None), 7_500);
        // What is asked, when it fits; never more than fits; never under the floor.
        assert_eq!(connection_cap(Some(20_000), Some(100)), 100);
        assert_eq!(connection_cap(Some(1024), Some(100_000)), 384);
        assert_eq!(connection_cap(Some(64), None), MIN_CONNECTIONS);
        assert_eq!(connection_cap(None, None), 1 << 16);
    }

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
