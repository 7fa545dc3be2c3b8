//! The REST API over the hardware graph: `GET /v1/nodes`, `GET /v1/graph`,
//! `GET /v1/graph/events` (server-sent events), `POST /v1/plans` (a placement plan of a
//! workflow on the live graph), runs and instances ([`runs`]) and `GET /metrics`
//! (Prometheus text).
//!
//! Every route but `/healthz` needs `Authorization: Bearer <API token>`.

use std::convert::Infallible;
use std::fmt::Write as _;
use std::sync::Arc;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde::Deserialize;
use skein_dsl::SourceKind;
use skein_model_registry::hub::InspectOptions;

use crate::plan::{PlanInput, PlanSettings, Planner};
use futures::Stream;
use serde::Serialize;
use tokio::sync::broadcast;

pub use crate::auth::Principal;

mod openai;
mod runs;
mod sessions;
mod tokens;
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
}

/// The router.
pub fn router(state: ApiState) -> Router {
    let protected = Router::new()
        .route("/v1/nodes", get(nodes))
        .route("/v1/graph", get(graph))
        .route("/v1/graph/events", get(events))
        .route("/v1/plans", axum::routing::post(plans))
        .merge(runs::routes())
        .merge(tokens::routes())
        .merge(sessions::routes())
        .merge(openai::routes())
        .route("/metrics", get(metrics))
        .route_layer(middleware::from_fn_with_state(state.clone(), authorize));
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .merge(protected)
        .fallback(|| async { error(StatusCode::NOT_FOUND, "no such route; see docs/api.md") })
        .with_state(state)
}

/// Every error answer: `{"error": {"code": "not_found", "message": "…"}}` (the shape
/// OpenAI clients read too).
#[derive(Serialize)]
pub(crate) struct ErrorBody<'a> {
    pub(crate) error: ErrorDetail<'a>,
}

/// The code and message of an error answer.
#[derive(Serialize)]
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

    /// A 500 for a failure of the server itself.
    pub(crate) fn internal(error: impl std::fmt::Display) -> ApiError {
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, error.to_string())
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

/// Finds who presents the request's bearer token and hands them to the route as an
/// extension ([`Principal`]); 401 without a live token.
async fn authorize(State(state): State<ApiState>, mut request: Request, next: Next) -> Response {
    let presented = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
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
#[derive(Debug, Deserialize)]
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

#[derive(Serialize)]
struct InvalidWorkflow<'a> {
    error: ErrorDetail<'a>,
    diagnostics: Vec<skein_dsl::diag::JsonDiagnostic>,
}

async fn plans(State(state): State<ApiState>, body: axum::body::Bytes) -> Response {
    let request: PlanRequest = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => {
            return error(
                StatusCode::BAD_REQUEST,
                &format!("the body is not a plan request ({e}); send {{\"workflow\": \"<YAML or Rhai text>\"}}"),
            );
        }
    };
    let workflow = match parse_workflow(request.name.as_deref(), &request.workflow) {
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
    let graph = Arc::clone(&state.graph);
    let planner = Arc::clone(&state.planner);
    // The hub client's futures are not `Send` (their closures borrow), so the reads run
    // on a blocking thread driven by this runtime, then the planning (pure CPU work).
    let planned = tokio::task::spawn_blocking(move || {
        let runtime = tokio::runtime::Handle::current();
        let models = runtime
            .block_on(crate::catalogs::inspect_workflow(&hub, &workflow, &options))
            .map_err(|e| Box::new(error(StatusCode::BAD_GATEWAY, &skein_model_registry::error_chain(&e))))?;
        let snapshot = graph.snapshot();
        // A planner that panicked mid-plan may hold half-made caches: start afresh.
        let mut planner = planner.lock().unwrap_or_else(|poisoned| {
            planner.clear_poison();
            let mut guard = poisoned.into_inner();
            *guard = Planner::default();
            guard
        });
        planner
            .plan(&PlanInput {
                workflow: &workflow,
                models: &models,
                graph: &snapshot,
                running: &[],
                settings,
            })
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
/// diagnostics for an invalid workflow.
pub(crate) fn parse_workflow(name: Option<&str>, text: &str) -> Result<skein_dsl::Workflow, Box<Response>> {
    let name = name.unwrap_or("workflow.yaml");
    let Some(kind) = SourceKind::from_name(name) else {
        return Err(Box::new(error(
            StatusCode::BAD_REQUEST,
            "`name` must end in .yaml, .yml or .rhai",
        )));
    };
    let parsed = skein_dsl::parse_as(name, text, kind);
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

/// One row of `GET /v1/nodes`.
#[derive(Debug, Serialize)]
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
        }
    }
}

async fn nodes(State(state): State<ApiState>) -> axum::Json<Vec<NodeSummary>> {
    let snapshot = state.graph.snapshot();
    axum::Json(snapshot.nodes.iter().map(|n| NodeSummary::from(n.as_ref())).collect())
}

async fn graph(State(state): State<ApiState>) -> axum::Json<GraphSnapshot> {
    axum::Json(state.graph.snapshot())
}

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

async fn metrics(State(state): State<ApiState>) -> Response {
    let body = prometheus_text(&state.graph.snapshot());
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")],
        body,
    )
        .into_response()
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
                for state in [HealthState::Ok, HealthState::Degraded, HealthState::Down] {
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
        let up = u8::from(node.health.state != HealthState::Down && node.last_seen_ms.is_some());
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
