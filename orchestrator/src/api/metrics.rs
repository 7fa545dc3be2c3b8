//! `GET /metrics`: GPUs, nodes, the store, the reflexes and usage by group and user, in
//! the Prometheus text format.

use std::fmt::Write as _;

use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use utoipa_axum::{router::OpenApiRouter, routes};

use super::ApiState;
use super::error::ApiError;
use super::graph::off_runtime;
use crate::graph::{GraphSnapshot, HealthState};

/// The routes of this module (behind the API token).
pub(super) fn routes() -> OpenApiRouter<ApiState> {
    OpenApiRouter::new().routes(routes!(metrics))
}

/// GPU and node metrics in the Prometheus text format (dcgm-exporter names).
#[utoipa::path(get, operation_id = "metrics", path = "/metrics", tag = "server",
    responses((status = 200, description = "Prometheus text", body = String, content_type = "text/plain")))]
async fn metrics(State(state): State<ApiState>) -> Result<Response, ApiError> {
    let snapshot = state.graph.snapshot();
    let health = state.db.health();
    let dropped = state.reflexes.dropped();
    let sharing = state.executor.sharing().clone();
    off_runtime(move || {
        let mut body = prometheus_text(&snapshot);
        store_metrics(&mut body, &health);
        reflex_metrics(&mut body, dropped);
        sharing.usage_metrics(&mut body);
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

/// The reflexes' metrics, appended to `out` in the Prometheus text format: the
/// decisions dropped because their run's actor was 64 jobs behind
/// ([`crate::reflex::Reflexes::dropped`]).
pub fn reflex_metrics(out: &mut String, dropped: u64) {
    let name = "skein_reflex_decisions_dropped_total";
    let _ = writeln!(
        out,
        "# HELP {name} Reflex decisions dropped because their run's actions were behind (its queue was full).\n# TYPE {name} counter\n{name} {dropped}"
    );
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
