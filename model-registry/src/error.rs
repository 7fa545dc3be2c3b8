//! The crate's error type.

use crate::dtype::{GgmlType, SafetensorsDtype, TensorDtype};

/// Everything that can go wrong in this crate.
///
/// Each variant names the input that was refused, so a caller can report it without
/// extra context. The enum is `#[non_exhaustive]` because the hub and estimator layers
/// will add their own variants.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A safetensors header names a dtype that the format does not define.
    #[error("unknown safetensors dtype `{found}`{}", did_you_mean(*.suggestion))]
    UnknownSafetensorsDtype {
        /// The string found in the header.
        found: String,
        /// A known dtype that differs from `found` only in letter case.
        suggestion: Option<SafetensorsDtype>,
    },

    /// A GGUF tensor info carries a type id that ggml never defined (or that this
    /// crate does not know yet).
    #[error("unknown GGML tensor type id {id}; help: the file may need a newer Skein")]
    UnknownGgmlType {
        /// The numeric type id from the GGUF tensor info.
        id: u32,
    },

    /// A GGUF tensor info carries the id of a type that ggml once defined and has since
    /// removed; current loaders refuse such files.
    #[error(
        "GGML tensor type id {id} ({name}) was removed from ggml and is no longer loadable; \
         help: re-convert the model with a current llama.cpp"
    )]
    RemovedGgmlType {
        /// The numeric type id from the GGUF tensor info.
        id: u32,
        /// The name the type had in ggml before its removal.
        name: &'static str,
    },

    /// A GGML type name (such as `Q4_K`) that this crate does not know.
    #[error("unknown GGML tensor type name `{found}`")]
    UnknownGgmlTypeName {
        /// The name that was given.
        found: String,
    },

    /// A row of a block-quantized GGML tensor is not a whole number of blocks. ggml
    /// quantizes each row on its own, so the first (contiguous) dimension must be a
    /// multiple of the block size.
    #[error(
        "a {ggml_type} row of {row_elements} elements is not a whole number of \
         {}-element blocks",
        .ggml_type.elements_per_block()
    )]
    PartialBlock {
        /// The block-quantized type.
        ggml_type: GgmlType,
        /// The number of elements in one row (GGUF `ne[0]`).
        row_elements: u64,
    },

    /// A sub-byte safetensors tensor whose element count does not fill whole bytes.
    #[error(
        "{n_elements} elements of {dtype} take {} bits, which is not a whole number of bytes",
        u128::from(*.n_elements) * u128::from(.dtype.bits())
    )]
    MisalignedSubByte {
        /// The sub-byte dtype.
        dtype: SafetensorsDtype,
        /// The number of elements in the tensor.
        n_elements: u64,
    },

    /// A tensor's size in bytes (or elements) does not fit in a `u64`. No real file can
    /// hold such a tensor, so its header is corrupt.
    #[error("a {dtype} tensor of shape {shape:?} is larger than 2^64 bytes; the header is corrupt")]
    TensorTooLarge {
        /// The tensor's storage type.
        dtype: TensorDtype,
        /// The shape as given.
        shape: Vec<u64>,
    },
}

fn did_you_mean(suggestion: Option<SafetensorsDtype>) -> String {
    match suggestion {
        Some(dtype) => format!("; help: dtype names are case-sensitive, did you mean `{dtype}`?"),
        None => String::new(),
    }
}
