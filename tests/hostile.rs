//! Hostile inputs against one real `skein server`, all in one run: workflows that try to
//! overflow a stack, spin or explode in size; requests too large, too many, half-sent or
//! garbled; a hub whose answers name paths outside the cache; agents that impersonate a
//! node or send nonsense. Whatever each one is answered, the server must not crash, must
//! not stall (a cheap authenticated route keeps answering: its p99 stays under 100 ms
//! while the battery runs, against the 10–57 s seen before evaluation moved off the
//! runtime), and must not grow by more than 256 MiB (VmHWM against VmRSS before).
//!
//! The battery's parts also have their own focused tests (`rhai_hostile`, `chat_limits`,
//! `transport`, `hostile_hub`, `secrets`, the agent gateway's tests); this one runs them
//! together, as an attacker would, and measures the server while they run.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use skein_testkit::lab::Lab;
use skein_testkit::mock_hub::Hostile;
use skein_testkit::tiny_llama;

/// Most the server's peak resident memory may exceed its resident memory before.
const GROWTH_BOUND_KIB: u64 = 256 << 10;
/// The p99 the cheap route must hold while the battery runs.
const P99_BOUND: Duration = Duration::from_millis(100);

/// A field of `/proc/<pid>/status`, in KiB.
fn status_kib(pid: u32, field: &str) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    text.lines()
        .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"))
}

/// One request on a runtime of its own (the battery calls this from many threads).
fn request(builder: impl FnOnce(&reqwest::Client) -> reqwest::RequestBuilder) -> (u16, Value) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let client = reqwest::Client::new();
        match builder(&client).timeout(Duration::from_secs(120)).send().await {
            Ok(response) => {
                let status = response.status().as_u16();
                let text = response.text().await.unwrap_or_default();
                (status, serde_json::from_str(&text).unwrap_or(Value::String(text)))
            }
            Err(error) => (0, Value::String(error.to_string())),
        }
    })
}

/// Asserts a hostile request was refused cleanly: a 4xx in the JSON error shape (or
/// diagnostics, for workflows).
fn refused(what: &str, (status, body): &(u16, Value)) {
    assert!(
        (400..500).contains(status),
        "{what}: expected a 4xx, got {status}: {}",
        short(body)
    );
    assert!(
        body["error"]["message"].is_string() || body["diagnostics"].is_array(),
        "{what}: not the JSON error shape: {}",
        short(body)
    );
}

/// The start of an answer, for a failure's message.
fn short(body: &Value) -> String {
    body.to_string().chars().take(400).collect()
}

/// Sends `raw` bytes on a new connection to `addr` and returns what came back (until
/// the server closes or 30 s pass).
fn raw(addr: &str, bytes: &[u8]) -> String {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let _ = stream.write_all(bytes);
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer);
    String::from_utf8_lossy(&answer).into_owned()
}

/// The cheap authenticated route, asked every 20 ms until `stop`: its latencies, and
/// the answers that were not 200.
fn probe(base: String, token: String, stop: Arc<AtomicBool>) -> (Vec<Duration>, Vec<String>) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async move {
        let client = reqwest::Client::new();
        let (mut latencies, mut failures) = (Vec::new(), Vec::new());
        while !stop.load(Ordering::SeqCst) {
            let started = Instant::now();
            let answer = client
                .get(format!("{base}/v1/runs?limit=1"))
                .bearer_auth(&token)
                .timeout(Duration::from_secs(60))
                .send()
                .await;
            latencies.push(started.elapsed());
            match answer {
                Ok(response) if response.status() == 200 => {
                    let _ = response.bytes().await;
                }
                Ok(response) => failures.push(format!("{}", response.status())),
                Err(error) => failures.push(error.to_string()),
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        (latencies, failures)
    })
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let at = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[at.min(sorted.len() - 1)]
}

/// A workflow the closure chain of the report would have aborted the server with.
const CHAIN: &str = "let f = || 1; loop { let g = f; f = || g.call() + 1; }";
/// Spins until the operations limit or the wall-clock budget stops it.
const BUSY: &str = "workflow(\"busy\");\nlet s = \"x\";\ns.pad(10000, \"x\");\nlet n = 0;\nloop { if s.contains(\"y\") { n += 1; } }\n";

/// The hostile workflows: (name, text).
fn workflows() -> Vec<(&'static str, String)> {
    let model = tiny_llama::REPO_ID;
    let step = |when: &str| {
        format!(
            "name: w\nagents:\n  a: {{ model: {model} }}\nsteps:\n  - id: s\n    agent: a\n    prompt: hi\n    when: {}\n",
            serde_json::to_string(when).unwrap()
        )
    };
    let mut laughs = String::from("name: laughs\nx0: &x0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]\n");
    for i in 1..10 {
        let p = i - 1;
        laughs.push_str(&format!(
            "x{i}: &x{i} [*x{p}, *x{p}, *x{p}, *x{p}, *x{p}, *x{p}, *x{p}, *x{p}, *x{p}, *x{p}]\n"
        ));
    }
    vec![
        ("chain.rhai", format!("workflow(\"chain\");\n{CHAIN}\n")),
        ("chain.yaml", step(CHAIN)),
        ("recursion.rhai", "workflow(\"r\");\nfn f(x) { f(x + 1) }\nf(0);\n".to_owned()),
        ("doubling.rhai", "workflow(\"d\");\nlet s = \"x\";\nloop { s += s; }\n".to_owned()),
        ("deep-expr.yaml", step(&format!("{}1{}", "(".repeat(20_000), ")".repeat(20_000)))),
        ("deep-array.rhai", format!("workflow(\"a\");\nlet x = {}1{};\n", "[".repeat(50_000), "]".repeat(50_000))),
        ("deep-yaml.yaml", format!("name: deep\nagents: {}{}\n", "[".repeat(100_000), "]".repeat(100_000))),
        ("laughs.yaml", laughs),
        (
            "server-secret.yaml",
            "name: s\nagents:\n  a: { endpoint: { url: \"http://127.0.0.1:9/v1\", model: m, api_key_env: SKEIN_API_TOKEN } }\nsteps:\n  - { id: s, agent: a, prompt: hi }\n".to_owned(),
        ),
        (
            "metadata.yaml",
            "name: m\nagents:\n  a: { endpoint: { url: \"http://169.254.169.254/latest/\", model: m } }\nsteps:\n  - { id: s, agent: a, prompt: hi }\n".to_owned(),
        ),
    ]
}

#[test]
fn hostile_inputs_neither_crash_nor_stall_nor_grow_the_server() {
    let lab = Lab::new(env!("CARGO_BIN_EXE_skein"));
    let mut server = lab.server();
    let _agent = lab.agent("laptop");
    lab.nodes_up(1);
    let pid = server.0.id();
    let base = lab.api();
    let admin = lab.token();
    let addr = base.trim_start_matches("http://").to_owned();

    let mut tokens = Vec::new();
    for user in ["mallory", "eve"] {
        let (status, made) = request(|c| {
            c.post(format!("{base}/v1/tokens"))
                .bearer_auth(&admin)
                .json(&json!({"user": user}))
        });
        assert_eq!(status, 201, "{made}");
        tokens.push(made["token"].as_str().unwrap().to_owned());
    }
    let nodes_before = lab.get("/v1/nodes");

    // Warm up the routes the battery uses, then take the baseline.
    for _ in 0..20 {
        let (status, _) = request(|c| c.get(format!("{base}/v1/runs?limit=1")).bearer_auth(&tokens[0]));
        assert_eq!(status, 200);
    }
    let rss_before = status_kib(pid, "VmRSS");

    let stop = Arc::new(AtomicBool::new(false));
    let prober = {
        let (base, token, stop) = (base.clone(), tokens[1].clone(), Arc::clone(&stop));
        std::thread::spawn(move || probe(base, token, stop))
    };

    // Workflows: each user sends each one as a plan and as a run, two at a time.
    std::thread::scope(|scope| {
        for (token, user) in tokens.iter().zip(["mallory", "eve"]) {
            let base = &base;
            scope.spawn(move || {
                for (name, text) in workflows() {
                    for route in ["/v1/plans", "/v1/runs"] {
                        let answer = request(|c| {
                            c.post(format!("{base}{route}"))
                                .bearer_auth(token)
                                .json(&json!({"workflow": text, "name": name}))
                        });
                        refused(&format!("{user}: {name} to {route}"), &answer);
                    }
                }
            });
        }
        // Busy scripts: four at once per user, beyond the per-user limit.
        for token in &tokens {
            for _ in 0..4 {
                let base = &base;
                scope.spawn(move || {
                    let answer = request(|c| {
                        c.post(format!("{base}/v1/plans"))
                            .bearer_auth(token)
                            .json(&json!({"workflow": BUSY, "name": "busy.rhai"}))
                    });
                    refused("a busy script", &answer);
                });
            }
        }
    });

    // Requests: a chat turn of 300,000 messages, three at once; a declared body far too
    // large; a URI too long; garbage on the wire; JSON nested a million deep.
    let huge_turn: Arc<String> = Arc::new({
        let mut body = String::from("{\"model\":\"m\",\"messages\":[");
        for i in 0..300_000 {
            if i > 0 {
                body.push(',');
            }
            body.push_str("{\"role\":\"user\",\"content\":\"x\"}");
        }
        body.push_str("]}");
        body
    });
    std::thread::scope(|scope| {
        for _ in 0..3 {
            let (base, token, body) = (&base, &tokens[0], Arc::clone(&huge_turn));
            scope.spawn(move || {
                let answer = request(|c| {
                    c.post(format!("{base}/v1/chat/completions"))
                        .bearer_auth(token)
                        .header("content-type", "application/json")
                        .body(body.as_str().to_owned())
                });
                assert!(matches!(answer.0, 413 | 429), "a turn of 300,000 messages: {answer:?}");
            });
        }
        let nested = "[".repeat(1 << 20);
        let answer = request(|c| {
            c.post(format!("{base}/v1/sessions"))
                .bearer_auth(&tokens[0])
                .header("content-type", "application/json")
                .body(nested)
        });
        refused("JSON nested a million deep", &answer);
    });
    let long = raw(
        &addr,
        format!("GET /v1/runs?x={} HTTP/1.1\r\nHost: x\r\n\r\n", "a".repeat(200_000)).as_bytes(),
    );
    assert!(
        long.starts_with("HTTP/1.1 414"),
        "a URI of 200 kB: {}",
        &long[..long.len().min(200)]
    );
    let declared = raw(
        &addr,
        format!(
            "POST /v1/runs HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {}\r\nContent-Type: application/json\r\nContent-Length: 99999999999999\r\n\r\n",
            tokens[0]
        )
        .as_bytes(),
    );
    assert!(declared.starts_with("HTTP/1.1 413"), "{declared}");
    let garbage = raw(
        &addr,
        b"\x16\x03\x01\x00\xff\x01\x00\x00\xfb\x03\x03 not http at all\r\n\r\n",
    );
    assert!(garbage.is_empty() || garbage.starts_with("HTTP/1.1 400"), "{garbage}");

    // Half-sent requests and idle connections on both doors, all held at once.
    let grpc_addr = lab.join_url().trim_start_matches("http://").to_owned();
    let mut held = Vec::new();
    for i in 0..300 {
        let door = if i % 2 == 0 { &addr } else { &grpc_addr };
        if let Ok(mut stream) = TcpStream::connect(door) {
            if i % 4 == 0 {
                let _ = stream.write_all(b"GET /v1/runs HTTP/1.1\r\nHost: x\r\nX-Slow: ");
            }
            held.push(stream);
        }
    }

    // Agents: one claiming the real node's name with eight fake H100s, and nonsense
    // telemetry from a node of its own.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let join_token = std::fs::read_to_string(lab.data_dir().join("join-token"))
        .map(|t| t.trim().to_owned())
        .unwrap_or_default();
    let grpc: std::net::SocketAddr = grpc_addr.parse().unwrap();
    runtime.block_on(async {
        // Refused at registration: its task ends there, and the node stays as it was.
        let _rogue = skein_testkit::agent::TestAgent::join(
            grpc,
            &join_token,
            "laptop",
            8,
            skein_testkit::agent::EngineBehaviour::default(),
        )
        .await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        let noisy = skein_testkit::agent::TestAgent::join(
            grpc,
            &join_token,
            "noisy",
            2,
            skein_testkit::agent::EngineBehaviour::default(),
        )
        .await;
        for load in [
            skein_testkit::agent::GpuLoad {
                utilization_pct: u32::MAX,
                temperature_c: i32::MIN,
                ecc_corrected: u64::MAX,
                throttle_reasons: u64::MAX,
            },
            skein_testkit::agent::GpuLoad::default(),
        ] {
            noisy.set_gpu(0, load);
            noisy.set_gpu(1, load);
            noisy.sample_now();
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    });

    // The hub: the model's config answered with headers that name paths outside the
    // cache, asked for by a plan.
    let outside = lab.dir().join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    lab.hub().hostile("config.json", Hostile::etag_to(&outside));
    let plan = format!(
        "name: p\nagents:\n  a: {{ model: {{ repo: {} }} }}\nsteps:\n  - {{ id: s, agent: a, prompt: hi }}\n",
        tiny_llama::REPO_ID
    );
    let answer = request(|c| {
        c.post(format!("{base}/v1/plans"))
            .bearer_auth(&tokens[1])
            .json(&json!({"workflow": plan, "name": "p.yaml"}))
    });
    assert!(
        answer.0 != 0 && answer.0 < 500 || answer.0 == 502,
        "a plan through a hostile hub: {answer:?}"
    );
    assert_eq!(
        std::fs::read_dir(&outside).unwrap().count(),
        0,
        "the hub wrote outside the cache"
    );

    drop(held);
    stop.store(true, Ordering::SeqCst);
    let (mut latencies, failures) = prober.join().unwrap();

    // Whole: alive, healthy, the real node as it was, bounded memory, no stall.
    assert!(
        server.0.try_wait().unwrap().is_none(),
        "the server exited:\n{}",
        lab.logs(40)
    );
    let (health, _) = request(|c| c.get(format!("{base}/healthz")));
    assert_eq!(health, 200);
    let nodes_after = lab.get("/v1/nodes");
    let laptop = |nodes: &Value| {
        nodes
            .as_array()
            .and_then(|n| n.iter().find(|n| n["name"] == "laptop"))
            .map(|n| {
                (
                    n["id"].clone(),
                    n["gpus"].clone(),
                    n["labels"].clone(),
                    n["connected"].clone(),
                )
            })
    };
    assert!(laptop(&nodes_before).is_some(), "{nodes_before}");
    assert_eq!(laptop(&nodes_after), laptop(&nodes_before), "the real node changed");
    let growth = status_kib(pid, "VmHWM").saturating_sub(rss_before);
    assert!(
        growth < GROWTH_BOUND_KIB,
        "the server grew by {} MiB (bound {} MiB)",
        growth >> 10,
        GROWTH_BOUND_KIB >> 10
    );
    assert!(failures.is_empty(), "the cheap route failed: {failures:?}");
    latencies.sort();
    assert!(latencies.len() >= 20, "only {} probes", latencies.len());
    let p99 = percentile(&latencies, 0.99);
    eprintln!(
        "probes {} · p50 {:?} · p99 {:?} · max {:?} · growth {} MiB",
        latencies.len(),
        percentile(&latencies, 0.5),
        p99,
        latencies.last().unwrap(),
        growth >> 10
    );
    assert!(
        p99 < P99_BOUND,
        "the cheap route's p99 was {p99:?} while the battery ran"
    );
}
