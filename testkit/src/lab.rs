//! A lab of real Skein processes on loopback, for end-to-end tests and benchmarks: a
//! mock Hugging Face Hub serving the tiny generated Llama ([`crate::tiny_llama`]),
//! `skein server`, `skein agent` processes (CPU-only nodes, or simulated nodes of a
//! fleet file), and the CLI against them.
//!
//! The `skein` binary is a parameter: a test or a benchmark of the root package passes
//! `env!("CARGO_BIN_EXE_skein")`.
//!
//! Each process logs to a file in the lab's directory ([`Lab::logs`] gives their ends,
//! for a failing test's message). Every process is killed when its [`Killed`] is dropped.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::mock_hub::MockHub;
use crate::tiny_llama;

/// Longest wait for anything (a debug build loads the tiny model in well under this).
pub const PATIENCE: Duration = Duration::from_secs(120);

/// A tiny deterministic generator (xorshift), so a failing schedule of kills and
/// requests can be replayed from its seed.
pub struct Rng(pub u64);

impl Rng {
    /// The next number below `n` (`n` > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// Stops the child when dropped, however the test ends: SIGTERM twice (an agent leaves
/// at once on the second, stopping its engines, which run in their own process groups
/// and would outlive a SIGKILL of the agent), then SIGKILL after [`STOP_PATIENCE`].
pub struct Killed(pub Child);

/// How long a dropped process gets to stop on SIGTERM before SIGKILL.
pub const STOP_PATIENCE: Duration = Duration::from_secs(5);

impl Killed {
    /// Kills the process now (SIGKILL) and reaps it.
    pub fn kill(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }

    /// SIGTERM, a second SIGTERM shortly after, then SIGKILL if it is still running
    /// after [`STOP_PATIENCE`]; reaps it.
    pub fn stop(&mut self) {
        if matches!(self.0.try_wait(), Ok(Some(_))) {
            return;
        }
        let term = |child: &Child| {
            if let Some(pid) = i32::try_from(child.id()).ok().and_then(rustix::process::Pid::from_raw) {
                let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
            }
        };
        term(&self.0);
        let started = Instant::now();
        let mut again = true;
        while started.elapsed() < STOP_PATIENCE {
            if matches!(self.0.try_wait(), Ok(Some(_))) {
                return;
            }
            if again && started.elapsed() > Duration::from_millis(300) {
                term(&self.0);
                again = false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.kill();
    }
}

impl Drop for Killed {
    fn drop(&mut self) {
        self.stop();
    }
}

/// One lab on loopback: a mock hub serving the tiny model, a server's data directory
/// and fixed ports (so a restarted server is found by its agents), and a Hugging Face
/// cache per node.
pub struct Lab {
    skein: PathBuf,
    hub: MockHub,
    data: tempfile::TempDir,
    api_port: u16,
    grpc_port: u16,
    nodes: tempfile::TempDir,
    sample_interval: String,
    /// More arguments of every `skein server` / `skein up` it starts.
    server_args: Vec<String>,
    /// The working directory of every server it starts (the test's own by default).
    server_dir: Option<PathBuf>,
    runtime: tokio::runtime::Runtime,
}

impl Lab {
    /// A lab running the `skein` binary at `skein`; its server asks agents for a sample
    /// every 200 ms.
    pub fn new(skein: impl Into<PathBuf>) -> Lab {
        Lab::with_repos(skein, Vec::new())
    }

    /// A lab whose hub also serves `repos` (the reference models of
    /// [`crate::models::reference_hub_repos`], say).
    pub fn with_repos(skein: impl Into<PathBuf>, repos: Vec<crate::mock_hub::MockRepo>) -> Lab {
        let mut all = vec![tiny_llama::repo()];
        all.extend(repos);
        Lab {
            skein: skein.into(),
            hub: MockHub::start_in_background(all),
            data: tempfile::tempdir().unwrap(),
            api_port: crate::net::free_port(),
            grpc_port: crate::net::free_port(),
            nodes: tempfile::tempdir().unwrap(),
            sample_interval: "200ms".to_owned(),
            server_args: Vec::new(),
            server_dir: None,
            runtime: tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap(),
        }
    }

    /// The same lab with its server asking agents for a sample every `interval`
    /// (`--sample-interval`, e.g. `100ms`).
    pub fn sample_interval(mut self, interval: &str) -> Lab {
        interval.clone_into(&mut self.sample_interval);
        self
    }

    /// The same lab with `args` added to every server it starts (e.g.
    /// `["--endpoint-allow", "127.0.0.1"]` for workflows whose endpoints are the lab's
    /// own stand-ins on loopback).
    pub fn server_args(mut self, args: &[&str]) -> Lab {
        self.server_args.extend(args.iter().map(|a| (*a).to_owned()));
        self
    }

    /// The same lab with every server it starts running in `dir` (where a workflow's
    /// relative tool command resolves, say).
    pub fn server_dir(mut self, dir: &Path) -> Lab {
        self.server_dir = Some(dir.to_owned());
        self
    }

    /// The lab's hub.
    pub fn hub(&self) -> &MockHub {
        &self.hub
    }

    /// The REST API's base URL.
    pub fn api(&self) -> String {
        format!("http://127.0.0.1:{}", self.api_port)
    }

    /// The address agents join: `http://127.0.0.1:PORT`.
    pub fn join_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.grpc_port)
    }

    /// The server's data directory.
    pub fn data_dir(&self) -> &Path {
        self.data.path()
    }

    /// The lab's scratch directory: the nodes' caches and data, the logs.
    pub fn dir(&self) -> &Path {
        self.nodes.path()
    }

    /// The admin's API token (empty until the server has written it).
    pub fn token(&self) -> String {
        std::fs::read_to_string(self.data.path().join("api-token"))
            .unwrap_or_default()
            .trim()
            .to_owned()
    }

    /// `skein` with the mock hub's environment and `cache` as its Hugging Face cache.
    pub fn skein(&self, cache: &Path) -> Command {
        let mut command = Command::new(&self.skein);
        self.hub.environment(&mut command, cache);
        command.env("RUST_LOG", "info").env("NO_COLOR", "1");
        command
    }

    /// `skein server`, returned once it listens. It logs to `server.log` in
    /// [`Lab::dir`] (appended to across restarts).
    pub fn server(&self) -> Killed {
        self.start_server("server-cache", &["server"], "REST API on")
    }

    /// `skein up --fleet FLEET`: the server and one simulated agent per node of the
    /// fleet file, in one process, returned once it is up (its vLLM is
    /// [`Lab::vllm_stand_in`]). It logs to `server.log` in [`Lab::dir`].
    pub fn up(&self, fleet: &Path) -> Killed {
        let fleet = fleet.to_str().expect("a fleet file path in UTF-8");
        let vllm = self.vllm_stand_in();
        let vllm = vllm.to_str().expect("a lab path in UTF-8");
        self.start_server("up-cache", &["up", "--fleet", fleet, "--vllm", vllm], "skein is up")
    }

    /// `skein ARGS` with the lab's addresses, sample interval and data directory (a
    /// server, alone or with its agents), returned once its log says `ready`.
    fn start_server(&self, cache: &str, args: &[&str], ready: &str) -> Killed {
        let mut command = self.skein(&self.nodes.path().join(cache));
        if let Some(dir) = &self.server_dir {
            command.current_dir(dir);
        }
        let mut child = command
            .args(args)
            .args(["--listen", &format!("127.0.0.1:{}", self.api_port)])
            .args(["--agent-listen", &format!("127.0.0.1:{}", self.grpc_port)])
            .args(["--sample-interval", &self.sample_interval, "--data-dir"])
            .arg(self.data.path())
            .args(&self.server_args)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        wait_for_line(&mut child, ready, &self.nodes.path().join("server.log"));
        Killed(child)
    }

    /// `skein agent` as node `name` (CPU-only), with its own HF cache and data
    /// directory; it logs to `<name>/agent.log` in [`Lab::dir`].
    pub fn agent(&self, name: &str) -> Killed {
        self.start_agent(name, &[])
    }

    /// `skein agent` as node `name` (CPU-only) with `extra` arguments (its engine
    /// programs, say `--llama-server PATH`).
    pub fn agent_with(&self, name: &str, extra: &[&str]) -> Killed {
        self.start_agent(name, extra)
    }

    /// `skein agent --simulate FLEET --node NAME`: node `name` of the fleet file `fleet`,
    /// whose simulated signals start when this process does.
    ///
    /// The planner gives a safetensors model on a GPU to vLLM, simulated GPUs included,
    /// and the agent has no vLLM here: its `--vllm` is [`Lab::vllm_stand_in`], which
    /// serves the model with the built-in engine on the CPU.
    pub fn simulated_agent(&self, fleet: &Path, name: &str) -> Killed {
        let fleet = fleet.to_str().expect("a fleet file path in UTF-8");
        let vllm = self.vllm_stand_in();
        let vllm = vllm.to_str().expect("a lab path in UTF-8");
        self.start_agent(name, &["--simulate", fleet, "--vllm", vllm])
    }

    /// A `vllm` program for simulated nodes: `vllm serve MODEL --served-model-name NAME
    /// --host HOST --port PORT …` runs `skein engine serve` on the same model, name and
    /// address, on the CPU (the other options, GPU sizing, mean nothing there).
    pub fn vllm_stand_in(&self) -> PathBuf {
        let path = self.nodes.path().join("vllm");
        if !path.exists() {
            let script = format!(
                r#"#!/bin/sh
# vLLM's command line, served by Skein's built-in engine on the CPU.
[ "$1" = serve ] || {{ echo "vllm stand-in: only 'serve'" >&2; exit 2; }}
model=$2
shift 2
while [ $# -gt 0 ]; do
  case $1 in
    --served-model-name) name=$2; shift 2 ;;
    --host) host=$2; shift 2 ;;
    --port) port=$2; shift 2 ;;
    *) shift ;;
  esac
done
exec '{}' engine serve --model "$model" --name "$name" --host "$host" --port "$port" --device cpu
"#,
                self.skein.display()
            );
            let temporary = path.with_extension("tmp");
            std::fs::write(&temporary, script).unwrap();
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&temporary, std::fs::Permissions::from_mode(0o755)).unwrap();
            std::fs::rename(&temporary, &path).unwrap();
        }
        path
    }

    /// `skein agent` presenting node `name` of `fleet`, with the engine programs and
    /// other options in `extra` and `env` added to its environment (which its engines
    /// inherit).
    pub fn simulated_agent_with(&self, fleet: &Path, name: &str, extra: &[&str], env: &[(&str, String)]) -> Killed {
        let fleet = fleet.to_str().expect("a fleet file path in UTF-8");
        let mut args = vec!["--simulate", fleet];
        args.extend_from_slice(extra);
        self.agent_process(name, &args, env)
    }

    fn start_agent(&self, name: &str, extra: &[&str]) -> Killed {
        self.agent_process(name, extra, &[])
    }

    fn agent_process(&self, name: &str, extra: &[&str], env: &[(&str, String)]) -> Killed {
        let dir = self.nodes.path().join(name);
        std::fs::create_dir_all(&dir).unwrap();
        let log = std::fs::File::create(dir.join("agent.log")).unwrap();
        let child = self
            .skein(&dir.join("cache"))
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
            .args(["agent", "--join", &self.join_url()])
            .args(["--node", name, "--token-file"])
            .arg(self.data.path().join("join-token"))
            .arg("--data-dir")
            .arg(&dir)
            .args(extra)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        Killed(child)
    }

    /// A CLI command against the server.
    pub fn cli(&self, args: &[&str]) -> Output {
        self.skein(&self.nodes.path().join("cli-cache"))
            .args(args)
            .args(["--server", &self.api(), "--data-dir"])
            .arg(self.data.path())
            .output()
            .unwrap()
    }

    /// `GET path` as JSON; panics if the answer is not JSON.
    pub fn get(&self, path: &str) -> Value {
        let output = self.cli_json(path);
        serde_json::from_str(&output).unwrap_or_else(|e| panic!("{path}: {e}: {output}"))
    }

    /// `GET path` with the API token; empty when the server does not answer (yet).
    pub fn cli_json(&self, path: &str) -> String {
        let token = self.token();
        let url = format!("{}{path}", self.api());
        self.runtime.block_on(async {
            let response = reqwest::Client::new()
                .get(&url)
                .bearer_auth(token)
                .timeout(Duration::from_secs(10))
                .send()
                .await;
            match response {
                Ok(response) if response.status().is_success() => response.text().await.unwrap_or_default(),
                _ => String::new(),
            }
        })
    }

    /// `GET path` as JSON, or null when the server does not answer (yet).
    pub fn get_or_null(&self, path: &str) -> Value {
        serde_json::from_str(&self.cli_json(path)).unwrap_or(Value::Null)
    }

    /// `POST path` with a JSON body and the API token: the status and the body (null if
    /// it is not JSON; status 0 when the server does not answer).
    pub fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        post_json(&self.api(), &self.token(), path, body, &self.runtime)
    }

    /// Waits until `count` nodes are connected.
    pub fn nodes_up(&self, count: usize) {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let nodes = self.get_or_null("/v1/nodes");
            let up = nodes
                .as_array()
                .map_or(0, |n| n.iter().filter(|n| n["connected"] == true).count());
            if up >= count {
                return;
            }
            assert!(Instant::now() < deadline, "{count} nodes did not join: {nodes:#}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Waits until the run `id` satisfies `done` (`what` names it in a timeout's message).
    pub fn wait_run(&self, id: &str, what: &str, done: impl Fn(&Value) -> bool) -> Value {
        self.wait_for(what, &format!("/v1/runs/{id}"), done)
    }

    /// Waits until `GET path` satisfies `done`, polling every 50 ms, for [`PATIENCE`];
    /// `what` names the wait in a timeout's message.
    pub fn wait_for(&self, what: &str, path: &str, done: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let value = self.get_or_null(path);
            if done(&value) {
                return value;
            }
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {what}: {value:#}\n{}",
                self.logs(40)
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The last `lines` lines of the server's log and of each agent's, for a failing
    /// test's message.
    pub fn logs(&self, lines: usize) -> String {
        let mut files = vec![self.nodes.path().join("server.log")];
        if let Ok(entries) = std::fs::read_dir(self.nodes.path()) {
            let mut agents: Vec<PathBuf> = entries
                .filter_map(Result::ok)
                .map(|e| e.path().join("agent.log"))
                .filter(|p| p.exists())
                .collect();
            agents.sort();
            files.extend(agents);
        }
        let mut out = String::new();
        for file in files {
            let text = std::fs::read_to_string(&file).unwrap_or_default();
            let all: Vec<&str> = text.lines().collect();
            let tail = &all[all.len().saturating_sub(lines)..];
            out.push_str(&format!("── {} (last {} lines)\n", file.display(), tail.len()));
            for line in tail {
                out.push_str(line);
                out.push('\n');
            }
        }
        out
    }
}

/// `POST base+path` with `body` and `token` on `runtime`: the status and the JSON body.
fn post_json(base: &str, token: &str, path: &str, body: &Value, runtime: &tokio::runtime::Runtime) -> (u16, Value) {
    let url = format!("{base}{path}");
    runtime.block_on(async {
        let response = reqwest::Client::new()
            .post(&url)
            .bearer_auth(token)
            .json(body)
            .timeout(PATIENCE)
            .send()
            .await;
        match response {
            Ok(response) => {
                let status = response.status().as_u16();
                let text = response.text().await.unwrap_or_default();
                (status, serde_json::from_str(&text).unwrap_or(Value::Null))
            }
            Err(_) => (0, Value::Null),
        }
    })
}

/// A client of a lab's REST API that another thread may own (a session chatting while
/// the test watches): the base URL, the token and a runtime of its own.
pub struct Client {
    api: String,
    token: String,
    runtime: tokio::runtime::Runtime,
}

impl Client {
    /// A client of `lab`'s server, as its admin.
    pub fn of(lab: &Lab) -> Client {
        Client {
            api: lab.api(),
            token: lab.token(),
            runtime: tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap(),
        }
    }

    /// `POST path` with a JSON body: the status and the body (null if it is not JSON;
    /// status 0 when the server does not answer).
    pub fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        post_json(&self.api, &self.token, path, body, &self.runtime)
    }
}

/// Waits for a line containing `needle` on the child's stderr (for [`PATIENCE`]), and
/// copies every line of it to `log`.
pub fn wait_for_line(child: &mut Child, needle: &str, log: &Path) {
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = mpsc::channel();
    let wanted = needle.to_owned();
    let mut log = std::fs::OpenOptions::new().create(true).append(true).open(log).unwrap();
    std::thread::spawn(move || {
        let mut told = false;
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = writeln!(log, "{line}");
            if !told && line.contains(&wanted) {
                let _ = tx.send(());
                told = true;
            }
        }
    });
    rx.recv_timeout(PATIENCE)
        .unwrap_or_else(|_| panic!("no line with `{needle}` within {PATIENCE:?}"));
}

/// A command's standard output, as text.
pub fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// A command's standard error, as text.
pub fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}
