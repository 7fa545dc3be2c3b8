//! The server's tasks have an owner: when it stops, the executor's (admission, each
//! run's), the reflexes' (the watcher, each run's actor) and each agent's stream end on
//! the shutdown token, so the drain finishes without stopping anything by force; the
//! run stopped between its steps resumes after a restart on the same store.

mod common;

use std::time::Duration;

use common::{PATIENCE, TOKEN, quick, setup};
use serde_json::{Value, json};
use skein_orchestrator::server::DRAIN_TIMEOUT;
use skein_testkit::agent::{EngineBehaviour, TestAgent};

/// One step, whose engine answers long after the test ends, and a reflex (so that the
/// run has an actor).
const SLOW: &str = r#"
name: slow
agents:
  writer: { model: Qwen/Qwen2.5-0.5B-Instruct }
steps:
  - { id: draft, agent: writer, prompt: "Write" }
reflexes:
  - name: hot
    when: 'gpu.util > 0.8'
    scope: { agent: writer }
    do: [ notify ]
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopping_ends_every_task_on_the_token_and_the_run_in_flight_resumes_after_a_restart() {
    let data = tempfile::tempdir().unwrap();
    let db = data.path().join("db");
    let s = setup(quick(), Some(&db)).await;
    let stuck = EngineBehaviour {
        delay: Duration::from_secs(3600),
        ..EngineBehaviour::default()
    };
    let agent = TestAgent::join(s.server.grpc_addr, TOKEN, "box", 2, stuck).await;
    s.wait_nodes(1).await;
    let run: Value = s.submit(SLOW, json!({})).await.json().await.unwrap();
    let id = run["id"].as_str().unwrap().to_owned();
    s.wait_run(&id, |r| r["steps"][0]["state"] == "running").await;
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while !s.server.reflexes.runs().contains(&id) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the run's reflexes never went live"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // A hang fails here (past the drain timeout nothing is waited for, and a generous
    // bound catches a hang in the shutdown itself); it is no speed assertion.
    let stopped = tokio::time::timeout(DRAIN_TIMEOUT * 3, s.server.shutdown())
        .await
        .expect("the shutdown hung")
        .unwrap();
    assert!(
        stopped.drained,
        "every task ended on the token within the drain timeout (none was stopped by force)"
    );
    drop(agent);
    drop(s.http);

    // The run was left as last recorded: it resumes at the next start and finishes.
    let s = setup(quick(), Some(&db)).await;
    let _agent = TestAgent::join(s.server.grpc_addr, TOKEN, "box", 2, EngineBehaviour::default()).await;
    let run = s
        .wait_run(&id, |r| {
            matches!(r["state"].as_str(), Some("succeeded" | "failed" | "cancelled"))
        })
        .await;
    assert_eq!(run["state"], "succeeded", "{run:#}");
    assert_eq!(run["steps"][0]["output"], "echo: Write");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_server_counts_no_dropped_decision_and_drains_with_an_agent_connected() {
    let s = setup(quick(), None).await;
    let agent = TestAgent::join(s.server.grpc_addr, TOKEN, "box", 1, EngineBehaviour::default()).await;
    s.wait_nodes(1).await;
    let metrics = s
        .http
        .get(s.url("/metrics"))
        .bearer_auth(common::API)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains(
            "\n# TYPE skein_reflex_decisions_dropped_total counter\nskein_reflex_decisions_dropped_total 0\n"
        ),
        "{metrics}"
    );
    let stopped = tokio::time::timeout(DRAIN_TIMEOUT * 3, s.server.shutdown())
        .await
        .expect("the shutdown hung")
        .unwrap();
    assert!(stopped.drained, "the agent's stream ended with the server");
    drop(agent);
}
