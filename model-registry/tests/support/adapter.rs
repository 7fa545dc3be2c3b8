//! LoRA adapter repositories for the mock hub: PEFT adapters (`adapter_config.json` and
//! the safetensors header of `adapter_model.safetensors`) and llama.cpp GGUF adapters,
//! shaped like real ones.
//!
//! Only the adapter tests use these, while every test crate that includes `support`
//! compiles them: hence the `dead_code` allowance.
#![allow(dead_code)]

use serde_json::json;
use skein_model_registry::{GgmlType, SafetensorsDtype};

use super::{Kv, LlamaDims, Tensor, gguf_prefix};

/// A Llama projection PEFT adapts: its name in `transformers`, its name in llama.cpp's
/// GGUF, and its (in, out) widths for the dimensions `d`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Proj {
    Q,
    K,
    V,
    O,
    Gate,
    Up,
    Down,
}

impl Proj {
    pub fn peft(self) -> &'static str {
        match self {
            Proj::Q => "self_attn.q_proj",
            Proj::K => "self_attn.k_proj",
            Proj::V => "self_attn.v_proj",
            Proj::O => "self_attn.o_proj",
            Proj::Gate => "mlp.gate_proj",
            Proj::Up => "mlp.up_proj",
            Proj::Down => "mlp.down_proj",
        }
    }

    pub fn gguf(self) -> &'static str {
        match self {
            Proj::Q => "attn_q",
            Proj::K => "attn_k",
            Proj::V => "attn_v",
            Proj::O => "attn_output",
            Proj::Gate => "ffn_gate",
            Proj::Up => "ffn_up",
            Proj::Down => "ffn_down",
        }
    }

    /// (in_features, out_features).
    pub fn widths(self, d: LlamaDims) -> (u64, u64) {
        let kv = d.hidden / d.heads * d.kv_heads;
        match self {
            Proj::Q | Proj::O => (d.hidden, d.hidden),
            Proj::K | Proj::V => (d.hidden, kv),
            Proj::Gate | Proj::Up => (d.hidden, d.ffn),
            Proj::Down => (d.ffn, d.hidden),
        }
    }
}

/// The tensors PEFT's `save_pretrained` writes for a LoRA of `rank` on `projs` of every
/// layer: `base_model.model.model.layers.N.<proj>.lora_A.weight` `[r, in]` and
/// `lora_B.weight` `[out, r]`, in `dtype`.
pub fn peft_lora_tensors(d: LlamaDims, rank: u64, projs: &[Proj], dtype: SafetensorsDtype) -> Vec<Tensor> {
    let mut tensors = Vec::new();
    for layer in 0..d.layers {
        for &proj in projs {
            let (inp, out) = proj.widths(d);
            let module = format!("base_model.model.model.layers.{layer}.{}", proj.peft());
            tensors.push((format!("{module}.lora_A.weight"), dtype, vec![rank, inp]));
            tensors.push((format!("{module}.lora_B.weight"), dtype, vec![out, rank]));
        }
    }
    tensors
}

/// An `adapter_config.json` as PEFT 0.13 writes it for a causal-LM LoRA.
pub fn adapter_config(base: &str, rank: u64, alpha: u64, targets: &[&str]) -> Vec<u8> {
    let config = json!({
        "alpha_pattern": {},
        "auto_mapping": null,
        "base_model_name_or_path": base,
        "bias": "none",
        "fan_in_fan_out": false,
        "inference_mode": true,
        "init_lora_weights": true,
        "layer_replication": null,
        "layers_pattern": null,
        "layers_to_transform": null,
        "loftq_config": {},
        "lora_alpha": alpha,
        "lora_dropout": 0.05,
        "megatron_config": null,
        "megatron_core": "megatron.core",
        "modules_to_save": null,
        "peft_type": "LORA",
        "r": rank,
        "rank_pattern": {},
        "revision": null,
        "target_modules": targets,
        "task_type": "CAUSAL_LM",
        "use_dora": false,
        "use_rslora": false
    });
    serde_json::to_vec_pretty(&config).unwrap()
}

/// A llama.cpp LoRA adapter GGUF as `convert_lora_to_gguf.py` writes one: the base
/// architecture, `general.type = "adapter"`, `adapter.type = "lora"`,
/// `adapter.lora.alpha` (an f32), and per adapted tensor `blk.N.<name>.weight.lora_a`
/// (GGUF dimensions `[in, r]`) and `.lora_b` (`[r, out]`). Returns the header and the
/// file's full length.
pub fn gguf_lora(d: LlamaDims, rank: u64, alpha: f32, projs: &[Proj], ggml_type: GgmlType) -> (Vec<u8>, u64) {
    let kvs = [
        ("general.architecture", Kv::Str("llama".to_owned())),
        ("general.type", Kv::Str("adapter".to_owned())),
        ("adapter.type", Kv::Str("lora".to_owned())),
        (
            "general.base_model.0.repo_url",
            Kv::Str("https://huggingface.co/meta-llama/Meta-Llama-3-8B".to_owned()),
        ),
    ];
    let mut tensors = Vec::new();
    for layer in 0..d.layers {
        for &proj in projs {
            let (inp, out) = proj.widths(d);
            let base = format!("blk.{layer}.{}.weight", proj.gguf());
            tensors.push((format!("{base}.lora_a"), vec![inp, rank], ggml_type));
            tensors.push((format!("{base}.lora_b"), vec![rank, out], ggml_type));
        }
    }
    let (prefix, len) = gguf_prefix(&kvs, &tensors);
    with_f32_kv(prefix, len, "adapter.lora.alpha", alpha)
}

/// GGUF data starts at the header's end padded to this (the default alignment).
const GGUF_ALIGN: u64 = 32;

/// Adds an f32 metadata pair to a GGUF header written by `gguf_prefix` (whose `Kv` has
/// no f32 scalar): the pair goes first, the count goes up by one, and the file's
/// length moves with the padded header. Tensor offsets are relative to the data
/// section, so they stay.
pub fn with_f32_kv(mut prefix: Vec<u8>, len: u64, key: &str, value: f32) -> (Vec<u8>, u64) {
    let pad = |n: u64| n.div_ceil(GGUF_ALIGN) * GGUF_ALIGN;
    let data = len - pad(prefix.len() as u64);
    let count = u64::from_le_bytes(prefix[16..24].try_into().unwrap());
    prefix[16..24].copy_from_slice(&(count + 1).to_le_bytes());
    let mut pair = (key.len() as u64).to_le_bytes().to_vec();
    pair.extend(key.as_bytes());
    pair.extend(6u32.to_le_bytes());
    pair.extend(value.to_le_bytes());
    prefix.splice(24..24, pair);
    let len = pad(prefix.len() as u64) + data;
    (prefix, len)
}
