//! The official OpenAI and Anthropic Python clients against the real skein server:
//! each runs its own tool loop (the model calls a tool, the client runs it and sends
//! the result, the model answers with it), whole and streamed, through
//! `/v1/chat/completions` and `/v1/messages`; the OpenAI client's loop also runs in a
//! session (only new messages sent, the session holding calls and results, shown by
//! `skein session show`). The model is an endpoint agent on the
//! testkit's fake engine, which calls the offered tool until it is sent its result.
//! The clients come pinned from `tests/engines/llm-clients.sh` (a venv cached outside
//! the clone); a failed install fails the test.

use std::path::Path;
use std::process::Command;

use serde_json::{Value, json};
use skein_testkit::agent::{EngineBehaviour, Tasks, fake_engine};
use skein_testkit::lab::{Lab, stderr, stdout};

/// Runs `tests/clients/SCRIPT` with the clients' python against the lab, with `args`
/// after the server's URL and token (the model first); it must print `ok`.
fn run_client(python: &Path, lab: &Lab, script: &str, args: &[&str]) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/clients").join(script);
    let output = Command::new(python)
        .arg(&path)
        .args([lab.api(), lab.token()])
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", path.display()));
    assert!(
        output.status.success() && stdout(&output).trim() == "ok",
        "{script} failed ({}):\n{}\n{}\n{}",
        output.status,
        stdout(&output),
        stderr(&output),
        lab.logs(30)
    );
}

#[test]
fn the_official_python_clients_run_their_tool_loops() {
    let python = skein_testkit::tools::prepared("llm-clients.sh");
    let lab = Lab::new(env!("CARGO_BIN_EXE_skein")).server_args(&["--endpoint-allow", "127.0.0.1"]);
    let _server = lab.server();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let tasks = Tasks::default();
    let behaviour = EngineBehaviour::default();
    let engine = runtime.block_on(fake_engine(behaviour.clone(), &tasks));
    let file = lab.dir().join("tools.yaml");
    std::fs::write(
        &file,
        format!(
            "name: tools\nagents:\n  helper: {{ endpoint: {{ url: \"{engine}\", model: m }} }}\nsteps:\n  \
             - {{ id: a, agent: helper, prompt: hi }}\n"
        ),
    )
    .unwrap();
    let submitted = lab.cli(&["submit", file.to_str().unwrap(), "--wait", "--output", "json"]);
    assert!(
        submitted.status.success(),
        "{}\n{}",
        stdout(&submitted),
        stderr(&submitted)
    );
    let run: Value = serde_json::from_str(&stdout(&submitted)).unwrap();
    assert_eq!(run["state"], "succeeded", "{run:#}");

    run_client(&python, &lab, "openai_tools.py", &["helper"]);
    run_client(&python, &lab, "anthropic_tools.py", &["helper"]);

    // The OpenAI client's loop in a session: the session holds the history, calls and
    // results among it, and `skein session show` prints them.
    let (status, session) = lab.post("/v1/sessions", &json!({"agent": "helper"}));
    assert_eq!(status, 201, "{session}");
    let id = session["id"].as_str().unwrap();
    run_client(&python, &lab, "openai_session_tools.py", &["helper", id]);
    let history = lab.get(&format!("/v1/sessions/{id}/messages"));
    let roles: Vec<&str> = history["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["role"].as_str().unwrap())
        .collect();
    assert_eq!(
        roles,
        [
            "user",
            "assistant",
            "tool",
            "assistant",
            "user",
            "assistant",
            "tool",
            "assistant"
        ],
        "each call and result stored once: {history:#}"
    );
    let shown = lab.cli(&["session", "show", id]);
    assert!(shown.status.success(), "{}", stderr(&shown));
    let shown = stdout(&shown);
    assert!(
        shown.contains(r#"calls weather({"text":"Paris"})  [call_echo_"#),
        "{shown}"
    );
    assert!(
        shown.contains("tool at ") && shown.contains("(result of call_echo_") && shown.contains("sunny in Rome"),
        "{shown}"
    );

    // Each loop was two calls, whole then streamed: the engine saw the tool results
    // come back as `tool` messages.
    let seen = behaviour.seen.lock().unwrap();
    let results = seen
        .iter()
        .filter(|(_, body)| {
            body["messages"]
                .as_array()
                .and_then(|m| m.last())
                .is_some_and(|m| m["role"] == "tool")
        })
        .count();
    assert_eq!(results, 6, "{seen:?}");
    drop(seen);
    drop(tasks);
}
