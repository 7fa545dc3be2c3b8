//! Memory estimation: how many bytes a variant needs on each device of a layout.
//!
//! An estimate is a pure function of three inputs:
//!
//! - a [`ModelShape`] (from `config.json`): layers, widths, heads, KV heads, experts,
//!   vision tower, and the exact parameter counts;
//! - [`WeightGroups`]: the variant's stored bytes per tensor group, exact from its
//!   safetensors or GGUF headers, or computed from the parameter counts and the
//!   quantization's storage layout ([`WeightsSource`]);
//! - an [`EstimateRequest`]: context, concurrent sequences, KV-cache type, the
//!   [`Engine`] with the flags Skein will start it with, and the [`Layout`] (tensor
//!   parallelism within a group of GPUs, pipeline stages across groups).
//!
//! [`estimate`] returns an [`Estimate`] with one [`DeviceEstimate`] per device, each a
//! list of lines (weights, KV cache, activations, overhead) that say how they were
//! computed, and the [`NamedConstant`]s used. [`fits`] compares it with each device's
//! usable memory, with a margin. [`tp_degrees`] lists the tensor-parallel degrees a
//! model allows and why the others fail.
//!
//! # Layout
//!
//! - `shape`: [`ModelShape`].
//! - `weights`: [`WeightGroups`] from headers or computed; `gguf_mix` models
//!   llama.cpp's per-tensor type choices for a GGUF file type.
//! - `engine`: [`Engine`] settings, [`KvDtype`], and every named constant.
//! - `split`: [`Layout`], tensor-parallel validity, layer assignment to stages.
//! - `device`: one device's lines.
//! - `report`: [`Estimate`], its table, and [`fits`].
//! - `adapter`: what LoRA adapters add on the base instance serving them
//!   ([`adapter_memory`]): vLLM's preallocated slots and host cache, llama.cpp's
//!   adapter tensors.

mod adapter;
mod device;
mod engine;
mod gguf_mix;
mod llama_split;
mod report;
mod shape;
mod split;
mod weights;

use serde::Serialize;

pub use adapter::{
    AdapterEngine, AdapterMemory, AdapterSize, VLLM_MAX_LORA_RANKS, VllmLoraSettings, adapter_memory,
    loaded_adapter_bytes, vllm_lora_layer_slot_elements, vllm_lora_overhead, vllm_max_lora_rank,
};
pub use engine::{
    ACTIVATION_HIDDEN_COPIES, ACTIVATION_INTERMEDIATE_COPIES, ALL_CONSTANTS, CANDLE_CPU_RUNTIME, CUDA_CONTEXT_NATIVE,
    CUDA_CONTEXT_TORCH, CandleDevice, CandleSettings, ConstantUnit, Engine, KvDtype, LLAMA_CPP_CPU_RUNTIME,
    LLAMA_CPP_CTX_PAD, LLAMA_CPP_CUDA_POOL, LLAMA_CPP_PIPELINE_COPIES, LLAVA_NEXT_MAX_CROPS, LlamaCppSettings,
    NamedConstant, VLLM_BLOCK_SIZE, VLLM_CUDA_GRAPHS, VLLM_DISTRIBUTED_BUFFERS, VLLM_SAMPLER_COPIES,
    VLLM_VOCAB_PADDING, VllmSettings,
};
pub use llama_split::{llama_cpp_counts, llama_cpp_devices, tensor_split as llama_cpp_tensor_split};
pub use report::{
    Component, DEFAULT_FIT_MARGIN, DeviceEstimate, DeviceFit, DeviceKind, Estimate, FitMargin, FitReport,
    HOST_FIT_MARGIN, Item, LayerRange, WeightsSummary, fits, fits_with_margin,
};
pub use shape::{ModelShape, VisionShape};
pub use split::{Layout, Stages, TpDegree, TpInvalid, assign_layers, check_tp, tp_degrees};
pub use weights::{LayerBytes, WeightGroups, WeightsOrigin, WeightsSource};

use crate::quant::QuantMethod;
use crate::{Bytes, Error};
use device::Plan;

/// What to estimate: the serving parameters and where the model runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct EstimateRequest {
    /// Context tokens per sequence (prompt and generation).
    pub context: u64,
    /// Sequences served at once, each with its own `context`.
    pub concurrency: u64,
    /// KV-cache element type; [`KvDtype::Auto`] is the engine's default.
    pub kv_dtype: KvDtype,
    /// The engine and its flags.
    pub engine: Engine,
    /// Tensor and pipeline parallelism.
    pub layout: Layout,
    /// How many leading pipeline stages run on the host CPU and its RAM rather than on
    /// GPUs: llama.cpp with the whole model on a CPU-only node (1 of 1 stage), or the
    /// host stage of a partial offload (llama.cpp keeps the first layers in RAM). Such a
    /// stage carries the CPU process's overhead, not a CUDA context. The built-in engine
    /// on the CPU is a CPU device whatever this says; vLLM has no CPU stage.
    pub cpu_stages: usize,
    /// LoRA adapters the instance serves besides its base model (see
    /// [`adapter_memory`]): vLLM's slots and llama.cpp's adapter tensors go on the
    /// devices with the layers they adapt, vLLM's adapter cache in host RAM.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub adapters: Vec<AdapterSize>,
    /// Whether each line of the estimate says how it was computed ([`Item::detail`]);
    /// without, the details are empty and the figures the same (a planner weighing
    /// thousands of layouts reads only the figures).
    #[serde(skip)]
    pub details: bool,
}

impl EstimateRequest {
    /// One sequence of `context` tokens on one device of `engine`, default KV type.
    pub fn new(engine: Engine, context: u64) -> EstimateRequest {
        EstimateRequest {
            context,
            concurrency: 1,
            kv_dtype: KvDtype::Auto,
            engine,
            layout: Layout::single(),
            cpu_stages: 0,
            adapters: Vec::new(),
            details: true,
        }
    }

    /// Serving `adapters` too.
    pub fn with_adapters(mut self, adapters: Vec<AdapterSize>) -> Self {
        self.adapters = adapters;
        self
    }

    /// With `concurrency` sequences.
    pub fn with_concurrency(mut self, concurrency: u64) -> Self {
        self.concurrency = concurrency;
        self
    }

    /// With a KV-cache type.
    pub fn with_kv_dtype(mut self, kv_dtype: KvDtype) -> Self {
        self.kv_dtype = kv_dtype;
        self
    }

    /// With a layout.
    pub fn with_layout(mut self, layout: Layout) -> Self {
        self.layout = layout;
        self
    }

    /// With the first `stages` pipeline stages on the host CPU (see
    /// [`EstimateRequest::cpu_stages`]).
    pub fn with_cpu_stages(mut self, stages: usize) -> Self {
        self.cpu_stages = stages;
        self
    }

    /// Without the lines' details: the same figures, cheaper to make.
    pub fn without_details(mut self) -> Self {
        self.details = false;
        self
    }
}

fn invalid(field: &'static str, found: impl ToString, expected: &'static str) -> Error {
    Error::InvalidEstimateRequest {
        field,
        found: found.to_string(),
        expected,
    }
}

/// Estimates the memory of the variant `weights` of the model `shape` for `request`.
///
/// Errors: [`Error::InvalidEstimateRequest`] for a zero context, concurrency or degree,
/// or weights sized for another number of layers; [`Error::UnsupportedLayout`] for a
/// layout the engine cannot run; [`Error::EngineCannotLoad`] and
/// [`Error::KvDtypeUnsupported`] for weights or a KV type the engine cannot use;
/// [`Error::InvalidTensorParallel`] for a degree the model does not allow (see
/// [`tp_degrees`]); [`Error::EmptyPipelineStage`] when a stage would get no layer;
/// [`Error::EstimateOverflow`] if a figure overflows.
///
/// ```
/// use skein_model_registry::config::ModelConfig;
/// use skein_model_registry::estimate::{
///     Engine, EstimateRequest, Layout, ModelShape, WeightGroups, WeightsSource, estimate, fits,
/// };
/// use skein_model_registry::{Bytes, Quantization};
///
/// // Meta-Llama-3-8B in bf16, TP 2 under vLLM, one 8192-token sequence.
/// let cfg = ModelConfig::from_json(r#"{
///     "model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32,
///     "num_attention_heads": 32, "num_key_value_heads": 8,
///     "intermediate_size": 14336, "vocab_size": 128256
/// }"#)?;
/// let shape = ModelShape::from_config(&cfg)?;
/// let bf16 = Quantization::from_config(None, Some("bfloat16"))?.expect("a dtype");
/// let weights = WeightGroups::resolve(&shape, WeightsSource::Computed(bf16))?;
/// let request = EstimateRequest::new(Engine::VLLM, 8192).with_layout(Layout::tensor_parallel(2));
/// let e = estimate(&shape, &weights, &request)?;
/// assert_eq!(e.kv_bytes_per_token.get(), 131_072);
/// assert_eq!(e.devices.len(), 2);
/// assert!(fits(&e, &[Bytes::new(24_564 << 20); 2])?.fits);
/// # Ok::<(), skein_model_registry::Error>(())
/// ```
pub fn estimate(shape: &ModelShape, weights: &WeightGroups, request: &EstimateRequest) -> Result<Estimate, Error> {
    let engine = request.engine;
    let layout = &request.layout;
    let tp = layout.tensor_parallel;
    let stages = layout.stages.count();
    if request.context == 0 {
        return Err(invalid("context", request.context, "at least one token"));
    }
    if request.concurrency == 0 {
        return Err(invalid("concurrency", request.concurrency, "at least one sequence"));
    }
    if tp == 0 || stages == 0 {
        return Err(invalid("layout", layout, "at least one GPU per stage and one stage"));
    }
    if weights.layers.len() as u64 != shape.layers {
        return Err(invalid(
            "weights.layers",
            weights.layers.len(),
            "the model's number of decoder layers",
        ));
    }
    if (tp > 1 && !engine.tensor_parallel()) || (stages > 1 && !engine.layer_split()) {
        return Err(Error::UnsupportedLayout {
            engine: engine.name(),
            layout: layout.to_string(),
            help: engine.split_help(),
        });
    }
    if request.cpu_stages > stages {
        return Err(invalid("cpu_stages", request.cpu_stages, "at most the layout's stages"));
    }
    if request.cpu_stages > 0 && !engine.runs_on_cpu() {
        return Err(Error::UnsupportedLayout {
            engine: engine.name(),
            layout: layout.to_string(),
            help: engine.gpu_only_help(),
        });
    }
    let cpu_stages = if engine.on_cpu() { stages } else { request.cpu_stages };
    let quantization = weights.quantization.as_ref();
    engine.check_weights(quantization)?;
    let kv_dtype = engine.resolve_kv(request.kv_dtype, quantization)?;
    if tp > 1 {
        check_tp(shape, quantization, tp).map_err(|reason| Error::InvalidTensorParallel { degree: tp, reason })?;
    }

    let mut notes = Vec::new();
    let mut constants = Vec::new();
    let lora = adapter::lora_load(shape, &request.adapters, engine, quantization.map(|q| q.method), tp)?;
    if let Some(lora) = &lora {
        notes.push(format!("LoRA adapters: {}", lora.note));
    }
    let (seq_tokens, kv_tokens) = cached_tokens(shape, request, &mut constants, &mut notes)?;
    let plan = Plan {
        shape,
        weights,
        engine,
        tp,
        stages,
        kv_dtype,
        kv_tokens,
        seq_tokens,
        weight_scale: weight_scale(engine, quantization.map(|q| q.method), &mut notes),
        cpu_stages,
        lora: lora.as_ref().map(|l| l.all_layers),
        details: request.details,
    };
    let ranges = match &layout.stages {
        Stages::One => std::iter::once(0..shape.layers).collect(),
        Stages::Ratios(ratios) => {
            let parts: Vec<u64> = ratios.iter().map(|&r| u64::from(r)).collect();
            assign_layers(shape.layers, &parts)?
        }
        Stages::Memory(usable) => memory_ranges(&plan, usable)?,
    };

    let mut devices = Vec::new();
    for (stage, range) in ranges.into_iter().enumerate() {
        // Ranks of a stage hold equal shares (rounded up), so one computation serves all.
        let (device, lines) = plan.device(stage, range, 0)?;
        for constant in lines.constants {
            if !constants.iter().any(|c: &NamedConstant| c.name == constant.name) {
                constants.push(constant);
            }
        }
        for rank in 0..tp {
            devices.push(DeviceEstimate {
                device: devices.len(),
                rank,
                ..device.clone()
            });
        }
    }
    constants.sort_by_key(|c| ALL_CONSTANTS.iter().position(|a| a.name == c.name));

    let host = if matches!(engine, Engine::LlamaCpp(_)) {
        notes.push(format!(
            "llama.cpp keeps the token embedding ({}) in host RAM",
            weights.embeddings
        ));
        weights.embeddings
    } else {
        Bytes::ZERO
    };
    let host = match &lora {
        Some(lora) => host
            .checked_add(lora.host)
            .ok_or(Error::EstimateOverflow { what: "host bytes" })?,
        None => host,
    };
    if let WeightsOrigin::Header {
        unclassified: n @ 1.., ..
    } = weights.origin
    {
        notes.push(format!("{n} tensors matched no group and are counted as replicated"));
    }
    if let WeightsOrigin::Header {
        vision_computed: true, ..
    } = weights.origin
    {
        notes.push("the vision tower was computed as an f16 projector file (mmproj) not read".to_owned());
    }
    if request.context > shape.max_context {
        notes.push(format!(
            "context {} exceeds the model's max_position_embeddings {}",
            request.context, shape.max_context
        ));
    }
    if matches!(engine, Engine::Vllm(_)) {
        notes.push(
            "vLLM checks at start that --gpu-memory-utilization × total memory is free; Skein passes the \
             smallest reserved share as that fraction and the KV cache sized here as --kv-cache-memory-bytes"
                .to_owned(),
        );
    }
    Ok(Estimate {
        engine,
        device_kind: if cpu_stages == stages {
            DeviceKind::Cpu
        } else {
            DeviceKind::Gpu
        },
        layout: layout.clone(),
        context: request.context,
        concurrency: request.concurrency,
        kv_dtype,
        kv_bytes_per_token: shape.kv_bytes_per_token(kv_dtype)?,
        kv_tokens,
        weights: WeightsSummary {
            origin: weights.origin.clone(),
            quantization: weights.quantization,
            loaded: weights.loaded()?,
            skipped: weights.skipped,
        },
        host,
        devices,
        constants,
        notes,
    })
}

/// Context tokens attention reads per sequence, and cache slots of all sequences as
/// the engine allocates them.
fn cached_tokens(
    shape: &ModelShape,
    request: &EstimateRequest,
    constants: &mut Vec<NamedConstant>,
    notes: &mut Vec<String>,
) -> Result<(u64, u64), Error> {
    let overflow = || Error::EstimateOverflow { what: "KV tokens" };
    let all = |per_seq: u64| per_seq.checked_mul(request.concurrency).ok_or_else(overflow);
    match request.engine {
        Engine::Vllm(_) => {
            // vLLM drops blocks outside a sliding window; the cache is whole blocks.
            let per_seq = match shape.sliding_window {
                Some(window) if window < request.context => {
                    notes.push(format!("the sliding window of {window} tokens bounds the KV cache"));
                    window
                }
                _ => request.context,
            };
            constants.push(VLLM_BLOCK_SIZE);
            let padded = per_seq.next_multiple_of(VLLM_BLOCK_SIZE.value);
            Ok((per_seq, all(padded)?))
        }
        Engine::LlamaCpp(_) => {
            // llama-server's -c is shared by its -np slots: context × sequences, padded.
            constants.push(LLAMA_CPP_CTX_PAD);
            let n_ctx = all(request.context)?.next_multiple_of(LLAMA_CPP_CTX_PAD.value);
            Ok((request.context, n_ctx))
        }
        Engine::Candle(_) => Ok((request.context, all(request.context)?)),
    }
}

/// How the engine converts stored weights when it loads them: candle on the CPU
/// computes in f32, so 16-bit weights double; vLLM runs fp32 checkpoints in fp16.
fn weight_scale(engine: Engine, method: Option<QuantMethod>, notes: &mut Vec<String>) -> (u64, u64) {
    match (engine, method) {
        (
            Engine::Candle(CandleSettings {
                device: CandleDevice::Cpu,
                ..
            }),
            Some(QuantMethod::Bf16 | QuantMethod::Fp16),
        ) => {
            notes.push("candle on the CPU converts 16-bit weights to f32 (twice the stored bytes)".to_owned());
            (2, 1)
        }
        (
            Engine::Vllm(_)
            | Engine::Candle(CandleSettings {
                device: CandleDevice::Cuda,
                ..
            }),
            Some(QuantMethod::Fp32),
        ) => {
            notes.push("f32 weights are loaded as f16 (half the stored bytes)".to_owned());
            (1, 2)
        }
        _ => (1, 1),
    }
}

/// Stages sized by usable memory: each stage's fixed costs (an empty stage's estimate)
/// come off its memory, and layers go in proportion to what remains.
fn memory_ranges(plan: &Plan<'_>, usable: &[Bytes]) -> Result<Vec<std::ops::Range<u64>>, Error> {
    let mut parts = Vec::with_capacity(usable.len());
    for (stage, &memory) in usable.iter().enumerate() {
        let (fixed, _) = plan.device(stage, 0..0, 0)?;
        parts.push(memory.checked_sub(fixed.total).unwrap_or(Bytes::ZERO).get());
    }
    assign_layers(plan.shape.layers, &parts)
}
