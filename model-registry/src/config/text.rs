//! The language model of a config, [`TextConfig`], and the types that describe its
//! layers, read the way each architecture's `transformers` config class reads them,
//! with that class's defaults for absent keys.

use serde::Serialize;
use serde_json::Value;

use super::{Architecture, Defaults, Raw, Section};
use crate::Error;

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
pub(super) fn decoder(
    section: &Section<'_>,
    architecture: Architecture,
    defaults: Defaults,
) -> Result<TextConfig, Error> {
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
