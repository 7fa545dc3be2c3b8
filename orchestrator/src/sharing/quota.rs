//! Quotas (pure): what a group or a user may use at once (and in a minute, of tokens),
//! the refusal that names the limit, the current use and when it frees, and the
//! [`TokenWindow`] that counts the last minute's tokens.

use std::collections::VecDeque;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::base::UnixMs;

/// Limits of a group or a user; an absent limit is no limit. A user is held to their own
/// limits and to their group's (the group's count everything its members use).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    /// GPU memory reserved at once, GiB (Skein shares GPUs, so memory is the measure).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_gib: Option<f64>,
    /// GPUs in use at once (a GPU counts once however many instances share it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpus: Option<u32>,
    /// Runs in progress (queued or running) at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runs: Option<u32>,
    /// Tokens (prompt and generated) in any minute, on the OpenAI and Anthropic routes
    /// and in sessions. A request is refused once the last minute's reach the limit, so
    /// the one let in last may pass it by its own tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens_per_minute: Option<u64>,
    /// Sessions made and not deleted yet, at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sessions: Option<u32>,
    /// GPU-hours (GPUs held × time) in the last [`Limits::gpu_hours_period_hours`]: a
    /// run is admitted while they are below it (one admitted may pass it as it runs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_hours: Option<f64>,
    /// The period `gpu_hours` counts over, hours (1 to [`MAX_PERIOD_HOURS`]; a week
    /// when left out).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_hours_period_hours: Option<u32>,
}

/// The most a limit may be set to: far beyond any fleet, small enough to stay exact.
const MAX_GIB: f64 = 1e9;

/// The longest GPU-hours period: 31 days (usage of the last 31 days is kept in memory).
pub const MAX_PERIOD_HOURS: u32 = 31 * 24;

/// The GPU-hours period when none is set: a week.
pub const DEFAULT_PERIOD_HOURS: u32 = 7 * 24;

impl Limits {
    /// Checks the figures: `what` names whose limits they are, for the message.
    ///
    /// Errors: a limit that is not a positive finite number (or zero runs/GPUs, which
    /// would refuse everything: remove the user from the group instead).
    pub fn check(&self, what: &str) -> Result<(), String> {
        for (name, unit, amount) in [
            ("gpu_gib", "GiB", self.gpu_gib),
            ("gpu_hours", "GPU-hours", self.gpu_hours),
        ] {
            if let Some(amount) = amount
                && !(amount.is_finite() && amount > 0.0 && amount <= MAX_GIB)
            {
                return Err(format!(
                    "{what}: `{name}` must be a number of {unit} above 0 and at most {MAX_GIB}, not {amount}"
                ));
            }
        }
        if let Some(period) = self.gpu_hours_period_hours {
            if !(1..=MAX_PERIOD_HOURS).contains(&period) {
                return Err(format!(
                    "{what}: `gpu_hours_period_hours` must be 1 to {MAX_PERIOD_HOURS} (31 days), not {period}"
                ));
            }
            if self.gpu_hours.is_none() {
                return Err(format!(
                    "{what}: `gpu_hours_period_hours` is the period of a `gpu_hours` limit: set `gpu_hours` too"
                ));
            }
        }
        let counts = [
            ("gpus", self.gpus.map(u64::from)),
            ("runs", self.runs.map(u64::from)),
            ("tokens_per_minute", self.tokens_per_minute),
            ("sessions", self.sessions.map(u64::from)),
        ];
        for (name, value) in counts {
            if value == Some(0) {
                return Err(format!(
                    "{what}: `{name}` must be at least 1 (0 would refuse everything); to lift the limit, leave it out"
                ));
            }
        }
        Ok(())
    }

    /// These limits with `update`'s set ones in place (`clear` names those to lift).
    pub fn merged(&self, update: &Limits, clear: &[Limit]) -> Limits {
        let mut merged = Limits {
            gpu_gib: update.gpu_gib.or(self.gpu_gib),
            gpus: update.gpus.or(self.gpus),
            runs: update.runs.or(self.runs),
            tokens_per_minute: update.tokens_per_minute.or(self.tokens_per_minute),
            sessions: update.sessions.or(self.sessions),
            gpu_hours: update.gpu_hours.or(self.gpu_hours),
            gpu_hours_period_hours: update.gpu_hours_period_hours.or(self.gpu_hours_period_hours),
        };
        for limit in clear {
            match limit {
                Limit::GpuGib => merged.gpu_gib = None,
                Limit::Gpus => merged.gpus = None,
                Limit::Runs => merged.runs = None,
                Limit::TokensPerMinute => merged.tokens_per_minute = None,
                Limit::Sessions => merged.sessions = None,
                // The period goes with the limit it is the period of.
                Limit::GpuHours => (merged.gpu_hours, merged.gpu_hours_period_hours) = (None, None),
            }
        }
        merged
    }

    /// The period `gpu_hours` counts over, hours.
    pub fn period_hours(&self) -> u32 {
        self.gpu_hours_period_hours.unwrap_or(DEFAULT_PERIOD_HOURS)
    }
}

/// One kind of limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Limit {
    /// [`Limits::gpu_gib`].
    GpuGib,
    /// [`Limits::gpus`].
    Gpus,
    /// [`Limits::runs`].
    Runs,
    /// [`Limits::tokens_per_minute`].
    TokensPerMinute,
    /// [`Limits::sessions`].
    Sessions,
    /// [`Limits::gpu_hours`] (clearing it clears its period too).
    GpuHours,
}

impl Limit {
    /// Its field name.
    pub fn name(self) -> &'static str {
        match self {
            Limit::GpuGib => "gpu_gib",
            Limit::Gpus => "gpus",
            Limit::Runs => "runs",
            Limit::TokensPerMinute => "tokens_per_minute",
            Limit::Sessions => "sessions",
            Limit::GpuHours => "gpu_hours",
        }
    }

    /// `amount` of it, for people: `40.0 GiB`, `2 GPUs`, `1 run`.
    fn amount(self, amount: f64) -> String {
        let plural = if amount == 1.0 { "" } else { "s" };
        match self {
            Limit::GpuGib => format!("{amount:.1} GiB"),
            Limit::Gpus => format!("{amount} GPU{plural}"),
            Limit::Runs => format!("{amount} run{plural}"),
            Limit::TokensPerMinute => format!("{amount} token{plural}"),
            Limit::Sessions => format!("{amount} session{plural}"),
            Limit::GpuHours => format!("{amount:.1} GPU-hours"),
        }
    }

    /// What it limits, for people.
    fn what(self) -> &'static str {
        match self {
            Limit::GpuGib => "of GPU memory at once",
            Limit::Gpus => "at once",
            Limit::Runs => "in progress (queued or running) at once",
            Limit::TokensPerMinute => "a minute on the OpenAI and Anthropic routes and in sessions",
            Limit::Sessions => "at once (made and not deleted)",
            // The refusal says the period.
            Limit::GpuHours => "over their period",
        }
    }
}

/// Whose limit.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Scope {
    /// A user's own.
    User(String),
    /// Their group's.
    Group(String),
}

impl std::fmt::Display for Scope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Scope::User(name) => write!(f, "user `{name}`"),
            Scope::Group(name) => write!(f, "group `{name}`"),
        }
    }
}

/// A request or run beyond a limit: which limit, whose, what is in use, what was asked,
/// and when it frees.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Refusal {
    /// The limit.
    pub limit: Limit,
    /// Whose it is.
    pub scope: Scope,
    /// What it allows.
    pub allowed: f64,
    /// What is in use now.
    pub in_use: f64,
    /// What the refused request or run needs.
    pub asked: f64,
    /// When it frees, for people.
    pub frees: String,
    /// When to try again, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<u64>)]
    pub retry_after: Option<Duration>,
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let flag = match &self.scope {
            Scope::User(name) => format!("--user {name}"),
            Scope::Group(name) => format!("--group {name}"),
        };
        // What a request will take is known only after it (tokens): then nothing is
        // said of it.
        let needs = if self.asked > 0.0 {
            format!(", and this needs {} more", self.limit.amount(self.asked))
        } else {
            String::new()
        };
        write!(
            f,
            "{} may use {} {}: {} in use{needs}; {}; help: an admin can raise it with `skein quota set {flag} --{} N`",
            self.scope,
            self.limit.amount(self.allowed),
            self.limit.what(),
            self.limit.amount(self.in_use),
            self.frees,
            self.limit.name().replace('_', "-"),
        )
    }
}

impl std::error::Error for Refusal {}

/// Checks one limit: `None` when `in_use + asked` stays within `allowed` (or there is no
/// limit).
pub fn within(
    limit: Limit,
    scope: &Scope,
    allowed: Option<f64>,
    in_use: f64,
    asked: f64,
    frees: &str,
) -> Option<Refusal> {
    let allowed = allowed?;
    // A hair of slack so that GiB summed from bytes compare as people expect.
    (in_use + asked > allowed * (1.0 + 1e-9)).then(|| Refusal {
        limit,
        scope: scope.clone(),
        allowed,
        in_use,
        asked,
        frees: frees.to_owned(),
        retry_after: None,
    })
}

/// The tokens of the last minute: what a tokens-per-minute limit is checked against.
#[derive(Debug, Default, Clone)]
pub struct TokenWindow {
    /// (when, tokens), oldest first, within the last minute of the latest look.
    entries: VecDeque<(i64, u64)>,
    sum: u64,
}

impl TokenWindow {
    /// The window's span.
    pub const SPAN: Duration = Duration::from_secs(60);

    /// Counts `tokens` at `at`.
    pub fn add(&mut self, at: UnixMs, tokens: u64) {
        if tokens == 0 {
            return;
        }
        self.expire(at);
        self.entries.push_back((at.0, tokens));
        self.sum += tokens;
    }

    /// The tokens of the minute before `now`.
    pub fn used(&mut self, now: UnixMs) -> u64 {
        self.expire(now);
        self.sum
    }

    /// How long after `now` the minute's tokens fall below `allowed` (zero when they
    /// are below it now).
    pub fn frees_in(&mut self, now: UnixMs, allowed: u64) -> Duration {
        self.expire(now);
        let mut sum = self.sum;
        for &(at, tokens) in &self.entries {
            if sum < allowed {
                break;
            }
            sum -= tokens;
            if sum < allowed {
                let leaves = at + Self::SPAN.as_millis() as i64;
                return Duration::from_millis(u64::try_from(leaves - now.0).unwrap_or(0));
            }
        }
        Duration::ZERO
    }

    /// Whether it holds nothing (it may be dropped).
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    fn expire(&mut self, now: UnixMs) {
        let since = now.0 - Self::SPAN.as_millis() as i64;
        while let Some(&(at, tokens)) = self.entries.front() {
            if at > since {
                break;
            }
            self.entries.pop_front();
            self.sum -= tokens;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_token_window_counts_the_last_minute_and_says_when_it_frees() {
        let mut window = TokenWindow::default();
        window.add(UnixMs(1_000), 400);
        window.add(UnixMs(21_000), 300);
        window.add(UnixMs(41_000), 500);
        assert_eq!(window.used(UnixMs(50_000)), 1_200);
        // Below 1 000 once the first 400 leave (at 61 s), below 600 once the 300 do.
        assert_eq!(window.frees_in(UnixMs(50_000), 1_000), Duration::from_secs(11));
        assert_eq!(window.frees_in(UnixMs(50_000), 600), Duration::from_secs(31));
        assert_eq!(window.frees_in(UnixMs(50_000), 5_000), Duration::ZERO);
        assert_eq!(window.used(UnixMs(61_000)), 800);
        assert_eq!(window.used(UnixMs(101_000)), 0);
        assert!(window.is_empty());
        let refusal = Refusal {
            limit: Limit::TokensPerMinute,
            scope: Scope::User("ada".into()),
            allowed: 1000.0,
            in_use: 1200.0,
            asked: 0.0,
            frees: "it frees in 11 s".into(),
            retry_after: Some(Duration::from_secs(11)),
        };
        assert_eq!(
            refusal.to_string(),
            "user `ada` may use 1000 tokens a minute on the OpenAI and Anthropic routes and in sessions: 1200 tokens in use; it frees in 11 s; help: an admin can raise it with `skein quota set --user ada --tokens-per-minute N`"
        );
    }

    #[test]
    fn a_refusal_names_the_limit_the_use_and_when_it_frees() {
        let refusal = within(
            Limit::GpuGib,
            &Scope::Group("nlp".into()),
            Some(80.0),
            60.0,
            40.0,
            "it frees as the group's runs end",
        )
        .unwrap();
        assert_eq!(
            refusal.to_string(),
            "group `nlp` may use 80.0 GiB of GPU memory at once: 60.0 GiB in use, and this needs 40.0 GiB more; it frees as the group's runs end; help: an admin can raise it with `skein quota set --group nlp --gpu-gib N`"
        );
        assert!(within(Limit::Runs, &Scope::User("ada".into()), Some(2.0), 1.0, 1.0, "").is_none());
        assert!(within(Limit::Runs, &Scope::User("ada".into()), None, 100.0, 1.0, "").is_none());
    }

    #[test]
    fn limits_refuse_zero_and_nonsense_and_merge_updates() {
        assert!(
            Limits {
                gpus: Some(0),
                ..Limits::default()
            }
            .check("group `a`")
            .is_err()
        );
        assert!(
            Limits {
                gpu_gib: Some(f64::NAN),
                ..Limits::default()
            }
            .check("group `a`")
            .is_err()
        );
        assert!(
            Limits {
                gpu_gib: Some(-1.0),
                ..Limits::default()
            }
            .check("group `a`")
            .is_err()
        );
        let old = Limits {
            gpus: Some(4),
            runs: Some(2),
            ..Limits::default()
        };
        let new = old.merged(
            &Limits {
                gpu_gib: Some(40.0),
                ..Limits::default()
            },
            &[Limit::Runs],
        );
        assert_eq!(
            new,
            Limits {
                gpus: Some(4),
                runs: None,
                gpu_gib: Some(40.0),
                ..Limits::default()
            }
        );
    }
}
