//! A swarm of simulated agents over the real agent protocol, for tests and benchmarks
//! that need thousands of nodes in one process: each node registers, opens its stream
//! with a `Hello`, sends telemetry, answers pings, reconnects, and leaves, as
//! `skein agent` does, but without NVML, engines or a process of its own.
//!
//! Nodes share a few HTTP/2 connections ([`SwarmConfig::connections`]), each carrying
//! many nodes' streams: one socket per node would pass a test machine's limit on open
//! files long before 12,500 nodes. The server sees the same calls and streams either way.
//!
//! Every call waits at most [`SwarmConfig::deadline`]; a call that takes longer is a
//! [`SwarmError::Stalled`], so a test can count stalls instead of hanging on them.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use skein_proto::agent::v1::{
    self as pb, agent_message, agent_service_client::AgentServiceClient, orchestrator_message,
};
use tokio::sync::{mpsc, oneshot};
use tonic::transport::{Channel, Endpoint};

use crate::agent::{GpuLoad, inventory, node_credential, telemetry};

/// Messages a node may have queued towards the orchestrator before sending waits.
const OUTBOUND_QUEUE: usize = 16;

/// What a swarm joins and how.
#[derive(Debug, Clone)]
pub struct SwarmConfig {
    /// The orchestrator's gRPC URL (`http://127.0.0.1:PORT`).
    pub join: String,
    /// The join token.
    pub token: String,
    /// Simulated GPUs per node (RTX 4090s, as [`crate::agent::TestAgent`]'s).
    pub gpus: u32,
    /// HTTP/2 connections the nodes share (node `n` uses connection `n % connections`).
    pub connections: usize,
    /// The longest any call may take.
    pub deadline: Duration,
}

/// Why a swarm call failed.
#[derive(Debug)]
pub enum SwarmError {
    /// No answer within the deadline: the orchestrator stalled.
    Stalled {
        /// The call (`register`, `open`, `telemetry`, `leave`).
        call: &'static str,
        /// The node.
        node: String,
    },
    /// The orchestrator answered with an error.
    Refused {
        /// The call.
        call: &'static str,
        /// The node.
        node: String,
        /// Its answer.
        status: Box<tonic::Status>,
    },
    /// The node's stream ended while it was being used.
    Closed {
        /// The call.
        call: &'static str,
        /// The node.
        node: String,
    },
}

impl std::fmt::Display for SwarmError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SwarmError::Stalled { call, node } => write!(f, "{node}: `{call}` got no answer within its deadline"),
            SwarmError::Refused { call, node, status } => write!(f, "{node}: `{call}` was refused: {status}"),
            SwarmError::Closed { call, node } => write!(f, "{node}: the stream ended during `{call}`"),
        }
    }
}

impl std::error::Error for SwarmError {}

/// What a registration returned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Registered {
    /// The node's id.
    pub node_id: String,
    /// Whether the name was known.
    pub known: bool,
    /// The telemetry interval the orchestrator asks for.
    pub interval: Duration,
}

/// Simulated agents sharing a few connections to one orchestrator.
#[derive(Clone)]
pub struct Swarm {
    channels: Arc<Vec<Channel>>,
    config: Arc<SwarmConfig>,
    pings: Arc<AtomicU64>,
}

impl Swarm {
    /// Opens the swarm's connections.
    ///
    /// Errors: a connection that could not be made.
    pub async fn connect(config: SwarmConfig) -> Result<Swarm, tonic::transport::Error> {
        let mut channels = Vec::new();
        for _ in 0..config.connections.max(1) {
            let endpoint = Endpoint::from_shared(config.join.clone())?.connect_timeout(config.deadline);
            channels.push(endpoint.connect().await?);
        }
        Ok(Swarm {
            channels: Arc::new(channels),
            config: Arc::new(config),
            pings: Arc::default(),
        })
    }

    /// Pings answered by all of the swarm's nodes so far.
    pub fn pings(&self) -> u64 {
        self.pings.load(Ordering::Relaxed)
    }

    fn client(&self, slot: usize) -> AgentServiceClient<Channel> {
        AgentServiceClient::new(self.channels[slot % self.channels.len()].clone())
    }

    fn request<T>(&self, message: T) -> tonic::Request<T> {
        let mut request = tonic::Request::new(message);
        let bearer = format!("Bearer {}", self.config.token);
        // INVARIANT: a token a test chose is ASCII.
        request
            .metadata_mut()
            .insert("authorization", bearer.parse().expect("an ASCII join token"));
        request
    }

    /// Registers node `name` (over connection `slot`).
    ///
    /// Errors: [`SwarmError::Stalled`], [`SwarmError::Refused`].
    pub async fn register(&self, slot: usize, name: &str) -> Result<Registered, SwarmError> {
        let request = self.request(pb::RegisterRequest {
            node_name: name.to_owned(),
            agent_version: "swarm".to_owned(),
            inventory: Some(inventory(name, self.config.gpus, BTreeMap::new())),
            node_credential: node_credential(name),
        });
        let answer = tokio::time::timeout(self.config.deadline, self.client(slot).register(request))
            .await
            .map_err(|_| stalled("register", name))?
            .map_err(|status| refused("register", name, status))?
            .into_inner();
        Ok(Registered {
            node_id: answer.node_id,
            known: answer.known,
            interval: Duration::from_millis(u64::from(answer.sample_interval_ms.max(1))),
        })
    }

    /// Opens the live stream of node `name`, registered as `node_id` (over connection
    /// `slot`): answered once the orchestrator took the `Hello`.
    ///
    /// Errors: [`SwarmError::Stalled`], [`SwarmError::Refused`].
    pub async fn open(&self, slot: usize, name: &str, node_id: &str) -> Result<NodeStream, SwarmError> {
        let (tx, rx) = mpsc::channel::<pb::AgentMessage>(OUTBOUND_QUEUE);
        let hello = pb::AgentMessage {
            kind: Some(agent_message::Kind::Hello(pb::Hello {
                node_id: node_id.to_owned(),
                node_credential: node_credential(name),
            })),
        };
        // INVARIANT: the receiver is alive; it is moved into the request just below.
        tx.try_send(hello).expect("an empty queue takes the hello");
        let outbound = futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|m| (m, rx)) });
        let mut inbound = tokio::time::timeout(self.config.deadline, self.client(slot).session(self.request(outbound)))
            .await
            .map_err(|_| stalled("open", name))?
            .map_err(|status| refused("open", name, status))?
            .into_inner();
        let (closed_tx, closed) = oneshot::channel();
        let pong = tx.clone();
        let pings = Arc::clone(&self.pings);
        // Reads what the orchestrator sends until it closes the stream: pings are
        // answered, commands ignored (a swarm node runs no engines).
        let reader = tokio::spawn(async move {
            while let Ok(Some(message)) = inbound.message().await {
                if let Some(orchestrator_message::Kind::Ping(ping)) = message.kind {
                    let answer = pb::AgentMessage {
                        kind: Some(agent_message::Kind::Pong(pb::Pong { id: ping.id })),
                    };
                    if pong.send(answer).await.is_ok() {
                        pings.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
            let _ = closed_tx.send(());
        });
        Ok(NodeStream {
            name: name.to_owned(),
            node_id: node_id.to_owned(),
            gpus: self.config.gpus,
            deadline: self.config.deadline,
            tx,
            seq: 0,
            closed,
            reader,
        })
    }

    /// Registers node `name` and opens its stream, as an agent starting (or
    /// reconnecting) does.
    ///
    /// Errors: those of [`register`](Self::register) and [`open`](Self::open).
    pub async fn join(&self, slot: usize, name: &str) -> Result<(Registered, NodeStream), SwarmError> {
        let registered = self.register(slot, name).await?;
        let stream = self.open(slot, name, &registered.node_id).await?;
        Ok((registered, stream))
    }
}

/// One node's live stream. Dropping it is the connection breaking.
pub struct NodeStream {
    name: String,
    node_id: String,
    gpus: u32,
    deadline: Duration,
    tx: mpsc::Sender<pb::AgentMessage>,
    seq: u64,
    closed: oneshot::Receiver<()>,
    reader: tokio::task::JoinHandle<()>,
}

impl NodeStream {
    /// The node's id.
    pub fn node_id(&self) -> &str {
        &self.node_id
    }

    /// Sends the next telemetry batch, every GPU `utilization_pct` busy.
    ///
    /// Errors: [`SwarmError::Stalled`] when the orchestrator does not take it within the
    /// deadline, [`SwarmError::Closed`] when the stream ended.
    pub async fn telemetry(&mut self, utilization_pct: u32) -> Result<(), SwarmError> {
        self.seq += 1;
        let load = GpuLoad {
            utilization_pct,
            ..GpuLoad::default()
        };
        let batch = telemetry(self.seq, &vec![load; self.gpus as usize]);
        self.send("telemetry", agent_message::Kind::Telemetry(batch)).await
    }

    async fn send(&self, call: &'static str, kind: agent_message::Kind) -> Result<(), SwarmError> {
        let message = pb::AgentMessage { kind: Some(kind) };
        tokio::time::timeout(self.deadline, self.tx.send(message))
            .await
            .map_err(|_| stalled(call, &self.name))?
            .map_err(|_| SwarmError::Closed {
                call,
                node: self.name.clone(),
            })
    }

    /// Says `Leave` and waits until the orchestrator closes the stream, as an agent
    /// stopping on purpose does.
    ///
    /// Errors: [`SwarmError::Stalled`] when the stream is not closed within the deadline.
    pub async fn leave(mut self, reason: &str) -> Result<(), SwarmError> {
        let leave = agent_message::Kind::Leave(pb::Leave {
            reason: reason.to_owned(),
        });
        self.send("leave", leave).await?;
        tokio::time::timeout(self.deadline, &mut self.closed)
            .await
            .map_err(|_| stalled("leave", &self.name))?
            .map_err(|_| SwarmError::Closed {
                call: "leave",
                node: self.name.clone(),
            })
    }
}

impl Drop for NodeStream {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

fn stalled(call: &'static str, node: &str) -> SwarmError {
    SwarmError::Stalled {
        call,
        node: node.to_owned(),
    }
}

fn refused(call: &'static str, node: &str, status: tonic::Status) -> SwarmError {
    SwarmError::Refused {
        call,
        node: node.to_owned(),
        status: Box::new(status),
    }
}
