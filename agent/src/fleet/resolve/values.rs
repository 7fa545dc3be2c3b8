//! The scalar values of a fleet file: sizes, percentages, rates, temperatures, power.

use crate::fleet::schema::RawScalar;

/// `"90%"` → 0.9 (0–100 %).
pub(super) fn percent(text: &str) -> Option<f64> {
    let number: f64 = text.trim().strip_suffix('%')?.trim().parse().ok()?;
    (0.0..=100.0).contains(&number).then_some(number / 100.0)
}

/// `"20GiB"`, `"512 MiB"`, `"1.5GB"`, `"1024B"` → bytes, as everywhere in Skein
/// ([`skein_text::parse_size`]).
pub(super) fn parse_size(text: &str) -> Option<f64> {
    skein_text::parse_size(text).map(|bytes| bytes as f64)
}

/// `"100Gbps"`, `"10Gb/s"`, `"25 Gbit/s"`, `"400mbps"` → bits per second. Prefixes are
/// decimal (1 Gbps is 10^9 bits per second) and, like the rest of the unit, of any case,
/// so `B` is a bit here too.
pub(super) fn parse_bandwidth(text: &str) -> Option<u64> {
    let text = text.trim();
    let split = text.find(|c: char| c.is_ascii_alphabetic())?;
    let (number, unit) = text.split_at(split);
    let number: f64 = number.trim().parse().ok()?;
    let unit = unit.trim().to_ascii_lowercase();
    let prefix = ["bps", "b/s", "bit/s", "bits/s"]
        .iter()
        .find_map(|per_second| unit.strip_suffix(per_second))?;
    let factor = match prefix {
        "" => 1.0,
        "k" => 1e3,
        "m" => 1e6,
        "g" => 1e9,
        "t" => 1e12,
        _ => return None,
    };
    let bits = number * factor;
    // `u64::MAX as f64` rounds up to 2^64, which no u64 holds.
    (bits.is_finite() && bits >= 0.0 && bits < u64::MAX as f64).then(|| bits.round() as u64)
}

pub(super) fn celsius(raw: &RawScalar) -> Option<f64> {
    match raw {
        RawScalar::Number(n) if (-40.0..=150.0).contains(n) => Some(*n),
        _ => None,
    }
}

pub(super) fn watts(raw: &RawScalar) -> Option<f64> {
    match raw {
        RawScalar::Number(n) if n.is_finite() => Some(*n),
        RawScalar::Text(text) => text
            .trim()
            .strip_suffix('W')?
            .trim()
            .parse()
            .ok()
            .filter(|w: &f64| w.is_finite()),
        _ => None,
    }
}

pub(super) fn whole_in(raw: &RawScalar, min: u64, max: u64) -> Option<u64> {
    match raw {
        RawScalar::Number(n) if n.fract() == 0.0 && *n >= min as f64 && *n <= max as f64 => Some(*n as u64),
        _ => None,
    }
}

pub(super) fn parse_cc(text: &str) -> Option<(u32, u32)> {
    let (major, minor) = text.trim().split_once('.').unwrap_or((text.trim(), "0"));
    Some((major.parse().ok()?, minor.parse().ok()?))
}

pub(super) fn whole_mw(watts: f64) -> u32 {
    u32::try_from((watts * 1000.0).round().max(0.0) as u64).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::super::MIB;
    use super::*;

    #[test]
    fn sizes_and_percentages() {
        assert_eq!(parse_size("20GiB"), Some(20.0 * 1024.0 * MIB));
        assert_eq!(parse_size("512 MiB"), Some(512.0 * MIB));
        assert_eq!(parse_size("1.5GB"), Some(1.5e9));
        assert_eq!(parse_size("20"), None);
        assert_eq!(parse_size("20 parsecs"), None);
        assert_eq!(percent("90%"), Some(0.9));
        assert_eq!(percent("190%"), None);
        assert_eq!(parse_cc("8.9"), Some((8, 9)));
        assert_eq!(parse_cc("9"), Some((9, 0)));
    }

    #[test]
    fn bandwidths_are_decimal_bits_per_second_in_any_case() {
        assert_eq!(parse_bandwidth("100Gbps"), Some(100_000_000_000));
        assert_eq!(parse_bandwidth("10Gb/s"), Some(10_000_000_000));
        assert_eq!(parse_bandwidth("25 Gbit/s"), Some(25_000_000_000));
        assert_eq!(parse_bandwidth("400Mbps"), Some(400_000_000));
        assert_eq!(parse_bandwidth(" 400 MBPS "), Some(400_000_000));
        assert_eq!(parse_bandwidth("2.5gbits/s"), Some(2_500_000_000));
        assert_eq!(parse_bandwidth("1.6Tbps"), Some(1_600_000_000_000));
        assert_eq!(parse_bandwidth("56kbps"), Some(56_000));
        assert_eq!(parse_bandwidth("9600bps"), Some(9_600));
        assert_eq!(parse_bandwidth("0Gbps"), Some(0));
        assert_eq!(parse_bandwidth("100"), None);
        assert_eq!(parse_bandwidth("10GB"), None);
        assert_eq!(parse_bandwidth("10GiB/s"), None);
        assert_eq!(parse_bandwidth("Gbps"), None);
        assert_eq!(parse_bandwidth("-10Gbps"), None);
        assert_eq!(parse_bandwidth("100000000000Tbps"), None);
    }
}
