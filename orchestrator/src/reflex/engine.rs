//! The reflex engine's pure core.
//!
//! A reflex watches a scope (an agent's instances, one instance, a node, a zone) whose
//! GPUs and nodes the caller resolves and hands over ([`Engine::set_scope`]). Samples
//! come in one GPU, node or agent at a time; each updates the latest reading in the
//! reflexes whose scope holds it (found through an index, never a scan of every
//! reflex) and re-evaluates just those:
//!
//! - the `gpu.*` metrics of the scope's GPUs (those with a reading) are combined by the
//!   reflex's aggregate (max by default; `throttled` is "any" for max and avg, "all" for min), `node.down`
//!   is true if any of its nodes is down, `agent.*` are the agent's serving figures;
//! - the condition must hold without a break for `for` before the reflex fires, and the
//!   reflex fires at most once per cooldown;
//! - a fired reflex is active until its release condition (`release`, else the
//!   condition no longer holding) has held for the cooldown; only then is it released
//!   (scale-in may follow) and may it fire again. A load that flickers faster than the
//!   cooldown keeps it active: no flapping.
//!
//! Dry-run reflexes go through the same states; their decisions say `dry_run` and the
//! caller only records them.

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;
use skein_dsl::expr::{Bindings, Compiled, Context, Evaluator, ExprError, Truth, Value};
use skein_dsl::ir::{Action, Aggregate, Reflex, Scope};

pub use crate::load::AgentReading;

/// A GPU: its node's id and its index there.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct GpuKey {
    /// The node's id.
    pub node: String,
    /// The GPU's index on the node.
    pub index: u32,
}

impl GpuKey {
    /// GPU `index` of `node`.
    pub fn new(node: impl Into<String>, index: u32) -> GpuKey {
        GpuKey {
            node: node.into(),
            index,
        }
    }
}

/// One GPU's metrics as conditions see them (`gpu.*`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct GpuReading {
    /// Busy fraction, 0 to 1.
    pub util: f64,
    /// Memory in use over memory, 0 to 1.
    pub mem_used_frac: f64,
    /// Degrees Celsius.
    pub temp: f64,
    /// Power draw over the power limit, 0 to 1 (and above, briefly).
    pub power_frac: f64,
    /// Clocks held down for heat or power.
    pub throttled: bool,
    /// ECC errors (corrected and uncorrected) per second since the previous sample.
    pub ecc_rate: f64,
}

impl GpuReading {
    /// The reading of `sample` on a GPU of `facts`; `previous` (the GPU's sample before
    /// it) gives the ECC error rate.
    pub fn of(
        facts: &crate::graph::GpuFacts,
        sample: &crate::graph::GpuSample,
        previous: Option<&crate::graph::GpuSample>,
    ) -> GpuReading {
        let total = facts.memory_total.max(1) as f64;
        let errors = |s: &crate::graph::GpuSample| s.ecc_corrected.unwrap_or(0) + s.ecc_uncorrected.unwrap_or(0);
        let ecc_rate = match previous {
            Some(before) if sample.unix_ms > before.unix_ms => {
                let seconds = (sample.unix_ms - before.unix_ms) as f64 / 1000.0;
                errors(sample).saturating_sub(errors(before)) as f64 / seconds
            }
            _ => 0.0,
        };
        GpuReading {
            util: f64::from(sample.utilization_pct.unwrap_or(0)) / 100.0,
            mem_used_frac: sample.memory_used as f64 / total,
            temp: f64::from(sample.temperature_c.unwrap_or(0)),
            power_frac: match (sample.power_mw, facts.power_limit_mw) {
                (Some(draw), Some(limit)) if limit > 0 => f64::from(draw) / f64::from(limit),
                _ => 0.0,
            },
            throttled: sample.throttle_reasons & (skein_proto::throttle::THERMAL | skein_proto::throttle::POWER) != 0,
            ecc_rate,
        }
    }
}

/// A reflex of the engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct ReflexId(pub usize);

/// What happened to a reflex.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DecisionKind {
    /// The condition held for `for`: the actions are to be taken.
    Fire,
    /// The release condition held for the cooldown: what the reflex added may go.
    Release,
    /// The condition could not be evaluated (said once until it changes).
    Error(String),
}

/// A decision of the engine, with its cause.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Decision {
    /// The reflex.
    pub id: ReflexId,
    /// Its name.
    pub reflex: String,
    /// The run whose workflow declared it.
    pub run: String,
    /// When (the time of the sample that decided it), Unix milliseconds.
    pub at_ms: i64,
    /// Fire, release or error.
    pub kind: DecisionKind,
    /// The metrics the condition reads, as they were (`gpu.util`: 0.91).
    pub values: BTreeMap<String, f64>,
    /// The actions, in order (on a fire).
    pub actions: Vec<Action>,
    /// Only to be recorded.
    pub dry_run: bool,
}

/// Where a reflex is in its cycle.
#[derive(Debug, Clone, Default, PartialEq)]
struct Window {
    /// Since when the condition (idle) or the release (active) has held.
    since: Option<i64>,
    /// Fired and not yet released.
    active: bool,
    /// When it last fired.
    fired_at: Option<i64>,
    /// The last evaluation error said.
    error: Option<String>,
}

/// A reflex with what it watches.
struct Live {
    run: String,
    reflex: Reflex,
    when: Compiled,
    release: Option<Compiled>,
    /// The metric paths the conditions read (`gpu.util`), for the decisions' values.
    reads: Vec<String>,
    /// The scope's GPUs and their latest readings.
    gpus: BTreeMap<GpuKey, Option<GpuReading>>,
    /// The scope's nodes and whether each is down.
    nodes: BTreeMap<String, bool>,
    /// Whose figures `agent.*` are, if the scope has one ([`figures_of`]).
    agent: Option<String>,
    /// Its latest figures; `None` (absent) while nothing serves it.
    agent_reading: Option<AgentReading>,
    window: Window,
}

/// The reflexes of every running workflow, indexed by what they watch.
#[derive(Default)]
pub struct Engine {
    evaluator: Evaluator,
    reflexes: Vec<Option<Live>>,
    by_gpu: HashMap<GpuKey, Vec<ReflexId>>,
    by_node: HashMap<String, Vec<ReflexId>>,
    /// `(run, agent)` → reflexes reading that agent's figures.
    by_agent: HashMap<(String, String), Vec<ReflexId>>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("reflexes", &self.reflexes.iter().flatten().count())
            .finish_non_exhaustive()
    }
}

impl Engine {
    /// Adds a reflex of `run`'s workflow, its conditions compiled once. Its scope is
    /// empty until [`Engine::set_scope`].
    ///
    /// Errors: a condition that does not compile (the workflow checker refuses those, so
    /// only a workflow stored by another version can have one).
    pub fn add(&mut self, run: &str, reflex: &Reflex) -> Result<ReflexId, ExprError> {
        let when = self.evaluator.compile_expr(&reflex.when, Context::Reflex)?;
        let release = match &reflex.release {
            Some(release) => Some(self.evaluator.compile_expr(release, Context::Reflex)?),
            None => None,
        };
        let mut reads: Vec<String> = std::iter::once(&reflex.when)
            .chain(reflex.release.as_ref())
            .flat_map(|e| skein_dsl::expr::paths(e.source()))
            .filter(|p| p.segments.len() == 2)
            .map(|p| p.segments.join("."))
            .collect();
        reads.sort();
        reads.dedup();
        let id = ReflexId(self.reflexes.len());
        let agent = figures_of(&reflex.scope);
        if let Some(agent) = &agent {
            self.by_agent
                .entry((run.to_owned(), agent.clone()))
                .or_default()
                .push(id);
        }
        self.reflexes.push(Some(Live {
            run: run.to_owned(),
            reflex: reflex.clone(),
            when,
            release,
            reads,
            gpus: BTreeMap::new(),
            nodes: BTreeMap::new(),
            agent,
            agent_reading: None,
            window: Window::default(),
        }));
        Ok(id)
    }

    /// Removes every reflex of `run` (it ended).
    pub fn remove_run(&mut self, run: &str) {
        let ids: Vec<ReflexId> = self
            .ids()
            .filter(|id| self.live(*id).is_some_and(|l| l.run == run))
            .collect();
        for id in ids {
            self.set_scope(id, Vec::new(), Vec::new());
            if let Some(live) = self.reflexes[id.0].take()
                && let Some(agent) = live.agent
            {
                let key = (live.run, agent);
                if let Some(list) = self.by_agent.get_mut(&key) {
                    list.retain(|r| *r != id);
                    if list.is_empty() {
                        self.by_agent.remove(&key);
                    }
                }
            }
        }
    }

    /// The reflexes there are.
    pub fn ids(&self) -> impl Iterator<Item = ReflexId> + '_ {
        self.reflexes
            .iter()
            .enumerate()
            .filter(|(_, live)| live.is_some())
            .map(|(i, _)| ReflexId(i))
    }

    /// The reflex `id`, as declared.
    pub fn reflex(&self, id: ReflexId) -> Option<&Reflex> {
        self.live(id).map(|l| &l.reflex)
    }

    /// The run of reflex `id`.
    pub fn run_of(&self, id: ReflexId) -> Option<&str> {
        self.live(id).map(|l| l.run.as_str())
    }

    /// Whether reflex `id` has fired and is not released.
    pub fn is_active(&self, id: ReflexId) -> bool {
        self.live(id).is_some_and(|l| l.window.active)
    }

    fn live(&self, id: ReflexId) -> Option<&Live> {
        self.reflexes.get(id.0).and_then(Option::as_ref)
    }

    /// Sets what reflex `id` watches: these GPUs and nodes (the caller resolves the
    /// scope on the graph and the instances, and calls again when they change).
    /// Readings of GPUs that stay are kept.
    pub fn set_scope(&mut self, id: ReflexId, gpus: Vec<GpuKey>, nodes: Vec<String>) {
        let Some(live) = self.reflexes.get_mut(id.0).and_then(Option::as_mut) else {
            return;
        };
        let old_gpus: Vec<GpuKey> = live.gpus.keys().cloned().collect();
        let old_nodes: Vec<String> = live.nodes.keys().cloned().collect();
        let mut kept = std::mem::take(&mut live.gpus);
        live.gpus = gpus.iter().map(|g| (g.clone(), kept.remove(g).flatten())).collect();
        let mut kept_nodes = std::mem::take(&mut live.nodes);
        live.nodes = nodes
            .iter()
            .map(|n| (n.clone(), kept_nodes.remove(n).unwrap_or(false)))
            .collect();
        for gpu in old_gpus {
            unindex(&mut self.by_gpu, &gpu, id);
        }
        for node in old_nodes {
            unindex(&mut self.by_node, &node, id);
        }
        for gpu in gpus {
            self.by_gpu.entry(gpu).or_default().push(id);
        }
        for node in nodes {
            self.by_node.entry(node).or_default().push(id);
        }
    }

    /// The GPUs of reflex `id`'s scope on which its condition holds by their own
    /// reading alone (the hot or failing ones), in key order.
    pub fn holding(&self, id: ReflexId) -> Vec<GpuKey> {
        let Some(live) = self.live(id) else {
            return Vec::new();
        };
        live.gpus
            .iter()
            .filter_map(|(key, reading)| Some((key, (*reading)?)))
            .filter(|(_, reading)| {
                let vars = variables(live, std::slice::from_ref(reading));
                self.evaluator.eval_truth(&live.when, &vars).is_ok_and(Truth::holds)
            })
            .map(|(key, _)| key.clone())
            .collect()
    }

    /// Whether any reflex watches `gpu`.
    pub fn watches(&self, gpu: &GpuKey) -> bool {
        self.by_gpu.contains_key(gpu)
    }

    /// The `(run, subject)` pairs whose serving figures some reflex reads (feed them
    /// with [`Engine::agent_sample`]; [`figures_of`] says what a subject is).
    pub fn subjects(&self) -> impl Iterator<Item = &(String, String)> + '_ {
        self.by_agent.keys()
    }

    /// A GPU's new reading at `now_ms`: the reflexes watching it are evaluated.
    pub fn gpu_sample(&mut self, gpu: &GpuKey, reading: GpuReading, now_ms: i64) -> Vec<Decision> {
        self.gpu_batch(&[(gpu.clone(), reading)], now_ms)
    }

    /// New readings of several GPUs taken together (a node's telemetry batch): each
    /// reflex watching any of them is evaluated once, on all of them.
    pub fn gpu_batch(&mut self, readings: &[(GpuKey, GpuReading)], now_ms: i64) -> Vec<Decision> {
        let mut touched: Vec<ReflexId> = Vec::new();
        for (gpu, reading) in readings {
            let Some(ids) = self.by_gpu.get(gpu) else { continue };
            for id in ids {
                if let Some(live) = self.reflexes[id.0].as_mut() {
                    live.gpus.insert(gpu.clone(), Some(*reading));
                }
                if !touched.contains(id) {
                    touched.push(*id);
                }
            }
        }
        touched.into_iter().filter_map(|id| self.evaluate(id, now_ms)).collect()
    }

    /// A node went down or came back at `now_ms`.
    pub fn node_state(&mut self, node: &str, down: bool, now_ms: i64) -> Vec<Decision> {
        let Some(ids) = self.by_node.get(node) else {
            return Vec::new();
        };
        let ids = ids.clone();
        let mut decisions = Vec::new();
        for id in ids {
            if let Some(live) = self.reflexes[id.0].as_mut() {
                live.nodes.insert(node.to_owned(), down);
            }
            decisions.extend(self.evaluate(id, now_ms));
        }
        decisions
    }

    /// The serving figures of `subject` (an agent, or `@instance`: [`figures_of`]) of
    /// `run` at `now_ms`; `None` while nothing serves it (no instance is up, and it is
    /// not served by an endpoint): `agent.*` are absent then.
    pub fn agent_sample(
        &mut self,
        run: &str,
        agent: &str,
        reading: Option<AgentReading>,
        now_ms: i64,
    ) -> Vec<Decision> {
        let Some(ids) = self.by_agent.get(&(run.to_owned(), agent.to_owned())) else {
            return Vec::new();
        };
        let ids = ids.clone();
        let mut decisions = Vec::new();
        for id in ids {
            if let Some(live) = self.reflexes[id.0].as_mut() {
                live.agent_reading = reading;
            }
            decisions.extend(self.evaluate(id, now_ms));
        }
        decisions
    }

    /// Time passed without samples: reflexes whose window is open are evaluated again
    /// (a condition that keeps holding fires when its `for` is up even if samples
    /// stopped changing).
    pub fn tick(&mut self, now_ms: i64) -> Vec<Decision> {
        let open: Vec<ReflexId> = self
            .ids()
            .filter(|id| self.live(*id).is_some_and(|l| l.window.since.is_some()))
            .collect();
        open.into_iter().flat_map(|id| self.evaluate(id, now_ms)).collect()
    }

    /// Evaluates reflex `id` on its latest readings and moves its window.
    fn evaluate(&mut self, id: ReflexId, now_ms: i64) -> Option<Decision> {
        let evaluator = &self.evaluator;
        let live = self.reflexes.get_mut(id.0)?.as_mut()?;
        let readings: Vec<GpuReading> = live.gpus.values().flatten().copied().collect();
        if readings.is_empty() && live.agent_reading.is_none() && live.nodes.is_empty() {
            return None;
        }
        let vars = variables(live, &readings);
        // A condition decided by an absent metric neither holds nor lets go.
        let held = evaluator.eval_truth(&live.when, &vars);
        let released = match (&live.release, &held) {
            (Some(release), _) => evaluator.eval_truth(release, &vars).map(Truth::holds),
            (None, Ok(held)) => Ok(*held == Truth::False),
            (None, Err(e)) => Err(e.clone()),
        };
        let held = held.map(Truth::holds);
        let decision = |kind: DecisionKind, live: &Live| Decision {
            id,
            reflex: live.reflex.name.clone(),
            run: live.run.clone(),
            at_ms: now_ms,
            actions: match kind {
                DecisionKind::Fire => live.reflex.actions.clone(),
                _ => Vec::new(),
            },
            kind,
            values: values_read(live, &vars),
            dry_run: live.reflex.dry_run,
        };
        let (held, released) = match (held, released) {
            (Ok(held), Ok(released)) => {
                live.window.error = None;
                (held, released)
            }
            (Err(e), _) | (_, Err(e)) => {
                let message = e.message;
                if live.window.error.as_ref() == Some(&message) {
                    return None;
                }
                live.window.error = Some(message.clone());
                return Some(decision(DecisionKind::Error(message), live));
            }
        };
        let hold = millis(live.reflex.hold);
        let cooldown = millis(live.reflex.cooldown);
        let window = &mut live.window;
        if window.active {
            if !released {
                window.since = None;
                return None;
            }
            let since = *window.since.get_or_insert(now_ms);
            if now_ms - since < cooldown {
                return None;
            }
            window.active = false;
            window.since = None;
            return Some(decision(DecisionKind::Release, live));
        }
        if !held {
            window.since = None;
            return None;
        }
        let since = *window.since.get_or_insert(now_ms);
        let cooled = window.fired_at.is_none_or(|at| now_ms - at >= cooldown);
        if now_ms - since < hold || !cooled {
            return None;
        }
        window.active = true;
        window.since = None;
        window.fired_at = Some(now_ms);
        Some(decision(DecisionKind::Fire, live))
    }
}

fn unindex<K: std::hash::Hash + Eq>(index: &mut HashMap<K, Vec<ReflexId>>, key: &K, id: ReflexId) {
    if let Some(list) = index.get_mut(key) {
        list.retain(|r| *r != id);
        if list.is_empty() {
            index.remove(key);
        }
    }
}

fn millis(duration: std::time::Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

/// The values of the metrics the reflex's conditions read (`gpu.util`), for a decision.
fn values_read(live: &Live, vars: &Bindings) -> BTreeMap<String, f64> {
    live.reads
        .iter()
        .filter_map(|path| {
            let (map, metric) = path.split_once('.')?;
            let value = match vars.get(map)?.get(metric)? {
                Value::Bool(b) => f64::from(u8::from(*b)),
                other => other.as_f64()?,
            };
            Some((path.clone(), value))
        })
        .collect()
}

/// The condition's variables (`gpu`, `node`, `agent` maps) from the latest readings.
/// Whose serving figures a scope's `agent.*` read: an agent's name, or `@` and an
/// instance's name for an instance scope; none for nodes and zones.
pub fn figures_of(scope: &Scope) -> Option<String> {
    match scope {
        Scope::Agent(agent) => Some(agent.clone()),
        Scope::Instance(instance) => Some(format!("@{instance}")),
        Scope::Node(_) | Scope::Zone(_) => None,
    }
}

fn variables(live: &Live, readings: &[GpuReading]) -> Bindings {
    let combine = |f: fn(&GpuReading) -> f64| -> f64 {
        let values = readings.iter().map(f);
        match live.reflex.aggregate {
            Aggregate::Max => values.fold(f64::NEG_INFINITY, f64::max),
            Aggregate::Min => values.fold(f64::INFINITY, f64::min),
            Aggregate::Avg => values.sum::<f64>() / readings.len() as f64,
        }
    };
    let mut numbers: Vec<(&str, &str, Option<f64>)> = Vec::new();
    let mut flags: Vec<(&str, &str, Option<bool>)> = Vec::new();
    // No GPU sample yet, or a scope on no GPU (an endpoint agent): `gpu.*` are absent.
    let any = !readings.is_empty();
    numbers.extend([
        ("gpu", "util", any.then(|| combine(|r| r.util))),
        ("gpu", "mem_used_frac", any.then(|| combine(|r| r.mem_used_frac))),
        ("gpu", "temp", any.then(|| combine(|r| r.temp))),
        ("gpu", "power_frac", any.then(|| combine(|r| r.power_frac))),
        ("gpu", "ecc_rate", any.then(|| combine(|r| r.ecc_rate))),
    ]);
    let throttled = match live.reflex.aggregate {
        Aggregate::Min => readings.iter().all(|r| r.throttled),
        Aggregate::Max | Aggregate::Avg => readings.iter().any(|r| r.throttled),
    };
    flags.push(("gpu", "throttled", any.then_some(throttled)));
    // A scope on no node (an endpoint agent, an agent not yet placed): absent.
    flags.push((
        "node",
        "down",
        (!live.nodes.is_empty()).then(|| live.nodes.values().any(|down| *down)),
    ));
    let agent = live.agent_reading;
    numbers.extend([
        ("agent", "queue_depth", agent.map(|a| a.queue_depth)),
        ("agent", "latency_p95_ms", agent.and_then(|a| a.latency_p95_ms)),
        ("agent", "tokens_per_s", agent.map(|a| a.tokens_per_s)),
        ("agent", "sessions", agent.map(|a| a.sessions)),
    ]);
    let mut maps: BTreeMap<&str, BTreeMap<String, Value>> = BTreeMap::new();
    for (map, metric, value) in numbers {
        let value = value.map_or(Value::AbsentNumber, Value::Float);
        maps.entry(map).or_default().insert(metric.to_owned(), value);
    }
    for (map, metric, flag) in flags {
        let flag = flag.map_or(Value::AbsentFlag, Value::Bool);
        maps.entry(map).or_default().insert(metric.to_owned(), flag);
    }
    maps.into_iter()
        .map(|(name, map)| (name.to_owned(), Value::Map(map)))
        .collect()
}
