//! `skein nodes` and `skein node …`: the fleet a server sees, and freeing a node's name.

use clap::{Args, Subcommand};

use super::common::{ApiClientArgs, OutputFormat, RemoteArgs};

/// `skein nodes`.
#[derive(Debug, Args)]
pub struct NodesArgs {
    /// The server's REST address.
    #[arg(long, default_value = "http://127.0.0.1:7878", value_name = "URL")]
    pub server: String,
    /// How to reach the server.
    #[command(flatten)]
    pub client: ApiClientArgs,
    /// Output format: a table, or the whole graph as JSON.
    #[arg(long, value_enum, default_value_t = OutputFormat::Human)]
    pub output: OutputFormat,
    /// Refresh every second until interrupted.
    #[arg(long)]
    pub watch: bool,
}

/// `skein node …`.
#[derive(Debug, Subcommand)]
pub enum NodeCommand {
    /// Remove a node: it leaves the graph (its instances are placed again) and its
    /// identity is forgotten, so the next agent with a valid join token claims the name.
    /// Stop its agent (or revoke its join token) first, or it joins again.
    Rm(NodeNameArgs),
    /// Forget only a node's identity (it stays in the graph): the next agent to register
    /// the name with a valid join token claims it (a machine that lost its state
    /// directory, a replaced machine).
    Reset(NodeNameArgs),
}

/// `skein node rm|reset NAME`.
#[derive(Debug, Args)]
pub struct NodeNameArgs {
    /// The node's name (`skein nodes` lists them).
    #[arg(value_name = "NAME")]
    pub name: String,
    #[command(flatten)]
    pub remote: RemoteArgs,
}
