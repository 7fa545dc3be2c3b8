//! Memory estimation cost: 1,000 variant × GPU-set combinations (10 variants × 100 GPU
//! sets drawn from the reference fleet), each placed by the fit search `skein models
//! fit` and the planner run (`catalog::fit_variant`: layouts tried until one fits, each
//! an estimate and a fit check), against a baseline in the same run: 1,000 parameter
//! counts from the same configs. A single estimate + fit check per combination, with
//! the layout the search tries first, is measured too.
//!
//! Run: `cargo bench -p skein-model-registry --bench estimate -- --warm-up-time 1 --measurement-time 3`

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use serde_json::json;
use skein_model_registry::catalog::{FitOptions, fit_variant};
use skein_model_registry::config::ModelConfig;
use skein_model_registry::estimate::{
    Engine, EstimateRequest, KvDtype, Layout, ModelShape, WeightGroups, WeightsSource, check_tp, estimate, fits,
};
use skein_model_registry::gpu::GpuSet;
use skein_model_registry::{GgufFileType, Quantization, WeightFormat, parameter_count};

const LLAMA3: &str = include_str!("../tests/fixtures/configs/meta-llama--Meta-Llama-3-8B.json");
const MISTRAL: &str = include_str!("../tests/fixtures/configs/mistralai--Mistral-7B-v0.1.json");
const MIXTRAL: &str = include_str!("../tests/fixtures/configs/mistralai--Mixtral-8x7B-v0.1.json");
const LLAVA: &str = include_str!("../tests/fixtures/configs/llava-hf--llava-v1.6-mistral-7b-hf.json");
const QWEN: &str = include_str!("../tests/fixtures/configs/Qwen--Qwen2.5-7B-Instruct.json");
const DEEPSEEK_33B: &str = r#"{"model_type": "llama", "hidden_size": 7168, "num_hidden_layers": 62,
    "num_attention_heads": 56, "num_key_value_heads": 8, "intermediate_size": 19200, "vocab_size": 32256,
    "max_position_embeddings": 16384, "tie_word_embeddings": false, "torch_dtype": "bfloat16"}"#;

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
fn gpu_sets() -> Vec<GpuSet> {
    let kinds = [
        "A100-80GB",
        "A100-80GB:2",
        "A100-80GB:4",
        "RTX4090-24GB",
        "RTX4090-24GB:2",
        "RTX4090-24GB:4",
        "RTX4090-24GB:8",
        "V100-16GB",
        "V100-16GB:2",
        "A100-80GB+RTX4090-24GB",
        "A100-80GB:2+RTX4090-24GB:2",
        "RTX4090-24GB+V100-16GB",
    ];
    let mut state: u64 = 0x5EED;
    (0..100)
        .map(|_| {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            kinds[(state >> 33) as usize % kinds.len()]
                .parse()
                .expect("a catalog set")
        })
        .collect()
}

/// The layout the search tries first on the whole set: one GPU; tensor parallelism over
/// all of them where vLLM can; else pipeline stages sized by memory.
fn first_request(v: &Variant, set: &GpuSet) -> EstimateRequest {
    let gpus = set.memory();
    let gguf = v.weights.quantization.is_some_and(|q| q.format == WeightFormat::Gguf);
    let engine = if gguf { Engine::LLAMA_CPP } else { Engine::VLLM };
    let n = gpus.len() as u64;
    let equal = gpus.iter().all(|&g| Some(&g) == gpus.first());
    let layout = if n == 1 {
        Layout::single()
    } else if !gguf && equal && check_tp(&v.shape, v.weights.quantization.as_ref(), n).is_ok() {
        Layout::tensor_parallel(n)
    } else {
        Layout::pipeline_by_memory(gpus)
    };
    EstimateRequest::new(engine, 8192).with_layout(layout)
}

const OPTIONS: FitOptions = FitOptions {
    context: 8192,
    concurrency: 1,
    kv_dtype: KvDtype::Auto,
};

fn estimation(c: &mut Criterion) {
    let variants = variants();
    let sets = gpu_sets();
    let combos: Vec<(&Variant, &GpuSet, EstimateRequest)> = variants
        .iter()
        .flat_map(|v| sets.iter().map(move |g| (v, g, first_request(v, g))))
        .collect();
    assert_eq!(combos.len(), 1000);
    let fitting = combos
        .iter()
        .filter(|(v, g, _)| fit_variant(&v.shape, &v.weights, g, OPTIONS).fits)
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
    group.bench_function("estimate + fits ×1000 (one layout each)", |b| {
        b.iter(|| {
            for (v, set, r) in &combos {
                let e = estimate(&v.shape, &v.weights, black_box(r)).expect("estimates");
                black_box(fits(&e, &set.memory()).expect("fits"));
            }
        })
    });
    group.bench_function("fit_variant ×1000 (the search)", |b| {
        b.iter(|| {
            for (v, set, _) in &combos {
                black_box(fit_variant(&v.shape, &v.weights, black_box(set), OPTIONS));
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
