//! Plans of workflow files on fleet files, turned into what agents would be told to
//! start: the start commands of each planned replica (a split's pieces wave by wave, then
//! its serving engine) and their launch specs. Shared by the tests that check engines'
//! command lines (`tests/vllm_args.rs`, `tests/engine_commands.rs`), so that every
//! command line they check is one a real plan produces.

#![allow(dead_code)] // each test uses what it needs

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use skein_agent::engine::LaunchSpec;
use skein_agent::engine::host::{EngineHostConfig, launch_spec};
use skein_model_registry::catalog::{ModelInfo, Variant};
use skein_orchestrator::graph::{GraphConfig, GraphSnapshot};
use skein_orchestrator::plan::{self, Plan, PlanInput, PlanSettings, PlannedInstance};
use skein_orchestrator::run::launch::{Launch, start_instance};
use skein_proto::agent::v1 as pb;

/// The graph of a fleet file's nodes, as the orchestrator builds it when they join.
pub fn graph(fleet: &Path) -> GraphSnapshot {
    let fleet = skein_agent::fleet::load_fleet(fleet).expect("a valid fleet file");
    let messages = skein_agent::daemon::fleet_messages(&fleet, 0.0);
    skein_orchestrator::agents::graph_from_wire(messages, GraphConfig::default(), 0)
        .expect("the orchestrator accepts the fleet's nodes")
        .snapshot()
}

/// An agent's engine programs by their plain names, listening on 10.0.0.1.
pub fn host_config() -> EngineHostConfig {
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

/// The plan of the workflow file `workflow` on the fleet file `fleet`, with its graph;
/// `None` when the workflow fits nowhere on that fleet.
pub fn plan_files(
    workflow: &Path,
    fleet: &Path,
    models: &BTreeMap<String, ModelInfo>,
) -> Option<(Plan, GraphSnapshot)> {
    let parsed = skein_orchestrator::workflows::load(workflow).expect("readable");
    let workflow = parsed.workflow.expect("a valid workflow");
    let graph = graph(fleet);
    // The example's LoRA tutors' adapters (workflows/lora-tutors.yaml).
    let adapters = skein_testkit::adapters::tutor_adapter_catalog();
    let plan = plan::plan(&PlanInput {
        workflow: &workflow,
        models,
        adapters: &adapters,
        graph: &graph,
        running: &[],
        settings: PlanSettings::default(),
    })
    .ok()?;
    Some((plan, graph))
}

/// One start command and the node it goes to.
pub struct Start {
    pub node: String,
    pub start: pb::StartInstance,
}

/// The start commands of the planned replica `name`, in the order they are sent: a
/// split's pieces wave by wave (at made-up addresses that sort against the plan's order,
/// so ranks must not follow them), then the serving engine, which is last.
pub fn starts(
    name: &str,
    planned: &PlannedInstance,
    models: &BTreeMap<String, ModelInfo>,
    graph: &GraphSnapshot,
) -> Vec<Start> {
    match start_instance(name, planned, models, graph, 7).expect("a launch") {
        Launch::One { start, .. } => vec![Start {
            node: planned.devices[0].node.clone(),
            start,
        }],
        Launch::Split(split) => {
            let mut ready = BTreeMap::new();
            let mut node_ids = Vec::new();
            let mut starts = Vec::new();
            for wave in 0..split.waves() {
                for (i, piece) in split.wave(wave, &ready).expect("the wave").into_iter().enumerate() {
                    ready.insert(piece.name.clone(), format!("10.0.{wave}.{}:{}", 200 - i, 40_000 + i));
                    if let Some(pb::start_instance::Engine::RayNode(r)) = &piece.start.engine {
                        node_ids.push((r.node_id.clone().expect("a pinned Ray node ID"), piece.node.clone()));
                    }
                    starts.push(Start {
                        node: piece.node,
                        start: piece.start,
                    });
                }
            }
            // vLLM ranks the driver's (head's) node first, then the others by node ID:
            // the IDs sort in the plan's node order.
            if !node_ids.is_empty() {
                let mut plan_nodes: Vec<&str> = planned.devices.iter().map(|d| d.node.as_str()).collect();
                plan_nodes.dedup();
                let mut sorted = node_ids.clone();
                sorted[1..].sort();
                let by_id: Vec<&str> = sorted.iter().map(|(_, node)| node.as_str()).collect();
                assert_eq!(by_id, plan_nodes, "{name}: Ray node IDs {node_ids:?}");
            }
            starts.push(Start {
                node: split.node.clone(),
                start: split.serving(&ready).expect("the serving command"),
            });
            starts
        }
    }
}

/// The model and the variant a planned replica runs.
pub fn model_of<'m>(
    planned: &PlannedInstance,
    models: &'m BTreeMap<String, ModelInfo>,
) -> (&'m ModelInfo, &'m Variant) {
    models
        .values()
        .find_map(|m| Some((m, m.variants.iter().find(|v| v.id == planned.variant)?)))
        .unwrap_or_else(|| panic!("{}: no model has the variant {}", planned.instance, planned.variant))
}

/// The launch spec an agent makes of `start`, its variant's files in a Hugging Face
/// cache at `/hf` (snapshot `000…`), its adapters' at the revisions the plan read, on
/// port 8000.
pub fn spec(start: &pb::StartInstance, variant: &Variant) -> LaunchSpec {
    let snapshot = PathBuf::from(format!(
        "/hf/models--{}/snapshots/{}",
        variant.repo.to_string().replace('/', "--"),
        "0".repeat(40)
    ));
    let adapters: Vec<PathBuf> = start
        .adapters
        .iter()
        .filter_map(|a| a.files.as_ref())
        .map(|f| {
            PathBuf::from(format!(
                "/hf/models--{}/snapshots/{}",
                f.repo.replace('/', "--"),
                f.revision
            ))
        })
        .collect();
    launch_spec(start, Some(&snapshot), &adapters, &host_config(), 8000).expect("a launch spec")
}
