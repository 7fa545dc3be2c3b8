//! Instances without runs: [`Executor::provide`] finds or starts the instance a session
//! or an OpenAI-compatible request needs, [`Executor::add_replica`] one more replica for a
//! reflex; [`Pin`] says where they may be placed.

use std::collections::BTreeMap;
use std::sync::Arc;

use skein_dsl::Workflow;
use skein_dsl::ir::{Agent, Backend};

use super::Executor;
use super::bring_up::Readiness;
use super::reuse::{ContextWanted, serves, warm_key};
use crate::base::{lock, new_id};
use crate::instances::{InstanceState, InstanceView};

impl Executor {
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
            tool_servers: BTreeMap::new(),
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
    pub(super) async fn await_ready(&self, workflow: &Workflow, names: &[String]) -> Result<(), ProvideError> {
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
    pub(super) fn on_drained(&self, view: &InstanceView) -> bool {
        let snapshot = self.inner.graph.snapshot();
        snapshot.gpus().any(|(n, g)| {
            n.inventory.name == view.node_name && view.gpus.contains(&g.facts.index) && g.drained.is_some()
        })
    }
}

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
    pub(super) fn missing(&self, snapshot: &crate::graph::GraphSnapshot) -> Option<String> {
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
    pub(super) fn restrict(&self, snapshot: crate::graph::GraphSnapshot) -> crate::graph::GraphSnapshot {
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
