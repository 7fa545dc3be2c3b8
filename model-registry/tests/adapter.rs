//! LoRA adapters read from a mock hub on loopback: a PEFT adapter from its config and
//! the Range-read header of its safetensors file (never its data), a llama.cpp GGUF
//! adapter through the GGUF header reader, their memory per engine, and every hostile or
//! broken repository refused with an error that names the repository, the file, the
//! field or tensor, and what to do.
#![cfg(feature = "hub")]

mod support;

use std::path::Path;
use std::time::Duration;

use skein_model_registry::adapter::{AdapterError, AdapterFormat, TargetModules};
use skein_model_registry::estimate::{AdapterEngine, AdapterSize, VllmLoraSettings, adapter_memory};
use skein_model_registry::hub::{HubClient, HubClientBuilder, HubConfig, RepoId, SAFETENSORS_FIRST_RANGE};
use skein_model_registry::{Bytes, Error, GgmlType, ModelConfig, SafetensorsDtype, error_chain, estimate::ModelShape};
use support::adapter::{Proj, adapter_config, gguf_lora, peft_lora_tensors};
use support::mock_hub::{MockHub, MockRepo};
use support::{Kv, LLAMA_8B, gguf_prefix, safetensors_prefix};

const BASE: &str = "meta-llama/Meta-Llama-3-8B";
const PEFT_REPO: &str = "someone/llama3-8b-sql-lora";
const GGUF_REPO: &str = "someone/llama3-8b-sql-lora-GGUF";
const GGUF_FILE: &str = "llama3-8b-sql-lora-f16.gguf";
const CONFIG: &str = "adapter_config.json";
const WEIGHTS: &str = "adapter_model.safetensors";
const QKVO: [Proj; 4] = [Proj::Q, Proj::K, Proj::V, Proj::O];

/// Elements of a rank-16 q/k/v/o adapter of Llama-3-8B: 32 layers × (q and o: 16 ×
/// (4096 + 4096) each; k and v: 16 × (4096 + 1024) each) = 32 × 425,984.
const QKVO_R16_ELEMENTS: u64 = 13_631_488;

fn client(hub: &MockHub, cache: &Path) -> HubClientBuilder {
    HubClientBuilder::from_config(HubConfig::from_lookup(|_| None))
        .endpoint(&hub.url)
        .cache_dir(cache)
        .token(None)
        .offline(false)
        .request_timeout(Duration::from_secs(30))
}

/// A PEFT repository: the config as given, and a virtual `adapter_model.safetensors`
/// with a real header for `tensors` followed by zeros.
fn peft_repo(id: &str, config: Option<Vec<u8>>, tensors: &[support::Tensor]) -> MockRepo {
    let (prefix, len) = safetensors_prefix(tensors);
    let mut repo = MockRepo::new(id)
        .file("README.md", "# a LoRA adapter\n")
        .virtual_file(WEIGHTS, prefix, len);
    if let Some(config) = config {
        repo = repo.file(CONFIG, config);
    }
    repo
}

fn sql_lora() -> MockRepo {
    let tensors = peft_lora_tensors(LLAMA_8B, 16, &QKVO, SafetensorsDtype::BF16);
    peft_repo(
        PEFT_REPO,
        Some(adapter_config(BASE, 16, 32, &["q_proj", "k_proj", "v_proj", "o_proj"])),
        &tensors,
    )
}

fn llama_8b_shape() -> ModelShape {
    let config = ModelConfig::from_json(
        r#"{"model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32,
            "num_attention_heads": 32, "num_key_value_heads": 8,
            "intermediate_size": 14336, "vocab_size": 128256}"#,
    )
    .unwrap();
    ModelShape::from_config(&config).unwrap()
}

async fn inspect(hub: &MockHub, cache: &Path, repo: &str) -> Result<skein_model_registry::AdapterInfo, Error> {
    let client = client(hub, cache).build().unwrap();
    client.inspect_adapter(&RepoId::parse(repo).unwrap(), "main").await
}

#[tokio::test]
async fn a_peft_adapter_is_read_from_its_config_and_header_alone() {
    let repo = sql_lora();
    let file_len = repo.files[WEIGHTS].len();
    let hub = MockHub::start(vec![repo]).await;
    let cache = tempfile::tempdir().unwrap();
    let client: HubClient = client(&hub, cache.path()).build().unwrap();

    let info = client
        .inspect_adapter(&RepoId::parse(PEFT_REPO).unwrap(), "main")
        .await
        .unwrap();

    assert_eq!(info.repo.as_str(), PEFT_REPO);
    assert_eq!(info.peft_type, "LORA");
    assert_eq!((info.rank, info.alpha), (16, 32.0));
    let base = info.base_model.as_ref().expect("a base model");
    assert_eq!(base.repo.as_ref().map(RepoId::as_str), Some(BASE));
    assert_eq!(
        info.format,
        AdapterFormat::Peft {
            config: CONFIG.to_owned(),
            weights: WEIGHTS.to_owned()
        }
    );
    assert_eq!(info.tensors.tensors, 32 * 4 * 2);
    assert_eq!(info.elements(), QKVO_R16_ELEMENTS);
    assert_eq!(info.stored_bytes(), Bytes::new(2 * QKVO_R16_ELEMENTS));
    assert_eq!(info.lora.layers, (0..32).collect::<Vec<u64>>());
    assert_eq!(info.lora.kinds, ["k_proj", "o_proj", "q_proj", "v_proj"]);
    assert_eq!(info.lora.ranks, [16]);
    assert_eq!(info.lora.lora_elements, QKVO_R16_ELEMENTS);
    let k = info
        .lora
        .modules
        .iter()
        .find(|m| m.name == "model.layers.7.self_attn.k_proj")
        .unwrap();
    assert_eq!((k.layer, k.in_features, k.out_features), (Some(7), 4096, 1024));
    assert!(info.notes.is_empty(), "{:?}", info.notes);

    // Only the header crossed the wire: one range read of the weight file, from byte 0,
    // no longer than the first range, a sliver of the 26 MiB data section.
    let reads: Vec<String> = hub.log().into_iter().filter(|l| l.contains(WEIGHTS)).collect();
    let gets: Vec<&String> = reads.iter().filter(|l| l.starts_with("GET ")).collect();
    assert_eq!(gets.len(), 1, "{reads:#?}");
    assert!(
        gets[0].ends_with(&format!("[bytes=0-{}]", SAFETENSORS_FIRST_RANGE - 1)),
        "{reads:#?}"
    );
    let stats = client.stats();
    assert_eq!(stats.range_reads, 1, "{stats:?}");
    assert!(stats.file_bytes <= SAFETENSORS_FIRST_RANGE + 4096, "{stats:?}");
    assert!(
        hub.bytes_served() * 100 < file_len,
        "{} of {file_len} bytes",
        hub.bytes_served()
    );

    // The planner's figures for it: 26 MiB in BF16 (see the hand-worked unit test), one
    // 80 MiB vLLM slot on Llama-3-8B, cached once in host RAM.
    let size = AdapterSize::of(&info);
    let shape = llama_8b_shape();
    let settings = VllmLoraSettings::for_adapters(&[size], SafetensorsDtype::BF16, 1).unwrap();
    assert_eq!((settings.max_loras, settings.max_lora_rank), (1, 16));
    let vllm = adapter_memory(&shape, &[size], &AdapterEngine::Vllm(settings)).unwrap();
    assert_eq!(vllm.per_adapter, [Bytes::new(26 << 20)]);
    assert_eq!(vllm.engine_overhead, Bytes::new(80 << 20));
    assert_eq!(vllm.host, Bytes::new(26 << 20));
    assert_eq!(vllm.total, Bytes::new(106 << 20));
    let llama = adapter_memory(
        &shape,
        &[size],
        &AdapterEngine::LlamaCpp {
            convert_dtype: SafetensorsDtype::F16,
        },
    )
    .unwrap();
    assert_eq!(llama.gpu_per_device, Bytes::new(26 << 20));
    assert_eq!(llama.engine_overhead, Bytes::ZERO);

    // Keys sorted: whether serde_json keeps insertion order depends on the features the
    // rest of the workspace turns on.
    insta::with_settings!({ sort_maps => true }, {
        insta::assert_yaml_snapshot!("peft_adapter_summary", summary(&info));
    });

    // A second look is answered from the cache.
    let requests = hub.requests();
    let again = inspect(&hub, cache.path(), PEFT_REPO).await.unwrap();
    assert_eq!(again, info);
    assert_eq!(hub.requests(), requests, "{:#?}", &hub.log()[requests as usize..]);
}

/// What the planner shows of an adapter, without the per-module list.
fn summary(info: &skein_model_registry::AdapterInfo) -> serde_json::Value {
    serde_json::json!({
        "repo": info.repo,
        "sha": info.sha,
        "format": info.format,
        "base_model": info.base_model,
        "rank": info.rank,
        "alpha": info.alpha,
        "target_modules": info.target_modules,
        "tensors": info.tensors,
        "by_dtype": info.by_dtype,
        "modules": info.lora.modules.len(),
        "first_module": info.lora.modules.first(),
        "layers": format!("{}..={}", info.lora.layers.first().unwrap(), info.lora.layers.last().unwrap()),
        "kinds": info.lora.kinds,
        "notes": info.notes,
    })
}

#[tokio::test]
async fn a_gguf_adapter_is_read_through_the_gguf_header_reader() {
    let (prefix, len) = gguf_lora(LLAMA_8B, 16, 32.0, &QKVO, GgmlType::F16);
    let hub = MockHub::start(vec![
        MockRepo::new(GGUF_REPO)
            .file("README.md", "# GGUF LoRA\n")
            .virtual_file(GGUF_FILE, prefix, len),
    ])
    .await;
    let cache = tempfile::tempdir().unwrap();

    let info = inspect(&hub, cache.path(), GGUF_REPO).await.unwrap();

    assert_eq!(
        info.format,
        AdapterFormat::Gguf {
            file: GGUF_FILE.to_owned(),
            config: None
        }
    );
    assert_eq!((info.rank, info.alpha), (16, 32.0));
    assert_eq!(
        info.base_model
            .as_ref()
            .and_then(|b| b.repo.as_ref())
            .map(RepoId::as_str),
        Some(BASE)
    );
    assert_eq!(info.elements(), QKVO_R16_ELEMENTS);
    assert_eq!(info.stored_bytes(), Bytes::new(2 * QKVO_R16_ELEMENTS));
    assert_eq!(info.lora.kinds, ["attn_k", "attn_output", "attn_q", "attn_v"]);
    assert_eq!(
        info.target_modules,
        TargetModules::List(vec![
            "attn_k".into(),
            "attn_output".into(),
            "attn_q".into(),
            "attn_v".into()
        ])
    );
    assert_eq!(info.lora.layers.len(), 32);
    let q = &info.lora.modules[info
        .lora
        .modules
        .iter()
        .position(|m| m.name == "blk.0.attn_q.weight")
        .unwrap()];
    assert_eq!((q.rank, q.in_features, q.out_features), (16, 4096, 4096));
    assert!(
        hub.log()
            .iter()
            .any(|l| l.contains(GGUF_FILE) && l.contains("[bytes=0-"))
    );

    // llama.cpp loads it as stored: no slots, its F16 tensors.
    let memory = adapter_memory(
        &llama_8b_shape(),
        &[AdapterSize::of(&info)],
        &AdapterEngine::LlamaCpp {
            convert_dtype: SafetensorsDtype::F32,
        },
    )
    .unwrap();
    assert_eq!(memory.total, Bytes::new(26 << 20));
}

/// The error of inspecting a repository, as one line, checked to name the repository
/// and to carry each of `needles`.
async fn refused(repo: MockRepo, needles: &[&str]) -> Error {
    let id = repo.id.clone();
    let hub = MockHub::start(vec![repo]).await;
    let cache = tempfile::tempdir().unwrap();
    let error = inspect(&hub, cache.path(), &id).await.unwrap_err();
    let line = error_chain(&error);
    assert!(line.contains(&id), "the error names the repository: {line}");
    for needle in needles {
        assert!(line.contains(needle), "`{needle}` missing from: {line}");
    }
    // Nothing hostile is read in full: every weight-file read is a header's range.
    assert!(hub.bytes_served() < 2 << 20, "{} bytes served", hub.bytes_served());
    error
}

#[tokio::test]
async fn a_hostile_header_length_is_refused_before_reading_it() {
    let mut prefix = (u64::MAX / 2).to_le_bytes().to_vec();
    prefix.extend(b"{}");
    let repo = MockRepo::new(PEFT_REPO)
        .file(CONFIG, adapter_config(BASE, 16, 32, &["q_proj"]))
        .virtual_file(WEIGHTS, prefix, 80 << 30);
    let error = refused(repo, &[WEIGHTS, "header claims", "more than the 100000000"]).await;
    assert!(matches!(error, Error::HubHeader { .. }), "{error:?}");
}

#[tokio::test]
async fn lora_tensors_of_the_wrong_shape_are_named() {
    // lora_B of layer 3's v_proj is [1024, 8] under a lora_A of rank 16.
    let mut tensors = peft_lora_tensors(LLAMA_8B, 16, &QKVO, SafetensorsDtype::BF16);
    let bad = "base_model.model.model.layers.3.self_attn.v_proj.lora_B.weight";
    tensors.iter_mut().find(|t| t.0 == bad).unwrap().2 = vec![1024, 8];
    let repo = peft_repo(PEFT_REPO, Some(adapter_config(BASE, 16, 32, &["v_proj"])), &tensors);
    let error = refused(
        repo,
        &[
            WEIGHTS,
            bad,
            "[1024, 8]",
            "its rank 8",
            "differs from the rank 16",
            "help:",
        ],
    )
    .await;
    assert!(
        matches!(&error, Error::Adapter(AdapterError::HubAdapter { source, .. }) if matches!(**source, Error::Adapter(AdapterError::LoraTensorShape { .. }))),
        "{error:?}"
    );

    // A three-dimensional lora_A.
    let mut tensors = peft_lora_tensors(LLAMA_8B, 16, &[Proj::Q], SafetensorsDtype::BF16);
    tensors[0].2 = vec![16, 4096, 1];
    let repo = peft_repo(PEFT_REPO, Some(adapter_config(BASE, 16, 32, &["q_proj"])), &tensors);
    refused(
        repo,
        &[
            "layers.0.self_attn.q_proj.lora_A.weight",
            "must be a matrix [r, in_features]",
        ],
    )
    .await;

    // A lora_A whose partner is missing.
    let mut tensors = peft_lora_tensors(LLAMA_8B, 16, &[Proj::Q], SafetensorsDtype::BF16);
    tensors.retain(|t| t.0 != "base_model.model.model.layers.5.self_attn.q_proj.lora_B.weight");
    let repo = peft_repo(PEFT_REPO, Some(adapter_config(BASE, 16, 32, &["q_proj"])), &tensors);
    refused(repo, &["layers.5.self_attn.q_proj", "no `lora_B.weight`", "help:"]).await;

    // No LoRA tensor at all (a full checkpoint uploaded as an adapter).
    let tensors = vec![("model.norm.weight".to_owned(), SafetensorsDtype::BF16, vec![4096])];
    let repo = peft_repo(PEFT_REPO, Some(adapter_config(BASE, 16, 32, &["q_proj"])), &tensors);
    refused(repo, &["no LoRA tensors"]).await;
}

#[tokio::test]
async fn a_config_that_disagrees_with_the_weights_is_refused() {
    let tensors = peft_lora_tensors(LLAMA_8B, 16, &[Proj::Q], SafetensorsDtype::BF16);
    let repo = peft_repo(PEFT_REPO, Some(adapter_config(BASE, 8, 16, &["q_proj"])), &tensors);
    refused(
        repo,
        &[
            WEIGHTS,
            "layers.0.self_attn.q_proj.lora_A.weight` has shape [16, 4096]",
            "r = 8 in adapter_config.json",
        ],
    )
    .await;
}

#[tokio::test]
async fn bad_configs_are_refused_by_field() {
    let tensors = peft_lora_tensors(LLAMA_8B, 16, &[Proj::Q], SafetensorsDtype::BF16);
    let cases: [(&str, &[&str]); 5] = [
        (
            r#"{"r": 16, "lora_alpha": 32}"#,
            &["`peft_type` in adapter_config.json is missing"],
        ),
        (
            r#"{"peft_type": "LORA", "r": "sixteen"}"#,
            &["`r` in adapter_config.json is \"sixteen\""],
        ),
        (
            r#"{"peft_type": "LORA", "r": 16, "target_modules": {"q": 1}}"#,
            &["`target_modules`"],
        ),
        (
            r#"{"peft_type": "IA3", "target_modules": ["q_proj"]}"#,
            &["PEFT `IA3` adapter, not a LoRA", "help:"],
        ),
        (r#"{"peft_type": "LORA", "r": 16,"#, &["not a JSON object", "EOF"]),
    ];
    for (config, needles) in cases {
        let repo = peft_repo(PEFT_REPO, Some(config.as_bytes().to_vec()), &tensors);
        let mut needles = needles.to_vec();
        needles.push(CONFIG);
        let error = refused(repo, &needles).await;
        assert!(
            matches!(error, Error::Adapter(AdapterError::HubAdapter { ref file, .. }) if file == CONFIG),
            "{error:?}"
        );
    }
}

#[tokio::test]
async fn non_lora_peft_methods_are_refused_even_without_weights() {
    let repo = MockRepo::new(PEFT_REPO).file(
        CONFIG,
        r#"{"peft_type": "PREFIX_TUNING", "num_virtual_tokens": 20, "task_type": "CAUSAL_LM"}"#,
    );
    let error = refused(
        repo,
        &[
            "PREFIX_TUNING",
            "vLLM (--enable-lora) and llama.cpp (--lora) serve LoRA",
        ],
    )
    .await;
    assert!(
        matches!(&error, Error::Adapter(AdapterError::HubAdapter { source, .. }) if matches!(**source, Error::Adapter(AdapterError::NotLora { .. }))),
        "{error:?}"
    );
}

#[tokio::test]
async fn safetensors_weights_without_a_config_are_refused() {
    let tensors = peft_lora_tensors(LLAMA_8B, 16, &[Proj::Q], SafetensorsDtype::BF16);
    let error = refused(
        peft_repo(PEFT_REPO, None, &tensors),
        &[
            WEIGHTS,
            "no adapter_config.json",
            "help: PEFT's save_pretrained writes both files",
        ],
    )
    .await;
    assert!(
        matches!(error, Error::Adapter(AdapterError::AdapterConfigMissing { .. })),
        "{error:?}"
    );
}

#[tokio::test]
async fn a_repository_without_adapter_weights_is_refused() {
    let config = adapter_config(BASE, 16, 32, &["q_proj"]);
    let repo = MockRepo::new(PEFT_REPO)
        .file(CONFIG, config.clone())
        .file("README.md", "# empty\n");
    let error = refused(
        repo,
        &[
            "no LoRA adapter",
            "neither adapter_model.safetensors nor a GGUF adapter",
            "has adapter_config.json",
            "help:",
        ],
    )
    .await;
    assert!(
        matches!(error, Error::Adapter(AdapterError::NoAdapterWeights { .. })),
        "{error:?}"
    );

    let pickle = MockRepo::new(PEFT_REPO)
        .file(CONFIG, config)
        .file("adapter_model.bin", b"PK\x03\x04".to_vec());
    refused(pickle, &["adapter_model.bin is a pickle"]).await;
}

#[tokio::test]
async fn a_model_gguf_is_not_taken_for_an_adapter() {
    let (prefix, len) = gguf_prefix(
        &[
            ("general.architecture", Kv::Str("llama".to_owned())),
            ("general.type", Kv::Str("model".to_owned())),
        ],
        &[("blk.0.attn_q.weight".to_owned(), vec![4096, 4096], GgmlType::Q4_K)],
    );
    let repo = MockRepo::new(GGUF_REPO).virtual_file("model-Q4_K_M.gguf", prefix, len);
    let error = refused(
        repo,
        &[
            "model-Q4_K_M.gguf",
            "not a LoRA adapter",
            "`general.type` is string \"model\"",
            "help:",
        ],
    )
    .await;
    assert!(
        matches!(&error, Error::Adapter(AdapterError::HubAdapter { source, .. }) if matches!(**source, Error::Adapter(AdapterError::GgufNotAdapter { .. }))),
        "{error:?}"
    );
}

/// Three adapters of ranks 8, 16 and 64 on one Llama-3-8B instance: vLLM at TP 2 with
/// two slots cached three deep, and llama.cpp with one GGUF and two converted adapters.
#[test]
fn adapter_memory_per_engine() {
    let shape = llama_8b_shape();
    let adapters = [
        AdapterSize {
            rank: 8,
            elements: QKVO_R16_ELEMENTS / 2,
            stored: Bytes::new(QKVO_R16_ELEMENTS),
            gguf: true,
        },
        AdapterSize {
            rank: 16,
            elements: QKVO_R16_ELEMENTS,
            stored: Bytes::new(2 * QKVO_R16_ELEMENTS),
            gguf: false,
        },
        AdapterSize {
            rank: 64,
            elements: 4 * QKVO_R16_ELEMENTS,
            stored: Bytes::new(16 * QKVO_R16_ELEMENTS),
            gguf: false,
        },
    ];
    let mut vllm = VllmLoraSettings::for_adapters(&adapters, SafetensorsDtype::BF16, 2).unwrap();
    assert_eq!((vllm.max_loras, vllm.max_lora_rank), (3, 64));
    vllm.max_loras = 2;
    vllm.max_cpu_loras = Some(3);
    let engines = [
        AdapterEngine::Vllm(vllm),
        AdapterEngine::LlamaCpp {
            convert_dtype: SafetensorsDtype::F32,
        },
    ];
    let memory: Vec<_> = engines
        .iter()
        .map(|engine| adapter_memory(&shape, &adapters, engine).unwrap())
        .collect();
    insta::with_settings!({ sort_maps => true }, {
        insta::assert_yaml_snapshot!("adapter_memory_per_engine", memory);
    });
}
