//! The executor in a real server (gRPC and REST on loopback, runs in sled), with test
//! agents at the edge ([`skein_testkit::agent`]): simulated nodes over the agent
//! protocol whose engines are OpenAI-compatible fakes.

mod common;

use std::sync::atomic::Ordering;
use std::time::Duration;

use common::{API, PATIENCE, TOKEN, quick, setup};
use serde_json::{Value, json};
use skein_orchestrator::run::ExecutorConfig;
use skein_proto::agent::v1 as pb;
use skein_testkit::agent::{EngineBehaviour, TestAgent};

const TWO_AGENTS: &str = r#"
name: two-agents
inputs: { topic: { type: string } }
agents:
  writer: { model: Qwen/Qwen2.5-0.5B-Instruct, system: "Be brief." }
  critic: { model: Qwen/Qwen2.5-7B-Instruct }
steps:
  - { id: draft, agent: writer, prompt: "Write about {{ inputs.topic }}", retries: 2 }
  - { id: review, agent: critic, after: [draft], prompt: "Review: {{ steps.draft.output }}" }
"#;

fn ended(run: &Value) -> bool {
    matches!(run["state"].as_str(), Some("succeeded" | "failed" | "cancelled"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_two_agent_run_starts_its_instances_and_passes_outputs_along() {
    let s = setup(quick(), None).await;
    let engines = EngineBehaviour::default();
    let agent = TestAgent::join(s.server.grpc_addr, TOKEN, "box", 2, engines.clone()).await;
    let response = s.submit(TWO_AGENTS, json!({"topic": "GPUs"})).await;
    assert_eq!(response.status(), 202);
    let run: Value = response.json().await.unwrap();
    let id = run["id"].as_str().unwrap().to_owned();
    assert_eq!(run["state"], "queued");
    let run = s.wait_run(&id, ended).await;
    assert_eq!(run["state"], "succeeded", "{run:#}");
    assert_eq!(run["steps"][0]["output"], "echo: Write about GPUs");
    assert_eq!(run["steps"][1]["output"], "echo: Review: echo: Write about GPUs");
    assert_eq!(run["steps"][1]["usage"]["completion_tokens"], 5);
    assert!(run["steps"][0]["started_at"].as_str().unwrap().ends_with('Z'));
    // One instance per model, each on one of the node's GPUs, stopped after the run.
    let starts = agent.starts();
    assert_eq!(starts.len(), 2, "{starts:#?}");
    for start in &starts {
        assert!(start.instance.starts_with(&id), "{}", start.instance);
        assert_eq!(start.gpus.len(), 1);
        let Some(pb::start_instance::Engine::Vllm(vllm)) = &start.engine else {
            panic!("vLLM for safetensors on a GPU: {start:#?}");
        };
        let files = vllm.model.as_ref().unwrap();
        assert!(files.files.iter().any(|f| f.ends_with(".safetensors")), "{files:#?}");
        assert!(files.files.contains(&"config.json".to_owned()));
        assert_eq!(vllm.reserved.len(), 1);
        assert_eq!(vllm.total, vec![24 << 30]);
    }
    let runs = &s.get("/v1/runs").await["data"];
    assert_eq!(runs[0]["id"], id.as_str());
    assert_eq!(runs[0]["steps_done"], 2);
    // The memory the engines really used is recorded beside the plan's estimate.
    let measured = s.get("/v1/measurements").await;
    assert_eq!(measured.as_array().unwrap().len(), 2, "{measured:#}");
    for m in measured.as_array().unwrap() {
        assert_eq!(m["measured_bytes"], 2u64 << 30);
        assert_eq!(m["gpus"], 1);
        assert!(m["estimated_bytes"].as_u64().unwrap() > 0);
    }

    // The instances stay warm: the next run of the same agents starts no new one.
    let instances = s.get("/v1/instances").await;
    assert_eq!(instances.as_array().unwrap().len(), 2, "{instances:#}");
    assert!(
        instances
            .as_array()
            .unwrap()
            .iter()
            .all(|i| i["run"].is_null() && i["state"] == "ready")
    );
    let run: Value = s
        .submit(TWO_AGENTS, json!({"topic": "again"}))
        .await
        .json()
        .await
        .unwrap();
    let run = s.wait_run(run["id"].as_str().unwrap(), ended).await;
    assert_eq!(run["state"], "succeeded", "{run:#}");
    assert_eq!(run["steps"][0]["output"], "echo: Write about again");
    assert_eq!(agent.starts().len(), 2, "warm instances were reused");
    assert!(run["steps"][0]["instance"].as_str().unwrap().starts_with(&id));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_attempts_are_retried_and_a_step_out_of_retries_fails_with_the_engine_error() {
    let s = setup(quick(), None).await;
    let engines = EngineBehaviour {
        fail_first: 2,
        ..EngineBehaviour::default()
    };
    let _agent = TestAgent::join(s.server.grpc_addr, TOKEN, "box", 2, engines.clone()).await;
    let run: Value = s.submit(TWO_AGENTS, json!({"topic": "x"})).await.json().await.unwrap();
    let run = s.wait_run(run["id"].as_str().unwrap(), ended).await;
    assert_eq!(run["state"], "succeeded", "{run:#}");
    assert_eq!(run["steps"][0]["attempts"], 3, "two failures, then success");

    // `review` has no retries: one failure fails the run, with the engine's words.
    engines.requests.store(0, Ordering::SeqCst);
    let failing = TWO_AGENTS.replace(", retries: 2", ", retries: 0");
    let run: Value = s.submit(&failing, json!({"topic": "x"})).await.json().await.unwrap();
    let run = s.wait_run(run["id"].as_str().unwrap(), ended).await;
    assert_eq!(run["state"], "failed");
    assert_eq!(run["steps"][0]["state"], "failed");
    let reason = run["reason"].as_str().unwrap();
    assert!(
        reason.contains("step `draft` failed") && reason.contains("CUDA out of memory"),
        "{reason}"
    );
    assert_eq!(run["steps"][1]["state"], "cancelled");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_queue_answers_429_with_retry_after_and_bad_submissions_say_why() {
    let s = setup(
        ExecutorConfig {
            queue_capacity: 2,
            ..quick()
        },
        None,
    )
    .await;
    // No agent: nothing can be placed, so runs wait in the queue with the reason.
    for _ in 0..2 {
        assert_eq!(s.submit(TWO_AGENTS, json!({"topic": "x"})).await.status(), 202);
    }
    let full = s.submit(TWO_AGENTS, json!({"topic": "x"})).await;
    assert_eq!(full.status(), 429);
    assert!(full.headers().get("retry-after").is_some());
    let body: Value = full.json().await.unwrap();
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("queue for priority 0 is full"),
        "{body}"
    );
    let runs = s.get("/v1/runs").await;
    let queued = &runs["data"][0];
    assert_eq!(queued["state"], "queued");
    let run = s
        .wait_run(queued["id"].as_str().unwrap(), |r| {
            r["reason"].as_str().is_some_and(|r| r != "waiting for admission")
        })
        .await;
    assert!(!run["reason"].as_str().unwrap().is_empty());

    let missing = s.submit(TWO_AGENTS, json!({})).await;
    assert_eq!(missing.status(), 400);
    let body: Value = missing.json().await.unwrap();
    assert_eq!(body["error"]["code"], "bad_request");
    assert_eq!(
        body["error"]["message"],
        "input `topic` is required (a string); help: pass --input topic=VALUE"
    );
    let invalid = s.submit("name: x\nagents: {}\n", json!({})).await;
    assert_eq!(invalid.status(), 422);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_run_stops_its_steps_and_instances() {
    let s = setup(quick(), None).await;
    let engines = EngineBehaviour {
        delay: Duration::from_secs(60),
        ..EngineBehaviour::default()
    };
    let _agent = TestAgent::join(s.server.grpc_addr, TOKEN, "box", 2, engines.clone()).await;
    let run: Value = s.submit(TWO_AGENTS, json!({"topic": "x"})).await.json().await.unwrap();
    let id = run["id"].as_str().unwrap().to_owned();
    s.wait_run(&id, |r| r["steps"][0]["state"] == "running").await;
    let response = s
        .http
        .post(s.url(&format!("/v1/runs/{id}/cancel")))
        .bearer_auth(API)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let run: Value = response.json().await.unwrap();
    assert_eq!(run["state"], "cancelled");
    assert!(
        run["steps"]
            .as_array()
            .unwrap()
            .iter()
            .all(|s| s["state"] == "cancelled")
    );
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while !s.get("/v1/instances").await.as_array().unwrap().is_empty() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "instances stopped after a cancel"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let missing = s
        .http
        .post(s.url("/v1/runs/r0/cancel"))
        .bearer_auth(API)
        .send()
        .await
        .unwrap();
    assert_eq!(missing.status(), 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn when_a_node_is_lost_its_instances_are_placed_elsewhere_and_the_run_continues() {
    let s = setup(quick(), None).await;
    let slow = EngineBehaviour {
        delay: Duration::from_millis(300),
        ..EngineBehaviour::default()
    };
    let first = TestAgent::join(s.server.grpc_addr, TOKEN, "alpha", 2, slow.clone()).await;
    let run: Value = s.submit(TWO_AGENTS, json!({"topic": "x"})).await.json().await.unwrap();
    let id = run["id"].as_str().unwrap().to_owned();
    s.wait_run(&id, |r| r["steps"][0]["state"] == "running").await;
    let second = TestAgent::join(s.server.grpc_addr, TOKEN, "beta", 2, EngineBehaviour::default()).await;
    drop(first);
    let run = s.wait_run(&id, ended).await;
    assert_eq!(run["state"], "succeeded", "{run:#}");
    assert!(!second.starts().is_empty(), "the instances moved to beta");
    assert_eq!(run["steps"][1]["output"], "echo: Review: echo: Write about x");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instance_logs_come_from_the_agent() {
    let s = setup(quick(), None).await;
    let engines = EngineBehaviour {
        delay: Duration::from_secs(60),
        ..EngineBehaviour::default()
    };
    let _agent = TestAgent::join(s.server.grpc_addr, TOKEN, "box", 2, engines).await;
    let run: Value = s.submit(TWO_AGENTS, json!({"topic": "x"})).await.json().await.unwrap();
    let id = run["id"].as_str().unwrap().to_owned();
    s.wait_run(&id, |r| r["steps"][0]["state"] == "running").await;
    let instances = s.get("/v1/instances").await;
    let name = instances[0]["name"].as_str().unwrap().to_owned();
    assert_eq!(instances[0]["state"], "ready");
    assert_eq!(instances[0]["measured_host_rss"], 1 << 20);
    let logs = s.get(&format!("/v1/instances/{name}/logs?tail=5")).await;
    assert_eq!(logs["lines"], json!([format!("log of {name}")]));
    let missing = s
        .http
        .get(s.url("/v1/instances/nope/logs"))
        .bearer_auth(API)
        .send()
        .await
        .unwrap();
    assert_eq!(missing.status(), 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remote_endpoint_agents_are_called_directly_beside_placed_ones() {
    let s = setup(quick(), None).await;
    let remote = EngineBehaviour::default();
    let tasks = skein_testkit::agent::Tasks::default();
    let url = skein_testkit::agent::fake_engine(remote.clone(), &tasks).await;
    let _agent = TestAgent::join(s.server.grpc_addr, TOKEN, "box", 1, EngineBehaviour::default()).await;
    let workflow = format!(
        "name: mixed\nagents:\n  local: {{ model: Qwen/Qwen2.5-0.5B-Instruct }}\n  hosted: {{ endpoint: {{ url: \"{url}\", model: big-model }} }}\nsteps:\n  - {{ id: a, agent: local, prompt: one }}\n  - {{ id: b, agent: hosted, after: [a], prompt: \"two {{{{ steps.a.output }}}}\" }}\n"
    );
    let run: Value = s.submit(&workflow, json!({})).await.json().await.unwrap();
    let run = s.wait_run(run["id"].as_str().unwrap(), ended).await;
    assert_eq!(run["state"], "succeeded", "{run:#}");
    assert_eq!(run["steps"][1]["output"], "echo: two echo: one");
    assert!(
        run["steps"][1]["instance"].is_null(),
        "no instance serves a remote agent"
    );
    assert_eq!(remote.requests.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_admitted_one_after_the_other_never_count_on_the_same_free_memory() {
    let s = setup(quick(), None).await;
    let slow = EngineBehaviour {
        delay: Duration::from_millis(1500),
        ..EngineBehaviour::default()
    };
    // One 24 GB GPU; the test agent's telemetry never shows engines' memory (like a
    // simulated GPU), so only the executor's own accounting keeps a second run off it.
    let agent = TestAgent::join(s.server.grpc_addr, TOKEN, "box", 1, slow).await;
    let big = |name: &str| {
        format!(
            "name: {name}\nagents:\n  a: {{ model: {{ repo: Qwen/Qwen2.5-7B-Instruct, min_precision: bf16, context: 32768, gpu: {{ models: [RTX 4090] }} }} }}\nsteps:\n  - {{ id: s, agent: a, prompt: hi }}\n"
        )
    };
    let first: Value = s.submit(&big("first"), json!({})).await.json().await.unwrap();
    let first = first["id"].as_str().unwrap().to_owned();
    s.wait_run(&first, |r| r["state"] == "running").await;
    let second: Value = s.submit(&big("second"), json!({})).await.json().await.unwrap();
    let second = second["id"].as_str().unwrap().to_owned();
    let waiting = s
        .wait_run(&second, |r| {
            r["reason"].as_str().is_some_and(|r| r != "waiting for admission")
        })
        .await;
    assert_eq!(waiting["state"], "queued", "{waiting:#}");
    // When the first run ends, the second one takes its warm instance.
    let first = s.wait_run(&first, ended).await;
    assert_eq!(first["state"], "succeeded");
    let second = s.wait_run(&second, ended).await;
    assert_eq!(second["state"], "succeeded", "{second:#}");
    assert_eq!(agent.starts().len(), 1, "one instance served both runs");
}

/// With preemption on, a higher-priority run that fits only on a lower-priority run's
/// GPU sends that run back to the queue: its instance stops, the higher-priority run
/// runs, and the preempted one is admitted again (on the warm instance) and goes on
/// where it was. The low run waits for an approval while it is preempted, so the test
/// does not race a step's end. A user other than the admin may not submit a priority
/// above the server's cap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_higher_priority_run_preempts_a_lower_one_which_runs_again_later() {
    let s = setup(
        ExecutorConfig {
            preempt: true,
            ..quick()
        },
        None,
    )
    .await;
    let quick_engines = EngineBehaviour {
        delay: Duration::from_millis(200),
        ..EngineBehaviour::default()
    };
    // One 24 GB GPU, which each run's instance fills.
    let agent = TestAgent::join(s.server.grpc_addr, TOKEN, "box", 1, quick_engines).await;
    let big = |name: &str, priority: i32, steps: &str| {
        format!(
            "name: {name}\nplacement: {{ priority: {priority} }}\nagents:\n  a: {{ model: {{ repo: Qwen/Qwen2.5-7B-Instruct, min_precision: bf16, context: 32768, gpu: {{ models: [RTX 4090] }} }} }}\nsteps:\n{steps}"
        )
    };
    let low_steps = "  - { id: s, agent: a, prompt: hi }\n  - { id: gate, after: [s], approval: \"Go on?\" }\n  - { id: t, agent: a, after: [gate], prompt: again }\n";
    let low: Value = s
        .submit(&big("low", -5, low_steps), json!({}))
        .await
        .json()
        .await
        .unwrap();
    let low = low["id"].as_str().unwrap().to_owned();
    s.wait_run(&low, |r| r["steps"][1]["state"] == "waiting").await;
    let high: Value = s
        .submit(&big("high", 5, "  - { id: s, agent: a, prompt: hi }\n"), json!({}))
        .await
        .json()
        .await
        .unwrap();
    let high = high["id"].as_str().unwrap().to_owned();
    // Back in the queue (its reason then says why it waits: the high run's GPU).
    let preempted = s.wait_run(&low, |r| r["state"] == "queued").await;
    assert_eq!(preempted["preempted_by"], json!([high]), "{preempted:#}");
    assert_eq!(preempted["steps"][0]["state"], "done", "{preempted:#}");
    let high = s.wait_run(&high, ended).await;
    assert_eq!(high["state"], "succeeded", "{high:#}");
    // Admitted again, it still waits for its approval; approved, it ends.
    s.wait_run(&low, |r| r["state"] == "running" && r["steps"][1]["state"] == "waiting")
        .await;
    let response = s
        .http
        .post(s.url(&format!("/v1/runs/{low}/steps/gate/approve")))
        .bearer_auth(API)
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200, "{}", response.text().await.unwrap());
    let low = s.wait_run(&low, ended).await;
    assert_eq!(low["state"], "succeeded", "{low:#}");
    assert_eq!(low["steps"][0]["attempts"], 1, "the step done before is not run again");
    assert!(
        high["finished_at"].as_str().unwrap() < low["finished_at"].as_str().unwrap(),
        "the preempting run ends first"
    );
    // Two starts: the low run's, stopped when preempted, and the high run's on its
    // GPU, which the low run takes over, warm, once the high one ended.
    let starts = agent.starts();
    assert_eq!(starts.len(), 2, "{starts:#?}");
    assert_eq!(low["steps"][2]["instance"], high["steps"][0]["instance"]);

    // A user's priority above the cap (0 by default) is refused, and says why.
    let user_token = s.token_for("ada").await;
    let response = s
        .http
        .post(s.url("/v1/runs"))
        .bearer_auth(&user_token)
        .json(&json!({"workflow": big("mine", 1, "  - { id: s, agent: a, prompt: hi }\n"), "name": "w.yaml"}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 403);
    let body: Value = response.json().await.unwrap();
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("users may set at most 0"),
        "{body:#}"
    );
}
