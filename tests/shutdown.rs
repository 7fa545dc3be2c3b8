//! A graceful stop of the real `skein server`: SIGTERM while clients append to sessions
//! at full speed and an event stream is open. Every answer the clients got is whole
//! (a status and a complete JSON body), the event stream ends cleanly, the process
//! exits 0 within a generous bound (a hang fails the test; it is not a speed test), and
//! after a restart on the same data directory every acknowledged message is there.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use skein_testkit::sessions::{BareServer, create_session, message_heads};

const SESSIONS: usize = 8;
const API_TOKEN: &str = "shutdown-test-admin-token";
/// How long the stopping server may take before the test calls it a hang.
const EXIT_BOUND: Duration = Duration::from_secs(30);

fn start(data: &Path, api: u16, grpc: u16) -> BareServer {
    BareServer::start(
        Path::new(env!("CARGO_BIN_EXE_skein")),
        data,
        api,
        grpc,
        API_TOKEN,
        Some(&data.with_extension("log")),
    )
}

fn server_log(data: &Path) -> String {
    std::fs::read_to_string(data.with_extension("log")).unwrap_or_default()
}

/// Sends SIGTERM to the server.
fn terminate(server: &BareServer) {
    let pid = i32::try_from(server.0.id())
        .ok()
        .and_then(rustix::process::Pid::from_raw)
        .unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
}

#[test]
fn sigterm_under_load_answers_what_is_in_flight_keeps_what_was_acknowledged_and_exits_0() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let (api, grpc) = (skein_testkit::net::free_port(), skein_testkit::net::free_port());
    let base = format!("http://127.0.0.1:{api}");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(EXIT_BOUND.as_secs() * 2))
        .build()
        .unwrap();
    let mut server = start(&data, api, grpc);
    let ids: Vec<String> = runtime.block_on(async {
        let mut ids = Vec::new();
        for i in 0..SESSIONS {
            ids.push(create_session(&http, &base, API_TOKEN, i).await);
        }
        ids
    });

    // An event stream that never ends by itself: it must end, whole, when the server
    // stops.
    let events = {
        let http = http.clone();
        let url = format!("{base}/v1/graph/events");
        runtime.spawn(async move {
            let response = http.get(url).bearer_auth(API_TOKEN).send().await.unwrap();
            assert_eq!(response.status(), 200);
            response.bytes().await.map(|b| b.len())
        })
    };

    // The clients: each appends c{i}-{n} as fast as it is answered, until the server
    // no longer takes connections. Every answer must be whole: 200 with the message.
    let terminated = Arc::new(AtomicBool::new(false));
    let clients: Vec<_> = ids
        .iter()
        .cloned()
        .enumerate()
        .map(|(i, id)| {
            let http = http.clone();
            let base = base.clone();
            let terminated = Arc::clone(&terminated);
            runtime.spawn(async move {
                let mut acknowledged = Vec::new();
                let mut after_term = 0u32;
                loop {
                    let text = format!("c{i}-{}", acknowledged.len());
                    let response = http
                        .post(format!("{base}/v1/sessions/{id}/messages"))
                        .bearer_auth(API_TOKEN)
                        .header("Idempotency-Key", &text)
                        .json(&json!({"content": format!("{text} {}", "x".repeat(1000)), "reply": false}))
                        .send()
                        .await;
                    let response = match response {
                        Ok(response) => response,
                        // Refused or closed before it was taken in: the server stopped.
                        Err(_) if terminated.load(Ordering::SeqCst) => return (acknowledged, after_term),
                        Err(error) => panic!("client {i}: {error}"),
                    };
                    let status = response.status();
                    let body = response.text().await;
                    let body = body.unwrap_or_else(|e| panic!("client {i}: an answer cut short ({status}): {e}"));
                    assert_eq!(status, 200, "client {i}: {body}");
                    let answer: Value = serde_json::from_str(&body)
                        .unwrap_or_else(|e| panic!("client {i}: an incomplete answer: {e}: {body}"));
                    let stored = answer["message"]["content"].as_str().unwrap_or_default();
                    assert!(stored.starts_with(&text), "client {i}: {body}");
                    acknowledged.push(text);
                    if terminated.load(Ordering::SeqCst) {
                        after_term += 1;
                    }
                }
            })
        })
        .collect();

    std::thread::sleep(Duration::from_millis(1500));
    terminated.store(true, Ordering::SeqCst);
    terminate(&server);
    let sent = Instant::now();
    let status = loop {
        if let Some(status) = server.0.try_wait().unwrap() {
            break status;
        }
        assert!(
            sent.elapsed() < EXIT_BOUND,
            "the server did not exit within {EXIT_BOUND:?} of SIGTERM\n{}",
            server_log(&data)
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    eprintln!("the server exited {status} {:?} after SIGTERM", sent.elapsed());
    assert!(status.success(), "exit status {status}\n{}", server_log(&data));
    assert!(
        server_log(&data).contains("skein server: stopped"),
        "{}",
        server_log(&data)
    );

    let acknowledged: Vec<(Vec<String>, u32)> = runtime.block_on(async {
        let mut all = Vec::new();
        for client in clients {
            all.push(client.await.unwrap());
        }
        all
    });
    let streamed = runtime.block_on(events).unwrap();
    assert!(streamed.is_ok(), "the event stream ended with an error: {streamed:?}");

    // The same data directory again: every acknowledged append is stored, in order.
    server = start(&data, api, grpc);
    runtime.block_on(async {
        for (i, id) in ids.iter().enumerate() {
            let deadline = Instant::now() + Duration::from_secs(60);
            while http.get(format!("{base}/healthz")).send().await.is_err() {
                assert!(Instant::now() < deadline, "the restarted server never answered");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            let texts = message_heads(&http, &base, API_TOKEN, id).await;
            let (acked, _) = &acknowledged[i];
            assert!(
                texts.len() == acked.len() || texts.len() == acked.len() + 1,
                "session {i}: {} stored, {} acknowledged",
                texts.len(),
                acked.len()
            );
            assert_eq!(
                &texts[..acked.len()],
                &acked[..],
                "session {i}: every acknowledged message, in order"
            );
        }
    });
    let total: usize = acknowledged.iter().map(|(a, _)| a.len()).sum();
    eprintln!("{total} appends acknowledged");
    assert!(total >= SESSIONS, "the clients got work done: {total}");
    drop(server);
}
