//! Attempts: of a step, or of one item of a `for_each` step. What the executor records
//! of each (its instance, its agent loop, its answer held to the step's schema, its
//! failure or interruption), whichever kind it is. Pure, like the rest of the record.

use std::fmt;

use skein_dsl::expr::Evaluator;
use skein_dsl::schema::OutputSchema;

use super::{AfterFailure, RetryPolicy, RunRecord, StepState, Turn, UnixMs, Usage};

/// Which attempt: of a step, or of one item of a `for_each` step.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Attempt {
    /// The step.
    pub step: String,
    /// The item, for a `for_each` step.
    pub item: Option<u32>,
}

impl fmt::Display for Attempt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.item {
            Some(index) => write!(f, "step `{}` item {index}", self.step),
            None => write!(f, "step `{}`", self.step),
        }
    }
}

impl RunRecord {
    /// Records the instance that serves `attempt`.
    pub fn set_instance(&mut self, attempt: &Attempt, instance: Option<String>) {
        match attempt.item {
            Some(index) => {
                if let Some(item) = self.running_item(&attempt.step, index) {
                    item.instance = instance;
                }
            }
            None => {
                if let Some(record) = self.step_mut(&attempt.step) {
                    record.instance = instance;
                }
            }
        }
    }

    /// The agent loop turns recorded for `attempt` (an earlier run of it, before a
    /// restart).
    pub fn turns_of(&self, attempt: &Attempt) -> Vec<Turn> {
        let Some(record) = self.step(&attempt.step) else {
            return Vec::new();
        };
        match attempt.item {
            Some(index) => record
                .items
                .get(index as usize)
                .map(|i| i.turns.clone())
                .unwrap_or_default(),
            None => record.turns.clone(),
        }
    }

    /// `answer` as step `id` keeps it: for a step with an `output_schema`, the JSON it
    /// holds (written compactly) once it validates; otherwise the answer itself. The
    /// error says how the answer fails the schema.
    pub fn conform(&self, id: &str, answer: &str) -> Result<String, String> {
        let Some(schema) = self.workflow.step(id).and_then(|s| s.output_schema.as_ref()) else {
            return Ok(answer.to_owned());
        };
        let schema = OutputSchema::compile(schema).map_err(|e| format!("its output_schema does not compile: {e}"))?;
        conform_to(&schema, answer)
    }

    /// Records the answer of an attempt of step `id` (of its item `item`).
    pub fn complete_attempt(
        &mut self,
        id: &str,
        item: Option<u32>,
        output: String,
        usage: Option<Usage>,
        evaluator: &Evaluator,
        now: UnixMs,
    ) {
        match item {
            Some(index) => self.complete_item(id, index, output, usage, evaluator, now),
            None => self.complete(id, output, usage, evaluator, now),
        }
    }

    /// Records a failed attempt of step `id` (of its item `item`); see
    /// [`fail_attempt`](Self::fail_attempt).
    pub fn fail_attempt_of(
        &mut self,
        id: &str,
        item: Option<u32>,
        error: String,
        policy: &RetryPolicy,
        now: UnixMs,
    ) -> AfterFailure {
        match item {
            Some(index) => self.fail_item_attempt(id, index, error, policy, now),
            None => self.fail_attempt(id, error, policy, now),
        }
    }

    /// Records an attempt of step `id` that never reached its engine (the instance was
    /// unreachable, as when its node dies): it does not count against the step's
    /// retries, and runs again at `retry_at` (on whatever instance serves the agent
    /// then).
    pub fn interrupt(&mut self, id: &str, item: Option<u32>, reason: String, retry_at: UnixMs) {
        if let Some(index) = item {
            if let Some(item) = self.running_item(id, index) {
                item.state = StepState::Retrying;
                item.attempts = item.attempts.saturating_sub(1);
                item.error = Some(reason);
                item.retry_at = Some(retry_at);
            }
            return;
        }
        if let Some(record) = self.step_mut(id)
            && record.state == StepState::Running
        {
            record.state = StepState::Retrying;
            record.attempts = record.attempts.saturating_sub(1);
            record.error = Some(reason);
            record.retry_at = Some(retry_at);
        }
    }
}

/// `answer` held to a compiled step schema: the JSON it holds, written compactly, or how
/// it fails the schema. [`RunRecord::conform`] with the schema compiled once (the
/// executor compiles a run's schemas when its steps start, not at every answer).
pub fn conform_to(schema: &OutputSchema, answer: &str) -> Result<String, String> {
    schema
        .check(answer)
        .map(|value| value.to_string())
        .map_err(|e| format!("the answer does not match the step's output_schema: {e}"))
}
