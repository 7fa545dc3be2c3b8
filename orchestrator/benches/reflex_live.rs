//! Reaction time of live reflexes in one process: a real server (gRPC and REST on
//! loopback, sled on disk) and a test agent over the real agent protocol. A serving run
//! declares a reflex on the agent's node (`gpu.util > 0.8`, no hold, no cooldown,
//! `notify`); the agent's GPU goes busy and idle in turn, and each time the clock runs
//! from just before the sample is sent to the moment the event, durable in the database,
//! is announced: the fire, then the release. The baseline, in the same run, is the
//! transport alone: from a sample sent to the graph announcing its telemetry.
//!
//! `cargo bench -p skein-orchestrator --bench reflex_live` (`-- --quick` for a short run).

#[path = "../tests/common/mod.rs"]
mod common;

use std::time::{Duration, Instant};

use serde_json::json;
use skein_orchestrator::graph::GraphEvent;
use skein_orchestrator::reflex::EventKind;
use skein_orchestrator::run::ExecutorConfig;
use skein_testkit::agent::{EngineBehaviour, GpuLoad, TestAgent};

const WORKFLOW: &str = "name: reaction
agents:
  remote: { endpoint: { url: \"http://127.0.0.1:9/v1\", model: m } }
reflexes:
  - name: busy
    when: 'gpu.util > 0.8'
    scope: { node: box }
    do: [ notify ]
    cooldown: 0s
";

fn percentile(sorted: &[f64], q: f64) -> f64 {
    sorted[((sorted.len() as f64 * q).ceil() as usize).clamp(1, sorted.len()) - 1]
}

fn say(what: &str, mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    let p50 = percentile(&values, 0.5);
    println!(
        "{what:<34} n={:<4} p50 {p50:>7.3} ms  p90 {:>7.3} ms  p99 {:>7.3} ms  max {:>7.3} ms",
        values.len(),
        percentile(&values, 0.9),
        percentile(&values, 0.99),
        values[values.len() - 1],
    );
    p50
}

fn load(util: u32) -> GpuLoad {
    GpuLoad {
        utilization_pct: util,
        ..GpuLoad::default()
    }
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let rounds = if quick { 30 } else { 300 };
    common::bench_runtime().block_on(async {
        let setup = common::setup(ExecutorConfig::default(), None).await;
        let server = &setup.server;
        let agent = TestAgent::join(server.grpc_addr, common::TOKEN, "box", 1, EngineBehaviour::default()).await;
        setup.wait_nodes(1).await;
        let response = setup.submit(WORKFLOW, json!({})).await;
        assert!(response.status().is_success(), "{}", response.text().await.unwrap());
        let run: serde_json::Value = response.json().await.unwrap();
        let id = run["id"].as_str().unwrap().to_owned();
        setup.wait_run(&id, |r| r["state"] == "running").await;
        let mut events = server.reflex_events.subscribe();
        let mut graph = server.events.subscribe();
        // The reflexes see the run (they follow run changes) before the clock starts.
        let deadline = Instant::now() + Duration::from_secs(30);
        while !server.reflexes.runs().contains(&id) {
            assert!(Instant::now() < deadline, "the run's reflexes never went live");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }

        let mut fire = Vec::new();
        let mut release = Vec::new();
        let mut transport = Vec::new();
        for round in 0..rounds * 2 {
            let busy = round % 2 == 0;
            let wanted = if busy { EventKind::Fire } else { EventKind::Release };
            let started = Instant::now();
            agent.set_gpu(0, load(if busy { 95 } else { 5 }));
            agent.sample_now();
            loop {
                let event = events.recv().await.unwrap();
                if event.kind == wanted {
                    break;
                }
            }
            let took = started.elapsed().as_secs_f64() * 1000.0;
            if busy { &mut fire } else { &mut release }.push(took);

            // The baseline: a sample's way to the graph's announcement.
            while graph.try_recv().is_ok() {}
            let started = Instant::now();
            agent.sample_now();
            loop {
                if let GraphEvent::Telemetry { .. } = graph.recv().await.unwrap() {
                    break;
                }
            }
            transport.push(started.elapsed().as_secs_f64() * 1000.0);
        }
        println!("reflex reaction in one process ({rounds} fires and releases; 2 tokio workers)");
        let base = say("sample → graph (transport baseline)", transport);
        let fired = say("sample → fire event recorded", fire);
        let released = say("sample → release event recorded", release);
        println!(
            "p50 ratios to the baseline: fire {:.2}x, release {:.2}x",
            fired / base,
            released / base
        );
    });
}
