//! Exact parameter counts from `config.json`, the fallback when no weight header is
//! readable, and the KV-cache size per token.
//!
//! [`parameter_count`] sums the shapes each architecture's `transformers` modeling code
//! creates, part by part, into a [`ParamBreakdown`] whose parts add up exactly to its
//! [`total`](ParamBreakdown::total). Per-layer counts ([`ParamBreakdown::pipeline_units`])
//! feed pipeline splits.
//!
//! A published checkpoint can hold tensors that are not parameters: rotary `inv_freq`
//! tables and GPT-2's causal masks saved by old `transformers` versions, or a copy of a
//! tied output matrix. The Hub's safetensors count includes them, so a breakdown records
//! them apart, in [`CheckpointExtras`], and [`ParamBreakdown::stored_total`] is what the
//! checkpoint's headers will add up to. They never count as parameters: engines rebuild
//! the buffers and share the tied matrix, so they occupy no GPU memory.

use serde::Serialize;

use crate::config::{Architecture, MlpKind, ModelConfig, NormKind, PositionEncoding, TextConfig, VisionConfig};
use crate::{Bytes, Error};

/// Parameters of one decoder layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct LayerParams {
    /// Query, key, value and output projections, with their biases.
    pub attention: u64,
    /// The feed-forward block; for MoE models, all experts.
    pub mlp: u64,
    /// The MoE router (gate) that scores experts; zero for dense models.
    pub router: u64,
    /// The layer's normalisation layers.
    pub norms: u64,
}

impl LayerParams {
    /// All parameters of the layer. Breakdowns from [`parameter_count`] are checked not
    /// to overflow, so this sum is exact for them.
    pub fn total(&self) -> u64 {
        self.attention
            .saturating_add(self.mlp)
            .saturating_add(self.router)
            .saturating_add(self.norms)
    }
}

/// Parameters of a CLIP vision tower.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct VisionTowerParams {
    /// Class embedding, patch convolution (no bias) and learned position embeddings.
    pub embeddings: u64,
    /// All encoder layers.
    pub layers: u64,
    /// One encoder layer: q/k/v/o with biases, two LayerNorms, a biased two-layer MLP.
    pub layer: u64,
    /// The LayerNorms before and after the encoder.
    pub norms: u64,
}

impl VisionTowerParams {
    /// All parameters of the tower.
    pub fn total(&self) -> u64 {
        self.embeddings.saturating_add(self.layers).saturating_add(self.norms)
    }
}

/// The expert structure of a mixture-of-experts model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct MoeParams {
    /// Experts per layer.
    pub experts: u64,
    /// Experts each token runs through.
    pub experts_per_token: u64,
    /// Parameters of one expert of one layer.
    pub expert: u64,
}

/// Tensors a published checkpoint stores besides the parameters.
///
/// Which checkpoints store them is a fact about the software that wrote them, not about
/// the architecture, so the rules key on the `transformers_version` recorded in
/// `config.json` (the version that wrote the weights alongside it). A weight header, when
/// readable, is the authority; these rules only make the config-only fallback agree with
/// the Hub's counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct CheckpointExtras {
    /// A stored copy of a tied output matrix (`lm_head.weight`). The Falcon checkpoints
    /// TII published with its own modeling code, before Falcon joined `transformers` in
    /// 4.33, store it although it equals the token embedding.
    pub tied_lm_head_copy: u64,
    /// Rotary `inv_freq` buffers, `head_dim / 2` float32 values per layer. Llama
    /// checkpoints written by `transformers` before 4.32 persist them (later versions
    /// register the buffer as non-persistent).
    pub rotary_inv_freq: u64,
    /// GPT-2's causal-mask buffers `attn.bias`, `n_positions²` per layer. The original
    /// OpenAI GPT-2 checkpoints, converted before `transformers` recorded its version in
    /// configs, store them.
    pub causal_mask: u64,
}

impl CheckpointExtras {
    /// All stored non-parameter elements.
    pub fn total(&self) -> u64 {
        self.tied_lm_head_copy
            .saturating_add(self.rotary_inv_freq)
            .saturating_add(self.causal_mask)
    }
}

/// The parameters of a model, by part. The parts sum exactly to [`Self::total`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ParamBreakdown {
    /// The architecture counted.
    pub architecture: Architecture,
    /// Token embedding, `vocab_size × hidden_size`.
    pub embeddings: u64,
    /// Learned position embeddings (GPT-2's `wpe`); zero with rotary or ALiBi positions.
    pub position_embeddings: u64,
    /// Attention of all decoder layers.
    pub attention: u64,
    /// Feed-forward blocks (all experts) of all decoder layers.
    pub mlp: u64,
    /// MoE routers of all decoder layers.
    pub router: u64,
    /// Normalisation layers inside the decoder layers.
    pub layer_norms: u64,
    /// The normalisation after the last decoder layer.
    pub final_norm: u64,
    /// The output projection; zero when tied to the token embedding.
    pub lm_head: u64,
    /// The vision tower, for multimodal models.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vision_tower: Option<VisionTowerParams>,
    /// The multimodal projector (two biased linear layers), for multimodal models.
    pub projector: u64,
    /// LLaVA-NeXT's learned `image_newline` vector, one `hidden_size` row.
    pub image_newline: u64,
    /// Decoder layers.
    pub num_layers: u64,
    /// One decoder layer (all decoder layers of the supported architectures are alike).
    pub decoder_layer: LayerParams,
    /// The expert structure, for MoE models.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub moe: Option<MoeParams>,
    /// Non-parameter tensors the published checkpoint stores.
    pub checkpoint_extras: CheckpointExtras,
}

/// The model cut into the units a pipeline split assigns to stages, in order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PipelineUnits {
    /// Everything before the first decoder layer: embeddings, and for multimodal models
    /// the vision tower, projector and `image_newline`.
    pub before_layers: u64,
    /// Each decoder layer, first to last.
    pub layers: Vec<u64>,
    /// Everything after the last decoder layer: the final norm and the output projection.
    /// With tied embeddings this is only the norm; the engine running the last stage still
    /// needs the embedding matrix for its output projection.
    pub after_layers: u64,
}

impl ParamBreakdown {
    /// All parameters. Each tensor counts once, so a tied output matrix is not counted
    /// twice.
    pub fn total(&self) -> u64 {
        [
            self.embeddings,
            self.position_embeddings,
            self.attention,
            self.mlp,
            self.router,
            self.layer_norms,
            self.final_norm,
            self.lm_head,
            self.vision_tower.map_or(0, |v| v.total()),
            self.projector,
            self.image_newline,
        ]
        .into_iter()
        .fold(0, u64::saturating_add)
    }

    /// Elements the published checkpoint stores: [`Self::total`] plus the
    /// [`CheckpointExtras`]. This is the number the Hub reports for a safetensors
    /// checkpoint.
    pub fn stored_total(&self) -> u64 {
        self.total().saturating_add(self.checkpoint_extras.total())
    }

    /// Parameters one token runs through: for MoE models only `experts_per_token` of the
    /// experts of each layer; for dense models, [`Self::total`].
    pub fn active_total(&self) -> u64 {
        match self.moe {
            Some(moe) => {
                let idle = moe.experts.saturating_sub(moe.experts_per_token);
                self.total()
                    .saturating_sub(self.num_layers.saturating_mul(idle).saturating_mul(moe.expert))
            }
            None => self.total(),
        }
    }

    /// Parameters of each decoder layer, first to last.
    pub fn layer_params(&self) -> Vec<u64> {
        (0..self.num_layers).map(|_| self.decoder_layer.total()).collect()
    }

    /// The model as ordered units for pipeline splits. The units sum to [`Self::total`].
    pub fn pipeline_units(&self) -> PipelineUnits {
        let before_layers = [
            self.embeddings,
            self.position_embeddings,
            self.vision_tower.map_or(0, |v| v.total()),
            self.projector,
            self.image_newline,
        ]
        .into_iter()
        .fold(0, u64::saturating_add);
        PipelineUnits {
            before_layers,
            layers: self.layer_params(),
            after_layers: self.final_norm.saturating_add(self.lm_head),
        }
    }
}

/// Checked arithmetic that reports overflow as the config's fault.
#[derive(Clone, Copy)]
struct Count {
    architecture: Architecture,
}

impl Count {
    fn err(self) -> Error {
        Error::ConfigArithmeticOverflow {
            architecture: self.architecture,
        }
    }

    fn mul(self, factors: &[u64]) -> Result<u64, Error> {
        factors
            .iter()
            .try_fold(1u64, |acc, &f| acc.checked_mul(f))
            .ok_or_else(|| self.err())
    }

    fn add(self, terms: &[u64]) -> Result<u64, Error> {
        terms
            .iter()
            .try_fold(0u64, |acc, &t| acc.checked_add(t))
            .ok_or_else(|| self.err())
    }
}

/// Counts the parameters of the model `cfg` describes.
///
/// ```
/// use skein_model_registry::{config::ModelConfig, params::parameter_count};
///
/// // TinyLlama-1.1B: 22 layers, 4 KV heads, untied output.
/// let cfg = ModelConfig::from_json(r#"{
///     "model_type": "llama", "hidden_size": 2048, "num_hidden_layers": 22,
///     "num_attention_heads": 32, "num_key_value_heads": 4,
///     "intermediate_size": 5632, "vocab_size": 32000
/// }"#).unwrap();
/// assert_eq!(parameter_count(&cfg).unwrap().total(), 1_100_048_384);
/// ```
pub fn parameter_count(cfg: &ModelConfig) -> Result<ParamBreakdown, Error> {
    let count = Count {
        architecture: cfg.architecture,
    };
    let t = &cfg.text;
    let layer = decoder_layer(t, count)?;
    let expert = match t.moe {
        Some(moe) => Some(MoeParams {
            experts: moe.num_experts,
            experts_per_token: moe.experts_per_token,
            expert: count.mul(&[3, t.hidden_size, t.intermediate_size])?,
        }),
        None => None,
    };
    let norm = norm_params(t, count)?;
    let embeddings = count.mul(&[t.vocab_size, t.hidden_size])?;
    let position_embeddings = match t.positions {
        PositionEncoding::Learned { positions } => count.mul(&[positions, t.hidden_size])?,
        PositionEncoding::Rotary | PositionEncoding::Alibi => 0,
    };
    let vision_tower = cfg.vision.map(|v| vision_tower(&v, count)).transpose()?;
    let (projector, image_newline) = match cfg.projector {
        Some(p) => {
            let biases = if p.bias { count.mul(&[2, p.output_size])? } else { 0 };
            let weights = count.add(&[
                count.mul(&[p.input_size, p.output_size])?,
                count.mul(&[p.output_size; 2])?,
            ])?;
            // LlavaNextModel creates `image_newline` unconditionally.
            (count.add(&[weights, biases])?, t.hidden_size)
        }
        None => (0, 0),
    };
    let breakdown = ParamBreakdown {
        architecture: cfg.architecture,
        embeddings,
        position_embeddings,
        attention: count.mul(&[layer.attention, t.num_layers])?,
        mlp: count.mul(&[layer.mlp, t.num_layers])?,
        router: count.mul(&[layer.router, t.num_layers])?,
        layer_norms: count.mul(&[layer.norms, t.num_layers])?,
        final_norm: norm,
        lm_head: if t.tie_word_embeddings { 0 } else { embeddings },
        vision_tower,
        projector,
        image_newline,
        num_layers: t.num_layers,
        decoder_layer: layer,
        moe: expert,
        checkpoint_extras: checkpoint_extras(cfg, count)?,
    };
    // Every part is at most the total, so once the total (with the extras) is known to
    // fit, the saturating sums of the accessors are exact.
    let vision = breakdown
        .vision_tower
        .map_or(Ok(0), |v| count.add(&[v.embeddings, v.layers, v.norms]))?;
    let total = count.add(&[
        breakdown.embeddings,
        breakdown.position_embeddings,
        breakdown.attention,
        breakdown.mlp,
        breakdown.router,
        breakdown.layer_norms,
        breakdown.final_norm,
        breakdown.lm_head,
        vision,
        breakdown.projector,
        breakdown.image_newline,
    ])?;
    let e = breakdown.checkpoint_extras;
    count.add(&[total, e.tied_lm_head_copy, e.rotary_inv_freq, e.causal_mask])?;
    Ok(breakdown)
}

fn norm_params(t: &TextConfig, count: Count) -> Result<u64, Error> {
    match t.norm {
        NormKind::RmsNorm => Ok(t.hidden_size),
        NormKind::LayerNorm => count.mul(&[2, t.hidden_size]),
    }
}

fn decoder_layer(t: &TextConfig, count: Count) -> Result<LayerParams, Error> {
    let h = t.hidden_size;
    let q_out = count.mul(&[t.num_attention_heads, t.head_dim])?;
    let kv_out = count.mul(&[t.num_kv_heads, t.head_dim])?;
    // Fused or not, q, k and v have the same shapes in total.
    let qkv_out = count.add(&[q_out, kv_out, kv_out])?;
    let attention = count.add(&[
        count.mul(&[h, qkv_out])?,
        count.mul(&[q_out, h])?,
        if t.biases.qkv { qkv_out } else { 0 },
        if t.biases.attn_output { h } else { 0 },
    ])?;

    let i = t.intermediate_size;
    let (mlp, router) = match (t.moe, t.mlp) {
        // Mixtral's experts are bias-free SwiGLU blocks; the router is a bias-free
        // `hidden → num_experts` linear layer.
        (Some(moe), _) => (
            count.mul(&[moe.num_experts, 3, h, i])?,
            count.mul(&[h, moe.num_experts])?,
        ),
        (None, MlpKind::Gated) => {
            let biases = if t.biases.mlp { count.add(&[i, i, h])? } else { 0 };
            (count.add(&[count.mul(&[3, h, i])?, biases])?, 0)
        }
        (None, MlpKind::Plain) => {
            let biases = if t.biases.mlp { count.add(&[i, h])? } else { 0 };
            (count.add(&[count.mul(&[2, h, i])?, biases])?, 0)
        }
    };
    let norms = count.mul(&[t.norms_per_layer, norm_params(t, count)?])?;
    Ok(LayerParams {
        attention,
        mlp,
        router,
        norms,
    })
}

fn vision_tower(v: &VisionConfig, count: Count) -> Result<VisionTowerParams, Error> {
    let h = v.hidden_size;
    let patches_per_side = v.image_size / v.patch_size;
    let positions = count.add(&[count.mul(&[patches_per_side, patches_per_side])?, 1])?;
    let embeddings = count.add(&[
        h, // class embedding
        count.mul(&[v.num_channels, v.patch_size, v.patch_size, h])?,
        count.mul(&[positions, h])?,
    ])?;
    let layer = count.add(&[
        count.mul(&[4, count.add(&[count.mul(&[h, h])?, h])?])?, // q, k, v, out with biases
        count.mul(&[2, h, v.intermediate_size])?,                // fc1 and fc2
        v.intermediate_size,                                     // fc1 bias
        h,                                                       // fc2 bias
        count.mul(&[4, h])?,                                     // two LayerNorms
    ])?;
    Ok(VisionTowerParams {
        embeddings,
        layers: count.mul(&[layer, v.num_layers])?,
        layer,
        norms: count.mul(&[4, h])?, // pre_layrnorm and post_layernorm
    })
}

/// The `transformers` version that wrote the checkpoint, as `(major, minor)`.
fn transformers_minor(version: Option<&str>) -> Option<(u64, u64)> {
    let mut parts = version?.split('.');
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}

fn checkpoint_extras(cfg: &ModelConfig, count: Count) -> Result<CheckpointExtras, Error> {
    let t = &cfg.text;
    let version = cfg.transformers_version.as_deref();
    let written_before = |major: u64, minor: u64| transformers_minor(version).is_some_and(|v| v < (major, minor));
    let mut extras = CheckpointExtras::default();
    match t.architecture {
        Architecture::Llama if written_before(4, 32) => {
            extras.rotary_inv_freq = count.mul(&[t.num_layers, t.head_dim / 2])?;
        }
        Architecture::Falcon if t.tie_word_embeddings && written_before(4, 33) => {
            extras.tied_lm_head_copy = count.mul(&[t.vocab_size, t.hidden_size])?;
        }
        Architecture::Gpt2 if version.is_none() => {
            if let PositionEncoding::Learned { positions } = t.positions {
                extras.causal_mask = count.mul(&[t.num_layers, positions, positions])?;
            }
        }
        _ => {}
    }
    Ok(extras)
}

/// KV-cache bytes per token of context: `2 × layers × kv_heads × head_dim ×
/// kv_dtype_bytes` (one K and one V vector per KV head per layer).
///
/// Grouped-query and multi-query attention shrink it through `kv_heads`. A mixture of
/// experts does not change it: experts replace the MLP, and every token still attends
/// through every layer's one attention block. For a multimodal model it is the language
/// model's cache; image tokens occupy context like text tokens.
///
/// ```
/// use skein_model_registry::{config::ModelConfig, params::kv_bytes_per_token};
///
/// let cfg = ModelConfig::from_json(r#"{
///     "model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32,
///     "num_attention_heads": 32, "num_key_value_heads": 8,
///     "intermediate_size": 14336, "vocab_size": 128256
/// }"#).unwrap();
/// // 2 × 32 layers × 8 KV heads × 128 × 2 bytes (bf16)
/// assert_eq!(kv_bytes_per_token(&cfg, 2).unwrap().get(), 131_072);
/// ```
pub fn kv_bytes_per_token(cfg: &ModelConfig, kv_dtype_bytes: u64) -> Result<Bytes, Error> {
    let t = &cfg.text;
    let count = Count {
        architecture: cfg.architecture,
    };
    Ok(Bytes::new(count.mul(&[
        2,
        t.num_layers,
        t.num_kv_heads,
        t.head_dim,
        kv_dtype_bytes,
    ])?))
}

/// Tokens per sequence the KV cache must hold for a context of `context_tokens`.
///
/// A sliding window bounds it for Mistral and Mixtral when `sliding_window` is set: every
/// layer attends only to the last `sliding_window` tokens, so engines keep no more (a
/// rolling buffer). Mistral-7B-v0.1 sets 4096; Mixtral and Mistral v0.2 set `null` and
/// cache the whole context. Other architectures are not bounded even when their config
/// names a window (Qwen2 windows only layers past `max_window_layers`, Phi-3's window is
/// a mask inside full-length caches), because over-estimating is the safe error.
pub fn kv_cached_tokens(cfg: &ModelConfig, context_tokens: u64) -> u64 {
    let t = &cfg.text;
    match (t.architecture, t.sliding_window) {
        (Architecture::Mistral | Architecture::Mixtral, Some(window)) => context_tokens.min(window),
        _ => context_tokens,
    }
}
