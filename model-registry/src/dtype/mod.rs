//! Storage element types of the two weight formats Skein reads, and the exact byte size
//! of a tensor of each.
//!
//! - [`SafetensorsDtype`]: the `dtype` strings of a safetensors header. Elements are
//!   stored densely, `bits()` wide each.
//! - [`GgmlType`]: the tensor type ids of a GGUF file. Quantized types store elements in
//!   fixed blocks (for example 256 elements in 144 bytes for `Q4_K`), so size is counted
//!   in blocks, not bits.
//! - [`TensorDtype`]: either of the two, for code that handles tensors from both formats.

mod ggml;
mod safetensors;

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::{Bytes, Error};

pub use ggml::GgmlType;
pub use safetensors::SafetensorsDtype;

/// The storage type of one tensor, from either weight format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "format", content = "dtype", rename_all = "snake_case")]
pub enum TensorDtype {
    /// A tensor from a safetensors file.
    Safetensors(SafetensorsDtype),
    /// A tensor from a GGUF file.
    Ggml(GgmlType),
}

impl TensorDtype {
    /// Exact size in bytes of a tensor of this type and shape. See
    /// [`SafetensorsDtype::tensor_bytes`] and [`GgmlType::tensor_bytes`] for the shape
    /// conventions of each format.
    pub fn tensor_bytes(self, shape: &[u64]) -> Result<Bytes, Error> {
        match self {
            TensorDtype::Safetensors(dtype) => dtype.tensor_bytes(shape),
            TensorDtype::Ggml(ggml_type) => ggml_type.tensor_bytes(shape),
        }
    }
}

impl From<SafetensorsDtype> for TensorDtype {
    fn from(dtype: SafetensorsDtype) -> Self {
        TensorDtype::Safetensors(dtype)
    }
}

impl From<GgmlType> for TensorDtype {
    fn from(ggml_type: GgmlType) -> Self {
        TensorDtype::Ggml(ggml_type)
    }
}

impl fmt::Display for TensorDtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TensorDtype::Safetensors(dtype) => write!(f, "safetensors {dtype}"),
            TensorDtype::Ggml(ggml_type) => write!(f, "GGML {ggml_type}"),
        }
    }
}

/// Number of elements of a tensor, or `None` if it does not fit in a `u64`. An empty
/// shape is a scalar: one element.
fn element_count(shape: &[u64]) -> Option<u64> {
    shape.iter().try_fold(1u64, |count, &dim| count.checked_mul(dim))
}

fn too_large(dtype: impl Into<TensorDtype>, shape: &[u64]) -> Error {
    Error::TensorTooLarge {
        dtype: dtype.into(),
        shape: shape.to_vec(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tensor_dtype_dispatches_to_its_format() {
        let st = TensorDtype::from(SafetensorsDtype::BF16);
        assert_eq!(st.tensor_bytes(&[4096, 4096]).unwrap(), Bytes::new(32 * 1024 * 1024));
        let gg = TensorDtype::from(GgmlType::Q4_K);
        assert_eq!(gg.tensor_bytes(&[4096, 4096]).unwrap(), Bytes::new(9_437_184));
    }

    #[test]
    fn tensor_dtype_display_and_serde_name_the_format() {
        assert_eq!(TensorDtype::from(SafetensorsDtype::F16).to_string(), "safetensors F16");
        assert_eq!(TensorDtype::from(GgmlType::F16).to_string(), "GGML F16");
        let json = serde_json::to_string(&TensorDtype::from(GgmlType::Q6_K)).unwrap();
        assert_eq!(json, r#"{"format":"ggml","dtype":"Q6_K"}"#);
        let back: TensorDtype = serde_json::from_str(&json).unwrap();
        assert_eq!(back, TensorDtype::Ggml(GgmlType::Q6_K));
    }

    #[test]
    fn element_count_treats_empty_shape_as_scalar_and_refuses_overflow() {
        assert_eq!(element_count(&[]), Some(1));
        assert_eq!(element_count(&[0, 7]), Some(0));
        assert_eq!(element_count(&[1 << 32, 1 << 32]), None);
    }
}
