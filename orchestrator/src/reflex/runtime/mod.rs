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
//!
//! Both kinds of task are the server's ([`Lifecycle`]): spawned on its tracker, they end
//! when its shutdown token is cancelled — the watcher at its next wait, an actor between
//! jobs, without undoing (its run resumes at the next start, its reflexes with it).

mod actions;
mod actor;
mod undo;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use skein_dsl::ir::{Action, DecayTarget, MigrateTarget, Reflex, Reroute, Scope, SessionCount};
use tokio::sync::{broadcast, mpsc};

use super::{Decision, Engine, EventKind, EventRecord, Events, GpuKey, GpuReading, Outcome};
use crate::auth::Principal;
use crate::base::{Lifecycle, lock, unix_ms};
use crate::graph::{GpuSample, GraphEvent, GraphSnapshot, HardwareGraph, NodeId, NodeView};
use crate::instances::{InstanceView, Instances};
use crate::run::executor::Executor;
use crate::session::Sessions;

/// How often the agents' serving figures are read and open windows re-evaluated.
pub const TICK: Duration = Duration::from_millis(250);

/// Jobs a run's actor may have waiting. Decisions are few (a reflex fires or releases
/// at most once per window and cooldown), so a full queue means the actor is stuck on
/// a slow action: the telemetry task never waits for it (it drops the decision with a
/// warning and counts it, [`Reflexes::dropped`]), so telemetry keeps being handled
/// within a tick.
pub const JOB_QUEUE: usize = 64;

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
    /// Jobs dropped because their actor's queue was full.
    dropped: AtomicU64,
    /// The server's shutdown token and the tracker the tasks are spawned on.
    lifecycle: Lifecycle,
}

/// A run whose reflexes are live.
struct Watched {
    /// Its reflexes: engine id and declaration.
    reflexes: Vec<(super::ReflexId, Reflex)>,
    /// Its agents served by a remote endpoint (their requests count under
    /// [`crate::load::endpoint_key`]).
    endpoints: HashSet<String>,
    /// Its actor's queue; dropping it ends the actor (after it undid what the run's
    /// reflexes added).
    jobs: mpsc::Sender<Job>,
}

/// Work for a run's actor.
enum Job {
    /// Carry out a decision and record it (with when its GPU sample was taken, if a
    /// sample decided it).
    Decide(Decision, Option<i64>),
    /// Record an event that needs no action (a scope that cannot be resolved).
    Record(EventRecord),
}

/// The principal reflexes act as: they move any session bound where they act.
fn reflex_principal() -> Principal {
    Principal {
        user: "skein-reflexes".to_owned(),
        admin: true,
    }
}

impl Reflexes {
    /// Starts the reflexes of every running workflow, fed by `graph_events`; their
    /// tasks are `lifecycle`'s.
    pub fn start(
        graph: Arc<HardwareGraph>,
        graph_events: &broadcast::Sender<GraphEvent>,
        instances: Arc<Instances>,
        executor: Executor,
        sessions: Sessions,
        events: Events,
        lifecycle: &Lifecycle,
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
                dropped: AtomicU64::new(0),
                lifecycle: lifecycle.clone(),
            }),
        };
        let receiver = graph_events.subscribe();
        let task = lifecycle.tasks.spawn(reflexes.clone().watch(receiver));
        (reflexes, task)
    }

    /// Jobs (decisions, events) dropped since the start because their run's actor was
    /// [`JOB_QUEUE`] jobs behind.
    pub fn dropped(&self) -> u64 {
        self.inner.dropped.load(Ordering::Relaxed)
    }

    /// Queues `job` for `watched`'s actor without waiting: a full queue drops it (with
    /// a warning, counted); a closed one (its actor is gone) ignores it.
    fn queue(&self, watched: &Watched, job: Job) {
        if let Err(mpsc::error::TrySendError::Full(_)) = watched.jobs.try_send(job) {
            self.inner.dropped.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(
                capacity = JOB_QUEUE,
                "a run's reflex actions are behind; a decision was dropped"
            );
        }
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
        let shutdown = self.inner.lifecycle.shutdown.clone();
        self.reconcile();
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
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
            // Dropping its queue ends the actor once it has done what was queued.
            if lock(&self.inner.runs).remove(&id).is_some() {
                lock(&self.inner.engine).remove_run(&id);
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
            let (jobs, queue) = mpsc::channel(JOB_QUEUE);
            let mut reflexes = Vec::new();
            {
                let mut engine = lock(&self.inner.engine);
                for reflex in &run.workflow.reflexes {
                    match engine.add(&id, reflex) {
                        Ok(reflex_id) => reflexes.push((reflex_id, reflex.clone())),
                        Err(error) => {
                            // A new queue: the first JOB_QUEUE of these always fit.
                            let _ = jobs.try_send(Job::Record(self.error_event(
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
            self.inner.lifecycle.tasks.spawn(actor.serve(queue));
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
                self.queue(watched, Job::Decide(decision, sampled_at));
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
