//! GPU-hours by hour: what a `gpu_hours` limit is checked against, over its period (the
//! last N hours, up to [`MAX_PERIOD_HOURS`]).
//!
//! Each user and group has an [`HourWindow`]: the GPU-hours metered in each hour of the
//! last 31 days. It is filled from the store's usage records when the server starts and
//! by every metering after, so a restart forgets none of the period.

use std::collections::BTreeMap;
use std::time::Duration;

use super::quota::{Limit, Limits, MAX_PERIOD_HOURS, Refusal, Scope};
use super::usage::{Counts, HOUR_MS, Key, hour_prefix};
use super::{Owner, State};
use crate::base::UnixMs;
use crate::store::{StoreError, Tree};

/// GPU-hours by hour since the epoch, for the last [`MAX_PERIOD_HOURS`].
#[derive(Debug, Default, Clone, PartialEq)]
pub struct HourWindow {
    hours: BTreeMap<i64, f64>,
}

impl HourWindow {
    /// Counts `gpu_hours` in `hour` (hours since the epoch).
    pub fn add(&mut self, hour: i64, gpu_hours: f64) {
        if gpu_hours > 0.0 {
            *self.hours.entry(hour).or_default() += gpu_hours;
        }
    }

    /// The GPU-hours of the `period` hours up to `now`'s (its hour included).
    pub fn used(&self, now: UnixMs, period: u32) -> f64 {
        let hour = now.0.div_euclid(HOUR_MS);
        self.hours.range(first_hour(hour, period)..).map(|(_, h)| h).sum()
    }

    /// How long after `now` the period's GPU-hours fall below `allowed`, as its oldest
    /// hours leave it (zero when they are below it now).
    pub fn frees_in(&self, now: UnixMs, period: u32, allowed: f64) -> Duration {
        let hour = now.0.div_euclid(HOUR_MS);
        let mut used = self.used(now, period);
        for (&at, &gpu_hours) in self.hours.range(first_hour(hour, period)..) {
            if used < allowed {
                break;
            }
            used -= gpu_hours;
            if used < allowed {
                // Hour `at` leaves the window when hour `at + period` begins.
                let leaves = (at + i64::from(period)) * HOUR_MS;
                return Duration::from_millis(u64::try_from(leaves - now.0).unwrap_or(0));
            }
        }
        Duration::ZERO
    }

    /// Drops hours older than any period at `now`; whether nothing is left.
    pub fn expire(&mut self, now: UnixMs) -> bool {
        let keep = first_hour(now.0.div_euclid(HOUR_MS), MAX_PERIOD_HOURS);
        self.hours = self.hours.split_off(&keep);
        self.hours.is_empty()
    }
}

/// The first hour of the `period` hours that end with `hour`.
fn first_hour(hour: i64, period: u32) -> i64 {
    hour - i64::from(period.max(1)) + 1
}

/// A duration for people: `40 min`, `3 h 20 min`, `2 d 5 h`.
pub fn for_people(duration: Duration) -> String {
    let minutes = duration.as_secs().div_ceil(60).max(1);
    match minutes {
        m if m < 60 => format!("{m} min"),
        m if m < 48 * 60 => format!("{} h {} min", m / 60, m % 60),
        m => format!("{} d {} h", m / (24 * 60), m / 60 % 24),
    }
}

impl State {
    /// Counts `gpu_hours` of `owner` in `now`'s hour.
    pub(super) fn add_gpu_hours(&mut self, owner: &Owner, now: UnixMs, gpu_hours: f64) {
        let hour = now.0.div_euclid(HOUR_MS);
        self.user_gpu_hours
            .entry(owner.user.clone())
            .or_default()
            .add(hour, gpu_hours);
        self.group_gpu_hours
            .entry(owner.group.clone())
            .or_default()
            .add(hour, gpu_hours);
        // Once an hour, hours past every period go (and windows left empty).
        if self.gpu_hours_expired_at != hour {
            self.gpu_hours_expired_at = hour;
            self.user_gpu_hours.retain(|_, w| !w.expire(now));
            self.group_gpu_hours.retain(|_, w| !w.expire(now));
        }
    }

    /// The GPU-hours window of `scope`, if it used any.
    fn gpu_hours_of(&self, scope: &Scope) -> Option<&HourWindow> {
        match scope {
            Scope::User(name) => self.user_gpu_hours.get(name),
            Scope::Group(name) => self.group_gpu_hours.get(name),
        }
    }

    /// The GPU-hours `scope` used in its limit's period before `now`.
    pub(super) fn gpu_hours_used(&self, scope: &Scope, limits: &Limits, now: UnixMs) -> f64 {
        self.gpu_hours_of(scope)
            .map_or(0.0, |w| w.used(now, limits.period_hours()))
    }

    /// Refuses when `scope` used its GPU-hours of the period at `now`.
    pub(super) fn check_gpu_hours(&self, scope: &Scope, limits: &Limits, now: UnixMs) -> Result<(), Refusal> {
        let (Some(allowed), Some(window)) = (limits.gpu_hours, self.gpu_hours_of(scope)) else {
            return Ok(());
        };
        let period = limits.period_hours();
        let used = window.used(now, period);
        if used < allowed {
            return Ok(());
        }
        let after = window.frees_in(now, period, allowed);
        Err(Refusal {
            limit: Limit::GpuHours,
            scope: scope.clone(),
            allowed,
            in_use: used,
            asked: 0.0,
            frees: format!(
                "the period is the last {}, and enough of it ages out in {}; the run waits until then",
                period_for_people(period),
                for_people(after)
            ),
            retry_after: Some(after),
        })
    }
}

/// Fills the GPU-hours windows of `state` from the usage records of the last
/// [`MAX_PERIOD_HOURS`] before `now` in `hours`.
///
/// Errors: the store fails.
pub(super) fn load(hours: &Tree<Counts>, state: &mut State, now: UnixMs) -> Result<(), StoreError> {
    let hour = now.0.div_euclid(HOUR_MS);
    let from = hour_prefix(first_hour(hour, MAX_PERIOD_HOURS));
    let to = hour_prefix(hour + 1);
    for entry in hours.between(&from, &to) {
        let (stored, counts) = entry?;
        if counts.gpu_hours <= 0.0 {
            continue;
        }
        if let Some(key) = Key::parse(&stored) {
            let windows = [
                (&mut state.user_gpu_hours, key.user),
                (&mut state.group_gpu_hours, key.group),
            ];
            for (windows, name) in windows {
                windows.entry(name).or_default().add(key.hour, counts.gpu_hours);
            }
        }
    }
    state.gpu_hours_expired_at = hour;
    Ok(())
}

/// A period of hours for people: `7 days`, `36 hours`, `1 hour`.
fn period_for_people(hours: u32) -> String {
    match hours {
        1 => "hour".to_owned(),
        h if h % 24 == 0 && h > 24 => format!("{} days", h / 24),
        24 => "day".to_owned(),
        h => format!("{h} hours"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(hour: i64, minute: i64) -> UnixMs {
        UnixMs(hour * HOUR_MS + minute * 60_000)
    }

    #[test]
    fn the_window_sums_the_period_and_says_when_enough_of_it_ages_out() {
        let mut window = HourWindow::default();
        window.add(100, 4.0);
        window.add(110, 3.0);
        window.add(120, 2.0);
        // A 24-hour period at 120:30 holds hours 97..=120: all 9 GPU-hours.
        assert_eq!(window.used(at(120, 30), 24), 9.0);
        // A 12-hour period holds 109..=120.
        assert_eq!(window.used(at(120, 30), 12), 5.0);
        // Below 8 once hour 100 leaves: when hour 124 begins, 3 h 30 min from now.
        assert_eq!(
            window.frees_in(at(120, 30), 24, 8.0),
            Duration::from_secs(3 * 3600 + 30 * 60)
        );
        // Below 3 once hour 110 leaves too (at 134:00).
        assert_eq!(
            window.frees_in(at(120, 30), 24, 3.0),
            Duration::from_secs(13 * 3600 + 30 * 60)
        );
        assert_eq!(window.frees_in(at(120, 30), 24, 10.0), Duration::ZERO);
        // The hour in progress alone: when the period has moved past it.
        let mut busy = HourWindow::default();
        busy.add(120, 5.0);
        assert_eq!(busy.frees_in(at(120, 0), 2, 1.0), Duration::from_secs(2 * 3600));
        // Hours beyond the longest period go.
        assert!(!window.expire(at(120 + 743, 0)));
        assert_eq!(window.used(at(120 + 743, 0), MAX_PERIOD_HOURS), 2.0);
        assert!(window.expire(at(120 + 744, 0)));
    }

    #[test]
    fn durations_read_for_people() {
        assert_eq!(for_people(Duration::from_secs(10)), "1 min");
        assert_eq!(for_people(Duration::from_secs(3 * 3600 + 20 * 60)), "3 h 20 min");
        assert_eq!(for_people(Duration::from_secs(53 * 3600)), "2 d 5 h");
    }
}
