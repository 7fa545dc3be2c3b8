//! `skein token …`: users' API tokens and agents' join tokens.

use clap::{Args, Subcommand};

use super::common::{ListArgs, OutputFormat, RemoteArgs};

/// `skein token …`.
#[derive(Debug, Subcommand)]
pub enum TokenCommand {
    /// Make a token for a user; it is printed once, keep it.
    Create(TokenCreateArgs),
    /// Revoke a token: it stops working at once.
    Revoke(TokenRevokeArgs),
    /// Join tokens, which let agents join the fleet (admin).
    #[command(subcommand)]
    Join(JoinTokenCommand),
}

/// `skein token create`.
#[derive(Debug, Args)]
pub struct TokenCreateArgs {
    /// The user the token acts for (lowercase letters, digits, `-`, `_`, `.`).
    #[arg(long, value_name = "NAME")]
    pub user: String,
    #[command(flatten)]
    pub remote: RemoteArgs,
    /// Output format: the token and how to use it, or its record as JSON.
    #[arg(long, value_enum, default_value_t = OutputFormat::Human)]
    pub output: OutputFormat,
}

/// `skein token revoke`.
#[derive(Debug, Args)]
pub struct TokenRevokeArgs {
    /// The token's id (`t-…`, `skein tokens` lists them; a join token's `j-…`, `skein
    /// token join list`).
    #[arg(value_name = "ID")]
    pub id: String,
    #[command(flatten)]
    pub remote: RemoteArgs,
}

/// `skein token join …`.
#[derive(Debug, Subcommand)]
pub enum JoinTokenCommand {
    /// Make a join token; it is printed once, keep it. Give it to agents as --token,
    /// --token-file or SKEIN_JOIN_TOKEN.
    Create(JoinTokenCreateArgs),
    /// List the join tokens (never the tokens themselves; not the server's bootstrap
    /// token).
    List(ListArgs),
    /// Revoke a join token: no agent claims a node name with it from now on (nodes
    /// that joined with it keep their identity).
    Revoke(TokenRevokeArgs),
}

/// `skein token join create`.
#[derive(Debug, Args)]
pub struct JoinTokenCreateArgs {
    /// How long it is accepted (`24h`, `30m`, `7days`); default: until revoked.
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    pub expires: Option<std::time::Duration>,
    /// The one node name it may claim.
    #[arg(long, value_name = "NAME", conflicts_with = "name_prefix")]
    pub node: Option<String>,
    /// The prefix every node name it claims must have (`lab-a-`).
    #[arg(long, value_name = "PREFIX")]
    pub name_prefix: Option<String>,
    #[command(flatten)]
    pub remote: RemoteArgs,
    /// Output format: the token and how to use it, or its record as JSON.
    #[arg(long, value_enum, default_value_t = OutputFormat::Human)]
    pub output: OutputFormat,
}
