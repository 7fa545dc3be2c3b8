//! The executor: admits submitted runs (bounded queues per priority, gang admission from
//! the plan), starts their instances on agents, drives their steps (prompts to the
//! engines, retries with backoff, `when`, `repeat`), and writes every change to the
//! store before it counts. After a restart it resumes every unfinished run from its
//! last recorded step.
//!
//! One task admits runs; one task per admitted run drives it. A run's record is only
//! changed by its own task (or, while queued, by the admission task), and always
//! written (and flushed) before the change is acted on or reported.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use skein_dsl::Workflow;
use skein_dsl::expr::Evaluator;
use skein_dsl::ir::{Agent, Backend};
use skein_model_registry::catalog::ModelInfo;
use skein_model_registry::hub::{HubClient, InspectOptions};
use tokio::sync::{Notify, mpsc, watch};
use tokio::task::JoinSet;

use super::launch;
use super::record::{AfterFailure, Next, RetryPolicy, RunRecord, RunState, typed_inputs};
use crate::base::{lock, new_id, unix_ms};
use crate::engine_client::{Answer, CallError, Route, call};
use crate::graph::{HardwareGraph, NodeId};
use crate::idempotency::{Claim, IdempotencyKeys, Idempotent, KeyError};
use crate::instances::{InstanceRequest, InstanceState, InstanceView, Instances};
use crate::plan::{Plan, PlanInput, PlanSettings, Planner};
use crate::store::{Db, StoreError, Tree, WriteBatch};

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
    runs: Tree<RunRecord>,
    /// The `Idempotency-Key`s of submissions.
    keys: IdempotencyKeys,
    graph: Arc<HardwareGraph>,
    hub: HubClient,
    instances: Arc<Instances>,
    planner: Arc<Mutex<Planner>>,
    config: ExecutorConfig,
    evaluator: Evaluator,
    /// Engines and endpoints are called through these.
    clients: crate::engine_client::Clients,
    /// Queued run ids, highest priority first, then oldest.
    queue: Mutex<BTreeSet<(Reverse<i32>, String)>>,
    /// Model catalogs read for queued runs, by run id.
    catalogs: Mutex<HashMap<String, Arc<BTreeMap<String, ModelInfo>>>>,
    /// One placement at a time per model instance key ([`Executor::provide`]).
    provides: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// Cancel signals of the runs being driven.
    active: Mutex<HashMap<String, watch::Sender<bool>>>,
    /// Every change of any run, by id (for live progress).
    changes: watch::Sender<(u64, String)>,
    wake: Notify,
    ids: AtomicU64,
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
                runs: db.tree("runs")?,
                keys: IdempotencyKeys::open(db, "run_keys")?,
                graph,
                hub,
                instances,
                planner,
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
            }),
        })
    }

    /// Resumes every unfinished run of the store (queued ones wait again; started ones
    /// are planned again and continue from their last recorded step) and starts the
    /// admission task.
    ///
    /// Errors: the store cannot be read.
    pub fn start(&self) -> Result<tokio::task::JoinHandle<()>, StoreError> {
        let mut resumed = 0;
        for mut run in self.inner.runs.all()? {
            if run.state.is_final() {
                continue;
            }
            run.recover();
            if run.state != RunState::Queued {
                run.state = RunState::Queued;
                run.reason = Some("resumed after a restart; planning again".to_owned());
                self.inner.runs.put_blocking(&run.id, &run)?;
            }
            lock(&self.inner.queue).insert((Reverse(run.workflow.placement.priority), run.id.clone()));
            resumed += 1;
        }
        if resumed > 0 {
            tracing::info!(runs = resumed, "resuming unfinished runs");
        }
        let executor = self.clone();
        Ok(tokio::spawn(async move { executor.admission().await }))
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

    /// Accepts a run of `workflow`: checks its inputs, refuses it when its priority's
    /// queue is full, and stores it (flushed) before returning it. With an
    /// `idempotent` key that submitted a run before (with the same request), stores
    /// nothing and returns that run as it is now.
    ///
    /// Errors: [`SubmitError`].
    pub async fn submit(
        &self,
        owner: &str,
        workflow: Workflow,
        inputs: &BTreeMap<String, serde_json::Value>,
        idempotent: Option<Idempotent<'_>>,
    ) -> Result<Submitted, SubmitError> {
        let claim = match idempotent {
            Some(idempotent) => Some(self.inner.keys.claim(owner, idempotent)?),
            None => None,
        };
        let pending = match claim {
            Some(Claim::Replay(found)) => {
                let run = self
                    .inner
                    .runs
                    .get(&found.created)?
                    .ok_or_else(|| StoreError::Corrupt {
                        tree: "run_keys",
                        key: found.created.clone(),
                        reason: "the idempotency key names a run that is not stored".to_owned(),
                    })?;
                return Ok(Submitted { run, replayed: true });
            }
            Some(Claim::New(pending)) => Some(pending),
            None => None,
        };
        let inputs = typed_inputs(&workflow, inputs)?;
        let priority = workflow.placement.priority;
        let capacity = self.inner.config.queue_capacity;
        let waiting = lock(&self.inner.queue).iter().filter(|(p, _)| p.0 == priority).count();
        if waiting >= capacity {
            return Err(SubmitError::QueueFull {
                priority,
                capacity,
                retry_after: self.inner.config.admission_interval.max(Duration::from_secs(1)) * 5,
            });
        }
        let now = unix_ms();
        let id = new_id('r', &self.inner.ids);
        let mut run = RunRecord::new(id, owner.to_owned(), workflow, inputs, now);
        run.reason = Some("waiting for admission".to_owned());
        // The run and its key in one atomic write: a crash leaves both or neither.
        let mut batch = WriteBatch::new();
        batch.put(&self.inner.runs, &run.id, &run);
        if let Some(pending) = &pending {
            pending.record(&mut batch, &run.id, now);
        }
        self.inner.runs.db().commit(batch).await?;
        drop(pending);
        lock(&self.inner.queue).insert((Reverse(priority), run.id.clone()));
        self.changed(&run.id);
        self.inner.wake.notify_one();
        Ok(Submitted { run, replayed: false })
    }

    /// One run.
    pub fn get(&self, id: &str) -> Result<Option<RunRecord>, StoreError> {
        self.inner.runs.get(id)
    }

    /// Every run, newest first.
    pub fn list(&self) -> Result<Vec<RunRecord>, StoreError> {
        let mut runs = self.inner.runs.all()?;
        runs.reverse();
        Ok(runs)
    }

    /// Cancels a run: a queued one at once, a running one through its task (its
    /// attempts are abandoned and its instances stopped).
    ///
    /// Errors: [`RunError::NotFound`].
    pub async fn cancel(&self, id: &str) -> Result<RunRecord, RunError> {
        let signal = lock(&self.inner.active).get(id).cloned();
        if let Some(signal) = signal {
            let _ = signal.send(true);
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
            self.inner.runs.put(id, &run).await?;
            self.changed(id);
        }
        Ok(run)
    }

    fn changed(&self, id: &str) {
        self.inner.changes.send_modify(|(n, last)| {
            *n = n.wrapping_add(1);
            id.clone_into(last);
        });
    }

    /// A ready model instance serving `agent` as `definition` says, for sessions and the
    /// OpenAI-compatible routes: a live instance that serves exactly the same model
    /// ([`serves`]: warm, or used by a run: engines serve many clients) where `pin`
    /// allows, else a new one planned on the live graph within `pin`, started, and
    /// waited for. `context` says whether the definition's context was asked for (an
    /// agent's) or is the language's default (a model named alone), which any instance
    /// of the model serves. A new instance belongs to no run: it stays warm while it is
    /// used ([`Instances::touch`]) and is stopped when idle, as warm instances are.
    ///
    /// Errors: [`ProvideError`].
    pub async fn provide(
        &self,
        agent: &str,
        definition: &Agent,
        pin: &Pin,
        context: ContextWanted,
    ) -> Result<InstanceView, ProvideError> {
        if matches!(definition.backend, Backend::Endpoint(_)) {
            return Err(ProvideError::Endpoint(agent.to_owned()));
        }

        // A model's own agent is named after its repository: instance names (and so
        // log files) get it without the characters a file name cannot hold.
        let agent: String = agent
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                    c
                } else {
                    '-'
                }
            })
            .collect();
        let workflow = Workflow {
            name: "serve".to_owned(),
            description: None,
            inputs: BTreeMap::new(),
            agents: BTreeMap::from([(agent.clone(), definition.clone())]),
            steps: Vec::new(),
            reflexes: Vec::new(),
            placement: skein_dsl::ir::Placement::default(),
        };
        let wanted = crate::plan::demand::instances(&workflow).into_iter().next();
        let key = wanted.as_ref().map(warm_key).unwrap_or_default();
        // One placement per model at a time: concurrent first messages share it.
        let gate = Arc::clone(
            lock(&self.inner.provides)
                .entry(wanted.as_ref().map(|w| w.key.clone()).unwrap_or_default())
                .or_default(),
        );
        let _turn = gate.lock().await;
        let live = |v: &InstanceView| {
            v.state == InstanceState::Ready
                && v.base_url.is_some()
                && pin.admits(v)
                && (v.warm_key == key || wanted.as_ref().is_some_and(|w| serves(v, w, context)))
        };
        // The one planned for exactly this first, then the one with the largest context.
        let found = self
            .inner
            .instances
            .filter(live)
            .into_iter()
            .filter(|v| !self.on_drained(v))
            .max_by_key(|v| (v.warm_key == key, v.placement.as_ref().map_or(0, |p| p.context)));
        if let Some(view) = found {
            return Ok(self.inner.instances.touch(&view.name).unwrap_or(view));
        }
        // Nothing serves it where pinned: say so if the place does not exist, before
        // planning (the graph is read only for a pin that names a place).
        if matches!(pin, Pin::Node { .. } | Pin::Gpu { .. })
            && let Some(missing) = pin.missing(&self.inner.graph.snapshot())
        {
            return Err(ProvideError::NoSuchPlace(missing));
        }
        let cache_key = format!("provide {key}");
        let planned = self.plan_workflow(&cache_key, &workflow, &[], pin).await;
        lock(&self.inner.catalogs).remove(&cache_key);
        let (plan, models) = planned.map_err(ProvideError::Unplaceable)?;
        if !plan.admitted {
            return Err(ProvideError::Unplaceable(
                plan.queued_reason
                    .unwrap_or_else(|| "no GPU or host has room for it now".to_owned()),
            ));
        }
        let prefix = new_id('i', &self.inner.ids);
        let names = self
            .start_planned(&prefix, &workflow, None, None, &plan, &models)
            .map_err(ProvideError::Failed)?;
        self.await_ready(&workflow, &names).await?;
        for name in &names {
            self.inner.instances.release(name);
        }
        names
            .first()
            .and_then(|name| self.inner.instances.get(name))
            .ok_or_else(|| ProvideError::Failed("the instance disappeared".to_owned()))
    }

    /// Waits until the instances `names` (of `workflow`) are all ready; stops them all
    /// when one fails or they are not ready within the ready timeout.
    async fn await_ready(&self, workflow: &Workflow, names: &[String]) -> Result<(), ProvideError> {
        let mut changes = self.inner.instances.subscribe();
        let deadline = tokio::time::Instant::now() + self.inner.config.ready_timeout;
        loop {
            let failure = match self.readiness(workflow, names) {
                Readiness::Ready(_) => return Ok(()),
                Readiness::Failed(reason) => reason,
                Readiness::Lost(lost) => format!("instance {} was lost: {}", lost.instance, lost.why),
                Readiness::Waiting(waiting) => {
                    tokio::select! {
                        _ = changes.changed() => continue,
                        _ = tokio::time::sleep_until(deadline) => format!(
                            "not ready after {}s: {}",
                            self.inner.config.ready_timeout.as_secs(),
                            waiting.join(", ")
                        ),
                    }
                }
            };
            self.stop_instances(names);
            return Err(ProvideError::Failed(failure));
        }
    }

    /// Starts one more replica of the instance serving `agent` in `run`, for reflex
    /// `reflex`: planned on the live graph off `avoid` (the same variant, or a smaller
    /// one if that is all that fits), started, and waited for. It belongs to the run.
    ///
    /// Errors: [`ProvideError`]; [`ProvideError::NoSuchPlace`] when the run is gone or has
    /// no such agent.
    pub async fn add_replica(
        &self,
        run: &str,
        agent: &str,
        reflex: &str,
        avoid: &Pin,
    ) -> Result<InstanceView, ProvideError> {
        let record = self
            .get(run)
            .ok()
            .flatten()
            .filter(|r| !r.state.is_final())
            .ok_or_else(|| ProvideError::NoSuchPlace(format!("run `{run}` is not running")))?;
        // The replica serves what the agent's instance serves (agents that share a model
        // share an instance).
        let serving = crate::plan::demand::instances(&record.workflow)
            .into_iter()
            .find(|i| i.agents.iter().any(|a| a == agent))
            .ok_or_else(|| ProvideError::NoSuchPlace(format!("run `{run}` has no model agent `{agent}`")))?;
        let mut workflow = record.workflow.clone();
        workflow.agents.retain(|name, _| serving.agents.contains(name));
        workflow.steps.clear();
        workflow.reflexes.clear();
        let cache_key = format!("replica {run} {agent}");
        let planned = self.plan_workflow(&cache_key, &workflow, &[], avoid).await;
        lock(&self.inner.catalogs).remove(&cache_key);
        let (plan, models) = planned.map_err(ProvideError::Unplaceable)?;
        if !plan.admitted {
            return Err(ProvideError::Unplaceable(plan.queued_reason.unwrap_or_else(|| {
                "no GPU or host has room for another replica now".to_owned()
            })));
        }
        let prefix = format!("{run}-{}", new_id('c', &self.inner.ids));
        let names = self
            .start_planned(&prefix, &workflow, Some(run), Some(reflex), &plan, &models)
            .map_err(ProvideError::Failed)?;
        self.await_ready(&workflow, &names).await?;
        names
            .first()
            .and_then(|name| self.inner.instances.get(name))
            .ok_or_else(|| ProvideError::Failed("the replica disappeared".to_owned()))
    }

    /// Whether `view` runs on a GPU that is drained.
    fn on_drained(&self, view: &InstanceView) -> bool {
        let snapshot = self.inner.graph.snapshot();
        snapshot.gpus().any(|(n, g)| {
            n.inventory.name == view.node_name && view.gpus.contains(&g.facts.index) && g.drained.is_some()
        })
    }

    /// Plans queued runs whenever something changes (a submission, a run ending, an
    /// instance changing) or every admission interval, and starts those whose
    /// instances can all be placed.
    async fn admission(self) {
        let mut instances = self.inner.instances.subscribe();
        loop {
            self.inner.instances.stop_orphans();
            self.inner.instances.stop_idle(self.inner.config.keep_warm);
            let queued: Vec<String> = lock(&self.inner.queue).iter().map(|(_, id)| id.clone()).collect();
            for id in queued {
                if let Err(error) = self.try_admit(&id).await {
                    tracing::error!(run = %id, %error, "admission failed");
                }
            }
            tokio::select! {
                _ = self.inner.wake.notified() => {}
                _ = instances.changed() => {}
                _ = tokio::time::sleep(self.inner.config.admission_interval) => {}
            }
        }
    }

    async fn try_admit(&self, id: &str) -> Result<(), StoreError> {
        let Some(mut run) = self.inner.runs.get(id)? else {
            self.dequeue(id);
            return Ok(());
        };
        if run.state.is_final() {
            self.dequeue(id);
            return Ok(());
        }
        let warm = self.claim_warm(&run);
        let planned = self.plan(&run, &warm).await;
        let (plan, models) = match planned {
            Ok(planned) => planned,
            Err(reason) => {
                // A model that cannot be read fails the run: waiting would not help.
                self.dequeue(id);
                run.fail(reason, unix_ms());
                self.inner.runs.put(id, &run).await?;
                self.changed(id);
                return Ok(());
            }
        };
        if !plan.admitted {
            for name in &warm {
                self.inner.instances.release(name);
            }
            // Room held by idle instances is given back before the run waits.
            if self.inner.instances.stop_idle(Duration::ZERO) > 0 {
                tracing::info!(run = %id, "stopped idle instances to make room");
            }
            let reason = plan
                .queued_reason
                .clone()
                .unwrap_or_else(|| "its instances cannot all be placed yet".to_owned());
            if run.reason.as_deref() != Some(reason.as_str()) {
                run.reason = Some(reason);
                self.inner.runs.put(id, &run).await?;
                self.changed(id);
            }
            return Ok(());
        }
        self.dequeue(id);
        lock(&self.inner.catalogs).remove(id);
        run.state = RunState::Starting;
        run.reason = Some("starting its instances".to_owned());
        self.inner.runs.put(id, &run).await?;
        self.changed(id);
        let (cancel, cancelled) = watch::channel(false);
        lock(&self.inner.active).insert(id.to_owned(), cancel);
        let executor = self.clone();
        tokio::spawn(async move {
            let id = run.id.clone();
            if let Err(error) = executor.drive(run, plan, models, warm, cancelled).await {
                tracing::error!(run = %id, %error, "a run stopped: the store failed");
            }
            lock(&executor.inner.active).remove(&id);
            // Its driving ended: watchers of the active runs see it gone.
            executor.changed(&id);
            executor.inner.wake.notify_one();
        });
        Ok(())
    }

    /// Claims warm instances for the run's model instances that have one.
    fn claim_warm(&self, run: &RunRecord) -> Vec<String> {
        crate::plan::demand::instances(&run.workflow)
            .iter()
            .filter_map(|instance| {
                self.inner
                    .instances
                    .claim(&warm_key(instance), &run.id, |v| !self.on_drained(v))
            })
            .map(|view| view.name)
            .collect()
    }

    fn dequeue(&self, id: &str) {
        lock(&self.inner.queue).retain(|(_, q)| q != id);
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

    /// The run's plan on the live graph, with the catalogs it was made with.
    async fn plan(&self, run: &RunRecord, warm: &[String]) -> Result<(Plan, Arc<BTreeMap<String, ModelInfo>>), String> {
        self.plan_workflow(&run.id, &run.workflow, warm, &Pin::Anywhere).await
    }

    /// A plan of `workflow` on the live graph (restricted by `placement`), with the
    /// catalogs it was made with (read once per `cache_key` while it is queued).
    async fn plan_workflow(
        &self,
        cache_key: &str,
        workflow: &Workflow,
        warm: &[String],
        placement: &Pin,
    ) -> Result<(Plan, Arc<BTreeMap<String, ModelInfo>>), String> {
        let cached = lock(&self.inner.catalogs).get(cache_key).cloned();
        let models = match cached {
            Some(models) => models,
            None => {
                let hub = self.inner.hub.clone();
                let read_workflow = workflow.clone();
                // The hub client's futures are not `Send`: read on a blocking thread.
                let read = tokio::task::spawn_blocking(move || {
                    tokio::runtime::Handle::current()
                        .block_on(crate::catalogs::inspect_workflow(
                            &hub,
                            &read_workflow,
                            &InspectOptions::default(),
                        ))
                        .map_err(|e| skein_model_registry::error_chain(&e))
                })
                .await
                .map_err(|e| format!("reading the models failed: {e}"))??;
                let models = Arc::new(read);
                lock(&self.inner.catalogs).insert(cache_key.to_owned(), Arc::clone(&models));
                models
            }
        };
        // Agents served by warm instances are not placed again.
        let mut workflow = workflow.clone();
        for name in warm {
            if let Some(view) = self.inner.instances.get(name) {
                for agent in &view.agents {
                    workflow.agents.remove(agent);
                }
            }
        }
        let snapshot = placement.restrict(self.plan_snapshot());
        // Planning is CPU work under the planner's lock: off the async workers.
        let planner = Arc::clone(&self.inner.planner);
        let catalogs = Arc::clone(&models);
        let plan = tokio::task::spawn_blocking(move || {
            let input = PlanInput {
                workflow: &workflow,
                models: &catalogs,
                graph: &snapshot,
                running: &[],
                settings: PlanSettings::default(),
            };
            Planner::plan_shared(&planner, &input).map_err(|e| e.to_string())
        })
        .await
        .map_err(|e| format!("the planner failed: {e}"))??;
        Ok((plan, models))
    }

    /// Drives an admitted run to its end.
    async fn drive(
        &self,
        mut run: RunRecord,
        mut plan: Plan,
        mut models: Arc<BTreeMap<String, ModelInfo>>,
        mut warm: Vec<String>,
        mut cancelled: watch::Receiver<bool>,
    ) -> Result<(), StoreError> {
        let id = run.id.clone();
        // Places a failing split replica must avoid from now on, and how often it failed.
        let mut avoid: Vec<(String, Vec<u32>)> = Vec::new();
        let mut split_failures = 0u32;
        // Placements made so far: a replica placed again gets a name of its own, so that
        // an agent never confuses its start with the stop of the one it replaces.
        let mut placements = 0u32;
        loop {
            let mut names = std::mem::take(&mut warm);
            match self.start_instances(&run, &plan, &models, placements) {
                Ok(started) => names.extend(started),
                Err(reason) => return self.finish_failed(run, reason, &names).await,
            }
            let lost = match self.wait_ready(&mut run, &names, &mut cancelled).await {
                Ok(routes) => match self.steps(&mut run, &routes, &mut cancelled).await? {
                    Stop::Cancelled => return self.finish_cancelled(run, &names).await,
                    Stop::Ended | Stop::Failed(_) => {
                        // Ended (succeeded or failed on a step): the instances stay warm.
                        for name in &names {
                            self.inner.instances.release(name);
                        }
                        return Ok(());
                    }
                    Stop::Lost(lost) => lost,
                },
                Err(Stop::Cancelled) => return self.finish_cancelled(run, &names).await,
                Err(Stop::Failed(reason)) => return self.finish_failed(run, reason, &names).await,
                Err(Stop::Ended) => return Ok(()),
                Err(Stop::Lost(lost)) => lost,
            };
            tracing::warn!(run = %id, instance = %lost.instance, why = %lost.why, "an instance was lost; placing the run's instances again");
            self.stop_instances(&names);
            placements += 1;
            if let Some(place) = lost.avoid {
                split_failures += 1;
                if split_failures > SPLIT_REPLACEMENTS {
                    let reason = format!(
                        "instance {} failed {split_failures} times across nodes, the last: {}",
                        lost.instance, lost.why
                    );
                    return self.finish_failed(run, reason, &[]).await;
                }
                avoid.push(place);
            }
            run.recover();
            run.state = RunState::Starting;
            run.reason = Some(format!(
                "instance {} was lost ({}); placing it again",
                lost.instance, lost.why
            ));
            self.save(&run).await?;
            let pin = if avoid.is_empty() {
                Pin::Anywhere
            } else {
                Pin::Avoid { places: avoid.clone() }
            };
            // Plan again on the graph without the lost node (and off failed pieces'
            // GPUs), waiting for room.
            loop {
                match self.plan_workflow(&run.id, &run.workflow, &[], &pin).await {
                    Ok((next, next_models)) if next.admitted => {
                        plan = next;
                        models = next_models;
                        break;
                    }
                    Ok(_) => {}
                    Err(reason) => return self.finish_failed(run, reason, &[]).await,
                }
                tokio::select! {
                    _ = cancelled.changed() => return self.finish_cancelled(run, &[]).await,
                    _ = tokio::time::sleep(self.inner.config.admission_interval) => {}
                }
            }
            lock(&self.inner.catalogs).remove(&id);
        }
    }

    async fn save(&self, run: &RunRecord) -> Result<(), StoreError> {
        self.inner.runs.put(&run.id, run).await?;
        self.changed(&run.id);
        Ok(())
    }

    async fn finish_failed(&self, mut run: RunRecord, reason: String, names: &[String]) -> Result<(), StoreError> {
        self.stop_instances(names);
        run.fail(reason, unix_ms());
        self.save(&run).await
    }

    async fn finish_cancelled(&self, mut run: RunRecord, names: &[String]) -> Result<(), StoreError> {
        self.stop_instances(names);
        run.cancel(unix_ms());
        self.save(&run).await
    }

    fn stop_instances(&self, names: &[String]) {
        for name in names {
            if let Err(error) = self.inner.instances.stop(name) {
                tracing::debug!(instance = %name, %error, "stop not delivered");
            }
        }
    }

    /// Sends a start for every placed replica of the run (named `{run}-{instance}`, or
    /// `{run}-{n}-{instance}` when placed again for the `n`th time); returns their names.
    fn start_instances(
        &self,
        run: &RunRecord,
        plan: &Plan,
        models: &BTreeMap<String, ModelInfo>,
        again: u32,
    ) -> Result<Vec<String>, String> {
        let prefix = if again == 0 {
            run.id.clone()
        } else {
            format!("{}-{again}", run.id)
        };
        self.start_planned(&prefix, &run.workflow, Some(&run.id), None, plan, models)
    }

    /// Sends a start for every placed replica of `plan` (of `workflow`), named
    /// `{prefix}-{instance}`, serving `run` if any (as a replica a reflex adds:
    /// `clone_of`); returns their names.
    fn start_planned(
        &self,
        prefix: &str,
        workflow: &Workflow,
        run: Option<&str>,
        clone_of: Option<&str>,
        plan: &Plan,
        models: &BTreeMap<String, ModelInfo>,
    ) -> Result<Vec<String>, String> {
        let snapshot = self.inner.graph.snapshot();
        let node_ids: HashMap<String, NodeId> = snapshot
            .nodes
            .iter()
            .map(|n| (n.inventory.name.clone(), n.id.clone()))
            .collect();
        let node_id = move |name: &str| node_ids.get(name).cloned().unwrap_or_else(|| NodeId(name.to_owned()));
        let mut names = Vec::new();
        for planned in &plan.instances {
            let name = format!("{prefix}-{}", planned.instance.replace('+', "-"));
            let launch = launch::start_instance(&name, planned, models, &snapshot, self.inner.config.seed)
                .map_err(|e| e.to_string())?;
            let serves = crate::plan::demand::instances(workflow)
                .into_iter()
                .find(|i| i.agents == planned.agents)
                .map(Arc::new);
            let warm_key = serves.as_deref().map(warm_key).unwrap_or_default();
            let (node_name, start, split) = match launch {
                launch::Launch::One { node, start } => (node, start, None),
                launch::Launch::Split(split) => (split.node.clone(), split.template().clone(), Some(split)),
            };
            let request = InstanceRequest {
                warm_key,
                serves,
                node: node_id(&node_name),
                node_name,
                run: run.map(str::to_owned),
                clone_of: clone_of.map(str::to_owned),
                placement: Some(Arc::new(planned.clone())),
                agents: planned.agents.clone(),
                engine: planned.engine.clone(),
                variant: planned.variant.clone(),
                estimated_bytes: planned.devices.iter().map(|d| d.reserved).sum(),
                held: planned
                    .devices
                    .iter()
                    .filter_map(|d| Some((d.gpu?, d.reserved)))
                    .collect(),
                part_of: None,
                start,
            };
            match split {
                Some(split) => super::split::start(&self.inner.instances, request, split, node_id.clone()),
                None => {
                    if let Err(error) = self.inner.instances.start(request) {
                        tracing::warn!(instance = %name, %error, "start not delivered yet; it is sent when the node connects");
                    }
                }
            }
            names.push(name);
        }
        Ok(names)
    }

    /// Where the instances `names` stand, together.
    fn readiness(&self, workflow: &Workflow, names: &[String]) -> Readiness {
        let mut routes = remote_routes(workflow);
        let mut waiting = Vec::new();
        for name in names {
            let Some(view) = self.inner.instances.get(name) else {
                return Readiness::Failed(format!("instance {name} disappeared"));
            };
            if let Some(lost) = Lost::of(name, Some(&view)) {
                return Readiness::Lost(lost);
            }
            match (view.state, view.base_url.clone()) {
                (InstanceState::Ready, Some(base_url)) => {
                    for agent in &view.agents {
                        routes.insert(
                            agent.clone(),
                            Route {
                                instance: Some(name.clone()),
                                base_url: base_url.clone(),
                                model: name.clone(),
                                api_key: view.engine_key.clone(),
                            },
                        );
                    }
                }
                (InstanceState::Failed, _) => {
                    return Readiness::Failed(format!("instance {name} on {} failed: {}", view.node_name, view.detail));
                }
                (state, _) => waiting.push(waiting_for(&view, state)),
            }
        }
        if waiting.is_empty() {
            Readiness::Ready(routes)
        } else {
            Readiness::Waiting(waiting)
        }
    }

    /// Waits until every instance is ready; returns where each agent is served.
    async fn wait_ready(
        &self,
        run: &mut RunRecord,
        names: &[String],
        cancelled: &mut watch::Receiver<bool>,
    ) -> Result<BTreeMap<String, Route>, Stop> {
        let mut changes = self.inner.instances.subscribe();
        let deadline = tokio::time::Instant::now() + self.inner.config.ready_timeout;
        loop {
            let waiting = match self.readiness(&run.workflow, names) {
                Readiness::Ready(routes) => return Ok(routes),
                Readiness::Failed(reason) => return Err(Stop::Failed(reason)),
                Readiness::Lost(lost) => return Err(Stop::Lost(lost)),
                Readiness::Waiting(waiting) => waiting,
            };
            // The run says what it waits for (the CLI shows it as progress).
            let reason = format!("starting: {}", waiting.join("; "));
            if run.reason.as_deref() != Some(reason.as_str()) {
                run.reason = Some(reason);
                if let Err(error) = self.save(run).await {
                    tracing::warn!(run = %run.id, %error, "progress not saved");
                }
            }
            tokio::select! {
                _ = changes.changed() => {}
                _ = cancelled.changed() => return Err(Stop::Cancelled),
                _ = tokio::time::sleep_until(deadline) => {
                    return Err(Stop::Failed(format!(
                        "instances not ready after {}s: {}",
                        self.inner.config.ready_timeout.as_secs(),
                        waiting.join(", ")
                    )));
                }
            }
        }
    }

    /// Runs the steps until the run ends, is cancelled, or loses an instance.
    async fn steps(
        &self,
        run: &mut RunRecord,
        routes: &BTreeMap<String, Route>,
        cancelled: &mut watch::Receiver<bool>,
    ) -> Result<Stop, StoreError> {
        let evaluator = &self.inner.evaluator;
        let (results, mut finished) = mpsc::channel::<(String, Result<Answer, CallError>)>(64);
        // Attempts in a row that could not reach their engine, by step.
        let mut unreachable: HashMap<String, u32> = HashMap::new();
        let mut attempts: JoinSet<()> = JoinSet::new();
        let mut changes = self.inner.instances.subscribe();
        run.reason = None;
        if run.workflow.steps.is_empty() {
            run.state = RunState::Running;
            run.started_at.get_or_insert(unix_ms());
            run.reason = Some("serving its agents until cancelled".to_owned());
        }
        loop {
            let starts = off_worker(|| run.advance(evaluator, unix_ms()));
            self.save(run).await?;
            for Next::Start { step, agent, prompt } in starts {
                let Some(route) = routes.get(&agent).cloned() else {
                    run.fail(format!("agent `{agent}` has no instance"), unix_ms());
                    self.save(run).await?;
                    return Ok(Stop::Ended);
                };
                // Among the agent's replicas (a reflex may have added some), by share.
                let route = match &route.instance {
                    Some(_) => self
                        .inner
                        .instances
                        .pick(&run.id, &agent)
                        .and_then(|view| Route::to_instance(&view))
                        .unwrap_or(route),
                    None => route,
                };
                if let Some(record) = run.steps.iter_mut().find(|s| s.id == step) {
                    record.instance = route.instance.clone();
                }
                // Its engine's logs may hold this prompt from now on.
                if let Some(instance) = &route.instance {
                    self.inner.instances.used_by(instance, &run.owner);
                }
                let request = self.chat_request(&run.workflow, &step, &agent, prompt);
                let clients = self.inner.clients.clone();
                let results = results.clone();
                let load = self.inner.instances.load().clone();
                // A remote endpoint's key is the run owner's secret, read at each call.
                let endpoint = match run.workflow.agents.get(&agent).map(|a| &a.backend) {
                    Some(Backend::Endpoint(endpoint)) if route.instance.is_none() => Some(endpoint.clone()),
                    _ => None,
                };
                let owner = run.owner.clone();
                let run_id = run.id.clone();
                let executor = self.clone();
                attempts.spawn(async move {
                    // An endpoint agent's requests count under the agent, as reflexes read them.
                    let counted = crate::load::counted_under(
                        route.instance.as_deref(),
                        endpoint.as_ref().map(|_| (run_id.as_str(), agent.as_str())),
                    );
                    let flight = counted.map(|key| load.begin(&key, None));
                    let route_instance = route.instance.clone();
                    let route = match endpoint {
                        Some(endpoint) => clients.endpoint_route(&owner, &endpoint),
                        None => Ok(route),
                    };
                    let answer = match route {
                        Ok(route) => call(&clients, &route, request.0, request.1).await,
                        Err(error) => Err(error),
                    };
                    if let (Some(flight), Ok(answer)) = (flight, &answer) {
                        flight.done(answer.usage.map_or(0, |u| u.completion_tokens));
                    }
                    if let (Some(instance), Ok(answer)) = (&route_instance, &answer)
                        && let Some(rate) = answer.decode_tokens_per_s
                    {
                        executor.record_speed(instance, rate);
                    }
                    let _ = results.send((step, answer)).await;
                });
            }
            if run.state.is_final() {
                return Ok(Stop::Ended);
            }
            let retry_at = run.next_retry();
            let wait = retry_at.map(|at| unix_ms().until(at));
            tokio::select! {
                Some((step, answer)) = finished.recv() => {
                    let now = unix_ms();
                    match answer {
                        Ok(answer) => {
                            unreachable.remove(&step);
                            off_worker(|| run.complete(&step, answer.content, answer.usage, evaluator, now));
                        }
                        Err(CallError::Unreachable(error)) if unreachable.get(&step).copied().unwrap_or(0) < UNREACHABLE_RETRIES => {
                            // Most likely its node is going down: wait for the graph to
                            // say so (the run then moves), without spending a retry.
                            let count = unreachable.entry(step.clone()).or_insert(0);
                            *count += 1;
                            run.interrupt(&step, error, now.plus(self.inner.config.retry.backoff(*count)));
                        }
                        Err(CallError::Unreachable(error) | CallError::Engine(error) | CallError::Refused(error) | CallError::Denied(error)) => {
                            unreachable.remove(&step);
                            if let AfterFailure::RetryAt(_) = run.fail_attempt(&step, error, &self.inner.config.retry, now) {
                                tracing::info!(run = %run.id, %step, "step failed; retrying");
                            }
                        }
                    }
                }
                _ = cancelled.changed() => {
                    attempts.abort_all();
                    return Ok(Stop::Cancelled);
                }
                _ = changes.changed() => {
                    let lost = routes
                        .values()
                        .filter_map(|r| r.instance.as_ref())
                        .find_map(|name| Lost::of(name, self.inner.instances.get(name).as_ref()));
                    if let Some(lost) = lost {
                        attempts.abort_all();
                        return Ok(Stop::Lost(lost));
                    }
                }
                _ = tokio::time::sleep(wait.unwrap_or(Duration::from_secs(3600))), if wait.is_some() => {}
            }
        }
    }

    /// The chat request of one attempt, and its timeout.
    fn chat_request(
        &self,
        workflow: &Workflow,
        step: &str,
        agent: &str,
        prompt: String,
    ) -> (serde_json::Value, Duration) {
        let definition = workflow.agents.get(agent);
        let mut messages = Vec::new();
        if let Some(system) = definition.and_then(|a| a.system.as_ref()) {
            messages.push(serde_json::json!({"role": "system", "content": system}));
        }
        messages.push(serde_json::json!({"role": "user", "content": prompt}));
        let mut body = serde_json::json!({ "messages": messages, "stream": false });
        if let Some(t) = definition.and_then(|a| a.temperature) {
            body["temperature"] = serde_json::json!(t);
        }
        if let Some(m) = definition.and_then(|a| a.max_tokens) {
            body["max_tokens"] = serde_json::json!(m);
        }
        let timeout = workflow
            .step(step)
            .and_then(|s| s.timeout)
            .unwrap_or(self.inner.config.step_timeout);
        (body, timeout)
    }
}

/// What an instance being started is doing, for people: `writer+editor: downloading 40%
/// on node-a`; a restart says why, from the engine's own report (`writer: restarting
/// (restart 2): exited with status 1 while loading; last log line: …`), and the
/// starts after it say which restart they are. Download progress goes in steps of 10 %,
/// so a run's record changes a few times per download, not per chunk.
fn waiting_for(view: &InstanceView, state: InstanceState) -> String {
    let (done, total) = (view.downloaded, view.download_total);
    let doing = match state {
        InstanceState::Downloading if total > 0 => {
            format!("downloading {}%", (done.saturating_mul(10) / total).min(10) * 10)
        }
        InstanceState::Requested => "asked for".to_owned(),
        InstanceState::Restarting => format!("restarting (restart {}): {}", view.restarts, why(&view.detail)),
        InstanceState::Unhealthy => format!("unhealthy: {}", why(&view.detail)),
        other if view.restarts > 0 => format!("{other} (restart {})", view.restarts),
        other => other.name().to_owned(),
    };
    format!("{}: {doing} on {}", view.agents.join("+"), view.node_name)
}

/// The longest engine log line a run's progress quotes.
const WHY_LINE_CHARS: usize = 240;

/// An engine's failure report (`exited with status 1 while loading; last log
/// lines:` and the lines) on one line: the reason and the last line the engine wrote.
fn why(detail: &str) -> String {
    let (reason, tail) = detail.split_once(skein_proto::LAST_LOG_LINES).unwrap_or((detail, ""));
    let reason = reason.lines().next().unwrap_or_default().trim();
    let reason = if reason.is_empty() {
        "no reason reported"
    } else {
        reason
    };
    match tail.lines().map(str::trim).rfind(|line| !line.is_empty()) {
        Some(last) => {
            let mut shown: String = last.chars().take(WHY_LINE_CHARS).collect();
            if shown.len() < last.len() {
                shown.push('…');
            }
            format!("{reason}; last log line: {shown}")
        }
        None => reason.to_owned(),
    }
}

/// What a model instance serves, exactly: a warm instance is reused only by a run
/// whose agents need the same model, requirement and constraints.
fn warm_key(instance: &crate::plan::demand::Instance) -> String {
    format!("{}|{:?}|{:?}", instance.key, instance.requirement, instance.max_gpus)
}

/// Whether a session or request may use a model's context of the language's default.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContextWanted {
    /// The agent's context was asked for: the instance must hold at least as much.
    AtLeast,
    /// A model named alone: any context of an instance of the model will do (the
    /// history sent is then cut to the instance's context).
    Any,
}

/// Whether the ready instance `view` serves `wanted` (a session's or a request's model
/// instance) exactly enough to be shared (docs/sessions.md, "Which instance serves"):
/// the same repository, revision and pinned variants; a variant whose format, precision
/// tier and engine `wanted` accepts; at least its context (unless [`ContextWanted::Any`]);
/// the same GPU constraints, or none asked, and no more GPUs than it allows. Concurrency
/// and preference do not count: a session or a request is one sequence more.
pub fn serves(view: &InstanceView, wanted: &crate::plan::demand::Instance, context: ContextWanted) -> bool {
    let (Some(has), Some(planned)) = (view.serves.as_deref(), view.placement.as_deref()) else {
        return false;
    };
    let asked = &wanted.requirement;
    let format = if planned.variant.to_ascii_lowercase().ends_with(".gguf") {
        skein_dsl::ir::WeightFormat::Gguf
    } else {
        skein_dsl::ir::WeightFormat::Safetensors
    };
    let gpus = planned.devices.iter().filter(|d| d.gpu.is_some()).count();
    has.key == wanted.key
        && asked.formats.contains(&format)
        && planned.precision >= asked.min_precision
        && (asked.engines.is_empty() || asked.engines.iter().any(|e| e.plan_name() == planned.engine))
        && (context == ContextWanted::Any || planned.context >= u64::from(asked.context))
        && (asked.gpu == skein_dsl::ir::GpuConstraints::default() || asked.gpu == has.requirement.gpu)
        && wanted.max_gpus.is_none_or(|most| gpus <= most as usize)
}

/// Remote endpoints, keyed by agent: called directly (their keys are read from the
/// owner's secrets at each call).
fn remote_routes(workflow: &Workflow) -> BTreeMap<String, Route> {
    workflow
        .agents
        .iter()
        .filter_map(|(name, agent)| match &agent.backend {
            Backend::Endpoint(endpoint) => Some((
                name.clone(),
                Route {
                    instance: None,
                    base_url: endpoint.url.trim_end_matches('/').to_owned(),
                    model: endpoint.model.clone(),
                    api_key: None,
                },
            )),
            Backend::Model(_) => None,
        })
        .collect()
}

/// Where a group of instances stands.
enum Readiness {
    /// All ready: where each agent is served (remote endpoints included).
    Ready(BTreeMap<String, Route>),
    /// Some are not ready yet: what each is doing.
    Waiting(Vec<String>),
    /// One failed (why).
    Failed(String),
    /// One was lost and must be placed again.
    Lost(Lost),
}

/// An instance to place again: lost with its node, or a replica split across nodes that
/// failed through one of its pieces.
#[derive(Debug, Clone)]
struct Lost {
    /// Its name.
    instance: String,
    /// What happened.
    why: String,
    /// Where a piece failed on a node still up, which the new placement avoids:
    /// `(node name, GPUs)`.
    avoid: Option<(String, Vec<u32>)>,
}

impl Lost {
    /// Whether `view` (of `name`; `None`: gone) must be placed again.
    fn of(name: &str, view: Option<&InstanceView>) -> Option<Lost> {
        let Some(view) = view else {
            return Some(Lost {
                instance: name.to_owned(),
                why: "it disappeared".to_owned(),
                avoid: None,
            });
        };
        match view.state {
            InstanceState::Lost => Some(Lost {
                instance: name.to_owned(),
                why: if view.detail.is_empty() {
                    "it was lost with its node".to_owned()
                } else {
                    view.detail.clone()
                },
                avoid: None,
            }),
            // A split replica fails as a whole and is placed again (off the failed piece's GPUs).
            InstanceState::Failed if !view.pieces.is_empty() => Some(Lost {
                instance: name.to_owned(),
                why: view.detail.clone(),
                avoid: view.failed_on.clone(),
            }),
            _ => None,
        }
    }
}

/// How many times a run places a split replica again after its pieces failed (a lost
/// node is avoided by the graph; a failing piece on a node that is up, by the placement)
/// before the run fails.
const SPLIT_REPLACEMENTS: u32 = 2;

/// Where an instance [`Executor::provide`]s may be placed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pin {
    /// Wherever the planner likes.
    Anywhere,
    /// On this node (its GPUs or its CPU, as the planner likes).
    Node {
        /// The node's name.
        node: String,
    },
    /// On this GPU of this node, alone.
    Gpu {
        /// The node's name.
        node: String,
        /// The GPU's index.
        gpu: u32,
    },
    /// Anywhere but on these places: GPUs of a node (moving off them), or a whole node
    /// (no GPU named: off the node, its CPU included).
    Avoid {
        /// `(node name, GPU indices)`.
        places: Vec<(String, Vec<u32>)>,
    },
}

impl Pin {
    /// Off these GPUs of `node` (off the whole node when `gpus` is empty).
    pub fn avoid(node: &str, gpus: &[u32]) -> Pin {
        Pin::Avoid {
            places: vec![(node.to_owned(), gpus.to_vec())],
        }
    }

    /// What the pin names that the graph does not have: an unknown node, or a GPU
    /// index the node lacks.
    fn missing(&self, snapshot: &crate::graph::GraphSnapshot) -> Option<String> {
        let (name, gpu) = match self {
            Pin::Node { node } => (node, None),
            Pin::Gpu { node, gpu } => (node, Some(*gpu)),
            Pin::Anywhere | Pin::Avoid { .. } => return None,
        };
        let Some(node) = snapshot.nodes.iter().find(|n| n.inventory.name == *name) else {
            let known: Vec<&str> = snapshot.nodes.iter().map(|n| n.inventory.name.as_str()).collect();
            return Some(format!("no node `{name}`; the nodes are: {}", known.join(", ")));
        };
        match gpu {
            Some(gpu) if !node.gpus.iter().any(|g| g.facts.index == gpu) => Some(format!(
                "node `{name}` has no GPU {gpu}; it has {} (indices from 0)",
                node.gpus.len()
            )),
            _ => None,
        }
    }

    /// The snapshot with what the pin excludes marked down.
    fn restrict(&self, snapshot: crate::graph::GraphSnapshot) -> crate::graph::GraphSnapshot {
        match self {
            Pin::Anywhere => snapshot,
            Pin::Node { node } => snapshot.restricted(|n| n.inventory.name == *node, |_, _| true),
            Pin::Gpu { node, gpu } => snapshot.restricted(|n| n.inventory.name == *node, |_, g| g.facts.index == *gpu),
            Pin::Avoid { places } => snapshot.restricted(
                |n| {
                    !places
                        .iter()
                        .any(|(node, gpus)| gpus.is_empty() && n.inventory.name == *node)
                },
                |n, g| {
                    !places
                        .iter()
                        .any(|(node, gpus)| n.inventory.name == *node && gpus.contains(&g.facts.index))
                },
            ),
        }
    }

    /// Whether a running instance is where the pin allows.
    pub fn admits(&self, view: &InstanceView) -> bool {
        match self {
            Pin::Anywhere => true,
            Pin::Node { node } => view.node_name == *node,
            Pin::Gpu { node, gpu } => view.node_name == *node && view.gpus == [*gpu],
            Pin::Avoid { places } => !places.iter().any(|(node, gpus)| {
                view.node_name == *node && (gpus.is_empty() || view.gpus.iter().any(|g| gpus.contains(g)))
            }),
        }
    }
}

/// Why no instance could be provided.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProvideError {
    /// The agent is a remote endpoint: it has no instance.
    #[error("agent `{0}` is a remote endpoint; it runs on no GPU of this fleet")]
    Endpoint(String),
    /// The pin names a node or GPU the fleet does not have.
    #[error("{0}")]
    NoSuchPlace(String),
    /// The model cannot be placed where asked (the planner's reason).
    #[error("cannot place it: {0}")]
    Unplaceable(String),
    /// The instance did not start (its error).
    #[error("its instance did not start: {0}")]
    Failed(String),
}

/// Why a run's drive stopped.
enum Stop {
    /// A user cancelled it.
    Cancelled,
    /// Its instances could not start (the reason).
    Failed(String),
    /// An instance was lost (with its node, or a piece of its split failed).
    Lost(Lost),
    /// The run ended (succeeded, or failed on a step).
    Ended,
}

/// Attempts in a row that may fail to reach their engine before it counts as the
/// step's failure (with the retry backoff, tens of seconds: longer than a node takes to
/// be marked down).
const UNREACHABLE_RETRIES: u32 = 8;

/// Runs `f`, which waits for Rhai evaluations on the pool (`when`, `until`, prompt
/// templates: each stopped by its wall-clock budget), without holding a runtime worker:
/// on a multi-threaded runtime the worker's other tasks move to another thread first.
fn off_worker<T>(f: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current().map(|h| h.runtime_flavor()) {
        Ok(tokio::runtime::RuntimeFlavor::MultiThread) => tokio::task::block_in_place(f),
        _ => f(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::demand;

    /// The model instance of a one-agent workflow whose agent reads `model`.
    fn wanted(model: &str) -> demand::Instance {
        let text =
            format!("name: w\nagents:\n  a: {{ model: {model} }}\nsteps:\n  - {{ id: s, agent: a, prompt: x }}\n");
        let parsed = skein_dsl::parse("w.yaml", &text);
        let workflow = parsed.workflow.unwrap_or_else(|| panic!("{:?}", parsed.diagnostics));
        demand::instances(&workflow).remove(0)
    }

    /// A ready instance started for `started`, planned on the CPU with `context`, the
    /// variant `variant` at `precision` on `engine`.
    fn instance(started: &str, context: u64, variant: &str, precision: &str, engine: &str) -> InstanceView {
        let instances = Instances::default();
        let serves = Arc::new(wanted(started));
        let planned: crate::plan::PlannedInstance = serde_json::from_value(serde_json::json!({
            "instance": "a", "agents": ["a"], "model": serves.requirement.repo, "replica": 1, "replicas": 1,
            "context": context, "concurrency": 1, "variant": variant, "precision": precision,
            "quantization": "x", "engine": engine, "family": "cpu",
            "layout": {"tensor_parallel": 1, "pipeline_stages": 1, "layer_partition": []},
            "devices": [], "tokens_per_s": 1.0, "slow": true, "score": 0, "why": [], "rejected": [],
        }))
        .unwrap();
        let _not_connected = instances.start(InstanceRequest {
            node: NodeId("n".to_owned()),
            node_name: "n".to_owned(),
            run: None,
            agents: vec!["a".to_owned()],
            engine: engine.to_owned(),
            variant: variant.to_owned(),
            estimated_bytes: 0,
            held: Vec::new(),
            warm_key: warm_key(&serves),
            serves: Some(serves),
            clone_of: None,
            placement: Some(Arc::new(planned)),
            part_of: None,
            start: skein_proto::agent::v1::StartInstance {
                instance: "i".to_owned(),
                ..Default::default()
            },
        });
        instances.get("i").unwrap()
    }

    #[test]
    fn an_instance_serves_the_same_model_within_what_it_was_planned_for() {
        let run = instance("{ repo: o/m, context: 256 }", 256, "o/m", "fp32", "candle");
        // Concurrency and preference do not count; a smaller context does.
        assert!(serves(
            &run,
            &wanted("{ repo: o/m, context: 128, concurrency: 4 }"),
            ContextWanted::AtLeast
        ));
        assert!(serves(
            &run,
            &wanted("{ repo: o/m, context: 256, prefer: speed }"),
            ContextWanted::AtLeast
        ));
        // More context than it holds: only when none was asked (a model named alone).
        assert!(!serves(&run, &wanted("o/m"), ContextWanted::AtLeast));
        assert!(serves(&run, &wanted("o/m"), ContextWanted::Any));
        // Another model, revision or pinned variant.
        assert!(!serves(&run, &wanted("p/m"), ContextWanted::Any));
        assert!(!serves(
            &run,
            &wanted("{ repo: o/m, revision: v2 }"),
            ContextWanted::Any
        ));
        // A variant the request does not accept: format, precision, engine.
        assert!(!serves(
            &run,
            &wanted("{ repo: o/m, formats: [gguf] }"),
            ContextWanted::Any
        ));
        assert!(!serves(
            &run,
            &wanted("{ repo: o/m, engines: [llama.cpp] }"),
            ContextWanted::Any
        ));
        let gguf = instance(
            "{ repo: o/m, formats: [gguf] }",
            4096,
            "o/m:m-Q4_K_M.gguf",
            "int4",
            "llama.cpp",
        );
        assert!(serves(
            &gguf,
            &wanted("{ repo: o/m, formats: [gguf] }"),
            ContextWanted::AtLeast
        ));
        assert!(!serves(
            &gguf,
            &wanted("{ repo: o/m, min_precision: int8 }"),
            ContextWanted::Any
        ));
        // Other GPU constraints than it was placed under; none asked is fine.
        assert!(!serves(
            &run,
            &wanted("{ repo: o/m, gpu: { models: [A100] } }"),
            ContextWanted::Any
        ));
        let a100 = instance("{ repo: o/m, gpu: { models: [A100] } }", 4096, "o/m", "bf16", "vllm");
        assert!(serves(&a100, &wanted("o/m"), ContextWanted::AtLeast));
        assert!(serves(
            &a100,
            &wanted("{ repo: o/m, gpu: { models: [A100] } }"),
            ContextWanted::AtLeast
        ));
    }
}
