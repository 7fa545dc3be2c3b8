//! Users' API tokens over REST (admin only):
//!
//! - `POST /v1/tokens` `{"user": "ada"}` → `201` with the token's record and, this once,
//!   the token itself (`token`).
//! - `GET /v1/tokens`: every token's record (never a token).
//! - `DELETE /v1/tokens/{id}`: revokes it; it stops working at once.

use axum::extract::{Extension, Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, post};
use axum::{Json, Router};
use serde::{Deserialize, Serialize};

use super::{ApiError, ApiState, Principal, error};
use crate::auth::{TokenError, TokenRecord};

pub(super) fn routes() -> Router<ApiState> {
    Router::new()
        .route("/v1/tokens", post(create).get(list))
        .route("/v1/tokens/{id}", delete(revoke))
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
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateToken {
    user: String,
}

/// A new token: its record and the token, shown once.
#[derive(Debug, Serialize)]
struct NewToken {
    #[serde(flatten)]
    record: TokenRecord,
    token: String,
}

fn token_error(e: &TokenError) -> Response {
    let status = match e {
        TokenError::BadUser(_) | TokenError::Admin => StatusCode::BAD_REQUEST,
        TokenError::NotFound(_) => StatusCode::NOT_FOUND,
        TokenError::Random(_) | TokenError::Store(_) => StatusCode::INTERNAL_SERVER_ERROR,
    };
    error(status, &e.to_string())
}

async fn create(
    State(state): State<ApiState>,
    Extension(principal): Extension<Principal>,
    body: axum::body::Bytes,
) -> Response {
    if let Err(e) = admin_only(&principal) {
        return e.into_response();
    }
    let request: CreateToken = match super::body(&body, r#"a token request: {"user": "NAME"}"#) {
        Ok(request) => request,
        Err(e) => return e.into_response(),
    };
    match state.tokens.create(&request.user).await {
        Ok((record, secret)) => (
            StatusCode::CREATED,
            Json(NewToken {
                record,
                token: secret.expose().to_owned(),
            }),
        )
            .into_response(),
        Err(e) => token_error(&e),
    }
}

async fn list(State(state): State<ApiState>, Extension(principal): Extension<Principal>) -> Response {
    if let Err(e) = admin_only(&principal) {
        return e.into_response();
    }
    match state.tokens.list() {
        Ok(tokens) => Json(tokens).into_response(),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
    }
}

async fn revoke(
    State(state): State<ApiState>,
    Extension(principal): Extension<Principal>,
    Path(id): Path<String>,
) -> Response {
    if let Err(e) = admin_only(&principal) {
        return e.into_response();
    }
    match state.tokens.revoke(&id).await {
        Ok(record) => Json(record).into_response(),
        Err(e) => token_error(&e),
    }
}
