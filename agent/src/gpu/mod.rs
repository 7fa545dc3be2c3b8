//! GPUs as the agent sees them: static facts ([`GpuInfo`]), one reading per tick
//! ([`GpuSample`]) and the [`GpuSource`] trait that real ([`NvmlSource`]) and simulated
//! ([`SimulatedSource`](crate::sim::SimulatedSource)) GPUs both implement, so everything
//! after discovery runs the same code for both.

mod allocated;
mod nvml;
mod throttle;

use serde::{Deserialize, Serialize};

pub use allocated::Allocated;
pub use nvml::{
    DiscoveryError, NO_DRIVER_MESSAGE, NvmlConfig, NvmlMemoryProbe, NvmlSource, SampleError, discover_nvml,
    discover_nvml_with,
};
pub use throttle::ThrottleReasons;

/// What does not change while the agent runs: sent once when the agent registers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuInfo {
    /// The NVML device index (0-based, in PCI bus order unless `CUDA_DEVICE_ORDER` says
    /// otherwise). For a simulated node, the position in the fleet file.
    pub index: u32,
    /// The GPU's identity, `GPU-` followed by 8-4-4-4-12 hex digits; stable across
    /// restarts (deterministic for simulated GPUs).
    pub uuid: String,
    /// The product name as NVML reports it (`"NVIDIA A100-SXM4-80GB"`).
    pub name: String,
    /// Total framebuffer memory in bytes, as NVML's `memory_info` reports it.
    pub memory_total: u64,
    /// CUDA compute capability, major and minor.
    pub compute_capability: Option<(u32, u32)>,
    /// The enforced power limit in milliwatts.
    pub power_limit_mw: Option<u32>,
    /// The PCIe link the card is capable of (maximum generation and width: the current
    /// link drops to a lower generation when the card idles).
    pub pcie: Option<PcieLink>,
    /// The PCI bus id (`"00000000:07:00.0"`).
    pub pci_bus_id: Option<String>,
    /// UUIDs of the GPUs this one has at least one active NVLink to (directly or
    /// through NVSwitch), sorted.
    pub nvlink_peers: Vec<String>,
    /// Whether MIG mode is on; `None` on GPUs without MIG.
    pub mig_enabled: Option<bool>,
    /// Whether this GPU comes from a fleet file rather than the hardware.
    pub simulated: bool,
}

/// A PCIe link: generation and lane count.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PcieLink {
    /// PCIe generation (3, 4, 5, …).
    pub generation: u32,
    /// Number of lanes (16 for a x16 link).
    pub width: u32,
}

/// One GPU at one tick. Cheap to produce: only the fast NVML queries feed it, and
/// the per-process figure ([`foreign_memory`](Self::foreign_memory)) only every few
/// ticks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuSample {
    /// The [`GpuInfo::index`] of the GPU.
    pub index: u32,
    /// Memory in use in bytes, as NVML's `memory_info` reports it (driver reservations
    /// included).
    pub memory_used: u64,
    /// Memory free in bytes, as NVML's `memory_info` reports it.
    pub memory_free: u64,
    /// Percent of the last sample period in which a kernel ran.
    pub utilization_pct: Option<u32>,
    /// Percent of the last sample period in which device memory was read or written.
    pub memory_utilization_pct: Option<u32>,
    /// GPU die temperature in degrees Celsius.
    pub temperature_c: Option<i32>,
    /// Board power draw in milliwatts.
    pub power_mw: Option<u32>,
    /// Current SM clock in MHz.
    pub sm_clock_mhz: Option<u32>,
    /// Why clocks are held down right now (empty where NVML cannot say).
    pub throttle: ThrottleReasons,
    /// Corrected ECC errors since the driver loaded (volatile total); `None` without ECC.
    pub ecc_corrected: Option<u64>,
    /// Uncorrected ECC errors since the driver loaded (volatile total).
    pub ecc_uncorrected: Option<u64>,
    /// Memory in bytes held by processes Skein did not start (see
    /// [`GpuSource::set_own_pids`]); `None` when not measured this tick.
    pub foreign_memory: Option<u64>,
}

/// A set of GPUs that can be listed and sampled: the NVML driver or a simulated node.
///
/// Implementations never panic and never block for long (NVML calls take microseconds
/// to a few milliseconds); async callers still run [`sample`](Self::sample) on a
/// blocking thread because NVML calls are synchronous.
pub trait GpuSource: Send {
    /// The GPUs found at discovery, in index order.
    fn inventory(&self) -> &[GpuInfo];

    /// Samples every GPU at time `t`, in seconds since the source started (real sources
    /// ignore it; simulated ones are a pure function of it). One entry per GPU of the
    /// inventory, in the same order; a GPU that cannot be read at all gives an error
    /// for that GPU only.
    fn sample(&mut self, t: f64) -> Vec<Result<GpuSample, SampleError>>;

    /// One line for logs: `"NVML 550.54.15, 4 GPUs"`, `"simulated node rtx-1 from
    /// lab.yaml, 4 GPUs"`.
    fn describe(&self) -> String;

    /// The processes the agent started (engines); memory held by any other process
    /// counts as [`GpuSample::foreign_memory`]. Replaces the previous set. The default
    /// ignores it (a simulated node models foreign memory directly).
    fn set_own_pids(&mut self, pids: &[u32]) {
        let _ = pids;
    }
}

/// Measures how much GPU memory given processes hold, so the supervisor can report what
/// an engine really uses once it has loaded. NVML implements it ([`NvmlMemoryProbe`]);
/// without a probe the supervisor reports no GPU figures.
///
/// Implementations block (driver calls): the supervisor calls them on a blocking thread.
pub trait GpuMemoryProbe: Send + Sync {
    /// Bytes held by `pids` together on each GPU that any of them uses, as
    /// `(GPU index, bytes)` sorted by index; GPUs they do not use are left out.
    fn process_memory(&self, pids: &[u32]) -> Vec<(u32, u64)>;
}

/// Formats `bytes` of a 16-byte identity as an NVML-style UUID:
/// `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`.
pub(crate) fn format_uuid(bytes: [u8; 16]) -> String {
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    // INVARIANT: `hex` is 32 ASCII characters, so every range below is in bounds and
    // on a character boundary; `get` keeps clippy's indexing lints quiet all the same.
    let part = |from: usize, to: usize| hex.get(from..to).unwrap_or_default();
    format!(
        "GPU-{}-{}-{}-{}-{}",
        part(0, 8),
        part(8, 12),
        part(12, 16),
        part(16, 20),
        part(20, 32)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuid_has_nvml_shape() {
        let uuid = format_uuid([0xab; 16]);
        assert_eq!(uuid, "GPU-abababab-abab-abab-abab-abababababab");
    }
}
