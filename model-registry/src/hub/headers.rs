//! Weight-file headers read with HTTP Range requests: safetensors (one file, or every
//! shard of an indexed checkpoint) and GGUF, cached by repository, commit and file.

use futures::{StreamExt, TryStreamExt};
use serde::Serialize;

use super::client::HubClient;
use crate::gguf::MAX_HEADER_BYTES;
use crate::repo::{RepoFile, ResolvedRepo, SAFETENSORS_INDEX};
use crate::safetensors::{self, LEN_PREFIX_BYTES, MAX_HEADER_LEN, SafetensorsHeader, SafetensorsTensor};
use crate::{Bytes, Error, GgufHeader, GgufParse, ShardIndex};

/// First range of a safetensors file when nothing hints at its header size. One read
/// then covers the length prefix and the header of most single-file checkpoints (a few
/// hundred tensors); a longer header costs exactly one more read.
pub const SAFETENSORS_FIRST_RANGE: u64 = 64 << 10;

/// JSON bytes per tensor entry of a safetensors header beyond its name: the dtype, the
/// shape and the two data offsets, with quotes and separators
/// (`":{"dtype":"BF16","shape":[28672,8192],"data_offsets":[0,469762048]},"`). Used to
/// size the first read of a shard from the tensor names the index lists.
const SAFETENSORS_BYTES_PER_ENTRY: u64 = 96;

/// Slack for the header's braces, `__metadata__` and alignment padding.
const SAFETENSORS_HEADER_SLACK: u64 = 512;

/// First range of a GGUF file. Most headers fit; those with large vocabularies (their
/// token, score and merge arrays) take a few MiB and are read in doubling ranges.
pub const GGUF_FIRST_RANGE: u64 = 1 << 20;

/// Shard headers read at once. Sharded checkpoints have up to a few hundred shards; a
/// handful of concurrent reads hides latency without hammering the hub.
pub const MAX_CONCURRENT_HEADER_READS: usize = 8;

/// A safetensors file's header, as read from the hub.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SafetensorsFile {
    /// Path in the repository.
    pub path: String,
    /// File size, as the hub lists it; checked against the header.
    pub size: u64,
    /// Length of the JSON header (the `N` of the length prefix).
    pub header_len: u64,
    /// The parsed header.
    pub header: SafetensorsHeader,
}

/// A safetensors checkpoint: one file, or the shards an index names.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SafetensorsCheckpoint {
    /// `model.safetensors.index.json`, when the checkpoint is sharded.
    pub index: Option<ShardIndex>,
    /// Every file's header, sorted by path.
    pub files: Vec<SafetensorsFile>,
}

impl SafetensorsCheckpoint {
    /// Every tensor of every file.
    pub fn tensors(&self) -> impl Iterator<Item = &SafetensorsTensor> {
        self.files.iter().flat_map(|file| file.header.tensors())
    }

    /// Bytes of all tensors (the data sections), or `None` on overflow.
    pub fn tensor_bytes(&self) -> Option<Bytes> {
        self.files
            .iter()
            .try_fold(Bytes::ZERO, |sum, file| sum.checked_add(file.header.totals().bytes))
    }

    /// Number of stored elements over all files, or `None` on overflow.
    pub fn stored_params(&self) -> Option<u64> {
        self.files
            .iter()
            .try_fold(0u64, |sum, file| sum.checked_add(file.header.totals().params))
    }
}

/// A GGUF file's header, as read from the hub.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GgufFile {
    /// Path in the repository.
    pub path: String,
    /// File size, as the hub lists it.
    pub size: u64,
    /// The parsed header.
    pub header: GgufHeader,
}

impl HubClient {
    /// The header of one safetensors file, from the cache or by range reads: a first read
    /// of [`SAFETENSORS_FIRST_RANGE`] bytes (less for a smaller file) and, only if the
    /// header is longer, one read of the rest. The header is checked against the file size
    /// the hub lists.
    ///
    /// Errors: [`Error::HubFileMissing`] if the repository has no such file,
    /// [`Error::HubHeader`] (with the parser's error as the cause) for an invalid header,
    /// [`Error::HubOffline`] when offline and not cached, and the errors of a hub call.
    #[tracing::instrument(skip(self, resolved), fields(repo = %resolved.repo, sha = %resolved.sha))]
    pub async fn safetensors_header(&self, resolved: &ResolvedRepo, file: &str) -> Result<SafetensorsFile, Error> {
        let listed = listed_file(resolved, file)?;
        self.read_safetensors(resolved, listed, SAFETENSORS_FIRST_RANGE).await
    }

    /// The repository's main safetensors checkpoint: with an index, every shard it names
    /// (each first read sized from the tensor names the index places in that shard, so
    /// one read usually suffices); without, the checkpoint files
    /// ([`WeightFiles::safetensors`](super::WeightFiles::safetensors)). `None` when the
    /// repository has no safetensors weights.
    ///
    /// Errors: those of [`safetensors_header`](Self::safetensors_header) for any file,
    /// [`Error::HubHeader`] for a malformed index, [`Error::HubFileMissing`] for a shard
    /// the index names but the repository lacks, and those of
    /// [`weight_files`](Self::weight_files).
    #[tracing::instrument(skip(self, resolved), fields(repo = %resolved.repo, sha = %resolved.sha))]
    pub async fn safetensors_checkpoint(
        &self,
        resolved: &ResolvedRepo,
    ) -> Result<Option<SafetensorsCheckpoint>, Error> {
        let weights = self.weight_files(resolved)?;
        let (index, reads) = match &weights.safetensors_index {
            Some(_) => {
                let json = self
                    .fetch_small(resolved, SAFETENSORS_INDEX)
                    .await?
                    .ok_or_else(|| missing(resolved, SAFETENSORS_INDEX))?;
                let index =
                    ShardIndex::parse(&json).map_err(|source| header_error(resolved, SAFETENSORS_INDEX, source))?;
                let mut reads = Vec::new();
                for shard in index.shard_files() {
                    let listed = listed_file(resolved, shard)?;
                    let estimate = index
                        .tensors_in(shard)
                        .map(|name| name.len() as u64 + SAFETENSORS_BYTES_PER_ENTRY)
                        .fold(LEN_PREFIX_BYTES as u64 + SAFETENSORS_HEADER_SLACK, u64::saturating_add);
                    reads.push((listed, estimate));
                }
                (Some(index), reads)
            }
            None if weights.safetensors.is_empty() => return Ok(None),
            None => {
                let reads = weights
                    .safetensors
                    .iter()
                    .map(|file| (file, SAFETENSORS_FIRST_RANGE))
                    .collect();
                (None, reads)
            }
        };
        let files: Vec<SafetensorsFile> = futures::stream::iter(reads)
            .map(|(listed, first_range)| self.read_safetensors(resolved, listed, first_range))
            .buffered(MAX_CONCURRENT_HEADER_READS)
            .try_collect()
            .await?;
        if let Some(index) = &index {
            index
                .check_shards(files.iter().map(|f| (f.path.as_str(), &f.header)))
                .map_err(|source| header_error(resolved, SAFETENSORS_INDEX, source))?;
        }
        Ok(Some(SafetensorsCheckpoint { index, files }))
    }

    async fn read_safetensors(
        &self,
        resolved: &ResolvedRepo,
        listed: &RepoFile,
        first_range: u64,
    ) -> Result<SafetensorsFile, Error> {
        let file = listed.path.as_str();
        let cache_path = self.cache().header_path(&resolved.repo, &resolved.sha, file);
        if let Some(prefix) = self.cache().read(&cache_path).await {
            match parse_safetensors(resolved, listed, &prefix) {
                Ok(parsed) => return Ok(parsed),
                Err(error) => {
                    tracing::warn!(file, %error, "discarding a cached safetensors header that does not parse");
                    self.cache().remove(&cache_path).await;
                }
            }
        }
        if self.config().offline {
            return Err(self.offline_miss(
                &resolved.repo,
                format!("the header of `{file}` at commit {}", resolved.sha),
            ));
        }

        let prefix_len = LEN_PREFIX_BYTES as u64;
        if listed.size < prefix_len {
            return Err(header_error(
                resolved,
                file,
                Error::SafetensorsPrefixTooShort {
                    len: usize::try_from(listed.size).unwrap_or(usize::MAX),
                },
            ));
        }
        let first_end = first_range.clamp(prefix_len, listed.size.min(prefix_len + MAX_HEADER_LEN));
        let mut prefix = self.read_range(resolved, file, 0..first_end).await?;
        let header_len = safetensors::header_len(&prefix).map_err(|source| header_error(resolved, file, source))?;
        let header_end = prefix_len + header_len;
        if header_end > listed.size {
            return Err(header_error(
                resolved,
                file,
                Error::SafetensorsFileSize {
                    expected: header_end,
                    found: listed.size,
                },
            ));
        }
        if header_end > first_end {
            prefix.extend(self.read_range(resolved, file, first_end..header_end).await?);
        }
        prefix.truncate(usize::try_from(header_end).unwrap_or(usize::MAX));
        let parsed = parse_safetensors(resolved, listed, &prefix)?;
        self.cache().write(&cache_path, &prefix).await;
        Ok(parsed)
    }

    /// The header of a GGUF file, from the cache or by range reads: the first
    /// [`GGUF_FIRST_RANGE`] bytes, then, while the parser needs more, the next bytes up to
    /// at least what it asks for and at least double what was read (never past
    /// [`MAX_HEADER_BYTES`] or the file's end). Each read continues where the last ended,
    /// so nothing is fetched twice.
    ///
    /// Errors: [`Error::HubFileMissing`] if the repository has no such file,
    /// [`Error::HubHeader`] for an invalid or truncated header (the cause says which),
    /// [`Error::HubOffline`] when offline and not cached, and the errors of a hub call.
    #[tracing::instrument(skip(self, resolved), fields(repo = %resolved.repo, sha = %resolved.sha))]
    pub async fn gguf_header(&self, resolved: &ResolvedRepo, file: &str) -> Result<GgufFile, Error> {
        let listed = listed_file(resolved, file)?;
        let cache_path = self.cache().header_path(&resolved.repo, &resolved.sha, file);
        if let Some(prefix) = self.cache().read(&cache_path).await {
            match GgufHeader::parse(&prefix) {
                Ok(header) => return Ok(gguf_file(listed, header)),
                Err(error) => {
                    tracing::warn!(file, %error, "discarding a cached GGUF header that does not parse");
                    self.cache().remove(&cache_path).await;
                }
            }
        }
        if self.config().offline {
            return Err(self.offline_miss(
                &resolved.repo,
                format!("the header of `{file}` at commit {}", resolved.sha),
            ));
        }

        let limit = listed.size.min(MAX_HEADER_BYTES);
        let mut prefix = Vec::new();
        let mut end = GGUF_FIRST_RANGE.min(limit);
        let header = loop {
            let start = prefix.len() as u64;
            if end > start {
                prefix.extend(self.read_range(resolved, file, start..end).await?);
            }
            match GgufHeader::parse(&prefix) {
                Ok(header) => break header,
                Err(GgufParse::Invalid(source)) => return Err(header_error(resolved, file, source)),
                Err(GgufParse::NeedMore { at_least }) => {
                    let read = prefix.len() as u64;
                    if read >= limit {
                        let source = if read >= listed.size {
                            Error::GgufTruncated {
                                needed: at_least,
                                len: listed.size,
                            }
                        } else {
                            Error::GgufLimit {
                                what: "header bytes",
                                value: at_least,
                                limit: MAX_HEADER_BYTES,
                            }
                        };
                        return Err(header_error(resolved, file, source));
                    }
                    end = at_least.max(read.saturating_mul(2)).min(limit);
                }
            }
        };
        let header_len = usize::try_from(header.header_len()).unwrap_or(usize::MAX);
        self.cache()
            .write(&cache_path, prefix.get(..header_len).unwrap_or(prefix.as_slice()))
            .await;
        Ok(gguf_file(listed, header))
    }
}

/// Parses a cached or fetched safetensors prefix (length and header, nothing more) and
/// checks it against the listed file size.
fn parse_safetensors(resolved: &ResolvedRepo, listed: &RepoFile, prefix: &[u8]) -> Result<SafetensorsFile, Error> {
    let file = listed.path.as_str();
    let parse = || -> Result<(u64, SafetensorsHeader), Error> {
        let header_len = safetensors::header_len(prefix)?;
        let header_bytes = usize::try_from(header_len)
            .ok()
            .and_then(|len| prefix.get(LEN_PREFIX_BYTES..LEN_PREFIX_BYTES + len))
            .ok_or(Error::SafetensorsPrefixTooShort { len: prefix.len() })?;
        let header = safetensors::parse_header(header_bytes)?;
        header.check_file_len(header_len, listed.size)?;
        Ok((header_len, header))
    };
    let (header_len, header) = parse().map_err(|source| header_error(resolved, file, source))?;
    Ok(SafetensorsFile {
        path: listed.path.clone(),
        size: listed.size,
        header_len,
        header,
    })
}

fn gguf_file(listed: &RepoFile, header: GgufHeader) -> GgufFile {
    GgufFile {
        path: listed.path.clone(),
        size: listed.size,
        header,
    }
}

fn listed_file<'a>(resolved: &'a ResolvedRepo, file: &str) -> Result<&'a RepoFile, Error> {
    resolved.file(file).ok_or_else(|| missing(resolved, file))
}

fn missing(resolved: &ResolvedRepo, file: &str) -> Error {
    Error::HubFileMissing {
        repo: resolved.repo.to_string(),
        sha: resolved.sha.to_string(),
        file: file.to_owned(),
    }
}

fn header_error(resolved: &ResolvedRepo, file: &str, source: Error) -> Error {
    Error::HubHeader {
        repo: resolved.repo.to_string(),
        file: file.to_owned(),
        source: Box::new(source),
    }
}
