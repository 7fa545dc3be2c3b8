//! The Anthropic-compatible route, so Anthropic's clients work unchanged (base URL
//! `http://SERVER`, the Skein token as the API key, sent as `x-api-key`):
//!
//! - `POST /v1/messages`: the Messages API. `model` names an agent or a hub model as
//!   for the OpenAI routes; the request is translated to the OpenAI request the engines
//!   take ([`translate`]: `system`, text, `tool_use` and `tool_result` blocks, `tools`
//!   and `tool_choice`, `max_tokens`, `temperature`, `top_p`, `stop_sequences`), and the
//!   answer back: content blocks (`text`, `tool_use`), `stop_reason`, `usage`; with
//!   `stream`, Anthropic's events ([`stream`]). Errors are in Anthropic's shape
//!   (`{"type": "error", "error": {"type", "message"}}`).
//!
//! The route has the limits of a chat completion (body measured before it is parsed,
//! requests and streams in flight per user) and no session: the client sends the
//! whole conversation.

mod stream;
pub(crate) mod translate;

use axum::Json;
use axum::extract::{Extension, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::sse::Sse;
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use serde::Serialize;
use serde_json::{Value, json};
use tokio::sync::mpsc;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::error::ApiError;
use super::extract::body;
use super::openapi::ServerSentEvent;
use super::sessions::chat_body;
use super::{ApiState, Principal};
use crate::engine_client::{Answer, Piece};
use crate::session::Flight;
use translate::MessagesRequest;

/// Pieces of a streamed answer that may wait for a slow reader.
const STREAM_BUFFER: usize = 256;

pub(super) fn routes() -> OpenApiRouter<ApiState> {
    OpenApiRouter::new().routes(routes!(messages))
}

/// An error in Anthropic's shape: `{"type": "error", "error": {"type", "message"}}`.
#[derive(Debug)]
pub(crate) struct AnthropicError(pub(crate) ApiError);

impl From<ApiError> for AnthropicError {
    fn from(e: ApiError) -> Self {
        AnthropicError(e)
    }
}

impl From<crate::session::SessionError> for AnthropicError {
    fn from(e: crate::session::SessionError) -> Self {
        AnthropicError(ApiError::from(e))
    }
}

/// Anthropic's error type for an answer of `status`.
pub(crate) fn error_type(status: StatusCode) -> &'static str {
    match status {
        StatusCode::BAD_REQUEST | StatusCode::UNPROCESSABLE_ENTITY => "invalid_request_error",
        StatusCode::UNAUTHORIZED => "authentication_error",
        StatusCode::FORBIDDEN => "permission_error",
        StatusCode::NOT_FOUND => "not_found_error",
        StatusCode::PAYLOAD_TOO_LARGE => "request_too_large",
        StatusCode::TOO_MANY_REQUESTS => "rate_limit_error",
        StatusCode::SERVICE_UNAVAILABLE => "overloaded_error",
        _ => "api_error",
    }
}

/// Anthropic's error body.
pub(crate) fn error_body(status: StatusCode, message: &str) -> Value {
    json!({ "type": "error", "error": { "type": error_type(status), "message": message } })
}

impl IntoResponse for AnthropicError {
    fn into_response(self) -> Response {
        let e = self.0;
        let mut response = (e.status, Json(error_body(e.status, &e.message))).into_response();
        if let Some(seconds) = e.retry_after
            && let Ok(value) = header::HeaderValue::from_str(&seconds.to_string())
        {
            response.headers_mut().insert(header::RETRY_AFTER, value);
        }
        response
    }
}

/// Anthropic's error answer, for the OpenAPI document.
#[derive(Serialize, utoipa::ToSchema)]
struct AnthropicErrorBody {
    /// Always `error`.
    #[serde(rename = "type")]
    kind: String,
    /// `{"type": "invalid_request_error", "message": "…"}`.
    #[schema(value_type = Object)]
    error: Value,
}

/// A content block of an answer.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub(crate) enum AnswerBlock {
    /// Text.
    Text {
        /// The text.
        text: String,
    },
    /// A call of a tool.
    ToolUse {
        /// The call's id, which the `tool_result` names.
        id: String,
        /// The tool's name.
        name: String,
        /// Its input, an object.
        #[schema(value_type = Object)]
        input: Value,
    },
}

/// Token counts of an answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub(crate) struct AnthropicUsage {
    /// Prompt tokens.
    pub(crate) input_tokens: u64,
    /// Generated tokens.
    pub(crate) output_tokens: u64,
}

/// The answer of `POST /v1/messages`.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub(crate) struct MessagesAnswer {
    /// `msg_…`.
    id: String,
    /// Always `message`.
    #[serde(rename = "type")]
    kind: String,
    /// Always `assistant`.
    role: String,
    /// The model as asked.
    model: String,
    /// The answer's blocks: its text, then its tool calls.
    content: Vec<AnswerBlock>,
    /// `end_turn`, `max_tokens`, `stop_sequence` or `tool_use`.
    stop_reason: String,
    /// The stop sequence that ended the answer, when the engine says which.
    stop_sequence: Option<String>,
    /// Token counts (0 when the engine gave none).
    usage: AnthropicUsage,
}

/// `stop_reason` of an answer: `tool_use` when it calls tools, `max_tokens` when it
/// ran out, `stop_sequence` when the engine names the stop sequence that ended it,
/// else `end_turn`.
pub(crate) fn stop_reason(answer: &Answer) -> &'static str {
    if !answer.tool_calls.is_empty() {
        return "tool_use";
    }
    match answer.finish_reason.as_deref() {
        Some("length") => "max_tokens",
        Some("tool_calls") => "tool_use",
        _ => "end_turn",
    }
}

/// The usage of an answer.
pub(crate) fn usage(answer: &Answer) -> AnthropicUsage {
    let u = answer.usage.unwrap_or(crate::engine_client::Usage {
        prompt_tokens: 0,
        completion_tokens: 0,
    });
    AnthropicUsage {
        input_tokens: u.prompt_tokens,
        output_tokens: u.completion_tokens,
    }
}

/// A tool call's input: its arguments' JSON object (the engine's text, read).
///
/// Errors: the model wrote arguments that are not a JSON object (502).
fn tool_input(name: &str, arguments: &str) -> Result<Value, ApiError> {
    let arguments = if arguments.trim().is_empty() { "{}" } else { arguments };
    match serde_json::from_str::<Value>(arguments) {
        Ok(input @ Value::Object(_)) => Ok(input),
        _ => Err(ApiError::new(
            StatusCode::BAD_GATEWAY,
            format!(
                "the model called tool `{name}` with arguments that are not a JSON object: {}",
                arguments.chars().take(200).collect::<String>()
            ),
        )),
    }
}

/// The answer in Anthropic's form.
fn answer_body(id: String, model: String, answer: &Answer) -> Result<MessagesAnswer, ApiError> {
    let mut content = Vec::new();
    if !answer.content.is_empty() {
        content.push(AnswerBlock::Text {
            text: answer.content.clone(),
        });
    }
    for call in &answer.tool_calls {
        content.push(AnswerBlock::ToolUse {
            id: call.id.clone(),
            name: call.name.clone(),
            input: tool_input(&call.name, &call.arguments)?,
        });
    }
    Ok(MessagesAnswer {
        id,
        kind: "message".to_owned(),
        role: "assistant".to_owned(),
        model,
        content,
        stop_reason: stop_reason(answer).to_owned(),
        stop_sequence: None,
        usage: usage(answer),
    })
}

/// A message id: `msg_` and the completion's.
fn message_id(model: &str) -> String {
    let meta = super::openai::meta(model);
    format!("msg_{}", meta.id.trim_start_matches("chatcmpl-"))
}

/// Anthropic's Messages API: `model` is an agent of the caller's newest run that has
/// it, or a hub model placed on demand.
#[utoipa::path(post, operation_id = "create_message", path = "/v1/messages", tag = "anthropic", request_body = MessagesRequest,
    params(
        ("x-api-key" = Option<String>, Header, description = "The Skein API token (Anthropic's clients send their key here; `Authorization: Bearer` works too)"),
    ),
    responses(
        (status = 200, description = "The message, or with `stream: true` Anthropic's server-sent events (`message_start`, `content_block_start`, `content_block_delta`, `content_block_stop`, `message_delta`, `message_stop`)", content(
            (MessagesAnswer = "application/json"),
            (ServerSentEvent = "text/event-stream"),
        )),
        (status = 400, description = "A bad request (the message names the field)", body = AnthropicErrorBody),
        (status = 404, description = "No such model", body = AnthropicErrorBody),
        (status = 413, description = "More messages or text than one request may carry", body = AnthropicErrorBody),
        (status = 429, description = "The caller has as many chat requests or streams in flight as one user may, or they or their group used their tokens of the minute (`quota_exceeded`); see Retry-After", body = AnthropicErrorBody,
            headers(("Retry-After" = u64, description = "Seconds to wait"))),
        (status = 502, description = "The engine failed", body = AnthropicErrorBody),
        (status = 503, description = "No instance can serve the model now; see Retry-After", body = AnthropicErrorBody,
            headers(("Retry-After" = u64, description = "Seconds to wait"))),
    ))]
async fn messages(
    State(state): State<ApiState>,
    Extension(principal): Extension<Principal>,
    headers: HeaderMap,
    raw: axum::body::Body,
) -> Result<Response, AnthropicError> {
    let request_permit = state.sessions.admit(&principal, Flight::Request)?;
    let bytes = chat_body(&state.sessions, &headers, raw).await?;
    let request: MessagesRequest = body(&bytes, "an Anthropic Messages request")?;
    let model = request.model.clone();
    let stream = request.stream;
    let (prompt, sampling) = translate::to_openai(request)?;
    let target = state.sessions.resolve(&principal, &model)?;
    let stream_permit = stream
        .then(|| state.sessions.admit(&principal, Flight::Stream))
        .transpose()?;
    let id = message_id(&model);
    let sessions = state.sessions.clone();
    if !stream {
        let answer = sessions
            .complete_prompt(&principal, &target, prompt, sampling, None::<&mpsc::Sender<Piece>>)
            .await?;
        drop(request_permit);
        return Ok(Json(answer_body(id, model, &answer)?).into_response());
    }
    let (pieces_in, pieces) = mpsc::channel(STREAM_BUFFER);
    // The answer is generated to its end even if the client goes away.
    let done = state.tasks.spawn(async move {
        let answer = sessions
            .complete_prompt(&principal, &target, prompt, sampling, Some(&pieces_in))
            .await;
        drop(request_permit);
        answer
    });
    let events = stream::message_events(stream::Start { id, model }, pieces, done).map(move |event| {
        let _open = &stream_permit;
        event
    });
    Ok(Sse::new(events).into_response())
}
