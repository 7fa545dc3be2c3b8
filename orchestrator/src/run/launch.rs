//! From a plan to the commands agents get: one [`pb::StartInstance`] per placed replica,
//! with the files to download, the GPUs in rank order and the engine's settings; for a
//! replica split across nodes, a [`SplitLaunch`]: the pieces each node starts (Ray nodes
//! or llama.cpp RPC servers), in order, and the serving engine's command once their
//! addresses are known. Pure.

use std::collections::{BTreeMap, BTreeSet};

use sha2::{Digest, Sha256};
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
    /// The replica spans several machines on an engine that cannot.
    #[error(
        "instance `{instance}` is split across nodes {nodes} on engine `{engine}`, which runs on one machine only; split models run on vLLM (over Ray) or llama.cpp (over RPC)"
    )]
    MultiNode {
        /// The instance.
        instance: String,
        /// The nodes.
        nodes: String,
        /// The engine.
        engine: String,
    },
    /// A tensor-parallel group of the plan spans nodes: vLLM's ranks over Ray keep each
    /// pipeline stage on one node.
    #[error(
        "instance `{instance}`: pipeline stage {stage} spans nodes {nodes}; a tensor-parallel group must be on one node"
    )]
    StageSpansNodes {
        /// The instance.
        instance: String,
        /// The stage.
        stage: usize,
        /// Its nodes.
        nodes: String,
    },
    /// A piece the serving engine needs has reported no address.
    #[error("instance `{instance}`: piece `{piece}` has not reported its address")]
    NoAddress {
        /// The instance.
        instance: String,
        /// The piece.
        piece: String,
    },
    /// A node's GPUs are not together in the plan's order: llama.cpp over RPC and vLLM
    /// over Ray number one node's devices together, so a node cannot hold stages on both
    /// sides of another node's.
    #[error(
        "instance `{instance}`: node `{node}` holds stages on both sides of another node's; a split engine needs each node's layers together"
    )]
    Interleaved {
        /// The instance.
        instance: String,
        /// The node.
        node: String,
    },
    /// LoRA adapters on a vLLM engine split across machines over Ray: every rank loads
    /// the adapters from its own node, and only the serving node downloads them.
    #[error(
        "instance `{instance}` serves LoRA adapters and is split across nodes {nodes} on vLLM over Ray, whose ranks on other nodes could not read the adapters; help: give the base model a `constraints` that keeps it on one node, or more memory per node"
    )]
    AdaptersAcrossNodes {
        /// The instance.
        instance: String,
        /// The nodes.
        nodes: String,
    },
    /// An adapter of the plan that no engine flag can carry (a rank above vLLM's 512).
    #[error("instance `{instance}`: {why}")]
    Adapter {
        /// The instance.
        instance: String,
        /// What is wrong.
        why: String,
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

/// How a planned replica is started.
#[derive(Debug, Clone, PartialEq)]
pub enum Launch {
    /// One engine process on one node.
    One {
        /// The node's name.
        node: String,
        /// Its command.
        start: pb::StartInstance,
    },
    /// An engine split across nodes: pieces first, then the serving engine.
    Split(SplitLaunch),
}

/// The distributed runtime that joins the nodes of a split replica.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SplitRuntime {
    /// vLLM over a Ray cluster: the head on the serving node, a worker on every other;
    /// `vllm serve --distributed-executor-backend ray` on the head once all have joined.
    Ray,
    /// llama.cpp's RPC: an `rpc-server` per GPU of the other nodes, then `llama-server
    /// --rpc …` on the serving node with its own GPUs.
    Rpc,
}

/// The GPUs of one node of a split replica, in the plan's rank order.
#[derive(Debug, Clone, PartialEq)]
struct NodeShare {
    node: String,
    gpus: Vec<ShareGpu>,
}

/// One GPU of a split replica.
#[derive(Debug, Clone, Copy, PartialEq)]
struct ShareGpu {
    index: u32,
    reserved: u64,
    total: u64,
    /// Its pipeline stage.
    stage: usize,
    /// Its share of llama.cpp's `--tensor-split` (0 when there is none).
    split: u64,
}

/// A piece of a split replica to start on a node.
#[derive(Debug, Clone, PartialEq)]
pub struct PieceStart {
    /// Its instance name: `{replica}.{role}-{n}`.
    pub name: String,
    /// `ray-head`, `ray-worker` or `rpc-server`.
    pub role: &'static str,
    /// The node's name.
    pub node: String,
    /// Bytes the plan reserved on each GPU it serves.
    pub held: Vec<(u32, u64)>,
    /// Its command.
    pub start: pb::StartInstance,
}

/// A replica split across nodes: its pieces, started wave by wave (each wave once the
/// previous one is ready, since it needs their addresses), then the serving engine: over
/// Ray on the first node of the plan (the one with most of the model), over RPC on the
/// node of the last stage (llama.cpp's own GPUs come after the RPC servers' devices).
#[derive(Debug, Clone, PartialEq)]
pub struct SplitLaunch {
    /// The runtime.
    pub runtime: SplitRuntime,
    /// The replica's name.
    pub instance: String,
    /// The serving node.
    pub node: String,
    /// The serving command as if every GPU were on the serving node; [`SplitLaunch::serving`]
    /// makes it the real one.
    template: pb::StartInstance,
    /// The serving node first, then the others in plan order (over RPC the serving node is
    /// the plan's last).
    shares: Vec<NodeShare>,
}

/// The node a replica runs on and its start command named `name`, or its pieces when the
/// plan splits it across nodes.
///
/// Errors: [`LaunchPlanError`].
pub fn start_instance(
    name: &str,
    planned: &PlannedInstance,
    models: &BTreeMap<String, ModelInfo>,
    graph: &GraphSnapshot,
    seed: u64,
) -> Result<Launch, LaunchPlanError> {
    let variant =
        variant(models, &planned.variant).ok_or_else(|| LaunchPlanError::UnknownVariant(planned.variant.clone()))?;
    let mut nodes: Vec<&str> = planned.devices.iter().map(|d| d.node.as_str()).collect();
    nodes.dedup();
    let Some(node) = nodes.first().map(|n| (*n).to_owned()) else {
        return Err(LaunchPlanError::MultiNode {
            instance: planned.instance.clone(),
            nodes: String::new(),
            engine: planned.engine.clone(),
        });
    };
    let gpus: Vec<u32> = planned.devices.iter().filter_map(|d| d.gpu).collect();
    let gguf = variant
        .files
        .iter()
        .find(|f| f.ends_with(".gguf") && !is_projector(f))
        .cloned();
    let mmproj = variant.files.iter().find(|f| is_projector(f)).cloned();
    let mut files = ModelFilesBuilder::new(variant);
    let adapters = lora_adapters(planned);
    // vLLM's slots, as the estimator sized them: one per adapter, of the smallest rank
    // it accepts that holds the largest.
    let (max_loras, max_lora_rank) = match planned.adapters.iter().map(|a| a.rank).max() {
        None => (0, 0),
        Some(rank) => {
            let slot =
                skein_model_registry::estimate::vllm_max_lora_rank(rank).ok_or_else(|| LaunchPlanError::Adapter {
                    instance: planned.instance.clone(),
                    why: format!("an adapter of rank {rank} is beyond vLLM's largest --max-lora-rank (512)"),
                })?;
            (planned.adapters.len() as u64, slot)
        }
    };
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
            rpc_servers: Vec::new(),
        }),
        "vllm" => {
            let total = planned.devices.iter().filter_map(|d| memory_total(graph, d)).collect();
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
                ray_address: None,
                kv_cache_bytes: planned.layout.kv_cache_bytes,
                tool_call_parser: models
                    .values()
                    .find(|m| m.variants.iter().any(|v| v.id == planned.variant))
                    .and_then(|m| crate::plan::tool_call_format(m.architecture()))
                    .map(str::to_owned),
                max_loras,
                max_lora_rank,
            })
        }
        other => {
            return Err(LaunchPlanError::Engine {
                instance: planned.instance.clone(),
                engine: other.to_owned(),
            });
        }
    };
    let start = pb::StartInstance {
        instance: name.to_owned(),
        gpus,
        context: planned.context,
        concurrency: planned.concurrency,
        // Made by `Instances` when it starts the instance.
        engine_api_key: String::new(),
        adapters,
        embeddings: embeddings(planned),
        engine: Some(engine),
    };
    let distinct: BTreeSet<&str> = nodes.iter().copied().collect();
    if distinct.len() == 1 {
        return Ok(Launch::One { node, start });
    }
    let runtime = match planned.engine.as_str() {
        "vllm" if !planned.adapters.is_empty() => {
            return Err(LaunchPlanError::AdaptersAcrossNodes {
                instance: planned.instance.clone(),
                nodes: nodes.join(", "),
            });
        }
        "vllm" => SplitRuntime::Ray,
        "llama.cpp" => SplitRuntime::Rpc,
        other => {
            return Err(LaunchPlanError::MultiNode {
                instance: planned.instance.clone(),
                nodes: nodes.join(", "),
                engine: other.to_owned(),
            });
        }
    };
    let mut shares: Vec<NodeShare> = Vec::new();
    for (i, d) in planned.devices.iter().filter(|d| d.gpu.is_some()).enumerate() {
        let Some(index) = d.gpu else { continue };
        let entry = ShareGpu {
            index,
            reserved: d.reserved,
            total: memory_total(graph, d).unwrap_or(0),
            stage: d.stage,
            split: planned.layout.tensor_split.get(i).copied().unwrap_or(0),
        };
        match shares.iter_mut().find(|s| s.node == d.node) {
            Some(share) => share.gpus.push(entry),
            None => shares.push(NodeShare {
                node: d.node.clone(),
                gpus: vec![entry],
            }),
        }
    }
    // Both runtimes number a node's devices together (llama.cpp: an RPC server's, then
    // the next; vLLM: a node's ranks, then the next node's), so a node cannot hold
    // stages on both sides of another node's.
    if shares.len() != nodes.len() {
        let repeated = nodes.iter().enumerate().find(|(i, n)| nodes[..*i].contains(n));
        return Err(LaunchPlanError::Interleaved {
            instance: planned.instance.clone(),
            node: repeated.map(|(_, n)| (*n).to_owned()).unwrap_or_default(),
        });
    }
    if runtime == SplitRuntime::Rpc {
        // llama.cpp numbers the RPC servers' devices first (in `--rpc` order) and its own
        // GPUs last, and gives the last device the output layer: the node of the last
        // stage serves, and the others' GPUs lead in plan order.
        shares.rotate_right(1);
    }
    if runtime == SplitRuntime::Ray {
        // Each stage on one node: vLLM gives a node's ranks whole stages.
        for stage in 0..planned.layout.pipeline_stages.max(1) {
            let on: BTreeSet<&str> = planned
                .devices
                .iter()
                .filter(|d| d.stage == stage)
                .map(|d| d.node.as_str())
                .collect();
            if on.len() > 1 {
                return Err(LaunchPlanError::StageSpansNodes {
                    instance: planned.instance.clone(),
                    stage,
                    nodes: on.into_iter().collect::<Vec<_>>().join(", "),
                });
            }
        }
    }
    Ok(Launch::Split(SplitLaunch {
        runtime,
        instance: name.to_owned(),
        node: shares[0].node.clone(),
        template: start,
        shares,
    }))
}

impl SplitLaunch {
    /// The serving command as planned, as if every GPU were on the serving node.
    pub fn template(&self) -> &pb::StartInstance {
        &self.template
    }

    /// How many waves of pieces start before the serving engine.
    pub fn waves(&self) -> usize {
        match self.runtime {
            SplitRuntime::Ray => 2,
            SplitRuntime::Rpc => 1,
        }
    }

    fn held(share: &NodeShare) -> Vec<(u32, u64)> {
        share.gpus.iter().map(|g| (g.index, g.reserved)).collect()
    }

    /// The names of its pieces, in start order.
    pub fn piece_names(&self) -> Vec<String> {
        match self.runtime {
            SplitRuntime::Ray => (0..self.shares.len())
                .map(|n| self.piece_name(if n == 0 { "ray-head" } else { "ray-worker" }, n))
                .collect(),
            SplitRuntime::Rpc => self.rpc_servers().into_iter().map(|p| p.name).collect(),
        }
    }

    fn piece_name(&self, role: &str, n: usize) -> String {
        format!("{}.{role}-{n}", self.instance)
    }

    fn piece(
        &self,
        role: &'static str,
        n: usize,
        share: &NodeShare,
        gpus: Vec<u32>,
        engine: pb::start_instance::Engine,
    ) -> PieceStart {
        let name = self.piece_name(role, n);
        PieceStart {
            role,
            node: share.node.clone(),
            held: Self::held(share)
                .into_iter()
                .filter(|(g, _)| gpus.contains(g))
                .collect(),
            start: pb::StartInstance {
                instance: name.clone(),
                gpus,
                context: self.template.context,
                concurrency: self.template.concurrency,
                // A piece speaks no HTTP: it has no key, and serves no adapter.
                engine_api_key: String::new(),
                adapters: Vec::new(),
                embeddings: None,
                engine: Some(engine),
            },
            name,
        }
    }

    fn model_files(&self) -> Option<pb::ModelFiles> {
        match &self.template.engine {
            Some(pb::start_instance::Engine::Vllm(v)) => v.model.clone(),
            Some(pb::start_instance::Engine::LlamaCpp(l)) => l.model.clone(),
            _ => None,
        }
    }

    /// The pieces of wave `wave` (0-based), given the addresses (`HOST:PORT`) of the
    /// pieces of earlier waves, by name.
    ///
    /// Errors: [`LaunchPlanError::NoAddress`] when an earlier piece it needs has none.
    pub fn wave(&self, wave: usize, ready: &BTreeMap<String, String>) -> Result<Vec<PieceStart>, LaunchPlanError> {
        match (self.runtime, wave) {
            (SplitRuntime::Ray, 0) => {
                let head = &self.shares[0];
                let gpus = head.gpus.iter().map(|g| g.index).collect();
                Ok(vec![self.piece(
                    "ray-head",
                    0,
                    head,
                    gpus,
                    pb::start_instance::Engine::RayNode(pb::RayNode {
                        model: self.model_files(),
                        head_address: None,
                        node_id: Some(self.ray_node_id(0)),
                    }),
                )])
            }
            (SplitRuntime::Ray, 1) => {
                let head = self.address(ready, &self.ray_head())?;
                Ok(self.shares[1..]
                    .iter()
                    .enumerate()
                    .map(|(i, share)| {
                        let gpus = share.gpus.iter().map(|g| g.index).collect();
                        self.piece(
                            "ray-worker",
                            i + 1,
                            share,
                            gpus,
                            pb::start_instance::Engine::RayNode(pb::RayNode {
                                model: self.model_files(),
                                head_address: Some(head.clone()),
                                node_id: Some(self.ray_node_id(i + 1)),
                            }),
                        )
                    })
                    .collect())
            }
            (SplitRuntime::Rpc, 0) => Ok(self.rpc_servers()),
            _ => Ok(Vec::new()),
        }
    }

    fn ray_head(&self) -> String {
        self.piece_name("ray-head", 0)
    }

    /// The Ray node ID of the plan's `n`th node (0: the head): `n` in its first 8 hex
    /// digits, so that the IDs sort in plan order, then 48 of a digest of the instance's
    /// name and `n`, so that they differ between instances. vLLM 0.33 ranks the driver's
    /// node first and the others by node ID (`get_bundles_sorted_by_node` in
    /// vllm/v1/executor/ray_utils.py); with these IDs its pipeline stages follow the plan.
    fn ray_node_id(&self, n: usize) -> String {
        let digest = Sha256::digest(format!("{}/{n}", self.instance).as_bytes());
        let hex: String = digest.iter().take(24).map(|b| format!("{b:02x}")).collect();
        format!("{n:08x}{hex}")
    }

    /// One RPC server per GPU of the other nodes, in plan order.
    fn rpc_servers(&self) -> Vec<PieceStart> {
        let mut n = 0;
        let mut out = Vec::new();
        for share in &self.shares[1..] {
            for g in &share.gpus {
                n += 1;
                out.push(self.piece(
                    "rpc-server",
                    n,
                    share,
                    vec![g.index],
                    pb::start_instance::Engine::LlamaRpc(pb::LlamaRpcServer { cache: true }),
                ));
            }
        }
        out
    }

    fn address(&self, ready: &BTreeMap<String, String>, piece: &str) -> Result<String, LaunchPlanError> {
        ready.get(piece).cloned().ok_or_else(|| LaunchPlanError::NoAddress {
            instance: self.instance.clone(),
            piece: piece.to_owned(),
        })
    }

    /// Bytes the plan reserved on the serving node's GPUs that the serving process holds
    /// itself (llama.cpp's own GPUs; over Ray, the head's ranks belong to the Ray head).
    pub fn serving_held(&self) -> Vec<(u32, u64)> {
        match self.runtime {
            SplitRuntime::Ray => Vec::new(),
            SplitRuntime::Rpc => Self::held(&self.shares[0]),
        }
    }

    /// The serving engine's command, given the addresses of every piece by name.
    ///
    /// Over Ray, vLLM numbers its ranks by node: the serving (driver's) node first, then
    /// the others by Ray node ID, which [`Self::wave`] chose to sort in plan order; its
    /// pipeline stages follow ranks, so the plan's stages keep their nodes and the layer
    /// counts, reserved and total memory are listed in plan order. Over RPC, llama.cpp
    /// puts the RPC servers' devices before its own GPUs, so their shares of
    /// `--tensor-split` lead.
    ///
    /// Errors: [`LaunchPlanError::NoAddress`].
    pub fn serving(&self, ready: &BTreeMap<String, String>) -> Result<pb::StartInstance, LaunchPlanError> {
        let mut start = self.template.clone();
        start.gpus = self.shares[0].gpus.iter().map(|g| g.index).collect();
        match (&mut start.engine, self.runtime) {
            (Some(pb::start_instance::Engine::Vllm(v)), SplitRuntime::Ray) => {
                let head = self.address(ready, &self.ray_head())?;
                // Every worker must be up: vLLM's placement group waits for all ranks.
                for i in 1..self.shares.len() {
                    self.address(ready, &self.piece_name("ray-worker", i))?;
                }
                let ranks: Vec<&ShareGpu> = self.shares.iter().flat_map(|s| s.gpus.iter()).collect();
                v.reserved = ranks.iter().map(|g| g.reserved).collect();
                v.total = ranks.iter().map(|g| g.total).collect();
                v.ray_address = Some(head);
            }
            (Some(pb::start_instance::Engine::LlamaCpp(l)), SplitRuntime::Rpc) => {
                let servers = self.rpc_servers();
                l.rpc_servers = servers
                    .iter()
                    .map(|p| self.address(ready, &p.name))
                    .collect::<Result<_, _>>()?;
                if !l.tensor_split.is_empty() {
                    l.tensor_split = self.shares[1..]
                        .iter()
                        .chain(&self.shares[..1])
                        .flat_map(|s| s.gpus.iter().map(|g| g.split))
                        .collect();
                }
            }
            _ => {}
        }
        Ok(start)
    }
}

/// How the engine of an embedding model serves embeddings; `None` for a model that
/// generates.
fn embeddings(planned: &PlannedInstance) -> Option<pb::Embeddings> {
    match planned.task {
        skein_model_registry::ModelTask::Generate => None,
        skein_model_registry::ModelTask::Embed { pooling } => Some(pb::Embeddings {
            pooling: pooling.map_or_else(String::new, |p| p.name().to_owned()),
        }),
    }
}

/// The LoRA adapters a planned replica serves, as agents download and engines load
/// them (in the plan's order: llama.cpp numbers them so).
fn lora_adapters(planned: &PlannedInstance) -> Vec<pb::LoraAdapter> {
    planned
        .adapters
        .iter()
        .map(|a| pb::LoraAdapter {
            name: a.name.clone(),
            files: Some(pb::ModelFiles {
                repo: a.repo.clone(),
                revision: a.sha.clone(),
                files: a.files.clone(),
                optional_files: Vec::new(),
            }),
            gguf: if a.format == "gguf" {
                a.files.first().cloned().unwrap_or_default()
            } else {
                String::new()
            },
        })
        .collect()
}

/// The total memory of a planned device's GPU, as the graph knows it.
fn memory_total(graph: &GraphSnapshot, d: &crate::plan::PlannedDevice) -> Option<u64> {
    let gpu = d.gpu?;
    graph
        .nodes
        .iter()
        .find(|n| n.inventory.name == d.node)
        .and_then(|n| n.gpus.get(gpu as usize))
        .map(|g| g.facts.memory_total)
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
