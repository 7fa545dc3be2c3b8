//! `skein plan` end to end: the binary plans the example workflows on fleet files, with
//! the reference models served by a mock Hugging Face Hub on loopback.

use std::path::Path;
use std::process::{Command, Output};

use skein_testkit::mock_hub::MockHub;

fn hub() -> MockHub {
    MockHub::start_in_background(skein_testkit::models::reference_hub_repos())
}

/// Runs `skein ARGS` in the repository root against `hub`, with `cache` as the Hugging
/// Face cache.
fn skein(hub: &MockHub, cache: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_skein"))
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(args)
        .env("HF_ENDPOINT", &hub.url)
        .env("HF_HOME", cache)
        .env("HF_HUB_CACHE", cache.join("hub"))
        .env_remove("HF_TOKEN")
        .env_remove("HF_TOKEN_PATH")
        .env_remove("HF_HUB_OFFLINE")
        .env_remove("RUST_LOG")
        .env("NO_COLOR", "1")
        .output()
        .expect("run skein")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn scratch() {
    let hub = hub();
    let cache = tempfile::tempdir().expect("a cache dir");
    for (wf, fleet) in [
        ("workflows/lab-research.yaml", "workflows/fleets/lab.yaml"),
        ("workflows/lab-research.yaml", "workflows/fleets/lab-busy.yaml"),
    ] {
        let out = skein(&hub, cache.path(), &["plan", wf, "--fleet", fleet, "--explain"]);
        eprintln!("{}\n{}", text(&out.stdout), text(&out.stderr));
    }
}
