//! `skein validate` and `skein plan`: workflow files, checked and planned.

use std::path::PathBuf;

use clap::{Args, ValueEnum};

use super::common::{ApiClientArgs, OutputFormat};

/// `skein validate`.
#[derive(Debug, Args)]
pub struct ValidateArgs {
    /// Workflow files: `.yaml`, `.yml` or `.rhai`.
    #[arg(required = true, value_name = "FILE")]
    pub files: Vec<PathBuf>,
    /// Output format.
    #[arg(long, value_enum, default_value_t = OutputFormat::Human)]
    pub output: OutputFormat,
    /// Also print the workflow IR of valid files, as JSON (inside the report with `--output json`).
    #[arg(long)]
    pub print_ir: bool,
    /// Colour: auto (when stderr is a terminal and NO_COLOR is unset), always, never.
    #[arg(long, value_enum, default_value_t = ColorChoice::Auto)]
    pub color: ColorChoice,
    /// Also check each agent's tools against what its tool servers declare. This starts
    /// every stdio tool server's program here (its `command` as written, with an empty
    /// environment; killed once listed) and calls every HTTP one (with no key), each
    /// given 5 s: off by default for that reason. A tool its server does not declare is
    /// the error `unknown-tool`; a server that cannot be listed is the warning
    /// `tool-server-unreachable` (a note when it needs its key).
    #[arg(long)]
    pub check_tools: bool,
}

/// When to use ANSI colours.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ColorChoice {
    /// When the output is a terminal and `NO_COLOR` is unset.
    Auto,
    /// Always.
    Always,
    /// Never.
    Never,
}

/// `skein plan`.
#[derive(Debug, Args)]
pub struct PlanArgs {
    /// The workflow: `.yaml`, `.yml` or `.rhai`.
    #[arg(value_name = "FILE")]
    pub workflow: PathBuf,
    /// Plan offline on a fleet file (`workflows/fleets/lab.yaml`); the models are read
    /// from the hub (HF_ENDPOINT, HF_TOKEN, HF_HOME as `skein models` reads them).
    #[arg(long, value_name = "FLEET.yaml", conflicts_with = "server")]
    pub fleet: Option<PathBuf>,
    /// Plan on a running orchestrator's live graph (`POST /v1/plans`).
    #[arg(long, value_name = "URL")]
    pub server: Option<String>,
    /// How to reach --server.
    #[command(flatten)]
    pub client: ApiClientArgs,
    /// Output format: a table, or the plan as JSON (the object the API returns).
    #[arg(long, value_enum, default_value_t = OutputFormat::Human)]
    pub output: OutputFormat,
    /// Show why each choice was made, the best candidates not taken, and each device.
    #[arg(long)]
    pub explain: bool,
    /// Let this workflow preempt instances of lower-priority workflows.
    #[arg(long)]
    pub preempt: bool,
    /// Quantized derivatives to consider per model (the hub's most downloaded first).
    #[arg(long, default_value_t = skein_model_registry::hub::DEFAULT_DERIVATIVES, value_name = "N")]
    pub derivatives: usize,
    /// Read the weight headers of derivatives too (exact sizes).
    #[arg(long)]
    pub derivative_headers: bool,
    /// Use only the Hugging Face cache, as HF_HUB_OFFLINE=1 does.
    #[arg(long)]
    pub offline: bool,
}
