//! Models split across machines, end to end: `skein server` and one `skein agent` per
//! node of tests/data/split/fleet.yaml (five simulated one-GPU nodes, none of which holds
//! Qwen2.5-0.5B alone), every engine program a fake engine that records its command,
//! environment and start time. A workflow's writer runs on vLLM over Ray (head, worker,
//! then `vllm serve`) and its coder on llama.cpp over RPC (`rpc-server`, then
//! `llama-server --rpc`); their steps answer through the split replicas. Then a piece
//! crashes: the replica fails with the piece's reason and is placed again off its node.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::Value;
use skein_testkit::lab::{Killed, Lab, stderr, stdout};

/// One engine process as it recorded itself.
#[derive(Debug, Clone)]
struct Started {
    program: String,
    node: String,
    args: Vec<String>,
    env: BTreeMap<String, String>,
    at: u128,
}

impl Started {
    fn flag(&self, name: &str) -> Option<&str> {
        let at = self.args.iter().position(|a| a == name)?;
        self.args.get(at + 1).map(String::as_str)
    }

    fn line(&self) -> String {
        format!("{} on {}: {}", self.program, self.node, self.args.join(" "))
    }
}

/// Every start recorded in `dir`, oldest first.
fn started(dir: &Path) -> Vec<Started> {
    let mut all: Vec<Started> = std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .filter_map(|e| std::fs::read_to_string(e.path()).ok())
                .filter_map(|text| serde_json::from_str::<Value>(&text).ok())
                .map(|v| {
                    let env: BTreeMap<String, String> = serde_json::from_value(v["env"].clone()).unwrap_or_default();
                    Started {
                        program: v["program"].as_str().unwrap_or_default().to_owned(),
                        node: env.get("SKEIN_FAKE_ENGINE_NODE").cloned().unwrap_or_default(),
                        args: serde_json::from_value(v["args"].clone()).unwrap_or_default(),
                        at: v["started_ns"].as_str().and_then(|s| s.parse().ok()).unwrap_or(0),
                        env,
                    }
                })
                .collect()
        })
        .unwrap_or_default();
    all.sort_by_key(|s| s.at);
    all
}

/// The engine programs, each the fake engine under its real name.
fn programs(dir: &Path) -> Vec<String> {
    let fake = skein_testkit::fake_engine_path();
    ["vllm", "llama-server", "ray", "rpc-server"]
        .iter()
        .flat_map(|name| {
            let link = dir.join(name);
            if !link.exists() {
                std::os::unix::fs::symlink(&fake, &link).expect("link the fake engine");
            }
            [format!("--{name}"), link.display().to_string()]
        })
        .collect()
}

struct Split {
    lab: Lab,
    _server: Killed,
    _agents: Vec<Killed>,
    records: PathBuf,
}

impl Split {
    /// The server and an agent for each of `nodes`, sharing one Hugging Face cache (as
    /// a lab's nodes may, on a shared file system: each model is fetched once).
    fn up(nodes: &[&str]) -> Split {
        let lab = Lab::with_repos(
            env!("CARGO_BIN_EXE_skein"),
            skein_testkit::models::reference_hub_repos(),
        );
        let server = lab.server();
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let fleet = root.join("tests/data/split/fleet.yaml");
        let records = lab.dir().join("records");
        let bin = lab.dir().join("bin");
        std::fs::create_dir_all(&records).unwrap();
        std::fs::create_dir_all(&bin).unwrap();
        let programs = programs(&bin);
        let programs: Vec<&str> = programs.iter().map(String::as_str).collect();
        let cache = lab.dir().join("shared-cache");
        let agents = nodes
            .iter()
            .map(|node| {
                lab.simulated_agent_with(
                    &fleet,
                    node,
                    &programs,
                    &[
                        ("HF_HOME", cache.display().to_string()),
                        ("HF_HUB_CACHE", cache.join("hub").display().to_string()),
                        ("SKEIN_FAKE_ENGINE_NODE", (*node).to_owned()),
                        ("SKEIN_FAKE_ENGINE_RECORD_DIR", records.display().to_string()),
                        (
                            "SKEIN_FAKE_ENGINE_EXIT_IF",
                            lab.dir().join(format!("crash-{node}")).display().to_string(),
                        ),
                    ],
                )
            })
            .collect();
        lab.nodes_up(nodes.len());
        Split {
            lab,
            _server: server,
            _agents: agents,
            records,
        }
    }

    fn started(&self) -> Vec<Started> {
        started(&self.records)
    }

    fn report(&self) -> String {
        let lines: Vec<String> = self.started().iter().map(Started::line).collect();
        format!("started:\n{}\n{}", lines.join("\n"), self.lab.logs(30))
    }
}

fn workflow() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/split/workflow.yaml")
        .display()
        .to_string()
}

#[test]
fn split_replicas_start_their_pieces_in_order_and_serve_through_them() {
    let split = Split::up(&["node-a", "node-b", "node-c", "node-d"]);
    let lab = &split.lab;
    let plan = lab.cli(&["plan", &workflow(), "--explain"]);
    assert!(plan.status.success(), "{}{}", stdout(&plan), stderr(&plan));
    let explained = stdout(&plan);
    assert!(
        explained.contains("split across nodes") || explained.contains("no single GPU or node holds it"),
        "both agents are split: {explained}"
    );
    assert!(
        explained.contains("the network costs"),
        "the plan explains the network's cost: {explained}"
    );

    let run = lab.cli(&["submit", &workflow(), "--wait"]);
    assert!(
        run.status.success(),
        "the run: {}{}\n{}",
        stdout(&run),
        stderr(&run),
        split.report()
    );
    let output = stdout(&run);
    assert!(output.contains("echo: Draft a note."), "{output}");

    let all = split.started();
    let report = split.report();
    // vLLM over Ray: the head, then the worker (joining the head's address), then
    // `vllm serve` on the head's node with the cluster's address; each Ray node sees
    // only its own GPU and reads the model from its own cache, offline.
    let heads: Vec<&Started> = all
        .iter()
        .filter(|s| s.program == "ray" && s.args.contains(&"--head".to_owned()))
        .collect();
    let workers: Vec<&Started> = all
        .iter()
        .filter(|s| s.program == "ray" && s.flag("--address").is_some())
        .collect();
    let vllm: Vec<&Started> = all.iter().filter(|s| s.program == "vllm").collect();
    assert_eq!((heads.len(), workers.len(), vllm.len()), (1, 1, 1), "{report}");
    let (head, worker, serve) = (heads[0], workers[0], vllm[0]);
    assert!(head.at < worker.at && worker.at < serve.at, "start order: {report}");
    assert_ne!(head.node, worker.node, "{report}");
    assert_eq!(serve.node, head.node, "vllm serve runs on the head's node: {report}");
    let head_address = format!("127.0.0.1:{}", head.flag("--port").expect("the head's port"));
    assert_eq!(worker.flag("--address"), Some(head_address.as_str()), "{report}");
    assert_eq!(serve.env.get("RAY_ADDRESS"), Some(&head_address), "{report}");
    assert_eq!(serve.flag("--distributed-executor-backend"), Some("ray"), "{report}");
    assert_eq!(serve.flag("--pipeline-parallel-size"), Some("2"), "{report}");
    assert_eq!(serve.flag("--tensor-parallel-size"), Some("1"), "{report}");
    assert_eq!(
        serve.args.get(1).map(String::as_str),
        Some("Qwen/Qwen2.5-7B-Instruct-AWQ"),
        "{report}"
    );
    assert_eq!(serve.flag("--quantization"), Some("awq"), "{report}");
    assert!(serve.env.contains_key("VLLM_PP_LAYER_PARTITION"), "{report}");
    for piece in [head, worker, serve] {
        assert_eq!(
            piece.env.get("CUDA_VISIBLE_DEVICES").map(String::as_str),
            Some("0"),
            "{report}"
        );
        assert_eq!(
            piece.env.get("HF_HUB_OFFLINE").map(String::as_str),
            Some("1"),
            "{report}"
        );
        assert!(piece.env.contains_key("HF_HUB_CACHE"), "{report}");
    }

    // llama.cpp over RPC: the other node's RPC server first, then `llama-server --rpc`
    // with its address, the RPC device's share first in the split.
    let rpc: Vec<&Started> = all.iter().filter(|s| s.program == "rpc-server").collect();
    let llama: Vec<&Started> = all.iter().filter(|s| s.program == "llama-server").collect();
    assert_eq!((rpc.len(), llama.len()), (1, 1), "{report}");
    let (rpc, llama) = (rpc[0], llama[0]);
    assert!(rpc.at < llama.at, "start order: {report}");
    assert_ne!(rpc.node, llama.node, "{report}");
    let rpc_address = format!("127.0.0.1:{}", rpc.flag("--port").expect("the RPC port"));
    assert_eq!(llama.flag("--rpc"), Some(rpc_address.as_str()), "{report}");
    assert_eq!(
        llama.flag("--tensor-split").map(|s| s.split(',').count()),
        Some(2),
        "{report}"
    );
    assert_eq!(
        rpc.env.get("CUDA_VISIBLE_DEVICES").map(String::as_str),
        Some("0"),
        "{report}"
    );
    // Four distinct nodes hold the two replicas.
    let mut nodes: Vec<&str> = [head, worker, rpc, llama].iter().map(|s| s.node.as_str()).collect();
    nodes.sort_unstable();
    nodes.dedup();
    assert_eq!(nodes.len(), 4, "{report}");

    // The API shows each replica with its pieces, and each piece as part of it.
    let instances = lab.get("/v1/instances");
    let list = instances.as_array().cloned().unwrap_or_default();
    let writer = list
        .iter()
        .find(|i| i["engine"] == "vllm")
        .unwrap_or_else(|| panic!("the writer's replica: {instances:#}"));
    let pieces: Vec<&str> = writer["pieces"]
        .as_array()
        .expect("pieces")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(pieces.len(), 2, "{writer:#}");
    assert!(
        pieces[0].ends_with(".ray-head-0") && pieces[1].ends_with(".ray-worker-1"),
        "{writer:#}"
    );
    let worker_view = list.iter().find(|i| i["name"] == pieces[1]).expect("the worker piece");
    assert_eq!(worker_view["part_of"], writer["name"], "{worker_view:#}");
    assert_eq!(
        worker_view["node_name"],
        Value::from(worker.node.clone()),
        "{worker_view:#}"
    );
}

#[test]
fn a_failing_piece_fails_its_replica_which_is_placed_again_off_its_node() {
    let split = Split::up(&["node-a", "node-b", "node-c", "node-d", "node-e"]);
    let lab = &split.lab;
    // Only the writer, serving until cancelled.
    let file = lab.dir().join("serve.yaml");
    std::fs::write(
        &file,
        "version: 1\nname: serve\nagents:\n  writer:\n    model: { repo: Qwen/Qwen2.5-7B-Instruct, context: 2048, min_precision: int4, prefer: fewest_gpus, formats: [safetensors] }\n",
    )
    .unwrap();
    let submitted = lab.cli(&["submit", file.to_str().unwrap()]);
    assert!(submitted.status.success(), "{}", stderr(&submitted));
    let id = stdout(&submitted).trim().to_owned();
    lab.wait_run(&id, "the writer serving", |r| r["state"] == "running");
    let first = split.started();
    let worker = first
        .iter()
        .find(|s| s.program == "ray" && s.flag("--address").is_some())
        .unwrap_or_else(|| panic!("a Ray worker: {}", split.report()))
        .clone();

    // The worker's engine crashes: the replica fails with its reason, its other pieces
    // stop, and the run places it again on nodes other than the worker's.
    std::fs::write(lab.dir().join(format!("crash-{}", worker.node)), "").unwrap();
    let placed = lab.wait_for("the replica placed again", "/v1/instances", |v| {
        v.as_array().is_some_and(|list| {
            list.iter().any(|i| {
                i["engine"] == "vllm"
                    && i["state"] == "ready"
                    && i["name"].as_str().is_some_and(|n| n.starts_with(&format!("{id}-1-")))
            })
        })
    });
    // The run records its instances ready just after the list shows them.
    lab.wait_run(&id, "the writer serving again", |r| r["state"] == "running");
    let report = split.report();
    assert!(
        report.contains(&format!(
            "ray-worker on {}) restarting: exited with status 3",
            worker.node
        )),
        "the replica failed with its piece's reason: {report}"
    );
    let again: Vec<Started> = split.started().into_iter().filter(|s| s.at > worker.at).collect();
    let pieces: Vec<&Started> = again.iter().filter(|s| s.program == "ray").collect();
    assert_eq!(pieces.len(), 2, "a new head and worker: {report}");
    assert!(
        pieces.iter().all(|p| p.node != worker.node),
        "off the failed node: {report}\n{placed:#}"
    );
    assert!(again.iter().any(|s| s.program == "vllm"), "{report}");

    let cancelled = lab.cli(&["run", "cancel", &id]);
    assert!(cancelled.status.success(), "{}", stderr(&cancelled));
    // Stopping the replica stops every piece: no instance is left.
    lab.wait_for("every piece stopped", "/v1/instances", |v| {
        v.as_array().is_some_and(Vec::is_empty)
    });
}
