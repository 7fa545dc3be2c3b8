//! A run's actor: takes its decisions in order, carries out their actions (or says
//! what they would do, in a dry run) and records each decision with its outcomes.

use skein_dsl::ir::{Action, Reflex, Scope};
use tokio::sync::mpsc;

use crate::base::{UnixMs, lock};
use crate::instances::InstanceView;
use crate::reflex::{ActionRecord, Decision, DecisionKind, EventKind, EventRecord, Outcome};

use super::{Actor, Done, Job, describe, scope_instances, undoable};

impl Actor {
    /// Takes the jobs in order until the queue closes (the run ended), then undoes what
    /// the run's reflexes added. When the server stops it ends between jobs and undoes
    /// nothing: the run resumes at the next start.
    pub(super) async fn serve(mut self, mut jobs: mpsc::Receiver<Job>) {
        let shutdown = self.inner.lifecycle.shutdown.clone();
        loop {
            let job = tokio::select! {
                biased;
                () = shutdown.cancelled() => return,
                job = jobs.recv() => job,
            };
            let Some(job) = job else { break };
            match job {
                Job::Decide(decision, sampled_at) => {
                    let mut event = self.decide(decision).await;
                    event.sampled_at = sampled_at.map(UnixMs);
                    self.record(event).await;
                }
                Job::Record(event) => self.record(event).await,
            }
        }
        let reflexes: Vec<String> = self.applied.keys().cloned().collect();
        for reflex in reflexes {
            let undone = self.undo(&reflex, &[]).await;
            for record in undone {
                tracing::info!(run = %self.run, %reflex, detail = %record.detail, "the run ended: undone");
            }
        }
    }

    pub(super) async fn record(&self, event: EventRecord) {
        if let Err(error) = self.inner.events.record(event).await {
            tracing::error!(run = %self.run, %error, "a reflex event was not recorded");
        }
    }

    pub(super) async fn decide(&mut self, decision: Decision) -> EventRecord {
        let reflex = lock(&self.inner.engine).reflex(decision.id).cloned();
        let mut event = EventRecord {
            id: String::new(),
            at: UnixMs(decision.at_ms),
            sampled_at: None,
            run: decision.run.clone(),
            owner: self.owner.clone(),
            reflex: decision.reflex.clone(),
            kind: EventKind::Fire,
            values: decision.values.clone(),
            actions: Vec::new(),
            error: None,
            dry_run: decision.dry_run,
        };
        let Some(reflex) = reflex else {
            event.kind = EventKind::Error;
            event.error = Some("the reflex was removed before it could act (its run ended)".to_owned());
            return event;
        };
        match decision.kind {
            DecisionKind::Error(error) => {
                event.kind = EventKind::Error;
                event.error = Some(error);
            }
            DecisionKind::Fire => {
                for action in &decision.actions {
                    let (outcome, detail) = if decision.dry_run {
                        (Outcome::WouldDo, describe(action, &reflex))
                    } else {
                        self.act(decision.id, &reflex, action).await
                    };
                    tracing::info!(run = %self.run, reflex = %reflex.name, ?outcome, %detail, "reflex action");
                    event.actions.push(ActionRecord {
                        action: action.clone(),
                        outcome,
                        detail,
                    });
                }
            }
            DecisionKind::Release => {
                event.kind = EventKind::Release;
                event.actions = if decision.dry_run {
                    undoable(&reflex.actions)
                        .map(|action| ActionRecord {
                            action: action.clone(),
                            outcome: Outcome::WouldDo,
                            detail: format!("would undo: {}", describe(action, &reflex)),
                        })
                        .collect()
                } else {
                    self.undo(&reflex.name, &reflex.actions).await
                };
            }
        }
        event
    }

    /// The agent a reflex's replica actions act on: its scope's agent, or the first
    /// agent its instance serves.
    pub(super) fn agent_of(&self, reflex: &Reflex) -> Option<String> {
        match &reflex.scope {
            Scope::Agent(agent) => Some(agent.clone()),
            scope @ Scope::Instance(_) => scope_instances(&self.inner.instances, &self.inner.graph, &self.run, scope)
                .first()
                .and_then(|v| v.agents.first().cloned()),
            Scope::Node(_) | Scope::Zone(_) => None,
        }
    }

    /// The ready replicas of `agent` in this run, split into those that existed before
    /// any reflex added some, and the added ones.
    pub(super) fn replicas(&self, agent: &str) -> (Vec<InstanceView>, Vec<InstanceView>) {
        scope_instances(
            &self.inner.instances,
            &self.inner.graph,
            &self.run,
            &Scope::Agent(agent.to_owned()),
        )
        .into_iter()
        .partition(|v| v.clone_of.is_none())
    }

    /// Sets an instance's share, remembering the first value this reflex changed.
    pub(super) fn share(&mut self, reflex: &str, view: &InstanceView, share: f64) {
        self.applied
            .entry(reflex.to_owned())
            .or_default()
            .shares
            .entry(view.name.clone())
            .or_insert(view.share);
        self.inner.instances.set_share(&view.name, share);
    }

    pub(super) async fn act(&mut self, id: crate::reflex::ReflexId, reflex: &Reflex, action: &Action) -> Done {
        let needs_agent = || {
            (
                Outcome::Skipped,
                "this action needs a reflex scoped to an agent or an instance".to_owned(),
            )
        };
        match action {
            Action::Notify { message } => (Outcome::Done, message.clone().unwrap_or_else(|| "notified".to_owned())),
            Action::Clone { count } => match self.agent_of(reflex) {
                Some(agent) => self.clone_replicas(reflex, &agent, *count).await,
                None => needs_agent(),
            },
            Action::Reroute(reroute) => match self.agent_of(reflex) {
                Some(agent) => self.reroute(reflex, &agent, reroute),
                None => needs_agent(),
            },
            Action::Decay { target, capacity } => match self.agent_of(reflex) {
                Some(agent) => self.decay(reflex, &agent, *target, *capacity).await,
                None => needs_agent(),
            },
            Action::Migrate { sessions, to } => self.migrate(id, reflex, *sessions, to).await,
            Action::Drain => self.drain(reflex).await,
        }
    }
}
