//! Durable state in sled, behind a small API: one database per orchestrator (in its data
//! directory), one tree per kind of record. Every write this module acknowledges has
//! been flushed to disk, so it survives a `kill -9` of the orchestrator.
//!
//! # One write path
//! Every durable write of the orchestrator (runs, tokens, reflex events, sessions, idempotency
//! keys) is a [`WriteBatch`] handed to the database's one writer thread. The writer takes
//! every batch waiting (up to [`MAX_ROUND`]), applies each atomically (one sled batch, or
//! one transaction when it spans trees), flushes once for all of them, and only then
//! answers each caller: group commit, as the session log does above it. No other code
//! flushes, so there is never more than one flush in flight (sled 0.34 wedges under
//! concurrent `flush_async`).
//!
//! The writer's queue is bounded ([`WRITE_QUEUE`]); a batch that finds it full is refused
//! at once ([`StoreError::Overloaded`]). A caller waits at most [`WRITE_DEADLINE`] for its
//! answer ([`StoreError::Stalled`]: the write may still land, but was not acknowledged),
//! and [`Db::health`] reports the writer stalled while a round has taken longer than
//! [`STALL_AFTER`]; the REST API answers 503 with `Retry-After` for both.
//!
//! Records are JSON after a one-byte format version, so a later version can read (and
//! migrate) what an earlier one wrote.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;
use serde::de::DeserializeOwned;

/// The record format written today.
pub const RECORD_VERSION: u8 = 1;

/// Page cache sled may use by default (sled's own default is 1 GiB); a server sets its
/// own with `--db-cache-mib`.
pub const CACHE_BYTES: u64 = 64 << 20;

/// Batches that may wait for the writer; one more is refused with
/// [`StoreError::Overloaded`].
pub const WRITE_QUEUE: usize = 8192;

/// The most batches one flush takes.
pub const MAX_ROUND: usize = 1024;

/// How long a caller waits for its write to be acknowledged.
pub const WRITE_DEADLINE: Duration = Duration::from_secs(10);

/// A round of the writer running longer than this makes the store unhealthy.
pub const STALL_AFTER: Duration = Duration::from_secs(5);

/// A storage failure.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database could not be opened.
    #[error(
        "cannot open the database in {}: {source}; help: another skein may be running with this data directory (stop it, or pass --data-dir)",
        .path.display()
    )]
    Open {
        /// The directory.
        path: PathBuf,
        /// The cause.
        #[source]
        source: sled::Error,
    },
    /// A read or write failed.
    #[error("the database failed: {0}")]
    Io(#[from] sled::Error),
    /// A write of a round failed (every write of the round gets the same cause).
    #[error("the database failed: {0}")]
    Write(#[source] Arc<sled::Error>),
    /// A stored record could not be read.
    #[error("record `{key}` in `{tree}` is unreadable: {reason}")]
    Corrupt {
        /// The tree.
        tree: &'static str,
        /// The key.
        key: String,
        /// Why.
        reason: String,
    },
    /// The write was not acknowledged within its deadline: the database is stalled or
    /// overloaded. It may still be stored; retry with the same idempotency key.
    #[error(
        "the database did not acknowledge the write within {} ms; help: retry later (with the same Idempotency-Key)",
        .waited.as_millis()
    )]
    Stalled {
        /// How long the caller waited.
        waited: Duration,
    },
    /// The writer's queue is full.
    #[error("the database has {WRITE_QUEUE} writes waiting; help: retry later")]
    Overloaded,
    /// The writer stopped (the server is shutting down).
    #[error("the database writer stopped")]
    Stopped,
}

impl StoreError {
    /// Whether the failure is the store being slow or busy (worth a retry later), not a
    /// failed write.
    pub fn is_unavailable(&self) -> bool {
        matches!(
            self,
            StoreError::Stalled { .. } | StoreError::Overloaded | StoreError::Stopped
        )
    }
}

/// How the writer is doing, for `/healthz` and `/metrics`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct WriterHealth {
    /// Whether a round has been running longer than [`STALL_AFTER`].
    pub stalled: bool,
    /// How long the current round has been running (0 when idle), in milliseconds.
    pub busy_ms: u64,
    /// Batches waiting.
    pub queued: u64,
    /// Batches acknowledged since start.
    pub writes: u64,
    /// Flushes (rounds) since start.
    pub flushes: u64,
    /// Writes refused (overloaded) or not acknowledged in time (stalled) since start.
    pub refused: u64,
}

/// Several changes, of one or more trees, stored atomically by [`Db::commit`].
#[derive(Default)]
pub struct WriteBatch {
    parts: Vec<(sled::Tree, sled::Batch)>,
}

impl std::fmt::Debug for WriteBatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WriteBatch").field("trees", &self.parts.len()).finish()
    }
}

impl WriteBatch {
    /// An empty batch.
    pub fn new() -> WriteBatch {
        WriteBatch::default()
    }

    fn part(&mut self, tree: &sled::Tree) -> &mut sled::Batch {
        let at = match self.parts.iter().position(|(t, _)| t.name() == tree.name()) {
            Some(at) => at,
            None => {
                self.parts.push((tree.clone(), sled::Batch::default()));
                self.parts.len() - 1
            }
        };
        &mut self.parts[at].1
    }

    /// Writes `record` under `key` of `tree`.
    pub fn put<T: Serialize>(&mut self, tree: &Tree<T>, key: &str, record: &T) -> &mut WriteBatch {
        self.part(&tree.tree).insert(key.as_bytes(), encode(record));
        self
    }

    /// Removes the record under `key` of `tree`.
    pub fn remove<T>(&mut self, tree: &Tree<T>, key: &str) -> &mut WriteBatch {
        self.part(&tree.tree).remove(key.as_bytes());
        self
    }

    /// Adds a sled batch of `tree` (stores that lay out their own keys: sessions).
    pub(crate) fn raw(&mut self, tree: &sled::Tree, batch: sled::Batch) -> &mut WriteBatch {
        self.parts.push((tree.clone(), batch));
        self
    }

    /// Whether it changes nothing.
    pub fn is_empty(&self) -> bool {
        self.parts.is_empty()
    }
}

type Answer = Result<(), Arc<sled::Error>>;

enum Reply {
    Async(tokio::sync::oneshot::Sender<Answer>),
    Blocking(SyncSender<Answer>),
}

impl Reply {
    fn send(self, answer: Answer) {
        // A caller that stopped waiting (its deadline passed) needs no answer.
        let _ = match self {
            Reply::Async(sender) => sender.send(answer).map_err(|_| ()),
            Reply::Blocking(sender) => sender.send(answer).map_err(|_| ()),
        };
    }
}

enum Request {
    Write {
        batch: WriteBatch,
        reply: Reply,
    },
    /// Holds the writer until the sender is dropped (tests of a stalled store).
    #[cfg(test)]
    Hold(std::sync::mpsc::Receiver<()>),
}

/// What the writer and its callers share.
struct WriterState {
    /// When the writer started (the origin of `busy_since`).
    started: Instant,
    /// When the current round started, in ms since `started` plus one (0: idle).
    busy_since: AtomicU64,
    queued: AtomicU64,
    writes: AtomicU64,
    flushes: AtomicU64,
    refused: AtomicU64,
    /// [`WRITE_DEADLINE`] unless set otherwise, in ms.
    deadline_ms: AtomicU64,
    /// [`STALL_AFTER`] unless set otherwise, in ms.
    stall_after_ms: AtomicU64,
}

impl WriterState {
    fn deadline(&self) -> Duration {
        Duration::from_millis(self.deadline_ms.load(Ordering::Relaxed))
    }

    fn stall_after(&self) -> Duration {
        Duration::from_millis(self.stall_after_ms.load(Ordering::Relaxed))
    }
}

/// The handle to the writer thread; the last one dropped stops and joins it, so the
/// database is closed (and may be opened again) when every handle is gone.
struct Writer {
    requests: Option<SyncSender<Request>>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    state: Arc<WriterState>,
}

impl Drop for Writer {
    fn drop(&mut self) {
        self.requests = None;
        let thread = self
            .thread
            .get_mut()
            .map(Option::take)
            .unwrap_or_else(|p| p.into_inner().take());
        // A stalled writer may never return: the process is ending, leave it.
        let stalled = self.health().stalled;
        if let Some(thread) = thread
            && !stalled
            && thread.thread().id() != std::thread::current().id()
        {
            let _ = thread.join();
        }
    }
}

impl Writer {
    fn start(db: sled::Db) -> Result<Writer, StoreError> {
        let (requests, receiver) = std::sync::mpsc::sync_channel(WRITE_QUEUE);
        let state = Arc::new(WriterState {
            started: Instant::now(),
            busy_since: AtomicU64::new(0),
            queued: AtomicU64::new(0),
            writes: AtomicU64::new(0),
            flushes: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            deadline_ms: AtomicU64::new(WRITE_DEADLINE.as_millis() as u64),
            stall_after_ms: AtomicU64::new(STALL_AFTER.as_millis() as u64),
        });
        let shared = Arc::clone(&state);
        let thread = std::thread::Builder::new()
            .name("store-writer".to_owned())
            .spawn(move || write_rounds(&db, &receiver, &shared))
            .map_err(|e| StoreError::Io(sled::Error::Io(e)))?;
        Ok(Writer {
            requests: Some(requests),
            thread: Mutex::new(Some(thread)),
            state,
        })
    }

    fn enqueue(&self, request: Request) -> Result<(), StoreError> {
        let requests = self.requests.as_ref().ok_or(StoreError::Stopped)?;
        self.state.queued.fetch_add(1, Ordering::Relaxed);
        match requests.try_send(request) {
            Ok(()) => Ok(()),
            Err(error) => {
                self.state.queued.fetch_sub(1, Ordering::Relaxed);
                match error {
                    TrySendError::Full(_) => {
                        self.state.refused.fetch_add(1, Ordering::Relaxed);
                        Err(StoreError::Overloaded)
                    }
                    TrySendError::Disconnected(_) => Err(StoreError::Stopped),
                }
            }
        }
    }

    fn health(&self) -> WriterHealth {
        let state = &self.state;
        let busy_since = state.busy_since.load(Ordering::Relaxed);
        let busy_ms = if busy_since == 0 {
            0
        } else {
            elapsed_ms(state.started).saturating_sub(busy_since - 1)
        };
        WriterHealth {
            stalled: Duration::from_millis(busy_ms) > state.stall_after(),
            busy_ms,
            queued: state.queued.load(Ordering::Relaxed),
            writes: state.writes.load(Ordering::Relaxed),
            flushes: state.flushes.load(Ordering::Relaxed),
            refused: state.refused.load(Ordering::Relaxed),
        }
    }
}

fn elapsed_ms(since: Instant) -> u64 {
    u64::try_from(since.elapsed().as_millis()).unwrap_or(u64::MAX)
}

/// The writer thread: rounds of every waiting batch, one flush each, until every
/// handle is gone.
fn write_rounds(db: &sled::Db, requests: &Receiver<Request>, state: &WriterState) {
    while let Ok(first) = requests.recv() {
        let mut round = vec![first];
        while round.len() < MAX_ROUND {
            match requests.try_recv() {
                Ok(request) => round.push(request),
                Err(_) => break,
            }
        }
        state.queued.fetch_sub(round.len() as u64, Ordering::Relaxed);
        state
            .busy_since
            .store(elapsed_ms(state.started).saturating_add(1), Ordering::Relaxed);
        let mut applied = Vec::with_capacity(round.len());
        for request in round {
            match request {
                Request::Write { batch, reply } => match apply(&batch) {
                    Ok(()) => applied.push(reply),
                    Err(error) => reply.send(Err(Arc::new(error))),
                },
                #[cfg(test)]
                Request::Hold(release) => {
                    let _ = release.recv();
                }
            }
        }
        if !applied.is_empty() {
            let flushed = db.flush().map(drop).map_err(Arc::new);
            state.flushes.fetch_add(1, Ordering::Relaxed);
            if flushed.is_ok() {
                state.writes.fetch_add(applied.len() as u64, Ordering::Relaxed);
            } else if let Err(error) = &flushed {
                tracing::error!(%error, "the database could not flush");
            }
            for reply in applied {
                reply.send(flushed.clone());
            }
        }
        state.busy_since.store(0, Ordering::Relaxed);
    }
}

/// Applies one batch atomically: a sled batch for one tree, a transaction over several.
fn apply(batch: &WriteBatch) -> Result<(), sled::Error> {
    match batch.parts.as_slice() {
        [] => Ok(()),
        [(tree, part)] => tree.apply_batch(part.clone()),
        parts => {
            use sled::Transactional;
            let trees: Vec<&sled::Tree> = parts.iter().map(|(tree, _)| tree).collect();
            trees
                .as_slice()
                .transaction(|views| {
                    for (view, (_, part)) in views.iter().zip(parts) {
                        view.apply_batch(part)?;
                    }
                    Ok::<(), sled::transaction::ConflictableTransactionError<()>>(())
                })
                .map_err(|error| match error {
                    sled::transaction::TransactionError::Storage(error) => error,
                    sled::transaction::TransactionError::Abort(()) => {
                        sled::Error::Unsupported("a write batch aborted".to_owned())
                    }
                })
        }
    }
}

/// The orchestrator's database.
#[derive(Clone)]
pub struct Db {
    db: sled::Db,
    writer: Arc<Writer>,
}

impl std::fmt::Debug for Db {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Db").finish_non_exhaustive()
    }
}

impl Db {
    /// Opens (or creates) the database in `dir`.
    ///
    /// Errors: [`StoreError::Open`] (e.g. another process holds it).
    pub fn open(dir: &Path) -> Result<Db, StoreError> {
        Db::open_with_cache(dir, CACHE_BYTES)
    }

    /// The database in `dir`, with a page cache of `cache_bytes`.
    ///
    /// The database is private to its owner: `dir` is made (or tightened to) 0700 before
    /// sled opens it, and the files there 0600 after (sled makes its files with the
    /// process's umask, which `skein server` sets to 077).
    pub fn open_with_cache(dir: &Path, cache_bytes: u64) -> Result<Db, StoreError> {
        let open_error = |source| StoreError::Open {
            path: dir.to_owned(),
            source,
        };
        crate::private::private_dir(dir).map_err(|e| open_error(sled::Error::Io(e)))?;
        let db = sled::Config::new()
            .path(dir)
            .cache_capacity(cache_bytes)
            .open()
            .map_err(open_error)?;
        let tightened = crate::private::tighten_tree(dir).map_err(|e| open_error(sled::Error::Io(e)))?;
        if tightened > 0 {
            tracing::warn!(dir = %dir.display(), files = tightened, "made the database's files private (0600)");
        }
        Db::with_writer(db)
    }

    /// A database in memory, gone when dropped (tests, `skein plan`).
    pub fn temporary() -> Result<Db, StoreError> {
        Db::with_writer(sled::Config::new().temporary(true).open()?)
    }

    fn with_writer(db: sled::Db) -> Result<Db, StoreError> {
        let writer = Arc::new(Writer::start(db.clone())?);
        Ok(Db { db, writer })
    }

    /// The sled database, for stores that lay out their own keys (sessions).
    pub(crate) fn raw(&self) -> &sled::Db {
        &self.db
    }

    /// A tree of records of type `T`.
    pub fn tree<T>(&self, name: &'static str) -> Result<Tree<T>, StoreError> {
        Ok(Tree {
            name,
            tree: self.db.open_tree(name)?,
            db: self.clone(),
            _records: std::marker::PhantomData,
        })
    }

    /// Stores `batch` atomically and durably: returns once it is on disk.
    ///
    /// Errors: [`StoreError::Write`], [`StoreError::Overloaded`], [`StoreError::Stalled`]
    /// (not acknowledged within [`WRITE_DEADLINE`]), [`StoreError::Stopped`].
    pub async fn commit(&self, batch: WriteBatch) -> Result<(), StoreError> {
        if batch.is_empty() {
            return Ok(());
        }
        let (reply, answer) = tokio::sync::oneshot::channel();
        self.writer.enqueue(Request::Write {
            batch,
            reply: Reply::Async(reply),
        })?;
        let deadline = self.writer.state.deadline();
        match tokio::time::timeout(deadline, answer).await {
            Ok(Ok(answer)) => answer.map_err(StoreError::Write),
            Ok(Err(_)) => Err(StoreError::Stopped),
            Err(_) => Err(self.stalled(deadline)),
        }
    }

    /// Writes to disk what sled still holds in memory (records put lazily, without a
    /// flush of their own): the last thing a stopping server does. Blocks the thread.
    ///
    /// Errors: [`StoreError::Io`].
    pub fn flush_blocking(&self) -> Result<(), StoreError> {
        self.db.flush()?;
        Ok(())
    }

    /// [`Db::commit`] from synchronous code (the session writer, start-up): blocks the
    /// thread, so never call it on an async worker once the server serves.
    pub fn commit_blocking(&self, batch: WriteBatch) -> Result<(), StoreError> {
        if batch.is_empty() {
            return Ok(());
        }
        let (reply, answer) = std::sync::mpsc::sync_channel(1);
        self.writer.enqueue(Request::Write {
            batch,
            reply: Reply::Blocking(reply),
        })?;
        let deadline = self.writer.state.deadline();
        match answer.recv_timeout(deadline) {
            Ok(answer) => answer.map_err(StoreError::Write),
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => Err(self.stalled(deadline)),
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => Err(StoreError::Stopped),
        }
    }

    fn stalled(&self, waited: Duration) -> StoreError {
        self.writer.state.refused.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(
            waited_ms = waited.as_millis() as u64,
            "a write was not acknowledged in time"
        );
        StoreError::Stalled { waited }
    }

    /// Sets how long a caller waits for its write (default [`WRITE_DEADLINE`]) and after
    /// how long a round makes the store unhealthy (default [`STALL_AFTER`]).
    pub fn set_limits(&self, deadline: Duration, stall_after: Duration) {
        let state = &self.writer.state;
        let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1);
        state.deadline_ms.store(ms(deadline), Ordering::Relaxed);
        state.stall_after_ms.store(ms(stall_after), Ordering::Relaxed);
    }

    /// How the writer is doing.
    pub fn health(&self) -> WriterHealth {
        self.writer.health()
    }

    /// Holds the writer until the returned sender is dropped (tests of a stalled store).
    #[cfg(test)]
    pub(crate) fn hold_writer(&self) -> std::sync::mpsc::Sender<()> {
        let (hold, release) = std::sync::mpsc::channel();
        let _ = self.writer.enqueue(Request::Hold(release));
        hold
    }
}

/// Records of one kind by key, in key order.
pub struct Tree<T> {
    name: &'static str,
    tree: sled::Tree,
    db: Db,
    _records: std::marker::PhantomData<fn() -> T>,
}

impl<T> Clone for Tree<T> {
    fn clone(&self) -> Self {
        Tree {
            name: self.name,
            tree: self.tree.clone(),
            db: self.db.clone(),
            _records: std::marker::PhantomData,
        }
    }
}

impl<T: Serialize + DeserializeOwned> Tree<T> {
    /// Writes `record` under `key`; returns once it is on disk.
    ///
    /// Errors: see [`Db::commit`].
    pub async fn put(&self, key: &str, record: &T) -> Result<(), StoreError> {
        let mut batch = WriteBatch::new();
        batch.put(self, key, record);
        self.db.commit(batch).await
    }

    /// [`Tree::put`] from synchronous code (see [`Db::commit_blocking`]).
    pub fn put_blocking(&self, key: &str, record: &T) -> Result<(), StoreError> {
        let mut batch = WriteBatch::new();
        batch.put(self, key, record);
        self.db.commit_blocking(batch)
    }

    /// Removes the record under `key`, from synchronous code (see
    /// [`Db::commit_blocking`]).
    pub fn remove_blocking(&self, key: &str) -> Result<(), StoreError> {
        let mut batch = WriteBatch::new();
        batch.remove(self, key);
        self.db.commit_blocking(batch)
    }

    /// Writes `record` under `key` without waiting for the disk: for records that may
    /// be lost in a crash (the next flush of the writer, or sled's own within half a
    /// second, takes them).
    pub fn insert_lazily(&self, key: &str, record: &T) -> Result<(), StoreError> {
        self.tree.insert(key.as_bytes(), encode(record))?;
        Ok(())
    }

    /// The database it is in.
    pub fn db(&self) -> &Db {
        &self.db
    }

    /// The record under `key`.
    pub fn get(&self, key: &str) -> Result<Option<T>, StoreError> {
        self.tree
            .get(key.as_bytes())?
            .map(|bytes| self.decode(key.as_bytes(), &bytes))
            .transpose()
    }

    /// Every record, in key order.
    pub fn all(&self) -> Result<Vec<T>, StoreError> {
        self.tree
            .iter()
            .map(|item| {
                let (key, value) = item?;
                self.decode(&key, &value)
            })
            .collect()
    }

    /// The records whose keys start with `prefix`, in key order, with their keys.
    pub fn prefixed(&self, prefix: &str) -> impl Iterator<Item = Result<(String, T), StoreError>> + '_ {
        self.tree.scan_prefix(prefix.as_bytes()).map(|item| {
            let (key, value) = item?;
            let record = self.decode(&key, &value)?;
            Ok((String::from_utf8_lossy(&key).into_owned(), record))
        })
    }

    /// The records whose keys are at least `from` and below `to`, in key order, with
    /// their keys, read as they are iterated.
    pub fn between(&self, from: &str, to: &str) -> impl Iterator<Item = Result<(String, T), StoreError>> + '_ {
        self.tree
            .range(from.as_bytes().to_vec()..to.as_bytes().to_vec())
            .map(|item| {
                let (key, value) = item?;
                let record = self.decode(&key, &value)?;
                Ok((String::from_utf8_lossy(&key).into_owned(), record))
            })
    }

    /// Records newest (last key) first, from just before the key `before` (or the
    /// end), read as they are iterated.
    pub fn newest_first(&self, before: Option<&str>) -> impl Iterator<Item = Result<T, StoreError>> + '_ {
        let range = match before {
            Some(key) => self.tree.range(..key.as_bytes().to_vec()),
            None => self.tree.range::<Vec<u8>, _>(..),
        };
        range.rev().map(|item| {
            let (key, value) = item?;
            self.decode(&key, &value)
        })
    }

    /// How many records there are.
    pub fn len(&self) -> usize {
        self.tree.len()
    }

    /// Whether there is none.
    pub fn is_empty(&self) -> bool {
        self.tree.is_empty()
    }

    fn decode(&self, key: &[u8], bytes: &[u8]) -> Result<T, StoreError> {
        decode(self.name, key, bytes)
    }
}

/// A record as stored under `key` of `tree`: the format byte, then JSON.
pub(crate) fn decode<T: DeserializeOwned>(tree: &'static str, key: &[u8], bytes: &[u8]) -> Result<T, StoreError> {
    let corrupt = |reason: String| StoreError::Corrupt {
        tree,
        key: String::from_utf8_lossy(key).into_owned(),
        reason,
    };
    match bytes.split_first() {
        Some((&RECORD_VERSION, json)) => serde_json::from_slice(json).map_err(|e| corrupt(e.to_string())),
        Some((version, _)) => Err(corrupt(format!(
            "written in record format {version}, which this skein (format {RECORD_VERSION}) cannot read; upgrade skein"
        ))),
        None => Err(corrupt("empty".to_owned())),
    }
}

/// The stored form of a record: the format byte, then JSON.
pub(crate) fn encode<T: Serialize>(record: &T) -> Vec<u8> {
    let mut bytes = vec![RECORD_VERSION];
    // Serializing our own records to JSON cannot fail (string keys, no non-finite
    // floats reach them); an empty record would be refused on read.
    if let Err(error) = serde_json::to_writer(&mut bytes, record) {
        tracing::error!(%error, "a record could not be serialized");
    }
    bytes
}

#[cfg(test)]
mod tests;
