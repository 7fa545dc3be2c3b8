//! The tensors of a LoRA adapter: its `lora_A`/`lora_B` pairs by module, their ranks
//! checked against each other and against the config, the decoder layers they adapt.
//!
//! Both formats store a module's pair as two matrices, `A` of shape `[r, in_features]`
//! and `B` of shape `[out_features, r]` (row-major), so that the update is `B·A`:
//!
//! - PEFT (`adapter_model.safetensors`): `<module>.lora_A.weight` and
//!   `<module>.lora_B.weight`, with module names prefixed `base_model.model.`; embedding
//!   layers use `<module>.lora_embedding_A` (`[r, vocab]`) and `lora_embedding_B`
//!   (`[hidden, r]`). DoRA adds `<module>.lora_magnitude_vector`, and `modules_to_save`
//!   whole copies of their modules' weights.
//! - llama.cpp (`convert_lora_to_gguf.py`): `<base tensor>.lora_a` and `.lora_b`
//!   (`blk.0.attn_q.weight.lora_a`), GGUF dimensions `[in, r]` and `[r, out]`, which
//!   are the same matrices read in row-major order.

use crate::adapter::AdapterError;
use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use super::config::ExpectedRank;
use crate::dtype::TensorDtype;
use crate::{Bytes, Error};

/// One tensor of an adapter's weight file, whatever its format.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdapterTensor {
    /// The tensor's name in the file.
    pub name: String,
    /// Row-major shape (a GGUF tensor's dimensions reversed).
    pub shape: Vec<u64>,
    /// Storage type.
    pub dtype: TensorDtype,
    /// Number of elements.
    pub elements: u64,
    /// Bytes in the file.
    pub bytes: Bytes,
}

/// One module (a linear or embedding layer of the base model) that carries a LoRA pair.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LoraModule {
    /// The module's name, without PEFT's `base_model.model.` prefix
    /// (`model.layers.0.self_attn.q_proj`, `blk.0.attn_q`).
    pub name: String,
    /// The module's last name part (`q_proj`, `attn_q`): what `target_modules` lists.
    pub kind: String,
    /// The decoder layer, when the name has one (`layers.N`, `h.N`, `blk.N`).
    pub layer: Option<u64>,
    /// The rank `r` of its pair.
    pub rank: u64,
    /// `in_features`: the width of `A`'s rows.
    pub in_features: u64,
    /// `out_features`: the height of `B`.
    pub out_features: u64,
}

/// Where an adapter's LoRA matrices are and how large.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LoraLayout {
    /// Every adapted module, in layer then name order (modules outside layers first).
    pub modules: Vec<LoraModule>,
    /// The decoder layers with at least one adapted module, ascending.
    pub layers: Vec<u64>,
    /// The module kinds adapted (`o_proj`, `q_proj`, …), sorted.
    pub kinds: Vec<String>,
    /// The distinct ranks, ascending: one unless `rank_pattern` gives some modules
    /// another rank.
    pub ranks: Vec<u64>,
    /// Elements of all `A` and `B` matrices.
    pub lora_elements: u64,
    /// Tensors that are not LoRA matrices, sorted: DoRA magnitude vectors, trained
    /// biases, `modules_to_save` copies, layer norms some tools add. They are loaded
    /// with the adapter and count in its size.
    pub other_tensors: Vec<String>,
}

impl LoraLayout {
    /// The largest rank: what an engine's slots must hold (vLLM's `--max-lora-rank`).
    pub fn max_rank(&self) -> u64 {
        self.ranks.last().copied().unwrap_or(0)
    }
}

/// The two matrices of a LoRA pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    A,
    B,
}

/// A tensor's role, from its name.
fn role(name: &str) -> Option<(&str, Side, &'static str)> {
    const SUFFIXES: [(&str, Side, &str); 6] = [
        (".lora_A.weight", Side::A, "lora_B.weight"),
        (".lora_B.weight", Side::B, "lora_A.weight"),
        (".lora_embedding_A", Side::A, "lora_embedding_B"),
        (".lora_embedding_B", Side::B, "lora_embedding_A"),
        (".lora_a", Side::A, "lora_b"),
        (".lora_b", Side::B, "lora_a"),
    ];
    SUFFIXES
        .iter()
        .find_map(|&(suffix, side, partner)| name.strip_suffix(suffix).map(|module| (module, side, partner)))
}

/// PEFT saves module names under the wrapper's `base_model.model.`.
const PEFT_PREFIX: &str = "base_model.model.";

/// Name parts that precede a decoder layer's index in the formats' module names.
const LAYER_CONTAINERS: [&str; 6] = ["layers", "h", "blk", "layer", "blocks", "block"];

fn layer_of(module: &str) -> Option<u64> {
    let parts: Vec<&str> = module.split('.').collect();
    parts
        .windows(2)
        .find(|pair| {
            LAYER_CONTAINERS.contains(&pair[0]) && !pair[1].is_empty() && pair[1].bytes().all(|b| b.is_ascii_digit())
        })
        .and_then(|pair| pair[1].parse().ok())
}

/// The module's last name part: `q_proj` of `model.layers.0.self_attn.q_proj`, `attn_q`
/// of `blk.0.attn_q.weight`.
fn kind_of(module: &str) -> String {
    let base = module.strip_suffix(".weight").unwrap_or(module);
    base.rsplit('.').next().unwrap_or(base).to_owned()
}

fn shape_error(tensor: &AdapterTensor, problem: String) -> Error {
    AdapterError::LoraTensorShape {
        tensor: tensor.name.clone(),
        shape: tensor.shape.clone(),
        problem,
    }
    .into()
}

/// Pairs the LoRA matrices of `tensors` by module and checks each pair: both are
/// matrices, `A` is `[r, in]` and `B` is `[out, r]` with the same `r` (not 0), and `r`
/// is what `expected(module)` says when it says something (the config's `r` or
/// `rank_pattern`; without a config, as for a bare GGUF adapter, nothing is expected
/// beyond the pair's agreement).
///
/// Errors: [`AdapterError::LoraTensorShape`] naming the first tensor whose shape is wrong and
/// why; [`AdapterError::LoraTensorUnpaired`] for a matrix without its partner;
/// [`AdapterError::NoLoraTensors`] when there is no pair at all; [`Error::EstimateOverflow`]
/// if the element count overflows.
pub fn lora_layout<'a>(
    tensors: impl IntoIterator<Item = &'a AdapterTensor>,
    expected: &dyn Fn(&str) -> Option<ExpectedRank>,
) -> Result<LoraLayout, Error> {
    let mut pairs: BTreeMap<&str, [Option<&AdapterTensor>; 2]> = BTreeMap::new();
    let mut other_tensors = Vec::new();
    for tensor in tensors {
        match role(&tensor.name) {
            Some((module, side, _)) => {
                let slot = &mut pairs.entry(module).or_default()[side as usize];
                // Names are unique in both formats' headers, so a slot is filled once; a
                // second tensor for it would be a different suffix of the same module
                // (`lora_A.weight` and `lora_a`), which no writer produces.
                if slot.is_some() {
                    return Err(shape_error(
                        tensor,
                        "a second LoRA matrix for the same module; help: the file mixes PEFT and GGUF names".into(),
                    ));
                }
                *slot = Some(tensor);
            }
            None => other_tensors.push(tensor.name.clone()),
        }
    }
    if pairs.is_empty() {
        return Err(AdapterError::NoLoraTensors.into());
    }

    let mut modules = Vec::with_capacity(pairs.len());
    let mut lora_elements: u64 = 0;
    for (module, [a, b]) in pairs {
        let (a, b) = match (a, b) {
            (Some(a), Some(b)) => (a, b),
            (Some(present), None) | (None, Some(present)) => {
                let missing = role(&present.name).map_or("partner", |(_, _, partner)| partner);
                return Err(AdapterError::LoraTensorUnpaired {
                    module: module.to_owned(),
                    present: present.name.clone(),
                    missing,
                }
                .into());
            }
            // INVARIANT: an entry is created with one of its slots filled.
            (None, None) => continue,
        };
        let &[rank, in_features] = a.shape.as_slice() else {
            return Err(shape_error(
                a,
                format!(
                    "lora_A must be a matrix [r, in_features], but has {} dimensions",
                    a.shape.len()
                ),
            ));
        };
        let &[out_features, b_rank] = b.shape.as_slice() else {
            return Err(shape_error(
                b,
                format!(
                    "lora_B must be a matrix [out_features, r], but has {} dimensions",
                    b.shape.len()
                ),
            ));
        };
        if rank == 0 {
            return Err(shape_error(a, "its rank (the first dimension of lora_A) is 0".into()));
        }
        if in_features == 0 || out_features == 0 {
            return Err(shape_error(
                if in_features == 0 { a } else { b },
                "a LoRA matrix of an empty layer; the adapter is corrupt".into(),
            ));
        }
        if b_rank != rank {
            return Err(shape_error(
                b,
                format!(
                    "its rank {b_rank} (lora_B is [out_features, r]) differs from the rank {rank} of `{}` \
                     (lora_A is [r, in_features]); help: the file is corrupt, or lora_A and lora_B were swapped \
                     or transposed by the tool that wrote it",
                    a.name
                ),
            ));
        }
        let display = module.strip_prefix(PEFT_PREFIX).unwrap_or(module);
        match expected(module) {
            Some(ExpectedRank::Exactly { rank: want, pattern }) if want != rank => {
                let source = match pattern {
                    Some(key) => format!("rank_pattern[`{key}`] = {want}"),
                    None => format!("r = {want}"),
                };
                return Err(shape_error(
                    a,
                    format!(
                        "its rank {rank} (lora_A is [r, in_features]) differs from {source} in \
                         adapter_config.json; help: the config and the weights disagree: save the adapter again \
                         with PEFT, or fix `r`/`rank_pattern`"
                    ),
                ));
            }
            Some(ExpectedRank::OneOf(ranks)) if !ranks.contains(&rank) => {
                return Err(shape_error(
                    a,
                    format!(
                        "its rank {rank} is none of the ranks adapter_config.json names ({ranks:?} from `r` and \
                         `rank_pattern`); help: the config and the weights disagree"
                    ),
                ));
            }
            _ => {}
        }
        lora_elements = lora_elements
            .checked_add(a.elements)
            .and_then(|sum| sum.checked_add(b.elements))
            .ok_or(Error::EstimateOverflow { what: "LoRA elements" })?;
        modules.push(LoraModule {
            name: display.to_owned(),
            kind: kind_of(display),
            layer: layer_of(display),
            rank,
            in_features,
            out_features,
        });
    }
    modules.sort_by(|x, y| (x.layer, &x.name).cmp(&(y.layer, &y.name)));
    other_tensors.sort();
    let layers: BTreeSet<u64> = modules.iter().filter_map(|m| m.layer).collect();
    let kinds: BTreeSet<&str> = modules.iter().map(|m| m.kind.as_str()).collect();
    let ranks: BTreeSet<u64> = modules.iter().map(|m| m.rank).collect();
    Ok(LoraLayout {
        layers: layers.into_iter().collect(),
        kinds: kinds.into_iter().map(str::to_owned).collect(),
        ranks: ranks.into_iter().collect(),
        modules,
        lora_elements,
        other_tensors,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::SafetensorsDtype;

    fn tensor(name: &str, shape: &[u64]) -> AdapterTensor {
        let elements = shape.iter().product();
        AdapterTensor {
            name: name.to_owned(),
            shape: shape.to_vec(),
            dtype: SafetensorsDtype::F16.into(),
            elements,
            bytes: Bytes::new(elements * 2),
        }
    }

    fn pair(module: &str, rank: u64, inp: u64, out: u64) -> [AdapterTensor; 2] {
        [
            tensor(&format!("{module}.lora_A.weight"), &[rank, inp]),
            tensor(&format!("{module}.lora_B.weight"), &[out, rank]),
        ]
    }

    fn none(_: &str) -> Option<ExpectedRank> {
        None
    }

    #[test]
    fn pairs_are_grouped_by_module_and_layer() {
        let mut tensors = Vec::new();
        for layer in [1, 0] {
            let m = format!("base_model.model.model.layers.{layer}.self_attn");
            tensors.extend(pair(&format!("{m}.q_proj"), 16, 4096, 4096));
            tensors.extend(pair(&format!("{m}.v_proj"), 16, 4096, 1024));
        }
        tensors.push(tensor("base_model.model.lm_head.weight", &[32, 4096]));
        let layout = lora_layout(&tensors, &none).unwrap();
        assert_eq!(layout.layers, [0, 1]);
        assert_eq!(layout.kinds, ["q_proj", "v_proj"]);
        assert_eq!(layout.ranks, [16]);
        assert_eq!(layout.max_rank(), 16);
        assert_eq!(layout.modules[0].name, "model.layers.0.self_attn.q_proj");
        assert_eq!(layout.modules[1].out_features, 1024);
        // q: 16 × (4096 + 4096), v: 16 × (4096 + 1024), two layers.
        assert_eq!(layout.lora_elements, 2 * (16 * 8192 + 16 * 5120));
        assert_eq!(layout.other_tensors, ["base_model.model.lm_head.weight"]);
    }

    #[test]
    fn gguf_names_and_embedding_pairs_are_read() {
        let tensors = [
            tensor("blk.3.attn_q.weight.lora_a", &[8, 4096]),
            tensor("blk.3.attn_q.weight.lora_b", &[4096, 8]),
            tensor("base_model.model.model.embed_tokens.lora_embedding_A", &[8, 32000]),
            tensor("base_model.model.model.embed_tokens.lora_embedding_B", &[4096, 8]),
        ];
        let layout = lora_layout(&tensors, &none).unwrap();
        assert_eq!(layout.kinds, ["attn_q", "embed_tokens"]);
        assert_eq!(layout.modules[0].layer, None);
        assert_eq!(layout.modules[1].layer, Some(3));
        assert_eq!(layout.modules[1].name, "blk.3.attn_q.weight");
    }

    #[test]
    fn bad_shapes_are_named() {
        let q = "base_model.model.model.layers.0.self_attn.q_proj";
        let check = |tensors: &[AdapterTensor], expected: &dyn Fn(&str) -> Option<ExpectedRank>| {
            lora_layout(tensors, expected).unwrap_err().to_string()
        };
        let err = check(
            &[
                tensor(&format!("{q}.lora_A.weight"), &[16, 4096]),
                tensor(&format!("{q}.lora_B.weight"), &[4096, 8]),
            ],
            &none,
        );
        assert!(
            err.contains("q_proj.lora_B.weight` has shape [4096, 8]: its rank 8"),
            "{err}"
        );
        let err = check(
            &[
                tensor(&format!("{q}.lora_A.weight"), &[16, 4096, 1]),
                tensor(&format!("{q}.lora_B.weight"), &[4096, 16]),
            ],
            &none,
        );
        assert!(err.contains("lora_A must be a matrix"), "{err}");
        let err = check(
            &[
                tensor(&format!("{q}.lora_A.weight"), &[0, 4096]),
                tensor(&format!("{q}.lora_B.weight"), &[4096, 0]),
            ],
            &none,
        );
        assert!(err.contains("is 0"), "{err}");
        let err = check(&pair(q, 16, 4096, 4096), &|_| {
            Some(ExpectedRank::Exactly { rank: 8, pattern: None })
        });
        assert!(
            err.contains("q_proj.lora_A.weight` has shape [16, 4096]: its rank 16"),
            "{err}"
        );
        assert!(err.contains("r = 8 in adapter_config.json"), "{err}");
        let err = check(&pair(q, 16, 4096, 4096), &|_| Some(ExpectedRank::OneOf(vec![4, 8])));
        assert!(err.contains("none of the ranks"), "{err}");

        let err = lora_layout(&[tensor(&format!("{q}.lora_A.weight"), &[16, 4096])], &none).unwrap_err();
        assert!(
            matches!(
                &err,
                Error::Adapter(AdapterError::LoraTensorUnpaired {
                    missing: "lora_B.weight",
                    ..
                })
            ),
            "{err}"
        );
        let err = lora_layout(&[tensor("model.norm.weight", &[4096])], &none).unwrap_err();
        assert!(matches!(err, Error::Adapter(AdapterError::NoLoraTensors)));
    }
}
