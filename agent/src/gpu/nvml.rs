//! Real GPUs through NVML (nvml-wrapper), loaded at run time.
//!
//! Discovery reads the static facts once; [`NvmlSource::sample`] makes only the cheap
//! per-device queries every tick, and the per-process listing (which walks the
//! driver's process table) every [`NvmlConfig::process_every`] ticks. A query that
//! fails leaves its field `None` and is logged once per GPU and field at debug level;
//! a query the GPU does not support is not asked again.

use std::collections::{BTreeMap, BTreeSet};
use std::num::NonZeroU32;

use nvml_wrapper::Nvml;
use nvml_wrapper::enum_wrappers::device::{Clock, EccCounter, MemoryError, TemperatureSensor};
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::struct_wrappers::device::ProcessInfo;
use tracing::{debug, warn};

use super::{GpuInfo, GpuSample, GpuSource, PcieLink, ThrottleReasons};

/// The line a caller logs when [`discover_nvml`] returns `Ok(None)`.
pub const NO_DRIVER_MESSAGE: &str = "no NVIDIA driver (libnvidia-ml.so.1 not found): this is a CPU-only node";

/// NVML's upper bound on NVLink links per GPU (`NVML_NVLINK_MAX_LINKS`).
const MAX_NVLINK_LINKS: u32 = 18;

/// How the NVML source samples.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NvmlConfig {
    /// List the GPU processes (for [`GpuSample::foreign_memory`]) on the first sample
    /// and then every this many samples; the other samples report `None` there.
    pub process_every: NonZeroU32,
}

impl Default for NvmlConfig {
    fn default() -> Self {
        Self {
            process_every: NonZeroU32::new(10).unwrap_or(NonZeroU32::MIN),
        }
    }
}

/// NVML is present but could not be used.
#[derive(Debug, thiserror::Error)]
pub enum DiscoveryError {
    /// `nvmlInit` failed (driver not loaded, no permission, library too old).
    #[error("NVML could not be initialised")]
    Init(#[source] NvmlError),
    /// NVML started but could not count the GPUs.
    #[error("NVML could not count the GPUs")]
    DeviceCount(#[source] NvmlError),
}

/// A GPU that could not be sampled at all this tick (it fell off the bus, or its
/// memory could not be read). The other GPUs of the same tick are unaffected.
#[derive(Debug, thiserror::Error)]
#[error("GPU {index} could not be sampled")]
pub struct SampleError {
    /// The [`GpuInfo::index`] of the GPU.
    pub index: u32,
    /// What NVML answered.
    #[source]
    pub source: NvmlError,
}

/// Finds the NVIDIA GPUs of this machine with the default [`NvmlConfig`].
///
/// `Ok(None)` means there is no NVIDIA driver (`libnvidia-ml.so.1` cannot be loaded):
/// the node is CPU-only, and the caller logs [`NO_DRIVER_MESSAGE`] once. A driver
/// that is present but unusable (kernel module not loaded, no permission) is an
/// error, because it is a misconfiguration worth showing.
pub fn discover_nvml() -> Result<Option<NvmlSource>, DiscoveryError> {
    discover_nvml_with(NvmlConfig::default())
}

/// [`discover_nvml`] with an explicit configuration.
pub fn discover_nvml_with(config: NvmlConfig) -> Result<Option<NvmlSource>, DiscoveryError> {
    let nvml = match Nvml::init() {
        Ok(nvml) => nvml,
        Err(NvmlError::LibloadingError(error)) => {
            debug!(%error, "NVML library not loadable");
            return Ok(None);
        }
        Err(NvmlError::LibraryNotFound) => return Ok(None),
        Err(error) => return Err(DiscoveryError::Init(error)),
    };
    let count = nvml.device_count().map_err(DiscoveryError::DeviceCount)?;
    let driver_version = nvml
        .sys_driver_version()
        .map_err(|error| debug!(%error, "NVML driver version unavailable"))
        .ok();

    let mut found = Vec::new();
    for index in 0..count {
        match discover_device(&nvml, index) {
            Ok(device) => found.push(device),
            Err(error) => warn!(index, %error, "GPU skipped: NVML cannot identify it"),
        }
    }
    let addresses: Vec<Option<PciAddress>> = found.iter().map(|d| d.address).collect();
    if !in_pci_bus_order(&addresses) {
        warn!(
            "NVML does not list this node's GPUs in PCI bus order; engines number GPUs in PCI bus order \
             (CUDA_DEVICE_ORDER=PCI_BUS_ID), so an engine may run on another GPU than the one planned"
        );
    }
    let peers = nvlink_peers(&found);
    let gpus = found
        .into_iter()
        .zip(peers)
        .map(|(device, nvlink_peers)| GpuInfo {
            nvlink_peers,
            ..device.info
        })
        .collect::<Vec<_>>();
    let states = gpus.iter().map(|_| FieldLog::default()).collect();
    Ok(Some(NvmlSource {
        nvml,
        driver_version,
        gpus,
        states,
        config,
        own_pids: BTreeSet::new(),
        samples: 0,
    }))
}

/// The NVIDIA GPUs of this machine, read through NVML.
pub struct NvmlSource {
    nvml: Nvml,
    driver_version: Option<String>,
    gpus: Vec<GpuInfo>,
    /// Per GPU, in the order of `gpus`: which fields failed and were logged.
    states: Vec<FieldLog>,
    config: NvmlConfig,
    own_pids: BTreeSet<u32>,
    /// Samples taken so far (decides when processes are listed).
    samples: u64,
}

impl std::fmt::Debug for NvmlSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NvmlSource")
            .field("driver_version", &self.driver_version)
            .field("gpus", &self.gpus)
            .field("config", &self.config)
            .field("own_pids", &self.own_pids)
            .finish_non_exhaustive()
    }
}

impl NvmlSource {
    /// The driver version (`"550.54.15"`), if NVML reported it.
    pub fn driver_version(&self) -> Option<&str> {
        self.driver_version.as_deref()
    }

    fn sample_one(&mut self, slot: usize, list_processes: bool) -> Result<GpuSample, SampleError> {
        let Some(info) = self.gpus.get(slot) else {
            return Err(SampleError {
                index: u32::try_from(slot).unwrap_or(u32::MAX),
                source: NvmlError::InvalidArg,
            });
        };
        let index = info.index;
        let fail = |source| SampleError { index, source };
        let device = self.nvml.device_by_index(index).map_err(fail)?;
        let memory = device.memory_info().map_err(fail)?;
        let Some(log) = self.states.get_mut(slot) else {
            return Err(fail(NvmlError::InvalidArg));
        };
        let utilization = log.query(index, Field::Utilization, || device.utilization_rates());
        let throttle = log
            .query(index, Field::Throttle, || device.current_throttle_reasons())
            .map(|reasons| ThrottleReasons::from_bits(reasons.bits()))
            .unwrap_or_default();
        let foreign_memory = if list_processes {
            let compute = log.query(index, Field::ComputeProcesses, || device.running_compute_processes());
            let graphics = log.query(index, Field::GraphicsProcesses, || device.running_graphics_processes());
            foreign_memory(compute, graphics, &self.own_pids)
        } else {
            None
        };
        Ok(GpuSample {
            index,
            memory_used: memory.used,
            memory_free: memory.free,
            utilization_pct: utilization.as_ref().map(|u| u.gpu),
            memory_utilization_pct: utilization.as_ref().map(|u| u.memory),
            temperature_c: log
                .query(index, Field::Temperature, || device.temperature(TemperatureSensor::Gpu))
                .map(|c| i32::try_from(c).unwrap_or(i32::MAX)),
            power_mw: log.query(index, Field::Power, || device.power_usage()),
            sm_clock_mhz: log.query(index, Field::SmClock, || device.clock_info(Clock::SM)),
            throttle,
            ecc_corrected: log.query(index, Field::EccCorrected, || {
                device.total_ecc_errors(MemoryError::Corrected, EccCounter::Volatile)
            }),
            ecc_uncorrected: log.query(index, Field::EccUncorrected, || {
                device.total_ecc_errors(MemoryError::Uncorrected, EccCounter::Volatile)
            }),
            foreign_memory,
        })
    }
}

impl GpuSource for NvmlSource {
    fn inventory(&self) -> &[GpuInfo] {
        &self.gpus
    }

    fn sample(&mut self, _t: f64) -> Vec<Result<GpuSample, SampleError>> {
        let list_processes = self.samples.is_multiple_of(u64::from(self.config.process_every.get()));
        self.samples = self.samples.wrapping_add(1);
        (0..self.gpus.len())
            .map(|slot| self.sample_one(slot, list_processes))
            .collect()
    }

    fn describe(&self) -> String {
        let gpus = match self.gpus.len() {
            1 => "1 GPU".to_owned(),
            n => format!("{n} GPUs"),
        };
        match &self.driver_version {
            Some(version) => format!("NVML {version}, {gpus}"),
            None => format!("NVML (driver version unknown), {gpus}"),
        }
    }

    fn set_own_pids(&mut self, pids: &[u32]) {
        self.own_pids = pids.iter().copied().collect();
    }
}

/// A per-sample field whose query can fail on its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Field {
    Utilization,
    Temperature,
    Power,
    SmClock,
    Throttle,
    EccCorrected,
    EccUncorrected,
    ComputeProcesses,
    GraphicsProcesses,
}

impl Field {
    const fn bit(self) -> u32 {
        1 << self as u32
    }

    const fn name(self) -> &'static str {
        match self {
            Field::Utilization => "utilization",
            Field::Temperature => "temperature",
            Field::Power => "power",
            Field::SmClock => "sm_clock",
            Field::Throttle => "throttle",
            Field::EccCorrected => "ecc_corrected",
            Field::EccUncorrected => "ecc_uncorrected",
            Field::ComputeProcesses => "compute_processes",
            Field::GraphicsProcesses => "graphics_processes",
        }
    }
}

/// Which fields of one GPU failed (logged once) or are unsupported (never asked
/// again).
#[derive(Debug, Default, Clone, Copy)]
struct FieldLog {
    logged: u32,
    unsupported: u32,
}

impl FieldLog {
    fn query<T>(&mut self, index: u32, field: Field, call: impl FnOnce() -> Result<T, NvmlError>) -> Option<T> {
        if self.unsupported & field.bit() != 0 {
            return None;
        }
        match call() {
            Ok(value) => Some(value),
            Err(error) => {
                if matches!(error, NvmlError::NotSupported) {
                    self.unsupported |= field.bit();
                }
                if self.logged & field.bit() == 0 {
                    self.logged |= field.bit();
                    debug!(gpu = index, field = field.name(), %error, "NVML query failed; field left empty");
                }
                None
            }
        }
    }
}

/// Memory held by processes not in `own`, from the compute and graphics process lists.
/// A process in both lists counts once. `None` when neither list could be read, or
/// when a foreign process's memory is not reported (Windows WDDM, some MIG setups).
fn foreign_memory(
    compute: Option<Vec<ProcessInfo>>,
    graphics: Option<Vec<ProcessInfo>>,
    own: &BTreeSet<u32>,
) -> Option<u64> {
    if compute.is_none() && graphics.is_none() {
        return None;
    }
    memory_by_pid(compute.into_iter().chain(graphics).flatten())
        .into_iter()
        .filter(|(pid, _)| !own.contains(pid))
        .try_fold(0u64, |sum, (_, used)| used.map(|bytes| sum.saturating_add(bytes)))
}

/// Memory per process from NVML's process lists; a process listed twice (compute and
/// graphics) counts once, with the larger figure. `None`: NVML does not report it.
fn memory_by_pid(processes: impl IntoIterator<Item = ProcessInfo>) -> BTreeMap<u32, Option<u64>> {
    let mut by_pid: BTreeMap<u32, Option<u64>> = BTreeMap::new();
    for process in processes {
        let used = match process.used_gpu_memory {
            UsedGpuMemory::Used(bytes) => Some(bytes),
            UsedGpuMemory::Unavailable => None,
        };
        let entry = by_pid.entry(process.pid).or_insert(used);
        *entry = match (*entry, used) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
    }
    by_pid
}

/// GPU memory of given processes through NVML's running compute processes: what an
/// engine holds on each GPU once loaded (a CUDA engine is a compute process).
pub struct NvmlMemoryProbe {
    nvml: Nvml,
}

impl std::fmt::Debug for NvmlMemoryProbe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NvmlMemoryProbe").finish_non_exhaustive()
    }
}

impl NvmlMemoryProbe {
    /// Loads NVML; `Ok(None)` without a driver, as [`discover_nvml`].
    pub fn new() -> Result<Option<Self>, DiscoveryError> {
        match Nvml::init() {
            Ok(nvml) => Ok(Some(Self { nvml })),
            Err(NvmlError::LibloadingError(_) | NvmlError::LibraryNotFound) => Ok(None),
            Err(error) => Err(DiscoveryError::Init(error)),
        }
    }
}

impl super::GpuMemoryProbe for NvmlMemoryProbe {
    fn process_memory(&self, pids: &[u32]) -> Vec<(u32, u64)> {
        let wanted: BTreeSet<u32> = pids.iter().copied().collect();
        let count = self
            .nvml
            .device_count()
            .map_err(|error| debug!(%error, "NVML could not count the GPUs"))
            .unwrap_or(0);
        let mut used = Vec::new();
        for index in 0..count {
            let processes = self
                .nvml
                .device_by_index(index)
                .and_then(|device| device.running_compute_processes());
            let processes = match processes {
                Ok(processes) => processes,
                Err(error) => {
                    debug!(gpu = index, %error, "NVML compute processes unavailable");
                    continue;
                }
            };
            let ours: Vec<Option<u64>> = memory_by_pid(processes)
                .into_iter()
                .filter(|(pid, _)| wanted.contains(pid))
                .map(|(_, bytes)| bytes)
                .collect();
            if !ours.is_empty() {
                // A process whose figure NVML withholds still counts as present (0 bytes).
                used.push((index, ours.into_iter().flatten().sum()));
            }
        }
        used
    }
}

/// A GPU as discovery read it, before NVLink ends are matched to other GPUs.
struct FoundDevice {
    info: GpuInfo,
    /// The normalised PCI address of the GPU itself.
    address: Option<PciAddress>,
    /// The normalised PCI addresses at the far end of each active NVLink.
    link_ends: Vec<PciAddress>,
}

/// Reads the static facts of one GPU. Only the UUID and the memory size are required;
/// every other fact is `None` when NVML cannot give it.
fn discover_device(nvml: &Nvml, index: u32) -> Result<FoundDevice, NvmlError> {
    let device = nvml.device_by_index(index)?;
    let uuid = device.uuid()?;
    let memory_total = device.memory_info()?.total;
    let mut log = FoundLog { index };
    let name = log
        .fact("name", device.name())
        .unwrap_or_else(|| "NVIDIA GPU (name unavailable)".to_owned());
    let compute_capability = log
        .fact("compute_capability", device.cuda_compute_capability())
        .and_then(|cc| Some((u32::try_from(cc.major).ok()?, u32::try_from(cc.minor).ok()?)));
    let power_limit_mw = log
        .fact("enforced_power_limit", device.enforced_power_limit())
        .or_else(|| log.fact("power_management_limit", device.power_management_limit()));
    let generation = log.fact("max_pcie_link_gen", device.max_pcie_link_gen());
    let width = log.fact("max_pcie_link_width", device.max_pcie_link_width());
    let pcie = generation
        .zip(width)
        .map(|(generation, width)| PcieLink { generation, width });
    let pci_bus_id = log.fact("pci_info", device.pci_info()).map(|pci| pci.bus_id);
    let mig_enabled = log.fact("mig_mode", device.mig_mode()).map(|mode| mode.current == 1);

    let mut link_ends = Vec::new();
    for link in 0..MAX_NVLINK_LINKS {
        let wrapper = device.link_wrapper_for(link);
        match wrapper.is_active() {
            Ok(true) => {
                if let Some(end) = log
                    .fact("nvlink_remote_pci_info", wrapper.remote_pci_info())
                    .and_then(|pci| PciAddress::parse(&pci.bus_id))
                {
                    link_ends.push(end);
                }
            }
            Ok(false) => {}
            // Past the last link of this GPU, or no NVLink at all.
            Err(NvmlError::InvalidArg | NvmlError::NotSupported) => break,
            Err(error) => {
                debug!(gpu = index, link, %error, "NVLink state unavailable");
                break;
            }
        }
    }

    Ok(FoundDevice {
        address: pci_bus_id.as_deref().and_then(PciAddress::parse),
        info: GpuInfo {
            index,
            uuid,
            name,
            memory_total,
            compute_capability,
            power_limit_mw,
            pcie,
            pci_bus_id,
            nvlink_peers: Vec::new(),
            mig_enabled,
            simulated: false,
        },
        link_ends,
    })
}

/// Logs a static fact that NVML could not give (once: discovery reads each fact once).
struct FoundLog {
    index: u32,
}

impl FoundLog {
    fn fact<T>(&mut self, field: &'static str, result: Result<T, NvmlError>) -> Option<T> {
        result
            .map_err(|error| debug!(gpu = self.index, field, %error, "NVML fact unavailable; left empty"))
            .ok()
    }
}

/// Matches NVLink far ends to GPUs: a link whose far end is another GPU makes the two
/// peers; a link whose far end is no GPU of this machine goes to an NVSwitch, and all
/// GPUs attached to switches are peers of each other (the HGX topology, where every
/// GPU reaches every other through the switches).
fn nvlink_peers(devices: &[FoundDevice]) -> Vec<Vec<String>> {
    let by_address: BTreeMap<PciAddress, &str> = devices
        .iter()
        .filter_map(|d| Some((d.address?, d.info.uuid.as_str())))
        .collect();
    let switched: BTreeSet<&str> = devices
        .iter()
        .filter(|d| d.link_ends.iter().any(|end| !by_address.contains_key(end)))
        .map(|d| d.info.uuid.as_str())
        .collect();
    devices
        .iter()
        .map(|device| {
            let me = device.info.uuid.as_str();
            let mut peers: BTreeSet<&str> = device
                .link_ends
                .iter()
                .filter_map(|end| by_address.get(end).copied())
                .collect();
            if switched.contains(me) {
                peers.extend(switched.iter().copied());
            }
            peers.remove(me);
            peers.into_iter().map(str::to_owned).collect()
        })
        .collect()
}

/// Whether GPUs listed in NVML's index order are in ascending PCI bus order, the order
/// CUDA numbers them in under `CUDA_DEVICE_ORDER=PCI_BUS_ID` (which every engine gets:
/// `engine::command`). It is the order `nvidia-smi` shows, but NVML documents no order
/// for its indices (`nvmlDeviceGetHandleByIndex`: "no guarantees of consistency between
/// reboots"), so discovery checks it. A GPU whose address is unknown is not held
/// against it.
fn in_pci_bus_order(addresses: &[Option<PciAddress>]) -> bool {
    let known: Vec<PciAddress> = addresses.iter().flatten().copied().collect();
    known.windows(2).all(|pair| pair[0] < pair[1])
}

/// A PCI address (domain, bus, device, function), so `0000:07:00.0` and
/// `00000000:07:00.0` compare equal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct PciAddress(u32, u32, u32, u32);

impl PciAddress {
    fn parse(text: &str) -> Option<Self> {
        let text = text.trim().trim_end_matches('\0');
        let (domain, rest) = text.split_once(':')?;
        let (bus, rest) = rest.split_once(':')?;
        let (device, function) = rest.split_once('.')?;
        let hex = |s: &str| u32::from_str_radix(s, 16).ok();
        Some(Self(hex(domain)?, hex(bus)?, hex(device)?, hex(function)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpus_out_of_pci_bus_order_are_noticed() {
        let at = |text: &str| PciAddress::parse(text);
        let ordered = [at("00000000:07:00.0"), None, at("0000:41:00.0"), at("0001:01:00.0")];
        assert!(in_pci_bus_order(&ordered));
        let swapped = [at("0000:41:00.0"), at("00000000:07:00.0")];
        assert!(!in_pci_bus_order(&swapped));
        assert!(in_pci_bus_order(&[]));
    }

    fn process(pid: u32, used: Option<u64>) -> ProcessInfo {
        ProcessInfo {
            pid,
            used_gpu_memory: used.map_or(UsedGpuMemory::Unavailable, UsedGpuMemory::Used),
            gpu_instance_id: None,
            compute_instance_id: None,
        }
    }

    #[test]
    fn foreign_memory_sums_other_processes_once() {
        let own = BTreeSet::from([100]);
        let compute = vec![process(100, Some(40 << 30)), process(200, Some(2 << 30))];
        let graphics = vec![process(200, Some(2 << 30)), process(300, Some(1 << 20))];
        assert_eq!(
            foreign_memory(Some(compute), Some(graphics), &own),
            Some((2 << 30) + (1 << 20))
        );
        assert_eq!(foreign_memory(Some(vec![process(100, Some(5))]), None, &own), Some(0));
        assert_eq!(foreign_memory(Some(vec![]), None, &own), Some(0));
        assert_eq!(foreign_memory(None, None, &own), None);
        // An own process whose memory is unknown does not matter; a foreign one does.
        assert_eq!(foreign_memory(Some(vec![process(100, None)]), None, &own), Some(0));
        assert_eq!(foreign_memory(Some(vec![process(7, None)]), None, &own), None);
    }

    fn found(uuid: &str, address: &str, ends: &[&str]) -> FoundDevice {
        FoundDevice {
            info: GpuInfo {
                index: 0,
                uuid: uuid.to_owned(),
                name: String::new(),
                memory_total: 0,
                compute_capability: None,
                power_limit_mw: None,
                pcie: None,
                pci_bus_id: Some(address.to_owned()),
                nvlink_peers: Vec::new(),
                mig_enabled: None,
                simulated: false,
            },
            address: PciAddress::parse(address),
            link_ends: ends.iter().filter_map(|e| PciAddress::parse(e)).collect(),
        }
    }

    #[test]
    fn nvlink_ends_map_to_peer_uuids() {
        // Two bridged pairs, links counted twice, and one GPU without NVLink.
        let devices = [
            found("GPU-a", "00000000:07:00.0", &["0000:08:00.0", "0000:08:00.0"]),
            found("GPU-b", "00000000:08:00.0", &["00000000:07:00.0"]),
            found("GPU-c", "00000000:47:00.0", &["00000000:4E:00.0"]),
            found("GPU-d", "00000000:4e:00.0", &["00000000:47:00.0"]),
            found("GPU-e", "00000000:90:00.0", &[]),
        ];
        let peers = nvlink_peers(&devices);
        assert_eq!(
            peers,
            [vec!["GPU-b"], vec!["GPU-a"], vec!["GPU-d"], vec!["GPU-c"], vec![]]
        );
    }

    #[test]
    fn nvswitch_links_connect_all_switched_gpus() {
        let devices = [
            found("GPU-a", "00000000:07:00.0", &["00000000:c0:00.0"]),
            found("GPU-b", "00000000:08:00.0", &["00000000:c1:00.0"]),
            found("GPU-c", "00000000:09:00.0", &["00000000:c0:00.0"]),
        ];
        let peers = nvlink_peers(&devices);
        assert_eq!(
            peers,
            [vec!["GPU-b", "GPU-c"], vec!["GPU-a", "GPU-c"], vec!["GPU-a", "GPU-b"]]
        );
    }

    #[test]
    fn pci_addresses_normalise() {
        assert_eq!(PciAddress::parse("00000000:4E:00.0"), PciAddress::parse("0000:4e:00.0"));
        assert_eq!(PciAddress::parse("garbage"), None);
    }
}
