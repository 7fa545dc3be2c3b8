//! Real MCP tool servers for tests: the testkit's Rust `mcp-tools` (rmcp, the official
//! Rust SDK; `src/bin/mcp-tools.rs`) and its Python twin `tests/tools/mcp_server.py`
//! (the official Python SDK, in the venv `tests/engines/mcp-python.sh` prepares). Both
//! serve the same tools: `count` (appends a line to the `--count-file` and answers the
//! number of lines, so tests count invocations), `add {a, b}`, `echo {text}`,
//! `sleep {ms}` (counted like `count` before it sleeps) and `fail {message}` (a tool
//! error result).
//!
//! Over stdio, a test (or the orchestrator) starts the program itself. Over streamable
//! HTTP, [`HttpToolServer`] starts one on loopback, waits for it to listen and stops it
//! when dropped.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

/// How long a tool server may take to listen (the Python one imports its SDK first).
const LISTEN_TIMEOUT: Duration = Duration::from_secs(60);

/// The path of a current `mcp-tools` binary, built once per test process (found as
/// [`crate::fake_engine_path`] finds the fake engine).
///
/// # Panics
///
/// When the binary can be neither built nor found.
pub fn mcp_tools_path() -> PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| crate::fake_engine::testkit_binary("mcp-tools"))
        .clone()
}

/// The python of the venv with the pinned MCP Python SDK (installed by
/// `tests/engines/mcp-python.sh` on first use: about 15 s).
pub fn mcp_python() -> PathBuf {
    crate::tools::prepared("mcp-python.sh")
}

/// The Python MCP tool server, `tests/tools/mcp_server.py`, to run with [`mcp_python`].
pub fn python_mcp_server_script() -> PathBuf {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/tools/mcp_server.py");
    assert!(path.exists(), "{} does not exist", path.display());
    path
}

/// A tool server serving streamable HTTP on loopback at `http://ADDR/mcp`, stopped when
/// dropped.
pub struct HttpToolServer {
    /// Where it listens.
    pub addr: SocketAddr,
    child: Child,
}

impl HttpToolServer {
    /// Starts `mcp-tools --http 127.0.0.1:0` counting into `count_file`, answering 401
    /// without `Authorization: Bearer TOKEN` when `bearer` is given.
    pub fn rust(count_file: &Path, bearer: Option<&str>) -> Self {
        let mut command = Command::new(mcp_tools_path());
        command
            .arg("--count-file")
            .arg(count_file)
            .args(["--http", "127.0.0.1:0"]);
        if let Some(token) = bearer {
            command.args(["--bearer", token]);
        }
        Self::start(command)
    }

    /// Starts `mcp_server.py --http 0` counting into `count_file`.
    pub fn python(count_file: &Path) -> Self {
        let mut command = Command::new(mcp_python());
        command
            .arg(python_mcp_server_script())
            .arg("--count-file")
            .arg(count_file)
            .args(["--http", "0"]);
        Self::start(command)
    }

    /// Starts `command` with an empty environment (as the orchestrator starts tool
    /// servers) and waits for its `listening on ADDR` line.
    ///
    /// # Panics
    ///
    /// When it cannot start, exits, or does not listen within a minute.
    pub fn start(mut command: Command) -> Self {
        command.env_clear().stdin(Stdio::null()).stdout(Stdio::piped());
        let mut child = command
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {command:?}: {e}"));
        let stdout = child.stdout.take().expect("stdout is piped");
        let (sender, receiver) = std::sync::mpsc::sync_channel(1);
        // A thread, not a timeout on the pipe: std has none. It ends when the pipe closes.
        std::thread::spawn(move || {
            let mut lines = BufReader::new(stdout).lines();
            let _ = sender.send(lines.next());
            // Keep reading so the server never blocks on a full pipe.
            lines.for_each(drop);
        });
        let line = match receiver.recv_timeout(LISTEN_TIMEOUT) {
            Ok(Some(Ok(line))) => line,
            other => {
                let _ = child.kill();
                let status = child.wait().ok();
                panic!("{command:?} did not say where it listens: {other:?}, exit {status:?}");
            }
        };
        let addr = line
            .strip_prefix("listening on ")
            .and_then(|addr| addr.trim().parse().ok())
            .unwrap_or_else(|| panic!("{command:?} printed `{line}`, not `listening on ADDR`"));
        Self { addr, child }
    }

    /// The MCP endpoint, `http://ADDR/mcp`.
    pub fn url(&self) -> String {
        format!("http://{}/mcp", self.addr)
    }
}

impl Drop for HttpToolServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
