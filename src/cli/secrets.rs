//! `skein secret …`: the keys of endpoint agents.

use clap::{Args, Subcommand};

use super::common::{ListArgs, RemoteArgs};

/// `skein secret …`.
#[derive(Debug, Subcommand)]
pub enum SecretCommand {
    /// Set (or replace) a secret. The value is read from standard input (a hidden
    /// prompt on a terminal), never from the command line, and never shown again.
    Set(SecretSetArgs),
    /// List the names of your secrets and the shared ones (everyone's for the admin).
    List(ListArgs),
    /// Remove a secret.
    Rm(SecretRmArgs),
}

/// `skein secret set`.
#[derive(Debug, Args)]
pub struct SecretSetArgs {
    /// The secret's name (letters, digits, `-`, `_`, `.`).
    #[arg(value_name = "NAME")]
    pub name: String,
    /// Publish it for every user's workflows, as `shared/NAME` (admin).
    #[arg(long)]
    pub shared: bool,
    #[command(flatten)]
    pub remote: RemoteArgs,
}

/// `skein secret rm`.
#[derive(Debug, Args)]
pub struct SecretRmArgs {
    /// The secret's name.
    #[arg(value_name = "NAME")]
    pub name: String,
    /// Remove a shared secret (admin).
    #[arg(long)]
    pub shared: bool,
    #[command(flatten)]
    pub remote: RemoteArgs,
}
