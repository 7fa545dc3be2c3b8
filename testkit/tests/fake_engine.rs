//! The fake engine answers as an engine started with the agent's command line would:
//! it records that command line, reports loading, then serves the OpenAI protocol.

use std::process::{Child, Command};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use skein_testkit::net::free_port;

struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

async fn wait_healthy(client: &reqwest::Client, base: &str) -> Duration {
    let start = Instant::now();
    loop {
        if let Ok(r) = client.get(format!("{base}/health")).send().await
            && r.status().is_success()
        {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "the fake engine never became healthy"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn records_its_command_line_and_serves_the_openai_protocol() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let record = dir.path().join("record.json");
    let port = free_port();
    let args = [
        "serve",
        "org/model",
        "--served-model-name",
        "lab.coder",
        "--host",
        "127.0.0.1",
        "--port",
        &port.to_string(),
        "--tensor-parallel-size",
        "2",
    ];
    let _engine = Running(
        Command::new(env!("CARGO_BIN_EXE_fake-engine"))
            .args(args)
            .env("CUDA_VISIBLE_DEVICES", "1,2")
            .env("VLLM_PP_LAYER_PARTITION", "40,40")
            .env("SKEIN_FAKE_ENGINE_RECORD", &record)
            .env("SKEIN_FAKE_ENGINE_READY_MS", "300")
            .spawn()
            .expect("start the fake engine"),
    );
    let base = format!("http://127.0.0.1:{port}");
    let client = reqwest::Client::new();
    // Loading: not healthy for its first 300 ms.
    let waited = wait_healthy(&client, &base).await;
    assert!(
        waited >= Duration::from_millis(250),
        "healthy after {waited:?}, before it had loaded"
    );

    let recorded: Value = serde_json::from_str(&std::fs::read_to_string(&record).expect("the record")).expect("JSON");
    assert_eq!(recorded["args"], json!(args));
    assert_eq!(recorded["env"]["CUDA_VISIBLE_DEVICES"], "1,2");
    assert_eq!(recorded["env"]["VLLM_PP_LAYER_PARTITION"], "40,40");

    let models: Value = client
        .get(format!("{base}/v1/models"))
        .send()
        .await
        .expect("models")
        .json()
        .await
        .expect("JSON");
    assert_eq!(models["data"][0]["id"], "lab.coder");

    let request = json!({ "model": "lab.coder", "messages": [{ "role": "user", "content": "hello there" }] });
    let reply: Value = client
        .post(format!("{base}/v1/chat/completions"))
        .json(&request)
        .send()
        .await
        .expect("chat")
        .json()
        .await
        .expect("JSON");
    assert_eq!(reply["choices"][0]["message"]["content"], "echo: hello there");
    assert_eq!(reply["usage"]["completion_tokens"], 3);

    let mut streamed = request.clone();
    streamed["stream"] = json!(true);
    let body = client
        .post(format!("{base}/v1/chat/completions"))
        .json(&streamed)
        .send()
        .await
        .expect("stream")
        .text()
        .await
        .expect("text");
    let content: String = body
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str::<Value>(d).expect("a chunk"))
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str().map(str::to_owned))
        .collect();
    assert_eq!(content, "echo: hello there");
    assert!(body.ends_with("data: [DONE]\n\n"));

    let wrong = client
        .post(format!("{base}/v1/chat/completions"))
        .json(&json!({ "model": "other", "messages": [{ "role": "user", "content": "hi" }] }))
        .send()
        .await
        .expect("chat");
    assert_eq!(wrong.status(), 404);
}

#[tokio::test]
async fn names_the_model_after_name_and_asks_for_the_key_it_was_given() {
    let port = free_port();
    let _engine = Running(
        Command::new(env!("CARGO_BIN_EXE_fake-engine"))
            .args([
                "engine",
                "serve",
                "--name",
                "hello.assistant",
                "--port",
                &port.to_string(),
            ])
            .env("SKEIN_FAKE_ENGINE_API_KEY", "sk-test")
            .spawn()
            .expect("start the fake engine"),
    );
    let base = format!("http://127.0.0.1:{port}");
    let client = reqwest::Client::new();
    wait_healthy(&client, &base).await;
    let without = client.get(format!("{base}/v1/models")).send().await.expect("models");
    assert_eq!(without.status(), 401);
    let wrong = client
        .get(format!("{base}/v1/models"))
        .bearer_auth("sk-other")
        .send()
        .await
        .expect("models");
    assert_eq!(wrong.status(), 401);
    let models: Value = client
        .get(format!("{base}/v1/models"))
        .bearer_auth("sk-test")
        .send()
        .await
        .expect("models")
        .json()
        .await
        .expect("JSON");
    assert_eq!(models["data"][0]["id"], "hello.assistant");
}

#[test]
fn exits_when_asked_to_crash_and_refuses_a_command_without_a_port() {
    let port = free_port().to_string();
    let status = Command::new(env!("CARGO_BIN_EXE_fake-engine"))
        .args(["--alias", "x", "--port", &port])
        .env("SKEIN_FAKE_ENGINE_EXIT_MS", "100")
        .status()
        .expect("run");
    assert_eq!(status.code(), Some(3));
    let out = Command::new(env!("CARGO_BIN_EXE_fake-engine"))
        .args(["--alias", "x"])
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no --port or --node-manager-port given"));
}
