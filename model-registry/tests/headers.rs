//! Safetensors and GGUF headers built in memory, parsed back: exact totals, the
//! range-read protocol (`NeedMore` at every truncation), hostile lengths, and
//! quantization classification from the parsed headers.

use std::error::Error as _;

use proptest::prelude::*;
use serde_json::json;
use skein_model_registry::gguf::{ARRAY_PREVIEW_ITEMS, GgufValueType, MAX_HEADER_BYTES};
use skein_model_registry::safetensors::{self, LEN_PREFIX_BYTES};
use skein_model_registry::{
    Bytes, Error, GgmlType, GgufFileType, GgufHeader, GgufParse, GgufValue, NominalPrecision, QuantMethod,
    Quantization, SafetensorsDtype, SafetensorsHeader, ShardIndex, TensorTotals, WeightFormat,
};

// ---------------------------------------------------------------------------------------
// Safetensors writer
// ---------------------------------------------------------------------------------------

/// A safetensors file with real tensor bytes, written as the reference implementation
/// writes it: tensors laid out in the given order, header padded with spaces to a
/// multiple of 8.
fn safetensors_file(tensors: &[(&str, SafetensorsDtype, &[u64])], metadata: &[(&str, &str)]) -> Vec<u8> {
    let mut header = serde_json::Map::new();
    let mut data = Vec::new();
    for (index, &(name, dtype, shape)) in tensors.iter().enumerate() {
        let len = dtype.tensor_bytes(shape).unwrap().get() as usize;
        let start = data.len();
        data.extend((0..len).map(|i| (i + index) as u8));
        header.insert(
            name.to_owned(),
            json!({"dtype": dtype.as_str(), "shape": shape, "data_offsets": [start, data.len()]}),
        );
    }
    if !metadata.is_empty() {
        let map: serde_json::Map<String, serde_json::Value> =
            metadata.iter().map(|&(k, v)| (k.to_owned(), json!(v))).collect();
        header.insert("__metadata__".to_owned(), serde_json::Value::Object(map));
    }
    let mut header = serde_json::to_vec(&header).unwrap();
    while !header.len().is_multiple_of(8) {
        header.push(b' ');
    }
    let mut file = (header.len() as u64).to_le_bytes().to_vec();
    file.extend(header);
    file.extend(data);
    file
}

/// Parses a whole file the way the hub edge will: length first, then the header range.
fn parse_safetensors(file: &[u8]) -> Result<(u64, SafetensorsHeader), Error> {
    let len = safetensors::header_len(file)?;
    let header = file.get(LEN_PREFIX_BYTES..LEN_PREFIX_BYTES + len as usize).unwrap();
    Ok((len, safetensors::parse_header(header)?))
}

fn header_json(json: serde_json::Value) -> Result<SafetensorsHeader, Error> {
    safetensors::parse_header(&serde_json::to_vec(&json).unwrap())
}

const BF16: SafetensorsDtype = SafetensorsDtype::BF16;
const F16: SafetensorsDtype = SafetensorsDtype::F16;
const F32: SafetensorsDtype = SafetensorsDtype::F32;
const I32: SafetensorsDtype = SafetensorsDtype::I32;

fn small_safetensors() -> Vec<u8> {
    safetensors_file(
        &[
            ("model.embed_tokens.weight", BF16, &[32, 8]),
            ("model.layers.0.mlp.up_proj.weight", SafetensorsDtype::F8_E4M3, &[16, 8]),
            ("model.layers.0.mlp.up_proj.weight_scale", F32, &[]),
            ("model.norm.weight", F32, &[8]),
            ("lm_head.weight", F16, &[32, 8]),
            ("router.packed", SafetensorsDtype::F4, &[2, 4]),
        ],
        &[("format", "pt")],
    )
}

// ---------------------------------------------------------------------------------------
// Safetensors
// ---------------------------------------------------------------------------------------

#[test]
fn safetensors_header_gives_exact_tensors_and_totals() {
    let file = small_safetensors();
    let (len, header) = parse_safetensors(&file).unwrap();
    assert_eq!(len % 8, 0);

    let names: Vec<&str> = header.tensors().iter().map(|t| t.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "lm_head.weight",
            "model.embed_tokens.weight",
            "model.layers.0.mlp.up_proj.weight",
            "model.layers.0.mlp.up_proj.weight_scale",
            "model.norm.weight",
            "router.packed",
        ],
        "sorted by name"
    );
    let embed = header.tensor("model.embed_tokens.weight").unwrap();
    assert_eq!((embed.dtype, embed.shape.as_slice()), (BF16, &[32u64, 8][..]));
    assert_eq!(embed.data_offsets, 0..512);
    assert_eq!((embed.elements, embed.bytes()), (256, Bytes::new(512)));
    let scale = header.tensor("model.layers.0.mlp.up_proj.weight_scale").unwrap();
    assert_eq!((scale.elements, scale.bytes()), (1, Bytes::new(4)), "a scalar");
    let packed = header.tensor("router.packed").unwrap();
    assert_eq!((packed.elements, packed.bytes()), (8, Bytes::new(4)), "two F4 per byte");
    assert!(header.tensor("missing").is_none());

    let data_len = 512 + 128 + 4 + 32 + 512 + 4;
    assert_eq!(
        header.totals(),
        TensorTotals {
            tensors: 6,
            params: 256 + 128 + 1 + 8 + 256 + 8,
            bytes: Bytes::new(data_len),
        }
    );
    assert_eq!(header.by_dtype()[&F32].params, 9);
    assert_eq!(header.by_dtype()[&F32].tensors, 2);
    assert_eq!(header.by_dtype()[&BF16].bytes, Bytes::new(512));
    assert_eq!(header.metadata()["format"], "pt");

    header.check_file_len(len, file.len() as u64).unwrap();
    let err = header.check_file_len(len, file.len() as u64 - 1).unwrap_err();
    assert!(matches!(err, Error::SafetensorsFileSize { expected, found } if expected == found + 1));
}

#[test]
fn header_len_needs_eight_bytes_and_refuses_hostile_lengths() {
    let file = small_safetensors();
    for len in 0..LEN_PREFIX_BYTES {
        assert!(matches!(
            safetensors::header_len(&file[..len]),
            Err(Error::SafetensorsPrefixTooShort { len: l }) if l == len
        ));
    }
    let hostile = u64::MAX.to_le_bytes();
    let err = safetensors::header_len(&hostile).unwrap_err();
    assert_eq!(
        err.to_string(),
        "the safetensors header claims 18446744073709551615 bytes, more than the 100000000 that loaders accept"
    );
}

#[test]
fn safetensors_entries_are_validated_like_the_reference_loader() {
    let tensor = |dtype: &str, shape: &[u64], offsets: [u64; 2]| json!({"dtype": dtype, "shape": shape, "data_offsets": offsets});

    // An unknown dtype keeps its typed cause, with the tensor named.
    let err = header_json(json!({"w": tensor("bf16", &[2], [0, 4])})).unwrap_err();
    assert_eq!(err.to_string(), "invalid safetensors tensor `w`");
    let Error::SafetensorsTensor { source, .. } = &err else {
        panic!("{err:?}")
    };
    assert!(matches!(
        **source,
        Error::UnknownSafetensorsDtype {
            suggestion: Some(BF16),
            ..
        }
    ));
    assert_eq!(
        err.source().unwrap().to_string(),
        "unknown safetensors dtype `bf16`; help: dtype names are case-sensitive, did you mean `BF16`?"
    );

    let err = header_json(json!({"w": tensor("F4", &[3], [0, 2])})).unwrap_err();
    assert!(matches!(err, Error::SafetensorsTensor { .. }), "{err:?}");

    let err = header_json(json!({"w": tensor("F32", &[2, 3], [0, 20])})).unwrap_err();
    assert_eq!(
        err.to_string(),
        "safetensors tensor `w` (F32 [2, 3]) needs 24 bytes but its data_offsets span 20 bytes"
    );

    let gap = json!({"a": tensor("U8", &[4], [0, 4]), "b": tensor("U8", &[4], [8, 12])});
    assert!(matches!(
        header_json(gap).unwrap_err(),
        Error::SafetensorsOffsets { name, start: 8, expected_start: 4, .. } if name == "b"
    ));
    let overlap = json!({"a": tensor("U8", &[4], [0, 4]), "b": tensor("U8", &[4], [2, 6])});
    assert!(matches!(
        header_json(overlap).unwrap_err(),
        Error::SafetensorsOffsets { .. }
    ));
    let not_from_zero = json!({"a": tensor("U8", &[4], [4, 8])});
    assert!(matches!(
        header_json(not_from_zero).unwrap_err(),
        Error::SafetensorsOffsets { .. }
    ));
    let reversed = json!({"a": tensor("U8", &[4], [0, 4]), "b": tensor("U8", &[4], [4, 0])});
    assert!(matches!(
        header_json(reversed).unwrap_err(),
        Error::SafetensorsOffsets { .. }
    ));

    let json_errors: [&[u8]; 6] = [
        br#"{"a": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}, "a": {"dtype": "U8", "shape": [1], "data_offsets": [1, 2]}}"#,
        br#"{"a": {"dtype": "U8", "shape": [-1], "data_offsets": [0, 1]}}"#,
        br#"{"a": {"dtype": "U8", "shape": [1]}}"#,
        br#"[1, 2]"#,
        br#"{} trailing"#,
        b"\xff\xfe",
    ];
    for bytes in json_errors {
        let err = safetensors::parse_header(bytes).unwrap_err();
        assert!(matches!(err, Error::SafetensorsHeaderJson { .. }), "{err:?}");
        assert!(err.source().is_some());
    }
    let err = safetensors::parse_header(json_errors[0]).unwrap_err();
    assert!(
        err.source().unwrap().to_string().contains("tensor `a` is listed twice"),
        "{err:?}"
    );
}

/// A GPTQ layer of 64 inputs and 32 outputs, 4-bit in groups of 32, beside unquantized
/// embeddings: shapes as AutoGPTQ writes them.
fn gptq_tensors() -> Vec<(&'static str, SafetensorsDtype, &'static [u64])> {
    vec![
        ("model.embed_tokens.weight", F16, &[100, 64]),
        ("model.layers.0.mlp.down_proj.qweight", I32, &[8, 32]),
        ("model.layers.0.mlp.down_proj.qzeros", I32, &[2, 4]),
        ("model.layers.0.mlp.down_proj.scales", F16, &[2, 32]),
        ("model.layers.0.mlp.down_proj.g_idx", I32, &[64]),
        ("model.layers.0.mlp.down_proj.bias", F16, &[32]),
        ("model.norm.weight", F16, &[64]),
    ]
}

#[test]
fn packed_gptq_counts_stored_and_logical_params() {
    let file = safetensors_file(&gptq_tensors(), &[]);
    let (_, header) = parse_safetensors(&file).unwrap();
    let stored = 6400 + 256 + 8 + 64 + 64 + 32 + 64;
    assert_eq!(header.totals().params, stored, "packed words counted as stored");
    assert_eq!(header.by_dtype()[&I32].bytes, Bytes::new((256 + 8 + 64) * 4));

    let logical = 6400 + 64 * 32 + 32 + 64;
    assert_eq!(
        header.logical_params(4).unwrap(),
        logical,
        "qweight unpacked, qzeros/scales/g_idx dropped"
    );
    assert!(matches!(
        header.logical_params(0),
        Err(Error::InvalidPackedBits { bits: 0 })
    ));
    assert!(matches!(
        header.logical_params(33),
        Err(Error::InvalidPackedBits { .. })
    ));
    let err = header.logical_params(3).unwrap_err();
    assert!(
        matches!(
            &err,
            Error::PackedBitsMismatch {
                words: 256,
                bits: 3,
                ..
            }
        ),
        "{err:?}"
    );

    let q = Quantization::from_safetensors(header.tensors()).unwrap();
    assert_eq!(
        (q.method, q.weight_bits, q.group_size),
        (QuantMethod::Gptq, 4, Some(32))
    );
    assert_eq!(q.format, WeightFormat::Safetensors);

    // A layer split across two shards is still recognised when the shards are counted
    // together.
    let tensors = gptq_tensors();
    let (first, second) = tensors.split_at(3);
    let (_, one) = parse_safetensors(&safetensors_file(first, &[])).unwrap();
    let (_, two) = parse_safetensors(&safetensors_file(second, &[])).unwrap();
    let both = one.tensors().iter().chain(two.tensors());
    assert_eq!(safetensors::logical_params(both.clone(), 4).unwrap(), logical);
    assert_ne!(one.logical_params(4).unwrap() + two.logical_params(4).unwrap(), logical);
    assert_eq!(Quantization::from_safetensors(both), Some(q));
}

#[test]
fn packed_awq_and_three_bit_gptq_are_read_off_the_shapes() {
    let awq = safetensors_file(
        &[
            ("l.qweight", I32, &[64, 4]),
            ("l.qzeros", I32, &[2, 4]),
            ("l.scales", F16, &[2, 32]),
        ],
        &[],
    );
    let (_, header) = parse_safetensors(&awq).unwrap();
    let q = Quantization::from_safetensors(header.tensors()).unwrap();
    assert_eq!((q.method, q.weight_bits, q.group_size), (QuantMethod::Awq, 4, Some(32)));
    assert_eq!(header.logical_params(4).unwrap(), 64 * 32);

    // 3-bit GPTQ packs 32 weights into 3 words: 64 inputs take 6 rows.
    let gptq3 = safetensors_file(
        &[
            ("l.qweight", I32, &[6, 32]),
            ("l.scales", F16, &[1, 32]),
            ("l.g_idx", I32, &[64]),
        ],
        &[],
    );
    let (_, header) = parse_safetensors(&gptq3).unwrap();
    let q = Quantization::from_safetensors(header.tensors()).unwrap();
    assert_eq!((q.method, q.weight_bits, q.group_size), (QuantMethod::Gptq, 3, None));
    assert_eq!(header.logical_params(3).unwrap(), 64 * 32);

    // Layers that disagree leave the answer to quantization_config.
    let mixed = safetensors_file(
        &[
            ("a.qweight", I32, &[64, 4]),
            ("a.scales", F16, &[2, 32]),
            ("b.qweight", I32, &[64, 8]),
            ("b.scales", F16, &[2, 32]),
        ],
        &[],
    );
    let (_, header) = parse_safetensors(&mixed).unwrap();
    assert_eq!(Quantization::from_safetensors(header.tensors()), None);
}

#[test]
fn dense_and_companion_tensor_schemes_are_classified() {
    let classify = |tensors: &[(&str, SafetensorsDtype, &[u64])]| {
        let (_, header) = parse_safetensors(&safetensors_file(tensors, &[])).unwrap();
        Quantization::from_safetensors(header.tensors())
    };
    // Norms stay F32 in every scheme: only matrices vote.
    let bf16 = classify(&[("w", BF16, &[8, 8]), ("norm", F32, &[1024])]).unwrap();
    assert_eq!(bf16.method, QuantMethod::Bf16);
    let fp8 = classify(&[
        ("embed", BF16, &[16, 8]),
        ("a", SafetensorsDtype::F8_E4M3, &[64, 8]),
        ("a_scale", F32, &[64, 1]),
    ])
    .unwrap();
    assert_eq!(
        fp8.nominal(),
        NominalPrecision {
            bits: 8,
            kind: skein_model_registry::NumberKind::Float
        }
    );
    let bnb4 = classify(&[
        ("l.weight", SafetensorsDtype::U8, &[1024, 1]),
        ("l.weight.absmax", F32, &[32]),
        ("l.weight.quant_map", F32, &[16]),
        ("l.weight.quant_state.bitsandbytes__nf4", SafetensorsDtype::U8, &[64]),
    ])
    .unwrap();
    assert_eq!((bnb4.method, bnb4.group_size), (QuantMethod::BitsAndBytes4, Some(64)));
    // 1024 B of codes, 128 B of absmax, 64 B of quant map and 64 B of state for 2048 weights.
    assert_eq!(bnb4.bits, 5.0);
    let bnb8 = classify(&[("l.weight", SafetensorsDtype::I8, &[8, 8]), ("l.SCB", F32, &[8])]).unwrap();
    assert_eq!(bnb8.method, QuantMethod::BitsAndBytes8);
    let mxfp4 = classify(&[
        ("experts.down_proj_blocks", SafetensorsDtype::U8, &[4, 8, 16]),
        ("experts.down_proj_scales", SafetensorsDtype::U8, &[4, 8]),
    ])
    .unwrap();
    assert_eq!(
        (mxfp4.method, mxfp4.bits, mxfp4.group_size),
        (QuantMethod::Fp4, 4.25, Some(32))
    );
    assert_eq!(classify(&[("ids", SafetensorsDtype::I64, &[4, 4])]), None);
    assert_eq!(Quantization::from_safetensors([]), None);
}

#[test]
fn shard_index_lists_the_files_to_read() {
    let index = br#"{
        "metadata": {"total_size": 16060522496},
        "weight_map": {
            "lm_head.weight": "model-00002-of-00002.safetensors",
            "model.embed_tokens.weight": "model-00001-of-00002.safetensors",
            "model.layers.0.self_attn.q_proj.weight": "model-00001-of-00002.safetensors",
            "model.norm.weight": "model-00002-of-00002.safetensors"
        }
    }"#;
    let index = ShardIndex::parse(index).unwrap();
    assert_eq!(index.total_size(), Some(Bytes::new(16_060_522_496)));
    assert_eq!(index.total_parameters(), None);
    assert_eq!(
        index.shard_files(),
        ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    );
    let first: Vec<&str> = index.tensors_in("model-00001-of-00002.safetensors").collect();
    assert_eq!(
        first,
        ["model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight"]
    );
    assert_eq!(index.weight_map().len(), 4);

    let no_metadata = ShardIndex::parse(br#"{"weight_map": {"a": "x.safetensors"}}"#).unwrap();
    assert_eq!(no_metadata.total_size(), None);

    let err = ShardIndex::parse(br#"{"weight_map": {"a": "../../secrets"}}"#).unwrap_err();
    assert_eq!(
        err.to_string(),
        "the safetensors index places `a` in `../../secrets`, which is not a file path inside the repository"
    );
    assert!(matches!(
        ShardIndex::parse(br#"{"metadata": {}}"#),
        Err(Error::ShardIndexJson { .. })
    ));
}

// ---------------------------------------------------------------------------------------
// GGUF writer
// ---------------------------------------------------------------------------------------

/// A metadata value to write.
#[derive(Clone)]
enum V {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    Str(String),
    /// A string of raw bytes, possibly not UTF-8.
    Raw(Vec<u8>),
    /// Item type id and items.
    Array(u32, Vec<V>),
    U64(u64),
    I64(i64),
    F64(f64),
}

impl V {
    fn type_id(&self) -> u32 {
        match self {
            V::U8(_) => 0,
            V::I8(_) => 1,
            V::U16(_) => 2,
            V::I16(_) => 3,
            V::U32(_) => 4,
            V::I32(_) => 5,
            V::F32(_) => 6,
            V::Bool(_) => 7,
            V::Str(_) | V::Raw(_) => 8,
            V::Array(..) => 9,
            V::U64(_) => 10,
            V::I64(_) => 11,
            V::F64(_) => 12,
        }
    }

    fn write(&self, out: &mut Vec<u8>) {
        match self {
            V::U8(v) => out.push(*v),
            V::I8(v) => out.extend(v.to_le_bytes()),
            V::U16(v) => out.extend(v.to_le_bytes()),
            V::I16(v) => out.extend(v.to_le_bytes()),
            V::U32(v) => out.extend(v.to_le_bytes()),
            V::I32(v) => out.extend(v.to_le_bytes()),
            V::F32(v) => out.extend(v.to_le_bytes()),
            V::Bool(v) => out.push(u8::from(*v)),
            V::Str(s) => write_str(out, s.as_bytes()),
            V::Raw(bytes) => write_str(out, bytes),
            V::Array(item_type, items) => {
                out.extend(item_type.to_le_bytes());
                out.extend((items.len() as u64).to_le_bytes());
                for item in items {
                    item.write(out);
                }
            }
            V::U64(v) => out.extend(v.to_le_bytes()),
            V::I64(v) => out.extend(v.to_le_bytes()),
            V::F64(v) => out.extend(v.to_le_bytes()),
        }
    }
}

fn s(text: &str) -> V {
    V::Str(text.to_owned())
}

fn write_str(out: &mut Vec<u8>, bytes: &[u8]) {
    out.extend((bytes.len() as u64).to_le_bytes());
    out.extend(bytes);
}

/// A GGUF file: header, padding, and zeroed tensor data.
struct Gguf {
    version: u32,
    pairs: Vec<(String, V)>,
    tensors: Vec<(String, Vec<u64>, u32)>,
    alignment: u64,
}

impl Gguf {
    fn new() -> Self {
        Gguf {
            version: 3,
            pairs: Vec::new(),
            tensors: Vec::new(),
            alignment: 32,
        }
    }

    fn kv(mut self, key: &str, value: V) -> Self {
        if key == "general.alignment"
            && let V::U32(alignment) = value
        {
            self.alignment = alignment.into();
        }
        self.pairs.push((key.to_owned(), value));
        self
    }

    fn tensor(mut self, name: &str, dims: &[u64], ggml_type: GgmlType) -> Self {
        self.tensors.push((name.to_owned(), dims.to_vec(), ggml_type.id()));
        self
    }

    /// The file and the length of its header (where the last tensor info ends).
    fn build(&self) -> (Vec<u8>, usize) {
        let mut out = b"GGUF".to_vec();
        out.extend(self.version.to_le_bytes());
        out.extend((self.tensors.len() as u64).to_le_bytes());
        out.extend((self.pairs.len() as u64).to_le_bytes());
        for (key, value) in &self.pairs {
            write_str(&mut out, key.as_bytes());
            out.extend(value.type_id().to_le_bytes());
            value.write(&mut out);
        }
        let mut offset: u64 = 0;
        let mut data_len: u64 = 0;
        for (name, dims, type_id) in &self.tensors {
            write_str(&mut out, name.as_bytes());
            out.extend((dims.len() as u32).to_le_bytes());
            for dim in dims {
                out.extend(dim.to_le_bytes());
            }
            out.extend(type_id.to_le_bytes());
            out.extend(offset.to_le_bytes());
            // Invalid and absurdly large tensors get no data: only their infos matter.
            let bytes = GgmlType::from_id(*type_id)
                .and_then(|t| t.tensor_bytes(dims))
                .map_or(0, |b| b.get());
            let bytes = if bytes > 1 << 24 { 0 } else { bytes };
            data_len = offset + bytes;
            offset = (offset + bytes).next_multiple_of(self.alignment);
        }
        let header_len = out.len();
        out.resize(header_len.next_multiple_of(self.alignment as usize), 0);
        out.resize(out.len() + data_len as usize, 0);
        out.resize(out.len().next_multiple_of(self.alignment as usize), 0);
        (out, header_len)
    }
}

/// A llama-style model with two layers and every value type in its metadata.
fn small_gguf() -> Gguf {
    Gguf::new()
        .kv("general.architecture", s("llama"))
        .kv("general.name", s("tiny"))
        .kv("general.file_type", V::U32(15))
        .kv("llama.block_count", V::U32(2))
        .kv("llama.context_length", V::U32(4096))
        .kv("llama.embedding_length", V::U64(256))
        .kv("llama.attention.head_count", V::U32(8))
        .kv("llama.attention.head_count_kv", V::I32(2))
        .kv("llama.feed_forward_length", V::Array(4, vec![V::U32(512), V::U32(768)]))
        .kv("llama.rope.freq_base", V::F32(500_000.0))
        .kv("llama.attention.layer_norm_rms_epsilon", V::F64(1e-5))
        .kv("tokenizer.ggml.add_bos_token", V::Bool(true))
        .kv("tokenizer.ggml.bos_token_id", V::U16(1))
        .kv("test.u8", V::U8(255))
        .kv("test.i8", V::I8(-8))
        .kv("test.i16", V::I16(-16))
        .kv("test.i64", V::I64(-64))
        .kv("test.u64", V::U64(u64::MAX))
        .kv(
            "test.nested",
            V::Array(
                9,
                vec![V::Array(3, vec![V::I16(1), V::I16(2)]), V::Array(8, vec![s("x")])],
            ),
        )
        .kv("test.empty", V::Array(8, vec![]))
        .kv("test.not_utf8", V::Raw(b"a\xffb".to_vec()))
        .tensor("token_embd.weight", &[256, 32], GgmlType::Q4_K)
        .tensor("blk.0.attn_q.weight", &[256, 256], GgmlType::Q4_K)
        .tensor("blk.0.ffn_down.weight", &[512, 256], GgmlType::Q6_K)
        .tensor("blk.0.attn_norm.weight", &[256], GgmlType::F32)
        .tensor("output_norm.weight", &[7], GgmlType::F16)
        .tensor("output.weight", &[256, 32], GgmlType::Q8_0)
}

/// A v3 file with a 100,000-token vocabulary, its scores and token types.
fn vocab_gguf(n_vocab: usize) -> Gguf {
    let tokens = (0..n_vocab).map(|i| s(&format!("tok{i}"))).collect();
    let scores = (0..n_vocab).map(|i| V::F32(-(i as f32))).collect();
    let types = (0..n_vocab).map(|_| V::I32(1)).collect();
    Gguf::new()
        .kv("general.architecture", s("qwen2"))
        .kv("general.file_type", V::U32(7))
        .kv("general.alignment", V::U32(64))
        .kv("tokenizer.ggml.model", s("gpt2"))
        .kv("tokenizer.ggml.tokens", V::Array(8, tokens))
        .kv("tokenizer.ggml.scores", V::Array(6, scores))
        .kv("tokenizer.ggml.token_type", V::Array(5, types))
        .kv("qwen2.block_count", V::U32(1))
        .tensor("token_embd.weight", &[64, 1000], GgmlType::Q8_0)
        .tensor("output_norm.weight", &[64], GgmlType::F32)
}

fn need_more(result: Result<GgufHeader, GgufParse>) -> u64 {
    match result {
        Err(GgufParse::NeedMore { at_least }) => at_least,
        other => panic!("expected NeedMore, got {other:?}"),
    }
}

fn invalid(bytes: &[u8]) -> Error {
    match GgufHeader::parse(bytes) {
        Err(GgufParse::Invalid(error)) => error,
        other => panic!("expected an invalid header, got {other:?}"),
    }
}

// ---------------------------------------------------------------------------------------
// GGUF
// ---------------------------------------------------------------------------------------

#[test]
fn gguf_header_gives_metadata_tensors_and_totals() {
    let (file, header_len) = small_gguf().build();
    let header = GgufHeader::parse(&file).unwrap();
    assert_eq!(header.version(), 3);
    assert_eq!(header.architecture(), Some("llama"));
    assert_eq!(header.block_count(), Some(2));
    assert_eq!(header.context_length(), Some(4096));
    assert_eq!(header.embedding_length(), Some(256), "u64 reads as well as u32");
    assert_eq!(header.head_count(), Some(8));
    assert_eq!(header.head_count_kv(), Some(2), "i32 reads as well");
    assert_eq!(header.file_type(), Some(15));
    assert_eq!(header.get("test.u64"), Some(&GgufValue::U64(u64::MAX)));
    assert_eq!(header.get("test.i8"), Some(&GgufValue::I8(-8)));
    assert_eq!(
        header.get("llama.rope.freq_base").and_then(GgufValue::as_f64),
        Some(500_000.0)
    );
    assert_eq!(
        header.get("test.not_utf8").and_then(GgufValue::as_str),
        Some("a\u{fffd}b")
    );

    let ffn = header.get("llama.feed_forward_length").unwrap().as_array().unwrap();
    assert!(ffn.is_complete());
    assert_eq!(ffn.items, [GgufValue::U32(512), GgufValue::U32(768)]);
    let nested = header.get("test.nested").unwrap().as_array().unwrap();
    assert_eq!(nested.item_type, GgufValueType::Array);
    assert_eq!(
        nested.items[0].as_array().unwrap().items,
        [GgufValue::I16(1), GgufValue::I16(2)]
    );
    assert_eq!(nested.items[1].to_string(), "[string; 1]");
    assert_eq!(header.get("test.empty").unwrap().as_array().unwrap().len, 0);

    assert_eq!(header.header_len(), header_len as u64);
    assert_eq!(header.alignment(), 32);
    assert_eq!(header.tensor_data_offset(), (header_len as u64).next_multiple_of(32));
    assert_eq!(header.tensor_data_offset() + header.data_len().get(), file.len() as u64);

    let q = &header.tensors()[2];
    assert_eq!(q.name, "blk.0.ffn_down.weight");
    assert_eq!(q.dims, [512, 256], "ne[0] first");
    assert_eq!(q.shape(), [256, 512], "row-major");
    assert_eq!(q.ggml_type, GgmlType::Q6_K);
    assert_eq!(q.elements, 512 * 256);
    assert_eq!(q.bytes, Bytes::new(2 * 210 * 256));
    let norm = &header.tensors()[4];
    assert_eq!((norm.bytes, norm.offset % 32), (Bytes::new(14), 0));
    assert_eq!(header.tensors()[5].offset, norm.offset + 32, "14 bytes padded to 32");

    let q4k = 144 * 32 + 144 * 256;
    let totals = header.totals();
    assert_eq!(totals.tensors, 6);
    assert_eq!(totals.params, 256 * 32 + 256 * 256 + 512 * 256 + 256 + 7 + 256 * 32);
    assert_eq!(totals.bytes.get(), q4k + 2 * 210 * 256 + 1024 + 14 + 8 * 34 * 32);
    assert_eq!(header.by_type()[&GgmlType::Q4_K].bytes, Bytes::new(q4k));
    assert_eq!(header.by_type()[&GgmlType::Q4_K].tensors, 2);

    let quantization = Quantization::from_gguf(&header).unwrap();
    assert_eq!(quantization.method, QuantMethod::Gguf(GgufFileType::Q4_K_M));
    assert_eq!(quantization.format, WeightFormat::Gguf);
    let exact = totals.bytes.get() as f64 * 8.0 / totals.params as f64;
    assert!((f64::from(quantization.bits) - exact).abs() < 1e-4);
    assert_eq!(quantization.tier_bits(), 4);

    // Version 2 has the same layout.
    let mut v2 = small_gguf();
    v2.version = 2;
    assert_eq!(GgufHeader::parse(&v2.build().0).unwrap().version(), 2);
}

#[test]
fn a_large_vocabulary_is_counted_not_kept() {
    let n_vocab = 100_000;
    let (file, header_len) = vocab_gguf(n_vocab).build();
    assert!(header_len > 1_000_000, "{header_len}");
    let header = GgufHeader::parse(&file).unwrap();
    let tokens = header.get("tokenizer.ggml.tokens").unwrap().as_array().unwrap();
    assert_eq!((tokens.item_type, tokens.len), (GgufValueType::String, n_vocab as u64));
    assert_eq!(tokens.items.len() as u64, ARRAY_PREVIEW_ITEMS);
    assert_eq!(tokens.items[3], GgufValue::String("tok3".to_owned()));
    assert!(!tokens.is_complete());
    let scores = header.get("tokenizer.ggml.scores").unwrap().as_array().unwrap();
    assert_eq!(
        (scores.len, scores.items[1].clone()),
        (n_vocab as u64, GgufValue::F32(-1.0))
    );
    assert_eq!(header.block_count(), Some(1));
    assert_eq!(header.alignment(), 64);
    assert_eq!(header.tensor_data_offset() % 64, 0);
    assert_eq!(header.tensors()[1].offset, (2 * 34 * 1000u64).next_multiple_of(64));
    assert_eq!(
        Quantization::from_gguf(&header).unwrap().method,
        QuantMethod::Gguf(GgufFileType::Q8_0)
    );
}

#[test]
fn growing_range_reads_converge_quickly() {
    let (file, header_len) = vocab_gguf(100_000).build();
    let whole = GgufHeader::parse(&file).unwrap();
    let mut read = 4096usize;
    let mut rounds = 0;
    let header = loop {
        rounds += 1;
        match GgufHeader::parse(&file[..read.min(file.len())]) {
            Ok(header) => break header,
            Err(GgufParse::NeedMore { at_least }) => {
                assert!(at_least as usize > read, "progress: {at_least} after {read}");
                assert!(
                    at_least as usize <= header_len,
                    "a lower bound: {at_least} > {header_len}"
                );
                read = (at_least as usize).max(read * 2);
            }
            Err(GgufParse::Invalid(error)) => panic!("{error}"),
        }
    };
    assert_eq!(header, whole);
    assert!(rounds <= 12, "{rounds} rounds");
    assert!(read < 2 * header_len + 4096);

    // The token array's length alone tells the caller to fetch at least 8 bytes a token.
    let at_least = need_more(GgufHeader::parse(&file[..400]));
    assert!(at_least > 100_000 * 8, "{at_least}");
}

#[test]
fn every_truncation_asks_for_more_and_never_misparses() {
    let (file, header_len) = small_gguf().build();
    let whole = GgufHeader::parse(&file).unwrap();
    for len in 0..header_len {
        let at_least = need_more(GgufHeader::parse(&file[..len]));
        assert!(
            (len as u64) < at_least && at_least <= header_len as u64,
            "prefix {len}: asked for {at_least}, header ends at {header_len}"
        );
    }
    // Padding and tensor data are never looked at.
    let data_offset = whole.tensor_data_offset() as usize;
    for len in (header_len..=data_offset + 1).chain([file.len() - 1, file.len()]) {
        assert_eq!(GgufHeader::parse(&file[..len]).unwrap(), whole, "prefix {len}");
    }
    let err = GgufHeader::parse_complete(&file[..100]).unwrap_err();
    assert!(matches!(err, Error::GgufTruncated { len: 100, .. }), "{err:?}");
    assert_eq!(GgufHeader::parse_complete(&file).unwrap(), whole);
}

/// The bytes of a header up to its counts, for hand-made hostile files.
fn gguf_start(version: u32, tensors: u64, pairs: u64) -> Vec<u8> {
    let mut out = b"GGUF".to_vec();
    out.extend(version.to_le_bytes());
    out.extend(tensors.to_le_bytes());
    out.extend(pairs.to_le_bytes());
    out
}

#[test]
fn hostile_lengths_are_refused_before_allocating() {
    let limit_of = |error: Error| match error {
        Error::GgufLimit { what, .. } => what,
        other => panic!("expected a limit, got {other:?}"),
    };
    // An array of 2^64 - 1 bytes, and of 2^40 strings.
    for (item_type, len) in [(0u32, u64::MAX), (8, 1 << 40), (9, 1 << 40)] {
        let mut bytes = gguf_start(3, 0, 1);
        write_str(&mut bytes, b"k");
        bytes.extend(9u32.to_le_bytes());
        bytes.extend(item_type.to_le_bytes());
        bytes.extend(len.to_le_bytes());
        assert_eq!(limit_of(invalid(&bytes)), "header bytes");
    }
    // A plausible length beyond the prefix: an honest request, not an allocation.
    let mut bytes = gguf_start(3, 0, 1);
    write_str(&mut bytes, b"k");
    bytes.extend(9u32.to_le_bytes());
    bytes.extend(0u32.to_le_bytes());
    bytes.extend(10_000_000u64.to_le_bytes());
    assert_eq!(need_more(GgufHeader::parse(&bytes)), bytes.len() as u64 + 10_000_000);

    // A key of 2^64 - 1 bytes.
    let mut bytes = gguf_start(3, 0, 1);
    bytes.extend(u64::MAX.to_le_bytes());
    bytes.extend([0; 8]);
    assert_eq!(limit_of(invalid(&bytes)), "header bytes");
    assert_eq!(limit_of(invalid(&gguf_start(3, u64::MAX, 0))), "tensors");
    assert_eq!(limit_of(invalid(&gguf_start(3, 0, 1 << 40))), "metadata pairs");
    // Counts that fit the limits but not the prefix ask for at least 24 bytes a tensor.
    assert_eq!(need_more(GgufHeader::parse(&gguf_start(3, 1000, 0))), 24 + 24_000);

    // Arrays nested five deep.
    let mut deep = V::Array(0, vec![V::U8(1)]);
    for _ in 0..4 {
        deep = V::Array(9, vec![deep]);
    }
    let (file, _) = Gguf::new().kv("deep", deep).build();
    assert_eq!(limit_of(invalid(&file)), "array nesting depth");
    // ... also where they are skipped rather than kept.
    let mut deep = V::Array(0, vec![V::U8(1)]);
    for _ in 0..4 {
        deep = V::Array(9, vec![V::Array(0, vec![]); 2000].into_iter().chain([deep]).collect());
    }
    let (file, _) = Gguf::new().kv("deep", deep).build();
    assert_eq!(limit_of(invalid(&file)), "array nesting depth");

    let (file, _) = Gguf::new().tensor("t", &[1, 1, 1, 1, 1], GgmlType::F32).build();
    assert_eq!(limit_of(invalid(&file)), "tensor dimensions");
    let (file, _) = Gguf::new().tensor("t", &[u64::MAX], GgmlType::I8).build();
    assert_eq!(limit_of(invalid(&file)), "tensor dimension");
    let (file, _) = Gguf::new().tensor(&"n".repeat(64), &[1], GgmlType::F32).build();
    assert_eq!(limit_of(invalid(&file)), "tensor name bytes");
    let (file, _) = Gguf::new().tensor(&"n".repeat(63), &[1], GgmlType::F32).build();
    assert!(GgufHeader::parse(&file).is_ok());
    let (file, _) = Gguf::new()
        .tensor("t", &[1 << 31, 1 << 31, 1 << 2], GgmlType::I8)
        .build();
    assert!(matches!(invalid(&file), Error::GgufTensor { .. }));
}

#[test]
fn malformed_gguf_headers_are_clear_errors() {
    let err = invalid(b"\x7fELF\x02\x01");
    assert_eq!(
        err.to_string(),
        "not a GGUF file: it starts with \"\\x7fELF\" instead of \"GGUF\""
    );
    assert_eq!(
        invalid(&gguf_start(1, 0, 0)).to_string(),
        "GGUF version 1 is not supported; help: GGUF v1 is obsolete; re-convert the model with a current llama.cpp"
    );
    assert_eq!(
        invalid(&gguf_start(3u32.swap_bytes(), 0, 0)).to_string(),
        "GGUF version 50331648 is not supported; help: this is a big-endian GGUF file, which Skein does not read"
    );
    assert_eq!(
        invalid(&gguf_start(4, 0, 0)).to_string(),
        "GGUF version 4 is not supported (only versions 2 and 3)"
    );

    let mut bytes = gguf_start(3, 0, 1);
    write_str(&mut bytes, b"general.weird");
    bytes.extend(13u32.to_le_bytes());
    assert_eq!(
        invalid(&bytes).to_string(),
        "GGUF metadata `general.weird` has value type 13, which GGUF does not define"
    );
    let mut bytes = gguf_start(3, 0, 1);
    write_str(&mut bytes, b"bad\xffkey");
    assert!(matches!(invalid(&bytes), Error::GgufUtf8 { offset: 24 }));

    let (file, _) = Gguf::new().kv("a", V::U8(1)).kv("a", V::U8(2)).build();
    assert!(matches!(invalid(&file), Error::GgufDuplicateKey { key } if key == "a"));
    let (file, _) = Gguf::new()
        .tensor("t", &[1], GgmlType::F32)
        .tensor("t", &[1], GgmlType::F32)
        .build();
    assert!(matches!(invalid(&file), Error::GgufDuplicateTensor { name } if name == "t"));
    let (file, _) = Gguf::new().kv("general.alignment", V::U32(48)).build();
    assert_eq!(
        invalid(&file).to_string(),
        "GGUF `general.alignment` must be a power of two (a u32), but is u32 48"
    );

    // Tensor types and shapes keep their typed cause.
    let tensor_cause = |file: &[u8]| match invalid(file) {
        Error::GgufTensor { source, .. } => *source,
        other => panic!("expected a tensor error, got {other:?}"),
    };
    let mut unknown = small_gguf();
    unknown.tensors[0].2 = 1000;
    assert!(matches!(
        tensor_cause(&unknown.build().0),
        Error::UnknownGgmlType { id: 1000 }
    ));
    let mut removed = small_gguf();
    removed.tensors[0].2 = 31;
    assert!(matches!(
        tensor_cause(&removed.build().0),
        Error::RemovedGgmlType { id: 31, .. }
    ));
    let (file, _) = Gguf::new().tensor("t", &[100, 2], GgmlType::Q4_K).build();
    let err = invalid(&file);
    assert_eq!(err.to_string(), "invalid GGUF tensor `t`");
    assert_eq!(
        err.source().unwrap().to_string(),
        "a Q4_K row of 100 elements is not a whole number of 256-element blocks"
    );

    // Offsets must tile the data section in order.
    let (mut file, _) = Gguf::new()
        .tensor("a", &[8], GgmlType::F32)
        .tensor("b", &[8], GgmlType::F32)
        .build();
    let b_offset_at = file.windows(1).position(|w| w == b"b").unwrap() + 1 + 4 + 8 + 4;
    file[b_offset_at..b_offset_at + 8].copy_from_slice(&64u64.to_le_bytes());
    assert_eq!(
        invalid(&file).to_string(),
        "GGUF tensor `b` has offset 64, but the previous tensors end at 32"
    );
}

#[test]
fn gguf_headers_serialize_for_json_output() {
    let (file, _) = small_gguf().build();
    let header = GgufHeader::parse(&file).unwrap();
    let json = serde_json::to_value(&header).unwrap();
    assert_eq!(json["metadata"]["general.architecture"], "llama");
    assert_eq!(json["metadata"]["llama.feed_forward_length"]["len"], 2);
    assert_eq!(json["tensors"][0]["ggml_type"], "Q4_K");
    assert_eq!(json["by_type"]["Q6_K"]["tensors"], 1);
}

// ---------------------------------------------------------------------------------------
// Snapshot of what `skein models inspect` will show from headers
// ---------------------------------------------------------------------------------------

#[test]
fn parsed_header_summaries() {
    let (file, _) = small_gguf().build();
    let gguf = GgufHeader::parse(&file).unwrap();
    let metadata: Vec<String> = gguf.metadata().iter().map(|(k, v)| format!("{k} = {v}")).collect();
    let tensors: Vec<String> = gguf
        .tensors()
        .iter()
        .map(|t| {
            format!(
                "{} {} {:?} @{} {} B",
                t.name,
                t.ggml_type,
                t.dims,
                t.offset,
                t.bytes.get()
            )
        })
        .collect();
    let by_type: Vec<String> = gguf
        .by_type()
        .iter()
        .map(|(t, totals)| {
            format!(
                "{t}: {} tensors, {} params, {} B",
                totals.tensors,
                totals.params,
                totals.bytes.get()
            )
        })
        .collect();
    let gguf_summary = json!({
        "version": gguf.version(),
        "architecture": gguf.architecture(),
        "layers": gguf.block_count(),
        "context": gguf.context_length(),
        "hidden": gguf.embedding_length(),
        "heads": gguf.head_count(),
        "kv_heads": gguf.head_count_kv(),
        "alignment": gguf.alignment(),
        "header_len": gguf.header_len(),
        "tensor_data_offset": gguf.tensor_data_offset(),
        "data_len": gguf.data_len().get(),
        "params": gguf.totals().params,
        "bytes": gguf.totals().bytes.get(),
        "quantization": Quantization::from_gguf(&gguf).unwrap().to_string(),
        "metadata": metadata,
        "tensors": tensors,
        "by_type": by_type,
    });

    let (_, st) = parse_safetensors(&safetensors_file(&gptq_tensors(), &[("format", "pt")])).unwrap();
    let st_tensors: Vec<String> = st
        .tensors()
        .iter()
        .map(|t| format!("{} {} {:?} {:?}", t.name, t.dtype, t.shape, t.data_offsets))
        .collect();
    let st_summary = json!({
        "tensors": st_tensors,
        "totals": st.totals(),
        "by_dtype": st.by_dtype(),
        "logical_params_4bit": st.logical_params(4).unwrap(),
        "metadata": st.metadata(),
        "quantization": Quantization::from_safetensors(st.tensors()).unwrap(),
    });
    // Keys sorted whether or not serde_json keeps insertion order (llguidance turns
    // on `preserve_order` in workspace builds).
    insta::with_settings!({ sort_maps => true }, { insta::assert_yaml_snapshot!("gguf_summary", gguf_summary); });
    // Keys sorted whether or not serde_json keeps insertion order (llguidance turns
    // on `preserve_order` in workspace builds).
    insta::with_settings!({ sort_maps => true }, { insta::assert_yaml_snapshot!("safetensors_summary", st_summary); });
}

// ---------------------------------------------------------------------------------------
// Arbitrary bytes
// ---------------------------------------------------------------------------------------

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..2048)) {
        let _ = GgufHeader::parse(&bytes);
        let _ = safetensors::header_len(&bytes);
        let _ = safetensors::parse_header(&bytes);
        let _ = ShardIndex::parse(&bytes);
    }

    #[test]
    fn arbitrary_bytes_after_a_valid_start_never_panic(
        tensors in 0u64..4,
        pairs in 0u64..4,
        rest in prop::collection::vec(any::<u8>(), 0..1024),
    ) {
        let mut bytes = gguf_start(3, tensors, pairs);
        bytes.extend(rest);
        if let Err(GgufParse::NeedMore { at_least }) = GgufHeader::parse(&bytes) {
            prop_assert!(at_least > bytes.len() as u64);
            prop_assert!(at_least <= MAX_HEADER_BYTES);
        }
    }

    #[test]
    fn corrupted_gguf_files_never_panic(
        flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
        cut in any::<prop::sample::Index>(),
    ) {
        let (mut file, _) = small_gguf().build();
        for (at, byte) in flips {
            let at = at.index(file.len());
            file[at] = byte;
        }
        let len = cut.index(file.len() + 1);
        match GgufHeader::parse(&file[..len]) {
            Ok(header) => prop_assert!(header.header_len() <= len as u64),
            Err(GgufParse::NeedMore { at_least }) => prop_assert!(at_least > len as u64),
            Err(GgufParse::Invalid(_)) => {}
        }
    }

    #[test]
    fn corrupted_safetensors_headers_never_panic(
        flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
    ) {
        let file = small_safetensors();
        let len = safetensors::header_len(&file).unwrap() as usize;
        let mut header = file[LEN_PREFIX_BYTES..LEN_PREFIX_BYTES + len].to_vec();
        for (at, byte) in flips {
            let at = at.index(header.len());
            header[at] = byte;
        }
        if let Ok(parsed) = safetensors::parse_header(&header) {
            // Whatever parses is internally consistent.
            let sum: u64 = parsed.tensors().iter().map(|t| t.bytes().get()).sum();
            prop_assert_eq!(sum, parsed.totals().bytes.get());
        }
    }
}
