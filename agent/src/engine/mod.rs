//! Inference engines on the agent's GPUs.
//!
//! - [`command`]: the exact command lines of the external engines (`llama-server`,
//!   `vllm serve`) from an instance's [`LaunchSpec`], pure and snapshot-tested.

pub mod command;

pub use command::{EngineCommand, EngineLaunch, LaunchError, LaunchSpec, LlamaCppLaunch, VllmLaunch, memory_fraction};
