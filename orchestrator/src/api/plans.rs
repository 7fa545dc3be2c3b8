//! `POST /v1/plans`: a placement plan of a workflow on the live graph, and reading a
//! workflow sent as text (which runs share).

use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use serde::Deserialize;
use skein_dsl::SourceKind;
use skein_model_registry::hub::InspectOptions;
use utoipa_axum::{router::OpenApiRouter, routes};

use super::ApiState;
use super::error::{ApiError, ErrorBody, InvalidWorkflow};
use super::evaluate;
use crate::auth::Principal;
use crate::plan::{Plan, PlanError, PlanInput, PlanSettings, Planner};

/// The routes of this module (behind the API token).
pub(super) fn routes() -> OpenApiRouter<ApiState> {
    OpenApiRouter::new().routes(routes!(plans))
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

/// A placement plan of a workflow on the live graph (nothing is started).
#[utoipa::path(post, operation_id = "create_plan", path = "/v1/plans", tag = "plans", request_body = PlanRequest,
    responses(
        (status = 200, description = "The plan: per agent the chosen variant, engine, GPUs and memory estimate (docs/placement.md)", body = Object),
        (status = 400, description = "Not a plan request", body = ErrorBody),
        (status = 422, description = "The workflow is invalid, or cannot be served as written (a step prompts an embedding model; an adapter of another base model): the message says why", body = InvalidWorkflow),
        (status = 429, description = "Two of this user's workflows are being evaluated already", body = ErrorBody),
        (status = 502, description = "The model hub could not be read", body = ErrorBody),
    ))]
async fn plans(
    State(state): State<ApiState>,
    axum::extract::Extension(principal): axum::extract::Extension<Principal>,
    body: axum::body::Bytes,
) -> Result<axum::Json<Plan>, ApiError> {
    let request: PlanRequest = serde_json::from_slice(&body).map_err(|e| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            format!("the body is not a plan request ({e}); send {{\"workflow\": \"<YAML or Rhai text>\"}}"),
        )
    })?;
    let workflow = parse_workflow(&principal, request.name.as_deref(), &request.workflow, &state.executor).await?;
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
        let catalogs = runtime
            .block_on(crate::catalogs::inspect_workflow(&hub, &workflow, &options))
            .map_err(|e| ApiError::new(StatusCode::BAD_GATEWAY, skein_model_registry::error_chain(&e)))?;
        // The graph the executor plans on: drained GPUs are left out, with why.
        let snapshot = executor.plan_snapshot();
        // What a preempting plan may stop: the runs' instances, with their priorities
        // and owners' standings.
        let running = if settings.allow_preemption {
            executor.running_instances().map_err(ApiError::from)?
        } else {
            Vec::new()
        };
        let input = PlanInput {
            workflow: &workflow,
            models: &catalogs.models,
            adapters: &catalogs.adapters,
            graph: &snapshot,
            running: &running,
            settings,
        };
        Planner::plan_shared(&planner, &input).map_err(|e| match e {
            // The catalogs were read above: a missing one is this server's fault.
            PlanError::MissingModels(_) => ApiError::internal(e),
            // Valid, but not servable as written: a 422 whose message says why.
            PlanError::Adapters(_) | PlanError::PromptsEmbedder { .. } => {
                let mut error = ApiError::invalid_workflow(Vec::new());
                error.message = e.to_string();
                error
            }
        })
    })
    .await
    .map_err(|e| ApiError::internal(format!("the planner failed: {e}")))?;
    planned.map(axum::Json)
}

/// A workflow sent as text: 400 for a name of no known language, 422 with the
/// diagnostics for an invalid workflow, or one whose endpoints or tool servers the
/// executor's `policy` and allowed tool programs refuse.
pub(crate) async fn parse_workflow(
    principal: &Principal,
    name: Option<&str>,
    text: &str,
    executor: &crate::run::Executor,
) -> Result<skein_dsl::Workflow, ApiError> {
    let policy = executor.clients().policy();
    let name = name.unwrap_or("workflow.yaml");
    let Some(kind) = SourceKind::from_name(name) else {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "`name` must end in .yaml, .yml or .rhai",
        ));
    };
    // On the Rhai pool, a few at a time per user (429 beyond).
    let mut parsed = evaluate::parse(principal, name, text, kind).await?;
    refuse_endpoints(&mut parsed, policy);
    refuse_tool_servers(&mut parsed, policy, executor.tool_commands());
    match parsed.workflow {
        Some(w) if !parsed.diagnostics.has_errors() => Ok(w),
        _ => Err(ApiError::invalid_workflow(skein_dsl::diag::to_json(
            &parsed.diagnostics,
            &parsed.file,
        ))),
    }
}

/// Adds a diagnostic at the `command` or `url` of every tool server this server would
/// refuse to run or reach: a program the admin did not allow, a URL the policy refuses.
fn refuse_tool_servers(
    parsed: &mut skein_dsl::Parsed,
    policy: &crate::egress::EgressPolicy,
    commands: &[std::path::PathBuf],
) {
    use skein_dsl::ir::ToolTransport;
    let Some(workflow) = &parsed.workflow else {
        return;
    };
    for (server, spec) in &workflow.tool_servers {
        let span = parsed
            .tool_transports
            .get(server)
            .copied()
            .unwrap_or(skein_dsl::Span::point(0));
        let refusal = match &spec.transport {
            ToolTransport::Stdio { command } => {
                crate::tools::disallowed_program(command, commands).map(|program| {
                    skein_dsl::Diagnostic::error(
                        skein_dsl::Code::BadValue,
                        span,
                        format!("tool server `{server}` runs `{program}`, which this server does not allow"),
                    )
                    .with_label("this server does not run this program")
                    .with_help(format!(
                        "ask the admin to start the server with `--allow-tool-command {program}`, or use a tool server reached by `url`"
                    ))
                })
            }
            ToolTransport::Http { url, .. } => policy.check_url(url).err().map(|refusal| {
                skein_dsl::Diagnostic::error(skein_dsl::Code::BadValue, span, refusal.to_string())
                    .with_label("this server does not call this address")
                    .with_help(
                        "use a tool server outside this server and its local network, or ask the admin to allow it",
                    )
            }),
        };
        if let Some(diagnostic) = refusal {
            parsed.diagnostics.push(diagnostic);
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
