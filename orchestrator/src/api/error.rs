//! The API's one error shape, `{"error": {"code", "message"}}`: [`ApiError`], what the
//! handlers return, and the middleware that puts answers made outside the handlers in
//! the same shape.

use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

/// Error answers made outside the handlers (a malformed query or path, a body over
/// [`MAX_BODY_BYTES`](super::MAX_BODY_BYTES), a method a route does not have) in the API's error shape, so
/// every error a client sees is `{"error": {"code", "message"}}`.
pub(super) async fn json_errors(response: Response) -> Response {
    let status = response.status();
    if !(status.is_client_error() || status.is_server_error()) {
        return response;
    }
    let content_type = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if content_type.starts_with("application/json") {
        return response;
    }
    let (parts, body) = response.into_parts();
    let text = axum::body::to_bytes(body, 64 << 10).await.unwrap_or_default();
    let text = String::from_utf8_lossy(&text);
    let message = match text.trim() {
        "" => match status {
            StatusCode::METHOD_NOT_ALLOWED => "this route does not take that method; see /v1/openapi.json".to_owned(),
            _ => status.canonical_reason().unwrap_or("error").to_lowercase(),
        },
        text => text.to_owned(),
    };
    let mut answer = error(status, &message);
    for (name, value) in &parts.headers {
        if name != header::CONTENT_TYPE && name != header::CONTENT_LENGTH {
            answer.headers_mut().insert(name.clone(), value.clone());
        }
    }
    answer
}

/// Every error answer: `{"error": {"code": "not_found", "message": "…"}}` (the shape
/// OpenAI clients read too).
#[derive(Serialize, utoipa::ToSchema)]
pub(crate) struct ErrorBody<'a> {
    pub(crate) error: ErrorDetail<'a>,
}

/// The code and message of an error answer.
#[derive(Serialize, utoipa::ToSchema)]
pub(crate) struct ErrorDetail<'a> {
    /// A stable machine-readable code.
    pub(crate) code: &'a str,
    /// What is wrong and how to fix it, for people.
    pub(crate) message: &'a str,
}

/// The code of an error answer with `status` when the handler gives none.
pub(crate) fn default_code(status: StatusCode) -> &'static str {
    match status {
        StatusCode::BAD_REQUEST => "bad_request",
        StatusCode::UNAUTHORIZED => "unauthorized",
        StatusCode::FORBIDDEN => "forbidden",
        StatusCode::NOT_FOUND => "not_found",
        StatusCode::METHOD_NOT_ALLOWED => "method_not_allowed",
        StatusCode::CONFLICT => "conflict",
        StatusCode::PAYLOAD_TOO_LARGE => "too_large",
        StatusCode::UNPROCESSABLE_ENTITY => "invalid",
        StatusCode::TOO_MANY_REQUESTS => "overloaded",
        StatusCode::BAD_GATEWAY => "engine_error",
        StatusCode::SERVICE_UNAVAILABLE => "unavailable",
        StatusCode::GATEWAY_TIMEOUT => "engine_timeout",
        _ => "internal",
    }
}

pub(crate) fn error(status: StatusCode, message: &str) -> Response {
    error_with_code(status, default_code(status), message)
}

/// An error answer as a value, for handlers that return `Result<_, ApiError>`.
#[derive(Debug)]
pub(crate) struct ApiError {
    pub(crate) status: StatusCode,
    pub(crate) code: &'static str,
    pub(crate) message: String,
    /// Seconds for `Retry-After`.
    pub(crate) retry_after: Option<u64>,
}

impl ApiError {
    /// An error with the default code of `status`.
    pub(crate) fn new(status: StatusCode, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            code: default_code(status),
            message: message.into(),
            retry_after: None,
        }
    }

    /// The same, with `Retry-After: seconds`.
    pub(crate) fn retry_after(mut self, seconds: u64) -> ApiError {
        self.retry_after = Some(seconds);
        self
    }

    /// A 503 with `Retry-After` for a store that did not acknowledge a write in time or
    /// is overloaded (`store_unavailable`): nothing was acknowledged, retry later.
    pub(crate) fn store_busy(message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::SERVICE_UNAVAILABLE,
            code: "store_unavailable",
            message: message.into(),
            retry_after: Some(STORE_RETRY_AFTER_S),
        }
    }

    /// A 500 for a failure of the server itself.
    pub(crate) fn internal(error: impl std::fmt::Display) -> ApiError {
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, error.to_string())
    }
}

/// Seconds a client is asked to wait when the store is busy.
pub(crate) const STORE_RETRY_AFTER_S: u64 = 5;

impl From<crate::store::StoreError> for ApiError {
    fn from(e: crate::store::StoreError) -> ApiError {
        if e.is_unavailable() {
            ApiError::store_busy(e.to_string())
        } else {
            ApiError::internal(e)
        }
    }
}

impl From<crate::idempotency::KeyError> for ApiError {
    fn from(e: crate::idempotency::KeyError) -> ApiError {
        use crate::idempotency::KeyError;
        match e {
            KeyError::Malformed(_) => ApiError::new(StatusCode::BAD_REQUEST, e.to_string()),
            KeyError::Mismatch { .. } => ApiError::new(StatusCode::CONFLICT, e.to_string()),
            KeyError::InProgress(_) => ApiError {
                status: StatusCode::CONFLICT,
                code: "in_progress",
                message: e.to_string(),
                retry_after: Some(1),
            },
            KeyError::Store(e) => ApiError::from(e),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = error_with_code(self.status, self.code, &self.message);
        if let Some(seconds) = self.retry_after
            && let Ok(value) = header::HeaderValue::from_str(&seconds.to_string())
        {
            response.headers_mut().insert(header::RETRY_AFTER, value);
        }
        response
    }
}

pub(crate) fn error_with_code(status: StatusCode, code: &str, message: &str) -> Response {
    (
        status,
        axum::Json(ErrorBody {
            error: ErrorDetail { code, message },
        }),
    )
        .into_response()
}
