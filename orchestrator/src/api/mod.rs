//! The REST API over the hardware graph: `GET /v1/nodes`, `GET /v1/graph`,
//! `GET /v1/graph/events` (server-sent events), `POST /v1/plans` (a placement plan of a
//! workflow on the live graph), runs and instances ([`runs`]) and `GET /metrics`
//! (Prometheus text).
//!
//! Every route but `/healthz` needs `Authorization: Bearer <API token>`.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::fmt::Write as _;
use std::sync::Arc;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use skein_dsl::SourceKind;
use skein_model_registry::hub::InspectOptions;

use utoipa::OpenApi;
use utoipa_axum::{router::OpenApiRouter, routes};

use crate::plan::{PlanInput, PlanSettings, Planner};
use futures::Stream;
use serde::Serialize;
use tokio::sync::broadcast;

pub use crate::auth::Principal;

mod evaluate;
mod events;
mod join;
mod live;
mod openai;
mod runs;
mod secrets;
mod sessions;
mod tokens;
mod web;
use crate::graph::{GraphEvent, GraphSnapshot, HardwareGraph, HealthState, NodeView};

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
    /// The database (its writer's health).
    pub db: crate::store::Db,
    /// Join tokens and node identities.
    pub join: crate::join::Join,
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
        .merge(protected.route_layer(middleware::from_fn_with_state(state.clone(), authorize)))
        .route("/", axum::routing::get(web::index))
        .route("/web/{*path}", axum::routing::get(web::file))
        .route("/favicon.ico", axum::routing::get(web::favicon))
        .fallback(|| async { error(StatusCode::NOT_FOUND, "no such route; see /v1/openapi.json") })
        .layer(middleware::map_response(json_errors))
        .layer(axum::extract::DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(state)
}

/// The routes anyone may call.
fn public_routes() -> OpenApiRouter<ApiState> {
    OpenApiRouter::new()
        .routes(routes!(healthz))
        .routes(routes!(openapi_json))
}

/// The routes behind the API token.
fn protected_routes() -> OpenApiRouter<ApiState> {
    OpenApiRouter::with_openapi(ApiDoc::openapi())
        .routes(routes!(nodes))
        .routes(routes!(graph))
        .routes(routes!(events))
        .routes(routes!(gpu_samples))
        .routes(routes!(graph_samples))
        .routes(routes!(plans))
        .merge(live::routes())
        .merge(runs::routes())
        .merge(tokens::routes())
        .merge(secrets::routes())
        .merge(join::routes())
        .merge(sessions::routes())
        .merge(openai::routes())
        .merge(events::routes())
        .routes(routes!(metrics))
}

/// The API's OpenAPI 3.1 document, made from the routes' code: every route, its
/// parameters, bodies and answers.
pub fn openapi() -> utoipa::openapi::OpenApi {
    let mut document = protected_routes().into_openapi();
    let public = public_routes().into_openapi();
    let public_paths: Vec<String> = public.paths.paths.keys().cloned().collect();
    document.merge(public);
    nullable_cursors(&mut document);
    for (path, item) in document.paths.paths.iter_mut() {
        let public = public_paths.contains(path);
        for operation in operations(item) {
            if public {
                operation.security = Some(vec![utoipa::openapi::security::SecurityRequirement::default()]);
            } else {
                add_error(
                    operation,
                    StatusCode::UNAUTHORIZED,
                    "No token, or a wrong or revoked one.",
                );
            }
            add_error(
                operation,
                StatusCode::INTERNAL_SERVER_ERROR,
                "The server failed (its store).",
            );
        }
    }
    document
}

/// Marks the `next` of every page schema as nullable: the derive drops the null of an
/// `Option` of a generic parameter, and the last page says `"next": null`.
fn nullable_cursors(document: &mut utoipa::openapi::OpenApi) {
    use utoipa::openapi::RefOr;
    use utoipa::openapi::schema::{Object, OneOfBuilder, Schema, Type};
    let Some(components) = document.components.as_mut() else {
        return;
    };
    for (name, schema) in components.schemas.iter_mut() {
        if !name.starts_with("Listed_") {
            continue;
        }
        if let RefOr::T(Schema::Object(page)) = schema
            && let Some(next) = page.properties.get_mut("next")
        {
            let cursor = std::mem::replace(next, RefOr::T(Schema::Object(Object::default())));
            *next = OneOfBuilder::new()
                .item(cursor)
                .item(Object::with_type(Type::Null))
                .description(Some("The cursor of the next page; null on the last"))
                .into();
        }
    }
}

/// The operations of a path.
fn operations(item: &mut utoipa::openapi::PathItem) -> impl Iterator<Item = &mut utoipa::openapi::path::Operation> {
    [
        item.get.as_mut(),
        item.post.as_mut(),
        item.put.as_mut(),
        item.patch.as_mut(),
        item.delete.as_mut(),
    ]
    .into_iter()
    .flatten()
}

/// Documents an error answer of `operation` unless its route already does.
fn add_error(operation: &mut utoipa::openapi::path::Operation, status: StatusCode, description: &str) {
    use utoipa::openapi::{ContentBuilder, Ref, ResponseBuilder};
    operation
        .responses
        .responses
        .entry(status.as_str().to_owned())
        .or_insert_with(|| {
            ResponseBuilder::new()
                .description(description)
                .content(
                    "application/json",
                    ContentBuilder::new()
                        .schema(Some(Ref::from_schema_name("ErrorBody")))
                        .build(),
                )
                .into()
        });
}

/// The document's frame: title, security scheme, tags.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "Skein API",
        description = "The orchestrator's REST API: the hardware graph, plans, runs, instances, sessions, users' tokens, and OpenAI-compatible chat completions. Every route but /healthz and /v1/openapi.json needs `Authorization: Bearer <API token>`. Errors answer `{\"error\": {\"code\", \"message\"}}`; lists answer `{\"data\": [...], \"next\": cursor | null}`; times are RFC 3339."
    ),
    modifiers(&BearerScheme),
    security(("bearer" = [])),
    components(schemas(ErrorBody, ErrorDetail)),
    tags(
        (name = "graph", description = "Nodes, GPUs and their telemetry"),
        (name = "plans", description = "Placement plans of workflows on the live graph"),
        (name = "runs", description = "Submitted workflows and the model instances serving them"),
        (name = "sessions", description = "Durable conversations with an agent (docs/sessions.md)"),
        (name = "openai", description = "OpenAI-compatible routes for existing clients"),
        (name = "tokens", description = "Users' API tokens (admin only)"),
        (name = "secrets", description = "Users' secrets, the keys of their endpoint agents (never shown again)"),
        (name = "join", description = "Join tokens and node identities: who may join the fleet as which node (admin only)"),
        (name = "reflexes", description = "What the workflows' reflexes did (docs/reflexes.md)"),
        (name = "server", description = "Health, metrics and this document"),
    )
)]
struct ApiDoc;

/// The bearer-token security scheme.
struct BearerScheme;

impl utoipa::Modify for BearerScheme {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some(
                        "An API token: the server's api-token file (admin), or one from `skein token create`",
                    ))
                    .build(),
            ),
        );
    }
}

/// Liveness and the store: `ok`, or 503 while the store's writer has been stuck in one
/// flush for over 5 s (writes are answered 503 meanwhile).
#[utoipa::path(get, operation_id = "healthz", path = "/healthz", tag = "server",
    responses(
        (status = 200, description = "The server is up and its store acknowledges writes", body = String, content_type = "text/plain"),
        (status = 503, description = "The store's writer is stalled", body = String, content_type = "text/plain"),
    ))]
async fn healthz(State(state): State<ApiState>) -> Response {
    let health = state.db.health();
    if health.stalled {
        let text = format!(
            "unhealthy: the store's writer has been busy for {} ms ({} writes waiting)\n",
            health.busy_ms, health.queued
        );
        let mut response = (StatusCode::SERVICE_UNAVAILABLE, text).into_response();
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, header::HeaderValue::from(STORE_RETRY_AFTER_S));
        response
    } else {
        "ok\n".into_response()
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

/// Error answers made outside the handlers (a malformed query or path, a body over
/// [`MAX_BODY_BYTES`], a method a route does not have) in the API's error shape, so
/// every error a client sees is `{"error": {"code", "message"}}`.
async fn json_errors(response: Response) -> Response {
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
fn default_code(status: StatusCode) -> &'static str {
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

/// The header that marks an answer replayed for an `Idempotency-Key` seen before.
pub(crate) const IDEMPOTENT_REPLAYED: header::HeaderName = header::HeaderName::from_static("idempotent-replayed");

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

/// A JSON body, or 400 saying what was expected.
pub(crate) fn body<T: serde::de::DeserializeOwned>(bytes: &[u8], expected: &str) -> Result<T, ApiError> {
    serde_json::from_slice(bytes)
        .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, format!("the body is not {expected} ({e})")))
}

/// A page of a list: `{"data": [...], "next": cursor | null}`; `next` is the cursor
/// of the following page (`after=` for runs and sessions, `from=` for messages), null
/// on the last.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(crate) struct Listed<T, C> {
    /// The items.
    pub data: Vec<T>,
    /// The cursor of the next page.
    pub next: Option<C>,
}

impl<T> Listed<T, String> {
    /// A page: the first `limit` of `rest` (the items past the cursor, in list order),
    /// with `next` (the last item's `cursor`) when more remain.
    pub(crate) fn cut(mut rest: impl Iterator<Item = T>, limit: usize, cursor: impl Fn(&T) -> String) -> Self {
        let data: Vec<T> = rest.by_ref().take(limit).collect();
        let next = rest.next().and(data.last().map(cursor));
        Listed { data, next }
    }
}

/// `?limit=&after=` of a list by id.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct PageQuery {
    /// Items per page: 1 to 1000, default 100.
    #[serde(default)]
    #[param(minimum = 1, maximum = 1000)]
    pub limit: Option<usize>,
    /// The `next` of the previous page.
    #[serde(default)]
    pub after: Option<String>,
}

impl PageQuery {
    /// The page size asked for (default 100), or 400 outside 1 to 1000.
    pub(crate) fn limit(&self) -> Result<usize, ApiError> {
        page_size(self.limit)
    }
}

/// A page size (default 100), or 400 outside 1 to [`MAX_PAGE`](crate::session::service::MAX_PAGE).
pub(crate) fn page_size(limit: Option<usize>) -> Result<usize, ApiError> {
    let max = crate::session::service::MAX_PAGE;
    match limit {
        None => Ok(100),
        Some(limit) if (1..=max).contains(&limit) => Ok(limit),
        Some(limit) => Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            format!("`limit` is {limit}; ask for 1 to {max} items a page, and follow `next` for more"),
        )),
    }
}

/// One server-sent event as a client reads it: its name and its data line. Documents
/// the streams (which axum's `Sse` writes); the data of each route's events is
/// described with the route.
#[derive(utoipa::ToSchema)]
#[allow(dead_code)]
pub(crate) struct ServerSentEvent {
    /// The event's name (`message` when the stream gives none).
    event: String,
    /// Its data: JSON text, or `[DONE]` at the end of a chat completion stream.
    data: String,
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

/// The token of an `Authorization` value in the `Bearer` scheme, whose name is matched
/// case-insensitively (RFC 9110 §11.1); one or more spaces follow it.
fn bearer_token(value: &str) -> Option<&str> {
    let (scheme, token) = value.trim_start().split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim())
        .filter(|t| !t.is_empty())
}

/// Finds who presents the request's bearer token and hands them to the route as an
/// extension ([`Principal`]); 401 without a live token.
async fn authorize(State(state): State<ApiState>, mut request: Request, next: Next) -> Response {
    let presented = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(bearer_token);
    let Some(token) = presented else {
        return error(
            StatusCode::UNAUTHORIZED,
            "missing `Authorization: Bearer <API token>`; the admin token is in the server's data directory (api-token), `skein token create --user NAME` makes others",
        );
    };
    // The token store is read on a blocking-safe path: one sled read, in memory.
    match state.tokens.authenticate(token.trim()) {
        Some(principal) => {
            request.extensions_mut().insert(principal);
            next.run(request).await
        }
        None => error(
            StatusCode::UNAUTHORIZED,
            "the API token is wrong or was revoked; ask an admin for one (`skein token create --user NAME`)",
        ),
    }
}

/// The body of `POST /v1/plans`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PlanRequest {
    /// The workflow's text, YAML or Rhai.
    pub workflow: String,
    /// Its file name, for diagnostics and to tell the language (`.yaml`, `.yml`,
    /// `.rhai`); default `workflow.yaml`.
    #[serde(default)]
    pub name: Option<String>,
    /// Whether lower-priority instances may be preempted.
    #[serde(default)]
    pub allow_preemption: bool,
    /// Quantized derivatives to consider per model (the hub's most downloaded first).
    #[serde(default)]
    pub derivatives: Option<usize>,
}

/// A workflow the checker refused: the error, and every diagnostic with its place.
#[derive(Serialize, utoipa::ToSchema)]
pub(crate) struct InvalidWorkflow<'a> {
    error: ErrorDetail<'a>,
    /// What is wrong, where (file, line, column) and how to fix it.
    #[schema(value_type = Vec<Object>)]
    diagnostics: Vec<skein_dsl::diag::JsonDiagnostic>,
}

/// A placement plan of a workflow on the live graph (nothing is started).
#[utoipa::path(post, operation_id = "create_plan", path = "/v1/plans", tag = "plans", request_body = PlanRequest,
    responses(
        (status = 200, description = "The plan: per agent the chosen variant, engine, GPUs and memory estimate (docs/placement.md)", body = Object),
        (status = 400, description = "Not a plan request", body = ErrorBody),
        (status = 422, description = "The workflow is invalid", body = InvalidWorkflow),
        (status = 429, description = "Two of this user's workflows are being evaluated already", body = ErrorBody),
        (status = 502, description = "The model hub could not be read", body = ErrorBody),
    ))]
async fn plans(
    State(state): State<ApiState>,
    axum::extract::Extension(principal): axum::extract::Extension<Principal>,
    body: axum::body::Bytes,
) -> Response {
    let request: PlanRequest = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => {
            return error(
                StatusCode::BAD_REQUEST,
                &format!("the body is not a plan request ({e}); send {{\"workflow\": \"<YAML or Rhai text>\"}}"),
            );
        }
    };
    let workflow = match parse_workflow(
        &principal,
        request.name.as_deref(),
        &request.workflow,
        state.executor.clients().policy(),
    )
    .await
    {
        Ok(workflow) => workflow,
        Err(response) => return *response,
    };
    let options = InspectOptions {
        derivatives: request
            .derivatives
            .unwrap_or(skein_model_registry::hub::DEFAULT_DERIVATIVES),
        ..InspectOptions::default()
    };
    let settings = PlanSettings {
        allow_preemption: request.allow_preemption,
        ..PlanSettings::default()
    };
    let hub = state.hub.clone();
    let executor = state.executor.clone();
    let planner = Arc::clone(&state.planner);
    // The hub client's futures are not `Send` (their closures borrow), so the reads run
    // on a blocking thread driven by this runtime, then the planning (pure CPU work).
    let planned = tokio::task::spawn_blocking(move || {
        let runtime = tokio::runtime::Handle::current();
        let models = runtime
            .block_on(crate::catalogs::inspect_workflow(&hub, &workflow, &options))
            .map_err(|e| Box::new(error(StatusCode::BAD_GATEWAY, &skein_model_registry::error_chain(&e))))?;
        // The graph the executor plans on: drained GPUs are left out, with why.
        let snapshot = executor.plan_snapshot();
        let input = PlanInput {
            workflow: &workflow,
            models: &models,
            graph: &snapshot,
            running: &[],
            settings,
        };
        Planner::plan_shared(&planner, &input)
            .map_err(|e| Box::new(error(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string())))
    })
    .await;
    match planned {
        Ok(Ok(plan)) => axum::Json(plan).into_response(),
        Ok(Err(response)) => *response,
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, &format!("the planner failed: {e}")),
    }
}

/// A workflow sent as text: 400 for a name of no known language, 422 with the
/// diagnostics for an invalid workflow, or one whose endpoints the `policy` refuses.
pub(crate) async fn parse_workflow(
    principal: &Principal,
    name: Option<&str>,
    text: &str,
    policy: &crate::egress::EgressPolicy,
) -> Result<skein_dsl::Workflow, Box<Response>> {
    let name = name.unwrap_or("workflow.yaml");
    let Some(kind) = SourceKind::from_name(name) else {
        return Err(Box::new(error(
            StatusCode::BAD_REQUEST,
            "`name` must end in .yaml, .yml or .rhai",
        )));
    };
    // On the Rhai pool, a few at a time per user (429 beyond).
    let mut parsed = evaluate::parse(principal, name, text, kind).await.map_err(Box::new)?;
    refuse_endpoints(&mut parsed, policy);
    match parsed.workflow {
        Some(w) if !parsed.diagnostics.has_errors() => Ok(w),
        _ => {
            let body = InvalidWorkflow {
                error: ErrorDetail {
                    code: "invalid_workflow",
                    message: "the workflow is invalid",
                },
                diagnostics: skein_dsl::diag::to_json(&parsed.diagnostics, &parsed.file),
            };
            Err(Box::new(
                (StatusCode::UNPROCESSABLE_ENTITY, axum::Json(body)).into_response(),
            ))
        }
    }
}

/// Adds a diagnostic at the `url` of every endpoint agent whose URL the policy refuses.
fn refuse_endpoints(parsed: &mut skein_dsl::Parsed, policy: &crate::egress::EgressPolicy) {
    use skein_dsl::ir::Backend;
    let Some(workflow) = &parsed.workflow else {
        return;
    };
    for (agent, definition) in &workflow.agents {
        let Backend::Endpoint(endpoint) = &definition.backend else {
            continue;
        };
        if let Err(refusal) = policy.check_url(&endpoint.url) {
            let span = parsed
                .endpoint_urls
                .get(agent)
                .copied()
                .unwrap_or(skein_dsl::Span::point(0));
            parsed.diagnostics.push(
                skein_dsl::Diagnostic::error(skein_dsl::Code::BadValue, span, refusal.to_string())
                    .with_label("this server does not call this address")
                    .with_help(
                        "use an endpoint outside this server and its local network, or ask the admin to allow it",
                    ),
            );
        }
    }
}

/// One row of `GET /v1/nodes`.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct NodeSummary {
    /// Id.
    pub id: String,
    /// Name.
    pub name: String,
    /// Connected now.
    pub connected: bool,
    /// Health state.
    pub health: HealthState,
    /// Why, when not ok.
    pub reasons: Vec<String>,
    /// GPUs.
    pub gpus: usize,
    /// Total GPU memory, bytes.
    pub gpu_memory_total: u64,
    /// Free GPU memory now, bytes (GPUs without a sample count as zero).
    pub gpu_memory_free: u64,
    /// Round trip to the agent, milliseconds.
    pub rtt_ms: Option<f64>,
    /// What discovered its GPUs.
    pub gpu_source: String,
    /// Agent version.
    pub agent_version: String,
    /// The node's labels (`zone`, …), as its agent gave them.
    pub labels: BTreeMap<String, String>,
}

impl From<&NodeView> for NodeSummary {
    fn from(node: &NodeView) -> NodeSummary {
        NodeSummary {
            id: node.id.0.clone(),
            name: node.inventory.name.clone(),
            connected: node.connected,
            health: node.health.state,
            reasons: node.health.reasons.clone(),
            gpus: node.gpus.len(),
            gpu_memory_total: node.gpus.iter().map(|g| g.facts.memory_total).sum(),
            gpu_memory_free: node.gpus.iter().filter_map(|g| g.memory_free()).sum(),
            rtt_ms: node.rtt_ms,
            gpu_source: node.inventory.gpu_source.clone(),
            agent_version: node.inventory.agent_version.clone(),
            labels: node.inventory.labels.clone(),
        }
    }
}

/// The nodes, their health and GPU memory.
#[utoipa::path(get, operation_id = "list_nodes", path = "/v1/nodes", tag = "graph",
    responses((status = 200, description = "Every node", body = Vec<NodeSummary>)))]
async fn nodes(State(state): State<ApiState>) -> Result<Response, ApiError> {
    let snapshot = state.graph.snapshot();
    off_runtime(move || {
        let nodes: Vec<NodeSummary> = snapshot.nodes.iter().map(|n| NodeSummary::from(n.as_ref())).collect();
        json_bytes(&nodes)
    })
    .await
}

/// Runs `answer` (building and serializing an answer about the whole fleet: megabytes
/// at thousands of nodes) on a blocking thread, so the async workers that carry the
/// agents' streams and every other request never wait behind it.
async fn off_runtime(
    answer: impl FnOnce() -> Result<Response, ApiError> + Send + 'static,
) -> Result<Response, ApiError> {
    tokio::task::spawn_blocking(answer).await.map_err(ApiError::internal)?
}

/// `value` as a JSON answer.
fn json_bytes<T: Serialize>(value: &T) -> Result<Response, ApiError> {
    let body = serde_json::to_vec(value).map_err(ApiError::internal)?;
    Ok(([(header::CONTENT_TYPE, "application/json")], body).into_response())
}

/// The whole hardware graph: nodes, GPUs, links, latest telemetry and health.
#[utoipa::path(get, operation_id = "get_graph", path = "/v1/graph", tag = "graph",
    responses((status = 200, description = "A snapshot of the graph (docs/api.md)", body = Object)))]
async fn graph(State(state): State<ApiState>) -> Result<Response, ApiError> {
    let snapshot = state.graph.snapshot();
    off_runtime(move || json_bytes(&snapshot)).await
}

/// A GPU's recent samples, as `GET /v1/graph/nodes/{node}/gpus/{index}/samples`
/// answers them.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct GpuSamples {
    /// The node's name.
    pub node: String,
    /// The GPU's index on it.
    pub gpu: u32,
    /// Its samples, oldest first: the window the graph keeps (120 samples by default).
    #[schema(value_type = Vec<Object>)]
    pub samples: Vec<crate::graph::GpuSample>,
}

/// A GPU's recent telemetry, oldest first (what the graph keeps of it: the history the
/// web page draws when a GPU is opened).
#[utoipa::path(get, operation_id = "gpu_samples", path = "/v1/graph/nodes/{node}/gpus/{index}/samples", tag = "graph",
    params(("node" = String, Path, description = "The node's name (or id)"), ("index" = u32, Path, description = "The GPU's index on the node")),
    responses(
        (status = 200, description = "The GPU's samples, oldest first", body = GpuSamples),
        (status = 400, description = "The index is not a GPU index (a whole number from 0)", body = ErrorBody),
        (status = 404, description = "No such node or GPU", body = ErrorBody),
    ))]
async fn gpu_samples(
    State(state): State<ApiState>,
    axum::extract::Path((node, index)): axum::extract::Path<(String, u32)>,
) -> Result<axum::Json<GpuSamples>, ApiError> {
    let id = state
        .graph
        .id_of(&node)
        .unwrap_or_else(|| crate::graph::NodeId(node.clone()));
    let Some(view) = state.graph.node(&id) else {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            format!("no node `{node}`; GET /v1/nodes lists them"),
        ));
    };
    let samples = state
        .graph
        .window(&id, index)
        .map_err(|e| ApiError::new(StatusCode::NOT_FOUND, e.to_string()))?;
    Ok(axum::Json(GpuSamples {
        node: view.inventory.name.clone(),
        gpu: index,
        samples,
    }))
}

/// Every GPU's recent samples at once, as `GET /v1/graph/samples` answers them.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct GraphSamples {
    /// What each row of `samples` holds, in order.
    pub columns: [&'static str; 5],
    /// Every node, sorted by name.
    pub nodes: Vec<NodeSamples>,
}

/// One node's GPUs in [`GraphSamples`].
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct NodeSamples {
    /// The node's name.
    pub node: String,
    /// Its GPUs, by index.
    pub gpus: Vec<GpuSampleRows>,
}

/// One GPU's samples in [`GraphSamples`], oldest first, one row per sample.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct GpuSampleRows {
    /// The GPU's index on its node.
    pub index: u32,
    /// `[unix_ms, utilization_pct, temperature_c, memory_used, power_mw]` per sample
    /// (`null` where a value was not measured).
    #[schema(value_type = Vec<Vec<Object>>)]
    pub samples: Vec<SampleRow>,
}

/// One sample in [`GpuSampleRows`]: `(unix_ms, utilization_pct, temperature_c,
/// memory_used, power_mw)`.
pub type SampleRow = (i64, Option<u32>, Option<i32>, u64, Option<u32>);

/// The columns of [`GpuSampleRows::samples`].
const SAMPLE_COLUMNS: [&str; 5] = ["unix_ms", "utilization_pct", "temperature_c", "memory_used", "power_mw"];

/// How many samples per GPU `GET /v1/graph/samples` returns (`last`, at most the window).
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
struct SamplesQuery {
    /// The newest N samples of each GPU (default: all the graph keeps, 120).
    last: Option<usize>,
}

/// Every GPU's recent telemetry in one answer, oldest first (what the web page draws
/// its sparklines from when it opens, instead of one request per GPU).
#[utoipa::path(get, operation_id = "graph_samples", path = "/v1/graph/samples", tag = "graph",
    params(SamplesQuery),
    responses(
        (status = 200, description = "Every GPU's samples, oldest first", body = GraphSamples),
        (status = 400, description = "A bad query (`last` is a whole number from 0)", body = ErrorBody),
    ))]
async fn graph_samples(
    State(state): State<ApiState>,
    Params(query): Params<SamplesQuery>,
) -> Result<Response, ApiError> {
    let graph = state.graph.clone();
    off_runtime(move || {
        let snapshot = graph.snapshot();
        let nodes = snapshot
            .nodes
            .iter()
            .map(|view| NodeSamples {
                node: view.inventory.name.clone(),
                gpus: view
                    .gpus
                    .iter()
                    .map(|gpu| {
                        let index = gpu.facts.index;
                        let window = graph.window(&view.id, index).unwrap_or_default();
                        let skip = query.last.map_or(0, |last| window.len().saturating_sub(last));
                        GpuSampleRows {
                            index,
                            samples: window
                                .iter()
                                .skip(skip)
                                .map(|s| (s.unix_ms, s.utilization_pct, s.temperature_c, s.memory_used, s.power_mw))
                                .collect(),
                        }
                    })
                    .collect(),
            })
            .collect();
        json_bytes(&GraphSamples {
            columns: SAMPLE_COLUMNS,
            nodes,
        })
    })
    .await
}

/// Graph changes as server-sent events: `node_registered`, `node_connection`,
/// `health`, `telemetry` (and `lagged` for a slow reader), without end.
#[utoipa::path(get, operation_id = "graph_events", path = "/v1/graph/events", tag = "graph",
    responses((status = 200, description = "An endless event stream; each event's data is the change as JSON", body = ServerSentEvent, content_type = "text/event-stream")))]
async fn events(State(state): State<ApiState>) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let receiver = state.events.subscribe();
    let stream = futures::stream::unfold(receiver, |mut receiver| async move {
        let event = match receiver.recv().await {
            Ok(event) => {
                let name = match &event {
                    GraphEvent::NodeRegistered { .. } => "node_registered",
                    GraphEvent::NodeConnection { .. } => "node_connection",
                    GraphEvent::Health { .. } => "health",
                    GraphEvent::Telemetry { .. } => "telemetry",
                };
                let data = serde_json::to_string(&event).unwrap_or_default();
                Event::default().event(name).data(data)
            }
            // A slow reader skips what it missed and is told how much.
            Err(broadcast::error::RecvError::Lagged(missed)) => Event::default()
                .event("lagged")
                .data(format!("{{\"missed\":{missed}}}")),
            Err(broadcast::error::RecvError::Closed) => return None,
        };
        Some((Ok(event), receiver))
    });
    Sse::new(stream).keep_alive(KeepAlive::default())
}

/// GPU and node metrics in the Prometheus text format (dcgm-exporter names).
#[utoipa::path(get, operation_id = "metrics", path = "/metrics", tag = "server",
    responses((status = 200, description = "Prometheus text", body = String, content_type = "text/plain")))]
async fn metrics(State(state): State<ApiState>) -> Result<Response, ApiError> {
    let snapshot = state.graph.snapshot();
    let health = state.db.health();
    off_runtime(move || {
        let mut body = prometheus_text(&snapshot);
        store_metrics(&mut body, &health);
        let kind = [(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")];
        Ok((kind, body).into_response())
    })
    .await
}

/// The store writer's metrics, appended to `out` in the Prometheus text format.
pub fn store_metrics(out: &mut String, health: &crate::store::WriterHealth) {
    use std::fmt::Write as _;
    let metrics: [(&str, &str, &str, u64); 6] = [
        (
            "skein_store_writes_total",
            "counter",
            "Durable writes acknowledged.",
            health.writes,
        ),
        (
            "skein_store_flushes_total",
            "counter",
            "Flushes of the store's writer (each acknowledges a group of writes).",
            health.flushes,
        ),
        (
            "skein_store_refused_total",
            "counter",
            "Writes refused (queue full) or not acknowledged within the deadline.",
            health.refused,
        ),
        (
            "skein_store_queued",
            "gauge",
            "Writes waiting for the writer.",
            health.queued,
        ),
        (
            "skein_store_busy_milliseconds",
            "gauge",
            "How long the writer's current round has run (0 when idle).",
            health.busy_ms,
        ),
        (
            "skein_store_stalled",
            "gauge",
            "1 when the writer's round has run longer than the stall bound.",
            u64::from(health.stalled),
        ),
    ];
    for (name, kind, help, value) in metrics {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}");
    }
}

/// The snapshot in the Prometheus text format, with the metric names of NVIDIA's
/// dcgm-exporter where one applies (so existing Grafana dashboards work) and `skein_`
/// names for the rest.
pub fn prometheus_text(snapshot: &GraphSnapshot) -> String {
    struct Metric {
        name: &'static str,
        help: &'static str,
        kind: &'static str,
    }
    const METRICS: &[Metric] = &[
        Metric {
            name: "DCGM_FI_DEV_GPU_UTIL",
            help: "GPU utilization (in %).",
            kind: "gauge",
        },
        Metric {
            name: "DCGM_FI_DEV_MEM_COPY_UTIL",
            help: "Memory utilization (in %).",
            kind: "gauge",
        },
        Metric {
            name: "DCGM_FI_DEV_FB_USED",
            help: "Framebuffer memory used (in MiB).",
            kind: "gauge",
        },
        Metric {
            name: "DCGM_FI_DEV_FB_FREE",
            help: "Framebuffer memory free (in MiB).",
            kind: "gauge",
        },
        Metric {
            name: "DCGM_FI_DEV_GPU_TEMP",
            help: "GPU temperature (in C).",
            kind: "gauge",
        },
        Metric {
            name: "DCGM_FI_DEV_POWER_USAGE",
            help: "Power draw (in W).",
            kind: "gauge",
        },
        Metric {
            name: "DCGM_FI_DEV_SM_CLOCK",
            help: "SM clock frequency (in MHz).",
            kind: "gauge",
        },
        Metric {
            name: "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS",
            help: "Throttling reasons bitmask.",
            kind: "gauge",
        },
        Metric {
            name: "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
            help: "Total number of single-bit volatile ECC errors.",
            kind: "counter",
        },
        Metric {
            name: "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
            help: "Total number of double-bit volatile ECC errors.",
            kind: "counter",
        },
        Metric {
            name: "skein_gpu_foreign_memory_bytes",
            help: "Memory held by processes Skein did not start.",
            kind: "gauge",
        },
        Metric {
            name: "skein_gpu_health",
            help: "1 for the GPU's current health state.",
            kind: "gauge",
        },
    ];
    let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
    let mut out = String::new();
    for metric in METRICS {
        let _ = writeln!(out, "# HELP {} {}", metric.name, metric.help);
        let _ = writeln!(out, "# TYPE {} {}", metric.name, metric.kind);
        for (node, gpu) in snapshot.gpus() {
            let labels = format!(
                "gpu=\"{}\",UUID=\"{}\",modelName=\"{}\",Hostname=\"{}\"",
                gpu.facts.index,
                escape(&gpu.facts.uuid),
                escape(&gpu.facts.name),
                escape(&node.inventory.name)
            );
            if metric.name == "skein_gpu_health" {
                for state in [
                    HealthState::Ok,
                    HealthState::Degraded,
                    HealthState::Down,
                    HealthState::Left,
                ] {
                    let value = u8::from(gpu.health.state == state);
                    let _ = writeln!(out, "{}{{{labels},state=\"{state}\"}} {value}", metric.name);
                }
                continue;
            }
            let Some(s) = gpu.latest else { continue };
            let value: Option<f64> = match metric.name {
                "DCGM_FI_DEV_GPU_UTIL" => s.utilization_pct.map(f64::from),
                "DCGM_FI_DEV_MEM_COPY_UTIL" => s.memory_utilization_pct.map(f64::from),
                "DCGM_FI_DEV_FB_USED" => Some(mib(s.memory_used)),
                "DCGM_FI_DEV_FB_FREE" => Some(mib(s.memory_free)),
                "DCGM_FI_DEV_GPU_TEMP" => s.temperature_c.map(f64::from),
                "DCGM_FI_DEV_POWER_USAGE" => s.power_mw.map(|p| f64::from(p) / 1000.0),
                "DCGM_FI_DEV_SM_CLOCK" => s.sm_clock_mhz.map(f64::from),
                "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS" => Some(s.throttle_reasons as f64),
                "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL" => s.ecc_corrected.map(|v| v as f64),
                "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL" => s.ecc_uncorrected.map(|v| v as f64),
                "skein_gpu_foreign_memory_bytes" => s.foreign_memory.map(|v| v as f64),
                _ => None,
            };
            if let Some(value) = value {
                let _ = writeln!(out, "{}{{{labels}}} {value}", metric.name);
            }
        }
    }
    let _ = writeln!(out, "# HELP skein_node_up 1 when the node reports telemetry.");
    let _ = writeln!(out, "# TYPE skein_node_up gauge");
    for node in &snapshot.nodes {
        let up = u8::from(!node.health.state.is_unavailable() && node.last_seen_ms.is_some());
        let _ = writeln!(
            out,
            "skein_node_up{{Hostname=\"{}\"}} {up}",
            escape(&node.inventory.name)
        );
    }
    out
}

/// A label value in the text format: backslash, quote and newline escaped.
fn escape(value: &str) -> String {
    value.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}
