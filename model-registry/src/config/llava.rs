//! LLaVA-NeXT: the CLIP vision tower ([`VisionConfig`]), the multimodal projector
//! ([`ProjectorConfig`]), and the reading of a LLaVA-NeXT config, whose language model
//! sits in `text_config`.

use serde::Serialize;
use serde_json::{Map, Value};

use super::text::decoder;
use super::{Architecture, Defaults, Section, TextConfig, invalid, shown};
use crate::Error;

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

/// Reads a LLaVA-NeXT config: the language model from `text_config`, the CLIP tower from
/// `vision_config`, the projector from the top-level keys.
pub(super) fn llava_next(root: &Section<'_>) -> Result<(TextConfig, VisionConfig, ProjectorConfig), Error> {
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
