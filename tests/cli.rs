//! The real `skein` binary, run as a process: exit codes, human and JSON
//! output of `skein validate`.

use std::path::Path;
use std::process::{Command, Output};

fn skein(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_skein"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env("NO_COLOR", "1")
        .output()
        .expect("skein runs")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn every_example_workflow_validates() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("workflows");
    let mut files: Vec<String> = std::fs::read_dir(&dir)
        .expect("workflows/")
        .filter_map(|e| e.ok())
        .map(|e| format!("workflows/{}", e.file_name().to_string_lossy()))
        .filter(|n| n.ends_with(".yaml") || n.ends_with(".rhai"))
        .collect();
    files.sort();
    let mut args = vec!["validate"];
    args.extend(files.iter().map(String::as_str));
    let out = skein(&args);
    assert_eq!(out.status.code(), Some(0), "stderr:\n{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    for f in &files {
        assert!(stdout.contains(&format!("ok {f}")), "{f} not reported ok:\n{stdout}");
    }
}

#[test]
fn a_bad_file_reports_every_problem_and_exits_1() {
    let out = skein(&["validate", "tests/data/two-problems.yaml"]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = text(&out.stderr);
    // Both problems, each with file:line:col, the hint, and the summary.
    assert!(stderr.contains("tests/data/two-problems.yaml:4:5"), "{stderr}");
    assert!(stderr.contains("did you mean `model`?"), "{stderr}");
    assert!(stderr.contains("tests/data/two-problems.yaml:6:23"), "{stderr}");
    assert!(stderr.contains("did you mean `helper`?"), "{stderr}");
    assert!(
        stderr.contains("invalid tests/data/two-problems.yaml: 2 errors"),
        "{stderr}"
    );
}

#[test]
fn json_output_is_machine_readable() {
    let out = skein(&[
        "validate",
        "--output",
        "json",
        "tests/data/two-problems.yaml",
        "workflows/hello.yaml",
    ]);
    assert_eq!(out.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON on stdout");
    assert_eq!(v["valid"], false);
    let bad = &v["files"][0];
    assert_eq!(bad["valid"], false);
    let first = &bad["diagnostics"][0];
    assert_eq!(first["code"], "unknown-key");
    assert_eq!(first["line"], 4);
    assert_eq!(first["column"], 5);
    assert_eq!(first["help"], "did you mean `model`?");
    assert_eq!(v["files"][1]["valid"], true);
}

#[test]
fn print_ir_shows_the_workflow() {
    let out = skein(&["validate", "--output", "json", "--print-ir", "workflows/hello.yaml"]);
    assert_eq!(out.status.code(), Some(0));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(
        v["files"][0]["workflow"]["agents"]["helper"]["backend"]["model"]["repo"],
        "Qwen/Qwen2.5-0.5B-Instruct"
    );
}

#[test]
fn unreadable_files_and_bad_usage_exit_2() {
    let out = skein(&["validate", "does/not/exist.yaml"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("cannot read workflow file does/not/exist.yaml"),
        "{}",
        text(&out.stderr)
    );

    let out = skein(&["validate", "Cargo.toml"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("must end in .yaml, .yml or .rhai"));

    let out = skein(&["validate"]);
    assert_eq!(out.status.code(), Some(2));
    let out = skein(&["frobnicate"]);
    assert_eq!(out.status.code(), Some(2));

    let out = skein(&["server", "--db-cache-mib", "0"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("--db-cache-mib"), "{}", text(&out.stderr));
}

#[test]
fn bad_node_labels_are_refused_before_the_agent_starts() {
    let agent = |labels: &[&str]| {
        let mut args = vec!["agent", "--join", "http://127.0.0.1:1", "--token", "t"];
        for label in labels {
            args.extend(["--label", label]);
        }
        skein(&args)
    };
    // Usage: clap refuses the value, saying what is wrong and how to fix it.
    let out = agent(&["zone"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains(
            "invalid value 'zone' for '--label <KEY=VALUE>': `zone` is not a label: write KEY=VALUE, such as \
             `zone=lab-a`"
        ),
        "{}",
        text(&out.stderr)
    );
    let out = agent(&["zone=lab a"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("the value `lab a` of label `zone` contains ' '"),
        "{}",
        text(&out.stderr)
    );
    let out = agent(&["zone="]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("label `zone` has an empty value"),
        "{}",
        text(&out.stderr)
    );
    // Each label alone is fine, together they disagree.
    let out = agent(&["zone=lab-a", "zone=lab-b"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr)
            .contains("--label: label `zone` is given twice, as `lab-a` and as `lab-b`: give each key once"),
        "{}",
        text(&out.stderr)
    );
}
