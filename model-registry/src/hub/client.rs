//! [`HubClient`]: construction, transfer accounting, and the calls every reader shares
//! (resolving a revision, small files, range reads).

use std::fmt;
use std::future::Future;
use std::ops::Range;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures::StreamExt;
use hf_hub::repository::RepoTreeEntry;
use hf_hub::{HFClient, HFError, HFRepository, RepoTypeModel};
use serde::Serialize;

use super::cache::{MetadataCache, Stamped};
use super::config::{HubConfig, HubToken};
use super::http::Transfers;
use crate::Error;
use crate::repo::{CommitSha, RepoFile, RepoId, ResolvedRepo, WeightFiles};

/// Largest file [`HubClient::fetch_small`] downloads. Configs and tokenizer configs are
/// kilobytes; anything this large is not metadata.
pub const MAX_SMALL_FILE_BYTES: u64 = 16 << 20;

/// The branch asked for when no revision is given.
pub const DEFAULT_REVISION: &str = "main";

/// Bytes and calls that went over the network, counted since the client was built.
/// Cache hits count nothing.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct TransferStats {
    /// Hub calls that went to the network: API requests, small-file downloads and range
    /// reads. (A download or range read is a `HEAD` and a `GET` on the wire.)
    pub network_calls: u64,
    /// Range reads among them.
    pub range_reads: u64,
    /// Bytes of file content received: whole small files and the ranges read. The JSON
    /// of API answers is not counted.
    pub file_bytes: u64,
}

#[derive(Debug, Default)]
struct Counters {
    network_calls: AtomicU64,
    range_reads: AtomicU64,
    file_bytes: AtomicU64,
}

/// The hub edge: reads model metadata from the Hugging Face Hub (or a mirror at
/// `HF_ENDPOINT`) without downloading weights, through `hf-hub` and its cache.
///
/// Cheap to clone (the state is shared). Every answer that planning needs is cached under
/// the Hugging Face cache, keyed by commit, so a second run is offline and instant; with
/// [`HubConfig::offline`] the network is never touched and a missing entry is an
/// [`Error::HubOffline`].
#[derive(Clone)]
pub struct HubClient {
    inner: Arc<Inner>,
}

struct Inner {
    config: HubConfig,
    hf: HFClient,
    /// Whole-file downloads, which Skein does itself (see `transfer`).
    transfers: Transfers,
    cache: MetadataCache,
    counters: Counters,
}

impl fmt::Debug for HubClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The config's Debug redacts the token.
        f.debug_struct("HubClient").field("config", &self.inner.config).finish()
    }
}

/// Builds a [`HubClient`]: settings from the environment ([`HubConfig::from_env`]) with
/// explicit overrides, which tests use instead of changing the process environment.
#[derive(Debug, Clone)]
pub struct HubClientBuilder {
    config: HubConfig,
}

impl HubClientBuilder {
    /// Starts from the environment.
    pub fn from_env() -> HubClientBuilder {
        HubClientBuilder {
            config: HubConfig::from_env(),
        }
    }

    /// Starts from the given settings.
    pub fn from_config(config: HubConfig) -> HubClientBuilder {
        HubClientBuilder { config }
    }

    /// Overrides the hub URL (`HF_ENDPOINT`).
    pub fn endpoint(mut self, endpoint: impl Into<String>) -> Self {
        self.config.endpoint = endpoint.into();
        self
    }

    /// Overrides the token (`HF_TOKEN`); `None` sends no token.
    pub fn token(mut self, token: Option<HubToken>) -> Self {
        self.config.token = token;
        self
    }

    /// Overrides the Hugging Face cache folder (`HF_HUB_CACHE`).
    pub fn cache_dir(mut self, cache_dir: impl Into<PathBuf>) -> Self {
        self.config.cache_dir = cache_dir.into();
        self
    }

    /// Overrides offline mode (`HF_HUB_OFFLINE`).
    pub fn offline(mut self, offline: bool) -> Self {
        self.config.offline = offline;
        self
    }

    /// Allows repositories whose only weights are pickle files.
    pub fn allow_pickle(mut self, allow: bool) -> Self {
        self.config.allow_pickle = allow;
        self
    }

    /// Overrides the limit on each hub call.
    pub fn request_timeout(mut self, timeout: Duration) -> Self {
        self.config.request_timeout = timeout;
        self
    }

    /// Overrides the retries after a transient failure.
    pub fn max_retries(mut self, retries: usize) -> Self {
        self.config.max_retries = retries;
        self
    }

    /// Overrides how long a cached branch or tag resolution is trusted.
    pub fn ref_max_age(mut self, max_age: Duration) -> Self {
        self.config.ref_max_age = max_age;
        self
    }

    /// Overrides the size above which files are downloaded in Range requests, and the
    /// size of each.
    pub fn download_chunk_bytes(mut self, bytes: u64) -> Self {
        self.config.download_chunk_bytes = bytes;
        self
    }

    /// Builds the client. Nothing is sent yet.
    ///
    /// Errors: [`Error::HubClient`] for an endpoint that is not a URL,
    /// [`Error::HubHttpSetup`] when no HTTP client can be made.
    pub fn build(self) -> Result<HubClient, Error> {
        let config = self.config;
        let mut hf = HFClient::builder()
            .endpoint(config.endpoint.clone())
            .cache_dir(config.cache_dir.clone())
            .user_agent(concat!("skein/", env!("CARGO_PKG_VERSION")))
            .retry_max_attempts(config.max_retries);
        if let Some(token) = &config.token {
            hf = hf.token(token.expose());
        }
        let hf = hf.build().map_err(|source| Error::HubClient {
            endpoint: config.endpoint.clone(),
            source: Box::new(source),
        })?;
        let transfers = Transfers::new(&config).map_err(|source| Error::HubHttpSetup { source })?;
        Ok(HubClient {
            inner: Arc::new(Inner {
                cache: MetadataCache::new(&config.cache_dir),
                config,
                hf,
                transfers,
                counters: Counters::default(),
            }),
        })
    }
}

impl HubClient {
    /// A builder starting from the environment.
    pub fn builder() -> HubClientBuilder {
        HubClientBuilder::from_env()
    }

    /// A client configured from the environment, as the Python client is.
    ///
    /// Errors: as [`HubClientBuilder::build`].
    pub fn from_env() -> Result<HubClient, Error> {
        HubClient::builder().build()
    }

    /// The settings in force.
    pub fn config(&self) -> &HubConfig {
        &self.inner.config
    }

    /// What went over the network so far.
    pub fn stats(&self) -> TransferStats {
        let counters = &self.inner.counters;
        TransferStats {
            network_calls: counters.network_calls.load(Ordering::Relaxed),
            range_reads: counters.range_reads.load(Ordering::Relaxed),
            file_bytes: counters.file_bytes.load(Ordering::Relaxed),
        }
    }

    pub(crate) fn cache(&self) -> &MetadataCache {
        &self.inner.cache
    }

    /// Counts one whole-file transfer in the [`TransferStats`] (its bytes are counted as
    /// they arrive).
    pub(crate) fn count_call(&self) {
        self.inner.counters.network_calls.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts `bytes` of file content received, in the [`TransferStats`].
    pub(crate) fn count_bytes(&self, bytes: u64) {
        self.inner.counters.file_bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    pub(crate) fn hf(&self) -> &HFClient {
        &self.inner.hf
    }

    pub(crate) fn transfers(&self) -> &Transfers {
        &self.inner.transfers
    }

    fn hf_repo(&self, repo: &RepoId) -> HFRepository<RepoTypeModel> {
        self.inner.hf.model(repo.owner(), repo.name())
    }

    /// The error for something the cache lacks while offline.
    pub(crate) fn offline_miss(&self, repo: &RepoId, what: String) -> Error {
        Error::HubOffline {
            repo: repo.to_string(),
            what,
            cache: self.inner.config.cache_dir.clone(),
        }
    }

    /// Runs one network call under the timeout, counting it and naming the repository and
    /// the action in its error.
    pub(crate) async fn network<T>(
        &self,
        repo: &RepoId,
        action: impl FnOnce() -> String,
        call: impl Future<Output = Result<T, HFError>>,
    ) -> Result<T, Error> {
        debug_assert!(!self.inner.config.offline, "offline clients never reach the network");
        self.inner.counters.network_calls.fetch_add(1, Ordering::Relaxed);
        let timeout = self.inner.config.request_timeout;
        match tokio::time::timeout(timeout, call).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(source)) => Err(Error::Hub {
                repo: repo.to_string(),
                action: action(),
                source: Box::new(source),
            }),
            Err(_elapsed) => Err(Error::HubTimeout {
                repo: repo.to_string(),
                action: action(),
                timeout_ms: u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
            }),
        }
    }

    /// Resolves `revision` (a branch, tag or commit id; empty means `main`) to a commit and
    /// the files there, with their sizes.
    ///
    /// A cached answer is used when the revision is a commit id, when it is younger than
    /// [`HubConfig::ref_max_age`], and always when offline. Otherwise the hub is asked
    /// (repository info for the commit, then the recursive file tree for the sizes) and
    /// the answer is cached under the revision and under the commit. When the hub cannot
    /// be reached at all (no connection, or no answer in time), an older cached answer is
    /// used, with a warning, as the Python client does.
    ///
    /// Errors: [`Error::HubOffline`] when offline and never resolved before,
    /// [`Error::Hub`] or [`Error::HubTimeout`] when the hub fails (a missing or gated
    /// repository among them), [`Error::HubResponse`] for an answer without a valid
    /// commit id or with paths outside the repository.
    #[tracing::instrument(skip(self, repo), fields(repo = %repo))]
    pub async fn resolve(&self, repo: &RepoId, revision: &str) -> Result<ResolvedRepo, Error> {
        let revision = if revision.is_empty() {
            DEFAULT_REVISION
        } else {
            revision
        };
        let config = &self.inner.config;
        let cache = self.cache();
        let ref_path = cache.ref_path(repo, revision);
        let mut stale = None;
        if let Some(cached) = cache.read_json::<Stamped<ResolvedRepo>>(&ref_path).await
            && cached.value.repo == *repo
            && cached.value.normalized_ok()
        {
            let pinned = CommitSha::parse(revision).is_some();
            if pinned || config.offline || cached.is_fresh(config.ref_max_age) {
                return Ok(cached.value);
            }
            stale = Some(cached.value);
        }
        if config.offline {
            return Err(self.offline_miss(repo, format!("the file list at revision `{revision}`")));
        }

        let resolved = match self.resolve_online(repo, revision).await {
            Ok(resolved) => resolved,
            Err(error) if is_unreachable(&error) && stale.is_some() => {
                tracing::warn!(%error, "the hub is unreachable; using the cached file list");
                return stale.ok_or(error);
            }
            Err(error) => return Err(error),
        };
        let stamped = Stamped::now(resolved);
        cache.write_json(&ref_path, &stamped).await;
        if stamped.value.sha.as_str() != revision {
            cache
                .write_json(&cache.ref_path(repo, stamped.value.sha.as_str()), &stamped)
                .await;
        }
        Ok(stamped.value)
    }

    /// Asks the hub for the commit of `revision` and the files there.
    async fn resolve_online(&self, repo: &RepoId, revision: &str) -> Result<ResolvedRepo, Error> {
        let hf_repo = self.hf_repo(repo);
        let info = self
            .network(
                repo,
                || format!("read the repository info at revision `{revision}`"),
                hf_repo.info().revision(revision).send(),
            )
            .await?;
        let sha = info
            .sha
            .as_deref()
            .and_then(CommitSha::parse)
            .ok_or_else(|| Error::HubResponse {
                repo: repo.to_string(),
                detail: format!("the repository info has no 40-hex commit id (`sha` is {:?})", info.sha),
            })?;
        let files = self
            .network(
                repo,
                || format!("list the files at commit {sha}"),
                list_files(&hf_repo, &sha),
            )
            .await?;
        ResolvedRepo {
            repo: repo.clone(),
            revision: revision.to_owned(),
            sha,
            files,
        }
        .normalized()
        .map_err(|detail| Error::HubResponse {
            repo: repo.to_string(),
            detail,
        })
    }

    /// Downloads a small file (`config.json`, `generation_config.json`,
    /// `tokenizer_config.json`, `model.safetensors.index.json`) at the resolved commit
    /// through the Hugging Face cache, and returns its bytes. `None` when the repository
    /// has no such file. A cached file costs no request.
    ///
    /// Errors: [`Error::HubFileTooLarge`] beyond [`MAX_SMALL_FILE_BYTES`],
    /// [`Error::HubOffline`] when offline and not cached, [`Error::HubUntrustedAnswer`]
    /// when the hub's answer would put the file outside the cache, [`Error::HubStatus`],
    /// [`Error::HubTransfer`] or [`Error::HubTimeout`] when the download fails,
    /// [`Error::HubCacheRead`] when the downloaded file cannot be read back.
    #[tracing::instrument(skip(self, resolved), fields(repo = %resolved.repo, sha = %resolved.sha))]
    pub async fn fetch_small(&self, resolved: &ResolvedRepo, file: &str) -> Result<Option<Vec<u8>>, Error> {
        let Some(listed) = resolved.file(file) else {
            return Ok(None);
        };
        if listed.size > MAX_SMALL_FILE_BYTES {
            return Err(Error::HubFileTooLarge {
                repo: resolved.repo.to_string(),
                file: file.to_owned(),
                size: listed.size,
                limit: MAX_SMALL_FILE_BYTES,
            });
        }
        let path = match self.cached_snapshot(resolved, file) {
            Some(path) => path,
            None if self.inner.config.offline => {
                let sha = &resolved.sha;
                return Err(self.offline_miss(&resolved.repo, format!("`{file}` at commit {sha}")));
            }
            None => {
                self.count_call();
                self.fetch_file(resolved, file, &|_| {}).await?
            }
        };
        match tokio::fs::read(&path).await {
            Ok(bytes) => Ok(Some(bytes)),
            Err(source) => Err(Error::HubCacheRead { path, source }),
        }
    }

    /// The repository's weight files, with the pickle policy applied.
    ///
    /// Errors: [`Error::PickleOnly`] when the only weights are pickle files and
    /// [`HubConfig::allow_pickle`] is off.
    pub fn weight_files(&self, resolved: &ResolvedRepo) -> Result<WeightFiles, Error> {
        let weights = resolved.weight_files();
        if weights.pickle_only() && !self.inner.config.allow_pickle {
            return Err(Error::PickleOnly {
                repo: resolved.repo.to_string(),
                files: weights.pickle.iter().map(|file| file.path.clone()).collect(),
            });
        }
        Ok(weights)
    }

    /// Reads bytes `range` of `file` with an HTTP Range request. At most `range` bytes are
    /// taken from the answer even if a server ignores the range and sends the whole file:
    /// the stream is dropped as soon as enough has arrived.
    ///
    /// Errors: [`Error::Hub`], [`Error::HubTimeout`], or [`Error::HubResponse`] when fewer
    /// bytes arrive than asked for.
    pub(crate) async fn read_range(
        &self,
        resolved: &ResolvedRepo,
        file: &str,
        range: Range<u64>,
    ) -> Result<Vec<u8>, Error> {
        let hf_repo = self.hf_repo(&resolved.repo);
        let wanted = usize::try_from(range.end.saturating_sub(range.start)).unwrap_or(usize::MAX);
        let request = range.clone();
        let read = async {
            let (_len, mut stream) = hf_repo
                .download_file_stream()
                .filename(file)
                .revision(resolved.sha.as_str())
                .range(request)
                .send()
                .await?;
            let mut bytes = Vec::with_capacity(wanted);
            let mut received = 0u64;
            while bytes.len() < wanted {
                let Some(chunk) = stream.next().await else { break };
                let chunk = chunk?;
                received = received.saturating_add(chunk.len() as u64);
                let take = chunk.len().min(wanted - bytes.len());
                bytes.extend_from_slice(chunk.get(..take).unwrap_or_default());
            }
            Ok::<_, HFError>((bytes, received))
        };
        self.inner.counters.range_reads.fetch_add(1, Ordering::Relaxed);
        let (bytes, received) = self
            .network(
                &resolved.repo,
                || format!("read bytes {}..{} of `{file}`", range.start, range.end),
                read,
            )
            .await?;
        self.inner.counters.file_bytes.fetch_add(received, Ordering::Relaxed);
        if bytes.len() != wanted {
            return Err(Error::HubResponse {
                repo: resolved.repo.to_string(),
                detail: format!(
                    "a read of bytes {}..{} of `{file}` returned {} bytes",
                    range.start,
                    range.end,
                    bytes.len()
                ),
            });
        }
        Ok(bytes)
    }
}

impl ResolvedRepo {
    /// Whether a cached entry still passes the checks a fresh answer passes.
    fn normalized_ok(&self) -> bool {
        self.clone().normalized().is_ok_and(|normalized| normalized == *self)
    }
}

/// Whether a hub call failed for want of a hub (no connection, no answer in time), as
/// opposed to the hub answering with an error.
pub(crate) fn is_unreachable(error: &Error) -> bool {
    match error {
        Error::HubTimeout { .. } => true,
        Error::Hub { source, .. } => matches!(**source, HFError::Request { .. }),
        _ => false,
    }
}

/// Every file (not folder) at `sha`, with its size, from the recursive tree listing.
async fn list_files(repo: &HFRepository<RepoTypeModel>, sha: &CommitSha) -> Result<Vec<RepoFile>, HFError> {
    let stream = repo.list_tree().revision(sha.as_str()).recursive(true).send()?;
    futures::pin_mut!(stream);
    let mut files = Vec::new();
    while let Some(entry) = stream.next().await {
        if let RepoTreeEntry::File { path, size, .. } = entry? {
            files.push(RepoFile { path, size });
        }
    }
    Ok(files)
}
