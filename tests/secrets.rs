//! Secrets and the endpoint policy, through the real `skein server` started as the
//! Kubernetes manifests start it: with its own tokens in its environment.
//!
//! - The attack: a user's endpoint agent with `api_key_env: SKEIN_API_TOKEN` aimed at a
//!   loopback listener the user owns used to be sent the admin token there. Now the
//!   workflow is refused at submit (`api_key_env` is not read; loopback is not an
//!   endpoint), and the listener never hears from the server.
//! - Users' secrets: a run resolves the key of its owner only (bob naming alice's
//!   secret gets a clear failure, and nothing is sent), shared secrets are named
//!   explicitly, and no value shows in any answer, the server's log, or its data
//!   directory.
//! - `skein secret set|list|rm` read the value from standard input.

use std::io::Write;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use skein_testkit::endpoint::WholeAnswer;
use skein_testkit::net::free_port;

const ADMIN: &str = "admin-token-from-the-environment-0123456789";
const JOIN: &str = "join-token-from-the-environment-0123456789";
const HF: &str = "hf_token_from_the_environment_0123456789";
const ALICE_KEY: &str = "sk-alice-0123456789abcdef";
const LAB_KEY: &str = "sk-lab-shared-0123456789abcdef";
const PATIENCE: Duration = Duration::from_secs(60);

struct Server {
    child: Child,
    api: String,
    log: std::path::PathBuf,
    http: reqwest::Client,
    runtime: tokio::runtime::Runtime,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Server {
    /// `skein server` with its tokens in its environment, `extra` flags, logging at
    /// debug level to `server.log` in `dir`.
    fn start(dir: &Path, extra: &[&str]) -> Server {
        let api_port = free_port();
        let log = dir.join("server.log");
        let child = Command::new(env!("CARGO_BIN_EXE_skein"))
            .args(["server", "--listen", &format!("127.0.0.1:{api_port}")])
            .args(["--agent-listen", &format!("127.0.0.1:{}", free_port())])
            .arg("--data-dir")
            .arg(dir.join("data"))
            .args(extra)
            .env("SKEIN_API_TOKEN", ADMIN)
            .env("SKEIN_JOIN_TOKEN", JOIN)
            .env("HF_TOKEN", HF)
            .env("HF_HUB_OFFLINE", "1")
            .env("RUST_LOG", "debug")
            .env("NO_COLOR", "1")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let server = Server {
            child,
            api: format!("http://127.0.0.1:{api_port}"),
            log,
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(30))
                .build()
                .unwrap(),
            runtime: tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap(),
        };
        let deadline = Instant::now() + PATIENCE;
        while server
            .runtime
            .block_on(async { server.http.get(format!("{}/healthz", server.api)).send().await })
            .is_err()
        {
            assert!(Instant::now() < deadline, "the server did not start: {}", server.log());
            std::thread::sleep(Duration::from_millis(100));
        }
        server
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn call(&self, method: reqwest::Method, token: &str, path: &str, body: Option<Value>) -> (u16, String) {
        self.runtime.block_on(async {
            let mut request = self
                .http
                .request(method, format!("{}{path}", self.api))
                .bearer_auth(token);
            if let Some(body) = body {
                request = request.json(&body);
            }
            let response = request.send().await.unwrap();
            (response.status().as_u16(), response.text().await.unwrap())
        })
    }

    fn submit(&self, token: &str, workflow: &str) -> (u16, Value) {
        let (status, body) = self.call(
            reqwest::Method::POST,
            token,
            "/v1/runs",
            Some(json!({"workflow": workflow})),
        );
        (status, serde_json::from_str(&body).unwrap_or(Value::Null))
    }

    fn token_for(&self, user: &str) -> String {
        let (status, body) = self.call(reqwest::Method::POST, ADMIN, "/v1/tokens", Some(json!({"user": user})));
        assert_eq!(status, 201, "{body}");
        serde_json::from_str::<Value>(&body).unwrap()["token"]
            .as_str()
            .unwrap()
            .to_owned()
    }

    fn finished(&self, token: &str, id: &str) -> Value {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let (_, body) = self.call(reqwest::Method::GET, token, &format!("/v1/runs/{id}"), None);
            let run: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
            if matches!(run["state"].as_str(), Some("succeeded" | "failed" | "cancelled")) {
                return run;
            }
            assert!(
                Instant::now() < deadline,
                "run {id} did not finish: {run:#}\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

fn endpoint_workflow(url: &str, key: &str) -> String {
    format!(
        "name: remote\nagents:\n  hosted:\n    endpoint: {{ url: \"{url}\", model: m, {key} }}\nsteps:\n  - {{ id: ask, agent: hosted, prompt: hello, retries: 0 }}\n"
    )
}

#[test]
fn a_workflow_cannot_send_the_servers_tokens_to_a_listener_of_its_own() {
    let dir = tempfile::tempdir().unwrap();
    let capture = WholeAnswer::start("captured");
    let server = Server::start(dir.path(), &[]);
    let alice = server.token_for("alice");

    // The attack as reported: the admin token in the server's environment, sent to a
    // loopback listener the user owns.
    for variable in ["SKEIN_API_TOKEN", "SKEIN_JOIN_TOKEN", "HF_TOKEN"] {
        let url = format!("http://127.0.0.1:{}/v1", capture.port);
        let (status, body) = server.submit(&alice, &endpoint_workflow(&url, &format!("api_key_env: {variable}")));
        assert_eq!(status, 422, "{variable}: {body:#}");
        let text = body.to_string();
        assert!(text.contains("`api_key_env` is no longer read"), "{text}");
        assert!(text.contains("api_key_secret"), "{text}");
    }
    // Loopback, however spelled, is no endpoint; the diagnostic points at the `url`.
    for host in [
        "127.0.0.1".to_owned(),
        "localhost".to_owned(),
        "[::ffff:127.0.0.1]".to_owned(),
        "2130706433".to_owned(),
        "[::1]".to_owned(),
        "169.254.169.254".to_owned(),
        "0.0.0.0".to_owned(),
    ] {
        let url = format!("http://{host}:{}/v1", capture.port);
        let (status, body) = server.submit(&alice, &endpoint_workflow(&url, "api_key_secret: openai"));
        assert_eq!(status, 422, "{url}: {body:#}");
        let diagnostic = &body["diagnostics"][0];
        assert!(
            diagnostic["message"]
                .as_str()
                .unwrap_or_default()
                .contains("is not allowed"),
            "{url}: {body:#}"
        );
        assert_eq!(diagnostic["line"], 4, "{url}: {body:#}");
        assert!(body.to_string().contains("--endpoint-allow"), "{body:#}");
    }
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        capture.requests(),
        Vec::<String>::new(),
        "the server called the listener"
    );
    let log = server.log();
    for token in [ADMIN, JOIN, HF] {
        assert!(!log.contains(token), "a token is in the server's log");
    }
}

#[test]
fn a_run_uses_its_owners_secret_only_and_no_value_shows_anywhere() {
    let dir = tempfile::tempdir().unwrap();
    let capture = WholeAnswer::start("captured");
    // `localhost` is allowed by name: the listener is reachable as `localhost`, and
    // loopback by address is still refused.
    let server = Server::start(dir.path(), &["--endpoint-allow", "localhost"]);
    let (alice, bob) = (server.token_for("alice"), server.token_for("bob"));
    let url = format!("http://localhost:{}/v1", capture.port);
    let (status, _) = server.submit(
        &alice,
        &endpoint_workflow(
            &format!("http://127.0.0.1:{}/v1", capture.port),
            "api_key_secret: openai",
        ),
    );
    assert_eq!(status, 422);

    let put = |token: &str, path: &str, value: &str| {
        server.call(reqwest::Method::PUT, token, path, Some(json!({ "value": value })))
    };
    let (status, body) = put(&alice, "/v1/secrets/openai", ALICE_KEY);
    assert_eq!(status, 200, "{body}");
    assert!(!body.contains(ALICE_KEY), "{body}");
    // Only the admin publishes shared secrets.
    assert_eq!(put(&bob, "/v1/shared-secrets/lab", "sk-bob").0, 403);
    assert_eq!(put(ADMIN, "/v1/shared-secrets/lab", LAB_KEY).0, 200);
    let (status, body) = put(&alice, "/v1/secrets/bad%2Fname", "v");
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("is not allowed"), "{body}");

    // Bob names alice's secret: he has none of that name, so nothing is sent.
    let (status, run) = server.submit(&bob, &endpoint_workflow(&url, "api_key_secret: openai"));
    assert_eq!(status, 202, "{run:#}");
    let run = server.finished(&bob, run["id"].as_str().unwrap());
    assert_eq!(run["state"], "failed", "{run:#}");
    assert!(
        run.to_string()
            .contains("secret `openai` is not set for user bob; help: `skein secret set openai` as bob"),
        "{run:#}"
    );
    assert_eq!(capture.requests(), Vec::<String>::new());

    // Alice's run sends her key; bob's run of the shared secret sends the shared one.
    let (_, run) = server.submit(&alice, &endpoint_workflow(&url, "api_key_secret: openai"));
    let alice_run = run["id"].as_str().unwrap().to_owned();
    assert_eq!(server.finished(&alice, &alice_run)["state"], "succeeded");
    let (_, run) = server.submit(&bob, &endpoint_workflow(&url, "api_key_secret: shared/lab"));
    let bob_run = run["id"].as_str().unwrap().to_owned();
    assert_eq!(server.finished(&bob, &bob_run)["state"], "succeeded");
    let requests = capture.requests();
    assert_eq!(requests.len(), 2, "{requests:#?}");
    let authorization = |request: &str| {
        request.lines().find_map(|l| {
            l.to_ascii_lowercase()
                .starts_with("authorization:")
                .then(|| l[14..].trim().to_owned())
        })
    };
    let mut sent: Vec<Option<String>> = requests.iter().map(|r| authorization(r)).collect();
    sent.sort();
    assert_eq!(
        sent,
        [Some(format!("Bearer {ALICE_KEY}")), Some(format!("Bearer {LAB_KEY}"))]
    );

    // Names and times only, in every answer.
    let (_, listed) = server.call(reqwest::Method::GET, &bob, "/v1/secrets", None);
    let listed: Value = serde_json::from_str(&listed).unwrap();
    let names: Vec<&str> = listed["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["lab"], "bob sees the shared secret, not alice's: {listed:#}");
    let (_, listed) = server.call(reqwest::Method::GET, ADMIN, "/v1/secrets", None);
    assert_eq!(
        serde_json::from_str::<Value>(&listed).unwrap()["data"]
            .as_array()
            .unwrap()
            .len(),
        2
    );
    let mut answers = Vec::new();
    for (token, path) in [
        (&alice, "/v1/secrets".to_owned()),
        (&alice, format!("/v1/runs/{alice_run}")),
        (&bob, format!("/v1/runs/{bob_run}")),
        (&alice, "/v1/runs".to_owned()),
        (&alice, "/v1/instances".to_owned()),
        (&alice, "/v1/sessions".to_owned()),
        (&alice, "/v1/events".to_owned()),
        (&ADMIN.to_owned(), "/v1/secrets".to_owned()),
        (&ADMIN.to_owned(), "/v1/tokens".to_owned()),
        (&ADMIN.to_owned(), "/metrics".to_owned()),
        (&ADMIN.to_owned(), "/v1/openapi.json".to_owned()),
    ] {
        let (status, body) = server.call(reqwest::Method::GET, token, &path, None);
        assert!(status < 500, "{path}: {status} {body}");
        answers.push((path, body));
    }
    for (path, body) in &answers {
        for value in [ALICE_KEY, LAB_KEY] {
            assert!(!body.contains(value), "{path} shows a secret: {body}");
        }
    }
    let log = server.log();
    assert!(log.contains("DEBUG"), "the log is at debug level");
    for value in [ALICE_KEY, LAB_KEY, ADMIN, JOIN, HF] {
        assert!(!log.contains(value), "the server's log shows a secret");
    }
    // Encrypted at rest: no file of the data directory holds a value.
    for entry in walk(&dir.path().join("data")) {
        let bytes = std::fs::read(&entry).unwrap_or_default();
        for value in [ALICE_KEY, LAB_KEY] {
            assert!(
                !bytes.windows(value.len()).any(|w| w == value.as_bytes()),
                "{} holds a secret in clear",
                entry.display()
            );
        }
    }

    // Removed: alice's next run fails with the reason, and sends nothing.
    let (status, _) = server.call(reqwest::Method::DELETE, &alice, "/v1/secrets/openai", None);
    assert_eq!(status, 200);
    assert_eq!(
        server
            .call(reqwest::Method::DELETE, &alice, "/v1/secrets/openai", None)
            .0,
        404
    );
    let (_, run) = server.submit(&alice, &endpoint_workflow(&url, "api_key_secret: openai"));
    let run = server.finished(&alice, run["id"].as_str().unwrap());
    assert_eq!(run["state"], "failed", "{run:#}");
    assert_eq!(capture.requests().len(), 2);
}

fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            files.extend(walk(&path));
        } else {
            files.push(path);
        }
    }
    files
}

#[test]
fn the_cli_reads_a_secrets_value_from_standard_input_only() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &[]);
    let alice = server.token_for("alice");
    let skein = |args: &[&str], stdin: &str| {
        let mut child = Command::new(env!("CARGO_BIN_EXE_skein"))
            .args(args)
            .args(["--server", &server.api, "--api-token", &alice])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(stdin.as_bytes()).unwrap();
        child.wait_with_output().unwrap()
    };
    let set = skein(&["secret", "set", "openai"], &format!("{ALICE_KEY}\n"));
    assert!(set.status.success(), "{}", String::from_utf8_lossy(&set.stderr));
    assert!(String::from_utf8_lossy(&set.stderr).contains("api_key_secret: openai"));
    let list = skein(&["secret", "list"], "");
    let text = String::from_utf8_lossy(&list.stdout).to_string();
    assert!(
        list.status.success() && text.contains("openai") && text.contains("alice"),
        "{text}"
    );
    assert!(!text.contains(ALICE_KEY));
    // A value is never an argument.
    let argv = skein(&["secret", "set", "openai", ALICE_KEY], "");
    assert_eq!(argv.status.code(), Some(2), "{}", String::from_utf8_lossy(&argv.stderr));
    let empty = skein(&["secret", "set", "openai"], "");
    assert_eq!(empty.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&empty.stderr).contains("no value given"));
    let bad = skein(&["secret", "set", "no/slashes"], "v\n");
    assert!(String::from_utf8_lossy(&bad.stderr).contains("is not allowed"));
    let shared = skein(&["secret", "set", "--shared", "lab"], "v\n");
    assert!(
        String::from_utf8_lossy(&shared.stderr).contains("only the admin"),
        "{shared:?}"
    );
    let rm = skein(&["secret", "rm", "openai"], "");
    assert!(rm.status.success(), "{}", String::from_utf8_lossy(&rm.stderr));
    let list = skein(&["secret", "list"], "");
    assert!(!String::from_utf8_lossy(&list.stdout).contains("openai"));
}
