//! Where sessions are kept: the small [`SessionStore`] trait, and [`SledSessions`], its
//! implementation in one sled tree.
//!
//! # Layout (version [`LAYOUT_VERSION`])
//! One tree, `sessions`, keys by prefix:
//!
//! | key | value |
//! |---|---|
//! | `meta/layout` | the layout version (one byte) |
//! | `s/{session}` | [`SessionRecord`] |
//! | `o/{owner}/{session}` | empty: the owner index |
//! | `m/{session}/{seq:016x}` | [`MessageRecord`] |
//! | `i/{session}/{key}` | the first and last sequence numbers an idempotent append wrote |
//! | `c/{owner}/{key}` | [`CreatedKey`]: the session an idempotent create made |
//!
//! Values are the store's versioned records (a format byte, then JSON). Every
//! [`SessionStore::commit`] is one sled batch (all of it or none of it after a crash),
//! stored through the database's one writer ([`crate::store`]) and flushed before it
//! returns.

use std::path::Path;

use serde::{Deserialize, Serialize};

use super::record::{MessageRecord, SessionRecord};
use crate::store::{Db, StoreError, WriteBatch, decode, encode};

/// The layout written today.
pub const LAYOUT_VERSION: u8 = 1;

const LAYOUT_KEY: &[u8] = b"meta/layout";
const TREE: &str = "sessions";

/// One change of a commit.
#[derive(Debug, Clone)]
pub enum Write {
    /// Creates or replaces a session (and indexes it under its owner).
    Session(Box<SessionRecord>),
    /// Adds a message.
    Message {
        /// The session.
        session: String,
        /// The message.
        message: MessageRecord,
    },
    /// Remembers which messages an idempotent append wrote.
    Idempotency {
        /// The session.
        session: String,
        /// The client's key.
        key: String,
        /// The messages it wrote.
        appended: Appended,
    },
    /// Remembers which session an idempotent create made.
    CreatedKey {
        /// The owner.
        owner: String,
        /// The client's key.
        key: String,
        /// What it made.
        created: CreatedKey,
    },
    /// Removes a session with its messages and keys.
    Delete {
        /// The session.
        session: String,
        /// Its owner (for the index).
        owner: String,
    },
}

/// The sequence numbers one append wrote (inclusive).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Appended {
    /// The first.
    pub first: u64,
    /// The last.
    pub last: u64,
}

/// The session an idempotent create made, and the request it came with.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CreatedKey {
    /// The SHA-256 of the request (hex).
    pub request_sha256: String,
    /// The session.
    pub session: String,
}

/// A page of sessions.
#[derive(Debug, Clone, Default)]
pub struct Page {
    /// The sessions, oldest first.
    pub sessions: Vec<SessionRecord>,
    /// Where the next page starts (the last id of this one), if there is more.
    pub next: Option<String>,
}

/// Sessions on durable storage. Reads see every committed write; a commit is atomic
/// and durable when it returns.
pub trait SessionStore: Send + Sync + 'static {
    /// One session.
    fn session(&self, id: &str) -> Result<Option<SessionRecord>, StoreError>;

    /// Sessions after the id `after` (exclusive), at most `limit`, of `owner` (all
    /// owners when `None`), in id (creation) order.
    fn sessions(&self, owner: Option<&str>, after: Option<&str>, limit: usize) -> Result<Page, StoreError>;

    /// Messages of a session from sequence number `from`, at most `limit`.
    fn messages(&self, session: &str, from: u64, limit: usize) -> Result<Vec<MessageRecord>, StoreError>;

    /// The most recent messages of a session whose text (contents and tool calls, see
    /// [`MessageRecord::text_bytes`]), each with [`MESSAGE_OVERHEAD_BYTES`], fits in
    /// `budget` bytes (the last one always), oldest first: what a turn sends its
    /// engine.
    fn recent(&self, session: &str, budget: usize) -> Result<Vec<MessageRecord>, StoreError>;

    /// What an idempotent append with `key` wrote, if one was committed.
    fn idempotent(&self, session: &str, key: &str) -> Result<Option<Appended>, StoreError>;

    /// The session an idempotent create of `owner` with `key` made, if one was committed.
    fn created(&self, owner: &str, key: &str) -> Result<Option<CreatedKey>, StoreError>;

    /// How many sessions each owner has (owners without any left out).
    fn owners(&self) -> Result<std::collections::HashMap<String, u32>, StoreError>;

    /// Applies `writes` atomically and durably.
    fn commit(&self, writes: &[Write]) -> Result<(), StoreError>;

    /// Flushes what is committed (a no-op where commits are durable already).
    fn flush(&self) -> Result<(), StoreError> {
        Ok(())
    }
}

/// What a message costs of a turn's history budget beyond its text: chat templates
/// spend four to six tokens per message on its role markers (`<|im_start|>user\n …
/// <|im_end|>\n`), about 16 bytes at [`super::service::BYTES_PER_TOKEN`]. Counting it
/// also bounds how many messages a turn reads and sends, however short they are: a
/// session of a million one-byte messages costs a turn no more than its budget / 17.
pub const MESSAGE_OVERHEAD_BYTES: usize = 16;

/// [`SessionStore`] in a sled tree of the orchestrator's database.
#[derive(Clone)]
pub struct SledSessions {
    db: Db,
    tree: sled::Tree,
    /// Whether a commit flushes (false only for the benchmark's in-memory baseline).
    durable: bool,
}

impl std::fmt::Debug for SledSessions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SledSessions").finish_non_exhaustive()
    }
}

fn session_key(id: &str) -> Vec<u8> {
    format!("s/{id}").into_bytes()
}

fn owner_key(owner: &str, id: &str) -> Vec<u8> {
    format!("o/{owner}/{id}").into_bytes()
}

fn message_prefix(id: &str) -> Vec<u8> {
    format!("m/{id}/").into_bytes()
}

fn message_key(id: &str, seq: u64) -> Vec<u8> {
    format!("m/{id}/{seq:016x}").into_bytes()
}

fn created_key(owner: &str, key: &str) -> Vec<u8> {
    format!("c/{owner}/{key}").into_bytes()
}

fn idempotency_prefix(id: &str) -> Vec<u8> {
    format!("i/{id}/").into_bytes()
}

fn idempotency_key(id: &str, key: &str) -> Vec<u8> {
    format!("i/{id}/{key}").into_bytes()
}

impl SledSessions {
    /// The sessions of `db`, migrated to today's layout if an older skein wrote them.
    ///
    /// Errors: the layout is newer than this skein knows, or the store fails.
    pub fn open(db: &Db) -> Result<SledSessions, StoreError> {
        let tree = db.raw().open_tree(TREE)?;
        let sessions = SledSessions {
            db: db.clone(),
            tree,
            durable: true,
        };
        sessions.migrate()?;
        Ok(sessions)
    }

    /// Sessions in a database of their own in `dir` (tools and benchmarks).
    pub fn open_dir(dir: &Path) -> Result<SledSessions, StoreError> {
        SledSessions::open(&Db::open(dir)?)
    }

    /// The same store, but commits are not flushed: a baseline for benchmarks only.
    pub fn without_flush(mut self) -> SledSessions {
        self.durable = false;
        self
    }

    /// Brings the layout to [`LAYOUT_VERSION`]. Version 1 is the first, so there is no
    /// step yet; a later version adds `1 => migrate_1_to_2(tree)?` here and each
    /// step rewrites the keys it changes in one batch before the version moves on.
    fn migrate(&self) -> Result<(), StoreError> {
        let found = self.tree.get(LAYOUT_KEY)?.and_then(|v| v.first().copied());
        match found {
            None => {
                let mut batch = sled::Batch::default();
                batch.insert(LAYOUT_KEY, &[LAYOUT_VERSION]);
                let mut write = WriteBatch::new();
                write.raw(&self.tree, batch);
                self.db.commit_blocking(write)
            }
            Some(LAYOUT_VERSION) => Ok(()),
            Some(version) => Err(StoreError::Corrupt {
                tree: TREE,
                key: "meta/layout".to_owned(),
                reason: format!(
                    "sessions are stored in layout {version}, which this skein (layout {LAYOUT_VERSION}) cannot read; upgrade skein"
                ),
            }),
        }
    }

    fn read<T: serde::de::DeserializeOwned>(&self, key: &[u8], bytes: &[u8]) -> Result<T, StoreError> {
        decode(TREE, key, bytes)
    }
}

impl SessionStore for SledSessions {
    fn session(&self, id: &str) -> Result<Option<SessionRecord>, StoreError> {
        let key = session_key(id);
        self.tree.get(&key)?.map(|bytes| self.read(&key, &bytes)).transpose()
    }

    fn sessions(&self, owner: Option<&str>, after: Option<&str>, limit: usize) -> Result<Page, StoreError> {
        let prefix = match owner {
            Some(owner) => format!("o/{owner}/"),
            None => "s/".to_owned(),
        };
        let start = match after {
            // The byte after the id's last one is the first key after it.
            Some(after) => {
                let mut key = format!("{prefix}{after}").into_bytes();
                key.push(0);
                key
            }
            None => prefix.clone().into_bytes(),
        };
        let mut page = Page::default();
        for item in self.tree.range(start..) {
            let (key, value) = item?;
            let Some(id) = key.strip_prefix(prefix.as_bytes()) else {
                break;
            };
            if page.sessions.len() == limit {
                page.next = page.sessions.last().map(|s| s.id.clone());
                break;
            }
            let record = if owner.is_some() {
                let id = String::from_utf8_lossy(id);
                match self.session(&id)? {
                    Some(record) => record,
                    None => continue,
                }
            } else {
                self.read(&key, &value)?
            };
            page.sessions.push(record);
        }
        Ok(page)
    }

    fn messages(&self, session: &str, from: u64, limit: usize) -> Result<Vec<MessageRecord>, StoreError> {
        let prefix = message_prefix(session);
        self.tree
            .range(message_key(session, from)..)
            .take_while(|item| item.as_ref().map_or(true, |(key, _)| key.starts_with(&prefix)))
            .take(limit)
            .map(|item| {
                let (key, value) = item?;
                self.read(&key, &value)
            })
            .collect()
    }

    fn recent(&self, session: &str, budget: usize) -> Result<Vec<MessageRecord>, StoreError> {
        let mut used = 0usize;
        let mut recent: Vec<MessageRecord> = Vec::new();
        // Newest first, until the next would not fit.
        for item in self.tree.scan_prefix(message_prefix(session)).rev() {
            let (key, value) = item?;
            let message: MessageRecord = self.read(&key, &value)?;
            let cost = message.text_bytes().saturating_add(MESSAGE_OVERHEAD_BYTES);
            if !recent.is_empty() && used.saturating_add(cost) > budget {
                break;
            }
            used = used.saturating_add(cost);
            recent.push(message);
        }
        recent.reverse();
        Ok(recent)
    }

    fn idempotent(&self, session: &str, key: &str) -> Result<Option<Appended>, StoreError> {
        let key = idempotency_key(session, key);
        self.tree.get(&key)?.map(|bytes| self.read(&key, &bytes)).transpose()
    }

    fn created(&self, owner: &str, key: &str) -> Result<Option<CreatedKey>, StoreError> {
        let key = created_key(owner, key);
        self.tree.get(&key)?.map(|bytes| self.read(&key, &bytes)).transpose()
    }

    fn owners(&self) -> Result<std::collections::HashMap<String, u32>, StoreError> {
        // The owner index's keys say it all (`o/{owner}/{id}`: names have no `/`).
        let mut owners = std::collections::HashMap::new();
        for item in self.tree.scan_prefix(b"o/") {
            let (key, _) = item?;
            let owner = key[2..].split(|&b| b == b'/').next().unwrap_or_default();
            *owners.entry(String::from_utf8_lossy(owner).into_owned()).or_default() += 1;
        }
        Ok(owners)
    }

    fn commit(&self, writes: &[Write]) -> Result<(), StoreError> {
        let mut batch = sled::Batch::default();
        for (index, write) in writes.iter().enumerate() {
            match write {
                Write::Session(record) => {
                    batch.insert(session_key(&record.id), encode(record));
                    batch.insert(owner_key(&record.owner, &record.id), Vec::new());
                }
                Write::Message { session, message } => {
                    batch.insert(message_key(session, message.seq), encode(message));
                }
                Write::Idempotency { session, key, appended } => {
                    batch.insert(idempotency_key(session, key), encode(appended));
                }
                Write::CreatedKey { owner, key, created } => {
                    batch.insert(created_key(owner, key), encode(created));
                }
                Write::Delete { session, owner } => {
                    batch.remove(session_key(session));
                    batch.remove(owner_key(owner, session));
                    for prefix in [message_prefix(session), idempotency_prefix(session)] {
                        for key in self.tree.scan_prefix(prefix).keys() {
                            batch.remove(key?);
                        }
                    }
                    // What this same commit wrote for it earlier is not in the tree yet.
                    for earlier in &writes[..index] {
                        match earlier {
                            Write::Message { session: s, message } if s == session => {
                                batch.remove(message_key(s, message.seq));
                            }
                            Write::Idempotency { session: s, key, .. } if s == session => {
                                batch.remove(idempotency_key(s, key));
                            }
                            _ => {}
                        }
                    }
                }
            }
        }
        if self.durable {
            let mut write = WriteBatch::new();
            write.raw(&self.tree, batch);
            self.db.commit_blocking(write)
        } else {
            self.tree.apply_batch(batch)?;
            Ok(())
        }
    }

    fn flush(&self) -> Result<(), StoreError> {
        // Through the writer, which owns the flush: an empty batch of this tree.
        let mut write = WriteBatch::new();
        write.raw(&self.tree, sled::Batch::default());
        self.db.commit_blocking(write)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_stored_before_tool_calls_still_read() {
        let dir = tempfile::tempdir().unwrap();
        let db = Db::open(dir.path()).unwrap();
        let store = SledSessions::open(&db).unwrap();
        // Two messages as a skein that stored text only wrote them.
        for (seq, role, content) in [(0u64, "user", "hi"), (1, "assistant", "echo: hi")] {
            let old = serde_json::json!({"seq": seq, "role": role, "content": content,
                                         "created_at": "2023-11-14T22:13:20Z"});
            db.raw()
                .open_tree(TREE)
                .unwrap()
                .insert(message_key("s1", seq), encode(&old))
                .unwrap();
        }
        let messages = store.messages("s1", 0, 10).unwrap();
        assert_eq!(
            messages.iter().map(|m| m.content.as_str()).collect::<Vec<_>>(),
            ["hi", "echo: hi"]
        );
        assert!(
            messages
                .iter()
                .all(|m| m.tool_calls.is_empty() && m.tool_call_id.is_none())
        );
        assert_eq!(store.recent("s1", 1000).unwrap(), messages);
    }
}
