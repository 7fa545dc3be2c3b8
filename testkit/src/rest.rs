//! A `skein server`'s REST API from a client's side, for the tests that drive runs
//! through the real server: calls with the admin token that tell "not answering" (the
//! server is down or starting) from an answer, waits on a run, and a server on a fixed
//! port that a test kills (SIGKILL) and starts again on the same data.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::net::free_port;
use crate::sessions::BareServer;

/// How long a test waits for a server or a run.
pub const PATIENCE: Duration = Duration::from_secs(120);

/// The REST API of a server, called with one token.
pub struct RestApi {
    /// `http://127.0.0.1:PORT`.
    pub base: String,
    token: String,
    http: reqwest::Client,
    runtime: tokio::runtime::Runtime,
}

impl RestApi {
    /// The API of a server on `port`, called with `token`.
    pub fn new(port: u16, token: &str) -> RestApi {
        RestApi {
            base: format!("http://127.0.0.1:{port}"),
            token: token.to_owned(),
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(10))
                .build()
                .expect("an HTTP client"),
            runtime: tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime for the HTTP client"),
        }
    }

    /// GET `path`, or POST `body` to it: the status and JSON body; `None` while the
    /// server does not answer.
    pub fn call(&self, path: &str, body: Option<Value>) -> Option<(u16, Value)> {
        self.runtime.block_on(async {
            let url = format!("{}{path}", self.base);
            let request = match body {
                Some(body) => self.http.post(url).json(&body),
                None => self.http.get(url),
            };
            let response = request.bearer_auth(&self.token).send().await.ok()?;
            let status = response.status().as_u16();
            Some((status, response.json().await.unwrap_or(Value::Null)))
        })
    }

    /// GET `path`: the status and the body as text; `None` while the server does not
    /// answer.
    pub fn text(&self, path: &str) -> Option<(u16, String)> {
        self.runtime.block_on(async {
            let url = format!("{}{path}", self.base);
            let response = self.http.get(url).bearer_auth(&self.token).send().await.ok()?;
            let status = response.status().as_u16();
            Some((status, response.text().await.unwrap_or_default()))
        })
    }

    /// Waits until the server answers.
    pub fn wait_up(&self) {
        let deadline = Instant::now() + PATIENCE;
        while self.call("/healthz", None).is_none() {
            assert!(Instant::now() < deadline, "the server did not start");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Submits `workflow`; the run's id.
    pub fn submit(&self, workflow: &str) -> String {
        let (status, body) = self
            .call("/v1/runs", Some(json!({"workflow": workflow})))
            .expect("the server answers");
        assert!(status == 201 || status == 202, "{status}: {body:#}");
        body["id"].as_str().expect("the run's id").to_owned()
    }

    /// Run `id` as the server has it now.
    pub fn run(&self, id: &str) -> Option<Value> {
        self.call(&format!("/v1/runs/{id}"), None).map(|(_, run)| run)
    }

    /// Run `id` once `done` holds of it; `what` names the wait in the failure.
    pub fn until(&self, id: &str, what: &str, done: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + PATIENCE;
        let mut last = None;
        loop {
            if let Some(run) = self.run(id) {
                if done(&run) {
                    return run;
                }
                last = Some(run);
            }
            assert!(
                Instant::now() < deadline,
                "run {id}: {what} did not happen; the run: {last:#?}"
            );
            std::thread::sleep(Duration::from_millis(25));
        }
    }

    /// Run `id` once it ended.
    pub fn finished(&self, id: &str) -> Value {
        self.until(id, "ending", |run| {
            matches!(run["state"].as_str(), Some("succeeded" | "failed" | "cancelled"))
        })
    }
}

/// A server on a fixed port with its data directory, so that it can be killed and
/// started again on the same data.
pub struct Restartable {
    skein: PathBuf,
    data: PathBuf,
    port: u16,
    token: String,
    args: Vec<String>,
    /// The running server.
    pub server: BareServer,
    /// Its API.
    pub api: RestApi,
}

impl Restartable {
    /// Starts `skein server` (the binary `skein`) on `data` with `token` as the admin
    /// token and `args`, and waits until it answers. Its log is `data` with the
    /// extension `log`.
    pub fn start(skein: &Path, data: PathBuf, token: &str, args: &[&str]) -> Restartable {
        let port = free_port();
        let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
        let server = spawn(skein, &data, port, token, &args);
        let api = RestApi::new(port, token);
        api.wait_up();
        Restartable {
            skein: skein.to_owned(),
            data,
            port,
            token: token.to_owned(),
            args,
            server,
            api,
        }
    }

    /// SIGKILL, then a start on the same data and port, waiting until it answers.
    pub fn kill_and_restart(&mut self) {
        self.server.0.kill().expect("the server is killed");
        self.server.0.wait().expect("the killed server is reaped");
        self.server = spawn(&self.skein, &self.data, self.port, &self.token, &self.args);
        self.api.wait_up();
        // Another program may have taken the port while it was free: then what answers
        // is not this server, which exited.
        if let Ok(Some(status)) = self.server.0.try_wait() {
            panic!("the restarted server exited ({status}); its log:\n{}", self.log());
        }
    }

    /// What the server logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.data.with_extension("log")).unwrap_or_default()
    }

    /// `skein ARGS… --server URL` with the token: whether it succeeded, and its stdout
    /// and stderr together.
    pub fn cli(&self, args: &[&str]) -> (bool, String) {
        let out = Command::new(&self.skein)
            .args(args)
            .args(["--server", &self.api.base])
            .env("SKEIN_API_TOKEN", &self.token)
            .output()
            .expect("the skein CLI runs");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.success(), text)
    }
}

fn spawn(skein: &Path, data: &Path, port: u16, token: &str, args: &[String]) -> BareServer {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    BareServer::start_with(
        skein,
        data,
        port,
        free_port(),
        token,
        Some(&data.with_extension("log")),
        &args,
    )
}
