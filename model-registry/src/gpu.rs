//! GPUs by name: the catalog behind `--gpu A100-80GB` and GPU sets such as
//! `RTX4090-24GB:2` or `A100-80GB+RTX4090-24GB`.
//!
//! A plan made before the fleet reports in (`skein models fit`) needs each GPU's usable
//! memory; the catalog (`skein-gpu-catalog`, shared with the agent's simulated fleets)
//! gives the total that `nvidia-smi` reports for each model on current drivers, which
//! is what a live agent would report for an idle card. A GPU not in the catalog can be
//! given by its memory (`48GiB`). Pure: no IO.

use std::fmt;
use std::str::FromStr;

use serde::Serialize;

use crate::{Bytes, Error};

pub use skein_gpu_catalog::{CARDS, CardModel, lookup};

/// Most GPUs one set may name: more than any node or pipeline Skein plans for.
pub const MAX_GPUS_PER_SET: u32 = 64;

/// One GPU of a set.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Gpu {
    /// Its catalog name, or its memory for a GPU given by size.
    pub name: String,
    /// Usable memory.
    pub memory: Bytes,
    /// Compute capability, when known.
    pub compute_capability: Option<(u32, u32)>,
}

impl Gpu {
    /// A catalog GPU by name (see [`lookup`]).
    ///
    /// Errors: [`Error::UnknownGpu`] with the closest names.
    pub fn named(name: &str) -> Result<Gpu, Error> {
        if let Some(model) = lookup(name) {
            return Ok(Gpu::from(model));
        }
        if let Some(memory) = parse_memory(name) {
            return Ok(Gpu {
                name: memory.to_string().replace(' ', ""),
                memory,
                compute_capability: None,
            });
        }
        Err(Error::UnknownGpu {
            found: name.to_owned(),
            suggestions: skein_gpu_catalog::suggestions(name)
                .into_iter()
                .map(str::to_owned)
                .collect(),
            known: skein_gpu_catalog::names(),
        })
    }
}

impl From<&CardModel> for Gpu {
    fn from(model: &CardModel) -> Gpu {
        Gpu {
            name: model.name.to_owned(),
            memory: Bytes::new(model.memory_bytes()),
            compute_capability: Some(model.compute_capability),
        }
    }
}

/// A memory size with a unit (`48GiB`, `24 GB`, `16160MiB`), read as everywhere in
/// Skein ([`skein_text::parse_size`]); `None` without a unit or for zero.
fn parse_memory(text: &str) -> Option<Bytes> {
    skein_text::parse_size(text).filter(|bytes| *bytes > 0).map(Bytes::new)
}

/// GPUs considered together for one model: one card, several of one kind, or a mix.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GpuSet {
    /// The set as written (`RTX4090-24GB:2`).
    pub label: String,
    /// Its GPUs, in the order written.
    pub gpus: Vec<Gpu>,
}

impl GpuSet {
    /// Usable memory of each GPU.
    pub fn memory(&self) -> Vec<Bytes> {
        self.gpus.iter().map(|g| g.memory).collect()
    }
}

impl FromStr for GpuSet {
    type Err = Error;

    /// `NAME[:COUNT]` parts joined by `+`: `A100-80GB`, `RTX4090-24GB:2`,
    /// `A100-80GB+RTX4090-24GB:2`, `48GiB:4`.
    fn from_str(spec: &str) -> Result<GpuSet, Error> {
        let invalid = |reason: String| Error::InvalidGpuSet {
            spec: spec.to_owned(),
            reason,
        };
        let mut gpus = Vec::new();
        for part in spec.split('+') {
            let part = part.trim();
            if part.is_empty() {
                return Err(invalid("a `+` with no GPU on one side".to_owned()));
            }
            let (name, count) = match part.rsplit_once(':') {
                Some((name, count)) => {
                    let count: u32 = count
                        .trim()
                        .parse()
                        .map_err(|_| invalid(format!("`{count}` after `:` is not a GPU count")))?;
                    (name.trim(), count)
                }
                None => (part, 1),
            };
            if count == 0 {
                return Err(invalid(format!("`{part}` asks for zero GPUs")));
            }
            let gpu = Gpu::named(name)?;
            let total = gpus.len() as u64 + u64::from(count);
            if total > u64::from(MAX_GPUS_PER_SET) {
                return Err(invalid(format!("{total} GPUs; a set has at most {MAX_GPUS_PER_SET}")));
            }
            gpus.extend(std::iter::repeat_n(gpu, count as usize));
        }
        Ok(GpuSet {
            label: spec.trim().to_owned(),
            gpus,
        })
    }
}

impl fmt::Display for GpuSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(&self.label)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_resolve_loosely_and_unknown_names_suggest() {
        for name in ["A100-80GB", "a100 80gb", "NVIDIA A100-SXM4-80GB", "a100-sxm4-80gb"] {
            assert_eq!(lookup(name).map(|m| m.name), Some("A100-80GB"), "{name}");
        }
        for name in ["RTX4090", "NVIDIA GeForce RTX 4090", "4090", "rtx4090-24gb"] {
            assert_eq!(lookup(name).map(|m| m.name), Some("RTX4090-24GB"), "{name}");
        }
        assert_eq!(lookup("Tesla V100-PCIE-16GB").map(|m| m.name), Some("V100-16GB"));
        let err = Gpu::named("A100").unwrap_err();
        assert!(
            err.to_string().starts_with(
                "unknown GPU `A100` (did you mean one of `A10-24GB`, `A100-80GB`, `A100-40GB`, `H100-80GB`, `RTXA6000-48GB`?)"
            ),
            "{err}"
        );
        let err = Gpu::named("RTX4080").unwrap_err().to_string();
        assert!(err.contains("did you mean one of `RTX4090-24GB`"), "{err}");
    }

    #[test]
    fn sets_parse_counts_mixes_and_sizes() {
        let set: GpuSet = "RTX4090-24GB:2".parse().unwrap();
        assert_eq!(set.gpus.len(), 2);
        assert_eq!(set.memory(), vec![Bytes::new(24_564 << 20); 2]);
        let set: GpuSet = "A100-80GB + RTX4090-24GB".parse().unwrap();
        assert_eq!(
            set.gpus.iter().map(|g| g.name.as_str()).collect::<Vec<_>>(),
            ["A100-80GB", "RTX4090-24GB"]
        );
        let set: GpuSet = "48GiB:4".parse().unwrap();
        assert_eq!(set.gpus.len(), 4);
        assert_eq!(set.gpus[0].memory, Bytes::new(48 << 30));
        assert_eq!(set.gpus[0].compute_capability, None);
    }

    #[test]
    fn bad_sets_say_what_is_wrong() {
        let message = |spec: &str| spec.parse::<GpuSet>().unwrap_err().to_string();
        assert!(message("A100-80GB:0").contains("`A100-80GB:0` asks for zero GPUs"));
        assert!(message("A100-80GB:two").contains("`two` after `:` is not a GPU count"));
        assert!(message("A100-80GB+").contains("a `+` with no GPU on one side"));
        assert!(message("A100-80GB:65").contains("65 GPUs; a set has at most 64"));
        assert!(message("48").starts_with("unknown GPU `48`"));
    }
}
