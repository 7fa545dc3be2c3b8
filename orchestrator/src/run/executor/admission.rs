//! Admission: a submission is checked and queued (bounded per priority); the admission
//! task plans queued runs, highest priority first, whenever something changes, claims
//! warm instances they can reuse, and starts those whose instances can all be placed.

use std::cmp::Reverse;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use skein_dsl::Workflow;
use skein_model_registry::catalog::ModelInfo;
use skein_model_registry::hub::InspectOptions;
use tokio::sync::watch;

use super::provide::Pin;
use super::reuse::warm_key;
use super::{Executor, SubmitError, Submitted};
use crate::base::{lock, new_id, unix_ms};
use crate::idempotency::{Claim, Idempotent};
use crate::plan::{Plan, PlanInput, PlanSettings, Planner};
use crate::run::record::{RunRecord, RunState, typed_inputs};
use crate::sharing::GpuUse;
use crate::store::{StoreError, WriteBatch};

impl Executor {
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
        // Checked and reserved in one step: no interleaving passes a runs limit.
        self.inner.sharing.reserve_run(owner, &id)?;
        let mut run = RunRecord::new(id, owner.to_owned(), workflow, inputs, now);
        run.reason = Some("waiting for admission".to_owned());
        // The run and its key in one atomic write: a crash leaves both or neither.
        let mut batch = WriteBatch::new();
        let stored = match self.inner.runs.add(&mut batch, &mut run) {
            Ok(_) => {
                if let Some(pending) = &pending {
                    pending.record(&mut batch, &run.id, now);
                }
                self.inner.runs.db().commit(batch).await
            }
            Err(e) => Err(e),
        };
        if let Err(e) = stored {
            self.inner.sharing.release_run(&run.id);
            return Err(e.into());
        }
        drop(pending);
        lock(&self.inner.queue).insert((Reverse(priority), run.id.clone()));
        self.changed(&run.id);
        self.inner.wake.notify_one();
        Ok(Submitted { run, replayed: false })
    }
    /// Plans queued runs whenever something changes (a submission, a run ending, an
    /// instance changing) or every admission interval, and starts those whose
    /// instances can all be placed.
    /// Ends when the server's shutdown token is cancelled (between admissions).
    pub(super) async fn admission(self) {
        let mut instances = self.inner.instances.subscribe();
        let shutdown = self.lifecycle().shutdown.clone();
        loop {
            if shutdown.is_cancelled() {
                return;
            }
            self.inner.instances.stop_orphans();
            self.inner.instances.stop_idle(self.inner.config.keep_warm);
            let now = unix_ms();
            if let Err(error) = self.inner.sharing.meter(now, &self.inner.instances.list()).await {
                tracing::warn!(%error, "fair-share usage not saved");
            }
            let queued: Vec<(i32, String)> = lock(&self.inner.queue)
                .iter()
                .map(|(priority, id)| (priority.0, id.clone()))
                .collect();
            // Priority, then the owners' fair share, then age (docs/sharing.md).
            for id in self.inner.sharing.order(&queued, now).into_iter().map(|i| &queued[i].1) {
                if shutdown.is_cancelled() {
                    return;
                }
                if let Err(error) = self.try_admit(id).await {
                    tracing::error!(run = %id, %error, "admission failed");
                }
            }
            tokio::select! {
                () = shutdown.cancelled() => return,
                _ = self.inner.wake.notified() => {}
                _ = instances.changed() => {}
                _ = tokio::time::sleep(self.inner.config.admission_interval) => {}
            }
        }
    }

    pub(super) async fn try_admit(&self, id: &str) -> Result<(), StoreError> {
        if lock(&self.inner.active).contains_key(id) {
            // Driven already: a second task would take its cancel signal.
            tracing::warn!(run = %id, "a run being driven was queued again; left to its task");
            self.dequeue(id);
            return Ok(());
        }
        let Some(mut run) = self.inner.runs.get(id)? else {
            self.dequeue(id);
            self.inner.sharing.release_run(id);
            return Ok(());
        };
        if run.state.is_final() {
            self.dequeue(id);
            self.inner.sharing.release_run(id);
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
                self.inner.runs.put(&mut run).await?;
                self.inner.sharing.release_run(id);
                self.changed(id);
                return Ok(());
            }
        };
        // A plan within the fleet but beyond the owner's GPU limits waits, saying which.
        let over_quota = if plan.admitted {
            let adding = GpuUse::of_plan(&plan);
            self.inner
                .sharing
                .check_gpus(id, &adding, &self.inner.instances.list())
                .err()
        } else {
            None
        };
        if !plan.admitted || over_quota.is_some() {
            for name in &warm {
                self.inner.instances.release(name);
            }
            // Room held by idle instances is given back before the run waits (not for
            // a quota: idle instances count against nobody's).
            let freed = over_quota.is_none() && self.inner.instances.stop_idle(Duration::ZERO) > 0;
            if freed {
                tracing::info!(run = %id, "stopped idle instances to make room");
            }
            // Beyond the fleet even so, and allowed to preempt: lower-priority runs go
            // back to the queue, and this one starts once their instances stopped.
            let preempting = if over_quota.is_none() && !freed && self.inner.config.preempt {
                self.preempt_for(&run).await
            } else {
                None
            };
            let reason = match (over_quota, preempting) {
                (Some(refusal), _) => format!("over a quota: {refusal}"),
                (None, Some(preempting)) => preempting,
                (None, None) => plan
                    .queued_reason
                    .clone()
                    .unwrap_or_else(|| "its instances cannot all be placed yet".to_owned()),
            };
            if run.reason.as_deref() != Some(reason.as_str()) {
                run.reason = Some(reason);
                self.inner.runs.put(&mut run).await?;
                self.changed(id);
            }
            return Ok(());
        }
        if self.lifecycle().shutdown.is_cancelled() {
            // Stopping: the run stays queued (and is planned again at the next start).
            for name in &warm {
                self.inner.instances.release(name);
            }
            return Ok(());
        }
        self.dequeue(id);
        lock(&self.inner.catalogs).remove(id);
        run.state = RunState::Starting;
        run.reason = Some("starting its instances".to_owned());
        self.inner.runs.put(&mut run).await?;
        self.changed(id);
        let (cancel, cancelled) = watch::channel(super::preempt::Halt::Run);
        let (decide, decisions) = tokio::sync::mpsc::channel(super::approve::DECISIONS_QUEUED);
        lock(&self.inner.active).insert(id.to_owned(), super::approve::Signals { cancel, decide });
        let executor = self.clone();
        // The server owns the run's task: its shutdown stops the run between steps.
        self.lifecycle().tasks.spawn(async move {
            let id = run.id.clone();
            if let Err(error) = executor.drive(run, plan, models, warm, cancelled, decisions).await {
                tracing::error!(run = %id, %error, "a run stopped: the store failed");
            }
            lock(&executor.inner.active).remove(&id);
            executor.inner.sharing.release_run(&id);
            // Preempted: it waits again, counted against its owner's runs as before.
            executor.requeue_preempted(&id);
            // An ended run's time is counted for its owner (not one stopped by a shutdown).
            if let Ok(Some(ended)) = executor.inner.runs.get(&id)
                && let (Some(started), Some(finished)) = (ended.started_at, ended.finished_at)
            {
                let seconds = (finished.0 - started.0) as f64 / 1000.0;
                executor.inner.sharing.record_run_time(&ended.owner, seconds, finished);
            }
            // Its driving ended: watchers of the active runs see it gone.
            executor.changed(&id);
            executor.inner.wake.notify_one();
        });
        Ok(())
    }

    /// Claims warm instances for the run's model instances that have one.
    pub(super) fn claim_warm(&self, run: &RunRecord) -> Vec<String> {
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

    pub(super) fn dequeue(&self, id: &str) {
        lock(&self.inner.queue).retain(|(_, q)| q != id);
    }
    /// The run's plan on the live graph, with the catalogs it was made with.
    pub(super) async fn plan(
        &self,
        run: &RunRecord,
        warm: &[String],
    ) -> Result<(Plan, Arc<BTreeMap<String, ModelInfo>>), String> {
        self.plan_workflow(&run.id, &run.workflow, warm, &Pin::Anywhere).await
    }

    /// A plan of `workflow` on the live graph (restricted by `placement`), with the
    /// catalogs it was made with (read once per `cache_key` while it is queued).
    pub(super) async fn plan_workflow(
        &self,
        cache_key: &str,
        workflow: &Workflow,
        warm: &[String],
        placement: &Pin,
    ) -> Result<(Plan, Arc<BTreeMap<String, ModelInfo>>), String> {
        self.plan_among(cache_key, workflow, warm, placement, Vec::new()).await
    }

    /// [`plan_workflow`](Self::plan_workflow), allowed to preempt lower-priority
    /// instances among `running` when there are any.
    pub(super) async fn plan_among(
        &self,
        cache_key: &str,
        workflow: &Workflow,
        warm: &[String],
        placement: &Pin,
        running: Vec<crate::plan::RunningInstance>,
    ) -> Result<(Plan, Arc<BTreeMap<String, ModelInfo>>), String> {
        let cached = lock(&self.inner.catalogs).get(cache_key).cloned();
        let catalogs = match cached {
            Some(catalogs) => catalogs,
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
                lock(&self.inner.catalogs).insert(cache_key.to_owned(), read.clone());
                read
            }
        };
        let models = Arc::clone(&catalogs.models);
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
        let plan = tokio::task::spawn_blocking(move || {
            let input = PlanInput {
                workflow: &workflow,
                models: &catalogs.models,
                adapters: &catalogs.adapters,
                graph: &snapshot,
                running: &running,
                settings: PlanSettings {
                    allow_preemption: !running.is_empty(),
                    ..PlanSettings::default()
                },
            };
            Planner::plan_shared(&planner, &input).map_err(|e| e.to_string())
        })
        .await
        .map_err(|e| format!("the planner failed: {e}"))??;
        Ok((plan, models))
    }
}
