//! The command lines of engines: what the agent runs for `llama-server`, `vllm serve` and
//! Skein's built-in candle engine (`skein engine serve`) from an instance's launch spec.
//! Pure: a spec in, a program, its arguments and its environment out, so that the exact
//! command for every plan of the example workflows on the fleet files, the reference
//! fleet's among them, is snapshot-tested (the root package's `tests/engine_commands.rs`,
//! from the planner's real plans) and nothing about it is decided at start time. A remote endpoint ([`RemoteLaunch`]) is a launch spec too,
//! but has no command: the supervisor only probes it. An engine's API key
//! ([`EngineKey`]) goes into its environment, never its arguments (which every user of
//! the machine can read in `/proc`), and shows nowhere as text.

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// What an agent is told to start: one replica of a model on some of its GPUs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LaunchSpec {
    /// The instance's name; engines serve the model under it, so requests name it.
    pub instance: String,
    /// Address the engine listens on (the agent's own side of a loopback or LAN port).
    pub host: String,
    /// Port the engine listens on.
    pub port: u16,
    /// CUDA indices of the GPUs, in rank order (pipeline stage by stage, each stage's
    /// tensor-parallel ranks together). Empty: no GPU (llama.cpp on the CPU).
    pub gpus: Vec<u32>,
    /// Tokens of context per sequence.
    pub context: u64,
    /// Sequences served at once.
    pub concurrency: u64,
    /// The engine and its own settings.
    pub engine: EngineLaunch,
    /// The key the engine demands of every request but its health check
    /// (`Authorization: Bearer KEY`), given to it through its environment
    /// ([`EngineLaunch::key_variable`]); `None`: no key. Ignored by the pieces of a split
    /// engine (Ray, `rpc-server`), which have no way to check one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key: Option<EngineKey>,
    /// LoRA adapters served on the model (vLLM and llama.cpp), in the order requests
    /// number them; empty: none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub adapters: Vec<AdapterLaunch>,
    /// Serve embeddings instead of generating (vLLM and llama.cpp); `None`: generate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub embeddings: Option<EmbeddingsLaunch>,
}

/// How an engine serves an embedding model.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EmbeddingsLaunch {
    /// llama.cpp's `--pooling` (`mean`, `cls`, `last`); `None`: the model's own.
    pub pooling: Option<String>,
}

/// A LoRA adapter an engine loads at start.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AdapterLaunch {
    /// The name requests select it by (vLLM serves it as a model of this name).
    pub name: String,
    /// Its PEFT directory (vLLM) or GGUF file (llama.cpp), downloaded.
    pub path: PathBuf,
}

/// An engine's API key: 32 random bytes in hex from the orchestrator. It never shows:
/// `Debug` and serialization print `<redacted>`; only [`EngineKey::expose`] gives the
/// text, for the engine's environment and the `Authorization` header.
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct EngineKey(String);

impl EngineKey {
    /// A key from its text; `None` when empty (no key).
    pub fn new(text: &str) -> Option<EngineKey> {
        (!text.is_empty()).then(|| EngineKey(text.to_owned()))
    }

    /// The text, for the engine and the requests to it; never for logs.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for EngineKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("EngineKey(<redacted>)")
    }
}

impl Serialize for EngineKey {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(REDACTED)
    }
}

/// The variable that makes CUDA number GPUs as the agent does: every engine process gets
/// it beside `CUDA_VISIBLE_DEVICES`.
pub const CUDA_DEVICE_ORDER: &str = "CUDA_DEVICE_ORDER";
/// [`CUDA_DEVICE_ORDER`]'s value: ascending PCI bus id, the order of NVML's indices.
pub const PCI_BUS_ID: &str = "PCI_BUS_ID";

/// How a secret shows in logs, events and serialized commands.
pub const REDACTED: &str = "<redacted>";

/// The engine-specific part of a [`LaunchSpec`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum EngineLaunch {
    /// llama.cpp's `llama-server`.
    LlamaCpp(LlamaCppLaunch),
    /// `vllm serve`.
    Vllm(VllmLaunch),
    /// Skein's built-in engine on candle (`skein engine serve`).
    Candle(CandleLaunch),
    /// An OpenAI-compatible endpoint run by someone else: no process, only probes.
    Remote(RemoteLaunch),
    /// A node of a Ray cluster (`ray start`) whose GPUs run ranks of a vLLM engine
    /// split across machines.
    RayNode(RayNodeLaunch),
    /// llama.cpp's RPC server: one GPU another node's `llama-server` offloads to.
    LlamaRpc(LlamaRpcLaunch),
}

impl EngineLaunch {
    /// The environment variable through which the engine takes its API key: vLLM reads
    /// `VLLM_API_KEY` (as `--api-key`), llama-server `LLAMA_API_KEY` (as `--api-key`),
    /// the built-in engine `SKEIN_ENGINE_API_KEY`. `None` for what cannot check a key:
    /// a remote endpoint (it has its own), a Ray node and llama.cpp's `rpc-server` (no
    /// authentication at all; keep their ports on a trusted network).
    pub fn key_variable(&self) -> Option<&'static str> {
        match self {
            EngineLaunch::LlamaCpp(_) => Some("LLAMA_API_KEY"),
            EngineLaunch::Vllm(_) => Some("VLLM_API_KEY"),
            EngineLaunch::Candle(_) => Some("SKEIN_ENGINE_API_KEY"),
            EngineLaunch::Remote(_) | EngineLaunch::RayNode(_) | EngineLaunch::LlamaRpc(_) => None,
        }
    }
}

/// `ray start --block`: the head of a Ray cluster, or a worker joining one. A piece of
/// an engine split across machines: it serves no requests, and is ready when its port
/// ([`LaunchSpec::port`]: the head's GCS port, a worker's node-manager port) accepts
/// connections.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RayNodeLaunch {
    /// The program (`ray`, or a path).
    pub program: PathBuf,
    /// The head's `HOST:PORT`; `None`: this node is the head.
    pub head_address: Option<String>,
    /// The Hugging Face cache holding the model, for the ranks this node runs (they
    /// load it offline from there).
    pub hub_cache: Option<PathBuf>,
    /// The Ray node ID to register with (56 lowercase hex digits), chosen by the server
    /// so that vLLM's rank order follows the plan; `None`: Ray picks one.
    #[serde(default)]
    pub node_id: Option<String>,
}

/// llama.cpp's RPC server (`ggml-rpc-server`; `rpc-server` in older releases) on at
/// most one GPU (the CPU without one). A piece of an engine split across machines, ready
/// when its port first accepts a connection. It then serves one client at a time (its
/// socket listens with a backlog of 1 and it accepts the next client only when the
/// current one leaves), so once the serving `llama-server` holds its connection a probe
/// could not connect: its health is its process running.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LlamaRpcLaunch {
    /// The program (`ggml-rpc-server`, or a path).
    pub program: PathBuf,
    /// `-c`: keep received tensors in the local cache.
    pub cache: bool,
}

/// Skein's built-in engine (`skein engine serve`) for a local model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CandleLaunch {
    /// The `skein` binary.
    pub program: PathBuf,
    /// A local snapshot directory (safetensors and tokenizer) or a `.gguf` file.
    pub model: PathBuf,
    /// The sampling seed, so that replays of a run sample alike.
    pub seed: u64,
}

/// An OpenAI-compatible endpoint elsewhere (a hosted API, or an engine the agent does
/// not run). [`LaunchSpec::host`], [`LaunchSpec::port`] and [`LaunchSpec::gpus`] do not
/// apply to it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RemoteLaunch {
    /// The OpenAI base URL, e.g. `https://api.example.org/v1` (`/models` is probed under it).
    pub url: String,
    /// The model's name at that endpoint.
    pub model: String,
    /// The API key, sent as `Authorization: Bearer KEY`, given by the orchestrator (the
    /// owner's secret; the agent's environment is never read for it); `None`: no key.
    /// Kept in memory only: it shows nowhere as text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key: Option<EngineKey>,
}

/// `llama-server` for one GGUF variant.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LlamaCppLaunch {
    /// The program (`llama-server`, or a path).
    pub program: PathBuf,
    /// The GGUF file (the first part of a split file; llama.cpp finds the others).
    pub model: PathBuf,
    /// The multimodal projector of a vision model.
    pub mmproj: Option<PathBuf>,
    /// Layers on the GPUs (`-ngl`), counting the output layer as one: llama.cpp
    /// offloads the *last* repeating layers and the output, and keeps the first in host
    /// RAM. `None`: every layer (a plan without host offload).
    pub gpu_layers: Option<u64>,
    /// `--tensor-split`, one entry per device (RPC servers first, then
    /// [`LaunchSpec::gpus`]): the split that makes llama.cpp place exactly the planned
    /// layers (`skein_model_registry::estimate::llama_cpp_tensor_split`), not the layer
    /// counts themselves; empty on one device.
    pub tensor_split: Vec<u64>,
    /// `--batch-size`.
    pub n_batch: u64,
    /// `--ubatch-size`.
    pub n_ubatch: u64,
    /// `--flash-attn on`.
    pub flash_attention: bool,
    /// `--rpc`: RPC servers (`HOST:PORT`) whose devices hold layers too; their shares
    /// lead [`LlamaCppLaunch::tensor_split`], before this node's GPUs.
    pub rpc_servers: Vec<String>,
}

/// `vllm serve` for one safetensors variant.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VllmLaunch {
    /// The program (`vllm`, or a path).
    pub program: PathBuf,
    /// The Hugging Face repository (or a local directory) of the variant.
    pub model: String,
    /// The revision the plan read, so the engine loads what was planned.
    pub revision: Option<String>,
    /// `--tensor-parallel-size`.
    pub tensor_parallel: u64,
    /// Layers per pipeline stage; one entry per stage (`--pipeline-parallel-size` is
    /// its length). Uneven entries are passed as `VLLM_PP_LAYER_PARTITION`.
    pub layer_partition: Vec<u64>,
    /// `--quantization` (`awq`, `gptq`, `fp8`, …); `None` for 16-bit weights.
    pub quantization: Option<String>,
    /// Bytes the plan reserved on each GPU, in the order of [`LaunchSpec::gpus`].
    pub reserved: Vec<u64>,
    /// Total memory of each GPU, in the same order.
    pub total: Vec<u64>,
    /// `--max-num-batched-tokens`.
    pub max_num_batched_tokens: u64,
    /// `--enforce-eager`.
    pub enforce_eager: bool,
    /// `--kv-cache-dtype` when not the model's own (`fp8`).
    pub kv_cache_dtype: Option<String>,
    /// The Ray cluster (its head's `HOST:PORT`) whose GPUs run the ranks
    /// (`--distributed-executor-backend ray`); `None`: [`LaunchSpec::gpus`] alone. With
    /// a cluster, [`VllmLaunch::reserved`] and [`VllmLaunch::total`] list every rank's
    /// GPU, and [`LaunchSpec::gpus`] only this node's.
    pub ray_address: Option<String>,
    /// The Hugging Face cache holding [`VllmLaunch::model`] (a repository id then, the
    /// same on every node), read offline.
    pub hub_cache: Option<PathBuf>,
    /// `--kv-cache-memory-bytes`: the KV cache every worker allocates, the largest the
    /// plan sized for one (the stage with most layers). vLLM takes one size for all its
    /// workers and then cuts each to the blocks of the worker with fewest, so a stage
    /// with fewer layers allocates less. With it, vLLM sizes no worker's memory from
    /// `--gpu-memory-utilization`: each holds its own weights and activations plus this
    /// cache, and the fraction is only the free memory each GPU must have at start.
    /// `None`: vLLM sizes the cache as total × fraction minus what it profiled, the same
    /// budget on every GPU, which uneven stages cannot share.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_cache_bytes: Option<u64>,
    /// `--enable-auto-tool-choice --tool-call-parser PARSER`: the model family's tool-call
    /// parser; `None`: served without tool calling.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_parser: Option<String>,
    /// With [`LaunchSpec::adapters`]: `--max-loras` and `--max-lora-rank`, the slots the
    /// plan sized.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub max_loras: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    /// See [`VllmLaunch::max_loras`].
    pub max_lora_rank: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// A process to start: program, arguments, and the environment added to the agent's.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct EngineCommand {
    /// The program.
    pub program: PathBuf,
    /// Its arguments.
    pub args: Vec<String>,
    /// Variables set for it (on top of the agent's environment).
    pub env: BTreeMap<String, String>,
    /// Variables set for it that hold secrets (the engine's key): given to the process
    /// like [`EngineCommand::env`], shown everywhere else as `<redacted>`. The
    /// environment, unlike the arguments, is not readable by other users of the machine
    /// (`/proc/PID/environ` is the owner's alone).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub secret_env: BTreeMap<String, EngineKey>,
}

/// A launch spec that cannot become a command.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LaunchError {
    /// A field has a value no engine accepts.
    #[error("instance `{instance}`: {field}: {found} — {expected}")]
    Invalid {
        /// The instance.
        instance: String,
        /// The field.
        field: &'static str,
        /// What it holds.
        found: String,
        /// What it must hold.
        expected: String,
    },
    /// The spec is a remote endpoint: there is no process to start.
    #[error(
        "instance `{instance}` is the remote endpoint {url}: there is no command to run, only the endpoint to probe"
    )]
    Remote {
        /// The instance.
        instance: String,
        /// The endpoint's base URL.
        url: String,
    },
}

impl LaunchSpec {
    pub(super) fn invalid(&self, field: &'static str, found: impl ToString, expected: impl ToString) -> LaunchError {
        LaunchError::Invalid {
            instance: self.instance.clone(),
            field,
            found: found.to_string(),
            expected: expected.to_string(),
        }
    }

    fn no_command(&self, r: &RemoteLaunch) -> LaunchError {
        LaunchError::Remote {
            instance: self.instance.clone(),
            url: r.url.clone(),
        }
    }

    /// The command that starts this spec's engine; [`LaunchError::Remote`] for a valid
    /// remote endpoint (which has no process).
    pub fn command(&self) -> Result<EngineCommand, LaunchError> {
        self.check_name()?;
        // Before the checks of local engines: a remote spec's host and port are unused.
        if let EngineLaunch::Remote(r) = &self.engine {
            if !(r.url.starts_with("http://") || r.url.starts_with("https://")) {
                return Err(self.invalid("the endpoint URL", &r.url, "an http:// or https:// base URL"));
            }
            return Err(self.no_command(r));
        }
        if self.port == 0 {
            return Err(self.invalid("the port", 0, "the engine needs a fixed port the agent can probe"));
        }
        if self.context == 0 || self.concurrency == 0 {
            return Err(self.invalid(
                "context × concurrency",
                format!("{} × {}", self.context, self.concurrency),
                "both must be at least 1",
            ));
        }
        let mut env = BTreeMap::new();
        // Only the plan's GPUs, in rank order: engines number what they see from 0.
        let visible = comma_list(&self.gpus);
        env.insert("CUDA_VISIBLE_DEVICES".to_owned(), visible);
        // The indices above are the agent's: NVML's, in PCI bus order as `nvidia-smi`
        // shows them (NVML does not promise that order; the agent warns at start when a
        // node's is not, `gpu::nvml`). CUDA's own default order is fastest first, which
        // on a node of mixed GPUs would put an engine on another card than planned.
        env.insert(CUDA_DEVICE_ORDER.to_owned(), PCI_BUS_ID.to_owned());
        if !self.adapters.is_empty() && !matches!(self.engine, EngineLaunch::LlamaCpp(_) | EngineLaunch::Vllm(_)) {
            return Err(self.invalid(
                "the LoRA adapters",
                format!("{} adapters", self.adapters.len()),
                "none: only vLLM and llama.cpp serve adapters",
            ));
        }
        let mut command = match &self.engine {
            EngineLaunch::LlamaCpp(l) => self.llama_cpp(l, env),
            EngineLaunch::Vllm(v) => self.vllm(v, env),
            EngineLaunch::Candle(c) => Ok(self.candle(c, env)),
            EngineLaunch::Remote(r) => Err(self.no_command(r)),
            EngineLaunch::RayNode(r) => self.ray_node(r, env),
            EngineLaunch::LlamaRpc(r) => self.llama_rpc(r, env),
        }?;
        if let (Some(key), Some(variable)) = (&self.api_key, self.engine.key_variable()) {
            command.secret_env.insert(variable.to_owned(), key.clone());
        }
        Ok(command)
    }

    /// Whether this spec is a piece of an engine split across machines: it serves no
    /// requests, and is ready when its port accepts connections.
    pub fn is_piece(&self) -> bool {
        matches!(self.engine, EngineLaunch::RayNode(_) | EngineLaunch::LlamaRpc(_))
    }

    /// `ray start --block`: the head listens on the GCS port, a worker on its node-manager
    /// port (the port the agent probes); both announce the agent's address, so that the
    /// cluster's other nodes reach them there.
    fn ray_node(&self, r: &RayNodeLaunch, mut env: BTreeMap<String, String>) -> Result<EngineCommand, LaunchError> {
        if let Some(id) = &r.node_id {
            if id.len() != 56 || !id.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
                return Err(self.invalid(
                    "the Ray node ID",
                    id.clone(),
                    "56 lowercase hex digits (a 28-byte Ray NodeID)",
                ));
            }
            // Ray 2.60 reads a node's ID from this variable at `ray start` (ray/_private/node.py).
            env.insert("RAY_OVERRIDE_NODE_ID_FOR_TESTING".to_owned(), id.clone());
        }
        let mut args = vec!["start".to_owned(), "--block".to_owned()];
        match &r.head_address {
            None => args.extend(["--head".to_owned(), "--port".to_owned(), self.port.to_string()]),
            Some(head) => args.extend([
                "--address".to_owned(),
                head.clone(),
                "--node-manager-port".to_owned(),
                self.port.to_string(),
            ]),
        }
        args.extend([
            "--node-ip-address".to_owned(),
            self.host.clone(),
            "--num-gpus".to_owned(),
            self.gpus.len().to_string(),
            "--disable-usage-stats".to_owned(),
        ]);
        if r.head_address.is_none() {
            args.push("--include-dashboard=false".to_owned());
        }
        offline_cache(&mut env, r.hub_cache.as_deref());
        Ok(EngineCommand {
            program: r.program.clone(),
            args,
            env,
            secret_env: BTreeMap::new(),
        })
    }

    /// The RPC server: one device (the GPU it sees, or the CPU).
    fn llama_rpc(&self, r: &LlamaRpcLaunch, env: BTreeMap<String, String>) -> Result<EngineCommand, LaunchError> {
        if self.gpus.len() > 1 {
            return Err(self.invalid(
                "the GPU count",
                format!("{} GPUs", self.gpus.len()),
                "an RPC server serves one GPU (or the CPU); start one per GPU",
            ));
        }
        let mut args = vec![
            "--host".to_owned(),
            self.host.clone(),
            "--port".to_owned(),
            self.port.to_string(),
        ];
        if r.cache {
            args.push("-c".to_owned());
        }
        Ok(EngineCommand {
            program: r.program.clone(),
            args,
            env,
            secret_env: BTreeMap::new(),
        })
    }

    /// The instance name is one word, and names the instance's log file.
    fn check_name(&self) -> Result<(), LaunchError> {
        if self.instance.is_empty() || self.instance.chars().any(char::is_whitespace) {
            return Err(self.invalid(
                "the instance name",
                format!("{:?}", self.instance),
                "it must be one word",
            ));
        }
        if self.instance.contains(['/', '\\']) || self.instance.starts_with('.') {
            return Err(self.invalid(
                "the instance name",
                format!("{:?}", self.instance),
                "it names the instance's log file: no `/` or `\\`, and no leading `.`",
            ));
        }
        Ok(())
    }

    /// `skein engine serve`: the built-in engine sees only the plan's GPUs, so it always
    /// runs on `cuda:0` of them (or on the CPU without GPUs).
    fn candle(&self, c: &CandleLaunch, env: BTreeMap<String, String>) -> EngineCommand {
        let device = if self.gpus.is_empty() { "cpu" } else { "cuda:0" };
        let args = [
            "engine",
            "serve",
            "--model",
            &c.model.display().to_string(),
            "--name",
            &self.instance,
            "--host",
            &self.host,
            "--port",
            &self.port.to_string(),
            "--seed",
            &c.seed.to_string(),
            "--device",
            device,
        ]
        .map(str::to_owned)
        .to_vec();
        EngineCommand {
            program: c.program.clone(),
            args,
            env,
            secret_env: BTreeMap::new(),
        }
    }

    fn llama_cpp(&self, l: &LlamaCppLaunch, env: BTreeMap<String, String>) -> Result<EngineCommand, LaunchError> {
        let devices = self.gpus.len() + l.rpc_servers.len();
        if !(l.tensor_split.is_empty() || l.tensor_split.len() == devices) {
            return Err(self.invalid(
                "--tensor-split",
                format!(
                    "{} entries for {} GPUs and {} RPC servers",
                    l.tensor_split.len(),
                    self.gpus.len(),
                    l.rpc_servers.len()
                ),
                "one entry per device (RPC servers first, then GPUs), or none",
            ));
        }
        if !l.tensor_split.is_empty() && l.tensor_split.iter().all(|&s| s == 0) {
            return Err(self.invalid("--tensor-split", "all zero", "at least one GPU must hold layers"));
        }
        if l.n_ubatch == 0 || l.n_batch < l.n_ubatch {
            return Err(self.invalid(
                "the batch sizes",
                format!("--batch-size {} --ubatch-size {}", l.n_batch, l.n_ubatch),
                "the ubatch must be at least 1 and at most the batch",
            ));
        }
        let total_context = self
            .context
            .checked_mul(self.concurrency)
            .ok_or_else(|| self.invalid("context × concurrency", "too large", "a product under 2^64"))?;
        let mut args = vec![
            "--model".to_owned(),
            l.model.display().to_string(),
            "--alias".to_owned(),
            self.instance.clone(),
            "--host".to_owned(),
            self.host.clone(),
            "--port".to_owned(),
            self.port.to_string(),
            // llama-server divides its context among its slots.
            "--ctx-size".to_owned(),
            total_context.to_string(),
            "--parallel".to_owned(),
            self.concurrency.to_string(),
            "--batch-size".to_owned(),
            l.n_batch.to_string(),
            "--ubatch-size".to_owned(),
            l.n_ubatch.to_string(),
            "--flash-attn".to_owned(),
            if l.flash_attention { "on" } else { "off" }.to_owned(),
            // The plan sized every device: llama.cpp must not move layers or shrink the
            // context to fit its own idea of free memory (`--fit` is on by default).
            "--fit".to_owned(),
            "off".to_owned(),
            // The model's own chat template, which renders `tools` and lets llama.cpp
            // parse the family's tool calls (on by default in recent builds; said here
            // for older ones).
            "--jinja".to_owned(),
        ];
        if let Some(mmproj) = &l.mmproj {
            args.extend(["--mmproj".to_owned(), mmproj.display().to_string()]);
            if l.gpu_layers.is_some() {
                // With host offload the plan keeps the projector in host RAM (the first
                // stage); llama.cpp would put it on a GPU.
                args.push("--no-mmproj-offload".to_owned());
            }
        }
        if !l.rpc_servers.is_empty() {
            args.extend(["--rpc".to_owned(), l.rpc_servers.join(",")]);
        }
        args.extend(self.llama_cpp_serving()?);
        if devices == 0 {
            args.extend(["--n-gpu-layers".to_owned(), "0".to_owned()]);
        } else {
            // 999: every layer, whatever the model's depth (llama.cpp caps it).
            let layers = l.gpu_layers.map_or_else(|| "999".to_owned(), |n| n.to_string());
            args.extend(["--n-gpu-layers".to_owned(), layers]);
            if devices > 1 {
                let split = comma_list(&l.tensor_split);
                args.extend([
                    "--split-mode".to_owned(),
                    "layer".to_owned(),
                    "--tensor-split".to_owned(),
                    split,
                ]);
            }
        }
        Ok(EngineCommand {
            program: l.program.clone(),
            args,
            env,
            secret_env: BTreeMap::new(),
        })
    }

    fn vllm(&self, v: &VllmLaunch, mut env: BTreeMap<String, String>) -> Result<EngineCommand, LaunchError> {
        let stages = v.layer_partition.len() as u64;
        if stages == 0 || v.layer_partition.contains(&0) {
            return Err(self.invalid(
                "the layer partition",
                format!("{:?}", v.layer_partition),
                "one entry of at least one layer per pipeline stage",
            ));
        }
        // With a Ray cluster the ranks are the cluster's GPUs, listed in `reserved`.
        let ranks = if v.ray_address.is_some() {
            v.reserved.len()
        } else {
            self.gpus.len()
        };
        if v.tensor_parallel == 0 || v.tensor_parallel.checked_mul(stages) != Some(ranks as u64) {
            return Err(self.invalid(
                "the GPU count",
                format!("{ranks} GPUs"),
                format!(
                    "tensor parallel {} × {stages} pipeline stages = {} GPUs",
                    v.tensor_parallel,
                    v.tensor_parallel.saturating_mul(stages)
                ),
            ));
        }
        if v.reserved.len() != ranks || v.total.len() != ranks {
            return Err(self.invalid(
                "the reserved and total memory",
                format!("{} and {} entries", v.reserved.len(), v.total.len()),
                format!("one of each per GPU ({ranks})"),
            ));
        }
        // vLLM checks at start that every GPU has total × fraction free
        // (`vllm/v1/worker/utils.py` `request_memory`): the smallest share reserved passes
        // on every GPU.
        let fraction = memory_fraction(&v.reserved, &v.total).ok_or_else(|| {
            self.invalid(
                "the reserved memory",
                format!("{:?} of {:?} bytes", v.reserved, v.total),
                "vLLM takes one fraction in hundredths: every GPU needs at least 1 % of its total reserved, and at most all of it",
            )
        })?;
        if let Some(kv) = v.kv_cache_bytes {
            // The worker with most layers holds all of it beside its weights.
            let largest = v.reserved.iter().copied().max().unwrap_or(0);
            if kv == 0 || kv >= largest {
                return Err(self.invalid(
                    "--kv-cache-memory-bytes",
                    kv,
                    format!("at least 1 byte, and less than the largest reservation ({largest} bytes)"),
                ));
            }
        }
        let mut args = vec!["serve".to_owned(), v.model.clone()];
        if let Some(revision) = &v.revision {
            args.extend(["--revision".to_owned(), revision.clone()]);
        }
        args.extend([
            "--served-model-name".to_owned(),
            self.instance.clone(),
            "--host".to_owned(),
            self.host.clone(),
            "--port".to_owned(),
            self.port.to_string(),
            "--tensor-parallel-size".to_owned(),
            v.tensor_parallel.to_string(),
            "--pipeline-parallel-size".to_owned(),
            stages.to_string(),
            "--max-model-len".to_owned(),
            self.context.to_string(),
            "--max-num-seqs".to_owned(),
            self.concurrency.to_string(),
            "--max-num-batched-tokens".to_owned(),
            v.max_num_batched_tokens.to_string(),
            "--gpu-memory-utilization".to_owned(),
            format!("{fraction:.2}"),
        ]);
        if let Some(kv) = v.kv_cache_bytes {
            args.extend(["--kv-cache-memory-bytes".to_owned(), kv.to_string()]);
        }
        if let Some(q) = &v.quantization {
            args.extend(["--quantization".to_owned(), q.clone()]);
        }
        if let Some(kv) = &v.kv_cache_dtype {
            args.extend(["--kv-cache-dtype".to_owned(), kv.clone()]);
        }
        if v.enforce_eager {
            args.push("--enforce-eager".to_owned());
        }
        if let Some(parser) = &v.tool_call_parser {
            args.extend([
                "--enable-auto-tool-choice".to_owned(),
                "--tool-call-parser".to_owned(),
                parser.clone(),
            ]);
        }
        args.extend(self.vllm_serving(v)?);
        if let Some(head) = &v.ray_address {
            args.extend(["--distributed-executor-backend".to_owned(), "ray".to_owned()]);
            env.insert("RAY_ADDRESS".to_owned(), head.clone());
        }
        offline_cache(&mut env, v.hub_cache.as_deref());
        if stages > 1 {
            env.insert("VLLM_PP_LAYER_PARTITION".to_owned(), comma_list(&v.layer_partition));
        }
        Ok(EngineCommand {
            program: v.program.clone(),
            args,
            env,
            secret_env: BTreeMap::new(),
        })
    }
}

/// Points Hugging Face readers at `cache`, offline: the agent downloaded what the
/// engine reads, and a rank on another node must not fetch anything itself.
fn offline_cache(env: &mut BTreeMap<String, String>, cache: Option<&std::path::Path>) {
    if let Some(cache) = cache {
        env.insert("HF_HUB_CACHE".to_owned(), cache.display().to_string());
        env.insert("HF_HUB_OFFLINE".to_owned(), "1".to_owned());
    }
}

/// `1,2,3`: the list form engines take (GPU indices, split ratios, layer counts).
fn comma_list<T: ToString>(items: &[T]) -> String {
    items.iter().map(T::to_string).collect::<Vec<_>>().join(",")
}

/// vLLM's `--gpu-memory-utilization`: one fraction of each GPU's total for every GPU,
/// so the GPU with the least room relative to its size sets it; rounded down to the
/// hundredth vLLM is given, so no GPU is asked for more than the plan reserved.
/// `None` when a reservation is zero or exceeds its GPU.
pub fn memory_fraction(reserved: &[u64], total: &[u64]) -> Option<f64> {
    let mut hundredths = u64::MAX;
    for (&r, &t) in reserved.iter().zip(total) {
        if r == 0 || t == 0 || r > t {
            return None;
        }
        // floor(100 r / t), exact in u128.
        let h = (u128::from(r) * 100 / u128::from(t)) as u64;
        hundredths = hundredths.min(h);
    }
    (hundredths != u64::MAX && hundredths > 0).then(|| hundredths as f64 / 100.0)
}
