//! Tool calls found in flight under `in_flight: ask`: an attempt about to resume whose
//! recorded agent loop holds a call that was sent but never returned, of a tool whose
//! policy is `ask`, does not start: the step (or its `for_each` item) waits for a person,
//! as an approval step does, with a text naming the call. Approved, the call is to be
//! sent again (it is `pending` once more) and the attempt resumes; rejected, the attempt
//! fails with `rejected by USER: COMMENT` and the step's `retries` apply, as under
//! `fail`. Pure, like the rest of the record.

use serde::{Deserialize, Serialize};
use skein_dsl::ir::{InFlight, Workflow};

use super::{
    ApprovalRecord, Attempt, CallState, Decision, ItemRecord, RetryPolicy, RunRecord, StepRecord, StepState, ToolCall,
    Turn, UnixMs,
};

/// The tool call an in-flight question is about: where it is in the attempt's loop.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct InFlightCall {
    /// The turn's index in the loop's `turns`, from 0.
    pub turn: u32,
    /// The call's index in the turn's `calls`, from 0.
    pub call: u32,
    /// The model's id of the call.
    pub id: String,
}

/// The longest part of a call's arguments an in-flight question quotes, in characters.
const QUOTED_ARGUMENTS: usize = 200;

impl ToolCall {
    /// What a resumed attempt does with this call if it was in flight: its tool's policy
    /// in `workflow`. A call of no known tool was never sent, so nothing can have
    /// happened twice; a server the workflow no longer declares fails it.
    pub fn in_flight_policy(&self, workflow: &Workflow) -> InFlight {
        match (&self.server, &self.tool) {
            (Some(server), Some(tool)) => workflow
                .tool_servers
                .get(server)
                .map_or(InFlight::Fail, |s| s.in_flight_of(tool)),
            _ => InFlight::Retry,
        }
    }
}

/// The question an attempt resuming with `turns` must have answered first, asked at
/// `now`: about its call that was in flight under `ask`, if it has one.
pub(super) fn question(workflow: &Workflow, turns: &[Turn], now: UnixMs) -> Option<ApprovalRecord> {
    let (t, c, call) = turns.iter().enumerate().find_map(|(t, turn)| {
        turn.calls.iter().enumerate().find_map(|(c, call)| {
            (call.state == CallState::Sent && call.in_flight_policy(workflow) == InFlight::Ask).then_some((t, c, call))
        })
    })?;
    Some(ApprovalRecord {
        requested_at: now,
        deadline: None,
        decision: None,
        text: Some(text(call)),
        in_flight: Some(InFlightCall {
            turn: u32::try_from(t).unwrap_or(u32::MAX),
            call: u32::try_from(c).unwrap_or(u32::MAX),
            id: call.id.clone(),
        }),
    })
}

/// What a person reads: the call, why it is asked about, and what each answer does.
fn text(call: &ToolCall) -> String {
    let mut arguments: String = call.arguments.chars().take(QUOTED_ARGUMENTS).collect();
    if call.arguments.chars().count() > QUOTED_ARGUMENTS {
        arguments.push('…');
    }
    let tool = match (&call.server, &call.tool) {
        (Some(server), Some(tool)) => format!(" (tool `{tool}` of server `{server}`)"),
        _ => String::new(),
    };
    format!(
        "tool call {} `{}`{tool} with arguments {arguments} was in flight when its attempt was interrupted (the orchestrator stopped, or its instance was lost): it may or may not have run, and its server's `in_flight` policy for it is `ask`. Approve to send it again; reject to fail the attempt (the step's `retries` then apply).",
        call.id, call.name
    )
}

/// The fields of a step or an item that an in-flight question and its decision change.
struct Asking<'a> {
    state: &'a mut StepState,
    attempts: &'a mut u32,
    started_at: &'a mut Option<UnixMs>,
    turns: &'a mut Vec<Turn>,
    approval: &'a mut Option<ApprovalRecord>,
}

impl<'a> Asking<'a> {
    fn step(record: &'a mut StepRecord) -> Self {
        Asking {
            state: &mut record.state,
            attempts: &mut record.attempts,
            started_at: &mut record.started_at,
            turns: &mut record.turns,
            approval: &mut record.approval,
        }
    }

    fn item(item: &'a mut ItemRecord) -> Self {
        Asking {
            state: &mut item.state,
            attempts: &mut item.attempts,
            started_at: &mut item.started_at,
            turns: &mut item.turns,
            approval: &mut item.approval,
        }
    }

    /// The fields of `attempt`'s step or item among `steps`.
    fn of(steps: &'a mut [StepRecord], attempt: &Attempt) -> Option<Self> {
        let record = steps.iter_mut().find(|s| s.id == attempt.step)?;
        match attempt.item {
            Some(index) => record.items.get_mut(index as usize).map(Asking::item),
            None => Some(Asking::step(record)),
        }
    }

    /// Waits for a person if the recorded loop holds a call in flight under `ask`,
    /// instead of starting at `now`: the attempt counts as started (a rejection is its
    /// failure). Returns whether it waits.
    fn ask(self, workflow: &Workflow, now: UnixMs) -> bool {
        let Some(question) = question(workflow, self.turns, now) else {
            return false;
        };
        *self.state = StepState::Waiting;
        *self.attempts += 1;
        *self.started_at = Some(now);
        *self.approval = Some(question);
        true
    }
}

/// Item `item` of a `for_each` step of `workflow`, about to start at `now`, waits
/// instead if its recorded agent loop holds a call in flight under `ask`. Returns
/// whether it waits.
pub(super) fn ask_item(workflow: &Workflow, item: &mut ItemRecord, now: UnixMs) -> bool {
    Asking::item(item).ask(workflow, now)
}

impl RunRecord {
    /// Step `id`, about to start at `now`, waits instead if its recorded agent loop
    /// holds a call in flight under `ask`. Returns whether it waits.
    pub(super) fn ask_step(&mut self, id: &str, now: UnixMs) -> bool {
        let workflow = &self.workflow;
        self.steps
            .iter_mut()
            .find(|s| s.id == id)
            .is_some_and(|record| Asking::step(record).ask(workflow, now))
    }

    /// Records `decision` on the in-flight question `on` waits for (checked by the
    /// caller): approved, the call is pending again and the attempt starts anew (not
    /// counted twice), resuming its loop; rejected, the attempt fails with
    /// `rejected by USER: COMMENT`, and the step's `retries` apply under `retry`.
    pub(super) fn decide_in_flight(&mut self, on: &Attempt, decision: Decision, retry: &RetryPolicy) {
        let now = decision.at;
        let why = decision.rejection();
        let approved = decision.approved;
        // The item (its state, its question, its loop) or the step's loop is written.
        match on.item {
            Some(index) => self.changed.items.insert((on.step.clone(), index)),
            None => self.changed.turns_of.insert(on.step.clone()),
        };
        let Some(asking) = Asking::of(&mut self.steps, on) else {
            return;
        };
        let Some(approval) = asking.approval.as_mut() else {
            return;
        };
        let call = approval.in_flight.clone();
        approval.decision = Some(decision);
        if !approved {
            *asking.state = StepState::Running;
            self.fail_attempt_of(&on.step, on.item, why, retry, now);
            return;
        }
        if let Some(at) = call
            && let Some(call) = asking
                .turns
                .get_mut(at.turn as usize)
                .and_then(|t| t.calls.get_mut(at.call as usize))
            && call.state == CallState::Sent
        {
            call.state = CallState::Pending;
        }
        // Started again by the next advance, which counts the attempt once more.
        *asking.state = match on.item {
            Some(_) => StepState::Pending,
            None => StepState::Queued,
        };
        *asking.attempts = asking.attempts.saturating_sub(1);
        *asking.started_at = None;
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use skein_dsl::expr::Evaluator;

    use super::*;
    use crate::run::record::{DecideError, LoopChange, Next, RunState, typed_inputs};

    /// `work` calls `tools.send` (under `ask`) and `tools.read` (under `POLICY`); `each`
    /// runs over two items, two at a time, with the same agent.
    fn run(policy: &str, retries: u32) -> RunRecord {
        let yaml = format!(
            r#"
name: asking
inputs: {{ topics: {{ type: list, default: [owls, bats] }} }}
tool_servers:
  tools: {{ command: [mcp-tools], in_flight: {{ send: ask, "*": {policy} }} }}
agents:
  worker: {{ model: Qwen/Qwen2.5-0.5B-Instruct, tools: [tools.*] }}
steps:
  - {{ id: work, agent: worker, prompt: "Work", retries: {retries} }}
  - {{ id: each, agent: worker, after: [work], prompt: "About {{{{ item }}}}", retries: {retries}, for_each: {{ over: inputs.topics, max_parallel: 2 }} }}
"#
        );
        let parsed = skein_dsl::parse("asking.yaml", &yaml);
        let workflow = parsed.workflow.expect("the workflow parses");
        let inputs = typed_inputs(&workflow, &BTreeMap::new()).expect("the defaults fit");
        RunRecord::new("r1".to_owned(), "alice".to_owned(), workflow, inputs, UnixMs(1_000))
    }

    /// The attempt `on` asks for tool `tool` (its turn's first call) and sends it:
    /// recorded `sent`, never returned.
    fn in_flight(r: &mut RunRecord, on: &Attempt, tool: &str, arguments: &str) {
        let call = ToolCall::pending(
            "call_0".to_owned(),
            format!("tools__{tool}"),
            arguments.to_owned(),
            Some(("tools".to_owned(), tool.to_owned())),
        );
        let turn = Turn {
            content: None,
            calls: vec![call],
            at: UnixMs(2_100),
            usage: None,
        };
        assert!(r.record_loop(&on.step, on.item, LoopChange::Turn(turn)));
        let sent = LoopChange::Sent {
            turn: 0,
            call: 0,
            at: UnixMs(2_200),
        };
        assert!(r.record_loop(&on.step, on.item, sent));
    }

    /// The orchestrator dies and starts again on the stored record.
    fn restart(r: &RunRecord) -> RunRecord {
        let mut r: RunRecord = serde_json::from_str(&serde_json::to_string(r).expect("serializes")).expect("reads");
        r.recover();
        r
    }

    fn decision(approved: bool, comment: Option<&str>, at_ms: i64) -> Decision {
        Decision {
            approved,
            by: "bob".to_owned(),
            comment: comment.map(str::to_owned),
            at: UnixMs(at_ms),
        }
    }

    fn step(id: &str) -> Attempt {
        Attempt {
            step: id.to_owned(),
            item: None,
        }
    }

    fn item(id: &str, index: u32) -> Attempt {
        Attempt {
            step: id.to_owned(),
            item: Some(index),
        }
    }

    fn started(next: &[Next]) -> Vec<Attempt> {
        next.iter()
            .map(|Next::Start { step, item, .. }| Attempt {
                step: step.clone(),
                item: *item,
            })
            .collect()
    }

    fn call(turns: &[Turn]) -> &ToolCall {
        &turns[0].calls[0]
    }

    #[test]
    fn a_call_in_flight_under_ask_makes_its_step_wait_and_an_approval_sends_it_again() {
        let (ev, retry) = (Evaluator::default(), RetryPolicy::default());
        let mut r = run("retry", 0);
        assert_eq!(started(&r.advance(&ev, UnixMs(2_000))), [step("work")]);
        in_flight(&mut r, &step("work"), "send", r#"{"to": "ops@example.org"}"#);

        let mut r = restart(&r);
        assert!(r.advance(&ev, UnixMs(5_000)).is_empty(), "it waits for a person");
        let work = r.step("work").expect("the step");
        assert_eq!((work.state, work.attempts), (StepState::Waiting, 1));
        assert_eq!(r.state, RunState::Running);
        assert_eq!(r.reason.as_deref(), Some("waiting for approval of step `work`"));
        let question = work.approval.clone().expect("a question");
        assert_eq!(question.requested_at, UnixMs(5_000));
        assert_eq!((question.deadline, &question.decision), (None, &None));
        assert_eq!(
            question.in_flight,
            Some(InFlightCall {
                turn: 0,
                call: 0,
                id: "call_0".to_owned()
            })
        );
        let text = question.text.expect("its text");
        for part in [
            "tool call call_0 `tools__send`",
            "tool `send` of server `tools`",
            r#"{"to": "ops@example.org"}"#,
            "Approve to send it again; reject to fail the attempt",
        ] {
            assert!(text.contains(part), "{part:?} in {text}");
        }
        assert_eq!(r.next_retry(), None, "no deadline");

        // Still waiting after another restart, the question as it was.
        let mut r = restart(&r);
        assert!(r.advance(&ev, UnixMs(9_000)).is_empty());
        assert_eq!(
            r.step("work").and_then(|w| w.approval.as_ref()).map(|a| a.requested_at),
            Some(UnixMs(5_000))
        );

        r.take_changed();
        r.decide(&step("work"), decision(true, Some("it is safe"), 10_000), &ev, &retry)
            .expect("the step waits");
        assert!(r.take_changed().turns_of.contains("work"), "the loop is to be written");
        let work = r.step("work").expect("the step");
        assert_eq!(work.state, StepState::Queued);
        assert_eq!(call(&work.turns).state, CallState::Pending, "to be sent again");
        assert_eq!(call(&work.turns).sends, 1);
        let decided = work
            .approval
            .as_ref()
            .and_then(|a| a.decision.as_ref())
            .expect("decided");
        assert_eq!(
            (decided.approved, decided.by.as_str(), decided.comment.as_deref()),
            (true, "bob", Some("it is safe"))
        );
        // The attempt resumes, counted once, its loop as recorded.
        assert_eq!(started(&r.advance(&ev, UnixMs(10_000))), [step("work")]);
        let work = r.step("work").expect("the step");
        assert_eq!((work.state, work.attempts), (StepState::Running, 1));
        assert_eq!(r.turns_of(&step("work")).len(), 1);
        assert_eq!(r.reason, None, "nothing waits");
        // A second decision finds nothing waiting.
        assert_eq!(
            r.decide(&step("work"), decision(false, None, 11_000), &ev, &retry),
            Err(DecideError::NotWaiting {
                step: "work".to_owned(),
                state: StepState::Running
            })
        );
    }

    #[test]
    fn a_rejection_fails_the_attempt_and_the_steps_retries_apply() {
        let (ev, retry) = (Evaluator::default(), RetryPolicy::default());
        for retries in [0, 1] {
            let mut r = run("retry", retries);
            r.advance(&ev, UnixMs(2_000));
            in_flight(&mut r, &step("work"), "send", "{}");
            let mut r = restart(&r);
            r.advance(&ev, UnixMs(5_000));
            r.decide(&step("work"), decision(false, Some("not twice"), 6_000), &ev, &retry)
                .expect("the step waits");
            let work = r.step("work").expect("the step");
            assert_eq!(work.error.as_deref(), Some("rejected by bob: not twice"));
            match retries {
                0 => {
                    assert_eq!((work.state, r.state), (StepState::Failed, RunState::Failed));
                    assert_eq!(
                        r.reason.as_deref(),
                        Some("step `work` failed: rejected by bob: not twice")
                    );
                }
                _ => {
                    assert_eq!((work.state, work.retry_at), (StepState::Retrying, Some(UnixMs(7_000))));
                    assert!(work.turns.is_empty(), "the next attempt is a new loop");
                    assert_eq!(started(&r.advance(&ev, UnixMs(7_000))), [step("work")]);
                    assert_eq!(r.step("work").map(|w| w.attempts), Some(2));
                }
            }
        }
    }

    #[test]
    fn only_a_call_under_ask_waits_for_a_person() {
        let ev = Evaluator::default();
        for policy in ["retry", "fail"] {
            let mut r = run(policy, 0);
            r.advance(&ev, UnixMs(2_000));
            in_flight(&mut r, &step("work"), "read", "{}");
            let mut r = restart(&r);
            // The agent loop applies `retry` or `fail` as it resumes.
            assert_eq!(started(&r.advance(&ev, UnixMs(5_000))), [step("work")], "{policy}");
            assert_eq!(r.step("work").and_then(|w| w.approval.clone()), None);
        }
        // A returned call is done with, whatever its policy.
        let mut r = run("fail", 0);
        r.advance(&ev, UnixMs(2_000));
        in_flight(&mut r, &step("work"), "send", "{}");
        let returned = LoopChange::Returned {
            turn: 0,
            call: 0,
            result: "sent".to_owned(),
            is_error: false,
            at: UnixMs(2_300),
        };
        assert!(r.record_loop("work", None, returned));
        let mut r = restart(&r);
        assert_eq!(started(&r.advance(&ev, UnixMs(5_000))), [step("work")]);
    }

    #[test]
    fn an_item_waits_alone_and_is_decided_by_its_index() {
        let (ev, retry) = (Evaluator::default(), RetryPolicy::default());
        let mut r = run("retry", 1);
        r.advance(&ev, UnixMs(2_000));
        r.complete("work", "done".to_owned(), None, &ev, UnixMs(3_000));
        assert_eq!(
            started(&r.advance(&ev, UnixMs(3_000))),
            [item("each", 0), item("each", 1)]
        );
        in_flight(&mut r, &item("each", 1), "send", "{}");

        let mut r = restart(&r);
        r.take_changed();
        // Item 0 runs again; item 1 waits, which the store is to write.
        assert_eq!(started(&r.advance(&ev, UnixMs(5_000))), [item("each", 0)]);
        assert!(r.take_changed().items.contains(&("each".to_owned(), 1)));
        let each = r.step("each").expect("the step");
        assert_eq!(each.state, StepState::Running);
        assert_eq!((each.items[1].state, each.items[1].attempts), (StepState::Waiting, 1));
        assert!(each.items[1].approval.as_ref().is_some_and(|a| a.in_flight.is_some()));
        assert_eq!(r.reason.as_deref(), Some("waiting for approval of step `each` item 1"));
        assert_eq!(r.waiting().collect::<Vec<_>>(), [item("each", 1)]);

        // The item must be named, and exist, and wait.
        assert_eq!(
            r.decide(&step("each"), decision(true, None, 6_000), &ev, &retry),
            Err(DecideError::ItemNeeded {
                step: "each".to_owned(),
                items: vec![1]
            })
        );
        let error = DecideError::ItemNeeded {
            step: "each".to_owned(),
            items: vec![1],
        };
        assert!(
            error
                .to_string()
                .contains("item 1 waits for approval; name the item: `--item N`"),
            "{error}"
        );
        assert_eq!(
            r.decide(&item("each", 2), decision(true, None, 6_000), &ev, &retry),
            Err(DecideError::NoItem {
                step: "each".to_owned(),
                item: 2,
                items: 2
            })
        );
        assert!(matches!(
            r.decide(&item("each", 0), decision(true, None, 6_000), &ev, &retry),
            Err(DecideError::ItemNotWaiting {
                item: 0,
                state: StepState::Running,
                ..
            })
        ));
        assert!(matches!(
            r.decide(&item("work", 0), decision(true, None, 6_000), &ev, &retry),
            Err(DecideError::NoItem { items: 0, .. })
        ));

        // Rejected: the item's attempt fails and is retried (a new loop).
        r.decide(&item("each", 1), decision(false, None, 6_000), &ev, &retry)
            .expect("the item waits");
        let one = &r.step("each").expect("the step").items[1];
        assert_eq!(
            (one.state, one.error.as_deref()),
            (StepState::Retrying, Some("rejected by bob"))
        );
        assert!(one.turns.is_empty());
        assert_eq!(started(&r.advance(&ev, UnixMs(7_000))), [item("each", 1)]);
        assert_eq!(r.reason, None, "nothing waits");
        assert_eq!(r.step("each").map(|s| s.items[1].attempts), Some(2));

        // In flight again at another restart: asked again, and approved this time.
        in_flight(&mut r, &item("each", 1), "send", "{}");
        let mut r = restart(&r);
        assert_eq!(started(&r.advance(&ev, UnixMs(8_000))), [item("each", 0)]);
        r.take_changed();
        r.decide(&item("each", 1), decision(true, None, 9_000), &ev, &retry)
            .expect("the item waits");
        assert!(r.take_changed().items.contains(&("each".to_owned(), 1)));
        let one = &r.step("each").expect("the step").items[1];
        assert_eq!((one.state, one.attempts), (StepState::Pending, 1));
        assert_eq!(call(&one.turns).state, CallState::Pending);
        assert_eq!(started(&r.advance(&ev, UnixMs(9_000))), [item("each", 1)]);
        assert_eq!(r.step("each").map(|s| s.items[1].attempts), Some(2));
    }

    #[test]
    fn the_question_quotes_at_most_200_characters_of_the_arguments() {
        let mut call = ToolCall::pending(
            "call_7".to_owned(),
            "tools__send".to_owned(),
            format!(r#"{{"body": "{}"}}"#, "é".repeat(300)),
            Some(("tools".to_owned(), "send".to_owned())),
        );
        call.state = CallState::Sent;
        let text = text(&call);
        let quoted: String = call.arguments.chars().take(QUOTED_ARGUMENTS).collect();
        assert!(text.contains(&format!("{quoted}… was in flight")), "{text}");
        assert!(!text.contains(&call.arguments));
    }
}
