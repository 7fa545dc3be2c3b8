//! Fair share (pure): who goes first among waiting runs of equal priority, and whose
//! instances are preempted first.
//!
//! # The formula
//! Every group `g` has `shares_g` (default 1); every user `u` has `shares_u` within their
//! group (default 1). Usage is GPU memory reserved × time (GiB-hours), decayed
//! exponentially with a half-life `H` (default 7 days, as Slurm's
//! `PriorityDecayHalfLife`): a GiB-hour used `t` ago counts `2^(−t/H)`.
//!
//! - A group's normalised share `S_g = shares_g / Σ shares` over all groups, and its
//!   normalised usage `U_g = usage_g / Σ usage` over all groups (0 when nobody used
//!   anything). Its factor is `F_g = 2^(−U_g / S_g)`: 1 for a group that used nothing,
//!   0.5 for one that used exactly its share, towards 0 the further it is over.
//! - Within the group, the same on the members: `s_u = shares_u / Σ shares` of the
//!   group's members and `u_u = usage_u / usage_g`, so `f_u = 2^(−u_u / s_u)`.
//!
//! Waiting runs are ordered by priority (higher first), then by the group's factor, then
//! by the user's factor (higher first: further under their share), then by age. Comparing
//! the group level before the user level is Slurm's "fair tree": a group over its share
//! waits behind every group under it, whatever its members did. Only the order between
//! groups matters, so groups with no waiting runs (usage decaying, share unused) shift
//! every factor alike and change no decision.
//!
//! Preemption takes, among instances of equal priority, those of the owner furthest over
//! their share first (lowest factors).

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::base::UnixMs;

/// The default half-life of usage.
pub const DEFAULT_HALF_LIFE: Duration = Duration::from_secs(7 * 24 * 3600);

/// An amount that halves every half-life: its value at `at`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Decayed {
    /// The value at `at`.
    pub value: f64,
    /// When `value` was taken.
    pub at: UnixMs,
}

impl Default for Decayed {
    fn default() -> Self {
        Decayed {
            value: 0.0,
            at: UnixMs(0),
        }
    }
}

impl Decayed {
    /// Its value at `now` (as at `at` for an earlier `now`: time never runs back).
    pub fn value_at(&self, now: UnixMs, half_life: Duration) -> f64 {
        let elapsed_ms = (now.0 - self.at.0).max(0) as f64;
        let half_life_ms = half_life.as_millis().max(1) as f64;
        self.value * (-elapsed_ms / half_life_ms).exp2()
    }

    /// Adds `amount` at `now`.
    pub fn add(&mut self, amount: f64, now: UnixMs, half_life: Duration) {
        let now = UnixMs(now.0.max(self.at.0));
        self.value = self.value_at(now, half_life) + amount.max(0.0);
        self.at = now;
    }
}

/// `2^(−usage / share)`: the fair-share factor of one level, in `[0, 1]` (0 for no share).
pub fn factor(share: f64, usage: f64) -> f64 {
    if share <= 0.0 || !share.is_finite() {
        return 0.0;
    }
    (-usage.max(0.0) / share).exp2()
}

pub use crate::base::Standing;

/// The shares and decayed usage of every group and its members.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Accounts {
    /// By group.
    pub groups: BTreeMap<String, GroupAccount>,
}

/// A group's account.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GroupAccount {
    /// Its shares.
    pub shares: u32,
    /// Its decayed usage (the sum of its members').
    pub usage: Decayed,
    /// Its members: shares and decayed usage.
    pub members: BTreeMap<String, MemberAccount>,
}

/// A member's account.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MemberAccount {
    /// Their shares within the group.
    pub shares: u32,
    /// Their decayed usage.
    pub usage: Decayed,
}

impl Default for GroupAccount {
    fn default() -> Self {
        GroupAccount {
            shares: 1,
            usage: Decayed::default(),
            members: BTreeMap::new(),
        }
    }
}

impl Default for MemberAccount {
    fn default() -> Self {
        MemberAccount {
            shares: 1,
            usage: Decayed::default(),
        }
    }
}

impl Accounts {
    /// Sets a group's shares (the group is made if new).
    pub fn set_group_shares(&mut self, group: &str, shares: u32) {
        self.groups.entry(group.to_owned()).or_default().shares = shares;
    }

    /// Sets a member's shares within their group (both made if new).
    pub fn set_member_shares(&mut self, group: &str, user: &str, shares: u32) {
        self.groups
            .entry(group.to_owned())
            .or_default()
            .members
            .entry(user.to_owned())
            .or_default()
            .shares = shares;
    }

    /// Charges `amount` (GiB-hours) to `user` of `group` at `now`.
    pub fn charge(&mut self, group: &str, user: &str, amount: f64, now: UnixMs, half_life: Duration) {
        let account = self.groups.entry(group.to_owned()).or_default();
        account.usage.add(amount, now, half_life);
        account
            .members
            .entry(user.to_owned())
            .or_default()
            .usage
            .add(amount, now, half_life);
    }

    /// Every owner's standing at `now`, computed once for ordering many runs.
    pub fn standings(&self, now: UnixMs, half_life: Duration) -> Standings {
        let total_shares: f64 = self.groups.values().map(|g| f64::from(g.shares)).sum();
        let usages: Vec<f64> = self.groups.values().map(|g| g.usage.value_at(now, half_life)).collect();
        let total_usage: f64 = usages.iter().sum();
        let mut groups = HashMap::with_capacity(self.groups.len());
        for ((name, account), usage) in self.groups.iter().zip(usages) {
            let share = f64::from(account.shares) / total_shares;
            let group = factor(share, normalised(usage, total_usage));
            let member_shares: f64 = account.members.values().map(|m| f64::from(m.shares)).sum();
            let members = account
                .members
                .iter()
                .map(|(user, member)| {
                    let share = f64::from(member.shares) / member_shares;
                    let used = normalised(member.usage.value_at(now, half_life), usage);
                    (user.clone(), factor(share, used))
                })
                .collect();
            groups.insert(name.clone(), (group, members));
        }
        Standings { groups }
    }
}

fn normalised(part: f64, whole: f64) -> f64 {
    if whole > 0.0 { part / whole } else { 0.0 }
}

/// Every owner's standing at one time.
#[derive(Debug, Clone, Default)]
pub struct Standings {
    groups: HashMap<String, (f64, HashMap<String, f64>)>,
}

impl Standings {
    /// Where `user` of `group` stands; a group or member without an account (nothing
    /// used, default shares) stands as one that used nothing.
    pub fn of(&self, group: &str, user: &str) -> Standing {
        match self.groups.get(group) {
            Some((group, members)) => Standing {
                group: *group,
                user: members.get(user).copied().unwrap_or(1.0),
            },
            None => Standing::FRESH,
        }
    }
}

/// A run waiting for admission, as the order sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Waiting {
    /// Its id (ids sort by submission time).
    pub id: String,
    /// Its workflow's priority.
    pub priority: i32,
    /// Its owner.
    pub user: String,
    /// The owner's group.
    pub group: String,
}

/// Orders `waiting` for admission: priority (higher first), the owner's standing
/// (further under its share first), then age (older first).
pub fn order(waiting: &mut [Waiting], standings: &Standings) {
    let order = order_by(waiting, |w| {
        (w.priority, standings.of(&w.group, &w.user), w.id.as_str())
    });
    let sorted: Vec<Waiting> = order.iter().map(|&i| waiting[i].clone()).collect();
    waiting.clone_from_slice(&sorted);
}

/// The admission order of `items` as indices, each item's key being its priority, its
/// owner's standing and its id (ids sort by age): priority (higher first), standing
/// ([`Standing::first`]), then id. Each key is taken once.
pub fn order_by<'a, T>(items: &'a [T], key: impl Fn(&'a T) -> (i32, Standing, &'a str)) -> Vec<usize> {
    let mut keyed: Vec<(i32, Standing, &str, usize)> = items
        .iter()
        .enumerate()
        .map(|(i, item)| {
            let (priority, standing, id) = key(item);
            (priority, standing, id, i)
        })
        .collect();
    keyed.sort_unstable_by(|a, b| b.0.cmp(&a.0).then(a.1.first(&b.1)).then(a.2.cmp(b.2)));
    keyed.into_iter().map(|(.., i)| i).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAY: Duration = Duration::from_secs(24 * 3600);

    #[test]
    fn usage_halves_every_half_life() {
        let mut used = Decayed::default();
        used.add(8.0, UnixMs(0), DAY);
        let day_ms = DAY.as_millis() as i64;
        assert!((used.value_at(UnixMs(day_ms), DAY) - 4.0).abs() < 1e-9);
        assert!((used.value_at(UnixMs(3 * day_ms), DAY) - 1.0).abs() < 1e-9);
        // Time never runs back: an earlier `now` reads the value as taken.
        assert_eq!(used.value_at(UnixMs(-5), DAY), 8.0);
        used.add(1.0, UnixMs(day_ms), DAY);
        assert!((used.value - 5.0).abs() < 1e-9);
    }

    #[test]
    fn factors_are_one_unused_a_half_at_the_share_and_fall_beyond() {
        assert_eq!(factor(0.5, 0.0), 1.0);
        assert_eq!(factor(0.5, 0.5), 0.5);
        assert_eq!(factor(0.25, 1.0), 1.0 / 16.0);
        assert_eq!(factor(0.0, 0.0), 0.0);
    }

    #[test]
    fn a_group_over_its_share_waits_behind_one_under_it_whatever_its_members_did() {
        let mut accounts = Accounts::default();
        accounts.set_group_shares("vision", 2);
        accounts.set_group_shares("nlp", 1);
        // vision used 2/3 (its share), nlp 1/3 (its share); then nlp used more.
        accounts.charge("vision", "ada", 200.0, UnixMs(0), DAY);
        accounts.charge("nlp", "bo", 100.0, UnixMs(0), DAY);
        accounts.charge("nlp", "cy", 50.0, UnixMs(0), DAY);
        let standings = accounts.standings(UnixMs(0), DAY);
        let vision = standings.of("vision", "ada");
        let nlp_light = standings.of("nlp", "cy");
        assert!(vision.group > nlp_light.group);
        // Within nlp, cy (used less) goes before bo.
        assert!(standings.of("nlp", "cy").user > standings.of("nlp", "bo").user);
        let mut waiting = vec![
            run("r3", 0, "cy", "nlp"),
            run("r2", 0, "bo", "nlp"),
            run("r1", 0, "ada", "vision"),
            run("r4", 5, "bo", "nlp"),
            run("r5", 0, "new", "unknown"),
        ];
        order(&mut waiting, &standings);
        let ids: Vec<&str> = waiting.iter().map(|w| w.id.as_str()).collect();
        assert_eq!(ids, ["r4", "r5", "r1", "r3", "r2"]);
    }

    fn run(id: &str, priority: i32, user: &str, group: &str) -> Waiting {
        Waiting {
            id: id.into(),
            priority,
            user: user.into(),
            group: group.into(),
        }
    }
}
