//! The live hardware graph end to end, with real processes on loopback: `skein server`
//! and one `skein agent --simulate` per node of the reference fleet.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::Value;

/// The telemetry interval of these tests.
const INTERVAL_MS: u64 = 300;
/// Longest wait for anything to happen.
const PATIENCE: Duration = Duration::from_secs(30);

fn skein() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_skein"));
    command.env("RUST_LOG", "info").env("NO_COLOR", "1");
    command
}

fn workspace_file(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

struct Server {
    child: Child,
    api: String,
    grpc: String,
    data: tempfile::TempDir,
    runtime: tokio::runtime::Runtime,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Spawns `skein server` on ephemeral ports and reads its addresses from its banner.
fn server() -> Server {
    server_with(&[])
}

fn server_with(extra: &[&str]) -> Server {
    server_env(extra, &[])
}

/// [`server_with`], with environment variables for the server.
fn server_env(extra: &[&str], env: &[(&str, &std::ffi::OsStr)]) -> Server {
    let data = tempfile::tempdir().unwrap();
    let mut child = skein()
        .envs(env.iter().copied())
        .args(["server", "--listen", "127.0.0.1:0", "--agent-listen", "127.0.0.1:0"])
        .args(["--sample-interval", &format!("{INTERVAL_MS}ms"), "--data-dir"])
        .arg(data.path())
        .args(extra)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (tx, rx) = mpsc::channel();
    let stderr = child.stderr.take().unwrap();
    // Keep draining stderr so the server never blocks on a full pipe.
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let banner = loop {
        let line = rx.recv_timeout(PATIENCE).expect("the server prints its addresses");
        if line.starts_with("skein server: REST API on ") {
            break line;
        }
    };
    let field = |after: &str| {
        let start = banner.find(after).unwrap() + after.len();
        banner[start..].split([',', ' ']).next().unwrap().to_owned()
    };
    Server {
        api: field("REST API on "),
        grpc: field("agents join at "),
        child,
        data,
        runtime: tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap(),
    }
}

impl Server {
    fn token_file(&self) -> PathBuf {
        self.data.path().join("join-token")
    }

    fn graph(&self) -> Value {
        let token = std::fs::read_to_string(self.data.path().join("api-token")).unwrap();
        let url = format!("{}/v1/graph", self.api);
        // With --tls-cert the REST door speaks TLS too; these tests are about the agents'
        // trust, so the test's own reads accept the lab's certificate whatever it is.
        let client = reqwest::Client::builder()
            .danger_accept_invalid_certs(self.api.starts_with("https://"))
            .build()
            .unwrap();
        self.runtime.block_on(async {
            let response = client.get(&url).bearer_auth(token.trim()).send().await.unwrap();
            assert!(response.status().is_success(), "{}", response.status());
            response.json::<Value>().await.unwrap()
        })
    }

    fn agent(&self, fleet: &Path, node: &str) -> Child {
        skein()
            .args(["agent", "--join", &self.grpc, "--node", node, "--simulate"])
            .arg(fleet)
            .arg("--token-file")
            .arg(self.token_file())
            .arg("--state-dir")
            .arg(self.data.path().join("agents"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap()
    }

    /// Polls the graph until `done` holds, returning the graph that satisfied it.
    fn wait_for(&self, what: &str, done: impl Fn(&Value) -> bool) -> Value {
        let start = Instant::now();
        loop {
            let graph = self.graph();
            if done(&graph) {
                return graph;
            }
            assert!(start.elapsed() < PATIENCE, "timed out waiting for {what}: {graph:#}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

fn node<'a>(graph: &'a Value, name: &str) -> Option<&'a Value> {
    graph["nodes"]
        .as_array()?
        .iter()
        .find(|n| n["inventory"]["name"] == name)
}

fn all_reporting(graph: &Value, count: usize) -> bool {
    let nodes = graph["nodes"].as_array().unwrap();
    nodes.len() == count
        && nodes.iter().all(|n| {
            n["health"]["state"] == "ok" && n["gpus"].as_array().unwrap().iter().all(|g| !g["latest"].is_null())
        })
}

#[test]
fn the_reference_fleet_joins_and_a_killed_agent_goes_down_and_returns() {
    let server = server();
    let fleet = workspace_file("workflows/fleets/lab.yaml");
    let names = ["a100-box", "rtx-1", "rtx-2", "old-1"];
    let mut agents: Vec<Child> = names.iter().map(|n| server.agent(&fleet, n)).collect();

    let graph = server.wait_for("four nodes reporting", |g| all_reporting(g, 4));
    let gpus: Vec<(String, String, u64)> = graph["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|n| {
            n["gpus"].as_array().unwrap().iter().map(move |g| {
                (
                    n["inventory"]["name"].as_str().unwrap().to_owned(),
                    g["facts"]["name"].as_str().unwrap().to_owned(),
                    g["facts"]["memory_total"].as_u64().unwrap() >> 20,
                )
            })
        })
        .collect();
    assert_eq!(gpus.len(), 14);
    let count = |model: &str, mib: u64| gpus.iter().filter(|(_, m, mem)| m == model && *mem == mib).count();
    assert_eq!(count("NVIDIA A100-SXM4-80GB", 81_920), 4);
    assert_eq!(count("NVIDIA GeForce RTX 4090", 24_564), 8);
    assert_eq!(count("Tesla V100-PCIE-16GB", 16_160), 2);
    // The network links the fleet file gives, as the planner reads them.
    let network = |name: &str| node(&graph, name).unwrap()["inventory"]["host"]["network_bps"].as_u64();
    assert_eq!(network("a100-box"), Some(100_000_000_000));
    assert_eq!(network("old-1"), Some(10_000_000_000));
    let a100 = node(&graph, "a100-box").unwrap();
    assert!(a100["links"].as_array().unwrap().iter().all(|l| l["kind"] == "nvlink"));
    let rtx_id = node(&graph, "rtx-2").unwrap()["id"].as_str().unwrap().to_owned();

    // SIGKILL: the node goes down once it has missed three intervals, and not before:
    // its last telemetry came at most an interval before the kill, so at least two
    // intervals pass. (How soon after is a load-dependent figure: only reported.)
    agents[2].kill().unwrap();
    agents[2].wait().unwrap();
    let killed = Instant::now();
    server.wait_for("rtx-2 down", |g| node(g, "rtx-2").unwrap()["health"]["state"] == "down");
    let took = killed.elapsed();
    assert!(
        took >= Duration::from_millis(2 * INTERVAL_MS),
        "marked down {took:?} after the kill, before three intervals of {INTERVAL_MS} ms were missed"
    );
    eprintln!("rtx-2 was marked down {took:?} after the kill");
    let graph = server.graph();
    let rtx2 = node(&graph, "rtx-2").unwrap();
    assert!(
        rtx2["gpus"]
            .as_array()
            .unwrap()
            .iter()
            .all(|g| g["health"]["state"] == "down")
    );
    assert_eq!(node(&graph, "rtx-1").unwrap()["health"]["state"], "ok");

    // Restarted, it comes back with the same identity.
    agents[2] = server.agent(&fleet, "rtx-2");
    let graph = server.wait_for("rtx-2 back", |g| {
        let n = node(g, "rtx-2").unwrap();
        n["health"]["state"] == "ok" && n["connected"] == true
    });
    assert_eq!(node(&graph, "rtx-2").unwrap()["id"], rtx_id.as_str());
    assert_eq!(graph["nodes"].as_array().unwrap().len(), 4);

    for mut agent in agents {
        let _ = agent.kill();
        let _ = agent.wait();
    }
}

#[test]
fn a_node_keeps_its_name_against_another_agent_until_an_admin_frees_it() {
    let server = server();
    let fleet = workspace_file("workflows/fleets/lab.yaml");
    let cli = |args: &[&str]| {
        let out = skein()
            .args(args)
            .args(["--server", &server.api, "--data-dir"])
            .arg(server.data.path())
            .output()
            .unwrap();
        let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
        assert!(out.status.success(), "skein {args:?}: {}", text(&out.stderr));
        (text(&out.stdout), text(&out.stderr))
    };
    let states = tempfile::tempdir().unwrap();
    let agent = |state: &str, token: &str, extra: &[&str]| {
        let mut command = skein();
        command
            .args(["agent", "--join", &server.grpc, "--node", "rtx-1", "--simulate"])
            .arg(&fleet)
            .args(["--token", token, "--state-dir"])
            .arg(states.path().join(state))
            .args(extra);
        command
    };
    let spawn = |mut command: Command| command.stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();

    // A join token good only for rtx-1; the real agent joins with it.
    let (token, told) = cli(&["token", "join", "create", "--node", "rtx-1"]);
    let token = token.trim().to_owned();
    let id = told.split_whitespace().nth(2).unwrap().to_owned();
    assert!(id.starts_with("j-"), "{told}");
    let mut real = spawn(agent("real", &token, &[]));
    let graph = server.wait_for("rtx-1 reporting", |g| all_reporting(g, 1));
    let rtx = node(&graph, "rtx-1").unwrap().clone();
    let credential = std::fs::read_to_string(states.path().join("real/rtx-1.credential")).unwrap();
    assert_eq!(credential.trim().len(), 64);

    // The admin revokes the token: listed as revoked; the node stays.
    cli(&["token", "join", "revoke", &id]);
    let (listed, _) = cli(&["token", "join", "list"]);
    let row = listed.lines().find(|l| l.starts_with(&id)).unwrap();
    assert!(row.contains("node rtx-1") && row.contains("revoked"), "{listed}");

    // A rogue with the server's own join token and other labels is refused and changes
    // nothing.
    let bootstrap = std::fs::read_to_string(server.token_file()).unwrap();
    let out = agent("rogue", bootstrap.trim(), &["--label", "zone=evil"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("node name `rtx-1` is taken"), "{stderr}");
    assert!(stderr.contains("skein node reset rtx-1"), "{stderr}");
    let graph = server.graph();
    let now = node(&graph, "rtx-1").unwrap();
    assert_eq!(now["id"], rtx["id"]);
    assert_eq!(now["inventory"], rtx["inventory"]);
    assert_eq!(now["health"]["state"], "ok");
    assert_eq!(now["connected"], true);

    // The real agent, restarted with its revoked token, comes back by its credential.
    real.kill().unwrap();
    real.wait().unwrap();
    server.wait_for("rtx-1 disconnected", |g| {
        node(g, "rtx-1").unwrap()["connected"] == false
    });
    let mut real = spawn(agent("real", &token, &[]));
    let graph = server.wait_for("rtx-1 back", |g| node(g, "rtx-1").unwrap()["connected"] == true);
    assert_eq!(node(&graph, "rtx-1").unwrap()["id"], rtx["id"]);

    // The admin removes the node: the name is free, and the other agent takes it.
    real.kill().unwrap();
    real.wait().unwrap();
    let (removed, _) = cli(&["node", "rm", "rtx-1"]);
    assert!(removed.contains("removed node `rtx-1`"), "{removed}");
    let mut other = spawn(agent("rogue", bootstrap.trim(), &["--label", "zone=evil"]));
    server.wait_for("the other rtx-1", |g| {
        node(g, "rtx-1").is_some_and(|n| n["inventory"]["labels"]["zone"] == "evil")
    });
    let _ = other.kill();
    let _ = other.wait();
}

#[test]
fn a_wrong_or_missing_token_is_refused() {
    let server = server();
    let fleet = workspace_file("workflows/fleets/lab.yaml");
    let out = skein()
        .args([
            "agent",
            "--join",
            &server.grpc,
            "--node",
            "old-1",
            "--token",
            "not-the-token",
            "--simulate",
        ])
        .arg(&fleet)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("the orchestrator refused this agent: wrong join token"),
        "{stderr}"
    );
    let out = skein()
        .args(["agent", "--join", &server.grpc, "--node", "old-1", "--simulate"])
        .arg(&fleet)
        .env_remove("SKEIN_JOIN_TOKEN")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no join token"));
    assert!(server.graph()["nodes"].as_array().unwrap().is_empty());
}

#[test]
fn labels_from_the_fleet_file_and_the_command_line_reach_the_graph_and_skein_nodes() {
    let server = server();
    let fleet = workspace_file("workflows/fleets/lab.yaml");
    // rtx-1 has `labels: { zone: lab-a }` in the file; the command line adds to them and
    // replaces those of the same key (the variable as well as the flag).
    let mut relabelled = skein()
        .args(["agent", "--join", &server.grpc, "--node", "rtx-1", "--simulate"])
        .arg(&fleet)
        .arg("--token-file")
        .arg(server.token_file())
        .args(["--label", "zone=lab-b", "--label", "topology.kubernetes.io/rack=r1"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut from_env = skein()
        .args(["agent", "--join", &server.grpc, "--node", "old-1", "--simulate"])
        .arg(&fleet)
        .arg("--token-file")
        .arg(server.token_file())
        .env("SKEIN_NODE_LABELS", "zone=lab-c,gpu=v100")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut plain = server.agent(&fleet, "rtx-2");
    let graph = server.wait_for("three nodes reporting", |g| all_reporting(g, 3));
    let labels = |name: &str| node(&graph, name).unwrap()["inventory"]["labels"].clone();
    assert_eq!(
        labels("rtx-1"),
        serde_json::json!({ "zone": "lab-b", "topology.kubernetes.io/rack": "r1" })
    );
    assert_eq!(labels("old-1"), serde_json::json!({ "zone": "lab-c", "gpu": "v100" }));
    assert_eq!(labels("rtx-2"), serde_json::json!({}));

    let out = skein()
        .args(["nodes", "--server", &server.api, "--data-dir"])
        .arg(server.data.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let table = String::from_utf8_lossy(&out.stdout);
    let first_row = |name: &str| table.lines().find(|l| l.starts_with(name)).unwrap().to_owned();
    assert!(table.lines().next().unwrap().ends_with("LABELS"), "{table}");
    assert!(
        first_row("rtx-1").ends_with("topology.kubernetes.io/rack=r1,zone=lab-b"),
        "{table}"
    );
    assert!(first_row("old-1").ends_with("gpu=v100,zone=lab-c"), "{table}");
    assert!(first_row("rtx-2").ends_with(" -"), "{table}");

    for agent in [&mut relabelled, &mut from_env, &mut plain] {
        let _ = agent.kill();
        let _ = agent.wait();
    }
}

#[test]
fn a_load_spike_shows_in_the_graph_with_the_sample_that_saw_it() {
    let server = server();
    let started_ms = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as i64;
    let mut agent = server.agent(&workspace_file("tests/data/spike-fleet.yaml"), "spiky");
    let start = Instant::now();
    let (seen_ms, sample_ms) = loop {
        assert!(start.elapsed() < PATIENCE, "the spike never showed");
        let graph = server.graph();
        let seen_ms = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as i64;
        let latest = node(&graph, "spiky").map(|n| &n["gpus"][1]["latest"]);
        if let Some(latest) = latest
            && latest["utilization_pct"].as_u64().is_some_and(|u| u >= 90)
        {
            break (seen_ms, latest["unix_ms"].as_i64().unwrap());
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    // The graph shows the spike with the sample that saw it: taken by this agent, before
    // it was read. How soon is a speed figure (the staleness of nodes' latest batches in
    // benches/fleet_scale.rs, sample to reflex in benches/reflex_reaction.rs): here it is
    // only reported.
    assert!(
        (started_ms..=seen_ms).contains(&sample_ms),
        "sampled at {sample_ms}, agent started at {started_ms}, read at {seen_ms}"
    );
    eprintln!("the spike was visible {} ms after it was sampled", seen_ms - sample_ms);
    let _ = agent.kill();
    let _ = agent.wait();
}

#[test]
fn agents_join_over_tls_and_refuse_an_untrusted_server() {
    let certs = tempfile::tempdir().unwrap();
    let rcgen::CertifiedKey { cert, signing_key } =
        rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
    let (cert_file, key_file) = (certs.path().join("cert.pem"), certs.path().join("key.pem"));
    std::fs::write(&cert_file, cert.pem()).unwrap();
    std::fs::write(&key_file, signing_key.serialize_pem()).unwrap();
    let server = server_with(&[
        "--tls-cert",
        cert_file.to_str().unwrap(),
        "--tls-key",
        key_file.to_str().unwrap(),
    ]);
    assert!(server.grpc.starts_with("https://127.0.0.1:"), "{}", server.grpc);
    let join = server.grpc.replace("127.0.0.1", "localhost");
    let fleet = workspace_file("workflows/fleets/lab.yaml");
    let agent = |ca: Option<&Path>| {
        let mut command = skein();
        command
            .args(["agent", "--join", &join, "--node", "old-1", "--simulate"])
            .arg(&fleet)
            .arg("--token-file")
            .arg(server.token_file());
        if let Some(ca) = ca {
            command.arg("--ca").arg(ca);
        }
        command.stderr(Stdio::piped()).spawn().unwrap()
    };

    // Without the lab's CA the agent does not trust the server and sends nothing.
    let mut untrusting = agent(None);
    std::thread::sleep(Duration::from_millis(3 * INTERVAL_MS));
    assert!(server.graph()["nodes"].as_array().unwrap().is_empty());
    let _ = untrusting.kill();
    let _ = untrusting.wait();

    let mut trusting = agent(Some(&cert_file));
    server.wait_for("old-1 over TLS", |g| all_reporting(g, 1));
    let _ = trusting.kill();
    let _ = trusting.wait();
}

/// `skein plan --server` plans on the live graph (`POST /v1/plans`), with the models read
/// from the server's hub; bad requests are refused with what is wrong.
#[test]
fn a_plan_on_the_live_graph() {
    let hub = skein_testkit::mock_hub::MockHub::start_in_background(skein_testkit::models::reference_hub_repos());
    let cache = tempfile::tempdir().unwrap();
    let hub_cache = cache.path().join("hub");
    let server = server_env(
        &[],
        &[
            ("HF_ENDPOINT", hub.url.as_ref()),
            ("HF_HOME", cache.path().as_os_str()),
            ("HF_HUB_CACHE", hub_cache.as_os_str()),
        ],
    );
    let fleet = workspace_file("workflows/fleets/lab.yaml");
    let _agents = Agents(
        ["a100-box", "rtx-1", "rtx-2", "old-1"]
            .iter()
            .map(|n| server.agent(&fleet, n))
            .collect(),
    );
    server.wait_for("four nodes reporting", |g| all_reporting(g, 4));

    let out = skein()
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args([
            "plan",
            "workflows/lab-research.yaml",
            "--server",
            &server.api,
            "--output",
            "json",
        ])
        .arg("--data-dir")
        .arg(server.data.path())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let plan: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(plan["admitted"], true, "{plan:#}");
    let coder = plan["instances"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["instance"] == "coder")
        .unwrap();
    assert_eq!(coder["precision"], "bf16");
    assert!(
        coder["devices"]
            .as_array()
            .unwrap()
            .iter()
            .all(|d| d["node"] == "a100-box")
    );

    // The table, from the same request.
    let out = skein()
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(["plan", "workflows/hello.yaml", "--server", &server.api])
        .arg("--data-dir")
        .arg(server.data.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("plan for `hello` (priority 0) on graph version "));

    let token = std::fs::read_to_string(server.data.path().join("api-token")).unwrap();
    let post = |body: Value, token: Option<&str>| {
        server.runtime.block_on(async {
            let mut request = reqwest::Client::new()
                .post(format!("{}/v1/plans", server.api))
                .json(&body);
            if let Some(token) = token {
                request = request.bearer_auth(token.trim());
            }
            let response = request.send().await.unwrap();
            (
                response.status().as_u16(),
                response.json::<Value>().await.unwrap_or(Value::Null),
            )
        })
    };
    let (status, body) = post(serde_json::json!({"workflow": "name: x\nagents: {}\n"}), Some(&token));
    assert_eq!(status, 422, "{body:#}");
    assert!(!body["diagnostics"].as_array().unwrap().is_empty(), "{body:#}");
    let (status, body) = post(serde_json::json!({"workflow": 1}), Some(&token));
    assert_eq!(status, 400, "{body:#}");
    let (status, _) = post(serde_json::json!({"workflow": "name: x"}), None);
    assert_eq!(status, 401);
}

/// Agent processes, killed when dropped (also when a test fails).
struct Agents(Vec<Child>);

impl Drop for Agents {
    fn drop(&mut self) {
        for agent in &mut self.0 {
            let _ = agent.kill();
            let _ = agent.wait();
        }
    }
}
