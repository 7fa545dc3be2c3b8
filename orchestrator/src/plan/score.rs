//! The objective: what makes one placement better than another, and the throughput model
//! it uses. Documented for users in `docs/placement.md`; keep the two in step.

use serde::Serialize;
use skein_dsl::ir::{Precision, Preference};
use skein_model_registry::NumberKind;
use skein_model_registry::estimate::{Engine, Estimate};
use skein_model_registry::quant::Quantization;

/// A placement's qualities, from which its score is computed.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct ScoreParts {
    /// The variant's precision tier.
    pub tier: Precision,
    /// Whole model on the host CPU.
    pub cpu: bool,
    /// Some layers offloaded to host RAM.
    pub offload: bool,
    /// Degraded GPUs used.
    pub degraded: u32,
    /// GPUs used.
    pub gpus: u32,
    /// Nodes spanned.
    pub nodes: u32,
    /// Decode speed of one sequence, tokens/s: measured on the node where a measurement
    /// of the same engine, variant and placement exists, else modelled.
    pub tokens_per_s: f64,
    /// Whether `tokens_per_s` was measured.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub measured: bool,
    /// Total memory of the cards used, GiB (smaller cards preferred: large ones stay free
    /// for models that need them).
    pub card_gib: u64,
}

// Weights: each level outweighs everything below it, so the sum is lexicographic for
// one placement (see docs/placement.md).
const CPU: i64 = 2_000_000_000_000_000_000;
const OFFLOAD: i64 = 1_000_000_000_000_000_000;
const DEGRADED: i64 = 10_000_000_000_000_000;
const LEVEL: [i64; 3] = [100_000_000_000_000, 1_000_000_000_000, 10_000_000_000];
const CARD_GIB: i64 = 100_000;

impl ScoreParts {
    /// The placement's score under `prefer`: higher is better.
    pub fn score(&self, prefer: Preference) -> i64 {
        let tier = tier_rank(self.tier);
        let gpus = -i64::from(self.gpus.min(99));
        // Half-doublings of speed, between 1/1000 and 1000 tokens/s: 40 steps either side.
        let speed = (self.tokens_per_s.max(1e-3).log2() * 2.0).clamp(-40.0, 40.0);
        let levels: [f64; 3] = match prefer {
            Preference::Quality => [tier, gpus as f64, speed],
            Preference::Speed => [speed, tier, gpus as f64],
            Preference::FewestGpus => [gpus as f64, tier, speed],
        };
        let mut score = 0i64;
        if self.cpu {
            score -= CPU;
        }
        if self.offload {
            score -= OFFLOAD;
        }
        score -= DEGRADED * i64::from(self.degraded.min(64));
        for (value, weight) in levels.iter().zip(LEVEL) {
            score += (value * weight as f64) as i64;
        }
        score - CARD_GIB * self.card_gib.min(100_000) as i64
    }
}

fn tier_rank(tier: Precision) -> f64 {
    Precision::ALL.iter().position(|p| *p == tier).unwrap_or(0) as f64
}

/// The workflow tier of a variant's quantization: by nominal bits, and at 8 bits by kind
/// (fp8 above int8). `None` below the lowest tier (1-bit).
pub fn tier_of(quantization: &Quantization) -> Option<Precision> {
    let nominal = quantization.nominal();
    Some(match (nominal.bits, nominal.kind) {
        (32.., _) => Precision::Fp32,
        (16..=31, _) => Precision::Bf16,
        (8..=15, NumberKind::Float) => Precision::Fp8,
        (8..=15, NumberKind::Int) => Precision::Int8,
        (6 | 7, _) => Precision::Int6,
        (5, _) => Precision::Int5,
        (4, _) => Precision::Int4,
        (3, _) => Precision::Int3,
        (2, _) => Precision::Int2,
        _ => return None,
    })
}

/// Where a device of a placement is, for the throughput model.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DeviceSpeed {
    /// Node position.
    pub node: usize,
    /// Decode bandwidth, bytes/s: what the engine streams from the device's memory per
    /// second while decoding (a GPU's peak × [`BANDWIDTH_EFFICIENCY`]; a host's from its
    /// cores, `fleet::host_decode_bandwidth`).
    pub bandwidth: f64,
    /// Bytes it reads per token besides its weights and cache (llama.cpp's output on the
    /// CPU reads the tied token embedding kept in host RAM).
    pub extra_read: f64,
    /// Whether it has an NVLink to every other device of its stage.
    pub nvlink_stage: bool,
    /// Whether it is a GPU: a GPU's token cannot take less than its kernels' launches
    /// ([`GPU_LAYER_S`] a layer, [`GPU_TOKEN_S`] a token), however little it reads.
    pub gpu: bool,
}

/// The least time a decoder layer takes on a GPU, seconds: its dozen-odd kernels'
/// launches and syncs, not its reads, bound a small model. With [`GPU_TOKEN_S`], from
/// llama.cpp 11434 (CUDA 13, flash attention) on an H200 decoding a 6-layer cut of
/// SmolLM2-135M Q4_1: 2,108 tokens/s (474 µs a token) where bandwidth alone gives 54,000
/// (docs/placement.md, "Speed").
pub const GPU_LAYER_S: f64 = 62e-6;
/// The least time a token takes on GPUs besides its layers, seconds: the embedding, the
/// output layer's launch, sampling and the host's round trip.
pub const GPU_TOKEN_S: f64 = 100e-6;

/// A network hop between consecutive pipeline stages on different nodes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Hop {
    /// Bandwidth of the slower end, bits/s.
    pub bits_per_s: u64,
    /// One-way latency, seconds.
    pub latency_s: f64,
}

/// The built-in engine's decode speed on the CPU relative to llama.cpp's on the same
/// weights and machine, the prior until the node measured it, from the last side-by-side
/// bench (docs/PERFORMANCE.md, "The built-in engine against llama.cpp", run 3: llama.cpp
/// 78.0 tokens/s with 2 threads on SmolLM2-135M-Instruct Q4_1). A GGUF file runs the
/// engine's own forward pass and kernels: 65.4 tokens/s (one thread but for the output
/// layer). Safetensors run through candle in F32: 13.5 tokens/s. Once an instance of an
/// engine served a variant on a node, its measured speed replaces the model there
/// (docs/placement.md, "Measured speeds"), so the engine that really is faster on that
/// node wins. llama.cpp on the host is the model itself (factor 1).
pub const BUILTIN_CPU_SPEED_GGUF: f64 = 0.84;
/// The built-in engine's prior on safetensors weights; see [`BUILTIN_CPU_SPEED_GGUF`].
pub const BUILTIN_CPU_SPEED: f64 = 0.17;

/// The share of the host's modelled decode bandwidth an engine reaches on the CPU or
/// host RAM: 1 for llama.cpp, [`BUILTIN_CPU_SPEED_GGUF`] or [`BUILTIN_CPU_SPEED`] for
/// the built-in engine on a GGUF file or on safetensors.
pub fn host_speed_factor(engine: Engine, gguf: bool) -> f64 {
    match engine {
        Engine::Candle(_) if gguf => BUILTIN_CPU_SPEED_GGUF,
        Engine::Candle(_) => BUILTIN_CPU_SPEED,
        Engine::LlamaCpp(_) | Engine::Vllm(_) => 1.0,
    }
}

/// Fraction of a GPU's (or a large host's) peak memory bandwidth decoding reaches.
pub const BANDWIDTH_EFFICIENCY: f64 = 0.7;
/// One all-reduce between GPUs of a node over NVLink, seconds.
pub const ALLREDUCE_NVLINK_S: f64 = 8e-6;
/// One all-reduce between GPUs of a node over PCIe, seconds.
pub const ALLREDUCE_PCIE_S: f64 = 30e-6;
/// Handing activations to the next stage on the same node, seconds.
pub const STAGE_HOP_LOCAL_S: f64 = 20e-6;

/// Modelled decode speed of one sequence, tokens/s: decoding streams every weight once
/// per token, so each device's time per token is the bytes it reads (its weights, and
/// the sequence's share of its KV cache at half the context on average) over its decode
/// bandwidth; a stage takes as
/// long as its slowest device, stages run one after another; tensor parallelism adds two
/// all-reduces per layer, and each stage boundary a hop (local, or over the network with
/// its latency and the transfer of one 16-bit hidden vector).
pub fn tokens_per_second(estimate: &Estimate, hidden: u64, devices: &[DeviceSpeed], hops: &[Option<Hop>]) -> f64 {
    let stages = estimate.devices.iter().map(|d| d.stage).max().map_or(0, |s| s + 1);
    let tp = estimate.layout.tensor_parallel.max(1) as usize;
    let mut seconds = 0.0;
    for stage in 0..stages {
        let mut slowest: f64 = 0.0;
        let mut layers = 0u64;
        let mut nvlink = true;
        for (d, speed) in estimate.devices.iter().zip(devices).filter(|(d, _)| d.stage == stage) {
            let kv = d.kv_cache.get() as f64 / estimate.concurrency.max(1) as f64 / 2.0;
            let read = d.weights.get() as f64 + kv + speed.extra_read;
            slowest = slowest.max(read / speed.bandwidth.max(1.0));
            if speed.gpu {
                slowest = slowest.max(d.layers.len() as f64 * GPU_LAYER_S);
            }
            layers = d.layers.len();
            nvlink &= speed.nvlink_stage;
        }
        seconds += slowest;
        if tp > 1 {
            let each = if nvlink { ALLREDUCE_NVLINK_S } else { ALLREDUCE_PCIE_S };
            seconds += 2.0 * layers as f64 * each;
        }
    }
    if devices.iter().take(estimate.devices.len()).any(|d| d.gpu) {
        seconds += GPU_TOKEN_S;
    }
    // Activations handed to the next stage: one hidden vector per token, 16-bit.
    let activation_bytes = hidden as f64 * 2.0;
    for hop in hops {
        seconds += match hop {
            None => STAGE_HOP_LOCAL_S,
            Some(hop) => hop.latency_s + activation_bytes * 8.0 / hop.bits_per_s.max(1) as f64,
        };
    }
    if seconds <= 0.0 { 0.0 } else { 1.0 / seconds }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(tier: Precision, gpus: u32, tokens_per_s: f64) -> ScoreParts {
        ScoreParts {
            tier,
            cpu: false,
            offload: false,
            degraded: 0,
            gpus,
            nodes: 1,
            tokens_per_s,
            measured: false,
            card_gib: 80 * u64::from(gpus),
        }
    }

    #[test]
    fn preference_orders_the_levels() {
        let bf16_four = parts(Precision::Bf16, 4, 60.0);
        let int4_one = parts(Precision::Int4, 1, 90.0);
        assert!(bf16_four.score(Preference::Quality) > int4_one.score(Preference::Quality));
        assert!(bf16_four.score(Preference::Speed) < int4_one.score(Preference::Speed));
        assert!(bf16_four.score(Preference::FewestGpus) < int4_one.score(Preference::FewestGpus));
        let degraded = ScoreParts {
            degraded: 1,
            ..bf16_four
        };
        assert!(degraded.score(Preference::Quality) < parts(Precision::Int2, 8, 1.0).score(Preference::Quality));
        let offload = ScoreParts {
            offload: true,
            ..bf16_four
        };
        assert!(offload.score(Preference::Quality) < degraded.score(Preference::Quality));
    }
}
