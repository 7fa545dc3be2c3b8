//! Runs and instances over REST:
//!
//! - `POST /v1/runs` `{"workflow": "<text>", "name": "hello.yaml", "inputs": {…}}` →
//!   `202 Accepted` with the stored run (it is on disk before the answer); `429` with
//!   `Retry-After` when the queue of its priority is full; `422` with diagnostics for
//!   an invalid workflow; `400` for bad inputs.
//! - `GET /v1/runs` (newest first), `GET /v1/runs/{id}`, `POST /v1/runs/{id}/cancel`.
//! - `GET /v1/runs/{id}/events`: server-sent events, the run (`event: run`) at once and
//!   after every change, until it ends.
//! - `GET /v1/instances`: every model instance, its state and measured memory;
//!   `GET /v1/instances/{name}/logs?tail=N`: the last lines its engine wrote, from its
//!   agent (`{"lines": [...]}`).
//! - `GET /v1/measurements`: memory instances really used once loaded, beside the
//!   plan's estimate.

use std::collections::BTreeMap;
use std::convert::Infallible;

use axum::Router;
use axum::extract::{Extension, Path, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use futures::Stream;
use serde::{Deserialize, Serialize};

use super::{ApiError, ApiState, Principal, error, parse_workflow};
use crate::run::SubmitError;
use crate::run::record::{RunRecord, RunState, UnixMs};

/// The routes of this module (behind the API token).
pub(super) fn routes() -> Router<ApiState> {
    Router::new()
        .route("/v1/runs", post(submit).get(list))
        .route("/v1/runs/{id}", get(show))
        .route("/v1/runs/{id}/cancel", post(cancel))
        .route("/v1/runs/{id}/events", get(events))
        .route("/v1/instances", get(instances))
        .route("/v1/instances/{name}/logs", get(logs))
        .route("/v1/measurements", get(measurements))
}

/// The body of `POST /v1/runs`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SubmitRequest {
    /// The workflow's text, YAML or Rhai.
    pub workflow: String,
    /// Its file name (`.yaml`, `.yml`, `.rhai`); default `workflow.yaml`.
    #[serde(default)]
    pub name: Option<String>,
    /// Input values by name (strings are converted to the declared type).
    #[serde(default)]
    pub inputs: BTreeMap<String, serde_json::Value>,
}

async fn submit(
    State(state): State<ApiState>,
    Extension(principal): Extension<Principal>,
    body: axum::body::Bytes,
) -> Response {
    let request: SubmitRequest = match serde_json::from_slice(&body) {
        Ok(request) => request,
        Err(e) => {
            return error(
                StatusCode::BAD_REQUEST,
                &format!(
                    "the body is not a run request ({e}); send {{\"workflow\": \"<YAML or Rhai text>\", \"inputs\": {{…}}}}"
                ),
            );
        }
    };
    let workflow = match parse_workflow(request.name.as_deref(), &request.workflow) {
        Ok(workflow) => workflow,
        Err(response) => return *response,
    };
    match state.executor.submit(&principal.user, workflow, &request.inputs).await {
        Ok(run) => (StatusCode::ACCEPTED, axum::Json(run)).into_response(),
        Err(e @ SubmitError::Inputs(_)) => error(StatusCode::BAD_REQUEST, &e.to_string()),
        Err(e @ SubmitError::QueueFull { retry_after, .. }) => {
            let mut response = error(StatusCode::TOO_MANY_REQUESTS, &e.to_string());
            if let Ok(value) = HeaderValue::from_str(&retry_after.as_secs().max(1).to_string()) {
                response.headers_mut().insert(header::RETRY_AFTER, value);
            }
            response
        }
        Err(e @ SubmitError::Store(_)) => error(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
    }
}

/// One row of `GET /v1/runs`.
#[derive(Debug, Serialize)]
pub struct RunSummary {
    /// Id.
    pub id: String,
    /// The workflow's name.
    pub workflow: String,
    /// State.
    pub state: RunState,
    /// Why it waits or failed.
    pub reason: Option<String>,
    /// Steps done (or skipped) of all.
    pub steps_done: usize,
    /// Steps.
    pub steps: usize,
    /// Accepted.
    pub submitted_at: UnixMs,
    /// Ended.
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

async fn list(State(state): State<ApiState>, Extension(principal): Extension<Principal>) -> Response {
    match state.executor.list() {
        Ok(runs) => axum::Json(
            runs.iter()
                .filter(|run| principal.may_see(&run.owner))
                .map(RunSummary::from)
                .collect::<Vec<_>>(),
        )
        .into_response(),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
    }
}

fn not_found(id: &str) -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, format!("no run `{id}`; GET /v1/runs lists them"))
}

/// The run `id` if `principal` may see it; another user's run is "not found".
fn visible_run(state: &ApiState, principal: &Principal, id: &str) -> Result<RunRecord, ApiError> {
    match state.executor.get(id) {
        Ok(Some(run)) if principal.may_see(&run.owner) => Ok(run),
        Ok(_) => Err(not_found(id)),
        Err(e) => Err(ApiError::internal(e)),
    }
}

async fn show(
    State(state): State<ApiState>,
    Extension(principal): Extension<Principal>,
    Path(id): Path<String>,
) -> Response {
    match visible_run(&state, &principal, &id) {
        Ok(run) => axum::Json(run).into_response(),
        Err(e) => e.into_response(),
    }
}

async fn cancel(
    State(state): State<ApiState>,
    Extension(principal): Extension<Principal>,
    Path(id): Path<String>,
) -> Response {
    if let Err(e) = visible_run(&state, &principal, &id) {
        return e.into_response();
    }
    match state.executor.cancel(&id).await {
        Ok(run) => axum::Json(run).into_response(),
        Err(crate::run::executor::RunError::NotFound(_)) => not_found(&id).into_response(),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
    }
}

async fn events(
    State(state): State<ApiState>,
    Extension(principal): Extension<Principal>,
    Path(id): Path<String>,
) -> Response {
    if let Err(e) = visible_run(&state, &principal, &id) {
        return e.into_response();
    }
    Sse::new(run_stream(state, id))
        .keep_alive(KeepAlive::default())
        .into_response()
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

async fn instances(State(state): State<ApiState>) -> Response {
    axum::Json(state.instances.list()).into_response()
}

async fn measurements(State(state): State<ApiState>) -> Response {
    match state.instances.measurements() {
        Ok(list) => axum::Json(list).into_response(),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
    }
}

/// The query of `GET /v1/instances/{name}/logs`.
#[derive(Debug, Deserialize)]
struct LogsQuery {
    #[serde(default = "default_tail")]
    tail: u32,
}

fn default_tail() -> u32 {
    200
}

async fn logs(
    State(state): State<ApiState>,
    Path(name): Path<String>,
    axum::extract::Query(query): axum::extract::Query<LogsQuery>,
) -> Response {
    use crate::instances::InstanceError;
    match state.instances.logs(&name, query.tail).await {
        Ok(lines) => axum::Json(serde_json::json!({ "instance": name, "lines": lines })).into_response(),
        Err(e @ InstanceError::Unknown(_)) => error(StatusCode::NOT_FOUND, &e.to_string()),
        Err(e) => error(StatusCode::BAD_GATEWAY, &e.to_string()),
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
