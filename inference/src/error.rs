//! The crate's error type: every variant names the file, tensor or setting that is
//! wrong, and most say how to fix it.

use std::net::SocketAddr;
use std::path::PathBuf;

/// Everything that can go wrong while loading a model or serving it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A file of the model directory could not be read.
    #[error("cannot read `{}`", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The IO error.
        #[source]
        source: std::io::Error,
    },

    /// A file the engine needs is not in the model directory.
    #[error("`{}` has no `{file}`; help: {help}", dir.display())]
    MissingFile {
        /// The model directory.
        dir: PathBuf,
        /// The file looked for.
        file: String,
        /// How to get it.
        help: &'static str,
    },

    /// A JSON file of the model directory is malformed or lacks a field.
    #[error("`{}` is not a valid {what}", path.display())]
    Json {
        /// The file.
        path: PathBuf,
        /// What the file should be (`model config`).
        what: &'static str,
        /// The parser's error, with line and column.
        #[source]
        source: serde_json::Error,
    },

    /// `config.json` names an architecture the engine cannot run.
    #[error(
        "`{}` describes a `{found}` model, which the built-in engine cannot run; \
         help: it runs Llama, Mistral and Qwen2 checkpoints and GGUF Llama files; \
         use llama-server or vLLM for others",
        path.display()
    )]
    UnsupportedArchitecture {
        /// The `config.json`.
        path: PathBuf,
        /// Its `architectures[0]` or `model_type`.
        found: String,
    },

    /// A safetensors file (or the shard index) is malformed, truncated or padded.
    #[error("`{}` is not a valid safetensors file; help: download it again", path.display())]
    Safetensors {
        /// The file.
        path: PathBuf,
        /// What the header parser found.
        #[source]
        source: skein_model_registry::Error,
    },

    /// A tensor the architecture needs is in no weight file.
    #[error(
        "tensor `{tensor}` is missing from {}; help: the checkpoint is incomplete or \
         does not match `config.json` (architecture, layer count, tied embeddings)",
        location.display()
    )]
    MissingTensor {
        /// The weight file, or the shard index for a sharded checkpoint.
        location: PathBuf,
        /// The tensor's name.
        tensor: String,
    },

    /// A tensor has another shape than `config.json` implies.
    #[error(
        "tensor `{tensor}` in `{}` has shape {found:?}, but `config.json` implies {expected:?}; \
         help: the weights and the config come from different models",
        path.display()
    )]
    TensorShape {
        /// The weight file.
        path: PathBuf,
        /// The tensor's name.
        tensor: String,
        /// The shape `config.json` implies.
        expected: Vec<u64>,
        /// The shape in the file.
        found: Vec<u64>,
    },

    /// A tensor is stored in a dtype the engine cannot compute with.
    #[error(
        "tensor `{tensor}` in `{}` is {found}, which the built-in engine cannot load; \
         help: it loads F32, F16 and BF16 checkpoints (quantized ones as GGUF)",
        path.display()
    )]
    TensorDtype {
        /// The weight file.
        path: PathBuf,
        /// The tensor's name.
        tensor: String,
        /// The dtype found.
        found: String,
    },

    /// A GGUF file is malformed, truncated, or lacks a tensor or a metadata key.
    #[error("`{}` is not a loadable GGUF Llama file: {detail}", path.display())]
    Gguf {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        detail: String,
    },

    /// `tokenizer.json` cannot be loaded.
    #[error("`{}` is not a valid tokenizer", path.display())]
    Tokenizer {
        /// The file.
        path: PathBuf,
        /// The tokenizers library's error.
        #[source]
        source: tokenizers::Error,
    },

    /// The tokenizer knows more tokens than the model has embeddings for.
    #[error(
        "`{}` has {tokenizer_vocab} tokens but the model's vocabulary has {model_vocab}; \
         help: the tokenizer and the weights come from different models",
        tokenizer.display()
    )]
    VocabMismatch {
        /// The tokenizer file.
        tokenizer: PathBuf,
        /// Tokens in it (added tokens included).
        tokenizer_vocab: usize,
        /// Rows of the model's embedding.
        model_vocab: usize,
    },

    /// A special token named by the tokenizer config is not in the tokenizer.
    #[error("`{}` names {role} `{token}`, which the tokenizer does not know", path.display())]
    UnknownSpecialToken {
        /// The tokenizer config.
        path: PathBuf,
        /// Which token (`eos_token`).
        role: &'static str,
        /// The token's text.
        token: String,
    },

    /// `tokenizer_config.json` has no chat template.
    #[error(
        "`{}` has no `chat_template`; help: use a chat (instruct) model, or add the \
         template of its base model to the file",
        path.display()
    )]
    ChatTemplateMissing {
        /// The tokenizer config.
        path: PathBuf,
    },

    /// The chat template does not compile or fails on a conversation.
    #[error("the chat template of `{}` failed", path.display())]
    ChatTemplate {
        /// The tokenizer config.
        path: PathBuf,
        /// The template engine's error, with the template line.
        #[source]
        source: minijinja::Error,
    },

    /// The conversation does not fit the model's context.
    #[error(
        "the prompt has {prompt_tokens} tokens and {max_tokens} more were asked for, \
         but the model's context is {context} tokens; help: shorten the conversation or lower max_tokens"
    )]
    ContextOverflow {
        /// Tokens of the rendered prompt.
        prompt_tokens: usize,
        /// Tokens asked for.
        max_tokens: usize,
        /// The model's `max_position_embeddings`.
        context: usize,
    },

    /// A request's `response_format` cannot constrain this model's sampling: its
    /// schema does not compile, or the tokenizer is of a kind the constraint engine
    /// does not read. The client's fault or the model's; answered 400.
    #[error("{reason}")]
    Grammar {
        /// What is wrong, for the client.
        reason: String,
    },

    /// A request offers tools to a model that cannot call them: its chat template
    /// takes no `tools`, or its tool-call format is unknown. Answered 400.
    #[error(
        "this model cannot call tools: its chat template takes no `tools` or writes calls in no format the engine knows \
         (Hermes `<tool_call>`, Llama 3 JSON, Mistral `[TOOL_CALLS]`); help: send the request without `tools`"
    )]
    CannotCallTools,

    /// Constrained sampling failed while generating (the grammar engine's own error).
    #[error("constrained sampling failed: {reason}")]
    Constraint {
        /// The grammar engine's message.
        reason: String,
    },

    /// The prompt could not be tokenized or the output decoded.
    #[error("tokenizing or decoding failed")]
    Tokenize {
        /// The tokenizers library's error.
        #[source]
        source: tokenizers::Error,
    },

    /// A candle operation failed: loading weights or running the model.
    #[error("candle failed to {action}")]
    Candle {
        /// What was being done (`load the weights of …`).
        action: String,
        /// Candle's error.
        #[source]
        source: candle_core::Error,
    },

    /// The device asked for is not available in this build or on this machine.
    #[error("device `{device}` is not available: {reason}")]
    Device {
        /// The device as given (`cuda:0`).
        device: String,
        /// Why.
        reason: String,
    },

    /// The listen address could not be bound.
    #[error("cannot listen on {addr}; help: pick another port or stop what uses it")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The IO error.
        #[source]
        source: std::io::Error,
    },

    /// The HTTP server stopped with an error.
    #[error("the HTTP server failed")]
    Serve {
        /// The IO error.
        #[source]
        source: std::io::Error,
    },

    /// The generation thread is gone (it panicked or the model failed to load).
    #[error("the engine's generation thread has stopped")]
    EngineStopped,
}
