//! An engine process: started in its own process group with its output captured, stopped
//! by SIGTERM to the engine and then SIGKILL to the whole group (engines such as vLLM
//! and Ray start worker processes), and measured (resident memory of the whole process
//! tree).

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::process::{ExitStatus, Stdio};
use std::sync::Arc;
use std::time::Duration;

use rustix::process::{Pid, Signal, kill_process_group};
use sysinfo::{ProcessRefreshKind, ProcessesToUpdate, System};
use tokio::process::{Child, Command};
use tokio::task::JoinSet;

use super::command::EngineCommand;
use super::logs::InstanceLog;

/// How long to wait for an exited engine's output to close, so its last lines are in
/// the log before they are quoted; a grandchild holding the pipe open cannot stall us.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(1);

/// A running engine process and the tasks that capture its output.
#[derive(Debug)]
pub(crate) struct EngineProcess {
    child: Child,
    pid: Option<u32>,
    /// The process group (the engine is its leader), for signals to all its workers.
    group: Option<Pid>,
    capture: JoinSet<()>,
    exited: Option<ExitStatus>,
}

impl EngineProcess {
    /// Starts `command` in a new process group, stdin closed, stdout and stderr going
    /// line by line into `log`. The process is killed if this value is dropped.
    /// On Linux the engine also gets SIGKILL when the agent dies, even by `kill -9`
    /// (which runs no drop): an engine never outlives its agent holding a GPU nobody
    /// accounts for.
    pub(crate) fn spawn(command: &EngineCommand, log: &Arc<InstanceLog>) -> io::Result<Self> {
        let mut builder = Command::new(&command.program);
        builder
            .args(&command.args)
            .envs(&command.env)
            .envs(command.secret_env.iter().map(|(name, key)| (name, key.expose())))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true);
        #[cfg(target_os = "linux")]
        // SAFETY: the closure runs in the child between fork and exec; it only makes the
        // prctl(PR_SET_PDEATHSIG) system call, which is async-signal-safe, and allocates
        // nothing. The signal follows the thread that spawned the child: tokio spawns
        // from its worker threads, which live as long as the agent's runtime.
        unsafe {
            builder.pre_exec(|| {
                rustix::process::set_parent_process_death_signal(Some(Signal::KILL)).map_err(io::Error::from)
            });
        }
        let mut child = builder.spawn()?;
        let pid = child.id();
        let group = pid.and_then(|p| i32::try_from(p).ok()).and_then(Pid::from_raw);
        let mut capture = JoinSet::new();
        if let Some(out) = child.stdout.take() {
            let log = Arc::clone(log);
            capture.spawn(async move { log.capture(out).await });
        }
        if let Some(err) = child.stderr.take() {
            let log = Arc::clone(log);
            capture.spawn(async move { log.capture(err).await });
        }
        Ok(Self {
            child,
            pid,
            group,
            capture,
            exited: None,
        })
    }

    /// The process id (`None` once reaped).
    pub(crate) fn pid(&self) -> Option<u32> {
        self.pid
    }

    /// Waits for the process to exit, then for its output to be captured.
    pub(crate) async fn wait(&mut self) -> io::Result<ExitStatus> {
        if let Some(status) = self.exited {
            return Ok(status);
        }
        let status = self.child.wait().await?;
        self.exited = Some(status);
        self.drain().await;
        Ok(status)
    }

    async fn drain(&mut self) {
        let all_done = async { while self.capture.join_next().await.is_some() {} };
        if tokio::time::timeout(DRAIN_TIMEOUT, all_done).await.is_err() {
            self.capture.abort_all();
        }
    }

    /// Stops the engine: SIGTERM to the engine itself, up to `grace` for it to exit, then
    /// SIGKILL to its process group (which also takes workers that outlived it). Only the
    /// leader gets SIGTERM: an engine that supervises processes stops them in its own
    /// order (`ray start --block` stops its raylet, then the GCS, in about 2 s; with
    /// SIGTERM to the whole group at once its shutdown waits on a GCS that is already
    /// going, and the head outlives any grace).
    pub(crate) async fn terminate(&mut self, grace: Duration) {
        if self.exited.is_none() {
            self.signal_leader(Signal::TERM);
            if tokio::time::timeout(grace, self.child.wait()).await.is_err() {
                self.signal(Signal::KILL);
            }
        }
        self.signal(Signal::KILL);
        // After SIGKILL the wait is short; an error means it was already reaped.
        let _ = self.wait().await;
    }

    /// Sends `signal` to the engine's own process (without a pid, kills it).
    fn signal_leader(&mut self, signal: Signal) {
        match self.pid.and_then(|pid| Pid::from_raw(pid as i32)) {
            // An error means it is gone: nothing left to signal.
            Some(pid) => {
                let _ = rustix::process::kill_process(pid, signal);
            }
            None => {
                let _ = self.child.start_kill();
            }
        }
    }

    /// Sends `signal` to the process group (or, without one, kills the process).
    fn signal(&mut self, signal: Signal) {
        match self.group {
            // An error means the group is gone: nothing left to signal.
            Some(group) => {
                let _ = kill_process_group(group, signal);
            }
            None => {
                let _ = self.child.start_kill();
            }
        }
    }

    /// The process group, for a last-resort kill when the supervisor is dropped.
    pub(crate) fn group(&self) -> Option<Pid> {
        self.group
    }
}

/// SIGKILL to a process group; for cleanup where nothing can be awaited (drop).
pub(crate) fn kill_group(group: Pid) {
    // An error means the group is already gone.
    let _ = kill_process_group(group, Signal::KILL);
}

/// The engine `root` and every process below it, and their resident memory together
/// (`None` when `root` is not in the process table). Blocks: reads `/proc`.
pub(crate) fn process_tree(root: u32) -> (Vec<u32>, Option<u64>) {
    let Ok(mut system) = System::new() else {
        return (vec![root], None);
    };
    system.refresh_processes_specifics(
        ProcessesToUpdate::All,
        true,
        ProcessRefreshKind::nothing().with_memory(),
    );
    let mut children: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
    let mut memory: BTreeMap<u32, u64> = BTreeMap::new();
    for (pid, process) in system.processes() {
        // Threads are listed on Linux too; their memory is their process's.
        if process.thread_kind().is_some() {
            continue;
        }
        memory.insert(pid.as_u32(), process.memory());
        if let Some(parent) = process.parent() {
            children.entry(parent.as_u32()).or_default().push(pid.as_u32());
        }
    }
    if !memory.contains_key(&root) {
        return (vec![root], None);
    }
    let mut tree = BTreeSet::new();
    let mut todo = vec![root];
    while let Some(pid) = todo.pop() {
        if tree.insert(pid) {
            todo.extend(children.get(&pid).into_iter().flatten().copied());
        }
    }
    let rss = tree.iter().filter_map(|pid| memory.get(pid)).sum();
    (tree.into_iter().collect(), Some(rss))
}

/// The lowest port [`free_port`] hands out: above the fixed ports engines default to
/// (Ray's workers take 10002–19999).
const ENGINE_PORTS_START: u16 = 20_000;

/// A TCP port free on `host` right now, for an engine to listen on.
///
/// It comes from below the system's ephemeral range (`ip_local_port_range`, where
/// `bind(0)` and outgoing connections take ports) when there is room there: engines
/// start processes that bind random ports of their own while they start (a Ray node
/// takes half a dozen, a second or more before its raylet binds the port it was given),
/// and a port of the ephemeral range, free when it was chosen, is often taken by then.
/// Without room, the system picks one (`bind(0)`). Either way another process may take
/// it before the engine binds it, so a start on it can still fail (and is restarted).
pub fn free_port(host: &str) -> io::Result<u16> {
    let ephemeral_low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32_768);
    if let Some(span) = ephemeral_low
        .checked_sub(ENGINE_PORTS_START)
        .filter(|span| *span >= 1_000)
    {
        // Start at a different place each time, so that agents sharing a machine do not
        // probe the same ports in the same order.
        let seed = {
            use std::hash::{BuildHasher, Hasher};
            // Randomly keyed per process.
            std::collections::hash_map::RandomState::new().build_hasher().finish()
        };
        let offset = (seed % u64::from(span)) as u16;
        for i in 0..span {
            let port = ENGINE_PORTS_START + (offset + i) % span;
            if std::net::TcpListener::bind((host, port)).is_ok() {
                return Ok(port);
            }
        }
    }
    let listener = std::net::TcpListener::bind((host, 0))?;
    Ok(listener.local_addr()?.port())
}

/// `status 3` or `signal 9`: how a process ended, for reasons.
pub(crate) fn describe_exit(status: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("status {code}"),
        (None, Some(signal)) => format!("signal {signal}"),
        (None, None) => status.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn engine_ports_come_from_below_the_ephemeral_range() {
        let low: u16 = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
            .expect("Linux names its ephemeral range")
            .split_whitespace()
            .next()
            .and_then(|p| p.parse().ok())
            .expect("a port");
        let ports: Vec<u16> = (0..20).map(|_| free_port("127.0.0.1").expect("a port")).collect();
        for &port in &ports {
            std::net::TcpListener::bind(("127.0.0.1", port)).expect("the port is free");
            if low >= ENGINE_PORTS_START + 1_000 {
                assert!(
                    (ENGINE_PORTS_START..low).contains(&port),
                    "{port} of {ports:?}; ephemeral from {low}"
                );
            }
        }
    }
}
