//! Usage accounting in [`Sharing`]: model calls, run time and metered GPU use added to
//! the [`Ledger`], written to the store's `usage_hours` tree, and summed for
//! `GET /v1/usage` ([`usage`](super::usage) holds the pure parts).

use std::fmt::Write as _;

use super::quota::{Limit, Refusal, Scope, TokenWindow};
use super::usage::{Counts, Key, Ledger, Query, Row, hour_prefix, summarize};
use super::{GIB, Sharing, State};
use crate::base::{UnixMs, lock, unix_ms};
use crate::engine_client::Usage;
use crate::instances::InstanceView;
use crate::store::{StoreError, WriteBatch};

/// Where one caller's model calls to one model (for one agent) are counted: cheap to
/// clone, handed to what makes the calls.
#[derive(Debug, Clone)]
pub struct Tap {
    sharing: Sharing,
    user: String,
    model: String,
    agent: String,
}

impl Tap {
    /// Counts one model call that answered, with the tokens its engine reported.
    pub fn call(&self, usage: Option<Usage>) {
        self.sharing
            .record_call(&self.user, &self.model, &self.agent, usage, unix_ms());
    }
}

impl Sharing {
    /// A [`Tap`] counting `user`'s calls to `model` for `agent` (empty: none).
    pub fn tap(&self, user: &str, model: &str, agent: &str) -> Tap {
        Tap {
            sharing: self.clone(),
            user: user.to_owned(),
            model: model.to_owned(),
            agent: agent.to_owned(),
        }
    }

    /// Counts a model call of `user` to `model` for `agent` at `now`.
    pub fn record_call(&self, user: &str, model: &str, agent: &str, usage: Option<Usage>, now: UnixMs) {
        let group = lock(&self.inner.state).owner(user).group;
        self.add_usage(&group, user, model, agent, &call_counts(usage), now);
    }

    /// [`Sharing::record_call`] of a call on the OpenAI or Anthropic routes or in a
    /// session: its tokens count against the tokens-per-minute limits too.
    pub fn record_api_call(&self, user: &str, model: &str, agent: &str, usage: Option<Usage>, now: UnixMs) {
        let counts = call_counts(usage);
        let tokens = counts.tokens_in + counts.tokens_out;
        let group = {
            let mut state = lock(&self.inner.state);
            let group = state.owner(user).group;
            state.user_tokens.entry(user.to_owned()).or_default().add(now, tokens);
            state.group_tokens.entry(group.clone()).or_default().add(now, tokens);
            // Windows of users idle for a minute go.
            if state.user_tokens.len() > 1024 {
                state.user_tokens.retain(|_, w| !w.is_empty());
            }
            group
        };
        self.add_usage(&group, user, model, agent, &counts, now);
    }

    /// Checks that `user` and their group are below their tokens-per-minute limits at
    /// `now` (a request is let in while the last minute's tokens are below them).
    ///
    /// Errors: the [`Refusal`] of the limit reached, with when it frees.
    pub fn check_tokens(&self, user: &str, now: UnixMs) -> Result<(), Refusal> {
        let mut state = lock(&self.inner.state);
        let owner = state.owner(user);
        let checks = [
            (
                Scope::User(owner.user.clone()),
                state.user_limits(user).tokens_per_minute,
            ),
            (
                Scope::Group(owner.group.clone()),
                state.group_limits(&owner.group).tokens_per_minute,
            ),
        ];
        for (scope, allowed) in checks {
            let Some(allowed) = allowed else { continue };
            let window = match &scope {
                Scope::User(name) => state.user_tokens.get_mut(name),
                Scope::Group(name) => state.group_tokens.get_mut(name),
            };
            let Some(window) = window else { continue };
            let used = window.used(now);
            if used < allowed {
                continue;
            }
            let after = window.frees_in(now, allowed).max(std::time::Duration::from_secs(1));
            return Err(Refusal {
                limit: Limit::TokensPerMinute,
                scope,
                allowed: allowed as f64,
                in_use: used as f64,
                asked: 0.0,
                frees: format!(
                    "it frees in {} s, as the last minute's requests age out (see Retry-After)",
                    after.as_secs().max(1)
                ),
                retry_after: Some(after),
            });
        }
        Ok(())
    }

    /// The tokens `user` (or, with `None`, `group`) used in the minute before `now`.
    pub fn tokens_last_minute(&self, user: Option<&str>, group: &str, now: UnixMs) -> u64 {
        let mut state = lock(&self.inner.state);
        let window: Option<&mut TokenWindow> = match user {
            Some(user) => state.user_tokens.get_mut(user),
            None => state.group_tokens.get_mut(group),
        };
        window.map_or(0, |w| w.used(now))
    }

    /// Counts `seconds` of a run of `user`, ended at `now`.
    pub fn record_run_time(&self, user: &str, seconds: f64, now: UnixMs) {
        let counts = Counts {
            run_seconds: seconds.max(0.0),
            ..Counts::default()
        };
        let group = lock(&self.inner.state).owner(user).group;
        self.add_usage(&group, user, "", "", &counts, now);
    }

    fn add_usage(&self, group: &str, user: &str, model: &str, agent: &str, counts: &Counts, now: UnixMs) {
        lock(&self.inner.ledger).add(Key::at(now, group, user, model, agent), counts);
    }

    /// Sums the usage `query` asks for: what is stored and what is not written yet.
    ///
    /// Errors: the store fails.
    pub async fn usage(&self, query: &Query) -> Result<Vec<Row>, StoreError> {
        // No write in progress: each count is in the store or in the ledger, once.
        let _writes = self.inner.usage_writes.lock().await;
        let mut records: Vec<(Key, Counts)> = lock(&self.inner.ledger)
            .pending()
            .filter(|(key, _)| query.takes(key))
            .map(|(key, counts)| (key.clone(), *counts))
            .collect();
        let hours = self.inner.hours.clone();
        let query = query.clone();
        let summed = tokio::task::spawn_blocking(move || {
            let from = hour_prefix(query.since.0.div_euclid(super::usage::HOUR_MS));
            let to = hour_prefix(query.until.0.div_euclid(super::usage::HOUR_MS) + 1);
            for entry in hours.between(&from, &to) {
                let (stored, counts) = entry?;
                if let Some(key) = Key::parse(&stored) {
                    records.push((key, counts));
                }
            }
            Ok(summarize(records, &query))
        })
        .await;
        summed.unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()))
    }

    /// Writes what the ledger counted since its last write, added to the stored
    /// records of its keys; what cannot be written stays in the ledger.
    ///
    /// Errors: the store fails.
    pub async fn write_usage(&self) -> Result<(), StoreError> {
        let _writes = self.inner.usage_writes.lock().await;
        let taken = lock(&self.inner.ledger).take();
        if taken.is_empty() {
            return Ok(());
        }
        let written = async {
            let mut batch = WriteBatch::new();
            for (key, counts) in &taken {
                let name = key.stored();
                let mut total = self.inner.hours.get(&name)?.unwrap_or_default();
                total.add(counts);
                batch.put(&self.inner.hours, &name, &total);
            }
            self.inner.hours.db().commit(batch).await
        }
        .await;
        if written.is_err() {
            lock(&self.inner.ledger).restore(taken);
        }
        written
    }

    /// The usage totals since the server started, by group and user, in the
    /// Prometheus text format (appended to `out`).
    pub fn usage_metrics(&self, out: &mut String) {
        let totals = lock(&self.inner.ledger).totals().clone();
        type Figure = fn(&Counts) -> f64;
        let figures: [(&str, &str, Option<&str>, Figure); 6] = [
            ("skein_usage_requests_total", "Model calls.", None, |c| {
                c.requests as f64
            }),
            (
                "skein_usage_tokens_total",
                "Tokens, in (prompt) and out (generated).",
                Some("in"),
                |c| c.tokens_in as f64,
            ),
            ("skein_usage_tokens_total", "", Some("out"), |c| c.tokens_out as f64),
            (
                "skein_usage_gpu_memory_gib_hours_total",
                "GPU memory reserved × time, GiB-hours.",
                None,
                |c| c.gib_hours,
            ),
            (
                "skein_usage_gpu_hours_total",
                "GPUs held × time, GPU-hours.",
                None,
                |c| c.gpu_hours,
            ),
            (
                "skein_usage_run_seconds_total",
                "Runs' time from start to end, seconds.",
                None,
                |c| c.run_seconds,
            ),
        ];
        for (name, help, direction, figure) in figures {
            if !help.is_empty() {
                let _ = writeln!(
                    out,
                    "# HELP {name} {help} Since the server started.\n# TYPE {name} counter"
                );
            }
            for ((group, user), counts) in &totals {
                let direction = direction.map(|d| format!(",direction=\"{d}\"")).unwrap_or_default();
                let _ = writeln!(
                    out,
                    "{name}{{group=\"{}\",user=\"{}\"{direction}}} {}",
                    label(group),
                    label(user),
                    figure(counts)
                );
            }
        }
    }
}

/// A model call that answered, with the tokens its engine reported.
fn call_counts(usage: Option<Usage>) -> Counts {
    let usage = usage.unwrap_or_default();
    Counts {
        requests: 1,
        tokens_in: usage.prompt_tokens,
        tokens_out: usage.completion_tokens,
        ..Counts::default()
    }
}

/// Charges the GPU memory and GPUs `view` holds for `hours` to its run's owner (under
/// its model and agents) in `ledger` and in its GPU-hours windows, at `now`.
pub(super) fn meter_instance(state: &mut State, ledger: &mut Ledger, view: &InstanceView, hours: f64, now: UnixMs) {
    let Some(owner) = view.run.as_ref().and_then(|r| state.runs.get(r)).cloned() else {
        return;
    };
    let bytes: u64 = view.held.iter().map(|(_, b)| b).sum();
    let counts = Counts {
        gib_hours: bytes as f64 / GIB * hours,
        gpu_hours: view.held.len() as f64 * hours,
        ..Counts::default()
    };
    state.add_gpu_hours(&owner, now, counts.gpu_hours);
    let key = Key::at(now, &owner.group, &owner.user, &view.variant, &view.agents.join(","));
    ledger.add(key, &counts);
}

/// The model `route` serves, as usage counts it: an instance's variant (the
/// repository it runs), or an endpoint's model.
pub fn model_served(instances: &crate::instances::Instances, route: &crate::engine_client::Route) -> String {
    route
        .instance
        .as_ref()
        .and_then(|name| instances.get(name))
        .map_or_else(|| route.model.clone(), |view| view.variant)
}

/// A Prometheus label value, escaped.
fn label(value: &str) -> String {
    value.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}
