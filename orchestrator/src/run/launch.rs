//! From a plan to the commands agents get: one [`pb::StartInstance`] per placed replica,
//! with the files to download, the GPUs in rank order and the engine's settings. Pure.

use std::collections::BTreeMap;

use skein_model_registry::catalog::{ModelInfo, Variant};
use skein_model_registry::quant::QuantMethod;
use skein_proto::agent::v1 as pb;

use crate::graph::GraphSnapshot;
use crate::plan::PlannedInstance;

/// Files a safetensors snapshot needs beside its weights, fetched when present.
const SIDE_FILES: &[&str] = &[
    "tokenizer.json",
    "tokenizer_config.json",
    "generation_config.json",
    "special_tokens_map.json",
    "model.safetensors.index.json",
    "preprocessor_config.json",
    "chat_template.json",
];

/// llama.cpp's batch sizes, as the estimator assumed them.
const LLAMA_N_BATCH: u64 = 2048;
const LLAMA_N_UBATCH: u64 = 512;
/// vLLM's batched-token limit, as the estimator assumed it.
const VLLM_MAX_BATCHED_TOKENS: u64 = 2048;

/// Why a planned replica cannot be started.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LaunchPlanError {
    /// The variant is not in the catalog the plan was made with.
    #[error("variant `{0}` is not in the model catalog")]
    UnknownVariant(String),
    /// The replica spans several machines.
    #[error(
        "instance `{instance}` is split across nodes {nodes}; running one model across machines is not supported yet, so limit the agent to one node (gpu constraints) or add GPUs to one node"
    )]
    MultiNode {
        /// The instance.
        instance: String,
        /// The nodes.
        nodes: String,
    },
    /// The plan names an engine Skein does not start.
    #[error("instance `{instance}` is planned on engine `{engine}`, which Skein cannot start")]
    Engine {
        /// The instance.
        instance: String,
        /// The engine.
        engine: String,
    },
}

/// The variant a planned replica runs.
pub fn variant<'a>(models: &'a BTreeMap<String, ModelInfo>, id: &str) -> Option<&'a Variant> {
    models.values().flat_map(|m| m.variants.iter()).find(|v| v.id == id)
}

/// The node a replica runs on, and its start command named `name`.
///
/// Errors: [`LaunchPlanError`].
pub fn start_instance(
    name: &str,
    planned: &PlannedInstance,
    models: &BTreeMap<String, ModelInfo>,
    graph: &GraphSnapshot,
    seed: u64,
) -> Result<(String, pb::StartInstance), LaunchPlanError> {
    let variant =
        variant(models, &planned.variant).ok_or_else(|| LaunchPlanError::UnknownVariant(planned.variant.clone()))?;
    let mut nodes: Vec<&str> = planned.devices.iter().map(|d| d.node.as_str()).collect();
    nodes.dedup();
    let node = match nodes.as_slice() {
        [node] => (*node).to_owned(),
        _ => {
            return Err(LaunchPlanError::MultiNode {
                instance: planned.instance.clone(),
                nodes: nodes.join(", "),
            });
        }
    };
    let gpus: Vec<u32> = planned.devices.iter().filter_map(|d| d.gpu).collect();
    let gguf = variant
        .files
        .iter()
        .find(|f| f.ends_with(".gguf") && !is_projector(f))
        .cloned();
    let mmproj = variant.files.iter().find(|f| is_projector(f)).cloned();
    let mut files = ModelFilesBuilder::new(variant);
    let engine = match planned.engine.as_str() {
        "candle" => pb::start_instance::Engine::Candle(pb::CandleEngine {
            model: Some(files.build(gguf.is_none())),
            gguf: gguf.unwrap_or_default(),
            seed,
        }),
        "llama.cpp" => pb::start_instance::Engine::LlamaCpp(pb::LlamaCppEngine {
            model: Some(files.build(false)),
            gguf: gguf.unwrap_or_default(),
            mmproj,
            gpu_layers: planned.layout.gpu_layers,
            tensor_split: planned.layout.tensor_split.clone(),
            n_batch: LLAMA_N_BATCH,
            n_ubatch: LLAMA_N_UBATCH,
            flash_attention: true,
        }),
        "vllm" => {
            let total = planned
                .devices
                .iter()
                .filter_map(|d| {
                    let gpu = d.gpu?;
                    graph
                        .nodes
                        .iter()
                        .find(|n| n.inventory.name == d.node)
                        .and_then(|n| n.gpus.get(gpu as usize))
                        .map(|g| g.facts.memory_total)
                })
                .collect();
            files.optional.push("config.json".to_owned());
            pb::start_instance::Engine::Vllm(pb::VllmEngine {
                model: Some(files.build(true)),
                tensor_parallel: planned.layout.tensor_parallel,
                layer_partition: planned.layout.layer_partition.clone(),
                quantization: vllm_quantization(variant.quantization.method).map(str::to_owned),
                reserved: planned
                    .devices
                    .iter()
                    .filter(|d| d.gpu.is_some())
                    .map(|d| d.reserved)
                    .collect(),
                total,
                max_num_batched_tokens: VLLM_MAX_BATCHED_TOKENS,
                enforce_eager: false,
                kv_cache_dtype: None,
            })
        }
        other => {
            return Err(LaunchPlanError::Engine {
                instance: planned.instance.clone(),
                engine: other.to_owned(),
            });
        }
    };
    Ok((
        node,
        pb::StartInstance {
            instance: name.to_owned(),
            gpus,
            context: planned.context,
            concurrency: planned.concurrency,
            engine: Some(engine),
        },
    ))
}

fn is_projector(file: &str) -> bool {
    file.ends_with(".gguf") && file.rsplit('/').next().is_some_and(|f| f.contains("mmproj"))
}

struct ModelFilesBuilder<'a> {
    variant: &'a Variant,
    optional: Vec<String>,
}

impl<'a> ModelFilesBuilder<'a> {
    fn new(variant: &'a Variant) -> Self {
        ModelFilesBuilder {
            variant,
            optional: Vec::new(),
        }
    }

    /// The weight files; a safetensors snapshot also needs its config and tokenizer.
    fn build(&mut self, snapshot: bool) -> pb::ModelFiles {
        let mut files = self.variant.files.clone();
        let mut optional = std::mem::take(&mut self.optional);
        if snapshot {
            if !files.iter().any(|f| f == "config.json") {
                files.push("config.json".to_owned());
            }
            optional.retain(|f| f != "config.json");
            optional.extend(SIDE_FILES.iter().map(|f| (*f).to_owned()));
        } else {
            // The tokenizer of a GGUF file is inside it; candle still reads the repo's
            // tokenizer files when the repo has them.
            optional.extend(["tokenizer.json", "tokenizer_config.json"].map(str::to_owned));
        }
        pb::ModelFiles {
            repo: self.variant.repo.to_string(),
            revision: self.variant.sha.to_string(),
            files,
            optional_files: optional,
        }
    }
}

/// vLLM's `--quantization` for a method it does not always detect by itself.
fn vllm_quantization(method: QuantMethod) -> Option<&'static str> {
    match method {
        QuantMethod::Awq => Some("awq"),
        QuantMethod::Gptq => Some("gptq"),
        QuantMethod::Fp8 => Some("fp8"),
        QuantMethod::BitsAndBytes4 | QuantMethod::BitsAndBytes8 => Some("bitsandbytes"),
        QuantMethod::PackedInt => Some("compressed-tensors"),
        _ => None,
    }
}
