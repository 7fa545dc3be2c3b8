//! A test agent at the edge of the orchestrator: it registers a node of simulated GPUs
//! over the real agent protocol, streams telemetry, and answers `StartInstance` by
//! starting an OpenAI-compatible fake engine in-process (it answers `echo: <prompt>`,
//! and can fail or be slow on request; it demands the start's `engine_api_key`, as real
//! engines do; offered tools and not answering a tool result, it calls a tool, whole
//! or streamed as OpenAI streams calls: [`tool_call_answer`]). Dropping it is a machine dying: its node goes
//! silent and its engines stop answering.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::extract::State;
use axum::routing::post;
use serde_json::{Value, json};
use skein_proto::agent::v1::{
    self as pb, agent_message, agent_service_client::AgentServiceClient, orchestrator_message,
};
use tokio::sync::mpsc;

/// The node credential test agents and swarms present for node `name`: made at random
/// on first use and the same for the rest of the process, as a real agent keeps its
/// credential in its state directory across reconnects and restarts.
pub fn node_credential(name: &str) -> String {
    use std::collections::HashMap;
    use std::io::Read;
    static KEPT: std::sync::OnceLock<std::sync::Mutex<HashMap<String, String>>> = std::sync::OnceLock::new();
    let mut kept = KEPT
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    kept.entry(name.to_owned())
        .or_insert_with(|| {
            let mut bytes = [0u8; 32];
            // INVARIANT: test machines have /dev/urandom.
            std::fs::File::open("/dev/urandom")
                .and_then(|mut f| f.read_exact(&mut bytes))
                .expect("random bytes from /dev/urandom");
            bytes.iter().map(|b| format!("{b:02x}")).collect()
        })
        .clone()
}

/// How the fake engines of an agent behave.
#[derive(Clone, Default)]
pub struct EngineBehaviour {
    /// Chat requests answered so far.
    pub requests: Arc<AtomicU64>,
    /// The first this many requests fail with 500.
    pub fail_first: u64,
    /// Each answer takes this long.
    pub delay: Duration,
    /// Every chat request's body, with the engine's base URL, in arrival order.
    pub seen: Arc<std::sync::Mutex<Vec<(String, Value)>>>,
    /// The engine's context, in bytes of message content: a longer request is refused
    /// with 400, as engines refuse a prompt longer than their context.
    pub context_bytes: Option<usize>,
}

#[derive(Clone)]
struct Engine {
    behaviour: EngineBehaviour,
    url: Arc<std::sync::OnceLock<String>>,
    /// The key requests must carry (`Authorization: Bearer KEY`), as real engines are
    /// started with one.
    key: Option<String>,
}

async fn chat(
    State(engine): State<Engine>,
    headers: axum::http::HeaderMap,
    axum::Json(body): axum::Json<Value>,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    if let Some(key) = &engine.key {
        let given = headers
            .get(axum::http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        if given != Some(key.as_str()) {
            return (
                axum::http::StatusCode::UNAUTHORIZED,
                axum::Json(json!({"error": {"message": "invalid or missing API key", "type": "authentication_error"}})),
            )
                .into_response();
        }
    }
    let b = engine.behaviour;
    let url = engine.url.get().cloned().unwrap_or_default();
    b.seen.lock().unwrap().push((url, body.clone()));
    let n = b.requests.fetch_add(1, Ordering::SeqCst);
    tokio::time::sleep(b.delay).await;
    if n < b.fail_first {
        return (
            axum::http::StatusCode::INTERNAL_SERVER_ERROR,
            axum::Json(json!({"error": {"message": "CUDA out of memory", "type": "server_error"}})),
        )
            .into_response();
    }
    if let Some(context) = b.context_bytes {
        let used: usize = body["messages"]
            .as_array()
            .map(|m| m.iter().filter_map(|m| m["content"].as_str()).map(str::len).sum())
            .unwrap_or(0);
        if used > context {
            return (
                axum::http::StatusCode::BAD_REQUEST,
                axum::Json(json!({"error": {
                    "message": format!("the prompt has {used} bytes, but the model's context is {context}"),
                    "type": "invalid_request_error",
                }})),
            )
                .into_response();
        }
    }
    let prompt = body["messages"]
        .as_array()
        .and_then(|m| m.last())
        .and_then(|m| m["content"].as_str())
        .unwrap_or("")
        .to_owned();
    if let Some(answer) = tool_call_answer(&body, &prompt) {
        return answer;
    }
    let reply = format!("echo: {prompt}");
    if body["stream"] == json!(true) {
        // The OpenAI stream: a chunk per word, the finish, the usage, `[DONE]`.
        let mut events: Vec<String> = Vec::new();
        let words: Vec<&str> = reply.split_inclusive(' ').collect();
        for word in words {
            events.push(
                json!({"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": word}}]})
                    .to_string(),
            );
        }
        events.push(
            json!({"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
                .to_string(),
        );
        events.push(json!({"object": "chat.completion.chunk", "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8}}).to_string());
        events.push("[DONE]".to_owned());
        let text: String = events.iter().map(|e| format!("data: {e}\n\n")).collect();
        return ([(axum::http::header::CONTENT_TYPE, "text/event-stream")], text).into_response();
    }
    axum::Json(json!({
        "id": "x", "object": "chat.completion", "model": body["model"],
        "choices": [{"index": 0, "message": {"role": "assistant", "content": reply}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8}
    }))
    .into_response()
}

/// The fake engine's tool call, when the request offers tools (and `tool_choice` is not
/// `none`) and its last message is not a tool result: a call of the chosen function (or
/// the first offered) with `{"text": PROMPT}`, id `call_echo_N` (N the number of
/// messages). Streamed: the call's id and name first, then its arguments in three
/// pieces, the `tool_calls` finish, usage, `[DONE]`.
fn tool_call_answer(body: &Value, prompt: &str) -> Option<axum::response::Response> {
    use axum::response::IntoResponse;
    let tools = body["tools"].as_array().filter(|t| !t.is_empty())?;
    let messages = body["messages"].as_array()?;
    if body["tool_choice"] == "none" || messages.last().is_some_and(|m| m["role"] == "tool") {
        return None;
    }
    let name = body["tool_choice"]["function"]["name"]
        .as_str()
        .or_else(|| tools[0]["function"]["name"].as_str())?
        .to_owned();
    let id = format!("call_echo_{}", messages.len());
    let arguments = json!({ "text": prompt }).to_string();
    let usage = json!({"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8});
    if body["stream"] != json!(true) {
        let call = json!({"id": id, "type": "function", "function": {"name": name, "arguments": arguments}});
        return Some(
            axum::Json(json!({
                "id": "x", "object": "chat.completion", "model": body["model"],
                "choices": [{"index": 0, "message": {"role": "assistant", "content": null, "tool_calls": [call]},
                             "finish_reason": "tool_calls"}],
                "usage": usage,
            }))
            .into_response(),
        );
    }
    let chunk = |delta: Value, finish: Value| {
        json!({"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
            .to_string()
    };
    let mut events = vec![chunk(
        json!({"role": "assistant", "tool_calls": [{"index": 0, "id": id, "type": "function",
                                                     "function": {"name": name, "arguments": ""}}]}),
        Value::Null,
    )];
    let chars: Vec<char> = arguments.chars().collect();
    for piece in chars.chunks(chars.len().div_ceil(3).max(1)) {
        let piece: String = piece.iter().collect();
        events.push(chunk(
            json!({"tool_calls": [{"index": 0, "function": {"arguments": piece}}]}),
            Value::Null,
        ));
    }
    events.push(chunk(json!({}), json!("tool_calls")));
    events.push(json!({"object": "chat.completion.chunk", "choices": [], "usage": usage}).to_string());
    events.push("[DONE]".to_owned());
    let text: String = events.iter().map(|e| format!("data: {e}\n\n")).collect();
    Some(([(axum::http::header::CONTENT_TYPE, "text/event-stream")], text).into_response())
}

/// Serves the OpenAI chat route on loopback; returns its base URL.
pub async fn fake_engine(behaviour: EngineBehaviour, tasks: &Tasks) -> String {
    keyed_fake_engine(behaviour, None, tasks).await
}

/// [`fake_engine`] that answers 401 to a request without `Authorization: Bearer KEY`
/// when given a `key`, as engines started with a key do.
pub async fn keyed_fake_engine(behaviour: EngineBehaviour, key: Option<String>, tasks: &Tasks) -> String {
    let engine = Engine {
        behaviour,
        url: Arc::default(),
        key,
    };
    let app = axum::Router::new()
        .route("/v1/chat/completions", post(chat))
        .with_state(engine.clone());
    let listener = tokio::net::TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0)))
        .await
        .unwrap();
    let url = format!("http://{}/v1", listener.local_addr().unwrap());
    let _ = engine.url.set(url.clone());
    tasks
        .lock()
        .unwrap()
        .push(tokio::spawn(async move { axum::serve(listener, app).await.unwrap() }));
    url
}

/// Everything a test agent runs, aborted when it leaves: its node goes silent and its
/// engines stop answering, as when a machine dies.
pub type Tasks = Arc<std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>>;

/// `request` with the join token `token`.
fn auth<T>(token: &str, mut request: tonic::Request<T>) -> tonic::Request<T> {
    request
        .metadata_mut()
        .insert("authorization", format!("Bearer {token}").parse().unwrap());
    request
}

/// What a simulated GPU of a test agent reports in its next samples.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GpuLoad {
    /// Busy percentage.
    pub utilization_pct: u32,
    /// Degrees Celsius.
    pub temperature_c: i32,
    /// Corrected ECC errors since the driver loaded.
    pub ecc_corrected: u64,
    /// NVML throttle-reason bits.
    pub throttle_reasons: u64,
}

impl Default for GpuLoad {
    fn default() -> Self {
        GpuLoad {
            utilization_pct: 0,
            temperature_c: 40,
            ecc_corrected: 0,
            throttle_reasons: 0,
        }
    }
}

/// The inventory of a test node `name`: `gpus` simulated RTX 4090s (24 GiB) on a host of
/// 16 cores and 128 GiB, with `labels`.
pub fn inventory(name: &str, gpus: u32, labels: BTreeMap<String, String>) -> pb::Inventory {
    pb::Inventory {
        host: Some(pb::Host {
            hostname: name.to_owned(),
            logical_cores: 16,
            physical_cores: 8,
            memory_total: 128 << 30,
            ..pb::Host::default()
        }),
        gpus: (0..gpus)
            .map(|i| pb::Gpu {
                index: i,
                uuid: format!("GPU-{name}-{i}"),
                name: "NVIDIA GeForce RTX 4090".to_owned(),
                memory_total: 24 << 30,
                compute_major: 8,
                compute_minor: 9,
                simulated: true,
                ..pb::Gpu::default()
            })
            .collect(),
        gpu_source: "test".to_owned(),
        labels,
    }
}

/// Telemetry batch `seq` of a test node whose GPUs report `loads` (one per GPU, by
/// index), each with 1 GiB of its 24 GiB in use, taken now.
pub fn telemetry(seq: u64, loads: &[GpuLoad]) -> pb::Telemetry {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64);
    pb::Telemetry {
        seq,
        unix_ms: now,
        gpus: (0u32..)
            .zip(loads)
            .map(|(index, load)| pb::GpuSample {
                index,
                memory_used: 1 << 30,
                memory_free: 23 << 30,
                utilization_pct: Some(load.utilization_pct),
                temperature_c: Some(load.temperature_c),
                ecc_corrected: Some(load.ecc_corrected),
                throttle_reasons: load.throttle_reasons,
                ..pb::GpuSample::default()
            })
            .collect(),
        host: Some(pb::HostSample {
            load1_centi: 10,
            memory_available: 100 << 30,
        }),
    }
}

/// A test agent: one node with `gpus` simulated 24 GB GPUs.
pub struct TestAgent {
    tasks: Tasks,
    started: Arc<std::sync::Mutex<Vec<pb::StartInstance>>>,
    loads: Arc<std::sync::Mutex<Vec<GpuLoad>>>,
    sample_now: Arc<tokio::sync::Notify>,
}

impl TestAgent {
    /// Joins the orchestrator at `grpc` with join token `token` as node `name` with
    /// `gpus` simulated RTX 4090s, its engines behaving as `behaviour`.
    pub async fn join(grpc: SocketAddr, token: &str, name: &str, gpus: u32, behaviour: EngineBehaviour) -> TestAgent {
        Self::join_labelled(grpc, token, name, gpus, behaviour, &[]).await
    }

    /// [`join`](TestAgent::join), the node carrying `labels` (`[("zone", "lab-a")]`),
    /// sent as given: the orchestrator checks them (a refused registration panics the
    /// agent's task, and the node never appears).
    pub async fn join_labelled(
        grpc: SocketAddr,
        token: &str,
        name: &str,
        gpus: u32,
        behaviour: EngineBehaviour,
        labels: &[(&str, &str)],
    ) -> TestAgent {
        let labels: BTreeMap<String, String> = labels
            .iter()
            .map(|(key, value)| ((*key).to_owned(), (*value).to_owned()))
            .collect();
        let token = token.to_owned();
        let started = Arc::new(std::sync::Mutex::new(Vec::new()));
        let record = Arc::clone(&started);
        let loads = Arc::new(std::sync::Mutex::new(vec![GpuLoad::default(); gpus as usize]));
        let reported = Arc::clone(&loads);
        let sample_now = Arc::new(tokio::sync::Notify::new());
        let next_sample = Arc::clone(&sample_now);
        let name = name.to_owned();
        let tasks: Tasks = Arc::default();
        let own = Arc::clone(&tasks);
        let task = tokio::spawn(async move {
            let mut client = AgentServiceClient::connect(format!("http://{grpc}")).await.unwrap();
            let inventory = inventory(&name, gpus, labels);
            let registration = client
                .register(auth(
                    &token,
                    tonic::Request::new(pb::RegisterRequest {
                        node_name: name.clone(),
                        agent_version: "test".to_owned(),
                        inventory: Some(inventory),
                        node_credential: node_credential(&name),
                    }),
                ))
                .await
                .unwrap()
                .into_inner();
            let (tx, rx) = mpsc::channel::<pb::AgentMessage>(64);
            tx.send(pb::AgentMessage {
                kind: Some(agent_message::Kind::Hello(pb::Hello {
                    node_id: registration.node_id,
                    node_credential: node_credential(&name),
                })),
            })
            .await
            .unwrap();
            let stream = futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|m| (m, rx)) });
            let mut inbound = client
                .session(auth(&token, tonic::Request::new(stream)))
                .await
                .unwrap()
                .into_inner();
            let outbound = tx.clone();
            let beat = tokio::spawn(async move {
                for seq in 1.. {
                    let loads = reported.lock().unwrap().clone();
                    let batch = telemetry(seq, &loads);
                    let message = pb::AgentMessage {
                        kind: Some(agent_message::Kind::Telemetry(batch)),
                    };
                    if outbound.send(message).await.is_err() {
                        return;
                    }
                    tokio::select! {
                        _ = tokio::time::sleep(Duration::from_millis(100)) => {}
                        _ = next_sample.notified() => {}
                    }
                }
            });
            own.lock().unwrap().push(beat);
            // Ready engines report 1 MiB of host memory and 2 GiB on each of their GPUs.
            let status = |instance: &str, state: pb::InstanceState, base_url: &str, gpus: &[u32]| pb::AgentMessage {
                kind: Some(agent_message::Kind::InstanceStatus(pb::InstanceStatus {
                    instance: instance.to_owned(),
                    state: state as i32,
                    base_url: base_url.to_owned(),
                    host_rss: Some(1 << 20),
                    gpu_memory: gpus
                        .iter()
                        .map(|&index| pb::GpuMemory { index, bytes: 2 << 30 })
                        .collect(),
                    ..pb::InstanceStatus::default()
                })),
            };
            while let Ok(Some(message)) = inbound.message().await {
                match message.kind {
                    Some(orchestrator_message::Kind::StartInstance(start)) => {
                        record.lock().unwrap().push(start.clone());
                        tx.send(status(&start.instance, pb::InstanceState::Loading, "", &[]))
                            .await
                            .ok();
                        // The engine demands the key the orchestrator made for it.
                        let key = Some(start.engine_api_key.clone()).filter(|k| !k.is_empty());
                        let url = keyed_fake_engine(behaviour.clone(), key, &own).await;
                        tx.send(status(&start.instance, pb::InstanceState::Ready, &url, &start.gpus))
                            .await
                            .ok();
                    }
                    Some(orchestrator_message::Kind::StopInstance(stop)) => {
                        tx.send(status(&stop.instance, pb::InstanceState::Stopped, "", &[]))
                            .await
                            .ok();
                    }
                    Some(orchestrator_message::Kind::LogsRequest(request)) => {
                        let reply = pb::LogsReply {
                            id: request.id,
                            lines: vec![format!("log of {}", request.instance)],
                            error: String::new(),
                        };
                        tx.send(pb::AgentMessage {
                            kind: Some(agent_message::Kind::LogsReply(reply)),
                        })
                        .await
                        .ok();
                    }
                    _ => {}
                }
            }
        });
        tasks.lock().unwrap().push(task);
        TestAgent {
            tasks,
            started,
            loads,
            sample_now,
        }
    }

    /// What GPU `index` reports from its next sample on (samples go every 100 ms).
    pub fn set_gpu(&self, index: u32, load: GpuLoad) {
        self.loads.lock().unwrap()[index as usize] = load;
    }

    /// Sends the next sample now instead of at the end of its 100 ms.
    pub fn sample_now(&self) {
        self.sample_now.notify_one();
    }

    /// Every start command received.
    pub fn starts(&self) -> Vec<pb::StartInstance> {
        self.started.lock().unwrap().clone()
    }
}

impl Drop for TestAgent {
    fn drop(&mut self) {
        for task in self.tasks.lock().unwrap().drain(..) {
            task.abort();
        }
    }
}
