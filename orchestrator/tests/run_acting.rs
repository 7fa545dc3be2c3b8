//! The pure rules of steps that act: `for_each` items (parallel up to a limit, retried
//! and recovered one by one, joined into a JSON array), approval steps (waiting, a
//! person's decision, a timeout) and answers held to an `output_schema`. Each test
//! drives a run record the way the executor does.

use std::collections::BTreeMap;
use std::time::Duration;

use skein_dsl::expr::Evaluator;
use skein_dsl::ir::{Approval, Expr, ForEach, OnTimeout, Template};
use skein_orchestrator::run::record::{
    AfterFailure, Attempt, DecideError, Decision, Next, RetryPolicy, RunRecord, RunState, StepState, UnixMs,
    typed_inputs,
};

const BASE: &str = r#"
name: acting
inputs: { topics: { type: string, default: "" } }
agents:
  writer: { model: Qwen/Qwen2.5-0.5B-Instruct }
steps:
  - { id: plan, agent: writer, prompt: "Plan" }
  - { id: each, agent: writer, after: [plan], prompt: "Write about" }
  - { id: sum, agent: writer, after: [each], prompt: "Sum: {{ steps.each.output }}" }
"#;

fn run_with(edit: impl FnOnce(&mut skein_dsl::Workflow)) -> RunRecord {
    let parsed = skein_dsl::parse("test.yaml", BASE);
    let mut workflow = parsed.workflow.expect("the base workflow parses");
    edit(&mut workflow);
    let inputs = typed_inputs(&workflow, &BTreeMap::new()).unwrap();
    RunRecord::new("r1".to_owned(), "alice".to_owned(), workflow, inputs, UnixMs(1_000))
}

fn template(text: &str) -> Template {
    skein_dsl::template::unchecked(text).expect("a template")
}

/// `each` runs over the JSON list `plan` answers, two at a time.
fn fan_out(max_parallel: u32) -> RunRecord {
    run_with(|w| {
        let each = w.steps.iter_mut().find(|s| s.id == "each").unwrap();
        each.for_each = Some(ForEach {
            over: Expr("steps.plan.output.json".to_owned()),
            max_parallel,
        });
        each.prompt = template("Write about {{ item }} ({{ index }})");
        each.retries = 1;
    })
}

fn items(next: &[Next]) -> Vec<(Option<u32>, &str)> {
    next.iter()
        .map(|Next::Start { item, prompt, .. }| (*item, prompt.as_str()))
        .collect()
}

#[test]
fn a_for_each_runs_its_items_up_to_the_limit_and_joins_their_answers_in_order() {
    let ev = Evaluator::default();
    let mut r = fan_out(2);
    r.advance(&ev, UnixMs(2_000));
    r.complete(
        "plan",
        r#"["owls", "bats", "moths"]"#.to_owned(),
        None,
        &ev,
        UnixMs(3_000),
    );
    let next = r.advance(&ev, UnixMs(3_000));
    assert_eq!(
        items(&next),
        [(Some(0), "Write about owls (0)"), (Some(1), "Write about bats (1)")]
    );
    assert_eq!(r.step("each").unwrap().items.len(), 3);
    // No third item while two run.
    assert!(r.advance(&ev, UnixMs(3_001)).is_empty());
    // Answers may come in any order; a freed slot starts the next item.
    r.complete_attempt("each", Some(1), "B".to_owned(), None, &ev, UnixMs(4_000));
    assert_eq!(
        items(&r.advance(&ev, UnixMs(4_000))),
        [(Some(2), "Write about moths (2)")]
    );
    r.complete_attempt("each", Some(2), "M".to_owned(), None, &ev, UnixMs(4_500));
    assert_eq!(r.step("each").unwrap().state, StepState::Running);
    r.complete_attempt("each", Some(0), "O".to_owned(), None, &ev, UnixMs(5_000));
    let each = r.step("each").unwrap();
    assert_eq!(each.state, StepState::Done);
    assert_eq!(each.output.as_deref(), Some(r#"["O","B","M"]"#));
    let next = r.advance(&ev, UnixMs(5_000));
    assert_eq!(items(&next), [(None, r#"Sum: ["O","B","M"]"#)]);
}

#[test]
fn a_restart_runs_again_only_the_items_that_were_not_done() {
    let ev = Evaluator::default();
    let mut r = fan_out(3);
    r.advance(&ev, UnixMs(2_000));
    r.complete("plan", r#"["a", "b", "c"]"#.to_owned(), None, &ev, UnixMs(3_000));
    assert_eq!(r.advance(&ev, UnixMs(3_000)).len(), 3);
    r.complete_attempt("each", Some(1), "done b".to_owned(), None, &ev, UnixMs(3_500));
    // The orchestrator dies: the stored record is all there is.
    let stored = serde_json::to_string(&r).unwrap();
    let mut r: RunRecord = serde_json::from_str(&stored).unwrap();
    r.recover();
    let again = r.advance(&ev, UnixMs(9_000));
    assert_eq!(
        items(&again).iter().map(|(i, _)| *i).collect::<Vec<_>>(),
        [Some(0), Some(2)]
    );
    let each = r.step("each").unwrap();
    assert_eq!(each.items[1].state, StepState::Done);
    assert_eq!(each.items[0].attempts, 1, "an interrupted attempt is not counted");
}

#[test]
fn a_failing_item_is_retried_alone_and_fails_the_step_when_out_of_retries() {
    let ev = Evaluator::default();
    let policy = RetryPolicy::default();
    let mut r = fan_out(4);
    r.advance(&ev, UnixMs(2_000));
    r.complete("plan", r#"["x", "y"]"#.to_owned(), None, &ev, UnixMs(3_000));
    r.advance(&ev, UnixMs(3_000));
    r.complete_attempt("each", Some(0), "X".to_owned(), None, &ev, UnixMs(3_100));
    let after = r.fail_attempt_of("each", Some(1), "boom".to_owned(), &policy, UnixMs(3_200));
    assert_eq!(after, AfterFailure::RetryAt(UnixMs(4_200)));
    assert_eq!(r.next_retry(), Some(UnixMs(4_200)));
    assert!(r.advance(&ev, UnixMs(4_000)).is_empty());
    assert_eq!(items(&r.advance(&ev, UnixMs(4_200))), [(Some(1), "Write about y (1)")]);
    let after = r.fail_attempt_of("each", Some(1), "boom again".to_owned(), &policy, UnixMs(5_000));
    assert_eq!(after, AfterFailure::Failed);
    assert_eq!(r.state, RunState::Failed);
    assert!(
        r.reason.as_deref().unwrap().contains("item 1 failed: boom again"),
        "{:?}",
        r.reason
    );
}

#[test]
fn a_for_each_over_nothing_is_done_at_once_and_over_a_non_list_fails_clearly() {
    let ev = Evaluator::default();
    let mut r = fan_out(2);
    r.advance(&ev, UnixMs(2_000));
    r.complete("plan", "[]".to_owned(), None, &ev, UnixMs(3_000));
    assert_eq!(items(&r.advance(&ev, UnixMs(3_000))), [(None, "Sum: []")]);

    let mut r = fan_out(2);
    r.advance(&ev, UnixMs(2_000));
    r.complete("plan", r#"{"not": "a list"}"#.to_owned(), None, &ev, UnixMs(3_000));
    assert!(r.advance(&ev, UnixMs(3_000)).is_empty());
    assert_eq!(r.state, RunState::Failed);
    let reason = r.reason.unwrap();
    assert!(reason.contains("not a list") && reason.contains("help:"), "{reason}");
}

#[test]
fn a_list_input_feeds_a_for_each() {
    let ev = Evaluator::default();
    let text = r#"
name: fan
inputs: { topics: { type: list } }
agents: { a: { model: Qwen/Qwen2.5-0.5B-Instruct } }
steps:
  - { id: each, agent: a, prompt: "About" }
"#;
    let mut workflow = skein_dsl::parse("t.yaml", text).workflow.expect("parses");
    workflow.steps[0].for_each = Some(ForEach {
        over: Expr("inputs.topics".to_owned()),
        max_parallel: 8,
    });
    workflow.steps[0].prompt = template("About {{ item }}");
    let given = BTreeMap::from([("topics".to_owned(), serde_json::json!(["rust", 7, true]))]);
    let inputs = typed_inputs(&workflow, &given).unwrap();
    let mut r = RunRecord::new("r".to_owned(), "alice".to_owned(), workflow.clone(), inputs, UnixMs(0));
    assert_eq!(
        items(&r.advance(&ev, UnixMs(1))),
        [(Some(0), "About rust"), (Some(1), "About 7"), (Some(2), "About true")]
    );
    // `--input topics='["a","b"]'` arrives as text; a list of maps does not fit.
    let given = BTreeMap::from([("topics".to_owned(), serde_json::json!(r#"["a","b"]"#))]);
    assert!(typed_inputs(&workflow, &given).is_ok());
    let given = BTreeMap::from([("topics".to_owned(), serde_json::json!([{"a": 1}]))]);
    let error = typed_inputs(&workflow, &given).unwrap_err().to_string();
    assert!(error.contains("a JSON list of strings, numbers or booleans"), "{error}");
}

/// `by`'s decision at `at_ms`.
fn decision(approved: bool, by: &str, comment: Option<&str>, at_ms: i64) -> Decision {
    Decision {
        approved,
        by: by.to_owned(),
        comment: comment.map(str::to_owned),
        at: UnixMs(at_ms),
    }
}

/// Records `decision` on step `step` as the run's task does.
fn decide(r: &mut RunRecord, step: &str, decision: Decision) -> Result<(), DecideError> {
    let on = Attempt {
        step: step.to_owned(),
        item: None,
    };
    r.decide(&on, decision, &Evaluator::default(), &RetryPolicy::default())
}

/// `each` becomes an approval step with `timeout`.
fn approval(timeout: Option<Duration>, on_timeout: OnTimeout) -> RunRecord {
    run_with(|w| {
        let each = w.steps.iter_mut().find(|s| s.id == "each").unwrap();
        each.agent = String::new();
        each.prompt = template("Publish {{ steps.plan.output }}?");
        each.approval = Some(Approval { timeout, on_timeout });
    })
}

#[test]
fn an_approval_waits_for_a_person_and_their_comment_is_its_output() {
    let ev = Evaluator::default();
    let mut r = approval(None, OnTimeout::Reject);
    r.advance(&ev, UnixMs(2_000));
    r.complete("plan", "the plan".to_owned(), None, &ev, UnixMs(3_000));
    assert!(
        r.advance(&ev, UnixMs(3_000)).is_empty(),
        "a person answers, not an agent"
    );
    let each = r.step("each").unwrap();
    assert_eq!(each.state, StepState::Waiting);
    assert_eq!(each.prompt.as_deref(), Some("Publish the plan?"));
    assert_eq!(r.reason.as_deref(), Some("waiting for approval of step `each`"));
    assert_eq!(r.next_retry(), None, "no deadline without a timeout");
    assert!(!r.agents_needed().contains(""));
    // Only a waiting approval step takes a decision.
    assert_eq!(
        decide(&mut r, "plan", decision(true, "bob", None, 3_500)),
        Err(DecideError::NotApproval("plan".to_owned()))
    );
    decide(&mut r, "each", decision(true, "bob", Some("ship it"), 4_000)).unwrap();
    let each = r.step("each").unwrap();
    assert_eq!(each.state, StepState::Done);
    assert_eq!(each.output.as_deref(), Some("ship it"));
    let decided = each.approval.as_ref().unwrap().decision.as_ref().unwrap();
    assert_eq!((decided.approved, decided.by.as_str()), (true, "bob"));
    assert!(matches!(
        decide(&mut r, "each", decision(false, "bob", None, 4_100)),
        Err(DecideError::NotWaiting { .. })
    ));
    assert_eq!(items(&r.advance(&ev, UnixMs(4_000))), [(None, "Sum: ship it")]);
    assert_eq!(r.reason, None);
}

#[test]
fn a_rejection_fails_the_run_with_who_and_why() {
    let ev = Evaluator::default();
    let mut r = approval(None, OnTimeout::Reject);
    r.advance(&ev, UnixMs(2_000));
    r.complete("plan", "p".to_owned(), None, &ev, UnixMs(3_000));
    r.advance(&ev, UnixMs(3_000));
    decide(&mut r, "each", decision(false, "carol", Some("too long"), 4_000)).unwrap();
    assert_eq!(r.state, RunState::Failed);
    assert_eq!(
        r.reason.as_deref(),
        Some("step `each` failed: rejected by carol: too long")
    );
    assert_eq!(r.step("sum").unwrap().state, StepState::Cancelled);
}

#[test]
fn an_approval_nobody_answers_times_out_as_its_workflow_says() {
    let ev = Evaluator::default();
    for (on_timeout, state) in [
        (OnTimeout::Reject, RunState::Failed),
        (OnTimeout::Approve, RunState::Running),
    ] {
        let mut r = approval(Some(Duration::from_secs(60)), on_timeout);
        r.advance(&ev, UnixMs(2_000));
        r.complete("plan", "p".to_owned(), None, &ev, UnixMs(3_000));
        r.advance(&ev, UnixMs(3_000));
        assert_eq!(r.next_retry(), Some(UnixMs(63_000)));
        assert!(r.advance(&ev, UnixMs(62_999)).is_empty());
        assert_eq!(r.step("each").unwrap().state, StepState::Waiting);
        let next = r.advance(&ev, UnixMs(63_000));
        assert_eq!(r.state, state, "{on_timeout:?}");
        let decision = r.step("each").unwrap().approval.clone().unwrap().decision.unwrap();
        assert_eq!(decision.by, "timeout");
        assert_eq!(next.len(), usize::from(on_timeout == OnTimeout::Approve));
    }
}

#[test]
fn a_waiting_approval_survives_a_restart() {
    let ev = Evaluator::default();
    let mut r = approval(None, OnTimeout::Reject);
    r.advance(&ev, UnixMs(2_000));
    r.complete("plan", "p".to_owned(), None, &ev, UnixMs(3_000));
    r.advance(&ev, UnixMs(3_000));
    let stored = serde_json::to_string(&r).unwrap();
    let mut r: RunRecord = serde_json::from_str(&stored).unwrap();
    r.recover();
    assert!(r.advance(&ev, UnixMs(10_000)).is_empty());
    assert_eq!(r.step("each").unwrap().state, StepState::Waiting);
    decide(&mut r, "each", decision(true, "bob", None, 11_000)).unwrap();
    assert_eq!(r.step("each").unwrap().output.as_deref(), Some(""));
}

#[test]
fn an_answer_is_held_to_the_steps_output_schema() {
    let r = run_with(|w| {
        w.steps[0].output_schema = Some(serde_json::json!({
            "type": "object",
            "properties": {"topics": {"type": "array", "items": {"type": "string"}}},
            "required": ["topics"],
        }));
    });
    assert_eq!(
        r.conform("plan", "```json\n{\"topics\": [\"a\", \"b\"]}\n```").unwrap(),
        r#"{"topics":["a","b"]}"#
    );
    let error = r.conform("plan", r#"{"topics": [1]}"#).unwrap_err();
    assert!(
        error.contains("output_schema") && error.contains("/topics/0"),
        "{error}"
    );
    let error = r.conform("plan", "Sure! Here are topics").unwrap_err();
    assert!(error.contains("output_schema"), "{error}");
    // A step without a schema keeps its answer as it is.
    assert_eq!(r.conform("each", "free text").unwrap(), "free text");
}
