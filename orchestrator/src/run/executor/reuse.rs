//! Reusing instances: what a model instance serves exactly ([`serves`], the warm key)
//! and what one being started is doing, for people.

use crate::instances::{InstanceState, InstanceView};

/// What an instance being started is doing, for people: `writer+editor: downloading 40%
/// on node-a`; a restart says why, from the engine's own report (`writer: restarting
/// (restart 2): exited with status 1 while loading; last log line: …`), and the
/// starts after it say which restart they are. Download progress goes in steps of 10 %,
/// so a run's record changes a few times per download, not per chunk.
pub(super) fn waiting_for(view: &InstanceView, state: InstanceState) -> String {
    let (done, total) = (view.downloaded, view.download_total);
    let doing = match state {
        InstanceState::Downloading if total > 0 => {
            format!("downloading {}%", (done.saturating_mul(10) / total).min(10) * 10)
        }
        InstanceState::Requested => "asked for".to_owned(),
        InstanceState::Restarting => format!("restarting (restart {}): {}", view.restarts, why(&view.detail)),
        InstanceState::Unhealthy => format!("unhealthy: {}", why(&view.detail)),
        other if view.restarts > 0 => format!("{other} (restart {})", view.restarts),
        other => other.name().to_owned(),
    };
    format!("{}: {doing} on {}", view.agents.join("+"), view.node_name)
}

/// The longest engine log line a run's progress quotes.
pub(super) const WHY_LINE_CHARS: usize = 240;

/// An engine's failure report (`exited with status 1 while loading; last log
/// lines:` and the lines) on one line: the reason and the last line the engine wrote.
pub(super) fn why(detail: &str) -> String {
    let (reason, tail) = detail.split_once(skein_proto::LAST_LOG_LINES).unwrap_or((detail, ""));
    let reason = reason.lines().next().unwrap_or_default().trim();
    let reason = if reason.is_empty() {
        "no reason reported"
    } else {
        reason
    };
    match tail.lines().map(str::trim).rfind(|line| !line.is_empty()) {
        Some(last) => {
            let mut shown: String = last.chars().take(WHY_LINE_CHARS).collect();
            if shown.len() < last.len() {
                shown.push('…');
            }
            format!("{reason}; last log line: {shown}")
        }
        None => reason.to_owned(),
    }
}

/// What a model instance serves, exactly: a warm instance is reused only by a run
/// whose agents need the same model, requirement and constraints.
pub(super) fn warm_key(instance: &crate::plan::demand::Instance) -> String {
    format!("{}|{:?}|{:?}", instance.key, instance.requirement, instance.max_gpus)
}

/// Whether a session or request may use a model's context of the language's default.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContextWanted {
    /// The agent's context was asked for: the instance must hold at least as much.
    AtLeast,
    /// A model named alone: any context of an instance of the model will do (the
    /// history sent is then cut to the instance's context).
    Any,
}

/// Whether the ready instance `view` serves `wanted` (a session's or a request's model
/// instance) exactly enough to be shared (docs/sessions.md, "Which instance serves"):
/// the same repository, revision and pinned variants; a variant whose format, precision
/// tier and engine `wanted` accepts; at least its context (unless [`ContextWanted::Any`]);
/// the same GPU constraints, or none asked, and no more GPUs than it allows. Concurrency
/// and preference do not count: a session or a request is one sequence more. Every LoRA
/// adapter `wanted` names must be loaded in it.
pub fn serves(view: &InstanceView, wanted: &crate::plan::demand::Instance, context: ContextWanted) -> bool {
    let (Some(has), Some(planned)) = (view.serves.as_deref(), view.placement.as_deref()) else {
        return false;
    };
    let asked = &wanted.requirement;
    let format = if planned.variant.to_ascii_lowercase().ends_with(".gguf") {
        skein_dsl::ir::WeightFormat::Gguf
    } else {
        skein_dsl::ir::WeightFormat::Safetensors
    };
    let gpus = planned.devices.iter().filter(|d| d.gpu.is_some()).count();
    has.key == wanted.key
        && asked.formats.contains(&format)
        && planned.precision >= asked.min_precision
        && (asked.engines.is_empty() || asked.engines.iter().any(|e| e.plan_name() == planned.engine))
        && (context == ContextWanted::Any || planned.context >= u64::from(asked.context))
        && (asked.gpu == skein_dsl::ir::GpuConstraints::default() || asked.gpu == has.requirement.gpu)
        && wanted.max_gpus.is_none_or(|most| gpus <= most as usize)
        // Every adapter wanted is loaded in it (an engine loads its adapters at start).
        && wanted
            .adapters
            .iter()
            .all(|a| planned.adapters.iter().any(|p| p.name == a.key))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::graph::NodeId;
    use crate::instances::{InstanceRequest, Instances};
    use crate::plan::demand;

    /// The model instance of a one-agent workflow whose agent reads `model`.
    fn wanted(model: &str) -> demand::Instance {
        let text =
            format!("name: w\nagents:\n  a: {{ model: {model} }}\nsteps:\n  - {{ id: s, agent: a, prompt: x }}\n");
        let parsed = skein_dsl::parse("w.yaml", &text);
        let workflow = parsed.workflow.unwrap_or_else(|| panic!("{:?}", parsed.diagnostics));
        demand::instances(&workflow).remove(0)
    }

    /// A ready instance started for `started`, planned on the CPU with `context`, the
    /// variant `variant` at `precision` on `engine`.
    fn instance(started: &str, context: u64, variant: &str, precision: &str, engine: &str) -> InstanceView {
        let instances = Instances::default();
        let serves = Arc::new(wanted(started));
        let planned: crate::plan::PlannedInstance = serde_json::from_value(serde_json::json!({
            "instance": "a", "agents": ["a"], "model": serves.requirement.repo, "replica": 1, "replicas": 1,
            "context": context, "concurrency": 1, "variant": variant, "precision": precision,
            "quantization": "x", "engine": engine, "family": "cpu",
            "layout": {"tensor_parallel": 1, "pipeline_stages": 1, "layer_partition": []},
            "devices": [], "tokens_per_s": 1.0, "slow": true, "score": 0, "why": [], "rejected": [],
        }))
        .unwrap();
        let _not_connected = instances.start(InstanceRequest {
            node: NodeId("n".to_owned()),
            node_name: "n".to_owned(),
            run: None,
            agents: vec!["a".to_owned()],
            engine: engine.to_owned(),
            variant: variant.to_owned(),
            estimated_bytes: 0,
            held: Vec::new(),
            warm_key: warm_key(&serves),
            serves: Some(serves),
            clone_of: None,
            placement: Some(Arc::new(planned)),
            part_of: None,
            start: skein_proto::agent::v1::StartInstance {
                instance: "i".to_owned(),
                ..Default::default()
            },
        });
        instances.get("i").unwrap()
    }

    #[test]
    fn an_instance_serves_the_same_model_within_what_it_was_planned_for() {
        let run = instance("{ repo: o/m, context: 256 }", 256, "o/m", "fp32", "candle");
        // Concurrency and preference do not count; a smaller context does.
        assert!(serves(
            &run,
            &wanted("{ repo: o/m, context: 128, concurrency: 4 }"),
            ContextWanted::AtLeast
        ));
        assert!(serves(
            &run,
            &wanted("{ repo: o/m, context: 256, prefer: speed }"),
            ContextWanted::AtLeast
        ));
        // More context than it holds: only when none was asked (a model named alone).
        assert!(!serves(&run, &wanted("o/m"), ContextWanted::AtLeast));
        assert!(serves(&run, &wanted("o/m"), ContextWanted::Any));
        // Another model, revision or pinned variant.
        assert!(!serves(&run, &wanted("p/m"), ContextWanted::Any));
        assert!(!serves(
            &run,
            &wanted("{ repo: o/m, revision: v2 }"),
            ContextWanted::Any
        ));
        // A variant the request does not accept: format, precision, engine.
        assert!(!serves(
            &run,
            &wanted("{ repo: o/m, formats: [gguf] }"),
            ContextWanted::Any
        ));
        assert!(!serves(
            &run,
            &wanted("{ repo: o/m, engines: [llama.cpp] }"),
            ContextWanted::Any
        ));
        let gguf = instance(
            "{ repo: o/m, formats: [gguf] }",
            4096,
            "o/m:m-Q4_K_M.gguf",
            "int4",
            "llama.cpp",
        );
        assert!(serves(
            &gguf,
            &wanted("{ repo: o/m, formats: [gguf] }"),
            ContextWanted::AtLeast
        ));
        assert!(!serves(
            &gguf,
            &wanted("{ repo: o/m, min_precision: int8 }"),
            ContextWanted::Any
        ));
        // Other GPU constraints than it was placed under; none asked is fine.
        assert!(!serves(
            &run,
            &wanted("{ repo: o/m, gpu: { models: [A100] } }"),
            ContextWanted::Any
        ));
        let a100 = instance("{ repo: o/m, gpu: { models: [A100] } }", 4096, "o/m", "bf16", "vllm");
        assert!(serves(&a100, &wanted("o/m"), ContextWanted::AtLeast));
        assert!(serves(
            &a100,
            &wanted("{ repo: o/m, gpu: { models: [A100] } }"),
            ContextWanted::AtLeast
        ));
    }
}
