//! Plans of the example workflows on fleet files, as snapshots: the graph each fleet's
//! agents would build (through the protocol's messages), the reference models' catalogs
//! (what `skein models inspect` reads from the hub), and the planner users run.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use skein_dsl::ir::Precision;
use skein_model_registry::catalog::ModelInfo;
use skein_orchestrator::graph::{GraphConfig, GraphSnapshot};
use skein_orchestrator::plan::{self, Plan, PlanInput, PlanSettings, PlannedInstance};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn models() -> BTreeMap<String, ModelInfo> {
    skein_testkit::models::reference_catalog()
}

fn graph(fleet: &str) -> GraphSnapshot {
    let fleet = skein_agent::fleet::load_fleet(root().join(fleet)).expect("a valid fleet file");
    let messages = skein_agent::daemon::fleet_messages(&fleet, 0.0);
    skein_orchestrator::agents::graph_from_wire(messages, GraphConfig::default(), 0)
        .expect("the orchestrator accepts the fleet's nodes")
        .snapshot()
}

fn workflow(file: &str) -> skein_dsl::Workflow {
    let parsed = skein_orchestrator::workflows::load(&root().join(file)).expect("readable");
    parsed.workflow.expect("a valid workflow")
}

fn plan_of(workflow_file: &str, fleet: &str) -> Plan {
    let workflow = workflow(workflow_file);
    let models = models();
    let graph = graph(fleet);
    plan::plan(&PlanInput {
        workflow: &workflow,
        models: &models,
        adapters: &skein_orchestrator::plan::NO_ADAPTERS,
        graph: &graph,
        running: &[],
        settings: PlanSettings::default(),
    })
    .expect("plans")
}

fn instance<'p>(plan: &'p Plan, name: &str) -> &'p PlannedInstance {
    plan.instances
        .iter()
        .find(|i| i.instance == name)
        .unwrap_or_else(|| panic!("{name} is placed: {plan:#?}"))
}

fn cards(i: &PlannedInstance) -> BTreeSet<&str> {
    i.devices
        .iter()
        .filter(|d| d.gpu.is_some())
        .map(|d| d.name.as_str())
        .collect()
}

/// The lab story (README, docs/placement.md): on the reference fleet the 33B coder runs
/// at full precision on an A100 and the 70B writer on an NVLink pair of A100s.
#[test]
fn on_the_lab_fleet_the_coder_gets_full_precision_on_an_a100() {
    let plan = plan_of("workflows/lab-research.yaml", "workflows/fleets/lab.yaml");
    assert!(plan.admitted, "{plan:#?}");
    let coder = instance(&plan, "coder");
    assert_eq!(coder.precision, Precision::Bf16);
    assert_eq!(cards(coder), BTreeSet::from(["NVIDIA A100-SXM4-80GB"]));
    let writer = instance(&plan, "writer");
    assert_eq!(writer.precision, Precision::Bf16);
    assert_eq!(writer.layout.tensor_parallel, 2);
    assert!(writer.why.iter().any(|w| w.contains("NVLink")), "{:?}", writer.why);
    assert_eq!(plan.remote.len(), 1);
}

/// With the A100s taken, the coder goes to 6-bit over RTX 4090s of both boxes, and the
/// 70B writer is split unevenly over GPUs of different models, none on host RAM.
#[test]
fn on_a_busy_lab_fleet_the_coder_goes_to_6_bit_and_the_70b_splits_unevenly() {
    let plan = plan_of("workflows/lab-research.yaml", "workflows/fleets/lab-busy.yaml");
    assert!(plan.admitted, "{plan:#?}");
    let coder = instance(&plan, "coder");
    assert_eq!(coder.precision, Precision::Int6);
    assert_eq!(cards(coder), BTreeSet::from(["NVIDIA GeForce RTX 4090"]));
    let writer = instance(&plan, "writer");
    assert!(writer.precision >= Precision::Int8);
    assert!(!writer.slow, "no layer in host RAM: {writer:#?}");
    assert!(
        cards(writer).len() >= 2,
        "GPUs of different models: {:?}",
        cards(writer)
    );
    let partition = &writer.layout.layer_partition;
    assert!(partition.len() >= 2, "a layer split: {partition:?}");
    assert!(partition.iter().any(|&l| l != partition[0]), "uneven: {partition:?}");
    assert_eq!(partition.iter().sum::<u64>(), 80);
    // Nothing lands where another tenant's job holds the memory.
    for i in &plan.instances {
        for d in &i.devices {
            assert!(
                d.reserved <= d.usable,
                "{} {:?}: {} of {}",
                d.node,
                d.gpu,
                d.reserved,
                d.usable
            );
        }
    }
}

/// A model too large for the GPUs it may use is refused with the figures.
#[test]
fn an_unplaceable_agent_says_why_with_figures() {
    let plan = plan_of("workflows/lab-research.yaml", "workflows/fleets/laptop.yaml");
    assert!(!plan.admitted);
    let reason = plan.queued_reason.as_deref().expect("a reason");
    assert!(reason.contains("writer"), "{reason}");
    let writer = plan
        .unplaced
        .iter()
        .find(|u| u.instance == "writer")
        .expect("writer unplaced");
    assert!(writer.reason.contains("GiB"), "{}", writer.reason);
}

/// What `skein plan --server` reads back is what the server sent (all but the estimates,
/// which stay on the server).
#[test]
fn a_plan_reads_back_from_its_json() {
    for fleet in [
        "workflows/fleets/lab.yaml",
        "workflows/fleets/lab-busy.yaml",
        "workflows/fleets/laptop.yaml",
    ] {
        let plan = plan_of("workflows/lab-research.yaml", fleet);
        let mut sent = serde_json::to_value(&plan).expect("serializes");
        for i in sent["instances"].as_array_mut().expect("instances") {
            i.as_object_mut().expect("an object").remove("estimate");
        }
        let read: Plan = serde_json::from_value(sent.clone()).expect("reads back");
        assert_eq!(serde_json::to_value(&read).expect("serializes"), sent, "{fleet}");
    }
}

#[test]
fn hello_runs_on_the_cpu_of_a_machine_without_gpus_with_the_built_in_engine() {
    let plan = plan_of("workflows/hello.yaml", "workflows/fleets/cpu.yaml");
    assert!(plan.admitted, "{plan:#?}");
    let helper = instance(&plan, "helper");
    assert_eq!(helper.engine, "candle");
    assert_eq!(helper.variant, "Qwen/Qwen2.5-0.5B-Instruct");
    assert_eq!(helper.devices.len(), 1);
    assert_eq!(helper.devices[0].gpu, None, "on the host");
}

/// A plan says what an agent with tools gets: the tool-call format its engine reads for
/// the model's family (Qwen2: Hermes), on the agents that list tools only.
#[test]
fn a_plan_says_how_an_agent_with_tools_calls_them() {
    let plan = plan_of("workflows/acting.yaml", "workflows/fleets/lab.yaml");
    let why_of = |agent: &str| -> Vec<String> {
        plan.instances
            .iter()
            .filter(|i| i.agents.iter().any(|a| a == agent))
            .flat_map(|i| i.why.clone())
            .collect()
    };
    let pricer = why_of("pricer");
    assert!(
        pricer
            .iter()
            .any(|l| l.starts_with("tools of pricer: ") && l.contains("Qwen2 model's calls in the `hermes` format")),
        "{pricer:#?}"
    );
    // The planner shares the instance but lists no tools: the line names only the pricer.
    assert!(!pricer.iter().any(|l| l.contains("planner")), "{pricer:#?}");
}

/// The workflow of `workflows/lora-tutors.yaml` held to the four RTX 4090s of `rtx-2` (idle at the start).
fn tutors_on_rtx_2() -> skein_dsl::Workflow {
    let mut tutors = workflow("workflows/lora-tutors.yaml");
    for agent in tutors.agents.values_mut() {
        if let skein_dsl::ir::Backend::Model(m) = &mut agent.backend {
            m.gpu.nodes = vec!["rtx-2".to_owned()];
        }
    }
    tutors
}

/// Five tutors on five rank-16 LoRA adapters of one 8B base, in BF16, on the four
/// 24 GB RTX 4090s of one node: one base instance with the five adapters fits on one
/// card, and its reasons say what the sharing saves. Five merged fine-tunes (five
/// copies of the base, 16 GB of weights each) do not fit on four cards: the fifth is
/// left to the host CPU.
#[test]
fn five_lora_adapters_of_one_8b_base_fit_where_five_full_copies_do_not() {
    use skein_testkit::adapters::{LLAMA_3_8B_INSTRUCT, llama_3_8b_info, tutor_adapter_catalog};
    let graph = graph("workflows/fleets/lab.yaml");
    let mut models = models();
    models.insert(LLAMA_3_8B_INSTRUCT.to_owned(), llama_3_8b_info());
    let adapters = tutor_adapter_catalog();
    let tutors = tutors_on_rtx_2();
    let shared = plan::plan(&PlanInput {
        workflow: &tutors,
        models: &models,
        adapters: &adapters,
        graph: &graph,
        running: &[],
        settings: PlanSettings::default(),
    })
    .expect("plans");
    assert!(shared.admitted, "{shared:#?}");
    assert_eq!(shared.instances.len(), 1, "{shared:#?}");
    let base = &shared.instances[0];
    assert_eq!(base.agents.len(), 5);
    assert_eq!(base.engine, "vllm");
    assert_eq!(base.precision, Precision::Bf16);
    assert_eq!(cards(base).len(), 1, "{base:#?}");
    assert_eq!(base.adapters.len(), 5);
    assert!(base.adapters.iter().all(|a| a.format == "peft" && a.rank == 16));
    let line = base
        .why
        .iter()
        .find(|w| w.starts_with("serves 5 LoRA adapters on one base instance"))
        .unwrap_or_else(|| panic!("{:#?}", base.why));
    // Five 80 MiB slots of rank 16 (the 8B's 32 layers of every LoRA-capable layer).
    assert!(line.contains("add 400.0 MiB on the devices"), "{line}");
    assert!(line.contains("sharing saves"), "{line}");
    let devices = &base.estimate.as_ref().unwrap().devices;
    assert!(devices[0].items.iter().any(|i| i.what == "LoRA adapters"));

    // The same tutors as five merged fine-tunes: five 8B repositories.
    let mut copies = tutors.clone();
    for (name, agent) in copies.agents.iter_mut() {
        if let skein_dsl::ir::Backend::Model(m) = &mut agent.backend {
            m.repo = format!("lab-tutors/llama3-8b-{name}-merged");
            m.adapter = None;
            let mut info = llama_3_8b_info();
            info.repo = skein_model_registry::hub::RepoId::parse(&m.repo).unwrap();
            models.insert(m.repo.clone(), info);
        }
    }
    let apart = plan::plan(&PlanInput {
        workflow: &copies,
        models: &models,
        adapters: &plan::NO_ADAPTERS,
        graph: &graph,
        running: &[],
        settings: PlanSettings::default(),
    })
    .expect("plans");
    // Four copies take the four cards (19.1 GB each); the fifth finds no GPU and
    // falls back to the host CPU (the slow last resort), or does not fit at all.
    let on_gpus = apart
        .instances
        .iter()
        .filter(|i| !i.slow && !cards(i).is_empty())
        .count();
    assert_eq!(on_gpus, 4, "{apart:#?}");
    assert_eq!(apart.instances.len() + apart.unplaced.len(), 5, "{apart:#?}");
    assert!(
        apart.unplaced.len() == 1 || apart.instances.iter().any(|i| i.slow && i.family == "CPU"),
        "{apart:#?}"
    );
}

/// Preemption among instances of equal priority takes the one whose owner is furthest
/// over their fair share, even where size and id would pick the other.
#[test]
fn preemption_takes_from_the_owner_furthest_over_their_share_first() {
    use skein_orchestrator::plan::{HeldGpu, RunningInstance};
    use skein_orchestrator::sharing::fair::Standing;
    let dir = tempfile::tempdir().unwrap();
    let fleet = dir.path().join("one.yaml");
    std::fs::write(
        &fleet,
        "fleet: one\nnodes:\n  box:\n    gpus: { model: RTX4090-24GB, count: 1 }\n    host: { cpu_cores: 16, memory: 64GiB, network: 10Gbps }\n    telemetry:\n      memory_used: 23GiB\n",
    )
    .unwrap();
    let file = dir.path().join("urgent.yaml");
    std::fs::write(
        &file,
        "name: urgent\nplacement: { priority: 10 }\nagents:\n  a:\n    model: { repo: Qwen/Qwen2.5-0.5B-Instruct, context: 4096, engines: [vllm] }\nsteps:\n  - { id: s, agent: a, prompt: \"Hi.\" }\n",
    )
    .unwrap();
    let workflow = skein_orchestrator::workflows::load(&file).unwrap().workflow.unwrap();
    let graph = graph(fleet.to_str().unwrap());
    // Two runs of priority 0 hold 8 GiB each of the GPU; freeing one admits the workflow.
    let running = |id: &str, group: f64| RunningInstance {
        id: id.to_owned(),
        workflow: format!("run-{id}"),
        priority: 0,
        gpus: vec![HeldGpu {
            node: "box".to_owned(),
            gpu: 0,
            bytes: 8 << 30,
        }],
        standing: Some(Standing { group, user: 1.0 }),
    };
    // By id alone `a-under` would go first; its owner's group is under its share.
    let instances = [running("a-under", 0.9), running("z-over", 0.2)];
    let models = models();
    let plan_with = |running: &[RunningInstance]| {
        plan::plan(&PlanInput {
            workflow: &workflow,
            models: &models,
            adapters: &plan::NO_ADAPTERS,
            graph: &graph,
            running,
            settings: PlanSettings {
                allow_preemption: true,
                ..PlanSettings::default()
            },
        })
        .expect("plans")
    };
    let plan = plan_with(&instances);
    assert!(plan.unplaced.is_empty(), "{plan:#?}");
    let preempted: Vec<&str> = plan.preempted.iter().map(|p| p.id.as_str()).collect();
    assert_eq!(preempted, ["z-over"], "{plan:#?}");
    // Without standings, the tie breaks by id.
    let unknown: Vec<RunningInstance> = instances
        .iter()
        .cloned()
        .map(|r| RunningInstance { standing: None, ..r })
        .collect();
    let plan = plan_with(&unknown);
    let preempted: Vec<&str> = plan.preempted.iter().map(|p| p.id.as_str()).collect();
    assert_eq!(preempted, ["a-under"], "{plan:#?}");
}

/// The paper search's embedding model (workflows/paper-search.yaml, e5-mistral, a bare
/// `MistralModel` pooling the last token) is planned like any model, on an engine that
/// serves embeddings, and says how that engine starts; on a CPU-only fleet that is
/// llama.cpp, never the built-in engine, which only generates. A step may not prompt it.
#[test]
fn an_embedding_model_is_planned_on_an_engine_that_embeds_and_no_step_may_prompt_it() {
    use skein_model_registry::{ModelTask, Pooling};
    use skein_testkit::embeddings::e5_mistral_info;
    let mut models = models();
    let e5 = e5_mistral_info();
    models.insert(e5.repo.to_string(), e5);
    let search = workflow("workflows/paper-search.yaml");
    let plan_on = |workflow: &skein_dsl::Workflow, fleet: &str| {
        let graph = graph(fleet);
        plan::plan(&PlanInput {
            workflow,
            models: &models,
            adapters: &plan::NO_ADAPTERS,
            graph: &graph,
            running: &[],
            settings: PlanSettings::default(),
        })
    };
    let lab = plan_on(&search, "workflows/fleets/lab.yaml").expect("plans");
    assert!(lab.admitted, "{lab:#?}");
    let embedder = instance(&lab, "embedder");
    assert_eq!(
        embedder.task,
        ModelTask::Embed {
            pooling: Some(Pooling::Last)
        }
    );
    assert!(
        embedder
            .why
            .iter()
            .any(|w| w.starts_with("an embedding model: ") && w.contains("POST /v1/embeddings")),
        "{:#?}",
        embedder.why
    );
    assert!(instance(&lab, "answerer").task.is_generate());

    let cpu = plan_on(&search, "workflows/fleets/cpu.yaml").expect("plans");
    let embedder = instance(&cpu, "embedder");
    assert_eq!(embedder.engine, "llama.cpp", "{embedder:#?}");
    assert!(
        embedder.why.iter().any(|w| w.contains("--embeddings --pooling last")),
        "{:#?}",
        embedder.why
    );

    let mut prompted = search.clone();
    prompted.steps[0].agent = "embedder".to_owned();
    let error = plan_on(&prompted, "workflows/fleets/lab.yaml").expect_err("a step prompts the embedder");
    assert!(matches!(error, plan::PlanError::PromptsEmbedder { .. }), "{error}");
    let message = error.to_string();
    assert!(
        message.contains("step `answer` prompts agent `embedder`") && message.contains("POST /v1/embeddings"),
        "{message}"
    );
}
