//! What an instance is and what it was asked to be: its state, the view the API shows,
//! who may read its logs, and the request that starts it.

use std::collections::BTreeSet;
use std::sync::Arc;

use serde::Serialize;
use skein_proto::agent::v1::{self as pb};

use crate::base::Secret;
use crate::graph::NodeId;

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

    pub(super) fn from_wire(state: i32) -> InstanceState {
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
