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
    hub.environment(&mut Command::new(env!("CARGO_BIN_EXE_skein")), cache)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(args)
        .output()
        .expect("run skein")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

const WORKFLOWS: [&str; 3] = [
    "workflows/hello.yaml",
    "workflows/lab-research.yaml",
    "workflows/reflex-demo.yaml",
];

/// The reference fleet, the same with its A100s taken, a one-GPU laptop, eight
/// identical NVLink GPUs, and a very mixed fleet.
const FLEETS: [&str; 5] = [
    "workflows/fleets/lab.yaml",
    "workflows/fleets/lab-busy.yaml",
    "workflows/fleets/laptop.yaml",
    "workflows/fleets/dgx.yaml",
    "workflows/fleets/mixed.yaml",
];

fn stem(path: &str) -> &str {
    Path::new(path)
        .file_stem()
        .and_then(|s| s.to_str())
        .expect("a file name")
}

/// Every example workflow on every example fleet, with the explanations: the plans
/// users see, reviewed as snapshots.
#[test]
fn every_example_workflow_on_every_example_fleet() {
    let hub = hub();
    let cache = tempfile::tempdir().expect("a cache dir");
    for workflow in WORKFLOWS {
        for fleet in FLEETS {
            let out = skein(&hub, cache.path(), &["plan", workflow, "--fleet", fleet, "--explain"]);
            let stdout = text(&out.stdout);
            let admitted = stdout.lines().next().is_some_and(|l| l.contains(": admitted"));
            // Exit 0 when admitted, 1 when the workflow would queue.
            assert_eq!(
                out.status.code(),
                Some(if admitted { 0 } else { 1 }),
                "{stdout}\n{}",
                text(&out.stderr)
            );
            assert_eq!(text(&out.stderr), "", "{workflow} on {fleet}");
            insta::assert_snapshot!(format!("{}@{}", stem(workflow), stem(fleet)), stdout);
        }
    }
}

/// `--output json` is the plan object `POST /v1/plans` returns, estimates included.
#[test]
fn json_output_is_the_plan_object() {
    let hub = hub();
    let cache = tempfile::tempdir().expect("a cache dir");
    let out = skein(
        &hub,
        cache.path(),
        &[
            "plan",
            "workflows/lab-research.yaml",
            "--fleet",
            "workflows/fleets/lab.yaml",
            "--output",
            "json",
        ],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let plan: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(plan["workflow"], "lab-research");
    assert_eq!(plan["admitted"], true);
    let instances = plan["instances"].as_array().expect("instances");
    let coder = instances.iter().find(|i| i["instance"] == "coder").expect("the coder");
    assert_eq!(coder["precision"], "bf16");
    assert_eq!(coder["engine"], "vllm");
    assert!(coder["estimate"]["devices"].as_array().is_some_and(|d| !d.is_empty()));
    assert_eq!(coder["rejected"].as_array().map(Vec::len), Some(2));
    assert!(plan["search"]["complete"].as_bool().expect("complete"));
}

#[test]
fn bad_invocations_say_what_to_do() {
    let hub = hub();
    let cache = tempfile::tempdir().expect("a cache dir");
    let cases: [(&[&str], &str); 4] = [
        (&["plan", "workflows/hello.yaml"], "say where to plan: --fleet"),
        (
            &["plan", "workflows/hello.yaml", "--fleet", "workflows/fleets/nope.yaml"],
            "nope.yaml",
        ),
        (
            &[
                "plan",
                "tests/data/two-problems.yaml",
                "--fleet",
                "workflows/fleets/lab.yaml",
            ],
            "is not a valid workflow",
        ),
        (
            &[
                "plan",
                "workflows/hello.yaml",
                "--fleet",
                "workflows/fleets/lab.yaml",
                "--server",
                "http://127.0.0.1:1",
            ],
            "cannot be used with",
        ),
    ];
    for (args, expected) in cases {
        let out = skein(&hub, cache.path(), args);
        assert!(!out.status.success(), "{args:?}");
        let stderr = text(&out.stderr);
        assert!(stderr.contains(expected), "{args:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
}

/// A model the hub does not have: the error names it and what to check.
#[test]
fn a_model_missing_from_the_hub_is_named() {
    let hub = MockHub::start_in_background(Vec::new());
    let cache = tempfile::tempdir().expect("a cache dir");
    let out = skein(
        &hub,
        cache.path(),
        &["plan", "workflows/hello.yaml", "--fleet", "workflows/fleets/lab.yaml"],
    );
    assert!(!out.status.success());
    let stderr = text(&out.stderr);
    assert!(stderr.contains("Qwen/Qwen2.5-0.5B-Instruct"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}
