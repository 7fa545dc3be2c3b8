//! Command-line interface definition: [`Cli`] and its [`Command`]s here, each group's
//! arguments in its own module, what they share in [`common`].
//!
//! # Layout
//!
//! - [`common`]: reaching a server, output formats (every client command's).
//! - [`workflow`]: `validate`, `plan`.
//! - [`models`]: `models inspect|fit|measured`.
//! - [`runs`]: `submit`, `runs`, `run`, `instances`, `logs`, `events`.
//! - [`sessions`]: `session …`.
//! - [`tokens`], [`secrets`]: `token …`, `secret …`.
//! - [`sharing`]: `group …`, `quota …`.
//! - [`nodes`]: `nodes`, `node rm|reset`.
//! - [`server`], [`agent`], [`slurm`]: `server` and `up`, `agent`, `slurm submit`.
//! - [`engine`]: `engine serve`.

use clap::{Parser, Subcommand};

pub mod agent;
pub mod common;
pub mod engine;
pub mod models;
pub mod nodes;
pub mod runs;
pub mod secrets;
pub mod server;
pub mod sessions;
pub mod sharing;
pub mod slurm;
pub mod tokens;
pub mod workflow;

use self::agent::AgentArgs;
use self::common::ListArgs;
use self::engine::EngineCommand;
use self::models::ModelsCommand;
use self::nodes::{NodeCommand, NodesArgs};
use self::runs::{EventsArgs, InstancesArgs, LogsArgs, RunCommand, SubmitArgs};
use self::secrets::SecretCommand;
use self::server::{ServerArgs, UpArgs};
use self::sessions::SessionCommand;
use self::sharing::{GroupCommand, QuotaCommand};
use self::slurm::SlurmCommand;
use self::tokens::TokenCommand;
use self::workflow::{PlanArgs, ValidateArgs};

/// Success.
pub const EXIT_OK: u8 = 0;
/// The command ran and found a failure (e.g. an invalid workflow).
pub const EXIT_FAILURE: u8 = 1;
/// Bad usage or unreadable input.
pub const EXIT_USAGE: u8 = 2;

/// Skein: hardware-aware orchestration of multi-agent LLM workflows on mixed GPU fleets.
#[derive(Debug, Parser)]
#[command(name = "skein", version, about, propagate_version = true)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Check workflow files (YAML or Rhai) and report every problem.
    ///
    /// Exits 0 when every file is valid, 1 when any has an error, 2 when a
    /// file cannot be read.
    Validate(ValidateArgs),
    /// Model variants and memory fit, from Hugging Face Hub metadata (no weights are
    /// downloaded).
    #[command(subcommand)]
    Models(ModelsCommand),
    /// Plan a workflow: for each agent, the model variant, engine, GPUs and split, with
    /// the reasons; offline on a fleet file, or on a running orchestrator's live graph.
    ///
    /// Exits 0 when the workflow is admitted (every instance placed), 1 when it would
    /// be queued.
    Plan(PlanArgs),
    /// Run the orchestrator: the hardware graph, the service agents join (gRPC) and the
    /// REST API. Tokens are created in the data directory on first start.
    Server(ServerArgs),
    /// Show the nodes and GPUs of a running server, like nvidia-smi for the whole fleet.
    Nodes(NodesArgs),
    /// Free a node's name (admin): remove the node, or forget only its identity.
    #[command(subcommand)]
    Node(NodeCommand),
    /// Run an agent: join a server and stream this machine's GPUs (NVML), or a
    /// simulated node of a fleet file.
    Agent(AgentArgs),
    /// Run everything on this machine: the server and a local agent, or one agent per
    /// node of a simulated fleet (`--fleet workflows/fleets/lab.yaml`).
    Up(UpArgs),
    /// Submit a workflow to a running server: it is planned, its instances started and
    /// its steps run. With --wait, follow it and print its outputs.
    ///
    /// Exits 0 when submitted (with --wait: when the run succeeded), 1 otherwise.
    Submit(SubmitArgs),
    /// List the runs of a server, newest first.
    Runs(ListArgs),
    /// Show or cancel one run.
    #[command(subcommand)]
    Run(RunCommand),
    /// List the model instances agents run: where, which engine, state, estimated and
    /// measured memory.
    Instances(InstancesArgs),
    /// The last lines an instance's engine wrote (stdout and stderr, across restarts),
    /// fetched from its agent.
    Logs(LogsArgs),
    /// The built-in inference engine (candle): serve one model over the OpenAI
    /// chat-completions API.
    #[command(subcommand)]
    Engine(EngineCommand),
    /// Make or revoke users' API tokens (admin).
    #[command(subcommand)]
    Token(TokenCommand),
    /// List the API tokens of a server (admin; never the tokens themselves).
    Tokens(ListArgs),
    /// Groups (projects) and their members: shares of the fleet, limits, what each
    /// holds (docs/sharing.md).
    #[command(subcommand)]
    Group(GroupCommand),
    /// Your quota and fair-share standing; the admin sets limits.
    #[command(subcommand)]
    Quota(QuotaCommand),
    /// What you (everyone, for the admin) used: model calls, tokens in and out, GPU
    /// memory × time, GPU-hours and run time, by group, user, model, agent or day.
    Usage(crate::cli::sharing::UsageArgs),
    /// Your secrets: the keys of your endpoint agents, named in workflows as
    /// `api_key_secret: NAME` (`--shared`: the admin's, named `shared/NAME`).
    #[command(subcommand)]
    Secret(SecretCommand),
    /// List your sessions (everyone's for the admin), oldest first.
    Sessions(ListArgs),
    /// What the reflexes of your runs did (everyone's for the admin), newest first.
    Events(EventsArgs),
    /// Start, show, chat in, move or delete a session.
    #[command(subcommand)]
    Session(SessionCommand),
    /// Agents as Slurm jobs: generate and submit the batch script that joins a
    /// Slurm allocation's nodes to a server.
    #[command(subcommand)]
    Slurm(SlurmCommand),
}
