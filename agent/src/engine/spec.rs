//! Launch specs from start commands ([`launch_spec`]): the files an agent downloaded
//! (the model's snapshot, its adapters'), the node's device indices and the engine's
//! settings become the [`LaunchSpec`] whose command the supervisor runs. Pure.

use std::path::{Path, PathBuf};

use skein_proto::agent::v1::{self as pb, start_instance};

use super::command::{
    AdapterLaunch, CandleLaunch, EmbeddingsLaunch, EngineKey, EngineLaunch, LaunchSpec, LlamaCppLaunch, LlamaRpcLaunch,
    RayNodeLaunch, RemoteLaunch, VllmLaunch,
};

/// Where the engines' programs are and how engines are reached.
#[derive(Debug, Clone)]
pub struct EngineHostConfig {
    /// The `skein` binary (the built-in engine is `skein engine serve`).
    pub skein: PathBuf,
    /// `llama-server`.
    pub llama_server: PathBuf,
    /// `vllm`.
    pub vllm: PathBuf,
    /// `ray` (the nodes of a vLLM engine split across machines).
    pub ray: PathBuf,
    /// llama.cpp's RPC server (the GPUs of a GGUF model split across machines);
    /// [`super::host::default_rpc_server`] when not given.
    pub rpc_server: PathBuf,
    /// The address engines listen on and are reached at (this machine's address as the
    /// orchestrator sees it; loopback when both run here).
    pub listen_host: String,
    /// The GPUs are simulated: the built-in engine runs on the CPU (a simulated GPU runs
    /// no kernels), external engines get the plan's GPUs as given.
    pub simulated_gpus: bool,
    /// The device index of each GPU the orchestrator knows, by the index it knows it
    /// by, when they differ: the node registered only some of its GPUs (a Slurm job's,
    /// [`crate::gpu::Allocated`]), renumbered from 0. Empty: the indices are the
    /// devices'.
    pub devices: Vec<u32>,
}

/// The launch spec of a start command whose files are in `snapshot`, and its adapters'
/// in `adapters` (in the command's order). Pure.
///
/// Errors: a command without an engine, or without the file it names; adapters the
/// engine cannot load (a PEFT directory for llama.cpp, a GGUF file for vLLM).
pub fn launch_spec(
    command: &pb::StartInstance,
    snapshot: Option<&Path>,
    adapters: &[PathBuf],
    config: &EngineHostConfig,
    port: u16,
) -> Result<LaunchSpec, String> {
    let name = &command.instance;
    let adapters = adapter_launches(command, adapters)?;
    let needs_files = || snapshot.ok_or_else(|| format!("instance `{name}` names no model files"));
    let mut gpus = device_indices(&command.gpus, &config.devices).ok_or_else(|| {
        format!(
            "instance `{name}` names GPUs {:?}, and this node has {}",
            command.gpus,
            config.devices.len()
        )
    })?;
    let engine = match &command.engine {
        None => return Err(format!("instance `{name}` names no engine; upgrade this agent")),
        Some(start_instance::Engine::Candle(e)) => {
            let dir = needs_files()?;
            if config.simulated_gpus {
                gpus.clear();
            }
            EngineLaunch::Candle(CandleLaunch {
                program: config.skein.clone(),
                model: if e.gguf.is_empty() {
                    dir.to_owned()
                } else {
                    dir.join(&e.gguf)
                },
                seed: e.seed,
            })
        }
        Some(start_instance::Engine::LlamaCpp(e)) => {
            let dir = needs_files()?;
            if e.gguf.is_empty() {
                return Err(format!(
                    "instance `{name}`: llama.cpp needs a GGUF file and the command names none"
                ));
            }
            EngineLaunch::LlamaCpp(LlamaCppLaunch {
                program: config.llama_server.clone(),
                model: dir.join(&e.gguf),
                mmproj: e.mmproj.as_ref().map(|f| dir.join(f)),
                gpu_layers: e.gpu_layers,
                tensor_split: e.tensor_split.clone(),
                n_batch: e.n_batch,
                n_ubatch: e.n_ubatch,
                flash_attention: e.flash_attention,
                rpc_servers: e.rpc_servers.clone(),
            })
        }
        Some(start_instance::Engine::Vllm(e)) => {
            let dir = needs_files()?;
            // Alone, the engine reads the local snapshot (no revision to resolve). Over a
            // Ray cluster, ranks on other nodes read the model too: by repository and
            // revision, each from its own node's cache (the same path need not exist
            // everywhere), offline.
            let (model, revision, hub_cache) = match (&e.ray_address, &e.model) {
                (Some(_), Some(files)) => (
                    files.repo.clone(),
                    Some(files.revision.clone()),
                    Some(hub_cache_of(name, dir)?),
                ),
                _ => (dir.to_string_lossy().into_owned(), None, None),
            };
            EngineLaunch::Vllm(VllmLaunch {
                program: config.vllm.clone(),
                model,
                revision,
                tensor_parallel: e.tensor_parallel,
                layer_partition: e.layer_partition.clone(),
                quantization: e.quantization.clone(),
                reserved: e.reserved.clone(),
                total: e.total.clone(),
                max_num_batched_tokens: e.max_num_batched_tokens,
                enforce_eager: e.enforce_eager,
                kv_cache_dtype: e.kv_cache_dtype.clone(),
                ray_address: e.ray_address.clone(),
                hub_cache,
                kv_cache_bytes: e.kv_cache_bytes,
                tool_call_parser: e.tool_call_parser.clone(),
                max_loras: e.max_loras,
                max_lora_rank: e.max_lora_rank,
            })
        }
        Some(start_instance::Engine::RayNode(e)) => EngineLaunch::RayNode(RayNodeLaunch {
            program: config.ray.clone(),
            head_address: e.head_address.clone(),
            hub_cache: Some(hub_cache_of(name, needs_files()?)?),
            node_id: e.node_id.clone(),
        }),
        Some(start_instance::Engine::LlamaRpc(e)) => EngineLaunch::LlamaRpc(LlamaRpcLaunch {
            program: config.rpc_server.clone(),
            cache: e.cache,
        }),
        Some(start_instance::Engine::Remote(e)) => EngineLaunch::Remote(RemoteLaunch {
            url: e.url.clone(),
            model: e.model.clone(),
            api_key: e.api_key.as_deref().and_then(EngineKey::new),
        }),
    };
    Ok(LaunchSpec {
        instance: name.clone(),
        host: config.listen_host.clone(),
        port,
        gpus,
        context: command.context,
        concurrency: command.concurrency,
        engine,
        api_key: EngineKey::new(&command.engine_api_key),
        adapters,
        embeddings: command.embeddings.as_ref().map(|e| EmbeddingsLaunch {
            pooling: (!e.pooling.is_empty()).then(|| e.pooling.clone()),
        }),
    })
}

/// The adapters of `command` as its engine loads them: llama.cpp a GGUF file of each,
/// vLLM each PEFT directory (`dirs`: their downloaded snapshots, in order).
fn adapter_launches(command: &pb::StartInstance, dirs: &[PathBuf]) -> Result<Vec<AdapterLaunch>, String> {
    let name = &command.instance;
    if command.adapters.is_empty() {
        return Ok(Vec::new());
    }
    if dirs.len() != command.adapters.len() {
        return Err(format!(
            "instance `{name}`: {} adapters, {} downloaded",
            command.adapters.len(),
            dirs.len()
        ));
    }
    let gguf_engine = match &command.engine {
        Some(start_instance::Engine::LlamaCpp(_)) => true,
        Some(start_instance::Engine::Vllm(_)) => false,
        _ => {
            return Err(format!(
                "instance `{name}`: only vLLM and llama.cpp serve LoRA adapters"
            ));
        }
    };
    command
        .adapters
        .iter()
        .zip(dirs)
        .map(|(adapter, dir)| match (gguf_engine, adapter.gguf.is_empty()) {
            (true, false) => Ok(AdapterLaunch {
                name: adapter.name.clone(),
                path: dir.join(&adapter.gguf),
            }),
            (false, true) => Ok(AdapterLaunch {
                name: adapter.name.clone(),
                path: dir.clone(),
            }),
            (true, true) => Err(format!(
                "instance `{name}`: adapter `{}` is a PEFT directory, and llama.cpp loads GGUF adapters only",
                adapter.name
            )),
            (false, false) => Err(format!(
                "instance `{name}`: adapter `{}` is a GGUF file, and vLLM loads PEFT adapters only",
                adapter.name
            )),
        })
        .collect()
}

/// The Hugging Face cache a snapshot directory is in
/// (`CACHE/models--OWNER--NAME/snapshots/REVISION`).
fn hub_cache_of(instance: &str, snapshot: &Path) -> Result<PathBuf, String> {
    let repo = snapshot
        .parent()
        .filter(|p| p.ends_with("snapshots"))
        .and_then(Path::parent);
    match repo.and_then(|r| Some((r.file_name()?.to_str()?, r.parent()?))) {
        Some((name, cache)) if name.starts_with("models--") => Ok(cache.to_owned()),
        _ => Err(format!(
            "instance `{instance}`: {} is not a snapshot of a Hugging Face cache (CACHE/models--OWNER--NAME/snapshots/REVISION), so other nodes cannot find the same model by name",
            snapshot.display()
        )),
    }
}

/// The device indices of the GPUs the orchestrator named `gpus`, through `devices`
/// ([`EngineHostConfig::devices`]; empty: unchanged); `None` when one is out of range.
fn device_indices(gpus: &[u32], devices: &[u32]) -> Option<Vec<u32>> {
    if devices.is_empty() {
        return Some(gpus.to_vec());
    }
    gpus.iter().map(|&g| devices.get(g as usize).copied()).collect()
}
