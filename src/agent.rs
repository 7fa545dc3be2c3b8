//! `skein agent`: what this machine (or a simulated node) reports, its labels, the
//! certificate it trusts, and the daemon that joins a server and answers signals.
//!
//! # Layout
//!
//! - [`engines`]: the engines an agent starts, and where they listen.
//! - [`kubernetes`]: the labels of the pod an agent runs in.
//! - [`slurm`]: what an agent does differently inside a Slurm job.

pub mod engines;
pub mod kubernetes;
pub mod slurm;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use skein_agent::daemon::{Agent, AgentConfig, Departure, NoGpus};
use skein_agent::{GpuSource, HostInventory, HostSampler, discover_nvml, load_fleet};
use tokio::sync::mpsc;

use self::engines::{EngineGpus, engine_host};
use crate::cli::EXIT_OK;
use crate::cli::agent::AgentArgs;
use crate::data_dir::{data_dir, private_umask};
use crate::runtime::{init_logging, runtime};

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
pub(crate) fn gpu_source(simulate: Option<&Path>, node: Option<&str>) -> anyhow::Result<AgentParts> {
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
pub(crate) fn simulated_parts(source: skein_agent::SimulatedSource, host: HostInventory) -> AgentParts {
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

/// How long a leaving agent gives its engines to stop (each gets SIGTERM, then SIGKILL
/// after the supervisor's grace): well inside Slurm's default `KillWait` of 30 s.
const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(20);

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
        Some(job) => slurm::agent_in_job(parts, job)?,
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
        labels: node_labels(kubernetes::with_pod_labels(labels, &args.pod), &args.labels)?,
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
