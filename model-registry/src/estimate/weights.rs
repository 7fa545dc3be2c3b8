//! Weight bytes by tensor group: exact from headers, or computed from the parameter
//! counts and the quantization's storage layout.
//!
//! The groups are what splits need: per decoder layer, the parts that tensor
//! parallelism shards (query/output projections, key/value projections, the MLP) and the
//! parts every rank keeps whole (norms, biases, MoE routers); the token embedding and
//! output projection, which vLLM splits by vocabulary; the vision tower; tensors the
//! checkpoint stores but no engine loads.

use serde::Serialize;

use super::ModelShape;
use super::gguf_mix::{self, MixModel, Role};
use crate::config::MlpKind;
use crate::gguf::GgufHeader;
use crate::quant::{GgufFileType, QuantMethod, Quantization, WeightFormat};
use crate::safetensors::SafetensorsHeader;
use crate::{Bytes, Error};

/// Bytes of one decoder layer, by how tensor parallelism treats them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct LayerBytes {
    /// Query and output projections (with their packed scales, zeros and indices):
    /// sharded by the tensor-parallel degree.
    pub attention_qo: Bytes,
    /// Key and value projections: sharded when the KV heads divide among the ranks,
    /// otherwise each rank keeps a whole KV head.
    pub attention_kv: Bytes,
    /// The MLP, all experts: sharded.
    pub mlp: Bytes,
    /// Norms, biases and the MoE router: every rank keeps them whole.
    pub replicated: Bytes,
}

impl LayerBytes {
    /// All bytes of the layer.
    pub fn total(&self) -> Result<Bytes, Error> {
        sum(&[self.attention_qo, self.attention_kv, self.mlp, self.replicated])
    }
}

/// Where the byte counts of a [`WeightGroups`] came from.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "from", rename_all = "snake_case")]
pub enum WeightsOrigin {
    /// Read from the tensors of the checkpoint's headers: exact.
    Header {
        /// Safetensors or GGUF.
        format: WeightFormat,
        /// Tensors read.
        tensors: u64,
        /// Tensors whose names matched no group; counted as replicated.
        unclassified: u64,
        /// Whether the vision tower, absent from a GGUF file without its projector file,
        /// was computed (as f16, the projector files' usual type).
        vision_computed: bool,
    },
    /// Computed from parameter counts and the quantization's storage layout.
    Computed,
}

/// What the weight bytes are read or computed from.
#[derive(Debug, Clone, Copy)]
pub enum WeightsSource<'a> {
    /// The headers of every shard of a safetensors checkpoint.
    Safetensors(&'a [SafetensorsHeader]),
    /// The headers of a GGUF file (every split), and of the multimodal projector file
    /// (`mmproj`) for a model with a vision tower.
    Gguf {
        /// The model file's headers.
        model: &'a [GgufHeader],
        /// The projector file's header, if read.
        mmproj: Option<&'a GgufHeader>,
    },
    /// No header: computed from the parameter counts and this storage layout.
    Computed(Quantization),
}

/// A model's weight bytes by group.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WeightGroups {
    /// Read or computed.
    pub origin: WeightsOrigin,
    /// The variant's quantization, when known.
    pub quantization: Option<Quantization>,
    /// Token embedding (vocabulary-parallel under vLLM tensor parallelism).
    pub embeddings: Bytes,
    /// Learned position embeddings (GPT-2); replicated.
    pub position_embeddings: Bytes,
    /// Each decoder layer, first to last.
    pub layers: Vec<LayerBytes>,
    /// The final norm; replicated.
    pub final_norm: Bytes,
    /// The output projection; zero when it is tied to the token embedding.
    pub lm_head: Bytes,
    /// The vision encoder's layers.
    pub vision_layers: Bytes,
    /// The vision embeddings and norms, the projector and `image_newline`.
    pub vision_other: Bytes,
    /// Loaded tensors that matched no group; replicated, placed with the embeddings.
    pub other: Bytes,
    /// Stored but never loaded: rotary `inv_freq`, GPT-2 masks, a copy of a tied
    /// output matrix.
    pub skipped: Bytes,
}

fn overflow() -> Error {
    Error::EstimateOverflow { what: "weight bytes" }
}

fn sum(parts: &[Bytes]) -> Result<Bytes, Error> {
    parts
        .iter()
        .try_fold(Bytes::ZERO, |acc, &b| acc.checked_add(b))
        .ok_or_else(overflow)
}

fn add(slot: &mut Bytes, bytes: Bytes) -> Result<(), Error> {
    *slot = slot.checked_add(bytes).ok_or_else(overflow)?;
    Ok(())
}

fn mul(factors: &[u64]) -> Result<u64, Error> {
    factors
        .iter()
        .try_fold(1u64, |acc, &f| acc.checked_mul(f))
        .ok_or_else(overflow)
}

/// Where a tensor goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Target {
    Embeddings,
    Position,
    Layer(u64, Part),
    FinalNorm,
    LmHead,
    VisionLayers,
    VisionOther,
    Skipped,
    Other,
}

/// Which part of a decoder layer a tensor belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Part {
    Qo,
    Kv,
    /// A fused q/k/v matrix: split by output widths.
    Qkv,
    Mlp,
    Replicated,
    /// A layer tensor whose name matched no rule: replicated, and counted.
    Unknown,
}

impl WeightGroups {
    /// Byte counts by group for the model `shape` describes, from `source`.
    ///
    /// Errors: [`Error::TensorOutsideModel`] for a header tensor of a layer the model
    /// does not have (the header belongs to another model), [`Error::EstimateOverflow`]
    /// on overflow, and the errors of GGUF row sizes for a computed GGUF variant whose
    /// rows are not whole blocks even after llama.cpp's fallbacks.
    pub fn resolve(shape: &ModelShape, source: WeightsSource<'_>) -> Result<WeightGroups, Error> {
        match source {
            WeightsSource::Safetensors(headers) => {
                let tensors = headers.iter().flat_map(|h| h.tensors());
                let quantization = Quantization::from_safetensors(tensors.clone());
                let named = tensors.map(|t| (t.name.as_str(), t.bytes()));
                let mut groups = Self::from_named(shape, WeightFormat::Safetensors, named, classify_safetensors)?;
                groups.quantization = quantization;
                Ok(groups)
            }
            WeightsSource::Gguf { model, mmproj } => {
                let named = model
                    .iter()
                    .flat_map(|h| h.tensors())
                    .map(|t| (t.name.as_str(), t.bytes))
                    .chain(
                        mmproj
                            .into_iter()
                            .flat_map(|h| h.tensors())
                            .map(|t| (t.name.as_str(), t.bytes)),
                    );
                let mut groups = Self::from_named(shape, WeightFormat::Gguf, named, classify_gguf)?;
                groups.quantization = model.first().and_then(Quantization::from_gguf);
                if let (Some(_), None) = (shape.vision, mmproj) {
                    let (layers, other) = computed_vision(shape, 2)?;
                    groups.vision_layers = layers;
                    groups.vision_other = other;
                    if let WeightsOrigin::Header { vision_computed, .. } = &mut groups.origin {
                        *vision_computed = true;
                    }
                }
                Ok(groups)
            }
            WeightsSource::Computed(quantization) => computed(shape, quantization),
        }
    }

    fn from_named<'a>(
        shape: &ModelShape,
        format: WeightFormat,
        named: impl Iterator<Item = (&'a str, Bytes)>,
        classify: fn(&str, bool) -> Target,
    ) -> Result<WeightGroups, Error> {
        let mut g = WeightGroups::empty(shape, WeightsOrigin::Computed);
        let mut tensors: u64 = 0;
        let mut unclassified: u64 = 0;
        for (name, bytes) in named {
            tensors = tensors.saturating_add(1);
            match classify(name, shape.tied_embeddings) {
                Target::Embeddings => add(&mut g.embeddings, bytes)?,
                Target::Position => add(&mut g.position_embeddings, bytes)?,
                Target::FinalNorm => add(&mut g.final_norm, bytes)?,
                Target::LmHead => add(&mut g.lm_head, bytes)?,
                Target::VisionLayers => add(&mut g.vision_layers, bytes)?,
                Target::VisionOther => add(&mut g.vision_other, bytes)?,
                Target::Skipped => add(&mut g.skipped, bytes)?,
                Target::Other => {
                    unclassified = unclassified.saturating_add(1);
                    add(&mut g.other, bytes)?;
                }
                Target::Layer(index, part) => {
                    let layers = shape.layers;
                    let layer = usize::try_from(index)
                        .ok()
                        .and_then(|i| g.layers.get_mut(i))
                        .ok_or_else(|| Error::TensorOutsideModel {
                            name: name.to_owned(),
                            layers,
                        })?;
                    match part {
                        Part::Qo => add(&mut layer.attention_qo, bytes)?,
                        Part::Kv => add(&mut layer.attention_kv, bytes)?,
                        Part::Mlp => add(&mut layer.mlp, bytes)?,
                        Part::Replicated => add(&mut layer.replicated, bytes)?,
                        Part::Unknown => {
                            unclassified = unclassified.saturating_add(1);
                            add(&mut layer.replicated, bytes)?;
                        }
                        Part::Qkv => {
                            let (qo, kv) = split_fused_qkv(shape, bytes)?;
                            add(&mut layer.attention_qo, qo)?;
                            add(&mut layer.attention_kv, kv)?;
                        }
                    }
                }
            }
        }
        g.origin = WeightsOrigin::Header {
            format,
            tensors,
            unclassified,
            vision_computed: false,
        };
        Ok(g)
    }

    fn empty(shape: &ModelShape, origin: WeightsOrigin) -> WeightGroups {
        let layers = usize::try_from(shape.layers).unwrap_or(usize::MAX);
        WeightGroups {
            origin,
            quantization: None,
            embeddings: Bytes::ZERO,
            position_embeddings: Bytes::ZERO,
            layers: vec![LayerBytes::default(); layers],
            final_norm: Bytes::ZERO,
            lm_head: Bytes::ZERO,
            vision_layers: Bytes::ZERO,
            vision_other: Bytes::ZERO,
            other: Bytes::ZERO,
            skipped: Bytes::ZERO,
        }
    }

    /// All decoder layers.
    pub fn layers_total(&self) -> Result<Bytes, Error> {
        self.layers
            .iter()
            .try_fold(Bytes::ZERO, |acc, l| acc.checked_add(l.total()?).ok_or_else(overflow))
    }

    /// Bytes an engine loads: every group except [`skipped`](Self::skipped), once.
    pub fn loaded(&self) -> Result<Bytes, Error> {
        sum(&[
            self.embeddings,
            self.position_embeddings,
            self.layers_total()?,
            self.final_norm,
            self.lm_head,
            self.vision_layers,
            self.vision_other,
            self.other,
        ])
    }

    /// Bytes the checkpoint stores: [`loaded`](Self::loaded) plus
    /// [`skipped`](Self::skipped).
    pub fn stored(&self) -> Result<Bytes, Error> {
        sum(&[self.loaded()?, self.skipped])
    }
}

/// Splits a fused q/k/v matrix's bytes in proportion to the output widths.
fn split_fused_qkv(shape: &ModelShape, bytes: Bytes) -> Result<(Bytes, Bytes), Error> {
    let q = u128::from(shape.q_width());
    let total = q + 2 * u128::from(shape.kv_width());
    if total == 0 {
        return Ok((bytes, Bytes::ZERO));
    }
    let qo = u64::try_from(u128::from(bytes.get()) * q / total).map_err(|_| overflow())?;
    Ok((Bytes::new(qo), Bytes::new(bytes.get() - qo)))
}

/// The layer index after `marker` (`layers.12.` → 12) and the rest of the name.
fn layer_index<'a>(name: &'a str, marker: &str) -> Option<(u64, &'a str)> {
    let rest = name.strip_prefix(marker)?;
    let (index, rest) = rest.split_once('.')?;
    Some((index.parse().ok()?, rest))
}

fn classify_safetensors(name: &str, tied: bool) -> Target {
    if name.contains("rotary_emb.inv_freq") || name.ends_with(".attn.bias") || name.ends_with(".attn.masked_bias") {
        return Target::Skipped;
    }
    if name.contains("vision_tower.") || name.starts_with("vision_model.") {
        return if name.contains(".encoder.layers.") {
            Target::VisionLayers
        } else {
            Target::VisionOther
        };
    }
    if name.contains("multi_modal_projector.") || name.contains("image_newline") {
        return Target::VisionOther;
    }
    let mut n = name;
    while let Some(rest) = ["model.", "language_model.", "transformer."]
        .iter()
        .find_map(|prefix| n.strip_prefix(prefix))
    {
        n = rest;
    }
    if n.starts_with("lm_head.") {
        // Engines share a tied output matrix with the embedding; a stored copy is not loaded.
        return if tied { Target::Skipped } else { Target::LmHead };
    }
    if ["embed_tokens.", "word_embeddings.", "wte."]
        .iter()
        .any(|p| n.starts_with(p))
    {
        return Target::Embeddings;
    }
    if n.starts_with("wpe.") {
        return Target::Position;
    }
    if ["norm.", "ln_f.", "final_layernorm."].iter().any(|p| n.starts_with(p)) {
        return Target::FinalNorm;
    }
    match layer_index(n, "layers.").or_else(|| layer_index(n, "h.")) {
        Some((index, rest)) => Target::Layer(index, safetensors_part(rest)),
        None => Target::Other,
    }
}

fn safetensors_part(rest: &str) -> Part {
    let has = |s: &str| rest.contains(s);
    if has("norm") || has("ln_") || has("block_sparse_moe.gate.") || rest.ends_with(".bias") {
        Part::Replicated
    } else if has("qkv_proj") || has("query_key_value") || has("c_attn") {
        Part::Qkv
    } else if has("q_proj") || has("o_proj") || has("self_attention.dense.") || has("attn.c_proj") {
        Part::Qo
    } else if has("k_proj") || has("v_proj") {
        Part::Kv
    } else if has("mlp") || has("experts") || has("block_sparse_moe") {
        Part::Mlp
    } else {
        Part::Unknown
    }
}

fn classify_gguf(name: &str, _tied: bool) -> Target {
    if let Some((_, _)) = layer_index(name, "v.blk.") {
        return Target::VisionLayers;
    }
    if ["v.", "mm.", "model."].iter().any(|p| name.starts_with(p)) {
        return Target::VisionOther;
    }
    if name.starts_with("token_embd.") {
        return Target::Embeddings;
    }
    if name.starts_with("position_embd.") {
        return Target::Position;
    }
    if name.starts_with("output_norm.") {
        return Target::FinalNorm;
    }
    if name.starts_with("output.") {
        return Target::LmHead;
    }
    match layer_index(name, "blk.") {
        Some((index, rest)) => Target::Layer(index, gguf_part(rest)),
        None => Target::Other,
    }
}

fn gguf_part(rest: &str) -> Part {
    let starts = |s: &str| rest.starts_with(s);
    if rest.contains("_norm") || starts("ffn_gate_inp") || rest.ends_with(".bias") {
        Part::Replicated
    } else if starts("attn_qkv") {
        Part::Qkv
    } else if starts("attn_q.") || starts("attn_output.") {
        Part::Qo
    } else if starts("attn_k.") || starts("attn_v.") {
        Part::Kv
    } else if starts("ffn_") {
        Part::Mlp
    } else {
        Part::Unknown
    }
}

/// Vision tower bytes at `bytes_per_param`: (encoder layers, the rest).
fn computed_vision(shape: &ModelShape, bytes_per_param: u64) -> Result<(Bytes, Bytes), Error> {
    let p = &shape.params;
    let Some(tower) = p.vision_tower else {
        return Ok((Bytes::ZERO, Bytes::ZERO));
    };
    let other = [tower.embeddings, tower.norms, p.projector, p.image_newline]
        .iter()
        .try_fold(0u64, |acc, &x| acc.checked_add(x))
        .ok_or_else(overflow)?;
    Ok((
        Bytes::new(mul(&[tower.layers, bytes_per_param])?),
        Bytes::new(mul(&[other, bytes_per_param])?),
    ))
}

/// One linear layer's weight matrix (per expert).
#[derive(Debug, Clone, Copy)]
struct Linear {
    role: Role,
    part: Part,
    input: u64,
    output: u64,
    /// Copies: experts for MoE MLP matrices, else 1.
    count: u64,
}

fn linears(shape: &ModelShape) -> Vec<Linear> {
    let (h, q, kv, i) = (shape.hidden, shape.q_width(), shape.kv_width(), shape.intermediate);
    let experts = shape.moe.map_or(1, |m| m.num_experts);
    let lin = |role, part, input, output, count| Linear {
        role,
        part,
        input,
        output,
        count,
    };
    let mut out = if shape.fused_qkv {
        vec![lin(Role::Qkv, Part::Qkv, h, q.saturating_add(kv.saturating_mul(2)), 1)]
    } else {
        vec![
            lin(Role::Q, Part::Qo, h, q, 1),
            lin(Role::K, Part::Kv, h, kv, 1),
            lin(Role::V, Part::Kv, h, kv, 1),
        ]
    };
    out.push(lin(Role::AttnOutput, Part::Qo, q, h, 1));
    if shape.mlp == MlpKind::Gated {
        out.push(lin(Role::Gate, Part::Mlp, h, i, experts));
    }
    out.push(lin(Role::Up, Part::Mlp, h, i, experts));
    out.push(lin(Role::Down, Part::Mlp, i, h, experts));
    out
}

/// Bytes of parameters kept in the variant's high precision (norms, biases, routers):
/// f32 in GGUF files and fp32 checkpoints, 16-bit otherwise.
fn high_precision_bytes(q: &Quantization) -> u64 {
    match q.method {
        QuantMethod::Fp32 | QuantMethod::Gguf(_) => 4,
        _ => 2,
    }
}

/// Bytes per parameter of unquantized matrices (embeddings, output, vision): the
/// dtype's width for dense checkpoints, 16-bit for quantized safetensors.
fn unquantized_matrix_bytes(q: &Quantization) -> u64 {
    match q.method {
        QuantMethod::Fp32 | QuantMethod::Gguf(GgufFileType::F32) => 4,
        _ => 2,
    }
}

fn div_ceil(a: u64, b: u64) -> u64 {
    if b == 0 { 0 } else { a.div_ceil(b) }
}

/// Stored bytes of one linear matrix (one expert) under `q`, in `layer`.
fn linear_bytes(q: &Quantization, lin: &Linear, layer: u64, mix: &MixModel) -> Result<u64, Error> {
    let (input, output) = (lin.input, lin.output);
    let n = mul(&[input, output])?;
    let bits = u64::from(q.weight_bits);
    let groups = q.group_size.map_or(1, |g| div_ceil(input, u64::from(g)));
    let words = |values: u64| -> Result<u64, Error> { mul(&[div_ceil(mul(&[values, bits])?, 32), 4]) };
    let total = match q.method {
        QuantMethod::Fp32 => mul(&[n, 4])?,
        QuantMethod::Bf16 | QuantMethod::Fp16 => mul(&[n, 2])?,
        // One f32 weight scale and one f32 input scale per tensor.
        QuantMethod::Fp8 => n.checked_add(8).ok_or_else(overflow)?,
        // One f32 scale per output channel (compressed-tensors W8A8, bitsandbytes SCB).
        QuantMethod::Int8 | QuantMethod::BitsAndBytes8 => n.checked_add(mul(&[output, 4])?).ok_or_else(overflow)?,
        QuantMethod::Gptq | QuantMethod::Awq => {
            // qweight packs `bits`-wide values into int32 words (GPTQ along the input,
            // AWQ along the output; the byte count is the same for whole words), qzeros
            // packs one zero per group and output, scales are f16 per group and output,
            // and GPTQ adds an int32 group index per input channel.
            let qweight = if q.method == QuantMethod::Gptq {
                mul(&[words(input)?, output])?
            } else {
                mul(&[words(output)?, input])?
            };
            let qzeros = mul(&[groups, words(output)?])?;
            let scales = mul(&[groups, output, 2])?;
            let g_idx = if q.method == QuantMethod::Gptq {
                mul(&[input, 4])?
            } else {
                0
            };
            [qweight, qzeros, scales, g_idx]
                .iter()
                .try_fold(0u64, |a, &b| a.checked_add(b))
                .ok_or_else(overflow)?
        }
        QuantMethod::PackedInt => {
            // compressed-tensors pack-quantized: symmetric, so f16 scales and no zeros,
            // plus a two-element int64 `weight_shape`.
            let packed = mul(&[words(input)?, output])?;
            let scales = mul(&[groups, output, 2])?;
            packed
                .checked_add(scales)
                .and_then(|b| b.checked_add(16))
                .ok_or_else(overflow)?
        }
        QuantMethod::BitsAndBytes4 => {
            let block = u64::from(q.group_size.unwrap_or(64));
            let blocks = div_ceil(n, block);
            // Double quantization (effective bits below 4 + 32/64) stores 8-bit absmax
            // values with an f32 scale per 256 of them; otherwise one f32 per block.
            let absmax = if q.bits < 4.4 {
                blocks
                    .checked_add(mul(&[div_ceil(blocks, 256), 4])?)
                    .ok_or_else(overflow)?
            } else {
                mul(&[blocks, 4])?
            };
            // The 16-entry code table of NF4/FP4.
            div_ceil(n, 2)
                .checked_add(absmax)
                .and_then(|b| b.checked_add(64))
                .ok_or_else(overflow)?
        }
        QuantMethod::Fp4 => {
            let group = u64::from(q.group_size.unwrap_or(32));
            let scales = mul(&[div_ceil(input, group), output])?;
            div_ceil(n, 2)
                .checked_add(scales)
                .and_then(|b| b.checked_add(4))
                .ok_or_else(overflow)?
        }
        QuantMethod::Gguf(file_type) => {
            let ggml_type = gguf_mix::tensor_type(file_type, lin.role, layer, input, mix);
            gguf_mix::matrix_bytes(ggml_type, input, output)?
        }
    };
    mul(&[total, lin.count])
}

fn computed(shape: &ModelShape, q: Quantization) -> Result<WeightGroups, Error> {
    let p = &shape.params;
    let mix = MixModel {
        architecture: shape.text_architecture,
        layers: shape.layers,
        experts: shape.moe.map_or(1, |m| m.num_experts),
        gqa: shape.heads.checked_div(shape.kv_heads).unwrap_or(1),
        has_output: !shape.tied_embeddings,
    };
    let mut g = WeightGroups::empty(shape, WeightsOrigin::Computed);
    g.quantization = Some(q);
    let linears = linears(shape);
    let linear_params = linears.iter().try_fold(0u64, |acc, l| {
        acc.checked_add(mul(&[l.input, l.output, l.count])?)
            .ok_or_else(overflow)
    })?;
    // Norms, biases and the router: whatever the layer holds beyond its matrices.
    let rest = p
        .decoder_layer
        .total()
        .checked_sub(linear_params)
        .ok_or(Error::EstimateOverflow {
            what: "layer parameters smaller than its matrices",
        })?;
    let hp = high_precision_bytes(&q);
    let rest_bytes = Bytes::new(mul(&[rest, hp])?);
    for (index, layer) in (0u64..).zip(g.layers.iter_mut()) {
        layer.replicated = rest_bytes;
        for lin in &linears {
            let bytes = Bytes::new(linear_bytes(&q, lin, index, &mix)?);
            match lin.part {
                Part::Qo => add(&mut layer.attention_qo, bytes)?,
                Part::Kv => add(&mut layer.attention_kv, bytes)?,
                Part::Qkv => {
                    let (qo, kv) = split_fused_qkv(shape, bytes)?;
                    add(&mut layer.attention_qo, qo)?;
                    add(&mut layer.attention_kv, kv)?;
                }
                Part::Mlp | Part::Replicated | Part::Unknown => add(&mut layer.mlp, bytes)?,
            }
        }
    }
    let matrix = unquantized_matrix_bytes(&q);
    let (embeddings, lm_head) = match q.method {
        QuantMethod::Gguf(file_type) => {
            let row = shape.hidden;
            let embd = gguf_mix::tensor_type(file_type, Role::TokenEmbd, 0, row, &mix);
            let output = gguf_mix::tensor_type(file_type, Role::Output, 0, row, &mix);
            let lm_head = if shape.tied_embeddings {
                0
            } else {
                gguf_mix::matrix_bytes(output, row, shape.vocab)?
            };
            (gguf_mix::matrix_bytes(embd, row, shape.vocab)?, lm_head)
        }
        _ => (mul(&[p.embeddings, matrix])?, mul(&[p.lm_head, matrix])?),
    };
    g.embeddings = Bytes::new(embeddings);
    g.lm_head = Bytes::new(lm_head);
    // GGUF converters keep learned position embeddings in f16 (f32 in an F32 file).
    g.position_embeddings = Bytes::new(mul(&[p.position_embeddings, matrix])?);
    g.final_norm = Bytes::new(mul(&[p.final_norm, hp])?);
    let (vision_layers, vision_other) = computed_vision(shape, matrix)?;
    g.vision_layers = vision_layers;
    g.vision_other = vision_other;
    Ok(g)
}
