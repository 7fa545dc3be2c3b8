//! Fair-share admission order at lab scale: 1,000 users in 50 groups (each with shares
//! and decayed usage), 10,000 queued runs. Times one decision of the order the
//! admission pass walks, `Sharing::order` (every owner's standing, then the sort),
//! beside the order it replaced in the same run (the queue's own order: priority, then
//! age), and reserving one run against the runs limits (`Sharing::reserve_run`, the
//! check every submission makes), the tokens-per-minute check of every chat request
//! (`Sharing::check_tokens`) and the sessions check of a session create
//! (`Sharing::reserve_session`). Prints medians, p99s and the ratio.
//!
//! `cargo bench -p skein-orchestrator --bench admission`.

use std::cmp::Reverse;
use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use skein_orchestrator::base::unix_ms;
use skein_orchestrator::sharing::Sharing;
use skein_orchestrator::sharing::quota::Limits;
use skein_orchestrator::store::Db;

const USERS: usize = 1_000;
const GROUPS: usize = 50;
const QUEUED: usize = 10_000;

fn median(mut xs: Vec<Duration>) -> Duration {
    xs.sort();
    xs[xs.len() / 2]
}

fn percentile(mut xs: Vec<Duration>, p: f64) -> Duration {
    xs.sort();
    xs[((xs.len() - 1) as f64 * p) as usize]
}

fn main() {
    let quick = !std::env::args().any(|a| a == "--bench");
    let runs = if quick { 3 } else { 101 };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let db = Db::temporary().unwrap();
    let sharing = Sharing::open(&db, skein_orchestrator::sharing::fair::DEFAULT_HALF_LIFE).unwrap();
    // Limits every check below evaluates (and passes).
    let group_limits = Limits {
        runs: Some(1_000_000),
        tokens_per_minute: Some(1_000_000_000),
        sessions: Some(1_000_000),
        ..Limits::default()
    };
    runtime.block_on(async {
        for g in 0..GROUPS {
            let shares = 1 + (g as u32 * 7) % 5;
            sharing
                .set_group(&format!("g{g:02}"), Some(shares), &group_limits, &[])
                .await
                .unwrap();
        }
        for u in 0..USERS {
            let shares = 1 + (u as u32 * 3) % 4;
            sharing
                .set_user(
                    &format!("u{u:04}"),
                    Some(&format!("g{:02}", u % GROUPS)),
                    Some(shares),
                    &Limits::default(),
                    &[],
                )
                .await
                .unwrap();
        }
    });
    // 10,000 queued runs over the users and ten priorities.
    let mut queue: BTreeSet<(Reverse<i32>, String)> = BTreeSet::new();
    for r in 0..QUEUED {
        let id = format!("r{r:08}");
        sharing
            .reserve_run(&format!("u{:04}", (r * 7919) % USERS), &id)
            .unwrap();
        queue.insert((Reverse((r % 10) as i32), id));
    }
    // Everyone has used something, unevenly: usage to weigh.
    let now = unix_ms();
    for u in 0..USERS {
        sharing.charge(&format!("u{u:04}"), ((u * 2_654_435_761) % 10_000) as f64, now);
    }

    // One decision as the admission pass makes it: a snapshot of the queue, then its
    // order. Before fair share the snapshot was the order.
    let (mut fair, mut fifo) = (Vec::new(), Vec::new());
    for _ in 0..runs {
        let now = unix_ms();
        let started = Instant::now();
        let queued: Vec<(i32, String)> = queue.iter().map(|(p, id)| (p.0, id.clone())).collect();
        let order = sharing.order(&queued, now);
        fair.push(started.elapsed());
        assert_eq!(order.len(), QUEUED);
        let started = Instant::now();
        let order: Vec<String> = queue.iter().map(|(_, id)| id.clone()).collect();
        fifo.push(started.elapsed());
        assert_eq!(order.len(), QUEUED);
    }
    let (fair, fifo) = (median(fair), median(fifo));
    println!(
        "admission order of {QUEUED} queued runs, {USERS} users in {GROUPS} groups (median of {runs}): fair share {fair:?}, priority and age only {fifo:?}, ratio {:.1}",
        fair.as_secs_f64() / fifo.as_secs_f64()
    );

    // The check a submission makes: reserve and give back, against limits, with 10,000
    // runs in progress.
    let checks = if quick { 100 } else { 100_000 };
    let mut reserve = Vec::with_capacity(checks);
    for i in 0..checks {
        let user = format!("u{:04}", i % USERS);
        let started = Instant::now();
        let reserved = sharing.reserve_run(&user, "r-bench");
        reserve.push(started.elapsed());
        if reserved.is_ok() {
            sharing.release_run("r-bench");
        }
    }
    println!(
        "a submission's runs-limit check with {QUEUED} runs in progress ({checks} checks): median {:?}, p99 {:?}",
        median(reserve.clone()),
        percentile(reserve, 0.99)
    );

    // The checks a chat request and a session create make: the last minute's tokens of
    // the caller and their group (every user with 20 calls in the minute), and the
    // sessions limits (every user with 5 sessions).
    let now = unix_ms();
    for u in 0..USERS {
        let user = format!("u{u:04}");
        for c in 0..20 {
            let usage = skein_orchestrator::engine_client::Usage {
                prompt_tokens: 100,
                completion_tokens: 50,
            };
            let at = skein_orchestrator::base::UnixMs(now.0 - 1_000 * c);
            sharing.record_api_call(&user, "m", "a", Some(usage), at);
        }
        for _ in 0..5 {
            sharing.reserve_session(&user).unwrap();
        }
    }
    let (mut tokens, mut sessions) = (Vec::with_capacity(checks), Vec::with_capacity(checks));
    for i in 0..checks {
        let user = format!("u{:04}", i % USERS);
        let started = Instant::now();
        sharing.check_tokens(&user, now).unwrap();
        tokens.push(started.elapsed());
        let started = Instant::now();
        sharing.reserve_session(&user).unwrap();
        sessions.push(started.elapsed());
        sharing.release_session(&user);
    }
    println!(
        "a request's tokens-per-minute check ({checks} checks): median {:?}, p99 {:?}; a session create's sessions check: median {:?}, p99 {:?}",
        median(tokens.clone()),
        percentile(tokens, 0.99),
        median(sessions.clone()),
        percentile(sessions, 0.99)
    );
}
