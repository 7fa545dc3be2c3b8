//! Classification from safetensors tensors: packed GPTQ/AWQ layouts, bitsandbytes and
//! gpt-oss MXFP4 companion tensors, and otherwise the dominant dtype of the matrices.

use std::collections::BTreeMap;

use super::{QuantMethod, Quantization};
use crate::SafetensorsDtype;
use crate::safetensors::SafetensorsTensor;

type TensorsByName<'a> = BTreeMap<&'a str, &'a SafetensorsTensor>;

/// GPTQ or AWQ, if the checkpoint has packed `qweight` tensors that all agree.
pub(super) fn packed_from_tensors(by_name: &TensorsByName<'_>) -> Option<Quantization> {
    let mut layouts = by_name
        .values()
        .filter(|t| t.dtype == SafetensorsDtype::I32)
        .filter_map(|t| Some((t, t.name.strip_suffix(".qweight")?)))
        .map(|(qweight, layer)| packed_layout(qweight, layer, by_name));
    let first = layouts.next()?;
    let (method, bits, group) = first?;
    if layouts.any(|layout| layout != first) {
        return None;
    }
    Some(Quantization::grouped_int(method, bits, group))
}

/// `(method, bits, group size)` of one packed layer, from the shapes of its tensors.
fn packed_layout(
    qweight: &SafetensorsTensor,
    layer: &str,
    by_name: &TensorsByName<'_>,
) -> Option<(QuantMethod, u8, Option<u32>)> {
    let scales = by_name.get(format!("{layer}.scales").as_str())?;
    let &[groups, scale_cols] = scales.shape.as_slice() else {
        return None;
    };
    let &[rows, cols] = qweight.shape.as_slice() else {
        return None;
    };
    let (method, in_features, packed, unpacked) = match by_name.get(format!("{layer}.g_idx").as_str()) {
        // GPTQ packs along the input dimension: rows = in × bits / 32.
        Some(g_idx) => (QuantMethod::Gptq, g_idx.elements, rows, g_idx.elements),
        // AWQ packs along the output dimension: cols = out × bits / 32.
        None => (QuantMethod::Awq, rows, cols, scale_cols),
    };
    let bits = exact_div(packed.checked_mul(32)?, unpacked)?;
    let bits = u8::try_from(bits).ok().filter(|b| (1..=8).contains(b))?;
    let group = exact_div(in_features, groups)?;
    let group = if groups == 1 {
        None
    } else {
        Some(u32::try_from(group).ok()?)
    };
    Some((method, bits, group))
}

/// bitsandbytes 4-bit stores each weight as U8 with `<weight>.absmax` and a
/// `<weight>.quant_state.bitsandbytes__nf4` (or `__fp4`) tensor; 8-bit as I8 with
/// `<weight>.SCB`. Bits are counted from the first layer's tensors.
pub(super) fn bitsandbytes_from_tensors(by_name: &TensorsByName<'_>) -> Option<Quantization> {
    let (&state_name, _) = by_name
        .iter()
        .find(|(name, _)| name.contains(".quant_state.bitsandbytes__"))?;
    let (weight_name, _) = state_name.split_once(".quant_state.")?;
    let weight = by_name.get(weight_name)?;
    let absmax = by_name.get(format!("{weight_name}.absmax").as_str())?;
    // Two 4-bit weights per byte.
    let n_weights = weight.elements.checked_mul(2)?;
    let block = u32::try_from(exact_div(n_weights, absmax.elements)?).ok()?;
    let prefix = format!("{weight_name}.");
    let stored = by_name
        .iter()
        .filter(|(name, _)| **name == weight_name || name.starts_with(&prefix))
        .try_fold(0u64, |sum, (_, t)| sum.checked_add(t.bytes().get()))?;
    let bits = (stored as f64 * 8.0 / n_weights as f64) as f32;
    Some(Quantization::safetensors(
        QuantMethod::BitsAndBytes4,
        bits,
        4,
        Some(block),
    ))
}

/// gpt-oss stores MXFP4 experts as `*_blocks` (U8, 16 bytes for 32 values) with
/// `*_scales` (U8, one exponent per block).
pub(super) fn mxfp4_from_tensors(by_name: &TensorsByName<'_>) -> Option<Quantization> {
    let (blocks, scales) = by_name.iter().find_map(|(name, t)| {
        let stem = name.strip_suffix("_blocks")?;
        let scales = by_name.get(format!("{stem}_scales").as_str())?;
        (t.dtype == SafetensorsDtype::U8 && scales.dtype == SafetensorsDtype::U8).then_some((t, scales))
    })?;
    let bytes_per_block = *blocks.shape.last()?;
    let group = u32::try_from(bytes_per_block.checked_mul(2)?).ok()?;
    let n_weights = blocks.elements.checked_mul(2)?;
    let stored = blocks.bytes().get().checked_add(scales.bytes().get())?;
    let bits = (stored as f64 * 8.0 / n_weights.max(1) as f64) as f32;
    Some(Quantization::safetensors(QuantMethod::Fp4, bits, 4, Some(group)))
}

/// The dtype with the most bytes among matrices (norms and biases stay in high
/// precision in every scheme) decides; ties go to the wider dtype.
pub(super) fn dense_from_tensors(by_name: &TensorsByName<'_>) -> Option<Quantization> {
    use SafetensorsDtype as D;
    let mut bytes_by_dtype: BTreeMap<SafetensorsDtype, u64> = BTreeMap::new();
    let has_scb = by_name.keys().any(|name| name.ends_with(".SCB"));
    for tensor in by_name.values().filter(|t| t.shape.len() >= 2) {
        let entry = bytes_by_dtype.entry(tensor.dtype).or_default();
        *entry = entry.saturating_add(tensor.bytes().get());
    }
    let (&dtype, _) = bytes_by_dtype.iter().max_by_key(|&(&dtype, &bytes)| (bytes, dtype))?;
    Some(match dtype {
        D::F32 => Quantization::dense(QuantMethod::Fp32, 32),
        D::BF16 => Quantization::dense(QuantMethod::Bf16, 16),
        D::F16 => Quantization::dense(QuantMethod::Fp16, 16),
        D::F8_E4M3 | D::F8_E5M2 | D::F8_E4M3FNUZ | D::F8_E5M2FNUZ => Quantization::dense(QuantMethod::Fp8, 8),
        D::I8 if has_scb => Quantization::dense(QuantMethod::BitsAndBytes8, 8),
        D::I8 => Quantization::dense(QuantMethod::Int8, 8),
        _ => return None,
    })
}

fn exact_div(numerator: u64, denominator: u64) -> Option<u64> {
    (denominator != 0 && numerator.is_multiple_of(denominator)).then(|| numerator / denominator)
}
