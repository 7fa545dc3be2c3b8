//! The inference engines Skein starts, the flags it passes them, the KV-cache types each
//! accepts, and the named constants of their runtime overhead.
//!
//! Every figure that is not derived from the model's shape is a [`NamedConstant`] here,
//! with its origin; `docs/models.md` lists them with their uncertainty. They are
//! deliberately on the high side of what was observed: an estimate that says "fits" must
//! not run out of memory.

use std::fmt;

use serde::Serialize;

use crate::quant::{GgufFileType, QuantMethod, Quantization, WeightFormat};
use crate::{Bytes, Error, GgmlType};

/// The unit of a [`NamedConstant`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ConstantUnit {
    /// A byte count.
    Bytes,
    /// A number of tokens.
    Tokens,
    /// A plain count (copies of a tensor, image crops).
    Count,
}

/// A documented constant of the memory model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct NamedConstant {
    /// The constant's name, as in the code and `docs/models.md`.
    pub name: &'static str,
    /// Its value, in `unit`.
    pub value: u64,
    /// What the value counts.
    pub unit: ConstantUnit,
    /// Where the value comes from (kept out of serialized estimates; see the docs).
    #[serde(skip)]
    pub origin: &'static str,
}

impl NamedConstant {
    /// The value as bytes (meaningful when `unit` is [`ConstantUnit::Bytes`]).
    pub const fn bytes(&self) -> Bytes {
        Bytes::new(self.value)
    }
}

impl fmt::Display for NamedConstant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.unit {
            ConstantUnit::Bytes => write!(f, "{} = {}", self.name, Bytes::new(self.value)),
            ConstantUnit::Tokens => write!(f, "{} = {} tokens", self.name, self.value),
            ConstantUnit::Count => write!(f, "{} = {}", self.name, self.value),
        }
    }
}

const MIB: u64 = 1 << 20;

/// CUDA context of a PyTorch process (vLLM) on one GPU: the driver context, the kernels
/// of torch, flash-attention and triton loaded lazily, and cuBLAS/cuBLASLt workspaces.
pub const CUDA_CONTEXT_TORCH: NamedConstant = NamedConstant {
    name: "CUDA_CONTEXT_TORCH",
    value: 768 * MIB,
    unit: ConstantUnit::Bytes,
    origin: "nvidia-smi of an idle PyTorch process after CUDA init: 400-600 MiB with CUDA 12 lazy loading, \
             more with eager module loading; rounded up",
};

/// CUDA context of a native process (llama.cpp, candle with CUDA) on one GPU: driver
/// context, cuBLAS handle and the engine's kernels.
pub const CUDA_CONTEXT_NATIVE: NamedConstant = NamedConstant {
    name: "CUDA_CONTEXT_NATIVE",
    value: 384 * MIB,
    unit: ConstantUnit::Bytes,
    origin: "llama-server before the first buffer is allocated: 250-350 MiB per GPU with CUDA 12; rounded up",
};

/// llama.cpp's per-GPU memory pool (`ggml_cuda_pool`) for temporaries that are not in
/// the compute buffer: activations quantized to q8_1 for MMQ, dequantized tiles.
pub const LLAMA_CPP_CUDA_POOL: NamedConstant = NamedConstant {
    name: "LLAMA_CPP_CUDA_POOL",
    value: 128 * MIB,
    unit: ConstantUnit::Bytes,
    origin: "growth of llama-server's memory after the first prompt beyond its logged buffers: tens of MiB",
};

/// Resident memory of llama.cpp's process on a CPU-only node, or of its host stage under
/// partial offload, besides its logged model, KV and compute buffers: the binary and
/// its libraries, the vocabulary, the server's slots and HTTP threads. No CUDA context.
pub const LLAMA_CPP_CPU_RUNTIME: NamedConstant = NamedConstant {
    name: "LLAMA_CPP_CPU_RUNTIME",
    value: 64 * MIB,
    unit: ConstantUnit::Bytes,
    origin: "RSS of llama-server 11434 on SmolLM2-135M Q4_1 with --load-mode none, -c 512, CPU: 138 MiB, of which \
             13 MiB binary and libraries and ~20 MiB heap beyond the weights and KV cache; rounded up",
};

/// Resident memory of the built-in candle engine on the CPU besides weights, cache and
/// activations: the process, tokenizer, thread stacks and allocator slack.
pub const CANDLE_CPU_RUNTIME: NamedConstant = NamedConstant {
    name: "CANDLE_CPU_RUNTIME",
    value: 256 * MIB,
    unit: ConstantUnit::Bytes,
    origin: "RSS of a candle example binary with a tokenizer loaded before the weights: ~100 MiB; doubled",
};

/// Memory vLLM's CUDA graphs keep (captured for decode batch sizes up to 512), unless
/// `--enforce-eager`.
pub const VLLM_CUDA_GRAPHS: NamedConstant = NamedConstant {
    name: "VLLM_CUDA_GRAPHS",
    value: 1024 * MIB,
    unit: ConstantUnit::Bytes,
    origin: "vLLM's log line `Graph capturing finished ... took X GiB`: 0.1-0.9 GiB for 7B-70B models",
};

/// NCCL communicators and vLLM's custom all-reduce buffers on each GPU of a
/// multi-GPU engine.
pub const VLLM_DISTRIBUTED_BUFFERS: NamedConstant = NamedConstant {
    name: "VLLM_DISTRIBUTED_BUFFERS",
    value: 512 * MIB,
    unit: ConstantUnit::Bytes,
    origin: "NCCL channel buffers (a few MiB per peer and channel) plus custom all-reduce IPC buffers; \
             vLLM's `non_torch_memory` grows 0.1-0.5 GiB with TP > 1",
};

/// vLLM's KV-cache block size: each sequence's cache is a whole number of blocks.
pub const VLLM_BLOCK_SIZE: NamedConstant = NamedConstant {
    name: "VLLM_BLOCK_SIZE",
    value: 16,
    unit: ConstantUnit::Tokens,
    origin: "vLLM `CacheConfig.block_size` default on CUDA",
};

/// vLLM pads the vocabulary of its vocab-parallel embedding and `lm_head` to a multiple
/// of this many rows before splitting it across tensor-parallel ranks.
pub const VLLM_VOCAB_PADDING: NamedConstant = NamedConstant {
    name: "VLLM_VOCAB_PADDING",
    value: 64,
    unit: ConstantUnit::Count,
    origin: "vLLM `DEFAULT_VOCAB_PADDING_SIZE` in vocab_parallel_embedding.py",
};

/// Float32 `[sequences, vocab]` tensors alive at once in vLLM's sampler during its
/// profile run: logits, processed logits, probabilities.
pub const VLLM_SAMPLER_COPIES: NamedConstant = NamedConstant {
    name: "VLLM_SAMPLER_COPIES",
    value: 3,
    unit: ConstantUnit::Count,
    origin: "vLLM V1 `_dummy_sampler_run`: logits in float32, then temperature, softmax and top-k/p copies",
};

/// llama.cpp pads the KV cache to a multiple of this many cells.
pub const LLAMA_CPP_CTX_PAD: NamedConstant = NamedConstant {
    name: "LLAMA_CPP_CTX_PAD",
    value: 256,
    unit: ConstantUnit::Tokens,
    origin: "llama.cpp pads `n_ctx` to 256 (the flash-attention kernels' tile)",
};

/// Copies of each pipeline-stage input that llama.cpp's scheduler keeps when layers are
/// split across GPUs and `n_batch > n_ubatch` ("pipeline parallelism enabled").
pub const LLAMA_CPP_PIPELINE_COPIES: NamedConstant = NamedConstant {
    name: "LLAMA_CPP_PIPELINE_COPIES",
    value: 4,
    unit: ConstantUnit::Count,
    origin: "ggml-backend `GGML_SCHED_MAX_COPIES`",
};

/// Hidden-size activation tensors alive at once in one decoder layer: the residual
/// stream, the normalised input, the attention output (q is hidden-sized too) and a
/// projection output.
pub const ACTIVATION_HIDDEN_COPIES: NamedConstant = NamedConstant {
    name: "ACTIVATION_HIDDEN_COPIES",
    value: 4,
    unit: ConstantUnit::Count,
    origin: "live tensors of a pre-norm decoder layer's forward pass",
};

/// MLP-width activation tensors alive at once in one decoder layer (per routed expert):
/// gate output, up output and their activated product (vLLM's fused `gate_up` is two
/// widths plus one).
pub const ACTIVATION_INTERMEDIATE_COPIES: NamedConstant = NamedConstant {
    name: "ACTIVATION_INTERMEDIATE_COPIES",
    value: 3,
    unit: ConstantUnit::Count,
    origin: "live tensors of a gated MLP; vLLM fused-MoE `intermediate_cache1/2` are 2 + 1 widths per expert",
};

/// Image crops a LLaVA-NeXT request can carry through the vision tower at once: the
/// base image plus up to four tiles of the largest `image_grid_pinpoints` (672×672).
pub const LLAVA_NEXT_MAX_CROPS: NamedConstant = NamedConstant {
    name: "LLAVA_NEXT_MAX_CROPS",
    value: 5,
    unit: ConstantUnit::Count,
    origin: "LLaVA-NeXT anyres: 2×2 tiles of 336 px plus the resized base image",
};

/// Every constant, in the order `docs/models.md` lists them.
pub const ALL_CONSTANTS: [NamedConstant; 15] = [
    CUDA_CONTEXT_TORCH,
    CUDA_CONTEXT_NATIVE,
    LLAMA_CPP_CUDA_POOL,
    LLAMA_CPP_CPU_RUNTIME,
    CANDLE_CPU_RUNTIME,
    VLLM_CUDA_GRAPHS,
    VLLM_DISTRIBUTED_BUFFERS,
    VLLM_BLOCK_SIZE,
    VLLM_VOCAB_PADDING,
    VLLM_SAMPLER_COPIES,
    LLAMA_CPP_CTX_PAD,
    LLAMA_CPP_PIPELINE_COPIES,
    ACTIVATION_HIDDEN_COPIES,
    ACTIVATION_INTERMEDIATE_COPIES,
    LLAVA_NEXT_MAX_CROPS,
];

/// Where the built-in candle engine runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CandleDevice {
    /// The CPU: activations, KV cache and 16-bit weights in float32.
    Cpu,
    /// One CUDA GPU: bf16/f16 as stored.
    Cuda,
}

/// How Skein runs the built-in candle engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct CandleSettings {
    /// CPU or GPU.
    pub device: CandleDevice,
    /// Prompt tokens processed per forward pass; attention scores are materialised for
    /// this many queries against the whole context.
    pub prefill_chunk: u64,
}

/// The flags Skein passes to `llama-server`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct LlamaCppSettings {
    /// `--batch-size`: logical batch.
    pub n_batch: u64,
    /// `--ubatch-size`: tokens per graph evaluation; sizes the compute buffer.
    pub n_ubatch: u64,
    /// `--flash-attn on`: no materialised attention scores; required for a quantized V
    /// cache.
    pub flash_attention: bool,
}

/// The flags Skein passes to `vllm serve`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct VllmSettings {
    /// `--max-num-batched-tokens`: tokens of the profile run that sizes activations.
    pub max_num_batched_tokens: u64,
    /// `--max-num-seqs`: rows of the sampler's profile run.
    pub max_num_seqs: u64,
    /// `--enforce-eager`: no CUDA graphs.
    pub enforce_eager: bool,
}

/// An inference engine with the settings Skein starts it with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(tag = "engine", rename_all = "snake_case")]
pub enum Engine {
    /// The built-in candle engine: one device, safetensors (16/32-bit) or GGUF.
    Candle(CandleSettings),
    /// `llama-server`: GGUF only; layers split across GPUs with `--tensor-split`.
    LlamaCpp(LlamaCppSettings),
    /// `vllm serve`: tensor and pipeline parallelism, safetensors of every method.
    Vllm(VllmSettings),
}

impl Engine {
    /// candle on the CPU, prefilling 512 tokens at a time.
    pub const CANDLE_CPU: Engine = Engine::Candle(CandleSettings {
        device: CandleDevice::Cpu,
        prefill_chunk: 512,
    });
    /// candle on one CUDA GPU, prefilling 512 tokens at a time.
    pub const CANDLE_CUDA: Engine = Engine::Candle(CandleSettings {
        device: CandleDevice::Cuda,
        prefill_chunk: 512,
    });
    /// llama.cpp with its default batch sizes and flash attention on.
    pub const LLAMA_CPP: Engine = Engine::LlamaCpp(LlamaCppSettings {
        n_batch: 2048,
        n_ubatch: 512,
        flash_attention: true,
    });
    /// vLLM with the batch limits of its API server on GPUs below H100 class and CUDA
    /// graphs on.
    pub const VLLM: Engine = Engine::Vllm(VllmSettings {
        max_num_batched_tokens: 2048,
        max_num_seqs: 256,
        enforce_eager: false,
    });

    /// The engines Skein starts on GPUs, in order of preference where several load a
    /// format.
    pub const GPU_PREFERENCE: [Engine; 2] = [Engine::VLLM, Engine::LLAMA_CPP];
    /// The engines Skein starts on the CPU alone, in that order.
    pub const CPU_PREFERENCE: [Engine; 2] = [Engine::CANDLE_CPU, Engine::LLAMA_CPP];

    /// `candle`, `llama.cpp` or `vllm`.
    pub const fn name(&self) -> &'static str {
        match self {
            Engine::Candle(_) => "candle",
            Engine::LlamaCpp(_) => "llama.cpp",
            Engine::Vllm(_) => "vllm",
        }
    }

    /// Whether it shards each layer's tensors over GPUs (tensor parallelism), on one node.
    pub const fn tensor_parallel(&self) -> bool {
        match self {
            Engine::Vllm(_) => true,
            Engine::LlamaCpp(_) | Engine::Candle(_) => false,
        }
    }

    /// Whether it splits whole layers over devices as pipeline stages (vLLM's pipeline
    /// parallelism, llama.cpp's `--tensor-split`), tensor-parallel groups as stages when
    /// it has [`Engine::tensor_parallel`] too.
    pub const fn layer_split(&self) -> bool {
        match self {
            Engine::Vllm(_) | Engine::LlamaCpp(_) => true,
            Engine::Candle(_) => false,
        }
    }

    /// Whether its stages may be on different machines (vLLM over Ray, llama.cpp over
    /// RPC servers).
    pub const fn across_nodes(&self) -> bool {
        match self {
            Engine::Vllm(_) | Engine::LlamaCpp(_) => true,
            Engine::Candle(_) => false,
        }
    }

    /// Whether it keeps its first layers in host RAM and the rest on GPUs (llama.cpp
    /// `-ngl`): a layout whose leading stages are on the CPU.
    pub const fn host_offload(&self) -> bool {
        match self {
            Engine::LlamaCpp(_) => true,
            Engine::Vllm(_) | Engine::Candle(_) => false,
        }
    }

    /// Whether it loads weights stored in `format`.
    pub const fn loads(&self, format: WeightFormat) -> bool {
        match (self, format) {
            (Engine::Candle(_), _) => true,
            (Engine::LlamaCpp(_), WeightFormat::Gguf) | (Engine::Vllm(_), WeightFormat::Safetensors) => true,
            (Engine::LlamaCpp(_), WeightFormat::Safetensors) | (Engine::Vllm(_), WeightFormat::Gguf) => false,
        }
    }

    /// Whether the engine, with some settings, runs on GPUs.
    pub const fn runs_on_gpu(&self) -> bool {
        match self {
            Engine::Vllm(_) | Engine::LlamaCpp(_) | Engine::Candle(_) => true,
        }
    }

    /// Whether the engine, with some settings, runs on the CPU alone (see
    /// [`Engine::on_cpu`] for these settings).
    pub const fn runs_on_cpu(&self) -> bool {
        match self {
            Engine::LlamaCpp(_) | Engine::Candle(_) => true,
            Engine::Vllm(_) => false,
        }
    }

    /// Whether, split across nodes, it serves requests from the node of its last stage
    /// rather than its first (llama.cpp: the RPC servers hold the leading stages).
    pub const fn serves_from_last_stage(&self) -> bool {
        match self {
            Engine::LlamaCpp(_) => true,
            Engine::Vllm(_) | Engine::Candle(_) => false,
        }
    }

    /// Whether it keeps the token embedding in host RAM beside its devices
    /// (llama.cpp), so that an output tied to it is read from there on the CPU.
    pub const fn embedding_in_host_ram(&self) -> bool {
        match self {
            Engine::LlamaCpp(_) => true,
            Engine::Vllm(_) | Engine::Candle(_) => false,
        }
    }

    /// The engine Skein starts for weights in `format` on GPUs: the first of
    /// [`Engine::GPU_PREFERENCE`] that loads it.
    pub fn for_gpus(format: WeightFormat) -> Option<Engine> {
        Engine::GPU_PREFERENCE.into_iter().find(|e| e.loads(format))
    }

    /// The engines Skein may start for weights in `format` on the CPU alone, in order
    /// of [`Engine::CPU_PREFERENCE`].
    pub fn for_cpu(format: WeightFormat) -> impl Iterator<Item = Engine> {
        Engine::CPU_PREFERENCE.into_iter().filter(move |e| e.loads(format))
    }

    /// The engines Skein may start to split weights in `format` between GPUs and host
    /// RAM ([`Engine::host_offload`]).
    pub fn for_offload(format: WeightFormat) -> impl Iterator<Item = Engine> {
        Engine::GPU_PREFERENCE
            .into_iter()
            .filter(move |e| e.host_offload() && e.loads(format))
    }

    /// What to do instead of a layout the engine cannot split as asked (see
    /// [`Engine::tensor_parallel`], [`Engine::layer_split`]).
    pub(crate) const fn split_help(&self) -> &'static str {
        match self {
            Engine::Candle(_) => "the built-in candle engine runs on one device; use vLLM or llama.cpp to split",
            Engine::LlamaCpp(_) => "llama.cpp splits whole layers across GPUs; use pipeline stages (--tensor-split)",
            Engine::Vllm(_) => "vLLM splits tensors and layers; check the layout's degree",
        }
    }

    /// What to do instead of putting stages of an engine that does not
    /// [`Engine::runs_on_cpu`] on the CPU.
    pub(crate) const fn gpu_only_help(&self) -> &'static str {
        match self {
            Engine::Vllm(_) => "vLLM runs on GPUs only; use llama.cpp or the built-in engine on the CPU",
            Engine::LlamaCpp(_) | Engine::Candle(_) => "use llama.cpp or the built-in engine on the CPU",
        }
    }

    /// Whether it is Skein's built-in engine, which runs only the architectures it
    /// implements (`ModelInfo::builtin_engine_loads`).
    pub const fn builtin(&self) -> bool {
        match self {
            Engine::Candle(_) => true,
            Engine::Vllm(_) | Engine::LlamaCpp(_) => false,
        }
    }

    /// Whether the engine runs on the CPU (host RAM is its device memory).
    pub const fn on_cpu(&self) -> bool {
        matches!(
            self,
            Engine::Candle(CandleSettings {
                device: CandleDevice::Cpu,
                ..
            })
        )
    }

    /// Refuses weights the engine cannot load, with the reason.
    pub(crate) fn check_weights(&self, quantization: Option<&Quantization>) -> Result<(), Error> {
        let Some(q) = quantization else {
            return Ok(());
        };
        let refuse = |help: &'static str| {
            Err(Error::EngineCannotLoad {
                engine: self.name(),
                weights: q.to_string(),
                help,
            })
        };
        match (self, q.format, q.method) {
            (Engine::LlamaCpp(_), WeightFormat::Safetensors, _) => {
                refuse("llama.cpp loads GGUF files only; choose a GGUF variant")
            }
            (Engine::Candle(_), WeightFormat::Safetensors, m)
                if !matches!(m, QuantMethod::Fp32 | QuantMethod::Bf16 | QuantMethod::Fp16) =>
            {
                refuse("candle has no kernels for this method; choose a 16-bit or GGUF variant, or vLLM")
            }
            (Engine::Candle(_), WeightFormat::Gguf, QuantMethod::Gguf(ft)) if !candle_runs(ft) => {
                refuse("candle has no kernels for i-quants and 4-bit float GGUF types; use llama.cpp")
            }
            _ => Ok(()),
        }
    }

    /// The KV-cache type the engine will use for `requested`, or an error if it cannot
    /// use it. `Auto` is the engine's default: the activation dtype for vLLM and
    /// candle, f16 for llama.cpp.
    pub(crate) fn resolve_kv(&self, requested: KvDtype, quantization: Option<&Quantization>) -> Result<KvDtype, Error> {
        let model_dtype = match quantization.map(|q| q.method) {
            Some(QuantMethod::Bf16) => KvDtype::Bf16,
            _ => KvDtype::F16,
        };
        let unsupported = |supported: &'static str| {
            Err(Error::KvDtypeUnsupported {
                engine: self.name(),
                kv_dtype: requested,
                supported,
            })
        };
        match self {
            Engine::Vllm(_) => match requested {
                KvDtype::Auto => Ok(model_dtype),
                KvDtype::F16 | KvDtype::Bf16 | KvDtype::Fp8 => Ok(requested),
                _ => unsupported("auto, f16, bf16, fp8"),
            },
            Engine::LlamaCpp(settings) => match requested {
                KvDtype::Auto => Ok(KvDtype::F16),
                KvDtype::Q8_0 | KvDtype::Q4_0 if !settings.flash_attention => {
                    unsupported("f32, f16, bf16; a quantized V cache needs flash attention")
                }
                KvDtype::Fp8 => unsupported("f32, f16, bf16, q8_0, q4_0"),
                _ => Ok(requested),
            },
            Engine::Candle(settings) => {
                let native = match settings.device {
                    CandleDevice::Cpu => KvDtype::F32,
                    CandleDevice::Cuda => model_dtype,
                };
                match requested {
                    KvDtype::Auto => Ok(native),
                    r if r == native => Ok(r),
                    _ => unsupported("auto (the activation dtype: f32 on the CPU, the model's 16-bit type on CUDA)"),
                }
            }
        }
    }
}

/// GGUF file types whose principal tensors candle's quantized kernels handle.
fn candle_runs(file_type: GgufFileType) -> bool {
    use GgufFileType as F;
    matches!(
        file_type,
        F::F32
            | F::F16
            | F::BF16
            | F::Q4_0
            | F::Q4_1
            | F::Q4_1_SOME_F16
            | F::Q5_0
            | F::Q5_1
            | F::Q8_0
            | F::Q2_K
            | F::Q2_K_S
            | F::Q3_K_S
            | F::Q3_K_M
            | F::Q3_K_L
            | F::Q4_K_S
            | F::Q4_K_M
            | F::Q5_K_S
            | F::Q5_K_M
            | F::Q6_K
    )
}

/// The element type of the KV cache.
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KvDtype {
    /// The engine's default (see [`EstimateRequest`](super::EstimateRequest)).
    Auto,
    /// 32-bit float (candle on the CPU).
    F32,
    /// IEEE half.
    F16,
    /// bfloat16.
    Bf16,
    /// 8-bit float (vLLM `--kv-cache-dtype fp8`).
    Fp8,
    /// ggml `q8_0` blocks: 34 bytes per 32 values (llama.cpp `-ctk q8_0 -ctv q8_0`).
    Q8_0,
    /// ggml `q4_0` blocks: 18 bytes per 32 values.
    Q4_0,
}

impl KvDtype {
    /// `auto`, `f16`, `q8_0`, …
    pub const fn name(self) -> &'static str {
        match self {
            KvDtype::Auto => "auto",
            KvDtype::F32 => "f32",
            KvDtype::F16 => "f16",
            KvDtype::Bf16 => "bf16",
            KvDtype::Fp8 => "fp8",
            KvDtype::Q8_0 => "q8_0",
            KvDtype::Q4_0 => "q4_0",
        }
    }

    /// Bytes of a row of `elements` cached values (one token's K or V vectors of one
    /// layer). Block-quantized rows must be whole blocks, as llama.cpp requires.
    ///
    /// Errors: [`Error::KvDtypeUnresolved`] for [`KvDtype::Auto`], [`Error::PartialBlock`]
    /// for a quantized row that is not whole blocks.
    pub fn row_bytes(self, elements: u64) -> Result<Bytes, Error> {
        let bytes_per = match self {
            KvDtype::Auto => return Err(Error::KvDtypeUnresolved),
            KvDtype::F32 => 4,
            KvDtype::F16 | KvDtype::Bf16 => 2,
            KvDtype::Fp8 => 1,
            KvDtype::Q8_0 => return GgmlType::Q8_0.row_bytes(elements),
            KvDtype::Q4_0 => return GgmlType::Q4_0.row_bytes(elements),
        };
        elements
            .checked_mul(bytes_per)
            .map(Bytes::new)
            .ok_or(Error::EstimateOverflow { what: "KV row" })
    }
}

impl fmt::Display for KvDtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One engine's capabilities, in the order of the columns below.
    #[derive(Debug, PartialEq)]
    struct Row {
        tensor_parallel: bool,
        layer_split: bool,
        across_nodes: bool,
        host_offload: bool,
        loads_safetensors: bool,
        loads_gguf: bool,
        runs_on_gpu: bool,
        runs_on_cpu: bool,
        serves_from_last_stage: bool,
        embedding_in_host_ram: bool,
        builtin: bool,
        on_cpu: bool,
    }

    fn row(e: Engine) -> Row {
        Row {
            tensor_parallel: e.tensor_parallel(),
            layer_split: e.layer_split(),
            across_nodes: e.across_nodes(),
            host_offload: e.host_offload(),
            loads_safetensors: e.loads(WeightFormat::Safetensors),
            loads_gguf: e.loads(WeightFormat::Gguf),
            runs_on_gpu: e.runs_on_gpu(),
            runs_on_cpu: e.runs_on_cpu(),
            serves_from_last_stage: e.serves_from_last_stage(),
            embedding_in_host_ram: e.embedding_in_host_ram(),
            builtin: e.builtin(),
            on_cpu: e.on_cpu(),
        }
    }

    #[test]
    fn every_engine_declares_what_it_can_do() {
        let (t, f) = (true, false);
        #[rustfmt::skip]
        let table = [
            //                   tp layer nodes offl  st  gguf  gpu  cpu  last  emb  bltn on_cpu
            (Engine::VLLM,        [t,  t,    t,    f,   t,  f,    t,   f,   f,    f,   f,   f]),
            (Engine::LLAMA_CPP,   [f,  t,    t,    t,   f,  t,    t,   t,   t,    t,   f,   f]),
            (Engine::CANDLE_CPU,  [f,  f,    f,    f,   t,  t,    t,   t,   f,    f,   t,   t]),
            (Engine::CANDLE_CUDA, [f,  f,    f,    f,   t,  t,    t,   t,   f,    f,   t,   f]),
        ];
        for (engine, c) in table {
            let expected = Row {
                tensor_parallel: c[0],
                layer_split: c[1],
                across_nodes: c[2],
                host_offload: c[3],
                loads_safetensors: c[4],
                loads_gguf: c[5],
                runs_on_gpu: c[6],
                runs_on_cpu: c[7],
                serves_from_last_stage: c[8],
                embedding_in_host_ram: c[9],
                builtin: c[10],
                on_cpu: c[11],
            };
            assert_eq!(row(engine), expected, "{}", engine.name());
        }
    }

    #[test]
    fn each_format_has_its_engines() {
        assert_eq!(Engine::for_gpus(WeightFormat::Safetensors), Some(Engine::VLLM));
        assert_eq!(Engine::for_gpus(WeightFormat::Gguf), Some(Engine::LLAMA_CPP));
        assert_eq!(
            Engine::for_cpu(WeightFormat::Safetensors).collect::<Vec<_>>(),
            [Engine::CANDLE_CPU]
        );
        assert_eq!(
            Engine::for_cpu(WeightFormat::Gguf).collect::<Vec<_>>(),
            [Engine::CANDLE_CPU, Engine::LLAMA_CPP]
        );
        assert_eq!(Engine::for_offload(WeightFormat::Safetensors).count(), 0);
        assert_eq!(
            Engine::for_offload(WeightFormat::Gguf).collect::<Vec<_>>(),
            [Engine::LLAMA_CPP]
        );
    }

    #[test]
    fn the_preferences_hold_engines_that_run_there() {
        assert!(Engine::GPU_PREFERENCE.iter().all(|e| e.runs_on_gpu() && !e.on_cpu()));
        assert!(Engine::CPU_PREFERENCE.iter().all(|e| e.runs_on_cpu()));
        assert!(
            Engine::CPU_PREFERENCE
                .iter()
                .filter(|e| e.builtin())
                .all(|e| e.on_cpu())
        );
    }
}
