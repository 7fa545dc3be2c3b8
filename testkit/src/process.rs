//! Running a program from a test with a bound on its whole duration: an install from a
//! package registry, a browser session or a fuzzer that stalls fails the test with what
//! it was doing and its output so far, instead of holding the suite until CI's limit.

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::process::{Command, ExitStatus, Output, Stdio};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Runs `command` to its end, its output captured, for at most `limit`; past it the
/// process and every process it started (its process group: a browser, a pip build) are
/// killed and this panics naming `what`, the limit and the output so far.
pub fn output_within(command: &mut Command, limit: Duration, what: &str) -> Output {
    let mut child = command
        .process_group(0)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{what}: cannot start {:?}: {e}", command.get_program()));
    let drain = |pipe: Option<Box<dyn Read + Send>>| -> JoinHandle<Vec<u8>> {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            if let Some(mut pipe) = pipe {
                let _ = pipe.read_to_end(&mut bytes);
            }
            bytes
        })
    };
    let stdout = drain(child.stdout.take().map(|p| Box::new(p) as Box<dyn Read + Send>));
    let stderr = drain(child.stderr.take().map(|p| Box::new(p) as Box<dyn Read + Send>));
    let deadline = Instant::now() + limit;
    let status: Option<ExitStatus> = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Some(status),
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(50)),
            Ok(None) | Err(_) => {
                let group = format!("-{}", child.id());
                let _ = Command::new("kill").args(["-KILL", "--", &group]).status();
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
        }
    };
    let stdout = stdout.join().unwrap_or_default();
    let stderr = stderr.join().unwrap_or_default();
    match status {
        Some(status) => Output { status, stdout, stderr },
        None => panic!(
            "{what}: still running after {} s, so it was stopped\n── stdout\n{}\n── stderr\n{}",
            limit.as_secs(),
            String::from_utf8_lossy(&stdout),
            String::from_utf8_lossy(&stderr)
        ),
    }
}

/// Kills a process group (a program started with `process_group(0)`, and everything it
/// started) if it is still running `limit` after [`Watchdog::arm`], for a program a test
/// talks to while it runs (so [`output_within`] does not fit). Disarmed when dropped.
pub struct Watchdog {
    done: std::sync::Arc<std::sync::atomic::AtomicBool>,
    fired: std::sync::Arc<std::sync::atomic::AtomicBool>,
    limit: Duration,
}

impl Watchdog {
    /// Watches the process group of the process `pid`.
    pub fn arm(pid: u32, limit: Duration) -> Watchdog {
        use std::sync::atomic::Ordering;
        let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let fired = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (watching, firing) = (done.clone(), fired.clone());
        std::thread::spawn(move || {
            let deadline = Instant::now() + limit;
            while Instant::now() < deadline {
                if watching.load(Ordering::SeqCst) {
                    return;
                }
                std::thread::sleep(Duration::from_millis(200));
            }
            if !watching.load(Ordering::SeqCst) {
                firing.store(true, Ordering::SeqCst);
                let _ = Command::new("kill").args(["-KILL", "--", &format!("-{pid}")]).status();
            }
        });
        Watchdog { done, fired, limit }
    }

    /// Panics, naming `what`, if the watchdog killed the program.
    pub fn check(&self, what: &str) {
        assert!(
            !self.fired.load(std::sync::atomic::Ordering::SeqCst),
            "{what}: still running after {} s, so it was stopped",
            self.limit.as_secs()
        );
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.done.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}
