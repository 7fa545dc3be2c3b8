//! `skein session …`: sessions with an agent or a model.

use clap::{Args, Subcommand};

use super::common::{OutputFormat, RemoteArgs};

/// `skein session …`.
#[derive(Debug, Subcommand)]
pub enum SessionCommand {
    /// Start a session with an agent of one of your runs, or with a model of its own.
    Create(SessionCreateArgs),
    /// A session: its owner, agent, where it runs, and its messages.
    Show(SessionIdArgs),
    /// Chat in a session: each line typed is a message, the reply streams back; an
    /// empty line or end of input ends. `--message` sends one and exits.
    Chat(SessionChatArgs),
    /// Move a session to another GPU (`NODE:GPU`), node (`NODE`), or wherever fits off
    /// its GPUs (`auto`).
    Migrate(SessionMigrateArgs),
    /// Delete a session and its messages.
    Delete(SessionIdArgs),
}

/// `skein session create`.
#[derive(Debug, Args)]
pub struct SessionCreateArgs {
    /// A Hugging Face model of its own (`owner/name`).
    #[arg(long, value_name = "REPO", conflicts_with_all = ["agent", "run"], required_unless_present = "agent")]
    pub model: Option<String>,
    /// An agent of a run (your newest run with that agent, unless `--run`).
    #[arg(long, value_name = "NAME")]
    pub agent: Option<String>,
    /// The run whose agent it is.
    #[arg(long, value_name = "RUN", requires = "agent")]
    pub run: Option<String>,
    /// A system prompt instead of the agent's.
    #[arg(long, value_name = "TEXT")]
    pub system: Option<String>,
    #[command(flatten)]
    pub remote: RemoteArgs,
    /// Output format: the id, or the session as JSON.
    #[arg(long, value_enum, default_value_t = OutputFormat::Human)]
    pub output: OutputFormat,
}

/// One session.
#[derive(Debug, Args)]
pub struct SessionIdArgs {
    /// The session's id (`skein sessions` lists them).
    #[arg(value_name = "ID")]
    pub id: String,
    #[command(flatten)]
    pub remote: RemoteArgs,
    /// Output format: a report, or JSON.
    #[arg(long, value_enum, default_value_t = OutputFormat::Human)]
    pub output: OutputFormat,
}

/// `skein session chat`.
#[derive(Debug, Args)]
pub struct SessionChatArgs {
    /// The session's id.
    #[arg(value_name = "ID")]
    pub id: String,
    /// Send this one message, print the reply, and exit.
    #[arg(long, short, value_name = "TEXT")]
    pub message: Option<String>,
    #[command(flatten)]
    pub remote: RemoteArgs,
}

/// `skein session migrate`.
#[derive(Debug, Args)]
pub struct SessionMigrateArgs {
    /// The session's id.
    #[arg(value_name = "ID")]
    pub id: String,
    /// Where: `NODE:GPU` (e.g. `rtx-1:2`), `NODE`, or `auto`.
    #[arg(long, value_name = "NODE:GPU|NODE|auto")]
    pub to: String,
    #[command(flatten)]
    pub remote: RemoteArgs,
    /// Output format: a line, or the move as JSON.
    #[arg(long, value_enum, default_value_t = OutputFormat::Human)]
    pub output: OutputFormat,
}
