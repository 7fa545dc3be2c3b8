//! A typed, validated view of a Hugging Face `config.json`.
//!
//! [`ModelConfig::from_json`] reads the keys that size a model (hidden size, layers,
//! heads, KV heads, head dimension, MLP width, vocabulary, biases, norms, experts) for the
//! architectures in [`Architecture`], and keeps `quantization_config` as raw JSON for the
//! variant classifier.
//!
//! Missing keys are resolved the way `transformers` resolves them, because that is what
//! the published checkpoint was built from:
//!
//! - The core dimensions (`hidden_size`, `num_hidden_layers`, `num_attention_heads`,
//!   `intermediate_size`, `vocab_size`) are required at the top level: a config without
//!   them is not a real checkpoint's config, and guessing would give a confident wrong
//!   number. Inside `text_config` and `vision_config` of a LLaVA-NeXT model they fall
//!   back to the defaults of the sub-model's `model_type`, because the published
//!   `llava-hf` configs really do store only the keys that differ from those defaults.
//! - The other keys (`num_key_value_heads`, `head_dim`, `tie_word_embeddings`, biases,
//!   `sliding_window`, expert counts) take the default of their model type's
//!   `transformers` config class wherever they are absent. An explicit `null` means
//!   "unset" exactly as in Python (for `num_key_value_heads`: as many as query heads).
//!
//! Every error names the key that failed, with its section (`text_config.hidden_size`).
//!
//! [`ModelConfig::from_gguf`] builds the same config from a GGUF header alone, for
//! GGUF-only repositories, by mapping llama.cpp's metadata keys back to these.

mod gguf;
mod llava;
mod text;

use std::fmt;

use serde::Serialize;
use serde_json::{Map, Value};

use crate::Error;

pub use gguf::GgufConfigProblem;
pub use llava::{ProjectorConfig, VisionConfig};
pub use text::{Biases, MlpKind, MoeConfig, NormKind, PositionEncoding, TextConfig};

use llava::llava_next;
use text::decoder;

/// The model families Skein can size from `config.json` alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Architecture {
    /// `llama`: Llama 1/2/3, TinyLlama, DeepSeek-Coder and other Llama-shaped models.
    Llama,
    /// `mistral`: Llama-shaped with grouped KV heads and an optional sliding window.
    Mistral,
    /// `mixtral`: Mistral attention with a sparse mixture of expert MLPs.
    Mixtral,
    /// `qwen2`: Llama-shaped with biases on the q/k/v projections.
    Qwen2,
    /// `gemma`: GeGLU MLP, explicit `head_dim`, tied embeddings.
    Gemma,
    /// `phi3`: fused `qkv_proj` and `gate_up_proj`.
    Phi3,
    /// `falcon`: fused QKV, multi-query or grouped KV, parallel attention, LayerNorm.
    Falcon,
    /// `gpt2`: learned position embeddings, LayerNorm, biases everywhere.
    Gpt2,
    /// `llava_next`: a CLIP vision tower, a two-layer projector and a language model.
    LlavaNext,
}

impl Architecture {
    /// Every supported architecture, in the order error messages list them.
    pub const ALL: [Architecture; 9] = [
        Architecture::Llama,
        Architecture::Mistral,
        Architecture::Mixtral,
        Architecture::Qwen2,
        Architecture::Gemma,
        Architecture::Phi3,
        Architecture::Falcon,
        Architecture::Gpt2,
        Architecture::LlavaNext,
    ];

    /// The `model_type` string of `config.json` for this architecture.
    pub const fn model_type(self) -> &'static str {
        match self {
            Architecture::Llama => "llama",
            Architecture::Mistral => "mistral",
            Architecture::Mixtral => "mixtral",
            Architecture::Qwen2 => "qwen2",
            Architecture::Gemma => "gemma",
            Architecture::Phi3 => "phi3",
            Architecture::Falcon => "falcon",
            Architecture::Gpt2 => "gpt2",
            Architecture::LlavaNext => "llava_next",
        }
    }

    /// The `transformers` model class that the `architectures` list of a config names.
    pub const fn class_name(self) -> &'static str {
        match self {
            Architecture::Llama => "LlamaForCausalLM",
            Architecture::Mistral => "MistralForCausalLM",
            Architecture::Mixtral => "MixtralForCausalLM",
            Architecture::Qwen2 => "Qwen2ForCausalLM",
            Architecture::Gemma => "GemmaForCausalLM",
            Architecture::Phi3 => "Phi3ForCausalLM",
            Architecture::Falcon => "FalconForCausalLM",
            Architecture::Gpt2 => "GPT2LMHeadModel",
            Architecture::LlavaNext => "LlavaNextForConditionalGeneration",
        }
    }

    /// The architecture whose `model_type` is `model_type`, if supported.
    pub fn from_model_type(model_type: &str) -> Option<Architecture> {
        Architecture::ALL.into_iter().find(|a| a.model_type() == model_type)
    }

    fn from_class_name(class: &str) -> Option<Architecture> {
        Architecture::ALL.into_iter().find(|a| a.class_name() == class)
    }

    /// The supported `model_type` strings, comma-separated, for messages.
    pub fn supported_list() -> String {
        Architecture::ALL.map(Architecture::model_type).join(", ")
    }
}

impl fmt::Display for Architecture {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.model_type())
    }
}

/// The sizing-relevant content of one `config.json`.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    /// The top-level architecture.
    pub architecture: Architecture,
    /// The language model.
    pub text: TextConfig,
    /// The vision tower, for multimodal architectures.
    pub vision: Option<VisionConfig>,
    /// The projector, for multimodal architectures.
    pub projector: Option<ProjectorConfig>,
    /// `torch_dtype` (or `dtype` in newer configs): the dtype the weights were saved in.
    pub torch_dtype: Option<String>,
    /// The `transformers` version that wrote the config. Older versions saved some
    /// buffers into checkpoints; see [`crate::params::CheckpointExtras`].
    pub transformers_version: Option<String>,
    /// `quantization_config`, raw, for the variant classifier.
    pub quantization_config: Option<Value>,
}

impl ModelConfig {
    /// Parses and validates the text of a `config.json`.
    ///
    /// ```
    /// use skein_model_registry::config::{Architecture, ModelConfig};
    ///
    /// let cfg = ModelConfig::from_json(r#"{
    ///     "model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32,
    ///     "num_attention_heads": 32, "num_key_value_heads": 8,
    ///     "intermediate_size": 14336, "vocab_size": 128256
    /// }"#).unwrap();
    /// assert_eq!(cfg.architecture, Architecture::Llama);
    /// assert_eq!(cfg.text.head_dim, 128);
    /// ```
    pub fn from_json(text: &str) -> Result<ModelConfig, Error> {
        let value: Value = serde_json::from_str(text).map_err(|source| Error::ConfigNotJson { source })?;
        let Value::Object(map) = &value else {
            return Err(invalid("(root)", &value, "a JSON object"));
        };
        // The Falcon checkpoints TII first published (`RefinedWebModel`, `RefinedWeb`) read
        // as falcon once their old keys are mapped the way transformers' conversion does.
        let legacy_falcon;
        let map = match refined_web(map) {
            Some(converted) => {
                legacy_falcon = converted;
                &legacy_falcon
            }
            None => map,
        };
        let root = Section { map, prefix: "" };
        let architecture = root_architecture(&root)?;
        let torch_dtype = match root.str_opt("torch_dtype")? {
            Some(dtype) => Some(dtype),
            None => root.str_opt("dtype")?,
        };
        let transformers_version = root.str_opt("transformers_version")?;
        let quantization_config = root.get("quantization_config").cloned();

        let (text, vision, projector) = if architecture == Architecture::LlavaNext {
            let (text, vision, projector) = llava_next(&root)?;
            (text, Some(vision), Some(projector))
        } else {
            (decoder(&root, architecture, Defaults::Required)?, None, None)
        };
        Ok(ModelConfig {
            architecture,
            text,
            vision,
            projector,
            torch_dtype,
            transformers_version,
            quantization_config,
        })
    }
}

/// Whether absent core dimensions are an error or take the model type's defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Defaults {
    /// Top level: the core dimensions must be present.
    Required,
    /// Inside `text_config`: `transformers` fills them from the model type's config class.
    ModelType,
}

/// One JSON object of the config, with the prefix that names its keys in errors.
struct Section<'a> {
    map: &'a Map<String, Value>,
    prefix: &'static str,
}

/// A key's state: absent and `null` differ for a few keys (Mistral's KV heads).
enum Raw<'a> {
    Absent,
    Null,
    Value(&'a Value),
}

impl<'a> Section<'a> {
    fn key(&self, key: &str) -> String {
        format!("{}{key}", self.prefix)
    }

    fn raw(&self, key: &str) -> Raw<'a> {
        match self.map.get(key) {
            None => Raw::Absent,
            Some(Value::Null) => Raw::Null,
            Some(value) => Raw::Value(value),
        }
    }

    /// The value of `key`, treating `null` as absent.
    fn get(&self, key: &str) -> Option<&'a Value> {
        match self.raw(key) {
            Raw::Value(value) => Some(value),
            Raw::Absent | Raw::Null => None,
        }
    }

    /// The first of `keys` that is present (aliases such as GPT-2's `n_embd`), with its name.
    fn first(&self, keys: &[&'static str]) -> Option<(&'static str, &'a Value)> {
        keys.iter().find_map(|&key| self.get(key).map(|value| (key, value)))
    }

    fn positive(&self, key: &str, value: &Value) -> Result<u64, Error> {
        match value.as_u64() {
            Some(n) if n > 0 => Ok(n),
            _ => Err(invalid(&self.key(key), value, "a positive integer")),
        }
    }

    /// A positive integer under any of `keys`, or `None` if all are absent or null.
    fn positive_opt(&self, keys: &[&'static str]) -> Result<Option<u64>, Error> {
        self.first(keys)
            .map(|(key, value)| self.positive(key, value))
            .transpose()
    }

    /// A core dimension: required at the top level, defaulted inside `text_config`.
    fn dimension(
        &self,
        keys: &[&'static str],
        defaults: Defaults,
        default: u64,
        architecture: Architecture,
    ) -> Result<u64, Error> {
        match (self.positive_opt(keys)?, defaults) {
            (Some(n), _) => Ok(n),
            (None, Defaults::ModelType) => Ok(default),
            (None, Defaults::Required) => Err(Error::MissingConfigKey {
                key: self.key(keys.first().copied().unwrap_or_default()),
                architecture,
            }),
        }
    }

    fn bool_opt(&self, key: &str) -> Result<Option<bool>, Error> {
        self.get(key)
            .map(|value| {
                value
                    .as_bool()
                    .ok_or_else(|| invalid(&self.key(key), value, "true or false"))
            })
            .transpose()
    }

    fn f64_opt(&self, key: &str) -> Result<Option<f64>, Error> {
        self.get(key)
            .map(|value| value.as_f64().ok_or_else(|| invalid(&self.key(key), value, "a number")))
            .transpose()
    }

    fn str_opt(&self, key: &str) -> Result<Option<String>, Error> {
        self.get(key)
            .map(|value| {
                value
                    .as_str()
                    .map(str::to_owned)
                    .ok_or_else(|| invalid(&self.key(key), value, "a string"))
            })
            .transpose()
    }

    fn object(&self, key: &str) -> Result<Option<&'a Map<String, Value>>, Error> {
        self.get(key)
            .map(|value| {
                value
                    .as_object()
                    .ok_or_else(|| invalid(&self.key(key), value, "a JSON object"))
            })
            .transpose()
    }
}

/// Longest rendering of an offending value in an error message.
const MAX_SHOWN_VALUE_CHARS: usize = 60;

fn invalid(key: &str, value: &Value, expected: &'static str) -> Error {
    Error::InvalidConfigValue {
        key: key.to_owned(),
        found: shown(value),
        expected,
    }
}

fn shown(value: &Value) -> String {
    let text = value.to_string();
    if text.chars().count() <= MAX_SHOWN_VALUE_CHARS {
        text
    } else {
        let head: String = text.chars().take(MAX_SHOWN_VALUE_CHARS).collect();
        format!("{head}…")
    }
}

/// The `model_type` strings of the Falcon checkpoints that shipped with TII's own modeling
/// code (`RWForCausalLM`): `RefinedWebModel` (Falcon-7B, Falcon-RW) and `RefinedWeb`
/// (Falcon-40B).
const REFINED_WEB_MODEL_TYPES: [&str; 2] = ["RefinedWebModel", "RefinedWeb"];

/// A RefinedWeb config rewritten as the falcon config it stands for, as transformers'
/// `convert_custom_code_checkpoint.py` rewrites it: `n_head` and `n_layer` are the head and
/// layer counts and `n_head_kv` the KV heads (all of which [`text::decoder`] reads as
/// aliases, so errors name the keys the file has), and the presence of `n_head_kv` is what
/// marked the new decoder architecture (grouped KV heads, two input
/// norms per block: Falcon-40B); without it the old multi-query layout applies (Falcon-7B).
/// `None` for every other config.
fn refined_web(map: &Map<String, Value>) -> Option<Map<String, Value>> {
    let model_type = map.get("model_type")?.as_str()?;
    if !REFINED_WEB_MODEL_TYPES.contains(&model_type) {
        return None;
    }
    let mut converted = map.clone();
    converted.insert("model_type".to_owned(), Value::from(Architecture::Falcon.model_type()));
    let new_decoder = converted.contains_key("n_head_kv");
    converted.insert("new_decoder_architecture".to_owned(), Value::Bool(new_decoder));
    Some(converted)
}

/// The architecture from `model_type`, or from the `architectures` class list when the
/// config has no `model_type`. An unknown `model_type` is refused even if a class name
/// looks familiar: `transformers` dispatches on `model_type`, so the class name alone
/// does not say which layout the weights have.
fn root_architecture(root: &Section<'_>) -> Result<Architecture, Error> {
    if let Some(value) = root.get("model_type") {
        let model_type = value.as_str().ok_or_else(|| invalid("model_type", value, "a string"))?;
        return Architecture::from_model_type(model_type).ok_or_else(|| Error::UnsupportedArchitecture {
            key: "model_type".to_owned(),
            found: shown(value),
        });
    }
    let classes = root.get("architectures");
    let found = classes.and_then(Value::as_array).and_then(|list| {
        list.iter()
            .filter_map(Value::as_str)
            .find_map(Architecture::from_class_name)
    });
    found.ok_or_else(|| Error::UnsupportedArchitecture {
        key: "architectures".to_owned(),
        found: classes.map_or_else(|| "absent (and so is `model_type`)".to_owned(), shown),
    })
}

#[cfg(test)]
mod tests {
    use super::{Architecture, ModelConfig};
    use crate::params::parameter_count;

    /// tiiuae/falcon-7b's config.json as TII first published it, for its own
    /// `RWForCausalLM` code.
    const REFINED_WEB_MODEL_7B: &str = r#"{
        "alibi": false, "apply_residual_connection_post_layernorm": false,
        "architectures": ["RWForCausalLM"], "attention_dropout": 0.0,
        "auto_map": {"AutoConfig": "configuration_RW.RWConfig",
                     "AutoModelForCausalLM": "modelling_RW.RWForCausalLM"},
        "bias": false, "bos_token_id": 11, "eos_token_id": 11, "hidden_dropout": 0.0,
        "hidden_size": 4544, "initializer_range": 0.02, "layer_norm_epsilon": 1e-05,
        "model_type": "RefinedWebModel", "multi_query": true, "n_head": 71, "n_layer": 32,
        "parallel_attn": true, "torch_dtype": "bfloat16", "transformers_version": "4.27.4",
        "use_cache": true, "vocab_size": 65024
    }"#;

    /// The same model's config after TII moved it to transformers' Falcon classes.
    const FALCON_7B: &str = r#"{
        "alibi": false, "architectures": ["FalconForCausalLM"], "bias": false,
        "hidden_size": 4544, "model_type": "falcon", "multi_query": true,
        "new_decoder_architecture": false, "num_attention_heads": 71,
        "num_hidden_layers": 32, "parallel_attn": true, "torch_dtype": "bfloat16",
        "transformers_version": "4.27.4", "vocab_size": 65024
    }"#;

    /// tiiuae/falcon-40b's first config.json: `n_head_kv` marks the new decoder.
    const REFINED_WEB_40B: &str = r#"{
        "alibi": false, "architectures": ["RWForCausalLM"], "bias": false,
        "hidden_size": 8192, "model_type": "RefinedWeb", "n_head": 128, "n_head_kv": 8,
        "n_layer": 60, "parallel_attn": true, "torch_dtype": "bfloat16",
        "transformers_version": "4.27.4", "vocab_size": 65024
    }"#;

    const FALCON_40B: &str = r#"{
        "alibi": false, "architectures": ["FalconForCausalLM"], "bias": false,
        "hidden_size": 8192, "model_type": "falcon", "new_decoder_architecture": true,
        "num_attention_heads": 128, "num_hidden_layers": 60, "num_kv_heads": 8,
        "parallel_attn": true, "torch_dtype": "bfloat16",
        "transformers_version": "4.27.4", "vocab_size": 65024
    }"#;

    /// tiiuae/falcon-rw-1b: ALiBi, biases, sequential blocks, full multi-head attention.
    const REFINED_WEB_MODEL_RW_1B: &str = r#"{
        "alibi": true, "apply_residual_connection_post_layernorm": false,
        "architectures": ["RWForCausalLM"], "bias": true, "hidden_size": 2048,
        "model_type": "RefinedWebModel", "multi_query": false, "n_head": 32, "n_layer": 24,
        "parallel_attn": false, "torch_dtype": "bfloat16", "transformers_version": "4.27.4",
        "vocab_size": 50304
    }"#;

    fn parse(text: &str) -> ModelConfig {
        ModelConfig::from_json(text).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn refined_web_configs_read_as_the_falcon_configs_they_became() {
        let old_7b = parse(REFINED_WEB_MODEL_7B);
        assert_eq!(old_7b.architecture, Architecture::Falcon);
        assert_eq!(old_7b.text, parse(FALCON_7B).text);
        assert_eq!(old_7b.text.num_kv_heads, 1, "falcon-7b is multi-query");
        assert_eq!(old_7b.text.norms_per_layer, 1);
        let count = parameter_count(&old_7b).unwrap_or_else(|e| panic!("{e}"));
        // The hub's published total for tiiuae/falcon-7b.
        assert_eq!(count.total(), 6_921_720_704);
        // transformers before 4.33 saved a copy of the tied output matrix.
        assert_eq!(count.stored_total(), 7_217_189_760);

        let old_40b = parse(REFINED_WEB_40B);
        assert_eq!(old_40b.architecture, Architecture::Falcon);
        assert_eq!(old_40b.text, parse(FALCON_40B).text);
        assert_eq!(old_40b.text.num_kv_heads, 8);
        assert_eq!(old_40b.text.norms_per_layer, 2, "the new decoder has two input norms");
        let count = parameter_count(&old_40b).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(count.total(), 41_303_293_952);

        let rw_1b = parse(REFINED_WEB_MODEL_RW_1B);
        assert_eq!(rw_1b.text.num_kv_heads, 32);
        assert_eq!(rw_1b.text.norms_per_layer, 2);
        let count = parameter_count(&rw_1b).unwrap_or_else(|e| panic!("{e}"));
        // The hub's published total for tiiuae/falcon-rw-1b (keras-hub's preset agrees).
        assert_eq!(count.total(), 1_311_625_216);
    }

    #[test]
    fn refined_web_errors_name_the_keys_the_file_has() {
        let text = REFINED_WEB_MODEL_7B.replace(r#""n_head": 71"#, r#""n_head": "many""#);
        let error = ModelConfig::from_json(&text).err().map(|e| e.to_string());
        let error = error.unwrap_or_default();
        assert!(error.contains("n_head"), "{error}");
    }
}
