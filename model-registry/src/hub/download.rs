//! [`HubClient::download`]: whole files (weights included) into the Hugging Face cache,
//! for the built-in engine, which needs a model directory on disk.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};

use hf_hub::progress::{DownloadEvent, ProgressEvent, ProgressHandler};

use super::client::HubClient;
use super::repo::ResolvedRepo;
use crate::Error;

/// Where a download stands, reported after every chunk hf-hub writes.
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

/// The hf-hub progress handler of one file: turns its per-file deltas into
/// [`DownloadProgress`] values with running totals.
struct FileHandler<F> {
    report: Arc<F>,
    file: String,
    file_bytes: u64,
    bytes_before: u64,
    bytes_total: u64,
    last: Mutex<u64>,
}

impl<F: Fn(DownloadProgress) + Send + Sync + 'static> ProgressHandler for FileHandler<F> {
    fn on_progress(&self, event: &ProgressEvent) {
        let ProgressEvent::Download(DownloadEvent::Progress { files }) = event else {
            return;
        };
        for file in files.iter().filter(|file| file.filename == self.file) {
            let done = file.bytes_completed.min(self.file_bytes);
            let mut last = self.last.lock().unwrap_or_else(PoisonError::into_inner);
            if done <= *last {
                continue;
            }
            *last = done;
            (self.report)(DownloadProgress {
                file: self.file.clone(),
                file_bytes_done: done,
                file_bytes: self.file_bytes,
                bytes_done: self.bytes_before + done,
                bytes_total: self.bytes_total,
            });
        }
    }
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
    /// Errors: [`Error::HubFileMissing`] for a file the commit does not have (checked for
    /// all files before anything is transferred), [`Error::HubOffline`] when offline and
    /// a file is not cached, [`Error::Hub`] when a transfer fails.
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
        let report = Arc::new(progress);
        let hf_repo = self.hf().model(resolved.repo.owner(), resolved.repo.name());
        let sha = resolved.sha.as_str();
        let mut bytes_before = 0u64;
        for (&file, &file_bytes) in &sizes {
            let cached = hf_repo
                .download_file()
                .filename(file)
                .revision(sha)
                .local_files_only(true)
                .send()
                .await;
            if cached.is_err() {
                if self.config().offline {
                    return Err(self.offline_miss(&resolved.repo, format!("`{file}` at commit {sha}")));
                }
                let handler = FileHandler {
                    report: Arc::clone(&report),
                    file: file.to_owned(),
                    file_bytes,
                    bytes_before,
                    bytes_total,
                    last: Mutex::new(0),
                };
                self.count_transfer(file_bytes);
                hf_repo
                    .download_file()
                    .filename(file)
                    .revision(sha)
                    .progress(handler)
                    .send()
                    .await
                    .map_err(|source| Error::Hub {
                        repo: resolved.repo.to_string(),
                        action: format!("download `{file}` at commit {sha}"),
                        source: Box::new(source),
                    })?;
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
