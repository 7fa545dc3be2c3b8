//! A fake inference engine for tests: started with the command line the agent would give
//! `llama-server`, `vllm serve` or `skein engine serve`, it records that command line and
//! its GPU environment, then answers the OpenAI protocol on the port it was given,
//! deterministically.
//!
//! - `SKEIN_FAKE_ENGINE_RECORD=FILE`: writes `{"args": [...], "env": {...}}` (the
//!   arguments after the program, and every `CUDA_*`, `VLLM_*`, `HF_*` and `RAY_*`
//!   variable, `LLAMA_API_KEY`, `SKEIN_ENGINE_API_KEY` and `SKEIN_FAKE_ENGINE_NODE`)
//!   to FILE before listening.
//! - `SKEIN_FAKE_ENGINE_RECORD_DIR=DIR`: the same record, with the program's name (as
//!   started: `vllm`, `ray`, …) and the time it started (`started_ns`, Unix
//!   nanoseconds), written to a file of its own in DIR, so that the starts of many
//!   processes can be put in order.
//! - `SKEIN_FAKE_ENGINE_READY_MS=N`: answers `/health` with 503 for N ms first, as an
//!   engine loading its weights does.
//! - `SKEIN_FAKE_ENGINE_EXIT_MS=N`: exits with status 3 after N ms, as a crashing engine.
//! - `SKEIN_FAKE_ENGINE_EXIT_IF=FILE`: exits with status 3 once FILE exists (looked for
//!   every 100 ms), as an engine that crashes when the test says so.
//! - `SKEIN_FAKE_ENGINE_API_KEY=KEY`, or the variable through which the agent gives
//!   the real engine its key (`VLLM_API_KEY`, `LLAMA_API_KEY`, `SKEIN_ENGINE_API_KEY`):
//!   the `/v1` routes answer 401 without `Authorization: Bearer KEY`, as the engines
//!   and hosted APIs do (`/health` stays open, as theirs does). So every test that
//!   reaches an engine through Skein shows that Skein sends the key.
//!
//! Started without a model name, as a piece of an engine split across machines (`ray
//! start … --node-manager-port P` or `--head --port P`, `rpc-server --host H --port P`),
//! it only listens on its port (`--node-ip-address` or `--host`): readiness is the open
//! port.
//!
//! Routes: `GET /health`, `GET /v1/models`, `POST /v1/chat/completions` (with `stream`,
//! server-sent events as the OpenAI protocol sends them). The reply is `echo: ` and the
//! last message's content.

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::State;
use axum::http::header::AUTHORIZATION;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};

struct Engine {
    model: String,
    api_key: Option<String>,
    started: Instant,
    ready_after: Duration,
}

fn flag(args: &[String], names: &[&str]) -> Option<String> {
    args.iter()
        .position(|a| names.contains(&a.as_str()))
        .and_then(|i| args.get(i + 1).cloned())
}

fn millis(var: &str) -> Result<Option<u64>, String> {
    match std::env::var(var) {
        Ok(v) => v
            .parse()
            .map(Some)
            .map_err(|_| format!("{var}={v} is not a number of milliseconds")),
        Err(_) => Ok(None),
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    match run().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("fake-engine: {message}");
            ExitCode::from(2)
        }
    }
}

async fn run() -> Result<(), String> {
    let started_ns = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let program = std::env::args()
        .next()
        .and_then(|p| std::path::Path::new(&p).file_name()?.to_str().map(str::to_owned))
        .unwrap_or_default();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let host = flag(&args, &["--host", "--node-ip-address"]).unwrap_or_else(|| "127.0.0.1".to_owned());
    let port = flag(&args, &["--port", "--node-manager-port"]).ok_or("no --port or --node-manager-port given")?;
    // vLLM names the model `--served-model-name`, llama-server `--alias`, skein `--name`;
    // a piece of a split engine (a Ray node, an RPC server) names none.
    let model = flag(&args, &["--served-model-name", "--alias", "--name"]);
    let env: BTreeMap<String, String> = std::env::vars()
        .filter(|(k, _)| {
            ["CUDA_", "VLLM_", "HF_", "RAY_"].iter().any(|p| k.starts_with(p))
                || ["SKEIN_FAKE_ENGINE_NODE", "LLAMA_API_KEY", "SKEIN_ENGINE_API_KEY"].contains(&k.as_str())
        })
        .collect();
    if let Ok(path) = std::env::var("SKEIN_FAKE_ENGINE_RECORD") {
        let record = json!({ "args": args, "env": env });
        std::fs::write(&path, record.to_string()).map_err(|e| format!("cannot write {path}: {e}"))?;
    }
    if let Ok(dir) = std::env::var("SKEIN_FAKE_ENGINE_RECORD_DIR") {
        let record = json!({ "program": program, "args": args, "env": env, "started_ns": started_ns.to_string() });
        let path = std::path::Path::new(&dir).join(format!("{started_ns}-{}.json", std::process::id()));
        std::fs::write(&path, record.to_string()).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    }
    let ready_after = Duration::from_millis(millis("SKEIN_FAKE_ENGINE_READY_MS")?.unwrap_or(0));
    if let Some(ms) = millis("SKEIN_FAKE_ENGINE_EXIT_MS")? {
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(ms)).await;
            eprintln!("fake-engine: exiting after {ms} ms, as asked");
            std::process::exit(3);
        });
    }
    if let Ok(file) = std::env::var("SKEIN_FAKE_ENGINE_EXIT_IF") {
        tokio::spawn(async move {
            while !std::path::Path::new(&file).exists() {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            eprintln!("fake-engine: exiting, as {file} asks");
            std::process::exit(3);
        });
    }
    let Some(model) = model else {
        // A piece: the open port is all there is to it.
        let listener = tokio::net::TcpListener::bind(format!("{host}:{port}"))
            .await
            .map_err(|e| format!("cannot listen on {host}:{port}: {e}"))?;
        loop {
            let _ = listener.accept().await;
        }
    };
    let engine = Arc::new(Engine {
        model,
        api_key: [
            "SKEIN_FAKE_ENGINE_API_KEY",
            "VLLM_API_KEY",
            "LLAMA_API_KEY",
            "SKEIN_ENGINE_API_KEY",
        ]
        .iter()
        .find_map(|name| std::env::var(name).ok().filter(|key| !key.is_empty())),
        started: Instant::now(),
        ready_after,
    });
    let app = Router::new()
        .route("/health", get(health))
        .route("/v1/models", get(models))
        .route("/v1/chat/completions", post(chat))
        .with_state(engine);
    let listener = tokio::net::TcpListener::bind(format!("{host}:{port}"))
        .await
        .map_err(|e| format!("cannot listen on {host}:{port}: {e}"))?;
    axum::serve(listener, app).await.map_err(|e| e.to_string())
}

async fn health(State(engine): State<Arc<Engine>>) -> StatusCode {
    if engine.started.elapsed() < engine.ready_after {
        StatusCode::SERVICE_UNAVAILABLE
    } else {
        StatusCode::OK
    }
}

/// The 401 of a request without the key, when the engine was given one.
fn unauthorized(engine: &Engine, headers: &HeaderMap) -> Option<Response> {
    let key = engine.api_key.as_deref()?;
    let given = headers
        .get(AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    (given != Some(key)).then(|| error(StatusCode::UNAUTHORIZED, "invalid or missing API key"))
}

async fn models(State(engine): State<Arc<Engine>>, headers: HeaderMap) -> Response {
    if let Some(refused) = unauthorized(&engine, &headers) {
        return refused;
    }
    axum::Json(json!({
        "object": "list",
        "data": [{ "id": engine.model, "object": "model", "owned_by": "fake-engine" }],
    }))
    .into_response()
}

fn error(status: StatusCode, message: &str) -> Response {
    (
        status,
        axum::Json(json!({ "error": { "message": message, "type": "invalid_request_error" } })),
    )
        .into_response()
}

async fn chat(State(engine): State<Arc<Engine>>, headers: HeaderMap, body: String) -> Response {
    if let Some(refused) = unauthorized(&engine, &headers) {
        return refused;
    }
    if engine.started.elapsed() < engine.ready_after {
        return error(StatusCode::SERVICE_UNAVAILABLE, "the model is loading");
    }
    let Ok(request) = serde_json::from_str::<Value>(&body) else {
        return error(StatusCode::BAD_REQUEST, "the body is not JSON");
    };
    if request["model"].as_str() != Some(engine.model.as_str()) {
        return error(
            StatusCode::NOT_FOUND,
            &format!(
                "the model `{}` does not exist; this engine serves `{}`",
                request["model"], engine.model
            ),
        );
    }
    let Some(last) = request["messages"].as_array().and_then(|m| m.last()) else {
        return error(StatusCode::BAD_REQUEST, "`messages` must be a non-empty list");
    };
    let reply = format!("echo: {}", last["content"].as_str().unwrap_or_default());
    let prompt_tokens = request["messages"].as_array().map_or(0, |m| {
        m.iter()
            .map(|m| m["content"].as_str().map_or(0, |c| c.split_whitespace().count()))
            .sum::<usize>()
    });
    let completion_tokens = reply.split_whitespace().count();
    if request["stream"].as_bool() == Some(true) {
        let mut body = String::new();
        let words: Vec<&str> = reply.split_inclusive(' ').collect();
        for (i, word) in words.iter().enumerate() {
            let delta = if i == 0 {
                json!({ "role": "assistant", "content": word })
            } else {
                json!({ "content": word })
            };
            let chunk = json!({
                "id": "chatcmpl-fake",
                "object": "chat.completion.chunk",
                "model": engine.model,
                "choices": [{ "index": 0, "delta": delta, "finish_reason": null }],
            });
            body.push_str(&format!("data: {chunk}\n\n"));
        }
        let last = json!({
            "id": "chatcmpl-fake",
            "object": "chat.completion.chunk",
            "model": engine.model,
            "choices": [{ "index": 0, "delta": {}, "finish_reason": "stop" }],
        });
        body.push_str(&format!("data: {last}\n\ndata: [DONE]\n\n"));
        return ([("content-type", "text/event-stream")], body).into_response();
    }
    axum::Json(json!({
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "model": engine.model,
        "choices": [{
            "index": 0,
            "message": { "role": "assistant", "content": reply },
            "finish_reason": "stop",
        }],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }))
    .into_response()
}
