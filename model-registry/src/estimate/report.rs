//! An estimate that explains itself: per-device lines, totals, the constants used, a
//! table for the CLI, and the fit check against usable memory.

use std::fmt;

use serde::Serialize;

use super::engine::{Engine, KvDtype, NamedConstant};
use super::split::Layout;
use super::weights::WeightsOrigin;
use crate::quant::Quantization;
use crate::{Bytes, Error};

/// What a line of an estimate is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Component {
    /// Model weights.
    Weights,
    /// The KV cache for the requested context and sequences.
    KvCache,
    /// Activations and workspaces of a forward pass.
    Activations,
    /// Runtime overhead: CUDA context, graphs, communication buffers.
    Overhead,
}

impl fmt::Display for Component {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(match self {
            Component::Weights => "weights",
            Component::KvCache => "kv cache",
            Component::Activations => "activations",
            Component::Overhead => "overhead",
        })
    }
}

/// One line of a device's estimate.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Item {
    /// The component the line adds to.
    pub component: Component,
    /// What it is (`decoder layers`, `CUDA context`).
    pub what: &'static str,
    /// Its bytes.
    pub bytes: Bytes,
    /// How it was computed.
    pub detail: String,
}

/// A half-open range of decoder layers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct LayerRange {
    /// First layer.
    pub start: u64,
    /// One past the last layer.
    pub end: u64,
}

impl LayerRange {
    /// Layers in the range.
    pub fn len(&self) -> u64 {
        self.end.saturating_sub(self.start)
    }

    /// Whether the range holds no layer.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl fmt::Display for LayerRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(&format!("{}..{}", self.start, self.end))
    }
}

/// The memory one device needs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DeviceEstimate {
    /// Position in the layout: stage by stage, rank by rank.
    pub device: usize,
    /// Pipeline stage.
    pub stage: usize,
    /// A GPU, or the host CPU and its RAM.
    pub kind: DeviceKind,
    /// Rank within the stage's tensor-parallel group.
    pub rank: u64,
    /// The decoder layers it holds (a shard of, under tensor parallelism).
    pub layers: LayerRange,
    /// Sum of the weight lines.
    pub weights: Bytes,
    /// Sum of the KV-cache lines.
    pub kv_cache: Bytes,
    /// Sum of the activation lines.
    pub activations: Bytes,
    /// Sum of the overhead lines.
    pub overhead: Bytes,
    /// Everything.
    pub total: Bytes,
    /// Every line, in the order computed.
    pub items: Vec<Item>,
}

/// What a device is (an estimate's `device_kind`: what all its devices are, GPUs when
/// any is one).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DeviceKind {
    /// CUDA GPUs.
    Gpu,
    /// The host CPU and its RAM.
    Cpu,
}

impl DeviceKind {
    /// `gpu` or `cpu`.
    pub const fn name(self) -> &'static str {
        match self {
            DeviceKind::Gpu => "gpu",
            DeviceKind::Cpu => "cpu",
        }
    }
}

/// The weights an estimate sized.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WeightsSummary {
    /// Read from headers or computed.
    pub origin: WeightsOrigin,
    /// The variant's quantization, when known.
    pub quantization: Option<Quantization>,
    /// Bytes loaded, once (before any runtime conversion or replication).
    pub loaded: Bytes,
    /// Bytes the checkpoint stores that no engine loads.
    pub skipped: Bytes,
}

/// A memory estimate for one variant on one layout, with everything that went into it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Estimate {
    /// The engine and its settings.
    pub engine: Engine,
    /// GPUs or the CPU.
    pub device_kind: DeviceKind,
    /// Tensor and pipeline parallelism.
    pub layout: Layout,
    /// Context tokens per sequence.
    pub context: u64,
    /// Concurrent sequences.
    pub concurrency: u64,
    /// The KV-cache type in effect.
    pub kv_dtype: KvDtype,
    /// KV-cache bytes per token, whole model.
    pub kv_bytes_per_token: Bytes,
    /// Cache slots all sequences together occupy (the context, bounded by a sliding
    /// window, padded as the engine pads it, times the sequences).
    pub kv_tokens: u64,
    /// The weights.
    pub weights: WeightsSummary,
    /// Bytes the engine keeps in host RAM besides the devices (llama.cpp's token
    /// embedding).
    pub host: Bytes,
    /// Each device.
    pub devices: Vec<DeviceEstimate>,
    /// The named constants that entered the estimate.
    pub constants: Vec<NamedConstant>,
    /// Facts worth knowing about the figures.
    pub notes: Vec<String>,
}

impl Estimate {
    /// Each device's total, in layout order: what [`fits`] compares.
    pub fn device_totals(&self) -> Vec<Bytes> {
        self.devices.iter().map(|d| d.total).collect()
    }

    /// The largest device total.
    pub fn max_device_total(&self) -> Bytes {
        self.devices.iter().map(|d| d.total).max().unwrap_or(Bytes::ZERO)
    }

    /// All devices together.
    pub fn total(&self) -> Result<Bytes, Error> {
        self.devices
            .iter()
            .try_fold(Bytes::ZERO, |acc, d| acc.checked_add(d.total))
            .ok_or(Error::EstimateOverflow { what: "estimate total" })
    }
}

impl fmt::Display for Estimate {
    /// A table, one row per device; with `{:#}`, every line of every device below it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{} · {} · context {} × {} · KV {} {}/token · weights {}",
            self.engine.name(),
            self.layout,
            self.context,
            self.concurrency,
            self.kv_dtype,
            self.kv_bytes_per_token,
            self.weights.loaded
        )?;
        writeln!(
            f,
            "{:<7} {:>5} {:>4} {:>9} {:>10} {:>10} {:>11} {:>10} {:>10}",
            "device", "stage", "rank", "layers", "weights", "kv cache", "activations", "overhead", "total"
        )?;
        for d in &self.devices {
            let kind = d.kind.name();
            writeln!(
                f,
                "{:<7} {:>5} {:>4} {:>9} {:>10} {:>10} {:>11} {:>10} {:>10}",
                format!("{kind} {}", d.device),
                d.stage,
                d.rank,
                d.layers,
                d.weights,
                d.kv_cache,
                d.activations,
                d.overhead,
                d.total
            )?;
        }
        if self.host > Bytes::ZERO {
            writeln!(f, "host RAM: {}", self.host)?;
        }
        if f.alternate() {
            for d in &self.devices {
                writeln!(f, "{} {}:", d.kind.name(), d.device)?;
                for item in &d.items {
                    writeln!(
                        f,
                        "  {:<11} {:<34} {:>10}  {}",
                        item.component, item.what, item.bytes, item.detail
                    )?;
                }
            }
        }
        let constants: Vec<String> = self.constants.iter().map(ToString::to_string).collect();
        if !constants.is_empty() {
            writeln!(f, "constants: {}", constants.join(", "))?;
        }
        for note in &self.notes {
            writeln!(f, "note: {note}")?;
        }
        Ok(())
    }
}

/// Room kept free on each device beyond the estimate: allocator fragmentation and what
/// the model does not capture.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct FitMargin {
    /// Margin as thousandths of the device's estimate.
    pub permille: u64,
    /// The smallest margin.
    pub minimum: Bytes,
}

/// 5 % of the estimate, at least 256 MiB: PyTorch's caching allocator and ggml's buffers
/// fragment by a few per cent; the minimum covers small models where that is tiny.
pub const DEFAULT_FIT_MARGIN: FitMargin = FitMargin {
    permille: 50,
    minimum: Bytes::new(256 << 20),
};

/// The margin of a CPU device (host RAM): 5 % of the estimate, at least 32 MiB. No CUDA
/// allocator fragments it, and every host keeps its own headroom for the system besides;
/// the margin covers only what the estimate misses.
pub const HOST_FIT_MARGIN: FitMargin = FitMargin {
    permille: 50,
    minimum: Bytes::new(32 << 20),
};

impl FitMargin {
    /// The default margin of a device of `kind`: [`DEFAULT_FIT_MARGIN`] on a GPU,
    /// [`HOST_FIT_MARGIN`] on the CPU.
    pub const fn default_for(kind: DeviceKind) -> FitMargin {
        match kind {
            DeviceKind::Gpu => DEFAULT_FIT_MARGIN,
            DeviceKind::Cpu => HOST_FIT_MARGIN,
        }
    }
}

impl FitMargin {
    /// The margin for a device whose estimate is `need`.
    pub fn for_need(&self, need: Bytes) -> Bytes {
        let share = u128::from(need.get()) * u128::from(self.permille) / 1000;
        let share = Bytes::new(u64::try_from(share).unwrap_or(u64::MAX));
        share.max(self.minimum)
    }
}

/// Whether one device fits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct DeviceFit {
    /// Position in the layout.
    pub device: usize,
    /// The estimate.
    pub need: Bytes,
    /// The margin added to it.
    pub margin: Bytes,
    /// The device's usable memory.
    pub usable: Bytes,
    /// Whether `need + margin <= usable`.
    pub fits: bool,
    /// `usable - need - margin` when it fits, else zero.
    pub spare: Bytes,
    /// `need + margin - usable` when it does not fit, else zero.
    pub short: Bytes,
}

/// Per-device answers for one estimate against one set of devices.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FitReport {
    /// Whether every device fits.
    pub fits: bool,
    /// The margin applied.
    pub margin: FitMargin,
    /// Each device.
    pub devices: Vec<DeviceFit>,
}

impl fmt::Display for FitReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for d in &self.devices {
            let verdict = if d.fits {
                format!("fits, {} spare", d.spare)
            } else {
                format!("does not fit, {} short", d.short)
            };
            writeln!(
                f,
                "device {}: needs {} + {} margin of {} usable: {verdict}",
                d.device, d.need, d.margin, d.usable
            )?;
        }
        Ok(())
    }
}

/// Whether `estimate` fits devices with `usable` bytes each (in layout order), each with
/// the default margin of its kind ([`FitMargin::default_for`]: [`DEFAULT_FIT_MARGIN`] on
/// a GPU); the report's `margin` is the GPUs'.
///
/// Errors: [`Error::DeviceCountMismatch`] unless there is one usable figure per device.
pub fn fits(estimate: &Estimate, usable: &[Bytes]) -> Result<FitReport, Error> {
    fit_devices(estimate, usable, DEFAULT_FIT_MARGIN, FitMargin::default_for)
}

/// [`fits`] with a chosen margin, for every device whatever its kind.
pub fn fits_with_margin(estimate: &Estimate, usable: &[Bytes], margin: FitMargin) -> Result<FitReport, Error> {
    fit_devices(estimate, usable, margin, |_| margin)
}

fn fit_devices(
    estimate: &Estimate,
    usable: &[Bytes],
    margin: FitMargin,
    margin_of: impl Fn(DeviceKind) -> FitMargin,
) -> Result<FitReport, Error> {
    if usable.len() != estimate.devices.len() {
        return Err(Error::DeviceCountMismatch {
            devices: estimate.devices.len(),
            usable: usable.len(),
        });
    }
    let devices: Vec<DeviceFit> = estimate
        .devices
        .iter()
        .zip(usable)
        .map(|(d, &usable)| {
            let margin = margin_of(d.kind).for_need(d.total);
            let wanted = d.total.checked_add(margin).unwrap_or(Bytes::new(u64::MAX));
            let fits = wanted <= usable;
            DeviceFit {
                device: d.device,
                need: d.total,
                margin,
                usable,
                fits,
                spare: usable.checked_sub(wanted).unwrap_or(Bytes::ZERO),
                short: wanted.checked_sub(usable).unwrap_or(Bytes::ZERO),
            }
        })
        .collect();
    Ok(FitReport {
        fits: devices.iter().all(|d| d.fits),
        margin,
        devices,
    })
}
