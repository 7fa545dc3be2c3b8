//! Classification from `config.json`: the `quantization_config` of each method Skein
//! knows (GPTQ, AWQ, bitsandbytes, FP8, compressed-tensors, ModelOpt, MXFP4) and, for
//! unquantized checkpoints, `torch_dtype`.

use serde_json::{Map, Value};

use super::{QuantMethod, Quantization};
use crate::Error;

/// bitsandbytes quantizes 4-bit weights in blocks of 64 with an f32 absmax per block;
/// `quantization_config` does not record the block size, so this is the library's
/// default.
const BNB_4BIT_BLOCK: u32 = 64;
/// With double quantization the absmax values are themselves quantized to 8 bits, with
/// one f32 scale per 256 of them.
const BNB_NESTED_BLOCK: f32 = 256.0;

pub(super) fn from_torch_dtype(dtype: &str) -> Result<Quantization, Error> {
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

pub(super) fn from_quantization_config(qc: &Value) -> Result<Quantization, Error> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    use crate::quant::{NominalPrecision, NumberKind, WeightFormat};

    fn config(qc: Value) -> Quantization {
        Quantization::from_config(Some(&qc), Some("float16")).unwrap().unwrap()
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
}
