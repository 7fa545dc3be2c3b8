//! `skein server` and `skein nodes`: the orchestrator's hardware graph, and a table of
//! it for people.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, bail};
use serde::Deserialize;
use skein_orchestrator::agents::Secret;
use skein_orchestrator::graph::{GraphConfig, HealthState};
use skein_orchestrator::server::{ServerConfig, ServerTls, TlsFiles};
use skein_orchestrator::transport::TransportConfig;

use std::sync::Arc;

use skein_agent::daemon::{Agent, AgentConfig, Departure, InstanceHost, NoGpus};
use skein_agent::engine::host::{EngineHost, EngineHostConfig};
use skein_agent::engine::supervisor::{RestartPolicy, Supervisor, SupervisorConfig};
use skein_agent::{GpuSource, HostInventory, HostSampler, discover_nvml, load_fleet};
use skein_proto::agent::v1::InstanceStatus;
use tokio::sync::mpsc;

use crate::cli::{AgentArgs, ApiClientArgs, EXIT_OK, EngineArgs, NodesArgs, OutputFormat, ServerArgs, TlsMode, UpArgs};

/// Default REST address.
pub const DEFAULT_API_ADDR: &str = "127.0.0.1:7878";
/// Default gRPC address of `skein server`: every interface, for agents on other machines.
pub const DEFAULT_GRPC_ADDR: &str = "0.0.0.0:7879";
/// Default gRPC address of `skein up`, which is one machine: loopback only.
pub const DEFAULT_UP_GRPC_ADDR: &str = "127.0.0.1:7879";

/// Makes what this process creates private to its user (umask 077): the data directory's
/// files, sled's own files, logs, and what engines started by an agent write (they
/// inherit it). Returns the mask it replaces.
pub fn private_umask() -> u32 {
    use rustix::fs::Mode;
    rustix::process::umask(Mode::from_raw_mode(0o077)).as_raw_mode()
}

/// Skein's data directory: `--data-dir`, else `$SKEIN_DATA_DIR`, else
/// `$XDG_DATA_HOME/skein`, else `~/.local/share/skein`.
pub fn data_dir(flag: Option<&Path>) -> anyhow::Result<PathBuf> {
    if let Some(dir) = flag {
        return Ok(dir.to_owned());
    }
    let env = |key: &str| std::env::var_os(key).filter(|v| !v.is_empty()).map(PathBuf::from);
    if let Some(dir) = env("SKEIN_DATA_DIR") {
        return Ok(dir);
    }
    if let Some(dir) = env("XDG_DATA_HOME") {
        return Ok(dir.join("skein"));
    }
    match env("HOME") {
        Some(home) => Ok(home.join(".local/share/skein")),
        None => bail!("no data directory: set --data-dir, SKEIN_DATA_DIR or HOME"),
    }
}

/// The secret in `file`, created (random, mode 0600) when absent.
pub fn load_or_create_secret(file: &Path) -> anyhow::Result<Secret> {
    match std::fs::read_to_string(file) {
        Ok(text) => {
            Secret::new(text).with_context(|| format!("{} is empty; delete it to get a new token", file.display()))
        }
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
            if let Some(dir) = file.parent() {
                std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
            }
            let secret = Secret::generate().context("cannot read random bytes for a token")?;
            write_private(file, secret.expose())?;
            Ok(secret)
        }
        Err(error) => Err(error).with_context(|| format!("cannot read {}", file.display())),
    }
}

/// Writes `text` to `file` readable by its owner only.
fn write_private(file: &Path, text: &str) -> anyhow::Result<()> {
    skein_orchestrator::private::create_private(file, format!("{text}\n").as_bytes())
        .with_context(|| format!("cannot create {}", file.display()))
}

/// A secret from a flag, else a file.
pub fn secret_from(flag: Option<&str>, file: &Path) -> anyhow::Result<Secret> {
    match flag.and_then(Secret::new) {
        Some(secret) => Ok(secret),
        None => load_or_create_secret(file),
    }
}

/// The server's configuration from its flags, with agents joining at
/// `default_agent_listen` unless `--agent-listen` says otherwise; creates the data
/// directory (mode 0700, an existing one tightened) and tokens (0600).
pub fn server_config(args: &ServerArgs, default_agent_listen: &str) -> anyhow::Result<(ServerConfig, PathBuf)> {
    let dir = data_dir(args.data_dir.as_deref())?;
    skein_orchestrator::private::private_dir(&dir)
        .with_context(|| format!("cannot make the data directory {} private (mode 0700)", dir.display()))?;
    // What an older version (or another umask) left readable: tokens, the database, logs.
    let tightened = skein_orchestrator::private::tighten_tree(&dir)
        .with_context(|| format!("cannot make the files in {} private (mode 0600)", dir.display()))?;
    if tightened > 0 {
        tracing::warn!(dir = %dir.display(), entries = tightened, "tightened the permissions of files in the data directory");
    }
    let join_token = secret_from(args.token.as_deref(), &dir.join("join-token"))?;
    let api_token = secret_from(args.api_token.as_deref(), &dir.join("api-token"))?;
    let parse = |text: &str, flag: &str| -> anyhow::Result<SocketAddr> {
        text.parse()
            .with_context(|| format!("{flag} `{text}` is not an address; write IP:PORT, e.g. 0.0.0.0:7879"))
    };
    let interval = humantime::parse_duration(&args.sample_interval).with_context(|| {
        format!(
            "--sample-interval `{}` is not a duration; write e.g. 1s or 500ms",
            args.sample_interval
        )
    })?;
    if interval < Duration::from_millis(50) || interval > Duration::from_secs(60) {
        bail!("--sample-interval must be between 50ms and 60s");
    }
    let api_addr = parse(&args.listen, "--listen")?;
    let grpc_addr = parse(
        args.agent_listen.as_deref().unwrap_or(default_agent_listen),
        "--agent-listen",
    )?;
    let tls = server_tls(args, &dir, api_addr, grpc_addr)?;
    let transport = transport_config(args)?;
    Ok((
        ServerConfig {
            api_addr,
            grpc_addr,
            join_token,
            api_token,
            graph: GraphConfig {
                sample_interval_ms: u64::try_from(interval.as_millis()).unwrap_or(1000),
                ..GraphConfig::default()
            },
            tls,
            transport,
            hub: skein_model_registry::hub::HubClientBuilder::from_env()
                .build()
                .context("cannot set up the Hugging Face hub client (HF_ENDPOINT, HF_HOME, HF_TOKEN)")?,
            db_dir: Some(dir.join("db")),
            db_cache_bytes: args.db_cache_mib << 20,
            endpoints: skein_orchestrator::egress::EgressRules {
                allow: args.endpoint_allow.clone(),
                deny: args.endpoint_deny.clone(),
            },
            secrets_key: Some(dir.join(skein_orchestrator::secrets::KEY_FILE)),
            chat_limits: skein_orchestrator::session::ChatLimits {
                max_messages: usize::try_from(args.chat_max_messages).unwrap_or(usize::MAX),
                max_text_bytes: usize::try_from(args.chat_max_text_kib << 10).unwrap_or(usize::MAX),
                max_requests_per_user: usize::try_from(args.chat_requests_per_user).unwrap_or(usize::MAX),
                max_streams_per_user: usize::try_from(args.chat_streams_per_user).unwrap_or(usize::MAX),
            },
            executor: skein_orchestrator::run::ExecutorConfig::default(),
        },
        dir,
    ))
}

/// Which doors speak TLS, with which certificate: `--tls-cert`/`--tls-key`, else one
/// made on first start in `<data dir>/tls` (see [`TlsMode`] for which doors).
fn server_tls(
    args: &ServerArgs,
    dir: &Path,
    api_addr: SocketAddr,
    grpc_addr: SocketAddr,
) -> anyhow::Result<Option<ServerTls>> {
    let given = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => Some(TlsFiles {
            cert: cert.clone(),
            key: key.clone(),
        }),
        (None, None) => None,
        _ => bail!("--tls-cert and --tls-key go together"),
    };
    let wants = |addr: SocketAddr| match args.tls {
        TlsMode::On => true,
        TlsMode::Off => false,
        TlsMode::Auto => given.is_some() || !addr.ip().is_loopback(),
    };
    let (rest, grpc) = (wants(api_addr), wants(grpc_addr));
    if args.tls == TlsMode::Off {
        if given.is_some() {
            bail!("--tls off and --tls-cert contradict each other; drop one of them");
        }
        for (addr, door) in [(api_addr, "REST API"), (grpc_addr, "agent service")] {
            if !addr.ip().is_loopback() {
                tracing::warn!(%addr, door, "TLS is off on a door beyond loopback: tokens travel in clear");
            }
        }
    }
    if !rest && !grpc {
        return Ok(None);
    }
    let files = match given {
        Some(files) => files,
        None => {
            let mut names = vec!["localhost".to_owned(), "127.0.0.1".to_owned(), "::1".to_owned()];
            if let Some(host) = HostInventory::discover().hostname {
                names.push(host);
            }
            for addr in [api_addr, grpc_addr] {
                if !addr.ip().is_unspecified() && !addr.ip().is_loopback() {
                    names.push(addr.ip().to_string());
                }
            }
            names.dedup();
            let generated = skein_orchestrator::transport::tls::load_or_generate(&dir.join("tls"), &names)?;
            if generated.new {
                eprintln!(
                    "skein server: made a self-signed TLS certificate, {}, in {}",
                    generated.fingerprint,
                    generated.files.cert.display()
                );
            }
            generated.files
        }
    };
    Ok(Some(ServerTls { files, rest, grpc }))
}

/// The doors' timeouts and caps from the server's flags.
fn transport_config(args: &ServerArgs) -> anyhow::Result<TransportConfig> {
    let duration = |text: &str, flag: &str| -> anyhow::Result<Duration> {
        let value = humantime::parse_duration(text)
            .with_context(|| format!("{flag} `{text}` is not a duration; write e.g. 10s or 500ms"))?;
        if value < Duration::from_millis(100) || value > Duration::from_secs(24 * 3600) {
            bail!("{flag} must be between 100ms and 24h");
        }
        Ok(value)
    };
    Ok(TransportConfig {
        header_read_timeout: duration(&args.header_timeout, "--header-timeout")?,
        idle_timeout: duration(&args.idle_timeout, "--idle-timeout")?,
        max_connections: args.max_connections.and_then(|n| usize::try_from(n).ok()),
    })
}

/// A door's address as a URL: `https://` when it speaks TLS.
fn door_url(tls: bool, addr: SocketAddr) -> String {
    format!("{}://{addr}", if tls { "https" } else { "http" })
}

/// A multi-threaded tokio runtime with `workers` threads (one per core by default).
pub fn runtime(workers: Option<usize>) -> anyhow::Result<tokio::runtime::Runtime> {
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if let Some(workers) = workers {
        builder.worker_threads(workers);
    }
    builder.enable_all().build().context("cannot start the async runtime")
}

/// Logs to stderr; `RUST_LOG` overrides the default `info`.
pub fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()) && std::env::var_os("NO_COLOR").is_none())
        .with_writer(std::io::stderr)
        .try_init();
}

/// `skein server`.
pub fn run_server(args: &ServerArgs) -> anyhow::Result<ExitCode> {
    init_logging();
    private_umask();
    let (config, dir) = server_config(args, DEFAULT_GRPC_ADDR)?;
    let runtime = runtime(None)?;
    runtime.block_on(async {
        let server = skein_orchestrator::server::start(config).await?;
        eprintln!(
            "skein server: REST API on {}, agents join at {} with the token in {}",
            door_url(server.rest_tls, server.api_addr),
            door_url(server.grpc_tls, server.grpc_addr),
            dir.join("join-token").display()
        );
        if let Some(fingerprint) = server.tls_fingerprint {
            eprintln!(
                "skein server: TLS certificate {fingerprint}; agents and clients elsewhere pin it with --server-fingerprint {fingerprint}"
            );
        }
        tokio::select! {
            _ = server.wait() => bail!("the server stopped"),
            _ = tokio::signal::ctrl_c() => {
                eprintln!("skein server: stopping");
                Ok(ExitCode::from(EXIT_OK))
            }
        }
    })
}

/// What `skein nodes` reads from `GET /v1/graph`.
#[derive(Debug, Deserialize)]
struct Graph {
    nodes: Vec<Node>,
}

#[derive(Debug, Deserialize)]
struct Node {
    inventory: Inventory,
    connected: bool,
    health: Health,
    /// Why the node is draining (its agent will leave), if it is.
    #[serde(default)]
    draining: Option<String>,
    gpus: Vec<Gpu>,
}

#[derive(Debug, Deserialize)]
struct Inventory {
    name: String,
    /// Absent from servers that predate labels.
    #[serde(default)]
    labels: BTreeMap<String, String>,
}

#[derive(Debug, Deserialize)]
struct Health {
    state: HealthState,
    reasons: Vec<String>,
}

#[derive(Debug, Deserialize)]
struct Gpu {
    facts: GpuFacts,
    latest: Option<Sample>,
    health: Health,
    /// Why nothing new is placed on it (a reflex's drain, or its node draining).
    #[serde(default)]
    drained: Option<String>,
}

#[derive(Debug, Deserialize)]
struct GpuFacts {
    index: u32,
    name: String,
    memory_total: u64,
}

#[derive(Debug, Deserialize)]
struct Sample {
    memory_used: u64,
    utilization_pct: Option<u32>,
    temperature_c: Option<i32>,
}

fn gib(bytes: u64) -> String {
    format!("{:.1}", bytes as f64 / (1u64 << 30) as f64)
}

/// The table `skein nodes` prints: one row per GPU, one per GPU-less node; when any node
/// has labels, a last column with each node's (`zone=lab-a,rack=r1`) on its first row.
fn render_nodes(graph: &Graph) -> String {
    let labelled = graph.nodes.iter().any(|node| !node.inventory.labels.is_empty());
    let mut rows: Vec<Vec<String>> = Vec::new();
    for node in &graph.nodes {
        let first_row = rows.len();
        // Down and left say the agent is gone already.
        let node_health = if node.connected || node.health.state.is_unavailable() {
            node.health.state.to_string()
        } else {
            format!("{} (disconnected)", node.health.state)
        };
        if node.gpus.is_empty() {
            rows.push(vec![
                node.inventory.name.clone(),
                "-".to_owned(),
                "(no GPU)".to_owned(),
                "-".to_owned(),
                "-".to_owned(),
                "-".to_owned(),
                match &node.draining {
                    Some(reason) => format!("{node_health}; draining: {reason}"),
                    None => node_health.clone(),
                },
            ]);
        }
        for gpu in &node.gpus {
            let (used, util, temp) = match &gpu.latest {
                Some(s) => (
                    gib(s.memory_used),
                    s.utilization_pct.map_or("-".to_owned(), |u| format!("{u}%")),
                    s.temperature_c.map_or("-".to_owned(), |t| format!("{t}°C")),
                ),
                None => ("-".to_owned(), "-".to_owned(), "-".to_owned()),
            };
            let mut health = gpu.health.state.to_string();
            if let Some(reason) = gpu.health.reasons.first() {
                let _ = write!(health, ": {reason}");
            }
            // Drained (a reflex) or draining (its node will leave): nothing new goes
            // there, whatever its health.
            if let Some(reason) = &gpu.drained {
                let word = if node.draining.as_ref() == Some(reason) {
                    "draining"
                } else {
                    "drained"
                };
                health = if gpu.health.state == HealthState::Ok {
                    format!("{word}: {reason}")
                } else {
                    format!("{health}; {word}: {reason}")
                };
            }
            rows.push(vec![
                node.inventory.name.clone(),
                gpu.facts.index.to_string(),
                gpu.facts.name.clone(),
                format!("{used} / {}", gib(gpu.facts.memory_total)),
                util,
                temp,
                health,
            ]);
        }
        if labelled {
            let labels = node
                .inventory
                .labels
                .iter()
                .map(|(key, value)| format!("{key}={value}"))
                .collect::<Vec<_>>()
                .join(",");
            for (i, row) in rows.iter_mut().enumerate().skip(first_row) {
                row.push(match (i == first_row, labels.is_empty()) {
                    (true, true) => "-".to_owned(),
                    (true, false) => labels.clone(),
                    (false, _) => String::new(),
                });
            }
        }
    }
    // Figures right-aligned under their headers, text left-aligned.
    let style = crate::table::Style {
        indent: "",
        gap: 3,
        right_aligned: &[3, 4, 5],
    };
    let mut header = vec!["NODE", "GPU", "MODEL", "MEMORY (GiB)", "UTIL", "TEMP", "HEALTH"];
    if labelled {
        header.push("LABELS");
    }
    crate::table::render(&style, &header, &rows)
}

/// The REST API token: the flag (or SKEIN_API_TOKEN), else the api-token file of a
/// server on this machine.
pub fn api_token(args: &ApiClientArgs) -> anyhow::Result<Secret> {
    if let Some(token) = args.api_token.as_deref().and_then(Secret::new) {
        return Ok(token);
    }
    let file = data_dir(args.data_dir.as_deref())?.join("api-token");
    let text = std::fs::read_to_string(&file).with_context(|| {
        format!(
            "no API token: pass --api-token, set SKEIN_API_TOKEN, or run on the server's machine (reads {})",
            file.display()
        )
    })?;
    Secret::new(text).with_context(|| format!("{} is empty", file.display()))
}

/// `skein nodes`.
pub fn run_nodes(args: &NodesArgs) -> anyhow::Result<ExitCode> {
    let client = crate::client::ApiClient::new(&args.server, &args.client)?;
    loop {
        let response = client.get("/v1/graph")?;
        match args.output {
            OutputFormat::Json => println!("{response}"),
            OutputFormat::Human => {
                let graph: Graph =
                    serde_json::from_str(&response).context("the server's graph is not what this skein expects")?;
                if args.watch {
                    // Clear the screen and go home, as `watch` does.
                    print!("\x1b[2J\x1b[H");
                }
                print!("{}", render_nodes(&graph));
                if graph.nodes.is_empty() {
                    println!("(no node has joined yet)");
                }
            }
        }
        if !args.watch {
            return Ok(ExitCode::from(EXIT_OK));
        }
        std::io::stdout().flush().ok();
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// What an agent reports.
pub(crate) struct AgentParts {
    /// Its GPUs.
    pub source: Box<dyn GpuSource>,
    /// Its node's name.
    pub node_name: String,
    /// Its host.
    pub host: HostInventory,
    /// Where the host's live figures come from (`None` for a simulated node).
    pub live: Option<HostSampler>,
    /// A simulated node's labels (`labels:` in its fleet file); none for a real one.
    pub labels: BTreeMap<String, String>,
    /// The device index of each GPU of `source`, when they differ from its indices
    /// (a Slurm job's GPUs, renumbered); empty otherwise.
    pub devices: Vec<u32>,
}

/// A machine's GPU source and node name: a simulated fleet node, or NVML (a CPU-only
/// node when there is no NVIDIA driver).
fn gpu_source(simulate: Option<&Path>, node: Option<&str>) -> anyhow::Result<AgentParts> {
    let host = HostInventory::discover();
    if let Some(file) = simulate {
        let fleet = load_fleet(file).map_err(|e| anyhow::anyhow!("{e}"))?;
        let Some(name) = node else {
            bail!(
                "--simulate needs --node NAME, one of: {}",
                fleet.node_names().join(", ")
            );
        };
        let source = fleet.node(name).map_err(|e| anyhow::anyhow!("{e}"))?;
        return Ok(simulated_parts(source, host));
    }
    let name = match node {
        Some(name) => name.to_owned(),
        None => host
            .hostname
            .clone()
            .context("this machine reports no hostname; give the node a name with --node NAME")?,
    };
    let source: Box<dyn GpuSource> = match discover_nvml() {
        Ok(Some(nvml)) => {
            tracing::info!(gpus = nvml.inventory().len(), source = %nvml.describe(), "GPUs discovered");
            Box::new(nvml)
        }
        Ok(None) => {
            tracing::info!("no NVIDIA driver (libnvidia-ml.so.1 not found): this is a CPU-only node");
            Box::new(NoGpus)
        }
        Err(error) => {
            tracing::warn!(%error, "NVML failed to start: this node reports no GPUs");
            Box::new(NoGpus)
        }
    };
    Ok(AgentParts {
        source,
        node_name: name,
        host,
        live: Some(HostSampler::new()),
        labels: BTreeMap::new(),
        devices: Vec::new(),
    })
}

/// The parts of simulated node `source`, on a machine whose host is `host`.
fn simulated_parts(source: skein_agent::SimulatedSource, host: HostInventory) -> AgentParts {
    AgentParts {
        node_name: source.node_name().to_owned(),
        host: source.host_inventory(host),
        labels: source.node().labels.clone(),
        source: Box::new(source),
        live: None,
        devices: Vec::new(),
    }
}

/// A node's labels: its fleet file's (`fleet`), with those of the command line
/// (`--label KEY=VALUE`, each checked by clap) added over them. Errors: a key given
/// twice on the command line with different values; more labels than a node may carry.
fn node_labels(
    fleet: BTreeMap<String, String>,
    command_line: &[(String, String)],
) -> anyhow::Result<BTreeMap<String, String>> {
    use skein_proto::labels;
    let given = labels::collect(command_line.iter().cloned()).map_err(|e| anyhow::anyhow!("--label: {e}"))?;
    let mut merged = fleet;
    merged.extend(given);
    labels::check_all(&merged).map_err(|e| anyhow::anyhow!("--label and the fleet file's labels together: {e}"))?;
    Ok(merged)
}

/// What an agent's engines need to know of its GPUs.
struct EngineGpus {
    /// They are simulated.
    simulated: bool,
    /// Their device indices ([`AgentParts::devices`]).
    devices: Vec<u32>,
}

/// How long a leaving agent gives its engines to stop (each gets SIGTERM, then SIGKILL
/// after the supervisor's grace): well inside Slurm's default `KillWait` of 30 s.
const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(20);

/// An agent's engines: a supervisor logging to `logs_dir`, and the host that downloads
/// models and reports instances (on the returned receiver, for the daemon).
fn engine_host(
    engines: &EngineArgs,
    join: &str,
    logs_dir: PathBuf,
    gpus: EngineGpus,
) -> anyhow::Result<(Arc<dyn InstanceHost>, mpsc::Receiver<InstanceStatus>)> {
    let skein = std::env::current_exe().context("cannot find the skein binary for the built-in engine")?;
    let hub = skein_model_registry::hub::HubClientBuilder::from_env()
        .build()
        .context("cannot set up the Hugging Face hub client (HF_ENDPOINT, HF_HOME, HF_TOKEN)")?;
    let (supervisor, events) = Supervisor::new(SupervisorConfig {
        logs_dir,
        readiness_timeout: Duration::from_secs(15 * 60),
        health_interval: Duration::from_secs(5),
        restart: RestartPolicy {
            max_restarts: 5,
            first_backoff: Duration::from_secs(1),
            max_backoff: Duration::from_secs(60),
            reset_after: Duration::from_secs(5 * 60),
        },
        stop_grace: Duration::from_secs(10),
    });
    let (reports, receiver) = mpsc::channel(256);
    let host = EngineHost::new(
        supervisor,
        events,
        hub,
        EngineHostConfig {
            skein,
            llama_server: engines.llama_server.clone(),
            vllm: engines.vllm.clone(),
            ray: engines.ray.clone(),
            rpc_server: engines
                .rpc_server
                .clone()
                .unwrap_or_else(|| skein_agent::engine::host::default_rpc_server(std::env::var_os("PATH").as_deref())),
            listen_host: engines.engine_host.clone().unwrap_or_else(|| engine_address(join)),
            simulated_gpus: gpus.simulated,
            devices: gpus.devices,
        },
        reports,
    );
    Ok((Arc::new(host), receiver))
}

/// `skein agent`.
pub fn run_agent(args: &AgentArgs) -> anyhow::Result<ExitCode> {
    init_logging();
    private_umask();
    let token = match (&args.token, &args.token_file) {
        (Some(token), _) => token.trim().to_owned(),
        (None, Some(file)) => std::fs::read_to_string(file)
            .with_context(|| format!("cannot read the join token from {}", file.display()))?
            .trim()
            .to_owned(),
        (None, None) => bail!(
            "no join token: pass --token TOKEN or --token-file FILE (the server keeps it in <data dir>/join-token)"
        ),
    };
    // The command line's own mistakes first, before looking at the machine.
    node_labels(BTreeMap::new(), &args.labels)?;
    let job = if args.no_slurm {
        None
    } else {
        skein_agent::slurm::detect(|name| std::env::var(name).ok())?
    };
    // In a Slurm job the node is the Slurm node, unless named on the command line.
    let node = args
        .node
        .clone()
        .or_else(|| job.as_ref().and_then(|job| job.node_name.clone()));
    let parts = gpu_source(args.simulate.as_deref(), node.as_deref())?;
    let (parts, why) = match &job {
        Some(job) => crate::slurm::agent_in_job(parts, job)?,
        None => (parts, crate::signals::Why::default()),
    };
    let AgentParts {
        source,
        node_name,
        host,
        live,
        labels,
        devices,
    } = parts;
    let config = AgentConfig {
        join: args.join.clone(),
        token,
        node_name,
        tls_ca: args.ca.clone(),
        tls_pin: agent_pin(args)?,
        version: env!("CARGO_PKG_VERSION").to_owned(),
        labels: node_labels(crate::kubernetes::with_pod_labels(labels, &args.pod), &args.labels)?,
        state_dir: Some(match &args.state_dir {
            Some(dir) => dir.clone(),
            None => data_dir(args.data_dir.as_deref())?.join("agent"),
        }),
    };
    // The agent keeps instance logs (users' prompts among them) in its data directory.
    let agent_dir = data_dir(args.data_dir.as_deref())?;
    skein_orchestrator::private::private_dir(&agent_dir).with_context(|| {
        format!(
            "cannot make the data directory {} private (mode 0700)",
            agent_dir.display()
        )
    })?;
    let logs_dir = agent_dir.join("logs").join(&config.node_name);
    let gpus = EngineGpus {
        simulated: args.simulate.is_some(),
        devices,
    };
    let runtime = runtime(Some(1))?;
    runtime.block_on(async {
        let mut signals = crate::signals::Signals::install(why)?;
        let (engines, reports) = engine_host(&args.engines, &args.join, logs_dir, gpus)?;
        let (departures_tx, departures) = mpsc::channel(4);
        let agent = skein_agent::daemon::run(Agent {
            config,
            source,
            host,
            live,
            engines: Arc::clone(&engines),
            reports,
            departures,
        });
        tokio::pin!(agent);
        let mut leaving = false;
        loop {
            tokio::select! {
                result = &mut agent => {
                    result?;
                    break;
                }
                departure = signals.next() => {
                    let leave = matches!(departure, Departure::Leave { .. });
                    if leave && leaving {
                        tracing::warn!("a second signal: leaving without waiting for the orchestrator");
                        break;
                    }
                    leaving |= leave;
                    // The agent is gone only if it already returned, which the other
                    // branch sees first.
                    let _ = departures_tx.send(departure).await;
                }
            }
        }
        if tokio::time::timeout(SHUTDOWN_TIMEOUT, engines.shutdown())
            .await
            .is_err()
        {
            tracing::warn!("engines did not stop in time; they are killed with the agent");
        }
        Ok(ExitCode::from(EXIT_OK))
    })
}

/// The certificate an agent pins: `--server-fingerprint`; else, for an `https://`
/// server on loopback, the certificate a server on this machine made in its data
/// directory; else none (the CA of `--ca`, or the system's roots, are trusted).
fn agent_pin(args: &AgentArgs) -> anyhow::Result<Option<skein_proto::tls::Fingerprint>> {
    if let Some(text) = &args.server_fingerprint {
        return Ok(Some(text.parse().context("--server-fingerprint")?));
    }
    if args.ca.is_some() || !args.join.starts_with("https://") || !crate::client::is_loopback_url(&args.join) {
        return Ok(None);
    }
    crate::client::local_certificate(args.data_dir.as_deref())
}

/// `skein up`: the server and this machine's agent (or every node of a simulated
/// fleet) in one process.
pub fn run_up(args: &UpArgs) -> anyhow::Result<ExitCode> {
    init_logging();
    private_umask();
    let (config, dir) = server_config(&args.server, DEFAULT_UP_GRPC_ADDR)?;
    let join_token = config.join_token.expose().to_owned();
    let agents: Vec<AgentParts> = match &args.fleet {
        Some(file) => {
            let fleet = load_fleet(file).map_err(|e| anyhow::anyhow!("{e}"))?;
            let host = HostInventory::discover();
            let mut agents = Vec::new();
            for name in fleet.node_names() {
                let source = fleet.node(name).map_err(|e| anyhow::anyhow!("{e}"))?;
                agents.push(simulated_parts(source, host.clone()));
            }
            agents
        }
        None => vec![gpu_source(None, None)?],
    };
    // `skein up` stops as a whole on Ctrl-C; its agents are never told to leave, so
    // the senders are only kept.
    let mut departure_senders = Vec::new();
    let runtime = runtime(None)?;
    runtime.block_on(async {
        let server = skein_orchestrator::server::start(config).await?;
        let join = door_url(server.grpc_tls, loopback(server.grpc_addr));
        // The local agents trust the server's own certificate, whatever it is.
        let pin = server.tls_fingerprint.filter(|_| server.grpc_tls);
        let nodes = agents.len();
        let gpus: usize = agents.iter().map(|agent| agent.source.inventory().len()).sum();
        let mut tasks = Vec::new();
        let simulated = args.fleet.is_some();
        for AgentParts {
            source,
            node_name,
            host,
            live,
            labels,
            devices,
        } in agents
        {
            let gpus = EngineGpus { simulated, devices };
            let (engines, reports) = engine_host(&args.engines, &join, dir.join("logs").join(&node_name), gpus)?;
            let config = AgentConfig {
                join: join.clone(),
                token: join_token.clone(),
                node_name,
                tls_ca: None,
                tls_pin: pin,
                version: env!("CARGO_PKG_VERSION").to_owned(),
                labels,
                state_dir: Some(dir.join("agent")),
            };
            let (departures_tx, departures) = mpsc::channel(1);
            departure_senders.push(departures_tx);
            tasks.push(tokio::spawn(skein_agent::daemon::run(Agent {
                config,
                source,
                host,
                live,
                engines,
                reports,
                departures,
            })));
        }
        let reach = client_flags(
            &door_url(server.rest_tls, loopback(server.api_addr)),
            args.server.data_dir.as_deref(),
            &data_dir(None).ok(),
        );
        eprintln!(
            "skein is up: {nodes} node{} with {gpus} GPU{}; REST API on {} (token in {}); \
             more agents join at {}.\nTry: skein nodes{reach}\n     skein submit workflows/hello.yaml --wait{reach}",
            if nodes == 1 { "" } else { "s" },
            if gpus == 1 { "" } else { "s" },
            door_url(server.rest_tls, server.api_addr),
            dir.join("api-token").display(),
            door_url(server.grpc_tls, server.grpc_addr),
        );
        if let Some(fingerprint) = server.tls_fingerprint {
            eprintln!("skein: TLS certificate {fingerprint} (agents elsewhere pin it with --server-fingerprint)");
        }
        tokio::select! {
            _ = server.wait() => bail!("the server stopped"),
            _ = tokio::signal::ctrl_c() => {
                eprintln!("skein: stopping");
                for task in tasks {
                    task.abort();
                }
                Ok(ExitCode::from(EXIT_OK))
            }
        }
    })
}

/// Where an agent joining `join` (`http://HOST:PORT`) has its engines listen when not
/// told: loopback when the server is on this machine, else this machine's address on
/// the route to the server (what the server, and the other nodes of a split model,
/// reach). No packet is sent: the route is looked up by connecting a UDP socket.
fn engine_address(join: &str) -> String {
    let authority = join.split_once("://").map_or(join, |(_, rest)| rest);
    let authority = authority.split('/').next().unwrap_or(authority);
    let local = std::net::ToSocketAddrs::to_socket_addrs(authority)
        .ok()
        .and_then(|mut addrs| addrs.next())
        .and_then(|server| {
            if server.ip().is_loopback() {
                return Some(server.ip());
            }
            let any: SocketAddr = if server.is_ipv4() {
                (std::net::Ipv4Addr::UNSPECIFIED, 0).into()
            } else {
                (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
            };
            let socket = std::net::UdpSocket::bind(any).ok()?;
            socket.connect(server).ok()?;
            socket.local_addr().ok().map(|a| a.ip())
        });
    match local {
        Some(ip) if ip.is_loopback() => "127.0.0.1".to_owned(),
        Some(ip) => ip.to_string(),
        None => {
            tracing::warn!(
                %join,
                "cannot tell this machine's address towards the server; engines listen on 127.0.0.1, which only this machine reaches (set --engine-host)"
            );
            "127.0.0.1".to_owned()
        }
    }
}

/// An address to connect to: a wildcard listen address becomes loopback.
/// The flags a client command on this machine needs to reach a server whose REST API
/// answers at `api` (on loopback) and whose data directory is `data_dir_flag` (its
/// `--data-dir`, `None` for the default, which `default_dir` is): ` --server URL` unless
/// `api` is [`DEFAULT_SERVER`](crate::cli::DEFAULT_SERVER), ` --data-dir DIR` (where the
/// token is, and an `https://` server's certificate) unless the client's default finds
/// it. Empty when the defaults reach it.
fn client_flags(api: &str, data_dir_flag: Option<&Path>, default_dir: &Option<PathBuf>) -> String {
    let mut flags = String::new();
    if api != crate::cli::DEFAULT_SERVER {
        let _ = write!(flags, " --server {}", shell_word(api));
    }
    if let Some(dir) = data_dir_flag
        && default_dir.as_deref() != Some(dir)
    {
        let _ = write!(flags, " --data-dir {}", shell_word(&dir.display().to_string()));
    }
    flags
}

/// `word` as a shell reads it back: as it is when it holds nothing the shell would
/// interpret, else in single quotes.
fn shell_word(word: &str) -> String {
    let plain = !word.is_empty()
        && word
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "/._-:=@,+%".contains(c));
    if plain {
        word.to_owned()
    } else {
        format!("'{}'", word.replace('\'', "'\\''"))
    }
}

fn loopback(addr: SocketAddr) -> SocketAddr {
    if addr.ip().is_unspecified() {
        SocketAddr::new(std::net::Ipv4Addr::LOCALHOST.into(), addr.port())
    } else {
        addr
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_banner_suggests_the_flags_that_reach_the_server() {
        let default_dir = Some(PathBuf::from("/home/me/.local/share/skein"));
        // The defaults reach it: no flag.
        assert_eq!(client_flags("http://127.0.0.1:7878", None, &default_dir), "");
        assert_eq!(
            client_flags(
                "http://127.0.0.1:7878",
                Some(Path::new("/home/me/.local/share/skein")),
                &default_dir
            ),
            ""
        );
        // Another port, TLS, another data directory.
        assert_eq!(
            client_flags("http://127.0.0.1:9000", None, &default_dir),
            " --server http://127.0.0.1:9000"
        );
        assert_eq!(
            client_flags("https://127.0.0.1:7878", Some(Path::new("/srv/skein")), &default_dir),
            " --server https://127.0.0.1:7878 --data-dir /srv/skein"
        );
        assert_eq!(
            client_flags("http://127.0.0.1:7878", Some(Path::new("/tmp/my lab's dir")), &None),
            r#" --data-dir '/tmp/my lab'\''s dir'"#
        );
    }

    #[test]
    fn engines_listen_where_the_server_reaches_them() {
        assert_eq!(engine_address("http://127.0.0.1:7879"), "127.0.0.1");
        assert_eq!(engine_address("http://localhost:7879"), "127.0.0.1");
        // A server elsewhere: this machine's address on the route to it, never loopback
        // (here, the route to a documentation address, if the machine has a route).
        let elsewhere = engine_address("https://192.0.2.10:7879/");
        assert!(elsewhere.parse::<std::net::IpAddr>().is_ok(), "{elsewhere}");
    }

    fn graph(nodes: serde_json::Value) -> Graph {
        serde_json::from_value(serde_json::json!({ "nodes": nodes })).unwrap()
    }

    fn node(name: &str, labels: serde_json::Value, gpus: u32) -> serde_json::Value {
        let gpus: Vec<serde_json::Value> = (0..gpus)
            .map(|index| {
                serde_json::json!({
                    "facts": { "index": index, "name": "NVIDIA GeForce RTX 4090", "memory_total": 24u64 << 30 },
                    "latest": null,
                    "health": { "state": "ok", "reasons": [] },
                })
            })
            .collect();
        let mut inventory = serde_json::json!({ "name": name });
        if !labels.is_null() {
            inventory["labels"] = labels;
        }
        serde_json::json!({
            "inventory": inventory,
            "connected": true,
            "health": { "state": "ok", "reasons": [] },
            "gpus": gpus,
        })
    }

    #[test]
    fn drained_and_draining_gpus_say_so_with_why() {
        let mut reflexed = node("gpu-b", serde_json::Value::Null, 2);
        reflexed["gpus"][1]["drained"] = serde_json::json!("reflex `failing-memory` of run r1");
        let mut leaving = node("slurm-7", serde_json::Value::Null, 1);
        leaving["draining"] = serde_json::json!("the Slurm job ends in 120 s");
        leaving["gpus"][0]["drained"] = serde_json::json!("the Slurm job ends in 120 s");
        let table = render_nodes(&graph(serde_json::json!([reflexed, leaving])));
        let rows: Vec<&str> = table.lines().collect();
        assert!(rows[1].trim_end().ends_with("ok"), "{table}");
        assert!(
            rows[2]
                .trim_end()
                .ends_with("drained: reflex `failing-memory` of run r1"),
            "{table}"
        );
        assert!(
            rows[3].trim_end().ends_with("draining: the Slurm job ends in 120 s"),
            "{table}"
        );
    }

    #[test]
    fn labels_show_on_each_nodes_first_row_only_when_some_node_has_them() {
        let table = render_nodes(&graph(serde_json::json!([
            node("a100-box", serde_json::json!({ "zone": "lab-a", "rack": "r1" }), 2),
            node("cpu-1", serde_json::json!({}), 0),
            // A server that predates labels sends none.
            node("old-1", serde_json::Value::Null, 1),
        ])));
        let lines: Vec<&str> = table.lines().collect();
        assert!(lines[0].ends_with("HEALTH   LABELS"), "{table}");
        assert!(
            lines[1].starts_with("a100-box") && lines[1].ends_with("ok       rack=r1,zone=lab-a"),
            "{table}"
        );
        assert!(lines[2].starts_with("a100-box") && lines[2].ends_with("ok"), "{table}");
        assert!(
            lines[3].starts_with("cpu-1") && lines[3].ends_with("ok       -"),
            "{table}"
        );
        assert!(
            lines[4].starts_with("old-1") && lines[4].ends_with("ok       -"),
            "{table}"
        );

        let unlabelled = render_nodes(&graph(serde_json::json!([node("rtx-1", serde_json::Value::Null, 1)])));
        assert!(!unlabelled.contains("LABELS"), "{unlabelled}");
    }
}
