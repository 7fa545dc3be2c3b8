//! Bringing up a run's instances: the start commands a plan becomes, and where a group
//! of instances stands (ready with their routes, waiting, failed, or lost).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use skein_dsl::Workflow;
use skein_dsl::ir::Backend;
use skein_model_registry::catalog::ModelInfo;

use super::Executor;
use super::reuse::{waiting_for, warm_key};
use crate::engine_client::Route;
use crate::graph::NodeId;
use crate::instances::{InstanceRequest, InstanceState, InstanceView};
use crate::plan::Plan;
use crate::run::launch;
use crate::run::record::RunRecord;

impl Executor {
    pub(super) fn stop_instances(&self, names: &[String]) {
        for name in names {
            if let Err(error) = self.inner.instances.stop(name) {
                tracing::debug!(instance = %name, %error, "stop not delivered");
            }
        }
    }

    /// Sends a start for every placed replica of the run (named `{run}-{instance}`, or
    /// `{run}-{n}-{instance}` when placed again for the `n`th time); returns their names.
    pub(super) fn start_instances(
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
    pub(super) fn start_planned(
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
                Some(split) => crate::run::split::start(
                    &self.lifecycle(),
                    &self.inner.instances,
                    request,
                    split,
                    node_id.clone(),
                ),
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
    pub(super) fn readiness(&self, workflow: &Workflow, names: &[String]) -> Readiness {
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
                (InstanceState::Ready, Some(_)) => {
                    for agent in &view.agents {
                        match Route::for_agent(&view, workflow.agents.get(agent)) {
                            Ok(Some(route)) => {
                                routes.insert(agent.clone(), route);
                            }
                            Ok(None) => {}
                            Err(why) => return Readiness::Failed(format!("agent `{agent}`: {why}")),
                        }
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
}

/// Remote endpoints, keyed by agent: called directly (their keys are read from the
/// owner's secrets at each call).
pub(super) fn remote_routes(workflow: &Workflow) -> BTreeMap<String, Route> {
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
                    lora: Vec::new(),
                },
            )),
            Backend::Model(_) => None,
        })
        .collect()
}

/// Where a group of instances stands.
pub(super) enum Readiness {
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
pub(super) struct Lost {
    /// Its name.
    pub(super) instance: String,
    /// What happened.
    pub(super) why: String,
    /// Where a piece failed on a node still up, which the new placement avoids:
    /// `(node name, GPUs)`.
    pub(super) avoid: Option<(String, Vec<u32>)>,
}

impl Lost {
    /// Whether `view` (of `name`; `None`: gone) must be placed again.
    pub(super) fn of(name: &str, view: Option<&InstanceView>) -> Option<Lost> {
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
