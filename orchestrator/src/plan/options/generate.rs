//! Candidate generation on a node state: one GPU, tensor parallel and layer splits on
//! one node, splits across nodes, and the last resorts (host RAM offload, the CPU).

use std::collections::BTreeSet;
use std::sync::Arc;

use skein_dsl::ir::Precision;
use skein_model_registry::estimate::{DeviceKind, Engine, Estimate, Layout, Stages, fits};
use skein_model_registry::{Bytes, WeightFormat};

use super::cache::{Need, NodeRanking, RankedState, RankedStates};
use super::cand::{Cand, Dev, Family, sort_cands, speed_placement};
use super::state::State;
use super::topology::{for_each_subset, hops, tp_groups};
use super::{EXHAUSTIVE_FLEET_GPUS, EXHAUSTIVE_SPLIT_GPUS, FLEET_WIDE_SPLIT_GPUS, FleetState, Unit, with_margin};
use crate::plan::demand::min_compute_capability;
use crate::plan::fleet::{PlanFleet, PlanGpu};
use crate::plan::score::{BANDWIDTH_EFFICIENCY, DeviceSpeed, ScoreParts, host_speed_factor, tokens_per_second};

impl<'a> Unit<'a> {
    /// Candidates on one node: one GPU, tensor parallel, a split over its GPUs.
    pub(super) fn local(&self, at: FleetState<'_>, node: usize) -> Vec<Cand> {
        let FleetState { fleet, state } = at;
        let gpus = &fleet.nodes[node].gpus;
        let cur = &state.usable[node];
        let mut out = Vec::new();
        for &(v, tier) in &self.allowed {
            let Some(engine) = self.gpu_engine(v) else {
                continue;
            };
            let eligible: Vec<usize> = (0..gpus.len()).filter(|&p| self.usable_gpu(at, v, node, p)).collect();
            if eligible.is_empty() {
                continue;
            }
            let before = out.len();
            if let Some(Need {
                estimate: e,
                bytes: need,
            }) = self.need(v, 1, None)
                && e.host <= Bytes::new(state.host[node])
            {
                for &p in &eligible {
                    if cur[p] >= need {
                        out.push(self.cand(
                            fleet,
                            v,
                            tier,
                            Family::Single,
                            e.clone(),
                            vec![Dev { node, gpu: Some(p) }],
                        ));
                    }
                }
            }
            if engine.tensor_parallel() {
                for k in 2..=eligible.len().min(self.max_gpus) {
                    let Some(Need {
                        estimate: e,
                        bytes: need,
                    }) = self.need(v, k as u64, None)
                    else {
                        continue;
                    };
                    for subset in tp_groups(gpus, cur, &eligible, k, need) {
                        let devices = subset.iter().map(|&p| Dev { node, gpu: Some(p) }).collect();
                        out.push(self.cand(fleet, v, tier, Family::TensorParallel, e.clone(), devices));
                    }
                }
            }
            // A split is never faster than a one-GPU or tensor-parallel candidate on
            // the same GPUs, but one with more GPUs needs less memory on each, which can
            // leave room for another instance: on a small node every split is a
            // candidate, on a large one only those with fewer GPUs.
            let smallest = if eligible.len() <= EXHAUSTIVE_SPLIT_GPUS {
                usize::MAX
            } else {
                out[before..]
                    .iter()
                    .map(|c| c.devices.len())
                    .min()
                    .unwrap_or(usize::MAX)
            };
            if eligible.len() >= 2 && smallest > 2 {
                let only = RankedState {
                    eligible: eligible.into(),
                    sig: state.sig[node],
                    first: node,
                    count: 1,
                };
                let mut ranking = NodeRanking::new(state, None, Arc::new(RankedStates::new(state, [only])));
                let found = self.splits(at, v, tier, Family::NodeSplit, &mut ranking, smallest - 1);
                out.extend(found);
            }
        }
        dedupe(at, &mut out);
        sort_cands(&mut out);
        out
    }

    /// Layer splits over subsets of `groups`' GPUs (each group: GPU positions on one
    /// node, `nodes[i]`), one GPU per stage with layers in proportion to usable memory:
    /// every subset when there are few GPUs, otherwise the prefixes of the GPUs ordered
    /// by node capacity and usable memory. Only the smallest size that fits is kept.
    #[allow(clippy::too_many_arguments)]
    fn splits(
        &self,
        at: FleetState<'_>,
        v: usize,
        tier: Precision,
        family: Family,
        ranking: &mut NodeRanking<'_>,
        max_size: usize,
    ) -> Vec<Cand> {
        let FleetState { fleet, state } = at;
        let Some(engine) = self.gpu_engine(v) else {
            return Vec::new();
        };
        if !engine.layer_split() || (family == Family::CrossNode && !engine.across_nodes()) {
            return Vec::new();
        }
        let Some(Need { estimate: single, .. }) = self.need(v, 1, None) else {
            return Vec::new();
        };
        let floor: u64 = single.devices.iter().map(|d| d.weights.get() + d.kv_cache.get()).sum();
        // Every GPU with its node, in preference order: nodes by capacity, GPUs by memory.
        // It is filled node by node only as far as the prefixes below read it: on a
        // large fleet the first fit is among the first nodes.
        let mut order: Vec<(usize, usize)> = Vec::new();
        let total = ranking.gpus;
        let mut filled = 0;
        let mut fill = |order: &mut Vec<(usize, usize)>, len: usize| {
            while order.len() < len
                && let Some((_, n, group)) = ranking.get(filled)
            {
                let mut list = group.to_vec();
                list.sort_by(|&a, &b| state.usable[n][b].cmp(&state.usable[n][a]).then(a.cmp(&b)));
                order.extend(list.into_iter().map(|p| (n, p)));
                filled += 1;
            }
        };
        let spans = |devs: &[(usize, usize)]| devs.iter().any(|d| d.0 != devs[0].0);
        let must_span = family == Family::CrossNode;
        let mut out = Vec::new();
        let try_set = |devs: &[(usize, usize)], out: &mut Vec<Cand>| {
            if must_span && !spans(devs) {
                return;
            }
            // Stages go node by node, the nodes with the most of the split's memory
            // first, and on each node the GPUs with the most memory first.
            let on_node = |n: usize| {
                devs.iter()
                    .filter(|d| d.0 == n)
                    .map(|&(n, p)| state.usable[n][p])
                    .sum::<u64>()
            };
            let mut devs = devs.to_vec();
            devs.sort_by(|a, b| {
                on_node(b.0)
                    .cmp(&on_node(a.0))
                    .then(a.0.cmp(&b.0))
                    .then(state.usable[b.0][b.1].cmp(&state.usable[a.0][a.1]))
                    .then(a.1.cmp(&b.1))
            });
            let devs = &devs[..];
            let memory: Vec<u64> = devs.iter().map(|&(n, p)| state.usable[n][p]).collect();
            if memory.iter().sum::<u64>() < floor {
                return;
            }
            let layout = Layout::pipeline_by_memory(memory.iter().map(|&m| Bytes::new(m)).collect());
            let Some(e) = self.estimate(v, engine, layout) else {
                return;
            };
            let usable: Vec<Bytes> = memory.iter().map(|&m| Bytes::new(m)).collect();
            let fit = fits_with_reserve(&e, &usable);
            if fit && e.host <= Bytes::new(state.host[devs[0].0]) {
                let devices = devs.iter().map(|&(node, p)| Dev { node, gpu: Some(p) }).collect();
                out.push(self.cand(fleet, v, tier, family, e, devices));
            }
        };
        let most = total.min(self.max_gpus).min(max_size);
        let limit = if must_span {
            EXHAUSTIVE_FLEET_GPUS
        } else {
            EXHAUSTIVE_SPLIT_GPUS
        };
        let exhaustive = total <= limit;
        if exhaustive {
            fill(&mut order, total);
        }
        for size in 2..=most {
            if exhaustive {
                for_each_subset(&order, size, &mut |devs| try_set(devs, &mut out));
            } else {
                // The smallest size that fits.
                fill(&mut order, size);
                try_set(&order[..size], &mut out);
                if !out.is_empty() {
                    break;
                }
            }
        }
        if must_span && !exhaustive && total <= FLEET_WIDE_SPLIT_GPUS {
            // Healthy GPUs first (a degraded one costs more than any other quality).
            fill(&mut order, total);
            let gpu = |&(n, p): &(usize, usize)| &fleet.nodes[n].gpus[p];
            let mut by_memory = order.clone();
            by_memory.sort_by(|a, b| {
                gpu(a)
                    .degraded
                    .cmp(&gpu(b).degraded)
                    .then(state.usable[b.0][b.1].cmp(&state.usable[a.0][a.1]))
                    .then(a.cmp(b))
            });
            let mut by_speed = by_memory.clone();
            by_speed.sort_by(|a, b| {
                gpu(a)
                    .degraded
                    .cmp(&gpu(b).degraded)
                    .then(gpu(b).bandwidth.total_cmp(&gpu(a).bandwidth))
            });
            // Without the one or two GPUs with the most memory too: another replica may
            // need them more.
            let lists = [
                by_memory.clone(),
                by_speed,
                by_memory.get(1..).unwrap_or_default().to_vec(),
                by_memory.get(2..).unwrap_or_default().to_vec(),
            ];
            for (i, list) in lists.iter().enumerate() {
                let most = most.min(list.len());
                for size in 2..=most {
                    let before = out.len();
                    try_set(&list[..size], &mut out);
                    if out.len() == before {
                        continue;
                    }
                    // And the same number of GPUs without each of these in turn (the next
                    // one in its place), so that the search can leave any of them to
                    // another replica.
                    if i == 0 && size < list.len() {
                        for skip in 0..size {
                            let mut other: Vec<(usize, usize)> = list[..=size].to_vec();
                            other.remove(skip);
                            try_set(&other, &mut out);
                        }
                    }
                    break;
                }
            }
        }
        if engine.tensor_parallel() {
            out.extend(self.tp_stages(at, v, tier, engine, ranking, most));
        }
        out
    }

    /// Tensor-parallel groups of `k` identical GPUs (vLLM), one group per pipeline stage,
    /// stages taken node by node (best nodes first) until the model fits.
    #[allow(clippy::too_many_arguments)]
    fn tp_stages(
        &self,
        at: FleetState<'_>,
        v: usize,
        tier: Precision,
        engine: Engine,
        ranking: &mut NodeRanking<'_>,
        max_size: usize,
    ) -> Vec<Cand> {
        let FleetState { fleet, state } = at;
        let mut out = Vec::new();
        for k in [2usize, 4, 8] {
            if self.need(v, k as u64, None).is_none() {
                continue; // not a valid degree
            }
            // Stages node by node, only as many nodes as the counts below read.
            let mut stages: Vec<(usize, Vec<usize>, u64)> = Vec::new();
            let mut next = 0;
            let mut add_node = |stages: &mut Vec<(usize, Vec<usize>, u64)>| -> bool {
                let Some((_, n, group)) = ranking.get(next) else {
                    return false;
                };
                next += 1;
                let gpus = &fleet.nodes[n].gpus;
                let mut by_name: Vec<(&str, Vec<usize>)> = Vec::new();
                for &p in group.iter() {
                    match by_name.iter_mut().find(|(name, _)| *name == gpus[p].name) {
                        Some((_, list)) => list.push(p),
                        None => by_name.push((&gpus[p].name, vec![p])),
                    }
                }
                let mut node_stages = Vec::new();
                for (_, mut list) in by_name {
                    list.sort_by(|&a, &b| state.usable[n][b].cmp(&state.usable[n][a]).then(a.cmp(&b)));
                    for chunk in list.chunks_exact(k) {
                        let least = chunk.iter().map(|&p| state.usable[n][p]).min().unwrap_or(0);
                        node_stages.push((n, chunk.to_vec(), least));
                    }
                }
                node_stages.sort_by(|a, b| b.2.cmp(&a.2).then(a.1.cmp(&b.1)));
                stages.extend(node_stages);
                true
            };
            for count in 2.. {
                while stages.len() < count {
                    if !add_node(&mut stages) {
                        break;
                    }
                }
                if stages.len() < count || count * k > max_size {
                    break;
                }
                let chosen = &stages[..count];
                let layout = Layout {
                    tensor_parallel: k as u64,
                    stages: Stages::Memory(chosen.iter().map(|s| Bytes::new(s.2)).collect()),
                };
                let Some(e) = self.estimate(v, engine, layout) else {
                    break;
                };
                let usable: Vec<Bytes> = chosen
                    .iter()
                    .flat_map(|s| s.1.iter().map(|&p| Bytes::new(state.usable[s.0][p])))
                    .collect();
                if fits_with_reserve(&e, &usable) {
                    let devices: Vec<Dev> = chosen
                        .iter()
                        .flat_map(|s| {
                            s.1.iter().map(|&p| Dev {
                                node: s.0,
                                gpu: Some(p),
                            })
                        })
                        .collect();
                    let family = if chosen.iter().all(|s| s.0 == chosen[0].0) {
                        Family::NodeSplit
                    } else {
                        Family::CrossNode
                    };
                    out.push(self.cand(fleet, v, tier, family, e, devices));
                    break;
                }
            }
        }
        out
    }

    /// Splits over several nodes for variant `v`, on at most `max_size` GPUs.
    pub(super) fn cross_node(&self, at: FleetState<'_>, v: usize, tier: Precision, max_size: usize) -> Vec<Cand> {
        let state = at.state;
        let cc = min_compute_capability(&self.info.variants[v]);
        let mut ranking = NodeRanking::new(state, self.allowed_nodes(), self.ranked_states(at, cc));
        if ranking.nodes < 2 {
            return Vec::new();
        }
        let mut out = self.splits(at, v, tier, Family::CrossNode, &mut ranking, max_size);
        // vLLM's ranks over Ray would each read the adapters from their own node, and
        // only the serving node downloads them: a vLLM replica with adapters stays on
        // one node (llama.cpp loads them in its server alone, whatever RPC holds).
        let vllm_adapters = |c: &Cand| !self.adapters.is_empty() && matches!(c.estimate.engine, Engine::Vllm(_));
        out.retain(|c| c.family == Family::CrossNode && !vllm_adapters(c));
        out
    }

    /// The last resorts on one node: GGUF layers split between its GPUs and host RAM
    /// (llama.cpp), and the whole model on its CPU (the built-in engine, and llama.cpp
    /// for GGUF), as far as the requirement's `engines:` allows.
    pub fn fallback(&self, at: FleetState<'_>, node: usize) -> Vec<Cand> {
        let FleetState { fleet, state } = at;
        let mut out = Vec::new();
        let host = state.host[node];
        for &(v, tier) in &self.allowed {
            let variant = &self.info.variants[v];
            if let Some(engine) = Engine::for_offload(variant.format()).find(|e| self.engine_allowed(*e)) {
                let mut gpus: Vec<usize> = (0..fleet.nodes[node].gpus.len())
                    .filter(|&p| self.usable_gpu(at, v, node, p))
                    .collect();
                gpus.sort_by(|&a, &b| state.usable[node][b].cmp(&state.usable[node][a]).then(a.cmp(&b)));
                gpus.truncate(self.max_gpus);
                if !gpus.is_empty()
                    && host > 0
                    && let Some((e, devices)) = self.offload(state, v, engine, node, &gpus)
                {
                    out.push(self.cand(fleet, v, tier, Family::Offload, e, devices));
                }
            }
            for engine in self.cpu_engines(v) {
                if self.cpu_allowed
                    && let Some(Need {
                        estimate: e,
                        bytes: need,
                    }) = self.need(v, 1, Some(engine))
                    && need.saturating_add(e.host.get()) <= host
                {
                    out.push(self.cand(fleet, v, tier, Family::Cpu, e, vec![Dev { node, gpu: None }]));
                }
            }
        }
        sort_cands(&mut out);
        out
    }

    /// `engine` (llama.cpp) with the GPUs of `gpus` (best first) filled with as many
    /// layers as they hold and the rest in host RAM (`-ngl`): the estimate and its
    /// devices, or `None` when the host cannot take the rest.
    fn offload(
        &self,
        state: &State,
        v: usize,
        engine: Engine,
        node: usize,
        gpus: &[usize],
    ) -> Option<(Arc<Estimate>, Vec<Dev>)> {
        let host = state.host[node];
        // llama.cpp keeps the first layers in host RAM and offloads the last ones with
        // the output (`-ngl`), so the host is the first stage and the GPUs follow.
        let mut memory: Vec<Bytes> = vec![Bytes::new(host)];
        memory.extend(gpus.iter().map(|&p| Bytes::new(state.usable[node][p])));
        // A first, proportional estimate gives each GPU's fixed costs and a layer's size.
        let probe = self.estimate_on(v, engine, Layout::pipeline_by_memory(memory.clone()), 1)?;
        let layers = probe.devices.last()?.layers.end;
        let per_layer = probe
            .devices
            .iter()
            .filter(|d| !d.layers.is_empty())
            .map(|d| (d.weights.get() + d.kv_cache.get()).div_ceil(d.layers.len()))
            .max()?
            .max(1);
        let mut counts: Vec<u64> = probe.devices[1..]
            .iter()
            .zip(&memory[1..])
            .map(|(d, usable)| {
                let fixed = d.total.get().saturating_sub(d.layers.len() * per_layer);
                let room = usable.get() / 100 * 95;
                room.saturating_sub(fixed) / per_layer
            })
            .collect();
        // Whatever the rounding, the host keeps at least one layer; then GPUs give
        // layers back until every device fits.
        for _ in 0..=8 {
            let on_gpus: u64 = counts.iter().sum();
            if on_gpus >= layers {
                let excess = on_gpus - layers + 1;
                let last = counts.iter().rposition(|&c| c >= excess)?;
                counts[last] -= excess;
            }
            let kept: Vec<usize> = (0..gpus.len()).filter(|&i| counts[i] > 0).collect();
            if kept.is_empty() {
                return None;
            }
            let mut ratios: Vec<u32> = vec![u32::try_from(layers - counts.iter().sum::<u64>()).unwrap_or(u32::MAX)];
            ratios.extend(kept.iter().map(|&i| u32::try_from(counts[i]).unwrap_or(u32::MAX)));
            let e = self.estimate_on(v, engine, Layout::pipeline(ratios), 1)?;
            let usable: Vec<Bytes> = [Bytes::new(host)]
                .into_iter()
                .chain(kept.iter().map(|&i| memory[i + 1]))
                .collect();
            let report = fits(&e, &usable).ok()?;
            if report.fits {
                // The host stage's line includes what llama.cpp keeps in RAM anyway.
                let host_need =
                    with_margin(e.devices.first().map_or(Bytes::ZERO, |d| d.total), DeviceKind::Cpu) + e.host.get();
                if host_need > host {
                    return None;
                }
                let mut devices = vec![Dev { node, gpu: None }];
                devices.extend(kept.iter().map(|&i| Dev {
                    node,
                    gpu: Some(gpus[i]),
                }));
                return Some((e, devices));
            }
            // Take a layer from each GPU that does not fit.
            let before = counts.clone();
            for (device, &i) in report.devices[1..].iter().zip(&kept) {
                if !device.fits {
                    counts[i] = counts[i].saturating_sub(1);
                }
            }
            if counts == before {
                return None;
            }
        }
        None
    }

    pub(super) fn cand(
        &self,
        fleet: &PlanFleet,
        v: usize,
        tier: Precision,
        family: Family,
        e: Arc<Estimate>,
        devices: Vec<Dev>,
    ) -> Cand {
        let reserve = e
            .devices
            .iter()
            .map(|d| with_margin(d.total, d.kind))
            .collect::<Vec<_>>();
        let mut speeds = Vec::with_capacity(devices.len());
        let mut degraded = 0;
        let mut gpus = 0;
        let mut card_bytes = 0u64;
        let mut nodes = BTreeSet::new();
        for (i, d) in devices.iter().enumerate() {
            nodes.insert(d.node);
            let stage = e.devices.get(i).map_or(0, |x| x.stage);
            match d.gpu {
                Some(p) => {
                    let g: &PlanGpu = &fleet.nodes[d.node].gpus[p];
                    gpus += 1;
                    degraded += u32::from(g.degraded);
                    card_bytes += g.total;
                    let peers = devices.iter().enumerate().filter(|(j, o)| {
                        *j != i && o.node == d.node && e.devices.get(*j).is_some_and(|x| x.stage == stage)
                    });
                    let nvlink = peers
                        .clone()
                        .all(|(_, o)| o.gpu.is_some_and(|q| g.nvlink & (1 << q) != 0));
                    speeds.push(DeviceSpeed {
                        node: d.node,
                        bandwidth: g.bandwidth * BANDWIDTH_EFFICIENCY,
                        extra_read: 0.0,
                        nvlink_stage: nvlink,
                        gpu: true,
                    });
                }
                None => {
                    // llama.cpp's output on the CPU reads the tied embedding in host RAM.
                    let tied_output =
                        family == Family::Cpu && e.engine.embedding_in_host_ram() && self.info.shape.tied_embeddings;
                    speeds.push(DeviceSpeed {
                        node: d.node,
                        bandwidth: fleet.nodes[d.node].host_bandwidth
                            * host_speed_factor(e.engine, self.info.variants[v].format() == WeightFormat::Gguf),
                        extra_read: if tied_output { e.host.get() as f64 } else { 0.0 },
                        nvlink_stage: false,
                        gpu: false,
                    });
                }
            }
        }
        let hops = hops(fleet, &e, &devices);
        // A speed measured on the node for this engine, variant and placement replaces
        // the model (only for a placement on one node).
        let measured = match devices.first() {
            Some(first) if nodes.len() == 1 => {
                let placement = speed_placement(family.name(), devices.len());
                let variant = &self.info.variants[v].id;
                fleet.nodes[first.node]
                    .measured
                    .iter()
                    .find(|m| m.engine == e.engine.name() && m.variant == *variant && m.placement == placement)
                    .map(|m| m.tokens_per_s)
            }
            _ => None,
        };
        let tokens_per_s = measured.unwrap_or_else(|| tokens_per_second(&e, self.info.shape.hidden, &speeds, &hops));
        let parts = ScoreParts {
            tier,
            cpu: family == Family::Cpu,
            offload: family == Family::Offload,
            degraded,
            gpus,
            nodes: nodes.len() as u32,
            tokens_per_s,
            measured: measured.is_some(),
            card_gib: card_bytes >> 30,
        };
        // Only llama.cpp keeps RAM beside its devices (the token embedding), on the CPU too.
        let host_extra = e.host.get();
        Cand {
            variant: v,
            tier,
            family,
            score: parts.score(self.requirement.prefer),
            parts,
            estimate: e,
            devices,
            reserve,
            host_extra,
        }
    }
}

/// Whether every device's estimate plus margin fits its usable memory.
fn fits_with_reserve(e: &Estimate, usable: &[Bytes]) -> bool {
    fits(e, usable).is_ok_and(|r| r.fits)
}

/// Drops candidates equal to an earlier one up to interchangeable GPUs (same model, same
/// state, same links): keeps the first of each.
pub(super) fn dedupe(at: FleetState<'_>, cands: &mut Vec<Cand>) {
    let FleetState { fleet, state } = at;
    let mut seen = BTreeSet::new();
    cands.retain(|c| {
        let mut shape: Vec<(u64, u64, Option<usize>)> = c
            .devices
            .iter()
            .map(|d| match d.gpu {
                Some(p) => {
                    let g = &fleet.nodes[d.node].gpus[p];
                    // Links matter through the score (NVLink speed); the class without the
                    // position keeps identical GPUs interchangeable.
                    (g.total ^ g.bandwidth.to_bits(), state.usable[d.node][p], Some(d.node))
                }
                None => (0, state.host[d.node], Some(d.node)),
            })
            .collect();
        if c.family == Family::Single || c.family == Family::TensorParallel {
            shape.sort_unstable();
        }
        seen.insert((c.variant, c.family, c.score, shape, c.estimate.layout.tensor_parallel))
    });
}
