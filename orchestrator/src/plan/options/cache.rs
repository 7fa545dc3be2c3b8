//! What a unit keeps between the questions of a plan and across plans: estimates, the
//! candidates of each node state, the node states ranked for splits, and the candidate
//! lists of recent fleet states.

use std::cell::RefCell;
use std::sync::Arc;

use skein_model_registry::catalog::fit::engine_for;
use skein_model_registry::estimate::{DeviceKind, Engine, Estimate, EstimateRequest, Layout, Stages, estimate};

use super::cand::{Cand, CandList};
use super::state::State;
use super::{FleetState, Unit, with_margin};
use crate::plan::fastmap::FastMap;

/// An estimate and the bytes each device must have for it.
#[derive(Debug, Clone)]
pub struct Need {
    /// The estimate.
    pub estimate: Arc<Estimate>,
    /// The largest device's need plus its fit margin, bytes.
    pub bytes: u64,
}

/// A [`Need`]'s key: the variant, the tensor-parallel degree, and the engine on the CPU
/// (`None` on GPUs).
type NeedKey = (usize, u64, Option<&'static str>);

/// A distinct node state a split may use nodes of.
pub(super) struct RankedState {
    /// The GPUs a variant can use on its nodes.
    pub(super) eligible: Arc<[usize]>,
    /// Its signature.
    pub(super) sig: u32,
    /// Its first node (by position) a split may use.
    pub(super) first: usize,
    /// How many of its nodes, from `first` on in position order, a split may use.
    pub(super) count: usize,
}

/// The nodes a split may use, best first — by capacity (the usable memory of the GPUs it
/// may use), then by position — each with those GPUs. Kept per node state and expanded
/// into nodes only as far as a split reads: on a large fleet that is a few nodes of the
/// best states.
pub(super) struct NodeRanking<'s> {
    state: &'s State,
    allowed: Option<&'s [bool]>,
    states: Arc<RankedStates>,
    /// States already expanded into `ranked`.
    expanded: usize,
    /// (capacity, node, its eligible GPUs), best first, as far as expanded.
    ranked: Vec<(u64, usize, Arc<[usize]>)>,
    /// Nodes in all.
    pub(super) nodes: usize,
    /// Eligible GPUs in all.
    pub(super) gpus: usize,
}

/// Node states with their capacity, largest first.
pub(super) struct RankedStates(Vec<(u64, RankedState)>);

impl RankedStates {
    pub(super) fn new(state: &State, states: impl IntoIterator<Item = RankedState>) -> RankedStates {
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
    pub(super) fn new(state: &'s State, allowed: Option<&'s [bool]>, states: Arc<RankedStates>) -> NodeRanking<'s> {
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
    pub(super) fn get(&mut self, i: usize) -> Option<(u64, usize, Arc<[usize]>)> {
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
    pub(super) local: RefCell<FastMap<u32, Arc<Vec<Cand>>>>,
    pub(super) fallback: RefCell<FastMap<u32, Arc<Vec<Cand>>>>,
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
    pub(super) fn follow(&self, state: &State) {
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
pub(super) type ComputeCapability = (u32, u32);

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
pub(super) enum List {
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
    pub(super) fn request(&self, engine: Engine, layout: Layout, cpu_stages: usize) -> EstimateRequest {
        EstimateRequest::new(engine, u64::from(self.requirement.context))
            .with_concurrency(self.concurrency)
            .with_kv_dtype(self.kv_dtype)
            .with_layout(layout)
            .with_cpu_stages(cpu_stages)
            .with_adapters(self.adapters.to_vec())
            .without_details()
    }

    /// The estimate of variant `v` on `layout` with GPUs only, or `None` if the engine
    /// cannot run it.
    pub(super) fn estimate(&self, v: usize, engine: Engine, layout: Layout) -> Option<Arc<Estimate>> {
        self.estimate_on(v, engine, layout, 0)
    }

    /// The estimate of variant `v` on `layout` whose first `cpu_stages` stages are on the
    /// host CPU, or `None` if the engine cannot run it.
    pub(super) fn estimate_on(
        &self,
        v: usize,
        engine: Engine,
        layout: Layout,
        cpu_stages: usize,
    ) -> Option<Arc<Estimate>> {
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

    /// The estimate of `v` on one GPU (`k == 1`) or tensor parallel over `k`, or with
    /// `cpu`'s engine on the CPU, with the bytes each device must have (the largest need
    /// plus margin); cached.
    pub(super) fn need(&self, v: usize, k: u64, cpu: Option<Engine>) -> Option<Need> {
        let key = (v, k, cpu.map(|e| e.name()));
        if let Some(hit) = self.cache.needs.borrow().get(&key) {
            return hit.clone();
        }
        let engine = match cpu {
            Some(engine) => engine,
            None => engine_for(self.info.variants[v].format())?,
        };
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
                Need {
                    estimate: e,
                    bytes: with_margin(need, kind),
                }
            });
        self.cache.needs.borrow_mut().insert(key, result.clone());
        result
    }

    /// The list `make` computes for `state`, or the one it computed before for the
    /// same state of the same fleet.
    pub(super) fn memoized(&self, list: List, state: &State, make: impl FnOnce() -> CandList) -> Arc<CandList> {
        self.cache.follow(state);
        if let Some(hit) = self.cache.memo.borrow().get(list, state) {
            return hit;
        }
        let made = Arc::new(make());
        self.cache.memo.borrow_mut().put(list, state, made.clone());
        made
    }

    /// Per variant, the fewest GPUs of a candidate in `local` (the candidates of the
    /// node state `sig`).
    pub(super) fn fewest_gpus(&self, sig: u32, local: &[Cand]) -> Arc<[usize]> {
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

    pub(super) fn cached(
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

    /// The node states whose GPUs a variant needing compute capability `cc` can use,
    /// largest capacity first, with the first few nodes of each: nodes in one state are
    /// interchangeable and a split spans at most `max_gpus` of them, so those are every
    /// node a split can use first. Made once per state for all variants alike.
    pub(super) fn ranked_states(&self, at: FleetState<'_>, cc: ComputeCapability) -> Arc<RankedStates> {
        let mut memo = self.cache.rankings.borrow_mut();
        if memo.epoch != at.state.epoch || memo.sig != at.state.sig {
            memo.epoch = at.state.epoch;
            memo.sig.clone_from(&at.state.sig);
            memo.by_cc.clear();
        }
        if let Some((_, hit)) = memo.by_cc.iter().find(|(c, _)| *c == cc) {
            return hit.clone();
        }
        let states = at
            .state
            .states(self.max_gpus, self.allowed_nodes())
            .filter_map(|(sig, first, count)| {
                let eligible = self.eligible(at, cc, sig, first);
                (!eligible.is_empty()).then_some(RankedState {
                    eligible,
                    sig,
                    first,
                    count,
                })
            });
        let made = Arc::new(RankedStates::new(at.state, states));
        memo.by_cc.push((cc, made.clone()));
        made
    }

    /// The GPUs of `node` (in the state `sig`) a variant needing compute capability
    /// `cc` can use, in position order; the same for every node of that state the
    /// requirement allows.
    pub(super) fn eligible(&self, at: FleetState<'_>, cc: ComputeCapability, sig: u32, node: usize) -> Arc<[usize]> {
        if let Some(hit) = self.cache.eligible.borrow().get(&(sig, cc)) {
            return hit.clone();
        }
        let made: Arc<[usize]> = (0..at.fleet.nodes[node].gpus.len())
            .filter(|&p| self.usable_with(at, cc, node, p))
            .collect();
        self.cache.eligible.borrow_mut().insert((sig, cc), made.clone());
        made
    }
}
