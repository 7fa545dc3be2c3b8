//! The memory of LoRA adapters served on a shared base instance, per engine.
//!
//! Agents whose adapters share a base model share one base instance serving all their
//! adapters, so the planner adds to the base model's [`Estimate`](super::Estimate)
//! what the adapters cost on that instance:
//!
//! - **vLLM** (`--enable-lora --max-loras N --max-lora-rank R`) preallocates, at start,
//!   `N` slots of rank `R` for the `A` and `B` matrices of every LoRA-capable linear
//!   layer of every decoder layer, whatever the adapters target; an adapter in use is
//!   copied into a slot. The adapters themselves wait in a host-RAM cache of up to
//!   `--max-cpu-loras` adapters. See [`vllm_lora_layer_slot_elements`].
//! - **llama.cpp** (`--lora FILE`) loads each adapter's tensors as they are in its GGUF
//!   file, next to the base layers they adapt; nothing is preallocated.
//!
//! [`adapter_memory`] puts the figures together in an [`AdapterMemory`] the planner can
//! show. Everything here is pure.

use crate::adapter::AdapterError;
use serde::Serialize;

use super::split::kv_heads_per_rank;
use super::{Engine, ModelShape};
use crate::QuantMethod;
use crate::adapter::{AdapterFormat, AdapterInfo};
use crate::config::{Architecture, MlpKind};
use crate::{Bytes, Error, SafetensorsDtype};

/// The `--max-lora-rank` values vLLM accepts (`MaxLoRARanks` in `vllm/config/lora.py`).
pub const VLLM_MAX_LORA_RANKS: [u64; 9] = [1, 8, 16, 32, 64, 128, 256, 320, 512];

/// One adapter as the memory model sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct AdapterSize {
    /// Its largest rank (what a vLLM slot must hold).
    pub rank: u64,
    /// Elements of all its tensors.
    pub elements: u64,
    /// Bytes of its tensors as stored in its weight file.
    pub stored: Bytes,
    /// Whether that file is a llama.cpp GGUF adapter (loaded by llama.cpp as stored).
    pub gguf: bool,
}

impl AdapterSize {
    /// The figures of an inspected adapter.
    pub fn of(info: &AdapterInfo) -> AdapterSize {
        AdapterSize {
            rank: info.lora.max_rank().max(info.rank),
            elements: info.elements(),
            stored: info.stored_bytes(),
            gguf: matches!(info.format, AdapterFormat::Gguf { .. }),
        }
    }
}

/// The LoRA flags vLLM is started with, and the layout they apply to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct VllmLoraSettings {
    /// `--max-loras`: adapters usable in one batch, each with its slot on every GPU.
    pub max_loras: u64,
    /// `--max-lora-rank`: the rank every slot is sized for; one of
    /// [`VLLM_MAX_LORA_RANKS`].
    pub max_lora_rank: u64,
    /// `--max-cpu-loras`: adapters kept in host RAM; `None` is vLLM's default,
    /// `max_loras`.
    pub max_cpu_loras: Option<u64>,
    /// `--lora-dtype`: the slots' element type. vLLM's default (`auto`) is the base
    /// model's dtype.
    pub lora_dtype: SafetensorsDtype,
    /// The engine's tensor-parallel degree.
    pub tensor_parallel: u64,
    /// `--fully-sharded-loras`: shard the rank of column-parallel `A` and the output of
    /// row-parallel `B` across ranks too.
    pub fully_sharded: bool,
}

impl VllmLoraSettings {
    /// The smallest settings that serve `adapters` at once: one slot each (at least
    /// one), the smallest allowed rank that holds the largest, the host cache at
    /// vLLM's default, no full sharding.
    ///
    /// Errors: [`Error::InvalidEstimateRequest`] when an adapter's rank exceeds the
    /// largest rank vLLM allows (512), or the tensor-parallel degree is 0.
    pub fn for_adapters(
        adapters: &[AdapterSize],
        lora_dtype: SafetensorsDtype,
        tensor_parallel: u64,
    ) -> Result<VllmLoraSettings, Error> {
        let rank = adapters.iter().map(|a| a.rank).max().unwrap_or(1);
        let max_lora_rank = vllm_max_lora_rank(rank).ok_or_else(|| Error::InvalidEstimateRequest {
            field: "adapter rank",
            found: rank.to_string(),
            expected: "at most 512, the largest --max-lora-rank vLLM accepts",
        })?;
        let settings = VllmLoraSettings {
            max_loras: (adapters.len() as u64).max(1),
            max_lora_rank,
            max_cpu_loras: None,
            lora_dtype,
            tensor_parallel,
            fully_sharded: false,
        };
        settings.check()?;
        Ok(settings)
    }

    /// `--max-cpu-loras` in force.
    pub fn cpu_loras(&self) -> u64 {
        self.max_cpu_loras.unwrap_or(self.max_loras)
    }

    /// Checks the flags as vLLM's `LoRAConfig` does.
    ///
    /// Errors: [`Error::InvalidEstimateRequest`] for `max_loras` 0, a rank vLLM does not
    /// accept, `max_cpu_loras` below `max_loras`, a tensor-parallel degree of 0, or
    /// (fully sharded) a rank the degree does not divide.
    pub fn check(&self) -> Result<(), Error> {
        let invalid = |field, found: u64, expected| Error::InvalidEstimateRequest {
            field,
            found: found.to_string(),
            expected,
        };
        if self.max_loras == 0 {
            return Err(invalid("max_loras", 0, "at least 1"));
        }
        if !VLLM_MAX_LORA_RANKS.contains(&self.max_lora_rank) {
            return Err(invalid(
                "max_lora_rank",
                self.max_lora_rank,
                "one of 1, 8, 16, 32, 64, 128, 256, 320, 512 (vLLM's choices)",
            ));
        }
        if self.cpu_loras() < self.max_loras {
            return Err(invalid("max_cpu_loras", self.cpu_loras(), "at least max_loras"));
        }
        if self.tensor_parallel == 0 {
            return Err(invalid("tensor_parallel", 0, "at least 1"));
        }
        if self.fully_sharded && !self.max_lora_rank.is_multiple_of(self.tensor_parallel) {
            return Err(invalid(
                "max_lora_rank",
                self.max_lora_rank,
                "a multiple of the tensor-parallel degree with --fully-sharded-loras",
            ));
        }
        Ok(())
    }
}

/// The smallest `--max-lora-rank` vLLM accepts that holds an adapter of `rank`; `None`
/// above 512.
pub fn vllm_max_lora_rank(rank: u64) -> Option<u64> {
    VLLM_MAX_LORA_RANKS.iter().copied().find(|&allowed| allowed >= rank)
}

/// Bytes of `elements` adapter elements once an engine holds them as `dtype`: vLLM
/// converts every LoRA tensor to its LoRA dtype (the model's by default) when it loads
/// an adapter (`LoRAModel.from_local_checkpoint` with `lora_config.lora_dtype`);
/// `convert_lora_to_gguf.py` writes them in its `--outtype`.
///
/// `elements × bits(dtype) / 8`.
///
/// Errors: [`Error::EstimateOverflow`] past 2^64 bytes, [`Error::MisalignedSubByte`]
/// for a sub-byte dtype that does not fill whole bytes.
pub fn loaded_adapter_bytes(elements: u64, dtype: SafetensorsDtype) -> Result<Bytes, Error> {
    dtype.tensor_bytes(&[elements]).map_err(|error| match error {
        Error::TensorTooLarge { .. } => Error::EstimateOverflow { what: "adapter bytes" },
        other => other,
    })
}

/// Elements of one vLLM LoRA slot in one decoder layer, on one GPU.
///
/// The formula follows `create_lora_weights` of vLLM's LoRA layers
/// (`vllm/lora/layers/base_linear.py`, `column_parallel_linear.py`,
/// `row_parallel_linear.py` and `fused_moe.py`): each LoRA-capable linear layer gets,
/// per slot and per packed slice, an `A` buffer of `rank_a × in` and a `B` buffer of
/// `out × R`, with `R` the max LoRA rank and `t` the tensor-parallel degree:
///
/// - column-parallel layers (q/k/v, gate/up, a plain MLP's up) keep `A` whole
///   (`rank_a = R`, or `R / t` fully sharded) and shard `B`'s output: `out / t`;
/// - row-parallel layers (o, down) shard `A`'s input (`in / t`, `rank_a = R`) and keep
///   `B` whole (`out / t` fully sharded);
/// - q, k and v are three slices (three `A` of `R × hidden`) unless the model fuses them
///   in one (phi3: one slice); gate and up two slices unless fused (phi3). K and V
///   outputs are the rank's KV heads (one replicated head when `t` exceeds them);
/// - a mixture-of-experts layer has, per expert, the gate/up slices and the down
///   projection shaped as above, plus its router (a replicated `hidden → experts`
///   linear layer).
///
/// So per layer (dense, gated, unfused, `t = 1`):
/// `R × (3·hidden + (q + 2·kv) + q + hidden + 2·hidden + 2·inter + inter + hidden)`.
/// Embedding and output-projection LoRA (`lm_head`), the vision tower's (opt-in), and
/// Punica's per-batch index buffers (tokens × a few integers) are not counted.
pub fn vllm_lora_layer_slot_elements(shape: &ModelShape, settings: &VllmLoraSettings) -> Result<u64, Error> {
    let overflow = || Error::EstimateOverflow { what: "vLLM LoRA slot" };
    let t = settings.tensor_parallel.max(1);
    let r = settings.max_lora_rank;
    let (r_a, r_b) = if settings.fully_sharded {
        (r.div_ceil(t), r)
    } else {
        (r, r)
    };
    let h = shape.hidden;
    // Row-parallel B keeps the whole output unless fully sharded.
    let h_out = if settings.fully_sharded { h.div_ceil(t) } else { h };
    let q = shape.q_width().div_ceil(t);
    let kv = kv_heads_per_rank(shape.kv_heads, t)
        .checked_mul(shape.head_dim)
        .ok_or_else(overflow)?;
    let inter = shape.intermediate.div_ceil(t);

    // Each term is (A elements) + (B elements) of one linear layer, all slices.
    let column = |slices: u64, out: u64| -> Option<u64> {
        slices
            .checked_mul(r_a)?
            .checked_mul(h)?
            .checked_add(out.checked_mul(r_b)?)
    };
    let row = |inp: u64| -> Option<u64> { r.checked_mul(inp)?.checked_add(h_out.checked_mul(r_b)?) };

    let qkv_slices = if shape.fused_qkv { 1 } else { 3 };
    let attention = column(
        qkv_slices,
        q.checked_add(kv.checked_mul(2).ok_or_else(overflow)?)
            .ok_or_else(overflow)?,
    )
    .zip(row(q))
    .and_then(|(a, b)| a.checked_add(b))
    .ok_or_else(overflow)?;

    let (up_slices, up_out) = match shape.mlp {
        // phi3 stores gate and up as one `gate_up_proj`, one slice of twice the width.
        MlpKind::Gated if shape.text_architecture == Architecture::Phi3 => (1, inter.checked_mul(2)),
        MlpKind::Gated => (2, inter.checked_mul(2)),
        MlpKind::Plain => (1, Some(inter)),
    };
    let expert = up_out
        .and_then(|out| column(up_slices, out))
        .zip(row(inter))
        .and_then(|(a, b)| a.checked_add(b))
        .ok_or_else(overflow)?;
    let mlp = match shape.moe {
        None => expert,
        Some(moe) => {
            let router = r
                .checked_mul(h)
                .zip(moe.num_experts.checked_mul(r))
                .and_then(|(a, b)| a.checked_add(b));
            expert
                .checked_mul(moe.num_experts)
                .zip(router)
                .and_then(|(a, b)| a.checked_add(b))
                .ok_or_else(overflow)?
        }
    };
    attention.checked_add(mlp).ok_or_else(overflow)
}

/// Bytes vLLM preallocates for LoRA on each GPU of an engine holding all of `shape`'s
/// decoder layers: `max_loras × layers × (slot elements per layer) × bytes(lora_dtype)`
/// (see [`vllm_lora_layer_slot_elements`]). Under pipeline parallelism each stage holds
/// its own layers' share.
///
/// Errors: [`AdapterError::LoraUnsupported`] for architectures vLLM serves no LoRA on (falcon,
/// gpt2: their vLLM models do not implement `SupportsLoRA`); those of
/// [`VllmLoraSettings::check`]; [`Error::EstimateOverflow`].
pub fn vllm_lora_overhead(shape: &ModelShape, settings: &VllmLoraSettings) -> Result<Bytes, Error> {
    settings.check()?;
    if matches!(shape.text_architecture, Architecture::Falcon | Architecture::Gpt2) {
        return Err(AdapterError::LoraUnsupported {
            engine: "vLLM",
            architecture: shape.text_architecture,
            help: "serve the adapter with llama.cpp (--lora), or merge it into the base model",
        }
        .into());
    }
    let per_layer = vllm_lora_layer_slot_elements(shape, settings)?;
    let elements = per_layer
        .checked_mul(shape.layers)
        .and_then(|e| e.checked_mul(settings.max_loras))
        .ok_or(Error::EstimateOverflow {
            what: "vLLM LoRA slots",
        })?;
    loaded_adapter_bytes(elements, settings.lora_dtype)
}

/// The engine serving the adapters, with its LoRA settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(tag = "engine", rename_all = "snake_case")]
pub enum AdapterEngine {
    /// vLLM with `--enable-lora`.
    Vllm(VllmLoraSettings),
    /// llama.cpp with `--lora`. An adapter that is not GGUF is converted by
    /// `convert_lora_to_gguf.py` with `--outtype convert_dtype` (its default is F32).
    LlamaCpp {
        /// The element type of converted adapters.
        convert_dtype: SafetensorsDtype,
    },
}

/// What a set of adapters costs on the base instance serving them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AdapterMemory {
    /// Each adapter (in the order given) as the engine holds it: in vLLM's LoRA dtype
    /// (host RAM), or as llama.cpp loads it (GPU).
    pub per_adapter: Vec<Bytes>,
    /// Memory the engine reserves for adapters on each GPU whatever they are: vLLM's
    /// slots; zero for llama.cpp.
    pub engine_overhead: Bytes,
    /// What each GPU of the instance adds: vLLM's slots (adapters are copied into
    /// them); for llama.cpp all adapters' tensors (on one GPU; a layer split spreads
    /// them with their layers, so this bounds any one device).
    pub gpu_per_device: Bytes,
    /// Host RAM: vLLM's cache of up to `--max-cpu-loras` adapters (the largest ones,
    /// when more adapters are served than it holds); zero for llama.cpp.
    pub host: Bytes,
    /// Everything: the GPU figure on every GPU of the instance (vLLM: the
    /// tensor-parallel degree; llama.cpp: one copy), plus host RAM.
    pub total: Bytes,
    /// How the figures were computed, for the planner's explanation.
    pub detail: String,
}

/// What `adapters` cost on one base instance of `shape` under `engine`.
///
/// - vLLM: `engine_overhead = gpu_per_device =` [`vllm_lora_overhead`];
///   `per_adapter = elements × bytes(lora_dtype)`; `host =` the sum of the
///   `max_cpu_loras` largest of them; `total = gpu_per_device × tp + host`.
/// - llama.cpp: `per_adapter =` the stored bytes of a GGUF adapter, or `elements ×
///   bytes(convert_dtype)` for one to be converted; `gpu_per_device = total =` their
///   sum; nothing preallocated.
///
/// Errors: [`Error::InvalidEstimateRequest`] for an adapter whose rank exceeds vLLM's
/// `max_lora_rank` (vLLM refuses to load it) or settings vLLM refuses; those of
/// [`vllm_lora_overhead`]; [`Error::EstimateOverflow`].
pub fn adapter_memory(
    shape: &ModelShape,
    adapters: &[AdapterSize],
    engine: &AdapterEngine,
) -> Result<AdapterMemory, Error> {
    let overflow = |what| Error::EstimateOverflow { what };
    let sum = |bytes: &[Bytes]| {
        bytes
            .iter()
            .try_fold(Bytes::ZERO, |acc, &b| acc.checked_add(b))
            .ok_or_else(|| overflow("adapter bytes"))
    };
    match engine {
        AdapterEngine::Vllm(settings) => {
            if let Some(too_big) = adapters.iter().find(|a| a.rank > settings.max_lora_rank) {
                return Err(Error::InvalidEstimateRequest {
                    field: "max_lora_rank",
                    found: format!("{} for an adapter of rank {}", settings.max_lora_rank, too_big.rank),
                    expected: "at least every adapter's rank (vLLM refuses a larger adapter)",
                });
            }
            let slots = vllm_lora_overhead(shape, settings)?;
            let per_adapter = adapters
                .iter()
                .map(|a| loaded_adapter_bytes(a.elements, settings.lora_dtype))
                .collect::<Result<Vec<Bytes>, Error>>()?;
            let mut largest = per_adapter.clone();
            largest.sort_unstable_by(|a, b| b.cmp(a));
            let cached = usize::try_from(settings.cpu_loras()).unwrap_or(usize::MAX);
            let host = sum(largest.get(..cached.min(largest.len())).unwrap_or_default())?;
            let total = slots
                .checked_mul(settings.tensor_parallel)
                .and_then(|gpus| gpus.checked_add(host))
                .ok_or_else(|| overflow("adapter total"))?;
            let detail = format!(
                "vLLM: {} slots of rank {} in {} on each of {} GPU(s) ({} layers × all LoRA-capable linear layers), \
                 {} adapter(s) cached in host RAM (--max-cpu-loras {})",
                settings.max_loras,
                settings.max_lora_rank,
                settings.lora_dtype,
                settings.tensor_parallel,
                shape.layers,
                cached.min(largest.len()),
                settings.cpu_loras()
            );
            Ok(AdapterMemory {
                per_adapter,
                engine_overhead: slots,
                gpu_per_device: slots,
                host,
                total,
                detail,
            })
        }
        AdapterEngine::LlamaCpp { convert_dtype } => {
            let per_adapter = adapters
                .iter()
                .map(|a| {
                    if a.gguf {
                        Ok(a.stored)
                    } else {
                        loaded_adapter_bytes(a.elements, *convert_dtype)
                    }
                })
                .collect::<Result<Vec<Bytes>, Error>>()?;
            let all = sum(&per_adapter)?;
            let detail = format!(
                "llama.cpp: {} adapter(s) loaded as stored in their GGUF files (others converted to {}), \
                 no preallocated slots",
                adapters.len(),
                convert_dtype
            );
            Ok(AdapterMemory {
                per_adapter,
                engine_overhead: Bytes::ZERO,
                gpu_per_device: all,
                host: Bytes::ZERO,
                total: all,
                detail,
            })
        }
    }
}

/// What adapters add to an estimate: the bytes on a device holding every decoder
/// layer (a device holding some of them holds their share), host RAM, and how.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct LoraLoad {
    /// On a device holding all layers: vLLM's slots (per GPU of a stage), or llama.cpp's
    /// adapter tensors.
    pub all_layers: Bytes,
    /// vLLM's host-RAM cache of adapters.
    pub host: Bytes,
    /// How, for the estimate's notes.
    pub note: String,
}

/// The element type of vLLM's LoRA slots when `--lora-dtype` is `auto`: the model's
/// compute dtype, FP16 for checkpoints vLLM runs in half precision (FP16, FP32 and the
/// GPTQ/AWQ kernels), BF16 otherwise. Both are two bytes.
fn vllm_lora_dtype(method: Option<QuantMethod>) -> SafetensorsDtype {
    match method {
        Some(QuantMethod::Fp16 | QuantMethod::Fp32 | QuantMethod::Gptq | QuantMethod::Awq) => SafetensorsDtype::F16,
        _ => SafetensorsDtype::BF16,
    }
}

/// What serving `adapters` on an instance of `shape` under `engine` (`tp` GPUs per
/// stage) adds; `None` without adapters.
///
/// Errors: [`AdapterError::LoraUnsupported`] for the built-in engine (candle's
/// transformers load no adapters) and for vLLM on architectures without LoRA; those of
/// [`adapter_memory`].
pub(super) fn lora_load(
    shape: &ModelShape,
    adapters: &[AdapterSize],
    engine: Engine,
    method: Option<QuantMethod>,
    tp: u64,
) -> Result<Option<LoraLoad>, Error> {
    if adapters.is_empty() {
        return Ok(None);
    }
    let adapter_engine = match engine {
        Engine::Vllm(_) => AdapterEngine::Vllm(VllmLoraSettings::for_adapters(adapters, vllm_lora_dtype(method), tp)?),
        Engine::LlamaCpp(_) => AdapterEngine::LlamaCpp {
            convert_dtype: SafetensorsDtype::F32,
        },
        Engine::Candle(_) => {
            return Err(AdapterError::LoraUnsupported {
                engine: "the built-in engine",
                architecture: shape.text_architecture,
                help: "serve a PEFT adapter with vLLM or a GGUF adapter with llama.cpp, or merge it into the base model",
            }
            .into());
        }
    };
    let memory = adapter_memory(shape, adapters, &adapter_engine)?;
    Ok(Some(LoraLoad {
        all_layers: memory.gpu_per_device,
        host: memory.host,
        note: memory.detail,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ModelConfig;

    /// Meta-Llama-3-8B: 32 layers, hidden 4096, 32 heads × 128, 8 KV heads (k/v are
    /// 4096 → 1024), gated MLP of 14336.
    fn llama_8b() -> ModelShape {
        let config = ModelConfig::from_json(
            r#"{"model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32,
                "num_attention_heads": 32, "num_key_value_heads": 8,
                "intermediate_size": 14336, "vocab_size": 128256}"#,
        )
        .unwrap();
        ModelShape::from_config(&config).unwrap()
    }

    fn settings(max_loras: u64, max_lora_rank: u64, tp: u64) -> VllmLoraSettings {
        VllmLoraSettings {
            max_loras,
            max_lora_rank,
            max_cpu_loras: None,
            lora_dtype: SafetensorsDtype::BF16,
            tensor_parallel: tp,
            fully_sharded: false,
        }
    }

    /// Worked by hand. A rank-16 adapter on q, k, v and o of Llama-3-8B, per layer:
    /// q `A` 16×4096 + `B` 4096×16 = 131,072; k and v `A` 16×4096 + `B` 1024×16 = 81,920
    /// each; o 131,072: 425,984 elements. Over 32 layers 13,631,488 elements, in BF16
    /// 27,262,976 bytes = exactly 26 MiB.
    #[test]
    fn a_rank_16_qkvo_adapter_on_llama_8b_takes_26_mib_in_bf16() {
        let per_layer = 2 * (16 * 4096 + 4096 * 16) + 2 * (16 * 4096 + 1024 * 16);
        assert_eq!(per_layer, 425_984);
        let elements = 32 * per_layer;
        assert_eq!(elements, 13_631_488);
        let bytes = loaded_adapter_bytes(elements, SafetensorsDtype::BF16).unwrap();
        assert_eq!(bytes, Bytes::new(26 << 20));
        assert_eq!(
            loaded_adapter_bytes(elements, SafetensorsDtype::F32).unwrap(),
            Bytes::new(52 << 20)
        );
        assert!(matches!(
            loaded_adapter_bytes(u64::MAX, SafetensorsDtype::F32),
            Err(Error::EstimateOverflow { .. })
        ));
    }

    /// Worked by hand. One vLLM slot of rank 16 in one Llama-3-8B layer, TP 1:
    /// qkv (three slices) `A` 3×16×4096 = 196,608, `B` (4096 + 2×1024)×16 = 98,304;
    /// o `A` 16×4096 + `B` 4096×16 = 131,072; gate/up (two slices) `A` 2×16×4096 =
    /// 131,072, `B` 2×14336×16 = 458,752; down `A` 16×14336 = 229,376, `B` 4096×16 =
    /// 65,536. Sum 1,310,720 = 16 × 81,920. × 32 layers × 2 bytes = 80 MiB per slot.
    #[test]
    fn a_vllm_slot_on_llama_8b_is_80_mib_in_bf16() {
        let shape = llama_8b();
        let s = settings(1, 16, 1);
        assert_eq!(vllm_lora_layer_slot_elements(&shape, &s).unwrap(), 1_310_720);
        assert_eq!(vllm_lora_overhead(&shape, &s).unwrap(), Bytes::new(80 << 20));
        assert_eq!(
            vllm_lora_overhead(&shape, &settings(4, 16, 1)).unwrap(),
            Bytes::new(320 << 20)
        );
        // Doubling the rank doubles every buffer.
        assert_eq!(
            vllm_lora_overhead(&shape, &settings(1, 32, 1)).unwrap(),
            Bytes::new(160 << 20)
        );
    }

    /// TP 2 shards the column layers' `B` and the row layers' `A`; per rank and unit of
    /// rank: qkv 3×4096 + (2048 + 2×512), o 2048 + 4096, gate/up 2×4096 + 2×7168, down
    /// 7168 + 4096: 12,288 + 3,072 + 6,144 + 22,528 + 11,264 = 55,296.
    #[test]
    fn tensor_parallelism_shards_half_of_each_pair() {
        let shape = llama_8b();
        assert_eq!(
            vllm_lora_layer_slot_elements(&shape, &settings(1, 16, 2)).unwrap(),
            16 * 55_296
        );
        let mut fully = settings(1, 16, 2);
        fully.fully_sharded = true;
        // Fully sharded: qkv A 3×8×4096, o B 2048×16, down B 2048×16, gate/up A 2×8×4096.
        let expected =
            3 * 8 * 4096 + 16 * 3072 + 16 * 2048 + 2048 * 16 + 2 * 8 * 4096 + 16 * 14336 + 16 * 7168 + 2048 * 16;
        assert_eq!(vllm_lora_layer_slot_elements(&shape, &fully).unwrap(), expected);
    }

    #[test]
    fn settings_are_checked_as_vllm_checks_them() {
        assert_eq!(vllm_max_lora_rank(16), Some(16));
        assert_eq!(vllm_max_lora_rank(17), Some(32));
        assert_eq!(vllm_max_lora_rank(300), Some(320));
        assert_eq!(vllm_max_lora_rank(513), None);
        let shape = llama_8b();
        for bad in [settings(0, 16, 1), settings(1, 24, 1), settings(1, 16, 0)] {
            assert!(
                matches!(
                    vllm_lora_overhead(&shape, &bad),
                    Err(Error::InvalidEstimateRequest { .. })
                ),
                "{bad:?}"
            );
        }
        let mut cpu = settings(4, 16, 1);
        cpu.max_cpu_loras = Some(2);
        assert!(matches!(
            cpu.check(),
            Err(Error::InvalidEstimateRequest {
                field: "max_cpu_loras",
                ..
            })
        ));
        let big = AdapterSize {
            rank: 1024,
            elements: 1,
            stored: Bytes::new(2),
            gguf: false,
        };
        assert!(VllmLoraSettings::for_adapters(&[big], SafetensorsDtype::BF16, 1).is_err());
        let err = adapter_memory(&shape, &[big], &AdapterEngine::Vllm(settings(1, 512, 1))).unwrap_err();
        assert!(err.to_string().contains("rank 1024"), "{err}");
    }

    fn fixture(json: &str) -> ModelShape {
        ModelShape::from_config(&ModelConfig::from_json(json).unwrap()).unwrap()
    }

    /// Worked by hand, per unit of rank at TP 1.
    ///
    /// Phi-3-mini (hidden 3072, 32 heads of 96 and as many KV heads, MLP 8192, fused
    /// qkv and gate_up): qkv is one slice, `A` 3072 plus `B` 3 × 3072; o is 3072 plus
    /// 3072; gate_up is one slice, 3072 plus 2 × 8192; down is 8192 plus 3072: 49,152.
    ///
    /// Mixtral-8x7B (hidden 4096, KV 8 × 128, 8 experts of 14336): attention is
    /// 3 × 4096 plus 6144 plus 4096 plus 4096 = 26,624; each expert 2 × 4096 plus
    /// 2 × 14336 plus 14336 plus 4096 = 55,296, eight of them; the router 4096 plus 8:
    /// 473,096 in all.
    #[test]
    fn fused_and_mixture_of_experts_layers_follow_vllm_s_wrappers() {
        let phi3 = fixture(include_str!(
            "../../tests/fixtures/configs/microsoft--Phi-3-mini-4k-instruct.json"
        ));
        assert_eq!(
            vllm_lora_layer_slot_elements(&phi3, &settings(1, 8, 1)).unwrap(),
            8 * 49_152
        );
        let mixtral = fixture(include_str!(
            "../../tests/fixtures/configs/mistralai--Mixtral-8x7B-v0.1.json"
        ));
        assert_eq!(
            vllm_lora_layer_slot_elements(&mixtral, &settings(1, 8, 1)).unwrap(),
            8 * 473_096
        );
        // The hand-written Llama-3-8B shape of the other tests is the published one.
        let published = fixture(include_str!(
            "../../tests/fixtures/configs/meta-llama--Meta-Llama-3-8B.json"
        ));
        assert_eq!(
            vllm_lora_layer_slot_elements(&published, &settings(1, 16, 1)).unwrap(),
            vllm_lora_layer_slot_elements(&llama_8b(), &settings(1, 16, 1)).unwrap()
        );
    }

    /// Five rank-16 adapters on Llama-3-8B in BF16 under vLLM at TP 2: every GPU holds
    /// five 80 MiB slots at TP 1, so half of each column layer's `B` and row layer's
    /// `A` at TP 2 (`16 × 55,296` elements a layer, 32 layers, two bytes, five slots);
    /// host RAM caches the five adapters (26 MiB each). Under llama.cpp a GGUF adapter
    /// is loaded as stored, its share on each stage; the built-in engine refuses.
    #[test]
    fn adapters_enter_every_device_of_an_estimate() {
        use crate::Quantization;
        use crate::estimate::{Engine, EstimateRequest, Layout, WeightGroups, WeightsSource, estimate};
        let shape = llama_8b();
        let bf16 = Quantization::from_config(None, Some("bfloat16")).unwrap().unwrap();
        let weights = WeightGroups::resolve(&shape, WeightsSource::Computed(bf16)).unwrap();
        let adapter = AdapterSize {
            rank: 16,
            elements: 13_631_488,
            stored: Bytes::new(26 << 20),
            gguf: false,
        };
        let request = EstimateRequest::new(Engine::VLLM, 4096).with_layout(Layout::tensor_parallel(2));
        let base = estimate(&shape, &weights, &request).unwrap();
        let served = estimate(&shape, &weights, &request.clone().with_adapters(vec![adapter; 5])).unwrap();
        let slots = Bytes::new(5 * 32 * 16 * 55_296 * 2);
        for (b, s) in base.devices.iter().zip(&served.devices) {
            assert_eq!(s.total, b.total.checked_add(slots).unwrap());
            let line = s.items.iter().find(|i| i.what == "LoRA adapters").unwrap();
            assert_eq!(line.bytes, slots);
        }
        assert_eq!(served.host, base.host.checked_add(Bytes::new(5 * (26 << 20))).unwrap());
        assert!(
            served.notes.iter().any(|n| n.contains("5 slots of rank 16")),
            "{:?}",
            served.notes
        );

        let gguf = AdapterSize { gguf: true, ..adapter };
        let q8 = Quantization::from_gguf_file_name("Meta-Llama-3-8B.Q8_0.gguf").unwrap();
        let q8_weights = WeightGroups::resolve(&shape, WeightsSource::Computed(q8)).unwrap();
        let llama = EstimateRequest::new(Engine::LLAMA_CPP, 4096)
            .with_layout(Layout::pipeline(vec![1, 3]))
            .with_adapters(vec![gguf; 2]);
        let split = estimate(&shape, &q8_weights, &llama).unwrap();
        let shares: Vec<Bytes> = split
            .devices
            .iter()
            .map(|d| d.items.iter().find(|i| i.what == "LoRA adapters").unwrap().bytes)
            .collect();
        // 8 and 24 of 32 layers of the two adapters' 52 MiB.
        assert_eq!(shares, [Bytes::new(13 << 20), Bytes::new(39 << 20)]);
        assert_eq!(
            split.host,
            estimate(&shape, &q8_weights, &llama.clone().with_adapters(Vec::new()))
                .unwrap()
                .host
        );
        let err = estimate(
            &shape,
            &weights,
            &EstimateRequest::new(Engine::CANDLE_CPU, 4096).with_adapters(vec![adapter]),
        )
        .unwrap_err();
        assert!(err.to_string().contains("the built-in engine serves no LoRA"), "{err}");
    }

    #[test]
    fn vllm_refuses_lora_on_falcon_and_gpt2() {
        for json in [
            include_str!("../../tests/fixtures/configs/tiiuae--falcon-7b.json"),
            include_str!("../../tests/fixtures/configs/openai-community--gpt2.json"),
        ] {
            let err = vllm_lora_overhead(&fixture(json), &settings(1, 16, 1)).unwrap_err();
            assert!(
                matches!(err, Error::Adapter(AdapterError::LoraUnsupported { .. })),
                "{err}"
            );
            assert!(
                err.to_string().contains("help: serve the adapter with llama.cpp"),
                "{err}"
            );
        }
    }
}
