//! The memory of one device of a layout: its share of the weights, its layers' KV
//! cache, the engine's activations and overhead on it.

use std::ops::Range;

use super::engine::{
    ACTIVATION_HIDDEN_COPIES, ACTIVATION_INTERMEDIATE_COPIES, CANDLE_CPU_RUNTIME, CUDA_CONTEXT_NATIVE,
    CUDA_CONTEXT_TORCH, CandleDevice, Engine, KvDtype, LLAMA_CPP_CPU_RUNTIME, LLAMA_CPP_CUDA_POOL,
    LLAMA_CPP_PIPELINE_COPIES, LLAVA_NEXT_MAX_CROPS, NamedConstant, VLLM_CUDA_GRAPHS, VLLM_DISTRIBUTED_BUFFERS,
    VLLM_SAMPLER_COPIES, VLLM_VOCAB_PADDING,
};
use super::report::{Component, DeviceEstimate, DeviceKind, Item, LayerRange};
use super::split::{kv_heads_per_rank, scale, shard, vocab_rows_per_rank};
use super::{ModelShape, WeightGroups};
use crate::{Bytes, Error};

fn overflow(what: &'static str) -> Error {
    Error::EstimateOverflow { what }
}

/// Checked product of `factors`.
fn product(factors: &[u64], what: &'static str) -> Result<Bytes, Error> {
    factors
        .iter()
        .try_fold(1u64, |acc, &f| acc.checked_mul(f))
        .map(Bytes::new)
        .ok_or_else(|| overflow(what))
}

/// Everything a device's estimate depends on besides its position.
pub(super) struct Plan<'a> {
    pub shape: &'a ModelShape,
    pub weights: &'a WeightGroups,
    pub engine: Engine,
    pub tp: u64,
    pub stages: usize,
    pub kv_dtype: KvDtype,
    /// Cache slots of all sequences together.
    pub kv_tokens: u64,
    /// Context tokens of one sequence that attention reads.
    pub seq_tokens: u64,
    /// Runtime conversion of the stored weights: (numerator, denominator).
    pub weight_scale: (u64, u64),
    /// The leading stages on the host CPU (every stage of an engine on the CPU).
    pub cpu_stages: usize,
    /// LoRA adapters' bytes on a device holding every decoder layer (a device holding
    /// some holds their share).
    pub lora: Option<Bytes>,
    /// Whether lines get their detail.
    pub details: bool,
}

/// The lines of one device, with the constants they used.
pub(super) struct Lines {
    items: Vec<Item>,
    pub constants: Vec<NamedConstant>,
    /// Whether lines get their detail (how each figure was computed).
    details: bool,
}

impl Lines {
    /// A line's detail, made only when lines get theirs.
    fn text(&self, detail: impl FnOnce() -> String) -> String {
        if self.details { detail() } else { String::new() }
    }

    fn push(&mut self, component: Component, what: &'static str, bytes: Bytes, detail: impl FnOnce() -> String) {
        let detail = self.text(detail);
        self.items.push(Item {
            component,
            what,
            bytes,
            detail,
        });
    }

    fn uses(&mut self, constant: NamedConstant) -> u64 {
        if !self.constants.iter().any(|c| c.name == constant.name) {
            self.constants.push(constant);
        }
        constant.value
    }
}

impl Plan<'_> {
    fn is_llama_cpp(&self) -> bool {
        matches!(self.engine, Engine::LlamaCpp(_))
    }

    /// Whether `stage` runs on the host CPU.
    fn on_cpu(&self, stage: usize) -> bool {
        stage < self.cpu_stages
    }

    /// A weight line, converted to the engine's runtime dtype.
    fn weight(
        &self,
        lines: &mut Lines,
        what: &'static str,
        stored: Bytes,
        detail: impl FnOnce() -> String,
    ) -> Result<(), Error> {
        if stored == Bytes::ZERO {
            return Ok(());
        }
        let (num, den) = self.weight_scale;
        let bytes = scale(stored, num, den)?;
        lines.push(Component::Weights, what, bytes, detail);
        Ok(())
    }

    /// One rank's share of a vocab-parallel matrix (vLLM pads the vocabulary, then
    /// splits it); llama.cpp and candle keep it whole.
    fn vocab_share(&self, lines: &mut Lines, bytes: Bytes) -> Result<(Bytes, String), Error> {
        let vocab = self.shape.vocab;
        if self.tp <= 1 || vocab == 0 {
            return Ok((bytes, lines.text(|| format!("{vocab} rows"))));
        }
        let padding = lines.uses(VLLM_VOCAB_PADDING);
        let rows = vocab_rows_per_rank(vocab, self.tp, padding);
        let share = scale(bytes, rows, vocab)?;
        let detail = lines.text(|| format!("vocab-parallel: {rows} of {vocab} rows (padded to {padding})"));
        Ok((share, detail))
    }

    /// The estimate of the device at `rank` of `stage`, holding `layers`.
    pub fn device(&self, stage: usize, layers: Range<u64>, rank: u64) -> Result<(DeviceEstimate, Lines), Error> {
        let mut lines = Lines {
            items: Vec::new(),
            constants: Vec::new(),
            details: self.details,
        };
        let first = stage == 0;
        let last = stage + 1 == self.stages;
        let cpu = self.on_cpu(stage);
        self.weights_lines(&mut lines, first, last, cpu, &layers)?;
        if let Some(all) = self.lora {
            let n = layers.end.saturating_sub(layers.start);
            let layers_all = self.shape.layers;
            lines.push(Component::Weights, "LoRA adapters", scale(all, n, layers_all)?, || {
                format!("{n} of {layers_all} layers' adapter memory ({all} for all)")
            });
        }
        self.kv_line(&mut lines, &layers)?;
        self.activation_lines(&mut lines, first, last)?;
        self.overhead_lines(&mut lines, cpu);

        let mut sums = [Bytes::ZERO; 4];
        for item in &lines.items {
            let slot = &mut sums[item.component as usize];
            *slot = slot.checked_add(item.bytes).ok_or_else(|| overflow("device total"))?;
        }
        let total = sums
            .iter()
            .try_fold(Bytes::ZERO, |acc, &b| acc.checked_add(b))
            .ok_or_else(|| overflow("device total"))?;
        let estimate = DeviceEstimate {
            device: 0,
            stage,
            kind: if cpu { DeviceKind::Cpu } else { DeviceKind::Gpu },
            rank,
            layers: LayerRange {
                start: layers.start,
                end: layers.end,
            },
            weights: sums[Component::Weights as usize],
            kv_cache: sums[Component::KvCache as usize],
            activations: sums[Component::Activations as usize],
            overhead: sums[Component::Overhead as usize],
            total,
            items: std::mem::take(&mut lines.items),
        };
        Ok((estimate, lines))
    }

    fn weights_lines(
        &self,
        lines: &mut Lines,
        first: bool,
        last: bool,
        cpu: bool,
        layers: &Range<u64>,
    ) -> Result<(), Error> {
        let (w, s, k) = (self.weights, self.shape, self.tp);
        let kv_heads_rank = kv_heads_per_rank(s.kv_heads, k);
        let mut layer_bytes = Bytes::ZERO;
        for layer in w.layers.iter().take(to_usize(layers.end)).skip(to_usize(layers.start)) {
            let kv = scale(layer.attention_kv, kv_heads_rank, s.kv_heads.max(1))?;
            for part in [shard(layer.attention_qo, k), kv, shard(layer.mlp, k), layer.replicated] {
                layer_bytes = layer_bytes.checked_add(part).ok_or_else(|| overflow("layer weights"))?;
            }
        }
        let n = layers.end.saturating_sub(layers.start);
        let detail = || {
            if k > 1 {
                format!(
                    "{n} layers, 1/{k} of q/o and MLP, {kv_heads_rank} of {} KV heads, norms whole",
                    s.kv_heads
                )
            } else {
                format!("{n} layers")
            }
        };
        self.weight(lines, "decoder layers", layer_bytes, detail)?;

        if first {
            if !self.is_llama_cpp() {
                let (share, detail) = self.vocab_share(lines, w.embeddings)?;
                self.weight(lines, "token embedding", share, || detail)?;
            }
            self.weight(lines, "position embedding", w.position_embeddings, || {
                "replicated".to_owned()
            })?;
            let vision = shard(w.vision_layers, k)
                .checked_add(w.vision_other)
                .ok_or_else(|| overflow("vision weights"))?;
            self.weight(lines, "vision tower and projector", vision, || {
                if k > 1 {
                    format!("encoder layers 1/{k}, embeddings and projector whole")
                } else {
                    "encoder, projector, image_newline".to_owned()
                }
            })?;
            self.weight(lines, "unclassified tensors", w.other, || "replicated".to_owned())?;
        }
        if last {
            self.weight(lines, "final norm", w.final_norm, String::new)?;
            if w.lm_head > Bytes::ZERO {
                let (share, detail) = if self.is_llama_cpp() {
                    (w.lm_head, lines.text(|| format!("{} rows", s.vocab)))
                } else {
                    self.vocab_share(lines, w.lm_head)?
                };
                self.weight(lines, "output projection", share, || detail)?;
            } else if s.tied_embeddings && self.is_llama_cpp() && cpu {
                // On the CPU llama.cpp's output reuses the token embedding it keeps in host
                // RAM (the estimate's `host`): no copy.
            } else if s.tied_embeddings && (self.stages > 1 || self.is_llama_cpp()) {
                // Tied: the last stage needs the embedding matrix for its output. vLLM
                // builds it on the last pipeline rank; llama.cpp duplicates token_embd onto
                // the output layer's GPU (the original stays in host RAM).
                let (share, detail) = if self.is_llama_cpp() {
                    (w.embeddings, lines.text(|| format!("{} rows", s.vocab)))
                } else {
                    self.vocab_share(lines, w.embeddings)?
                };
                self.weight(lines, "output projection (tied copy)", share, || detail)?;
            }
        }
        Ok(())
    }

    fn kv_line(&self, lines: &mut Lines, layers: &Range<u64>) -> Result<(), Error> {
        let s = self.shape;
        let heads = kv_heads_per_rank(s.kv_heads, self.tp);
        let row = s.kv_row(heads, self.kv_dtype)?;
        let n = layers.end.saturating_sub(layers.start);
        let bytes = product(&[row.get(), n, self.kv_tokens], "KV cache")?;
        let detail = || {
            format!(
                "{n} layers × {} tokens × {} per layer-token ({heads} KV heads × {} × 2, {})",
                self.kv_tokens, row, s.head_dim, self.kv_dtype
            )
        };
        lines.push(Component::KvCache, "KV cache", bytes, detail);
        Ok(())
    }

    /// Elements alive per token in one decoder layer's forward pass on one rank.
    fn layer_elements(&self, lines: &mut Lines, tp: u64) -> Result<(u64, String), Error> {
        let s = self.shape;
        let hidden_copies = lines.uses(ACTIVATION_HIDDEN_COPIES);
        let inter_copies = lines.uses(ACTIVATION_INTERMEDIATE_COPIES);
        let topk = s.experts_per_token();
        let inter = s.intermediate.div_ceil(tp.max(1));
        // A routed MoE layer also holds each expert's hidden-sized output before the
        // weighted sum.
        let moe_hidden = if s.moe.is_some() { s.hidden } else { 0 };
        let per_expert = inter
            .checked_mul(inter_copies)
            .and_then(|x| x.checked_add(moe_hidden))
            .ok_or_else(|| overflow("activations"))?;
        let elements = s
            .hidden
            .checked_mul(hidden_copies)
            .zip(per_expert.checked_mul(topk))
            .and_then(|(a, b)| a.checked_add(b))
            .ok_or_else(|| overflow("activations"))?;
        let detail = lines.text(|| {
            if topk > 1 {
                format!(
                    "{hidden_copies}×{} + {topk} experts × ({inter_copies}×{inter} + {})",
                    s.hidden, moe_hidden
                )
            } else {
                format!("{hidden_copies}×{} + {inter_copies}×{inter}", s.hidden)
            }
        });
        Ok((elements, detail))
    }

    /// The vision tower's activations for the largest image request, in `bytes`-wide
    /// elements: hidden and MLP tensors plus one crop's attention scores per head.
    fn vision_line(&self, lines: &mut Lines, bytes: u64) -> Result<(), Error> {
        let Some(v) = self.shape.vision else {
            return Ok(());
        };
        let crops = lines.uses(LLAVA_NEXT_MAX_CROPS);
        let hidden_copies = lines.uses(ACTIVATION_HIDDEN_COPIES);
        let inter_copies = lines.uses(ACTIVATION_INTERMEDIATE_COPIES);
        let per_token = [
            v.hidden.checked_mul(hidden_copies),
            v.intermediate.checked_mul(inter_copies),
            v.heads.checked_mul(v.tokens_per_crop),
        ]
        .iter()
        .try_fold(0u64, |acc, x| x.and_then(|x| acc.checked_add(x)))
        .ok_or_else(|| overflow("vision activations"))?;
        let total = product(&[crops, v.tokens_per_crop, per_token, bytes], "vision activations")?;
        lines.push(Component::Activations, "vision encoder", total, || {
            format!(
                "{crops} crops × {} tokens × ({hidden_copies}×{} + {inter_copies}×{} + {}×{}) × {bytes} B",
                v.tokens_per_crop, v.hidden, v.intermediate, v.heads, v.tokens_per_crop
            )
        });
        Ok(())
    }

    fn activation_lines(&self, lines: &mut Lines, first: bool, last: bool) -> Result<(), Error> {
        let s = self.shape;
        match self.engine {
            Engine::Vllm(v) => {
                let t = v.max_num_batched_tokens;
                let (elements, detail) = self.layer_elements(lines, self.tp)?;
                let bytes = product(&[t, elements, 2], "activations")?;
                lines.push(Component::Activations, "profile-run peak", bytes, || {
                    format!("{t} batched tokens × ({detail}) × 2 B")
                });
                if last {
                    let copies = lines.uses(VLLM_SAMPLER_COPIES);
                    let rows = v.max_num_seqs.min(t);
                    let bytes = product(&[rows, s.vocab, 4, copies], "sampler")?;
                    lines.push(Component::Activations, "sampler logits", bytes, || {
                        format!("{rows} sequences × {} vocab × 4 B × {copies} copies", s.vocab)
                    });
                }
                if !first {
                    let bytes = product(&[t, s.hidden, 2, 2], "pipeline tensors")?;
                    lines.push(Component::Activations, "pipeline intermediate tensors", bytes, || {
                        format!("{t} tokens × {} × (hidden + residual) × 2 B", s.hidden)
                    });
                }
                if first {
                    self.vision_line(lines, 2)?;
                }
            }
            Engine::LlamaCpp(l) => {
                let t = l.n_ubatch;
                let n_ctx = self.kv_tokens;
                let (elements, detail) = self.layer_elements(lines, 1)?;
                let bytes = product(&[t, elements, 4], "compute buffer")?;
                lines.push(Component::Activations, "compute buffer: layer", bytes, || {
                    format!("{t} ubatch tokens × ({detail}) × 4 B (f32)")
                });
                let (bytes, detail) = if l.flash_attention {
                    (
                        product(&[t, n_ctx, 2], "KQ mask")?,
                        lines.text(|| format!("KQ mask {t} × {n_ctx} × 2 B; flash attention keeps no scores")),
                    )
                } else {
                    (
                        product(&[t, n_ctx, s.heads.saturating_add(1), 4], "attention scores")?,
                        lines.text(|| format!("{t} × {n_ctx} × ({} heads + mask) × 4 B", s.heads)),
                    )
                };
                lines.push(Component::Activations, "compute buffer: attention", bytes, || detail);
                if last {
                    let bytes = product(&[t, s.vocab, 4], "logits")?;
                    lines.push(Component::Activations, "compute buffer: logits", bytes, || {
                        format!("{t} tokens × {} vocab × 4 B", s.vocab)
                    });
                }
                if self.stages > 1 && l.n_batch > l.n_ubatch {
                    let copies = lines.uses(LLAMA_CPP_PIPELINE_COPIES);
                    let bytes = product(&[copies, t, s.hidden, 4], "pipeline copies")?;
                    lines.push(Component::Activations, "pipeline input copies", bytes, || {
                        format!("{copies} copies × {t} × {} × 4 B", s.hidden)
                    });
                }
                if first {
                    self.vision_line(lines, 4)?;
                }
            }
            Engine::Candle(c) => {
                let act = match c.device {
                    CandleDevice::Cpu => 4,
                    CandleDevice::Cuda => 2,
                };
                let t = c.prefill_chunk.min(self.seq_tokens.max(1));
                let (elements, detail) = self.layer_elements(lines, 1)?;
                let bytes = product(&[t, elements, act], "activations")?;
                lines.push(Component::Activations, "prefill chunk", bytes, || {
                    format!("{t} tokens × ({detail}) × {act} B")
                });
                let bytes = product(&[t, self.seq_tokens, s.heads, 4], "attention scores")?;
                lines.push(Component::Activations, "attention scores", bytes, || {
                    format!(
                        "{t} × {} context × {} heads × 4 B (f32 softmax)",
                        self.seq_tokens, s.heads
                    )
                });
                let bytes = product(&[s.vocab, 4], "logits")?;
                lines.push(Component::Activations, "logits", bytes, || {
                    format!("last token × {} vocab × 4 B", s.vocab)
                });
                self.vision_line(lines, act)?;
            }
        }
        Ok(())
    }

    fn overhead_lines(&self, lines: &mut Lines, cpu: bool) {
        let constant = |lines: &mut Lines, c: NamedConstant, what: &'static str, detail: &str| {
            lines.uses(c);
            lines.push(Component::Overhead, what, c.bytes(), || detail.to_owned());
        };
        match self.engine {
            Engine::Vllm(v) => {
                constant(lines, CUDA_CONTEXT_TORCH, "CUDA context", "per GPU, PyTorch process");
                if !v.enforce_eager {
                    constant(lines, VLLM_CUDA_GRAPHS, "CUDA graphs", "captured decode graphs");
                }
                if self.tp.saturating_mul(self.stages as u64) > 1 {
                    constant(
                        lines,
                        VLLM_DISTRIBUTED_BUFFERS,
                        "NCCL and all-reduce buffers",
                        "multi-GPU engine",
                    );
                }
            }
            Engine::LlamaCpp(_) if cpu => constant(
                lines,
                LLAMA_CPP_CPU_RUNTIME,
                "process runtime",
                "CPU stage: no CUDA context or pool",
            ),
            Engine::LlamaCpp(_) => {
                constant(lines, CUDA_CONTEXT_NATIVE, "CUDA context", "per GPU, native process");
                constant(
                    lines,
                    LLAMA_CPP_CUDA_POOL,
                    "CUDA memory pool",
                    "ggml_cuda_pool temporaries",
                );
            }
            Engine::Candle(c) => match c.device {
                CandleDevice::Cuda => constant(lines, CUDA_CONTEXT_NATIVE, "CUDA context", "native process"),
                CandleDevice::Cpu => constant(
                    lines,
                    CANDLE_CPU_RUNTIME,
                    "process runtime",
                    "no CUDA context on the CPU",
                ),
            },
        }
    }
}

fn to_usize(value: u64) -> usize {
    usize::try_from(value).unwrap_or(usize::MAX)
}
