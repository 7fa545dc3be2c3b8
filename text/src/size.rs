//! Memory sizes as people write them.

use std::str::FromStr;

/// A memory size written with a unit, in bytes: `24GiB`, `80 GB`, `512MiB`, `1.5GB`,
/// `1024B`. Units are those of the `bytesize` crate, in any case: decimal (`B`, `kB`,
/// `MB`, `GB`, `TB`, `PB`, `EB`, or just `k`, `M`, `G`, …) and binary (`KiB`, `MiB`,
/// `GiB`, `TiB`, `PiB`, `EiB`, or `Ki`, `Mi`, …), with or without a space before the
/// unit. Fractions are rounded down to whole bytes.
///
/// `None` for a bare number, which would be ambiguous (bytes? gigabytes?), a negative
/// number or an unknown unit. Zero is a size: callers that need memory check for it.
pub fn parse_size(text: &str) -> Option<u64> {
    let text = text.trim();
    if !text.ends_with(|c: char| c.is_ascii_alphabetic()) {
        return None;
    }
    bytesize::ByteSize::from_str(text).ok().map(|size| size.as_u64())
}

#[cfg(test)]
mod tests {
    use super::parse_size;

    const MIB: u64 = 1 << 20;

    #[test]
    fn sizes_need_a_unit() {
        assert_eq!(parse_size("20GiB"), Some(20 * 1024 * MIB));
        assert_eq!(parse_size("512 MiB"), Some(512 * MIB));
        assert_eq!(parse_size(" 80 GB "), Some(80_000_000_000));
        assert_eq!(parse_size("1.5GB"), Some(1_500_000_000));
        assert_eq!(parse_size("1024B"), Some(1024));
        assert_eq!(parse_size("24gib"), Some(24 * 1024 * MIB));
        assert_eq!(parse_size("0GB"), Some(0));
        for bad in ["20", "+20", "20 parsecs", "-5GB", "GB", "", "5 GB!"] {
            assert_eq!(parse_size(bad), None, "{bad}");
        }
    }
}
