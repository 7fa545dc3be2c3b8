//! A step's agent loop, for an agent with tools: the model is called with the tools'
//! definitions; each tool call it asks for is recorded, sent over MCP, and its result
//! recorded and fed back; until the model answers without calling a tool, or
//! `max_turns` model calls.
//!
//! Every change goes to the run's task ([`LoopChanges`]), which writes it to the store
//! and acknowledges it once flushed; only then does the loop act. An attempt resumed
//! from the record (after a restart, or a lost instance) replays the recorded turns
//! into the conversation: a returned call is never sent again, a pending one is sent,
//! and one that was in flight is sent again only if its server's `in_flight` policy
//! for that tool is `retry` (under `fail` the attempt fails; under `ask` the attempt
//! waits for a person before it resumes, and an approval makes the call pending).

use std::time::Duration;

use serde_json::{Map, Value, json};
use skein_dsl::ir::{DEFAULT_MAX_TURNS, InFlight, ToolChoice, Workflow};
use tokio::sync::{mpsc, oneshot};

use crate::base::unix_ms;
use crate::engine_client::{Answer, CallError, Route, call};
use crate::run::record::{Attempt, CallState, LoopChange, ToolCall, Turn};
use crate::tools::{ToolAccess, ToolBox, offered_name};

/// Where the loop sends its changes: the attempt, the change, and the acknowledgement
/// (`true` once written; `false` when the step no longer runs).
pub(super) type LoopChanges = mpsc::Sender<(Attempt, LoopChange, oneshot::Sender<bool>)>;

/// What one step's agent loop needs.
pub(super) struct AgentLoop {
    /// The tool servers it may reach, and the clients engines are called with.
    pub access: ToolAccess,
    pub workflow: Workflow,
    pub owner: String,
    pub attempt: Attempt,
    pub agent: String,
    /// The chat request of the step's prompt (system and user messages, sampling).
    pub request: Value,
    /// Longest one model call may take.
    pub model_timeout: Duration,
    /// Longest one tool call may take.
    pub tool_timeout: Duration,
    /// The turns recorded by an earlier run of this attempt.
    pub recorded: Vec<Turn>,
    pub changes: LoopChanges,
    /// Where its model calls are counted (usage accounting).
    pub tap: crate::sharing::Tap,
}

impl AgentLoop {
    /// Runs the loop to the model's final answer, calling the model at `route`.
    pub async fn run(self, route: Route) -> Result<Answer, CallError> {
        let toolbox = ToolBox::connect(&self.workflow, &self.agent, &self.owner, &self.access)
            .await
            .map_err(|e| CallError::Refused(e.to_string()))?;
        let result = self.drive(&route, &toolbox).await;
        toolbox.close().await;
        result
    }

    async fn drive(&self, route: &Route, toolbox: &ToolBox) -> Result<Answer, CallError> {
        let definition = self.workflow.agents.get(&self.agent);
        let max_turns = definition.and_then(|a| a.max_turns).unwrap_or(DEFAULT_MAX_TURNS) as usize;
        // The request of every model call: the step's, with the tools, and the
        // conversation growing in place.
        let mut body = self.request.clone();
        body["tools"] = Value::Array(toolbox.definitions());
        // A schema would keep the model from calling tools: only the last call, which
        // must answer, is held to it; an earlier answer is validated all the same.
        let response_format = body.as_object_mut().and_then(|b| b.remove("response_format"));
        if !body["messages"].is_array() {
            body["messages"] = json!([]);
        }
        // The recorded turns, replayed; calls without a result are sent now.
        for (t, turn) in self.recorded.iter().enumerate() {
            push(&mut body, assistant_message(turn));
            for (c, recorded) in turn.calls.iter().enumerate() {
                let result = match recorded.state {
                    CallState::Returned => recorded.result.clone().unwrap_or_default(),
                    CallState::Pending => self.send(toolbox, t, c, request_of(recorded), false).await?,
                    CallState::Sent => match recorded.in_flight_policy(&self.workflow) {
                        InFlight::Retry => self.send(toolbox, t, c, request_of(recorded), false).await?,
                        InFlight::Fail => {
                            return Err(CallError::Refused(format!(
                                "tool call {} (`{}`) was in flight when the orchestrator stopped, and its server's `in_flight` policy for it is `fail`; set `in_flight: retry` for tools that are safe to call twice, or `in_flight: ask` to have a person decide",
                                recorded.id, recorded.name
                            )));
                        }
                        // The record asks a person before the attempt resumes
                        // (RunRecord::advance), and an approval makes the call
                        // pending: one still in flight here was never approved.
                        InFlight::Ask => {
                            return Err(CallError::Refused(format!(
                                "tool call {} (`{}`) was in flight when the orchestrator stopped, and its server's `in_flight` policy for it is `ask`, but no approval to send it again is recorded",
                                recorded.id, recorded.name
                            )));
                        }
                    },
                };
                push(&mut body, tool_message(&recorded.id, &result));
            }
        }
        // The agent's `tool_choice` holds for the loop's first model call only: later
        // calls choose freely, so a loop whose tools answered can end. One tool named
        // is that call offered that tool alone, and `required`: every engine enforces
        // it so (llama.cpp reads no named choice).
        let (first_choice, first_tools) = match &definition.and_then(|a| a.tool_choice.as_ref()) {
            None | Some(ToolChoice::Auto) => (json!("auto"), None),
            Some(ToolChoice::Required) => (json!("required"), None),
            Some(ToolChoice::Tool(wanted)) => {
                let tool = wanted.tool.as_deref().unwrap_or_default();
                let only = toolbox.definition(&offered_name(&wanted.server, tool)).ok_or_else(|| {
                    CallError::Refused(format!(
                        "the agent's `tool_choice` is `{}.{tool}`, which tool server `{}` does not declare; choose one of the tools it declares, or `required`",
                        wanted.server, wanted.server
                    ))
                })?;
                (json!("required"), Some(json!([only])))
            }
        };
        let mut turns = self.recorded.len();
        loop {
            let last = turns + 1 >= max_turns;
            // The last model call must answer.
            let first = turns == 0 && !last;
            body["tool_choice"] = match (last, first) {
                (true, _) => json!("none"),
                (false, true) => first_choice.clone(),
                (false, false) => json!("auto"),
            };
            if let (true, Some(format)) = (last, &response_format) {
                body["response_format"] = format.clone();
            }
            let mut request = body.clone();
            if let (true, Some(only)) = (first, &first_tools) {
                request["tools"] = only.clone();
            }
            let answer = call(&self.access.clients, route, request, self.model_timeout).await?;
            self.tap.call(answer.usage);
            if answer.tool_calls.is_empty() {
                return Ok(answer);
            }
            if last {
                return Err(CallError::Engine(format!(
                    "the agent loop reached `max_turns` ({max_turns} model calls) and the model still calls tools; raise `max_turns` or ask for an answer sooner"
                )));
            }
            let calls: Vec<ToolCall> = answer
                .tool_calls
                .iter()
                .map(|requested| {
                    let resolved = toolbox
                        .resolve(&requested.name)
                        .map(|offered| (offered.server.clone(), offered.tool.clone()));
                    ToolCall::pending(
                        requested.id.clone(),
                        requested.name.clone(),
                        requested.arguments.clone(),
                        resolved,
                    )
                })
                .collect();
            let mut turn = Turn {
                content: Some(answer.content.clone()).filter(|c| !c.is_empty()),
                calls,
                at: unix_ms(),
                usage: answer.usage,
            };
            // The turn and the sending of its first call are one write.
            let mut first_request = turn.calls.first().map(request_of);
            let first_sent = matches!(first_request, Some(Ok(_)));
            if first_sent {
                turn.calls[0].mark_sent(unix_ms());
            }
            self.record(LoopChange::Turn(turn.clone())).await?;
            push(&mut body, assistant_message(&turn));
            for (c, requested) in turn.calls.iter().enumerate() {
                let request = match (c, first_request.take()) {
                    (0, Some(request)) => request,
                    _ => request_of(requested),
                };
                let result = self.send(toolbox, turns, c, request, c == 0 && first_sent).await?;
                push(&mut body, tool_message(&requested.id, &result));
            }
            turns += 1;
        }
    }

    /// Sends call `c` of turn `t` (`request`, [`request_of`] it) — recorded as sent
    /// first, unless `recorded_sent`: it was, with its turn — and records its result;
    /// the text for the model. A call the loop cannot make (an unknown tool, arguments
    /// that are not a JSON object, a server that fails) returns an error text the
    /// model reads, recorded like a result.
    async fn send(
        &self,
        toolbox: &ToolBox,
        t: usize,
        c: usize,
        request: Result<Request, String>,
        recorded_sent: bool,
    ) -> Result<String, CallError> {
        let (result, is_error) = match request {
            Ok(Request {
                server,
                tool,
                arguments,
            }) => {
                if !recorded_sent {
                    self.record(LoopChange::Sent {
                        turn: t,
                        call: c,
                        at: unix_ms(),
                    })
                    .await?;
                }
                match toolbox.call(&server, &tool, arguments, self.tool_timeout).await {
                    Ok(outcome) => (outcome.text, outcome.is_error),
                    Err(error) => (format!("error: {error}"), true),
                }
            }
            Err(refused) => (refused, true),
        };
        self.record(LoopChange::Returned {
            turn: t,
            call: c,
            result: result.clone(),
            is_error,
            at: unix_ms(),
        })
        .await?;
        Ok(result)
    }

    /// Sends `change` to the run's task and waits until it is written.
    async fn record(&self, change: LoopChange) -> Result<(), CallError> {
        let (ack, written) = oneshot::channel();
        let stopped = || CallError::Engine(format!("{} stopped while its agent loop ran", self.attempt));
        self.changes
            .send((self.attempt.clone(), change, ack))
            .await
            .map_err(|_| stopped())?;
        match written.await {
            Ok(true) => Ok(()),
            Ok(false) | Err(_) => Err(stopped()),
        }
    }
}

/// What sending a call takes.
struct Request {
    server: String,
    tool: String,
    arguments: Map<String, Value>,
}

/// What sending `call` takes; or, for a call the loop cannot make (an unknown tool,
/// arguments that are not a JSON object), the error text the model reads instead.
fn request_of(call: &ToolCall) -> Result<Request, String> {
    let (Some(server), Some(tool)) = (&call.server, &call.tool) else {
        return Err(format!(
            "error: there is no tool `{}`; the tools are listed in `tools`",
            call.name
        ));
    };
    match serde_json::from_str::<Value>(&call.arguments) {
        Ok(Value::Object(arguments)) => Ok(Request {
            server: server.clone(),
            tool: tool.clone(),
            arguments,
        }),
        Ok(_) | Err(_) => Err(format!(
            "error: the arguments of `{}` must be a JSON object, got: {}",
            call.name,
            call.arguments.chars().take(200).collect::<String>()
        )),
    }
}

/// Appends `message` to the conversation of `body` (whose `messages` is an array).
fn push(body: &mut Value, message: Value) {
    if let Some(messages) = body["messages"].as_array_mut() {
        messages.push(message);
    }
}

/// The assistant message of a recorded turn, as OpenAI's chat format writes it.
fn assistant_message(turn: &Turn) -> Value {
    let calls: Vec<Value> = turn
        .calls
        .iter()
        .map(|c| json!({"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}))
        .collect();
    json!({"role": "assistant", "content": turn.content, "tool_calls": calls})
}

/// The message that feeds a call's result back.
fn tool_message(id: &str, result: &str) -> Value {
    json!({"role": "tool", "tool_call_id": id, "content": result})
}
