//! `skein plan WORKFLOW`: where each agent of a workflow would run, and why — offline
//! against a fleet file, or on a live orchestrator's graph (`POST /v1/plans`).

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, bail};
use skein_model_registry::Bytes;
use skein_model_registry::hub::{HubClientBuilder, InspectOptions};
use skein_orchestrator::graph::{GraphConfig, GraphSnapshot};
use skein_orchestrator::plan::{Plan, PlanInput, PlanSettings, PlannedInstance};
use skein_orchestrator::workflows;

use crate::cli::common::OutputFormat;
use crate::cli::workflow::PlanArgs;
use crate::cli::{EXIT_FAILURE, EXIT_OK};
use crate::table::{self, Style};

/// `skein plan`.
pub fn run(args: &PlanArgs) -> anyhow::Result<ExitCode> {
    let plan = match (&args.fleet, &args.server) {
        (Some(fleet), None) => offline(args, fleet)?,
        (None, Some(server)) => remote(args, server)?,
        _ => bail!(
            "say where to plan: --fleet FLEET.yaml for a dry run on a fleet file \
             (e.g. workflows/fleets/lab.yaml), or --server URL for a running orchestrator"
        ),
    };
    match args.output {
        OutputFormat::Json => println!("{}", serde_json::to_string_pretty(&plan)?),
        OutputFormat::Human => print!("{}", render(&plan, args.explain)),
    }
    Ok(ExitCode::from(if plan.admitted { EXIT_OK } else { EXIT_FAILURE }))
}

fn load_workflow(path: &Path) -> anyhow::Result<skein_dsl::Workflow> {
    let parsed = workflows::load(path)?;
    if !parsed.is_valid() {
        eprint!("{}", parsed.render(skein_dsl::RenderOptions::default()));
        bail!(
            "{} is not a valid workflow ({} errors); `skein validate {}` lists them",
            path.display(),
            parsed.diagnostics.error_count(),
            path.display()
        );
    }
    parsed.workflow.context("the workflow was not produced")
}

fn offline(args: &PlanArgs, fleet_file: &Path) -> anyhow::Result<Plan> {
    let workflow = load_workflow(&args.workflow)?;
    let snapshot = fleet_snapshot(fleet_file)?;
    let mut builder = HubClientBuilder::from_env();
    if args.offline {
        builder = builder.offline(true);
    }
    let client = builder.build()?;
    let options = InspectOptions {
        derivatives: args.derivatives,
        derivative_headers: args.derivative_headers,
        pins: Vec::new(),
    };
    let runtime = crate::runtime::runtime(Some(2))?;
    let catalogs = runtime
        .block_on(skein_orchestrator::catalogs::inspect_workflow(
            &client, &workflow, &options,
        ))
        .map_err(anyhow::Error::new)?;
    let settings = PlanSettings {
        allow_preemption: args.preempt,
        ..PlanSettings::default()
    };
    Ok(skein_orchestrator::plan::plan(&PlanInput {
        workflow: &workflow,
        models: &catalogs.models,
        adapters: &catalogs.adapters,
        graph: &snapshot,
        running: &[],
        settings,
    })?)
}

/// The graph a fleet file's agents would build: each node's registration and first
/// telemetry go through the same protocol messages and conversions as a live agent's.
pub fn fleet_snapshot(file: &Path) -> anyhow::Result<GraphSnapshot> {
    let fleet = skein_agent::fleet::load_fleet(file).map_err(|e| anyhow::anyhow!("{e}"))?;
    let messages = skein_agent::daemon::fleet_messages(&fleet, 0.0);
    let graph = skein_orchestrator::agents::graph_from_wire(messages, GraphConfig::default(), 0)
        .map_err(|e| anyhow::anyhow!("the fleet file's inventory was refused: {e}"))?;
    Ok(graph.snapshot())
}

fn remote(args: &PlanArgs, server: &str) -> anyhow::Result<Plan> {
    let text = std::fs::read_to_string(&args.workflow)
        .with_context(|| format!("cannot read workflow file {}", args.workflow.display()))?;
    // Check it here first: the errors come with file positions.
    load_workflow(&args.workflow)?;
    let token = crate::client::api_token(&args.client)?;
    let url = format!("{}/v1/plans", server.trim_end_matches('/'));
    let body = serde_json::json!({
        "workflow": text,
        "name": args.workflow.file_name().map(|n| n.to_string_lossy().into_owned()),
        "allow_preemption": args.preempt,
        "derivatives": args.derivatives,
    });
    let runtime = crate::runtime::runtime(Some(1))?;
    let answer = runtime.block_on(async {
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(300))
            .build()
            .context("cannot build an HTTP client")?;
        let response = client
            .post(&url)
            .bearer_auth(token.expose())
            .json(&body)
            .send()
            .await
            .with_context(|| {
                format!("cannot reach the Skein server at {server}; is `skein server` or `skein up` running?")
            })?;
        let status = response.status();
        let text = response.text().await.context("the server's answer was cut off")?;
        if !status.is_success() {
            bail!("the server answered {status}: {}", text.trim());
        }
        Ok(text)
    })?;
    serde_json::from_str(&answer).context("the server's plan is not what this skein expects")
}

fn gib(bytes: u64) -> String {
    Bytes::new(bytes).to_string()
}

fn gpus(i: &PlannedInstance) -> String {
    let mut parts: Vec<(String, Vec<String>)> = Vec::new();
    for d in &i.devices {
        let what = d.gpu.map_or_else(|| "host".to_owned(), |g| g.to_string());
        match parts.iter_mut().find(|(n, _)| *n == d.node) {
            Some((_, list)) => list.push(what),
            None => parts.push((d.node.clone(), vec![what])),
        }
    }
    parts
        .into_iter()
        .map(|(node, list)| {
            if list == ["host"] {
                format!("{node} cpu")
            } else {
                format!("{node}:{}", list.join(","))
            }
        })
        .collect::<Vec<_>>()
        .join(" + ")
}

fn layout(i: &PlannedInstance) -> String {
    let l = &i.layout;
    let mut text = match (l.tensor_parallel, l.pipeline_stages) {
        (1, 1) => i.family.clone(),
        (tp, 1) => format!("TP {tp}"),
        (1, _) => format!("layers {}", join(&l.layer_partition)),
        (tp, pp) => format!("TP {tp} × PP {pp} ({})", join(&l.layer_partition)),
    };
    if let Some(ngl) = l.gpu_layers {
        let _ = write!(text, ", -ngl {ngl}");
    }
    text
}

fn join(values: &[u64]) -> String {
    values.iter().map(ToString::to_string).collect::<Vec<_>>().join("/")
}

/// The plan as a table, and with `explain`, the reasons under it.
pub fn render(plan: &Plan, explain: bool) -> String {
    let mut out = String::new();
    let nodes: BTreeSet<&str> = plan
        .instances
        .iter()
        .flat_map(|i| i.devices.iter().map(|d| d.node.as_str()))
        .collect();
    let _ = writeln!(
        out,
        "plan for `{}` (priority {}) on graph version {}: {}",
        plan.workflow,
        plan.priority,
        plan.graph_version,
        if plan.admitted {
            format!(
                "admitted, {} replica{} on {} node{}",
                plan.instances.len(),
                if plan.instances.len() == 1 { "" } else { "s" },
                nodes.len(),
                if nodes.len() == 1 { "" } else { "s" }
            )
        } else {
            "queued".to_owned()
        }
    );
    if let Some(reason) = &plan.queued_reason {
        let _ = writeln!(out, "queued: {reason}");
    }
    if !plan.instances.is_empty() {
        let rows: Vec<Vec<String>> = plan
            .instances
            .iter()
            .map(|i| {
                vec![
                    i.instance.clone(),
                    format!("{}/{}", i.replica, i.replicas),
                    i.variant.clone(),
                    i.precision.to_string(),
                    i.engine.clone(),
                    layout(i),
                    gpus(i),
                    format!("{:.0}{}", i.tokens_per_s, if i.slow { " (slow)" } else { "" }),
                ]
            })
            .collect();
        out.push('\n');
        out.push_str(&table::render(
            &Style {
                indent: "",
                gap: 2,
                right_aligned: &[7],
            },
            &[
                "INSTANCE",
                "REPLICA",
                "VARIANT",
                "PRECISION",
                "ENGINE",
                "SPLIT",
                "GPUS",
                "TOK/S",
            ],
            &rows,
        ));
    }
    for r in &plan.remote {
        let _ = writeln!(out, "remote: {} → {} (model {})", r.agent, r.url, r.model);
    }
    for u in &plan.unplaced {
        let _ = writeln!(out, "unplaced: {} (replica {}): {}", u.instance, u.replica, u.reason);
    }
    for p in &plan.preempted {
        let standing = p.standing.map_or_else(String::new, |s| {
            format!(
                ", its owner's fair-share factors {:.3} (group) and {:.3} (user)",
                s.group, s.user
            )
        });
        let _ = writeln!(
            out,
            "preempts: {} of workflow {} (priority {}{standing}), freeing {}",
            p.id,
            p.workflow,
            p.priority,
            gib(p.frees)
        );
    }
    if explain {
        for i in &plan.instances {
            let _ = writeln!(
                out,
                "\n{} (replica {} of {}, {} × {} tokens) — {} · {}",
                i.instance, i.replica, i.replicas, i.concurrency, i.context, i.variant, i.quantization
            );
            for line in &i.why {
                let _ = writeln!(out, "  why: {line}");
            }
            for d in &i.devices {
                let gpu = d.gpu.map_or_else(|| "host".to_owned(), |g| format!("gpu {g}"));
                let _ = writeln!(
                    out,
                    "  {} {gpu} ({}): stage {} rank {}, layers {}, needs {} (reserves {}) of {} usable",
                    d.node,
                    d.name,
                    d.stage,
                    d.rank,
                    d.layers,
                    gib(d.need),
                    gib(d.reserved),
                    gib(d.usable)
                );
            }
            for r in &i.rejected {
                let _ = writeln!(out, "  not chosen: {} — {}", r.option, r.why);
            }
        }
        for e in &plan.excluded {
            let gpu = e.gpu.map_or_else(String::new, |g| format!(" gpu {g}"));
            let _ = writeln!(out, "left out: {}{gpu}: {}", e.node, e.reason);
        }
        let _ = writeln!(
            out,
            "\nsearch: {} candidates tried, {}",
            plan.search.steps,
            if plan.search.complete {
                "complete (no better plan among the candidates considered)"
            } else {
                "stopped at its budget (the best plan found)"
            }
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::path::PathBuf;

    use skein_agent::engine::host::{EngineHostConfig, launch_spec};
    use skein_orchestrator::run::launch::{Launch, start_instance};

    use super::*;

    /// The address each node of the fleet announces (its engines listen there).
    fn address(node: &str) -> &'static str {
        match node {
            "a100-box" => "10.0.0.10",
            "rtx-1" => "10.0.0.11",
            "rtx-2" => "10.0.0.12",
            "old-1" => "10.0.0.21",
            _ => "10.0.0.99",
        }
    }

    /// The command a node's agent runs for `start`, as `skein agent` builds it, with
    /// the model in a Hugging Face cache at `/hf` and the engine on `port`.
    fn command(node: &str, start: &skein_proto::agent::v1::StartInstance, port: u16) -> serde_json::Value {
        use skein_proto::agent::v1::start_instance::Engine;
        let files = match &start.engine {
            Some(Engine::Vllm(e)) => e.model.clone(),
            Some(Engine::LlamaCpp(e)) => e.model.clone(),
            Some(Engine::RayNode(e)) => e.model.clone(),
            _ => None,
        };
        let snapshot = files.map(|f| {
            PathBuf::from(format!(
                "/hf/models--{}/snapshots/{}",
                f.repo.replace('/', "--"),
                f.revision
            ))
        });
        let config = EngineHostConfig {
            skein: PathBuf::from("skein"),
            llama_server: PathBuf::from("llama-server"),
            vllm: PathBuf::from("vllm"),
            ray: PathBuf::from("ray"),
            rpc_server: PathBuf::from("rpc-server"),
            listen_host: address(node).to_owned(),
            simulated_gpus: false,
            devices: Vec::new(),
        };
        let spec = launch_spec(start, snapshot.as_deref(), &[], &config, port).expect("a launch spec");
        let command = spec.command().expect("a command");
        serde_json::json!({ "node": node, "instance": start.instance, "command": command.to_string() })
    }

    /// lab-research on the very mixed fleet splits the coder (vLLM over Ray) and the
    /// writer (llama.cpp over RPC) across nodes: the pieces each node starts, wave by
    /// wave, and then the serving engine, as the exact command lines the agents run.
    #[test]
    fn split_plans_of_the_mixed_fleet_start_their_pieces_in_order() {
        let snapshot = fleet_snapshot(Path::new("workflows/fleets/mixed.yaml")).expect("the fleet");
        let workflow = load_workflow(Path::new("workflows/lab-research.yaml")).expect("the workflow");
        let models: BTreeMap<_, _> = skein_testkit::models::reference_models()
            .into_iter()
            .map(|m| (m.repo.to_string(), m))
            .collect();
        let plan = skein_orchestrator::plan::plan(&PlanInput {
            workflow: &workflow,
            models: &models,
            adapters: &skein_orchestrator::plan::NO_ADAPTERS,
            graph: &snapshot,
            running: &[],
            settings: PlanSettings::default(),
        })
        .expect("a plan");
        let mut report = Vec::new();
        for planned in &plan.instances {
            let name = format!("r1-{}", planned.instance);
            let launch = start_instance(&name, planned, &models, &snapshot, 7).expect("a launch");
            let Launch::Split(split) = launch else { continue };
            let mut ready = BTreeMap::new();
            let mut steps = Vec::new();
            for wave in 0..split.waves() {
                let pieces = split.wave(wave, &ready).expect("the wave");
                let mut started = Vec::new();
                for (i, piece) in pieces.iter().enumerate() {
                    let port = 40_000 + (wave * 100 + i) as u16;
                    started.push(serde_json::json!({
                        "role": piece.role,
                        "held": piece.held,
                        "start": command(&piece.node, &piece.start, port),
                    }));
                    ready.insert(piece.name.clone(), format!("{}:{port}", address(&piece.node)));
                }
                steps.push(serde_json::json!({ format!("wave {wave}"): started }));
            }
            let serving = split.serving(&ready).expect("the serving command");
            steps.push(
                serde_json::json!({ "then": command(&split.node, &serving, 8000), "holds": split.serving_held() }),
            );
            report.push(serde_json::json!({ "instance": name, "engine": planned.engine, "steps": steps }));
        }
        assert_eq!(report.len(), 2, "the coder and the writer are split: {report:#?}");
        // Keys sorted: serde_json keeps insertion order in builds where another crate
        // turns on its `preserve_order` (the built-in engine's llguidance does).
        insta::with_settings!({ sort_maps => true }, {
            insta::assert_yaml_snapshot!(report);
        });
    }
}
