//! A step's agent loop as the run's durable record keeps it: each model turn, and each
//! tool call the turn asked for, written before the call is sent and after it returns.
//! Pure: the executor writes each change and waits for the store's acknowledgement
//! before it acts on it, so after a crash the record says which calls completed (never
//! sent again), which were in flight (the tool's policy decides), and which were not
//! sent yet.

use serde::{Deserialize, Serialize};

use super::{RunRecord, StepState, UnixMs, Usage};

/// One model call of a step's agent loop that asked for tools.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Turn {
    /// The model's text beside its tool calls, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    /// The tool calls it asked for, in its order.
    pub calls: Vec<ToolCall>,
    /// When the model's answer came.
    pub at: UnixMs,
    /// Tokens of this model call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}

/// Where a tool call stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum CallState {
    /// Asked for, not sent yet.
    Pending,
    /// Sent to its tool server; no result recorded.
    Sent,
    /// Its result is recorded (a tool error counts: the model reads it).
    Returned,
}

/// One tool call of a [`Turn`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ToolCall {
    /// The model's id of the call (`call_…`).
    pub id: String,
    /// The function the model named (`server__tool`).
    pub name: String,
    /// The tool server, when the name is one of the agent's tools.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server: Option<String>,
    /// The tool's name on its server.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool: Option<String>,
    /// The arguments as the model wrote them (JSON text).
    pub arguments: String,
    /// Where it stands.
    pub state: CallState,
    /// How many times it was sent (more than one only under the `retry` policy after
    /// a restart).
    #[serde(default)]
    pub sends: u32,
    /// When it was last sent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sent_at: Option<UnixMs>,
    /// When its result came.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub returned_at: Option<UnixMs>,
    /// The text fed back to the model: the tool's result, or why there is none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<String>,
    /// The result is an error (the tool's, or Skein's: an unknown tool, bad arguments,
    /// an unreachable server).
    #[serde(default)]
    pub is_error: bool,
}

impl ToolCall {
    /// A call the model asked for, not sent yet.
    pub fn pending(id: String, name: String, arguments: String, resolved: Option<(String, String)>) -> ToolCall {
        let (server, tool) = match resolved {
            Some((server, tool)) => (Some(server), Some(tool)),
            None => (None, None),
        };
        ToolCall {
            id,
            name,
            server,
            tool,
            arguments,
            state: CallState::Pending,
            sends: 0,
            sent_at: None,
            returned_at: None,
            result: None,
            is_error: false,
        }
    }
}

impl ToolCall {
    /// Records that it is sent at `at` (once more, after a restart under `retry`).
    pub fn mark_sent(&mut self, at: UnixMs) {
        self.state = CallState::Sent;
        self.sends += 1;
        self.sent_at = Some(at);
    }
}

/// A change to a running step's agent loop, recorded before the executor acts on it.
#[derive(Debug, Clone, PartialEq)]
pub enum LoopChange {
    /// The model asked for tools (its first call may be recorded sent with it: one
    /// write instead of two).
    Turn(Turn),
    /// Call `call` of turn `turn` is about to be sent.
    Sent {
        /// The turn's index.
        turn: usize,
        /// The call's index in it.
        call: usize,
        /// When.
        at: UnixMs,
    },
    /// Call `call` of turn `turn` returned `result`.
    Returned {
        /// The turn's index.
        turn: usize,
        /// The call's index in it.
        call: usize,
        /// The text for the model.
        result: String,
        /// Whether it is an error.
        is_error: bool,
        /// When.
        at: UnixMs,
    },
}

impl RunRecord {
    /// Records `change` to the agent loop of running step `id` (of its running item
    /// `item`). A step no longer running (cancelled, failed meanwhile) or an index out
    /// of range is left alone: returns whether the change was recorded.
    pub fn record_loop(&mut self, id: &str, item: Option<u32>, change: LoopChange) -> bool {
        let turns = match item {
            Some(index) => match self.running_item(id, index) {
                Some(item) => &mut item.turns,
                None => return false,
            },
            None => match self.steps.iter_mut().find(|s| s.id == id) {
                Some(record) if record.state == StepState::Running => {
                    self.changed.turns_of.insert(id.to_owned());
                    &mut record.turns
                }
                _ => return false,
            },
        };
        match change {
            LoopChange::Turn(turn) => {
                turns.push(turn);
                true
            }
            LoopChange::Sent { turn, call, at } => {
                let Some(call) = turns.get_mut(turn).and_then(|t| t.calls.get_mut(call)) else {
                    return false;
                };
                call.mark_sent(at);
                true
            }
            LoopChange::Returned {
                turn,
                call,
                result,
                is_error,
                at,
            } => {
                let Some(call) = turns.get_mut(turn).and_then(|t| t.calls.get_mut(call)) else {
                    return false;
                };
                call.state = CallState::Returned;
                call.result = Some(result);
                call.is_error = is_error;
                call.returned_at = Some(at);
                true
            }
        }
    }
}
