//! The session REST API from a client's side, for the crash and shutdown tests: a bare
//! `skein server` (no agents) on fixed ports, sessions created once it answers, and a
//! session's stored messages read page by page. The tool-loop tests start their
//! servers (endpoint agents, no GPUs) the same way.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

/// A bare `skein server` on fixed ports with an admin token; SIGKILLed and reaped when
/// dropped.
pub struct BareServer(pub Child);

impl BareServer {
    /// Starts the `skein` binary at `skein` as a server on `127.0.0.1:api` (REST) and
    /// `127.0.0.1:grpc` (agents), keeping its data in `data`. With `log`, its log
    /// (`RUST_LOG=info`) is appended there; without, it is discarded.
    pub fn start(skein: &Path, data: &Path, api: u16, grpc: u16, token: &str, log: Option<&Path>) -> BareServer {
        BareServer::start_with(skein, data, api, grpc, token, log, &[])
    }

    /// [`BareServer::start`] with more arguments of `skein server`.
    pub fn start_with(
        skein: &Path,
        data: &Path,
        api: u16,
        grpc: u16,
        token: &str,
        log: Option<&Path>,
        extra: &[&str],
    ) -> BareServer {
        let mut command = Command::new(skein);
        command
            .args(["server", "--listen", &format!("127.0.0.1:{api}")])
            .args(["--agent-listen", &format!("127.0.0.1:{grpc}")])
            .args(["--api-token", token, "--data-dir"])
            .arg(data)
            .args(extra)
            .env("HF_HUB_OFFLINE", "1")
            .env("HF_HOME", data.join("hf"))
            .stdout(Stdio::null());
        match log {
            Some(log) => {
                let file = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(log)
                    .unwrap_or_else(|e| panic!("cannot open the server log {}: {e}", log.display()));
                command.env("RUST_LOG", "info").stderr(file);
            }
            None => {
                command.stderr(Stdio::null());
            }
        }
        let child = command
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", skein.display()));
        BareServer(child)
    }
}

impl Drop for BareServer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Creates a session for client `client` (its metadata), retrying for up to a minute
/// until the server answers; its id.
pub async fn create_session(http: &reqwest::Client, base: &str, token: &str, client: usize) -> String {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let response = http
            .post(format!("{base}/v1/sessions"))
            .bearer_auth(token)
            .json(&json!({"model": "Qwen/Qwen2.5-0.5B-Instruct", "metadata": {"client": client.to_string()}}))
            .send()
            .await;
        if let Ok(response) = response
            && response.status() == 201
        {
            let body: Value = response.json().await.expect("a created session as JSON");
            return body["id"].as_str().expect("the session's id").to_owned();
        }
        assert!(Instant::now() < deadline, "the server at {base} never answered");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The first word of every stored message of session `id`, in order, read a page of
/// 1 000 at a time.
pub async fn message_heads(http: &reqwest::Client, base: &str, token: &str, id: &str) -> Vec<String> {
    let mut heads = Vec::new();
    let mut from = 0u64;
    loop {
        let page: Value = http
            .get(format!("{base}/v1/sessions/{id}/messages?from={from}&limit=1000"))
            .bearer_auth(token)
            .send()
            .await
            .expect("the messages page answers")
            .json()
            .await
            .expect("the messages page as JSON");
        for message in page["data"].as_array().expect("a page's data") {
            let text = message["content"].as_str().expect("a message's text");
            heads.push(text.split(' ').next().unwrap_or_default().to_owned());
        }
        match page["next"].as_u64() {
            Some(next) => from = next,
            None => return heads,
        }
    }
}
