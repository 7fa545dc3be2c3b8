//! The reasons shown with a plan: why each choice, the best two candidates not taken,
//! and, for a replica that could not be placed, what it needs against what is free.

use std::cell::OnceCell;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use skein_dsl::ir::{EngineChoice, Preference};
use skein_model_registry::ModelTask;
use skein_model_registry::catalog::ModelInfo;

use super::demand::{Instance, VariantUse, variant_use};
use super::fleet::PlanFleet;
use super::lora;
use super::options::{self, Cand, CandList, Dev, Family, FleetState, Need, State, Unit};
use super::{
    Objective, Plan, PlanInput, Planned, PlannedDevice, PlannedInstance, Rejected, SearchStats, Unplaced,
    planned_layout, remote_agents, show,
};

/// The plan, with its reasons.
pub(crate) fn render(
    input: &PlanInput<'_>,
    instances: &[Instance],
    infos: &[&ModelInfo],
    fleet: &PlanFleet,
    initial: &State,
    planned: &Planned<'_>,
) -> Plan {
    // Which instance holds each device in the plan.
    let mut owners: BTreeMap<Dev, String> = BTreeMap::new();
    for (pu, chosen) in planned.units.iter().zip(&planned.outcome.chosen) {
        if let Some(c) = chosen {
            for d in &c.devices {
                owners.insert(*d, label(&instances[pu.instance].name, pu.replica, pu.replicas));
            }
        }
    }
    let mut placed = Vec::new();
    let mut unplaced = Vec::new();
    for (pu, chosen) in planned.units.iter().zip(&planned.outcome.chosen) {
        let instance = &instances[pu.instance];
        let info = infos[pu.instance];
        let unit = &pu.unit;
        let alone = Alone::new(unit, fleet, initial);
        match chosen {
            Some(c) => {
                let me = label(&instance.name, pu.replica, pu.replicas);
                placed.push(PlannedInstance {
                    instance: instance.name.clone(),
                    agents: instance.agents.clone(),
                    model: instance.requirement.repo.clone(),
                    replica: pu.replica,
                    replicas: pu.replicas,
                    context: u64::from(instance.requirement.context),
                    concurrency: unit.concurrency,
                    variant: info.variants[c.variant].id.clone(),
                    precision: c.tier,
                    quantization: info.variants[c.variant].quantization.to_string(),
                    engine: c.estimate.engine.name().to_owned(),
                    family: c.family.name().to_owned(),
                    layout: planned_layout(c),
                    devices: devices(fleet, initial, c),
                    tokens_per_s: (c.parts.tokens_per_s * 10.0).round() / 10.0,
                    slow: matches!(c.family, Family::Offload | Family::Cpu),
                    score: c.score,
                    adapters: lora::planned_adapters(instance, input.adapters),
                    task: info.task,
                    why: {
                        let mut lines = why(unit, info, fleet, c, &alone, &owners, &me);
                        lines.extend(lora::adapters_line(instance, c));
                        lines.extend(embedding_line(info, c.estimate.engine.name()));
                        lines.extend(tools_line(
                            input.workflow,
                            &instance.agents,
                            info,
                            c.estimate.engine.name(),
                        ));
                        lines
                    },
                    rejected: rejected(unit, info, fleet, c, &alone, &owners, &me),
                    estimate: Some(unit.detailed_estimate(c)),
                });
            }
            None => unplaced.push(Unplaced {
                instance: instance.name.clone(),
                agents: instance.agents.clone(),
                replica: pu.replica,
                reason: unplaced_reason(unit, info, fleet, initial, &alone),
            }),
        }
    }
    let admitted = planned.admitted;
    let queued_reason = (!admitted).then(|| {
        let names: Vec<String> = unplaced
            .iter()
            .map(|u| format!("{} ({})", u.instance, u.reason))
            .collect();
        format!("not every instance fits, so nothing starts: {}", names.join("; "))
    });
    Plan {
        workflow: input.workflow.name.clone(),
        priority: input.workflow.placement.priority,
        graph_version: input.graph.version,
        admitted,
        queued_reason,
        instances: placed,
        remote: remote_agents(input.workflow),
        unplaced,
        preempted: Vec::new(),
        excluded: fleet.excluded.clone(),
        objective: Objective {
            placed: planned.outcome.placed,
            score: planned.outcome.score,
        },
        search: SearchStats {
            steps: planned.outcome.steps,
            complete: planned.outcome.complete,
        },
        settings: input.settings,
    }
}

/// What the plan says of an embedding model: how its engine starts, with which pooling,
/// and where its requests go; the built-in engine, which only generates, is left out.
fn embedding_line(info: &ModelInfo, engine: &str) -> Option<String> {
    let ModelTask::Embed { pooling } = info.task else {
        return None;
    };
    let start = match (engine, pooling) {
        ("vllm", _) => "vLLM starts with `--runner pooling` and reads the pooling from the model".to_owned(),
        (_, Some(p)) => format!("llama.cpp starts with `--embeddings --pooling {}`", p.name()),
        (_, None) => "llama.cpp starts with `--embeddings` and the pooling its GGUF file states".to_owned(),
    };
    Some(format!(
        "an embedding model: {start}; it answers POST /v1/embeddings (the built-in engine only generates, so it is not a choice)"
    ))
}

/// What the plan says of tool calls when some of `agents` list tools. vLLM reads calls
/// with the parser of the model's family (`--tool-call-parser`): the plan names it, or
/// says the model cannot call tools there (its agents then get answers without calls).
/// llama.cpp (`--jinja`) and the built-in engine render tools and read calls with the
/// model's own chat template, which the plan does not read: it says so.
fn tools_line(workflow: &skein_dsl::Workflow, agents: &[String], info: &ModelInfo, engine: &str) -> Option<String> {
    let with_tools: Vec<&str> = agents
        .iter()
        .filter(|a| workflow.agents.get(*a).is_some_and(|a| !a.tools.is_empty()))
        .map(String::as_str)
        .collect();
    if with_tools.is_empty() {
        return None;
    }
    let architecture = info.architecture();
    let who = with_tools.join(", ");
    if engine != EngineChoice::Vllm.plan_name() {
        return Some(format!(
            "tools of {who}: {engine} renders the tools and reads the calls with this model's own chat template; a template that takes no tools gives answers without calls, which end the agent loops at the first answer"
        ));
    }
    Some(match super::tool_call_format(architecture) {
        Some(format) => {
            format!("tools of {who}: {engine} reads this {architecture:?} model's calls in the `{format}` format")
        }
        None => format!(
            "tools of {who}: this {architecture:?} model cannot call tools on {engine} (no tool-call format for its family), so its agent loops end at the first answer; choose a Qwen2, Llama 3 or Mistral model for an agent with tools"
        ),
    })
}

fn label(name: &str, replica: u32, replicas: u32) -> String {
    if replicas > 1 {
        format!("{name} (replica {replica})")
    } else {
        name.to_owned()
    }
}

fn devices(fleet: &PlanFleet, initial: &State, c: &Cand) -> Vec<PlannedDevice> {
    c.devices
        .iter()
        .zip(&c.estimate.devices)
        .zip(&c.reserve)
        .map(|((d, e), reserved)| {
            let node = &fleet.nodes[d.node];
            let (gpu, name, usable) = match d.gpu {
                Some(p) => (
                    Some(node.gpus[p].index),
                    node.gpus[p].name.clone(),
                    initial.usable[d.node][p],
                ),
                None => (None, "host".to_owned(), initial.host[d.node]),
            };
            PlannedDevice {
                node: node.name.clone(),
                gpu,
                name,
                stage: e.stage,
                rank: e.rank,
                layers: e.layers.to_string(),
                need: e.total.get(),
                reserved: *reserved,
                usable,
            }
        })
        .collect()
}

/// `a100-box gpu 0,1 + rtx-1 gpu 2`, `old-1 host`.
pub fn where_(fleet: &PlanFleet, devices: &[Dev]) -> String {
    let mut by_node: BTreeMap<usize, Vec<String>> = BTreeMap::new();
    for d in devices {
        let entry = by_node.entry(d.node).or_default();
        match d.gpu {
            Some(p) => entry.push(fleet.nodes[d.node].gpus[p].index.to_string()),
            None => entry.push("host".to_owned()),
        }
    }
    by_node
        .into_iter()
        .map(|(n, list)| {
            let node = &fleet.nodes[n].name;
            if list == ["host"] {
                format!("{node} host")
            } else {
                let gpus: Vec<String> = list.into_iter().filter(|x| x != "host").collect();
                format!("{node} gpu {}", gpus.join(","))
            }
        })
        .collect::<Vec<_>>()
        .join(" + ")
}

fn card_names(fleet: &PlanFleet, devices: &[Dev]) -> String {
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for d in devices {
        let name = match d.gpu {
            Some(p) => short_name(&fleet.nodes[d.node].gpus[p].name),
            None => "host RAM",
        };
        *counts.entry(name).or_default() += 1;
    }
    counts
        .into_iter()
        .map(|(n, c)| if c > 1 { format!("{c}× {n}") } else { n.to_owned() })
        .collect::<Vec<_>>()
        .join(" + ")
}

fn short_name(name: &str) -> &str {
    name.strip_prefix("NVIDIA GeForce ")
        .or_else(|| name.strip_prefix("NVIDIA "))
        .or_else(|| name.strip_prefix("Tesla "))
        .unwrap_or(name)
}

/// One line describing a candidate.
pub fn summary(info: &ModelInfo, fleet: &PlanFleet, c: &Cand) -> String {
    format!(
        "{} ({}) · {} {} on {} [{}] · {:.0} tok/s",
        info.variants[c.variant].id,
        c.tier,
        c.estimate.engine.name(),
        c.family.name(),
        card_names(fleet, &c.devices),
        where_(fleet, &c.devices),
        c.parts.tokens_per_s
    )
}

/// A unit's candidates on the untouched fleet, best first: those on GPUs, then the last
/// resorts, computed only when a reason reads past every candidate on GPUs.
struct Alone<'x, 'a> {
    unit: &'x Unit<'a>,
    fleet: &'x PlanFleet,
    state: &'x State,
    gpu: Arc<CandList>,
    last_resorts: OnceCell<Arc<CandList>>,
}

impl<'x, 'a> Alone<'x, 'a> {
    fn new(unit: &'x Unit<'a>, fleet: &'x PlanFleet, state: &'x State) -> Self {
        Alone {
            unit,
            fleet,
            state,
            gpu: unit.gpu_candidates(FleetState::new(fleet, state)),
            last_resorts: OnceCell::new(),
        }
    }

    fn iter(&self) -> impl Iterator<Item = Cand> + '_ {
        let rest = std::iter::once(()).flat_map(move |()| {
            self.last_resorts
                .get_or_init(|| self.unit.last_resorts(FleetState::new(self.fleet, self.state)))
                .iter()
        });
        self.gpu.iter().chain(rest)
    }
}

fn distinct_key(c: &Cand) -> (usize, Family, &'static str, u32, BTreeSet<usize>) {
    (
        c.variant,
        c.family,
        c.estimate.engine.name(),
        c.parts.gpus,
        c.devices.iter().map(|d| d.node).collect(),
    )
}

#[allow(clippy::too_many_arguments)]
fn rejected(
    unit: &Unit<'_>,
    info: &ModelInfo,
    fleet: &PlanFleet,
    chosen: &Cand,
    alone: &Alone<'_, '_>,
    owners: &BTreeMap<Dev, String>,
    me: &str,
) -> Vec<Rejected> {
    let mut seen = BTreeSet::from([distinct_key(chosen)]);
    let mut out = Vec::new();
    for c in alone.iter() {
        if out.len() == 2 {
            break;
        }
        // One per variant and family and nodes: the next best of a kind, not its twins.
        if !seen.insert(distinct_key(&c)) {
            continue;
        }
        out.push(Rejected {
            option: summary(info, fleet, &c),
            why: why_not(unit.prefer(), fleet, &c, chosen, owners, me),
        });
    }
    out
}

fn why_not(
    prefer: Preference,
    fleet: &PlanFleet,
    r: &Cand,
    c: &Cand,
    owners: &BTreeMap<Dev, String>,
    me: &str,
) -> String {
    if r.score > c.score {
        let mut takers: BTreeSet<&str> = BTreeSet::new();
        for d in &r.devices {
            if let Some(o) = owners.get(d)
                && o != me
            {
                takers.insert(o);
            }
        }
        return if takers.is_empty() {
            "better alone, but it does not fit beside the workflow's other instances".to_owned()
        } else {
            format!(
                "better alone, but its GPUs went to {} (the best plan for the whole workflow)",
                takers.into_iter().collect::<Vec<_>>().join(", ")
            )
        };
    }
    let (a, b) = (&r.parts, &c.parts);
    if a.cpu && !b.cpu {
        return "runs on the CPU: a last resort, slow".to_owned();
    }
    if a.offload && !b.offload {
        return "offloads layers to host RAM: a last resort, slow".to_owned();
    }
    if a.degraded > b.degraded {
        let bad: Vec<String> = r
            .devices
            .iter()
            .filter_map(|d| {
                let g = &fleet.nodes[d.node].gpus[d.gpu?];
                g.degraded
                    .then(|| format!("{} gpu {}", fleet.nodes[d.node].name, g.index))
            })
            .collect();
        return format!(
            "uses degraded GPUs ({}): avoided while healthy ones fit",
            bad.join(", ")
        );
    }
    let tier = || (a.tier < b.tier).then(|| format!("lower precision ({} < {})", a.tier, b.tier));
    let gpus = || (a.gpus > b.gpus).then(|| format!("uses {} GPUs, not {}", a.gpus, b.gpus));
    let speed = || {
        (a.tokens_per_s < b.tokens_per_s).then(|| {
            let how = |m: bool| if m { "measured" } else { "modelled" };
            if a.measured == b.measured {
                format!(
                    "slower: {:.0} vs {:.0} tokens/s {}",
                    a.tokens_per_s,
                    b.tokens_per_s,
                    how(a.measured)
                )
            } else {
                format!(
                    "slower: {:.0} tokens/s {} vs {:.0} {}",
                    a.tokens_per_s,
                    how(a.measured),
                    b.tokens_per_s,
                    how(b.measured)
                )
            }
        })
    };
    let order: [&dyn Fn() -> Option<String>; 3] = match prefer {
        Preference::Quality => [&tier, &gpus, &speed],
        Preference::Speed => [&speed, &tier, &gpus],
        Preference::FewestGpus => [&gpus, &tier, &speed],
    };
    for reason in order {
        if let Some(r) = reason() {
            return r;
        }
    }
    if a.card_gib > b.card_gib {
        return format!(
            "uses larger cards ({} GiB against {} GiB), which stay free for larger models",
            a.card_gib, b.card_gib
        );
    }
    "an equal score: ties go to the better variant, then the first GPUs by node and index".to_owned()
}

fn why(
    unit: &Unit<'_>,
    info: &ModelInfo,
    fleet: &PlanFleet,
    c: &Cand,
    alone: &Alone<'_, '_>,
    owners: &BTreeMap<Dev, String>,
    me: &str,
) -> Vec<String> {
    let mut lines = Vec::new();
    let best_tier = unit.allowed.iter().map(|(_, t)| *t).max();
    let preference = match unit.prefer() {
        Preference::Quality => "quality",
        Preference::Speed => "speed",
        Preference::FewestGpus => "fewest GPUs",
    };
    if Some(c.tier) == best_tier {
        lines.push(format!(
            "{} is the highest precision allowed (preference: {preference})",
            c.tier
        ));
    } else if let Some(top) = best_tier {
        match alone.iter().find(|x| x.tier > c.tier) {
            Some(better) => {
                let id = &info.variants[better.variant].id;
                lines.push(if better.parts.cpu && !c.parts.cpu {
                    format!("{id} ({}) fits only on the CPU: a last resort, slow", better.tier)
                } else if better.parts.offload && !c.parts.offload {
                    format!(
                        "{id} ({}) fits only with layers in host RAM: a last resort, slow",
                        better.tier
                    )
                } else {
                    let reason = why_not(unit.prefer(), fleet, &better, c, owners, me);
                    format!(
                        "{id} ({}) fits on its own, but {}",
                        better.tier,
                        reason.strip_prefix("better alone, but ").unwrap_or(&reason)
                    )
                });
            }
            None => {
                let above: Vec<String> = unit
                    .allowed
                    .iter()
                    .filter(|(_, t)| *t > c.tier)
                    .filter_map(|(v, t)| {
                        let need = unit.single_need(*v)?.bytes;
                        Some(format!(
                            "{} ({t}) needs {} on one GPU",
                            info.variants[*v].id,
                            show(need)
                        ))
                    })
                    .take(2)
                    .collect();
                lines.push(format!(
                    "no free GPU set holds a variant above {} (best allowed: {top}){}{}",
                    c.tier,
                    if above.is_empty() { "" } else { ": " },
                    above.join("; ")
                ));
            }
        }
    }
    let most = c.reserve.iter().copied().max().unwrap_or(0);
    let layout = &c.estimate.layout;
    let placement = match c.family {
        Family::Single => format!("fits one GPU: needs {} with margin", show(most)),
        Family::TensorParallel => {
            let nvlink = c
                .devices
                .iter()
                .all(|d| d.gpu.is_some_and(|p| fleet.nodes[d.node].gpus[p].nvlink != 0));
            format!(
                "tensor parallel over {} GPUs{}: {} per GPU with margin",
                layout.tensor_parallel,
                if nvlink { " joined by NVLink" } else { " over PCIe" },
                show(most)
            )
        }
        Family::NodeSplit | Family::CrossNode => {
            let layers = planned_layout(c).layer_partition;
            let nodes: BTreeSet<usize> = c.devices.iter().map(|d| d.node).collect();
            let network = if nodes.len() > 1 {
                let slowest = nodes.iter().map(|&n| &fleet.nodes[n]).min_by_key(|n| n.network_bps);
                let assumed = slowest.is_some_and(|n| !n.network_known);
                match options::network_cost(fleet, c, info.shape.hidden) {
                    Some(cost) => {
                        let per_token_ms = if c.parts.tokens_per_s > 0.0 {
                            1000.0 / c.parts.tokens_per_s
                        } else {
                            0.0
                        };
                        let ms = cost.seconds_per_token * 1000.0;
                        format!(
                            "; the network costs {ms:.2} ms of the {per_token_ms:.1} ms each token takes ({:.1} %): {} hop{} between nodes, {} bytes of activations each, over {} Gb/s{}",
                            if per_token_ms > 0.0 {
                                100.0 * ms / per_token_ms
                            } else {
                                0.0
                            },
                            cost.hops,
                            if cost.hops == 1 { "" } else { "s" },
                            cost.bytes_per_hop,
                            cost.slowest_bits_per_s / 1_000_000_000,
                            if assumed { " (assumed)" } else { "" }
                        )
                    }
                    None => String::new(),
                }
            } else {
                String::new()
            };
            format!(
                "no single GPU{} holds it: layers split {:?} in proportion to usable memory (TP {} × {} stages){network}",
                if c.family == Family::CrossNode {
                    " or node"
                } else {
                    " or tensor-parallel group"
                },
                layers,
                layout.tensor_parallel,
                layout.stages.count()
            )
        }
        Family::Offload => {
            let l = planned_layout(c);
            let ngl = l.gpu_layers.unwrap_or(0);
            format!(
                "no GPU set holds any allowed variant: the first {} layers in host RAM, the last {} and the output on GPUs (llama.cpp -ngl {ngl}), slow",
                l.layer_partition.first().copied().unwrap_or(0),
                ngl.saturating_sub(1),
            )
        }
        Family::Cpu => format!(
            "no GPU can serve it: the whole model on the CPU with {} in {} of host RAM, slow",
            engine_label(c.estimate.engine.name()),
            show(most + c.host_extra)
        ),
    };
    lines.push(placement);
    if let Some(line) = engines_ruled_out(unit) {
        lines.push(line);
    }
    let measured = c
        .parts
        .measured
        .then(|| {
            let node = &fleet.nodes[c.devices.first()?.node];
            let placement = options::speed_placement(c.family.name(), c.devices.len());
            let variant = &unit.info.variants[c.variant].id;
            let m = node
                .measured
                .iter()
                .find(|m| m.engine == c.estimate.engine.name() && m.variant == *variant && m.placement == placement)?;
            Some(format!(
                "measured decode speed {:.0} tokens/s per sequence (mean of {} answer{} on {}; {} sequence{} at once)",
                m.tokens_per_s,
                m.samples,
                if m.samples == 1 { "" } else { "s" },
                node.name,
                unit.concurrency,
                if unit.concurrency == 1 { "" } else { "s" }
            ))
        })
        .flatten();
    lines.push(measured.unwrap_or_else(|| {
        format!(
            "modelled decode speed {:.0} tokens/s per sequence ({} sequence{} at once)",
            c.parts.tokens_per_s,
            unit.concurrency,
            if unit.concurrency == 1 { "" } else { "s" }
        )
    }));
    for d in &c.devices {
        if let Some(p) = d.gpu {
            let g = &fleet.nodes[d.node].gpus[p];
            if let Some(note) = &g.speed_note {
                lines.push(format!("{} gpu {}: {note}", fleet.nodes[d.node].name, g.index));
            }
            if g.degraded {
                lines.push(format!(
                    "{} gpu {} is degraded; used because nothing healthy fits",
                    fleet.nodes[d.node].name, g.index
                ));
            }
        }
    }
    lines
}

/// The built-in engine is `candle` in plans and `builtin` in workflows.
fn engine_label(plan_name: &str) -> &str {
    if plan_name == "candle" {
        "the built-in engine (candle)"
    } else {
        plan_name
    }
}

/// The engines that could have served one of the accepted formats but the workflow's
/// `engines:` rules out, as a line of the plan's reasons; `None` when it rules none out.
fn engines_ruled_out(unit: &Unit<'_>) -> Option<String> {
    let allowed = &unit.requirement.engines;
    if allowed.is_empty() {
        return None;
    }
    let out: Vec<&str> = EngineChoice::ALL
        .iter()
        .filter(|e| !allowed.contains(e) && unit.requirement.formats.iter().any(|f| e.loads(*f)))
        .map(|e| e.name())
        .collect();
    if out.is_empty() {
        return None;
    }
    let names: Vec<&str> = allowed.iter().map(|e| e.name()).collect();
    Some(format!(
        "ruled out by the workflow (engines: {}): {}",
        names.join(", "),
        out.join(", ")
    ))
}

fn unplaced_reason(
    unit: &Unit<'_>,
    info: &ModelInfo,
    fleet: &PlanFleet,
    initial: &State,
    alone: &Alone<'_, '_>,
) -> String {
    if unit.allowed.is_empty() {
        let reasons: BTreeSet<String> = info
            .variants
            .iter()
            .filter_map(|v| match variant_use(unit.requirement, v) {
                VariantUse::Excluded(r) => Some(r),
                VariantUse::Allowed(_) => None,
            })
            .collect();
        return if reasons.is_empty() {
            "the model has no variant Skein can load".to_owned()
        } else {
            format!(
                "no variant is allowed: {}",
                reasons.into_iter().collect::<Vec<_>>().join("; ")
            )
        };
    }
    if let Some(best) = alone.iter().next() {
        return format!(
            "fits alone ({}) but not beside the workflow's other instances",
            summary(info, fleet, &best)
        );
    }
    let eligible: Vec<(usize, usize)> = fleet
        .nodes
        .iter()
        .enumerate()
        .flat_map(|(n, node)| (0..node.gpus.len()).map(move |p| (n, p)))
        .filter(|&(n, p)| unit.gpu_allowed(fleet, n, p))
        .collect();
    let mut parts = Vec::new();
    let (v0, tier0) = unit.allowed[0];
    match unit.single_need(v0) {
        Some(Need { bytes: need, .. }) => parts.push(format!(
            "needs {} at {tier0} ({}) on one GPU",
            show(need),
            info.variants[v0].id
        )),
        None => parts.push(format!("{} ({tier0}) cannot be estimated", info.variants[v0].id)),
    }
    let cpu_ruled_out = unit.allowed.iter().all(|(v, _)| unit.cpu_engines(*v).is_empty());
    if eligible.is_empty() && cpu_ruled_out {
        let names: Vec<&str> = unit.requirement.engines.iter().map(|e| e.name()).collect();
        parts.push(format!(
            "no usable GPU meets the agent's gpu constraints, and the CPU is ruled out by the workflow (engines: {}): \
             only builtin and llama.cpp run there",
            names.join(", ")
        ));
    } else if eligible.is_empty() {
        parts.push(
            "no usable GPU meets the agent's gpu constraints, and the CPU is not allowed or too small".to_owned(),
        );
    } else {
        let largest_gpu = eligible.iter().map(|&(n, p)| initial.usable[n][p]).max().unwrap_or(0);
        let mut group = 0u64;
        let mut node_total = 0u64;
        for (n, node) in fleet.nodes.iter().enumerate() {
            let mine: Vec<usize> = (0..node.gpus.len())
                .filter(|&p| unit.gpu_allowed(fleet, n, p))
                .collect();
            node_total = node_total.max(mine.iter().map(|&p| initial.usable[n][p]).sum());
            for &p in &mine {
                let linked: u64 = mine
                    .iter()
                    .filter(|&&q| q == p || node.gpus[p].nvlink & (1 << q) != 0)
                    .map(|&q| initial.usable[n][q])
                    .sum();
                if node.gpus[p].nvlink != 0 {
                    group = group.max(linked);
                }
            }
        }
        let fleet_total: u64 = eligible.iter().map(|&(n, p)| initial.usable[n][p]).sum();
        parts.push(format!("largest free GPU has {}", show(largest_gpu)));
        if group > 0 {
            parts.push(format!("largest free NVLink group has {}", show(group)));
        }
        parts.push(format!(
            "largest node has {} free; the fleet {}",
            show(node_total),
            show(fleet_total)
        ));
    }
    for &(v, tier) in unit.allowed.iter().skip(1).take(2) {
        if let Some(Need { bytes: need, .. }) = unit.single_need(v) {
            parts.push(format!("{} ({tier}) needs {}", info.variants[v].id, show(need)));
        }
    }
    for (v, variant) in info.variants.iter().enumerate() {
        if let VariantUse::Excluded(why) = variant_use(unit.requirement, variant)
            && let Some(Need { bytes: need, .. }) = unit.single_need(v)
        {
            parts.push(format!("{} needs {} but {why}", variant.id, show(need)));
            if parts.len() > 7 {
                break;
            }
        }
    }
    parts.join("; ")
}
