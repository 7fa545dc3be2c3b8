//! What the [`Supervisor`](super::Supervisor) and its instance tasks share: the
//! supervisor's configuration, an instance's states and events, the table of
//! instances both write, and the limits both read. The supervisor starts the tasks
//! (`instance.rs`); neither imports the other's internals through this module.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use serde::Serialize;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use super::command::LaunchError;
use super::logs::InstanceLog;
use crate::gpu::GpuMemoryProbe;

/// Consecutive failed health probes after which a ready instance is Unhealthy and
/// restarted.
pub const UNHEALTHY_AFTER: u32 = 3;
/// Log lines quoted in a failure's reason and in [`InstanceState::Failed::log_tail`].
pub const REASON_LOG_LINES: usize = 10;
/// How long one HTTP probe may take.
pub(super) const PROBE_TIMEOUT: Duration = Duration::from_secs(2);
/// How often readiness is polled while an engine loads (at most; the health interval
/// when it is shorter).
pub(super) const READINESS_POLL: Duration = Duration::from_millis(200);

/// How the supervisor runs instances.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SupervisorConfig {
    /// Where `INSTANCE.log` files go (created if missing).
    pub logs_dir: PathBuf,
    /// How long an engine may take from start to ready (loading weights included).
    pub readiness_timeout: Duration,
    /// How often a ready instance is probed.
    pub health_interval: Duration,
    /// When and how fast failed instances are restarted.
    pub restart: RestartPolicy,
    /// How long a stopping engine has between SIGTERM and SIGKILL.
    pub stop_grace: Duration,
}

/// Restarts with exponential backoff: `first_backoff`, doubling up to `max_backoff`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RestartPolicy {
    /// Restarts allowed in a row; the next failure makes the instance Failed.
    pub max_restarts: u32,
    /// Wait before the first restart.
    pub first_backoff: Duration,
    /// The longest wait between restarts.
    pub max_backoff: Duration,
    /// A start that ran ready this long resets the restart count (and the backoff).
    pub reset_after: Duration,
}

impl RestartPolicy {
    /// The wait before restart number `attempt` (1-based).
    pub fn backoff(&self, attempt: u32) -> Duration {
        let doublings = attempt.saturating_sub(1).min(31);
        self.first_backoff.saturating_mul(1 << doublings).min(self.max_backoff)
    }
}

/// A change of an instance, in the order it happened.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct InstanceEvent {
    /// The instance ([`LaunchSpec::instance`]).
    pub instance: String,
    /// Its new state.
    pub state: InstanceState,
    /// Restarts so far in the current run of failures.
    pub restarts: u32,
    /// When it changed.
    pub at: SystemTime,
}

/// Where an instance is in its life.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum InstanceState {
    /// The process was started (`pid: None` for a remote endpoint, which has none).
    Starting {
        /// The engine's process id.
        pid: Option<u32>,
        /// The command as a shell line (for a remote endpoint, the probe).
        command: String,
    },
    /// Started, not yet ready (loading weights; the endpoint not yet answering).
    Loading,
    /// Serving. Sent again, with the same base URL, whenever its measured memory
    /// changed.
    Ready {
        /// The OpenAI base URL: `http://host:port/v1`, or the remote endpoint's.
        base_url: String,
        /// The memory it holds: measured once ready, and again every measure interval.
        memory: MeasuredMemory,
    },
    /// Health probes failed [`UNHEALTHY_AFTER`] times in a row; a restart follows.
    Unhealthy {
        /// The last probe's failure.
        reason: String,
    },
    /// The start failed; it is started again after `after`.
    Restarting {
        /// Which restart this is (1-based).
        attempt: u32,
        /// The backoff before it.
        after: Duration,
        /// Why the start failed, with the engine's last log lines.
        reason: String,
    },
    /// Given up: the last start failed and no restart is left (or none could help).
    Failed {
        /// Why the last start failed.
        reason: String,
        /// The engine's last log lines.
        log_tail: Vec<String>,
    },
    /// Stopped on request.
    Stopped,
}

/// Memory an instance really holds: measured when it is ready, then every measure
/// interval while it runs.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct MeasuredMemory {
    /// Resident bytes of the engine and every process below it; `None` for a remote
    /// endpoint or when the process table could not be read.
    pub host_rss: Option<u64>,
    /// `(GPU index, bytes)` per GPU the engine's processes use, from the
    /// [`GpuMemoryProbe`]; empty without one.
    pub gpu: Vec<(u32, u64)>,
}

/// An instance as [`Supervisor::status`](super::Supervisor::status) shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct InstanceStatus {
    /// The instance.
    pub instance: String,
    /// Its latest state.
    pub state: InstanceState,
    /// Restarts so far in the current run of failures.
    pub restarts: u32,
    /// When it entered `state`.
    pub since: SystemTime,
    /// Its log file.
    pub log_path: PathBuf,
}

/// What the supervisor refuses.
#[derive(Debug, thiserror::Error)]
pub enum SupervisorError {
    /// An instance of that name is running (stop it first).
    #[error("instance `{instance}` is already running; stop it before starting it again")]
    AlreadyRunning {
        /// The instance.
        instance: String,
    },
    /// The spec cannot be run.
    #[error(transparent)]
    Invalid(LaunchError),
    /// No instance of that name was started.
    #[error("no instance `{instance}`: it was never started on this agent")]
    UnknownInstance {
        /// The instance.
        instance: String,
    },
    /// The instance's log file cannot be created.
    #[error("instance `{instance}`: cannot open the log file {}", path.display())]
    Log {
        /// The instance.
        instance: String,
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

/// What instance tasks share with the supervisor (they must not hold the `Owner`, or
/// dropping the supervisor would not end them).
pub(super) struct Shared {
    pub(super) config: SupervisorConfig,
    pub(super) probe: Option<Arc<dyn GpuMemoryProbe>>,
    pub(super) events: mpsc::Sender<InstanceEvent>,
    /// For engines on this machine: never through a proxy.
    pub(super) local_http: reqwest::Client,
    /// For remote endpoints: the environment's proxy settings apply.
    pub(super) remote_http: reqwest::Client,
    pub(super) instances: Mutex<BTreeMap<String, Entry>>,
    /// How often ready engines' memory is measured.
    pub(super) measure_interval: Mutex<Duration>,
}

pub(super) struct Entry {
    pub(super) status: InstanceStatus,
    pub(super) log: Arc<InstanceLog>,
    /// `Some` while the instance's task runs.
    pub(super) run: Option<Run>,
}

pub(super) struct Run {
    pub(super) cancel: CancellationToken,
    pub(super) done: watch::Receiver<bool>,
    /// The current engine's process group, killed if the supervisor is dropped.
    pub(super) group: Option<rustix::process::Pid>,
}

impl Shared {
    pub(super) fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Entry>> {
        self.instances.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(super) fn measure_interval(&self) -> Duration {
        *self.measure_interval.lock().unwrap_or_else(PoisonError::into_inner)
    }
}
