//! Users' API tokens over REST (admin only):
//!
//! - `POST /v1/tokens` `{"user": "ada"}` → `201` with the token's record and, this once,
//!   the token itself (`token`).
//! - `GET /v1/tokens`: every token's record (never a token).
//! - `DELETE /v1/tokens/{id}`: revokes it; it stops working at once.

use axum::Json;
use axum::extract::{Extension, Path, State};
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::error::{ApiError, ErrorBody};
use super::extract::{Params, body as read_body, idempotency_key};
use super::paging::{Listed, PageQuery};
use super::{ApiState, Principal};
use crate::auth::{TokenError, TokenRecord};
use crate::idempotency::Idempotent;

pub(super) fn routes() -> OpenApiRouter<ApiState> {
    OpenApiRouter::new()
        .routes(routes!(create, list))
        .routes(routes!(revoke))
}

/// 403 unless the principal is the admin.
pub(crate) fn admin_only(principal: &Principal) -> Result<(), ApiError> {
    if principal.admin {
        Ok(())
    } else {
        Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "only the admin manages tokens; use the admin token (the server's api-token file)",
        ))
    }
}

/// The body of `POST /v1/tokens`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct CreateToken {
    /// The user the token acts for: letters, digits, `-`, `_`, `.`.
    user: String,
}

/// A new token: its record and the token, shown once.
#[derive(Debug, Serialize, utoipa::ToSchema)]
struct NewToken {
    #[serde(flatten)]
    record: TokenRecord,
    /// The token; only its hash is stored, so this is the one time it is shown.
    token: String,
}

fn token_error(e: TokenError) -> ApiError {
    match e {
        TokenError::Key(e) => ApiError::from(e),
        TokenError::Store(e) => ApiError::from(e),
        TokenError::BadUser(_) | TokenError::Admin => ApiError::new(StatusCode::BAD_REQUEST, e.to_string()),
        TokenError::NotFound(_) => ApiError::new(StatusCode::NOT_FOUND, e.to_string()),
        TokenError::AlreadyCreated(_) => ApiError::new(StatusCode::CONFLICT, e.to_string()).code("already_created"),
        TokenError::Random(_) => ApiError::internal(e),
    }
}

/// Makes a token for a user.
#[utoipa::path(post, operation_id = "create_token", path = "/v1/tokens", tag = "tokens", request_body = CreateToken,
    responses(
        (status = 201, description = "The token", body = NewToken),
        (status = 400, description = "A bad user name", body = ErrorBody),
        (status = 403, description = "The caller is not the admin", body = ErrorBody),
        (status = 409, description = "The Idempotency-Key made a token before (its secret is not shown again), or was used with another request", body = ErrorBody),
        (status = 503, description = "The store did not acknowledge in time; see Retry-After", body = ErrorBody),
    ),
    params(("Idempotency-Key" = Option<String>, Header, description = "Makes a retried create refuse rather than make a second token")))]
async fn create(
    State(state): State<ApiState>,
    Extension(principal): Extension<Principal>,
    headers: axum::http::HeaderMap,
    body: axum::body::Bytes,
) -> Result<(StatusCode, Json<NewToken>), ApiError> {
    admin_only(&principal)?;
    let request: CreateToken = read_body(&body, r#"a token request: {"user": "NAME"}"#)?;
    let key = idempotency_key(&headers)?;
    let idempotent = key.as_deref().map(|key| Idempotent { key, request: &body });
    let (record, secret) = state
        .tokens
        .create_keyed(&request.user, &principal.user, idempotent)
        .await
        .map_err(token_error)?;
    Ok((
        StatusCode::CREATED,
        Json(NewToken {
            record,
            token: secret.expose().to_owned(),
        }),
    ))
}

/// Every token's record (never the token itself), by id, a page at a time.
#[utoipa::path(get, operation_id = "list_tokens", path = "/v1/tokens", tag = "tokens", params(PageQuery),
    responses(
        (status = 200, description = "A page of tokens", body = Listed<TokenRecord, String>),
        (status = 400, description = "A bad query", body = ErrorBody),
        (status = 403, description = "The caller is not the admin", body = ErrorBody),
    ))]
async fn list(
    State(state): State<ApiState>,
    Extension(principal): Extension<Principal>,
    Params(query): Params<PageQuery>,
) -> Result<Json<Listed<TokenRecord, String>>, ApiError> {
    admin_only(&principal)?;
    let tokens = state.tokens.list().map_err(ApiError::internal)?;
    query.page_by_id(tokens, |token| token.id.as_str()).map(Json)
}

/// Revokes a token: it is refused from now on.
#[utoipa::path(delete, operation_id = "revoke_token", path = "/v1/tokens/{id}", tag = "tokens",
    params(("id" = String, Path, description = "The token's id (`t-…`)")),
    responses(
        (status = 200, description = "The revoked token's record", body = TokenRecord),
        (status = 400, description = "The server's own admin token cannot be revoked", body = ErrorBody),
        (status = 403, description = "The caller is not the admin", body = ErrorBody),
        (status = 404, description = "No such token", body = ErrorBody),
    ))]
async fn revoke(
    State(state): State<ApiState>,
    Extension(principal): Extension<Principal>,
    Path(id): Path<String>,
) -> Result<Json<TokenRecord>, ApiError> {
    admin_only(&principal)?;
    state.tokens.revoke(&id).await.map(Json).map_err(token_error)
}
