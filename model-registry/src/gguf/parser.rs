//! The byte-level reader behind [`GgufHeader::parse`]: little-endian numbers, strings,
//! metadata values and arrays (kept in part, the rest skipped), and tensor infos, each
//! length checked against the bytes at hand and the limits before it is used.

use std::collections::{BTreeMap, BTreeSet};

use super::{
    ARRAY_PREVIEW_ITEMS, DEFAULT_ALIGNMENT, GGUF_MAGIC, GgufArray, GgufHeader, GgufParse, GgufTensorInfo, GgufValue,
    GgufValueType, KEEP_WHOLE_ARRAY_ITEMS, KEPT_ITEMS_BUDGET, MAX_ARRAY_DEPTH, MAX_DIM, MAX_DIMS, MAX_HEADER_BYTES,
    MAX_METADATA_PAIRS, MAX_TENSOR_NAME_BYTES, MAX_TENSORS,
};
use crate::safetensors::TensorTotals;
use crate::{Bytes, Error, GgmlType};

/// A reader over the prefix. Positions are `u64` and never exceed
/// [`MAX_HEADER_BYTES`], so they convert to `usize` on every supported target.
pub(super) struct Parser<'a> {
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
    pub(super) fn new(buf: &'a [u8]) -> Self {
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

    pub(super) fn header(mut self) -> Parsed<GgufHeader> {
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
