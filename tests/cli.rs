//! The real `skein` binary, run as a process: exit codes, human and JSON
//! output of `skein validate`; the commands `skein up` suggests; what `skein submit
//! --wait` prints while a step retries and while an engine restarts, against a real
//! server, agent and engine processes.

use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use skein_testkit::agent::{EngineBehaviour, Tasks, fake_engine};
use skein_testkit::fake_engine::fake_engine_path;
use skein_testkit::lab::{Lab, stderr, stdout};

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

/// The lines of `log` once one contains `needle` (the lab copies a process's stderr
/// there line by line, so a line may land a moment after the one the lab waited for).
fn log_lines_once(log: &Path, needle: &str) -> Vec<String> {
    for _ in 0..600 {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        if text.contains(needle) {
            return text.lines().map(str::to_owned).collect();
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!(
        "no `{needle}` in {}:\n{}",
        log.display(),
        std::fs::read_to_string(log).unwrap_or_default()
    );
}

#[test]
fn the_up_banner_suggests_commands_that_reach_its_server() {
    // The lab's server listens on a port of its own, with a data directory of its own:
    // the bare `skein nodes` would reach neither.
    let lab = Lab::with_repos(
        env!("CARGO_BIN_EXE_skein"),
        skein_testkit::models::reference_hub_repos(),
    );
    let fleet = Path::new(env!("CARGO_MANIFEST_DIR")).join("workflows/fleets/laptop.yaml");
    let _up = lab.up(&fleet);
    let lines = log_lines_once(&lab.dir().join("server.log"), "skein submit workflows/hello.yaml");
    let suggested = |prefix: &str| -> Vec<String> {
        let line = lines
            .iter()
            .find_map(|l| l.trim().strip_prefix(prefix))
            .unwrap_or_else(|| panic!("no `{prefix}` line in:\n{}", lines.join("\n")));
        line.split_whitespace().map(str::to_owned).collect()
    };
    let nodes = suggested("Try: skein ");
    let submit = suggested("skein submit ");
    let data_dir = lab.data_dir().display().to_string();
    for flags in [&nodes, &submit] {
        let at = |flag: &str| flags.iter().position(|a| a == flag).map(|i| flags[i + 1].clone());
        assert_eq!(at("--server"), Some(lab.api()), "{flags:?}");
        assert_eq!(at("--data-dir"), Some(data_dir.clone()), "{flags:?}");
    }

    // Both work as printed (the submission without `--wait`: the run is not the point).
    // "skein is up" comes before the laptop's agent has joined: wait for it.
    lab.nodes_up(1);
    let cache = lab.dir().join("cli-cache");
    let out = lab
        .skein(&cache)
        .args(&nodes)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap();
    assert!(out.status.success(), "skein {nodes:?}: {}", stderr(&out));
    assert!(stdout(&out).contains("laptop"), "{}", stdout(&out));
    assert_eq!(submit[..2], ["workflows/hello.yaml", "--wait"], "{submit:?}");
    let out = lab
        .skein(&cache)
        .arg("submit")
        .args(submit.iter().filter(|a| *a != "--wait"))
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap();
    assert!(out.status.success(), "skein submit {submit:?}: {}", stderr(&out));
    let run = stdout(&out).trim().to_owned();
    let _ = lab.cli(&["run", "cancel", &run]);
}

#[test]
fn submit_wait_says_why_a_step_retries() {
    let lab = Lab::new(env!("CARGO_BIN_EXE_skein")).server_args(&["--endpoint-allow", "127.0.0.1"]);
    let _server = lab.server();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let tasks = Tasks::default();
    // The endpoint fails its first request with 500 ("CUDA out of memory").
    let behaviour = EngineBehaviour {
        fail_first: 1,
        ..EngineBehaviour::default()
    };
    let endpoint = runtime.block_on(fake_engine(behaviour, &tasks));
    let file = lab.dir().join("retry.yaml");
    std::fs::write(
        &file,
        format!(
            "name: retry\nagents:\n  remote: {{ endpoint: {{ url: \"{endpoint}\", model: m }} }}\n\
             steps:\n  - {{ id: ask, agent: remote, prompt: hello, retries: 1 }}\n"
        ),
    )
    .unwrap();
    let out = lab.cli(&["submit", file.to_str().unwrap(), "--wait"]);
    let progress = stderr(&out);
    assert!(out.status.success(), "{progress}");
    let retrying = progress
        .lines()
        .find(|l| l.trim_start().starts_with("step ask: retrying "))
        .unwrap_or_else(|| panic!("no retrying line:\n{progress}"));
    assert!(retrying.contains("CUDA out of memory"), "{retrying}");
    assert!(progress.contains("step ask: done"), "{progress}");
    assert!(stdout(&out).contains("echo: hello"), "{}", stdout(&out));
}

#[test]
fn submit_wait_says_why_the_engine_restarts_each_time() {
    let lab = Lab::new(env!("CARGO_BIN_EXE_skein"));
    let _server = lab.server();
    // One simulated GPU: the planner gives the tiny safetensors model to vLLM, and the
    // node's vLLM is the fake engine, which crashes with status 3 while it loads.
    let fleet = lab.dir().join("fleet.yaml");
    std::fs::write(
        &fleet,
        "fleet: crashing\nnodes:\n  gpu-a:\n    gpus: { model: RTX4090-24GB, memory: 24GiB }\n    \
         host: { cpu_cores: 8, memory: 32GiB }\n",
    )
    .unwrap();
    let engine = fake_engine_path();
    let _agent = lab.simulated_agent_with(
        &fleet,
        "gpu-a",
        &["--vllm", engine.to_str().unwrap()],
        &[
            ("SKEIN_FAKE_ENGINE_READY_MS", "600000".to_owned()),
            ("SKEIN_FAKE_ENGINE_EXIT_MS", "300".to_owned()),
        ],
    );
    lab.nodes_up(1);
    let file = lab.dir().join("crash.yaml");
    std::fs::write(
        &file,
        "name: crash\nagents:\n  writer: { model: { repo: skein-test/tiny-llama, context: 256 }, max_tokens: 8 }\n\
         steps:\n  - { id: draft, agent: writer, prompt: hello }\n",
    )
    .unwrap();
    let out = lab.cli(&["submit", file.to_str().unwrap(), "--wait"]);
    let progress = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "the run fails in the end:\n{progress}");
    // Each restart says why: the exit status and the engine's last words.
    let why = "exited with status 3 while loading; last log line: fake-engine: exiting after 300 ms, as asked";
    for restart in 1..=5 {
        let said = format!("writer: restarting (restart {restart}): {why} on gpu-a");
        assert!(
            progress.contains(&said),
            "no `{said}` in:\n{progress}\n{}",
            lab.logs(40)
        );
    }
    assert!(
        progress.contains("writer: loading (restart 1) on gpu-a")
            || progress.contains("writer: starting (restart 1) on gpu-a"),
        "the start after a restart says which it is:\n{progress}"
    );
    assert!(progress.contains("fake-engine: exiting after 300 ms"), "{progress}");
}
