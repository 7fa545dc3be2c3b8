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

mod measure;
mod share;
mod split;
mod view;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use skein_proto::agent::v1::{self as pb, OrchestratorMessage, orchestrator_message};
use tokio::sync::{mpsc, oneshot, watch};
use tonic::Status;

use crate::base::{Secret, lock};
use crate::graph::NodeId;
use crate::load::Load;
use crate::store::Tree;

pub use measure::Measurement;
pub use view::{InstanceRequest, InstanceState, InstanceView, LogReaders};

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
pub(crate) fn new_view(name: &str, node: &NodeId, node_name: &str) -> InstanceView {
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
