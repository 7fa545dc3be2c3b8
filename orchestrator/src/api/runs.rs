//! Runs and instances over REST:
//!
//! - `POST /v1/runs` `{"workflow": "<text>", "name": "hello.yaml", "inputs": {…}}` →
//!   `202 Accepted` with the stored run (it is on disk before the answer). With an
//!   `Idempotency-Key` header, a retry (same key, same body) gets the first run again
//!   (header `Idempotent-Replayed: true`), never a second; the same key with another
//!   body is `409`. `503` with `Retry-After` when the store is stalled; `429` with
//!   `Retry-After` when the queue of its priority is full; `422` with diagnostics for
//!   an invalid workflow; `400` for bad inputs.
//! - `GET /v1/runs?limit=&after=` (newest first) → `{"data": [...], "next": id | null}`,
//!   `GET /v1/runs/{id}`, `POST /v1/runs/{id}/cancel`.
//! - `GET /v1/runs/{id}/events`: server-sent events, the run (`event: run`) at once and
//!   after every change, until it ends.
//! - `GET /v1/instances`: every model instance, its state and measured memory;
//!   `GET /v1/instances/{name}/logs?tail=N`: the last lines its engine wrote, from its
//!   agent (`{"lines": [...]}`); for admins, and for the user whose requests alone the
//!   instance served (a log may hold prompts; anyone else gets 403).
//! - `GET /v1/measurements`: memory instances really used once loaded, beside the
//!   plan's estimate.

use std::collections::BTreeMap;
use std::convert::Infallible;

use axum::extract::{Extension, Path, State};
use axum::http::{HeaderValue, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::Stream;
use serde::{Deserialize, Serialize};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::error::{ApiError, ErrorBody, InvalidWorkflow};
use super::extract::{IDEMPOTENT_REPLAYED, Params, idempotency_key};
use super::openapi::ServerSentEvent;
use super::paging::{Listed, PageQuery};
use super::plans::parse_workflow;
use super::{ApiState, Principal};
use crate::idempotency::Idempotent;
use crate::instances::{InstanceView, Measurement};
use crate::run::SubmitError;
use crate::run::executor::Submitted;
use crate::run::record::{RunRecord, RunState, UnixMs};

/// The routes of this module (behind the API token).
pub(super) fn routes() -> OpenApiRouter<ApiState> {
    OpenApiRouter::new()
        .routes(routes!(submit, list))
        .routes(routes!(show))
        .routes(routes!(cancel))
        .routes(routes!(events))
        .routes(routes!(instances))
        .routes(routes!(logs))
        .routes(routes!(measurements))
}

/// The body of `POST /v1/runs`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SubmitRequest {
    /// The workflow's text, YAML or Rhai.
    pub workflow: String,
    /// Its file name (`.yaml`, `.yml`, `.rhai`); default `workflow.yaml`.
    #[serde(default)]
    pub name: Option<String>,
    /// Input values by name (strings are converted to the declared type).
    #[serde(default)]
    #[schema(value_type = Object)]
    pub inputs: BTreeMap<String, serde_json::Value>,
}

/// Submits a workflow: it is stored before the answer, then waits for room and runs.
#[utoipa::path(post, operation_id = "submit_run", path = "/v1/runs", tag = "runs", request_body = SubmitRequest,
    responses(
        (status = 202, description = "Accepted and stored", body = RunRecord),
        (status = 400, description = "Not a run request, or bad inputs", body = ErrorBody),
        (status = 403, description = "The server preempts by priority, and the workflow's priority is above the highest a user other than the admin may set", body = ErrorBody),
        (status = 422, description = "The workflow is invalid", body = InvalidWorkflow),
        (status = 409, description = "The Idempotency-Key was used with another request, or its first request is in progress", body = ErrorBody),
        (status = 429, description = "The queue of its priority is full (see Retry-After), or two of this user's workflows are being evaluated already", body = ErrorBody,
            headers(("Retry-After" = u64, description = "Seconds to wait"))),
        (status = 503, description = "The store did not acknowledge in time; nothing was acknowledged. See Retry-After", body = ErrorBody,
            headers(("Retry-After" = u64, description = "Seconds to wait"))),
    ),
    params(("Idempotency-Key" = Option<String>, Header, description = "Makes a retried submission return the first run (at most 256 bytes)")))]
async fn submit(
    State(state): State<ApiState>,
    Extension(principal): Extension<Principal>,
    headers: axum::http::HeaderMap,
    body: axum::body::Bytes,
) -> Result<Response, ApiError> {
    let request: SubmitRequest = serde_json::from_slice(&body).map_err(|e| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            format!(
                "the body is not a run request ({e}); send {{\"workflow\": \"<YAML or Rhai text>\", \"inputs\": {{…}}}}"
            ),
        )
    })?;
    let workflow = parse_workflow(&principal, request.name.as_deref(), &request.workflow, &state.executor).await?;
    let priority = workflow.placement.priority;
    if !principal.admin
        && let Some(cap) = state.executor.priority_cap()
        && priority > cap
    {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            format!(
                "`placement.priority` is {priority}, and on this server, where higher priorities preempt lower ones, \
                 users may set at most {cap}; lower it, or ask the admin"
            ),
        ));
    }
    let key = idempotency_key(&headers)?;
    let idempotent = key.as_deref().map(|key| Idempotent { key, request: &body });
    let Submitted { run, replayed } = state
        .executor
        .submit(&principal.user, workflow, &request.inputs, idempotent)
        .await
        .map_err(submit_error)?;
    let mut response = (StatusCode::ACCEPTED, axum::Json(run)).into_response();
    if replayed {
        response
            .headers_mut()
            .insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
    }
    Ok(response)
}

/// 400 for bad inputs, 429 with `Retry-After` for a full queue, and the store's and
/// the Idempotency-Key's own answers.
fn submit_error(e: SubmitError) -> ApiError {
    match e {
        SubmitError::Inputs(_) => ApiError::new(StatusCode::BAD_REQUEST, e.to_string()),
        SubmitError::QueueFull { retry_after, .. } => {
            ApiError::new(StatusCode::TOO_MANY_REQUESTS, e.to_string()).retry_after(retry_after.as_secs().max(1))
        }
        SubmitError::Quota(refusal) => ApiError::from(refusal),
        SubmitError::Key(e) => ApiError::from(e),
        SubmitError::Store(e) => ApiError::from(e),
    }
}

/// One row of `GET /v1/runs`.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct RunSummary {
    /// Id.
    pub id: String,
    /// The workflow's name.
    pub workflow: String,
    /// State.
    pub state: RunState,
    /// Why it waits or failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Steps done (or skipped) of all.
    pub steps_done: usize,
    /// Steps.
    pub steps: usize,
    /// Accepted.
    pub submitted_at: UnixMs,
    /// Ended.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<UnixMs>,
}

impl From<&RunRecord> for RunSummary {
    fn from(run: &RunRecord) -> Self {
        RunSummary {
            id: run.id.clone(),
            workflow: run.workflow.name.clone(),
            state: run.state,
            reason: run.reason.clone(),
            steps_done: run.steps.iter().filter(|s| s.state.is_finished()).count(),
            steps: run.steps.len(),
            submitted_at: run.submitted_at,
            finished_at: run.finished_at,
        }
    }
}

/// The runs the caller may see (an admin: all), newest first, a page at a time.
#[utoipa::path(get, operation_id = "list_runs", path = "/v1/runs", tag = "runs", params(PageQuery),
    responses(
        (status = 200, description = "A page of runs", body = Listed<RunSummary, String>),
        (status = 400, description = "A bad query", body = ErrorBody),
    ))]
async fn list(
    State(state): State<ApiState>,
    Extension(principal): Extension<Principal>,
    Params(query): Params<PageQuery>,
) -> Result<axum::Json<Listed<RunSummary, String>>, ApiError> {
    let runs = state.executor.list().map_err(ApiError::internal)?;
    let limit = query.limit()?;
    // Ids are time-ordered and the list is newest first: the page after `after` starts
    // at the first older id.
    let rest = runs
        .iter()
        .filter(|run| principal.may_see(&run.owner))
        .filter(|run| query.after.as_deref().is_none_or(|after| run.id.as_str() < after))
        .map(RunSummary::from);
    Ok(axum::Json(Listed::cut(rest, limit, |run| run.id.clone())))
}

fn not_found(id: &str) -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, format!("no run `{id}`; GET /v1/runs lists them"))
}

/// The run `id` if `principal` may see it; another user's run is "not found".
pub(super) fn visible_run(state: &ApiState, principal: &Principal, id: &str) -> Result<RunRecord, ApiError> {
    match state.executor.get(id) {
        Ok(Some(run)) if principal.may_see(&run.owner) => Ok(run),
        Ok(_) => Err(not_found(id)),
        Err(e) => Err(ApiError::internal(e)),
    }
}

/// A run: its workflow, inputs, state and every step with its output.
#[utoipa::path(get, operation_id = "get_run", path = "/v1/runs/{id}", tag = "runs",
    params(("id" = String, Path, description = "The run's id")),
    responses(
        (status = 200, description = "The run", body = RunRecord),
        (status = 404, description = "No such run (or another user's)", body = ErrorBody),
    ))]
async fn show(
    State(state): State<ApiState>,
    Extension(principal): Extension<Principal>,
    Path(id): Path<String>,
) -> Result<axum::Json<RunRecord>, ApiError> {
    visible_run(&state, &principal, &id).map(axum::Json)
}

/// Cancels a run: queued, it never starts; running, its steps stop and its instances
/// are stopped. Cancelling an ended run changes nothing.
#[utoipa::path(post, operation_id = "cancel_run", path = "/v1/runs/{id}/cancel", tag = "runs",
    params(("id" = String, Path, description = "The run's id")),
    responses(
        (status = 200, description = "The run after the cancellation", body = RunRecord),
        (status = 404, description = "No such run (or another user's)", body = ErrorBody),
    ))]
async fn cancel(
    State(state): State<ApiState>,
    Extension(principal): Extension<Principal>,
    Path(id): Path<String>,
) -> Result<axum::Json<RunRecord>, ApiError> {
    visible_run(&state, &principal, &id)?;
    match state.executor.cancel(&id).await {
        Ok(run) => Ok(axum::Json(run)),
        Err(crate::run::executor::RunError::NotFound(_)) => Err(not_found(&id)),
        Err(e) => Err(ApiError::internal(e)),
    }
}

/// The run as server-sent events (`event: run`, the run as data) at once and after
/// every change, until it has ended.
#[utoipa::path(get, operation_id = "run_events", path = "/v1/runs/{id}/events", tag = "runs",
    params(("id" = String, Path, description = "The run's id")),
    responses(
        (status = 200, description = "Events `run` (the run as JSON) until the run ends", body = ServerSentEvent, content_type = "text/event-stream"),
        (status = 404, description = "No such run (or another user's)", body = ErrorBody),
    ))]
async fn events(
    State(state): State<ApiState>,
    Extension(principal): Extension<Principal>,
    Path(id): Path<String>,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>, ApiError> {
    visible_run(&state, &principal, &id)?;
    Ok(Sse::new(run_stream(state, id)).keep_alive(KeepAlive::default()))
}

/// The run now and after each change, ending after the event that shows it ended.
fn run_stream(state: ApiState, id: String) -> impl Stream<Item = Result<Event, Infallible>> {
    let changes = state.executor.subscribe();
    futures::stream::unfold(
        (state, id, changes, true, false),
        |(state, id, mut changes, first, ended)| async move {
            if ended {
                return None;
            }
            if !first {
                loop {
                    if changes.changed().await.is_err() {
                        return None;
                    }
                    if changes.borrow_and_update().1 == id {
                        break;
                    }
                }
            }
            let run = match state.executor.get(&id) {
                Ok(Some(run)) => run,
                _ => return None,
            };
            let ended = run.state.is_final();
            let data = serde_json::to_string(&run).unwrap_or_default();
            Some((
                Ok(Event::default().event("run").data(data)),
                (state, id, changes, false, ended),
            ))
        },
    )
}

/// Every model instance, its state, placement and measured memory, and who uses it:
/// the runs it has served and the sessions bound to it (of the caller; an admin: all).
#[utoipa::path(get, operation_id = "list_instances", path = "/v1/instances", tag = "runs",
    responses((status = 200, description = "The instances", body = Vec<InstanceView>)))]
async fn instances(
    State(state): State<ApiState>,
    Extension(principal): Extension<Principal>,
) -> Result<axum::Json<Vec<InstanceView>>, ApiError> {
    let mut list = state.instances.list();
    let names: Vec<String> = list.iter().map(|i| i.name.clone()).collect();
    let bound = state.sessions.bound_to(&names)?;
    for session in bound.into_iter().filter(|s| principal.may_see(&s.owner)) {
        if let Some(instance) = session
            .binding
            .as_ref()
            .and_then(|b| list.iter_mut().find(|i| i.name == b.instance))
        {
            instance.sessions.push(session.id);
        }
    }
    Ok(axum::Json(list))
}

/// Memory instances really used once loaded, beside the plan's estimate.
#[utoipa::path(get, operation_id = "list_measurements", path = "/v1/measurements", tag = "runs",
    responses((status = 200, description = "One per variant, engine, GPU count, context and concurrency", body = Vec<Measurement>)))]
async fn measurements(State(state): State<ApiState>) -> Result<axum::Json<Vec<Measurement>>, ApiError> {
    // A store failure here is the server's (500), busy or not.
    state
        .instances
        .measurements()
        .map(axum::Json)
        .map_err(ApiError::internal)
}

/// The query of `GET /v1/instances/{name}/logs`.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
struct LogsQuery {
    /// How many of the last lines: 0 to 10000, default 200.
    #[serde(default = "default_tail")]
    #[param(maximum = 10000)]
    tail: u32,
}

/// The most log lines one request reads.
const MAX_TAIL: u32 = 10_000;

/// The last lines an instance's engine wrote.
#[derive(Debug, Serialize, utoipa::ToSchema)]
struct Logs {
    /// The instance.
    instance: String,
    /// Oldest first.
    lines: Vec<String>,
}

fn default_tail() -> u32 {
    200
}

/// The last lines an instance's engine wrote, from its agent. Its log may hold the
/// prompts of whoever used it: admins read every instance's, a user only that of an
/// instance that served their requests alone.
#[utoipa::path(get, operation_id = "instance_logs", path = "/v1/instances/{name}/logs", tag = "runs",
    params(("name" = String, Path, description = "The instance's name"), LogsQuery),
    responses(
        (status = 200, description = "The lines", body = Logs),
        (status = 400, description = "A bad query", body = ErrorBody),
        (status = 403, description = "Not the caller's to read: the instance also served others (or is not known to have served only the caller)", body = ErrorBody),
        (status = 404, description = "No such instance", body = ErrorBody),
        (status = 502, description = "Its agent did not answer", body = ErrorBody),
    ))]
async fn logs(
    State(state): State<ApiState>,
    Extension(principal): Extension<Principal>,
    Path(name): Path<String>,
    Params(query): Params<LogsQuery>,
) -> Result<axum::Json<Logs>, ApiError> {
    use crate::instances::InstanceError;
    if query.tail > MAX_TAIL {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            format!("`tail` is {}; ask for at most {MAX_TAIL} lines", query.tail),
        ));
    }
    let Some((mut readers, run)) = state.instances.log_readers(&name) else {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            InstanceError::Unknown(name).to_string(),
        ));
    };
    // The owner of the run it was started for, even before its first request (an
    // instance that fails to load is theirs to look into).
    if let Some(run) = run {
        match state.executor.get(&run) {
            Ok(Some(record)) => {
                readers.users.insert(record.owner);
            }
            Ok(None) => {}
            Err(e) => return Err(ApiError::internal(e)),
        }
    }
    if !readers.admit(&principal.user, principal.admin) {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            format!(
                "the logs of instance `{name}` can hold the prompts of everyone it served, and it did not serve only you; help: an admin can read them (`skein logs {name}` with an admin token)"
            ),
        ));
    }
    match state.instances.logs(&name, query.tail).await {
        Ok(lines) => Ok(axum::Json(Logs { instance: name, lines })),
        Err(e @ InstanceError::Unknown(_)) => Err(ApiError::new(StatusCode::NOT_FOUND, e.to_string())),
        Err(e) => Err(ApiError::new(StatusCode::BAD_GATEWAY, e.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::run::record::StepState;

    #[test]
    fn a_summary_counts_finished_steps() {
        let parsed = skein_dsl::parse(
            "w.yaml",
            "name: w\nagents:\n  a: { model: Qwen/Qwen2.5-0.5B-Instruct }\nsteps:\n  - { id: one, agent: a, prompt: hi }\n  - { id: two, agent: a, after: [one], prompt: hi }\n",
        );
        let workflow = parsed.workflow.unwrap();
        let mut run = RunRecord::new("r1".to_owned(), "me".to_owned(), workflow, BTreeMap::new(), UnixMs(0));
        run.steps[0].state = StepState::Done;
        let summary = RunSummary::from(&run);
        assert_eq!((summary.steps_done, summary.steps), (1, 2));
    }
}
