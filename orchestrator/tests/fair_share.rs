//! Fair share over a simulated week (a fake clock): two groups with shares 2:1, whose
//! members keep runs waiting without pause, on a fleet they both want whole. The
//! admission order is the product's ([`fair::order`] over [`fair::Accounts`]), and usage
//! is charged as the executor's meter charges it (GiB of GPU memory × hours, between
//! admission passes). The delivered GPU-hours must end within 5 % of 2:1; first-come
//! first-served, on the same submissions, does not (group A has three members, B two).

use std::collections::BTreeMap;

use skein_orchestrator::base::UnixMs;
use skein_orchestrator::sharing::fair::{self, Accounts, DEFAULT_HALF_LIFE, Waiting};

const GPUS: u32 = 16;
const GPU_GIB: f64 = 80.0;
const HOUR_MS: i64 = 3_600_000;
const WEEK_MS: i64 = 7 * 24 * HOUR_MS;
/// The executor meters at every admission pass; a pass every minute here.
const PASS_MS: i64 = 60_000;

/// A small deterministic generator (SplitMix64), so the week is the same every run.
struct Draw(u64);

impl Draw {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

#[derive(Clone)]
struct Job {
    id: String,
    user: &'static str,
    group: &'static str,
    gpus: u32,
    length_ms: i64,
}

struct Running {
    job: Job,
    ends: i64,
}

const MEMBERS: [(&str, &str); 5] = [("a1", "a"), ("a2", "a"), ("a3", "a"), ("b1", "b"), ("b2", "b")];

/// Delivered GPU-hours by group and by user over the week, ordering the queue with
/// `fair_share` (else first come, first served).
fn simulate_week(fair_share: bool) -> (BTreeMap<&'static str, f64>, BTreeMap<&'static str, f64>) {
    let mut draw = Draw(0x5ca1_ab1e);
    let mut accounts = Accounts::default();
    accounts.set_group_shares("a", 2);
    accounts.set_group_shares("b", 1);
    let mut submitted = 0u64;
    let mut submit = |user: &'static str, group: &'static str, now: i64, draw: &mut Draw| {
        submitted += 1;
        Job {
            // Ids sort by submission, as the executor's do.
            id: format!("r{now:012}-{submitted:06}"),
            user,
            group,
            gpus: [1, 1, 2, 4][draw.below(4) as usize],
            length_ms: (30 + draw.below(211) as i64) * 60_000,
        }
    };
    let mut queue: Vec<Job> = Vec::new();
    // Without pause: every member always has three runs waiting.
    let top_up = |queue: &mut Vec<Job>,
                  now: i64,
                  draw: &mut Draw,
                  submit: &mut dyn FnMut(&'static str, &'static str, i64, &mut Draw) -> Job| {
        for (user, group) in MEMBERS {
            while queue.iter().filter(|j| j.user == user).count() < 3 {
                let job = submit(user, group, now, draw);
                queue.push(job);
            }
        }
    };
    let mut running: Vec<Running> = Vec::new();
    let mut by_group: BTreeMap<&'static str, f64> = BTreeMap::new();
    let mut by_user: BTreeMap<&'static str, f64> = BTreeMap::new();
    let mut now = 0;
    while now < WEEK_MS {
        // Runs that ended leave; members submit again.
        running.retain(|r| r.ends > now);
        top_up(&mut queue, now, &mut draw, &mut submit);
        // The admission pass: in order, start every run that fits.
        let order: Vec<String> = if fair_share {
            let standings = accounts.standings(UnixMs(now), DEFAULT_HALF_LIFE);
            let mut waiting: Vec<Waiting> = queue
                .iter()
                .map(|j| Waiting {
                    id: j.id.clone(),
                    priority: 0,
                    user: j.user.to_owned(),
                    group: j.group.to_owned(),
                })
                .collect();
            fair::order(&mut waiting, &standings);
            waiting.into_iter().map(|w| w.id).collect()
        } else {
            let mut ids: Vec<String> = queue.iter().map(|j| j.id.clone()).collect();
            ids.sort();
            ids
        };
        let mut free = GPUS - running.iter().map(|r| r.job.gpus).sum::<u32>();
        for id in order {
            let Some(at) = queue.iter().position(|j| j.id == id) else {
                continue;
            };
            if queue[at].gpus <= free {
                let job = queue.remove(at);
                free -= job.gpus;
                running.push(Running {
                    ends: now + job.length_ms,
                    job,
                });
            }
        }
        // Until the next pass: the meter charges what runs hold.
        let next = (now + PASS_MS).min(WEEK_MS);
        for r in &running {
            let held_ms = (r.ends.min(next) - now) as f64;
            let gpu_hours = f64::from(r.job.gpus) * held_ms / HOUR_MS as f64;
            *by_group.entry(r.job.group).or_default() += gpu_hours;
            *by_user.entry(r.job.user).or_default() += gpu_hours;
            accounts.charge(
                r.job.group,
                r.job.user,
                gpu_hours * GPU_GIB,
                UnixMs(next),
                DEFAULT_HALF_LIFE,
            );
        }
        now = next;
    }
    (by_group, by_user)
}

#[test]
fn two_groups_with_shares_two_to_one_get_gpu_hours_within_five_percent_of_two_to_one() {
    let (groups, users) = simulate_week(true);
    let delivered = groups["a"] + groups["b"];
    let ratio = groups["a"] / groups["b"];
    println!(
        "fair share: a {:.0} GPU-h, b {:.0} GPU-h, ratio {ratio:.3}; by user {users:.0?}",
        groups["a"], groups["b"]
    );
    // The fleet stayed busy: both groups always had work waiting.
    assert!(
        delivered > 0.9 * f64::from(GPUS) * 168.0,
        "delivered {delivered:.0} GPU-hours"
    );
    assert!(
        (ratio / 2.0 - 1.0).abs() <= 0.05,
        "a:b = {ratio:.3}, not within 5 % of 2"
    );
    // Within a group, equal shares: each member within 10 % of an equal part.
    for (members, total) in [(&["a1", "a2", "a3"][..], groups["a"]), (&["b1", "b2"][..], groups["b"])] {
        for member in members {
            let part = users[member] / (total / members.len() as f64);
            assert!((part - 1.0).abs() <= 0.10, "{member} got {part:.3} of an equal part");
        }
    }
    // The same week first come, first served: the group with more members gets more.
    let (fifo, _) = simulate_week(false);
    let fifo_ratio = fifo["a"] / fifo["b"];
    println!("first come, first served: ratio {fifo_ratio:.3}");
    assert!(
        (fifo_ratio / 2.0 - 1.0).abs() > 0.05,
        "the test cannot tell fair share apart: {fifo_ratio:.3}"
    );
}
