//! How fast a reflex reacts, end to end, with real processes on loopback: `skein server`
//! and one `skein agent --simulate` whose only GPU's utilization is a square wave (2 s
//! period, half high at 0.95, half low at 0.1), a serving workflow of one remote
//! endpoint agent (no engine) with a reflex on the node — `gpu.util > 0.8`, `for: 0s`,
//! `cooldown: 0s`, `notify` — so that every edge of the wave is a decision: a fire on
//! the way up, a release on the way down.
//!
//! The benchmark follows `GET /v1/events/stream` and, for each fire and release, takes
//!
//! - reaction: when the event reached the benchmark − `sampled_at` (when the agent took
//!   the GPU sample that decided it): telemetry over gRPC, the graph, the reflex engine,
//!   the run's actor, the event log's flush to disk, the stream;
//! - decision: `at` − `sampled_at` (the orchestrator's side up to the decision).
//!
//! All on one machine, so the agent's clock and the benchmark's are the same clock. The
//! times are milliseconds (the event's times are whole milliseconds).
//!
//! `cargo bench --bench reflex_reaction`; `REFLEX_REACTION_EVENTS=N` (default 60) sets
//! how many events are measured, after the first two (warm-up).

use std::io::Write;
use std::sync::mpsc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use serde_json::Value;
use skein_testkit::lab::{Lab, PATIENCE, stderr, stdout};

/// The simulated node: one RTX 4090 whose load is a square wave from t = 0.
const FLEET: &str = "\
fleet: reflex-reaction
nodes:
  bench-1:
    gpus: { model: RTX4090-24GB, count: 1 }
    telemetry:
      utilization: { square: { low: 0.1, high: 0.95, period: 2s, duty: 0.5 } }
";

/// A serving run (no steps) of one remote endpoint agent (nothing is ever sent to it),
/// with the reflex watching the node.
const WORKFLOW: &str = "\
name: reflex-reaction
agents:
  remote:
    endpoint: { url: \"http://127.0.0.1:9/v1\", model: none }
reflexes:
  - name: wave
    when: 'gpu.util > 0.8'
    for: 0s
    cooldown: 0s
    scope: { node: bench-1 }
    do: [ notify ]
";

/// How often the agent samples.
const SAMPLE_INTERVAL: &str = "200ms";

/// Events not measured: the first fire may come with the reflex going live.
const WARM_UP: usize = 2;

fn unix_ms(value: &Value) -> Option<f64> {
    let time = humantime::parse_rfc3339(value.as_str()?).ok()?;
    Some(time.duration_since(UNIX_EPOCH).ok()?.as_secs_f64() * 1000.0)
}

/// Follows the event stream; each `reflex` event goes to `events` with when its last
/// byte arrived. `connected` is told once the stream is open.
fn follow(url: String, token: String, connected: mpsc::Sender<()>, events: mpsc::Sender<(SystemTime, Value)>) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async move {
        let mut response = reqwest::Client::new()
            .get(&url)
            .bearer_auth(token)
            .send()
            .await
            .expect("the event stream opens");
        assert!(response.status().is_success(), "{}", response.status());
        let _ = connected.send(());
        let mut buffer = String::new();
        while let Ok(Some(chunk)) = response.chunk().await {
            let received = SystemTime::now();
            buffer.push_str(&String::from_utf8_lossy(&chunk));
            while let Some(end) = buffer.find("\n\n") {
                let block: String = buffer.drain(..end + 2).collect();
                let mut name = "";
                let mut data = String::new();
                for line in block.lines() {
                    if let Some(value) = line.strip_prefix("event:") {
                        name = value.trim();
                    } else if let Some(value) = line.strip_prefix("data:") {
                        data.push_str(value.trim_start());
                    }
                }
                if name == "reflex"
                    && let Ok(event) = serde_json::from_str(&data)
                    && events.send((received, event)).is_err()
                {
                    return;
                }
            }
        }
    });
}

/// The `q` quantile of sorted `values` (nearest rank).
fn quantile(sorted: &[f64], q: f64) -> f64 {
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

fn summary(name: &str, mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    let p99 = quantile(&values, 0.99);
    println!(
        "{name:<32} p50 {:>7.1} ms   p90 {:>7.1} ms   p99 {:>7.1} ms   max {:>7.1} ms   (n = {})",
        quantile(&values, 0.5),
        quantile(&values, 0.9),
        p99,
        values.last().copied().unwrap_or(0.0),
        values.len()
    );
    p99
}

fn main() {
    let wanted: usize = std::env::var("REFLEX_REACTION_EVENTS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(60);
    let lab = Lab::new(env!("CARGO_BIN_EXE_skein"))
        .sample_interval(SAMPLE_INTERVAL)
        .server_args(&["--endpoint-allow", "127.0.0.1"]);
    let _server = lab.server();

    let (connected, is_connected) = mpsc::channel();
    let (events, received) = mpsc::channel();
    let url = format!("{}/v1/events/stream", lab.api());
    let token = lab.token();
    std::thread::spawn(move || follow(url, token, connected, events));
    is_connected.recv_timeout(PATIENCE).expect("the event stream opens");

    let fleet = lab.dir().join("fleet.yaml");
    std::fs::write(&fleet, FLEET).unwrap();
    let _agent = lab.simulated_agent(&fleet, "bench-1");
    lab.nodes_up(1);
    let workflow = lab.dir().join("reflex-reaction.yaml");
    std::fs::write(&workflow, WORKFLOW).unwrap();
    let submitted = lab.cli(&["submit", workflow.to_str().unwrap()]);
    assert!(submitted.status.success(), "{}", stderr(&submitted));
    let run = stdout(&submitted).trim().to_owned();
    let serving = lab.wait_run(&run, "the run to serve", |r| {
        matches!(r["state"].as_str(), Some("running" | "failed"))
    });
    assert_eq!(serving["state"], "running", "{serving:#}");
    println!(
        "reflex reaction: server + 1 simulated agent (square wave 0.1/0.95, 2 s period), sample interval {SAMPLE_INTERVAL}, \
         measuring {wanted} fire/release events after {WARM_UP} warm-up"
    );

    let started = Instant::now();
    let mut seen = 0usize;
    let mut reaction = Vec::new();
    let mut decision = Vec::new();
    let mut unsampled = 0usize;
    let mut kinds = [0usize; 2];
    while reaction.len() + unsampled < wanted {
        let (arrived, event) = received
            .recv_timeout(PATIENCE)
            .unwrap_or_else(|_| panic!("no event for {PATIENCE:?}\n{}", lab.logs(30)));
        let kind = event["kind"].as_str().unwrap_or_default();
        if event["run"] != run.as_str() || !matches!(kind, "fire" | "release") {
            continue;
        }
        seen += 1;
        if seen <= WARM_UP {
            continue;
        }
        kinds[usize::from(kind == "release")] += 1;
        let (Some(sampled), Some(at)) = (unix_ms(&event["sampled_at"]), unix_ms(&event["at"])) else {
            unsampled += 1;
            continue;
        };
        let arrived = arrived.duration_since(UNIX_EPOCH).unwrap().as_secs_f64() * 1000.0;
        reaction.push(arrived - sampled);
        decision.push(at - sampled);
        if reaction.len() % 10 == 0 {
            print!(".");
            let _ = std::io::stdout().flush();
        }
    }
    println!();
    println!(
        "{} events ({} fire, {} release) in {:.1} s; {unsampled} without sampled_at",
        kinds[0] + kinds[1],
        kinds[0],
        kinds[1],
        started.elapsed().as_secs_f64()
    );
    let p99 = summary("reaction (received - sampled_at)", reaction);
    summary("decision (at - sampled_at)", decision);
    println!("goal p99 <= 1000 ms: {}", if p99 <= 1000.0 { "met" } else { "NOT met" });
}
