//! Many agents at once against a real `skein server` (counted, not timed): 2,000
//! simulated nodes of 8 GPUs join over the real agent protocol within a few seconds,
//! then stream telemetry while they reconnect, open a second stream before the first
//! closed, leave and come back, or are replaced under a new name; meanwhile clients read
//! `GET /v1/graph`, `GET /v1/nodes` and `GET /v1/runs` without pause.
//!
//! Every call — each registration, stream opening, telemetry batch, departure and REST
//! read — must be answered within [`DEADLINE`]; one that is not is a stall, and the test
//! wants none. At the end the graph must hold every name once, under the id its first
//! registration got, in the state its node ended in (streaming: connected and ok; gone:
//! left). The graph once froze for good under this load (a lock-order inversion between
//! registering a new node and connecting a known one); on a stall the test prints the
//! server's thread stacks (gdb, where installed) to show where it waits.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use serde_json::Value;
use skein_testkit::lab::{Lab, Rng};
use skein_testkit::swarm::{NodeStream, Registered, Swarm, SwarmConfig, SwarmError};

/// Simulated nodes.
const NODES: usize = 2_000;
/// GPUs per node.
const GPUS: u32 = 8;
/// The telemetry interval the server asks for (a node is down after three missed).
const SAMPLE_INTERVAL: &str = "1s";
/// Nodes join spread over this long, so that new nodes register while others stream.
const JOIN_SPREAD: Duration = Duration::from_secs(5);
/// How long the nodes churn, from the start.
const CHURN: Duration = Duration::from_secs(20);
/// The longest any call may take before it counts as a stall.
const DEADLINE: Duration = Duration::from_secs(10);
/// How long the graph may take to settle into the nodes' end states after the churn.
const SETTLE: Duration = Duration::from_secs(30);
/// What the clients read, one client per route, without pause. One whole-graph reader:
/// two at once keep both of the server's runtime workers busy serializing the graph
/// (docs/PERFORMANCE.md, "Fleet scale"), which is slow, not stuck, and not what this
/// test looks for.
const READS: [&str; 3] = ["/v1/graph", "/v1/nodes", "/v1/runs"];
/// Connections the nodes share: 25 streams each, under the server's cap of 32 streams
/// per agent connection (a real agent holds one stream and makes a few calls).
const CONNECTIONS: usize = NODES.div_ceil(25);
/// Every this many nodes, one ends by leaving; the others end streaming.
const LEAVER_EVERY: usize = 10;

/// What the graph must say of a name in the end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    /// Its node is streaming: connected, ok.
    Live,
    /// Its node left (at the end, or replaced under a new name).
    Left,
}

/// Answers and stalls per call, and the first failures in words.
#[derive(Default)]
struct Tally {
    calls: BTreeMap<&'static str, Counts>,
    failures: Vec<String>,
}

#[derive(Debug, Default, Clone, Copy)]
struct Counts {
    answered: u64,
    stalled: u64,
    failed: u64,
    /// The longest answer (REST reads only), for the log: the margin to the deadline.
    slowest: Duration,
}

type Shared = Arc<Mutex<Tally>>;

fn answered(tally: &Shared, call: &'static str) {
    tally.lock().unwrap().calls.entry(call).or_default().answered += 1;
}

fn failed(tally: &Shared, call: &'static str, stall: bool, what: String) {
    let mut tally = tally.lock().unwrap();
    let counts = tally.calls.entry(call).or_default();
    if stall {
        counts.stalled += 1;
    } else {
        counts.failed += 1;
    }
    if tally.failures.len() < 20 {
        tally.failures.push(what);
    }
}

/// The swarm's error, counted under its call.
fn count_error(tally: &Shared, error: &SwarmError) {
    let (call, stall) = match error {
        SwarmError::Stalled { call, .. } => (*call, true),
        SwarmError::Refused { call, .. } | SwarmError::Closed { call, .. } => (*call, false),
    };
    failed(tally, call, stall, error.to_string());
}

/// A simulated node of the swarm, on connection `slot`.
struct Node {
    swarm: Swarm,
    slot: usize,
    tally: Shared,
}

impl Node {
    async fn join(&self, name: &str, known: Option<&str>) -> Result<(Registered, NodeStream), SwarmError> {
        let (registered, stream) = self.swarm.join(self.slot, name).await?;
        answered(&self.tally, "open");
        let got = (registered.node_id.as_str(), registered.known);
        match known {
            Some(id) if got != (id, true) => {
                failed(
                    &self.tally,
                    "register",
                    false,
                    format!("{name} rejoined as {got:?}, not {id}"),
                );
            }
            None if registered.known => failed(&self.tally, "register", false, format!("{name} is new but was known")),
            _ => answered(&self.tally, "register"),
        }
        Ok((registered, stream))
    }

    async fn send(&self, stream: &mut NodeStream, choices: &mut Rng) -> Result<(), SwarmError> {
        stream.telemetry(choices.below(100) as u32).await?;
        answered(&self.tally, "telemetry");
        Ok(())
    }

    async fn leave(&self, stream: NodeStream, reason: &str) -> Result<(), SwarmError> {
        stream.leave(reason).await?;
        answered(&self.tally, "leave");
        Ok(())
    }

    /// Node `index`'s life: joins, churns until [`CHURN`] after `start`, then either
    /// leaves or streams until `stop`. Says its names, ids and end states on `ends` once
    /// it is in its end state.
    async fn live(
        self,
        index: usize,
        start: Instant,
        ends: &mpsc::Sender<Vec<(String, String, End)>>,
        mut stop: tokio::sync::watch::Receiver<bool>,
    ) -> Result<(), SwarmError> {
        // A fixed sequence of choices per node (xorshift wants a seed other than 0).
        let mut choices = Rng((index as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let mut names = Vec::new();
        tokio::time::sleep(Duration::from_millis(choices.below(JOIN_SPREAD.as_millis() as u64))).await;
        let mut name = format!("node-{index:04}");
        let (registered, mut stream) = self.join(&name, None).await?;
        let mut id = registered.node_id;
        let interval = registered.interval;
        let mut replaced = 0;
        while start.elapsed() < CHURN {
            self.send(&mut stream, &mut choices).await?;
            // Up to a tenth of an interval late, as agents' clocks drift.
            let jitter = Duration::from_millis(choices.below(interval.as_millis() as u64 / 10 + 1));
            tokio::time::sleep(interval + jitter).await;
            match choices.below(1000) {
                // The connection broke: the agent registers again and reopens.
                0..40 => {
                    drop(stream);
                    stream = self.join(&name, Some(&id)).await?.1;
                }
                // A restarted agent's new stream opens before the old one is seen to close.
                40..60 => {
                    let newer = self.join(&name, Some(&id)).await?.1;
                    drop(std::mem::replace(&mut stream, newer));
                }
                // Leaves (a rack reboots) and comes back.
                60..80 => {
                    self.leave(stream, "rack reboot").await?;
                    tokio::time::sleep(Duration::from_millis(choices.below(2000))).await;
                    stream = self.join(&name, Some(&id)).await?.1;
                }
                // Replaced: the node leaves for good and its machine joins under a new name.
                80..90 => {
                    self.leave(stream, "replaced").await?;
                    names.push((name, id, End::Left));
                    replaced += 1;
                    name = format!("node-{index:04}-r{replaced}");
                    let (registered, newer) = self.join(&name, None).await?;
                    (id, stream) = (registered.node_id, newer);
                }
                _ => {}
            }
        }
        if index.is_multiple_of(LEAVER_EVERY) {
            self.leave(stream, "done").await?;
            names.push((name, id, End::Left));
            let _ = ends.send(names).await;
            return Ok(());
        }
        names.push((name, id, End::Live));
        let _ = ends.send(names).await;
        while !*stop.borrow() {
            self.send(&mut stream, &mut choices).await?;
            tokio::select! {
                _ = tokio::time::sleep(interval) => {}
                _ = stop.changed() => {}
            }
        }
        Ok(())
    }
}

/// Reads `path` over REST with the deadline, counting the answer or the stall.
async fn read(http: &reqwest::Client, api: &str, token: &str, path: &'static str, tally: &Shared) -> Option<Value> {
    let began = Instant::now();
    let sent = http
        .get(format!("{api}{path}"))
        .bearer_auth(token)
        .timeout(DEADLINE)
        .send();
    let response = match sent.await {
        Ok(response) => response,
        Err(error) => {
            failed(tally, path, error.is_timeout(), format!("GET {path}: {error}"));
            return None;
        }
    };
    let status = response.status();
    match response.json::<Value>().await {
        Ok(body) if status.is_success() => {
            answered(tally, path);
            let mut tally = tally.lock().unwrap();
            let counts = tally.calls.entry(path).or_default();
            counts.slowest = counts.slowest.max(began.elapsed());
            Some(body)
        }
        Ok(body) => {
            failed(tally, path, false, format!("GET {path}: {status} {body}"));
            None
        }
        Err(error) => {
            failed(
                tally,
                path,
                error.is_timeout(),
                format!("GET {path}: {status}, {error}"),
            );
            None
        }
    }
}

/// The server's thread stacks, from gdb when it is installed (for a stall's message).
fn server_stacks(pid: u32) -> String {
    let output = std::process::Command::new("gdb")
        .args(["-p", &pid.to_string(), "-batch", "-ex", "thread apply all bt"])
        .output();
    match output {
        Ok(output) => String::from_utf8_lossy(&output.stdout).into_owned(),
        Err(error) => format!("(no stacks: gdb: {error})"),
    }
}

/// The names the graph holds that differ from `expected` (missing, extra, or in
/// another state), in words; empty when they agree.
fn disagreements(nodes: &Value, expected: &BTreeMap<String, (String, End)>) -> Vec<String> {
    let mut seen = BTreeMap::new();
    let mut problems = Vec::new();
    for node in nodes.as_array().into_iter().flatten() {
        let name = node["name"].as_str().unwrap_or_default().to_owned();
        let state = (
            node["id"].as_str().unwrap_or_default().to_owned(),
            node["connected"] == true,
            node["health"].as_str().unwrap_or_default().to_owned(),
            node["gpus"].as_u64().unwrap_or(0),
        );
        if seen.insert(name.clone(), state).is_some() {
            problems.push(format!("{name} is listed twice"));
        }
    }
    for (name, (id, end)) in expected {
        let want = match end {
            End::Live => (id.clone(), true, "ok".to_owned(), u64::from(GPUS)),
            End::Left => (id.clone(), false, "left".to_owned(), u64::from(GPUS)),
        };
        match seen.remove(name) {
            Some(got) if got == want => {}
            Some(got) => problems.push(format!("{name}: {got:?}, expected {want:?}")),
            None => problems.push(format!("{name} is missing")),
        }
    }
    problems.extend(seen.keys().map(|name| format!("{name} was never registered")));
    problems
}

#[test]
fn two_thousand_agents_churning_while_clients_read_never_stall_the_server() {
    let lab = Lab::new(env!("CARGO_BIN_EXE_skein")).sample_interval(SAMPLE_INTERVAL);
    let server = lab.server();
    let (api, token) = (lab.api(), lab.token());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let tally: Shared = Arc::default();
    let started = Instant::now();

    let (ends, problems, graph) = runtime.block_on(async {
        let swarm = Swarm::connect(SwarmConfig {
            join: lab.join_url(),
            token: std::fs::read_to_string(lab.data_dir().join("join-token"))
                .unwrap()
                .trim()
                .to_owned(),
            gpus: GPUS,
            connections: CONNECTIONS,
            deadline: DEADLINE,
        })
        .await
        .unwrap();
        let http = reqwest::Client::new();
        let (stop_tx, stop) = tokio::sync::watch::channel(false);

        let mut readers = tokio::task::JoinSet::new();
        for path in READS {
            let (http, api, token, tally, stop) =
                (http.clone(), api.clone(), token.clone(), tally.clone(), stop.clone());
            readers.spawn(async move {
                while !*stop.borrow() {
                    read(&http, &api, &token, path, &tally).await;
                }
            });
        }

        let start = Instant::now();
        let (ends_tx, mut ends_rx) = mpsc::channel(NODES);
        let mut nodes = tokio::task::JoinSet::new();
        for index in 0..NODES {
            let node = Node {
                swarm: swarm.clone(),
                slot: index,
                tally: tally.clone(),
            };
            let (tally, stop, ends) = (tally.clone(), stop.clone(), ends_tx.clone());
            nodes.spawn(async move {
                if let Err(error) = node.live(index, start, &ends, stop).await {
                    count_error(&tally, &error);
                    // Counted as a failure; the node says no end state.
                    let _ = ends.send(Vec::new()).await;
                }
            });
        }

        // Every node's end state, once the churn is over (leavers have left, the others
        // stream on, so the graph is read while they do).
        let mut ends: BTreeMap<String, (String, End)> = BTreeMap::new();
        for _ in 0..NODES {
            let names = tokio::time::timeout(CHURN + SETTLE, ends_rx.recv())
                .await
                .expect("every node reaches its end state")
                .expect("the nodes' channel stays open");
            for (name, id, end) in names {
                ends.insert(name, (id, end));
            }
        }
        // The graph settles into them: leavers left, the others connected and ok.
        let deadline = Instant::now() + SETTLE;
        let mut settled = vec!["the nodes were never listed".to_owned()];
        while Instant::now() < deadline {
            if let Some(listed) = read(&http, &api, &token, "/v1/nodes", &tally).await {
                settled = disagreements(&listed, &ends);
                if settled.is_empty() {
                    break;
                }
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        let graph = read(&http, &api, &token, "/v1/graph", &tally).await;
        stop_tx.send(true).unwrap();
        while nodes.join_next().await.is_some() {}
        while readers.join_next().await.is_some() {}
        (ends, settled, graph)
    });
    let elapsed = started.elapsed();

    let tally = tally.lock().unwrap();
    eprintln!("{NODES} nodes, {elapsed:.1?}; calls answered / stalled / failed (slowest REST answer):");
    for (call, counts) in &tally.calls {
        let slowest = if counts.slowest.is_zero() {
            String::new()
        } else {
            format!(" ({:.1?})", counts.slowest)
        };
        eprintln!(
            "  {call}: {} / {} / {}{slowest}",
            counts.answered, counts.stalled, counts.failed
        );
    }
    let stalled: u64 = tally.calls.values().map(|c| c.stalled).sum();
    let failures: u64 = tally.calls.values().map(|c| c.failed).sum();
    if stalled > 0 {
        eprintln!("the server's threads:\n{}", server_stacks(server.0.id()));
    }
    assert_eq!(
        (stalled, failures),
        (0, 0),
        "calls stalled or failed (server log: {}): {:#?}",
        lab.dir().join("server.log").display(),
        tally.failures
    );
    // Counted, so that a quiet run cannot pass: every node sent telemetry, and the graph
    // was read while they did.
    let count = |call: &str| tally.calls.get(call).map_or(0, |c| c.answered);
    assert!(count("telemetry") >= (NODES * 5) as u64, "{:?}", tally.calls);
    assert!(count("/v1/graph") >= 10 && count("/v1/nodes") >= 10 && count("/v1/runs") >= 10);

    assert!(
        problems.is_empty(),
        "the graph did not settle into the nodes' end states: {} disagreements, first: {:#?}",
        problems.len(),
        &problems[..problems.len().min(20)]
    );
    let graph = graph.expect("the graph was read at the end");
    let in_graph: BTreeMap<&str, &Value> = graph["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| (n["inventory"]["name"].as_str().unwrap(), n))
        .collect();
    assert_eq!(in_graph.len(), ends.len());
    for (name, (id, end)) in &ends {
        let node = in_graph[name.as_str()];
        assert_eq!(node["id"], id.as_str(), "{name}");
        assert_eq!(node["gpus"].as_array().unwrap().len(), GPUS as usize, "{name}");
        if *end == End::Live {
            assert!(node["gpus"][0]["latest"].is_object(), "{name} has telemetry");
        }
    }
    drop(server);
}
