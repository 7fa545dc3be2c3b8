//! How GPUs and nodes connect: tensor-parallel groups of one model, NVLink cliques, and
//! what the network costs a split across nodes.

use skein_model_registry::estimate::Estimate;

use super::EXHAUSTIVE_NODE_GPUS;
use super::cand::{Cand, Dev};
use crate::plan::fleet::{PlanFleet, PlanGpu};
use crate::plan::score::Hop;

/// What the network costs a candidate split across nodes, per token: the hops between
/// stages on different nodes, each one 16-bit hidden vector of activations (`hidden`
/// values) over the slower end's link plus its latency; `None` on one node.
pub fn network_cost(fleet: &PlanFleet, c: &Cand, hidden: u64) -> Option<NetworkCost> {
    let hops: Vec<Hop> = hops(fleet, &c.estimate, &c.devices).into_iter().flatten().collect();
    if hops.is_empty() {
        return None;
    }
    let bytes = hidden * 2;
    let seconds: f64 = hops
        .iter()
        .map(|h| h.latency_s + bytes as f64 * 8.0 / h.bits_per_s.max(1) as f64)
        .sum();
    Some(NetworkCost {
        hops: hops.len(),
        bytes_per_hop: bytes,
        slowest_bits_per_s: hops.iter().map(|h| h.bits_per_s).min().unwrap_or(0),
        seconds_per_token: seconds,
    })
}

/// See [`network_cost`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NetworkCost {
    /// Stage boundaries between nodes a token crosses.
    pub hops: usize,
    /// Activation bytes sent per hop and token.
    pub bytes_per_hop: u64,
    /// The slowest link crossed, bits/s.
    pub slowest_bits_per_s: u64,
    /// Time per token spent on the network.
    pub seconds_per_token: f64,
}

/// Network hops between consecutive stages.
pub(super) fn hops(fleet: &PlanFleet, e: &Estimate, devices: &[Dev]) -> Vec<Option<Hop>> {
    let mut stage_nodes: Vec<usize> = Vec::new();
    for (d, dev) in e.devices.iter().zip(devices) {
        if stage_nodes.len() == d.stage {
            stage_nodes.push(dev.node);
        }
    }
    stage_nodes
        .windows(2)
        .map(|w| {
            (w[0] != w[1]).then(|| {
                let (a, b) = (&fleet.nodes[w[0]], &fleet.nodes[w[1]]);
                let latency_ms = match (a.rtt_ms, b.rtt_ms) {
                    // The path through the orchestrator bounds the direct one; half of it
                    // is one way.
                    (Some(x), Some(y)) => (x + y) / 2.0,
                    _ => 0.1,
                };
                Hop {
                    bits_per_s: a.network_bps.min(b.network_bps),
                    latency_s: latency_ms / 1000.0,
                }
            })
        })
        .collect()
}

/// Subsets of `k` GPUs of one model among `eligible` with at least `need` usable each:
/// every distinct one on a small node, else the best fit (healthy first, smallest cards,
/// least free) and the best NVLink-connected one.
pub(super) fn tp_groups(gpus: &[PlanGpu], cur: &[u64], eligible: &[usize], k: usize, need: u64) -> Vec<Vec<usize>> {
    let mut by_name: Vec<(&str, Vec<usize>)> = Vec::new();
    for &p in eligible.iter().filter(|&&p| cur[p] >= need) {
        match by_name.iter_mut().find(|(n, _)| *n == gpus[p].name) {
            Some((_, list)) => list.push(p),
            None => by_name.push((&gpus[p].name, vec![p])),
        }
    }
    let mut out = Vec::new();
    for (_, list) in by_name {
        if list.len() < k {
            continue;
        }
        if list.len() <= EXHAUSTIVE_NODE_GPUS {
            // Subsets alike in everything the score and the fit read (memory, health,
            // speed, whether all are NVLinked) give equal candidates: the first stands
            // for all, as `dedupe` would keep it. A subset's shape is how many of its GPUs
            // are of each kind (memory, health, speed): four bits per kind, at most eight
            // kinds of at most eight GPUs, and a bit for the links.
            let mut kinds: Vec<(u64, bool, u64)> = Vec::new();
            let mut kind_of = [0u32; 64];
            for &p in &list {
                let kind = (cur[p], gpus[p].degraded, gpus[p].bandwidth.to_bits());
                kind_of[p] = match kinds.iter().position(|x| *x == kind) {
                    Some(i) => i as u32,
                    None => {
                        kinds.push(kind);
                        kinds.len() as u32 - 1
                    }
                };
            }
            let mut seen: Vec<u64> = Vec::new();
            for_each_subset(&list, k, &mut |s| {
                let mut counts = 0u64;
                let mut mask = 0u64;
                for &p in s {
                    counts += 1 << (4 * kind_of[p]);
                    mask |= 1 << p;
                }
                let linked = s.iter().all(|&a| (gpus[a].nvlink | 1 << a) & mask == mask);
                let shape = counts << 1 | u64::from(linked);
                if !seen.contains(&shape) {
                    seen.push(shape);
                    out.push(s.to_vec());
                }
            });
        } else {
            let mut sorted = list.clone();
            sorted.sort_by_key(|&p| (gpus[p].degraded, gpus[p].total, cur[p], p));
            out.push(sorted[..k].to_vec());
            if let Some(clique) = nvlink_clique(gpus, &sorted, k) {
                out.push(clique);
            }
        }
    }
    out
}

/// A set of `k` GPUs all linked to each other, built greedily in `order`.
fn nvlink_clique(gpus: &[PlanGpu], order: &[usize], k: usize) -> Option<Vec<usize>> {
    for &start in order {
        let mut clique = vec![start];
        for &p in order {
            if p != start && clique.iter().all(|&q| gpus[q].nvlink & (1 << p) != 0) {
                clique.push(p);
                if clique.len() == k {
                    clique.sort_unstable();
                    return Some(clique);
                }
            }
        }
    }
    None
}

/// Calls `f` with every `k`-subset of `items`, in lexicographic order.
pub fn for_each_subset<T: Copy>(items: &[T], k: usize, f: &mut impl FnMut(&[T])) {
    fn go<T: Copy>(items: &[T], k: usize, start: usize, acc: &mut Vec<T>, f: &mut impl FnMut(&[T])) {
        if acc.len() == k {
            f(acc);
            return;
        }
        for i in start..items.len() {
            if items.len() - i < k - acc.len() {
                break;
            }
            acc.push(items[i]);
            go(items, k, i + 1, acc, f);
            acc.pop();
        }
    }
    if k <= items.len() {
        go(items, k, 0, &mut Vec::with_capacity(k), f);
    }
}
