//! How large a fleet one orchestrator holds: a real `skein server` (1 s sampling) and a
//! swarm of simulated nodes of 8 GPUs in this process over the real agent protocol
//! (`skein_testkit::swarm`), ramped through node counts. At each count, while every node
//! streams a telemetry batch a second, clients read without pause, in three mixes one
//! after the other — the nodes route beside the baseline, the graph route beside the
//! baseline, all three at once — and time every answer in full:
//!
//! - `GET /healthz` — the baseline: the server's floor under the same load (no graph);
//! - `GET /v1/nodes` — a summary line per node;
//! - `GET /v1/graph` — the whole graph (every GPU's latest sample and health).
//!
//! A route holds at a count when its p99 is at most 100 ms and every node is up:
//! connected, ok (none missed three intervals), no call stalled. Also per count: the
//! oldest node's latest batch next to the newest's (about an interval when the server
//! keeps up), sends the swarm itself made late (its own share of the two cores), the
//! CPU of the server and of the swarm (100% = one core), and the server's RSS; at the
//! largest count, once every node has filled its 120-sample windows, the server's memory
//! per node. The swarm's nodes share a connection per 100 (see `skein_testkit::swarm`).
//!
//! `cargo bench --bench fleet_scale`. `FLEET_SCALE_NODES=1000,2500,5000,12500` (the
//! default) sets the counts, `FLEET_SCALE_MEASURE=15` the seconds of each mix, and
//! `FLEET_SCALE_FULL_WINDOWS=0` skips the wait for full windows (about two minutes).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use skein_testkit::lab::Lab;
use skein_testkit::swarm::{Swarm, SwarmConfig, SwarmError};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;

/// GPUs per node.
const GPUS: u32 = 8;
/// The sampling the goal is stated at.
const SAMPLE_INTERVAL: &str = "1s";
/// Streams per shared connection, under the server's cap of 32 streams per agent
/// connection.
const NODES_PER_CONNECTION: usize = 25;
/// Registrations in flight at once while a step's nodes join.
const JOINING_AT_ONCE: usize = 200;
/// Longest any call may take before it counts as a stall.
const DEADLINE: Duration = Duration::from_secs(10);
/// Each probe's longest wait (the whole graph is large).
const READ_TIMEOUT: Duration = Duration::from_secs(60);
/// Time after a step's nodes joined before measuring (every node has sent a batch).
const WARM_UP: Duration = Duration::from_secs(5);
/// Samples kept per GPU by the graph (its default window).
const WINDOW_SAMPLES: u64 = 120;
/// The goal.
const GOAL_P99_MS: f64 = 100.0;
/// The readers measured at each count, one mix after the other: each route alone beside
/// the baseline, then all at once.
const MIXES: [&[&str]; 3] = [
    &["/healthz", "/v1/nodes"],
    &["/healthz", "/v1/graph"],
    &["/healthz", "/v1/nodes", "/v1/graph"],
];

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// A process's resident memory, bytes (`VmRSS` of `/proc/PID/status`).
fn rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kib| kib * 1024)
}

/// A process's CPU time so far (user + system), seconds.
fn cpu_seconds(pid: &str) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The fields after the command's closing parenthesis: utime and stime are 14 and 15
    // of the whole line, 12 and 13 after it.
    let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| fields.get(i).and_then(|f| f.parse::<f64>().ok()).unwrap_or(0.0);
    // Clock ticks are 1/100 s on Linux.
    (ticks(11) + ticks(12)) / 100.0
}

/// The `q` quantile of sorted `values` (nearest rank).
fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

/// Latencies of one route over a step, milliseconds, and the last answer's size.
#[derive(Default)]
struct Route {
    ms: Vec<f64>,
    bytes: usize,
    failed: u64,
}

impl Route {
    fn summary(&mut self) -> (f64, f64, f64) {
        self.ms.sort_by(f64::total_cmp);
        (
            quantile(&self.ms, 0.5),
            quantile(&self.ms, 0.99),
            self.ms.last().copied().unwrap_or(f64::NAN),
        )
    }
}

/// Reads `path` without pause until `until`, timing each answer in full.
async fn probe(http: reqwest::Client, url: String, token: String, until: Instant) -> Route {
    let mut route = Route::default();
    while Instant::now() < until {
        let sent = Instant::now();
        let answer = http.get(&url).bearer_auth(&token).timeout(READ_TIMEOUT).send().await;
        let body = match answer {
            Ok(response) if response.status().is_success() => response.bytes().await.ok(),
            _ => None,
        };
        match body {
            Some(body) => {
                route.ms.push(sent.elapsed().as_secs_f64() * 1000.0);
                route.bytes = body.len();
            }
            None => route.failed += 1,
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    route
}

/// What the swarm's nodes ran into, so far.
#[derive(Default)]
struct Trouble {
    /// Calls not answered within the deadline.
    stalls: AtomicU64,
    /// Calls refused, or streams closed under a node.
    failures: AtomicU64,
    /// Batches that left more than half an interval late (the server's intake lagged).
    late: AtomicU64,
}

impl Trouble {
    fn count(&self, error: &SwarmError) {
        let counter = match error {
            SwarmError::Stalled { .. } => &self.stalls,
            SwarmError::Refused { .. } | SwarmError::Closed { .. } => &self.failures,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        eprintln!("{error}");
    }
}

/// Node `slot` joins (saying on `joined` whether it could) and sends a batch every
/// interval until `stop`.
async fn node(
    swarm: Swarm,
    slot: usize,
    trouble: Arc<Trouble>,
    joined: mpsc::Sender<bool>,
    mut stop: watch::Receiver<bool>,
) {
    let (registered, mut stream) = match swarm.join(slot, &format!("scale-{slot:05}")).await {
        Ok(joined) => joined,
        Err(error) => {
            trouble.count(&error);
            let _ = joined.send(false).await;
            return;
        }
    };
    let interval = registered.interval;
    let _ = joined.send(true).await;
    // A phase of its own, so that the fleet's batches spread over the interval.
    let phase = Duration::from_millis((slot as u64).wrapping_mul(7919) % interval.as_millis().max(1) as u64);
    let mut next = tokio::time::Instant::now() + phase;
    let mut seq: u32 = 0;
    while !*stop.borrow() {
        tokio::select! {
            _ = tokio::time::sleep_until(next) => {}
            _ = stop.changed() => continue,
        }
        if tokio::time::Instant::now() > next + interval / 2 {
            trouble.late.fetch_add(1, Ordering::Relaxed);
        }
        seq = seq.wrapping_add(1);
        if let Err(error) = stream.telemetry(seq % 100).await {
            trouble.count(&error);
            return;
        }
        next += interval;
    }
}

fn main() {
    let steps: Vec<usize> = std::env::var("FLEET_SCALE_NODES")
        .unwrap_or_else(|_| "1000,2500,5000,12500".to_owned())
        .split(',')
        .filter_map(|n| n.trim().parse().ok())
        .collect();
    let measure = Duration::from_secs(env_or("FLEET_SCALE_MEASURE", 15));
    let full_windows = env_or("FLEET_SCALE_FULL_WINDOWS", 1) != 0;
    let largest = steps.iter().copied().max().unwrap_or(0);

    let lab = Lab::new(env!("CARGO_BIN_EXE_skein")).sample_interval(SAMPLE_INTERVAL);
    let server = lab.server();
    let pid = server.0.id();
    let (api, token) = (lab.api(), lab.token());
    let join_token = std::fs::read_to_string(lab.data_dir().join("join-token"))
        .expect("the server wrote its join token")
        .trim()
        .to_owned();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    println!(
        "fleet_scale: {GPUS} GPUs a node, {SAMPLE_INTERVAL} sampling, {} s per mix of readers, goal: REST p99 ≤ {GOAL_P99_MS} ms",
        measure.as_secs()
    );
    println!(
        "| nodes | GPUs | /healthz p50 / p99 / max (n) | /v1/nodes p50 / p99 / max (n) | /v1/graph p50 / p99 / max (n) \
         | readers | graph | nodes not ok | oldest batch | stalls | late sends | server CPU | swarm CPU | server RSS \
         | p99 ≤ 100 ms |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");

    runtime.block_on(async {
        let swarm = Swarm::connect(SwarmConfig {
            join: lab.join_url(),
            token: join_token,
            gpus: GPUS,
            connections: largest.div_ceil(NODES_PER_CONNECTION).max(1),
            deadline: DEADLINE,
        })
        .await
        .expect("the swarm connects");
        let http = reqwest::Client::new();
        let (stop_tx, stop) = watch::channel(false);
        let mut nodes = JoinSet::new();
        let trouble = Arc::new(Trouble::default());
        let rss_empty = rss(pid);
        let mut last_joined = Instant::now();
        let pid_text = pid.to_string();
        let mut counted = (0u64, 0u64);
        let mut joined_total = 0;

        for step in std::iter::once(0).chain(steps.iter().copied()) {
            // The step's new nodes join, a bounded number at a time.
            let (joined_tx, mut joined_rx) = mpsc::channel(JOINING_AT_ONCE);
            let already = joined_total;
            joined_total = joined_total.max(step);
            let mut waiting = 0;
            let mut refused = 0u64;
            for slot in already..step {
                if waiting == JOINING_AT_ONCE {
                    refused += u64::from(!joined_rx.recv().await.unwrap_or(false));
                    waiting -= 1;
                }
                let (swarm, trouble, joined, stop) = (swarm.clone(), trouble.clone(), joined_tx.clone(), stop.clone());
                nodes.spawn(node(swarm, slot, trouble, joined, stop));
                waiting += 1;
            }
            for _ in 0..waiting {
                refused += u64::from(!joined_rx.recv().await.unwrap_or(false));
            }
            if step > already {
                last_joined = Instant::now();
            }
            tokio::time::sleep(WARM_UP).await;

            // Each mix of readers in turn, for `measure` each.
            let mut rows = Vec::new();
            for mix in MIXES {
                let until = Instant::now() + measure;
                let before = (cpu_seconds(&pid_text), cpu_seconds("self"), Instant::now());
                let probes: Vec<_> = mix
                    .iter()
                    .map(|path| tokio::spawn(probe(http.clone(), format!("{api}{path}"), token.clone(), until)))
                    .collect();
                let mut routes = Vec::new();
                for (path, probe) in mix.iter().zip(probes) {
                    routes.push((*path, probe.await.expect("a probe finishes")));
                }
                let seconds = before.2.elapsed().as_secs_f64();
                let cpu = (
                    (cpu_seconds(&pid_text) - before.0) / seconds,
                    (cpu_seconds("self") - before.1) / seconds,
                );
                rows.push((routes, cpu));
            }

            // The graph's state after the step: every node up, and how fresh.
            let graph: serde_json::Value = http
                .get(format!("{api}/v1/graph"))
                .bearer_auth(&token)
                .timeout(READ_TIMEOUT)
                .send()
                .await
                .expect("the graph is read")
                .json()
                .await
                .expect("the graph is JSON");
            let listed = graph["nodes"].as_array().cloned().unwrap_or_default();
            let not_ok = listed
                .iter()
                .filter(|n| n["health"]["state"] != "ok" || n["connected"] != true)
                .count();
            // How old the oldest node's latest batch is, next to the newest's (the server's
            // clock): about an interval when the server keeps up with the fleet.
            let seen: Vec<u64> = listed.iter().filter_map(|n| n["last_seen_ms"].as_u64()).collect();
            let oldest = seen
                .iter()
                .max()
                .zip(seen.iter().min())
                .map_or(0, |(new, old)| new - old);
            // This step's share of the counts.
            let now = (
                trouble.stalls.load(Ordering::Relaxed) + trouble.failures.load(Ordering::Relaxed) + refused,
                trouble.late.load(Ordering::Relaxed),
            );
            let (stalls, late) = (now.0 - counted.0, now.1 - counted.1);
            counted = now;
            let up = not_ok == 0 && listed.len() == step && stalls == 0;
            let mib = |bytes: u64| bytes as f64 / f64::from(1 << 20);
            for (mut routes, cpu) in rows {
                let mut cells = Vec::new();
                let mut verdict = Vec::new();
                for path in ["/healthz", "/v1/nodes", "/v1/graph"] {
                    match routes.iter_mut().find(|(p, _)| *p == path) {
                        Some((_, route)) => {
                            let (p50, p99, max) = route.summary();
                            cells.push(format!("{p50:.1} / {p99:.1} / {max:.1} ms ({})", route.ms.len()));
                            if path != "/healthz" {
                                let holds = up && p99 <= GOAL_P99_MS && route.failed == 0;
                                verdict.push(format!("{}: {}", &path[4..], if holds { "yes" } else { "no" }));
                            }
                            if route.failed > 0 {
                                println!("  ({} reads of {path} failed)", route.failed);
                            }
                        }
                        None => cells.push("—".to_owned()),
                    }
                }
                let graph_bytes = routes
                    .iter()
                    .find(|(p, _)| *p == "/v1/graph")
                    .map_or(String::from("—"), |(_, r)| format!("{:.1} MB", r.bytes as f64 / 1e6));
                println!(
                    "| {step} | {} | {} | {} | {graph_bytes} | {not_ok} | {oldest} ms | {stalls} | {late} | {:.0}% | \
                     {:.0}% | {:.0} MiB | {} |",
                    step * GPUS as usize,
                    cells.join(" | "),
                    routes.iter().map(|(p, _)| *p).collect::<Vec<_>>().join(" + "),
                    cpu.0 * 100.0,
                    cpu.1 * 100.0,
                    mib(rss(pid)),
                    verdict.join(", "),
                );
            }
        }

        if full_windows && largest > 0 {
            // Every GPU's window holds 120 samples after 120 intervals of its node.
            let full = Duration::from_secs(WINDOW_SAMPLES + 5);
            let wait = full.saturating_sub(last_joined.elapsed());
            tokio::time::sleep(wait).await;
            let full_rss = rss(pid);
            println!(
                "memory: server RSS {:.0} MiB with no node, {:.0} MiB with {largest} nodes of {GPUS} GPUs and full \
                 windows ({WINDOW_SAMPLES} samples a GPU): {:.1} KiB per node",
                rss_empty as f64 / (1 << 20) as f64,
                full_rss as f64 / (1 << 20) as f64,
                full_rss.saturating_sub(rss_empty) as f64 / 1024.0 / largest as f64,
            );
        }
        stop_tx.send(true).expect("the nodes listen");
        while nodes.join_next().await.is_some() {}
    });
    drop(server);
}
