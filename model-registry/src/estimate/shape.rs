//! The dimensions of a model that memory estimation needs, read once from a
//! [`ModelConfig`].

use serde::Serialize;

use crate::config::{Architecture, MlpKind, ModelConfig, MoeConfig};
use crate::params::{ParamBreakdown, kv_cached_tokens, parameter_count};
use crate::{Bytes, Error};

/// The CLIP vision tower of a multimodal model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct VisionShape {
    /// Width of the vision transformer.
    pub hidden: u64,
    /// Width of its MLP.
    pub intermediate: u64,
    /// Encoder layers.
    pub layers: u64,
    /// Attention heads; tensor parallelism shards them, so a degree must divide them.
    pub heads: u64,
    /// Tokens of one image crop: patches plus the class token.
    pub tokens_per_crop: u64,
}

/// Everything about a model's shape that memory depends on.
///
/// Built from a [`ModelConfig`] by [`ModelShape::from_config`]; it keeps the exact
/// [`ParamBreakdown`] so that computed weight sizes add up to the published counts.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModelShape {
    /// The top-level architecture (`llava_next` for LLaVA-NeXT).
    pub architecture: Architecture,
    /// The language model's architecture.
    pub text_architecture: Architecture,
    /// Decoder layers.
    pub layers: u64,
    /// Width of the residual stream.
    pub hidden: u64,
    /// Query heads.
    pub heads: u64,
    /// Key/value heads (fewer than `heads` for GQA, one for MQA).
    pub kv_heads: u64,
    /// Width of one head.
    pub head_dim: u64,
    /// Width of the MLP (of one expert for MoE models).
    pub intermediate: u64,
    /// Rows of the token embedding.
    pub vocab: u64,
    /// Gated (three matrices) or plain (two) MLP.
    pub mlp: MlpKind,
    /// Whether q, k and v are one fused matrix (falcon, gpt2, phi3).
    pub fused_qkv: bool,
    /// The experts, for mixture-of-experts models.
    pub moe: Option<MoeConfig>,
    /// Whether the output projection shares the token embedding.
    pub tied_embeddings: bool,
    /// The attention window that bounds the KV cache (see
    /// [`kv_cached_tokens`](crate::params::kv_cached_tokens)); `None` when the whole
    /// context is cached.
    pub sliding_window: Option<u64>,
    /// The context the model was configured for (`max_position_embeddings`).
    pub max_context: u64,
    /// The vision tower, for multimodal models.
    pub vision: Option<VisionShape>,
    /// Exact parameter counts, by part.
    pub params: ParamBreakdown,
}

impl ModelShape {
    /// Reads the shape of the model `config` describes.
    ///
    /// Errors: [`Error::ConfigArithmeticOverflow`] if the parameter count overflows.
    pub fn from_config(config: &ModelConfig) -> Result<ModelShape, Error> {
        let t = &config.text;
        let params = parameter_count(config)?;
        let bounded = kv_cached_tokens(config, u64::MAX);
        let vision = config.vision.map(|v| {
            let side = v.image_size / v.patch_size;
            VisionShape {
                hidden: v.hidden_size,
                intermediate: v.intermediate_size,
                layers: v.num_layers,
                heads: v.num_attention_heads,
                tokens_per_crop: side.saturating_mul(side).saturating_add(1),
            }
        });
        Ok(ModelShape {
            architecture: config.architecture,
            text_architecture: t.architecture,
            layers: t.num_layers,
            hidden: t.hidden_size,
            heads: t.num_attention_heads,
            kv_heads: t.num_kv_heads,
            head_dim: t.head_dim,
            intermediate: t.intermediate_size,
            vocab: t.vocab_size,
            mlp: t.mlp,
            fused_qkv: t.fused_qkv,
            moe: t.moe,
            tied_embeddings: t.tie_word_embeddings,
            sliding_window: (bounded < u64::MAX).then_some(bounded),
            max_context: t.max_position_embeddings,
            vision,
            params,
        })
    }

    /// Output width of the query projection (`heads × head_dim`).
    pub fn q_width(&self) -> u64 {
        self.heads.saturating_mul(self.head_dim)
    }

    /// Output width of the key (or value) projection (`kv_heads × head_dim`).
    pub fn kv_width(&self) -> u64 {
        self.kv_heads.saturating_mul(self.head_dim)
    }

    /// Experts each token runs through: 1 for dense models.
    pub fn experts_per_token(&self) -> u64 {
        self.moe.map_or(1, |m| m.experts_per_token)
    }

    /// KV-cache bytes of one token over all layers with `kv_dtype` (a concrete type,
    /// not [`KvDtype::Auto`](super::KvDtype::Auto)).
    ///
    /// Errors: those of [`KvDtype::row_bytes`](super::KvDtype::row_bytes), and
    /// [`Error::EstimateOverflow`].
    pub fn kv_bytes_per_token(&self, kv_dtype: super::KvDtype) -> Result<Bytes, Error> {
        self.kv_row(self.kv_heads, kv_dtype)?
            .checked_mul(self.layers)
            .ok_or(Error::EstimateOverflow { what: "KV per token" })
    }

    /// KV-cache bytes of one token in one layer for one KV head in `kv_dtype`: the K
    /// and the V vector.
    pub(crate) fn kv_row(&self, kv_heads: u64, kv_dtype: super::KvDtype) -> Result<Bytes, Error> {
        let row = kv_heads
            .checked_mul(self.head_dim)
            .ok_or(Error::EstimateOverflow { what: "KV row width" })?;
        let one = kv_dtype.row_bytes(row)?;
        one.checked_mul(2).ok_or(Error::EstimateOverflow { what: "KV row" })
    }
}
