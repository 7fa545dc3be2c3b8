//! Model metadata and memory estimation for Skein.
//!
//! This crate will answer "how many bytes does this model need on this GPU?" from
//! headers alone: `config.json`, safetensors headers and GGUF tensor tables. Today it
//! holds the foundation every estimate is built on: the storage element types of both
//! weight formats and an exact byte count for a tensor of each type.
//!
//! # Layout
//!
//! - [`dtype`]: storage element types. [`SafetensorsDtype`] parses the `dtype` string
//!   of a safetensors header and knows its width in bits; [`GgmlType`] maps a GGUF
//!   tensor type id to ggml's block layout (elements and bytes per block). Both compute
//!   the exact byte size of a tensor and refuse shapes their format cannot store.
//! - [`bytes`]: the [`Bytes`] newtype used for every memory figure, with checked
//!   arithmetic and binary-unit display.
//! - [`error`]: the crate's one error enum, [`Error`].
//!
//! # Invariants
//!
//! The crate is pure: no IO, no clocks, no global state. Every function takes values and
//! returns values, so an estimate is a deterministic function of the headers it is given,
//! and nothing here can fail for IO reasons. Byte arithmetic never wraps: an overflow is
//! an [`Error::TensorTooLarge`] (or `None` from [`Bytes`] arithmetic), not a wrong number.

#![warn(missing_docs)]
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

pub mod bytes;
pub mod dtype;
pub mod error;

pub use bytes::Bytes;
pub use dtype::{GgmlType, SafetensorsDtype};
pub use error::Error;
