//! The OpenAI stream of a chat completion: a role chunk, a chunk per piece of text or
//! of a tool call (`choices[0].delta.tool_calls[0]` with its `index`, the call's `id`
//! and function `name` in its first piece, then pieces of its `arguments`), the finish
//! chunk (and the usage chunk when asked), `[DONE]`; a failure is an error body before
//! `[DONE]`.

use std::convert::Infallible;

use axum::response::sse::Event;
use serde_json::{Value, json};
use skein_proto::openai::{self, ResponseMeta};
use tokio::sync::mpsc;

use super::{finish_reason, usage};
use crate::api::error::ApiError;
use crate::engine_client::{Answer, Piece};
use crate::session::SessionError;

/// The completion's work, whose pieces come first.
pub(in crate::api) type Work = tokio::task::JoinHandle<Result<Answer, SessionError>>;

enum Phase {
    Start,
    Pieces,
    Tail(Vec<String>),
    Done,
}

/// The delta of a piece.
fn delta(piece: Piece) -> Value {
    match piece {
        Piece::Text(text) => json!({ "content": text }),
        Piece::ToolCall(call) => {
            openai::tool_call_delta(call.index, call.id.as_deref(), call.name.as_deref(), &call.arguments)
        }
    }
}

/// What follows the pieces: the finish chunk (and usage), or the error, then `[DONE]`,
/// in the order they are sent.
fn tail(
    meta: &ResponseMeta,
    outcome: Result<Result<Answer, SessionError>, tokio::task::JoinError>,
    include_usage: bool,
) -> Vec<String> {
    let mut tail = Vec::new();
    match outcome {
        Ok(Ok(answer)) => {
            tail.push(openai::chunk_body(meta, json!({}), Some(&finish_reason(&answer))).to_string());
            if include_usage && let Some(u) = usage(&answer) {
                tail.push(openai::usage_chunk_body(meta, u).to_string());
            }
        }
        Ok(Err(e)) => {
            let e = ApiError::from(e);
            tail.push(openai::error_body(&e.message, e.code, e.code).to_string());
        }
        Err(e) => {
            tail.push(openai::error_body(&format!("the completion failed: {e}"), "internal", "internal").to_string());
        }
    }
    tail.push("[DONE]".to_owned());
    tail
}

/// The stream's events.
pub(super) fn completion_events(
    meta: ResponseMeta,
    pieces: mpsc::Receiver<Piece>,
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
                        if let Some(piece) = pieces.recv().await {
                            let chunk = openai::chunk_body(&meta, delta(piece), None);
                            return Some((Ok(data(chunk)), (Phase::Pieces, pieces, done)));
                        }
                        let outcome = done.take()?.await;
                        let mut rest = tail(&meta, outcome, include_usage);
                        rest.reverse();
                        let first = rest.pop().unwrap_or_default();
                        Some((Ok(Event::default().data(first)), (Phase::Tail(rest), pieces, done)))
                    }
                    Phase::Tail(mut rest) => {
                        let next = rest.pop()?;
                        let phase = if rest.is_empty() {
                            Phase::Done
                        } else {
                            Phase::Tail(rest)
                        };
                        Some((Ok(Event::default().data(next)), (phase, pieces, done)))
                    }
                    Phase::Done => None,
                }
            }
        },
    )
}
