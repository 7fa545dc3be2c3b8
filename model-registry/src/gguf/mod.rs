//! GGUF headers (versions 2 and 3, little-endian), parsed from a prefix of the file.
//!
//! A GGUF file is the magic `GGUF`, a version, the tensor and metadata counts, the
//! metadata key/value pairs, the tensor infos (name, dimensions, ggml type, offset), then
//! padding to the alignment and the tensor data. Everything before the data is the
//! header; with large vocabularies it runs to megabytes, so the hub edge reads it in
//! growing ranges. [`GgufHeader::parse`] takes whatever prefix has been read and either
//! parses it or answers [`GgufParse::NeedMore`] with a lower bound on the prefix length
//! needed, so that the caller can read more (at least that much; doubling is a good
//! rule) and parse again.
//!
//! # Untrusted input
//!
//! Every length in the file is checked against the bytes at hand before anything is
//! allocated or skipped, and against [`MAX_HEADER_BYTES`]: a hostile length yields
//! `NeedMore` with an honest bound or an [`Error::GgufLimit`], never a large allocation.
//! Arrays are not materialised in full: the first items are kept (all of them for short
//! arrays such as per-layer head counts), and the rest are skipped, so a 150,000-token
//! vocabulary costs its length, not 150,000 strings. Validation follows ggml's
//! `gguf_init_from_file`: unique keys and tensor names, at most four dimensions, known
//! tensor types with whole blocks per row, and tensor offsets that tile the data section
//! in order with each tensor padded to the alignment.

mod parser;
mod value;

use std::collections::BTreeMap;

use serde::Serialize;

use crate::safetensors::TensorTotals;
use crate::{Bytes, Error, GgmlType};

pub use value::{GgufArray, GgufValue, GgufValueType};

use parser::Parser;

/// The four bytes that start every GGUF file.
pub const GGUF_MAGIC: [u8; 4] = *b"GGUF";

/// The alignment of the data section when `general.alignment` is absent
/// (`GGUF_DEFAULT_ALIGNMENT`).
pub const DEFAULT_ALIGNMENT: u64 = 32;

/// The longest header accepted, in bytes. The largest real headers (vocabularies of a
/// quarter million tokens with their merges) take tens of MiB; anything claiming more
/// is refused rather than read.
pub const MAX_HEADER_BYTES: u64 = 128 << 20;

/// At most this many tensors. Real files hold a few thousand.
pub const MAX_TENSORS: u64 = 1 << 20;

/// At most this many metadata pairs. Real files hold a few dozen.
pub const MAX_METADATA_PAIRS: u64 = 1 << 16;

/// Arrays nest at most this deep (an array of arrays is depth 2).
pub const MAX_ARRAY_DEPTH: u32 = 4;

/// Arrays with at most this many items are kept whole (per-layer values, for example).
pub const KEEP_WHOLE_ARRAY_ITEMS: u64 = 1024;

/// Of a longer array, only this many leading items are kept.
pub const ARRAY_PREVIEW_ITEMS: u64 = 8;

/// At most this many array items are kept over a whole header, so that many short
/// arrays cannot blow up memory either; items past the budget are skipped like those
/// of a long array.
const KEPT_ITEMS_BUDGET: u64 = 1 << 16;

/// ggml tensors have at most four dimensions (`GGML_MAX_DIMS`).
const MAX_DIMS: u32 = 4;

/// ggml tensor names are shorter than 64 bytes (`GGML_MAX_NAME`).
const MAX_TENSOR_NAME_BYTES: u64 = 63;

/// Dimensions are `int64_t` in ggml.
const MAX_DIM: u64 = i64::MAX as u64;

/// The outcome of parsing a prefix that did not yield a header.
#[derive(Debug, thiserror::Error)]
pub enum GgufParse {
    /// The header continues past the bytes given: read a prefix of at least `at_least`
    /// bytes and parse again. The bound is a lower bound (the header may turn out to be
    /// longer still); if the file is shorter than `at_least`, it is truncated.
    #[error("the GGUF header is longer than the bytes read; read at least {at_least} bytes")]
    NeedMore {
        /// The prefix length known to be needed.
        at_least: u64,
    },
    /// The bytes are not a valid GGUF header; reading more will not help.
    #[error(transparent)]
    Invalid(#[from] Error),
}

/// One tensor info of a GGUF header.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GgufTensorInfo {
    /// The tensor's name (`blk.0.attn_q.weight`).
    pub name: String,
    /// Dimensions in GGUF order: `dims[0]` (`ne[0]`) is the contiguous one, a row. This
    /// is the reverse of the row-major shapes of safetensors; see
    /// [`shape`](Self::shape).
    pub dims: Vec<u64>,
    /// Storage type.
    pub ggml_type: GgmlType,
    /// Offset of the tensor's data from the start of the data section.
    pub offset: u64,
    /// Number of elements.
    pub elements: u64,
    /// Exact bytes of the tensor's data, without the padding after it.
    pub bytes: Bytes,
}

impl GgufTensorInfo {
    /// The shape in row-major order, as PyTorch and safetensors write it (`dims`
    /// reversed).
    pub fn shape(&self) -> Vec<u64> {
        self.dims.iter().rev().copied().collect()
    }
}

/// A parsed and validated GGUF header.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GgufHeader {
    version: u32,
    metadata: BTreeMap<String, GgufValue>,
    tensors: Vec<GgufTensorInfo>,
    alignment: u64,
    header_len: u64,
    tensor_data_offset: u64,
    data_len: Bytes,
    totals: TensorTotals,
    by_type: BTreeMap<GgmlType, TensorTotals>,
}

impl GgufHeader {
    /// Parses the header from a prefix of a GGUF file. Bytes past the header (padding,
    /// tensor data) are ignored, so any prefix of at least [`header_len`](Self::header_len)
    /// bytes gives the same result.
    ///
    /// Errors: [`GgufParse::NeedMore`] if the prefix ends inside the header;
    /// [`GgufParse::Invalid`] with [`Error::GgufBadMagic`], [`Error::GgufVersion`],
    /// [`Error::GgufValueType`], [`Error::GgufLimit`], [`Error::GgufUtf8`],
    /// [`Error::GgufDuplicateKey`], [`Error::GgufDuplicateTensor`],
    /// [`Error::GgufAlignment`], [`Error::GgufTensor`] or [`Error::GgufTensorOffset`] if
    /// it is not a valid header.
    pub fn parse(prefix: &[u8]) -> Result<GgufHeader, GgufParse> {
        // Refuse a non-GGUF file from its first bytes, before asking for more.
        if prefix
            .iter()
            .zip(GGUF_MAGIC.iter())
            .any(|(found, magic)| found != magic)
        {
            return Err(Error::GgufBadMagic {
                found: prefix.iter().take(GGUF_MAGIC.len()).copied().collect(),
            }
            .into());
        }
        Parser::new(prefix).header()
    }

    /// Parses the header of a buffer that holds the whole file (or everything there is),
    /// so that running out of bytes is an error rather than a request for more.
    ///
    /// Errors: as [`parse`](Self::parse), with [`Error::GgufTruncated`] in place of
    /// `NeedMore`.
    pub fn parse_complete(file: &[u8]) -> Result<GgufHeader, Error> {
        Self::parse(file).map_err(|outcome| match outcome {
            GgufParse::NeedMore { at_least } => Error::GgufTruncated {
                needed: at_least,
                len: file.len() as u64,
            },
            GgufParse::Invalid(error) => error,
        })
    }

    /// The format version (2 or 3).
    pub fn version(&self) -> u32 {
        self.version
    }

    /// Every metadata pair, sorted by key.
    pub fn metadata(&self) -> &BTreeMap<String, GgufValue> {
        &self.metadata
    }

    /// The metadata value under `key`.
    pub fn get(&self, key: &str) -> Option<&GgufValue> {
        self.metadata.get(key)
    }

    /// The tensor infos, in file (and so data) order.
    pub fn tensors(&self) -> &[GgufTensorInfo] {
        &self.tensors
    }

    /// The alignment of the data section and of each tensor in it.
    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// Bytes of the header proper: where the last tensor info ends. A prefix this long
    /// parses.
    pub fn header_len(&self) -> u64 {
        self.header_len
    }

    /// Offset in the file where the tensor data starts: the header length rounded up
    /// to the alignment.
    pub fn tensor_data_offset(&self) -> u64 {
        self.tensor_data_offset
    }

    /// Length of the data section: every tensor padded to the alignment. A complete
    /// file is `tensor_data_offset() + data_len()` bytes long.
    pub fn data_len(&self) -> Bytes {
        self.data_len
    }

    /// Totals over all tensors (bytes exact, without padding).
    pub fn totals(&self) -> TensorTotals {
        self.totals
    }

    /// Totals per ggml type, in type-id order.
    pub fn by_type(&self) -> &BTreeMap<GgmlType, TensorTotals> {
        &self.by_type
    }

    /// `general.architecture` (`llama`, `qwen2`, …).
    pub fn architecture(&self) -> Option<&str> {
        self.get("general.architecture")?.as_str()
    }

    /// `general.file_type`: llama.cpp's `llama_ftype` id (15 is `Q4_K_M`); see
    /// [`GgufFileType`](crate::GgufFileType).
    pub fn file_type(&self) -> Option<u32> {
        u32::try_from(self.get("general.file_type")?.as_u64()?).ok()
    }

    /// `<arch>.block_count`: the number of transformer layers.
    pub fn block_count(&self) -> Option<u64> {
        self.arch_u64("block_count")
    }

    /// `<arch>.context_length`: the context the model was trained for.
    pub fn context_length(&self) -> Option<u64> {
        self.arch_u64("context_length")
    }

    /// `<arch>.embedding_length`: the hidden size.
    pub fn embedding_length(&self) -> Option<u64> {
        self.arch_u64("embedding_length")
    }

    /// `<arch>.attention.head_count`, when it is one number for all layers. Models with
    /// per-layer head counts store an array; read it with [`get`](Self::get).
    pub fn head_count(&self) -> Option<u64> {
        self.arch_u64("attention.head_count")
    }

    /// `<arch>.attention.head_count_kv`, when it is one number for all layers (as
    /// [`head_count`](Self::head_count)).
    pub fn head_count_kv(&self) -> Option<u64> {
        self.arch_u64("attention.head_count_kv")
    }

    fn arch_u64(&self, suffix: &str) -> Option<u64> {
        let arch = self.architecture()?;
        self.get(&format!("{arch}.{suffix}"))?.as_u64()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wrong_first_byte_is_refused_at_once() {
        assert!(matches!(
            GgufHeader::parse(b"G"),
            Err(GgufParse::NeedMore { at_least: 4 })
        ));
        assert!(matches!(GgufHeader::parse(b""), Err(GgufParse::NeedMore { .. })));
        let err = GgufHeader::parse(b"PK").unwrap_err();
        assert!(matches!(&err, GgufParse::Invalid(Error::GgufBadMagic { found }) if found == b"PK"));
        assert_eq!(
            err.to_string(),
            "not a GGUF file: it starts with \"PK\" instead of \"GGUF\""
        );
    }
}
