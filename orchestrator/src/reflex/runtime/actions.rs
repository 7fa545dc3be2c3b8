//! The actions a fired reflex takes: clone, reroute, decay, migrate, drain.

use skein_dsl::ir::{DecayTarget, MigrateTarget, Reflex, Reroute, Scope, SessionCount};

use crate::base::lock;
use crate::graph::NodeId;
use crate::instances::InstanceView;
use crate::reflex::{GpuKey, Outcome};
use crate::run::executor::{Pin, ProvideError};
use crate::session::MoveTo;

use super::{Actor, Done, Moved, place, reflex_principal, scope_instances, scope_nodes, target_name};

impl Actor {
    /// Starts one more replica of `agent` off `avoid` for `reflex`, remembered so that
    /// its release scales it in.
    ///
    /// Errors: the replica could not be placed or did not start ([`ProvideError`]).
    pub(super) async fn start_replica(
        &mut self,
        reflex: &Reflex,
        agent: &str,
        avoid: &Pin,
    ) -> Result<InstanceView, ProvideError> {
        let replica = self
            .inner
            .executor
            .add_replica(&self.run, agent, &reflex.name, avoid)
            .await?;
        self.applied
            .entry(reflex.name.clone())
            .or_default()
            .clones
            .push(replica.name.clone());
        Ok(replica)
    }

    pub(super) async fn clone_replicas(&mut self, reflex: &Reflex, agent: &str, count: u32) -> Done {
        let (originals, clones) = self.replicas(agent);
        let have = (originals.len() + clones.len()) as u32;
        let room = reflex
            .max_replicas
            .map_or(count, |max| max.saturating_sub(have).min(count));
        if room == 0 {
            return (
                Outcome::Skipped,
                format!("`{agent}` has {have} replicas, its max_replicas; none added"),
            );
        }
        // Off the GPUs the agent already runs on: a replica on a hot GPU would not help.
        let mut places: Vec<(String, Vec<u32>)> = originals
            .iter()
            .chain(&clones)
            .filter(|v| !v.gpus.is_empty())
            .map(|v| (v.node_name.clone(), v.gpus.clone()))
            .collect();
        let mut started = Vec::new();
        let mut failed = Vec::new();
        for _ in 0..room {
            let avoid = Pin::Avoid { places: places.clone() };
            match self.start_replica(reflex, agent, &avoid).await {
                Ok(view) => {
                    if !view.gpus.is_empty() {
                        places.push((view.node_name.clone(), view.gpus.clone()));
                    }
                    started.push(format!("{} on {}", view.name, place(&view)));
                }
                Err(error) => failed.push(error.to_string()),
            }
        }
        match (started.is_empty(), failed.is_empty()) {
            (false, true) => (Outcome::Done, format!("started {}", started.join(", "))),
            (false, false) => (
                Outcome::Done,
                format!(
                    "started {}; {} more failed: {}",
                    started.join(", "),
                    failed.len(),
                    failed.join("; ")
                ),
            ),
            _ => (Outcome::Failed, failed.join("; ")),
        }
    }

    pub(super) fn reroute(&mut self, reflex: &Reflex, agent: &str, reroute: &Reroute) -> Done {
        let (originals, clones) = self.replicas(agent);
        let (original_share, clone_share) = match reroute {
            Reroute::New | Reroute::Weights(_) if clones.is_empty() => {
                return (
                    Outcome::Skipped,
                    format!("`{agent}` has no added replica; every replica keeps its share"),
                );
            }
            Reroute::New => (0.0, 1.0),
            Reroute::All => (1.0, 1.0),
            Reroute::Weights(weights) => (
                weights.get("original").copied().unwrap_or(1.0),
                weights.get("clones").copied().unwrap_or(1.0),
            ),
        };
        let mut said = Vec::new();
        for (views, share) in [(&originals, original_share), (&clones, clone_share)] {
            for view in views {
                self.share(&reflex.name, view, share);
                said.push(format!("{} {share}", view.name));
            }
        }
        (
            Outcome::Done,
            format!("shares of new sessions and requests: {}", said.join(", ")),
        )
    }

    pub(super) async fn decay(&mut self, reflex: &Reflex, agent: &str, target: DecayTarget, capacity: f64) -> Done {
        let (originals, clones) = self.replicas(agent);
        let (shrink, others) = match target {
            DecayTarget::Original => (originals, clones),
            DecayTarget::Clones => (clones, originals),
        };
        if shrink.is_empty() {
            return (
                Outcome::Skipped,
                format!("`{agent}` has no {} replica", target_name(target)),
            );
        }
        let mut said = Vec::new();
        for view in &shrink {
            // The share it had before this reflex touched it, times the capacity.
            let base = self
                .applied
                .get(&reflex.name)
                .and_then(|a| a.shares.get(&view.name).copied())
                .unwrap_or(view.share);
            let now = self.inner.instances.get(&view.name).map_or(base, |v| v.share);
            let share = now.min(base) * capacity;
            self.share(&reflex.name, view, share);
            said.push(format!("{} share {now} → {share}", view.name));
        }
        // Its sessions shrink to the capacity too: the rest move to the other replicas.
        let names: Vec<String> = shrink.iter().map(|v| v.name.clone()).collect();
        let bound = match self.inner.sessions.bound_to(&names) {
            Ok(bound) => bound,
            Err(error) => {
                return (
                    Outcome::Failed,
                    format!("{}; sessions not read: {error}", said.join(", ")),
                );
            }
        };
        let moving = ((1.0 - capacity) * bound.len() as f64).floor() as usize;
        if moving == 0 || others.is_empty() {
            let why = if others.is_empty() {
                "; no other replica to move sessions to"
            } else {
                ""
            };
            return (Outcome::Done, format!("{}{why}", said.join(", ")));
        }
        let targets: Vec<String> = others.iter().map(|v| v.name.clone()).collect();
        let moved = self.move_sessions(bound.iter().rev().take(moving).map(|s| s.id.clone()), |i| {
            MoveTo::Instance(targets[i % targets.len()].clone())
        });
        let moved = moved.await;
        (moved.outcome(), format!("{}; {}", said.join(", "), moved.say()))
    }

    pub(super) async fn migrate(
        &mut self,
        id: crate::reflex::ReflexId,
        reflex: &Reflex,
        count: SessionCount,
        to: &MigrateTarget,
    ) -> Done {
        let mut views = scope_instances(&self.inner.instances, &self.inner.graph, &self.run, &reflex.scope);
        if views.is_empty() {
            return (Outcome::Skipped, "no instance runs in the scope".to_owned());
        }
        // Off the GPUs where the condition holds first (the hot or failing ones), then
        // the busiest.
        let holding = lock(&self.inner.engine).holding(id);
        let snapshot = self.inner.graph.snapshot();
        let rank = |v: &InstanceView| -> (bool, u32) {
            let held = v
                .gpus
                .iter()
                .any(|&g| holding.contains(&GpuKey::new(v.node.clone(), g)));
            let busy = snapshot
                .gpus()
                .filter(|(n, g)| n.inventory.name == v.node_name && v.gpus.contains(&g.facts.index))
                .filter_map(|(_, g)| g.latest.and_then(|s| s.utilization_pct))
                .max()
                .unwrap_or(0);
            (held, busy)
        };
        views.sort_by_key(|v| std::cmp::Reverse(rank(v)));
        let mut sessions = Vec::new();
        for view in &views {
            match self.inner.sessions.bound_to(std::slice::from_ref(&view.name)) {
                Ok(bound) => sessions.extend(bound.into_iter().map(|s| s.id)),
                Err(error) => return (Outcome::Failed, format!("sessions not read: {error}")),
            }
        }
        let limit = match count {
            SessionCount::All => sessions.len(),
            SessionCount::Count(n) => n as usize,
        };
        let sessions: Vec<String> = sessions.into_iter().take(limit).collect();
        let mut said = Vec::new();
        let to = match to {
            MigrateTarget::Gpu { node, gpu } => MoveTo::Gpu {
                node: node.clone(),
                gpu: *gpu,
            },
            // An agent's sessions stay with the run: on a replica off the GPUs they
            // leave, started for the reflex (and scaled in at its release) if there is
            // none.
            MigrateTarget::Auto if !sessions.is_empty() => match self.agent_of(reflex) {
                Some(agent) => {
                    let leaving: Vec<&InstanceView> = views.iter().filter(|v| rank(v).0).collect();
                    let leaving = if leaving.is_empty() {
                        views.iter().take(1).collect()
                    } else {
                        leaving
                    };
                    let places: Vec<(String, Vec<u32>)> =
                        leaving.iter().map(|v| (v.node_name.clone(), v.gpus.clone())).collect();
                    let avoid = Pin::Avoid { places };
                    let (originals, clones) = self.replicas(&agent);
                    let elsewhere = originals
                        .into_iter()
                        .chain(clones)
                        .find(|v| v.state == crate::instances::InstanceState::Ready && avoid.admits(v));
                    match elsewhere {
                        Some(replica) => MoveTo::Instance(replica.name),
                        None => match self.start_replica(reflex, &agent, &avoid).await {
                            Ok(replica) => {
                                said.push(format!("started {} on {}", replica.name, place(&replica)));
                                MoveTo::Instance(replica.name)
                            }
                            Err(error) => {
                                return (
                                    Outcome::Failed,
                                    format!("no replica of `{agent}` could start elsewhere: {error}"),
                                );
                            }
                        },
                    }
                }
                None => MoveTo::Auto,
            },
            MigrateTarget::Auto => MoveTo::Auto,
        };
        let moved = self.move_sessions(sessions.into_iter(), |_| to.clone()).await;
        said.push(moved.say());
        (moved.outcome(), said.join("; "))
    }

    pub(super) async fn drain(&mut self, reflex: &Reflex) -> Done {
        let snapshot = self.inner.graph.snapshot();
        let gpus: Vec<(NodeId, String, u32)> = match &reflex.scope {
            scope @ (Scope::Node(_) | Scope::Zone(_)) => scope_nodes(&snapshot, scope)
                .iter()
                .flat_map(|n| {
                    n.gpus
                        .iter()
                        .map(|g| (n.id.clone(), n.inventory.name.clone(), g.facts.index))
                })
                .collect(),
            scope => scope_instances(&self.inner.instances, &self.inner.graph, &self.run, scope)
                .iter()
                .flat_map(|v| v.gpus.iter().map(|&g| (NodeId(v.node.clone()), v.node_name.clone(), g)))
                .collect(),
        };
        if gpus.is_empty() {
            return (Outcome::Skipped, "the scope has no GPU to drain".to_owned());
        }
        let reason = format!("reflex `{}` of run {}", reflex.name, self.run);
        let mut drained = Vec::new();
        for (node, name, gpu) in &gpus {
            match self.inner.graph.set_drained(node, *gpu, Some(reason.clone())) {
                Ok(_) => {
                    drained.push(format!("{name} GPU {gpu}"));
                    let key = GpuKey::new(node.0.clone(), *gpu);
                    let applied = self.applied.entry(reflex.name.clone()).or_default();
                    if !applied.drained.contains(&key) {
                        applied.drained.push(key);
                    }
                }
                Err(error) => return (Outcome::Failed, error.to_string()),
            }
        }
        let on = |v: &InstanceView| gpus.iter().any(|(_, n, g)| v.node_name == *n && v.gpus.contains(g));
        let affected = self.inner.instances.filter(|v| on(v) && !v.state.is_gone());
        let mut said = vec![format!("drained {}", drained.join(", "))];
        for view in &affected {
            self.share(&reflex.name, view, 0.0);
        }
        // This run's agents keep a replica off the drained GPUs.
        let mut replaced: Vec<String> = Vec::new();
        let run = self.run.clone();
        for view in affected.iter().filter(|v| v.run.as_deref() == Some(run.as_str())) {
            let Some(agent) = view.agents.first() else { continue };
            let elsewhere = scope_instances(
                &self.inner.instances,
                &self.inner.graph,
                &self.run,
                &Scope::Agent(agent.clone()),
            )
            .iter()
            .any(|v| !on(v));
            if elsewhere || replaced.contains(agent) {
                continue;
            }
            match self.start_replica(reflex, agent, &Pin::Anywhere).await {
                Ok(replica) => {
                    said.push(format!("started {} on {} for `{agent}`", replica.name, place(&replica)));
                    replaced.push(agent.clone());
                }
                Err(error) => said.push(format!("no replica of `{agent}` could start elsewhere: {error}")),
            }
        }
        let names: Vec<String> = affected.iter().map(|v| v.name.clone()).collect();
        let bound = match self.inner.sessions.bound_to(&names) {
            Ok(bound) => bound,
            Err(error) => {
                return (
                    Outcome::Failed,
                    format!("{}; sessions not read: {error}", said.join("; ")),
                );
            }
        };
        let moved = self
            .move_sessions(bound.into_iter().map(|s| s.id), |_| MoveTo::Auto)
            .await;
        said.push(moved.say());
        (moved.outcome(), said.join("; "))
    }

    /// Moves `sessions`, the i-th to `to(i)`, one after the other.
    pub(super) async fn move_sessions(
        &self,
        sessions: impl Iterator<Item = String>,
        to: impl Fn(usize) -> MoveTo,
    ) -> Moved {
        let principal = reflex_principal();
        let mut moved = Moved::default();
        for (i, id) in sessions.enumerate() {
            match self.inner.sessions.migrate(&principal, &id, to(i)).await {
                Ok(migration) => moved.done.push(format!("{id} → {}", migration.to.instance)),
                Err(error) => moved.failed.push(format!("{id}: {error}")),
            }
        }
        moved
    }
}
