//! Groups, members and quotas over REST (docs/sharing.md). Changes are the admin's;
//! everyone may read the groups and their own quota.
//!
//! - `GET /v1/groups`: every group with its shares, limits and what it holds now.
//! - `PUT /v1/groups/{name}` `{"shares": 2, "limits": {"gpu_gib": 160}, "clear": ["runs"]}`:
//!   makes or changes a group.
//! - `DELETE /v1/groups/{name}`: removes an empty group.
//! - `GET /v1/users`: every user with a record (admin).
//! - `PUT /v1/users/{name}` `{"group": "nlp", "shares": 1, "limits": {"runs": 2}}`: puts
//!   a user in a group, with their shares and limits.
//! - `GET /v1/quota[?user=NAME]`: what the caller (or, for the admin, `user`) and their
//!   group hold now, may hold, and their fair-share factors.

use axum::Json;
use axum::extract::{Extension, Path, State};
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::error::{ApiError, ErrorBody};
use super::extract::{Params, body as read_body};
use super::tokens::admin_only;
use super::{ApiState, Principal};
use crate::sharing::quota::{Limit, Limits};
use crate::sharing::{GroupRecord, Holding, SharingError, UserRecord};

pub(super) fn routes() -> OpenApiRouter<ApiState> {
    OpenApiRouter::new()
        .routes(routes!(list_groups))
        .routes(routes!(set_group, remove_group))
        .routes(routes!(list_users))
        .routes(routes!(set_user))
        .routes(routes!(quota))
}

/// The body of `PUT /v1/groups/{name}` and `PUT /v1/users/{name}`: what to change.
#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct Change {
    /// For a user: the group to put them in (it must exist, or be `default`).
    #[serde(default)]
    group: Option<String>,
    /// Shares (1 to 1 000 000): of the fleet for a group, within the group for a user.
    #[serde(default)]
    shares: Option<u32>,
    /// Limits to set (the others stay as they are).
    #[serde(default)]
    limits: Limits,
    /// Limits to lift.
    #[serde(default)]
    clear: Vec<Limit>,
}

/// A group, with what it holds now.
#[derive(Debug, Serialize, utoipa::ToSchema)]
struct GroupView {
    #[serde(flatten)]
    record: GroupRecord,
    /// Its members (users with a record in it).
    members: Vec<String>,
    /// What it holds now.
    holding: Holding,
}

/// The caller's quota: theirs and their group's.
#[derive(Debug, Serialize, utoipa::ToSchema)]
struct Quota {
    /// The user.
    user: String,
    /// Their group.
    group: String,
    /// What they hold and may hold, with their factor within the group.
    mine: Holding,
    /// What the group holds and may hold, with its factor among the groups.
    ours: Holding,
}

/// `user` to see only one user.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
struct QuotaQuery {
    /// The user (admin only; others see their own).
    #[serde(default)]
    user: Option<String>,
}

fn sharing_error(e: SharingError) -> ApiError {
    match e {
        SharingError::Invalid(_) => ApiError::new(StatusCode::BAD_REQUEST, e.to_string()),
        SharingError::NoGroup(_) => ApiError::new(StatusCode::NOT_FOUND, e.to_string()),
        SharingError::HasMembers { .. } => ApiError::new(StatusCode::CONFLICT, e.to_string()),
        SharingError::Store(e) => ApiError::from(e),
    }
}

const CHANGE: &str = r#"a change: {"shares": N, "limits": {"gpu_gib": X, "gpus": N, "runs": N, "tokens_per_minute": N, "sessions": N, "gpu_hours": X, "gpu_hours_period_hours": N}, "clear": ["runs"]}"#;

/// The body as a [`Change`]: a JSON object only (serde would take an array for the
/// struct's fields in order).
fn read_change(body: &[u8]) -> Result<Change, ApiError> {
    let value: serde_json::Value = read_body(body, CHANGE)?;
    if !value.is_object() {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            format!("the body is not {CHANGE}: send a JSON object"),
        ));
    }
    serde_json::from_value(value)
        .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, format!("the body is not {CHANGE} ({e})")))
}

/// Every group: shares, limits, members and what it holds now.
#[utoipa::path(get, operation_id = "list_groups", path = "/v1/groups", tag = "sharing",
    responses((status = 200, description = "The groups, by name", body = Vec<GroupView>)))]
async fn list_groups(State(state): State<ApiState>) -> Json<Vec<GroupView>> {
    let sharing = state.executor.sharing();
    let instances = state.instances.list();
    let users = sharing.users();
    Json(
        sharing
            .groups()
            .into_iter()
            .map(|record| GroupView {
                members: users
                    .iter()
                    .filter(|u| u.group == record.name)
                    .map(|u| u.name.clone())
                    .collect(),
                holding: sharing.holding(None, &record.name, &instances),
                record,
            })
            .collect(),
    )
}

/// Makes or changes a group.
#[utoipa::path(put, operation_id = "set_group", path = "/v1/groups/{name}", tag = "sharing", request_body = Change,
    params(("name" = String, Path, description = "The group")),
    responses(
        (status = 200, description = "The group as it is now", body = GroupRecord),
        (status = 400, description = "A bad name, share or limit", body = ErrorBody),
        (status = 403, description = "The caller is not the admin", body = ErrorBody),
    ))]
async fn set_group(
    State(state): State<ApiState>,
    Extension(principal): Extension<Principal>,
    Path(name): Path<String>,
    body: axum::body::Bytes,
) -> Result<Json<GroupRecord>, ApiError> {
    admin_only(&principal)?;
    let change = read_change(&body)?;
    if change.group.is_some() {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "a group has no `group`; to put a user in it, PUT /v1/users/NAME {\"group\": \"...\"}",
        ));
    }
    state
        .executor
        .sharing()
        .set_group(&name, change.shares, &change.limits, &change.clear)
        .await
        .map(Json)
        .map_err(sharing_error)
}

/// Removes a group without members.
#[utoipa::path(delete, operation_id = "remove_group", path = "/v1/groups/{name}", tag = "sharing",
    params(("name" = String, Path, description = "The group")),
    responses(
        (status = 200, description = "The removed group", body = GroupRecord),
        (status = 403, description = "The caller is not the admin", body = ErrorBody),
        (status = 404, description = "No such group", body = ErrorBody),
        (status = 409, description = "It still has members", body = ErrorBody),
    ))]
async fn remove_group(
    State(state): State<ApiState>,
    Extension(principal): Extension<Principal>,
    Path(name): Path<String>,
) -> Result<Json<GroupRecord>, ApiError> {
    admin_only(&principal)?;
    state
        .executor
        .sharing()
        .remove_group(&name)
        .await
        .map(Json)
        .map_err(sharing_error)
}

/// Every user with a record: group, shares, limits.
#[utoipa::path(get, operation_id = "list_users", path = "/v1/users", tag = "sharing",
    responses(
        (status = 200, description = "The users, by name", body = Vec<UserRecord>),
        (status = 403, description = "The caller is not the admin", body = ErrorBody),
    ))]
async fn list_users(
    State(state): State<ApiState>,
    Extension(principal): Extension<Principal>,
) -> Result<Json<Vec<UserRecord>>, ApiError> {
    admin_only(&principal)?;
    Ok(Json(state.executor.sharing().users()))
}

/// Puts a user in a group, with their shares and limits.
#[utoipa::path(put, operation_id = "set_user", path = "/v1/users/{name}", tag = "sharing", request_body = Change,
    params(("name" = String, Path, description = "The user")),
    responses(
        (status = 200, description = "The user's record as it is now", body = UserRecord),
        (status = 400, description = "A bad name, share or limit", body = ErrorBody),
        (status = 403, description = "The caller is not the admin", body = ErrorBody),
        (status = 404, description = "No such group", body = ErrorBody),
    ))]
async fn set_user(
    State(state): State<ApiState>,
    Extension(principal): Extension<Principal>,
    Path(name): Path<String>,
    body: axum::body::Bytes,
) -> Result<Json<UserRecord>, ApiError> {
    admin_only(&principal)?;
    let change = read_change(&body)?;
    state
        .executor
        .sharing()
        .set_user(
            &name,
            change.group.as_deref(),
            change.shares,
            &change.limits,
            &change.clear,
        )
        .await
        .map(Json)
        .map_err(sharing_error)
}

/// What the caller (or, for the admin, `user`) and their group hold now and may hold.
#[utoipa::path(get, operation_id = "get_quota", path = "/v1/quota", tag = "sharing", params(QuotaQuery),
    responses(
        (status = 200, description = "Theirs and their group's", body = Quota),
        (status = 403, description = "Another user's quota, asked by someone not the admin", body = ErrorBody),
    ))]
async fn quota(
    State(state): State<ApiState>,
    Extension(principal): Extension<Principal>,
    Params(query): Params<QuotaQuery>,
) -> Result<Json<Quota>, ApiError> {
    let user = query.user.unwrap_or_else(|| principal.user.clone());
    if !principal.may_see(&user) {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "only the admin sees another user's quota",
        ));
    }
    let sharing = state.executor.sharing();
    let owner = sharing.owner(&user);
    let instances = state.instances.list();
    Ok(Json(Quota {
        mine: sharing.holding(Some(&user), &owner.group, &instances),
        ours: sharing.holding(None, &owner.group, &instances),
        user,
        group: owner.group,
    }))
}
