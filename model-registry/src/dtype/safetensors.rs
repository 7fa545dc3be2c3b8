//! The `dtype` strings of the safetensors format.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::{element_count, too_large};
use crate::{Bytes, Error};

/// The element type of a safetensors tensor, as named by the `dtype` field of the header.
///
/// The variants are exactly the dtypes of the reference implementation
/// (`huggingface/safetensors`, `safetensors/src/tensor.rs`, `enum Dtype`), spelled as in
/// the header so that each one can be found there and in files by the same name. Parsing
/// is case-sensitive, as it is in that implementation.
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SafetensorsDtype {
    /// Boolean, stored as one byte.
    BOOL,
    /// 4-bit float (OCP MX FP4, E2M1); two elements per byte.
    F4,
    /// 6-bit float (OCP MX FP6, E2M3).
    F6_E2M3,
    /// 6-bit float (OCP MX FP6, E3M2).
    F6_E3M2,
    /// Unsigned 8-bit integer.
    U8,
    /// Signed 8-bit integer.
    I8,
    /// 8-bit float, E5M2.
    F8_E5M2,
    /// 8-bit float, E4M3.
    F8_E4M3,
    /// 8-bit exponent-only scale (OCP MX E8M0).
    F8_E8M0,
    /// 8-bit float, E4M3 without negative zero or infinities (FNUZ).
    F8_E4M3FNUZ,
    /// 8-bit float, E5M2 without negative zero or infinities (FNUZ).
    F8_E5M2FNUZ,
    /// Signed 16-bit integer.
    I16,
    /// Unsigned 16-bit integer.
    U16,
    /// IEEE 754 half precision.
    F16,
    /// bfloat16.
    BF16,
    /// Signed 32-bit integer.
    I32,
    /// Unsigned 32-bit integer.
    U32,
    /// IEEE 754 single precision.
    F32,
    /// Complex number of two 32-bit floats.
    C64,
    /// IEEE 754 double precision.
    F64,
    /// Signed 64-bit integer.
    I64,
    /// Unsigned 64-bit integer.
    U64,
}

impl SafetensorsDtype {
    /// Every dtype, in the reference implementation's order (increasing alignment).
    pub const ALL: [SafetensorsDtype; 22] = [
        Self::BOOL,
        Self::F4,
        Self::F6_E2M3,
        Self::F6_E3M2,
        Self::U8,
        Self::I8,
        Self::F8_E5M2,
        Self::F8_E4M3,
        Self::F8_E8M0,
        Self::F8_E4M3FNUZ,
        Self::F8_E5M2FNUZ,
        Self::I16,
        Self::U16,
        Self::F16,
        Self::BF16,
        Self::I32,
        Self::U32,
        Self::F32,
        Self::C64,
        Self::F64,
        Self::I64,
        Self::U64,
    ];

    /// The name used in safetensors headers (`"BF16"`).
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::BOOL => "BOOL",
            Self::F4 => "F4",
            Self::F6_E2M3 => "F6_E2M3",
            Self::F6_E3M2 => "F6_E3M2",
            Self::U8 => "U8",
            Self::I8 => "I8",
            Self::F8_E5M2 => "F8_E5M2",
            Self::F8_E4M3 => "F8_E4M3",
            Self::F8_E8M0 => "F8_E8M0",
            Self::F8_E4M3FNUZ => "F8_E4M3FNUZ",
            Self::F8_E5M2FNUZ => "F8_E5M2FNUZ",
            Self::I16 => "I16",
            Self::U16 => "U16",
            Self::F16 => "F16",
            Self::BF16 => "BF16",
            Self::I32 => "I32",
            Self::U32 => "U32",
            Self::F32 => "F32",
            Self::C64 => "C64",
            Self::F64 => "F64",
            Self::I64 => "I64",
            Self::U64 => "U64",
        }
    }

    /// Width of one element in bits. `BOOL` takes a whole byte; `F4` and the `F6` types
    /// are packed below a byte.
    pub const fn bits(self) -> u32 {
        match self {
            Self::F4 => 4,
            Self::F6_E2M3 | Self::F6_E3M2 => 6,
            Self::BOOL
            | Self::U8
            | Self::I8
            | Self::F8_E5M2
            | Self::F8_E4M3
            | Self::F8_E8M0
            | Self::F8_E4M3FNUZ
            | Self::F8_E5M2FNUZ => 8,
            Self::I16 | Self::U16 | Self::F16 | Self::BF16 => 16,
            Self::I32 | Self::U32 | Self::F32 => 32,
            Self::C64 | Self::F64 | Self::I64 | Self::U64 => 64,
        }
    }

    /// Exact size in bytes of a tensor of this dtype and shape (any dimension order; an
    /// empty shape is a scalar).
    ///
    /// Errors: [`Error::MisalignedSubByte`] when a sub-byte dtype does not fill whole
    /// bytes (the format refuses such tensors), [`Error::TensorTooLarge`] on overflow.
    pub fn tensor_bytes(self, shape: &[u64]) -> Result<Bytes, Error> {
        let n_elements = element_count(shape).ok_or_else(|| too_large(self, shape))?;
        // Counted in u128: a u64 element count times 64 bits cannot overflow it, so only
        // the final byte count can be too large.
        let bits = u128::from(n_elements) * u128::from(self.bits());
        if bits % 8 != 0 {
            return Err(Error::MisalignedSubByte {
                dtype: self,
                n_elements,
            });
        }
        u64::try_from(bits / 8)
            .map(Bytes::new)
            .map_err(|_| too_large(self, shape))
    }
}

impl fmt::Display for SafetensorsDtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.as_str())
    }
}

impl FromStr for SafetensorsDtype {
    type Err = Error;

    /// Parses a header `dtype` string. Unknown strings are refused; one that matches a
    /// dtype except for letter case gets a suggestion in the error.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if let Some(&dtype) = Self::ALL.iter().find(|dtype| dtype.as_str() == s) {
            return Ok(dtype);
        }
        Err(Error::UnknownSafetensorsDtype {
            found: s.to_owned(),
            suggestion: Self::ALL
                .iter()
                .copied()
                .find(|dtype| dtype.as_str().eq_ignore_ascii_case(s)),
        })
    }
}

impl Serialize for SafetensorsDtype {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for SafetensorsDtype {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let name = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
        name.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_dtype_round_trips_through_its_name() {
        for dtype in SafetensorsDtype::ALL {
            assert_eq!(dtype.as_str().parse::<SafetensorsDtype>().unwrap(), dtype);
            assert_eq!(dtype.to_string(), dtype.as_str());
        }
    }

    #[test]
    fn all_lists_each_dtype_once_in_declaration_order() {
        // The derived `Ord` follows declaration order, so a strictly increasing array has
        // no duplicates and keeps the reference order.
        let mut sorted = SafetensorsDtype::ALL;
        sorted.sort();
        sorted.windows(2).for_each(|w| assert!(w[0] < w[1]));
        assert_eq!(sorted, SafetensorsDtype::ALL);
    }

    #[test]
    fn bits_match_the_reference_implementation() {
        use SafetensorsDtype as D;
        let expected = [
            (D::BOOL, 8),
            (D::F4, 4),
            (D::F6_E2M3, 6),
            (D::F6_E3M2, 6),
            (D::U8, 8),
            (D::I8, 8),
            (D::F8_E5M2, 8),
            (D::F8_E4M3, 8),
            (D::F8_E8M0, 8),
            (D::F8_E4M3FNUZ, 8),
            (D::F8_E5M2FNUZ, 8),
            (D::I16, 16),
            (D::U16, 16),
            (D::F16, 16),
            (D::BF16, 16),
            (D::I32, 32),
            (D::U32, 32),
            (D::F32, 32),
            (D::C64, 64),
            (D::F64, 64),
            (D::I64, 64),
            (D::U64, 64),
        ];
        assert_eq!(expected.len(), SafetensorsDtype::ALL.len());
        for (dtype, bits) in expected {
            assert_eq!(dtype.bits(), bits, "{dtype}");
        }
    }

    #[test]
    fn unknown_dtype_is_a_clear_error() {
        let err = "Q4_K".parse::<SafetensorsDtype>().unwrap_err();
        assert!(matches!(
            &err,
            Error::UnknownSafetensorsDtype { found, suggestion: None } if found == "Q4_K"
        ));
        assert_eq!(err.to_string(), "unknown safetensors dtype `Q4_K`");

        let err = "bf16".parse::<SafetensorsDtype>().unwrap_err();
        assert_eq!(
            err.to_string(),
            "unknown safetensors dtype `bf16`; help: dtype names are case-sensitive, \
             did you mean `BF16`?"
        );
        assert!("".parse::<SafetensorsDtype>().is_err());
    }

    #[test]
    fn tensor_bytes_of_dense_dtypes() {
        // Llama-3-8B's embedding: 128256 x 4096 in BF16.
        assert_eq!(
            SafetensorsDtype::BF16.tensor_bytes(&[128_256, 4096]).unwrap(),
            Bytes::new(1_050_673_152)
        );
        assert_eq!(SafetensorsDtype::F32.tensor_bytes(&[]).unwrap(), Bytes::new(4));
        assert_eq!(SafetensorsDtype::C64.tensor_bytes(&[3]).unwrap(), Bytes::new(24));
        assert_eq!(SafetensorsDtype::BOOL.tensor_bytes(&[5]).unwrap(), Bytes::new(5));
        assert_eq!(SafetensorsDtype::I64.tensor_bytes(&[0, 9]).unwrap(), Bytes::ZERO);
    }

    #[test]
    fn tensor_bytes_of_sub_byte_dtypes_must_fill_bytes() {
        assert_eq!(SafetensorsDtype::F4.tensor_bytes(&[2, 3]).unwrap(), Bytes::new(3));
        assert_eq!(SafetensorsDtype::F6_E2M3.tensor_bytes(&[4]).unwrap(), Bytes::new(3));
        let err = SafetensorsDtype::F4.tensor_bytes(&[3]).unwrap_err();
        assert!(matches!(
            err,
            Error::MisalignedSubByte {
                dtype: SafetensorsDtype::F4,
                n_elements: 3
            }
        ));
        assert_eq!(
            err.to_string(),
            "3 elements of F4 take 12 bits, which is not a whole number of bytes"
        );
        assert!(SafetensorsDtype::F6_E3M2.tensor_bytes(&[2]).is_err());
    }

    #[test]
    fn tensor_bytes_refuses_overflow() {
        let err = SafetensorsDtype::F32.tensor_bytes(&[1 << 62, 2]).unwrap_err();
        assert!(matches!(&err, Error::TensorTooLarge { shape, .. } if shape == &[1 << 62, 2]));
        assert!(SafetensorsDtype::U8.tensor_bytes(&[u64::MAX, 2]).is_err());
        assert!(SafetensorsDtype::U16.tensor_bytes(&[u64::MAX]).is_err());
        assert_eq!(
            SafetensorsDtype::U8.tensor_bytes(&[u64::MAX]).unwrap(),
            Bytes::new(u64::MAX)
        );
    }

    #[test]
    fn serde_uses_the_header_name() {
        let json = serde_json::to_string(&SafetensorsDtype::F8_E4M3).unwrap();
        assert_eq!(json, r#""F8_E4M3""#);
        let back: SafetensorsDtype = serde_json::from_str(r#""F8_E4M3""#).unwrap();
        assert_eq!(back, SafetensorsDtype::F8_E4M3);
        let err = serde_json::from_str::<SafetensorsDtype>(r#""F128""#).unwrap_err();
        assert!(err.to_string().contains("unknown safetensors dtype `F128`"), "{err}");
    }
}
