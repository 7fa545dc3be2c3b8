//! The values the hardware graph holds and hands out: inventory, telemetry samples,
//! health, and the immutable views a snapshot is made of.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

/// A node's id: assigned at its first registration, kept for the same node name across
/// reconnects and agent restarts.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(transparent)]
pub struct NodeId(pub String);

impl std::fmt::Display for NodeId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

pub use crate::base::Millis;

/// What a node reported about itself at registration.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct NodeInventory {
    /// The node's name (hostname, or the simulated node's name).
    pub name: String,
    /// The agent's version.
    pub agent_version: String,
    /// What discovered its GPUs.
    pub gpu_source: String,
    /// The machine.
    pub host: HostFacts,
    /// Its GPUs, by index.
    pub gpus: Vec<GpuFacts>,
    /// The operator's labels (`skein agent --label zone=lab-a`, a fleet file's
    /// `labels:`), checked by [`skein_proto::labels`]; empty when none were given.
    pub labels: BTreeMap<String, String>,
}

impl NodeInventory {
    /// The value of label `key`, if the node carries it.
    pub fn label(&self, key: &str) -> Option<&str> {
        self.labels.get(key).map(String::as_str)
    }
}

/// The machine's static facts.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct HostFacts {
    /// Hostname.
    pub hostname: String,
    /// Operating system.
    pub os: String,
    /// Kernel version.
    pub kernel: String,
    /// CPU architecture.
    pub arch: String,
    /// Logical CPU cores (0 when unknown).
    pub logical_cores: u32,
    /// Physical CPU cores (0 when unknown).
    pub physical_cores: u32,
    /// CPU model.
    pub cpu_brand: String,
    /// RAM in bytes (0 when unknown).
    pub memory_total: u64,
    /// NUMA nodes (0 when unknown).
    pub numa_nodes: u32,
    /// The fastest link of the machine's up, physical network interfaces (loopback
    /// excluded), in bits per second; 0 when unknown. What a model split across nodes
    /// can move between them at best.
    pub network_bps: u64,
}

/// A GPU's static facts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GpuFacts {
    /// Index on its node.
    pub index: u32,
    /// NVML UUID (`GPU-…`).
    pub uuid: String,
    /// Model name as NVML reports it.
    pub name: String,
    /// Total memory in bytes.
    pub memory_total: u64,
    /// CUDA compute capability.
    pub compute_capability: Option<(u32, u32)>,
    /// Power limit in milliwatts.
    pub power_limit_mw: Option<u32>,
    /// PCIe generation and width.
    pub pcie: Option<(u32, u32)>,
    /// UUIDs of the GPUs on the node it has an active NVLink to.
    pub nvlink_peers: Vec<String>,
    /// Whether MIG is on.
    pub mig_enabled: Option<bool>,
    /// Whether it is a simulated GPU.
    pub simulated: bool,
}

/// One GPU at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct GpuSample {
    /// When the orchestrator received it.
    pub received_ms: Millis,
    /// When the agent took it (Unix milliseconds, the agent's clock).
    pub unix_ms: i64,
    /// Memory in use, bytes.
    pub memory_used: u64,
    /// Memory free, bytes.
    pub memory_free: u64,
    /// Busy percentage of the last sample period.
    pub utilization_pct: Option<u32>,
    /// Memory-controller busy percentage.
    pub memory_utilization_pct: Option<u32>,
    /// Degrees Celsius.
    pub temperature_c: Option<i32>,
    /// Milliwatts.
    pub power_mw: Option<u32>,
    /// SM clock, MHz.
    pub sm_clock_mhz: Option<u32>,
    /// NVML throttle-reason bits ([`skein_proto::throttle`]).
    pub throttle_reasons: u64,
    /// Corrected ECC errors since the driver loaded.
    pub ecc_corrected: Option<u64>,
    /// Uncorrected ECC errors since the driver loaded.
    pub ecc_uncorrected: Option<u64>,
    /// Memory held by processes Skein did not start, when measured.
    pub foreign_memory: Option<u64>,
}

/// A GPU's sample as an agent sends it: the sample and the GPU's index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IndexedSample {
    /// The GPU's index on its node.
    pub index: u32,
    /// The sample.
    pub sample: GpuSample,
}

/// The machine at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct HostSample {
    /// One-minute load average.
    pub load1: f64,
    /// Available RAM, bytes.
    pub memory_available: u64,
}

/// One telemetry message of a node.
#[derive(Debug, Clone, PartialEq)]
pub struct TelemetryBatch {
    /// The agent's sequence number.
    pub seq: u64,
    /// Its GPUs.
    pub gpus: Vec<IndexedSample>,
    /// The machine.
    pub host: Option<HostSample>,
}

/// Whether something can be planned on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum HealthState {
    /// Working normally.
    Ok,
    /// Working, but throttled or accumulating errors: avoid for new work.
    Degraded,
    /// Not reporting: its node missed its telemetry intervals or disconnected.
    Down,
    /// Gone on purpose: its agent said it was leaving (its Slurm job ended, or it was
    /// stopped), and its instances were placed elsewhere. Not a failure; the node comes
    /// back when an agent registers it again.
    Left,
}

impl HealthState {
    /// Every state.
    pub const ALL: [HealthState; 4] = [
        HealthState::Ok,
        HealthState::Degraded,
        HealthState::Down,
        HealthState::Left,
    ];

    /// The state's name: the API writes it (serde's `snake_case` name, the same), the
    /// CLI prints it.
    pub fn name(self) -> &'static str {
        match self {
            HealthState::Ok => "ok",
            HealthState::Degraded => "degraded",
            HealthState::Down => "down",
            HealthState::Left => "left",
        }
    }

    /// Whether nothing can run there: [`Down`](Self::Down) or [`Left`](Self::Left).
    pub fn is_unavailable(self) -> bool {
        matches!(self, HealthState::Down | HealthState::Left)
    }
}

impl std::fmt::Display for HealthState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.name())
    }
}

/// A health state with the reasons for it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Health {
    /// The state.
    pub state: HealthState,
    /// Why it is not ok; empty when ok.
    pub reasons: Vec<String>,
}

impl Health {
    /// Ok, no reasons.
    pub const OK: Health = Health {
        state: HealthState::Ok,
        reasons: Vec::new(),
    };
}

/// How two GPUs of a node are connected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LinkKind {
    /// NVLink.
    Nvlink,
    /// Through PCIe (and the host bridge).
    Pcie,
}

/// A link between two GPUs of one node.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Link {
    /// One GPU's index.
    pub a: u32,
    /// The other's.
    pub b: u32,
    /// NVLink or PCIe.
    pub kind: LinkKind,
    /// Its bandwidth, GB/s (decimal), when known: for NVLink the cards' NVLink bandwidth
    /// ([`skein_gpu_catalog::nvlink_gbs`]), for PCIe one direction of the slower card's
    /// link ([`skein_gpu_catalog::pcie_gbs`]).
    pub gbytes_per_s: Option<f64>,
}

/// One GPU in a snapshot.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GpuView {
    /// Static facts.
    pub facts: GpuFacts,
    /// The latest sample.
    pub latest: Option<GpuSample>,
    /// Health, with reasons.
    pub health: Health,
    /// Why it is drained (a reflex's `drain`, or its node's): nothing new is placed on it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub drained: Option<String>,
    /// One direction of its PCIe link to the host, GB/s (decimal), when known
    /// ([`skein_gpu_catalog::pcie_gbs`]).
    pub pcie_gbytes_per_s: Option<f64>,
}

impl GpuView {
    /// Memory a new engine could use now: free memory as the GPU reports it (which
    /// already excludes every process's, Skein's own included); `None` before the first
    /// sample.
    pub fn memory_free(&self) -> Option<u64> {
        self.latest.map(|s| s.memory_free)
    }
}

/// One node in a snapshot: immutable, built when its state changed.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct NodeView {
    /// Its id.
    pub id: NodeId,
    /// Its inventory.
    pub inventory: Arc<NodeInventory>,
    /// Whether its agent is connected now.
    pub connected: bool,
    /// Node health: down when it stopped reporting, left when its agent said it left;
    /// degraded when a GPU is.
    pub health: Health,
    /// Why the node is draining, when its agent said it will leave soon (a Slurm job's
    /// warning): nothing new is placed on it, and its instances move elsewhere.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub draining: Option<String>,
    /// When it last sent telemetry (orchestrator clock).
    pub last_seen_ms: Option<Millis>,
    /// The agent's last sequence number.
    pub last_seq: Option<u64>,
    /// Round-trip time of the last ping, milliseconds.
    pub rtt_ms: Option<f64>,
    /// The machine now.
    pub host: Option<HostSample>,
    /// Its GPUs, by index.
    pub gpus: Vec<GpuView>,
    /// Links between its GPUs.
    pub links: Vec<Link>,
    /// Decode speeds measured on it (by engine and variant, sorted), from the answers
    /// of the instances it served ([`HardwareGraph::record_speed`]).
    ///
    /// [`HardwareGraph::record_speed`]: super::HardwareGraph::record_speed
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub measured: Vec<MeasuredSpeed>,
    /// The graph version at which this view was built.
    pub version: u64,
}

/// A decode speed measured on a node: what an engine serving a variant really did.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct MeasuredSpeed {
    /// The engine, as plans name it (`candle`, `llama.cpp`, `vllm`).
    pub engine: String,
    /// The variant, as plans name it.
    pub variant: String,
    /// How it was placed on the node: the plan's family and its number of devices
    /// (`CPU ×1`, `one GPU ×1`, `tensor parallel ×2`; `plan::speed_placement`).
    pub placement: String,
    /// Tokens per second of one sequence: the mean over the answers measured.
    pub tokens_per_s: f64,
    /// Answers measured.
    pub samples: u64,
}

/// The whole graph at one version: cheap to take (one `Arc` per node), immutable, and
/// safe to hold while planning.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GraphSnapshot {
    /// The graph's version when taken; every change increments it.
    pub version: u64,
    /// The expected telemetry interval.
    pub sample_interval_ms: u64,
    /// Every node, sorted by name.
    pub nodes: Vec<Arc<NodeView>>,
}

impl GraphSnapshot {
    /// The nodes whose label `key` is `value` (exactly), in name order: with `key`
    /// `zone`, the nodes of a reflex scoped to `{ zone: VALUE }`. Connected or not, and
    /// whatever their health: callers filter for what they need.
    pub fn nodes_labelled<'a>(&'a self, key: &'a str, value: &'a str) -> impl Iterator<Item = &'a NodeView> + 'a {
        self.nodes
            .iter()
            .map(Arc::as_ref)
            .filter(move |node| node.inventory.label(key) == Some(value))
    }

    /// Every GPU with its node.
    pub fn gpus(&self) -> impl Iterator<Item = (&NodeView, &GpuView)> {
        self.nodes
            .iter()
            .flat_map(|n| n.gpus.iter().map(move |g| (n.as_ref(), g)))
    }

    /// This snapshot with `held` bytes taken from GPUs' free memory: `(node name, GPU
    /// index, bytes)` of instances that hold (or are about to hold) memory the GPUs'
    /// samples do not show yet, such as engines still loading. Only the nodes concerned
    /// get new views (so planners that keep per-view caches see just those change).
    pub fn with_held(&self, held: &[(String, u32, u64)]) -> GraphSnapshot {
        if held.is_empty() {
            return self.clone();
        }
        let nodes = self
            .nodes
            .iter()
            .map(|node| {
                let mine: Vec<&(String, u32, u64)> = held.iter().filter(|(n, ..)| *n == node.inventory.name).collect();
                if mine.is_empty() {
                    return Arc::clone(node);
                }
                let mut view = NodeView::clone(node);
                for gpu in &mut view.gpus {
                    let bytes: u64 = mine
                        .iter()
                        .filter(|(_, index, _)| *index == gpu.facts.index)
                        .map(|(.., b)| b)
                        .sum();
                    if let Some(sample) = gpu.latest.as_mut() {
                        sample.memory_free = sample.memory_free.saturating_sub(bytes);
                        sample.memory_used = sample.memory_used.saturating_add(bytes).min(gpu.facts.memory_total);
                    }
                }
                Arc::new(view)
            })
            .collect();
        GraphSnapshot { nodes, ..self.clone() }
    }

    /// The snapshot with every node `keep_node` refuses, and every GPU `keep_gpu`
    /// refuses, marked down, so that plans leave them out (a placement pinned to one
    /// GPU, a move away from some). Unchanged nodes stay shared.
    pub fn restricted(
        &self,
        keep_node: impl Fn(&NodeView) -> bool,
        keep_gpu: impl Fn(&NodeView, &GpuView) -> bool,
    ) -> GraphSnapshot {
        let nodes = self
            .nodes
            .iter()
            .map(|node| {
                let node_kept = keep_node(node);
                if node_kept && node.gpus.iter().all(|g| keep_gpu(node, g)) {
                    return Arc::clone(node);
                }
                let mut view = NodeView::clone(node);
                if !node_kept {
                    view.health.state = HealthState::Down;
                }
                for gpu in &mut view.gpus {
                    if !keep_gpu(node, gpu) {
                        gpu.health.state = HealthState::Down;
                    }
                }
                Arc::new(view)
            })
            .collect();
        GraphSnapshot { nodes, ..self.clone() }
    }

    /// The snapshot with drained GPUs marked down, so that plans leave them out.
    pub fn without_drained(&self) -> GraphSnapshot {
        self.restricted(|_| true, |_, g| g.drained.is_none())
    }

    /// Estimated round trip between two nodes: the sum of their measured round trips to
    /// the orchestrator, the round trip of the path through it (an upper bound of the
    /// direct one). `None` when either was never measured.
    pub fn network_rtt_ms(&self, a: &NodeId, b: &NodeId) -> Option<f64> {
        let rtt = |id: &NodeId| self.nodes.iter().find(|n| &n.id == id).and_then(|n| n.rtt_ms);
        Some(rtt(a)? + rtt(b)?)
    }
}

/// Something that changed, for `/v1/graph/events` and the reflex engine.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum GraphEvent {
    /// A node registered (`known`: it had registered before).
    NodeRegistered {
        /// The node.
        node: NodeId,
        /// Its name.
        name: String,
        /// Whether it was known.
        known: bool,
        /// Graph version.
        version: u64,
    },
    /// A node's stream opened or closed.
    NodeConnection {
        /// The node.
        node: NodeId,
        /// Open or closed.
        connected: bool,
        /// Graph version.
        version: u64,
    },
    /// A node's or GPU's health changed.
    Health {
        /// The node.
        node: NodeId,
        /// The GPU's index, or `None` for the node itself.
        gpu: Option<u32>,
        /// The previous state.
        from: HealthState,
        /// The new health.
        to: Health,
        /// Graph version.
        version: u64,
    },
    /// A node's telemetry arrived.
    Telemetry {
        /// The node.
        node: NodeId,
        /// The agent's sequence number.
        seq: u64,
        /// Graph version.
        version: u64,
    },
}
