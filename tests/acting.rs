//! Steps that act, through the real `skein server` and CLI: a structured output
//! (validated, retried when the answer does not fit its schema, its fields read by a
//! later step), a `for_each` fan-out over those fields, and an approval decided with
//! `skein run approve`. The model is an endpoint agent on loopback that answers by
//! prompt ([`WholeAnswer::answering`]) and keeps every request it was sent.
//!
//! The server is killed (SIGKILL) each time another item is recorded done, and while
//! the approval waits: items recorded done are never sent again (only the items that
//! were in flight at a kill are), and the approval still waits after the restart.
//!
//! The shipped example, `workflows/acting.yaml`, runs unchanged on a real model: the
//! Qwen2 conversion of SmolLM2-135M served by the mock hub under the example's
//! repository id, on the built-in engine of a CPU-only agent, with the project's
//! `mcp-tools` as its tool server.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use serde_json::{Value, json};
use skein_testkit::endpoint::WholeAnswer;
use skein_testkit::lab::{Lab, stderr, stdout};
use skein_testkit::rest::Restartable;
use skein_testkit::smollm2;

const TOKEN: &str = "acting-test-admin-token";

fn server(data: PathBuf) -> Restartable {
    Restartable::start(
        Path::new(env!("CARGO_BIN_EXE_skein")),
        data,
        TOKEN,
        &["--endpoint-allow", "127.0.0.1/32"],
    )
}

const TOPICS: [&str; 8] = ["owls", "bats", "moths", "newts", "voles", "larks", "hares", "crabs"];

fn workflow(model: &str) -> String {
    format!(
        r#"
name: acting
agents:
  writer: {{ endpoint: {{ url: "{model}", model: m }} }}
steps:
  - id: plan
    agent: writer
    prompt: "plan"
    retries: 1
    output_schema:
      type: object
      properties:
        topics: {{ type: array, items: {{ type: string }} }}
      required: [topics]
  - id: each
    agent: writer
    after: [plan]
    for_each: {{ over: steps.plan.output.json.topics, max_parallel: 2 }}
    prompt: "write about {{{{ item }}}}"
  - id: sign
    after: [each]
    approval:
      text: "Publish {{{{ steps.each.output.json.len() }}}} pieces?"
      timeout: 1h
  - id: final
    agent: writer
    after: [sign]
    prompt: "final: {{{{ steps.sign.output }}}} / {{{{ steps.plan.output.json.topics[0] }}}}"
"#
    )
}

#[test]
fn a_structured_fan_out_and_an_approval_run_through_kills() {
    let dir = tempfile::tempdir().unwrap();
    // The plan's first answer is not JSON: the attempt fails the schema and is retried.
    let plans = AtomicUsize::new(0);
    let model = WholeAnswer::answering(Duration::from_millis(300), move |prompt| match prompt {
        "plan" if plans.fetch_add(1, Ordering::SeqCst) == 0 => "Sure! Topics: owls, bats".to_owned(),
        "plan" => json!({ "topics": TOPICS }).to_string(),
        other => format!("done {other}"),
    });
    let mut server = server(dir.path().join("data"));
    let (status, body) = server
        .api
        .call("/v1/runs", Some(json!({ "workflow": workflow(&model.url()) })))
        .unwrap();
    assert!(status == 201 || status == 202, "{status}: {body:#}");
    let id = body["id"].as_str().unwrap().to_owned();

    // Kill the server each time another item is recorded done, while items remain.
    let mut done_before_kills: Vec<String> = Vec::new();
    let mut sends_when_done: BTreeMap<String, usize> = BTreeMap::new();
    let mut kills = 0;
    loop {
        let run = server.api.until(&id, "an item finishing", |run| {
            let each = &run["steps"][1];
            let done = items_done(each).len();
            done > done_before_kills.len() || each["state"] == "done" || run["state"] == "failed"
        });
        assert_ne!(run["state"], "failed", "{run:#}");
        let each = &run["steps"][1];
        if each["state"] == "done" {
            break;
        }
        done_before_kills = items_done(each);
        // The sends of each item recorded done: none may come after.
        let prompts = model.prompts();
        for done in &done_before_kills {
            let sent = prompts.iter().filter(|p| *p == done).count();
            sends_when_done.entry(done.clone()).or_insert(sent);
        }
        server.kill_and_restart();
        kills += 1;
    }
    assert!(kills >= 3, "only {kills} kills landed during the fan-out");

    // The plan's first answer failed its schema; the second was kept, compactly.
    let run = server.api.run(&id).unwrap();
    let plan = &run["steps"][0];
    assert_eq!(plan["attempts"], 2, "{plan:#}");
    assert_eq!(plan["output"], json!({ "topics": TOPICS }).to_string());
    // Every item ran, in order in the joined output; none recorded done ran twice.
    let each = &run["steps"][1];
    let expected: Vec<String> = TOPICS.iter().map(|t| format!("done write about {t}")).collect();
    assert_eq!(each["output"], serde_json::to_string(&expected).unwrap());
    let prompts = model.prompts();
    for (done, then) in &sends_when_done {
        let sent = prompts.iter().filter(|p| *p == done).count();
        assert_eq!(sent, *then, "`{done}` was sent again after it was recorded done");
    }
    // Each item was sent once, or again after a kill that interrupted it.
    for topic in TOPICS {
        let sent = prompts.iter().filter(|p| **p == format!("write about {topic}")).count();
        assert!((1..=1 + kills).contains(&sent), "{topic}: sent {sent} times");
    }
    for topic in TOPICS {
        assert!(prompts.contains(&format!("write about {topic}")), "{topic} never sent");
    }

    // The approval waits, across a kill, with its text.
    let run = server
        .api
        .until(&id, "the approval waiting", |run| run["steps"][2]["state"] == "waiting");
    assert_eq!(run["reason"], "waiting for approval of step `sign`");
    assert_eq!(run["steps"][2]["prompt"], "Publish 8 pieces?");
    server.kill_and_restart();
    let run = server.api.until(&id, "the approval waiting again", |run| {
        run["state"] == "running" && run["steps"][2]["state"] == "waiting"
    });
    assert!(run["steps"][2]["approval"]["deadline"].is_string(), "{run:#}");
    let (ok, shown) = server.cli(&["run", "show", &id]);
    assert!(ok, "{shown}");
    assert!(shown.contains(&format!("skein run approve {id} sign")), "{shown}");

    // A step that is not an approval takes no decision; the approval does.
    let (ok, refused) = server.cli(&["run", "approve", &id, "plan"]);
    assert!(!ok && refused.contains("not an approval step"), "{refused}");
    let (ok, approved) = server.cli(&["run", "approve", &id, "sign", "--comment", "ship it"]);
    assert!(ok, "{approved}");
    let run = server.api.until(&id, "the run ending", |run| run["state"] != "running");
    assert_eq!(run["state"], "succeeded", "{run:#}");
    let sign = &run["steps"][2];
    assert_eq!(sign["approval"]["decision"]["by"], "admin");
    assert_eq!(sign["approval"]["decision"]["comment"], "ship it");
    assert_eq!(run["steps"][3]["output"], "done final: ship it / owls");
}

#[test]
fn a_rejection_fails_the_run_and_says_who() {
    let dir = tempfile::tempdir().unwrap();
    let model = WholeAnswer::answering(Duration::ZERO, |_| json!({ "topics": ["a"] }).to_string());
    let server = server(dir.path().join("data"));
    let (_, body) = server
        .api
        .call("/v1/runs", Some(json!({ "workflow": workflow(&model.url()) })))
        .unwrap();
    let id = body["id"].as_str().unwrap().to_owned();
    server
        .api
        .until(&id, "the approval waiting", |run| run["steps"][2]["state"] == "waiting");
    let (status, run) = server
        .api
        .call(
            &format!("/v1/runs/{id}/steps/sign/reject"),
            Some(json!({"comment": "not now"})),
        )
        .unwrap();
    assert_eq!(status, 200, "{run:#}");
    assert_eq!(run["state"], "failed");
    assert_eq!(run["reason"], "step `sign` failed: rejected by admin: not now");
    // Decided once: a second decision is a conflict that says why.
    let (status, body) = server
        .api
        .call(&format!("/v1/runs/{id}/steps/sign/approve"), Some(json!({})))
        .unwrap();
    assert_eq!(status, 409, "{body:#}");
}

#[test]
fn the_shipped_acting_example_runs_on_a_real_model_and_a_real_tool_server() {
    // The example's model, as the hub would serve it: a real (small) Qwen2 checkpoint
    // with Qwen2.5's chat template.
    let repo = smollm2::qwen2_5_stand_in(Path::new(env!("CARGO_TARGET_TMPDIR")), "Qwen/Qwen2.5-0.5B-Instruct");
    // Its tool server is `target/release/mcp-tools`, relative to where the server runs.
    let root = tempfile::tempdir().unwrap();
    let tools = root.path().join("target/release/mcp-tools");
    std::fs::create_dir_all(tools.parent().unwrap()).unwrap();
    std::os::unix::fs::symlink(skein_testkit::mcp::mcp_tools_path(), &tools).unwrap();
    let lab = Lab::with_repos(env!("CARGO_BIN_EXE_skein"), vec![repo])
        .server_dir(root.path())
        .server_args(&["--allow-tool-command", "target/release/mcp-tools"]);
    let _server = lab.server();
    let _agent = lab.agent("cpu-node");
    lab.nodes_up(1);

    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("workflows/acting.yaml");
    let submitted = lab.cli(&["submit", example.to_str().unwrap()]);
    assert!(submitted.status.success(), "{}", stderr(&submitted));
    let id = stdout(&submitted).trim().to_owned();

    // A real model on two CPU cores writes the plan and prices every part.
    let deadline = std::time::Instant::now() + Duration::from_secs(900);
    let run = loop {
        let run = lab.get_or_null(&format!("/v1/runs/{id}"));
        let ended = matches!(run["state"].as_str(), Some("succeeded" | "failed" | "cancelled"));
        if ended || run["steps"][2]["state"] == "waiting" {
            break run;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the plan and the prices took over 15 minutes: {run:#}\n{}",
            lab.logs(60)
        );
        std::thread::sleep(Duration::from_millis(500));
    };
    assert_eq!(run["steps"][2]["state"], "waiting", "{run:#}\n{}", lab.logs(60));
    let plan = &run["steps"][0];
    let parts: Value = serde_json::from_str(plan["output"].as_str().unwrap()).expect("the plan is JSON");
    let parts = parts["parts"].as_array().unwrap_or_else(|| panic!("{plan:#}"));
    assert!((1..=8).contains(&parts.len()), "{plan:#}");
    // One priced item per part, each an agent loop offered the tool.
    let price = &run["steps"][1];
    let items = price["items"].as_array().unwrap_or_else(|| panic!("{price:#}"));
    assert_eq!(items.len(), parts.len(), "{price:#}");
    assert!(items.iter().all(|i| i["state"] == "done"), "{price:#}");
    let priced: Vec<Value> = serde_json::from_str(price["output"].as_str().unwrap()).expect("a joined list");
    assert_eq!(priced.len(), parts.len(), "{price:#}");
    let text = run["steps"][2]["prompt"].as_str().unwrap_or_default();
    assert!(
        text.starts_with(&format!("Buy {} parts priced [", parts.len())),
        "{text}"
    );

    // A person reads the question and approves it from the CLI.
    let shown = lab.cli(&["run", "show", &id]);
    assert!(
        stdout(&shown).contains(&format!("skein run approve {id} sign_off")),
        "{}",
        stdout(&shown)
    );
    let approved = lab.cli(&["run", "approve", &id, "sign_off", "--comment", "go ahead"]);
    assert!(approved.status.success(), "{}", stderr(&approved));
    let run = loop {
        let run = lab.get_or_null(&format!("/v1/runs/{id}"));
        if run["state"] == "succeeded" || run["state"] == "failed" {
            break run;
        }
        assert!(std::time::Instant::now() < deadline, "the summary did not end: {run:#}");
        std::thread::sleep(Duration::from_millis(500));
    };
    assert_eq!(run["state"], "succeeded", "{run:#}\n{}", lab.logs(60));
    assert_eq!(run["steps"][2]["approval"]["decision"]["comment"], "go ahead");
    assert!(
        run["steps"][3]["output"].as_str().is_some_and(|o| !o.trim().is_empty()),
        "{run:#}"
    );
}

/// The prompts of the items of `each` recorded done.
fn items_done(each: &Value) -> Vec<String> {
    each["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|i| i["state"] == "done")
        .map(|i| i["prompt"].as_str().unwrap_or_default().to_owned())
        .collect()
}
