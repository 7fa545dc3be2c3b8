//! A byte count with checked arithmetic and human-readable display.

use std::fmt;

use serde::{Deserialize, Serialize};

/// A number of bytes.
///
/// Every memory figure in Skein (weights, KV cache, free GPU memory) is a `Bytes`, so a
/// byte count cannot be mixed up with an element count or a number of MiB. Arithmetic is
/// checked: an estimate that overflows is refused rather than wrapped.
///
/// `Display` uses binary units with one decimal (`"14.2 GiB"`); `{:?}` and serde show the
/// plain integer, which is what machines should exchange.
///
/// ```
/// use skein_model_registry::Bytes;
///
/// let weights = Bytes::new(15_237_000_000);
/// assert_eq!(weights.to_string(), "14.2 GiB");
/// assert_eq!(serde_json::to_string(&weights).unwrap(), "15237000000");
/// ```
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Bytes(u64);

/// Binary unit names above bytes; `u64::MAX` is just under 16 EiB, so EiB is the last.
const UNITS: [&str; 6] = ["KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];

impl Bytes {
    /// Zero bytes.
    pub const ZERO: Bytes = Bytes(0);
    /// One kibibyte (1024 bytes).
    pub const KIB: Bytes = Bytes(1 << 10);
    /// One mebibyte (1024 KiB).
    pub const MIB: Bytes = Bytes(1 << 20);
    /// One gibibyte (1024 MiB).
    pub const GIB: Bytes = Bytes(1 << 30);

    /// Wraps a raw byte count.
    pub const fn new(bytes: u64) -> Self {
        Bytes(bytes)
    }

    /// The raw byte count.
    pub const fn get(self) -> u64 {
        self.0
    }

    /// `self + other`, or `None` on overflow.
    pub const fn checked_add(self, other: Bytes) -> Option<Bytes> {
        match self.0.checked_add(other.0) {
            Some(sum) => Some(Bytes(sum)),
            None => None,
        }
    }

    /// `self - other`, or `None` if `other` is larger.
    pub const fn checked_sub(self, other: Bytes) -> Option<Bytes> {
        match self.0.checked_sub(other.0) {
            Some(difference) => Some(Bytes(difference)),
            None => None,
        }
    }

    /// `self * factor` (for example, bytes per layer times layers), or `None` on overflow.
    pub const fn checked_mul(self, factor: u64) -> Option<Bytes> {
        match self.0.checked_mul(factor) {
            Some(product) => Some(Bytes(product)),
            None => None,
        }
    }
}

impl From<u64> for Bytes {
    fn from(bytes: u64) -> Self {
        Bytes(bytes)
    }
}

impl From<Bytes> for u64 {
    fn from(bytes: Bytes) -> Self {
        bytes.0
    }
}

impl fmt::Display for Bytes {
    /// Below 1 KiB: the exact count (`"512 B"`). Otherwise the largest binary unit that
    /// keeps the value at least 1, rounded to one decimal (`"1.5 KiB"`, `"14.2 GiB"`).
    /// Honours width and alignment (`{:>10}`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let bytes = u128::from(self.0);
        if bytes < 1024 {
            return f.pad(&format!("{bytes} B"));
        }
        let mut index = 0;
        let mut unit: u128 = 1024;
        while index + 1 < UNITS.len() && bytes >= unit * 1024 {
            unit *= 1024;
            index += 1;
        }
        // Integer rounding to tenths avoids float error; u128 cannot overflow here.
        let mut tenths = (bytes * 10 + unit / 2) / unit;
        // 1023.96 KiB rounds to 1024.0 KiB; show it as 1.0 MiB instead.
        if tenths >= 10 * 1024 && index + 1 < UNITS.len() {
            unit *= 1024;
            index += 1;
            tenths = (bytes * 10 + unit / 2) / unit;
        }
        f.pad(&format!("{}.{} {}", tenths / 10, tenths % 10, UNITS[index]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn check_display(bytes: u64, expected: &str) {
        assert_eq!(Bytes::new(bytes).to_string(), expected, "{bytes} bytes");
    }

    #[test]
    fn display_uses_binary_units() {
        check_display(0, "0 B");
        check_display(1, "1 B");
        check_display(1023, "1023 B");
        check_display(1024, "1.0 KiB");
        check_display(1536, "1.5 KiB");
        check_display(10 * 1024 * 1024, "10.0 MiB");
        check_display(15_237_000_000, "14.2 GiB");
        check_display(80 * (1 << 30), "80.0 GiB");
        check_display(1 << 40, "1.0 TiB");
        check_display(1 << 50, "1.0 PiB");
        check_display(1 << 60, "1.0 EiB");
        check_display(u64::MAX, "16.0 EiB");
    }

    #[test]
    fn display_rounds_to_the_nearest_tenth() {
        // 1.04 KiB rounds down, 1.05 KiB rounds up (half away from zero).
        check_display(1065, "1.0 KiB"); // 1.0400 KiB
        check_display(1076, "1.1 KiB"); // 1.0508 KiB
        check_display(1024 * 1024 - 1, "1.0 MiB"); // 1023.999 KiB
        check_display(1024 * 1024 - 52, "1023.9 KiB"); // 1023.949 KiB
    }

    #[test]
    fn display_honours_width() {
        assert_eq!(format!("{:>9}", Bytes::new(1536)), "  1.5 KiB");
        assert_eq!(format!("{:<6}|", Bytes::new(7)), "7 B   |");
    }

    #[test]
    fn checked_arithmetic_refuses_overflow() {
        let max = Bytes::new(u64::MAX);
        assert_eq!(max.checked_add(Bytes::new(1)), None);
        assert_eq!(max.checked_mul(2), None);
        assert_eq!(Bytes::ZERO.checked_sub(Bytes::new(1)), None);
        assert_eq!(
            Bytes::GIB.checked_add(Bytes::MIB),
            Some(Bytes::new((1 << 30) + (1 << 20)))
        );
        assert_eq!(Bytes::KIB.checked_mul(1024), Some(Bytes::MIB));
        assert_eq!(Bytes::MIB.checked_sub(Bytes::KIB), Some(Bytes::new(1023 * 1024)));
    }

    #[test]
    fn serde_is_a_plain_integer() {
        let json = serde_json::to_string(&Bytes::new(42)).unwrap();
        assert_eq!(json, "42");
        let back: Bytes = serde_json::from_str("18446744073709551615").unwrap();
        assert_eq!(back, Bytes::new(u64::MAX));
        assert!(serde_json::from_str::<Bytes>("-1").is_err());
        assert!(serde_json::from_str::<Bytes>("\"42\"").is_err());
    }

    proptest! {
        #[test]
        fn display_is_a_small_number_and_a_unit(bytes in any::<u64>()) {
            let shown = Bytes::new(bytes).to_string();
            let (number, unit) = shown.split_once(' ').unwrap();
            let number: f64 = number.parse().unwrap();
            if bytes < 1024 {
                prop_assert_eq!(unit, "B");
                prop_assert_eq!(number, bytes as f64);
            } else {
                prop_assert!(UNITS.contains(&unit));
                prop_assert!((1.0..1024.0).contains(&number), "{}", shown);
            }
        }
    }
}
