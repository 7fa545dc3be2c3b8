//! The OpenAI-compatible routes, so existing clients work unchanged (base URL
//! `http://SERVER/v1`, the Skein token as the API key):
//!
//! - `POST /v1/chat/completions`: `model` is an agent of the user's newest run that has
//!   it, or a Hugging Face model id (an instance is placed for it when none serves it).
//!   `stream` gives the OpenAI chunks. With `session_id` in the body (or the
//!   `X-Skein-Session` header), the request continues that session: its `messages` are
//!   the new ones, the session holds the history, and the reply is stored
//!   (`Idempotency-Key` makes a retry a no-op that answers, or streams, the stored reply).
//!   Without a session, `tools`, `tool_choice`, `parallel_tool_calls` and
//!   `response_format` reach the engine as given, assistant messages may carry
//!   `tool_calls` and `tool` messages their results; the answer carries the model's
//!   `tool_calls` (streamed as OpenAI streams them, [`stream`]). A session stores text
//!   only: tools on a session request are refused (400).
//! - `GET /v1/models`: the agents of the user's runs and the models they use.
//!
//! A chat completion has the limits of a session turn ([`crate::session::limits`]):
//! its body is measured before it is parsed (413), and it counts against the user's
//! chat requests and streams in flight (429).

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
use crate::engine_client::{Answer, Piece};
use crate::session::{Flight, NewMessage, Prompt, Role, Sampling, SessionError, Turn};

/// Text pieces of a streamed completion that may wait for a slow reader.
const STREAM_BUFFER: usize = 256;

pub(super) fn routes() -> OpenApiRouter<ApiState> {
    OpenApiRouter::new()
        .routes(routes!(completions))
        .routes(routes!(models))
}

/// `POST /v1/chat/completions`: OpenAI's request, and a session to continue.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
struct CompletionRequest {
    #[serde(flatten)]
    request: ChatCompletionRequest,
    /// Continue this session (or send the `X-Skein-Session` header): the messages are
    /// appended to it and the agent sees its whole history.
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

/// The request's messages as a session turn's: text only; tool calls and `tool`
/// messages are refused (a session stores text).
fn messages(request: ChatCompletionRequest) -> Result<Vec<NewMessage>, ApiError> {
    request
        .messages
        .into_iter()
        .enumerate()
        .map(|(index, m)| {
            let role = match m.role.as_str() {
                "system" | "developer" => Role::System,
                "user" => Role::User,
                "assistant" => Role::Assistant,
                other => {
                    return Err(bad(
                        &format!("messages[{index}].role"),
                        &format!("is `{other}`; a session takes system, user and assistant messages (tool results only without a session)"),
                    ));
                }
            };
            Ok(NewMessage::new(role, text_of(index, m.content)?))
        })
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

/// A request without a session as the engine takes it: its messages in OpenAI's form
/// (tool calls and tool results kept), and its tool fields as given.
fn prompt(request: ChatCompletionRequest) -> Result<Prompt, ApiError> {
    let mut fields = serde_json::Map::new();
    if let Some(tools) = request.tools {
        check_tools(&tools)?;
        fields.insert("tools".to_owned(), Value::Array(tools));
    }
    if let Some(choice) = request.tool_choice {
        fields.insert("tool_choice".to_owned(), choice);
    }
    if let Some(parallel) = request.parallel_tool_calls {
        fields.insert("parallel_tool_calls".to_owned(), json!(parallel));
    }
    if let Some(format) = request.response_format {
        if !format.is_object() {
            return Err(bad(
                "response_format",
                "must be an object such as {\"type\": \"json_object\"}",
            ));
        }
        fields.insert("response_format".to_owned(), format);
    }
    let mut sent = Vec::with_capacity(request.messages.len());
    for (index, m) in request.messages.into_iter().enumerate() {
        let content = text_of(index, m.content.clone())?;
        let message = match m.role.as_str() {
            "system" | "developer" => json!({"role": "system", "content": content}),
            "user" => json!({"role": "user", "content": content}),
            "assistant" => {
                let calls = m.tool_calls.unwrap_or_default();
                if calls.is_empty() {
                    json!({"role": "assistant", "content": content})
                } else {
                    for (c, call) in calls.iter().enumerate() {
                        if call.id.is_empty() || call.function.name.is_empty() {
                            return Err(bad(
                                &format!("messages[{index}].tool_calls[{c}]"),
                                "needs an `id` and a `function.name`",
                            ));
                        }
                    }
                    let content = (!content.is_empty()).then_some(content);
                    json!({"role": "assistant", "content": content, "tool_calls": calls})
                }
            }
            "tool" => {
                let id = m.tool_call_id.filter(|id| !id.is_empty()).ok_or_else(|| {
                    bad(
                        &format!("messages[{index}].tool_call_id"),
                        "is missing; a tool message names the call it answers",
                    )
                })?;
                json!({"role": "tool", "tool_call_id": id, "content": content})
            }
            other => {
                return Err(bad(
                    &format!("messages[{index}].role"),
                    &format!("is `{other}`; give system, developer, user, assistant or tool"),
                ));
            }
        };
        sent.push(message);
    }
    Ok(Prompt { messages: sent, fields })
}

/// What a request without a session asks: a prompt with the fields the session layer
/// cannot store, refused (400) when a session was named.
fn refuse_tools_on_session(request: &ChatCompletionRequest) -> Result<(), ApiError> {
    let field = if request.uses_tools() {
        Some("tools")
    } else if request.response_format.is_some() {
        Some("response_format")
    } else {
        request.parallel_tool_calls.map(|_| "parallel_tool_calls")
    };
    match field {
        Some(field) => Err(bad(
            field,
            "(and tool calls or tool results) is taken only without a session: a session stores text messages. \
             help: leave out session_id (and X-Skein-Session) and send the whole conversation",
        )),
        None => Ok(()),
    }
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
        (status = 400, description = "A bad request (a message part that is not text, a bad model name)", body = ErrorBody),
        (status = 404, description = "No such session (or another user's)", body = ErrorBody),
        (status = 413, description = "More messages or text than one request may carry (the message says the limit and the size)", body = ErrorBody),
        (status = 429, description = "The caller has as many chat requests or streams in flight as one user may; see Retry-After", body = ErrorBody,
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
        Some(_) => {
            refuse_tools_on_session(&request)?;
            None
        }
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
            let turn_messages = messages(request)?;
            Box::pin(async move {
                let (text_in, mut text) = mpsc::channel::<String>(STREAM_BUFFER);
                let turn = Turn {
                    messages: turn_messages,
                    idempotency_key: key,
                    tokens: pieces_in.is_some().then_some(text_in),
                    sampling,
                    reply: true,
                };
                // The turn's text goes on as pieces; it ends when the turn drops its
                // sender.
                let forward = async {
                    while let Some(piece) = text.recv().await {
                        if let Some(out) = &pieces_in {
                            let _ = out.send(Piece::Text(piece)).await;
                        }
                    }
                };
                let (reply, ()) = tokio::join!(sessions.send(&principal, &id, turn), forward);
                let reply = reply?;
                // A retry (same Idempotency-Key) generates nothing: the reply stored by
                // the first request is streamed instead, as one piece. The send fails
                // only when the client went away, and the reply is stored anyway.
                if reply.replayed
                    && !reply.message.content.is_empty()
                    && let Some(replay) = &pieces_in
                {
                    let _ = replay.send(Piece::Text(reply.message.content.clone())).await;
                }
                Ok(Answer {
                    content: reply.message.content,
                    usage: reply.message.usage,
                    finish_reason: Some("stop".to_owned()),
                    decode_tokens_per_s: None,
                    tool_calls: Vec::new(),
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
