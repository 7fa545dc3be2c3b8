//! `skein submit`, `skein runs`, `skein run show|cancel|approve|reject` and `skein instances`: runs and
//! instances of a running server, for people (tables, live progress) or as JSON.

use std::collections::BTreeMap;
use std::process::ExitCode;

use anyhow::{Context, bail};
use serde::Deserialize;

use crate::cli::common::{ListArgs, OutputFormat};
use crate::cli::models::MeasuredArgs;
use crate::cli::runs::{DecideArgs, InstancesArgs, LogsArgs, RunIdArgs, RunShowArgs, SubmitArgs};
use crate::cli::{EXIT_FAILURE, EXIT_OK};
use crate::client::{ApiClient, refused_error};
use skein_orchestrator::instances::InstanceState;
use skein_orchestrator::run::{RunState, StepState};

/// What the commands read of a run (`GET /v1/runs/{id}`).
#[derive(Debug, Deserialize)]
struct Run {
    id: String,
    workflow: Workflow,
    state: RunState,
    #[serde(default)]
    reason: Option<String>,
    submitted_at: String,
    #[serde(default)]
    finished_at: Option<String>,
    steps: Vec<Step>,
    /// The runs that preempted it, in order.
    #[serde(default)]
    preempted_by: Vec<String>,
}

#[derive(Debug, Deserialize)]
struct Workflow {
    name: String,
}

#[derive(Debug, Deserialize)]
struct Step {
    id: String,
    agent: String,
    state: StepState,
    iteration: u32,
    attempts: u32,
    #[serde(default)]
    output: Option<String>,
    #[serde(default)]
    error: Option<String>,
    #[serde(default)]
    instance: Option<String>,
    #[serde(default)]
    started_at: Option<String>,
    #[serde(default)]
    finished_at: Option<String>,
    #[serde(default)]
    turns: Vec<Turn>,
    /// The rendered prompt (an approval step's text to approve).
    #[serde(default)]
    prompt: Option<String>,
    #[serde(default)]
    items: Vec<Item>,
    #[serde(default)]
    approval: Option<Approval>,
}

/// What a step or an item waits for a person about.
#[derive(Debug, Deserialize)]
struct Approval {
    /// The question on a tool call in flight under `in_flight: ask` (an approval step's
    /// text is its prompt).
    #[serde(default)]
    text: Option<String>,
}

/// One item of a `for_each` step.
#[derive(Debug, Deserialize)]
struct Item {
    index: u32,
    state: StepState,
    attempts: u32,
    #[serde(default)]
    output: Option<String>,
    #[serde(default)]
    error: Option<String>,
    #[serde(default)]
    turns: Vec<Turn>,
    #[serde(default)]
    approval: Option<Approval>,
}

/// One model turn of a step's agent loop that asked for tools.
#[derive(Debug, Deserialize)]
struct Turn {
    #[serde(default)]
    content: Option<String>,
    calls: Vec<ToolCall>,
    at: String,
}

/// One tool call of a [`Turn`].
#[derive(Debug, Deserialize)]
struct ToolCall {
    name: String,
    arguments: String,
    state: String,
    #[serde(default)]
    sends: u32,
    #[serde(default)]
    sent_at: Option<String>,
    #[serde(default)]
    returned_at: Option<String>,
    #[serde(default)]
    result: Option<String>,
    #[serde(default)]
    is_error: bool,
}

/// How long `skein submit` waits for a server that is still starting.
const SERVER_PATIENCE: std::time::Duration = std::time::Duration::from_secs(120);

/// `KEY=VALUE` pairs of `--input`.
fn inputs(pairs: &[String]) -> anyhow::Result<BTreeMap<String, serde_json::Value>> {
    pairs
        .iter()
        .map(|pair| match pair.split_once('=') {
            Some((key, value)) if !key.trim().is_empty() => {
                Ok((key.trim().to_owned(), serde_json::Value::String(value.to_owned())))
            }
            _ => bail!("--input `{pair}` is not KEY=VALUE"),
        })
        .collect()
}

/// `skein submit`.
pub fn run_submit(args: &SubmitArgs) -> anyhow::Result<ExitCode> {
    let text =
        std::fs::read_to_string(&args.workflow).with_context(|| format!("cannot read {}", args.workflow.display()))?;
    let name = args
        .workflow
        .file_name()
        .map_or_else(|| "workflow.yaml".to_owned(), |n| n.to_string_lossy().into_owned());
    let body = serde_json::json!({ "workflow": text, "name": name, "inputs": inputs(&args.inputs)? });
    let client = ApiClient::patient(&args.remote.server, &args.remote.client, SERVER_PATIENCE)?;
    let run: Run = match client.post("/v1/runs", &body)? {
        Ok(text) => serde_json::from_str(&text).context("the server's run is not what this skein expects")?,
        Err(refused) if refused.status == reqwest::StatusCode::TOO_MANY_REQUESTS => {
            let after = refused
                .retry_after
                .map_or_else(String::new, |s| format!(" Try again in {s} s."));
            bail!("the server is busy: {}.{after}", refused.message.trim_end_matches('.'));
        }
        Err(refused) if refused.status == reqwest::StatusCode::UNPROCESSABLE_ENTITY => {
            bail!(
                "{} is invalid; `skein validate {}` shows why",
                args.workflow.display(),
                args.workflow.display()
            );
        }
        Err(refused) => return Err(refused_error(&refused)),
    };
    if args.output == OutputFormat::Json && !args.wait {
        println!("{}", client.get(&format!("/v1/runs/{}", run.id))?);
        return Ok(ExitCode::from(EXIT_OK));
    }
    eprintln!("submitted run {} of workflow {}", run.id, run.workflow.name);
    if !args.wait {
        println!("{}", run.id);
        eprintln!("follow it with `skein run show {}`", run.id);
        return Ok(ExitCode::from(EXIT_OK));
    }
    wait(&client, &run.id, args.output)
}

/// Follows a run to its end, printing each change; then its outputs.
fn wait(client: &ApiClient, id: &str, output: OutputFormat) -> anyhow::Result<ExitCode> {
    let mut last: Option<Run> = None;
    let mut final_json = String::new();
    client.follow(&format!("/v1/runs/{id}/events"), |name, data| {
        if name != "run" {
            return true;
        }
        let Ok(run) = serde_json::from_str::<Run>(data) else {
            return true;
        };
        if output == OutputFormat::Human {
            progress(last.as_ref(), &run);
        }
        final_json = data.to_owned();
        let ended = run.state.is_final();
        last = Some(run);
        !ended
    })?;
    let Some(run) = last else {
        bail!("the server ended the event stream of run {id} at once");
    };
    if !run.state.is_final() {
        bail!(
            "lost the server while run {id} was {}; `skein run show {id}` shows where it is",
            run.state
        );
    }
    match output {
        OutputFormat::Json => println!("{final_json}"),
        OutputFormat::Human => print_outputs(&run),
    }
    Ok(ExitCode::from(if run.state == RunState::Succeeded {
        EXIT_OK
    } else {
        EXIT_FAILURE
    }))
}

/// One line per change between two views of a run.
fn progress(before: Option<&Run>, now: &Run) {
    let state_changed = before.is_none_or(|b| b.state != now.state || b.reason != now.reason);
    if state_changed {
        match &now.reason {
            Some(reason) => eprintln!("run {}: {} ({reason})", now.id, now.state),
            None => eprintln!("run {}: {}", now.id, now.state),
        }
    }
    for step in &now.steps {
        let old = before.and_then(|b| b.steps.iter().find(|s| s.id == step.id));
        if old.is_some_and(|o| o.state == step.state && o.attempts == step.attempts && o.iteration == step.iteration) {
            continue;
        }
        if old.is_none() && step.state == StepState::Pending {
            continue;
        }
        let pass = if step.iteration > 1 {
            format!(" (pass {})", step.iteration)
        } else {
            String::new()
        };
        let detail = match step.state {
            StepState::Running if !step.items.is_empty() => items_done(step),
            StepState::Waiting => format!(
                "for approval: {}\n    {}",
                one_line(question(step), 200),
                commands(&now.id, &step.id, None)
            ),
            StepState::Running => format!(
                "attempt {} on {}",
                step.attempts,
                step.instance.as_deref().unwrap_or(&step.agent)
            ),
            StepState::Retrying | StepState::Failed | StepState::Skipped => step.error.clone().unwrap_or_default(),
            StepState::Done => format!("{} characters", step.output.as_deref().map_or(0, |o| o.chars().count())),
            StepState::Pending | StepState::Queued | StepState::Cancelled => String::new(),
        };
        eprintln!("  step {}{pass}: {} {detail}", step.id, step.state);
    }
    // An item whose tool call was in flight under `ask` waits for a person.
    for step in &now.steps {
        let old = before.and_then(|b| b.steps.iter().find(|s| s.id == step.id));
        for item in step.items.iter().filter(|i| i.state == StepState::Waiting) {
            let was = old.and_then(|o| o.items.get(item.index as usize)).map(|i| i.state);
            if was == Some(StepState::Waiting) {
                continue;
            }
            eprintln!(
                "  step {} item {}: waiting for approval: {}\n    {}",
                step.id,
                item.index,
                one_line(item_question(item), 200),
                commands(&now.id, &step.id, Some(item.index))
            );
        }
    }
}

/// What a waiting step asks: the question on its tool call in flight, or an approval
/// step's text.
fn question(step: &Step) -> &str {
    step.approval
        .as_ref()
        .and_then(|a| a.text.as_deref())
        .or(step.prompt.as_deref())
        .unwrap_or_default()
}

/// What a waiting item asks: the question on its tool call in flight.
fn item_question(item: &Item) -> &str {
    item.approval
        .as_ref()
        .and_then(|a| a.text.as_deref())
        .unwrap_or_default()
}

/// The commands that decide what step `step` (or its item `item`) of run `run` waits
/// for.
fn commands(run: &str, step: &str, item: Option<u32>) -> String {
    let item = item.map(|i| format!(" --item {i}")).unwrap_or_default();
    format!("approve: skein run approve {run} {step}{item}   reject: skein run reject {run} {step}{item}")
}

fn print_outputs(run: &Run) {
    match run.state {
        RunState::Succeeded => eprintln!("run {} succeeded", run.id),
        other => eprintln!(
            "run {} {other}: {}",
            run.id,
            run.reason.as_deref().unwrap_or("no reason recorded")
        ),
    }
    for step in &run.steps {
        if let Some(output) = &step.output {
            println!("── {} ({}) ──\n{}", step.id, step.agent, output.trim_end());
        }
    }
}

/// `skein runs`.
pub fn run_list(args: &ListArgs) -> anyhow::Result<ExitCode> {
    let client = ApiClient::new(&args.remote.server, &args.remote.client)?;
    let runs = serde_json::Value::Array(client.all_pages("/v1/runs", "after")?);
    if args.output == OutputFormat::Json {
        println!("{runs}");
        return Ok(ExitCode::from(EXIT_OK));
    }
    #[derive(Deserialize)]
    struct Summary {
        id: String,
        workflow: String,
        state: RunState,
        reason: Option<String>,
        steps_done: usize,
        steps: usize,
        submitted_at: String,
    }
    let runs: Vec<Summary> =
        serde_json::from_value(runs).context("the server's runs are not what this skein expects")?;
    if runs.is_empty() {
        println!("(no run yet; `skein submit WORKFLOW` starts one)");
        return Ok(ExitCode::from(EXIT_OK));
    }
    let rows: Vec<Vec<String>> = runs
        .iter()
        .map(|r| {
            vec![
                r.id.clone(),
                r.workflow.clone(),
                r.state.to_string(),
                format!("{}/{}", r.steps_done, r.steps),
                r.submitted_at.clone(),
                r.reason.clone().unwrap_or_default(),
            ]
        })
        .collect();
    let style = crate::table::Style {
        indent: "",
        gap: 3,
        right_aligned: &[3],
    };
    print!(
        "{}",
        crate::table::render(
            &style,
            &["RUN", "WORKFLOW", "STATE", "STEPS", "SUBMITTED", "REASON"],
            &rows
        )
    );
    Ok(ExitCode::from(EXIT_OK))
}

/// `skein run show`.
pub fn run_show(args: &RunShowArgs) -> anyhow::Result<ExitCode> {
    let (step, args) = (args.step.as_deref(), &args.run);
    let client = ApiClient::new(&args.remote.server, &args.remote.client)?;
    let body = client.get(&format!("/v1/runs/{}", args.id))?;
    if args.output == OutputFormat::Json {
        println!("{body}");
        return Ok(ExitCode::from(EXIT_OK));
    }
    let run: Run = serde_json::from_str(&body).context("the server's run is not what this skein expects")?;
    if let Some(step) = step {
        let Some(record) = run.steps.iter().find(|s| s.id == step) else {
            let known: Vec<&str> = run.steps.iter().map(|s| s.id.as_str()).collect();
            bail!("run {} has no step `{step}`; its steps: {}", run.id, known.join(", "));
        };
        print!("{}", step_detail(record));
        return Ok(ExitCode::from(EXIT_OK));
    }
    println!("run {} of {}: {}", run.id, run.workflow.name, run.state);
    if let Some(reason) = &run.reason {
        println!("  {reason}");
    }
    println!("  submitted {}", run.submitted_at);
    if let Some(finished) = &run.finished_at {
        println!("  finished  {finished}");
    }
    if !run.preempted_by.is_empty() {
        println!("  preempted by {}", run.preempted_by.join(", "));
    }
    let rows: Vec<Vec<String>> = run
        .steps
        .iter()
        .map(|s| {
            vec![
                s.id.clone(),
                s.agent.clone(),
                s.state.to_string(),
                s.attempts.to_string(),
                s.iteration.to_string(),
                s.started_at.clone().unwrap_or_default(),
                s.finished_at.clone().unwrap_or_default(),
                match s.state {
                    StepState::Waiting => format!("waiting for approval: skein run approve {} {}", run.id, s.id),
                    StepState::Running if !s.items.is_empty() => match waiting_items(s).first() {
                        Some(i) => format!(
                            "{}; item {i} waits for approval: skein run approve {} {} --item {i}",
                            items_done(s),
                            run.id,
                            s.id
                        ),
                        None => items_done(s),
                    },
                    _ => s.error.clone().unwrap_or_default(),
                },
            ]
        })
        .collect();
    let style = crate::table::Style {
        indent: "  ",
        gap: 3,
        right_aligned: &[3, 4],
    };
    print!(
        "{}",
        crate::table::render(
            &style,
            &[
                "STEP", "AGENT", "STATE", "ATTEMPTS", "PASS", "STARTED", "FINISHED", "ERROR"
            ],
            &rows
        )
    );
    for step in &run.steps {
        if let Some(output) = &step.output {
            println!("── {} ──\n{}", step.id, output.trim_end());
        }
    }
    Ok(ExitCode::from(EXIT_OK))
}

/// Step `step` as `skein run show --step` prints it: an approval's text and decision;
/// its agent loop, each turn's text and calls (`name(arguments) → result`, each cut to
/// one line) with their state, sends and duration, then the answer; for a `for_each`
/// step, each item so.
fn step_detail(step: &Step) -> String {
    use std::fmt::Write as _;
    let mut out = format!("step {} ({}): {}\n", step.id, step.agent, step.state);
    if step.agent.is_empty() {
        out = format!("step {} (approval): {}\n", step.id, step.state);
        let _ = writeln!(
            out,
            "  text: {}",
            one_line(step.prompt.as_deref().unwrap_or_default(), 400)
        );
    } else if step.items.is_empty() {
        if step.state == StepState::Waiting {
            let _ = writeln!(out, "  waiting for approval: {}", one_line(question(step), 400));
        }
        turn_lines(&mut out, &step.turns, "  ");
    } else {
        let _ = writeln!(out, "  {}", items_done(step));
        for item in &step.items {
            let _ = writeln!(
                out,
                "  item {}: {} (attempts {})",
                item.index, item.state, item.attempts
            );
            if item.state == StepState::Waiting {
                let _ = writeln!(out, "    waiting for approval: {}", one_line(item_question(item), 400));
            }
            turn_lines(&mut out, &item.turns, "    ");
            if let Some(output) = &item.output {
                let _ = writeln!(out, "    answer: {}", one_line(output, 200));
            }
            if let Some(error) = &item.error {
                let _ = writeln!(out, "    error: {}", one_line(error, 200));
            }
        }
    }
    if let Some(output) = &step.output {
        let _ = writeln!(out, "  answer: {}", one_line(output, 400));
    }
    if let Some(error) = &step.error {
        let _ = writeln!(out, "  error: {}", one_line(error, 400));
    }
    out
}

/// The turns of one agent loop, indented.
fn turn_lines(out: &mut String, turns: &[Turn], indent: &str) {
    use std::fmt::Write as _;
    let line = one_line;
    if turns.is_empty() {
        let _ = writeln!(out, "{indent}no tool calls");
    }
    for (t, turn) in turns.iter().enumerate() {
        let _ = writeln!(out, "{indent}turn {} at {}", t + 1, turn.at);
        if let Some(content) = turn.content.as_deref().filter(|c| !c.trim().is_empty()) {
            let _ = writeln!(out, "{indent}  says: {}", line(content, 200));
        }
        for call in &turn.calls {
            let took = match (&call.sent_at, &call.returned_at) {
                (Some(sent), Some(back)) => match (humantime::parse_rfc3339(sent), humantime::parse_rfc3339(back)) {
                    (Ok(sent), Ok(back)) => back
                        .duration_since(sent)
                        .map(|d| format!(" in {} ms", d.as_millis()))
                        .unwrap_or_default(),
                    _ => String::new(),
                },
                _ => String::new(),
            };
            let sends = if call.sends > 1 {
                format!(", sent {} times", call.sends)
            } else {
                String::new()
            };
            let result = match (&call.result, call.is_error) {
                (Some(result), true) => format!("error: {}", line(result, 200)),
                (Some(result), false) => line(result, 200),
                (None, _) => "(no result yet)".to_owned(),
            };
            let _ = writeln!(
                out,
                "{indent}  {}({}) → {result}  [{}{sends}{took}]",
                call.name,
                line(&call.arguments, 120),
                call.state
            );
        }
    }
}

/// The items of a `for_each` step that wait for approval.
fn waiting_items(step: &Step) -> Vec<u32> {
    step.items
        .iter()
        .filter(|i| i.state == StepState::Waiting)
        .map(|i| i.index)
        .collect()
}

/// "3/10 items done" of a `for_each` step.
fn items_done(step: &Step) -> String {
    let done = step.items.iter().filter(|i| i.state == StepState::Done).count();
    format!("{done}/{} items done", step.items.len())
}

/// `text` on one line (runs of whitespace made one space), cut to `max` characters.
pub(crate) fn one_line(text: &str, max: usize) -> String {
    let one: String = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if one.chars().count() > max {
        format!("{}…", one.chars().take(max).collect::<String>())
    } else {
        one
    }
}

/// `skein run approve` and `skein run reject`.
pub fn run_decide(args: &DecideArgs, approved: bool) -> anyhow::Result<ExitCode> {
    let client = ApiClient::new(&args.run.remote.server, &args.run.remote.client)?;
    let verb = if approved { "approve" } else { "reject" };
    let mut body = serde_json::json!({});
    if let Some(comment) = &args.comment {
        body["comment"] = serde_json::json!(comment);
    }
    if let Some(item) = args.item {
        body["item"] = serde_json::json!(item);
    }
    let answer = client
        .post(&format!("/v1/runs/{}/steps/{}/{verb}", args.run.id, args.step), &body)?
        .map_err(|r| refused_error(&r))?;
    if args.run.output == OutputFormat::Json {
        println!("{answer}");
        return Ok(ExitCode::from(EXIT_OK));
    }
    let run: Run = serde_json::from_str(&answer).context("the server's run is not what this skein expects")?;
    let step = run.steps.iter().find(|s| s.id == args.step);
    let (what, error) = match args.item {
        Some(index) => (
            format!("step {} item {index}", args.step),
            step.and_then(|s| s.items.get(index as usize))
                .and_then(|i| i.error.as_ref()),
        ),
        None => (format!("step {}", args.step), step.and_then(|s| s.error.as_ref())),
    };
    println!("run {}: {what} {verb}d; the run is {}", run.id, run.state);
    if let Some(error) = error.filter(|_| !approved) {
        println!("  {error}");
    }
    Ok(ExitCode::from(EXIT_OK))
}

/// `skein run cancel`.
pub fn run_cancel(args: &RunIdArgs) -> anyhow::Result<ExitCode> {
    let client = ApiClient::new(&args.remote.server, &args.remote.client)?;
    let body = client
        .post(&format!("/v1/runs/{}/cancel", args.id), &serde_json::json!({}))?
        .map_err(|r| refused_error(&r))?;
    if args.output == OutputFormat::Json {
        println!("{body}");
        return Ok(ExitCode::from(EXIT_OK));
    }
    let run: Run = serde_json::from_str(&body).context("the server's run is not what this skein expects")?;
    println!("run {}: {}", run.id, run.state);
    Ok(ExitCode::from(EXIT_OK))
}

/// `skein instances`.
pub fn run_instances(args: &InstancesArgs) -> anyhow::Result<ExitCode> {
    let client = ApiClient::new(&args.remote.server, &args.remote.client)?;
    let body = client.get("/v1/instances")?;
    if args.output == OutputFormat::Json {
        println!("{body}");
        return Ok(ExitCode::from(EXIT_OK));
    }
    #[derive(Deserialize)]
    struct Instance {
        name: String,
        node_name: String,
        engine: String,
        variant: String,
        gpus: Vec<u32>,
        estimated_bytes: u64,
        state: InstanceState,
        detail: String,
        measured_host_rss: Option<u64>,
        measured_gpu: Vec<(u32, u64)>,
        #[serde(default)]
        runs: Vec<String>,
        #[serde(default)]
        sessions: Vec<String>,
    }
    let instances: Vec<Instance> =
        serde_json::from_str(&body).context("the server's instances are not what this skein expects")?;
    if instances.is_empty() {
        println!("(no instance runs)");
        return Ok(ExitCode::from(EXIT_OK));
    }
    let rows: Vec<Vec<String>> = instances
        .iter()
        .map(|i| {
            let measured: u64 = i.measured_gpu.iter().map(|(_, b)| b).sum::<u64>() + i.measured_host_rss.unwrap_or(0);
            let gpus = if i.gpus.is_empty() {
                "cpu".to_owned()
            } else {
                i.gpus.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
            };
            vec![
                i.name.clone(),
                i.node_name.clone(),
                gpus,
                i.engine.clone(),
                i.variant.clone(),
                i.state.to_string(),
                gib(i.estimated_bytes),
                if measured > 0 { gib(measured) } else { "-".to_owned() },
                used_by(&i.runs, &i.sessions),
                i.detail.lines().next().unwrap_or("").to_owned(),
            ]
        })
        .collect();
    let style = crate::table::Style {
        indent: "",
        gap: 3,
        right_aligned: &[6, 7],
    };
    print!(
        "{}",
        crate::table::render(
            &style,
            &[
                "INSTANCE", "NODE", "GPUS", "ENGINE", "VARIANT", "STATE", "EST GiB", "USED GiB", "USED BY", "DETAIL"
            ],
            &rows
        )
    );
    Ok(ExitCode::from(EXIT_OK))
}

/// Who uses an instance, for its row: the runs it served, then the sessions bound to
/// it (`-` for none).
fn used_by(runs: &[String], sessions: &[String]) -> String {
    let all: Vec<&str> = runs.iter().chain(sessions).map(String::as_str).collect();
    if all.is_empty() { "-".to_owned() } else { all.join(",") }
}

/// `skein logs`.
pub fn run_logs(args: &LogsArgs) -> anyhow::Result<ExitCode> {
    #[derive(Deserialize)]
    struct Logs {
        lines: Vec<String>,
    }
    let client = ApiClient::new(&args.remote.server, &args.remote.client)?;
    let body = client.get(&format!("/v1/instances/{}/logs?tail={}", args.instance, args.tail))?;
    let logs: Logs = serde_json::from_str(&body).context("the server's logs are not what this skein expects")?;
    for line in logs.lines {
        println!("{line}");
    }
    Ok(ExitCode::from(EXIT_OK))
}

/// Bytes in GiB with two decimals, as the tables print them.
fn gib(bytes: u64) -> String {
    format!("{:.2}", bytes as f64 / f64::from(1u32 << 30))
}

/// `skein models measured`.
pub fn run_measured(args: &MeasuredArgs) -> anyhow::Result<ExitCode> {
    #[derive(Deserialize)]
    struct Measurement {
        variant: String,
        engine: String,
        gpus: usize,
        context: u64,
        concurrency: u64,
        estimated_bytes: u64,
        measured_bytes: u64,
        node: String,
        measured_at: String,
    }
    let client = ApiClient::new(&args.remote.server, &args.remote.client)?;
    let body = client.get("/v1/measurements")?;
    if args.output == OutputFormat::Json {
        println!("{body}");
        return Ok(ExitCode::from(EXIT_OK));
    }
    let list: Vec<Measurement> =
        serde_json::from_str(&body).context("the server's measurements are not what this skein expects")?;
    if list.is_empty() {
        println!("(nothing measured yet: instances report their memory once loaded)");
        return Ok(ExitCode::from(EXIT_OK));
    }
    let rows: Vec<Vec<String>> = list
        .iter()
        .map(|m| {
            let ratio = if m.estimated_bytes > 0 {
                format!("{:.2}", m.measured_bytes as f64 / m.estimated_bytes as f64)
            } else {
                "-".to_owned()
            };
            vec![
                m.variant.clone(),
                m.engine.clone(),
                if m.gpus == 0 {
                    "cpu".to_owned()
                } else {
                    m.gpus.to_string()
                },
                m.context.to_string(),
                m.concurrency.to_string(),
                gib(m.estimated_bytes),
                gib(m.measured_bytes),
                ratio,
                m.node.clone(),
                m.measured_at.clone(),
            ]
        })
        .collect();
    let style = crate::table::Style {
        indent: "",
        gap: 3,
        right_aligned: &[2, 3, 4, 5, 6, 7],
    };
    print!(
        "{}",
        crate::table::render(
            &style,
            &[
                "VARIANT", "ENGINE", "GPUS", "CONTEXT", "SEQS", "EST GiB", "USED GiB", "USED/EST", "NODE", "WHEN"
            ],
            &rows
        )
    );
    Ok(ExitCode::from(EXIT_OK))
}
