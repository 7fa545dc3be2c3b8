//! What Skein keeps on disk is its user's alone, and `skein up` is one machine: the data
//! directory is 0700 (an existing open one is tightened, with a log line), every file in
//! it 0600 (tokens, the database, keys, logs), and `skein up` listens on loopback only
//! unless told otherwise.

use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// Longest wait for a process's banner.
const PATIENCE: Duration = Duration::from_secs(120);

/// Kills the child when the test ends, however it ends.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `skein ARGS` and waits for a line of its stderr starting with `banner`;
/// returns the process and every line up to the banner.
fn start(args: &[&str], data: &Path, banner: &str) -> (Killed, Vec<String>) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_skein"))
        .env("RUST_LOG", "info")
        .env("NO_COLOR", "1")
        .env_remove("SKEIN_AGENT_LISTEN")
        .env_remove("SKEIN_LISTEN")
        .args(args)
        .arg("--data-dir")
        .arg(data)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let child = Killed(child);
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let mut lines = Vec::new();
    loop {
        let line = rx
            .recv_timeout(PATIENCE)
            .unwrap_or_else(|_| panic!("no `{banner}` line: {lines:#?}"));
        let done = line.starts_with(banner);
        lines.push(line);
        if done {
            return (child, lines);
        }
    }
}

fn mode(path: &Path) -> u32 {
    std::fs::symlink_metadata(path).unwrap().permissions().mode() & 0o7777
}

/// Every entry under `dir` (itself included) whose mode lets anyone but its owner in:
/// `path mode`.
fn open_entries(dir: &Path) -> Vec<String> {
    let mut open = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(path) = stack.pop() {
        let meta = std::fs::symlink_metadata(&path).unwrap();
        if meta.file_type().is_symlink() {
            continue;
        }
        let wanted = if meta.is_dir() { 0o700 } else { 0o600 };
        if meta.is_dir() {
            stack.extend(std::fs::read_dir(&path).unwrap().map(|e| e.unwrap().path()));
        }
        if mode(&path) & 0o077 != 0 {
            open.push(format!("{} {:o} (want {wanted:o})", path.display(), mode(&path)));
        }
    }
    open.sort();
    open
}

#[test]
fn the_server_keeps_its_data_directory_private_and_tightens_an_open_one() {
    let root = tempfile::tempdir().unwrap();
    // What an older version left: an open data directory, an open token file.
    let data = root.path().join("data");
    std::fs::create_dir(&data).unwrap();
    std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::write(data.join("api-token"), format!("{}\n", "ab".repeat(32))).unwrap();
    std::fs::set_permissions(data.join("api-token"), std::fs::Permissions::from_mode(0o644)).unwrap();

    let (mut server, lines) = start(
        &["server", "--listen", "127.0.0.1:0", "--agent-listen", "127.0.0.1:0"],
        &data,
        "skein server: REST API on ",
    );
    assert_eq!(mode(&data), 0o700);
    assert!(
        lines
            .iter()
            .any(|l| l.contains("tightened") && l.contains(&*data.to_string_lossy())),
        "no log line says the data directory was tightened: {lines:#?}"
    );
    assert!(data.join("join-token").exists() && data.join("db").is_dir());
    assert_eq!(open_entries(&data), Vec::<String>::new());

    // After a stop, a fresh data directory: made private from the start.
    server.0.kill().unwrap();
    server.0.wait().unwrap();
    let fresh = root.path().join("fresh/skein");
    let (_server, _) = start(
        &["server", "--listen", "127.0.0.1:0", "--agent-listen", "127.0.0.1:0"],
        &fresh,
        "skein server: REST API on ",
    );
    assert_eq!(mode(&fresh), 0o700);
    assert_eq!(open_entries(&fresh), Vec::<String>::new());
}

/// The TCP sockets listening on `port` (IPv4 and IPv6) from `/proc/net/tcp*`, as their
/// local addresses in the kernel's hex.
fn listeners(port: u16) -> Vec<String> {
    let mut found = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let text = std::fs::read_to_string(table).unwrap_or_default();
        for line in text.lines().skip(1) {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (Some(local), Some(state)) = (fields.get(1), fields.get(3)) else {
                continue;
            };
            let Some((address, hex_port)) = local.split_once(':') else {
                continue;
            };
            if *state == "0A" && u16::from_str_radix(hex_port, 16) == Ok(port) {
                found.push(address.to_owned());
            }
        }
    }
    found
}

/// 127.0.0.1 or ::1 as `/proc/net/tcp*` writes them.
fn is_loopback_hex(address: &str) -> bool {
    address == "0100007F" || address == "00000000000000000000000001000000"
}

#[test]
fn skein_up_listens_on_loopback_only_and_keeps_its_files_private() {
    let root = tempfile::tempdir().unwrap();
    let data = root.path().join("data");
    // The agent port is left to its default, as the README's `skein up` does.
    let (_up, lines) = start(&["up", "--listen", "127.0.0.1:0"], &data, "skein is up");
    let banner = lines.last().unwrap();
    assert!(banner.contains("more agents join at http://127.0.0.1:7879"), "{banner}");
    let bound = listeners(7879);
    assert!(!bound.is_empty(), "nothing listens on 7879");
    assert!(
        bound.iter().all(|a| is_loopback_hex(a)),
        "the agent port listens beyond loopback: {bound:?}"
    );
    assert_eq!(mode(&data), 0o700);
    assert_eq!(open_entries(&data), Vec::<String>::new());
}
