//! Runs as the store keeps them: the head under the run's id, each `for_each` item and
//! each agent loop under keys of their own, written when the record marks them
//! changed. Each test drives a record the way the executor does, writes it after every
//! change, and reads it back whole: what was written is what the record holds.

use std::collections::BTreeMap;

use serde_json::Value;
use skein_dsl::expr::Evaluator;
use skein_dsl::ir::{Expr, ForEach, Repeat, Template};
use skein_orchestrator::run::record::{
    LoopChange, RetryPolicy, RunRecord, StepState, ToolCall, Turn, UnixMs, typed_inputs,
};
use skein_orchestrator::run::stored::RunStore;
use skein_orchestrator::store::{Db, Tree};

const BASE: &str = r#"
name: stored
agents:
  writer: { model: Qwen/Qwen2.5-0.5B-Instruct }
steps:
  - { id: plan, agent: writer, prompt: "Plan" }
  - { id: each, agent: writer, after: [plan], prompt: "Write about" }
  - { id: sum, agent: writer, after: [each], prompt: "Sum: {{ steps.each.output }}" }
"#;

fn template(text: &str) -> Template {
    skein_dsl::template::unchecked(text).expect("a template")
}

/// `each` runs over the JSON list `plan` answers, two at a time, with a retry; `sum`
/// sends the run back to `each` once unless its answer says "ok".
fn fan_out() -> RunRecord {
    let mut workflow = skein_dsl::parse("test.yaml", BASE)
        .workflow
        .expect("the workflow parses");
    let each = workflow.steps.iter_mut().find(|s| s.id == "each").unwrap();
    each.for_each = Some(ForEach {
        over: Expr("steps.plan.output.json".to_owned()),
        max_parallel: 2,
    });
    each.prompt = template("Write about {{ item }}");
    each.retries = 1;
    let sum = workflow.steps.iter_mut().find(|s| s.id == "sum").unwrap();
    sum.repeat = Some(Repeat {
        back_to: "each".to_owned(),
        until: Expr(r#"steps.sum.output.contains("ok")"#.to_owned()),
        max: 1,
    });
    let inputs = typed_inputs(&workflow, &BTreeMap::new()).unwrap();
    RunRecord::new("r1".to_owned(), "alice".to_owned(), workflow, inputs, UnixMs(1_000))
}

fn turn(arguments: &str) -> Turn {
    Turn {
        content: None,
        calls: vec![ToolCall::pending(
            "call_1".to_owned(),
            "files__read".to_owned(),
            arguments.to_owned(),
            Some(("files".to_owned(), "read".to_owned())),
        )],
        at: UnixMs(2_500),
        usage: None,
    }
}

/// Writes `run` and reads it back: the same record.
fn written(store: &RunStore, run: &mut RunRecord, after: &str) {
    store.put_blocking(run).unwrap();
    let read = store.get(&run.id).unwrap().expect("the run is stored");
    assert_eq!(
        &read, run,
        "the record read back after {after} differs from the one written"
    );
}

/// The stored head of `id`, as JSON.
fn head(db: &Db, id: &str) -> Value {
    let heads: Tree<Value> = db.tree("runs").unwrap();
    heads.get(id).unwrap().expect("the head is stored")
}

#[test]
fn every_change_of_items_and_loops_is_written_and_read_back_whole() {
    let db = Db::temporary().unwrap();
    let store = RunStore::open(&db).unwrap();
    let ev = Evaluator::default();
    let policy = RetryPolicy::default();
    let mut r = fan_out();
    written(&store, &mut r, "submission");

    // `plan` runs an agent loop: a turn, its call sent, its result.
    r.advance(&ev, UnixMs(2_000));
    written(&store, &mut r, "plan's start");
    assert!(r.record_loop("plan", None, LoopChange::Turn(turn(r#"{"path":"a"}"#))));
    written(&store, &mut r, "plan's turn");
    assert!(r.record_loop(
        "plan",
        None,
        LoopChange::Sent {
            turn: 0,
            call: 0,
            at: UnixMs(2_600)
        }
    ));
    written(&store, &mut r, "plan's call sent");
    let returned = LoopChange::Returned {
        turn: 0,
        call: 0,
        result: "a, b, c".to_owned(),
        is_error: false,
        at: UnixMs(2_700),
    };
    assert!(r.record_loop("plan", None, returned));
    written(&store, &mut r, "plan's call returned");
    r.complete(
        "plan",
        r#"["owls", "bats", "moths"]"#.to_owned(),
        None,
        &ev,
        UnixMs(3_000),
    );
    written(&store, &mut r, "plan's answer");

    // `each` expands into three items, two start; item 1 has a loop, fails and retries.
    assert_eq!(r.advance(&ev, UnixMs(3_000)).len(), 2);
    written(&store, &mut r, "the expansion");
    assert!(r.record_loop("each", Some(1), LoopChange::Turn(turn(r#"{"path":"bats"}"#))));
    written(&store, &mut r, "item 1's turn");
    let failed = r.fail_attempt_of("each", Some(1), "engine gone".to_owned(), &policy, UnixMs(3_500));
    assert!(matches!(
        failed,
        skein_orchestrator::run::record::AfterFailure::RetryAt(_)
    ));
    written(&store, &mut r, "item 1's failure");
    assert!(
        r.step("each").unwrap().items[1].turns.is_empty(),
        "a retried item starts a new loop"
    );
    r.complete_attempt("each", Some(0), "O".to_owned(), None, &ev, UnixMs(3_600));
    written(&store, &mut r, "item 0's answer");
    assert_eq!(r.advance(&ev, UnixMs(9_000)).len(), 2);
    written(&store, &mut r, "items 1 and 2 starting");

    // The orchestrator dies: what was written is all there is.
    let mut r = store.get("r1").unwrap().unwrap();
    r.recover();
    written(&store, &mut r, "recovery");
    assert_eq!(r.advance(&ev, UnixMs(10_000)).len(), 2);
    written(&store, &mut r, "the restart");
    for (index, answer) in [(2, "M"), (1, "B")] {
        r.complete_attempt("each", Some(index), answer.to_owned(), None, &ev, UnixMs(11_000));
        written(&store, &mut r, "an item's answer");
    }
    assert_eq!(r.step("each").unwrap().output.as_deref(), Some(r#"["O","B","M"]"#));

    // `sum` sends the run back: `each` starts a new pass whose list is shorter.
    r.advance(&ev, UnixMs(12_000));
    r.complete("sum", "again".to_owned(), None, &ev, UnixMs(12_500));
    written(&store, &mut r, "the repeat");
    assert!(r.step("each").unwrap().items.is_empty());
    r.advance(&ev, UnixMs(13_000));
    written(&store, &mut r, "the second pass's expansion");
    assert_eq!(r.step("each").unwrap().items.len(), 3);

    // The head holds no item and no loop: those are under their own keys.
    let stored = head(&db, "r1");
    for step in stored["steps"].as_array().unwrap() {
        assert!(step.get("items").is_none() && step.get("turns").is_none(), "{step:#}");
    }
}

#[test]
fn a_second_pass_with_fewer_items_leaves_none_of_the_first_behind() {
    let db = Db::temporary().unwrap();
    let store = RunStore::open(&db).unwrap();
    let ev = Evaluator::default();
    let mut r = fan_out();
    r.advance(&ev, UnixMs(2_000));
    r.complete("plan", r#"["a", "b", "c", "d"]"#.to_owned(), None, &ev, UnixMs(3_000));
    r.advance(&ev, UnixMs(3_000));
    for index in 0..4 {
        r.advance(&ev, UnixMs(3_000));
        r.complete_attempt("each", Some(index), format!("{index}"), None, &ev, UnixMs(3_100));
        written(&store, &mut r, "an item's answer");
    }
    r.advance(&ev, UnixMs(4_000));
    r.complete("sum", "again".to_owned(), None, &ev, UnixMs(4_500));
    written(&store, &mut r, "the repeat");
    // The second pass reads a different list (the inputs of a pass are re-evaluated).
    r.steps[0].output = Some(r#"["x"]"#.to_owned());
    r.advance(&ev, UnixMs(5_000));
    written(&store, &mut r, "the second expansion");
    assert_eq!(r.step("each").unwrap().items.len(), 1);
    let items: Tree<Value> = db.tree("run_items").unwrap();
    assert_eq!(items.len(), 1, "the first pass's items were removed");
}

#[test]
fn a_record_stored_whole_by_an_older_server_reads_whole_and_is_split_at_its_next_write() {
    let db = Db::temporary().unwrap();
    let ev = Evaluator::default();
    let mut r = fan_out();
    r.advance(&ev, UnixMs(2_000));
    assert!(r.record_loop("plan", None, LoopChange::Turn(turn("{}"))));
    r.complete("plan", r#"["a", "b"]"#.to_owned(), None, &ev, UnixMs(3_000));
    r.advance(&ev, UnixMs(3_000));
    r.complete_attempt("each", Some(0), "A".to_owned(), None, &ev, UnixMs(3_500));
    // An older server wrote the record whole, items and loops inline.
    let whole: Tree<RunRecord> = db.tree("runs").unwrap();
    whole.put_blocking("r1", &r).unwrap();
    assert!(head(&db, "r1")["steps"][1].get("items").is_some());

    let store = RunStore::open(&db).unwrap();
    let mut read = store.get("r1").unwrap().unwrap();
    assert_eq!(read, r);
    // Its next write, whatever it changes, moves every part to its own key.
    read.reason = Some("resumed".to_owned());
    store.put_blocking(&mut read).unwrap();
    assert!(head(&db, "r1")["steps"][1].get("items").is_none());
    let again = store.get("r1").unwrap().unwrap();
    assert_eq!(again, read);
    assert_eq!(again.step("each").unwrap().items[0].state, StepState::Done);
    assert_eq!(again.step("plan").unwrap().turns.len(), 1);
}
