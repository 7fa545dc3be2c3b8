//! The HTTP face of the engine: routes, request validation, admission, and the
//! generation thread that owns the model.
//!
//! The async runtime never runs the model: [`serve`] starts one thread that loads it
//! and then takes jobs from a bounded queue ([`QUEUE_CAPACITY`]); a request that finds
//! the queue full is answered 503 with `Retry-After` at once.
//!
//! Started with an [`ApiKey`], every `/v1` route answers 401 to a request without
//! `Authorization: Bearer KEY` (compared in constant time); `/health` stays open, for
//! the agent's readiness probe and for monitoring.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, RwLock};
use std::time::{SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use futures::Stream;
use serde_json::{Value, json};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

use crate::Error;
use crate::constrain::ResponseFormat;
use crate::engine::{Completion, Engine, GenerationRequest};
use crate::openai::{self, ChatCompletionRequest, ResponseMeta};
use crate::template::TemplateMessage;
use crate::tools::{self, ToolFormat};

/// Requests admitted but not yet generating; beyond it the server answers 503.
pub const QUEUE_CAPACITY: usize = 8;

/// Text pieces buffered between the generation thread and a streaming response.
pub const STREAM_BUFFER: usize = 64;

/// Seconds a client is told to wait when the queue is full.
pub const RETRY_AFTER_S: u64 = 1;

/// Where the model runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceSpec {
    /// The CPU.
    Cpu,
    /// CUDA device `n` (needs the `cuda` feature).
    Cuda(usize),
}

impl FromStr for DeviceSpec {
    type Err = String;

    /// `cpu`, `cuda` (device 0) or `cuda:N`.
    fn from_str(text: &str) -> Result<DeviceSpec, String> {
        match text {
            "cpu" => Ok(DeviceSpec::Cpu),
            "cuda" => Ok(DeviceSpec::Cuda(0)),
            _ => text
                .strip_prefix("cuda:")
                .and_then(|n| n.parse().ok())
                .map(DeviceSpec::Cuda)
                .ok_or_else(|| format!("unknown device `{text}`; expected `cpu` or `cuda:N`")),
        }
    }
}

impl std::fmt::Display for DeviceSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DeviceSpec::Cpu => f.write_str("cpu"),
            DeviceSpec::Cuda(n) => write!(f, "cuda:{n}"),
        }
    }
}

impl DeviceSpec {
    /// The candle device.
    ///
    /// Errors: [`Error::Device`] for CUDA in a build without the `cuda` feature or on
    /// a machine without that device.
    pub fn open(self) -> Result<candle_core::Device, Error> {
        match self {
            DeviceSpec::Cpu => Ok(candle_core::Device::Cpu),
            DeviceSpec::Cuda(n) if cfg!(feature = "cuda") => {
                candle_core::Device::new_cuda(n).map_err(|source| Error::Device {
                    device: self.to_string(),
                    reason: source.to_string(),
                })
            }
            DeviceSpec::Cuda(_) => Err(Error::Device {
                device: self.to_string(),
                reason: "this build has no CUDA support; help: build with `--features skein-inference/cuda`".to_owned(),
            }),
        }
    }
}

/// What [`serve`] needs.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    /// A model directory (Hugging Face snapshot layout) or a GGUF file with the
    /// tokenizer files beside it.
    pub model: PathBuf,
    /// The name clients put in `model`.
    pub served_name: String,
    /// Where to listen (port 0 picks one).
    pub listen: SocketAddr,
    /// The sampler's seed for requests without one.
    pub seed: u64,
    /// Where the model runs.
    pub device: DeviceSpec,
    /// The key every `/v1` request must carry; `None`: the routes are open.
    pub api_key: Option<ApiKey>,
}

/// The key an engine demands (`Authorization: Bearer KEY`). It never shows: `Debug`
/// prints `<redacted>`.
#[derive(Clone, PartialEq, Eq)]
pub struct ApiKey(String);

impl ApiKey {
    /// A key from its text; `None` when it is empty (after trimming), which would let
    /// anyone in.
    pub fn new(text: &str) -> Option<ApiKey> {
        let text = text.trim();
        (!text.is_empty()).then(|| ApiKey(text.to_owned()))
    }

    /// Whether `presented` is the key, in time that does not depend on where they
    /// differ (only on the length, which is not secret).
    pub fn matches(&self, presented: &str) -> bool {
        let (a, b) = (self.0.as_bytes(), presented.as_bytes());
        a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
    }
}

impl std::fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ApiKey(<redacted>)")
    }
}

/// The engine's state, as `/health` reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Status {
    Loading,
    Ready,
    Failed(String),
}

/// A request for the generation thread.
struct Job {
    request: GenerationRequest,
    reply: Reply,
}

enum Reply {
    Whole(oneshot::Sender<Result<Completion, Error>>),
    Stream(mpsc::Sender<Piece>),
}

/// What a streaming response receives from the generation thread.
enum Piece {
    Text(String),
    Done(Result<Completion, Error>),
}

struct Shared {
    served_name: String,
    api_key: Option<ApiKey>,
    seed: u64,
    status: RwLock<Status>,
    /// Set once the model is loaded: the format it writes tool calls in, if any.
    tool_format: OnceLock<Option<ToolFormat>>,
    jobs: mpsc::Sender<Job>,
    next_id: AtomicU64,
}

impl Shared {
    fn status(&self) -> Status {
        self.status
            .read()
            .map_or_else(|poisoned| poisoned.into_inner().clone(), |s| s.clone())
    }

    fn set_status(&self, status: Status) {
        match self.status.write() {
            Ok(mut guard) => *guard = status,
            Err(poisoned) => *poisoned.into_inner() = status,
        }
    }
}

/// A server started by [`serve`]: listening, loading or ready.
#[derive(Debug)]
pub struct RunningEngine {
    addr: SocketAddr,
    load: Option<oneshot::Receiver<Result<(), Error>>>,
    server: JoinHandle<std::io::Result<()>>,
    shutdown: Option<oneshot::Sender<()>>,
}

impl RunningEngine {
    /// The address the server listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Waits until the model is loaded.
    ///
    /// Errors: the loading error; [`Error::EngineStopped`] if the generation thread
    /// died. After the first call, `Ok` without waiting.
    pub async fn loaded(&mut self) -> Result<(), Error> {
        let Some(load) = self.load.take() else {
            return Ok(());
        };
        load.await.unwrap_or(Err(Error::EngineStopped))
    }

    /// Runs until the server stops: resolves to the loading error if loading fails
    /// (after stopping the server), or to the server's end.
    ///
    /// Errors: a loading [`Error`], [`Error::Serve`].
    pub async fn wait(mut self) -> Result<(), Error> {
        if let Err(error) = self.loaded().await {
            self.stop().await;
            return Err(error);
        }
        match (&mut self.server).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(source)) => Err(Error::Serve { source }),
            Err(_) => Err(Error::EngineStopped),
        }
    }

    /// Stops accepting requests and waits for the server task to end. The generation
    /// thread ends when its queue is dropped, after the job at hand.
    pub async fn stop(mut self) {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
        let _ = (&mut self.server).await;
    }
}

/// Binds `config.listen`, answers `/health` (503 while loading) at once, and loads the
/// model on the generation thread in the background.
///
/// Errors: [`Error::Bind`]. Loading errors come from [`RunningEngine::loaded`] or
/// [`RunningEngine::wait`].
#[tracing::instrument(skip(config), fields(model = %config.model.display(), listen = %config.listen))]
pub async fn serve(config: ServeConfig) -> Result<RunningEngine, Error> {
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .map_err(|source| Error::Bind {
            addr: config.listen,
            source,
        })?;
    let addr = listener.local_addr().map_err(|source| Error::Bind {
        addr: config.listen,
        source,
    })?;
    let (jobs, queue) = mpsc::channel(QUEUE_CAPACITY);
    let shared = Arc::new(Shared {
        served_name: config.served_name.clone(),
        api_key: config.api_key.clone(),
        seed: config.seed,
        status: RwLock::new(Status::Loading),
        tool_format: OnceLock::new(),
        jobs,
        next_id: AtomicU64::new(0),
    });
    let (load_tx, load_rx) = oneshot::channel();
    let thread_shared = Arc::clone(&shared);
    std::thread::Builder::new()
        .name("skein-generate".to_owned())
        .spawn(move || generation_thread(config, thread_shared, queue, load_tx))
        .map_err(|source| Error::Serve { source })?;

    let api = Router::new()
        .route("/v1/models", get(models))
        .route("/v1/chat/completions", post(chat_completions))
        .route_layer(axum::middleware::from_fn_with_state(Arc::clone(&shared), require_key));
    let router = Router::new()
        .route("/health", get(health))
        .merge(api)
        .with_state(shared);
    let (shutdown_tx, shutdown_rx) = oneshot::channel::<()>();
    let server = tokio::spawn(async move {
        axum::serve(listener, router)
            .with_graceful_shutdown(async {
                let _ = shutdown_rx.await;
            })
            .await
    });
    Ok(RunningEngine {
        addr,
        load: Some(load_rx),
        server,
        shutdown: Some(shutdown_tx),
    })
}

/// Loads the model, then generates for each job until the queue closes.
fn generation_thread(
    config: ServeConfig,
    shared: Arc<Shared>,
    mut queue: mpsc::Receiver<Job>,
    loaded: oneshot::Sender<Result<(), Error>>,
) {
    let started = std::time::Instant::now();
    let engine = config
        .device
        .open()
        .and_then(|device| Engine::load(&config.model, &device));
    let mut engine = match engine {
        Ok(engine) => {
            tracing::info!(
                elapsed_ms = started.elapsed().as_millis() as u64,
                tool_format = engine.tool_format().map_or("none", ToolFormat::name),
                "model loaded"
            );
            let _ = shared.tool_format.set(engine.tool_format());
            shared.set_status(Status::Ready);
            let _ = loaded.send(Ok(()));
            engine
        }
        Err(error) => {
            shared.set_status(Status::Failed(skein_model_registry::error_chain(&error)));
            let _ = loaded.send(Err(error));
            return;
        }
    };
    while let Some(job) = queue.blocking_recv() {
        match job.reply {
            Reply::Whole(reply) => {
                let _ = reply.send(engine.generate(&job.request, |_| {}));
            }
            Reply::Stream(pieces) => {
                let result = engine.generate(&job.request, |text| {
                    let _ = pieces.blocking_send(Piece::Text(text.to_owned()));
                });
                let _ = pieces.blocking_send(Piece::Done(result));
            }
        }
    }
}

/// An OpenAI error response.
fn error_response(status: StatusCode, message: &str, kind: &str, code: &str) -> Response {
    (status, axum::Json(openai::error_body(message, kind, code))).into_response()
}

fn bad_request(message: &str) -> Response {
    error_response(
        StatusCode::BAD_REQUEST,
        message,
        "invalid_request_error",
        "invalid_request",
    )
}

/// The response for a generation error: the client's fault (400) or ours (500).
fn generation_error(error: &Error) -> Response {
    let message = skein_model_registry::error_chain(error);
    match error {
        Error::ContextOverflow { .. } => error_response(
            StatusCode::BAD_REQUEST,
            &message,
            "invalid_request_error",
            "context_length_exceeded",
        ),
        Error::ChatTemplate { .. } | Error::Grammar { .. } => bad_request(&message),
        Error::CannotCallTools => error_response(
            StatusCode::BAD_REQUEST,
            &message,
            "invalid_request_error",
            "tools_unsupported",
        ),
        _ => error_response(
            StatusCode::INTERNAL_SERVER_ERROR,
            &message,
            "server_error",
            "internal_error",
        ),
    }
}

/// Lets a request through when the engine has no key or the request carries it
/// (`Authorization: Bearer KEY`, the scheme in any case); else 401.
async fn require_key(
    State(shared): State<Arc<Shared>>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let Some(key) = &shared.api_key else {
        return next.run(request).await;
    };
    let presented = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, token)| token.trim());
    if presented.is_some_and(|token| key.matches(token)) {
        return next.run(request).await;
    }
    let mut response = error_response(
        StatusCode::UNAUTHORIZED,
        "this engine takes requests only with its API key (`Authorization: Bearer KEY`); Skein's orchestrator holds it: send requests through Skein",
        "invalid_request_error",
        "invalid_api_key",
    );
    response
        .headers_mut()
        .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    response
}

async fn health(State(shared): State<Arc<Shared>>) -> Response {
    match shared.status() {
        Status::Ready => (StatusCode::OK, axum::Json(json!({ "status": "ok" }))).into_response(),
        Status::Loading => (
            StatusCode::SERVICE_UNAVAILABLE,
            axum::Json(json!({ "status": "loading" })),
        )
            .into_response(),
        Status::Failed(error) => (
            StatusCode::SERVICE_UNAVAILABLE,
            axum::Json(json!({ "status": "failed", "error": error })),
        )
            .into_response(),
    }
}

async fn models(State(shared): State<Arc<Shared>>) -> Response {
    axum::Json(openai::ModelList::new(vec![openai::ModelCard::new(
        shared.served_name.as_str(),
        0,
        "skein",
    )]))
    .into_response()
}

/// Checks a request and turns it into a generation request.
fn validate(shared: &Shared, request: ChatCompletionRequest) -> Result<GenerationRequest, Box<Response>> {
    if request.model != shared.served_name {
        return Err(Box::new(error_response(
            StatusCode::NOT_FOUND,
            &format!(
                "the model `{}` does not exist; this server serves `{}`",
                request.model, shared.served_name
            ),
            "invalid_request_error",
            "model_not_found",
        )));
    }
    if request.messages.is_empty() {
        return Err(Box::new(bad_request("`messages` is empty")));
    }
    if let Some(t) = request.temperature.filter(|t| !(0.0..=2.0).contains(t)) {
        return Err(Box::new(bad_request(&format!(
            "`temperature` is {t}; it must be between 0 and 2"
        ))));
    }
    if let Some(p) = request.top_p.filter(|p| !(*p > 0.0 && *p <= 1.0)) {
        return Err(Box::new(bad_request(&format!("`top_p` is {p}; it must be in (0, 1]"))));
    }
    let max_tokens = request.max_completion_tokens.or(request.max_tokens);
    if max_tokens == Some(0) {
        return Err(Box::new(bad_request("`max_tokens` must be at least 1")));
    }
    let force_tool_call = match &request.tool_choice {
        Some(Value::String(choice)) => choice == "required",
        Some(Value::Object(_)) => true,
        _ => false,
    };
    let tools = offered_tools(shared, request.tools.unwrap_or_default(), request.tool_choice.as_ref())?;
    let response_format = match &request.response_format {
        None => ResponseFormat::Text,
        Some(format) => ResponseFormat::from_request(format).map_err(|message| Box::new(bad_request(&message)))?,
    };
    let mut messages = Vec::with_capacity(request.messages.len());
    for (index, message) in request.messages.into_iter().enumerate() {
        let content = match message.content {
            None => String::new(),
            Some(content) => content.text().map_err(|kind| {
                Box::new(bad_request(&format!(
                    "messages[{index}] has a `{kind}` content part; this model takes text only"
                )))
            })?,
        };
        let tool_calls = message
            .tool_calls
            .filter(|calls| !calls.is_empty())
            .map(|calls| calls.iter().map(template_call).collect());
        messages.push(TemplateMessage {
            role: message.role,
            content,
            tool_calls,
            tool_call_id: message.tool_call_id,
        });
    }
    Ok(GenerationRequest {
        messages,
        max_tokens,
        temperature: request.temperature,
        top_p: request.top_p,
        seed: request.seed.unwrap_or(shared.seed),
        stop: request.stop.map(openai::Stop::into_vec).unwrap_or_default(),
        force_tool_call: force_tool_call && !tools.is_empty(),
        tools,
        response_format,
    })
}

/// The tools a request offers the model after its `tool_choice`: none for `none`, the
/// one named by `{"type": "function", "function": {"name": …}}`, else all. Refused
/// (400) when the model cannot call tools (known once it is loaded) or the named
/// function is not offered.
fn offered_tools(shared: &Shared, tools: Vec<Value>, choice: Option<&Value>) -> Result<Vec<Value>, Box<Response>> {
    let tools = match choice {
        Some(Value::String(choice)) if choice == "none" => return Ok(Vec::new()),
        Some(Value::Object(choice)) => {
            let name = choice
                .get("function")
                .and_then(|function| function.get("name"))
                .and_then(Value::as_str)
                .ok_or_else(|| Box::new(bad_request("`tool_choice` names no function")))?;
            let named: Vec<Value> = tools
                .into_iter()
                .filter(|tool| tool.pointer("/function/name").and_then(Value::as_str) == Some(name))
                .collect();
            if named.is_empty() {
                return Err(Box::new(bad_request(&format!(
                    "`tool_choice` names `{name}`, which `tools` does not offer"
                ))));
            }
            named
        }
        _ => tools,
    };
    if !tools.is_empty() && shared.tool_format.get().is_some_and(Option::is_none) {
        return Err(Box::new(generation_error(&Error::CannotCallTools)));
    }
    Ok(tools)
}

/// An assistant message's call as the chat template reads it: OpenAI's shape, with
/// the arguments as a JSON object when they parse as one (as `transformers` users
/// pass them), else as the text they are.
fn template_call(call: &openai::ToolCall) -> Value {
    let arguments = serde_json::from_str::<Value>(&call.function.arguments)
        .ok()
        .filter(Value::is_object)
        .unwrap_or_else(|| Value::String(call.function.arguments.clone()));
    json!({
        "id": call.id,
        "type": call.kind,
        "function": { "name": call.function.name, "arguments": arguments },
    })
}

/// The OpenAI calls of a completion, with ids made from the response's.
fn openai_calls(meta: &ResponseMeta, completion: &Completion) -> Vec<openai::ToolCall> {
    completion
        .tool_calls
        .iter()
        .enumerate()
        .map(|(index, call)| openai::ToolCall::new(tools::call_id(&meta.id, index), &call.name, &call.arguments))
        .collect()
}

/// Queues a job, or answers why it cannot be queued.
fn admit(shared: &Shared, job: Job) -> Result<(), Box<Response>> {
    match shared.status() {
        Status::Ready => {}
        Status::Loading => {
            let mut response = error_response(
                StatusCode::SERVICE_UNAVAILABLE,
                "the model is still loading",
                "server_error",
                "model_loading",
            );
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(RETRY_AFTER_S));
            return Err(Box::new(response));
        }
        Status::Failed(error) => {
            return Err(Box::new(error_response(
                StatusCode::SERVICE_UNAVAILABLE,
                &format!("the model failed to load: {error}"),
                "server_error",
                "model_failed",
            )));
        }
    }
    match shared.jobs.try_send(job) {
        Ok(()) => Ok(()),
        Err(mpsc::error::TrySendError::Full(_)) => {
            let mut response = error_response(
                StatusCode::SERVICE_UNAVAILABLE,
                &format!("the engine is busy ({QUEUE_CAPACITY} requests queued); retry later"),
                "server_error",
                "overloaded",
            );
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(RETRY_AFTER_S));
            Err(Box::new(response))
        }
        Err(mpsc::error::TrySendError::Closed(_)) => Err(Box::new(error_response(
            StatusCode::SERVICE_UNAVAILABLE,
            "the engine has stopped",
            "server_error",
            "engine_stopped",
        ))),
    }
}

async fn chat_completions(State(shared): State<Arc<Shared>>, body: Bytes) -> Response {
    let request: ChatCompletionRequest = match serde_json::from_slice(&body) {
        Ok(request) => request,
        Err(error) => {
            return bad_request(&format!(
                "the request body is not a valid chat completion request: {error}"
            ));
        }
    };
    let stream = request.stream;
    let include_usage = request.stream_options.as_ref().is_some_and(|o| o.include_usage);
    let generation = match validate(&shared, request) {
        Ok(generation) => generation,
        Err(response) => return *response,
    };
    let meta = ResponseMeta {
        id: format!("chatcmpl-{}", shared.next_id.fetch_add(1, Ordering::Relaxed)),
        created: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |since| since.as_secs()),
        model: shared.served_name.clone(),
    };
    if stream {
        let (pieces_tx, pieces) = mpsc::channel(STREAM_BUFFER);
        let job = Job {
            request: generation,
            reply: Reply::Stream(pieces_tx),
        };
        if let Err(response) = admit(&shared, job) {
            return *response;
        }
        Sse::new(event_stream(meta, pieces, include_usage)).into_response()
    } else {
        let (reply, completion) = oneshot::channel();
        let job = Job {
            request: generation,
            reply: Reply::Whole(reply),
        };
        if let Err(response) = admit(&shared, job) {
            return *response;
        }
        match completion.await {
            Ok(Ok(completion)) => axum::Json(openai::tool_response_body(
                &meta,
                &completion.text,
                openai_calls(&meta, &completion),
                completion.finish_reason.as_str(),
                Some(openai::usage_of(&completion)),
            ))
            .into_response(),
            Ok(Err(error)) => generation_error(&error),
            Err(_) => generation_error(&Error::EngineStopped),
        }
    }
}

fn data(value: &Value) -> Result<Event, Infallible> {
    Ok(Event::default().data(value.to_string()))
}

/// The SSE events of a streaming completion: a role chunk, a chunk per text piece, a
/// chunk per tool call (whole, at the end), a finish chunk (and a usage chunk when
/// asked), then `[DONE]`; an error mid-way is sent as an error body and ends the stream.
fn event_stream(
    meta: ResponseMeta,
    pieces: mpsc::Receiver<Piece>,
    include_usage: bool,
) -> impl Stream<Item = Result<Event, Infallible>> {
    enum Phase {
        Start,
        Pieces,
        Tail(Vec<Value>),
        End,
    }
    futures::stream::unfold((Phase::Start, pieces), move |(phase, mut pieces)| {
        let meta = meta.clone();
        async move {
            match phase {
                Phase::Start => {
                    let chunk = openai::chunk_body(&meta, json!({ "role": "assistant", "content": "" }), None);
                    Some((data(&chunk), (Phase::Pieces, pieces)))
                }
                Phase::Pieces => match pieces.recv().await {
                    Some(Piece::Text(text)) => {
                        let chunk = openai::chunk_body(&meta, json!({ "content": text }), None);
                        Some((data(&chunk), (Phase::Pieces, pieces)))
                    }
                    Some(Piece::Done(Ok(completion))) => {
                        let mut tail: Vec<Value> = openai_calls(&meta, &completion)
                            .iter()
                            .enumerate()
                            .map(|(index, call)| {
                                let delta = openai::tool_call_delta(
                                    index,
                                    Some(&call.id),
                                    Some(&call.function.name),
                                    &call.function.arguments,
                                );
                                openai::chunk_body(&meta, delta, None)
                            })
                            .collect();
                        tail.push(openai::chunk_body(
                            &meta,
                            json!({}),
                            Some(completion.finish_reason.as_str()),
                        ));
                        if include_usage {
                            tail.push(openai::usage_chunk_body(&meta, openai::usage_of(&completion)));
                        }
                        let first = tail.remove(0);
                        Some((data(&first), (Phase::Tail(tail), pieces)))
                    }
                    Some(Piece::Done(Err(error))) => {
                        let body = openai::error_body(
                            &skein_model_registry::error_chain(&error),
                            "server_error",
                            "generation_failed",
                        );
                        Some((data(&body), (Phase::End, pieces)))
                    }
                    None => {
                        let body = openai::error_body("the engine has stopped", "server_error", "engine_stopped");
                        Some((data(&body), (Phase::End, pieces)))
                    }
                },
                Phase::Tail(mut tail) => {
                    if tail.is_empty() {
                        Some((Ok(Event::default().data("[DONE]")), (Phase::End, pieces)))
                    } else {
                        let chunk = tail.remove(0);
                        Some((data(&chunk), (Phase::Tail(tail), pieces)))
                    }
                }
                Phase::End => None,
            }
        }
    })
}
