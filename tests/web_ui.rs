//! The web page in a real browser: `skein up --fleet workflows/fleets/lab.yaml` (the
//! reference fleet, simulated, with its own load pattern), a mock hub serving the
//! reference models (whose weight transfers stall, so the lab workflow's instances hold
//! their GPUs without filling the disk) and the tiny Llama (served for real, on the
//! CPU), and `web/tests/ui.mjs` driving Debian's headless Chromium through
//! playwright-core: the GPUs and links appear with their memory and bandwidth, the
//! fleet's load shows on the right GPU within 2 s of its sample, the lab workflow's
//! shards show on the GPUs its instances hold, a user sees only their own runs and
//! sessions and moves a session from the page, and a lost connection recovers. Items of
//! issue 27 too: free memory per card and fleet-wide, health tints and nvtop levels, a
//! minimum zoom, the sortable GPU table, one PCIe bus per node, split replicas marked
//! (one split across rtx-1 and old-1, end to end), stale values greyed, sparklines
//! preloaded, a phone-sized window, the favicon, the remembered token; an 8-GPU node
//! (dgx.yaml's, joined at the end) wraps its GPUs into rows. Any console error, failed
//! request or 4xx/5xx answer fails it.
//!
//!
//! The second test decides from the page what waits for a person: `web/tests/approvals.mjs`
//! against a real `skein server` whose run has two `for_each` items waiting, each because
//! its tool call (to the testkit's `mcp-tools`, asked for by a loopback model) was in
//! flight under `in_flight: ask` when the server was killed, and an approval step after
//! them.
//!
//! `web/tests/install.sh` installs Chromium and playwright-core first (once). The
//! screenshots are left in `target/web-artifacts/` (`target/web-approvals/` for the
//! second test).

use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use skein_testkit::endpoint::WholeAnswer;
use skein_testkit::lab::Lab;
use skein_testkit::mcp::mcp_tools_path;
use skein_testkit::process::{Watchdog, output_within};
use skein_testkit::rest::{PATIENCE, Restartable};
use skein_testkit::tiny_llama;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// Chromium and playwright-core, installed by `web/tests/install.sh` (once).
fn install_browser() {
    let install = output_within(
        Command::new("bash").arg(Path::new(ROOT).join("web/tests/install.sh")),
        Duration::from_secs(1800),
        "web/tests/install.sh",
    );
    assert!(
        install.status.success(),
        "web/tests/install.sh failed: the browser tests need Debian's chromium and npm\n{}",
        String::from_utf8_lossy(&install.stderr)
    );
}

#[test]
fn the_page_in_a_real_browser() {
    let root = Path::new(ROOT);
    install_browser();

    // The pieces of a GGUF model split across nodes are llama.cpp RPC servers; the fake
    // engine stands in for them (it listens on its port), so that a split replica's
    // pieces start on their nodes and hold their GPUs.
    // SAFETY: set before this test starts any thread or process that reads it.
    unsafe { std::env::set_var("SKEIN_RPC_SERVER", skein_testkit::fake_engine_path()) };
    let lab = Lab::with_repos(
        env!("CARGO_BIN_EXE_skein"),
        skein_testkit::models::reference_hub_repos(),
    );
    lab.hub().hold_large_downloads();
    let fleet = root.join("workflows/fleets/lab.yaml");
    let mut up = lab.up(&fleet);
    let mut dgx = None;
    lab.nodes_up(4);

    let artifacts = root.join("target/web-artifacts");
    let _ = std::fs::remove_dir_all(&artifacts);
    let lab_workflow = std::fs::read_to_string(root.join("workflows/lab-research.yaml")).unwrap();
    let mut browser = Command::new("node")
        .arg(root.join("web/tests/ui.mjs"))
        .current_dir(root.join("web/tests"))
        .env("SKEIN_API", lab.api())
        .env("SKEIN_ADMIN_TOKEN", lab.token())
        .env("SKEIN_LAB_WORKFLOW", lab_workflow)
        .env("SKEIN_TINY_REPO", tiny_llama::REPO_ID)
        .env("SKEIN_ARTIFACTS", &artifacts)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .expect("node runs web/tests/ui.mjs");
    // The browser session, Chromium included, has 15 minutes (it takes about 3).
    let watchdog = Watchdog::arm(browser.id(), Duration::from_secs(900));
    let mut answers = browser.stdin.take().unwrap();
    let stderr = browser.stderr.take().unwrap();
    let errors = std::thread::spawn(move || {
        let mut text = String::new();
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            eprintln!("{line}");
            text.push_str(&line);
            text.push('\n');
        }
        text
    });
    let mut said = String::new();
    for line in BufReader::new(browser.stdout.take().unwrap())
        .lines()
        .map_while(Result::ok)
    {
        println!("{line}");
        said.push_str(&line);
        said.push('\n');
        match line.as_str() {
            "@stop" => {
                up.kill();
                writeln!(answers, "stopped").unwrap();
            }
            "@start" => {
                up = lab.up(&fleet);
                writeln!(answers, "started").unwrap();
            }
            "@dgx" => {
                dgx = Some(lab.simulated_agent(&root.join("workflows/fleets/dgx.yaml"), "dgx-1"));
                writeln!(answers, "dgx").unwrap();
            }
            _ => {}
        }
    }
    let status = browser.wait().unwrap();
    let errors = errors.join().unwrap();
    watchdog.check("web/tests/ui.mjs");
    assert!(
        status.success(),
        "the browser tests failed (screenshots in {}):\n{said}\n{errors}\n{}",
        artifacts.display(),
        lab.logs(60)
    );
    drop(dgx);
    drop(up);
}

#[test]
fn items_waiting_for_approval_are_decided_from_the_page() {
    install_browser();
    let root = Path::new(ROOT);
    let dir = tempfile::tempdir().unwrap();
    const TOKEN: &str = "web-approvals-admin-token";
    let tools = mcp_tools_path();
    let allow = tools.to_string_lossy().into_owned();
    let mut lab = Restartable::start(
        Path::new(env!("CARGO_BIN_EXE_skein")),
        dir.path().join("data"),
        TOKEN,
        &["--endpoint-allow", "127.0.0.1/32", "--allow-tool-command", &allow],
    );
    // Each item's model asks for one `sleep` whose arguments look like HTML: the
    // question on the call quotes them, and the page must show them as text.
    let model = WholeAnswer::tool_caller(
        "counter__sleep",
        r#"{"ms": 3000, "note": "<img src=x onerror=alert(1)>"}"#,
        1,
        Duration::ZERO,
    );
    let count_file = dir.path().join("count");
    let workflow = format!(
        "name: posts\ninputs: {{ things: {{ type: list, default: [one, two] }} }}\ntool_servers:\n  counter:\n    command: [\"{}\", \"--count-file\", \"{}\"]\n    in_flight: ask\nagents:\n  worker:\n    endpoint: {{ url: \"{}\", model: m }}\n    tools: [counter.sleep]\n    max_turns: 3\nsteps:\n  - {{ id: work, agent: worker, prompt: \"post {{{{ item }}}}\", retries: 0, for_each: {{ over: inputs.things, max_parallel: 2 }} }}\n  - {{ id: publish, after: [work], approval: \"Publish <b>both</b> posts?\" }}\n",
        tools.display(),
        count_file.display(),
        model.url()
    );
    let id = lab.api.submit(&workflow);

    // Both items' calls are sent and have reached the tool (each wrote its line): the
    // server dies with both in flight, and after the restart both items wait.
    let deadline = Instant::now() + PATIENCE;
    loop {
        let run = lab.api.run(&id).unwrap_or_default();
        let sent = (0..2).all(|i| run["steps"][0]["items"][i]["turns"][0]["calls"][0]["state"] == "sent");
        let reached = std::fs::read_to_string(&count_file).map_or(0, |t| t.lines().count()) == 2;
        if sent && reached {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the items' calls never went out: {run:#}\n{}",
            lab.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    lab.kill_and_restart();
    lab.api.until(&id, "both items waiting for approval", |run: &Value| {
        (0..2).all(|i| run["steps"][0]["items"][i]["state"] == "waiting")
    });

    let artifacts = root.join("target/web-approvals");
    let _ = std::fs::remove_dir_all(&artifacts);
    std::fs::create_dir_all(&artifacts).unwrap();
    let output = output_within(
        Command::new("node")
            .arg(root.join("web/tests/approvals.mjs"))
            .current_dir(root.join("web/tests"))
            .env("SKEIN_API", &lab.api.base)
            .env("SKEIN_ADMIN_TOKEN", TOKEN)
            .env("SKEIN_RUN", &id)
            .env("SKEIN_ARTIFACTS", &artifacts),
        Duration::from_secs(600),
        "web/tests/approvals.mjs",
    );
    let said = String::from_utf8_lossy(&output.stdout);
    println!("{said}");
    assert!(
        output.status.success(),
        "the approvals in the page failed (screenshots in {}):\n{said}\n{}\n{}",
        artifacts.display(),
        String::from_utf8_lossy(&output.stderr),
        lab.log()
    );
    let run = lab.api.finished(&id);
    assert_eq!(run["state"], "succeeded", "{run:#}");
    let lines = std::fs::read_to_string(&count_file).map_or(0, |t| t.lines().count());
    assert_eq!(lines, 4, "each item's call was sent once more, once approved");
}
