//! Hostile Rhai against the real `skein` binary: nothing a workflow says can abort or
//! stall the process.
//!
//! - A closure chain (`let f = || 1; loop { let g = f; f = || g.call() + 1; }`), whose
//!   drop once overflowed the stack, is refused with a diagnostic by `skein validate`
//!   (as a `.rhai` script and as a YAML `when:`), by `POST /v1/plans` and `POST /v1/runs`;
//!   the server stays up.
//! - Busy-loop workflows evaluated at once by two users do not hold the server's
//!   runtime: `/healthz` answers, several times over, while they are still being
//!   evaluated; a user's third concurrent evaluation is answered 429.
//! - A stored run whose `when:` cannot be evaluated (planted in the store while the
//!   server is down, as an older server could have stored it) fails with a reason when
//!   the restarted server resumes it; the server stays up.

use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use skein_testkit::lab::{Lab, stderr, stdout};
use skein_testkit::net::free_port;

/// The binary under test: `SKEIN_UNDER_TEST` names another build (an older one, to see
/// these tests fail on it), else this package's.
fn skein() -> String {
    std::env::var("SKEIN_UNDER_TEST").unwrap_or_else(|_| env!("CARGO_BIN_EXE_skein").to_owned())
}

const CHAIN: &str = "let f = || 1; loop { let g = f; f = || g.call() + 1; }";
const ADMIN: &str = "rhai-hostile-admin-token";

fn chain_script() -> String {
    format!("workflow(\"chain\");\n{CHAIN}\n")
}

fn chain_yaml() -> String {
    format!(
        "name: chain\nagents:\n  a: {{ model: Qwen/Qwen2.5-0.5B-Instruct }}\nsteps:\n  - id: s\n    agent: a\n    prompt: hi\n    when: \"{CHAIN}\"\n"
    )
}

fn validate(dir: &Path, name: &str, text: &str) -> Output {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    Command::new(skein())
        .args(["validate", "--color", "never"])
        .arg(&path)
        .output()
        .unwrap()
}

#[test]
fn validate_refuses_a_closure_chain_with_a_diagnostic() {
    let dir = tempfile::tempdir().unwrap();
    let script = validate(dir.path(), "chain.rhai", &chain_script());
    assert_eq!(
        script.status.code(),
        Some(1),
        "{}\n{}",
        stdout(&script),
        stderr(&script)
    );
    let text = format!("{}{}", stdout(&script), stderr(&script));
    assert!(text.contains("`g` is not defined here"), "{text}");
    assert!(text.contains("pass `g` as an argument"), "{text}");

    let yaml = validate(dir.path(), "chain.yaml", &chain_yaml());
    assert_eq!(yaml.status.code(), Some(1), "{}\n{}", stdout(&yaml), stderr(&yaml));
    let text = format!("{}{}", stdout(&yaml), stderr(&yaml));
    assert!(text.contains("`g` is not defined here"), "{text}");
    assert!(text.contains("cannot capture"), "{text}");
}

struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `skein server` with two runtime workers (as on a two-core machine, so that two
/// evaluations on workers would hold all of them), answering `/healthz`.
fn start_server(data: &Path) -> (Server, String) {
    let (api, grpc) = (free_port(), free_port());
    let child = Command::new(skein())
        .args(["server", "--listen", &format!("127.0.0.1:{api}")])
        .args(["--agent-listen", &format!("127.0.0.1:{grpc}")])
        .args(["--api-token", ADMIN, "--data-dir"])
        .arg(data)
        .env("TOKIO_WORKER_THREADS", "2")
        .env("HF_HUB_OFFLINE", "1")
        .env("HF_HOME", data.join("hf"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let server = Server(child);
    let base = format!("http://127.0.0.1:{api}");
    let deadline = Instant::now() + Duration::from_secs(60);
    while !healthy(&base) {
        assert!(Instant::now() < deadline, "the server did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
    (server, base)
}

/// One request on a runtime of its own (tests call this from several threads).
fn request(builder: impl FnOnce(&reqwest::Client) -> reqwest::RequestBuilder) -> Option<(u16, Value)> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let client = reqwest::Client::new();
        let response = builder(&client).timeout(Duration::from_secs(120)).send().await.ok()?;
        let status = response.status().as_u16();
        let text = response.text().await.unwrap_or_default();
        Some((status, serde_json::from_str(&text).unwrap_or(Value::Null)))
    })
}

fn healthy(base: &str) -> bool {
    request(|c| c.get(format!("{base}/healthz"))).is_some_and(|(status, _)| status == 200)
}

fn post(base: &str, token: &str, path: &str, body: &Value) -> (u16, Value) {
    request(|c| c.post(format!("{base}{path}")).bearer_auth(token).json(body)).unwrap_or((0, Value::Null))
}

fn messages(body: &Value) -> String {
    body["diagnostics"]
        .as_array()
        .map(|d| {
            d.iter()
                .map(|d| d["message"].as_str().unwrap_or("").to_owned())
                .collect::<Vec<_>>()
                .join("; ")
        })
        .unwrap_or_default()
}

#[test]
fn the_server_survives_closure_chains_in_plans_and_runs() {
    let data = tempfile::tempdir().unwrap();
    let (mut server, base) = start_server(data.path());
    for (name, text) in [("chain.rhai", chain_script()), ("chain.yaml", chain_yaml())] {
        let body = json!({"workflow": text, "name": name});
        let (status, answer) = post(&base, ADMIN, "/v1/plans", &body);
        assert_eq!(status, 422, "plan of {name}: {answer}");
        assert!(messages(&answer).contains("`g` is not defined here"), "{answer}");
        let (status, answer) = post(&base, ADMIN, "/v1/runs", &body);
        assert_eq!(status, 422, "run of {name}: {answer}");
        assert!(healthy(&base), "the server went down after {name}");
    }
    assert!(server.0.try_wait().unwrap().is_none(), "the server exited");
}

/// A script that runs until a limit stops it: every operation scans 100 kB.
const BUSY: &str = "workflow(\"busy\");\nlet s = \"x\";\ns.pad(100000, \"x\");\nlet n = 0;\nloop { if s.contains(\"y\") { n += 1; } }\n";

#[test]
fn busy_workflows_do_not_hold_the_server_and_a_third_per_user_is_refused() {
    let data = tempfile::tempdir().unwrap();
    let (_server, base) = start_server(data.path());
    let mut tokens = Vec::new();
    for user in ["ada", "bob"] {
        let (status, made) = post(&base, ADMIN, "/v1/tokens", &json!({"user": user}));
        assert_eq!(status, 201, "{made}");
        tokens.push(made["token"].as_str().unwrap().to_owned());
    }

    // Two plans by each user at once, then a third by ada while they are evaluated.
    let (done, answers) = mpsc::channel::<(String, u16, Value)>();
    let mut plans = Vec::new();
    for (user, token) in ["ada", "ada", "bob", "bob"].into_iter().zip([0, 0, 1, 1]) {
        let (done, base, token) = (done.clone(), base.clone(), tokens[token].clone());
        plans.push(std::thread::spawn(move || {
            let (status, body) = post(
                &base,
                &token,
                "/v1/plans",
                &json!({"workflow": BUSY, "name": "busy.rhai"}),
            );
            let _ = done.send((user.to_owned(), status, body));
        }));
    }
    drop(done);

    // While none of the four has been answered, /healthz answers, several times over.
    let mut healthz_answers = 0;
    let mut early: Vec<(String, u16, Value)> = Vec::new();
    while healthz_answers < 5 {
        assert!(healthy(&base), "/healthz failed");
        match answers.try_recv() {
            Ok(answer) => {
                early.push(answer);
                break;
            }
            Err(_) => healthz_answers += 1,
        }
    }
    assert_eq!(
        healthz_answers, 5,
        "a plan was answered before /healthz answered 5 times: the evaluations held the server ({early:?})"
    );
    let (status, third) = post(
        &base,
        &tokens[0],
        "/v1/plans",
        &json!({"workflow": BUSY, "name": "busy.rhai"}),
    );
    let still_evaluating = answers.try_recv().is_err() && early.is_empty();
    if still_evaluating {
        assert_eq!(status, 429, "{third}");
        assert!(
            third["error"]["message"]
                .as_str()
                .unwrap_or("")
                .contains("being evaluated already"),
            "{third}"
        );
    }

    for plan in plans {
        plan.join().unwrap();
    }
    for (user, status, body) in early.into_iter().chain(answers.iter()) {
        assert_eq!(status, 422, "{user}: {body}");
        let said = messages(&body);
        assert!(
            said.contains("took too long") || said.contains("too many operations"),
            "{user}: {said}"
        );
    }
}

/// A run with a pending step whose `when:` is replaced, in the store, by a closure
/// chain while the server is down: the restarted server fails the run with a reason.
#[test]
fn a_stored_run_whose_when_cannot_be_evaluated_fails_and_the_server_stays_up() {
    let lab = Lab::new(skein());
    let mut server = lab.server();
    let _agent = lab.agent("laptop");
    lab.nodes_up(1);
    let placeholder = "inputs.topic != \"never-this\"";
    let workflow = format!(
        "name: story\ninputs: {{ topic: {{ type: string }} }}\nagents:\n  writer: {{ model: {{ repo: skein-test/tiny-llama, context: 256 }}, temperature: 0, max_tokens: 200 }}\nsteps:\n  - {{ id: draft, agent: writer, prompt: \"Tell me about {{{{ inputs.topic }}}}\" }}\n  - {{ id: edit, agent: writer, after: [draft], when: '{placeholder}', prompt: \"Edit: {{{{ steps.draft.output }}}}\" }}\n"
    );
    let file = lab.dir().join("story.yaml");
    std::fs::write(&file, workflow).unwrap();
    let submitted = lab.cli(&["submit", file.to_str().unwrap(), "--input", "topic=GPUs"]);
    assert!(submitted.status.success(), "{}", stderr(&submitted));
    let id = stdout(&submitted).trim().to_owned();
    lab.wait_run(&id, "the first step to start", |r| r["steps"][0]["state"] == "running");
    server.kill();
    drop(server);

    // What an older server could have stored: the closure chain as `edit`'s `when`.
    {
        let db = skein_orchestrator::store::Db::open(&lab.data_dir().join("db")).unwrap();
        let runs: skein_orchestrator::store::Tree<Value> = db.tree("runs").unwrap();
        let record = runs.get(&id).unwrap().expect("the run is stored");
        let text = serde_json::to_string(&record).unwrap();
        let quoted = serde_json::to_string(placeholder).unwrap();
        assert!(text.contains(&quoted), "{text}");
        let planted: Value =
            serde_json::from_str(&text.replace(&quoted, &serde_json::to_string(CHAIN).unwrap())).unwrap();
        runs.put_blocking(&id, &planted).unwrap();
    }

    let _server = lab.server();
    let after = lab.wait_run(&id, "the resumed run to end", |r| {
        matches!(r["state"].as_str(), Some("succeeded" | "failed"))
    });
    assert_eq!(after["state"], "failed", "{after:#}");
    let edit = after["steps"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["id"] == "edit")
        .unwrap();
    let error = edit["error"].as_str().unwrap_or("");
    assert!(error.contains("its `when` failed"), "{after:#}");
    assert!(healthy(&lab.api()), "the server went down");
}
