//! Durability of session messages against `kill -9`: 20 clients append to 20 sessions
//! at once through the real `skein server`, each retrying an unanswered append with the
//! same Idempotency-Key until it is acknowledged (as a client whose request timed out
//! does); the server is killed with SIGKILL at random moments and restarted, several
//! rounds. Afterwards every session holds every acknowledged message exactly once, in
//! order, and nothing else.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde_json::json;
use skein_testkit::lab::Rng;
use skein_testkit::net::free_port;
use skein_testkit::sessions::{BareServer, create_session, message_heads};

const SESSIONS: usize = 20;
const ROUNDS: usize = 4;
const API_TOKEN: &str = "crash-test-admin-token";

fn start(data: &Path, api: u16, grpc: u16) -> BareServer {
    BareServer::start(Path::new(env!("CARGO_BIN_EXE_skein")), data, api, grpc, API_TOKEN, None)
}

#[test]
fn every_acknowledged_message_survives_kill_9_exactly_once_and_in_order() {
    let data = tempfile::tempdir().unwrap();
    let (api, grpc) = (free_port(), free_port());
    let base = format!("http://127.0.0.1:{api}");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let mut server = start(data.path(), api, grpc);

    // The sessions (retried until the server answers).
    let ids: Vec<String> = runtime.block_on(async {
        let mut ids = Vec::new();
        for i in 0..SESSIONS {
            ids.push(create_session(&http, &base, API_TOKEN, i).await);
        }
        ids
    });

    // The clients: each appends c{i}-{n} for n = 0, 1, …, moving on only once the
    // append is acknowledged; an unanswered one is sent again with the same key.
    let stop = Arc::new(AtomicBool::new(false));
    let clients: Vec<_> = ids
        .iter()
        .cloned()
        .enumerate()
        .map(|(i, id)| {
            let http = http.clone();
            let base = base.clone();
            let stop = Arc::clone(&stop);
            runtime.spawn(async move {
                let mut acknowledged = 0u64;
                while !stop.load(Ordering::SeqCst) {
                    let text = format!("c{i}-{acknowledged}");
                    let response = http
                        .post(format!("{base}/v1/sessions/{id}/messages"))
                        .bearer_auth(API_TOKEN)
                        .header("Idempotency-Key", &text)
                        .json(&json!({"content": format!("{text} {}", "x".repeat(1000)), "reply": false}))
                        .send()
                        .await;
                    match response {
                        Ok(r) if r.status() == 200 => acknowledged += 1,
                        // Unavailable while the server restarts, or past the chats in
                        // flight one user may have: retried with the same key.
                        Ok(r) if r.status().is_server_error() || r.status() == 429 => {
                            tokio::time::sleep(Duration::from_millis(20)).await;
                        }
                        Ok(r) => panic!("append refused: {} {}", r.status(), r.text().await.unwrap_or_default()),
                        Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
                    }
                }
                acknowledged
            })
        })
        .collect();

    let mut rng = Rng(0x5eed_1234_abcd_0001);
    for round in 0..ROUNDS {
        std::thread::sleep(Duration::from_millis(300 + rng.below(700)));
        // SIGKILL: no shutdown code runs.
        server.0.kill().unwrap();
        server.0.wait().unwrap();
        eprintln!("round {round}: killed the server");
        std::thread::sleep(Duration::from_millis(rng.below(200)));
        server = start(data.path(), api, grpc);
    }
    std::thread::sleep(Duration::from_millis(800));
    stop.store(true, Ordering::SeqCst);
    let acknowledged: Vec<u64> = runtime.block_on(async {
        let mut counts = Vec::new();
        for client in clients {
            counts.push(client.await.unwrap());
        }
        counts
    });

    runtime.block_on(async {
        for (i, id) in ids.iter().enumerate() {
            let texts = message_heads(&http, &base, API_TOKEN, id).await;
            // The last append may have been written but not acknowledged when the
            // clients stopped: at most one message past the acknowledged ones.
            let acked = acknowledged[i] as usize;
            assert!(
                texts.len() == acked || texts.len() == acked + 1,
                "session {i}: {} stored, {acked} acknowledged",
                texts.len()
            );
            let expected: Vec<String> = (0..texts.len()).map(|n| format!("c{i}-{n}")).collect();
            assert_eq!(texts, expected, "session {i}: every message once, in order");
        }
    });
    let total: u64 = acknowledged.iter().sum();
    eprintln!("{total} appends acknowledged across {ROUNDS} kills");
    assert!(
        total > SESSIONS as u64 * 5,
        "the clients got work done between kills: {total}"
    );
}
