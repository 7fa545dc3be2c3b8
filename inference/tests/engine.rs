//! The engine on the tiny generated Llama: downloaded from the mock hub through
//! `HubClient::download` (the path a real model takes), loaded, and chatted with, both
//! directly and over HTTP; and bad checkpoints refused with errors naming the file.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Value, json};
use skein_inference::{
    DeviceSpec, Engine, Error, FinishReason, GenerationRequest, ResponseFormat, ServeConfig, TemplateMessage,
};
use skein_model_registry::hub::{HubClientBuilder, HubConfig, RepoId};
use skein_testkit::mock_hub::MockHub;
use skein_testkit::tiny_llama;

/// Downloads the tiny model from a mock hub into `cache` and returns its snapshot.
async fn download_tiny(cache: &Path) -> PathBuf {
    let hub = MockHub::start(vec![tiny_llama::repo()]).await;
    let client = HubClientBuilder::from_config(HubConfig::from_lookup(|_| None))
        .endpoint(&hub.url)
        .cache_dir(cache)
        .token(None)
        .offline(false)
        .request_timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    let resolved = client
        .resolve(&RepoId::parse(tiny_llama::REPO_ID).unwrap(), "main")
        .await
        .unwrap();
    let files: Vec<String> = resolved.files.iter().map(|file| file.path.clone()).collect();
    client.download(&resolved, &files, |_| {}).await.unwrap()
}

/// The tiny model written straight into a temporary directory, for tests that break it.
fn tiny_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    tiny_llama::write_dir(dir.path()).unwrap();
    dir
}

fn user(text: &str) -> Vec<TemplateMessage> {
    vec![
        TemplateMessage::new("system", "You are terse."),
        TemplateMessage::new("user", text),
    ]
}

fn request(max_tokens: usize, temperature: f64, seed: u64) -> GenerationRequest {
    GenerationRequest {
        messages: user("Tell me about the weather in the hills."),
        max_tokens: Some(max_tokens),
        temperature: Some(temperature),
        top_p: None,
        seed,
        stop: Vec::new(),
        tools: Vec::new(),
        response_format: ResponseFormat::Text,
        force_tool_call: false,
    }
}

#[test]
fn the_tiny_tokenizer_round_trips_ascii_text() {
    let dir = tiny_dir();
    let tokenizer = tokenizers::Tokenizer::from_file(dir.path().join("tokenizer.json")).unwrap();
    let text = "The quick brown fox, 42 times: {\"json\": [1, 2]}\n\ttabs & <tags>!";
    let encoding = tokenizer.encode(text, false).unwrap();
    assert!(encoding.get_ids().len() < text.len(), "merges apply");
    assert_eq!(tokenizer.decode(encoding.get_ids(), false).unwrap(), text);
    let special = tokenizer.encode("<|im_start|>user", false).unwrap();
    assert_eq!(special.get_ids()[0], tiny_llama::special_id("<|im_start|>"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_downloaded_model_chats_deterministically_with_the_template_applied() {
    let cache = tempfile::tempdir().unwrap();
    let model = download_tiny(cache.path()).await;
    let mut engine = Engine::load(&model, &candle_core::Device::Cpu).unwrap();

    let prompt = engine.render_prompt(&user("Hi")).unwrap();
    assert_eq!(
        prompt,
        "<|begin_of_text|><|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    );
    let tokenizer = tokenizers::Tokenizer::from_file(model.join("tokenizer.json")).unwrap();
    let prompt_tokens = tokenizer.encode(prompt, false).unwrap().get_ids().len();

    let mut pieces = Vec::new();
    let first = engine
        .generate(
            &GenerationRequest {
                messages: user("Hi"),
                ..request(24, 0.0, 0)
            },
            |p| pieces.push(p.to_owned()),
        )
        .unwrap();
    assert_eq!(
        first.prompt_tokens, prompt_tokens,
        "the rendered template is what is tokenized"
    );
    assert_eq!(pieces.concat(), first.text);
    let again = engine
        .generate(
            &GenerationRequest {
                messages: user("Hi"),
                ..request(24, 0.0, 0)
            },
            |_| {},
        )
        .unwrap();
    assert_eq!(again, first);
    insta::assert_snapshot!(
        "greedy_completion",
        format!("{:?} {:?}", first.finish_reason, first.text)
    );

    let sampled = engine.generate(&request(24, 0.9, 7), |_| {}).unwrap();
    assert_eq!(
        engine.generate(&request(24, 0.9, 7), |_| {}).unwrap(),
        sampled,
        "same seed, same text"
    );
    let other_seed = engine.generate(&request(24, 0.9, 8), |_| {}).unwrap();
    assert_ne!(other_seed.text, sampled.text, "another seed samples otherwise");
}

#[test]
fn max_tokens_and_stop_strings_end_the_completion_and_usage_counts_them() {
    let dir = tiny_dir();
    let mut engine = Engine::load(dir.path(), &candle_core::Device::Cpu).unwrap();
    // The weights are random, so some seeds sample an end-of-sequence token early; the
    // first seed whose completion runs to the limit is the one to cut shorter.
    let (seed, long) = (0..32)
        .map(|seed| (seed, engine.generate(&request(16, 1.0, seed), |_| {}).unwrap()))
        .find(|(_, completion)| completion.finish_reason == FinishReason::Length)
        .expect("some seed runs to max_tokens");
    assert_eq!(long.completion_tokens, 16);
    let short = engine.generate(&request(5, 1.0, seed), |_| {}).unwrap();
    assert_eq!(
        (short.completion_tokens, short.finish_reason),
        (5, FinishReason::Length)
    );
    assert!(long.text.starts_with(&short.text), "{long:?} {short:?}");

    // A stop string taken from the middle of the longer completion cuts it there.
    let cut = long.text.char_indices().nth(long.text.chars().count() / 2).unwrap().0;
    let stop: String = long.text[cut..].chars().take(2).collect();
    let mut pieces = String::new();
    let stopped = engine
        .generate(
            &GenerationRequest {
                stop: vec![stop.clone()],
                ..request(16, 1.0, seed)
            },
            |p| pieces.push_str(p),
        )
        .unwrap();
    assert_eq!(stopped.finish_reason, FinishReason::Stop);
    assert_eq!(stopped.text, long.text[..long.text.find(&stop).unwrap()]);
    assert_eq!(pieces, stopped.text, "no part of the stop string was streamed");
}

/// Replaces `config.json` of `dir` after `change`, keeping the weights.
fn edit_config(dir: &Path, change: impl FnOnce(&mut Value)) {
    let mut config = tiny_llama::config();
    change(&mut config);
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
}

fn load_error(dir: &Path) -> Error {
    Engine::load(dir, &candle_core::Device::Cpu).unwrap_err()
}

#[test]
fn a_truncated_safetensors_file_is_named() {
    let dir = tiny_dir();
    let path = dir.path().join("model.safetensors");
    let bytes = std::fs::read(&path).unwrap();
    std::fs::write(&path, &bytes[..bytes.len() - 1000]).unwrap();
    let error = load_error(dir.path());
    assert!(
        matches!(&error, Error::Safetensors { path: p, .. } if *p == path),
        "{error:?}"
    );
    let chain = skein_model_registry::error_chain(&error);
    assert!(
        chain.contains("model.safetensors") && chain.contains("download it again"),
        "{chain}"
    );

    std::fs::write(&path, &bytes[..5]).unwrap();
    assert!(matches!(load_error(dir.path()), Error::Safetensors { .. }));
}

#[test]
fn a_missing_tensor_is_named_with_its_file() {
    let dir = tiny_dir();
    edit_config(dir.path(), |c| c["num_hidden_layers"] = json!(3));
    let error = load_error(dir.path());
    assert!(
        matches!(&error, Error::MissingTensor { tensor, location } if tensor == "model.layers.2.input_layernorm.weight" && location.ends_with("model.safetensors")),
        "{error:?}"
    );
    assert!(error.to_string().contains("model.safetensors"), "{error}");
}

#[test]
fn a_tensor_of_the_wrong_shape_is_named_with_both_shapes() {
    let dir = tiny_dir();
    edit_config(dir.path(), |c| c["intermediate_size"] = json!(96));
    let error = load_error(dir.path());
    assert!(
        matches!(&error, Error::TensorShape { tensor, expected, found, .. }
            if tensor == "model.layers.0.mlp.gate_proj.weight" && *expected == vec![96, 64] && *found == vec![128, 64]),
        "{error:?}"
    );
    insta::assert_snapshot!(
        "wrong_shape",
        error.to_string().replace(&dir.path().display().to_string(), "<dir>")
    );
}

#[test]
fn a_tokenizer_larger_than_the_model_vocabulary_is_refused() {
    let dir = tiny_dir();
    let mut config = tiny_llama::config();
    config["vocab_size"] = json!(260);
    config["bos_token_id"] = json!(1);
    config["eos_token_id"] = json!(2);
    std::fs::write(dir.path().join("config.json"), config.to_string()).unwrap();
    std::fs::write(dir.path().join("model.safetensors"), tiny_llama::safetensors(&config)).unwrap();
    let error = load_error(dir.path());
    assert!(
        matches!(&error, Error::VocabMismatch { tokenizer_vocab, model_vocab: 260, .. } if *tokenizer_vocab == tiny_llama::VOCAB_SIZE as usize),
        "{error:?}"
    );
    assert!(error.to_string().contains("tokenizer.json"), "{error}");
}

#[test]
fn missing_files_and_templates_are_named() {
    let dir = tiny_dir();
    let mut tokenizer_config: Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("tokenizer_config.json")).unwrap()).unwrap();
    tokenizer_config.as_object_mut().unwrap().remove("chat_template");
    std::fs::write(dir.path().join("tokenizer_config.json"), tokenizer_config.to_string()).unwrap();
    assert!(matches!(load_error(dir.path()), Error::ChatTemplateMissing { .. }));

    tokenizer_config["chat_template"] = json!("{% for m in messages %}{{ m.content }");
    std::fs::write(dir.path().join("tokenizer_config.json"), tokenizer_config.to_string()).unwrap();
    assert!(matches!(load_error(dir.path()), Error::ChatTemplate { .. }));

    std::fs::remove_file(dir.path().join("tokenizer.json")).unwrap();
    let error = load_error(dir.path());
    assert!(
        matches!(&error, Error::MissingFile { file, .. } if file == "tokenizer.json"),
        "{error:?}"
    );

    let dir = tiny_dir();
    edit_config(dir.path(), |c| c["architectures"] = json!(["GPT2LMHeadModel"]));
    let error = load_error(dir.path());
    assert!(error.to_string().contains("GPT2LMHeadModel"), "{error}");
}

async fn start(model: PathBuf) -> skein_inference::RunningEngine {
    start_keyed(model, None).await
}

async fn start_keyed(model: PathBuf, api_key: Option<skein_inference::ApiKey>) -> skein_inference::RunningEngine {
    skein_inference::serve(ServeConfig {
        model,
        served_name: "tiny".to_owned(),
        listen: "127.0.0.1:0".parse().unwrap(),
        seed: 0,
        device: DeviceSpec::Cpu,
        api_key,
    })
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_key_every_v1_route_needs_it_and_health_stays_open() {
    let dir = tiny_dir();
    let key = "0f".repeat(32);
    let mut engine = start_keyed(dir.path().to_path_buf(), skein_inference::ApiKey::new(&key)).await;
    engine.loaded().await.unwrap();
    let base = format!("http://{}", engine.local_addr());
    let http = reqwest::Client::new();
    let chat = json!({"model": "tiny", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2});

    assert_eq!(http.get(format!("{base}/health")).send().await.unwrap().status(), 200);
    let refused = [
        http.get(format!("{base}/v1/models")),
        http.post(format!("{base}/v1/chat/completions")).json(&chat),
        http.post(format!("{base}/v1/chat/completions"))
            .json(&chat)
            .bearer_auth("wrong"),
        http.post(format!("{base}/v1/chat/completions"))
            .json(&chat)
            .bearer_auth(&key[..63]),
        http.post(format!("{base}/v1/chat/completions"))
            .json(&chat)
            .header("authorization", format!("Basic {key}")),
    ];
    for request in refused {
        let response = request.send().await.unwrap();
        assert_eq!(response.status(), 401);
        assert_eq!(response.headers()["www-authenticate"], "Bearer");
        let body: Value = response.json().await.unwrap();
        assert_eq!(body["error"]["code"], "invalid_api_key", "{body}");
    }
    let models = http
        .get(format!("{base}/v1/models"))
        .bearer_auth(&key)
        .send()
        .await
        .unwrap();
    assert_eq!(models.status(), 200);
    // The scheme in any case (RFC 9110).
    let answered = http
        .post(format!("{base}/v1/chat/completions"))
        .json(&chat)
        .header("authorization", format!("bearer {key}"))
        .send()
        .await
        .unwrap();
    assert_eq!(answered.status(), 200);
    let body: Value = answered.json().await.unwrap();
    assert!(body["choices"][0]["message"]["content"].is_string(), "{body}");
    assert_eq!(
        format!("{:?}", skein_inference::ApiKey::new(&key)),
        "Some(ApiKey(<redacted>))"
    );
    assert!(
        skein_inference::ApiKey::new("  ").is_none(),
        "an empty key would let anyone in"
    );
    engine.stop().await;
}

/// The `data:` payloads of an SSE body.
fn sse_data(body: &str) -> Vec<String> {
    body.lines()
        .filter_map(|line| line.strip_prefix("data: ").or_else(|| line.strip_prefix("data:")))
        .map(str::to_owned)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_http_streaming_concatenates_to_the_whole_response() {
    let dir = tiny_dir();
    let mut engine = start(dir.path().to_path_buf()).await;
    engine.loaded().await.unwrap();
    let base = format!("http://{}", engine.local_addr());
    let http = reqwest::Client::new();

    let health = http.get(format!("{base}/health")).send().await.unwrap();
    assert_eq!(health.status(), 200);
    let models: Value = http
        .get(format!("{base}/v1/models"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(models["data"][0]["id"], "tiny");

    let body = json!({
        "model": "tiny",
        "messages": [{"role": "user", "content": "Write a line about rivers."}],
        "max_tokens": 20,
        "temperature": 0.7,
        "seed": 11,
    });
    let whole: Value = http
        .post(format!("{base}/v1/chat/completions"))
        .json(&body)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let text = whole["choices"][0]["message"]["content"].as_str().unwrap().to_owned();
    let usage = &whole["usage"];
    assert_eq!(
        usage["total_tokens"].as_u64().unwrap(),
        usage["prompt_tokens"].as_u64().unwrap() + usage["completion_tokens"].as_u64().unwrap()
    );
    assert!(usage["completion_tokens"].as_u64().unwrap() <= 20);

    let mut streaming = body.clone();
    streaming["stream"] = json!(true);
    let response = http
        .post(format!("{base}/v1/chat/completions"))
        .json(&streaming)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert!(
        response.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/event-stream")
    );
    let events = sse_data(&response.text().await.unwrap());
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let streamed: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(streamed, text);
    assert_eq!(
        chunks.last().unwrap()["choices"][0]["finish_reason"],
        whole["choices"][0]["finish_reason"]
    );

    let unknown = http
        .post(format!("{base}/v1/chat/completions"))
        .json(&json!({"model": "gpt-9", "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(unknown.status(), 404);
    let error: Value = unknown.json().await.unwrap();
    assert_eq!(error["error"]["code"], "model_not_found");
    assert!(error["error"]["message"].as_str().unwrap().contains("gpt-9"));

    let malformed = http
        .post(format!("{base}/v1/chat/completions"))
        .header("content-type", "application/json")
        .body("{\"model\": \"tiny\", \"messages\": 3}")
        .send()
        .await
        .unwrap();
    assert_eq!(malformed.status(), 400);
    let error: Value = malformed.json().await.unwrap();
    assert_eq!(error["error"]["type"], "invalid_request_error");
    engine.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_that_fails_to_load_resolves_to_the_error_and_health_says_so() {
    let dir = tiny_dir();
    edit_config(dir.path(), |c| c["num_hidden_layers"] = json!(3));
    let mut engine = start(dir.path().to_path_buf()).await;
    let base = format!("http://{}", engine.local_addr());
    let error = engine.loaded().await.unwrap_err();
    assert!(matches!(error, Error::MissingTensor { .. }), "{error:?}");
    let health = reqwest::get(format!("{base}/health")).await.unwrap();
    assert_eq!(health.status(), 503);
    let body: Value = health.json().await.unwrap();
    assert_eq!(body["status"], "failed");
    assert!(body["error"].as_str().unwrap().contains("model.layers.2"), "{body}");
    engine.stop().await;
}
