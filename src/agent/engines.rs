//! An agent's engines: the supervisor and the host that starts them, and the address
//! they listen on.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use skein_agent::daemon::InstanceHost;
use skein_agent::engine::host::{EngineHost, EngineHostConfig};
use skein_agent::engine::supervisor::{RestartPolicy, Supervisor, SupervisorConfig};
use skein_proto::agent::v1::InstanceStatus;
use tokio::sync::mpsc;

use crate::cli::agent::EngineArgs;

/// What an agent's engines need to know of its GPUs.
pub(crate) struct EngineGpus {
    /// They are simulated.
    pub simulated: bool,
    /// Their device indices ([`AgentParts::devices`](super::AgentParts::devices)).
    pub devices: Vec<u32>,
}

/// An agent's engines: a supervisor logging to `logs_dir`, and the host that downloads
/// models and reports instances (on the returned receiver, for the daemon).
pub(crate) fn engine_host(
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn engines_listen_where_the_server_reaches_them() {
        assert_eq!(engine_address("http://127.0.0.1:7879"), "127.0.0.1");
        assert_eq!(engine_address("http://localhost:7879"), "127.0.0.1");
        // A server elsewhere: this machine's address on the route to it, never loopback
        // (here, the route to a documentation address, if the machine has a route).
        let elsewhere = engine_address("https://192.0.2.10:7879/");
        assert!(elsewhere.parse::<std::net::IpAddr>().is_ok(), "{elsewhere}");
    }
}
