//! Why a LoRA adapter cannot be read, or served by an engine: a variant of the crate's
//! [`Error`] (`Error::Adapter`), each saying what is wrong, where, and how to fix it.

use crate::Error;
use crate::config::Architecture;

/// Why a LoRA adapter cannot be read or served.
#[derive(Debug, thiserror::Error)]
pub enum AdapterError {
    /// `adapter_config.json` is not a JSON object.
    #[error("adapter_config.json is not a JSON object; help: it should be the file PEFT's save_pretrained writes")]
    AdapterConfigJson {
        /// The parser's error, with line and column.
        #[source]
        source: serde_json::Error,
    },

    /// A field of `adapter_config.json` that is missing, of the wrong type or out of range.
    #[error("`{field}` in adapter_config.json is {found}; expected {expected}")]
    AdapterConfigField {
        /// The field (`r`, `lora_alpha`, `target_modules`, `rank_pattern.q_proj`, …).
        field: String,
        /// Its value as JSON (shortened when long), or `missing`.
        found: String,
        /// What it must hold, with a hint when one helps.
        expected: &'static str,
    },

    /// A PEFT adapter of another kind than LoRA.
    #[error(
        "this is a PEFT `{peft_type}` adapter, not a LoRA adapter (`peft_type` must be `LORA`); help: vLLM \
         (--enable-lora) and llama.cpp (--lora) serve LoRA adapters only: choose a LoRA adapter, or merge this \
         one into its base model and serve the merged model"
    )]
    NotLora {
        /// The `peft_type` found.
        peft_type: String,
    },

    /// A LoRA tensor whose shape is not a matrix of the LoRA layout (`lora_A` is
    /// `[r, in]`, `lora_B` is `[out, r]`) or whose rank disagrees with its partner or with
    /// the adapter's configured rank.
    #[error("LoRA tensor `{tensor}` has shape {shape:?}: {problem}")]
    LoraTensorShape {
        /// The tensor's name.
        tensor: String,
        /// Its shape, row-major.
        shape: Vec<u64>,
        /// What is wrong, with the expected value and a hint.
        problem: String,
    },

    /// A module with one LoRA matrix but not the other.
    #[error(
        "LoRA module `{module}` has `{present}` but no `{missing}`; help: the adapter file is incomplete, \
         upload it again"
    )]
    LoraTensorUnpaired {
        /// The module (`base_model.model.model.layers.0.self_attn.q_proj`).
        module: String,
        /// The tensor present.
        present: String,
        /// The partner that is missing (`lora_B`, `lora_b`).
        missing: &'static str,
    },

    /// An adapter weight file without a single LoRA matrix pair.
    #[error(
        "the adapter holds no LoRA tensors (no `lora_A`/`lora_B` pairs); help: this is not a LoRA adapter's weight \
         file"
    )]
    NoLoraTensors,

    /// A GGUF file that is not a llama.cpp LoRA adapter.
    #[error(
        "the GGUF file is not a LoRA adapter: `{key}` is {found}, expected {expected}; help: llama.cpp's \
         convert_lora_to_gguf.py writes LoRA adapters with `general.type = \"adapter\"` and \
         `adapter.type = \"lora\"`; a full model GGUF is not an adapter"
    )]
    GgufNotAdapter {
        /// The metadata key (`general.type`, `adapter.type`, `adapter.lora.alpha`).
        key: &'static str,
        /// What it holds, or `missing`.
        found: String,
        /// What it must hold.
        expected: &'static str,
    },

    /// An adapter repository with safetensors weights but no `adapter_config.json`.
    #[error(
        "`{repo}` has `{weights}` but no adapter_config.json at commit {sha}, so its rank, alpha and base model \
         are unknown; help: PEFT's save_pretrained writes both files: upload adapter_config.json too, or name \
         another revision"
    )]
    AdapterConfigMissing {
        /// The repository.
        repo: String,
        /// The commit.
        sha: String,
        /// The weight file present.
        weights: String,
    },

    /// A repository with no LoRA adapter weights in a format Skein reads.
    #[error(
        "`{repo}` has no LoRA adapter at commit {sha}: neither adapter_model.safetensors nor a GGUF adapter{}; \
         help: name a PEFT LoRA repository (adapter_config.json and adapter_model.safetensors) or a llama.cpp \
         GGUF LoRA (from convert_lora_to_gguf.py){}",
        if *.has_config { " (it has adapter_config.json)" } else { "" },
        if *.pickle { "; adapter_model.bin is a pickle, which Skein does not load: convert it to safetensors" } else { "" }
    )]
    NoAdapterWeights {
        /// The repository.
        repo: String,
        /// The commit.
        sha: String,
        /// Whether it has `adapter_config.json`.
        has_config: bool,
        /// Whether it has pickle adapter weights (`adapter_model.bin`).
        pickle: bool,
    },

    /// A file of a LoRA adapter repository that cannot be read as one.
    #[error("cannot read the LoRA adapter file `{file}` of `{repo}`")]
    HubAdapter {
        /// The repository.
        repo: String,
        /// The file (`adapter_config.json`, `adapter_model.safetensors`, a `.gguf`).
        file: String,
        /// What is wrong with it.
        #[source]
        source: Box<Error>,
    },

    /// An engine that cannot serve LoRA adapters on a model of this architecture.
    #[error("{engine} serves no LoRA adapters on {architecture} models; help: {help}")]
    LoraUnsupported {
        /// The engine.
        engine: &'static str,
        /// The base model's architecture.
        architecture: Architecture,
        /// What to do instead.
        help: &'static str,
    },
}
