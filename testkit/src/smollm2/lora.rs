//! A GGUF LoRA adapter of the SmolLM2 GGUF, as llama.cpp's `convert_lora_to_gguf.py`
//! writes one: `general.type = adapter`, `adapter.type = lora`, `adapter.lora.alpha`,
//! and for the query and value projections of every layer an `A` of GGUF dimensions
//! `[in, r]` and a `B` of `[r, out]`, in F32. Its values (a fixed pseudo-random
//! sequence) are large: with it applied, greedy decoding says something else than the
//! base model, so a test can tell whether a request got the adapter.

use std::fs::File;

use candle_core::quantized::gguf_file::Content;
use skein_model_registry::GgmlType;

use crate::mock_hub::MockRepo;
use crate::{Kv, gguf_prefix};

/// The repository id of [`lora_repo`].
pub const LORA_REPO_ID: &str = "skein-test/SmolLM2-135M-Instruct-scrambled-LoRA";
/// The adapter's file in [`lora_repo`].
pub const LORA_FILE: &str = "SmolLM2-135M-Instruct-scrambled-LoRA.F32.gguf";
/// Its rank (and `adapter.lora.alpha`: scale 1).
pub const LORA_RANK: u64 = 8;

/// The adapter's file: header and tensor data.
pub fn lora_gguf() -> Vec<u8> {
    let path = super::gguf_path();
    let mut file = File::open(&path).unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
    let content = Content::read(&mut file).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    let mut targets: Vec<(String, u64, u64)> = content
        .tensor_infos
        .iter()
        .filter(|(name, _)| name.ends_with(".attn_q.weight") || name.ends_with(".attn_v.weight"))
        .map(|(name, info)| {
            // candle lists a tensor's dimensions outermost first: (out, in).
            let dims = info.shape.dims();
            (name.clone(), dims[1] as u64, dims[0] as u64)
        })
        .collect();
    targets.sort();
    assert!(!targets.is_empty(), "the SmolLM2 GGUF has no attention projections");
    let tensors: Vec<(String, Vec<u64>, GgmlType)> = targets
        .iter()
        .flat_map(|(name, inputs, outputs)| {
            [
                (format!("{name}.lora_a"), vec![*inputs, LORA_RANK], GgmlType::F32),
                (format!("{name}.lora_b"), vec![LORA_RANK, *outputs], GgmlType::F32),
            ]
        })
        .collect();
    let kvs = [
        ("general.architecture", Kv::Str("llama".to_owned())),
        ("general.type", Kv::Str("adapter".to_owned())),
        (
            "general.name",
            Kv::Str("SmolLM2-135M-Instruct scrambled LoRA".to_owned()),
        ),
        ("adapter.type", Kv::Str("lora".to_owned())),
        ("adapter.lora.alpha", Kv::F32(LORA_RANK as f32)),
    ];
    let (header, total) = gguf_prefix(&kvs, &tensors);
    let mut out = header;
    let mut state: u64 = 0x5eed_1ea5_c0ff_ee00;
    for (_, ne, _) in &tensors {
        pad32(&mut out);
        for _ in 0..ne.iter().product::<u64>() {
            // A 64-bit LCG's top bits, in [-0.5, 0.5).
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            let value = (state >> 40) as f32 / (1u64 << 24) as f32 - 0.5;
            out.extend(value.to_le_bytes());
        }
    }
    pad32(&mut out);
    assert_eq!(out.len() as u64, total, "the adapter's layout");
    out
}

fn pad32(out: &mut Vec<u8>) {
    out.resize(out.len().div_ceil(32) * 32, 0);
}

/// The adapter as the hub holds a GGUF LoRA repository: [`LORA_FILE`], a model card
/// naming its base, `.gitattributes` (LFS) and the hub's tags.
pub fn lora_repo() -> MockRepo {
    MockRepo::new(LORA_REPO_ID)
        .file(LORA_FILE, lora_gguf())
        .file(
            "README.md",
            format!(
                "---\nbase_model: {}\ntags: [gguf, lora]\n---\n# SmolLM2-135M-Instruct scrambled LoRA\n",
                super::GGUF_REPO_ID
            ),
        )
        .file(".gitattributes", "*.gguf filter=lfs diff=lfs merge=lfs -text\n")
        .tags(&["gguf", "lora", "base_model:adapter:HuggingFaceTB/SmolLM2-135M-Instruct"])
}
