//! The sessions limit: sessions made and not deleted, by user, checked and counted in
//! one step when a session is made (docs/sharing.md, "Quotas").
//!
//! A user's count lives here from the server's start (counted from the session store)
//! and follows every create and delete. A group's is its members' counts added up: a
//! user who moves takes their sessions with them.

use std::collections::HashMap;

use super::quota::{Limit, Refusal};
use super::{Sharing, State, one_more};
use crate::base::lock;

impl State {
    /// The sessions `user` (or, with `None`, `group`'s members) have.
    pub(super) fn sessions_of(&self, user: Option<&str>, group: &str) -> u32 {
        match user {
            Some(user) => self.user_sessions.get(user).copied().unwrap_or(0),
            None => self.group_sessions(group),
        }
    }

    /// The sessions of the members of `group` now.
    fn group_sessions(&self, group: &str) -> u32 {
        self.user_sessions
            .iter()
            .filter(|(user, _)| self.owner(user).group == group)
            .map(|(_, count)| count)
            .sum()
    }
}

impl Sharing {
    /// Sets the sessions each user has (the session store's count, at the start).
    pub fn load_sessions(&self, counts: HashMap<String, u32>) {
        lock(&self.inner.state).user_sessions = counts;
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
        let ours = state.group_sessions(&owner.group);
        let frees = "it frees when one of those sessions is deleted (`DELETE /v1/sessions/{id}`; `GET /v1/sessions` lists them)";
        one_more(
            Limit::Sessions,
            &owner,
            (state.user_limits(user).sessions, mine),
            (state.group_limits(&owner.group).sessions, ours),
            frees,
        )?;
        *state.user_sessions.entry(user.to_owned()).or_default() += 1;
        Ok(())
    }

    /// A session of `user` was deleted (or not made after all).
    pub fn release_session(&self, user: &str) {
        let mut state = lock(&self.inner.state);
        if let Some(count) = state.user_sessions.get_mut(user) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                state.user_sessions.remove(user);
            }
        }
    }
}
