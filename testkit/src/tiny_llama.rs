//! A tiny, complete Llama-architecture checkpoint, generated deterministically, that the
//! built-in engine can load and run in milliseconds: `config.json` (`LlamaForCausalLM`,
//! 2 layers, hidden 64, 4 heads, 2 KV heads), `model.safetensors` (F32 weights from a
//! fixed-seed generator), a byte-level BPE `tokenizer.json` that round-trips any text,
//! `tokenizer_config.json` with a ChatML chat template, and `generation_config.json`.
//!
//! The weights are random, so the model says nothing sensible; it says the same thing
//! every time, which is what the engine's tests need.

use std::path::Path;

use serde_json::{Value, json};
use skein_model_registry::{ModelConfig, SafetensorsDtype};

use crate::mock_hub::MockRepo;
use crate::tensors::{Storage, checkpoint_tensors};

/// The repository id [`repo`] is served under.
pub const REPO_ID: &str = "skein-test/tiny-llama";

/// The special tokens, in id order after the byte alphabet and the merges.
pub const SPECIAL_TOKENS: [&str; 3] = ["<|begin_of_text|>", "<|im_start|>", "<|im_end|>"];

/// The ChatML template of `tokenizer_config.json`.
pub const CHAT_TEMPLATE: &str = "{{ bos_token }}{% for message in messages %}\
{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}\
{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

/// Pairs merged by the BPE model, in rank order, in the byte-level alphabet (`Ġ` is a
/// space).
const MERGES: [(&str, &str); 42] = [
    ("Ġ", "t"),
    ("h", "e"),
    ("Ġt", "he"),
    ("i", "n"),
    ("Ġ", "a"),
    ("e", "r"),
    ("o", "n"),
    ("Ġ", "s"),
    ("r", "e"),
    ("a", "t"),
    ("e", "n"),
    ("o", "u"),
    ("Ġ", "w"),
    ("i", "s"),
    ("Ġ", "h"),
    ("l", "l"),
    ("Ġ", "i"),
    ("Ġ", "o"),
    ("Ġ", "c"),
    ("in", "g"),
    ("Ġ", "b"),
    ("o", "r"),
    ("e", "s"),
    ("Ġ", "f"),
    ("a", "n"),
    ("Ġ", "m"),
    ("l", "o"),
    ("Ġ", "d"),
    ("Ġ", "p"),
    ("Ġ", "y"),
    ("Ġy", "ou"),
    ("Ġ", "n"),
    ("Ġ", "l"),
    ("Ġ", "e"),
    ("e", "d"),
    ("n", "d"),
    ("Ġa", "nd"),
    ("Ġ", "g"),
    ("i", "t"),
    ("Ġ", "r"),
    ("a", "r"),
    ("Ġ", "T"),
];

/// The vocabulary size: 256 bytes, the merges, the special tokens.
pub const VOCAB_SIZE: u64 = 256 + MERGES.len() as u64 + SPECIAL_TOKENS.len() as u64;

/// The id of special token `token`.
pub fn special_id(token: &str) -> u32 {
    let index = SPECIAL_TOKENS
        .iter()
        .position(|t| *t == token)
        .expect("a special token of the tiny model");
    (256 + MERGES.len() + index) as u32
}

/// Every file of the checkpoint, by name.
pub fn files() -> Vec<(String, Vec<u8>)> {
    vec![
        ("config.json".to_owned(), to_json(&config())),
        ("generation_config.json".to_owned(), to_json(&generation_config())),
        ("model.safetensors".to_owned(), safetensors(&config())),
        ("tokenizer.json".to_owned(), to_json(&tokenizer())),
        ("tokenizer_config.json".to_owned(), to_json(&tokenizer_config())),
    ]
}

/// The checkpoint as a mock-hub repository ([`REPO_ID`]).
pub fn repo() -> MockRepo {
    files()
        .into_iter()
        .fold(MockRepo::new(REPO_ID), |repo, (name, bytes)| repo.file(&name, bytes))
}

/// Writes [`files`] into `dir`.
pub fn write_dir(dir: &Path) -> std::io::Result<()> {
    for (name, bytes) in files() {
        std::fs::write(dir.join(name), bytes)?;
    }
    Ok(())
}

/// `config.json`.
pub fn config() -> Value {
    json!({
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": VOCAB_SIZE,
        "max_position_embeddings": 512,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "tie_word_embeddings": false,
        "bos_token_id": special_id("<|begin_of_text|>"),
        "eos_token_id": special_id("<|im_end|>"),
        "torch_dtype": "float32",
        "hidden_act": "silu",
    })
}

fn generation_config() -> Value {
    json!({
        "bos_token_id": special_id("<|begin_of_text|>"),
        "eos_token_id": [special_id("<|im_end|>")],
    })
}

fn tokenizer_config() -> Value {
    json!({
        "bos_token": SPECIAL_TOKENS[0],
        "eos_token": SPECIAL_TOKENS[2],
        "chat_template": CHAT_TEMPLATE,
        "model_max_length": 512,
        "tokenizer_class": "PreTrainedTokenizerFast",
    })
}

fn to_json(value: &Value) -> Vec<u8> {
    serde_json::to_vec_pretty(value).expect("JSON values serialize")
}

/// GPT-2's reversible map from bytes to printable characters, which byte-level BPE
/// vocabularies are written in.
pub fn byte_char(byte: u8) -> char {
    let printable = |b: u8| (b'!'..=b'~').contains(&b) || (0xA1..=0xAC).contains(&b) || b >= 0xAE;
    if printable(byte) {
        return char::from(byte);
    }
    let shifted = (0..byte).filter(|b| !printable(*b)).count() as u32;
    char::from_u32(256 + shifted).expect("below U+0200")
}

/// `tokenizer.json`: a byte-level BPE model as the `tokenizers` library writes one.
pub fn tokenizer() -> Value {
    let mut vocab = serde_json::Map::new();
    for byte in 0..=255u8 {
        vocab.insert(byte_char(byte).to_string(), json!(byte));
    }
    for (rank, (a, b)) in MERGES.iter().enumerate() {
        vocab.insert(format!("{a}{b}"), json!(256 + rank));
    }
    let merges: Vec<String> = MERGES.iter().map(|(a, b)| format!("{a} {b}")).collect();
    let added: Vec<Value> = SPECIAL_TOKENS
        .iter()
        .map(|token| {
            json!({
                "id": special_id(token), "content": token, "single_word": false, "lstrip": false,
                "rstrip": false, "normalized": false, "special": true,
            })
        })
        .collect();
    let byte_level = json!({ "type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true });
    json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": byte_level,
        "post_processor": null,
        "decoder": byte_level,
        "model": {
            "type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
            "ignore_merges": false, "vocab": vocab, "merges": merges,
        },
    })
}

/// `model.safetensors`: the tensors `transformers` writes for [`config`], F32, filled
/// from a fixed-seed generator (norms are ones).
pub fn safetensors(config: &Value) -> Vec<u8> {
    let parsed = ModelConfig::from_json(&config.to_string()).expect("the tiny config parses");
    let tensors = checkpoint_tensors(&parsed, Storage::Dense(SafetensorsDtype::F32));
    let (mut bytes, total) = crate::safetensors_prefix(&tensors);
    let mut rng = SplitMix64(0x5EED_71A7_11A3);
    for (name, _, shape) in &tensors {
        let count: u64 = shape.iter().product();
        let fan_in = *shape.last().expect("tensors have a shape") as f32;
        let scale = if name.ends_with("norm.weight") {
            0.0
        } else if name.contains("embed_tokens") {
            1.0
        } else {
            1.5 / fan_in.sqrt()
        };
        for _ in 0..count {
            let value = if scale == 0.0 { 1.0 } else { rng.uniform() * scale };
            bytes.extend_from_slice(&value.to_le_bytes());
        }
    }
    assert_eq!(bytes.len() as u64, total);
    bytes
}

/// A small deterministic generator (SplitMix64).
struct SplitMix64(u64);

impl SplitMix64 {
    /// Uniform in [-1, 1).
    fn uniform(&mut self) -> f32 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        ((z >> 40) as f32 / (1u64 << 23) as f32) - 1.0
    }
}
