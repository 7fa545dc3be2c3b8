//! Simulated GPU identities.

use crate::gpu::format_uuid;

/// A deterministic NVML-shaped UUID for GPU `index` of `node` in `fleet`: the same
/// names give the same identity on every start and every machine.
pub(super) fn simulated_uuid(fleet: &str, node: &str, index: u32) -> String {
    let key = format!("skein-sim\0{fleet}\0{node}\0{index}");
    let high = mix(fnv1a(key.as_bytes(), 0xcbf2_9ce4_8422_2325));
    let low = mix(fnv1a(key.as_bytes(), 0x6c62_272e_07bb_0142));
    let mut bytes = [0u8; 16];
    let (first, second) = bytes.split_at_mut(8);
    first.copy_from_slice(&high.to_be_bytes());
    second.copy_from_slice(&low.to_be_bytes());
    format_uuid(bytes)
}

/// FNV-1a, 64 bits, from `seed` (stable across Rust versions, unlike `DefaultHasher`).
fn fnv1a(bytes: &[u8], seed: u64) -> u64 {
    bytes.iter().fold(seed, |hash, &b| {
        (hash ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// splitmix64's finaliser: spreads FNV's weak high bits.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuids_are_stable_and_distinct() {
        let a = simulated_uuid("lab", "rtx-1", 0);
        assert_eq!(a, simulated_uuid("lab", "rtx-1", 0));
        assert_ne!(a, simulated_uuid("lab", "rtx-1", 1));
        assert_ne!(a, simulated_uuid("lab", "rtx-2", 0));
        assert_ne!(a, simulated_uuid("lab2", "rtx-1", 0));
        assert_eq!(a.len(), "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx".len());
    }
}
