//! `skein`: the one binary that carries every role of Skein.
//!
//! Exit codes: 0 success, 1 failure (e.g. an invalid workflow), 2 bad usage
//! or unreadable input.

use std::process::ExitCode;

use clap::Parser;

mod cli;
mod client;
mod cluster;
mod engine;
mod events;
mod kubernetes;
mod models;
mod nodes;
mod plan;
mod runs;
mod secrets;
mod sessions;
mod signals;
mod slurm;
mod table;
mod tokens;
mod validate;

fn main() -> ExitCode {
    // rustls is built with two crypto providers (ring for gRPC, aws-lc-rs through the hub
    // client's reqwest) and will not choose one itself; ring serves every TLS use here.
    // An error means one is installed already, which is as good.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let args = cli::Cli::parse();
    match try_main(args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(cli::EXIT_FAILURE)
        }
    }
}

fn try_main(args: cli::Cli) -> anyhow::Result<ExitCode> {
    match args.command {
        cli::Command::Validate(v) => validate::run(&v),
        cli::Command::Models(cli::ModelsCommand::Inspect(a)) => models::run_inspect(&a),
        cli::Command::Models(cli::ModelsCommand::Fit(a)) => models::run_fit(&a),
        cli::Command::Models(cli::ModelsCommand::Measured(a)) => runs::run_measured(&a),
        cli::Command::Plan(a) => plan::run(&a),
        cli::Command::Server(a) => cluster::run_server(&a),
        cli::Command::Nodes(a) => cluster::run_nodes(&a),
        cli::Command::Agent(a) => cluster::run_agent(&a),
        cli::Command::Up(a) => cluster::run_up(&a),
        cli::Command::Submit(a) => runs::run_submit(&a),
        cli::Command::Runs(a) => runs::run_list(&a),
        cli::Command::Run(cli::RunCommand::Show(a)) => runs::run_show(&a),
        cli::Command::Run(cli::RunCommand::Cancel(a)) => runs::run_cancel(&a),
        cli::Command::Instances(a) => runs::run_instances(&a),
        cli::Command::Logs(a) => runs::run_logs(&a),
        cli::Command::Engine(cli::EngineCommand::Serve(a)) => engine::run_serve(&a),
        cli::Command::Token(cli::TokenCommand::Create(a)) => tokens::run_create(&a),
        cli::Command::Token(cli::TokenCommand::Revoke(a)) => tokens::run_revoke(&a),
        cli::Command::Token(cli::TokenCommand::Join(cli::JoinTokenCommand::Create(a))) => tokens::run_join_create(&a),
        cli::Command::Token(cli::TokenCommand::Join(cli::JoinTokenCommand::List(a))) => tokens::run_join_list(&a),
        cli::Command::Token(cli::TokenCommand::Join(cli::JoinTokenCommand::Revoke(a))) => tokens::run_join_revoke(&a),
        cli::Command::Node(cli::NodeCommand::Rm(a)) => nodes::run_rm(&a),
        cli::Command::Node(cli::NodeCommand::Reset(a)) => nodes::run_reset(&a),
        cli::Command::Tokens(a) => tokens::run_list(&a),
        cli::Command::Secret(cli::SecretCommand::Set(a)) => secrets::run_set(&a),
        cli::Command::Secret(cli::SecretCommand::List(a)) => secrets::run_list(&a),
        cli::Command::Secret(cli::SecretCommand::Rm(a)) => secrets::run_rm(&a),
        cli::Command::Sessions(a) => sessions::run_list(&a),
        cli::Command::Events(a) => events::run(&a),
        cli::Command::Session(cli::SessionCommand::Create(a)) => sessions::run_create(&a),
        cli::Command::Session(cli::SessionCommand::Show(a)) => sessions::run_show(&a),
        cli::Command::Session(cli::SessionCommand::Chat(a)) => sessions::run_chat(&a),
        cli::Command::Session(cli::SessionCommand::Migrate(a)) => sessions::run_migrate(&a),
        cli::Command::Session(cli::SessionCommand::Delete(a)) => sessions::run_delete(&a),
        cli::Command::Slurm(cli::SlurmCommand::Submit(a)) => slurm::run_submit(&a),
    }
}
