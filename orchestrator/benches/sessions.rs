//! Durable session appends: group commit against a flush per write.
//!
//! `CLIENTS` concurrent clients each append 1 KB messages (with idempotency keys) to
//! their own session through the real [`SessionLog`] over sled on disk, for a fixed
//! time; every append is answered only once flushed. The baseline is the same writer
//! with a batch of one (one flush per write). Printed: appends per second and the
//! latency percentiles of one append, for each, and their ratio. Several rounds; the
//! median round is reported.
//!
//! `cargo bench -p skein-orchestrator --bench sessions` (`-- --quick` for one short round).

use std::sync::Arc;
use std::time::{Duration, Instant};

use skein_orchestrator::session::{LogConfig, NewMessage, Role, SessionLog, SledSessions};

mod durable;

use durable::{Round, median, session};

const CLIENTS: usize = 64;
const MESSAGE_BYTES: usize = 1024;

async fn round(max_batch: usize, duration: Duration) -> Round {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = Arc::new(SledSessions::open_dir(dir.path()).expect("store"));
    let log = SessionLog::start(store, LogConfig { max_batch }).expect("writer");
    for client in 0..CLIENTS {
        log.create(session(&format!("s{client:03}"))).await.expect("session");
    }
    let content = "x".repeat(MESSAGE_BYTES);
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for client in 0..CLIENTS {
        let log = log.clone();
        let content = content.clone();
        tasks.spawn(async move {
            let id = format!("s{client:03}");
            let mut latencies = Vec::new();
            let mut n = 0u64;
            while started.elapsed() < duration {
                let at = Instant::now();
                log.append(
                    &id,
                    vec![NewMessage::new(Role::User, content.clone())],
                    Some(format!("k{n}")),
                )
                .await
                .expect("append");
                latencies.push(at.elapsed());
                n += 1;
            }
            latencies
        });
    }
    let mut latencies = Vec::new();
    while let Some(done) = tasks.join_next().await {
        latencies.extend(done.expect("client"));
    }
    Round::of(latencies, started.elapsed(), false)
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let (rounds, duration) = if quick {
        (1, Duration::from_secs(1))
    } else {
        (5, Duration::from_secs(4))
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let mut group = Vec::new();
    let mut single = Vec::new();
    for _ in 0..rounds {
        // Interleaved, so both see the same machine.
        group.push(runtime.block_on(round(skein_orchestrator::session::log::MAX_BATCH, duration)));
        single.push(runtime.block_on(round(1, duration)));
    }
    let (group, single) = (median(group), median(single));
    println!(
        "durable appends of {MESSAGE_BYTES} B, {CLIENTS} concurrent clients, median of {rounds} rounds of {duration:?}"
    );
    println!("{:<28} {:>12} {:>10} {:>10}", "", "appends/s", "p50 ms", "p99 ms");
    for (name, r) in [("group commit", &group), ("flush per write (baseline)", &single)] {
        println!(
            "{name:<28} {:>12.0} {:>10.2} {:>10.2}",
            r.per_second, r.p50_ms, r.p99_ms
        );
    }
    println!(
        "ratio: {:.1}x the baseline's appends/s",
        group.per_second / single.per_second
    );
}
