//! One chat request, or one user, cannot take the server's memory: the real `skein
//! server` refuses a turn of 300,000 one-byte messages (a 9.4 MiB body) with 413 before
//! building anything from it, on both chat routes, one at a time and three at once,
//! and its peak resident memory (VmHWM in /proc) grows by less than 128 MiB: the bodies
//! themselves (3 × 9.4 MiB, each held once, in buffers that grew to hold them) and the
//! allocator's arenas of the threads that read them (67 MiB seen once under load). Before the limits
//! the same turn grew it by 1.6 GiB and three at once by 3.6 GiB.
//!
//! A user past their chat requests in flight is answered 429 with Retry-After; the
//! requests held open here are slow uploads (headers sent, body not), which count from
//! before their body is read. A user past their streams open is answered 429 too; the
//! stream held open here waits on a hub that never answers.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use skein_testkit::net::free_port;

const MESSAGES: usize = 300_000;
/// The most the server's peak memory may grow while refusing the big turns.
const GROWTH_BOUND_KIB: u64 = 128 << 10;

struct Server {
    child: Child,
    base: String,
    port: u16,
    /// Its admin token, its own: a request that reaches another test's server on a
    /// reused port is refused rather than answered.
    token: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A server with `extra` arguments; its hub is offline unless `extra` has
/// `HF_ENDPOINT=URL` (given to it as that environment variable).
fn start(data: &Path, extra: &[&str]) -> Server {
    let hub = extra.iter().find_map(|a| a.strip_prefix("HF_ENDPOINT="));
    let extra: Vec<&str> = extra
        .iter()
        .copied()
        .filter(|a| !a.starts_with("HF_ENDPOINT="))
        .collect();
    let (port, grpc) = (free_port(), free_port());
    let token = format!("chat-limits-{port}-{grpc}");
    let child = Command::new(env!("CARGO_BIN_EXE_skein"))
        .args(["server", "--listen", &format!("127.0.0.1:{port}")])
        .args(["--agent-listen", &format!("127.0.0.1:{grpc}")])
        .args(["--api-token", &token, "--data-dir"])
        .arg(data)
        .args(&extra)
        .env("HF_HUB_OFFLINE", if hub.is_some() { "0" } else { "1" })
        .env("HF_ENDPOINT", hub.unwrap_or("http://127.0.0.1:9"))
        .env("HF_HOME", data.join("hf"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    Server {
        child,
        base: format!("http://127.0.0.1:{port}"),
        port,
        token,
    }
}

/// A field of /proc/<pid>/status, in KiB.
fn status_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status
        .lines()
        .find(|l| l.starts_with(field))
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"));
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// A server and a session on a model (placed only at its first answered turn, so no
/// fleet is needed to store messages). A server whose port was taken meanwhile (it
/// exits, or another answers there and refuses its token) is started again elsewhere.
async fn serve(http: &reqwest::Client, data: &Path, extra: &[&str]) -> (Server, String) {
    for _ in 0..5 {
        let mut server = start(data, extra);
        if let Some(id) = session(http, &mut server).await {
            return (server, id);
        }
    }
    panic!("no server started in 5 tries");
}

async fn session(http: &reqwest::Client, server: &mut Server) -> Option<String> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if server.child.try_wait().unwrap().is_some() {
            return None;
        }
        let created = http
            .post(format!("{}/v1/sessions", server.base))
            .bearer_auth(&server.token)
            .json(&json!({"model": "Qwen/Qwen2.5-0.5B-Instruct"}))
            .send()
            .await;
        match created {
            Ok(response) if response.status() == 201 => {
                let body: Value = response.json().await.unwrap();
                return Some(body["id"].as_str().unwrap().to_owned());
            }
            Ok(response) if response.status() == 401 => return None,
            _ if Instant::now() < deadline => tokio::time::sleep(Duration::from_millis(100)).await,
            other => panic!("the server did not start: {other:?}"),
        }
    }
}

/// `messages` of one byte each, as a JSON list.
fn tiny_messages(count: usize) -> String {
    let mut list = String::with_capacity(count * 34);
    list.push('[');
    for i in 0..count {
        if i > 0 {
            list.push(',');
        }
        list.push_str(r#"{"role": "user", "content": "a"}"#);
    }
    list.push(']');
    list
}

async fn post(http: &reqwest::Client, token: &str, url: String, body: &'static str) -> (u16, Option<String>, Value) {
    let response = http
        .post(url)
        .bearer_auth(token)
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    let retry_after = response
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().to_owned());
    let body = response.json().await.unwrap_or(Value::Null);
    (status, retry_after, body)
}

fn assert_too_large(answer: &(u16, Option<String>, Value)) {
    let (status, _, body) = answer;
    assert_eq!(*status, 413, "{body}");
    assert_eq!(body["error"]["code"], "too_large", "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains(&format!("{MESSAGES} messages")) && message.contains("at most 2048"),
        "the message says the size and the limit: {message}"
    );
    assert!(message.contains("help:"), "the message says how to fix it: {message}");
}

#[test]
fn a_turn_of_300_000_messages_is_refused_with_413_and_the_server_does_not_grow() {
    let data = tempfile::tempdir().unwrap();
    let runtime = runtime();
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(120))
        .build()
        .unwrap();
    let messages = tiny_messages(MESSAGES);
    let turn: &'static str = format!(r#"{{"messages": {messages}, "reply": false}}"#).leak();
    let chat: &'static str = format!(r#"{{"model": "Qwen/Qwen2.5-0.5B-Instruct", "messages": {messages}}}"#).leak();
    assert!(turn.len() > 9 << 20, "a body of more than 9 MiB: {}", turn.len());

    runtime.block_on(async {
        let (server, id) = serve(&http, data.path(), &[]).await;
        let pid = server.child.id();
        let turns = format!("{}/v1/sessions/{id}/messages", server.base);
        let completions = format!("{}/v1/chat/completions", server.base);
        let before = status_kib(pid, "VmHWM:");

        assert_too_large(&post(&http, &server.token, turns.clone(), turn).await);
        assert_too_large(&post(&http, &server.token, completions.clone(), chat).await);
        // Three at once, on each route.
        for (url, body) in [(&turns, turn), (&completions, chat)] {
            let answers = tokio::join!(
                post(&http, &server.token, url.clone(), body),
                post(&http, &server.token, url.clone(), body),
                post(&http, &server.token, url.clone(), body)
            );
            for answer in [answers.0, answers.1, answers.2] {
                assert_too_large(&answer);
            }
        }

        let grown = status_kib(pid, "VmHWM:").saturating_sub(before);
        eprintln!("refusing 8 turns of {MESSAGES} messages grew the server's peak memory by {grown} KiB");
        assert!(
            grown < GROWTH_BOUND_KIB,
            "the server's peak memory grew by {} MiB refusing the turns (bound {} MiB)",
            grown >> 10,
            GROWTH_BOUND_KIB >> 10
        );
        // Nothing was stored, and a turn within the limits still is.
        let (status, _, body) = post(
            &http,
            &server.token,
            turns.clone(),
            r#"{"content": "hello", "reply": false}"#,
        )
        .await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["session"]["messages"], 1, "{body}");
    });
}

/// A request whose headers are sent and whose body is not (yet): it counts as in
/// flight from the moment the server reads its headers.
fn slow_upload(server: &Server, session: &str) -> TcpStream {
    let mut stream = TcpStream::connect(("127.0.0.1", server.port)).unwrap();
    write!(
        stream,
        "POST /v1/sessions/{session}/messages HTTP/1.1\r\nhost: 127.0.0.1\r\nauthorization: Bearer {}\r\n\
         content-type: application/json\r\ncontent-length: 1000\r\n\r\n{{\"content\": ",
        server.token
    )
    .unwrap();
    stream.flush().unwrap();
    stream.set_nonblocking(true).unwrap();
    stream
}

/// Whether the server answered (or closed) a slow request: its headers were read after
/// another request had taken the slot, so it was refused.
fn answered(stream: &mut TcpStream) -> bool {
    let mut buffer = [0u8; 512];
    match stream.read(&mut buffer) {
        Ok(_) => true,
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => false,
        Err(_) => true,
    }
}

#[test]
fn a_user_past_their_requests_in_flight_is_answered_429_with_retry_after() {
    let data = tempfile::tempdir().unwrap();
    let runtime = runtime();
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    runtime.block_on(async {
        let (server, id) = serve(&http, data.path(), &["--chat-requests-per-user", "2"]).await;
        let turns = format!("{}/v1/sessions/{id}/messages", server.base);
        let mut held = [slow_upload(&server, &id), slow_upload(&server, &id)];
        // The server reads the slow requests' headers in its own time, and may read one
        // after a probe below took its slot (it is then refused): such a one is sent
        // again, until a probe finds both slots held (a probe within the limits is
        // stored meanwhile).
        let deadline = Instant::now() + Duration::from_secs(30);
        let (status, retry_after, body) = loop {
            for slow in &mut held {
                if answered(slow) {
                    *slow = slow_upload(&server, &id);
                }
            }
            let answer = post(
                &http,
                &server.token,
                turns.clone(),
                r#"{"content": "hi", "reply": false}"#,
            )
            .await;
            if answer.0 != 200 || Instant::now() > deadline {
                break answer;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        assert_eq!(status, 429, "{body}");
        assert_eq!(body["error"]["code"], "overloaded", "{body}");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(
            message.contains("you have 2 chat requests in flight") && message.contains("at once is 2"),
            "the message names the use and the limit: {message}"
        );
        let seconds: u64 = retry_after.expect("a Retry-After header").parse().unwrap();
        assert!(seconds >= 1);
        // The OpenAI route counts against the same requests.
        let chat = r#"{"model": "Qwen/Qwen2.5-0.5B-Instruct", "messages": [{"role": "user", "content": "hi"}]}"#;
        let (status, _, body) = post(
            &http,
            &server.token,
            format!("{}/v1/chat/completions", server.base),
            chat,
        )
        .await;
        assert_eq!(status, 429, "{body}");

        // A client that goes away gives its request back.
        drop(held);
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let (status, _, body) = post(
                &http,
                &server.token,
                turns.clone(),
                r#"{"content": "again", "reply": false}"#,
            )
            .await;
            if status == 200 {
                break;
            }
            assert_eq!(status, 429, "{body}");
            assert!(
                Instant::now() < deadline,
                "the requests of closed connections are still counted"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });
}

#[test]
fn a_user_past_their_streams_is_answered_429_with_retry_after() {
    // A hub that accepts and never answers: a completion for a model no instance serves
    // waits on it for the model's metadata, its stream open meanwhile.
    let hub = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let hub_url = format!("HF_ENDPOINT=http://{}", hub.local_addr().unwrap());
    std::thread::spawn(move || {
        let mut silent = Vec::new();
        for connection in hub.incoming() {
            silent.push(connection);
        }
    });
    let data = tempfile::tempdir().unwrap();
    let runtime = runtime();
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    runtime.block_on(async {
        let (server, _) = serve(&http, data.path(), &["--chat-streams-per-user", "1", &hub_url]).await;
        let completions = format!("{}/v1/chat/completions", server.base);
        let streamed = json!({"model": "Qwen/Qwen2.5-0.5B-Instruct", "stream": true,
            "messages": [{"role": "user", "content": "hi"}]});
        let open = || {
            http.post(&completions)
                .bearer_auth(&server.token)
                .json(&streamed)
                .send()
        };
        // Its answer has begun (200, events): the stream is open until it is dropped.
        let first = open().await.unwrap();
        assert_eq!(first.status(), 200);
        let second = open().await.unwrap();
        assert_eq!(second.status(), 429);
        let retry_after = second
            .headers()
            .get("retry-after")
            .map(|v| v.to_str().unwrap().to_owned());
        let body: Value = second.json().await.unwrap();
        assert_eq!(body["error"]["code"], "overloaded", "{body}");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(
            message.contains("you have 1 streams open") && message.contains("at once is 1"),
            "the message names the use and the limit: {message}"
        );
        assert!(retry_after.expect("a Retry-After header").parse::<u64>().unwrap() >= 1);
        // A client that goes away closes its stream.
        drop(first);
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let next = open().await.unwrap();
            if next.status() == 200 {
                break;
            }
            assert_eq!(next.status(), 429);
            assert!(
                Instant::now() < deadline,
                "the stream of a closed connection is still counted"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });
}
