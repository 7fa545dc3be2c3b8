//! Simulated GPUs: a node of a fleet file, sampled through the same [`GpuSource`]
//! interface as NVML.
//!
//! Every reading is a pure function of the node's configuration and `t`: the metrics
//! the file models are evaluated, and the others follow from them the way they do on
//! a real card — power from utilization (between idle power and the limit),
//! temperature from power (between idle and load temperature), SM clock and throttle
//! reasons from load, temperature and power. See `docs/fleets.md`.

use std::collections::BTreeMap;

use crate::HostInventory;
use crate::gpu::{GpuInfo, GpuSample, GpuSource, SampleError, ThrottleReasons};
use crate::host::{HostField, Unavailable};
use crate::telemetry::Model;
use skein_gpu_catalog::CardModel;

/// Memory a GPU reports in use with nothing running (driver and context
/// reservations), as a fraction of its total.
pub const IDLE_MEMORY_FRACTION: f64 = 0.015;

/// Memory-bandwidth utilization per unit of compute utilization, when the file does
/// not model it.
pub const MEMORY_UTILIZATION_PER_UTILIZATION: f64 = 0.5;

/// Below this utilization a GPU counts as idle (clocks down, `gpu_idle` reason).
pub const IDLE_UTILIZATION: f64 = 0.01;

/// At or above this fraction of the power limit, the power cap holds clocks down.
pub const POWER_CAP_FRACTION: f64 = 0.98;

/// SM clock factor under hardware slowdown (NVML documents "by half or more").
const HW_SLOWDOWN_CLOCK: f64 = 0.5;
/// SM clock factor under the software power cap.
const POWER_CAP_CLOCK: f64 = 0.9;

/// The models of one GPU's metrics; `None` means "follow from the others" (see the
/// module docs), [`Model::Idle`] the card's idle value.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GpuTelemetry {
    /// Fraction of time a kernel runs (0–1).
    pub utilization: Option<Model>,
    /// Fraction of time device memory is read or written (0–1).
    pub memory_utilization: Option<Model>,
    /// Bytes in use by the driver and Skein's engines.
    pub memory_used: Option<Model>,
    /// Bytes in use by processes Skein did not start (added to `memory_used`).
    pub foreign_memory: Option<Model>,
    /// Degrees Celsius.
    pub temperature: Option<Model>,
    /// Watts (capped at the power limit).
    pub power: Option<Model>,
    /// MHz.
    pub sm_clock: Option<Model>,
    /// Volatile corrected ECC error total.
    pub ecc_corrected: Option<Model>,
    /// Volatile uncorrected ECC error total.
    pub ecc_uncorrected: Option<Model>,
    /// Throttle bits added to the derived ones.
    pub throttle: Option<Model>,
}

/// One simulated GPU: what it reports at registration, how it behaves, what it does.
#[derive(Debug, Clone, PartialEq)]
pub struct SimGpu {
    /// Static facts, as NVML would report them.
    pub info: GpuInfo,
    /// The card's figures (catalog row with the file's overrides applied).
    pub card: CardModel,
    /// The metric models.
    pub telemetry: GpuTelemetry,
}

/// What a fleet file says about a node's CPU side; the cores and memory it leaves out
/// come from the real host.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SimHost {
    /// Logical CPUs.
    pub cpu_cores: Option<usize>,
    /// Installed RAM in bytes.
    pub memory_bytes: Option<u64>,
    /// The node's network link, bits per second. Unlike cores and memory, a missing
    /// value stays unknown rather than coming from the real host: the machine running
    /// a simulated fleet says nothing about the links between its simulated nodes.
    pub network_bits_per_second: Option<u64>,
}

/// One node of a fleet file.
#[derive(Debug, Clone, PartialEq)]
pub struct SimNode {
    /// The node's name (`rtx-1`).
    pub name: String,
    /// Its GPUs, in index order.
    pub gpus: Vec<SimGpu>,
    /// Its CPU side.
    pub host: SimHost,
    /// The labels the file gives it (`labels: { zone: lab-a }`), checked.
    pub labels: BTreeMap<String, String>,
}

/// A simulated node as a [`GpuSource`].
#[derive(Debug, Clone)]
pub struct SimulatedSource {
    /// Where the node came from, for [`describe`](GpuSource::describe).
    origin: String,
    node: SimNode,
    inventory: Vec<GpuInfo>,
}

impl SimulatedSource {
    /// A source for `node`; `origin` names the fleet file in
    /// [`describe`](GpuSource::describe) (`lab.yaml`).
    pub fn new(origin: &str, node: SimNode) -> Self {
        let inventory = node.gpus.iter().map(|gpu| gpu.info.clone()).collect();
        Self {
            origin: origin.to_owned(),
            node,
            inventory,
        }
    }

    /// The node's name.
    pub fn node_name(&self) -> &str {
        &self.node.name
    }

    /// The node as the file describes it.
    pub fn node(&self) -> &SimNode {
        &self.node
    }

    /// Every GPU at time `t`: the pure core of [`GpuSource::sample`].
    pub fn sample_at(&self, t: f64) -> Vec<GpuSample> {
        self.node.gpus.iter().map(|gpu| sample_gpu(gpu, t)).collect()
    }

    /// The host inventory this node reports: `discovered` (the real host's) with the
    /// host name set to the node's name and the CPU cores and memory the fleet file
    /// gives. Physical cores are unknown when the file sets the core count. The network
    /// link is the file's, or unknown when the file gives none.
    pub fn host_inventory(&self, mut discovered: HostInventory) -> HostInventory {
        let host = self.node.host;
        discovered.hostname = Some(self.node.name.clone());
        discovered.network_bits_per_second = host.network_bits_per_second;
        let mut set = vec![HostField::Hostname, HostField::NetworkBandwidth];
        if let Some(cores) = host.cpu_cores {
            discovered.cpu.logical_cores = Some(cores);
            discovered.cpu.physical_cores = None;
            set.push(HostField::LogicalCores);
        }
        if let Some(bytes) = host.memory_bytes {
            discovered.memory.total_bytes = Some(bytes);
            discovered.memory.available_bytes = Some(bytes);
            set.extend([HostField::TotalMemory, HostField::AvailableMemory]);
        }
        discovered.unavailable.retain(|missing| !set.contains(&missing.field));
        if host.cpu_cores.is_some() {
            discovered
                .unavailable
                .retain(|missing| missing.field != HostField::PhysicalCores);
            discovered.unavailable.push(Unavailable {
                field: HostField::PhysicalCores,
                reason: "simulated node: the fleet file gives only the logical core count".to_owned(),
            });
        }
        if host.network_bits_per_second.is_none() {
            discovered.unavailable.push(Unavailable {
                field: HostField::NetworkBandwidth,
                reason: "simulated node: the fleet file gives no `network` for its host".to_owned(),
            });
        }
        discovered
    }
}

impl GpuSource for SimulatedSource {
    fn inventory(&self) -> &[GpuInfo] {
        &self.inventory
    }

    fn sample(&mut self, t: f64) -> Vec<Result<GpuSample, SampleError>> {
        self.sample_at(t).into_iter().map(Ok).collect()
    }

    fn describe(&self) -> String {
        let gpus = match self.inventory.len() {
            1 => "1 GPU".to_owned(),
            n => format!("{n} GPUs"),
        };
        format!("simulated node {} from {}, {gpus}", self.node.name, self.origin)
    }
}

/// The value of a model at `t`: `derived` when the file does not model the metric,
/// `idle` for `idle`.
fn value(model: Option<&Model>, t: f64, idle: f64, derived: impl FnOnce() -> f64) -> f64 {
    match model {
        None => derived(),
        Some(Model::Idle) => idle,
        Some(Model::Signal(signal)) => signal.at(t),
    }
}

fn explicit(model: Option<&Model>, t: f64) -> Option<f64> {
    match model {
        Some(Model::Signal(signal)) => Some(signal.at(t)),
        None | Some(Model::Idle) => None,
    }
}

/// Whole units from a modelled value (negative and NaN become 0; saturating casts).
fn whole<T: TryFrom<u64> + Copy>(value: f64, max: T) -> T {
    T::try_from(value.max(0.0).round() as u64).unwrap_or(max)
}

fn sample_gpu(gpu: &SimGpu, t: f64) -> GpuSample {
    let card = &gpu.card;
    let thermal = &card.thermal;
    let models = &gpu.telemetry;
    let total = gpu.info.memory_total as f64;

    let utilization = value(models.utilization.as_ref(), t, 0.0, || 0.0).clamp(0.0, 1.0);
    let memory_utilization = value(models.memory_utilization.as_ref(), t, 0.0, || {
        utilization * MEMORY_UTILIZATION_PER_UTILIZATION
    })
    .clamp(0.0, 1.0);

    let limit = card.power_limit_w;
    let idle_power = thermal.idle_power_w.min(limit);
    let power = value(models.power.as_ref(), t, idle_power, || {
        idle_power + (limit - idle_power) * utilization
    })
    .clamp(0.0, limit);
    let load = if limit > idle_power {
        ((power - idle_power) / (limit - idle_power)).clamp(0.0, 1.0)
    } else {
        0.0
    };
    let temperature = value(models.temperature.as_ref(), t, thermal.idle_temperature_c, || {
        thermal.idle_temperature_c + (thermal.load_temperature_c - thermal.idle_temperature_c) * load
    });

    let baseline = (total * IDLE_MEMORY_FRACTION / (1u64 << 20) as f64).round() * (1u64 << 20) as f64;
    let own = value(models.memory_used.as_ref(), t, baseline, || baseline).clamp(0.0, total);
    let foreign = value(models.foreign_memory.as_ref(), t, 0.0, || 0.0).clamp(0.0, total);
    let used = (own + foreign).min(total);

    let mut throttle = ThrottleReasons::from_bits(whole(explicit(models.throttle.as_ref(), t).unwrap_or(0.0), 0));
    if utilization < IDLE_UTILIZATION {
        throttle |= ThrottleReasons::GPU_IDLE;
    }
    if temperature >= thermal.slowdown_temperature_c {
        throttle |= ThrottleReasons::HW_SLOWDOWN | ThrottleReasons::HW_THERMAL_SLOWDOWN;
    }
    if limit > 0.0 && power >= limit * POWER_CAP_FRACTION {
        throttle |= ThrottleReasons::SW_POWER_CAP;
    }

    let clock = value(models.sm_clock.as_ref(), t, thermal.idle_clock_mhz, || {
        if utilization < IDLE_UTILIZATION {
            thermal.idle_clock_mhz
        } else if throttle.contains(ThrottleReasons::HW_SLOWDOWN) {
            thermal.max_clock_mhz * HW_SLOWDOWN_CLOCK
        } else if throttle.contains(ThrottleReasons::SW_POWER_CAP) {
            thermal.max_clock_mhz * POWER_CAP_CLOCK
        } else {
            thermal.max_clock_mhz
        }
    });

    let ecc = |model: Option<&Model>| match explicit(model, t) {
        Some(count) => Some(whole(count, u64::MAX)),
        None => card.ecc.then_some(0),
    };

    let used_bytes = whole(used, u64::MAX);
    GpuSample {
        index: gpu.info.index,
        memory_used: used_bytes,
        memory_free: gpu.info.memory_total.saturating_sub(used_bytes),
        utilization_pct: Some(whole(utilization * 100.0, 100)),
        memory_utilization_pct: Some(whole(memory_utilization * 100.0, 100)),
        temperature_c: Some(temperature.round().clamp(f64::from(i32::MIN), f64::from(i32::MAX)) as i32),
        power_mw: Some(whole(power * 1000.0, u32::MAX)),
        sm_clock_mhz: Some(whole(clock, u32::MAX)),
        throttle,
        ecc_corrected: ecc(models.ecc_corrected.as_ref()),
        ecc_uncorrected: ecc(models.ecc_uncorrected.as_ref()),
        foreign_memory: Some(whole(foreign, u64::MAX)),
    }
}
