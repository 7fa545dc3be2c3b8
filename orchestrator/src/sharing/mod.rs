//! A lab shared fairly: groups (projects) and their members, quotas, and fair-share
//! admission (docs/sharing.md).
//!
//! - [`fair`] (pure): decayed usage, the fair-share factors and the admission order.
//! - [`quota`] (pure): limits and the refusal that names limit, use and when it frees.
//! - [`gpu_hours`]: GPU-hours by hour, what a `gpu_hours` limit's period is checked
//!   against; [`sessions`]: the sessions limit, counted as sessions are made.
//! - [`usage`] (pure): usage records by hour, group, user, model and agent, summed by
//!   the dimensions a query asks for; [`accounting`]: the ledger they are counted in and
//!   written from, and the [`Tap`] model calls are counted through.
//! - [`Sharing`]: the groups and users in the store, the runs in progress by owner
//!   (checked and reserved atomically, so no interleaving of submissions exceeds a
//!   limit), and the usage metered from the instances that runs hold.
//!
//! A user without a record belongs to the group [`DEFAULT_GROUP`] with one share and no
//! limits of their own.

pub mod accounting;
pub mod fair;
pub mod gpu_hours;
pub mod quota;
pub mod sessions;
pub mod usage;

#[cfg(test)]
mod tests;

pub use accounting::Tap;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use self::fair::{Accounts, GroupAccount, Standing};
use self::quota::{Limit, Limits, Refusal, Scope, within};
use crate::base::{UnixMs, lock, unix_ms};
use crate::instances::InstanceView;
use crate::store::{Db, StoreError, Tree, WriteBatch};

/// The group of users nobody put in one.
pub const DEFAULT_GROUP: &str = "default";

/// The most shares a group or user may hold.
pub const MAX_SHARES: u32 = 1_000_000;

/// How often metered usage is written to the store (a kill loses at most this much of
/// it; nothing acknowledged is lost).
pub const USAGE_SAVE_INTERVAL: Duration = Duration::from_secs(60);

/// How often the usage ledger is written to the store: a kill loses at most this much
/// accounting (`GET /v1/usage` counts what is not written yet too).
pub const LEDGER_WRITE_INTERVAL: Duration = Duration::from_secs(10);

const GIB: f64 = (1u64 << 30) as f64;

/// A group (a project).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct GroupRecord {
    /// Its name.
    pub name: String,
    /// Its shares of the fleet, against the other groups'.
    pub shares: u32,
    /// What its members may use together.
    pub limits: Limits,
    /// When it was made.
    pub created_at: UnixMs,
    /// When it last changed.
    pub updated_at: UnixMs,
}

/// A user's membership, shares and limits.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct UserRecord {
    /// The user.
    pub name: String,
    /// Their group.
    pub group: String,
    /// Their shares within the group, against the other members'.
    pub shares: u32,
    /// What they may use.
    pub limits: Limits,
    /// When it last changed.
    pub updated_at: UnixMs,
}

/// Who owns a run, and in which group.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Owner {
    /// The user.
    pub user: String,
    /// Their group.
    pub group: String,
}

/// Why a group or user could not be changed.
#[derive(Debug, thiserror::Error)]
pub enum SharingError {
    /// A name, share or limit that cannot be used.
    #[error("{0}")]
    Invalid(String),
    /// No such group.
    #[error("no group `{0}`; `skein group list` lists them, `skein group set {0}` makes it")]
    NoGroup(String),
    /// A group that still has members.
    #[error("group `{group}` still has members ({}); help: move them first with `skein group add OTHER USER`", .members.join(", "))]
    HasMembers {
        /// The group.
        group: String,
        /// Its members.
        members: Vec<String>,
    },
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// What a user or group holds now, and may hold.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct Holding {
    /// Runs in progress.
    pub runs: u32,
    /// GPU memory reserved, GiB.
    pub gpu_gib: f64,
    /// GPUs in use.
    pub gpus: u32,
    /// The limits (the user's own, or the group's).
    pub limits: Limits,
    /// The fair-share factor (1: used nothing of late; 0.5: used exactly its share).
    pub factor: f64,
    /// Decayed usage, GiB-hours.
    pub usage_gib_hours: f64,
    /// Tokens on the API routes and in sessions in the last minute.
    pub tokens_last_minute: u64,
    /// Sessions made and not deleted.
    pub sessions: u32,
    /// GPU-hours in the period of the `gpu_hours` limit (the last week when none is set).
    pub gpu_hours: f64,
}

/// The groups, users, runs in progress and fair-share accounts. Cheap to clone.
#[derive(Clone)]
pub struct Sharing {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Sharing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sharing").finish_non_exhaustive()
    }
}

struct Inner {
    groups: Tree<GroupRecord>,
    users: Tree<UserRecord>,
    /// Decayed usage by group (with its members'), saved every [`USAGE_SAVE_INTERVAL`].
    usage: Tree<GroupAccount>,
    /// Usage records by hour, group, user, model and agent.
    hours: Tree<usage::Counts>,
    half_life: Duration,
    state: Mutex<State>,
    /// Usage counted since its last write (a leaf: taken after `state`, never before).
    ledger: Mutex<usage::Ledger>,
    /// One write of the ledger at a time, and no query while one is in progress.
    usage_writes: tokio::sync::Mutex<()>,
    /// One change of groups or users at a time (the store write and the cache agree).
    edits: tokio::sync::Mutex<()>,
}

#[derive(Default)]
struct State {
    groups: BTreeMap<String, GroupRecord>,
    users: BTreeMap<String, UserRecord>,
    accounts: Accounts,
    /// Runs in progress (queued, starting or running), by id.
    runs: HashMap<String, Owner>,
    /// How many of them each user has, and each group (as of their reservation).
    user_runs: HashMap<String, u32>,
    group_runs: HashMap<String, u32>,
    metered_at: Option<UnixMs>,
    saved_at: Option<UnixMs>,
    ledger_written_at: Option<UnixMs>,
    /// The last minute's tokens on the API routes and in sessions, by user and by group.
    user_tokens: HashMap<String, quota::TokenWindow>,
    group_tokens: HashMap<String, quota::TokenWindow>,
    /// GPU-hours of the last 31 days by hour, by user and by group (as the user's was).
    user_gpu_hours: HashMap<String, gpu_hours::HourWindow>,
    group_gpu_hours: HashMap<String, gpu_hours::HourWindow>,
    /// The hour the windows last dropped what no period reaches.
    gpu_hours_expired_at: i64,
    /// Sessions made and not deleted, by user, and by their group now.
    user_sessions: HashMap<String, u32>,
    group_sessions: HashMap<String, u32>,
}

impl State {
    /// Counts `run` of `owner` as in progress (once).
    fn add_run(&mut self, run: &str, owner: Owner) {
        if self.runs.contains_key(run) {
            return;
        }
        *self.user_runs.entry(owner.user.clone()).or_default() += 1;
        *self.group_runs.entry(owner.group.clone()).or_default() += 1;
        self.runs.insert(run.to_owned(), owner);
    }

    /// `run` is no longer in progress.
    fn remove_run(&mut self, run: &str) {
        let Some(owner) = self.runs.remove(run) else {
            return;
        };
        for (counts, key) in [(&mut self.user_runs, owner.user), (&mut self.group_runs, owner.group)] {
            if let Some(count) = counts.get_mut(&key) {
                *count -= 1;
                if *count == 0 {
                    counts.remove(&key);
                }
            }
        }
    }

    fn owner(&self, user: &str) -> Owner {
        Owner {
            user: user.to_owned(),
            group: self
                .users
                .get(user)
                .map_or_else(|| DEFAULT_GROUP.to_owned(), |u| u.group.clone()),
        }
    }

    fn user_limits(&self, user: &str) -> Limits {
        self.users.get(user).map(|u| u.limits.clone()).unwrap_or_default()
    }

    fn group_limits(&self, group: &str) -> Limits {
        self.groups.get(group).map(|g| g.limits.clone()).unwrap_or_default()
    }

    /// Brings the accounts' shares in line with the records.
    fn sync_accounts(&mut self) {
        for group in self.groups.values() {
            self.accounts.set_group_shares(&group.name, group.shares);
        }
        for user in self.users.values() {
            self.accounts.set_member_shares(&user.group, &user.name, user.shares);
        }
        // Members who moved keep their usage where it was earned but no shares there.
        for (group, account) in &mut self.accounts.groups {
            for (name, member) in &mut account.members {
                let here = self.users.get(name).map_or(DEFAULT_GROUP, |u| u.group.as_str());
                if here != group {
                    member.shares = 0;
                } else if !self.users.contains_key(name) {
                    member.shares = 1;
                }
            }
        }
    }
}

/// GPU use: memory and the distinct GPUs, of instances.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GpuUse {
    /// Bytes reserved.
    pub bytes: u64,
    /// The GPUs, as (node, index).
    pub gpus: BTreeSet<(String, u32)>,
}

impl GpuUse {
    fn add(&mut self, node: &str, gpu: u32, bytes: u64) {
        self.bytes += bytes;
        self.gpus.insert((node.to_owned(), gpu));
    }

    /// What `plan` places on GPUs (host memory is not GPU use).
    pub fn of_plan(plan: &crate::plan::Plan) -> GpuUse {
        let mut used = GpuUse::default();
        for device in plan.instances.iter().flat_map(|i| &i.devices) {
            if let Some(gpu) = device.gpu {
                used.add(&device.node, gpu, device.reserved);
            }
        }
        used
    }
}

impl Sharing {
    /// The groups and users of `db`, with usage decaying with `half_life`.
    ///
    /// Errors: the store fails.
    pub fn open(db: &Db, half_life: Duration) -> Result<Sharing, StoreError> {
        let groups: Tree<GroupRecord> = db.tree("groups")?;
        let users: Tree<UserRecord> = db.tree("group_members")?;
        let usage: Tree<GroupAccount> = db.tree("share_usage")?;
        let hours: Tree<usage::Counts> = db.tree("usage_hours")?;
        let mut state = State {
            groups: groups.all()?.into_iter().map(|g| (g.name.clone(), g)).collect(),
            users: users.all()?.into_iter().map(|u| (u.name.clone(), u)).collect(),
            ..State::default()
        };
        for entry in usage.prefixed("") {
            let (name, account) = entry?;
            state.accounts.groups.insert(name, account);
        }
        gpu_hours::load(&hours, &mut state, unix_ms())?;
        state.sync_accounts();
        Ok(Sharing {
            inner: Arc::new(Inner {
                groups,
                users,
                usage,
                hours,
                half_life,
                state: Mutex::new(state),
                ledger: Mutex::default(),
                usage_writes: tokio::sync::Mutex::new(()),
                edits: tokio::sync::Mutex::new(()),
            }),
        })
    }

    /// The owner `user` is now: them and their group.
    pub fn owner(&self, user: &str) -> Owner {
        lock(&self.inner.state).owner(user)
    }

    /// Every group, by name ([`DEFAULT_GROUP`] too, as stored or as it stands unstored).
    pub fn groups(&self) -> Vec<GroupRecord> {
        let state = lock(&self.inner.state);
        let mut groups: Vec<GroupRecord> = state.groups.values().cloned().collect();
        if !state.groups.contains_key(DEFAULT_GROUP) {
            groups.push(default_group());
            groups.sort_by(|a, b| a.name.cmp(&b.name));
        }
        groups
    }

    /// Every user with a record, by name.
    pub fn users(&self) -> Vec<UserRecord> {
        lock(&self.inner.state).users.values().cloned().collect()
    }

    /// Makes or changes a group: `shares` and `limits` (merged over the current ones,
    /// `clear` lifting some).
    ///
    /// Errors: [`SharingError::Invalid`], [`SharingError::Store`].
    pub async fn set_group(
        &self,
        name: &str,
        shares: Option<u32>,
        limits: &Limits,
        clear: &[Limit],
    ) -> Result<GroupRecord, SharingError> {
        check_name("group", name)?;
        check_shares(shares)?;
        let _edit = self.inner.edits.lock().await;
        let now = unix_ms();
        let current = lock(&self.inner.state).groups.get(name).cloned();
        let mut record = current.unwrap_or_else(|| GroupRecord {
            name: name.to_owned(),
            created_at: now,
            ..default_group()
        });
        (record.shares, record.limits) = changed(
            record.shares,
            &record.limits,
            shares,
            limits,
            clear,
            &format!("group `{name}`"),
        )?;
        record.updated_at = now;
        self.inner.groups.put(name, &record).await?;
        let mut state = lock(&self.inner.state);
        state.groups.insert(name.to_owned(), record.clone());
        state.sync_accounts();
        Ok(record)
    }

    /// Removes an empty group.
    ///
    /// Errors: [`SharingError::NoGroup`], [`SharingError::HasMembers`], [`SharingError::Store`].
    pub async fn remove_group(&self, name: &str) -> Result<GroupRecord, SharingError> {
        let _edit = self.inner.edits.lock().await;
        let (record, members) = {
            let state = lock(&self.inner.state);
            let record = state
                .groups
                .get(name)
                .cloned()
                .ok_or_else(|| SharingError::NoGroup(name.to_owned()))?;
            let members: Vec<String> = state
                .users
                .values()
                .filter(|u| u.group == name)
                .map(|u| u.name.clone())
                .collect();
            (record, members)
        };
        if !members.is_empty() {
            return Err(SharingError::HasMembers {
                group: name.to_owned(),
                members,
            });
        }
        let mut batch = WriteBatch::new();
        batch.remove(&self.inner.groups, name);
        self.inner.groups.db().commit(batch).await?;
        let mut state = lock(&self.inner.state);
        state.groups.remove(name);
        state
            .accounts
            .groups
            .entry(name.to_owned())
            .and_modify(|g| g.shares = 0);
        Ok(record)
    }

    /// Puts `user` in `group` (which must exist, or be [`DEFAULT_GROUP`]) and sets their
    /// shares and limits; `group: None` keeps their group.
    ///
    /// Errors: [`SharingError::Invalid`], [`SharingError::NoGroup`], [`SharingError::Store`].
    pub async fn set_user(
        &self,
        user: &str,
        group: Option<&str>,
        shares: Option<u32>,
        limits: &Limits,
        clear: &[Limit],
    ) -> Result<UserRecord, SharingError> {
        crate::auth::check_user(user).map_err(|e| SharingError::Invalid(e.to_string()))?;
        check_shares(shares)?;
        let _edit = self.inner.edits.lock().await;
        let (current, group_known) = {
            let state = lock(&self.inner.state);
            let known = group.is_none_or(|g| g == DEFAULT_GROUP || state.groups.contains_key(g));
            (state.users.get(user).cloned(), known)
        };
        if !group_known {
            return Err(SharingError::NoGroup(group.unwrap_or_default().to_owned()));
        }
        let mut record = current.unwrap_or_else(|| UserRecord {
            name: user.to_owned(),
            group: DEFAULT_GROUP.to_owned(),
            shares: 1,
            limits: Limits::default(),
            updated_at: unix_ms(),
        });
        if let Some(group) = group {
            group.clone_into(&mut record.group);
        }
        (record.shares, record.limits) = changed(
            record.shares,
            &record.limits,
            shares,
            limits,
            clear,
            &format!("user `{user}`"),
        )?;
        record.updated_at = unix_ms();
        self.inner.users.put(user, &record).await?;
        let mut state = lock(&self.inner.state);
        let was = state.owner(user).group;
        state.move_sessions(user, &was, &record.group);
        state.users.insert(user.to_owned(), record.clone());
        state.sync_accounts();
        Ok(record)
    }

    /// Reserves a place for run `run` of `user` against the runs limits of the user and
    /// their group. The check and the reservation are one step under one lock: however
    /// submissions interleave, no user or group passes its limit. Give it back with
    /// [`Sharing::release_run`] if the run is not stored after all.
    ///
    /// Errors: the [`Refusal`] of the limit it would pass.
    pub fn reserve_run(&self, user: &str, run: &str) -> Result<Owner, Refusal> {
        let mut state = lock(&self.inner.state);
        let owner = state.owner(user);
        let mine = state.user_runs.get(&owner.user).copied().unwrap_or(0);
        let ours = state.group_runs.get(&owner.group).copied().unwrap_or(0);
        let frees = "it frees when one of those runs ends (`skein runs` lists them)";
        one_more(
            Limit::Runs,
            &owner,
            (state.user_limits(user).runs, mine),
            (state.group_limits(&owner.group).runs, ours),
            frees,
        )?;
        state.add_run(run, owner.clone());
        Ok(owner)
    }

    /// Counts `run` (stored, unfinished: after a restart) as in progress, whatever the
    /// limits: it was admitted to the queue before.
    pub fn resume_run(&self, owner: &str, run: &str) {
        let mut state = lock(&self.inner.state);
        let owner = state.owner(owner);
        state.add_run(run, owner);
    }

    /// The run ended (or was never stored): its place is free.
    pub fn release_run(&self, run: &str) {
        lock(&self.inner.state).remove_run(run);
    }

    /// Checks that placing `adding` for run `run` keeps its owner and their group within
    /// their GPU limits, counting what the instances of their runs in progress hold now.
    ///
    /// Errors: the [`Refusal`] of the first limit it would pass.
    pub fn check_gpus(&self, run: &str, adding: &GpuUse, instances: &[InstanceView]) -> Result<(), Refusal> {
        let state = lock(&self.inner.state);
        let Some(owner) = state.runs.get(run).cloned() else {
            return Ok(());
        };
        let now = unix_ms();
        for (scope, limits) in [
            (Scope::User(owner.user.clone()), state.user_limits(&owner.user)),
            (Scope::Group(owner.group.clone()), state.group_limits(&owner.group)),
        ] {
            state.check_gpu_hours(&scope, &limits, now)?;
        }
        let (mine, ours) = held_by(&state, &owner, instances);
        let frees = "it frees as their running runs end (`skein runs`); the run waits until then";
        for (scope, limits, held) in [
            (Scope::User(owner.user.clone()), state.user_limits(&owner.user), mine),
            (
                Scope::Group(owner.group.clone()),
                state.group_limits(&owner.group),
                ours,
            ),
        ] {
            let gib = |bytes: u64| bytes as f64 / GIB;
            if let Some(refusal) = within(
                Limit::GpuGib,
                &scope,
                limits.gpu_gib,
                gib(held.bytes),
                gib(adding.bytes),
                frees,
            ) {
                return Err(refusal);
            }
            let new_gpus = adding.gpus.difference(&held.gpus).count();
            if let Some(refusal) = within(
                Limit::Gpus,
                &scope,
                limits.gpus.map(f64::from),
                held.gpus.len() as f64,
                new_gpus as f64,
                frees,
            ) {
                return Err(refusal);
            }
        }
        Ok(())
    }

    /// What `user` (or, with `group`, the group) holds now and may hold.
    pub fn holding(&self, user: Option<&str>, group: &str, instances: &[InstanceView]) -> Holding {
        let now = unix_ms();
        let tokens_last_minute = self.tokens_last_minute(user, group, now);
        let state = lock(&self.inner.state);
        let owner = match user {
            Some(user) => state.owner(user),
            None => Owner {
                user: String::new(),
                group: group.to_owned(),
            },
        };
        let (mine, ours) = held_by(&state, &owner, instances);
        let sessions = state.sessions_of(user, group);
        let standings = state.accounts.standings(now, self.inner.half_life);
        let standing = standings.of(&owner.group, &owner.user);
        let account = state.accounts.groups.get(&owner.group);
        let half_life = self.inner.half_life;
        match user {
            Some(user) => Holding {
                runs: state.user_runs.get(user).copied().unwrap_or(0),
                gpu_gib: mine.bytes as f64 / GIB,
                gpus: mine.gpus.len() as u32,
                limits: state.user_limits(user),
                factor: standing.user,
                usage_gib_hours: account
                    .and_then(|a| a.members.get(user))
                    .map_or(0.0, |m| m.usage.value_at(now, half_life)),
                tokens_last_minute,
                sessions,
                gpu_hours: state.gpu_hours_used(&Scope::User(user.to_owned()), &state.user_limits(user), now),
            },
            None => Holding {
                runs: state.group_runs.get(group).copied().unwrap_or(0),
                gpu_gib: ours.bytes as f64 / GIB,
                gpus: ours.gpus.len() as u32,
                limits: state.group_limits(group),
                factor: standing.group,
                usage_gib_hours: account.map_or(0.0, |a| a.usage.value_at(now, half_life)),
                tokens_last_minute,
                sessions,
                gpu_hours: state.gpu_hours_used(&Scope::Group(group.to_owned()), &state.group_limits(group), now),
            },
        }
    }

    /// Orders queued runs (`(priority, id)`) for admission by [`fair::order_by`], at
    /// `now`: indices into `queued`, first to admit first.
    pub fn order(&self, queued: &[(i32, String)], now: UnixMs) -> Vec<usize> {
        let state = lock(&self.inner.state);
        let standings = state.accounts.standings(now, self.inner.half_life);
        let order = fair::order_by(queued, |(priority, id)| {
            let standing = state
                .runs
                .get(id)
                .map_or(Standing::FRESH, |o| standings.of(&o.group, &o.user));
            (*priority, standing, id.as_str())
        });
        drop(state);
        order
    }

    /// Where `user` (in their group now) stands in fair share now.
    pub fn standing(&self, user: &str) -> fair::Standing {
        let state = lock(&self.inner.state);
        let owner = state.owner(user);
        state
            .accounts
            .standings(unix_ms(), self.inner.half_life)
            .of(&owner.group, &owner.user)
    }

    /// Charges `gib_hours` of GPU memory × time to `user` (in their group now) at `now`.
    pub fn charge(&self, user: &str, gib_hours: f64, now: UnixMs) {
        let mut state = lock(&self.inner.state);
        let owner = state.owner(user);
        state
            .accounts
            .charge(&owner.group, &owner.user, gib_hours, now, self.inner.half_life);
    }

    /// Charges the owners of runs in progress for the GPU memory their instances hold
    /// since the last metering (GiB-hours), at `now`, in their fair-share accounts and
    /// in the usage ledger; every [`USAGE_SAVE_INTERVAL`] the accounts are written to
    /// the store, every [`LEDGER_WRITE_INTERVAL`] the ledger.
    ///
    /// Errors: the store fails (the accounts stay charged in memory).
    pub async fn meter(&self, now: UnixMs, instances: &[InstanceView]) -> Result<(), StoreError> {
        let mut batch = WriteBatch::new();
        let write_ledger;
        {
            let mut state = lock(&self.inner.state);
            let since = state.metered_at.replace(now).unwrap_or(now);
            let hours = (now.0 - since.0).max(0) as f64 / 3_600_000.0;
            if hours > 0.0 {
                let mut ledger = lock(&self.inner.ledger);
                for view in instances {
                    accounting::meter_instance(&mut state, &mut ledger, view, hours, now);
                }
                drop(ledger);
                let mut charges: HashMap<Owner, u64> = HashMap::new();
                for view in instances {
                    let Some(owner) = view.run.as_ref().and_then(|r| state.runs.get(r)) else {
                        continue;
                    };
                    *charges.entry(owner.clone()).or_default() += view.held.iter().map(|(_, b)| b).sum::<u64>();
                }
                for (owner, bytes) in charges {
                    let amount = bytes as f64 / GIB * hours;
                    state
                        .accounts
                        .charge(&owner.group, &owner.user, amount, now, self.inner.half_life);
                }
            }
            let due = state
                .saved_at
                .is_none_or(|at| now.0 - at.0 >= USAGE_SAVE_INTERVAL.as_millis() as i64);
            if due {
                state.saved_at = Some(now);
                for (name, account) in &state.accounts.groups {
                    batch.put(&self.inner.usage, name, account);
                }
            }
            write_ledger = state
                .ledger_written_at
                .is_none_or(|at| now.0 - at.0 >= LEDGER_WRITE_INTERVAL.as_millis() as i64);
            if write_ledger {
                state.ledger_written_at = Some(now);
            }
        }
        if !batch.is_empty() {
            self.inner.usage.db().commit(batch).await?;
        }
        if write_ledger {
            self.write_usage().await?;
        }
        Ok(())
    }
}

/// Checks that one more of a count `limit` keeps `owner` and their group within it:
/// `mine` and `ours` are each (allowed, in use).
///
/// Errors: the [`Refusal`] of the first limit it would pass.
fn one_more(
    limit: Limit,
    owner: &Owner,
    mine: (Option<u32>, u32),
    ours: (Option<u32>, u32),
    frees: &str,
) -> Result<(), Refusal> {
    let checks = [
        (Scope::User(owner.user.clone()), mine),
        (Scope::Group(owner.group.clone()), ours),
    ];
    for (scope, (allowed, in_use)) in checks {
        if let Some(refusal) = within(limit, &scope, allowed.map(f64::from), f64::from(in_use), 1.0, frees) {
            return Err(refusal);
        }
    }
    Ok(())
}

/// What the instances of `owner`'s runs hold, and of their group's.
fn held_by(state: &State, owner: &Owner, instances: &[InstanceView]) -> (GpuUse, GpuUse) {
    let mut mine = GpuUse::default();
    let mut ours = GpuUse::default();
    for view in instances {
        let Some(holder) = view.run.as_ref().and_then(|r| state.runs.get(r)) else {
            continue;
        };
        for &(gpu, bytes) in &view.held {
            if holder.group == owner.group {
                ours.add(&view.node_name, gpu, bytes);
                if holder.user == owner.user {
                    mine.add(&view.node_name, gpu, bytes);
                }
            }
        }
    }
    (mine, ours)
}

/// Shares and limits after a change (`shares` and `limits` set, `clear` lifted), checked;
/// `whose` names them in the error.
fn changed(
    current_shares: u32,
    current: &Limits,
    shares: Option<u32>,
    limits: &Limits,
    clear: &[Limit],
    whose: &str,
) -> Result<(u32, Limits), SharingError> {
    let limits = current.merged(limits, clear);
    limits.check(whose).map_err(SharingError::Invalid)?;
    Ok((shares.unwrap_or(current_shares), limits))
}

fn default_group() -> GroupRecord {
    GroupRecord {
        name: DEFAULT_GROUP.to_owned(),
        shares: 1,
        limits: Limits::default(),
        created_at: UnixMs(0),
        updated_at: UnixMs(0),
    }
}

fn check_name(what: &str, name: &str) -> Result<(), SharingError> {
    crate::auth::check_user(name)
        .map_err(|_| SharingError::Invalid(format!(
            "{what} name `{}` is not allowed: use 1 to 64 lowercase letters, digits, `-`, `_` or `.`, starting with a letter or digit",
            name.chars().take(80).collect::<String>()
        )))
}

fn check_shares(shares: Option<u32>) -> Result<(), SharingError> {
    match shares {
        Some(shares) if shares == 0 || shares > MAX_SHARES => Err(SharingError::Invalid(format!(
            "shares must be 1 to {MAX_SHARES}, not {shares}"
        ))),
        _ => Ok(()),
    }
}
