//! `skein session` and `skein instances` end to end, with the real server, agent and CLI:
//!
//! - A session whose agent is a remote endpoint chats through `skein session chat` as
//!   it does through `POST /v1/sessions/ID/messages`: with an OpenAI-compatible server
//!   that streams, and with one that answers a whole completion even when asked to
//!   stream (many do).
//! - One warm instance serves a model: a run's agents, a call of the agent by name on
//!   the OpenAI route after the run ended, and a session on the same model share it,
//!   and `skein instances` says who uses it.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde_json::{Value, json};
use skein_testkit::agent::{EngineBehaviour, Tasks, fake_engine};
use skein_testkit::lab::{Lab, stderr, stdout};

/// An OpenAI-compatible server on loopback that answers every chat request with one
/// whole completion (`application/json`), `stream: true` or not; returns its base URL
/// and the count of requests it answered.
fn whole_answer_endpoint() -> (String, Arc<AtomicU64>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let answered = Arc::new(AtomicU64::new(0));
    let count = Arc::clone(&answered);
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let count = Arc::clone(&count);
            std::thread::spawn(move || {
                let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
                let mut request = Vec::new();
                let mut buffer = [0u8; 4096];
                loop {
                    let Ok(n) = stream.read(&mut buffer) else { return };
                    if n == 0 {
                        return;
                    }
                    request.extend_from_slice(&buffer[..n]);
                    let text = String::from_utf8_lossy(&request).to_string();
                    if let Some(end) = text.find("\r\n\r\n") {
                        let length = text[..end]
                            .lines()
                            .find_map(|l| {
                                let (name, value) = l.split_once(':')?;
                                name.eq_ignore_ascii_case("content-length")
                                    .then(|| value.trim().parse::<usize>().ok())
                                    .flatten()
                            })
                            .unwrap_or(0);
                        if request.len() >= end + 4 + length {
                            break;
                        }
                    }
                }
                count.fetch_add(1, Ordering::SeqCst);
                let body = json!({
                    "id": "c", "object": "chat.completion",
                    "choices": [{"index": 0, "message": {"role": "assistant", "content": "a whole answer"}, "finish_reason": "stop"}],
                    "usage": {"prompt_tokens": 4, "completion_tokens": 3}
                })
                .to_string();
                let _ = write!(
                    stream,
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
            });
        }
    });
    (format!("http://127.0.0.1:{port}/v1"), answered)
}

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
    let (whole, whole_answered) = whole_answer_endpoint();
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
    assert_eq!(whole_answered.load(Ordering::SeqCst), 3);
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
