//! The OpenAI-compatible routes, so existing clients work unchanged (base URL
//! `http://SERVER/v1`, the Skein token as the API key):
//!
//! - `POST /v1/chat/completions`: `model` is an agent of the user's newest run that has
//!   it, or a Hugging Face model id (an instance is placed for it when none serves it).
//!   `stream` gives the OpenAI chunks. With `session_id` in the body (or the
//!   `X-Skein-Session` header), the request continues that session: its `messages` are
//!   the new ones, the session holds the history, and the reply is stored
//!   (`Idempotency-Key` makes a retry a no-op that answers, or streams, the stored reply).
//! - `GET /v1/models`: the agents of the user's runs and the models they use.
//!
//! A chat completion has the limits of a session turn ([`crate::session::limits`]):
//! its body is measured before it is parsed (413), and it counts against the user's
//! chat requests and streams in flight (429).

use std::collections::BTreeSet;
use std::convert::Infallible;

use axum::Json;
use axum::extract::{Extension, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{Event, Sse};
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
use crate::engine_client::Answer;
use crate::session::{Flight, NewMessage, Role, Sampling, SessionError, Turn};

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

fn meta(model: &str) -> ResponseMeta {
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

fn usage(answer: &Answer) -> Option<openai::Usage> {
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

/// The request's messages as a turn's: text only; `tool` messages are refused.
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
                    return Err(ApiError::new(
                        StatusCode::BAD_REQUEST,
                        format!("messages[{index}] has role `{other}`; Skein agents take system, user and assistant messages"),
                    ));
                }
            };
            let content = match m.content {
                Some(content) => content.text().map_err(|kind| {
                    ApiError::new(
                        StatusCode::BAD_REQUEST,
                        format!("messages[{index}] has a `{kind}` part; only text parts are taken"),
                    )
                })?,
                None => String::new(),
            };
            Ok(NewMessage::new(role, content))
        })
        .collect()
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
        Some(_) => None,
        None => Some(state.sessions.resolve(&principal, &request.model)?),
    };
    let turn_messages = messages(request)?;
    let key = idempotency_key(&headers)?;
    let sessions = state.sessions.clone();
    let (tokens, pieces) = mpsc::channel(STREAM_BUFFER);
    let tokens = stream.then_some(tokens);
    // The completion runs to its end even if a streaming client goes away, so a
    // session's reply is stored.
    let work = async move {
        match (session, target) {
            (Some(id), _) => {
                let replay = tokens.clone();
                let turn = Turn {
                    messages: turn_messages,
                    idempotency_key: key,
                    tokens,
                    sampling,
                    reply: true,
                };
                let reply = sessions.send(&principal, &id, turn).await?;
                // A retry (same Idempotency-Key) generates nothing: the reply stored by
                // the first request is streamed instead, as one piece. The send fails
                // only when the client went away, and the reply is stored anyway.
                if reply.replayed
                    && !reply.message.content.is_empty()
                    && let Some(replay) = &replay
                {
                    let _ = replay.send(reply.message.content.clone()).await;
                }
                Ok(Answer {
                    content: reply.message.content,
                    usage: reply.message.usage,
                    finish_reason: Some("stop".to_owned()),
                    decode_tokens_per_s: None,
                    tool_calls: Vec::new(),
                })
            }
            (None, Some(target)) => {
                sessions
                    .complete(&principal, &target, turn_messages, sampling, tokens.as_ref())
                    .await
            }
            (None, None) => Err(SessionError::Invalid("no model and no session".to_owned())),
        }
    };
    if !stream {
        let answer = work.await?;
        drop(request_permit);
        let finish = answer.finish_reason.clone().unwrap_or_else(|| "stop".to_owned());
        let completion: ChatCompletion = openai::response_body(&meta, &answer.content, &finish, usage(&answer));
        return Ok(Json(completion).into_response());
    }
    let done = state.tasks.spawn(async move {
        let answer = work.await;
        drop(request_permit);
        answer
    });
    // The stream counts as open until it ends or its client goes away (it is dropped).
    let events = completion_events(meta, pieces, done, include_usage).map(move |event| {
        let _open = &stream_permit;
        event
    });
    Ok(Sse::new(events).into_response())
}

type Work = tokio::task::JoinHandle<Result<Answer, SessionError>>;

enum Phase {
    Start,
    Pieces,
    Tail(Vec<String>),
    Done,
}

/// The OpenAI stream: a role chunk, a chunk per piece, the finish chunk (and the usage
/// chunk when asked), `[DONE]`; a failure is an error body before `[DONE]`.
fn completion_events(
    meta: ResponseMeta,
    pieces: mpsc::Receiver<String>,
    done: Work,
    include_usage: bool,
) -> impl futures::Stream<Item = Result<Event, Infallible>> {
    futures::stream::unfold(
        (Phase::Start, pieces, Some(done)),
        move |(phase, mut pieces, mut done)| {
            let meta = meta.clone();
            async move {
                let data = |v: Value| Event::default().data(v.to_string());
                match phase {
                    Phase::Start => {
                        let chunk = openai::chunk_body(&meta, json!({"role": "assistant", "content": ""}), None);
                        Some((Ok(data(chunk)), (Phase::Pieces, pieces, done)))
                    }
                    Phase::Pieces => {
                        if let Some(text) = pieces.recv().await {
                            let chunk = openai::chunk_body(&meta, json!({ "content": text }), None);
                            return Some((Ok(data(chunk)), (Phase::Pieces, pieces, done)));
                        }
                        let outcome = match done.take() {
                            Some(handle) => handle.await,
                            None => return None,
                        };
                        let mut tail = Vec::new();
                        match outcome {
                            Ok(Ok(answer)) => {
                                let finish = answer.finish_reason.clone().unwrap_or_else(|| "stop".to_owned());
                                tail.push(openai::chunk_body(&meta, json!({}), Some(&finish)).to_string());
                                if include_usage && let Some(u) = usage(&answer) {
                                    tail.push(openai::usage_chunk_body(&meta, u).to_string());
                                }
                            }
                            Ok(Err(e)) => {
                                let e = ApiError::from(e);
                                tail.push(openai::error_body(&e.message, e.code, e.code).to_string());
                            }
                            Err(e) => {
                                tail.push(
                                    openai::error_body(&format!("the completion failed: {e}"), "internal", "internal")
                                        .to_string(),
                                );
                            }
                        }
                        tail.push("[DONE]".to_owned());
                        tail.reverse();
                        let first = tail.pop().unwrap_or_default();
                        Some((Ok(Event::default().data(first)), (Phase::Tail(tail), pieces, done)))
                    }
                    Phase::Tail(mut tail) => {
                        let next = tail.pop()?;
                        let phase = if tail.is_empty() {
                            Phase::Done
                        } else {
                            Phase::Tail(tail)
                        };
                        Some((Ok(Event::default().data(next)), (phase, pieces, done)))
                    }
                    Phase::Done => None,
                }
            }
        },
    )
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
