//! [`GgufFileType`]: llama.cpp's model file types (`general.file_type`), with their
//! names and aliases, the ggml type most of a file's tensors have, and their nominal
//! precision.

use std::fmt;
use std::str::FromStr;

use serde::{Serialize, Serializer};

use super::{NominalPrecision, NumberKind};
use crate::{Error, GgmlType};

/// A llama.cpp model file type: `general.file_type` in a GGUF header (`enum
/// llama_ftype` in `llama.h`), which names the quantization mix (`Q4_K_M`).
///
/// Ids 5, 6 and 33 to 35 belonged to types that ggml removed and are not listed. Id 4
/// (`Q4_1_SOME_F16`) is commented out in `llama.h` but its files still load.
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[repr(u32)]
pub enum GgufFileType {
    /// All tensors F32.
    F32 = 0,
    /// Mostly F16.
    F16 = 1,
    /// Mostly Q4_0.
    Q4_0 = 2,
    /// Mostly Q4_1.
    Q4_1 = 3,
    /// Q4_1 with F16 embeddings and output.
    Q4_1_SOME_F16 = 4,
    /// Mostly Q8_0.
    Q8_0 = 7,
    /// Mostly Q5_0.
    Q5_0 = 8,
    /// Mostly Q5_1.
    Q5_1 = 9,
    /// Mostly Q2_K.
    Q2_K = 10,
    /// Q3_K, small mix.
    Q3_K_S = 11,
    /// Q3_K, medium mix.
    Q3_K_M = 12,
    /// Q3_K, large mix.
    Q3_K_L = 13,
    /// Q4_K, small mix.
    Q4_K_S = 14,
    /// Q4_K, medium mix.
    Q4_K_M = 15,
    /// Q5_K, small mix.
    Q5_K_S = 16,
    /// Q5_K, medium mix.
    Q5_K_M = 17,
    /// Mostly Q6_K.
    Q6_K = 18,
    /// Mostly IQ2_XXS.
    IQ2_XXS = 19,
    /// Mostly IQ2_XS.
    IQ2_XS = 20,
    /// Q2_K, small mix.
    Q2_K_S = 21,
    /// IQ3 at 3.3 bits per weight (IQ3_S tensors).
    IQ3_XS = 22,
    /// Mostly IQ3_XXS.
    IQ3_XXS = 23,
    /// Mostly IQ1_S.
    IQ1_S = 24,
    /// Mostly IQ4_NL.
    IQ4_NL = 25,
    /// Mostly IQ3_S.
    IQ3_S = 26,
    /// IQ3_S, medium mix.
    IQ3_M = 27,
    /// IQ2 at 2.5 bits per weight.
    IQ2_S = 28,
    /// IQ2 at 2.7 bits per weight.
    IQ2_M = 29,
    /// Mostly IQ4_XS.
    IQ4_XS = 30,
    /// Mostly IQ1_M.
    IQ1_M = 31,
    /// Mostly BF16.
    BF16 = 32,
    /// Mostly TQ1_0 (ternary).
    TQ1_0 = 36,
    /// Mostly TQ2_0 (ternary).
    TQ2_0 = 37,
    /// MXFP4 experts, the rest Q8_0 or higher.
    MXFP4_MOE = 38,
    /// Mostly NVFP4.
    NVFP4 = 39,
    /// Mostly Q1_0.
    Q1_0 = 40,
    /// Mostly Q2_0.
    Q2_0 = 41,
}

impl GgufFileType {
    /// Every file type, in id order.
    pub const ALL: [GgufFileType; 37] = [
        Self::F32,
        Self::F16,
        Self::Q4_0,
        Self::Q4_1,
        Self::Q4_1_SOME_F16,
        Self::Q8_0,
        Self::Q5_0,
        Self::Q5_1,
        Self::Q2_K,
        Self::Q3_K_S,
        Self::Q3_K_M,
        Self::Q3_K_L,
        Self::Q4_K_S,
        Self::Q4_K_M,
        Self::Q5_K_S,
        Self::Q5_K_M,
        Self::Q6_K,
        Self::IQ2_XXS,
        Self::IQ2_XS,
        Self::Q2_K_S,
        Self::IQ3_XS,
        Self::IQ3_XXS,
        Self::IQ1_S,
        Self::IQ4_NL,
        Self::IQ3_S,
        Self::IQ3_M,
        Self::IQ2_S,
        Self::IQ2_M,
        Self::IQ4_XS,
        Self::IQ1_M,
        Self::BF16,
        Self::TQ1_0,
        Self::TQ2_0,
        Self::MXFP4_MOE,
        Self::NVFP4,
        Self::Q1_0,
        Self::Q2_0,
    ];

    /// Aliases that `llama-quantize` and file names use besides the canonical names.
    const ALIASES: [(&'static str, GgufFileType); 7] = [
        ("Q4_K", Self::Q4_K_M),
        ("Q3_K", Self::Q3_K_M),
        ("Q5_K", Self::Q5_K_M),
        ("FP16", Self::F16),
        ("FP32", Self::F32),
        ("MXFP4", Self::MXFP4_MOE),
        ("Q4_1_F16", Self::Q4_1_SOME_F16),
    ];

    /// The file type with this `general.file_type` id, if known.
    pub fn from_id(id: u32) -> Option<Self> {
        Self::ALL.iter().copied().find(|t| t.id() == id)
    }

    /// The `general.file_type` id.
    pub const fn id(self) -> u32 {
        self as u32
    }

    /// The name `llama-quantize` uses (`Q4_K_M`).
    pub const fn name(self) -> &'static str {
        match self {
            Self::F32 => "F32",
            Self::F16 => "F16",
            Self::Q4_0 => "Q4_0",
            Self::Q4_1 => "Q4_1",
            Self::Q4_1_SOME_F16 => "Q4_1_SOME_F16",
            Self::Q8_0 => "Q8_0",
            Self::Q5_0 => "Q5_0",
            Self::Q5_1 => "Q5_1",
            Self::Q2_K => "Q2_K",
            Self::Q3_K_S => "Q3_K_S",
            Self::Q3_K_M => "Q3_K_M",
            Self::Q3_K_L => "Q3_K_L",
            Self::Q4_K_S => "Q4_K_S",
            Self::Q4_K_M => "Q4_K_M",
            Self::Q5_K_S => "Q5_K_S",
            Self::Q5_K_M => "Q5_K_M",
            Self::Q6_K => "Q6_K",
            Self::IQ2_XXS => "IQ2_XXS",
            Self::IQ2_XS => "IQ2_XS",
            Self::Q2_K_S => "Q2_K_S",
            Self::IQ3_XS => "IQ3_XS",
            Self::IQ3_XXS => "IQ3_XXS",
            Self::IQ1_S => "IQ1_S",
            Self::IQ4_NL => "IQ4_NL",
            Self::IQ3_S => "IQ3_S",
            Self::IQ3_M => "IQ3_M",
            Self::IQ2_S => "IQ2_S",
            Self::IQ2_M => "IQ2_M",
            Self::IQ4_XS => "IQ4_XS",
            Self::IQ1_M => "IQ1_M",
            Self::BF16 => "BF16",
            Self::TQ1_0 => "TQ1_0",
            Self::TQ2_0 => "TQ2_0",
            Self::MXFP4_MOE => "MXFP4_MOE",
            Self::NVFP4 => "NVFP4",
            Self::Q1_0 => "Q1_0",
            Self::Q2_0 => "Q2_0",
        }
    }

    /// The ggml type most tensors of the file have: llama.cpp's
    /// `llama_ftype_get_default_type` (`Q4_K` for `Q4_K_M`, `IQ2_XS` for `IQ2_S`).
    pub const fn principal_type(self) -> GgmlType {
        match self {
            Self::F32 => GgmlType::F32,
            Self::F16 => GgmlType::F16,
            Self::BF16 => GgmlType::BF16,
            Self::Q4_0 => GgmlType::Q4_0,
            Self::Q4_1 | Self::Q4_1_SOME_F16 => GgmlType::Q4_1,
            Self::Q8_0 => GgmlType::Q8_0,
            Self::Q5_0 => GgmlType::Q5_0,
            Self::Q5_1 => GgmlType::Q5_1,
            Self::Q2_K | Self::Q2_K_S => GgmlType::Q2_K,
            Self::Q3_K_S | Self::Q3_K_M | Self::Q3_K_L => GgmlType::Q3_K,
            Self::Q4_K_S | Self::Q4_K_M => GgmlType::Q4_K,
            Self::Q5_K_S | Self::Q5_K_M => GgmlType::Q5_K,
            Self::Q6_K => GgmlType::Q6_K,
            Self::IQ2_XXS => GgmlType::IQ2_XXS,
            Self::IQ2_XS | Self::IQ2_S => GgmlType::IQ2_XS,
            Self::IQ2_M => GgmlType::IQ2_S,
            Self::IQ3_XS | Self::IQ3_S | Self::IQ3_M => GgmlType::IQ3_S,
            Self::IQ3_XXS => GgmlType::IQ3_XXS,
            Self::IQ1_S => GgmlType::IQ1_S,
            Self::IQ1_M => GgmlType::IQ1_M,
            Self::IQ4_NL => GgmlType::IQ4_NL,
            Self::IQ4_XS => GgmlType::IQ4_XS,
            Self::TQ1_0 => GgmlType::TQ1_0,
            Self::TQ2_0 => GgmlType::TQ2_0,
            Self::MXFP4_MOE => GgmlType::MXFP4,
            Self::NVFP4 => GgmlType::NVFP4,
            Self::Q1_0 => GgmlType::Q1_0,
            Self::Q2_0 => GgmlType::Q2_0,
        }
    }

    /// The nominal precision: the bits in the name (`Q5_K_M` is 5, `IQ3_XXS` 3, the
    /// ternary `TQ*` and 1-bit types 1 or 2), integer except for the float types.
    pub const fn nominal(self) -> NominalPrecision {
        let (bits, kind) = match self {
            Self::F32 => (32, NumberKind::Float),
            Self::F16 | Self::BF16 => (16, NumberKind::Float),
            Self::MXFP4_MOE | Self::NVFP4 => (4, NumberKind::Float),
            Self::Q8_0 => (8, NumberKind::Int),
            Self::Q6_K => (6, NumberKind::Int),
            Self::Q5_0 | Self::Q5_1 | Self::Q5_K_S | Self::Q5_K_M => (5, NumberKind::Int),
            Self::Q4_0
            | Self::Q4_1
            | Self::Q4_1_SOME_F16
            | Self::Q4_K_S
            | Self::Q4_K_M
            | Self::IQ4_NL
            | Self::IQ4_XS => (4, NumberKind::Int),
            Self::Q3_K_S | Self::Q3_K_M | Self::Q3_K_L | Self::IQ3_XS | Self::IQ3_XXS | Self::IQ3_S | Self::IQ3_M => {
                (3, NumberKind::Int)
            }
            Self::Q2_K
            | Self::Q2_K_S
            | Self::IQ2_XXS
            | Self::IQ2_XS
            | Self::IQ2_S
            | Self::IQ2_M
            | Self::TQ2_0
            | Self::Q2_0 => (2, NumberKind::Int),
            Self::IQ1_S | Self::IQ1_M | Self::TQ1_0 | Self::Q1_0 => (1, NumberKind::Int),
        };
        NominalPrecision { bits, kind }
    }

    /// Finds the file type in a GGUF file name: the last `-` or `.` separated part of
    /// the name that is a file type (ignoring case), or ends in `_` and one
    /// (`model_q4_k_m.gguf`). A directory prefix is ignored. `None` when no part is a
    /// known type, as with dynamic mixes such as `UD-Q4_K_XL`: read the header then.
    pub fn from_file_name(file_name: &str) -> Option<Self> {
        let base = file_name.rsplit('/').next().unwrap_or(file_name);
        base.split(['-', '.']).rev().find_map(|part| {
            part.parse::<Self>().ok().or_else(|| {
                let (_, suffix) = part.split_once('_')?;
                // Try every `_` boundary: `model_q4_k_m` → `q4_k_m`, `k_m`, `m`.
                std::iter::successors(Some(suffix), |rest| rest.split_once('_').map(|(_, r)| r))
                    .find_map(|candidate| candidate.parse::<Self>().ok())
            })
        })
    }
}

impl fmt::Display for GgufFileType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.name())
    }
}

impl FromStr for GgufFileType {
    type Err = Error;

    /// Parses a name or alias, ignoring case (`q4_k_m`, `Q4_K`, `fp16`).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .iter()
            .map(|&t| (t.name(), t))
            .chain(Self::ALIASES)
            .find(|(name, _)| name.eq_ignore_ascii_case(s))
            .map(|(_, t)| t)
            .ok_or_else(|| Error::UnsupportedQuantization {
                found: format!("GGUF file type {s}"),
            })
    }
}

impl Serialize for GgufFileType {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::Quantization;

    #[test]
    fn file_type_ids_match_llama_h() {
        let expected = [
            (0, "F32"),
            (1, "F16"),
            (2, "Q4_0"),
            (3, "Q4_1"),
            (4, "Q4_1_SOME_F16"),
            (7, "Q8_0"),
            (8, "Q5_0"),
            (9, "Q5_1"),
            (10, "Q2_K"),
            (11, "Q3_K_S"),
            (12, "Q3_K_M"),
            (13, "Q3_K_L"),
            (14, "Q4_K_S"),
            (15, "Q4_K_M"),
            (16, "Q5_K_S"),
            (17, "Q5_K_M"),
            (18, "Q6_K"),
            (19, "IQ2_XXS"),
            (20, "IQ2_XS"),
            (21, "Q2_K_S"),
            (22, "IQ3_XS"),
            (23, "IQ3_XXS"),
            (24, "IQ1_S"),
            (25, "IQ4_NL"),
            (26, "IQ3_S"),
            (27, "IQ3_M"),
            (28, "IQ2_S"),
            (29, "IQ2_M"),
            (30, "IQ4_XS"),
            (31, "IQ1_M"),
            (32, "BF16"),
            (36, "TQ1_0"),
            (37, "TQ2_0"),
            (38, "MXFP4_MOE"),
            (39, "NVFP4"),
            (40, "Q1_0"),
            (41, "Q2_0"),
        ];
        assert_eq!(expected.len(), GgufFileType::ALL.len());
        for (id, name) in expected {
            let file_type = GgufFileType::from_id(id).unwrap();
            assert_eq!(file_type.name(), name, "id {id}");
            assert_eq!(file_type.id(), id);
            assert_eq!(name.parse::<GgufFileType>().unwrap(), file_type);
        }
        for removed in [5, 6, 33, 34, 35, 42, 1024] {
            assert_eq!(GgufFileType::from_id(removed), None, "id {removed}");
        }
    }

    #[test]
    fn file_names_name_their_type() {
        let cases = [
            ("Meta-Llama-3-8B-Instruct.Q4_K_M.gguf", Some(GgufFileType::Q4_K_M)),
            ("llama-2-7b.Q5_K_S.gguf", Some(GgufFileType::Q5_K_S)),
            (
                "qwen2.5-7b-instruct-q4_k_m-00001-of-00002.gguf",
                Some(GgufFileType::Q4_K_M),
            ),
            ("org/repo/Llama-3.2-1B-Instruct-f16.gguf", Some(GgufFileType::F16)),
            ("gemma-2-9b-it-BF16.gguf", Some(GgufFileType::BF16)),
            ("Mistral-7B-Instruct-v0.3.IQ3_XXS.gguf", Some(GgufFileType::IQ3_XXS)),
            ("phi-3-mini-4k-instruct-fp16.gguf", Some(GgufFileType::F16)),
            ("model_q8_0.gguf", Some(GgufFileType::Q8_0)),
            ("gpt-oss-20b-MXFP4.gguf", Some(GgufFileType::MXFP4_MOE)),
            ("tinyllama-1.1b-chat-v1.0.Q4_K.gguf", Some(GgufFileType::Q4_K_M)),
            ("Qwen3-8B-UD-Q4_K_XL.gguf", None),
            ("mmproj-model.gguf", None),
        ];
        for (name, expected) in cases {
            assert_eq!(GgufFileType::from_file_name(name), expected, "{name}");
        }
        let q = Quantization::from_gguf_file_name("x.Q4_K_M.gguf").unwrap();
        assert_eq!(q.bits, 4.5);
        assert_eq!(q.weight_bits, 4);
        assert_eq!(q.group_size, Some(256));
        assert_eq!(q.to_string(), "gguf Q4_K_M 4-bit, group 256, 4.50 bits/weight");
    }

    #[test]
    fn principal_types_follow_llama_quant() {
        assert_eq!(GgufFileType::IQ2_S.principal_type(), GgmlType::IQ2_XS);
        assert_eq!(GgufFileType::IQ2_M.principal_type(), GgmlType::IQ2_S);
        assert_eq!(GgufFileType::IQ3_XS.principal_type(), GgmlType::IQ3_S);
        assert_eq!(GgufFileType::Q3_K_L.principal_type(), GgmlType::Q3_K);
        assert_eq!(GgufFileType::MXFP4_MOE.principal_type(), GgmlType::MXFP4);
        let f16 = Quantization::from_gguf_file_type(GgufFileType::F16);
        assert_eq!((f16.bits, f16.group_size), (16.0, None));
    }
}
