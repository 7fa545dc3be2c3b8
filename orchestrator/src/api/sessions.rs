//! Sessions over REST (docs/sessions.md):
//!
//! - `POST /v1/sessions` `{"model": "owner/name"}` or `{"agent": "coder", "run": "r…"}`
//!   (`run` optional: the user's newest run with that agent), with optional `system`
//!   and `metadata` → `201` with the session.
//! - `GET /v1/sessions?limit=&after=` → `{"data": [...], "next": id | null}`.
//! - `GET /v1/sessions/{id}`; `DELETE /v1/sessions/{id}` → `204`.
//! - `GET /v1/sessions/{id}/messages?from=&limit=` → `{"data": [...], "next": seq | null}`.
//! - `POST /v1/sessions/{id}/messages` `{"content": "…"}` or `{"messages": [...]}`,
//!   optional `stream`, `temperature`, `max_tokens`, `reply` (false: only store the
//!   messages), header `Idempotency-Key` → the
//!   reply (`{"message", "replayed", "session"}`), or with `stream: true` server-sent
//!   events: `token` (`{"delta": "…"}`) as generated, then `message` (the same body as
//!   without streaming) or `error`.
//! - `POST /v1/sessions/{id}/migrate` `{"to": "auto" | {"node": "rtx-1", "gpu": 2} |
//!   {"node": "rtx-1"}}` →
//!   `{"session", "from", "to", "downtime_ms", "waited_ms"}`.

use std::collections::BTreeMap;
use std::convert::Infallible;

use axum::extract::{Extension, Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

use super::{ApiError, ApiState, Principal, body};
use crate::session::{
    Binding, MessageRecord, MoveTo, NewMessage, NewSession, Reply, Role, SessionError, SessionRecord, Target, Turn,
};

/// Text pieces of a streamed reply that may wait for a slow reader.
const STREAM_BUFFER: usize = 256;

pub(super) fn routes() -> Router<ApiState> {
    Router::new()
        .route("/v1/sessions", post(create).get(list))
        .route("/v1/sessions/{id}", get(show).delete(remove))
        .route("/v1/sessions/{id}/messages", post(send).get(messages))
        .route("/v1/sessions/{id}/migrate", post(migrate))
}

impl From<SessionError> for ApiError {
    fn from(e: SessionError) -> ApiError {
        let status = match &e {
            SessionError::NotFound(_) => StatusCode::NOT_FOUND,
            SessionError::Invalid(_) => StatusCode::BAD_REQUEST,
            SessionError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            SessionError::Engine(_) => StatusCode::BAD_GATEWAY,
            SessionError::Store(_) => StatusCode::INTERNAL_SERVER_ERROR,
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

/// The body of `POST /v1/sessions`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateSession {
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    agent: Option<String>,
    #[serde(default)]
    run: Option<String>,
    #[serde(default)]
    system: Option<String>,
    #[serde(default)]
    metadata: BTreeMap<String, String>,
}

async fn create(
    State(state): State<ApiState>,
    Extension(principal): Extension<Principal>,
    bytes: axum::body::Bytes,
) -> Result<Response, ApiError> {
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
    let session = state
        .sessions
        .create(
            &principal,
            NewSession {
                target,
                system: request.system,
                metadata: request.metadata,
            },
        )
        .await?;
    Ok((StatusCode::CREATED, Json(session)).into_response())
}

/// A page query.
#[derive(Debug, Deserialize)]
struct PageQuery {
    #[serde(default)]
    limit: Option<usize>,
    #[serde(default)]
    after: Option<String>,
}

/// A page of a list.
#[derive(Debug, Serialize)]
pub(super) struct Listed<T, C> {
    /// The items.
    pub data: Vec<T>,
    /// The cursor of the next page (`after=` for sessions, `from=` for messages).
    pub next: Option<C>,
}

async fn list(
    State(state): State<ApiState>,
    Extension(principal): Extension<Principal>,
    Query(query): Query<PageQuery>,
) -> Result<Json<Listed<SessionRecord, String>>, ApiError> {
    let page = state
        .sessions
        .list(&principal, query.after.as_deref(), query.limit.unwrap_or(100))?;
    Ok(Json(Listed {
        data: page.sessions,
        next: page.next,
    }))
}

async fn show(
    State(state): State<ApiState>,
    Extension(principal): Extension<Principal>,
    Path(id): Path<String>,
) -> Result<Json<SessionRecord>, ApiError> {
    Ok(Json(state.sessions.get(&principal, &id)?))
}

async fn remove(
    State(state): State<ApiState>,
    Extension(principal): Extension<Principal>,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    state.sessions.delete(&principal, &id).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// The query of `GET /v1/sessions/{id}/messages`.
#[derive(Debug, Deserialize)]
struct MessagesQuery {
    #[serde(default)]
    from: u64,
    #[serde(default)]
    limit: Option<usize>,
}

async fn messages(
    State(state): State<ApiState>,
    Extension(principal): Extension<Principal>,
    Path(id): Path<String>,
    Query(query): Query<MessagesQuery>,
) -> Result<Json<Listed<MessageRecord, u64>>, ApiError> {
    let limit = query.limit.unwrap_or(100).clamp(1, crate::session::service::MAX_PAGE);
    let data = state.sessions.messages(&principal, &id, query.from, limit)?;
    let next = (data.len() == limit).then(|| data.last().map_or(query.from, |m| m.seq + 1));
    Ok(Json(Listed { data, next }))
}

/// A message sent by a client.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ClientMessage {
    pub role: Role,
    pub content: String,
}

/// The body of `POST /v1/sessions/{id}/messages`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SendMessages {
    #[serde(default)]
    content: Option<String>,
    #[serde(default)]
    messages: Vec<ClientMessage>,
    #[serde(default)]
    stream: bool,
    #[serde(default)]
    temperature: Option<f64>,
    #[serde(default)]
    max_tokens: Option<u32>,
    #[serde(default = "yes")]
    reply: bool,
}

fn yes() -> bool {
    true
}

/// The answer to a turn.
#[derive(Debug, Serialize)]
struct TurnAnswer {
    message: MessageRecord,
    replayed: bool,
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

/// The `Idempotency-Key` header, if any.
pub(super) fn idempotency_key(headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    match headers.get("idempotency-key") {
        None => Ok(None),
        Some(value) => value.to_str().map(|v| Some(v.trim().to_owned())).map_err(|_| {
            ApiError::new(
                StatusCode::BAD_REQUEST,
                "the Idempotency-Key header must be printable ASCII",
            )
        }),
    }
}

async fn send(
    State(state): State<ApiState>,
    Extension(principal): Extension<Principal>,
    Path(id): Path<String>,
    headers: HeaderMap,
    bytes: axum::body::Bytes,
) -> Result<Response, ApiError> {
    let request: SendMessages = body(
        &bytes,
        r#"a turn: {"content": "text"} or {"messages": [{"role": "user", "content": "text"}]}"#,
    )?;
    let mut messages: Vec<NewMessage> = request
        .messages
        .into_iter()
        .map(|m| NewMessage::new(m.role, m.content))
        .collect();
    if let Some(content) = request.content {
        messages.push(NewMessage::new(Role::User, content));
    }
    let mut turn = Turn {
        messages,
        idempotency_key: idempotency_key(&headers)?,
        tokens: None,
        temperature: request.temperature,
        max_tokens: request.max_tokens,
        reply: request.reply,
    };
    if !request.stream {
        let reply = state.sessions.send(&principal, &id, turn).await?;
        return Ok(Json(TurnAnswer::from(reply)).into_response());
    }
    // Refused before anything streams: a plain error answer.
    state.sessions.get(&principal, &id)?;
    let (tokens, pieces) = mpsc::channel(STREAM_BUFFER);
    turn.tokens = Some(tokens);
    let sessions = state.sessions.clone();
    // The turn runs to its end even if the client goes away, so its reply is stored
    // (a retry with the same Idempotency-Key then gets it).
    let done = tokio::spawn(async move { sessions.send(&principal, &id, turn).await });
    Ok(Sse::new(turn_events(pieces, done))
        .keep_alive(KeepAlive::default())
        .into_response())
}

type TurnTask = tokio::task::JoinHandle<Result<Reply, SessionError>>;

/// `token` events while the reply is generated, then `message` or `error`.
fn turn_events(
    pieces: mpsc::Receiver<String>,
    done: TurnTask,
) -> impl futures::Stream<Item = Result<Event, Infallible>> {
    futures::stream::unfold(Some((pieces, done)), |state| async move {
        let (mut pieces, done) = state?;
        if let Some(delta) = pieces.recv().await {
            let data = serde_json::json!({ "delta": delta }).to_string();
            return Some((Ok(Event::default().event("token").data(data)), Some((pieces, done))));
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
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct MigrateRequest {
    to: MigrateTarget,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum MigrateTarget {
    Named(String),
    Place {
        node: String,
        #[serde(default)]
        gpu: Option<u32>,
    },
}

/// A finished move.
#[derive(Debug, Serialize)]
struct Moved {
    session: SessionRecord,
    from: Option<Binding>,
    to: Binding,
    downtime_ms: f64,
    waited_ms: f64,
}

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
        MigrateTarget::Place { node, gpu: Some(gpu) } => MoveTo::Gpu { node, gpu },
        MigrateTarget::Place { node, gpu: None } => MoveTo::Node(node),
    };
    let moved = state.sessions.migrate(&principal, &id, to).await?;
    Ok(Json(Moved {
        session: moved.session,
        from: moved.from,
        to: moved.to,
        downtime_ms: moved.downtime.as_secs_f64() * 1e3,
        waited_ms: moved.waited.as_secs_f64() * 1e3,
    }))
}
