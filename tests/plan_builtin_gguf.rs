//! The planner offers a GGUF variant to the built-in engine only when that engine can
//! start it: candle runs GGUF files of the `llama` architecture alone, so a Qwen2 GGUF
//! on a CPU-only node is not planned on it (it failed at load, five times, before).

use std::collections::BTreeMap;
use std::path::Path;

use skein_model_registry::catalog::ModelInfo;
use skein_orchestrator::graph::{GraphConfig, GraphSnapshot};
use skein_orchestrator::plan::{self, Plan, PlanInput, PlanSettings};

fn models() -> BTreeMap<String, ModelInfo> {
    skein_testkit::models::reference_catalog()
}

fn graph(fleet: &str) -> GraphSnapshot {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(fleet);
    let fleet = skein_agent::fleet::load_fleet(path).expect("a valid fleet file");
    let messages = skein_agent::daemon::fleet_messages(&fleet, 0.0);
    skein_orchestrator::agents::graph_from_wire(messages, GraphConfig::default(), 0)
        .expect("the orchestrator accepts the fleet's nodes")
        .snapshot()
}

fn plan_of(model: &str) -> Plan {
    let text = format!(
        "name: builtin-gguf\nagents:\n  helper:\n    model: {{ repo: {model}, context: 2048, formats: [gguf], engines: builtin }}\n\
         steps:\n  - {{ id: answer, agent: helper, prompt: \"hi\" }}\n"
    );
    let parsed = skein_dsl::parse("builtin-gguf.yaml", &text);
    let Some(workflow) = parsed.workflow.clone() else {
        panic!("{}", parsed.render(skein_dsl::RenderOptions::default()));
    };
    plan::plan(&PlanInput {
        workflow: &workflow,
        models: &models(),
        adapters: &skein_orchestrator::plan::NO_ADAPTERS,
        graph: &graph("workflows/fleets/cpu.yaml"),
        running: &[],
        settings: PlanSettings::default(),
    })
    .expect("plans")
}

#[test]
fn a_qwen2_gguf_is_not_planned_on_the_built_in_engine() {
    let models = models();
    let qwen = &models["Qwen/Qwen2.5-0.5B-Instruct"];
    let gguf = qwen
        .variants
        .iter()
        .find(|v| v.format() == skein_model_registry::WeightFormat::Gguf)
        .expect("a GGUF variant");
    assert!(!qwen.builtin_engine_loads(gguf));
    let plan = plan_of("Qwen/Qwen2.5-0.5B-Instruct");
    assert!(
        plan.instances.iter().all(|i| i.instance != "helper"),
        "the built-in engine cannot start a qwen2 GGUF: {plan:#?}"
    );
    assert!(!plan.admitted, "{plan:#?}");

    // A Llama-architecture GGUF stays the built-in engine's to run.
    let llama = models
        .values()
        .find(|m| m.architecture() == skein_model_registry::Architecture::Llama)
        .expect("a Llama reference model");
    let gguf = llama
        .variants
        .iter()
        .find(|v| v.format() == skein_model_registry::WeightFormat::Gguf)
        .expect("a GGUF variant of it");
    assert!(llama.builtin_engine_loads(gguf));
}
