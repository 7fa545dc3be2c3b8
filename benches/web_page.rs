//! The web page's cost on a large fleet, in Debian's headless Chromium (playwright-core,
//! `web/tests/bench.mjs`): `skein up --fleet` on the reference fleet (14 GPUs, the
//! baseline) and on a generated fleet of 125 nodes × 8 A100s (1,000 GPUs) whose load is
//! a square wave, every node expanded, agents sampling every second. For each: the time
//! from opening the page to every GPU drawn, the layout (ELK), and over 30 s of live
//! updates the time each update takes to redraw and the frame interval (16.7 ms is
//! 60 frames a second).
//!
//! `cargo bench --bench web_page` (needs what `web/tests/install.sh` installs; it runs
//! it). `WEB_PAGE_SECONDS=N` sets how long updates are watched.

use std::path::Path;
use std::process::Command;

use serde_json::Value;
use skein_testkit::lab::Lab;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// 125 nodes of 8 NVLinked A100s on 100 Gb/s, busy 15 s of every 30 s.
fn big_fleet() -> String {
    let mut text = String::from("fleet: thousand\nnodes:\n");
    for i in 0..125 {
        text.push_str(&format!(
            "  n{i:03}:\n    gpus: {{ model: A100-80GB, count: 8, nvlink: all }}\n    host: {{ network: 100Gbps }}\n    telemetry:\n      utilization: {{ square: {{ low: 0.1, high: 0.9, period: 30s }} }}\n"
        ));
    }
    text
}

fn measure(fleet: &Path, gpus: usize, seconds: &str) -> Value {
    let lab = Lab::new(env!("CARGO_BIN_EXE_skein")).sample_interval("1s");
    let _up = lab.up(fleet);
    let output = Command::new("node")
        .arg(Path::new(ROOT).join("web/tests/bench.mjs"))
        .current_dir(Path::new(ROOT).join("web/tests"))
        .env("SKEIN_API", lab.api())
        .env("SKEIN_ADMIN_TOKEN", lab.token())
        .env("SKEIN_GPUS", gpus.to_string())
        .env("SKEIN_SECONDS", seconds)
        .output()
        .expect("node runs web/tests/bench.mjs");
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "bench.mjs failed:\n{text}\n{}\n{}",
        String::from_utf8_lossy(&output.stderr),
        lab.logs(30)
    );
    serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("{e}: {text}"))
}

fn main() {
    let root = Path::new(ROOT);
    let install = Command::new("bash")
        .arg(root.join("web/tests/install.sh"))
        .status()
        .unwrap();
    assert!(install.success(), "web/tests/install.sh failed");
    let seconds = std::env::var("WEB_PAGE_SECONDS").unwrap_or_else(|_| "30".to_owned());
    let dir = tempfile::tempdir().unwrap();
    let big = dir.path().join("thousand.yaml");
    std::fs::write(&big, big_fleet()).unwrap();
    let baseline = measure(&root.join("workflows/fleets/lab.yaml"), 14, &seconds);
    let large = measure(&big, 1000, &seconds);
    println!(
        "| fleet | GPUs | page to all GPUs drawn | layout | redraws | redraw median | redraw p99 | frame median | frame p99 |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    for (name, m) in [("reference (lab.yaml)", &baseline), ("125 × 8 A100", &large)] {
        println!(
            "| {name} | {} | {} ms | {} ms | {} | {:.2} ms | {:.2} ms | {:.1} ms | {:.1} ms |",
            m["gpus"],
            m["shown_ms"],
            m["layout_ms"],
            m["draws"],
            m["draw_median_ms"].as_f64().unwrap_or(f64::NAN),
            m["draw_p99_ms"].as_f64().unwrap_or(f64::NAN),
            m["frame_median_ms"].as_f64().unwrap_or(f64::NAN),
            m["frame_p99_ms"].as_f64().unwrap_or(f64::NAN),
        );
    }
    let ratio =
        large["draw_median_ms"].as_f64().unwrap_or(f64::NAN) / baseline["draw_median_ms"].as_f64().unwrap_or(f64::NAN);
    println!("redraw median, 1,000 GPUs over 14: {ratio:.1}×");
}
