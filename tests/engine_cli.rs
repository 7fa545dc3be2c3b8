//! `skein engine serve`, the real binary on the tiny generated Llama: it prints where it
//! listens, answers `/health` once loaded, and chats; a broken checkpoint makes it exit 1
//! with the file named.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use skein_testkit::tiny_llama;

/// Kills the child when the test ends, however it ends.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn engine(model: &std::path::Path) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_skein"));
    command
        .args(["engine", "serve", "--model"])
        .arg(model)
        .args([
            "--name",
            "tiny",
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--seed",
            "5",
            "--device",
            "cpu",
        ])
        .env("NO_COLOR", "1")
        .env_remove("RUST_LOG");
    command
}

/// `POST /v1/chat/completions`, the answer as JSON.
async fn chat(http: &reqwest::Client, base: &str, body: &Value) -> Value {
    let response = http
        .post(format!("{base}/v1/chat/completions"))
        .json(body)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    response.json().await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn engine_serve_answers_health_and_chats() {
    let dir = tempfile::tempdir().unwrap();
    tiny_llama::write_dir(dir.path()).unwrap();
    let mut child = Killed(engine(dir.path()).stderr(Stdio::piped()).spawn().unwrap());
    let stderr = child.0.stderr.take().unwrap();
    let (addr_tx, addr_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if let Some(rest) = line.split("on http://").nth(1) {
                let _ = addr_tx.send(rest.split_whitespace().next().unwrap_or_default().to_owned());
            }
        }
    });
    let addr = addr_rx
        .recv_timeout(Duration::from_secs(30))
        .expect("the engine prints its address");
    let base = format!("http://{addr}");
    let http = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let status = http.get(format!("{base}/health")).send().await.unwrap().status();
        if status == 200 {
            break;
        }
        assert_eq!(status, 503, "health is 503 while loading");
        assert!(Instant::now() < deadline, "the model did not load in time");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let body = json!({
        "model": "tiny",
        "messages": [{"role": "user", "content": "Hello there"}],
        "max_tokens": 8,
        "temperature": 0,
    });
    let first = chat(&http, &base, &body).await;
    assert_eq!(first["object"], "chat.completion");
    assert_eq!(first["model"], "tiny");
    assert!(first["usage"]["completion_tokens"].as_u64().unwrap() <= 8);
    let second = chat(&http, &base, &body).await;
    assert_eq!(first["choices"], second["choices"]);
}

#[test]
fn engine_serve_exits_1_naming_the_file_when_the_model_is_broken() {
    let dir = tempfile::tempdir().unwrap();
    tiny_llama::write_dir(dir.path()).unwrap();
    let weights = dir.path().join("model.safetensors");
    let bytes = std::fs::read(&weights).unwrap();
    std::fs::write(&weights, &bytes[..bytes.len() / 2]).unwrap();
    let out = engine(dir.path()).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("model.safetensors"), "{stderr}");

    let out = engine(&dir.path().join("nowhere")).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
}
