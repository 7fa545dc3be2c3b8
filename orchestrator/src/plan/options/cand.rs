//! Candidates: one placement of a replica with its estimate and score, and the lazy,
//! best-first merge of the sorted lists kept per node state.

use std::collections::BinaryHeap;
use std::sync::{Arc, Mutex};

use skein_dsl::ir::Precision;
use skein_model_registry::estimate::Estimate;

use crate::plan::score::ScoreParts;

/// A device of a placement: a GPU (its position on the node) or the node's host.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Dev {
    /// Node position in the fleet.
    pub node: usize,
    /// GPU position on the node; `None` for the host CPU and RAM.
    pub gpu: Option<usize>,
}

/// How a candidate places the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Family {
    /// One GPU.
    Single,
    /// Tensor parallelism within a node.
    TensorParallel,
    /// A layer split over GPUs of one node.
    NodeSplit,
    /// A split over GPUs of several nodes.
    CrossNode,
    /// Layers split between GPUs and host RAM.
    Offload,
    /// The host CPU alone.
    Cpu,
}

impl Family {
    /// How a plan names the family, and where its measured speeds are kept.
    pub const fn name(self) -> &'static str {
        match self {
            Family::Single => "one GPU",
            Family::TensorParallel => "tensor parallel",
            Family::NodeSplit => "layer split on one node",
            Family::CrossNode => "split across nodes",
            Family::Offload => "GPU + host RAM offload",
            Family::Cpu => "CPU",
        }
    }
}

/// How a placement is named where its measured speed is kept: its family and its number
/// of devices (`CPU ×1`, `tensor parallel ×2`).
pub fn speed_placement(family: &str, devices: usize) -> String {
    format!("{family} ×{devices}")
}

/// One candidate placement.
#[derive(Debug, Clone)]
pub struct Cand {
    /// Position of the variant in the model's catalog.
    pub variant: usize,
    /// Its tier.
    pub tier: Precision,
    /// The family.
    pub family: Family,
    /// The estimate (engine, layout, per-device lines).
    pub estimate: Arc<Estimate>,
    /// Devices in layout order.
    pub devices: Vec<Dev>,
    /// Bytes reserved on each device: its estimate plus the fit margin.
    pub reserve: Vec<u64>,
    /// Host RAM the engine needs beside its devices (llama.cpp keeps the token embedding
    /// there), on the serving node ([`Cand::host_node`]).
    pub host_extra: u64,
    /// Qualities.
    pub parts: ScoreParts,
    /// Score under the instance's preference.
    pub score: i64,
}

impl Cand {
    /// The node whose host RAM takes [`Cand::host_extra`]: the serving engine's. llama.cpp
    /// split across nodes serves from the node of its last stage (the RPC servers'
    /// devices come first in its order); every other engine from its first device's.
    pub fn host_node(&self) -> Option<usize> {
        let serving = if self.family == Family::CrossNode && self.estimate.engine.serves_from_last_stage() {
            self.devices.last()
        } else {
            self.devices.first()
        };
        serving.map(|d| d.node)
    }

    /// The deterministic tie-break: variant, then devices.
    pub fn key(&self) -> (usize, &[Dev]) {
        (self.variant, &self.devices)
    }

    fn on_node(&self, node: usize) -> Cand {
        let mut c = self.clone();
        for d in &mut c.devices {
            d.node = node;
        }
        c
    }
}

/// Sorts best first: score, then [`Cand::key`].
pub fn sort_cands(cands: &mut [Cand]) {
    cands.sort_by(|a, b| b.score.cmp(&a.score).then_with(|| a.key().cmp(&b.key())));
}

/// Candidates best first (as [`sort_cands`] orders them), merged lazily from sorted
/// lists: each node state's list stands for its representative node, and a search or a
/// reason reads the first few of the thousands a large fleet has, so only those are
/// made.
pub struct CandList {
    merge: Mutex<Merge>,
}

struct Merge {
    /// The candidates merged so far.
    done: Vec<Cand>,
    /// The next candidate of each list not yet exhausted.
    heads: BinaryHeap<Head>,
}

/// A list being merged: its next candidate, moved to `node` if given.
struct Head {
    list: Arc<Vec<Cand>>,
    pos: usize,
    node: Option<usize>,
    /// The list's position among those merged: equal candidates keep that order.
    source: usize,
}

impl Head {
    fn cand(&self) -> &Cand {
        &self.list[self.pos]
    }

    fn devices(&self) -> impl Iterator<Item = Dev> + '_ {
        let node = self.node;
        self.cand().devices.iter().map(move |d| Dev {
            node: node.unwrap_or(d.node),
            gpu: d.gpu,
        })
    }
}

impl Ord for Head {
    /// Greater is merged first: higher score, then the smaller [`Cand::key`] (with the
    /// devices moved), then the earlier list.
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        let (a, b) = (self.cand(), other.cand());
        a.score
            .cmp(&b.score)
            .then_with(|| b.variant.cmp(&a.variant))
            .then_with(|| other.devices().cmp(self.devices()))
            .then_with(|| other.source.cmp(&self.source))
    }
}

impl PartialOrd for Head {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for Head {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == std::cmp::Ordering::Equal
    }
}

impl Eq for Head {}

impl CandList {
    /// A list already in order.
    pub fn sorted(mut cands: Vec<Cand>) -> CandList {
        sort_cands(&mut cands);
        CandList {
            merge: Mutex::new(Merge {
                done: cands,
                heads: BinaryHeap::new(),
            }),
        }
    }

    /// The merge of `lists`, each sorted, its candidates moved to the node given with it.
    pub fn merge(lists: Vec<(Arc<Vec<Cand>>, Option<usize>)>) -> CandList {
        let heads = lists
            .into_iter()
            .enumerate()
            .filter(|(_, (list, _))| !list.is_empty())
            .map(|(source, (list, node))| Head {
                list,
                pos: 0,
                node,
                source,
            })
            .collect();
        CandList {
            merge: Mutex::new(Merge {
                done: Vec::new(),
                heads,
            }),
        }
    }

    /// The `i`-th best candidate.
    pub fn get(&self, i: usize) -> Option<Cand> {
        // Merging only appends: a panic in another reader leaves a usable list.
        let mut m = self.merge.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        while m.done.len() <= i {
            let Some(mut head) = m.heads.pop() else {
                break;
            };
            let next = match head.node {
                Some(node) => head.cand().on_node(node),
                None => head.cand().clone(),
            };
            m.done.push(next);
            head.pos += 1;
            if head.pos < head.list.len() {
                m.heads.push(head);
            }
        }
        m.done.get(i).cloned()
    }

    /// The best candidate.
    pub fn first(&self) -> Option<Cand> {
        self.get(0)
    }

    /// The candidates, best first.
    pub fn iter(&self) -> impl Iterator<Item = Cand> + '_ {
        (0..).map_while(|i| self.get(i))
    }
}
