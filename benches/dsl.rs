//! Workflow language costs: reading the reference workflow in YAML and in
//! Rhai, evaluating a reflex condition, and how long the sandbox takes to
//! stop an endless loop or a runaway allocation — each against a baseline
//! measured in the same run (see docs/PERFORMANCE.md).

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use skein_dsl::expr::{Bindings, Context, Evaluator, Value};

const LAB_YAML: &str = include_str!("../workflows/lab-research.yaml");
const LAB_RHAI: &str = include_str!("../workflows/lab-research.rhai");

fn front_ends(c: &mut Criterion) {
    let mut g = c.benchmark_group("parse");
    g.bench_function("lab-research.yaml", |b| {
        b.iter(|| skein_dsl::parse("lab-research.yaml", black_box(LAB_YAML)))
    });
    g.bench_function("lab-research.rhai", |b| {
        b.iter(|| skein_dsl::parse("lab-research.rhai", black_box(LAB_RHAI)))
    });
    g.finish();
}

fn sandbox_stops(c: &mut Criterion) {
    let ev = Evaluator::default();
    let vars = Bindings::from([("gpu".to_owned(), Value::map([("util", Value::Float(0.9))]))]);
    let condition = ev.compile("gpu.util > 0.8", Context::Reflex).expect("compiles");
    let endless = ev.compile("loop { }", Context::Reflex).expect("compiles");
    let huge = ev
        .compile(r#"let s = "x"; loop { s += s; }"#, Context::Reflex)
        .expect("compiles");

    let mut g = c.benchmark_group("expr");
    g.bench_function("condition (baseline)", |b| {
        b.iter(|| ev.eval_bool(&condition, black_box(&vars)))
    });
    g.bench_function("endless loop until stopped", |b| {
        b.iter(|| ev.eval(&endless, black_box(&vars)).expect_err("stopped"))
    });
    g.bench_function("doubling string until stopped", |b| {
        b.iter(|| ev.eval(&huge, black_box(&vars)).expect_err("stopped"))
    });
    g.finish();

    let mut g = c.benchmark_group("script");
    g.sample_size(10);
    g.bench_function("endless loop until stopped", |b| {
        b.iter(|| skein_dsl::parse("w.rhai", black_box("workflow(\"w\");\nloop { }\n")))
    });
    g.finish();
}

criterion_group!(benches, front_ends, sandbox_stops);
criterion_main!(benches);
