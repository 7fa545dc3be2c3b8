//! Durable state in sled, behind a small API: one database per orchestrator (in its data
//! directory), one tree per kind of record. Every write this module acknowledges has
//! been flushed to disk, so it survives a `kill -9` of the orchestrator.
//!
//! Records are JSON after a one-byte format version, so a later version can read (and
//! migrate) what an earlier one wrote.

use std::path::{Path, PathBuf};

use serde::Serialize;
use serde::de::DeserializeOwned;

/// The record format written today.
pub const RECORD_VERSION: u8 = 1;

/// Page cache sled may use by default (sled's own default is 1 GiB); a server sets its
/// own with `--db-cache-mib`.
pub const CACHE_BYTES: u64 = 64 << 20;

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
}

/// The orchestrator's database.
#[derive(Clone)]
pub struct Db {
    db: sled::Db,
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
    pub fn open_with_cache(dir: &Path, cache_bytes: u64) -> Result<Db, StoreError> {
        let db = sled::Config::new()
            .path(dir)
            .cache_capacity(cache_bytes)
            .open()
            .map_err(|source| StoreError::Open {
                path: dir.to_owned(),
                source,
            })?;
        Ok(Db { db })
    }

    /// A database in memory, gone when dropped (tests, `skein plan`).
    pub fn temporary() -> Result<Db, StoreError> {
        Ok(Db {
            db: sled::Config::new().temporary(true).open()?,
        })
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
            db: self.db.clone(),
            _records: std::marker::PhantomData,
        })
    }
}

/// Records of one kind by key, in key order.
pub struct Tree<T> {
    name: &'static str,
    tree: sled::Tree,
    db: sled::Db,
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
    /// Writes `record` under `key` and flushes it to disk before returning.
    pub async fn put(&self, key: &str, record: &T) -> Result<(), StoreError> {
        self.tree.insert(key.as_bytes(), encode(record))?;
        self.db.flush_async().await?;
        Ok(())
    }

    /// Writes `record` under `key` and flushes, from synchronous code.
    pub fn put_blocking(&self, key: &str, record: &T) -> Result<(), StoreError> {
        self.tree.insert(key.as_bytes(), encode(record))?;
        self.db.flush()?;
        Ok(())
    }

    /// Removes the record under `key` and flushes, from synchronous code.
    pub fn remove_blocking(&self, key: &str) -> Result<(), StoreError> {
        self.tree.remove(key.as_bytes())?;
        self.db.flush()?;
        Ok(())
    }

    /// Writes `record` under `key` without waiting for the disk: for records that may
    /// be lost in a crash (sled flushes them within half a second anyway).
    pub fn insert_lazily(&self, key: &str, record: &T) -> Result<(), StoreError> {
        self.tree.insert(key.as_bytes(), encode(record))?;
        Ok(())
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
mod tests {
    use super::*;

    #[tokio::test]
    async fn records_round_trip_and_a_newer_format_is_refused_clearly() {
        let dir = tempfile::tempdir().unwrap();
        let db = Db::open(dir.path()).unwrap();
        let tree: Tree<Vec<u32>> = db.tree("numbers").unwrap();
        tree.put("b", &vec![2]).await.unwrap();
        tree.put("a", &vec![1]).await.unwrap();
        assert_eq!(tree.all().unwrap(), vec![vec![1], vec![2]]);
        assert_eq!(tree.get("a").unwrap(), Some(vec![1]));
        assert_eq!(tree.get("z").unwrap(), None);

        tree.tree.insert("c", vec![9u8, b'1']).unwrap();
        let error = tree.get("c").unwrap_err().to_string();
        assert!(error.contains("record format 9"), "{error}");
        drop(tree);
        drop(db);
        // Reopened: still there.
        let db = Db::open(dir.path()).unwrap();
        let tree: Tree<Vec<u32>> = db.tree("numbers").unwrap();
        assert_eq!(tree.get("b").unwrap(), Some(vec![2]));
    }
}
