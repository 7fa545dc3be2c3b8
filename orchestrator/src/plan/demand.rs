//! What a workflow asks of the fleet: model instances (agents that can share one), their
//! replicas, and which variants each may use.

use std::collections::BTreeMap;

use skein_dsl::ir::{Backend, EngineChoice, ModelRequirement, Precision, VariantPin, WeightFormat, Workflow};
use skein_model_registry::adapter::{AdapterFormat, AdapterInfo};
use skein_model_registry::catalog::{ModelInfo, Variant};
use skein_model_registry::estimate::AdapterSize;
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
    let mut pins: Vec<String> = requirement.variants.iter().map(pin_key).collect();
    pins.sort();
    for pin in pins {
        key.push_str(" +");
        key.push_str(&pin);
    }
    key
}

/// A pin as one string: `repo`, `repo@revision`, `repo:file`, `repo@revision:file`. An
/// adapter's is the key its [`AdapterInfo`] is looked up under.
pub fn pin_key(pin: &VariantPin) -> String {
    let mut key = pin.repo.clone();
    if let Some(r) = &pin.revision {
        key.push('@');
        key.push_str(r);
    }
    if let Some(f) = &pin.file {
        key.push(':');
        key.push_str(f);
    }
    key
}

/// The key of the LoRA adapter `agent` names ([`pin_key`]), if it names one.
pub fn adapter_key(agent: &skein_dsl::ir::Agent) -> Option<String> {
    match &agent.backend {
        skein_dsl::ir::Backend::Model(model) => model.adapter.as_deref().map(pin_key),
        skein_dsl::ir::Backend::Endpoint(_) => None,
    }
}

/// A LoRA adapter an instance serves, and the agents it serves it to.
#[derive(Debug, Clone, PartialEq)]
pub struct InstanceAdapter {
    /// Its key ([`pin_key`]).
    pub key: String,
    /// As the workflow names it.
    pub pin: VariantPin,
    /// The agents served with it.
    pub agents: Vec<String>,
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
    /// The LoRA adapters it serves besides its base model, by key; agents without one
    /// are served the base model.
    pub adapters: Vec<InstanceAdapter>,
    /// Their sizes, in the order of `adapters`, once [`attach_adapters`] read them.
    pub adapter_sizes: Vec<AdapterSize>,
}

impl Instance {
    /// The adapter `agent` is served with, if any.
    pub fn adapter_of(&self, agent: &str) -> Option<&InstanceAdapter> {
        self.adapters.iter().find(|a| a.agents.iter().any(|x| x == agent))
    }

    fn add_adapter(&mut self, agent: &str, pin: Option<&VariantPin>) {
        let Some(pin) = pin else { return };
        let key = pin_key(pin);
        match self.adapters.iter_mut().find(|a| a.key == key) {
            Some(known) => known.agents.push(agent.to_owned()),
            None => self.adapters.push(InstanceAdapter {
                key,
                pin: pin.clone(),
                agents: vec![agent.to_owned()],
            }),
        }
    }
}

/// Agents of `workflow` grouped into instances: agents with the same model key, formats,
/// preference, GPU constraints and engines share one instance (their context is the largest,
/// their concurrency the sum, their minimum precision the highest), whatever LoRA
/// adapters they name: the instance serves the base model and all their adapters.
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
                instance.add_adapter(name, requirement.adapter.as_deref());
            }
            None => {
                let mut instance = Instance {
                    name: name.clone(),
                    agents: vec![name.clone()],
                    key: key.clone(),
                    requirement: ModelRequirement {
                        adapter: None,
                        ..requirement.clone()
                    },
                    max_gpus,
                    adapters: Vec::new(),
                    adapter_sizes: Vec::new(),
                };
                instance.add_adapter(name, requirement.adapter.as_deref());
                groups.insert((key, compatibility), instance);
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

/// Checks that no step prompts an agent whose model only embeds ([`ModelInfo::task`]):
/// such an engine starts in pooling mode and answers embeddings only.
///
/// Errors: [`PlanError::PromptsEmbedder`](super::PlanError::PromptsEmbedder) for the
/// first such step.
pub fn check_prompts(
    workflow: &Workflow,
    instances: &[Instance],
    infos: &[&ModelInfo],
) -> Result<(), super::PlanError> {
    for step in workflow.steps.iter().filter(|s| !s.agent.is_empty()) {
        let embedder = instances
            .iter()
            .zip(infos)
            .find(|(i, info)| info.task.is_embed() && i.agents.contains(&step.agent));
        if let Some((instance, _)) = embedder {
            return Err(super::PlanError::PromptsEmbedder {
                step: step.id.clone(),
                agent: step.agent.clone(),
                model: instance.requirement.repo.clone(),
            });
        }
    }
    Ok(())
}

/// Why the adapters of a workflow cannot be served.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AdapterPlanError {
    /// An adapter's catalog was not given.
    #[error("no adapter read for {0}: inspect it first")]
    Missing(String),
    /// An adapter of another base model.
    #[error(
        "adapter `{adapter}` (agents {agents}) adapts `{base}`, not `{model}`; help: name the adapter's base model as the agents' `model`, or an adapter trained on `{model}`"
    )]
    OtherBase {
        /// The adapter.
        adapter: String,
        /// Its agents.
        agents: String,
        /// The base it names.
        base: String,
        /// The agents' model.
        model: String,
    },
    /// Adapters one engine cannot serve together, or that the agents' engines cannot
    /// serve.
    #[error("{0}")]
    Engines(String),
}

/// Reads the size of each instance's adapters from `adapters` (by [`pin_key`]) and
/// limits its engines to the one that serves them: vLLM a PEFT adapter, llama.cpp a
/// GGUF one (the built-in engine loads no adapters).
///
/// Errors: [`AdapterPlanError::Missing`]; [`AdapterPlanError::OtherBase`] for an
/// adapter whose recorded base model is another hub repository; and
/// [`AdapterPlanError::Engines`] for PEFT and GGUF adapters on one instance, or an
/// adapter the agents' `engines:` rule out.
pub fn attach_adapters(
    instances: &mut [Instance],
    adapters: &BTreeMap<String, AdapterInfo>,
) -> Result<(), AdapterPlanError> {
    for instance in instances.iter_mut() {
        if instance.adapters.is_empty() {
            continue;
        }
        let mut sizes = Vec::with_capacity(instance.adapters.len());
        let mut engines: Vec<(EngineChoice, &InstanceAdapter)> = Vec::new();
        for adapter in &instance.adapters {
            let info = adapters
                .get(&adapter.key)
                .ok_or_else(|| AdapterPlanError::Missing(adapter.key.clone()))?;
            if let Some(base) = info.base_model.as_ref().and_then(|b| b.repo.as_ref())
                && !base.as_str().eq_ignore_ascii_case(&instance.requirement.repo)
            {
                return Err(AdapterPlanError::OtherBase {
                    adapter: adapter.key.clone(),
                    agents: adapter.agents.join(", "),
                    base: base.to_string(),
                    model: instance.requirement.repo.clone(),
                });
            }
            sizes.push(AdapterSize::of(info));
            let engine = match info.format {
                AdapterFormat::Peft { .. } => EngineChoice::Vllm,
                AdapterFormat::Gguf { .. } => EngineChoice::LlamaCpp,
            };
            engines.push((engine, adapter));
        }
        let engine = engines[0].0;
        if let Some((other, odd)) = engines.iter().find(|(e, _)| *e != engine) {
            let first = engines[0].1;
            return Err(AdapterPlanError::Engines(format!(
                "agents {} and {} share one instance of `{}`, but adapter `{}` is served by {} and `{}` by {}: \
                 one engine cannot serve both; help: use adapters of one format (PEFT safetensors for vLLM, \
                 GGUF for llama.cpp) for agents that share a base",
                first.agents.join(", "),
                odd.agents.join(", "),
                instance.requirement.repo,
                first.key,
                engine.name(),
                odd.key,
                other.name()
            )));
        }
        let requirement = &mut instance.requirement;
        if !requirement.engines.is_empty() && !requirement.engines.contains(&engine) {
            let listed: Vec<&str> = requirement.engines.iter().map(|e| e.name()).collect();
            return Err(AdapterPlanError::Engines(format!(
                "agents {} name LoRA adapters only {} serves (`{}`), but their `engines` are {}; \
                 help: add `{}` to `engines`",
                instance.agents.join(", "),
                engine.name(),
                engines[0].1.key,
                listed.join(", "),
                engine.name()
            )));
        }
        requirement.engines = vec![engine];
        instance.adapter_sizes = sizes;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use skein_testkit::adapters::{LLAMA_3_8B_INSTRUCT, LLAMA_3_8B_INSTRUCT_CONFIG, PeftAdapter};

    fn workflow(agents: &str) -> Workflow {
        let text = format!("name: w\nagents:\n{agents}\nsteps:\n  - {{ id: s, agent: a, prompt: hi }}\n");
        let parsed = skein_dsl::parse("w.yaml", &text);
        parsed.workflow.unwrap_or_else(|| panic!("{:?}", parsed.diagnostics))
    }

    fn adapter(repo: &str, base: &str) -> (String, AdapterInfo) {
        let info = PeftAdapter::new(repo, base, LLAMA_3_8B_INSTRUCT_CONFIG, 8).info();
        (repo.to_owned(), info)
    }

    /// Agents on adapters of one base share one instance with the agents on the base
    /// alone; one adapter named by two agents is served once; the engines become vLLM's.
    #[test]
    fn agents_on_adapters_of_one_base_share_one_instance() {
        let w = workflow(&format!(
            "  a: {{ model: {{ repo: {LLAMA_3_8B_INSTRUCT}, adapter: lab/one }} }}\n  \
               b: {{ model: {{ repo: {LLAMA_3_8B_INSTRUCT}, adapter: lab/two }} }}\n  \
               c: {{ model: {{ repo: {LLAMA_3_8B_INSTRUCT}, adapter: lab/one }} }}\n  \
               d: {{ model: {LLAMA_3_8B_INSTRUCT} }}"
        ));
        let mut all = instances(&w);
        assert_eq!(all.len(), 1);
        let adapters = BTreeMap::from([
            adapter("lab/one", LLAMA_3_8B_INSTRUCT),
            adapter("lab/two", LLAMA_3_8B_INSTRUCT),
        ]);
        attach_adapters(&mut all, &adapters).unwrap();
        let instance = &all[0];
        assert_eq!(instance.name, "a+b+c+d");
        assert_eq!(instance.requirement.concurrency, 4);
        assert_eq!(instance.requirement.adapter, None);
        assert_eq!(instance.requirement.engines, vec![EngineChoice::Vllm]);
        let keys: Vec<(&str, Vec<&str>)> = instance
            .adapters
            .iter()
            .map(|a| (a.key.as_str(), a.agents.iter().map(String::as_str).collect()))
            .collect();
        assert_eq!(keys, [("lab/one", vec!["a", "c"]), ("lab/two", vec!["b"])]);
        assert_eq!(instance.adapter_sizes.len(), 2);
        assert_eq!(instance.adapter_of("c").map(|a| a.key.as_str()), Some("lab/one"));
        assert!(instance.adapter_of("d").is_none());
    }

    #[test]
    fn adapters_that_cannot_be_served_are_refused_with_what_to_do() {
        let w = workflow(&format!(
            "  a: {{ model: {{ repo: {LLAMA_3_8B_INSTRUCT}, adapter: lab/one }} }}"
        ));
        let missing = attach_adapters(&mut instances(&w), &BTreeMap::new()).unwrap_err();
        assert_eq!(missing, AdapterPlanError::Missing("lab/one".to_owned()));

        let other = BTreeMap::from([adapter("lab/one", "Qwen/Qwen2.5-7B-Instruct")]);
        let err = attach_adapters(&mut instances(&w), &other).unwrap_err().to_string();
        assert!(
            err.contains("adapts `Qwen/Qwen2.5-7B-Instruct`, not `meta-llama/Meta-Llama-3-8B-Instruct`"),
            "{err}"
        );
        assert!(err.contains("help: "), "{err}");

        let gguf_only = workflow(&format!(
            "  a: {{ model: {{ repo: {LLAMA_3_8B_INSTRUCT}, adapter: lab/one, engines: llama.cpp }} }}"
        ));
        let ours = BTreeMap::from([adapter("lab/one", LLAMA_3_8B_INSTRUCT)]);
        let err = attach_adapters(&mut instances(&gguf_only), &ours)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("only vllm serves (`lab/one`), but their `engines` are llama.cpp"),
            "{err}"
        );
        assert!(err.contains("help: add `vllm` to `engines`"), "{err}");
    }
}
