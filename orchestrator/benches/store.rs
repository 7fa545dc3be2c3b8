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
//! several rounds, and the ratio. Each round runs in a process of its own: a wedged
//! baseline leaves sled's shared I/O threads blocked, which would stall every later
//! round of the same process.
//!
//! `cargo bench -p skein-orchestrator --bench store` (`-- --quick` for one short round;
//! `-- --soak SECONDS` runs only the new path with 64 clients for that long and reports
//! per-10-second figures and any stall).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use skein_orchestrator::session::{LogConfig, NewMessage, Role, SessionLog, SledSessions};
use skein_orchestrator::store::{Db, Tree, WriteBatch};

mod durable;

use durable::{Round, median, session};

const RECORD_BYTES: usize = 2048;

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
    Round::of(latencies, started.elapsed(), db.health().stalled)
}

/// The path before: every writer inserts and flushes with `flush_async` itself. Watched
/// from this thread with std sleeps: when it wedges, sled's blocking calls may hold every
/// runtime worker (and so the runtime's timers).
fn baseline_round(runtime: &tokio::runtime::Runtime, clients: usize, duration: Duration) -> Round {
    let dir = tempfile::tempdir().expect("temp dir");
    let db = sled::Config::new()
        .path(dir.path())
        .cache_capacity(64 << 20)
        .open()
        .expect("sled");
    let runs = db.open_tree("runs").expect("tree");
    let keys = db.open_tree("run_keys").expect("tree");
    let record = "x".repeat(RECORD_BYTES).into_bytes();
    let latencies = Arc::new(std::sync::Mutex::new(Vec::new()));
    let done = Arc::new(AtomicU64::new(0));
    let finished = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    for client in 0..clients {
        let (db, runs, keys, record) = (db.clone(), runs.clone(), keys.clone(), record.clone());
        let (latencies, done, finished) = (Arc::clone(&latencies), Arc::clone(&done), Arc::clone(&finished));
        runtime.spawn(async move {
            let mut n = 0u64;
            while started.elapsed() < duration {
                let at = Instant::now();
                let key = format!("{client:03}-{n:08}");
                runs.insert(key.as_bytes(), record.clone()).expect("insert");
                if n % 3 == 1 {
                    keys.insert(key.as_bytes(), key.as_bytes()).expect("insert");
                }
                db.flush_async().await.expect("flush");
                latencies.lock().expect("latencies").push(at.elapsed());
                done.fetch_add(1, Ordering::Relaxed);
                n += 1;
            }
            finished.fetch_add(1, Ordering::Relaxed);
        });
    }
    // No write done for two seconds is a stall.
    let mut last = (0, Instant::now());
    let mut stalled = false;
    while finished.load(Ordering::Relaxed) < clients as u64 {
        std::thread::sleep(Duration::from_millis(100));
        let now = done.load(Ordering::Relaxed);
        if now != last.0 {
            last = (now, Instant::now());
        } else if last.1.elapsed() > Duration::from_secs(2) {
            stalled = true;
            break;
        }
    }
    let elapsed = started.elapsed().min(duration);
    let latencies = latencies.lock().expect("latencies").clone();
    if stalled {
        // The writers stay blocked in sled; the process exits without them.
        std::mem::forget(db);
        std::mem::forget(dir);
    }
    Round::of(latencies, elapsed, stalled)
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

/// Runs one round in a child process (this program with `--round PATH CLIENTS MS`):
/// a stalled baseline cannot leak into the next round.
fn isolated(path: &str, clients: usize, duration: Duration) -> Round {
    let stalled = Round {
        per_second: 0.0,
        p50_ms: f64::NAN,
        p99_ms: f64::NAN,
        stalled: true,
    };
    let Ok(exe) = std::env::current_exe() else {
        return stalled;
    };
    let output = std::process::Command::new("timeout")
        .arg(format!("{}", duration.as_secs() + 30))
        .arg(exe)
        .args(["--round", path, &clients.to_string(), &duration.as_millis().to_string()])
        .output();
    let Ok(output) = output else {
        return stalled;
    };
    let text = String::from_utf8_lossy(&output.stdout);
    let Some(line) = text.lines().find_map(|l| l.strip_prefix("ROUND ")) else {
        return stalled;
    };
    let fields: Vec<f64> = line.split(' ').filter_map(|f| f.parse().ok()).collect();
    match fields.as_slice() {
        [per_second, p50_ms, p99_ms, stalled] => Round {
            per_second: *per_second,
            p50_ms: *p50_ms,
            p99_ms: *p99_ms,
            stalled: *stalled != 0.0,
        },
        _ => stalled,
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let quick = args.iter().any(|a| a == "--quick");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    if let Some(at) = args.iter().position(|a| a == "--round") {
        let path = args.get(at + 1).map(String::as_str).unwrap_or("writer");
        let clients = args.get(at + 2).and_then(|s| s.parse().ok()).unwrap_or(16);
        let duration = Duration::from_millis(args.get(at + 3).and_then(|s| s.parse().ok()).unwrap_or(1000));
        let r = match path {
            "baseline" => baseline_round(&runtime, clients, duration),
            _ => runtime.block_on(writer_round(clients, duration)),
        };
        println!(
            "ROUND {} {} {} {}",
            r.per_second,
            r.p50_ms,
            r.p99_ms,
            u8::from(r.stalled)
        );
        // A stalled baseline's writers stay blocked in sled: leave without them.
        std::process::exit(0);
    }
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
            writer.push(isolated("writer", clients, duration));
            baseline.push(isolated("baseline", clients, duration));
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
