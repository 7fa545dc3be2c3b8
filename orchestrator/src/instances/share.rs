//! Sharing instances: who used one and which run it serves, warm instances claimed by
//! runs, picks and shares among replicas, idle and orphaned instances stopped.

use crate::base::lock;
use crate::load::Load;

use super::{Entry, InstanceState, InstanceView, Instances, ORPHAN_GRACE};

impl Instances {
    /// `user` sent the instance a request (a step of their run, a turn of their
    /// session, a completion): it is theirs to read about from now on, with the others
    /// who used it ([`Instances::log_readers`]).
    pub fn used_by(&self, name: &str, user: &str) {
        if let Some(entry) = lock(&self.entries).get_mut(name)
            && !entry.users.contains(user)
        {
            entry.users.insert(user.to_owned());
        }
    }

    /// A request of `run`'s agent went to the instance `name` (a session on the run's
    /// agent, a call of the agent by name): the run is among its
    /// [`InstanceView::runs`] from now on.
    pub fn served_run(&self, name: &str, run: &str) {
        let added = match lock(&self.entries).get_mut(name) {
            Some(entry) if !entry.view.runs.iter().any(|r| r == run) => {
                entry.view.runs.push(run.to_owned());
                true
            }
            _ => false,
        };
        if added {
            self.bump();
        }
    }

    /// Claims for `run` a ready instance no run uses whose [`InstanceView::warm_key`]
    /// is `warm_key` and that `usable` accepts (one off drained GPUs).
    pub fn claim(&self, warm_key: &str, run: &str, usable: impl Fn(&InstanceView) -> bool) -> Option<InstanceView> {
        let mut entries = lock(&self.entries);
        let entry = entries.values_mut().find(|e| {
            e.view.idle_since.is_some()
                && e.view.state == InstanceState::Ready
                && e.view.warm_key == warm_key
                && usable(&e.view)
        })?;
        entry.view.run = Some(run.to_owned());
        entry.view.idle_since = None;
        if !entry.view.runs.iter().any(|r| r == run) {
            entry.view.runs.push(run.to_owned());
        }
        Some(entry.view.clone())
    }

    /// The serving figures of every instance.
    pub fn load(&self) -> &Load {
        &self.load
    }

    /// Every instance `wanted` accepts, in name order.
    pub fn filter(&self, wanted: impl Fn(&InstanceView) -> bool) -> Vec<InstanceView> {
        lock(&self.entries)
            .values()
            .map(|e| &e.view)
            .filter(|v| wanted(v))
            .cloned()
            .collect()
    }

    /// The replica of `agent` of `run` that takes the next new session or request: among
    /// the ready ones, by their shares (smooth weighted round robin, so that shares of
    /// 1 and 3 send every fourth to the first); when every share is 0, any ready one.
    pub fn pick(&self, run: &str, agent: &str) -> Option<InstanceView> {
        let mut entries = lock(&self.entries);
        let mut ready: Vec<&mut Entry> = entries
            .values_mut()
            .filter(|e| {
                e.view.run.as_deref() == Some(run)
                    && e.view.agents.iter().any(|a| a == agent)
                    && e.view.state == InstanceState::Ready
                    && e.view.base_url.is_some()
            })
            .collect();
        let total: f64 = ready.iter().map(|e| e.view.share.max(0.0)).sum();
        if total <= 0.0 {
            return ready.first().map(|e| e.view.clone());
        }
        for entry in &mut ready {
            entry.credit += entry.view.share.max(0.0);
        }
        let chosen = ready
            .into_iter()
            .filter(|e| e.view.share > 0.0)
            .max_by(|a, b| a.credit.total_cmp(&b.credit))?;
        chosen.credit -= total;
        Some(chosen.view.clone())
    }

    /// Sets an instance's [`InstanceView::share`]; returns whether it exists.
    pub fn set_share(&self, name: &str, share: f64) -> bool {
        let found = match lock(&self.entries).get_mut(name) {
            Some(entry) => {
                entry.view.share = share;
                entry.credit = 0.0;
                true
            }
            None => false,
        };
        if found {
            self.bump();
        }
        found
    }

    /// The first instance (in name order) `wanted` accepts.
    pub fn find(&self, wanted: impl Fn(&InstanceView) -> bool) -> Option<InstanceView> {
        lock(&self.entries)
            .values()
            .map(|e| &e.view)
            .find(|v| wanted(v))
            .cloned()
    }

    /// Someone (a session) uses the instance: an idle one stays warm from now on, and one
    /// reported after a restart that no run claimed is adopted as warm instead of being
    /// stopped. Returns it.
    pub fn touch(&self, name: &str) -> Option<InstanceView> {
        let mut entries = lock(&self.entries);
        let entry = entries.get_mut(name)?;
        if entry.orphan_since.take().is_some() || entry.view.idle_since.is_some() {
            entry.view.idle_since = Some(std::time::Instant::now());
        }
        Some(entry.view.clone())
    }

    /// The run using an instance ended: it stays warm for the next run that needs the
    /// same (see [`Instances::stop_idle`]).
    pub fn release(&self, name: &str) {
        if let Some(entry) = lock(&self.entries).get_mut(name) {
            entry.view.run = None;
            entry.view.idle_since = Some(std::time::Instant::now());
        }
        self.bump();
    }

    /// Stops instances no run has used for `keep` (all idle ones with a zero `keep`).
    /// Returns how many were stopped.
    pub fn stop_idle(&self, keep: std::time::Duration) -> usize {
        let idle: Vec<String> = lock(&self.entries)
            .iter()
            .filter(|(_, e)| e.view.idle_since.is_some_and(|since| since.elapsed() >= keep))
            .map(|(name, _)| name.clone())
            .collect();
        for name in &idle {
            tracing::info!(instance = %name, "stopping an idle instance");
            let _ = self.stop(name);
        }
        idle.len()
    }

    /// Stops the instances no run claimed within [`ORPHAN_GRACE`] of being reported.
    pub fn stop_orphans(&self) {
        let expired: Vec<String> = lock(&self.entries)
            .iter()
            .filter(|(_, e)| e.orphan_since.is_some_and(|since| since.elapsed() >= ORPHAN_GRACE))
            .map(|(name, _)| name.clone())
            .collect();
        for name in expired {
            tracing::info!(instance = %name, "stopping an instance no run claimed");
            let _ = self.stop(&name);
        }
    }
}
