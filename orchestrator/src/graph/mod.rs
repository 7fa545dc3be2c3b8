//! The live hardware graph: every node and GPU the agents report, a window of recent
//! telemetry per GPU, derived health, and cheap immutable snapshots for the planner.
//!
//! # Design
//!
//! Membership (a map of nodes) changes rarely and sits behind a read-write lock; each
//! node has its own mutex over its mutable state (telemetry windows, last seen), so
//! ingestion from many agents contends only per node. After every change a node
//! publishes an immutable [`NodeView`] (latest samples and health, not the windows);
//! a [`GraphSnapshot`] is one `Arc` per node, so taking one costs microseconds and
//! holds no lock while the planner works. Windows are read on demand ([`HardwareGraph::window`]).
//!
//! The graph reads no clock and does no IO: callers pass the time ([`Millis`] on their
//! monotonic clock) and publish the [`GraphEvent`]s each call returns. Health rules live
//! in [`health`].

pub mod health;
pub mod model;

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use crate::base::lock;

pub use model::{
    GpuFacts, GpuSample, GpuView, GraphEvent, GraphSnapshot, Health, HealthState, HostFacts, HostSample, IndexedSample,
    Link, LinkKind, MeasuredSpeed, Millis, NodeId, NodeInventory, NodeView, TelemetryBatch,
};

/// How the graph judges its nodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GraphConfig {
    /// The telemetry interval agents are told to use.
    pub sample_interval_ms: u64,
    /// A node that sent nothing for this many intervals is down.
    pub missed_intervals_down: u32,
    /// Samples kept per GPU.
    pub window: usize,
}

impl Default for GraphConfig {
    fn default() -> Self {
        GraphConfig {
            sample_interval_ms: 1000,
            missed_intervals_down: 3,
            window: 120,
        }
    }
}

/// Why telemetry was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GraphError {
    /// The node id is not registered.
    #[error("node `{0}` is not registered; register first")]
    UnknownNode(NodeId),
    /// A sample for a GPU the node did not report at registration.
    #[error("node `{node}` has no GPU {index} (it registered {count})")]
    UnknownGpu {
        /// The node.
        node: NodeId,
        /// The index sent.
        index: u32,
        /// GPUs registered.
        count: usize,
    },
}

struct NodeState {
    inventory: Arc<NodeInventory>,
    /// Links between its GPUs, from the inventory (computed once per registration).
    links: Vec<Link>,
    windows: Vec<VecDeque<GpuSample>>,
    connected: bool,
    /// Generation of the current connection: a stream that ended after a newer one
    /// opened does not mark the node disconnected.
    connection: u64,
    last_seen_ms: Option<Millis>,
    /// When it registered or last connected: a node that never sends telemetry goes
    /// down counted from here.
    alive_since_ms: Millis,
    last_seq: Option<u64>,
    rtt_ms: Option<f64>,
    host: Option<HostSample>,
    down: bool,
    gpu_health: Vec<Health>,
    /// Why each GPU is drained (nothing new is placed on it), if it is.
    drained: Vec<Option<String>>,
    /// Why the whole node is draining (its agent will leave), if it is.
    draining: Option<String>,
    /// Why the node left (its agent said so), if it did: it is not swept down.
    left: Option<String>,
    /// Decode speeds measured on it, by engine, variant and placement: `(mean tokens/s,
    /// answers)`.
    measured: BTreeMap<(String, String, String), (f64, u64)>,
    /// What the view shows of them (published when a mean moves by [`SPEED_REPUBLISH`]).
    measured_shown: Vec<MeasuredSpeed>,
}

/// A measured decode speed is published again (a new view, a new graph version) when
/// its mean moves by this share of the published figure: answers arrive many times a
/// second, and every version makes planners look at the node again.
pub const SPEED_REPUBLISH: f64 = 0.1;
/// Answers whose speeds a measured mean averages; beyond, the mean moves as an
/// exponential average over about this many (so an engine that got faster shows it).
pub const SPEED_SAMPLES: u64 = 32;

struct NodeCell {
    id: NodeId,
    state: Mutex<NodeState>,
    view: Mutex<Arc<NodeView>>,
}

/// The live graph. Share it behind an `Arc`; every method takes `&self`.
pub struct HardwareGraph {
    config: GraphConfig,
    version: AtomicU64,
    next_id: AtomicU64,
    /// Every node, by name and by id, under one lock: a lookup never waits for a
    /// second lock while holding this one. Lock order: `index`, then a cell's `state`,
    /// then its `view` (docs/ARCHITECTURE.md, "Locks").
    index: RwLock<Index>,
}

/// The nodes, by name (sorted) and by id.
#[derive(Default)]
struct Index {
    by_name: BTreeMap<String, Arc<NodeCell>>,
    by_id: BTreeMap<NodeId, Arc<NodeCell>>,
}

/// What [`HardwareGraph::register`] decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Registration {
    /// The node's id.
    pub id: NodeId,
    /// Whether the name was registered before.
    pub known: bool,
}

impl HardwareGraph {
    /// An empty graph.
    pub fn new(config: GraphConfig) -> HardwareGraph {
        HardwareGraph {
            config,
            version: AtomicU64::new(0),
            next_id: AtomicU64::new(1),
            index: RwLock::new(Index::default()),
        }
    }

    /// Its configuration.
    pub fn config(&self) -> GraphConfig {
        self.config
    }

    fn bump(&self) -> u64 {
        self.version.fetch_add(1, Ordering::SeqCst) + 1
    }

    fn index(&self) -> std::sync::RwLockReadGuard<'_, Index> {
        // Every change of the index is one insert of both maps under the write lock.
        self.index.read().unwrap_or_else(|p| p.into_inner())
    }

    fn cell_by_id(&self, id: &NodeId) -> Result<Arc<NodeCell>, GraphError> {
        self.index()
            .by_id
            .get(id)
            .cloned()
            .ok_or_else(|| GraphError::UnknownNode(id.clone()))
    }

    /// Registers a node (or re-registers a known one, keeping its id). A re-registration
    /// replaces the inventory: a node whose GPUs changed starts fresh windows.
    pub fn register(&self, inventory: NodeInventory, now: Millis) -> (Registration, Vec<GraphEvent>) {
        let name = inventory.name.clone();
        let gpus = inventory.gpus.len();
        let inventory = Arc::new(inventory);
        let mut index = self.index.write().unwrap_or_else(|p| p.into_inner());
        let version = self.bump();
        let (cell, known) = match index.by_name.get(&name) {
            Some(cell) => {
                let mut state = lock(&cell.state);
                if state.inventory.gpus != inventory.gpus {
                    state.windows = vec![VecDeque::new(); gpus];
                    state.gpu_health = vec![Health::OK; gpus];
                    state.drained = vec![None; gpus];
                    state.links = links(&inventory.gpus);
                    // Other hardware: what was measured on the old is void.
                    state.measured.clear();
                    state.measured_shown.clear();
                }
                state.inventory = inventory;
                state.alive_since_ms = now;
                // A new registration is a new start (a new Slurm job on the node).
                state.draining = None;
                state.left = None;
                state.down = false;
                drop(state);
                (Arc::clone(cell), true)
            }
            None => {
                let id = NodeId(format!("node-{}", self.next_id.fetch_add(1, Ordering::SeqCst)));
                let state = NodeState {
                    links: links(&inventory.gpus),
                    inventory,
                    windows: vec![VecDeque::new(); gpus],
                    connected: false,
                    connection: 0,
                    last_seen_ms: None,
                    alive_since_ms: now,
                    last_seq: None,
                    rtt_ms: None,
                    host: None,
                    down: false,
                    gpu_health: vec![Health::OK; gpus],
                    drained: vec![None; gpus],
                    draining: None,
                    left: None,
                    measured: BTreeMap::new(),
                    measured_shown: Vec::new(),
                };
                let view = Arc::new(build_view(&id, &state, version));
                let cell = Arc::new(NodeCell {
                    id: id.clone(),
                    state: Mutex::new(state),
                    view: Mutex::new(view),
                });
                index.by_name.insert(name.clone(), Arc::clone(&cell));
                index.by_id.insert(id, Arc::clone(&cell));
                (cell, false)
            }
        };
        drop(index);
        self.publish(&cell, version);
        let registration = Registration {
            id: cell.id.clone(),
            known,
        };
        let event = GraphEvent::NodeRegistered {
            node: cell.id.clone(),
            name,
            known,
            version,
        };
        (registration, vec![event])
    }

    fn publish(&self, cell: &NodeCell, version: u64) {
        let state = lock(&cell.state);
        replace_view(cell, &state, version);
    }

    /// A node's stream opened; returns the connection's generation for
    /// [`disconnected`](Self::disconnected).
    pub fn connected(&self, id: &NodeId, now: Millis) -> Result<(u64, Vec<GraphEvent>), GraphError> {
        let cell = self.cell_by_id(id)?;
        let version = self.bump();
        let mut events = Vec::new();
        let generation = {
            let mut state = lock(&cell.state);
            state.connection += 1;
            state.connected = true;
            state.alive_since_ms = now;
            state.connection
        };
        events.push(GraphEvent::NodeConnection {
            node: id.clone(),
            connected: true,
            version,
        });
        self.publish(&cell, version);
        Ok((generation, events))
    }

    /// A node's stream of `generation` closed. Health follows from missed telemetry
    /// ([`sweep`](Self::sweep)), not from the closed stream alone: an agent that
    /// reconnects at once never goes down.
    pub fn disconnected(&self, id: &NodeId, generation: u64) -> Vec<GraphEvent> {
        let Ok(cell) = self.cell_by_id(id) else {
            return Vec::new();
        };
        {
            let mut state = lock(&cell.state);
            if state.connection != generation || !state.connected {
                return Vec::new();
            }
            state.connected = false;
        }
        let version = self.bump();
        self.publish(&cell, version);
        vec![GraphEvent::NodeConnection {
            node: id.clone(),
            connected: false,
            version,
        }]
    }

    /// Takes a node's telemetry: appends each GPU's sample to its window, recomputes
    /// health, and publishes the node's new view.
    ///
    /// Errors: [`GraphError::UnknownNode`], and [`GraphError::UnknownGpu`] for a
    /// sample of a GPU the node did not register (the whole batch is refused).
    pub fn ingest(&self, id: &NodeId, batch: TelemetryBatch, now: Millis) -> Result<Vec<GraphEvent>, GraphError> {
        let cell = self.cell_by_id(id)?;
        let version = self.bump();
        let seq = batch.seq;
        let mut events = Vec::new();
        {
            let mut state = lock(&cell.state);
            let count = state.windows.len();
            if let Some(bad) = batch.gpus.iter().find(|s| s.index as usize >= count) {
                return Err(GraphError::UnknownGpu {
                    node: id.clone(),
                    index: bad.index,
                    count,
                });
            }
            for IndexedSample { index, sample } in batch.gpus {
                let window = &mut state.windows[index as usize];
                if window.len() == self.config.window {
                    window.pop_front();
                }
                window.push_back(GpuSample {
                    received_ms: now,
                    ..sample
                });
            }
            state.last_seen_ms = Some(now);
            state.last_seq = Some(batch.seq);
            if batch.host.is_some() {
                state.host = batch.host;
            }
            if state.down {
                state.down = false;
                events.push(GraphEvent::Health {
                    node: id.clone(),
                    gpu: None,
                    from: HealthState::Down,
                    to: Health::OK,
                    version,
                });
            }
            for index in 0..count {
                let health = health::gpu_health(&state.inventory.gpus[index], &state.windows[index]);
                if health != state.gpu_health[index] {
                    if health.state != state.gpu_health[index].state {
                        events.push(GraphEvent::Health {
                            node: id.clone(),
                            gpu: Some(index as u32),
                            from: state.gpu_health[index].state,
                            to: health.clone(),
                            version,
                        });
                    }
                    state.gpu_health[index] = health;
                }
            }
            replace_view(&cell, &state, version);
        }
        events.push(GraphEvent::Telemetry {
            node: id.clone(),
            seq,
            version,
        });
        Ok(events)
    }

    /// Records a measured round trip to a node's agent.
    pub fn record_rtt(&self, id: &NodeId, rtt_ms: f64) -> Result<(), GraphError> {
        let cell = self.cell_by_id(id)?;
        lock(&cell.state).rtt_ms = Some(rtt_ms);
        let version = self.bump();
        self.publish(&cell, version);
        Ok(())
    }

    /// Records the decode speed of one answer of `engine` serving `variant` placed as
    /// `placement` (`plan::speed_placement`) on the node named `node`, tokens/s of its
    /// sequence: the planner uses the mean in place of its model (docs/placement.md,
    /// "Measured speeds"). A new view is published when the figure is new or its mean
    /// moved by [`SPEED_REPUBLISH`]. Returns whether it was.
    ///
    /// Errors: no node has that name; a speed that is not a positive number is ignored.
    pub fn record_speed(
        &self,
        node: &str,
        engine: &str,
        variant: &str,
        placement: &str,
        tokens_per_s: f64,
    ) -> Result<bool, GraphError> {
        if !tokens_per_s.is_finite() || tokens_per_s <= 0.0 {
            return Ok(false);
        }
        let cell = self
            .index()
            .by_name
            .get(node)
            .cloned()
            .ok_or_else(|| GraphError::UnknownNode(NodeId(node.to_owned())))?;
        let changed = {
            let mut state = lock(&cell.state);
            let key = (engine.to_owned(), variant.to_owned(), placement.to_owned());
            let (mean, samples) = state.measured.entry(key).or_insert((0.0, 0));
            *samples += 1;
            let weight = 1.0 / (*samples).min(SPEED_SAMPLES) as f64;
            *mean += (tokens_per_s - *mean) * weight;
            let (mean, samples) = (*mean, *samples);
            let same = |m: &&mut MeasuredSpeed| m.engine == engine && m.variant == variant && m.placement == placement;
            let shown = state.measured_shown.iter_mut().find(same).map(|m| m.tokens_per_s);
            let changed = shown.is_none_or(|shown| (mean - shown).abs() > shown * SPEED_REPUBLISH);
            if changed {
                state.measured_shown = state
                    .measured
                    .iter()
                    .map(|((engine, variant, placement), &(mean, samples))| MeasuredSpeed {
                        engine: engine.clone(),
                        variant: variant.clone(),
                        placement: placement.clone(),
                        tokens_per_s: mean,
                        samples,
                    })
                    .collect();
            } else if let Some(m) = state.measured_shown.iter_mut().find(same) {
                // The count moves without a new view; the next one shows it.
                m.samples = samples;
            }
            changed
        };
        if changed {
            let version = self.bump();
            self.publish(&cell, version);
        }
        Ok(changed)
    }

    /// Marks down every node that sent no telemetry for
    /// [`GraphConfig::missed_intervals_down`] intervals before `now` (counted from its
    /// last telemetry, or from when it registered or connected). Call it at least twice
    /// per interval.
    pub fn sweep(&self, now: Millis) -> Vec<GraphEvent> {
        let limit = self
            .config
            .sample_interval_ms
            .saturating_mul(u64::from(self.config.missed_intervals_down));
        let cells: Vec<Arc<NodeCell>> = self.index().by_name.values().cloned().collect();
        let mut events = Vec::new();
        for cell in cells {
            let went_down = {
                let mut state = lock(&cell.state);
                let since = state
                    .last_seen_ms
                    .unwrap_or(state.alive_since_ms)
                    .max(state.alive_since_ms);
                if !state.down && state.left.is_none() && now.saturating_sub(since) > limit {
                    state.down = true;
                    true
                } else {
                    false
                }
            };
            if went_down {
                let version = self.bump();
                self.publish(&cell, version);
                let missed = self.config.missed_intervals_down;
                events.push(GraphEvent::Health {
                    node: cell.id.clone(),
                    gpu: None,
                    from: HealthState::Ok,
                    to: Health {
                        state: HealthState::Down,
                        reasons: vec![format!("no telemetry for {missed} intervals")],
                    },
                    version,
                });
            }
        }
        events
    }

    /// The graph now: one immutable view per node, sorted by name.
    pub fn snapshot(&self) -> GraphSnapshot {
        let index = self.index();
        let views: Vec<Arc<NodeView>> = index
            .by_name
            .values()
            .map(|cell| Arc::clone(&lock(&cell.view)))
            .collect();
        drop(index);
        GraphSnapshot {
            version: views.iter().map(|v| v.version).max().unwrap_or(0),
            sample_interval_ms: self.config.sample_interval_ms,
            nodes: views,
        }
    }

    /// One node's view now.
    pub fn node(&self, id: &NodeId) -> Option<Arc<NodeView>> {
        let cell = self.cell_by_id(id).ok()?;
        Some(Arc::clone(&lock(&cell.view)))
    }

    /// The current version: it changes with every registration, connection, sample and
    /// health change.
    pub fn version(&self) -> u64 {
        self.version.load(Ordering::SeqCst)
    }

    /// A GPU's recent samples, oldest first.
    pub fn window(&self, id: &NodeId, gpu: u32) -> Result<Vec<GpuSample>, GraphError> {
        let cell = self.cell_by_id(id)?;
        let state = lock(&cell.state);
        let count = state.windows.len();
        let window = state.windows.get(gpu as usize).ok_or(GraphError::UnknownGpu {
            node: id.clone(),
            index: gpu,
            count,
        })?;
        Ok(window.iter().copied().collect())
    }

    /// Drains GPU `gpu` of node `id` (`reason`: why; nothing new is placed on it) or,
    /// with `None`, lifts the drain. Returns whether anything changed.
    ///
    /// Errors: [`GraphError::UnknownNode`], [`GraphError::UnknownGpu`].
    pub fn set_drained(&self, id: &NodeId, gpu: u32, reason: Option<String>) -> Result<bool, GraphError> {
        let cell = self.cell_by_id(id)?;
        {
            let mut state = lock(&cell.state);
            let count = state.drained.len();
            let slot = state.drained.get_mut(gpu as usize).ok_or(GraphError::UnknownGpu {
                node: id.clone(),
                index: gpu,
                count,
            })?;
            if *slot == reason {
                return Ok(false);
            }
            *slot = reason;
        }
        let version = self.bump();
        self.publish(&cell, version);
        Ok(true)
    }

    /// Node `id` will leave soon (`reason`: why, and when): nothing new is placed on any
    /// of its GPUs until it registers again. Returns whether anything changed.
    ///
    /// Errors: [`GraphError::UnknownNode`].
    pub fn drain_node(&self, id: &NodeId, reason: String) -> Result<bool, GraphError> {
        let cell = self.cell_by_id(id)?;
        {
            let mut state = lock(&cell.state);
            if state.draining.as_ref() == Some(&reason) {
                return Ok(false);
            }
            state.draining = Some(reason);
        }
        let version = self.bump();
        self.publish(&cell, version);
        Ok(true)
    }

    /// Node `id` left on purpose (`reason`: why): its health becomes
    /// [`HealthState::Left`] (not down: nothing failed) until it registers again, and
    /// the sweep leaves it alone. Returns the health event.
    ///
    /// Errors: [`GraphError::UnknownNode`].
    pub fn leave(&self, id: &NodeId, reason: String) -> Result<Vec<GraphEvent>, GraphError> {
        let cell = self.cell_by_id(id)?;
        let from = lock(&cell.view).health.state;
        {
            let mut state = lock(&cell.state);
            if state.left.is_some() {
                return Ok(Vec::new());
            }
            state.left = Some(reason.clone());
        }
        let version = self.bump();
        self.publish(&cell, version);
        Ok(vec![GraphEvent::Health {
            node: id.clone(),
            gpu: None,
            from,
            to: Health {
                state: HealthState::Left,
                reasons: vec![reason],
            },
            version,
        }])
    }

    /// The node id registered under `name`.
    pub fn id_of(&self, name: &str) -> Option<NodeId> {
        self.index().by_name.get(name).map(|cell| cell.id.clone())
    }

    /// Forgets node `name` (an admin removed it): it leaves the graph and its stream's
    /// telemetry is refused from now on; a later registration of the name makes a new
    /// node with a new id. Returns its id, if it was there.
    pub fn remove(&self, name: &str) -> Option<NodeId> {
        let mut index = self.index.write().unwrap_or_else(|p| p.into_inner());
        let cell = index.by_name.remove(name)?;
        index.by_id.remove(&cell.id);
        drop(index);
        self.bump();
        Some(cell.id.clone())
    }
}

/// Publishes the view of `state` (held by the caller: lock order `state`, then `view`), so
/// a slower publisher never replaces a newer view with an older one; its version never
/// goes back (versions are taken before the state lock, so they may arrive out of order).
fn replace_view(cell: &NodeCell, state: &NodeState, version: u64) {
    let mut view = lock(&cell.view);
    let version = version.max(view.version);
    *view = Arc::new(build_view(&cell.id, state, version));
}

fn build_view(id: &NodeId, state: &NodeState, version: u64) -> NodeView {
    let down = state.down;
    let left = state.left.as_ref();
    let gpus: Vec<GpuView> = state
        .inventory
        .gpus
        .iter()
        .zip(&state.windows)
        .zip(&state.gpu_health)
        .zip(&state.drained)
        .map(|(((facts, window), health), drained)| GpuView {
            facts: facts.clone(),
            latest: window.back().copied(),
            drained: drained.clone().or_else(|| state.draining.clone()),
            pcie_gbytes_per_s: pcie_gbs(facts),
            health: if left.is_some() {
                Health {
                    state: HealthState::Left,
                    reasons: vec!["its node left".to_owned()],
                }
            } else if down {
                Health {
                    state: HealthState::Down,
                    reasons: vec!["its node is down".to_owned()],
                }
            } else {
                health.clone()
            },
        })
        .collect();
    let health = if let Some(reason) = left {
        Health {
            state: HealthState::Left,
            reasons: vec![reason.clone()],
        }
    } else if down {
        Health {
            state: HealthState::Down,
            reasons: vec!["no telemetry for several intervals".to_owned()],
        }
    } else {
        let degraded: Vec<String> = gpus
            .iter()
            .filter(|g| g.health.state == HealthState::Degraded)
            .map(|g| format!("GPU {}: {}", g.facts.index, g.health.reasons.join("; ")))
            .collect();
        if degraded.is_empty() {
            Health::OK
        } else {
            Health {
                state: HealthState::Degraded,
                reasons: degraded,
            }
        }
    };
    NodeView {
        id: id.clone(),
        inventory: Arc::clone(&state.inventory),
        connected: state.connected,
        health,
        draining: state.draining.clone(),
        last_seen_ms: state.last_seen_ms,
        last_seq: state.last_seq,
        rtt_ms: state.rtt_ms,
        host: state.host,
        links: state.links.clone(),
        gpus,
        measured: state.measured_shown.clone(),
        version,
    }
}

/// One direction of a GPU's PCIe link, GB/s, when its generation and width are known.
fn pcie_gbs(gpu: &GpuFacts) -> Option<f64> {
    gpu.pcie
        .and_then(|(generation, width)| skein_gpu_catalog::pcie_gbs(generation, width))
}

/// Every pair of GPUs of a node: NVLink where either lists the other as a peer, PCIe
/// otherwise.
fn links(gpus: &[GpuFacts]) -> Vec<Link> {
    let mut links = Vec::new();
    for (i, a) in gpus.iter().enumerate() {
        for b in &gpus[i + 1..] {
            let nvlink = a.nvlink_peers.contains(&b.uuid) || b.nvlink_peers.contains(&a.uuid);
            let (kind, gbytes_per_s) = if nvlink {
                let of = |g: &GpuFacts| g.compute_capability.and_then(skein_gpu_catalog::nvlink_gbs);
                (LinkKind::Nvlink, of(a).zip(of(b)).map(|(x, y)| x.min(y)))
            } else {
                (LinkKind::Pcie, pcie_gbs(a).zip(pcie_gbs(b)).map(|(x, y)| x.min(y)))
            };
            links.push(Link {
                a: a.index,
                b: b.index,
                kind,
                gbytes_per_s,
            });
        }
    }
    links
}
