//! The reflexes of running workflows, live: the [`Engine`] fed with the hardware graph's
//! telemetry and the agents' serving figures, and its decisions carried out.
//!
//! One task owns the engine. It adds a run's reflexes when the run starts and removes
//! them when it ends, resolves each reflex's scope to GPUs and nodes (again whenever
//! instances change: an agent's scope follows its replicas), and feeds it:
//!
//! - each node's telemetry batch, as it arrives, to the reflexes watching its GPUs;
//! - a node going down or coming back;
//! - every [`TICK`], the serving figures of the agents and instances reflexes read, and
//!   the passing of time (a `for` that runs out).
//!
//! Decisions go to the run's actor, one task per run, which takes the actions in order
//! and records each decision with their outcomes in the event log. What a reflex added
//! (replicas, changed shares, drains) is undone when it is released, and when its run
//! ends.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use skein_dsl::ir::{Action, DecayTarget, MigrateTarget, Reflex, Reroute, Scope, SessionCount};
use tokio::sync::{broadcast, mpsc};

use super::{
    ActionRecord, Decision, DecisionKind, Engine, EventKind, EventRecord, Events, GpuKey, GpuReading, Outcome,
};
use crate::auth::Principal;
use crate::base::{UnixMs, lock, unix_ms};
use crate::graph::{GpuSample, GraphEvent, GraphSnapshot, HardwareGraph, NodeId, NodeView};
use crate::instances::{InstanceView, Instances};
use crate::run::executor::{Executor, Pin};
use crate::session::{MoveTo, Sessions};

/// How often the agents' serving figures are read and open windows re-evaluated.
pub const TICK: Duration = Duration::from_millis(250);

/// The live reflexes of a server. Cheap to clone.
#[derive(Clone)]
pub struct Reflexes {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Reflexes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reflexes").finish_non_exhaustive()
    }
}

struct Inner {
    engine: Mutex<Engine>,
    graph: Arc<HardwareGraph>,
    instances: Arc<Instances>,
    executor: Executor,
    sessions: Sessions,
    events: Events,
    /// The runs whose reflexes are live.
    runs: Mutex<HashMap<String, Watched>>,
    /// Runs being driven that declare no reflex (not read again while they run).
    without: Mutex<HashSet<String>>,
    /// Each watched GPU's sample before the latest (for the ECC error rate).
    previous: Mutex<HashMap<GpuKey, GpuSample>>,
}

/// A run whose reflexes are live.
struct Watched {
    /// Its reflexes: engine id and declaration.
    reflexes: Vec<(super::ReflexId, Reflex)>,
    /// Its agents served by a remote endpoint (their requests count under
    /// [`crate::load::endpoint_key`]).
    endpoints: HashSet<String>,
    /// Its actor.
    jobs: mpsc::UnboundedSender<Job>,
}

/// Work for a run's actor.
enum Job {
    /// Carry out a decision and record it (with when its GPU sample was taken, if a
    /// sample decided it).
    Decide(Decision, Option<i64>),
    /// Record an event that needs no action (a scope that cannot be resolved).
    Record(EventRecord),
    /// The run ended: undo what its reflexes added, then stop.
    End,
}

/// The principal reflexes act as: they move any session bound where they act.
fn reflex_principal() -> Principal {
    Principal {
        user: "skein-reflexes".to_owned(),
        admin: true,
    }
}

impl Reflexes {
    /// Starts the reflexes of every running workflow, fed by `graph_events`.
    pub fn start(
        graph: Arc<HardwareGraph>,
        graph_events: &broadcast::Sender<GraphEvent>,
        instances: Arc<Instances>,
        executor: Executor,
        sessions: Sessions,
        events: Events,
    ) -> (Reflexes, tokio::task::JoinHandle<()>) {
        let reflexes = Reflexes {
            inner: Arc::new(Inner {
                engine: Mutex::default(),
                graph,
                instances,
                executor,
                sessions,
                events,
                runs: Mutex::default(),
                without: Mutex::default(),
                previous: Mutex::default(),
            }),
        };
        let receiver = graph_events.subscribe();
        let task = tokio::spawn(reflexes.clone().watch(receiver));
        (reflexes, task)
    }

    /// The runs whose reflexes are live.
    pub fn runs(&self) -> Vec<String> {
        let mut runs: Vec<String> = lock(&self.inner.runs).keys().cloned().collect();
        runs.sort();
        runs
    }

    async fn watch(self, mut graph_events: broadcast::Receiver<GraphEvent>) {
        let mut runs = self.inner.executor.subscribe();
        let mut instances = self.inner.instances.subscribe();
        let mut tick = tokio::time::interval(TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        self.reconcile();
        loop {
            tokio::select! {
                event = graph_events.recv() => match event {
                    Ok(GraphEvent::Telemetry { node, .. }) => self.telemetry(&node),
                    Ok(GraphEvent::Health { node, gpu: None, to, .. }) => {
                        let decisions = lock(&self.inner.engine).node_state(&node.0, to.state.is_unavailable(), unix_ms().0);
                        self.dispatch(decisions, None);
                    }
                    Ok(GraphEvent::NodeRegistered { .. }) => self.rescope(),
                    Ok(_) => {}
                    Err(broadcast::error::RecvError::Lagged(missed)) => {
                        tracing::warn!(missed, "reflexes fell behind the telemetry; the next samples catch up");
                    }
                    Err(broadcast::error::RecvError::Closed) => return,
                },
                _ = runs.changed() => self.reconcile(),
                _ = instances.changed() => {
                    self.reconcile();
                    self.rescope();
                }
                _ = tick.tick() => self.tick(),
            }
        }
    }

    /// Adds the reflexes of runs that started and removes those of runs that ended.
    fn reconcile(&self) {
        let active = self.inner.executor.active_runs();
        let ended: Vec<String> = lock(&self.inner.runs)
            .keys()
            .filter(|id| !active.contains(id))
            .cloned()
            .collect();
        for id in ended {
            if let Some(watched) = lock(&self.inner.runs).remove(&id) {
                lock(&self.inner.engine).remove_run(&id);
                let _ = watched.jobs.send(Job::End);
            }
        }
        lock(&self.inner.without).retain(|id| active.contains(id));
        let mut added = false;
        for id in active {
            if lock(&self.inner.runs).contains_key(&id) || lock(&self.inner.without).contains(&id) {
                continue;
            }
            let Ok(Some(run)) = self.inner.executor.get(&id) else {
                continue;
            };
            if run.workflow.reflexes.is_empty() {
                lock(&self.inner.without).insert(id);
                continue;
            }
            if run.state.is_final() {
                continue;
            }
            let (jobs, queue) = mpsc::unbounded_channel();
            let mut reflexes = Vec::new();
            {
                let mut engine = lock(&self.inner.engine);
                for reflex in &run.workflow.reflexes {
                    match engine.add(&id, reflex) {
                        Ok(reflex_id) => reflexes.push((reflex_id, reflex.clone())),
                        Err(error) => {
                            let _ = jobs.send(Job::Record(self.error_event(
                                &id,
                                &run.owner,
                                &reflex.name,
                                error.to_string(),
                            )));
                        }
                    }
                }
            }
            tracing::info!(run = %id, reflexes = reflexes.len(), "reflexes live");
            let actor = Actor {
                inner: Arc::clone(&self.inner),
                run: id.clone(),
                owner: run.owner.clone(),
                applied: BTreeMap::new(),
            };
            tokio::spawn(actor.serve(queue));
            let endpoints = run
                .workflow
                .agents
                .iter()
                .filter(|(_, agent)| matches!(agent.backend, skein_dsl::ir::Backend::Endpoint(_)))
                .map(|(name, _)| name.clone())
                .collect();
            lock(&self.inner.runs).insert(
                id,
                Watched {
                    reflexes,
                    endpoints,
                    jobs,
                },
            );
            added = true;
        }
        if added {
            self.rescope();
        }
    }

    fn error_event(&self, run: &str, owner: &str, reflex: &str, error: String) -> EventRecord {
        EventRecord {
            id: String::new(),
            at: unix_ms(),
            sampled_at: None,
            run: run.to_owned(),
            owner: owner.to_owned(),
            reflex: reflex.to_owned(),
            kind: EventKind::Error,
            values: BTreeMap::new(),
            actions: Vec::new(),
            error: Some(error),
            dry_run: false,
        }
    }

    /// Resolves every live reflex's scope again.
    fn rescope(&self) {
        let runs = lock(&self.inner.runs);
        let mut engine = lock(&self.inner.engine);
        let snapshot = self.inner.graph.snapshot();
        for (run, watched) in runs.iter() {
            for (id, reflex) in &watched.reflexes {
                let (gpus, nodes) = match &reflex.scope {
                    scope @ (Scope::Node(_) | Scope::Zone(_)) => {
                        let nodes = scope_nodes(&snapshot, scope);
                        (
                            nodes
                                .iter()
                                .flat_map(|n| n.gpus.iter().map(|g| GpuKey::new(n.id.0.clone(), g.facts.index)))
                                .collect(),
                            nodes.iter().map(|n| n.id.0.clone()).collect(),
                        )
                    }
                    scope => {
                        let mut gpus = Vec::new();
                        let mut nodes = Vec::new();
                        for view in scope_instances(&self.inner.instances, &self.inner.graph, run, scope) {
                            gpus.extend(view.gpus.iter().map(|&g| GpuKey::new(view.node.clone(), g)));
                            nodes.push(view.node.clone());
                        }
                        gpus.sort();
                        gpus.dedup();
                        nodes.sort();
                        nodes.dedup();
                        (gpus, nodes)
                    }
                };
                engine.set_scope(*id, gpus, nodes);
            }
        }
    }

    /// A node's telemetry arrived: the reflexes watching its GPUs see their readings.
    fn telemetry(&self, node: &NodeId) {
        let now = unix_ms().0;
        let (decisions, sampled) = {
            let mut engine = lock(&self.inner.engine);
            let watched: Vec<u32> = match self.inner.graph.node(node) {
                Some(view) => view
                    .gpus
                    .iter()
                    .map(|g| g.facts.index)
                    .filter(|&i| engine.watches(&GpuKey::new(node.0.clone(), i)))
                    .collect(),
                None => return,
            };
            if watched.is_empty() {
                return;
            }
            let Some(view) = self.inner.graph.node(node) else {
                return;
            };
            let mut previous = lock(&self.inner.previous);
            let sampled = view.gpus.iter().filter_map(|g| g.latest.map(|s| s.unix_ms)).max();
            let readings: Vec<(GpuKey, GpuReading)> = view
                .gpus
                .iter()
                .filter(|g| watched.contains(&g.facts.index))
                .filter_map(|g| {
                    let sample = g.latest?;
                    let key = GpuKey::new(node.0.clone(), g.facts.index);
                    let before = previous.insert(key.clone(), sample);
                    // The same sample again (another event of the same batch): no new reading.
                    if before == Some(sample) {
                        return None;
                    }
                    Some((key, GpuReading::of(&g.facts, &sample, before.as_ref())))
                })
                .collect();
            (engine.gpu_batch(&readings, now), sampled)
        };
        self.dispatch(decisions, sampled);
    }

    /// The serving figures of every agent and instance a reflex reads, and the time.
    fn tick(&self) {
        let now = Instant::now();
        let now_ms = unix_ms().0;
        let subjects: Vec<(String, String)> = lock(&self.inner.engine).subjects().cloned().collect();
        let mut decisions = Vec::new();
        for (run, subject) in subjects {
            let scope = match subject.strip_prefix('@') {
                Some(instance) => Scope::Instance(instance.to_owned()),
                None => Scope::Agent(subject.clone()),
            };
            let endpoint = lock(&self.inner.runs)
                .get(&run)
                .is_some_and(|w| w.endpoints.contains(&subject));
            // An endpoint agent's requests count under its key; a model agent's on its
            // instances, and with none up nothing is measured (absent, not 0).
            let names: Vec<String> = if endpoint {
                vec![crate::load::endpoint_key(&run, &subject)]
            } else {
                scope_instances(&self.inner.instances, &self.inner.graph, &run, &scope)
                    .into_iter()
                    .map(|v| v.name)
                    .collect()
            };
            let reading = (!names.is_empty()).then(|| {
                self.inner
                    .instances
                    .load()
                    .reading(names.iter().map(String::as_str), now)
            });
            decisions.extend(lock(&self.inner.engine).agent_sample(&run, &subject, reading, now_ms));
        }
        decisions.extend(lock(&self.inner.engine).tick(now_ms));
        self.dispatch(decisions, None);
    }

    fn dispatch(&self, decisions: Vec<Decision>, sampled_at: Option<i64>) {
        if decisions.is_empty() {
            return;
        }
        let runs = lock(&self.inner.runs);
        for decision in decisions {
            tracing::info!(run = %decision.run, reflex = %decision.reflex, kind = ?decision.kind, values = ?decision.values, "reflex decision");
            if let Some(watched) = runs.get(&decision.run) {
                let _ = watched.jobs.send(Job::Decide(decision, sampled_at));
            }
        }
    }
}

/// The live instances a scope of `run` holds: an agent's replicas, one instance (by its
/// workflow name, `writer+editor`, or its full name), or every instance on the scope's
/// nodes.
fn scope_instances(instances: &Instances, graph: &HardwareGraph, run: &str, scope: &Scope) -> Vec<InstanceView> {
    match scope {
        Scope::Agent(agent) => instances
            .filter(|v| v.run.as_deref() == Some(run) && v.agents.iter().any(|a| a == agent) && !v.state.is_gone()),
        Scope::Instance(name) => {
            let full = format!("{run}-{}", name.replace('+', "-"));
            instances
                .filter(|v| v.run.as_deref() == Some(run) && (v.name == full || v.name == *name) && !v.state.is_gone())
        }
        Scope::Node(_) | Scope::Zone(_) => {
            let snapshot = graph.snapshot();
            let nodes: Vec<&str> = scope_nodes(&snapshot, scope)
                .iter()
                .map(|n| n.inventory.name.as_str())
                .collect();
            instances.filter(|v| nodes.contains(&v.node_name.as_str()) && !v.state.is_gone())
        }
    }
}

/// The nodes a node or zone scope names (a zone: the nodes labelled `zone=NAME`, as
/// they join); none for agent and instance scopes.
fn scope_nodes<'a>(snapshot: &'a GraphSnapshot, scope: &'a Scope) -> Vec<&'a NodeView> {
    match scope {
        Scope::Node(name) => snapshot
            .nodes
            .iter()
            .filter(|n| n.inventory.name == *name)
            .map(AsRef::as_ref)
            .collect(),
        Scope::Zone(zone) => snapshot.nodes_labelled("zone", zone).collect(),
        Scope::Agent(_) | Scope::Instance(_) => Vec::new(),
    }
}

/// What a fired reflex changed, to be undone when it is released.
#[derive(Default)]
struct Applied {
    /// Replicas it added.
    clones: Vec<String>,
    /// Shares it changed, with what they were.
    shares: BTreeMap<String, f64>,
    /// GPUs it drained.
    drained: Vec<GpuKey>,
}

/// Carries out one run's decisions, in order.
struct Actor {
    inner: Arc<Inner>,
    run: String,
    owner: String,
    /// By reflex name.
    applied: BTreeMap<String, Applied>,
}

/// An action's outcome and what it did.
type Done = (Outcome, String);

impl Actor {
    async fn serve(mut self, mut jobs: mpsc::UnboundedReceiver<Job>) {
        while let Some(job) = jobs.recv().await {
            match job {
                Job::Decide(decision, sampled_at) => {
                    let mut event = self.decide(decision).await;
                    event.sampled_at = sampled_at.map(UnixMs);
                    self.record(event).await;
                }
                Job::Record(event) => self.record(event).await,
                Job::End => {
                    let reflexes: Vec<String> = self.applied.keys().cloned().collect();
                    for reflex in reflexes {
                        let undone = self.undo(&reflex, &[]).await;
                        for record in undone {
                            tracing::info!(run = %self.run, %reflex, detail = %record.detail, "the run ended: undone");
                        }
                    }
                    return;
                }
            }
        }
    }

    async fn record(&self, event: EventRecord) {
        if let Err(error) = self.inner.events.record(event).await {
            tracing::error!(run = %self.run, %error, "a reflex event was not recorded");
        }
    }

    async fn decide(&mut self, decision: Decision) -> EventRecord {
        let reflex = lock(&self.inner.engine).reflex(decision.id).cloned();
        let mut event = EventRecord {
            id: String::new(),
            at: UnixMs(decision.at_ms),
            sampled_at: None,
            run: decision.run.clone(),
            owner: self.owner.clone(),
            reflex: decision.reflex.clone(),
            kind: EventKind::Fire,
            values: decision.values.clone(),
            actions: Vec::new(),
            error: None,
            dry_run: decision.dry_run,
        };
        let Some(reflex) = reflex else {
            event.kind = EventKind::Error;
            event.error = Some("the reflex was removed before it could act (its run ended)".to_owned());
            return event;
        };
        match decision.kind {
            DecisionKind::Error(error) => {
                event.kind = EventKind::Error;
                event.error = Some(error);
            }
            DecisionKind::Fire => {
                for action in &decision.actions {
                    let (outcome, detail) = if decision.dry_run {
                        (Outcome::WouldDo, describe(action, &reflex))
                    } else {
                        self.act(decision.id, &reflex, action).await
                    };
                    tracing::info!(run = %self.run, reflex = %reflex.name, ?outcome, %detail, "reflex action");
                    event.actions.push(ActionRecord {
                        action: action.clone(),
                        outcome,
                        detail,
                    });
                }
            }
            DecisionKind::Release => {
                event.kind = EventKind::Release;
                event.actions = if decision.dry_run {
                    undoable(&reflex.actions)
                        .map(|action| ActionRecord {
                            action: action.clone(),
                            outcome: Outcome::WouldDo,
                            detail: format!("would undo: {}", describe(action, &reflex)),
                        })
                        .collect()
                } else {
                    self.undo(&reflex.name, &reflex.actions).await
                };
            }
        }
        event
    }

    /// The agent a reflex's replica actions act on: its scope's agent, or the first
    /// agent its instance serves.
    fn agent_of(&self, reflex: &Reflex) -> Option<String> {
        match &reflex.scope {
            Scope::Agent(agent) => Some(agent.clone()),
            scope @ Scope::Instance(_) => scope_instances(&self.inner.instances, &self.inner.graph, &self.run, scope)
                .first()
                .and_then(|v| v.agents.first().cloned()),
            Scope::Node(_) | Scope::Zone(_) => None,
        }
    }

    /// The ready replicas of `agent` in this run, split into those that existed before
    /// any reflex added some, and the added ones.
    fn replicas(&self, agent: &str) -> (Vec<InstanceView>, Vec<InstanceView>) {
        scope_instances(
            &self.inner.instances,
            &self.inner.graph,
            &self.run,
            &Scope::Agent(agent.to_owned()),
        )
        .into_iter()
        .partition(|v| v.clone_of.is_none())
    }

    /// Sets an instance's share, remembering the first value this reflex changed.
    fn share(&mut self, reflex: &str, view: &InstanceView, share: f64) {
        self.applied
            .entry(reflex.to_owned())
            .or_default()
            .shares
            .entry(view.name.clone())
            .or_insert(view.share);
        self.inner.instances.set_share(&view.name, share);
    }

    async fn act(&mut self, id: super::ReflexId, reflex: &Reflex, action: &Action) -> Done {
        let needs_agent = || {
            (
                Outcome::Skipped,
                "this action needs a reflex scoped to an agent or an instance".to_owned(),
            )
        };
        match action {
            Action::Notify { message } => (Outcome::Done, message.clone().unwrap_or_else(|| "notified".to_owned())),
            Action::Clone { count } => match self.agent_of(reflex) {
                Some(agent) => self.clone_replicas(reflex, &agent, *count).await,
                None => needs_agent(),
            },
            Action::Reroute(reroute) => match self.agent_of(reflex) {
                Some(agent) => self.reroute(reflex, &agent, reroute),
                None => needs_agent(),
            },
            Action::Decay { target, capacity } => match self.agent_of(reflex) {
                Some(agent) => self.decay(reflex, &agent, *target, *capacity).await,
                None => needs_agent(),
            },
            Action::Migrate { sessions, to } => self.migrate(id, reflex, *sessions, to).await,
            Action::Drain => self.drain(reflex).await,
        }
    }

    /// Starts one more replica of `agent` off `avoid` for `reflex`, remembered so that
    /// its release scales it in.
    async fn start_replica(&mut self, reflex: &Reflex, agent: &str, avoid: &Pin) -> Result<InstanceView, String> {
        let replica = self
            .inner
            .executor
            .add_replica(&self.run, agent, &reflex.name, avoid)
            .await
            .map_err(|error| error.to_string())?;
        self.applied
            .entry(reflex.name.clone())
            .or_default()
            .clones
            .push(replica.name.clone());
        Ok(replica)
    }

    async fn clone_replicas(&mut self, reflex: &Reflex, agent: &str, count: u32) -> Done {
        let (originals, clones) = self.replicas(agent);
        let have = (originals.len() + clones.len()) as u32;
        let room = reflex
            .max_replicas
            .map_or(count, |max| max.saturating_sub(have).min(count));
        if room == 0 {
            return (
                Outcome::Skipped,
                format!("`{agent}` has {have} replicas, its max_replicas; none added"),
            );
        }
        // Off the GPUs the agent already runs on: a replica on a hot GPU would not help.
        let mut places: Vec<(String, Vec<u32>)> = originals
            .iter()
            .chain(&clones)
            .filter(|v| !v.gpus.is_empty())
            .map(|v| (v.node_name.clone(), v.gpus.clone()))
            .collect();
        let mut started = Vec::new();
        let mut failed = Vec::new();
        for _ in 0..room {
            let avoid = Pin::Avoid { places: places.clone() };
            match self.start_replica(reflex, agent, &avoid).await {
                Ok(view) => {
                    if !view.gpus.is_empty() {
                        places.push((view.node_name.clone(), view.gpus.clone()));
                    }
                    started.push(format!("{} on {}", view.name, place(&view)));
                }
                Err(error) => failed.push(error),
            }
        }
        match (started.is_empty(), failed.is_empty()) {
            (false, true) => (Outcome::Done, format!("started {}", started.join(", "))),
            (false, false) => (
                Outcome::Done,
                format!(
                    "started {}; {} more failed: {}",
                    started.join(", "),
                    failed.len(),
                    failed.join("; ")
                ),
            ),
            _ => (Outcome::Failed, failed.join("; ")),
        }
    }

    fn reroute(&mut self, reflex: &Reflex, agent: &str, reroute: &Reroute) -> Done {
        let (originals, clones) = self.replicas(agent);
        let (original_share, clone_share) = match reroute {
            Reroute::New | Reroute::Weights(_) if clones.is_empty() => {
                return (
                    Outcome::Skipped,
                    format!("`{agent}` has no added replica; every replica keeps its share"),
                );
            }
            Reroute::New => (0.0, 1.0),
            Reroute::All => (1.0, 1.0),
            Reroute::Weights(weights) => (
                weights.get("original").copied().unwrap_or(1.0),
                weights.get("clones").copied().unwrap_or(1.0),
            ),
        };
        let mut said = Vec::new();
        for (views, share) in [(&originals, original_share), (&clones, clone_share)] {
            for view in views {
                self.share(&reflex.name, view, share);
                said.push(format!("{} {share}", view.name));
            }
        }
        (
            Outcome::Done,
            format!("shares of new sessions and requests: {}", said.join(", ")),
        )
    }

    async fn decay(&mut self, reflex: &Reflex, agent: &str, target: DecayTarget, capacity: f64) -> Done {
        let (originals, clones) = self.replicas(agent);
        let (shrink, others) = match target {
            DecayTarget::Original => (originals, clones),
            DecayTarget::Clones => (clones, originals),
        };
        if shrink.is_empty() {
            return (
                Outcome::Skipped,
                format!("`{agent}` has no {} replica", target_name(target)),
            );
        }
        let mut said = Vec::new();
        for view in &shrink {
            // The share it had before this reflex touched it, times the capacity.
            let base = self
                .applied
                .get(&reflex.name)
                .and_then(|a| a.shares.get(&view.name).copied())
                .unwrap_or(view.share);
            let now = self.inner.instances.get(&view.name).map_or(base, |v| v.share);
            let share = now.min(base) * capacity;
            self.share(&reflex.name, view, share);
            said.push(format!("{} share {now} → {share}", view.name));
        }
        // Its sessions shrink to the capacity too: the rest move to the other replicas.
        let names: Vec<String> = shrink.iter().map(|v| v.name.clone()).collect();
        let bound = match self.inner.sessions.bound_to(&names) {
            Ok(bound) => bound,
            Err(error) => {
                return (
                    Outcome::Failed,
                    format!("{}; sessions not read: {error}", said.join(", ")),
                );
            }
        };
        let moving = ((1.0 - capacity) * bound.len() as f64).floor() as usize;
        if moving == 0 || others.is_empty() {
            let why = if others.is_empty() {
                "; no other replica to move sessions to"
            } else {
                ""
            };
            return (Outcome::Done, format!("{}{why}", said.join(", ")));
        }
        let targets: Vec<String> = others.iter().map(|v| v.name.clone()).collect();
        let moved = self.move_sessions(bound.iter().rev().take(moving).map(|s| s.id.clone()), |i| {
            MoveTo::Instance(targets[i % targets.len()].clone())
        });
        let moved = moved.await;
        (moved.outcome(), format!("{}; {}", said.join(", "), moved.say()))
    }

    async fn migrate(&mut self, id: super::ReflexId, reflex: &Reflex, count: SessionCount, to: &MigrateTarget) -> Done {
        let mut views = scope_instances(&self.inner.instances, &self.inner.graph, &self.run, &reflex.scope);
        if views.is_empty() {
            return (Outcome::Skipped, "no instance runs in the scope".to_owned());
        }
        // Off the GPUs where the condition holds first (the hot or failing ones), then
        // the busiest.
        let holding = lock(&self.inner.engine).holding(id);
        let snapshot = self.inner.graph.snapshot();
        let rank = |v: &InstanceView| -> (bool, u32) {
            let held = v
                .gpus
                .iter()
                .any(|&g| holding.contains(&GpuKey::new(v.node.clone(), g)));
            let busy = snapshot
                .gpus()
                .filter(|(n, g)| n.inventory.name == v.node_name && v.gpus.contains(&g.facts.index))
                .filter_map(|(_, g)| g.latest.and_then(|s| s.utilization_pct))
                .max()
                .unwrap_or(0);
            (held, busy)
        };
        views.sort_by_key(|v| std::cmp::Reverse(rank(v)));
        let mut sessions = Vec::new();
        for view in &views {
            match self.inner.sessions.bound_to(std::slice::from_ref(&view.name)) {
                Ok(bound) => sessions.extend(bound.into_iter().map(|s| s.id)),
                Err(error) => return (Outcome::Failed, format!("sessions not read: {error}")),
            }
        }
        let limit = match count {
            SessionCount::All => sessions.len(),
            SessionCount::Count(n) => n as usize,
        };
        let sessions: Vec<String> = sessions.into_iter().take(limit).collect();
        let mut said = Vec::new();
        let to = match to {
            MigrateTarget::Gpu { node, gpu } => MoveTo::Gpu {
                node: node.clone(),
                gpu: *gpu,
            },
            // An agent's sessions stay with the run: on a replica off the GPUs they
            // leave, started for the reflex (and scaled in at its release) if there is
            // none.
            MigrateTarget::Auto if !sessions.is_empty() => match self.agent_of(reflex) {
                Some(agent) => {
                    let leaving: Vec<&InstanceView> = views.iter().filter(|v| rank(v).0).collect();
                    let leaving = if leaving.is_empty() {
                        views.iter().take(1).collect()
                    } else {
                        leaving
                    };
                    let places: Vec<(String, Vec<u32>)> =
                        leaving.iter().map(|v| (v.node_name.clone(), v.gpus.clone())).collect();
                    let avoid = Pin::Avoid { places };
                    let (originals, clones) = self.replicas(&agent);
                    let elsewhere = originals
                        .into_iter()
                        .chain(clones)
                        .find(|v| v.state == crate::instances::InstanceState::Ready && avoid.admits(v));
                    match elsewhere {
                        Some(replica) => MoveTo::Instance(replica.name),
                        None => match self.start_replica(reflex, &agent, &avoid).await {
                            Ok(replica) => {
                                said.push(format!("started {} on {}", replica.name, place(&replica)));
                                MoveTo::Instance(replica.name)
                            }
                            Err(error) => {
                                return (
                                    Outcome::Failed,
                                    format!("no replica of `{agent}` could start elsewhere: {error}"),
                                );
                            }
                        },
                    }
                }
                None => MoveTo::Auto,
            },
            MigrateTarget::Auto => MoveTo::Auto,
        };
        let moved = self.move_sessions(sessions.into_iter(), |_| to.clone()).await;
        said.push(moved.say());
        (moved.outcome(), said.join("; "))
    }

    async fn drain(&mut self, reflex: &Reflex) -> Done {
        let snapshot = self.inner.graph.snapshot();
        let gpus: Vec<(NodeId, String, u32)> = match &reflex.scope {
            scope @ (Scope::Node(_) | Scope::Zone(_)) => scope_nodes(&snapshot, scope)
                .iter()
                .flat_map(|n| {
                    n.gpus
                        .iter()
                        .map(|g| (n.id.clone(), n.inventory.name.clone(), g.facts.index))
                })
                .collect(),
            scope => scope_instances(&self.inner.instances, &self.inner.graph, &self.run, scope)
                .iter()
                .flat_map(|v| v.gpus.iter().map(|&g| (NodeId(v.node.clone()), v.node_name.clone(), g)))
                .collect(),
        };
        if gpus.is_empty() {
            return (Outcome::Skipped, "the scope has no GPU to drain".to_owned());
        }
        let reason = format!("reflex `{}` of run {}", reflex.name, self.run);
        let mut drained = Vec::new();
        for (node, name, gpu) in &gpus {
            match self.inner.graph.set_drained(node, *gpu, Some(reason.clone())) {
                Ok(_) => {
                    drained.push(format!("{name} GPU {gpu}"));
                    let key = GpuKey::new(node.0.clone(), *gpu);
                    let applied = self.applied.entry(reflex.name.clone()).or_default();
                    if !applied.drained.contains(&key) {
                        applied.drained.push(key);
                    }
                }
                Err(error) => return (Outcome::Failed, error.to_string()),
            }
        }
        let on = |v: &InstanceView| gpus.iter().any(|(_, n, g)| v.node_name == *n && v.gpus.contains(g));
        let affected = self.inner.instances.filter(|v| on(v) && !v.state.is_gone());
        let mut said = vec![format!("drained {}", drained.join(", "))];
        for view in &affected {
            self.share(&reflex.name, view, 0.0);
        }
        // This run's agents keep a replica off the drained GPUs.
        let mut replaced: Vec<String> = Vec::new();
        let run = self.run.clone();
        for view in affected.iter().filter(|v| v.run.as_deref() == Some(run.as_str())) {
            let Some(agent) = view.agents.first() else { continue };
            let elsewhere = scope_instances(
                &self.inner.instances,
                &self.inner.graph,
                &self.run,
                &Scope::Agent(agent.clone()),
            )
            .iter()
            .any(|v| !on(v));
            if elsewhere || replaced.contains(agent) {
                continue;
            }
            match self.start_replica(reflex, agent, &Pin::Anywhere).await {
                Ok(replica) => {
                    said.push(format!("started {} on {} for `{agent}`", replica.name, place(&replica)));
                    replaced.push(agent.clone());
                }
                Err(error) => said.push(format!("no replica of `{agent}` could start elsewhere: {error}")),
            }
        }
        let names: Vec<String> = affected.iter().map(|v| v.name.clone()).collect();
        let bound = match self.inner.sessions.bound_to(&names) {
            Ok(bound) => bound,
            Err(error) => {
                return (
                    Outcome::Failed,
                    format!("{}; sessions not read: {error}", said.join("; ")),
                );
            }
        };
        let moved = self
            .move_sessions(bound.into_iter().map(|s| s.id), |_| MoveTo::Auto)
            .await;
        said.push(moved.say());
        (moved.outcome(), said.join("; "))
    }

    /// Moves `sessions`, the i-th to `to(i)`, one after the other.
    async fn move_sessions(&self, sessions: impl Iterator<Item = String>, to: impl Fn(usize) -> MoveTo) -> Moved {
        let principal = reflex_principal();
        let mut moved = Moved::default();
        for (i, id) in sessions.enumerate() {
            match self.inner.sessions.migrate(&principal, &id, to(i)).await {
                Ok(migration) => moved.done.push(format!("{id} → {}", migration.to.instance)),
                Err(error) => moved.failed.push(format!("{id}: {error}")),
            }
        }
        moved
    }

    /// Undoes what reflex `name` added (released, or its run ended): its replicas are
    /// scaled in after their sessions move to the others, shares come back, drains are
    /// lifted. `declared` are its actions, to say what each undo answers.
    async fn undo(&mut self, name: &str, declared: &[Action]) -> Vec<ActionRecord> {
        let Some(applied) = self.applied.remove(name) else {
            return Vec::new();
        };
        let find = |wanted: fn(&Action) -> bool| declared.iter().find(|a| wanted(a)).cloned();
        let mut records = Vec::new();
        if !applied.clones.is_empty() {
            let mut said = Vec::new();
            let mut outcome = Outcome::Done;
            for clone in &applied.clones {
                self.inner.instances.set_share(clone, 0.0);
                let stays: Vec<String> = match self.inner.instances.get(clone) {
                    Some(view) => view
                        .agents
                        .iter()
                        .flat_map(|agent| {
                            let (originals, clones) = self.replicas(agent);
                            originals.into_iter().chain(clones)
                        })
                        .filter(|v| !applied.clones.contains(&v.name))
                        .map(|v| v.name)
                        .collect(),
                    None => Vec::new(),
                };
                let moved = if stays.is_empty() {
                    // No replica stays (the run ended): its sessions are placed again at
                    // their next turn.
                    "its sessions are placed again at their next turn".to_owned()
                } else {
                    let bound = self
                        .inner
                        .sessions
                        .bound_to(std::slice::from_ref(clone))
                        .unwrap_or_default();
                    let moved = self
                        .move_sessions(bound.into_iter().map(|s| s.id), |i| {
                            MoveTo::Instance(stays[i % stays.len()].clone())
                        })
                        .await;
                    if moved.outcome() == Outcome::Failed {
                        outcome = Outcome::Failed;
                    }
                    moved.say()
                };
                let _ = self.inner.instances.stop(clone);
                said.push(format!("scaled in {clone} ({moved})"));
            }
            let action = find(|a| matches!(a, Action::Clone { .. } | Action::Drain)).unwrap_or(Action::Clone {
                count: applied.clones.len() as u32,
            });
            records.push(ActionRecord {
                action,
                outcome,
                detail: said.join("; "),
            });
        }
        if !applied.shares.is_empty() {
            let mut said = Vec::new();
            for (instance, share) in &applied.shares {
                if !applied.clones.contains(instance) && self.inner.instances.set_share(instance, *share) {
                    said.push(format!("{instance} {share}"));
                }
            }
            if let Some(action) = find(|a| matches!(a, Action::Decay { .. } | Action::Reroute(_) | Action::Drain))
                && !said.is_empty()
            {
                records.push(ActionRecord {
                    action,
                    outcome: Outcome::Done,
                    detail: format!("shares restored: {}", said.join(", ")),
                });
            }
        }
        if !applied.drained.is_empty() {
            let mut lifted = Vec::new();
            for key in &applied.drained {
                if self
                    .inner
                    .graph
                    .set_drained(&NodeId(key.node.clone()), key.index, None)
                    .unwrap_or(false)
                {
                    // By the node's name, as the drain said it.
                    let name = self
                        .inner
                        .graph
                        .node(&NodeId(key.node.clone()))
                        .map_or_else(|| key.node.clone(), |n| n.inventory.name.clone());
                    lifted.push(format!("{name} GPU {}", key.index));
                }
            }
            records.push(ActionRecord {
                action: Action::Drain,
                outcome: Outcome::Done,
                detail: format!("drain lifted on {}", lifted.join(", ")),
            });
        }
        records
    }
}

/// Sessions a reflex moved, and those it could not.
#[derive(Default)]
struct Moved {
    done: Vec<String>,
    failed: Vec<String>,
}

impl Moved {
    fn outcome(&self) -> Outcome {
        if self.done.is_empty() && !self.failed.is_empty() {
            Outcome::Failed
        } else {
            Outcome::Done
        }
    }

    fn say(&self) -> String {
        let mut said = match self.done.len() {
            0 => "no session moved".to_owned(),
            n => format!(
                "moved {n} session{}: {}",
                if n == 1 { "" } else { "s" },
                self.done.join(", ")
            ),
        };
        if !self.failed.is_empty() {
            said.push_str(&format!(
                "; {} could not move: {}",
                self.failed.len(),
                self.failed.join("; ")
            ));
        }
        said
    }
}

/// The actions whose effects a release undoes.
fn undoable(actions: &[Action]) -> impl Iterator<Item = &Action> {
    actions.iter().filter(|a| match a {
        Action::Clone { .. } | Action::Reroute(_) | Action::Decay { .. } | Action::Drain => true,
        // A migration moves sessions once and a note is only recorded: neither is taken back on release.
        Action::Migrate { .. } | Action::Notify { .. } => false,
    })
}

fn target_name(target: DecayTarget) -> &'static str {
    match target {
        DecayTarget::Original => "original",
        DecayTarget::Clones => "added",
    }
}

/// Where an instance runs, for people: `rtx-1 GPU 0,1` or `rtx-1 CPU`.
fn place(view: &InstanceView) -> String {
    if view.gpus.is_empty() {
        format!("{} CPU", view.node_name)
    } else {
        let gpus: Vec<String> = view.gpus.iter().map(u32::to_string).collect();
        format!("{} GPU {}", view.node_name, gpus.join(","))
    }
}

/// What an action would do, for a dry run.
fn describe(action: &Action, reflex: &Reflex) -> String {
    let scope = match &reflex.scope {
        Scope::Agent(a) => format!("agent `{a}`"),
        Scope::Instance(i) => format!("instance `{i}`"),
        Scope::Node(n) => format!("node `{n}`"),
        Scope::Zone(z) => format!("zone `{z}`"),
    };
    match action {
        Action::Clone { count } => format!(
            "start {count} more replica{} of {scope}{}",
            if *count == 1 { "" } else { "s" },
            reflex
                .max_replicas
                .map(|m| format!(" (at most {m} in all)"))
                .unwrap_or_default()
        ),
        Action::Reroute(Reroute::New) => format!("send new sessions and requests of {scope} to its added replicas"),
        Action::Reroute(Reroute::All) => format!("spread new sessions and requests of {scope} over all its replicas"),
        Action::Reroute(Reroute::Weights(w)) => format!(
            "split new sessions and requests of {scope}: {}",
            w.iter().map(|(k, v)| format!("{k} {v}")).collect::<Vec<_>>().join(", ")
        ),
        Action::Decay { target, capacity } => format!(
            "shrink the {} replicas of {scope} to {capacity} of their share and sessions",
            target_name(*target)
        ),
        Action::Migrate { sessions, to } => format!(
            "move {} sessions off {scope} to {}",
            match sessions {
                SessionCount::All => "all".to_owned(),
                SessionCount::Count(n) => format!("up to {n}"),
            },
            match to {
                MigrateTarget::Auto => "where the planner chooses".to_owned(),
                MigrateTarget::Gpu { node, gpu } => format!("{node} GPU {gpu}"),
            }
        ),
        Action::Drain => format!("drain the GPUs of {scope} and move their sessions away"),
        Action::Notify { message } => message.clone().unwrap_or_else(|| "notify".to_owned()),
    }
}
