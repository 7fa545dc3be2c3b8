//! `skein server`: the orchestrator's configuration from its flags (the data directory,
//! tokens, TLS, the doors' limits), and the command that runs it.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, bail};
use skein_agent::HostInventory;
use skein_orchestrator::graph::GraphConfig;
use skein_orchestrator::server::{ServerConfig, ServerTls, TlsFiles};
use skein_orchestrator::transport::TransportConfig;

use crate::cli::EXIT_OK;
use crate::cli::server::{DEFAULT_GRPC_ADDR, ServerArgs, TlsMode};
use crate::data_dir::{data_dir, private_umask, secret_from};
use crate::runtime::{init_logging, runtime};
use crate::signals::StopSignals;

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
            executor: skein_orchestrator::run::ExecutorConfig {
                tool_commands: args.allow_tool_commands.clone(),
                fair_share_half_life: args.fair_share_half_life,
                preempt: args.preempt,
                max_user_priority: args.max_user_priority,
                ..skein_orchestrator::run::ExecutorConfig::default()
            },
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
pub fn door_url(tls: bool, addr: SocketAddr) -> String {
    format!("{}://{addr}", if tls { "https" } else { "http" })
}

/// `skein server`.
pub fn run_server(args: &ServerArgs) -> anyhow::Result<ExitCode> {
    init_logging();
    private_umask();
    let (config, dir) = server_config(args, DEFAULT_GRPC_ADDR)?;
    let runtime = runtime(None)?;
    runtime.block_on(async {
        // Before the doors open: a stop asked from here on is a graceful one.
        let mut signals = StopSignals::install()?;
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
        let stop = async {
            let signal = signals.next().await;
            eprintln!("skein server: {signal}: stopping (answering the requests in flight)");
        };
        let stopped = server.serve_until(stop).await?;
        if !stopped.drained {
            eprintln!(
                "skein server: some requests were still running after {}; they were stopped",
                humantime::format_duration(skein_orchestrator::server::DRAIN_TIMEOUT)
            );
        }
        eprintln!("skein server: stopped");
        Ok(ExitCode::from(EXIT_OK))
    })
}
