//! `skein session` and `skein instances` end to end, with the real server, agent and CLI:
//!
//! - A session whose agent is a remote endpoint chats through `skein session chat` as
//!   it does through `POST /v1/sessions/ID/messages`: with an OpenAI-compatible server
//!   that streams, and with one that answers a whole completion even when asked to
//!   stream (many do).
//! - One warm instance serves a model: a run's agents, a call of the agent by name on
//!   the OpenAI route after the run ended, and a session on the same model share it,
//!   and `skein instances` says who uses it.

use std::net::TcpListener;
use std::path::Path;

use serde_json::{Value, json};
use skein_testkit::agent::{EngineBehaviour, Tasks, fake_engine};
use skein_testkit::endpoint::WholeAnswer;
use skein_testkit::lab::{Lab, stderr, stdout};

fn write(dir: &Path, name: &str, text: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path.to_str().unwrap().to_owned()
}

/// Submits `file` and waits for it; returns the run's id.
fn run_to_the_end(lab: &Lab, file: &str) -> String {
    let submitted = lab.cli(&["submit", file, "--wait", "--output", "json"]);
    assert!(
        submitted.status.success(),
        "{}\n{}\n{}",
        stdout(&submitted),
        stderr(&submitted),
        lab.logs(30)
    );
    let run: Value = serde_json::from_str(&stdout(&submitted)).unwrap();
    assert_eq!(run["state"], "succeeded", "{run:#}");
    run["id"].as_str().unwrap().to_owned()
}

#[test]
fn session_chat_works_with_a_remote_endpoint_agent() {
    let lab = Lab::new(env!("CARGO_BIN_EXE_skein")).server_args(&["--endpoint-allow", "127.0.0.1"]);
    let _server = lab.server();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let tasks = Tasks::default();
    let streaming = runtime.block_on(fake_engine(EngineBehaviour::default(), &tasks));
    let plain = WholeAnswer::start("a whole answer");
    let whole = plain.url();
    // A port nothing listens on any more.
    let gone = {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://127.0.0.1:{}/v1", listener.local_addr().unwrap().port())
    };

    let file = write(
        lab.dir(),
        "remote.yaml",
        &format!(
            "name: remote\nagents:\n  streamer: {{ endpoint: {{ url: \"{streaming}\", model: m }} }}\n  \
             plain: {{ endpoint: {{ url: \"{whole}\", model: m }} }}\n  \
             gone: {{ endpoint: {{ url: \"{gone}\", model: m }} }}\nsteps:\n  \
             - {{ id: a, agent: streamer, prompt: hi }}\n  - {{ id: b, agent: plain, prompt: hi }}\n"
        ),
    );
    let run = run_to_the_end(&lab, &file);

    for (agent, reply) in [("streamer", "echo: hello there"), ("plain", "a whole answer")] {
        let created = lab.cli(&["session", "create", "--agent", agent, "--run", &run]);
        assert!(created.status.success(), "{}", stderr(&created));
        let id = stdout(&created).trim().to_owned();

        let said = lab.cli(&["session", "chat", &id, "--message", "hello there"]);
        assert!(
            said.status.success(),
            "`skein session chat` with the endpoint agent `{agent}` failed:\n{}\n{}",
            stdout(&said),
            stderr(&said)
        );
        assert_eq!(stdout(&said).trim(), reply, "{}", stderr(&said));

        // The same session through the API, not streamed: the history has both turns.
        let (status, body) = lab.post(&format!("/v1/sessions/{id}/messages"), &json!({"content": "and again"}));
        assert_eq!(status, 200, "{body}");
        let shown = lab.cli(&["session", "show", &id, "--output", "json"]);
        assert!(shown.status.success(), "{}", stderr(&shown));
        let shown: Value = serde_json::from_str(&stdout(&shown)).unwrap();
        let history: Vec<&str> = shown["history"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["role"].as_str().unwrap())
            .collect();
        assert_eq!(history, ["user", "assistant", "user", "assistant"], "{shown:#}");
        assert_eq!(shown["history"][1]["content"], reply);
        // An endpoint session is bound to no instance of the fleet.
        assert_eq!(shown["binding"], Value::Null, "{shown:#}");
    }
    // An endpoint that does not answer: its own error, not a search for a GPU.
    let created = lab.cli(&["session", "create", "--agent", "gone", "--run", &run]);
    assert!(created.status.success(), "{}", stderr(&created));
    let said = lab.cli(&["session", "chat", stdout(&created).trim(), "--message", "anyone?"]);
    assert!(!said.status.success());
    let error = stderr(&said);
    assert!(error.contains("cannot reach http://127.0.0.1:"), "{error}");
    assert!(!error.contains("GPU"), "{error}");

    // The step, the streamed turn and the plain turn reached the plain endpoint.
    assert_eq!(plain.requests().len(), 3);
    drop(tasks);
}

/// Two agents on the tiny model (one instance serves both), greedy, one step each.
const STORY: &str = r#"
name: story
agents:
  writer: { model: { repo: skein-test/tiny-llama, context: 256 }, temperature: 0, max_tokens: 8 }
  editor: { model: { repo: skein-test/tiny-llama, context: 256 }, temperature: 0, max_tokens: 8, system: "Edit." }
steps:
  - { id: draft, agent: writer, prompt: "Tell me about GPUs" }
  - { id: edit, agent: editor, after: [draft], prompt: "Edit: {{ steps.draft.output }}" }
"#;

#[test]
fn one_warm_instance_serves_the_run_the_openai_route_and_sessions_on_its_model() {
    let lab = Lab::new(env!("CARGO_BIN_EXE_skein"));
    let _server = lab.server();
    let _agent = lab.agent("laptop");
    lab.nodes_up(1);
    let file = write(lab.dir(), "story.yaml", STORY);
    let run = run_to_the_end(&lab, &file);
    let instances = || -> Vec<Value> {
        let listed = lab.cli(&["instances", "--output", "json"]);
        assert!(listed.status.success(), "{}", stderr(&listed));
        serde_json::from_str::<Value>(&stdout(&listed))
            .unwrap()
            .as_array()
            .unwrap()
            .clone()
    };
    let warm = instances();
    assert_eq!(warm.len(), 1, "{warm:#?}");
    let name = warm[0]["name"].as_str().unwrap().to_owned();
    assert_eq!(warm[0]["run"], Value::Null, "the run ended: its instance is warm");
    assert_eq!(warm[0]["runs"], json!([run]));

    // The run's agent by name on the OpenAI route, after the run ended.
    let (status, body) = lab.post(
        "/v1/chat/completions",
        &json!({"model": "writer", "max_tokens": 4, "messages": [{"role": "user", "content": "hello"}]}),
    );
    assert_eq!(status, 200, "{body:#}\n{}", lab.logs(30));
    // A session on the same model, named alone (the language's default context is
    // larger than the instance's: any context of the model will do), and one on the
    // run's agent.
    let mut sessions = Vec::new();
    let run_agent = ["session", "create", "--agent", "editor", "--run", run.as_str()];
    for args in [
        &["session", "create", "--model", "skein-test/tiny-llama"][..],
        &run_agent[..],
    ] {
        let created = lab.cli(args);
        assert!(created.status.success(), "{args:?}: {}", stderr(&created));
        let id = stdout(&created).trim().to_owned();
        let said = lab.cli(&["session", "chat", &id, "--message", "hello there"]);
        assert!(said.status.success(), "{}\n{}", stderr(&said), lab.logs(30));
        sessions.push(id);
    }

    let now = instances();
    assert_eq!(
        now.iter().map(|i| i["name"].as_str().unwrap()).collect::<Vec<_>>(),
        [name.as_str()],
        "one instance serves them all: {now:#?}"
    );
    assert_eq!(now[0]["runs"], json!([run]), "{:#}", now[0]);
    let mut bound: Vec<String> = now[0]["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap().to_owned())
        .collect();
    bound.sort();
    sessions.sort();
    assert_eq!(bound, sessions, "{:#}", now[0]);

    // `skein instances` says who uses it.
    let table = lab.cli(&["instances"]);
    assert!(table.status.success(), "{}", stderr(&table));
    let table = stdout(&table);
    assert!(table.contains("USED BY"), "{table}");
    let row = table.lines().find(|l| l.starts_with(&name)).unwrap();
    for user in sessions.iter().chain([&run]) {
        assert!(row.contains(user.as_str()), "{user} in {table}");
    }
}
