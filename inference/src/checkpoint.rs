//! The model directory: which files make up the model, and whether every tensor the
//! architecture needs is there with the right shape and dtype. Only headers are read
//! here, so a truncated download, a missing tensor or a config from another model is a
//! clear error before candle (whose loaders panic on such input) sees the weights.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::Value;
use skein_model_registry::safetensors::{SafetensorsHeader, ShardIndex, header_len, parse_header};

use crate::Error;

/// The model families the engine runs from safetensors checkpoints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// `LlamaForCausalLM`.
    Llama,
    /// `MistralForCausalLM`.
    Mistral,
    /// `Qwen2ForCausalLM` (biases on the Q, K and V projections).
    Qwen2,
}

impl Family {
    /// The `model_type` of `config.json` for the family.
    pub fn model_type(self) -> &'static str {
        match self {
            Family::Llama => "llama",
            Family::Mistral => "mistral",
            Family::Qwen2 => "qwen2",
        }
    }
}

/// The files of a model, found and checked.
#[derive(Debug, Clone)]
pub(crate) struct ModelFiles {
    pub dir: PathBuf,
    pub weights: Weights,
    /// `tokenizer.json`; absent beside a GGUF file, whose metadata then holds it.
    pub tokenizer: Option<PathBuf>,
    /// `tokenizer_config.json`; absent beside a GGUF file, whose metadata then holds
    /// the chat template.
    pub tokenizer_config: Option<PathBuf>,
    pub generation_config: Option<PathBuf>,
}

/// The weights of a model.
#[derive(Debug, Clone)]
pub(crate) enum Weights {
    /// A `config.json` and its safetensors files, every tensor checked.
    Safetensors {
        family: Family,
        config_path: PathBuf,
        config: Value,
        dims: Dims,
        files: Vec<PathBuf>,
    },
    /// A GGUF Llama file (checked when loaded).
    Gguf { path: PathBuf },
}

/// The sizes of a decoder, from `config.json`.
#[derive(Debug, Clone, Copy, Deserialize)]
pub(crate) struct Dims {
    pub hidden_size: u64,
    pub intermediate_size: u64,
    pub num_hidden_layers: u64,
    pub num_attention_heads: u64,
    pub num_key_value_heads: Option<u64>,
    pub head_dim: Option<u64>,
    pub vocab_size: u64,
    pub max_position_embeddings: u64,
    #[serde(default)]
    pub tie_word_embeddings: bool,
}

impl Dims {
    fn kv_heads(&self) -> u64 {
        self.num_key_value_heads.unwrap_or(self.num_attention_heads)
    }

    fn head_dim(&self) -> u64 {
        self.head_dim
            .unwrap_or(self.hidden_size / self.num_attention_heads.max(1))
    }
}

const TOKENIZER_HELP: &str = "download the model's tokenizer files too (tokenizer.json, tokenizer_config.json)";

/// Finds the model's files under `model`: a Hugging Face snapshot directory, or a GGUF
/// file (or a directory holding one), with or without the tokenizer files beside it. Safetensors
/// checkpoints are checked tensor by tensor against `config.json`.
pub(crate) fn locate(model: &Path) -> Result<ModelFiles, Error> {
    let is_gguf = |path: &Path| path.extension().is_some_and(|ext| ext == "gguf");
    let (dir, gguf) = if model.is_file() && is_gguf(model) {
        let dir = model.parent().map_or_else(|| PathBuf::from("."), Path::to_path_buf);
        (dir, Some(model.to_path_buf()))
    } else {
        (model.to_path_buf(), None)
    };
    let entries = list_dir(&dir)?;
    let required = |file: &str| {
        let path = dir.join(file);
        if path.is_file() {
            Ok(path)
        } else {
            Err(Error::MissingFile {
                dir: dir.clone(),
                file: file.to_owned(),
                help: TOKENIZER_HELP,
            })
        }
    };
    let optional = |file: &str| Some(dir.join(file)).filter(|path| path.is_file());
    let generation_config = optional("generation_config.json");
    let config_path = dir.join("config.json");
    let safetensors: Vec<PathBuf> = entries
        .iter()
        .filter(|path| path.extension().is_some_and(|ext| ext == "safetensors"))
        .cloned()
        .collect();
    let gguf = gguf.or_else(|| {
        (safetensors.is_empty() || !config_path.is_file())
            .then(|| entries.iter().find(|path| is_gguf(path)).cloned())
            .flatten()
    });
    // A GGUF file carries its tokenizer and chat template in its metadata; the files
    // beside it win when present.
    let (tokenizer, tokenizer_config) = if gguf.is_some() {
        (optional("tokenizer.json"), optional("tokenizer_config.json"))
    } else {
        (
            Some(required("tokenizer.json")?),
            Some(required("tokenizer_config.json")?),
        )
    };
    let weights = match gguf {
        Some(path) => Weights::Gguf { path },
        None => {
            if !config_path.is_file() {
                return Err(Error::MissingFile {
                    dir,
                    file: "config.json".to_owned(),
                    help: "a model directory needs config.json and *.safetensors, or a *.gguf file",
                });
            }
            safetensors_weights(&dir, config_path, safetensors)?
        }
    };
    Ok(ModelFiles {
        dir,
        weights,
        tokenizer,
        tokenizer_config,
        generation_config,
    })
}

/// The directory's entries, sorted.
fn list_dir(dir: &Path) -> Result<Vec<PathBuf>, Error> {
    let read = |source| Error::Read {
        path: dir.to_path_buf(),
        source,
    };
    let mut entries = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(read)? {
        entries.push(entry.map_err(read)?.path());
    }
    entries.sort();
    Ok(entries)
}

/// Reads and parses a JSON file.
pub(crate) fn read_json(path: &Path, what: &'static str) -> Result<Value, Error> {
    let bytes = std::fs::read(path).map_err(|source| Error::Read {
        path: path.to_path_buf(),
        source,
    })?;
    serde_json::from_slice(&bytes).map_err(|source| Error::Json {
        path: path.to_path_buf(),
        what,
        source,
    })
}

/// The family `config.json` names, from `architectures[0]` or else `model_type`.
fn family(config_path: &Path, config: &Value) -> Result<Family, Error> {
    let architecture = config
        .get("architectures")
        .and_then(|list| list.get(0))
        .and_then(Value::as_str);
    let model_type = config.get("model_type").and_then(Value::as_str);
    match (architecture, model_type) {
        (Some("LlamaForCausalLM"), _) | (None, Some("llama")) => Ok(Family::Llama),
        (Some("MistralForCausalLM"), _) | (None, Some("mistral")) => Ok(Family::Mistral),
        (Some("Qwen2ForCausalLM"), _) | (None, Some("qwen2")) => Ok(Family::Qwen2),
        (found, model_type) => Err(Error::UnsupportedArchitecture {
            path: config_path.to_path_buf(),
            found: found.or(model_type).unwrap_or("unnamed").to_owned(),
        }),
    }
}

fn safetensors_weights(dir: &Path, config_path: PathBuf, found: Vec<PathBuf>) -> Result<Weights, Error> {
    let config = read_json(&config_path, "model config")?;
    let family = family(&config_path, &config)?;
    let dims = Dims::deserialize(&config).map_err(|source| Error::Json {
        path: config_path.clone(),
        what: "model config",
        source,
    })?;
    let index_path = dir.join(skein_model_registry::repo::SAFETENSORS_INDEX);
    let (files, location) = if index_path.is_file() {
        let bytes = std::fs::read(&index_path).map_err(|source| Error::Read {
            path: index_path.clone(),
            source,
        })?;
        let index = ShardIndex::parse(&bytes).map_err(|source| Error::Safetensors {
            path: index_path.clone(),
            source,
        })?;
        let files: Vec<PathBuf> = index.shard_files().iter().map(|file| dir.join(file)).collect();
        (files, index_path)
    } else {
        match found.as_slice() {
            [] => {
                return Err(Error::MissingFile {
                    dir: dir.to_path_buf(),
                    file: "model.safetensors".to_owned(),
                    help: "download the weights (*.safetensors) too",
                });
            }
            [single] => (found.clone(), single.clone()),
            _ => {
                return Err(Error::MissingFile {
                    dir: dir.to_path_buf(),
                    file: skein_model_registry::repo::SAFETENSORS_INDEX.to_owned(),
                    help: "a checkpoint of several safetensors files needs its shard index",
                });
            }
        }
    };
    let mut stored = BTreeMap::new();
    for file in &files {
        let header = read_header(file)?;
        for tensor in header.tensors() {
            stored.insert(tensor.name.clone(), (file.clone(), tensor.clone()));
        }
    }
    // As the candle implementations decide: Llama by the config, Qwen2 by the presence
    // of `lm_head.weight`, Mistral never ties.
    let tied = match family {
        Family::Llama => dims.tie_word_embeddings,
        Family::Qwen2 => !stored.contains_key("lm_head.weight"),
        Family::Mistral => false,
    };
    for (name, expected) in expected_tensors(family, &dims, tied) {
        let Some((path, tensor)) = stored.get(&name) else {
            return Err(Error::MissingTensor {
                location: location.clone(),
                tensor: name,
            });
        };
        if tensor.shape != expected {
            return Err(Error::TensorShape {
                path: path.clone(),
                tensor: name,
                expected,
                found: tensor.shape.clone(),
            });
        }
        if !matches!(tensor.dtype.as_str(), "F32" | "F16" | "BF16") {
            return Err(Error::TensorDtype {
                path: path.clone(),
                tensor: name,
                found: tensor.dtype.as_str().to_owned(),
            });
        }
    }
    Ok(Weights::Safetensors {
        family,
        config_path,
        config,
        dims,
        files,
    })
}

/// Reads a safetensors file's header and checks the file's length against it, so a
/// truncated download is caught here rather than by a panic in a loader.
fn read_header(path: &Path) -> Result<SafetensorsHeader, Error> {
    let io = |source| Error::Read {
        path: path.to_path_buf(),
        source,
    };
    let invalid = |source| Error::Safetensors {
        path: path.to_path_buf(),
        source,
    };
    let mut file = File::open(path).map_err(io)?;
    let file_len = file.metadata().map_err(io)?.len();
    let mut prefix = [0u8; 8];
    let read = file.read(&mut prefix).map_err(io)?;
    let len = header_len(prefix.get(..read).unwrap_or_default()).map_err(invalid)?;
    if len.saturating_add(8) > file_len {
        return Err(invalid(skein_model_registry::Error::SafetensorsFileSize {
            expected: len.saturating_add(8),
            found: file_len,
        }));
    }
    let mut header = vec![0u8; usize::try_from(len).unwrap_or(usize::MAX)];
    file.read_exact(&mut header).map_err(io)?;
    let parsed = parse_header(&header).map_err(invalid)?;
    parsed.check_file_len(len, file_len).map_err(invalid)?;
    Ok(parsed)
}

/// Every tensor the candle implementation of `family` loads, with its shape.
fn expected_tensors(family: Family, dims: &Dims, tied: bool) -> Vec<(String, Vec<u64>)> {
    let (h, ffn, vocab) = (dims.hidden_size, dims.intermediate_size, dims.vocab_size);
    let q = dims.num_attention_heads * dims.head_dim();
    let kv = dims.kv_heads() * dims.head_dim();
    let mut tensors = vec![("model.embed_tokens.weight".to_owned(), vec![vocab, h])];
    for layer in 0..dims.num_hidden_layers {
        let p = format!("model.layers.{layer}");
        tensors.push((format!("{p}.input_layernorm.weight"), vec![h]));
        tensors.push((format!("{p}.post_attention_layernorm.weight"), vec![h]));
        for (name, output) in [("q_proj", q), ("k_proj", kv), ("v_proj", kv)] {
            tensors.push((format!("{p}.self_attn.{name}.weight"), vec![output, h]));
            if family == Family::Qwen2 {
                tensors.push((format!("{p}.self_attn.{name}.bias"), vec![output]));
            }
        }
        tensors.push((format!("{p}.self_attn.o_proj.weight"), vec![h, q]));
        tensors.push((format!("{p}.mlp.gate_proj.weight"), vec![ffn, h]));
        tensors.push((format!("{p}.mlp.up_proj.weight"), vec![ffn, h]));
        tensors.push((format!("{p}.mlp.down_proj.weight"), vec![h, ffn]));
    }
    tensors.push(("model.norm.weight".to_owned(), vec![h]));
    if !tied {
        tensors.push(("lm_head.weight".to_owned(), vec![vocab, h]));
    }
    tensors
}
