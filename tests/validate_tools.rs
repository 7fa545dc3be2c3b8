//! `skein validate --check-tools`, run as a process against the testkit's real MCP
//! server (`mcp-tools`: count, add, echo, sleep, fail) over stdio and streamable HTTP:
//! a tool the server declares passes, a misspelt one is `unknown-tool` at its place
//! with a suggestion, a server that cannot be started is the warning
//! `tool-server-unreachable`, and one that needs a key is a note.

use std::path::Path;
use std::process::{Command, Output};

use serde_json::Value;
use skein_testkit::mcp::{HttpToolServer, mcp_tools_path};

fn skein(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_skein"))
        .args(args)
        .env("NO_COLOR", "1")
        .output()
        .expect("skein runs")
}

/// A workflow whose agent `worker` lists `tools` (YAML flow items) of server
/// `counter`, reached as `transport` (a `command:` or `url:` line). The first tool is
/// on line 9, column 13.
fn workflow(transport: &str, tools: &str) -> String {
    format!(
        "name: tools\n\
         tool_servers:\n\
         \x20 counter:\n\
         \x20   {transport}\n\
         agents:\n\
         \x20 worker:\n\
         \x20   model: Qwen/Qwen2.5-0.5B-Instruct\n\
         \x20   tools:\n\
         \x20     - {tools}\n\
         steps:\n\
         \x20 - {{ id: work, agent: worker, prompt: count }}\n"
    )
}

/// The `command:` of `mcp-tools` counting into a file of `dir`.
fn stdio(dir: &Path) -> String {
    format!(
        "command: [\"{}\", --count-file, \"{}\"]",
        mcp_tools_path().display(),
        dir.join("count").display()
    )
}

/// Writes `text` as `dir/NAME` and runs `skein validate --check-tools --output json` on
/// it: the exit code and the file's report.
fn check(dir: &Path, name: &str, text: &str) -> (Option<i32>, Value) {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    let out = skein(&["validate", "--check-tools", "--output", "json", path.to_str().unwrap()]);
    let report: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}):\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out.status.code(), report["files"][0].clone())
}

fn codes(file: &Value) -> Vec<(String, String)> {
    file["diagnostics"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| {
            (
                d["code"].as_str().unwrap().to_owned(),
                d["severity"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

#[test]
fn tools_the_server_declares_pass() {
    let dir = tempfile::tempdir().unwrap();
    let text = workflow(&stdio(dir.path()), "counter.count\n      - counter.add");
    let (code, file) = check(dir.path(), "good.yaml", &text);
    assert_eq!(code, Some(0), "{file:#}");
    assert_eq!(file["valid"], true);
    assert_eq!(codes(&file), Vec::<(String, String)>::new());
    // `server.*` names no tool to check.
    let (code, file) = check(dir.path(), "all.yaml", &workflow(&stdio(dir.path()), "counter.*"));
    assert_eq!((code, codes(&file)), (Some(0), vec![]), "{file:#}");
}

#[test]
fn a_misspelt_tool_is_unknown_tool_at_its_place_with_a_suggestion() {
    let dir = tempfile::tempdir().unwrap();
    let text = workflow(&stdio(dir.path()), "counter.cuont");
    let (code, file) = check(dir.path(), "typo.yaml", &text);
    assert_eq!(code, Some(1), "{file:#}");
    assert_eq!(file["valid"], false);
    assert_eq!(codes(&file), [("unknown-tool".to_owned(), "error".to_owned())]);
    let d = &file["diagnostics"][0];
    assert_eq!((d["line"].as_u64(), d["column"].as_u64()), (Some(9), Some(9)), "{d:#}");
    assert_eq!(d["end_column"].as_u64(), Some(22), "{d:#}");
    assert!(d["message"].as_str().unwrap().contains("`counter.cuont`"), "{d:#}");
    let help = d["help"].as_str().unwrap();
    assert!(help.starts_with("did you mean `count`?"), "{help}");
    for tool in ["add", "count", "echo", "fail", "sleep"] {
        assert!(help.contains(&format!("`{tool}`")), "{help}");
    }

    // The human output points at the same place.
    let out = skein(&[
        "validate",
        "--check-tools",
        dir.path().join("typo.yaml").to_str().unwrap(),
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("dsl::unknown-tool"), "{stderr}");
    assert!(stderr.contains("typo.yaml:9:9"), "{stderr}");
    assert!(stderr.contains("did you mean `count`?"), "{stderr}");

    // Without the flag no server is started and the file is valid.
    let out = skein(&["validate", dir.path().join("typo.yaml").to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(!dir.path().join("count").exists());
}

#[test]
fn a_server_that_cannot_start_is_a_warning_at_its_command() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no-such-program");
    let transport = format!("command: [\"{}\"]", missing.display());
    let (code, file) = check(dir.path(), "gone.yaml", &workflow(&transport, "counter.cuont"));
    assert_eq!(code, Some(0), "{file:#}");
    assert_eq!(file["valid"], true);
    assert_eq!(
        codes(&file),
        [("tool-server-unreachable".to_owned(), "warning".to_owned())]
    );
    let d = &file["diagnostics"][0];
    assert_eq!((d["line"].as_u64(), d["column"].as_u64()), (Some(4), Some(14)), "{d:#}");
    let message = d["message"].as_str().unwrap();
    assert!(
        message.contains("`counter`") && message.contains("cannot start"),
        "{message}"
    );

    // A program that is not an MCP server: the handshake fails.
    let transport = "command: [\"true\"]";
    let (code, file) = check(dir.path(), "true.yaml", &workflow(transport, "counter.count"));
    assert_eq!(code, Some(0), "{file:#}");
    assert_eq!(
        codes(&file),
        [("tool-server-unreachable".to_owned(), "warning".to_owned())]
    );
}

#[test]
fn http_servers_are_listed_and_one_that_needs_a_key_is_a_note() {
    let dir = tempfile::tempdir().unwrap();
    let open = HttpToolServer::rust(&dir.path().join("open-count"), None);
    let transport = format!("url: \"{}\"", open.url());
    let (code, file) = check(dir.path(), "open.yaml", &workflow(&transport, "counter.ad"));
    assert_eq!(code, Some(1), "{file:#}");
    assert_eq!(codes(&file), [("unknown-tool".to_owned(), "error".to_owned())]);
    let help = file["diagnostics"][0]["help"].as_str().unwrap();
    assert!(help.starts_with("did you mean `add`?"), "{help}");
    let (code, file) = check(dir.path(), "open-ok.yaml", &workflow(&transport, "counter.echo"));
    assert_eq!((code, codes(&file)), (Some(0), vec![]), "{file:#}");

    let locked = HttpToolServer::rust(&dir.path().join("locked-count"), Some("secret-token"));
    let transport = format!("url: \"{}\"", locked.url());
    let (code, file) = check(dir.path(), "locked.yaml", &workflow(&transport, "counter.count"));
    assert_eq!(code, Some(0), "{file:#}");
    assert_eq!(
        codes(&file),
        [("tool-server-unreachable".to_owned(), "note".to_owned())]
    );
    let message = file["diagnostics"][0]["message"].as_str().unwrap();
    assert!(message.contains("could not list tools: needs its key"), "{message}");
}
