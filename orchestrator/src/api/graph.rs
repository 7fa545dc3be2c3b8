//! The hardware graph over REST: `GET /v1/nodes`, `GET /v1/graph`, a GPU's and every
//! GPU's recent samples, and `GET /v1/graph/events` (server-sent events).

use std::collections::BTreeMap;
use std::convert::Infallible;

use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::Stream;
use serde::{Deserialize, Serialize};
use tokio::sync::broadcast;
use utoipa_axum::{router::OpenApiRouter, routes};

use super::ApiState;
use super::error::{ApiError, ErrorBody};
use super::extract::Params;
use super::openapi::ServerSentEvent;
use crate::graph::{GraphEvent, HealthState, NodeView};

/// The routes of this module (behind the API token).
pub(super) fn routes() -> OpenApiRouter<ApiState> {
    OpenApiRouter::new()
        .routes(routes!(nodes))
        .routes(routes!(graph))
        .routes(routes!(events))
        .routes(routes!(gpu_samples))
        .routes(routes!(graph_samples))
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
pub(super) async fn off_runtime(
    answer: impl FnOnce() -> Result<Response, ApiError> + Send + 'static,
) -> Result<Response, ApiError> {
    tokio::task::spawn_blocking(answer).await.map_err(ApiError::internal)?
}

/// `value` as a JSON answer.
pub(super) fn json_bytes<T: Serialize>(value: &T) -> Result<Response, ApiError> {
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
