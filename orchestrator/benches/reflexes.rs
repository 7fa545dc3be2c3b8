//! The reflex engine's cost per telemetry sample: 1 000 reflexes over 10 000 GPUs
//! (1 250 nodes of 8; each reflex watches the 10 GPUs of its agent's instances), against
//! a baseline that scans every reflex's scope for each sample (what an engine without
//! the index would do), in the same run; and the in-process reaction time, the time from
//! the sample that makes a condition true to the engine's decision.
//!
//! `cargo bench -p skein-orchestrator --bench reflexes` (`-- --quick` for a short run).

use std::time::Instant;

use skein_dsl::expr::{Bindings, Compiled, Context, Evaluator, Value};
use skein_orchestrator::reflex::{DecisionKind, Engine, GpuKey, GpuReading};

const REFLEXES: usize = 1_000;
const GPUS_PER_REFLEX: usize = 10;
const GPUS_PER_NODE: usize = 8;

fn gpu(i: usize) -> GpuKey {
    GpuKey::new(format!("node-{}", i / GPUS_PER_NODE), (i % GPUS_PER_NODE) as u32)
}

/// A load that crosses the threshold now and then: busy for 3 of every 40 samples of
/// each GPU.
fn reading(round: usize, i: usize) -> GpuReading {
    let busy = (round + i) % 40 < 3;
    GpuReading {
        util: if busy { 0.95 } else { 0.4 },
        temp: 60.0 + (i % 20) as f64,
        ..GpuReading::default()
    }
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let (rounds, repeats) = if quick { (4, 3) } else { (20, 5) };
    let gpus = REFLEXES * GPUS_PER_REFLEX;
    let text = "name: w\nagents:\n  a: { model: Qwen/Qwen2.5-0.5B-Instruct }\nsteps:\n  - { id: s, agent: a, prompt: hi }\nreflexes:\n  - name: hot\n    when: 'gpu.util > 0.8 && gpu.temp < 90'\n    for: 0s\n    scope: { agent: a }\n    do: [ { clone: 1 } ]\n    cooldown: 1s\n";
    let parsed = skein_dsl::parse("w.yaml", text);
    let reflex = parsed.workflow.expect("the bench's workflow is valid").reflexes[0].clone();

    let mut engine = Engine::default();
    for r in 0..REFLEXES {
        let id = engine.add(&format!("run-{r}"), &reflex).unwrap();
        let scope: Vec<GpuKey> = (r * GPUS_PER_REFLEX..(r + 1) * GPUS_PER_REFLEX).map(gpu).collect();
        engine.set_scope(id, scope, Vec::new());
    }
    let keys: Vec<GpuKey> = (0..gpus).map(gpu).collect();

    // The baseline: every reflex's scope scanned for each sample, the condition of the
    // ones holding the GPU evaluated (no windows: less work than the engine does there).
    let evaluator = Evaluator::default();
    let scanned: Vec<(Vec<GpuKey>, Compiled)> = (0..REFLEXES)
        .map(|r| {
            let scope = (r * GPUS_PER_REFLEX..(r + 1) * GPUS_PER_REFLEX).map(gpu).collect();
            (scope, evaluator.compile_expr(&reflex.when, Context::Reflex).unwrap())
        })
        .collect();

    let mut clock = 0i64;
    let mut indexed = Vec::new();
    let mut batched = Vec::new();
    let mut baseline = Vec::new();
    let mut reactions = Vec::new();
    for _ in 0..repeats {
        // One sample at a time.
        let started = Instant::now();
        for round in 0..rounds {
            clock += 1_000;
            for (i, key) in keys.iter().enumerate() {
                let at = Instant::now();
                let decisions = engine.gpu_sample(key, reading(round, i), clock);
                if decisions.iter().any(|d| d.kind == DecisionKind::Fire) {
                    reactions.push(at.elapsed().as_secs_f64() * 1e6);
                }
            }
        }
        indexed.push((rounds * gpus) as f64 / started.elapsed().as_secs_f64());

        // A node's batch at a time (8 GPUs), as telemetry arrives.
        let started = Instant::now();
        for round in 0..rounds {
            clock += 1_000;
            for (n, chunk) in keys.chunks(GPUS_PER_NODE).enumerate() {
                let batch: Vec<(GpuKey, GpuReading)> = chunk
                    .iter()
                    .enumerate()
                    .map(|(j, key)| (key.clone(), reading(round, n * GPUS_PER_NODE + j)))
                    .collect();
                engine.gpu_batch(&batch, clock);
            }
        }
        batched.push((rounds * gpus) as f64 / started.elapsed().as_secs_f64());

        // The scan, on fewer rounds (it is slow); the rate is per sample all the same.
        let started = Instant::now();
        let scan_samples = gpus / 10;
        for (i, key) in keys.iter().take(scan_samples).enumerate() {
            let r = reading(0, i);
            for (scope, condition) in &scanned {
                if scope.contains(key) {
                    let gpu = Value::map([("util", Value::Float(r.util)), ("temp", Value::Float(r.temp))]);
                    let vars = Bindings::from([
                        ("gpu".to_owned(), gpu),
                        ("node".to_owned(), Value::Map(Default::default())),
                        ("agent".to_owned(), Value::Map(Default::default())),
                    ]);
                    let _ = evaluator.eval_bool(condition, &vars);
                }
            }
        }
        baseline.push(scan_samples as f64 / started.elapsed().as_secs_f64());
    }
    reactions.sort_by(f64::total_cmp);
    let p = |q: f64| reactions[((reactions.len() as f64 * q) as usize).min(reactions.len() - 1)];
    let (indexed, batched, baseline) = (median(indexed), median(batched), median(baseline));
    println!("{REFLEXES} reflexes over {gpus} GPUs, {repeats} repeats of {rounds} rounds (medians)");
    println!("indexed engine, one sample at a time: {indexed:>12.0} samples/s");
    println!("indexed engine, a node's batch:       {batched:>12.0} samples/s");
    println!("scan of every reflex (baseline):      {baseline:>12.0} samples/s");
    println!("indexed / scan: {:.0}x", indexed / baseline);
    println!(
        "reaction, sample to decision ({} firings): p50 {:.1} us, p99 {:.1} us",
        reactions.len(),
        p(0.5),
        p(0.99)
    );
}
