//! Undoing what a reflex added when it is released or its run ends.

use skein_dsl::ir::Action;

use crate::graph::NodeId;
use crate::reflex::{ActionRecord, Outcome};
use crate::session::MoveTo;

use super::Actor;

impl Actor {
    /// Undoes what reflex `name` added (released, or its run ended): its replicas are
    /// scaled in after their sessions move to the others, shares come back, drains are
    /// lifted. `declared` are its actions, to say what each undo answers.
    pub(super) async fn undo(&mut self, name: &str, declared: &[Action]) -> Vec<ActionRecord> {
        let Some(applied) = self.applied.remove(name) else {
            return Vec::new();
        };
        let find = |wanted: fn(&Action) -> bool| declared.iter().find(|a| wanted(a)).cloned();
        let mut records = Vec::new();
        if !applied.clones.is_empty() {
            let mut said = Vec::new();
            let mut outcome = Outcome::Done;
            for clone in &applied.clones {
                self.inner.instances.set_share(clone, 0.0);
                let stays: Vec<String> = match self.inner.instances.get(clone) {
                    Some(view) => view
                        .agents
                        .iter()
                        .flat_map(|agent| {
                            let (originals, clones) = self.replicas(agent);
                            originals.into_iter().chain(clones)
                        })
                        .filter(|v| !applied.clones.contains(&v.name))
                        .map(|v| v.name)
                        .collect(),
                    None => Vec::new(),
                };
                let moved = if stays.is_empty() {
                    // No replica stays (the run ended): its sessions are placed again at
                    // their next turn.
                    "its sessions are placed again at their next turn".to_owned()
                } else {
                    let bound = self
                        .inner
                        .sessions
                        .bound_to(std::slice::from_ref(clone))
                        .unwrap_or_default();
                    let moved = self
                        .move_sessions(bound.into_iter().map(|s| s.id), |i| {
                            MoveTo::Instance(stays[i % stays.len()].clone())
                        })
                        .await;
                    if moved.outcome() == Outcome::Failed {
                        outcome = Outcome::Failed;
                    }
                    moved.say()
                };
                let _ = self.inner.instances.stop(clone);
                said.push(format!("scaled in {clone} ({moved})"));
            }
            let action = find(|a| matches!(a, Action::Clone { .. } | Action::Drain)).unwrap_or(Action::Clone {
                count: applied.clones.len() as u32,
            });
            records.push(ActionRecord {
                action,
                outcome,
                detail: said.join("; "),
            });
        }
        if !applied.shares.is_empty() {
            let mut said = Vec::new();
            for (instance, share) in &applied.shares {
                if !applied.clones.contains(instance) && self.inner.instances.set_share(instance, *share) {
                    said.push(format!("{instance} {share}"));
                }
            }
            if let Some(action) = find(|a| matches!(a, Action::Decay { .. } | Action::Reroute(_) | Action::Drain))
                && !said.is_empty()
            {
                records.push(ActionRecord {
                    action,
                    outcome: Outcome::Done,
                    detail: format!("shares restored: {}", said.join(", ")),
                });
            }
        }
        if !applied.drained.is_empty() {
            let mut lifted = Vec::new();
            for key in &applied.drained {
                if self
                    .inner
                    .graph
                    .set_drained(&NodeId(key.node.clone()), key.index, None)
                    .unwrap_or(false)
                {
                    // By the node's name, as the drain said it.
                    let name = self
                        .inner
                        .graph
                        .node(&NodeId(key.node.clone()))
                        .map_or_else(|| key.node.clone(), |n| n.inventory.name.clone());
                    lifted.push(format!("{name} GPU {}", key.index));
                }
            }
            records.push(ActionRecord {
                action: Action::Drain,
                outcome: Outcome::Done,
                detail: format!("drain lifted on {}", lifted.join(", ")),
            });
        }
        records
    }
}
