//! The engine supervisor against the real `fake-engine` process (testkit): starting,
//! loading and readiness, restarts with backoff, failure with the engine's own last
//! lines, clean stops, logs across restarts, remote endpoints, refused starts.
//!
//! Timeouts here are short so the file runs in seconds, and every bound is generous:
//! the machine running the tests may be loaded.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use skein_agent::GpuMemoryProbe;
use skein_agent::engine::{
    CandleLaunch, EngineKey, EngineLaunch, InstanceEvent, InstanceState, LaunchSpec, LlamaRpcLaunch, RemoteLaunch,
    RestartPolicy, Supervisor, SupervisorConfig, SupervisorError, free_port,
};
use tokio::sync::mpsc;

use common::engine_program;

/// How long any awaited event may take on a loaded machine.
const PATIENCE: Duration = Duration::from_secs(20);

fn config(dir: &Path) -> SupervisorConfig {
    SupervisorConfig {
        logs_dir: dir.join("logs"),
        readiness_timeout: Duration::from_secs(15),
        health_interval: Duration::from_millis(100),
        restart: RestartPolicy {
            max_restarts: 2,
            first_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_millis(150),
            reset_after: Duration::from_secs(60),
        },
        stop_grace: Duration::from_secs(3),
    }
}

fn candle(instance: &str, program: PathBuf, gpus: &[u32]) -> LaunchSpec {
    LaunchSpec {
        instance: instance.to_owned(),
        host: "127.0.0.1".to_owned(),
        port: free_port("127.0.0.1").expect("a free port"),
        gpus: gpus.to_vec(),
        context: 4096,
        concurrency: 1,
        engine: EngineLaunch::Candle(CandleLaunch {
            program,
            model: PathBuf::from("/models/qwen2.5-0.5b-instruct"),
            seed: 7,
        }),
        api_key: None,
        adapters: Vec::new(),
        embeddings: None,
    }
}

fn remote(instance: &str, url: String, api_key: Option<&str>) -> LaunchSpec {
    LaunchSpec {
        instance: instance.to_owned(),
        host: String::new(),
        port: 0,
        gpus: Vec::new(),
        context: 4096,
        concurrency: 1,
        engine: EngineLaunch::Remote(RemoteLaunch {
            url,
            model: "hosted".to_owned(),
            api_key: api_key.and_then(EngineKey::new),
        }),
        api_key: None,
        adapters: Vec::new(),
        embeddings: None,
    }
}

/// Events up to and including the first that `last` accepts.
async fn events_until(
    events: &mut mpsc::Receiver<InstanceEvent>,
    last: impl Fn(&InstanceState) -> bool,
) -> Vec<InstanceEvent> {
    let mut seen = Vec::new();
    loop {
        let event = tokio::time::timeout(PATIENCE, events.recv())
            .await
            .unwrap_or_else(|_| panic!("no further event within {PATIENCE:?}; so far: {seen:#?}"))
            .expect("the supervisor is alive");
        let done = last(&event.state);
        seen.push(event);
        if done {
            return seen;
        }
    }
}

fn is_ready(state: &InstanceState) -> bool {
    matches!(state, InstanceState::Ready { .. })
}

/// The state names, for order checks.
fn names(events: &[InstanceEvent]) -> Vec<&'static str> {
    events
        .iter()
        .map(|e| match e.state {
            InstanceState::Starting { .. } => "starting",
            InstanceState::Loading => "loading",
            InstanceState::Ready { .. } => "ready",
            InstanceState::Unhealthy { .. } => "unhealthy",
            InstanceState::Restarting { .. } => "restarting",
            InstanceState::Failed { .. } => "failed",
            InstanceState::Stopped => "stopped",
        })
        .collect()
}

fn pid_of(events: &[InstanceEvent]) -> u32 {
    events
        .iter()
        .find_map(|e| match e.state {
            InstanceState::Starting { pid, .. } => pid,
            _ => None,
        })
        .expect("a Starting event with a pid")
}

/// Whether a process is gone: not in the process table, or a zombie awaiting its reaper.
fn gone(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat.rsplit_once(") ").is_some_and(|(_, rest)| rest.starts_with('Z')),
    }
}

async fn wait_gone(pid: u32) {
    let start = std::time::Instant::now();
    while !gone(pid) {
        assert!(start.elapsed() < PATIENCE, "process {pid} still runs");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn a_local_engine_loads_then_is_ready_with_its_command_and_stops_cleanly() {
    let dir = tempfile::tempdir().expect("temp dir");
    let record = dir.path().join("record.json");
    let program = engine_program(
        dir.path(),
        &[
            ("SKEIN_FAKE_ENGINE_READY_MS", "400".to_owned()),
            ("SKEIN_FAKE_ENGINE_RECORD", record.display().to_string()),
        ],
    );
    let spec = candle("hello.assistant", program, &[1, 2]);
    let expected = spec.command().expect("a command");
    let (supervisor, mut events) = Supervisor::new(config(dir.path()));
    supervisor.start(spec.clone()).await.expect("started");

    let seen = events_until(&mut events, is_ready).await;
    assert_eq!(names(&seen), ["starting", "loading", "ready"]);
    let InstanceState::Starting { command, .. } = &seen[0].state else {
        unreachable!("checked above")
    };
    assert_eq!(command, &expected.to_string());
    let InstanceState::Ready { base_url, memory } = &seen[2].state else {
        unreachable!("checked above")
    };
    assert_eq!(base_url, &format!("http://127.0.0.1:{}/v1", spec.port));
    assert!(
        memory.host_rss.is_some_and(|rss| rss > 1 << 20),
        "resident memory of the engine measured: {memory:?}"
    );
    assert!(memory.gpu.is_empty(), "no GPU probe, no GPU figures");

    // Exactly the command line and GPU environment of the spec reached the engine.
    let recorded: Value = serde_json::from_str(&std::fs::read_to_string(&record).expect("record")).expect("JSON");
    assert_eq!(recorded["args"], serde_json::json!(expected.args));
    assert_eq!(expected.args[12..14], ["--device", "cuda:0"]);
    assert_eq!(recorded["env"]["CUDA_VISIBLE_DEVICES"], "1,2");

    // It serves under the instance's name at the base URL.
    let models: Value = reqwest::Client::builder()
        .no_proxy()
        .build()
        .expect("client")
        .get(format!("{base_url}/models"))
        .send()
        .await
        .expect("models")
        .json()
        .await
        .expect("JSON");
    assert_eq!(models["data"][0]["id"], "hello.assistant");
    let status = supervisor.status();
    assert_eq!(status.len(), 1);
    assert!(is_ready(&status[0].state));

    let pid = pid_of(&seen);
    supervisor.stop("hello.assistant").await.expect("stopped");
    let stopped = events_until(&mut events, |s| *s == InstanceState::Stopped).await;
    assert_eq!(names(&stopped), ["stopped"]);
    assert!(gone(pid), "the engine process is gone once stop returns");
    assert_eq!(supervisor.status()[0].state, InstanceState::Stopped);
    // Its log is still readable, and the name can be started again.
    let logs = supervisor.logs("hello.assistant", 10).expect("logs");
    assert!(
        logs[0].starts_with("==> skein: start 1 of hello.assistant"),
        "{logs:#?}"
    );
    assert!(
        logs.iter()
            .any(|l| l == "fake weights: loading /models/qwen2.5-0.5b-instruct")
    );
    supervisor.start(spec).await.expect("started again");
    events_until(&mut events, is_ready).await;
    supervisor.stop_all().await;
    events_until(&mut events, |s| *s == InstanceState::Stopped).await;
}

#[tokio::test]
async fn an_engine_that_never_gets_ready_is_restarted_then_failed_with_its_log() {
    let dir = tempfile::tempdir().expect("temp dir");
    let program = engine_program(dir.path(), &[("SKEIN_FAKE_ENGINE_READY_MS", "600000".to_owned())]);
    let mut config = config(dir.path());
    config.readiness_timeout = Duration::from_secs(1);
    config.restart.max_restarts = 1;
    let (supervisor, mut events) = Supervisor::new(config);
    supervisor.start(candle("slow", program, &[])).await.expect("started");

    let seen = events_until(&mut events, |s| matches!(s, InstanceState::Failed { .. })).await;
    assert_eq!(
        names(&seen),
        ["starting", "loading", "restarting", "starting", "loading", "failed"]
    );
    let InstanceState::Restarting { attempt, after, reason } = &seen[2].state else {
        unreachable!("checked above")
    };
    assert_eq!((*attempt, *after), (1, Duration::from_millis(100)));
    assert!(reason.starts_with("not ready after 1s; last log lines:\n"), "{reason}");
    assert!(
        reason.ends_with("fake weights: loading /models/qwen2.5-0.5b-instruct"),
        "{reason}"
    );
    assert_eq!(seen[5].restarts, 1);
    let InstanceState::Failed { reason, log_tail } = &seen[5].state else {
        unreachable!("checked above")
    };
    assert!(reason.starts_with("not ready after 1s"), "{reason}");
    assert!(
        log_tail.iter().any(|l| l.starts_with("==> skein: start 2 of slow")),
        "{log_tail:#?}"
    );
    // Each start's process was stopped when it timed out.
    let pids: Vec<u32> = seen
        .iter()
        .filter_map(|e| match e.state {
            InstanceState::Starting { pid, .. } => pid,
            _ => None,
        })
        .collect();
    assert_eq!(pids.len(), 2);
    for pid in pids {
        wait_gone(pid).await;
    }
}

#[tokio::test]
async fn an_engine_that_crashes_after_ready_is_restarted_with_backoff_then_failed() {
    let dir = tempfile::tempdir().expect("temp dir");
    let program = engine_program(dir.path(), &[("SKEIN_FAKE_ENGINE_EXIT_MS", "1000".to_owned())]);
    let (supervisor, mut events) = Supervisor::new(config(dir.path()));
    supervisor.start(candle("crashy", program, &[])).await.expect("started");

    let seen = events_until(&mut events, |s| matches!(s, InstanceState::Failed { .. })).await;
    let backoffs: Vec<(u32, Duration)> = seen
        .iter()
        .filter_map(|e| match &e.state {
            InstanceState::Restarting { attempt, after, .. } => Some((*attempt, *after)),
            _ => None,
        })
        .collect();
    // 100 ms doubling, capped at 150 ms.
    assert_eq!(
        backoffs,
        [(1, Duration::from_millis(100)), (2, Duration::from_millis(150))]
    );
    let InstanceState::Failed { reason, log_tail } = &seen.last().expect("an event").state else {
        unreachable!("waited for it")
    };
    // The engine's own last words surface in the reason.
    assert!(reason.starts_with("exited with status 3"), "{reason}");
    assert!(
        reason.contains("fake-engine: exiting after 1000 ms, as asked"),
        "{reason}"
    );
    assert!(log_tail.iter().any(|l| l.contains("exiting after 1000 ms")));

    // Logs of all three starts, in memory and in the file, each opened by a marker.
    let logs = supervisor.logs("crashy", 100).expect("logs");
    let file = std::fs::read_to_string(dir.path().join("logs/crashy.log")).expect("the log file");
    for start in 1..=3 {
        let marker = format!("==> skein: start {start} of crashy");
        assert!(logs.iter().any(|l| l.starts_with(&marker)), "{logs:#?}");
        assert!(file.contains(&marker), "{file}");
    }
    assert_eq!(file.matches("fake weights: loading").count(), 3, "{file}");
    // A failed instance is no longer running: stopping it does nothing.
    supervisor.stop("crashy").await.expect("nothing to stop");
}

#[tokio::test]
async fn a_remote_endpoint_is_ready_once_it_accepts_the_key_it_was_given() {
    let dir = tempfile::tempdir().expect("temp dir");
    // The key comes with the start, as the orchestrator sends it; never from the agent's
    // environment (PATH's value is in it: naming PATH must not send it).
    let key = "sk-remote-0123456789";
    let port = free_port("127.0.0.1").expect("a free port");
    let mut endpoint = std::process::Command::new(skein_testkit::fake_engine_path())
        .args(["--name", "hosted", "--port", &port.to_string()])
        .env("SKEIN_FAKE_ENGINE_API_KEY", key)
        .spawn()
        .expect("start the endpoint");
    let url = format!("http://127.0.0.1:{port}/v1");

    let (supervisor, mut events) = Supervisor::new(config(dir.path()));
    supervisor
        .start(remote("cloud.writer", url.clone(), Some(key)))
        .await
        .expect("started");
    let seen = events_until(&mut events, is_ready).await;
    assert_eq!(names(&seen), ["starting", "loading", "ready"]);
    assert!(matches!(seen[0].state, InstanceState::Starting { pid: None, .. }));
    let InstanceState::Ready { base_url, memory } = &seen[2].state else {
        unreachable!("checked above")
    };
    assert_eq!(base_url, &url);
    assert_eq!(memory.host_rss, None);

    // Without the key the endpoint answers 401: a failure no restart can fix.
    supervisor
        .start(remote("cloud.nokey", url.clone(), None))
        .await
        .expect("started");
    let seen = events_until(&mut events, |s| matches!(s, InstanceState::Failed { .. })).await;
    let failed = seen.last().expect("an event");
    assert_eq!(failed.instance, "cloud.nokey");
    let InstanceState::Failed { reason, .. } = &failed.state else {
        unreachable!("waited for it")
    };
    assert!(reason.contains("refused the key") && reason.contains("401"), "{reason}");

    // A variable's name is a key like any other text now: the agent sends it as is,
    // never the variable's value, and the endpoint refuses it.
    supervisor
        .start(remote("cloud.named", url, Some("PATH")))
        .await
        .expect("started");
    let seen = events_until(&mut events, |s| matches!(s, InstanceState::Failed { .. })).await;
    let failed = seen.last().expect("an event");
    assert_eq!(failed.instance, "cloud.named");
    assert!(
        format!("{seen:?}").matches(key).count() == 0,
        "the key shows in the events: {seen:?}"
    );

    supervisor.stop("cloud.writer").await.expect("stopped");
    let _ = endpoint.kill();
    let _ = endpoint.wait();
}

#[tokio::test]
async fn duplicate_names_invalid_specs_and_unknown_instances_are_refused() {
    let dir = tempfile::tempdir().expect("temp dir");
    let program = engine_program(dir.path(), &[]);
    let (supervisor, mut events) = Supervisor::new(config(dir.path()));
    let spec = candle("twice", program, &[]);
    supervisor.start(spec.clone()).await.expect("started");
    let error = supervisor.start(spec.clone()).await.expect_err("a duplicate");
    assert!(matches!(error, SupervisorError::AlreadyRunning { .. }), "{error}");

    let invalid = LaunchSpec {
        instance: "../escape".to_owned(),
        ..spec
    };
    let error = supervisor.start(invalid).await.expect_err("invalid");
    assert!(matches!(error, SupervisorError::Invalid(_)), "{error}");
    let error = supervisor.stop("never-started").await.expect_err("unknown");
    assert!(matches!(error, SupervisorError::UnknownInstance { .. }), "{error}");
    assert!(supervisor.logs("never-started", 5).is_err());

    let seen = events_until(&mut events, is_ready).await;
    let pid = pid_of(&seen);
    // Dropping the supervisor kills its engines.
    drop(supervisor);
    wait_gone(pid).await;
}

/// Reports 1 MiB per process on GPU 0, and remembers what it was asked about.
struct CountingProbe(std::sync::Mutex<Vec<u32>>);

impl GpuMemoryProbe for CountingProbe {
    fn process_memory(&self, pids: &[u32]) -> Vec<(u32, u64)> {
        self.0.lock().expect("not poisoned").extend_from_slice(pids);
        vec![(0, pids.len() as u64 * (1 << 20))]
    }
}

#[tokio::test]
async fn an_engine_that_stops_answering_is_unhealthy_then_restarted_and_gpu_memory_is_probed() {
    let dir = tempfile::tempdir().expect("temp dir");
    let program = engine_program(dir.path(), &[]);
    let mut config = config(dir.path());
    config.stop_grace = Duration::from_millis(500);
    let probe = Arc::new(CountingProbe(std::sync::Mutex::new(Vec::new())));
    let (supervisor, mut events) = Supervisor::with_probe(config, probe.clone());
    supervisor
        .start(candle("frozen", program, &[0]))
        .await
        .expect("started");
    let seen = events_until(&mut events, is_ready).await;
    let pid = pid_of(&seen);
    let InstanceState::Ready { memory, .. } = &seen[2].state else {
        unreachable!("waited for it")
    };
    assert_eq!(memory.gpu, [(0, 1 << 20)]);
    assert_eq!(*probe.0.lock().expect("not poisoned"), [pid]);

    // A frozen engine neither exits nor answers: its probes time out.
    let frozen = rustix::process::Pid::from_raw(i32::try_from(pid).expect("a pid")).expect("not 0");
    rustix::process::kill_process(frozen, rustix::process::Signal::STOP).expect("SIGSTOP");
    let seen = events_until(&mut events, is_ready).await;
    assert_eq!(
        names(&seen),
        ["unhealthy", "restarting", "starting", "loading", "ready"]
    );
    let InstanceState::Unhealthy { reason } = &seen[0].state else {
        unreachable!("checked above")
    };
    assert!(reason.starts_with("3 health probes failed in a row"), "{reason}");
    // The frozen process was killed (SIGTERM waits for SIGCONT; SIGKILL does not).
    wait_gone(pid).await;
    assert_ne!(pid_of(&seen), pid);
    supervisor.stop_all().await;
}

#[test]
fn backoff_doubles_up_to_its_cap() {
    let policy = RestartPolicy {
        max_restarts: u32::MAX,
        first_backoff: Duration::from_millis(250),
        max_backoff: Duration::from_secs(30),
        reset_after: Duration::from_secs(300),
    };
    let waits: Vec<Duration> = [1, 2, 3, 7, 8, 40, u32::MAX].map(|n| policy.backoff(n)).to_vec();
    let ms = |n| Duration::from_millis(n);
    assert_eq!(
        waits,
        [
            ms(250),
            ms(500),
            ms(1000),
            ms(16_000),
            ms(30_000),
            ms(30_000),
            ms(30_000)
        ]
    );
}

#[tokio::test]
async fn a_start_that_ran_ready_long_enough_resets_the_restart_count() {
    let dir = tempfile::tempdir().expect("temp dir");
    let program = engine_program(dir.path(), &[("SKEIN_FAKE_ENGINE_EXIT_MS", "1000".to_owned())]);
    let mut config = config(dir.path());
    config.restart.max_restarts = 1;
    // Any time ready counts as long enough: every crash is a first failure.
    config.restart.reset_after = Duration::ZERO;
    let (supervisor, mut events) = Supervisor::new(config);
    supervisor
        .start(candle("phoenix", program, &[]))
        .await
        .expect("started");
    let mut attempts = Vec::new();
    while attempts.len() < 3 {
        let seen = events_until(&mut events, |s| {
            matches!(s, InstanceState::Restarting { .. } | InstanceState::Failed { .. })
        })
        .await;
        match &seen.last().expect("an event").state {
            InstanceState::Restarting { attempt, reason, .. } if reason.contains("after it was ready") => {
                attempts.push(*attempt);
            }
            // Exited before it was ready (a very slow machine): not this test's case.
            InstanceState::Restarting { .. } => {}
            other => panic!("gave up despite the reset: {other:?}"),
        }
    }
    assert_eq!(attempts, [1, 1, 1]);
    supervisor.stop("phoenix").await.expect("stopped");
}

#[tokio::test]
async fn an_engine_stopped_while_loading_is_gone_without_a_restart() {
    let dir = tempfile::tempdir().expect("temp dir");
    let program = engine_program(dir.path(), &[("SKEIN_FAKE_ENGINE_READY_MS", "600000".to_owned())]);
    let (supervisor, mut events) = Supervisor::new(config(dir.path()));
    supervisor
        .start(candle("loading", program, &[]))
        .await
        .expect("started");
    let seen = events_until(&mut events, |s| *s == InstanceState::Loading).await;
    let pid = pid_of(&seen);
    supervisor.stop("loading").await.expect("stopped");
    assert!(gone(pid), "the engine process is gone once stop returns");
    let seen = events_until(&mut events, |s| *s == InstanceState::Stopped).await;
    assert_eq!(names(&seen), ["stopped"]);
    // Stopping again is a no-op.
    supervisor.stop("loading").await.expect("nothing to stop");
}

/// A piece (an RPC server's stand-in, in Python) that opens its port at once, takes
/// 200 MiB a second later (its weights arriving), and never accepts a connection, like an
/// RPC server busy with its one client.
const GROWING_PIECE: &str = r#"import socket, sys, time
args = sys.argv[1:]
host, port = args[args.index("--host") + 1], int(args[args.index("--port") + 1])
listener = socket.socket()
listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
listener.bind((host, port))
listener.listen(1)
print("listening", flush=True)
time.sleep(1.0)
weights = b"w" * (200 << 20)
print("weights received", flush=True)
time.sleep(600)
"#;

#[tokio::test]
async fn a_pieces_memory_is_measured_again_once_its_weights_arrive_and_it_is_not_probed_busy() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().expect("temp dir");
    let program = dir.path().join("piece.py");
    std::fs::write(&program, format!("#!/usr/bin/env python3\n{GROWING_PIECE}")).expect("write the piece");
    std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o755)).expect("executable");
    let spec = LaunchSpec {
        engine: EngineLaunch::LlamaRpc(LlamaRpcLaunch { program, cache: false }),
        ..candle("coder.rpc-server-1", PathBuf::new(), &[])
    };
    let (supervisor, mut events) = Supervisor::new(config(dir.path()));
    supervisor.set_measure_interval(Duration::from_millis(100));
    supervisor.start(spec).await.expect("started");
    let seen = events_until(&mut events, is_ready).await;
    let InstanceState::Ready { memory, .. } = &seen.last().expect("an event").state else {
        unreachable!("waited for it")
    };
    let at_ready = memory.host_rss.expect("measured");
    assert!(at_ready < 100 << 20, "measured before the weights came: {at_ready}");

    // Its memory is measured again as it runs, and the figure follows the weights.
    // (200 MiB taken; 150 MiB asked, so that a page not yet touched cannot fail it.)
    let grown = events_until(&mut events, |s| {
        matches!(s, InstanceState::Ready { memory, .. } if memory.host_rss.is_some_and(|rss| rss >= at_ready + (150 << 20)))
    })
    .await;
    assert_eq!(
        names(&grown).iter().filter(|n| **n != "ready").count(),
        0,
        "only new figures: {grown:#?}"
    );
    // It never accepts a connection, as an RPC server serving its one client: it is
    // watched by its process, not probed (3 failed probes would restart it).
    tokio::time::sleep(Duration::from_secs(8)).await;
    let status = supervisor.status();
    assert!(is_ready(&status[0].state), "{status:#?}");
    while let Ok(event) = events.try_recv() {
        assert!(is_ready(&event.state), "{event:#?}");
    }
    supervisor.stop_all().await;
}

#[tokio::test]
async fn an_engine_that_exits_successfully_before_it_is_ready_is_failed_without_restarts() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().expect("temp dir");
    // As llama.cpp's RPC server does with a flag it does not know.
    let program = dir.path().join("usage.sh");
    std::fs::write(
        &program,
        "#!/bin/sh\necho \"error: unknown argument: $1\" >&2\necho 'Usage: rpc-server [options]' >&2\nexit 0\n",
    )
    .expect("write");
    std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o755)).expect("executable");
    let (supervisor, mut events) = Supervisor::new(config(dir.path()));
    supervisor.start(candle("usage", program, &[])).await.expect("started");
    let seen = events_until(&mut events, |s| matches!(s, InstanceState::Failed { .. })).await;
    assert_eq!(names(&seen), ["starting", "loading", "failed"]);
    let InstanceState::Failed { reason, .. } = &seen[2].state else {
        unreachable!("checked above")
    };
    assert!(
        reason.starts_with("exited with status 0 before it was ready"),
        "{reason}"
    );
    assert!(reason.contains("error: unknown argument: engine"), "{reason}");
}
