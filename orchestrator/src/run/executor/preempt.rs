//! Preemption by the executor (with `ExecutorConfig::preempt`): a queued run that fits
//! only by taking lower-priority runs' GPUs sends those runs back to the queue (their
//! instances stop, their steps in progress start again when they are admitted again)
//! and starts once the GPUs are free. The planner chooses the victims: lowest priority,
//! then the owner furthest over their fair share, then the largest (docs/placement.md).

use std::cmp::Reverse;
use std::collections::BTreeSet;

use super::Executor;
use super::provide::Pin;
use crate::base::lock;
use crate::run::record::{RunRecord, RunState};
use crate::sharing::GpuUse;
use crate::store::StoreError;

/// What a driven run is told besides its engines' answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Halt {
    /// Go on.
    Run,
    /// A user cancelled it.
    Cancel,
    /// A higher-priority run takes its GPUs: back to the queue.
    Preempt(Preemptor),
}

/// The run that preempts another.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Preemptor {
    /// Its id.
    pub run: String,
    /// Its priority.
    pub priority: i32,
}

impl Executor {
    /// When `run` fits by preempting lower-priority runs, and its owner's GPU limits
    /// allow it: tells each of those runs to go back to the queue, and says so (the
    /// reason `run` waits). `None` when preempting would not let it in.
    pub(super) async fn preempt_for(&self, run: &RunRecord) -> Option<String> {
        let priority = run.workflow.placement.priority;
        let running = self.running_instances().ok()?;
        if !running.iter().any(|r| r.priority < priority) {
            return None;
        }
        let (plan, _) = self
            .plan_among(&run.id, &run.workflow, &[], &Pin::Anywhere, running)
            .await
            .ok()?;
        if !plan.admitted || plan.preempted.is_empty() {
            return None;
        }
        let adding = GpuUse::of_plan(&plan);
        self.inner
            .sharing
            .check_gpus(&run.id, &adding, &self.inner.instances.list())
            .ok()?;
        let victims: BTreeSet<&str> = plan.preempted.iter().map(|p| p.workflow.as_str()).collect();
        let by = Preemptor {
            run: run.id.clone(),
            priority,
        };
        for victim in &victims {
            let signals = lock(&self.inner.active).get(*victim).cloned();
            if let Some(signals) = signals {
                tracing::info!(run = %victim, by = %run.id, "preempting a lower-priority run");
                signals.cancel.send_if_modified(|halt| {
                    let idle = matches!(halt, Halt::Run);
                    if idle {
                        *halt = Halt::Preempt(by.clone());
                    }
                    idle
                });
            }
        }
        let names: Vec<&str> = victims.into_iter().collect();
        Some(format!(
            "preempting lower-priority run{} {}; starts once their instances stopped",
            if names.len() == 1 { "" } else { "s" },
            names.join(", ")
        ))
    }

    /// Ends a preempted run's driving: its instances stop, its steps in progress will
    /// start again, and it is queued again with the reason (the task that drove it
    /// puts it back in the queue, [`requeue_preempted`](Self::requeue_preempted)).
    pub(super) async fn finish_preempted(
        &self,
        mut run: RunRecord,
        by: Preemptor,
        names: &[String],
    ) -> Result<(), StoreError> {
        tracing::info!(run = %run.id, by = %by.run, "run preempted; its instances stop");
        self.stop_instances(names);
        run.recover();
        run.state = RunState::Queued;
        run.reason = Some(format!(
            "preempted by run {} (priority {}); waits to be admitted again",
            by.run, by.priority
        ));
        run.preempted_by.push(by.run);
        self.save(&mut run).await
    }

    /// Puts run `id` back in the queue when its driving ended with it queued (it was
    /// preempted), counted against its owner's runs as a submitted one.
    pub(super) fn requeue_preempted(&self, id: &str) {
        if let Ok(Some(run)) = self.inner.runs.get(id)
            && run.state == RunState::Queued
        {
            self.inner.sharing.resume_run(&run.owner, &run.id);
            lock(&self.inner.queue).insert((Reverse(run.workflow.placement.priority), run.id.clone()));
        }
    }
}
