//! Every telemetry model, and the metrics derived from them, at chosen times. A
//! simulated reading is a pure function of the fleet file and `t`, so each check
//! builds a one-node fleet in memory and samples it.

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};

use skein_agent::fleet::parse_fleet;
use skein_agent::gpu::{GpuSample, GpuSource, ThrottleReasons};
use skein_agent::sim::SimulatedSource;

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

/// A one-node fleet: `gpus` and `telemetry` are YAML flow mappings; `files` are the
/// CSV files a `replay` may read (by name, relative to the fleet file).
fn node_with(gpus: &str, telemetry: &str, files: &[(&str, &str)]) -> SimulatedSource {
    let text = format!("fleet: test\nnodes:\n  n:\n    gpus: {gpus}\n    telemetry: {telemetry}\n");
    let files: BTreeMap<PathBuf, String> = files
        .iter()
        .map(|(name, text)| (Path::new("fleets").join(name), (*text).to_owned()))
        .collect();
    let mut read = |path: &Path| {
        files
            .get(path)
            .cloned()
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "no such file"))
    };
    let fleet = parse_fleet("fleets/test.yaml", &text, Path::new("fleets"), &mut read)
        .unwrap_or_else(|e| panic!("{text}\n{e}"));
    fleet.node("n").unwrap()
}

fn a100(telemetry: &str) -> SimulatedSource {
    node_with("{ model: A100-80GB }", telemetry, &[])
}

fn at(source: &SimulatedSource, t: f64) -> GpuSample {
    source.sample_at(t).remove(0)
}

/// `(t, metric)` pairs of one metric of GPU 0.
fn series<T>(source: &SimulatedSource, times: &[f64], metric: impl Fn(&GpuSample) -> T) -> Vec<(f64, T)> {
    times.iter().map(|&t| (t, metric(&at(source, t)))).collect()
}

fn util(s: &GpuSample) -> u32 {
    s.utilization_pct.unwrap()
}

#[test]
fn idle_card_reports_its_idle_figures() {
    let sample = at(&a100("{}"), 0.0);
    assert_eq!(
        sample,
        GpuSample {
            index: 0,
            // 1.5 % of 80 GiB, whole MiB.
            memory_used: 1229 * MIB,
            memory_free: (81_920 - 1229) * MIB,
            utilization_pct: Some(0),
            memory_utilization_pct: Some(0),
            temperature_c: Some(32),
            power_mw: Some(55_000),
            sm_clock_mhz: Some(210),
            throttle: ThrottleReasons::GPU_IDLE,
            ecc_corrected: Some(0),
            ecc_uncorrected: Some(0),
            foreign_memory: Some(0),
        }
    );
    // `idle` written out is the same card.
    assert_eq!(
        at(&a100("{ utilization: idle, temperature: idle, power: idle }"), 5.0),
        sample
    );
    // A card without ECC memory reports no ECC counters.
    let rtx = node_with("{ model: RTX4090-24GB }", "{}", &[]);
    assert_eq!(at(&rtx, 0.0).ecc_corrected, None);
}

#[test]
fn constant_and_shorthand() {
    let source = a100("{ utilization: { constant: 0.5 }, temperature: 61, memory_used: 40GiB }");
    let sample = at(&source, 100.0);
    assert_eq!(sample.utilization_pct, Some(50));
    assert_eq!(sample.temperature_c, Some(61));
    assert_eq!(sample.memory_used, 40 * GIB);
    // Percentages and MiB are accepted too.
    let source = a100("{ utilization: \"25%\", memory_used: \"50%\", foreign_memory: 1024 }");
    let sample = at(&source, 0.0);
    assert_eq!(sample.utilization_pct, Some(25));
    assert_eq!(sample.memory_used, 40 * GIB + GIB);
    assert_eq!(sample.foreign_memory, Some(GIB));
}

#[test]
fn ramp() {
    let source = a100("{ utilization: { ramp: { from: 0.1, to: 0.9, over: 60s, start: 10s } } }");
    assert_eq!(
        series(&source, &[0.0, 10.0, 25.0, 40.0, 70.0, 1000.0], util),
        [(0.0, 10), (10.0, 10), (25.0, 30), (40.0, 50), (70.0, 90), (1000.0, 90)]
    );
}

#[test]
fn square() {
    let source = a100("{ utilization: { square: { low: 0.05, high: 0.9, period: 30s } } }");
    assert_eq!(
        series(&source, &[0.0, 14.9, 15.0, 29.9, 30.0, 45.0], util),
        [(0.0, 90), (14.9, 90), (15.0, 5), (29.9, 5), (30.0, 90), (45.0, 5)]
    );
    let source = a100("{ utilization: { square: { low: 0, high: 1, period: 1m, duty: 0.25 } } }");
    assert_eq!(
        series(&source, &[0.0, 14.0, 15.0, 59.0, 60.0], util),
        [(0.0, 100), (14.0, 100), (15.0, 0), (59.0, 0), (60.0, 100)]
    );
}

#[test]
fn spike() {
    let source = a100("{ temperature: { spike: { base: 45, peak: 92, at: 60s, duration: 10s } } }");
    let temperature = |s: &GpuSample| s.temperature_c.unwrap();
    assert_eq!(
        series(&source, &[0.0, 59.0, 60.0, 69.0, 70.0], temperature),
        [(0.0, 45), (59.0, 45), (60.0, 92), (69.0, 92), (70.0, 45)]
    );
}

#[test]
fn replay_interpolates_and_holds_or_loops() {
    let csv = "time,gpu_util,power\n0,10,100\n10,50,200\n20,30,150\n";
    let hold = node_with(
        "{ model: A100-80GB }",
        "{ utilization: { replay: { csv: trace.csv, column: gpu_util, scale: 0.01 } } }",
        &[("trace.csv", csv)],
    );
    assert_eq!(
        series(&hold, &[0.0, 5.0, 10.0, 15.0, 20.0, 100.0], util),
        [(0.0, 10), (5.0, 30), (10.0, 50), (15.0, 40), (20.0, 30), (100.0, 30)]
    );
    let looped = node_with(
        "{ model: A100-80GB }",
        "{ utilization: { replay: { csv: trace.csv, column: gpu_util, scale: 0.01, loop: true } } }",
        &[("trace.csv", csv)],
    );
    assert_eq!(
        series(&looped, &[25.0, 30.0, 45.0], util),
        [(25.0, 30), (30.0, 50), (45.0, 30)]
    );
    // A column in another unit: watts, with its own time column name.
    let watts = node_with(
        "{ model: A100-80GB }",
        "{ power: { replay: { csv: w.csv, column: w, time_column: t } } }",
        &[("w.csv", "t,w\n0,100\n4,300\n")],
    );
    assert_eq!(at(&watts, 1.0).power_mw, Some(150_000));
}

#[test]
fn throttle_model_adds_named_reasons() {
    let source = a100(
        "{ utilization: 0.5, throttle: { spike: { base: none, peak: [sw_thermal_slowdown, sync_boost], at: 10s, duration: 5s } } }",
    );
    assert_eq!(at(&source, 0.0).throttle, ThrottleReasons::NONE);
    let during = at(&source, 12.0).throttle;
    assert_eq!(during.names(), ["sync_boost", "sw_thermal_slowdown"]);
    assert!(during.is_thermal());
    let replayed = node_with(
        "{ model: A100-80GB }",
        "{ utilization: 0.5, throttle: { replay: { csv: th.csv, column: bits } } }",
        &[("th.csv", "time,bits\n0,0\n10,4\n")],
    );
    // Bit sets are not interpolated: the earlier row holds until the next.
    assert_eq!(at(&replayed, 9.9).throttle, ThrottleReasons::NONE);
    assert_eq!(at(&replayed, 10.0).throttle, ThrottleReasons::SW_POWER_CAP);
}

#[test]
fn ecc_and_sm_clock_models() {
    let source =
        a100("{ ecc_corrected: { ramp: { from: 0, to: 100, over: 100s } }, ecc_uncorrected: 2, sm_clock: 1000 }");
    let sample = at(&source, 42.0);
    assert_eq!(sample.ecc_corrected, Some(42));
    assert_eq!(sample.ecc_uncorrected, Some(2));
    assert_eq!(sample.sm_clock_mhz, Some(1000));
}

#[test]
fn power_follows_utilization_and_temperature_follows_power() {
    // A100: 55 W idle, 400 W limit; 32 °C idle, 70 °C at the limit.
    let source = a100("{ utilization: { ramp: { from: 0, to: 1, over: 100s } } }");
    let power = |s: &GpuSample| (s.power_mw.unwrap(), s.temperature_c.unwrap(), s.sm_clock_mhz.unwrap());
    assert_eq!(
        series(&source, &[0.0, 50.0, 100.0], power),
        [
            (0.0, (55_000, 32, 210)),
            (50.0, (227_500, 51, 1410)),
            (100.0, (400_000, 70, 1269))
        ]
    );
    // At the limit the power cap is reported (and clocks drop); idle is reported at 0 %.
    assert_eq!(at(&source, 100.0).throttle, ThrottleReasons::SW_POWER_CAP);
    assert!(at(&source, 100.0).throttle.is_power());
    assert_eq!(at(&source, 0.0).throttle, ThrottleReasons::GPU_IDLE);
    assert_eq!(at(&source, 50.0).throttle, ThrottleReasons::NONE);
    // The memory-bandwidth figure follows utilization unless modelled.
    assert_eq!(at(&source, 50.0).memory_utilization_pct, Some(25));
    // A given power is capped at the limit; temperature still follows it.
    let capped = a100("{ power: 900 }");
    assert_eq!(at(&capped, 0.0).power_mw, Some(400_000));
    assert_eq!(at(&capped, 0.0).temperature_c, Some(70));
}

#[test]
fn heat_sets_thermal_slowdown() {
    let source = a100("{ utilization: 0.6, temperature: { spike: { base: 60, peak: 90, at: 60s, duration: 10s } } }");
    let cool = at(&source, 0.0);
    let hot = at(&source, 65.0);
    assert!(!cool.throttle.is_thermal());
    assert_eq!(
        hot.throttle,
        ThrottleReasons::HW_SLOWDOWN | ThrottleReasons::HW_THERMAL_SLOWDOWN
    );
    assert!(hot.throttle.is_thermal());
    assert_eq!(hot.sm_clock_mhz, Some(705));
    // The threshold is 87 °C unless the group says otherwise.
    let custom = node_with(
        "{ model: A100-80GB, slowdown_temperature: 95 }",
        "{ temperature: 90 }",
        &[],
    );
    assert!(!at(&custom, 0.0).throttle.is_thermal());
}

#[test]
fn foreign_memory_adds_to_used_and_is_reported() {
    let source = a100("{ memory_used: 30GiB, foreign_memory: { ramp: { from: 0, to: 10GiB, over: 10m } } }");
    let start = at(&source, 0.0);
    let later = at(&source, 300.0);
    assert_eq!((start.memory_used, start.foreign_memory), (30 * GIB, Some(0)));
    assert_eq!((later.memory_used, later.foreign_memory), (35 * GIB, Some(5 * GIB)));
    assert_eq!(later.memory_used + later.memory_free, 81_920 * MIB);
    // Used memory never exceeds the card.
    let full = a100("{ memory_used: 80GiB, foreign_memory: 10GiB }");
    assert_eq!(
        (at(&full, 0.0).memory_used, at(&full, 0.0).memory_free),
        (81_920 * MIB, 0)
    );
}

#[test]
fn per_gpu_overrides_replace_the_node_default() {
    let source = node_with(
        "{ model: RTX4090-24GB, count: 3 }",
        "{ utilization: 0.2, per_gpu: { 1: { utilization: 0.8 }, 2: { temperature: 90 } } }",
        &[],
    );
    let samples = source.sample_at(0.0);
    let utils: Vec<_> = samples.iter().map(util).collect();
    assert_eq!(utils, [20, 80, 20]);
    assert!(samples[2].throttle.is_thermal());
    assert!(!samples[0].throttle.is_thermal());
}

#[test]
fn custom_cards_and_mixed_groups() {
    let source = node_with(
        "[{ model: L40S-48GB, count: 2, nvlink: [[0, 1]] }, { name: NVIDIA RTX 6000 Ada Generation, memory: 48GiB, compute_capability: \"8.9\", power_limit: 300W, pcie: { generation: 4, width: 16 }, ecc: true }]",
        "{}",
        &[],
    );
    let gpus = source.inventory();
    assert_eq!(gpus.len(), 3);
    assert_eq!(gpus[0].nvlink_peers, [gpus[1].uuid.clone()]);
    assert_eq!(gpus[2].name, "NVIDIA RTX 6000 Ada Generation");
    assert_eq!(gpus[2].memory_total, 48 * GIB);
    assert_eq!(gpus[2].compute_capability, Some((8, 9)));
    assert_eq!(gpus[2].power_limit_mw, Some(300_000));
    assert!(gpus[2].nvlink_peers.is_empty());
    assert_eq!(at(&source, 0.0).ecc_corrected, Some(0));
}

#[test]
fn sampling_is_deterministic_and_matches_the_trait() {
    let fleet =
        skein_agent::load_fleet(Path::new(env!("CARGO_MANIFEST_DIR")).join("../workflows/fleets/lab.yaml")).unwrap();
    let mut source = fleet.node("rtx-1").unwrap();
    let times = [0.0, 20.0, 65.0];
    let pure: Vec<Vec<GpuSample>> = times.iter().map(|&t| source.sample_at(t)).collect();
    let through_trait: Vec<Vec<GpuSample>> = times
        .iter()
        .map(|&t| source.sample(t).into_iter().map(Result::unwrap).collect())
        .collect();
    assert_eq!(pure, through_trait);
    insta::assert_yaml_snapshot!("rtx-1_at_0s_20s_65s", pure);
}
