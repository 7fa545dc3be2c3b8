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
//! Which engine runs a variant, and which of the families above it can take, is asked of
//! the engine ([`Engine::for_gpus`], [`Engine::tensor_parallel`], [`Engine::layer_split`],
//! [`Engine::across_nodes`], [`Engine::host_offload`], [`Engine::for_cpu`]), not read off
//! the weight format.
//!
//! Candidates on a node depend only on the node's state, so they are computed once per
//! distinct state (a signature of its GPUs and free memory) and shared by every node in
//! that state: a thousand identical nodes cost one.

//! The rooms: [`cand`] (candidates and their lazy merge), [`state`] (free memory and
//! node signatures), `cache` (what a unit keeps), `generate` (candidate generation),
//! [`topology`] (tensor-parallel groups, NVLink, the network).

mod cache;
pub mod cand;
mod generate;
pub mod state;
pub mod topology;

use std::collections::HashMap;
use std::rc::Rc;
use std::sync::Arc;

use skein_dsl::ir::{EngineChoice, ModelRequirement, Precision, Preference};
use skein_model_registry::Bytes;
use skein_model_registry::catalog::ModelInfo;
use skein_model_registry::catalog::fit::engine_for;
use skein_model_registry::estimate::{
    AdapterSize, DeviceKind, Engine, Estimate, EstimateRequest, FitMargin, KvDtype, Layout, estimate,
};

use cache::{ComputeCapability, List};
pub use cache::{Need, UnitCache};
pub use cand::{Cand, CandList, Dev, Family, sort_cands, speed_placement};
pub use state::State;
pub use topology::{NetworkCost, for_each_subset, network_cost};

use super::demand::{Instance, VariantUse, min_compute_capability, variant_use};
use super::fleet::PlanFleet;

/// Nodes with at most this many usable GPUs have every subset of them considered for
/// tensor parallelism; larger nodes, the best-fitting ones by rule.
pub const EXHAUSTIVE_NODE_GPUS: usize = 8;
/// Nodes with at most this many usable GPUs have a layer split over every subset of them
/// considered (each split costs an estimate); larger nodes, the prefixes by memory, and
/// only with fewer GPUs than any one-GPU or tensor-parallel candidate.
pub const EXHAUSTIVE_SPLIT_GPUS: usize = 4;
/// Fleets with at most this many usable GPUs have every cross-node subset considered;
/// larger fleets, nodes by capacity (and, up to [`FLEET_WIDE_SPLIT_GPUS`], the fleet's
/// best GPUs wherever they are).
pub const EXHAUSTIVE_FLEET_GPUS: usize = 8;
/// Fleets with at most this many usable GPUs also have, across nodes, splits of any size
/// considered: the fewest of the fleet's GPUs with the most memory (also without each of
/// them in turn, and without the one or two largest), and the fewest of its fastest GPUs,
/// whatever nodes they are on. Whole nodes by capacity miss the best GPUs of several
/// nodes, and a split that leaves a large GPU free can let another replica use it
/// (`orchestrator/tests/plan_oracle.rs` found both).
pub const FLEET_WIDE_SPLIT_GPUS: usize = 64;

/// One replica of an instance, with everything its candidates need.
pub struct Unit<'a> {
    /// The model.
    pub info: &'a ModelInfo,
    /// The (combined) requirement.
    pub requirement: &'a ModelRequirement,
    /// The LoRA adapters it serves besides its base model.
    pub adapters: &'a [AdapterSize],
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

/// A fleet and what is free on it: where a unit's candidates are looked for.
#[derive(Clone, Copy)]
pub struct FleetState<'p> {
    /// The fleet.
    pub fleet: &'p PlanFleet,
    /// Its free memory, as the plan so far reserves it.
    pub state: &'p State,
}

impl<'p> FleetState<'p> {
    /// `state` on `fleet`.
    pub fn new(fleet: &'p PlanFleet, state: &'p State) -> FleetState<'p> {
        FleetState { fleet, state }
    }
}

impl<'a> Unit<'a> {
    /// A replica serving `concurrency` sequences, with `cache`: a new one, or what an
    /// earlier unit alike in every argument but the fleet computed.
    pub fn new(
        info: &'a ModelInfo,
        instance: &'a Instance,
        concurrency: u64,
        kv_dtype: KvDtype,
        fleet: &PlanFleet,
        cache: Rc<UnitCache>,
    ) -> Unit<'a> {
        let (requirement, adapters, max_gpus) = (&instance.requirement, &instance.adapter_sizes, instance.max_gpus);
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
            adapters,
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

    /// Whether the requirement's `engines:` allows `engine` (any when it names none).
    pub fn engine_allowed(&self, engine: Engine) -> bool {
        let choice = match engine {
            Engine::Candle(_) => EngineChoice::Builtin,
            Engine::LlamaCpp(_) => EngineChoice::LlamaCpp,
            Engine::Vllm(_) => EngineChoice::Vllm,
        };
        self.requirement.engines.is_empty() || self.requirement.engines.contains(&choice)
    }

    /// The engine that runs variant `v` on GPUs ([`engine_for`] its format), if the
    /// requirement allows it.
    fn gpu_engine(&self, v: usize) -> Option<Engine> {
        engine_for(self.info.variants[v].format()).filter(|e| self.engine_allowed(*e))
    }

    /// Whether variant `v` may go on GPUs: its engine there is allowed.
    fn gpu_engine_allowed(&self, v: usize) -> bool {
        self.gpu_engine(v).is_some()
    }

    /// The engines that may run variant `v` on the CPU alone ([`Engine::for_cpu`]: the
    /// built-in one for the architectures it implements, and llama.cpp for GGUF), those
    /// the requirement allows.
    pub fn cpu_engines(&self, v: usize) -> Vec<Engine> {
        let variant = &self.info.variants[v];
        Engine::for_cpu(variant.format())
            .filter(|e| !e.builtin() || self.info.builtin_engine_loads(variant))
            .filter(|e| self.engine_allowed(*e))
            .collect()
    }

    fn usable_gpu(&self, at: FleetState<'_>, v: usize, node: usize, p: usize) -> bool {
        let cc = min_compute_capability(&self.info.variants[v]);
        self.usable_with(at, cc, node, p)
    }

    /// Whether GPU `p` of `node` has memory left, compute capability `cc` at least, and
    /// meets the requirement.
    fn usable_with(&self, at: FleetState<'_>, cc: ComputeCapability, node: usize, p: usize) -> bool {
        let FleetState { fleet, state } = at;
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
    pub fn best(&self, at: FleetState<'_>) -> Option<Cand> {
        match self.gpu_candidates(at).first() {
            Some(c) => Some(c),
            None => self.last_resorts(at).first(),
        }
    }

    /// The best candidate counting splits across nodes for every variant too: its score
    /// bounds what the unit can reach in any later state (reserving memory only removes
    /// candidates, and a split's partition follows the memory free, so a later state
    /// may have splits the candidates of this one leave out).
    pub fn best_bound(&self, at: FleetState<'_>) -> Option<Cand> {
        let gpu = self.gpu_candidates(at).first();
        let cross = self.cross_node_bound(at).first();
        // The first of both sorted together (stably, the one-node list first).
        let best = match (gpu, cross) {
            (Some(a), Some(b)) => Some(if b.score > a.score || (b.score == a.score && b.key() < a.key()) {
                b
            } else {
                a
            }),
            (a, b) => a.or(b),
        };
        best.or_else(|| self.last_resorts(at).first())
    }

    /// The candidates on GPUs (one node or several), best first.
    pub fn gpu_candidates(&self, at: FleetState<'_>) -> Arc<CandList> {
        self.memoized(List::Gpu, at.state, || self.compute_gpu_candidates(at))
    }

    /// Splits across nodes for every variant, best first: what
    /// [`best_bound`](Self::best_bound) counts besides the candidates.
    fn cross_node_bound(&self, at: FleetState<'_>) -> Arc<CandList> {
        let FleetState { fleet, state } = at;
        self.memoized(List::CrossNodeBound, state, || {
            let mut out = Vec::new();
            if fleet.nodes.len() > 1 {
                for &(v, tier) in self.allowed.iter().filter(|(v, _)| self.gpu_engine_allowed(*v)) {
                    out.extend(self.cross_node(at, v, tier, usize::MAX));
                }
            }
            CandList::sorted(out)
        })
    }

    /// The last resorts (layers in host RAM, the CPU), best first. Their penalties put
    /// them below every candidate on GPUs, so a search computes them only once it has
    /// tried every one of those.
    pub fn last_resorts(&self, at: FleetState<'_>) -> Arc<CandList> {
        let state = at.state;
        self.memoized(List::LastResorts, state, || {
            // The last resorts are candidates in every state: the objective's penalties
            // keep them for when the GPUs cannot hold every instance, and which instance
            // goes to host RAM is then the search's choice, not the order it visits them
            // in.
            let lists = state
                .representatives(self.allowed_nodes())
                .into_iter()
                .map(|(sig, node)| {
                    let fallback = self.cached(&self.cache.fallback, sig, || self.fallback(at, node));
                    (fallback, Some(node))
                })
                .collect();
            CandList::merge(lists)
        })
    }

    fn compute_gpu_candidates(&self, at: FleetState<'_>) -> CandList {
        let FleetState { fleet, state } = at;
        let reps = state.representatives(self.allowed_nodes());
        let mut lists = Vec::with_capacity(reps.len() + 1);
        // Per variant, the fewest GPUs of a candidate on one node.
        let mut smallest = vec![usize::MAX; self.info.variants.len()];
        for &(sig, node) in &reps {
            let local = self.cached(&self.cache.local, sig, || self.local(at, node));
            let fewest = self.fewest_gpus(sig, &local);
            for (s, f) in smallest.iter_mut().zip(fewest.iter()) {
                *s = (*s).min(*f);
            }
            lists.push((local, Some(node)));
        }
        if fleet.nodes.len() > 1 {
            // Across nodes: on a fleet of up to `FLEET_WIDE_SPLIT_GPUS` splits of every
            // size (more GPUs may be faster ones, or leave a larger one to another
            // replica); otherwise only with fewer GPUs than any one-node candidate.
            let uncapped = fleet.nodes.iter().map(|n| n.gpus.len()).sum::<usize>() <= FLEET_WIDE_SPLIT_GPUS;
            let mut cross = Vec::new();
            for &(v, tier) in self.allowed.iter().filter(|(v, _)| self.gpu_engine_allowed(*v)) {
                let cap = if uncapped {
                    usize::MAX
                } else {
                    smallest[v].saturating_sub(1)
                };
                if cap >= 2 {
                    cross.extend(self.cross_node(at, v, tier, cap));
                }
            }
            sort_cands(&mut cross);
            lists.push((Arc::new(cross), None));
        }
        CandList::merge(lists)
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
        at: FleetState<'_>,
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
                .filter_map(|engine| self.evaluate_with(at, v, tier, engine, family, layout.clone(), devices.clone()))
                .collect();
            sort_cands(&mut found);
            return found.into_iter().next();
        }
        let engine = if family == Family::Offload {
            Engine::for_offload(self.info.variants[v].format()).find(|e| self.engine_allowed(*e))?
        } else {
            self.gpu_engine(v)?
        };
        self.evaluate_with(at, v, tier, engine, family, layout, devices)
    }

    /// [`Unit::evaluate`] with `engine`.
    #[allow(clippy::too_many_arguments)]
    fn evaluate_with(
        &self,
        at: FleetState<'_>,
        v: usize,
        tier: Precision,
        engine: Engine,
        family: Family,
        layout: Layout,
        devices: Vec<Dev>,
    ) -> Option<Cand> {
        let FleetState { fleet, state } = at;
        let gpu_ok = devices
            .iter()
            .all(|d| d.gpu.is_none_or(|p| self.usable_gpu(at, v, d.node, p)));
        // Only an engine with host offload keeps layers in host RAM; only the CPU family
        // uses the host alone.
        let host_ok = match family {
            Family::Cpu => self.cpu_allowed && devices.iter().all(|d| d.gpu.is_none()),
            Family::Offload => {
                engine.host_offload()
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
