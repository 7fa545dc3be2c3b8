//! Anthropic's stream of a message: `message_start`; for each block of the answer
//! `content_block_start`, its `content_block_delta`s (`text_delta` for text,
//! `input_json_delta` with pieces of a tool call's input) and `content_block_stop`;
//! then `message_delta` (the stop reason and usage) and `message_stop`. A failure
//! after the start is an `error` event.

use std::collections::VecDeque;
use std::convert::Infallible;

use axum::http::StatusCode;
use axum::response::sse::Event;
use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::{error_body, stop_reason, usage};
use crate::api::error::ApiError;
use crate::engine_client::{CallPiece, Piece};

/// The answer's work, whose pieces come first.
pub(super) type Work = tokio::task::JoinHandle<Result<crate::engine_client::Answer, crate::session::SessionError>>;

/// What `message_start` names.
pub(super) struct Start {
    /// `msg_…`.
    pub(super) id: String,
    /// The model as asked.
    pub(super) model: String,
}

/// The block open now.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Open {
    Text,
    /// Tool call `index` of the engine's answer.
    Call(usize),
}

/// The stream's state: events ready to send, and where the blocks are.
struct State {
    ready: VecDeque<Event>,
    pieces: mpsc::Receiver<Piece>,
    done: Option<Work>,
    open: Option<Open>,
    /// The index of the next block.
    next: usize,
    finished: bool,
}

fn event(name: &str, data: Value) -> Event {
    Event::default().event(name).data(data.to_string())
}

impl State {
    /// Closes the open block, if any.
    fn close(&mut self) {
        if self.open.take().is_some() {
            let index = self.next - 1;
            self.ready.push_back(event(
                "content_block_stop",
                json!({"type": "content_block_stop", "index": index}),
            ));
        }
    }

    /// Opens a block of `kind` with `block` as it starts.
    fn open(&mut self, kind: Open, block: Value) {
        self.close();
        self.ready.push_back(event(
            "content_block_start",
            json!({"type": "content_block_start", "index": self.next, "content_block": block}),
        ));
        self.open = Some(kind);
        self.next += 1;
    }

    fn delta(&mut self, delta: Value) {
        let index = self.next - 1;
        self.ready.push_back(event(
            "content_block_delta",
            json!({"type": "content_block_delta", "index": index, "delta": delta}),
        ));
    }

    fn piece(&mut self, piece: Piece) {
        match piece {
            Piece::Text(text) => {
                if self.open != Some(Open::Text) {
                    self.open(Open::Text, json!({"type": "text", "text": ""}));
                }
                self.delta(json!({"type": "text_delta", "text": text}));
            }
            Piece::ToolCall(CallPiece {
                index,
                id,
                name,
                arguments,
            }) => {
                if self.open != Some(Open::Call(index)) {
                    let id = id.unwrap_or_else(|| format!("call_{index}"));
                    let name = name.unwrap_or_default();
                    self.open(
                        Open::Call(index),
                        json!({"type": "tool_use", "id": id, "name": name, "input": {}}),
                    );
                }
                if !arguments.is_empty() {
                    self.delta(json!({"type": "input_json_delta", "partial_json": arguments}));
                }
            }
        }
    }

    /// The end: the last block closed, the stop reason and usage, or the error.
    fn end(
        &mut self,
        outcome: Result<Result<crate::engine_client::Answer, crate::session::SessionError>, tokio::task::JoinError>,
    ) {
        match outcome {
            Ok(Ok(answer)) => {
                self.close();
                let usage = usage(&answer);
                self.ready.push_back(event(
                    "message_delta",
                    json!({"type": "message_delta",
                           "delta": {"stop_reason": stop_reason(&answer), "stop_sequence": null},
                           "usage": {"input_tokens": usage.input_tokens, "output_tokens": usage.output_tokens}}),
                ));
                self.ready
                    .push_back(event("message_stop", json!({"type": "message_stop"})));
            }
            Ok(Err(e)) => {
                let e = ApiError::from(e);
                self.ready.push_back(event("error", error_body(e.status, &e.message)));
            }
            Err(e) => {
                let message = format!("the answer failed: {e}");
                self.ready
                    .push_back(event("error", error_body(StatusCode::INTERNAL_SERVER_ERROR, &message)));
            }
        }
        self.finished = true;
    }
}

/// The stream's events.
pub(super) fn message_events(
    start: Start,
    pieces: mpsc::Receiver<Piece>,
    done: Work,
) -> impl futures::Stream<Item = Result<Event, Infallible>> {
    let mut state = State {
        ready: VecDeque::new(),
        pieces,
        done: Some(done),
        open: None,
        next: 0,
        finished: false,
    };
    state.ready.push_back(event(
        "message_start",
        json!({"type": "message_start", "message": {
            "id": start.id, "type": "message", "role": "assistant", "model": start.model,
            "content": [], "stop_reason": null, "stop_sequence": null,
            "usage": {"input_tokens": 0, "output_tokens": 0},
        }}),
    ));
    futures::stream::unfold(state, |mut state| async move {
        loop {
            if let Some(next) = state.ready.pop_front() {
                return Some((Ok(next), state));
            }
            if state.finished {
                return None;
            }
            match state.pieces.recv().await {
                Some(piece) => state.piece(piece),
                None => {
                    let outcome = state.done.take()?.await;
                    state.end(outcome);
                }
            }
        }
    })
}
