//! Telemetry ingestion into the hardware graph from 1,000 simulated nodes × 8 GPUs, and
//! snapshot latency under that load.
//!
//! - `ingest`: one telemetry batch (8 GPU samples) per call into a graph of 1,000 nodes,
//!   against a baseline in the same run: copying the same 8 samples into a window
//!   without the graph (the data movement ingestion cannot avoid).
//! - `snapshot`: taking a snapshot of the 1,000-node graph.
//! - Under load (printed, not a criterion figure): one thread ingests 100,000 GPU
//!   samples/s (the goal's load), then as fast as it can, while the main thread takes a
//!   snapshot every millisecond; prints the rate reached and the snapshot p50/p99/max.
//!
//! Run: `cargo bench -p skein-orchestrator --bench graph -- --warm-up-time 1 --measurement-time 4`

use std::collections::VecDeque;
use std::hint::black_box;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use skein_orchestrator::graph::{
    GpuFacts, GpuSample, GraphConfig, HardwareGraph, HostFacts, IndexedSample, NodeId, NodeInventory, TelemetryBatch,
};

const NODES: usize = 1000;
const GPUS: u32 = 8;

fn inventory(n: usize) -> NodeInventory {
    NodeInventory {
        name: format!("node-{n:04}"),
        agent_version: "bench".to_owned(),
        gpu_source: "simulated".to_owned(),
        host: HostFacts::default(),
        gpus: (0..GPUS)
            .map(|index| GpuFacts {
                index,
                uuid: format!("GPU-{n:04}-{index}"),
                name: "NVIDIA GeForce RTX 4090".to_owned(),
                memory_total: 24 << 30,
                compute_capability: Some((8, 9)),
                power_limit_mw: Some(450_000),
                pcie: Some((4, 16)),
                nvlink_peers: Vec::new(),
                mig_enabled: Some(false),
                simulated: true,
            })
            .collect(),
        labels: Default::default(),
    }
}

fn sample(seq: u64, index: u32) -> GpuSample {
    GpuSample {
        received_ms: 0,
        unix_ms: seq as i64,
        memory_used: (seq % 24) << 30,
        memory_free: (24 - seq % 24) << 30,
        utilization_pct: Some((seq % 100) as u32),
        memory_utilization_pct: Some(index),
        temperature_c: Some(40 + (seq % 40) as i32),
        power_mw: Some(100_000),
        sm_clock_mhz: Some(2520),
        throttle_reasons: 0,
        ecc_corrected: None,
        ecc_uncorrected: None,
        foreign_memory: None,
    }
}

fn batch(seq: u64) -> TelemetryBatch {
    TelemetryBatch {
        seq,
        gpus: (0..GPUS)
            .map(|index| IndexedSample {
                index,
                sample: sample(seq, index),
            })
            .collect(),
        host: None,
    }
}

fn fleet() -> (Arc<HardwareGraph>, Vec<NodeId>) {
    let graph = Arc::new(HardwareGraph::new(GraphConfig::default()));
    let ids = (0..NODES).map(|n| graph.register(inventory(n), 0).0.id).collect();
    (graph, ids)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn graph_benches(c: &mut Criterion) {
    let (graph, ids) = fleet();
    let mut seq = 0u64;
    let mut group = c.benchmark_group("hardware graph, 1000 nodes × 8 GPUs");
    group.bench_function("copy 8 samples into a window (baseline)", |b| {
        let mut windows: Vec<VecDeque<GpuSample>> = vec![VecDeque::with_capacity(120); GPUS as usize];
        b.iter(|| {
            seq += 1;
            let batch = batch(seq);
            for s in batch.gpus {
                let w = &mut windows[s.index as usize];
                if w.len() == 120 {
                    w.pop_front();
                }
                w.push_back(black_box(s.sample));
            }
        })
    });
    group.bench_function("ingest one batch of 8 samples", |b| {
        b.iter(|| {
            seq += 1;
            let id = &ids[(seq as usize) % NODES];
            black_box(graph.ingest(id, batch(seq), seq).expect("ingests"));
        })
    });
    group.bench_function("snapshot", |b| b.iter(|| black_box(graph.snapshot())));
    group.finish();

    // Under load: a writer thread ingests (at the goal's rate, then flat out) while
    // this thread takes snapshots.
    under_load(&graph, &ids, Some(100_000));
    under_load(&graph, &ids, None);
}

/// Ingests `rate` GPU samples per second (as fast as possible for `None`) on another
/// thread for 5 s, taking a snapshot every millisecond here; prints the rate reached
/// and the snapshot latency percentiles.
fn under_load(graph: &Arc<HardwareGraph>, ids: &[NodeId], rate: Option<u64>) {
    let stop = Arc::new(AtomicBool::new(false));
    let ingested = Arc::new(AtomicU64::new(0));
    let writer = {
        let (graph, ids, stop, ingested) = (
            Arc::clone(graph),
            ids.to_vec(),
            Arc::clone(&stop),
            Arc::clone(&ingested),
        );
        std::thread::spawn(move || {
            let start = Instant::now();
            let mut seq = 1_000_000u64;
            while !stop.load(Ordering::Relaxed) {
                if let Some(rate) = rate {
                    // Pace: sleep while ahead of schedule.
                    let due = ingested.load(Ordering::Relaxed) as f64 / rate as f64;
                    let ahead = due - start.elapsed().as_secs_f64();
                    if ahead > 0.0 {
                        std::thread::sleep(Duration::from_secs_f64(ahead.min(0.01)));
                        continue;
                    }
                }
                seq += 1;
                graph
                    .ingest(&ids[(seq as usize) % NODES], batch(seq), seq)
                    .expect("ingests");
                ingested.fetch_add(u64::from(GPUS), Ordering::Relaxed);
            }
        })
    };
    let start = Instant::now();
    let mut latencies = Vec::new();
    while start.elapsed() < Duration::from_secs(5) {
        let t = Instant::now();
        black_box(graph.snapshot());
        latencies.push(t.elapsed());
        std::thread::sleep(Duration::from_millis(1));
    }
    stop.store(true, Ordering::Relaxed);
    writer.join().expect("the writer ends");
    let achieved = ingested.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64();
    latencies.sort();
    let target = rate.map_or("flat out".to_owned(), |r| format!("paced at {r}/s"));
    println!(
        "under load ({target}): {achieved:.0} GPU samples/s ingested while taking {} snapshots: \
         p50 {:?}, p99 {:?}, max {:?}",
        latencies.len(),
        percentile(&latencies, 0.5),
        percentile(&latencies, 0.99),
        latencies.last().copied().unwrap_or_default()
    );
}

criterion_group!(benches, graph_benches);
criterion_main!(benches);
