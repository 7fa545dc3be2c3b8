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
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, instrument, warn};

use super::command::LaunchSpec;
use super::instance::{InstanceTask, Target};
use super::logs::InstanceLog;
use super::process::kill_group;
use super::shared::{Entry, Run, Shared};
pub use super::shared::{
    InstanceEvent, InstanceState, InstanceStatus, MeasuredMemory, REASON_LOG_LINES, RestartPolicy, SupervisorConfig,
    SupervisorError, UNHEALTHY_AFTER,
};
use crate::gpu::GpuMemoryProbe;

/// Events buffered for the receiver. The receiver must be drained: when it is full,
/// instance tasks wait to report (and meanwhile neither probe nor restart).
pub const EVENT_CAPACITY: usize = 256;
/// How often a ready engine's memory is measured until [`Supervisor::set_measure_interval`]
/// says otherwise: the orchestrator's default telemetry period.
pub const DEFAULT_MEASURE_INTERVAL: Duration = Duration::from_secs(1);
/// The shortest measure interval taken (each measurement reads the process table).
const MIN_MEASURE_INTERVAL: Duration = Duration::from_millis(50);
/// Beyond the stop grace: how long [`Supervisor::stop`] waits for the instance's task.
const STOP_SLACK: Duration = Duration::from_secs(5);

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
