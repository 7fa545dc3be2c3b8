//! The store under concurrent writers, and under `kill -9`, through the real `skein
//! server` (counted, not timed: every bound here is a per-request deadline).
//!
//! - Four clients submitting runs at once used to wedge the database within about a
//!   hundred runs (every sled I/O thread blocked in a flush): now every submission is
//!   answered, and every acknowledged run is on disk after a `kill -9`.
//! - The soak: 16 clients mix run submissions, session creates and turns, token creates
//!   and reads for `SKEIN_SOAK_SECS` seconds (default 60; the long version is 600) while
//!   the server is killed with SIGKILL at random moments and restarted on the same data.
//!   Every write carries an `Idempotency-Key` and is retried until acknowledged, as a
//!   client whose request failed does. Afterwards: no request went unanswered past its
//!   deadline while the server lived (0 stalls), every acknowledged write is stored (0
//!   lost), no key made two of anything (0 duplicates), and every run finished with
//!   each step run to success exactly once in its record.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use skein_testkit::agent::{EngineBehaviour, Tasks, fake_engine};
use skein_testkit::lab::{Killed, Lab, Rng};

/// A request not answered within this while the server lives is a stall (the store's
/// own deadline for a write is 10 s).
const DEADLINE: Duration = Duration::from_secs(15);

/// How long the whole workload may take to drain after the soak.
const DRAIN: Duration = Duration::from_secs(300);

fn workflow(endpoint: &str) -> String {
    format!(
        "name: soak\ninputs: {{ tag: {{ type: string }} }}\nagents:\n  remote: {{ endpoint: {{ url: \"{endpoint}\", model: m }} }}\nsteps:\n  - {{ id: a, agent: remote, prompt: \"first {{{{ inputs.tag }}}}\" }}\n  - {{ id: b, agent: remote, after: [a], prompt: \"second {{{{ steps.a.output }}}}\" }}\n"
    )
}

/// What the clients saw, shared.
#[derive(Default)]
struct Seen {
    /// Bumped at every kill and every restart: a request that spans a change may fail.
    epoch: AtomicU64,
    stop: AtomicBool,
    /// Requests unanswered past the deadline while the server lived.
    stalls: Mutex<Vec<String>>,
    /// Acknowledged run submissions: tag → run id.
    runs: Mutex<BTreeMap<String, String>>,
    /// Acknowledged session creates: key → session id.
    sessions: Mutex<BTreeMap<String, String>>,
    /// Acknowledged turns, per session, in order.
    messages: Mutex<HashMap<String, Vec<String>>>,
    /// Acknowledged token creates: user → token id (unknown when a retry found it made).
    tokens: Mutex<BTreeMap<String, Option<String>>>,
    /// Answers by kind (`202`, `503`, `refused`, …), for the report.
    answers: Mutex<BTreeMap<String, u64>>,
}

impl Seen {
    fn count(&self, what: impl Into<String>) {
        *self.answers.lock().unwrap().entry(what.into()).or_default() += 1;
    }
}

struct Client {
    http: reqwest::Client,
    api: String,
    token: String,
    seen: Arc<Seen>,
}

impl Client {
    /// Sends `request` (made anew each try) until the server acknowledges it with a
    /// success, and returns the answer's body. Refusals that ask for a retry (429, 503,
    /// 409 in progress), connection failures while the server restarts, and timeouts
    /// are retried; a timeout while the server lived is a stall.
    async fn until_acknowledged(
        &self,
        what: &str,
        request: impl Fn() -> reqwest::RequestBuilder,
    ) -> (reqwest::StatusCode, reqwest::header::HeaderMap, Value) {
        loop {
            let epoch = self.seen.epoch.load(Ordering::SeqCst);
            match request().timeout(DEADLINE).send().await {
                Ok(response) => {
                    let status = response.status();
                    let headers = response.headers().clone();
                    let body = response.json::<Value>().await.unwrap_or(Value::Null);
                    self.seen.count(format!("{what} {}", status.as_u16()));
                    // A token's create retried after its first answer was lost: made
                    // once, its secret not shown again.
                    let made_before = status.as_u16() == 409 && body["error"]["code"] == "already_created";
                    if status.is_success() || made_before {
                        return (status, headers, body);
                    }
                    let retry = matches!(status.as_u16(), 429 | 503)
                        || (status.as_u16() == 409 && body["error"]["code"] == "in_progress");
                    assert!(retry, "{what}: unexpected answer {status}: {body}");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(error) => {
                    if error.is_timeout() && self.seen.epoch.load(Ordering::SeqCst) == epoch {
                        self.seen.stalls.lock().unwrap().push(format!("{what}: {error}"));
                    }
                    self.seen.count(format!("{what} failed"));
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    }

    async fn read(&self, path: &str) {
        let epoch = self.seen.epoch.load(Ordering::SeqCst);
        let sent = self
            .http
            .get(format!("{}{path}", self.api))
            .bearer_auth(&self.token)
            .timeout(DEADLINE)
            .send();
        match sent.await {
            Ok(response) => {
                assert!(
                    response.status().is_success() || response.status() == 503,
                    "GET {path}: {}",
                    response.status()
                );
                self.seen.count(format!("read {}", response.status().as_u16()));
            }
            Err(error) => {
                if error.is_timeout() && self.seen.epoch.load(Ordering::SeqCst) == epoch {
                    self.seen.stalls.lock().unwrap().push(format!("GET {path}: {error}"));
                }
            }
        }
    }

    async fn submit(&self, workflow: &str, tag: String) {
        let body = json!({"workflow": workflow, "inputs": {"tag": tag}}).to_string();
        let (_, headers, run) = self
            .until_acknowledged("submit", || {
                self.http
                    .post(format!("{}/v1/runs", self.api))
                    .bearer_auth(&self.token)
                    .header("content-type", "application/json")
                    .header("idempotency-key", format!("run-{tag}"))
                    .body(body.clone())
            })
            .await;
        if headers.contains_key("idempotent-replayed") {
            self.seen.count("submit replayed");
        }
        let id = run["id"].as_str().expect("a run id").to_owned();
        let earlier = self.seen.runs.lock().unwrap().insert(tag.clone(), id.clone());
        assert!(earlier.is_none(), "tag {tag} submitted twice by the test");
    }

    async fn create_session(&self, key: String) -> String {
        let (_, _, session) = self
            .until_acknowledged("session", || {
                self.http
                    .post(format!("{}/v1/sessions", self.api))
                    .bearer_auth(&self.token)
                    .header("idempotency-key", key.clone())
                    .json(&json!({"model": "Qwen/Qwen2.5-0.5B-Instruct", "metadata": {"key": key}}))
            })
            .await;
        let id = session["id"].as_str().expect("a session id").to_owned();
        self.seen.sessions.lock().unwrap().insert(key, id.clone());
        id
    }

    async fn turn(&self, session: &str, content: String) {
        self.until_acknowledged("turn", || {
            self.http
                .post(format!("{}/v1/sessions/{session}/messages", self.api))
                .bearer_auth(&self.token)
                .header("idempotency-key", format!("turn-{content}"))
                .json(&json!({"content": content, "reply": false}))
        })
        .await;
        self.seen
            .messages
            .lock()
            .unwrap()
            .entry(session.to_owned())
            .or_default()
            .push(content);
    }

    async fn create_token(&self, user: String) {
        let (_, _, token) = self
            .until_acknowledged("token", || {
                self.http
                    .post(format!("{}/v1/tokens", self.api))
                    .bearer_auth(&self.token)
                    .header("idempotency-key", format!("token-{user}"))
                    .json(&json!({"user": user}))
            })
            .await;
        // `None`: made by an earlier try whose answer was lost.
        let id = token["id"].as_str().map(str::to_owned);
        self.seen.tokens.lock().unwrap().insert(user, id);
    }
}

/// One client's loop until told to stop: a mix of writes (each retried until
/// acknowledged) and reads.
async fn run_client(me: usize, client: Client, workflow: String) {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ ((me as u64 + 1) * 0x1000_0001));
    let mut session: Option<String> = None;
    let mut n = 0u64;
    while !client.seen.stop.load(Ordering::SeqCst) {
        n += 1;
        match rng.below(100) {
            0..=34 => client.submit(&workflow, format!("c{me}-{n}")).await,
            35..=44 => session = Some(client.create_session(format!("session-c{me}-{n}")).await),
            45..=69 => match &session {
                Some(id) => client.turn(id, format!("c{me}-{n}")).await,
                None => session = Some(client.create_session(format!("session-c{me}-{n}")).await),
            },
            70..=72 => client.create_token(format!("soak-c{me}-{n}")).await,
            73..=84 => client.read("/v1/runs?limit=50").await,
            85..=92 => client.read("/v1/graph").await,
            _ => client.read("/v1/sessions?limit=20").await,
        }
        tokio::time::sleep(Duration::from_millis(20 + rng.below(60))).await;
    }
}

/// Every page of a list route.
async fn all_pages(http: &reqwest::Client, api: &str, token: &str, path: &str, cursor: &str) -> Vec<Value> {
    let mut items = Vec::new();
    let mut next: Option<String> = None;
    loop {
        let url = match &next {
            Some(after) => format!("{api}{path}?limit=1000&{cursor}={after}"),
            None => format!("{api}{path}?limit=1000"),
        };
        let page: Value = http
            .get(url)
            .bearer_auth(token)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        items.extend(page["data"].as_array().unwrap().iter().cloned());
        match page["next"].as_str() {
            Some(after) => next = Some(after.to_owned()),
            None => return items,
        }
    }
}

struct Soak {
    lab: Lab,
    server: Killed,
    runtime: tokio::runtime::Runtime,
    http: reqwest::Client,
    endpoint: String,
    _tasks: Tasks,
}

impl Soak {
    fn new() -> Soak {
        // The workflows' endpoint is a stand-in on loopback.
        let lab = Lab::new(env!("CARGO_BIN_EXE_skein")).server_args(&["--endpoint-allow", "127.0.0.1"]);
        let server = lab.server();
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let tasks = Tasks::default();
        let endpoint = runtime.block_on(fake_engine(EngineBehaviour::default(), &tasks));
        Soak {
            lab,
            server,
            runtime,
            http: reqwest::Client::new(),
            endpoint,
            _tasks: tasks,
        }
    }

    fn client(&self, seen: &Arc<Seen>) -> Client {
        Client {
            http: self.http.clone(),
            api: self.lab.api(),
            token: self.lab.token(),
            seen: Arc::clone(seen),
        }
    }

    fn restart(&mut self, seen: &Seen) {
        seen.epoch.fetch_add(1, Ordering::SeqCst);
        self.server.kill();
        seen.epoch.fetch_add(1, Ordering::SeqCst);
        self.server = self.lab.server();
        seen.epoch.fetch_add(1, Ordering::SeqCst);
    }

    /// Waits until every stored run has ended; returns them all, in full.
    fn drained_runs(&self) -> Vec<Value> {
        let (api, token) = (self.lab.api(), self.lab.token());
        self.runtime.block_on(async {
            let started = Instant::now();
            loop {
                let summaries = all_pages(&self.http, &api, &token, "/v1/runs", "after").await;
                let open = summaries
                    .iter()
                    .filter(|r| !matches!(r["state"].as_str(), Some("succeeded" | "failed" | "cancelled")))
                    .count();
                if open == 0 {
                    let mut runs = Vec::new();
                    for summary in summaries {
                        let id = summary["id"].as_str().unwrap();
                        let url = format!("{api}/v1/runs/{id}");
                        runs.push(
                            self.http
                                .get(url)
                                .bearer_auth(&token)
                                .send()
                                .await
                                .unwrap()
                                .json()
                                .await
                                .unwrap(),
                        );
                    }
                    return runs;
                }
                assert!(
                    started.elapsed() < DRAIN,
                    "{open} runs still open after {DRAIN:?}; server log:\n{}",
                    self.lab.logs(40)
                );
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        })
    }

    /// Every acknowledged run is stored, ran once per tag, and succeeded with each step
    /// done once.
    fn check_runs(&self, acknowledged: &BTreeMap<String, String>) -> usize {
        let runs = self.drained_runs();
        let mut by_tag: HashMap<String, Vec<&Value>> = HashMap::new();
        for run in &runs {
            let tag = run["inputs"]["tag"].as_str().unwrap_or_default().to_owned();
            by_tag.entry(tag).or_default().push(run);
        }
        for (tag, runs) in &by_tag {
            assert_eq!(runs.len(), 1, "tag {tag} made {} runs: {runs:#?}", runs.len());
        }
        for (tag, id) in acknowledged {
            let run = by_tag
                .get(tag)
                .and_then(|runs| runs.first())
                .unwrap_or_else(|| panic!("acknowledged run {id} ({tag}) was lost"));
            assert_eq!(run["id"].as_str(), Some(id.as_str()), "tag {tag}");
            assert_eq!(run["state"], "succeeded", "{run:#}");
            for step in run["steps"].as_array().unwrap() {
                assert_eq!(step["state"], "done", "{run:#}");
                assert_eq!(step["attempts"], 1, "a step ran more than once in its record: {run:#}");
            }
            assert_eq!(run["steps"][1]["output"], format!("echo: second echo: first {tag}"));
        }
        runs.len()
    }
}

#[test]
fn four_concurrent_run_submitters_never_stall_the_store() {
    let mut soak = Soak::new();
    let seen = Arc::new(Seen::default());
    let workflow = workflow(&soak.endpoint);
    soak.runtime.block_on(async {
        let mut clients = tokio::task::JoinSet::new();
        for me in 0..4 {
            let client = soak.client(&seen);
            let workflow = workflow.clone();
            clients.spawn(async move {
                for n in 0..150 {
                    client.submit(&workflow, format!("c{me}-{n}")).await;
                }
            });
        }
        while let Some(done) = clients.join_next().await {
            done.unwrap();
        }
    });
    let stalls = seen.stalls.lock().unwrap().clone();
    assert!(stalls.is_empty(), "{} requests stalled: {stalls:#?}", stalls.len());
    // Acknowledged means on disk: all there after a kill -9.
    soak.restart(&seen);
    let acknowledged = seen.runs.lock().unwrap().clone();
    assert_eq!(acknowledged.len(), 600);
    soak.check_runs(&acknowledged);
}

#[test]
fn soak_mixed_clients_under_kill_9_lose_nothing_and_duplicate_nothing() {
    let seconds: u64 = std::env::var("SKEIN_SOAK_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(60);
    let mut soak = Soak::new();
    let seen = Arc::new(Seen::default());
    let workflow = workflow(&soak.endpoint);
    let mut clients = tokio::task::JoinSet::new();
    for me in 0..16 {
        let client = soak.client(&seen);
        clients.spawn_on(run_client(me, client, workflow.clone()), soak.runtime.handle());
    }
    // Kill -9 at random moments, restart on the same data.
    let mut rng = Rng(0x5eed);
    let started = Instant::now();
    let mut kills = 0;
    while started.elapsed() < Duration::from_secs(seconds) {
        std::thread::sleep(Duration::from_millis(2000 + rng.below(6000)));
        soak.restart(&seen);
        kills += 1;
    }
    seen.stop.store(true, Ordering::SeqCst);
    soak.runtime.block_on(async {
        while let Some(done) = clients.join_next().await {
            done.unwrap();
        }
    });

    let stalls = seen.stalls.lock().unwrap().clone();
    assert!(stalls.is_empty(), "{} requests stalled: {stalls:#?}", stalls.len());
    let acknowledged = seen.runs.lock().unwrap().clone();
    let stored_runs = soak.check_runs(&acknowledged);

    // Sessions: one per key, every acknowledged turn exactly once and in order.
    let (api, token) = (soak.lab.api(), soak.lab.token());
    let http = soak.http.clone();
    let sessions = seen.sessions.lock().unwrap().clone();
    let messages = seen.messages.lock().unwrap().clone();
    let tokens = seen.tokens.lock().unwrap().clone();
    soak.runtime.block_on(async {
        let stored = all_pages(&http, &api, &token, "/v1/sessions", "after").await;
        let mut by_key: HashMap<&str, Vec<&str>> = HashMap::new();
        for session in &stored {
            let key = session["metadata"]["key"].as_str().unwrap_or_default();
            by_key.entry(key).or_default().push(session["id"].as_str().unwrap());
        }
        for (key, ids) in &by_key {
            assert_eq!(ids.len(), 1, "session key {key} made {ids:?}");
        }
        for (key, id) in &sessions {
            assert_eq!(
                by_key.get(key.as_str()),
                Some(&vec![id.as_str()]),
                "acknowledged session {key} lost"
            );
        }
        for (session, sent) in &messages {
            let stored = all_pages(&http, &api, &token, &format!("/v1/sessions/{session}/messages"), "from").await;
            let stored: Vec<&str> = stored.iter().filter_map(|m| m["content"].as_str()).collect();
            let sent: Vec<&str> = sent.iter().map(String::as_str).collect();
            assert_eq!(stored, sent, "session {session}");
        }
        // Tokens: one per user, every acknowledged one stored.
        let stored = all_pages(&http, &api, &token, "/v1/tokens", "after").await;
        let mut users = HashSet::new();
        for t in &stored {
            let user = t["user"].as_str().unwrap();
            assert!(
                users.insert(user.to_owned()) || user == "admin",
                "user {user} got two tokens"
            );
        }
        for (user, id) in &tokens {
            assert!(
                stored
                    .iter()
                    .any(|t| t["user"] == user.as_str() && id.as_ref().is_none_or(|id| t["id"] == id.as_str())),
                "acknowledged token {id:?} of {user} lost"
            );
        }
    });
    let answers = seen.answers.lock().unwrap().clone();
    eprintln!(
        "soak: {seconds} s, {kills} kills, {} runs acknowledged ({stored_runs} stored), {} sessions, {} turns, {} tokens; answers: {answers:?}",
        acknowledged.len(),
        sessions.len(),
        messages.values().map(Vec::len).sum::<usize>(),
        tokens.len(),
    );
    assert!(kills >= 3, "the soak killed the server {kills} times");
}
