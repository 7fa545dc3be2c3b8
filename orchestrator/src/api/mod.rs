//! The REST API over the hardware graph: `GET /v1/nodes`, `GET /v1/graph`,
//! `GET /v1/graph/events` (server-sent events), `POST /v1/plans` (a placement plan of a
//! workflow on the live graph), runs and instances ([`runs`]) and `GET /metrics`
//! (Prometheus text).
//!
//! Every route but `/healthz` needs `Authorization: Bearer <API token>` (`POST
//! /v1/messages` also takes it as `x-api-key`, as Anthropic's clients send it).

use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::middleware;
use axum::response::{IntoResponse, Response};
use tokio::sync::broadcast;
use utoipa::OpenApi;
use utoipa_axum::{router::OpenApiRouter, routes};

pub use crate::auth::Principal;

mod anthropic;
mod approvals;
mod auth;
mod error;
mod evaluate;
mod events;
mod extract;
mod graph;
mod join;
mod live;
mod metrics;
mod openai;
mod openapi;
mod paging;
mod plans;
mod runs;
mod secrets;
mod sessions;
mod sharing;
mod tokens;
mod usage;
mod web;

use crate::graph::{GraphEvent, HardwareGraph};
use crate::plan::Planner;
pub(crate) use error::ApiError;
use error::{ErrorBody, STORE_RETRY_AFTER_S, json_errors};
pub use graph::{GpuSampleRows, GpuSamples, GraphSamples, NodeSamples, NodeSummary, SampleRow};
pub use metrics::{prometheus_text, store_metrics};
pub use openapi::openapi;
pub use plans::PlanRequest;

/// What the routes share.
#[derive(Clone)]
pub struct ApiState {
    /// The graph.
    pub graph: Arc<HardwareGraph>,
    /// Graph changes.
    pub events: broadcast::Sender<GraphEvent>,
    /// Users' API tokens.
    pub tokens: crate::auth::Tokens,
    /// Users' secrets (endpoint keys).
    pub secrets: crate::secrets::Secrets,
    /// The hub client plans read model metadata with.
    pub hub: skein_model_registry::hub::HubClient,
    /// The planner, with what it keeps between plans.
    pub planner: Arc<std::sync::Mutex<Planner>>,
    /// The executor runs are submitted to.
    pub executor: crate::run::Executor,
    /// The model instances.
    pub instances: Arc<crate::instances::Instances>,
    /// Sessions.
    pub sessions: crate::session::Sessions,
    /// What reflexes did.
    pub reflex_events: crate::reflex::Events,
    /// The live reflexes (their dropped decisions, for `/metrics`).
    pub reflexes: crate::reflex::Reflexes,
    /// The database (its writer's health).
    pub db: crate::store::Db,
    /// Join tokens and node identities.
    pub join: crate::join::Join,
    /// The server's task tracker: owns what a request leaves running (a streamed
    /// turn that is stored even if its client goes away), so the server waits for it.
    pub tasks: tokio_util::task::TaskTracker,
}

/// The largest request body (bytes): a turn may carry several messages of up to
/// [`crate::session::record::MAX_MESSAGE_BYTES`] each.
pub const MAX_BODY_BYTES: usize = 16 << 20;

/// The router.
pub fn router(state: ApiState) -> Router {
    let (public, _) = public_routes().split_for_parts();
    let (protected, _) = protected_routes().split_for_parts();
    Router::new()
        .merge(public)
        .merge(protected.route_layer(middleware::from_fn_with_state(state.clone(), auth::authorize)))
        .route("/", axum::routing::get(web::index))
        .route("/web/{*path}", axum::routing::get(web::file))
        .route("/favicon.ico", axum::routing::get(web::favicon))
        .fallback(|| async { ApiError::new(StatusCode::NOT_FOUND, "no such route; see /v1/openapi.json") })
        .layer(middleware::map_response(json_errors))
        .layer(axum::extract::DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(state)
}

/// The routes anyone may call.
pub(crate) fn public_routes() -> OpenApiRouter<ApiState> {
    OpenApiRouter::new()
        .routes(routes!(healthz))
        .routes(routes!(openapi_json))
}

/// The routes behind the API token.
pub(crate) fn protected_routes() -> OpenApiRouter<ApiState> {
    OpenApiRouter::with_openapi(openapi::ApiDoc::openapi())
        .merge(graph::routes())
        .merge(plans::routes())
        .merge(live::routes())
        .merge(runs::routes())
        .merge(approvals::routes())
        .merge(tokens::routes())
        .merge(sharing::routes())
        .merge(usage::routes())
        .merge(secrets::routes())
        .merge(join::routes())
        .merge(sessions::routes())
        .merge(openai::routes())
        .merge(anthropic::routes())
        .merge(events::routes())
        .merge(metrics::routes())
}

/// Liveness and the store: `ok`, or 503 while the store's writer has been stuck in one
/// flush for over 5 s (writes are answered 503 meanwhile).
#[utoipa::path(get, operation_id = "healthz", path = "/healthz", tag = "server",
    responses(
        (status = 200, description = "The server is up and its store acknowledges writes", body = String, content_type = "text/plain"),
        (status = 503, description = "The store's writer is stalled; see Retry-After", body = ErrorBody),
    ))]
async fn healthz(State(state): State<ApiState>) -> Result<&'static str, ApiError> {
    let health = state.db.health();
    if health.stalled {
        let message = format!(
            "unhealthy: the store's writer has been busy for {} ms ({} writes waiting)",
            health.busy_ms, health.queued
        );
        Err(ApiError::new(StatusCode::SERVICE_UNAVAILABLE, message).retry_after(STORE_RETRY_AFTER_S))
    } else {
        Ok("ok\n")
    }
}

/// This document.
#[utoipa::path(get, operation_id = "openapi", path = "/v1/openapi.json", tag = "server",
    responses((status = 200, description = "The OpenAPI 3.1 document of this API", body = Object)))]
async fn openapi_json() -> Response {
    static DOCUMENT: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    let text = DOCUMENT.get_or_init(|| openapi().to_pretty_json().unwrap_or_default());
    ([(header::CONTENT_TYPE, "application/json")], text.as_str()).into_response()
}
