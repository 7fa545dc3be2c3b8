//! Cost of one `sample()` of an 8-GPU simulated node, against a baseline in the same
//! run: the same number of `f64::sin` calls as the node has modelled and derived
//! metrics (8 GPUs × 10 metrics). The goal: sampling 8 GPUs at 1 Hz costs at most 1 %
//! of a core, i.e. one sample takes at most 10 ms.
//!
//! Run with `cargo bench -p skein-agent --bench sampling`.

use std::hint::black_box;
use std::io;
use std::path::Path;

use criterion::{Criterion, criterion_group, criterion_main};
use skein_agent::GpuSource;
use skein_agent::fleet::parse_fleet;

/// Eight A100s with every kind of model, a replayed trace included.
const FLEET: &str = r#"
fleet: bench
nodes:
  hgx:
    gpus: { model: A100-80GB, count: 8, nvlink: all }
    telemetry:
      utilization: { square: { low: 0.05, high: 0.9, period: 30s, duty: 0.7 } }
      memory_used: { ramp: { from: 10GiB, to: 70GiB, over: 10m } }
      foreign_memory: { replay: { csv: trace.csv, column: foreign, loop: true } }
      per_gpu:
        3: { temperature: { spike: { base: 60, peak: 91, at: 60s, duration: 10s } } }
        5: { throttle: { spike: { base: none, peak: sync_boost, at: 5s, duration: 5s } } }
"#;

fn trace() -> String {
    let mut csv = String::from("time,foreign\n");
    for second in 0..3600 {
        csv.push_str(&format!("{second},{}\n", (second % 600) * 4));
    }
    csv
}

fn bench(c: &mut Criterion) {
    let trace = trace();
    let mut read = |_: &Path| -> io::Result<String> { Ok(trace.clone()) };
    let fleet = match parse_fleet("bench.yaml", FLEET, Path::new(""), &mut read) {
        Ok(fleet) => fleet,
        Err(error) => panic!("{error}"),
    };
    let mut source = match fleet.node("hgx") {
        Ok(source) => source,
        Err(error) => panic!("{error}"),
    };
    assert_eq!(source.inventory().len(), 8);

    let mut group = c.benchmark_group("sample_8_gpus");
    let mut t = 0.0f64;
    group.bench_function("simulated_node", |b| {
        b.iter(|| {
            t += 0.25;
            black_box(source.sample(black_box(t)))
        })
    });
    let mut x = 0.0f64;
    group.bench_function("baseline_80_sin", |b| {
        b.iter(|| {
            x += 0.25;
            let mut sum = 0.0;
            for i in 0..80 {
                sum += black_box(x + f64::from(i)).sin();
            }
            black_box(sum)
        })
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
