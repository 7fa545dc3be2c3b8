//! Skein's built-in inference engine: a Llama, Mistral or Qwen2 checkpoint (or a GGUF
//! Llama file) run by candle, behind the OpenAI chat-completions protocol, so the
//! agent can serve small models without an external engine.
//!
//! # Layout
//!
//! - `checkpoint`: finds the files of a model directory and checks every tensor the
//!   architecture needs against the safetensors headers (no weights read).
//! - `gguf_vocab`: the tokenizer and chat template of a GGUF file, from its metadata.
//! - `model`: the candle models behind one `forward`, and the GGUF checks and loading.
//! - `gguf_llama`: a GGUF Llama on the CPU, our own forward pass over the file's blocks.
//! - `quant`: its matrix products (quantized activations, the Q4_1 AVX2 kernel, threads).
//! - [`template`]: the chat template of `tokenizer_config.json`, rendered by minijinja.
//! - [`tools`]: [`ToolFormat`], the tool-call formats (Hermes, Llama 3 JSON, Mistral):
//!   which one a model writes ([`ToolFormat::of`], also the planner's test of whether a
//!   model can call tools) and the calls parsed out of its text.
//! - [`constrain`]: [`ResponseFormat`] and the `llguidance` matcher over the model's
//!   token trie that constrains sampling to it.
//! - [`engine`]: [`Engine`], a loaded model that generates one completion at a time.
//! - [`openai`]: the wire format (requests, responses, stream chunks, error bodies).
//! - `server`: [`serve`], the axum routes, admission and the generation thread.
//! - `error`: [`Error`].
//!
//! # Invariants
//!
//! - A bad checkpoint is an [`Error`] naming the file (and tensor), never a panic: the
//!   candle loaders, which `unwrap` on missing tensors, only see checked checkpoints.
//! - The async runtime never runs the model. One generation thread owns the [`Engine`];
//!   requests reach it through a bounded queue, and a full queue is a 503 at once.
//! - Generation is deterministic: a request with the same messages, parameters and
//!   seed gives the same text, streamed or not (the stream's pieces concatenate to the
//!   non-streaming text).
//! - The crate knows nothing of the hub, the agent or the orchestrator: it takes a
//!   directory.

#![cfg_attr(not(test), deny(clippy::unwrap_used))]
#![warn(missing_docs)]

mod checkpoint;
pub mod constrain;
pub mod engine;
mod error;
mod gguf_llama;
mod gguf_vocab;
mod model;
pub mod openai;
mod quant;
mod server;
pub mod template;
pub mod tools;

pub use checkpoint::Family;
pub use constrain::ResponseFormat;
pub use engine::{Completion, DEFAULT_MAX_TOKENS, Engine, FinishReason, GenerationRequest};
pub use error::Error;
pub use gguf_vocab::{gguf_tokenizer, gguf_tokenizer_supported};
pub use server::{ApiKey, DeviceSpec, QUEUE_CAPACITY, RETRY_AFTER_S, RunningEngine, STREAM_BUFFER, ServeConfig, serve};
pub use template::{ChatTemplate, TemplateMessage};
pub use tools::{ParsedAnswer, ParsedCall, ToolFormat};
