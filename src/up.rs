//! `skein up`: the server and this machine's agent (or every node of a simulated fleet)
//! in one process, and the banner that says how to reach it.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::bail;
use skein_agent::daemon::{Agent, AgentConfig};
use skein_agent::{HostInventory, load_fleet};
use tokio::sync::mpsc;

use crate::agent::engines::{EngineGpus, engine_host};
use crate::agent::{AgentParts, gpu_source, simulated_parts};
use crate::cli::EXIT_OK;
use crate::cli::common::DEFAULT_SERVER;
use crate::cli::server::{DEFAULT_UP_GRPC_ADDR, UpArgs};
use crate::data_dir::{data_dir, private_umask};
use crate::runtime::{init_logging, runtime};
use crate::server::{door_url, server_config};

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

/// The flags a client command on this machine needs to reach a server whose REST API
/// answers at `api` (on loopback) and whose data directory is `data_dir_flag` (its
/// `--data-dir`, `None` for the default, which `default_dir` is): ` --server URL` unless
/// `api` is [`DEFAULT_SERVER`], ` --data-dir DIR` (where the
/// token is, and an `https://` server's certificate) unless the client's default finds
/// it. Empty when the defaults reach it.
fn client_flags(api: &str, data_dir_flag: Option<&Path>, default_dir: &Option<PathBuf>) -> String {
    let mut flags = String::new();
    if api != DEFAULT_SERVER {
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

/// An address to connect to: a wildcard listen address becomes loopback.
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
}
