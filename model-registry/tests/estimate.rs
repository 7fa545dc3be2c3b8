//! Memory estimates: the KV-cache formula, tensor-parallel validity, splits, headers
//! against computed sizes, and the reference fleet's fit answers that `docs/models.md`
//! quotes (snapshotted here so the figures are reproducible).

use std::fmt::Write as _;
use std::path::Path;

use serde_json::json;
use skein_model_registry::config::ModelConfig;
use skein_model_registry::estimate::{
    Component, Engine, EstimateRequest, KvDtype, Layout, ModelShape, Stages, TpInvalid, WeightGroups, WeightsOrigin,
    WeightsSource, estimate, fits, tp_degrees,
};
use skein_model_registry::params::kv_bytes_per_token;
use skein_model_registry::safetensors::parse_header;
use skein_model_registry::{Bytes, Error, GgufFileType, Quantization, SafetensorsHeader};

// --- Models and variants ---

fn config(name: &str) -> ModelConfig {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/configs")
        .join(format!("{name}.json"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    ModelConfig::from_json(&text).unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// deepseek-ai/deepseek-coder-33b-instruct: a Llama-shaped 33B model with the
/// dimensions the issue gives (hidden 7168, 62 layers, 56 heads, 8 KV heads, MLP
/// 19200, vocabulary 32256), untied.
const DEEPSEEK_CODER_33B: &str = r#"{
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 7168,
    "num_hidden_layers": 62, "num_attention_heads": 56, "num_key_value_heads": 8,
    "intermediate_size": 19200, "vocab_size": 32256, "max_position_embeddings": 16384,
    "rope_scaling": {"factor": 4.0, "type": "linear"}, "rope_theta": 100000,
    "tie_word_embeddings": false, "torch_dtype": "bfloat16", "transformers_version": "4.35.0"
}"#;

fn shape_of(name: &str) -> ModelShape {
    let cfg = if name == "deepseek-coder-33b" {
        ModelConfig::from_json(DEEPSEEK_CODER_33B).expect("valid")
    } else {
        config(name)
    };
    ModelShape::from_config(&cfg).expect("shape")
}

fn bf16() -> Quantization {
    Quantization::from_config(None, Some("bfloat16"))
        .expect("known")
        .expect("some")
}

fn awq() -> Quantization {
    let qc = json!({"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": true, "version": "gemm"});
    Quantization::from_config(Some(&qc), None)
        .expect("known")
        .expect("some")
}

fn gptq() -> Quantization {
    let qc = json!({"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": true});
    Quantization::from_config(Some(&qc), None)
        .expect("known")
        .expect("some")
}

fn q4_k_m() -> Quantization {
    Quantization::from_gguf_file_type(GgufFileType::Q4_K_M)
}

fn computed(shape: &ModelShape, q: Quantization) -> WeightGroups {
    WeightGroups::resolve(shape, WeightsSource::Computed(q)).expect("computed")
}

fn run(shape: &ModelShape, weights: &WeightGroups, request: &EstimateRequest) -> skein_model_registry::Estimate {
    estimate(shape, weights, request).unwrap_or_else(|e| panic!("{e}"))
}

// --- KV cache ---

#[test]
fn kv_bytes_per_token_equal_the_formula_for_gqa_moe_and_mqa() {
    let cases = [
        // 2 × layers × kv_heads × head_dim × 2 bytes (bf16).
        ("meta-llama--Meta-Llama-3-8B", 2 * 32 * 8 * 128 * 2, 131_072),
        ("mistralai--Mixtral-8x7B-v0.1", 2 * 32 * 8 * 128 * 2, 131_072),
        ("tiiuae--falcon-7b", 2 * 32 * 64 * 2, 8_192),
        ("deepseek-coder-33b", 2 * 62 * 8 * 128 * 2, 253_952),
    ];
    for (name, formula, literal) in cases {
        assert_eq!(formula, literal, "{name}");
        let shape = shape_of(name);
        let e = run(
            &shape,
            &computed(&shape, bf16()),
            &EstimateRequest::new(Engine::VLLM, 4096),
        );
        assert_eq!(e.kv_dtype, KvDtype::Bf16);
        assert_eq!(e.kv_bytes_per_token.get(), formula, "{name}");
    }
    // The estimate and `params::kv_bytes_per_token` agree on every fixture.
    for entry in std::fs::read_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/configs")).unwrap() {
        let name = entry
            .unwrap()
            .file_name()
            .to_string_lossy()
            .trim_end_matches(".json")
            .to_owned();
        let cfg = config(&name);
        let shape = ModelShape::from_config(&cfg).unwrap();
        let e = run(
            &shape,
            &computed(&shape, bf16()),
            &EstimateRequest::new(Engine::VLLM, 64),
        );
        assert_eq!(e.kv_bytes_per_token, kv_bytes_per_token(&cfg, 2).unwrap(), "{name}");
    }
}

#[test]
fn kv_cache_scales_with_context_sequences_and_dtype() {
    let shape = shape_of("meta-llama--Meta-Llama-3-8B");
    let weights = computed(&shape, q4_k_m());
    let kv = |request: EstimateRequest| run(&shape, &weights, &request).devices[0].kv_cache.get();
    let base = EstimateRequest::new(Engine::LLAMA_CPP, 8192);
    assert_eq!(kv(base.clone()), 131_072 * 8192);
    assert_eq!(kv(base.clone().with_concurrency(4)), 131_072 * 8192 * 4);
    // q8_0: 34 bytes per 32 values, so a 1024-wide K row takes 1088 bytes.
    assert_eq!(kv(base.clone().with_kv_dtype(KvDtype::Q8_0)), 2 * 32 * 1088 * 8192);
    assert_eq!(kv(base.clone().with_kv_dtype(KvDtype::Q4_0)), 2 * 32 * 576 * 8192);
    // llama.cpp pads its cache to 256 cells, vLLM to 16-token blocks.
    assert_eq!(kv(EstimateRequest::new(Engine::LLAMA_CPP, 1000)), 131_072 * 1024);
    let bf = computed(&shape, bf16());
    let vllm = run(
        &shape,
        &bf,
        &EstimateRequest::new(Engine::VLLM, 1000).with_concurrency(3),
    );
    assert_eq!(vllm.kv_tokens, 1008 * 3);
    assert_eq!(vllm.devices[0].kv_cache.get(), 131_072 * 1008 * 3);
    let fp8 = run(
        &shape,
        &bf,
        &EstimateRequest::new(Engine::VLLM, 1024).with_kv_dtype(KvDtype::Fp8),
    );
    assert_eq!(fp8.kv_bytes_per_token.get(), 65_536);
}

#[test]
fn a_sliding_window_bounds_vllm_caches_only() {
    let shape = shape_of("mistralai--Mistral-7B-v0.1");
    let weights = computed(&shape, bf16());
    let vllm = run(&shape, &weights, &EstimateRequest::new(Engine::VLLM, 32_768));
    assert_eq!(vllm.kv_tokens, 4096);
    // llama.cpp converts Mistral as a Llama without the window and caches everything.
    let gguf = computed(&shape, q4_k_m());
    let llama = run(&shape, &gguf, &EstimateRequest::new(Engine::LLAMA_CPP, 32_768));
    assert_eq!(llama.kv_tokens, 32_768);
    // Mixtral's window is null: no bound.
    let mixtral = shape_of("mistralai--Mixtral-8x7B-v0.1");
    let e = run(
        &mixtral,
        &computed(&mixtral, bf16()),
        &EstimateRequest::new(Engine::VLLM, 32_768).with_layout(Layout::tensor_parallel(4)),
    );
    assert_eq!(e.kv_tokens, 32_768);
}

// --- Tensor parallelism ---

fn valid_degrees(shape: &ModelShape, q: Option<&Quantization>, max: u64) -> Vec<u64> {
    tp_degrees(shape, q, max)
        .into_iter()
        .filter(|d| d.is_valid())
        .map(|d| d.degree)
        .collect()
}

#[test]
fn valid_tensor_parallel_degrees() {
    let llama3 = shape_of("meta-llama--Meta-Llama-3-8B");
    assert_eq!(valid_degrees(&llama3, None, 8), [1, 2, 4, 8]);
    assert_eq!(
        tp_degrees(&llama3, None, 3)[2].invalid,
        Some(TpInvalid::AttentionHeads { heads: 32 })
    );
    // 16 and 32 ranks replicate the 8 KV heads.
    assert_eq!(valid_degrees(&llama3, None, 32), [1, 2, 4, 8, 16, 32]);
    assert_eq!(
        valid_degrees(&shape_of("mistralai--Mixtral-8x7B-v0.1"), None, 8),
        [1, 2, 4, 8]
    );
    // Falcon-7B: 71 query heads (a prime), one KV head.
    let falcon = shape_of("tiiuae--falcon-7b");
    assert_eq!(valid_degrees(&falcon, None, 71), [1, 71]);
    // GPT-2: 12 heads, so 3 and 6 work and 8 does not.
    let gpt2 = shape_of("openai-community--gpt2");
    assert_eq!(valid_degrees(&gpt2, None, 12), [1, 2, 3, 4, 6, 12]);
    // Falcon-40B: 128 heads, 8 KV heads: 16 replicates.
    assert_eq!(
        valid_degrees(&shape_of("tiiuae--falcon-40b"), None, 16),
        [1, 2, 4, 8, 16]
    );
    // LLaVA-NeXT: the CLIP tower's 16 heads must divide too, which stops 32.
    let llava = shape_of("llava-hf--llava-v1.6-mistral-7b-hf");
    assert_eq!(valid_degrees(&llava, None, 32), [1, 2, 4, 8, 16]);
    assert_eq!(
        tp_degrees(&llava, None, 32)[31].invalid,
        Some(TpInvalid::VisionHeads { heads: 16 })
    );
    // Qwen2.5-7B: 28 heads, 4 KV heads: 7 divides the heads but not the KV heads.
    let qwen = shape_of("Qwen--Qwen2.5-7B-Instruct");
    assert_eq!(valid_degrees(&qwen, None, 8), [1, 2, 4]);
    let degrees = tp_degrees(&qwen, None, 8);
    assert_eq!(degrees[6].invalid, Some(TpInvalid::KvHeads { kv_heads: 4 }));
    assert_eq!(degrees[7].invalid, Some(TpInvalid::AttentionHeads { heads: 28 }));
}

#[test]
fn group_quantization_limits_the_degree() {
    // 19200 / 4 = 4800 input channels of down_proj per GPU: 37.5 groups of 128.
    let ds = shape_of("deepseek-coder-33b");
    assert_eq!(valid_degrees(&ds, None, 8), [1, 2, 4, 8]);
    assert_eq!(valid_degrees(&ds, Some(&awq()), 8), [1, 2]);
    assert_eq!(
        tp_degrees(&ds, Some(&awq()), 4)[3].invalid,
        Some(TpInvalid::QuantGroups {
            matrix: "down_proj",
            per_rank: 4800,
            group: 128
        })
    );
    let err = estimate(
        &ds,
        &computed(&ds, awq()),
        &EstimateRequest::new(Engine::VLLM, 4096).with_layout(Layout::tensor_parallel(4)),
    )
    .unwrap_err();
    assert_eq!(
        err.to_string(),
        "tensor parallelism of degree 4 is impossible for this model: down_proj would get 4800 input channels \
         per GPU, not a whole number of 128-wide quantization groups"
    );
}

#[test]
fn tensor_parallel_shards_sum_to_at_least_the_whole() {
    for (name, degrees) in [
        ("meta-llama--Meta-Llama-3-8B", &[2u64, 4, 8][..]),
        ("mistralai--Mixtral-8x7B-v0.1", &[2, 4, 8]),
        ("deepseek-coder-33b", &[2, 4, 8]),
        ("tiiuae--falcon-40b", &[2, 4, 8, 16]),
        ("llava-hf--llava-v1.6-mistral-7b-hf", &[2, 4]),
        ("Qwen--Qwen2.5-7B-Instruct", &[2, 4]),
    ] {
        let shape = shape_of(name);
        let weights = computed(&shape, bf16());
        let single = run(&shape, &weights, &EstimateRequest::new(Engine::VLLM, 4096));
        assert_eq!(
            single.devices[0].weights,
            weights.loaded().unwrap(),
            "{name}: one GPU holds everything"
        );
        for &k in degrees {
            let e = run(
                &shape,
                &weights,
                &EstimateRequest::new(Engine::VLLM, 4096).with_layout(Layout::tensor_parallel(k)),
            );
            assert_eq!(e.devices.len() as u64, k);
            let sum: u64 = e.devices.iter().map(|d| d.weights.get()).sum();
            let whole = single.devices[0].weights.get();
            assert!(sum >= whole, "{name} TP {k}: {sum} < {whole}");
            // Replicated norms and padding cost little: within 2 % of the whole (KV
            // heads replicated beyond their count cost more).
            if k <= shape.kv_heads {
                assert!(sum * 100 <= whole * 102, "{name} TP {k}: {sum} vs {whole}");
            }
            let kv: u64 = e.devices.iter().map(|d| d.kv_cache.get()).sum();
            let replicas = k.div_ceil(shape.kv_heads).max(1);
            assert_eq!(kv, single.devices[0].kv_cache.get() * replicas, "{name} TP {k} KV");
        }
    }
}

#[test]
fn vocab_parallel_embeddings_pad_to_64_rows() {
    // LLaVA's 32064 rows are a multiple of 64; Mistral-7B's 32000 too; GPT-2's 50257 pad
    // to 50304, so each of 4 ranks holds 12576 rows.
    let gpt2 = shape_of("openai-community--gpt2");
    let weights = computed(&gpt2, bf16());
    let e = run(
        &gpt2,
        &weights,
        &EstimateRequest::new(Engine::VLLM, 1024).with_layout(Layout::tensor_parallel(4)),
    );
    let item = e.devices[0].items.iter().find(|i| i.what == "token embedding").unwrap();
    assert_eq!(item.detail, "vocab-parallel: 12576 of 50257 rows (padded to 64)");
    assert_eq!(item.bytes.get(), (12576 * 768 * 2) as u64);
}

// --- Pipeline splits ---

#[test]
fn pipeline_split_of_a_33b_model_over_an_a100_and_a_4090() {
    let ds = shape_of("deepseek-coder-33b");
    let weights = computed(&ds, bf16());
    // Ratios as the GPUs' memory: 80 : 24.
    let e = run(
        &ds,
        &weights,
        &EstimateRequest::new(Engine::VLLM, 8192).with_layout(Layout::pipeline(vec![80, 24])),
    );
    let layers: Vec<_> = e.devices.iter().map(|d| (d.layers.start, d.layers.end)).collect();
    assert_eq!(layers, [(0, 48), (48, 62)]);
    let what = |d: usize| -> Vec<&str> { e.devices[d].items.iter().map(|i| i.what).collect() };
    assert!(what(0).contains(&"token embedding") && !what(0).contains(&"output projection"));
    assert!(what(1).contains(&"output projection") && !what(1).contains(&"token embedding"));
    // Every layer is somewhere exactly once, and each stage caches its own layers.
    let layer_bytes: u64 = e
        .devices
        .iter()
        .flat_map(|d| &d.items)
        .filter(|i| i.what == "decoder layers")
        .map(|i| i.bytes.get())
        .sum();
    assert_eq!(Bytes::new(layer_bytes), weights.layers_total().unwrap());
    assert_eq!(e.devices[0].kv_cache.get(), 48 * 4096 * 8192);
    assert_eq!(e.devices[1].kv_cache.get(), 14 * 4096 * 8192);

    // By memory: the split leaves both GPUs the same fraction of their room.
    let usable = [A100, RTX4090];
    let by_memory = run(
        &ds,
        &weights,
        &EstimateRequest::new(Engine::VLLM, 8192).with_layout(Layout::pipeline_by_memory(usable.to_vec())),
    );
    let report = fits(&by_memory, &usable).unwrap();
    assert!(report.fits, "{by_memory}\n{report}");
    let spare: Vec<f64> = report
        .devices
        .iter()
        .map(|d| d.spare.get() as f64 / d.usable.get() as f64)
        .collect();
    assert!((spare[0] - spare[1]).abs() < 0.05, "{spare:?}");
    insta::assert_snapshot!("pipeline_33b_a100_4090", by_memory.to_string());
}

#[test]
fn tensor_within_stages_and_pipeline_across() {
    let mixtral = shape_of("mistralai--Mixtral-8x7B-v0.1");
    let weights = computed(&mixtral, bf16());
    let layout = Layout {
        tensor_parallel: 4,
        stages: Stages::Ratios(vec![1, 1]),
    };
    let e = run(
        &mixtral,
        &weights,
        &EstimateRequest::new(Engine::VLLM, 8192).with_layout(layout),
    );
    assert_eq!(e.devices.len(), 8);
    assert_eq!(
        e.devices.iter().map(|d| (d.stage, d.rank)).collect::<Vec<_>>(),
        [(0, 0), (0, 1), (0, 2), (0, 3), (1, 0), (1, 1), (1, 2), (1, 3)]
    );
    assert!(e.devices.iter().all(|d| d.layers.len() == 16));
    let sum: u64 = e.devices.iter().map(|d| d.weights.get()).sum();
    assert!(sum >= weights.loaded().unwrap().get());
}

// --- Weights from headers ---

/// A safetensors header with `tensors`, data offsets laid end to end.
fn header(tensors: &[(String, &str, Vec<u64>)]) -> SafetensorsHeader {
    let mut map = serde_json::Map::new();
    let mut offset = 0u64;
    for (name, dtype, shape) in tensors {
        let width = match *dtype {
            "BF16" | "F16" => 2,
            "F32" | "I32" => 4,
            other => panic!("{other}"),
        };
        let bytes = shape.iter().product::<u64>() * width;
        map.insert(
            name.clone(),
            json!({"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + bytes]}),
        );
        offset += bytes;
    }
    parse_header(serde_json::Value::Object(map).to_string().as_bytes()).expect("valid header")
}

const TINY_LLAMA: &str = r#"{"model_type": "llama", "hidden_size": 256, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 512, "vocab_size": 1000,
    "transformers_version": "4.40.0"}"#;

/// The tensors `transformers` writes for TINY_LLAMA: dense in `dtype`, or GPTQ 4-bit in
/// groups of 32 (`qweight [in/8, out]`, `qzeros [in/32, out/8]`, `scales [in/32, out]`,
/// `g_idx [in]`) with f16 embeddings and norms.
fn tiny_llama_tensors(gptq: bool) -> Vec<(String, &'static str, Vec<u64>)> {
    let dense = if gptq { "F16" } else { "BF16" };
    let mut t = vec![
        ("model.embed_tokens.weight".to_owned(), dense, vec![1000, 256]),
        ("model.norm.weight".to_owned(), dense, vec![256]),
        ("lm_head.weight".to_owned(), dense, vec![1000, 256]),
    ];
    for layer in 0..2 {
        let p = format!("model.layers.{layer}");
        for (module, out, inp) in [
            ("self_attn.q_proj", 256, 256),
            ("self_attn.k_proj", 128, 256),
            ("self_attn.v_proj", 128, 256),
            ("self_attn.o_proj", 256, 256),
            ("mlp.gate_proj", 512, 256),
            ("mlp.up_proj", 512, 256),
            ("mlp.down_proj", 256, 512),
        ] {
            if gptq {
                t.push((format!("{p}.{module}.qweight"), "I32", vec![inp / 8, out]));
                t.push((format!("{p}.{module}.qzeros"), "I32", vec![inp / 32, out / 8]));
                t.push((format!("{p}.{module}.scales"), "F16", vec![inp / 32, out]));
                t.push((format!("{p}.{module}.g_idx"), "I32", vec![inp]));
            } else {
                t.push((format!("{p}.{module}.weight"), dense, vec![out, inp]));
            }
        }
        t.push((format!("{p}.input_layernorm.weight"), dense, vec![256]));
        t.push((format!("{p}.post_attention_layernorm.weight"), dense, vec![256]));
    }
    t
}

/// The groups, without where they came from.
fn groups_only(mut g: WeightGroups) -> WeightGroups {
    g.origin = WeightsOrigin::Computed;
    g.quantization = None;
    g
}

#[test]
fn header_groups_equal_computed_groups() {
    let shape = ModelShape::from_config(&ModelConfig::from_json(TINY_LLAMA).unwrap()).unwrap();
    for gptq_layout in [false, true] {
        let h = header(&tiny_llama_tensors(gptq_layout));
        let from_header = WeightGroups::resolve(&shape, WeightsSource::Safetensors(std::slice::from_ref(&h))).unwrap();
        let q = from_header.quantization.expect("classified from the tensors");
        assert_eq!(from_header.loaded().unwrap(), h.totals().bytes);
        assert!(matches!(
            from_header.origin,
            WeightsOrigin::Header {
                tensors: 21 | 63,
                unclassified: 0,
                ..
            }
        ));
        let from_layout = computed(&shape, q);
        assert_eq!(
            groups_only(from_header),
            groups_only(from_layout),
            "gptq: {gptq_layout}"
        );
    }
}

#[test]
fn stored_buffers_and_tied_copies_are_not_loaded() {
    // Llama 2 checkpoints store rotary inv_freq; a tied Falcon stores lm_head again.
    let shape = ModelShape::from_config(&ModelConfig::from_json(TINY_LLAMA).unwrap()).unwrap();
    let mut tensors = tiny_llama_tensors(false);
    tensors.push((
        "model.layers.0.self_attn.rotary_emb.inv_freq".to_owned(),
        "F32",
        vec![32],
    ));
    tensors.push(("model.extra.weight".to_owned(), "BF16", vec![8]));
    let h = header(&tensors);
    let g = WeightGroups::resolve(&shape, WeightsSource::Safetensors(std::slice::from_ref(&h))).unwrap();
    assert_eq!(g.skipped.get(), 128);
    assert_eq!(g.other.get(), 16);
    assert_eq!(g.stored().unwrap(), h.totals().bytes);
    let e = run(&shape, &g, &EstimateRequest::new(Engine::VLLM, 128));
    assert!(
        e.notes.iter().any(|n| n.starts_with("1 tensors matched no group")),
        "{:?}",
        e.notes
    );

    tensors.push(("model.layers.2.mlp.up_proj.weight".to_owned(), "BF16", vec![4]));
    let h = header(&tensors);
    let err = WeightGroups::resolve(&shape, WeightsSource::Safetensors(std::slice::from_ref(&h))).unwrap_err();
    assert!(matches!(err, Error::TensorOutsideModel { layers: 2, .. }), "{err}");
}

#[test]
fn computed_sizes_match_published_files() {
    // TheBloke/deepseek-coder-33B-instruct-AWQ: "18.01 GB". Per layer 530,317,312
    // weights in int4 (265,158,656 B), 4,143,104 groups × (f16 scale + int4 zero),
    // f16 norms; f16 embedding and lm_head.
    let ds = shape_of("deepseek-coder-33b");
    assert_eq!(computed(&ds, awq()).loaded().unwrap().get(), 18_008_653_824);
    // GPTQ adds an int32 g_idx per input channel: 62,208 per layer.
    assert_eq!(
        computed(&ds, gptq()).loaded().unwrap().get(),
        18_008_653_824 + 62 * 62_208 * 4
    );
    // Meta-Llama-3-8B Q4_K_M: Q4_K everywhere except the Q6_K output and the Q6_K
    // attn_v and ffn_down of 16 of 32 layers; f32 norms. The published file is 4.92 GB
    // (this plus its ~8 MB header with the vocabulary).
    let llama3 = shape_of("meta-llama--Meta-Llama-3-8B");
    assert_eq!(computed(&llama3, q4_k_m()).loaded().unwrap().get(), 4_912_898_048);
    // TheBloke/deepseek-coder-33B-instruct-GGUF Q4_K_M: "19.94 GB" (30 of 62 layers
    // with Q6_K attn_v and ffn_down).
    assert_eq!(computed(&ds, q4_k_m()).loaded().unwrap().get(), 19_939_340_288);
    // bf16: exactly two bytes per parameter.
    assert_eq!(computed(&llama3, bf16()).loaded().unwrap().get(), 2 * 8_030_261_248);
}

// --- Engines ---

#[test]
fn engines_refuse_what_they_cannot_run() {
    let shape = shape_of("meta-llama--Meta-Llama-3-8B");
    let bf = computed(&shape, bf16());
    let err = |w: &WeightGroups, r: EstimateRequest| estimate(&shape, w, &r).unwrap_err().to_string();
    assert_eq!(
        err(&bf, EstimateRequest::new(Engine::LLAMA_CPP, 4096)),
        "llama.cpp cannot load safetensors bf16 16-bit, 16.00 bits/weight; help: llama.cpp loads GGUF files only; \
         choose a GGUF variant"
    );
    assert!(
        err(
            &computed(&shape, awq()),
            EstimateRequest::new(Engine::CANDLE_CUDA, 4096)
        )
        .starts_with("candle cannot load")
    );
    assert!(
        err(
            &bf,
            EstimateRequest::new(Engine::CANDLE_CUDA, 4096).with_layout(Layout::tensor_parallel(2))
        )
        .starts_with("candle cannot run the layout TP 2 × PP 1")
    );
    assert!(
        err(
            &computed(&shape, q4_k_m()),
            EstimateRequest::new(Engine::LLAMA_CPP, 4096).with_layout(Layout::tensor_parallel(2))
        )
        .contains("use pipeline stages")
    );
    assert_eq!(
        err(
            &bf,
            EstimateRequest::new(Engine::VLLM, 4096).with_kv_dtype(KvDtype::Q8_0)
        ),
        "vllm has no `q8_0` KV cache; it offers auto, f16, bf16, fp8"
    );
    let no_fa = Engine::LlamaCpp(skein_model_registry::estimate::LlamaCppSettings {
        flash_attention: false,
        ..match Engine::LLAMA_CPP {
            Engine::LlamaCpp(s) => s,
            _ => unreachable!(),
        }
    });
    assert!(
        err(
            &computed(&shape, q4_k_m()),
            EstimateRequest::new(no_fa, 4096).with_kv_dtype(KvDtype::Q4_0)
        )
        .contains("needs flash attention")
    );
    assert!(matches!(
        estimate(&shape, &bf, &EstimateRequest::new(Engine::VLLM, 0)),
        Err(Error::InvalidEstimateRequest { field: "context", .. })
    ));
    assert!(matches!(
        estimate(
            &shape,
            &bf,
            &EstimateRequest::new(Engine::VLLM, 4096).with_layout(Layout::pipeline(vec![99, 1]))
        ),
        Err(Error::EmptyPipelineStage { stage: 1, layers: 32 })
    ));
}

#[test]
fn candle_on_the_cpu_computes_in_f32() {
    let shape = shape_of("TinyLlama--TinyLlama-1.1B-Chat-v1.0");
    let weights = computed(&shape, bf16());
    let e = run(&shape, &weights, &EstimateRequest::new(Engine::CANDLE_CPU, 2048));
    assert_eq!(e.kv_dtype, KvDtype::F32);
    assert_eq!(e.devices[0].weights.get(), 2 * weights.loaded().unwrap().get());
    assert!(e.devices[0].items.iter().all(|i| i.what != "CUDA context"));
    insta::assert_snapshot!("candle_cpu_tinyllama", format!("{e:#}"));
}

#[test]
fn a_cpu_stage_of_llama_cpp_carries_the_cpu_process_not_a_cuda_context() {
    use skein_model_registry::estimate::{DeviceKind, LLAMA_CPP_CPU_RUNTIME};
    // Qwen2.5-0.5B ties its output to the token embedding.
    let shape = shape_of("Qwen--Qwen2.5-0.5B-Instruct");
    let weights = computed(&shape, q4_k_m());
    let names = |e: &skein_model_registry::Estimate, d: usize| -> Vec<&str> {
        e.devices[d].items.iter().map(|i| i.what).collect()
    };
    let gpu = run(&shape, &weights, &EstimateRequest::new(Engine::LLAMA_CPP, 2048));
    let cpu = run(
        &shape,
        &weights,
        &EstimateRequest::new(Engine::LLAMA_CPP, 2048).with_cpu_stages(1),
    );
    assert_eq!((gpu.device_kind, cpu.device_kind), (DeviceKind::Gpu, DeviceKind::Cpu));
    assert_eq!(cpu.devices[0].kind, DeviceKind::Cpu);
    assert!(names(&gpu, 0).contains(&"CUDA context"));
    assert!(
        names(&cpu, 0).iter().all(|w| !w.contains("CUDA")),
        "{:?}",
        names(&cpu, 0)
    );
    assert_eq!(cpu.devices[0].overhead, LLAMA_CPP_CPU_RUNTIME.bytes());
    assert!(cpu.constants.iter().all(|c| !c.name.contains("CUDA")));
    // On the CPU the output reads the token embedding llama.cpp keeps in RAM: no copy.
    assert!(names(&gpu, 0).contains(&"output projection (tied copy)"));
    assert!(!names(&cpu, 0).contains(&"output projection (tied copy)"));
    assert_eq!(cpu.host, gpu.host);
    assert!(cpu.devices[0].total.get() + (512 << 20) <= gpu.devices[0].total.get());

    // Partial offload: the host stage (first) is the CPU, the GPU stage keeps its context.
    let offload = run(
        &shape,
        &weights,
        &EstimateRequest::new(Engine::LLAMA_CPP, 2048)
            .with_layout(Layout::pipeline(vec![10, 14]))
            .with_cpu_stages(1),
    );
    assert_eq!(offload.device_kind, DeviceKind::Gpu);
    assert_eq!(
        offload.devices.iter().map(|d| d.kind).collect::<Vec<_>>(),
        [DeviceKind::Cpu, DeviceKind::Gpu]
    );
    assert_eq!(offload.devices[0].overhead, LLAMA_CPP_CPU_RUNTIME.bytes());
    assert!(names(&offload, 1).contains(&"CUDA context"));
    assert!(names(&offload, 1).contains(&"output projection (tied copy)"));
    assert!(format!("{offload}").contains("cpu 0"));

    // vLLM has no CPU stage, and no layout has more CPU stages than stages.
    assert!(matches!(
        estimate(
            &shape,
            &computed(&shape, bf16()),
            &EstimateRequest::new(Engine::VLLM, 2048).with_cpu_stages(1)
        ),
        Err(Error::UnsupportedLayout { .. })
    ));
    assert!(matches!(
        estimate(
            &shape,
            &weights,
            &EstimateRequest::new(Engine::LLAMA_CPP, 2048).with_cpu_stages(2)
        ),
        Err(Error::InvalidEstimateRequest {
            field: "cpu_stages",
            ..
        })
    ));
}

#[test]
fn every_line_adds_up() {
    let shape = shape_of("llava-hf--llava-v1.6-mistral-7b-hf");
    let weights = computed(&shape, bf16());
    let e = run(
        &shape,
        &weights,
        &EstimateRequest::new(Engine::VLLM, 8192).with_layout(Layout::tensor_parallel(2)),
    );
    for d in &e.devices {
        let of = |c: Component| {
            d.items
                .iter()
                .filter(|i| i.component == c)
                .map(|i| i.bytes.get())
                .sum::<u64>()
        };
        assert_eq!(of(Component::Weights), d.weights.get());
        assert_eq!(of(Component::KvCache), d.kv_cache.get());
        assert_eq!(of(Component::Activations), d.activations.get());
        assert_eq!(of(Component::Overhead), d.overhead.get());
        assert_eq!(
            d.weights.get() + d.kv_cache.get() + d.activations.get() + d.overhead.get(),
            d.total.get()
        );
    }
    // Deterministic: the same inputs give the same estimate.
    assert_eq!(
        e,
        run(
            &shape,
            &weights,
            &EstimateRequest::new(Engine::VLLM, 8192).with_layout(Layout::tensor_parallel(2))
        )
    );
    insta::assert_snapshot!("vllm_llava_tp2", format!("{e:#}"));
    insta::assert_json_snapshot!("vllm_llava_tp2_json", e);
}

#[test]
fn fit_needs_one_figure_per_device_and_keeps_a_margin() {
    let shape = shape_of("meta-llama--Meta-Llama-3-8B");
    let e = run(
        &shape,
        &computed(&shape, bf16()),
        &EstimateRequest::new(Engine::VLLM, 8192),
    );
    assert!(matches!(
        fits(&e, &[A100, A100]),
        Err(Error::DeviceCountMismatch { devices: 1, usable: 2 })
    ));
    let need = e.devices[0].total;
    let margin = (need.get() / 20).max(256 << 20);
    assert!(fits(&e, &[Bytes::new(need.get() + margin)]).unwrap().fits);
    let short = fits(&e, &[Bytes::new(need.get() + margin - 1)]).unwrap();
    assert!(!short.fits);
    assert_eq!(short.devices[0].short.get(), 1);
}

// --- The reference fleet (docs/models.md) ---

/// Usable memory as NVML reports each card's total.
const A100: Bytes = Bytes::new(81_920 << 20);
const RTX4090: Bytes = Bytes::new(24_564 << 20);
const V100: Bytes = Bytes::new(16_160 << 20);

struct Case {
    model: &'static str,
    variant: &'static str,
    engine: Engine,
    layout: Layout,
    gpus: (&'static str, Vec<Bytes>),
    context: u64,
    concurrency: u64,
}

fn case(
    model: &'static str,
    variant: &'static str,
    engine: Engine,
    layout: Layout,
    gpus: (&'static str, Vec<Bytes>),
) -> Case {
    Case {
        model,
        variant,
        engine,
        layout,
        gpus,
        context: 8192,
        concurrency: 1,
    }
}

fn gpus(name: &'static str, gpu: Bytes, n: usize) -> (&'static str, Vec<Bytes>) {
    (name, vec![gpu; n])
}

fn reference_cases() -> Vec<Case> {
    let a100 = |n| gpus(["", "1×A100-80GB", "2×A100-80GB", "", "4×A100-80GB"][n], A100, n);
    let rtx = |n| gpus(["", "1×RTX4090", "2×RTX4090", "", "4×RTX4090 (rtx-1)"][n], RTX4090, n);
    let v100 = |n| gpus(["", "1×V100-16GB", "2×V100-16GB (old-1)"][n], V100, n);
    let tp = Layout::tensor_parallel;
    let one = Layout::single;
    let by_memory = |g: &(&'static str, Vec<Bytes>)| Layout::pipeline_by_memory(g.1.clone());
    let (vllm, llama) = (Engine::VLLM, Engine::LLAMA_CPP);
    let llava = "llava-hf--llava-v1.6-mistral-7b-hf";
    let ds = "deepseek-coder-33b";
    let mixtral = "mistralai--Mixtral-8x7B-v0.1";
    let llama3 = "meta-llama--Meta-Llama-3-8B";
    let mixed = ("A100-80GB + RTX4090", vec![A100, RTX4090]);
    let eight_rtx = ("8×RTX4090 (rtx-1 + rtx-2)", vec![RTX4090; 8]);
    vec![
        case(llava, "bf16", vllm, one(), a100(1)),
        case(llava, "bf16", vllm, one(), rtx(1)),
        case(llava, "bf16", vllm, one(), v100(1)),
        case(llava, "bf16", vllm, tp(2), v100(2)),
        case(llava, "Q4_K_M", llama, one(), v100(1)),
        case(ds, "bf16", vllm, one(), a100(1)),
        case(ds, "bf16", vllm, tp(4), rtx(4)),
        case(ds, "bf16", vllm, by_memory(&mixed), mixed.clone()),
        case(ds, "bf16", vllm, tp(2), v100(2)),
        case(ds, "awq", vllm, one(), rtx(1)),
        case(ds, "awq", vllm, tp(2), rtx(2)),
        case(ds, "gptq", vllm, one(), rtx(1)),
        case(ds, "awq", vllm, tp(2), v100(2)),
        case(ds, "Q4_K_M", llama, one(), rtx(1)),
        case(ds, "Q4_K_M", llama, by_memory(&v100(2)), v100(2)),
        case(mixtral, "bf16", vllm, tp(2), a100(2)),
        case(mixtral, "bf16", vllm, tp(4), rtx(4)),
        case(
            mixtral,
            "bf16",
            vllm,
            Layout {
                tensor_parallel: 4,
                stages: Stages::Ratios(vec![1, 1]),
            },
            eight_rtx,
        ),
        case(mixtral, "Q4_K_M", llama, by_memory(&rtx(2)), rtx(2)),
        case(mixtral, "Q4_K_M", llama, by_memory(&v100(2)), v100(2)),
        case(llama3, "bf16", vllm, one(), rtx(1)),
        Case {
            concurrency: 8,
            ..case(llama3, "bf16", vllm, one(), a100(1))
        },
        case(llama3, "bf16", vllm, one(), v100(1)),
        case(llama3, "bf16", vllm, tp(2), v100(2)),
        case(llama3, "Q4_K_M", llama, one(), v100(1)),
    ]
}

fn quantization(variant: &str) -> Quantization {
    match variant {
        "bf16" => bf16(),
        "awq" => awq(),
        "gptq" => gptq(),
        "Q4_K_M" => q4_k_m(),
        other => panic!("{other}"),
    }
}

fn gib(b: Bytes) -> String {
    format!("{:.1}", b.get() as f64 / (1u64 << 30) as f64)
}

#[test]
fn reference_fleet_fit_answers() {
    let mut table = String::from(
        "| model | variant | engine | layout | GPUs | context × seqs | weights GiB | need per GPU GiB | \
         usable per GPU GiB | fits |\n|---|---|---|---|---|---|---|---|---|---|\n",
    );
    let mut details = String::new();
    for c in reference_cases() {
        let shape = shape_of(c.model);
        let weights = computed(&shape, quantization(c.variant));
        let request = EstimateRequest::new(c.engine, c.context)
            .with_concurrency(c.concurrency)
            .with_layout(c.layout.clone());
        let e = run(&shape, &weights, &request);
        let report = fits(&e, &c.gpus.1).unwrap();
        let verdict = if report.fits {
            "yes".to_owned()
        } else {
            let short = report.devices.iter().map(|d| d.short).max().unwrap_or(Bytes::ZERO);
            format!("no ({} short)", gib(short))
        };
        let model = c.model.rsplit("--").next().unwrap_or(c.model);
        // One figure per pipeline stage: the ranks of a stage need the same.
        let per_stage = |f: &dyn Fn(usize) -> Bytes| -> String {
            let figures: Vec<String> = e
                .devices
                .iter()
                .filter(|d| d.rank == 0)
                .map(|d| gib(f(d.device)))
                .collect();
            figures.join(", ")
        };
        writeln!(
            table,
            "| {model} | {} | {} | {} | {} | {} × {} | {} | {} | {} | {verdict} |",
            c.variant,
            c.engine.name(),
            e.layout,
            c.gpus.0,
            c.context,
            c.concurrency,
            gib(weights.loaded().unwrap()),
            per_stage(&|d| e.devices[d].total),
            per_stage(&|d| c.gpus.1[d]),
        )
        .unwrap();
        writeln!(details, "## {model} {} on {}\n{e}{report}", c.variant, c.gpus.0).unwrap();
    }
    println!("{table}\n{details}");
    insta::assert_snapshot!("reference_fleet_table", table);
    insta::assert_snapshot!("reference_fleet_details", details);
}

#[test]
fn tp_degree_table_for_the_docs() {
    let mut out = String::new();
    for (name, q) in [
        ("meta-llama--Meta-Llama-3-8B", None),
        ("mistralai--Mixtral-8x7B-v0.1", None),
        ("llava-hf--llava-v1.6-mistral-7b-hf", None),
        ("deepseek-coder-33b", None),
        ("deepseek-coder-33b", Some(awq())),
        ("tiiuae--falcon-7b", None),
        ("openai-community--gpt2", None),
    ] {
        let shape = shape_of(name);
        writeln!(out, "{name}{}:", if q.is_some() { " (AWQ int4 g128)" } else { "" }).unwrap();
        for d in tp_degrees(&shape, q.as_ref(), 8) {
            match d.invalid {
                None => writeln!(out, "  {}: valid", d.degree).unwrap(),
                Some(reason) => writeln!(out, "  {}: {reason}", d.degree).unwrap(),
            }
        }
    }
    insta::assert_snapshot!("tp_degrees", out);
}

// --- The fit search (`skein models fit`, the planner) ---

mod search {
    use super::*;
    use skein_model_registry::catalog::{FitOptions, SetFit, fit_variant};
    use skein_model_registry::estimate::{KvDtype, Stages};
    use skein_model_registry::gpu::GpuSet;

    const OPTIONS: FitOptions = FitOptions {
        context: 8192,
        concurrency: 1,
        kv_dtype: KvDtype::Auto,
    };

    fn place(model: &str, q: Quantization, set: &str) -> SetFit {
        let shape = shape_of(model);
        let set: GpuSet = set.parse().unwrap();
        fit_variant(&shape, &computed(&shape, q), &set, OPTIONS)
    }

    /// `(GPUs used, tensor-parallel degree, stages)` of a fitting placement.
    fn layout(fit: &SetFit) -> (Vec<usize>, u64, usize) {
        assert!(fit.fits, "{fit:?}");
        let p = fit.placement.as_ref().unwrap();
        (p.gpus.clone(), p.layout().tensor_parallel, p.layout().stages.count())
    }

    #[test]
    fn the_fewest_gpus_that_fit_are_used() {
        // Llama-3-8B bf16 fits one 4090 of the four: the others stay free.
        assert_eq!(
            layout(&place("meta-llama--Meta-Llama-3-8B", bf16(), "RTX4090-24GB:4")),
            (vec![0], 1, 1)
        );
        // deepseek-coder-33b bf16 needs four 4090s, as TP 4 (tensor parallelism first).
        assert_eq!(
            layout(&place("deepseek-coder-33b", bf16(), "RTX4090-24GB:4")),
            (vec![0, 1, 2, 3], 4, 1)
        );
    }

    #[test]
    fn an_invalid_degree_falls_back_to_tensor_parallel_groups_as_stages() {
        // AWQ with groups of 128 cannot take TP 4 (19,200 / 4 is not whole groups), and
        // one or two 16 GB V100s are too small; four take TP 2 × PP 2.
        let fit = place("deepseek-coder-33b", awq(), "V100-16GB:4");
        let (gpus, tp, stages) = layout(&fit);
        assert_eq!((gpus.len(), tp, stages), (2, 2, 1), "TP 2 fits two V100s");
        // bf16 on eight V100s: TP 8 would fit, but six do as TP 2 × PP 3 (56 heads rule
        // out TP 6; five GPUs are not enough).
        let fit = place("deepseek-coder-33b", bf16(), "V100-16GB:8");
        assert_eq!(layout(&fit), (vec![0, 1, 2, 3, 4, 5], 2, 3));
    }

    #[test]
    fn mixed_cards_split_layers_by_memory_largest_first() {
        // 87.0 GiB of bf16 weights: neither card alone; the A100 (listed second) takes
        // most layers.
        let fit = place("mistralai--Mixtral-8x7B-v0.1", bf16(), "RTX4090-24GB+A100-80GB");
        let p = fit.placement.as_ref().unwrap();
        assert!(fit.fits);
        assert_eq!(p.gpus, [1, 0]);
        assert!(matches!(p.layout().stages, Stages::Memory(_)));
        let layers: Vec<u64> = p.estimate.devices.iter().map(|d| d.layers.len()).collect();
        assert!(layers[0] > 3 * layers[1], "{layers:?}");
    }

    #[test]
    fn when_nothing_fits_the_closest_whole_set_layout_is_shown() {
        let fit = place("mistralai--Mixtral-8x7B-v0.1", bf16(), "RTX4090-24GB:4");
        assert!(!fit.fits);
        let p = fit.placement.as_ref().unwrap();
        assert_eq!(p.gpus.len(), 4);
        assert_eq!(p.layout().tensor_parallel, 4, "TP 4 comes closest (1.8 GiB short)");
        let short = p.report.devices.iter().map(|d| d.short).max().unwrap();
        assert!(short > Bytes::ZERO && short < Bytes::new(3 << 30), "{short}");
    }

    #[test]
    fn gguf_variants_run_on_llama_cpp_by_layers() {
        let fit = place("mistralai--Mixtral-8x7B-v0.1", q4_k_m(), "V100-16GB:2");
        let p = fit.placement.as_ref().unwrap();
        assert!(fit.fits);
        assert_eq!(p.estimate.engine.name(), "llama.cpp");
        assert_eq!((p.layout().tensor_parallel, p.layout().stages.count()), (1, 2));
    }
}
