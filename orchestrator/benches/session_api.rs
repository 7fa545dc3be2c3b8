//! Sessions through the real server (REST on loopback, sled on disk, a test agent whose
//! engines answer at once), each against a baseline measured in the same run:
//!
//! - API overhead of a turn: `POST /v1/sessions/{id}/messages` (auth, the user message
//!   flushed, the history read, the engine called, the reply flushed) against the same
//!   chat request sent straight to the engine; latency at one client (p50, p99) and
//!   throughput with 32 clients on 32 sessions.
//! - Throughput with a fixed history: turns on sessions that each hold the same few
//!   messages, against the engine sent the same messages directly.
//! - Migration downtime: a session moved back and forth between two GPUs (both
//!   instances warm after the first moves), with 1 KB and with 10 MB of history; the
//!   downtime is the time new turns cannot start (the binding switch).
//!
//! `cargo bench -p skein-orchestrator --bench session_api` (`-- --quick` for a short run).

#[path = "../tests/common/mod.rs"]
mod common;

use std::time::{Duration, Instant};

use common::API as TOKEN;
use serde_json::{Value, json};
use skein_orchestrator::run::ExecutorConfig;
use skein_testkit::agent::{EngineBehaviour, TestAgent, fake_engine};
const MODEL: &str = "Qwen/Qwen2.5-0.5B-Instruct";

fn percentile(sorted: &[Duration], q: f64) -> f64 {
    let i = ((sorted.len() as f64 * q) as usize).min(sorted.len() - 1);
    sorted[i].as_secs_f64() * 1e3
}

async fn post(http: &reqwest::Client, url: &str, body: &Value) -> Value {
    let response = http.post(url).bearer_auth(TOKEN).json(body).send().await.unwrap();
    assert!(response.status().is_success(), "{url}: {}", response.status());
    response.json().await.unwrap()
}

async fn new_session(http: &reqwest::Client, base: &str) -> String {
    let session = post(http, &format!("{base}/v1/sessions"), &json!({"model": MODEL})).await;
    session["id"].as_str().unwrap().to_owned()
}

/// Latency of `n` sequential calls of `call`, sorted.
async fn latencies<F, Fut>(n: usize, mut call: F) -> Vec<Duration>
where
    F: FnMut(usize) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let mut all = Vec::with_capacity(n);
    for i in 0..n {
        let at = Instant::now();
        call(i).await;
        all.push(at.elapsed());
    }
    all.sort();
    all
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let (turns, seconds, moves): (usize, u64, u32) = if quick { (200, 1, 10) } else { (2000, 5, 60) };
    common::bench_runtime().block_on(async {
        let setup = common::setup(ExecutorConfig::default(), None).await;
        let server = &setup.server;
        let _agent = TestAgent::join(server.grpc_addr, common::TOKEN, "box", 2, EngineBehaviour::default()).await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        let http = reqwest::Client::new();
        let base = format!("http://{}", server.api_addr);

        // Warm: the instance is placed by the first turn.
        let warm = new_session(&http, &base).await;
        post(&http, &format!("{base}/v1/sessions/{warm}/messages"), &json!({"content": "warm up"})).await;
        let engine = fake_engine(EngineBehaviour::default(), &Default::default()).await;
        let direct_url = format!("{engine}/chat/completions");

        // Latency at one client: a fresh session per 50 turns keeps the history short,
        // as the direct request's is (sessions made before the clock starts).
        let mut fresh = Vec::new();
        for _ in 0..turns.div_ceil(50) {
            fresh.push(new_session(&http, &base).await);
        }
        let api = latencies(turns, |i| {
            let http = http.clone();
            let url = format!("{base}/v1/sessions/{}/messages", fresh[i / 50]);
            async move {
                post(&http, &url, &json!({"content": format!("turn {i}")})).await;
            }
        })
        .await;
        let openai_url = format!("{base}/v1/chat/completions");
        let stateless = latencies(turns, |i| {
            let http = http.clone();
            let url = openai_url.clone();
            async move {
                let body = json!({"model": MODEL, "messages": [{"role": "user", "content": format!("turn {i}")}]});
                post(&http, &url, &body).await;
            }
        })
        .await;
        let direct = latencies(turns, |i| {
            let http = http.clone();
            let url = direct_url.clone();
            async move {
                let body = json!({"model": "m", "messages": [{"role": "user", "content": format!("turn {i}")}]});
                post(&http, &url, &body).await;
            }
        })
        .await;

        // Throughput with 32 clients, each on its own session.
        let clients = 32;
        let mut ids = Vec::new();
        for _ in 0..clients {
            ids.push(new_session(&http, &base).await);
        }
        #[derive(Clone, Copy, PartialEq)]
        enum Via {
            Session,
            OpenAi,
            Engine,
        }
        let throughput = |via: Via| {
            let http = http.clone();
            let base = base.clone();
            let direct_url = direct_url.clone();
            let openai_url = openai_url.clone();
            let ids = ids.clone();
            async move {
                let started = Instant::now();
                let mut tasks = tokio::task::JoinSet::new();
                for id in ids {
                    let http = http.clone();
                    let url = match via {
                        Via::Engine => direct_url.clone(),
                        Via::OpenAi => openai_url.clone(),
                        Via::Session => format!("{base}/v1/sessions/{id}/messages"),
                    };
                    tasks.spawn(async move {
                        let mut n = 0u64;
                        while started.elapsed() < Duration::from_secs(seconds) {
                            let body = match via {
                                Via::Engine => json!({"model": "m", "messages": [{"role": "user", "content": "x"}]}),
                                Via::OpenAi => json!({"model": MODEL, "messages": [{"role": "user", "content": "x"}]}),
                                Via::Session => json!({"content": "x"}),
                            };
                            post(&http, &url, &body).await;
                            n += 1;
                        }
                        n
                    });
                }
                let mut total = 0;
                while let Some(n) = tasks.join_next().await {
                    total += n.unwrap();
                }
                total as f64 / started.elapsed().as_secs_f64()
            }
        };
        let api_rps = throughput(Via::Session).await;
        let openai_rps = throughput(Via::OpenAi).await;
        let direct_rps = throughput(Via::Engine).await;

        println!("turn latency, one client, {turns} turns (ms)");
        println!("{:<34} {:>8} {:>8}", "", "p50", "p99");
        println!("{:<34} {:>8.3} {:>8.3}", "POST /v1/sessions/{id}/messages", percentile(&api, 0.5), percentile(&api, 0.99));
        println!("{:<34} {:>8.3} {:>8.3}", "POST /v1/chat/completions", percentile(&stateless, 0.5), percentile(&stateless, 0.99));
        println!("{:<34} {:>8.3} {:>8.3}", "engine directly (baseline)", percentile(&direct, 0.5), percentile(&direct, 0.99));
        for (name, measured) in [("session turn", &api), ("OpenAI route", &stateless)] {
            println!(
                "overhead of a {name}: p50 {:.3} ms, p99 {:.3} ms",
                percentile(measured, 0.5) - percentile(&direct, 0.5),
                percentile(measured, 0.99) - percentile(&direct, 0.99)
            );
        }
        println!(
            "throughput, {clients} clients, {seconds} s: session turns {api_rps:.0}/s, OpenAI route {openai_rps:.0}/s, engine directly {direct_rps:.0}/s"
        );

        // Throughput with a fixed history: every turn goes to a session that holds
        // exactly HISTORY messages (each used once), against the engine sent the same
        // HISTORY + 1 messages directly; the conversations do not grow during the count.
        const HISTORY: usize = 8;
        let per_client = if quick { 10 } else { 100 };
        let filler: Vec<Value> = (0..HISTORY)
            .map(|i| json!({"role": "user", "content": format!("{i:02} {}", "h".repeat(125))}))
            .collect();
        let mut pools: Vec<Vec<String>> = Vec::new();
        for _ in 0..clients {
            let mut pool = Vec::new();
            for _ in 0..per_client {
                let id = new_session(&http, &base).await;
                let seeded = json!({"messages": filler, "reply": false});
                post(&http, &format!("{base}/v1/sessions/{id}/messages"), &seeded).await;
                pool.push(id);
            }
            pools.push(pool);
        }
        let fixed = |direct: bool| {
            let http = http.clone();
            let base = base.clone();
            let direct_url = direct_url.clone();
            let pools = pools.clone();
            let filler = filler.clone();
            async move {
                let started = Instant::now();
                let mut tasks = tokio::task::JoinSet::new();
                for pool in pools {
                    let http = http.clone();
                    let base = base.clone();
                    let direct_url = direct_url.clone();
                    let filler = filler.clone();
                    tasks.spawn(async move {
                        for id in &pool {
                            if direct {
                                let mut messages = filler.clone();
                                messages.push(json!({"role": "user", "content": "x"}));
                                post(&http, &direct_url, &json!({"model": "m", "messages": messages})).await;
                            } else {
                                post(&http, &format!("{base}/v1/sessions/{id}/messages"), &json!({"content": "x"})).await;
                            }
                        }
                        pool.len()
                    });
                }
                let mut total = 0;
                while let Some(n) = tasks.join_next().await {
                    total += n.unwrap();
                }
                total as f64 / started.elapsed().as_secs_f64()
            }
        };
        let fixed_direct = fixed(true).await;
        let fixed_api = fixed(false).await;
        println!(
            "throughput, {clients} clients, history fixed at {HISTORY} messages of 128 B ({} turns): session turns {fixed_api:.0}/s, engine directly {fixed_direct:.0}/s ({:.2}x)",
            clients * per_client,
            fixed_api / fixed_direct
        );

        // Migration downtime with a small and a large history.
        let mut rows = Vec::new();
        for (label, messages, size) in [("1 KB of history", 1, 1024), ("10 MB of history", 10, 1 << 20)] {
            let id = new_session(&http, &base).await;
            for i in 0..messages {
                let body = json!({"content": format!("{i} {}", "x".repeat(size)), "reply": false});
                post(&http, &format!("{base}/v1/sessions/{id}/messages"), &body).await;
            }
            let mut downtimes = Vec::new();
            for i in 0..moves {
                let to = json!({"to": {"node": "box", "gpu": i % 2}});
                let moved = post(&http, &format!("{base}/v1/sessions/{id}/migrate"), &to).await;
                // The first two moves start the instances; the rest move between warm ones.
                if i >= 2 {
                    downtimes.push(Duration::from_secs_f64(moved["downtime_ms"].as_f64().unwrap() / 1e3));
                }
            }
            downtimes.sort();
            rows.push((label, percentile(&downtimes, 0.5), percentile(&downtimes, 0.99)));
        }
        println!("migration downtime, {} moves between warm instances (ms)", moves - 2);
        println!("{:<20} {:>8} {:>8}", "", "p50", "p99");
        for (label, p50, p99) in &rows {
            println!("{label:<20} {p50:>8.3} {p99:>8.3}");
        }
        println!("10 MB / 1 KB at p50: {:.2}x", rows[1].1 / rows[0].1);
    });
}
