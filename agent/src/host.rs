//! Discovery of the host's CPU, memory, load, operating system and network link.
//!
//! [`HostInventory::discover`] asks `sysinfo` for each fact separately, so one missing
//! fact (a container without `/sys`, a kernel that hides the load average) costs only
//! that field. Empty strings and zero counts, which `sysinfo` returns when it cannot read
//! a value, are treated as missing rather than reported as facts. The network link speed
//! comes from Linux sysfs (`/sys/class/net`), which `sysinfo` does not read.

use std::path::Path;

use serde::{Deserialize, Serialize};
use sysinfo::{CpuRefreshKind, MemoryRefreshKind, RefreshKind, System};

/// What the host reports about itself: the CPU side of a node's inventory.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HostInventory {
    /// The host name, as returned by `gethostname` (not necessarily a DNS name).
    pub hostname: Option<String>,
    /// Operating system and architecture.
    pub os: OsInfo,
    /// Processor counts and model.
    pub cpu: CpuInfo,
    /// Physical memory.
    pub memory: MemoryInfo,
    /// Run-queue load averages; `None` where the platform does not report them.
    pub load_average: Option<LoadAverage>,
    /// NUMA nodes, where the kernel shows them (`/sys/devices/system/node/node*`).
    pub numa_nodes: Option<usize>,
    /// The fastest link of the host's up, non-loopback, physical network interfaces, in
    /// bits per second: what the placement planner costs a model split across nodes
    /// with. `None` where no such interface reports its speed (see
    /// [`fastest_network_link`]).
    pub network_bits_per_second: Option<u64>,
    /// Every field above that is missing, with the reason. Empty when discovery found
    /// everything.
    pub unavailable: Vec<Unavailable>,
}

/// Operating system and architecture.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OsInfo {
    /// The OS or distribution name (`"Debian GNU/Linux"`, `"Darwin"`, `"Windows"`).
    pub name: Option<String>,
    /// The OS or distribution version (`"12"`, `"15.1.1"`).
    pub version: Option<String>,
    /// The kernel version (`"6.8.0-48-generic"`).
    pub kernel_version: Option<String>,
    /// The CPU architecture (`"x86_64"`, `"aarch64"`). Always known: when the OS does
    /// not say, it is the architecture this binary was built for.
    pub arch: String,
}

/// Processor counts and model.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CpuInfo {
    /// Logical CPUs (hardware threads) online on the host. This is the whole host, not
    /// a container's CPU quota.
    pub logical_cores: Option<usize>,
    /// Physical cores, summed over all sockets.
    pub physical_cores: Option<usize>,
    /// The model name (`"AMD EPYC 7763 64-Core Processor"`).
    pub brand: Option<String>,
}

/// Physical memory, in bytes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryInfo {
    /// Installed RAM visible to the OS. This is the whole host, not a container's
    /// memory limit.
    pub total_bytes: Option<u64>,
    /// RAM available for new allocations without swapping (free plus reclaimable cache;
    /// `MemAvailable` on Linux).
    pub available_bytes: Option<u64>,
}

/// Load averages over one, five and fifteen minutes, as the OS reports them (on Linux,
/// runnable plus uninterruptible tasks; not normalised by core count).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct LoadAverage {
    /// Average over the last minute.
    pub one: f64,
    /// Average over the last five minutes.
    pub five: f64,
    /// Average over the last fifteen minutes.
    pub fifteen: f64,
}

/// A fact that discovery could not obtain, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Unavailable {
    /// The missing field.
    pub field: HostField,
    /// Why it is missing, as reported by the system or by the check that refused it.
    pub reason: String,
}

/// A field of [`HostInventory`] that discovery can miss.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HostField {
    /// [`HostInventory::hostname`].
    Hostname,
    /// [`OsInfo::name`].
    OsName,
    /// [`OsInfo::version`].
    OsVersion,
    /// [`OsInfo::kernel_version`].
    KernelVersion,
    /// [`CpuInfo::logical_cores`].
    LogicalCores,
    /// [`CpuInfo::physical_cores`].
    PhysicalCores,
    /// [`CpuInfo::brand`].
    CpuBrand,
    /// [`MemoryInfo::total_bytes`].
    TotalMemory,
    /// [`MemoryInfo::available_bytes`].
    AvailableMemory,
    /// [`HostInventory::load_average`].
    LoadAverage,
    /// [`HostInventory::network_bits_per_second`].
    NetworkBandwidth,
}

impl HostInventory {
    /// An inventory that knows nothing but the architecture this binary was built for:
    /// the base a simulated node's file-given facts go on when the machine running the
    /// command must not leak into the result (`skein plan --fleet`).
    pub fn undiscovered() -> Self {
        HostInventory {
            hostname: None,
            os: OsInfo {
                name: None,
                version: None,
                kernel_version: None,
                arch: std::env::consts::ARCH.to_owned(),
            },
            cpu: CpuInfo {
                logical_cores: None,
                physical_cores: None,
                brand: None,
            },
            memory: MemoryInfo {
                total_bytes: None,
                available_bytes: None,
            },
            load_average: None,
            numa_nodes: None,
            network_bits_per_second: None,
            unavailable: Vec::new(),
        }
    }

    /// Reads the host's inventory. Never fails and never panics: each fact the host does
    /// not report is `None` and listed in [`unavailable`](Self::unavailable).
    ///
    /// This blocks while it reads system files (a few milliseconds on Linux); call it
    /// from a blocking thread in async code.
    pub fn discover() -> Self {
        let mut probe = Probe::default();

        let hostname = probe.text(HostField::Hostname, System::host_name());
        let os = OsInfo {
            name: probe.text(HostField::OsName, System::name()),
            version: probe.text(HostField::OsVersion, System::os_version()),
            kernel_version: probe.text(HostField::KernelVersion, System::kernel_version()),
            arch: System::cpu_arch(),
        };
        let physical_cores = probe
            .value(HostField::PhysicalCores, System::physical_core_count())
            .and_then(|count| probe.nonzero(HostField::PhysicalCores, count));
        let load_average = probe
            .value(HostField::LoadAverage, System::load_average())
            .map(|load| LoadAverage {
                one: load.one,
                five: load.five,
                fifteen: load.fifteen,
            });

        // Only the CPU list (with brands) and RAM figures are loaded: no usage sampling,
        // no processes, no swap.
        let refresh = RefreshKind::nothing()
            .with_cpu(CpuRefreshKind::nothing())
            .with_memory(MemoryRefreshKind::nothing().with_ram());
        let (cpu, memory) = match System::new_with_specifics(refresh) {
            Ok(system) => {
                let brand = system
                    .cpus()
                    .iter()
                    .map(|cpu| cpu.brand().trim())
                    .find(|brand| !brand.is_empty())
                    .map(str::to_owned);
                let cpu = CpuInfo {
                    logical_cores: probe.nonzero(HostField::LogicalCores, system.cpus().len()),
                    physical_cores,
                    brand: probe.present(HostField::CpuBrand, brand),
                };
                let memory = MemoryInfo {
                    total_bytes: probe.nonzero(HostField::TotalMemory, system.total_memory()),
                    available_bytes: probe.nonzero(HostField::AvailableMemory, system.available_memory()),
                };
                (cpu, memory)
            }
            Err(error) => {
                let reason = format!("system information unavailable: {error}");
                for field in [
                    HostField::LogicalCores,
                    HostField::CpuBrand,
                    HostField::TotalMemory,
                    HostField::AvailableMemory,
                ] {
                    probe.miss(field, reason.clone());
                }
                let cpu = CpuInfo {
                    logical_cores: None,
                    physical_cores,
                    brand: None,
                };
                let memory = MemoryInfo {
                    total_bytes: None,
                    available_bytes: None,
                };
                (cpu, memory)
            }
        };

        let network_bits_per_second = fastest_network_link(Path::new(SYS_CLASS_NET))
            .map_err(|reason| probe.miss(HostField::NetworkBandwidth, reason))
            .ok();

        HostInventory {
            hostname,
            os,
            cpu,
            memory,
            load_average,
            numa_nodes: numa_nodes(),
            network_bits_per_second,
            unavailable: probe.unavailable,
        }
    }
}

/// NUMA nodes the kernel shows (`/sys/devices/system/node/node<N>`); `None` where it
/// shows none (other platforms, some containers).
fn numa_nodes() -> Option<usize> {
    let entries = std::fs::read_dir("/sys/devices/system/node").ok()?;
    let count = entries
        .filter_map(Result::ok)
        .filter(|entry| {
            let name = entry.file_name();
            let name = name.to_string_lossy();
            name.strip_prefix("node")
                .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        })
        .count();
    (count > 0).then_some(count)
}

/// Where Linux lists the network interfaces, one directory (or link) per interface.
const SYS_CLASS_NET: &str = "/sys/class/net";

/// Megabits, the unit of sysfs' `speed`, in bits.
const BITS_PER_MEGABIT: u64 = 1_000_000;

/// The fastest link, in bits per second, among the network interfaces under
/// `sys_class_net` (a directory laid out like Linux's `/sys/class/net`) that are up
/// (`operstate` is `up`), not the loopback (`lo`), and physical (they have a `device`
/// link, which bridges, veths, tunnels and other virtual interfaces lack).
///
/// An interface's `speed` is in Mb/s; an interface whose `speed` is missing, cannot be
/// read (wireless drivers refuse it) or is not positive (`-1` when the driver does not
/// know) does not count. Errors, with the reason, when no interface counts.
pub fn fastest_network_link(sys_class_net: &Path) -> Result<u64, String> {
    let entries = std::fs::read_dir(sys_class_net)
        .map_err(|error| format!("cannot list {}: {error}", sys_class_net.display()))?;
    let mut names: Vec<String> = entries
        .filter_map(Result::ok)
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .filter(|name| name != "lo")
        .collect();
    // Sorted so that the reason below names the interfaces in a stable order.
    names.sort();

    let mut fastest: Option<u64> = None;
    let mut unknown = Vec::new();
    for name in names {
        let interface = sys_class_net.join(&name);
        let up = std::fs::read_to_string(interface.join("operstate")).is_ok_and(|state| state.trim() == "up");
        // `device` is a symbolic link to the hardware; the link itself is what marks a
        // physical interface.
        let physical = std::fs::symlink_metadata(interface.join("device")).is_ok();
        if !(up && physical) {
            continue;
        }
        match std::fs::read_to_string(interface.join("speed")) {
            Ok(text) => match text.trim().parse::<i64>() {
                Ok(mbps) if mbps > 0 => {
                    let bits = u64::try_from(mbps).unwrap_or(u64::MAX).saturating_mul(BITS_PER_MEGABIT);
                    fastest = Some(fastest.map_or(bits, |f| f.max(bits)));
                }
                _ => unknown.push(format!("{name} reports speed {:?}", text.trim())),
            },
            Err(error) => unknown.push(format!("{name}: cannot read its speed: {error}")),
        }
    }
    match fastest {
        Some(bits) => Ok(bits),
        None if unknown.is_empty() => Err(format!(
            "no physical network interface is up under {}",
            sys_class_net.display()
        )),
        None => Err(format!(
            "no up, physical network interface reports its speed ({})",
            unknown.join("; ")
        )),
    }
}

/// The host's changing figures, sampled every telemetry tick.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct HostLive {
    /// One-minute load average.
    pub load1: Option<f64>,
    /// Available RAM, bytes.
    pub memory_available: Option<u64>,
}

/// Samples [`HostLive`] cheaply: the load average (one file read) and RAM figures only,
/// reusing one `sysinfo` handle.
pub struct HostSampler {
    system: Option<System>,
}

impl std::fmt::Debug for HostSampler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostSampler").finish_non_exhaustive()
    }
}

impl HostSampler {
    /// A sampler of this machine. Never fails: figures it cannot read are `None`.
    pub fn new() -> HostSampler {
        let refresh = RefreshKind::nothing().with_memory(MemoryRefreshKind::nothing().with_ram());
        HostSampler {
            system: System::new_with_specifics(refresh).ok(),
        }
    }

    /// The figures now.
    pub fn sample(&mut self) -> HostLive {
        let memory_available = self.system.as_mut().and_then(|system| {
            system.refresh_memory_specifics(MemoryRefreshKind::nothing().with_ram());
            let available = system.available_memory();
            (available > 0).then_some(available)
        });
        HostLive {
            load1: System::load_average().ok().map(|load| load.one),
            memory_available,
        }
    }
}

impl Default for HostSampler {
    fn default() -> Self {
        HostSampler::new()
    }
}

/// Turns `sysinfo` answers into options, recording why each missing one is missing.
#[derive(Debug, Default)]
struct Probe {
    unavailable: Vec<Unavailable>,
}

impl Probe {
    fn miss(&mut self, field: HostField, reason: String) {
        self.unavailable.push(Unavailable { field, reason });
    }

    fn value<T>(&mut self, field: HostField, result: Result<T, sysinfo::Error>) -> Option<T> {
        result.map_err(|error| self.miss(field, error.to_string())).ok()
    }

    /// A string answer, trimmed; an empty string counts as missing.
    fn text(&mut self, field: HostField, result: Result<String, sysinfo::Error>) -> Option<String> {
        let text = self.value(field, result)?;
        let text = text.trim();
        if text.is_empty() {
            self.miss(field, "reported as empty".to_owned());
            return None;
        }
        Some(text.to_owned())
    }

    /// A count or size; zero means `sysinfo` could not read it.
    fn nonzero<T: Default + PartialEq>(&mut self, field: HostField, value: T) -> Option<T> {
        if value == T::default() {
            self.miss(field, "reported as zero".to_owned());
            return None;
        }
        Some(value)
    }

    fn present<T>(&mut self, field: HostField, value: Option<T>) -> Option<T> {
        if value.is_none() {
            self.miss(field, "not reported".to_owned());
        }
        value
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn discovery_finds_cores_and_memory_on_this_machine() {
        let inventory = HostInventory::discover();
        let logical = inventory.cpu.logical_cores.unwrap();
        assert!(logical >= 1, "{inventory:#?}");
        if let Some(physical) = inventory.cpu.physical_cores {
            assert!((1..=logical).contains(&physical), "{inventory:#?}");
        }
        let total = inventory.memory.total_bytes.unwrap();
        assert!(total > 0, "{inventory:#?}");
        if let Some(available) = inventory.memory.available_bytes {
            assert!(available <= total, "{inventory:#?}");
        }
        assert!(!inventory.os.arch.is_empty());
        // Every missing field is explained, and only missing fields are.
        for missing in &inventory.unavailable {
            assert!(!missing.reason.is_empty(), "{missing:?}");
        }
        let explained = |field| inventory.unavailable.iter().any(|u| u.field == field);
        assert_eq!(inventory.hostname.is_none(), explained(HostField::Hostname));
        assert_eq!(inventory.cpu.brand.is_none(), explained(HostField::CpuBrand));
        assert_eq!(inventory.load_average.is_none(), explained(HostField::LoadAverage));
        assert_eq!(
            inventory.network_bits_per_second.is_none(),
            explained(HostField::NetworkBandwidth)
        );
    }

    /// Whether a fake interface has the `device` link of a physical one.
    #[cfg(unix)]
    #[derive(Clone, Copy)]
    enum Kind {
        Physical,
        Virtual,
    }

    /// A fake `/sys/class/net` in a temporary directory, one interface per row: its name,
    /// `operstate`, `speed` (an empty one leaves the file out) and kind. As in sysfs,
    /// `device` is a symbolic link to a directory elsewhere.
    #[cfg(unix)]
    fn fake_sys_class_net(interfaces: &[(&str, &str, &str, Kind)]) -> (tempfile::TempDir, std::path::PathBuf) {
        let sys = tempfile::tempdir().unwrap();
        let net = sys.path().join("class/net");
        for &(name, operstate, speed, kind) in interfaces {
            let dir = net.join(name);
            std::fs::create_dir_all(&dir).unwrap();
            for (file, text) in [("operstate", operstate), ("speed", speed)] {
                if !text.is_empty() {
                    std::fs::write(dir.join(file), format!("{text}\n")).unwrap();
                }
            }
            if let Kind::Physical = kind {
                let hardware = sys.path().join("devices").join(name);
                std::fs::create_dir_all(&hardware).unwrap();
                std::os::unix::fs::symlink(&hardware, dir.join("device")).unwrap();
            }
        }
        (sys, net)
    }

    #[cfg(unix)]
    #[test]
    fn fastest_network_link_takes_the_fastest_up_physical_interface() {
        use Kind::{Physical, Virtual};
        // Loopback, down, virtual and unknown-speed interfaces do not count, however
        // fast they claim to be.
        let (_sys, net) = fake_sys_class_net(&[
            ("lo", "unknown", "400000", Physical),
            ("eno1", "up", "10000", Physical),
            ("enp65s0f0", "up", "100000", Physical),
            ("enp65s0f1", "down", "200000", Physical),
            ("docker0", "up", "400000", Virtual),
            ("eno2", "up", "-1", Physical),
            ("wlp3s0", "up", "", Physical),
        ]);
        assert_eq!(fastest_network_link(&net), Ok(100_000_000_000));
    }

    #[cfg(unix)]
    #[test]
    fn fastest_network_link_explains_an_unknown_speed() {
        use Kind::{Physical, Virtual};
        let (_sys, net) = fake_sys_class_net(&[
            ("lo", "unknown", "10", Physical),
            ("veth1", "up", "10000", Virtual),
            ("eno1", "down", "1000", Physical),
            ("eno3", "", "1000", Physical),
        ]);
        assert_eq!(
            fastest_network_link(&net),
            Err(format!("no physical network interface is up under {}", net.display()))
        );

        let (_sys, net) = fake_sys_class_net(&[
            ("eno2", "up", "-1", Physical),
            ("wlp3s0", "up", "", Physical),
            ("eth9", "up", "fast", Physical),
        ]);
        let reason = fastest_network_link(&net).unwrap_err();
        assert!(
            reason.starts_with(
                "no up, physical network interface reports its speed \
                 (eno2 reports speed \"-1\"; eth9 reports speed \"fast\"; wlp3s0: cannot read its speed: "
            ),
            "{reason}"
        );

        let missing = net.join("no/such/dir");
        let reason = fastest_network_link(&missing).unwrap_err();
        assert!(
            reason.starts_with(&format!("cannot list {}: ", missing.display())),
            "{reason}"
        );
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn linux_reports_load_average_and_available_memory() {
        // The kernel's own figures, read just before and just after discovery (they
        // change every 5 s, so one of the two is what discovery read).
        let kernel = || {
            let text = std::fs::read_to_string("/proc/loadavg").unwrap();
            let fields: Vec<f64> = text
                .split_whitespace()
                .take(3)
                .map(|field| field.parse().unwrap())
                .collect();
            LoadAverage {
                one: fields[0],
                five: fields[1],
                fifteen: fields[2],
            }
        };
        let before = kernel();
        let inventory = HostInventory::discover();
        let after = kernel();
        let load = inventory.load_average.unwrap();
        assert!(
            load == before || load == after,
            "discovered {load:?}; /proc/loadavg said {before:?}, then {after:?}"
        );
        assert!(inventory.memory.available_bytes.is_some());
        assert!(inventory.os.kernel_version.is_some());
    }

    #[test]
    fn probe_turns_errors_empties_and_zeros_into_explained_nones() {
        let mut probe = Probe::default();
        assert_eq!(
            probe.text(HostField::Hostname, Ok("  gpu-01\n".to_owned())),
            Some("gpu-01".to_owned())
        );
        assert_eq!(probe.text(HostField::OsName, Ok("   ".to_owned())), None);
        assert_eq!(
            probe.value::<usize>(HostField::PhysicalCores, Err(sysinfo::Error::Unsupported)),
            None
        );
        assert_eq!(probe.nonzero(HostField::TotalMemory, 0u64), None);
        assert_eq!(probe.nonzero(HostField::LogicalCores, 8usize), Some(8));
        assert_eq!(probe.present::<String>(HostField::CpuBrand, None), None);
        assert_eq!(
            probe.unavailable,
            [
                Unavailable {
                    field: HostField::OsName,
                    reason: "reported as empty".into()
                },
                Unavailable {
                    field: HostField::PhysicalCores,
                    reason: "unsupported".into()
                },
                Unavailable {
                    field: HostField::TotalMemory,
                    reason: "reported as zero".into()
                },
                Unavailable {
                    field: HostField::CpuBrand,
                    reason: "not reported".into()
                },
            ]
        );
    }

    #[test]
    fn inventory_serializes_with_units_in_field_names() {
        let inventory = HostInventory {
            hostname: Some("rtx-1".into()),
            os: OsInfo {
                name: Some("Debian GNU/Linux".into()),
                version: Some("12".into()),
                kernel_version: None,
                arch: "x86_64".into(),
            },
            cpu: CpuInfo {
                logical_cores: Some(64),
                physical_cores: Some(32),
                brand: Some("AMD EPYC 7543 32-Core Processor".into()),
            },
            memory: MemoryInfo {
                total_bytes: Some(270_582_939_648),
                available_bytes: Some(250_000_000_000),
            },
            load_average: Some(LoadAverage {
                one: 1.5,
                five: 0.75,
                fifteen: 0.25,
            }),
            numa_nodes: Some(2),
            network_bits_per_second: Some(100_000_000_000),
            unavailable: vec![Unavailable {
                field: HostField::KernelVersion,
                reason: "unsupported".into(),
            }],
        };
        let json = serde_json::to_value(&inventory).unwrap();
        assert_eq!(
            json,
            serde_json::json!({
                "hostname": "rtx-1",
                "os": {
                    "name": "Debian GNU/Linux",
                    "version": "12",
                    "kernel_version": null,
                    "arch": "x86_64"
                },
                "cpu": {
                    "logical_cores": 64,
                    "physical_cores": 32,
                    "brand": "AMD EPYC 7543 32-Core Processor"
                },
                "memory": {
                    "total_bytes": 270_582_939_648u64,
                    "available_bytes": 250_000_000_000u64
                },
                "load_average": { "one": 1.5, "five": 0.75, "fifteen": 0.25 },
                "numa_nodes": 2,
                "network_bits_per_second": 100_000_000_000u64,
                "unavailable": [{ "field": "kernel_version", "reason": "unsupported" }]
            })
        );
        let back: HostInventory = serde_json::from_value(json).unwrap();
        assert_eq!(back, inventory);
    }
}
