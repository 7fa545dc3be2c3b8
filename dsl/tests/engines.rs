//! The `engines:` key of a model: one engine or a list, the same IR from YAML and Rhai,
//! and absent when not written (so workflows without it keep their IR).

mod common;

use skein_dsl::ir::{Backend, EngineChoice};

const YAML: &str = r#"
name: engines
agents:
  local:
    model: { repo: HuggingFaceTB/SmolLM2-135M-Instruct-GGUF, engines: llama.cpp }
  either:
    model:
      repo: HuggingFaceTB/SmolLM2-135M-Instruct
      engines: [vllm, Built-In, candle]
  any: { model: HuggingFaceTB/SmolLM2-135M-Instruct }
steps:
  - { id: a, agent: local, prompt: "hi" }
  - { id: b, agent: either, prompt: "hi" }
  - { id: c, agent: any, prompt: "hi" }
"#;

const RHAI: &str = r#"
workflow("engines");
agent("local", #{ model: #{ repo: "HuggingFaceTB/SmolLM2-135M-Instruct-GGUF", engines: "llama.cpp" } });
agent("either", #{ model: #{ repo: "HuggingFaceTB/SmolLM2-135M-Instruct", engines: ["vllm", "Built-In", "candle"] } });
agent("any", #{ model: "HuggingFaceTB/SmolLM2-135M-Instruct" });
step("a", #{ agent: "local", prompt: "hi" });
step("b", #{ agent: "either", prompt: "hi" });
step("c", #{ agent: "any", prompt: "hi" });
"#;

fn engines(w: &skein_dsl::ir::Workflow, agent: &str) -> Vec<EngineChoice> {
    match &w.agents[agent].backend {
        Backend::Model(m) => m.engines.clone(),
        Backend::Endpoint(_) => panic!("{agent} has a model"),
    }
}

#[test]
fn engines_are_read_from_yaml_and_rhai_alike() {
    let yaml = common::parse_clean("engines.yaml", YAML);
    let rhai = common::parse_clean("engines.rhai", RHAI);
    assert_eq!(yaml, rhai);
    assert_eq!(engines(&yaml, "local"), [EngineChoice::LlamaCpp]);
    // Sorted, without duplicates: `candle` is the built-in engine's name in plans.
    assert_eq!(engines(&yaml, "either"), [EngineChoice::Builtin, EngineChoice::Vllm]);
    assert!(engines(&yaml, "any").is_empty());
    insta::assert_yaml_snapshot!("engines_ir", yaml);
}
