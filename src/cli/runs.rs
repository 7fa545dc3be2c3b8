//! `skein submit`, `runs`, `run …`, `instances`, `logs` and `events`: runs on a server.

use std::path::PathBuf;

use clap::{Args, Subcommand};

use super::common::{ListArgs, OutputFormat, RemoteArgs};

/// `skein submit`.
#[derive(Debug, Args)]
pub struct SubmitArgs {
    /// The workflow: `.yaml`, `.yml` or `.rhai`.
    #[arg(value_name = "WORKFLOW")]
    pub workflow: PathBuf,
    /// An input value, repeatable: `--input figure=fig1.png`.
    #[arg(long = "input", value_name = "KEY=VALUE")]
    pub inputs: Vec<String>,
    /// Follow the run until it ends, then print its outputs.
    #[arg(long)]
    pub wait: bool,
    #[command(flatten)]
    pub remote: RemoteArgs,
    /// Output format: progress and outputs, or the run as JSON.
    #[arg(long, value_enum, default_value_t = OutputFormat::Human)]
    pub output: OutputFormat,
}

/// `skein run …`.
#[derive(Debug, Subcommand)]
pub enum RunCommand {
    /// A run's state, its steps with their timestamps, and its outputs; with
    /// `--step`, that step's agent loop (each model turn, each tool call).
    Show(RunShowArgs),
    /// Cancel a run: queued, it never starts; running, its steps stop and its
    /// instances are stopped.
    Cancel(RunIdArgs),
    /// Approve a step that waits for approval: the run goes on, the comment as the
    /// step's output. For a tool call that was in flight under `in_flight: ask`: it is
    /// sent again and the step (or its item, `--item`) goes on.
    Approve(DecideArgs),
    /// Reject a step that waits for approval: the step fails, and the run with it. For
    /// a tool call that was in flight under `in_flight: ask`: the attempt fails, and
    /// the step's `retries` apply.
    Reject(DecideArgs),
}

/// `skein run approve|reject`.
#[derive(Debug, Args)]
pub struct DecideArgs {
    #[command(flatten)]
    pub run: RunIdArgs,
    /// The step that waits (`skein run show ID` shows the steps that wait).
    #[arg(value_name = "STEP")]
    pub step: String,
    /// The item of a `for_each` step whose tool call waits (`skein run show ID --step
    /// STEP` shows the items).
    #[arg(long, value_name = "N")]
    pub item: Option<u32>,
    /// Why: kept with the decision (an approval's comment is the step's output).
    #[arg(long)]
    pub comment: Option<String>,
}

/// One run.
#[derive(Debug, Args)]
pub struct RunIdArgs {
    /// The run's id (`skein runs` lists them).
    #[arg(value_name = "ID")]
    pub id: String,
    #[command(flatten)]
    pub remote: RemoteArgs,
    /// Output format: a report, or the run as JSON.
    #[arg(long, value_enum, default_value_t = OutputFormat::Human)]
    pub output: OutputFormat,
}

/// `skein run show`.
#[derive(Debug, Args)]
pub struct RunShowArgs {
    #[command(flatten)]
    pub run: RunIdArgs,
    /// Show this step's agent loop: each model turn and each tool call, with its
    /// arguments, result (cut to a line) and duration.
    #[arg(long, value_name = "STEP")]
    pub step: Option<String>,
}

/// `skein instances`.
#[derive(Debug, Args)]
pub struct InstancesArgs {
    #[command(flatten)]
    pub remote: RemoteArgs,
    /// Output format: a table, or JSON.
    #[arg(long, value_enum, default_value_t = OutputFormat::Human)]
    pub output: OutputFormat,
}

/// `skein logs`: an admin reads any instance's engine log; a user only that of an
/// instance that served their requests alone (a log can hold prompts).
#[derive(Debug, Args)]
pub struct LogsArgs {
    /// The instance (`skein instances` lists them).
    #[arg(value_name = "INSTANCE")]
    pub instance: String,
    /// How many lines.
    #[arg(long, default_value_t = 200, value_name = "N")]
    pub tail: u32,
    #[command(flatten)]
    pub remote: RemoteArgs,
}

/// `skein events`.
#[derive(Debug, Args)]
pub struct EventsArgs {
    #[command(flatten)]
    pub list: ListArgs,
    /// Keep printing events as they happen.
    #[arg(long)]
    pub follow: bool,
}
