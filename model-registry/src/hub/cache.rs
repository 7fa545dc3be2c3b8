//! Skein's metadata cache, beside the Hugging Face cache: the header bytes that range
//! reads fetched, keyed by repository, commit and file, and the hub's answers that
//! planning needs (revision → commit and file list, quantized derivatives).
//!
//! Layout under `<HF cache>/skein/`:
//!
//! ```text
//! headers/models--owner--name/<sha>/<file>.header   raw header prefix of a weight file
//! refs/models--owner--name/<revision>.json           a ResolvedRepo, stamped
//! derivatives/models--owner--name.json               quantized derivatives, stamped
//! ```
//!
//! Header bytes are stored raw and parsed again on every use, so the parsers stay the
//! only authority on the format and a cache written by an older Skein cannot smuggle in
//! a stale interpretation. Every write goes to a temporary file and is renamed into
//! place, so a reader sees a whole entry or none, even with concurrent Skein processes.
//! The cache is an optimisation: failing to write it is logged, and an unreadable entry
//! is a miss.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::repo::{CommitSha, RepoId};

/// The folder under the Hugging Face cache that Skein owns.
const SKEIN_DIR: &str = "skein";

/// A cached answer with the time it was fetched.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Stamped<T> {
    /// Seconds since the Unix epoch when the hub gave the answer.
    pub fetched_at_unix_s: u64,
    /// The answer.
    pub value: T,
}

impl<T> Stamped<T> {
    pub(crate) fn now(value: T) -> Stamped<T> {
        Stamped {
            fetched_at_unix_s: unix_now_s(),
            value,
        }
    }

    /// Whether the answer is younger than `max_age`. An entry from the future (a clock
    /// set back) counts as fresh.
    pub(crate) fn is_fresh(&self, max_age: Duration) -> bool {
        unix_now_s().saturating_sub(self.fetched_at_unix_s) < max_age.as_secs()
    }
}

fn unix_now_s() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_secs())
}

/// Paths and atomic reads and writes of the metadata cache.
#[derive(Debug, Clone)]
pub(crate) struct MetadataCache {
    root: PathBuf,
}

impl MetadataCache {
    pub(crate) fn new(hf_cache_dir: &Path) -> MetadataCache {
        MetadataCache {
            root: hf_cache_dir.join(SKEIN_DIR),
        }
    }

    /// `headers/models--owner--name/<sha>/<file>.header`. `file` is a repository path
    /// checked to stay inside the repository, so joining it is safe.
    pub(crate) fn header_path(&self, repo: &RepoId, sha: &CommitSha, file: &str) -> PathBuf {
        let mut path = self.root.join("headers").join(repo.cache_folder()).join(sha.as_str());
        path.extend(file.split('/'));
        path.as_mut_os_string().push(".header");
        path
    }

    /// `refs/models--owner--name/<revision>.json`, the revision escaped to one file name.
    pub(crate) fn ref_path(&self, repo: &RepoId, revision: &str) -> PathBuf {
        self.root
            .join("refs")
            .join(repo.cache_folder())
            .join(format!("{}.json", escape_file_name(revision)))
    }

    /// `derivatives/models--owner--name.json`.
    pub(crate) fn derivatives_path(&self, repo: &RepoId) -> PathBuf {
        self.root
            .join("derivatives")
            .join(format!("{}.json", repo.cache_folder()))
    }

    /// The bytes at `path`, or `None` if there is no such entry or it cannot be read.
    pub(crate) async fn read(&self, path: &Path) -> Option<Vec<u8>> {
        match tokio::fs::read(path).await {
            Ok(bytes) => Some(bytes),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => None,
            Err(error) => {
                tracing::warn!(path = %path.display(), %error, "cannot read the hub metadata cache; treating it as a miss");
                None
            }
        }
    }

    /// A JSON entry, or `None` if it is missing or does not parse (a partial or foreign
    /// file is a miss, not an error).
    pub(crate) async fn read_json<T: DeserializeOwned>(&self, path: &Path) -> Option<T> {
        let bytes = self.read(path).await?;
        match serde_json::from_slice(&bytes) {
            Ok(value) => Some(value),
            Err(error) => {
                tracing::warn!(path = %path.display(), %error, "ignoring an unreadable hub metadata cache entry");
                None
            }
        }
    }

    /// Writes `bytes` to `path` atomically (temporary file, then rename). Failures are
    /// logged: the cache only saves work.
    pub(crate) async fn write(&self, path: &Path, bytes: &[u8]) {
        if let Err(error) = write_atomic(path, bytes).await {
            tracing::warn!(path = %path.display(), %error, "cannot write the hub metadata cache");
        }
    }

    pub(crate) async fn write_json<T: Serialize>(&self, path: &Path, value: &T) {
        match serde_json::to_vec(value) {
            Ok(bytes) => self.write(path, &bytes).await,
            Err(error) => tracing::warn!(path = %path.display(), %error, "cannot serialize a hub metadata cache entry"),
        }
    }

    /// Removes an entry found to be corrupt, so the next run fetches it again.
    pub(crate) async fn remove(&self, path: &Path) {
        if let Err(error) = tokio::fs::remove_file(path).await
            && error.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(path = %path.display(), %error, "cannot remove a corrupt hub metadata cache entry");
        }
    }
}

async fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    /// Distinguishes temporary files of concurrent writes within one process; the
    /// process id distinguishes processes.
    static NEXT_TEMP: AtomicU64 = AtomicU64::new(0);

    let parent = path
        .parent()
        .ok_or_else(|| std::io::Error::other("cache path has no parent"))?;
    tokio::fs::create_dir_all(parent).await?;
    let mut temp = path.as_os_str().to_owned();
    temp.push(format!(
        ".tmp.{}.{}",
        std::process::id(),
        NEXT_TEMP.fetch_add(1, Ordering::Relaxed)
    ));
    let temp = PathBuf::from(temp);
    let written = async {
        tokio::fs::write(&temp, bytes).await?;
        tokio::fs::rename(&temp, path).await
    }
    .await;
    if written.is_err() {
        // Best effort: a leftover temporary file is harmless but untidy.
        let _ = tokio::fs::remove_file(&temp).await;
    }
    written
}

/// Escapes a revision (`main`, `v1.0`, `refs/pr/1`) to a single portable file name:
/// letters, digits, `-`, `_` and `.` stay, every other byte becomes `%XX`, and a name
/// made only of dots is escaped whole.
fn escape_file_name(revision: &str) -> String {
    let only_dots = revision.bytes().all(|b| b == b'.');
    let mut name = String::with_capacity(revision.len());
    for byte in revision.bytes() {
        if (byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'_' | b'.')) && !only_dots {
            name.push(char::from(byte));
        } else {
            name.push_str(&format!("%{byte:02X}"));
        }
    }
    name
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn revisions_escape_to_one_file_name() {
        assert_eq!(escape_file_name("main"), "main");
        assert_eq!(escape_file_name("v1.0-rc_2"), "v1.0-rc_2");
        assert_eq!(escape_file_name("refs/pr/1"), "refs%2Fpr%2F1");
        assert_eq!(escape_file_name(".."), "%2E%2E");
        assert_eq!(escape_file_name(""), "");
    }

    #[test]
    fn header_paths_keep_the_repository_layout() {
        let cache = MetadataCache::new(Path::new("/hf/hub"));
        let repo = RepoId::parse("owner/name").unwrap();
        let sha = CommitSha::parse(&"0".repeat(40)).unwrap();
        assert_eq!(
            cache.header_path(&repo, &sha, "gguf/q4.gguf"),
            Path::new("/hf/hub/skein/headers/models--owner--name")
                .join("0".repeat(40))
                .join("gguf/q4.gguf.header")
        );
    }

    #[tokio::test]
    async fn writes_are_atomic_and_readable() {
        let dir = tempfile::tempdir().unwrap();
        let cache = MetadataCache::new(dir.path());
        let path = dir.path().join("skein/refs/x/main.json");
        cache.write_json(&path, &Stamped::now(vec![1, 2, 3])).await;
        let read: Stamped<Vec<u8>> = cache.read_json(&path).await.unwrap();
        assert_eq!(read.value, [1, 2, 3]);
        assert!(read.is_fresh(Duration::from_secs(60)));
        assert!(!read.is_fresh(Duration::ZERO));
        let leftovers: Vec<_> = std::fs::read_dir(path.parent().unwrap()).unwrap().collect();
        assert_eq!(leftovers.len(), 1, "no temporary file is left behind");
        std::fs::write(&path, b"{not json").unwrap();
        assert!(cache.read_json::<Stamped<Vec<u8>>>(&path).await.is_none());
    }
}
