//! How a model is laid out over GPUs: tensor parallelism within a group of GPUs,
//! pipeline stages of whole layers across groups, and which tensor-parallel degrees a
//! model allows.

use std::fmt;
use std::ops::Range;

use serde::Serialize;

use super::ModelShape;
use crate::quant::{QuantMethod, Quantization};
use crate::{Bytes, Error};

/// How the decoder layers are divided into pipeline stages.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "split", content = "of", rename_all = "snake_case")]
pub enum Stages {
    /// One stage: every layer on every GPU of the tensor-parallel group.
    One,
    /// One stage per entry, with layers in proportion to the entries (`[3, 2]` puts
    /// 60 % of the layers on the first stage).
    Ratios(Vec<u32>),
    /// One stage per entry, the entry being the usable memory of each GPU of that
    /// stage; layers go in proportion to what is left after each stage's fixed costs
    /// (embeddings and vision tower on the first, output on the last, overhead on all).
    Memory(Vec<Bytes>),
}

impl Stages {
    /// Number of stages.
    pub fn count(&self) -> usize {
        match self {
            Stages::One => 1,
            Stages::Ratios(r) => r.len(),
            Stages::Memory(m) => m.len(),
        }
    }
}

/// Tensor parallelism inside each pipeline stage, stages across groups.
///
/// GPUs are numbered stage by stage: stage 0's ranks first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Layout {
    /// GPUs per stage, each holding a 1/k shard of the stage's layers.
    pub tensor_parallel: u64,
    /// The pipeline stages.
    pub stages: Stages,
}

impl Layout {
    /// One device holding the whole model.
    pub fn single() -> Layout {
        Layout {
            tensor_parallel: 1,
            stages: Stages::One,
        }
    }

    /// Tensor parallelism of degree `k` over one stage.
    pub fn tensor_parallel(k: u64) -> Layout {
        Layout {
            tensor_parallel: k,
            stages: Stages::One,
        }
    }

    /// Pipeline stages of one GPU each, layers in proportion to `ratios`.
    pub fn pipeline(ratios: Vec<u32>) -> Layout {
        Layout {
            tensor_parallel: 1,
            stages: Stages::Ratios(ratios),
        }
    }

    /// Pipeline stages of one GPU each, layers in proportion to what each GPU's usable
    /// memory leaves for layers.
    pub fn pipeline_by_memory(usable: Vec<Bytes>) -> Layout {
        Layout {
            tensor_parallel: 1,
            stages: Stages::Memory(usable),
        }
    }

    /// GPUs the layout uses.
    pub fn devices(&self) -> u64 {
        self.tensor_parallel.saturating_mul(self.stages.count() as u64)
    }
}

impl fmt::Display for Layout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TP {} × PP {}", self.tensor_parallel, self.stages.count())
    }
}

/// Why a tensor-parallel degree is not possible for a model (as vLLM checks it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(tag = "reason", rename_all = "snake_case")]
pub enum TpInvalid {
    /// A degree of zero.
    Zero,
    /// The attention heads do not divide evenly among the ranks.
    AttentionHeads {
        /// Query heads.
        heads: u64,
    },
    /// The KV heads neither divide among the ranks nor can be replicated to them (the
    /// degree is not a multiple of the KV heads).
    KvHeads {
        /// Key/value heads.
        kv_heads: u64,
    },
    /// The MLP width does not divide evenly.
    Intermediate {
        /// MLP width.
        intermediate: u64,
    },
    /// A row-parallel matrix's input slice per rank is not a whole number of
    /// quantization groups (vLLM: "the input size is not aligned with the quantized
    /// weight shape").
    QuantGroups {
        /// The matrix (`down_proj` or `o_proj`).
        matrix: &'static str,
        /// Input width per rank.
        per_rank: u64,
        /// The quantization group size.
        group: u64,
    },
    /// The vision tower's heads do not divide evenly.
    VisionHeads {
        /// Vision attention heads.
        heads: u64,
    },
}

impl fmt::Display for TpInvalid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            TpInvalid::Zero => f.write_str("the degree must be at least 1"),
            TpInvalid::AttentionHeads { heads } => write!(f, "{heads} attention heads do not divide evenly"),
            TpInvalid::KvHeads { kv_heads } => write!(
                f,
                "{kv_heads} KV heads neither divide evenly nor replicate (the degree is not a multiple of them)"
            ),
            TpInvalid::Intermediate { intermediate } => {
                write!(f, "the MLP width {intermediate} does not divide evenly")
            }
            TpInvalid::QuantGroups {
                matrix,
                per_rank,
                group,
            } => write!(
                f,
                "{matrix} would get {per_rank} input channels per GPU, not a whole number of {group}-wide quantization groups"
            ),
            TpInvalid::VisionHeads { heads } => write!(f, "{heads} vision-tower heads do not divide evenly"),
        }
    }
}

/// One candidate tensor-parallel degree and whether the model allows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct TpDegree {
    /// The degree.
    pub degree: u64,
    /// Why it is not possible; `None` when it is.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub invalid: Option<TpInvalid>,
}

impl TpDegree {
    /// Whether the degree is possible.
    pub fn is_valid(&self) -> bool {
        self.invalid.is_none()
    }
}

/// Every degree from 1 to `max_degree`, each valid or with the reason it is not.
///
/// The rules are vLLM's: query heads and the MLP width divide by the degree; KV heads
/// divide by it, or it is a multiple of them and each rank keeps one replicated KV head;
/// vision heads divide by it; and for grouped quantization (GPTQ, AWQ, packed int) the
/// input slice of each row-parallel matrix is whole groups. The vocabulary never limits
/// the degree: it is padded.
pub fn tp_degrees(shape: &ModelShape, quantization: Option<&Quantization>, max_degree: u64) -> Vec<TpDegree> {
    (1..=max_degree)
        .map(|degree| TpDegree {
            degree,
            invalid: check_tp(shape, quantization, degree).err(),
        })
        .collect()
}

/// Whether the model allows tensor parallelism of `degree` (see [`tp_degrees`]).
pub fn check_tp(shape: &ModelShape, quantization: Option<&Quantization>, degree: u64) -> Result<(), TpInvalid> {
    let k = degree;
    if k == 0 {
        return Err(TpInvalid::Zero);
    }
    if !shape.heads.is_multiple_of(k) {
        return Err(TpInvalid::AttentionHeads { heads: shape.heads });
    }
    if !(shape.kv_heads.is_multiple_of(k) || k.is_multiple_of(shape.kv_heads)) {
        return Err(TpInvalid::KvHeads {
            kv_heads: shape.kv_heads,
        });
    }
    if !shape.intermediate.is_multiple_of(k) {
        return Err(TpInvalid::Intermediate {
            intermediate: shape.intermediate,
        });
    }
    if let Some(v) = shape.vision
        && !v.heads.is_multiple_of(k)
    {
        return Err(TpInvalid::VisionHeads { heads: v.heads });
    }
    let grouped =
        quantization.filter(|q| matches!(q.method, QuantMethod::Gptq | QuantMethod::Awq | QuantMethod::PackedInt));
    if let Some(group) = grouped.and_then(|q| q.group_size).map(u64::from)
        && k > 1
    {
        for (matrix, width) in [("down_proj", shape.intermediate), ("o_proj", shape.q_width())] {
            let per_rank = width / k;
            if !per_rank.is_multiple_of(group) {
                return Err(TpInvalid::QuantGroups {
                    matrix,
                    per_rank,
                    group,
                });
            }
        }
    }
    Ok(())
}

/// `ceil(value / k)`: one rank's share of something sharded k ways.
pub(crate) fn shard(value: Bytes, k: u64) -> Bytes {
    Bytes::new(if k == 0 { value.get() } else { value.get().div_ceil(k) })
}

/// `value × numerator / denominator`, rounded up.
pub(crate) fn scale(value: Bytes, numerator: u64, denominator: u64) -> Result<Bytes, Error> {
    if denominator == 0 {
        return Ok(value);
    }
    let scaled = (u128::from(value.get()) * u128::from(numerator)).div_ceil(u128::from(denominator));
    u64::try_from(scaled)
        .map(Bytes::new)
        .map_err(|_| Error::EstimateOverflow { what: "scaled bytes" })
}

/// KV heads one rank caches: its share, or one replicated head when there are more
/// ranks than KV heads.
pub(crate) fn kv_heads_per_rank(kv_heads: u64, k: u64) -> u64 {
    kv_heads.div_ceil(k.max(1)).max(1)
}

/// Vocabulary rows of one rank's vocab-parallel embedding or output shard: the
/// vocabulary padded to `padding` rows, divided by `k` (rounded up).
pub(crate) fn vocab_rows_per_rank(vocab: u64, k: u64, padding: u64) -> u64 {
    vocab.next_multiple_of(padding.max(1)).div_ceil(k.max(1))
}

/// Assigns `layers` whole layers to stages in proportion to `parts`, keeping their
/// order: stage `s` ends at `round(layers × (parts[0] + … + parts[s]) / Σ parts)`.
///
/// llama.cpp reads `--tensor-split` differently (the output layer is one more slot):
/// [`super::llama_cpp_tensor_split`] gives the split that reproduces these ranges.
///
/// Errors: [`Error::InvalidEstimateRequest`] for no stages or all-zero parts,
/// [`Error::EmptyPipelineStage`] if a stage would get no layer.
pub fn assign_layers(layers: u64, parts: &[u64]) -> Result<Vec<Range<u64>>, Error> {
    let total: u128 = parts.iter().map(|&p| u128::from(p)).sum();
    if parts.is_empty() || total == 0 {
        return Err(Error::InvalidEstimateRequest {
            field: "layout.stages",
            found: format!("{parts:?}"),
            expected: "at least one stage with a positive share",
        });
    }
    let mut ranges = Vec::with_capacity(parts.len());
    let mut start = 0u64;
    let mut cumulative: u128 = 0;
    for (stage, &part) in parts.iter().enumerate() {
        cumulative += u128::from(part);
        // Rounded to nearest: (2·n·c + total) / (2·total). Never exceeds `layers`.
        let end = (2 * u128::from(layers) * cumulative + total) / (2 * total);
        let end = u64::try_from(end).unwrap_or(layers).min(layers);
        if end <= start {
            return Err(Error::EmptyPipelineStage { stage, layers });
        }
        ranges.push(start..end);
        start = end;
    }
    Ok(ranges)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layers_follow_the_ratios_in_order() {
        assert_eq!(assign_layers(62, &[3, 2]).unwrap(), vec![0..37, 37..62]);
        assert_eq!(
            assign_layers(32, &[1, 1, 1, 1]).unwrap(),
            vec![0..8, 8..16, 16..24, 24..32]
        );
        assert_eq!(assign_layers(10, &[1]).unwrap(), vec![0..10]);
        assert!(matches!(
            assign_layers(32, &[99, 1]),
            Err(Error::EmptyPipelineStage { stage: 1, .. })
        ));
        assert!(matches!(
            assign_layers(32, &[0, 0]),
            Err(Error::InvalidEstimateRequest { .. })
        ));
    }

    #[test]
    fn vocab_padding_and_kv_replication() {
        assert_eq!(vocab_rows_per_rank(32_000, 1, 64), 32_000);
        assert_eq!(vocab_rows_per_rank(32_001, 1, 64), 32_064);
        assert_eq!(vocab_rows_per_rank(128_256, 4, 64), 32_064);
        assert_eq!(kv_heads_per_rank(8, 2), 4);
        assert_eq!(kv_heads_per_rank(8, 8), 1);
        assert_eq!(kv_heads_per_rank(1, 8), 1);
        assert_eq!(kv_heads_per_rank(2, 4), 1);
    }
}
