//! `skein group …` and `skein quota …` end to end, with the real server and CLI: the
//! admin makes a group with a runs limit and puts a student in it; the student's second
//! submission is refused with the limit named; lifting it lets the run in.

use serde_json::Value;
use skein_testkit::lab::{Lab, stderr, stdout};

const WORKFLOW: &str = "name: w\nagents:\n  a: { model: { repo: skein-test/tiny-llama, context: 256 } }\nsteps:\n  - { id: s, agent: a, prompt: hi }\n";

#[test]
fn the_admin_sets_groups_and_quotas_and_a_student_meets_them() {
    let lab = Lab::new(env!("CARGO_BIN_EXE_skein"));
    let _server = lab.server();
    let ok = |args: &[&str]| {
        let out = lab.cli(args);
        assert!(
            out.status.success(),
            "skein {args:?}: {}\n{}",
            stdout(&out),
            stderr(&out)
        );
        stdout(&out)
    };
    ok(&[
        "group",
        "set",
        "vision",
        "--shares",
        "2",
        "--runs",
        "1",
        "--gpu-gib",
        "160",
    ]);
    ok(&["group", "add", "vision", "ada"]);
    let token = ok(&["token", "create", "--user", "ada"]).trim().to_owned();
    let file = lab.dir().join("w.yaml");
    std::fs::write(&file, WORKFLOW).unwrap();
    let file = file.to_str().unwrap();

    // No agent joined: the first run waits in the queue, in progress.
    let first = ok(&["submit", file, "--api-token", &token]);
    let refused = lab.cli(&["submit", file, "--api-token", &token]);
    assert!(
        !refused.status.success(),
        "{first}\n{}\n{}",
        stdout(&refused),
        lab.get("/v1/runs")
    );
    let said = stderr(&refused);
    assert!(
        said.contains("group `vision` may use 1 run in progress (queued or running) at once: 1 run in use")
            && said.contains("skein quota set --group vision --runs N"),
        "{said}"
    );

    let listed = ok(&["group", "list"]);
    let vision = listed.lines().find(|l| l.starts_with("vision")).unwrap_or_default();
    for cell in ["2", "1/1", "0.0/160", "ada"] {
        assert!(
            vision.split_whitespace().any(|c| c == cell),
            "`{cell}` in {vision:?}\n{listed}"
        );
    }
    let quota: Value =
        serde_json::from_str(&ok(&["quota", "show", "--api-token", &token, "--output", "json"])).unwrap();
    assert_eq!(
        (quota["group"].as_str(), quota["ours"]["runs"].as_u64()),
        (Some("vision"), Some(1))
    );
    // A student cannot change quotas.
    let denied = lab.cli(&[
        "quota",
        "set",
        "--group",
        "vision",
        "--runs",
        "9",
        "--api-token",
        &token,
    ]);
    assert!(!denied.status.success());

    ok(&["quota", "set", "--group", "vision", "--clear", "runs"]);
    ok(&["submit", file, "--api-token", &token]);
    let missing = lab.cli(&["quota", "set", "--runs", "2"]);
    assert!(
        !missing.status.success() && stderr(&missing).contains("--user"),
        "{}",
        stderr(&missing)
    );
}
