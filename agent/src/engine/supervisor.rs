//! The engine supervisor: runs the instances the agent is told to start, watches them and
//! restarts them, and reports every change as an [`InstanceEvent`].
//!
//! Each instance has one task (`instance.rs`), owned by the [`Supervisor`]. A local
//! engine goes Starting → Loading (polling `GET /health`: 503 while loading) → Ready
//! (with the memory it really holds) and is then probed every
//! [`SupervisorConfig::health_interval`]; its memory is measured again every
//! [`Supervisor::set_measure_interval`] (the agent's telemetry period), and a further
//! Ready event carries it whenever it changed. A piece of a split engine is ready once
//! its port accepts a connection; llama.cpp's RPC server is then only watched for its
//! process (it serves one client at a time: a probe cannot connect while the serving
//! engine holds it). An engine that exits with status 0 before it is ready refused its
//! command line: it is Failed at once. A remote endpoint
//! ([`RemoteLaunch`](super::RemoteLaunch)) has no process: it is Ready once
//! `GET {url}/models` answers 2xx with its key. A start that fails (exit, readiness
//! timeout, [`UNHEALTHY_AFTER`] failed probes) is retried after an exponential backoff
//! until [`RestartPolicy::max_restarts`], then the instance is Failed with the engine's
//! last log lines. Stopping signals the engine's whole process group; dropping the last
//! clone of the supervisor kills every engine it started.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use serde::Serialize;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, instrument, warn};

use super::command::{LaunchError, LaunchSpec};
use super::instance::{InstanceTask, Target};
use super::logs::InstanceLog;
use super::process::kill_group;
use crate::gpu::GpuMemoryProbe;

/// Events buffered for the receiver. The receiver must be drained: when it is full,
/// instance tasks wait to report (and meanwhile neither probe nor restart).
pub const EVENT_CAPACITY: usize = 256;
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
/// How often a ready engine's memory is measured until [`Supervisor::set_measure_interval`]
/// says otherwise: the orchestrator's default telemetry period.
pub const DEFAULT_MEASURE_INTERVAL: Duration = Duration::from_secs(1);
/// The shortest measure interval taken (each measurement reads the process table).
const MIN_MEASURE_INTERVAL: Duration = Duration::from_millis(50);
/// Beyond the stop grace: how long [`Supervisor::stop`] waits for the instance's task.
const STOP_SLACK: Duration = Duration::from_secs(5);

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

/// An instance as [`Supervisor::status`] shows it.
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

/// Runs engine instances (cheap to clone: clones share the instances). Dropping the last
/// clone kills every engine process it started.
#[derive(Clone)]
pub struct Supervisor {
    owner: Arc<Owner>,
}

impl std::fmt::Debug for Supervisor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Supervisor")
            .field("config", &self.owner.shared.config)
            .finish_non_exhaustive()
    }
}

/// Owns the instance tasks; dropped with the last [`Supervisor`] clone.
struct Owner {
    shared: Arc<Shared>,
    tasks: Mutex<JoinSet<()>>,
}

/// What instance tasks share with the supervisor (they must not hold the [`Owner`], or
/// dropping the supervisor would not end them).
pub(super) struct Shared {
    pub(super) config: SupervisorConfig,
    pub(super) probe: Option<Arc<dyn GpuMemoryProbe>>,
    pub(super) events: mpsc::Sender<InstanceEvent>,
    /// For engines on this machine: never through a proxy.
    pub(super) local_http: reqwest::Client,
    /// For remote endpoints: the environment's proxy settings apply.
    pub(super) remote_http: reqwest::Client,
    instances: Mutex<BTreeMap<String, Entry>>,
    /// How often ready engines' memory is measured.
    measure_interval: Mutex<Duration>,
}

pub(super) struct Entry {
    pub(super) status: InstanceStatus,
    log: Arc<InstanceLog>,
    /// `Some` while the instance's task runs.
    pub(super) run: Option<Run>,
}

pub(super) struct Run {
    cancel: CancellationToken,
    done: watch::Receiver<bool>,
    /// The current engine's process group, killed if the supervisor is dropped.
    pub(super) group: Option<rustix::process::Pid>,
}

impl Supervisor {
    /// A supervisor without a GPU memory probe, and the receiver of its events.
    pub fn new(config: SupervisorConfig) -> (Self, mpsc::Receiver<InstanceEvent>) {
        Self::build(config, None)
    }

    /// A supervisor that measures engines' GPU memory with `probe`.
    pub fn with_probe(
        config: SupervisorConfig,
        probe: Arc<dyn GpuMemoryProbe>,
    ) -> (Self, mpsc::Receiver<InstanceEvent>) {
        Self::build(config, Some(probe))
    }

    fn build(
        config: SupervisorConfig,
        probe: Option<Arc<dyn GpuMemoryProbe>>,
    ) -> (Self, mpsc::Receiver<InstanceEvent>) {
        let (events, receiver) = mpsc::channel(EVENT_CAPACITY);
        let local_http = reqwest::Client::builder()
            .no_proxy()
            .build()
            .unwrap_or_else(|_| reqwest::Client::new());
        let shared = Arc::new(Shared {
            config,
            probe,
            events,
            local_http,
            remote_http: reqwest::Client::new(),
            instances: Mutex::new(BTreeMap::new()),
            measure_interval: Mutex::new(DEFAULT_MEASURE_INTERVAL),
        });
        let owner = Arc::new(Owner {
            shared,
            tasks: Mutex::new(JoinSet::new()),
        });
        (Self { owner }, receiver)
    }

    /// Starts an instance; its progress arrives as events. Refused when an instance of
    /// that name runs, when the spec is invalid, or when a remote endpoint's key
    /// variable is unset. Starting a stopped or failed instance again appends to its log.
    #[instrument(skip_all, fields(instance = %spec.instance))]
    pub async fn start(&self, spec: LaunchSpec) -> Result<(), SupervisorError> {
        let shared = &self.owner.shared;
        let target = Target::from_spec(&spec)?;
        let name = spec.instance.clone();
        let log = {
            let instances = shared.lock();
            match instances.get(&name) {
                Some(entry) if entry.run.is_some() => {
                    return Err(SupervisorError::AlreadyRunning { instance: name });
                }
                Some(entry) => Arc::clone(&entry.log),
                None => Arc::new(InstanceLog::new(shared.config.logs_dir.join(format!("{name}.log")))),
            }
        };
        log.open().await.map_err(|source| SupervisorError::Log {
            instance: name.clone(),
            path: log.path().to_owned(),
            source,
        })?;
        let cancel = CancellationToken::new();
        let (done_tx, done) = watch::channel(false);
        {
            let mut instances = shared.lock();
            // Checked again: another start of the same name may have won while the log
            // file was opened.
            if instances.get(&name).is_some_and(|e| e.run.is_some()) {
                return Err(SupervisorError::AlreadyRunning { instance: name });
            }
            let status = InstanceStatus {
                instance: name.clone(),
                state: InstanceState::Starting {
                    pid: None,
                    command: target.describe(),
                },
                restarts: 0,
                since: SystemTime::now(),
                log_path: log.path().to_owned(),
            };
            instances.insert(
                name.clone(),
                Entry {
                    status,
                    log: Arc::clone(&log),
                    run: Some(Run {
                        cancel: cancel.clone(),
                        done,
                        group: None,
                    }),
                },
            );
        }
        info!(target = %target.describe(), "starting instance");
        let task = InstanceTask {
            shared: Arc::clone(shared),
            name,
            log,
            cancel,
        };
        let mut tasks = self.owner.tasks.lock().unwrap_or_else(PoisonError::into_inner);
        // Reap the tasks of instances that ended, so the set does not grow.
        while tasks.try_join_next().is_some() {}
        tasks.spawn(async move {
            task.supervise(target).await;
            // The receiver may be gone (nobody waits for this stop): nothing to tell.
            let _ = done_tx.send(true);
        });
        Ok(())
    }

    /// Stops an instance: SIGTERM to its process group, [`SupervisorConfig::stop_grace`]
    /// to exit, then SIGKILL; returns once it is gone and Stopped was sent. An instance
    /// that already ended (stopped or failed) is left as it is.
    #[instrument(skip(self))]
    pub async fn stop(&self, instance: &str) -> Result<(), SupervisorError> {
        let shared = &self.owner.shared;
        let run = {
            let instances = shared.lock();
            let entry = instances
                .get(instance)
                .ok_or_else(|| SupervisorError::UnknownInstance {
                    instance: instance.to_owned(),
                })?;
            entry.run.as_ref().map(|r| (r.cancel.clone(), r.done.clone()))
        };
        let Some((cancel, mut done)) = run else {
            return Ok(());
        };
        cancel.cancel();
        let limit = shared.config.stop_grace.saturating_add(STOP_SLACK);
        // An error means the task is gone (aborted): nothing is left to wait for.
        if tokio::time::timeout(limit, done.wait_for(|d| *d)).await.is_err() {
            warn!(instance, "instance did not stop in time");
        }
        Ok(())
    }

    /// Stops every running instance (concurrently).
    #[instrument(skip(self))]
    pub async fn stop_all(&self) {
        let names: Vec<String> = {
            let instances = self.owner.shared.lock();
            instances
                .iter()
                .filter(|(_, e)| e.run.is_some())
                .map(|(name, _)| name.clone())
                .collect()
        };
        let stops = names.iter().map(|name| self.stop(name));
        // Every name came from the table and entries are never removed: no error.
        for result in futures::future::join_all(stops).await {
            if let Err(error) = result {
                debug!(%error, "stop_all");
            }
        }
    }

    /// How often ready engines' memory is measured from now on (at least every 50 ms):
    /// the agent passes its telemetry period, once the orchestrator has said it.
    pub fn set_measure_interval(&self, interval: Duration) {
        *self
            .owner
            .shared
            .measure_interval
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = interval.max(MIN_MEASURE_INTERVAL);
    }

    /// Every instance started so far (running or not), by name.
    pub fn status(&self) -> Vec<InstanceStatus> {
        let instances = self.owner.shared.lock();
        instances.values().map(|e| e.status.clone()).collect()
    }

    /// The last `tail` lines of an instance's log, markers of each start included; at
    /// most [`LOG_RING_LINES`](super::logs::LOG_RING_LINES) (the whole log is in its
    /// file, [`InstanceStatus::log_path`]).
    pub fn logs(&self, instance: &str, tail: usize) -> Result<Vec<String>, SupervisorError> {
        let instances = self.owner.shared.lock();
        let entry = instances
            .get(instance)
            .ok_or_else(|| SupervisorError::UnknownInstance {
                instance: instance.to_owned(),
            })?;
        Ok(entry.log.tail(tail))
    }
}

impl Drop for Owner {
    fn drop(&mut self) {
        // The tasks are aborted when the JoinSet drops, and their processes are killed
        // (`kill_on_drop`) when the runtime next polls them; kill the whole groups now,
        // so no worker outlives the supervisor even if the runtime is shutting down.
        let instances = self.shared.lock();
        for run in instances.values().filter_map(|e| e.run.as_ref()) {
            run.cancel.cancel();
            if let Some(group) = run.group {
                kill_group(group);
            }
        }
    }
}

impl Shared {
    pub(super) fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Entry>> {
        self.instances.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(super) fn measure_interval(&self) -> Duration {
        *self.measure_interval.lock().unwrap_or_else(PoisonError::into_inner)
    }
}
