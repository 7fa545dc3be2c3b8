//! Agent loops against real MCP tool servers, through the real `skein server`: the
//! testkit's Rust `mcp-tools` (over stdio and streamable HTTP) and the Python one
//! written with the official SDK (over stdio). The model is an endpoint agent on
//! loopback that asks for one tool call per turn ([`WholeAnswer::tool_caller`]); the
//! tool servers, the MCP client, the durable record and the server are all real.
//!
//! The crash test kills the server (SIGKILL) many times while a loop runs and checks
//! the tool-call durability contract: no completed call is sent again, no result is
//! lost, and a call in flight at a crash is sent again only under `in_flight: retry`,
//! or under `in_flight: ask` once a person approved it.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use skein_testkit::endpoint::WholeAnswer;
use skein_testkit::lab::Rng;
use skein_testkit::mcp::{HttpToolServer, mcp_python, mcp_tools_path, python_mcp_server_script};
use skein_testkit::net::free_port;
use skein_testkit::rest::{RestApi, Restartable};
use skein_testkit::sessions::BareServer;

const TOKEN: &str = "tools-test-admin-token";
const PATIENCE: Duration = Duration::from_secs(120);

fn start(data: &Path, api: u16, extra: &[&str]) -> BareServer {
    let mut args = vec!["--endpoint-allow", "127.0.0.1/32"];
    args.extend_from_slice(extra);
    BareServer::start_with(
        Path::new(env!("CARGO_BIN_EXE_skein")),
        data,
        api,
        free_port(),
        TOKEN,
        Some(&data.with_extension("log")),
        &args,
    )
}

/// A server that may run the testkit's `mcp-tools`, killed and started again by the
/// crash tests.
fn restartable(data: PathBuf) -> Restartable {
    let allow = mcp_tools_path().to_string_lossy().into_owned();
    Restartable::start(
        Path::new(env!("CARGO_BIN_EXE_skein")),
        data,
        TOKEN,
        &["--endpoint-allow", "127.0.0.1/32", "--allow-tool-command", &allow],
    )
}

/// A workflow whose one step's agent (the model at `model`) may call `counter.count`
/// on the tool server `server` (YAML of its fields).
fn workflow(model: &str, server: &str, max_turns: u32) -> String {
    workflow_with(model, server, "count", max_turns)
}

/// [`workflow`] with the agent's tool `counter.TOOL`.
fn workflow_with(model: &str, server: &str, tool: &str, max_turns: u32) -> String {
    format!(
        "name: tools\ntool_servers:\n  counter:\n    {server}\nagents:\n  worker:\n    endpoint: {{ url: \"{model}\", model: m }}\n    tools: [counter.{tool}]\n    max_turns: {max_turns}\nsteps:\n  - {{ id: work, agent: worker, prompt: count, retries: 0 }}\n"
    )
}

/// A stdio server's YAML: `command` and the policy.
fn stdio(command: &[&Path], count_file: &Path, in_flight: &str) -> String {
    let mut words: Vec<String> = command.iter().map(|p| format!("\"{}\"", p.display())).collect();
    words.push("\"--count-file\"".to_owned());
    words.push(format!("\"{}\"", count_file.display()));
    format!("command: [{}]\n    in_flight: {in_flight}", words.join(", "))
}

fn lines(path: &Path) -> usize {
    std::fs::read_to_string(path).map_or(0, |text| text.lines().count())
}

/// Every tool call of step `work`'s loop.
fn calls(run: &Value) -> Vec<Value> {
    calls_of(&run["steps"][0])
}

/// Every tool call of the loop of `attempt`, a step or an item.
fn calls_of(attempt: &Value) -> Vec<Value> {
    attempt["turns"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|turn| turn["calls"].as_array().cloned().unwrap_or_default())
        .collect()
}

#[test]
fn an_agent_loop_calls_real_tool_servers_and_records_each_call() {
    let dir = tempfile::tempdir().unwrap();
    let model = WholeAnswer::tool_caller("counter__count", "{}", 3, Duration::ZERO);
    let rust = mcp_tools_path();
    let python = mcp_python();
    let script = python_mcp_server_script();
    let http_count = dir.path().join("http.count");
    let http = HttpToolServer::rust(&http_count, None);
    let port = free_port();
    let data = dir.path().join("data");
    let rust_arg = rust.to_string_lossy().into_owned();
    let python_arg = python.to_string_lossy().into_owned();
    let _server = start(
        &data,
        port,
        &["--allow-tool-command", &rust_arg, "--allow-tool-command", &python_arg],
    );
    let api = RestApi::new(port, TOKEN);
    api.wait_up();

    let rust_count = dir.path().join("rust.count");
    let python_count = dir.path().join("python.count");
    let cases: [(&str, String, &PathBuf); 3] = [
        ("rust over stdio", stdio(&[&rust], &rust_count, "retry"), &rust_count),
        (
            "python over stdio",
            stdio(&[&python, &script], &python_count, "fail"),
            &python_count,
        ),
        ("rust over HTTP", format!("url: \"{}\"", http.url()), &http_count),
    ];
    for (case, server, count_file) in cases {
        let id = api.submit(&workflow(&model.url(), &server, 10));
        let run = api.finished(&id);
        let log = std::fs::read_to_string(data.with_extension("log")).unwrap_or_default();
        assert_eq!(run["state"], "succeeded", "{case}: {run:#}\n{log}");
        assert_eq!(run["steps"][0]["output"], "done: 3", "{case}");
        assert_eq!(lines(count_file), 3, "{case}: each call reached the tool once");
        let calls = calls(&run);
        assert_eq!(calls.len(), 3, "{case}: {run:#}");
        for (i, call) in calls.iter().enumerate() {
            assert_eq!(call["name"], "counter__count", "{case}");
            assert_eq!((&call["server"], &call["tool"]), (&json!("counter"), &json!("count")));
            assert_eq!(call["state"], "returned", "{case}");
            assert_eq!(call["sends"], 1, "{case}");
            assert_eq!(call["result"], (i + 1).to_string(), "{case}");
            assert_eq!(call["is_error"], false, "{case}");
        }
    }
    // `skein run show --step` prints the loop: each call, its result and state.
    let ids: Vec<String> = api
        .call("/v1/runs", None)
        .map(|(_, page)| {
            page["data"]
                .as_array()
                .unwrap()
                .iter()
                .map(|r| r["id"].as_str().unwrap().to_owned())
                .collect()
        })
        .unwrap();
    let shown = std::process::Command::new(env!("CARGO_BIN_EXE_skein"))
        .args(["run", "show", &ids[0], "--step", "work", "--server", &api.base])
        .env("SKEIN_API_TOKEN", TOKEN)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&shown.stdout);
    assert!(
        shown.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&shown.stderr)
    );
    assert!(text.contains("step work (worker): done"), "{text}");
    for n in 1..=3 {
        assert!(text.contains(&format!("turn {n} at ")), "{text}");
        assert!(
            text.contains(&format!("counter__count({{}}) → {n}  [returned in ")),
            "{text}"
        );
    }
    assert!(text.contains("answer: done: 3"), "{text}");
    let missing = std::process::Command::new(env!("CARGO_BIN_EXE_skein"))
        .args(["run", "show", &ids[0], "--step", "nope", "--server", &api.base])
        .env("SKEIN_API_TOKEN", TOKEN)
        .output()
        .unwrap();
    assert!(!missing.status.success());
    assert!(String::from_utf8_lossy(&missing.stderr).contains("has no step `nope`; its steps: work"));

    // The model saw the tools as OpenAI functions, and each result under its call's id.
    let last = model.requests().last().cloned().unwrap();
    let body: Value = serde_json::from_str(last.split_once("\r\n\r\n").unwrap().1).unwrap();
    assert_eq!(body["tools"][0]["function"]["name"], "counter__count");
    let results: Vec<&Value> = body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "tool")
        .collect();
    assert_eq!(results.len(), 3);
    assert_eq!(results[2]["tool_call_id"], "call_2");
}

#[test]
fn a_stdio_tool_server_runs_only_if_the_admin_allowed_its_program() {
    let dir = tempfile::tempdir().unwrap();
    let model = WholeAnswer::tool_caller("counter__count", "{}", 1, Duration::ZERO);
    let count_file = dir.path().join("count");
    let port = free_port();
    let _server = start(&dir.path().join("data"), port, &[]);
    let api = RestApi::new(port, TOKEN);
    api.wait_up();
    let tools = mcp_tools_path();
    let text = workflow(&model.url(), &stdio(&[&tools], &count_file, "retry"), 5);
    // Refused at submission, pointing at the command, saying how to allow it.
    let (status, body) = api
        .call("/v1/runs", Some(json!({"workflow": text})))
        .expect("the server answers");
    assert_eq!(status, 422, "{body:#}");
    let diagnostic = &body["diagnostics"][0];
    let message = diagnostic.to_string();
    assert!(
        message.contains(&format!("--allow-tool-command {}", tools.display())) && message.contains("`counter`"),
        "{body:#}"
    );
    assert_eq!(diagnostic["line"], 4, "{body:#}");
    // A URL the egress policy refuses is refused the same way.
    let http = workflow(&model.url(), "url: \"http://169.254.169.254/mcp\"", 5);
    let (status, body) = api
        .call("/v1/runs", Some(json!({"workflow": http})))
        .expect("the server answers");
    assert_eq!(status, 422, "{body:#}");
    assert!(
        body.to_string().contains("this server does not call this address"),
        "{body:#}"
    );
    assert_eq!(lines(&count_file), 0, "nothing ran");
    assert!(model.requests().is_empty(), "the model was not called");
}

#[test]
fn kill_9_mid_loop_never_sends_a_completed_tool_call_again_nor_loses_a_result() {
    const ROUNDS: usize = 60;
    const KILLS: usize = 6;
    let dir = tempfile::tempdir().unwrap();
    // A model that takes a little while, so that the kills land inside the loop.
    let model = WholeAnswer::tool_caller("counter__count", "{}", ROUNDS, Duration::from_millis(25));
    let tools = mcp_tools_path();
    let count_file = dir.path().join("count");
    let mut lab = restartable(dir.path().join("data"));
    let id = lab.api.submit(&workflow(
        &model.url(),
        &stdio(&[&tools], &count_file, "retry"),
        ROUNDS as u32 + 1,
    ));

    let mut rng = Rng(0x0700_ca11_5eed);
    let mut kills = 0;
    while kills < KILLS {
        // Kill while the loop runs: once some calls returned, before it can end.
        std::thread::sleep(Duration::from_millis(50 + rng.below(200)));
        if lines(&count_file) >= ROUNDS {
            break;
        }
        lab.kill_and_restart();
        kills += 1;
    }
    let run = lab.api.finished(&id);
    assert_eq!(run["state"], "succeeded", "after {kills} kills: {run:#}\n{}", lab.log());
    assert!(kills >= 2, "the loop ended before the server was killed twice");
    let calls = calls(&run);
    // No result lost: every call the model asked for came back, in order.
    assert_eq!(calls.len(), ROUNDS, "{run:#}");
    for call in &calls {
        assert_eq!(call["state"], "returned", "{call:#}");
    }
    assert_eq!(
        run["steps"][0]["output"],
        format!("done: {}", calls[ROUNDS - 1]["result"].as_str().unwrap())
    );
    // A call is sent more than once only when it was in flight at a kill (at most one
    // a kill: the loop sends one call at a time), and never after its result was
    // recorded: the tool saw each call once, plus at most one a kill.
    let sends: u64 = calls.iter().map(|c| c["sends"].as_u64().unwrap()).sum();
    let resent = calls.iter().filter(|c| c["sends"].as_u64().unwrap() > 1).count();
    assert!(resent <= kills, "{resent} calls sent again after {kills} kills");
    let invocations = lines(&count_file);
    assert!(
        invocations >= ROUNDS && invocations as u64 <= sends && invocations <= ROUNDS + kills,
        "{invocations} invocations of the tool for {ROUNDS} calls, {sends} sends, {kills} kills"
    );
    eprintln!("{kills} kills, {invocations} invocations, {sends} sends, {resent} calls sent again");
}

#[test]
fn a_call_in_flight_at_a_kill_is_sent_again_under_retry_and_fails_its_attempt_under_fail() {
    let dir = tempfile::tempdir().unwrap();
    let model = WholeAnswer::tool_caller("counter__sleep", r#"{"ms": 1500}"#, 1, Duration::ZERO);
    let tools = mcp_tools_path();
    let mut lab = restartable(dir.path().join("data"));
    for policy in ["retry", "fail"] {
        let server_yaml = stdio(&[&tools], &dir.path().join("count"), policy);
        let id = lab.api.submit(&workflow_with(&model.url(), &server_yaml, "sleep", 3));
        // Kill while the sleep is in flight: recorded as sent, no result.
        until_in_flight(&lab, &id, calls, None);
        lab.kill_and_restart();
        let run = lab.api.finished(&id);
        let call = &calls(&run)[0];
        match policy {
            "retry" => {
                assert_eq!(run["state"], "succeeded", "{run:#}");
                assert_eq!(call["sends"], 2, "{call:#}");
                assert_eq!(call["result"], "slept 1500 ms");
                assert_eq!(run["steps"][0]["output"], "done: slept 1500 ms");
            }
            _ => {
                assert_eq!(run["state"], "failed", "{run:#}");
                let error = run["steps"][0]["error"].as_str().unwrap_or_default();
                assert!(
                    error.contains("in flight") && error.contains("in_flight: retry"),
                    "{error}"
                );
            }
        }
    }
}

/// Waits until the first call of run `id`'s loop (as `loop_calls` reads it) is recorded
/// sent with no result and, with a `count_file`, has reached the tool (its line is
/// written): the call is in flight.
fn until_in_flight(lab: &Restartable, id: &str, loop_calls: fn(&Value) -> Vec<Value>, count_file: Option<&Path>) {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let run = lab.api.run(id).unwrap_or_default();
        let sent = loop_calls(&run).first().is_some_and(|c| c["state"] == "sent");
        if sent && count_file.is_none_or(|f| lines(f) == 1) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the call never went out: {run:#}\nthe server's log:\n{}",
            lab.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Run `id` once it is running and waits for a person (its reason says so).
fn until_waiting(lab: &Restartable, id: &str) -> Value {
    lab.api.until(id, "waiting for approval", |run| {
        run["state"] == "running"
            && run["reason"]
                .as_str()
                .is_some_and(|r| r.starts_with("waiting for approval of step `work`"))
    })
}

/// The calls of item 0 of step `work`.
fn item_calls(run: &Value) -> Vec<Value> {
    calls_of(&run["steps"][0]["items"][0])
}

#[test]
fn a_call_in_flight_at_a_kill_under_ask_waits_for_a_person_who_sends_it_again_or_fails_the_attempt() {
    let dir = tempfile::tempdir().unwrap();
    let model = WholeAnswer::tool_caller("counter__sleep", r#"{"ms": 1500}"#, 1, Duration::ZERO);
    let tools = mcp_tools_path();
    let mut lab = restartable(dir.path().join("data"));
    for approve in [true, false] {
        // `sleep` writes its line in the count file before it sleeps: the tool's own
        // count of its invocations.
        let count_file = dir.path().join(format!("{approve}.count"));
        let server_yaml = stdio(&[&tools], &count_file, "ask");
        let id = lab.api.submit(&workflow_with(&model.url(), &server_yaml, "sleep", 3));
        until_in_flight(&lab, &id, calls, Some(&count_file));
        lab.kill_and_restart();

        // The step waits for a person, naming the call; so it does after another kill.
        let run = until_waiting(&lab, &id);
        let work = &run["steps"][0];
        assert_eq!(work["state"], "waiting", "{run:#}");
        assert_eq!(run["reason"], "waiting for approval of step `work`");
        assert_eq!(work["approval"]["in_flight"]["id"], "call_0", "{work:#}");
        let text = work["approval"]["text"].as_str().unwrap_or_default();
        for part in ["call_0 `counter__sleep`", r#"{"ms": 1500}"#, "Approve to send it again"] {
            assert!(text.contains(part), "{part:?} in {text}");
        }
        assert_eq!(calls(&run)[0]["state"], "sent");
        lab.kill_and_restart();
        let run = until_waiting(&lab, &id);
        assert_eq!(run["steps"][0]["approval"]["text"], text);
        let (ok, shown) = lab.cli(&["run", "show", &id, "--step", "work"]);
        assert!(
            ok && shown.contains("waiting for approval: tool call call_0"),
            "{shown}"
        );
        assert_eq!(lines(&count_file), 1, "nothing was sent while it waited");

        if approve {
            let (ok, said) = lab.cli(&["run", "approve", &id, "work", "--comment", "sleeping twice is fine"]);
            assert!(ok, "{said}");
            assert!(said.contains(&format!("run {id}: step work approved")), "{said}");
            let run = lab.api.finished(&id);
            assert_eq!(run["state"], "succeeded", "{run:#}\n{}", lab.log());
            let call = &calls(&run)[0];
            assert_eq!(
                (&call["state"], &call["sends"]),
                (&json!("returned"), &json!(2)),
                "{call:#}"
            );
            assert_eq!(run["steps"][0]["output"], "done: slept 1500 ms");
            assert_eq!(lines(&count_file), 2, "sent exactly once more");
            let decision = &run["steps"][0]["approval"]["decision"];
            assert_eq!(
                (&decision["approved"], &decision["by"]),
                (&json!(true), &json!("admin"))
            );
            assert_eq!(decision["comment"], "sleeping twice is fine");
        } else {
            let (ok, said) = lab.cli(&["run", "reject", &id, "work", "--comment", "it may have run"]);
            assert!(ok, "{said}");
            assert!(said.contains("rejected by admin: it may have run"), "{said}");
            let run = lab.api.finished(&id);
            assert_eq!(run["state"], "failed", "{run:#}");
            assert_eq!(run["steps"][0]["error"], "rejected by admin: it may have run");
            assert_eq!(lines(&count_file), 1, "never sent again");
            // Decided once: the step no longer waits.
            let (ok, refused) = lab.cli(&["run", "approve", &id, "work"]);
            assert!(!ok && refused.contains("failed"), "{refused}");
        }
    }
}

#[test]
fn a_for_each_item_whose_call_was_in_flight_under_ask_is_decided_by_its_index() {
    let dir = tempfile::tempdir().unwrap();
    let model = WholeAnswer::tool_caller("counter__sleep", r#"{"ms": 1500}"#, 1, Duration::ZERO);
    let tools = mcp_tools_path();
    let mut lab = restartable(dir.path().join("data"));
    let count_file = dir.path().join("count");
    let text = format!(
        "name: tools\ninputs: {{ things: {{ type: list, default: [one] }} }}\ntool_servers:\n  counter:\n    {}\nagents:\n  worker:\n    endpoint: {{ url: \"{}\", model: m }}\n    tools: [counter.sleep]\n    max_turns: 3\nsteps:\n  - {{ id: work, agent: worker, prompt: \"sleep for {{{{ item }}}}\", retries: 0, for_each: {{ over: inputs.things }} }}\n",
        stdio(&[&tools], &count_file, "ask"),
        model.url()
    );
    let id = lab.api.submit(&text);
    until_in_flight(&lab, &id, item_calls, Some(&count_file));
    lab.kill_and_restart();

    let run = until_waiting(&lab, &id);
    assert_eq!(run["reason"], "waiting for approval of step `work` item 0");
    assert_eq!(
        (&run["steps"][0]["state"], &run["steps"][0]["items"][0]["state"]),
        (&json!("running"), &json!("waiting"))
    );
    assert_eq!(run["steps"][0]["items"][0]["approval"]["in_flight"]["id"], "call_0");
    // The step itself does not wait: the item is to be named.
    let (status, body) = lab
        .api
        .call(&format!("/v1/runs/{id}/steps/work/approve"), Some(json!({})))
        .unwrap();
    assert_eq!(status, 409, "{body:#}");
    assert!(body.to_string().contains("item 0 waits for approval"), "{body:#}");
    let (status, body) = lab
        .api
        .call(&format!("/v1/runs/{id}/steps/work/approve"), Some(json!({"item": 3})))
        .unwrap();
    assert_eq!(status, 404, "{body:#}");
    let (ok, shown) = lab.cli(&["run", "show", &id]);
    assert!(
        ok && shown.contains(&format!("skein run approve {id} work --item 0")),
        "{shown}"
    );

    let (ok, said) = lab.cli(&["run", "approve", &id, "work", "--item", "0"]);
    assert!(
        ok && said.contains(&format!("run {id}: step work item 0 approved")),
        "{said}"
    );
    let run = lab.api.finished(&id);
    assert_eq!(run["state"], "succeeded", "{run:#}\n{}", lab.log());
    let call = &item_calls(&run)[0];
    assert_eq!(
        (&call["state"], &call["sends"]),
        (&json!("returned"), &json!(2)),
        "{call:#}"
    );
    assert_eq!(run["steps"][0]["output"], json!(["done: slept 1500 ms"]).to_string());
    assert_eq!(lines(&count_file), 2, "sent exactly once more");
}

/// The `tool_choice` of each model call the loop made, in order, and how many tools
/// it offered.
fn tool_choices(model: &WholeAnswer) -> Vec<(Value, usize)> {
    model
        .requests()
        .iter()
        .map(|request| {
            let body: Value = serde_json::from_str(request.split_once("\r\n\r\n").unwrap().1).unwrap();
            (
                body["tool_choice"].clone(),
                body["tools"].as_array().map_or(0, Vec::len),
            )
        })
        .collect()
}

#[test]
fn an_agents_tool_choice_holds_for_its_loops_first_model_call_only() {
    let dir = tempfile::tempdir().unwrap();
    let tools = mcp_tools_path();
    let allow = tools.to_string_lossy().into_owned();
    let port = free_port();
    let _server = start(&dir.path().join("data"), port, &["--allow-tool-command", &allow]);
    let api = RestApi::new(port, TOKEN);
    api.wait_up();
    let server = stdio(&[&tools], &dir.path().join("count"), "retry");

    // One tool named: the first call is offered that tool alone, and `required` (which
    // every engine enforces); later calls every tool, and `auto` until the last call,
    // which must answer.
    let model = WholeAnswer::tool_caller("counter__count", "{}", 2, Duration::ZERO);
    let text = workflow_with(&model.url(), &server, "echo, counter.count", 4).replace(
        "    max_turns: 4\n",
        "    max_turns: 4\n    tool_choice: counter.count\n",
    );
    let run = api.finished(&api.submit(&text));
    assert_eq!(run["state"], "succeeded", "{run:#}");
    assert_eq!(
        tool_choices(&model),
        [(json!("required"), 1), (json!("auto"), 2), (json!("auto"), 2)]
    );

    // `required`, with two calls: the second is the last, and must answer.
    let model = WholeAnswer::tool_caller("counter__count", "{}", 1, Duration::ZERO);
    let text = workflow(&model.url(), &server, 2)
        .replace("    max_turns: 2\n", "    max_turns: 2\n    tool_choice: required\n");
    let run = api.finished(&api.submit(&text));
    assert_eq!(run["state"], "succeeded", "{run:#}");
    assert_eq!(tool_choices(&model), [(json!("required"), 1), (json!("none"), 1)]);
}
