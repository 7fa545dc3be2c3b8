//! The one writer of sessions, with group commit.
//!
//! Every change of a session (create, append, rebind, delete) is a request to one thread
//! that owns all writes. It takes every request waiting (up to [`MAX_BATCH`]), applies
//! them in order to an overlay of what the batch has written so far (so sequence
//! numbers, idempotency keys and bindings are decided by one writer, without locks),
//! commits them as one atomic batch with one flush, and only then answers each. Many
//! concurrent appends therefore share a flush: under load a flush costs each of them a
//! fraction of its time, and an answer always means "on disk".
//!
//! An append with an idempotency key that was committed before (or earlier in the same
//! batch) writes nothing and answers with the messages it wrote the first time.

use std::collections::HashMap;
use std::sync::Arc;

use tokio::sync::{mpsc, oneshot, watch};

use super::record::{Binding, MessageRecord, NewMessage, SessionRecord};
use super::store::{Appended, CreatedKey, SessionStore, Write};
use crate::base::unix_ms;
use crate::store::StoreError;

/// Requests that may wait for the writer; more wait in their callers.
pub const LOG_QUEUE: usize = 4096;

/// The most requests one commit takes.
pub const MAX_BATCH: usize = 512;

/// Why a write was refused.
#[derive(Debug, thiserror::Error)]
pub enum LogError {
    /// No such session.
    #[error("no session `{0}`")]
    NotFound(String),
    /// The id is taken.
    #[error("a session `{0}` exists already")]
    Exists(String),
    /// The store failed; nothing of the request was written.
    #[error(transparent)]
    Store(#[from] Arc<StoreError>),
    /// The writer stopped (the server is shutting down).
    #[error("the session writer stopped")]
    Closed,
    /// The idempotency key of a create came with another request before.
    #[error(
        "the Idempotency-Key `{key}` was used before with a different request (it created `{session}`); help: use a new key for a new request"
    )]
    KeyReused {
        /// The key.
        key: String,
        /// The session it created.
        session: String,
    },
}

/// The `Idempotency-Key` of a create and the request it came with.
#[derive(Debug, Clone)]
pub struct CreateKey {
    /// The client's key.
    pub key: String,
    /// The SHA-256 of the request (hex).
    pub request_sha256: String,
}

/// What a create did.
#[derive(Debug, Clone)]
pub struct Created {
    /// The session (made by an earlier create with the same key when replayed).
    pub session: SessionRecord,
    /// True when the key was seen before and nothing was written.
    pub replayed: bool,
}

/// What an append wrote.
#[derive(Debug, Clone)]
pub struct AppendOutcome {
    /// The session after the append.
    pub session: SessionRecord,
    /// The messages, as stored.
    pub messages: Vec<MessageRecord>,
    /// True when the idempotency key was seen before and nothing was written.
    pub replayed: bool,
}

enum Op {
    Create(Box<SessionRecord>, Option<CreateKey>),
    Append {
        session: String,
        messages: Vec<NewMessage>,
        key: Option<String>,
    },
    Rebind {
        session: String,
        binding: Option<Binding>,
        migrated: bool,
    },
    Delete(String),
}

enum Outcome {
    Session(SessionRecord),
    Created(Created),
    Appended(AppendOutcome),
    Deleted,
}

struct Request {
    op: Op,
    reply: oneshot::Sender<Result<Outcome, LogError>>,
}

/// How the writer commits.
#[derive(Debug, Clone, Copy)]
pub struct LogConfig {
    /// The most requests one commit takes (1: a flush per write, the baseline of the
    /// benchmark).
    pub max_batch: usize,
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig { max_batch: MAX_BATCH }
    }
}

/// The handle to the writer. Cheap to clone; the writer stops when the last handle is
/// dropped.
#[derive(Clone)]
pub struct SessionLog {
    requests: mpsc::Sender<Request>,
    store: Arc<dyn SessionStore>,
    /// Counts the writes acknowledged (a session created, messages appended, a session
    /// rebound or deleted), for readers that follow the sessions (the live page).
    changes: Arc<watch::Sender<u64>>,
}

impl std::fmt::Debug for SessionLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionLog").finish_non_exhaustive()
    }
}

impl SessionLog {
    /// Starts the writer over `store`.
    ///
    /// Errors: the thread cannot be started.
    pub fn start(store: Arc<dyn SessionStore>, config: LogConfig) -> std::io::Result<SessionLog> {
        let (requests, receiver) = mpsc::channel(LOG_QUEUE);
        let writer = Writer {
            store: Arc::clone(&store),
            max_batch: config.max_batch.max(1),
        };
        std::thread::Builder::new()
            .name("session-log".to_owned())
            .spawn(move || writer.run(receiver))?;
        Ok(SessionLog {
            requests,
            store,
            changes: Arc::new(watch::channel(0).0),
        })
    }

    /// A receiver that wakes after each acknowledged write (its value counts them).
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changes.subscribe()
    }

    /// The store, for reads.
    pub fn store(&self) -> &Arc<dyn SessionStore> {
        &self.store
    }

    async fn send(&self, op: Op) -> Result<Outcome, LogError> {
        let (reply, answer) = oneshot::channel();
        let waited = async {
            self.requests
                .send(Request { op, reply })
                .await
                .map_err(|_| LogError::Closed)?;
            answer.await.map_err(|_| LogError::Closed)?
        };
        // The writer's own commits have a deadline; this one bounds the wait in its queue
        // too. A write past it may still be stored, unacknowledged (idempotency keys make
        // the retry safe).
        let deadline = crate::store::WRITE_DEADLINE * 2;
        let outcome = tokio::time::timeout(deadline, waited)
            .await
            .map_err(|_| LogError::Store(Arc::new(StoreError::Stalled { waited: deadline })))??;
        self.changes.send_modify(|n| *n += 1);
        Ok(outcome)
    }

    /// Stores a new session.
    ///
    /// Errors: [`LogError::Exists`], [`LogError::Store`].
    pub async fn create(&self, record: SessionRecord) -> Result<SessionRecord, LogError> {
        Ok(self.create_keyed(record, None).await?.session)
    }

    /// Stores a new session, once per idempotency `key` of its owner: a create with a
    /// key seen before (and the same request) writes nothing and answers the session
    /// it made then.
    ///
    /// Errors: [`LogError::Exists`], [`LogError::KeyReused`], [`LogError::NotFound`] (the
    /// session the key made was deleted), [`LogError::Store`].
    pub async fn create_keyed(&self, record: SessionRecord, key: Option<CreateKey>) -> Result<Created, LogError> {
        match self.send(Op::Create(Box::new(record), key)).await? {
            Outcome::Created(created) => Ok(created),
            _ => Err(LogError::Closed),
        }
    }

    /// Appends `messages` to a session, once per idempotency `key`.
    ///
    /// Errors: [`LogError::NotFound`], [`LogError::Store`].
    pub async fn append(
        &self,
        session: &str,
        messages: Vec<NewMessage>,
        key: Option<String>,
    ) -> Result<AppendOutcome, LogError> {
        let op = Op::Append {
            session: session.to_owned(),
            messages,
            key,
        };
        match self.send(op).await? {
            Outcome::Appended(outcome) => Ok(outcome),
            _ => Err(LogError::Closed),
        }
    }

    /// Binds a session to another instance (or to none); `migrated` counts it as a move.
    ///
    /// Errors: [`LogError::NotFound`], [`LogError::Store`].
    pub async fn rebind(
        &self,
        session: &str,
        binding: Option<Binding>,
        migrated: bool,
    ) -> Result<SessionRecord, LogError> {
        let op = Op::Rebind {
            session: session.to_owned(),
            binding,
            migrated,
        };
        match self.send(op).await? {
            Outcome::Session(record) => Ok(record),
            _ => Err(LogError::Closed),
        }
    }

    /// Deletes a session with its messages.
    ///
    /// Errors: [`LogError::NotFound`], [`LogError::Store`].
    pub async fn delete(&self, session: &str) -> Result<(), LogError> {
        self.send(Op::Delete(session.to_owned())).await.map(|_| ())
    }
}

struct Writer {
    store: Arc<dyn SessionStore>,
    max_batch: usize,
}

/// What the batch being built has written, over what the store holds.
#[derive(Default)]
struct Overlay {
    /// Sessions written (`None`: deleted).
    sessions: HashMap<String, Option<SessionRecord>>,
    /// Idempotency keys written.
    keys: HashMap<(String, String), Appended>,
    /// Messages written, by session.
    messages: HashMap<String, Vec<MessageRecord>>,
    /// Sessions made by idempotent creates in this batch, by owner and key.
    created: HashMap<(String, String), CreatedKey>,
}

impl Writer {
    fn run(self, mut receiver: mpsc::Receiver<Request>) {
        let mut batch = Vec::with_capacity(self.max_batch);
        while let Some(first) = receiver.blocking_recv() {
            batch.push(first);
            while batch.len() < self.max_batch {
                match receiver.try_recv() {
                    Ok(request) => batch.push(request),
                    Err(_) => break,
                }
            }
            self.commit(&mut batch);
        }
    }

    fn commit(&self, batch: &mut Vec<Request>) {
        let mut overlay = Overlay::default();
        let mut writes = Vec::new();
        let mut answers = Vec::with_capacity(batch.len());
        for request in batch.drain(..) {
            let outcome = self.apply(request.op, &mut overlay, &mut writes);
            answers.push((request.reply, outcome));
        }
        let committed = if writes.is_empty() {
            Ok(())
        } else {
            self.store.commit(&writes).map_err(Arc::new)
        };
        for (reply, outcome) in answers {
            let answer = match (&committed, outcome) {
                (Ok(()), outcome) => outcome,
                // A refused request wrote nothing: its own answer stands.
                (Err(_), Err(refused)) => Err(refused),
                (Err(error), Ok(_)) => Err(LogError::Store(Arc::clone(error))),
            };
            let _ = reply.send(answer);
        }
    }

    fn session(&self, id: &str, overlay: &Overlay) -> Result<Option<SessionRecord>, LogError> {
        match overlay.sessions.get(id) {
            Some(record) => Ok(record.clone()),
            None => self.store.session(id).map_err(|e| LogError::Store(Arc::new(e))),
        }
    }

    fn apply(&self, op: Op, overlay: &mut Overlay, writes: &mut Vec<Write>) -> Result<Outcome, LogError> {
        let store_error = |e: StoreError| LogError::Store(Arc::new(e));
        match op {
            Op::Create(record, key) => {
                if let Some(key) = &key {
                    let slot = (record.owner.clone(), key.key.clone());
                    let seen = match overlay.created.get(&slot) {
                        Some(created) => Some(created.clone()),
                        None => self.store.created(&slot.0, &slot.1).map_err(store_error)?,
                    };
                    if let Some(seen) = seen {
                        if seen.request_sha256 != key.request_sha256 {
                            return Err(LogError::KeyReused {
                                key: key.key.clone(),
                                session: seen.session,
                            });
                        }
                        let session = self
                            .session(&seen.session, overlay)?
                            .ok_or(LogError::NotFound(seen.session))?;
                        return Ok(Outcome::Created(Created {
                            session,
                            replayed: true,
                        }));
                    }
                }
                if self.session(&record.id, overlay)?.is_some() {
                    return Err(LogError::Exists(record.id));
                }
                overlay.sessions.insert(record.id.clone(), Some((*record).clone()));
                writes.push(Write::Session(record.clone()));
                if let Some(key) = key {
                    let created = CreatedKey {
                        request_sha256: key.request_sha256,
                        session: record.id.clone(),
                    };
                    overlay
                        .created
                        .insert((record.owner.clone(), key.key.clone()), created.clone());
                    writes.push(Write::CreatedKey {
                        owner: record.owner.clone(),
                        key: key.key,
                        created,
                    });
                }
                Ok(Outcome::Created(Created {
                    session: *record,
                    replayed: false,
                }))
            }
            Op::Append { session, messages, key } => {
                let mut record = self
                    .session(&session, overlay)?
                    .ok_or_else(|| LogError::NotFound(session.clone()))?;
                if let Some(key) = &key {
                    let seen = match overlay.keys.get(&(session.clone(), key.clone())) {
                        Some(appended) => Some(*appended),
                        None => self.store.idempotent(&session, key).map_err(store_error)?,
                    };
                    if let Some(appended) = seen {
                        let messages = self.appended(&session, appended, overlay)?;
                        return Ok(Outcome::Appended(AppendOutcome {
                            session: record,
                            messages,
                            replayed: true,
                        }));
                    }
                }
                let now = unix_ms();
                let first = record.messages;
                let mut stored = Vec::with_capacity(messages.len());
                for message in messages {
                    let message = MessageRecord::new(record.messages, message, key.clone(), now);
                    record.messages += 1;
                    writes.push(Write::Message {
                        session: session.clone(),
                        message: message.clone(),
                    });
                    stored.push(message);
                }
                if let Some(key) = key
                    && !stored.is_empty()
                {
                    let appended = Appended {
                        first,
                        last: record.messages - 1,
                    };
                    overlay.keys.insert((session.clone(), key.clone()), appended);
                    writes.push(Write::Idempotency {
                        session: session.clone(),
                        key,
                        appended,
                    });
                    // Kept for a retry with the same key later in this batch; messages
                    // without a key are never read back from the overlay.
                    overlay
                        .messages
                        .entry(session.clone())
                        .or_default()
                        .extend(stored.iter().cloned());
                }
                record.updated_at = now;
                overlay.sessions.insert(session, Some(record.clone()));
                writes.push(Write::Session(Box::new(record.clone())));
                Ok(Outcome::Appended(AppendOutcome {
                    session: record,
                    messages: stored,
                    replayed: false,
                }))
            }
            Op::Rebind {
                session,
                binding,
                migrated,
            } => {
                let mut record = self
                    .session(&session, overlay)?
                    .ok_or_else(|| LogError::NotFound(session.clone()))?;
                record.binding = binding;
                record.updated_at = unix_ms();
                if migrated {
                    record.migrations += 1;
                }
                overlay.sessions.insert(session, Some(record.clone()));
                writes.push(Write::Session(Box::new(record.clone())));
                Ok(Outcome::Session(record))
            }
            Op::Delete(session) => {
                let record = self
                    .session(&session, overlay)?
                    .ok_or_else(|| LogError::NotFound(session.clone()))?;
                overlay.sessions.insert(session.clone(), None);
                overlay.messages.remove(&session);
                overlay.keys.retain(|(s, _), _| *s != session);
                writes.push(Write::Delete {
                    session,
                    owner: record.owner,
                });
                Ok(Outcome::Deleted)
            }
        }
    }

    /// The messages an earlier idempotent append wrote.
    fn appended(&self, session: &str, appended: Appended, overlay: &Overlay) -> Result<Vec<MessageRecord>, LogError> {
        let wanted = |m: &&MessageRecord| (appended.first..=appended.last).contains(&m.seq);
        let pending: Vec<MessageRecord> = overlay
            .messages
            .get(session)
            .map(|ms| ms.iter().filter(wanted).cloned().collect())
            .unwrap_or_default();
        if !pending.is_empty() {
            return Ok(pending);
        }
        let count = usize::try_from(appended.last - appended.first + 1).unwrap_or(usize::MAX);
        self.store
            .messages(session, appended.first, count)
            .map_err(|e| LogError::Store(Arc::new(e)))
    }
}
