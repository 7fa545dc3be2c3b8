//! Driving an admitted run: waiting for its instances, running its steps (prompts to the
//! engines, retries with backoff, `when`, `repeat`), placing lost instances again, and
//! recording how it ended. Every change is written before it is acted on.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use skein_dsl::Workflow;
use skein_dsl::ir::Backend;
use skein_dsl::schema::OutputSchema;
use skein_model_registry::catalog::ModelInfo;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;

use super::act::AgentLoop;
use super::approve::Decide;
use super::bring_up::{Lost, Readiness};
use super::preempt::Halt;
use super::provide::Pin;
use super::{Executor, off_worker};
use crate::base::{lock, unix_ms};
use crate::engine_client::{Answer, CallError, Route, call};
use crate::plan::Plan;
use crate::run::record::{AfterFailure, Attempt, Decision, Next, RunRecord, RunState, conform_to};
use crate::store::StoreError;

impl Executor {
    /// Drives an admitted run to its end.
    pub(super) async fn drive(
        &self,
        mut run: RunRecord,
        mut plan: Plan,
        mut models: Arc<BTreeMap<String, ModelInfo>>,
        mut warm: Vec<String>,
        mut cancelled: watch::Receiver<Halt>,
        mut decisions: mpsc::Receiver<Decide>,
    ) -> Result<(), StoreError> {
        let id = run.id.clone();
        let shutdown = self.lifecycle().shutdown;
        // Places a failing split replica must avoid from now on, and how often it failed.
        let mut avoid: Vec<(String, Vec<u32>)> = Vec::new();
        let mut split_failures = 0u32;
        // Placements made so far: a replica placed again gets a name of its own, so that
        // an agent never confuses its start with the stop of the one it replaces.
        let mut placements = 0u32;
        loop {
            let mut names = std::mem::take(&mut warm);
            match self.start_instances(&run, &plan, &models, placements) {
                Ok(started) => names.extend(started),
                Err(reason) => return self.finish_failed(run, reason, &names).await,
            }
            let lost = match self.wait_ready(&mut run, &names, &mut cancelled).await {
                Ok(routes) => match self.steps(&mut run, &routes, &mut cancelled, &mut decisions).await? {
                    Stop::Shutdown => return Ok(()),
                    Stop::Cancelled => return self.finish_cancelled(run, &names).await,
                    Stop::Preempted(by) => return self.finish_preempted(run, by, &names).await,
                    Stop::Ended | Stop::Failed(_) => {
                        // Ended (succeeded or failed on a step): the instances stay warm.
                        for name in &names {
                            self.inner.instances.release(name);
                        }
                        return Ok(());
                    }
                    Stop::Lost(lost) => lost,
                },
                Err(Stop::Shutdown) => return Ok(()),
                Err(Stop::Cancelled) => return self.finish_cancelled(run, &names).await,
                Err(Stop::Preempted(by)) => return self.finish_preempted(run, by, &names).await,
                Err(Stop::Failed(reason)) => return self.finish_failed(run, reason, &names).await,
                Err(Stop::Ended) => return Ok(()),
                Err(Stop::Lost(lost)) => lost,
            };
            tracing::warn!(run = %id, instance = %lost.instance, why = %lost.why, "an instance was lost; placing the run's instances again");
            self.stop_instances(&names);
            placements += 1;
            if let Some(place) = lost.avoid {
                split_failures += 1;
                if split_failures > SPLIT_REPLACEMENTS {
                    let reason = format!(
                        "instance {} failed {split_failures} times across nodes, the last: {}",
                        lost.instance, lost.why
                    );
                    return self.finish_failed(run, reason, &[]).await;
                }
                avoid.push(place);
            }
            run.recover();
            run.state = RunState::Starting;
            run.reason = Some(format!(
                "instance {} was lost ({}); placing it again",
                lost.instance, lost.why
            ));
            self.save(&mut run).await?;
            let pin = if avoid.is_empty() {
                Pin::Anywhere
            } else {
                Pin::Avoid { places: avoid.clone() }
            };
            // Plan again on the graph without the lost node (and off failed pieces'
            // GPUs), waiting for room.
            loop {
                if shutdown.is_cancelled() {
                    return Ok(());
                }
                match self.plan_workflow(&run.id, &run.workflow, &[], &pin).await {
                    Ok((next, next_models)) if next.admitted => {
                        plan = next;
                        models = next_models;
                        break;
                    }
                    Ok(_) => {}
                    Err(reason) => return self.finish_failed(run, reason, &[]).await,
                }
                tokio::select! {
                    () = shutdown.cancelled() => return Ok(()),
                    _ = cancelled.changed() => match stop_of(&cancelled) {
                        Stop::Preempted(by) => return self.finish_preempted(run, by, &[]).await,
                        _ => return self.finish_cancelled(run, &[]).await,
                    },
                    _ = tokio::time::sleep(self.inner.config.admission_interval) => {}
                }
            }
            lock(&self.inner.catalogs).remove(&id);
        }
    }

    pub(super) async fn save(&self, run: &mut RunRecord) -> Result<(), StoreError> {
        self.inner.runs.put(run).await?;
        self.changed(&run.id);
        Ok(())
    }

    pub(super) async fn finish_failed(
        &self,
        mut run: RunRecord,
        reason: String,
        names: &[String],
    ) -> Result<(), StoreError> {
        self.stop_instances(names);
        run.fail(reason, unix_ms());
        self.save(&mut run).await
    }

    pub(super) async fn finish_cancelled(&self, mut run: RunRecord, names: &[String]) -> Result<(), StoreError> {
        tracing::info!(run = %run.id, "run cancelled; its instances stop");
        self.stop_instances(names);
        run.cancel(unix_ms());
        self.save(&mut run).await
    }
    /// Waits until every instance is ready; returns where each agent is served.
    pub(super) async fn wait_ready(
        &self,
        run: &mut RunRecord,
        names: &[String],
        cancelled: &mut watch::Receiver<Halt>,
    ) -> Result<BTreeMap<String, Route>, Stop> {
        let mut changes = self.inner.instances.subscribe();
        let shutdown = self.lifecycle().shutdown;
        let deadline = tokio::time::Instant::now() + self.inner.config.ready_timeout;
        loop {
            if shutdown.is_cancelled() {
                return Err(Stop::Shutdown);
            }
            let waiting = match self.readiness(&run.workflow, names) {
                Readiness::Ready(routes) => return Ok(routes),
                Readiness::Failed(reason) => return Err(Stop::Failed(reason)),
                Readiness::Lost(lost) => return Err(Stop::Lost(lost)),
                Readiness::Waiting(waiting) => waiting,
            };
            // The run says what it waits for (the CLI shows it as progress).
            let reason = format!("starting: {}", waiting.join("; "));
            if run.reason.as_deref() != Some(reason.as_str()) {
                run.reason = Some(reason);
                if let Err(error) = self.save(run).await {
                    tracing::warn!(run = %run.id, %error, "progress not saved");
                }
            }
            tokio::select! {
                () = shutdown.cancelled() => return Err(Stop::Shutdown),
                _ = changes.changed() => {}
                _ = cancelled.changed() => return Err(stop_of(cancelled)),
                _ = tokio::time::sleep_until(deadline) => {
                    return Err(Stop::Failed(format!(
                        "instances not ready after {}s: {}",
                        self.inner.config.ready_timeout.as_secs(),
                        waiting.join(", ")
                    )));
                }
            }
        }
    }

    /// Runs the steps until the run ends, is cancelled, or loses an instance.
    pub(super) async fn steps(
        &self,
        run: &mut RunRecord,
        routes: &BTreeMap<String, Route>,
        cancelled: &mut watch::Receiver<Halt>,
        decisions: &mut mpsc::Receiver<Decide>,
    ) -> Result<Stop, StoreError> {
        let evaluator = &self.inner.evaluator;
        let (results, mut finished) = mpsc::channel::<(Attempt, Result<Answer, CallError>)>(64);
        // Agent loops' changes, each written before the loop acts on it.
        let (loop_changes, mut loop_changed) = mpsc::channel(64);
        // Each step's output schema, compiled once for all its answers.
        let schemas: HashMap<String, OutputSchema> = run
            .workflow
            .steps
            .iter()
            .filter_map(|s| Some((s.id.clone(), OutputSchema::compile(s.output_schema.as_ref()?).ok()?)))
            .collect();
        // Attempts in a row that could not reach their engine, by step (and item).
        let mut unreachable: HashMap<Attempt, u32> = HashMap::new();
        let mut attempts: JoinSet<()> = JoinSet::new();
        let mut changes = self.inner.instances.subscribe();
        let shutdown = self.lifecycle().shutdown;
        run.reason = None;
        // Its instances are ready: the run runs, even while nothing starts (a resumed
        // run whose only unfinished step waits for approval).
        if run.state == RunState::Starting {
            run.state = RunState::Running;
        }
        if run.workflow.steps.is_empty() {
            run.state = RunState::Running;
            run.started_at.get_or_insert(unix_ms());
            run.reason = Some("serving its agents until cancelled".to_owned());
        }
        loop {
            if shutdown.is_cancelled() {
                attempts.abort_all();
                return Ok(Stop::Shutdown);
            }
            let starts = off_worker(|| run.advance(evaluator, unix_ms()));
            self.save(run).await?;
            for Next::Start {
                step,
                item,
                agent,
                prompt,
            } in starts
            {
                let Some(route) = routes.get(&agent).cloned() else {
                    run.fail(format!("agent `{agent}` has no instance"), unix_ms());
                    self.save(run).await?;
                    return Ok(Stop::Ended);
                };
                // Among the agent's replicas (a reflex may have added some), by share.
                let route = match &route.instance {
                    Some(_) => self
                        .inner
                        .instances
                        .pick(&run.id, &agent)
                        .and_then(|view| Route::for_agent(&view, run.workflow.agents.get(&agent)).ok().flatten())
                        .unwrap_or(route),
                    None => route,
                };
                let attempt = Attempt { step, item };
                run.set_instance(&attempt, route.instance.clone());
                // Its engine's logs may hold this prompt from now on.
                if let Some(instance) = &route.instance {
                    self.inner.instances.used_by(instance, &run.owner);
                }
                let request = self.chat_request(&run.workflow, &attempt.step, &agent, prompt);
                let clients = self.inner.clients.clone();
                let results = results.clone();
                let load = self.inner.instances.load().clone();
                // A remote endpoint's key is the run owner's secret, read at each call.
                let endpoint = match run.workflow.agents.get(&agent).map(|a| &a.backend) {
                    Some(Backend::Endpoint(endpoint)) if route.instance.is_none() => Some(endpoint.clone()),
                    _ => None,
                };
                let owner = run.owner.clone();
                let run_id = run.id.clone();
                let executor = self.clone();
                // Counted for the owner, under the model served and the agent.
                let model = crate::sharing::accounting::model_served(&self.inner.instances, &route);
                let tap = self.inner.sharing.tap(&owner, &model, &agent);
                // An agent with tools runs an agent loop, resumed from its recorded turns.
                let agent_loop = run
                    .workflow
                    .agents
                    .get(&agent)
                    .is_some_and(|a| !a.tools.is_empty())
                    .then(|| AgentLoop {
                        access: self.tool_access(),
                        workflow: run.workflow.clone(),
                        owner: owner.clone(),
                        attempt: attempt.clone(),
                        agent: agent.clone(),
                        request: request.0.clone(),
                        model_timeout: request.1,
                        tool_timeout: self.inner.config.tool_timeout,
                        recorded: run.turns_of(&attempt),
                        changes: loop_changes.clone(),
                        tap: tap.clone(),
                    });
                attempts.spawn(async move {
                    // An endpoint agent's requests count under the agent, as reflexes read them.
                    let counted = crate::load::counted_under(
                        route.instance.as_deref(),
                        endpoint.as_ref().map(|_| (run_id.as_str(), agent.as_str())),
                    );
                    let flight = counted.map(|key| load.begin(&key, None));
                    let route_instance = route.instance.clone();
                    let route = match endpoint {
                        Some(endpoint) => clients.endpoint_route(&owner, &endpoint),
                        None => Ok(route),
                    };
                    let answer = match (route, agent_loop) {
                        (Ok(route), Some(agent_loop)) => agent_loop.run(route).await,
                        (Ok(route), None) => {
                            let answer = call(&clients, &route, request.0, request.1).await;
                            if let Ok(answer) = &answer {
                                tap.call(answer.usage);
                            }
                            answer
                        }
                        (Err(error), _) => Err(error),
                    };
                    if let (Some(flight), Ok(answer)) = (flight, &answer) {
                        flight.done(answer.usage.map_or(0, |u| u.completion_tokens));
                    }
                    if let (Some(instance), Ok(answer)) = (&route_instance, &answer)
                        && let Some(rate) = answer.decode_tokens_per_s
                    {
                        executor.record_speed(instance, rate);
                    }
                    let _ = results.send((attempt, answer)).await;
                });
            }
            if run.state.is_final() {
                return Ok(Stop::Ended);
            }
            let retry_at = run.next_retry();
            let wait = retry_at.map(|at| unix_ms().until(at));
            tokio::select! {
                () = shutdown.cancelled() => {
                    // The attempts in flight are dropped: the record says they run,
                    // and the next start runs them again (RunRecord::recover).
                    attempts.abort_all();
                    return Ok(Stop::Shutdown);
                }
                Some((attempt, change, written)) = loop_changed.recv() => {
                    let recorded = run.record_loop(&attempt.step, attempt.item, change);
                    self.save(run).await?;
                    let _ = written.send(recorded);
                }
                Some(Decide { verdict, reply }) = decisions.recv() => {
                    let on = Attempt { step: verdict.step, item: verdict.item };
                    let decision = Decision { approved: verdict.approved, by: verdict.by, comment: verdict.comment, at: unix_ms() };
                    let (approved, by) = (decision.approved, decision.by.clone());
                    let outcome = off_worker(|| run.decide(&on, decision, evaluator, &self.inner.config.retry));
                    if outcome.is_ok() {
                        tracing::info!(run = %run.id, on = %on, approved, by = %by, "approval decided");
                        self.save(run).await?;
                    }
                    let _ = reply.send(outcome.map(|()| run.clone()));
                }
                Some((attempt, answer)) = finished.recv() => {
                    let now = unix_ms();
                    let Attempt { step, item } = &attempt;
                    // A step with an output schema takes only a conforming answer.
                    let answer = answer.and_then(|a| {
                        let content = match schemas.get(step.as_str()) {
                            Some(schema) => conform_to(schema, &a.content),
                            None => run.conform(step, &a.content),
                        };
                        content.map(|content| Answer { content, ..a }).map_err(CallError::Engine)
                    });
                    match answer {
                        Ok(answer) => {
                            unreachable.remove(&attempt);
                            off_worker(|| run.complete_attempt(step, *item, answer.content, answer.usage, evaluator, now));
                        }
                        Err(CallError::Unreachable(error)) if unreachable.get(&attempt).copied().unwrap_or(0) < UNREACHABLE_RETRIES => {
                            // Most likely its node is going down: wait for the graph to
                            // say so (the run then moves), without spending a retry.
                            let count = unreachable.entry(attempt.clone()).or_insert(0);
                            *count += 1;
                            run.interrupt(step, *item, error, now.plus(self.inner.config.retry.backoff(*count)));
                        }
                        Err(CallError::Unreachable(error) | CallError::Engine(error) | CallError::Refused(error) | CallError::Denied(error)) => {
                            unreachable.remove(&attempt);
                            if let AfterFailure::RetryAt(_) = run.fail_attempt_of(step, *item, error, &self.inner.config.retry, now) {
                                tracing::info!(run = %run.id, %attempt, "attempt failed; retrying");
                            }
                        }
                    }
                }
                _ = cancelled.changed() => {
                    attempts.abort_all();
                    return Ok(stop_of(cancelled));
                }
                _ = changes.changed() => {
                    let lost = routes
                        .values()
                        .filter_map(|r| r.instance.as_ref())
                        .find_map(|name| Lost::of(name, self.inner.instances.get(name).as_ref()));
                    if let Some(lost) = lost {
                        attempts.abort_all();
                        return Ok(Stop::Lost(lost));
                    }
                }
                _ = tokio::time::sleep(wait.unwrap_or(Duration::from_secs(3600))), if wait.is_some() => {}
            }
        }
    }

    /// The chat request of one attempt, and its timeout.
    pub(super) fn chat_request(
        &self,
        workflow: &Workflow,
        step: &str,
        agent: &str,
        prompt: String,
    ) -> (serde_json::Value, Duration) {
        let definition = workflow.agents.get(agent);
        let mut messages = Vec::new();
        if let Some(system) = definition.and_then(|a| a.system.as_ref()) {
            messages.push(serde_json::json!({"role": "system", "content": system}));
        }
        messages.push(serde_json::json!({"role": "user", "content": prompt}));
        let mut body = serde_json::json!({ "messages": messages, "stream": false });
        if let Some(t) = definition.and_then(|a| a.temperature) {
            body["temperature"] = serde_json::json!(t);
        }
        if let Some(m) = definition.and_then(|a| a.max_tokens) {
            body["max_tokens"] = serde_json::json!(m);
        }
        // The engine constrains the answer to the step's schema where it can.
        if let Some(schema) = workflow.step(step).and_then(|s| s.output_schema.as_ref()) {
            body["response_format"] = serde_json::json!({
                "type": "json_schema",
                "json_schema": {"name": step, "schema": schema, "strict": true},
            });
        }
        let timeout = workflow
            .step(step)
            .and_then(|s| s.timeout)
            .unwrap_or(self.inner.config.step_timeout);
        (body, timeout)
    }
}

/// How many times a run places a split replica again after its pieces failed (a lost
/// node is avoided by the graph; a failing piece on a node that is up, by the placement)
/// before the run fails.
pub(super) const SPLIT_REPLACEMENTS: u32 = 2;

/// How a run stops on what `halt` says now.
pub(super) fn stop_of(halt: &watch::Receiver<Halt>) -> Stop {
    match &*halt.borrow() {
        Halt::Preempt(by) => Stop::Preempted(by.clone()),
        Halt::Run | Halt::Cancel => Stop::Cancelled,
    }
}

/// Why a run's drive stopped.
pub(super) enum Stop {
    /// The server is stopping: the run is left as last recorded, resumed at the next
    /// start.
    Shutdown,
    /// A user cancelled it.
    Cancelled,
    /// A higher-priority run takes its GPUs: it goes back to the queue.
    Preempted(super::preempt::Preemptor),
    /// Its instances could not start (the reason).
    Failed(String),
    /// An instance was lost (with its node, or a piece of its split failed).
    Lost(Lost),
    /// The run ended (succeeded, or failed on a step).
    Ended,
}

/// Attempts in a row that may fail to reach their engine before it counts as the
/// step's failure (with the retry backoff, tens of seconds: longer than a node takes to
/// be marked down).
pub(super) const UNREACHABLE_RETRIES: u32 = 8;
