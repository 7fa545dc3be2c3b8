//! What the client commands share: how to reach a server, and how results are printed.

use std::path::PathBuf;

use clap::{Args, ValueEnum};

/// The REST address the client commands reach without `--server`.
pub const DEFAULT_SERVER: &str = "http://127.0.0.1:7878";

/// A running server's REST address and token.
#[derive(Debug, Args)]
pub struct RemoteArgs {
    /// The server's REST address.
    #[arg(long, default_value = DEFAULT_SERVER, value_name = "URL")]
    pub server: String,
    /// How to reach the server.
    #[command(flatten)]
    pub client: ApiClientArgs,
}

/// The REST API token of a client command.
#[derive(Debug, Args)]
pub struct ApiClientArgs {
    /// Bearer token; default: `<data dir>/api-token` of a server on this machine.
    #[arg(long, env = "SKEIN_API_TOKEN", hide_env_values = true)]
    pub api_token: Option<String>,
    /// The data directory whose api-token to read (and, for a server on this machine
    /// reached at `https://` on loopback, whose `tls/cert.pem` to trust).
    #[arg(long, value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
    /// Trust only the `https://` server whose certificate has this SHA-256 fingerprint
    /// (`sha256:…`, printed by the server at start).
    #[arg(long, env = "SKEIN_SERVER_FINGERPRINT", value_name = "sha256:HEX")]
    pub server_fingerprint: Option<String>,
    /// PEM CA certificate to trust for an `https://` server (default: the system's roots).
    #[arg(
        long = "ca",
        env = "SKEIN_CA",
        value_name = "FILE",
        conflicts_with = "server_fingerprint"
    )]
    pub tls_ca: Option<PathBuf>,
}

/// `skein runs`, `skein tokens` and other lists: a server and an output format.
#[derive(Debug, Args)]
pub struct ListArgs {
    #[command(flatten)]
    pub remote: RemoteArgs,
    /// Output format: a table, or JSON.
    #[arg(long, value_enum, default_value_t = OutputFormat::Human)]
    pub output: OutputFormat,
}

/// How results are printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OutputFormat {
    /// Compiler-style diagnostics on stderr, a summary line per file.
    Human,
    /// One JSON document on stdout.
    Json,
}
