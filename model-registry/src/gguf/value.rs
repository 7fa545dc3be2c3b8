//! Metadata values: their type ids ([`GgufValueType`]), the values themselves
//! ([`GgufValue`]) and arrays kept in part ([`GgufArray`]). Reading them from the file is
//! the parser's work.

use std::fmt;

use serde::Serialize;

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
    pub(super) const fn min_size(self) -> u64 {
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
    ///
    /// [`KEEP_WHOLE_ARRAY_ITEMS`]: super::KEEP_WHOLE_ARRAY_ITEMS
    /// [`ARRAY_PREVIEW_ITEMS`]: super::ARRAY_PREVIEW_ITEMS
    pub items: Vec<GgufValue>,
}

impl GgufArray {
    /// Whether every item of the array was kept.
    pub fn is_complete(&self) -> bool {
        self.items.len() as u64 == self.len
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
}
