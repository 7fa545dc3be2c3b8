//! A session as it is stored: who owns it, which agent it talks to, the model instance it
//! is bound to, and its messages. Pure: values and the rules that check them.
//!
//! Messages carry tool calls as OpenAI's chat does: an assistant message may hold the
//! calls its model asked for ([`RequestedCall`]: id, function name, arguments as the JSON
//! text the model wrote), and a `tool` message the result of one, naming its call
//! (`tool_call_id`). Both fields default to none, so messages stored before sessions
//! carried tools read as they were. [`check_turn`] checks a turn's messages against the
//! history they join; [`openai_history`] is the history as an engine takes it.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use skein_dsl::ir::Agent;

use crate::base::UnixMs;
pub use crate::engine_client::RequestedCall;
use crate::engine_client::Usage;

/// The largest message content accepted (bytes): a long conversation is many messages,
/// not one huge one.
pub const MAX_MESSAGE_BYTES: usize = 4 << 20;

/// Metadata entries a session may carry, and their sizes.
pub const MAX_METADATA_ENTRIES: usize = 64;
/// The longest metadata key or value (bytes).
pub const MAX_METADATA_BYTES: usize = 1024;

/// A conversation of one user with one agent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct SessionRecord {
    /// `s…`, ordered by creation time.
    pub id: String,
    /// The user it belongs to.
    pub owner: String,
    /// The agent's name: a workflow agent, or the model's repository for a session on
    /// a model of its own.
    pub agent: String,
    /// The run whose agent this is, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run: Option<String>,
    /// How the agent is served (model requirement or endpoint, system prompt, sampling):
    /// enough to place it again anywhere.
    #[schema(value_type = Object)]
    pub definition: Agent,
    /// The model instance serving it now (none until the first message places one, or
    /// for a remote endpoint).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub binding: Option<Binding>,
    /// Free-form labels set by the client.
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
    /// When it was created.
    pub created_at: UnixMs,
    /// When a message was last added, or the binding last changed.
    pub updated_at: UnixMs,
    /// How many messages it holds; the next one gets this sequence number.
    pub messages: u64,
    /// How many times it moved to another instance.
    #[serde(default)]
    pub migrations: u64,
}

/// The model instance a session is served by.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Binding {
    /// The instance's name.
    pub instance: String,
    /// Its node.
    pub node: String,
    /// Its GPUs on that node (empty: the CPU).
    #[serde(default)]
    pub gpus: Vec<u32>,
    /// Since when.
    pub since: UnixMs,
}

/// Who wrote a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Instructions for the model.
    System,
    /// The user.
    User,
    /// The agent's model.
    Assistant,
    /// The result of a tool call an assistant message asked for.
    Tool,
}

impl Role {
    /// The OpenAI name.
    pub fn name(self) -> &'static str {
        match self {
            Role::System => "system",
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::Tool => "tool",
        }
    }
}

/// A message to append.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NewMessage {
    /// Who wrote it.
    pub role: Role,
    /// The text.
    pub content: String,
    /// The instance that produced it (assistant messages).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance: Option<String>,
    /// The engine's token counts (assistant messages).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    /// The tools the model asked to call (assistant messages), in its order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<RequestedCall>,
    /// The call whose result this is (`tool` messages).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
}

impl NewMessage {
    /// A message of `role` with `content`.
    pub fn new(role: Role, content: impl Into<String>) -> NewMessage {
        NewMessage {
            role,
            content: content.into(),
            instance: None,
            usage: None,
            tool_calls: Vec::new(),
            tool_call_id: None,
        }
    }

    /// An assistant message with `content` (may be empty) that calls `calls`.
    pub fn calling(content: impl Into<String>, calls: Vec<RequestedCall>) -> NewMessage {
        NewMessage {
            tool_calls: calls,
            ..NewMessage::new(Role::Assistant, content)
        }
    }

    /// The result `content` of the tool call `id`.
    pub fn tool_result(id: impl Into<String>, content: impl Into<String>) -> NewMessage {
        NewMessage {
            tool_call_id: Some(id.into()),
            ..NewMessage::new(Role::Tool, content)
        }
    }

    /// The bytes of its text: the content, the calls' ids, names and arguments, the id
    /// of the call it answers.
    pub fn text_bytes(&self) -> usize {
        text_bytes(&self.content, &self.tool_calls, self.tool_call_id.as_deref())
    }

    /// The message in OpenAI's form, as an engine takes it.
    pub fn openai(&self) -> Value {
        openai_message(self.role, &self.content, &self.tool_calls, self.tool_call_id.as_deref())
    }
}

/// A stored message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct MessageRecord {
    /// Its place in the session, from 0.
    pub seq: u64,
    /// Who wrote it.
    pub role: Role,
    /// The text.
    pub content: String,
    /// When it was stored.
    pub created_at: UnixMs,
    /// The idempotency key of the request that appended it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<String>,
    /// The instance that produced it (assistant messages).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance: Option<String>,
    /// The engine's token counts (assistant messages).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    /// The tools the model asked to call (assistant messages), in its order: each with
    /// its `id`, the function's `name` and its `arguments` (JSON text as the model wrote
    /// it).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<RequestedCall>,
    /// The call whose result this is (`tool` messages).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
}

/// The bytes of a message's text (see [`NewMessage::text_bytes`]).
fn text_bytes(content: &str, calls: &[RequestedCall], answers: Option<&str>) -> usize {
    calls.iter().fold(
        content.len().saturating_add(answers.map_or(0, str::len)),
        |sum, call| {
            sum.saturating_add(call.id.len())
                .saturating_add(call.name.len())
                .saturating_add(call.arguments.len())
        },
    )
}

/// A message in OpenAI's form: an assistant message that calls tools has them in
/// `tool_calls` (and `content` null when it has no text), a `tool` message names its
/// call in `tool_call_id`.
fn openai_message(role: Role, content: &str, calls: &[RequestedCall], answers: Option<&str>) -> Value {
    let mut message = json!({"role": role.name(), "content": content});
    if !calls.is_empty() {
        if content.is_empty() {
            message["content"] = Value::Null;
        }
        message["tool_calls"] = calls
            .iter()
            .map(|c| json!({"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}))
            .collect();
    }
    if let Some(id) = answers {
        message["tool_call_id"] = json!(id);
    }
    message
}

/// Why a value cannot be stored.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Invalid {
    /// An empty or oversized message.
    #[error("message {index}: {reason}")]
    Message {
        /// Its index in the request.
        index: usize,
        /// What is wrong.
        reason: String,
    },
    /// A bad idempotency key.
    #[error("the idempotency key {0}")]
    IdempotencyKey(&'static str),
    /// Bad metadata.
    #[error("metadata: {0}")]
    Metadata(String),
}

/// Checks messages before they are appended, each on its own: its size, that only
/// assistant messages may be empty, that only assistant messages call tools (each call
/// with an id and a name) and that a `tool` message, and only it, names the call it
/// answers. What they answer is [`check_turn`]'s.
pub fn check_messages(messages: &[NewMessage]) -> Result<(), Invalid> {
    for (index, message) in messages.iter().enumerate() {
        let role = message.role.name();
        let bytes = message.text_bytes();
        let reason = if bytes > MAX_MESSAGE_BYTES {
            format!("is {bytes} bytes; at most {MAX_MESSAGE_BYTES} are accepted in one message")
        } else if message.content.is_empty() && !matches!(message.role, Role::Assistant | Role::Tool) {
            "is empty".to_owned()
        } else if !message.tool_calls.is_empty() && message.role != Role::Assistant {
            format!("has role `{role}` and `tool_calls`; only an assistant message calls tools")
        } else if let Some(c) = message
            .tool_calls
            .iter()
            .position(|c| c.id.is_empty() || c.name.is_empty())
        {
            format!("tool call {c} needs an `id` and a function `name`")
        } else if message.role == Role::Tool && message.tool_call_id.as_deref().is_none_or(str::is_empty) {
            "has role `tool` but no `tool_call_id`; give the id of the tool call whose result it is".to_owned()
        } else if message.role != Role::Tool && message.tool_call_id.is_some() {
            format!("has role `{role}` and a `tool_call_id`; only a `tool` message answers a tool call")
        } else {
            continue;
        };
        return Err(Invalid::Message { index, reason });
    }
    Ok(())
}

/// Whether `message` repeats `reply` (a client sending back the session's last reply,
/// as an OpenAI client's tool loop does with the model's message that called tools).
fn repeats(message: &NewMessage, reply: &MessageRecord) -> bool {
    message.role == Role::Assistant && message.content == reply.content && message.tool_calls == reply.tool_calls
}

/// A turn's messages checked against `history` (the session's recent messages, oldest
/// first), as they are appended: an assistant message that repeats the session's last
/// reply is left out (it is stored already); any other assistant message must call
/// tools (a session's assistant text is its agent's); a `tool` message must answer a
/// call made by an assistant message of `history` or of the turn before it.
/// [`check_messages`] has checked each message on its own.
pub fn check_turn(history: &[MessageRecord], messages: Vec<NewMessage>) -> Result<Vec<NewMessage>, Invalid> {
    let last_reply = history.iter().rev().find(|m| m.role == Role::Assistant);
    let calls: BTreeSet<&str> = history
        .iter()
        .flat_map(|m| m.tool_calls.iter().map(|c| c.id.as_str()))
        .collect();
    // The turn's own calls, owned: the messages move into the answer.
    let mut called: BTreeSet<String> = BTreeSet::new();
    let mut kept = Vec::with_capacity(messages.len());
    for (index, message) in messages.into_iter().enumerate() {
        match message.role {
            Role::Assistant if last_reply.is_some_and(|reply| repeats(&message, reply)) => continue,
            Role::Assistant if message.tool_calls.is_empty() => {
                return Err(Invalid::Message {
                    index,
                    reason: "has role `assistant` and no `tool_calls`; a session's assistant messages are its \
                             agent's replies. help: send only the new messages (user messages, tool results), \
                             or the session's last reply as it was answered"
                        .to_owned(),
                });
            }
            Role::Assistant => called.extend(message.tool_calls.iter().map(|c| c.id.clone())),
            Role::Tool => {
                let id = message.tool_call_id.as_deref().unwrap_or_default();
                if !calls.contains(id) && !called.contains(id) {
                    return Err(Invalid::Message {
                        index,
                        reason: format!(
                            "answers tool call `{id}`, which no assistant message of the session's recent history \
                             or of this request before it made. help: give the `tool_call_id` of a call of the \
                             session's last reply (GET /v1/sessions/ID/messages lists them), or send the assistant \
                             message that made the call before its result"
                        ),
                    });
                }
            }
            Role::System | Role::User => {}
        }
        kept.push(message);
    }
    if kept.is_empty() {
        return Err(Invalid::Message {
            index: 0,
            reason: "repeats the session's last reply, and nothing new comes after it. help: send the new \
                     messages (tool results, a user message)"
                .to_owned(),
        });
    }
    Ok(kept)
}

/// `history` in OpenAI's form, as an engine takes it, well formed even when the
/// history budget cut it or a client left a call unanswered: a `tool` message whose
/// call is not among the messages before it is left out (its call fell out of the
/// budget), and so is a call that no `tool` message after it answers (an assistant
/// message left with neither text nor calls goes too). Engines refuse either.
pub fn openai_history(history: &[MessageRecord]) -> Vec<Value> {
    let answered: BTreeSet<&str> = history.iter().filter_map(|m| m.tool_call_id.as_deref()).collect();
    let mut made: BTreeSet<&str> = BTreeSet::new();
    let mut sent = Vec::with_capacity(history.len());
    for message in history {
        match message.role {
            Role::Tool => {
                if message.tool_call_id.as_deref().is_some_and(|id| made.contains(id)) {
                    sent.push(message.openai());
                }
            }
            Role::Assistant if !message.tool_calls.is_empty() => {
                let kept = message.tool_calls.iter().filter(|c| answered.contains(c.id.as_str()));
                made.extend(kept.clone().map(|c| c.id.as_str()));
                let calls: Vec<RequestedCall> = kept.cloned().collect();
                if calls.is_empty() && message.content.is_empty() {
                    continue;
                }
                sent.push(openai_message(Role::Assistant, &message.content, &calls, None));
            }
            _ => sent.push(message.openai()),
        }
    }
    sent
}

/// Checks an idempotency key: 1 to 256 bytes of printable ASCII
/// ([`crate::idempotency::check_key`]).
pub fn check_idempotency_key(key: &str) -> Result<(), Invalid> {
    crate::idempotency::check_key(key).map_err(Invalid::IdempotencyKey)
}

/// Checks a session's metadata.
pub fn check_metadata(metadata: &BTreeMap<String, String>) -> Result<(), Invalid> {
    if metadata.len() > MAX_METADATA_ENTRIES {
        return Err(Invalid::Metadata(format!(
            "{} entries; at most {MAX_METADATA_ENTRIES}",
            metadata.len()
        )));
    }
    for (key, value) in metadata {
        if key.is_empty() || key.len() > MAX_METADATA_BYTES || value.len() > MAX_METADATA_BYTES {
            return Err(Invalid::Metadata(format!(
                "key `{}` or its value is empty or longer than {MAX_METADATA_BYTES} bytes",
                key.chars().take(40).collect::<String>()
            )));
        }
    }
    Ok(())
}

impl MessageRecord {
    /// The stored form of `message`, `seq`-th of its session.
    pub fn new(seq: u64, message: NewMessage, idempotency_key: Option<String>, now: UnixMs) -> MessageRecord {
        MessageRecord {
            seq,
            role: message.role,
            content: message.content,
            created_at: now,
            idempotency_key,
            instance: message.instance,
            usage: message.usage,
            tool_calls: message.tool_calls,
            tool_call_id: message.tool_call_id,
        }
    }

    /// The bytes of its text (see [`NewMessage::text_bytes`]).
    pub fn text_bytes(&self) -> usize {
        text_bytes(&self.content, &self.tool_calls, self.tool_call_id.as_deref())
    }

    /// The message in OpenAI's form, as an engine takes it.
    pub fn openai(&self) -> Value {
        openai_message(self.role, &self.content, &self.tool_calls, self.tool_call_id.as_deref())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_keys_and_metadata_are_checked() {
        assert!(check_messages(&[NewMessage::new(Role::User, "hi")]).is_ok());
        let error = check_messages(&[NewMessage::new(Role::User, "hi"), NewMessage::new(Role::User, "")]);
        assert_eq!(error.unwrap_err().to_string(), "message 1: is empty");
        assert!(check_idempotency_key("7f0c-11").is_ok());
        assert!(check_idempotency_key("").is_err());
        assert!(check_idempotency_key("a b").is_err());
        assert!(check_idempotency_key(&"k".repeat(257)).is_err());
        let mut metadata = BTreeMap::new();
        metadata.insert("topic".to_owned(), "proofs".to_owned());
        assert!(check_metadata(&metadata).is_ok());
        metadata.insert(String::new(), "x".to_owned());
        assert!(check_metadata(&metadata).is_err());
    }

    fn call(id: &str) -> RequestedCall {
        RequestedCall {
            id: id.to_owned(),
            name: "weather".to_owned(),
            arguments: r#"{"text":"Paris"}"#.to_owned(),
        }
    }

    /// `messages` stored as a session's history, from seq 0.
    fn stored(messages: Vec<NewMessage>) -> Vec<MessageRecord> {
        messages
            .into_iter()
            .enumerate()
            .map(|(seq, m)| MessageRecord::new(seq as u64, m, None, UnixMs(0)))
            .collect()
    }

    #[test]
    fn tool_fields_are_checked_message_by_message() {
        let error = |message: NewMessage| check_messages(&[message]).unwrap_err().to_string();
        assert!(
            check_messages(&[
                NewMessage::calling("", vec![call("c1")]),
                NewMessage::tool_result("c1", "")
            ])
            .is_ok()
        );
        let no_id = NewMessage {
            tool_call_id: None,
            ..NewMessage::tool_result("c1", "sunny")
        };
        assert!(error(no_id).contains("no `tool_call_id`"));
        let user_calls = NewMessage {
            tool_calls: vec![call("c1")],
            ..NewMessage::new(Role::User, "hi")
        };
        assert!(error(user_calls).contains("only an assistant message calls tools"));
        let user_answers = NewMessage {
            tool_call_id: Some("c1".to_owned()),
            ..NewMessage::new(Role::User, "hi")
        };
        assert!(error(user_answers).contains("only a `tool` message answers"));
        let nameless = NewMessage::calling(
            "",
            vec![RequestedCall {
                name: String::new(),
                ..call("c1")
            }],
        );
        assert_eq!(
            error(nameless),
            "message 0: tool call 0 needs an `id` and a function `name`"
        );
        // A call's arguments count toward the size of its message.
        let huge = NewMessage::calling(
            "",
            vec![RequestedCall {
                arguments: "x".repeat(MAX_MESSAGE_BYTES),
                ..call("c1")
            }],
        );
        assert!(error(huge).contains("at most"));
    }

    #[test]
    fn a_turn_answers_calls_of_its_history_or_of_itself() {
        let history = stored(vec![
            NewMessage::new(Role::User, "Paris?"),
            NewMessage::calling("", vec![call("c1"), call("c2")]),
        ]);
        // Results of the session's calls; the last reply sent back is not stored twice.
        let kept = check_turn(
            &history,
            vec![
                NewMessage::calling("", vec![call("c1"), call("c2")]),
                NewMessage::tool_result("c1", "sunny"),
                NewMessage::tool_result("c2", "warm"),
            ],
        )
        .unwrap();
        assert_eq!(
            kept.iter().map(|m| m.role).collect::<Vec<_>>(),
            [Role::Tool, Role::Tool]
        );
        // A call made in the request, then its result.
        let own = vec![
            NewMessage::calling("looking", vec![call("c9")]),
            NewMessage::tool_result("c9", "rain"),
        ];
        assert_eq!(check_turn(&history, own.clone()).unwrap(), own);
        // A result of no call: the id named, and what to do.
        let error = check_turn(&history, vec![NewMessage::tool_result("c7", "x")])
            .unwrap_err()
            .to_string();
        assert!(error.starts_with("message 0: answers tool call `c7`"), "{error}");
        assert!(error.contains("help:"), "{error}");
        // A result before the call it answers is no answer.
        let early = vec![
            NewMessage::tool_result("c9", "rain"),
            NewMessage::calling("", vec![call("c9")]),
        ];
        assert!(check_turn(&history, early).is_err());
        // An assistant message of text only is the agent's to write.
        let error = check_turn(&history, vec![NewMessage::new(Role::Assistant, "I said")])
            .unwrap_err()
            .to_string();
        assert!(error.contains("no `tool_calls`"), "{error}");
        // The last reply alone: nothing new.
        let error = check_turn(&history, vec![NewMessage::calling("", vec![call("c1"), call("c2")])])
            .unwrap_err()
            .to_string();
        assert!(error.contains("nothing new"), "{error}");
        // Text-only turns pass as they are.
        let plain = vec![NewMessage::new(Role::User, "thanks")];
        assert_eq!(check_turn(&[], plain.clone()).unwrap(), plain);
    }

    #[test]
    fn the_history_goes_to_the_engine_in_openai_form_and_well_formed() {
        let history = stored(vec![
            // Its call fell out of the history budget: left out.
            NewMessage::tool_result("c0", "old"),
            NewMessage::new(Role::User, "Paris?"),
            NewMessage::calling("", vec![call("c1"), call("c2")]),
            NewMessage::tool_result("c1", "sunny"),
            // Never answered: c3 goes, and the message with it (no text).
            NewMessage::calling("", vec![call("c3")]),
            NewMessage::new(Role::User, "and Rome?"),
        ]);
        assert_eq!(
            openai_history(&history),
            [
                json!({"role": "user", "content": "Paris?"}),
                json!({"role": "assistant", "content": null, "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "weather", "arguments": r#"{"text":"Paris"}"#}}]}),
                json!({"role": "tool", "content": "sunny", "tool_call_id": "c1"}),
                json!({"role": "user", "content": "and Rome?"}),
            ]
        );
        // An assistant message with text keeps it when its calls go.
        let history = stored(vec![NewMessage::calling("let me look", vec![call("c3")])]);
        assert_eq!(
            openai_history(&history),
            [json!({"role": "assistant", "content": "let me look"})]
        );
    }

    #[test]
    fn messages_stored_before_tool_calls_read_as_they_were() {
        // A message as sessions stored it when they held text only.
        let old = r#"{"seq": 3, "role": "assistant", "content": "echo: hi", "created_at": "2023-11-14T22:13:20Z",
                      "idempotency_key": "k1", "instance": "i1", "usage": {"prompt_tokens": 3, "completion_tokens": 5}}"#;
        let message: MessageRecord = serde_json::from_str(old).unwrap();
        assert_eq!(message.content, "echo: hi");
        assert!(message.tool_calls.is_empty());
        assert_eq!(message.tool_call_id, None);
        assert_eq!(message.openai(), json!({"role": "assistant", "content": "echo: hi"}));
        // And it is written back without the fields it does not use.
        let written = serde_json::to_value(&message).unwrap();
        assert!(written.get("tool_calls").is_none() && written.get("tool_call_id").is_none());
    }
}
