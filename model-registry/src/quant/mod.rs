//! What a variant's weights are stored as: format, quantization method, bits per weight
//! and group size.
//!
//! The evidence comes from three places, each with its own constructor:
//!
//! - `config.json`: `quantization_config` (GPTQ, AWQ, bitsandbytes, FP8,
//!   compressed-tensors, ModelOpt, MXFP4) and `torch_dtype` —
//!   [`Quantization::from_config`].
//! - safetensors headers: the dtypes and shapes of the tensors themselves (all F8_E4M3
//!   is FP8; I32 `qweight` is GPTQ or AWQ, with bits and group size read off the shapes)
//!   — [`Quantization::from_safetensors`].
//! - GGUF: `general.file_type` in the header, or the file name before any header is
//!   read (`…Q4_K_M.gguf`) — [`Quantization::from_gguf`],
//!   [`Quantization::from_gguf_file_name`].
//!
//! [`Quantization::nominal`] maps a variant to the precision tiers of workflows
//! (fp32 > bf16 = fp16 > fp8 > int8 > int6 > int5 > int4 > int3 > int2) without this
//! crate knowing the workflow language.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use serde::{Serialize, Serializer};
use serde_json::{Map, Value};

use crate::gguf::GgufHeader;
use crate::safetensors::SafetensorsTensor;
use crate::{Error, GgmlType, SafetensorsDtype};

/// bitsandbytes quantizes 4-bit weights in blocks of 64 with an f32 absmax per block;
/// `quantization_config` does not record the block size, so this is the library's
/// default.
const BNB_4BIT_BLOCK: u32 = 64;
/// With double quantization the absmax values are themselves quantized to 8 bits, with
/// one f32 scale per 256 of them.
const BNB_NESTED_BLOCK: f32 = 256.0;

/// The file format of a variant's weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum WeightFormat {
    /// `.safetensors` files (possibly sharded).
    Safetensors,
    /// A `.gguf` file (possibly split).
    Gguf,
}

impl fmt::Display for WeightFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(match self {
            WeightFormat::Safetensors => "safetensors",
            WeightFormat::Gguf => "gguf",
        })
    }
}

/// How the weights are quantized, if at all.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum QuantMethod {
    /// 32-bit float weights.
    Fp32,
    /// bfloat16 weights.
    Bf16,
    /// IEEE half-precision weights.
    Fp16,
    /// 8-bit float weights (E4M3 or E5M2), usually with per-tensor, per-channel or block
    /// scales.
    Fp8,
    /// 4-bit float weights with block scales (OCP MXFP4, NVIDIA NVFP4).
    Fp4,
    /// 8-bit integer weights with scales (W8A8 and weight-only int8).
    Int8,
    /// GPTQ: integer weights packed into I32 `qweight`, with `qzeros`, `scales`, `g_idx`.
    Gptq,
    /// AWQ: integer weights packed into I32 `qweight`, with `qzeros` and `scales`.
    Awq,
    /// Integer weights packed into I32 words by compressed-tensors (`pack-quantized`).
    PackedInt,
    /// bitsandbytes 4-bit (NF4 or FP4) in blocks.
    BitsAndBytes4,
    /// bitsandbytes LLM.int8.
    BitsAndBytes8,
    /// A GGUF file of this llama.cpp file type.
    Gguf(GgufFileType),
}

impl fmt::Display for QuantMethod {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match self {
            QuantMethod::Fp32 => "fp32",
            QuantMethod::Bf16 => "bf16",
            QuantMethod::Fp16 => "fp16",
            QuantMethod::Fp8 => "fp8",
            QuantMethod::Fp4 => "fp4",
            QuantMethod::Int8 => "int8",
            QuantMethod::Gptq => "gptq",
            QuantMethod::Awq => "awq",
            QuantMethod::PackedInt => "packed-int",
            QuantMethod::BitsAndBytes4 => "bitsandbytes-4bit",
            QuantMethod::BitsAndBytes8 => "bitsandbytes-8bit",
            QuantMethod::Gguf(file_type) => return write!(f, "{file_type}"),
        };
        f.pad(name)
    }
}

/// Whether the nominal weight values are integers or floats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum NumberKind {
    /// Integer codes (with scales): GPTQ, AWQ, int8, GGUF k-quants.
    Int,
    /// Floating-point values: fp32, bf16, fp16, fp8, fp4.
    Float,
}

/// The nominal precision of a variant, for mapping to the workflow's tiers.
///
/// Ordered as the tiers are: more bits first, and at equal bits a float above an
/// integer (fp8 > int8). Workflow tiers distinguish the kind only at 8 bits; below that
/// they go by bits alone (an fp4 variant is an int4-tier variant).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct NominalPrecision {
    /// Bits of one weight value before scales: 16 for bf16, 4 for GPTQ-4 and `Q4_K_M`.
    pub bits: u8,
    /// Integer or float values.
    pub kind: NumberKind,
}

/// The quantization of one variant.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Quantization {
    /// The file format.
    pub format: WeightFormat,
    /// The method.
    pub method: QuantMethod,
    /// Effective storage bits per weight, scales and zero points included where the
    /// evidence tells them: 4.156 for GPTQ 4-bit with groups of 128
    /// (`bits + (16 + bits) / group_size`), 4.5 for a `Q4_K_M` file name (its principal
    /// type `Q4_K`), and the exact file-wide figure (tensor bytes × 8 / parameters) for a
    /// parsed GGUF header. Use header byte counts, not this, for memory estimates.
    pub bits: f32,
    /// Nominal bits of one weight value (see [`NominalPrecision::bits`]).
    pub weight_bits: u8,
    /// Weights per quantization group (or block) along the input dimension; `None` for
    /// unquantized weights and per-channel scales.
    pub group_size: Option<u32>,
}

impl Quantization {
    /// Classifies a safetensors variant from its `config.json`: `quantization_config`
    /// when present, else `torch_dtype`. `Ok(None)` when both are absent.
    ///
    /// Errors: [`Error::UnsupportedQuantization`] for a method or dtype Skein does not
    /// know (the variant should be skipped, with that reason), and
    /// [`Error::QuantizationConfigField`] for a known method whose configuration is
    /// malformed.
    pub fn from_config(quantization_config: Option<&Value>, torch_dtype: Option<&str>) -> Result<Option<Self>, Error> {
        match (quantization_config.filter(|qc| !qc.is_null()), torch_dtype) {
            (Some(qc), _) => from_quantization_config(qc).map(Some),
            (None, Some(dtype)) => from_torch_dtype(dtype).map(Some),
            (None, None) => Ok(None),
        }
    }

    /// As [`from_config`](Self::from_config), reading the fields from a whole
    /// `config.json`: `quantization_config` (or the older `compression_config`), and
    /// `torch_dtype` (or `dtype`, as newer transformers write it; also looked for in
    /// `text_config` of multimodal models).
    pub fn from_config_json(config: &Value) -> Result<Option<Self>, Error> {
        let quantization_config = config
            .get("quantization_config")
            .or_else(|| config.get("compression_config"));
        let dtype_of = |c: &Value| {
            c.get("torch_dtype")
                .or_else(|| c.get("dtype"))
                .and_then(Value::as_str)
                .map(str::to_owned)
        };
        let torch_dtype = dtype_of(config).or_else(|| config.get("text_config").and_then(dtype_of));
        Self::from_config(quantization_config, torch_dtype.as_deref())
    }

    /// Classifies safetensors weights from their tensors. Pass the tensors of every shard
    /// of a sharded checkpoint: a single shard may hold only the embeddings.
    ///
    /// Packed GPTQ/AWQ layers (`*.qweight` in I32) give bits and group size from their
    /// shapes: GPTQ (which has `g_idx`) stores `qweight` as `[in × bits / 32, out]`, AWQ
    /// as `[in, out × bits / 32]`, and both `scales` as `[in / group, out]`. bitsandbytes
    /// and gpt-oss MXFP4 layers are recognised by their companion tensors. Otherwise the
    /// dtype holding most bytes among tensors of two or more dimensions decides.
    ///
    /// `None` when the tensors do not say: packed layers whose shapes disagree (mixed
    /// bits) or do not fit either layout, or a dominant dtype that is no weight format.
    pub fn from_safetensors<'a>(tensors: impl IntoIterator<Item = &'a SafetensorsTensor>) -> Option<Self> {
        let by_name: BTreeMap<&str, &SafetensorsTensor> = tensors.into_iter().map(|t| (t.name.as_str(), t)).collect();
        packed_from_tensors(&by_name)
            .or_else(|| bitsandbytes_from_tensors(&by_name))
            .or_else(|| mxfp4_from_tensors(&by_name))
            .or_else(|| dense_from_tensors(&by_name))
    }

    /// Classifies a GGUF file from its header's `general.file_type`, with the exact
    /// bits per weight of the whole file. `None` if the key is absent or names a file
    /// type this crate does not know.
    pub fn from_gguf(header: &GgufHeader) -> Option<Self> {
        let file_type = GgufFileType::from_id(header.file_type()?)?;
        let mut quantization = Self::from_gguf_file_type(file_type);
        let totals = header.totals();
        if totals.params > 0 {
            quantization.bits = (totals.bytes.get() as f64 * 8.0 / totals.params as f64) as f32;
        }
        Some(quantization)
    }

    /// The nominal classification of a GGUF file type, before its header is read: bits
    /// per weight are those of its principal ggml type.
    pub fn from_gguf_file_type(file_type: GgufFileType) -> Self {
        let principal = file_type.principal_type();
        Quantization {
            format: WeightFormat::Gguf,
            method: QuantMethod::Gguf(file_type),
            bits: principal.bits_per_weight() as f32,
            weight_bits: file_type.nominal().bits,
            group_size: principal
                .is_quantized()
                .then(|| u32::try_from(principal.elements_per_block()).ok())
                .flatten(),
        }
    }

    /// Classifies a GGUF file from its name (`Meta-Llama-3-8B-Instruct.Q4_K_M.gguf`,
    /// `qwen2.5-7b-instruct-q4_k_m-00001-of-00002.gguf`); see
    /// [`GgufFileType::from_file_name`].
    pub fn from_gguf_file_name(file_name: &str) -> Option<Self> {
        GgufFileType::from_file_name(file_name).map(Self::from_gguf_file_type)
    }

    /// The nominal precision, for mapping to workflow tiers.
    pub fn nominal(&self) -> NominalPrecision {
        let float = |bits| NominalPrecision {
            bits,
            kind: NumberKind::Float,
        };
        match self.method {
            QuantMethod::Gguf(file_type) => file_type.nominal(),
            QuantMethod::Fp32 | QuantMethod::Bf16 | QuantMethod::Fp16 | QuantMethod::Fp8 | QuantMethod::Fp4 => {
                float(self.weight_bits)
            }
            QuantMethod::Int8
            | QuantMethod::Gptq
            | QuantMethod::Awq
            | QuantMethod::PackedInt
            | QuantMethod::BitsAndBytes4
            | QuantMethod::BitsAndBytes8 => NominalPrecision {
                bits: self.weight_bits,
                kind: NumberKind::Int,
            },
        }
    }

    /// Nominal bits of one weight (`nominal().bits`): 32, 16, 8, 6, 5, 4, 3, 2 or 1.
    pub fn tier_bits(&self) -> u8 {
        self.nominal().bits
    }

    fn safetensors(method: QuantMethod, bits: f32, weight_bits: u8, group_size: Option<u32>) -> Self {
        Quantization {
            format: WeightFormat::Safetensors,
            method,
            bits,
            weight_bits,
            group_size,
        }
    }

    fn dense(method: QuantMethod, weight_bits: u8) -> Self {
        Self::safetensors(method, f32::from(weight_bits), weight_bits, None)
    }

    /// Integer weights with a 16-bit scale and a `bits`-wide zero point per group.
    fn grouped_int(method: QuantMethod, weight_bits: u8, group_size: Option<u32>) -> Self {
        let bits = f32::from(weight_bits);
        let effective = match group_size {
            Some(group) => bits + (16.0 + bits) / group as f32,
            None => bits,
        };
        Self::safetensors(method, effective, weight_bits, group_size)
    }
}

impl fmt::Display for Quantization {
    /// `safetensors gptq 4-bit, group 128, 4.16 bits/weight`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {} {}-bit", self.format, self.method, self.weight_bits)?;
        if let Some(group) = self.group_size {
            write!(f, ", group {group}")?;
        }
        write!(f, ", {:.2} bits/weight", self.bits)
    }
}

fn from_torch_dtype(dtype: &str) -> Result<Quantization, Error> {
    let name = dtype.strip_prefix("torch.").unwrap_or(dtype);
    match name {
        "float32" | "float" => Ok(Quantization::dense(QuantMethod::Fp32, 32)),
        "bfloat16" => Ok(Quantization::dense(QuantMethod::Bf16, 16)),
        "float16" | "half" => Ok(Quantization::dense(QuantMethod::Fp16, 16)),
        _ => Err(Error::UnsupportedQuantization {
            found: format!("torch_dtype {dtype}"),
        }),
    }
}

fn from_quantization_config(qc: &Value) -> Result<Quantization, Error> {
    let Some(config) = qc.as_object() else {
        return Err(field_error("quantization_config", Some(qc)));
    };
    let method = config
        .get("quant_method")
        .and_then(Value::as_str)
        .map(str::to_ascii_lowercase);
    match method.as_deref() {
        Some("gptq") => {
            let bits = int_bits(config, &["bits"])?;
            Ok(Quantization::grouped_int(
                QuantMethod::Gptq,
                bits,
                group_size(config, &["group_size"])?,
            ))
        }
        Some("awq") => {
            let bits = int_bits(config, &["bits", "w_bit"])?;
            let group = group_size(config, &["group_size", "q_group_size"])?;
            Ok(Quantization::grouped_int(QuantMethod::Awq, bits, group))
        }
        Some("bitsandbytes") => bitsandbytes(config),
        // Configs written before transformers recorded `quant_method`.
        None if flag(config, "load_in_4bit") || flag(config, "load_in_8bit") => bitsandbytes(config),
        Some("fp8" | "fbgemm_fp8") => Ok(Quantization::dense(QuantMethod::Fp8, 8)),
        Some("mxfp4") => Ok(fp4(Some(32), 8)),
        Some("compressed-tensors") => compressed_tensors(config),
        Some("modelopt") => modelopt(config),
        Some(other) => Err(Error::UnsupportedQuantization {
            found: other.to_owned(),
        }),
        None => Err(field_error("quant_method", config.get("quant_method"))),
    }
}

/// 4-bit floats with one `scale_bits`-wide scale per `group` values: MXFP4 has an 8-bit
/// exponent per 32, NVFP4 an FP8 scale per 16.
fn fp4(group: Option<u32>, scale_bits: u8) -> Quantization {
    let bits = 4.0 + group.map_or(0.0, |g| f32::from(scale_bits) / g as f32);
    Quantization::safetensors(QuantMethod::Fp4, bits, 4, group)
}

fn bitsandbytes(config: &Map<String, Value>) -> Result<Quantization, Error> {
    if flag(config, "load_in_4bit") {
        let block = BNB_4BIT_BLOCK as f32;
        let bits = if flag(config, "bnb_4bit_use_double_quant") {
            4.0 + 8.0 / block + 32.0 / (block * BNB_NESTED_BLOCK)
        } else {
            4.0 + 32.0 / block
        };
        Ok(Quantization::safetensors(
            QuantMethod::BitsAndBytes4,
            bits,
            4,
            Some(BNB_4BIT_BLOCK),
        ))
    } else if flag(config, "load_in_8bit") {
        Ok(Quantization::dense(QuantMethod::BitsAndBytes8, 8))
    } else {
        Err(field_error("load_in_4bit", config.get("load_in_4bit")))
    }
}

/// compressed-tensors describes each group of layers in `config_groups`; the first
/// group (in key order) is taken as the variant's scheme.
fn compressed_tensors(config: &Map<String, Value>) -> Result<Quantization, Error> {
    let groups = config.get("config_groups").and_then(Value::as_object);
    let Some(weights) = groups
        .and_then(|groups| groups.values().next())
        .and_then(|group| group.get("weights"))
        .and_then(Value::as_object)
    else {
        return Err(field_error("config_groups", config.get("config_groups")));
    };
    let num_bits = int_bits(weights, &["num_bits"])?;
    let group = match weights.get("strategy").and_then(Value::as_str) {
        Some("group" | "tensor_group") => group_size(weights, &["group_size"])?,
        _ => None,
    };
    let kind = weights.get("type").and_then(Value::as_str).unwrap_or("int");
    match (kind, num_bits) {
        ("float", 8) => Ok(Quantization::dense(QuantMethod::Fp8, 8)),
        ("float", 4) => Ok(fp4(group, 8)),
        ("int", 8) => Ok(Quantization::dense(QuantMethod::Int8, 8)),
        ("int", bits) if bits < 8 => {
            let effective = f32::from(bits) + group.map_or(0.0, |g| 16.0 / g as f32);
            Ok(Quantization::safetensors(
                QuantMethod::PackedInt,
                effective,
                bits,
                group,
            ))
        }
        _ => Err(Error::UnsupportedQuantization {
            found: format!("compressed-tensors {kind}{num_bits}"),
        }),
    }
}

/// NVIDIA ModelOpt checkpoints name their scheme in `quant_algo`.
fn modelopt(config: &Map<String, Value>) -> Result<Quantization, Error> {
    match config.get("quant_algo").and_then(Value::as_str) {
        Some("FP8") => Ok(Quantization::dense(QuantMethod::Fp8, 8)),
        Some("NVFP4") => Ok(fp4(Some(16), 8)),
        Some(other) => Err(Error::UnsupportedQuantization {
            found: format!("modelopt {other}"),
        }),
        None => Err(field_error("quant_algo", None)),
    }
}

fn flag(config: &Map<String, Value>, key: &str) -> bool {
    // transformers serialises some flags with a leading underscore.
    let underscored = format!("_{key}");
    [key, underscored.as_str()]
        .iter()
        .any(|k| config.get(*k).and_then(Value::as_bool) == Some(true))
}

/// The first of `keys` present, as a weight width of 1 to 8 bits.
fn int_bits(config: &Map<String, Value>, keys: &[&'static str]) -> Result<u8, Error> {
    let (key, value) = first_present(config, keys);
    value
        .and_then(Value::as_u64)
        .filter(|bits| (1..=8).contains(bits))
        .and_then(|bits| u8::try_from(bits).ok())
        .ok_or_else(|| field_error(key, value))
}

/// The first of `keys` present, as a group size: absent or -1 (per channel) is `None`.
fn group_size(config: &Map<String, Value>, keys: &[&'static str]) -> Result<Option<u32>, Error> {
    let (key, value) = first_present(config, keys);
    match value {
        None | Some(Value::Null) => Ok(None),
        Some(v) if v.as_i64() == Some(-1) => Ok(None),
        Some(v) => v
            .as_u64()
            .filter(|&group| group > 0)
            .and_then(|group| u32::try_from(group).ok())
            .map(Some)
            .ok_or_else(|| field_error(key, value)),
    }
}

fn first_present<'a>(config: &'a Map<String, Value>, keys: &[&'static str]) -> (&'static str, Option<&'a Value>) {
    keys.iter()
        .find_map(|&key| config.get(key).map(|value| (key, Some(value))))
        .unwrap_or((keys.first().copied().unwrap_or("quantization_config"), None))
}

fn field_error(field: &'static str, value: Option<&Value>) -> Error {
    Error::QuantizationConfigField {
        field,
        found: value.map_or_else(|| "nothing".to_owned(), Value::to_string),
    }
}

type TensorsByName<'a> = BTreeMap<&'a str, &'a SafetensorsTensor>;

/// GPTQ or AWQ, if the checkpoint has packed `qweight` tensors that all agree.
fn packed_from_tensors(by_name: &TensorsByName<'_>) -> Option<Quantization> {
    let mut layouts = by_name
        .values()
        .filter(|t| t.dtype == SafetensorsDtype::I32)
        .filter_map(|t| Some((t, t.name.strip_suffix(".qweight")?)))
        .map(|(qweight, layer)| packed_layout(qweight, layer, by_name));
    let first = layouts.next()?;
    let (method, bits, group) = first?;
    if layouts.any(|layout| layout != first) {
        return None;
    }
    Some(Quantization::grouped_int(method, bits, group))
}

/// `(method, bits, group size)` of one packed layer, from the shapes of its tensors.
fn packed_layout(
    qweight: &SafetensorsTensor,
    layer: &str,
    by_name: &TensorsByName<'_>,
) -> Option<(QuantMethod, u8, Option<u32>)> {
    let scales = by_name.get(format!("{layer}.scales").as_str())?;
    let &[groups, scale_cols] = scales.shape.as_slice() else {
        return None;
    };
    let &[rows, cols] = qweight.shape.as_slice() else {
        return None;
    };
    let (method, in_features, packed, unpacked) = match by_name.get(format!("{layer}.g_idx").as_str()) {
        // GPTQ packs along the input dimension: rows = in × bits / 32.
        Some(g_idx) => (QuantMethod::Gptq, g_idx.elements, rows, g_idx.elements),
        // AWQ packs along the output dimension: cols = out × bits / 32.
        None => (QuantMethod::Awq, rows, cols, scale_cols),
    };
    let bits = exact_div(packed.checked_mul(32)?, unpacked)?;
    let bits = u8::try_from(bits).ok().filter(|b| (1..=8).contains(b))?;
    let group = exact_div(in_features, groups)?;
    let group = if groups == 1 {
        None
    } else {
        Some(u32::try_from(group).ok()?)
    };
    Some((method, bits, group))
}

/// bitsandbytes 4-bit stores each weight as U8 with `<weight>.absmax` and a
/// `<weight>.quant_state.bitsandbytes__nf4` (or `__fp4`) tensor; 8-bit as I8 with
/// `<weight>.SCB`. Bits are counted from the first layer's tensors.
fn bitsandbytes_from_tensors(by_name: &TensorsByName<'_>) -> Option<Quantization> {
    let (&state_name, _) = by_name
        .iter()
        .find(|(name, _)| name.contains(".quant_state.bitsandbytes__"))?;
    let (weight_name, _) = state_name.split_once(".quant_state.")?;
    let weight = by_name.get(weight_name)?;
    let absmax = by_name.get(format!("{weight_name}.absmax").as_str())?;
    // Two 4-bit weights per byte.
    let n_weights = weight.elements.checked_mul(2)?;
    let block = u32::try_from(exact_div(n_weights, absmax.elements)?).ok()?;
    let prefix = format!("{weight_name}.");
    let stored = by_name
        .iter()
        .filter(|(name, _)| **name == weight_name || name.starts_with(&prefix))
        .try_fold(0u64, |sum, (_, t)| sum.checked_add(t.bytes().get()))?;
    let bits = (stored as f64 * 8.0 / n_weights as f64) as f32;
    Some(Quantization::safetensors(
        QuantMethod::BitsAndBytes4,
        bits,
        4,
        Some(block),
    ))
}

/// gpt-oss stores MXFP4 experts as `*_blocks` (U8, 16 bytes for 32 values) with
/// `*_scales` (U8, one exponent per block).
fn mxfp4_from_tensors(by_name: &TensorsByName<'_>) -> Option<Quantization> {
    let (blocks, scales) = by_name.iter().find_map(|(name, t)| {
        let stem = name.strip_suffix("_blocks")?;
        let scales = by_name.get(format!("{stem}_scales").as_str())?;
        (t.dtype == SafetensorsDtype::U8 && scales.dtype == SafetensorsDtype::U8).then_some((t, scales))
    })?;
    let bytes_per_block = *blocks.shape.last()?;
    let group = u32::try_from(bytes_per_block.checked_mul(2)?).ok()?;
    let n_weights = blocks.elements.checked_mul(2)?;
    let stored = blocks.bytes().get().checked_add(scales.bytes().get())?;
    let bits = (stored as f64 * 8.0 / n_weights.max(1) as f64) as f32;
    Some(Quantization::safetensors(QuantMethod::Fp4, bits, 4, Some(group)))
}

/// The dtype with the most bytes among matrices (norms and biases stay in high
/// precision in every scheme) decides; ties go to the wider dtype.
fn dense_from_tensors(by_name: &TensorsByName<'_>) -> Option<Quantization> {
    use SafetensorsDtype as D;
    let mut bytes_by_dtype: BTreeMap<SafetensorsDtype, u64> = BTreeMap::new();
    let has_scb = by_name.keys().any(|name| name.ends_with(".SCB"));
    for tensor in by_name.values().filter(|t| t.shape.len() >= 2) {
        let entry = bytes_by_dtype.entry(tensor.dtype).or_default();
        *entry = entry.saturating_add(tensor.bytes().get());
    }
    let (&dtype, _) = bytes_by_dtype.iter().max_by_key(|&(&dtype, &bytes)| (bytes, dtype))?;
    Some(match dtype {
        D::F32 => Quantization::dense(QuantMethod::Fp32, 32),
        D::BF16 => Quantization::dense(QuantMethod::Bf16, 16),
        D::F16 => Quantization::dense(QuantMethod::Fp16, 16),
        D::F8_E4M3 | D::F8_E5M2 | D::F8_E4M3FNUZ | D::F8_E5M2FNUZ => Quantization::dense(QuantMethod::Fp8, 8),
        D::I8 if has_scb => Quantization::dense(QuantMethod::BitsAndBytes8, 8),
        D::I8 => Quantization::dense(QuantMethod::Int8, 8),
        _ => return None,
    })
}

fn exact_div(numerator: u64, denominator: u64) -> Option<u64> {
    (denominator != 0 && numerator.is_multiple_of(denominator)).then(|| numerator / denominator)
}

/// A llama.cpp model file type: `general.file_type` in a GGUF header (`enum
/// llama_ftype` in `llama.h`), which names the quantization mix (`Q4_K_M`).
///
/// Ids 5, 6 and 33 to 35 belonged to types that ggml removed and are not listed. Id 4
/// (`Q4_1_SOME_F16`) is commented out in `llama.h` but its files still load.
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[repr(u32)]
pub enum GgufFileType {
    /// All tensors F32.
    F32 = 0,
    /// Mostly F16.
    F16 = 1,
    /// Mostly Q4_0.
    Q4_0 = 2,
    /// Mostly Q4_1.
    Q4_1 = 3,
    /// Q4_1 with F16 embeddings and output.
    Q4_1_SOME_F16 = 4,
    /// Mostly Q8_0.
    Q8_0 = 7,
    /// Mostly Q5_0.
    Q5_0 = 8,
    /// Mostly Q5_1.
    Q5_1 = 9,
    /// Mostly Q2_K.
    Q2_K = 10,
    /// Q3_K, small mix.
    Q3_K_S = 11,
    /// Q3_K, medium mix.
    Q3_K_M = 12,
    /// Q3_K, large mix.
    Q3_K_L = 13,
    /// Q4_K, small mix.
    Q4_K_S = 14,
    /// Q4_K, medium mix.
    Q4_K_M = 15,
    /// Q5_K, small mix.
    Q5_K_S = 16,
    /// Q5_K, medium mix.
    Q5_K_M = 17,
    /// Mostly Q6_K.
    Q6_K = 18,
    /// Mostly IQ2_XXS.
    IQ2_XXS = 19,
    /// Mostly IQ2_XS.
    IQ2_XS = 20,
    /// Q2_K, small mix.
    Q2_K_S = 21,
    /// IQ3 at 3.3 bits per weight (IQ3_S tensors).
    IQ3_XS = 22,
    /// Mostly IQ3_XXS.
    IQ3_XXS = 23,
    /// Mostly IQ1_S.
    IQ1_S = 24,
    /// Mostly IQ4_NL.
    IQ4_NL = 25,
    /// Mostly IQ3_S.
    IQ3_S = 26,
    /// IQ3_S, medium mix.
    IQ3_M = 27,
    /// IQ2 at 2.5 bits per weight.
    IQ2_S = 28,
    /// IQ2 at 2.7 bits per weight.
    IQ2_M = 29,
    /// Mostly IQ4_XS.
    IQ4_XS = 30,
    /// Mostly IQ1_M.
    IQ1_M = 31,
    /// Mostly BF16.
    BF16 = 32,
    /// Mostly TQ1_0 (ternary).
    TQ1_0 = 36,
    /// Mostly TQ2_0 (ternary).
    TQ2_0 = 37,
    /// MXFP4 experts, the rest Q8_0 or higher.
    MXFP4_MOE = 38,
    /// Mostly NVFP4.
    NVFP4 = 39,
    /// Mostly Q1_0.
    Q1_0 = 40,
    /// Mostly Q2_0.
    Q2_0 = 41,
}

impl GgufFileType {
    /// Every file type, in id order.
    pub const ALL: [GgufFileType; 37] = [
        Self::F32,
        Self::F16,
        Self::Q4_0,
        Self::Q4_1,
        Self::Q4_1_SOME_F16,
        Self::Q8_0,
        Self::Q5_0,
        Self::Q5_1,
        Self::Q2_K,
        Self::Q3_K_S,
        Self::Q3_K_M,
        Self::Q3_K_L,
        Self::Q4_K_S,
        Self::Q4_K_M,
        Self::Q5_K_S,
        Self::Q5_K_M,
        Self::Q6_K,
        Self::IQ2_XXS,
        Self::IQ2_XS,
        Self::Q2_K_S,
        Self::IQ3_XS,
        Self::IQ3_XXS,
        Self::IQ1_S,
        Self::IQ4_NL,
        Self::IQ3_S,
        Self::IQ3_M,
        Self::IQ2_S,
        Self::IQ2_M,
        Self::IQ4_XS,
        Self::IQ1_M,
        Self::BF16,
        Self::TQ1_0,
        Self::TQ2_0,
        Self::MXFP4_MOE,
        Self::NVFP4,
        Self::Q1_0,
        Self::Q2_0,
    ];

    /// Aliases that `llama-quantize` and file names use besides the canonical names.
    const ALIASES: [(&'static str, GgufFileType); 7] = [
        ("Q4_K", Self::Q4_K_M),
        ("Q3_K", Self::Q3_K_M),
        ("Q5_K", Self::Q5_K_M),
        ("FP16", Self::F16),
        ("FP32", Self::F32),
        ("MXFP4", Self::MXFP4_MOE),
        ("Q4_1_F16", Self::Q4_1_SOME_F16),
    ];

    /// The file type with this `general.file_type` id, if known.
    pub fn from_id(id: u32) -> Option<Self> {
        Self::ALL.iter().copied().find(|t| t.id() == id)
    }

    /// The `general.file_type` id.
    pub const fn id(self) -> u32 {
        self as u32
    }

    /// The name `llama-quantize` uses (`Q4_K_M`).
    pub const fn name(self) -> &'static str {
        match self {
            Self::F32 => "F32",
            Self::F16 => "F16",
            Self::Q4_0 => "Q4_0",
            Self::Q4_1 => "Q4_1",
            Self::Q4_1_SOME_F16 => "Q4_1_SOME_F16",
            Self::Q8_0 => "Q8_0",
            Self::Q5_0 => "Q5_0",
            Self::Q5_1 => "Q5_1",
            Self::Q2_K => "Q2_K",
            Self::Q3_K_S => "Q3_K_S",
            Self::Q3_K_M => "Q3_K_M",
            Self::Q3_K_L => "Q3_K_L",
            Self::Q4_K_S => "Q4_K_S",
            Self::Q4_K_M => "Q4_K_M",
            Self::Q5_K_S => "Q5_K_S",
            Self::Q5_K_M => "Q5_K_M",
            Self::Q6_K => "Q6_K",
            Self::IQ2_XXS => "IQ2_XXS",
            Self::IQ2_XS => "IQ2_XS",
            Self::Q2_K_S => "Q2_K_S",
            Self::IQ3_XS => "IQ3_XS",
            Self::IQ3_XXS => "IQ3_XXS",
            Self::IQ1_S => "IQ1_S",
            Self::IQ4_NL => "IQ4_NL",
            Self::IQ3_S => "IQ3_S",
            Self::IQ3_M => "IQ3_M",
            Self::IQ2_S => "IQ2_S",
            Self::IQ2_M => "IQ2_M",
            Self::IQ4_XS => "IQ4_XS",
            Self::IQ1_M => "IQ1_M",
            Self::BF16 => "BF16",
            Self::TQ1_0 => "TQ1_0",
            Self::TQ2_0 => "TQ2_0",
            Self::MXFP4_MOE => "MXFP4_MOE",
            Self::NVFP4 => "NVFP4",
            Self::Q1_0 => "Q1_0",
            Self::Q2_0 => "Q2_0",
        }
    }

    /// The ggml type most tensors of the file have: llama.cpp's
    /// `llama_ftype_get_default_type` (`Q4_K` for `Q4_K_M`, `IQ2_XS` for `IQ2_S`).
    pub const fn principal_type(self) -> GgmlType {
        match self {
            Self::F32 => GgmlType::F32,
            Self::F16 => GgmlType::F16,
            Self::BF16 => GgmlType::BF16,
            Self::Q4_0 => GgmlType::Q4_0,
            Self::Q4_1 | Self::Q4_1_SOME_F16 => GgmlType::Q4_1,
            Self::Q8_0 => GgmlType::Q8_0,
            Self::Q5_0 => GgmlType::Q5_0,
            Self::Q5_1 => GgmlType::Q5_1,
            Self::Q2_K | Self::Q2_K_S => GgmlType::Q2_K,
            Self::Q3_K_S | Self::Q3_K_M | Self::Q3_K_L => GgmlType::Q3_K,
            Self::Q4_K_S | Self::Q4_K_M => GgmlType::Q4_K,
            Self::Q5_K_S | Self::Q5_K_M => GgmlType::Q5_K,
            Self::Q6_K => GgmlType::Q6_K,
            Self::IQ2_XXS => GgmlType::IQ2_XXS,
            Self::IQ2_XS | Self::IQ2_S => GgmlType::IQ2_XS,
            Self::IQ2_M => GgmlType::IQ2_S,
            Self::IQ3_XS | Self::IQ3_S | Self::IQ3_M => GgmlType::IQ3_S,
            Self::IQ3_XXS => GgmlType::IQ3_XXS,
            Self::IQ1_S => GgmlType::IQ1_S,
            Self::IQ1_M => GgmlType::IQ1_M,
            Self::IQ4_NL => GgmlType::IQ4_NL,
            Self::IQ4_XS => GgmlType::IQ4_XS,
            Self::TQ1_0 => GgmlType::TQ1_0,
            Self::TQ2_0 => GgmlType::TQ2_0,
            Self::MXFP4_MOE => GgmlType::MXFP4,
            Self::NVFP4 => GgmlType::NVFP4,
            Self::Q1_0 => GgmlType::Q1_0,
            Self::Q2_0 => GgmlType::Q2_0,
        }
    }

    /// The nominal precision: the bits in the name (`Q5_K_M` is 5, `IQ3_XXS` 3, the
    /// ternary `TQ*` and 1-bit types 1 or 2), integer except for the float types.
    pub const fn nominal(self) -> NominalPrecision {
        let (bits, kind) = match self {
            Self::F32 => (32, NumberKind::Float),
            Self::F16 | Self::BF16 => (16, NumberKind::Float),
            Self::MXFP4_MOE | Self::NVFP4 => (4, NumberKind::Float),
            Self::Q8_0 => (8, NumberKind::Int),
            Self::Q6_K => (6, NumberKind::Int),
            Self::Q5_0 | Self::Q5_1 | Self::Q5_K_S | Self::Q5_K_M => (5, NumberKind::Int),
            Self::Q4_0
            | Self::Q4_1
            | Self::Q4_1_SOME_F16
            | Self::Q4_K_S
            | Self::Q4_K_M
            | Self::IQ4_NL
            | Self::IQ4_XS => (4, NumberKind::Int),
            Self::Q3_K_S | Self::Q3_K_M | Self::Q3_K_L | Self::IQ3_XS | Self::IQ3_XXS | Self::IQ3_S | Self::IQ3_M => {
                (3, NumberKind::Int)
            }
            Self::Q2_K
            | Self::Q2_K_S
            | Self::IQ2_XXS
            | Self::IQ2_XS
            | Self::IQ2_S
            | Self::IQ2_M
            | Self::TQ2_0
            | Self::Q2_0 => (2, NumberKind::Int),
            Self::IQ1_S | Self::IQ1_M | Self::TQ1_0 | Self::Q1_0 => (1, NumberKind::Int),
        };
        NominalPrecision { bits, kind }
    }

    /// Finds the file type in a GGUF file name: the last `-` or `.` separated part of
    /// the name that is a file type (ignoring case), or ends in `_` and one
    /// (`model_q4_k_m.gguf`). A directory prefix is ignored. `None` when no part is a
    /// known type, as with dynamic mixes such as `UD-Q4_K_XL`: read the header then.
    pub fn from_file_name(file_name: &str) -> Option<Self> {
        let base = file_name.rsplit('/').next().unwrap_or(file_name);
        base.split(['-', '.']).rev().find_map(|part| {
            part.parse::<Self>().ok().or_else(|| {
                let (_, suffix) = part.split_once('_')?;
                // Try every `_` boundary: `model_q4_k_m` → `q4_k_m`, `k_m`, `m`.
                std::iter::successors(Some(suffix), |rest| rest.split_once('_').map(|(_, r)| r))
                    .find_map(|candidate| candidate.parse::<Self>().ok())
            })
        })
    }
}

impl fmt::Display for GgufFileType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.name())
    }
}

impl FromStr for GgufFileType {
    type Err = Error;

    /// Parses a name or alias, ignoring case (`q4_k_m`, `Q4_K`, `fp16`).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .iter()
            .map(|&t| (t.name(), t))
            .chain(Self::ALIASES)
            .find(|(name, _)| name.eq_ignore_ascii_case(s))
            .map(|(_, t)| t)
            .ok_or_else(|| Error::UnsupportedQuantization {
                found: format!("GGUF file type {s}"),
            })
    }
}

impl Serialize for GgufFileType {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn config(qc: Value) -> Quantization {
        Quantization::from_config(Some(&qc), Some("float16")).unwrap().unwrap()
    }

    #[test]
    fn file_type_ids_match_llama_h() {
        let expected = [
            (0, "F32"),
            (1, "F16"),
            (2, "Q4_0"),
            (3, "Q4_1"),
            (4, "Q4_1_SOME_F16"),
            (7, "Q8_0"),
            (8, "Q5_0"),
            (9, "Q5_1"),
            (10, "Q2_K"),
            (11, "Q3_K_S"),
            (12, "Q3_K_M"),
            (13, "Q3_K_L"),
            (14, "Q4_K_S"),
            (15, "Q4_K_M"),
            (16, "Q5_K_S"),
            (17, "Q5_K_M"),
            (18, "Q6_K"),
            (19, "IQ2_XXS"),
            (20, "IQ2_XS"),
            (21, "Q2_K_S"),
            (22, "IQ3_XS"),
            (23, "IQ3_XXS"),
            (24, "IQ1_S"),
            (25, "IQ4_NL"),
            (26, "IQ3_S"),
            (27, "IQ3_M"),
            (28, "IQ2_S"),
            (29, "IQ2_M"),
            (30, "IQ4_XS"),
            (31, "IQ1_M"),
            (32, "BF16"),
            (36, "TQ1_0"),
            (37, "TQ2_0"),
            (38, "MXFP4_MOE"),
            (39, "NVFP4"),
            (40, "Q1_0"),
            (41, "Q2_0"),
        ];
        assert_eq!(expected.len(), GgufFileType::ALL.len());
        for (id, name) in expected {
            let file_type = GgufFileType::from_id(id).unwrap();
            assert_eq!(file_type.name(), name, "id {id}");
            assert_eq!(file_type.id(), id);
            assert_eq!(name.parse::<GgufFileType>().unwrap(), file_type);
        }
        for removed in [5, 6, 33, 34, 35, 42, 1024] {
            assert_eq!(GgufFileType::from_id(removed), None, "id {removed}");
        }
    }

    #[test]
    fn file_names_name_their_type() {
        let cases = [
            ("Meta-Llama-3-8B-Instruct.Q4_K_M.gguf", Some(GgufFileType::Q4_K_M)),
            ("llama-2-7b.Q5_K_S.gguf", Some(GgufFileType::Q5_K_S)),
            (
                "qwen2.5-7b-instruct-q4_k_m-00001-of-00002.gguf",
                Some(GgufFileType::Q4_K_M),
            ),
            ("org/repo/Llama-3.2-1B-Instruct-f16.gguf", Some(GgufFileType::F16)),
            ("gemma-2-9b-it-BF16.gguf", Some(GgufFileType::BF16)),
            ("Mistral-7B-Instruct-v0.3.IQ3_XXS.gguf", Some(GgufFileType::IQ3_XXS)),
            ("phi-3-mini-4k-instruct-fp16.gguf", Some(GgufFileType::F16)),
            ("model_q8_0.gguf", Some(GgufFileType::Q8_0)),
            ("gpt-oss-20b-MXFP4.gguf", Some(GgufFileType::MXFP4_MOE)),
            ("tinyllama-1.1b-chat-v1.0.Q4_K.gguf", Some(GgufFileType::Q4_K_M)),
            ("Qwen3-8B-UD-Q4_K_XL.gguf", None),
            ("mmproj-model.gguf", None),
        ];
        for (name, expected) in cases {
            assert_eq!(GgufFileType::from_file_name(name), expected, "{name}");
        }
        let q = Quantization::from_gguf_file_name("x.Q4_K_M.gguf").unwrap();
        assert_eq!(q.bits, 4.5);
        assert_eq!(q.weight_bits, 4);
        assert_eq!(q.group_size, Some(256));
        assert_eq!(q.to_string(), "gguf Q4_K_M 4-bit, group 256, 4.50 bits/weight");
    }

    #[test]
    fn principal_types_follow_llama_quant() {
        assert_eq!(GgufFileType::IQ2_S.principal_type(), GgmlType::IQ2_XS);
        assert_eq!(GgufFileType::IQ2_M.principal_type(), GgmlType::IQ2_S);
        assert_eq!(GgufFileType::IQ3_XS.principal_type(), GgmlType::IQ3_S);
        assert_eq!(GgufFileType::Q3_K_L.principal_type(), GgmlType::Q3_K);
        assert_eq!(GgufFileType::MXFP4_MOE.principal_type(), GgmlType::MXFP4);
        let f16 = Quantization::from_gguf_file_type(GgufFileType::F16);
        assert_eq!((f16.bits, f16.group_size), (16.0, None));
    }

    #[test]
    fn gptq_and_awq_configs() {
        let gptq = config(json!({
            "quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": false, "sym": true
        }));
        assert_eq!(gptq.method, QuantMethod::Gptq);
        assert_eq!(gptq.format, WeightFormat::Safetensors);
        assert_eq!((gptq.weight_bits, gptq.group_size), (4, Some(128)));
        assert_eq!(gptq.bits, 4.0 + 20.0 / 128.0);
        assert_eq!(gptq.to_string(), "safetensors gptq 4-bit, group 128, 4.16 bits/weight");

        let per_channel = config(json!({"quant_method": "gptq", "bits": 8, "group_size": -1}));
        assert_eq!((per_channel.bits, per_channel.group_size), (8.0, None));
        assert_eq!(per_channel.tier_bits(), 8);

        let awq = config(json!({"quant_method": "awq", "bits": 4, "group_size": 128, "version": "gemm"}));
        assert_eq!((awq.method, awq.group_size), (QuantMethod::Awq, Some(128)));
        // AutoAWQ's own key names.
        let autoawq = config(json!({"quant_method": "AWQ", "w_bit": 4, "q_group_size": 64}));
        assert_eq!((autoawq.weight_bits, autoawq.group_size), (4, Some(64)));
    }

    #[test]
    fn malformed_configs_name_the_field() {
        let err = Quantization::from_config(Some(&json!({"quant_method": "gptq", "bits": "four"})), None).unwrap_err();
        assert_eq!(
            err.to_string(),
            "quantization_config field `bits` is missing or invalid (found \"four\")"
        );
        let err = Quantization::from_config(Some(&json!({"quant_method": "gptq", "bits": 4, "group_size": 0})), None)
            .unwrap_err();
        assert!(matches!(
            err,
            Error::QuantizationConfigField {
                field: "group_size",
                ..
            }
        ));
        assert!(matches!(
            Quantization::from_config(Some(&json!({"quant_method": "awq"})), None),
            Err(Error::QuantizationConfigField { field: "bits", .. })
        ));
        assert!(matches!(
            Quantization::from_config(Some(&json!([1])), None),
            Err(Error::QuantizationConfigField {
                field: "quantization_config",
                ..
            })
        ));
        let err = Quantization::from_config(Some(&json!({"quant_method": "hqq"})), None).unwrap_err();
        assert_eq!(
            err.to_string(),
            "unsupported quantization `hqq`; help: choose another variant"
        );
    }

    #[test]
    fn bitsandbytes_configs() {
        let nf4 = config(json!({
            "quant_method": "bitsandbytes", "load_in_4bit": true,
            "bnb_4bit_quant_type": "nf4", "bnb_4bit_use_double_quant": false
        }));
        assert_eq!(
            (nf4.method, nf4.bits, nf4.group_size),
            (QuantMethod::BitsAndBytes4, 4.5, Some(64))
        );
        assert_eq!(
            nf4.nominal(),
            NominalPrecision {
                bits: 4,
                kind: NumberKind::Int
            }
        );
        let double =
            config(json!({"quant_method": "bitsandbytes", "_load_in_4bit": true, "bnb_4bit_use_double_quant": true}));
        assert!((double.bits - 4.127).abs() < 0.001, "{}", double.bits);
        // Written before `quant_method` existed.
        let int8 = config(json!({"load_in_8bit": true}));
        assert_eq!(int8.method, QuantMethod::BitsAndBytes8);
        assert!(Quantization::from_config(Some(&json!({"quant_method": "bitsandbytes"})), None).is_err());
    }

    #[test]
    fn fp8_compressed_tensors_and_modelopt_configs() {
        let fp8 =
            config(json!({"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}));
        assert_eq!(
            fp8.nominal(),
            NominalPrecision {
                bits: 8,
                kind: NumberKind::Float
            }
        );

        let ct = |weights: Value| {
            config(json!({
                "quant_method": "compressed-tensors",
                "format": "whatever",
                "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights}}
            }))
        };
        let w8a8 = ct(json!({"num_bits": 8, "type": "float", "strategy": "channel"}));
        assert_eq!(w8a8.method, QuantMethod::Fp8);
        let int8 = ct(json!({"num_bits": 8, "type": "int", "strategy": "channel"}));
        assert_eq!(int8.method, QuantMethod::Int8);
        let w4a16 = ct(json!({"num_bits": 4, "type": "int", "strategy": "group", "group_size": 128}));
        assert_eq!(
            (w4a16.method, w4a16.weight_bits, w4a16.group_size),
            (QuantMethod::PackedInt, 4, Some(128))
        );
        assert_eq!(w4a16.bits, 4.125);
        let nvfp4 = ct(json!({"num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16}));
        assert_eq!(
            (nvfp4.method, nvfp4.bits, nvfp4.group_size),
            (QuantMethod::Fp4, 4.5, Some(16))
        );
        assert!(Quantization::from_config(Some(&json!({"quant_method": "compressed-tensors"})), None).is_err());

        let modelopt = config(json!({"quant_method": "modelopt", "quant_algo": "NVFP4"}));
        assert_eq!(modelopt.method, QuantMethod::Fp4);
        let mxfp4 = config(json!({"quant_method": "mxfp4"}));
        assert_eq!((mxfp4.bits, mxfp4.group_size), (4.25, Some(32)));
    }

    #[test]
    fn torch_dtype_alone_and_whole_configs() {
        let q = |dtype| Quantization::from_config(None, Some(dtype)).unwrap().unwrap();
        assert_eq!(q("bfloat16").method, QuantMethod::Bf16);
        assert_eq!(q("float16").method, QuantMethod::Fp16);
        assert_eq!(q("torch.float32").method, QuantMethod::Fp32);
        assert!(Quantization::from_config(None, Some("int4")).is_err());
        assert_eq!(Quantization::from_config(None, None).unwrap(), None);
        assert_eq!(Quantization::from_config(Some(&Value::Null), None).unwrap(), None);

        let whole = json!({"architectures": ["LlamaForCausalLM"], "dtype": "bfloat16"});
        assert_eq!(
            Quantization::from_config_json(&whole).unwrap().unwrap().method,
            QuantMethod::Bf16
        );
        let llava = json!({"text_config": {"torch_dtype": "float16"}});
        assert_eq!(
            Quantization::from_config_json(&llava).unwrap().unwrap().method,
            QuantMethod::Fp16
        );
        let quantized = json!({"torch_dtype": "float16", "quantization_config": {"quant_method": "awq", "bits": 4, "group_size": 128}});
        assert_eq!(
            Quantization::from_config_json(&quantized).unwrap().unwrap().method,
            QuantMethod::Awq
        );
    }

    #[test]
    fn nominal_precision_orders_like_the_workflow_tiers() {
        let tiers = [
            Quantization::from_gguf_file_type(GgufFileType::Q2_K),
            Quantization::from_gguf_file_type(GgufFileType::IQ3_XXS),
            config(json!({"quant_method": "awq", "bits": 4, "group_size": 128})),
            Quantization::from_gguf_file_type(GgufFileType::Q5_K_M),
            Quantization::from_gguf_file_type(GgufFileType::Q6_K),
            Quantization::from_gguf_file_type(GgufFileType::Q8_0),
            config(json!({"quant_method": "fp8"})),
            Quantization::from_config(None, Some("bfloat16")).unwrap().unwrap(),
            Quantization::from_gguf_file_type(GgufFileType::F32),
        ];
        let bits: Vec<u8> = tiers.iter().map(Quantization::tier_bits).collect();
        assert_eq!(bits, [2, 3, 4, 5, 6, 8, 8, 16, 32]);
        for pair in tiers.windows(2) {
            assert!(pair[0].nominal() < pair[1].nominal(), "{} < {}", pair[0], pair[1]);
        }
        assert_eq!(
            Quantization::from_config(None, Some("float16"))
                .unwrap()
                .unwrap()
                .nominal(),
            Quantization::from_config(None, Some("bfloat16"))
                .unwrap()
                .unwrap()
                .nominal()
        );
    }

    #[test]
    fn serde_names_methods_and_file_types() {
        let q = Quantization::from_gguf_file_type(GgufFileType::Q6_K);
        let json = serde_json::to_value(q).unwrap();
        assert_eq!(json["format"], "gguf");
        assert_eq!(json["method"], json!({"gguf": "Q6_K"}));
        let awq = serde_json::to_value(config(json!({"quant_method": "awq", "bits": 4}))).unwrap();
        assert_eq!(awq["method"], "awq");
        assert_eq!(awq["group_size"], Value::Null);
    }
}
