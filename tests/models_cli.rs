//! `skein models inspect` and `skein models fit` end to end: the binary against a mock
//! Hugging Face Hub on loopback, with its own cache directory.

use std::path::Path;
use std::process::{Command, Output};

use skein_model_registry::GgmlType;
use skein_testkit::mock_hub::{MockHub, MockRepo};
use skein_testkit::{
    LLAMA_70B, LLAMA_70B_CONFIG, llama_8b_gguf, llama_70b_awq_tensors, llama_70b_tensors, llama_gguf, llama_gguf_split,
    shard,
};

const BASE: &str = "meta-llama/Meta-Llama-3-70B";
const GGUF_REPO: &str = "quantizer/Meta-Llama-3-70B-GGUF";
const AWQ_REPO: &str = "quantizer/Meta-Llama-3-70B-AWQ";
const FINETUNE_REPO: &str = "someone/Llama-3-70B-extended-vocab-GGUF";
const GGUF_ONLY: &str = "acme/Llama-8B-GGUF";

const AWQ_CONFIG: &str = r#"{
  "architectures": ["LlamaForCausalLM"], "model_type": "llama",
  "hidden_size": 8192, "intermediate_size": 28672, "num_attention_heads": 64,
  "num_hidden_layers": 80, "num_key_value_heads": 8, "vocab_size": 128256,
  "max_position_embeddings": 8192, "rope_theta": 500000.0, "tie_word_embeddings": false,
  "torch_dtype": "float16",
  "quantization_config": {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": true, "version": "gemm"}
}"#;

fn hub() -> MockHub {
    let (shards, index) = shard(llama_70b_tensors(), 5_000_000_000);
    let mut base = MockRepo::new(BASE)
        .tags(&["transformers", "safetensors", "llama"])
        .file("config.json", LLAMA_70B_CONFIG)
        .file("model.safetensors.index.json", index);
    for shard in shards {
        base = base.virtual_file(&shard.name, shard.prefix, shard.len);
    }
    let (q4, q4_len) = llama_gguf(LLAMA_70B, 128_256, 15, GgmlType::Q4_K, GgmlType::Q6_K);
    let q8 = llama_gguf_split(LLAMA_70B, 128_256, 7, GgmlType::Q8_0, GgmlType::Q8_0, 2);
    let [(q8_1, q8_1_len), (q8_2, q8_2_len)] = <[_; 2]>::try_from(q8).ok().unwrap();
    let (awq_shards, awq_index) = shard(llama_70b_awq_tensors(), 5_000_000_000);
    let mut awq = MockRepo::new(AWQ_REPO)
        .tags(&["transformers", "safetensors", "awq", "4-bit"])
        .quantized_from(BASE)
        .file("config.json", AWQ_CONFIG)
        .file("model.safetensors.index.json", awq_index);
    for shard in awq_shards {
        awq = awq.virtual_file(&shard.name, shard.prefix, shard.len);
    }
    let (small, small_len) = llama_8b_gguf(32_000);
    MockHub::start_in_background(vec![
        base,
        MockRepo::new(GGUF_REPO)
            .tags(&["gguf", "llama"])
            .quantized_from(BASE)
            .virtual_file("Meta-Llama-3-70B-Q4_K_M.gguf", q4, q4_len)
            .virtual_file("Meta-Llama-3-70B-Q8_0-00001-of-00002.gguf", q8_1, q8_1_len)
            .virtual_file("Meta-Llama-3-70B-Q8_0-00002-of-00002.gguf", q8_2, q8_2_len),
        awq,
        MockRepo::new(FINETUNE_REPO)
            .tags(&["safetensors"])
            .quantized_from(BASE)
            .file("config.json", LLAMA_70B_CONFIG.replace("128256", "130000"))
            .virtual_file("model.safetensors", Vec::new(), 1_000_000),
        MockRepo::new(GGUF_ONLY)
            .tags(&["gguf"])
            .virtual_file("llama-8b.Q4_K_M.gguf", small, small_len),
    ])
}

/// Runs `skein ARGS` against `hub` with `cache` as the Hugging Face cache and nothing
/// else from the environment that could change the answer.
fn skein(hub: &MockHub, cache: &Path, args: &[&str], offline: bool) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_skein"));
    hub.environment(&mut command, cache).args(args);
    if offline {
        command.env("HF_HUB_OFFLINE", "1");
    }
    command.output().expect("run skein")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The mock's address varies from run to run.
fn redact(hub: &MockHub, output: &str) -> String {
    output.replace(&hub.url, "http://mock-hub")
}

#[test]
fn inspect_lists_every_variant_from_headers_and_a_second_run_is_offline() {
    let hub = hub();
    let cache = tempfile::tempdir().unwrap();
    let out = skein(&hub, cache.path(), &["models", "inspect", BASE], false);
    assert!(out.status.success(), "{}", text(&out.stderr));
    insta::assert_snapshot!("inspect_70b", text(&out.stdout));
    // A 141 GB checkpoint and 115 GB of derivatives: planning read under 2 MB.
    let served = hub.bytes_served();
    eprintln!("inspect served {served} bytes in {} requests", hub.requests());
    assert!(served < 2_000_000, "served {served} bytes");
    assert!(
        text(&out.stderr).contains("no weights downloaded"),
        "{}",
        text(&out.stderr)
    );

    let requests = hub.requests();
    let again = skein(
        &hub,
        cache.path(),
        &["models", "inspect", BASE, "--output", "json"],
        false,
    );
    assert!(again.status.success(), "{}", text(&again.stderr));
    assert_eq!(hub.requests(), requests, "the second run went to the network");
    let json: serde_json::Value = serde_json::from_slice(&again.stdout).unwrap();
    assert_eq!(json["model"]["shape"]["params"]["architecture"], "llama");
    // The total the human output prints ("parameters    70,553,706,496 (…)"), in the JSON
    // too: the parts add up to it.
    let params = &json["model"]["shape"]["params"];
    assert_eq!(params["total"], 70_553_706_496_u64, "{params}");
    let parts: u64 = [
        "embeddings",
        "attention",
        "mlp",
        "router",
        "layer_norms",
        "final_norm",
        "lm_head",
    ]
    .iter()
    .map(|part| params[part].as_u64().unwrap())
    .sum();
    assert_eq!(params["total"], parts);
    assert!(
        text(&out.stdout).contains("parameters    70,553,706,496 "),
        "{}",
        text(&out.stdout)
    );
    assert_eq!(json["transfer"]["network_calls"], 0);
    let ids: Vec<&str> = json["model"]["variants"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["id"].as_str().unwrap())
        .collect();
    assert_eq!(
        ids,
        [
            BASE,
            "quantizer/Meta-Llama-3-70B-GGUF:Meta-Llama-3-70B-Q8_0-00001-of-00002.gguf",
            "quantizer/Meta-Llama-3-70B-GGUF:Meta-Llama-3-70B-Q4_K_M.gguf",
            AWQ_REPO,
        ]
    );
}

#[test]
fn derivative_headers_make_every_figure_exact() {
    let hub = hub();
    let cache = tempfile::tempdir().unwrap();
    let computed = skein(
        &hub,
        cache.path(),
        &["models", "inspect", BASE, "--output", "json"],
        false,
    );
    let exact = skein(
        &hub,
        cache.path(),
        &["models", "inspect", BASE, "--output", "json", "--derivative-headers"],
        false,
    );
    assert!(exact.status.success(), "{}", text(&exact.stderr));
    let computed: serde_json::Value = serde_json::from_slice(&computed.stdout).unwrap();
    let exact: serde_json::Value = serde_json::from_slice(&exact.stdout).unwrap();
    assert_eq!(
        exact["model"]["skipped"].as_array().unwrap().len(),
        1,
        "only the other model"
    );
    let variants = exact["model"]["variants"].as_array().unwrap();
    assert_eq!(variants.len(), 4);
    for (exact, computed) in variants.iter().zip(computed["model"]["variants"].as_array().unwrap()) {
        assert_eq!(exact["id"], computed["id"]);
        assert_eq!(exact["weights"]["origin"]["from"], "header", "{}", exact["id"]);
        // Computed from the file name or config and read from the headers: within 3 %.
        let bytes = |v: &serde_json::Value| v["weights"]["layers"].as_array().unwrap().len();
        assert_eq!(bytes(exact), 80);
        let loaded = |v: &serde_json::Value| {
            let w = &v["weights"];
            ["embeddings", "lm_head", "final_norm"]
                .iter()
                .map(|k| w[k].as_u64().unwrap())
                .sum::<u64>()
                + w["layers"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|l| {
                        ["attention_qo", "attention_kv", "mlp", "replicated"]
                            .iter()
                            .map(|k| l[k].as_u64().unwrap())
                            .sum::<u64>()
                    })
                    .sum::<u64>()
        };
        let (e, c) = (loaded(exact) as f64, loaded(computed) as f64);
        assert!((e - c).abs() / e < 0.03, "{}: {e} read vs {c} computed", exact["id"]);
    }
}

#[test]
fn pinned_variants_are_listed_with_exact_figures_and_wrong_pins_say_why() {
    let hub = hub();
    let cache = tempfile::tempdir().unwrap();
    let q4 = "quantizer/Meta-Llama-3-70B-GGUF:Meta-Llama-3-70B-Q4_K_M.gguf";
    let out = skein(
        &hub,
        cache.path(),
        &[
            "models",
            "inspect",
            BASE,
            "--derivatives",
            "0",
            "--variant",
            q4,
            "--variant",
            "quantizer/Meta-Llama-3-70B-GGUF:Meta-Llama-3-70B-Q2_K.gguf",
            "--variant",
            GGUF_ONLY,
        ],
        false,
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    let listed: Vec<&str> = stdout
        .lines()
        .filter(|l| l.contains(" gguf ") || l.contains(" safetensors "))
        .collect();
    assert_eq!(listed.len(), 2, "{stdout}");
    assert!(
        listed[1].contains(q4) && listed[1].ends_with("pinned, headers"),
        "{stdout}"
    );
    assert!(
        stdout.contains(
            "quantizer/Meta-Llama-3-70B-GGUF:Meta-Llama-3-70B-Q2_K.gguf: pinned, but the repository has no such weights"
        ),
        "{stdout}"
    );
    assert!(
        stdout.contains("acme/Llama-8B-GGUF:llama-8b.Q4_K_M.gguf: its weights are of another model: 32 layers, not 80, 4096 hidden width, not 8192"),
        "{stdout}"
    );
}

#[test]
fn offline_mode_answers_from_the_cache_and_fails_clearly_without_it() {
    let hub = hub();
    let cache = tempfile::tempdir().unwrap();
    let online = skein(&hub, cache.path(), &["models", "inspect", BASE], false);
    assert!(online.status.success(), "{}", text(&online.stderr));
    let requests = hub.requests();

    let offline = skein(&hub, cache.path(), &["models", "inspect", BASE], true);
    assert!(offline.status.success(), "{}", text(&offline.stderr));
    assert_eq!(text(&offline.stdout), text(&online.stdout));
    assert_eq!(hub.requests(), requests);

    let missing = skein(&hub, cache.path(), &["models", "inspect", GGUF_ONLY], true);
    assert_eq!(missing.status.code(), Some(1));
    assert!(missing.stdout.is_empty());
    assert_eq!(hub.requests(), requests, "offline mode sent a request");
    let stderr = text(&missing.stderr).replace(&cache.path().display().to_string(), "[cache]");
    insta::assert_snapshot!("inspect_offline_miss", redact(&hub, &stderr));
}

#[test]
fn a_gguf_only_repository_is_sized_from_its_metadata() {
    let hub = hub();
    let cache = tempfile::tempdir().unwrap();
    let out = skein(&hub, cache.path(), &["models", "inspect", GGUF_ONLY], false);
    assert!(out.status.success(), "{}", text(&out.stderr));
    insta::assert_snapshot!("inspect_gguf_only", text(&out.stdout));
}

#[test]
fn fit_ranks_variants_and_explains_the_best_on_each_set() {
    let hub = hub();
    let cache = tempfile::tempdir().unwrap();
    let args = [
        "models",
        "fit",
        BASE,
        "--gpu",
        "A100-80GB",
        "--gpu",
        "RTX4090-24GB:2",
        "--gpu",
        "A100-80GB:2",
        "--gpu",
        "A100-80GB+RTX4090-24GB",
        "--context",
        "8192",
    ];
    let out = skein(&hub, cache.path(), &args, false);
    assert!(out.status.success(), "{}", text(&out.stderr));
    insta::assert_snapshot!("fit_70b", text(&out.stdout));

    let json = skein(&hub, cache.path(), &[&args[..], &["--output", "json"]].concat(), false);
    let json: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(json["model"]["shape"]["params"]["total"], 70_553_706_496_u64);
    let first = &json["fits"][0];
    assert_eq!(first["id"], BASE, "full precision fits two A100s, so it ranks first");
    assert_eq!(first["sets"][2]["fits"], true);
    assert_eq!(
        first["sets"][2]["placement"]["estimate"]["layout"]["tensor_parallel"],
        2
    );
}

#[test]
fn nothing_fits_exits_1_and_says_how_close_it_came() {
    let hub = hub();
    let cache = tempfile::tempdir().unwrap();
    let out = skein(
        &hub,
        cache.path(),
        &["models", "fit", BASE, "--gpu", "V100-16GB", "--derivatives", "0"],
        false,
    );
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    insta::assert_snapshot!("fit_nothing", text(&out.stdout));
}

#[test]
fn bad_arguments_are_named() {
    let hub = hub();
    let cache = tempfile::tempdir().unwrap();
    let run = |args: &[&str]| {
        let out = skein(&hub, cache.path(), args, false);
        (out.status.code(), text(&out.stderr))
    };
    let (code, err) = run(&["models", "fit", BASE, "--gpu", "A100"]);
    assert_eq!(code, Some(1));
    assert!(
        err.contains("in --gpu A100: unknown GPU `A100` (did you mean one of `A10-24GB`, `A100-80GB`, `A100-40GB`"),
        "{err}"
    );
    let (code, err) = run(&["models", "inspect", "not a repo"]);
    assert_eq!(code, Some(1));
    assert!(err.contains("not a repo"), "{err}");
    let (code, err) = run(&["models", "inspect", "meta-llama/Meta-Llama-3-70B@"]);
    assert_eq!(code, Some(1));
    assert!(err.contains("names no revision"), "{err}");
    let (code, err) = run(&["models", "fit", BASE, "--gpu", "A100-80GB", "--context", "0"]);
    assert_eq!(code, Some(1));
    assert!(err.contains("--context 0"), "{err}");
}
