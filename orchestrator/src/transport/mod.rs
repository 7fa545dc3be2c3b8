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
//!
//! The REST door's connections are served in `transport/rest.rs`, the gRPC door's in
//! `transport/grpc.rs`; TLS in [`tls`].

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

mod grpc;
mod rest;
pub mod tls;

pub use grpc::{Admitted, grpc_incoming};
pub use rest::{RestService, serve_rest};

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
/// Open files kept for everything but the two listeners: the database, engines' logs,
/// outgoing connections (hub, engines), at least this many or a quarter of the limit.
pub const RESERVED_FILES: u64 = 256;
/// The smallest connection cap, whatever the open-file limit.
const MIN_CONNECTIONS: usize = 16;
/// How long the accept loop waits after an accept error (out of descriptors) before
/// trying again, so that it does not spin.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(100);

pub use crate::base::Lifecycle;

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
}
