//! The model instances the orchestrator has asked agents to run: what each one is, on
//! which node, and what its agent last reported. Commands go down the node's gRPC stream
//! ([`Instances::start`], [`Instances::stop`]); status comes up through
//! [`Instances::report`]. When a node reconnects, its instances are asked for again
//! (starting is idempotent on the agent); when it is lost, they are marked lost so
//! their runs can place them elsewhere.
//!
//! Every engine that serves requests is started with a key of its own
//! ([`InstanceView::engine_key`], 32 random bytes made here), which it demands of every
//! request: only Skein reaches it, whoever else can reach its port. The key lives in
//! memory only, here and on the agent (which reports it back, so that a restarted
//! orchestrator reaches the engines still running). Who has used an instance is kept
//! too ([`Instances::used_by`]), so that its logs, which may hold their prompts, are
//! shown to them alone ([`LogReaders`]).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use serde::Serialize;
use skein_proto::agent::v1::{self as pb, OrchestratorMessage, orchestrator_message};
use tokio::sync::{mpsc, oneshot, watch};
use tonic::Status;

use crate::base::{Secret, lock};
use crate::graph::NodeId;
use crate::load::Load;
use crate::store::Tree;

/// What an instance is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum InstanceState {
    /// Asked for; the agent has not answered yet.
    Requested,
    /// Weights are downloading.
    Downloading,
    /// The engine process is starting.
    Starting,
    /// The engine is loading the model.
    Loading,
    /// Serving.
    Ready,
    /// Health checks fail; the agent will restart it.
    Unhealthy,
    /// Restarting after a crash or failed health checks.
    Restarting,
    /// Gave up: the engine's error is in `detail`.
    Failed,
    /// Stopped on request.
    Stopped,
    /// Its node went down or left.
    Lost,
}

impl InstanceState {
    /// Every state.
    pub const ALL: [InstanceState; 10] = [
        InstanceState::Requested,
        InstanceState::Downloading,
        InstanceState::Starting,
        InstanceState::Loading,
        InstanceState::Ready,
        InstanceState::Unhealthy,
        InstanceState::Restarting,
        InstanceState::Failed,
        InstanceState::Stopped,
        InstanceState::Lost,
    ];

    /// The state's name: the API writes it (serde's `snake_case` name, the same), the
    /// CLI and a run's progress print it.
    pub fn name(self) -> &'static str {
        match self {
            InstanceState::Requested => "requested",
            InstanceState::Downloading => "downloading",
            InstanceState::Starting => "starting",
            InstanceState::Loading => "loading",
            InstanceState::Ready => "ready",
            InstanceState::Unhealthy => "unhealthy",
            InstanceState::Restarting => "restarting",
            InstanceState::Failed => "failed",
            InstanceState::Stopped => "stopped",
            InstanceState::Lost => "lost",
        }
    }

    fn from_wire(state: i32) -> InstanceState {
        match pb::InstanceState::try_from(state) {
            Ok(pb::InstanceState::Downloading) => InstanceState::Downloading,
            Ok(pb::InstanceState::Starting) => InstanceState::Starting,
            Ok(pb::InstanceState::Loading) => InstanceState::Loading,
            Ok(pb::InstanceState::Ready) => InstanceState::Ready,
            Ok(pb::InstanceState::Unhealthy) => InstanceState::Unhealthy,
            Ok(pb::InstanceState::Restarting) => InstanceState::Restarting,
            Ok(pb::InstanceState::Failed) => InstanceState::Failed,
            Ok(pb::InstanceState::Stopped) => InstanceState::Stopped,
            Ok(pb::InstanceState::Unknown) | Err(_) => InstanceState::Requested,
        }
    }

    /// Whether the instance will not serve again without a new start.
    pub fn is_gone(self) -> bool {
        matches!(
            self,
            InstanceState::Failed | InstanceState::Stopped | InstanceState::Lost
        )
    }
}

impl std::fmt::Display for InstanceState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.name())
    }
}

/// One instance as the orchestrator knows it.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct InstanceView {
    /// Its name, unique in the fleet.
    pub name: String,
    /// The node's id.
    pub node: String,
    /// The node's name.
    pub node_name: String,
    /// The run it serves.
    pub run: Option<String>,
    /// The agents it serves.
    pub agents: Vec<String>,
    /// The engine (`candle`, `llama.cpp`, `vllm`).
    pub engine: String,
    /// The variant.
    pub variant: String,
    /// GPU indices on the node.
    pub gpus: Vec<u32>,
    /// Bytes the plan reserved, in total.
    pub estimated_bytes: u64,
    /// Bytes the plan reserved on each GPU (`[gpu, bytes]`).
    #[schema(value_type = Vec<Vec<u64>>)]
    pub held: Vec<(u32, u64)>,
    /// State.
    pub state: InstanceState,
    /// The agent's last words about it (download progress, the engine's error).
    pub detail: String,
    /// Where it answers, once ready.
    pub base_url: Option<String>,
    /// Memory really used once loaded: host RSS, and bytes per GPU.
    pub measured_host_rss: Option<u64>,
    /// Bytes per GPU, measured.
    #[schema(value_type = Vec<Vec<u64>>)]
    pub measured_gpu: Vec<(u32, u64)>,
    /// Download progress, bytes.
    pub downloaded: u64,
    /// Download size, bytes.
    pub download_total: u64,
    /// Restarts so far.
    pub restarts: u32,
    /// The reflex that added it as a replica, if one did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub clone_of: Option<String>,
    /// Its share of the new sessions and requests for its agents among their replicas
    /// (1 unless a reflex rerouted or decayed it; 0: it takes nothing new).
    pub share: f64,
    /// The plan it was started from: precision, split (layout and each device's share),
    /// modelled speed, why the planner chose it and what it turned down
    /// (docs/placement.md); absent for an instance an agent reported that no plan of
    /// this server started.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Object)]
    pub placement: Option<Arc<crate::plan::PlannedInstance>>,
    /// For a piece of a replica split across nodes (a Ray node, an RPC server): that
    /// replica. A piece serves no requests; it is started, stopped and failed with it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub part_of: Option<String>,
    /// For a replica split across nodes: its pieces, in start order.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub pieces: Vec<String>,
    /// Where it failed, when a piece of its split failed on a node that is still up:
    /// `(node name, GPUs)`, which a new placement avoids.
    #[serde(skip)]
    pub failed_on: Option<(String, Vec<u32>)>,
    /// What it serves (model, requirement, constraints): a later run whose agents need
    /// exactly this may use it while it is warm.
    #[serde(skip)]
    pub warm_key: String,
    /// The model instance of the plan it was started for (model, merged requirement,
    /// constraints): what sessions and the OpenAI routes match against to reuse it
    /// (`run::executor::serves`). `None` for one no plan of this server started.
    #[serde(skip)]
    pub serves: Option<Arc<crate::plan::demand::Instance>>,
    /// Every run it has served since it started, first use first: the run it was
    /// started for or that claimed it warm, and runs whose agents were called through
    /// it (a session on a run's agent, the OpenAI route by agent name). `run` is the one
    /// that holds it now.
    pub runs: Vec<String>,
    /// The sessions bound to it now (those the caller may see), filled in by
    /// `GET /v1/instances` from the session store.
    pub sessions: Vec<String>,
    /// Since when no run uses it (kept warm for the next one).
    #[serde(skip)]
    pub idle_since: Option<std::time::Instant>,
    /// The key its engine demands of every request (`Authorization: Bearer KEY`); never
    /// serialized, and its `Debug` shows nothing. `None`: a piece of a split engine (no
    /// HTTP), or one reported by an agent that gave no key.
    #[serde(skip)]
    pub engine_key: Option<Secret>,
}

/// Who may read an instance's engine logs, which can hold the prompts of everyone who
/// used it: admins always; a user only when every request the instance ever served was
/// theirs (their runs', sessions' and completions'), so that nobody reads another
/// user's prompts. An instance several users shared, or one whose history is unknown
/// (it was started before the orchestrator restarted), is for admins alone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogReaders {
    /// Everyone whose requests it served, and the owner of the run it was started for.
    pub users: BTreeSet<String>,
    /// Whether `users` is its whole history.
    pub history_known: bool,
}

impl LogReaders {
    /// Whether `user` (an admin when `admin`) may read the logs.
    pub fn admit(&self, user: &str, admin: bool) -> bool {
        admin || (self.history_known && !self.users.is_empty() && self.users.iter().all(|u| u == user))
    }
}

/// An instance to start: where, and the command its agent gets.
#[derive(Debug, Clone)]
pub struct InstanceRequest {
    /// The node's id.
    pub node: NodeId,
    /// The node's name.
    pub node_name: String,
    /// The run it serves.
    pub run: Option<String>,
    /// The agents it serves.
    pub agents: Vec<String>,
    /// The engine's name.
    pub engine: String,
    /// The variant.
    pub variant: String,
    /// Bytes the plan reserved.
    pub estimated_bytes: u64,
    /// Bytes the plan reserved on each GPU of the node.
    pub held: Vec<(u32, u64)>,
    /// What it serves, for reuse by later runs (see [`InstanceView::warm_key`]).
    pub warm_key: String,
    /// What it serves, for reuse by sessions (see [`InstanceView::serves`]).
    pub serves: Option<Arc<crate::plan::demand::Instance>>,
    /// The reflex adding it as a replica, if one is.
    pub clone_of: Option<String>,
    /// The plan it is started from.
    pub placement: Option<Arc<crate::plan::PlannedInstance>>,
    /// The replica it is a piece of (see [`InstanceView::part_of`]).
    pub part_of: Option<String>,
    /// The command.
    pub start: pb::StartInstance,
}

struct Entry {
    view: InstanceView,
    node: NodeId,
    /// Every user whose runs or sessions sent it requests, since it was started.
    users: BTreeSet<String>,
    /// Whether `users` is its whole history: not for an instance first known from an
    /// agent's report (started before a restart of the orchestrator, by anyone).
    history_known: bool,
    /// The command; `None` for an instance an agent reported that no run asked this
    /// orchestrator for (one started before a restart), until a run claims it.
    start: Option<pb::StartInstance>,
    /// When an unclaimed instance was first reported.
    orphan_since: Option<std::time::Instant>,
    /// Smooth weighted round robin among replicas ([`Instances::pick`]).
    credit: f64,
    /// A split replica failed through one of its pieces: its state stays as the
    /// failure set it, whatever its own engine reports while stopping.
    broken: bool,
}

/// How long an instance nobody claims may run after a restart of the orchestrator
/// before it is stopped (resumed runs claim theirs as soon as they are planned).
pub const ORPHAN_GRACE: std::time::Duration = std::time::Duration::from_secs(120);

type Outbound = mpsc::Sender<Result<OrchestratorMessage, Status>>;

/// Every instance, and the command channel of every connected node.
pub struct Instances {
    entries: Mutex<BTreeMap<String, Entry>>,
    nodes: Mutex<HashMap<NodeId, Outbound>>,
    changed: watch::Sender<u64>,
    /// Log requests waiting for their reply, by id.
    logs: Mutex<HashMap<u64, oneshot::Sender<pb::LogsReply>>>,
    next_request: AtomicU64,
    /// Where measured memory is recorded beside its estimate.
    measurements: Mutex<Option<Tree<Measurement>>>,
    /// Serving figures.
    load: Load,
}

/// Memory an instance really used once loaded, beside the plan's estimate: the record
/// `skein models measured` shows, one per variant, engine, GPU count, context and
/// concurrency (the latest wins).
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize, utoipa::ToSchema)]
pub struct Measurement {
    /// The variant.
    pub variant: String,
    /// The engine.
    pub engine: String,
    /// GPUs it ran on (0: the CPU).
    pub gpus: usize,
    /// Context tokens per sequence.
    pub context: u64,
    /// Sequences at once.
    pub concurrency: u64,
    /// Bytes the plan reserved (estimate and margin).
    pub estimated_bytes: u64,
    /// Bytes measured: the engine's GPU memory, or its resident host memory on the CPU.
    pub measured_bytes: u64,
    /// Where.
    pub node: String,
    /// When, RFC 3339.
    pub measured_at: String,
}

impl Default for Instances {
    fn default() -> Self {
        Instances {
            entries: Mutex::default(),
            nodes: Mutex::default(),
            changed: watch::channel(0).0,
            logs: Mutex::default(),
            next_request: AtomicU64::new(1),
            measurements: Mutex::default(),
            load: Load::default(),
        }
    }
}

/// How long an agent has to answer a log request.
const LOGS_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

impl std::fmt::Debug for Instances {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Instances").finish_non_exhaustive()
    }
}

/// Why a command could not be sent.
#[derive(Debug, Clone, thiserror::Error)]
pub enum InstanceError {
    /// The node has no live connection.
    #[error("node `{0}` is not connected")]
    NotConnected(String),
    /// No instance has that name.
    #[error("no instance `{0}`; `skein instances` lists them")]
    Unknown(String),
    /// No key could be made for the instance's engine.
    #[error("no key could be made for instance `{instance}` (reading /dev/urandom failed): {source}")]
    Key {
        /// The instance.
        instance: String,
        /// Why.
        #[source]
        source: std::sync::Arc<std::io::Error>,
    },
    /// The agent did not answer, or answered with an error.
    #[error("the agent of instance `{instance}` gave no logs: {reason}")]
    Logs {
        /// The instance.
        instance: String,
        /// Why.
        reason: String,
    },
}

impl Instances {
    /// Records measured memory in `tree` from now on.
    pub fn record_measurements(&self, tree: Tree<Measurement>) {
        *lock(&self.measurements) = Some(tree);
    }

    /// Every measurement recorded.
    pub fn measurements(&self) -> Result<Vec<Measurement>, crate::store::StoreError> {
        match &*lock(&self.measurements) {
            Some(tree) => tree.all(),
            None => Ok(Vec::new()),
        }
    }

    /// The measurement an entry's report makes, if any (recorded by the caller once it
    /// holds no lock: [`Instances::record`]).
    fn measured(entry: &Entry) -> Option<Measurement> {
        let start = entry.start.as_ref()?;
        let view = &entry.view;
        let gpu: u64 = view.measured_gpu.iter().map(|(_, b)| b).sum();
        let measured_bytes = if start.gpus.is_empty() {
            view.measured_host_rss.unwrap_or(0)
        } else {
            gpu
        };
        if measured_bytes == 0 {
            return None;
        }
        Some(Measurement {
            variant: view.variant.clone(),
            engine: view.engine.clone(),
            gpus: start.gpus.len(),
            context: start.context,
            concurrency: start.concurrency,
            estimated_bytes: view.estimated_bytes,
            measured_bytes,
            node: view.node_name.clone(),
            measured_at: humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string(),
        })
    }

    /// Keeps a measurement (lazily: a lost one is measured again at the next start).
    fn record(&self, record: &Measurement) {
        let Some(tree) = lock(&self.measurements).clone() else {
            return;
        };
        let key = format!(
            "{}|{}|{}|{}|{}",
            record.variant, record.engine, record.gpus, record.context, record.concurrency
        );
        if let Err(error) = tree.insert_lazily(&key, record) {
            tracing::warn!(%error, "a memory measurement was not recorded");
        }
    }

    /// A receiver woken on every change of any instance.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }

    fn bump(&self) {
        self.changed.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// Every instance.
    pub fn list(&self) -> Vec<InstanceView> {
        lock(&self.entries).values().map(|e| e.view.clone()).collect()
    }

    /// One instance.
    pub fn get(&self, name: &str) -> Option<InstanceView> {
        lock(&self.entries).get(name).map(|e| e.view.clone())
    }

    /// A node's stream opened: commands for it go to `outbound`, and its instances are
    /// asked for again.
    pub fn node_connected(&self, node: &NodeId, outbound: Outbound) {
        let starts: Vec<pb::StartInstance> = lock(&self.entries)
            .values()
            .filter(|e| &e.node == node && !e.view.state.is_gone())
            .filter_map(|e| e.start.clone())
            .collect();
        for start in starts {
            let _ = outbound.try_send(Ok(start_message(start)));
        }
        lock(&self.nodes).insert(node.clone(), outbound);
    }

    /// A node's stream closed (`outbound` was its command channel; a newer stream of
    /// the same node keeps its own).
    pub fn node_disconnected(&self, node: &NodeId, outbound: &Outbound) {
        let mut nodes = lock(&self.nodes);
        if nodes.get(node).is_some_and(|current| current.same_channel(outbound)) {
            nodes.remove(node);
        }
    }

    /// A node is down (the graph says so), left, or is leaving: its instances are lost
    /// (runs place them again elsewhere). `what` completes "node NAME …" in their
    /// detail: `went down`, `left: slurm job 12 was cancelled`.
    pub fn node_lost(&self, node: &NodeId, what: &str) {
        let mut changed = false;
        for entry in lock(&self.entries).values_mut() {
            if &entry.node == node && !entry.view.state.is_gone() {
                entry.view.state = InstanceState::Lost;
                entry.view.detail = format!("node {} {what}", entry.view.node_name);
                entry.view.base_url = None;
                changed = true;
            }
        }
        if changed {
            self.bump();
        }
    }

    /// Records and sends a start. Errors when the node has no live connection (the
    /// instance is recorded anyway and asked for when the node connects).
    pub fn start(&self, mut request: InstanceRequest) -> Result<(), InstanceError> {
        let name = request.start.instance.clone();
        // The engine already running under this name on this node keeps its key (its
        // agent reported it after a restart of the orchestrator): the start is then the
        // same command, and the agent leaves the engine running.
        let known = lock(&self.entries)
            .get(&name)
            .filter(|e| e.node == request.node)
            .and_then(|e| e.view.engine_key.clone());
        let key = engine_key(&request.start, known)?;
        request.start.engine_api_key = key.as_ref().map(|k| k.expose().to_owned()).unwrap_or_default();
        // An instance reported before this start (it survived a restart of the
        // orchestrator) keeps what its agent said; the agent re-reports it. Not when its
        // key was unknown: the agent replaces that engine with one started with the new
        // key, which is not ready yet.
        let previous = lock(&self.entries).remove(&name).filter(|e| e.node == request.node);
        let mut view = requested_view(&request);
        view.engine_key.clone_from(&key);
        if let Some(p) = previous.as_ref().filter(|p| p.view.engine_key == key) {
            view.state = p.view.state;
            view.detail.clone_from(&p.view.detail);
            view.base_url.clone_from(&p.view.base_url);
            view.measured_host_rss = p.view.measured_host_rss;
            view.measured_gpu.clone_from(&p.view.measured_gpu);
            view.restarts = p.view.restarts;
        }
        lock(&self.entries).insert(
            name,
            Entry {
                view,
                node: request.node.clone(),
                users: previous.as_ref().map(|p| p.users.clone()).unwrap_or_default(),
                history_known: previous.as_ref().is_none_or(|p| p.history_known),
                start: Some(request.start.clone()),
                orphan_since: None,
                credit: 0.0,
                broken: false,
            },
        );
        self.bump();
        self.send(&request.node, &request.node_name, start_message(request.start))
    }

    /// Stops and forgets an instance; a split replica's pieces after it, the last
    /// started first.
    pub fn stop(&self, name: &str) -> Result<(), InstanceError> {
        let entry = lock(&self.entries).remove(name);
        let Some(entry) = entry else {
            return Err(InstanceError::Unknown(name.to_owned()));
        };
        self.load.forget(name);
        self.bump();
        let sent = self.send(&entry.node, &entry.view.node_name, stop_message(name));
        for piece in entry.view.pieces.iter().rev() {
            let _ = self.stop(piece);
        }
        sent
    }

    /// Records a replica split across nodes whose pieces are about to start: it has no
    /// command of its own until they are ready ([`Instances::start_serving`]).
    pub(crate) fn record_split(&self, request: InstanceRequest, pieces: Vec<String>) {
        let name = request.start.instance.clone();
        let mut view = requested_view(&request);
        view.pieces = pieces;
        view.detail = "starting its pieces on the other nodes".to_owned();
        lock(&self.entries).insert(
            name,
            Entry {
                view,
                node: request.node,
                users: BTreeSet::new(),
                history_known: true,
                start: None,
                orphan_since: None,
                credit: 0.0,
                broken: false,
            },
        );
        self.bump();
    }

    /// A split replica's pieces are ready: its serving engine starts with `start`.
    /// Errors as [`Instances::start`]; an unknown name (stopped meanwhile) sends nothing.
    pub(crate) fn start_serving(&self, mut start: pb::StartInstance) -> Result<(), InstanceError> {
        let (node, node_name) = {
            let mut entries = lock(&self.entries);
            let Some(entry) = entries.get_mut(&start.instance) else {
                return Err(InstanceError::Unknown(start.instance.clone()));
            };
            let key = engine_key(&start, entry.view.engine_key.clone())?;
            start.engine_api_key = key.as_ref().map(|k| k.expose().to_owned()).unwrap_or_default();
            entry.view.engine_key = key;
            entry.start = Some(start.clone());
            entry.view.gpus = start.gpus.clone();
            entry.view.detail = "its pieces are ready; starting the engine".to_owned();
            (entry.node.clone(), entry.view.node_name.clone())
        };
        self.bump();
        self.send(&node, &node_name, start_message(start))
    }

    /// Shows how a split replica's pieces stand while they start: `detail`, and their
    /// download progress added up.
    pub(crate) fn forming(&self, name: &str, detail: String, downloaded: u64, total: u64) {
        let changed = match lock(&self.entries).get_mut(name) {
            Some(entry) if entry.start.is_none() && !entry.broken => {
                let view = &mut entry.view;
                let state = if total > downloaded {
                    InstanceState::Downloading
                } else {
                    InstanceState::Starting
                };
                let changed = view.detail != detail || view.downloaded != downloaded || view.state != state;
                view.state = state;
                view.detail = detail;
                view.downloaded = downloaded;
                view.download_total = total;
                changed
            }
            _ => false,
        };
        if changed {
            self.bump();
        }
    }

    /// A split replica failed through a piece: it takes `state` (failed, or lost with
    /// the piece's node) and `detail`, which its own engine's reports no longer change,
    /// and its serving engine and pieces stop. The entry stays, for its run to see.
    pub(crate) fn break_split(
        &self,
        name: &str,
        state: InstanceState,
        detail: String,
        failed_on: Option<(String, Vec<u32>)>,
    ) {
        let (entry_node, node_name, pieces, serving) = {
            let mut entries = lock(&self.entries);
            let Some(entry) = entries.get_mut(name) else { return };
            entry.broken = true;
            entry.view.state = state;
            entry.view.detail = detail;
            entry.view.base_url = None;
            entry.view.failed_on = failed_on;
            (
                entry.node.clone(),
                entry.view.node_name.clone(),
                entry.view.pieces.clone(),
                entry.start.is_some(),
            )
        };
        self.load.forget(name);
        self.bump();
        if serving {
            let _ = self.send(&entry_node, &node_name, stop_message(name));
        }
        for piece in pieces.iter().rev() {
            let _ = self.stop(piece);
        }
    }

    fn send(&self, node: &NodeId, node_name: &str, message: OrchestratorMessage) -> Result<(), InstanceError> {
        let outbound = lock(&self.nodes).get(node).cloned();
        match outbound {
            Some(outbound) => outbound
                .try_send(Ok(message))
                .map_err(|_| InstanceError::NotConnected(node_name.to_owned())),
            None => Err(InstanceError::NotConnected(node_name.to_owned())),
        }
    }

    /// The last `tail` lines of an instance's engine log, from its agent.
    ///
    /// Errors: an unknown instance, a node not connected, no answer in 10 s.
    pub async fn logs(&self, name: &str, tail: u32) -> Result<Vec<String>, InstanceError> {
        let (node, node_name) = {
            let entries = lock(&self.entries);
            let entry = entries
                .get(name)
                .ok_or_else(|| InstanceError::Unknown(name.to_owned()))?;
            (entry.node.clone(), entry.view.node_name.clone())
        };
        let id = self.next_request.fetch_add(1, Ordering::Relaxed);
        let (reply, answer) = oneshot::channel();
        lock(&self.logs).insert(id, reply);
        let message = OrchestratorMessage {
            kind: Some(orchestrator_message::Kind::LogsRequest(pb::LogsRequest {
                id,
                instance: name.to_owned(),
                tail,
            })),
        };
        if let Err(error) = self.send(&node, &node_name, message) {
            lock(&self.logs).remove(&id);
            return Err(error);
        }
        let failed = |reason: String| InstanceError::Logs {
            instance: name.to_owned(),
            reason,
        };
        let reply = tokio::time::timeout(LOGS_TIMEOUT, answer).await;
        lock(&self.logs).remove(&id);
        match reply {
            Ok(Ok(reply)) if reply.error.is_empty() => Ok(reply.lines),
            Ok(Ok(reply)) => Err(failed(reply.error)),
            Ok(Err(_)) => Err(failed("its connection closed".to_owned())),
            Err(_) => Err(failed(format!("no answer in {}s", LOGS_TIMEOUT.as_secs()))),
        }
    }

    /// `user` sent the instance a request (a step of their run, a turn of their
    /// session, a completion): it is theirs to read about from now on, with the others
    /// who used it ([`Instances::log_readers`]).
    pub fn used_by(&self, name: &str, user: &str) {
        if let Some(entry) = lock(&self.entries).get_mut(name)
            && !entry.users.contains(user)
        {
            entry.users.insert(user.to_owned());
        }
    }

    /// A request of `run`'s agent went to the instance `name` (a session on the run's
    /// agent, a call of the agent by name): the run is among its
    /// [`InstanceView::runs`] from now on.
    pub fn served_run(&self, name: &str, run: &str) {
        let added = match lock(&self.entries).get_mut(name) {
            Some(entry) if !entry.view.runs.iter().any(|r| r == run) => {
                entry.view.runs.push(run.to_owned());
                true
            }
            _ => false,
        };
        if added {
            self.bump();
        }
    }

    /// Who has used the instance `name`, and the run it serves now (whose owner is one
    /// of its users too); `None` for an unknown instance.
    pub fn log_readers(&self, name: &str) -> Option<(LogReaders, Option<String>)> {
        lock(&self.entries).get(name).map(|e| {
            (
                LogReaders {
                    users: e.users.clone(),
                    history_known: e.history_known,
                },
                e.view.run.clone(),
            )
        })
    }

    /// An agent's answer to [`Instances::logs`].
    pub fn logs_reply(&self, reply: pb::LogsReply) {
        if let Some(waiting) = lock(&self.logs).remove(&reply.id) {
            let _ = waiting.send(reply);
        }
    }

    /// GPU memory instances hold beyond what their engines were measured to use:
    /// `(node name, GPU index, bytes)`. An engine still downloading or loading holds its
    /// whole reservation though no sample shows it yet; a loaded one only what its
    /// measurement does not cover (all of it on a simulated GPU, whose samples never
    /// show engines). The executor plans on the graph minus these, so runs admitted one
    /// after the other never count on the same free memory.
    pub fn unaccounted(&self) -> Vec<(String, u32, u64)> {
        lock(&self.entries)
            .values()
            .filter(|e| e.orphan_since.is_none() && !e.view.state.is_gone())
            .flat_map(|e| {
                e.view.held.iter().filter_map(|&(gpu, bytes)| {
                    let measured: u64 = e
                        .view
                        .measured_gpu
                        .iter()
                        .filter(|(g, _)| *g == gpu)
                        .map(|(_, b)| b)
                        .sum();
                    let rest = bytes.saturating_sub(measured);
                    (rest > 0).then(|| (e.view.node_name.clone(), gpu, rest))
                })
            })
            .collect()
    }

    /// Claims for `run` a ready instance no run uses whose [`InstanceView::warm_key`]
    /// is `warm_key` and that `usable` accepts (one off drained GPUs).
    pub fn claim(&self, warm_key: &str, run: &str, usable: impl Fn(&InstanceView) -> bool) -> Option<InstanceView> {
        let mut entries = lock(&self.entries);
        let entry = entries.values_mut().find(|e| {
            e.view.idle_since.is_some()
                && e.view.state == InstanceState::Ready
                && e.view.warm_key == warm_key
                && usable(&e.view)
        })?;
        entry.view.run = Some(run.to_owned());
        entry.view.idle_since = None;
        if !entry.view.runs.iter().any(|r| r == run) {
            entry.view.runs.push(run.to_owned());
        }
        Some(entry.view.clone())
    }

    /// The serving figures of every instance.
    pub fn load(&self) -> &Load {
        &self.load
    }

    /// Every instance `wanted` accepts, in name order.
    pub fn filter(&self, wanted: impl Fn(&InstanceView) -> bool) -> Vec<InstanceView> {
        lock(&self.entries)
            .values()
            .map(|e| &e.view)
            .filter(|v| wanted(v))
            .cloned()
            .collect()
    }

    /// The replica of `agent` of `run` that takes the next new session or request: among
    /// the ready ones, by their shares (smooth weighted round robin, so that shares of
    /// 1 and 3 send every fourth to the first); when every share is 0, any ready one.
    pub fn pick(&self, run: &str, agent: &str) -> Option<InstanceView> {
        let mut entries = lock(&self.entries);
        let mut ready: Vec<&mut Entry> = entries
            .values_mut()
            .filter(|e| {
                e.view.run.as_deref() == Some(run)
                    && e.view.agents.iter().any(|a| a == agent)
                    && e.view.state == InstanceState::Ready
                    && e.view.base_url.is_some()
            })
            .collect();
        let total: f64 = ready.iter().map(|e| e.view.share.max(0.0)).sum();
        if total <= 0.0 {
            return ready.first().map(|e| e.view.clone());
        }
        for entry in &mut ready {
            entry.credit += entry.view.share.max(0.0);
        }
        let chosen = ready
            .into_iter()
            .filter(|e| e.view.share > 0.0)
            .max_by(|a, b| a.credit.total_cmp(&b.credit))?;
        chosen.credit -= total;
        Some(chosen.view.clone())
    }

    /// Sets an instance's [`InstanceView::share`]; returns whether it exists.
    pub fn set_share(&self, name: &str, share: f64) -> bool {
        let found = match lock(&self.entries).get_mut(name) {
            Some(entry) => {
                entry.view.share = share;
                entry.credit = 0.0;
                true
            }
            None => false,
        };
        if found {
            self.bump();
        }
        found
    }

    /// The first instance (in name order) `wanted` accepts.
    pub fn find(&self, wanted: impl Fn(&InstanceView) -> bool) -> Option<InstanceView> {
        lock(&self.entries)
            .values()
            .map(|e| &e.view)
            .find(|v| wanted(v))
            .cloned()
    }

    /// Someone (a session) uses the instance: an idle one stays warm from now on, and one
    /// reported after a restart that no run claimed is adopted as warm instead of being
    /// stopped. Returns it.
    pub fn touch(&self, name: &str) -> Option<InstanceView> {
        let mut entries = lock(&self.entries);
        let entry = entries.get_mut(name)?;
        if entry.orphan_since.take().is_some() || entry.view.idle_since.is_some() {
            entry.view.idle_since = Some(std::time::Instant::now());
        }
        Some(entry.view.clone())
    }

    /// The run using an instance ended: it stays warm for the next run that needs the
    /// same (see [`Instances::stop_idle`]).
    pub fn release(&self, name: &str) {
        if let Some(entry) = lock(&self.entries).get_mut(name) {
            entry.view.run = None;
            entry.view.idle_since = Some(std::time::Instant::now());
        }
        self.bump();
    }

    /// Stops instances no run has used for `keep` (all idle ones with a zero `keep`).
    /// Returns how many were stopped.
    pub fn stop_idle(&self, keep: std::time::Duration) -> usize {
        let idle: Vec<String> = lock(&self.entries)
            .iter()
            .filter(|(_, e)| e.view.idle_since.is_some_and(|since| since.elapsed() >= keep))
            .map(|(name, _)| name.clone())
            .collect();
        for name in &idle {
            tracing::info!(instance = %name, "stopping an idle instance");
            let _ = self.stop(name);
        }
        idle.len()
    }

    /// Stops the instances no run claimed within [`ORPHAN_GRACE`] of being reported.
    pub fn stop_orphans(&self) {
        let expired: Vec<String> = lock(&self.entries)
            .iter()
            .filter(|(_, e)| e.orphan_since.is_some_and(|since| since.elapsed() >= ORPHAN_GRACE))
            .map(|(name, _)| name.clone())
            .collect();
        for name in expired {
            tracing::info!(instance = %name, "stopping an instance no run claimed");
            let _ = self.stop(&name);
        }
    }

    /// An agent's report. An instance the orchestrator does not know (one started
    /// before the orchestrator restarted) is kept for a resumed run to claim, and
    /// stopped if none does ([`Instances::stop_orphans`]).
    pub fn report(&self, node: &NodeId, status: pb::InstanceStatus) {
        let mut measurement = None;
        let known = {
            let mut entries = lock(&self.entries);
            if !entries.contains_key(&status.instance)
                && InstanceState::from_wire(status.state) != InstanceState::Stopped
            {
                let view = new_view(&status.instance, node, &node.0);
                entries.insert(
                    status.instance.clone(),
                    Entry {
                        view,
                        node: node.clone(),
                        users: BTreeSet::new(),
                        history_known: false,
                        start: None,
                        orphan_since: Some(std::time::Instant::now()),
                        credit: 0.0,
                        broken: false,
                    },
                );
            }
            match entries.get_mut(&status.instance) {
                // A split replica that failed through a piece keeps that failure.
                Some(entry) if entry.broken => false,
                Some(entry) if &entry.node == node => {
                    let view = &mut entry.view;
                    // The key of an engine this orchestrator did not start (it restarted),
                    // from the agent that holds it; a key of its own is never replaced.
                    if view.engine_key.is_none() && entry.start.is_none() {
                        view.engine_key = Secret::new(status.engine_api_key.as_str());
                    }
                    view.state = InstanceState::from_wire(status.state);
                    view.detail = status.detail;
                    view.base_url = (!status.base_url.is_empty()).then_some(status.base_url);
                    view.downloaded = status.downloaded;
                    view.download_total = status.download_total;
                    view.restarts = status.restarts;
                    if status.host_rss.is_some() || !status.gpu_memory.is_empty() {
                        view.measured_host_rss = status.host_rss;
                        view.measured_gpu = status.gpu_memory.iter().map(|g| (g.index, g.bytes)).collect();
                        if view.state == InstanceState::Ready {
                            measurement = Instances::measured(entry);
                        }
                    }
                    true
                }
                _ => false,
            }
        };
        if let Some(measurement) = &measurement {
            self.record(measurement);
        }
        if known {
            self.bump();
        }
    }
}

/// The view of an instance just asked for with `request`.
fn requested_view(request: &InstanceRequest) -> InstanceView {
    let mut view = new_view(&request.start.instance, &request.node, &request.node_name);
    view.run.clone_from(&request.run);
    view.agents.clone_from(&request.agents);
    view.engine.clone_from(&request.engine);
    view.variant.clone_from(&request.variant);
    view.gpus.clone_from(&request.start.gpus);
    view.estimated_bytes = request.estimated_bytes;
    view.held.clone_from(&request.held);
    view.clone_of.clone_from(&request.clone_of);
    view.placement.clone_from(&request.placement);
    view.part_of.clone_from(&request.part_of);
    view.warm_key.clone_from(&request.warm_key);
    view.serves.clone_from(&request.serves);
    view.runs = request.run.iter().cloned().collect();
    view
}

/// A view of `name` on `node` that nothing is known about yet.
fn new_view(name: &str, node: &NodeId, node_name: &str) -> InstanceView {
    InstanceView {
        name: name.to_owned(),
        node: node.0.clone(),
        node_name: node_name.to_owned(),
        run: None,
        agents: Vec::new(),
        engine: String::new(),
        variant: String::new(),
        gpus: Vec::new(),
        estimated_bytes: 0,
        held: Vec::new(),
        state: InstanceState::Requested,
        detail: String::new(),
        base_url: None,
        measured_host_rss: None,
        measured_gpu: Vec::new(),
        downloaded: 0,
        download_total: 0,
        restarts: 0,
        clone_of: None,
        share: 1.0,
        placement: None,
        part_of: None,
        pieces: Vec::new(),
        failed_on: None,
        warm_key: String::new(),
        serves: None,
        runs: Vec::new(),
        sessions: Vec::new(),
        idle_since: None,
        engine_key: None,
    }
}

/// The key of the engine `start` starts: `known` (the engine already running has it),
/// else a new one; none for what cannot check a key (a piece of a split engine, a remote
/// endpoint).
///
/// Errors: [`InstanceError::Key`] when no random bytes could be read.
fn engine_key(start: &pb::StartInstance, known: Option<Secret>) -> Result<Option<Secret>, InstanceError> {
    use pb::start_instance::Engine;
    match start.engine {
        Some(Engine::Candle(_) | Engine::LlamaCpp(_) | Engine::Vllm(_)) => {}
        Some(Engine::Remote(_) | Engine::RayNode(_) | Engine::LlamaRpc(_)) | None => return Ok(None),
    }
    if known.is_some() {
        return Ok(known);
    }
    Secret::generate().map(Some).map_err(|source| InstanceError::Key {
        instance: start.instance.clone(),
        source: std::sync::Arc::new(source),
    })
}

fn stop_message(name: &str) -> OrchestratorMessage {
    OrchestratorMessage {
        kind: Some(orchestrator_message::Kind::StopInstance(pb::StopInstance {
            instance: name.to_owned(),
        })),
    }
}

fn start_message(start: pb::StartInstance) -> OrchestratorMessage {
    OrchestratorMessage {
        kind: Some(orchestrator_message::Kind::StartInstance(start)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn readers(users: &[&str], history_known: bool) -> LogReaders {
        LogReaders {
            users: users.iter().map(|u| (*u).to_owned()).collect(),
            history_known,
        }
    }

    #[test]
    fn logs_are_for_admins_and_for_the_one_user_whose_requests_they_hold() {
        assert!(readers(&["alice"], true).admit("alice", false));
        assert!(!readers(&["alice"], true).admit("bob", false));
        assert!(readers(&["alice"], true).admit("admin", true));
        // Shared: someone else's prompts may be in it.
        assert!(!readers(&["alice", "bob"], true).admit("alice", false));
        assert!(readers(&["alice", "bob"], true).admit("root", true));
        // Nobody's yet, or started before a restart by who knows whom.
        assert!(!readers(&[], true).admit("alice", false));
        assert!(!readers(&["alice"], false).admit("alice", false));
        assert!(readers(&[], false).admit("root", true));
    }

    fn request(name: &str, engine: pb::start_instance::Engine) -> InstanceRequest {
        InstanceRequest {
            node: NodeId("n1".to_owned()),
            node_name: "n1".to_owned(),
            run: Some("r1".to_owned()),
            agents: vec!["a".to_owned()],
            engine: "vllm".to_owned(),
            variant: "v".to_owned(),
            estimated_bytes: 0,
            held: Vec::new(),
            warm_key: String::new(),
            serves: None,
            clone_of: None,
            placement: None,
            part_of: None,
            start: pb::StartInstance {
                instance: name.to_owned(),
                engine: Some(engine),
                ..pb::StartInstance::default()
            },
        }
    }

    fn sent_starts(commands: &mut mpsc::Receiver<Result<OrchestratorMessage, Status>>) -> Vec<pb::StartInstance> {
        let mut starts = Vec::new();
        while let Ok(Ok(message)) = commands.try_recv() {
            if let Some(orchestrator_message::Kind::StartInstance(start)) = message.kind {
                starts.push(start);
            }
        }
        starts
    }

    #[test]
    fn every_engine_gets_a_key_of_its_own_and_a_running_engine_keeps_its_key() {
        let instances = Instances::default();
        let node = NodeId("n1".to_owned());
        let (outbound, mut commands) = mpsc::channel(16);
        instances.node_connected(&node, outbound);
        let vllm = || pb::start_instance::Engine::Vllm(pb::VllmEngine::default());
        instances.start(request("i1", vllm())).unwrap();
        instances.start(request("i2", vllm())).unwrap();
        let ray = pb::start_instance::Engine::RayNode(pb::RayNode::default());
        instances.start(request("i2.ray-head-0", ray)).unwrap();
        let starts = sent_starts(&mut commands);
        let keys: Vec<&str> = starts.iter().map(|s| s.engine_api_key.as_str()).collect();
        assert_eq!(keys[0].len(), 64, "32 random bytes in hex");
        assert!(keys[0].bytes().all(|b| b.is_ascii_hexdigit()));
        assert_ne!(keys[0], keys[1], "one key per instance");
        assert_eq!(keys[2], "", "a Ray node speaks no HTTP: no key");
        let view = instances.get("i1").unwrap();
        assert_eq!(view.engine_key.as_ref().map(Secret::expose), Some(keys[0]));
        let shown = format!("{} {view:?}", serde_json::to_string(&view).unwrap());
        assert!(
            !shown.contains(keys[0]),
            "the key is never serialized or shown: {shown}"
        );
        assert_eq!(
            crate::engine_client::Route::to_instance(&InstanceView {
                base_url: Some("http://n1:1/v1".to_owned()),
                ..view
            })
            .and_then(|r| r.api_key)
            .as_ref()
            .map(Secret::expose),
            Some(keys[0]),
            "requests to it carry the key"
        );

        // After a restart of the orchestrator: the agent reports the engine with its key,
        // and the run's start asks for that engine again, not a new one.
        let restarted = Instances::default();
        let (outbound, mut commands) = mpsc::channel(16);
        restarted.node_connected(&node, outbound);
        restarted.report(
            &node,
            pb::InstanceStatus {
                instance: "i1".to_owned(),
                state: pb::InstanceState::Ready as i32,
                base_url: "http://n1:1/v1".to_owned(),
                engine_api_key: keys[0].to_owned(),
                ..pb::InstanceStatus::default()
            },
        );
        restarted.start(request("i1", vllm())).unwrap();
        let again = sent_starts(&mut commands);
        assert_eq!(again[0].engine_api_key, keys[0]);
        assert_eq!(restarted.get("i1").unwrap().state, InstanceState::Ready);
        // Another node's agent cannot hand the orchestrator a key for it.
        restarted.report(
            &NodeId("n2".to_owned()),
            pb::InstanceStatus {
                instance: "i1".to_owned(),
                engine_api_key: "f".repeat(64),
                ..pb::InstanceStatus::default()
            },
        );
        assert_eq!(
            restarted.get("i1").unwrap().engine_key.as_ref().map(Secret::expose),
            Some(keys[0])
        );

        // An engine reported without a key (an older agent) is replaced, not trusted ready.
        let older = Instances::default();
        older.report(
            &node,
            pb::InstanceStatus {
                instance: "i1".to_owned(),
                state: pb::InstanceState::Ready as i32,
                base_url: "http://n1:1/v1".to_owned(),
                ..pb::InstanceStatus::default()
            },
        );
        // (No node is connected: the start is recorded, and sent when it connects.)
        older.start(request("i1", vllm())).unwrap_err();
        let view = older.get("i1").unwrap();
        assert_eq!(view.state, InstanceState::Requested);
        assert!(view.engine_key.is_some());
    }

    #[test]
    fn the_serving_engine_of_a_split_gets_its_key_when_its_pieces_are_ready() {
        let instances = Instances::default();
        let node = NodeId("n1".to_owned());
        let (outbound, mut commands) = mpsc::channel(16);
        instances.node_connected(&node, outbound);
        let vllm = pb::start_instance::Engine::Vllm(pb::VllmEngine::default());
        let request = request("r1-writer", vllm);
        let start = request.start.clone();
        instances.record_split(request, vec!["r1-writer.ray-head-0".to_owned()]);
        assert!(
            instances.get("r1-writer").unwrap().engine_key.is_none(),
            "nothing started yet"
        );
        instances.start_serving(start).unwrap();
        let sent = sent_starts(&mut commands);
        assert_eq!(sent[0].engine_api_key.len(), 64);
        let key = instances.get("r1-writer").unwrap().engine_key.unwrap();
        assert_eq!(key.expose(), sent[0].engine_api_key);
    }

    #[test]
    fn the_users_of_an_instance_are_recorded() {
        let instances = Instances::default();
        // No node is connected: the start is recorded, and sent when it connects.
        instances
            .start(request(
                "i1",
                pb::start_instance::Engine::Vllm(pb::VllmEngine::default()),
            ))
            .unwrap_err();
        instances.used_by("i1", "alice");
        instances.used_by("i1", "alice");
        let (readers, run) = instances.log_readers("i1").unwrap();
        assert_eq!(readers, self::readers(&["alice"], true));
        assert_eq!(run.as_deref(), Some("r1"));
        instances.used_by("i1", "bob");
        assert!(!instances.log_readers("i1").unwrap().0.admit("alice", false));
        assert!(instances.log_readers("nope").is_none());
    }
}
