//! The placement planner on large mixed fleets, against a first-fit baseline in the same
//! run.
//!
//! - `workflow_20_agents/planner`: planning a 20-agent workflow (the five reference
//!   models, several precisions, contexts and concurrencies) on 1,000 nodes × 8 GPUs of
//!   six node types with varied live free memory, some GPUs degraded, each plan by a new
//!   [`Planner`] (as `skein plan` makes one); `workflow_20_agents/planner_kept`: one
//!   planner kept from plan to plan while telemetry changes a node between two plans,
//!   as the server plans.
//! - `single_instance/planner`: planning a one-agent workflow on 5,000 nodes × 8 GPUs
//!   (placements per second = 1 / time), the five models in turn, as the server plans:
//!   one [`Planner`] kept from plan to plan while telemetry changes a node between two
//!   plans; `single_instance/planner_cold`: each plan by a new planner, as `skein plan`
//!   makes one.
//! - `…/first_fit`: the baseline today's tools use: per agent the highest precision the
//!   agent allows, sized as file size × 1.2, on the first GPU (node order) with that much
//!   free, else split evenly over the first identical GPUs of one node that hold it.
//!
//! Before measuring, the bench prints the packing of both on the 1,000-node fleet:
//! agents placed, GPUs used, precision tiers, and how many of first-fit's placements the
//! memory estimator says would not fit (out of memory at start or under load).
//!
//! Run: `cargo bench -p skein-orchestrator --bench plan -- --warm-up-time 1 --measurement-time 5`

use std::collections::{BTreeMap, BTreeSet};
use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use skein_dsl::Workflow;
use skein_dsl::ir::{Backend, Precision};
use skein_model_registry::catalog::ModelInfo;
use skein_model_registry::estimate::{EstimateRequest, Layout, estimate};
use skein_orchestrator::graph::{
    GpuFacts, GpuSample, GraphConfig, GraphSnapshot, HardwareGraph, HostFacts, IndexedSample, NodeInventory,
    TelemetryBatch,
};
use skein_orchestrator::plan::demand::{VariantUse, variant_use};
use skein_orchestrator::plan::score::tier_of;
use skein_orchestrator::plan::{self, PlanInput, PlanSettings, Planner};

/// Node types: (catalog card, GPUs, NVLink).
const NODE_TYPES: [(&str, bool); 6] = [
    ("A100-80GB", true),
    ("A100-40GB", true),
    ("RTX4090-24GB", false),
    ("L4-24GB", false),
    ("V100-32GB", true),
    ("RTXA6000-48GB", false),
];

/// Per mille of each card in use by others, in turn (few distinct states, as real
/// fleets have: idle cards, and a few common jobs).
const USED_PERMILLE: [u64; 5] = [0, 0, 250, 500, 900];

/// A pseudo-random but fixed sequence.
fn mix(seed: u64) -> u64 {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    x ^= x >> 31;
    x = x.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x ^ (x >> 29)
}

fn fleet(nodes: usize) -> GraphSnapshot {
    live_fleet(nodes).graph.snapshot()
}

/// A fleet's graph, to which telemetry can still be sent.
struct LiveFleet {
    graph: HardwareGraph,
    /// Each node's id and GPUs.
    nodes: Vec<(skein_orchestrator::graph::NodeId, Vec<GpuFacts>)>,
    /// Batches sent so far.
    seq: u64,
}

impl LiveFleet {
    /// The `changes`-th change, counted on: a node's first GPU takes 2 GiB more, or frees
    /// them, nodes in turn; the graph's snapshot after it.
    fn change(&mut self, changes: &mut usize) -> GraphSnapshot {
        let node = *changes % self.nodes.len();
        let extra = if (*changes / self.nodes.len()).is_multiple_of(2) {
            2 << 30
        } else {
            0
        };
        *changes += 1;
        self.sample(node, extra);
        self.graph.snapshot()
    }

    /// A new sample from node `n`, with `extra` more bytes in use on its first GPU.
    fn sample(&mut self, n: usize, extra: u64) {
        self.seq += 1;
        let (id, gpus) = &self.nodes[n];
        self.graph
            .ingest(
                id,
                TelemetryBatch {
                    seq: self.seq,
                    gpus: samples(n, gpus, extra),
                    host: Some(host_sample()),
                },
                0,
            )
            .expect("ingested");
    }
}

fn host_sample() -> skein_orchestrator::graph::HostSample {
    skein_orchestrator::graph::HostSample {
        load1: 1.0,
        memory_available: 500 << 30,
    }
}

/// Node `n`'s GPU samples, with `extra` bytes in use on its first GPU beyond its job.
fn samples(n: usize, gpus: &[GpuFacts], extra: u64) -> Vec<IndexedSample> {
    gpus.iter()
        .map(|g| {
            let r = mix((n as u64) << 8 | u64::from(g.index));
            // Most nodes idle or with one common job on all their GPUs.
            let mut used = g.memory_total / 1000 * USED_PERMILLE[(mix(n as u64 + 7) % 5) as usize];
            if g.index == 0 {
                used = (used + extra).min(g.memory_total);
            }
            let hot = r.is_multiple_of(50);
            IndexedSample {
                index: g.index,
                sample: GpuSample {
                    received_ms: 0,
                    unix_ms: 0,
                    memory_used: used,
                    memory_free: g.memory_total - used,
                    utilization_pct: Some(0),
                    memory_utilization_pct: Some(0),
                    temperature_c: Some(if hot { 90 } else { 40 }),
                    power_mw: Some(60_000),
                    sm_clock_mhz: Some(1400),
                    throttle_reasons: if hot { skein_proto::throttle::THERMAL } else { 0 },
                    ecc_corrected: Some(0),
                    ecc_uncorrected: Some(0),
                    foreign_memory: Some(used),
                },
            }
        })
        .collect()
}

fn live_fleet(nodes: usize) -> LiveFleet {
    let graph = HardwareGraph::new(GraphConfig::default());
    let mut ids = Vec::with_capacity(nodes);
    for n in 0..nodes {
        let (card_name, nvlink) = NODE_TYPES[(mix(n as u64) % NODE_TYPES.len() as u64) as usize];
        let card = skein_gpu_catalog::lookup(card_name).expect("a catalog card");
        let uuids: Vec<String> = (0..8).map(|i| format!("GPU-{n:05}-{i}")).collect();
        let gpus: Vec<GpuFacts> = (0..8u32)
            .map(|i| GpuFacts {
                index: i,
                uuid: uuids[i as usize].clone(),
                name: card.nvml_name.to_owned(),
                memory_total: card.memory_bytes(),
                compute_capability: Some(card.compute_capability),
                power_limit_mw: Some((card.power_limit_w * 1000.0) as u32),
                pcie: Some(card.pcie),
                nvlink_peers: if nvlink {
                    uuids.iter().filter(|u| **u != uuids[i as usize]).cloned().collect()
                } else {
                    Vec::new()
                },
                mig_enabled: Some(false),
                simulated: true,
            })
            .collect();
        let samples = samples(n, &gpus, 0);
        let name = format!("node-{n:05}");
        let inventory = NodeInventory {
            name: name.clone(),
            agent_version: "bench".to_owned(),
            gpu_source: "simulated".to_owned(),
            host: HostFacts {
                hostname: name,
                memory_total: 512 << 30,
                network_bps: 100_000_000_000,
                ..HostFacts::default()
            },
            gpus: gpus.clone(),
            labels: Default::default(),
        };
        let (registration, _) = graph.register(inventory, 0);
        graph.connected(&registration.id, 0).expect("registered");
        graph
            .ingest(
                &registration.id,
                TelemetryBatch {
                    seq: 1,
                    gpus: samples,
                    host: Some(host_sample()),
                },
                0,
            )
            .expect("ingested");
        ids.push((registration.id, gpus));
    }
    LiveFleet {
        graph,
        nodes: ids,
        seq: 1,
    }
}

const REPOS: [&str; 5] = [
    "Qwen/Qwen2.5-0.5B-Instruct",
    "Qwen/Qwen2.5-7B-Instruct",
    "llava-hf/llava-v1.6-mistral-7b-hf",
    "deepseek-ai/deepseek-coder-33b-instruct",
    "meta-llama/Meta-Llama-3-70B-Instruct",
];

fn workflow(agents: &[(usize, u32, u32, &str)]) -> Workflow {
    let mut text = String::from("name: bench\nagents:\n");
    for (i, (repo, context, concurrency, min)) in agents.iter().enumerate() {
        text.push_str(&format!(
            "  a{i}: {{ model: {{ repo: {}, context: {context}, concurrency: {concurrency}, min_precision: {min}, prefer: {} }} }}\n",
            REPOS[*repo],
            ["quality", "speed", "fewest_gpus"][i % 3]
        ));
    }
    text.push_str("steps:\n  - { id: s, agent: a0, prompt: hi }\n");
    let parsed = skein_dsl::parse("bench.yaml", &text);
    parsed.workflow.expect("a valid workflow")
}

/// Twenty agents: small helpers, 7B chat and vision agents, 33B coders, two 70B agents,
/// each with its own preference in turn; agents 1 and 19 (and any other pair alike in
/// model and preference) share an instance.
fn twenty_agents() -> Workflow {
    let mut agents = Vec::new();
    for i in 0..20usize {
        let repo = [0, 1, 1, 2, 3, 0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 1, 0, 2, 3, 1][i];
        let context = [2048, 8192, 32768][i % 3];
        let concurrency = [1, 2, 4][(i / 3) % 3];
        let min = ["int4", "int8", "bf16"][(i / 2) % 3];
        agents.push((repo, context, concurrency, min));
    }
    // Two agents that share an instance.
    agents[19] = agents[1];
    workflow(&agents)
}

fn models() -> BTreeMap<String, ModelInfo> {
    skein_testkit::models::reference_models()
        .into_iter()
        .map(|m| (m.repo.to_string(), m))
        .collect()
}

/// What first-fit placed for one agent.
struct FirstFit {
    agent: String,
    variant: usize,
    gpus: Vec<(usize, usize)>,
}

/// The baseline: per agent, the highest-precision variant the agent allows, sized as
/// file size × 1.2 (no estimator), on the first GPU (node order) with that much free;
/// else split evenly over the first 2, 4 or 8 identical GPUs of one node that each hold
/// their share. Reserves what it sized.
fn first_fit(workflow: &Workflow, models: &BTreeMap<String, ModelInfo>, graph: &GraphSnapshot) -> Vec<FirstFit> {
    let mut free: Vec<Vec<u64>> = graph
        .nodes
        .iter()
        .map(|n| n.gpus.iter().map(|g| g.memory_free().unwrap_or(0)).collect())
        .collect();
    let models_of: Vec<Vec<&str>> = graph
        .nodes
        .iter()
        .map(|n| n.gpus.iter().map(|g| g.facts.name.as_str()).collect())
        .collect();
    let mut out = Vec::new();
    for (name, agent) in &workflow.agents {
        let Backend::Model(req) = &agent.backend else { continue };
        let info = &models[&req.repo];
        let mut variants: Vec<(usize, Precision)> = info
            .variants
            .iter()
            .enumerate()
            .filter_map(|(v, var)| match variant_use(req, var) {
                VariantUse::Allowed(tier) => Some((v, tier)),
                VariantUse::Excluded(_) => None,
            })
            .collect();
        variants.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        let Some(&(v, _)) = variants.first() else { continue };
        let size = info.variants[v].size.get() / 5 * 6;
        let mut placed = None;
        'k: for k in [1usize, 2, 4, 8] {
            let share = size / k as u64;
            for (n, gpus) in free.iter().enumerate() {
                if k == 1 {
                    if let Some(p) = (0..gpus.len()).find(|&p| gpus[p] >= share) {
                        placed = Some((n, vec![p], share));
                        break 'k;
                    }
                    continue;
                }
                // GPUs of one model on this node, in index order.
                for (first, model) in models_of[n].iter().enumerate() {
                    if models_of[n][..first].contains(model) {
                        continue;
                    }
                    let fit: Vec<usize> = (first..gpus.len())
                        .filter(|&p| models_of[n][p] == *model && gpus[p] >= share)
                        .take(k)
                        .collect();
                    if fit.len() == k {
                        placed = Some((n, fit, share));
                        break 'k;
                    }
                }
            }
        }
        if let Some((n, gpus, share)) = placed {
            for &p in &gpus {
                free[n][p] -= share;
            }
            out.push(FirstFit {
                agent: name.clone(),
                variant: v,
                gpus: gpus.into_iter().map(|p| (n, p)).collect(),
            });
        }
    }
    out
}

/// Packing of both on one fleet, printed once.
fn report(workflow: &Workflow, models: &BTreeMap<String, ModelInfo>, graph: &GraphSnapshot) {
    let plan = plan::plan(&PlanInput {
        workflow,
        models,
        adapters: &skein_orchestrator::plan::NO_ADAPTERS,
        graph,
        running: &[],
        settings: PlanSettings::default(),
    })
    .expect("plans");
    let planned_agents: usize = plan.instances.iter().map(|i| i.agents.len()).sum();
    let planned_gpus: BTreeSet<(String, Option<u32>)> = plan
        .instances
        .iter()
        .flat_map(|i| i.devices.iter().map(|d| (d.node.clone(), d.gpu)))
        .filter(|d| d.1.is_some())
        .collect();
    // Agents per precision tier, highest first.
    let mut planned_tiers: BTreeMap<std::cmp::Reverse<Precision>, usize> = BTreeMap::new();
    for i in &plan.instances {
        *planned_tiers.entry(std::cmp::Reverse(i.precision)).or_default() += i.agents.len();
    }
    let ff = first_fit(workflow, models, graph);
    let ff_gpus: BTreeSet<(usize, usize)> = ff.iter().flat_map(|f| f.gpus.iter().copied()).collect();
    // Would each first-fit placement start? The estimator's need (at the agent's context
    // and concurrency, with the engine's runtime memory) against the memory free.
    let mut free: Vec<Vec<u64>> = graph
        .nodes
        .iter()
        .map(|n| n.gpus.iter().map(|g| g.memory_free().unwrap_or(0)).collect())
        .collect();
    let mut oom = 0;
    let mut ff_tiers: BTreeMap<std::cmp::Reverse<Precision>, usize> = BTreeMap::new();
    for f in &ff {
        let agent = &workflow.agents[&f.agent];
        let Backend::Model(req) = &agent.backend else { continue };
        let info = &models[&req.repo];
        let variant = &info.variants[f.variant];
        if let Some(tier) = tier_of(&variant.quantization) {
            *ff_tiers.entry(std::cmp::Reverse(tier)).or_default() += 1;
        }
        // An even split is tensor parallelism for vLLM, equal layer shares for llama.cpp.
        let k = f.gpus.len();
        let (engine, layout) = match variant.format() {
            skein_model_registry::WeightFormat::Gguf => (
                skein_model_registry::estimate::Engine::LLAMA_CPP,
                if k == 1 {
                    Layout::single()
                } else {
                    Layout::pipeline(vec![1; k])
                },
            ),
            _ => (
                skein_model_registry::estimate::Engine::VLLM,
                Layout::tensor_parallel(k as u64),
            ),
        };
        let request = EstimateRequest::new(engine, u64::from(req.context))
            .with_concurrency(u64::from(req.concurrency))
            .with_layout(layout);
        let fits = match estimate(&info.shape, &variant.weights, &request) {
            Ok(e) => e
                .devices
                .iter()
                .zip(&f.gpus)
                .all(|(d, &(n, p))| d.total.get() <= free[n][p]),
            Err(_) => false,
        };
        if fits {
            for (d, &(n, p)) in estimate(&info.shape, &variant.weights, &request)
                .expect("estimated above")
                .devices
                .iter()
                .zip(&f.gpus)
            {
                free[n][p] -= d.total.get();
            }
        } else {
            oom += 1;
        }
    }
    let tiers = |t: &BTreeMap<std::cmp::Reverse<Precision>, usize>| {
        t.iter()
            .map(|(tier, n)| format!("{} ×{n}", tier.0))
            .collect::<Vec<_>>()
            .join(", ")
    };
    eprintln!(
        "packing on {} nodes × 8 GPUs, {} agents:\n  \
         planner:   {planned_agents} agents placed ({} replicas; admitted {}; search {} steps, complete {}) on {} GPUs; agents per tier: {}\n  \
         first-fit: {} agents placed on {} GPUs; agents per tier: {}; {oom} of them would not start (the estimator's need at their context and concurrency exceeds the memory free)",
        graph.nodes.len(),
        workflow.agents.len(),
        plan.instances.len(),
        plan.admitted,
        plan.search.steps,
        plan.search.complete,
        planned_gpus.len(),
        tiers(&planned_tiers),
        ff.len(),
        ff_gpus.len(),
        tiers(&ff_tiers),
    );
}

/// Where one plan's time goes, printed once: the median of a few runs of each phase as
/// `plan::plan` runs them (the fleet view, a state, the replicas with their candidates on
/// the untouched fleet, the search, and the whole plan with its reasons).
fn phases(workflow: &Workflow, models: &BTreeMap<String, ModelInfo>, graph: &GraphSnapshot) {
    use skein_orchestrator::plan::options::{State, Unit};
    use skein_orchestrator::plan::{PlanFleet, UnitCaches, demand, make_units, search};
    use std::time::{Duration, Instant};
    const RUNS: usize = 9;
    let s = PlanSettings::default();
    let mut times: Vec<[Duration; 5]> = Vec::new();
    let mut steps = 0;
    for _ in 0..RUNS {
        let t = Instant::now();
        let fleet = PlanFleet::from_snapshot(graph, s.headroom, s.host_headroom, &[]);
        let t1 = t.elapsed();
        let mut state = State::new(&fleet);
        let t2 = t.elapsed();
        let instances = demand::instances(workflow);
        let infos = demand::catalogs(&instances, models).expect("catalogs");
        let units = make_units(
            &instances,
            &infos,
            &fleet,
            &state,
            s.kv_dtype,
            &mut UnitCaches::default(),
        );
        let t3 = t.elapsed();
        let refs: Vec<&Unit<'_>> = units.iter().map(|u| &u.unit).collect();
        steps = search::search(&refs, &fleet, &mut state, s.search_budget).steps;
        let t4 = t.elapsed();
        let t5 = Instant::now();
        plan::plan(&PlanInput {
            workflow,
            models,
            adapters: &skein_orchestrator::plan::NO_ADAPTERS,
            graph,
            running: &[],
            settings: s,
        })
        .expect("plans");
        times.push([t1, t2 - t1, t3 - t2, t4 - t3, t5.elapsed()]);
    }
    let median = |i: usize| {
        let mut all: Vec<Duration> = times.iter().map(|t| t[i]).collect();
        all.sort();
        all[RUNS / 2]
    };
    eprintln!(
        "phases on {} nodes, {} agents (median of {RUNS}): fleet view {:?}, state {:?}, replicas {:?}, search {:?} ({steps} steps); whole plan {:?}",
        graph.nodes.len(),
        workflow.agents.len(),
        median(0),
        median(1),
        median(2),
        median(3),
        median(4),
    );
}

/// With `PLAN_DUMP=FILE`: writes the plans of a fixed set of workflows and fleets as
/// JSON lines (and each one's time to stderr), to check that a change to the planner
/// leaves its plans as they were (`diff` two dumps).
fn dump(models: &BTreeMap<String, ModelInfo>, path: &str) {
    use std::io::Write;
    let mut out = std::fs::File::create(path).expect("dump file");
    let settings = PlanSettings::default();
    // One planner for every plan: each must equal a new planner's.
    let mut planner = Planner::default();
    let mut one = |name: &str, w: &Workflow, g: &GraphSnapshot, s: PlanSettings| {
        let input = PlanInput {
            workflow: w,
            models,
            adapters: &skein_orchestrator::plan::NO_ADAPTERS,
            graph: g,
            running: &[],
            settings: s,
        };
        let t = std::time::Instant::now();
        let p = plan::plan(&input).expect("plans");
        let cold = t.elapsed();
        let t = std::time::Instant::now();
        let kept = planner.plan(&input).expect("plans");
        let warm = t.elapsed();
        let json = serde_json::to_string(&p).expect("json");
        let same = json == serde_json::to_string(&kept).expect("json");
        writeln!(out, "{name}\t{json}").expect("write");
        eprintln!(
            "{name}: {cold:?} (kept planner {warm:?}){}",
            if same { "" } else { "; THE KEPT PLANNER'S PLAN DIFFERS" }
        );
    };
    let twenty = twenty_agents();
    for n in [1usize, 2, 3, 5, 10, 40, 200, 1000] {
        let g = fleet(n);
        one(&format!("twenty@{n}"), &twenty, &g, settings);
        let mut text = String::from("name: bench\nplacement: { max_gpus_per_agent: 4 }\nagents:\n");
        for (i, r) in REPOS.iter().enumerate() {
            text.push_str(&format!(
                "  a{i}: {{ model: {{ repo: {r}, context: 8192, concurrency: 3, min_precision: int4 }} }}\n"
            ));
        }
        text.push_str("steps:\n  - { id: s, agent: a0, prompt: hi }\n");
        let w = skein_dsl::parse("b.yaml", &text).workflow.expect("valid");
        one(&format!("max4@{n}"), &w, &g, settings);
        one(
            &format!("budget50@{n}"),
            &twenty,
            &g,
            PlanSettings {
                search_budget: 50,
                ..settings
            },
        );
    }
    let huge = fleet(5000);
    for r in 0..REPOS.len() {
        for min in ["int4", "int8", "bf16"] {
            for ctx in [2048, 32768] {
                one(
                    &format!("single{r}-{min}-{ctx}@5000"),
                    &workflow(&[(r, ctx, 1, min)]),
                    &huge,
                    settings,
                );
            }
        }
    }
}

/// `workflow`'s plan by `planner`, with the default settings.
fn plan_with(
    planner: &mut Planner,
    workflow: &Workflow,
    models: &BTreeMap<String, ModelInfo>,
    graph: &GraphSnapshot,
) -> plan::Plan {
    planner
        .plan(black_box(&PlanInput {
            workflow,
            models,
            adapters: &skein_orchestrator::plan::NO_ADAPTERS,
            graph,
            running: &[],
            settings: PlanSettings::default(),
        }))
        .expect("plans")
}

fn bench(c: &mut Criterion) {
    let models = models();
    if let Ok(path) = std::env::var("PLAN_DUMP") {
        dump(&models, &path);
        return;
    }
    let settings = PlanSettings::default();

    let mut live_big = live_fleet(1000);
    let big = live_big.graph.snapshot();
    let twenty = twenty_agents();
    report(&twenty, &models, &big);
    phases(&twenty, &models, &big);
    let mut g = c.benchmark_group("workflow_20_agents");
    g.sample_size(20);
    g.bench_function("planner", |b| {
        b.iter(|| {
            plan::plan(black_box(&PlanInput {
                workflow: &twenty,
                models: &models,
                adapters: &skein_orchestrator::plan::NO_ADAPTERS,
                graph: &big,
                running: &[],
                settings,
            }))
            .expect("plans")
        })
    });
    // As the server plans: one planner kept while telemetry changes a node between two
    // plans.
    let mut planner = Planner::default();
    let mut changes = 0usize;
    g.bench_function("planner_kept", |b| {
        b.iter_batched(
            || live_big.change(&mut changes),
            |graph| plan_with(&mut planner, &twenty, &models, &graph),
            criterion::BatchSize::SmallInput,
        )
    });
    g.bench_function("first_fit", |b| b.iter(|| first_fit(black_box(&twenty), &models, &big)));
    g.finish();
    drop((big, live_big, planner));

    let mut live = live_fleet(5000);
    let huge = live.graph.snapshot();
    phases(&workflow(&[(3, 8192, 1, "int4")]), &models, &huge);
    let singles: Vec<Workflow> = (0..REPOS.len()).map(|r| workflow(&[(r, 8192, 1, "int4")])).collect();
    let mut g = c.benchmark_group("single_instance");
    g.sample_size(30);
    // One placement an iteration: criterion prints placements per second.
    g.throughput(criterion::Throughput::Elements(1));
    let mut turn = 0;
    // As a server plans: one planner, and the graph changing between two plans (a node's
    // first GPU takes 2 GiB more, or frees them, nodes in turn). The new snapshots are
    // taken outside the timing.
    let mut planner = Planner::default();
    let mut changes = 0usize;
    g.bench_function("planner", |b| {
        b.iter_batched(
            || live.change(&mut changes),
            |graph| {
                turn = (turn + 1) % singles.len();
                plan_with(&mut planner, &singles[turn], &models, &graph)
            },
            criterion::BatchSize::SmallInput,
        )
    });
    // Each plan from nothing, as `skein plan` makes one.
    g.bench_function("planner_cold", |b| {
        b.iter(|| {
            turn = (turn + 1) % singles.len();
            plan::plan(black_box(&PlanInput {
                workflow: &singles[turn],
                models: &models,
                adapters: &skein_orchestrator::plan::NO_ADAPTERS,
                graph: &huge,
                running: &[],
                settings,
            }))
            .expect("plans")
        })
    });
    g.bench_function("first_fit", |b| {
        b.iter(|| {
            turn = (turn + 1) % singles.len();
            first_fit(black_box(&singles[turn]), &models, &huge)
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
