//! Mixed durable writes through the database's one writer, against the write path it
//! replaced, at 16 and 64 concurrent clients.
//!
//! Each client loops over a mix of durable writes for a fixed time: a 2 KB record
//! (`Tree::put`, as a run's record), a record and its idempotency key in two trees in
//! one atomic write (`Db::commit`, as a submission), and a session turn through the
//! session writer ([`SessionLog::append`], itself committing through the database's
//! writer). Every write is answered only once flushed. The baseline is the path before:
//! every writer inserts and calls sled's `flush_async` itself; it is watched, and a round
//! in which no baseline write completes for two seconds is reported as stalled (sled
//! 0.34 wedges under concurrent `flush_async`).
//!
//! Printed: writes per second and latency percentiles of one write, the median of
//! several rounds, and the ratio.
//!
//! `cargo bench -p skein-orchestrator --bench store` (`-- --quick` for one short round;
//! `-- --soak SECONDS` runs only the new path with 64 clients for that long and reports
//! per-10-second figures and any stall).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use skein_dsl::ir::{Agent, Backend, Endpoint};
use skein_orchestrator::run::executor::unix_ms;
use skein_orchestrator::session::{LogConfig, NewMessage, Role, SessionLog, SessionRecord, SledSessions};
use skein_orchestrator::store::{Db, Tree, WriteBatch};

const RECORD_BYTES: usize = 2048;

struct Round {
    per_second: f64,
    p50_ms: f64,
    p99_ms: f64,
    stalled: bool,
}

fn session(id: &str) -> SessionRecord {
    SessionRecord {
        id: id.to_owned(),
        owner: "bench".to_owned(),
        agent: "a".to_owned(),
        run: None,
        definition: Agent {
            backend: Backend::Endpoint(Endpoint {
                url: "http://127.0.0.1:1/v1".to_owned(),
                model: "m".to_owned(),
                api_key_env: None,
            }),
            system: None,
            temperature: None,
            max_tokens: None,
        },
        binding: None,
        metadata: Default::default(),
        created_at: unix_ms(),
        updated_at: unix_ms(),
        messages: 0,
        migrations: 0,
    }
}

fn summarize(mut latencies: Vec<Duration>, elapsed: Duration, stalled: bool) -> Round {
    latencies.sort();
    let at = |q: f64| {
        latencies
            .get(((latencies.len() as f64 * q) as usize).min(latencies.len().saturating_sub(1)))
            .map_or(f64::NAN, |d| d.as_secs_f64() * 1e3)
    };
    Round {
        per_second: latencies.len() as f64 / elapsed.as_secs_f64(),
        p50_ms: at(0.50),
        p99_ms: at(0.99),
        stalled,
    }
}

/// The mix through the one writer.
async fn writer_round(clients: usize, duration: Duration) -> Round {
    let dir = tempfile::tempdir().expect("temp dir");
    let db = Db::open(dir.path()).expect("db");
    let runs: Tree<String> = db.tree("runs").expect("tree");
    let keys: Tree<String> = db.tree("run_keys").expect("tree");
    let store = Arc::new(SledSessions::open(&db).expect("sessions"));
    let log = SessionLog::start(store, LogConfig::default()).expect("session writer");
    for client in 0..clients {
        log.create(session(&format!("s{client:03}"))).await.expect("session");
    }
    let record = "x".repeat(RECORD_BYTES);
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for client in 0..clients {
        let (db, runs, keys, log, record) = (db.clone(), runs.clone(), keys.clone(), log.clone(), record.clone());
        tasks.spawn(async move {
            let id = format!("s{client:03}");
            let mut latencies = Vec::new();
            let mut n = 0u64;
            while started.elapsed() < duration {
                let at = Instant::now();
                let key = format!("{client:03}-{n:08}");
                match n % 3 {
                    0 => runs.put(&key, &record).await.expect("put"),
                    1 => {
                        let mut batch = WriteBatch::new();
                        batch.put(&runs, &key, &record).put(&keys, &key, &key);
                        db.commit(batch).await.expect("commit");
                    }
                    _ => {
                        log.append(&id, vec![NewMessage::new(Role::User, record.clone())], Some(key))
                            .await
                            .expect("append");
                    }
                }
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
    summarize(latencies, started.elapsed(), db.health().stalled)
}

/// The path before: every writer inserts and flushes with `flush_async` itself.
async fn baseline_round(clients: usize, duration: Duration) -> Round {
    let dir = tempfile::tempdir().expect("temp dir");
    let db = sled::Config::new()
        .path(dir.path())
        .cache_capacity(64 << 20)
        .open()
        .expect("sled");
    let runs = db.open_tree("runs").expect("tree");
    let keys = db.open_tree("run_keys").expect("tree");
    let record = "x".repeat(RECORD_BYTES).into_bytes();
    let done = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for client in 0..clients {
        let (db, runs, keys, record, done) = (
            db.clone(),
            runs.clone(),
            keys.clone(),
            record.clone(),
            Arc::clone(&done),
        );
        tasks.spawn(async move {
            let mut latencies = Vec::new();
            let mut n = 0u64;
            while started.elapsed() < duration {
                let at = Instant::now();
                let key = format!("{client:03}-{n:08}");
                runs.insert(key.as_bytes(), record.clone()).expect("insert");
                if n % 3 == 1 {
                    keys.insert(key.as_bytes(), key.as_bytes()).expect("insert");
                }
                db.flush_async().await.expect("flush");
                latencies.push(at.elapsed());
                done.fetch_add(1, Ordering::Relaxed);
                n += 1;
            }
            latencies
        });
    }
    // The watch: no write done for two seconds is a stall; its writers are abandoned
    // (their threads stay blocked in sled until the process exits).
    let mut last = (0, Instant::now());
    let mut stalled = false;
    while !tasks.is_empty() && started.elapsed() < duration + Duration::from_secs(5) {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let now = done.load(Ordering::Relaxed);
        if now != last.0 {
            last = (now, Instant::now());
        } else if last.1.elapsed() > Duration::from_secs(2) && started.elapsed() < duration {
            stalled = true;
            break;
        }
        while let Some(finished) = tasks.try_join_next() {
            finished.expect("client");
        }
        if started.elapsed() >= duration && tasks.is_empty() {
            break;
        }
    }
    let elapsed = started.elapsed().min(duration);
    let latencies: Vec<Duration> = if stalled || !tasks.is_empty() {
        stalled = true;
        tasks.abort_all();
        // Only the count is known of a stalled round: as many "latencies" of the round.
        vec![duration; usize::try_from(done.load(Ordering::Relaxed)).unwrap_or(0)]
    } else {
        Vec::new()
    };
    if stalled {
        std::mem::forget(db);
        return summarize(latencies, elapsed, true);
    }
    let mut all = Vec::new();
    while let Some(finished) = tasks.join_next().await {
        all.extend(finished.expect("client"));
    }
    summarize(all, elapsed, false)
}

fn median(mut rounds: Vec<Round>) -> Round {
    rounds.sort_by(|a, b| a.per_second.total_cmp(&b.per_second));
    rounds.swap_remove(rounds.len() / 2)
}

fn soak(runtime: &tokio::runtime::Runtime, seconds: u64) {
    println!("soak: 64 clients, mixed durable writes, {seconds} s, figures per 10 s");
    println!(
        "{:>6} {:>10} {:>10} {:>10} {:>8}",
        "at s", "writes/s", "p50 ms", "p99 ms", "stalled"
    );
    let mut stalls = 0;
    for window in 0..seconds.div_ceil(10) {
        let r = runtime.block_on(writer_round(64, Duration::from_secs(10)));
        stalls += u32::from(r.stalled);
        println!(
            "{:>6} {:>10.0} {:>10.2} {:>10.2} {:>8}",
            (window + 1) * 10,
            r.per_second,
            r.p50_ms,
            r.p99_ms,
            r.stalled
        );
    }
    println!("windows stalled: {stalls}");
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let quick = args.iter().any(|a| a == "--quick");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    if let Some(seconds) = args
        .iter()
        .position(|a| a == "--soak")
        .and_then(|at| args.get(at + 1))
        .and_then(|s| s.parse().ok())
    {
        return soak(&runtime, seconds);
    }
    let (rounds, duration) = if quick {
        (1, Duration::from_secs(1))
    } else {
        (5, Duration::from_secs(4))
    };
    println!("mixed durable writes ({RECORD_BYTES} B records), median of {rounds} rounds of {duration:?}");
    println!(
        "{:<8} {:<34} {:>10} {:>9} {:>9} {:>8}",
        "clients", "path", "writes/s", "p50 ms", "p99 ms", "stalled"
    );
    for clients in [16, 64] {
        let mut writer = Vec::new();
        let mut baseline = Vec::new();
        for _ in 0..rounds {
            // Interleaved, so both see the same machine.
            writer.push(runtime.block_on(writer_round(clients, duration)));
            baseline.push(runtime.block_on(baseline_round(clients, duration)));
        }
        let stalled_rounds = baseline.iter().filter(|r| r.stalled).count();
        let (writer, baseline) = (median(writer), median(baseline));
        for (name, r) in [
            ("one writer, group commit", &writer),
            ("flush_async per write (before)", &baseline),
        ] {
            println!(
                "{clients:<8} {name:<34} {:>10.0} {:>9.2} {:>9.2} {:>8}",
                r.per_second, r.p50_ms, r.p99_ms, r.stalled
            );
        }
        println!(
            "{clients:<8} ratio {:.1}x the baseline's writes/s; baseline stalled in {stalled_rounds} of {rounds} rounds",
            writer.per_second / baseline.per_second
        );
    }
}
