//! Every `vllm serve` command line Skein emits for the example workflows on the fleet
//! files (and Llama-3-70B in bf16 on eight RTX 4090s of four nodes, TP 2 × PP 4), parsed by the pinned
//! vLLM's own argument parser, with the memory each worker would get computed as that
//! vLLM computes it and checked against what the plan says the worker needs
//! (`tests/engines/vllm_check.py` says which vLLM code each step mirrors). The vLLM is
//! installed by `tests/engines/vllm.sh`; the test fails when it cannot be.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use skein_agent::engine::host::{EngineHostConfig, launch_spec};
use skein_agent::engine::{EngineLaunch, LaunchSpec};
use skein_model_registry::catalog::ModelInfo;
use skein_orchestrator::graph::{GraphConfig, GraphSnapshot};
use skein_orchestrator::plan::{self, PlanInput, PlanSettings, PlannedInstance};
use skein_orchestrator::run::launch::{Launch, start_instance};
use skein_proto::agent::v1 as pb;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn models() -> BTreeMap<String, ModelInfo> {
    skein_testkit::models::reference_catalog()
}

fn graph(fleet: &Path) -> GraphSnapshot {
    let fleet = skein_agent::fleet::load_fleet(fleet).expect("a valid fleet file");
    let messages = skein_agent::daemon::fleet_messages(&fleet, 0.0);
    skein_orchestrator::agents::graph_from_wire(messages, GraphConfig::default(), 0)
        .expect("the orchestrator accepts the fleet's nodes")
        .snapshot()
}

fn host_config() -> EngineHostConfig {
    EngineHostConfig {
        skein: PathBuf::from("skein"),
        llama_server: PathBuf::from("llama-server"),
        vllm: PathBuf::from("vllm"),
        ray: PathBuf::from("ray"),
        rpc_server: PathBuf::from("rpc-server"),
        listen_host: "10.0.0.1".to_owned(),
        simulated_gpus: false,
        devices: Vec::new(),
    }
}

/// The serving start of a planned vLLM replica: alone, or over Ray once every piece is
/// up (at made-up addresses).
fn serving_start(
    name: &str,
    planned: &PlannedInstance,
    models: &BTreeMap<String, ModelInfo>,
    graph: &GraphSnapshot,
) -> pb::StartInstance {
    match start_instance(name, planned, models, graph, 7).expect("a launch") {
        Launch::One { start, .. } => start,
        Launch::Split(split) => {
            // Addresses that sort against the plan's order: ranks must not follow them.
            let mut ready = BTreeMap::new();
            let mut node_ids = Vec::new();
            for wave in 0..split.waves() {
                for (i, piece) in split.wave(wave, &ready).expect("the wave").iter().enumerate() {
                    ready.insert(piece.name.clone(), format!("10.0.{wave}.{}:{}", 200 - i, 40_000 + i));
                    if let Some(pb::start_instance::Engine::RayNode(r)) = &piece.start.engine {
                        node_ids.push((r.node_id.clone().expect("a pinned Ray node ID"), piece.node.clone()));
                    }
                }
            }
            // vLLM ranks the driver's (head's) node first, then the others by node ID:
            // the IDs sort in the plan's node order.
            let mut plan_nodes: Vec<&str> = planned.devices.iter().map(|d| d.node.as_str()).collect();
            plan_nodes.dedup();
            let mut sorted = node_ids.clone();
            sorted[1..].sort();
            let by_id: Vec<&str> = sorted.iter().map(|(_, node)| node.as_str()).collect();
            assert_eq!(by_id, plan_nodes, "{name}: Ray node IDs {node_ids:?}");
            split.serving(&ready).expect("the serving command")
        }
    }
}

/// One case for the checker: the command line, the model's KV shape and, per worker in
/// vLLM's rank order, what the plan reserved and says it needs.
fn case(name: &str, planned: &PlannedInstance, model: &ModelInfo, start: &pb::StartInstance) -> serde_json::Value {
    let snapshot = PathBuf::from(format!(
        "/hf/models--{}/snapshots/{}",
        model.repo.to_string().replace('/', "--"),
        "0".repeat(40)
    ));
    let mut spec: LaunchSpec = launch_spec(start, Some(&snapshot), &host_config(), 8000).expect("a launch spec");
    // Over Ray the agent names the model by repository; alone by its local snapshot.
    if let EngineLaunch::Vllm(v) = &mut spec.engine {
        v.model = model.repo.to_string();
    }
    let command = spec.command().expect("a command");
    let EngineLaunch::Vllm(v) = &spec.engine else {
        panic!("{name}: not vLLM: {spec:?}")
    };
    // Rank r runs on the plan's r-th GPU: the reserved bytes and layers of its stage are
    // that device's.
    let tp = v.tensor_parallel as usize;
    let devices: Vec<_> = planned.devices.iter().filter(|d| d.gpu.is_some()).collect();
    assert_eq!(devices.len(), v.reserved.len(), "{name}: one rank per planned GPU");
    let workers: Vec<serde_json::Value> = v
        .reserved
        .iter()
        .zip(&v.total)
        .zip(&devices)
        .enumerate()
        .map(|(rank, ((&reserved, &total), d))| {
            let layers = v.layer_partition[rank / tp];
            assert_eq!(
                (reserved, layers),
                (d.reserved, layer_count(&d.layers)),
                "{name}: rank {rank} runs on {}'s GPU {:?} as planned",
                d.node,
                d.gpu
            );
            serde_json::json!({ "reserved": reserved, "total": total, "need": d.need })
        })
        .collect();
    let dtype_bytes = 2; // bf16/fp16 weights or activations for every vLLM variant here
    serde_json::json!({
        "name": name,
        "args": command.args,
        "env": command.env,
        "model": {
            "layers": model.shape.layers,
            "kv_heads": model.shape.kv_heads,
            "head_dim": model.shape.head_dim,
            "dtype_bytes": dtype_bytes,
        },
        "context": spec.context,
        "concurrency": spec.concurrency,
        "workers": workers,
    })
}

fn layer_count(range: &str) -> u64 {
    let (a, b) = range.split_once("..").expect("start..end");
    b.parse::<u64>().expect("end") - a.parse::<u64>().expect("start")
}

/// The vLLM cases of `workflow` on `fleet`.
fn cases_of(
    label: &str,
    workflow: &Path,
    fleet: &Path,
    models: &BTreeMap<String, ModelInfo>,
) -> Vec<serde_json::Value> {
    let parsed = skein_orchestrator::workflows::load(workflow).expect("readable");
    let workflow = parsed.workflow.expect("a valid workflow");
    let graph = graph(fleet);
    let Ok(plan) = plan::plan(&PlanInput {
        workflow: &workflow,
        models,
        graph: &graph,
        running: &[],
        settings: PlanSettings::default(),
    }) else {
        return Vec::new();
    };
    plan.instances
        .iter()
        .filter(|p| p.engine == "vllm")
        .map(|planned| {
            let name = format!("{label}.{}", planned.instance);
            let start = serving_start(&format!("r1-{}", planned.instance), planned, models, &graph);
            let model = models
                .values()
                .find(|m| m.variants.iter().any(|v| v.id == planned.variant))
                .unwrap_or_else(|| panic!("{name}: the model of {}", planned.variant));
            case(&name, planned, model, &start)
        })
        .collect()
}

/// Llama-3-70B in bf16 on four nodes of two RTX 4090s: TP 2 × PP 4 over Ray.
fn llama_70b_bf16_on_4090s(dir: &Path) -> (PathBuf, PathBuf) {
    let fleet = dir.join("rtx8.yaml");
    std::fs::write(
        &fleet,
        (1..=4).fold("fleet: rtx8\nnodes:\n".to_owned(), |mut f, n| {
            f.push_str(&format!(
                "  rtx-{n}:\n    gpus: {{ model: RTX4090-24GB, count: 2 }}\n    host: {{ cpu_cores: 32, memory: 256GiB, network: 100Gbps }}\n"
            ));
            f
        }),
    )
    .expect("write the fleet");
    let workflow = dir.join("writer.yaml");
    std::fs::write(
        &workflow,
        "name: writer\nagents:\n  writer:\n    model: { repo: meta-llama/Meta-Llama-3-70B-Instruct, context: 8192, min_precision: bf16, formats: [safetensors] }\nsteps:\n  - { id: write, agent: writer, prompt: \"Write.\" }\n",
    )
    .expect("write the workflow");
    (workflow, fleet)
}

#[test]
fn every_vllm_command_line_parses_and_gives_each_worker_what_its_plan_needs() {
    let models = models();
    let mut cases = Vec::new();
    let mut workflows: Vec<PathBuf> = std::fs::read_dir(root().join("workflows"))
        .expect("workflows/")
        .map(|e| e.expect("an entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml" || e == "rhai"))
        .collect();
    workflows.sort();
    let mut fleets: Vec<PathBuf> = std::fs::read_dir(root().join("workflows/fleets"))
        .expect("workflows/fleets/")
        .map(|e| e.expect("an entry").path())
        .collect();
    fleets.sort();
    for workflow in &workflows {
        for fleet in &fleets {
            let label = format!(
                "{}@{}",
                workflow.file_name().unwrap_or_default().to_string_lossy(),
                fleet.file_stem().unwrap_or_default().to_string_lossy()
            );
            cases.extend(cases_of(&label, workflow, fleet, &models));
        }
    }
    let dir = tempfile::tempdir().expect("a temporary directory");
    let (workflow, fleet) = llama_70b_bf16_on_4090s(dir.path());
    let big = cases_of("llama-70b-bf16@rtx8", &workflow, &fleet, &models);
    assert_eq!(big.len(), 1, "Llama-3-70B bf16 is placed on the eight 4090s");
    let args = big[0]["args"].to_string();
    assert!(
        args.contains("\"--tensor-parallel-size\",\"2\"") && args.contains("\"--pipeline-parallel-size\",\"4\""),
        "TP 2 × PP 4: {args}"
    );
    // Llama 3 is served with its family's tool calls, which the pinned vLLM knows.
    assert!(
        args.contains("\"--enable-auto-tool-choice\",\"--tool-call-parser\",\"llama3_json\""),
        "tool calls: {args}"
    );
    cases.extend(big);
    // The reference fleet's split writer (over Ray) is among them.
    assert!(
        cases.iter().any(|c| c["args"].to_string().contains("ray")),
        "a vLLM replica split over Ray is checked"
    );
    assert!(cases.len() >= 4, "{} vLLM command lines", cases.len());
    let file = dir.path().join("cases.json");
    std::fs::write(&file, serde_json::to_vec_pretty(&cases).expect("JSON")).expect("write the cases");
    let out = Command::new(skein_testkit::tools::vllm_python())
        .arg(root().join("tests/engines/vllm_check.py"))
        .arg(&file)
        .env("VLLM_TARGET_DEVICE", "cpu")
        .env("VLLM_LOGGING_LEVEL", "WARNING")
        .output()
        .expect("the venv's python runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("{stdout}");
    assert!(
        out.status.success(),
        "vLLM 0.33.0 refuses Skein's command lines or starves a worker:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
