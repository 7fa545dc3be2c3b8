//! Where each variant fits: for a variant and a set of GPUs, the smallest placement that
//! fits, with its estimate; variants ranked best first.
//!
//! The engine follows the format: the first engine Skein starts on GPUs that loads it
//! ([`Engine::for_gpus`]: vLLM for safetensors, llama.cpp for GGUF). The search takes the set's GPUs largest first and tries
//! 1, 2, … of them; for each count, the layouts the engine can run, most parallel
//! first: tensor parallelism over all of them (an engine with
//! [`Engine::tensor_parallel`], identical GPUs, a valid degree), then tensor-parallel
//! groups as pipeline stages, then one GPU per pipeline stage with layers split by each
//! GPU's memory ([`Engine::layer_split`]; uneven across different cards). The first layout that fits wins, so the answer uses as few GPUs as possible.
//! When nothing fits, the answer is the layout over the whole set that comes closest.

use serde::Serialize;

use super::ModelInfo;
use crate::estimate::{
    Engine, Estimate, EstimateRequest, FitReport, KvDtype, Layout, ModelShape, Stages, WeightGroups, check_tp,
    estimate, fits,
};
use crate::gpu::GpuSet;
use crate::{Bytes, WeightFormat};

/// The serving request a fit is checked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct FitOptions {
    /// Context tokens per sequence.
    pub context: u64,
    /// Sequences served at once.
    pub concurrency: u64,
    /// KV-cache type; [`KvDtype::Auto`] is the engine's default.
    pub kv_dtype: KvDtype,
}

/// A placement of a variant on some GPUs of a set, with its estimate.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Placement {
    /// The GPUs used, as positions in the set, in layout order (stage by stage).
    pub gpus: Vec<usize>,
    /// The estimate (engine, layout, per-device lines).
    pub estimate: Estimate,
    /// Each device against its usable memory.
    pub report: FitReport,
}

impl Placement {
    /// The layout.
    pub fn layout(&self) -> &Layout {
        &self.estimate.layout
    }

    /// The largest figure any device needs.
    pub fn max_need(&self) -> Bytes {
        self.estimate.max_device_total()
    }

    /// The largest shortfall of any device (zero when it fits).
    fn max_short(&self) -> Bytes {
        self.report.devices.iter().map(|d| d.short).max().unwrap_or(Bytes::ZERO)
    }
}

/// A variant on one GPU set.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SetFit {
    /// The set's label.
    pub set: String,
    /// Whether some placement fits.
    pub fits: bool,
    /// The fitting placement with the fewest GPUs, or the closest over the whole set;
    /// `None` when no layout could be estimated.
    pub placement: Option<Placement>,
    /// Why nothing could be estimated, when `placement` is `None`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// A variant on every set.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct VariantFit {
    /// Position of the variant in [`ModelInfo::variants`].
    pub variant: usize,
    /// Its id.
    pub id: String,
    /// One entry per set, in the order given.
    pub sets: Vec<SetFit>,
}

impl VariantFit {
    /// Whether it fits any set.
    pub fn fits_somewhere(&self) -> bool {
        self.sets.iter().any(|s| s.fits)
    }

    /// The set to pick for it: where it fits on the fewest GPUs, then with the most
    /// room left on its fullest GPU.
    pub fn best_set(&self) -> Option<&SetFit> {
        self.sets
            .iter()
            .filter(|s| s.fits)
            .filter_map(|s| s.placement.as_ref().map(|p| (s, p)))
            .min_by_key(|(_, p)| {
                let least_spare = p.report.devices.iter().map(|d| d.spare).min().unwrap_or(Bytes::ZERO);
                (p.gpus.len(), std::cmp::Reverse(least_spare))
            })
            .map(|(s, _)| s)
    }
}

/// The engine Skein starts for a format on GPUs ([`Engine::for_gpus`]); `None` when no
/// engine loads it.
pub fn engine_for(format: WeightFormat) -> Option<Engine> {
    Engine::for_gpus(format)
}

/// Every variant of `info` on every set, best first: variants that fit somewhere before
/// those that fit nowhere, then in the catalog's order (best precision first).
pub fn fit_all(info: &ModelInfo, sets: &[GpuSet], options: FitOptions) -> Vec<VariantFit> {
    let mut all: Vec<VariantFit> = info
        .variants
        .iter()
        .enumerate()
        .map(|(index, variant)| VariantFit {
            variant: index,
            id: variant.id.clone(),
            sets: sets
                .iter()
                .map(|set| fit_variant(&info.shape, &variant.weights, set, options))
                .collect(),
        })
        .collect();
    all.sort_by_key(|f| (!f.fits_somewhere(), f.variant));
    all
}

/// A variant with `weights` on `set`: the fitting placement with the fewest GPUs, or
/// the closest. The engine follows the weights' format ([`engine_for`]); weights of
/// unknown quantization are taken as safetensors.
pub fn fit_variant(shape: &ModelShape, weights: &WeightGroups, set: &GpuSet, options: FitOptions) -> SetFit {
    let format = weights.quantization.map_or(WeightFormat::Safetensors, |q| q.format);
    let Some(engine) = engine_for(format) else {
        return SetFit {
            set: set.label.clone(),
            fits: false,
            placement: None,
            reason: Some(format!("no engine Skein starts on GPUs loads {format} weights")),
        };
    };
    let mut order: Vec<usize> = (0..set.gpus.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(set.gpus[i].memory));
    let memory = |i: usize| set.gpus[i].memory;

    let mut closest: Option<Placement> = None;
    let mut last_error = None;
    for count in 1..=order.len() {
        let chosen = &order[..count];
        for layout in layouts(shape, weights, engine, chosen.iter().map(|&i| memory(i)).collect()) {
            let request = EstimateRequest::new(engine, options.context)
                .with_concurrency(options.concurrency)
                .with_kv_dtype(options.kv_dtype)
                .with_layout(layout);
            let usable: Vec<Bytes> = chosen.iter().map(|&i| memory(i)).collect();
            let outcome = estimate(shape, weights, &request)
                .and_then(|estimate| fits(&estimate, &usable).map(|report| (estimate, report)));
            let (estimate, report) = match outcome {
                Ok(pair) => pair,
                Err(error) => {
                    last_error = Some(error.to_string());
                    continue;
                }
            };
            let placement = Placement {
                gpus: chosen.to_vec(),
                estimate,
                report,
            };
            if placement.report.fits {
                return SetFit {
                    set: set.label.clone(),
                    fits: true,
                    placement: Some(placement),
                    reason: None,
                };
            }
            if count == order.len() && closest.as_ref().is_none_or(|c| placement.max_short() < c.max_short()) {
                closest = Some(placement);
            }
        }
    }
    SetFit {
        set: set.label.clone(),
        fits: false,
        reason: if closest.is_none() {
            Some(last_error.unwrap_or_else(|| "the set has no GPU".to_owned()))
        } else {
            None
        },
        placement: closest,
    }
}

/// The layouts `engine` can run on GPUs with `memory` each (largest first), most
/// parallel first.
fn layouts(shape: &ModelShape, weights: &WeightGroups, engine: Engine, memory: Vec<Bytes>) -> Vec<Layout> {
    let n = memory.len();
    if n == 1 {
        return vec![Layout::single()];
    }
    let valid = |k: usize| check_tp(shape, weights.quantization.as_ref(), k as u64).is_ok();
    let mut layouts = Vec::new();
    if engine.tensor_parallel() && engine.layer_split() {
        // Tensor-parallel groups of `tp` identical GPUs as `n / tp` stages, from one
        // stage of all `n` down to groups of two.
        for tp in (2..=n).rev().filter(|tp| n.is_multiple_of(*tp) && valid(*tp)) {
            let groups: Vec<&[Bytes]> = memory.chunks(tp).collect();
            if groups.iter().all(|g| g.iter().all(|m| *m == g[0])) {
                let stages = if tp == n {
                    Stages::One
                } else {
                    Stages::Memory(groups.iter().map(|g| g[0]).collect())
                };
                layouts.push(Layout {
                    tensor_parallel: tp as u64,
                    stages,
                });
            }
        }
    }
    if engine.layer_split() {
        layouts.push(Layout::pipeline_by_memory(memory));
    }
    layouts
}
