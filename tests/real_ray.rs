//! A vLLM replica split over Ray, with real Ray nodes: `skein server` and two
//! `skein agent`s (tests/data/real-ray/fleet.yaml, simulated GPUs) whose `ray` is Ray
//! 2.60.0 from PyPI (`tests/engines/ray.sh`, cached), and whose `vllm` is the fake engine
//! (vLLM needs CUDA). The agents start a real `ray start --head` and a worker on
//! loopback; the checks ask the live cluster itself:
//!
//! - readiness: the serving engine starts only once both nodes are in the cluster, each
//!   with the GPUs of its share;
//! - rank order: vLLM 0.33 ranks the driver's node first, then the others by Ray node ID
//!   (`get_bundles_sorted_by_node` in vllm/v1/executor/ray_utils.py), and gives pipeline
//!   stages in rank order; the nodes must have registered with the IDs Skein chose, which
//!   sort in the plan's order, so that `VLLM_PP_LAYER_PARTITION` gives each node the stage
//!   it was sized for (`tests/vllm_args.rs` checks the order for every split plan of the
//!   example fleets, four-node ones included);
//! - stop: once the agents stop, no Ray process (GCS, raylet, workers) is left.
//!
//! Two nodes, not more: Ray workers of one cluster starting at once on one machine share
//! its session folder and race for the same socket names (one raylet dies with "bind:
//! Address already in use"); on machines of their own they never do.
//!
//! Fails, never skips, when Ray cannot be installed.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;
use skein_testkit::lab::{Killed, Lab, stderr, stdout};

fn data(file: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/real-ray")
        .join(file)
}

/// What the fake `vllm` recorded of its start: arguments and environment.
fn vllm_starts(records: &Path) -> Vec<Value> {
    std::fs::read_dir(records)
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .filter_map(|e| std::fs::read_to_string(e.path()).ok())
                .filter_map(|text| serde_json::from_str::<Value>(&text).ok())
                .filter(|v| v["program"].as_str().is_some_and(|p| p.ends_with("vllm")))
                .collect()
        })
        .unwrap_or_default()
}

/// The live cluster's nodes, as Ray's own API lists them: id, alive, GPUs.
fn cluster_nodes(python: &Path, address: &str, ray_tmp: &Path) -> Vec<Value> {
    let script = r#"
import json, sys, ray
ray.init(address=sys.argv[1], logging_level="ERROR", log_to_driver=False)
print(json.dumps([{"id": n["NodeID"], "alive": n["Alive"], "gpus": n["Resources"].get("GPU", 0)}
                  for n in ray.nodes()]))
"#;
    let out = Command::new(python)
        .args(["-c", script, address])
        .env("RAY_TMPDIR", ray_tmp)
        .output()
        .expect("the Ray venv's python runs");
    assert!(
        out.status.success(),
        "asking the cluster at {address} for its nodes:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let last = text.lines().last().unwrap_or_default();
    serde_json::from_str::<Vec<Value>>(last).unwrap_or_else(|e| panic!("{e}: {text}"))
}

/// Processes of this test's Ray (its temporary folders, under `ray_tmp`, in their
/// command line or environment: Ray's workers rename themselves, but inherit
/// `RAY_TMPDIR`).
fn ray_processes(ray_tmp: &Path) -> Vec<String> {
    let needle = ray_tmp.display().to_string();
    let mut found = Vec::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return found;
    };
    for entry in entries.filter_map(Result::ok) {
        let pid = entry.file_name().to_string_lossy().into_owned();
        if !pid.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let read = |what: &str| std::fs::read(entry.path().join(what)).unwrap_or_default();
        let cmdline = String::from_utf8_lossy(&read("cmdline")).replace('\0', " ");
        let environ = String::from_utf8_lossy(&read("environ")).into_owned();
        let state = String::from_utf8_lossy(&read("stat")).into_owned();
        // A zombie is gone but for its parent's wait.
        let zombie = state
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z'));
        if !zombie && (cmdline.contains(&needle) || environ.contains(&format!("RAY_TMPDIR={needle}"))) {
            found.push(format!("{pid}: {}", cmdline.chars().take(160).collect::<String>()));
        }
    }
    found
}

#[test]
fn real_ray_nodes_join_in_the_plans_order_and_stop_without_leftovers() {
    let ray = skein_testkit::tools::ray_program();
    let python = ray.with_file_name("python");
    let lab = Lab::with_repos(
        env!("CARGO_BIN_EXE_skein"),
        skein_testkit::models::reference_hub_repos(),
    );
    let server = lab.server();
    // Short: Ray's Unix sockets live under it (at most 107 bytes a path).
    let ray_tmp = tempfile::Builder::new()
        .prefix("skein-ray-")
        .tempdir_in("/tmp")
        .expect("a temporary folder for Ray");
    for dir in ["node-a", "node-b", "driver"] {
        std::fs::create_dir_all(ray_tmp.path().join(dir)).expect("Ray's folders");
    }
    let records = lab.dir().join("records");
    let bin = lab.dir().join("bin");
    std::fs::create_dir_all(&records).expect("records/");
    std::fs::create_dir_all(&bin).expect("bin/");
    let vllm = bin.join("vllm");
    std::os::unix::fs::symlink(skein_testkit::fake_engine_path(), &vllm).expect("link the fake vLLM");
    let cache = lab.dir().join("shared-cache");
    let nodes = ["node-a", "node-b"];
    // Each node as on a machine of its own: its engines on an address of its own.
    let hosts: Vec<String> = (1..=nodes.len()).map(|i| format!("127.0.0.{i}")).collect();
    let mut agents: Vec<Killed> = nodes
        .iter()
        .zip(&hosts)
        .map(|(node, host)| {
            lab.simulated_agent_with(
                &data("fleet.yaml"),
                node,
                &[
                    "--vllm",
                    vllm.to_str().expect("a UTF-8 path"),
                    "--ray",
                    ray.to_str().expect("a UTF-8 path"),
                    "--engine-host",
                    host,
                ],
                &[
                    ("HF_HOME", cache.display().to_string()),
                    ("HF_HUB_CACHE", cache.join("hub").display().to_string()),
                    ("RAY_TMPDIR", ray_tmp.path().join(node).display().to_string()),
                    ("SKEIN_FAKE_ENGINE_NODE", (*node).to_owned()),
                    ("SKEIN_FAKE_ENGINE_RECORD_DIR", records.display().to_string()),
                ],
            )
        })
        .collect();
    lab.nodes_up(nodes.len());

    let workflow = data("workflow.yaml").display().to_string();
    let plan = lab.cli(&["plan", &workflow, "--output", "json"]);
    assert!(plan.status.success(), "{}{}", stdout(&plan), stderr(&plan));
    let plan: Value = serde_json::from_str(&stdout(&plan)).expect("the plan as JSON");
    let planned = &plan["instances"][0];
    assert_eq!(planned["engine"], "vllm", "{plan:#}");
    // The plan's nodes, stage by stage, and each stage's layers.
    let devices = planned["devices"].as_array().expect("devices");
    let mut stages: Vec<(String, u64)> = Vec::new();
    for d in devices {
        let node = d["node"].as_str().expect("a node").to_owned();
        let (a, b) = d["layers"]
            .as_str()
            .and_then(|r| r.split_once(".."))
            .expect("layers a..b");
        let layers = b.parse::<u64>().expect("end") - a.parse::<u64>().expect("start");
        if stages.last().map(|s| &s.0) != Some(&node) {
            stages.push((node, layers));
        }
    }
    assert_eq!(stages.len(), 2, "split over both nodes: {plan:#}");
    let layer_counts: Vec<u64> = stages.iter().map(|s| s.1).collect();
    assert!(
        layer_counts.windows(2).any(|w| w[0] != w[1]),
        "uneven stages, so that an order mix-up would show: {plan:#}"
    );

    let run = lab.cli(&["submit", &workflow, "--wait"]);
    assert!(
        run.status.success(),
        "the run: {}{}\n{}",
        stdout(&run),
        stderr(&run),
        lab.logs(60)
    );

    // The serving engine: on the head's node, with the cluster's address and the
    // plan's stages in the plan's order.
    let starts = vllm_starts(&records);
    assert_eq!(starts.len(), 1, "one vllm serve: {starts:#?}");
    let serve = &starts[0];
    let env: BTreeMap<String, String> = serde_json::from_value(serve["env"].clone()).expect("its environment");
    assert_eq!(env.get("SKEIN_FAKE_ENGINE_NODE"), Some(&stages[0].0), "{serve:#}");
    let partition = layer_counts.iter().map(u64::to_string).collect::<Vec<_>>().join(",");
    assert_eq!(env.get("VLLM_PP_LAYER_PARTITION"), Some(&partition), "{serve:#}");
    let address = env.get("RAY_ADDRESS").expect("RAY_ADDRESS").clone();

    // The cluster: both nodes live, one GPU each, registered with the IDs Skein chose,
    // which vLLM's order ranks as planned.
    let instances = lab.get("/v1/instances");
    let list = instances.as_array().cloned().unwrap_or_default();
    let replica = list
        .iter()
        .find(|i| i["engine"] == "vllm")
        .unwrap_or_else(|| panic!("the replica: {instances:#}"));
    let pieces: Vec<&str> = replica["pieces"]
        .as_array()
        .expect("its pieces")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    let piece_nodes: Vec<String> = pieces
        .iter()
        .map(|p| {
            let view = list.iter().find(|i| i["name"] == *p).expect("the piece");
            assert_eq!(view["state"], "ready", "{view:#}");
            view["node_name"].as_str().expect("its node").to_owned()
        })
        .collect();
    let mut cluster = cluster_nodes(&python, &address, &ray_tmp.path().join("driver"));
    assert_eq!(cluster.len(), 2, "{cluster:#?}");
    assert!(
        cluster.iter().all(|n| n["alive"] == true && n["gpus"] == 1.0),
        "{cluster:#?}"
    );
    assert!(
        cluster
            .iter()
            .all(|n| n["id"].as_str().is_some_and(|id| id.starts_with("0000000"))),
        "the nodes registered with the IDs Skein chose (the plan's position first): {cluster:#?}"
    );
    // Driver (the head: rank order 0) first, then by node ID, as vLLM sorts them.
    cluster.sort_by(|a, b| {
        let key = |n: &Value| {
            let id = n["id"].as_str().unwrap_or_default().to_owned();
            (!id.starts_with("00000000"), id)
        };
        key(a).cmp(&key(b))
    });
    let ranked: Vec<String> = cluster
        .iter()
        .map(|n| {
            let id = n["id"].as_str().expect("a node ID");
            let order = usize::from_str_radix(&id[..8], 16).expect("the plan's position in the ID");
            piece_nodes[order].clone()
        })
        .collect();
    let planned_nodes: Vec<String> = stages.iter().map(|s| s.0.clone()).collect();
    assert_eq!(
        ranked, planned_nodes,
        "vLLM's rank order over the live cluster: {cluster:#?}"
    );

    // Stop: every agent stops its engines; nothing of Ray may be left.
    assert!(!ray_processes(ray_tmp.path()).is_empty(), "Ray runs under its folder");
    for agent in &mut agents {
        agent.stop();
    }
    drop(server);
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut left = ray_processes(ray_tmp.path());
    while !left.is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(250));
        left = ray_processes(ray_tmp.path());
    }
    assert!(
        left.is_empty(),
        "Ray processes outlived their agents:\n{}",
        left.join("\n")
    );
}
