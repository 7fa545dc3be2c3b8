//! The sessions limit: sessions made and not deleted, by user, checked and counted in
//! one step when a session is made (docs/sharing.md, "Quotas").
//!
//! A user's count lives here from the server's start (counted from the session store)
//! and follows every create and delete. A group's is its members' counts added up, kept
//! beside them: a user who moves takes their sessions with them (`move_sessions`).

use std::collections::HashMap;

use super::quota::{Limit, Refusal};
use super::{Sharing, State, one_more};
use crate::base::lock;

impl State {
    /// The sessions `user` (or, with `None`, `group`'s members) have.
    pub(super) fn sessions_of(&self, user: Option<&str>, group: &str) -> u32 {
        match user {
            Some(user) => self.user_sessions.get(user).copied().unwrap_or(0),
            None => self.group_sessions.get(group).copied().unwrap_or(0),
        }
    }

    /// `user` moved from group `from` to `to`: their sessions count in `to` now.
    pub(super) fn move_sessions(&mut self, user: &str, from: &str, to: &str) {
        let Some(&count) = self.user_sessions.get(user) else {
            return;
        };
        if from != to {
            take(&mut self.group_sessions, from, count);
            *self.group_sessions.entry(to.to_owned()).or_default() += count;
        }
    }
}

/// Takes `count` from `key`'s count in `counts` (dropping it at zero).
fn take(counts: &mut HashMap<String, u32>, key: &str, count: u32) {
    if let Some(held) = counts.get_mut(key) {
        *held = held.saturating_sub(count);
        if *held == 0 {
            counts.remove(key);
        }
    }
}

impl Sharing {
    /// Sets the sessions each user has (the session store's count, at the start).
    pub fn load_sessions(&self, counts: HashMap<String, u32>) {
        let mut state = lock(&self.inner.state);
        let mut groups: HashMap<String, u32> = HashMap::new();
        for (user, count) in &counts {
            *groups.entry(state.owner(user).group).or_default() += count;
        }
        state.user_sessions = counts;
        state.group_sessions = groups;
    }

    /// Counts a new session of `user` against the sessions limits of the user and
    /// their group. The check and the count are one step under one lock: however
    /// creates interleave, no user or group passes its limit. Give it back with
    /// [`Sharing::release_session`] when the session is not made after all, or
    /// deleted.
    ///
    /// Errors: the [`Refusal`] of the limit it would pass.
    pub fn reserve_session(&self, user: &str) -> Result<(), Refusal> {
        let mut state = lock(&self.inner.state);
        let owner = state.owner(user);
        let mine = state.user_sessions.get(user).copied().unwrap_or(0);
        let ours = state.sessions_of(None, &owner.group);
        let frees = "it frees when one of those sessions is deleted (`DELETE /v1/sessions/{id}`; `GET /v1/sessions` lists them)";
        one_more(
            Limit::Sessions,
            &owner,
            (state.user_limits(user).sessions, mine),
            (state.group_limits(&owner.group).sessions, ours),
            frees,
        )?;
        *state.user_sessions.entry(user.to_owned()).or_default() += 1;
        *state.group_sessions.entry(owner.group).or_default() += 1;
        Ok(())
    }

    /// A session of `user` was deleted (or not made after all).
    pub fn release_session(&self, user: &str) {
        let mut state = lock(&self.inner.state);
        if !state.user_sessions.contains_key(user) {
            return;
        }
        let group = state.owner(user).group;
        take(&mut state.user_sessions, user, 1);
        take(&mut state.group_sessions, &group, 1);
    }
}
