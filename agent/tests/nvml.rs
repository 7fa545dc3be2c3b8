//! The NVML source on this machine. Without an NVIDIA driver (CI, laptops, this
//! project's build machines) discovery must say "no driver" — `Ok(None)` — without
//! panicking. Where a GPU exists, set `SKEIN_TEST_GPU=1` to check the real source.

use skein_agent::gpu::{GpuSource, NO_DRIVER_MESSAGE, NvmlConfig, discover_nvml, discover_nvml_with};

fn gpu_expected() -> bool {
    std::env::var_os("SKEIN_TEST_GPU").is_some_and(|v| v == "1")
}

#[test]
fn discovery_without_a_driver_is_ok_none() {
    if gpu_expected() {
        return;
    }
    let found = discover_nvml().expect("no error without a driver");
    assert!(found.is_none(), "found an NVML source: {found:?}");
    // Twice in one process is fine too (nothing global is left half-initialised).
    assert!(discover_nvml().expect("second try").is_none());
    assert!(NO_DRIVER_MESSAGE.contains("libnvidia-ml.so.1"));
}

#[test]
fn real_gpus_sample_when_present() {
    if !gpu_expected() {
        return;
    }
    let config = NvmlConfig {
        process_every: std::num::NonZeroU32::new(2).unwrap(),
    };
    let mut source = discover_nvml_with(config).expect("NVML works").expect("a driver");
    assert!(!source.inventory().is_empty(), "{}", source.describe());
    source.set_own_pids(&[std::process::id()]);
    let first = source.sample(0.0);
    let second = source.sample(1.0);
    assert_eq!(first.len(), source.inventory().len());
    for (info, sample) in source.inventory().iter().zip(&first) {
        let sample = sample.as_ref().expect("sampled");
        assert_eq!(sample.index, info.index);
        assert!(sample.memory_used <= info.memory_total);
        assert!(
            sample.foreign_memory.is_some(),
            "processes are listed on the first sample"
        );
        assert!(!info.simulated);
    }
    for sample in second.iter().flatten() {
        assert!(sample.foreign_memory.is_none(), "and not on the second");
    }
}
