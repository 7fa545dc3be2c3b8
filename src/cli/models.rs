//! `skein models …`: model variants and memory fit.

use clap::{Args, Subcommand, ValueEnum};

use super::common::{OutputFormat, RemoteArgs};

/// `skein models …`.
#[derive(Debug, Subcommand)]
pub enum ModelsCommand {
    /// Show a model's shape and every variant: format, method, bits, size, valid
    /// tensor-parallel degrees.
    ///
    /// Reads `config.json` and the weight headers by HTTP range requests, never the
    /// weights, and caches them under the Hugging Face cache so a second run is offline.
    /// Honours HF_ENDPOINT, HF_TOKEN, HF_HOME / HF_HUB_CACHE and HF_HUB_OFFLINE.
    Inspect(InspectArgs),
    /// Show, for each variant, which of the given GPU sets it fits and how, best first.
    ///
    /// Exits 0 when some variant fits some set, 1 when none does.
    Fit(FitArgs),
    /// Memory that instances on a running server really used once loaded, beside the
    /// plan's estimate for them.
    Measured(MeasuredArgs),
}

/// `skein models measured`.
#[derive(Debug, Args)]
pub struct MeasuredArgs {
    #[command(flatten)]
    pub remote: RemoteArgs,
    /// Output format: a table, or JSON.
    #[arg(long, value_enum, default_value_t = OutputFormat::Human)]
    pub output: OutputFormat,
}

/// Where and how much to read from the hub.
#[derive(Debug, Args)]
pub struct HubArgs {
    /// Quantized derivatives (the hub's `base_model:quantized:` list, most downloaded
    /// first) to list besides the repository's own variants; 0 for none.
    #[arg(long, default_value_t = skein_model_registry::hub::DEFAULT_DERIVATIVES, value_name = "N")]
    pub derivatives: usize,
    /// Read the weight headers of derivatives too, so their sizes are exact rather than
    /// computed (a GGUF header is up to a few MiB).
    #[arg(long)]
    pub derivative_headers: bool,
    /// A variant to list besides those discovered, repeatable: `owner/name`,
    /// `owner/name@REVISION`, or `owner/name:file.gguf` for one GGUF file. Its headers
    /// are read, so its figures are exact.
    #[arg(long = "variant", value_name = "REPO[@REV][:FILE]")]
    pub variants: Vec<String>,
    /// Accept repositories whose only weights are pickle files (`.bin`, `.pt`), which
    /// can run code when loaded.
    #[arg(long)]
    pub allow_pickle: bool,
    /// Use only the cache, as HF_HUB_OFFLINE=1 does.
    #[arg(long)]
    pub offline: bool,
}

/// `skein models inspect`.
#[derive(Debug, Args)]
pub struct InspectArgs {
    /// The model: `owner/name`, or `owner/name@REVISION` (branch, tag or commit).
    #[arg(value_name = "REPO[@REV]")]
    pub model: String,
    /// Output format: a report, or one JSON document.
    #[arg(long, value_enum, default_value_t = OutputFormat::Human)]
    pub output: OutputFormat,
    #[command(flatten)]
    pub hub: HubArgs,
}

/// `skein models fit`.
#[derive(Debug, Args)]
pub struct FitArgs {
    /// The model: `owner/name`, or `owner/name@REVISION`.
    #[arg(value_name = "REPO[@REV]")]
    pub model: String,
    /// A GPU set to check, repeatable: `A100-80GB`, `RTX4090-24GB:2` (two of them),
    /// `A100-80GB+RTX4090-24GB` (a mix, split by layers), or a size such as `48GiB`.
    #[arg(long = "gpu", required = true, value_name = "SET")]
    pub gpus: Vec<String>,
    /// Context tokens per sequence (prompt and generation).
    #[arg(long, default_value_t = 8192)]
    pub context: u64,
    /// Sequences served at once, each with the full context.
    #[arg(long, default_value_t = 1)]
    pub concurrency: u64,
    /// KV-cache element type; `auto` is the engine's default (16-bit).
    #[arg(long, value_enum, default_value_t = KvCacheType::Auto)]
    pub kv_cache: KvCacheType,
    /// Also list the variants that fit no set.
    #[arg(long)]
    pub all: bool,
    /// Output format: a report, or one JSON document.
    #[arg(long, value_enum, default_value_t = OutputFormat::Human)]
    pub output: OutputFormat,
    #[command(flatten)]
    pub hub: HubArgs,
}

/// KV-cache element types on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum KvCacheType {
    /// The engine's default.
    Auto,
    /// IEEE half.
    F16,
    /// bfloat16.
    Bf16,
    /// 8-bit float (vLLM).
    Fp8,
    /// ggml q8_0 blocks (llama.cpp).
    #[value(name = "q8_0")]
    Q8_0,
    /// ggml q4_0 blocks (llama.cpp).
    #[value(name = "q4_0")]
    Q4_0,
}
