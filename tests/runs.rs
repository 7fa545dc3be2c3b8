//! Runs end to end with real processes on loopback: `skein server`, `skein agent` (a
//! CPU-only node here: no NVIDIA driver) that downloads the tiny generated Llama from a
//! mock hub and serves it with the built-in engine (`skein engine serve`), and the CLI
//! (`skein submit --wait`, `skein runs`, `skein run show`, `skein instances`,
//! `skein logs`). The server is killed with SIGKILL mid-run (while an approval holds the
//! run, so that it cannot have finished) and restarted; an agent is killed and its
//! instance placed on another node.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::Value;
use skein_testkit::lab::{Lab, stderr, stdout};
use skein_testkit::process::output_within;

fn workflow_file(dir: &Path, text: &str) -> PathBuf {
    let path = dir.join("story.yaml");
    std::fs::write(&path, text).unwrap();
    path
}

/// Two agents on the tiny model (one instance serves both), greedy so that the output
/// is the same every time, three steps in a chain.
const STORY: &str = r#"
name: story
inputs: { topic: { type: string } }
agents:
  writer: { model: { repo: skein-test/tiny-llama, context: 256 }, temperature: 0, max_tokens: 12 }
  editor: { model: { repo: skein-test/tiny-llama, context: 256 }, temperature: 0, max_tokens: 12, system: "Edit." }
steps:
  - { id: draft, agent: writer, prompt: "Tell me about {{ inputs.topic }}" }
  - { id: edit, agent: editor, after: [draft], prompt: "Edit: {{ steps.draft.output }}" }
  - { id: title, agent: writer, after: [edit], prompt: "Title for: {{ steps.edit.output }}" }
"#;

#[test]
fn a_workflow_runs_on_the_built_in_engine_and_its_outputs_are_deterministic() {
    let lab = Lab::new(env!("CARGO_BIN_EXE_skein"));
    let _server = lab.server();
    let _agent = lab.agent("laptop");
    lab.nodes_up(1);
    let file = workflow_file(lab.dir(), STORY);
    let file = file.to_str().unwrap();

    let first = lab.cli(&["submit", file, "--input", "topic=GPUs", "--wait"]);
    assert!(first.status.success(), "{}\n{}", stdout(&first), stderr(&first));
    let progress = stderr(&first);
    assert!(progress.contains("step draft: running"), "{progress}");
    assert!(progress.contains("succeeded"), "{progress}");
    let outputs = stdout(&first);
    for step in ["draft", "edit", "title"] {
        assert!(outputs.contains(&format!("── {step} (")), "{outputs}");
    }

    // The same run again: the warm instance answers, greedy decoding gives the same text.
    let second = lab.cli(&["submit", file, "--input", "topic=GPUs", "--wait"]);
    assert!(second.status.success(), "{}", stderr(&second));
    assert_eq!(stdout(&second), outputs);

    let runs = lab.cli(&["runs"]);
    assert_eq!(
        stdout(&runs).lines().filter(|l| l.contains("succeeded")).count(),
        2,
        "{}",
        stdout(&runs)
    );
    let instances = lab.cli(&["instances", "--output", "json"]);
    let instances: Value = serde_json::from_str(&stdout(&instances)).unwrap();
    let instance = &instances[0];
    assert_eq!(instance["engine"], "candle");
    assert_eq!(instance["state"], "ready");
    assert!(instance["measured_host_rss"].as_u64().unwrap() > 0, "{instance:#}");
    let name = instance["name"].as_str().unwrap();
    let logs = lab.cli(&["logs", name, "--tail", "50"]);
    assert!(logs.status.success(), "{}", stderr(&logs));
    assert!(!stdout(&logs).is_empty());

    engine_answers_only_with_its_key(instance["base_url"].as_str().unwrap());

    // A missing input is refused before anything runs, with the fix.
    let missing = lab.cli(&["submit", file]);
    assert!(!missing.status.success());
    assert!(stderr(&missing).contains("--input topic=VALUE"), "{}", stderr(&missing));
}

/// The built-in engine behind `base_url` (`http://HOST:PORT/v1`), reached directly, not
/// through Skein: it refuses a request without the key the orchestrator gave it through
/// the agent, answers with it, and keeps `/health` open. The key is in the engine
/// process's environment (readable only by its own user), never in its command line
/// (readable by every user).
fn engine_answers_only_with_its_key(base_url: &str) {
    let port = base_url.trim_end_matches("/v1").rsplit(':').next().unwrap().to_owned();
    let mut found = None;
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let args: Vec<String> = cmdline
            .split(|&b| b == 0)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        let serves = args.windows(2).any(|w| w == ["engine", "serve"]);
        if serves && args.windows(2).any(|w| w[0] == "--port" && w[1] == port) {
            let environ = std::fs::read(entry.path().join("environ")).unwrap();
            found = Some((args, environ));
        }
    }
    let (args, environ) = found.unwrap_or_else(|| panic!("no `skein engine serve --port {port}` process"));
    let key = environ
        .split(|&b| b == 0)
        .filter_map(|v| {
            String::from_utf8_lossy(v)
                .strip_prefix("SKEIN_ENGINE_API_KEY=")
                .map(str::to_owned)
        })
        .next()
        .expect("the engine was given its key in its environment");
    assert_eq!(key.len(), 64, "32 random bytes in hex");
    assert!(
        !args.iter().any(|a| a.contains(&key)),
        "the key is not in the command line: {args:?}"
    );

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let http = reqwest::Client::builder().no_proxy().build().unwrap();
        let chat = serde_json::json!({
            "model": serde_json::Value::Null,
            "messages": [{"role": "user", "content": "Hello"}],
            "max_tokens": 2,
        });
        let origin = base_url.trim_end_matches("/v1");
        let health = http.get(format!("{origin}/health")).send().await.unwrap();
        assert_eq!(health.status(), 200, "the health check stays open");
        for request in [
            http.get(format!("{base_url}/models")),
            http.post(format!("{base_url}/chat/completions")).json(&chat),
            http.post(format!("{base_url}/chat/completions"))
                .json(&chat)
                .bearer_auth("0".repeat(64)),
        ] {
            let refused = request.send().await.unwrap();
            assert_eq!(refused.status(), 401, "no key (or a wrong one), no answer");
        }
        let models: Value = http
            .get(format!("{base_url}/models"))
            .bearer_auth(&key)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let model = models["data"][0]["id"].clone();
        let answered = http
            .post(format!("{base_url}/chat/completions"))
            .json(&serde_json::json!({"model": model, "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 2}))
            .bearer_auth(&key)
            .send()
            .await
            .unwrap();
        assert_eq!(answered.status(), 200, "with its key it answers");
    });
}

/// [`STORY`] with an approval after the draft: the run cannot finish until the test
/// approves, so a server killed while the approval waits provably dies mid-run, with
/// the draft recorded and the edit and title still to run.
const GATED_STORY: &str = r#"
name: story
inputs: { topic: { type: string } }
agents:
  writer: { model: { repo: skein-test/tiny-llama, context: 256 }, temperature: 0, max_tokens: 12 }
  editor: { model: { repo: skein-test/tiny-llama, context: 256 }, temperature: 0, max_tokens: 12, system: "Edit." }
steps:
  - { id: draft, agent: writer, prompt: "Tell me about {{ inputs.topic }}" }
  - { id: gate, after: [draft], approval: "Edit the draft?" }
  - { id: edit, agent: editor, after: [gate], prompt: "Edit: {{ steps.draft.output }}" }
  - { id: title, agent: writer, after: [edit], prompt: "Title for: {{ steps.edit.output }}" }
"#;

/// The step `id` of `run`.
fn step<'a>(run: &'a Value, id: &str) -> &'a Value {
    run["steps"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["id"] == id)
        .unwrap_or_else(|| panic!("no step {id}: {run:#}"))
}

#[test]
fn a_run_survives_a_killed_server_and_no_recorded_step_runs_twice() {
    let lab = Lab::new(env!("CARGO_BIN_EXE_skein"));
    let mut server = lab.server();
    let _agent = lab.agent("laptop");
    lab.nodes_up(1);
    let file = workflow_file(lab.dir(), GATED_STORY);
    let submitted = lab.cli(&["submit", file.to_str().unwrap(), "--input", "topic=GPUs"]);
    assert!(submitted.status.success(), "{}", stderr(&submitted));
    let id = stdout(&submitted).trim().to_owned();
    // Nothing after the gate can run until the test approves: the state seen here is
    // the state the server dies in.
    let before = lab.wait_run(&id, "the approval waiting", |r| {
        r["steps"].is_array() && step(r, "gate")["state"] == "waiting"
    });
    assert_eq!(before["state"], "running", "{before:#}");
    assert_eq!(step(&before, "draft")["state"], "done", "{before:#}");
    for later in ["edit", "title"] {
        assert_eq!(step(&before, later)["state"], "pending", "{later}: {before:#}");
    }
    let _ = server.0.kill(); // SIGKILL
    let _ = server.0.wait();
    drop(server);

    let _server = lab.server();
    // The restarted server has the run where it died (queued again until the agent is
    // back, then running): the draft recorded, the approval waiting again, which only a
    // running run's approval takes.
    let resumed = lab.wait_run(&id, "the run running again, its approval waiting", |r| {
        r["state"] == "running" && step(r, "gate")["state"] == "waiting"
    });
    assert_eq!(step(&resumed, "draft")["output"], step(&before, "draft")["output"]);
    let approved = lab.cli(&["run", "approve", &id, "gate"]);
    assert!(approved.status.success(), "{}", stderr(&approved));
    let after = lab.wait_run(&id, "the resumed run", |r| {
        matches!(r["state"].as_str(), Some("succeeded" | "failed"))
    });
    assert_eq!(after["state"], "succeeded", "{after:#}");
    // The draft, recorded done before the crash, kept its answer and its single attempt.
    let draft = step(&before, "draft");
    let now = step(&after, "draft");
    assert_eq!(now["attempts"], 1, "the draft ran once");
    assert_eq!(now["finished_at"], draft["finished_at"], "the draft was not run again");
    assert_eq!(now["output"], draft["output"]);
    // The steps after the gate ran on the restarted server, once each.
    for later in ["edit", "title"] {
        assert_eq!(step(&after, later)["state"], "done", "{later}: {after:#}");
        assert_eq!(step(&after, later)["attempts"], 1, "{later}: {after:#}");
    }
}

#[test]
fn a_killed_agent_has_its_instance_placed_on_another_node() {
    let lab = Lab::new(env!("CARGO_BIN_EXE_skein"));
    let _server = lab.server();
    let mut first = lab.agent("node-a");
    lab.nodes_up(1);
    let slow = STORY.replace("max_tokens: 12", "max_tokens: 200");
    let file = workflow_file(lab.dir(), &slow);
    let submitted = lab.cli(&["submit", file.to_str().unwrap(), "--input", "topic=GPUs"]);
    assert!(submitted.status.success(), "{}", stderr(&submitted));
    let id = stdout(&submitted).trim().to_owned();
    lab.wait_run(&id, "the first step", |r| r["steps"][0]["state"] == "done");
    let _second = lab.agent("node-b");
    lab.nodes_up(2);
    let _ = first.0.kill();
    let _ = first.0.wait();
    let run = lab.wait_run(&id, "the run on node-b", |r| {
        matches!(r["state"].as_str(), Some("succeeded" | "failed"))
    });
    assert_eq!(run["state"], "succeeded", "{run:#}");
    let instances = lab.get("/v1/instances");
    assert!(
        instances
            .as_array()
            .unwrap()
            .iter()
            .any(|i| i["node_name"] == "node-b" && i["state"] == "ready"),
        "{instances:#}"
    );
}

/// Two sessions on the tiny model say the same two things; one of them moves to the
/// other node between its turns. Its second reply, from a new engine process there,
/// equals the unmoved session's: the new instance was given the whole history. (Moves
/// between GPUs, with engines recording what they are sent, are in
/// orchestrator/tests/sessions.rs: here the real built-in engine runs on CPUs.)
#[test]
fn a_session_moves_to_another_node_and_continues_with_its_history() {
    let lab = Lab::new(env!("CARGO_BIN_EXE_skein"));
    let _server = lab.server();
    let _a = lab.agent("node-a");
    let _b = lab.agent("node-b");
    lab.nodes_up(2);

    let create = || {
        let created = lab.cli(&[
            "session",
            "create",
            "--model",
            "skein-test/tiny-llama",
            "--system",
            "Be brief.",
        ]);
        assert!(created.status.success(), "{}", stderr(&created));
        stdout(&created).trim().to_owned()
    };
    let (moving, staying) = (create(), create());
    let say = |id: &str, text: &str| {
        let said = lab.cli(&["session", "chat", id, "--message", text]);
        assert!(said.status.success(), "{}\n{}", stdout(&said), stderr(&said));
        stdout(&said).trim().to_owned()
    };
    let first = say(&moving, "hello there");
    assert_eq!(say(&staying, "hello there"), first, "seeded: the same reply");

    let show = |id: &str| -> Value {
        let shown = lab.cli(&["session", "show", id, "--output", "json"]);
        assert!(shown.status.success(), "{}", stderr(&shown));
        serde_json::from_str(&stdout(&shown)).unwrap()
    };
    let before = show(&moving)["binding"].clone();
    let other = if before["node"] == "node-a" { "node-b" } else { "node-a" };
    let moved = lab.cli(&["session", "migrate", &moving, "--to", other]);
    assert!(moved.status.success(), "{}", stderr(&moved));
    assert!(
        stdout(&moved).contains(&format!("to {other} (CPU)")),
        "{}",
        stdout(&moved)
    );

    let second = say(&moving, "and again");
    assert_eq!(
        say(&staying, "and again"),
        second,
        "the moved session saw the same history"
    );
    let after = show(&moving);
    assert_eq!(after["binding"]["node"], other);
    assert_ne!(after["binding"]["instance"], before["instance"]);
    assert_eq!(after["migrations"], 1);
    let history: Vec<(&str, &str)> = after["history"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| (m["role"].as_str().unwrap(), m["content"].as_str().unwrap()))
        .collect();
    assert_eq!(
        history,
        [
            ("user", "hello there"),
            ("assistant", first.as_str()),
            ("user", "and again"),
            ("assistant", second.as_str())
        ]
    );
    assert_eq!(after["history"][3]["instance"], after["binding"]["instance"]);
    let listed = lab.cli(&["sessions"]);
    assert_eq!(
        stdout(&listed)
            .lines()
            .filter(|l| l.contains("skein-test/tiny-llama"))
            .count(),
        2
    );
}

/// The official `openai` Python client, unchanged, against a Skein server: a model by
/// its hub id, whole and streamed (greedy, so both give the same text), and a session
/// continued through `extra_body`.
#[test]
fn the_official_openai_python_client_chats_with_skein() {
    let python = skein_testkit::tools::prepared("llm-clients.sh");
    let lab = Lab::new(env!("CARGO_BIN_EXE_skein"));
    let _server = lab.server();
    let _agent = lab.agent("laptop");
    lab.nodes_up(1);
    let created = lab.cli(&["session", "create", "--model", "skein-test/tiny-llama"]);
    assert!(created.status.success(), "{}", stderr(&created));
    let session = stdout(&created).trim().to_owned();
    let token = std::fs::read_to_string(lab.data_dir().join("api-token")).unwrap();
    let script = r#"
import json, os
from openai import OpenAI

client = OpenAI(base_url=os.environ["SKEIN"] + "/v1", api_key=os.environ["TOKEN"], max_retries=0)
ask = [{"role": "user", "content": "hello there"}]
whole = client.chat.completions.create(model="skein-test/tiny-llama", messages=ask, max_tokens=8, temperature=0)
text = whole.choices[0].message.content
assert whole.object == "chat.completion" and whole.usage.completion_tokens > 0, whole
stream = client.chat.completions.create(model="skein-test/tiny-llama", messages=ask, max_tokens=8,
                                        temperature=0, stream=True, stream_options={"include_usage": True})
pieces, usage = [], None
for chunk in stream:
    if chunk.choices:
        pieces.append(chunk.choices[0].delta.content or "")
    if chunk.usage:
        usage = chunk.usage
assert "".join(pieces) == text, (pieces, text)
assert usage is not None and usage.completion_tokens > 0
turns = []
for content in ["first turn", "second turn"]:
    reply = client.chat.completions.create(model="skein-test/tiny-llama", max_tokens=8, temperature=0,
        messages=[{"role": "user", "content": content}], extra_body={"session_id": os.environ["SESSION"]})
    turns.append(reply.choices[0].message.content)
models = [m.id for m in client.models.list()]
print(json.dumps({"text": text, "turns": turns, "models": models}))
"#;
    let output = Command::new(&python)
        .args(["-c", script])
        .env("SKEIN", lab.api())
        .env("TOKEN", token.trim())
        .env("SESSION", &session)
        .env("NO_PROXY", "127.0.0.1")
        .output()
        .unwrap();
    assert!(output.status.success(), "{}\n{}", stdout(&output), stderr(&output));
    let result: Value = serde_json::from_str(stdout(&output).trim()).unwrap();
    assert!(!result["text"].as_str().unwrap().is_empty(), "{result}");
    // The session holds both turns and both replies, in order.
    let shown = lab.cli(&["session", "show", &session, "--output", "json"]);
    let shown: Value = serde_json::from_str(&stdout(&shown)).unwrap();
    let history: Vec<&str> = shown["history"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["content"].as_str().unwrap())
        .collect();
    let turns = &result["turns"];
    assert_eq!(
        history,
        [
            "first turn",
            turns[0].as_str().unwrap(),
            "second turn",
            turns[1].as_str().unwrap()
        ]
    );
}

/// schemathesis, an OpenAPI-driven fuzzer, against the server's own `/v1/openapi.json`
/// with the admin token, on a live server with an agent serving the tiny model: every
/// operation gets schema examples, boundary and negative cases and random inputs. No
/// answer may be a 5xx, and every answer must match the document (status, content type,
/// headers, body schema); invalid inputs must be refused with a 4xx.
#[test]
fn the_api_holds_to_its_openapi_document_under_schemathesis() {
    let python = skein_testkit::tools::prepared("schemathesis.sh");
    let schemathesis = python.with_file_name("schemathesis");
    let lab = Lab::new(env!("CARGO_BIN_EXE_skein"));
    let _server = lab.server();
    let _agent = lab.agent("laptop");
    lab.nodes_up(1);
    // Something to read: a session with messages, and a run.
    let created = lab.cli(&["session", "create", "--model", "skein-test/tiny-llama"]);
    assert!(created.status.success(), "{}", stderr(&created));
    let session = stdout(&created).trim().to_owned();
    let chat = lab.cli(&["session", "chat", &session, "--message", "hello"]);
    assert!(chat.status.success(), "{}", stderr(&chat));
    let doomed = lab.cli(&["session", "create", "--model", "skein-test/tiny-llama"]);
    let doomed = stdout(&doomed).trim().to_owned();
    let file = workflow_file(lab.dir(), STORY);
    let submitted = lab.cli(&["submit", file.to_str().unwrap(), "--input", "topic=GPUs", "--wait"]);
    assert!(submitted.status.success(), "{}", stderr(&submitted));
    let runs = lab.get("/v1/runs");
    let run = runs["data"][0]["id"].as_str().unwrap();
    let token = std::fs::read_to_string(lab.data_dir().join("api-token")).unwrap();
    // The operations on one session or run get a real id, so the fuzzer reaches past the
    // 404 into turns (the real engine), moves and a finished run's event stream.
    let reports = tempfile::tempdir().unwrap();
    let config = reports.path().join("schemathesis.toml");
    let mut operations = String::new();
    for (operations_of, id) in [
        ("get_session", &session),
        ("list_messages", &session),
        ("send_messages", &session),
        ("migrate_session", &session),
        ("delete_session", &doomed),
        ("get_run", &run.to_owned()),
        ("cancel_run", &run.to_owned()),
        ("run_events", &run.to_owned()),
    ] {
        operations.push_str(&format!(
            "[[operations]]\ninclude-operation-id = \"{operations_of}\"\nparameters = {{ \"path.id\" = \"{id}\" }}\n\n"
        ));
    }
    // Removing or resetting a node is tried on a name no node has: removing `laptop`
    // would take the node serving the session and the run out from under the other
    // operations (its agent joins again, as a new node).
    for operation in ["remove_node", "reset_node"] {
        operations.push_str(&format!(
            "[[operations]]\ninclude-operation-id = \"{operation}\"\nparameters = {{ \"path.name\" = \"no-such-node\" }}\n\n"
        ));
    }
    std::fs::write(&config, operations).unwrap();
    let mut command = Command::new(&schemathesis);
    command
        .arg("--config-file")
        .arg(&config)
        .arg("run")
        .arg(format!("{}/v1/openapi.json", lab.api()))
        .args(["--header", &format!("Authorization: Bearer {}", token.trim())])
        .args([
            "--checks",
            "not_a_server_error,status_code_conformance,content_type_conformance,\
             response_headers_conformance,response_schema_conformance,negative_data_rejection",
        ])
        // The graph's and the reflexes' event streams never end, by design.
        .args(["--exclude-path-regex", "^/v1/(graph/events|events/stream)$"])
        .args(["--phases", "examples,coverage,fuzzing"])
        // One worker: Python 3.11's parser is not safe across the fuzzer's threads.
        .args(["--max-examples", "30", "--seed", "7", "--workers", "1"])
        .args(["--generation-database", "none", "--request-timeout", "60"])
        .args(["--no-color", "--report-dir"])
        .arg(reports.path())
        .env("SCHEMATHESIS_HOOKS", "")
        // Its cache directory goes beside the reports, not into the checkout.
        .current_dir(reports.path());
    let output = output_within(&mut command, Duration::from_secs(900), "schemathesis");
    assert!(
        output.status.success(),
        "schemathesis found failures:\n{}\n{}",
        stdout(&output),
        stderr(&output)
    );
    // No reflex in these workflows: the event log is empty, and says so.
    let events = lab.cli(&["events"]);
    assert!(events.status.success(), "{}", stderr(&events));
    assert!(
        stdout(&events).contains("no reflex has fired yet"),
        "{}",
        stdout(&events)
    );
}
