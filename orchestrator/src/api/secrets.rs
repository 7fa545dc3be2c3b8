//! Users' secrets over REST: values go in, never out.
//!
//! - `PUT /v1/secrets/{name}` `{"value": "..."}`: sets (or replaces) the caller's secret.
//! - `GET /v1/secrets`: names and times of the caller's secrets and the shared ones
//!   (the admin: everyone's).
//! - `DELETE /v1/secrets/{name}`: removes the caller's secret.
//! - `PUT` and `DELETE /v1/shared-secrets/{name}` (admin only): the secrets every
//!   workflow may name as `shared/NAME`.

use axum::Json;
use axum::extract::{Extension, Path, State};
use axum::http::StatusCode;
use serde::Deserialize;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::error::{ApiError, ErrorBody};
use super::extract::{Params, body as read_body};
use super::paging::{Listed, PageQuery};
use super::{ApiState, Principal};
use crate::secrets::{Scope, SecretError, SecretInfo};

pub(super) fn routes() -> OpenApiRouter<ApiState> {
    OpenApiRouter::new()
        .routes(routes!(list))
        .routes(routes!(set, remove))
        .routes(routes!(set_shared, remove_shared))
}

/// The body of `PUT /v1/secrets/{name}`.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct SetSecret {
    /// The value (an API key: printable ASCII, at most 16 KiB). It is stored encrypted
    /// and never shown again.
    value: String,
}

impl std::fmt::Debug for SetSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SetSecret(…)")
    }
}

fn secret_error(e: SecretError) -> ApiError {
    match e {
        SecretError::BadName(_) | SecretError::BadValue { .. } => ApiError::new(StatusCode::BAD_REQUEST, e.to_string()),
        SecretError::Missing { .. } => ApiError::new(StatusCode::NOT_FOUND, e.to_string()),
        SecretError::Store(e) => ApiError::from(e),
        SecretError::Undecryptable { .. } | SecretError::Key { .. } => ApiError::internal(e),
    }
}

async fn put(state: &ApiState, scope: Scope, name: &str, body: &[u8]) -> Result<Json<SecretInfo>, ApiError> {
    let request: SetSecret = read_body(body, r#"a secret: {"value": "..."}"#)?;
    state
        .secrets
        .set(&scope, name, &request.value)
        .await
        .map(Json)
        .map_err(secret_error)
}

/// Sets (or replaces) a secret of the caller: the key of an endpoint, named in
/// workflows as `api_key_secret: NAME`. The value is never shown again.
#[utoipa::path(put, operation_id = "set_secret", path = "/v1/secrets/{name}", tag = "secrets", request_body = SetSecret,
    params(("name" = String, Path, description = "The secret's name: letters, digits, `-`, `_`, `.`")),
    responses(
        (status = 200, description = "The secret's name and times (never its value)", body = SecretInfo),
        (status = 400, description = "A bad name or value", body = ErrorBody),
        (status = 503, description = "The store did not acknowledge in time; see Retry-After", body = ErrorBody),
    ))]
async fn set(
    State(state): State<ApiState>,
    Extension(principal): Extension<Principal>,
    Path(name): Path<String>,
    body: axum::body::Bytes,
) -> Result<Json<SecretInfo>, ApiError> {
    put(&state, Scope::User(principal.user), &name, &body).await
}

/// Removes a secret of the caller; workflows that name it fail their calls from now on.
#[utoipa::path(delete, operation_id = "remove_secret", path = "/v1/secrets/{name}", tag = "secrets",
    params(("name" = String, Path, description = "The secret's name")),
    responses(
        (status = 200, description = "What was removed (never its value)", body = SecretInfo),
        (status = 400, description = "A bad name", body = ErrorBody),
        (status = 404, description = "No such secret of the caller", body = ErrorBody),
    ))]
async fn remove(
    State(state): State<ApiState>,
    Extension(principal): Extension<Principal>,
    Path(name): Path<String>,
) -> Result<Json<SecretInfo>, ApiError> {
    state
        .secrets
        .remove(&Scope::User(principal.user), &name)
        .await
        .map(Json)
        .map_err(secret_error)
}

/// 403 unless the principal is the admin.
fn admin_only(principal: &Principal) -> Result<(), ApiError> {
    if principal.admin {
        Ok(())
    } else {
        Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "only the admin publishes shared secrets; store your own with PUT /v1/secrets/{name}",
        ))
    }
}

/// Publishes (or replaces) a shared secret, which every user's workflows may name as
/// `api_key_secret: shared/NAME` (admin only).
#[utoipa::path(put, operation_id = "set_shared_secret", path = "/v1/shared-secrets/{name}", tag = "secrets", request_body = SetSecret,
    params(("name" = String, Path, description = "The secret's name: letters, digits, `-`, `_`, `.`")),
    responses(
        (status = 200, description = "The secret's name and times (never its value)", body = SecretInfo),
        (status = 400, description = "A bad name or value", body = ErrorBody),
        (status = 403, description = "The caller is not the admin", body = ErrorBody),
        (status = 503, description = "The store did not acknowledge in time; see Retry-After", body = ErrorBody),
    ))]
async fn set_shared(
    State(state): State<ApiState>,
    Extension(principal): Extension<Principal>,
    Path(name): Path<String>,
    body: axum::body::Bytes,
) -> Result<Json<SecretInfo>, ApiError> {
    admin_only(&principal)?;
    put(&state, Scope::Shared, &name, &body).await
}

/// Removes a shared secret (admin only).
#[utoipa::path(delete, operation_id = "remove_shared_secret", path = "/v1/shared-secrets/{name}", tag = "secrets",
    params(("name" = String, Path, description = "The secret's name")),
    responses(
        (status = 200, description = "What was removed (never its value)", body = SecretInfo),
        (status = 400, description = "A bad name", body = ErrorBody),
        (status = 403, description = "The caller is not the admin", body = ErrorBody),
        (status = 404, description = "No such shared secret", body = ErrorBody),
    ))]
async fn remove_shared(
    State(state): State<ApiState>,
    Extension(principal): Extension<Principal>,
    Path(name): Path<String>,
) -> Result<Json<SecretInfo>, ApiError> {
    admin_only(&principal)?;
    state
        .secrets
        .remove(&Scope::Shared, &name)
        .await
        .map(Json)
        .map_err(secret_error)
}

/// The secrets the caller may name (theirs and the shared ones; the admin sees
/// everyone's): names and times, never values, a page at a time.
#[utoipa::path(get, operation_id = "list_secrets", path = "/v1/secrets", tag = "secrets", params(PageQuery),
    responses(
        (status = 200, description = "A page of secrets, shared ones first, then by owner and name", body = Listed<SecretInfo, String>),
        (status = 400, description = "A bad query", body = ErrorBody),
    ))]
async fn list(
    State(state): State<ApiState>,
    Extension(principal): Extension<Principal>,
    Params(query): Params<PageQuery>,
) -> Result<Json<Listed<SecretInfo, String>>, ApiError> {
    let limit = query.limit()?;
    let mut rest: Vec<(String, SecretInfo)> = state
        .secrets
        .list(&principal)?
        .into_iter()
        .filter(|(key, _)| query.after.as_deref().is_none_or(|after| key.as_str() > after))
        .take(limit.saturating_add(1))
        .collect();
    let more = rest.len() > limit;
    rest.truncate(limit);
    let next = more.then(|| rest.last().map(|(key, _)| key.clone())).flatten();
    Ok(Json(Listed {
        data: rest.into_iter().map(|(_, info)| info).collect(),
        next,
    }))
}
