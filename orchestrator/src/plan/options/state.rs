//! Free memory as a plan reserves it, with each node's state interned as a signature so
//! that nodes in the same state share their candidates.

use std::collections::BTreeSet;
use std::sync::Arc;

use super::cand::Cand;
use crate::plan::fastmap::FastMap;
use crate::plan::fleet::{PlanFleet, PlanNode};

/// What makes two GPUs interchangeable: everything the candidates on them read but
/// their free memory.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct GpuClass {
    /// The model's name, interned.
    name: u32,
    /// Total memory, bytes.
    total: u64,
    /// Whether it is degraded.
    degraded: bool,
    /// Compute capability (major, minor), when known.
    compute_capability: Option<(u32, u32)>,
    /// Memory bandwidth, as the bits of its `f64`.
    bandwidth: u64,
    /// The positions it has NVLink to, one bit each.
    nvlink: u64,
    /// Its position on the node.
    position: usize,
}

/// Free memory as the plan reserves it.
///
/// A state follows its fleet ([`State::sync`]): a planner keeps one between plans and
/// brings it up to date with each new fleet view, recomputing only the nodes whose view
/// changed. Signature ids name node states for as long as the state lives, so what is
/// cached by them (each unit's candidates on a node) stays valid across plans.
#[derive(Debug, Clone)]
pub struct State {
    /// Usable bytes per node per GPU position.
    pub usable: Vec<Vec<u64>>,
    /// Usable host RAM per node.
    pub host: Vec<u64>,
    /// Signature id per node.
    pub(super) sig: Vec<u32>,
    /// Nodes per signature (no empty sets).
    pub(super) sig_nodes: FastMap<u32, BTreeSet<usize>>,
    /// Signature interner.
    interner: FastMap<Vec<u64>, u32>,
    /// Static class id per node per GPU position.
    class: Vec<Vec<u64>>,
    /// Class interner.
    classes: FastMap<GpuClass, u64>,
    /// GPU model name interner.
    names: FastMap<String, u32>,
    /// The fleet node each position was last synced from.
    synced: Vec<Option<Arc<PlanNode>>>,
    /// Incremented whenever a sync changes the fleet (a node's view, the node list):
    /// candidates across nodes read more of a node than its signature.
    pub(super) epoch: u64,
    /// Distinguishes states: caches keyed by signature ids belong to one state.
    pub(super) id: u64,
    /// Nodes whose memory a reservation changed since the last sync, and a flag per
    /// node for them: a sync looks at the others' memory only if their view changed.
    reserved: Vec<usize>,
    is_reserved: Vec<bool>,
}

/// Signatures after which a state is rebuilt rather than grown.
const MAX_SIGNATURES: usize = 1 << 20;

impl State {
    /// Everything free, as the fleet reports it.
    pub fn new(fleet: &PlanFleet) -> State {
        static IDS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let mut state = State {
            usable: Vec::new(),
            host: Vec::new(),
            sig: Vec::new(),
            sig_nodes: FastMap::default(),
            interner: FastMap::default(),
            class: Vec::new(),
            classes: FastMap::default(),
            names: FastMap::default(),
            synced: Vec::new(),
            epoch: 0,
            id: IDS.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            reserved: Vec::new(),
            is_reserved: Vec::new(),
        };
        state.sync(fleet);
        state
    }

    /// Brings the state to `fleet` with nothing reserved: nodes whose view is not the
    /// one last synced are recomputed, the others only reset if a reservation was left
    /// on them. Returns `false` (doing nothing) when the state has grown past its limit
    /// and should be replaced.
    pub fn sync(&mut self, fleet: &PlanFleet) -> bool {
        if self.interner.len() > MAX_SIGNATURES {
            return false;
        }
        let len = fleet.nodes.len();
        let mut changed = false;
        for node in len..self.sig.len() {
            self.leave(node);
            changed = true;
        }
        self.usable.truncate(len);
        self.host.truncate(len);
        self.sig.truncate(len);
        self.class.truncate(len);
        self.synced.truncate(len);
        for (n, view) in fleet.nodes.iter().enumerate() {
            if n == self.sig.len() {
                self.usable.push(Vec::new());
                self.host.push(0);
                self.sig.push(u32::MAX);
                self.class.push(Vec::new());
                self.synced.push(None);
            }
            let same = self.synced[n].as_ref().is_some_and(|s| Arc::ptr_eq(s, view));
            if same && !self.is_reserved.get(n).copied().unwrap_or(false) {
                continue;
            }
            if !same {
                changed = true;
                self.class[n] = view
                    .gpus
                    .iter()
                    .enumerate()
                    .map(|(p, g)| {
                        let next = self.names.len() as u32;
                        let name = match self.names.get(g.name.as_str()) {
                            Some(id) => *id,
                            None => *self.names.entry(g.name.clone()).or_insert(next),
                        };
                        let key = GpuClass {
                            name,
                            total: g.total,
                            degraded: g.degraded,
                            compute_capability: g.compute_capability,
                            bandwidth: g.bandwidth.to_bits(),
                            nvlink: g.nvlink,
                            position: p,
                        };
                        let next = self.classes.len() as u64;
                        *self.classes.entry(key).or_insert(next)
                    })
                    .collect();
                self.synced[n] = Some(view.clone());
            }
            let clean = same
                && self.host[n] == view.host_free
                && self.usable[n].len() == view.gpus.len()
                && self.usable[n].iter().zip(&view.gpus).all(|(u, g)| *u == g.usable);
            if !clean {
                self.usable[n].clear();
                self.usable[n].extend(view.gpus.iter().map(|g| g.usable));
                self.host[n] = view.host_free;
                self.resign(n);
            }
        }
        for n in self.reserved.drain(..) {
            self.is_reserved[n] = false;
        }
        if changed {
            self.epoch += 1;
        }
        true
    }

    fn resign(&mut self, node: usize) {
        // At most 64 GPUs a node (see `PlanNode::gpus`): the key fits on the stack, and
        // is copied to the heap only when new.
        let mut key = [0u64; 1 + 2 * 64];
        key[0] = self.host[node];
        let mut len = 1;
        for (c, u) in self.class[node].iter().zip(&self.usable[node]) {
            key[len] = *c;
            key[len + 1] = *u;
            len += 2;
        }
        let key = &key[..len];
        let id = match self.interner.get(key) {
            Some(id) => *id,
            None => {
                let next = self.interner.len() as u32;
                self.interner.insert(key.to_vec(), next);
                next
            }
        };
        if self.sig[node] == id {
            return;
        }
        self.leave(node);
        self.sig_nodes.entry(id).or_default().insert(node);
        self.sig[node] = id;
    }

    /// Takes `node` out of its signature's set.
    fn leave(&mut self, node: usize) {
        let old = self.sig[node];
        if let Some(set) = self.sig_nodes.get_mut(&old) {
            set.remove(&node);
            if set.is_empty() {
                self.sig_nodes.remove(&old);
            }
        }
    }

    /// Reserve a candidate's memory.
    pub fn apply(&mut self, cand: &Cand) {
        self.change(cand, false);
    }

    /// Give a candidate's memory back.
    pub fn undo(&mut self, cand: &Cand) {
        self.change(cand, true);
    }

    fn change(&mut self, cand: &Cand, give_back: bool) {
        let adjust = |slot: &mut u64, bytes: u64| {
            *slot = if give_back {
                slot.saturating_add(bytes)
            } else {
                slot.saturating_sub(bytes)
            };
        };
        let mut touched = BTreeSet::new();
        for (d, bytes) in cand.devices.iter().zip(&cand.reserve) {
            match d.gpu {
                Some(p) => adjust(&mut self.usable[d.node][p], *bytes),
                None => adjust(&mut self.host[d.node], *bytes),
            }
            touched.insert(d.node);
        }
        if let Some(node) = cand.host_node() {
            adjust(&mut self.host[node], cand.host_extra);
        }
        for n in touched {
            if self.is_reserved.len() <= n {
                self.is_reserved.resize(n + 1, false);
            }
            if !self.is_reserved[n] {
                self.is_reserved[n] = true;
                self.reserved.push(n);
            }
            self.resign(n);
        }
    }

    /// Each distinct node state among the nodes `allowed` (every node when `None`):
    /// its signature, its first allowed node and how many allowed nodes it has, at most
    /// `per`.
    pub(super) fn states<'s>(
        &'s self,
        per: usize,
        allowed: Option<&'s [bool]>,
    ) -> impl Iterator<Item = (u32, usize, usize)> + 's {
        self.sig_nodes.iter().filter_map(move |(sig, members)| match allowed {
            None => members.first().map(|&n| (*sig, n, members.len().min(per))),
            Some(a) => {
                let mut it = members.iter().copied().filter(|&n| a[n]);
                let first = it.next()?;
                Some((*sig, first, 1 + it.take(per.saturating_sub(1)).count()))
            }
        })
    }

    /// One node of each distinct node state among those `allowed`: the first by
    /// position, with the state's signature; in position order.
    pub(super) fn representatives(&self, allowed: Option<&[bool]>) -> Vec<(u32, usize)> {
        let mut reps: Vec<(u32, usize)> = self
            .sig_nodes
            .iter()
            .filter_map(|(sig, nodes)| {
                nodes
                    .iter()
                    .find(|&&n| allowed.is_none_or(|a| a[n]))
                    .map(|n| (*sig, *n))
            })
            .collect();
        reps.sort_by_key(|(_, n)| *n);
        reps
    }
}
