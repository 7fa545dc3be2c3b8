//! Reflexes live, in a real server with test agents at the edge (simulated GPUs whose
//! telemetry the test sets, in-process OpenAI fakes): a load spike on the agent's GPU
//! clones it, sends new sessions to the clone, halves the original's sessions, and
//! scales in once the load is gone; rising ECC errors drain the GPU and move its
//! sessions off while they chat, losing no message; a square-wave load acts at most
//! once per cooldown; a dry run only records.

mod common;

use std::time::Duration;

use common::{API, PATIENCE, Setup, TOKEN, quick, setup};
use reqwest::Method;
use serde_json::{Value, json};
use skein_orchestrator::run::record::UnixMs;
use skein_testkit::agent::{EngineBehaviour, GpuLoad, TestAgent};

const MODEL: &str = "Qwen/Qwen2.5-0.5B-Instruct";

/// A serving workflow (no steps) of one agent on the tiny model, with `reflexes`.
fn workflow(reflexes: &str) -> String {
    format!("name: reflexes\nagents:\n  coder:\n    model: {{ repo: {MODEL}, context: 2048 }}\nreflexes:\n{reflexes}")
}

/// Submits `workflow` and waits until it serves; returns the run id.
async fn serve(s: &Setup, workflow: &str) -> String {
    let response = s.submit(workflow, json!({})).await;
    assert_eq!(response.status(), 202, "{}", response.text().await.unwrap());
    let run: Value = response.json().await.unwrap();
    let id = run["id"].as_str().unwrap().to_owned();
    let run = s
        .wait_run(&id, |r| r["state"] == "running" || r["state"] == "failed")
        .await;
    assert_eq!(run["state"], "running", "{run:#}");
    id
}

/// A server, a node of two simulated GPUs, and a serving run of `reflexes`: the
/// server, the node, the run's id and its one instance.
async fn serving(reflexes: &str) -> (Setup, TestAgent, String, Value) {
    let s = setup(quick(), None).await;
    let agent = TestAgent::join(s.server.grpc_addr, TOKEN, "node-a", 2, EngineBehaviour::default()).await;
    s.wait_nodes(1).await;
    let run = serve(&s, &workflow(reflexes)).await;
    let original = instances(&s, &run).await;
    assert_eq!(original.len(), 1, "{original:#?}");
    let first = original[0].clone();
    (s, agent, run, first)
}

/// The live instances of `run`.
async fn instances(s: &Setup, run: &str) -> Vec<Value> {
    let listed = s.get("/v1/instances").await;
    listed
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| i["run"] == run)
        .cloned()
        .collect()
}

/// Waits until `done` holds for the reflex events (newest first).
/// Waits until the graph satisfies `done`.
async fn wait_graph(s: &Setup, done: impl Fn(&Value) -> bool) -> Value {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let graph = s.get("/v1/graph").await;
        if done(&graph) {
            return graph;
        }
        assert!(tokio::time::Instant::now() < deadline, "timed out: {graph:#}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn wait_events(s: &Setup, done: impl Fn(&[Value]) -> bool) -> Vec<Value> {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let page = s.get("/v1/events?limit=100").await;
        let events = page["data"].as_array().unwrap().clone();
        if done(&events) {
            return events;
        }
        assert!(tokio::time::Instant::now() < deadline, "timed out: {events:#?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn of_kind<'a>(events: &'a [Value], reflex: &str, kind: &str) -> Vec<&'a Value> {
    events
        .iter()
        .filter(|e| e["reflex"] == reflex && e["kind"] == kind)
        .collect()
}

/// When `reflex` fired (each decision's sample time, Unix ms), newest first.
fn fire_times(events: &[Value], reflex: &str) -> Vec<i64> {
    of_kind(events, reflex, "fire")
        .iter()
        .map(|e| serde_json::from_value::<UnixMs>(e["at"].clone()).unwrap().0)
        .collect()
}

async fn session(s: &Setup, run: &str) -> (String, String) {
    let (status, session) = s
        .call(
            Method::POST,
            "/v1/sessions",
            Some(API),
            Some(json!({"run": run, "agent": "coder"})),
        )
        .await;
    assert_eq!(status, 201, "{session}");
    let id = session["id"].as_str().unwrap().to_owned();
    let instance = session["binding"]["instance"].as_str().unwrap_or_default().to_owned();
    (id, instance)
}

async fn say(s: &Setup, id: &str, text: &str) -> Value {
    let (status, reply) = s
        .call(
            Method::POST,
            &format!("/v1/sessions/{id}/messages"),
            Some(API),
            Some(json!({ "content": text })),
        )
        .await;
    assert_eq!(status, 200, "{reply}");
    reply
}

async fn binding(s: &Setup, id: &str) -> String {
    let session = s.get(&format!("/v1/sessions/{id}")).await;
    session["binding"]["instance"].as_str().unwrap_or_default().to_owned()
}

fn hot(util: u32) -> GpuLoad {
    GpuLoad {
        utilization_pct: util,
        ..GpuLoad::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spike_on_the_agents_gpu_clones_reroutes_decays_and_scales_in_after() {
    let (s, agent, run, original) = serving(
        "  - name: hot-coder\n    when: 'gpu.util > 0.8'\n    for: 500ms\n    scope: { agent: coder }\n    do: [ { clone: 1 }, { reroute: new }, { decay: { target: original, capacity: 0.5 } } ]\n    cooldown: 2s\n    max_replicas: 2\n",
    )
    .await;
    let original_name = original["name"].as_str().unwrap().to_owned();
    let hot_gpu = original["gpus"][0].as_u64().unwrap() as u32;

    // Four conversations on the original.
    let mut sessions = Vec::new();
    for n in 0..4 {
        let (id, bound) = session(&s, &run).await;
        assert_eq!(bound, original_name);
        say(&s, &id, &format!("hello {n}")).await;
        sessions.push(id);
    }

    // The spike.
    agent.set_gpu(hot_gpu, hot(95));
    let events = wait_events(&s, |e| !of_kind(e, "hot-coder", "fire").is_empty()).await;
    let fire = of_kind(&events, "hot-coder", "fire")[0].clone();
    assert!(fire["values"]["gpu.util"].as_f64().unwrap() > 0.8, "{fire:#}");
    let actions = fire["actions"].as_array().unwrap();
    assert_eq!(actions.len(), 3, "{fire:#}");
    for action in actions {
        assert_eq!(action["outcome"], "done", "{fire:#}");
    }
    let replicas = instances(&s, &run).await;
    assert_eq!(replicas.len(), 2, "{replicas:#?}");
    let clone = replicas.iter().find(|i| i["clone_of"] == "hot-coder").unwrap();
    let clone_name = clone["name"].as_str().unwrap().to_owned();
    assert_ne!(
        clone["gpus"][0].as_u64().unwrap() as u32,
        hot_gpu,
        "the clone avoids the hot GPU"
    );
    assert!(actions[0]["detail"].as_str().unwrap().contains(&clone_name), "{fire:#}");

    // Decay: half the original's sessions moved to the clone, their histories with them.
    let mut on_clone = 0;
    for id in &sessions {
        if binding(&s, id).await == clone_name {
            on_clone += 1;
        }
    }
    assert_eq!(on_clone, 2, "{fire:#}");
    for id in &sessions {
        let reply = say(&s, id, "still there?").await;
        assert_eq!(reply["message"]["seq"], 3, "no message lost: {reply:#}");
    }
    // Reroute new: new sessions go to the clone.
    for _ in 0..3 {
        let (_, bound) = session(&s, &run).await;
        assert_eq!(bound, clone_name);
    }

    // The load goes; after the cooldown the reflex lets go and the clone is scaled in,
    // its sessions back on the original.
    agent.set_gpu(hot_gpu, hot(10));
    let events = wait_events(&s, |e| !of_kind(e, "hot-coder", "release").is_empty()).await;
    let release = of_kind(&events, "hot-coder", "release")[0].clone();
    assert!(
        release["actions"][0]["detail"]
            .as_str()
            .unwrap()
            .contains(&format!("scaled in {clone_name}")),
        "{release:#}"
    );
    let left = instances(&s, &run).await;
    assert_eq!(left.len(), 1, "{left:#?}");
    assert_eq!(left[0]["share"], 1.0, "shares restored: {left:#?}");
    for id in &sessions {
        assert_eq!(binding(&s, id).await, original_name);
        let reply = say(&s, id, "back home").await;
        assert_eq!(reply["message"]["seq"], 5, "{reply:#}");
    }
    assert_eq!(of_kind(&events, "hot-coder", "fire").len(), 1, "{events:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rising_ecc_errors_drain_the_gpu_and_move_its_sessions_while_they_chat_losing_nothing() {
    let (s, agent, run, original) = serving(
        "  - name: failing-memory\n    when: 'gpu.ecc_rate > 0'\n    scope: { agent: coder }\n    do: [ drain, { notify: \"ECC errors: draining\" } ]\n    cooldown: 10m\n",
    )
    .await;
    let original_name = original["name"].as_str().unwrap().to_owned();
    let failing = original["gpus"][0].as_u64().unwrap() as u32;
    let mut sessions = Vec::new();
    for _ in 0..3 {
        let (id, _) = session(&s, &run).await;
        sessions.push(id);
    }

    // Each session chats without pause while the GPU fails under it.
    let chatting: Vec<_> = sessions
        .iter()
        .map(|id| {
            let http = s.http.clone();
            let url = s.url(&format!("/v1/sessions/{id}/messages"));
            tokio::spawn(async move {
                let mut turns = 0u64;
                let until = tokio::time::Instant::now() + Duration::from_secs(3);
                while tokio::time::Instant::now() < until {
                    let response = http
                        .post(&url)
                        .bearer_auth(API)
                        .json(&json!({"content": format!("turn {turns}")}))
                        .send()
                        .await
                        .unwrap();
                    assert_eq!(response.status(), 200, "{}", response.text().await.unwrap());
                    turns += 1;
                    tokio::time::sleep(Duration::from_millis(40)).await;
                }
                turns
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(500)).await;
    agent.set_gpu(
        failing,
        GpuLoad {
            ecc_corrected: 12,
            ..GpuLoad::default()
        },
    );
    let mut turns = Vec::new();
    for task in chatting {
        turns.push(task.await.unwrap());
    }

    let events = wait_events(&s, |e| !of_kind(e, "failing-memory", "fire").is_empty()).await;
    let fire = of_kind(&events, "failing-memory", "fire")[0].clone();
    assert!(fire["values"]["gpu.ecc_rate"].as_f64().unwrap() > 0.0, "{fire:#}");
    assert_eq!(fire["actions"][0]["outcome"], "done", "{fire:#}");
    assert_eq!(fire["actions"][1]["detail"], "ECC errors: draining");
    // The graph says the GPU is drained, and why.
    let graph = s.get("/v1/graph").await;
    let gpu = &graph["nodes"][0]["gpus"][failing as usize];
    assert!(gpu["drained"].as_str().unwrap().contains("failing-memory"), "{gpu:#}");
    // Every session left the failing GPU, and every message it sent is there with its reply.
    for (id, turns) in sessions.iter().zip(turns) {
        let bound = binding(&s, id).await;
        assert_ne!(bound, original_name, "{fire:#}");
        let messages = s.get(&format!("/v1/sessions/{id}/messages?limit=1000")).await;
        let messages = messages["data"].as_array().unwrap();
        assert_eq!(messages.len() as u64, 2 * turns, "no message lost");
        for (n, pair) in messages.chunks(2).enumerate() {
            assert_eq!(pair[0]["content"], format!("turn {n}"));
            assert_eq!(pair[1]["content"], format!("echo: turn {n}"));
        }
    }
    // Nothing new is placed on the drained GPU.
    let replicas = instances(&s, &run).await;
    for replica in replicas.iter().filter(|i| i["name"] != original_name.as_str()) {
        assert_ne!(replica["gpus"][0].as_u64().unwrap() as u32, failing, "{replicas:#?}");
    }

    // The run ends: the replica the drain started stops and the drain is lifted.
    let (status, _) = s
        .call(Method::POST, &format!("/v1/runs/{run}/cancel"), Some(API), None)
        .await;
    assert_eq!(status, 200);
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let left = instances(&s, &run).await;
        let graph = s.get("/v1/graph").await;
        let drained = graph["nodes"][0]["gpus"][failing as usize].get("drained").cloned();
        if left.is_empty() && drained.is_none() {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "{left:#?} {drained:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_square_wave_acts_at_most_once_per_cooldown_and_a_dry_run_only_records() {
    let (s, agent, run, original) = serving(
        "  - name: wave\n    when: 'gpu.util > 0.8'\n    scope: { agent: coder }\n    do: [ notify ]\n    cooldown: 2s\n  - name: shadow\n    when: 'gpu.util > 0.8'\n    scope: { agent: coder }\n    do: [ { clone: 2 } ]\n    cooldown: 2s\n    dry_run: true\n",
    )
    .await;
    let gpu = original["gpus"][0].as_u64().unwrap() as u32;
    // 300 ms high, 300 ms low, for 5 s.
    let started = tokio::time::Instant::now();
    let mut high = true;
    while started.elapsed() < Duration::from_secs(5) {
        agent.set_gpu(gpu, hot(if high { 95 } else { 5 }));
        high = !high;
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    agent.set_gpu(gpu, hot(5));
    // The load stays low now: once each reflex's newest event is its release (after the
    // cooldown), neither fires again, and every fire of both is recorded.
    let settled = |e: &[Value], reflex: &str| {
        e.iter()
            .find(|e| e["reflex"] == reflex)
            .is_some_and(|newest| newest["kind"] == "release")
    };
    let events = wait_events(&s, |e| settled(e, "wave") && settled(e, "shadow")).await;
    let fires = fire_times(&events, "wave");
    assert!(!fires.is_empty(), "{events:#?}");
    // 5 s at a 2 s cooldown: at most 3 fires, at least 2 s apart.
    assert!(fires.len() <= 3, "{events:#?}");
    for pair in fires.windows(2) {
        assert!(pair[0] - pair[1] >= 2000, "{fires:?}");
    }
    // The dry run reads the same samples with the same condition and cooldown: it
    // decided as often, on the same samples (an event's `at` is the time of the sample
    // that decided it), and did nothing.
    assert_eq!(fire_times(&events, "shadow"), fires, "{events:#?}");
    for event in of_kind(&events, "shadow", "fire") {
        assert_eq!(event["dry_run"], true);
        assert_eq!(event["actions"][0]["outcome"], "would_do", "{event:#}");
    }
    assert_eq!(instances(&s, &run).await.len(), 1, "a dry run starts nothing");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_on_the_agent_moves_some_of_its_sessions_to_another_gpu() {
    let s = setup(quick(), None).await;
    let slow = EngineBehaviour {
        delay: Duration::from_millis(600),
        ..EngineBehaviour::default()
    };
    let _agent = TestAgent::join(s.server.grpc_addr, TOKEN, "node-a", 2, slow).await;
    s.wait_nodes(1).await;
    let run = serve(
        &s,
        &workflow(
            "  - name: queue\n    when: 'agent.queue_depth >= 3'\n    scope: { agent: coder }\n    do: [ { migrate: { sessions: 2, to: auto } } ]\n    cooldown: 1m\n",
        ),
    )
    .await;
    let original = instances(&s, &run).await[0].clone();
    let original_name = original["name"].as_str().unwrap().to_owned();
    let mut sessions = Vec::new();
    for _ in 0..4 {
        sessions.push(session(&s, &run).await.0);
    }
    // Four turns at once queue on the slow engine.
    let turns: Vec<_> = sessions
        .iter()
        .map(|id| {
            let http = s.http.clone();
            let url = s.url(&format!("/v1/sessions/{id}/messages"));
            tokio::spawn(async move {
                let response = http
                    .post(&url)
                    .bearer_auth(API)
                    .json(&json!({"content": "first"}))
                    .send()
                    .await
                    .unwrap();
                assert_eq!(response.status(), 200);
            })
        })
        .collect();
    for turn in turns {
        turn.await.unwrap();
    }
    let events = wait_events(&s, |e| !of_kind(e, "queue", "fire").is_empty()).await;
    let fire = of_kind(&events, "queue", "fire")[0].clone();
    assert!(fire["values"]["agent.queue_depth"].as_f64().unwrap() >= 3.0, "{fire:#}");
    assert_eq!(fire["actions"][0]["outcome"], "done", "{fire:#}");
    assert!(
        fire["actions"][0]["detail"]
            .as_str()
            .unwrap()
            .contains("moved 2 sessions"),
        "{fire:#}"
    );
    let mut moved = 0;
    for id in &sessions {
        if binding(&s, id).await != original_name {
            moved += 1;
        }
        let reply = say(&s, id, "second").await;
        assert_eq!(reply["message"]["seq"], 3, "no message lost: {reply:#}");
    }
    assert_eq!(moved, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zone_scope_watches_the_nodes_labelled_with_it_and_no_other() {
    let s = setup(quick(), None).await;
    let engines = EngineBehaviour::default();
    let inside = TestAgent::join_labelled(
        s.server.grpc_addr,
        TOKEN,
        "node-a",
        2,
        engines.clone(),
        &[("zone", "lab-a")],
    )
    .await;
    let outside = TestAgent::join(s.server.grpc_addr, TOKEN, "node-b", 2, engines).await;
    s.wait_nodes(2).await;
    let run = serve(
        &s,
        &workflow("  - name: hot-zone\n    when: 'gpu.temp > 85'\n    scope: { zone: lab-a }\n    do: [ drain ]\n    cooldown: 1m\n"),
    )
    .await;
    let hot = GpuLoad {
        temperature_c: 92,
        ..GpuLoad::default()
    };
    // Heat outside the zone first: once the server holds that sample, heat inside. The
    // outside sample came in first, so by the inside fire it was judged too: only the
    // inside one fires.
    outside.set_gpu(1, hot);
    wait_graph(&s, |g| {
        g["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|n| n["inventory"]["name"] == "node-b" && n["gpus"][1]["latest"]["temperature_c"] == 92)
    })
    .await;
    inside.set_gpu(1, hot);
    let events = wait_events(&s, |e| !of_kind(e, "hot-zone", "fire").is_empty()).await;
    assert_eq!(of_kind(&events, "hot-zone", "fire").len(), 1, "{events:#?}");
    let fire = of_kind(&events, "hot-zone", "fire")[0].clone();
    assert_eq!(fire["run"], run.as_str());
    assert_eq!(fire["values"]["gpu.temp"], 92.0, "{fire:#}");
    let graph = s.get("/v1/graph").await;
    for node in graph["nodes"].as_array().unwrap() {
        let zoned = node["inventory"]["name"] == "node-a";
        for gpu in node["gpus"].as_array().unwrap() {
            assert_eq!(gpu.get("drained").is_some(), zoned, "{node:#}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drained_gpu_is_left_out_of_plans_with_why_and_its_release_names_the_node() {
    let (s, agent, _run, original) = serving(
        "  - name: hot\n    when: 'gpu.temp > 85'\n    scope: { agent: coder }\n    do: [ drain ]\n    cooldown: 1s\n",
    )
    .await;
    let hot_gpu = original["gpus"][0].as_u64().unwrap() as u32;
    agent.set_gpu(
        hot_gpu,
        GpuLoad {
            temperature_c: 92,
            ..GpuLoad::default()
        },
    );
    let events = wait_events(&s, |e| !of_kind(e, "hot", "fire").is_empty()).await;
    let fire = of_kind(&events, "hot", "fire")[0].clone();
    assert_eq!(fire["actions"][0]["outcome"], "done", "{fire:#}");
    assert!(
        fire["actions"][0]["detail"]
            .as_str()
            .unwrap()
            .starts_with(&format!("drained node-a GPU {hot_gpu}")),
        "{fire:#}"
    );

    // `POST /v1/plans` plans what the executor would: off the drained GPU, saying why.
    let (status, plan) = s
        .call(
            Method::POST,
            "/v1/plans",
            Some(API),
            Some(json!({ "workflow": format!("name: again\nagents:\n  coder:\n    model: {{ repo: {MODEL}, context: 2048 }}\n") })),
        )
        .await;
    assert_eq!(status, 200, "{plan:#}");
    let devices = plan["instances"][0]["devices"].as_array().unwrap();
    assert!(!devices.is_empty(), "{plan:#}");
    for device in devices {
        assert_ne!(device["gpu"], json!(hot_gpu), "placed on the drained GPU: {plan:#}");
    }
    let excluded = plan["excluded"].as_array().unwrap();
    let drained = excluded
        .iter()
        .find(|e| e["node"] == "node-a" && e["gpu"] == json!(hot_gpu))
        .unwrap_or_else(|| panic!("the drained GPU is not in `excluded`: {plan:#}"));
    let reason = drained["reason"].as_str().unwrap();
    assert!(
        reason.starts_with("drained: ") && reason.contains("reflex `hot`"),
        "{reason}"
    );

    // Cool again: the release lifts the drain, naming the node as the fire did.
    agent.set_gpu(hot_gpu, GpuLoad::default());
    let events = wait_events(&s, |e| !of_kind(e, "hot", "release").is_empty()).await;
    let release = of_kind(&events, "hot", "release")[0].clone();
    let lifted = release["actions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["action"] == "drain" && a["detail"].as_str().unwrap().starts_with("drain lifted"))
        .unwrap_or_else(|| panic!("{release:#}"));
    assert_eq!(
        lifted["detail"],
        format!("drain lifted on node-a GPU {hot_gpu}"),
        "{release:#}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endpoint_agents_turns_are_measured_and_its_absent_gpu_fires_nothing() {
    let s = setup(quick(), None).await;
    let url = skein_testkit::endpoint::WholeAnswer::start("hosted").url();
    let workflow = format!(
        "name: hosted\nagents:\n  hosted: {{ endpoint: {{ url: \"{url}\", model: m }} }}\nreflexes:\n\
         \x20 - name: completed\n    when: 'agent.tokens_per_s > 0 && agent.sessions == 0'\n    scope: {{ agent: hosted }}\n    do: [ notify ]\n\
         \x20 - name: talked\n    when: 'agent.sessions >= 1'\n    scope: {{ agent: hosted }}\n    do: [ {{ notify: \"talking\" }} ]\n\
         \x20 - name: idle\n    when: 'gpu.util < 0.1 || node.down'\n    scope: {{ agent: hosted }}\n    do: [ notify ]\n"
    );
    let run = serve(&s, &workflow).await;
    // A stateless request on the OpenAI-compatible route (the run's agent by name).
    let (status, answer) = s
        .call(
            Method::POST,
            "/v1/chat/completions",
            Some(API),
            Some(json!({"model": "hosted", "messages": [{"role": "user", "content": "hi"}]})),
        )
        .await;
    assert_eq!(status, 200, "{answer}");
    let events = wait_events(&s, |e| !of_kind(e, "completed", "fire").is_empty()).await;
    let fire = of_kind(&events, "completed", "fire")[0].clone();
    // The endpoint's 3 completion tokens within the 10 s window.
    assert_eq!(fire["values"]["agent.tokens_per_s"], 0.3, "{fire:#}");
    assert_eq!(fire["values"]["agent.sessions"], 0.0, "{fire:#}");
    // A session's turn.
    let (status, session) = s
        .call(
            Method::POST,
            "/v1/sessions",
            Some(API),
            Some(json!({"run": run, "agent": "hosted"})),
        )
        .await;
    assert_eq!(status, 201, "{session}");
    let id = session["id"].as_str().unwrap();
    let reply = say(&s, id, "hi").await;
    assert_eq!(reply["message"]["content"], "hosted");
    let events = wait_events(&s, |e| !of_kind(e, "talked", "fire").is_empty()).await;
    let fire = of_kind(&events, "talked", "fire")[0].clone();
    assert_eq!(fire["values"]["agent.sessions"], 1.0, "{fire:#}");
    // No GPU and no node: `gpu.util` and `node.down` are absent, and `idle` never fires.
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    let page = s.get("/v1/events?limit=100").await;
    let events = page["data"].as_array().unwrap();
    assert!(of_kind(events, "idle", "fire").is_empty(), "{events:#?}");
    assert!(of_kind(events, "idle", "error").is_empty(), "{events:#?}");
}
