//! [`ModelConfig::from_gguf`]: a model config from a GGUF header alone, for GGUF-only
//! repositories that publish no `config.json`.
//!
//! llama.cpp's converters copy the sizing keys of `config.json` into GGUF metadata under
//! the architecture's prefix (`hidden_size` becomes `llama.embedding_length`). This module
//! maps them back to the `config.json` object they came from and reads that object with
//! [`ModelConfig::from_json`], so that both paths share one validation and one set of
//! defaults. Where GGUF says things differently, the mapping settles them the way
//! llama.cpp's loader does:
//!
//! - The vocabulary is the row count of the `token_embd.weight` tensor (GGUF dimensions
//!   are innermost first: `[hidden, vocab]`), else `<arch>.vocab_size`, else the length
//!   of `tokenizer.ggml.tokens`.
//! - The output projection is tied exactly when the file has no `output.weight` tensor:
//!   llama.cpp then multiplies by the token embedding. A file that stores a copy of a tied
//!   matrix (llama.cpp's GPT-2 converter writes one) is counted with it, because that is
//!   what llama.cpp loads.
//! - Biases are present when the first block has the bias tensor; GGUF has no key for them.
//! - An absent `<arch>.attention.head_count_kv` means as many KV heads as query heads, as
//!   in llama.cpp, not the default of a `transformers` config class (8 for Mistral).
//! - The keys llama.cpp requires are required here too; no `transformers` default stands
//!   in for them.
//! - A key holding one value per layer is refused: Skein's config has one shape for all
//!   layers, and picking one of the values would be a guess.
//! - Errors name the GGUF key or tensor, never the `config.json` key it was mapped to.
//!
//! Mistral models are written by llama.cpp as `llama`; they are read as
//! [`Architecture::Llama`] with their `sliding_window`. The counts are the same, and
//! llama.cpp caches the whole context for the `llama` architecture, so the window does not
//! shrink the KV-cache estimate.

use std::collections::BTreeMap;
use std::fmt;

use serde_json::{Map, Number, Value};

use super::{Architecture, ModelConfig};
use crate::Error;
use crate::gguf::{GgufHeader, GgufTensorInfo, GgufValue};

/// The GGUF architectures (`general.architecture`) Skein can size, in the order messages
/// list them, with the config architecture each is read as. A `llama` file with experts
/// is read as [`Architecture::Mixtral`].
const GGUF_ARCHITECTURES: [(&str, Architecture); 6] = [
    ("llama", Architecture::Llama),
    ("qwen2", Architecture::Qwen2),
    ("gemma", Architecture::Gemma),
    ("phi3", Architecture::Phi3),
    ("falcon", Architecture::Falcon),
    ("gpt2", Architecture::Gpt2),
];

/// Why a GGUF header cannot be read as a [`ModelConfig`]; carried by
/// [`Error::GgufConfig`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum GgufConfigProblem {
    /// A key without which the model cannot be sized.
    MissingKey {
        /// The GGUF key (`llama.embedding_length`).
        key: String,
    },
    /// `general.architecture` names an architecture Skein cannot size from a GGUF header.
    UnsupportedArchitecture {
        /// The architecture found.
        found: String,
    },
    /// A key that holds an array (one value per layer) where Skein needs one value.
    PerLayer {
        /// The GGUF key.
        key: String,
        /// The length of the array.
        len: u64,
    },
    /// A key or tensor whose value has the wrong type or is out of range.
    InvalidValue {
        /// The GGUF key or tensor name.
        key: String,
        /// The offending value.
        found: String,
        /// What it must be.
        expected: String,
    },
    /// Experts in a file of an architecture whose mixture-of-experts layout Skein does not
    /// know.
    UnsupportedExperts {
        /// The `<arch>.expert_count` key.
        key: String,
        /// Its value.
        experts: u64,
    },
    /// Neither a tensor nor a key gives the vocabulary size.
    NoVocabulary {
        /// The GGUF architecture.
        architecture: String,
    },
}

impl fmt::Display for GgufConfigProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::MissingKey { key } => write!(
                f,
                "the GGUF header has no `{key}`; help: Skein needs it to size a model without a config.json"
            ),
            Self::UnsupportedArchitecture { found } => {
                let supported: Vec<&str> = GGUF_ARCHITECTURES.iter().map(|(name, _)| *name).collect();
                write!(
                    f,
                    "the GGUF architecture `{found}` (`general.architecture`) is not supported; Skein sizes GGUF \
                     files of architecture {} (llama with experts as Mixtral)",
                    supported.join(", ")
                )
            }
            Self::PerLayer { key, len } => write!(
                f,
                "`{key}` in the GGUF header is an array of {len} values, one per layer; Skein cannot size models \
                 whose layers differ in shape"
            ),
            Self::InvalidValue { key, found, expected } => {
                write!(f, "`{key}` in the GGUF header is {found}; expected {expected}")
            }
            Self::UnsupportedExperts { key, experts } => write!(
                f,
                "`{key}` in the GGUF header is {experts}, but Skein sizes GGUF mixtures of experts only for the \
                 llama architecture (Mixtral)"
            ),
            Self::NoVocabulary { architecture } => write!(
                f,
                "the GGUF header has no `token_embd.weight` tensor, no `{architecture}.vocab_size` and no \
                 `tokenizer.ggml.tokens`, so the vocabulary size is unknown"
            ),
        }
    }
}

impl ModelConfig {
    /// Builds the config of a GGUF-only model from its parsed header: the metadata keys
    /// llama.cpp wrote, mapped back to `config.json` keys and validated by
    /// [`ModelConfig::from_json`], with the vocabulary, tied output and biases read from
    /// the tensor infos, as llama.cpp's loader reads them: the vocabulary is the row
    /// count of `token_embd.weight`; the output is tied exactly when there is no
    /// `output.weight`; absent KV heads are as many as query heads; biases exist when the
    /// first block has them; a `llama` file with experts is Mixtral, and Mistral (which
    /// llama.cpp writes as `llama`) is read as Llama with its `sliding_window`.
    ///
    /// `torch_dtype`, `transformers_version` and `quantization_config` are `None`: a GGUF
    /// file's quantization comes from [`Quantization::from_gguf`](crate::Quantization::from_gguf).
    ///
    /// Errors: [`Error::GgufConfig`] for a missing key (naming it, such as
    /// `llama.embedding_length`), an unsupported `general.architecture`, a per-layer array,
    /// or a value out of range; [`Error::ConfigArithmeticOverflow`] for absurd sizes.
    pub fn from_gguf(header: &GgufHeader) -> Result<ModelConfig, Error> {
        let mapped = config_json(header.metadata(), header.tensors())?;
        let text = Value::Object(mapped.config).to_string();
        ModelConfig::from_json(&text).map_err(|error| in_gguf_terms(error, &mapped.sources))
    }
}

/// A `config.json` object built from GGUF metadata, and for each of its keys the GGUF key
/// or tensor it came from.
#[derive(Debug)]
struct Mapped {
    config: Map<String, Value>,
    sources: BTreeMap<&'static str, String>,
}

impl Mapped {
    fn set(&mut self, key: &'static str, value: Value, source: String) {
        self.config.insert(key.to_owned(), value);
        self.sources.insert(key, source);
    }

    /// A key with no GGUF counterpart: a fact of the architecture or of the tensor list.
    fn fixed(&mut self, key: &'static str, value: bool) {
        self.config.insert(key.to_owned(), Value::Bool(value));
    }
}

/// Turns an error of [`ModelConfig::from_json`] about a mapped key into one about the GGUF
/// key it was read from.
fn in_gguf_terms(error: Error, sources: &BTreeMap<&'static str, String>) -> Error {
    match error {
        Error::InvalidConfigValue { key, found, expected } => match sources.get(key.as_str()) {
            Some(source) => gguf_error(GgufConfigProblem::InvalidValue {
                key: source.clone(),
                found,
                expected: expected.to_owned(),
            }),
            None => Error::InvalidConfigValue { key, found, expected },
        },
        other => other,
    }
}

fn gguf_error(problem: GgufConfigProblem) -> Error {
    Error::GgufConfig { problem }
}

/// The metadata of one header, read under its architecture's prefix.
struct Metadata<'a> {
    metadata: &'a BTreeMap<String, GgufValue>,
    arch: &'a str,
}

impl Metadata<'_> {
    fn key(&self, suffix: &str) -> String {
        format!("{}.{suffix}", self.arch)
    }

    /// `<arch>.<suffix>` as JSON with its full key, or `None` when absent.
    fn json(&self, suffix: &str) -> Result<Option<(String, Value)>, Error> {
        let key = self.key(suffix);
        match self.metadata.get(&key) {
            Some(value) => {
                let json = json_of(&key, value)?;
                Ok(Some((key, json)))
            }
            None => Ok(None),
        }
    }

    fn required(&self, suffix: &str) -> Result<(String, Value), Error> {
        self.json(suffix)?
            .ok_or_else(|| gguf_error(GgufConfigProblem::MissingKey { key: self.key(suffix) }))
    }

    /// `<arch>.<suffix>` as a non-negative integer, or `None` when absent.
    fn count(&self, suffix: &str) -> Result<Option<u64>, Error> {
        let key = self.key(suffix);
        let Some(value) = self.metadata.get(&key) else {
            return Ok(None);
        };
        if let GgufValue::Array(array) = value {
            return Err(gguf_error(GgufConfigProblem::PerLayer { key, len: array.len }));
        }
        value.as_u64().map(Some).ok_or_else(|| {
            gguf_error(GgufConfigProblem::InvalidValue {
                key,
                found: value.to_string(),
                expected: "a non-negative integer".to_owned(),
            })
        })
    }
}

/// A scalar metadata value as JSON. Arrays are refused: the keys mapped here hold one
/// value for the whole model unless its layers differ.
fn json_of(key: &str, value: &GgufValue) -> Result<Value, Error> {
    let float = |v: f64| {
        Number::from_f64(v).map(Value::Number).ok_or_else(|| {
            gguf_error(GgufConfigProblem::InvalidValue {
                key: key.to_owned(),
                found: v.to_string(),
                expected: "a finite number".to_owned(),
            })
        })
    };
    Ok(match value {
        GgufValue::U8(v) => Value::from(*v),
        GgufValue::U16(v) => Value::from(*v),
        GgufValue::U32(v) => Value::from(*v),
        GgufValue::U64(v) => Value::from(*v),
        GgufValue::I8(v) => Value::from(*v),
        GgufValue::I16(v) => Value::from(*v),
        GgufValue::I32(v) => Value::from(*v),
        GgufValue::I64(v) => Value::from(*v),
        // Through the shortest decimal that reads back as the same f32, so that an epsilon
        // of 1e-5 stays 1e-5 rather than becoming 9.999999747378752e-6.
        GgufValue::F32(v) => float(v.to_string().parse().unwrap_or(f64::from(*v)))?,
        GgufValue::F64(v) => float(*v)?,
        GgufValue::Bool(v) => Value::Bool(*v),
        GgufValue::String(v) => Value::String(v.clone()),
        GgufValue::Array(array) => {
            return Err(gguf_error(GgufConfigProblem::PerLayer {
                key: key.to_owned(),
                len: array.len,
            }));
        }
    })
}

/// The architecture a GGUF header declares, as its name and the config architecture it
/// maps to (before experts turn `llama` into Mixtral).
fn gguf_architecture(metadata: &BTreeMap<String, GgufValue>) -> Result<(&str, Architecture), Error> {
    let key = "general.architecture";
    let value = metadata
        .get(key)
        .ok_or_else(|| gguf_error(GgufConfigProblem::MissingKey { key: key.to_owned() }))?;
    let name = value.as_str().ok_or_else(|| {
        gguf_error(GgufConfigProblem::InvalidValue {
            key: key.to_owned(),
            found: value.to_string(),
            expected: "a string".to_owned(),
        })
    })?;
    GGUF_ARCHITECTURES
        .iter()
        .find(|(gguf, _)| *gguf == name)
        .map(|&(_, architecture)| (name, architecture))
        .ok_or_else(|| gguf_error(GgufConfigProblem::UnsupportedArchitecture { found: name.to_owned() }))
}

/// The `config.json` object that llama.cpp's converter turned into this metadata.
fn config_json(metadata: &BTreeMap<String, GgufValue>, tensors: &[GgufTensorInfo]) -> Result<Mapped, Error> {
    use Architecture as A;

    let (arch, gguf_architecture) = gguf_architecture(metadata)?;
    let meta = Metadata { metadata, arch };
    let has_tensor = |name: &str| tensors.iter().any(|t| t.name == name);
    let mut mapped = Mapped {
        config: Map::new(),
        sources: BTreeMap::new(),
    };

    let experts = meta.count("expert_count")?.filter(|&n| n > 0);
    let architecture = match (gguf_architecture, experts) {
        (A::Llama, Some(_)) => A::Mixtral,
        (_, None) => gguf_architecture,
        (_, Some(experts)) => {
            return Err(gguf_error(GgufConfigProblem::UnsupportedExperts {
                key: meta.key("expert_count"),
                experts,
            }));
        }
    };
    mapped.config.insert(
        "model_type".to_owned(),
        Value::String(architecture.model_type().to_owned()),
    );

    let intermediate = match architecture {
        A::Gpt2 => "n_inner",
        A::Falcon => "ffn_hidden_size",
        _ => "intermediate_size",
    };
    for (suffix, key) in [
        ("embedding_length", "hidden_size"),
        ("block_count", "num_hidden_layers"),
        ("attention.head_count", "num_attention_heads"),
        ("context_length", "max_position_embeddings"),
        ("feed_forward_length", intermediate),
    ] {
        let (source, value) = meta.required(suffix)?;
        mapped.set(key, value, source);
    }
    for (suffix, key) in [
        ("attention.layer_norm_rms_epsilon", "rms_norm_eps"),
        ("rope.freq_base", "rope_theta"),
        ("attention.sliding_window", "sliding_window"),
    ] {
        if let Some((source, value)) = meta.json(suffix)? {
            mapped.set(key, value, source);
        }
    }
    if architecture == A::Qwen2 && mapped.config.contains_key("sliding_window") {
        mapped.fixed("use_sliding_window", true);
    }

    // KV heads: as many as query heads when absent, as llama.cpp reads them.
    let kv_key = if architecture == A::Falcon {
        "num_kv_heads"
    } else {
        "num_key_value_heads"
    };
    let (source, value) = match meta.json("attention.head_count_kv")? {
        Some(kv) => kv,
        None => meta.required("attention.head_count")?,
    };
    mapped.set(kv_key, value, source);

    head_dim(&meta, architecture, &mut mapped)?;

    if let Some(experts) = experts {
        let (source, value) = meta.required("expert_used_count")?;
        mapped.set("num_local_experts", Value::from(experts), meta.key("expert_count"));
        mapped.set("num_experts_per_tok", value, source);
    }

    let (vocab, source) = vocab_size(&meta, tensors)?;
    mapped.set("vocab_size", Value::from(vocab), source);
    mapped.fixed("tie_word_embeddings", !has_tensor("output.weight"));

    match architecture {
        A::Llama => {
            mapped.fixed("attention_bias", has_tensor("blk.0.attn_q.bias"));
            mapped.fixed("mlp_bias", has_tensor("blk.0.ffn_up.bias"));
        }
        A::Gemma => mapped.fixed("attention_bias", has_tensor("blk.0.attn_q.bias")),
        A::Falcon => {
            // Falcon-40B's new decoder architecture has a second input norm per block;
            // `multi_query: false` makes FalconConfig read `num_kv_heads`, which llama.cpp
            // always resolves (to 1 for Falcon-7B's multi-query attention).
            mapped.fixed("new_decoder_architecture", has_tensor("blk.0.attn_norm_2.weight"));
            mapped.fixed("multi_query", false);
            mapped.fixed("bias", has_tensor("blk.0.attn_qkv.bias"));
        }
        _ => {}
    }
    Ok(mapped)
}

/// `head_dim` from `<arch>.attention.key_length`. Without it llama.cpp takes
/// `embedding_length / head_count`, which `from_json` does too, except for Gemma, whose
/// config class defaults to 256; so for Gemma the quotient is stated.
fn head_dim(meta: &Metadata<'_>, architecture: Architecture, mapped: &mut Mapped) -> Result<(), Error> {
    let key_length = meta.count("attention.key_length")?;
    if let (Some(k), Some(v)) = (key_length, meta.count("attention.value_length")?)
        && k != v
    {
        return Err(gguf_error(GgufConfigProblem::InvalidValue {
            key: meta.key("attention.value_length"),
            found: v.to_string(),
            expected: format!(
                "{k}, as `{}`: Skein sizes models whose keys and values have one head width",
                meta.key("attention.key_length")
            ),
        }));
    }
    if let Some(k) = key_length {
        mapped.set("head_dim", Value::from(k), meta.key("attention.key_length"));
    } else if architecture == Architecture::Gemma
        && let (Some(hidden), Some(heads)) = (meta.count("embedding_length")?, meta.count("attention.head_count")?)
        && heads > 0
        && hidden.is_multiple_of(heads)
    {
        mapped.set("head_dim", Value::from(hidden / heads), meta.key("embedding_length"));
    }
    Ok(())
}

/// The vocabulary size and where it was read: the rows of `token_embd.weight`, else
/// `<arch>.vocab_size`, else the length of `tokenizer.ggml.tokens` (the parser keeps an
/// array's length even when it keeps only its first items).
fn vocab_size(meta: &Metadata<'_>, tensors: &[GgufTensorInfo]) -> Result<(u64, String), Error> {
    let name = "token_embd.weight";
    if let Some(tensor) = tensors.iter().find(|t| t.name == name) {
        return match tensor.dims[..] {
            [_, rows] => Ok((rows, name.to_owned())),
            _ => Err(gguf_error(GgufConfigProblem::InvalidValue {
                key: name.to_owned(),
                found: format!("a tensor of dimensions {:?}", tensor.dims),
                expected: "two dimensions, [embedding_length, vocabulary]".to_owned(),
            })),
        };
    }
    if let Some(vocab) = meta.count("vocab_size")? {
        return Ok((vocab, meta.key("vocab_size")));
    }
    let tokens = "tokenizer.ggml.tokens";
    match meta.metadata.get(tokens).and_then(GgufValue::as_array) {
        Some(array) => Ok((array.len, tokens.to_owned())),
        None => Err(gguf_error(GgufConfigProblem::NoVocabulary {
            architecture: meta.arch.to_owned(),
        })),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::{GgufArray, GgufValueType};
    use crate::{Bytes, GgmlType};

    fn tensor(name: &str, dims: &[u64]) -> GgufTensorInfo {
        GgufTensorInfo {
            name: name.to_owned(),
            dims: dims.to_vec(),
            ggml_type: GgmlType::F32,
            offset: 0,
            elements: dims.iter().product(),
            bytes: Bytes::new(0),
        }
    }

    /// A small Llama: 2 layers, hidden 64, 4 heads, 2 KV heads, vocabulary 100, untied.
    fn llama() -> (BTreeMap<String, GgufValue>, Vec<GgufTensorInfo>) {
        let metadata = [
            ("general.architecture", GgufValue::String("llama".to_owned())),
            ("llama.block_count", GgufValue::U32(2)),
            ("llama.context_length", GgufValue::U32(4096)),
            ("llama.embedding_length", GgufValue::U32(64)),
            ("llama.feed_forward_length", GgufValue::U32(128)),
            ("llama.attention.head_count", GgufValue::U32(4)),
            ("llama.attention.head_count_kv", GgufValue::U32(2)),
        ]
        .map(|(k, v)| (k.to_owned(), v))
        .into();
        let tensors = vec![
            tensor("token_embd.weight", &[64, 100]),
            tensor("output.weight", &[64, 100]),
        ];
        (metadata, tensors)
    }

    fn read(metadata: &BTreeMap<String, GgufValue>, tensors: &[GgufTensorInfo]) -> Result<ModelConfig, Error> {
        let mapped = config_json(metadata, tensors)?;
        ModelConfig::from_json(&Value::Object(mapped.config).to_string())
            .map_err(|error| in_gguf_terms(error, &mapped.sources))
    }

    fn message(metadata: &BTreeMap<String, GgufValue>, tensors: &[GgufTensorInfo]) -> String {
        read(metadata, tensors).unwrap_err().to_string()
    }

    #[test]
    fn float_keys_keep_their_decimal_values() {
        let (mut metadata, tensors) = llama();
        metadata.insert("llama.rope.freq_base".to_owned(), GgufValue::F32(500_000.0));
        metadata.insert(
            "llama.attention.layer_norm_rms_epsilon".to_owned(),
            GgufValue::F32(1e-5),
        );
        let mapped = config_json(&metadata, &tensors).unwrap();
        assert_eq!(mapped.config["rms_norm_eps"], serde_json::json!(1e-5));
        let cfg = read(&metadata, &tensors).unwrap();
        assert_eq!(cfg.text.rope_theta, Some(500_000.0));
        assert_eq!(cfg.text.num_kv_heads, 2);
        assert_eq!(cfg.text.head_dim, 16);
        assert!(!cfg.text.tie_word_embeddings);
    }

    #[test]
    fn absent_kv_heads_are_as_many_as_query_heads() {
        for arch in ["llama", "qwen2", "gemma", "phi3"] {
            let (metadata, tensors) = llama();
            let metadata: BTreeMap<_, _> = metadata
                .into_iter()
                .filter(|(k, _)| k != "llama.attention.head_count_kv")
                .map(|(k, v)| match (k.strip_prefix("llama."), v) {
                    (Some(rest), v) => (format!("{arch}.{rest}"), v),
                    (None, _) if k == "general.architecture" => (k, GgufValue::String(arch.to_owned())),
                    (None, v) => (k, v),
                })
                .collect();
            let cfg = read(&metadata, &tensors).unwrap();
            assert_eq!(cfg.text.num_kv_heads, 4, "{arch}");
            // Gemma's config class would default to 256.
            assert_eq!(cfg.text.head_dim, 16, "{arch}");
        }
    }

    #[test]
    fn a_sliding_window_is_kept_and_mistral_stays_llama() {
        let (mut metadata, tensors) = llama();
        metadata.insert("llama.attention.sliding_window".to_owned(), GgufValue::U32(4096));
        let cfg = read(&metadata, &tensors).unwrap();
        assert_eq!(cfg.architecture, Architecture::Llama);
        assert_eq!(cfg.text.sliding_window, Some(4096));
    }

    #[test]
    fn biases_come_from_the_first_block_tensors() {
        let (metadata, mut tensors) = llama();
        assert_eq!(read(&metadata, &tensors).unwrap().text.biases, Default::default());
        tensors.push(tensor("blk.0.attn_q.bias", &[64]));
        let biases = read(&metadata, &tensors).unwrap().text.biases;
        assert!(biases.qkv && biases.attn_output && !biases.mlp);
    }

    #[test]
    fn the_vocabulary_falls_back_to_keys() {
        let (mut metadata, _) = llama();
        let no_tensors: &[GgufTensorInfo] = &[];
        assert_eq!(
            message(&metadata, no_tensors),
            "the GGUF header has no `token_embd.weight` tensor, no `llama.vocab_size` and no \
             `tokenizer.ggml.tokens`, so the vocabulary size is unknown"
        );
        // A long array keeps its length though only its first items are kept.
        let tokens = GgufArray {
            item_type: GgufValueType::String,
            len: 32_000,
            items: vec![GgufValue::String("<unk>".to_owned())],
        };
        metadata.insert("tokenizer.ggml.tokens".to_owned(), GgufValue::Array(tokens));
        assert_eq!(read(&metadata, no_tensors).unwrap().text.vocab_size, 32_000);
        metadata.insert("llama.vocab_size".to_owned(), GgufValue::U32(32_064));
        assert_eq!(read(&metadata, no_tensors).unwrap().text.vocab_size, 32_064);
        let (_, tensors) = llama();
        assert_eq!(read(&metadata, &tensors).unwrap().text.vocab_size, 100);

        let flat = [tensor("token_embd.weight", &[6400])];
        assert_eq!(
            message(&metadata, &flat),
            "`token_embd.weight` in the GGUF header is a tensor of dimensions [6400]; expected two \
             dimensions, [embedding_length, vocabulary]"
        );
    }

    #[test]
    fn errors_of_the_config_path_name_the_gguf_key() {
        let (mut metadata, tensors) = llama();
        metadata.insert("llama.block_count".to_owned(), GgufValue::String("32".to_owned()));
        assert_eq!(
            message(&metadata, &tensors),
            "`llama.block_count` in the GGUF header is \"32\"; expected a positive integer"
        );
        let (mut metadata, tensors) = llama();
        metadata.insert("llama.attention.head_count_kv".to_owned(), GgufValue::U32(3));
        assert_eq!(
            message(&metadata, &tensors),
            "`llama.attention.head_count_kv` in the GGUF header is 3; expected a divisor of the number of \
             attention heads"
        );
        let (mut metadata, tensors) = llama();
        metadata.insert("llama.rope.freq_base".to_owned(), GgufValue::F32(f32::NAN));
        assert_eq!(
            message(&metadata, &tensors),
            "`llama.rope.freq_base` in the GGUF header is NaN; expected a finite number"
        );
    }

    #[test]
    fn keys_and_values_must_share_a_head_width() {
        let (mut metadata, tensors) = llama();
        metadata.insert("llama.attention.key_length".to_owned(), GgufValue::U32(32));
        assert_eq!(read(&metadata, &tensors).unwrap().text.head_dim, 32);
        metadata.insert("llama.attention.value_length".to_owned(), GgufValue::U32(16));
        assert_eq!(
            message(&metadata, &tensors),
            "`llama.attention.value_length` in the GGUF header is 16; expected 32, as \
             `llama.attention.key_length`: Skein sizes models whose keys and values have one head width"
        );
    }

    #[test]
    fn experts_outside_llama_are_refused() {
        let (metadata, tensors) = llama();
        let mut metadata: BTreeMap<_, _> = metadata
            .into_iter()
            .map(|(k, v)| match k.strip_prefix("llama.") {
                Some(rest) => (format!("qwen2.{rest}"), v),
                None if k == "general.architecture" => (k, GgufValue::String("qwen2".to_owned())),
                None => (k, v),
            })
            .collect();
        metadata.insert("qwen2.expert_count".to_owned(), GgufValue::U32(0));
        assert_eq!(read(&metadata, &tensors).unwrap().architecture, Architecture::Qwen2);
        metadata.insert("qwen2.expert_count".to_owned(), GgufValue::U32(60));
        assert_eq!(
            message(&metadata, &tensors),
            "`qwen2.expert_count` in the GGUF header is 60, but Skein sizes GGUF mixtures of experts only \
             for the llama architecture (Mixtral)"
        );
    }
}
