//! Approval steps as the run's durable record keeps them: the text to approve is
//! rendered when the step becomes ready, the step waits (with its deadline, if it has a
//! timeout) until a person approves or rejects it, and the decision is recorded with
//! who made it. A tool call found in flight under `in_flight: ask` waits for a decision
//! the same way ([`super::in_flight`]), on its step or on its `for_each` item. Pure, like
//! the rest of the record.

use serde::{Deserialize, Serialize};
use skein_dsl::expr::Evaluator;
use skein_dsl::ir::{OnTimeout, Step};

use super::in_flight::InFlightCall;
use super::{Attempt, RetryPolicy, RunRecord, StepState, UnixMs};

/// The approval of a waiting (or decided) approval step, or of a tool call that was in
/// flight under `in_flight: ask` (on its step, or on its `for_each` item).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ApprovalRecord {
    /// When it started waiting.
    pub requested_at: UnixMs,
    /// When it times out, if it has a timeout.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline: Option<UnixMs>,
    /// The decision, once made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decision: Option<Decision>,
    /// What is asked, when it is not an approval step's text (which is the step's
    /// `prompt`): which tool call was in flight, and what each answer does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// The tool call in flight this asks about: approved, it is sent again; rejected,
    /// the attempt fails.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub in_flight: Option<InFlightCall>,
}

/// A person's answer to an approval step (or its timeout's).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Decision {
    /// Approved or not.
    pub approved: bool,
    /// Who decided: a user name, or `timeout`.
    pub by: String,
    /// Their comment.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub comment: Option<String>,
    /// When.
    pub at: UnixMs,
}

impl Decision {
    /// What a rejection records as the failure: `rejected by USER: COMMENT`.
    pub(super) fn rejection(&self) -> String {
        match &self.comment {
            Some(c) => format!("rejected by {}: {c}", self.by),
            None => format!("rejected by {}", self.by),
        }
    }
}

/// Why a decision was not recorded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecideError {
    /// The run has no such step.
    #[error("the run has no step `{0}`")]
    NoStep(String),
    /// The step is not an approval step, and no tool call of it waits for a decision.
    #[error(
        "step `{0}` is not an approval step; only approval steps, and tool calls in flight under `in_flight: ask`, are approved or rejected"
    )]
    NotApproval(String),
    /// The step is not waiting (not reached yet, or decided).
    #[error("step `{step}` is {state}, not waiting for approval")]
    NotWaiting {
        /// The step.
        step: String,
        /// Its state.
        state: StepState,
    },
    /// The step has no such item.
    #[error("step `{step}` has no item {item}{}", if *.items == 0 { " (it is not a `for_each` step, or its list is not evaluated yet)".to_owned() } else { format!(" (its items are 0 to {})", .items - 1) })]
    NoItem {
        /// The step.
        step: String,
        /// The item asked for.
        item: u32,
        /// How many items it has.
        items: usize,
    },
    /// The item is not waiting.
    #[error("step `{step}` item {item} is {state}, not waiting for approval")]
    ItemNotWaiting {
        /// The step.
        step: String,
        /// The item.
        item: u32,
        /// Its state.
        state: StepState,
    },
    /// Items of the step wait, not the step: which one is decided must be said.
    #[error(
        "step `{step}` is running, and its item{} {} wait{} for approval; name the item: `--item N` (the CLI) or `\"item\": N` (the request body)",
        if .items.len() == 1 { "" } else { "s" },
        .items.iter().map(u32::to_string).collect::<Vec<_>>().join(", "),
        if .items.len() == 1 { "s" } else { "" }
    )]
    ItemNeeded {
        /// The step.
        step: String,
        /// Its waiting items.
        items: Vec<u32>,
    },
}

/// The longest comment a decision keeps, in bytes.
pub const MAX_COMMENT_BYTES: usize = 4096;

impl RunRecord {
    /// Approval step `step` starts waiting, its text (rendered) in its prompt.
    pub(super) fn await_approval(&mut self, step: &Step, text: String, now: UnixMs) {
        let Some(approval) = &step.approval else { return };
        let deadline = approval.timeout.map(|t| now.plus(t));
        let Some(record) = self.step_mut(&step.id) else { return };
        record.state = StepState::Waiting;
        record.queued_at.get_or_insert(now);
        record.started_at = Some(now);
        record.attempts = 1;
        record.prompt = Some(text);
        record.approval = Some(ApprovalRecord {
            requested_at: now,
            deadline,
            decision: None,
            text: None,
            in_flight: None,
        });
    }

    /// Records `decision` on what `on` waits for: approval step `on.step`, or a tool
    /// call in flight under `ask` on step `on.step` or its item `on.item` (see
    /// [`super::in_flight`]; a rejected attempt is retried under `retry`). The comment
    /// is cut to [`MAX_COMMENT_BYTES`].
    ///
    /// Errors: no such step or item, a step that is neither an approval step nor asks
    /// about a call, nothing waiting there, or items waiting where `on` names none.
    pub fn decide(
        &mut self,
        on: &Attempt,
        mut decision: Decision,
        evaluator: &Evaluator,
        retry: &RetryPolicy,
    ) -> Result<(), DecideError> {
        decision.comment = decision
            .comment
            .map(|mut c| {
                skein_text::truncate_at_char(&mut c, MAX_COMMENT_BYTES);
                c
            })
            .filter(|c| !c.is_empty());
        let id = on.step.as_str();
        let Some(record) = self.step(id) else {
            return Err(DecideError::NoStep(id.to_owned()));
        };
        if let Some(index) = on.item {
            let Some(item) = record.items.get(index as usize) else {
                return Err(DecideError::NoItem {
                    step: id.to_owned(),
                    item: index,
                    items: record.items.len(),
                });
            };
            if item.state != StepState::Waiting {
                return Err(DecideError::ItemNotWaiting {
                    step: id.to_owned(),
                    item: index,
                    state: item.state,
                });
            }
            self.decide_in_flight(on, decision, retry);
            return Ok(());
        }
        if record.state == StepState::Waiting && record.approval.as_ref().is_some_and(|a| a.in_flight.is_some()) {
            self.decide_in_flight(on, decision, retry);
            return Ok(());
        }
        let waiting: Vec<u32> = record
            .items
            .iter()
            .filter(|i| i.state == StepState::Waiting)
            .map(|i| i.index)
            .collect();
        if !waiting.is_empty() {
            return Err(DecideError::ItemNeeded {
                step: id.to_owned(),
                items: waiting,
            });
        }
        self.decide_approval_step(id, decision, evaluator)
    }

    /// Records `decision` on waiting approval step `id`: approved, the step is done with
    /// the comment as its output; rejected, the step fails and the run with it.
    fn decide_approval_step(&mut self, id: &str, decision: Decision, evaluator: &Evaluator) -> Result<(), DecideError> {
        let is_approval_step = self.workflow.step(id).is_some_and(|s| s.approval.is_some());
        let Some(record) = self.step_mut(id) else {
            return Err(DecideError::NoStep(id.to_owned()));
        };
        if record.state != StepState::Waiting {
            return match record.approval.is_some() || is_approval_step {
                true => Err(DecideError::NotWaiting {
                    step: id.to_owned(),
                    state: record.state,
                }),
                false => Err(DecideError::NotApproval(id.to_owned())),
            };
        }
        let Some(approval) = record.approval.as_mut() else {
            return Err(DecideError::NotApproval(id.to_owned()));
        };
        let (approved, now, comment) = (decision.approved, decision.at, decision.comment.clone());
        let why = decision.rejection();
        approval.decision = Some(decision);
        if approved {
            record.state = StepState::Running;
            self.complete(id, comment.unwrap_or_default(), None, evaluator, now);
        } else {
            self.fail_step(id, why, now);
        }
        Ok(())
    }

    /// Decides the waiting approvals whose deadline has passed, as their `on_timeout`
    /// says.
    pub(super) fn time_out_approvals(&mut self, evaluator: &Evaluator, now: UnixMs) {
        let due: Vec<(String, bool)> = self
            .steps
            .iter()
            .filter(|s| s.state == StepState::Waiting)
            .filter(|s| s.approval.as_ref().and_then(|a| a.deadline).is_some_and(|d| d <= now))
            .filter_map(|s| {
                let on_timeout = self.workflow.step(&s.id)?.approval.as_ref()?.on_timeout;
                Some((s.id.clone(), on_timeout == OnTimeout::Approve))
            })
            .collect();
        for (id, approved) in due {
            let decision = Decision {
                approved,
                by: "timeout".to_owned(),
                comment: None,
                at: now,
            };
            let _ = self.decide_approval_step(&id, decision, evaluator);
        }
    }

    /// The earliest deadline of a waiting approval.
    pub(super) fn next_deadline(&self) -> Option<UnixMs> {
        self.steps
            .iter()
            .filter(|s| s.state == StepState::Waiting)
            .filter_map(|s| s.approval.as_ref().and_then(|a| a.deadline))
            .min()
    }

    /// What waits for approval, in the workflow's order: approval steps, and steps or
    /// `for_each` items whose call in flight under `ask` waits for a decision.
    pub fn waiting(&self) -> impl Iterator<Item = Attempt> + '_ {
        self.steps.iter().flat_map(|s| {
            let step = (s.state == StepState::Waiting).then(|| Attempt {
                step: s.id.clone(),
                item: None,
            });
            let items = s
                .items
                .iter()
                .filter(|i| i.state == StepState::Waiting)
                .map(|i| Attempt {
                    step: s.id.clone(),
                    item: Some(i.index),
                });
            step.into_iter().chain(items)
        })
    }
}
