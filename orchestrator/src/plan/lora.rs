//! How a replica serves LoRA adapters on its base, for the plan: the adapters as engines
//! load them, and the reason that says what sharing one base instance saves.

use std::collections::BTreeMap;

use skein_model_registry::adapter::{AdapterFormat, AdapterInfo};
use skein_model_registry::estimate::{AdapterSize, Engine};

use super::demand::Instance;
use super::options::Cand;
use super::{PlannedAdapter, show};

/// The adapters `instance` serves, as engines load them.
pub(super) fn planned_adapters(instance: &Instance, adapters: &BTreeMap<String, AdapterInfo>) -> Vec<PlannedAdapter> {
    instance
        .adapters
        .iter()
        .filter_map(|a| {
            let info = adapters.get(&a.key)?;
            let (format, files) = match &info.format {
                AdapterFormat::Peft { config, weights } => ("peft", vec![config.clone(), weights.clone()]),
                AdapterFormat::Gguf { file, .. } => ("gguf", vec![file.clone()]),
            };
            Some(PlannedAdapter {
                name: a.key.clone(),
                repo: info.repo.to_string(),
                sha: info.sha.to_string(),
                format: format.to_owned(),
                files,
                rank: AdapterSize::of(info).rank,
                agents: a.agents.clone(),
            })
        })
        .collect()
}

/// How an instance serving LoRA adapters shares its base: what the adapters add on
/// its devices (and host RAM), against a copy of the base weights per adapter.
pub(super) fn adapters_line(instance: &Instance, c: &Cand) -> Option<String> {
    let n = instance.adapters.len() as u64;
    if n == 0 {
        return None;
    }
    let e = &c.estimate;
    let lines: Vec<u64> = e
        .devices
        .iter()
        .flat_map(|d| &d.items)
        .filter(|i| i.what == "LoRA adapters")
        .map(|i| i.bytes.get())
        .collect();
    let on_devices: u64 = lines.iter().sum();
    let per_device = lines.iter().copied().max().unwrap_or(0);
    let base = e.weights.loaded.get();
    let shared = base.saturating_add(on_devices);
    let copies = base.saturating_mul(n);
    let served: Vec<String> = instance
        .adapters
        .iter()
        .map(|a| format!("{} → {}", a.agents.join(", "), a.key))
        .collect();
    let engine = match e.engine {
        Engine::Vllm(_) => "vLLM's preallocated LoRA slots",
        _ => "llama.cpp's adapter tensors",
    };
    Some(format!(
        "serves {n} LoRA adapter{} on one base instance ({}): {engine} add {} on the devices (at most {} on one), \
         where a copy of the base per adapter would load its {} of weights {n} times ({}): sharing saves {}",
        if n == 1 { "" } else { "s" },
        served.join("; "),
        show(on_devices),
        show(per_device),
        show(base),
        show(copies),
        show(copies.saturating_sub(shared))
    ))
}
