//! Clock throttle reasons: NVML's `nvmlClocksThrottleReason*` bit set as a plain `u64`
//! newtype, so simulated sources, the wire protocol and reflexes can use it without
//! linking NVML.

use std::fmt;
use std::ops::{BitOr, BitOrAssign};

use serde::{Deserialize, Serialize};

/// Why a GPU's clocks are held below their maximum, as NVML's
/// `nvmlDeviceGetCurrentClocksThrottleReasons` reports it.
///
/// The bit values are NVML's, so a real reading converts with
/// [`from_bits`](Self::from_bits) and unknown bits from newer drivers are kept (and
/// named `unknown`), not dropped. Serialized as the bare number.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ThrottleReasons(u64);

/// Every known reason with its snake_case name, in bit order.
const NAMED: [(ThrottleReasons, &str); 9] = [
    (ThrottleReasons::GPU_IDLE, "gpu_idle"),
    (
        ThrottleReasons::APPLICATIONS_CLOCKS_SETTING,
        "applications_clocks_setting",
    ),
    (ThrottleReasons::SW_POWER_CAP, "sw_power_cap"),
    (ThrottleReasons::HW_SLOWDOWN, "hw_slowdown"),
    (ThrottleReasons::SYNC_BOOST, "sync_boost"),
    (ThrottleReasons::SW_THERMAL_SLOWDOWN, "sw_thermal_slowdown"),
    (ThrottleReasons::HW_THERMAL_SLOWDOWN, "hw_thermal_slowdown"),
    (ThrottleReasons::HW_POWER_BRAKE_SLOWDOWN, "hw_power_brake_slowdown"),
    (ThrottleReasons::DISPLAY_CLOCK_SETTING, "display_clock_setting"),
];

impl ThrottleReasons {
    /// Clocks are not throttled.
    pub const NONE: Self = Self(0);
    /// Nothing runs on the GPU and clocks are lowered to save power.
    pub const GPU_IDLE: Self = Self(0x1);
    /// Clocks are capped by the application clocks setting.
    pub const APPLICATIONS_CLOCKS_SETTING: Self = Self(0x2);
    /// The software power-management algorithm holds clocks down to stay under the
    /// power limit.
    pub const SW_POWER_CAP: Self = Self(0x4);
    /// Hardware slowdown (clocks reduced by half or more): temperature, external power
    /// brake or a power supply fault.
    pub const HW_SLOWDOWN: Self = Self(0x8);
    /// Clocks are synchronised with other GPUs of a sync-boost group.
    pub const SYNC_BOOST: Self = Self(0x10);
    /// Software thermal slowdown: the GPU or its memory is above its target
    /// temperature.
    pub const SW_THERMAL_SLOWDOWN: Self = Self(0x20);
    /// Hardware thermal slowdown: the GPU is too hot (set together with
    /// [`HW_SLOWDOWN`](Self::HW_SLOWDOWN)).
    pub const HW_THERMAL_SLOWDOWN: Self = Self(0x40);
    /// Hardware power-brake slowdown asserted by the system (set together with
    /// [`HW_SLOWDOWN`](Self::HW_SLOWDOWN)).
    pub const HW_POWER_BRAKE_SLOWDOWN: Self = Self(0x80);
    /// Clocks are held by the display clock setting.
    pub const DISPLAY_CLOCK_SETTING: Self = Self(0x100);

    /// The reasons of a raw NVML bit set; unknown bits are kept.
    pub const fn from_bits(bits: u64) -> Self {
        Self(bits)
    }

    /// The raw NVML bit set.
    pub const fn bits(self) -> u64 {
        self.0
    }

    /// Whether no reason is set.
    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// Whether every reason of `other` is set.
    pub const fn contains(self, other: Self) -> bool {
        self.0 & other.0 == other.0
    }

    /// Whether any reason of `other` is set.
    pub const fn intersects(self, other: Self) -> bool {
        self.0 & other.0 != 0
    }

    /// Whether the GPU is slowed because it is hot (software or hardware thermal
    /// slowdown).
    pub const fn is_thermal(self) -> bool {
        self.intersects(Self(Self::SW_THERMAL_SLOWDOWN.0 | Self::HW_THERMAL_SLOWDOWN.0))
    }

    /// Whether the GPU is slowed by power: the software power cap or a hardware power
    /// brake.
    pub const fn is_power(self) -> bool {
        self.intersects(Self(Self::SW_POWER_CAP.0 | Self::HW_POWER_BRAKE_SLOWDOWN.0))
    }

    /// The snake_case names of the set reasons, in bit order (`["sw_power_cap",
    /// "hw_slowdown"]`); bits NVML may add later appear once as `"unknown"`.
    pub fn names(self) -> Vec<&'static str> {
        let mut names: Vec<&'static str> = NAMED
            .iter()
            .filter(|(reason, _)| self.contains(*reason))
            .map(|(_, name)| *name)
            .collect();
        if self.0 & !Self::known_bits() != 0 {
            names.push("unknown");
        }
        names
    }

    /// The reason with this snake_case name (as [`names`](Self::names) spells it).
    pub fn from_name(name: &str) -> Option<Self> {
        NAMED
            .iter()
            .find(|(_, known)| *known == name)
            .map(|(reason, _)| *reason)
    }

    /// Every name [`from_name`](Self::from_name) accepts, in bit order.
    pub fn all_names() -> impl Iterator<Item = &'static str> {
        NAMED.iter().map(|(_, name)| *name)
    }

    const fn known_bits() -> u64 {
        let mut bits = 0;
        let mut i = 0;
        while i < NAMED.len() {
            bits |= NAMED[i].0.0;
            i += 1;
        }
        bits
    }
}

impl BitOr for ThrottleReasons {
    type Output = Self;

    fn bitor(self, rhs: Self) -> Self {
        Self(self.0 | rhs.0)
    }
}

impl BitOrAssign for ThrottleReasons {
    fn bitor_assign(&mut self, rhs: Self) {
        self.0 |= rhs.0;
    }
}

impl fmt::Display for ThrottleReasons {
    /// `none`, or the names joined with ` | `.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_empty() {
            return f.write_str("none");
        }
        f.write_str(&self.names().join(" | "))
    }
}

impl fmt::Debug for ThrottleReasons {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ThrottleReasons({self} = {:#x})", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_unknown_bits_are_kept() {
        for name in ThrottleReasons::all_names() {
            let reason = ThrottleReasons::from_name(name).unwrap();
            assert_eq!(reason.names(), [name]);
        }
        let reasons = ThrottleReasons::from_bits(0x48 | 0x8000);
        assert_eq!(reasons.names(), ["hw_slowdown", "hw_thermal_slowdown", "unknown"]);
        assert_eq!(reasons.bits(), 0x8048);
        assert_eq!(reasons.to_string(), "hw_slowdown | hw_thermal_slowdown | unknown");
        assert_eq!(ThrottleReasons::NONE.to_string(), "none");
        assert_eq!(ThrottleReasons::from_name("thermal"), None);
    }

    #[test]
    fn thermal_and_power_classes() {
        assert!(ThrottleReasons::HW_THERMAL_SLOWDOWN.is_thermal());
        assert!(ThrottleReasons::SW_THERMAL_SLOWDOWN.is_thermal());
        assert!(!ThrottleReasons::HW_SLOWDOWN.is_thermal());
        assert!(ThrottleReasons::SW_POWER_CAP.is_power());
        assert!(ThrottleReasons::HW_POWER_BRAKE_SLOWDOWN.is_power());
        let idle = ThrottleReasons::GPU_IDLE;
        assert!(!idle.is_thermal() && !idle.is_power());
        assert_eq!(
            ThrottleReasons::SW_POWER_CAP | ThrottleReasons::GPU_IDLE,
            ThrottleReasons::from_bits(0x5)
        );
    }
}
