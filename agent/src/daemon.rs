//! The agent's connection to the orchestrator: register, then one long-lived stream
//! (telemetry up, pings and later commands down), reconnecting with backoff for as long
//! as the agent runs.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use skein_model_registry::error_chain;
use skein_proto::agent::v1::{
    self as pb, AgentMessage, RegisterRequest, agent_message, agent_service_client::AgentServiceClient,
    orchestrator_message,
};
use tokio::sync::mpsc;
use tonic::Request;
use tonic::metadata::MetadataValue;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};

use crate::gpu::{GpuInfo, GpuSample, GpuSource};
use crate::host::{HostInventory, HostLive, HostSampler};
use crate::identity::{IdentityError, NodeCredential};

/// The GPU source of a machine without GPUs (or without the NVIDIA driver): a CPU-only
/// node, which still reports its host and can run CPU engines.
#[derive(Debug, Default)]
pub struct NoGpus;

impl GpuSource for NoGpus {
    fn inventory(&self) -> &[GpuInfo] {
        &[]
    }

    fn sample(&mut self, _t: f64) -> Vec<Result<GpuSample, crate::gpu::SampleError>> {
        Vec::new()
    }

    fn describe(&self) -> String {
        "none (CPU-only node)".to_owned()
    }
}

/// How an agent reaches its orchestrator.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    /// The orchestrator's agent address: `http://host:7879`, or `https://…` with TLS.
    pub join: String,
    /// The join token.
    pub token: String,
    /// This node's name (hostname, or the simulated node's).
    pub node_name: String,
    /// A PEM CA certificate to trust for `https://` (default: the system's roots).
    pub tls_ca: Option<PathBuf>,
    /// Trust only the `https://` server whose certificate has this fingerprint (the one
    /// `skein server` made and printed), instead of a CA.
    pub tls_pin: Option<skein_proto::tls::Fingerprint>,
    /// The agent's version, sent at registration.
    pub version: String,
    /// The node's labels (`--label zone=lab-a`, over a simulated node's `labels:`), sent
    /// at registration; checked by [`skein_proto::labels::check_all`] before [`run`]
    /// connects.
    pub labels: BTreeMap<String, String>,
    /// Where the node's credential is kept ([`crate::identity`]), made on the first
    /// start; `None` keeps it in memory only, so a restarted agent cannot take its node
    /// name back until an admin frees it (`skein node reset NAME`).
    pub state_dir: Option<PathBuf>,
}

/// Why the agent stopped for good (a transient failure only causes a reconnect).
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// The join address is not a URL the agent can use.
    #[error("--join `{url}` is not usable: {reason}; help: write http://HOST:7879 (https:// with TLS)")]
    BadJoinUrl {
        /// The address given.
        url: String,
        /// Why.
        reason: String,
    },
    /// The orchestrator refused the token: retrying would not help.
    #[error("the orchestrator refused this agent: {0}")]
    Refused(String),
    /// A label the orchestrator would refuse.
    #[error(transparent)]
    BadLabel(#[from] skein_proto::labels::LabelError),
    /// The node's credential could not be read or kept.
    #[error(transparent)]
    Identity(#[from] IdentityError),
    /// The CA file could not be read.
    #[error("cannot read the CA certificate {}", .path.display())]
    TlsCa {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

/// First wait after a failed connection; doubled up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(200);
/// Longest wait between attempts.
const MAX_BACKOFF: Duration = Duration::from_secs(10);

/// How the agent reaches the orchestrator: the endpoint, and for a pinned certificate
/// the connector that speaks TLS to it (tonic's own TLS trusts CAs only).
struct Door {
    endpoint: Endpoint,
    pinned: Option<crate::pinned::PinnedTls>,
}

impl Door {
    async fn connect(&self) -> Result<Channel, tonic::transport::Error> {
        match &self.pinned {
            Some(tls) => self.endpoint.connect_with_connector(tls.clone()).await,
            None => self.endpoint.connect().await,
        }
    }
}

/// The way to `config.join`.
fn endpoint(config: &AgentConfig) -> Result<Door, AgentError> {
    let bad = |reason: String| AgentError::BadJoinUrl {
        url: config.join.clone(),
        reason,
    };
    if !(config.join.starts_with("http://") || config.join.starts_with("https://")) {
        return Err(bad("it does not start with http:// or https://".to_owned()));
    }
    let tuned = |endpoint: Endpoint| {
        endpoint
            .connect_timeout(Duration::from_secs(5))
            .http2_keep_alive_interval(Duration::from_secs(10))
            .keep_alive_timeout(Duration::from_secs(10))
    };
    if let Some(pin) = config.tls_pin {
        let Some(rest) = config.join.strip_prefix("https://") else {
            return Err(bad(
                "a pinned certificate (--server-fingerprint) needs an https:// address".to_owned(),
            ));
        };
        // The connector speaks TLS itself; tonic sees a plain connection.
        let endpoint = Endpoint::from_shared(format!("http://{rest}")).map_err(|e| bad(e.to_string()))?;
        let pinned = crate::pinned::PinnedTls::new(pin).map_err(|e| bad(e.to_string()))?;
        return Ok(Door {
            endpoint: tuned(endpoint),
            pinned: Some(pinned),
        });
    }
    let mut endpoint = tuned(Endpoint::from_shared(config.join.clone()).map_err(|e| bad(e.to_string()))?);
    if config.join.starts_with("https://") {
        let mut tls = ClientTlsConfig::new().with_native_roots();
        if let Some(path) = &config.tls_ca {
            let pem = std::fs::read(path).map_err(|source| AgentError::TlsCa {
                path: path.clone(),
                source,
            })?;
            tls = tls.ca_certificate(Certificate::from_pem(pem));
        }
        endpoint = endpoint.tls_config(tls).map_err(|e| bad(e.to_string()))?;
    }
    Ok(Door { endpoint, pinned: None })
}

/// The node is leaving, as the agent's owner tells [`run`] (`skein agent` on SIGUSR1,
/// SIGTERM and SIGINT: a Slurm job's warning and end).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Departure {
    /// The node will leave soon: the orchestrator places nothing new on it and moves its
    /// instances elsewhere while it still serves. Said again after each reconnect.
    Drain {
        /// Why, for people.
        reason: String,
        /// When it will leave, Unix milliseconds, when known.
        deadline_unix_ms: Option<i64>,
    },
    /// The node leaves now: [`run`] tells the orchestrator and returns.
    Leave {
        /// Why, for people.
        reason: String,
    },
}

/// Everything [`run`] works with.
pub struct Agent {
    /// How to reach the orchestrator, and who this node is.
    pub config: AgentConfig,
    /// The node's GPUs.
    pub source: Box<dyn GpuSource>,
    /// The node's host, as discovered.
    pub host: HostInventory,
    /// The host's load and free memory each tick; a simulated node has `None` and
    /// reports the figures of its inventory.
    pub live: Option<HostSampler>,
    /// Where engine commands go.
    pub engines: std::sync::Arc<dyn InstanceHost>,
    /// The reports of `engines`, sent up.
    pub reports: mpsc::Receiver<pb::InstanceStatus>,
    /// The owner's word that the node is leaving ([`Departure`]).
    pub departures: mpsc::Receiver<Departure>,
}

/// How long a leaving agent waits for the orchestrator to close the stream after its
/// `Leave` (the orchestrator closes it at once).
const LEAVE_TIMEOUT: Duration = Duration::from_secs(3);

/// What the agent does with the engine commands of its orchestrator: start and stop
/// instances, and report them. Reports go up through the channel given to [`run`].
pub trait InstanceHost: Send + Sync {
    /// Start an instance (a repeated start of a running instance is a no-op).
    fn start(&self, command: pb::StartInstance);
    /// Stop an instance.
    fn stop(&self, instance: &str);
    /// The current status of every instance, sent again after each reconnect.
    fn statuses(&self) -> Vec<pb::InstanceStatus>;
    /// The last `tail` lines of an instance's engine log.
    fn logs(&self, instance: &str, tail: usize) -> Result<Vec<String>, String>;
    /// Stops every instance (engines cleanly: a signal, a grace period, then a kill),
    /// for an agent that leaves.
    fn shutdown(&self) -> futures::future::BoxFuture<'_, ()>;
    /// The telemetry period the orchestrator asked for at registration: engines' memory
    /// is measured as often. Nothing by default.
    fn sample_interval(&self, _interval: Duration) {}
}

/// Runs the agent until the orchestrator refuses it or the node leaves: registers,
/// streams telemetry from `agent.source` at the interval the orchestrator asks for,
/// answers pings, hands engine commands to `agent.engines` and sends up their reports,
/// passes on [`Departure`]s, and reconnects with exponential backoff (0.2 s doubling to
/// 10 s) whenever the connection drops.
///
/// Returns `Ok(())` once a [`Departure::Leave`] was said to the orchestrator (or the
/// orchestrator could not be reached to hear it); the caller then stops the engines
/// ([`InstanceHost::shutdown`]).
///
/// Errors: [`AgentError::BadJoinUrl`], [`AgentError::TlsCa`], [`AgentError::BadLabel`],
/// [`AgentError::Identity`] (the node credential cannot be read or saved in
/// [`AgentConfig::state_dir`]), [`AgentError::Refused`] (a wrong, missing, revoked or
/// expired token, a node name another agent's credential holds, or an inventory the
/// orchestrator refuses); never for a server that is down or restarting.
pub async fn run(agent: Agent) -> Result<(), AgentError> {
    let Agent {
        config,
        mut source,
        host,
        mut live,
        engines,
        mut reports,
        mut departures,
    } = agent;
    let endpoint = endpoint(&config)?;
    skein_proto::labels::check_all(&config.labels)?;
    let credential = match &config.state_dir {
        Some(dir) => NodeCredential::load_or_create(dir, &config.node_name)?,
        None => NodeCredential::generate()?,
    };
    let me = Me {
        config: &config,
        credential: &credential,
    };
    let mut clock = Sequence {
        started: Instant::now(),
        seq: 0,
    };
    let mut drain: Option<pb::Drain> = None;
    let mut backoff = FIRST_BACKOFF;
    loop {
        let outcome = session(
            me,
            &endpoint,
            source.as_mut(),
            &host,
            live.as_mut(),
            &mut clock,
            Channels {
                engines: engines.as_ref(),
                reports: &mut reports,
                departures: &mut departures,
                drain: &mut drain,
            },
        )
        .await;
        match outcome {
            Ok(Ended::Left) => return Ok(()),
            Ok(Ended::Closed) => {
                tracing::warn!("the orchestrator closed the stream; reconnecting");
                backoff = FIRST_BACKOFF;
            }
            Err(SessionError::Refused(message)) => return Err(AgentError::Refused(message)),
            Err(SessionError::Connected(message)) => {
                tracing::warn!(%message, "lost the orchestrator; reconnecting");
                backoff = FIRST_BACKOFF;
            }
            Err(SessionError::Unreachable(message)) => {
                tracing::warn!(%message, retry_in = ?backoff, "cannot reach the orchestrator");
            }
        }
        // Between attempts, a departure is remembered (a drain, said after the next
        // connection) or ends the agent (a leave: there is no one to tell).
        let wait = tokio::time::sleep(backoff);
        tokio::pin!(wait);
        loop {
            tokio::select! {
                _ = &mut wait => break,
                Some(departure) = departures.recv() => match departure {
                    Departure::Leave { reason } => {
                        tracing::warn!(%reason, "leaving without telling the orchestrator: it cannot be reached");
                        return Ok(());
                    }
                    Departure::Drain { reason, deadline_unix_ms } => drain = Some(drain_message(reason, deadline_unix_ms)),
                },
            }
        }
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

fn drain_message(reason: String, deadline_unix_ms: Option<i64>) -> pb::Drain {
    pb::Drain {
        reason,
        deadline_unix_ms: deadline_unix_ms.unwrap_or(0),
    }
}

/// Who the agent is: its configuration and its node's credential.
#[derive(Clone, Copy)]
struct Me<'a> {
    config: &'a AgentConfig,
    credential: &'a NodeCredential,
}

/// How a connection ended without an error.
enum Ended {
    /// The orchestrator closed the stream.
    Closed,
    /// The agent said `Leave`.
    Left,
}

/// What a connection carries besides telemetry: where engine commands go, the reports
/// to send, the departures to pass on, and the drain said so far (said again on each
/// connection).
struct Channels<'a> {
    engines: &'a dyn InstanceHost,
    reports: &'a mut mpsc::Receiver<pb::InstanceStatus>,
    departures: &'a mut mpsc::Receiver<Departure>,
    drain: &'a mut Option<pb::Drain>,
}

/// Time since the agent started (the simulated signals' clock) and the telemetry batch
/// counter, both kept across reconnects.
struct Sequence {
    started: Instant,
    seq: u64,
}

enum SessionError {
    /// Wrong token or a refused registration.
    Refused(String),
    /// Never got through.
    Unreachable(String),
    /// Was connected, then lost it.
    Connected(String),
}

fn with_token<T>(message: T, token: &str) -> Result<Request<T>, SessionError> {
    let mut request = Request::new(message);
    let value = MetadataValue::try_from(format!("Bearer {token}"))
        .map_err(|_| SessionError::Refused("the join token has characters a header cannot carry".to_owned()))?;
    request.metadata_mut().insert(skein_proto::AUTHORIZATION, value);
    Ok(request)
}

fn status_error(status: &tonic::Status) -> SessionError {
    match status.code() {
        tonic::Code::Unauthenticated | tonic::Code::PermissionDenied | tonic::Code::InvalidArgument => {
            SessionError::Refused(status.message().to_owned())
        }
        _ => SessionError::Unreachable(format!("{}: {}", status.code(), status.message())),
    }
}

/// One connection: register, stream until it breaks.
async fn session(
    me: Me<'_>,
    endpoint: &Door,
    source: &mut dyn GpuSource,
    host: &HostInventory,
    mut live: Option<&mut HostSampler>,
    clock: &mut Sequence,
    channels: Channels<'_>,
) -> Result<Ended, SessionError> {
    let Channels {
        engines,
        reports,
        departures,
        drain,
    } = channels;
    let config = me.config;
    let channel: Channel = endpoint.connect().await.map_err(|e| {
        let mut message = error_chain(&e);
        if config.join.starts_with("http://") {
            message.push_str(" (if the server speaks TLS on this port, join with https://)");
        }
        SessionError::Unreachable(message)
    })?;
    let mut client = AgentServiceClient::new(channel);
    let registration = client
        .register(with_token(
            RegisterRequest {
                node_name: config.node_name.clone(),
                agent_version: config.version.clone(),
                inventory: Some(pb::Inventory {
                    labels: config.labels.clone(),
                    ..inventory(source, host)
                }),
                node_credential: me.credential.expose().to_owned(),
            },
            &config.token,
        )?)
        .await
        .map_err(|s| status_error(&s))?
        .into_inner();
    let interval = Duration::from_millis(u64::from(registration.sample_interval_ms.max(50)));
    tracing::info!(node = %registration.node_id, known = registration.known, ?interval, "registered");
    engines.sample_interval(interval);

    let (outbound, rx) = mpsc::channel::<AgentMessage>(64);
    let hello = AgentMessage {
        kind: Some(agent_message::Kind::Hello(pb::Hello {
            node_id: registration.node_id.clone(),
            node_credential: me.credential.expose().to_owned(),
        })),
    };
    outbound
        .send(hello)
        .await
        .map_err(|_| SessionError::Unreachable("the stream closed at once".to_owned()))?;
    let stream = futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|m| (m, rx)) });
    let mut inbound = client
        .session(with_token(stream, &config.token)?)
        .await
        .map_err(|s| status_error(&s))?
        .into_inner();

    let closed = || SessionError::Connected("the stream to the orchestrator closed".to_owned());
    // What the orchestrator may have missed while disconnected.
    for status in engines.statuses() {
        let message = AgentMessage {
            kind: Some(agent_message::Kind::InstanceStatus(status)),
        };
        outbound.send(message).await.map_err(|_| closed())?;
    }
    if let Some(drain) = drain.clone() {
        let message = AgentMessage {
            kind: Some(agent_message::Kind::Drain(drain)),
        };
        outbound.send(message).await.map_err(|_| closed())?;
    }
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            Some(departure) = departures.recv() => match departure {
                Departure::Drain { reason, deadline_unix_ms } => {
                    tracing::info!(%reason, ?deadline_unix_ms, "draining: asking the orchestrator to move this node's instances");
                    let message = drain_message(reason, deadline_unix_ms);
                    *drain = Some(message.clone());
                    let message = AgentMessage { kind: Some(agent_message::Kind::Drain(message)) };
                    outbound.send(message).await.map_err(|_| closed())?;
                }
                Departure::Leave { reason } => {
                    tracing::info!(%reason, "leaving the fleet");
                    let message = AgentMessage { kind: Some(agent_message::Kind::Leave(pb::Leave { reason })) };
                    outbound.send(message).await.map_err(|_| closed())?;
                    // The end of the stream tells the orchestrator nothing more is
                    // coming; it closes its side once it has taken the leave.
                    drop(outbound);
                    let _ = tokio::time::timeout(LEAVE_TIMEOUT, async {
                        while let Ok(Some(_)) = inbound.message().await {}
                    })
                    .await;
                    return Ok(Ended::Left);
                }
            },
            Some(status) = reports.recv() => {
                let message = AgentMessage { kind: Some(agent_message::Kind::InstanceStatus(status)) };
                outbound.send(message).await.map_err(|_| closed())?;
            }
            _ = tick.tick() => {
                let t = clock.started.elapsed().as_secs_f64();
                let samples: Vec<GpuSample> = source
                    .sample(t)
                    .into_iter()
                    .filter_map(|sample| sample.map_err(|error| tracing::debug!(%error, "a GPU could not be sampled")).ok())
                    .collect();
                clock.seq += 1;
                let now = match live.as_deref_mut() {
                    Some(sampler) => sampler.sample(),
                    None => HostLive {
                        load1: host.load_average.as_ref().map(|l| l.one),
                        memory_available: host.memory.available_bytes,
                    },
                };
                let message = telemetry(clock.seq, &samples, now);
                outbound.send(message).await.map_err(|_| closed())?;
            }
            message = inbound.message() => {
                match message {
                    Ok(Some(message)) => match message.kind {
                        Some(orchestrator_message::Kind::Ping(ping)) => {
                            let pong = AgentMessage { kind: Some(agent_message::Kind::Pong(pb::Pong { id: ping.id })) };
                            outbound.send(pong).await.map_err(|_| closed())?;
                        }
                        Some(orchestrator_message::Kind::StartInstance(command)) => {
                            tracing::info!(instance = %command.instance, "asked to start an instance");
                            engines.start(command);
                        }
                        Some(orchestrator_message::Kind::StopInstance(command)) => {
                            tracing::info!(instance = %command.instance, "asked to stop an instance");
                            engines.stop(&command.instance);
                        }
                        Some(orchestrator_message::Kind::LogsRequest(request)) => {
                            let tail = usize::try_from(request.tail).unwrap_or(usize::MAX);
                            let (lines, error) = match engines.logs(&request.instance, tail) {
                                Ok(lines) => (lines, String::new()),
                                Err(error) => (Vec::new(), error),
                            };
                            let reply = pb::LogsReply { id: request.id, lines, error };
                            let message = AgentMessage { kind: Some(agent_message::Kind::LogsReply(reply)) };
                            outbound.send(message).await.map_err(|_| closed())?;
                        }
                        None => {}
                    },
                    Ok(None) => return Ok(Ended::Closed),
                    Err(status) => return match status_error(&status) {
                        SessionError::Refused(message) => Err(SessionError::Refused(message)),
                        _ => Err(SessionError::Connected(format!("{}: {}", status.code(), status.message()))),
                    },
                }
            }
        }
    }
}

/// The inventory as the protocol carries it, without labels (which come from the
/// agent's configuration, or a simulated node's `labels:`).
pub fn inventory(source: &dyn GpuSource, host: &HostInventory) -> pb::Inventory {
    pb::Inventory {
        host: Some(pb::Host {
            hostname: host.hostname.clone().unwrap_or_default(),
            os: [host.os.name.as_deref(), host.os.version.as_deref()]
                .into_iter()
                .flatten()
                .collect::<Vec<_>>()
                .join(" "),
            kernel: host.os.kernel_version.clone().unwrap_or_default(),
            arch: host.os.arch.clone(),
            logical_cores: host
                .cpu
                .logical_cores
                .map_or(0, |c| u32::try_from(c).unwrap_or(u32::MAX)),
            physical_cores: host
                .cpu
                .physical_cores
                .map_or(0, |c| u32::try_from(c).unwrap_or(u32::MAX)),
            cpu_brand: host.cpu.brand.clone().unwrap_or_default(),
            memory_total: host.memory.total_bytes.unwrap_or(0),
            numa_nodes: host.numa_nodes.map_or(0, |n| u32::try_from(n).unwrap_or(u32::MAX)),
            network_bits_per_second: host.network_bits_per_second.unwrap_or(0),
        }),
        gpus: source.inventory().iter().map(gpu_to_wire).collect(),
        gpu_source: source.describe(),
        labels: Default::default(),
    }
}

fn gpu_to_wire(gpu: &GpuInfo) -> pb::Gpu {
    let (major, minor) = gpu.compute_capability.unwrap_or((0, 0));
    pb::Gpu {
        index: gpu.index,
        uuid: gpu.uuid.clone(),
        name: gpu.name.clone(),
        memory_total: gpu.memory_total,
        compute_major: major,
        compute_minor: minor,
        power_limit_mw: gpu.power_limit_mw.unwrap_or(0),
        pcie_generation: gpu.pcie.map_or(0, |p| p.generation),
        pcie_width: gpu.pcie.map_or(0, |p| p.width),
        nvlink_peers: gpu.nvlink_peers.clone(),
        mig_enabled: match gpu.mig_enabled {
            Some(true) => pb::Tristate::Yes,
            Some(false) => pb::Tristate::No,
            None => pb::Tristate::Unknown,
        } as i32,
        simulated: gpu.simulated,
    }
}

/// One telemetry message.
pub fn telemetry(seq: u64, samples: &[GpuSample], host: HostLive) -> AgentMessage {
    AgentMessage {
        kind: Some(agent_message::Kind::Telemetry(telemetry_batch(seq, samples, host))),
    }
}

/// The telemetry a message carries, stamped now.
pub fn telemetry_batch(seq: u64, samples: &[GpuSample], host: HostLive) -> pb::Telemetry {
    let unix_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
    pb::Telemetry {
        seq,
        unix_ms,
        gpus: samples.iter().map(sample_to_wire).collect(),
        host: Some(pb::HostSample {
            load1_centi: host
                .load1
                .map_or(0, |l| (l * 100.0).clamp(0.0, f64::from(u32::MAX)) as u32),
            memory_available: host.memory_available.unwrap_or(0),
        }),
    }
}

fn sample_to_wire(s: &GpuSample) -> pb::GpuSample {
    pb::GpuSample {
        index: s.index,
        memory_used: s.memory_used,
        memory_free: s.memory_free,
        utilization_pct: s.utilization_pct,
        memory_utilization_pct: s.memory_utilization_pct,
        temperature_c: s.temperature_c,
        power_mw: s.power_mw,
        sm_clock_mhz: s.sm_clock_mhz,
        throttle_reasons: s.throttle.bits(),
        ecc_corrected: s.ecc_corrected,
        ecc_uncorrected: s.ecc_uncorrected,
        foreign_memory: s.foreign_memory,
    }
}

/// What every node of a fleet file sends when it joins: its registration and its
/// telemetry at time `t` (seconds into the file's signals), in file order. This is
/// what `skein plan --fleet` builds its graph from, through the same messages a live
/// agent sends. The host side is only what the file gives (cores, memory, network),
/// and the labels are the file's; nothing is read from the machine running the
/// command, so a plan is the same everywhere.
pub fn fleet_messages(fleet: &crate::fleet::Fleet, t: f64) -> Vec<(RegisterRequest, pb::Telemetry)> {
    fleet
        .nodes()
        .iter()
        .map(|node| {
            let source = crate::sim::SimulatedSource::new(fleet.name(), node.clone());
            let host = source.host_inventory(HostInventory::undiscovered());
            let register = RegisterRequest {
                node_name: node.name.clone(),
                agent_version: env!("CARGO_PKG_VERSION").to_owned(),
                inventory: Some(pb::Inventory {
                    labels: node.labels.clone(),
                    ..inventory(&source, &host)
                }),
                node_credential: String::new(),
            };
            let live = HostLive {
                load1: None,
                memory_available: host.memory.available_bytes,
            };
            (register, telemetry_batch(1, &source.sample_at(t), live))
        })
        .collect()
}
