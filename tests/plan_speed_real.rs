//! Measured speeds feed back into planning, end to end with the real llama.cpp: the real
//! SmolLM2-135M-Instruct Q4_1 GGUF from the mock hub, `skein server`, a CPU-only `skein
//! agent --llama-server` running the real `llama-server` (`tests/engines/llama-cpp.sh`),
//! and `skein submit`. The served step's decode speed is recorded in the graph for the
//! node, engine, variant and placement, and the next plan of the same workflow uses it
//! ("measured decode speed"). Fails, never skips, when the programs or the model cannot
//! be had.

use std::path::Path;
use std::process::Command;

use serde_json::Value;
use skein_testkit::lab::{Lab, stderr, stdout};
use skein_testkit::mock_hub::MockRepo;

const REPO: &str = "HuggingFaceTB/SmolLM2-135M-Instruct-GGUF";
const FILE: &str = "SmolLM2-135M-Instruct-Q4_1.gguf";

/// The path a `tests/engines/` script prints, or a failure with its output.
fn prepared(script: &str) -> String {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let output = Command::new("bash")
        .arg(root.join("tests/engines").join(script))
        .output()
        .unwrap_or_else(|e| panic!("tests/engines/{script} cannot run: {e}"));
    assert!(
        output.status.success(),
        "tests/engines/{script} failed: {}\n{}",
        stdout(&output),
        stderr(&output)
    );
    let path = stdout(&output).trim().to_owned();
    assert!(
        Path::new(&path).exists(),
        "tests/engines/{script} printed {path:?}, which does not exist"
    );
    path
}

fn gguf_only_repo() -> MockRepo {
    let weights = std::fs::read(prepared("smollm2.sh")).expect("the SmolLM2 GGUF file is readable");
    MockRepo::new(REPO)
        .file(FILE, weights)
        .file(
            "README.md",
            "---\nbase_model: HuggingFaceTB/SmolLM2-135M-Instruct\ntags: [gguf]\n---\n# SmolLM2-135M-Instruct GGUF\n",
        )
        .file(".gitattributes", "*.gguf filter=lfs diff=lfs merge=lfs -text\n")
        .tags(&[
            "gguf",
            "llama",
            "base_model:quantized:HuggingFaceTB/SmolLM2-135M-Instruct",
        ])
}

#[test]
fn a_served_step_records_its_decode_speed_and_the_next_plan_uses_it() {
    let bin = prepared("llama-cpp.sh");
    let llama_server = Path::new(&bin).join("llama-server").display().to_string();
    let lab = Lab::with_repos(env!("CARGO_BIN_EXE_skein"), vec![gguf_only_repo()]);
    let _server = lab.server();
    let _agent = lab.agent_with("cpu-node", &["--llama-server", &llama_server]);
    lab.nodes_up(1);

    let text = format!(
        r#"
name: story
agents:
  writer:
    model: {{ repo: {REPO}, context: 512, engines: llama.cpp }}
    temperature: 0
    max_tokens: 48
steps:
  - {{ id: tell, agent: writer, prompt: "Tell a short story about a cat." }}
"#
    );
    let file = lab.dir().join("story.yaml");
    std::fs::write(&file, text).unwrap();
    let file = file.display().to_string();

    let before = lab.cli(&["plan", &file, "--explain"]);
    assert!(before.status.success(), "{}\n{}", stdout(&before), stderr(&before));
    assert!(stdout(&before).contains("modelled decode speed"), "{}", stdout(&before));

    let run = lab.cli(&["submit", &file, "--wait"]);
    assert!(
        run.status.success(),
        "{}\n{}\n{}",
        stdout(&run),
        stderr(&run),
        lab.logs(60)
    );

    let graph: Value = lab.get("/v1/graph");
    let node = graph["nodes"]
        .as_array()
        .and_then(|nodes| nodes.iter().find(|n| n["inventory"]["name"] == "cpu-node"))
        .unwrap_or_else(|| panic!("cpu-node in the graph: {graph:#}"));
    let measured = node["measured"]
        .as_array()
        .unwrap_or_else(|| panic!("cpu-node has a measured speed: {node:#}"));
    assert_eq!(measured.len(), 1, "{measured:#?}");
    let m = &measured[0];
    assert_eq!(m["engine"], "llama.cpp", "{m:#}");
    assert_eq!(m["placement"], "CPU ×1", "{m:#}");
    assert!(m["variant"].as_str().is_some_and(|v| v.ends_with(FILE)), "{m:#}");
    assert_eq!(m["samples"], 1, "{m:#}");
    let speed = m["tokens_per_s"].as_f64().expect("a speed");
    assert!(speed > 0.5, "llama.cpp decodes SmolLM2 at {speed} tokens/s?");

    let after = lab.cli(&["plan", &file, "--explain"]);
    assert!(after.status.success(), "{}\n{}", stdout(&after), stderr(&after));
    let text = stdout(&after);
    assert!(
        text.contains(&format!(
            "measured decode speed {speed:.0} tokens/s per sequence (mean of 1 answer on cpu-node"
        )),
        "{text}"
    );
}
