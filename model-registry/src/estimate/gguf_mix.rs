//! Which ggml type `llama-quantize` gives each tensor of a file type, so that a GGUF
//! variant can be sized before its header is read.
//!
//! A GGUF file type names a *mix*: `Q4_K_M` stores most matrices as `Q4_K`, but the
//! output projection as `Q6_K`, and `attn_v` and `ffn_down` of about half the layers as
//! `Q6_K`. This module follows `llama_tensor_get_type` in llama.cpp's
//! `src/llama-quant.cpp` for the k-quant, legacy and i-quant mixes, assuming no
//! importance matrix (which changes a few `IQ3_XXS`, `IQ4_*` and `Q4_0` choices).
//! A parsed header is always the authority; this model only serves a plan made before
//! the header is fetched.

use crate::config::Architecture;
use crate::quant::GgufFileType;
use crate::{Error, GgmlType};

/// The role of a matrix, as its GGUF name tells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    /// `token_embd`.
    TokenEmbd,
    /// `output` (or `token_embd` doubling as the output when tied).
    Output,
    /// `attn_q`.
    Q,
    /// `attn_k`.
    K,
    /// `attn_v`.
    V,
    /// `attn_qkv` (fused).
    Qkv,
    /// `attn_output`.
    AttnOutput,
    /// `ffn_gate` (or `ffn_gate_exps`).
    Gate,
    /// `ffn_up` (or `ffn_up_exps`).
    Up,
    /// `ffn_down` (or `ffn_down_exps`).
    Down,
}

/// What the mix rules look at besides the tensor's role.
#[derive(Debug, Clone, Copy)]
pub(crate) struct MixModel {
    /// llama.cpp special-cases Falcon.
    pub architecture: Architecture,
    /// Decoder layers.
    pub layers: u64,
    /// Experts per layer; 1 for dense models.
    pub experts: u64,
    /// Query heads per KV head (`n_gqa`).
    pub gqa: u64,
    /// Whether the model has a separate `output.weight`.
    pub has_output: bool,
}

impl MixModel {
    /// llama.cpp's `LLM_TYPE_70B`: a Llama with 80 layers and grouped KV heads.
    fn is_llama_70b(&self) -> bool {
        self.architecture == Architecture::Llama && self.layers == 80 && self.gqa > 1
    }
}

/// `use_more_bits` of llama-quant.cpp: the first and last eighth of the layers and every
/// third layer in between.
fn use_more_bits(layer: u64, layers: u64) -> bool {
    let eighth = layers / 8;
    let middle = layer >= eighth && layer < 7 * layers / 8;
    !middle || (layer - eighth) % 3 == 2
}

/// The ggml type of a `role` matrix in `layer` whose rows have `row` elements
/// (`ne[0]`, the input width), in a file of type `file_type`.
pub(crate) fn tensor_type(file_type: GgufFileType, role: Role, layer: u64, row: u64, model: &MixModel) -> GgmlType {
    let default = default_type(file_type);
    let chosen = if default.is_quantized() {
        mixed_type(file_type, default, role, layer, row, model)
    } else {
        default
    };
    fallback(chosen, row)
}

/// `default_type` of `llama_model_quantize_impl`.
fn default_type(file_type: GgufFileType) -> GgmlType {
    use GgufFileType as F;
    match file_type {
        F::IQ2_S => GgmlType::IQ2_XS,
        F::IQ2_M => GgmlType::IQ2_S,
        F::IQ3_XS | F::IQ3_M => GgmlType::IQ3_S,
        F::Q4_1_SOME_F16 => GgmlType::Q4_1,
        other => other.principal_type(),
    }
}

fn mixed_type(ft: GgufFileType, default: GgmlType, role: Role, layer: u64, row: u64, m: &MixModel) -> GgmlType {
    use GgmlType as T;
    use GgufFileType as F;
    let falcon = m.architecture == Architecture::Falcon;
    let eight_experts = m.experts == 8;
    let layers = m.layers;
    let iq_low = matches!(ft, F::IQ2_XXS | F::IQ2_XS | F::IQ1_S | F::IQ2_S | F::IQ2_M | F::IQ1_M);
    let is_output = role == Role::Output || (!m.has_output && role == Role::TokenEmbd);
    if is_output {
        return if ft == F::MXFP4_MOE || falcon || !row.is_multiple_of(default.elements_per_block()) {
            T::Q8_0
        } else if matches!(
            ft,
            F::IQ2_XXS | F::IQ2_XS | F::IQ3_XXS | F::IQ1_S | F::IQ2_S | F::IQ2_M | F::IQ1_M
        ) {
            T::Q5_K
        } else if default != T::Q8_0 {
            T::Q6_K
        } else {
            default
        };
    }
    if ft == F::MXFP4_MOE {
        return if m.experts > 1 && matches!(role, Role::Gate | Role::Up | Role::Down) {
            T::MXFP4
        } else {
            T::Q8_0
        };
    }
    if role == Role::TokenEmbd {
        return match ft {
            F::IQ2_XXS | F::IQ2_XS | F::IQ1_S | F::IQ1_M => T::Q2_K,
            F::IQ2_S | F::IQ2_M | F::IQ3_XXS => T::IQ3_S,
            F::TQ1_0 | F::TQ2_0 => T::Q4_K,
            _ => default,
        };
    }
    if iq_low {
        let iq3_or_q2 = if matches!(ft, F::IQ2_S | F::IQ2_M) {
            T::IQ3_S
        } else {
            T::Q2_K
        };
        return match role {
            Role::V if m.gqa >= 4 || m.experts >= 4 => T::Q4_K,
            Role::V => iq3_or_q2,
            Role::K if eight_experts => T::Q4_K,
            Role::Down if layer < layers / 8 => iq3_or_q2,
            Role::AttnOutput if eight_experts => T::Q5_K,
            Role::AttnOutput if matches!(ft, F::IQ1_S | F::IQ1_M) => T::IQ2_XXS,
            Role::AttnOutput if matches!(ft, F::IQ2_S | F::IQ2_M) => T::IQ3_S,
            _ => default,
        };
    }
    match role {
        Role::V => {
            let mut t = match ft {
                F::Q2_K if m.gqa >= 4 => T::Q4_K,
                F::Q2_K => T::Q3_K,
                F::Q2_K_S if m.gqa >= 4 => T::Q4_K,
                F::IQ3_XXS if m.gqa >= 4 => T::Q4_K,
                F::IQ3_XXS => T::IQ3_S,
                F::IQ3_XS | F::IQ3_S if m.gqa >= 4 => T::Q4_K,
                F::IQ3_M => T::Q4_K,
                F::Q3_K_M if layer < 2 => T::Q5_K,
                F::Q3_K_M => T::Q4_K,
                F::Q3_K_L => T::Q5_K,
                F::IQ4_NL | F::IQ4_XS if m.gqa >= 4 => T::Q5_K,
                F::Q4_K_M | F::Q5_K_M if use_more_bits(layer, layers) => T::Q6_K,
                F::Q4_K_S if layer < 4 => T::Q5_K,
                _ => default,
            };
            if m.is_llama_70b() && matches!(t, T::Q3_K | T::Q4_K) {
                t = T::Q5_K;
            }
            if eight_experts { T::Q8_0 } else { t }
        }
        Role::K if eight_experts => T::Q8_0,
        Role::K | Role::Q if ft == F::IQ3_XS => T::IQ3_XXS,
        Role::K | Role::Q if ft == F::IQ3_XXS => T::IQ2_S,
        Role::Down => down_type(ft, default, layer, m),
        Role::AttnOutput if !falcon && eight_experts => match ft {
            F::Q2_K
            | F::IQ3_XS
            | F::IQ3_XXS
            | F::Q3_K_S
            | F::Q3_K_M
            | F::IQ4_NL
            | F::Q4_K_S
            | F::Q4_K_M
            | F::IQ3_S
            | F::IQ3_M
            | F::IQ4_XS => T::Q5_K,
            _ => default,
        },
        Role::AttnOutput if !falcon => match ft {
            F::Q2_K => T::Q3_K,
            F::IQ3_XXS => T::IQ3_S,
            F::Q3_K_M | F::IQ3_M => T::Q4_K,
            F::Q3_K_L => T::Q5_K,
            _ => default,
        },
        Role::AttnOutput if ft == F::Q3_K_L => T::Q4_K,
        Role::Qkv => match ft {
            F::Q3_K_M | F::Q3_K_L | F::IQ3_M => T::Q4_K,
            F::Q4_K_M => T::Q5_K,
            F::Q5_K_M => T::Q6_K,
            _ => default,
        },
        Role::Gate | Role::Up if ft == F::IQ3_XS && layer >= layers / 8 && layer < 7 * layers / 8 => T::IQ3_XXS,
        _ => default,
    }
}

fn down_type(ft: GgufFileType, default: GgmlType, layer: u64, m: &MixModel) -> GgmlType {
    use GgmlType as T;
    use GgufFileType as F;
    let layers = m.layers;
    let falcon = m.architecture == Architecture::Falcon;
    let more = use_more_bits(layer, layers);
    match ft {
        F::Q2_K => T::Q3_K,
        F::Q2_K_S if layer < layers / 8 => T::Q4_K,
        F::IQ3_XXS if layer < layers / 8 => T::Q4_K,
        F::IQ3_XXS => T::Q3_K,
        F::Q3_K_M if layer < layers / 16 => T::Q5_K,
        F::Q3_K_M if !falcon || more => T::Q4_K,
        F::Q3_K_M => T::Q3_K,
        F::IQ3_M if layer < layers / 8 || (m.experts == 8 && more) => T::Q4_K,
        F::Q3_K_L if falcon => T::Q4_K,
        F::Q3_K_L => T::Q5_K,
        F::Q4_K_M if falcon && layer < layers / 16 => T::Q6_K,
        F::Q4_K_M if falcon && more => T::Q5_K,
        F::Q4_K_M if falcon => T::Q4_K,
        F::Q4_K_M if more => T::Q6_K,
        F::IQ4_NL | F::IQ4_XS if layer < layers / 8 => T::Q5_K,
        F::Q5_K_M if more => T::Q6_K,
        F::Q4_K_S if !falcon && layer < layers / 8 => T::Q5_K,
        _ => default,
    }
}

/// `convert_incompatible_tensor`: a row that is not whole blocks of the chosen type
/// takes a type with smaller blocks, or F16.
fn fallback(chosen: GgmlType, row: u64) -> GgmlType {
    use GgmlType as T;
    if row.is_multiple_of(chosen.elements_per_block()) {
        return chosen;
    }
    let smaller = match chosen {
        T::TQ1_0 | T::TQ2_0 => T::Q4_0,
        T::IQ2_XXS
        | T::IQ2_XS
        | T::IQ2_S
        | T::IQ3_XXS
        | T::IQ3_S
        | T::IQ1_S
        | T::IQ1_M
        | T::Q2_K
        | T::Q3_K
        | T::IQ4_XS => T::IQ4_NL,
        T::Q4_K => T::Q5_0,
        T::Q5_K => T::Q5_1,
        T::Q6_K => T::Q8_0,
        _ => T::F16,
    };
    if row.is_multiple_of(smaller.elements_per_block()) {
        smaller
    } else {
        T::F16
    }
}

/// Bytes of `rows` rows of `row` elements of `ggml_type`.
pub(crate) fn matrix_bytes(ggml_type: GgmlType, row: u64, rows: u64) -> Result<u64, Error> {
    let per_row = ggml_type.row_bytes(row)?.get();
    per_row
        .checked_mul(rows)
        .ok_or(Error::EstimateOverflow { what: "GGUF matrix" })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn llama(layers: u64) -> MixModel {
        MixModel {
            architecture: Architecture::Llama,
            layers,
            experts: 1,
            gqa: 4,
            has_output: true,
        }
    }

    #[test]
    fn more_bits_covers_ends_and_every_third_layer() {
        let chosen: Vec<u64> = (0..32).filter(|&l| use_more_bits(l, 32)).collect();
        assert_eq!(chosen, [0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31]);
    }

    #[test]
    fn q4_k_m_mix() {
        let m = llama(32);
        let ft = GgufFileType::Q4_K_M;
        assert_eq!(tensor_type(ft, Role::Output, 0, 4096, &m), GgmlType::Q6_K);
        assert_eq!(tensor_type(ft, Role::TokenEmbd, 0, 4096, &m), GgmlType::Q4_K);
        assert_eq!(tensor_type(ft, Role::V, 0, 4096, &m), GgmlType::Q6_K);
        assert_eq!(tensor_type(ft, Role::V, 4, 4096, &m), GgmlType::Q4_K);
        assert_eq!(tensor_type(ft, Role::Down, 6, 14336, &m), GgmlType::Q6_K);
        assert_eq!(tensor_type(ft, Role::Q, 6, 4096, &m), GgmlType::Q4_K);
        let mixtral = MixModel { experts: 8, ..m };
        assert_eq!(tensor_type(ft, Role::V, 4, 4096, &mixtral), GgmlType::Q8_0);
        assert_eq!(tensor_type(ft, Role::AttnOutput, 4, 4096, &mixtral), GgmlType::Q5_K);
    }

    #[test]
    fn rows_that_are_not_whole_blocks_fall_back() {
        // Falcon-7B's 4544-wide rows are not whole 256-element k-quant blocks.
        assert_eq!(fallback(GgmlType::Q4_K, 4544), GgmlType::Q5_0);
        assert_eq!(fallback(GgmlType::Q6_K, 4544), GgmlType::Q8_0);
        assert_eq!(fallback(GgmlType::Q4_0, 4544), GgmlType::Q4_0);
        assert_eq!(fallback(GgmlType::Q4_0, 4545), GgmlType::F16);
        let m = MixModel {
            architecture: Architecture::Falcon,
            ..llama(32)
        };
        assert_eq!(
            tensor_type(GgufFileType::Q4_K_M, Role::Output, 0, 4544, &m),
            GgmlType::Q8_0
        );
    }

    #[test]
    fn unquantized_file_types_have_no_mix() {
        let m = llama(32);
        assert_eq!(tensor_type(GgufFileType::F16, Role::Output, 0, 4096, &m), GgmlType::F16);
        assert_eq!(tensor_type(GgufFileType::BF16, Role::V, 0, 4096, &m), GgmlType::BF16);
    }
}
