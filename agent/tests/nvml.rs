//! The NVML source on this machine. Without an NVIDIA driver (CI, laptops, this
//! project's build machines) discovery must say "no driver" — `Ok(None)` — without
//! panicking. On a machine with an NVIDIA GPU, `tests/gpu/run.sh` runs these with
//! `SKEIN_TEST_GPU=1`, which says a driver is expected, and `--include-ignored`, which
//! runs the real sampling check as well; a plain `cargo test` reports that check as
//! ignored, never as passed.

use skein_agent::gpu::{GpuSource, NO_DRIVER_MESSAGE, NvmlConfig, discover_nvml, discover_nvml_with};

/// Whether this machine is declared to have an NVIDIA driver (`SKEIN_TEST_GPU=1`).
fn gpu_expected() -> bool {
    std::env::var_os("SKEIN_TEST_GPU").is_some_and(|v| v == "1")
}

/// Discovery finds what the machine is declared to have: nothing (no driver) unless
/// `SKEIN_TEST_GPU=1`, then GPUs. Either way it asserts; it never passes unchecked.
#[test]
fn discovery_finds_a_driver_exactly_where_one_is_expected() {
    let found = discover_nvml().expect("discovery does not fail on this machine");
    if gpu_expected() {
        let source = found.expect("SKEIN_TEST_GPU=1, but NVML found no driver");
        assert!(!source.inventory().is_empty(), "{}", source.describe());
        return;
    }
    assert!(
        found.is_none(),
        "found an NVML source, {}: on a machine with an NVIDIA driver run tests/gpu/run.sh \
         (or set SKEIN_TEST_GPU=1)",
        found.as_ref().map(|s| s.describe()).unwrap_or_default()
    );
    // Twice in one process is fine too (nothing global is left half-initialised).
    assert!(discover_nvml().expect("second try").is_none());
    assert!(NO_DRIVER_MESSAGE.contains("libnvidia-ml.so.1"));
}

#[test]
#[ignore = "needs an NVIDIA GPU and driver: run tests/gpu/run.sh"]
fn real_gpus_sample_when_present() {
    let config = NvmlConfig {
        process_every: std::num::NonZeroU32::new(2).unwrap(),
    };
    let mut source = discover_nvml_with(config)
        .expect("NVML works")
        .expect("an NVIDIA driver (this test needs a GPU: run tests/gpu/run.sh on one)");
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
