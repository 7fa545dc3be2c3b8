//! The server's doors under hostile clients, against the real `skein server`: floods of
//! idle connections, connections that never finish a request, declared bodies too large
//! to read, oversized request lines and headers, and TLS with pinned certificates.
//!
//! `SKEIN_TEST_BIN=/path/to/skein` runs them against another build (an older release,
//! to see that they fail there).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::Value;

/// The `skein` under test: this build's, or `$SKEIN_TEST_BIN`.
fn bin() -> std::path::PathBuf {
    std::env::var_os("SKEIN_TEST_BIN").map_or_else(|| env!("CARGO_BIN_EXE_skein").into(), Into::into)
}

/// Longest wait for anything to happen.
const PATIENCE: Duration = Duration::from_secs(60);

/// A `skein server` on ephemeral loopback ports, killed when dropped.
struct Server {
    child: Child,
    /// `http://127.0.0.1:PORT` or `https://…`.
    api: String,
    /// `IP:PORT` of the REST door.
    api_addr: String,
    /// `IP:PORT` of the agent door.
    grpc_addr: String,
    /// The fingerprint line's certificate, when a door speaks TLS.
    fingerprint: Option<String>,
    lines: mpsc::Receiver<String>,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Server {
    /// `skein server` with `extra` flags, its data in `data`; with `open_files`, under
    /// that soft limit of open files (as a shell's `ulimit -S -n` sets it; 1024 is the
    /// common default).
    fn start(data: &Path, extra: &[&str], open_files: Option<u32>) -> Server {
        let mut command = match open_files {
            Some(limit) => {
                let mut command = Command::new("sh");
                command
                    .arg("-c")
                    .arg(format!("ulimit -S -n {limit} && exec \"$0\" \"$@\""))
                    .arg(bin());
                command
            }
            None => Command::new(bin()),
        };
        let mut child = command
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .args([
                "server",
                "--listen",
                "127.0.0.1:0",
                "--agent-listen",
                "127.0.0.1:0",
                "--data-dir",
            ])
            .arg(data)
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let (tx, lines) = mpsc::channel();
        let stderr = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let mut fingerprint = None;
        let banner = loop {
            let line = lines.recv_timeout(PATIENCE).expect("the server prints its addresses");
            if let Some(rest) = line.strip_prefix("skein server: made a self-signed TLS certificate, ") {
                fingerprint = rest.split(',').next().map(str::to_owned);
            }
            if line.starts_with("skein server: REST API on ") {
                break line;
            }
        };
        let field = |after: &str| {
            let start = banner.find(after).unwrap() + after.len();
            banner[start..].split([',', ' ']).next().unwrap().to_owned()
        };
        let api = field("REST API on ");
        let grpc = field("agents join at ");
        let addr = |url: &str| url.split_once("://").unwrap().1.to_owned();
        if api.starts_with("https://") {
            let line = lines.recv_timeout(PATIENCE).expect("the server prints its certificate");
            let rest = line
                .strip_prefix("skein server: TLS certificate ")
                .unwrap_or_else(|| panic!("no fingerprint line: {line}"));
            fingerprint = rest.split([';', ' ']).next().map(str::to_owned);
        }
        Server {
            api_addr: addr(&api),
            grpc_addr: addr(&grpc),
            api,
            child,
            fingerprint,
            lines,
        }
    }

    /// Whether the server logged a line containing `text` (waiting up to PATIENCE).
    fn logged(&self, text: &str) -> bool {
        let start = Instant::now();
        while start.elapsed() < PATIENCE {
            match self.lines.recv_timeout(Duration::from_millis(200)) {
                Ok(line) if line.contains(text) => return true,
                _ => {}
            }
        }
        false
    }
}

fn token(data: &Path) -> String {
    std::fs::read_to_string(data.join("api-token"))
        .unwrap()
        .trim()
        .to_owned()
}

/// Sends `request` as it is on a new connection to `addr` and reads the answer until
/// the server closes or PATIENCE passes: the status and the body as JSON (Null if not).
fn raw(addr: &str, request: &[u8]) -> Result<(u16, Value), String> {
    let mut stream = TcpStream::connect(addr).map_err(|e| e.to_string())?;
    stream.set_read_timeout(Some(PATIENCE)).unwrap();
    stream.write_all(request).map_err(|e| e.to_string())?;
    let mut answer = Vec::new();
    // The head and whatever body follows; a body is read up to its Content-Length.
    let mut buffer = [0u8; 8192];
    loop {
        match stream.read(&mut buffer) {
            Ok(0) => break,
            Ok(n) => answer.extend_from_slice(&buffer[..n]),
            Err(e) if answer.is_empty() => return Err(format!("no answer: {e}")),
            Err(_) => break,
        }
        let text = String::from_utf8_lossy(&answer);
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let length = head
                .lines()
                .find_map(|l| {
                    l.to_ascii_lowercase()
                        .strip_prefix("content-length:")
                        .map(|v| v.trim().to_owned())
                })
                .and_then(|v| v.parse::<usize>().ok());
            if length.is_some_and(|n| body.len() >= n) {
                break;
            }
        }
    }
    let text = String::from_utf8_lossy(&answer).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").ok_or(format!("not HTTP: {text:?}"))?;
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or(format!("no status: {head}"))?;
    Ok((status, serde_json::from_str(body).unwrap_or(Value::Null)))
}

/// Waits until the server closes `stream` (end of file or a reset); false if it is
/// still open after PATIENCE.
fn closed_by_server(stream: &mut TcpStream) -> bool {
    stream.set_read_timeout(Some(PATIENCE)).unwrap();
    let mut buffer = [0u8; 1024];
    loop {
        match stream.read(&mut buffer) {
            Ok(0) => return true,
            // An answer (hyper's 408 to a half-sent request): keep reading to the close.
            Ok(_) => {}
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                return false;
            }
            Err(_) => return true,
        }
    }
}

/// Raises this test process's soft limit of open files to its hard limit, and returns
/// it: the flood tests hold thousands of connections.
fn raise_own_limit() -> u64 {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let limit = getrlimit(Resource::Nofile);
    let _ = setrlimit(
        Resource::Nofile,
        Rlimit {
            current: limit.maximum,
            maximum: limit.maximum,
        },
    );
    getrlimit(Resource::Nofile).current.unwrap_or(u64::MAX)
}

fn authenticated_get(addr: &str, path: &str, authorization: &str) -> Result<(u16, Value), String> {
    raw(
        addr,
        format!("GET {path} HTTP/1.1\r\nHost: skein\r\nAuthorization: {authorization}\r\nConnection: close\r\n\r\n")
            .as_bytes(),
    )
}

/// 1,100 idle connections to each door (what took the REST API down when the server
/// ran under the common soft limit of 1,024 open files) and an authenticated request
/// still gets its answer.
#[test]
fn a_flood_of_idle_connections_does_not_silence_the_api() {
    const FLOOD: usize = 1_100;
    let own = raise_own_limit();
    assert!(
        own > (2 * FLOOD + 200) as u64,
        "this test holds {} connections; the hard limit of open files here is {own}",
        2 * FLOOD
    );
    let data = tempfile::tempdir().unwrap();
    let server = Server::start(data.path(), &[], Some(1024));
    let token = token(data.path());
    assert_eq!(
        authenticated_get(&server.api_addr, "/v1/nodes", &format!("Bearer {token}"))
            .unwrap()
            .0,
        200
    );
    let mut held = Vec::with_capacity(2 * FLOOD);
    for addr in [&server.grpc_addr, &server.api_addr] {
        for _ in 0..FLOOD {
            // A server that stopped accepting lets its backlog fill: then connecting
            // fails, and the request below says what that means.
            match TcpStream::connect_timeout(&addr.parse().unwrap(), Duration::from_secs(5)) {
                Ok(stream) => held.push(stream),
                Err(_) => break,
            }
        }
    }
    let start = Instant::now();
    let answer = loop {
        match authenticated_get(&server.api_addr, "/v1/nodes", &format!("Bearer {token}")) {
            Ok(answer) => break answer,
            Err(error) => assert!(
                start.elapsed() < PATIENCE,
                "the REST API did not answer with {} idle connections held: {error}",
                held.len()
            ),
        }
    };
    assert_eq!(answer.0, 200, "{:#}", answer.1);
    drop(held);
}

/// Beyond its cap a door closes new connections at once, and says so once.
#[test]
fn a_door_past_its_cap_closes_new_connections() {
    let data = tempfile::tempdir().unwrap();
    // A header timeout far beyond PATIENCE: any close seen here is the cap's.
    let server = Server::start(
        data.path(),
        &[
            "--max-connections",
            "20",
            "--header-timeout",
            "1h",
            "--idle-timeout",
            "2h",
        ],
        None,
    );
    let mut streams: Vec<TcpStream> = (0..60).map(|_| TcpStream::connect(&server.api_addr).unwrap()).collect();
    // The first 20 hold their places; every later one is closed by the server.
    let closed = streams.iter_mut().skip(20).map(closed_by_server).filter(|c| *c).count();
    assert_eq!(closed, 40);
    assert!(server.logged("connection cap reached"));
    // The agent door has its own cap.
    let mut agents: Vec<TcpStream> = (0..21)
        .map(|_| TcpStream::connect(&server.grpc_addr).unwrap())
        .collect();
    assert!(closed_by_server(&mut agents[20]));
}

/// A connection that never speaks, one whose request's headers never end, and one idle
/// after its answer are all closed by the server.
#[test]
fn silent_half_sent_and_idle_connections_are_closed() {
    let data = tempfile::tempdir().unwrap();
    let server = Server::start(data.path(), &["--header-timeout", "1s", "--idle-timeout", "2s"], None);
    // A stream of events is a request in flight, however long: opened first, it must
    // outlive the idle connection below.
    let mut events = TcpStream::connect(&server.api_addr).unwrap();
    events
        .write_all(
            format!(
                "GET /v1/graph/events HTTP/1.1\r\nHost: skein\r\nAuthorization: Bearer {}\r\n\r\n",
                token(data.path())
            )
            .as_bytes(),
        )
        .unwrap();
    let mut head = [0u8; 12];
    events.read_exact(&mut head).unwrap();
    assert_eq!(&head, b"HTTP/1.1 200");

    let mut silent = TcpStream::connect(&server.api_addr).unwrap();
    let mut silent_agent = TcpStream::connect(&server.grpc_addr).unwrap();
    let mut half = TcpStream::connect(&server.api_addr).unwrap();
    half.write_all(b"GET /healthz HTTP/1.1\r\nHost: skein\r\nX-Slow: ")
        .unwrap();
    let mut idle = TcpStream::connect(&server.api_addr).unwrap();
    idle.write_all(b"GET /healthz HTTP/1.1\r\nHost: skein\r\n\r\n").unwrap();
    idle.read_exact(&mut head).unwrap();
    assert_eq!(&head, b"HTTP/1.1 200");

    assert!(closed_by_server(&mut silent), "a silent REST connection stayed open");
    assert!(
        closed_by_server(&mut silent_agent),
        "a silent agent connection stayed open"
    );
    assert!(
        closed_by_server(&mut half),
        "a request whose headers never ended stayed open"
    );
    assert!(closed_by_server(&mut idle), "an idle keep-alive connection stayed open");

    // Past the idle timeout of a connection opened after it, the stream is still open.
    events.set_read_timeout(Some(Duration::from_millis(500))).unwrap();
    let mut buffer = [0u8; 4096];
    loop {
        match events.read(&mut buffer) {
            Ok(0) => panic!("the idle timeout cut a stream of events"),
            Ok(_) => {}
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => break,
            Err(e) => panic!("the stream of events broke: {e}"),
        }
    }
}

/// A declared body larger than the server reads is refused before any of it is sent;
/// oversized targets and headers get 414 and 431; all in the API's error shape. The
/// `Bearer` scheme is matched whatever its case.
#[test]
fn oversized_requests_are_refused_early_in_the_error_shape() {
    let data = tempfile::tempdir().unwrap();
    let server = Server::start(data.path(), &[], None);
    let token = token(data.path());

    let (status, body) = raw(
        &server.api_addr,
        format!(
            "POST /v1/plans HTTP/1.1\r\nHost: skein\r\nAuthorization: Bearer {token}\r\nContent-Type: application/json\r\nContent-Length: 99999999999999\r\n\r\n"
        )
        .as_bytes(),
    )
    .unwrap();
    assert_eq!(status, 413, "{body:#}");
    assert_eq!(body["error"]["code"], "too_large", "{body:#}");
    assert!(
        body["error"]["message"].as_str().unwrap().contains("99999999999999"),
        "{body:#}"
    );

    let long = format!("/v1/nodes?x={}", "a".repeat(9 << 10));
    let (status, body) = authenticated_get(&server.api_addr, &long, &format!("Bearer {token}")).unwrap();
    assert_eq!(status, 414, "{body:#}");
    assert_eq!(body["error"]["code"], "uri_too_long", "{body:#}");

    let many: String = (0..150).map(|i| format!("X-Header-{i}: v\r\n")).collect();
    let (status, body) = raw(
        &server.api_addr,
        format!("GET /healthz HTTP/1.1\r\nHost: skein\r\n{many}Connection: close\r\n\r\n").as_bytes(),
    )
    .unwrap();
    assert_eq!(status, 431, "{body:#}");
    assert_eq!(body["error"]["code"], "headers_too_large", "{body:#}");

    for scheme in ["bearer", "BEARER", "Bearer "] {
        let (status, body) = authenticated_get(&server.api_addr, "/v1/nodes", &format!("{scheme} {token}")).unwrap();
        assert_eq!(status, 200, "{scheme}: {body:#}");
    }
    let (status, _) = authenticated_get(&server.api_addr, "/v1/nodes", &format!("Basic {token}")).unwrap();
    assert_eq!(status, 401);
}

fn skein(args: &[&str]) -> Output {
    Command::new(bin())
        .env("NO_COLOR", "1")
        .env_remove("SKEIN_API_TOKEN")
        .env_remove("SKEIN_DATA_DIR")
        .env_remove("SKEIN_SERVER_FINGERPRINT")
        .args(args)
        .output()
        .unwrap()
}

/// `--tls on` without a certificate: one is made on first start (its key private),
/// printed and kept; the CLI trusts it on this machine by itself, elsewhere by its
/// pinned fingerprint; a wrong pin and plain HTTP are refused with what is wrong; an
/// agent joins over TLS by the pin.
#[test]
fn rest_and_agents_over_tls_with_a_pinned_certificate() {
    use std::os::unix::fs::PermissionsExt;
    let data = tempfile::tempdir().unwrap();
    let elsewhere = tempfile::tempdir().unwrap();
    let server = Server::start(data.path(), &["--tls", "on"], None);
    assert!(server.api.starts_with("https://127.0.0.1:"), "{}", server.api);
    let fingerprint = server.fingerprint.clone().expect("a fingerprint");
    assert!(
        fingerprint.starts_with("sha256:") && fingerprint.len() == 71,
        "{fingerprint}"
    );
    let key = data.path().join("tls/key.pem");
    assert_eq!(std::fs::metadata(&key).unwrap().permissions().mode() & 0o777, 0o600);
    let token = token(data.path());
    let data_dir = data.path().to_str().unwrap();

    // On the server's machine: the data directory's certificate is trusted.
    let out = skein(&["nodes", "--server", &server.api, "--data-dir", data_dir]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));

    // Elsewhere: by the pin.
    let pinned = |pin: &str| {
        skein(&[
            "nodes",
            "--server",
            &server.api,
            "--api-token",
            &token,
            "--data-dir",
            elsewhere.path().to_str().unwrap(),
            "--server-fingerprint",
            pin,
        ])
    };
    let out = pinned(&fingerprint);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let wrong = format!("sha256:{}", "ab".repeat(32));
    let out = pinned(&wrong);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains(&fingerprint) && stderr.contains("not the pinned"),
        "{stderr}"
    );

    // Plain HTTP to the TLS door.
    let plain = server.api.replace("https://", "http://");
    let out = skein(&["nodes", "--server", &plain, "--api-token", &token]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("speaks HTTPS only"), "{stderr}");

    // An agent with a wrong pin never joins, and says why.
    let fleet = Path::new(env!("CARGO_MANIFEST_DIR")).join("workflows/fleets/lab.yaml");
    let mut misled = Command::new(bin())
        .env("NO_COLOR", "1")
        .args([
            "agent",
            "--join",
            &format!("https://{}", server.grpc_addr),
            "--node",
            "old-1",
        ])
        .args(["--server-fingerprint", &wrong, "--simulate"])
        .arg(&fleet)
        .arg("--token-file")
        .arg(data.path().join("join-token"))
        .arg("--data-dir")
        .arg(elsewhere.path())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (tx, said) = mpsc::channel();
    let stderr = misled.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if line.contains("not the pinned") {
                let _ = tx.send(line);
                return;
            }
        }
    });
    let said = said.recv_timeout(PATIENCE).ok();
    let _ = misled.kill();
    let _ = misled.wait();
    assert!(
        said.is_some_and(|line| line.contains(&fingerprint)),
        "the agent with a wrong pin did not say why"
    );

    // An agent joins over TLS by the pin.
    let join = format!("https://{}", server.grpc_addr);
    let mut agent = Command::new(bin())
        .args([
            "agent",
            "--join",
            &join,
            "--node",
            "old-1",
            "--server-fingerprint",
            &fingerprint,
        ])
        .arg("--simulate")
        .arg(&fleet)
        .arg("--token-file")
        .arg(data.path().join("join-token"))
        .arg("--data-dir")
        .arg(elsewhere.path())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let start = Instant::now();
    loop {
        let out = skein(&[
            "nodes",
            "--server",
            &server.api,
            "--data-dir",
            data_dir,
            "--output",
            "json",
        ]);
        let graph: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        if graph["nodes"].as_array().is_some_and(|nodes| !nodes.is_empty()) {
            break;
        }
        assert!(start.elapsed() < PATIENCE, "the pinned agent never joined");
        std::thread::sleep(Duration::from_millis(200));
    }
    let _ = agent.kill();
    let _ = agent.wait();

    // The certificate is kept across restarts: pins stay good.
    drop(server);
    let again = Server::start(data.path(), &["--tls", "on"], None);
    assert_eq!(again.fingerprint.as_deref(), Some(fingerprint.as_str()));
}

/// `skein up` with its agent door beyond loopback: that door speaks TLS with a
/// certificate made on first start, and the agents `skein up` runs itself join it by
/// its pin; the REST door on loopback stays plain HTTP for the CLI.
#[test]
fn skein_up_joins_its_own_agents_over_tls() {
    let data = tempfile::tempdir().unwrap();
    let fleet = Path::new(env!("CARGO_MANIFEST_DIR")).join("workflows/fleets/lab.yaml");
    let mut child = Command::new(bin())
        .env("NO_COLOR", "1")
        .env("RUST_LOG", "info")
        .args([
            "up",
            "--listen",
            "127.0.0.1:0",
            "--agent-listen",
            "0.0.0.0:0",
            "--fleet",
        ])
        .arg(&fleet)
        .arg("--data-dir")
        .arg(data.path())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let _up = Killed(&mut child);
    let (tx, lines) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let banner = loop {
        let line = lines.recv_timeout(PATIENCE).expect("skein up prints its addresses");
        if line.starts_with("skein is up") {
            break line;
        }
    };
    let api = banner
        .split("REST API on ")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .unwrap()
        .to_owned();
    assert!(api.starts_with("http://127.0.0.1:"), "{banner}");
    assert!(banner.contains("more agents join at https://"), "{banner}");
    let start = Instant::now();
    loop {
        let out = skein(&[
            "nodes",
            "--server",
            &api,
            "--data-dir",
            data.path().to_str().unwrap(),
            "--output",
            "json",
        ]);
        let graph: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        let connected = graph["nodes"]
            .as_array()
            .map_or(0, |nodes| nodes.iter().filter(|n| n["connected"] == true).count());
        if connected == 4 {
            break;
        }
        assert!(
            start.elapsed() < PATIENCE,
            "the fleet's agents did not join over TLS: {graph:#}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Kills a child when dropped.
struct Killed<'a>(&'a mut Child);

impl Drop for Killed<'_> {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
