//! Safetensors headers and sharded-checkpoint indexes, parsed from bytes.
//!
//! A safetensors file is an 8-byte little-endian header length `N`, then `N` bytes of
//! JSON naming every tensor (`dtype`, `shape`, `data_offsets` into the data section),
//! then the data. The API follows the order in which the hub edge reads a file with
//! HTTP Range requests: [`header_len`] on the first 8 bytes (or any longer prefix), then
//! [`parse_header`] on bytes `8..8 + N`. Nothing here reads tensor data.
//!
//! Validation mirrors the reference implementation (`huggingface/safetensors`,
//! `Metadata::validate`) so that a header accepted here is one that loaders accept: each
//! tensor's byte range has exactly the size its dtype and shape need, and the ranges tile
//! the data section from byte 0 without gaps or overlaps. [`SafetensorsHeader::check_file_len`]
//! then checks the data section against the file size the hub reports.
//!
//! [`ShardIndex`] reads `model.safetensors.index.json`, which maps each tensor of a
//! sharded checkpoint to its shard file.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::ops::Range;

use serde::de::{self, MapAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize};

use crate::{Bytes, Error, SafetensorsDtype};

/// Bytes of the little-endian header length that starts every safetensors file.
pub const LEN_PREFIX_BYTES: usize = 8;

/// The largest header accepted, in bytes: the reference implementation's
/// `MAX_HEADER_SIZE`. A longer header is refused before anything is read, as loaders
/// refuse it; real headers are a few hundred KiB at most.
pub const MAX_HEADER_LEN: u64 = 100_000_000;

/// Reads the header length `N` from the first [`LEN_PREFIX_BYTES`] bytes of a file.
/// Longer prefixes are fine; only the first 8 bytes are looked at.
///
/// Errors: [`Error::SafetensorsPrefixTooShort`] for fewer than 8 bytes,
/// [`Error::SafetensorsHeaderTooLarge`] if `N` exceeds [`MAX_HEADER_LEN`].
pub fn header_len(prefix: &[u8]) -> Result<u64, Error> {
    let Some(len_bytes) = prefix.first_chunk::<LEN_PREFIX_BYTES>() else {
        return Err(Error::SafetensorsPrefixTooShort { len: prefix.len() });
    };
    let len = u64::from_le_bytes(*len_bytes);
    if len > MAX_HEADER_LEN {
        return Err(Error::SafetensorsHeaderTooLarge {
            len,
            limit: MAX_HEADER_LEN,
        });
    }
    Ok(len)
}

/// Parses the `N` header bytes that follow the length prefix (file bytes `8..8 + N`).
/// Trailing spaces, which writers add to align the data section, are allowed.
///
/// Errors: [`Error::SafetensorsHeaderJson`] for malformed JSON, a field of the wrong
/// type, non-string metadata or a tensor named twice; [`Error::SafetensorsTensor`] for a
/// tensor whose dtype or shape is invalid; [`Error::SafetensorsSizeMismatch`] and
/// [`Error::SafetensorsOffsets`] for byte ranges that disagree with the shapes or do not
/// tile the data section.
pub fn parse_header(header: &[u8]) -> Result<SafetensorsHeader, Error> {
    let raw: RawHeader = serde_json::from_slice(header).map_err(|source| Error::SafetensorsHeaderJson { source })?;
    SafetensorsHeader::from_raw(raw)
}

/// Count and size of a group of tensors (all of one dtype, or all of a file).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct TensorTotals {
    /// Number of tensors.
    pub tensors: u64,
    /// Number of stored elements. Packed tensors count as stored: a GPTQ `qweight` of
    /// I32 counts one per 32-bit word.
    pub params: u64,
    /// Bytes taken in the file, exactly.
    pub bytes: Bytes,
}

impl TensorTotals {
    /// Adds one tensor, or returns `None` if a sum overflows.
    pub(crate) fn add(&mut self, params: u64, bytes: Bytes) -> Option<()> {
        self.tensors = self.tensors.checked_add(1)?;
        self.params = self.params.checked_add(params)?;
        self.bytes = self.bytes.checked_add(bytes)?;
        Some(())
    }
}

/// One tensor of a safetensors header.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SafetensorsTensor {
    /// The tensor's name (`model.layers.0.self_attn.q_proj.weight`).
    pub name: String,
    /// Element type.
    pub dtype: SafetensorsDtype,
    /// Row-major shape, as in PyTorch; empty for a scalar.
    pub shape: Vec<u64>,
    /// Byte range in the data section (which starts after the header), as the header's
    /// `data_offsets`.
    pub data_offsets: Range<u64>,
    /// Number of elements (the product of `shape`).
    pub elements: u64,
}

impl SafetensorsTensor {
    /// Bytes the tensor takes in the file.
    pub fn bytes(&self) -> Bytes {
        Bytes::new(self.data_offsets.end - self.data_offsets.start)
    }
}

/// A parsed and validated safetensors header.
///
/// Tensors are sorted by name. Totals count tensors as stored; see
/// [`logical_params`](Self::logical_params) for the weight count of a packed
/// GPTQ/AWQ checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SafetensorsHeader {
    tensors: Vec<SafetensorsTensor>,
    metadata: BTreeMap<String, String>,
    totals: TensorTotals,
    by_dtype: BTreeMap<SafetensorsDtype, TensorTotals>,
}

impl SafetensorsHeader {
    /// The tensors, sorted by name.
    pub fn tensors(&self) -> &[SafetensorsTensor] {
        &self.tensors
    }

    /// The tensor with this name.
    pub fn tensor(&self, name: &str) -> Option<&SafetensorsTensor> {
        self.tensors
            .binary_search_by(|t| t.name.as_str().cmp(name))
            .ok()
            .and_then(|index| self.tensors.get(index))
    }

    /// The `__metadata__` map (for example `{"format": "pt"}`); empty if absent.
    pub fn metadata(&self) -> &BTreeMap<String, String> {
        &self.metadata
    }

    /// Totals over all tensors. `totals().bytes` is also the length of the data section.
    pub fn totals(&self) -> TensorTotals {
        self.totals
    }

    /// Totals per dtype, in dtype order.
    pub fn by_dtype(&self) -> &BTreeMap<SafetensorsDtype, TensorTotals> {
        &self.by_dtype
    }

    /// Checks that a file of `file_len` bytes holds exactly the length prefix, a header of
    /// `header_len` bytes and this header's data section. The hub reports file sizes in
    /// its listing, so a truncated or padded upload is caught before planning on it.
    ///
    /// Errors: [`Error::SafetensorsFileSize`].
    pub fn check_file_len(&self, header_len: u64, file_len: u64) -> Result<(), Error> {
        let expected = (LEN_PREFIX_BYTES as u64)
            .saturating_add(header_len)
            .saturating_add(self.totals.bytes.get());
        if expected == file_len {
            Ok(())
        } else {
            Err(Error::SafetensorsFileSize {
                expected,
                found: file_len,
            })
        }
    }

    /// Number of weights the checkpoint represents, counting packed GPTQ/AWQ weights
    /// unpacked.
    ///
    /// Each I32 tensor named `*.qweight` holds `32 / bits` weights per word, so it counts
    /// `elements × 32 / bits` (exact also for 3-bit packing, where three words hold 32
    /// weights). The `qzeros`, `scales` and `g_idx` tensors next to a `qweight` are
    /// quantization data, not weights, and count zero. Every other tensor counts its
    /// elements. For a GPTQ or AWQ checkpoint the result equals the parameter count of the
    /// model it was quantized from. `bits` comes from `quantization_config`: it cannot be
    /// told from the header alone in general.
    ///
    /// Errors: [`Error::InvalidPackedBits`] unless `1 <= bits <= 32`,
    /// [`Error::PackedBitsMismatch`] if a `qweight` does not unpack to a whole number of
    /// weights (the bits do not match the checkpoint).
    pub fn logical_params(&self, bits: u32) -> Result<u64, Error> {
        logical_params(&self.tensors, bits)
    }

    fn from_raw(raw: RawHeader) -> Result<Self, Error> {
        let mut tensors = Vec::with_capacity(raw.tensors.len());
        for (name, entry) in raw.tensors {
            tensors.push(checked_tensor(name, entry)?);
        }
        check_tiling(&tensors)?;
        tensors.sort_by(|a, b| a.name.cmp(&b.name));

        let mut totals = TensorTotals::default();
        let mut by_dtype: BTreeMap<SafetensorsDtype, TensorTotals> = BTreeMap::new();
        for tensor in &tensors {
            let bytes = tensor.bytes();
            totals
                .add(tensor.elements, bytes)
                .and_then(|()| by_dtype.entry(tensor.dtype).or_default().add(tensor.elements, bytes))
                .ok_or_else(|| tensor_error(&tensor.name, too_large(tensor)))?;
        }
        Ok(SafetensorsHeader {
            tensors,
            metadata: raw.metadata,
            totals,
            by_dtype,
        })
    }
}

/// [`SafetensorsHeader::logical_params`] over the tensors of several shards together, so
/// that a layer whose `qweight` and `scales` fall in different shards is still recognised.
pub fn logical_params<'a>(tensors: impl IntoIterator<Item = &'a SafetensorsTensor>, bits: u32) -> Result<u64, Error> {
    if !(1..=32).contains(&bits) {
        return Err(Error::InvalidPackedBits { bits });
    }
    let tensors: Vec<&SafetensorsTensor> = tensors.into_iter().collect();
    let quantized_layers: BTreeSet<&str> = tensors
        .iter()
        .filter(|t| is_packed_qweight(t))
        .filter_map(|t| t.name.strip_suffix(".qweight"))
        .collect();
    let mut total: u64 = 0;
    for tensor in tensors {
        let count = if is_packed_qweight(tensor) {
            unpacked_weights(tensor, bits)?
        } else if is_quantization_aux(&tensor.name, &quantized_layers) {
            0
        } else {
            tensor.elements
        };
        total = total
            .checked_add(count)
            .ok_or_else(|| tensor_error(&tensor.name, too_large(tensor)))?;
    }
    Ok(total)
}

fn is_packed_qweight(tensor: &SafetensorsTensor) -> bool {
    tensor.dtype == SafetensorsDtype::I32 && tensor.name.ends_with(".qweight")
}

/// GPTQ and AWQ store `qzeros`, `scales` and (GPTQ) `g_idx` beside each `qweight`.
fn is_quantization_aux(name: &str, quantized_layers: &BTreeSet<&str>) -> bool {
    [".qzeros", ".scales", ".g_idx"].iter().any(|suffix| {
        name.strip_suffix(suffix)
            .is_some_and(|layer| quantized_layers.contains(layer))
    })
}

fn unpacked_weights(tensor: &SafetensorsTensor, bits: u32) -> Result<u64, Error> {
    let packed_bits = u128::from(tensor.elements) * 32;
    let bits_wide = u128::from(bits);
    if packed_bits % bits_wide != 0 {
        return Err(Error::PackedBitsMismatch {
            name: tensor.name.clone(),
            words: tensor.elements,
            bits,
        });
    }
    u64::try_from(packed_bits / bits_wide).map_err(|_| tensor_error(&tensor.name, too_large(tensor)))
}

/// Validates one header entry on its own: a known dtype, a shape whose size fits, and a
/// byte range of exactly that size (when the range is not reversed; reversed ranges are
/// reported by [`check_tiling`]).
fn checked_tensor(name: String, entry: RawTensor) -> Result<SafetensorsTensor, Error> {
    let dtype: SafetensorsDtype = match entry.dtype.parse() {
        Ok(dtype) => dtype,
        Err(source) => return Err(tensor_error(&name, source)),
    };
    let expected = match dtype.tensor_bytes(&entry.shape) {
        Ok(bytes) => bytes,
        Err(source) => return Err(tensor_error(&name, source)),
    };
    // `tensor_bytes` succeeded, so the element count fits in a u64 (every dtype takes at
    // least 4 bits); the fallback is unreachable but keeps this panic-free.
    let elements = entry
        .shape
        .iter()
        .try_fold(1u64, |count, &dim| count.checked_mul(dim))
        .ok_or_else(|| {
            tensor_error(
                &name,
                Error::TensorTooLarge {
                    dtype: dtype.into(),
                    shape: entry.shape.clone(),
                },
            )
        })?;
    let [start, end] = entry.data_offsets;
    if let Some(found) = end.checked_sub(start)
        && found != expected.get()
    {
        return Err(Error::SafetensorsSizeMismatch {
            name,
            dtype,
            shape: entry.shape,
            expected,
            found: Bytes::new(found),
        });
    }
    Ok(SafetensorsTensor {
        name,
        dtype,
        shape: entry.shape,
        data_offsets: start..end,
        elements,
    })
}

/// The byte ranges, in offset order, must tile the data section from 0: each starts
/// where the previous one ended and does not end before it starts.
fn check_tiling(tensors: &[SafetensorsTensor]) -> Result<(), Error> {
    let mut in_file_order: Vec<&SafetensorsTensor> = tensors.iter().collect();
    in_file_order.sort_by_key(|t| (t.data_offsets.start, t.data_offsets.end));
    let mut expected_start = 0;
    for tensor in in_file_order {
        let Range { start, end } = tensor.data_offsets;
        if start != expected_start || end < start {
            return Err(Error::SafetensorsOffsets {
                name: tensor.name.clone(),
                start,
                end,
                expected_start,
            });
        }
        expected_start = end;
    }
    Ok(())
}

fn tensor_error(name: &str, source: Error) -> Error {
    Error::SafetensorsTensor {
        name: name.to_owned(),
        source: Box::new(source),
    }
}

fn too_large(tensor: &SafetensorsTensor) -> Error {
    Error::TensorTooLarge {
        dtype: tensor.dtype.into(),
        shape: tensor.shape.clone(),
    }
}

/// The header as written, before validation: tensors in file order.
struct RawHeader {
    tensors: Vec<(String, RawTensor)>,
    metadata: BTreeMap<String, String>,
}

#[derive(Deserialize)]
struct RawTensor {
    dtype: String,
    shape: Vec<u64>,
    data_offsets: [u64; 2],
}

impl<'de> Deserialize<'de> for RawHeader {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_map(RawHeaderVisitor)
    }
}

/// Reads the top-level object entry by entry, so that a tensor named twice is an error
/// (a map type would silently keep the last one) and `__metadata__` is told apart from
/// tensors.
struct RawHeaderVisitor;

impl<'de> Visitor<'de> for RawHeaderVisitor {
    type Value = RawHeader;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a safetensors header (a JSON object of tensors)")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<RawHeader, A::Error> {
        let mut names = BTreeSet::new();
        let mut tensors = Vec::new();
        let mut metadata: Option<Option<BTreeMap<String, String>>> = None;
        while let Some(key) = map.next_key::<String>()? {
            if key == "__metadata__" {
                if metadata.is_some() {
                    return Err(de::Error::duplicate_field("__metadata__"));
                }
                metadata = Some(map.next_value()?);
            } else {
                if !names.insert(key.clone()) {
                    return Err(de::Error::custom(format_args!("tensor `{key}` is listed twice")));
                }
                let entry: RawTensor = map.next_value()?;
                tensors.push((key, entry));
            }
        }
        Ok(RawHeader {
            tensors,
            metadata: metadata.flatten().unwrap_or_default(),
        })
    }
}

/// The index of a sharded safetensors checkpoint (`model.safetensors.index.json`): which
/// shard file holds each tensor, and the total size the writer recorded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ShardIndex {
    total_size: Option<Bytes>,
    total_parameters: Option<u64>,
    weight_map: BTreeMap<String, String>,
}

#[derive(Deserialize)]
struct RawShardIndex {
    #[serde(default)]
    metadata: Option<BTreeMap<String, serde_json::Value>>,
    weight_map: BTreeMap<String, String>,
}

impl ShardIndex {
    /// Parses the index JSON.
    ///
    /// Shard file names must be relative paths inside the repository (no `..`, no leading
    /// `/`, no backslash): the hub edge turns them into URLs and cache paths.
    ///
    /// Errors: [`Error::ShardIndexJson`] for malformed JSON or a missing `weight_map`,
    /// [`Error::ShardIndexBadFile`] for a shard path that leaves the repository.
    pub fn parse(json: &[u8]) -> Result<ShardIndex, Error> {
        let raw: RawShardIndex = serde_json::from_slice(json).map_err(|source| Error::ShardIndexJson { source })?;
        if let Some((tensor, file)) = raw.weight_map.iter().find(|(_, file)| !is_repo_relative(file)) {
            return Err(Error::ShardIndexBadFile {
                tensor: tensor.clone(),
                file: file.clone(),
            });
        }
        let metadata = raw.metadata.unwrap_or_default();
        Ok(ShardIndex {
            total_size: metadata.get("total_size").and_then(json_count).map(Bytes::new),
            total_parameters: metadata.get("total_parameters").and_then(json_count),
            weight_map: raw.weight_map,
        })
    }

    /// `metadata.total_size`: the bytes of all tensors as the writer counted them, if
    /// recorded. Some writers count differently (shared tensors once or twice), so treat
    /// it as a cross-check; the shard headers are exact.
    pub fn total_size(&self) -> Option<Bytes> {
        self.total_size
    }

    /// `metadata.total_parameters`, which recent writers record.
    pub fn total_parameters(&self) -> Option<u64> {
        self.total_parameters
    }

    /// Tensor name → shard file, sorted by tensor name.
    pub fn weight_map(&self) -> &BTreeMap<String, String> {
        &self.weight_map
    }

    /// The shard files, sorted and without repeats: the files whose headers to read.
    pub fn shard_files(&self) -> Vec<&str> {
        let files: BTreeSet<&str> = self.weight_map.values().map(String::as_str).collect();
        files.into_iter().collect()
    }

    /// The tensors that the index places in `file`, sorted by name.
    pub fn tensors_in<'a>(&'a self, file: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        self.weight_map
            .iter()
            .filter(move |(_, shard)| shard.as_str() == file)
            .map(|(tensor, _)| tensor.as_str())
    }
}

impl ShardIndex {
    /// Checks the shards' headers against the index: every tensor the index names is in
    /// the shard it names, and no shard holds a tensor the index does not place there.
    /// A checkpoint that fails this was uploaded half-way or edited by hand, and an
    /// estimate from it would be wrong. (`total_size` is not compared: writers count
    /// shared tensors differently.)
    ///
    /// Errors: [`Error::ShardIndexMismatch`] naming the first disagreement.
    pub fn check_shards<'a>(
        &self,
        shards: impl IntoIterator<Item = (&'a str, &'a SafetensorsHeader)>,
    ) -> Result<(), Error> {
        let mismatch = |detail: String| Err(Error::ShardIndexMismatch { detail });
        let mut seen = BTreeSet::new();
        for (file, header) in shards {
            for tensor in header.tensors() {
                match self.weight_map.get(&tensor.name) {
                    Some(placed) if placed == file => {
                        seen.insert(tensor.name.as_str());
                    }
                    Some(placed) => {
                        return mismatch(format!(
                            "`{}` is in `{file}` but the index places it in `{placed}`",
                            tensor.name
                        ));
                    }
                    None => {
                        return mismatch(format!(
                            "`{file}` holds `{}`, which the index does not name",
                            tensor.name
                        ));
                    }
                }
            }
        }
        if let Some((name, file)) = self.weight_map.iter().find(|(name, _)| !seen.contains(name.as_str())) {
            return mismatch(format!(
                "the index places `{name}` in `{file}`, but that shard does not hold it"
            ));
        }
        Ok(())
    }
}

/// A JSON number used as a count: a non-negative integer, also when written as a float
/// with no fraction (`1.6e10`), as some writers do.
fn json_count(value: &serde_json::Value) -> Option<u64> {
    if let Some(count) = value.as_u64() {
        return Some(count);
    }
    let float = value.as_f64()?;
    // 2^64 as f64; casting a float in [0, 2^64) to u64 is exact for integral values.
    let in_range = (0.0..18_446_744_073_709_551_616.0).contains(&float);
    (in_range && float.fract() == 0.0).then_some(float as u64)
}

pub(crate) fn is_repo_relative(file: &str) -> bool {
    !file.is_empty()
        && !file.starts_with('/')
        && !file.contains('\\')
        && !file.contains('\0')
        && file
            .split('/')
            .all(|part| !part.is_empty() && part != "." && part != "..")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(json: &str) -> Result<SafetensorsHeader, Error> {
        parse_header(json.as_bytes())
    }

    #[test]
    fn header_len_reads_little_endian_and_refuses_hostile_lengths() {
        assert_eq!(header_len(&[3, 1, 0, 0, 0, 0, 0, 0, 0xff]).unwrap(), 259);
        assert!(matches!(
            header_len(&[1, 2, 3]),
            Err(Error::SafetensorsPrefixTooShort { len: 3 })
        ));
        let hostile = (MAX_HEADER_LEN + 1).to_le_bytes();
        assert!(matches!(
            header_len(&hostile),
            Err(Error::SafetensorsHeaderTooLarge { len, .. }) if len == MAX_HEADER_LEN + 1
        ));
        assert_eq!(header_len(&MAX_HEADER_LEN.to_le_bytes()).unwrap(), MAX_HEADER_LEN);
    }

    #[test]
    fn metadata_may_be_null_or_absent_but_holds_strings_only() {
        let empty = header(r#"{"__metadata__": null}"#).unwrap();
        assert!(empty.metadata().is_empty());
        assert_eq!(empty.totals(), TensorTotals::default());
        assert!(matches!(
            header(r#"{"__metadata__": {"format": 1}}"#),
            Err(Error::SafetensorsHeaderJson { .. })
        ));
        assert!(matches!(
            header(r#"{"__metadata__": {}, "__metadata__": {}}"#),
            Err(Error::SafetensorsHeaderJson { .. })
        ));
    }

    #[test]
    fn zero_sized_tensors_may_share_an_offset() {
        let h = header(
            r#"{"a": {"dtype": "F32", "shape": [0], "data_offsets": [0, 0]},
                "b": {"dtype": "F32", "shape": [0, 3], "data_offsets": [0, 0]},
                "c": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]}}"#,
        )
        .unwrap();
        assert_eq!(h.totals().bytes, Bytes::new(2));
        assert_eq!(h.totals().tensors, 3);
    }

    #[test]
    fn json_counts_accept_integral_floats_only() {
        use serde_json::json;
        assert_eq!(json_count(&json!(16_060_522_496u64)), Some(16_060_522_496));
        assert_eq!(json_count(&json!(1.6e10)), Some(16_000_000_000));
        assert_eq!(json_count(&json!(1.5)), None);
        assert_eq!(json_count(&json!(-1)), None);
        assert_eq!(json_count(&json!("12")), None);
        assert_eq!(json_count(&json!(1e30)), None);
    }

    #[test]
    fn shard_paths_must_stay_in_the_repository() {
        for good in ["model-00001-of-00002.safetensors", "transformer/model.safetensors"] {
            assert!(is_repo_relative(good), "{good}");
        }
        for bad in [
            "",
            "/etc/passwd",
            "../x.safetensors",
            "a/../../b",
            "a//b",
            "./a",
            "a\\b",
        ] {
            assert!(!is_repo_relative(bad), "{bad}");
        }
    }
}
