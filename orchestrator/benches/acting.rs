//! Issue 29's numbers for steps that act, each against a baseline in the same run.
//!
//! 1. Agent-loop overhead per tool round trip. The baseline is a direct MCP `call_tool`
//!    of the testkit's `mcp-tools` `echo` over stdio (rmcp, no Skein code). The measured
//!    path is one round of the executor's agent loop (`run/executor/act.rs`) with one
//!    tool call, as it runs there: the turn (its first call recorded sent with it) and
//!    the call's `Returned` each sent to the run's task over a channel, which applies
//!    it to the run record (`RunRecord::record_loop`) and writes the run's head and
//!    the step's loop to sled (`RunStore::put`), flushed, before acknowledging; the call itself through [`ToolBox::call`] to a second `mcp-tools`
//!    process; the conversation grown and the next request built. The model is left
//!    out (it is not the loop's cost). Printed: p50 and p99 of the direct call, of the
//!    whole round, and of the round less its own tool call (the overhead, timed per
//!    round). The two kinds of call alternate, so both see the same machine. A step's
//!    loop holds at most `DEFAULT_MAX_TURNS` turns; the record starts a fresh attempt
//!    after that many rounds, as a real step would end.
//! 2. Scheduling overhead per `for_each` item on a warm instance: a run record with one
//!    step over 1,000 items, `max_parallel` 4, driven the way the executor's run task
//!    does per finished item: `complete_attempt`, `advance` (which starts the next
//!    item), `set_instance`, then the run written to sled and flushed
//!    (`RunStore::put`: the head and the items that changed, each under its own key).
//!    The per-item cost is printed for the first and last hundred items, so a cost
//!    that grew with the items done would show; serialising the whole record, what
//!    each write cost when the record was one value, is timed apart for comparison.
//!    The baseline is one flushed write of a 2 KB record, the floor of any durable
//!    step.
//!
//! `cargo bench -p skein-orchestrator --bench acting` (`-- --quick` for fewer rounds).
//! Under `cargo test` it runs a few rounds of each, as a check that it works.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rmcp::ServiceExt;
use rmcp::model::CallToolRequestParams;
use rmcp::transport::TokioChildProcess;
use serde_json::{Value, json};
use skein_dsl::expr::Evaluator;
use skein_dsl::ir::{DEFAULT_MAX_PARALLEL, DEFAULT_MAX_TURNS, Expr, ForEach, Template};
use skein_orchestrator::base::unix_ms;
use skein_orchestrator::egress::{EgressPolicy, EgressRules};
use skein_orchestrator::engine_client::{Clients, Usage};
use skein_orchestrator::run::record::{LoopChange, Next, RunRecord, StepState, ToolCall, Turn, typed_inputs};
use skein_orchestrator::run::stored::RunStore;
use skein_orchestrator::secrets::{Secrets, SecretsKey};
use skein_orchestrator::store::{Db, Tree};
use skein_orchestrator::tools::{ToolAccess, ToolBox};
use tokio::sync::{mpsc, oneshot, watch};

const TOOL_TIMEOUT: Duration = Duration::from_secs(30);

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let at = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[at.min(sorted.len() - 1)]
}

fn ms(d: Duration) -> String {
    format!("{:.3} ms", d.as_secs_f64() * 1e3)
}

fn summary(name: &str, mut samples: Vec<Duration>) -> (Duration, Duration) {
    samples.sort();
    let (p50, p99) = (percentile(&samples, 0.5), percentile(&samples, 0.99));
    println!(
        "  {name:<44} p50 {:>10}  p99 {:>10}  max {:>10}  (n = {})",
        ms(p50),
        ms(p99),
        ms(*samples.last().expect("samples")),
        samples.len()
    );
    (p50, p99)
}

/// A change for the run's task, as the executor's loops send them.
type Change = (LoopChange, oneshot::Sender<bool>);

/// The run's task: applies each change to the record and writes it, flushed, before
/// acknowledging (as `drive.rs` does); a step that has had `DEFAULT_MAX_TURNS` turns
/// starts a fresh attempt.
async fn run_task(mut run: RunRecord, runs: RunStore, mut changes: mpsc::Receiver<Change>) {
    let (notify, _watch) = watch::channel((0u64, String::new()));
    while let Some((change, written)) = changes.recv().await {
        if let LoopChange::Turn(_) = &change
            && let Some(step) = run.steps.iter_mut().find(|s| s.id == "go")
            && step.turns.len() >= DEFAULT_MAX_TURNS as usize
        {
            step.turns.clear();
            run.changed.turns_of.insert("go".to_owned());
        }
        let recorded = run.record_loop("go", None, change);
        runs.put(&mut run).await.expect("write the run");
        notify.send_modify(|(n, last)| {
            *n = n.wrapping_add(1);
            run.id.clone_into(last);
        });
        let _ = written.send(recorded);
    }
}

async fn record(changes: &mpsc::Sender<Change>, change: LoopChange) {
    let (ack, written) = oneshot::channel();
    changes.send((change, ack)).await.expect("the run's task");
    assert!(written.await.expect("an acknowledgement"), "the change was recorded");
}

fn mcp_command(count_file: &std::path::Path) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(skein_testkit::mcp::mcp_tools_path());
    cmd.arg("--count-file").arg(count_file).env_clear().kill_on_drop(true);
    cmd
}

async fn tool_round_trip(rounds: usize) {
    let dir = tempfile::tempdir().expect("temp dir");
    let db = Db::open(&dir.path().join("db")).expect("db");
    let runs = RunStore::open(&db).expect("the run store");
    let count_file = dir.path().join("count");
    let tools = skein_testkit::mcp::mcp_tools_path();
    let yaml = format!(
        "name: act\ntool_servers:\n  s: {{ command: [{tools}, --count-file, {count}] }}\nagents:\n  a:\n    endpoint: {{ url: \"https://api.example.org/v1\", model: m }}\n    tools: [s.echo]\nsteps:\n  - {{ id: go, agent: a, prompt: \"look it up\" }}\n",
        tools = tools.display(),
        count = count_file.display()
    );
    let workflow = skein_dsl::parse("act.yaml", &yaml)
        .workflow
        .expect("the workflow parses");
    let secrets = Secrets::open(&db, &SecretsKey::random().expect("key")).expect("secrets");
    let access = ToolAccess {
        commands: Arc::new(vec![PathBuf::from(&tools)]),
        clients: Clients::new(Arc::new(EgressPolicy::new(EgressRules::default(), Vec::new())), secrets),
    };
    let toolbox = ToolBox::connect(&workflow, "a", "alice", &access)
        .await
        .expect("the tool box");
    let inputs = typed_inputs(&workflow, &BTreeMap::new()).expect("inputs");
    let mut run = RunRecord::new("r1".to_owned(), "alice".to_owned(), workflow, inputs, unix_ms());
    let evaluator = Evaluator::default();
    assert_eq!(run.advance(&evaluator, unix_ms()).len(), 1);
    runs.put(&mut run).await.expect("write the run");
    let (changes, changed) = mpsc::channel(64);
    let task = tokio::spawn(run_task(run, runs, changed));

    // The baseline: a client of its own to its own `mcp-tools`, no Skein code between.
    let (child, _) = TokioChildProcess::builder(mcp_command(&count_file))
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("start mcp-tools");
    let direct = ().serve(child).await.expect("the MCP handshake");

    let arguments = r#"{"text":"the weather in Lisbon"}"#;
    let request = json!({"messages": [
        {"role": "system", "content": "You answer with the tools you have."},
        {"role": "user", "content": "look it up"},
    ], "stream": false, "tools": toolbox.definitions()});
    let mut body = request.clone();
    let (mut baseline, mut round, mut overhead) = (Vec::new(), Vec::new(), Vec::new());
    for n in 0..rounds {
        // The direct call.
        let args: serde_json::Map<String, Value> = serde_json::from_str(arguments).expect("object");
        let at = Instant::now();
        let result = direct
            .call_tool(CallToolRequestParams::new("echo").with_arguments(args))
            .await
            .expect("the direct call");
        baseline.push(at.elapsed());
        assert!(result.is_error != Some(true));

        // One round of the loop: the model has just asked for one call.
        let t = n % DEFAULT_MAX_TURNS as usize;
        if t == 0 {
            body = request.clone();
        }
        let at = Instant::now();
        let resolved = toolbox
            .resolve("s__echo")
            .map(|offered| (offered.server.clone(), offered.tool.clone()));
        let mut turn = Turn {
            content: None,
            calls: vec![ToolCall::pending(
                format!("call_{n}"),
                "s__echo".to_owned(),
                arguments.to_owned(),
                resolved,
            )],
            at: unix_ms(),
            usage: Some(Usage {
                prompt_tokens: 120,
                completion_tokens: 18,
            }),
        };
        // The turn and the sending of its first call are one write, as in the loop.
        let Ok(Value::Object(args)) = serde_json::from_str::<Value>(&turn.calls[0].arguments) else {
            panic!("arguments are an object");
        };
        turn.calls[0].mark_sent(unix_ms());
        record(&changes, LoopChange::Turn(turn.clone())).await;
        let call = &turn.calls[0];
        let calls: Vec<Value> = turn
            .calls
            .iter()
            .map(|c| json!({"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}))
            .collect();
        push(
            &mut body,
            json!({"role": "assistant", "content": turn.content, "tool_calls": calls}),
        );
        let (server, tool) = (
            call.server.as_deref().expect("server"),
            call.tool.as_deref().expect("tool"),
        );
        let tool_at = Instant::now();
        let outcome = toolbox.call(server, tool, args, TOOL_TIMEOUT).await.expect("the call");
        let tool_time = tool_at.elapsed();
        record(
            &changes,
            LoopChange::Returned {
                turn: t,
                call: 0,
                result: outcome.text.clone(),
                is_error: outcome.is_error,
                at: unix_ms(),
            },
        )
        .await;
        push(
            &mut body,
            json!({"role": "tool", "tool_call_id": call.id, "content": outcome.text}),
        );
        body["tool_choice"] = json!("auto");
        // The next model call's request.
        let next = body.clone();
        let whole = at.elapsed();
        std::hint::black_box(next);
        round.push(whole);
        overhead.push(whole.saturating_sub(tool_time));
    }
    drop(changes);
    task.await.expect("the run's task");
    toolbox.close().await;
    let _ = direct.cancel().await;

    println!(
        "agent loop, one tool round trip ({rounds} rounds, echo over stdio MCP, run written to sled and flushed 2x per round):"
    );
    let (b50, b99) = summary("direct MCP call_tool (baseline)", baseline);
    let (r50, r99) = summary("loop round: records + ToolBox::call", round);
    let (o50, o99) = summary("loop overhead per round (round - its call)", overhead);
    println!(
        "  round - direct: p50 {}  p99 {};  overhead p99 vs 2 ms target: {}",
        ms(r50.saturating_sub(b50)),
        ms(r99.saturating_sub(b99)),
        if o99 <= Duration::from_millis(2) {
            "within"
        } else {
            "OVER"
        }
    );
    let _ = o50;
}

fn push(body: &mut Value, message: Value) {
    if let Some(messages) = body["messages"].as_array_mut() {
        messages.push(message);
    }
}

fn template(text: &str) -> Template {
    skein_dsl::template::unchecked(text).expect("a template")
}

/// A run whose one step runs over `items` topics, `DEFAULT_MAX_PARALLEL` at once.
fn fan_out_run(items: usize) -> RunRecord {
    let text = "name: fan\ninputs: { topics: { type: list } }\nagents: { a: { model: Qwen/Qwen2.5-0.5B-Instruct } }\nsteps:\n  - { id: each, agent: a, prompt: \"About\" }\n";
    let mut workflow = skein_dsl::parse("fan.yaml", text)
        .workflow
        .expect("the workflow parses");
    workflow.steps[0].for_each = Some(ForEach {
        over: Expr("inputs.topics".to_owned()),
        max_parallel: DEFAULT_MAX_PARALLEL,
    });
    workflow.steps[0].prompt = template("Write a short note about {{ item }}, item {{ index }} of the list.");
    let topics: Vec<Value> = (0..items).map(|i| json!(format!("topic number {i:04}"))).collect();
    let given = BTreeMap::from([("topics".to_owned(), Value::Array(topics))]);
    let inputs = typed_inputs(&workflow, &given).expect("inputs");
    RunRecord::new("fan".to_owned(), "alice".to_owned(), workflow, inputs, unix_ms())
}

struct FanOut {
    /// Per item: the record's rules (complete, advance, set_instance).
    rules: Vec<Duration>,
    /// Per item: the flushed write of the run (head and changed items).
    write: Vec<Duration>,
    /// Per item: serialising the whole record (timed apart, not in `write`): what each
    /// write cost when the record was stored as one value.
    serialise: Vec<Duration>,
    /// The record's size once every item is done.
    bytes: usize,
    /// The baseline: flushed writes of a 2 KB record.
    floor: Vec<Duration>,
}

async fn fan_out(items: usize, answer_bytes: usize) -> FanOut {
    let dir = tempfile::tempdir().expect("temp dir");
    let db = Db::open(dir.path()).expect("db");
    let runs = RunStore::open(&db).expect("the run store");
    let floor_tree: Tree<String> = db.tree("floor").expect("tree");
    let evaluator = Evaluator::default();
    let mut run = fan_out_run(items);
    let answer = "a".repeat(answer_bytes);
    let usage = Some(Usage {
        prompt_tokens: 40,
        completion_tokens: 60,
    });
    let instance = Some("fan-a-0".to_owned());
    let started = run.advance(&evaluator, unix_ms());
    assert_eq!(started.len(), DEFAULT_MAX_PARALLEL as usize);
    for Next::Start { step, item, .. } in &started {
        let attempt = skein_orchestrator::run::record::Attempt {
            step: step.clone(),
            item: *item,
        };
        run.set_instance(&attempt, instance.clone());
    }
    runs.put(&mut run).await.expect("write the run");
    let (mut rules, mut write, mut serialise) = (Vec::new(), Vec::new(), Vec::new());
    for index in 0..items {
        let at = Instant::now();
        let now = unix_ms();
        // Items finish in the order they started.
        run.complete_attempt("each", Some(index as u32), answer.clone(), usage, &evaluator, now);
        for Next::Start { step, item, .. } in run.advance(&evaluator, now) {
            let attempt = skein_orchestrator::run::record::Attempt { step, item };
            run.set_instance(&attempt, instance.clone());
        }
        rules.push(at.elapsed());
        let at = Instant::now();
        runs.put(&mut run).await.expect("write the run");
        write.push(at.elapsed());
        let at = Instant::now();
        let bytes = serde_json::to_vec(&run).expect("serialise");
        serialise.push(at.elapsed());
        std::hint::black_box(bytes);
    }
    assert_eq!(run.step("each").expect("each").state, StepState::Done);
    let bytes = serde_json::to_vec(&run).expect("serialise").len();
    let record = "x".repeat(2048);
    let mut floor = Vec::new();
    for n in 0..items.min(200) {
        let at = Instant::now();
        floor_tree.put(&format!("k{n}"), &record).await.expect("write");
        floor.push(at.elapsed());
    }
    FanOut {
        rules,
        write,
        serialise,
        bytes,
        floor,
    }
}

fn mean(samples: &[Duration]) -> Duration {
    samples.iter().sum::<Duration>() / samples.len().max(1) as u32
}

fn report_fan_out(items: usize, answer_bytes: usize, f: FanOut) {
    println!(
        "for_each over {items} items, max_parallel {DEFAULT_MAX_PARALLEL}, answers of {answer_bytes} B (record at the end: {} KB):",
        f.bytes / 1024
    );
    let cycle: Vec<Duration> = f.rules.iter().zip(&f.write).map(|(r, w)| *r + *w).collect();
    let tenth = (items / 10).max(1);
    let (first, last) = (&cycle[..tenth], &cycle[items - tenth..]);
    summary("2 KB record, flushed write (baseline)", f.floor.clone());
    summary("per item: record rules", f.rules.clone());
    summary("per item: serialise the whole record (apart)", f.serialise.clone());
    summary("per item: flushed write (head + changed items)", f.write.clone());
    let (c50, c99) = summary("per item: whole cycle (rules + write)", cycle.clone());
    println!(
        "  cycle mean: all {}  first {tenth} {}  last {tenth} {};  mean less the 2 KB floor: {};  per-item p50/p99 vs 1 ms: {}/{}",
        ms(mean(&cycle)),
        ms(mean(first)),
        ms(mean(last)),
        ms(mean(&cycle).saturating_sub(mean(&f.floor))),
        ms(c50),
        ms(c99)
    );
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let benching = args.iter().any(|a| a == "--bench");
    let quick = args.iter().any(|a| a == "--quick");
    // Under `cargo test` (no `--bench`): a few rounds, to check that it runs.
    let (rounds, items) = match (benching, quick) {
        (false, _) => (20, 40),
        (true, true) => (1_000, 1_000),
        (true, false) => (5_000, 1_000),
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(tool_round_trip(rounds));
    for answer_bytes in [200, 2_000] {
        let result = runtime.block_on(fan_out(items, answer_bytes));
        report_fan_out(items, answer_bytes, result);
    }
}
