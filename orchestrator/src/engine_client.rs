//! Calling engines: one chat completion over the OpenAI protocol, whole or streamed, or
//! one embedding request, with errors that tell an engine that cannot be reached (its
//! node is going away: try elsewhere) from one that answered badly (the request's
//! failure). The executor's steps, sessions and the OpenAI-compatible routes all call
//! engines through here.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

use crate::base::Secret;
use crate::egress::EgressPolicy;
use crate::secrets::Secrets;

/// Token counts of one answer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Usage {
    /// Prompt tokens.
    pub prompt_tokens: u64,
    /// Generated tokens.
    pub completion_tokens: u64,
}

/// How long a connection to an engine or endpoint may take to open.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// What calls go through: the client of the engines Skein started, and, for remote
/// endpoints, a client under the admin's [`EgressPolicy`] and the users' secrets their
/// keys come from.
#[derive(Clone)]
pub struct Clients {
    engines: reqwest::Client,
    endpoints: reqwest::Client,
    policy: Arc<EgressPolicy>,
    secrets: Secrets,
}

impl std::fmt::Debug for Clients {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Clients")
            .field("policy", &self.policy)
            .finish_non_exhaustive()
    }
}

impl Clients {
    /// Clients under `policy`, keys from `secrets`.
    pub fn new(policy: Arc<EgressPolicy>, secrets: Secrets) -> Clients {
        Clients {
            engines: reqwest::Client::builder()
                .connect_timeout(CONNECT_TIMEOUT)
                .build()
                .unwrap_or_default(),
            endpoints: policy.client(CONNECT_TIMEOUT),
            policy,
            secrets,
        }
    }

    /// The endpoint policy.
    pub fn policy(&self) -> &EgressPolicy {
        &self.policy
    }

    /// The users' secrets.
    pub fn secrets(&self) -> &Secrets {
        &self.secrets
    }

    /// The route to a remote endpoint for a workflow of `owner`: its key is `owner`'s
    /// secret the endpoint names, read now (so a secret set or replaced later is used
    /// from the next call on).
    ///
    /// Errors: the secret is missing or unreadable ([`CallError::Denied`], saying which
    /// and how to set it).
    pub fn endpoint_route(&self, owner: &str, endpoint: &skein_dsl::ir::Endpoint) -> Result<Route, CallError> {
        let api_key = match &endpoint.api_key_secret {
            None => None,
            Some(reference) => Some(
                self.secrets
                    .resolve(owner, reference)
                    .map_err(|e| CallError::Denied(e.to_string()))?,
            ),
        };
        Ok(Route {
            instance: None,
            base_url: endpoint.url.trim_end_matches('/').to_owned(),
            model: endpoint.model.clone(),
            api_key,
            lora: Vec::new(),
        })
    }

    /// The guarded client (the one endpoint agents use), for a connection to `url`
    /// that passes the egress policy: what HTTP tool servers are reached with.
    ///
    /// Errors: the policy refuses `url` ([`CallError::Denied`]).
    pub fn guarded(&self, url: &str) -> Result<reqwest::Client, CallError> {
        self.endpoint_client(url).cloned()
    }

    /// The guarded client once `url` passes the policy (a URL naming an address is
    /// never resolved, so it is checked here; names are checked as they are resolved).
    fn endpoint_client(&self, url: &str) -> Result<&reqwest::Client, CallError> {
        self.policy
            .check_url(url)
            .map_err(|e| CallError::Denied(e.to_string()))?;
        Ok(&self.endpoints)
    }

    /// The client for `route`: an instance's, or for an endpoint, the guarded one once
    /// its URL passes the policy (a URL naming an address is never resolved, so it is
    /// checked here; names are checked as they are resolved).
    fn for_route(&self, route: &Route, url: &str) -> Result<&reqwest::Client, CallError> {
        if route.instance.is_some() {
            return Ok(&self.engines);
        }
        self.endpoint_client(url)
    }
}

/// Where an agent's requests go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    /// The instance (none for a remote endpoint).
    pub instance: Option<String>,
    /// OpenAI base URL (`http://host:port/v1`).
    pub base_url: String,
    /// The `model` of requests.
    pub model: String,
    /// The key requests carry (`Authorization: Bearer KEY`): an instance's engine key,
    /// or a remote endpoint's (its `Debug` shows nothing).
    pub api_key: Option<Secret>,
    /// On llama.cpp with adapters, whether each adapter applies to these requests, by
    /// its place among the engine's `--lora-scaled` files: the agent's (scale 1), not
    /// the others (0), sent as `"lora": [{"id": N, "scale": S}, …]`. llama.cpp keeps a
    /// slot's last scales for a request that sends none, so every request sends all.
    /// Empty: none sent. vLLM selects an adapter by [`Route::model`] instead.
    pub lora: Vec<bool>,
}

impl Route {
    /// The route to a ready instance (`None` until it has an address), with its
    /// engine's key, to its base model.
    pub fn to_instance(view: &crate::instances::InstanceView) -> Option<Route> {
        Some(Route {
            instance: Some(view.name.clone()),
            base_url: view.base_url.clone()?,
            model: view.name.clone(),
            api_key: view.engine_key.clone(),
            lora: Vec::new(),
        })
    }

    /// The route to a ready instance for an agent `definition` (`None`: one the caller
    /// does not know, served the base): the base model, or the agent's LoRA adapter
    /// when it names one (vLLM serves it as a model of its name; llama.cpp applies it
    /// by its place in the plan's list). `Ok(None)` until the instance has an address.
    ///
    /// Errors: the instance does not serve the agent's adapter (it was planned for
    /// other agents); the agent is not answered by the base model instead.
    pub fn for_agent(
        view: &crate::instances::InstanceView,
        definition: Option<&skein_dsl::ir::Agent>,
    ) -> Result<Option<Route>, String> {
        let Some(mut route) = Route::to_instance(view) else {
            return Ok(None);
        };
        let served = view.placement.as_ref().map_or(&[][..], |p| p.adapters.as_slice());
        let place = match definition.and_then(crate::plan::demand::adapter_key) {
            None => None,
            Some(adapter) => Some(served.iter().position(|a| a.name == adapter).ok_or_else(|| {
                format!(
                    "instance {} does not serve the LoRA adapter `{adapter}` (it was planned without it); help: submit the workflow again so that a plan places the adapter",
                    view.name
                )
            })?),
        };
        match (view.engine.as_str(), place) {
            ("llama.cpp", _) if !served.is_empty() => {
                route.lora = (0..served.len()).map(|i| Some(i) == place).collect();
            }
            ("vllm", Some(i)) => route.model = served[i].name.clone(),
            (_, None) => {}
            (other, Some(_)) => {
                return Err(format!(
                    "instance {} runs `{other}`, which serves no LoRA adapters",
                    view.name
                ));
            }
        }
        Ok(Some(route))
    }
}

/// Why a call failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallError {
    /// The engine could not be reached, or the connection dropped before its answer.
    Unreachable(String),
    /// The engine answered with an error, or too late, or nonsense.
    Engine(String),
    /// The engine refused the request as given (a 4xx: too long for its context, a
    /// parameter it does not take).
    Refused(String),
    /// Nothing was sent: the endpoint policy refuses where the call would go, or the
    /// secret that holds its key is not set.
    Denied(String),
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CallError::Unreachable(m) | CallError::Engine(m) | CallError::Refused(m) | CallError::Denied(m) => {
                f.write_str(m)
            }
        }
    }
}

/// An engine's answer.
#[derive(Debug, Clone, PartialEq)]
pub struct Answer {
    /// The generated text.
    pub content: String,
    /// Token counts, when the engine gave them.
    pub usage: Option<Usage>,
    /// Why generation stopped (`stop`, `length`), when given.
    pub finish_reason: Option<String>,
    /// The decode speed of this answer, tokens/s, when it could be measured (see
    /// [`MIN_MEASURED_TOKENS`]): the engine's own timing when it reports one (llama.cpp's
    /// `timings.predicted_per_second`), else for a streamed answer the tokens after the
    /// first over the time after the first piece, else the tokens over the whole call
    /// (prefill included: a little low).
    pub decode_tokens_per_s: Option<f64>,
    /// The tools the model asked to call (a whole answer to a request with `tools`),
    /// in its order.
    pub tool_calls: Vec<RequestedCall>,
}

/// A tool call a model asked for, as OpenAI's `tool_calls` carry it (and as a session
/// stores it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct RequestedCall {
    /// The call's id, which the tool's result message names.
    pub id: String,
    /// The function's name.
    pub name: String,
    /// Its arguments, JSON text as the model wrote it.
    pub arguments: String,
}

/// A piece of a streamed answer: text, or a piece of a tool call as OpenAI streams
/// them (the first piece of call `index` carries its id and name, later ones pieces of
/// its arguments).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Piece {
    /// Text of the answer.
    Text(String),
    /// A piece of a tool call.
    ToolCall(CallPiece),
}

/// A piece of tool call `index` of a streamed answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallPiece {
    /// Which call of the answer, from 0.
    pub index: usize,
    /// Its id (the first piece).
    pub id: Option<String>,
    /// The function's name (the first piece).
    pub name: Option<String>,
    /// A piece of its arguments' JSON text.
    pub arguments: String,
}

/// Where the pieces of a streamed answer go as they arrive. A sender of text gets the
/// text only; a sender of [`Piece`]s gets the tool-call pieces too. A closed receiver
/// stops nothing.
pub trait Pieces: Sync {
    /// A piece of text.
    fn text(&self, text: String) -> impl Future<Output = ()> + Send;
    /// A piece of a tool call (ignored by default).
    fn tool_call(&self, piece: CallPiece) -> impl Future<Output = ()> + Send {
        let _ = piece;
        async {}
    }
}

impl Pieces for mpsc::Sender<String> {
    async fn text(&self, text: String) {
        let _ = self.send(text).await;
    }
}

impl Pieces for mpsc::Sender<Piece> {
    async fn text(&self, text: String) {
        let _ = self.send(Piece::Text(text)).await;
    }

    async fn tool_call(&self, piece: CallPiece) {
        let _ = self.send(Piece::ToolCall(piece)).await;
    }
}

/// Sends a whole answer (`content`, then `calls`) to `tokens` as a stream of it would:
/// its text as one piece, each call as one piece with its id, name and arguments. For
/// an engine that answered a streamed request whole, and for a stored reply streamed
/// again.
pub async fn send_whole<S: Pieces>(tokens: &S, content: &str, calls: &[RequestedCall]) {
    if !content.is_empty() {
        tokens.text(content.to_owned()).await;
    }
    for (index, call) in calls.iter().enumerate() {
        let piece = CallPiece {
            index,
            id: Some(call.id.clone()),
            name: Some(call.name.clone()),
            arguments: call.arguments.clone(),
        };
        tokens.tool_call(piece).await;
    }
}

/// Answers with fewer generated tokens give no decode speed (too noisy).
pub const MIN_MEASURED_TOKENS: u64 = 8;

#[derive(Deserialize)]
struct Completion {
    choices: Vec<Choice>,
    #[serde(default)]
    usage: Option<CompletionUsage>,
    /// llama-server's timings of the request.
    #[serde(default)]
    timings: Option<Timings>,
}

#[derive(Deserialize)]
struct Timings {
    #[serde(default)]
    predicted_per_second: Option<f64>,
}

/// The decode speed of an answer of `tokens` tokens (see [`Answer::decode_tokens_per_s`]):
/// the engine's figure, else `tokens - 1` over the time from the first piece to the end,
/// else `tokens` over the whole time.
fn decode_speed(tokens: Option<u64>, engine: Option<f64>, first: Option<Instant>, start: Instant) -> Option<f64> {
    let tokens = tokens.filter(|&t| t >= MIN_MEASURED_TOKENS)?;
    if let Some(rate) = engine.filter(|r| r.is_finite() && *r > 0.0) {
        return Some(rate);
    }
    let (generated, since) = match first {
        Some(first) => (tokens - 1, first),
        None => (tokens, start),
    };
    let seconds = since.elapsed().as_secs_f64();
    (seconds > 0.0).then(|| generated as f64 / seconds)
}

#[derive(Deserialize)]
struct Choice {
    #[serde(default)]
    message: Option<Message>,
    #[serde(default)]
    delta: Option<Delta>,
    #[serde(default)]
    finish_reason: Option<String>,
}

#[derive(Deserialize)]
struct Message {
    #[serde(default)]
    content: Option<String>,
    #[serde(default)]
    tool_calls: Vec<WireCall>,
}

/// A stream chunk's delta: a piece of text, pieces of tool calls.
#[derive(Deserialize)]
struct Delta {
    #[serde(default)]
    content: Option<String>,
    #[serde(default)]
    tool_calls: Vec<DeltaCall>,
}

#[derive(Deserialize)]
struct DeltaCall {
    #[serde(default)]
    index: usize,
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    function: Option<DeltaFunction>,
}

#[derive(Deserialize)]
struct DeltaFunction {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    arguments: Option<String>,
}

/// The most tool calls one streamed answer may hold (an engine's `index` is not
/// trusted to size anything).
const MAX_STREAMED_CALLS: usize = 128;

/// Adds a streamed piece of a tool call to `calls`: a new index starts a call.
fn add_call_piece(calls: &mut Vec<RequestedCall>, piece: &CallPiece) -> Result<(), CallError> {
    if piece.index >= MAX_STREAMED_CALLS || piece.index > calls.len() {
        return Err(CallError::Engine(format!(
            "the engine streamed a piece of tool call {} after {} calls",
            piece.index,
            calls.len()
        )));
    }
    if piece.index == calls.len() {
        calls.push(RequestedCall {
            id: piece.id.clone().unwrap_or_else(|| format!("call_{}", piece.index)),
            name: String::new(),
            arguments: String::new(),
        });
    }
    if let Some(call) = calls.get_mut(piece.index) {
        if let Some(name) = &piece.name {
            call.name.push_str(name);
        }
        call.arguments.push_str(&piece.arguments);
    }
    Ok(())
}

#[derive(Deserialize)]
struct WireCall {
    #[serde(default)]
    id: String,
    function: WireFunction,
}

#[derive(Deserialize)]
struct WireFunction {
    name: String,
    #[serde(default)]
    arguments: Option<String>,
}

#[derive(Deserialize)]
struct CompletionUsage {
    prompt_tokens: u64,
    completion_tokens: u64,
}

impl From<CompletionUsage> for Usage {
    fn from(u: CompletionUsage) -> Usage {
        Usage {
            prompt_tokens: u.prompt_tokens,
            completion_tokens: u.completion_tokens,
        }
    }
}

/// A chat completion request (`body` without `model`; the route's is set), whole or
/// streamed.
async fn send(
    clients: &Clients,
    route: &Route,
    mut body: serde_json::Value,
    timeout: Duration,
    stream: bool,
) -> Result<reqwest::Response, CallError> {
    body["stream"] = serde_json::json!(stream);
    if stream {
        body["stream_options"] = serde_json::json!({"include_usage": true});
    }
    post(clients, route, "chat/completions", body, timeout).await
}

/// `body` to the route's `path` (under its base URL) with the route's `model`, key and
/// adapter scales; the error says what the engine said.
async fn post(
    clients: &Clients,
    route: &Route,
    path: &str,
    mut body: serde_json::Value,
    timeout: Duration,
) -> Result<reqwest::Response, CallError> {
    body["model"] = serde_json::json!(route.model);
    if !route.lora.is_empty() {
        let scales: Vec<serde_json::Value> = route
            .lora
            .iter()
            .enumerate()
            .map(|(id, &applied)| serde_json::json!({"id": id, "scale": if applied { 1.0 } else { 0.0 }}))
            .collect();
        body["lora"] = serde_json::Value::Array(scales);
    }
    let url = format!("{}/{path}", route.base_url);
    let http = clients.for_route(route, &url)?;
    let mut request = http.post(&url).json(&body).timeout(timeout);
    if let Some(key) = &route.api_key {
        request = request.bearer_auth(key.expose());
    }
    let response = request.send().await.map_err(|e| {
        if let Some(refusal) = crate::egress::refusal_in(&e) {
            CallError::Denied(refusal.to_string())
        } else if e.is_timeout() {
            CallError::Engine(format!("no answer from {url} within {}s", timeout.as_secs()))
        } else if e.is_connect() || e.is_request() {
            // Refused, or the connection dropped before an answer: the engine (or its
            // node) went away, not a failure of the request.
            CallError::Unreachable(format!("cannot reach {url}: {}", skein_model_registry::error_chain(&e)))
        } else {
            CallError::Engine(format!(
                "the request to {url} failed: {}",
                skein_model_registry::error_chain(&e)
            ))
        }
    })?;
    let status = response.status();
    if status.is_success() {
        return Ok(response);
    }
    let text = response.text().await.unwrap_or_default();
    let message = serde_json::from_str::<serde_json::Value>(&text)
        .ok()
        .and_then(|v| {
            v.pointer("/error/message")
                .or_else(|| v.pointer("/error"))
                .and_then(|m| m.as_str().map(str::to_owned))
        })
        .unwrap_or_else(|| text.chars().take(500).collect());
    let message = format!("the engine answered {status}: {message}");
    if status.is_client_error() {
        Err(CallError::Refused(message))
    } else {
        Err(CallError::Engine(message))
    }
}

/// One chat completion (`body` without `model`; the route's is set); the error says what
/// the engine said.
pub async fn call(
    clients: &Clients,
    route: &Route,
    body: serde_json::Value,
    timeout: Duration,
) -> Result<Answer, CallError> {
    let url = format!("{}/chat/completions", route.base_url);
    let start = Instant::now();
    let response = send(clients, route, body, timeout, false).await?;
    let text = response
        .text()
        .await
        .map_err(|e| CallError::Engine(format!("the answer from {url} was cut off: {e}")))?;
    whole_answer(&text, start)
}

/// Embeddings of `body`'s `input` (`body` without `model`; the route's is set): the
/// engine's answer, read as OpenAI's embedding list.
///
/// Errors: as a chat completion's; an answer that is no embedding list.
pub async fn embed(
    clients: &Clients,
    route: &Route,
    body: serde_json::Value,
    timeout: Duration,
) -> Result<skein_proto::openai::EmbeddingList, CallError> {
    let url = format!("{}/embeddings", route.base_url);
    let response = post(clients, route, "embeddings", body, timeout).await?;
    let text = response
        .text()
        .await
        .map_err(|e| CallError::Engine(format!("the answer from {url} was cut off: {e}")))?;
    serde_json::from_str(&text)
        .map_err(|e| CallError::Engine(format!("the engine's answer from {url} is not an embedding list: {e}")))
}

/// A whole chat completion (the JSON body of an answer that did not stream), read.
fn whole_answer(text: &str, start: Instant) -> Result<Answer, CallError> {
    let completion: Completion = serde_json::from_str(text)
        .map_err(|e| CallError::Engine(format!("the engine's answer is not a chat completion: {e}")))?;
    let choice = completion
        .choices
        .into_iter()
        .next()
        .ok_or_else(|| CallError::Engine("the engine's answer has no message".to_owned()))?;
    let message = choice
        .message
        .ok_or_else(|| CallError::Engine("the engine's answer has no message".to_owned()))?;
    let tool_calls: Vec<RequestedCall> = message
        .tool_calls
        .into_iter()
        .enumerate()
        .map(|(i, call)| RequestedCall {
            // An engine that gives no id: one the result can name.
            id: if call.id.is_empty() {
                format!("call_{i}")
            } else {
                call.id
            },
            name: call.function.name,
            arguments: call.function.arguments.unwrap_or_else(|| "{}".to_owned()),
        })
        .collect();
    // A message that only calls tools may have no text.
    let content = match message.content {
        Some(content) => content,
        None if !tool_calls.is_empty() => String::new(),
        None => return Err(CallError::Engine("the engine's answer has no message".to_owned())),
    };
    let usage = completion.usage.map(Usage::from);
    let engine_rate = completion.timings.and_then(|t| t.predicted_per_second);
    Ok(Answer {
        content,
        decode_tokens_per_s: decode_speed(usage.map(|u| u.completion_tokens), engine_rate, None, start),
        usage,
        finish_reason: choice.finish_reason,
        tool_calls,
    })
}

/// One chat completion, streamed: each piece of text (and of a tool call, for a sink
/// of [`Piece`]s) goes to `tokens` as it arrives (a closed receiver stops nothing: the
/// answer is still read whole), and the whole answer is returned at the end.
pub async fn call_streaming<S: Pieces>(
    clients: &Clients,
    route: &Route,
    body: serde_json::Value,
    timeout: Duration,
    tokens: &S,
) -> Result<Answer, CallError> {
    let url = format!("{}/chat/completions", route.base_url);
    let start = Instant::now();
    let mut response = send(clients, route, body, timeout, true).await?;
    // A server that answers a streamed request with one whole completion (some
    // OpenAI-compatible servers ignore `stream`): its text goes out as one piece.
    let event_stream = response
        .headers()
        .get(reqwest::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_none_or(|v| v.trim_start().starts_with("text/event-stream"));
    if !event_stream {
        let text = response
            .text()
            .await
            .map_err(|e| CallError::Engine(format!("the answer from {url} was cut off: {e}")))?;
        let answer = whole_answer(&text, start)?;
        send_whole(tokens, &answer.content, &answer.tool_calls).await;
        return Ok(answer);
    }
    let mut answer = Answer {
        content: String::new(),
        usage: None,
        finish_reason: None,
        decode_tokens_per_s: None,
        tool_calls: Vec::new(),
    };
    let mut first: Option<Instant> = None;
    let mut engine_rate = None;
    let mut pending: Vec<u8> = Vec::new();
    let cut = |e: reqwest::Error| CallError::Unreachable(format!("the stream from {url} broke off: {e}"));
    while let Some(chunk) = response.chunk().await.map_err(cut)? {
        pending.extend_from_slice(&chunk);
        while let Some(end) = pending.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = pending.drain(..=end).collect();
            let line = String::from_utf8_lossy(&line);
            let Some(data) = line.trim().strip_prefix("data:").map(str::trim) else {
                continue;
            };
            if data == "[DONE]" {
                let tokens = answer.usage.map(|u| u.completion_tokens);
                answer.decode_tokens_per_s = decode_speed(tokens, engine_rate, first, start);
                return Ok(answer);
            }
            let chunk: Completion = serde_json::from_str(data)
                .map_err(|e| CallError::Engine(format!("the engine streamed something that is not a chunk: {e}")))?;
            if let Some(usage) = chunk.usage {
                answer.usage = Some(usage.into());
            }
            if let Some(rate) = chunk.timings.and_then(|t| t.predicted_per_second) {
                engine_rate = Some(rate);
            }
            for choice in chunk.choices {
                let Delta { content, tool_calls } = choice.delta.unwrap_or(Delta {
                    content: None,
                    tool_calls: Vec::new(),
                });
                if let Some(text) = content.filter(|t| !t.is_empty()) {
                    first.get_or_insert_with(Instant::now);
                    answer.content.push_str(&text);
                    tokens.text(text).await;
                }
                for call in tool_calls {
                    first.get_or_insert_with(Instant::now);
                    let (name, arguments) = match call.function {
                        Some(f) => (f.name, f.arguments.unwrap_or_default()),
                        None => (None, String::new()),
                    };
                    let piece = CallPiece {
                        index: call.index,
                        id: call.id,
                        name,
                        arguments,
                    };
                    add_call_piece(&mut answer.tool_calls, &piece)?;
                    tokens.tool_call(piece).await;
                }
                if choice.finish_reason.is_some() {
                    answer.finish_reason = choice.finish_reason;
                }
            }
        }
    }
    Err(CallError::Unreachable(format!(
        "the stream from {url} ended without `data: [DONE]`"
    )))
}
