//! Who calls: the bearer token of every protected route, found in the token store and
//! handed to the route as a
//! [`Principal`](crate::auth::Principal).

use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::Response;

use super::ApiState;
use super::error::ApiError;

/// The token of an `Authorization` value in the `Bearer` scheme, whose name is matched
/// case-insensitively (RFC 9110 §11.1); one or more spaces follow it.
fn bearer_token(value: &str) -> Option<&str> {
    let (scheme, token) = value.trim_start().split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim())
        .filter(|t| !t.is_empty())
}

/// The route that also takes the token as `x-api-key` (Anthropic's clients send their
/// key there).
const API_KEY_ROUTE: &str = "/v1/messages";

/// Finds who presents the request's bearer token (on [`API_KEY_ROUTE`], or its
/// `x-api-key`) and hands them to the route as an extension ([`Principal`]); 401
/// without a live token.
pub(super) async fn authorize(
    State(state): State<ApiState>,
    mut request: Request,
    next: Next,
) -> Result<Response, ApiError> {
    let presented = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(bearer_token)
        .or_else(|| {
            (request.uri().path() == API_KEY_ROUTE)
                .then(|| request.headers().get("x-api-key"))
                .flatten()
                .and_then(|v| v.to_str().ok())
                .map(str::trim)
                .filter(|t| !t.is_empty())
        });
    let Some(token) = presented else {
        return Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "missing `Authorization: Bearer <API token>`; the admin token is in the server's data directory (api-token), `skein token create --user NAME` makes others",
        ));
    };
    // The token store is read on a blocking-safe path: one sled read, in memory.
    match state.tokens.authenticate(token.trim()) {
        Some(principal) => {
            request.extensions_mut().insert(principal);
            Ok(next.run(request).await)
        }
        None => Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "the API token is wrong or was revoked; ask an admin for one (`skein token create --user NAME`)",
        )),
    }
}
