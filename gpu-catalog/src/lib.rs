//! The GPU models Skein knows by name, in one table shared by the model registry (`--gpu
//! A100-80GB` in `skein models fit`, GPU sets for planning) and the agent (simulated
//! fleets), so a simulated fleet plans exactly like the real one.
//!
//! Memory is the total `nvidia-smi` reports on current drivers for the usual board; the
//! power and thermal figures are typical values for the card in a server, used only to
//! simulate telemetry. Pure: no IO.

#![warn(missing_docs)]

/// One GPU model.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CardModel {
    /// The name used on the command line, in fleet files and docs (`A100-80GB`).
    pub name: &'static str,
    /// Other names accepted for it, compared as [`lookup`] compares.
    pub aliases: &'static [&'static str],
    /// The name NVML reports (`NVIDIA A100-SXM4-80GB`).
    pub nvml_name: &'static str,
    /// Total memory as NVML reports it, MiB.
    pub memory_mib: u64,
    /// CUDA compute capability: 8.0 and later have bf16 and the AWQ/Marlin kernels;
    /// 7.x runs bf16 checkpoints as fp16.
    pub compute_capability: (u32, u32),
    /// Default enforced power limit, watts.
    pub power_limit_w: f64,
    /// PCIe generation and width the card is capable of.
    pub pcie: (u32, u32),
    /// Whether the card has ECC memory (so ECC counters are reported).
    pub ecc: bool,
    /// Whether the card supports MIG (so MIG mode is reported, off by default).
    pub mig: bool,
    /// How it draws power and heats up.
    pub thermal: Thermal,
    /// Peak memory bandwidth, GB/s (decimal), from the card's datasheet. Decoding a
    /// token reads every weight once, so this bounds a card's tokens per second; the
    /// planner's throughput model uses it.
    pub memory_bandwidth_gbs: f64,
}

impl CardModel {
    /// Total memory in bytes.
    pub const fn memory_bytes(&self) -> u64 {
        self.memory_mib << 20
    }
}

/// How a card draws power and heats up, for simulated telemetry.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Thermal {
    /// Power drawn with nothing running, watts.
    pub idle_power_w: f64,
    /// Temperature with nothing running, °C.
    pub idle_temperature_c: f64,
    /// Temperature at the power limit under normal cooling, °C.
    pub load_temperature_c: f64,
    /// Temperature at which the hardware slows clocks down, °C.
    pub slowdown_temperature_c: f64,
    /// SM clock with nothing running, MHz.
    pub idle_clock_mhz: f64,
    /// SM clock under load, MHz.
    pub max_clock_mhz: f64,
}

/// The hardware thermal slowdown threshold used for every card unless a fleet file gives
/// another.
pub const DEFAULT_SLOWDOWN_C: f64 = 87.0;

const fn thermal(idle_power_w: f64, idle_c: f64, load_c: f64, max_clock_mhz: f64) -> Thermal {
    Thermal {
        idle_power_w,
        idle_temperature_c: idle_c,
        load_temperature_c: load_c,
        slowdown_temperature_c: DEFAULT_SLOWDOWN_C,
        idle_clock_mhz: 210.0,
        max_clock_mhz,
    }
}

#[allow(clippy::too_many_arguments)] // A table row: a const fn keeps the table readable.
const fn card(
    name: &'static str,
    aliases: &'static [&'static str],
    nvml_name: &'static str,
    memory_mib: u64,
    compute_capability: (u32, u32),
    power_limit_w: f64,
    pcie: (u32, u32),
    (ecc, mig): (bool, bool),
    thermal: Thermal,
    memory_bandwidth_gbs: f64,
) -> CardModel {
    CardModel {
        name,
        aliases,
        nvml_name,
        memory_mib,
        compute_capability,
        power_limit_w,
        pcie,
        ecc,
        mig,
        thermal,
        memory_bandwidth_gbs,
    }
}

const ECC_MIG: (bool, bool) = (true, true);
const ECC: (bool, bool) = (true, false);
const NEITHER: (bool, bool) = (false, false);

/// The catalog, largest memory first.
#[rustfmt::skip]
pub const CARDS: &[CardModel] = &[
    card("H200-141GB", &["h200"], "NVIDIA H200", 143_771, (9, 0), 700.0, (5, 16), ECC_MIG, thermal(75.0, 33.0, 72.0, 1980.0), 4800.0),
    card("A100-80GB", &["a10080g", "a100sxm480gb", "a100pcie80gb"], "NVIDIA A100-SXM4-80GB", 81_920, (8, 0), 400.0, (4, 16), ECC_MIG, thermal(55.0, 32.0, 70.0, 1410.0), 2039.0),
    card("H100-80GB", &["h100", "h10080g", "h100sxm580gb"], "NVIDIA H100 80GB HBM3", 81_559, (9, 0), 700.0, (5, 16), ECC_MIG, thermal(70.0, 33.0, 72.0, 1980.0), 3350.0),
    card("RTXA6000-48GB", &["a6000", "rtxa6000"], "NVIDIA RTX A6000", 49_140, (8, 6), 300.0, (4, 16), ECC, thermal(25.0, 35.0, 80.0, 1800.0), 768.0),
    card("L40S-48GB", &["l40s"], "NVIDIA L40S", 46_068, (8, 9), 350.0, (4, 16), ECC, thermal(35.0, 34.0, 78.0, 2520.0), 864.0),
    card("A100-40GB", &["a10040g", "a100sxm440gb", "a100pcie40gb"], "NVIDIA A100-SXM4-40GB", 40_960, (8, 0), 400.0, (4, 16), ECC_MIG, thermal(52.0, 32.0, 70.0, 1410.0), 1555.0),
    card("V100-32GB", &["v10032g", "v100sxm232gb"], "Tesla V100-SXM2-32GB", 32_768, (7, 0), 300.0, (3, 16), ECC, thermal(40.0, 33.0, 72.0, 1530.0), 900.0),
    card("RTX3090-24GB", &["rtx3090", "3090"], "NVIDIA GeForce RTX 3090", 24_576, (8, 6), 350.0, (4, 16), NEITHER, thermal(25.0, 38.0, 78.0, 1695.0), 936.0),
    card("RTX4090-24GB", &["rtx4090", "4090"], "NVIDIA GeForce RTX 4090", 24_564, (8, 9), 450.0, (4, 16), NEITHER, thermal(20.0, 35.0, 75.0, 2520.0), 1008.0),
    card("L4-24GB", &["l4"], "NVIDIA L4", 23_034, (8, 9), 72.0, (4, 16), ECC, thermal(16.0, 32.0, 72.0, 2040.0), 300.0),
    card("A10-24GB", &["a10"], "NVIDIA A10", 23_028, (8, 6), 150.0, (4, 16), ECC, thermal(20.0, 33.0, 80.0, 1695.0), 600.0),
    card("V100-16GB", &["v10016g", "v100pcie16gb"], "Tesla V100-PCIE-16GB", 16_160, (7, 0), 250.0, (3, 16), ECC, thermal(25.0, 33.0, 72.0, 1380.0), 900.0),
    card("T4-16GB", &["t4"], "Tesla T4", 15_360, (7, 5), 70.0, (3, 16), ECC, thermal(10.0, 30.0, 75.0, 1590.0), 320.0),
];

/// The figures of a card given only by name and memory: a generic PCIe 4.0 data-centre
/// card without MIG or ECC.
pub const GENERIC: CardModel = card(
    "custom",
    &[],
    "",
    0,
    (0, 0),
    300.0,
    (4, 16),
    NEITHER,
    thermal(30.0, 35.0, 75.0, 1800.0),
    900.0,
);

/// The catalog model `name` denotes: its catalog name, an alias or its NVML name,
/// compared without case, spaces or punctuation, and without an `NVIDIA`, `GeForce` or
/// `Tesla` prefix (`a100 80gb`, `NVIDIA GeForce RTX 4090`, `4090`).
pub fn lookup(name: &str) -> Option<&'static CardModel> {
    let key = normalize(name);
    CARDS.iter().find(|card| {
        normalize(card.name) == key
            || normalize(card.nvml_name) == key
            || card.aliases.iter().any(|alias| normalize(alias) == key)
    })
}

fn normalize(name: &str) -> String {
    let lower: String = name
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .map(|c| c.to_ascii_lowercase())
        .collect();
    let mut key = lower.as_str();
    for prefix in ["nvidia", "geforce", "tesla"] {
        key = key.strip_prefix(prefix).unwrap_or(key);
    }
    key.to_owned()
}

/// Catalog names that `name` is a likely typo of ([`skein_text::likeness`], after the
/// loose comparison [`lookup`] makes, by name or alias), closest first, for "did you
/// mean" help.
pub fn suggestions(name: &str) -> Vec<&'static str> {
    let key = normalize(name);
    if key.is_empty() {
        return Vec::new();
    }
    let mut close: Vec<(f64, &'static str)> = CARDS
        .iter()
        .filter_map(|card| {
            let likeness = std::iter::once(card.name)
                .chain(card.aliases.iter().copied())
                .filter_map(|candidate| skein_text::likeness(&key, &normalize(candidate)))
                .reduce(f64::max)?;
            Some((likeness, card.name))
        })
        .collect();
    // Stable: equally close cards keep the catalog's order.
    close.sort_by(|a, b| b.0.total_cmp(&a.0));
    close.into_iter().map(|(_, name)| name).collect()
}

/// A PCIe link's bandwidth in one direction, GB/s (decimal): the lane rate of its
/// generation after line coding (gen 1–2: 8b/10b, gen 3 on: 128b/130b) times its width.
/// `None` for a generation this table does not know.
pub fn pcie_gbs(generation: u32, width: u32) -> Option<f64> {
    let lane = match generation {
        1 => 0.25,
        2 => 0.5,
        3 => 0.985,
        4 => 1.969,
        5 => 3.938,
        6 => 7.563,
        _ => return None,
    };
    Some(lane * f64::from(width))
}

/// The NVLink bandwidth of a card of compute capability `cc`, both directions of all its
/// links together, GB/s (decimal), as NVIDIA gives it per generation: Volta (NVLink 2,
/// 300), Ampere data-centre cards (NVLink 3, 600), Ampere workstation bridges (112.5),
/// Hopper (NVLink 4, 900), Blackwell (NVLink 5, 1800). `None` for an architecture without
/// NVLink or one this table does not know.
pub fn nvlink_gbs(cc: (u32, u32)) -> Option<f64> {
    match cc {
        (7, 0) => Some(300.0),
        (8, 0) => Some(600.0),
        (8, 6) => Some(112.5),
        (9, 0) => Some(900.0),
        (10, 0) => Some(1800.0),
        _ => None,
    }
}

/// Every catalog name, comma-separated, for messages.
pub fn names() -> String {
    CARDS.iter().map(|card| card.name).collect::<Vec<_>>().join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn link_bandwidths() {
        assert_eq!(pcie_gbs(4, 16).map(|g| (g * 10.0).round()), Some(315.0));
        assert_eq!(pcie_gbs(3, 16).map(|g| (g * 10.0).round()), Some(158.0));
        assert_eq!(pcie_gbs(9, 16), None);
        assert_eq!(nvlink_gbs((8, 0)), Some(600.0));
        assert_eq!(nvlink_gbs((8, 9)), None, "Ada has no NVLink");
    }

    #[test]
    fn names_resolve_loosely() {
        for name in ["A100-80GB", "a100 80gb", "NVIDIA A100-SXM4-80GB", "a100-sxm4-80gb"] {
            assert_eq!(lookup(name).map(|m| m.name), Some("A100-80GB"), "{name}");
        }
        for name in ["RTX4090", "NVIDIA GeForce RTX 4090", "4090", "rtx4090-24gb"] {
            assert_eq!(lookup(name).map(|m| m.name), Some("RTX4090-24GB"), "{name}");
        }
        assert_eq!(lookup("Tesla V100-PCIE-16GB").map(|m| m.name), Some("V100-16GB"));
        assert_eq!(lookup("A100"), None, "ambiguous: 40 or 80 GB");
    }

    #[test]
    fn unknown_names_get_the_closest() {
        // `a10` (an alias of the A10) is one letter from `A100`.
        assert_eq!(
            suggestions("A100"),
            ["A10-24GB", "A100-80GB", "A100-40GB", "H100-80GB", "RTXA6000-48GB"]
        );
        assert_eq!(
            suggestions("RTX4080"),
            ["RTX4090-24GB", "RTXA6000-48GB", "RTX3090-24GB"]
        );
        assert_eq!(suggestions("4090ti"), ["RTX4090-24GB"]);
        assert!(suggestions("A40").is_empty());
        assert!(suggestions("").is_empty());
    }

    #[test]
    fn no_name_or_alias_denotes_two_cards() {
        let mut seen: std::collections::BTreeMap<String, &str> = Default::default();
        for card in CARDS {
            let keys = std::iter::once(card.name)
                .chain(std::iter::once(card.nvml_name))
                .chain(card.aliases.iter().copied());
            for key in keys {
                let previous = seen.insert(normalize(key), card.name);
                assert!(
                    previous.is_none_or(|p| p == card.name),
                    "`{key}` names {previous:?} and {}",
                    card.name
                );
            }
        }
    }
}
