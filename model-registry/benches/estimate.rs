//! Memory estimation cost: 1,000 variant × GPU-set combinations (10 variants × 100 GPU
//! sets drawn from the reference fleet), each an estimate and a fit check, against a
//! baseline in the same run: 1,000 parameter counts from the same configs.
//!
//! Run: `cargo bench -p skein-model-registry --bench estimate -- --warm-up-time 1 --measurement-time 3`

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use serde_json::json;
use skein_model_registry::config::ModelConfig;
use skein_model_registry::estimate::{
    Engine, EstimateRequest, Layout, ModelShape, WeightGroups, WeightsSource, check_tp, estimate, fits,
};
use skein_model_registry::{Bytes, GgufFileType, Quantization, WeightFormat, parameter_count};

const LLAMA3: &str = include_str!("../tests/fixtures/configs/meta-llama--Meta-Llama-3-8B.json");
const MISTRAL: &str = include_str!("../tests/fixtures/configs/mistralai--Mistral-7B-v0.1.json");
const MIXTRAL: &str = include_str!("../tests/fixtures/configs/mistralai--Mixtral-8x7B-v0.1.json");
const LLAVA: &str = include_str!("../tests/fixtures/configs/llava-hf--llava-v1.6-mistral-7b-hf.json");
const QWEN: &str = include_str!("../tests/fixtures/configs/Qwen--Qwen2.5-7B-Instruct.json");
const DEEPSEEK_33B: &str = r#"{"model_type": "llama", "hidden_size": 7168, "num_hidden_layers": 62,
    "num_attention_heads": 56, "num_key_value_heads": 8, "intermediate_size": 19200, "vocab_size": 32256,
    "max_position_embeddings": 16384, "tie_word_embeddings": false, "torch_dtype": "bfloat16"}"#;

const A100: Bytes = Bytes::new(81_920 << 20);
const RTX4090: Bytes = Bytes::new(24_564 << 20);
const V100: Bytes = Bytes::new(16_160 << 20);

struct Variant {
    config: ModelConfig,
    shape: ModelShape,
    weights: WeightGroups,
}

fn variants() -> Vec<Variant> {
    let bf16 = Quantization::from_config(None, Some("bfloat16"))
        .expect("known")
        .expect("some");
    let awq_config = json!({"quant_method": "awq", "bits": 4, "group_size": 128});
    let awq = Quantization::from_config(Some(&awq_config), None)
        .expect("known")
        .expect("some");
    let q4_k_m = Quantization::from_gguf_file_type(GgufFileType::Q4_K_M);
    [
        (LLAMA3, bf16),
        (LLAMA3, q4_k_m),
        (MISTRAL, bf16),
        (MIXTRAL, bf16),
        (MIXTRAL, q4_k_m),
        (DEEPSEEK_33B, bf16),
        (DEEPSEEK_33B, awq),
        (DEEPSEEK_33B, q4_k_m),
        (LLAVA, bf16),
        (QWEN, bf16),
    ]
    .into_iter()
    .map(|(json, q)| {
        let config = ModelConfig::from_json(json).expect("config");
        let shape = ModelShape::from_config(&config).expect("shape");
        let weights = WeightGroups::resolve(&shape, WeightsSource::Computed(q)).expect("weights");
        Variant { config, shape, weights }
    })
    .collect()
}

/// 100 GPU sets drawn from the reference fleet with a fixed linear congruential
/// sequence, so every run measures the same sets.
fn gpu_sets() -> Vec<Vec<Bytes>> {
    let kinds: [Vec<Bytes>; 12] = [
        vec![A100],
        vec![A100; 2],
        vec![A100; 4],
        vec![RTX4090],
        vec![RTX4090; 2],
        vec![RTX4090; 4],
        vec![RTX4090; 8],
        vec![V100],
        vec![V100; 2],
        vec![A100, RTX4090],
        vec![A100, A100, RTX4090, RTX4090],
        vec![RTX4090, V100],
    ];
    let mut state: u64 = 0x5EED;
    (0..100)
        .map(|_| {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            kinds[(state >> 33) as usize % kinds.len()].clone()
        })
        .collect()
}

/// The request a planner would try first: llama.cpp for GGUF, otherwise vLLM with
/// tensor parallelism over equal GPUs where the model allows it, else pipeline stages
/// sized by memory.
fn request(v: &Variant, gpus: &[Bytes]) -> EstimateRequest {
    let gguf = v.weights.quantization.is_some_and(|q| q.format == WeightFormat::Gguf);
    let n = gpus.len() as u64;
    let equal = gpus.iter().all(|&g| Some(&g) == gpus.first());
    let (engine, layout) = if n == 1 {
        (if gguf { Engine::LLAMA_CPP } else { Engine::VLLM }, Layout::single())
    } else if !gguf && equal && check_tp(&v.shape, v.weights.quantization.as_ref(), n).is_ok() {
        (Engine::VLLM, Layout::tensor_parallel(n))
    } else {
        let engine = if gguf { Engine::LLAMA_CPP } else { Engine::VLLM };
        (engine, Layout::pipeline_by_memory(gpus.to_vec()))
    };
    EstimateRequest::new(engine, 8192).with_layout(layout)
}

fn estimation(c: &mut Criterion) {
    let variants = variants();
    let sets = gpu_sets();
    let combos: Vec<(&Variant, &Vec<Bytes>, EstimateRequest)> = variants
        .iter()
        .flat_map(|v| sets.iter().map(move |g| (v, g, request(v, g))))
        .collect();
    assert_eq!(combos.len(), 1000);
    // Every combination estimates (a layout the model cannot take would be an error).
    let fitting = combos
        .iter()
        .filter(|(v, g, r)| {
            let e = estimate(&v.shape, &v.weights, r).expect("estimates");
            fits(&e, g).expect("one figure per GPU").fits
        })
        .count();
    println!("{fitting} of 1000 combinations fit");

    let mut group = c.benchmark_group("estimate 1000 variant × GPU-set combinations");
    group.bench_function("parameter_count ×1000 (baseline)", |b| {
        b.iter(|| {
            for (v, _, _) in &combos {
                black_box(parameter_count(black_box(&v.config)).expect("counts"));
            }
        })
    });
    group.bench_function("estimate + fits ×1000", |b| {
        b.iter(|| {
            for (v, gpus, r) in &combos {
                let e = estimate(&v.shape, &v.weights, black_box(r)).expect("estimates");
                black_box(fits(&e, gpus).expect("fits"));
            }
        })
    });
    group.finish();

    let mut group = c.benchmark_group("weight groups per variant");
    group.bench_function("ModelShape + computed WeightGroups ×10", |b| {
        b.iter(|| {
            for v in &variants {
                let shape = ModelShape::from_config(black_box(&v.config)).expect("shape");
                let q = v.weights.quantization.expect("computed variants know it");
                black_box(WeightGroups::resolve(&shape, WeightsSource::Computed(q)).expect("weights"));
            }
        })
    });
    group.finish();
}

criterion_group!(benches, estimation);
criterion_main!(benches);
