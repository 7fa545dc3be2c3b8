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

use std::fmt;

use serde::Serialize;
use serde_json::{Map, Value};

use crate::Error;

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

/// How a normalisation layer is parameterised.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum NormKind {
    /// RMSNorm: one gain vector of `hidden_size`.
    RmsNorm,
    /// LayerNorm: a gain and a bias vector, `2 × hidden_size`.
    LayerNorm,
}

/// The shape of the feed-forward block.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MlpKind {
    /// Gated (SwiGLU/GeGLU): gate, up and down projections, `3 × hidden × intermediate`.
    Gated,
    /// Plain: up and down projections, `2 × hidden × intermediate`.
    Plain,
}

/// How token positions enter the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PositionEncoding {
    /// Rotary embeddings: no parameters.
    Rotary,
    /// ALiBi attention biases: no parameters.
    Alibi,
    /// A learned table of `positions × hidden_size` (GPT-2's `wpe`).
    Learned {
        /// Rows of the table (`n_positions`).
        positions: u64,
    },
}

/// Which linear layers carry a bias vector.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct Biases {
    /// The query, key and value projections.
    pub qkv: bool,
    /// The attention output projection.
    pub attn_output: bool,
    /// The MLP projections.
    pub mlp: bool,
}

/// The sparse mixture-of-experts fields of a Mixtral-style config.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct MoeConfig {
    /// Experts per layer (`num_local_experts`).
    pub num_experts: u64,
    /// Experts each token is routed to (`num_experts_per_tok`).
    pub experts_per_token: u64,
}

/// The decoder-only language model: the whole model for text architectures, the
/// `text_config` of a LLaVA-NeXT model.
#[derive(Debug, Clone, PartialEq)]
pub struct TextConfig {
    /// The decoder family (never [`Architecture::LlavaNext`]).
    pub architecture: Architecture,
    /// Width of the residual stream (`hidden_size`, GPT-2's `n_embd`).
    pub hidden_size: u64,
    /// Decoder layers (`num_hidden_layers`, GPT-2's `n_layer`).
    pub num_layers: u64,
    /// Query heads (`num_attention_heads`, GPT-2's `n_head`).
    pub num_attention_heads: u64,
    /// Key/value heads: fewer than query heads for grouped-query attention, one for
    /// multi-query attention.
    pub num_kv_heads: u64,
    /// Width of one head. An explicit `head_dim` wins (Gemma's is 256 with a hidden
    /// size of 3072); otherwise `hidden_size / num_attention_heads`.
    pub head_dim: u64,
    /// Width of the MLP (of one expert for MoE models).
    pub intermediate_size: u64,
    /// Rows of the token embedding.
    pub vocab_size: u64,
    /// The context length the model was configured for.
    pub max_position_embeddings: u64,
    /// Whether the output projection shares the token embedding's matrix.
    pub tie_word_embeddings: bool,
    /// Normalisation layers' parameterisation.
    pub norm: NormKind,
    /// Normalisation layers per decoder layer (the final norm is extra).
    pub norms_per_layer: u64,
    /// Feed-forward block shape.
    pub mlp: MlpKind,
    /// Which projections carry biases.
    pub biases: Biases,
    /// Whether q, k and v are one fused matrix in the checkpoint (phi3, falcon, gpt2).
    pub fused_qkv: bool,
    /// Whether gate and up are one fused matrix in the checkpoint (phi3).
    pub fused_gate_up: bool,
    /// How positions are encoded.
    pub positions: PositionEncoding,
    /// Mixture-of-experts fields, for Mixtral.
    pub moe: Option<MoeConfig>,
    /// `rope_theta`, when the config states one.
    pub rope_theta: Option<f64>,
    /// `rope_scaling`, raw (its schema differs between scaling types).
    pub rope_scaling: Option<Value>,
    /// The attention window in effect: `sliding_window`, unless the config switches the
    /// window off (Qwen2's `use_sliding_window: false`).
    pub sliding_window: Option<u64>,
}

/// A CLIP vision tower (`vision_config` of a LLaVA-NeXT model).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct VisionConfig {
    /// Width of the vision transformer.
    pub hidden_size: u64,
    /// Width of its MLP.
    pub intermediate_size: u64,
    /// Encoder layers. All of them are in the checkpoint, even those after the
    /// `vision_feature_layer` the projector reads.
    pub num_layers: u64,
    /// Attention heads.
    pub num_attention_heads: u64,
    /// Input image channels.
    pub num_channels: u64,
    /// Side of the square input image, in pixels.
    pub image_size: u64,
    /// Side of one patch, in pixels; divides `image_size`.
    pub patch_size: u64,
}

/// The multimodal projector between the vision tower and the language model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct ProjectorConfig {
    /// Input width: the vision hidden size times the number of vision layers whose
    /// features are concatenated (`vision_feature_layer` may be a list).
    pub input_size: u64,
    /// Output width: the language model's hidden size.
    pub output_size: u64,
    /// Whether both linear layers carry biases (`multimodal_projector_bias`).
    pub bias: bool,
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

/// Per-model-type defaults of the `transformers` config classes, used where a key is
/// absent (and, for the core dimensions, only inside `text_config`).
struct TypeDefaults {
    hidden_size: u64,
    num_layers: u64,
    num_attention_heads: u64,
    intermediate_size: u64,
    vocab_size: u64,
    max_position_embeddings: u64,
    tie_word_embeddings: bool,
}

const fn type_defaults(architecture: Architecture) -> TypeDefaults {
    let (hidden_size, num_layers, num_attention_heads, intermediate_size, vocab_size, max_position_embeddings, tie) =
        match architecture {
            // LlavaNext never reaches here as a decoder; Llama is its default text model.
            Architecture::Llama | Architecture::LlavaNext => (4096, 32, 32, 11008, 32000, 2048, false),
            Architecture::Mistral | Architecture::Mixtral => (4096, 32, 32, 14336, 32000, 4096 * 32, false),
            Architecture::Qwen2 => (4096, 32, 32, 22016, 151936, 32768, false),
            Architecture::Gemma => (3072, 28, 16, 24576, 256000, 8192, true),
            Architecture::Phi3 => (3072, 32, 32, 8192, 32064, 4096, false),
            Architecture::Falcon => (4544, 32, 71, 4 * 4544, 65024, 2048, true),
            Architecture::Gpt2 => (768, 12, 12, 4 * 768, 50257, 1024, true),
        };
    TypeDefaults {
        hidden_size,
        num_layers,
        num_attention_heads,
        intermediate_size,
        vocab_size,
        max_position_embeddings,
        tie_word_embeddings: tie,
    }
}

/// Reads a decoder-only language model from `section`.
fn decoder(section: &Section<'_>, architecture: Architecture, defaults: Defaults) -> Result<TextConfig, Error> {
    use Architecture as A;

    let d = type_defaults(architecture);
    // GPT-2 and Falcon predate the common key names; their config classes alias them.
    let (hidden_keys, layer_keys, head_keys): (&[&str], &[&str], &[&str]) = match architecture {
        A::Gpt2 => (
            &["n_embd", "hidden_size"],
            &["n_layer", "num_hidden_layers"],
            &["n_head", "num_attention_heads"],
        ),
        A::Falcon => (
            &["hidden_size", "n_embed"],
            &["num_hidden_layers", "n_layer"],
            &["num_attention_heads", "n_head"],
        ),
        _ => (&["hidden_size"], &["num_hidden_layers"], &["num_attention_heads"]),
    };
    let hidden_size = section.dimension(hidden_keys, defaults, d.hidden_size, architecture)?;
    let num_layers = section.dimension(layer_keys, defaults, d.num_layers, architecture)?;
    let num_attention_heads = section.dimension(head_keys, defaults, d.num_attention_heads, architecture)?;
    let vocab_size = section.dimension(&["vocab_size"], defaults, d.vocab_size, architecture)?;
    let intermediate_size = match architecture {
        // GPT-2's `n_inner` and Falcon's `ffn_hidden_size` default to four times the width
        // even at the top level, as in their config classes.
        A::Gpt2 => section
            .positive_opt(&["n_inner"])?
            .map_or_else(|| hidden_size.checked_mul(4), Some),
        A::Falcon => section
            .positive_opt(&["ffn_hidden_size"])?
            .map_or_else(|| hidden_size.checked_mul(4), Some),
        _ => Some(section.dimension(&["intermediate_size"], defaults, d.intermediate_size, architecture)?),
    }
    .ok_or(Error::ConfigArithmeticOverflow { architecture })?;

    let max_position_embeddings = match architecture {
        A::Gpt2 => section.positive_opt(&["n_positions", "max_position_embeddings"])?,
        _ => section.positive_opt(&["max_position_embeddings"])?,
    }
    .unwrap_or(d.max_position_embeddings);

    let new_decoder_architecture = section.bool_opt("new_decoder_architecture")?.unwrap_or(false);
    let num_kv_heads = kv_heads(section, architecture, num_attention_heads, new_decoder_architecture)?;
    if num_kv_heads > num_attention_heads || !num_attention_heads.is_multiple_of(num_kv_heads) {
        return Err(Error::InvalidConfigValue {
            key: section.key(kv_heads_key(architecture)),
            found: num_kv_heads.to_string(),
            expected: "a divisor of the number of attention heads",
        });
    }
    let head_dim = head_dim(section, architecture, hidden_size, num_attention_heads)?;

    let tie_word_embeddings = section
        .bool_opt("tie_word_embeddings")?
        .unwrap_or(d.tie_word_embeddings);
    let (norm, norms_per_layer) = norms(section, architecture, new_decoder_architecture)?;
    let biases = biases(section, architecture)?;
    let mlp = match architecture {
        A::Falcon | A::Gpt2 => MlpKind::Plain,
        _ => MlpKind::Gated,
    };
    let positions = match architecture {
        A::Gpt2 => PositionEncoding::Learned {
            positions: max_position_embeddings,
        },
        A::Falcon if section.bool_opt("alibi")?.unwrap_or(false) => PositionEncoding::Alibi,
        _ => PositionEncoding::Rotary,
    };
    let moe = match architecture {
        A::Mixtral => Some(moe(section)?),
        _ => None,
    };
    let rope_theta = match positions {
        PositionEncoding::Rotary => section.f64_opt("rope_theta")?,
        PositionEncoding::Alibi | PositionEncoding::Learned { .. } => None,
    };
    Ok(TextConfig {
        architecture,
        hidden_size,
        num_layers,
        num_attention_heads,
        num_kv_heads,
        head_dim,
        intermediate_size,
        vocab_size,
        max_position_embeddings,
        tie_word_embeddings,
        norm,
        norms_per_layer,
        mlp,
        biases,
        fused_qkv: matches!(architecture, A::Phi3 | A::Falcon | A::Gpt2),
        fused_gate_up: architecture == A::Phi3,
        positions,
        moe,
        rope_theta,
        rope_scaling: section.get("rope_scaling").cloned(),
        sliding_window: sliding_window(section, architecture)?,
    })
}

const fn kv_heads_key(architecture: Architecture) -> &'static str {
    match architecture {
        Architecture::Falcon => "num_kv_heads",
        Architecture::Gpt2 => "n_head",
        _ => "num_key_value_heads",
    }
}

/// KV heads as each config class resolves them.
fn kv_heads(
    section: &Section<'_>,
    architecture: Architecture,
    num_attention_heads: u64,
    new_decoder_architecture: bool,
) -> Result<u64, Error> {
    use Architecture as A;
    match architecture {
        A::Gpt2 => Ok(num_attention_heads),
        A::Falcon => {
            // FalconAttention: the new decoder architecture (and the rare old one without
            // multi-query) uses `num_kv_heads`; the old multi-query layout has one KV head.
            // `multi_query` defaults to true in FalconConfig.
            let multi_query = section.bool_opt("multi_query")?.unwrap_or(true);
            if new_decoder_architecture || !multi_query {
                Ok(section
                    .positive_opt(&["num_kv_heads", "n_head_kv"])?
                    .unwrap_or(num_attention_heads))
            } else {
                Ok(1)
            }
        }
        _ => {
            let key = "num_key_value_heads";
            match section.raw(key) {
                Raw::Value(value) => section.positive(key, value),
                Raw::Null => Ok(num_attention_heads),
                // The config classes' keyword defaults when the key is missing altogether.
                Raw::Absent => Ok(match architecture {
                    A::Mistral | A::Mixtral => 8,
                    A::Qwen2 => 32,
                    A::Gemma => 16,
                    _ => num_attention_heads,
                }),
            }
        }
    }
}

fn head_dim(section: &Section<'_>, architecture: Architecture, hidden_size: u64, heads: u64) -> Result<u64, Error> {
    if let Some(head_dim) = section.positive_opt(&["head_dim"])? {
        return Ok(head_dim);
    }
    // GemmaConfig's own default is 256, not hidden / heads.
    if architecture == Architecture::Gemma && matches!(section.raw("head_dim"), Raw::Absent) {
        return Ok(256);
    }
    if !hidden_size.is_multiple_of(heads) {
        return Err(Error::InvalidConfigValue {
            key: section.key("hidden_size"),
            found: hidden_size.to_string(),
            expected: "a multiple of the number of attention heads (or an explicit `head_dim`)",
        });
    }
    Ok(hidden_size / heads)
}

fn norms(section: &Section<'_>, architecture: Architecture, new_decoder: bool) -> Result<(NormKind, u64), Error> {
    match architecture {
        Architecture::Gpt2 => Ok((NormKind::LayerNorm, 2)),
        Architecture::Falcon => {
            // FalconDecoderLayer: sequential blocks have a norm before attention and one
            // before the MLP; parallel blocks share one input norm, except the new decoder
            // architecture, which by default (`num_ln_in_parallel_attn` = 2) has one each.
            let parallel_attn = section.bool_opt("parallel_attn")?.unwrap_or(true);
            let lns = section
                .positive_opt(&["num_ln_in_parallel_attn"])?
                .unwrap_or(if new_decoder { 2 } else { 1 });
            let per_layer = if !parallel_attn || (new_decoder && lns == 2) {
                2
            } else {
                1
            };
            Ok((NormKind::LayerNorm, per_layer))
        }
        _ => Ok((NormKind::RmsNorm, 2)),
    }
}

fn biases(section: &Section<'_>, architecture: Architecture) -> Result<Biases, Error> {
    use Architecture as A;
    Ok(match architecture {
        A::Llama => {
            let attention = section.bool_opt("attention_bias")?.unwrap_or(false);
            let mlp = section.bool_opt("mlp_bias")?.unwrap_or(false);
            Biases {
                qkv: attention,
                attn_output: attention,
                mlp,
            }
        }
        A::Gemma => {
            let attention = section.bool_opt("attention_bias")?.unwrap_or(false);
            Biases {
                qkv: attention,
                attn_output: attention,
                mlp: false,
            }
        }
        // Qwen2Attention hard-codes biases on q, k and v and none on the output.
        A::Qwen2 => Biases {
            qkv: true,
            attn_output: false,
            mlp: false,
        },
        A::Falcon => {
            let bias = section.bool_opt("bias")?.unwrap_or(false);
            Biases {
                qkv: bias,
                attn_output: bias,
                mlp: bias,
            }
        }
        A::Gpt2 => Biases {
            qkv: true,
            attn_output: true,
            mlp: true,
        },
        A::Mistral | A::Mixtral | A::Phi3 | A::LlavaNext => Biases::default(),
    })
}

fn moe(section: &Section<'_>) -> Result<MoeConfig, Error> {
    // MixtralConfig defaults: 8 experts, 2 per token.
    let num_experts = section.positive_opt(&["num_local_experts"])?.unwrap_or(8);
    let experts_per_token = section.positive_opt(&["num_experts_per_tok"])?.unwrap_or(2);
    if experts_per_token > num_experts {
        return Err(Error::InvalidConfigValue {
            key: section.key("num_experts_per_tok"),
            found: experts_per_token.to_string(),
            expected: "at most `num_local_experts`",
        });
    }
    Ok(MoeConfig {
        num_experts,
        experts_per_token,
    })
}

fn sliding_window(section: &Section<'_>, architecture: Architecture) -> Result<Option<u64>, Error> {
    let key = "sliding_window";
    let window = match section.raw(key) {
        Raw::Value(value) => Some(section.positive(key, value)?),
        Raw::Null => None,
        // MistralConfig defaults to a 4096-token window; the others to none (Qwen2's
        // default window is switched off by `use_sliding_window`).
        Raw::Absent => (architecture == Architecture::Mistral).then_some(4096),
    };
    if architecture == Architecture::Qwen2 && !section.bool_opt("use_sliding_window")?.unwrap_or(false) {
        return Ok(None);
    }
    Ok(window)
}

/// Reads a LLaVA-NeXT config: the language model from `text_config`, the CLIP tower from
/// `vision_config`, the projector from the top-level keys.
fn llava_next(root: &Section<'_>) -> Result<(TextConfig, VisionConfig, ProjectorConfig), Error> {
    // LlavaNextConfig: a missing `text_config` is a default LlamaConfig, and a
    // `text_config` without `model_type` is a Llama config.
    let empty = Map::new();
    let text_map = root.object("text_config")?.unwrap_or(&empty);
    let text_section = Section {
        map: text_map,
        prefix: "text_config.",
    };
    let text_type = text_section
        .str_opt("model_type")?
        .unwrap_or_else(|| "llama".to_owned());
    let text_architecture = Architecture::from_model_type(&text_type)
        .filter(|a| *a != Architecture::LlavaNext)
        .ok_or_else(|| Error::UnsupportedArchitecture {
            key: "text_config.model_type".to_owned(),
            found: shown(&Value::String(text_type.clone())),
        })?;
    let mut text = decoder(&text_section, text_architecture, Defaults::ModelType)?;
    // Older llava-hf configs keep the (resized) vocabulary at the top level only.
    if text_section.get("vocab_size").is_none()
        && let Some(vocab) = root.positive_opt(&["vocab_size"])?
    {
        text.vocab_size = vocab;
    }

    let vision = match root.object("vision_config")? {
        Some(map) => clip_vision(&Section {
            map,
            prefix: "vision_config.",
        })?,
        None => LLAVA_NEXT_DEFAULT_VISION,
    };
    // `vision_feature_layer` may list several layers whose features are concatenated.
    let feature_layers = match root.get("vision_feature_layer") {
        Some(Value::Array(layers)) if !layers.is_empty() => layers.len() as u64,
        Some(Value::Array(layers)) => {
            return Err(invalid(
                "vision_feature_layer",
                &Value::Array(layers.clone()),
                "a layer index or a list",
            ));
        }
        Some(value) if value.as_i64().is_some() => 1,
        Some(value) => return Err(invalid("vision_feature_layer", value, "a layer index or a list")),
        None => 1,
    };
    let projector = ProjectorConfig {
        input_size: vision
            .hidden_size
            .checked_mul(feature_layers)
            .ok_or(Error::ConfigArithmeticOverflow {
                architecture: Architecture::LlavaNext,
            })?,
        output_size: text.hidden_size,
        bias: root.bool_opt("multimodal_projector_bias")?.unwrap_or(true),
    };
    Ok((text, vision, projector))
}

/// The CLIP ViT-L/14 at 336 pixels that LlavaNextConfig builds when `vision_config` is
/// absent.
const LLAVA_NEXT_DEFAULT_VISION: VisionConfig = VisionConfig {
    hidden_size: 1024,
    intermediate_size: 4096,
    num_layers: 24,
    num_attention_heads: 16,
    num_channels: 3,
    image_size: 336,
    patch_size: 14,
};

fn clip_vision(section: &Section<'_>) -> Result<VisionConfig, Error> {
    let model_type = section
        .str_opt("model_type")?
        .unwrap_or_else(|| "clip_vision_model".to_owned());
    if model_type != "clip_vision_model" {
        return Err(Error::UnsupportedArchitecture {
            key: section.key("model_type"),
            found: shown(&Value::String(model_type)),
        });
    }
    // CLIPVisionConfig's defaults (ViT-B/32 at 224 pixels) fill whatever the dict omits.
    let get = |key: &'static str, default: u64| -> Result<u64, Error> {
        Ok(section.positive_opt(&[key])?.unwrap_or(default))
    };
    let vision = VisionConfig {
        hidden_size: get("hidden_size", 768)?,
        intermediate_size: get("intermediate_size", 3072)?,
        num_layers: get("num_hidden_layers", 12)?,
        num_attention_heads: get("num_attention_heads", 12)?,
        num_channels: get("num_channels", 3)?,
        image_size: get("image_size", 224)?,
        patch_size: get("patch_size", 32)?,
    };
    if !vision.image_size.is_multiple_of(vision.patch_size) {
        return Err(Error::InvalidConfigValue {
            key: section.key("image_size"),
            found: vision.image_size.to_string(),
            expected: "a multiple of `patch_size`",
        });
    }
    if !vision.hidden_size.is_multiple_of(vision.num_attention_heads) {
        return Err(Error::InvalidConfigValue {
            key: section.key("hidden_size"),
            found: vision.hidden_size.to_string(),
            expected: "a multiple of the number of attention heads",
        });
    }
    Ok(vision)
}
