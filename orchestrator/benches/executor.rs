//! Executor overhead per step: a run of 20 sequential steps through a real server
//! (admission, instance start, every step written and flushed to sled, prompts rendered,
//! outputs passed along) against the same 20 chat requests sent straight to the engine.
//! The engine is an in-process fake answering at once, so the difference is the
//! executor's own cost. Also printed: submit-to-first-step latency with a warm instance
//! (after the first iteration, every run reuses the instance the first one started),
//! from the submission to the first step's start.

#[path = "../tests/common/mod.rs"]
mod common;

use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use serde_json::{Value, json};
use skein_orchestrator::run::ExecutorConfig;
use skein_testkit::agent::{EngineBehaviour, TestAgent, fake_engine};

const STEPS: usize = 20;

fn workflow() -> String {
    let mut text = String::from(
        "name: chain\nagents:\n  a: { model: Qwen/Qwen2.5-0.5B-Instruct }\nsteps:\n  - { id: s0, agent: a, prompt: \"go\" }\n",
    );
    for i in 1..STEPS {
        text.push_str(&format!(
            "  - {{ id: s{i}, agent: a, after: [s{}], prompt: \"next {{{{ steps.s{}.output.len() }}}}\" }}\n",
            i - 1,
            i - 1
        ));
    }
    text
}

fn bench(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (setup, _agent) = runtime.block_on(async {
        let setup = common::setup(
            ExecutorConfig {
                admission_interval: Duration::from_millis(100),
                ..ExecutorConfig::default()
            },
            None,
        )
        .await;
        let agent = TestAgent::join(
            setup.server.grpc_addr,
            common::TOKEN,
            "box",
            2,
            EngineBehaviour::default(),
        )
        .await;
        // Let the node's telemetry arrive so the first plan places.
        tokio::time::sleep(Duration::from_millis(500)).await;
        (setup, agent)
    });
    let server = &setup.server;
    let http = reqwest::Client::new();
    let base = format!("http://{}", server.api_addr);
    let text = workflow();
    let run_once = |first_step: &mut Vec<Duration>| {
        runtime.block_on(async {
            let submitted = Instant::now();
            let run: Value = http
                .post(format!("{base}/v1/runs"))
                .bearer_auth(common::API)
                .json(&json!({"workflow": text}))
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            let id = run["id"].as_str().unwrap().to_owned();
            let mut changes = server.executor.subscribe();
            let mut seen_first = false;
            loop {
                let run = server.executor.get(&id).unwrap().unwrap();
                if !seen_first && run.steps[0].started_at.is_some() {
                    first_step.push(submitted.elapsed());
                    seen_first = true;
                }
                if run.state.is_final() {
                    assert_eq!(run.state.name(), "succeeded");
                    break;
                }
                let _ = changes.changed().await;
            }
        })
    };
    let mut first_step = Vec::new();
    let mut group = c.benchmark_group("executor");
    group.sample_size(10);
    group.bench_function("run of 20 steps (warm instance)", |b| {
        b.iter(|| run_once(&mut first_step))
    });
    // The baseline: the same 20 requests straight to an engine like the run's.
    let engine = runtime.block_on(fake_engine(EngineBehaviour::default(), &Default::default()));
    group.bench_function("20 direct chat requests (baseline)", |b| {
        b.iter(|| {
            runtime.block_on(async {
                for i in 0..STEPS {
                    let body = json!({"model": "m", "messages": [{"role": "user", "content": format!("next {i}")}]});
                    let answer: Value = http
                        .post(format!("{engine}/chat/completions"))
                        .json(&body)
                        .send()
                        .await
                        .unwrap()
                        .json()
                        .await
                        .unwrap();
                    assert!(answer["choices"][0]["message"]["content"].is_string());
                }
            })
        })
    });
    group.finish();
    first_step.sort();
    if let Some(median) = first_step.get(first_step.len() / 2) {
        println!(
            "submit to first step start (median of {}): {median:?}",
            first_step.len()
        );
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
