//! The executor: admits submitted runs (bounded queues per priority, gang admission from
//! the plan), starts their instances on agents, drives their steps (prompts to the
//! engines, retries with backoff, `when`, `repeat`), and writes every change to the
//! store before it counts. After a restart it resumes every unfinished run from its
//! last recorded step.
//!
//! One task admits runs; one task per admitted run drives it. A run's record is only
//! changed by its own task (or, while queued, by the admission task), and always
//! written (and flushed) before the change is acted on or reported.
//!
//! Every task is the server's ([`Lifecycle`]): spawned on its tracker, and ended by its
//! shutdown token at the next wait. A run's task then stops between steps without
//! writing anything: its record is the last one written, which the next start resumes
//! (attempts in flight are started again) as it would after a crash.

mod act;
mod admission;
mod approve;
mod bring_up;
mod drive;
mod preempt;
mod provide;
mod reuse;

use std::cmp::Reverse;
use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use skein_dsl::expr::Evaluator;
use skein_model_registry::hub::HubClient;
use tokio::sync::{Notify, watch};

use super::record::{RetryPolicy, RunRecord, RunState};
use super::stored::RunStore;
use crate::base::{Lifecycle, lock, unix_ms};
use crate::graph::HardwareGraph;
use crate::idempotency::{IdempotencyKeys, KeyError};
use crate::instances::Instances;
use crate::plan::Planner;
use crate::sharing::Sharing;
use crate::store::{Db, StoreError};

pub use approve::{ApproveError, Verdict};
pub use provide::{Pin, ProvideError};
pub use reuse::{ContextWanted, serves};

/// How the executor behaves.
#[derive(Debug, Clone)]
pub struct ExecutorConfig {
    /// Runs that may wait for admission per priority; more are refused (429).
    pub queue_capacity: usize,
    /// How long a run's instances may take to become ready (downloads included).
    pub ready_timeout: Duration,
    /// The longest one attempt of a step may take when the step sets no `timeout`.
    pub step_timeout: Duration,
    /// Retry backoff.
    pub retry: RetryPolicy,
    /// How often queued runs are planned again when nothing else wakes them.
    pub admission_interval: Duration,
    /// The sampling seed given to built-in engines.
    pub seed: u64,
    /// How long an instance stays up after its run ended, for the next run that needs
    /// the same model (zero: stopped at once). Idle instances are stopped early when a
    /// queued run needs their GPUs.
    pub keep_warm: Duration,
    /// Programs a workflow's stdio tool server may run (`skein server
    /// --allow-tool-command`); none by default.
    pub tool_commands: Vec<std::path::PathBuf>,
    /// The longest one tool call may take.
    pub tool_timeout: Duration,
    /// The half-life of the usage fair-share admission weighs (docs/sharing.md).
    pub fair_share_half_life: Duration,
    /// Whether a queued run that fits only by taking lower-priority runs' GPUs sends
    /// those runs back to the queue (`skein server --preempt`); off by default.
    pub preempt: bool,
    /// With `preempt`: the highest priority a user other than the admin may submit
    /// (`--max-user-priority`), so that nobody preempts others by writing a larger
    /// number.
    pub max_user_priority: i32,
}

impl Default for ExecutorConfig {
    fn default() -> Self {
        ExecutorConfig {
            queue_capacity: 64,
            ready_timeout: Duration::from_secs(30 * 60),
            step_timeout: Duration::from_secs(10 * 60),
            retry: RetryPolicy::default(),
            admission_interval: Duration::from_secs(2),
            seed: 0,
            keep_warm: Duration::from_secs(10 * 60),
            tool_commands: Vec::new(),
            tool_timeout: Duration::from_secs(5 * 60),
            fair_share_half_life: crate::sharing::fair::DEFAULT_HALF_LIFE,
            preempt: false,
            max_user_priority: 0,
        }
    }
}

/// Why a submission was refused.
#[derive(Debug, thiserror::Error)]
pub enum SubmitError {
    /// The inputs do not fit the workflow.
    #[error(transparent)]
    Inputs(#[from] super::record::InputError),
    /// The queue of this priority is full.
    #[error(
        "the queue for priority {priority} is full ({capacity} runs wait); retry in {}s or cancel queued runs",
        retry_after.as_secs()
    )]
    QueueFull {
        /// The priority.
        priority: i32,
        /// Its capacity.
        capacity: usize,
        /// When to try again.
        retry_after: Duration,
    },
    /// The owner or their group is at a limit (`skein quota`).
    #[error(transparent)]
    Quota(#[from] crate::sharing::quota::Refusal),
    /// The idempotency key was refused (used for another request, or in progress).
    #[error(transparent)]
    Key(KeyError),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl From<KeyError> for SubmitError {
    fn from(e: KeyError) -> Self {
        match e {
            KeyError::Store(e) => SubmitError::Store(e),
            other => SubmitError::Key(other),
        }
    }
}

/// What [`Executor::submit`] did.
#[derive(Debug, Clone)]
pub struct Submitted {
    /// The run (as it is now, when replayed).
    pub run: RunRecord,
    /// True when the idempotency key created it before: nothing new was stored.
    pub replayed: bool,
}

/// Why a run could not be found or changed.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// No such run (for this user).
    #[error("no run `{0}`; `skein runs` lists them")]
    NotFound(String),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// The executor. Cheap to clone.
#[derive(Clone)]
pub struct Executor {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Executor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Executor").finish_non_exhaustive()
    }
}

struct Inner {
    runs: RunStore,
    /// The `Idempotency-Key`s of submissions.
    keys: IdempotencyKeys,
    graph: Arc<HardwareGraph>,
    hub: HubClient,
    instances: Arc<Instances>,
    planner: Arc<Mutex<Planner>>,
    /// Groups, quotas, runs in progress by owner, and fair-share usage.
    sharing: Sharing,
    config: ExecutorConfig,
    evaluator: Evaluator,
    /// Engines and endpoints are called through these.
    clients: crate::engine_client::Clients,
    /// Queued run ids, highest priority first, then oldest.
    queue: Mutex<BTreeSet<(Reverse<i32>, String)>>,
    /// Model catalogs read for queued runs, by run id.
    catalogs: Mutex<HashMap<String, crate::catalogs::Catalogs>>,
    /// One placement at a time per model instance key ([`Executor::provide`]).
    provides: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// Cancel signals and decision queues of the runs being driven.
    active: Mutex<HashMap<String, approve::Signals>>,
    /// Every change of any run, by id (for live progress).
    changes: watch::Sender<(u64, String)>,
    wake: Notify,
    ids: AtomicU64,
    /// The server's shutdown token and the tracker the executor's tasks are spawned on
    /// (given by [`Executor::start`]).
    lifecycle: OnceLock<Lifecycle>,
}

impl Executor {
    /// An executor over `db`'s runs. Call [`Executor::start`] to resume stored runs and
    /// begin admitting.
    ///
    /// Errors: the store cannot be opened.
    pub fn new(
        db: &Db,
        graph: Arc<HardwareGraph>,
        hub: HubClient,
        instances: Arc<Instances>,
        planner: Arc<Mutex<Planner>>,
        config: ExecutorConfig,
        clients: crate::engine_client::Clients,
    ) -> Result<Executor, StoreError> {
        Ok(Executor {
            inner: Arc::new(Inner {
                runs: RunStore::open(db)?,
                keys: IdempotencyKeys::open(db, "run_keys")?,
                graph,
                hub,
                instances,
                planner,
                sharing: Sharing::open(db, config.fair_share_half_life)?,
                config,
                evaluator: Evaluator::default(),
                clients,
                queue: Mutex::default(),
                catalogs: Mutex::default(),
                provides: Mutex::default(),
                active: Mutex::default(),
                changes: watch::channel((0, String::new())).0,
                wake: Notify::new(),
                ids: AtomicU64::new(0),
                lifecycle: OnceLock::new(),
            }),
        })
    }

    /// Resumes every unfinished run of the store (queued ones wait again; started ones
    /// are planned again and continue from their last recorded step) and starts the
    /// admission task. The executor's tasks (admission, each run's) are `lifecycle`'s
    /// from now on: spawned on its tracker, they end when its token is cancelled.
    ///
    /// Errors: the store cannot be read.
    pub fn start(&self, lifecycle: &Lifecycle) -> Result<tokio::task::JoinHandle<()>, StoreError> {
        // Started once: a second start keeps the first lifecycle.
        let lifecycle = self.inner.lifecycle.get_or_init(|| lifecycle.clone());
        let mut resumed = 0;
        for mut run in self.inner.runs.all()? {
            if run.state.is_final() {
                continue;
            }
            run.recover();
            if run.state != RunState::Queued {
                run.state = RunState::Queued;
                run.reason = Some("resumed after a restart; planning again".to_owned());
                self.inner.runs.put_blocking(&mut run)?;
            }
            self.inner.sharing.resume_run(&run.owner, &run.id);
            lock(&self.inner.queue).insert((Reverse(run.workflow.placement.priority), run.id.clone()));
            resumed += 1;
        }
        if resumed > 0 {
            tracing::info!(runs = resumed, "resuming unfinished runs");
        }
        let executor = self.clone();
        Ok(lifecycle.tasks.spawn(async move { executor.admission().await }))
    }

    /// What engines and endpoints are called through (sessions call them too).
    pub fn clients(&self) -> &crate::engine_client::Clients {
        &self.inner.clients
    }

    /// Records `rate`, the decode speed of an answer of `instance` (tokens/s), in the
    /// graph for its node, engine, variant and placement, where the planner reads it in
    /// place of its model (docs/placement.md, "Measured speeds"): only for an instance a
    /// plan placed whole on one node (a split's speed is not one node's).
    pub fn record_speed(&self, instance: &str, rate: f64) {
        let Some(view) = self.inner.instances.get(instance) else {
            return;
        };
        let Some(placement) = view.placement.as_deref() else {
            return;
        };
        if !view.pieces.is_empty() || placement.devices.iter().any(|d| d.node != view.node_name) {
            return;
        }
        let key = crate::plan::speed_placement(&placement.family, placement.devices.len());
        if let Err(e) =
            self.inner
                .graph
                .record_speed(&view.node_name, &placement.engine, &placement.variant, &key, rate)
        {
            tracing::debug!(instance, error = %e, "measured speed not recorded");
        }
    }

    /// The runs being driven now (starting or running), by id.
    pub fn active_runs(&self) -> Vec<String> {
        lock(&self.inner.active).keys().cloned().collect()
    }

    /// A receiver of run changes: `(counter, run id)`.
    pub fn subscribe(&self) -> watch::Receiver<(u64, String)> {
        self.inner.changes.subscribe()
    }
    /// One run.
    pub fn get(&self, id: &str) -> Result<Option<RunRecord>, StoreError> {
        self.inner.runs.get(id)
    }

    /// Every run, newest first, without its steps' `for_each` items and agent loops
    /// ([`RunStore::heads`]; [`get`](Self::get) reads a run whole).
    pub fn list(&self) -> Result<Vec<RunRecord>, StoreError> {
        let mut runs = self.inner.runs.heads()?;
        runs.reverse();
        Ok(runs)
    }

    /// Cancels a run: a queued one at once, a running one through its task (its
    /// attempts are abandoned and its instances stopped).
    ///
    /// Errors: [`RunError::NotFound`].
    pub async fn cancel(&self, id: &str) -> Result<RunRecord, RunError> {
        tracing::info!(run = %id, "cancel requested");
        let signal = lock(&self.inner.active).get(id).cloned();
        if let Some(signal) = signal {
            signal.cancel.send_replace(preempt::Halt::Cancel);
            let mut changes = self.subscribe();
            // The run's task records the cancellation.
            for _ in 0..100 {
                if let Some(run) = self.inner.runs.get(id)?
                    && run.state.is_final()
                {
                    return Ok(run);
                }
                let _ = tokio::time::timeout(Duration::from_millis(100), changes.changed()).await;
            }
        }
        let removed = {
            let mut queue = lock(&self.inner.queue);
            let key = queue.iter().find(|(_, q)| q == id).cloned();
            key.is_some_and(|key| queue.remove(&key))
        };
        let mut run = self
            .inner
            .runs
            .get(id)?
            .ok_or_else(|| RunError::NotFound(id.to_owned()))?;
        if removed || !run.state.is_final() {
            run.cancel(unix_ms());
            self.inner.runs.put(&mut run).await?;
            self.inner.sharing.release_run(id);
            self.changed(id);
        }
        Ok(run)
    }

    /// The server's lifecycle, given by [`Executor::start`] (before it, a fresh one
    /// that nothing stops: runs are admitted only once the executor started).
    fn lifecycle(&self) -> Lifecycle {
        self.inner.lifecycle.get().cloned().unwrap_or_default()
    }

    /// The highest priority a user other than the admin may submit, when this executor
    /// preempts by priority (`None`: it does not, and any priority only orders the queue).
    pub fn priority_cap(&self) -> Option<i32> {
        self.inner.config.preempt.then_some(self.inner.config.max_user_priority)
    }

    /// The groups, quotas and fair-share accounts runs are admitted by.
    pub fn sharing(&self) -> &Sharing {
        &self.inner.sharing
    }

    /// The programs workflows' stdio tool servers may run (`--allow-tool-command`).
    pub fn tool_commands(&self) -> &[std::path::PathBuf] {
        &self.inner.config.tool_commands
    }

    /// What a run's agent loops may reach: the admin's allowed tool programs, and the
    /// clients endpoint agents use (egress policy, secrets).
    fn tool_access(&self) -> crate::tools::ToolAccess {
        crate::tools::ToolAccess {
            commands: std::sync::Arc::new(self.inner.config.tool_commands.clone()),
            clients: self.inner.clients.clone(),
        }
    }

    fn changed(&self, id: &str) {
        self.inner.changes.send_modify(|(n, last)| {
            *n = n.wrapping_add(1);
            id.clone_into(last);
        });
    }
    /// The graph every plan is made on, the executor's and `POST /v1/plans`'s alike:
    /// the live snapshot with the memory of instances that telemetry does not show yet
    /// held. The planner leaves drained GPUs out and says why in the plan's `excluded`.
    pub fn plan_snapshot(&self) -> crate::graph::GraphSnapshot {
        self.inner
            .graph
            .snapshot()
            .with_held(&self.inner.instances.unaccounted())
    }

    /// The instances of runs in progress as a plan may preempt them: each with its run's
    /// priority, the GPU memory it holds and its owner's fair-share standing.
    ///
    /// Errors: the store fails reading a run.
    pub fn running_instances(&self) -> Result<Vec<crate::plan::RunningInstance>, StoreError> {
        let mut running = Vec::new();
        // Each run read once: its priority and owner's standing, while in progress.
        let mut runs: HashMap<String, Option<(i32, crate::base::Standing)>> = HashMap::new();
        for view in self.inner.instances.list() {
            let Some(run) = view.run.clone() else { continue };
            if view.held.is_empty() {
                continue;
            }
            let known = match runs.get(&run) {
                Some(known) => *known,
                None => {
                    let known = self
                        .get(&run)?
                        .filter(|r| !r.state.is_final())
                        .map(|r| (r.workflow.placement.priority, self.inner.sharing.standing(&r.owner)));
                    runs.insert(run.clone(), known);
                    known
                }
            };
            let Some((priority, standing)) = known else { continue };
            running.push(crate::plan::RunningInstance {
                id: view.name.clone(),
                workflow: run,
                priority,
                gpus: view
                    .held
                    .iter()
                    .map(|&(gpu, bytes)| crate::plan::HeldGpu {
                        node: view.node_name.clone(),
                        gpu,
                        bytes,
                    })
                    .collect(),
                standing: Some(standing),
            });
        }
        Ok(running)
    }
}

/// Runs `f`, which waits for Rhai evaluations on the pool (`when`, `until`, prompt
/// templates: each stopped by its wall-clock budget), without holding a runtime worker:
/// on a multi-threaded runtime the worker's other tasks move to another thread first.
pub(super) fn off_worker<T>(f: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current().map(|h| h.runtime_flavor()) {
        Ok(tokio::runtime::RuntimeFlavor::MultiThread) => tokio::task::block_in_place(f),
        _ => f(),
    }
}
