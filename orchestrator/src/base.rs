//! The ground floor of the orchestrator: the small things every other module needs
//! and that need nothing of the crate — the time (Unix milliseconds and the monotonic
//! [`Clock`]), ids, the poison-tolerant [`lock`], the [`Secret`] type, SHA-256 in hex,
//! and the server's [`Lifecycle`] (what stops its tasks and owns them). It imports no other module of the crate, so anything may import it without
//! making a circle.

use std::fmt;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Milliseconds on the orchestrator's monotonic clock (since it started). The graph
/// never reads a clock: callers pass the time.
pub type Millis = u64;

/// Unix time in milliseconds; written as RFC 3339 text (`2026-11-25T04:31:07.412Z`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, utoipa::ToSchema)]
#[schema(value_type = String, format = DateTime)]
pub struct UnixMs(pub i64);

impl UnixMs {
    /// Milliseconds later.
    pub fn plus(self, duration: Duration) -> UnixMs {
        UnixMs(
            self.0
                .saturating_add(i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)),
        )
    }

    /// How long from `self` until `later` (zero if it is not later).
    pub fn until(self, later: UnixMs) -> Duration {
        Duration::from_millis(u64::try_from(later.0.saturating_sub(self.0)).unwrap_or(0))
    }

    /// `time` in Unix milliseconds (the epoch for a time before it).
    pub fn of(time: SystemTime) -> UnixMs {
        UnixMs(
            time.duration_since(UNIX_EPOCH)
                .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX)),
        )
    }

    fn system_time(self) -> std::time::SystemTime {
        let epoch = std::time::UNIX_EPOCH;
        match u64::try_from(self.0) {
            Ok(ms) => epoch + Duration::from_millis(ms),
            Err(_) => epoch,
        }
    }
}

impl fmt::Display for UnixMs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", humantime::format_rfc3339_millis(self.system_time()))
    }
}

impl Serialize for UnixMs {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for UnixMs {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        let time = humantime::parse_rfc3339(&text).map_err(serde::de::Error::custom)?;
        let ms = time
            .duration_since(std::time::UNIX_EPOCH)
            .map_err(serde::de::Error::custom)?
            .as_millis();
        Ok(UnixMs(i64::try_from(ms).map_err(serde::de::Error::custom)?))
    }
}

/// Now, Unix milliseconds.
pub fn unix_ms() -> UnixMs {
    UnixMs::of(SystemTime::now())
}

/// A new id: `prefix`, the time in milliseconds (hex, so ids sort by creation), and
/// three hex digits of `counter` for ids made in the same millisecond.
pub(crate) fn new_id(prefix: char, counter: &AtomicU64) -> String {
    let sequence = counter.fetch_add(1, Ordering::Relaxed);
    format!("{prefix}{:011x}{:03x}", unix_ms().0, sequence & 0xfff)
}

/// Locks `mutex`, taking the data even when a panic poisoned it: every guarded value
/// in the orchestrator is replaced or updated whole under the lock, so a panic while
/// holding it leaves consistent data.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The SHA-256 of a token's text, in hex.
pub(crate) fn sha256_hex(token: &str) -> String {
    sha256_hex_bytes(token.as_bytes())
}

/// The SHA-256 of `bytes`, in hex.
pub(crate) fn sha256_hex_bytes(bytes: &[u8]) -> String {
    Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

/// A shared secret: the join token agents present, or the API token of the REST API.
/// Its `Debug` and `Display` never show it.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// A secret from its text; `None` when empty.
    pub fn new(text: impl Into<String>) -> Option<Secret> {
        let text = text.into();
        (!text.trim().is_empty()).then(|| Secret(text.trim().to_owned()))
    }

    /// A fresh random secret: 32 bytes from the operating system, hex.
    pub fn generate() -> std::io::Result<Secret> {
        use std::io::Read;
        let mut bytes = [0u8; 32];
        std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
        Ok(Secret(bytes.iter().map(|b| format!("{b:02x}")).collect()))
    }

    /// The text, for sending it.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// Compares in time independent of where the texts differ.
    pub fn matches(&self, presented: &str) -> bool {
        let (a, b) = (self.0.as_bytes(), presented.as_bytes());
        a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(…)")
    }
}

/// The orchestrator's monotonic clock, in [`Millis`] since it started.
#[derive(Debug, Clone, Copy)]
pub struct Clock(Instant);

impl Clock {
    /// Starts now.
    pub fn start() -> Clock {
        Clock(Instant::now())
    }

    /// Milliseconds since the start.
    pub fn now(&self) -> Millis {
        u64::try_from(self.0.elapsed().as_millis()).unwrap_or(u64::MAX)
    }
}

/// What stops the server's tasks and owns them: its shutdown token and task tracker
/// (cheap to clone; clones share them). Every task the server starts (the doors'
/// accept loops and connections' helpers, the executor's admission and each run's
/// driving, the reflexes' watcher and each run's actor, each agent's stream) is
/// spawned on the tracker and ends at its next wait once the token is cancelled.
#[derive(Debug, Clone, Default)]
pub struct Lifecycle {
    /// Cancelled when the server stops: the doors stop accepting, every connection
    /// finishes the requests in flight and closes, event streams and agent streams
    /// end, runs stop between steps (resumed at the next start), reflex actors stop
    /// between decisions.
    pub shutdown: CancellationToken,
    /// Owns the server's tasks; the server waits for it, within its drain timeout,
    /// before it exits.
    pub tasks: TaskTracker,
}

/// Where an owner stands in fair share (`sharing::fair` computes it; the planner's
/// preemption reads it): the factors of their group and of them within it, each 1 for
/// one who used nothing of late, 0.5 at their share, towards 0 beyond (higher first).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Standing {
    /// The group's factor `F_g`.
    pub group: f64,
    /// The user's factor within the group `f_u`.
    pub user: f64,
}

impl Standing {
    /// One who used nothing.
    pub const FRESH: Standing = Standing { group: 1.0, user: 1.0 };

    /// The order of standings: the higher (further under its share) first.
    pub fn first(&self, other: &Standing) -> std::cmp::Ordering {
        other
            .group
            .total_cmp(&self.group)
            .then(other.user.total_cmp(&self.user))
    }
}
