//! What handlers read off a request beyond axum's own extractors: a query string and a
//! JSON body with errors in the API's shape, and the header that marks a replayed
//! answer.

use axum::http::{HeaderMap, StatusCode, header};

use super::error::ApiError;

/// The header that marks an answer replayed for an `Idempotency-Key` seen before.
pub(crate) const IDEMPOTENT_REPLAYED: header::HeaderName = header::HeaderName::from_static("idempotent-replayed");
/// A JSON body, or 400 saying what was expected.
pub(crate) fn body<T: serde::de::DeserializeOwned>(bytes: &[u8], expected: &str) -> Result<T, ApiError> {
    serde_json::from_slice(bytes)
        .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, format!("the body is not {expected} ({e})")))
}
/// A query string, or 400 in the API's error shape saying what is wrong with it.
pub(crate) struct Params<T>(pub T);

impl<T, S> axum::extract::FromRequestParts<S> for Params<T>
where
    T: serde::de::DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut axum::http::request::Parts, state: &S) -> Result<Self, ApiError> {
        match axum::extract::Query::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Query(value)) => Ok(Params(value)),
            Err(rejection) => Err(ApiError::new(StatusCode::BAD_REQUEST, rejection.body_text())),
        }
    }
}

/// The `Idempotency-Key` header, if any.
pub(super) fn idempotency_key(headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    match headers.get("idempotency-key") {
        None => Ok(None),
        Some(value) => value.to_str().map(|v| Some(v.trim().to_owned())).map_err(|_| {
            ApiError::new(
                StatusCode::BAD_REQUEST,
                "the Idempotency-Key header must be printable ASCII",
            )
        }),
    }
}
