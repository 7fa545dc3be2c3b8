//! Approval steps as the run's durable record keeps them: the text to approve is
//! rendered when the step becomes ready, the step waits (with its deadline, if it has a
//! timeout) until a person approves or rejects it, and the decision is recorded with
//! who made it. Pure, like the rest of the record.

use serde::{Deserialize, Serialize};
use skein_dsl::expr::Evaluator;
use skein_dsl::ir::{OnTimeout, Step};

use super::{RunRecord, StepState, UnixMs};

/// The approval of a waiting (or decided) approval step.
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

/// Why a decision was not recorded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecideError {
    /// The run has no such step.
    #[error("the run has no step `{0}`")]
    NoStep(String),
    /// The step is not an approval step.
    #[error("step `{0}` is not an approval step; only approval steps are approved or rejected")]
    NotApproval(String),
    /// The step is not waiting (not reached yet, or decided).
    #[error("step `{step}` is {state}, not waiting for approval")]
    NotWaiting {
        /// The step.
        step: String,
        /// Its state.
        state: StepState,
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
        });
    }

    /// Records `by`'s decision on waiting approval step `id`: approved, the step is done
    /// with the comment as its output; rejected, the step fails and the run with it.
    pub fn decide(
        &mut self,
        id: &str,
        approved: bool,
        by: &str,
        comment: Option<String>,
        evaluator: &Evaluator,
        now: UnixMs,
    ) -> Result<(), DecideError> {
        let Some(record) = self.step_mut(id) else {
            return Err(DecideError::NoStep(id.to_owned()));
        };
        let Some(approval) = record.approval.as_mut() else {
            return Err(DecideError::NotApproval(id.to_owned()));
        };
        if record.state != StepState::Waiting {
            return Err(DecideError::NotWaiting {
                step: id.to_owned(),
                state: record.state,
            });
        }
        let comment = comment
            .map(|mut c| {
                skein_text::truncate_at_char(&mut c, MAX_COMMENT_BYTES);
                c
            })
            .filter(|c| !c.is_empty());
        approval.decision = Some(Decision {
            approved,
            by: by.to_owned(),
            comment: comment.clone(),
            at: now,
        });
        if approved {
            record.state = StepState::Running;
            self.complete(id, comment.unwrap_or_default(), None, evaluator, now);
        } else {
            let why = match &comment {
                Some(c) => format!("rejected by {by}: {c}"),
                None => format!("rejected by {by}"),
            };
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
            let _ = self.decide(&id, approved, "timeout", None, evaluator, now);
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

    /// The steps waiting for approval, in the workflow's order.
    pub fn waiting(&self) -> impl Iterator<Item = &str> {
        self.steps
            .iter()
            .filter(|s| s.state == StepState::Waiting)
            .map(|s| s.id.as_str())
    }
}
