//! The candle models behind one interface: feed tokens at a position, get the logits of
//! the next token. Each family keeps its own KV cache, cleared by [`Model::reset`].

use std::fs::File;
use std::path::Path;

use candle_core::quantized::gguf_file;
use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use candle_transformers::models::{llama, mistral, quantized_llama, qwen2};
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::Error;
use crate::checkpoint::{Family, Weights};
use crate::gguf_llama::GgufLlama;

/// A loaded model with its KV cache.
pub(crate) enum Model {
    Llama {
        model: llama::Llama,
        cache: llama::Cache,
        config: llama::Config,
        dtype: DType,
        device: Device,
    },
    Mistral(mistral::Model),
    Qwen2(qwen2::ModelForCausalLM),
    /// A GGUF Llama on a GPU: candle's `quantized_llama`.
    Gguf(quantized_llama::ModelWeights),
    /// A GGUF Llama on the CPU: our own kernels over the file's blocks.
    GgufCpu(Box<GgufLlama>),
}

/// A loaded model and the facts about it the engine needs.
pub(crate) struct Loaded {
    pub model: Model,
    /// Rows of the embedding: the largest token id plus one.
    pub vocab_size: usize,
    /// The longest sequence the model handles.
    pub context: usize,
}

fn candle(action: impl FnOnce() -> String) -> impl FnOnce(candle_core::Error) -> Error {
    move |source| Error::Candle {
        action: action(),
        source,
    }
}

fn config_as<T: DeserializeOwned>(path: &Path, config: &Value) -> Result<T, Error> {
    T::deserialize(config).map_err(|source| Error::Json {
        path: path.to_path_buf(),
        what: "model config for this architecture",
        source,
    })
}

/// Loads checked weights onto `device`: F32 on the CPU (candle's fastest CPU path),
/// the checkpoint's own dtype elsewhere.
pub(crate) fn load(weights: &Weights, device: &Device) -> Result<Loaded, Error> {
    match weights {
        Weights::Safetensors {
            family,
            config_path,
            config,
            dims,
            files,
            ..
        } => {
            let dtype = if device.is_cpu() {
                DType::F32
            } else {
                stored_dtype(config)
            };
            let action = || format!("load the weights of `{}`", config_path.display());
            // SAFETY: the files are memory-mapped only while the tensors are copied out
            // of them, and nothing in this process writes them; a model directory (a
            // Hugging Face cache snapshot) is not modified in place by its owners.
            let vb = unsafe { VarBuilder::from_mmaped_safetensors(files, dtype, device) }.map_err(candle(action))?;
            let model = match family {
                Family::Llama => {
                    let config = config_as::<llama::LlamaConfig>(config_path, config)?.into_config(false);
                    let cache = llama::Cache::new(true, dtype, &config, device).map_err(candle(action))?;
                    let model = llama::Llama::load(vb, &config).map_err(candle(action))?;
                    Model::Llama {
                        model,
                        cache,
                        config,
                        dtype,
                        device: device.clone(),
                    }
                }
                Family::Mistral => {
                    let config = config_as::<mistral::Config>(config_path, config)?;
                    Model::Mistral(mistral::Model::new(&config, vb).map_err(candle(action))?)
                }
                Family::Qwen2 => {
                    let config = config_as::<qwen2::Config>(config_path, config)?;
                    Model::Qwen2(qwen2::ModelForCausalLM::new(&config, vb).map_err(candle(action))?)
                }
            };
            Ok(Loaded {
                model,
                vocab_size: usize::try_from(dims.vocab_size).unwrap_or(usize::MAX),
                context: usize::try_from(dims.max_position_embeddings).unwrap_or(usize::MAX),
            })
        }
        Weights::Gguf { path } => load_gguf(path, device),
    }
}

/// The dtype `torch_dtype` names, F16 when absent or unknown.
fn stored_dtype(config: &Value) -> DType {
    match config.get("torch_dtype").and_then(Value::as_str) {
        Some("float32") => DType::F32,
        Some("bfloat16") => DType::BF16,
        _ => DType::F16,
    }
}

/// The metadata keys `quantized_llama` reads without a default.
const GGUF_REQUIRED_KEYS: [&str; 6] = [
    "llama.attention.head_count",
    "llama.attention.head_count_kv",
    "llama.block_count",
    "llama.embedding_length",
    "llama.rope.dimension_count",
    "llama.attention.layer_norm_rms_epsilon",
];

/// Reads a GGUF file's metadata, checks every tensor `quantized_llama` loads is there
/// and inside the file, then loads it.
fn load_gguf(path: &Path, device: &Device) -> Result<Loaded, Error> {
    let gguf_error = |detail: String| Error::Gguf {
        path: path.to_path_buf(),
        detail,
    };
    let mut file = File::open(path).map_err(|source| Error::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let file_len = file
        .metadata()
        .map_err(|source| Error::Read {
            path: path.to_path_buf(),
            source,
        })?
        .len();
    let content =
        gguf_file::Content::read(&mut file).map_err(|source| gguf_error(format!("unreadable header ({source})")))?;
    match content.metadata.get("general.architecture").map(|v| v.to_string()) {
        Some(Ok(arch)) if arch == "llama" => {}
        Some(Ok(arch)) => {
            return Err(gguf_error(format!(
                "architecture `{arch}`, but only `llama` is supported"
            )));
        }
        _ => return Err(gguf_error("no `general.architecture`".to_owned())),
    }
    for key in GGUF_REQUIRED_KEYS {
        if !content.metadata.contains_key(key) {
            return Err(gguf_error(format!("metadata key `{key}` is missing")));
        }
    }
    let number = |key: &str| {
        content
            .metadata
            .get(key)
            .and_then(|value| value.to_u32().ok())
            .map(|n| n as usize)
            .ok_or_else(|| gguf_error(format!("metadata key `{key}` is not an integer")))
    };
    let layers = number("llama.block_count")?;
    let context = number("llama.context_length").unwrap_or(4096);
    let mut needed = vec!["token_embd.weight".to_owned(), "output_norm.weight".to_owned()];
    for layer in 0..layers {
        for name in [
            "attn_q",
            "attn_k",
            "attn_v",
            "attn_output",
            "attn_norm",
            "ffn_norm",
            "ffn_gate",
            "ffn_down",
            "ffn_up",
        ] {
            needed.push(format!("blk.{layer}.{name}.weight"));
        }
    }
    for name in &needed {
        if !content.tensor_infos.contains_key(name) {
            return Err(gguf_error(format!("tensor `{name}` is missing")));
        }
    }
    for (name, info) in &content.tensor_infos {
        let bytes = info.shape.elem_count() / info.ggml_dtype.block_size() * info.ggml_dtype.type_size();
        let end = content.tensor_data_offset + info.offset + bytes as u64;
        if end > file_len {
            return Err(gguf_error(format!(
                "tensor `{name}` ends at byte {end} but the file has {file_len} bytes; help: the file is truncated, download it again"
            )));
        }
    }
    let vocab_size = content
        .tensor_infos
        .get("token_embd.weight")
        .and_then(|info| info.shape.dims().first().copied())
        .unwrap_or(0);
    let model = if device.is_cpu() {
        Model::GgufCpu(Box::new(
            GgufLlama::load(&content, &mut file, candle_core::utils::get_num_threads()).map_err(gguf_error)?,
        ))
    } else {
        Model::Gguf(
            quantized_llama::ModelWeights::from_gguf(content, &mut file, device)
                .map_err(candle(|| format!("load the weights of `{}`", path.display())))?,
        )
    };
    Ok(Loaded {
        model,
        vocab_size,
        context,
    })
}

impl Model {
    /// Forgets the previous sequence.
    pub(crate) fn reset(&mut self) -> Result<(), Error> {
        match self {
            Model::Llama {
                cache,
                config,
                dtype,
                device,
                ..
            } => {
                *cache = llama::Cache::new(true, *dtype, config, device)
                    .map_err(candle(|| "reset the KV cache".to_owned()))?;
            }
            Model::Mistral(model) => model.clear_kv_cache(),
            Model::Qwen2(model) => model.clear_kv_cache(),
            Model::Gguf(model) => model.clear_kv_cache(),
            Model::GgufCpu(model) => model.clear_kv_cache(),
        }
        Ok(())
    }

    /// Runs `tokens` at positions `position..` and returns the F32 logits of the token
    /// after the last, as a vector over the vocabulary.
    pub(crate) fn forward(&mut self, tokens: &[u32], position: usize, device: &Device) -> Result<Tensor, Error> {
        if let Model::GgufCpu(model) = self {
            let action = || format!("run the model on {} tokens at position {position}", tokens.len());
            let logits = model.forward(tokens, position).map_err(|detail| Error::Candle {
                action: action(),
                source: candle_core::Error::Msg(detail),
            })?;
            return Tensor::new(logits, device).map_err(candle(action));
        }
        let mut run = || -> candle_core::Result<Tensor> {
            let input = Tensor::new(tokens, device)?.unsqueeze(0)?;
            let logits = match self {
                Model::Llama { model, cache, .. } => model.forward(&input, position, cache)?,
                Model::Mistral(model) => model.forward(&input, position)?,
                Model::Qwen2(model) => model.forward(&input, position)?,
                Model::Gguf(model) => model.forward(&input, position)?,
                Model::GgufCpu(_) => candle_core::bail!("the CPU GGUF model runs above"),
            };
            logits.flatten_all()?.to_dtype(DType::F32)
        };
        run().map_err(candle(|| {
            format!("run the model on {} tokens at position {position}", tokens.len())
        }))
    }
}
