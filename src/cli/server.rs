//! `skein server` and `skein up`: the orchestrator's flags and default addresses.

use std::path::PathBuf;

use clap::{Args, ValueEnum};

use super::agent::EngineArgs;

/// Default REST address.
pub const DEFAULT_API_ADDR: &str = "127.0.0.1:7878";
/// Default gRPC address of `skein server`: every interface, for agents on other machines.
pub const DEFAULT_GRPC_ADDR: &str = "0.0.0.0:7879";
/// Default gRPC address of `skein up`, which is one machine: loopback only.
pub const DEFAULT_UP_GRPC_ADDR: &str = "127.0.0.1:7879";

/// `skein server`.
#[derive(Debug, Args)]
pub struct ServerArgs {
    /// Address of the REST API.
    #[arg(long, env = "SKEIN_LISTEN", default_value = DEFAULT_API_ADDR, value_name = "IP:PORT")]
    pub listen: String,
    /// Address agents join (gRPC); default `0.0.0.0:7879` for `skein server`, and
    /// `127.0.0.1:7879` for `skein up`, which is one machine (give `0.0.0.0:7879` to let
    /// agents elsewhere join it).
    #[arg(long, env = "SKEIN_AGENT_LISTEN", value_name = "IP:PORT")]
    pub agent_listen: Option<String>,
    /// Join token agents must present; default: the one in `<data dir>/join-token`,
    /// created on first start.
    #[arg(long, env = "SKEIN_JOIN_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Bearer token of the REST API; default: `<data dir>/api-token`, created on first
    /// start.
    #[arg(long, env = "SKEIN_API_TOKEN", hide_env_values = true)]
    pub api_token: Option<String>,
    /// Where Skein keeps its state; default `$SKEIN_DATA_DIR`, `$XDG_DATA_HOME/skein` or
    /// `~/.local/share/skein`.
    #[arg(long, env = "SKEIN_DATA_DIR", value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
    /// How often agents sample and send telemetry.
    #[arg(long, default_value = "1s", value_name = "DURATION")]
    pub sample_interval: String,
    /// PEM certificate chain: serve both doors over TLS with it (with --tls-key).
    #[arg(long, value_name = "FILE")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert.
    #[arg(long, value_name = "FILE")]
    pub tls_key: Option<PathBuf>,
    /// Which doors speak TLS: `auto`, every door that listens beyond loopback (and both
    /// with --tls-cert); `on`, both; `off`, neither (tokens travel in clear). Without
    /// --tls-cert a self-signed certificate is made on first start in
    /// `<data dir>/tls` and its fingerprint printed, for clients to pin.
    #[arg(long, env = "SKEIN_TLS", value_enum, default_value_t = TlsMode::Auto)]
    pub tls: TlsMode,
    /// How long a client has to send a request's headers (and a new connection its
    /// first byte) before it is closed.
    #[arg(long, default_value = "10s", value_name = "DURATION")]
    pub header_timeout: String,
    /// How long a connection with no request in flight stays open (a stream of events
    /// is a request in flight).
    #[arg(long, default_value = "60s", value_name = "DURATION")]
    pub idle_timeout: String,
    /// Connections each door (REST, agents) holds at most; default: as many as the
    /// open-file limit allows, both doors together at most three quarters of it.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=1 << 20))]
    pub max_connections: Option<u64>,
    /// Memory the database (runs, sessions, tokens) may cache, in MiB.
    #[arg(long, default_value_t = 64, value_name = "MIB", value_parser = clap::value_parser!(u64).range(1..=1 << 20))]
    pub db_cache_mib: u64,
    /// Chat requests (chat completions, session turns) one user may have in flight at
    /// once; more are answered 429 with Retry-After.
    #[arg(long, env = "SKEIN_CHAT_REQUESTS_PER_USER", default_value_t = 16, value_name = "N",
        value_parser = clap::value_parser!(u64).range(1..=65536))]
    pub chat_requests_per_user: u64,
    /// Chat streams (server-sent events) one user may have open at once; more are
    /// answered 429 with Retry-After.
    #[arg(long, env = "SKEIN_CHAT_STREAMS_PER_USER", default_value_t = 8, value_name = "N",
        value_parser = clap::value_parser!(u64).range(1..=65536))]
    pub chat_streams_per_user: u64,
    /// Messages one chat request may carry; more are answered 413 (OpenAI's own limit is
    /// 2048).
    #[arg(long, env = "SKEIN_CHAT_MAX_MESSAGES", default_value_t = 2048, value_name = "N",
        value_parser = clap::value_parser!(u64).range(1..=65536))]
    pub chat_max_messages: u64,
    /// Text one chat request may carry (every string of its body), in KiB; more is
    /// answered 413. At most 4096 (4 MiB, about a million tokens), which a request body
    /// of the server's 16 MiB holds even escaped.
    #[arg(long, env = "SKEIN_CHAT_MAX_TEXT_KIB", default_value_t = 4096, value_name = "KIB",
        value_parser = clap::value_parser!(u64).range(1..=4096))]
    pub chat_max_text_kib: u64,
    /// A program workflows' stdio tool servers may run (their `command`'s first word,
    /// as written: give an absolute path), repeatable. A workflow is another user's
    /// code: no program runs unless listed here, and it runs with an empty
    /// environment. HTTP tool servers need nothing here (they follow the endpoint
    /// rules below).
    #[arg(
        long = "allow-tool-command",
        env = "SKEIN_ALLOW_TOOL_COMMANDS",
        value_delimiter = ',',
        value_name = "PROGRAM"
    )]
    pub allow_tool_commands: Vec<std::path::PathBuf>,
    /// The half-life of the GPU usage fair-share admission weighs (`7days`, `36h`):
    /// usage that old counts half (docs/sharing.md).
    #[arg(long, env = "SKEIN_FAIR_SHARE_HALF_LIFE", default_value = "7days", value_name = "DURATION",
        value_parser = half_life)]
    pub fair_share_half_life: std::time::Duration,
    /// Preempt by priority: a queued run that fits only by taking lower-priority runs'
    /// GPUs sends them back to the queue (their steps in progress start again when they
    /// are admitted again). Users other than the admin may then submit priorities up to
    /// `--max-user-priority` only (docs/placement.md, "Preemption").
    #[arg(long, env = "SKEIN_PREEMPT")]
    pub preempt: bool,
    /// With `--preempt`: the highest `placement.priority` a user other than the admin may
    /// submit.
    #[arg(
        long,
        env = "SKEIN_MAX_USER_PRIORITY",
        default_value_t = 0,
        value_name = "PRIORITY",
        allow_negative_numbers = true
    )]
    pub max_user_priority: i32,
    /// Hosts and address blocks endpoint agents may reach past the built-in refusals
    /// (loopback, link-local, this server's own addresses), comma-separated:
    /// `10.0.0.0/8,api.example.org,*.lab.example`. The most specific rule decides.
    #[arg(long, env = "SKEIN_ENDPOINT_ALLOW", value_delimiter = ',', value_name = "HOST|CIDR")]
    pub endpoint_allow: Vec<skein_orchestrator::egress::Rule>,
    /// Hosts and address blocks endpoint agents may not reach, comma-separated
    /// (`0.0.0.0/0,::/0` with --endpoint-allow: only the allowed ones).
    #[arg(long, env = "SKEIN_ENDPOINT_DENY", value_delimiter = ',', value_name = "HOST|CIDR")]
    pub endpoint_deny: Vec<skein_orchestrator::egress::Rule>,
}

/// Which of the server's doors speak TLS.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum TlsMode {
    /// Every door that listens beyond loopback; both when a certificate is given.
    Auto,
    /// Both doors.
    On,
    /// Neither door.
    Off,
}

/// `skein up`.
#[derive(Debug, Args)]
pub struct UpArgs {
    /// A fleet file: run one simulated agent per node instead of this machine's agent.
    #[arg(long, value_name = "FLEET.yaml")]
    pub fleet: Option<PathBuf>,
    #[command(flatten)]
    pub server: ServerArgs,
    #[command(flatten)]
    pub engines: EngineArgs,
}

/// A fair-share half-life: a duration of at least a minute.
fn half_life(text: &str) -> Result<std::time::Duration, String> {
    let duration = humantime::parse_duration(text).map_err(|e| format!("{e} (write it as `7days`, `36h`)"))?;
    if duration < std::time::Duration::from_secs(60) {
        return Err("a half-life under a minute forgets usage between admissions; give at least `1m`".to_owned());
    }
    Ok(duration)
}
