//! The OpenAI-compatible routes, so existing clients work unchanged (base URL
//! `http://SERVER/v1`, the Skein token as the API key):
//!
//! - `POST /v1/chat/completions`: `model` is an agent of the user's newest run that has
//!   it, or a Hugging Face model id (an instance is placed for it when none serves it).
//!   `stream` gives the OpenAI chunks. With `session_id` in the body (or the
//!   `X-Skein-Session` header), the request continues that session: its `messages` are
//!   the new ones, the session holds the history, and the reply is stored
//!   (`Idempotency-Key` makes a retry a no-op that answers, or streams, the stored reply).
//!   With or without a session, `tools`, `tool_choice`, `parallel_tool_calls` and
//!   `response_format` reach the engine as given, assistant messages may carry
//!   `tool_calls` and `tool` messages their results; the answer carries the model's
//!   `tool_calls` (streamed as OpenAI streams them, [`stream`]). A session stores the
//!   calls with its reply and the results the client sends; a result must answer a call
//!   of the session or of the request before it, and the session's last reply sent
//!   back is not stored twice ([`crate::session::record::check_turn`]).
//! - `POST /v1/embeddings` ([`embeddings`]): one vector per input, from an agent or a
//!   model named as for a chat completion; an embedding model's engine runs in pooling
//!   mode.
//! - `GET /v1/models`: the agents of the user's runs and the models they use.
//!
//! A chat completion has the limits of a session turn ([`crate::session::limits`]):
//! its body is measured before it is parsed (413), and it counts against the user's
//! chat requests and streams in flight (429).

mod embeddings;
mod stream;

use std::collections::BTreeSet;
use std::pin::Pin;

use axum::Json;
use axum::extract::{Extension, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::Sse;
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use serde::Deserialize;
use serde_json::{Value, json};
use skein_dsl::ir::Backend;
use skein_proto::openai::{self, ChatCompletion, ChatCompletionRequest, ModelCard, ModelList, ResponseMeta};
use tokio::sync::mpsc;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::error::{ApiError, ErrorBody};
use super::extract::{body, idempotency_key};
use super::openapi::ServerSentEvent;
use super::sessions::chat_body;
use super::{ApiState, Principal};
use crate::engine_client::{Answer, RequestedCall, send_whole};
use crate::session::{Flight, NewMessage, Prompt, Role, Sampling, SessionError, Turn};

/// Text pieces of a streamed completion that may wait for a slow reader.
const STREAM_BUFFER: usize = 256;

pub(super) fn routes() -> OpenApiRouter<ApiState> {
    OpenApiRouter::new()
        .routes(routes!(completions))
        .routes(routes!(embeddings::embeddings))
        .routes(routes!(models))
}

/// `POST /v1/chat/completions`: OpenAI's request, and a session to continue.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
struct CompletionRequest {
    #[serde(flatten)]
    request: ChatCompletionRequest,
    /// Continue this session (or send the `X-Skein-Session` header): the messages are
    /// appended to it (tool calls and results among them) and the agent sees its whole
    /// history.
    #[serde(default)]
    session_id: Option<String>,
}

pub(super) fn meta(model: &str) -> ResponseMeta {
    let now = crate::base::unix_ms().0;
    ResponseMeta {
        id: format!("chatcmpl-{now:x}{:04x}", rand_suffix()),
        created: u64::try_from(now / 1000).unwrap_or(0),
        model: model.to_owned(),
    }
}

/// A few bits that differ between completions of the same millisecond.
fn rand_suffix() -> u16 {
    static NEXT: std::sync::atomic::AtomicU16 = std::sync::atomic::AtomicU16::new(0);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

pub(super) fn usage(answer: &Answer) -> Option<openai::Usage> {
    answer.usage.map(|u| {
        let prompt = usize::try_from(u.prompt_tokens).unwrap_or(usize::MAX);
        let completion = usize::try_from(u.completion_tokens).unwrap_or(usize::MAX);
        openai::Usage {
            prompt_tokens: prompt,
            completion_tokens: completion,
            total_tokens: prompt.saturating_add(completion),
        }
    })
}

/// 400 naming what is wrong with `field`.
fn bad(field: &str, what: &str) -> ApiError {
    ApiError::new(StatusCode::BAD_REQUEST, format!("`{field}` {what}"))
}

/// The text of message `index`'s content (none: empty).
fn text_of(index: usize, content: Option<openai::Content>) -> Result<String, ApiError> {
    match content {
        Some(content) => content.text().map_err(|kind| {
            bad(
                &format!("messages[{index}].content"),
                &format!("has a `{kind}` part; only text parts are taken"),
            )
        }),
        None => Ok(String::new()),
    }
}

/// Message `index` of a request as Skein takes it: `developer` is `system`; an
/// assistant message keeps its `tool_calls` (each with an id and a function name), a
/// `tool` message the `tool_call_id` it answers. Requests with and without a session
/// read their messages here alike.
fn new_message(index: usize, m: openai::ChatMessage) -> Result<NewMessage, ApiError> {
    let content = text_of(index, m.content)?;
    match m.role.as_str() {
        "system" | "developer" => Ok(NewMessage::new(Role::System, content)),
        "user" => Ok(NewMessage::new(Role::User, content)),
        "assistant" => {
            let calls = m.tool_calls.unwrap_or_default();
            if let Some(c) = calls
                .iter()
                .position(|call| call.id.is_empty() || call.function.name.is_empty())
            {
                return Err(bad(
                    &format!("messages[{index}].tool_calls[{c}]"),
                    "needs an `id` and a `function.name`",
                ));
            }
            let calls = calls
                .into_iter()
                .map(|call| RequestedCall {
                    id: call.id,
                    name: call.function.name,
                    arguments: call.function.arguments,
                })
                .collect();
            Ok(NewMessage::calling(content, calls))
        }
        "tool" => {
            let id = m.tool_call_id.filter(|id| !id.is_empty()).ok_or_else(|| {
                bad(
                    &format!("messages[{index}].tool_call_id"),
                    "is missing; a tool message names the call it answers",
                )
            })?;
            Ok(NewMessage::tool_result(id, content))
        }
        other => Err(bad(
            &format!("messages[{index}].role"),
            &format!("is `{other}`; give system, developer, user, assistant or tool"),
        )),
    }
}

/// The request's messages ([`new_message`]).
fn new_messages(messages: Vec<openai::ChatMessage>) -> Result<Vec<NewMessage>, ApiError> {
    messages
        .into_iter()
        .enumerate()
        .map(|(index, m)| new_message(index, m))
        .collect()
}

/// The most tools one request may offer.
pub(super) const MAX_TOOLS: usize = 128;

/// Checks `tools`: each a function with a name.
fn check_tools(tools: &[Value]) -> Result<(), ApiError> {
    if tools.len() > MAX_TOOLS {
        return Err(bad(
            "tools",
            &format!("has {} tools; at most {MAX_TOOLS} are taken", tools.len()),
        ));
    }
    for (index, tool) in tools.iter().enumerate() {
        if tool.get("type").is_some_and(|t| t != "function") {
            return Err(bad(&format!("tools[{index}].type"), "must be `function`"));
        }
        if !tool.pointer("/function/name").is_some_and(Value::is_string) {
            return Err(bad(
                &format!("tools[{index}].function.name"),
                "is missing; each tool is {\"type\": \"function\", \"function\": {\"name\": …, \"parameters\": {…}}}",
            ));
        }
    }
    Ok(())
}

/// The request's fields that reach the engine as given, with or without a session:
/// `tools` (checked: each a function with a name), `tool_choice`,
/// `parallel_tool_calls`, `response_format` (an object). Takes them from `request`.
fn engine_fields(request: &mut ChatCompletionRequest) -> Result<serde_json::Map<String, Value>, ApiError> {
    let mut fields = serde_json::Map::new();
    if let Some(tools) = request.tools.take() {
        check_tools(&tools)?;
        fields.insert("tools".to_owned(), Value::Array(tools));
    }
    if let Some(choice) = request.tool_choice.take() {
        fields.insert("tool_choice".to_owned(), choice);
    }
    if let Some(parallel) = request.parallel_tool_calls.take() {
        fields.insert("parallel_tool_calls".to_owned(), json!(parallel));
    }
    if let Some(format) = request.response_format.take() {
        if !format.is_object() {
            return Err(bad(
                "response_format",
                "must be an object such as {\"type\": \"json_object\"}",
            ));
        }
        fields.insert("response_format".to_owned(), format);
    }
    Ok(fields)
}

/// A request without a session as the engine takes it: its messages in OpenAI's form
/// (tool calls and tool results kept), and its tool fields as given.
fn prompt(mut request: ChatCompletionRequest) -> Result<Prompt, ApiError> {
    let fields = engine_fields(&mut request)?;
    let messages = new_messages(request.messages)?.iter().map(NewMessage::openai).collect();
    Ok(Prompt { messages, fields })
}

/// The answer's tool calls in OpenAI's form.
pub(super) fn tool_calls(answer: &Answer) -> Vec<openai::ToolCall> {
    answer
        .tool_calls
        .iter()
        .map(|c| openai::ToolCall::new(c.id.clone(), c.name.clone(), c.arguments.clone()))
        .collect()
}

/// Why the answer ended: the engine's reason, else `tool_calls` when it called tools,
/// else `stop`.
pub(super) fn finish_reason(answer: &Answer) -> String {
    match &answer.finish_reason {
        Some(reason) => reason.clone(),
        None if !answer.tool_calls.is_empty() => "tool_calls".to_owned(),
        None => "stop".to_owned(),
    }
}

/// OpenAI's chat completion: `model` is an agent of the caller's newest run that has
/// it, or a hub model placed on demand; with a session, the turn is stored in it.
#[utoipa::path(post, operation_id = "create_chat_completion", path = "/v1/chat/completions", tag = "openai", request_body = CompletionRequest,
    params(
        ("X-Skein-Session" = Option<String>, Header, description = "A session to continue"),
        ("Idempotency-Key" = Option<String>, Header, description = "With a session: makes a retried request a no-op"),
    ),
    responses(
        (status = 200, description = "The completion, or with `stream: true` chunks as server-sent events ending in `[DONE]`", content(
            (ChatCompletion = "application/json"),
            (ServerSentEvent = "text/event-stream"),
        )),
        (status = 400, description = "A bad request (a message part that is not text, a bad model name; in a session, a tool result that answers no call of the session or of the request)", body = ErrorBody),
        (status = 404, description = "No such session (or another user's)", body = ErrorBody),
        (status = 413, description = "More messages or text than one request may carry (the message says the limit and the size)", body = ErrorBody),
        (status = 429, description = "The caller has as many chat requests or streams in flight as one user may, or they or their group used their tokens of the minute (`quota_exceeded`); see Retry-After", body = ErrorBody,
            headers(("Retry-After" = u64, description = "Seconds to wait"))),
        (status = 502, description = "The engine failed", body = ErrorBody),
        (status = 503, description = "No instance can serve the model now; see Retry-After", body = ErrorBody,
            headers(("Retry-After" = u64, description = "Seconds to wait"))),
    ))]
async fn completions(
    State(state): State<ApiState>,
    Extension(principal): Extension<Principal>,
    headers: HeaderMap,
    raw: axum::body::Body,
) -> Result<Response, ApiError> {
    // Counted before the body is read, so a user's requests in flight hold at most
    // their number of bodies; measured before it is parsed.
    let request_permit = state.sessions.admit(&principal, Flight::Request)?;
    let bytes = chat_body(&state.sessions, &headers, raw).await?;
    let CompletionRequest { request, session_id } = body(&bytes, "an OpenAI chat completion request")?;
    let session = session_id.or_else(|| {
        headers
            .get("x-skein-session")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    });
    let meta = meta(&request.model);
    let stream = request.stream;
    let stream_permit = stream
        .then(|| state.sessions.admit(&principal, Flight::Stream))
        .transpose()?;
    let include_usage = request.stream_options.as_ref().is_some_and(|o| o.include_usage);
    let sampling = Sampling {
        temperature: request.temperature,
        max_tokens: request
            .max_completion_tokens
            .or(request.max_tokens)
            .map(|n| u32::try_from(n).unwrap_or(u32::MAX)),
        top_p: request.top_p,
        seed: request.seed,
        stop: request.stop.clone().map(openai::Stop::into_vec).unwrap_or_default(),
    };
    let target = match &session {
        Some(_) => None,
        None => Some(state.sessions.resolve(&principal, &request.model)?),
    };
    let key = idempotency_key(&headers)?;
    let sessions = state.sessions.clone();
    let (pieces_in, pieces) = mpsc::channel(STREAM_BUFFER);
    let pieces_in = stream.then_some(pieces_in);
    // The completion runs to its end even if a streaming client goes away, so a
    // session's reply is stored.
    let work: Pin<Box<dyn Future<Output = Result<Answer, SessionError>> + Send>> = match (session, target) {
        (Some(id), _) => {
            let mut request = request;
            let fields = engine_fields(&mut request)?;
            let turn_messages = new_messages(request.messages)?;
            Box::pin(async move {
                let turn = Turn {
                    messages: turn_messages,
                    fields,
                    idempotency_key: key,
                    tokens: pieces_in.clone(),
                    sampling,
                    reply: true,
                };
                let reply = sessions.send(&principal, &id, turn).await?;
                // A retry (same Idempotency-Key) generates nothing: the reply stored by
                // the first request is streamed instead, its text as one piece and each
                // tool call as one. The send fails only when the client went away, and
                // the reply is stored anyway.
                if reply.replayed
                    && let Some(replay) = &pieces_in
                {
                    send_whole(replay, &reply.message.content, &reply.message.tool_calls).await;
                }
                Ok(Answer {
                    content: reply.message.content,
                    usage: reply.message.usage,
                    finish_reason: None,
                    decode_tokens_per_s: None,
                    tool_calls: reply.message.tool_calls,
                })
            })
        }
        (None, Some(target)) => {
            let prompt = prompt(request)?;
            Box::pin(async move {
                sessions
                    .complete_prompt(&principal, &target, prompt, sampling, pieces_in.as_ref())
                    .await
            })
        }
        (None, None) => Box::pin(async { Err(SessionError::Invalid("no model and no session".to_owned())) }),
    };
    if !stream {
        let answer = work.await?;
        drop(request_permit);
        let completion: ChatCompletion = openai::tool_response_body(
            &meta,
            &answer.content,
            tool_calls(&answer),
            &finish_reason(&answer),
            usage(&answer),
        );
        return Ok(Json(completion).into_response());
    }
    let done = state.tasks.spawn(async move {
        let answer = work.await;
        drop(request_permit);
        answer
    });
    // The stream counts as open until it ends or its client goes away (it is dropped).
    let events = stream::completion_events(meta, pieces, done, include_usage).map(move |event| {
        let _open = &stream_permit;
        event
    });
    Ok(Sse::new(events).into_response())
}

/// The names `model` takes: the agents of the caller's runs and their hub models.
#[utoipa::path(get, operation_id = "list_models", path = "/v1/models", tag = "openai",
    responses((status = 200, description = "The models", body = ModelList)))]
async fn models(
    State(state): State<ApiState>,
    Extension(principal): Extension<Principal>,
) -> Result<Json<ModelList>, ApiError> {
    let runs = state.executor.list().map_err(ApiError::internal)?;
    let mut seen = BTreeSet::new();
    let mut data = Vec::new();
    let mut push = |id: &str, owner: &str, created: i64| {
        if seen.insert(id.to_owned()) {
            data.push(ModelCard::new(id, created / 1000, owner));
        }
    };
    // Newest runs first: an agent name means the newest run's agent.
    for run in runs.iter().filter(|r| principal.may_see(&r.owner)) {
        for (name, agent) in &run.workflow.agents {
            push(name, &run.owner, run.submitted_at.0);
            if let Backend::Model(requirement) = &agent.backend {
                push(&requirement.repo, "huggingface", run.submitted_at.0);
            }
        }
    }
    Ok(Json(ModelList::new(data)))
}
