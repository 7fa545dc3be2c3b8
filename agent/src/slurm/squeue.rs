//! The IO edge of [`crate::slurm`]: Slurm's commands run with a time limit, and a job's
//! time left from `squeue`.

use std::io::{Read, Write};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// How long `squeue` may take (a busy controller answers in well under a second).
const SQUEUE_TIMEOUT: Duration = Duration::from_secs(10);

/// Why a Slurm command gave no answer.
#[derive(Debug, thiserror::Error)]
pub enum CommandError {
    /// It is not installed here.
    #[error("`{0}` is not installed here (or not on PATH)")]
    Missing(String),
    /// It could not be started or fed.
    #[error("cannot run `{program}`")]
    Io {
        /// The command.
        program: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// It did not answer in time.
    #[error("`{program}` did not answer within {} s; is slurmctld reachable (`scontrol ping`)?", .timeout.as_secs())]
    Timeout {
        /// The command.
        program: String,
        /// How long it had.
        timeout: Duration,
    },
    /// It failed.
    #[error("`{program}` failed ({status}): {stderr}")]
    Failed {
        /// The command.
        program: String,
        /// Its exit status.
        status: std::process::ExitStatus,
        /// What it said.
        stderr: String,
    },
    /// It answered something else than a time.
    #[error(transparent)]
    Parse(#[from] super::SlurmError),
}

/// Runs `program` with `args`, `stdin` on its standard input, for at most `timeout`
/// (then it is killed); its output once it exits. A failing exit status is not an
/// error here: the caller reads what it said.
pub fn output(program: &str, args: &[&str], stdin: Option<&str>, timeout: Duration) -> Result<Output, CommandError> {
    let io = |source: std::io::Error| CommandError::Io {
        program: program.to_owned(),
        source,
    };
    let mut child = Command::new(program)
        .args(args)
        .stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|error| match error.kind() {
            std::io::ErrorKind::NotFound => CommandError::Missing(program.to_owned()),
            _ => io(error),
        })?;
    if let (Some(text), Some(mut pipe)) = (stdin, child.stdin.take()) {
        pipe.write_all(text.as_bytes()).map_err(io)?;
    }
    // The pipes are read on threads, so a chatty command cannot block on a full pipe
    // while it is waited for.
    fn drain(pipe: Option<impl Read + Send + 'static>) -> std::thread::JoinHandle<Vec<u8>> {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            if let Some(mut pipe) = pipe {
                let _ = pipe.read_to_end(&mut bytes);
            }
            bytes
        })
    }
    let stdout = drain(child.stdout.take());
    let stderr = drain(child.stderr.take());
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().map_err(io)? {
            break status;
        }
        if started.elapsed() > timeout {
            let _ = child.kill();
            let _ = child.wait();
            return Err(CommandError::Timeout {
                program: program.to_owned(),
                timeout,
            });
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Ok(Output {
        status,
        stdout: stdout.join().unwrap_or_default(),
        stderr: stderr.join().unwrap_or_default(),
    })
}

/// The seconds job `job_id` has left (`squeue -h -j ID -o %L`); `None` for a job
/// without a time limit. Blocks up to [`SQUEUE_TIMEOUT`].
pub fn time_left(job_id: &str) -> Result<Option<u64>, CommandError> {
    let answer = output("squeue", &["-h", "-j", job_id, "-o", "%L"], None, SQUEUE_TIMEOUT)?;
    if !answer.status.success() {
        return Err(CommandError::Failed {
            program: "squeue".to_owned(),
            status: answer.status,
            stderr: String::from_utf8_lossy(&answer.stderr).trim().to_owned(),
        });
    }
    let text = String::from_utf8_lossy(&answer.stdout);
    Ok(super::parse_time(text.lines().next().unwrap_or(""))?)
}
