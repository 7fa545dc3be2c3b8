//! The hub edge: model metadata from the Hugging Face Hub without downloading weights.
//!
//! A plan needs a model's files and sizes, its `config.json`, and the headers of its
//! weight files; never the weights. [`HubClient`] gets exactly that, through `hf-hub`
//! and its cache, and honours `HF_ENDPOINT`, `HF_TOKEN`, `HF_HOME`/`HF_HUB_CACHE` and
//! `HF_HUB_OFFLINE` as the Python client does ([`HubConfig`]):
//!
//! 1. [`HubClient::resolve`]: a revision to a commit and the file list with sizes.
//! 2. [`HubClient::fetch_small`]: `config.json` and other small files, downloaded into
//!    the Hugging Face cache.
//! 3. [`HubClient::safetensors_checkpoint`], [`HubClient::safetensors_header`] and
//!    [`HubClient::gguf_header`]: headers by HTTP Range requests, handed to the crate's
//!    parsers; for a 140 GB sharded checkpoint that is a few hundred KB.
//! 4. [`HubClient::download`]: whole files, weights included, into the Hugging Face
//!    cache, for the built-in engine; the one call that reads tensor data.
//! 5. [`HubClient::discover_variants`]: the repository's own checkpoints and its
//!    quantized derivatives on the hub.
//! 6. [`HubClient::inspect_adapter`]: a LoRA adapter's config and the header of its
//!    weight file (PEFT safetensors or llama.cpp GGUF), as an
//!    [`AdapterInfo`](crate::adapter::AdapterInfo).
//!
//! Everything is cached under the Hugging Face cache keyed by commit (`cache`), so a
//! second run makes no request, and offline mode answers from the cache or says
//! precisely what is missing and how to fill it.
//!
//! # Layout
//!
//! - `config`: [`HubConfig`] from the environment, [`HubToken`] (never printed).
//! - `client`: [`HubClient`], its builder, transfer counters ([`TransferStats`]), and the
//!   shared calls: resolve, small files, range reads under a timeout.
//! - `download`: whole-file downloads with byte progress ([`DownloadProgress`]).
//! - `transfer`: the transfer of one file into the cache, done by Skein rather than
//!   hf-hub, with the hub's `X-Repo-Commit` and ETag checked before any path is made
//!   of them.
//! - `http`: the two HTTP clients of those transfers (`HEAD` without redirects, `GET`
//!   with them) and the token's header.
//! - `headers`: the range-read strategies for safetensors and GGUF headers.
//! - `adapter`: LoRA adapters (`inspect_adapter`), read through `headers`.
//! - `variants`: variant discovery ([`VariantSource`] lives in [`catalog`](crate::catalog)
//!   and is re-exported here).
//!
//! The values resolved and cached ([`RepoId`], [`CommitSha`], [`ResolvedRepo`]) and the
//! sorting of files into formats ([`WeightFiles`]) live in the pure [`repo`](crate::repo)
//! module and are re-exported here.
//! - `cache`: Skein's metadata cache (`<HF cache>/skein/`), written atomically.
//!
//! # Invariants
//!
//! This is the only module of the crate that does IO. Apart from
//! [`HubClient::download`], which exists to fetch weights, it never reads a byte of tensor
//! data: safetensors reads stop at the header's end, GGUF reads at the parser's bound
//! (capped at [`MAX_HEADER_BYTES`](crate::gguf::MAX_HEADER_BYTES)), and a server that
//! ignores a Range request is cut off after the bytes asked for. Offline, it sends
//! nothing. It refuses repositories with only pickle weights unless allowed. It never
//! logs or prints the token. It writes nothing outside the Hugging Face cache, whatever
//! the hub answers: the file paths it makes come from the resolved commit, the listed
//! file names (checked to stay inside the repository) and ETags checked to be hex digests.

mod adapter;
mod cache;
mod client;
mod config;
mod download;
mod headers;
mod http;
mod inspect;
mod transfer;
mod variants;

pub use crate::repo::{CommitSha, RepoFile, RepoId, ResolvedRepo, SAFETENSORS_INDEX, WeightFiles};
pub use client::{DEFAULT_REVISION, HubClient, HubClientBuilder, MAX_SMALL_FILE_BYTES, TransferStats};
pub use config::{
    DEFAULT_DOWNLOAD_CHUNK_BYTES, DEFAULT_ENDPOINT, DEFAULT_MAX_RETRIES, DEFAULT_REF_MAX_AGE, DEFAULT_REQUEST_TIMEOUT,
    HubConfig, HubToken,
};
pub use download::DownloadProgress;
pub use headers::{
    GGUF_FIRST_RANGE, GgufFile, MAX_CONCURRENT_HEADER_READS, SAFETENSORS_FIRST_RANGE, SafetensorsCheckpoint,
    SafetensorsFile,
};
pub use inspect::{DEFAULT_DERIVATIVES, InspectOptions};
pub use variants::{Derivative, MAX_DERIVATIVES, VariantCandidate, VariantPin, VariantSource, repo_variants};
