//! A session as it is stored: who owns it, which agent it talks to, the model instance it
//! is bound to, and its messages. Pure: values and the rules that check them.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use skein_dsl::ir::Agent;

use crate::base::UnixMs;
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
}

impl Role {
    /// The OpenAI name.
    pub fn name(self) -> &'static str {
        match self {
            Role::System => "system",
            Role::User => "user",
            Role::Assistant => "assistant",
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
}

impl NewMessage {
    /// A message of `role` with `content`.
    pub fn new(role: Role, content: impl Into<String>) -> NewMessage {
        NewMessage {
            role,
            content: content.into(),
            instance: None,
            usage: None,
        }
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

/// Checks messages before they are appended.
pub fn check_messages(messages: &[NewMessage]) -> Result<(), Invalid> {
    for (index, message) in messages.iter().enumerate() {
        let reason = if message.content.len() > MAX_MESSAGE_BYTES {
            format!(
                "is {} bytes; at most {MAX_MESSAGE_BYTES} are accepted in one message",
                message.content.len()
            )
        } else if message.content.is_empty() && message.role != Role::Assistant {
            "is empty".to_owned()
        } else {
            continue;
        };
        return Err(Invalid::Message { index, reason });
    }
    Ok(())
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
        }
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
}
