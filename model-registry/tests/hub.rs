//! The hub edge against a mock hub on loopback: planning reads headers only (bytes
//! served are counted), the cache makes a second run request-free, offline mode works
//! from the cache and fails clearly without it, pickle-only repositories are refused,
//! and GGUF headers longer than the first range are read in growing ranges.
//!
//! Clients are configured through the builder, never through the process environment,
//! so the tests can run in parallel.

mod support;

use std::path::Path;
use std::time::Duration;

use skein_model_registry::hub::{
    GGUF_FIRST_RANGE, HubClient, HubClientBuilder, HubConfig, HubToken, RepoId, SAFETENSORS_FIRST_RANGE,
    VariantCandidate, VariantSource,
};
use skein_model_registry::{Error, ModelConfig, SafetensorsDtype, WeightFormat};
use support::mock_hub::{MockHub, MockRepo};
use support::{LLAMA_70B_CONFIG, llama_8b_gguf, llama_70b_tensors, safetensors_prefix, shard};

const BASE: &str = "meta-llama/Llama-70B-mock";
const GGUF_REPO: &str = "quantizer/Llama-70B-mock-GGUF";
const AWQ_REPO: &str = "quantizer/Llama-70B-mock-AWQ";
const PICKLE_REPO: &str = "legacy/pickle-only";
const GGUF_FILE: &str = "Llama-8B-Q4_K_M.gguf";

/// Parameters of the Llama-3-70B-shaped checkpoint.
const LLAMA_70B_PARAMS: u64 = 70_553_706_496;

/// Shard size limit of `transformers`' `save_pretrained` default (`5GB`).
const MAX_SHARD_BYTES: u64 = 5_000_000_000;

fn repos() -> Vec<MockRepo> {
    let (shards, index) = shard(llama_70b_tensors(), MAX_SHARD_BYTES);
    let mut base = MockRepo::new(BASE)
        .tags(&["transformers", "safetensors", "llama"])
        .file("config.json", LLAMA_70B_CONFIG)
        .file(
            "generation_config.json",
            r#"{"bos_token_id": 128000, "eos_token_id": 128001}"#,
        )
        .file("model.safetensors.index.json", index)
        .file("README.md", "# a mock\n");
    for shard in shards {
        base = base.virtual_file(&shard.name, shard.prefix, shard.len);
    }
    let (gguf, gguf_len) = llama_8b_gguf(100_000);
    vec![
        base,
        MockRepo::new(GGUF_REPO)
            .tags(&["gguf", "llama"])
            .quantized_from(BASE)
            .virtual_file(GGUF_FILE, gguf, gguf_len),
        MockRepo::new(AWQ_REPO)
            .tags(&["transformers", "safetensors", "awq", "4-bit"])
            .quantized_from(BASE),
        MockRepo::new("someone/unrelated").tags(&["gguf"]),
        MockRepo::new(PICKLE_REPO)
            .file("config.json", LLAMA_70B_CONFIG)
            .virtual_file("pytorch_model.bin", b"PK\x03\x04".to_vec(), 500_000_000)
            .file("training_args.bin", b"PK\x03\x04".to_vec()),
    ]
}

/// A client of `hub` with its cache in `cache`, independent of the process environment.
fn client(hub: &MockHub, cache: &Path) -> HubClientBuilder {
    client_at(&hub.url, cache)
}

fn client_at(url: &str, cache: &Path) -> HubClientBuilder {
    HubClientBuilder::from_config(HubConfig::from_lookup(|_| None))
        .endpoint(url)
        .cache_dir(cache)
        .token(None)
        .offline(false)
        .request_timeout(Duration::from_secs(30))
}

/// What `skein models inspect` needs from the hub for a safetensors model.
#[derive(Debug, PartialEq)]
struct Inspection {
    sha: String,
    shards: usize,
    stored_params: u64,
    tensor_bytes: u64,
    index_total_size: Option<u64>,
    variants: Vec<VariantCandidate>,
}

async fn inspect(client: &HubClient, repo: &str) -> Result<Inspection, Error> {
    let repo = RepoId::parse(repo)?;
    let resolved = client.resolve(&repo, "main").await?;
    let config = client
        .fetch_small(&resolved, "config.json")
        .await?
        .expect("config.json");
    ModelConfig::from_json(std::str::from_utf8(&config).unwrap())?;
    client.fetch_small(&resolved, "generation_config.json").await?;
    assert_eq!(client.fetch_small(&resolved, "tokenizer_config.json").await?, None);
    let checkpoint = client
        .safetensors_checkpoint(&resolved)
        .await?
        .expect("safetensors weights");
    Ok(Inspection {
        sha: resolved.sha.to_string(),
        shards: checkpoint.files.len(),
        stored_params: checkpoint.stored_params().unwrap(),
        tensor_bytes: checkpoint.tensor_bytes().unwrap().get(),
        index_total_size: checkpoint.index.as_ref().and_then(|i| i.total_size()).map(|b| b.get()),
        variants: client.discover_variants(&resolved).await?,
    })
}

#[tokio::test]
async fn inspecting_a_140_gb_checkpoint_transfers_headers_only() {
    let repos = repos();
    let repo_bytes = repos[0].total_bytes();
    let hub = MockHub::start(repos).await;
    let cache = tempfile::tempdir().unwrap();
    let client = client(&hub, cache.path()).build().unwrap();

    let inspection = inspect(&client, BASE).await.unwrap();

    assert!(
        repo_bytes > 140_000_000_000,
        "the mock checkpoint is {repo_bytes} bytes"
    );
    assert_eq!(inspection.stored_params, LLAMA_70B_PARAMS);
    assert_eq!(inspection.tensor_bytes, 2 * LLAMA_70B_PARAMS);
    assert_eq!(inspection.index_total_size, Some(2 * LLAMA_70B_PARAMS));
    assert!(inspection.shards >= 28, "{} shards", inspection.shards);
    let served = hub.bytes_served();
    let stats = client.stats();
    eprintln!(
        "140 GB checkpoint ({} shards): {} bytes served in {} requests; client: {stats:?}",
        inspection.shards,
        served,
        hub.requests()
    );
    assert!(served < 2_000_000, "{served} bytes served");
    assert!(stats.file_bytes < 2_000_000, "{stats:?}");
    // One range read per shard: the first read is sized from the index's tensor names.
    assert_eq!(stats.range_reads, inspection.shards as u64, "{:#?}", hub.log());
    let weight_gets: Vec<String> = hub
        .log()
        .into_iter()
        .filter(|line| line.starts_with("GET ") && (line.contains(".safetensors [") || line.ends_with(".safetensors")))
        .collect();
    assert_eq!(weight_gets.len(), inspection.shards);
    assert!(
        weight_gets.iter().all(|line| line.contains("[bytes=0-")),
        "every weight-file GET is one range read from the start: {weight_gets:#?}"
    );
}

#[tokio::test]
async fn a_second_run_with_the_same_cache_makes_no_request() {
    let hub = MockHub::start(repos()).await;
    let cache = tempfile::tempdir().unwrap();
    let first = inspect(&client(&hub, cache.path()).build().unwrap(), BASE)
        .await
        .unwrap();
    let gguf_first = {
        let client = client(&hub, cache.path()).build().unwrap();
        let resolved = client
            .resolve(&RepoId::parse(GGUF_REPO).unwrap(), "main")
            .await
            .unwrap();
        client.gguf_header(&resolved, GGUF_FILE).await.unwrap()
    };
    let requests = hub.requests();
    let served = hub.bytes_served();

    let fresh = client(&hub, cache.path()).build().unwrap();
    let second = inspect(&fresh, BASE).await.unwrap();
    let resolved = fresh.resolve(&RepoId::parse(GGUF_REPO).unwrap(), "main").await.unwrap();
    let gguf_second = fresh.gguf_header(&resolved, GGUF_FILE).await.unwrap();

    assert_eq!(second, first);
    assert_eq!(gguf_second, gguf_first);
    assert_eq!(
        hub.requests(),
        requests,
        "new requests: {:#?}",
        &hub.log()[requests as usize..]
    );
    assert_eq!(hub.bytes_served(), served);
    assert_eq!(fresh.stats().network_calls, 0);

    // With no trust in cached branch resolutions, only the resolution is asked again:
    // headers and small files are cached by commit.
    let strict = client(&hub, cache.path()).ref_max_age(Duration::ZERO).build().unwrap();
    assert_eq!(inspect(&strict, BASE).await.unwrap(), first);
    let log = hub.log();
    let asked = &log[requests as usize..];
    assert!(
        asked.iter().all(|line| line.starts_with("GET /api/")),
        "only API calls, no file reads: {asked:#?}"
    );
}

#[tokio::test]
async fn offline_mode_answers_from_the_cache_and_fails_clearly_without_it() {
    let hub = MockHub::start(repos()).await;
    let cache = tempfile::tempdir().unwrap();
    let online = inspect(&client(&hub, cache.path()).build().unwrap(), BASE)
        .await
        .unwrap();
    let requests = hub.requests();

    let offline = client(&hub, cache.path()).offline(true).build().unwrap();
    assert_eq!(inspect(&offline, BASE).await.unwrap(), online);
    // A commit id resolves offline too.
    let by_sha = offline
        .resolve(&RepoId::parse(BASE).unwrap(), &online.sha)
        .await
        .unwrap();
    assert_eq!(by_sha.sha.as_str(), online.sha);

    let empty = tempfile::tempdir().unwrap();
    let cold = client(&hub, empty.path()).offline(true).build().unwrap();
    let err = inspect(&cold, BASE).await.unwrap_err();
    assert!(matches!(err, Error::HubOffline { .. }), "{err:?}");
    let message = err.to_string();
    assert_eq!(
        message,
        format!(
            "HF_HUB_OFFLINE is set, and the cache at {} lacks the file list at revision `main` of \
             `{BASE}`; help: run once online (with HF_HUB_OFFLINE unset) to fill the cache, or unset \
             HF_HUB_OFFLINE",
            empty.path().display()
        )
    );
    // A repository never seen, in a warm cache: the same clear error.
    let err = offline
        .resolve(&RepoId::parse(GGUF_REPO).unwrap(), "main")
        .await
        .unwrap_err();
    assert!(err.to_string().contains(GGUF_REPO), "{err}");
    assert!(matches!(err, Error::HubOffline { .. }), "{err:?}");

    assert_eq!(hub.requests(), requests, "offline clients sent nothing");
    assert_eq!(offline.stats().network_calls + cold.stats().network_calls, 0);
}

#[tokio::test]
async fn an_unreachable_hub_falls_back_to_the_cached_file_list() {
    let hub = MockHub::start(repos()).await;
    let cache = tempfile::tempdir().unwrap();
    let first = inspect(&client(&hub, cache.path()).build().unwrap(), BASE)
        .await
        .unwrap();
    let url = hub.url.clone();
    drop(hub);

    // The cached resolution of `main` is stale at once, but the hub is gone.
    let client = client_at(&url, cache.path())
        .ref_max_age(Duration::ZERO)
        .request_timeout(Duration::from_secs(5))
        .max_retries(0)
        .build()
        .unwrap();
    assert_eq!(inspect(&client, BASE).await.unwrap(), first);
    // Without a cached answer, the failure is reported.
    let err = client
        .resolve(&RepoId::parse(GGUF_REPO).unwrap(), "main")
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Hub { .. } | Error::HubTimeout { .. }), "{err:?}");
}

#[tokio::test]
async fn pickle_only_repositories_are_refused_unless_allowed() {
    let hub = MockHub::start(repos()).await;
    let cache = tempfile::tempdir().unwrap();
    let client_ = client(&hub, cache.path()).build().unwrap();
    let repo = RepoId::parse(PICKLE_REPO).unwrap();
    let resolved = client_.resolve(&repo, "main").await.unwrap();

    let err = client_.safetensors_checkpoint(&resolved).await.unwrap_err();
    assert_eq!(
        err.to_string(),
        "`legacy/pickle-only` offers only pickle weights (pytorch_model.bin), which can run arbitrary \
         code when loaded; help: choose a safetensors or GGUF variant of the model, or opt in to pickle \
         weights (allow_pickle)"
    );
    assert!(matches!(client_.weight_files(&resolved), Err(Error::PickleOnly { .. })));

    let allowing = client(&hub, cache.path()).allow_pickle(true).build().unwrap();
    let weights = allowing.weight_files(&resolved).unwrap();
    assert_eq!(weights.pickle.len(), 1);
    assert_eq!(allowing.safetensors_checkpoint(&resolved).await.unwrap(), None);
}

#[tokio::test]
async fn gguf_headers_longer_than_the_first_range_are_read_in_growing_ranges() {
    let (prefix, file_len) = llama_8b_gguf(100_000);
    let header_len = prefix.len() as u64;
    assert!(header_len > 2 * GGUF_FIRST_RANGE, "the header is {header_len} bytes");
    assert!(file_len > 4_000_000_000, "the file is {file_len} bytes");

    let hub = MockHub::start(repos()).await;
    let cache = tempfile::tempdir().unwrap();
    let client = client(&hub, cache.path()).build().unwrap();
    let resolved = client
        .resolve(&RepoId::parse(GGUF_REPO).unwrap(), "main")
        .await
        .unwrap();
    let before = hub.bytes_served();
    let gguf = client.gguf_header(&resolved, GGUF_FILE).await.unwrap();
    let served = hub.bytes_served() - before;

    assert_eq!(gguf.header.header_len(), header_len);
    assert_eq!(gguf.size, file_len);
    assert_eq!(
        gguf.header.tensor_data_offset() + gguf.header.data_len().get(),
        file_len
    );
    let tokens = gguf.header.get("tokenizer.ggml.tokens").unwrap().as_array().unwrap();
    assert_eq!(tokens.len, 100_000);
    assert_eq!(gguf.header.tensors().len(), 2 + 32 * 9 + 1);

    let ranges: Vec<String> = hub.log().into_iter().filter(|l| l.contains("[bytes=")).collect();
    eprintln!("GGUF header of {header_len} bytes: {served} bytes served, ranges {ranges:?}");
    assert_eq!(
        ranges.iter().map(|l| l.rsplit('[').next().unwrap()).collect::<Vec<_>>(),
        ["bytes=0-1048575]", "bytes=1048576-2097151]", "bytes=2097152-4194303]"],
        "each read continues where the last ended and doubles what was read"
    );
    assert!(served < 2 * header_len, "{served} bytes served");
    assert_eq!(client.stats().range_reads, 3);
}

#[tokio::test]
async fn a_safetensors_header_longer_than_the_first_range_takes_one_more_read() {
    let tensors: Vec<_> = (0..2000)
        .map(|i| (format!("model.layers.{i}.weight"), SafetensorsDtype::F16, vec![64, 64]))
        .collect();
    let (prefix, len) = safetensors_prefix(&tensors);
    assert!(prefix.len() as u64 > SAFETENSORS_FIRST_RANGE);
    let hub = MockHub::start(vec![MockRepo::new("solo/one-file").virtual_file(
        "model.safetensors",
        prefix.clone(),
        len,
    )])
    .await;
    let cache = tempfile::tempdir().unwrap();
    let client = client(&hub, cache.path()).build().unwrap();
    let resolved = client
        .resolve(&RepoId::parse("solo/one-file").unwrap(), "main")
        .await
        .unwrap();

    let checkpoint = client.safetensors_checkpoint(&resolved).await.unwrap().unwrap();
    assert_eq!(checkpoint.index, None);
    assert_eq!(checkpoint.files.len(), 1);
    assert_eq!(checkpoint.files[0].header_len + 8, prefix.len() as u64);
    assert_eq!(checkpoint.stored_params(), Some(2000 * 64 * 64));
    assert_eq!(client.stats().range_reads, 2);
    assert_eq!(
        client.stats().file_bytes,
        prefix.len() as u64,
        "no byte past the header"
    );
}

#[tokio::test]
async fn variants_are_the_repos_own_checkpoints_and_its_quantized_derivatives() {
    let hub = MockHub::start(repos()).await;
    let cache = tempfile::tempdir().unwrap();
    let client = client(&hub, cache.path()).build().unwrap();
    let base = client.resolve(&RepoId::parse(BASE).unwrap(), "main").await.unwrap();
    let variants = client.discover_variants(&base).await.unwrap();
    let summary: Vec<(&str, Option<&str>, Option<WeightFormat>, VariantSource)> = variants
        .iter()
        .map(|v| (v.repo.as_str(), v.file.as_deref(), v.format, v.source))
        .collect();
    assert_eq!(
        summary,
        [
            (BASE, None, Some(WeightFormat::Safetensors), VariantSource::ThisRepo),
            (
                AWQ_REPO,
                None,
                Some(WeightFormat::Safetensors),
                VariantSource::QuantizedDerivative
            ),
            (
                GGUF_REPO,
                None,
                Some(WeightFormat::Gguf),
                VariantSource::QuantizedDerivative
            ),
        ]
    );
    assert!(variants[0].size.unwrap() > 140_000_000_000);
    assert!(
        hub.log()
            .iter()
            .any(|l| l.contains("filter=base_model%3Aquantized%3Ameta-llama%2FLlama-70B-mock")),
        "{:#?}",
        hub.log()
    );

    // A derivative, resolved, lists its GGUF files.
    let gguf = client.resolve(&variants[2].repo, "main").await.unwrap();
    let files: Vec<_> = skein_model_registry::hub::repo_variants(&gguf)
        .into_iter()
        .map(|v| (v.file, v.format))
        .collect();
    assert_eq!(files, [(Some(GGUF_FILE.to_owned()), Some(WeightFormat::Gguf))]);
}

#[tokio::test]
async fn hub_failures_name_the_repository_and_the_fix() {
    let hub = MockHub::start(repos()).await;
    let cache = tempfile::tempdir().unwrap();
    let client = client(&hub, cache.path()).build().unwrap();

    let err = client
        .resolve(&RepoId::parse("nobody/missing").unwrap(), "main")
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Hub { .. }), "{err:?}");
    let message = err.to_string();
    assert!(message.starts_with("cannot read the repository info at revision `main` for `nobody/missing`"));
    assert!(message.contains("help: check the repository id"), "{message}");
    assert!(
        std::error::Error::source(&err).is_some(),
        "the hub error is kept as the cause"
    );

    let base = client.resolve(&RepoId::parse(BASE).unwrap(), "main").await.unwrap();
    let err = client.gguf_header(&base, "nope.gguf").await.unwrap_err();
    assert_eq!(
        err.to_string(),
        format!("`{BASE}` has no file `nope.gguf` at commit {}", base.sha)
    );
    // A safetensors shard is not a GGUF file: the parser's error is the cause.
    let shard = base.files.iter().find(|f| f.path.ends_with(".safetensors")).unwrap();
    let err = client.gguf_header(&base, &shard.path).await.unwrap_err();
    assert!(matches!(err, Error::HubHeader { .. }), "{err:?}");
    let cause = std::error::Error::source(&err).unwrap().to_string();
    assert!(cause.starts_with("not a GGUF file"), "{cause}");
}

#[tokio::test]
async fn the_token_is_sent_to_the_hub_and_never_printed() {
    let hub = MockHub::start(repos()).await;
    let cache = tempfile::tempdir().unwrap();
    let client = client(&hub, cache.path())
        .token(HubToken::new("hf_very_secret"))
        .build()
        .unwrap();
    client.resolve(&RepoId::parse(BASE).unwrap(), "main").await.unwrap();
    assert!(hub.authorizations().iter().all(|a| a == "Bearer hf_very_secret"));
    assert!(!hub.authorizations().is_empty());
    let printed = format!("{client:?}");
    assert!(!printed.contains("hf_very_secret"), "{printed}");
}

/// `inspect` tells an embedding model from what the hub lists, without weights: a
/// sentence-transformers repository (its `modules.json`), with the pooling its pooling
/// module states; the same checkpoint without those files generates.
#[tokio::test]
async fn inspect_tells_an_embedding_model_by_its_sentence_transformers_files() {
    use skein_model_registry::hub::InspectOptions;
    use skein_model_registry::{ModelTask, Pooling};
    const EMBEDDER: &str = "lab/Llama-70B-mock-embedder";
    let (shards, index) = shard(llama_70b_tensors(), MAX_SHARD_BYTES);
    let mut embedder = MockRepo::new(EMBEDDER)
        .tags(&["sentence-transformers", "safetensors", "llama"])
        .file("config.json", LLAMA_70B_CONFIG)
        .file("model.safetensors.index.json", index)
        .file(
            "modules.json",
            r#"[{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
                {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]"#,
        )
        .file(
            "1_Pooling/config.json",
            r#"{"word_embedding_dimension": 8192, "pooling_mode_cls_token": false,
                "pooling_mode_mean_tokens": false, "pooling_mode_lasttoken": true}"#,
        );
    for shard in shards {
        embedder = embedder.virtual_file(&shard.name, shard.prefix, shard.len);
    }
    let mut all = repos();
    all.push(embedder);
    let hub = MockHub::start(all).await;
    let cache = tempfile::tempdir().unwrap();
    let client = client(&hub, cache.path()).build().unwrap();
    let options = InspectOptions {
        derivatives: 0,
        ..InspectOptions::default()
    };
    let info = client
        .inspect(&RepoId::parse(EMBEDDER).unwrap(), "main", &options)
        .await
        .unwrap();
    assert_eq!(
        info.task,
        ModelTask::Embed {
            pooling: Some(Pooling::Last)
        }
    );
    assert!(
        !info.builtin_engine_loads(&info.variants[0]),
        "the built-in engine only generates"
    );
    let base = client
        .inspect(&RepoId::parse(BASE).unwrap(), "main", &options)
        .await
        .unwrap();
    assert_eq!(base.task, ModelTask::Generate);
}
