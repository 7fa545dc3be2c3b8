//! `skein group …` and `skein quota …`: groups (projects), their members, quotas and
//! fair share (docs/sharing.md).

use clap::{Args, Subcommand, ValueEnum};

use super::common::{ListArgs, OutputFormat, RemoteArgs};

/// `skein group …`.
#[derive(Debug, Subcommand)]
pub enum GroupCommand {
    /// List the groups: shares, limits, members and what each holds now.
    List(ListArgs),
    /// Make or change a group (admin).
    Set(GroupSetArgs),
    /// Put a user in a group (admin).
    Add(GroupAddArgs),
    /// Remove a group without members (admin).
    Rm(GroupRmArgs),
}

/// Limits to set or lift.
#[derive(Debug, Clone, Args)]
pub struct LimitArgs {
    /// GPU memory reserved at once, GiB.
    #[arg(long, value_name = "GIB")]
    pub gpu_gib: Option<f64>,
    /// GPUs in use at once.
    #[arg(long, value_name = "N")]
    pub gpus: Option<u32>,
    /// Runs in progress (queued or running) at once.
    #[arg(long, value_name = "N")]
    pub runs: Option<u32>,
    /// Tokens (prompt and generated) a minute on the OpenAI and Anthropic routes and in
    /// sessions.
    #[arg(long, value_name = "N")]
    pub tokens_per_minute: Option<u64>,
    /// Sessions made and not deleted, at once.
    #[arg(long, value_name = "N")]
    pub sessions: Option<u32>,
    /// GPU-hours (GPUs held × time) in the period: runs queue once they are used.
    #[arg(long, value_name = "N")]
    pub gpu_hours: Option<f64>,
    /// The period `--gpu-hours` counts over, in whole hours up to 31 days: `7d`
    /// (the default), `36h`, `2weeks`.
    #[arg(long, value_name = "PERIOD", value_parser = period_hours, requires = "gpu_hours")]
    pub gpu_hours_period: Option<u32>,
    /// Lift a limit (repeatable; `gpu-hours` lifts its period too).
    #[arg(long, value_enum, value_name = "LIMIT")]
    pub clear: Vec<LimitName>,
}

/// A limit's name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LimitName {
    /// `--gpu-gib`.
    GpuGib,
    /// `--gpus`.
    Gpus,
    /// `--runs`.
    Runs,
    /// `--tokens-per-minute`.
    TokensPerMinute,
    /// `--sessions`.
    Sessions,
    /// `--gpu-hours` (and its period).
    GpuHours,
}

/// A `--gpu-hours-period` in hours: a duration of whole hours, 1 hour to 31 days.
fn period_hours(text: &str) -> Result<u32, String> {
    let duration =
        humantime::parse_duration(text).map_err(|e| format!("`{text}` is not a duration like `7d` or `36h` ({e})"))?;
    let seconds = duration.as_secs();
    if seconds % 3600 != 0 || duration.subsec_nanos() != 0 || !(1..=31 * 24).contains(&(seconds / 3600)) {
        return Err(format!("`{text}` is not a whole number of hours from 1h to 31d"));
    }
    Ok((seconds / 3600) as u32)
}

impl LimitName {
    /// Its name in the API.
    pub fn api(self) -> &'static str {
        match self {
            LimitName::GpuGib => "gpu_gib",
            LimitName::Gpus => "gpus",
            LimitName::Runs => "runs",
            LimitName::TokensPerMinute => "tokens_per_minute",
            LimitName::Sessions => "sessions",
            LimitName::GpuHours => "gpu_hours",
        }
    }
}

/// `skein group set`.
#[derive(Debug, Args)]
pub struct GroupSetArgs {
    /// The group (lowercase letters, digits, `-`, `_`, `.`).
    #[arg(value_name = "NAME")]
    pub name: String,
    /// Its shares of the fleet, against the other groups' (default 1).
    #[arg(long, value_name = "N")]
    pub shares: Option<u32>,
    #[command(flatten)]
    pub limits: LimitArgs,
    #[command(flatten)]
    pub remote: RemoteArgs,
}

/// `skein group add`.
#[derive(Debug, Args)]
pub struct GroupAddArgs {
    /// The group (`default` for none).
    #[arg(value_name = "GROUP")]
    pub group: String,
    /// The user.
    #[arg(value_name = "USER")]
    pub user: String,
    /// Their shares within the group (default 1).
    #[arg(long, value_name = "N")]
    pub shares: Option<u32>,
    #[command(flatten)]
    pub remote: RemoteArgs,
}

/// `skein group rm`.
#[derive(Debug, Args)]
pub struct GroupRmArgs {
    /// The group.
    #[arg(value_name = "NAME")]
    pub name: String,
    #[command(flatten)]
    pub remote: RemoteArgs,
}

/// `skein quota …`.
#[derive(Debug, Subcommand)]
pub enum QuotaCommand {
    /// What you (or, for the admin, `--user`) and your group hold now, may hold, and
    /// your fair-share standing.
    Show(QuotaShowArgs),
    /// Set or lift a user's or a group's limits (admin).
    Set(QuotaSetArgs),
}

/// `skein quota show`.
#[derive(Debug, Args)]
pub struct QuotaShowArgs {
    /// Another user (admin).
    #[arg(long, value_name = "NAME")]
    pub user: Option<String>,
    #[command(flatten)]
    pub remote: RemoteArgs,
    /// Output format: a table, or JSON.
    #[arg(long, value_enum, default_value_t = OutputFormat::Human)]
    pub output: OutputFormat,
}

/// `skein quota set`.
#[derive(Debug, Args)]
#[command(group = clap::ArgGroup::new("whose").required(true).args(["user", "group"]))]
pub struct QuotaSetArgs {
    /// A user's limits.
    #[arg(long, value_name = "NAME")]
    pub user: Option<String>,
    /// A group's limits (its members' together).
    #[arg(long, value_name = "NAME")]
    pub group: Option<String>,
    #[command(flatten)]
    pub limits: LimitArgs,
    #[command(flatten)]
    pub remote: RemoteArgs,
}

/// `skein usage`.
#[derive(Debug, Args)]
pub struct UsageArgs {
    /// Only this user's (the admin may name anyone; others see their own).
    #[arg(long, value_name = "NAME")]
    pub user: Option<String>,
    /// Only this group's.
    #[arg(long, value_name = "NAME")]
    pub group: Option<String>,
    /// Only this model's (the repository served, or an endpoint's model).
    #[arg(long, value_name = "REPO")]
    pub model: Option<String>,
    /// Only this agent's.
    #[arg(long, value_name = "NAME")]
    pub agent: Option<String>,
    /// From when: RFC 3339 (`2026-11-01T00:00:00Z`) or a duration before now (`7d`).
    #[arg(long, value_name = "WHEN", default_value = "7d")]
    pub since: String,
    /// Until when, in the same forms (default now).
    #[arg(long, value_name = "WHEN")]
    pub until: Option<String>,
    /// What rows are summed by, comma-separated: group, user, model, agent, day, hour
    /// (an empty value: the total alone).
    #[arg(long, value_name = "DIMENSIONS", default_value = "group,user")]
    pub by: String,
    /// Print CSV (for a spreadsheet) instead of a table.
    #[arg(long, conflicts_with = "output")]
    pub csv: bool,
    #[command(flatten)]
    pub remote: RemoteArgs,
    /// Output format: a table, or JSON.
    #[arg(long, value_enum, default_value_t = OutputFormat::Human)]
    pub output: OutputFormat,
}
