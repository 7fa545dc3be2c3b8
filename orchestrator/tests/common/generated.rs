//! Generated fleets and workflows for the planner's property tests and benches: fleets
//! of simulated GPUs of the catalog's cards (mostly homogeneous nodes, some busy or
//! degraded GPUs) and workflows of the reference models, with proptest strategies.
//! Shared by `plan_search.rs`, `plan_oracle.rs` and `benches/plan_oracle.rs` (`#[path]`).

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::sync::OnceLock;

use proptest::prelude::*;
use skein_dsl::Workflow;
use skein_model_registry::catalog::ModelInfo;
use skein_orchestrator::graph::{
    GpuFacts, GpuSample, GraphConfig, GraphSnapshot, HardwareGraph, HostFacts, HostSample, IndexedSample,
    NodeInventory, TelemetryBatch,
};
use skein_orchestrator::plan::options::{State, Unit};
use skein_orchestrator::plan::{PlanFleet, PlanSettings, UnitCaches, demand, make_units};

pub fn models() -> &'static BTreeMap<String, ModelInfo> {
    static MODELS: OnceLock<BTreeMap<String, ModelInfo>> = OnceLock::new();
    MODELS.get_or_init(|| {
        skein_testkit::models::reference_models()
            .into_iter()
            .map(|m| (m.repo.to_string(), m))
            .collect()
    })
}

/// The repositories generated workflows use.
pub const REPOS: [&str; 5] = [
    "Qwen/Qwen2.5-0.5B-Instruct",
    "Qwen/Qwen2.5-7B-Instruct",
    "llava-hf/llava-v1.6-mistral-7b-hf",
    "deepseek-ai/deepseek-coder-33b-instruct",
    "meta-llama/Meta-Llama-3-70B-Instruct",
];

/// Cards generated fleets use.
pub const CARDS: [&str; 6] = [
    "A100-80GB",
    "A100-40GB",
    "RTX4090-24GB",
    "V100-16GB",
    "L4-24GB",
    "T4-16GB",
];

#[derive(Debug, Clone)]
pub struct GpuSpec {
    pub card: usize,
    pub used_permille: u64,
    pub degraded: bool,
}

#[derive(Debug, Clone)]
pub struct NodeSpec {
    pub gpus: Vec<GpuSpec>,
    pub nvlink: bool,
    pub host_gib: u64,
    pub network_gbps: u64,
}

#[derive(Debug, Clone)]
pub struct AgentSpec {
    pub repo: usize,
    pub context: u32,
    pub concurrency: u32,
    pub min_precision: &'static str,
    pub prefer: &'static str,
}

/// A graph of these nodes, each registered and with one telemetry sample.
pub fn snapshot(nodes: &[NodeSpec]) -> GraphSnapshot {
    let graph = HardwareGraph::new(GraphConfig::default());
    for (n, spec) in nodes.iter().enumerate() {
        let name = format!("node-{n}");
        let uuids: Vec<String> = (0..spec.gpus.len()).map(|i| format!("GPU-{n}-{i}")).collect();
        let gpus = spec
            .gpus
            .iter()
            .enumerate()
            .map(|(i, g)| {
                let card = skein_gpu_catalog::lookup(CARDS[g.card]).expect("a catalog card");
                GpuFacts {
                    index: i as u32,
                    uuid: uuids[i].clone(),
                    name: card.nvml_name.to_owned(),
                    memory_total: card.memory_bytes(),
                    compute_capability: Some(card.compute_capability),
                    power_limit_mw: Some((card.power_limit_w * 1000.0) as u32),
                    pcie: Some(card.pcie),
                    nvlink_peers: if spec.nvlink {
                        uuids.iter().filter(|u| **u != uuids[i]).cloned().collect()
                    } else {
                        Vec::new()
                    },
                    mig_enabled: Some(false),
                    simulated: true,
                }
            })
            .collect::<Vec<_>>();
        let samples = gpus
            .iter()
            .zip(&spec.gpus)
            .map(|(f, g)| {
                let used = f.memory_total / 1000 * g.used_permille;
                IndexedSample {
                    index: f.index,
                    sample: GpuSample {
                        received_ms: 0,
                        unix_ms: 0,
                        memory_used: used,
                        memory_free: f.memory_total - used,
                        utilization_pct: Some(0),
                        memory_utilization_pct: Some(0),
                        temperature_c: Some(40),
                        power_mw: Some(50_000),
                        sm_clock_mhz: Some(1000),
                        throttle_reasons: if g.degraded { skein_proto::throttle::THERMAL } else { 0 },
                        ecc_corrected: Some(0),
                        ecc_uncorrected: Some(0),
                        foreign_memory: Some(used),
                    },
                }
            })
            .collect();
        let inventory = NodeInventory {
            name: name.clone(),
            agent_version: "test".to_owned(),
            gpu_source: "test".to_owned(),
            host: HostFacts {
                hostname: name,
                memory_total: spec.host_gib << 30,
                network_bps: spec.network_gbps * 1_000_000_000,
                ..HostFacts::default()
            },
            gpus,
            labels: Default::default(),
        };
        let (registration, _) = graph.register(inventory, 0);
        graph.connected(&registration.id, 0).expect("connects");
        graph
            .ingest(
                &registration.id,
                TelemetryBatch {
                    seq: 1,
                    gpus: samples,
                    host: Some(HostSample {
                        load1: 0.0,
                        memory_available: spec.host_gib << 30,
                    }),
                },
                1,
            )
            .expect("ingests");
    }
    graph.snapshot()
}

pub fn workflow(agents: &[AgentSpec]) -> Workflow {
    let mut text = String::from("name: generated\nagents:\n");
    for (i, a) in agents.iter().enumerate() {
        text.push_str(&format!(
            "  a{i}:\n    model: {{ repo: {}, context: {}, concurrency: {}, min_precision: {}, prefer: {} }}\n",
            REPOS[a.repo], a.context, a.concurrency, a.min_precision, a.prefer
        ));
    }
    let parsed = skein_dsl::parse_as("generated.yaml", &text, skein_dsl::SourceKind::Yaml);
    parsed
        .workflow
        .unwrap_or_else(|| panic!("generated workflow is valid:\n{text}"))
}

pub fn gpu_spec() -> impl Strategy<Value = GpuSpec> {
    (
        0..CARDS.len(),
        prop_oneof![Just(0u64), 0..700u64],
        prop::bool::weighted(0.15),
    )
        .prop_map(|(card, used_permille, degraded)| GpuSpec {
            card,
            used_permille,
            degraded,
        })
}

pub fn node_spec(max_gpus: usize) -> impl Strategy<Value = NodeSpec> {
    (
        // Nodes are mostly homogeneous, as real ones are; sometimes mixed.
        (
            gpu_spec(),
            1..=max_gpus,
            prop::bool::weighted(0.3),
            prop::collection::vec(gpu_spec(), 1..=max_gpus),
        ),
        any::<bool>(),
        prop_oneof![Just(32u64), Just(128), Just(512)],
        prop_oneof![Just(10u64), Just(100)],
    )
        .prop_map(
            |((first, count, mixed, list), nvlink, host_gib, network_gbps)| NodeSpec {
                gpus: if mixed {
                    list
                } else {
                    (0..count)
                        .map(|_| GpuSpec {
                            card: first.card,
                            used_permille: first.used_permille,
                            degraded: first.degraded,
                        })
                        .collect()
                },
                nvlink,
                host_gib,
                network_gbps,
            },
        )
}

/// Fleets of 1 to 3 nodes with at most `max_total` GPUs.
pub fn fleet_spec(max_total: usize) -> impl Strategy<Value = Vec<NodeSpec>> {
    prop::collection::vec(node_spec(4), 1..=3).prop_map(move |nodes| at_most(nodes, max_total))
}

/// `nodes` cut to `max_total` GPUs, first nodes first, without empty nodes.
fn at_most(mut nodes: Vec<NodeSpec>, max_total: usize) -> Vec<NodeSpec> {
    let mut total = 0;
    for node in &mut nodes {
        node.gpus.truncate(max_total - total);
        total += node.gpus.len();
    }
    nodes.retain(|node| !node.gpus.is_empty());
    nodes
}

pub fn agent_spec() -> impl Strategy<Value = AgentSpec> {
    (
        prop_oneof![3 => 0..2usize, 2 => 2..4usize, 1 => Just(4usize)],
        prop_oneof![Just(2048u32), Just(8192), Just(32768)],
        1..=3u32,
        prop_oneof![Just("int4"), Just("int8"), Just("bf16")],
        prop_oneof![Just("quality"), Just("speed"), Just("fewest_gpus")],
    )
        .prop_map(|(repo, context, concurrency, min_precision, prefer)| AgentSpec {
            repo,
            context,
            concurrency,
            min_precision,
            prefer,
        })
}

/// Fleets of 2 to 8 nodes of up to 8 GPUs each, `min_total` to `max_total` GPUs in all.
pub fn fleet_between(min_total: usize, max_total: usize) -> impl Strategy<Value = Vec<NodeSpec>> {
    prop::collection::vec(node_spec(8), 2..=8)
        .prop_map(move |nodes| at_most(nodes, max_total))
        .prop_filter("enough GPUs", move |nodes| {
            nodes.iter().map(|n| n.gpus.len()).sum::<usize>() >= min_total
        })
}

/// `count` values of `strategy` drawn from a fixed `seed`: the same ones in every run
/// (for a test that looks at all its cases at once, and for benches).
pub fn drawn<S: Strategy>(strategy: S, count: usize, seed: u64) -> Vec<S::Value> {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
    let mut bytes = [0u8; 32];
    bytes[..8].copy_from_slice(&seed.to_le_bytes());
    let mut runner = TestRunner::new_with_rng(Config::default(), TestRng::from_seed(RngAlgorithm::ChaCha, &bytes));
    (0..count)
        .map(|_| strategy.new_tree(&mut runner).expect("draws a case").current())
        .collect()
}

/// The planner's units (replicas) of `workflow` on `fleet`, given to `f` with the state
/// they were made in (nothing reserved yet).
pub fn with_units<R>(
    workflow: &Workflow,
    fleet: &PlanFleet,
    settings: &PlanSettings,
    f: impl FnOnce(&[&Unit<'_>], &mut State) -> R,
) -> R {
    let instances = demand::instances(workflow);
    let infos = demand::catalogs(&instances, models()).expect("catalogs");
    let mut state = State::new(fleet);
    let units = make_units(
        &instances,
        &infos,
        fleet,
        &state,
        settings.kv_dtype,
        &mut UnitCaches::default(),
    );
    let refs: Vec<&Unit<'_>> = units.iter().map(|u| &u.unit).collect();
    f(&refs, &mut state)
}
