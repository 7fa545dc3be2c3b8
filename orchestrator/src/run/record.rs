//! A run of a workflow as it is stored: its steps' states, outputs and timestamps, and
//! the pure rules that move it on (which steps are ready, `when`, `repeat`, retries,
//! the outcome). No IO and no clock: the executor passes the time and writes every
//! changed record to the store before acting on it.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use skein_dsl::expr::{Bindings, Context, Evaluator, Value};
use skein_dsl::ir::{InputValue, Step, TemplatePart, Workflow};

pub use self::approval::{ApprovalRecord, DecideError, Decision, MAX_COMMENT_BYTES};
pub use self::attempt::{Attempt, conform_to};
pub use self::changed::Changed;
pub use self::in_flight::InFlightCall;
pub use self::inputs::{InputError, typed_inputs};
pub use self::items::ItemRecord;
pub use self::turns::{CallState, LoopChange, ToolCall, Turn};
pub use crate::base::UnixMs;

mod approval;
mod attempt;
mod changed;
mod in_flight;
mod inputs;
mod items;
mod turns;

/// Where a run is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum RunState {
    /// Accepted, waiting for admission (its instances cannot all be placed yet).
    Queued,
    /// Admitted: its instances are starting.
    Starting,
    /// Steps are running.
    Running,
    /// Every step finished (done or skipped).
    Succeeded,
    /// A step failed after its retries, or the run could not start.
    Failed,
    /// Cancelled by a user.
    Cancelled,
}

impl RunState {
    /// Every state, in the order a run goes through them.
    pub const ALL: [RunState; 6] = [
        RunState::Queued,
        RunState::Starting,
        RunState::Running,
        RunState::Succeeded,
        RunState::Failed,
        RunState::Cancelled,
    ];

    /// Whether the run has ended.
    pub fn is_final(self) -> bool {
        matches!(self, RunState::Succeeded | RunState::Failed | RunState::Cancelled)
    }

    /// The state's name: the API writes it (serde's `snake_case` name, the same), the
    /// CLI prints it.
    pub fn name(self) -> &'static str {
        match self {
            RunState::Queued => "queued",
            RunState::Starting => "starting",
            RunState::Running => "running",
            RunState::Succeeded => "succeeded",
            RunState::Failed => "failed",
            RunState::Cancelled => "cancelled",
        }
    }
}

impl fmt::Display for RunState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Where a step is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum StepState {
    /// Waiting for the steps it comes after.
    Pending,
    /// Ready, waiting for its agent.
    Queued,
    /// An attempt is running (a `for_each` step: some of its items are).
    Running,
    /// An approval step waits for a person to approve or reject it.
    Waiting,
    /// An attempt failed; the next one waits for its backoff.
    Retrying,
    /// Finished with an output.
    Done,
    /// Its `when` did not hold.
    Skipped,
    /// Failed on its last attempt.
    Failed,
    /// The run was cancelled before the step finished.
    Cancelled,
}

impl StepState {
    /// Every state.
    pub const ALL: [StepState; 9] = [
        StepState::Pending,
        StepState::Queued,
        StepState::Running,
        StepState::Waiting,
        StepState::Retrying,
        StepState::Done,
        StepState::Skipped,
        StepState::Failed,
        StepState::Cancelled,
    ];

    /// Whether the step has finished for this pass (steps after it may start).
    pub fn is_finished(self) -> bool {
        matches!(self, StepState::Done | StepState::Skipped)
    }

    /// The state's name, one for every use: expressions (`steps.x.status`), the API
    /// (serde's `snake_case` name, the same) and the CLI.
    pub fn name(self) -> &'static str {
        match self {
            StepState::Pending => "pending",
            StepState::Queued => "queued",
            StepState::Running => "running",
            StepState::Waiting => "waiting",
            StepState::Retrying => "retrying",
            StepState::Done => "done",
            StepState::Skipped => "skipped",
            StepState::Failed => "failed",
            StepState::Cancelled => "cancelled",
        }
    }
}

impl fmt::Display for StepState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One step of a run, in its current pass.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct StepRecord {
    /// The step id.
    pub id: String,
    /// Its agent.
    pub agent: String,
    /// Its state.
    pub state: StepState,
    /// The pass through a `repeat` loop (1 for the first).
    pub iteration: u32,
    /// Attempts started in this pass.
    pub attempts: u32,
    /// The prompt of the last attempt, as rendered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt: Option<String>,
    /// The answer, once done.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<String>,
    /// Why the last attempt failed (the engine's error), or why it was skipped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The model instance that served the last attempt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance: Option<String>,
    /// When it became ready.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queued_at: Option<UnixMs>,
    /// When its last attempt started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<UnixMs>,
    /// When it finished.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<UnixMs>,
    /// When the next attempt may start (a retry's backoff).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_at: Option<UnixMs>,
    /// Tokens of the prompt and of the answer, as the engine counted them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    /// The agent loop of the current attempt (an agent with tools): each model turn
    /// that asked for tools, and its calls.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub turns: Vec<Turn>,
    /// A `for_each` step's items, once its list was evaluated.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub items: Vec<ItemRecord>,
    /// An approval step's approval, once it waits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval: Option<ApprovalRecord>,
}

pub use crate::engine_client::Usage;

/// A submitted workflow and everything that happened to it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct RunRecord {
    /// The run's id (time-ordered).
    pub id: String,
    /// Who submitted it.
    pub owner: String,
    /// The workflow as validated at submission.
    #[schema(value_type = Object)]
    pub workflow: Workflow,
    /// The inputs, defaults filled in.
    #[schema(value_type = Object)]
    pub inputs: BTreeMap<String, InputValue>,
    /// Its state.
    pub state: RunState,
    /// Why it waits (queued), or why it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// When it was accepted.
    pub submitted_at: UnixMs,
    /// When its first step started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<UnixMs>,
    /// When it ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<UnixMs>,
    /// A user asked to cancel it.
    #[serde(default)]
    pub cancel_requested: bool,
    /// Each step's current pass, in the workflow's order.
    pub steps: Vec<StepRecord>,
    /// Earlier passes of steps a `repeat` sent back, oldest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub history: Vec<StepRecord>,
    /// The higher-priority runs that preempted it, in order (it went back to the queue
    /// each time, and its steps in progress started again).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub preempted_by: Vec<String>,
    /// Which of its items and agent loops changed since it was read or written (the
    /// store writes those beside the head).
    #[serde(skip)]
    pub changed: Changed,
}

/// What the executor should do next for a run.
#[derive(Debug, Clone, PartialEq)]
pub enum Next {
    /// Send this prompt to the step's agent.
    Start {
        /// The step.
        step: String,
        /// The item of a `for_each` step.
        item: Option<u32>,
        /// Its agent.
        agent: String,
        /// The rendered prompt.
        prompt: String,
    },
}

/// How a step's failed attempt is retried: `retries` more attempts (the step's own
/// setting), waiting `first_backoff` after the first failure, doubling up to
/// `max_backoff`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// The wait after the first failed attempt.
    pub first_backoff: Duration,
    /// The longest wait.
    pub max_backoff: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            first_backoff: Duration::from_secs(1),
            max_backoff: Duration::from_secs(30),
        }
    }
}

impl RetryPolicy {
    /// The wait before attempt `attempt + 1`, after `attempt` failed ones (≥ 1).
    pub fn backoff(&self, failed_attempts: u32) -> Duration {
        let doublings = failed_attempts.saturating_sub(1).min(16);
        self.first_backoff
            .saturating_mul(1u32 << doublings)
            .min(self.max_backoff)
    }
}

/// What became of a failed attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AfterFailure {
    /// Another attempt at this time.
    RetryAt(UnixMs),
    /// No attempt left: the step and the run failed.
    Failed,
}

impl RunRecord {
    /// A new queued run of `workflow` with checked `inputs`.
    pub fn new(
        id: String,
        owner: String,
        workflow: Workflow,
        inputs: BTreeMap<String, InputValue>,
        now: UnixMs,
    ) -> Self {
        let steps = workflow
            .steps
            .iter()
            .map(|s| StepRecord::fresh(&s.id, &s.agent, 1))
            .collect();
        RunRecord {
            id,
            owner,
            workflow,
            inputs,
            state: RunState::Queued,
            reason: None,
            submitted_at: now,
            started_at: None,
            finished_at: None,
            cancel_requested: false,
            steps,
            history: Vec::new(),
            preempted_by: Vec::new(),
            changed: Changed::default(),
        }
    }

    /// The record of step `id`.
    pub fn step(&self, id: &str) -> Option<&StepRecord> {
        self.steps.iter().find(|s| s.id == id)
    }

    fn step_mut(&mut self, id: &str) -> Option<&mut StepRecord> {
        self.steps.iter_mut().find(|s| s.id == id)
    }

    /// The outputs of the steps that produced one, by step id.
    pub fn outputs(&self) -> BTreeMap<&str, &str> {
        self.steps
            .iter()
            .filter_map(|s| s.output.as_deref().map(|o| (s.id.as_str(), o)))
            .collect()
    }

    /// After a restart, or the loss of an instance: attempts that were running never
    /// recorded a result, so they run again at once. They are not counted: the
    /// orchestrator's death (or a lost instance) is not the step's failure and spends no
    /// retry, as with [`interrupt`](Self::interrupt) for an unreachable engine. Steps
    /// recorded done stay done.
    pub fn recover(&mut self) {
        for step in &mut self.steps {
            // A `for_each` step keeps its items: only those that ran start again.
            if step.state == StepState::Running && step.items.is_empty() {
                step.state = StepState::Queued;
                step.attempts = step.attempts.saturating_sub(1);
                step.started_at = None;
            }
            for item in &mut step.items {
                if item.state == StepState::Running {
                    item.state = StepState::Pending;
                    item.attempts = item.attempts.saturating_sub(1);
                    item.started_at = None;
                    self.changed.items.insert((step.id.clone(), item.index));
                }
            }
        }
    }

    /// Moves the run on at `now`: skips steps whose `when` does not hold, and returns
    /// the steps to start (marked running, their prompts rendered). Call again after
    /// every change. An expression that fails to evaluate fails its step (and the
    /// run) with the evaluator's message.
    pub fn advance(&mut self, evaluator: &Evaluator, now: UnixMs) -> Vec<Next> {
        let mut started = Vec::new();
        if self.state.is_final() || self.cancel_requested {
            return started;
        }
        self.time_out_approvals(evaluator, now);
        loop {
            let mut changed = false;
            let workflow = self.workflow.clone();
            for step in &workflow.steps {
                let Some(record) = self.step(&step.id) else { continue };
                if record.state == StepState::Running && step.for_each.is_some() {
                    let items = self.start_items(step, now);
                    changed |= !items.is_empty();
                    started.extend(items);
                    continue;
                }
                let ready = match record.state {
                    StepState::Pending => step
                        .after
                        .iter()
                        .all(|a| self.step(a).is_some_and(|r| r.state.is_finished())),
                    StepState::Queued => true,
                    StepState::Retrying => record.retry_at.is_none_or(|at| at <= now),
                    _ => false,
                };
                if !ready {
                    continue;
                }
                let vars = self.variables(None);
                if record.state == StepState::Pending
                    && let Some(when) = &step.when
                {
                    let holds = evaluator
                        .compile_expr(when, Context::Step)
                        .and_then(|c| evaluator.eval_bool(&c, &vars));
                    match holds {
                        Ok(true) => {}
                        Ok(false) => {
                            if let Some(r) = self.step_mut(&step.id) {
                                r.state = StepState::Skipped;
                                r.queued_at = Some(now);
                                r.finished_at = Some(now);
                                r.error = Some(format!("skipped: `when: {}` did not hold", when.source()));
                            }
                            changed = true;
                            continue;
                        }
                        Err(error) => {
                            self.fail_step(&step.id, format!("its `when` failed: {error}"), now);
                            return started;
                        }
                    }
                }
                if step.for_each.is_some() {
                    if let Err(error) = self.expand(step, evaluator, &vars, now) {
                        self.fail_step(&step.id, error, now);
                        return started;
                    }
                    self.begin(now);
                    changed = true;
                    continue;
                }
                let prompt = match render_with(evaluator, step, &vars, Context::Step) {
                    Ok(prompt) => prompt,
                    Err(error) => {
                        self.fail_step(&step.id, error, now);
                        return started;
                    }
                };
                if step.approval.is_some() {
                    self.await_approval(step, prompt, now);
                    self.begin(now);
                    changed = true;
                    continue;
                }
                // A call in flight under `ask` waits for a person first.
                if self.ask_step(&step.id, now) {
                    self.begin(now);
                    changed = true;
                    continue;
                }
                if let Some(r) = self.step_mut(&step.id) {
                    if r.queued_at.is_none() || r.state == StepState::Pending {
                        r.queued_at = Some(now);
                    }
                    r.state = StepState::Running;
                    r.attempts += 1;
                    r.started_at = Some(now);
                    r.retry_at = None;
                    r.prompt = Some(prompt.clone());
                }
                self.begin(now);
                started.push(Next::Start {
                    step: step.id.clone(),
                    item: None,
                    agent: step.agent.clone(),
                    prompt,
                });
                changed = true;
            }
            if !changed {
                break;
            }
        }
        self.settle(now);
        // The run says when it waits for a person.
        let waiting: Vec<String> = self
            .waiting()
            .map(|a| match a.item {
                Some(index) => format!("`{}` item {index}", a.step),
                None => format!("`{}`", a.step),
            })
            .collect();
        let was_waiting = self.reason.as_deref().is_some_and(|r| r.starts_with(WAITING));
        if !self.state.is_final() {
            if !waiting.is_empty() {
                self.reason = Some(format!("{WAITING} of step {}", waiting.join(", ")));
            } else if was_waiting {
                self.reason = None;
            }
        }
        started
    }

    /// The run's steps have begun.
    fn begin(&mut self, now: UnixMs) {
        if self.started_at.is_none() {
            self.started_at = Some(now);
        }
        self.state = RunState::Running;
    }

    /// Records step `id`'s answer. A step with `repeat` whose `until` does not hold
    /// sends the run back to `back_to` (the earlier passes go to the history).
    pub fn complete(&mut self, id: &str, output: String, usage: Option<Usage>, evaluator: &Evaluator, now: UnixMs) {
        let Some(record) = self.step_mut(id) else { return };
        if record.state != StepState::Running {
            return;
        }
        record.state = StepState::Done;
        record.output = Some(output);
        record.error = None;
        record.usage = usage;
        record.finished_at = Some(now);
        let iteration = record.iteration;
        let step = self.workflow.step(id).cloned();
        if let Some(repeat) = step.as_ref().and_then(|s| s.repeat.as_ref()) {
            let vars = self.variables(Some(iteration));
            let holds = evaluator
                .compile_expr(&repeat.until, Context::Until)
                .and_then(|c| evaluator.eval_bool(&c, &vars));
            match holds {
                Ok(true) => {}
                Ok(false) if iteration <= repeat.max => {
                    let body = loop_body(&self.workflow, &repeat.back_to, id);
                    for record in &mut self.steps {
                        if body.contains(record.id.as_str()) {
                            self.history.push(record.clone());
                            *record = StepRecord::fresh(&record.id, &record.agent, record.iteration + 1);
                            self.changed.step(&record.id);
                        }
                    }
                }
                Ok(false) => {
                    if let Some(r) = self.step_mut(id) {
                        r.error = Some(format!(
                            "`repeat` ended after {} repetitions without `until: {}` holding",
                            repeat.max,
                            repeat.until.source()
                        ));
                    }
                }
                Err(error) => {
                    if let Some(r) = self.step_mut(id) {
                        r.state = StepState::Running;
                    }
                    self.fail_step(id, format!("its `repeat.until` failed: {error}"), now);
                    return;
                }
            }
        }
        self.settle(now);
    }

    /// Records a failed attempt of step `id` with the engine's error: another attempt
    /// after the policy's backoff while the step has retries left, else the step and
    /// the run fail.
    pub fn fail_attempt(&mut self, id: &str, error: String, policy: &RetryPolicy, now: UnixMs) -> AfterFailure {
        let retries = self.workflow.step(id).map_or(0, |s| s.retries);
        let Some(record) = self.steps.iter_mut().find(|s| s.id == id) else {
            return AfterFailure::Failed;
        };
        if record.attempts <= retries {
            let at = now.plus(policy.backoff(record.attempts));
            // The next attempt is a new agent loop.
            record.turns.clear();
            self.changed.turns_of.insert(id.to_owned());
            record.state = StepState::Retrying;
            record.error = Some(error);
            record.retry_at = Some(at);
            AfterFailure::RetryAt(at)
        } else {
            self.fail_step(id, error, now);
            AfterFailure::Failed
        }
    }

    /// Fails the whole run before or outside a step (it could not start).
    pub fn fail(&mut self, reason: String, now: UnixMs) {
        if self.state.is_final() {
            return;
        }
        self.state = RunState::Failed;
        self.reason = Some(reason);
        self.finished_at = Some(now);
        self.stop_unfinished(StepState::Cancelled, now);
    }

    /// Cancels the run: unfinished steps are marked cancelled.
    pub fn cancel(&mut self, now: UnixMs) {
        if self.state.is_final() {
            return;
        }
        self.cancel_requested = true;
        self.state = RunState::Cancelled;
        self.reason = Some("cancelled by a user".to_owned());
        self.finished_at = Some(now);
        self.stop_unfinished(StepState::Cancelled, now);
    }

    /// The earliest time the run moves on by itself: a pending retry (of a step or an
    /// item), or an approval's deadline.
    pub fn next_retry(&self) -> Option<UnixMs> {
        let steps = self
            .steps
            .iter()
            .filter(|s| s.state == StepState::Retrying)
            .filter_map(|s| s.retry_at);
        let items = self
            .steps
            .iter()
            .flat_map(|s| &s.items)
            .filter(|i| i.state == StepState::Retrying)
            .filter_map(|i| i.retry_at);
        steps.chain(items).chain(self.next_deadline()).min()
    }

    /// The agents the run's unfinished steps still need.
    pub fn agents_needed(&self) -> BTreeSet<&str> {
        self.steps
            .iter()
            .filter(|s| !s.state.is_finished() && !s.agent.is_empty())
            .map(|s| s.agent.as_str())
            .collect()
    }

    fn fail_step(&mut self, id: &str, error: String, now: UnixMs) {
        if let Some(record) = self.step_mut(id) {
            record.state = StepState::Failed;
            record.error = Some(error.clone());
            record.finished_at = Some(now);
        }
        self.state = RunState::Failed;
        self.reason = Some(format!("step `{id}` failed: {error}"));
        self.finished_at = Some(now);
        self.stop_unfinished(StepState::Cancelled, now);
    }

    fn stop_unfinished(&mut self, to: StepState, now: UnixMs) {
        for record in &mut self.steps {
            if matches!(
                record.state,
                StepState::Pending | StepState::Queued | StepState::Running | StepState::Waiting | StepState::Retrying
            ) {
                record.state = to;
                record.finished_at = Some(now);
            }
        }
    }

    /// Ends the run when every step has finished.
    fn settle(&mut self, now: UnixMs) {
        // A workflow without steps serves its agents (sessions, the OpenAI routes)
        // until it is cancelled.
        if !self.state.is_final() && !self.steps.is_empty() && self.steps.iter().all(|s| s.state.is_finished()) {
            self.state = RunState::Succeeded;
            self.reason = None;
            self.finished_at = Some(now);
            if self.started_at.is_none() {
                self.started_at = Some(now);
            }
        }
    }

    /// `inputs`, `steps` (and `iteration`) as expressions see them. Steps not finished
    /// in this pass read as empty output with their status.
    fn variables(&self, iteration: Option<u32>) -> Bindings {
        let mut vars = Bindings::new();
        let inputs = self.inputs.iter().map(|(k, v)| (k.as_str(), input_value(v)));
        vars.insert("inputs".to_owned(), Value::map(inputs));
        let steps = self.steps.iter().map(|s| {
            let fields = Value::map([
                ("output", Value::Text(s.output.clone().unwrap_or_default())),
                ("status", Value::from(s.state.name())),
                ("attempts", Value::Int(i64::from(s.attempts))),
                ("agent", Value::Text(s.agent.clone())),
            ]);
            (s.id.as_str(), fields)
        });
        vars.insert("steps".to_owned(), Value::map(steps));
        if let Some(iteration) = iteration {
            vars.insert("iteration".to_owned(), Value::Int(i64::from(iteration)));
        }
        vars
    }
}

impl StepRecord {
    /// A step before its first attempt.
    fn fresh(id: &str, agent: &str, iteration: u32) -> StepRecord {
        StepRecord {
            id: id.to_owned(),
            agent: agent.to_owned(),
            state: StepState::Pending,
            iteration,
            attempts: 0,
            prompt: None,
            output: None,
            error: None,
            instance: None,
            queued_at: None,
            started_at: None,
            finished_at: None,
            retry_at: None,
            usage: None,
            turns: Vec::new(),
            items: Vec::new(),
            approval: None,
        }
    }
}

/// An input as expressions see it.
fn input_value(value: &InputValue) -> Value {
    match value {
        InputValue::Boolean(b) => Value::Bool(*b),
        InputValue::Integer(i) => Value::Int(*i),
        InputValue::Number(n) => Value::Float(*n),
        InputValue::String(s) => Value::Text(s.clone()),
        InputValue::List(items) => Value::List(items.iter().map(input_value).collect()),
    }
}

/// What a run's reason starts with while a step waits for approval.
pub const WAITING: &str = "waiting for approval";

/// A step's prompt with its `{{ }}` interpolations evaluated in `context`.
fn render_with(evaluator: &Evaluator, step: &Step, vars: &Bindings, context: Context) -> Result<String, String> {
    let mut out = String::with_capacity(step.prompt.source.len());
    for part in &step.prompt.parts {
        match part {
            TemplatePart::Text(text) => out.push_str(text),
            TemplatePart::Expr(expr) => {
                // Rendered on the evaluator's thread: the value never reaches this one.
                let value = evaluator
                    .compile_expr(expr, context)
                    .and_then(|c| evaluator.eval_text(&c, vars))
                    .map_err(|e| format!("its prompt's `{{{{ {} }}}}` failed: {e}", expr.source()))?;
                out.push_str(&value);
            }
        }
    }
    Ok(out)
}

/// The steps a `repeat` on `last` re-runs: `back_to`, `last`, and every step between
/// them (downstream of `back_to` and upstream of `last`).
fn loop_body<'a>(workflow: &'a Workflow, back_to: &'a str, last: &'a str) -> BTreeSet<&'a str> {
    let upstream_of_last = closure(workflow, last, |s| s.after.iter().map(String::as_str).collect());
    let downstream_of_start = closure(workflow, back_to, |s| {
        workflow
            .steps
            .iter()
            .filter(|d| d.after.iter().any(|a| a == &s.id))
            .map(|d| d.id.as_str())
            .collect()
    });
    upstream_of_last.intersection(&downstream_of_start).copied().collect()
}

/// `start` and every step reachable from it through `edges`.
fn closure<'a>(workflow: &'a Workflow, start: &'a str, edges: impl Fn(&'a Step) -> Vec<&'a str>) -> BTreeSet<&'a str> {
    let mut seen = BTreeSet::from([start]);
    let mut todo = vec![start];
    while let Some(id) = todo.pop() {
        if let Some(step) = workflow.steps.iter().find(|s| s.id == id) {
            for next in edges(step) {
                if seen.insert(next) {
                    todo.push(next);
                }
            }
        }
    }
    seen
}
