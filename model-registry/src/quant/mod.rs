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

mod config;
mod ftype;
mod tensors;

use std::collections::BTreeMap;
use std::fmt;

use serde::Serialize;
use serde_json::Value;

use crate::Error;
use crate::gguf::GgufHeader;
use crate::safetensors::SafetensorsTensor;

pub use ftype::GgufFileType;

use config::{from_quantization_config, from_torch_dtype};
use tensors::{bitsandbytes_from_tensors, dense_from_tensors, mxfp4_from_tensors, packed_from_tensors};

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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn config(qc: Value) -> Quantization {
        Quantization::from_config(Some(&qc), Some("float16")).unwrap().unwrap()
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
