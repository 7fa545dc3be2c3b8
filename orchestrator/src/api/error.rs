//! The API's one error shape, `{"error": {"code", "message"}}` (with `"diagnostics"`
//! beside it for a refused workflow): [`ApiError`], what the handlers return, and the
//! middleware that puts answers made outside the handlers in the same shape.

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
    let mut answer = ApiError::new(status, message).into_response();
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

/// A workflow the checker refused: the error, and every diagnostic with its place.
#[derive(Serialize, utoipa::ToSchema)]
pub(crate) struct InvalidWorkflow<'a> {
    error: ErrorDetail<'a>,
    /// What is wrong, where (file, line, column) and how to fix it.
    #[schema(value_type = Vec<Object>)]
    diagnostics: Vec<skein_dsl::diag::JsonDiagnostic>,
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

/// An error answer as a value: what every handler returns as its error. Its answer is
/// `{"error": {"code", "message"}}`, with `Retry-After` when it says so, and the
/// diagnostics beside the error when a workflow was refused ([`InvalidWorkflow`]).
#[derive(Debug)]
pub(crate) struct ApiError {
    pub(crate) status: StatusCode,
    pub(crate) code: &'static str,
    pub(crate) message: String,
    /// Seconds for `Retry-After`.
    pub(crate) retry_after: Option<u64>,
    /// What is wrong with a refused workflow, where, and how to fix it (private: an
    /// `ApiError` is made by its constructors).
    diagnostics: Option<Vec<skein_dsl::diag::JsonDiagnostic>>,
}

impl ApiError {
    /// An error with the default code of `status`.
    pub(crate) fn new(status: StatusCode, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            code: default_code(status),
            message: message.into(),
            retry_after: None,
            diagnostics: None,
        }
    }

    /// The same, with `code` in place of the default code of its status.
    pub(crate) fn code(mut self, code: &'static str) -> ApiError {
        self.code = code;
        self
    }

    /// The same, with `Retry-After: seconds`.
    pub(crate) fn retry_after(mut self, seconds: u64) -> ApiError {
        self.retry_after = Some(seconds);
        self
    }

    /// A 422 `invalid_workflow` for a workflow the checker refused, with its
    /// diagnostics ([`InvalidWorkflow`]).
    pub(crate) fn invalid_workflow(diagnostics: Vec<skein_dsl::diag::JsonDiagnostic>) -> ApiError {
        let mut error =
            ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "the workflow is invalid").code("invalid_workflow");
        error.diagnostics = Some(diagnostics);
        error
    }

    /// A 503 with `Retry-After` for a store that did not acknowledge a write in time or
    /// is overloaded (`store_unavailable`): nothing was acknowledged, retry later.
    pub(crate) fn store_busy(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::SERVICE_UNAVAILABLE, message)
            .code("store_unavailable")
            .retry_after(STORE_RETRY_AFTER_S)
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

impl From<crate::sharing::quota::Refusal> for ApiError {
    /// 429 `quota_exceeded`: the message names the limit, whose it is, the use and when
    /// it frees; `Retry-After` when that is known.
    fn from(refusal: crate::sharing::quota::Refusal) -> ApiError {
        let error = ApiError::new(StatusCode::TOO_MANY_REQUESTS, refusal.to_string()).code("quota_exceeded");
        match refusal.retry_after {
            Some(after) => error.retry_after(after.as_secs().max(1)),
            None => error,
        }
    }
}

impl From<crate::idempotency::KeyError> for ApiError {
    fn from(e: crate::idempotency::KeyError) -> ApiError {
        use crate::idempotency::KeyError;
        match e {
            KeyError::Malformed(_) => ApiError::new(StatusCode::BAD_REQUEST, e.to_string()),
            KeyError::Mismatch { .. } => ApiError::new(StatusCode::CONFLICT, e.to_string()),
            KeyError::InProgress(_) => ApiError::new(StatusCode::CONFLICT, e.to_string())
                .code("in_progress")
                .retry_after(1),
            KeyError::Store(e) => ApiError::from(e),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let error = ErrorDetail {
            code: self.code,
            message: &self.message,
        };
        let mut response = match self.diagnostics {
            Some(diagnostics) => (self.status, axum::Json(InvalidWorkflow { error, diagnostics })).into_response(),
            None => (self.status, axum::Json(ErrorBody { error })).into_response(),
        };
        if let Some(seconds) = self.retry_after
            && let Ok(value) = header::HeaderValue::from_str(&seconds.to_string())
        {
            response.headers_mut().insert(header::RETRY_AFTER, value);
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn answer(error: ApiError) -> (StatusCode, Option<String>, String) {
        let response = error.into_response();
        let status = response.status();
        let retry_after = response
            .headers()
            .get(header::RETRY_AFTER)
            .map(|v| v.to_str().unwrap_or("").to_owned());
        let body = axum::body::to_bytes(response.into_body(), 1 << 20)
            .await
            .unwrap_or_default();
        (status, retry_after, String::from_utf8_lossy(&body).into_owned())
    }

    #[tokio::test]
    async fn an_error_answers_its_code_message_and_retry_after() {
        let (status, retry_after, body) =
            answer(ApiError::new(StatusCode::TOO_MANY_REQUESTS, "the queue is full").retry_after(7)).await;
        assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(retry_after.as_deref(), Some("7"));
        assert_eq!(body, r#"{"error":{"code":"overloaded","message":"the queue is full"}}"#);

        let (status, retry_after, body) = answer(ApiError::store_busy("stalled")).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(retry_after.as_deref(), Some("5"));
        assert_eq!(body, r#"{"error":{"code":"store_unavailable","message":"stalled"}}"#);
    }

    #[tokio::test]
    async fn a_refused_workflow_answers_its_diagnostics_beside_the_error() {
        let parsed = skein_dsl::parse("w.yaml", "name: w\nsteps: nope\n");
        assert!(parsed.diagnostics.has_errors());
        let diagnostics = skein_dsl::diag::to_json(&parsed.diagnostics, &parsed.file);
        let expected = format!(
            r#"{{"error":{{"code":"invalid_workflow","message":"the workflow is invalid"}},"diagnostics":{}}}"#,
            serde_json::to_string(&diagnostics).unwrap_or_default()
        );
        let (status, retry_after, body) = answer(ApiError::invalid_workflow(diagnostics)).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
        assert_eq!(retry_after, None);
        assert_eq!(body, expected);
    }
}
