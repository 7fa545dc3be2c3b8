//! `POST /v1/embeddings`: OpenAI's embeddings, from an agent of the caller's runs or a
//! Hugging Face model named alone (an instance is placed for it, its engine started in
//! pooling mode), counted in the caller's usage like a completion's prompt.

use axum::Json;
use axum::extract::{Extension, State};
use axum::http::HeaderMap;
use serde_json::json;
use skein_proto::openai::{EmbeddingList, EmbeddingRequest};

use super::super::error::{ApiError, ErrorBody};
use super::super::extract::body;
use super::super::sessions::chat_body;
use super::super::{ApiState, Principal};
use super::bad;
use crate::session::Flight;

/// The most inputs one request may carry (OpenAI's own limit).
pub(super) const MAX_INPUTS: usize = 2048;

/// OpenAI's embeddings: `model` is an agent of the caller's newest run that has it, or
/// a hub model placed on demand; one vector per input, in order.
#[utoipa::path(post, operation_id = "create_embeddings", path = "/v1/embeddings", tag = "openai", request_body = EmbeddingRequest,
    responses(
        (status = 200, description = "One vector per input, in the inputs' order", body = EmbeddingList),
        (status = 400, description = "A bad request: no input, an empty one or more than 2048; a bad model name; a model that generates text and serves no embeddings; or the engine refused it (the message says which)", body = ErrorBody),
        (status = 404, description = "`model` is neither an agent of the caller's runs nor a Hugging Face model (owner/name)", body = ErrorBody),
        (status = 413, description = "More text than one request may carry (the message says the limit and the size)", body = ErrorBody),
        (status = 429, description = "The caller has as many requests in flight as one user may, or they or their group used their tokens of the minute (`quota_exceeded`); see Retry-After", body = ErrorBody,
            headers(("Retry-After" = u64, description = "Seconds to wait"))),
        (status = 502, description = "The engine failed", body = ErrorBody),
        (status = 503, description = "No instance can serve the model now; see Retry-After", body = ErrorBody,
            headers(("Retry-After" = u64, description = "Seconds to wait"))),
    ))]
pub(super) async fn embeddings(
    State(state): State<ApiState>,
    Extension(principal): Extension<Principal>,
    headers: HeaderMap,
    raw: axum::body::Body,
) -> Result<Json<EmbeddingList>, ApiError> {
    // Counted before the body is read, like a chat request; measured before it is
    // parsed.
    let _permit = state.sessions.admit(&principal, Flight::Request)?;
    let bytes = chat_body(&state.sessions, &headers, raw).await?;
    let request: EmbeddingRequest = body(&bytes, "an OpenAI embedding request")?;
    let inputs = request.input.count();
    if inputs == 0 {
        return Err(bad("input", "is empty; give a text or a list of texts"));
    }
    if inputs > MAX_INPUTS {
        return Err(bad(
            "input",
            &format!("has {inputs} inputs; at most {MAX_INPUTS} are taken: send them in several requests"),
        ));
    }
    if let Some(index) = request.input.first_empty() {
        return Err(bad(&format!("input[{index}]"), "is empty; every input needs a token"));
    }
    if request.dimensions == Some(0) {
        return Err(bad("dimensions", "is 0; give at least 1, or leave it out"));
    }
    let target = state.sessions.resolve(&principal, &request.model)?;
    let mut engine_body = json!({ "input": request.input });
    if let Some(format) = request.encoding_format {
        engine_body["encoding_format"] = json!(format);
    }
    if let Some(dimensions) = request.dimensions {
        engine_body["dimensions"] = json!(dimensions);
    }
    let mut list = state.sessions.embed(&principal, &target, engine_body, inputs).await?;
    list.model = request.model;
    Ok(Json(list))
}
