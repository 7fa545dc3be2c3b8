//! What a model is served for: generating text, or embeddings (a vector per input).
//!
//! Pure: [`ModelTask::detect`] reads what the hub edge found without downloading
//! weights (the `architectures` of `config.json`, the files of a sentence-transformers
//! repository, the pooling of `1_Pooling/config.json`, a GGUF file's
//! `<arch>.pooling_type`).

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::gguf::GgufHeader;

/// How an embedding model turns its token states into one vector.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Pooling {
    /// The mean over the tokens.
    Mean,
    /// The first (`[CLS]`) token.
    Cls,
    /// The last token (decoder embedding models: e5-mistral, gte-Qwen2).
    Last,
}

impl Pooling {
    /// The name llama.cpp's `--pooling` takes.
    pub const fn name(self) -> &'static str {
        match self {
            Pooling::Mean => "mean",
            Pooling::Cls => "cls",
            Pooling::Last => "last",
        }
    }

    /// llama.cpp's `llama_pooling_type` as GGUF stores it (`<arch>.pooling_type`): 1
    /// mean, 2 cls, 3 last. None (0) and rank (4, a reranker's score) are no
    /// embedding pooling.
    pub const fn from_gguf(id: u64) -> Option<Pooling> {
        match id {
            1 => Some(Pooling::Mean),
            2 => Some(Pooling::Cls),
            3 => Some(Pooling::Last),
            _ => None,
        }
    }

    /// The pooling a sentence-transformers `1_Pooling/config.json` turns on
    /// (`pooling_mode_cls_token`, `pooling_mode_mean_tokens`,
    /// `pooling_mode_lasttoken`); `None` for another mode or none.
    pub fn from_sentence_transformers(config: &Value) -> Option<Pooling> {
        let on = |key: &str| config.get(key).and_then(Value::as_bool) == Some(true);
        if on("pooling_mode_lasttoken") {
            Some(Pooling::Last)
        } else if on("pooling_mode_cls_token") {
            Some(Pooling::Cls)
        } else if on("pooling_mode_mean_tokens") {
            Some(Pooling::Mean)
        } else {
            None
        }
    }

    /// The pooling a GGUF file states (`<arch>.pooling_type`), if it is an embedding
    /// pooling.
    pub fn of_gguf(header: &GgufHeader) -> Option<Pooling> {
        let arch = header.architecture()?;
        Pooling::from_gguf(header.get(&format!("{arch}.pooling_type"))?.as_u64()?)
    }
}

/// What a model is served for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ModelTask {
    /// Text generation: chat completions.
    #[default]
    Generate,
    /// Embeddings (`POST /v1/embeddings`): engines start in pooling mode.
    Embed {
        /// The pooling the model states; `None`: the engine's default for the model.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pooling: Option<Pooling>,
    },
}

/// The sentence-transformers files that mark an embedding repository.
pub const SENTENCE_TRANSFORMERS_FILES: [&str; 2] = ["modules.json", "config_sentence_transformers.json"];

/// The pooling module's configuration in a sentence-transformers repository.
pub const POOLING_CONFIG: &str = "1_Pooling/config.json";

/// What the hub edge found that tells an embedding model.
#[derive(Debug, Clone, Copy, Default)]
pub struct TaskSignals<'a> {
    /// `config.json`, parsed.
    pub config: Option<&'a Value>,
    /// Whether the repository has a sentence-transformers file
    /// ([`SENTENCE_TRANSFORMERS_FILES`]).
    pub sentence_transformers: bool,
    /// `1_Pooling/config.json`, parsed.
    pub pooling_config: Option<&'a Value>,
    /// The pooling of the GGUF file read for the shape, when the shape came from one.
    pub gguf_pooling: Option<Pooling>,
}

impl ModelTask {
    /// The task the signals give: embeddings for a sentence-transformers repository, a
    /// `config.json` whose `architectures` are all bare models (`MistralModel`,
    /// `Qwen2Model`: no language-model head), or a GGUF file that states an embedding
    /// pooling; generation otherwise. The pooling is the GGUF file's, else the
    /// sentence-transformers pooling module's.
    pub fn detect(signals: &TaskSignals<'_>) -> ModelTask {
        let classes: Vec<&str> = signals
            .config
            .and_then(|c| c.get("architectures"))
            .and_then(Value::as_array)
            .map(|list| list.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let bare = !classes.is_empty() && classes.iter().all(|c| is_bare_model(c));
        let pooling = signals
            .gguf_pooling
            .or_else(|| signals.pooling_config.and_then(Pooling::from_sentence_transformers));
        if signals.sentence_transformers || bare || signals.gguf_pooling.is_some() {
            ModelTask::Embed { pooling }
        } else {
            ModelTask::Generate
        }
    }

    /// Whether it is an embedding model.
    pub fn is_embed(self) -> bool {
        matches!(self, ModelTask::Embed { .. })
    }

    /// Whether it generates text (the default, not written out).
    pub fn is_generate(&self) -> bool {
        *self == ModelTask::Generate
    }
}

/// A `transformers` class of a model without a head (`LlamaModel`, `MistralModel`),
/// which outputs hidden states only: not `…LMHeadModel`, not `…For…`.
fn is_bare_model(class: &str) -> bool {
    class.len() > "Model".len() && class.ends_with("Model") && !class.ends_with("LMHeadModel") && !class.contains("For")
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_causal_lm_generates() {
        let config = json!({"architectures": ["LlamaForCausalLM"]});
        let signals = TaskSignals {
            config: Some(&config),
            ..TaskSignals::default()
        };
        assert_eq!(ModelTask::detect(&signals), ModelTask::Generate);
        let gpt2 = json!({"architectures": ["GPT2LMHeadModel"]});
        let signals = TaskSignals {
            config: Some(&gpt2),
            ..TaskSignals::default()
        };
        assert_eq!(ModelTask::detect(&signals), ModelTask::Generate);
        assert_eq!(ModelTask::detect(&TaskSignals::default()), ModelTask::Generate);
    }

    #[test]
    fn a_bare_model_class_embeds() {
        let config = json!({"architectures": ["MistralModel"]});
        let signals = TaskSignals {
            config: Some(&config),
            ..TaskSignals::default()
        };
        assert_eq!(ModelTask::detect(&signals), ModelTask::Embed { pooling: None });
        let mixed = json!({"architectures": ["MistralModel", "MistralForCausalLM"]});
        let signals = TaskSignals {
            config: Some(&mixed),
            ..TaskSignals::default()
        };
        assert_eq!(ModelTask::detect(&signals), ModelTask::Generate);
    }

    #[test]
    fn a_sentence_transformers_repository_embeds_with_its_pooling() {
        // gte-Qwen2: a causal-LM class, made an embedding model by its repository.
        let config = json!({"architectures": ["Qwen2ForCausalLM"]});
        let pooling = json!({"word_embedding_dimension": 1536, "pooling_mode_cls_token": false,
            "pooling_mode_mean_tokens": false, "pooling_mode_lasttoken": true});
        let signals = TaskSignals {
            config: Some(&config),
            sentence_transformers: true,
            pooling_config: Some(&pooling),
            gguf_pooling: None,
        };
        assert_eq!(
            ModelTask::detect(&signals),
            ModelTask::Embed {
                pooling: Some(Pooling::Last)
            }
        );
        let mean = json!({"pooling_mode_mean_tokens": true});
        assert_eq!(Pooling::from_sentence_transformers(&mean), Some(Pooling::Mean));
        let cls = json!({"pooling_mode_cls_token": true, "pooling_mode_mean_tokens": false});
        assert_eq!(Pooling::from_sentence_transformers(&cls), Some(Pooling::Cls));
        assert_eq!(
            Pooling::from_sentence_transformers(&json!({"pooling_mode_max_tokens": true})),
            None
        );
    }

    #[test]
    fn a_gguf_pooling_makes_an_embedding_model_and_wins() {
        let pooling = json!({"pooling_mode_mean_tokens": true});
        let signals = TaskSignals {
            config: None,
            sentence_transformers: false,
            pooling_config: Some(&pooling),
            gguf_pooling: Some(Pooling::Last),
        };
        assert_eq!(
            ModelTask::detect(&signals),
            ModelTask::Embed {
                pooling: Some(Pooling::Last)
            }
        );
        assert_eq!(Pooling::from_gguf(0), None);
        assert_eq!(Pooling::from_gguf(1), Some(Pooling::Mean));
        assert_eq!(Pooling::from_gguf(2), Some(Pooling::Cls));
        assert_eq!(Pooling::from_gguf(4), None, "rank pooling is a reranker's");
    }

    #[test]
    fn the_task_reads_back_from_json() {
        let task = ModelTask::Embed {
            pooling: Some(Pooling::Cls),
        };
        let text = serde_json::to_string(&task).unwrap();
        assert_eq!(text, r#"{"kind":"embed","pooling":"cls"}"#);
        assert_eq!(serde_json::from_str::<ModelTask>(&text).unwrap(), task);
        assert_eq!(
            serde_json::from_str::<ModelTask>(r#"{"kind":"generate"}"#).unwrap(),
            ModelTask::Generate
        );
    }
}
