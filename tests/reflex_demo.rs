//! `workflows/reflex-demo.yaml` end to end on the simulated fleet written for it
//! (`workflows/fleets/reflex-demo.yaml`): `skein server`, two `skein agent --simulate`
//! processes whose telemetry follows the fleet file's timeline, the demo's chat agent on
//! the tiny generated Llama (planned for vLLM on the simulated RTX 4090s, served by the
//! lab's vLLM stand-in: the built-in engine on the CPU), and sessions chatting all
//! along. Every reflex of the demo acts, as its event log says: `busy` clones the agent,
//! reroutes and decays, then is released and scales in; `failing-memory` drains rtx-2;
//! `hot-card` moves sessions; `slow` only records. No session loses a message.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use skein_testkit::lab::{Client, Lab, stderr, stdout};
use skein_testkit::tiny_llama;

const WORKFLOW: &str = include_str!("../workflows/reflex-demo.yaml");
const FLEET: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/workflows/fleets/reflex-demo.yaml");

/// Sessions opened before the load comes.
const SESSIONS: usize = 4;

/// The demo with its model swapped for the tiny Llama (which fits any card and whose
/// context is 512 tokens); everything else, the reflexes above all, as written.
fn tiny_demo() -> String {
    let mut swapped = 0;
    let mut text = String::new();
    for line in WORKFLOW.lines() {
        let body = line.trim_start();
        let indent = &line[..line.len() - body.len()];
        if body.starts_with("repo:") {
            text.push_str(&format!("{indent}repo: {}", tiny_llama::REPO_ID));
            swapped += 1;
        } else if body.starts_with("context:") {
            text.push_str(&format!("{indent}context: 512"));
        } else {
            text.push_str(line);
        }
        text.push('\n');
    }
    assert_eq!(swapped, 1, "the demo has one model:\n{WORKFLOW}");
    let reflexes = |t: &str| t[t.find("\nreflexes:").expect("the demo has reflexes")..].to_owned();
    assert_eq!(reflexes(&text), reflexes(WORKFLOW), "the reflexes stay as written");
    text
}

/// Milliseconds since the Unix epoch of an RFC 3339 time.
fn unix_ms(value: &Value) -> i64 {
    let text = value.as_str().unwrap_or_else(|| panic!("not a time: {value}"));
    let time = humantime::parse_rfc3339(text).unwrap_or_else(|e| panic!("{text}: {e}"));
    i64::try_from(time.duration_since(std::time::UNIX_EPOCH).unwrap().as_millis()).unwrap()
}

/// The events of `reflex` of kind `kind` (fire, release, error), newest first.
fn of_kind<'a>(events: &'a [Value], reflex: &str, kind: &str) -> Vec<&'a Value> {
    events
        .iter()
        .filter(|e| e["reflex"] == reflex && e["kind"] == kind)
        .collect()
}

/// Waits until the event log has an event of `reflex` of kind `kind`; returns it and
/// the whole log (newest first).
fn wait_event(lab: &Lab, reflex: &str, kind: &str) -> (Value, Vec<Value>) {
    let page = lab.wait_for(&format!("`{reflex}` to {kind}"), "/v1/events?limit=200", |page| {
        page["data"]
            .as_array()
            .is_some_and(|events| !of_kind(events, reflex, kind).is_empty())
    });
    let events = page["data"].as_array().unwrap().clone();
    let event = of_kind(&events, reflex, kind)[0].clone();
    (event, events)
}

/// The outcomes of an event's actions, by action name: `[("clone", "done"), …]`.
fn outcomes(event: &Value) -> Vec<(String, String)> {
    event["actions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            let name = match &a["action"] {
                Value::String(name) => name.clone(),
                Value::Object(o) => o.keys().next().cloned().unwrap_or_default(),
                other => other.to_string(),
            };
            (name, a["outcome"].as_str().unwrap_or_default().to_owned())
        })
        .collect()
}

fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
    list.iter().map(|(a, b)| ((*a).to_owned(), (*b).to_owned())).collect()
}

/// A fire decided on a GPU sample says when the sample was taken: after `since_ms` (the
/// signal that set it off began), and no later than the decision.
fn check_sampled_at(event: &Value, since_ms: i64) {
    let at = unix_ms(&event["at"]);
    let sampled = unix_ms(&event["sampled_at"]);
    assert!(sampled <= at, "sampled after the decision: {event:#}");
    assert!(
        sampled >= since_ms,
        "a sample from before the signal began ({since_ms}): {event:#}"
    );
}

/// The live instances of `run`.
fn instances(lab: &Lab, run: &str) -> Vec<Value> {
    lab.get("/v1/instances")
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| i["run"] == run && !matches!(i["state"].as_str(), Some("stopped" | "failed" | "gone")))
        .cloned()
        .collect()
}

/// A session of the run's chat agent: its id and the instance it is bound to.
fn open_session(lab: &Lab, run: &str) -> (String, String) {
    let (status, session) = lab.post("/v1/sessions", &json!({"run": run, "agent": "chat"}));
    assert_eq!(status, 201, "{session:#}");
    let bound = session["binding"]["instance"].as_str().unwrap_or_default().to_owned();
    (session["id"].as_str().unwrap().to_owned(), bound)
}

/// A session chatting until `stop`: a turn, a short pause, the next turn. Answers the
/// turns answered and the turns that failed.
fn chat(lab: &Lab, id: &str, stop: &Arc<AtomicBool>) -> JoinHandle<(u64, Vec<String>)> {
    let client = Client::of(lab);
    let path = format!("/v1/sessions/{id}/messages");
    let stop = Arc::clone(stop);
    std::thread::spawn(move || {
        let mut turns = 0u64;
        let mut failed = Vec::new();
        while !stop.load(Ordering::SeqCst) {
            let (status, reply) = client.post(&path, &json!({"content": format!("turn {turns}"), "max_tokens": 8}));
            if status == 200 {
                turns += 1;
            } else {
                failed.push(format!("turn {turns}: {status} {reply}"));
            }
            std::thread::sleep(Duration::from_millis(250));
        }
        (turns, failed)
    })
}

#[test]
fn the_reflex_demo_clones_drains_migrates_and_records_on_its_fleet() {
    let begun = Instant::now();
    // The fleet's signals start at offsets from the agents' start, which comes after this.
    let begun_ms = i64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis(),
    )
    .unwrap();
    let lab = Lab::new(env!("CARGO_BIN_EXE_skein"));
    let _server = lab.server();
    let fleet = std::path::Path::new(FLEET);
    let _rtx1 = lab.simulated_agent(fleet, "rtx-1");
    let _rtx2 = lab.simulated_agent(fleet, "rtx-2");
    // The fleet's clock: its signals are timed from the agents' start.
    let t0 = Instant::now();
    let t = || t0.elapsed().as_secs_f64();
    lab.nodes_up(2);
    // Every GPU reports before the workflow is planned.
    lab.wait_for("telemetry from every GPU", "/v1/graph", |graph| {
        graph["nodes"].as_array().is_some_and(|nodes| {
            nodes.len() == 2
                && nodes.iter().all(|n| {
                    let gpus = n["gpus"].as_array();
                    gpus.is_some_and(|g| g.len() == 2 && g.iter().all(|g| !g["latest"].is_null()))
                })
        })
    });

    let file = lab.dir().join("reflex-demo.yaml");
    std::fs::write(&file, tiny_demo()).unwrap();
    let submitted = lab.cli(&["submit", file.to_str().unwrap()]);
    assert!(submitted.status.success(), "{}", stderr(&submitted));
    let run = stdout(&submitted).trim().to_owned();
    let serving = lab.wait_run(&run, "the demo to serve", |r| {
        matches!(r["state"].as_str(), Some("running" | "failed" | "cancelled"))
    });
    assert_eq!(serving["state"], "running", "{serving:#}");
    eprintln!("t = {:.1} s: the demo serves", t());
    let original = instances(&lab, &run);
    assert_eq!(original.len(), 1, "{original:#?}");
    let original = original[0].clone();
    let original_name = original["name"].as_str().unwrap().to_owned();
    // The fleet file's story is told on the card the planner picks: the first by node
    // and index.
    assert_eq!(
        (&original["node_name"], &original["gpus"]),
        (&json!("rtx-1"), &json!([0])),
        "the fleet file makes rtx-1 GPU 0 busy: {original:#}"
    );

    // Sessions chat all along.
    let stop = Arc::new(AtomicBool::new(false));
    let mut sessions = Vec::new();
    for _ in 0..SESSIONS {
        let (id, bound) = open_session(&lab, &run);
        assert_eq!(bound, original_name);
        sessions.push(id);
    }
    let mut chatting: Vec<_> = sessions.iter().map(|id| chat(&lab, id, &stop)).collect();
    assert!(
        t() < 25.0,
        "the demo served only at t = {:.1} s: too late for the fleet's timeline",
        t()
    );

    // Load: clone, reroute, decay.
    let (fire, _) = wait_event(&lab, "busy", "fire");
    eprintln!("t = {:.1} s: busy fired", t());
    assert!(fire["values"]["gpu.util"].as_f64().unwrap() > 0.8, "{fire:#}");
    assert_eq!(
        outcomes(&fire),
        pairs(&[("clone", "done"), ("reroute", "done"), ("decay", "done")]),
        "{fire:#}"
    );
    if !fire["sampled_at"].is_null() {
        check_sampled_at(&fire, begun_ms + 20_000); // busy from t = 20 s
    }
    let replicas = instances(&lab, &run);
    assert_eq!(replicas.len(), 2, "{replicas:#?}");
    let clone = replicas
        .iter()
        .find(|i| i["clone_of"] == "busy")
        .unwrap_or_else(|| panic!("no clone: {replicas:#?}"));
    let clone_name = clone["name"].as_str().unwrap().to_owned();
    assert_ne!((&clone["node_name"], &clone["gpus"]), (&json!("rtx-1"), &json!([0])));
    // New sessions go to the clone while the reflex is active.
    let (late, bound) = open_session(&lab, &run);
    let released = lab.get("/v1/events?limit=200")["data"]
        .as_array()
        .is_some_and(|e| !of_kind(e, "busy", "release").is_empty());
    if !released {
        assert_eq!(bound, clone_name, "reroute new: a new session goes to the clone");
    }
    sessions.push(late.clone());
    chatting.push(chat(&lab, &late, &stop));

    // The load goes: released after the cooldown, the clone scaled in.
    let (release, _) = wait_event(&lab, "busy", "release");
    eprintln!("t = {:.1} s: busy released", t());
    let detail = release["actions"][0]["detail"].as_str().unwrap_or_default();
    assert!(detail.contains(&format!("scaled in {clone_name}")), "{release:#}");
    lab.wait_for("the clone to be scaled in", "/v1/instances", |all| {
        all.as_array().is_some_and(|all| {
            !all.iter().any(|i| {
                i["name"] == clone_name.as_str() && !matches!(i["state"].as_str(), Some("stopped" | "failed" | "gone"))
            })
        })
    });

    // ECC errors: rtx-2 drained.
    let (drain, _) = wait_event(&lab, "failing-memory", "fire");
    eprintln!("t = {:.1} s: failing-memory fired", t());
    assert_eq!(
        outcomes(&drain),
        pairs(&[("drain", "done"), ("notify", "done")]),
        "{drain:#}"
    );
    assert_eq!(drain["actions"][1]["detail"], "ECC errors on rtx-2: draining");
    assert!(drain["values"]["gpu.ecc_rate"].as_f64().unwrap() > 0.0, "{drain:#}");
    // Decided on rtx-2's telemetry: the sample's time is known.
    check_sampled_at(&drain, begun_ms + 55_000); // ECC errors from t = 55 s
    let graph = lab.get("/v1/graph");
    let rtx2 = graph["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["inventory"]["name"] == "rtx-2")
        .unwrap_or_else(|| panic!("no rtx-2: {graph:#}"));
    for gpu in rtx2["gpus"].as_array().unwrap() {
        let why = gpu["drained"].as_str().unwrap_or_default();
        assert!(why.contains("failing-memory"), "{gpu:#}");
    }

    // Heat: sessions moved off the hot card.
    let (hot, _) = wait_event(&lab, "hot-card", "fire");
    eprintln!("t = {:.1} s: hot-card fired", t());
    assert_eq!(
        outcomes(&hot),
        pairs(&[("migrate", "done"), ("notify", "done")]),
        "{hot:#}"
    );
    assert_eq!(hot["actions"][1]["detail"], "GPU running hot; moved sessions away");
    if !hot["sampled_at"].is_null() {
        check_sampled_at(&hot, begun_ms + 50_000); // 90 °C from t = 50 s
    }

    // A card too full for long: what would be done is only recorded.
    let (slow, events) = wait_event(&lab, "slow", "fire");
    eprintln!("t = {:.1} s: slow fired (dry run)", t());
    assert_eq!(slow["dry_run"], true, "{slow:#}");
    assert_eq!(outcomes(&slow), pairs(&[("reroute", "would_do")]), "{slow:#}");
    assert!(slow["values"]["gpu.mem_used_frac"].as_f64().unwrap() > 0.95, "{slow:#}");

    // Every fire once; no evaluation error.
    for reflex in ["busy", "hot-card", "failing-memory", "slow"] {
        assert_eq!(of_kind(&events, reflex, "fire").len(), 1, "{reflex}: {events:#?}");
    }
    assert!(events.iter().all(|e| e["kind"] != "error"), "{events:#?}");

    // No session lost a message: each answered turn is there with its reply, in order.
    stop.store(true, Ordering::SeqCst);
    for (id, chatting) in sessions.iter().zip(chatting) {
        let (turns, failed) = chatting.join().unwrap();
        assert!(failed.is_empty(), "session {id}: {failed:#?}");
        assert!(turns > 0, "session {id} never chatted");
        let messages = lab.get(&format!("/v1/sessions/{id}/messages?limit=1000"));
        let messages = messages["data"].as_array().unwrap();
        assert_eq!(messages.len() as u64, 2 * turns, "session {id}: {messages:#?}");
        for (n, pair) in messages.chunks(2).enumerate() {
            assert_eq!(pair[0]["role"], "user");
            assert_eq!(pair[0]["content"], format!("turn {n}"), "session {id}");
            assert_eq!(pair[1]["role"], "assistant");
        }
    }

    for event in events.iter().rev() {
        let after_sample = match event["sampled_at"] {
            Value::Null => "decided on a tick: no sampled_at".to_owned(),
            ref sampled => format!("{} ms after its sample", unix_ms(&event["at"]) - unix_ms(sampled)),
        };
        eprintln!("{} {}: {after_sample}", event["reflex"], event["kind"]);
    }

    // `skein events` tells the same story.
    let printed = lab.cli(&["events"]);
    assert!(printed.status.success(), "{}", stderr(&printed));
    let printed = stdout(&printed);
    eprintln!("{printed}");
    let line = |reflex: &str, kind: &str| {
        printed
            .lines()
            .any(|l| l.split_whitespace().any(|w| w == reflex) && l.contains(kind))
    };
    for (reflex, kind) in [
        ("busy", "fire"),
        ("busy", "release"),
        ("failing-memory", "fire"),
        ("hot-card", "fire"),
        ("slow", "fire (dry run)"),
    ] {
        assert!(line(reflex, kind), "no `{reflex} {kind}` line:\n{printed}");
    }
    eprintln!("the demo took {:.1} s", begun.elapsed().as_secs_f64());
}
