//! Whole-file transfers into the Hugging Face cache, done here rather than by hf-hub,
//! because the hub's answer names the files written.
//!
//! A download's cache paths come from the hub's answer: the blob is `blobs/<ETag>` and
//! the pointer `snapshots/<X-Repo-Commit>/<file>`. hf-hub 1.0 joins both headers into
//! paths as they arrive (`download_file_to_cache_network`, `create_pointer_symlink`), so
//! a hostile hub, or anything between it and us, can write files outside the cache (an
//! ETag of `"../../x/etag"`) or replace a file with a symlink (a commit of `../..`). Its
//! HEAD request uses a client of its own that cannot be wrapped, and checking with a HEAD
//! of our own before its download would not help: the hub could answer the second HEAD
//! differently. So Skein does the two requests itself and checks the answer before any
//! path is built:
//!
//! - `X-Repo-Commit` must be the commit asked for (40 hex digits, as resolved);
//! - the ETag (`X-Linked-Etag`, else `ETag`, with a `W/` prefix and quotes removed, as
//!   hf-hub and the Python client read it) must be a hex digest: a git blob id (40) or a
//!   SHA-256 (64).
//!
//! A file listed larger than
//! [`HubConfig::download_chunk_bytes`](super::HubConfig::download_chunk_bytes) is fetched in Range
//! requests of that size from the checked URL, a few at once, each written at its offset
//! in the partial file: a CDN serving files of many gigabytes expects ranges, and a broken
//! connection costs one range, which is tried again. Each answer must be a `206` whose
//! `Content-Range` is the range asked for of the listed size, and, when the hub itself
//! answers, whose ETag is the one checked; anything else stops the download.
//!
//! The cache layout is the standard one (`blobs/<etag>`, a relative symlink in
//! `snapshots/<sha>/`, a lock in `.locks/`), so hf-hub, the Python client and vLLM find
//! the files. hf-hub still does what builds no path: API calls and range reads.

use std::io::SeekFrom;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures::StreamExt;
use reqwest::header::{CONTENT_RANGE, HeaderMap, HeaderValue, LOCATION, RANGE};
use reqwest::{StatusCode, Url};
use tokio::io::{AsyncSeekExt, AsyncWriteExt};

use super::client::HubClient;
use crate::Error;
use crate::repo::{CommitSha, ResolvedRepo};

/// Relative redirects followed on a file's `HEAD` (the hub answers a repository id in
/// another casing with one), as hf-hub does.
const MAX_RELATIVE_REDIRECTS: usize = 10;

/// The longest a header value is quoted in an error.
const MAX_QUOTED_VALUE: usize = 200;

/// Header names of a file answer.
const X_REPO_COMMIT: &str = "x-repo-commit";
const X_LINKED_ETAG: &str = "x-linked-etag";
const ETAG: &str = "etag";

/// Range requests of one file in flight at once.
const RANGES_IN_FLIGHT: usize = 4;

/// What a file's `HEAD` said, checked.
struct FileAnswer {
    /// The URL the bytes are fetched from (after relative redirects).
    url: Url,
    /// The ETag: a hex digest, safe as a file name.
    etag: String,
}

/// Why a header value is refused, or `None` when it is a valid commit id for `asked`.
fn commit_problem(value: &str, asked: &CommitSha) -> Option<&'static str> {
    if CommitSha::parse(value).is_none() {
        Some("is not a commit id (40 lowercase hex digits)")
    } else if value != asked.as_str() {
        Some("is not the commit asked for")
    } else {
        None
    }
}

/// The ETag as hf-hub and the Python client normalise it (`W/` and quotes removed), if it
/// is a hex digest of a git blob (40 digits) or a SHA-256 (64): the only forms the hub
/// sends, and safe as a file name.
fn normalized_etag(raw: &str) -> Result<String, &'static str> {
    let value = raw.strip_prefix("W/").unwrap_or(raw).trim_matches('"');
    let hex = value.bytes().all(|b| b.is_ascii_hexdigit());
    if hex && matches!(value.len(), 40 | 64) {
        Ok(value.to_owned())
    } else {
        Err("is not a quoted hex digest (40 or 64 hex digits)")
    }
}

/// A header value as an error shows it: escaped, and cut at [`MAX_QUOTED_VALUE`] chars.
fn quoted(value: &[u8]) -> String {
    let text = String::from_utf8_lossy(value);
    let mut shown: String = text.chars().take(MAX_QUOTED_VALUE).collect();
    if text.chars().count() > MAX_QUOTED_VALUE {
        shown.push('…');
    }
    format!("{shown:?}")
}

/// The relative target of the pointer `snapshots/<sha>/<file>`: `../` up to the
/// repository folder, then `blobs/<etag>`.
fn pointer_target(file: &str, etag: &str) -> PathBuf {
    let depth = 2 + file.matches('/').count();
    let mut target = PathBuf::new();
    for _ in 0..depth {
        target.push("..");
    }
    target.join("blobs").join(etag)
}

impl HubClient {
    /// The snapshot path of `file` at the resolved commit, if the cache has it.
    pub(crate) fn cached_snapshot(&self, resolved: &ResolvedRepo, file: &str) -> Option<PathBuf> {
        let path = self.snapshot_path(resolved, file);
        // `exists` follows the pointer: a pointer to a missing blob is not cached.
        path.exists().then_some(path)
    }

    fn repo_folder(&self, resolved: &ResolvedRepo) -> PathBuf {
        self.config().cache_dir.join(resolved.repo.cache_folder())
    }

    fn snapshot_path(&self, resolved: &ResolvedRepo, file: &str) -> PathBuf {
        self.repo_folder(resolved)
            .join("snapshots")
            .join(resolved.sha.as_str())
            .join(file)
    }

    /// The error for a header refused in the answer for `file`.
    fn untrusted(
        resolved: &ResolvedRepo,
        file: &str,
        header: &'static str,
        value: &[u8],
        reason: &'static str,
    ) -> Error {
        Error::HubUntrustedAnswer {
            repo: resolved.repo.to_string(),
            file: file.to_owned(),
            header,
            value: quoted(value).into_boxed_str(),
            reason,
        }
    }

    /// `HEAD` of `file` at the resolved commit, following relative redirects, under the
    /// request timeout, with retries for a hub that cannot be reached or fails; the
    /// answer's commit and ETag are checked before anything else reads them.
    async fn head_file(&self, resolved: &ResolvedRepo, file: &str) -> Result<FileAnswer, Error> {
        let transfers = self.transfers();
        let action = || format!("read the headers of `{file}` at commit {}", resolved.sha);
        let mut url = self.file_url(resolved, file)?;
        let mut redirects = 0;
        let response = loop {
            let response = self
                .with_retries(resolved, &action, || {
                    transfers.head.head(url.clone()).headers(transfers.auth.clone()).send()
                })
                .await?;
            let relative = response
                .headers()
                .get(LOCATION)
                .and_then(|location| location.to_str().ok())
                .filter(|location| response.status().is_redirection() && is_relative(location))
                .map(str::to_owned);
            match relative {
                Some(location) if redirects < MAX_RELATIVE_REDIRECTS => {
                    redirects += 1;
                    url = url.join(&location).map_err(|_| Error::HubResponse {
                        repo: resolved.repo.to_string(),
                        detail: format!("the answer for `{file}` redirects to `{location}`, which is not a URL"),
                    })?;
                }
                Some(_) => {
                    return Err(Error::HubResponse {
                        repo: resolved.repo.to_string(),
                        detail: format!("the answer for `{file}` redirects more than {MAX_RELATIVE_REDIRECTS} times"),
                    });
                }
                None => break response,
            }
        };
        let status = response.status();
        if !status.is_success() && !status.is_redirection() {
            return Err(status_error(resolved, action(), status, &url));
        }
        let headers = response.headers();
        let Some(commit) = headers.get(X_REPO_COMMIT) else {
            return Err(Self::untrusted(resolved, file, "X-Repo-Commit", b"", "is missing"));
        };
        let commit_text = commit.to_str().unwrap_or_default();
        if let Some(reason) = commit_problem(commit_text, &resolved.sha) {
            return Err(Self::untrusted(
                resolved,
                file,
                "X-Repo-Commit",
                commit.as_bytes(),
                reason,
            ));
        }
        let (header, raw) = match (headers.get(X_LINKED_ETAG), headers.get(ETAG)) {
            (Some(linked), _) => ("X-Linked-Etag", linked),
            (None, Some(etag)) => ("ETag", etag),
            (None, None) => return Err(Self::untrusted(resolved, file, "ETag", b"", "is missing")),
        };
        let etag = normalized_etag(raw.to_str().unwrap_or_default())
            .map_err(|reason| Self::untrusted(resolved, file, header, raw.as_bytes(), reason))?;
        Ok(FileAnswer { url, etag })
    }

    /// `{endpoint}/{owner}/{name}/resolve/{sha}/{file}`, each path segment encoded.
    fn file_url(&self, resolved: &ResolvedRepo, file: &str) -> Result<Url, Error> {
        let endpoint = self.config().endpoint.trim_end_matches('/');
        let invalid = || Error::HubResponse {
            repo: resolved.repo.to_string(),
            detail: format!("no download URL can be made of endpoint `{endpoint}` and `{file}`"),
        };
        let mut url = Url::parse(endpoint).map_err(|_| invalid())?;
        url.path_segments_mut()
            .map_err(|()| invalid())?
            .pop_if_empty()
            .extend([
                resolved.repo.owner(),
                resolved.repo.name(),
                "resolve",
                resolved.sha.as_str(),
            ])
            .extend(file.split('/'));
        Ok(url)
    }

    /// Sends a request made by `send` until it gets an answer that is not a transient
    /// failure (no connection, a 5xx or 429), at most [`HubConfig::max_retries`](super::HubConfig::max_retries) more
    /// times, each attempt under the request timeout.
    async fn with_retries<F>(
        &self,
        resolved: &ResolvedRepo,
        action: &dyn Fn() -> String,
        send: impl Fn() -> F,
    ) -> Result<reqwest::Response, Error>
    where
        F: std::future::Future<Output = Result<reqwest::Response, reqwest::Error>>,
    {
        let config = self.config();
        let mut delay = Duration::from_millis(100);
        let mut attempt = 0;
        loop {
            let answer = tokio::time::timeout(config.request_timeout, send()).await;
            let retry = match &answer {
                Ok(Ok(response)) => {
                    response.status().is_server_error() || response.status() == StatusCode::TOO_MANY_REQUESTS
                }
                Ok(Err(error)) => error.is_connect() || error.is_timeout() || error.is_request(),
                Err(_elapsed) => true,
            };
            if !retry || attempt >= config.max_retries {
                return match answer {
                    Ok(Ok(response)) => Ok(response),
                    Ok(Err(source)) => Err(Error::HubTransfer {
                        repo: resolved.repo.to_string(),
                        action: action(),
                        source,
                    }),
                    Err(_elapsed) => Err(Error::HubTimeout {
                        repo: resolved.repo.to_string(),
                        action: action(),
                        timeout_ms: u64::try_from(config.request_timeout.as_millis()).unwrap_or(u64::MAX),
                    }),
                };
            }
            attempt += 1;
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(Duration::from_secs(5));
        }
    }

    /// Puts `file` of the resolved commit into the cache, unless it is there, and returns
    /// its snapshot path; `on_bytes` hears the bytes received so far. The hub's answer is
    /// checked before any path is made of it; the file is written under a lock, to a
    /// temporary name, and renamed into place once complete, so a failed transfer leaves
    /// no blob behind.
    ///
    /// Errors: [`Error::HubUntrustedAnswer`] for a commit or ETag header that is not what
    /// the protocol promises, [`Error::HubStatus`], [`Error::HubTransfer`] or
    /// [`Error::HubTimeout`] when the hub fails, [`Error::HubResponse`] for a body of
    /// another size than listed, [`Error::HubCacheWrite`] when the cache cannot be written.
    pub(crate) async fn fetch_file(
        &self,
        resolved: &ResolvedRepo,
        file: &str,
        on_bytes: &(dyn Fn(u64) + Send + Sync),
    ) -> Result<PathBuf, Error> {
        let pointer = self.snapshot_path(resolved, file);
        if pointer.exists() {
            return Ok(pointer);
        }
        let answer = self.head_file(resolved, file).await?;
        let folder = self.repo_folder(resolved);
        let blob = folder.join("blobs").join(&answer.etag);
        if !blob.exists() {
            let locks = self
                .config()
                .cache_dir
                .join(".locks")
                .join(resolved.repo.cache_folder());
            let _lock = lock(&locks, &answer.etag).await?;
            // Another process may have finished it while this one waited.
            if !blob.exists() {
                self.receive(resolved, file, &answer, &blob, on_bytes).await?;
            }
        }
        link(&pointer, &pointer_target(file, &answer.etag))?;
        Ok(pointer)
    }

    /// Downloads the file into `<blob>.incomplete` and renames it to `blob`: with one
    /// `GET`, or, for a file listed larger than [`HubConfig::download_chunk_bytes`](super::HubConfig::download_chunk_bytes), with
    /// Range requests of that size. A failed transfer removes the partial file.
    async fn receive(
        &self,
        resolved: &ResolvedRepo,
        file: &str,
        answer: &FileAnswer,
        blob: &Path,
        on_bytes: &(dyn Fn(u64) + Send + Sync),
    ) -> Result<(), Error> {
        let expected = resolved.file(file).map(|listed| listed.size);
        let partial = blob.with_file_name(format!("{}.incomplete", answer.etag));
        if let Some(parent) = partial.parent() {
            tokio::fs::create_dir_all(parent).await.map_err(write_error(parent))?;
        }
        let chunk = self.config().download_chunk_bytes.max(1);
        let target = Target {
            resolved,
            file,
            answer,
            partial: &partial,
        };
        let received = match expected {
            Some(size) if size > chunk => self.receive_ranges(&target, size, chunk, on_bytes).await,
            _ => self.receive_whole(&target, expected, on_bytes).await,
        };
        if let Err(error) = received {
            let _ = tokio::fs::remove_file(&partial).await;
            return Err(error);
        }
        tokio::fs::rename(&partial, blob).await.map_err(write_error(blob))
    }

    /// One `GET` of the whole file into the partial file, which must end up `expected`
    /// bytes long when the listing gives a size.
    async fn receive_whole(
        &self,
        target: &Target<'_>,
        expected: Option<u64>,
        on_bytes: &(dyn Fn(u64) + Send + Sync),
    ) -> Result<(), Error> {
        let Target {
            resolved,
            file,
            answer,
            partial,
        } = *target;
        let transfers = self.transfers();
        let action = || format!("download `{file}` at commit {}", resolved.sha);
        let mut response = self
            .with_retries(resolved, &action, || {
                transfers
                    .get
                    .get(answer.url.clone())
                    .headers(transfers.auth.clone())
                    .send()
            })
            .await?;
        if !response.status().is_success() {
            return Err(status_error(resolved, action(), response.status(), response.url()));
        }
        let mut out = tokio::fs::File::create(partial).await.map_err(write_error(partial))?;
        let mut received = 0u64;
        while let Some(chunk) = response.chunk().await.map_err(|source| Error::HubTransfer {
            repo: resolved.repo.to_string(),
            action: action(),
            source,
        })? {
            received = received.saturating_add(chunk.len() as u64);
            out.write_all(&chunk).await.map_err(write_error(partial))?;
            self.count_bytes(chunk.len() as u64);
            on_bytes(received);
        }
        out.flush().await.map_err(write_error(partial))?;
        if let Some(size) = expected
            && size != received
        {
            return Err(Error::HubResponse {
                repo: resolved.repo.to_string(),
                detail: format!("`{file}` is listed with {size} bytes, but the download sent {received}"),
            });
        }
        Ok(())
    }

    /// The file, `size` bytes, in Range requests of `chunk` bytes, [`RANGES_IN_FLIGHT`]
    /// at a time, each written at its offset in the partial file. The first range that
    /// fails for good stops the others.
    async fn receive_ranges(
        &self,
        target: &Target<'_>,
        size: u64,
        chunk: u64,
        on_bytes: &(dyn Fn(u64) + Send + Sync),
    ) -> Result<(), Error> {
        let partial = target.partial;
        let out = tokio::fs::File::create(partial).await.map_err(write_error(partial))?;
        out.set_len(size).await.map_err(write_error(partial))?;
        drop(out);
        let received = AtomicU64::new(0);
        let progress = Progress {
            received: &received,
            on_bytes,
        };
        let starts = std::iter::successors(Some(0u64), |&start| {
            start.checked_add(chunk).filter(|&next| next < size)
        });
        let mut ranges = futures::stream::iter(starts.map(|start| {
            let range = start..start.saturating_add(chunk).min(size);
            self.receive_range(target, size, range, &progress)
        }))
        .buffer_unordered(RANGES_IN_FLIGHT);
        while let Some(done) = ranges.next().await {
            done?;
        }
        Ok(())
    }

    /// Bytes `range` of the file into the partial file. A body that breaks off is tried
    /// again from the range's start, at most [`HubConfig::max_retries`](super::HubConfig::max_retries) more times (a
    /// request that gets no answer is retried as every hub call is); an answer that is not
    /// the range asked for is an error at once.
    async fn receive_range(
        &self,
        target: &Target<'_>,
        size: u64,
        range: Range<u64>,
        progress: &Progress<'_>,
    ) -> Result<(), Error> {
        // Bytes of this range already counted in the progress, over all attempts.
        let mut counted = 0u64;
        let mut delay = Duration::from_millis(100);
        let mut attempt = 0;
        loop {
            match self
                .try_range(target, size, range.clone(), progress, &mut counted)
                .await
            {
                Ok(()) => return Ok(()),
                Err(RangeFailure::Broken(error)) if attempt < self.config().max_retries => {
                    tracing::debug!(file = target.file, start = range.start, %error, "a range transfer broke off; trying again");
                    attempt += 1;
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(5));
                }
                Err(RangeFailure::Broken(error) | RangeFailure::Final(error)) => return Err(error),
            }
        }
    }

    /// One attempt at bytes `range`: the answer must be a `206` whose `Content-Range` is
    /// that range of a file of `size` bytes and, when the hub itself answers (no
    /// redirect), whose ETag is the one checked on `HEAD`.
    async fn try_range(
        &self,
        target: &Target<'_>,
        size: u64,
        range: Range<u64>,
        progress: &Progress<'_>,
        counted: &mut u64,
    ) -> Result<(), RangeFailure> {
        let Target {
            resolved,
            file,
            answer,
            partial,
        } = *target;
        let last = range.end.saturating_sub(1);
        let transfers = self.transfers();
        let action = || {
            format!(
                "download bytes {}-{last} of `{file}` at commit {}",
                range.start, resolved.sha
            )
        };
        let refused = |detail: String| {
            RangeFailure::Final(Error::HubResponse {
                repo: resolved.repo.to_string(),
                detail: format!(
                    "{detail}; the download of `{file}` was stopped and nothing was cached (check that \
                     HF_ENDPOINT is the hub, and that no proxy between it and Skein rewrites its answers)"
                ),
            })
        };
        let mut response = self
            .with_retries(resolved, &action, || {
                transfers
                    .get
                    .get(answer.url.clone())
                    .headers(transfers.auth.clone())
                    .header(RANGE, format!("bytes={}-{last}", range.start))
                    .send()
            })
            .await
            .map_err(RangeFailure::Final)?;
        let status = response.status();
        if status == StatusCode::OK {
            return Err(refused(format!(
                "a request for bytes {}-{last} of `{file}` was answered with the whole file (HTTP 200, not 206)",
                range.start
            )));
        }
        if status != StatusCode::PARTIAL_CONTENT {
            return Err(RangeFailure::Final(status_error(
                resolved,
                action(),
                status,
                response.url(),
            )));
        }
        let headers = response.headers();
        let content_range = headers.get(CONTENT_RANGE);
        let answered = content_range.and_then(|value| parse_content_range(value.to_str().ok()?));
        if answered != Some((range.start, last, size)) {
            let shown = content_range.map_or_else(|| "missing".to_owned(), |value| quoted(value.as_bytes()));
            return Err(refused(format!(
                "a request for bytes {}-{last} of `{file}` (listed with {size} bytes) was answered with \
                 Content-Range {shown}, not `bytes {}-{last}/{size}`",
                range.start, range.start
            )));
        }
        // A CDN that the hub redirects to has ETags of its own; the hub's must not change.
        if response.url() == &answer.url
            && let Some((header, raw)) = etag_header(headers)
            && normalized_etag(raw.to_str().unwrap_or_default()).ok().as_deref() != Some(answer.etag.as_str())
        {
            return Err(refused(format!(
                "the answer for bytes {}-{last} of `{file}` has {header} {}, but the file's headers gave `{}`: \
                 the file changed on the hub during the download",
                range.start,
                quoted(raw.as_bytes()),
                answer.etag
            )));
        }
        let written = |source| {
            RangeFailure::Final(Error::HubCacheWrite {
                path: partial.to_path_buf(),
                source,
            })
        };
        let mut out = tokio::fs::OpenOptions::new()
            .write(true)
            .open(partial)
            .await
            .map_err(written)?;
        out.seek(SeekFrom::Start(range.start)).await.map_err(written)?;
        let wanted = range.end - range.start;
        let mut at = 0u64;
        loop {
            let chunk = response.chunk().await.map_err(|source| {
                RangeFailure::Broken(Error::HubTransfer {
                    repo: resolved.repo.to_string(),
                    action: action(),
                    source,
                })
            })?;
            let Some(chunk) = chunk else { break };
            let len = chunk.len() as u64;
            if at.saturating_add(len) > wanted {
                return Err(refused(format!(
                    "the answer for bytes {}-{last} of `{file}` sent more than the {wanted} bytes asked for",
                    range.start
                )));
            }
            out.write_all(&chunk).await.map_err(written)?;
            self.count_bytes(len);
            at += len;
            if at > *counted {
                let total = progress.received.fetch_add(at - *counted, Ordering::Relaxed) + (at - *counted);
                *counted = at;
                (progress.on_bytes)(total);
            }
        }
        out.flush().await.map_err(written)?;
        if at < wanted {
            return Err(RangeFailure::Broken(Error::HubResponse {
                repo: resolved.repo.to_string(),
                detail: format!(
                    "the answer for bytes {}-{last} of `{file}` ended after {at} of {wanted} bytes",
                    range.start
                ),
            }));
        }
        Ok(())
    }
}

/// What a download writes, and from which answer.
#[derive(Clone, Copy)]
struct Target<'a> {
    resolved: &'a ResolvedRepo,
    file: &'a str,
    answer: &'a FileAnswer,
    /// `<blob>.incomplete`.
    partial: &'a Path,
}

/// The bytes received over all the ranges of a file, and who hears of them.
struct Progress<'a> {
    received: &'a AtomicU64,
    on_bytes: &'a (dyn Fn(u64) + Send + Sync),
}

/// Why an attempt at a range failed.
enum RangeFailure {
    /// The body broke off: worth another attempt.
    Broken(Error),
    /// The hub failed past its retries, the answer is not the range asked for, or the
    /// cache cannot be written.
    Final(Error),
}

/// The ETag header of an answer, as `HEAD` reads it: `X-Linked-Etag`, else `ETag`.
fn etag_header(headers: &HeaderMap) -> Option<(&'static str, &HeaderValue)> {
    match (headers.get(X_LINKED_ETAG), headers.get(ETAG)) {
        (Some(linked), _) => Some(("X-Linked-Etag", linked)),
        (None, Some(etag)) => Some(("ETag", etag)),
        (None, None) => None,
    }
}

/// `bytes <first>-<last>/<size>` as `(first, last, size)`.
fn parse_content_range(value: &str) -> Option<(u64, u64, u64)> {
    let (span, size) = value.trim().strip_prefix("bytes ")?.split_once('/')?;
    let (first, last) = span.split_once('-')?;
    let number = |text: &str| {
        let text = text.trim();
        (!text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()))
            .then(|| text.parse::<u64>().ok())
            .flatten()
    };
    Some((number(first)?, number(last)?, number(size)?))
}

/// The error of a cache write to `path`.
fn write_error(path: &Path) -> impl FnOnce(std::io::Error) -> Error + use<> {
    let path = path.to_path_buf();
    move |source| Error::HubCacheWrite { path, source }
}

/// Whether a `Location` is relative to the URL asked (no scheme, no host), as hf-hub
/// classifies it.
fn is_relative(location: &str) -> bool {
    Url::parse(location).is_err() && !location.starts_with("//")
}

/// The error for an HTTP status that is not an answer.
fn status_error(resolved: &ResolvedRepo, action: String, status: StatusCode, url: &Url) -> Error {
    Error::HubStatus {
        repo: resolved.repo.to_string(),
        action,
        status: status.as_u16(),
        url: url.to_string(),
    }
}

/// Takes the cache's lock on blob `etag` (`.locks/<repo folder>/<etag>.lock`, the lock
/// hf-hub and the Python client take), waiting on a blocking thread.
async fn lock(locks: &Path, etag: &str) -> Result<std::fs::File, Error> {
    let path = locks.join(format!("{etag}.lock"));
    let locked = path.clone();
    let taken = tokio::task::spawn_blocking(move || {
        if let Some(parent) = locked.parent() {
            std::fs::create_dir_all(parent)?;
        }
        let file = std::fs::File::create(&locked)?;
        file.lock()?;
        Ok::<_, std::io::Error>(file)
    })
    .await
    .map_err(std::io::Error::other)
    .and_then(|taken| taken);
    taken.map_err(|source| Error::HubCacheWrite { path, source })
}

/// Points `pointer` at `target`, replacing what was there at once (a new link under a
/// temporary name, renamed over the old one).
fn link(pointer: &Path, target: &Path) -> Result<(), Error> {
    let write_error = |path: &Path| {
        let path = path.to_path_buf();
        move |source| Error::HubCacheWrite { path, source }
    };
    if let Some(parent) = pointer.parent() {
        std::fs::create_dir_all(parent).map_err(write_error(parent))?;
    }
    // Unique to this call: two tasks of one process may link the same file at once.
    static LINKS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let call = LINKS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let mut name = pointer.file_name().unwrap_or_default().to_os_string();
    name.push(format!(".{}-{call}.link", std::process::id()));
    let temporary = pointer.with_file_name(name);
    let _ = std::fs::remove_file(&temporary);
    #[cfg(unix)]
    std::os::unix::fs::symlink(target, &temporary).map_err(write_error(&temporary))?;
    #[cfg(not(unix))]
    {
        let blob = pointer.parent().unwrap_or(pointer).join(target);
        std::fs::copy(&blob, &temporary).map_err(write_error(&temporary))?;
    }
    std::fs::rename(&temporary, pointer).map_err(write_error(pointer))
}

#[cfg(test)]
mod tests;
