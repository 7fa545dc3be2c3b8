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
//! `web/tests/install.sh` installs Chromium and playwright-core first (once). The
//! screenshots are left in `target/web-artifacts/`.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};

use skein_testkit::lab::Lab;
use skein_testkit::tiny_llama;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

#[test]
fn the_page_in_a_real_browser() {
    let root = Path::new(ROOT);
    let install = Command::new("bash")
        .arg(root.join("web/tests/install.sh"))
        .status()
        .expect("bash runs web/tests/install.sh");
    assert!(
        install.success(),
        "web/tests/install.sh failed: the browser tests need Debian's chromium and npm"
    );

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
        .spawn()
        .expect("node runs web/tests/ui.mjs");
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
    assert!(
        status.success(),
        "the browser tests failed (screenshots in {}):\n{said}\n{errors}\n{}",
        artifacts.display(),
        lab.logs(60)
    );
    drop(dgx);
    drop(up);
}
