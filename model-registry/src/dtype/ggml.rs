//! GGUF tensor types and ggml's block layouts.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::{element_count, too_large};
use crate::{Bytes, Error};

/// Elements in a k-quant super-block (`QK_K` in `ggml-common.h`).
const QK_K: u64 = 256;
/// Bytes of packed 6-bit scales in `Q4_K` and `Q5_K` blocks (`K_SCALE_SIZE`).
const K_SCALE_SIZE: u64 = 12;
/// Bytes of a `ggml_half` (an IEEE half float).
const HALF: u64 = 2;

/// The storage type of a GGUF tensor, identified in the file by its numeric id.
///
/// Variant names and ids are those of `enum ggml_type` in ggml's `ggml.h`; gaps in the ids
/// belong to types that ggml removed (see [`GgmlType::from_id`]). Each type stores
/// [`elements_per_block`](Self::elements_per_block) elements in
/// [`bytes_per_block`](Self::bytes_per_block) bytes; the figures are the block structs of
/// `ggml-common.h` (each guarded there by a `static_assert` on its size).
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[repr(u32)]
pub enum GgmlType {
    /// 32-bit float.
    F32 = 0,
    /// 16-bit float.
    F16 = 1,
    /// 4-bit, blocks of 32 with one half-float scale.
    Q4_0 = 2,
    /// 4-bit, blocks of 32 with scale and minimum.
    Q4_1 = 3,
    /// 5-bit, blocks of 32 with one scale.
    Q5_0 = 6,
    /// 5-bit, blocks of 32 with scale and minimum.
    Q5_1 = 7,
    /// 8-bit, blocks of 32 with one scale.
    Q8_0 = 8,
    /// 8-bit, blocks of 32 with scale and sum (an intermediate type for dot products).
    Q8_1 = 9,
    /// 2-bit k-quant, 2.625 bits per weight.
    Q2_K = 10,
    /// 3-bit k-quant, 3.4375 bits per weight.
    Q3_K = 11,
    /// 4-bit k-quant, 4.5 bits per weight.
    Q4_K = 12,
    /// 5-bit k-quant, 5.5 bits per weight.
    Q5_K = 13,
    /// 6-bit k-quant, 6.5625 bits per weight.
    Q6_K = 14,
    /// 8-bit k-quant (an intermediate type for dot products).
    Q8_K = 15,
    /// i-quant, 2.0625 bits per weight.
    IQ2_XXS = 16,
    /// i-quant, 2.3125 bits per weight.
    IQ2_XS = 17,
    /// i-quant, 3.0625 bits per weight.
    IQ3_XXS = 18,
    /// i-quant, 1.5625 bits per weight.
    IQ1_S = 19,
    /// Non-linear 4-bit, blocks of 32.
    IQ4_NL = 20,
    /// i-quant, 3.4375 bits per weight.
    IQ3_S = 21,
    /// i-quant, 2.5625 bits per weight.
    IQ2_S = 22,
    /// Non-linear 4-bit in super-blocks of 256, 4.25 bits per weight.
    IQ4_XS = 23,
    /// Signed 8-bit integer.
    I8 = 24,
    /// Signed 16-bit integer.
    I16 = 25,
    /// Signed 32-bit integer.
    I32 = 26,
    /// Signed 64-bit integer.
    I64 = 27,
    /// 64-bit float.
    F64 = 28,
    /// i-quant, 1.75 bits per weight.
    IQ1_M = 29,
    /// bfloat16.
    BF16 = 30,
    /// Ternary, 1.6875 bits per weight.
    TQ1_0 = 34,
    /// Ternary, 2.0625 bits per weight.
    TQ2_0 = 35,
    /// OCP MX FP4: blocks of 32 E2M1 values with one E8M0 scale.
    MXFP4 = 39,
    /// NVIDIA FP4: blocks of 64 E2M1 values with four E4M3 scales.
    NVFP4 = 40,
    /// 1-bit, blocks of 128 with one half-float scale.
    Q1_0 = 41,
    /// 2-bit, blocks of 64 with one half-float scale.
    Q2_0 = 42,
}

/// Ids that ggml once assigned and then removed. GGUF files that use them are refused by
/// current loaders, so they get their own error.
const REMOVED: [(u32, &str); 8] = [
    (4, "Q4_2"),
    (5, "Q4_3"),
    (31, "Q4_0_4_4"),
    (32, "Q4_0_4_8"),
    (33, "Q4_0_8_8"),
    (36, "IQ4_NL_4_4"),
    (37, "IQ4_NL_4_8"),
    (38, "IQ4_NL_8_8"),
];

impl GgmlType {
    /// Every type, in id order.
    pub const ALL: [GgmlType; 35] = [
        Self::F32,
        Self::F16,
        Self::Q4_0,
        Self::Q4_1,
        Self::Q5_0,
        Self::Q5_1,
        Self::Q8_0,
        Self::Q8_1,
        Self::Q2_K,
        Self::Q3_K,
        Self::Q4_K,
        Self::Q5_K,
        Self::Q6_K,
        Self::Q8_K,
        Self::IQ2_XXS,
        Self::IQ2_XS,
        Self::IQ3_XXS,
        Self::IQ1_S,
        Self::IQ4_NL,
        Self::IQ3_S,
        Self::IQ2_S,
        Self::IQ4_XS,
        Self::I8,
        Self::I16,
        Self::I32,
        Self::I64,
        Self::F64,
        Self::IQ1_M,
        Self::BF16,
        Self::TQ1_0,
        Self::TQ2_0,
        Self::MXFP4,
        Self::NVFP4,
        Self::Q1_0,
        Self::Q2_0,
    ];

    /// The type with this GGUF id.
    ///
    /// Errors: [`Error::RemovedGgmlType`] for an id ggml has retired,
    /// [`Error::UnknownGgmlType`] for any other id not listed here.
    pub fn from_id(id: u32) -> Result<Self, Error> {
        if let Some(&ggml_type) = Self::ALL.iter().find(|t| t.id() == id) {
            return Ok(ggml_type);
        }
        match REMOVED.iter().find(|(removed, _)| *removed == id) {
            Some(&(id, name)) => Err(Error::RemovedGgmlType { id, name }),
            None => Err(Error::UnknownGgmlType { id }),
        }
    }

    /// The numeric id stored in GGUF tensor infos.
    pub const fn id(self) -> u32 {
        self as u32
    }

    /// The name of the type, as in `GGML_TYPE_<name>` (`"Q4_K"`).
    pub const fn name(self) -> &'static str {
        match self {
            Self::F32 => "F32",
            Self::F16 => "F16",
            Self::Q4_0 => "Q4_0",
            Self::Q4_1 => "Q4_1",
            Self::Q5_0 => "Q5_0",
            Self::Q5_1 => "Q5_1",
            Self::Q8_0 => "Q8_0",
            Self::Q8_1 => "Q8_1",
            Self::Q2_K => "Q2_K",
            Self::Q3_K => "Q3_K",
            Self::Q4_K => "Q4_K",
            Self::Q5_K => "Q5_K",
            Self::Q6_K => "Q6_K",
            Self::Q8_K => "Q8_K",
            Self::IQ2_XXS => "IQ2_XXS",
            Self::IQ2_XS => "IQ2_XS",
            Self::IQ3_XXS => "IQ3_XXS",
            Self::IQ1_S => "IQ1_S",
            Self::IQ4_NL => "IQ4_NL",
            Self::IQ3_S => "IQ3_S",
            Self::IQ2_S => "IQ2_S",
            Self::IQ4_XS => "IQ4_XS",
            Self::I8 => "I8",
            Self::I16 => "I16",
            Self::I32 => "I32",
            Self::I64 => "I64",
            Self::F64 => "F64",
            Self::IQ1_M => "IQ1_M",
            Self::BF16 => "BF16",
            Self::TQ1_0 => "TQ1_0",
            Self::TQ2_0 => "TQ2_0",
            Self::MXFP4 => "MXFP4",
            Self::NVFP4 => "NVFP4",
            Self::Q1_0 => "Q1_0",
            Self::Q2_0 => "Q2_0",
        }
    }

    /// `(elements per block, bytes per block)`, written as the `static_assert`ed size
    /// expressions of the block structs in `ggml-common.h` so that each line can be
    /// checked against its struct.
    const fn layout(self) -> (u64, u64) {
        match self {
            Self::F32 => (1, 4),
            Self::F16 | Self::BF16 => (1, HALF),
            Self::I8 => (1, 1),
            Self::I16 => (1, 2),
            Self::I32 => (1, 4),
            Self::I64 | Self::F64 => (1, 8),
            // block_q4_0: d, qs[QK4_0 / 2]
            Self::Q4_0 => (32, HALF + 32 / 2),
            // block_q4_1: d, m, qs[QK4_1 / 2]
            Self::Q4_1 => (32, 2 * HALF + 32 / 2),
            // block_q5_0: d, qh[4], qs[QK5_0 / 2]
            Self::Q5_0 => (32, HALF + 4 + 32 / 2),
            // block_q5_1: d, m, qh[4], qs[QK5_1 / 2]
            Self::Q5_1 => (32, 2 * HALF + 4 + 32 / 2),
            // block_q8_0: d, qs[QK8_0]
            Self::Q8_0 => (32, HALF + 32),
            // block_q8_1: d, s, qs[QK8_1]
            Self::Q8_1 => (32, 2 * HALF + 32),
            // block_q2_K: scales[QK_K/16], qs[QK_K/4], d, dmin
            Self::Q2_K => (QK_K, 2 * HALF + QK_K / 16 + QK_K / 4),
            // block_q3_K: hmask[QK_K/8], qs[QK_K/4], scales[12], d
            Self::Q3_K => (QK_K, HALF + QK_K / 4 + QK_K / 8 + 12),
            // block_q4_K: d, dmin, scales[K_SCALE_SIZE], qs[QK_K/2]
            Self::Q4_K => (QK_K, 2 * HALF + K_SCALE_SIZE + QK_K / 2),
            // block_q5_K: d, dmin, scales[K_SCALE_SIZE], qh[QK_K/8], qs[QK_K/2]
            Self::Q5_K => (QK_K, 2 * HALF + K_SCALE_SIZE + QK_K / 8 + QK_K / 2),
            // block_q6_K: ql[QK_K/2], qh[QK_K/4], scales[QK_K/16], d
            Self::Q6_K => (QK_K, HALF + QK_K / 16 + 3 * QK_K / 4),
            // block_q8_K: float d, qs[QK_K], int16 bsums[QK_K/16]
            Self::Q8_K => (QK_K, 4 + QK_K + QK_K / 16 * 2),
            // block_iq2_xxs: d, uint16 qs[QK_K/8]
            Self::IQ2_XXS => (QK_K, HALF + QK_K / 8 * 2),
            // block_iq2_xs: d, uint16 qs[QK_K/8], scales[QK_K/32]
            Self::IQ2_XS => (QK_K, HALF + QK_K / 8 * 2 + QK_K / 32),
            // block_iq3_xxs: d, qs[3*QK_K/8]
            Self::IQ3_XXS => (QK_K, HALF + 3 * (QK_K / 8)),
            // block_iq1_s: d, qs[QK_K/8], uint16 qh[QK_K/32]
            Self::IQ1_S => (QK_K, HALF + QK_K / 8 + QK_K / 16),
            // block_iq4_nl: d, qs[QK4_NL/2]
            Self::IQ4_NL => (32, HALF + 32 / 2),
            // block_iq3_s: d, qs[QK_K/4], qh[QK_K/32], signs[QK_K/8], scales[QK_K/64]
            Self::IQ3_S => (QK_K, HALF + 13 * (QK_K / 32) + QK_K / 64),
            // block_iq2_s: d, qs[QK_K/4], qh[QK_K/32], scales[QK_K/32]
            Self::IQ2_S => (QK_K, HALF + QK_K / 4 + QK_K / 16),
            // block_iq4_xs: d, uint16 scales_h, scales_l[QK_K/64], qs[QK_K/2]
            Self::IQ4_XS => (QK_K, HALF + 2 + QK_K / 64 + QK_K / 2),
            // block_iq1_m: qs[QK_K/8], qh[QK_K/16], scales[QK_K/32] (no separate scale)
            Self::IQ1_M => (QK_K, QK_K / 8 + QK_K / 16 + QK_K / 32),
            // block_tq1_0: qs[(QK_K - 4*QK_K/64)/5], qh[QK_K/64], d
            Self::TQ1_0 => (QK_K, HALF + QK_K / 64 + (QK_K - 4 * QK_K / 64) / 5),
            // block_tq2_0: qs[QK_K/4], d
            Self::TQ2_0 => (QK_K, HALF + QK_K / 4),
            // block_mxfp4: uint8 e, qs[QK_MXFP4/2]
            Self::MXFP4 => (32, 1 + 32 / 2),
            // block_nvfp4: d[QK_NVFP4/QK_NVFP4_SUB], qs[QK_NVFP4/2]
            Self::NVFP4 => (64, 64 / 16 + 64 / 2),
            // block_q1_0: d, qs[QK1_0/8]
            Self::Q1_0 => (128, HALF + 128 / 8),
            // block_q2_0: d, qs[QK2_0/4]
            Self::Q2_0 => (64, HALF + 64 / 4),
        }
    }

    /// Elements stored in one block (ggml's `blck_size`); 1 for unquantized types.
    pub const fn elements_per_block(self) -> u64 {
        self.layout().0
    }

    /// Bytes taken by one block (ggml's `type_size`).
    pub const fn bytes_per_block(self) -> u64 {
        self.layout().1
    }

    /// Whether the type stores elements in multi-element blocks (ggml's
    /// `ggml_is_quantized`).
    pub const fn is_quantized(self) -> bool {
        self.elements_per_block() > 1
    }

    /// Average storage bits per element, scales included (`Q4_K` is 4.5). Useful to rank
    /// variants; use [`tensor_bytes`](Self::tensor_bytes) for exact sizes.
    pub fn bits_per_weight(self) -> f64 {
        // Both figures are small (at most 292 and 256), so the conversion is exact.
        (self.bytes_per_block() * 8) as f64 / self.elements_per_block() as f64
    }

    /// Exact size in bytes of one row of `row_elements` elements (ggml's `ggml_row_size`).
    ///
    /// Errors: [`Error::PartialBlock`] if `row_elements` is not a multiple of
    /// [`elements_per_block`](Self::elements_per_block): ggml quantizes whole blocks
    /// only, and `gguf_init` refuses such a tensor.
    pub fn row_bytes(self, row_elements: u64) -> Result<Bytes, Error> {
        self.tensor_bytes(&[row_elements])
    }

    /// Exact size in bytes of a tensor with GGUF dimensions `ne` (ggml's `ggml_nbytes`
    /// for a contiguous tensor).
    ///
    /// `ne` is in GGUF order: `ne[0]` is the contiguous dimension (a row), the opposite of
    /// the row-major shapes of safetensors and PyTorch. Each row is a whole number of
    /// blocks, so the size is `ne[0] / elements_per_block * bytes_per_block` times the
    /// product of the other dimensions. An empty `ne` is a scalar (one element).
    ///
    /// Errors: [`Error::PartialBlock`] if `ne[0]` is not a multiple of
    /// [`elements_per_block`](Self::elements_per_block), [`Error::TensorTooLarge`] on
    /// overflow.
    pub fn tensor_bytes(self, ne: &[u64]) -> Result<Bytes, Error> {
        let (row_elements, rest) = match ne.split_first() {
            Some((&first, rest)) => (first, rest),
            None => (1, ne),
        };
        let (per_block, block_bytes) = self.layout();
        if row_elements % per_block != 0 {
            return Err(Error::PartialBlock {
                ggml_type: self,
                row_elements,
            });
        }
        (row_elements / per_block)
            .checked_mul(block_bytes)
            .zip(element_count(rest))
            .and_then(|(row_bytes, rows)| row_bytes.checked_mul(rows))
            .map(Bytes::new)
            .ok_or_else(|| too_large(self, ne))
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.name())
    }
}

impl FromStr for GgmlType {
    type Err = Error;

    /// Parses a type name, ignoring letter case: ggml itself prints `q4_K` where `ggml.h`
    /// says `Q4_K`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .iter()
            .copied()
            .find(|t| t.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| Error::UnknownGgmlTypeName { found: s.to_owned() })
    }
}

impl TryFrom<u32> for GgmlType {
    type Error = Error;

    fn try_from(id: u32) -> Result<Self, Self::Error> {
        Self::from_id(id)
    }
}

impl Serialize for GgmlType {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.name())
    }
}

impl<'de> Deserialize<'de> for GgmlType {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let name = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
        name.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// `(type, elements per block, bytes per block)`, typed in from the block structs of
    /// ggml-common.h and cross-checked against ggml's type_traits table; independent of
    /// the expressions in `layout`.
    const KNOWN: [(GgmlType, u64, u64); 35] = [
        (GgmlType::F32, 1, 4),
        (GgmlType::F16, 1, 2),
        (GgmlType::Q4_0, 32, 18),
        (GgmlType::Q4_1, 32, 20),
        (GgmlType::Q5_0, 32, 22),
        (GgmlType::Q5_1, 32, 24),
        (GgmlType::Q8_0, 32, 34),
        (GgmlType::Q8_1, 32, 36),
        (GgmlType::Q2_K, 256, 84),
        (GgmlType::Q3_K, 256, 110),
        (GgmlType::Q4_K, 256, 144),
        (GgmlType::Q5_K, 256, 176),
        (GgmlType::Q6_K, 256, 210),
        (GgmlType::Q8_K, 256, 292),
        (GgmlType::IQ2_XXS, 256, 66),
        (GgmlType::IQ2_XS, 256, 74),
        (GgmlType::IQ3_XXS, 256, 98),
        (GgmlType::IQ1_S, 256, 50),
        (GgmlType::IQ4_NL, 32, 18),
        (GgmlType::IQ3_S, 256, 110),
        (GgmlType::IQ2_S, 256, 82),
        (GgmlType::IQ4_XS, 256, 136),
        (GgmlType::I8, 1, 1),
        (GgmlType::I16, 1, 2),
        (GgmlType::I32, 1, 4),
        (GgmlType::I64, 1, 8),
        (GgmlType::F64, 1, 8),
        (GgmlType::IQ1_M, 256, 56),
        (GgmlType::BF16, 1, 2),
        (GgmlType::TQ1_0, 256, 54),
        (GgmlType::TQ2_0, 256, 66),
        (GgmlType::MXFP4, 32, 17),
        (GgmlType::NVFP4, 64, 36),
        (GgmlType::Q1_0, 128, 18),
        (GgmlType::Q2_0, 64, 18),
    ];

    #[test]
    fn block_layouts_match_ggml() {
        for (ggml_type, elements, bytes) in KNOWN {
            assert_eq!(ggml_type.elements_per_block(), elements, "{ggml_type} elements");
            assert_eq!(ggml_type.bytes_per_block(), bytes, "{ggml_type} bytes");
        }
        let listed: Vec<_> = KNOWN.iter().map(|k| k.0).collect();
        assert_eq!(listed, GgmlType::ALL);
    }

    #[test]
    fn ids_match_ggml_h() {
        let expected = [
            (GgmlType::F32, 0),
            (GgmlType::F16, 1),
            (GgmlType::Q4_0, 2),
            (GgmlType::Q4_1, 3),
            (GgmlType::Q5_0, 6),
            (GgmlType::Q5_1, 7),
            (GgmlType::Q8_0, 8),
            (GgmlType::Q8_1, 9),
            (GgmlType::Q2_K, 10),
            (GgmlType::Q3_K, 11),
            (GgmlType::Q4_K, 12),
            (GgmlType::Q5_K, 13),
            (GgmlType::Q6_K, 14),
            (GgmlType::Q8_K, 15),
            (GgmlType::IQ2_XXS, 16),
            (GgmlType::IQ2_XS, 17),
            (GgmlType::IQ3_XXS, 18),
            (GgmlType::IQ1_S, 19),
            (GgmlType::IQ4_NL, 20),
            (GgmlType::IQ3_S, 21),
            (GgmlType::IQ2_S, 22),
            (GgmlType::IQ4_XS, 23),
            (GgmlType::I8, 24),
            (GgmlType::I16, 25),
            (GgmlType::I32, 26),
            (GgmlType::I64, 27),
            (GgmlType::F64, 28),
            (GgmlType::IQ1_M, 29),
            (GgmlType::BF16, 30),
            (GgmlType::TQ1_0, 34),
            (GgmlType::TQ2_0, 35),
            (GgmlType::MXFP4, 39),
            (GgmlType::NVFP4, 40),
            (GgmlType::Q1_0, 41),
            (GgmlType::Q2_0, 42),
        ];
        for (ggml_type, id) in expected {
            assert_eq!(ggml_type.id(), id, "{ggml_type}");
            assert_eq!(GgmlType::from_id(id).unwrap(), ggml_type);
            assert_eq!(GgmlType::try_from(id).unwrap(), ggml_type);
        }
    }

    #[test]
    fn every_id_up_to_64_is_known_removed_or_unknown() {
        for id in 0..64 {
            match GgmlType::from_id(id) {
                Ok(ggml_type) => assert_eq!(ggml_type.id(), id),
                Err(Error::RemovedGgmlType { id: removed, .. }) => {
                    assert_eq!(removed, id);
                    assert!(REMOVED.iter().any(|r| r.0 == id));
                }
                Err(Error::UnknownGgmlType { id: unknown }) => {
                    assert_eq!(unknown, id);
                    assert!(id > 42, "id {id} is inside ggml's range but unlisted");
                }
                Err(other) => panic!("unexpected error {other:?}"),
            }
        }
    }

    #[test]
    fn unknown_and_removed_ids_are_clear_errors() {
        assert_eq!(
            GgmlType::from_id(31).unwrap_err().to_string(),
            "GGML tensor type id 31 (Q4_0_4_4) was removed from ggml and is no longer \
             loadable; help: re-convert the model with a current llama.cpp"
        );
        assert_eq!(
            GgmlType::from_id(1000).unwrap_err().to_string(),
            "unknown GGML tensor type id 1000; help: the file may need a newer Skein"
        );
    }

    #[test]
    fn names_round_trip_ignoring_case() {
        for ggml_type in GgmlType::ALL {
            assert_eq!(ggml_type.name().parse::<GgmlType>().unwrap(), ggml_type);
            assert_eq!(ggml_type.to_string(), ggml_type.name());
        }
        assert_eq!("q4_K".parse::<GgmlType>().unwrap(), GgmlType::Q4_K);
        assert_eq!("iq2_xxs".parse::<GgmlType>().unwrap(), GgmlType::IQ2_XXS);
        assert!(matches!(
            "Q4_K_M".parse::<GgmlType>(),
            Err(Error::UnknownGgmlTypeName { found }) if found == "Q4_K_M"
        ));
    }

    #[test]
    fn bits_per_weight_matches_ggml_comments() {
        let expected = [
            (GgmlType::Q2_K, 2.625),
            (GgmlType::Q3_K, 3.4375),
            (GgmlType::Q4_K, 4.5),
            (GgmlType::Q5_K, 5.5),
            (GgmlType::Q6_K, 6.5625),
            (GgmlType::IQ2_XXS, 2.0625),
            (GgmlType::IQ2_XS, 2.3125),
            (GgmlType::IQ2_S, 2.5625),
            (GgmlType::IQ3_XXS, 3.0625),
            (GgmlType::IQ3_S, 3.4375),
            (GgmlType::IQ1_S, 1.5625),
            (GgmlType::IQ1_M, 1.75),
            (GgmlType::TQ1_0, 1.6875),
            (GgmlType::TQ2_0, 2.0625),
            (GgmlType::Q8_0, 8.5),
            (GgmlType::F16, 16.0),
        ];
        for (ggml_type, bpw) in expected {
            assert_eq!(ggml_type.bits_per_weight(), bpw, "{ggml_type}");
        }
    }

    #[test]
    fn is_quantized_matches_ggml() {
        let dense = [
            GgmlType::F32,
            GgmlType::F16,
            GgmlType::BF16,
            GgmlType::F64,
            GgmlType::I8,
            GgmlType::I16,
            GgmlType::I32,
            GgmlType::I64,
        ];
        for ggml_type in GgmlType::ALL {
            assert_eq!(ggml_type.is_quantized(), !dense.contains(&ggml_type), "{ggml_type}");
        }
    }

    #[test]
    fn tensor_bytes_of_real_tensors() {
        // A 4096 x 4096 projection: 16 blocks of 256 per row.
        assert_eq!(
            GgmlType::Q4_K.tensor_bytes(&[4096, 4096]).unwrap(),
            Bytes::new(16 * 144 * 4096)
        );
        // Llama-3-8B's ffn_down in Q6_K: ne = [14336, 4096].
        assert_eq!(
            GgmlType::Q6_K.tensor_bytes(&[14336, 4096]).unwrap(),
            Bytes::new(56 * 210 * 4096)
        );
        assert_eq!(GgmlType::Q8_0.row_bytes(4096).unwrap(), Bytes::new(128 * 34));
        assert_eq!(GgmlType::F32.tensor_bytes(&[4096]).unwrap(), Bytes::new(16_384));
        assert_eq!(GgmlType::F16.tensor_bytes(&[7, 3, 2, 1]).unwrap(), Bytes::new(84));
        assert_eq!(GgmlType::F32.tensor_bytes(&[]).unwrap(), Bytes::new(4));
        assert_eq!(GgmlType::Q4_0.tensor_bytes(&[0, 100]).unwrap(), Bytes::ZERO);
        assert_eq!(GgmlType::Q4_0.tensor_bytes(&[32, 0]).unwrap(), Bytes::ZERO);
    }

    #[test]
    fn partial_blocks_are_refused() {
        let err = GgmlType::Q4_K.tensor_bytes(&[100, 4]).unwrap_err();
        assert!(matches!(
            err,
            Error::PartialBlock {
                ggml_type: GgmlType::Q4_K,
                row_elements: 100
            }
        ));
        assert_eq!(
            err.to_string(),
            "a Q4_K row of 100 elements is not a whole number of 256-element blocks"
        );
        // The row is what counts: 16 x 64 = 1024 elements would be 32 whole Q4_0 blocks,
        // but a 16-element row cannot be quantized on its own.
        assert!(GgmlType::Q4_0.tensor_bytes(&[16, 64]).is_err());
        assert!(GgmlType::Q4_K.tensor_bytes(&[]).is_err());
        assert!(GgmlType::Q8_0.row_bytes(33).is_err());
    }

    #[test]
    fn tensor_bytes_refuses_overflow() {
        let ne = [1 << 40, 1 << 30];
        let err = GgmlType::F32.tensor_bytes(&ne).unwrap_err();
        assert!(matches!(&err, Error::TensorTooLarge { shape, .. } if shape == &ne));
        assert!(GgmlType::Q4_0.tensor_bytes(&[32, u64::MAX, 2]).is_err());
        assert_eq!(GgmlType::I8.tensor_bytes(&[u64::MAX]).unwrap(), Bytes::new(u64::MAX));
    }

    #[test]
    fn serde_uses_the_name() {
        assert_eq!(serde_json::to_string(&GgmlType::IQ4_XS).unwrap(), r#""IQ4_XS""#);
        let back: GgmlType = serde_json::from_str(r#""IQ4_XS""#).unwrap();
        assert_eq!(back, GgmlType::IQ4_XS);
        assert!(serde_json::from_str::<GgmlType>(r#""Q9_K""#).is_err());
    }

    fn any_ggml_type() -> impl Strategy<Value = GgmlType> {
        prop::sample::select(GgmlType::ALL.to_vec())
    }

    proptest! {
        #[test]
        fn bytes_are_blocks_times_block_size(
            ggml_type in any_ggml_type(),
            blocks in 0u64..10_000,
            rows in 0u64..10_000,
        ) {
            let ne = [blocks * ggml_type.elements_per_block(), rows];
            prop_assert_eq!(
                ggml_type.tensor_bytes(&ne).unwrap(),
                Bytes::new(blocks * ggml_type.bytes_per_block() * rows)
            );
        }

        #[test]
        fn rows_off_the_block_grid_are_refused(
            ggml_type in any_ggml_type(),
            row_elements in 0u64..1_000_000,
        ) {
            let result = ggml_type.row_bytes(row_elements);
            prop_assert_eq!(
                result.is_ok(),
                row_elements % ggml_type.elements_per_block() == 0
            );
        }
    }
}
