//! Sessions over REST (docs/sessions.md):
//!
//! - `POST /v1/sessions` `{"model": "owner/name"}` or `{"agent": "coder", "run": "r…"}`
//!   (`run` optional: the user's newest run with that agent), with optional `system`
//!   and `metadata` → `201` with the session.
//! - `GET /v1/sessions?limit=&after=` → `{"data": [...], "next": id | null}`.
//! - `GET /v1/sessions/{id}`; `DELETE /v1/sessions/{id}` → `204`.
//! - `GET /v1/sessions/{id}/messages?from=&limit=` → `{"data": [...], "next": seq | null}`.
//! - `POST /v1/sessions/{id}/messages` `{"content": "…"}` or `{"messages": [...]}`
//!   (tool results as `{"role": "tool", "tool_call_id", "content"}`),
//!   optional `stream`, `temperature`, `max_tokens`, `reply` (false: only store the
//!   messages), header `Idempotency-Key` → the
//!   reply (`{"message", "replayed", "session"}`), or with `stream: true` server-sent
//!   events: `token` (`{"delta": "…"}`) as text is generated, then `message` (the same
//!   body as without streaming, with the reply's `tool_calls`) or `error`. Messages
//!   list with their `tool_calls` (`id`, `name`, `arguments`) and `tool_call_id`. A
//!   turn over the size limits is 413, a user past their requests or streams in flight
//!   429 ([`crate::session::limits`], [`chat_body`]).
//! - `POST /v1/sessions/{id}/migrate` `{"to": "auto" | {"node": "rtx-1", "gpu": 2} |
//!   {"node": "rtx-1"}}` →
//!   `{"session", "from", "to", "downtime_ms", "waited_ms"}`.

use std::collections::BTreeMap;
use std::convert::Infallible;

use axum::Json;
use axum::extract::{Extension, Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::error::{ApiError, ErrorBody};
use super::extract::{IDEMPOTENT_REPLAYED, Params, body, idempotency_key};
use super::openapi::ServerSentEvent;
use super::paging::{Listed, PageQuery, page_size};
use super::{ApiState, Principal};
use crate::engine_client::{Piece, RequestedCall};
use crate::session::limits::BUSY_RETRY_AFTER_S;
use crate::session::{
    Binding, CreateKey, Flight, MessageRecord, MoveTo, NewMessage, NewSession, Reply, Role, Sampling, SessionError,
    SessionRecord, Sessions, Target, Turn,
};

/// Text pieces of a streamed reply that may wait for a slow reader.
const STREAM_BUFFER: usize = 256;

pub(super) fn routes() -> OpenApiRouter<ApiState> {
    OpenApiRouter::new()
        .routes(routes!(create, list))
        .routes(routes!(show, remove))
        .routes(routes!(send, messages))
        .routes(routes!(migrate))
}

impl From<SessionError> for ApiError {
    fn from(e: SessionError) -> ApiError {
        let status = match &e {
            SessionError::NotFound(_) => StatusCode::NOT_FOUND,
            SessionError::Invalid(_) => StatusCode::BAD_REQUEST,
            SessionError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            SessionError::Engine(_) => StatusCode::BAD_GATEWAY,
            SessionError::Store(_) => StatusCode::INTERNAL_SERVER_ERROR,
            SessionError::StoreBusy(_) => return ApiError::store_busy(e.to_string()),
            SessionError::KeyReused(_) => StatusCode::CONFLICT,
            SessionError::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            SessionError::Busy(_) => {
                return ApiError::new(StatusCode::TOO_MANY_REQUESTS, e.to_string()).retry_after(BUSY_RETRY_AFTER_S);
            }
            SessionError::Quota(refusal) => return ApiError::from(refusal.clone()),
        };
        let error = ApiError::new(status, e.to_string());
        if status == StatusCode::SERVICE_UNAVAILABLE {
            // Room may free up as instances go idle or runs end.
            error.retry_after(5)
        } else {
            error
        }
    }
}

/// The body of `POST /v1/sessions`: `model`, or `agent` (and optionally `run`).
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct CreateSession {
    /// A hub model (`owner/name`) served on its own.
    #[serde(default)]
    model: Option<String>,
    /// An agent of one of the caller's runs.
    #[serde(default)]
    agent: Option<String>,
    /// The run of `agent` (default: the caller's newest run that has it).
    #[serde(default)]
    run: Option<String>,
    /// A system prompt (default: the agent's).
    #[serde(default)]
    system: Option<String>,
    /// Free-form labels.
    #[serde(default)]
    metadata: BTreeMap<String, String>,
}

/// Starts a session with an agent of a run or a model on its own. Its instance is
/// placed at the first message.
#[utoipa::path(post, operation_id = "create_session", path = "/v1/sessions", tag = "sessions", request_body = CreateSession,
    responses(
        (status = 201, description = "The session", body = SessionRecord),
        (status = 400, description = "A bad request (both model and agent, a bad model name, too much metadata)", body = ErrorBody),
        (status = 200, description = "A retry with an Idempotency-Key seen before: the session made then", body = SessionRecord),
        (status = 404, description = "No run of the caller has that agent", body = ErrorBody),
        (status = 409, description = "The Idempotency-Key was used with another request", body = ErrorBody),
        (status = 429, description = "The caller or their group has as many sessions as their `sessions` limit allows (`quota_exceeded`); deleting one frees a place", body = ErrorBody),
        (status = 503, description = "The store did not acknowledge in time; see Retry-After", body = ErrorBody),
    ),
    params(("Idempotency-Key" = Option<String>, Header, description = "Makes a retried create answer the first session (at most 256 bytes)")))]
async fn create(
    State(state): State<ApiState>,
    Extension(principal): Extension<Principal>,
    headers: HeaderMap,
    bytes: axum::body::Bytes,
) -> Result<Response, ApiError> {
    let key = idempotency_key(&headers)?.map(|key| CreateKey {
        key,
        request_sha256: crate::base::sha256_hex_bytes(&bytes),
    });
    let request: CreateSession = body(
        &bytes,
        r#"a session request: {"model": "owner/name"} or {"agent": "NAME", "run": "RUN"}"#,
    )?;
    let target = match (request.model, request.agent, request.run) {
        (Some(model), None, None) => Target::Model(model),
        (None, Some(agent), Some(run)) => Target::RunAgent { run, agent },
        (None, Some(agent), None) => match state.sessions.resolve(&principal, &agent) {
            Ok(target @ Target::RunAgent { .. }) => target,
            _ => {
                return Err(ApiError::new(
                    StatusCode::NOT_FOUND,
                    format!("none of your runs has an agent `{agent}`; give `run`, or `model` for a model of its own"),
                ));
            }
        },
        _ => {
            return Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                "give either `model`, or `agent` (and optionally `run`), not both",
            ));
        }
    };
    let created = state
        .sessions
        .create_keyed(
            &principal,
            NewSession {
                target,
                system: request.system,
                metadata: request.metadata,
            },
            key,
        )
        .await?;
    if created.replayed {
        let mut response = (StatusCode::OK, Json(created.session)).into_response();
        response
            .headers_mut()
            .insert(IDEMPOTENT_REPLAYED, axum::http::HeaderValue::from_static("true"));
        Ok(response)
    } else {
        Ok((StatusCode::CREATED, Json(created.session)).into_response())
    }
}

/// The caller's sessions (an admin: all), oldest first, a page at a time.
#[utoipa::path(get, operation_id = "list_sessions", path = "/v1/sessions", tag = "sessions", params(PageQuery),
    responses(
        (status = 200, description = "A page of sessions", body = Listed<SessionRecord, String>),
        (status = 400, description = "A bad query", body = ErrorBody),
    ))]
async fn list(
    State(state): State<ApiState>,
    Extension(principal): Extension<Principal>,
    Params(query): Params<PageQuery>,
) -> Result<Json<Listed<SessionRecord, String>>, ApiError> {
    let page = state
        .sessions
        .list(&principal, query.after.as_deref(), query.limit()?)?;
    Ok(Json(Listed {
        data: page.sessions,
        next: page.next,
    }))
}

/// A session: its agent, binding, metadata and message count.
#[utoipa::path(get, operation_id = "get_session", path = "/v1/sessions/{id}", tag = "sessions",
    params(("id" = String, Path, description = "The session's id")),
    responses(
        (status = 200, description = "The session", body = SessionRecord),
        (status = 404, description = "No such session (or another user's)", body = ErrorBody),
    ))]
async fn show(
    State(state): State<ApiState>,
    Extension(principal): Extension<Principal>,
    Path(id): Path<String>,
) -> Result<Json<SessionRecord>, ApiError> {
    Ok(Json(state.sessions.get(&principal, &id)?))
}

/// Deletes a session and its messages.
#[utoipa::path(delete, operation_id = "delete_session", path = "/v1/sessions/{id}", tag = "sessions",
    params(("id" = String, Path, description = "The session's id")),
    responses(
        (status = 204, description = "Deleted"),
        (status = 404, description = "No such session (or another user's)", body = ErrorBody),
    ))]
async fn remove(
    State(state): State<ApiState>,
    Extension(principal): Extension<Principal>,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    state.sessions.delete(&principal, &id).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// The query of `GET /v1/sessions/{id}/messages`.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
struct MessagesQuery {
    /// The first sequence number (default 0): the `next` of the previous page.
    #[serde(default)]
    from: u64,
    /// Messages per page: 1 to 1000, default 100.
    #[serde(default)]
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<usize>,
}

/// A session's messages in order, a page at a time.
#[utoipa::path(get, operation_id = "list_messages", path = "/v1/sessions/{id}/messages", tag = "sessions",
    params(("id" = String, Path, description = "The session's id"), MessagesQuery),
    responses(
        (status = 200, description = "A page of messages", body = Listed<MessageRecord, u64>),
        (status = 400, description = "A bad query", body = ErrorBody),
        (status = 404, description = "No such session (or another user's)", body = ErrorBody),
    ))]
async fn messages(
    State(state): State<ApiState>,
    Extension(principal): Extension<Principal>,
    Path(id): Path<String>,
    Params(query): Params<MessagesQuery>,
) -> Result<Json<Listed<MessageRecord, u64>>, ApiError> {
    let limit = page_size(query.limit)?;
    if i64::try_from(query.from).is_err() {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            format!(
                "`from` is {}, past any message; start from 0 or a page's `next`",
                query.from
            ),
        ));
    }
    let data = state.sessions.messages(&principal, &id, query.from, limit)?;
    let next = (data.len() == limit).then(|| data.last().map_or(query.from, |m| m.seq + 1));
    Ok(Json(Listed { data, next }))
}

/// A message sent by a client.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct ClientMessage {
    /// Who wrote it.
    pub role: Role,
    /// The text (none: empty, as in an assistant message that only calls tools).
    #[serde(default)]
    pub content: String,
    /// The tools an assistant message calls (the session's last reply sent back is not
    /// stored twice).
    #[serde(default)]
    pub tool_calls: Vec<RequestedCall>,
    /// The call a `tool` message answers: one of the session's or of this request.
    #[serde(default)]
    pub tool_call_id: Option<String>,
}

impl From<ClientMessage> for NewMessage {
    fn from(m: ClientMessage) -> NewMessage {
        NewMessage {
            tool_calls: m.tool_calls,
            tool_call_id: m.tool_call_id,
            ..NewMessage::new(m.role, m.content)
        }
    }
}

/// The body of `POST /v1/sessions/{id}/messages`: `content` (a user message) and/or
/// `messages`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct SendMessages {
    /// A user message, appended after `messages`.
    #[serde(default)]
    content: Option<String>,
    /// Messages to append, in order.
    #[serde(default)]
    messages: Vec<ClientMessage>,
    /// Answer with server-sent events: `token` as generated, then `message` or `error`.
    #[serde(default)]
    stream: bool,
    /// Sampling temperature, 0 to 2 (default: the agent's).
    #[serde(default)]
    #[schema(minimum = 0.0, maximum = 2.0)]
    temperature: Option<f64>,
    /// The most tokens to generate (default: the agent's).
    #[serde(default)]
    #[schema(minimum = 1)]
    max_tokens: Option<u32>,
    /// False: only store the messages, without asking the agent.
    #[serde(default = "yes")]
    #[schema(default = true)]
    reply: bool,
}

fn yes() -> bool {
    true
}

/// The answer to a turn.
#[derive(Debug, Serialize, utoipa::ToSchema)]
struct TurnAnswer {
    /// The agent's reply (with `reply: false`, the last message stored).
    message: MessageRecord,
    /// True when the Idempotency-Key was seen before: nothing new was stored or generated.
    replayed: bool,
    /// The session after the turn.
    session: SessionRecord,
}

impl From<Reply> for TurnAnswer {
    fn from(reply: Reply) -> Self {
        TurnAnswer {
            message: reply.message,
            replayed: reply.replayed,
            session: reply.session,
        }
    }
}

/// The body of a chat request (a turn, a chat completion), read after the caller's
/// request was admitted ([`Flight::Request`]) and measured before anything is built
/// from it: a body longer than a request within the limits needs, or carrying more
/// messages or text than [`crate::session::ChatLimits`] allow, is refused with 413.
pub(super) async fn chat_body(
    sessions: &Sessions,
    headers: &HeaderMap,
    raw: axum::body::Body,
) -> Result<axum::body::Bytes, ApiError> {
    let limits = sessions.limits();
    let limit = limits.body_bytes().min(super::MAX_BODY_BYTES);
    let too_large = || ApiError::from(SessionError::from(limits.body_too_large(limit)));
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let declared = match declared.map(usize::try_from) {
        Some(Ok(n)) if n <= limit => n,
        Some(_) => return Err(too_large()),
        None => 0,
    };
    // One buffer of the declared size: the body is held once, not once per chunk and
    // again assembled.
    let mut bytes = Vec::with_capacity(declared);
    let mut chunks = raw.into_data_stream();
    while let Some(chunk) = chunks.next().await {
        let chunk =
            chunk.map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, format!("the body could not be read: {e}")))?;
        if bytes.len().saturating_add(chunk.len()) > limit {
            return Err(too_large());
        }
        bytes.extend_from_slice(&chunk);
    }
    limits.check_body(&bytes).map_err(SessionError::from)?;
    Ok(bytes.into())
}

/// Adds messages to a session and, unless `reply` is false, asks its agent and stores
/// the reply. Both are durable before the answer; an `Idempotency-Key` makes a retry
/// return the first answer.
#[utoipa::path(post, operation_id = "send_messages", path = "/v1/sessions/{id}/messages", tag = "sessions", request_body = SendMessages,
    params(
        ("id" = String, Path, description = "The session's id"),
        ("Idempotency-Key" = Option<String>, Header, description = "Makes a retried request a no-op (at most 256 bytes)"),
    ),
    responses(
        (status = 200, description = "The reply; with `stream: true` server-sent events: `token` (`{\"delta\": \"…\"}`) as generated, then `message` (the reply) or `error`", content(
            (TurnAnswer = "application/json"),
            (ServerSentEvent = "text/event-stream"),
        )),
        (status = 400, description = "A bad turn", body = ErrorBody),
        (status = 404, description = "No such session (or another user's)", body = ErrorBody),
        (status = 413, description = "More messages or text than one request may carry (the message says the limit and the size)", body = ErrorBody),
        (status = 429, description = "The caller has as many chat requests or streams in flight as one user may, or they or their group used their tokens of the minute (`quota_exceeded`); see Retry-After", body = ErrorBody,
            headers(("Retry-After" = u64, description = "Seconds to wait"))),
        (status = 502, description = "The engine failed", body = ErrorBody),
        (status = 503, description = "No instance can serve the agent now; the messages are kept. See Retry-After", body = ErrorBody,
            headers(("Retry-After" = u64, description = "Seconds to wait"))),
    ))]
async fn send(
    State(state): State<ApiState>,
    Extension(principal): Extension<Principal>,
    Path(id): Path<String>,
    headers: HeaderMap,
    raw: axum::body::Body,
) -> Result<Response, ApiError> {
    // Counted before the body is read, so a user's requests in flight hold at most
    // their number of bodies.
    let request_permit = state.sessions.admit(&principal, Flight::Request)?;
    let bytes = chat_body(&state.sessions, &headers, raw).await?;
    let request: SendMessages = body(
        &bytes,
        r#"a turn: {"content": "text"} or {"messages": [{"role": "user", "content": "text"}]}"#,
    )?;
    let mut messages: Vec<NewMessage> = request.messages.into_iter().map(NewMessage::from).collect();
    if let Some(content) = request.content {
        messages.push(NewMessage::new(Role::User, content));
    }
    let mut turn = Turn {
        messages,
        fields: serde_json::Map::new(),
        idempotency_key: idempotency_key(&headers)?,
        tokens: None,
        sampling: Sampling {
            temperature: request.temperature,
            max_tokens: request.max_tokens,
            ..Sampling::default()
        },
        reply: request.reply,
    };
    if !request.stream {
        let reply = state.sessions.send(&principal, &id, turn).await?;
        drop(request_permit);
        return Ok(Json(TurnAnswer::from(reply)).into_response());
    }
    // Refused before anything streams: a plain error answer.
    state.sessions.get(&principal, &id)?;
    let stream_permit = state.sessions.admit(&principal, Flight::Stream)?;
    let (tokens, pieces) = mpsc::channel(STREAM_BUFFER);
    turn.tokens = Some(tokens);
    let sessions = state.sessions.clone();
    // The turn runs to its end even if the client goes away, so its reply is stored
    // (a retry with the same Idempotency-Key then gets it); it counts as the user's
    // request until then.
    let done = state.tasks.spawn(async move {
        let sent = sessions.send(&principal, &id, turn).await;
        drop(request_permit);
        sent
    });
    // The stream counts as open until it ends or its client goes away (it is dropped).
    let events = turn_events(pieces, done).map(move |event| {
        let _open = &stream_permit;
        event
    });
    Ok(Sse::new(events).keep_alive(KeepAlive::default()).into_response())
}

type TurnTask = tokio::task::JoinHandle<Result<Reply, SessionError>>;

/// `token` events while the reply's text is generated, then `message` (which holds the
/// tool calls the reply makes) or `error`.
fn turn_events(
    pieces: mpsc::Receiver<Piece>,
    done: TurnTask,
) -> impl futures::Stream<Item = Result<Event, Infallible>> {
    futures::stream::unfold(Some((pieces, done)), |state| async move {
        let (mut pieces, done) = state?;
        while let Some(piece) = pieces.recv().await {
            // A tool call's pieces are not text: the call comes whole in `message`.
            if let Piece::Text(delta) = piece {
                let data = serde_json::json!({ "delta": delta }).to_string();
                return Some((Ok(Event::default().event("token").data(data)), Some((pieces, done))));
            }
        }
        let event = match done.await {
            Ok(Ok(reply)) => Event::default()
                .event("message")
                .data(serde_json::to_string(&TurnAnswer::from(reply)).unwrap_or_default()),
            Ok(Err(e)) => {
                let e = ApiError::from(e);
                Event::default().event("error").data(
                    serde_json::json!({"error": {"code": e.code, "message": e.message, "status": e.status.as_u16()}})
                        .to_string(),
                )
            }
            Err(e) => Event::default().event("error").data(
                serde_json::json!({"error": {"code": "internal", "message": format!("the turn failed: {e}")}})
                    .to_string(),
            ),
        };
        Some((Ok(event), None))
    })
}

/// The body of `POST /v1/sessions/{id}/migrate`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct MigrateRequest {
    /// `"auto"`, `{"node": "rtx-1", "gpu": 2}` or `{"node": "rtx-1"}`.
    to: MigrateTarget,
}

/// Where a session moves.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(untagged)]
enum MigrateTarget {
    /// `"auto"`: wherever the planner places it, away from its instance.
    Named(String),
    /// A node, and optionally one of its GPUs.
    Place(Place),
}

/// A node, and optionally one of its GPUs.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct Place {
    /// The node's name or id.
    node: String,
    /// The GPU's index on the node.
    #[serde(default)]
    gpu: Option<u32>,
}

/// A finished move.
#[derive(Debug, Serialize, utoipa::ToSchema)]
struct Moved {
    /// The session, bound to its new instance.
    session: SessionRecord,
    /// Its instance before (none if it had none).
    from: Option<Binding>,
    /// Its instance now.
    to: Binding,
    /// How long turns could not start: the switch of the binding.
    downtime_ms: f64,
    /// How long the switch waited for a turn in flight.
    waited_ms: f64,
}

/// Moves a session to an instance elsewhere, starting one there if needed; the next
/// message is served there with the whole history.
#[utoipa::path(post, operation_id = "migrate_session", path = "/v1/sessions/{id}/migrate", tag = "sessions", request_body = MigrateRequest,
    params(("id" = String, Path, description = "The session's id")),
    responses(
        (status = 200, description = "Moved", body = Moved),
        (status = 400, description = "A bad target", body = ErrorBody),
        (status = 404, description = "No such session (or another user's), or no such node", body = ErrorBody),
        (status = 409, description = "Nothing fits there now (code `no_room`); the session stays where it is", body = ErrorBody),
        (status = 502, description = "The new instance failed to start", body = ErrorBody),
    ))]
async fn migrate(
    State(state): State<ApiState>,
    Extension(principal): Extension<Principal>,
    Path(id): Path<String>,
    bytes: axum::body::Bytes,
) -> Result<Json<Moved>, ApiError> {
    let request: MigrateRequest = body(
        &bytes,
        r#"a move: {"to": "auto"}, {"to": {"node": "NODE", "gpu": N}} or {"to": {"node": "NODE"}}"#,
    )?;
    let to = match request.to {
        MigrateTarget::Named(name) if name == "auto" => MoveTo::Auto,
        MigrateTarget::Named(other) => {
            return Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                format!(r#"`to` is "{other}"; write "auto" or {{"node": "NODE", "gpu": N}}"#),
            ));
        }
        MigrateTarget::Place(Place { node, gpu: Some(gpu) }) => MoveTo::Gpu { node, gpu },
        MigrateTarget::Place(Place { node, gpu: None }) => MoveTo::Node(node),
    };
    // A target with no room is a conflict with the fleet as it is, not a failure of the
    // server: the session stays where it was.
    let moved = state.sessions.migrate(&principal, &id, to).await.map_err(|e| match e {
        SessionError::Unavailable(reason) => {
            ApiError::new(StatusCode::CONFLICT, format!("the session stays where it is: {reason}")).code("no_room")
        }
        other => ApiError::from(other),
    })?;
    Ok(Json(Moved {
        session: moved.session,
        from: moved.from,
        to: moved.to,
        downtime_ms: moved.downtime.as_secs_f64() * 1e3,
        waited_ms: moved.waited.as_secs_f64() * 1e3,
    }))
}
