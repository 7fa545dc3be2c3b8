//! `skein`: the one binary that carries every role of Skein.
//!
//! Exit codes: 0 success, 1 failure (e.g. an invalid workflow), 2 bad usage
//! or unreadable input.
//!
//! # Layout
//!
//! Each module uses only modules listed before it (in an earlier group, or earlier in its
//! own group): nothing imports upward, so there is no circle.
//!
//! - Arguments: [`cli`] (clap types, one module per command group, exit codes).
//! - Helpers: [`data_dir`] (the data directory, umask, secret files), [`runtime`] (tokio
//!   runtime, logging), [`table`] (plain-text tables), [`signals`] (what the agent and the
//!   server answer), [`client`] (the REST client and its token).
//! - Roles: [`server`] (`skein server`, and the server's configuration from its flags),
//!   [`agent`] (`skein agent`: its engines, pod labels, Slurm job), [`up`] (both in one
//!   process).
//! - Client commands: [`nodes`], [`runs`], [`sessions`], [`tokens`], [`secrets`],
//!   [`sharing`], [`events`].
//! - Other commands: [`validate`], [`models`], [`plan`], [`engine`] (`engine serve`),
//!   [`slurm`] (`slurm submit`).

use std::process::ExitCode;

use clap::Parser;

use crate::cli::engine::EngineCommand;
use crate::cli::models::ModelsCommand;
use crate::cli::nodes::NodeCommand;
use crate::cli::runs::RunCommand;
use crate::cli::secrets::SecretCommand;
use crate::cli::sessions::SessionCommand;
use crate::cli::sharing::{GroupCommand, QuotaCommand};
use crate::cli::slurm::SlurmCommand;
use crate::cli::tokens::{JoinTokenCommand, TokenCommand};
use crate::cli::{Cli, Command};

mod agent;
mod cli;
mod client;
mod data_dir;
mod engine;
mod events;
mod models;
mod nodes;
mod plan;
mod runs;
mod runtime;
mod secrets;
mod server;
mod sessions;
mod sharing;
mod signals;
mod slurm;
mod table;
mod tokens;
mod up;
mod validate;

fn main() -> ExitCode {
    // rustls is built with two crypto providers (ring for gRPC, aws-lc-rs through the hub
    // client's reqwest) and will not choose one itself; ring serves every TLS use here.
    // An error means one is installed already, which is as good.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let args = Cli::parse();
    match try_main(args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(cli::EXIT_FAILURE)
        }
    }
}

fn try_main(args: Cli) -> anyhow::Result<ExitCode> {
    match args.command {
        Command::Validate(v) => validate::run(&v),
        Command::Models(ModelsCommand::Inspect(a)) => models::run_inspect(&a),
        Command::Models(ModelsCommand::Fit(a)) => models::run_fit(&a),
        Command::Models(ModelsCommand::Measured(a)) => runs::run_measured(&a),
        Command::Plan(a) => plan::run(&a),
        Command::Server(a) => server::run_server(&a),
        Command::Nodes(a) => nodes::run_nodes(&a),
        Command::Agent(a) => agent::run_agent(&a),
        Command::Up(a) => up::run_up(&a),
        Command::Submit(a) => runs::run_submit(&a),
        Command::Runs(a) => runs::run_list(&a),
        Command::Run(RunCommand::Show(a)) => runs::run_show(&a),
        Command::Run(RunCommand::Cancel(a)) => runs::run_cancel(&a),
        Command::Run(RunCommand::Approve(a)) => runs::run_decide(&a, true),
        Command::Run(RunCommand::Reject(a)) => runs::run_decide(&a, false),
        Command::Instances(a) => runs::run_instances(&a),
        Command::Logs(a) => runs::run_logs(&a),
        Command::Engine(EngineCommand::Serve(a)) => engine::run_serve(&a),
        Command::Token(TokenCommand::Create(a)) => tokens::run_create(&a),
        Command::Token(TokenCommand::Revoke(a)) => tokens::run_revoke(&a),
        Command::Token(TokenCommand::Join(JoinTokenCommand::Create(a))) => tokens::run_join_create(&a),
        Command::Token(TokenCommand::Join(JoinTokenCommand::List(a))) => tokens::run_join_list(&a),
        Command::Token(TokenCommand::Join(JoinTokenCommand::Revoke(a))) => tokens::run_join_revoke(&a),
        Command::Node(NodeCommand::Rm(a)) => nodes::run_rm(&a),
        Command::Node(NodeCommand::Reset(a)) => nodes::run_reset(&a),
        Command::Tokens(a) => tokens::run_list(&a),
        Command::Group(GroupCommand::List(a)) => sharing::run_list(&a),
        Command::Group(GroupCommand::Set(a)) => sharing::run_set(&a),
        Command::Group(GroupCommand::Add(a)) => sharing::run_add(&a),
        Command::Group(GroupCommand::Rm(a)) => sharing::run_rm(&a),
        Command::Quota(QuotaCommand::Show(a)) => sharing::run_show(&a),
        Command::Quota(QuotaCommand::Set(a)) => sharing::run_quota_set(&a),
        Command::Usage(a) => sharing::run_usage(&a),
        Command::Secret(SecretCommand::Set(a)) => secrets::run_set(&a),
        Command::Secret(SecretCommand::List(a)) => secrets::run_list(&a),
        Command::Secret(SecretCommand::Rm(a)) => secrets::run_rm(&a),
        Command::Sessions(a) => sessions::run_list(&a),
        Command::Events(a) => events::run(&a),
        Command::Session(SessionCommand::Create(a)) => sessions::run_create(&a),
        Command::Session(SessionCommand::Show(a)) => sessions::run_show(&a),
        Command::Session(SessionCommand::Chat(a)) => sessions::run_chat(&a),
        Command::Session(SessionCommand::Migrate(a)) => sessions::run_migrate(&a),
        Command::Session(SessionCommand::Delete(a)) => sessions::run_delete(&a),
        Command::Slurm(SlurmCommand::Submit(a)) => slurm::run_submit(&a),
    }
}
