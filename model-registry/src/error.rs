//! The crate's error type.

use crate::config::Architecture;
use crate::dtype::{GgmlType, SafetensorsDtype, TensorDtype};

/// Everything that can go wrong in this crate.
///
/// Each variant names the input that was refused, so a caller can report it without
/// extra context. The enum is `#[non_exhaustive]` because the hub and estimator layers
/// will add their own variants.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A safetensors header names a dtype that the format does not define.
    #[error("unknown safetensors dtype `{found}`{}", did_you_mean(*.suggestion))]
    UnknownSafetensorsDtype {
        /// The string found in the header.
        found: String,
        /// A known dtype that differs from `found` only in letter case.
        suggestion: Option<SafetensorsDtype>,
    },

    /// A GGUF tensor info carries a type id that ggml never defined (or that this
    /// crate does not know yet).
    #[error("unknown GGML tensor type id {id}; help: the file may need a newer Skein")]
    UnknownGgmlType {
        /// The numeric type id from the GGUF tensor info.
        id: u32,
    },

    /// A GGUF tensor info carries the id of a type that ggml once defined and has since
    /// removed; current loaders refuse such files.
    #[error(
        "GGML tensor type id {id} ({name}) was removed from ggml and is no longer loadable; \
         help: re-convert the model with a current llama.cpp"
    )]
    RemovedGgmlType {
        /// The numeric type id from the GGUF tensor info.
        id: u32,
        /// The name the type had in ggml before its removal.
        name: &'static str,
    },

    /// A GGML type name (such as `Q4_K`) that this crate does not know.
    #[error("unknown GGML tensor type name `{found}`")]
    UnknownGgmlTypeName {
        /// The name that was given.
        found: String,
    },

    /// A row of a block-quantized GGML tensor is not a whole number of blocks. ggml
    /// quantizes each row on its own, so the first (contiguous) dimension must be a
    /// multiple of the block size.
    #[error(
        "a {ggml_type} row of {row_elements} elements is not a whole number of \
         {}-element blocks",
        .ggml_type.elements_per_block()
    )]
    PartialBlock {
        /// The block-quantized type.
        ggml_type: GgmlType,
        /// The number of elements in one row (GGUF `ne[0]`).
        row_elements: u64,
    },

    /// A sub-byte safetensors tensor whose element count does not fill whole bytes.
    #[error(
        "{n_elements} elements of {dtype} take {} bits, which is not a whole number of bytes",
        u128::from(*.n_elements) * u128::from(.dtype.bits())
    )]
    MisalignedSubByte {
        /// The sub-byte dtype.
        dtype: SafetensorsDtype,
        /// The number of elements in the tensor.
        n_elements: u64,
    },

    /// A tensor's size in bytes (or elements) does not fit in a `u64`. No real file can
    /// hold such a tensor, so its header is corrupt.
    #[error("a {dtype} tensor of shape {shape:?} is larger than 2^64 bytes; the header is corrupt")]
    TensorTooLarge {
        /// The tensor's storage type.
        dtype: TensorDtype,
        /// The shape as given.
        shape: Vec<u64>,
    },

    /// A `config.json` is not valid JSON.
    #[error("config.json is not valid JSON")]
    ConfigNotJson {
        /// The parser's error, with line and column.
        #[source]
        source: serde_json::Error,
    },

    /// A key that the parameter count needs is absent from `config.json` (or `null`), and
    /// the model type defines no default for it.
    #[error("config.json has no `{key}`; help: a {architecture} config needs it to count parameters")]
    MissingConfigKey {
        /// The key, with its section (`text_config.hidden_size`) when nested.
        key: String,
        /// The architecture whose config was being read.
        architecture: Architecture,
    },

    /// A key of `config.json` holds a value of the wrong type or out of range.
    #[error("`{key}` in config.json is {found}; expected {expected}")]
    InvalidConfigValue {
        /// The key, with its section when nested; `(root)` for the document itself.
        key: String,
        /// The offending value, as JSON (shortened when long).
        found: String,
        /// What the key must hold.
        expected: &'static str,
    },

    /// `config.json` names a model type (or only architecture classes) that Skein cannot
    /// count from the config alone.
    #[error(
        "`{key}` is {found}, which Skein cannot size from config.json; supported model types: {}",
        Architecture::supported_list()
    )]
    UnsupportedArchitecture {
        /// `model_type`, `architectures`, `text_config.model_type` or `vision_config.model_type`.
        key: String,
        /// What that key holds, as JSON.
        found: String,
    },

    /// Sizes in a `config.json` are so large that a count overflows 64 bits. No real model
    /// is that large, so the config is corrupt.
    #[error("sizes in this {architecture} config.json overflow 64-bit arithmetic; the config is corrupt")]
    ConfigArithmeticOverflow {
        /// The architecture whose config was being counted.
        architecture: Architecture,
    },

    /// A GGUF header that cannot be read as a model config (for GGUF-only repositories,
    /// which publish no `config.json`); see [`ModelConfig::from_gguf`].
    ///
    /// [`ModelConfig::from_gguf`]: crate::ModelConfig::from_gguf
    #[error("{problem}")]
    GgufConfig {
        /// What is missing, unsupported or invalid, naming the GGUF key or tensor.
        problem: crate::config::GgufConfigProblem,
    },

    /// Fewer than the 8 bytes of a safetensors header length were given.
    #[error("a safetensors file starts with an 8-byte header length, but only {len} bytes were given")]
    SafetensorsPrefixTooShort {
        /// The number of bytes given.
        len: usize,
    },

    /// A safetensors header length beyond what loaders accept: the file is corrupt or
    /// hostile, and reading that many bytes is refused.
    #[error("the safetensors header claims {len} bytes, more than the {limit} that loaders accept")]
    SafetensorsHeaderTooLarge {
        /// The length in the file.
        len: u64,
        /// The largest accepted length.
        limit: u64,
    },

    /// A safetensors header is not valid JSON, or not of the header's shape (a field of
    /// the wrong type, non-string metadata, a tensor listed twice).
    #[error("the safetensors header is malformed")]
    SafetensorsHeaderJson {
        /// The parser's error, with line and column.
        #[source]
        source: serde_json::Error,
    },

    /// A tensor of a safetensors header has an invalid dtype or shape.
    #[error("invalid safetensors tensor `{name}`")]
    SafetensorsTensor {
        /// The tensor's name.
        name: String,
        /// What is wrong with it.
        #[source]
        source: Box<Error>,
    },

    /// A safetensors tensor's byte range does not have the size its dtype and shape need.
    #[error(
        "safetensors tensor `{name}` ({dtype} {shape:?}) needs {} bytes but its data_offsets span {} bytes",
        .expected.get(),
        .found.get()
    )]
    SafetensorsSizeMismatch {
        /// The tensor's name.
        name: String,
        /// Its dtype.
        dtype: SafetensorsDtype,
        /// Its shape.
        shape: Vec<u64>,
        /// Bytes that dtype and shape need.
        expected: crate::Bytes,
        /// Bytes between its data offsets.
        found: crate::Bytes,
    },

    /// The tensors' byte ranges do not tile the data section: one is reversed, or leaves
    /// a gap after the previous tensor, or overlaps it.
    #[error(
        "safetensors tensor `{name}` has data_offsets [{start}, {end}], but tensors must fill the data \
         section in order without gaps or overlaps: it should start at byte {expected_start}"
    )]
    SafetensorsOffsets {
        /// The first tensor (in offset order) that is out of place.
        name: String,
        /// Its start offset.
        start: u64,
        /// Its end offset.
        end: u64,
        /// Where the previous tensor ended.
        expected_start: u64,
    },

    /// A safetensors file's size differs from its header's account of it.
    #[error("the safetensors file should be {expected} bytes long by its header, but is {found} bytes")]
    SafetensorsFileSize {
        /// Length prefix, header and data section.
        expected: u64,
        /// The size of the file.
        found: u64,
    },

    /// A packed-weight bit width outside 1 to 32.
    #[error("{bits} bits per packed weight is impossible; GPTQ and AWQ use 2, 3, 4 or 8")]
    InvalidPackedBits {
        /// The width given.
        bits: u32,
    },

    /// A packed `qweight` does not unpack to a whole number of weights of the given
    /// width: the bits do not belong to this checkpoint.
    #[error(
        "`{name}` holds {words} 32-bit words, which do not unpack to whole {bits}-bit weights; \
         help: check `bits` in quantization_config"
    )]
    PackedBitsMismatch {
        /// The `qweight` tensor.
        name: String,
        /// Its element count.
        words: u64,
        /// The width given.
        bits: u32,
    },

    /// `model.safetensors.index.json` is not valid JSON or has no `weight_map`.
    #[error("the safetensors index is malformed")]
    ShardIndexJson {
        /// The parser's error, with line and column.
        #[source]
        source: serde_json::Error,
    },

    /// The safetensors index names a shard file outside the repository.
    #[error("the safetensors index places `{tensor}` in `{file}`, which is not a file path inside the repository")]
    ShardIndexBadFile {
        /// The tensor whose entry names the file.
        tensor: String,
        /// The file path as given.
        file: String,
    },

    /// A GGUF file does not start with the magic `GGUF`.
    #[error("not a GGUF file: it starts with \"{}\" instead of \"GGUF\"", .found.escape_ascii())]
    GgufBadMagic {
        /// The first bytes of the file (up to four).
        found: Vec<u8>,
    },

    /// A GGUF version other than 2 and 3.
    #[error("GGUF version {version} is not supported{}", gguf_version_help(*.version))]
    GgufVersion {
        /// The version field as read (little-endian).
        version: u32,
    },

    /// A GGUF metadata value (or array item) of a type GGUF does not define.
    #[error("GGUF metadata `{key}` has value type {id}, which GGUF does not define")]
    GgufValueType {
        /// The key whose value (or array item) has the type.
        key: String,
        /// The type id read.
        id: u32,
    },

    /// A count or size in a GGUF header beyond what any real file has: the file is
    /// corrupt or hostile, and is refused before anything is allocated for it.
    #[error("GGUF {what}: {value} exceeds the limit of {limit}; the file is corrupt")]
    GgufLimit {
        /// What was counted (`tensors`, `header bytes`, …).
        what: &'static str,
        /// The value in (or implied by) the file.
        value: u64,
        /// The largest accepted value.
        limit: u64,
    },

    /// A GGUF metadata key or tensor name that is not UTF-8.
    #[error("the GGUF string at byte {offset} is a key or tensor name but not UTF-8")]
    GgufUtf8 {
        /// Offset of the string's length field in the file.
        offset: u64,
    },

    /// A GGUF metadata key that appears twice.
    #[error("GGUF metadata key `{key}` appears twice")]
    GgufDuplicateKey {
        /// The key.
        key: String,
    },

    /// A GGUF tensor name that appears twice.
    #[error("GGUF tensor `{name}` appears twice")]
    GgufDuplicateTensor {
        /// The name.
        name: String,
    },

    /// `general.alignment` is not a power of two that fits in a `u32`.
    #[error("GGUF `general.alignment` must be a power of two (a u32), but is {found}")]
    GgufAlignment {
        /// The value's type and value (`u32 48`).
        found: String,
    },

    /// A GGUF tensor info with an invalid ggml type or dimensions.
    #[error("invalid GGUF tensor `{name}`")]
    GgufTensor {
        /// The tensor's name.
        name: String,
        /// What is wrong with it.
        #[source]
        source: Box<Error>,
    },

    /// A GGUF tensor whose data offset is not where the previous tensor's padded data
    /// ends (ggml requires tensors to fill the data section in order).
    #[error("GGUF tensor `{name}` has offset {offset}, but the previous tensors end at {expected}")]
    GgufTensorOffset {
        /// The tensor's name.
        name: String,
        /// The offset in its info.
        offset: u64,
        /// Where its data must start.
        expected: u64,
    },

    /// A whole GGUF file (not a prefix) ended inside its header.
    #[error("the GGUF file is truncated: its header needs at least {needed} bytes but the file has {len}")]
    GgufTruncated {
        /// Bytes the header needs, at least.
        needed: u64,
        /// Bytes the file has.
        len: u64,
    },

    /// A quantization method, dtype or GGUF file type that Skein cannot size or run.
    #[error("unsupported quantization `{found}`; help: choose another variant")]
    UnsupportedQuantization {
        /// The method (`quant_method`), dtype or type name as found.
        found: String,
    },

    /// A field of a known `quantization_config` that is missing or malformed.
    #[error("quantization_config field `{field}` is missing or invalid (found {found})")]
    QuantizationConfigField {
        /// The field.
        field: &'static str,
        /// Its value as JSON, or `nothing`.
        found: String,
    },

    /// A repository id that is not `owner/name` as the hub spells ids.
    #[error(
        "`{found}` is not a Hugging Face repository id: {reason}; help: write it as `owner/name`, \
         for example `meta-llama/Meta-Llama-3-8B`"
    )]
    InvalidRepoId {
        /// The id as given.
        found: String,
        /// What is wrong with it.
        reason: &'static str,
    },

    /// The hub client could not be set up (an `HF_ENDPOINT` that is not a URL).
    #[cfg(feature = "hub")]
    #[error("cannot set up a hub client for endpoint `{endpoint}`; help: check HF_ENDPOINT")]
    HubClient {
        /// The endpoint configured.
        endpoint: String,
        /// The client library's error.
        #[source]
        source: Box<hf_hub::HFError>,
    },

    /// A call to the hub failed: the repository, revision or file does not exist, access
    /// was refused, the network failed, or the hub answered with an error.
    #[cfg(feature = "hub")]
    #[error("cannot {action} for `{repo}` from the hub{}", hub_help(.source))]
    Hub {
        /// The repository.
        repo: String,
        /// What was being done, as a verb phrase (`read the repository info at revision main`).
        action: String,
        /// The client library's error, with the HTTP status and URL.
        #[source]
        source: Box<hf_hub::HFError>,
    },

    /// A call to the hub took longer than the configured timeout.
    #[error(
        "cannot {action} for `{repo}` from the hub: no answer within {timeout_ms} ms; help: check the \
         network and HF_ENDPOINT"
    )]
    HubTimeout {
        /// The repository.
        repo: String,
        /// What was being done.
        action: String,
        /// The timeout.
        timeout_ms: u64,
    },

    /// Offline (`HF_HUB_OFFLINE`), and the cache lacks what was asked for.
    #[error(
        "HF_HUB_OFFLINE is set, and the cache at {} lacks {what} of `{repo}`; help: run once online \
         (with HF_HUB_OFFLINE unset) to fill the cache, or unset HF_HUB_OFFLINE",
        .cache.display()
    )]
    HubOffline {
        /// The repository.
        repo: String,
        /// What is missing (`the file list at revision `main``).
        what: String,
        /// The Hugging Face cache folder that was searched.
        cache: std::path::PathBuf,
    },

    /// The hub answered, but not as its protocol promises.
    #[error("the hub's answer for `{repo}` is invalid: {detail}")]
    HubResponse {
        /// The repository.
        repo: String,
        /// What was wrong with the answer.
        detail: String,
    },

    /// A file that the repository does not have at the resolved commit.
    #[error("`{repo}` has no file `{file}` at commit {sha}")]
    HubFileMissing {
        /// The repository.
        repo: String,
        /// The commit.
        sha: String,
        /// The path asked for.
        file: String,
    },

    /// A file asked for as metadata that is far too large to be metadata.
    #[error("`{file}` of `{repo}` is {size} bytes, more than the {limit} bytes Skein reads as metadata")]
    HubFileTooLarge {
        /// The repository.
        repo: String,
        /// The path.
        file: String,
        /// Its size on the hub.
        size: u64,
        /// The largest size read.
        limit: u64,
    },

    /// A header (or shard index) read from the hub that its parser refused.
    #[error("cannot read the header of `{file}` in `{repo}`")]
    HubHeader {
        /// The repository.
        repo: String,
        /// The file whose header it is.
        file: String,
        /// The parser's error.
        #[source]
        source: Box<Error>,
    },

    /// The hub answered a download with a header that Skein would have to make a cache
    /// path of, and that is not what the protocol promises: a commit other than the one
    /// asked for, or an ETag that is not a hex digest (`"../../x"`, say). Nothing was
    /// written.
    #[error(
        "refused the hub's answer for `{file}` of `{repo}`: its {header} header {value} {reason}; \
         nothing was written. The hub at HF_ENDPOINT, or something between it and Skein (a proxy), \
         is misbehaving; help: check HF_ENDPOINT and any proxy (HTTPS_PROXY), and tell the hub's operator"
    )]
    HubUntrustedAnswer {
        /// The repository.
        repo: String,
        /// The file asked for.
        file: String,
        /// The header refused (`X-Repo-Commit`, `X-Linked-Etag`, `ETag`).
        header: &'static str,
        /// Its value, quoted and escaped (empty when missing). Boxed, as is `reason`
        /// static, to keep the error small.
        value: Box<str>,
        /// What is wrong with it.
        reason: &'static str,
    },

    /// The HTTP client for downloads could not be set up.
    #[cfg(feature = "hub")]
    #[error("cannot set up the HTTP client for hub downloads")]
    HubHttpSetup {
        /// The HTTP library's error.
        #[source]
        source: reqwest::Error,
    },

    /// A download request failed on the network.
    #[cfg(feature = "hub")]
    #[error("cannot {action} for `{repo}` from the hub; help: check the network and HF_ENDPOINT")]
    HubTransfer {
        /// The repository.
        repo: String,
        /// What was being done.
        action: String,
        /// The HTTP library's error.
        #[source]
        source: reqwest::Error,
    },

    /// The hub answered a download request with an error status.
    #[error("cannot {action} for `{repo}` from the hub: {url} answered HTTP {status}{}", status_help(*.status))]
    HubStatus {
        /// The repository.
        repo: String,
        /// What was being done.
        action: String,
        /// The HTTP status.
        status: u16,
        /// The URL asked.
        url: String,
    },

    /// A download cannot be written into the Hugging Face cache.
    #[error("cannot write {} in the Hugging Face cache; help: check the space and permissions there (HF_HUB_CACHE)", .path.display())]
    HubCacheWrite {
        /// The path written.
        path: std::path::PathBuf,
        /// The IO error.
        #[source]
        source: std::io::Error,
    },

    /// A file that was just downloaded into the Hugging Face cache cannot be read back.
    #[error("cannot read {} from the Hugging Face cache", .path.display())]
    HubCacheRead {
        /// The cached file.
        path: std::path::PathBuf,
        /// The IO error.
        #[source]
        source: std::io::Error,
    },

    /// A repository whose only weights are pickle files, which can run arbitrary code
    /// when loaded.
    #[error(
        "`{repo}` offers only pickle weights ({}), which can run arbitrary code when loaded; help: choose \
         a safetensors or GGUF variant of the model, or opt in to pickle weights (allow_pickle)",
        .files.join(", ")
    )]
    PickleOnly {
        /// The repository.
        repo: String,
        /// Its pickle weight files.
        files: Vec<String>,
    },

    /// An estimate request with a value out of range.
    #[error("estimate request `{field}` is {found}; expected {expected}")]
    InvalidEstimateRequest {
        /// The field (`context`, `concurrency`, `layout`, …).
        field: &'static str,
        /// Its value.
        found: String,
        /// What it must be.
        expected: &'static str,
    },

    /// A figure of a memory estimate overflows 64 bits; the inputs are absurd.
    #[error("the memory estimate overflows 64-bit arithmetic at {what}; the model or request is absurd")]
    EstimateOverflow {
        /// The figure that overflowed.
        what: &'static str,
    },

    /// A KV-cache type of `auto` where a concrete type is needed.
    #[error("the KV-cache type `auto` must be resolved against an engine before sizing a cache")]
    KvDtypeUnresolved,

    /// An engine that cannot load a variant's weights.
    #[error("{engine} cannot load {weights}; help: {help}")]
    EngineCannotLoad {
        /// The engine.
        engine: &'static str,
        /// The variant's quantization.
        weights: String,
        /// What to do instead.
        help: &'static str,
    },

    /// A KV-cache type the engine does not offer.
    #[error("{engine} has no `{kv_dtype}` KV cache; it offers {supported}")]
    KvDtypeUnsupported {
        /// The engine.
        engine: &'static str,
        /// The type asked for.
        kv_dtype: crate::estimate::KvDtype,
        /// The types it offers.
        supported: &'static str,
    },

    /// A layout the engine cannot run.
    #[error("{engine} cannot run the layout {layout}; help: {help}")]
    UnsupportedLayout {
        /// The engine.
        engine: &'static str,
        /// The layout (`TP 2 × PP 1`).
        layout: String,
        /// What to do instead.
        help: &'static str,
    },

    /// A tensor-parallel degree the model does not allow.
    #[error("tensor parallelism of degree {degree} is impossible for this model: {reason}")]
    InvalidTensorParallel {
        /// The degree.
        degree: u64,
        /// Why.
        reason: crate::estimate::TpInvalid,
    },

    /// A pipeline split that leaves a stage without layers.
    #[error(
        "pipeline stage {stage} would get none of the {layers} layers; help: give it a larger share or \
         use fewer stages"
    )]
    EmptyPipelineStage {
        /// The stage (from 0).
        stage: usize,
        /// The model's decoder layers.
        layers: u64,
    },

    /// A weight header tensor of a layer the model does not have.
    #[error("tensor `{name}` belongs to a layer beyond the model's {layers}; the header is of another model")]
    TensorOutsideModel {
        /// The tensor's name.
        name: String,
        /// The model's decoder layers.
        layers: u64,
    },

    /// A GPU name that is neither in the catalog nor a memory size.
    #[error("unknown GPU `{found}`{}; help: name one of {known}, or give its memory (`48GiB`)", suggestion_text(.suggestions))]
    UnknownGpu {
        /// The name given.
        found: String,
        /// Catalog names close to it.
        suggestions: Vec<String>,
        /// Every catalog name, comma-separated.
        known: String,
    },

    /// A GPU set that does not read as `NAME[:COUNT]` joined by `+`.
    #[error(
        "invalid GPU set `{spec}`: {reason}; help: write e.g. `A100-80GB`, `RTX4090-24GB:2` or `A100-80GB+RTX4090-24GB`"
    )]
    InvalidGpuSet {
        /// The set as given.
        spec: String,
        /// What is wrong.
        reason: String,
    },

    /// The shards of a safetensors checkpoint disagree with its index.
    #[error("the shards disagree with `model.safetensors.index.json`: {detail}")]
    ShardIndexMismatch {
        /// The first disagreement.
        detail: String,
    },

    /// A variant whose weights are of another model than the one asked about.
    #[error("its weights are of another model: {detail}")]
    OtherModel {
        /// What differs.
        detail: String,
    },

    /// A repository with neither `config.json` nor a GGUF file to read the model's shape from.
    #[error(
        "`{repo}` has no config.json and no GGUF file, so its shape is unknown; help: name the base model's repository"
    )]
    NoModelShape {
        /// The repository.
        repo: String,
    },

    /// A LoRA adapter that cannot be read, or served by an engine ([`AdapterError`](crate::adapter::AdapterError)).
    #[error(transparent)]
    Adapter(#[from] crate::adapter::AdapterError),

    /// A fit check with a usable-memory figure count unlike the estimate's devices.
    #[error("the estimate has {devices} devices but {usable} usable-memory figures were given")]
    DeviceCountMismatch {
        /// Devices in the estimate.
        devices: usize,
        /// Figures given.
        usable: usize,
    },
}

/// A hint for an HTTP status of a download.
fn status_help(status: u16) -> &'static str {
    match status {
        401 | 403 => "; help: the repository may be gated or private: accept its terms on the hub and set HF_TOKEN",
        404 => "; help: the file is gone from the hub at this commit; check the repository",
        429 => "; help: the hub is rate-limiting requests; wait, or set HF_TOKEN",
        _ => "",
    }
}

/// A hint for the hub failures a user can fix.
#[cfg(feature = "hub")]
fn hub_help(error: &hf_hub::HFError) -> &'static str {
    use hf_hub::HFError;
    const REPO_HELP: &str =
        "; help: check the repository id (the hub also says \"not found\" for a private repository without HF_TOKEN)";
    match error {
        HFError::AuthRequired { .. } | HFError::Forbidden { .. } => {
            "; help: the repository may be gated or private: accept its terms on the hub and set HF_TOKEN"
        }
        HFError::RepoNotFound { .. } => REPO_HELP,
        // A revision URL of a missing repository is a 404 too; the hub's error code tells
        // which is missing.
        HFError::RevisionNotFound {
            context: Some(context), ..
        } if context.error_code.as_deref() == Some("RepoNotFound") => REPO_HELP,
        HFError::RevisionNotFound { .. } => {
            "; help: check the repository id and the revision (a branch, tag or commit id)"
        }
        HFError::RateLimited { .. } => "; help: the hub is rate-limiting requests; wait, or set HF_TOKEN",
        _ => "",
    }
}

fn suggestion_text(suggestions: &[String]) -> String {
    match suggestions {
        [] => String::new(),
        [one] => format!(" (did you mean `{one}`?)"),
        many => format!(
            " (did you mean one of {}?)",
            many.iter().map(|s| format!("`{s}`")).collect::<Vec<_>>().join(", ")
        ),
    }
}

fn did_you_mean(suggestion: Option<SafetensorsDtype>) -> String {
    match suggestion {
        Some(dtype) => format!("; help: dtype names are case-sensitive, did you mean `{dtype}`?"),
        None => String::new(),
    }
}

/// For a version that reads as 2 or 3 with its bytes swapped, the file is big-endian.
fn gguf_version_help(version: u32) -> &'static str {
    if matches!(version.swap_bytes(), 2 | 3) {
        "; help: this is a big-endian GGUF file, which Skein does not read"
    } else if version == 1 {
        "; help: GGUF v1 is obsolete; re-convert the model with a current llama.cpp"
    } else {
        " (only versions 2 and 3)"
    }
}

/// An error and its causes, `: `-joined: the one line a log or an HTTP answer shows.
pub fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}
