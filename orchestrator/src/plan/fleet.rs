//! The planner's view of the fleet: what each GPU and host can take now.
//!
//! Built once per plan from a [`GraphSnapshot`]: usable memory is the live free memory
//! the GPU reports, minus a headroom, plus what preemptible instances hold on it, rounded
//! down to [`USABLE_QUANTUM`] so that GPUs in the same state compare equal (and plans do
//! not change with a few megabytes of noise). Down nodes and GPUs are left out; GPUs
//! without a sample yet are left out with a reason.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use skein_gpu_catalog::CardModel;

use super::fastmap::FastMap;
use super::score::BANDWIDTH_EFFICIENCY;
pub use crate::graph::MeasuredSpeed;
use crate::graph::{GraphSnapshot, HealthState, NodeView};

/// Usable memory is rounded down to a multiple of this (64 MiB).
pub const USABLE_QUANTUM: u64 = 64 << 20;

/// Memory bandwidth assumed for a GPU the catalog does not know, GB/s.
pub const UNKNOWN_GPU_BANDWIDTH_GBS: f64 = 900.0;

/// Host RAM bandwidth assumed for CPU inference and offloaded layers, GB/s (two or more
/// channels of DDR4/DDR5 as a server or workstation has): the ceiling however many cores
/// decode.
pub const HOST_BANDWIDTH_GBS: f64 = 60.0;

/// Weight bytes one physical core of llama.cpp streams through its quantized dot
/// products per second while decoding, GB/s: a CPU with few cores is bound by compute,
/// not by RAM. Measured: llama-server 11434 with 2 threads decodes SmolLM2-135M Q4_1
/// (98 MB read per token) at 74 tokens/s on a 2-core AMD EPYC VM (AVX2), 7.3 GB/s, 3.6
/// per core (docs/PERFORMANCE.md, "The built-in engine against llama.cpp").
pub const CPU_CORE_DECODE_GBS: f64 = 3.6;

/// Physical cores assumed for a node that did not report its CPU.
pub const UNKNOWN_CPU_CORES: u32 = 8;

/// Utilization from which a GPU that also runs processes Skein did not start counts as
/// shared: an engine there is modelled at the share of compute the others leave.
pub const BUSY_UTILIZATION_PCT: u32 = 10;
/// The least share of a busy GPU's speed an engine is modelled at.
pub const MIN_COMPUTE_SHARE: f64 = 0.1;
/// Network bandwidth assumed between nodes that did not report theirs, bits/s (10 Gb/s).
pub const UNKNOWN_NETWORK_BPS: u64 = 10_000_000_000;

/// Room kept free on every GPU beyond the planner's estimates: other processes' memory
/// moves, and the estimate's own margin covers only the engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Headroom {
    /// Thousandths of the GPU's total memory.
    pub permille: u64,
    /// At least this many bytes.
    pub minimum: u64,
}

/// 2 % of the card, at least 512 MiB.
pub const DEFAULT_HEADROOM: Headroom = Headroom {
    permille: 20,
    minimum: 512 << 20,
};

/// RAM kept free on a host for the system and the agent, bytes (4 GiB).
pub const DEFAULT_HOST_HEADROOM: u64 = 4 << 30;

impl Headroom {
    /// The headroom of a GPU with `total` bytes.
    pub fn for_total(&self, total: u64) -> u64 {
        (total / 1000).saturating_mul(self.permille).max(self.minimum)
    }
}

/// One GPU as the planner sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct PlanGpu {
    /// Index on its node.
    pub index: u32,
    /// Model name as NVML reports it.
    pub name: String,
    /// Total memory, bytes.
    pub total: u64,
    /// Usable memory before this plan reserves anything, bytes (a multiple of
    /// [`USABLE_QUANTUM`]).
    pub usable: u64,
    /// Of which held by instances this plan may preempt, bytes.
    pub preemptible: u64,
    /// Throttling or ECC errors: avoided unless nothing else fits.
    pub degraded: bool,
    /// Compute capability, when known.
    pub compute_capability: Option<(u32, u32)>,
    /// Modelled memory bandwidth, bytes/s: the card's, lowered by a reduced power limit.
    pub bandwidth: f64,
    /// Bit `j` set: an NVLink to the node's GPU at position `j` (positions, not indices).
    pub nvlink: u64,
    /// Why the GPU's speed is modelled below the card's, if it is.
    pub speed_note: Option<String>,
}

/// One node as the planner sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct PlanNode {
    /// Node name.
    pub name: String,
    /// Its usable GPUs, in index order (at most 64).
    pub gpus: Vec<PlanGpu>,
    /// Host RAM the planner may use, bytes (available minus the host headroom).
    pub host_free: u64,
    /// Network bandwidth, bits/s ([`UNKNOWN_NETWORK_BPS`] when not reported).
    pub network_bps: u64,
    /// Whether `network_bps` was reported.
    pub network_known: bool,
    /// Round trip to the orchestrator, ms, when measured.
    pub rtt_ms: Option<f64>,
    /// The host's modelled decode bandwidth for llama.cpp on its CPU, bytes/s: its
    /// physical cores × [`CPU_CORE_DECODE_GBS`], at most [`HOST_BANDWIDTH_GBS`] ×
    /// [`BANDWIDTH_EFFICIENCY`] (see [`host_decode_bandwidth`]).
    pub host_bandwidth: f64,
    /// Physical cores the host model used.
    pub cpu_cores: u32,
    /// Decode speeds measured on this node, tokens/s of one sequence, by engine (plan
    /// name) and variant, sorted: the planner uses them in place of its model.
    pub measured: Vec<MeasuredSpeed>,
}

/// The modelled decode bandwidth of llama.cpp on a host's CPU with `cores` physical
/// cores (0: unknown), bytes/s: decoding streams every weight once per token, limited by
/// the cores' dot products on a small host and by RAM on a large one.
pub fn host_decode_bandwidth(cores: u32) -> f64 {
    let cores = if cores == 0 { UNKNOWN_CPU_CORES } else { cores };
    (f64::from(cores) * CPU_CORE_DECODE_GBS).min(HOST_BANDWIDTH_GBS * BANDWIDTH_EFFICIENCY) * 1e9
}

/// A GPU left out of planning, with the reason.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Excluded {
    /// Node name.
    pub node: String,
    /// GPU index, or `None` for the whole node.
    pub gpu: Option<u32>,
    /// Why.
    pub reason: String,
}

/// The fleet at planning time.
#[derive(Debug, Clone, PartialEq)]
pub struct PlanFleet {
    /// Nodes with at least a host to plan on, sorted by name (shared: a planner keeps
    /// the nodes whose view did not change between plans, and the list itself).
    pub nodes: Arc<Vec<Arc<PlanNode>>>,
    /// What was left out and why.
    pub excluded: Vec<Excluded>,
}

/// Memory that instances the plan may preempt hold on a GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Held<'a> {
    /// Node name.
    pub node: &'a str,
    /// GPU index.
    pub gpu: u32,
    /// Bytes.
    pub bytes: u64,
}

impl PlanFleet {
    /// The fleet of `snapshot`, with `headroom` kept on every GPU and `host_headroom` on
    /// every host; `reclaim` lists memory that preempted instances would free.
    pub fn from_snapshot(
        snapshot: &GraphSnapshot,
        headroom: Headroom,
        host_headroom: u64,
        reclaim: &[Held<'_>],
    ) -> PlanFleet {
        let mut nodes = Vec::new();
        let mut excluded = Vec::new();
        let mut cards = FastMap::default();
        for node in &snapshot.nodes {
            if let Some(n) = node_view(node, headroom, host_headroom, reclaim, &mut cards, &mut excluded) {
                nodes.push(Arc::new(n));
            }
        }
        PlanFleet::new(nodes, excluded)
    }

    fn new(mut nodes: Vec<Arc<PlanNode>>, excluded: Vec<Excluded>) -> PlanFleet {
        if !nodes.is_sorted_by(|a, b| a.name <= b.name) {
            nodes.sort_by(|a, b| a.name.cmp(&b.name));
        }
        PlanFleet {
            nodes: Arc::new(nodes),
            excluded,
        }
    }

    /// Every GPU, with its node's position.
    pub fn gpus(&self) -> impl Iterator<Item = (usize, &PlanGpu)> {
        self.nodes
            .iter()
            .enumerate()
            .flat_map(|(n, node)| node.gpus.iter().map(move |g| (n, g)))
    }
}

/// The fleet view kept between plans: a node whose graph view is the one seen last
/// time (the graph shares the views of nodes that did not change) is not looked at
/// again, and a node rebuilt equal to its last view keeps that view, so that a
/// [`State`](super::options::State) synced to the fleet finds it unchanged. When the
/// snapshot lists the same nodes as last time, only the changed ones are touched: the
/// node list of the last fleet is updated in place once that fleet is dropped.
#[derive(Debug, Default)]
pub struct FleetCache {
    /// The headrooms the views were made with.
    settings: Option<(Headroom, u64)>,
    /// Per node of the last snapshot, in its order.
    nodes: Vec<CachedNode>,
    /// The last fleet made.
    last: Option<PlanFleet>,
}

#[derive(Debug)]
struct CachedNode {
    view: Arc<NodeView>,
    node: Option<Arc<PlanNode>>,
    excluded: Vec<Excluded>,
    /// Its position in the last fleet's nodes.
    position: Option<usize>,
}

impl FleetCache {
    /// The fleet of `snapshot`, as [`PlanFleet::from_snapshot`] makes it with nothing
    /// to reclaim.
    pub fn fleet(&mut self, snapshot: &GraphSnapshot, headroom: Headroom, host_headroom: u64) -> PlanFleet {
        if self.settings != Some((headroom, host_headroom)) {
            self.nodes.clear();
            self.last = None;
            self.settings = Some((headroom, host_headroom));
        }
        if let Some(fleet) = self.update(snapshot, headroom, host_headroom) {
            return fleet;
        }
        let old = std::mem::take(&mut self.nodes);
        // Old entries by name, made only if the node list moved.
        let mut by_name: Option<FastMap<&str, usize>> = None;
        let mut cards = FastMap::default();
        let mut nodes = Vec::with_capacity(snapshot.nodes.len());
        let mut excluded = Vec::new();
        for (i, view) in snapshot.nodes.iter().enumerate() {
            let name = view.inventory.name.as_str();
            let before = match old.get(i) {
                Some(c) if Arc::ptr_eq(&c.view, view) || c.view.inventory.name == name => Some(c),
                _ => by_name
                    .get_or_insert_with(|| {
                        old.iter()
                            .enumerate()
                            .map(|(j, c)| (c.view.inventory.name.as_str(), j))
                            .collect()
                    })
                    .get(name)
                    .map(|&j| &old[j]),
            };
            let (node, left_out) = match before {
                Some(c) if Arc::ptr_eq(&c.view, view) => (c.node.clone(), c.excluded.clone()),
                _ => Self::remake(view, before, headroom, host_headroom, &mut cards),
            };
            let position = node.as_ref().map(|n| {
                nodes.push(n.clone());
                nodes.len() - 1
            });
            excluded.extend(left_out.iter().cloned());
            self.nodes.push(CachedNode {
                view: view.clone(),
                node,
                excluded: left_out,
                position,
            });
        }
        let sorted = nodes.is_sorted_by(|a, b| a.name <= b.name);
        let fleet = PlanFleet::new(nodes, excluded);
        // Positions hold only when the fleet kept the snapshot's order.
        self.last = sorted.then(|| fleet.clone());
        fleet
    }

    /// The fleet of `snapshot` made from the last one by remaking only the nodes whose
    /// view changed; `None` when the snapshot lists other nodes, or a node came or went.
    fn update(&mut self, snapshot: &GraphSnapshot, headroom: Headroom, host_headroom: u64) -> Option<PlanFleet> {
        let last = self.last.as_mut()?;
        if snapshot.nodes.len() != self.nodes.len() {
            return None;
        }
        let changed: Vec<usize> = (0..snapshot.nodes.len())
            .filter(|&i| !Arc::ptr_eq(&self.nodes[i].view, &snapshot.nodes[i]))
            .collect();
        let mut cards = FastMap::default();
        let mut remade = Vec::with_capacity(changed.len());
        for &i in &changed {
            let (c, view) = (&self.nodes[i], &snapshot.nodes[i]);
            if c.view.inventory.name != view.inventory.name {
                return None;
            }
            let (node, excluded) = Self::remake(view, Some(c), headroom, host_headroom, &mut cards);
            if node.is_some() != c.position.is_some() {
                return None;
            }
            remade.push((i, node, excluded));
        }
        let mut excluded_moved = false;
        let nodes = Arc::make_mut(&mut last.nodes);
        for (i, node, excluded) in remade {
            let c = &mut self.nodes[i];
            if let (Some(p), Some(n)) = (c.position, &node) {
                nodes[p] = n.clone();
            }
            excluded_moved |= !(c.excluded.is_empty() && excluded.is_empty());
            c.view = snapshot.nodes[i].clone();
            c.node = node;
            c.excluded = excluded;
        }
        if excluded_moved {
            last.excluded = self.nodes.iter().flat_map(|c| c.excluded.iter().cloned()).collect();
        }
        Some(last.clone())
    }

    /// A node's view made again, keeping the last one when equal.
    fn remake(
        view: &NodeView,
        before: Option<&CachedNode>,
        headroom: Headroom,
        host_headroom: u64,
        cards: &mut FastMap<String, Option<&'static CardModel>>,
    ) -> (Option<Arc<PlanNode>>, Vec<Excluded>) {
        let mut left_out = Vec::new();
        let made = node_view(view, headroom, host_headroom, &[], cards, &mut left_out);
        let node = match (made, before.and_then(|c| c.node.as_ref())) {
            (Some(made), Some(last)) if **last == made => Some(last.clone()),
            (made, _) => made.map(Arc::new),
        };
        (node, left_out)
    }
}

/// The planner's view of one node, `None` when it is down or disconnected; what is left
/// out goes to `excluded`, and `cards` keeps catalog lookups (by loose name: a fleet has
/// few distinct names).
fn node_view(
    node: &NodeView,
    headroom: Headroom,
    host_headroom: u64,
    reclaim: &[Held<'_>],
    cards: &mut FastMap<String, Option<&'static CardModel>>,
    excluded: &mut Vec<Excluded>,
) -> Option<PlanNode> {
    if node.health.state.is_unavailable() || !node.connected {
        excluded.push(Excluded {
            node: node.inventory.name.clone(),
            gpu: None,
            reason: if node.health.state == HealthState::Left {
                format!("node left ({})", node.health.reasons.join("; "))
            } else if node.connected {
                "node is down (missed its telemetry)".to_owned()
            } else {
                "node is disconnected".to_owned()
            },
        });
        return None;
    }
    let name = node.inventory.name.clone();
    let mut gpus = Vec::with_capacity(node.gpus.len());
    let mut uuids = Vec::with_capacity(node.gpus.len());
    let mut peers = Vec::with_capacity(node.gpus.len());
    for view in &node.gpus {
        let facts = &view.facts;
        let exclude = |reason: String| Excluded {
            node: name.clone(),
            gpu: Some(facts.index),
            reason,
        };
        if view.health.state.is_unavailable() {
            excluded.push(exclude("GPU is down".to_owned()));
            continue;
        }
        // Drained (by a reflex, or its node is draining): nothing new goes there.
        if let Some(reason) = &view.drained {
            excluded.push(exclude(format!("drained: {reason}")));
            continue;
        }
        let Some(free) = view.memory_free() else {
            excluded.push(exclude("no telemetry from it yet".to_owned()));
            continue;
        };
        if gpus.len() == 64 {
            excluded.push(exclude("more than 64 GPUs on one node".to_owned()));
            continue;
        }
        let held: u64 = reclaim
            .iter()
            .filter(|h| h.node == name && h.gpu == facts.index)
            .map(|h| h.bytes)
            .sum();
        let free = free.saturating_add(held).min(facts.memory_total);
        let usable = free.saturating_sub(headroom.for_total(facts.memory_total)) / USABLE_QUANTUM * USABLE_QUANTUM;
        let card = match cards.get(&facts.name) {
            Some(card) => *card,
            None => *cards
                .entry(facts.name.clone())
                .or_insert_with(|| skein_gpu_catalog::lookup(&facts.name)),
        };
        let mut bandwidth = card.map_or(UNKNOWN_GPU_BANDWIDTH_GBS, |c| c.memory_bandwidth_gbs) * 1e9;
        let mut speed_note = card.is_none().then(|| {
            format!(
                "{} is not in the GPU catalog: {UNKNOWN_GPU_BANDWIDTH_GBS} GB/s assumed",
                facts.name
            )
        });
        if let (Some(card), Some(limit)) = (card, facts.power_limit_mw) {
            let fraction = f64::from(limit) / 1000.0 / card.power_limit_w;
            if fraction < 0.99 {
                // Memory-bound decoding slows less than the cap: clocks fall roughly with
                // the square root of the power.
                let factor = fraction.clamp(0.25, 1.0).sqrt();
                bandwidth *= factor;
                speed_note = Some(format!(
                    "power limit {} W of {} W: modelled at {:.0} % speed",
                    limit / 1000,
                    card.power_limit_w,
                    factor * 100.0
                ));
            }
        }
        // Compute shared with someone else's work: an engine gets what they leave.
        if let Some(sample) = &view.latest
            && sample.foreign_memory.is_some_and(|bytes| bytes > 0)
            && let Some(busy) = sample.utilization_pct.filter(|&u| u >= BUSY_UTILIZATION_PCT)
        {
            let share = (1.0 - f64::from(busy.min(100)) / 100.0).max(MIN_COMPUTE_SHARE);
            bandwidth *= share;
            let note = format!(
                "{busy} % busy with processes Skein did not start: modelled at {:.0} % speed",
                share * 100.0
            );
            speed_note = Some(match speed_note {
                Some(earlier) => format!("{earlier}; {note}"),
                None => note,
            });
        }
        uuids.push(facts.uuid.as_str());
        peers.push(&facts.nvlink_peers);
        gpus.push(PlanGpu {
            index: facts.index,
            name: facts.name.clone(),
            total: facts.memory_total,
            usable,
            preemptible: held,
            degraded: view.health.state == HealthState::Degraded,
            compute_capability: facts.compute_capability,
            bandwidth,
            nvlink: 0,
            speed_note,
        });
    }
    // UUIDs of one node share their prefix ("GPU-"), not their last byte: comparing
    // that first spares most full comparisons.
    let same = |a: &str, b: &str| a.len() == b.len() && a.as_bytes().last() == b.as_bytes().last() && a == b;
    for (gpu, peers) in gpus.iter_mut().zip(&peers) {
        for (j, uuid) in uuids.iter().enumerate() {
            if peers.iter().any(|peer| same(peer, uuid)) {
                gpu.nvlink |= 1 << j;
            }
        }
    }
    // Links are symmetric even when only one side reported them.
    for a in 0..gpus.len() {
        for b in 0..gpus.len() {
            if gpus[a].nvlink & (1 << b) != 0 {
                gpus[b].nvlink |= 1 << a;
            }
        }
    }
    let available = node
        .host
        .map_or(node.inventory.host.memory_total, |h| h.memory_available);
    let network_bps = node.inventory.host.network_bps;
    let facts = &node.inventory.host;
    let cores = if facts.physical_cores > 0 {
        facts.physical_cores
    } else {
        facts.logical_cores
    };
    Some(PlanNode {
        name,
        gpus,
        host_free: available.saturating_sub(host_headroom),
        network_bps: if network_bps == 0 {
            UNKNOWN_NETWORK_BPS
        } else {
            network_bps
        },
        network_known: network_bps != 0,
        rtt_ms: node.rtt_ms,
        host_bandwidth: host_decode_bandwidth(cores),
        cpu_cores: if cores == 0 { UNKNOWN_CPU_CORES } else { cores },
        measured: node.measured.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headroom_is_a_share_with_a_floor() {
        assert_eq!(DEFAULT_HEADROOM.for_total(80 << 30), (80u64 << 30) / 1000 * 20);
        assert_eq!(DEFAULT_HEADROOM.for_total(8 << 30), 512 << 20);
    }
}
