//! Engines on the CPU and the workflow's `engines:` key, planned on the reference models:
//! a CPU-only node serves a GGUF variant with llama.cpp (modelled faster than the built-in
//! engine), `engines:` keeps the built-in engine or requires one, and the plan's reasons
//! say which engines the workflow ruled out.

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::json;
use skein_model_registry::catalog::ModelInfo;
use skein_orchestrator::graph::{GraphConfig, GraphSnapshot};
use skein_orchestrator::plan::{self, Plan, PlanInput, PlanSettings, PlannedInstance};

fn models() -> BTreeMap<String, ModelInfo> {
    skein_testkit::models::reference_catalog()
}

fn graph(fleet: &str) -> GraphSnapshot {
    let dir = tempfile::tempdir().unwrap();
    let path = if fleet == SERVER {
        let path = dir.path().join("server.yaml");
        std::fs::write(&path, SERVER_FLEET).unwrap();
        path
    } else {
        Path::new(env!("CARGO_MANIFEST_DIR")).join(fleet)
    };
    let fleet = skein_agent::fleet::load_fleet(path).expect("a valid fleet file");
    let messages = skein_agent::daemon::fleet_messages(&fleet, 0.0);
    skein_orchestrator::agents::graph_from_wire(messages, GraphConfig::default(), 0)
        .expect("the orchestrator accepts the fleet's nodes")
        .snapshot()
}

/// A CPU-only server with room for a 33B model in RAM.
const SERVER: &str = "server";
const SERVER_FLEET: &str = "fleet: server\nnodes:\n  server:\n    host: { cpu_cores: 64, memory: 256GiB }\n";

/// A small model (its GGUF files are Qwen2's, which the built-in engine may not load).
const QWEN: &str = "Qwen/Qwen2.5-0.5B-Instruct";
/// A Llama-architecture model: its GGUF files run on both CPU engines.
const DEEPSEEK: &str = "deepseek-ai/deepseek-coder-33b-instruct";

/// The plan of one agent on Qwen2.5-0.5B-Instruct whose model block adds `model_keys`.
fn plan_with(model_keys: &str, fleet: &str) -> Plan {
    plan_of(QWEN, model_keys, fleet)
}

/// The plan of one agent on `model` whose model block adds `model_keys`.
fn plan_of(model: &str, model_keys: &str, fleet: &str) -> Plan {
    let text = format!(
        "name: engines\nagents:\n  helper:\n    model: {{ repo: {model}, context: 2048{model_keys} }}\n\
         steps:\n  - {{ id: answer, agent: helper, prompt: \"hi\" }}\n"
    );
    let parsed = skein_dsl::parse("engines.yaml", &text);
    let Some(workflow) = parsed.workflow.clone() else {
        panic!("{}", parsed.render(skein_dsl::RenderOptions::default()));
    };
    plan::plan(&PlanInput {
        workflow: &workflow,
        models: &models(),
        adapters: &skein_orchestrator::plan::NO_ADAPTERS,
        graph: &graph(fleet),
        running: &[],
        settings: PlanSettings::default(),
    })
    .expect("plans")
}

fn helper(plan: &Plan) -> &PlannedInstance {
    plan.instances
        .iter()
        .find(|i| i.instance == "helper")
        .unwrap_or_else(|| panic!("helper is placed: {plan:#?}"))
}

/// What a snapshot shows of the placed helper: engine, variant, where, speed, reasons.
fn summary(plan: &Plan) -> serde_json::Value {
    let h = helper(plan);
    json!({
        "engine": h.engine,
        "variant": h.variant,
        "family": h.family,
        "devices": h.devices.iter().map(|d| format!("{} {:?}", d.node, d.gpu)).collect::<Vec<_>>(),
        "tokens_per_s": h.tokens_per_s,
        "why": h.why,
        "rejected": h.rejected.iter().map(|r| format!("{} — {}", r.option, r.why)).collect::<Vec<_>>(),
    })
}

#[test]
fn a_cpu_node_serves_a_gguf_variant_with_llama_cpp_by_itself() {
    let plan = plan_of(DEEPSEEK, ", formats: [gguf]", SERVER);
    assert!(plan.admitted, "{plan:#?}");
    let h = helper(&plan);
    assert_eq!(h.engine, "llama.cpp");
    assert_eq!(h.family, "CPU");
    assert!(h.slow);
    assert_eq!(h.devices.len(), 1);
    assert_eq!(h.devices[0].gpu, None, "on the host");
    // No GPU: llama-server keeps every layer on the CPU.
    assert_eq!(h.layout.gpu_layers, None);
    assert!(h.layout.tensor_split.is_empty());
    // The built-in engine on the same variant is the runner-up, slower by its measured
    // factor (a quarter of llama.cpp's speed).
    let builtin = h
        .rejected
        .iter()
        .find(|r| r.option.contains("candle CPU") && r.option.starts_with(&h.variant))
        .unwrap_or_else(|| panic!("the built-in engine is a rejected option: {:#?}", h.rejected));
    assert!(builtin.why.starts_with("slower"), "{builtin:?}");
    // Keys sorted whether or not serde_json keeps insertion order (llguidance turns
    // on `preserve_order` in workspace builds).
    insta::with_settings!({ sort_maps => true }, { insta::assert_json_snapshot!("gguf_on_cpu_by_itself", summary(&plan)); });
}

#[test]
fn engines_builtin_keeps_the_built_in_engine_and_the_plan_says_what_it_ruled_out() {
    let plan = plan_of(DEEPSEEK, ", formats: [gguf], engines: builtin", SERVER);
    let h = helper(&plan);
    assert_eq!(h.engine, "candle");
    assert!(
        h.why
            .iter()
            .any(|w| w == "ruled out by the workflow (engines: builtin): llama.cpp"),
        "{:?}",
        h.why
    );
    assert!(
        h.rejected.iter().all(|r| !r.option.contains("llama.cpp")),
        "{:#?}",
        h.rejected
    );
    // Keys sorted whether or not serde_json keeps insertion order (llguidance turns
    // on `preserve_order` in workspace builds).
    insta::with_settings!({ sort_maps => true }, { insta::assert_json_snapshot!("gguf_on_cpu_builtin_required", summary(&plan)); });
}

#[test]
fn engines_llama_cpp_rules_out_safetensors_and_the_built_in_engine() {
    // Without `formats`, the bf16 checkpoint would run on the built-in engine; llama.cpp
    // loads only GGUF, so the plan takes the best GGUF variant with it.
    let free = plan_with("", "workflows/fleets/cpu.yaml");
    assert_eq!(helper(&free).engine, "candle", "{:#?}", helper(&free));
    let plan = plan_with(", engines: llama.cpp", "workflows/fleets/cpu.yaml");
    let h = helper(&plan);
    assert_eq!(h.engine, "llama.cpp");
    assert!(
        h.variant.ends_with(".gguf") || h.variant.contains("GGUF"),
        "{}",
        h.variant
    );
    assert!(
        h.why
            .iter()
            .any(|w| w == "ruled out by the workflow (engines: llama.cpp): builtin, vllm"),
        "{:?}",
        h.why
    );
    // Keys sorted whether or not serde_json keeps insertion order (llguidance turns
    // on `preserve_order` in workspace builds).
    insta::with_settings!({ sort_maps => true }, { insta::assert_json_snapshot!("any_format_llama_cpp_required", summary(&plan)); });
}

#[test]
fn an_engine_that_cannot_serve_leaves_the_agent_unplaced_with_the_reason() {
    // vLLM runs only on GPUs, and loads no GGUF: nothing can serve it on a laptop.
    let plan = plan_with(", engines: vllm", "workflows/fleets/cpu.yaml");
    assert!(!plan.admitted);
    let reason = &plan.unplaced[0].reason;
    assert!(
        reason.contains("the CPU is ruled out by the workflow (engines: vllm)"),
        "{reason}"
    );
    assert!(
        reason.contains("the workflow's engines (vllm) cannot load gguf"),
        "{reason}"
    );
    insta::assert_snapshot!("vllm_required_on_a_laptop", reason);
}

#[test]
fn on_gpus_engines_rule_out_the_gpu_engine_of_a_format() {
    // On the lab fleet the bf16 checkpoint goes to vLLM; without vLLM, a GGUF variant
    // goes to llama.cpp on a GPU.
    let free = plan_with("", "workflows/fleets/lab.yaml");
    assert_eq!(helper(&free).engine, "vllm");
    let plan = plan_with(", engines: [llama.cpp, builtin]", "workflows/fleets/lab.yaml");
    let h = helper(&plan);
    assert_eq!(h.engine, "llama.cpp");
    assert!(h.devices.iter().all(|d| d.gpu.is_some()), "{h:#?}");
    assert!(
        h.why
            .iter()
            .any(|w| w == "ruled out by the workflow (engines: builtin, llama.cpp): vllm"),
        "{:?}",
        h.why
    );
}
