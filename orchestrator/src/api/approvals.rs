//! Approval steps, and tool calls found in flight under `in_flight: ask`, over REST:
//! `POST /v1/runs/{id}/steps/{step}/approve` and `…/reject`, with an optional
//! `{"comment": "…"}` (and `"item": N` for an item of a `for_each` step). The run's
//! owner (or an admin) decides; the run's task records the decision, who made it and
//! when, before the answer (the run as written). A step that is not waiting is `409`.

use axum::Json;
use axum::extract::{Extension, Path, State};
use axum::http::StatusCode;
use serde::Deserialize;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::error::{ApiError, ErrorBody};
use super::extract::body as parse_body;
use super::runs::visible_run;
use super::{ApiState, Principal};
use crate::run::executor::{ApproveError, RunError, Verdict};
use crate::run::record::{DecideError, MAX_COMMENT_BYTES, RunRecord};

pub(super) fn routes() -> OpenApiRouter<ApiState> {
    OpenApiRouter::new().routes(routes!(approve)).routes(routes!(reject))
}

/// The body of a decision (it may be empty).
#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DecisionRequest {
    /// Why; kept with the decision (at most 4 KiB). An approval's comment is the
    /// step's output.
    #[serde(default)]
    pub comment: Option<String>,
    /// The item of a `for_each` step whose tool call, in flight under
    /// `in_flight: ask`, waits; left out for the step itself.
    #[serde(default)]
    pub item: Option<u32>,
}

/// Approves a waiting approval step: the run goes on, the comment as the step's output.
/// Or approves sending again a tool call that was in flight under `in_flight: ask`
/// (of the step, or of its item `item`): the attempt resumes with it.
#[utoipa::path(post, operation_id = "approve_step", path = "/v1/runs/{id}/steps/{step}/approve", tag = "runs",
    params(("id" = String, Path, description = "The run's id"), ("step" = String, Path, description = "The step that waits")),
    request_body(content = Option<DecisionRequest>, description = "An optional comment, and the item whose call waits"),
    responses(
        (status = 200, description = "The run with the decision recorded", body = RunRecord),
        (status = 400, description = "A bad body (a comment over 4 KiB)", body = ErrorBody),
        (status = 404, description = "No such run (or another user's), or no such step or item", body = ErrorBody),
        (status = 409, description = "Nothing waits there (or its items wait and no item is named), or the run is not running", body = ErrorBody),
        (status = 503, description = "The run's task is busy; see Retry-After", body = ErrorBody,
            headers(("Retry-After" = u64, description = "Seconds to wait"))),
    ))]
async fn approve(
    State(state): State<ApiState>,
    Extension(principal): Extension<Principal>,
    Path((id, step)): Path<(String, String)>,
    body: axum::body::Bytes,
) -> Result<Json<RunRecord>, ApiError> {
    decide(&state, &principal, &id, &step, true, &body).await
}

/// Rejects a waiting approval step: the step fails, and the run with it. Or rejects
/// sending again a tool call that was in flight under `in_flight: ask`: the attempt
/// fails, and the step's `retries` apply.
#[utoipa::path(post, operation_id = "reject_step", path = "/v1/runs/{id}/steps/{step}/reject", tag = "runs",
    params(("id" = String, Path, description = "The run's id"), ("step" = String, Path, description = "The step that waits")),
    request_body(content = Option<DecisionRequest>, description = "An optional comment, and the item whose call waits"),
    responses(
        (status = 200, description = "The run with the decision recorded (failed, or the attempt retrying)", body = RunRecord),
        (status = 400, description = "A bad body (a comment over 4 KiB)", body = ErrorBody),
        (status = 404, description = "No such run (or another user's), or no such step or item", body = ErrorBody),
        (status = 409, description = "Nothing waits there (or its items wait and no item is named), or the run is not running", body = ErrorBody),
        (status = 503, description = "The run's task is busy; see Retry-After", body = ErrorBody,
            headers(("Retry-After" = u64, description = "Seconds to wait"))),
    ))]
async fn reject(
    State(state): State<ApiState>,
    Extension(principal): Extension<Principal>,
    Path((id, step)): Path<(String, String)>,
    body: axum::body::Bytes,
) -> Result<Json<RunRecord>, ApiError> {
    decide(&state, &principal, &id, &step, false, &body).await
}

async fn decide(
    state: &ApiState,
    principal: &Principal,
    id: &str,
    step: &str,
    approved: bool,
    body: &[u8],
) -> Result<Json<RunRecord>, ApiError> {
    visible_run(state, principal, id)?;
    let request: DecisionRequest = if body.iter().all(u8::is_ascii_whitespace) {
        DecisionRequest::default()
    } else {
        parse_body(body, "a decision (`{\"comment\": \"…\", \"item\": N}`)")?
    };
    if let Some(comment) = &request.comment
        && comment.len() > MAX_COMMENT_BYTES
    {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            format!(
                "the comment has {} bytes; a decision keeps at most {MAX_COMMENT_BYTES}",
                comment.len()
            ),
        ));
    }
    let verdict = Verdict {
        step: step.to_owned(),
        item: request.item,
        approved,
        by: principal.user.clone(),
        comment: request.comment,
    };
    match state.executor.decide(id, verdict).await {
        Ok(run) => Ok(Json(run)),
        Err(ApproveError::Run(RunError::NotFound(_))) => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            format!("no run `{id}`; GET /v1/runs lists them"),
        )),
        Err(ApproveError::Run(e)) => Err(ApiError::internal(e)),
        Err(e @ ApproveError::Refused(DecideError::NoStep(_) | DecideError::NoItem { .. })) => {
            Err(ApiError::new(StatusCode::NOT_FOUND, e.to_string()))
        }
        Err(e @ (ApproveError::Refused(_) | ApproveError::NotRunning { .. })) => {
            Err(ApiError::new(StatusCode::CONFLICT, e.to_string()))
        }
        Err(e @ ApproveError::Busy(_)) => {
            Err(ApiError::new(StatusCode::SERVICE_UNAVAILABLE, e.to_string()).retry_after(2))
        }
    }
}
