//! What a workflow asks of the fleet: model instances (agents that can share one), their
//! replicas, and which variants each may use.

use std::collections::BTreeMap;

use skein_dsl::ir::{Backend, ModelRequirement, Precision, WeightFormat, Workflow};
use skein_model_registry::catalog::{ModelInfo, Variant};
use skein_model_registry::{QuantMethod, WeightFormat as RegistryFormat};

use super::score::tier_of;

/// The key under which a requirement's [`ModelInfo`] is looked up: the repository, its
/// revision and its pinned variants. Agents with equal keys read the same catalog.
pub fn model_key(requirement: &ModelRequirement) -> String {
    let mut key = requirement.repo.clone();
    if let Some(revision) = &requirement.revision {
        key.push('@');
        key.push_str(revision);
    }
    let mut pins: Vec<String> = requirement
        .variants
        .iter()
        .map(|p| {
            let mut pin = p.repo.clone();
            if let Some(r) = &p.revision {
                pin.push('@');
                pin.push_str(r);
            }
            if let Some(f) = &p.file {
                pin.push(':');
                pin.push_str(f);
            }
            pin
        })
        .collect();
    pins.sort();
    for pin in pins {
        key.push_str(" +");
        key.push_str(&pin);
    }
    key
}

/// One model instance: one or more agents served by the same engine.
#[derive(Debug, Clone, PartialEq)]
pub struct Instance {
    /// The agents' names joined by `+`.
    pub name: String,
    /// Agents it serves.
    pub agents: Vec<String>,
    /// The catalog key ([`model_key`]).
    pub key: String,
    /// The combined requirement: the largest context, the summed concurrency, the
    /// highest minimum precision.
    pub requirement: ModelRequirement,
    /// Most GPUs one replica may span.
    pub max_gpus: Option<u32>,
}

/// Agents of `workflow` grouped into instances: agents with the same model key, formats,
/// preference, GPU constraints and engines share one instance (their context is the largest,
/// their concurrency the sum, their minimum precision the highest).
pub fn instances(workflow: &Workflow) -> Vec<Instance> {
    let mut groups: BTreeMap<(String, String), Instance> = BTreeMap::new();
    for (name, agent) in &workflow.agents {
        let Backend::Model(requirement) = &agent.backend else {
            continue;
        };
        let key = model_key(requirement);
        let compatibility = format!(
            "{key}|{:?}|{:?}|{:?}|{:?}",
            requirement.formats, requirement.prefer, requirement.gpu, requirement.engines
        );
        let max_gpus = requirement.gpu.max_gpus.or(workflow.placement.max_gpus_per_agent);
        match groups.get_mut(&(key.clone(), compatibility.clone())) {
            Some(instance) => {
                instance.name.push('+');
                instance.name.push_str(name);
                instance.agents.push(name.clone());
                let merged = &mut instance.requirement;
                merged.context = merged.context.max(requirement.context);
                merged.concurrency = merged.concurrency.saturating_add(requirement.concurrency);
                merged.min_precision = merged.min_precision.max(requirement.min_precision);
                instance.max_gpus = match (instance.max_gpus, max_gpus) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                };
            }
            None => {
                groups.insert(
                    (key.clone(), compatibility),
                    Instance {
                        name: name.clone(),
                        agents: vec![name.clone()],
                        key,
                        requirement: requirement.clone(),
                        max_gpus,
                    },
                );
            }
        }
    }
    let mut all: Vec<Instance> = groups.into_values().collect();
    all.sort_by(|a, b| a.name.cmp(&b.name));
    all
}

/// A variant an instance may use, or why not.
#[derive(Debug, Clone, PartialEq)]
pub enum VariantUse {
    /// Usable at this tier.
    Allowed(Precision),
    /// Excluded, with the reason.
    Excluded(String),
}

/// Whether `requirement` allows `variant`.
pub fn variant_use(requirement: &ModelRequirement, variant: &Variant) -> VariantUse {
    let format = match variant.format() {
        RegistryFormat::Safetensors => WeightFormat::Safetensors,
        RegistryFormat::Gguf => WeightFormat::Gguf,
    };
    if !requirement.formats.contains(&format) {
        return VariantUse::Excluded(format!("{} is not among the accepted formats", format.name()));
    }
    if !requirement.engines.is_empty() && !requirement.engines.iter().any(|e| e.loads(format)) {
        let names: Vec<&str> = requirement.engines.iter().map(|e| e.name()).collect();
        return VariantUse::Excluded(format!(
            "the workflow's engines ({}) cannot load {}",
            names.join(", "),
            format.name()
        ));
    }
    let Some(tier) = tier_of(&variant.quantization) else {
        return VariantUse::Excluded(format!("{} is below every precision tier", variant.quantization));
    };
    if tier < requirement.min_precision {
        return VariantUse::Excluded(format!("{tier} is below min_precision {}", requirement.min_precision));
    }
    VariantUse::Allowed(tier)
}

/// The lowest compute capability the engine's kernels for `variant` need on a GPU.
pub fn min_compute_capability(variant: &Variant) -> (u32, u32) {
    match (variant.format(), variant.quantization.method) {
        // llama.cpp's CUDA build runs on Maxwell and later.
        (RegistryFormat::Gguf, _) => (5, 2),
        // vLLM's AWQ kernels need Turing; its FP8 path (Marlin, weight-only) Ampere.
        (_, QuantMethod::Awq) => (7, 5),
        (_, QuantMethod::Fp8 | QuantMethod::Fp4) => (8, 0),
        // vLLM itself needs Volta.
        _ => (7, 0),
    }
}

/// The catalog of every instance, or the keys missing from `models`.
pub fn catalogs<'a>(
    instances: &[Instance],
    models: &'a BTreeMap<String, ModelInfo>,
) -> Result<Vec<&'a ModelInfo>, Vec<String>> {
    let mut missing = Vec::new();
    let mut found = Vec::new();
    for instance in instances {
        match models.get(&instance.key) {
            Some(info) => found.push(info),
            None => missing.push(instance.key.clone()),
        }
    }
    if missing.is_empty() { Ok(found) } else { Err(missing) }
}
