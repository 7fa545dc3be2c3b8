//! The gRPC service agents talk to: registration and the live stream, feeding the
//! [`HardwareGraph`]. The translation from the wire types happens here, with
//! validation: a malformed inventory or sample is refused with a status that says what
//! is wrong.
//!
//! Who may register as which node is [`crate::join`]'s to say: a registration is
//! admitted (its name claimed, or its credential checked) before it touches the graph,
//! and a stream is the node's only once its `Hello` presented the node's credential,
//! so a refused agent changes nothing and nothing it sends reaches the graph.
//!
//! Each agent's stream is served by a task of the server's ([`Lifecycle`]): when the
//! server stops, the task stops reading and the stream to the agent ends, so that the
//! gRPC door's drain does not wait on it.

use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::{Stream, StreamExt as _};
use skein_proto::agent::v1::{
    self as pb, AgentMessage, OrchestratorMessage, RegisterRequest, RegisterResponse, agent_message,
    agent_service_server::AgentService, orchestrator_message,
};
use tokio::sync::{broadcast, mpsc};
use tonic::{Request, Response, Status, Streaming};

pub use crate::base::Secret;
use crate::base::{Clock, Lifecycle};
use crate::graph::{
    GpuFacts, GpuSample, GraphEvent, HardwareGraph, HostFacts, HostSample, IndexedSample, Millis, NodeId,
    NodeInventory, TelemetryBatch,
};
use crate::instances::Instances;
use crate::join::{Admission, Join, JoinError};

/// How long an agent has to send its `Hello` after opening the stream.
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);

/// Pings for round-trip latency are sent every this many telemetry intervals.
const PING_EVERY_INTERVALS: u32 = 5;

/// Longest node name accepted (a DNS name's limit).
const MAX_NODE_NAME: usize = 253;

/// Most GPUs one node may report.
const MAX_GPUS_PER_NODE: usize = 64;

/// The `AgentService` implementation.
#[derive(Clone)]
pub struct AgentGateway {
    graph: Arc<HardwareGraph>,
    join: Join,
    events: broadcast::Sender<GraphEvent>,
    clock: Clock,
    instances: Arc<Instances>,
    lifecycle: Lifecycle,
}

impl AgentGateway {
    /// A gateway feeding `graph`, admitting agents as `join` says (join tokens and node
    /// identities), publishing every change on `events`, sending engine commands for
    /// `instances` and feeding their status back to it. Its streams' tasks are
    /// `lifecycle`'s: they end when its token is cancelled.
    pub fn new(
        graph: Arc<HardwareGraph>,
        join: Join,
        events: broadcast::Sender<GraphEvent>,
        clock: Clock,
        instances: Arc<Instances>,
        lifecycle: Lifecycle,
    ) -> Self {
        AgentGateway {
            graph,
            join,
            events,
            clock,
            instances,
            lifecycle,
        }
    }

    fn publish(&self, events: Vec<GraphEvent>) {
        for event in events {
            // No subscriber is fine.
            let _ = self.events.send(event);
        }
    }
}

/// The join token a request carries (`authorization: Bearer TOKEN`), if any.
fn presented_token<T>(request: &Request<T>) -> Option<String> {
    let value = request.metadata().get(skein_proto::AUTHORIZATION)?;
    let text = value.to_str().ok()?;
    let (scheme, token) = text.trim().split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim().to_owned())
}

fn peer<T>(request: &Request<T>) -> String {
    request
        .remote_addr()
        .map_or_else(|| "an unknown peer".to_owned(), |a| a.to_string())
}

/// The status an agent gets for a refusal: one it must not retry (a missing or refused
/// token, a name it may not take), or one it may (the store failed).
fn join_status(error: &JoinError) -> Status {
    let message = error.to_string();
    match error {
        JoinError::MissingToken => Status::unauthenticated(message),
        JoinError::MissingCredential | JoinError::BadCredential | JoinError::BadSpec(_) => {
            Status::invalid_argument(message)
        }
        JoinError::Store(_) | JoinError::Random(_) => Status::unavailable(message),
        _ => Status::permission_denied(message),
    }
}

type OutboundStream = Pin<Box<dyn Stream<Item = Result<OrchestratorMessage, Status>> + Send>>;

#[tonic::async_trait]
impl AgentService for AgentGateway {
    async fn register(&self, request: Request<RegisterRequest>) -> Result<Response<RegisterResponse>, Status> {
        let peer = peer(&request);
        let token = presented_token(&request);
        let request = request.into_inner();
        let credential = request.node_credential.clone();
        let inventory = inventory_from_wire(request)?;
        let name = inventory.name.clone();
        let admission = match self.join.admit(&name, token.as_deref(), &credential).await {
            Ok(admission) => admission,
            Err(error) => {
                tracing::warn!(%peer, node = %name, %error, "refused an agent's registration");
                return Err(join_status(&error));
            }
        };
        if let Admission::Claimed { token } = &admission {
            tracing::info!(%peer, node = %name, join_token = %token, "a node name was claimed");
        }
        let gpus = inventory.gpus.len();
        let (registration, events) = self.graph.register(inventory, self.clock.now());
        tracing::info!(node = %registration.id, %name, gpus, known = registration.known, "agent registered");
        self.publish(events);
        Ok(Response::new(RegisterResponse {
            node_id: registration.id.0,
            sample_interval_ms: u32::try_from(self.graph.config().sample_interval_ms).unwrap_or(u32::MAX),
            known: registration.known,
        }))
    }

    type SessionStream = OutboundStream;

    async fn session(
        &self,
        request: Request<Streaming<AgentMessage>>,
    ) -> Result<Response<Self::SessionStream>, Status> {
        let peer = peer(&request);
        let mut inbound = request.into_inner();
        let hello = tokio::time::timeout(HELLO_TIMEOUT, inbound.message())
            .await
            .map_err(|_| {
                Status::deadline_exceeded("the first message of the stream must be a Hello, sent at once")
            })??;
        let (node, credential) = match hello.and_then(|m| m.kind) {
            Some(agent_message::Kind::Hello(hello)) => (NodeId(hello.node_id), hello.node_credential),
            _ => {
                return Err(Status::invalid_argument(
                    "the first message of the stream must be a Hello with the node id Register returned",
                ));
            }
        };
        // The stream is the node's only if it holds the node's credential: telemetry,
        // drains and leaves of anyone else never reach the graph.
        let Some(view) = self.graph.node(&node) else {
            return Err(Status::not_found(format!(
                "unknown node {node}: register first (the id Register returned goes in the Hello)"
            )));
        };
        let name = view.inventory.name.clone();
        drop(view);
        if let Err(error) = self.join.check_session(&name, &credential) {
            tracing::warn!(%peer, %node, %name, %error, "refused an agent's stream");
            return Err(join_status(&error));
        }
        let (generation, events) = self
            .graph
            .connected(&node, self.clock.now())
            .map_err(|e| Status::not_found(format!("{e}")))?;
        self.publish(events);
        tracing::info!(%node, "agent connected");

        let (outbound, rx) = mpsc::channel::<Result<OrchestratorMessage, Status>>(64);
        self.instances.node_connected(&node, outbound.clone());
        let gateway = self.clone();
        self.lifecycle.tasks.spawn(async move {
            let commands = outbound.clone();
            gateway.serve_stream(&node, inbound, outbound).await;
            gateway.instances.node_disconnected(&node, &commands);
            let events = gateway.graph.disconnected(&node, generation);
            if !events.is_empty() {
                tracing::info!(%node, "agent disconnected");
            }
            gateway.publish(events);
        });
        // The stream ends when the server stops, even while the registry still holds a
        // sender of it.
        let stream = futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|item| (item, rx)) })
            .take_until(self.lifecycle.shutdown.clone().cancelled_owned());
        Ok(Response::new(Box::pin(stream)))
    }
}

impl AgentGateway {
    /// The node will leave: nothing new goes there, and its instances are placed again
    /// elsewhere now, while it still serves (runs re-place lost instances on a graph
    /// without drained GPUs).
    fn drain(&self, node: &NodeId, drain: pb::Drain) {
        let reason = bounded(&drain.reason, "its agent will leave");
        let reason = match drain.deadline_unix_ms {
            0 => format!("leaving soon: {reason}"),
            ms => format!("leaving at {}: {reason}", unix_seconds_text(ms)),
        };
        match self.graph.drain_node(node, reason.clone()) {
            Ok(true) => {
                tracing::info!(%node, %reason, "agent draining its node");
                self.instances.node_lost(node, &format!("is draining ({reason})"));
            }
            Ok(false) => {}
            Err(error) => tracing::warn!(%node, %error, "drain of an unknown node"),
        }
    }

    /// The node left on purpose: marked left (not down), its instances placed again.
    fn leave(&self, node: &NodeId, leave: pb::Leave) {
        let reason = bounded(&leave.reason, "its agent stopped");
        match self.graph.leave(node, reason.clone()) {
            Ok(events) => {
                tracing::info!(%node, %reason, "agent left");
                self.instances.node_lost(node, &format!("left ({reason})"));
                self.publish(events);
            }
            Err(error) => tracing::warn!(%node, %error, "leave of an unknown node"),
        }
    }

    /// Reads the stream until it ends, pinging now and then for the round trip.
    async fn serve_stream(
        &self,
        node: &NodeId,
        mut inbound: Streaming<AgentMessage>,
        outbound: mpsc::Sender<Result<OrchestratorMessage, Status>>,
    ) {
        let interval = Duration::from_millis(self.graph.config().sample_interval_ms.max(1));
        let mut ping = tokio::time::interval(interval * PING_EVERY_INTERVALS);
        let mut pending: Option<(u64, Instant)> = None;
        let mut next_ping = 1u64;
        let shutdown = self.lifecycle.shutdown.clone();
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                message = inbound.message() => {
                    let message = match message {
                        Ok(Some(message)) => message,
                        Ok(None) => return,
                        Err(status) => {
                            tracing::debug!(%node, %status, "agent stream ended");
                            return;
                        }
                    };
                    match message.kind {
                        Some(agent_message::Kind::Telemetry(telemetry)) => {
                            let now = self.clock.now();
                            match self.graph.ingest(node, telemetry_from_wire(telemetry), now) {
                                Ok(events) => self.publish(events),
                                Err(crate::graph::GraphError::UnknownNode(_)) => {
                                    // An admin removed the node: the agent may register
                                    // again (a retryable status), as a new claim.
                                    tracing::info!(%node, "the stream of a removed node ends");
                                    let status = Status::not_found(format!(
                                        "node {node} was removed by an admin; register again"
                                    ));
                                    let _ = outbound.send(Err(status)).await;
                                    return;
                                }
                                Err(problem) => {
                                    let problem = problem.to_string();
                                    tracing::warn!(%node, %problem, "refused telemetry");
                                    let _ = outbound.send(Err(Status::invalid_argument(problem))).await;
                                    return;
                                }
                            }
                        }
                        Some(agent_message::Kind::Pong(pong)) => {
                            if let Some((id, sent)) = pending
                                && id == pong.id
                            {
                                let rtt = sent.elapsed().as_secs_f64() * 1000.0;
                                let _ = self.graph.record_rtt(node, rtt);
                                pending = None;
                            }
                        }
                        Some(agent_message::Kind::InstanceStatus(status)) => {
                            self.instances.report(node, status);
                        }
                        Some(agent_message::Kind::LogsReply(reply)) => {
                            self.instances.logs_reply(reply);
                        }
                        Some(agent_message::Kind::Drain(drain)) => self.drain(node, drain),
                        Some(agent_message::Kind::Leave(leave)) => {
                            self.leave(node, leave);
                            // The last message: closing our side lets the agent go.
                            return;
                        }
                        Some(agent_message::Kind::Hello(_)) | None => {}
                    }
                }
                _ = ping.tick() => {
                    let id = next_ping;
                    next_ping += 1;
                    pending = Some((id, Instant::now()));
                    let message = OrchestratorMessage {
                        kind: Some(orchestrator_message::Kind::Ping(pb::Ping { id })),
                    };
                    if outbound.send(Ok(message)).await.is_err() {
                        return;
                    }
                }
            }
        }
    }
}

/// Longest reason of a drain or leave kept, in characters (an agent could send anything).
const MAX_REASON_CHARS: usize = 200;

/// `text` cut to [`MAX_REASON_CHARS`] with control characters replaced; `default` when
/// empty.
fn bounded(text: &str, default: &str) -> String {
    let text: String = text
        .trim()
        .chars()
        .take(MAX_REASON_CHARS)
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if text.is_empty() { default.to_owned() } else { text }
}

/// Unix milliseconds as `2026-01-01T00:00:00Z` (UTC, to the second); before 1970, the
/// number itself.
fn unix_seconds_text(unix_ms: i64) -> String {
    match u64::try_from(unix_ms) {
        Ok(ms) => humantime::format_rfc3339_seconds(std::time::UNIX_EPOCH + Duration::from_millis(ms)).to_string(),
        Err(_) => format!("{unix_ms} ms"),
    }
}

/// A graph built from agents' messages without a connection: each node's registration,
/// its stream opening and one telemetry batch, at time `now`, through the same checks and
/// conversions as the live service. `skein plan --fleet` builds its graph this way from
/// a fleet file's nodes.
pub fn graph_from_wire(
    messages: Vec<(RegisterRequest, pb::Telemetry)>,
    config: crate::graph::GraphConfig,
    now: Millis,
) -> Result<HardwareGraph, Status> {
    let graph = HardwareGraph::new(config);
    for (register, telemetry) in messages {
        let (registration, _) = graph.register(inventory_from_wire(register)?, now);
        graph
            .connected(&registration.id, now)
            .map_err(|e| Status::not_found(e.to_string()))?;
        graph
            .ingest(&registration.id, telemetry_from_wire(telemetry), now)
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
    }
    Ok(graph)
}

/// A registration's inventory, checked.
fn inventory_from_wire(request: RegisterRequest) -> Result<NodeInventory, Status> {
    let name = request.node_name.trim().to_owned();
    if name.is_empty() || name.len() > MAX_NODE_NAME || name.chars().any(|c| c.is_control() || c.is_whitespace()) {
        return Err(Status::invalid_argument(format!(
            "node name `{}` is not usable: give 1 to {MAX_NODE_NAME} characters without spaces (a hostname)",
            request.node_name.escape_debug()
        )));
    }
    let inventory = request.inventory.unwrap_or_default();
    if inventory.gpus.len() > MAX_GPUS_PER_NODE {
        return Err(Status::invalid_argument(format!(
            "node `{name}` reports {} GPUs; at most {MAX_GPUS_PER_NODE} per node",
            inventory.gpus.len()
        )));
    }
    let mut gpus: Vec<GpuFacts> = inventory.gpus.into_iter().map(gpu_from_wire).collect();
    gpus.sort_by_key(|g| g.index);
    if let Some((position, gpu)) = gpus.iter().enumerate().find(|(i, g)| g.index as usize != *i) {
        return Err(Status::invalid_argument(format!(
            "node `{name}` reports GPU index {} where {position} was expected: indexes must be 0, 1, 2, … without gaps",
            gpu.index
        )));
    }
    if let Err(problem) = skein_proto::labels::check_all(&inventory.labels) {
        return Err(Status::invalid_argument(format!("node `{name}`: {problem}")));
    }
    let host = inventory.host.unwrap_or_default();
    Ok(NodeInventory {
        name,
        agent_version: request.agent_version,
        gpu_source: inventory.gpu_source,
        host: HostFacts {
            hostname: host.hostname,
            os: host.os,
            kernel: host.kernel,
            arch: host.arch,
            logical_cores: host.logical_cores,
            physical_cores: host.physical_cores,
            cpu_brand: host.cpu_brand,
            memory_total: host.memory_total,
            numa_nodes: host.numa_nodes,
            network_bps: host.network_bits_per_second,
        },
        gpus,
        labels: inventory.labels,
    })
}

fn gpu_from_wire(gpu: pb::Gpu) -> GpuFacts {
    let nonzero = |v: u32| (v != 0).then_some(v);
    GpuFacts {
        index: gpu.index,
        uuid: gpu.uuid,
        name: gpu.name,
        memory_total: gpu.memory_total,
        compute_capability: (gpu.compute_major != 0).then_some((gpu.compute_major, gpu.compute_minor)),
        power_limit_mw: nonzero(gpu.power_limit_mw),
        pcie: (gpu.pcie_generation != 0).then_some((gpu.pcie_generation, gpu.pcie_width)),
        nvlink_peers: gpu.nvlink_peers,
        mig_enabled: match pb::Tristate::try_from(gpu.mig_enabled) {
            Ok(pb::Tristate::Yes) => Some(true),
            Ok(pb::Tristate::No) => Some(false),
            _ => None,
        },
        simulated: gpu.simulated,
    }
}

/// A telemetry message as a batch (the receive time is set by the graph).
fn telemetry_from_wire(telemetry: pb::Telemetry) -> TelemetryBatch {
    let gpus = telemetry
        .gpus
        .into_iter()
        .map(|g| IndexedSample {
            index: g.index,
            sample: GpuSample {
                received_ms: 0,
                unix_ms: telemetry.unix_ms,
                memory_used: g.memory_used,
                memory_free: g.memory_free,
                utilization_pct: g.utilization_pct,
                memory_utilization_pct: g.memory_utilization_pct,
                temperature_c: g.temperature_c,
                power_mw: g.power_mw,
                sm_clock_mhz: g.sm_clock_mhz,
                throttle_reasons: g.throttle_reasons,
                ecc_corrected: g.ecc_corrected,
                ecc_uncorrected: g.ecc_uncorrected,
                foreign_memory: g.foreign_memory,
            },
        })
        .collect();
    TelemetryBatch {
        seq: telemetry.seq,
        gpus,
        host: telemetry.host.map(|h| HostSample {
            load1: f64::from(h.load1_centi) / 100.0,
            memory_available: h.memory_available,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn registration(host: pb::Host) -> RegisterRequest {
        RegisterRequest {
            node_name: "rtx-1".to_owned(),
            agent_version: "0.1.0".to_owned(),
            inventory: Some(pb::Inventory {
                host: Some(host),
                gpus: Vec::new(),
                gpu_source: "none".to_owned(),
                labels: Default::default(),
            }),
            node_credential: String::new(),
        }
    }

    #[test]
    fn host_facts_keep_the_network_link_and_zero_stays_unknown() {
        let host = pb::Host {
            hostname: "rtx-1".to_owned(),
            memory_total: 256 << 30,
            numa_nodes: 2,
            network_bits_per_second: 100_000_000_000,
            ..pb::Host::default()
        };
        let facts = inventory_from_wire(registration(host)).unwrap().host;
        assert_eq!(facts.network_bps, 100_000_000_000);
        assert_eq!(facts.memory_total, 256 << 30);
        assert_eq!(facts.numa_nodes, 2);

        // An agent that predates the field, or cannot read its links, sends 0.
        let facts = inventory_from_wire(registration(pb::Host::default())).unwrap().host;
        assert_eq!(facts.network_bps, 0);
    }

    fn labelled(labels: &[(&str, &str)]) -> RegisterRequest {
        let mut request = registration(pb::Host::default());
        if let Some(inventory) = request.inventory.as_mut() {
            inventory.labels = labels.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
        }
        request
    }

    #[test]
    fn labels_are_kept_and_bad_ones_refused_saying_which() {
        let inventory = inventory_from_wire(labelled(&[("zone", "lab-a"), ("rack", "r12")])).unwrap();
        assert_eq!(inventory.label("zone"), Some("lab-a"));
        assert_eq!(inventory.labels.len(), 2);
        // An agent that predates labels sends none.
        assert!(inventory_from_wire(labelled(&[])).unwrap().labels.is_empty());

        let refused = |labels: &[(&str, &str)]| {
            let status = inventory_from_wire(labelled(labels)).unwrap_err();
            assert_eq!(status.code(), tonic::Code::InvalidArgument);
            status.message().to_owned()
        };
        assert_eq!(
            refused(&[("zone", "lab a")]),
            "node `rtx-1`: the value `lab a` of label `zone` contains ' ': use only ASCII letters, digits, `.`, `_`, \
             `-` and `/`"
        );
        assert_eq!(
            refused(&[("zone", "")]),
            "node `rtx-1`: label `zone` has an empty value: give it a value (such as `lab-a`), or leave the label out"
        );
        let long = "x".repeat(64);
        assert!(refused(&[("zone", &long)]).contains("is 64 characters long; a value has at most 63"));
        let many: Vec<(String, String)> = (0..65).map(|i| (format!("k{i}"), "v".to_owned())).collect();
        let many: Vec<(&str, &str)> = many.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        assert_eq!(
            refused(&many),
            "node `rtx-1`: 65 labels; a node carries at most 64: leave some out"
        );
    }
}
