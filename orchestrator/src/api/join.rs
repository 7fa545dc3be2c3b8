//! Who may join, over REST (admin only):
//!
//! - `POST /v1/join-tokens` `{"expires_in_s": 86400, "node": "rtx-1"}` → `201` with the
//!   join token's record and, this once, the token itself (`token`).
//! - `GET /v1/join-tokens`: every join token's record (never a token).
//! - `DELETE /v1/join-tokens/{id}`: revokes it; nodes that joined with it stay.
//! - `DELETE /v1/nodes/{name}`: forgets a node and its identity (the name is free).
//! - `POST /v1/nodes/{name}/reset`: forgets only its identity (the node stays).

use axum::Json;
use axum::extract::{Extension, Path, State};
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::error::{ApiError, ErrorBody};
use super::extract::{Params, body as read_body};
use super::paging::{Listed, PageQuery};
use super::tokens::admin_only;
use super::{ApiState, Principal};
use crate::join::{JoinError, JoinTokenRecord, JoinTokenSpec};

pub(super) fn routes() -> OpenApiRouter<ApiState> {
    OpenApiRouter::new()
        .routes(routes!(create, list))
        .routes(routes!(revoke))
        .routes(routes!(remove_node))
        .routes(routes!(reset_node))
}

/// The body of `POST /v1/join-tokens`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct CreateJoinToken {
    /// Seconds it is accepted for (1 to ten years); absent: until revoked.
    #[serde(default)]
    #[schema(minimum = 1, maximum = 315_360_000)]
    expires_in_s: Option<u64>,
    /// The one node name it may claim.
    #[serde(default)]
    node: Option<String>,
    /// The prefix of every name it may claim.
    #[serde(default)]
    name_prefix: Option<String>,
}

/// A new join token: its record and the token, shown once.
#[derive(Debug, Serialize, utoipa::ToSchema)]
struct NewJoinToken {
    #[serde(flatten)]
    record: JoinTokenRecord,
    /// The token; only its hash is stored, so this is the one time it is shown.
    token: String,
}

/// What an admin's removal or reset of a node did.
#[derive(Debug, Serialize, utoipa::ToSchema)]
struct NodeForgotten {
    /// The node name, free to be claimed again.
    name: String,
    /// The id the node had in the graph, if it was there (removed nodes only).
    #[serde(skip_serializing_if = "Option::is_none")]
    node_id: Option<String>,
    /// Whether the name had an identity (a node credential) that is now forgotten.
    identity_forgotten: bool,
}

fn join_error(e: JoinError) -> ApiError {
    match e {
        JoinError::Store(e) => ApiError::from(e),
        JoinError::NotFound(_) => ApiError::new(StatusCode::NOT_FOUND, e.to_string()),
        JoinError::Random(_) => ApiError::internal(e),
        _ => ApiError::new(StatusCode::BAD_REQUEST, e.to_string()),
    }
}

/// Makes a join token, optionally expiring and limited to a node name or name prefix.
#[utoipa::path(post, operation_id = "create_join_token", path = "/v1/join-tokens", tag = "join", request_body = CreateJoinToken,
    responses(
        (status = 201, description = "The join token", body = NewJoinToken),
        (status = 400, description = "A bad request (a node and a prefix, a zero expiry, a name with spaces)", body = ErrorBody),
        (status = 403, description = "The caller is not the admin", body = ErrorBody),
        (status = 503, description = "The store did not acknowledge in time; see Retry-After", body = ErrorBody),
    ))]
async fn create(
    State(state): State<ApiState>,
    Extension(principal): Extension<Principal>,
    body: axum::body::Bytes,
) -> Result<(StatusCode, Json<NewJoinToken>), ApiError> {
    admin_only(&principal)?;
    const EXPECTED: &str = r#"a join token request: {"expires_in_s": SECONDS, "node": "NAME"} (every field optional)"#;
    // serde would take a struct from an array too (`[null, null]`): only an object is one.
    if body.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            format!("the body is not {EXPECTED}"),
        ));
    }
    let request: CreateJoinToken = read_body(&body, EXPECTED)?;
    let spec = JoinTokenSpec {
        expires_in: request.expires_in_s.map(std::time::Duration::from_secs),
        node: request.node,
        name_prefix: request.name_prefix,
    };
    let (record, secret) = state
        .join
        .create_token(&principal.user, spec)
        .await
        .map_err(join_error)?;
    Ok((
        StatusCode::CREATED,
        Json(NewJoinToken {
            record,
            token: secret.expose().to_owned(),
        }),
    ))
}

/// Every join token's record (never the token itself; not the server's bootstrap token), by id, a page at a time.
#[utoipa::path(get, operation_id = "list_join_tokens", path = "/v1/join-tokens", tag = "join", params(PageQuery),
    responses(
        (status = 200, description = "A page of join tokens", body = Listed<JoinTokenRecord, String>),
        (status = 400, description = "A bad query", body = ErrorBody),
        (status = 403, description = "The caller is not the admin", body = ErrorBody),
    ))]
async fn list(
    State(state): State<ApiState>,
    Extension(principal): Extension<Principal>,
    Params(query): Params<PageQuery>,
) -> Result<Json<Listed<JoinTokenRecord, String>>, ApiError> {
    admin_only(&principal)?;
    let tokens = state.join.tokens().map_err(ApiError::internal)?;
    query.page_by_id(tokens, |token| token.id.as_str()).map(Json)
}

/// Revokes a join token: it claims no node name from now on (nodes that joined with it keep their identity).
#[utoipa::path(delete, operation_id = "revoke_join_token", path = "/v1/join-tokens/{id}", tag = "join",
    params(("id" = String, Path, description = "The join token's id (`j-…`)")),
    responses(
        (status = 200, description = "The revoked join token's record", body = JoinTokenRecord),
        (status = 400, description = "The bootstrap token is the server's own and cannot be revoked", body = ErrorBody),
        (status = 403, description = "The caller is not the admin", body = ErrorBody),
        (status = 404, description = "No such join token", body = ErrorBody),
    ))]
async fn revoke(
    State(state): State<ApiState>,
    Extension(principal): Extension<Principal>,
    Path(id): Path<String>,
) -> Result<Json<JoinTokenRecord>, ApiError> {
    admin_only(&principal)?;
    state.join.revoke_token(&id).await.map(Json).map_err(join_error)
}

/// Removes a node: it leaves the graph (its instances are placed again) and its identity is forgotten, so the name is free.
#[utoipa::path(delete, operation_id = "remove_node", path = "/v1/nodes/{name}", tag = "join",
    params(("name" = String, Path, description = "The node's name")),
    responses(
        (status = 200, description = "What was forgotten", body = NodeForgotten),
        (status = 403, description = "The caller is not the admin", body = ErrorBody),
        (status = 404, description = "No node and no identity by that name", body = ErrorBody),
        (status = 503, description = "The store did not acknowledge in time; see Retry-After", body = ErrorBody),
    ))]
async fn remove_node(
    State(state): State<ApiState>,
    Extension(principal): Extension<Principal>,
    Path(name): Path<String>,
) -> Result<Json<NodeForgotten>, ApiError> {
    admin_only(&principal)?;
    let identity_forgotten = state.join.forget(&name).await?;
    let node_id = state.graph.remove(&name);
    if let Some(id) = &node_id {
        tracing::info!(node = %id, %name, user = %principal.user, "an admin removed a node");
        state.instances.node_lost(id, "was removed by an admin");
    }
    if node_id.is_none() && !identity_forgotten {
        return Err(no_node(&name));
    }
    Ok(Json(NodeForgotten {
        name,
        node_id: node_id.map(|id| id.0),
        identity_forgotten,
    }))
}

/// Forgets a node's identity only: the next agent to register the name with a valid join token claims it; the node stays in the graph.
#[utoipa::path(post, operation_id = "reset_node", path = "/v1/nodes/{name}/reset", tag = "join",
    params(("name" = String, Path, description = "The node's name")),
    responses(
        (status = 200, description = "What was forgotten", body = NodeForgotten),
        (status = 403, description = "The caller is not the admin", body = ErrorBody),
        (status = 404, description = "No node and no identity by that name", body = ErrorBody),
        (status = 503, description = "The store did not acknowledge in time; see Retry-After", body = ErrorBody),
    ))]
async fn reset_node(
    State(state): State<ApiState>,
    Extension(principal): Extension<Principal>,
    Path(name): Path<String>,
) -> Result<Json<NodeForgotten>, ApiError> {
    admin_only(&principal)?;
    let identity_forgotten = state.join.forget(&name).await?;
    if identity_forgotten {
        tracing::info!(%name, user = %principal.user, "an admin reset a node's identity");
    } else if state.graph.id_of(&name).is_none() {
        return Err(no_node(&name));
    }
    Ok(Json(NodeForgotten {
        name,
        node_id: None,
        identity_forgotten,
    }))
}

fn no_node(name: &str) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        format!(
            "no node `{}` and no identity by that name; `skein nodes` lists the nodes",
            name.chars().take(253).collect::<String>()
        ),
    )
}
