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

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use serde::Serialize;

use crate::safetensors::TensorTotals;
use crate::{Bytes, Error, GgmlType};

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

/// The type of a metadata value, as numbered in the file (`enum gguf_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
#[repr(u32)]
pub enum GgufValueType {
    /// `uint8_t`.
    U8 = 0,
    /// `int8_t`.
    I8 = 1,
    /// `uint16_t`.
    U16 = 2,
    /// `int16_t`.
    I16 = 3,
    /// `uint32_t`.
    U32 = 4,
    /// `int32_t`.
    I32 = 5,
    /// `float`.
    F32 = 6,
    /// A one-byte boolean.
    Bool = 7,
    /// A length-prefixed UTF-8 string.
    String = 8,
    /// A typed, length-prefixed array.
    Array = 9,
    /// `uint64_t`.
    U64 = 10,
    /// `int64_t`.
    I64 = 11,
    /// `double`.
    F64 = 12,
}

impl GgufValueType {
    /// The type with this id, if GGUF defines it.
    pub const fn from_id(id: u32) -> Option<Self> {
        Some(match id {
            0 => Self::U8,
            1 => Self::I8,
            2 => Self::U16,
            3 => Self::I16,
            4 => Self::U32,
            5 => Self::I32,
            6 => Self::F32,
            7 => Self::Bool,
            8 => Self::String,
            9 => Self::Array,
            10 => Self::U64,
            11 => Self::I64,
            12 => Self::F64,
            _ => return None,
        })
    }

    /// The id stored in the file.
    pub const fn id(self) -> u32 {
        self as u32
    }

    /// Size in bytes of one value of a fixed-size type; `None` for strings and arrays.
    pub const fn fixed_size(self) -> Option<u64> {
        match self {
            Self::U8 | Self::I8 | Self::Bool => Some(1),
            Self::U16 | Self::I16 => Some(2),
            Self::U32 | Self::I32 | Self::F32 => Some(4),
            Self::U64 | Self::I64 | Self::F64 => Some(8),
            Self::String | Self::Array => None,
        }
    }

    /// The fewest bytes a value of this type can take: its size, the 8-byte length of a
    /// string, or the 4-byte type and 8-byte length of an array.
    const fn min_size(self) -> u64 {
        match self {
            Self::String => 8,
            Self::Array => 12,
            _ => match self.fixed_size() {
                Some(size) => size,
                None => 1,
            },
        }
    }
}

impl fmt::Display for GgufValueType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match self {
            Self::U8 => "u8",
            Self::I8 => "i8",
            Self::U16 => "u16",
            Self::I16 => "i16",
            Self::U32 => "u32",
            Self::I32 => "i32",
            Self::F32 => "f32",
            Self::Bool => "bool",
            Self::String => "string",
            Self::Array => "array",
            Self::U64 => "u64",
            Self::I64 => "i64",
            Self::F64 => "f64",
        };
        f.pad(name)
    }
}

/// A metadata value.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum GgufValue {
    /// `uint8_t`.
    U8(u8),
    /// `int8_t`.
    I8(i8),
    /// `uint16_t`.
    U16(u16),
    /// `int16_t`.
    I16(i16),
    /// `uint32_t`.
    U32(u32),
    /// `int32_t`.
    I32(i32),
    /// `float`.
    F32(f32),
    /// A boolean (any non-zero byte is true).
    Bool(bool),
    /// A string. Bytes that are not UTF-8 are replaced by U+FFFD: values are for display
    /// and lookup, and some vocabularies hold raw byte tokens.
    String(String),
    /// An array, possibly kept only in part.
    Array(GgufArray),
    /// `uint64_t`.
    U64(u64),
    /// `int64_t`.
    I64(i64),
    /// `double`.
    F64(f64),
}

impl GgufValue {
    /// The type of the value.
    pub fn value_type(&self) -> GgufValueType {
        match self {
            Self::U8(_) => GgufValueType::U8,
            Self::I8(_) => GgufValueType::I8,
            Self::U16(_) => GgufValueType::U16,
            Self::I16(_) => GgufValueType::I16,
            Self::U32(_) => GgufValueType::U32,
            Self::I32(_) => GgufValueType::I32,
            Self::F32(_) => GgufValueType::F32,
            Self::Bool(_) => GgufValueType::Bool,
            Self::String(_) => GgufValueType::String,
            Self::Array(_) => GgufValueType::Array,
            Self::U64(_) => GgufValueType::U64,
            Self::I64(_) => GgufValueType::I64,
            Self::F64(_) => GgufValueType::F64,
        }
    }

    /// An integer of any width and signedness, if it is one and is not negative.
    /// Writers differ in the integer type of the same key (`u32` or `u64`).
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Self::U8(v) => Some(v.into()),
            Self::U16(v) => Some(v.into()),
            Self::U32(v) => Some(v.into()),
            Self::U64(v) => Some(v),
            Self::I8(v) => u64::try_from(v).ok(),
            Self::I16(v) => u64::try_from(v).ok(),
            Self::I32(v) => u64::try_from(v).ok(),
            Self::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// A float or integer as `f64` (large 64-bit integers round).
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Self::F32(v) => Some(v.into()),
            Self::F64(v) => Some(v),
            Self::I8(v) => Some(v.into()),
            Self::I16(v) => Some(v.into()),
            Self::I32(v) => Some(v.into()),
            Self::I64(v) => Some(v as f64),
            _ => self.as_u64().map(|v| v as f64),
        }
    }

    /// The string, if the value is one.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Self::String(s) => Some(s),
            _ => None,
        }
    }

    /// The boolean, if the value is one.
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Self::Bool(b) => Some(b),
            _ => None,
        }
    }

    /// The array, if the value is one.
    pub fn as_array(&self) -> Option<&GgufArray> {
        match self {
            Self::Array(a) => Some(a),
            _ => None,
        }
    }
}

impl fmt::Display for GgufValue {
    /// Scalars as themselves, strings quoted, arrays as their item type and length.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::U8(v) => write!(f, "{v}"),
            Self::I8(v) => write!(f, "{v}"),
            Self::U16(v) => write!(f, "{v}"),
            Self::I16(v) => write!(f, "{v}"),
            Self::U32(v) => write!(f, "{v}"),
            Self::I32(v) => write!(f, "{v}"),
            Self::F32(v) => write!(f, "{v}"),
            Self::Bool(v) => write!(f, "{v}"),
            Self::String(s) => write!(f, "{s:?}"),
            Self::Array(a) => write!(f, "[{}; {}]", a.item_type, a.len),
            Self::U64(v) => write!(f, "{v}"),
            Self::I64(v) => write!(f, "{v}"),
            Self::F64(v) => write!(f, "{v}"),
        }
    }
}

/// A metadata array: its item type, its length, and its leading items.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GgufArray {
    /// The type of every item.
    pub item_type: GgufValueType,
    /// The number of items in the file.
    pub len: u64,
    /// The leading items: all of them if the array has at most
    /// [`KEEP_WHOLE_ARRAY_ITEMS`] items, otherwise the first [`ARRAY_PREVIEW_ITEMS`] (fewer
    /// in a header so full of arrays that it exhausted the parser's item budget).
    pub items: Vec<GgufValue>,
}

impl GgufArray {
    /// Whether every item of the array was kept.
    pub fn is_complete(&self) -> bool {
        self.items.len() as u64 == self.len
    }
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

/// A reader over the prefix. Positions are `u64` and never exceed
/// [`MAX_HEADER_BYTES`], so they convert to `usize` on every supported target.
struct Parser<'a> {
    buf: &'a [u8],
    pos: u64,
    kept_items_left: u64,
}

type Parsed<T> = Result<T, GgufParse>;

/// A fixed-size little-endian number.
trait FromLe: Sized {
    const SIZE: usize;
    fn from_le(bytes: &[u8]) -> Option<Self>;
}

macro_rules! from_le {
    ($($t:ty),*) => {$(
        impl FromLe for $t {
            const SIZE: usize = std::mem::size_of::<$t>();
            fn from_le(bytes: &[u8]) -> Option<Self> {
                bytes.first_chunk().map(|chunk| <$t>::from_le_bytes(*chunk))
            }
        }
    )*};
}
from_le!(u8, i8, u16, i16, u32, i32, u64, i64, f32, f64);

impl<'a> Parser<'a> {
    fn new(buf: &'a [u8]) -> Self {
        Parser {
            buf,
            pos: 0,
            kept_items_left: KEPT_ITEMS_BUDGET,
        }
    }

    /// Checks that `len` more bytes are at hand, without consuming them.
    fn need(&self, len: u64) -> Parsed<u64> {
        let end = self.pos.saturating_add(len);
        if end > MAX_HEADER_BYTES {
            return Err(limit("header bytes", end, MAX_HEADER_BYTES));
        }
        if end > self.buf.len() as u64 {
            return Err(GgufParse::NeedMore { at_least: end });
        }
        Ok(end)
    }

    fn take(&mut self, len: u64) -> Parsed<&'a [u8]> {
        let end = self.need(len)?;
        let range = to_usize(self.pos)?..to_usize(end)?;
        // `need` checked `end <= buf.len()`, so `get` succeeds.
        let bytes = self.buf.get(range).ok_or(GgufParse::NeedMore { at_least: end })?;
        self.pos = end;
        Ok(bytes)
    }

    fn num<T: FromLe>(&mut self) -> Parsed<T> {
        let bytes = self.take(T::SIZE as u64)?;
        T::from_le(bytes).ok_or(GgufParse::NeedMore { at_least: self.pos })
    }

    fn string_bytes(&mut self) -> Parsed<&'a [u8]> {
        let len = self.num::<u64>()?;
        self.take(len)
    }

    /// A key or tensor name: must be UTF-8, since it is looked up by name.
    fn name(&mut self) -> Parsed<String> {
        let offset = self.pos;
        let bytes = self.string_bytes()?;
        match std::str::from_utf8(bytes) {
            Ok(name) => Ok(name.to_owned()),
            Err(_) => Err(Error::GgufUtf8 { offset }.into()),
        }
    }

    fn value_type(&mut self, key: &str) -> Parsed<GgufValueType> {
        let id = self.num::<u32>()?;
        GgufValueType::from_id(id).ok_or_else(|| {
            Error::GgufValueType {
                key: key.to_owned(),
                id,
            }
            .into()
        })
    }

    fn header(mut self) -> Parsed<GgufHeader> {
        self.take(GGUF_MAGIC.len() as u64)?;
        let version = self.num::<u32>()?;
        if !matches!(version, 2 | 3) {
            return Err(Error::GgufVersion { version }.into());
        }
        let tensor_count = self.num::<u64>()?;
        if tensor_count > MAX_TENSORS {
            return Err(limit("tensors", tensor_count, MAX_TENSORS));
        }
        let pair_count = self.num::<u64>()?;
        if pair_count > MAX_METADATA_PAIRS {
            return Err(limit("metadata pairs", pair_count, MAX_METADATA_PAIRS));
        }
        // A pair takes at least 13 bytes (key length, type, one byte of value) and a
        // tensor info 24 (name length, dimension count, type, offset): ask for that much
        // at once rather than discover it a few bytes at a time. Both counts are capped,
        // so the product cannot overflow.
        self.need(pair_count * 13 + tensor_count * 24)?;

        let mut metadata = BTreeMap::new();
        for _ in 0..pair_count {
            let key = self.name()?;
            if metadata.contains_key(&key) {
                return Err(Error::GgufDuplicateKey { key }.into());
            }
            let value_type = self.value_type(&key)?;
            let value = self.value(value_type, &key, 0)?;
            metadata.insert(key, value);
        }
        let alignment = alignment(&metadata)?;

        let mut tensors = Vec::new();
        let mut names = BTreeSet::new();
        let mut data_len: u64 = 0;
        let mut totals = TensorTotals::default();
        let mut by_type: BTreeMap<GgmlType, TensorTotals> = BTreeMap::new();
        for _ in 0..tensor_count {
            let tensor = self.tensor_info(data_len)?;
            if !names.insert(tensor.name.clone()) {
                return Err(Error::GgufDuplicateTensor { name: tensor.name }.into());
            }
            data_len = tensor
                .bytes
                .get()
                .checked_next_multiple_of(alignment)
                .and_then(|padded| data_len.checked_add(padded))
                .ok_or_else(|| tensor_error(&tensor, too_large(&tensor)))?;
            totals
                .add(tensor.elements, tensor.bytes)
                .and_then(|()| {
                    by_type
                        .entry(tensor.ggml_type)
                        .or_default()
                        .add(tensor.elements, tensor.bytes)
                })
                .ok_or_else(|| tensor_error(&tensor, too_large(&tensor)))?;
            tensors.push(tensor);
        }
        let header_len = self.pos;
        let tensor_data_offset = header_len
            .checked_next_multiple_of(alignment)
            .ok_or_else(|| limit("header bytes", header_len, MAX_HEADER_BYTES))?;
        Ok(GgufHeader {
            version,
            metadata,
            tensors,
            alignment,
            header_len,
            tensor_data_offset,
            data_len: Bytes::new(data_len),
            totals,
            by_type,
        })
    }

    fn value(&mut self, value_type: GgufValueType, key: &str, depth: u32) -> Parsed<GgufValue> {
        Ok(match value_type {
            GgufValueType::U8 => GgufValue::U8(self.num()?),
            GgufValueType::I8 => GgufValue::I8(self.num()?),
            GgufValueType::U16 => GgufValue::U16(self.num()?),
            GgufValueType::I16 => GgufValue::I16(self.num()?),
            GgufValueType::U32 => GgufValue::U32(self.num()?),
            GgufValueType::I32 => GgufValue::I32(self.num()?),
            GgufValueType::F32 => GgufValue::F32(self.num()?),
            GgufValueType::Bool => GgufValue::Bool(self.num::<u8>()? != 0),
            GgufValueType::String => GgufValue::String(String::from_utf8_lossy(self.string_bytes()?).into_owned()),
            GgufValueType::Array => GgufValue::Array(self.array(key, depth + 1)?),
            GgufValueType::U64 => GgufValue::U64(self.num()?),
            GgufValueType::I64 => GgufValue::I64(self.num()?),
            GgufValueType::F64 => GgufValue::F64(self.num()?),
        })
    }

    /// Reads an array header and checks that its items can all be in the file before
    /// keeping the leading ones and skipping the rest.
    fn array(&mut self, key: &str, depth: u32) -> Parsed<GgufArray> {
        let (item_type, len) = self.array_header(key, depth)?;
        let wanted = if len <= KEEP_WHOLE_ARRAY_ITEMS {
            len
        } else {
            ARRAY_PREVIEW_ITEMS
        };
        let keep = wanted.min(self.kept_items_left);
        self.kept_items_left -= keep;
        // `keep` is at most KEEP_WHOLE_ARRAY_ITEMS, so the allocation is small.
        let mut items = Vec::with_capacity(to_usize(keep)?);
        for _ in 0..keep {
            items.push(self.value(item_type, key, depth)?);
        }
        self.skip_items(item_type, len - keep, key, depth)?;
        Ok(GgufArray { item_type, len, items })
    }

    fn array_header(&mut self, key: &str, depth: u32) -> Parsed<(GgufValueType, u64)> {
        if depth > MAX_ARRAY_DEPTH {
            return Err(limit("array nesting depth", depth.into(), MAX_ARRAY_DEPTH.into()));
        }
        let item_type = self.value_type(key)?;
        let len = self.num::<u64>()?;
        let min_bytes = len.saturating_mul(item_type.min_size());
        self.need(min_bytes)?;
        Ok((item_type, len))
    }

    fn skip_items(&mut self, item_type: GgufValueType, count: u64, key: &str, depth: u32) -> Parsed<()> {
        if let Some(size) = item_type.fixed_size() {
            // `array_header` checked that `len * min_size` bytes are at hand.
            self.take(count.saturating_mul(size))?;
            return Ok(());
        }
        for _ in 0..count {
            match item_type {
                GgufValueType::Array => {
                    let (inner_type, inner_len) = self.array_header(key, depth + 1)?;
                    self.skip_items(inner_type, inner_len, key, depth + 1)?;
                }
                _ => {
                    self.string_bytes()?;
                }
            }
        }
        Ok(())
    }

    /// Reads one tensor info and validates it as ggml does; `expected_offset` is where
    /// its data must start (the padded end of the previous tensor).
    fn tensor_info(&mut self, expected_offset: u64) -> Parsed<GgufTensorInfo> {
        let name = self.name()?;
        if name.len() as u64 > MAX_TENSOR_NAME_BYTES {
            return Err(limit("tensor name bytes", name.len() as u64, MAX_TENSOR_NAME_BYTES));
        }
        let n_dims = self.num::<u32>()?;
        if n_dims > MAX_DIMS {
            return Err(limit("tensor dimensions", n_dims.into(), MAX_DIMS.into()));
        }
        let mut dims = Vec::with_capacity(to_usize(n_dims.into())?);
        for _ in 0..n_dims {
            let dim = self.num::<u64>()?;
            if dim > MAX_DIM {
                return Err(limit("tensor dimension", dim, MAX_DIM));
            }
            dims.push(dim);
        }
        let type_id = self.num::<u32>()?;
        let offset = self.num::<u64>()?;

        let ggml_type = GgmlType::from_id(type_id).map_err(|source| named_tensor_error(&name, source))?;
        let bytes = ggml_type
            .tensor_bytes(&dims)
            .map_err(|source| named_tensor_error(&name, source))?;
        let elements = dims
            .iter()
            .try_fold(1u64, |count, &dim| count.checked_mul(dim))
            .filter(|&count| count <= MAX_DIM)
            .ok_or_else(|| {
                named_tensor_error(
                    &name,
                    Error::TensorTooLarge {
                        dtype: ggml_type.into(),
                        shape: dims.clone(),
                    },
                )
            })?;
        if offset != expected_offset {
            return Err(Error::GgufTensorOffset {
                name,
                offset,
                expected: expected_offset,
            }
            .into());
        }
        Ok(GgufTensorInfo {
            name,
            dims,
            ggml_type,
            offset,
            elements,
            bytes,
        })
    }
}

/// `general.alignment`: a power of two that fits in a `u32`, or the default.
fn alignment(metadata: &BTreeMap<String, GgufValue>) -> Parsed<u64> {
    let Some(value) = metadata.get("general.alignment") else {
        return Ok(DEFAULT_ALIGNMENT);
    };
    match value.as_u64() {
        Some(alignment) if alignment.is_power_of_two() && alignment <= u64::from(u32::MAX) => Ok(alignment),
        _ => Err(Error::GgufAlignment {
            found: format!("{} {value}", value.value_type()),
        }
        .into()),
    }
}

fn to_usize(n: u64) -> Parsed<usize> {
    usize::try_from(n).map_err(|_| limit("header bytes", n, MAX_HEADER_BYTES))
}

fn limit(what: &'static str, value: u64, limit: u64) -> GgufParse {
    Error::GgufLimit { what, value, limit }.into()
}

fn named_tensor_error(name: &str, source: Error) -> GgufParse {
    Error::GgufTensor {
        name: name.to_owned(),
        source: Box::new(source),
    }
    .into()
}

fn tensor_error(tensor: &GgufTensorInfo, source: Error) -> GgufParse {
    named_tensor_error(&tensor.name, source)
}

fn too_large(tensor: &GgufTensorInfo) -> Error {
    Error::TensorTooLarge {
        dtype: tensor.ggml_type.into(),
        shape: tensor.dims.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn value_type_ids_match_gguf() {
        for id in 0..13 {
            let value_type = GgufValueType::from_id(id).unwrap();
            assert_eq!(value_type.id(), id);
        }
        assert_eq!(GgufValueType::from_id(13), None);
        assert_eq!(GgufValueType::String.to_string(), "string");
    }

    #[test]
    fn integers_of_any_width_read_as_u64() {
        assert_eq!(GgufValue::U32(7).as_u64(), Some(7));
        assert_eq!(GgufValue::I64(7).as_u64(), Some(7));
        assert_eq!(GgufValue::I8(-1).as_u64(), None);
        assert_eq!(GgufValue::F32(7.0).as_u64(), None);
        assert_eq!(GgufValue::I16(-3).as_f64(), Some(-3.0));
        assert_eq!(GgufValue::Bool(true).as_bool(), Some(true));
    }

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

    #[test]
    fn alignment_must_be_a_power_of_two() {
        let mut metadata = BTreeMap::new();
        assert_eq!(alignment(&metadata).unwrap(), 32);
        metadata.insert("general.alignment".to_owned(), GgufValue::U32(64));
        assert_eq!(alignment(&metadata).unwrap(), 64);
        for bad in [
            GgufValue::U32(0),
            GgufValue::U32(48),
            GgufValue::F32(32.0),
            GgufValue::U64(1 << 40),
        ] {
            metadata.insert("general.alignment".to_owned(), bad);
            assert!(matches!(
                alignment(&metadata),
                Err(GgufParse::Invalid(Error::GgufAlignment { .. }))
            ));
        }
    }
}
