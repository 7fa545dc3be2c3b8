//! The `adapter:` key of a model: a LoRA adapter pin, written as a repository id or as
//! `{ repo, file, revision }`, the same IR from YAML and Rhai, and clear errors.

mod common;

use skein_dsl::ir::{Backend, VariantPin};

const YAML: &str = r#"
name: adapters
agents:
  algebra:
    model: { repo: meta-llama/Meta-Llama-3-8B-Instruct, adapter: lab/llama3-algebra-lora }
  chemistry:
    model:
      repo: meta-llama/Meta-Llama-3-8B-Instruct
      adapter: { repo: lab/llama3-loras-GGUF, file: chemistry-lora.gguf, revision: v2 }
  plain: { model: meta-llama/Meta-Llama-3-8B-Instruct }
steps:
  - { id: a, agent: algebra, prompt: "hi" }
  - { id: b, agent: chemistry, prompt: "hi" }
  - { id: c, agent: plain, prompt: "hi" }
"#;

const RHAI: &str = r#"
workflow("adapters");
agent("algebra", #{ model: #{ repo: "meta-llama/Meta-Llama-3-8B-Instruct", adapter: "lab/llama3-algebra-lora" } });
agent("chemistry", #{ model: #{ repo: "meta-llama/Meta-Llama-3-8B-Instruct",
    adapter: #{ repo: "lab/llama3-loras-GGUF", file: "chemistry-lora.gguf", revision: "v2" } } });
agent("plain", #{ model: "meta-llama/Meta-Llama-3-8B-Instruct" });
step("a", #{ agent: "algebra", prompt: "hi" });
step("b", #{ agent: "chemistry", prompt: "hi" });
step("c", #{ agent: "plain", prompt: "hi" });
"#;

fn adapter(w: &skein_dsl::ir::Workflow, agent: &str) -> Option<VariantPin> {
    match &w.agents[agent].backend {
        Backend::Model(m) => m.adapter.as_deref().cloned(),
        Backend::Endpoint(_) => panic!("{agent} has a model"),
    }
}

#[test]
fn adapters_are_read_from_yaml_and_rhai_alike() {
    let yaml = common::parse_clean("adapters.yaml", YAML);
    let rhai = common::parse_clean("adapters.rhai", RHAI);
    assert_eq!(yaml, rhai);
    assert_eq!(
        adapter(&yaml, "algebra"),
        Some(VariantPin {
            repo: "lab/llama3-algebra-lora".to_owned(),
            file: None,
            revision: None
        })
    );
    assert_eq!(
        adapter(&yaml, "chemistry"),
        Some(VariantPin {
            repo: "lab/llama3-loras-GGUF".to_owned(),
            file: Some("chemistry-lora.gguf".to_owned()),
            revision: Some("v2".to_owned())
        })
    );
    assert_eq!(adapter(&yaml, "plain"), None);
}

#[test]
fn a_bad_adapter_says_what_and_where() {
    let bad = YAML
        .replace(
            "adapter: lab/llama3-algebra-lora",
            "adapter: https://huggingface.co/lab/llama3-algebra-lora",
        )
        .replace("file: chemistry-lora.gguf", "file: adapter_model.bin");
    let parsed = skein_dsl::parse("bad.yaml", &bad);
    assert!(!parsed.is_valid());
    let text = parsed.render(skein_dsl::RenderOptions::default());
    assert!(
        text.contains("write the repository id, not its URL: `lab/llama3-algebra-lora`"),
        "{text}"
    );
    assert!(
        text.contains("`adapter_model.bin` is not a safetensors or GGUF file"),
        "{text}"
    );
    assert!(text.contains("bad.yaml:5:"), "{text}");
}
