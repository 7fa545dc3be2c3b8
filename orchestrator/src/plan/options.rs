//! Where one replica of an instance could go, given what is free: its candidate
//! placements, each with its estimate and score.
//!
//! The families, in the order they are tried (see `docs/placement.md`):
//! 1. on one node: one GPU; tensor parallelism over GPUs of one model (vLLM); and, for a
//!    variant neither fits, a layer split over the node's GPUs in proportion to each one's
//!    usable memory (llama.cpp `--tensor-split`, vLLM pipeline stages);
//! 2. across nodes, for a variant no single node can hold: layer splits over GPUs of
//!    several nodes, and (vLLM) tensor-parallel groups as pipeline stages;
//! 3. when no GPU placement exists for any variant: GGUF layers split between a node's
//!    GPUs and its host RAM (llama.cpp `-ngl`), marked slow;
//! 4. when nothing else exists: the whole model on a node's CPU (the built-in engine, or
//!    llama.cpp for GGUF), marked slow.
//!
//! A workflow's `engines:` rules out the others: a variant is placed on GPUs only if its
//! engine there (llama.cpp for GGUF, vLLM for safetensors) is allowed.
//!
//! Candidates on a node depend only on the node's state, so they are computed once per
//! distinct state (a signature of its GPUs and free memory) and shared by every node in
//! that state: a thousand identical nodes cost one.

use std::cell::RefCell;
use std::collections::{BTreeSet, BinaryHeap, HashMap};
use std::hash::{BuildHasherDefault, Hasher};
use std::rc::Rc;
use std::sync::{Arc, Mutex};

use skein_dsl::ir::{EngineChoice, ModelRequirement, Precision, Preference};
use skein_model_registry::catalog::ModelInfo;
use skein_model_registry::catalog::fit::engine_for;
use skein_model_registry::estimate::{
    DeviceKind, Engine, Estimate, EstimateRequest, FitMargin, KvDtype, Layout, Stages, estimate, fits,
};
use skein_model_registry::{Bytes, WeightFormat};

use super::demand::{VariantUse, min_compute_capability, variant_use};
use super::explain::{family_name, speed_placement};
use super::fleet::{PlanFleet, PlanGpu, PlanNode};
use super::score::{BANDWIDTH_EFFICIENCY, DeviceSpeed, Hop, ScoreParts, host_speed_factor, tokens_per_second};

/// Nodes with at most this many usable GPUs have every subset of them considered for
/// tensor parallelism; larger nodes, the best-fitting ones by rule.
pub const EXHAUSTIVE_NODE_GPUS: usize = 8;
/// Nodes with at most this many usable GPUs have a layer split over every subset of them
/// considered (each split costs an estimate); larger nodes, the prefixes by memory, and
/// only with fewer GPUs than any one-GPU or tensor-parallel candidate.
pub const EXHAUSTIVE_SPLIT_GPUS: usize = 4;
/// Fleets with at most this many usable GPUs have every cross-node subset considered;
/// larger fleets, nodes by capacity, and only with fewer GPUs than any one-node
/// candidate.
pub const EXHAUSTIVE_FLEET_GPUS: usize = 8;

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
        let serving = if self.family == Family::CrossNode && self.estimate.engine.name() == "llama.cpp" {
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

/// What makes two GPUs interchangeable: model (interned), memory, health, compute
/// capability, bandwidth, links and position on the node.
type GpuClass = (u32, u64, bool, Option<(u32, u32)>, u64, u64, usize);

/// A hash map with [`FastHasher`]: the planner's maps are keyed by its own small
/// integers and byte counts, hashed millions of times a plan; none is iterated in an
/// order that matters.
pub(crate) type FastMap<K, V> = HashMap<K, V, BuildHasherDefault<FastHasher>>;

/// FxHash's multiply-rotate per word, with a SplitMix64 finish so that keys differing
/// only in high bits (byte counts in whole MiB) still spread over the low bits.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct FastHasher(u64);

impl FastHasher {
    fn add(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
}

impl Hasher for FastHasher {
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.add(u64::from_le_bytes(word));
        }
    }

    fn write_u8(&mut self, i: u8) {
        self.add(u64::from(i));
    }

    fn write_u32(&mut self, i: u32) {
        self.add(u64::from(i));
    }

    fn write_u64(&mut self, i: u64) {
        self.add(i);
    }

    fn write_usize(&mut self, i: usize) {
        self.add(i as u64);
    }

    fn finish(&self) -> u64 {
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

/// An estimate and the bytes each device must have for it.
type Need = (Arc<Estimate>, u64);

/// A [`Need`]'s key: the variant, the tensor-parallel degree, and the engine on the CPU
/// (`None` on GPUs).
type NeedKey = (usize, u64, Option<&'static str>);

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
    sig: Vec<u32>,
    /// Nodes per signature (no empty sets).
    sig_nodes: FastMap<u32, BTreeSet<usize>>,
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
    epoch: u64,
    /// Distinguishes states: caches keyed by signature ids belong to one state.
    id: u64,
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
                        let key = (
                            name,
                            g.total,
                            g.degraded,
                            g.compute_capability,
                            g.bandwidth.to_bits(),
                            g.nvlink,
                            p,
                        );
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
    fn states<'s>(&'s self, per: usize, allowed: Option<&'s [bool]>) -> impl Iterator<Item = (u32, usize, usize)> + 's {
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
    fn representatives(&self, allowed: Option<&[bool]>) -> Vec<(u32, usize)> {
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

/// A distinct node state a split may use nodes of.
struct RankedState {
    /// The GPUs a variant can use on its nodes.
    eligible: Arc<[usize]>,
    /// Its signature.
    sig: u32,
    /// Its first node (by position) a split may use.
    first: usize,
    /// How many of its nodes, from `first` on in position order, a split may use.
    count: usize,
}

/// The nodes a split may use, best first — by capacity (the usable memory of the GPUs it
/// may use), then by position — each with those GPUs. Kept per node state and expanded
/// into nodes only as far as a split reads: on a large fleet that is a few nodes of the
/// best states.
struct NodeRanking<'s> {
    state: &'s State,
    allowed: Option<&'s [bool]>,
    states: Arc<RankedStates>,
    /// States already expanded into `ranked`.
    expanded: usize,
    /// (capacity, node, its eligible GPUs), best first, as far as expanded.
    ranked: Vec<(u64, usize, Arc<[usize]>)>,
    /// Nodes in all.
    nodes: usize,
    /// Eligible GPUs in all.
    gpus: usize,
}

/// Node states with their capacity, largest first.
struct RankedStates(Vec<(u64, RankedState)>);

impl RankedStates {
    fn new(state: &State, states: impl IntoIterator<Item = RankedState>) -> RankedStates {
        let mut states: Vec<(u64, RankedState)> = states
            .into_iter()
            .map(|r| (r.eligible.iter().map(|&p| state.usable[r.first][p]).sum::<u64>(), r))
            .collect();
        // Within equal capacity the order of states does not matter: their nodes are
        // ranked by position when expanded.
        states.sort_by_key(|s| std::cmp::Reverse(s.0));
        RankedStates(states)
    }
}

impl<'s> NodeRanking<'s> {
    fn new(state: &'s State, allowed: Option<&'s [bool]>, states: Arc<RankedStates>) -> NodeRanking<'s> {
        NodeRanking {
            state,
            allowed,
            nodes: states.0.iter().map(|(_, r)| r.count).sum(),
            gpus: states.0.iter().map(|(_, r)| r.count * r.eligible.len()).sum(),
            states,
            expanded: 0,
            ranked: Vec::new(),
        }
    }

    /// The `i`-th best node: its capacity, position and eligible GPUs.
    fn get(&mut self, i: usize) -> Option<(u64, usize, Arc<[usize]>)> {
        while self.ranked.len() <= i && self.expanded < self.states.0.len() {
            let capacity = self.states.0[self.expanded].0;
            let start = self.ranked.len();
            while let Some((c, r)) = self.states.0.get(self.expanded)
                && *c == capacity
            {
                if r.count == 1 {
                    self.ranked.push((capacity, r.first, r.eligible.clone()));
                } else {
                    let allowed = self.allowed;
                    let members = self.state.sig_nodes[&r.sig]
                        .range(r.first..)
                        .copied()
                        .filter(|&n| allowed.is_none_or(|a| a[n]))
                        .take(r.count);
                    self.ranked.extend(members.map(|n| (capacity, n, r.eligible.clone())));
                }
                self.expanded += 1;
            }
            self.ranked[start..].sort_by_key(|&(_, n, _)| n);
        }
        self.ranked.get(i).cloned()
    }
}

/// One replica of an instance, with everything its candidates need.
pub struct Unit<'a> {
    /// The model.
    pub info: &'a ModelInfo,
    /// The (combined) requirement.
    pub requirement: &'a ModelRequirement,
    /// Sequences this replica serves.
    pub concurrency: u64,
    /// Most GPUs it may span.
    pub max_gpus: usize,
    /// KV-cache type.
    pub kv_dtype: KvDtype,
    /// Variants it may use, with their tiers.
    pub allowed: Vec<(usize, Precision)>,
    /// Per node: whether the requirement's node list allows it; `None` when it names
    /// no nodes.
    node_ok: Option<Vec<bool>>,
    /// The requirement's GPU models, lowercase.
    models: Vec<String>,
    /// Whether the CPU may serve it (the requirement constrains no GPU property).
    cpu_allowed: bool,
    /// What it has computed; shared by the replicas of an instance, and kept by a
    /// [`Planner`](super::Planner) for the next plan of the same unit.
    cache: Rc<UnitCache>,
}

/// The estimate of one layout for each engine asked about (`None`: the estimator refused it).
type EngineEstimates = Vec<(Engine, Option<Arc<Estimate>>)>;

/// What a unit computes, kept as long as it stays valid: estimates for as long as the
/// unit is the same; candidates on a node state for as long as the [`State`] that named
/// it lives; candidate lists of the whole fleet for as long as the fleet is the same.
#[derive(Default)]
pub struct UnitCache {
    /// The state the signature-keyed caches belong to.
    state: std::cell::Cell<Option<u64>>,
    needs: RefCell<FastMap<NeedKey, Option<Need>>>,
    local: RefCell<FastMap<u32, Arc<Vec<Cand>>>>,
    fallback: RefCell<FastMap<u32, Arc<Vec<Cand>>>>,
    /// The GPUs of a node state a variant can use, by signature and the compute
    /// capability the variant needs.
    eligible: RefCell<FastMap<(u32, ComputeCapability), GpuList>>,
    /// Per node state, the fewest GPUs of a candidate on it, per variant.
    fewest: RefCell<FastMap<u32, Arc<[usize]>>>,
    /// The ranked node states of the last state asked about.
    rankings: RefCell<Rankings>,
    /// Every estimate made, by variant and layout: node states that differ only in GPUs
    /// a split does not use (a degraded card elsewhere on the node) ask for the same one.
    estimates: RefCell<FastMap<LayoutKey, EngineEstimates>>,
    /// The candidate lists of the last few states asked about (see [`Memo`]).
    memo: RefCell<Memo>,
}

impl std::fmt::Debug for UnitCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UnitCache")
            .field("estimates", &self.estimates.borrow().len())
            .field("local", &self.local.borrow().len())
            .finish_non_exhaustive()
    }
}

impl UnitCache {
    /// Forgets what is keyed by another state's signatures.
    fn follow(&self, state: &State) {
        if self.state.get() != Some(state.id) {
            self.local.borrow_mut().clear();
            self.fallback.borrow_mut().clear();
            self.eligible.borrow_mut().clear();
            self.fewest.borrow_mut().clear();
            *self.rankings.borrow_mut() = Rankings::default();
            self.memo.borrow_mut().entries.clear();
            self.state.set(Some(state.id));
        }
    }
}

/// A compute capability: (major, minor).
type ComputeCapability = (u32, u32);

/// GPU positions on a node.
type GpuList = Arc<[usize]>;

/// [`Unit::ranked_states`] of one state (its fleet epoch and every node's signature), by
/// the compute capability variants need.
#[derive(Default)]
struct Rankings {
    epoch: u64,
    sig: Vec<u32>,
    by_cc: Vec<(ComputeCapability, Arc<RankedStates>)>,
}

/// Estimates a unit keeps (see [`Unit::estimate`]): far more than one plan asks for
/// (tens to a few thousand), a few megabytes at most.
const ESTIMATE_CACHE_CAPACITY: usize = 8_192;

/// A layout as a hashable key, with the variant: tensor-parallel degree, the kind of
/// stages (one, ratios, memory), their entries, and the leading stages on the CPU.
type LayoutKey = (usize, u64, u8, Vec<u64>, usize);

/// Candidate lists of recent states, keyed by the state's fleet epoch and the
/// signature of every node: a plan asks about the untouched fleet several times
/// (replica count, bound, visiting order, the search's first step, the reasons), and
/// the next plan on an unchanged fleet again. The first state asked about in an epoch
/// is kept, the others rotate.
#[derive(Default)]
struct Memo {
    entries: Vec<MemoEntry>,
}

/// The lists of one state, each made when first asked for.
struct MemoEntry {
    epoch: u64,
    /// Signature id of every node.
    sig: Vec<u32>,
    lists: [Option<Arc<CandList>>; 3],
}

/// Which list of a state.
#[derive(Debug, Clone, Copy)]
enum List {
    /// [`Unit::gpu_candidates`].
    Gpu = 0,
    /// [`Unit::cross_node_bound`].
    CrossNodeBound = 1,
    /// [`Unit::last_resorts`].
    LastResorts = 2,
}

/// States a [`Memo`] keeps, the first included.
const MEMO_STATES: usize = 4;

impl Memo {
    fn get(&self, list: List, state: &State) -> Option<Arc<CandList>> {
        self.entries
            .iter()
            .find(|e| e.epoch == state.epoch && e.sig == state.sig)
            .and_then(|e| e.lists[list as usize].clone())
    }

    fn put(&mut self, list: List, state: &State, cands: Arc<CandList>) {
        self.entries.retain(|e| e.epoch == state.epoch);
        let i = match self.entries.iter().position(|e| e.sig == state.sig) {
            Some(i) => i,
            None => {
                if self.entries.len() == MEMO_STATES {
                    self.entries.remove(1);
                }
                self.entries.push(MemoEntry {
                    epoch: state.epoch,
                    sig: state.sig.clone(),
                    lists: [None, None, None],
                });
                self.entries.len() - 1
            }
        };
        self.entries[i].lists[list as usize] = Some(cands);
    }
}

impl<'a> Unit<'a> {
    /// A replica serving `concurrency` sequences, with `cache`: a new one, or what an
    /// earlier unit alike in every argument but the fleet computed.
    pub fn new(
        info: &'a ModelInfo,
        requirement: &'a ModelRequirement,
        concurrency: u64,
        max_gpus: Option<u32>,
        kv_dtype: KvDtype,
        fleet: &PlanFleet,
        cache: Rc<UnitCache>,
    ) -> Unit<'a> {
        let allowed = info
            .variants
            .iter()
            .enumerate()
            .filter_map(|(i, v)| match variant_use(requirement, v) {
                VariantUse::Allowed(tier) => Some((i, tier)),
                VariantUse::Excluded(_) => None,
            })
            .collect();
        let c = &requirement.gpu;
        let node_ok = (!c.nodes.is_empty()).then(|| fleet.nodes.iter().map(|n| c.nodes.contains(&n.name)).collect());
        let cpu_allowed = c.models.is_empty() && c.min_compute_capability.is_none() && c.min_memory_bytes.is_none();
        Unit {
            info,
            requirement,
            concurrency,
            max_gpus: max_gpus.map_or(usize::MAX, |m| m.max(1) as usize),
            kv_dtype,
            allowed,
            node_ok,
            models: c.models.iter().map(|m| m.to_ascii_lowercase()).collect(),
            cpu_allowed,
            cache,
        }
    }

    fn request(&self, engine: Engine, layout: Layout, cpu_stages: usize) -> EstimateRequest {
        EstimateRequest::new(engine, u64::from(self.requirement.context))
            .with_concurrency(self.concurrency)
            .with_kv_dtype(self.kv_dtype)
            .with_layout(layout)
            .with_cpu_stages(cpu_stages)
            .without_details()
    }

    /// The estimate of variant `v` on `layout` with GPUs only, or `None` if the engine
    /// cannot run it.
    fn estimate(&self, v: usize, engine: Engine, layout: Layout) -> Option<Arc<Estimate>> {
        self.estimate_on(v, engine, layout, 0)
    }

    /// The estimate of variant `v` on `layout` whose first `cpu_stages` stages are on the
    /// host CPU, or `None` if the engine cannot run it.
    fn estimate_on(&self, v: usize, engine: Engine, layout: Layout, cpu_stages: usize) -> Option<Arc<Estimate>> {
        let (kind, entries) = match &layout.stages {
            Stages::One => (0, Vec::new()),
            Stages::Ratios(r) => (1, r.iter().map(|&x| u64::from(x)).collect()),
            Stages::Memory(m) => (2, m.iter().map(|b| b.get()).collect()),
        };
        let key = (v, layout.tensor_parallel, kind, entries, cpu_stages);
        if let Some(known) = self.cache.estimates.borrow().get(&key)
            && let Some((_, hit)) = known.iter().find(|(e, _)| *e == engine)
        {
            return hit.clone();
        }
        let variant = &self.info.variants[v];
        let made = estimate(
            &self.info.shape,
            &variant.weights,
            &self.request(engine, layout, cpu_stages),
        )
        .ok()
        .map(Arc::new);
        let mut estimates = self.cache.estimates.borrow_mut();
        // Layer splits by memory are keyed by free bytes, which telemetry changes from
        // plan to plan: without a bound, a kept planner would grow for as long as the
        // server runs. Estimates are pure, so starting over changes no plan.
        if estimates.len() >= ESTIMATE_CACHE_CAPACITY {
            estimates.clear();
        }
        estimates.entry(key).or_default().push((engine, made.clone()));
        made
    }

    /// `c`'s estimate with every line's detail, as a plan shows it: candidates are
    /// estimated without them.
    pub fn detailed_estimate(&self, c: &Cand) -> Arc<Estimate> {
        let request = EstimateRequest {
            details: true,
            ..self.request(c.estimate.engine, c.estimate.layout.clone(), cpu_stages(&c.estimate))
        };
        estimate(&self.info.shape, &self.info.variants[c.variant].weights, &request)
            .map_or_else(|_| c.estimate.clone(), Arc::new)
    }

    /// The estimate of `v` on one GPU (`k == 1`) or tensor parallel over `k`, or with
    /// `cpu`'s engine on the CPU, with the bytes each device must have (the largest need
    /// plus margin); cached.
    fn need(&self, v: usize, k: u64, cpu: Option<Engine>) -> Option<Need> {
        let key = (v, k, cpu.map(|e| e.name()));
        if let Some(hit) = self.cache.needs.borrow().get(&key) {
            return hit.clone();
        }
        let engine = cpu.unwrap_or_else(|| engine_for(self.info.variants[v].format()));
        let layout = if k == 1 {
            Layout::single()
        } else {
            Layout::tensor_parallel(k)
        };
        let result = self
            .estimate_on(v, engine, layout, usize::from(cpu.is_some()))
            .map(|e| {
                let need = e.max_device_total();
                let kind = e.devices.first().map_or(DeviceKind::Gpu, |d| d.kind);
                (e, with_margin(need, kind))
            });
        self.cache.needs.borrow_mut().insert(key, result.clone());
        result
    }

    /// Whether the requirement's `engines:` allows `engine` (any when it names none).
    pub fn engine_allowed(&self, engine: Engine) -> bool {
        let choice = match engine {
            Engine::Candle(_) => EngineChoice::Builtin,
            Engine::LlamaCpp(_) => EngineChoice::LlamaCpp,
            Engine::Vllm(_) => EngineChoice::Vllm,
        };
        self.requirement.engines.is_empty() || self.requirement.engines.contains(&choice)
    }

    /// Whether variant `v` may go on GPUs: its engine there is allowed.
    fn gpu_engine_allowed(&self, v: usize) -> bool {
        self.engine_allowed(engine_for(self.info.variants[v].format()))
    }

    /// The engines that may run variant `v` on the CPU alone: the built-in one, and
    /// llama.cpp for GGUF, those the requirement allows.
    pub fn cpu_engines(&self, v: usize) -> Vec<Engine> {
        let gguf = self.info.variants[v].format() == WeightFormat::Gguf;
        let builtin = self.info.builtin_engine_loads(&self.info.variants[v]);
        [builtin.then_some(Engine::CANDLE_CPU), gguf.then_some(Engine::LLAMA_CPP)]
            .into_iter()
            .flatten()
            .filter(|e| self.engine_allowed(*e))
            .collect()
    }

    fn usable_gpu(&self, fleet: &PlanFleet, state: &State, v: usize, node: usize, p: usize) -> bool {
        let cc = min_compute_capability(&self.info.variants[v]);
        self.usable_with(fleet, state, cc, node, p)
    }

    /// Whether GPU `p` of `node` has memory left, compute capability `cc` at least, and
    /// meets the requirement.
    fn usable_with(&self, fleet: &PlanFleet, state: &State, cc: ComputeCapability, node: usize, p: usize) -> bool {
        let g = &fleet.nodes[node].gpus[p];
        state.usable[node][p] > 0 && g.compute_capability.is_none_or(|c| c >= cc) && self.gpu_allowed(fleet, node, p)
    }

    /// The nodes the requirement allows, `None` for all.
    fn allowed_nodes(&self) -> Option<&[bool]> {
        self.node_ok.as_deref()
    }

    /// The best candidate for this unit in `state`: the first of [`gpu_candidates`],
    /// else of [`last_resorts`] (computed only when nothing fits on GPUs), which score
    /// below every placement on GPUs.
    ///
    /// [`gpu_candidates`]: Self::gpu_candidates
    /// [`last_resorts`]: Self::last_resorts
    pub fn best(&self, fleet: &PlanFleet, state: &State) -> Option<Cand> {
        match self.gpu_candidates(fleet, state).first() {
            Some(c) => Some(c),
            None => self.last_resorts(fleet, state).first(),
        }
    }

    /// The best candidate counting splits across nodes for every variant too: its score
    /// bounds what the unit can reach in any later state (reserving memory only removes
    /// candidates, and a split's partition follows the memory free, so a later state
    /// may have splits the candidates of this one leave out).
    pub fn best_bound(&self, fleet: &PlanFleet, state: &State) -> Option<Cand> {
        let gpu = self.gpu_candidates(fleet, state).first();
        let cross = self.cross_node_bound(fleet, state).first();
        // The first of both sorted together (stably, the one-node list first).
        let best = match (gpu, cross) {
            (Some(a), Some(b)) => Some(if b.score > a.score || (b.score == a.score && b.key() < a.key()) {
                b
            } else {
                a
            }),
            (a, b) => a.or(b),
        };
        best.or_else(|| self.last_resorts(fleet, state).first())
    }

    /// The candidates on GPUs (one node or several), best first.
    pub fn gpu_candidates(&self, fleet: &PlanFleet, state: &State) -> Arc<CandList> {
        self.memoized(List::Gpu, state, || self.compute_gpu_candidates(fleet, state))
    }

    /// Splits across nodes for every variant, best first: what
    /// [`best_bound`](Self::best_bound) counts besides the candidates.
    fn cross_node_bound(&self, fleet: &PlanFleet, state: &State) -> Arc<CandList> {
        self.memoized(List::CrossNodeBound, state, || {
            let mut out = Vec::new();
            if fleet.nodes.len() > 1 {
                for &(v, tier) in self.allowed.iter().filter(|(v, _)| self.gpu_engine_allowed(*v)) {
                    out.extend(self.cross_node(fleet, state, v, tier, usize::MAX));
                }
            }
            CandList::sorted(out)
        })
    }

    /// The last resorts (layers in host RAM, the CPU), best first. Their penalties put
    /// them below every candidate on GPUs, so a search computes them only once it has
    /// tried every one of those.
    pub fn last_resorts(&self, fleet: &PlanFleet, state: &State) -> Arc<CandList> {
        self.memoized(List::LastResorts, state, || {
            // The last resorts are candidates in every state: the objective's penalties
            // keep them for when the GPUs cannot hold every instance, and which instance
            // goes to host RAM is then the search's choice, not the order it visits them
            // in.
            let lists = state
                .representatives(self.allowed_nodes())
                .into_iter()
                .map(|(sig, node)| {
                    let fallback = self.cached(&self.cache.fallback, sig, || self.fallback(fleet, state, node));
                    (fallback, Some(node))
                })
                .collect();
            CandList::merge(lists)
        })
    }

    /// The list `make` computes for `state`, or the one it computed before for the
    /// same state of the same fleet.
    fn memoized(&self, list: List, state: &State, make: impl FnOnce() -> CandList) -> Arc<CandList> {
        self.cache.follow(state);
        if let Some(hit) = self.cache.memo.borrow().get(list, state) {
            return hit;
        }
        let made = Arc::new(make());
        self.cache.memo.borrow_mut().put(list, state, made.clone());
        made
    }

    fn compute_gpu_candidates(&self, fleet: &PlanFleet, state: &State) -> CandList {
        let reps = state.representatives(self.allowed_nodes());
        let mut lists = Vec::with_capacity(reps.len() + 1);
        // Per variant, the fewest GPUs of a candidate on one node.
        let mut smallest = vec![usize::MAX; self.info.variants.len()];
        for &(sig, node) in &reps {
            let local = self.cached(&self.cache.local, sig, || self.local(fleet, state, node));
            let fewest = self.fewest_gpus(sig, &local);
            for (s, f) in smallest.iter_mut().zip(fewest.iter()) {
                *s = (*s).min(*f);
            }
            lists.push((local, Some(node)));
        }
        if fleet.nodes.len() > 1 {
            // Across nodes: on a small fleet every split; otherwise only with fewer GPUs
            // than any one-node candidate.
            let small = fleet.nodes.iter().map(|n| n.gpus.len()).sum::<usize>() <= EXHAUSTIVE_FLEET_GPUS;
            let mut cross = Vec::new();
            for &(v, tier) in self.allowed.iter().filter(|(v, _)| self.gpu_engine_allowed(*v)) {
                let cap = if small {
                    usize::MAX
                } else {
                    smallest[v].saturating_sub(1)
                };
                if cap >= 2 {
                    cross.extend(self.cross_node(fleet, state, v, tier, cap));
                }
            }
            sort_cands(&mut cross);
            lists.push((Arc::new(cross), None));
        }
        CandList::merge(lists)
    }

    /// Per variant, the fewest GPUs of a candidate in `local` (the candidates of the
    /// node state `sig`).
    fn fewest_gpus(&self, sig: u32, local: &[Cand]) -> Arc<[usize]> {
        if let Some(hit) = self.cache.fewest.borrow().get(&sig) {
            return hit.clone();
        }
        let mut fewest = vec![usize::MAX; self.info.variants.len()];
        for c in local {
            fewest[c.variant] = fewest[c.variant].min(c.devices.len());
        }
        let made: Arc<[usize]> = fewest.into();
        self.cache.fewest.borrow_mut().insert(sig, made.clone());
        made
    }

    fn cached(
        &self,
        cache: &RefCell<FastMap<u32, Arc<Vec<Cand>>>>,
        sig: u32,
        make: impl FnOnce() -> Vec<Cand>,
    ) -> Arc<Vec<Cand>> {
        if let Some(hit) = cache.borrow().get(&sig) {
            return hit.clone();
        }
        let made = Arc::new(make());
        cache.borrow_mut().insert(sig, made.clone());
        made
    }

    /// Candidates on one node: one GPU, tensor parallel, a split over its GPUs.
    fn local(&self, fleet: &PlanFleet, state: &State, node: usize) -> Vec<Cand> {
        let gpus = &fleet.nodes[node].gpus;
        let cur = &state.usable[node];
        let mut out = Vec::new();
        for &(v, tier) in self.allowed.iter().filter(|(v, _)| self.gpu_engine_allowed(*v)) {
            let eligible: Vec<usize> = (0..gpus.len())
                .filter(|&p| self.usable_gpu(fleet, state, v, node, p))
                .collect();
            if eligible.is_empty() {
                continue;
            }
            let before = out.len();
            let vllm = self.info.variants[v].format() == WeightFormat::Safetensors;
            if let Some((e, need)) = self.need(v, 1, None)
                && e.host <= Bytes::new(state.host[node])
            {
                for &p in &eligible {
                    if cur[p] >= need {
                        out.push(self.cand(
                            fleet,
                            v,
                            tier,
                            Family::Single,
                            e.clone(),
                            vec![Dev { node, gpu: Some(p) }],
                        ));
                    }
                }
            }
            if vllm {
                for k in 2..=eligible.len().min(self.max_gpus) {
                    let Some((e, need)) = self.need(v, k as u64, None) else {
                        continue;
                    };
                    for subset in tp_groups(gpus, cur, &eligible, k, need) {
                        let devices = subset.iter().map(|&p| Dev { node, gpu: Some(p) }).collect();
                        out.push(self.cand(fleet, v, tier, Family::TensorParallel, e.clone(), devices));
                    }
                }
            }
            // A split is never faster than a one-GPU or tensor-parallel candidate on
            // the same GPUs, but one with more GPUs needs less memory on each, which can
            // leave room for another instance: on a small node every split is a
            // candidate, on a large one only those with fewer GPUs.
            let smallest = if eligible.len() <= EXHAUSTIVE_SPLIT_GPUS {
                usize::MAX
            } else {
                out[before..]
                    .iter()
                    .map(|c| c.devices.len())
                    .min()
                    .unwrap_or(usize::MAX)
            };
            if eligible.len() >= 2 && smallest > 2 {
                let only = RankedState {
                    eligible: eligible.into(),
                    sig: state.sig[node],
                    first: node,
                    count: 1,
                };
                let mut ranking = NodeRanking::new(state, None, Arc::new(RankedStates::new(state, [only])));
                let found = self.splits(fleet, state, v, tier, Family::NodeSplit, &mut ranking, smallest - 1);
                out.extend(found);
            }
        }
        dedupe(fleet, state, &mut out);
        sort_cands(&mut out);
        out
    }

    /// Layer splits over subsets of `groups`' GPUs (each group: GPU positions on one
    /// node, `nodes[i]`), one GPU per stage with layers in proportion to usable memory:
    /// every subset when there are few GPUs, otherwise the prefixes of the GPUs ordered
    /// by node capacity and usable memory. Only the smallest size that fits is kept.
    #[allow(clippy::too_many_arguments)]
    fn splits(
        &self,
        fleet: &PlanFleet,
        state: &State,
        v: usize,
        tier: Precision,
        family: Family,
        ranking: &mut NodeRanking<'_>,
        max_size: usize,
    ) -> Vec<Cand> {
        let engine = engine_for(self.info.variants[v].format());
        let Some((single, _)) = self.need(v, 1, None) else {
            return Vec::new();
        };
        let floor: u64 = single.devices.iter().map(|d| d.weights.get() + d.kv_cache.get()).sum();
        // Every GPU with its node, in preference order: nodes by capacity, GPUs by memory.
        // It is filled node by node only as far as the prefixes below read it: on a
        // large fleet the first fit is among the first nodes.
        let mut order: Vec<(usize, usize)> = Vec::new();
        let total = ranking.gpus;
        let mut filled = 0;
        let mut fill = |order: &mut Vec<(usize, usize)>, len: usize| {
            while order.len() < len
                && let Some((_, n, group)) = ranking.get(filled)
            {
                let mut list = group.to_vec();
                list.sort_by(|&a, &b| state.usable[n][b].cmp(&state.usable[n][a]).then(a.cmp(&b)));
                order.extend(list.into_iter().map(|p| (n, p)));
                filled += 1;
            }
        };
        let spans = |devs: &[(usize, usize)]| devs.iter().any(|d| d.0 != devs[0].0);
        let must_span = family == Family::CrossNode;
        let mut out = Vec::new();
        let try_set = |devs: &[(usize, usize)], out: &mut Vec<Cand>| {
            if must_span && !spans(devs) {
                return;
            }
            // Stages go node by node, the nodes with the most of the split's memory
            // first, and on each node the GPUs with the most memory first.
            let on_node = |n: usize| {
                devs.iter()
                    .filter(|d| d.0 == n)
                    .map(|&(n, p)| state.usable[n][p])
                    .sum::<u64>()
            };
            let mut devs = devs.to_vec();
            devs.sort_by(|a, b| {
                on_node(b.0)
                    .cmp(&on_node(a.0))
                    .then(a.0.cmp(&b.0))
                    .then(state.usable[b.0][b.1].cmp(&state.usable[a.0][a.1]))
                    .then(a.1.cmp(&b.1))
            });
            let devs = &devs[..];
            let memory: Vec<u64> = devs.iter().map(|&(n, p)| state.usable[n][p]).collect();
            if memory.iter().sum::<u64>() < floor {
                return;
            }
            let layout = Layout::pipeline_by_memory(memory.iter().map(|&m| Bytes::new(m)).collect());
            let Some(e) = self.estimate(v, engine, layout) else {
                return;
            };
            let usable: Vec<Bytes> = memory.iter().map(|&m| Bytes::new(m)).collect();
            let fit = fits_with_reserve(&e, &usable);
            if fit && e.host <= Bytes::new(state.host[devs[0].0]) {
                let devices = devs.iter().map(|&(node, p)| Dev { node, gpu: Some(p) }).collect();
                out.push(self.cand(fleet, v, tier, family, e, devices));
            }
        };
        let most = total.min(self.max_gpus).min(max_size);
        let limit = if must_span {
            EXHAUSTIVE_FLEET_GPUS
        } else {
            EXHAUSTIVE_SPLIT_GPUS
        };
        let exhaustive = total <= limit;
        if exhaustive {
            fill(&mut order, total);
        }
        for size in 2..=most {
            if exhaustive {
                for_each_subset(&order, size, &mut |devs| try_set(devs, &mut out));
            } else {
                // The smallest size that fits.
                fill(&mut order, size);
                try_set(&order[..size], &mut out);
                if !out.is_empty() {
                    break;
                }
            }
        }
        if engine == Engine::VLLM {
            out.extend(self.tp_stages(fleet, state, v, tier, ranking, most));
        }
        out
    }

    /// vLLM: tensor-parallel groups of `k` identical GPUs, one group per pipeline stage,
    /// stages taken node by node (best nodes first) until the model fits.
    fn tp_stages(
        &self,
        fleet: &PlanFleet,
        state: &State,
        v: usize,
        tier: Precision,
        ranking: &mut NodeRanking<'_>,
        max_size: usize,
    ) -> Vec<Cand> {
        let mut out = Vec::new();
        for k in [2usize, 4, 8] {
            if self.need(v, k as u64, None).is_none() {
                continue; // not a valid degree
            }
            // Stages node by node, only as many nodes as the counts below read.
            let mut stages: Vec<(usize, Vec<usize>, u64)> = Vec::new();
            let mut next = 0;
            let mut add_node = |stages: &mut Vec<(usize, Vec<usize>, u64)>| -> bool {
                let Some((_, n, group)) = ranking.get(next) else {
                    return false;
                };
                next += 1;
                let gpus = &fleet.nodes[n].gpus;
                let mut by_name: Vec<(&str, Vec<usize>)> = Vec::new();
                for &p in group.iter() {
                    match by_name.iter_mut().find(|(name, _)| *name == gpus[p].name) {
                        Some((_, list)) => list.push(p),
                        None => by_name.push((&gpus[p].name, vec![p])),
                    }
                }
                let mut node_stages = Vec::new();
                for (_, mut list) in by_name {
                    list.sort_by(|&a, &b| state.usable[n][b].cmp(&state.usable[n][a]).then(a.cmp(&b)));
                    for chunk in list.chunks_exact(k) {
                        let least = chunk.iter().map(|&p| state.usable[n][p]).min().unwrap_or(0);
                        node_stages.push((n, chunk.to_vec(), least));
                    }
                }
                node_stages.sort_by(|a, b| b.2.cmp(&a.2).then(a.1.cmp(&b.1)));
                stages.extend(node_stages);
                true
            };
            for count in 2.. {
                while stages.len() < count {
                    if !add_node(&mut stages) {
                        break;
                    }
                }
                if stages.len() < count || count * k > max_size {
                    break;
                }
                let chosen = &stages[..count];
                let layout = Layout {
                    tensor_parallel: k as u64,
                    stages: Stages::Memory(chosen.iter().map(|s| Bytes::new(s.2)).collect()),
                };
                let Some(e) = self.estimate(v, Engine::VLLM, layout) else {
                    break;
                };
                let usable: Vec<Bytes> = chosen
                    .iter()
                    .flat_map(|s| s.1.iter().map(|&p| Bytes::new(state.usable[s.0][p])))
                    .collect();
                if fits_with_reserve(&e, &usable) {
                    let devices: Vec<Dev> = chosen
                        .iter()
                        .flat_map(|s| {
                            s.1.iter().map(|&p| Dev {
                                node: s.0,
                                gpu: Some(p),
                            })
                        })
                        .collect();
                    let family = if chosen.iter().all(|s| s.0 == chosen[0].0) {
                        Family::NodeSplit
                    } else {
                        Family::CrossNode
                    };
                    out.push(self.cand(fleet, v, tier, family, e, devices));
                    break;
                }
            }
        }
        out
    }

    /// Splits over several nodes for variant `v`, on at most `max_size` GPUs.
    fn cross_node(&self, fleet: &PlanFleet, state: &State, v: usize, tier: Precision, max_size: usize) -> Vec<Cand> {
        let cc = min_compute_capability(&self.info.variants[v]);
        let mut ranking = NodeRanking::new(state, self.allowed_nodes(), self.ranked_states(fleet, state, cc));
        if ranking.nodes < 2 {
            return Vec::new();
        }
        let mut out = self.splits(fleet, state, v, tier, Family::CrossNode, &mut ranking, max_size);
        out.retain(|c| c.family == Family::CrossNode);
        out
    }

    /// The node states whose GPUs a variant needing compute capability `cc` can use,
    /// largest capacity first, with the first few nodes of each: nodes in one state are
    /// interchangeable and a split spans at most `max_gpus` of them, so those are every
    /// node a split can use first. Made once per state for all variants alike.
    fn ranked_states(&self, fleet: &PlanFleet, state: &State, cc: ComputeCapability) -> Arc<RankedStates> {
        let mut memo = self.cache.rankings.borrow_mut();
        if memo.epoch != state.epoch || memo.sig != state.sig {
            memo.epoch = state.epoch;
            memo.sig.clone_from(&state.sig);
            memo.by_cc.clear();
        }
        if let Some((_, hit)) = memo.by_cc.iter().find(|(c, _)| *c == cc) {
            return hit.clone();
        }
        let states = state
            .states(self.max_gpus, self.allowed_nodes())
            .filter_map(|(sig, first, count)| {
                let eligible = self.eligible(fleet, state, cc, sig, first);
                (!eligible.is_empty()).then_some(RankedState {
                    eligible,
                    sig,
                    first,
                    count,
                })
            });
        let made = Arc::new(RankedStates::new(state, states));
        memo.by_cc.push((cc, made.clone()));
        made
    }

    /// The GPUs of `node` (in the state `sig`) a variant needing compute capability
    /// `cc` can use, in position order; the same for every node of that state the
    /// requirement allows.
    fn eligible(&self, fleet: &PlanFleet, state: &State, cc: ComputeCapability, sig: u32, node: usize) -> Arc<[usize]> {
        if let Some(hit) = self.cache.eligible.borrow().get(&(sig, cc)) {
            return hit.clone();
        }
        let made: Arc<[usize]> = (0..fleet.nodes[node].gpus.len())
            .filter(|&p| self.usable_with(fleet, state, cc, node, p))
            .collect();
        self.cache.eligible.borrow_mut().insert((sig, cc), made.clone());
        made
    }

    /// The last resorts on one node: GGUF layers split between its GPUs and host RAM
    /// (llama.cpp), and the whole model on its CPU (the built-in engine, and llama.cpp
    /// for GGUF), as far as the requirement's `engines:` allows.
    pub fn fallback(&self, fleet: &PlanFleet, state: &State, node: usize) -> Vec<Cand> {
        let mut out = Vec::new();
        let host = state.host[node];
        for &(v, tier) in &self.allowed {
            let variant = &self.info.variants[v];
            if variant.format() == WeightFormat::Gguf && self.engine_allowed(Engine::LLAMA_CPP) {
                let mut gpus: Vec<usize> = (0..fleet.nodes[node].gpus.len())
                    .filter(|&p| self.usable_gpu(fleet, state, v, node, p))
                    .collect();
                gpus.sort_by(|&a, &b| state.usable[node][b].cmp(&state.usable[node][a]).then(a.cmp(&b)));
                gpus.truncate(self.max_gpus);
                if !gpus.is_empty()
                    && host > 0
                    && let Some((e, devices)) = self.offload(state, v, node, &gpus)
                {
                    out.push(self.cand(fleet, v, tier, Family::Offload, e, devices));
                }
            }
            for engine in self.cpu_engines(v) {
                if self.cpu_allowed
                    && let Some((e, need)) = self.need(v, 1, Some(engine))
                    && need.saturating_add(e.host.get()) <= host
                {
                    out.push(self.cand(fleet, v, tier, Family::Cpu, e, vec![Dev { node, gpu: None }]));
                }
            }
        }
        sort_cands(&mut out);
        out
    }

    /// llama.cpp with the GPUs of `gpus` (best first) filled with as many layers as
    /// they hold and the rest in host RAM (`-ngl`): the estimate and its devices, or
    /// `None` when the host cannot take the rest.
    fn offload(&self, state: &State, v: usize, node: usize, gpus: &[usize]) -> Option<(Arc<Estimate>, Vec<Dev>)> {
        let host = state.host[node];
        // llama.cpp keeps the first layers in host RAM and offloads the last ones with
        // the output (`-ngl`), so the host is the first stage and the GPUs follow.
        let mut memory: Vec<Bytes> = vec![Bytes::new(host)];
        memory.extend(gpus.iter().map(|&p| Bytes::new(state.usable[node][p])));
        // A first, proportional estimate gives each GPU's fixed costs and a layer's size.
        let probe = self.estimate_on(v, Engine::LLAMA_CPP, Layout::pipeline_by_memory(memory.clone()), 1)?;
        let layers = probe.devices.last()?.layers.end;
        let per_layer = probe
            .devices
            .iter()
            .filter(|d| !d.layers.is_empty())
            .map(|d| (d.weights.get() + d.kv_cache.get()).div_ceil(d.layers.len()))
            .max()?
            .max(1);
        let mut counts: Vec<u64> = probe.devices[1..]
            .iter()
            .zip(&memory[1..])
            .map(|(d, usable)| {
                let fixed = d.total.get().saturating_sub(d.layers.len() * per_layer);
                let room = usable.get() / 100 * 95;
                room.saturating_sub(fixed) / per_layer
            })
            .collect();
        // Whatever the rounding, the host keeps at least one layer; then GPUs give
        // layers back until every device fits.
        for _ in 0..=8 {
            let on_gpus: u64 = counts.iter().sum();
            if on_gpus >= layers {
                let excess = on_gpus - layers + 1;
                let last = counts.iter().rposition(|&c| c >= excess)?;
                counts[last] -= excess;
            }
            let kept: Vec<usize> = (0..gpus.len()).filter(|&i| counts[i] > 0).collect();
            if kept.is_empty() {
                return None;
            }
            let mut ratios: Vec<u32> = vec![u32::try_from(layers - counts.iter().sum::<u64>()).unwrap_or(u32::MAX)];
            ratios.extend(kept.iter().map(|&i| u32::try_from(counts[i]).unwrap_or(u32::MAX)));
            let e = self.estimate_on(v, Engine::LLAMA_CPP, Layout::pipeline(ratios), 1)?;
            let usable: Vec<Bytes> = [Bytes::new(host)]
                .into_iter()
                .chain(kept.iter().map(|&i| memory[i + 1]))
                .collect();
            let report = fits(&e, &usable).ok()?;
            if report.fits {
                // The host stage's line includes what llama.cpp keeps in RAM anyway.
                let host_need =
                    with_margin(e.devices.first().map_or(Bytes::ZERO, |d| d.total), DeviceKind::Cpu) + e.host.get();
                if host_need > host {
                    return None;
                }
                let mut devices = vec![Dev { node, gpu: None }];
                devices.extend(kept.iter().map(|&i| Dev {
                    node,
                    gpu: Some(gpus[i]),
                }));
                return Some((e, devices));
            }
            // Take a layer from each GPU that does not fit.
            let before = counts.clone();
            for (device, &i) in report.devices[1..].iter().zip(&kept) {
                if !device.fits {
                    counts[i] = counts[i].saturating_sub(1);
                }
            }
            if counts == before {
                return None;
            }
        }
        None
    }

    fn cand(
        &self,
        fleet: &PlanFleet,
        v: usize,
        tier: Precision,
        family: Family,
        e: Arc<Estimate>,
        devices: Vec<Dev>,
    ) -> Cand {
        let reserve = e
            .devices
            .iter()
            .map(|d| with_margin(d.total, d.kind))
            .collect::<Vec<_>>();
        let mut speeds = Vec::with_capacity(devices.len());
        let mut degraded = 0;
        let mut gpus = 0;
        let mut card_bytes = 0u64;
        let mut nodes = BTreeSet::new();
        for (i, d) in devices.iter().enumerate() {
            nodes.insert(d.node);
            let stage = e.devices.get(i).map_or(0, |x| x.stage);
            match d.gpu {
                Some(p) => {
                    let g: &PlanGpu = &fleet.nodes[d.node].gpus[p];
                    gpus += 1;
                    degraded += u32::from(g.degraded);
                    card_bytes += g.total;
                    let peers = devices.iter().enumerate().filter(|(j, o)| {
                        *j != i && o.node == d.node && e.devices.get(*j).is_some_and(|x| x.stage == stage)
                    });
                    let nvlink = peers
                        .clone()
                        .all(|(_, o)| o.gpu.is_some_and(|q| g.nvlink & (1 << q) != 0));
                    speeds.push(DeviceSpeed {
                        node: d.node,
                        bandwidth: g.bandwidth * BANDWIDTH_EFFICIENCY,
                        extra_read: 0.0,
                        nvlink_stage: nvlink,
                        gpu: true,
                    });
                }
                None => {
                    // llama.cpp's output on the CPU reads the tied embedding in host RAM.
                    let tied_output = family == Family::Cpu
                        && matches!(e.engine, Engine::LlamaCpp(_))
                        && self.info.shape.tied_embeddings;
                    speeds.push(DeviceSpeed {
                        node: d.node,
                        bandwidth: fleet.nodes[d.node].host_bandwidth
                            * host_speed_factor(e.engine, self.info.variants[v].format() == WeightFormat::Gguf),
                        extra_read: if tied_output { e.host.get() as f64 } else { 0.0 },
                        nvlink_stage: false,
                        gpu: false,
                    });
                }
            }
        }
        let hops = hops(fleet, &e, &devices);
        // A speed measured on the node for this engine, variant and placement replaces
        // the model (only for a placement on one node).
        let measured = match devices.first() {
            Some(first) if nodes.len() == 1 => {
                let placement = speed_placement(family_name(family), devices.len());
                let variant = &self.info.variants[v].id;
                fleet.nodes[first.node]
                    .measured
                    .iter()
                    .find(|m| m.engine == e.engine.name() && m.variant == *variant && m.placement == placement)
                    .map(|m| m.tokens_per_s)
            }
            _ => None,
        };
        let tokens_per_s = measured.unwrap_or_else(|| tokens_per_second(&e, self.info.shape.hidden, &speeds, &hops));
        let parts = ScoreParts {
            tier,
            cpu: family == Family::Cpu,
            offload: family == Family::Offload,
            degraded,
            gpus,
            nodes: nodes.len() as u32,
            tokens_per_s,
            measured: measured.is_some(),
            card_gib: card_bytes >> 30,
        };
        // Only llama.cpp keeps RAM beside its devices (the token embedding), on the CPU too.
        let host_extra = e.host.get();
        Cand {
            variant: v,
            tier,
            family,
            score: parts.score(self.requirement.prefer),
            parts,
            estimate: e,
            devices,
            reserve,
            host_extra,
        }
    }

    /// Whether `cand` fits `state` (every device, and the host's extra).
    pub fn fits_in(&self, state: &State, cand: &Cand) -> bool {
        let mut used: HashMap<Dev, u64> = HashMap::new();
        for (d, r) in cand.devices.iter().zip(&cand.reserve) {
            *used.entry(*d).or_default() += r;
        }
        if let Some(node) = cand.host_node() {
            *used.entry(Dev { node, gpu: None }).or_default() += cand.host_extra;
        }
        used.iter().all(|(d, bytes)| {
            let free = match d.gpu {
                Some(p) => state.usable[d.node][p],
                None => state.host[d.node],
            };
            *bytes <= free
        })
    }

    /// The candidate for variant `v` on `devices` (in layout order) with `layout`, if
    /// it fits `state`: the estimate of the engine for the family (on the CPU the best of
    /// the built-in engine and, for GGUF, llama.cpp; llama.cpp for GGUF, vLLM for
    /// safetensors), as far as `engines:` allows, checked device by device. A
    /// placement of one's own choosing, scored like every candidate.
    pub fn evaluate(
        &self,
        fleet: &PlanFleet,
        state: &State,
        v: usize,
        family: Family,
        layout: Layout,
        devices: Vec<Dev>,
    ) -> Option<Cand> {
        let tier = self.allowed.iter().find(|(a, _)| *a == v)?.1;
        if family == Family::Cpu {
            // The best of the engines that may run it on the CPU.
            let mut found: Vec<Cand> = self
                .cpu_engines(v)
                .into_iter()
                .filter_map(|engine| {
                    self.evaluate_with(fleet, state, v, tier, engine, family, layout.clone(), devices.clone())
                })
                .collect();
            sort_cands(&mut found);
            return found.into_iter().next();
        }
        let engine = engine_for(self.info.variants[v].format());
        if !self.engine_allowed(engine) {
            return None;
        }
        self.evaluate_with(fleet, state, v, tier, engine, family, layout, devices)
    }

    /// [`Unit::evaluate`] with `engine`.
    #[allow(clippy::too_many_arguments)]
    fn evaluate_with(
        &self,
        fleet: &PlanFleet,
        state: &State,
        v: usize,
        tier: Precision,
        engine: Engine,
        family: Family,
        layout: Layout,
        devices: Vec<Dev>,
    ) -> Option<Cand> {
        let gpu_ok = devices
            .iter()
            .all(|d| d.gpu.is_none_or(|p| self.usable_gpu(fleet, state, v, d.node, p)));
        // Only llama.cpp offloads layers to host RAM; only the CPU family uses the host
        // alone.
        let host_ok = match family {
            Family::Cpu => self.cpu_allowed && devices.iter().all(|d| d.gpu.is_none()),
            Family::Offload => {
                self.info.variants[v].format() == WeightFormat::Gguf
                    && devices.first().is_some_and(|d| d.gpu.is_none())
                    && devices[1..].iter().all(|d| d.gpu.is_some())
            }
            _ => devices.iter().all(|d| d.gpu.is_some()),
        };
        if !gpu_ok || !host_ok {
            return None;
        }
        let e = self.estimate(v, engine, layout)?;
        if e.devices.len() != devices.len() {
            return None;
        }
        let cand = self.cand(fleet, v, tier, family, e, devices);
        self.fits_in(state, &cand).then_some(cand)
    }

    /// Bytes variant `v` (allowed or not) needs on one GPU with its fit margin, and
    /// its estimate; `None` when the engine cannot run it.
    pub fn single_need(&self, v: usize) -> Option<Need> {
        self.need(v, 1, None)
    }

    /// Whether GPU `p` of `node` meets the requirement's constraints.
    pub fn gpu_allowed(&self, fleet: &PlanFleet, node: usize, p: usize) -> bool {
        let c = &self.requirement.gpu;
        let g = &fleet.nodes[node].gpus[p];
        self.node_ok.as_ref().is_none_or(|ok| ok[node])
            && (self.models.is_empty() || {
                let name = g.name.to_ascii_lowercase();
                self.models.iter().any(|m| name.contains(m.as_str()))
            })
            && c.min_memory_bytes.is_none_or(|m| g.total >= m)
            && c.min_compute_capability.is_none_or(|m| {
                g.compute_capability
                    .is_none_or(|(a, b)| (a, b) >= (u32::from(m.major), u32::from(m.minor)))
            })
    }

    /// The preference in effect.
    pub fn prefer(&self) -> Preference {
        self.requirement.prefer
    }
}

/// The leading stages of `e` on the host CPU.
fn cpu_stages(e: &Estimate) -> usize {
    e.devices
        .iter()
        .filter(|d| d.kind == DeviceKind::Cpu)
        .map(|d| d.stage + 1)
        .max()
        .unwrap_or(0)
}

/// `need` and the margin of a device of `kind`.
fn with_margin(need: Bytes, kind: DeviceKind) -> u64 {
    need.get()
        .saturating_add(FitMargin::default_for(kind).for_need(need).get())
}

/// Whether every device's estimate plus margin fits its usable memory.
fn fits_with_reserve(e: &Estimate, usable: &[Bytes]) -> bool {
    fits(e, usable).is_ok_and(|r| r.fits)
}

/// What the network costs a candidate split across nodes, per token: the hops between
/// stages on different nodes, each one 16-bit hidden vector of activations (`hidden`
/// values) over the slower end's link plus its latency; `None` on one node.
pub fn network_cost(fleet: &PlanFleet, c: &Cand, hidden: u64) -> Option<NetworkCost> {
    let hops: Vec<Hop> = hops(fleet, &c.estimate, &c.devices).into_iter().flatten().collect();
    if hops.is_empty() {
        return None;
    }
    let bytes = hidden * 2;
    let seconds: f64 = hops
        .iter()
        .map(|h| h.latency_s + bytes as f64 * 8.0 / h.bits_per_s.max(1) as f64)
        .sum();
    Some(NetworkCost {
        hops: hops.len(),
        bytes_per_hop: bytes,
        slowest_bits_per_s: hops.iter().map(|h| h.bits_per_s).min().unwrap_or(0),
        seconds_per_token: seconds,
    })
}

/// See [`network_cost`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NetworkCost {
    /// Stage boundaries between nodes a token crosses.
    pub hops: usize,
    /// Activation bytes sent per hop and token.
    pub bytes_per_hop: u64,
    /// The slowest link crossed, bits/s.
    pub slowest_bits_per_s: u64,
    /// Time per token spent on the network.
    pub seconds_per_token: f64,
}

/// Network hops between consecutive stages.
fn hops(fleet: &PlanFleet, e: &Estimate, devices: &[Dev]) -> Vec<Option<Hop>> {
    let mut stage_nodes: Vec<usize> = Vec::new();
    for (d, dev) in e.devices.iter().zip(devices) {
        if stage_nodes.len() == d.stage {
            stage_nodes.push(dev.node);
        }
    }
    stage_nodes
        .windows(2)
        .map(|w| {
            (w[0] != w[1]).then(|| {
                let (a, b) = (&fleet.nodes[w[0]], &fleet.nodes[w[1]]);
                let latency_ms = match (a.rtt_ms, b.rtt_ms) {
                    // The path through the orchestrator bounds the direct one; half of it
                    // is one way.
                    (Some(x), Some(y)) => (x + y) / 2.0,
                    _ => 0.1,
                };
                Hop {
                    bits_per_s: a.network_bps.min(b.network_bps),
                    latency_s: latency_ms / 1000.0,
                }
            })
        })
        .collect()
}

/// Subsets of `k` GPUs of one model among `eligible` with at least `need` usable each:
/// every distinct one on a small node, else the best fit (healthy first, smallest cards,
/// least free) and the best NVLink-connected one.
fn tp_groups(gpus: &[PlanGpu], cur: &[u64], eligible: &[usize], k: usize, need: u64) -> Vec<Vec<usize>> {
    let mut by_name: Vec<(&str, Vec<usize>)> = Vec::new();
    for &p in eligible.iter().filter(|&&p| cur[p] >= need) {
        match by_name.iter_mut().find(|(n, _)| *n == gpus[p].name) {
            Some((_, list)) => list.push(p),
            None => by_name.push((&gpus[p].name, vec![p])),
        }
    }
    let mut out = Vec::new();
    for (_, list) in by_name {
        if list.len() < k {
            continue;
        }
        if list.len() <= EXHAUSTIVE_NODE_GPUS {
            // Subsets alike in everything the score and the fit read (memory, health,
            // speed, whether all are NVLinked) give equal candidates: the first stands
            // for all, as `dedupe` would keep it. A subset's shape is how many of its GPUs
            // are of each kind (memory, health, speed): four bits per kind, at most eight
            // kinds of at most eight GPUs, and a bit for the links.
            let mut kinds: Vec<(u64, bool, u64)> = Vec::new();
            let mut kind_of = [0u32; 64];
            for &p in &list {
                let kind = (cur[p], gpus[p].degraded, gpus[p].bandwidth.to_bits());
                kind_of[p] = match kinds.iter().position(|x| *x == kind) {
                    Some(i) => i as u32,
                    None => {
                        kinds.push(kind);
                        kinds.len() as u32 - 1
                    }
                };
            }
            let mut seen: Vec<u64> = Vec::new();
            for_each_subset(&list, k, &mut |s| {
                let mut counts = 0u64;
                let mut mask = 0u64;
                for &p in s {
                    counts += 1 << (4 * kind_of[p]);
                    mask |= 1 << p;
                }
                let linked = s.iter().all(|&a| (gpus[a].nvlink | 1 << a) & mask == mask);
                let shape = counts << 1 | u64::from(linked);
                if !seen.contains(&shape) {
                    seen.push(shape);
                    out.push(s.to_vec());
                }
            });
        } else {
            let mut sorted = list.clone();
            sorted.sort_by_key(|&p| (gpus[p].degraded, gpus[p].total, cur[p], p));
            out.push(sorted[..k].to_vec());
            if let Some(clique) = nvlink_clique(gpus, &sorted, k) {
                out.push(clique);
            }
        }
    }
    out
}

/// A set of `k` GPUs all linked to each other, built greedily in `order`.
fn nvlink_clique(gpus: &[PlanGpu], order: &[usize], k: usize) -> Option<Vec<usize>> {
    for &start in order {
        let mut clique = vec![start];
        for &p in order {
            if p != start && clique.iter().all(|&q| gpus[q].nvlink & (1 << p) != 0) {
                clique.push(p);
                if clique.len() == k {
                    clique.sort_unstable();
                    return Some(clique);
                }
            }
        }
    }
    None
}

/// Calls `f` with every `k`-subset of `items`, in lexicographic order.
pub fn for_each_subset<T: Copy>(items: &[T], k: usize, f: &mut impl FnMut(&[T])) {
    fn go<T: Copy>(items: &[T], k: usize, start: usize, acc: &mut Vec<T>, f: &mut impl FnMut(&[T])) {
        if acc.len() == k {
            f(acc);
            return;
        }
        for i in start..items.len() {
            if items.len() - i < k - acc.len() {
                break;
            }
            acc.push(items[i]);
            go(items, k, i + 1, acc, f);
            acc.pop();
        }
    }
    if k <= items.len() {
        go(items, k, 0, &mut Vec::with_capacity(k), f);
    }
}

/// Drops candidates equal to an earlier one up to interchangeable GPUs (same model, same
/// state, same links): keeps the first of each.
fn dedupe(fleet: &PlanFleet, state: &State, cands: &mut Vec<Cand>) {
    let mut seen = BTreeSet::new();
    cands.retain(|c| {
        let mut shape: Vec<(u64, u64, Option<usize>)> = c
            .devices
            .iter()
            .map(|d| match d.gpu {
                Some(p) => {
                    let g = &fleet.nodes[d.node].gpus[p];
                    // Links matter through the score (NVLink speed); the class without the
                    // position keeps identical GPUs interchangeable.
                    (g.total ^ g.bandwidth.to_bits(), state.usable[d.node][p], Some(d.node))
                }
                None => (0, state.host[d.node], Some(d.node)),
            })
            .collect();
        if c.family == Family::Single || c.family == Family::TensorParallel {
            shape.sort_unstable();
        }
        seen.insert((c.variant, c.family, c.score, shape, c.estimate.layout.tensor_parallel))
    });
}
