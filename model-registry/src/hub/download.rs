//! [`HubClient::download`]: whole files (weights included) into the Hugging Face cache,
//! for the engines, which need a model directory on disk.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Mutex, PoisonError};

use super::client::HubClient;
use crate::Error;
use crate::repo::ResolvedRepo;

/// Where a download stands, reported after every chunk received.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DownloadProgress {
    /// The file being transferred.
    pub file: String,
    /// Bytes of it received so far.
    pub file_bytes_done: u64,
    /// Its size on the hub.
    pub file_bytes: u64,
    /// Bytes received so far over all the files of the call (files already in the cache
    /// count as received).
    pub bytes_done: u64,
    /// The size of all the files of the call.
    pub bytes_total: u64,
}

impl HubClient {
    /// Downloads `files` of the resolved commit into the Hugging Face cache, in its
    /// standard layout (`models--owner--name/blobs/…` and `snapshots/<sha>/<file>`), and
    /// returns the snapshot folder, which then holds every file asked for. Files already
    /// in the cache cost no request, so a second call transfers nothing. `progress` hears
    /// about every chunk received.
    ///
    /// Unlike the metadata calls, a transfer is not limited by the request timeout: a
    /// checkpoint of many gigabytes takes as long as it takes.
    ///
    /// The hub's answer for each file is checked before a path is made of it (see
    /// `transfer`): a hostile hub cannot write outside the cache.
    ///
    /// Errors: [`Error::HubFileMissing`] for a file the commit does not have (checked for
    /// all files before anything is transferred), [`Error::HubOffline`] when offline and
    /// a file is not cached, [`Error::HubUntrustedAnswer`] when the hub's answer would
    /// put a file outside the cache, [`Error::HubStatus`], [`Error::HubTransfer`] or
    /// [`Error::HubTimeout`] when a transfer fails, [`Error::HubCacheWrite`] when the
    /// cache cannot be written.
    #[tracing::instrument(skip(self, resolved, progress), fields(repo = %resolved.repo, sha = %resolved.sha))]
    pub async fn download(
        &self,
        resolved: &ResolvedRepo,
        files: &[String],
        progress: impl Fn(DownloadProgress) + Send + Sync + 'static,
    ) -> Result<PathBuf, Error> {
        let mut sizes = BTreeMap::new();
        for file in files {
            let listed = resolved.file(file).ok_or_else(|| Error::HubFileMissing {
                repo: resolved.repo.to_string(),
                sha: resolved.sha.to_string(),
                file: file.clone(),
            })?;
            sizes.insert(file.as_str(), listed.size);
        }
        let bytes_total = sizes.values().sum();
        let report = progress;
        let sha = resolved.sha.as_str();
        let mut bytes_before = 0u64;
        for (&file, &file_bytes) in &sizes {
            if self.cached_snapshot(resolved, file).is_none() {
                if self.config().offline {
                    return Err(self.offline_miss(&resolved.repo, format!("`{file}` at commit {sha}")));
                }
                self.count_call();
                let last = Mutex::new(0u64);
                let on_bytes = |received: u64| {
                    let done = received.min(file_bytes);
                    let mut last = last.lock().unwrap_or_else(PoisonError::into_inner);
                    if done <= *last {
                        return;
                    }
                    *last = done;
                    report(DownloadProgress {
                        file: file.to_owned(),
                        file_bytes_done: done,
                        file_bytes,
                        bytes_done: bytes_before + done,
                        bytes_total,
                    });
                };
                self.fetch_file(resolved, file, &on_bytes).await?;
            }
            bytes_before += file_bytes;
            report(DownloadProgress {
                file: file.to_owned(),
                file_bytes_done: file_bytes,
                file_bytes,
                bytes_done: bytes_before,
                bytes_total,
            });
        }
        Ok(self
            .config()
            .cache_dir
            .join(resolved.repo.cache_folder())
            .join("snapshots")
            .join(sha))
    }
}
