//! The agent's side of engine commands ([`EngineHost`], the daemon's
//! [`InstanceHost`]): a start becomes a download of the instance's files into the
//! Hugging Face cache (progress reported), a free port, a [`LaunchSpec`] and a
//! supervised engine; every change of the instance goes up as an
//! [`pb::InstanceStatus`].

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use skein_model_registry::hub::{HubClient, RepoId};
use skein_proto::agent::v1::{self as pb, start_instance};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::free_port;
pub use super::spec::{EngineHostConfig, launch_spec};
use super::supervisor::{InstanceEvent, InstanceState, Supervisor, SupervisorError};
use crate::daemon::InstanceHost;

/// Why an instance could not be started on this agent. Its Failed status says this
/// with every cause ([`skein_model_registry::error_chain`]).
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    /// The command names a repository id that is not one.
    #[error(transparent)]
    Repo(skein_model_registry::Error),
    /// The hub could not resolve the revision or download the files.
    #[error(transparent)]
    Hub(skein_model_registry::Error),
    /// The download's thread ended without an answer.
    #[error("the download task failed")]
    DownloadTask(#[source] tokio::task::JoinError),
    /// No port was free for the engine.
    #[error("no free port on {host}")]
    NoPort {
        /// The address engines listen on.
        host: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The command cannot become a launch spec ([`launch_spec`]).
    #[error("{0}")]
    Spec(String),
    /// The supervisor refused the start.
    #[error(transparent)]
    Supervisor(#[from] SupervisorError),
}

/// Runs the instances the orchestrator asks for.
pub struct EngineHost {
    inner: Arc<Inner>,
}

struct Inner {
    supervisor: Supervisor,
    hub: HubClient,
    config: EngineHostConfig,
    reports: mpsc::Sender<pb::InstanceStatus>,
    /// The latest status of every instance.
    statuses: Mutex<BTreeMap<String, pb::InstanceStatus>>,
    /// The command of every instance asked for (a repeated start is a no-op).
    commands: Mutex<HashMap<String, pb::StartInstance>>,
    /// Downloads and starts in progress.
    preparing: Mutex<HashMap<String, JoinHandle<()>>>,
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn unix_ms(at: SystemTime) -> i64 {
    at.duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

impl EngineHost {
    /// A host whose engines `supervisor` runs (its events come on `events`), with
    /// reports going to `reports`. Spawns the task that turns supervisor events into
    /// reports, so call it inside a tokio runtime.
    pub fn new(
        supervisor: Supervisor,
        mut events: mpsc::Receiver<InstanceEvent>,
        hub: HubClient,
        config: EngineHostConfig,
        reports: mpsc::Sender<pb::InstanceStatus>,
    ) -> EngineHost {
        let inner = Arc::new(Inner {
            supervisor,
            hub,
            config,
            reports,
            statuses: Mutex::default(),
            commands: Mutex::default(),
            preparing: Mutex::default(),
        });
        let weak = Arc::downgrade(&inner);
        tokio::spawn(async move {
            while let Some(event) = events.recv().await {
                let Some(inner) = weak.upgrade() else { return };
                inner.report(status_of(&event)).await;
            }
        });
        EngineHost { inner }
    }
}

/// An instance's supervisor event as the protocol reports it.
fn status_of(event: &InstanceEvent) -> pb::InstanceStatus {
    let mut status = pb::InstanceStatus {
        instance: event.instance.clone(),
        unix_ms: unix_ms(event.at),
        restarts: event.restarts,
        ..pb::InstanceStatus::default()
    };
    let state = match &event.state {
        InstanceState::Starting { command, .. } => {
            status.detail = command.clone();
            pb::InstanceState::Starting
        }
        InstanceState::Loading => pb::InstanceState::Loading,
        InstanceState::Ready { base_url, memory } => {
            status.base_url = base_url.clone();
            status.host_rss = memory.host_rss;
            status.gpu_memory = memory
                .gpu
                .iter()
                .map(|&(index, bytes)| pb::GpuMemory { index, bytes })
                .collect();
            pb::InstanceState::Ready
        }
        InstanceState::Unhealthy { reason } => {
            status.detail = reason.clone();
            pb::InstanceState::Unhealthy
        }
        InstanceState::Restarting { reason, .. } => {
            status.detail = reason.clone();
            pb::InstanceState::Restarting
        }
        InstanceState::Failed { reason, .. } => {
            status.detail = reason.clone();
            pb::InstanceState::Failed
        }
        InstanceState::Stopped => pb::InstanceState::Stopped,
    };
    status.state = state as i32;
    status
}

impl Inner {
    async fn report(&self, mut status: pb::InstanceStatus) {
        // Every report carries the instance's key, so that an orchestrator that restarted
        // (and kept none) can reach the engine still running.
        if let Some(command) = lock(&self.commands).get(&status.instance) {
            status.engine_api_key.clone_from(&command.engine_api_key);
        }
        lock(&self.statuses).insert(status.instance.clone(), status.clone());
        // Without a connection the report waits in the channel (bounded); the latest
        // status is sent again on reconnect anyway.
        let _ = self.reports.try_send(status);
    }

    async fn fail(&self, instance: &str, error: &HostError) {
        let detail = skein_model_registry::error_chain(error);
        tracing::warn!(%instance, %detail, "instance failed to start");
        self.report(pb::InstanceStatus {
            instance: instance.to_owned(),
            state: pb::InstanceState::Failed as i32,
            detail,
            unix_ms: unix_ms(SystemTime::now()),
            ..pb::InstanceStatus::default()
        })
        .await;
    }

    /// Downloads what the instance needs, then hands it to the supervisor.
    async fn prepare(self: Arc<Self>, command: pb::StartInstance) {
        let name = command.instance.clone();
        let local = match &command.engine {
            Some(start_instance::Engine::Remote(_) | start_instance::Engine::LlamaRpc(_)) | None => None,
            Some(start_instance::Engine::Candle(e)) => e.model.clone(),
            Some(start_instance::Engine::LlamaCpp(e)) => e.model.clone(),
            Some(start_instance::Engine::Vllm(e)) => e.model.clone(),
            Some(start_instance::Engine::RayNode(e)) => e.model.clone(),
        };
        let snapshot = match local {
            Some(files) => match self.download(&name, &files).await {
                Ok(dir) => Some(dir),
                Err(error) => return self.fail(&name, &error).await,
            },
            None => None,
        };
        // The adapters, each a repository of its own, into the same cache.
        let mut adapters = Vec::with_capacity(command.adapters.len());
        for adapter in &command.adapters {
            let Some(files) = &adapter.files else {
                let error = HostError::Spec(format!("instance `{name}`: adapter `{}` names no files", adapter.name));
                return self.fail(&name, &error).await;
            };
            match self.download(&name, files).await {
                Ok(dir) => adapters.push(dir),
                Err(error) => return self.fail(&name, &error).await,
            }
        }
        let port = match free_port(&self.config.listen_host) {
            Ok(port) => port,
            Err(source) => {
                let host = self.config.listen_host.clone();
                return self.fail(&name, &HostError::NoPort { host, source }).await;
            }
        };
        let spec = match launch_spec(&command, snapshot.as_deref(), &adapters, &self.config, port) {
            Ok(spec) => spec,
            Err(error) => return self.fail(&name, &HostError::Spec(error)).await,
        };
        // A start with a different command replaces the running instance.
        if self.supervisor.status().iter().any(|s| s.instance == name) {
            let _ = self.supervisor.stop(&name).await;
        }
        if let Err(error) = self.supervisor.start(spec).await {
            self.fail(&name, &HostError::from(error)).await;
        }
    }

    /// The instance's files in the HF cache; progress is reported as it goes.
    async fn download(self: &Arc<Self>, instance: &str, files: &pb::ModelFiles) -> Result<PathBuf, HostError> {
        let repo = RepoId::parse(&files.repo).map_err(HostError::Repo)?;
        let hub = self.hub.clone();
        let revision = files.revision.clone();
        let required = files.files.clone();
        let optional = files.optional_files.clone();
        let reporter = Arc::clone(self);
        let instance = instance.to_owned();
        let runtime = tokio::runtime::Handle::current();
        // The hub client's futures are not `Send`: they run on a blocking thread.
        tokio::task::spawn_blocking(move || {
            runtime.block_on(async move {
                let resolved = hub.resolve(&repo, &revision).await.map_err(HostError::Hub)?;
                let mut wanted = required;
                wanted.extend(optional.into_iter().filter(|f| resolved.file(f).is_some()));
                wanted.sort();
                wanted.dedup();
                let last = Arc::new(Mutex::new(SystemTime::UNIX_EPOCH));
                let progress = {
                    let reporter = Arc::clone(&reporter);
                    let instance = instance.clone();
                    move |p: skein_model_registry::hub::DownloadProgress| {
                        let now = SystemTime::now();
                        let mut last = lock(&last);
                        let done = p.bytes_done >= p.bytes_total;
                        if !done && now.duration_since(*last).unwrap_or_default() < Duration::from_millis(500) {
                            return;
                        }
                        *last = now;
                        let status = pb::InstanceStatus {
                            instance: instance.clone(),
                            state: pb::InstanceState::Downloading as i32,
                            detail: format!("downloading {} ({} of {} bytes)", p.file, p.bytes_done, p.bytes_total),
                            unix_ms: unix_ms(now),
                            downloaded: p.bytes_done,
                            download_total: p.bytes_total,
                            ..pb::InstanceStatus::default()
                        };
                        lock(&reporter.statuses).insert(instance.clone(), status.clone());
                        let _ = reporter.reports.try_send(status);
                    }
                };
                reporter
                    .report(pb::InstanceStatus {
                        instance: instance.clone(),
                        state: pb::InstanceState::Downloading as i32,
                        detail: format!("fetching {} file(s) of {}", wanted.len(), repo),
                        unix_ms: unix_ms(SystemTime::now()),
                        ..pb::InstanceStatus::default()
                    })
                    .await;
                hub.download(&resolved, &wanted, progress).await.map_err(HostError::Hub)
            })
        })
        .await
        .map_err(HostError::DownloadTask)?
    }
}

impl InstanceHost for EngineHost {
    fn start(&self, command: pb::StartInstance) {
        let name = command.instance.clone();
        {
            let mut commands = lock(&self.inner.commands);
            let running = lock(&self.inner.statuses).get(&name).is_some_and(|s| {
                !matches!(
                    pb::InstanceState::try_from(s.state),
                    Ok(pb::InstanceState::Failed | pb::InstanceState::Stopped)
                )
            });
            if running && commands.get(&name) == Some(&command) {
                // Asked again (the orchestrator restarted): say where it stands.
                if let Some(status) = lock(&self.inner.statuses).get(&name).cloned() {
                    let _ = self.inner.reports.try_send(status);
                }
                return;
            }
            commands.insert(name.clone(), command.clone());
        }
        let task = tokio::spawn(Arc::clone(&self.inner).prepare(command));
        if let Some(old) = lock(&self.inner.preparing).insert(name, task) {
            old.abort();
        }
    }

    fn stop(&self, instance: &str) {
        if let Some(task) = lock(&self.inner.preparing).remove(instance) {
            task.abort();
        }
        lock(&self.inner.commands).remove(instance);
        let inner = Arc::clone(&self.inner);
        let instance = instance.to_owned();
        tokio::spawn(async move {
            if inner.supervisor.stop(&instance).await.is_err() {
                // Never reached the supervisor (stopped while downloading).
                inner
                    .report(pb::InstanceStatus {
                        instance: instance.clone(),
                        state: pb::InstanceState::Stopped as i32,
                        unix_ms: unix_ms(SystemTime::now()),
                        ..pb::InstanceStatus::default()
                    })
                    .await;
            }
            lock(&inner.statuses).remove(&instance);
        });
    }

    fn statuses(&self) -> Vec<pb::InstanceStatus> {
        lock(&self.inner.statuses).values().cloned().collect()
    }

    fn logs(&self, instance: &str, tail: usize) -> Result<Vec<String>, String> {
        self.inner.supervisor.logs(instance, tail).map_err(|e| e.to_string())
    }

    fn sample_interval(&self, interval: Duration) {
        self.inner.supervisor.set_measure_interval(interval);
    }

    fn shutdown(&self) -> futures::future::BoxFuture<'_, ()> {
        Box::pin(async move {
            for (_, task) in lock(&self.inner.preparing).drain() {
                task.abort();
            }
            lock(&self.inner.commands).clear();
            self.inner.supervisor.stop_all().await;
        })
    }
}

/// The names of llama.cpp's RPC server, newest first: current releases build
/// `ggml-rpc-server`; older ones built `rpc-server`.
pub const RPC_SERVER_NAMES: [&str; 2] = ["ggml-rpc-server", "rpc-server"];

/// The RPC server to run when none is named: the first of [`RPC_SERVER_NAMES`] that is an
/// executable file in a directory of `path` (the value of `PATH`); else
/// `ggml-rpc-server`, whose absence a start then reports.
pub fn default_rpc_server(path: Option<&std::ffi::OsStr>) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let dirs: Vec<PathBuf> = path.map(|p| std::env::split_paths(p).collect()).unwrap_or_default();
    let executable =
        |file: &Path| std::fs::metadata(file).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0);
    RPC_SERVER_NAMES
        .iter()
        .find(|name| dirs.iter().any(|dir| executable(&dir.join(name))))
        .map_or_else(|| PathBuf::from(RPC_SERVER_NAMES[0]), PathBuf::from)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::{EngineKey, EngineLaunch};

    fn config(simulated_gpus: bool) -> EngineHostConfig {
        EngineHostConfig {
            skein: PathBuf::from("/usr/bin/skein"),
            llama_server: PathBuf::from("llama-server"),
            vllm: PathBuf::from("vllm"),
            ray: PathBuf::from("ray"),
            rpc_server: PathBuf::from("rpc-server"),
            listen_host: "127.0.0.1".to_owned(),
            simulated_gpus,
            devices: Vec::new(),
        }
    }

    fn files() -> Option<pb::ModelFiles> {
        Some(pb::ModelFiles {
            repo: "owner/model".to_owned(),
            revision: "0".repeat(40),
            files: vec!["model.gguf".to_owned()],
            optional_files: Vec::new(),
        })
    }

    fn command(engine: start_instance::Engine, gpus: Vec<u32>) -> pb::StartInstance {
        pb::StartInstance {
            instance: "r1-coder".to_owned(),
            gpus,
            context: 4096,
            concurrency: 2,
            engine_api_key: String::new(),
            adapters: Vec::new(),
            embeddings: None,
            engine: Some(engine),
        }
    }

    #[test]
    fn start_commands_become_launch_specs_with_local_paths() {
        let dir = Path::new("/cache/snapshots/abc");
        let vllm = command(
            start_instance::Engine::Vllm(pb::VllmEngine {
                model: files(),
                tensor_parallel: 2,
                layer_partition: vec![30, 34],
                quantization: Some("awq".to_owned()),
                reserved: vec![20 << 30; 4],
                total: vec![24 << 30; 4],
                max_num_batched_tokens: 2048,
                enforce_eager: false,
                kv_cache_dtype: None,
                ray_address: None,
                kv_cache_bytes: Some(3 << 30),
                tool_call_parser: Some("hermes".to_owned()),
                ..pb::VllmEngine::default()
            }),
            vec![2, 3, 0, 1],
        );
        let spec = launch_spec(&vllm, Some(dir), &[], &config(false), 9000).unwrap();
        assert_eq!(spec.gpus, vec![2, 3, 0, 1], "rank order kept");
        assert_eq!((spec.port, spec.context, spec.concurrency), (9000, 4096, 2));
        let EngineLaunch::Vllm(v) = &spec.engine else {
            panic!("{spec:?}")
        };
        assert_eq!(v.model, "/cache/snapshots/abc");
        assert_eq!(v.revision, None, "a local snapshot has no revision to resolve");
        assert_eq!(v.layer_partition, vec![30, 34]);
        assert_eq!(v.quantization.as_deref(), Some("awq"));
        assert_eq!(v.kv_cache_bytes, Some(3 << 30));
        assert_eq!(v.tool_call_parser.as_deref(), Some("hermes"));

        let llama = command(
            start_instance::Engine::LlamaCpp(pb::LlamaCppEngine {
                model: files(),
                gguf: "model.gguf".to_owned(),
                mmproj: Some("mmproj.gguf".to_owned()),
                gpu_layers: Some(40),
                tensor_split: vec![3, 1],
                n_batch: 2048,
                n_ubatch: 512,
                flash_attention: true,
                rpc_servers: Vec::new(),
            }),
            vec![0, 1],
        );
        let spec = launch_spec(&llama, Some(dir), &[], &config(false), 9001).unwrap();
        let EngineLaunch::LlamaCpp(l) = &spec.engine else {
            panic!("{spec:?}")
        };
        assert_eq!(l.model, dir.join("model.gguf"));
        assert_eq!(l.mmproj.as_deref(), Some(dir.join("mmproj.gguf").as_path()));
        assert_eq!((l.gpu_layers, l.tensor_split.clone()), (Some(40), vec![3, 1]));
    }

    #[test]
    fn the_ranks_of_a_split_read_the_model_by_name_from_their_own_cache() {
        let snapshot = Path::new("/var/hf/hub/models--owner--model/snapshots/0000");
        let ray = command(
            start_instance::Engine::RayNode(pb::RayNode {
                model: files(),
                head_address: Some("10.0.0.1:6379".to_owned()),
                node_id: None,
            }),
            vec![0, 1],
        );
        let spec = launch_spec(&ray, Some(snapshot), &[], &config(false), 7000).unwrap();
        let EngineLaunch::RayNode(r) = &spec.engine else {
            panic!("{spec:?}")
        };
        assert_eq!(r.hub_cache.as_deref(), Some(Path::new("/var/hf/hub")));
        assert_eq!(r.head_address.as_deref(), Some("10.0.0.1:6379"));
        let serve = command(
            start_instance::Engine::Vllm(pb::VllmEngine {
                model: files(),
                tensor_parallel: 1,
                layer_partition: vec![20, 20],
                reserved: vec![1 << 30; 2],
                total: vec![24 << 30; 2],
                ray_address: Some("10.0.0.1:6379".to_owned()),
                ..pb::VllmEngine::default()
            }),
            vec![0],
        );
        let spec = launch_spec(&serve, Some(snapshot), &[], &config(false), 7001).unwrap();
        let EngineLaunch::Vllm(v) = &spec.engine else {
            panic!("{spec:?}")
        };
        assert_eq!(v.model, "owner/model", "by name: the path may differ on other nodes");
        assert_eq!(v.revision.as_deref(), Some("0".repeat(40).as_str()));
        assert_eq!(v.hub_cache.as_deref(), Some(Path::new("/var/hf/hub")));
        let error = launch_spec(&ray, Some(Path::new("/models/mine")), &[], &config(false), 7000).unwrap_err();
        assert!(error.contains("is not a snapshot of a Hugging Face cache"), "{error}");
    }

    #[test]
    fn the_built_in_engine_runs_on_the_cpu_when_the_gpus_are_simulated() {
        let candle = command(
            start_instance::Engine::Candle(pb::CandleEngine {
                model: files(),
                gguf: String::new(),
                seed: 7,
            }),
            vec![1],
        );
        let dir = Path::new("/snap");
        let real = launch_spec(&candle, Some(dir), &[], &config(false), 1).unwrap();
        assert_eq!(real.gpus, vec![1]);
        let simulated = launch_spec(&candle, Some(dir), &[], &config(true), 1).unwrap();
        assert!(simulated.gpus.is_empty());
        let EngineLaunch::Candle(c) = &simulated.engine else {
            panic!()
        };
        assert_eq!((c.model.as_path(), c.seed), (dir, 7));
        assert_eq!(c.program, PathBuf::from("/usr/bin/skein"));
    }

    #[test]
    fn a_node_of_some_gpus_starts_engines_on_their_device_indices() {
        let candle = command(
            start_instance::Engine::Candle(pb::CandleEngine {
                model: files(),
                gguf: String::new(),
                seed: 7,
            }),
            vec![1, 0],
        );
        let dir = Path::new("/snap");
        // A Slurm job's GPUs 2 and 5 of the machine, registered as 0 and 1.
        let slurm = EngineHostConfig {
            devices: vec![2, 5],
            ..config(false)
        };
        assert_eq!(
            launch_spec(&candle, Some(dir), &[], &slurm, 1).unwrap().gpus,
            vec![5, 2]
        );
        let beyond = command(start_instance::Engine::Candle(pb::CandleEngine::default()), vec![2]);
        let error = launch_spec(&beyond, Some(dir), &[], &slurm, 1).unwrap_err();
        assert!(error.contains("names GPUs [2], and this node has 2"), "{error}");
    }

    #[test]
    fn the_rpc_server_is_found_by_its_current_name_else_its_old_one() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let (old, new, empty) = (dir.path().join("old"), dir.path().join("new"), dir.path().join("empty"));
        for d in [&old, &new, &empty] {
            std::fs::create_dir(d).unwrap();
        }
        let install = |dir: &Path, name: &str, mode: u32| {
            let file = dir.join(name);
            std::fs::write(&file, "#!/bin/sh\n").unwrap();
            std::fs::set_permissions(&file, std::fs::Permissions::from_mode(mode)).unwrap();
        };
        install(&old, "rpc-server", 0o755);
        install(&new, "ggml-rpc-server", 0o755);
        // Not executable: not a program to run.
        install(&empty, "ggml-rpc-server", 0o644);
        let path = |dirs: &[&Path]| std::env::join_paths(dirs).unwrap();
        let found = |dirs: &[&Path]| default_rpc_server(Some(&path(dirs)));
        assert_eq!(found(&[&old]), PathBuf::from("rpc-server"));
        assert_eq!(
            found(&[&old, &new]),
            PathBuf::from("ggml-rpc-server"),
            "the current name first"
        );
        assert_eq!(found(&[&empty, &old]), PathBuf::from("rpc-server"));
        assert_eq!(
            found(&[&empty]),
            PathBuf::from("ggml-rpc-server"),
            "nothing found: the current name"
        );
        assert_eq!(default_rpc_server(None), PathBuf::from("ggml-rpc-server"));
    }

    #[test]
    fn commands_an_agent_cannot_run_say_why() {
        let no_gguf = command(
            start_instance::Engine::LlamaCpp(pb::LlamaCppEngine {
                model: files(),
                ..pb::LlamaCppEngine::default()
            }),
            vec![0],
        );
        let error = launch_spec(&no_gguf, Some(Path::new("/d")), &[], &config(false), 1).unwrap_err();
        assert!(error.contains("needs a GGUF file"), "{error}");
        let mut none = no_gguf.clone();
        none.engine = None;
        let error = launch_spec(&none, None, &[], &config(false), 1).unwrap_err();
        assert!(error.contains("names no engine"), "{error}");
        let error = launch_spec(&no_gguf, None, &[], &config(false), 1).unwrap_err();
        assert!(error.contains("names no model files"), "{error}");
        let remote = command(
            start_instance::Engine::Remote(pb::RemoteEngine {
                url: "https://api.example.org/v1".to_owned(),
                model: "m".to_owned(),
                api_key: Some("sk-remote".to_owned()),
            }),
            Vec::new(),
        );
        let spec = launch_spec(&remote, None, &[], &config(false), 1).unwrap();
        assert!(
            matches!(spec.engine, EngineLaunch::Remote(ref r) if r.api_key.as_ref().map(EngineKey::expose) == Some("sk-remote"))
        );
        assert!(!format!("{spec:?}").contains("sk-remote"), "the key shows in {spec:?}");
    }

    fn adapter(name: &str, gguf: &str) -> pb::LoraAdapter {
        pb::LoraAdapter {
            name: name.to_owned(),
            files: files(),
            gguf: gguf.to_owned(),
        }
    }

    #[test]
    fn adapters_load_from_their_snapshots_as_their_engine_reads_them() {
        let dir = Path::new("/hf/models--owner--model/snapshots/abc");
        let tuned = [
            PathBuf::from("/hf/models--lab--a/snapshots/1"),
            PathBuf::from("/hf/models--lab--b/snapshots/2"),
        ];
        let mut llama = command(
            start_instance::Engine::LlamaCpp(pb::LlamaCppEngine {
                model: files(),
                gguf: "model.gguf".to_owned(),
                n_batch: 512,
                n_ubatch: 512,
                ..pb::LlamaCppEngine::default()
            }),
            Vec::new(),
        );
        llama.adapters = vec![adapter("lab/a:a.gguf", "a.gguf"), adapter("lab/b:b.gguf", "b.gguf")];
        let spec = launch_spec(&llama, Some(dir), &tuned, &config(false), 1).unwrap();
        let paths: Vec<(&str, &Path)> = spec
            .adapters
            .iter()
            .map(|a| (a.name.as_str(), a.path.as_path()))
            .collect();
        assert_eq!(
            paths,
            [
                ("lab/a:a.gguf", Path::new("/hf/models--lab--a/snapshots/1/a.gguf")),
                ("lab/b:b.gguf", Path::new("/hf/models--lab--b/snapshots/2/b.gguf")),
            ]
        );
        let args = spec.command().unwrap().args;
        let loras: Vec<&str> = args
            .windows(2)
            .filter(|w| w[0] == "--lora-scaled")
            .map(|w| w[1].as_str())
            .collect();
        assert_eq!(
            loras,
            ["/hf/models--lab--a/snapshots/1/a.gguf:0,/hf/models--lab--b/snapshots/2/b.gguf:0"],
            "loaded at scale 0: off until a request sets it"
        );
        // vLLM takes PEFT directories, under their names, in the slots the plan sized.
        let mut vllm = command(
            start_instance::Engine::Vllm(pb::VllmEngine {
                model: files(),
                tensor_parallel: 1,
                layer_partition: vec![32],
                reserved: vec![20 << 30],
                total: vec![24 << 30],
                max_loras: 2,
                max_lora_rank: 16,
                ..pb::VllmEngine::default()
            }),
            vec![0],
        );
        vllm.adapters = vec![adapter("lab/a", ""), adapter("lab/b", "")];
        let args = launch_spec(&vllm, Some(dir), &tuned, &config(false), 1)
            .unwrap()
            .command()
            .unwrap()
            .args;
        let at = args.iter().position(|a| a == "--enable-lora").expect("--enable-lora");
        assert_eq!(
            args[at..at + 8],
            [
                "--enable-lora",
                "--max-loras",
                "2",
                "--max-lora-rank",
                "16",
                "--lora-modules",
                "lab/a=/hf/models--lab--a/snapshots/1",
                "lab/b=/hf/models--lab--b/snapshots/2",
            ]
        );
        // Each engine refuses the other's format, and adapters without their files.
        vllm.adapters[1].gguf = "b.gguf".to_owned();
        let error = launch_spec(&vllm, Some(dir), &tuned, &config(false), 1).unwrap_err();
        assert!(
            error.contains("adapter `lab/b` is a GGUF file, and vLLM loads PEFT adapters only"),
            "{error}"
        );
        llama.adapters[0].gguf.clear();
        let error = launch_spec(&llama, Some(dir), &tuned, &config(false), 1).unwrap_err();
        assert!(error.contains("adapter `lab/a:a.gguf` is a PEFT directory"), "{error}");
        let error = launch_spec(&llama, Some(dir), &tuned[..1], &config(false), 1).unwrap_err();
        assert!(error.contains("2 adapters, 1 downloaded"), "{error}");
    }
}
