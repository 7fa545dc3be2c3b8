//! Inference engines on the agent's GPUs.
//!
//! - [`command`]: the exact command lines of the engines (`llama-server`, `vllm serve`,
//!   Skein's built-in `skein engine serve`) from an instance's [`LaunchSpec`], pure and
//!   snapshot-tested, the engine's key ([`EngineKey`]) in its environment; a remote endpoint ([`RemoteLaunch`]) is a spec without a command;
//!   the pieces of an engine split across machines ([`RayNodeLaunch`], `ray start`;
//!   [`LlamaRpcLaunch`], `rpc-server`) are specs whose readiness is an open port.
//! - [`supervisor`]: the [`Supervisor`] that starts instances, waits until they are
//!   ready, measures their memory, probes their health, restarts them with backoff and
//!   stops them (whole process groups), reporting each change as an [`InstanceEvent`].
//! - `instance` (private): one instance's task: start, readiness, health, restarts.
//! - `process` (private): one engine process in its own process group, its output
//!   captured, its process tree measured; and [`free_port`].
//! - `shared` (private): what the supervisor and the instance tasks share: the
//!   instance table, states and events, and the limits both read.
//! - `logs` (private): an instance's log file (appended across restarts) and its
//!   in-memory ring of recent lines.
//! - `spec` (private): a start command and the files downloaded for it become a
//!   [`LaunchSpec`] ([`host::launch_spec`]); `shell` (private): how a command shows
//!   in logs, secrets redacted ([`shell_word`]); `serving` (private): the flags for
//!   what an engine serves besides text generation (LoRA adapters, embeddings).
//! - [`host`]: the daemon's side of engine commands ([`host::EngineHost`]): a start
//!   becomes a download into the Hugging Face cache, a port, a launch spec and a
//!   supervised engine, each change reported up the agent's stream.

pub mod command;
pub mod host;
mod instance;
mod logs;
mod process;
mod serving;
mod shared;
mod shell;
mod spec;
pub mod supervisor;

pub use command::{
    AdapterLaunch, CandleLaunch, EmbeddingsLaunch, EngineCommand, EngineKey, EngineLaunch, LaunchError, LaunchSpec,
    LlamaCppLaunch, LlamaRpcLaunch, REDACTED, RayNodeLaunch, RemoteLaunch, VllmLaunch, memory_fraction,
};
pub use logs::LOG_RING_LINES;
pub use process::free_port;
pub use shell::shell_word;
pub use supervisor::{
    InstanceEvent, InstanceState, InstanceStatus, MeasuredMemory, RestartPolicy, Supervisor, SupervisorConfig,
    SupervisorError,
};
