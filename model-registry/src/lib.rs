//! Model metadata and memory estimation for Skein.
//!
//! This crate answers "how many bytes does this model need on this GPU?" from headers
//! alone: `config.json`, safetensors headers and GGUF tensor tables, read from the
//! Hugging Face Hub with Range requests. It also lists a model's quantized variants and
//! says which of them fit a set of GPUs.
//!
//! # Layout
//!
//! - [`dtype`]: storage element types. [`SafetensorsDtype`] parses the `dtype` string
//!   of a safetensors header and knows its width in bits; [`GgmlType`] maps a GGUF
//!   tensor type id to ggml's block layout (elements and bytes per block). Both compute
//!   the exact byte size of a tensor and refuse shapes their format cannot store.
//! - [`config`]: a typed, validated view of a Hugging Face `config.json`
//!   ([`ModelConfig`]) for the architectures in [`Architecture`], with the defaults of
//!   each model type's `transformers` config class and errors that name the key.
//! - [`params`]: exact parameter counts from a [`ModelConfig`] ([`parameter_count`]),
//!   broken down by part and by layer, the non-parameter tensors published checkpoints
//!   store, and the KV-cache size per token ([`kv_bytes_per_token`]).
//! - [`safetensors`]: safetensors headers parsed from the bytes a range read fetched
//!   ([`header_len`](safetensors::header_len), then
//!   [`parse_header`](safetensors::parse_header)), validated as the reference loader
//!   does, with exact totals per dtype; [`ShardIndex`] for sharded checkpoints.
//! - [`gguf`]: GGUF headers (v2, v3) from a prefix of the file; [`GgufHeader::parse`]
//!   says how many more bytes it needs when the prefix ends inside the header, keeps
//!   only the start of huge arrays such as vocabularies, and checks every length before
//!   using it.
//! - [`quant`]: a variant's [`Quantization`] (format, method, bits, group size) from
//!   `quantization_config`, from safetensors tensors or from GGUF file types and names,
//!   with the nominal bits that map it to a workflow precision tier.
//! - [`bytes`]: the [`Bytes`] newtype used for every memory figure, with checked
//!   arithmetic and binary-unit display.
//! - [`error`]: the crate's one error enum, [`Error`].
//! - [`estimate`]: memory estimates. [`ModelShape`] and [`WeightGroups`] (bytes per
//!   tensor group, from headers or computed from a [`Quantization`]) with an
//!   [`EstimateRequest`] (context, sequences, KV type, engine, tensor/pipeline layout)
//!   give an [`Estimate`]: per-device weights, KV cache, activations and overhead, each
//!   line explained, with the named constants used; [`fits`] checks it against usable
//!   memory; [`tp_degrees`] lists valid tensor-parallel degrees and why others fail.
//! - [`repo`]: repository ids ([`RepoId`](repo::RepoId)), commits, a resolved
//!   repository's file list and the sorting of its files into weight formats
//!   ([`WeightFiles`](repo::WeightFiles)); pure values the hub edge resolves and caches.
//! - [`catalog`]: what Skein knows about one model before anything is downloaded
//!   ([`ModelInfo`]): its shape and every variant with its weight bytes, and where each
//!   fits.
//! - [`task`]: what a model is served for ([`ModelTask`]): text generation, or
//!   embeddings with their [`Pooling`](task::Pooling), told from `config.json`'s
//!   `architectures`, sentence-transformers files and a GGUF file's pooling.
//! - [`adapter`]: LoRA adapters of a base model ([`AdapterInfo`]): a validated PEFT
//!   `adapter_config.json` ([`AdapterConfig`]) and the `lora_A`/`lora_B` pairs of a
//!   safetensors or GGUF adapter header, by module and layer, ranks checked.
//!   [`estimate`] sizes them per engine ([`estimate::adapter_memory`]).
//! - [`gpu`]: GPUs by name for plans made before the fleet reports in (`--gpu
//!   A100-80GB`, GPU sets such as `RTX4090-24GB:2`), from the shared GPU catalog.
//! - [`hub`]: the IO edge. [`hub::HubClient`] resolves a repository on the Hugging Face
//!   Hub, downloads `config.json` and friends, reads safetensors and GGUF headers with
//!   HTTP Range requests (never weights), discovers quantized variants, and caches all of
//!   it by commit so a second run is offline; it honours the `HF_*` variables. Behind
//!   the default `hub` feature: without it the crate has no HTTP or async dependencies.
//!
//! # Invariants
//!
//! Outside [`hub`], the crate is pure: no IO, no clocks, no global state. Every function
//! takes values and returns values, so an estimate is a deterministic function of the headers it is given,
//! and nothing here can fail for IO reasons. Byte arithmetic never wraps: an overflow is
//! an [`Error::TensorTooLarge`] (or `None` from [`Bytes`] arithmetic), not a wrong number.

#![warn(missing_docs)]
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

pub mod adapter;
pub mod bytes;
pub mod catalog;
pub mod config;
pub mod dtype;
pub mod error;
pub mod estimate;
pub mod gguf;
pub mod gpu;
#[cfg(feature = "hub")]
pub mod hub;
pub mod params;
pub mod quant;
pub mod repo;
pub mod safetensors;
pub mod task;

pub use adapter::{AdapterConfig, AdapterInfo};
pub use bytes::Bytes;
pub use config::{Architecture, ModelConfig};
pub use dtype::{GgmlType, SafetensorsDtype};
pub use error::{Error, error_chain};
pub use estimate::{
    Engine, Estimate, EstimateRequest, KvDtype, Layout, ModelShape, WeightGroups, WeightsSource, estimate, fits,
    tp_degrees,
};
pub use gguf::{GgufHeader, GgufParse, GgufValue};
pub use params::{ParamBreakdown, kv_bytes_per_token, parameter_count};
pub use quant::{GgufFileType, NominalPrecision, NumberKind, QuantMethod, Quantization, WeightFormat};
pub use safetensors::{SafetensorsHeader, ShardIndex, TensorTotals};
pub use task::{ModelTask, Pooling};
