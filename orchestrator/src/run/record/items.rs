//! A `for_each` step's items as the run's durable record keeps them: the list is
//! evaluated once, when the step becomes ready, and each item's prompt rendered then;
//! each item then has attempts of its own (retries, an agent loop, an instance), up to
//! the step's `max_parallel` at once. The step is done when every item is, with the
//! JSON array of their answers as its output. After a restart only the items that were
//! not done run again. Pure, like the rest of the record.

use serde::{Deserialize, Serialize};
use skein_dsl::expr::{Bindings, Context, Evaluator, Value};
use skein_dsl::ir::{MAX_ITEMS, Step};

use super::in_flight::ask_item;
use super::{AfterFailure, ApprovalRecord, Next, RetryPolicy, RunRecord, StepState, Turn, UnixMs, Usage, render_with};

/// One item of a `for_each` step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ItemRecord {
    /// Its position in the list, from 0.
    pub index: u32,
    /// Where it is: pending (waiting for a free slot), running, retrying, done or
    /// failed.
    pub state: StepState,
    /// Attempts started.
    pub attempts: u32,
    /// Its prompt, rendered with `item` and `index`.
    pub prompt: String,
    /// Its answer, once done.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<String>,
    /// Why its last attempt failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The model instance that served its last attempt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance: Option<String>,
    /// When its last attempt started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<UnixMs>,
    /// When it finished.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<UnixMs>,
    /// When its next attempt may start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_at: Option<UnixMs>,
    /// Tokens of its answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    /// Its agent loop (an agent with tools).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub turns: Vec<Turn>,
    /// The question on its tool call that was in flight under `in_flight: ask`, once
    /// asked (it waits while undecided).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval: Option<ApprovalRecord>,
}

impl RunRecord {
    /// Evaluates `step`'s `for_each` list and renders a prompt per item; the step is
    /// running from now on, or done at once with `[]` for an empty list. The error says
    /// why the list could not be had.
    pub(super) fn expand(
        &mut self,
        step: &Step,
        evaluator: &Evaluator,
        vars: &Bindings,
        now: UnixMs,
    ) -> Result<(), String> {
        let Some(for_each) = &step.for_each else {
            return Ok(());
        };
        let list = evaluator
            .compile_expr(&for_each.over, Context::Step)
            .and_then(|c| evaluator.eval(&c, vars))
            .map_err(|e| format!("its `for_each: {}` failed: {e}", for_each.over.source()))?;
        let Value::List(list) = list else {
            return Err(format!(
                "its `for_each: {}` is {}, not a list; help: give a list input (`type: list`) or a JSON array of an earlier step (`steps.<id>.output.json`)",
                for_each.over.source(),
                kind(&list)
            ));
        };
        if list.len() > MAX_ITEMS {
            return Err(format!(
                "its `for_each: {}` has {} items; one step may run over at most {MAX_ITEMS}",
                for_each.over.source(),
                list.len()
            ));
        }
        let mut items = Vec::with_capacity(list.len());
        for (index, item) in list.into_iter().enumerate() {
            let index = u32::try_from(index).unwrap_or(u32::MAX);
            let mut vars = vars.clone();
            vars.insert("item".to_owned(), item);
            vars.insert("index".to_owned(), Value::Int(i64::from(index)));
            let prompt =
                render_with(evaluator, step, &vars, Context::Item).map_err(|e| format!("item {index}: {e}"))?;
            items.push(ItemRecord::fresh(index, prompt));
        }
        let Some(record) = self.steps.iter_mut().find(|s| s.id == step.id) else {
            return Ok(());
        };
        self.changed.items_of.insert(step.id.clone());
        record.items = items;
        record.queued_at.get_or_insert(now);
        record.started_at = Some(now);
        record.state = StepState::Running;
        record.attempts = 1;
        if record.items.is_empty() {
            record.state = StepState::Done;
            record.output = Some("[]".to_owned());
            record.finished_at = Some(now);
        }
        Ok(())
    }

    /// Starts the items of running `for_each` step `step` that may start at `now`, up to
    /// its `max_parallel` running at once.
    pub(super) fn start_items(&mut self, step: &Step, now: UnixMs) -> Vec<Next> {
        let mut started = Vec::new();
        let Some(max) = step.for_each.as_ref().map(|f| f.max_parallel as usize) else {
            return started;
        };
        let workflow = &self.workflow;
        let Some(record) = self.steps.iter_mut().find(|s| s.id == step.id) else {
            return started;
        };
        if record.state != StepState::Running {
            return started;
        }
        let mut running = record.items.iter().filter(|i| i.state == StepState::Running).count();
        for item in &mut record.items {
            if running >= max {
                break;
            }
            let ready = match item.state {
                StepState::Pending => true,
                StepState::Retrying => item.retry_at.is_none_or(|at| at <= now),
                _ => false,
            };
            if !ready {
                continue;
            }
            // A call in flight under `ask` waits for a person first.
            if ask_item(workflow, item, now) {
                self.changed.items.insert((step.id.clone(), item.index));
                continue;
            }
            item.state = StepState::Running;
            item.attempts += 1;
            item.started_at = Some(now);
            item.retry_at = None;
            running += 1;
            self.changed.items.insert((step.id.clone(), item.index));
            started.push(Next::Start {
                step: step.id.clone(),
                item: Some(item.index),
                agent: step.agent.clone(),
                prompt: item.prompt.clone(),
            });
        }
        started
    }

    /// The running item `index` of step `id`, marked changed (every rule that changes
    /// an item after it starts reaches it here).
    pub(super) fn running_item(&mut self, id: &str, index: u32) -> Option<&mut ItemRecord> {
        let item = self
            .steps
            .iter_mut()
            .find(|s| s.id == id)
            .filter(|r| r.state == StepState::Running)
            .and_then(|r| r.items.get_mut(index as usize))
            .filter(|i| i.state == StepState::Running)?;
        self.changed.items.insert((id.to_owned(), index));
        Some(item)
    }

    /// Records item `index`'s answer; with every item done, the step completes with the
    /// JSON array of the answers (each parsed as JSON when the step has an
    /// `output_schema`, else a string).
    pub(super) fn complete_item(
        &mut self,
        id: &str,
        index: u32,
        output: String,
        usage: Option<Usage>,
        evaluator: &Evaluator,
        now: UnixMs,
    ) {
        let structured = self.workflow.step(id).is_some_and(|s| s.output_schema.is_some());
        let Some(item) = self.running_item(id, index) else {
            return;
        };
        item.state = StepState::Done;
        item.output = Some(output);
        item.error = None;
        item.usage = usage;
        item.finished_at = Some(now);
        let Some(record) = self.step(id) else { return };
        if record.items.iter().any(|i| i.state != StepState::Done) {
            return;
        }
        let answers: Vec<serde_json::Value> = record
            .items
            .iter()
            .map(|i| {
                let text = i.output.clone().unwrap_or_default();
                match structured {
                    true => serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text)),
                    false => serde_json::Value::String(text),
                }
            })
            .collect();
        let usage = record.items.iter().filter_map(|i| i.usage).reduce(|a, b| Usage {
            prompt_tokens: a.prompt_tokens.saturating_add(b.prompt_tokens),
            completion_tokens: a.completion_tokens.saturating_add(b.completion_tokens),
        });
        let output = serde_json::Value::Array(answers).to_string();
        self.complete(id, output, usage, evaluator, now);
    }

    /// Records a failed attempt of item `index` of step `id`: another after the backoff
    /// while the item has the step's retries left, else the step and the run fail.
    pub(super) fn fail_item_attempt(
        &mut self,
        id: &str,
        index: u32,
        error: String,
        policy: &RetryPolicy,
        now: UnixMs,
    ) -> AfterFailure {
        let retries = self.workflow.step(id).map_or(0, |s| s.retries);
        let Some(item) = self.running_item(id, index) else {
            return AfterFailure::Failed;
        };
        if item.attempts <= retries {
            let at = now.plus(policy.backoff(item.attempts));
            item.turns.clear();
            item.state = StepState::Retrying;
            item.error = Some(error);
            item.retry_at = Some(at);
            AfterFailure::RetryAt(at)
        } else {
            item.state = StepState::Failed;
            item.error = Some(error.clone());
            item.finished_at = Some(now);
            self.fail_step(id, format!("item {index} failed: {error}"), now);
            AfterFailure::Failed
        }
    }
}

impl ItemRecord {
    fn fresh(index: u32, prompt: String) -> ItemRecord {
        ItemRecord {
            index,
            state: StepState::Pending,
            attempts: 0,
            prompt,
            output: None,
            error: None,
            instance: None,
            started_at: None,
            finished_at: None,
            retry_at: None,
            usage: None,
            turns: Vec::new(),
            approval: None,
        }
    }
}

/// What a value is, for a message.
fn kind(value: &Value) -> &'static str {
    match value {
        Value::Unit => "nothing",
        Value::Bool(_) => "a boolean",
        Value::Int(_) | Value::Float(_) | Value::AbsentNumber => "a number",
        Value::Text(_) => "text",
        Value::List(_) => "a list",
        Value::Map(_) => "a map",
        Value::AbsentFlag => "a flag",
    }
}
