//! The two views of the reference models agree: `HubClient::inspect` of each base
//! repository on a mock hub serving [`reference_hub_repos`] lists the variants
//! [`reference_models`] builds without IO (same ids, precisions, files, sources and
//! tensor-parallel degrees; sizes equal up to the header bytes the files add), and with
//! `derivative_headers` the exact figures of the mock's headers match the computed ones.

use std::path::PathBuf;
use std::time::Duration;

use skein_model_registry::catalog::{ModelInfo, Variant};
use skein_model_registry::hub::{HubClient, HubClientBuilder, HubConfig, InspectOptions, VariantSource};
use skein_model_registry::{QuantMethod, WeightFormat};
use skein_testkit::mock_hub::MockHub;
use skein_testkit::models::{reference_hub_repos, reference_models};

/// Bytes a file may hold beyond its tensors: the safetensors or GGUF header (no
/// vocabulary in these GGUF headers) and GGUF's alignment padding.
const MAX_HEADER_BYTES: u64 = 1 << 20;

/// A fresh cache directory for one test, under Cargo's scratch directory for
/// integration tests.
fn cache_dir(test: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("reference_models-{test}"));
    if dir.exists() {
        std::fs::remove_dir_all(&dir).unwrap();
    }
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A client of `hub` independent of the process environment.
fn client(hub: &MockHub, test: &str) -> HubClient {
    HubClientBuilder::from_config(HubConfig::from_lookup(|_| None))
        .endpoint(&hub.url)
        .cache_dir(cache_dir(test))
        .token(None)
        .offline(false)
        .request_timeout(Duration::from_secs(30))
        .build()
        .unwrap()
}

/// Inspects every reference model's repository on a mock hub serving the reference
/// repositories; returns each reference model with what `inspect` found, and the bytes
/// the hub served.
fn inspect_all(test: &str, options: &InspectOptions) -> (Vec<(ModelInfo, ModelInfo)>, u64) {
    let hub = MockHub::start_in_background(reference_hub_repos());
    let client = client(&hub, test);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let pairs = reference_models()
        .into_iter()
        .map(|expected| {
            let found = runtime
                .block_on(client.inspect(&expected.repo, "main", options))
                .unwrap_or_else(|e| panic!("{}: {e}", expected.repo));
            (expected, found)
        })
        .collect();
    (pairs, hub.bytes_served())
}

/// What `inspect` and the reference must agree on, whether a figure is exact or
/// computed: the variant, its precision (not its effective bits, which a GGUF header
/// makes exact), its files, its source and its tensor-parallel degrees.
type Listing<'a> = (
    &'a str,
    WeightFormat,
    QuantMethod,
    u8,
    Option<u32>,
    &'a [String],
    VariantSource,
    &'a [u64],
);

fn listing(variants: &[Variant]) -> Vec<Listing<'_>> {
    variants
        .iter()
        .map(|v| {
            let q = &v.quantization;
            (
                v.id.as_str(),
                q.format,
                q.method,
                q.weight_bits,
                q.group_size,
                v.files.as_slice(),
                v.source,
                v.tp_degrees.as_slice(),
            )
        })
        .collect()
}

fn check_model(expected: &ModelInfo, found: &ModelInfo) {
    let repo = &expected.repo;
    assert_eq!(found.sha, expected.sha, "{repo}");
    assert_eq!(found.shape, expected.shape, "{repo}");
    assert_eq!(found.tp_degrees, expected.tp_degrees, "{repo}");
    assert_eq!(found.shape_source, expected.shape_source, "{repo}");
    assert!(found.skipped.is_empty(), "{repo}: skipped {:?}", found.skipped);
    assert!(found.notes.is_empty(), "{repo}: notes {:?}", found.notes);
    assert_eq!(listing(&found.variants), listing(&expected.variants), "{repo}");
}

#[test]
fn inspect_lists_the_reference_variants() {
    let (pairs, served) = inspect_all("computed", &InspectOptions::default());
    for (expected, found) in &pairs {
        check_model(expected, found);
        for (e, f) in expected.variants.iter().zip(&found.variants) {
            // Derivatives are computed as the reference computes them: the same
            // quantization, bits included, and the same bytes by group.
            if f.source == VariantSource::QuantizedDerivative {
                assert!(!f.exact(), "{}", f.id);
                assert_eq!(f.quantization, e.quantization, "{}", f.id);
                assert_eq!(f.weights, e.weights, "{}", f.id);
            } else {
                assert!(f.exact(), "{}: the own checkpoint is read from its headers", f.id);
            }
            // The hub lists the files' sizes: the tensors the reference computes, plus
            // headers.
            let (hub, computed) = (f.size.get(), e.size.get());
            assert!(
                hub >= computed && hub - computed < MAX_HEADER_BYTES,
                "{}: {hub} bytes on the hub, {computed} computed",
                f.id
            );
        }
    }
    // Five models, 27 variants, about 1.1 TB of weights: configs and file lists only
    // (derivatives are not read), and the own checkpoints' headers.
    eprintln!("inspect served {served} bytes");
    assert!(served < 5_000_000, "served {served} bytes");
}

#[test]
fn derivative_headers_agree_with_the_computed_bytes() {
    let options = InspectOptions {
        derivative_headers: true,
        ..InspectOptions::default()
    };
    let (pairs, _) = inspect_all("headers", &options);
    for (expected, found) in &pairs {
        check_model(expected, found);
        for (e, f) in expected.variants.iter().zip(&found.variants) {
            assert!(f.exact(), "{}", f.id);
            let (exact, computed) = (f.weights.loaded().unwrap().get(), e.weights.loaded().unwrap().get());
            // The only difference allowed: a GGUF projector stores its norms and
            // biases in F32, where the estimate counts 16 bits for the whole tower.
            let slack = (e.weights.vision_layers.get() + e.weights.vision_other.get()) / 500;
            assert!(
                exact.abs_diff(computed) <= slack,
                "{}: {exact} bytes in the headers, {computed} computed",
                f.id
            );
        }
    }
}

/// The reference list, pinned: id, precision, size in GB (10⁹ bytes) and the valid
/// tensor-parallel degrees of each variant, best first. A change of the registry's
/// computed sizes shows here; paste the printed table if the change is intended.
#[test]
fn reference_models_are_listed_best_precision_first() {
    let mut table = String::new();
    for model in reference_models() {
        table.push_str(&format!("{} ({} parameters)\n", model.repo, model.shape.params.total()));
        for v in &model.variants {
            let q = &v.quantization;
            let precision = match q.method {
                QuantMethod::Awq | QuantMethod::Gptq => format!("{}-int{}", q.method, q.weight_bits),
                method => method.to_string(),
            };
            let degrees: Vec<String> = v.tp_degrees.iter().map(u64::to_string).collect();
            let degrees = if degrees.is_empty() {
                "-".to_owned()
            } else {
                degrees.join(",")
            };
            let gb = v.size.get() as f64 / 1e9;
            table.push_str(&format!("  {:<92} {precision:<9} {gb:>7.2} GB  tp {degrees}\n", v.id));
        }
    }
    assert!(
        table == EXPECTED_TABLE,
        "the reference models changed; they are now:\n{table}"
    );
}

const EXPECTED_TABLE: &str = "\
Qwen/Qwen2.5-0.5B-Instruct (494032768 parameters)
  Qwen/Qwen2.5-0.5B-Instruct                                                                   bf16         0.99 GB  tp 1,2
  Qwen/Qwen2.5-0.5B-Instruct-GGUF:Qwen2.5-0.5B-Instruct-Q8_0.gguf                              Q8_0         0.53 GB  tp -
  Qwen/Qwen2.5-0.5B-Instruct-GGUF:Qwen2.5-0.5B-Instruct-Q6_K.gguf                              Q6_K         0.50 GB  tp -
  Qwen/Qwen2.5-0.5B-Instruct-GGUF:Qwen2.5-0.5B-Instruct-Q4_K_M.gguf                            Q4_K_M       0.39 GB  tp -
  Qwen/Qwen2.5-0.5B-Instruct-AWQ                                                               awq-int4     0.46 GB  tp 1
Qwen/Qwen2.5-7B-Instruct (7615616512 parameters)
  Qwen/Qwen2.5-7B-Instruct                                                                     bf16        15.23 GB  tp 1,2,4
  Qwen/Qwen2.5-7B-Instruct-GGUF:Qwen2.5-7B-Instruct-Q8_0.gguf                                  Q8_0         8.09 GB  tp -
  Qwen/Qwen2.5-7B-Instruct-GPTQ-Int8                                                           gptq-int8    8.86 GB  tp 1,2,4
  Qwen/Qwen2.5-7B-Instruct-GGUF:Qwen2.5-7B-Instruct-Q6_K.gguf                                  Q6_K         6.25 GB  tp -
  Qwen/Qwen2.5-7B-Instruct-GGUF:Qwen2.5-7B-Instruct-Q4_K_M.gguf                                Q4_K_M       4.68 GB  tp -
  Qwen/Qwen2.5-7B-Instruct-AWQ                                                                 awq-int4     5.57 GB  tp 1,2,4
llava-hf/llava-v1.6-mistral-7b-hf (7566747648 parameters)
  llava-hf/llava-v1.6-mistral-7b-hf                                                            fp16        15.13 GB  tp 1,2,4,8
  llava-hf/llava-v1.6-mistral-7b-hf-GGUF:llava-v1.6-mistral-7b-hf-Q8_0.gguf                    Q8_0         7.70 GB  tp -
  llava-hf/llava-v1.6-mistral-7b-hf-GGUF:llava-v1.6-mistral-7b-hf-Q6_K.gguf                    Q6_K         5.94 GB  tp -
  llava-hf/llava-v1.6-mistral-7b-hf-GGUF:llava-v1.6-mistral-7b-hf-Q4_K_M.gguf                  Q4_K_M       4.37 GB  tp -
  llava-hf/llava-v1.6-mistral-7b-hf-AWQ                                                        awq-int4     4.80 GB  tp 1,2,4,8
deepseek-ai/deepseek-coder-33b-instruct (33342991360 parameters)
  deepseek-ai/deepseek-coder-33b-instruct                                                      bf16        66.69 GB  tp 1,2,4,8
  deepseek-ai/deepseek-coder-33b-instruct-GGUF:deepseek-coder-33b-instruct-Q8_0.gguf           Q8_0        35.43 GB  tp -
  deepseek-ai/deepseek-coder-33b-instruct-GPTQ-Int8                                            gptq-int8   34.59 GB  tp 1,2
  deepseek-ai/deepseek-coder-33b-instruct-GGUF:deepseek-coder-33b-instruct-Q6_K.gguf           Q6_K        27.35 GB  tp -
  deepseek-ai/deepseek-coder-33b-instruct-GGUF:deepseek-coder-33b-instruct-Q4_K_M.gguf         Q4_K_M      19.94 GB  tp -
  deepseek-ai/deepseek-coder-33b-instruct-AWQ                                                  awq-int4    18.01 GB  tp 1,2
meta-llama/Meta-Llama-3-70B-Instruct (70553706496 parameters)
  meta-llama/Meta-Llama-3-70B-Instruct                                                         bf16       141.11 GB  tp 1,2,4,8
  meta-llama/Meta-Llama-3-70B-Instruct-GGUF:Meta-Llama-3-70B-Instruct-Q8_0-00001-of-00002.gguf Q8_0        74.97 GB  tp -
  meta-llama/Meta-Llama-3-70B-Instruct-GPTQ-Int8                                               gptq-int8   74.29 GB  tp 1,2,4,8
  meta-llama/Meta-Llama-3-70B-Instruct-GGUF:Meta-Llama-3-70B-Instruct-Q6_K-00001-of-00002.gguf Q6_K        57.88 GB  tp -
  meta-llama/Meta-Llama-3-70B-Instruct-GGUF:Meta-Llama-3-70B-Instruct-Q4_K_M.gguf              Q4_K_M      42.51 GB  tp -
  meta-llama/Meta-Llama-3-70B-Instruct-AWQ                                                     awq-int4    39.77 GB  tp 1,2,4,8
";
