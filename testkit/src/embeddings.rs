//! An embedding model for plans and engine commands: intfloat/e5-mistral-7b-instruct, a
//! Mistral 7B without its language-model head (`MistralModel`) that pools the last
//! token, as `inspect` lists it. `workflows/paper-search.yaml` serves it.

use skein_model_registry::catalog::ModelInfo;
use skein_model_registry::{ModelTask, Pooling};

use crate::models::{GgufQuant, VariantSpec, model_info};

/// The repository.
pub const E5_MISTRAL_7B_INSTRUCT: &str = "intfloat/e5-mistral-7b-instruct";

/// Its `config.json` (the keys the registry reads).
pub const E5_MISTRAL_7B_INSTRUCT_CONFIG: &str = r#"{
  "architectures": ["MistralModel"],
  "hidden_act": "silu",
  "hidden_size": 4096,
  "intermediate_size": 14336,
  "max_position_embeddings": 32768,
  "model_type": "mistral",
  "num_attention_heads": 32,
  "num_hidden_layers": 32,
  "num_key_value_heads": 8,
  "rms_norm_eps": 1e-05,
  "rope_theta": 10000.0,
  "sliding_window": 4096,
  "tie_word_embeddings": false,
  "torch_dtype": "float16",
  "transformers_version": "4.34.0",
  "vocab_size": 32000
}"#;

/// [`E5_MISTRAL_7B_INSTRUCT`] as `inspect` lists it: its FP16 checkpoint and a `Q8_0`
/// GGUF file, an embedding model with the last-token pooling its sentence-transformers
/// pooling module (`1_Pooling/config.json`) states. The weights are computed from the
/// config, which counts a language-model head that the bare `MistralModel` does not
/// have (0.26 GB at FP16; `inspect` reads exact bytes from the headers).
pub fn e5_mistral_info() -> ModelInfo {
    let mut info = model_info(
        E5_MISTRAL_7B_INSTRUCT,
        E5_MISTRAL_7B_INSTRUCT_CONFIG,
        &[VariantSpec::Own, VariantSpec::Gguf(GgufQuant::Q8_0)],
    );
    assert!(info.task.is_embed(), "a bare MistralModel embeds");
    info.task = ModelTask::Embed {
        pooling: Some(Pooling::Last),
    };
    info
}
