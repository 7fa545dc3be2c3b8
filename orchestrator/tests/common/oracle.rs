//! An oracle for the planner that shares none of its search: the placement problem of a
//! small fleet written as a mixed-integer program, which HiGHS (`tests/engines/highs.sh`,
//! `tests/engines/lexmip.py`) solves exactly.
//!
//! What the oracle takes from the product is what defines the problem, not how the
//! planner solves it: the fleet as the planner sees it ([`PlanFleet`]: usable memory,
//! health, bandwidth), each replica's demand ([`Unit`]'s fields: model, requirement,
//! concurrency, allowed variants), the memory estimator and its fit margins
//! (`skein-model-registry`, checked against real engines elsewhere), the compute
//! capability a variant needs, and the objective as docs/placement.md defines it
//! ([`ScoreParts::score`] over the throughput model [`tokens_per_second`]). It enumerates
//! its own placements, evaluates them itself, and leaves the choice to the solver; it
//! never calls the planner's candidate generation, fit checks, ordering or search.
//!
//! Its placements ("columns"), per replica and allowed variant:
//! - one GPU of any class (GPUs of one node with the same card, usable memory and health
//!   are a class: interchangeable, so a column takes a count of a class and the program
//!   picks which ones);
//! - tensor parallel over any valid number of one node's GPUs of one card;
//! - layer splits over one node's GPUs or (where the engine can) several nodes': every
//!   *minimal* multiset of classes that holds it (no GPU fewer would, and none of its GPUs
//!   holds it alone), layers in proportion to each GPU's usable memory, nodes by the
//!   capacity taken on them;
//! - the whole model on a node's CPU, with every engine that can run it there.
//!
//! Not in its space: layers in host RAM beside GPUs (`-ngl`), tensor-parallel groups as
//! pipeline stages, splits with more GPUs than they need (which can leave room for
//! another replica), and splits whose layers follow memory another replica already took. A plan that uses them can
//! only do better than the oracle, never worse, so the comparison stays one-sided and
//! sound.
//!
//! The program: a binary per column (`z`) and per column and GPU of its classes (`y`);
//! at most one column per replica; each column takes its count of each class
//! (`sum y = count z`); every GPU's reserved memory (MiB, needs rounded up, capacity
//! down) within its usable memory, and every host's within its free RAM. Objectives,
//! lexicographically as the score's weights make them: replicas placed, then the score
//! without its card-size term (in units of its lowest level), then the card size.

#![allow(dead_code)]

use serde_json::{Value, json};
use skein_model_registry::catalog::fit::engine_for;
use skein_model_registry::estimate::{DeviceKind, Engine, Estimate, EstimateRequest, FitMargin, Layout, estimate};
use skein_model_registry::{Bytes, WeightFormat};
use skein_orchestrator::plan::PlanFleet;
use skein_orchestrator::plan::demand::min_compute_capability;
use skein_orchestrator::plan::options::Unit;
use skein_orchestrator::plan::score::{
    BANDWIDTH_EFFICIENCY, DeviceSpeed, Hop, ScoreParts, host_speed_factor, tokens_per_second,
};

/// Most GPUs a split of the oracle spans.
pub const MAX_SPLIT: u32 = 12;
/// Most estimates the oracle makes for one replica; a case that needs more is left out.
pub const ESTIMATE_LIMIT: usize = 12_000;
/// Most GPU multisets the oracle looks at for one replica's splits; a case that needs
/// more is left out.
pub const MULTISET_LIMIT: usize = 200_000;

/// Interchangeable GPUs: one node, one card, the same usable memory and health.
#[derive(Debug, Clone)]
pub struct Class {
    pub node: usize,
    /// Positions on the node.
    pub gpus: Vec<usize>,
    pub name: String,
    pub total: u64,
    pub usable: u64,
    pub degraded: bool,
    pub compute_capability: Option<(u32, u32)>,
    pub bandwidth: f64,
    /// Every GPU of the node has an NVLink to every other.
    pub linked: bool,
}

/// One placement of one replica.
#[derive(Debug, Clone)]
pub struct Column {
    pub unit: usize,
    pub variant: usize,
    pub family: &'static str,
    /// (class, GPUs of it, bytes each needs).
    pub take: Vec<(usize, u32, u64)>,
    /// Host RAM it needs, on a node.
    pub host: Option<(usize, u64)>,
    pub score: i64,
    /// The score without its card-size term.
    pub score_cardless: i64,
    pub card_gib: u64,
}

/// A placement problem: the fleet's classes and every replica's columns.
#[derive(Debug, Clone)]
pub struct Problem {
    pub classes: Vec<Class>,
    pub columns: Vec<Column>,
    pub units: usize,
    /// Per node, host RAM free.
    pub host_free: Vec<u64>,
}

/// What the solver chose: columns, replicas placed, and their scores' sum.
#[derive(Debug, Clone, PartialEq)]
pub struct Optimum {
    pub chosen: Vec<usize>,
    pub placed: usize,
    pub score: i128,
}

/// The fleet's GPU classes. Panics on a node whose NVLinks are neither all-to-all nor
/// absent (the oracle's speed model takes a node's links as one).
pub fn classes(fleet: &PlanFleet) -> Vec<Class> {
    let mut out: Vec<Class> = Vec::new();
    for (n, node) in fleet.nodes.iter().enumerate() {
        let count = node.gpus.len();
        let all = (0..count).all(|p| (0..count).all(|q| p == q || node.gpus[p].nvlink & (1 << q) != 0));
        let none = node.gpus.iter().all(|g| g.nvlink == 0);
        assert!(
            all || none,
            "node {}: the oracle takes NVLink as all-to-all or none",
            node.name
        );
        for (p, g) in node.gpus.iter().enumerate() {
            let same = out.iter_mut().find(|c| {
                c.node == n
                    && c.name == g.name
                    && c.total == g.total
                    && c.usable == g.usable
                    && c.degraded == g.degraded
                    && c.compute_capability == g.compute_capability
                    && c.bandwidth == g.bandwidth
            });
            match same {
                Some(c) => c.gpus.push(p),
                None => out.push(Class {
                    node: n,
                    gpus: vec![p],
                    name: g.name.clone(),
                    total: g.total,
                    usable: g.usable,
                    degraded: g.degraded,
                    compute_capability: g.compute_capability,
                    bandwidth: g.bandwidth,
                    linked: all && count > 1,
                }),
            }
        }
    }
    out
}

/// The problem of placing `units` on `fleet`, or why the oracle leaves it out.
pub fn problem(units: &[&Unit<'_>], fleet: &PlanFleet) -> Result<Problem, String> {
    let classes = classes(fleet);
    let mut columns = Vec::new();
    for (u, unit) in units.iter().enumerate() {
        columns.extend(Columns::new(u, unit, fleet, &classes).all()?);
    }
    Ok(Problem {
        classes,
        columns,
        units: units.len(),
        host_free: fleet.nodes.iter().map(|n| n.host_free).collect(),
    })
}

/// Bytes a device of `kind` needing `need` reserves: with the estimator's fit margin.
fn reserve(need: Bytes, kind: DeviceKind) -> u64 {
    need.get()
        .saturating_add(FitMargin::default_for(kind).for_need(need).get())
}

struct Columns<'a, 'u> {
    u: usize,
    unit: &'a Unit<'u>,
    fleet: &'a PlanFleet,
    classes: &'a [Class],
    estimates: usize,
    multisets: usize,
}

impl<'a, 'u> Columns<'a, 'u> {
    fn new(u: usize, unit: &'a Unit<'u>, fleet: &'a PlanFleet, classes: &'a [Class]) -> Self {
        assert!(
            unit.requirement.engines.is_empty()
                && unit.requirement.gpu.models.is_empty()
                && unit.requirement.gpu.nodes.is_empty(),
            "the oracle plans requirements without engine or GPU constraints"
        );
        Columns {
            u,
            unit,
            fleet,
            classes,
            estimates: 0,
            multisets: 0,
        }
    }

    fn estimate(
        &mut self,
        v: usize,
        engine: Engine,
        layout: Layout,
        cpu_stages: usize,
    ) -> Result<Option<Estimate>, String> {
        self.estimates += 1;
        if self.estimates > ESTIMATE_LIMIT {
            return Err(format!("more than {ESTIMATE_LIMIT} estimates for one replica"));
        }
        let request = EstimateRequest::new(engine, u64::from(self.unit.requirement.context))
            .with_concurrency(self.unit.concurrency)
            .with_kv_dtype(self.unit.kv_dtype)
            .with_layout(layout)
            .with_cpu_stages(cpu_stages)
            .without_details();
        Ok(estimate(&self.unit.info.shape, &self.unit.info.variants[v].weights, &request).ok())
    }

    fn all(mut self) -> Result<Vec<Column>, String> {
        let mut out = Vec::new();
        for &(v, tier) in &self.unit.allowed.clone() {
            let variant = &self.unit.info.variants[v];
            let cc = min_compute_capability(variant);
            let eligible: Vec<usize> = (0..self.classes.len())
                .filter(|&c| {
                    let class = &self.classes[c];
                    class.usable > 0 && class.compute_capability.is_none_or(|have| have >= cc)
                })
                .collect();
            if let Some(engine) = engine_for(variant.format()) {
                let mut on_gpus = self.one_node(v, tier, engine, &eligible)?;
                if engine.layer_split() {
                    // A split with a GPU that holds the variant alone is not minimal.
                    let alone: Vec<usize> = on_gpus
                        .iter()
                        .filter(|c| c.family == "single")
                        .map(|c| c.take[0].0)
                        .collect();
                    let among: Vec<usize> = eligible.iter().copied().filter(|c| !alone.contains(c)).collect();
                    let splits = self.splits(v, tier, engine, &among)?;
                    on_gpus.extend(splits);
                }
                out.extend(on_gpus);
            }
            out.extend(self.on_cpu(v, tier)?);
        }
        Ok(out)
    }

    /// One GPU, and tensor parallel over one node's GPUs of one card.
    fn one_node(
        &mut self,
        v: usize,
        tier: skein_dsl::ir::Precision,
        engine: Engine,
        eligible: &[usize],
    ) -> Result<Vec<Column>, String> {
        let mut out = Vec::new();
        if let Some(e) = self.estimate(v, engine, Layout::single(), 0)? {
            let need = reserve(e.devices[0].total, e.devices[0].kind);
            for &c in eligible.iter().filter(|&&c| self.classes[c].usable >= need) {
                out.push(self.column(v, tier, "single", &e, &[c], &[(c, 1)]));
            }
        }
        if !engine.tensor_parallel() {
            return Ok(out);
        }
        for n in 0..self.fleet.nodes.len() {
            let mut names: Vec<&str> = eligible
                .iter()
                .filter(|&&c| self.classes[c].node == n)
                .map(|&c| self.classes[c].name.as_str())
                .collect();
            names.dedup();
            for name in names {
                let group: Vec<usize> = eligible
                    .iter()
                    .copied()
                    .filter(|&c| self.classes[c].node == n && self.classes[c].name == name)
                    .collect();
                let count: usize = group.iter().map(|&c| self.classes[c].gpus.len()).sum();
                for k in 2..=count.min(self.unit.max_gpus) {
                    let Some(e) = self.estimate(v, engine, Layout::tensor_parallel(k as u64), 0)? else {
                        continue;
                    };
                    let need = e.devices.iter().map(|d| reserve(d.total, d.kind)).max().unwrap_or(0);
                    let fitting: Vec<usize> = group
                        .iter()
                        .copied()
                        .filter(|&c| self.classes[c].usable >= need)
                        .collect();
                    multisets(&fitting, self.classes, k as u32, &mut |counts| {
                        let devices: Vec<usize> = counts
                            .iter()
                            .flat_map(|&(c, m)| std::iter::repeat_n(c, m as usize))
                            .collect();
                        out.push(self.column(v, tier, "tensor-parallel", &e, &devices, counts));
                    });
                }
            }
        }
        Ok(out)
    }

    /// Layer splits over `among`: every minimal multiset of its classes that holds the
    /// variant (no GPU fewer would), by size, up to [`MAX_SPLIT`] GPUs; across nodes only
    /// where the engine can.
    fn splits(
        &mut self,
        v: usize,
        tier: skein_dsl::ir::Precision,
        engine: Engine,
        among: &[usize],
    ) -> Result<Vec<Column>, String> {
        let Some(whole) = self.estimate(v, engine, Layout::single(), 0)? else {
            return Ok(Vec::new());
        };
        // No GPU holds less than its share of the weights: a cheap lower bound.
        let weights = whole.devices[0].weights.get();
        let mut fitting: Vec<Vec<(usize, u32)>> = Vec::new();
        let mut out = Vec::new();
        let most = (self.unit.max_gpus.min(MAX_SPLIT as usize)) as u32;
        for size in 2..=most {
            let mut sets = Vec::new();
            multisets(among, self.classes, size, &mut |counts| sets.push(counts.to_vec()));
            self.multisets += sets.len();
            if self.multisets > MULTISET_LIMIT {
                return Err(format!(
                    "more than {MULTISET_LIMIT} GPU multisets for one replica's splits"
                ));
            }
            for counts in sets {
                let capacity: u64 = counts.iter().map(|&(c, m)| self.classes[c].usable * u64::from(m)).sum();
                let contains = |small: &Vec<(usize, u32)>| {
                    small
                        .iter()
                        .all(|&(c, m)| counts.iter().any(|&(d, k)| d == c && k >= m))
                };
                if capacity < weights || fitting.iter().any(contains) {
                    continue;
                }
                // Nodes by the capacity taken on them, GPUs within by usable memory.
                let mut nodes: Vec<usize> = counts.iter().map(|&(c, _)| self.classes[c].node).collect();
                nodes.sort_unstable();
                nodes.dedup();
                if nodes.len() > 1 && !engine.across_nodes() {
                    continue;
                }
                let family = if nodes.len() > 1 { "cross-node" } else { "node-split" };
                let taken = |n: usize| -> u64 {
                    counts
                        .iter()
                        .filter(|&&(c, _)| self.classes[c].node == n)
                        .map(|&(c, m)| self.classes[c].usable * u64::from(m))
                        .sum()
                };
                nodes.sort_by(|&a, &b| taken(b).cmp(&taken(a)).then(a.cmp(&b)));
                let mut devices = Vec::new();
                for n in nodes {
                    let mut mine: Vec<(usize, u32)> = counts
                        .iter()
                        .copied()
                        .filter(|&(c, _)| self.classes[c].node == n)
                        .collect();
                    mine.sort_by(|a, b| {
                        self.classes[b.0]
                            .usable
                            .cmp(&self.classes[a.0].usable)
                            .then(a.0.cmp(&b.0))
                    });
                    for (c, m) in mine {
                        devices.extend(std::iter::repeat_n(c, m as usize));
                    }
                }
                let memory = devices.iter().map(|&c| Bytes::new(self.classes[c].usable)).collect();
                let Some(e) = self.estimate(v, engine, Layout::pipeline_by_memory(memory), 0)? else {
                    continue;
                };
                if e.devices.len() != devices.len() {
                    continue;
                }
                let needs: Vec<u64> = e.devices.iter().map(|d| reserve(d.total, d.kind)).collect();
                if needs
                    .iter()
                    .zip(&devices)
                    .any(|(need, &c)| *need > self.classes[c].usable)
                {
                    continue;
                }
                fitting.push(counts.clone());
                let mut column = self.column(v, tier, family, &e, &devices, &counts);
                // Each class's GPUs reserve the most any of them needs.
                for (c, _, need) in &mut column.take {
                    *need = devices
                        .iter()
                        .zip(&needs)
                        .filter(|(d, _)| **d == *c)
                        .map(|(_, n)| *n)
                        .max()
                        .unwrap_or(0);
                }
                out.push(column);
            }
        }
        Ok(out)
    }

    /// The whole model on a node's CPU, with each engine that can run it there.
    fn on_cpu(&mut self, v: usize, tier: skein_dsl::ir::Precision) -> Result<Vec<Column>, String> {
        let info = self.unit.info;
        let variant = &info.variants[v];
        let engines: Vec<Engine> = Engine::for_cpu(variant.format())
            .filter(|e| !e.builtin() || info.builtin_engine_loads(variant))
            .collect();
        let mut out = Vec::new();
        for engine in engines {
            let Some(e) = self.estimate(v, engine, Layout::single(), 1)? else {
                continue;
            };
            let host = reserve(e.devices[0].total, e.devices[0].kind) + e.host.get();
            let gguf = variant.format() == WeightFormat::Gguf;
            let tied = e.engine.embedding_in_host_ram() && info.shape.tied_embeddings;
            for (n, node) in self
                .fleet
                .nodes
                .iter()
                .enumerate()
                .filter(|(_, node)| node.host_free >= host)
            {
                let speed = DeviceSpeed {
                    node: n,
                    bandwidth: node.host_bandwidth * host_speed_factor(engine, gguf),
                    extra_read: if tied { e.host.get() as f64 } else { 0.0 },
                    nvlink_stage: false,
                    gpu: false,
                };
                let parts = ScoreParts {
                    tier,
                    cpu: true,
                    offload: false,
                    degraded: 0,
                    gpus: 0,
                    nodes: 1,
                    tokens_per_s: tokens_per_second(&e, info.shape.hidden, &[speed], &[]),
                    measured: false,
                    card_gib: 0,
                };
                let prefer = self.unit.requirement.prefer;
                out.push(Column {
                    unit: self.u,
                    variant: v,
                    family: "cpu",
                    take: Vec::new(),
                    host: Some((n, host)),
                    score: parts.score(prefer),
                    score_cardless: parts.score(prefer),
                    card_gib: 0,
                });
            }
        }
        Ok(out)
    }

    /// The column of estimate `e` on `devices` (classes, in layout order), taking
    /// `counts` of each class.
    fn column(
        &self,
        v: usize,
        tier: skein_dsl::ir::Precision,
        family: &'static str,
        e: &Estimate,
        devices: &[usize],
        counts: &[(usize, u32)],
    ) -> Column {
        let classes = self.classes;
        let speeds: Vec<DeviceSpeed> = devices
            .iter()
            .enumerate()
            .map(|(i, &c)| {
                let stage = e.devices[i].stage;
                let peers = (0..devices.len()).any(|j| j != i && e.devices[j].stage == stage);
                DeviceSpeed {
                    node: classes[c].node,
                    bandwidth: classes[c].bandwidth * BANDWIDTH_EFFICIENCY,
                    extra_read: 0.0,
                    nvlink_stage: !peers || classes[c].linked,
                    gpu: true,
                }
            })
            .collect();
        // Stage boundaries between nodes: the slower end's link, and half the round trip
        // through the orchestrator (0.1 ms when not measured) one way.
        let mut stage_nodes: Vec<usize> = Vec::new();
        for (d, &c) in e.devices.iter().zip(devices) {
            if stage_nodes.len() == d.stage {
                stage_nodes.push(classes[c].node);
            }
        }
        let hops: Vec<Option<Hop>> = stage_nodes
            .windows(2)
            .map(|w| {
                (w[0] != w[1]).then(|| {
                    let (a, b) = (&self.fleet.nodes[w[0]], &self.fleet.nodes[w[1]]);
                    let latency_ms = match (a.rtt_ms, b.rtt_ms) {
                        (Some(x), Some(y)) => (x + y) / 2.0,
                        _ => 0.1,
                    };
                    Hop {
                        bits_per_s: a.network_bps.min(b.network_bps),
                        latency_s: latency_ms / 1000.0,
                    }
                })
            })
            .collect();
        let mut nodes: Vec<usize> = devices.iter().map(|&c| classes[c].node).collect();
        nodes.sort_unstable();
        nodes.dedup();
        let card_bytes: u64 = devices.iter().map(|&c| classes[c].total).sum();
        let parts = ScoreParts {
            tier,
            cpu: false,
            offload: false,
            degraded: devices.iter().filter(|&&c| classes[c].degraded).count() as u32,
            gpus: devices.len() as u32,
            nodes: nodes.len() as u32,
            tokens_per_s: tokens_per_second(e, self.unit.info.shape.hidden, &speeds, &hops),
            measured: false,
            card_gib: card_bytes >> 30,
        };
        let prefer = self.unit.requirement.prefer;
        let need = e.devices.iter().map(|d| reserve(d.total, d.kind)).max().unwrap_or(0);
        // The serving engine's node keeps its host-side memory: the last stage's for an
        // engine that serves from it across nodes, else the first device's.
        let serving = if family == "cross-node" && e.engine.serves_from_last_stage() {
            devices[devices.len() - 1]
        } else {
            devices[0]
        };
        Column {
            unit: self.u,
            variant: v,
            family,
            take: counts.iter().map(|&(c, m)| (c, m, need)).collect(),
            host: (e.host.get() > 0).then(|| (classes[serving].node, e.host.get())),
            score: parts.score(prefer),
            score_cardless: ScoreParts { card_gib: 0, ..parts }.score(prefer),
            card_gib: parts.card_gib,
        }
    }
}

/// A multiset of GPUs: (class, count) pairs.
type Counts = [(usize, u32)];

/// Calls `f` with every multiset of `size` GPUs over `classes` (each class at most its
/// GPUs), as (class, count) pairs in class order.
fn multisets(among: &[usize], classes: &[Class], size: u32, f: &mut dyn FnMut(&Counts)) {
    fn go(among: &[usize], classes: &[Class], left: u32, acc: &mut Vec<(usize, u32)>, f: &mut dyn FnMut(&Counts)) {
        if left == 0 {
            f(acc);
            return;
        }
        let Some((&c, rest)) = among.split_first() else {
            return;
        };
        let most = left.min(classes[c].gpus.len() as u32);
        for m in (1..=most).rev() {
            acc.push((c, m));
            go(rest, classes, left - m, acc, f);
            acc.pop();
        }
        go(rest, classes, left, acc, f);
    }
    go(among, classes, size, &mut Vec::new(), f);
}

const MIB: u64 = 1 << 20;

impl Problem {
    /// The `y` variables after the columns': (column, class, GPU of the class) for
    /// every GPU of every class a column takes.
    fn assignments(&self) -> Vec<(usize, usize, usize)> {
        let mut y = Vec::new();
        for (k, col) in self.columns.iter().enumerate() {
            for &(c, _, _) in &col.take {
                for i in 0..self.classes[c].gpus.len() {
                    y.push((k, c, i));
                }
            }
        }
        y
    }

    /// The program for `tests/engines/lexmip.py`.
    pub fn program(&self, time_limit_s: f64) -> Value {
        let z = self.columns.len();
        let y = self.assignments();
        let mut rows = Vec::new();
        for u in 0..self.units {
            let index: Vec<usize> = (0..z).filter(|&k| self.columns[k].unit == u).collect();
            if !index.is_empty() {
                rows.push(json!({"lower": null, "upper": 1, "value": vec![1.0; index.len()], "index": index}));
            }
        }
        for (k, col) in self.columns.iter().enumerate() {
            for &(c, m, _) in &col.take {
                let mut index = vec![k];
                let mut value = vec![-f64::from(m)];
                for (j, &(kk, cc, _)) in y.iter().enumerate() {
                    if kk == k && cc == c {
                        index.push(z + j);
                        value.push(1.0);
                    }
                }
                rows.push(json!({"lower": 0, "upper": 0, "index": index, "value": value}));
            }
        }
        for (c, class) in self.classes.iter().enumerate() {
            for i in 0..class.gpus.len() {
                let mut index = Vec::new();
                let mut value = Vec::new();
                for (j, &(k, cc, ii)) in y.iter().enumerate() {
                    if cc == c && ii == i {
                        let need = self.columns[k].take.iter().find(|t| t.0 == c).map_or(0, |t| t.2);
                        index.push(z + j);
                        value.push(need.div_ceil(MIB) as f64);
                    }
                }
                if !index.is_empty() {
                    rows.push(
                        json!({"lower": null, "upper": (class.usable / MIB) as f64, "index": index, "value": value}),
                    );
                }
            }
        }
        for (n, free) in self.host_free.iter().enumerate() {
            let (index, value): (Vec<usize>, Vec<f64>) = self
                .columns
                .iter()
                .enumerate()
                .filter_map(|(k, col)| col.host.filter(|h| h.0 == n).map(|h| (k, h.1.div_ceil(MIB) as f64)))
                .unzip();
            if !index.is_empty() {
                rows.push(json!({"lower": null, "upper": (free / MIB) as f64, "index": index, "value": value}));
            }
        }
        let all: Vec<usize> = (0..z).collect();
        // The score's lowest level but the card size is worth 1e10 (docs/placement.md).
        let level: Vec<f64> = self.columns.iter().map(|c| c.score_cardless as f64 / 1e10).collect();
        let cards: Vec<f64> = self.columns.iter().map(|c| -(c.card_gib as f64)).collect();
        json!({
            "columns": z + y.len(),
            "rows": rows,
            "objectives": [
                {"index": all, "value": vec![1.0; z]},
                {"index": all, "value": level},
                {"index": all, "value": cards},
            ],
            "time_limit": time_limit_s,
        })
    }

    /// The optimum in a solution of [`Problem::program`], checked against the problem:
    /// at most one column per replica, no GPU or host over its memory.
    pub fn optimum(&self, solution: &Value) -> Result<Optimum, String> {
        let status = solution["status"].as_str().unwrap_or("missing");
        if status != "optimal" {
            return Err(format!("HiGHS did not solve the program: {status}"));
        }
        let values = solution["values"].as_array().ok_or("no values")?;
        let chosen: Vec<usize> = (0..self.columns.len())
            .filter(|&k| values[k].as_f64() == Some(1.0))
            .collect();
        let mut units = vec![0; self.units];
        let mut host = vec![0u64; self.host_free.len()];
        for &k in &chosen {
            let col = &self.columns[k];
            units[col.unit] += 1;
            if let Some((n, bytes)) = col.host {
                host[n] += bytes;
            }
        }
        if units.iter().any(|&n| n > 1) {
            return Err("a replica placed twice".into());
        }
        // Each chosen column takes its count of each class's GPUs, and no GPU holds more
        // than its usable memory.
        let z = self.columns.len();
        let mut taken: Vec<Vec<u32>> = vec![vec![0; self.classes.len()]; z];
        let mut gpu: Vec<Vec<u64>> = self.classes.iter().map(|c| vec![0; c.gpus.len()]).collect();
        for (j, &(k, c, i)) in self.assignments().iter().enumerate() {
            if values[z + j].as_f64() == Some(1.0) {
                let need = self.columns[k].take.iter().find(|t| t.0 == c).map_or(0, |t| t.2);
                taken[k][c] += 1;
                gpu[c][i] += need;
            }
        }
        for (k, col) in self.columns.iter().enumerate() {
            let on = chosen.contains(&k);
            if col.take.iter().any(|&(c, m, _)| taken[k][c] != if on { m } else { 0 }) {
                return Err(format!("column {k} takes the wrong GPUs"));
            }
        }
        for (c, class) in self.classes.iter().enumerate() {
            if gpu[c].iter().any(|&bytes| bytes > class.usable) {
                return Err(format!("a GPU of class {c} over its memory"));
            }
        }
        if host.iter().zip(&self.host_free).any(|(used, free)| used > free) {
            return Err("a host over its memory".into());
        }
        Ok(Optimum {
            placed: chosen.len(),
            score: chosen.iter().map(|&k| i128::from(self.columns[k].score)).sum(),
            chosen,
        })
    }
}

/// Solves `programs` with HiGHS (`tests/engines/lexmip.py` in the venv of
/// `tests/engines/highs.sh`), in one process.
pub fn solve(programs: &[Value]) -> Vec<Value> {
    let python = skein_testkit::tools::prepared("highs.sh");
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/engines/lexmip.py");
    let dir = tempfile::tempdir().expect("a temporary folder");
    let input = dir.path().join("programs.json");
    let output = dir.path().join("solutions.json");
    std::fs::write(&input, serde_json::to_vec(programs).expect("JSON")).expect("writes the programs");
    let mut command = std::process::Command::new(python);
    command.arg(&script).arg(&input).arg(&output);
    let ran = skein_testkit::process::output_within(&mut command, std::time::Duration::from_secs(1200), "HiGHS");
    assert!(
        ran.status.success(),
        "lexmip.py failed ({}):\n{}",
        ran.status,
        String::from_utf8_lossy(&ran.stderr)
    );
    serde_json::from_slice(&std::fs::read(&output).expect("reads the solutions")).expect("solutions are JSON")
}
