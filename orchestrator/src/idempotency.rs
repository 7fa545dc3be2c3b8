//! Idempotent creates: the `Idempotency-Key` of the POST routes that create something
//! (runs, sessions, tokens).
//!
//! A key is remembered per route and user, with the SHA-256 of the request it came with
//! and the id of what it created, in the same atomic write as the thing created (so a
//! `kill -9` between the write and the answer leaves both or neither). A retry with the
//! same key and request gets what was created the first time; the same key with another
//! request is refused (409), as is a retry while the first request is still in
//! progress (409, retry shortly).

use std::collections::HashSet;
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

use crate::base::{UnixMs, lock, sha256_hex_bytes};
use crate::store::{Db, StoreError, Tree, WriteBatch};

/// The longest idempotency key accepted, in bytes.
pub const MAX_IDEMPOTENCY_KEY: usize = 256;

/// Checks an idempotency key: 1 to [`MAX_IDEMPOTENCY_KEY`] bytes of printable ASCII.
///
/// Errors: what is wrong with the key, worded to follow "the idempotency key".
pub fn check_key(key: &str) -> Result<(), &'static str> {
    if key.is_empty() {
        Err("is empty")
    } else if key.len() > MAX_IDEMPOTENCY_KEY {
        Err("is longer than 256 bytes")
    } else if !key.bytes().all(|b| b.is_ascii_graphic()) {
        Err("must be printable ASCII without spaces (a UUID is a good key)")
    } else {
        Ok(())
    }
}

/// An `Idempotency-Key` and the request it came with.
#[derive(Debug, Clone, Copy)]
pub struct Idempotent<'a> {
    /// The key.
    pub key: &'a str,
    /// The request's bytes, as sent.
    pub request: &'a [u8],
}

/// What a key created.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyRecord {
    /// The SHA-256 of the request that came with the key (hex).
    pub request_sha256: String,
    /// The id of what it created.
    pub created: String,
    /// When.
    pub at: UnixMs,
}

/// Why a keyed request was refused.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    /// The key is malformed.
    #[error("the Idempotency-Key {0}")]
    Malformed(&'static str),
    /// The key came with another request before.
    #[error(
        "the Idempotency-Key `{key}` was used before with a different request (it created `{created}`); help: use a new key for a new request"
    )]
    Mismatch {
        /// The key.
        key: String,
        /// What it created.
        created: String,
    },
    /// A request with this key is in progress.
    #[error("a request with the Idempotency-Key `{0}` is in progress; help: retry in a second")]
    InProgress(String),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// The keys of one kind of create.
pub struct IdempotencyKeys {
    tree: Tree<KeyRecord>,
    /// Keys whose first request is being served (the slot names).
    in_progress: Mutex<HashSet<String>>,
}

impl std::fmt::Debug for IdempotencyKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IdempotencyKeys").finish_non_exhaustive()
    }
}

/// What [`IdempotencyKeys::claim`] found.
#[derive(Debug)]
pub enum Claim<'a> {
    /// The key is new: create, and add [`Pending::record`] to the same write.
    New(Pending<'a>),
    /// The key created this before, with the same request.
    Replay(KeyRecord),
}

/// A key being served; dropping it lets the next request with the key in.
#[derive(Debug)]
pub struct Pending<'a> {
    keys: &'a IdempotencyKeys,
    slot: String,
    request_sha256: String,
}

impl Pending<'_> {
    /// Adds the key (and that it created `created`) to `batch`.
    pub fn record(&self, batch: &mut WriteBatch, created: &str, now: UnixMs) {
        batch.put(
            &self.keys.tree,
            &self.slot,
            &KeyRecord {
                request_sha256: self.request_sha256.clone(),
                created: created.to_owned(),
                at: now,
            },
        );
    }
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        lock(&self.keys.in_progress).remove(&self.slot);
    }
}

impl IdempotencyKeys {
    /// The keys stored in `db`'s tree `name`.
    ///
    /// Errors: the store fails.
    pub fn open(db: &Db, name: &'static str) -> Result<IdempotencyKeys, StoreError> {
        Ok(IdempotencyKeys {
            tree: db.tree(name)?,
            in_progress: Mutex::default(),
        })
    }

    /// Looks up `key` of `owner` for `request` (the request's bytes, as sent).
    ///
    /// Errors: [`KeyError::Malformed`], [`KeyError::Mismatch`], [`KeyError::InProgress`],
    /// [`KeyError::Store`].
    pub fn claim(&self, owner: &str, Idempotent { key, request }: Idempotent<'_>) -> Result<Claim<'_>, KeyError> {
        if let Err(reason) = check_key(key) {
            return Err(KeyError::Malformed(reason));
        }
        let slot = format!("{owner}/{key}");
        let request_sha256 = sha256_hex_bytes(request);
        if !lock(&self.in_progress).insert(slot.clone()) {
            return Err(KeyError::InProgress(key.to_owned()));
        }
        let pending = Pending {
            keys: self,
            slot,
            request_sha256,
        };
        // Read after the slot is ours: a first request that finished just before has
        // stored its key by now.
        match self.tree.get(&pending.slot)? {
            None => Ok(Claim::New(pending)),
            Some(found) if found.request_sha256 == pending.request_sha256 => Ok(Claim::Replay(found)),
            Some(found) => Err(KeyError::Mismatch {
                key: key.to_owned(),
                created: found.created,
            }),
        }
    }
}
