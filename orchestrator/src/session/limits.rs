//! What one user may ask of the chat routes at once (`POST /v1/chat/completions`,
//! `POST /v1/sessions/{id}/messages`), so that no request and no user can take the
//! server's memory.
//!
//! - A request's **size**: how many messages it carries and how many bytes of text
//!   (every string of the body: message contents, names, tool fields, keys). The raw
//!   body is measured by [`measure`] before anything is built from it: the measure
//!   walks the JSON without allocating per string or per message, so a body of
//!   300,000 tiny messages costs nothing but its own bytes before it is refused.
//! - A user's **concurrency**: chat requests in flight, and streams (server-sent
//!   events) open, counted per user by [`Admission`]; a permit is taken before the body
//!   is read and given back when the request ends or the stream closes.
//!
//! Pure apart from the counters' lock: values in, values out.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};

use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};

use super::record::NewMessage;
use crate::base::lock;

/// The most messages one request may carry. OpenAI's own API takes at most 2048, so a
/// client written for it never meets this limit; a longer conversation belongs in a
/// session, which keeps its history on the server and sends the model what fits.
pub const MAX_REQUEST_MESSAGES: usize = 2048;

/// The most bytes of text one request may carry (every string of the body). 4 MiB is
/// about a million tokens, more than any served model's context, and equals the
/// largest single message a session stores ([`super::record::MAX_MESSAGE_BYTES`]).
pub const MAX_REQUEST_TEXT_BYTES: usize = 4 << 20;

/// Chat requests one user may have in flight at once. Each holds at most one body
/// (about [`ChatLimits::body_bytes`]) and one engine request; 16 lets an agent
/// framework fan out while one user's memory stays under ~200 MiB.
pub const MAX_REQUESTS_PER_USER: usize = 16;

/// Streams (server-sent events) one user may have open at once: a stream holds an
/// engine slot and a connection for as long as the reply takes.
pub const MAX_STREAMS_PER_USER: usize = 8;

/// Seconds a refused client is asked to wait (`Retry-After`): requests of one user
/// usually end within seconds.
pub const BUSY_RETRY_AFTER_S: u64 = 2;

/// Bytes a body may spend on JSON per message beyond its text (braces, quotes, `role`,
/// commas, white space).
const BODY_BYTES_PER_MESSAGE: usize = 64;

/// Escaped text may take three times its bytes on the wire: `\uXXXX` spends 6 bytes on
/// 2 of UTF-8, 12 on an emoji's 4 (Python's `json.dumps` escapes all non-ASCII).
const BODY_BYTES_PER_TEXT_BYTE: usize = 3;

/// Bytes of a body beyond its messages (the model, sampling fields).
const BODY_SLACK_BYTES: usize = 64 << 10;

/// The limits of the chat routes. [`Default`] gives the constants of this module.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChatLimits {
    /// The most messages in one request.
    pub max_messages: usize,
    /// The most bytes of text in one request.
    pub max_text_bytes: usize,
    /// The most chat requests one user may have in flight.
    pub max_requests_per_user: usize,
    /// The most streams one user may have open.
    pub max_streams_per_user: usize,
}

impl Default for ChatLimits {
    fn default() -> Self {
        ChatLimits {
            max_messages: MAX_REQUEST_MESSAGES,
            max_text_bytes: MAX_REQUEST_TEXT_BYTES,
            max_requests_per_user: MAX_REQUESTS_PER_USER,
            max_streams_per_user: MAX_STREAMS_PER_USER,
        }
    }
}

/// A request over the limits, or a user at their limit of requests or streams.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LimitError {
    /// The request is too large (HTTP 413).
    #[error("{0}")]
    TooLarge(String),
    /// The user has as many requests or streams as allowed (HTTP 429).
    #[error("{0}")]
    Busy(String),
}

/// What a chat request carries: counted by [`measure`] on the raw body, or from parsed
/// messages by [`RequestSize::of_messages`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RequestSize {
    /// Messages: the elements of the top-level `messages`, and one for a top-level
    /// `content` (a session turn's shorthand for a user message).
    pub messages: usize,
    /// Bytes of every string of the body, keys included.
    pub text_bytes: usize,
}

impl RequestSize {
    /// The size of messages already parsed (their text, tool calls included).
    pub fn of_messages(messages: &[NewMessage]) -> RequestSize {
        RequestSize {
            messages: messages.len(),
            text_bytes: messages.iter().fold(0, |sum, m| sum.saturating_add(m.text_bytes())),
        }
    }
}

impl ChatLimits {
    /// The largest body a request within these limits needs: its text escaped at worst
    /// as common clients escape it, the JSON around each message, and some slack.
    pub fn body_bytes(&self) -> usize {
        self.max_text_bytes
            .saturating_mul(BODY_BYTES_PER_TEXT_BYTE)
            .saturating_add(self.max_messages.saturating_mul(BODY_BYTES_PER_MESSAGE))
            .saturating_add(BODY_SLACK_BYTES)
    }

    /// Checks a request's size.
    ///
    /// Errors: [`LimitError::TooLarge`] naming the limit, the size and what to do.
    pub fn check(&self, size: RequestSize) -> Result<(), LimitError> {
        if size.messages > self.max_messages {
            return Err(LimitError::TooLarge(format!(
                "the request has {} messages; at most {} are taken in one request. help: send only the recent \
                 messages, or use a session (POST /v1/sessions), which keeps the history on the server",
                size.messages, self.max_messages
            )));
        }
        if size.text_bytes > self.max_text_bytes {
            return Err(LimitError::TooLarge(format!(
                "the request carries {} bytes of text (message contents, names and other fields); at most {} \
                 ({}) are taken in one request. help: send less history, or split the text over several turns \
                 of a session",
                size.text_bytes,
                self.max_text_bytes,
                mib(self.max_text_bytes)
            )));
        }
        Ok(())
    }

    /// The answer to a body longer than [`ChatLimits::body_bytes`] (or the server's
    /// body limit, `limit`).
    pub fn body_too_large(&self, limit: usize) -> LimitError {
        LimitError::TooLarge(format!(
            "the body is longer than {limit} bytes ({}), the most a chat request within the limits needs \
             (at most {} messages and {} of text). help: send less history, or use a session",
            mib(limit),
            self.max_messages,
            mib(self.max_text_bytes)
        ))
    }

    /// Measures `body` and checks it.
    ///
    /// Errors: [`LimitError::TooLarge`]; a body that is not JSON passes (its parse says
    /// what is wrong with it).
    pub fn check_body(&self, body: &[u8]) -> Result<(), LimitError> {
        match measure(body) {
            Ok(size) => self.check(size),
            Err(_) => Ok(()),
        }
    }
}

fn mib(bytes: usize) -> String {
    if bytes.is_multiple_of(1 << 20) {
        format!("{} MiB", bytes >> 20)
    } else {
        format!("{:.1} MiB", bytes as f64 / f64::from(1u32 << 20))
    }
}

/// Counts the messages and text bytes of a JSON request body without building it: no
/// allocation per string, message or value (serde_json hands unescaped strings over
/// borrowed, escaped ones in one reused buffer). Nesting is bounded by serde_json's
/// recursion limit.
///
/// Errors: the body is not a JSON object.
pub fn measure(body: &[u8]) -> Result<RequestSize, serde_json::Error> {
    let mut deserializer = serde_json::Deserializer::from_slice(body);
    let size = (&mut deserializer).deserialize_map(TopLevel)?;
    deserializer.end()?;
    Ok(size)
}

/// The top-level object of a request.
struct TopLevel;

impl<'de> Visitor<'de> for TopLevel {
    type Value = RequestSize;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<RequestSize, A::Error> {
        let mut size = RequestSize::default();
        while let Some(key) = map.next_key::<Key>()? {
            size.text_bytes = size.text_bytes.saturating_add(key.bytes);
            match key.field {
                Field::Messages => {
                    let messages = map.next_value::<Messages>()?;
                    size.messages = size.messages.saturating_add(messages.count);
                    size.text_bytes = size.text_bytes.saturating_add(messages.text_bytes);
                }
                Field::Content => {
                    size.messages = size.messages.saturating_add(1);
                    size.text_bytes = size.text_bytes.saturating_add(map.next_value::<TextBytes>()?.0);
                }
                Field::Other => {
                    size.text_bytes = size.text_bytes.saturating_add(map.next_value::<TextBytes>()?.0);
                }
            }
        }
        Ok(size)
    }
}

enum Field {
    Messages,
    Content,
    Other,
}

/// A top-level key: which field, and its length.
struct Key {
    field: Field,
    bytes: usize,
}

impl<'de> de::Deserialize<'de> for Key {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Key, D::Error> {
        struct KeyVisitor;
        impl Visitor<'_> for KeyVisitor {
            type Value = Key;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a key")
            }
            fn visit_str<E: de::Error>(self, key: &str) -> Result<Key, E> {
                let field = match key {
                    "messages" => Field::Messages,
                    "content" => Field::Content,
                    _ => Field::Other,
                };
                Ok(Key {
                    field,
                    bytes: key.len(),
                })
            }
        }
        deserializer.deserialize_str(KeyVisitor)
    }
}

/// The `messages` array: how many, and their text. Anything else counts as text only.
#[derive(Default)]
struct Messages {
    count: usize,
    text_bytes: usize,
}

impl<'de> de::Deserialize<'de> for Messages {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Messages, D::Error> {
        struct MessagesVisitor;
        impl<'de> Visitor<'de> for MessagesVisitor {
            type Value = Messages;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a list of messages")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Messages, A::Error> {
                let mut messages = Messages::default();
                while let Some(TextBytes(bytes)) = seq.next_element()? {
                    messages.count = messages.count.saturating_add(1);
                    messages.text_bytes = messages.text_bytes.saturating_add(bytes);
                }
                Ok(messages)
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Messages, A::Error> {
                let TextBytes(text_bytes) = TextVisitor.visit_map(map)?;
                Ok(Messages { count: 0, text_bytes })
            }
            fn visit_str<E: de::Error>(self, text: &str) -> Result<Messages, E> {
                Ok(Messages {
                    count: 0,
                    text_bytes: text.len(),
                })
            }
            fn visit_bool<E: de::Error>(self, _: bool) -> Result<Messages, E> {
                Ok(Messages::default())
            }
            fn visit_i64<E: de::Error>(self, _: i64) -> Result<Messages, E> {
                Ok(Messages::default())
            }
            fn visit_u64<E: de::Error>(self, _: u64) -> Result<Messages, E> {
                Ok(Messages::default())
            }
            fn visit_f64<E: de::Error>(self, _: f64) -> Result<Messages, E> {
                Ok(Messages::default())
            }
            fn visit_unit<E: de::Error>(self) -> Result<Messages, E> {
                Ok(Messages::default())
            }
        }
        deserializer.deserialize_any(MessagesVisitor)
    }
}

/// The bytes of every string (keys included) in a JSON value.
struct TextBytes(usize);

impl<'de> de::Deserialize<'de> for TextBytes {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<TextBytes, D::Error> {
        deserializer.deserialize_any(TextVisitor)
    }
}

struct TextVisitor;

impl<'de> Visitor<'de> for TextVisitor {
    type Value = TextBytes;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_str<E: de::Error>(self, text: &str) -> Result<TextBytes, E> {
        Ok(TextBytes(text.len()))
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<TextBytes, E> {
        Ok(TextBytes(0))
    }

    fn visit_i64<E: de::Error>(self, _: i64) -> Result<TextBytes, E> {
        Ok(TextBytes(0))
    }

    fn visit_u64<E: de::Error>(self, _: u64) -> Result<TextBytes, E> {
        Ok(TextBytes(0))
    }

    fn visit_f64<E: de::Error>(self, _: f64) -> Result<TextBytes, E> {
        Ok(TextBytes(0))
    }

    fn visit_unit<E: de::Error>(self) -> Result<TextBytes, E> {
        Ok(TextBytes(0))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<TextBytes, A::Error> {
        let mut bytes = 0usize;
        while let Some(TextBytes(more)) = seq.next_element()? {
            bytes = bytes.saturating_add(more);
        }
        Ok(TextBytes(bytes))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<TextBytes, A::Error> {
        let mut bytes = 0usize;
        while let Some(TextBytes(key)) = map.next_key()? {
            let TextBytes(value) = map.next_value()?;
            bytes = bytes.saturating_add(key).saturating_add(value);
        }
        Ok(TextBytes(bytes))
    }
}

/// What a permit counts against its user.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flight {
    /// A chat request, from before its body is read to its reply (stored, for a session).
    Request,
    /// A stream of server-sent events, until it ends or its client goes away.
    Stream,
}

#[derive(Debug, Default, Clone, Copy)]
struct InFlight {
    requests: usize,
    streams: usize,
}

impl InFlight {
    fn slot(&mut self, flight: Flight) -> &mut usize {
        match flight {
            Flight::Request => &mut self.requests,
            Flight::Stream => &mut self.streams,
        }
    }
}

/// The requests and streams each user has in flight. Cheap to clone (shared counts).
#[derive(Debug, Clone, Default)]
pub struct Admission {
    users: Arc<Mutex<HashMap<String, InFlight>>>,
}

impl Admission {
    /// Counts one more `flight` of `user` if they have fewer than `limit`; the permit
    /// gives it back when dropped.
    ///
    /// Errors: [`LimitError::Busy`] naming the limit and the user's use.
    pub fn admit(&self, user: &str, flight: Flight, limit: usize) -> Result<Permit, LimitError> {
        let mut users = lock(&self.users);
        let counts = users.entry(user.to_owned()).or_default();
        let slot = counts.slot(flight);
        if *slot >= limit {
            let what = match flight {
                Flight::Request => "chat requests in flight",
                Flight::Stream => "streams open",
            };
            return Err(LimitError::Busy(format!(
                "you have {} {what}, the most one user may have at once is {limit}; retry when one has ended \
                 (see Retry-After)",
                *slot
            )));
        }
        *slot += 1;
        Ok(Permit {
            users: Arc::clone(&self.users),
            user: user.to_owned(),
            flight,
        })
    }

    /// How many `flight`s `user` has now.
    pub fn in_flight(&self, user: &str, flight: Flight) -> usize {
        lock(&self.users).get(user).map_or(0, |c| match flight {
            Flight::Request => c.requests,
            Flight::Stream => c.streams,
        })
    }
}

/// One request or stream of a user, counted until dropped.
#[derive(Debug)]
pub struct Permit {
    users: Arc<Mutex<HashMap<String, InFlight>>>,
    user: String,
    flight: Flight,
}

impl Drop for Permit {
    fn drop(&mut self) {
        let mut users = lock(&self.users);
        if let Some(counts) = users.get_mut(&self.user) {
            let slot = counts.slot(self.flight);
            *slot = slot.saturating_sub(1);
            if counts.requests == 0 && counts.streams == 0 {
                users.remove(&self.user);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::session::record::Role;

    fn check(body: &str, messages: usize, text_bytes: usize) {
        assert_eq!(
            measure(body.as_bytes()).unwrap(),
            RequestSize { messages, text_bytes },
            "{body}"
        );
    }

    #[test]
    fn measure_counts_messages_and_every_string() {
        // keys: model(5) messages(8) role(4) content(7); values: m(1) user(4) hi(2)
        check(
            r#"{"model": "m", "messages": [{"role": "user", "content": "hi"}]}"#,
            1,
            5 + 1 + 8 + 4 + 4 + 7 + 2,
        );
        // Content parts, names and tool fields all count; numbers and nulls do not.
        check(
            r#"{"messages": [{"role": "tool", "name": "ab", "content": [{"type": "text", "text": "xyz"}], "n": 1.5, "x": null}], "stream": true}"#,
            1,
            8 + 4 + 4 + 4 + 2 + 7 + 4 + 4 + 4 + 3 + 1 + 1 + 6,
        );
        // Escaped strings count as their decoded bytes.
        check(r#"{"content": "a\"\u00e9"}"#, 1, 7 + 1 + 1 + 2);
        check(r#"{"messages": [], "content": "hi"}"#, 1, 8 + 7 + 2);
        check(r#"{"messages": "not a list"}"#, 0, 8 + 10);
        assert!(measure(b"[1, 2]").is_err());
        assert!(measure(b"{\"messages\": [").is_err());
        assert!(measure(b"{} trailing").is_err());
    }

    #[test]
    fn sizes_over_the_limits_are_refused_with_the_limit_and_the_size() {
        let limits = ChatLimits::default();
        assert!(
            limits
                .check(RequestSize {
                    messages: 2048,
                    text_bytes: 4 << 20
                })
                .is_ok()
        );
        let error = limits
            .check(RequestSize {
                messages: 300_000,
                text_bytes: 10,
            })
            .unwrap_err();
        let LimitError::TooLarge(message) = &error else {
            panic!("{error:?}")
        };
        assert!(
            message.contains("300000 messages") && message.contains("at most 2048"),
            "{message}"
        );
        let error = limits
            .check(RequestSize {
                messages: 1,
                text_bytes: (4 << 20) + 1,
            })
            .unwrap_err();
        assert!(
            error.to_string().contains("4194305 bytes of text") && error.to_string().contains("4 MiB"),
            "{error}"
        );

        let mut body = String::from(r#"{"model": "m", "messages": ["#);
        for i in 0..3000 {
            if i > 0 {
                body.push(',');
            }
            body.push_str(r#"{"role": "user", "content": "a"}"#);
        }
        body.push_str("]}");
        assert!(matches!(
            limits.check_body(body.as_bytes()),
            Err(LimitError::TooLarge(_))
        ));
        assert!(limits.check_body(b"not json").is_ok(), "the parse reports bad JSON");
        // The body limit fits the largest request within the limits, escaped.
        assert!(limits.body_bytes() >= 3 * (4 << 20) + 2048 * 32);
        assert!(
            limits
                .body_too_large(1 << 20)
                .to_string()
                .contains("longer than 1048576 bytes (1 MiB)")
        );
    }

    #[test]
    fn parsed_messages_are_measured_by_their_contents() {
        let size = RequestSize::of_messages(&[NewMessage::new(Role::User, "abc"), NewMessage::new(Role::System, "de")]);
        assert_eq!(
            size,
            RequestSize {
                messages: 2,
                text_bytes: 5
            }
        );
    }

    #[test]
    fn each_user_has_their_own_requests_and_streams_up_to_the_limit() {
        let admission = Admission::default();
        let first = admission.admit("ada", Flight::Request, 2).unwrap();
        let second = admission.admit("ada", Flight::Request, 2).unwrap();
        let error = admission.admit("ada", Flight::Request, 2).unwrap_err();
        assert_eq!(
            error.to_string(),
            "you have 2 chat requests in flight, the most one user may have at once is 2; retry when one has ended (see Retry-After)"
        );
        // Another user, and another kind, are counted apart.
        let _bob = admission.admit("bob", Flight::Request, 2).unwrap();
        let stream = admission.admit("ada", Flight::Stream, 1).unwrap();
        assert!(
            admission
                .admit("ada", Flight::Stream, 1)
                .unwrap_err()
                .to_string()
                .contains("1 streams open")
        );
        drop(first);
        assert_eq!(admission.in_flight("ada", Flight::Request), 1);
        let _again = admission.admit("ada", Flight::Request, 2).unwrap();
        drop((second, stream));
        assert_eq!(admission.in_flight("ada", Flight::Stream), 0);
        assert_eq!(admission.in_flight("ada", Flight::Request), 1);
    }
}
