//! `skein engine serve`: the built-in inference engine.

use std::path::PathBuf;

use clap::{Args, Subcommand};

/// `skein engine …`.
#[derive(Debug, Subcommand)]
pub enum EngineCommand {
    /// Serve a model directory (Hugging Face snapshot) or GGUF file on
    /// `/v1/chat/completions`; `/health` is 503 until the model is loaded.
    ///
    /// Exits 1 when the model fails to load, 2 for bad arguments.
    Serve(EngineServeArgs),
}

/// `skein engine serve`.
#[derive(Debug, Args)]
pub struct EngineServeArgs {
    /// The model: a directory with config.json, tokenizer files and *.safetensors, or a
    /// .gguf file with the tokenizer files beside it.
    #[arg(long, value_name = "PATH")]
    pub model: PathBuf,
    /// The name clients ask for in `model`.
    #[arg(long, value_name = "NAME")]
    pub name: String,
    /// The address to listen on.
    #[arg(long, default_value = "127.0.0.1", value_name = "IP")]
    pub host: String,
    /// The port to listen on (0 picks a free one).
    #[arg(long, value_name = "PORT")]
    pub port: u16,
    /// The sampler's seed for requests without one.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Where the model runs: `cpu` or `cuda:N`.
    #[arg(long, default_value = "cpu", value_name = "cpu|cuda:N")]
    pub device: String,
    /// The key every `/v1` request must carry (`Authorization: Bearer KEY`); `/health`
    /// stays open. Give it through the environment, as the agent does: a command line
    /// is readable by every user of the machine. Unset: no key.
    #[arg(
        long = "api-key",
        env = "SKEIN_ENGINE_API_KEY",
        hide_env_values = true,
        value_name = "KEY"
    )]
    pub api_key: Option<String>,
}
