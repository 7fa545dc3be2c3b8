//! The placement planner: for every agent of a workflow, which variant, engine, GPUs and
//! split, and why. Pure and deterministic: a function of the workflow, the models'
//! catalogs, a graph snapshot and the instances already running; no IO, no clock.
//!
//! - [`fleet`]: what each GPU and host can take (live free memory minus headroom).
//! - [`demand`]: agents grouped into model instances, and the variants each may use.
//! - [`options`]: candidate placements of one replica.
//! - `fastmap`: the hash map the planner's own integer keys use.
//! - [`score`]: the objective and the throughput model (`docs/placement.md`).
//! - [`search`]: the branch-and-bound search over replicas.
//! - [`explain`]: the reasons shown with a plan; `lora`: the adapters a replica serves
//!   and what sharing its base saves.

pub mod demand;
pub mod explain;
mod fastmap;
pub mod fleet;
mod lora;
pub mod options;
pub mod score;
pub mod search;

use std::collections::BTreeMap;
use std::rc::Rc;
use std::sync::Arc;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use skein_dsl::ir::{Backend, ModelRequirement, Precision, Workflow};
use skein_model_registry::Bytes;
use skein_model_registry::ModelTask;
use skein_model_registry::adapter::AdapterInfo;
use skein_model_registry::catalog::ModelInfo;
use skein_model_registry::estimate::{AdapterSize, Estimate, KvDtype, llama_cpp_tensor_split};

use crate::graph::GraphSnapshot;
pub use demand::{Instance, model_key};
pub use fleet::{DEFAULT_HEADROOM, DEFAULT_HOST_HEADROOM, Excluded, FleetCache, Headroom, Held, PlanFleet};
pub use options::speed_placement;
use options::{Cand, Family, FleetState, State, Unit, UnitCache};

/// How the planner works; the defaults suit a shared lab fleet.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct PlanSettings {
    /// Kept free on every GPU.
    pub headroom: Headroom,
    /// Kept free on every host, bytes.
    pub host_headroom: u64,
    /// Whether instances of lower-priority workflows may be stopped to admit this one.
    pub allow_preemption: bool,
    /// KV-cache type for every engine.
    pub kv_dtype: KvDtype,
    /// Candidates the search may try after its first plan.
    pub search_budget: u64,
}

impl Default for PlanSettings {
    fn default() -> Self {
        PlanSettings {
            headroom: DEFAULT_HEADROOM,
            host_headroom: DEFAULT_HOST_HEADROOM,
            allow_preemption: false,
            kv_dtype: KvDtype::Auto,
            search_budget: 20_000,
        }
    }
}

/// A model instance already running (of another workflow), which a higher-priority
/// plan may preempt.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunningInstance {
    /// Its id.
    pub id: String,
    /// The workflow (run) it belongs to.
    pub workflow: String,
    /// That workflow's priority.
    pub priority: i32,
    /// Memory it holds, per GPU.
    pub gpus: Vec<HeldGpu>,
    /// Its owner's fair-share standing (`sharing::fair`): among instances of equal
    /// priority, those of the owner furthest over their share are preempted first.
    /// `None`: one who used nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub standing: Option<crate::base::Standing>,
}

/// Memory an instance holds on one GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeldGpu {
    /// Node name.
    pub node: String,
    /// GPU index.
    pub gpu: u32,
    /// Bytes.
    pub bytes: u64,
}

/// Everything a plan is a function of.
#[derive(Debug, Clone, Copy)]
pub struct PlanInput<'a> {
    /// The workflow.
    pub workflow: &'a Workflow,
    /// Each model's catalog, by [`model_key`].
    pub models: &'a BTreeMap<String, ModelInfo>,
    /// Each LoRA adapter agents name, by [`demand::pin_key`] ([`NO_ADAPTERS`] when
    /// none does).
    pub adapters: &'a BTreeMap<String, AdapterInfo>,
    /// The fleet now.
    pub graph: &'a GraphSnapshot,
    /// Instances of other workflows.
    pub running: &'a [RunningInstance],
    /// Settings.
    pub settings: PlanSettings,
}

/// No adapters: a [`PlanInput::adapters`] for workflows that name none.
pub static NO_ADAPTERS: BTreeMap<String, AdapterInfo> = BTreeMap::new();

/// Why no plan could be made at all.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    /// A model's catalog was not given.
    #[error("no catalog for {}: inspect these models first", .0.join(", "))]
    MissingModels(Vec<String>),
    /// The agents' LoRA adapters cannot be served as named.
    #[error(transparent)]
    Adapters(#[from] demand::AdapterPlanError),
    /// A step prompts an agent whose model only embeds.
    #[error(
        "step `{step}` prompts agent `{agent}`, but its model {model} is an embedding model: it answers \
         POST /v1/embeddings, not prompts; give the step an agent on a chat model"
    )]
    PromptsEmbedder {
        /// The step.
        step: String,
        /// Its agent.
        agent: String,
        /// The agent's model.
        model: String,
    },
}

/// A plan: where every instance goes, or why the workflow waits.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Plan {
    /// The workflow.
    pub workflow: String,
    /// Its priority.
    pub priority: i32,
    /// The graph version planned against.
    pub graph_version: u64,
    /// Whether every instance is placed (the workflow starts whole, or not at all).
    pub admitted: bool,
    /// Why it waits, when not admitted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queued_reason: Option<String>,
    /// Placed replicas.
    pub instances: Vec<PlannedInstance>,
    /// Agents served by remote endpoints (nothing to place).
    pub remote: Vec<RemoteAgent>,
    /// Replicas that could not be placed, with the reason.
    pub unplaced: Vec<Unplaced>,
    /// Instances of lower-priority workflows this plan stops.
    pub preempted: Vec<Preempted>,
    /// GPUs and nodes left out of planning.
    pub excluded: Vec<Excluded>,
    /// The objective reached.
    pub objective: Objective,
    /// How the search went.
    pub search: SearchStats,
    /// The settings used.
    pub settings: PlanSettings,
}

/// The objective's value: replicas placed, then the sum of their scores.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Objective {
    /// Replicas placed.
    pub placed: usize,
    /// Sum of scores.
    #[serde(serialize_with = "as_string", deserialize_with = "from_string")]
    pub score: i128,
}

fn as_string<S: Serializer>(value: &i128, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&value.to_string())
}

fn from_string<'de, D: Deserializer<'de>>(d: D) -> Result<i128, D::Error> {
    let text = String::deserialize(d)?;
    text.parse().map_err(serde::de::Error::custom)
}

/// How the search went.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SearchStats {
    /// Candidates tried.
    pub steps: u64,
    /// Whether it ran to the end, so the plan is the best there is; otherwise the best
    /// found within the budget.
    pub complete: bool,
}

/// An agent served by a remote endpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemoteAgent {
    /// Agent name.
    pub agent: String,
    /// Endpoint URL.
    pub url: String,
    /// Model name sent.
    pub model: String,
}

/// A replica that could not be placed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Unplaced {
    /// Instance name.
    pub instance: String,
    /// Its agents.
    pub agents: Vec<String>,
    /// Replica number (1-based).
    pub replica: u32,
    /// Why, with figures.
    pub reason: String,
}

/// An instance this plan stops.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Preempted {
    /// Its id.
    pub id: String,
    /// Its workflow.
    pub workflow: String,
    /// Its priority.
    pub priority: i32,
    /// Memory it frees, bytes.
    pub frees: u64,
    /// Its owner's fair-share standing, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub standing: Option<crate::base::Standing>,
}

/// One placed replica.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PlannedInstance {
    /// Instance name (its agents joined by `+`).
    pub instance: String,
    /// Its agents.
    pub agents: Vec<String>,
    /// The model repository.
    pub model: String,
    /// Replica number (1-based) and how many there are.
    pub replica: u32,
    /// Replicas of the instance.
    pub replicas: u32,
    /// Context tokens per sequence.
    pub context: u64,
    /// Sequences this replica serves.
    pub concurrency: u64,
    /// The variant (`owner/name` or `owner/name:file.gguf`).
    pub variant: String,
    /// Its precision tier.
    pub precision: Precision,
    /// Its quantization.
    pub quantization: String,
    /// `vllm`, `llama.cpp` or `candle`.
    pub engine: String,
    /// How the model is placed.
    pub family: String,
    /// The split.
    pub layout: PlannedLayout,
    /// Each device, in layout order.
    pub devices: Vec<PlannedDevice>,
    /// Modelled decode speed of one sequence.
    pub tokens_per_s: f64,
    /// Offloaded to host RAM or on the CPU: slow.
    pub slow: bool,
    /// Its score.
    pub score: i64,
    /// Why this choice.
    pub why: Vec<String>,
    /// The best two candidates not taken, and why.
    pub rejected: Vec<Rejected>,
    /// The LoRA adapters it serves besides its base model, and to which agents.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub adapters: Vec<PlannedAdapter>,
    /// What the model is served for: an embedding model's engine starts in pooling
    /// mode and answers `POST /v1/embeddings` (not written for text generation).
    #[serde(default, skip_serializing_if = "ModelTask::is_generate")]
    pub task: ModelTask,
    /// The memory estimate it was planned with (not read back from JSON).
    #[serde(skip_deserializing, skip_serializing_if = "Option::is_none")]
    pub estimate: Option<Arc<Estimate>>,
}

/// A LoRA adapter a replica serves.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlannedAdapter {
    /// The name requests select it by: the workflow's pin (`owner/name`, with
    /// `@revision` and `:file` when given). vLLM serves it under this model name.
    pub name: String,
    /// Its repository.
    pub repo: String,
    /// The commit it was read at.
    pub sha: String,
    /// `peft` (vLLM `--lora-modules`) or `gguf` (llama.cpp `--lora`).
    pub format: String,
    /// The files the engine loads: the PEFT config and weights, or the GGUF file.
    pub files: Vec<String>,
    /// Its largest rank.
    pub rank: u64,
    /// The agents served with it.
    pub agents: Vec<String>,
}

/// The split of a replica, as engines take it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PlannedLayout {
    /// GPUs per pipeline stage (vLLM `--tensor-parallel-size`).
    pub tensor_parallel: u64,
    /// Pipeline stages (vLLM `--pipeline-parallel-size`).
    pub pipeline_stages: usize,
    /// Decoder layers per stage (vLLM's explicit layer partition).
    pub layer_partition: Vec<u64>,
    /// llama.cpp `--tensor-split`, one entry per GPU in llama.cpp's device order, when it
    /// splits layers: not the layer counts (llama.cpp counts the output as one more slot)
    /// but the split that places exactly them (`llama_cpp_tensor_split`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tensor_split: Vec<u64>,
    /// llama.cpp `-ngl` when some layers stay in host RAM: the GPU stages' layers plus
    /// one for the output layer (llama.cpp offloads the *last* layers).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_layers: Option<u64>,
    /// vLLM `--kv-cache-memory-bytes`: the largest KV cache the estimate sized for one
    /// GPU (its sequences' blocks) plus vLLM's null block. vLLM gives every worker this
    /// one size and cuts each to the blocks of the worker with fewest, so each gets the
    /// cache the plan sized for it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_cache_bytes: Option<u64>,
}

/// One device of a replica.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlannedDevice {
    /// Node name.
    pub node: String,
    /// GPU index; `None` for the host CPU and RAM.
    pub gpu: Option<u32>,
    /// Device name.
    pub name: String,
    /// Pipeline stage.
    pub stage: usize,
    /// Rank in the stage.
    pub rank: u64,
    /// Decoder layers (`start..end`).
    pub layers: String,
    /// Estimated need, bytes.
    pub need: u64,
    /// Reserved (need and margin), bytes.
    pub reserved: u64,
    /// Usable before this plan, bytes.
    pub usable: u64,
}

/// A candidate not taken.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rejected {
    /// What it was.
    pub option: String,
    /// Why not.
    pub why: String,
}

/// Plans `input.workflow`: [`Planner::plan`] on a new planner.
///
/// Errors: [`PlanError::MissingModels`] when a model's catalog is missing.
pub fn plan(input: &PlanInput<'_>) -> Result<Plan, PlanError> {
    Planner::default().plan(input)
}

/// A planner that keeps what it computed for the next plan: the fleet view of every
/// node whose graph view did not change, the node states, and each replica's estimates
/// and candidates (by model, requirement and concurrency). Its plans are exactly those
/// of [`plan`]; a stream of plans against a live graph, where few nodes change between
/// two plans, costs a fraction of planning each afresh.
#[derive(Debug, Default)]
pub struct Planner {
    fleet: FleetCache,
    state: Option<State>,
    units: Vec<(UnitKey, UnitCache)>,
}

// A server shares one planner between its request threads.
const _: () = {
    const fn send<T: Send>() {}
    send::<Planner>();
};

/// Replica caches a planner keeps at most.
const KEPT_UNITS: usize = 64;

impl Planner {
    /// Plans `input.workflow` with the planner `shared` by a server's threads. A planner
    /// that panicked mid-plan may hold half-made caches: it starts afresh. Planning is
    /// CPU work under a lock: call it off the async workers (`spawn_blocking`).
    ///
    /// Errors: as [`Planner::plan`].
    pub fn plan_shared(shared: &std::sync::Mutex<Planner>, input: &PlanInput<'_>) -> Result<Plan, PlanError> {
        let mut planner = shared.lock().unwrap_or_else(|poisoned| {
            shared.clear_poison();
            let mut guard = poisoned.into_inner();
            *guard = Planner::default();
            guard
        });
        planner.plan(input)
    }

    /// Plans `input.workflow`.
    ///
    /// Errors: [`PlanError::MissingModels`] when a model's catalog is missing.
    pub fn plan(&mut self, input: &PlanInput<'_>) -> Result<Plan, PlanError> {
        let mut instances = demand::instances(input.workflow);
        demand::attach_adapters(&mut instances, input.adapters)?;
        let infos = demand::catalogs(&instances, input.models).map_err(PlanError::MissingModels)?;
        demand::check_prompts(input.workflow, &instances, &infos)?;
        let s = &input.settings;
        let fleet = self.fleet.fleet(input.graph, s.headroom, s.host_headroom);
        let mut state = match self.state.take() {
            Some(mut state) => {
                if state.sync(&fleet) {
                    state
                } else {
                    State::new(&fleet)
                }
            }
            None => State::new(&fleet),
        };
        let mut caches = UnitCaches {
            entries: std::mem::take(&mut self.units)
                .into_iter()
                .map(|(k, c)| (k, Rc::new(c)))
                .collect(),
        };
        let first = plan_on(input, &instances, &infos, &fleet, &mut state, &mut caches);
        let mut plan = if !first.admitted && s.allow_preemption {
            match preempting(input, &instances, &infos) {
                Some((fleet, state, planned, preempted)) => {
                    let mut plan = explain::render(input, &instances, &infos, &fleet, &state, &planned);
                    plan.preempted = preempted;
                    plan
                }
                None => explain::render(input, &instances, &infos, &fleet, &state, &first),
            }
        } else {
            explain::render(input, &instances, &infos, &fleet, &state, &first)
        };
        let priority = input.workflow.placement.priority;
        if !s.allow_preemption
            && input.running.iter().any(|r| r.priority < priority)
            && let Some(reason) = &mut plan.queued_reason
        {
            reason.push_str("; lower-priority instances are running: allow preemption to reclaim their GPUs");
        }
        drop(first);
        // Most recently used last; the oldest go past the limit.
        let mut kept: Vec<(UnitKey, UnitCache)> = caches
            .entries
            .into_iter()
            .filter_map(|(k, c)| Rc::into_inner(c).map(|c| (k, c)))
            .collect();
        kept.drain(..kept.len().saturating_sub(KEPT_UNITS));
        self.units = kept;
        self.state = Some(state);
        Ok(plan)
    }
}

/// What a replica's computations are a function of, beside the fleet.
#[derive(Debug, Clone, PartialEq)]
struct UnitKey {
    info: ModelInfo,
    requirement: ModelRequirement,
    adapters: Vec<AdapterSize>,
    concurrency: u64,
    max_gpus: Option<u32>,
    kv: KvDtype,
}

/// The caches of one plan's replicas: replicas alike share one, and a [`Planner`] hands
/// over those it kept. Most recently used last.
#[derive(Default)]
pub struct UnitCaches {
    entries: Vec<(UnitKey, Rc<UnitCache>)>,
}

impl UnitCaches {
    fn get(&mut self, info: &ModelInfo, instance: &Instance, concurrency: u64, kv: KvDtype) -> Rc<UnitCache> {
        let (requirement, adapters, max_gpus) = (&instance.requirement, &instance.adapter_sizes, instance.max_gpus);
        let found = self.entries.iter().rposition(|(k, _)| {
            k.concurrency == concurrency
                && k.max_gpus == max_gpus
                && k.kv == kv
                && k.requirement == *requirement
                && k.adapters == *adapters
                && k.info == *info
        });
        let entry = match found {
            Some(i) => self.entries.remove(i),
            None => (
                UnitKey {
                    info: info.clone(),
                    requirement: requirement.clone(),
                    adapters: adapters.clone(),
                    concurrency,
                    max_gpus,
                    kv,
                },
                Rc::default(),
            ),
        };
        let cache = entry.1.clone();
        self.entries.push(entry);
        cache
    }
}

/// Plans again with the instances of lower-priority workflows stopped, as few as
/// admitting the workflow needs: the lowest priority first; among equals, those of the
/// owner furthest over their fair share (the lowest group factor, then user factor),
/// then the largest (fewer instances stopped), then by id. `None` when even stopping
/// all of them does not admit it.
fn preempting<'a>(
    input: &PlanInput<'_>,
    instances: &'a [Instance],
    infos: &[&'a ModelInfo],
) -> Option<(PlanFleet, State, Planned<'a>, Vec<Preempted>)> {
    let attempt = |reclaim: &[Held<'_>]| {
        let s = &input.settings;
        let fleet = PlanFleet::from_snapshot(input.graph, s.headroom, s.host_headroom, reclaim);
        let mut state = State::new(&fleet);
        let planned = plan_on(input, instances, infos, &fleet, &mut state, &mut UnitCaches::default());
        (fleet, state, planned)
    };
    let priority = input.workflow.placement.priority;
    let mut victims: Vec<&RunningInstance> = input.running.iter().filter(|r| r.priority < priority).collect();
    let standing = |r: &RunningInstance| r.standing.unwrap_or(crate::base::Standing::FRESH);
    victims.sort_by(|a, b| {
        a.priority
            .cmp(&b.priority)
            // `first` puts the one further under its share first: reversed.
            .then(standing(b).first(&standing(a)))
            .then(held(b).cmp(&held(a)))
            .then(a.id.cmp(&b.id))
    });
    let mut chosen: Vec<&RunningInstance> = Vec::new();
    for victim in victims {
        chosen.push(victim);
        let found = attempt(&reclaim_of(&chosen));
        if found.2.admitted {
            // Keep only the victims the admission needs.
            let mut needed = chosen.clone();
            let mut best = found;
            let mut i = 0;
            while i < needed.len() {
                let mut without = needed.clone();
                without.remove(i);
                let found = attempt(&reclaim_of(&without));
                if found.2.admitted {
                    needed = without;
                    best = found;
                } else {
                    i += 1;
                }
            }
            let preempted = needed
                .iter()
                .map(|r| Preempted {
                    id: r.id.clone(),
                    workflow: r.workflow.clone(),
                    priority: r.priority,
                    frees: held(r),
                    standing: r.standing,
                })
                .collect();
            return Some((best.0, best.1, best.2, preempted));
        }
    }
    None
}

fn held(r: &RunningInstance) -> u64 {
    r.gpus.iter().map(|g| g.bytes).sum()
}

fn reclaim_of<'a>(instances: &[&'a RunningInstance]) -> Vec<Held<'a>> {
    instances
        .iter()
        .flat_map(|r| {
            r.gpus.iter().map(|g| Held {
                node: &g.node,
                gpu: g.gpu,
                bytes: g.bytes,
            })
        })
        .collect()
}

/// The search's result before rendering.
pub(crate) struct Planned<'a> {
    units: Vec<PlannedUnit<'a>>,
    outcome: search::Outcome,
    admitted: bool,
}

fn plan_on<'a>(
    input: &PlanInput<'_>,
    instances: &'a [Instance],
    infos: &[&'a ModelInfo],
    fleet: &PlanFleet,
    state: &mut State,
    caches: &mut UnitCaches,
) -> Planned<'a> {
    let units = make_units(instances, infos, fleet, state, input.settings.kv_dtype, caches);
    let unit_refs: Vec<&Unit<'_>> = units.iter().map(|u| &u.unit).collect();
    let outcome = search::search(&unit_refs, fleet, state, input.settings.search_budget);
    let admitted = outcome.placed == units.len();
    Planned {
        units,
        outcome,
        admitted,
    }
}

/// One replica to place.
pub struct PlannedUnit<'a> {
    /// Position of its instance.
    pub instance: usize,
    /// Replica number, from 1.
    pub replica: u32,
    /// Replicas of the instance.
    pub replicas: u32,
    /// What it needs.
    pub unit: Unit<'a>,
}

/// The replicas of every instance: as few as serve each instance's concurrency (more
/// only when one replica fits nowhere on `state`, the fleet with nothing reserved), each
/// serving an equal share. Replicas alike share their cache from `caches`.
pub fn make_units<'a>(
    instances: &'a [Instance],
    infos: &[&'a ModelInfo],
    fleet: &PlanFleet,
    state: &State,
    kv: KvDtype,
    caches: &mut UnitCaches,
) -> Vec<PlannedUnit<'a>> {
    let mut units = Vec::new();
    for (i, instance) in instances.iter().enumerate() {
        let total = u64::from(instance.requirement.concurrency.max(1));
        let mut make = |replicas: u64| {
            let concurrency = total.div_ceil(replicas);
            let cache = caches.get(infos[i], instance, concurrency, kv);
            Unit::new(infos[i], instance, concurrency, kv, fleet, cache)
        };
        // The unit probed last serves as the first replica: what it computed (on the
        // untouched fleet, which the search starts from) is cached in it.
        let mut replicas = 1;
        let mut probe = make(replicas);
        while replicas < total.min(MAX_REPLICAS) && probe.best_bound(FleetState::new(fleet, state)).is_none() {
            replicas += 1;
            probe = make(replicas);
        }
        if replicas > 1 && probe.best_bound(FleetState::new(fleet, state)).is_none() {
            replicas = 1;
            probe = make(replicas);
        }
        let mut probe = Some(probe);
        for r in 0..replicas {
            units.push(PlannedUnit {
                instance: i,
                replica: r as u32 + 1,
                replicas: replicas as u32,
                unit: probe.take().unwrap_or_else(|| make(replicas)),
            });
        }
    }
    units
}

/// Most replicas the planner splits one instance's concurrency into.
pub const MAX_REPLICAS: u64 = 16;

/// The layout of a candidate as engines take it. An offload's host stage comes first:
/// llama.cpp keeps the first layers in host RAM and offloads the last ones and the
/// output (`-ngl` counts the output as one more layer); its `--tensor-split` is the one
/// that makes llama.cpp place exactly the layers each GPU stage was sized for.
fn planned_layout(cand: &Cand) -> PlannedLayout {
    let e = &cand.estimate;
    let stages = e.layout.stages.count();
    let mut partition = vec![0u64; stages];
    for d in &e.devices {
        if d.rank == 0 {
            partition[d.stage] = d.layers.len();
        }
    }
    let offload = cand.family == Family::Offload;
    let llama = e.engine.name() == "llama.cpp";
    let on_gpus = if offload {
        &partition[1.min(stages)..]
    } else {
        &partition[..]
    };
    PlannedLayout {
        tensor_parallel: e.layout.tensor_parallel,
        pipeline_stages: stages,
        tensor_split: if llama && on_gpus.len() > 1 {
            // Never fails for a plan: every stage holds at least one layer.
            llama_cpp_tensor_split(on_gpus).unwrap_or_default()
        } else {
            Vec::new()
        },
        gpu_layers: offload.then(|| on_gpus.iter().sum::<u64>() + 1),
        layer_partition: partition,
        kv_cache_bytes: (e.engine.name() == "vllm").then(|| vllm_kv_cache_bytes(e)).flatten(),
    }
}

/// The KV cache vLLM is told each worker allocates: the largest device's, its
/// `kv_tokens` (the sequences' blocks) plus the one block vLLM's block pool keeps back
/// (`vllm/v1/core/kv_cache_planning.py` `get_kv_cache_configs`). `None` when no device
/// holds a cache (an attention-free model: vLLM sizes it itself).
fn vllm_kv_cache_bytes(e: &skein_model_registry::estimate::Estimate) -> Option<u64> {
    let block = u128::from(skein_model_registry::estimate::VLLM_BLOCK_SIZE.value);
    let tokens = u128::from(e.kv_tokens);
    e.devices
        .iter()
        .map(|d| u128::from(d.kv_cache.get()))
        .filter(|&kv| kv > 0 && tokens > 0)
        .map(|kv| kv + (kv * block).div_ceil(tokens))
        .max()
        .and_then(|kv| u64::try_from(kv).ok())
}

/// Bytes as shown in reasons.
fn show(bytes: u64) -> String {
    Bytes::new(bytes).to_string()
}

/// The agents of a workflow served by endpoints.
fn remote_agents(workflow: &Workflow) -> Vec<RemoteAgent> {
    workflow
        .agents
        .iter()
        .filter_map(|(name, a)| match &a.backend {
            Backend::Endpoint(e) => Some(RemoteAgent {
                agent: name.clone(),
                url: e.url.clone(),
                model: e.model.clone(),
            }),
            Backend::Model(_) => None,
        })
        .collect()
}

/// vLLM's tool-call parser for a model family (`--tool-call-parser`), as vLLM's docs
/// pair them: Qwen2 answers in Hermes' format, Llama 3 in JSON, Mistral and Mixtral in
/// Mistral's. `None`: vLLM has no parser for the family, and the model cannot call
/// tools there.
pub fn tool_call_format(architecture: skein_model_registry::config::Architecture) -> Option<&'static str> {
    use skein_model_registry::config::Architecture;
    match architecture {
        Architecture::Qwen2 => Some("hermes"),
        Architecture::Llama => Some("llama3_json"),
        Architecture::Mistral | Architecture::Mixtral => Some("mistral"),
        Architecture::Gemma
        | Architecture::Phi3
        | Architecture::Falcon
        | Architecture::Gpt2
        | Architecture::LlavaNext => None,
    }
}
