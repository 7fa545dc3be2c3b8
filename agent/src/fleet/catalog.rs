//! The GPU models a fleet file can name, with what NVML would report for them and the
//! figures the telemetry model needs.
//!
//! Names, NVML names, memory and compute capability match the model registry's catalog
//! (`model-registry/src/gpu.rs`), so a simulated fleet plans exactly like the real
//! one; the agent does not depend on that crate (it shares only the wire protocol), so
//! the few figures are repeated here. Power and temperature figures are typical
//! values for an air- or liquid-cooled card in a server, not measurements.

/// One GPU model of the catalog.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CardModel {
    /// The name used in fleet files (`A100-80GB`).
    pub name: &'static str,
    /// The name NVML reports (`NVIDIA A100-SXM4-80GB`).
    pub nvml_name: &'static str,
    /// Total memory as NVML reports it, in MiB.
    pub memory_mib: u64,
    /// CUDA compute capability.
    pub compute_capability: (u32, u32),
    /// Default enforced power limit, watts.
    pub power_limit_w: f64,
    /// PCIe generation and width the card is capable of.
    pub pcie: (u32, u32),
    /// Whether the card has ECC memory (so ECC counters are reported).
    pub ecc: bool,
    /// Whether the card supports MIG (so MIG mode is reported, off by default).
    pub mig: bool,
    /// The card's thermal and power behaviour.
    pub thermal: Thermal,
}

/// How a card draws power and heats up, for the derived telemetry.
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

/// The hardware thermal slowdown threshold used for every card unless the fleet file
/// gives another (`slowdown_temperature`).
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
    nvml_name: &'static str,
    memory_mib: u64,
    compute_capability: (u32, u32),
    power_limit_w: f64,
    pcie: (u32, u32),
    (ecc, mig): (bool, bool),
    thermal: Thermal,
) -> CardModel {
    CardModel {
        name,
        nvml_name,
        memory_mib,
        compute_capability,
        power_limit_w,
        pcie,
        ecc,
        mig,
        thermal,
    }
}

/// ECC and MIG flags of a row.
const ECC_MIG: (bool, bool) = (true, true);
const ECC: (bool, bool) = (true, false);
const NEITHER: (bool, bool) = (false, false);

/// The catalog, in the order docs list it.
#[rustfmt::skip]
pub const CARDS: &[CardModel] = &[
    card("A100-80GB", "NVIDIA A100-SXM4-80GB", 81_920, (8, 0), 400.0, (4, 16), ECC_MIG, thermal(55.0, 32.0, 70.0, 1410.0)),
    card("A100-40GB", "NVIDIA A100-SXM4-40GB", 40_960, (8, 0), 400.0, (4, 16), ECC_MIG, thermal(52.0, 32.0, 70.0, 1410.0)),
    card("H100-80GB", "NVIDIA H100 80GB HBM3", 81_559, (9, 0), 700.0, (5, 16), ECC_MIG, thermal(70.0, 33.0, 72.0, 1980.0)),
    card("RTX4090-24GB", "NVIDIA GeForce RTX 4090", 24_564, (8, 9), 450.0, (4, 16), NEITHER, thermal(20.0, 35.0, 75.0, 2520.0)),
    card("RTX3090-24GB", "NVIDIA GeForce RTX 3090", 24_576, (8, 6), 350.0, (4, 16), NEITHER, thermal(25.0, 38.0, 78.0, 1695.0)),
    card("V100-16GB", "Tesla V100-PCIE-16GB", 16_160, (7, 0), 250.0, (3, 16), ECC, thermal(25.0, 33.0, 72.0, 1380.0)),
    card("V100-32GB", "Tesla V100-SXM2-32GB", 32_768, (7, 0), 300.0, (3, 16), ECC, thermal(40.0, 33.0, 72.0, 1530.0)),
    card("L40S-48GB", "NVIDIA L40S", 46_068, (8, 9), 350.0, (4, 16), ECC, thermal(35.0, 34.0, 78.0, 2520.0)),
    card("T4-16GB", "Tesla T4", 15_360, (7, 5), 70.0, (3, 16), ECC, thermal(10.0, 30.0, 75.0, 1590.0)),
    card("L4-24GB", "NVIDIA L4", 23_034, (8, 9), 72.0, (4, 16), ECC, thermal(16.0, 32.0, 72.0, 2040.0)),
    card("A10-24GB", "NVIDIA A10", 23_028, (8, 6), 150.0, (4, 16), ECC, thermal(20.0, 33.0, 80.0, 1695.0)),
];

/// The figures of a card given by `name` and `memory` instead of a catalog model: a
/// generic PCIe 4.0 data-centre card without MIG or ECC.
pub const GENERIC: CardModel = card(
    "custom",
    "",
    0,
    (0, 0),
    300.0,
    (4, 16),
    NEITHER,
    thermal(30.0, 35.0, 75.0, 1800.0),
);

/// The catalog model called `name`: its catalog name or its NVML name, ignoring case.
pub fn lookup(name: &str) -> Option<&'static CardModel> {
    let name = name.trim();
    CARDS
        .iter()
        .find(|card| card.name.eq_ignore_ascii_case(name) || card.nvml_name.eq_ignore_ascii_case(name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookup_by_either_name() {
        assert_eq!(lookup("a100-80gb").map(|c| c.memory_mib), Some(81_920));
        assert_eq!(lookup("Tesla V100-PCIE-16GB").map(|c| c.name), Some("V100-16GB"));
        assert_eq!(lookup("A100"), None);
    }
}
