//! One instance's task: what it runs ([`Target`]: a local engine process or a remote
//! endpoint), and the loop that starts it, waits until it is ready, watches its health
//! and restarts it per the [`RestartPolicy`](super::supervisor::RestartPolicy) until it
//! is stopped or has failed. Its state goes to the supervisor's table and event channel.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::command::{EngineCommand, EngineKey, EngineLaunch, LaunchError, LaunchSpec, RemoteLaunch};
use super::logs::{InstanceLog, LogMark};
use super::process::{EngineProcess, describe_exit, process_tree};
use super::shared::{
    InstanceEvent, InstanceState, MeasuredMemory, PROBE_TIMEOUT, READINESS_POLL, REASON_LOG_LINES, Shared,
    SupervisorError, UNHEALTHY_AFTER,
};
use skein_model_registry::error_chain;

/// Log lines quoted when an engine ended successfully before it was ready: enough for a
/// usage text and the complaint above it (llama.cpp's RPC server prints 10 lines of usage
/// after `error: unknown argument`).
const USAGE_LOG_LINES: usize = 40;

/// What an instance runs.
pub(super) enum Target {
    /// An engine process on this machine, found ready by `probe`, then watched as
    /// `health` says.
    Local {
        command: EngineCommand,
        probe: Probe,
        health: Health,
        /// Where it answers: an OpenAI base URL; `HOST:PORT` for a piece.
        base_url: String,
        /// The engine's key, sent with the probe too (engines leave `/health` open, but
        /// an engine that guards it is still found ready).
        key: Option<EngineKey>,
    },
    /// A remote endpoint, probed at `models_url` with the key.
    Remote {
        base_url: String,
        models_url: String,
        key: Option<EngineKey>,
    },
}

/// How a ready local process is watched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Health {
    /// Its readiness probe again, every health interval.
    Probe,
    /// Only its process: it is healthy while it runs. For llama.cpp's RPC server, which
    /// serves one client at a time: once the serving `llama-server` holds its connection
    /// no probe can connect, and the serving engine fails when a backend goes away.
    Alive,
}

/// How a local process is found ready.
pub(super) enum Probe {
    /// `GET` answers 2xx (503 while loading): an engine's `/health`.
    Http(String),
    /// A TCP connection to `HOST:PORT` opens: a piece of an engine split across
    /// machines (a Ray node, an RPC server), which speaks no HTTP.
    Tcp(String),
}

impl Target {
    pub(super) fn from_spec(spec: &LaunchSpec) -> Result<Self, SupervisorError> {
        match (spec.command(), &spec.engine) {
            (Ok(command), _) => {
                // An engine listening on every address is probed on loopback.
                let probe_host = match spec.host.as_str() {
                    "0.0.0.0" => "127.0.0.1",
                    "::" | "[::]" => "::1",
                    host => host,
                };
                if spec.is_piece() {
                    let health = match spec.engine {
                        EngineLaunch::LlamaRpc(_) => Health::Alive,
                        _ => Health::Probe,
                    };
                    return Ok(Self::Local {
                        command,
                        probe: Probe::Tcp(address(probe_host, spec.port)),
                        health,
                        base_url: address(&spec.host, spec.port),
                        key: None,
                    });
                }
                Ok(Self::Local {
                    command,
                    probe: Probe::Http(format!("{}/health", origin(probe_host, spec.port))),
                    health: Health::Probe,
                    base_url: format!("{}/v1", origin(&spec.host, spec.port)),
                    key: spec.api_key.clone(),
                })
            }
            (Err(LaunchError::Remote { .. }), EngineLaunch::Remote(remote)) => Ok(Self::remote(remote)),
            (Err(error), _) => Err(SupervisorError::Invalid(error)),
        }
    }

    fn remote(remote: &RemoteLaunch) -> Self {
        // The key comes with the start (the owner's secret); the agent's environment
        // holds the agent's own credentials and is never read for a workflow.
        let key = remote.api_key.clone();
        let base_url = remote.url.trim_end_matches('/').to_owned();
        Self::Remote {
            models_url: format!("{base_url}/models"),
            base_url,
            key,
        }
    }

    /// Where it answers: an OpenAI base URL, or `HOST:PORT` for a piece.
    fn base_url(&self) -> &str {
        match self {
            Self::Local { base_url, .. } | Self::Remote { base_url, .. } => base_url,
        }
    }

    /// Whether a ready instance is probed (else only its process is watched).
    fn probed_when_ready(&self) -> bool {
        match self {
            Self::Local { health, .. } => *health == Health::Probe,
            Self::Remote { .. } => true,
        }
    }

    /// For logs and the Starting event: the command, or the probe of a remote endpoint.
    pub(super) fn describe(&self) -> String {
        match self {
            Self::Local { command, .. } => command.to_string(),
            Self::Remote { models_url, .. } => format!("GET {models_url}"),
        }
    }
}

/// `http://host:port`, with an IPv6 address in brackets.
fn origin(host: &str, port: u16) -> String {
    format!("http://{}", address(host, port))
}

/// `host:port`, with an IPv6 address in brackets.
fn address(host: &str, port: u16) -> String {
    if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// How one start ended.
enum Attempt {
    /// Stopped on request.
    Stopped,
    /// Failed; a restart may help. `ready_for`: how long it had been ready, if it was.
    Failed {
        reason: String,
        ready_for: Option<Duration>,
    },
    /// Failed in a way a restart cannot fix (the program cannot be started, the
    /// endpoint refuses the key).
    Fatal { reason: String },
}

/// Why a probe did not find the instance ready.
#[derive(Debug, thiserror::Error)]
enum NotReady {
    /// 503: still loading.
    #[error("answered 503 Service Unavailable (loading)")]
    Loading,
    /// 401 or 403: the key is wrong; waiting will not help.
    #[error("the endpoint refused the key: {0}")]
    Refused(reqwest::StatusCode),
    /// The port did not accept a connection.
    #[error("{address}")]
    Connect {
        /// Where the probe connected.
        address: String,
        /// Why it failed.
        #[source]
        source: std::io::Error,
    },
    /// The port did not answer within [`PROBE_TIMEOUT`].
    #[error("{address}: no answer in {PROBE_TIMEOUT:?}")]
    Silent {
        /// Where the probe connected.
        address: String,
    },
    /// The HTTP probe could not be sent or answered.
    #[error(transparent)]
    Request(reqwest::Error),
    /// Another status.
    #[error("answered {0}")]
    Status(reqwest::StatusCode),
}

impl NotReady {
    /// The probe's failure with its causes, as a reason reads it.
    fn describe(&self) -> String {
        error_chain(self)
    }
}

/// The task of one instance.
pub(super) struct InstanceTask {
    pub(super) shared: Arc<Shared>,
    pub(super) name: String,
    pub(super) log: Arc<InstanceLog>,
    pub(super) cancel: CancellationToken,
}

impl InstanceTask {
    /// Starts, watches and restarts the instance until it is stopped or has failed.
    pub(super) async fn supervise(self, target: Target) {
        let policy = self.shared.config.restart;
        let mut restarts = 0u32;
        let mut start = 0u32;
        loop {
            start += 1;
            let attempt = self.attempt(&target, start, restarts).await;
            let (reason, ready_for) = match attempt {
                Attempt::Stopped => break,
                Attempt::Fatal { reason } => {
                    self.fail(reason, restarts).await;
                    return self.finish();
                }
                Attempt::Failed { reason, ready_for } => (reason, ready_for),
            };
            if ready_for.is_some_and(|d| d >= policy.reset_after) {
                restarts = 0;
            }
            if restarts >= policy.max_restarts {
                self.fail(reason, restarts).await;
                return self.finish();
            }
            restarts += 1;
            let after = policy.backoff(restarts);
            warn!(instance = %self.name, %reason, attempt = restarts, ?after, "engine failed; restarting");
            let state = InstanceState::Restarting {
                attempt: restarts,
                after,
                reason,
            };
            self.emit(state, restarts).await;
            tokio::select! {
                biased;
                () = self.cancel.cancelled() => break,
                () = tokio::time::sleep(after) => {}
            }
        }
        self.emit(InstanceState::Stopped, restarts).await;
        self.finish();
    }

    /// One start: launch (or, remote, begin probing), wait until ready, watch until it
    /// fails or is stopped.
    async fn attempt(&self, target: &Target, start: u32, restarts: u32) -> Attempt {
        let config = &self.shared.config;
        let described = target.describe();
        let marker = format!(
            "==> skein: start {start} of {} at {}: {described}",
            self.name,
            humantime::format_rfc3339_seconds(SystemTime::now())
        );
        let mark = self.log.start_marker(marker).await;
        let mut process = match target {
            Target::Local { command, .. } => match EngineProcess::spawn(command, &self.log) {
                Ok(process) => Some(process),
                Err(error) => {
                    let reason = format!("cannot start {}: {error}", command.program.display());
                    self.log.push(format!("==> skein: {reason}")).await;
                    return Attempt::Fatal { reason };
                }
            },
            Target::Remote { .. } => None,
        };
        let pid = process.as_ref().and_then(EngineProcess::pid);
        self.set_group(process.as_ref().and_then(EngineProcess::group));
        self.emit(
            InstanceState::Starting {
                pid,
                command: described,
            },
            restarts,
        )
        .await;
        self.emit(InstanceState::Loading, restarts).await;

        // Until ready.
        let deadline = tokio::time::Instant::now() + config.readiness_timeout;
        let poll = READINESS_POLL.min(config.health_interval);
        let ready = tokio::select! {
            biased;
            () = self.cancel.cancelled() => Err(Attempt::Stopped),
            (status, success) = exit_of(&mut process) => Err(if success {
                // An engine never ends by itself, let alone successfully, before it
                // serves: it refused its command line (llama.cpp's RPC server prints its
                // usage and exits 0 on a flag it does not know). A restart cannot help.
                Attempt::Fatal {
                    reason: self.with_lines(
                        format!(
                            "exited with {status} before it was ready: the program does not run as an engine with these arguments (an unknown flag?)"
                        ),
                        mark,
                        USAGE_LOG_LINES,
                    ),
                }
            } else {
                Attempt::Failed {
                    reason: self.with_tail(format!("exited with {status} while loading"), mark),
                    ready_for: None,
                }
            }),
            () = tokio::time::sleep_until(deadline) => Err(Attempt::Failed {
                reason: self.with_tail(
                    format!("not ready after {}", humantime::format_duration(config.readiness_timeout)),
                    mark,
                ),
                ready_for: None,
            }),
            ready = self.until_ready(target, poll) => ready.map_err(|reason| Attempt::Fatal { reason }),
        };
        let outcome = match ready {
            Err(outcome) => outcome,
            Ok(()) => {
                let memory = self.measure(pid).await;
                let base_url = target.base_url().to_owned();
                info!(instance = %self.name, %base_url, ?memory, "instance ready");
                self.emit(
                    InstanceState::Ready {
                        base_url,
                        memory: memory.clone(),
                    },
                    restarts,
                )
                .await;
                self.watch(target, &mut process, memory, mark, restarts).await
            }
        };
        if let Some(p) = process.as_mut() {
            p.terminate(config.stop_grace).await;
        }
        self.set_group(None);
        outcome
    }

    /// Watches a ready instance until it exits, fails [`UNHEALTHY_AFTER`] probes in a
    /// row (when it is probed: [`Health`]), or is stopped; meanwhile measures its memory
    /// every measure interval and reports it again (a Ready event) when it changed from
    /// `reported`: a piece is ready before its weights arrive, and an engine's memory
    /// grows with its caches.
    async fn watch(
        &self,
        target: &Target,
        process: &mut Option<EngineProcess>,
        mut reported: MeasuredMemory,
        mark: LogMark,
        restarts: u32,
    ) -> Attempt {
        let ready_at = Instant::now();
        let pid = process.as_ref().and_then(EngineProcess::pid);
        let probed = target.probed_when_ready();
        let health_interval = self.shared.config.health_interval;
        let mut next_probe = tokio::time::Instant::now() + health_interval;
        let mut next_measure = tokio::time::Instant::now() + self.shared.measure_interval();
        let mut failures = 0u32;
        loop {
            let wake = match (probed, pid.is_some()) {
                (true, true) => next_probe.min(next_measure),
                (true, false) => next_probe,
                (false, _) => next_measure,
            };
            tokio::select! {
                biased;
                () = self.cancel.cancelled() => return Attempt::Stopped,
                (status, _) = exit_of(process) => {
                    return Attempt::Failed {
                        reason: self.with_tail(format!("exited with {status} after it was ready"), mark),
                        ready_for: Some(ready_at.elapsed()),
                    };
                }
                () = tokio::time::sleep_until(wake) => {}
            }
            let now = tokio::time::Instant::now();
            if pid.is_some() && now >= next_measure {
                next_measure = now + self.shared.measure_interval();
                let memory = self.measure(pid).await;
                if memory_changed(&reported, &memory) {
                    debug!(instance = %self.name, ?memory, "memory measured again");
                    let base_url = target.base_url().to_owned();
                    let state = InstanceState::Ready {
                        base_url,
                        memory: memory.clone(),
                    };
                    self.emit(state, restarts).await;
                    reported = memory;
                }
            }
            if !probed || now < next_probe {
                continue;
            }
            next_probe = now + health_interval;
            match self.probe(target).await {
                Ok(()) => failures = 0,
                Err(not_ready) => {
                    failures += 1;
                    debug!(instance = %self.name, failures, reason = %not_ready.describe(), "health probe failed");
                    if failures >= UNHEALTHY_AFTER {
                        let reason = format!(
                            "{UNHEALTHY_AFTER} health probes failed in a row, the last: {}",
                            not_ready.describe()
                        );
                        self.emit(InstanceState::Unhealthy { reason: reason.clone() }, restarts)
                            .await;
                        return Attempt::Failed {
                            reason,
                            ready_for: Some(ready_at.elapsed()),
                        };
                    }
                }
            }
        }
    }

    /// Polls until the instance answers ready (`Ok`), or until waiting cannot help
    /// (`Err` with the reason: the endpoint refuses the key). Polls on while the
    /// instance loads or does not answer yet.
    async fn until_ready(&self, target: &Target, poll: Duration) -> Result<(), String> {
        loop {
            match self.probe(target).await {
                Ok(()) => return Ok(()),
                Err(refused @ NotReady::Refused(_)) => return Err(refused.describe()),
                Err(_) => tokio::time::sleep(poll).await,
            }
        }
    }

    /// The memory the engine's processes hold (nothing for a remote endpoint).
    async fn measure(&self, pid: Option<u32>) -> MeasuredMemory {
        let Some(pid) = pid else {
            return MeasuredMemory::default();
        };
        let probe = self.shared.probe.clone();
        // Reading /proc and NVML blocks.
        let measured = tokio::task::spawn_blocking(move || {
            let (pids, host_rss) = process_tree(pid);
            let gpu = probe.map(|p| p.process_memory(&pids)).unwrap_or_default();
            MeasuredMemory { host_rss, gpu }
        });
        measured.await.unwrap_or_default()
    }

    /// Sends the probe of `target` once.
    async fn probe(&self, target: &Target) -> Result<(), NotReady> {
        let request = match target {
            Target::Local {
                probe: Probe::Tcp(address),
                ..
            } => {
                return match tokio::time::timeout(PROBE_TIMEOUT, tokio::net::TcpStream::connect(address.as_str())).await
                {
                    Ok(Ok(_)) => Ok(()),
                    Ok(Err(source)) => Err(NotReady::Connect {
                        address: address.clone(),
                        source,
                    }),
                    Err(_) => Err(NotReady::Silent {
                        address: address.clone(),
                    }),
                };
            }
            Target::Local {
                probe: Probe::Http(health_url),
                key,
                ..
            } => {
                let request = self.shared.local_http.get(health_url);
                match key {
                    Some(key) => request.bearer_auth(key.expose()),
                    None => request,
                }
            }
            Target::Remote { models_url, key, .. } => {
                let request = self.shared.remote_http.get(models_url);
                match key {
                    Some(key) => request.bearer_auth(key.expose()),
                    None => request,
                }
            }
        };
        let response = request.timeout(PROBE_TIMEOUT).send().await.map_err(NotReady::Request)?;
        let status = response.status();
        match status.as_u16() {
            200..=299 => Ok(()),
            503 => Err(NotReady::Loading),
            401 | 403 if matches!(target, Target::Remote { .. }) => Err(NotReady::Refused(status)),
            _ => Err(NotReady::Status(status)),
        }
    }

    /// `reason; last log lines:` and the lines of this start, when there are any.
    fn with_tail(&self, reason: String, mark: LogMark) -> String {
        self.with_lines(reason, mark, REASON_LOG_LINES)
    }

    /// [`Self::with_tail`] with up to `lines` lines.
    fn with_lines(&self, reason: String, mark: LogMark, lines: usize) -> String {
        let tail = self.log.tail_since(mark, lines);
        if tail.is_empty() {
            reason
        } else {
            format!("{reason}{}\n{}", skein_proto::LAST_LOG_LINES, tail.join("\n"))
        }
    }

    async fn fail(&self, reason: String, restarts: u32) {
        warn!(instance = %self.name, %reason, "instance failed; no restart left");
        let log_tail = self.log.tail(REASON_LOG_LINES);
        self.emit(InstanceState::Failed { reason, log_tail }, restarts).await;
    }

    /// Records the new state, then sends it as an event.
    async fn emit(&self, state: InstanceState, restarts: u32) {
        let at = SystemTime::now();
        {
            let mut instances = self.shared.lock();
            if let Some(entry) = instances.get_mut(&self.name) {
                entry.status.state = state.clone();
                entry.status.restarts = restarts;
                entry.status.since = at;
            }
        }
        let event = InstanceEvent {
            instance: self.name.clone(),
            state,
            restarts,
            at,
        };
        // No receiver: the daemon is shutting down and nobody listens.
        let _ = self.shared.events.send(event).await;
    }

    fn set_group(&self, group: Option<rustix::process::Pid>) {
        let mut instances = self.shared.lock();
        if let Some(run) = instances.get_mut(&self.name).and_then(|e| e.run.as_mut()) {
            run.group = group;
        }
    }

    /// Marks the instance as no longer running (its name can be started again).
    fn finish(&self) {
        let mut instances = self.shared.lock();
        if let Some(entry) = instances.get_mut(&self.name) {
            entry.run = None;
        }
    }
}

/// How the process ended (`status 3`), and whether it succeeded (status 0); never,
/// without a process.
async fn exit_of(process: &mut Option<EngineProcess>) -> (String, bool) {
    match process {
        Some(p) => match p.wait().await {
            Ok(status) => (describe_exit(status), status.success()),
            Err(error) => (format!("an unknown status ({error})"), false),
        },
        None => std::future::pending().await,
    }
}

/// Whether a new measurement differs enough from the one reported to report it: any
/// figure that moved by 1 % (and at least 1 MiB), or GPUs that appeared or went. A
/// measurement that found nothing (the process table unreadable for a moment) is not
/// news.
fn memory_changed(reported: &MeasuredMemory, new: &MeasuredMemory) -> bool {
    if new.host_rss.is_none() && new.gpu.is_empty() {
        return false;
    }
    let moved = |old: u64, new: u64| old.abs_diff(new) >= (old.max(new) / 100).max(1 << 20);
    let host = match (reported.host_rss, new.host_rss) {
        (Some(old), Some(new)) => moved(old, new),
        (None, Some(_)) => true,
        (_, None) => false,
    };
    let gpus = |m: &MeasuredMemory| m.gpu.iter().map(|&(index, _)| index).collect::<Vec<_>>();
    host || gpus(reported) != gpus(new)
        || reported
            .gpu
            .iter()
            .zip(&new.gpu)
            .any(|(&(_, old), &(_, new))| moved(old, new))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_memory_that_moved_is_reported_again() {
        let mib = 1u64 << 20;
        let at = |host: Option<u64>, gpu: &[(u32, u64)]| MeasuredMemory {
            host_rss: host,
            gpu: gpu.to_vec(),
        };
        let loaded = at(Some(840 * mib), &[(0, 4096 * mib)]);
        // A piece measured when its port opened, before its weights arrived.
        assert!(memory_changed(&at(Some(5 * mib), &[]), &loaded));
        // Jitter under 1 %, or under 1 MiB of a small figure, is not news.
        assert!(!memory_changed(&loaded, &at(Some(845 * mib), &[(0, 4100 * mib)])));
        assert!(!memory_changed(&at(Some(mib), &[]), &at(Some(mib + mib / 2), &[])));
        assert!(memory_changed(&loaded, &at(Some(860 * mib), &[(0, 4096 * mib)])));
        assert!(memory_changed(&loaded, &at(Some(840 * mib), &[(0, 5000 * mib)])));
        assert!(memory_changed(
            &loaded,
            &at(Some(840 * mib), &[(0, 4096 * mib), (1, mib)])
        ));
        assert!(!memory_changed(&loaded, &at(None, &[])), "nothing measured");
    }
}
