//! The pure rules of a run: which steps start, `when`, `repeat`, retries, recovery after
//! a restart, cancellation. Each test drives a run record the way the executor does,
//! answering steps by hand.

use std::collections::BTreeMap;
use std::time::Duration;

use skein_dsl::expr::Evaluator;
use skein_orchestrator::run::record::{
    AfterFailure, InputError, Next, RetryPolicy, RunRecord, RunState, StepState, UnixMs, typed_inputs,
};

fn workflow(text: &str) -> skein_dsl::Workflow {
    let parsed = skein_dsl::parse("test.yaml", text);
    assert!(
        !parsed.diagnostics.has_errors(),
        "{}",
        parsed.render(skein_dsl::RenderOptions::default())
    );
    parsed.workflow.unwrap()
}

fn run(text: &str, inputs: &[(&str, &str)]) -> RunRecord {
    let workflow = workflow(text);
    let given = inputs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), serde_json::Value::String((*v).to_owned())))
        .collect();
    let inputs = typed_inputs(&workflow, &given).unwrap();
    RunRecord::new("r1".to_owned(), "alice".to_owned(), workflow, inputs, UnixMs(1_000))
}

fn started(next: &[Next]) -> Vec<(&str, &str)> {
    next.iter()
        .map(|Next::Start { step, prompt, .. }| (step.as_str(), prompt.as_str()))
        .collect()
}

const REVIEW: &str = r#"
name: review-loop
inputs: { task: { type: string }, strict: { type: boolean, default: false } }
agents:
  coder: { model: Qwen/Qwen2.5-0.5B-Instruct }
  critic: { model: Qwen/Qwen2.5-0.5B-Instruct }
steps:
  - { id: plan, agent: coder, prompt: "Plan: {{ inputs.task }}" }
  - { id: code, agent: coder, after: [plan], prompt: "Code for: {{ steps.plan.output }}" }
  - id: review
    agent: critic
    after: [code]
    prompt: "Review: {{ steps.code.output }}"
    repeat: { back_to: code, until: 'steps.review.output.contains("LGTM")', max: 2 }
    retries: 1
  - { id: lint, agent: critic, after: [code], when: "inputs.strict", prompt: "Lint {{ steps.code.output }}" }
  - { id: report, agent: coder, after: [review, lint], prompt: "Report: {{ steps.review.output }} / {{ steps.lint.status }}" }
"#;

#[test]
fn steps_start_in_dependency_order_with_rendered_prompts_and_when_skips() {
    let ev = Evaluator::default();
    let mut r = run(REVIEW, &[("task", "sort a list")]);
    assert_eq!(started(&r.advance(&ev, UnixMs(2_000))), [("plan", "Plan: sort a list")]);
    assert_eq!(r.state, RunState::Running);
    // Nothing else is ready while `plan` runs.
    assert!(r.advance(&ev, UnixMs(2_001)).is_empty());
    r.complete("plan", "1. read 2. sort".to_owned(), None, &ev, UnixMs(3_000));
    assert_eq!(
        started(&r.advance(&ev, UnixMs(3_000))),
        [("code", "Code for: 1. read 2. sort")]
    );
    r.complete("code", "sorted(xs)".to_owned(), None, &ev, UnixMs(4_000));
    // `lint` is skipped (strict is false by default); `review` starts.
    assert_eq!(
        started(&r.advance(&ev, UnixMs(4_000))),
        [("review", "Review: sorted(xs)")]
    );
    let lint = r.step("lint").unwrap();
    assert_eq!(lint.state, StepState::Skipped);
    assert!(lint.error.as_deref().unwrap().contains("inputs.strict"));
    r.complete("review", "LGTM".to_owned(), None, &ev, UnixMs(5_000));
    assert_eq!(
        started(&r.advance(&ev, UnixMs(5_000))),
        [("report", "Report: LGTM / skipped")]
    );
    r.complete("report", "done".to_owned(), None, &ev, UnixMs(6_000));
    assert!(r.advance(&ev, UnixMs(6_000)).is_empty());
    assert_eq!(r.state, RunState::Succeeded);
    assert_eq!(r.finished_at, Some(UnixMs(6_000)));
    assert_eq!(r.outputs().get("report"), Some(&"done"));
}

#[test]
fn repeat_sends_the_run_back_until_the_condition_holds_at_most_max_times() {
    let ev = Evaluator::default();
    let mut r = run(REVIEW, &[("task", "t"), ("strict", "true")]);
    r.advance(&ev, UnixMs(0));
    r.complete("plan", "p".to_owned(), None, &ev, UnixMs(1));
    r.advance(&ev, UnixMs(1));
    r.complete("code", "v1".to_owned(), None, &ev, UnixMs(2));
    assert_eq!(started(&r.advance(&ev, UnixMs(2))).len(), 2, "review and lint");
    r.complete("lint", "clean".to_owned(), None, &ev, UnixMs(3));
    r.complete("review", "needs work".to_owned(), None, &ev, UnixMs(3));
    // Back to `code` (pass 2) with the earlier passes in the history; `plan` and the
    // side branch `lint` are not in the loop.
    let code = r.step("code").unwrap();
    assert_eq!((code.state, code.iteration), (StepState::Pending, 2));
    assert_eq!(r.step("review").unwrap().iteration, 2);
    assert_eq!(r.step("lint").unwrap().state, StepState::Done);
    assert_eq!(r.history.len(), 2);
    assert_eq!(started(&r.advance(&ev, UnixMs(4))), [("code", "Code for: p")]);
    r.complete("code", "v2".to_owned(), None, &ev, UnixMs(5));
    r.advance(&ev, UnixMs(5));
    r.complete("review", "still no".to_owned(), None, &ev, UnixMs(6));
    r.advance(&ev, UnixMs(6));
    r.complete("code", "v3".to_owned(), None, &ev, UnixMs(7));
    r.advance(&ev, UnixMs(7));
    // Third pass: max (2 repetitions) reached, so the run goes on without LGTM.
    r.complete("review", "no".to_owned(), None, &ev, UnixMs(8));
    let review = r.step("review").unwrap();
    assert_eq!((review.state, review.iteration), (StepState::Done, 3));
    assert!(review.error.as_deref().unwrap().contains("after 2 repetitions"));
    assert_eq!(started(&r.advance(&ev, UnixMs(9))), [("report", "Report: no / done")]);
    assert_eq!(r.history.len(), 4);
}

#[test]
fn failed_attempts_retry_with_backoff_then_fail_the_run_with_the_engine_error() {
    let ev = Evaluator::default();
    let policy = RetryPolicy {
        first_backoff: Duration::from_secs(1),
        max_backoff: Duration::from_secs(30),
    };
    let mut r = run(REVIEW, &[("task", "t")]);
    r.advance(&ev, UnixMs(0));
    r.complete("plan", "p".to_owned(), None, &ev, UnixMs(0));
    r.advance(&ev, UnixMs(0));
    r.complete("code", "c".to_owned(), None, &ev, UnixMs(0));
    r.advance(&ev, UnixMs(0));
    // `review` has `retries: 1`: one more attempt after a second.
    let after = r.fail_attempt(
        "review",
        "the engine answered 500: out of memory".to_owned(),
        &policy,
        UnixMs(10_000),
    );
    assert_eq!(after, AfterFailure::RetryAt(UnixMs(11_000)));
    assert_eq!(r.step("review").unwrap().state, StepState::Retrying);
    assert_eq!(r.next_retry(), Some(UnixMs(11_000)));
    assert!(r.advance(&ev, UnixMs(10_500)).is_empty(), "not before its backoff");
    assert_eq!(started(&r.advance(&ev, UnixMs(11_000))).len(), 1);
    assert_eq!(r.step("review").unwrap().attempts, 2);
    let after = r.fail_attempt(
        "review",
        "the engine answered 500: out of memory".to_owned(),
        &policy,
        UnixMs(12_000),
    );
    assert_eq!(after, AfterFailure::Failed);
    assert_eq!(r.state, RunState::Failed);
    assert_eq!(
        r.reason.as_deref(),
        Some("step `review` failed: the engine answered 500: out of memory")
    );
    assert_eq!(r.step("report").unwrap().state, StepState::Cancelled);
    // `code` has no retries: its first failure is final.
    let mut r = run(REVIEW, &[("task", "t")]);
    r.advance(&ev, UnixMs(0));
    r.complete("plan", "p".to_owned(), None, &ev, UnixMs(0));
    r.advance(&ev, UnixMs(0));
    assert_eq!(
        r.fail_attempt("code", "timeout".to_owned(), &policy, UnixMs(0)),
        AfterFailure::Failed
    );
    assert_eq!(policy.backoff(1), Duration::from_secs(1));
    assert_eq!(policy.backoff(3), Duration::from_secs(4));
    assert_eq!(policy.backoff(40), Duration::from_secs(30));
}

#[test]
fn after_a_restart_running_steps_run_again_and_done_steps_stay_done() {
    let ev = Evaluator::default();
    let mut r = run(REVIEW, &[("task", "t")]);
    r.advance(&ev, UnixMs(0));
    r.complete("plan", "p".to_owned(), None, &ev, UnixMs(1));
    r.advance(&ev, UnixMs(1));
    assert_eq!(r.step("code").unwrap().state, StepState::Running);
    // The record as stored, read back by a new orchestrator.
    let stored = serde_json::to_string(&r).unwrap();
    let mut r: RunRecord = serde_json::from_str(&stored).unwrap();
    r.recover();
    assert_eq!(r.step("plan").unwrap().state, StepState::Done);
    assert_eq!(
        r.step("code").unwrap().attempts,
        0,
        "the interrupted attempt does not count"
    );
    let next = r.advance(&ev, UnixMs(100));
    assert_eq!(started(&next), [("code", "Code for: p")]);
    assert_eq!(r.step("code").unwrap().attempts, 1);
    r.complete("code", "c".to_owned(), None, &ev, UnixMs(101));
    assert_eq!(r.step("code").unwrap().state, StepState::Done);
}

/// The orchestrator's own death does not spend a step's retry (docs/runs.md,
/// Durability): after a restart the interrupted attempt is not counted, so a step keeps
/// every retry its `retries` gave it; an engine's failures still count.
#[test]
fn a_restart_does_not_spend_a_retry() {
    let ev = Evaluator::default();
    let policy = RetryPolicy::default();
    let restarted = |r: &RunRecord| {
        let mut r: RunRecord = serde_json::from_str(&serde_json::to_string(r).unwrap()).unwrap();
        r.recover();
        r
    };
    let mut r = run(REVIEW, &[("task", "t")]);
    r.advance(&ev, UnixMs(0));
    r.complete("plan", "p".to_owned(), None, &ev, UnixMs(0));
    r.advance(&ev, UnixMs(0));
    r.complete("code", "c".to_owned(), None, &ev, UnixMs(0));
    r.advance(&ev, UnixMs(0));
    // `review` (`retries: 1`) was on its first attempt when the orchestrator died, twice.
    for at in [10, 20] {
        assert_eq!(r.step("review").unwrap().state, StepState::Running);
        r = restarted(&r);
        assert_eq!(r.step("review").unwrap().state, StepState::Queued);
        assert_eq!(started(&r.advance(&ev, UnixMs(at))).len(), 1, "it runs again at once");
        assert_eq!(r.step("review").unwrap().attempts, 1, "still its first attempt");
    }
    // Its engine fails: its one retry is still there.
    let after = r.fail_attempt("review", "the engine answered 500".to_owned(), &policy, UnixMs(30));
    assert_eq!(after, AfterFailure::RetryAt(UnixMs(1_030)));
    // The retry is running when the orchestrator dies: it is the second attempt again.
    r.advance(&ev, UnixMs(1_030));
    assert_eq!(r.step("review").unwrap().attempts, 2);
    r = restarted(&r);
    assert_eq!(r.step("review").unwrap().attempts, 1);
    r.advance(&ev, UnixMs(2_000));
    assert_eq!(r.step("review").unwrap().attempts, 2);
    // The engine's second failure is the last one `retries: 1` allows.
    let after = r.fail_attempt("review", "the engine answered 500".to_owned(), &policy, UnixMs(2_001));
    assert_eq!(after, AfterFailure::Failed);
    assert_eq!(r.state, RunState::Failed);
}

#[test]
fn cancel_stops_unfinished_steps_and_nothing_starts_after() {
    let ev = Evaluator::default();
    let mut r = run(REVIEW, &[("task", "t")]);
    r.advance(&ev, UnixMs(0));
    r.cancel(UnixMs(5));
    assert_eq!(r.state, RunState::Cancelled);
    assert!(r.steps.iter().all(|s| s.state == StepState::Cancelled));
    assert!(r.advance(&ev, UnixMs(6)).is_empty());
    // A late answer of a cancelled attempt changes nothing.
    r.complete("plan", "late".to_owned(), None, &ev, UnixMs(7));
    assert_eq!(r.step("plan").unwrap().output, None);
}

#[test]
fn inputs_are_typed_defaulted_and_checked() {
    let w = workflow(
        "name: w\ninputs: { n: { type: integer }, x: { type: number, default: 0.5 }, s: { type: string } }\nagents:\n  a: { model: Qwen/Qwen2.5-0.5B-Instruct }\n",
    );
    let given = |pairs: &[(&str, serde_json::Value)]| -> BTreeMap<String, serde_json::Value> {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), v.clone())).collect()
    };
    let typed = typed_inputs(&w, &given(&[("n", "3".into()), ("s", 7.into())])).unwrap();
    assert_eq!(serde_json::to_string(&typed).unwrap(), r#"{"n":3,"s":"7","x":0.5}"#);
    let e = typed_inputs(&w, &given(&[("n", "three".into()), ("s", "".into())])).unwrap_err();
    assert_eq!(e.to_string(), "input `n` must be an integer, not `three`");
    let e = typed_inputs(&w, &given(&[("n", 1.into())])).unwrap_err();
    assert!(matches!(e, InputError::Missing { .. }));
    assert_eq!(
        e.to_string(),
        "input `s` is required (a string); help: pass --input s=VALUE"
    );
    let e = typed_inputs(&w, &given(&[("n", 1.into()), ("s", "".into()), ("z", 1.into())])).unwrap_err();
    assert_eq!(e.to_string(), "the workflow has no input `z`; its inputs are: n, s, x");
}

#[test]
fn records_store_timestamps_as_rfc3339() {
    let r = run(REVIEW, &[("task", "t")]);
    let json = serde_json::to_value(&r).unwrap();
    assert_eq!(json["submitted_at"], "1970-01-01T00:00:01.000Z");
    let back: RunRecord = serde_json::from_value(json).unwrap();
    assert_eq!(back, r);
}
