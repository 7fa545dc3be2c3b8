//! Reference models for the planner's tests and benchmarks: five published models with
//! their real `config.json` and the variants the hub typically offers for each (the
//! model's own checkpoint, AWQ and GPTQ derivatives, GGUF files).
//!
//! Two views of the same models:
//!
//! - [`model_info`] and [`reference_models`]: the [`ModelInfo`] that
//!   `HubClient::inspect` returns, built through the registry's public API the way
//!   `inspect` builds a derivative it has not read the headers of: the shape from the
//!   config, each variant's bytes computed from its quantization
//!   ([`WeightsSource::Computed`]), the listing order of [`sort_variants`]. No IO.
//! - [`reference_hub_repos`]: the same models as mock-hub repositories whose configs
//!   and weight headers describe the real tensors (bodies are virtual), so that
//!   `inspect` against a [`MockHub`](crate::mock_hub::MockHub) lists the same variants,
//!   with exact sizes.
//!
//! Every commit is [`hex40`] of the repository id, as [`MockRepo::new`] sets it, so the
//! two views agree on commits too.

use std::collections::BTreeMap;

use serde_json::Value;
use skein_model_registry::catalog::{MAX_LISTED_TP_DEGREE, ModelInfo, ShapeSource, Variant, sort_variants};
use skein_model_registry::hub::{CommitSha, RepoId, VariantSource};
use skein_model_registry::task::{ModelTask, TaskSignals};
use skein_model_registry::{
    Bytes, GgufFileType, ModelConfig, ModelShape, Quantization, SafetensorsDtype, WeightFormat, WeightGroups,
    WeightsSource, tp_degrees,
};

use crate::mock_hub::{MockRepo, hex40};
use crate::tensors::{Storage, checkpoint_tensors, gguf_mmproj, gguf_model};
use crate::{LLAMA_70B_CONFIG, gguf_prefix, gguf_split_evenly, safetensors_prefix, shard_evenly};

/// `save_pretrained`'s default `max_shard_size` (`"5GB"`): a checkpoint of more tensor
/// bytes is sharded.
pub const MAX_SHARD_BYTES: u64 = 5_000_000_000;

/// The largest file the hub stores (50 GB); larger GGUF files are published cut by
/// `gguf-split`.
pub const MAX_HUB_FILE_BYTES: u64 = 50_000_000_000;

/// One variant of a model, as [`model_info`] builds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VariantSpec {
    /// The repository's own safetensors checkpoint, in its config's `torch_dtype`
    /// (bf16 for most models; fp16 for LLaVA-NeXT).
    Own,
    /// A quantized safetensors derivative in `<repo>-<suffix>` (see
    /// [`SafetensorsQuant::repo_suffix`]), with a `config.json` stating the
    /// quantization.
    Safetensors(SafetensorsQuant),
    /// A GGUF file `<name>-<TYPE>.gguf` in the derivative repository `<repo>-GGUF`
    /// (split into `…-0000i-of-0000n.gguf` beyond [`MAX_HUB_FILE_BYTES`]), with the
    /// repository's projector file for a multimodal model.
    Gguf(GgufQuant),
}

/// The safetensors quantizations of [`VariantSpec::Safetensors`], all with groups of
/// 128 along the input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SafetensorsQuant {
    /// AutoAWQ 4-bit, GEMM layout.
    Awq4,
    /// AutoGPTQ 4-bit.
    Gptq4,
    /// AutoGPTQ 8-bit.
    Gptq8,
}

impl SafetensorsQuant {
    /// The suffix of the derivative repository's name (Qwen's naming).
    pub fn repo_suffix(self) -> &'static str {
        match self {
            SafetensorsQuant::Awq4 => "AWQ",
            SafetensorsQuant::Gptq4 => "GPTQ-Int4",
            SafetensorsQuant::Gptq8 => "GPTQ-Int8",
        }
    }

    /// The `quantization_config` of the derivative's `config.json`.
    pub fn quantization_config(self) -> Value {
        let gptq = |bits: u8| {
            serde_json::json!({
                "quant_method": "gptq", "bits": bits, "group_size": 128,
                "desc_act": false, "sym": true, "damp_percent": 0.01
            })
        };
        match self {
            SafetensorsQuant::Awq4 => serde_json::json!({
                "quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": true, "version": "gemm"
            }),
            SafetensorsQuant::Gptq4 => gptq(4),
            SafetensorsQuant::Gptq8 => gptq(8),
        }
    }

    /// How the derivative's tensors are stored.
    pub fn storage(self) -> Storage {
        match self {
            SafetensorsQuant::Awq4 => Storage::Awq { bits: 4, group: 128 },
            SafetensorsQuant::Gptq4 => Storage::Gptq { bits: 4, group: 128 },
            SafetensorsQuant::Gptq8 => Storage::Gptq { bits: 8, group: 128 },
        }
    }

    fn tags(self) -> [&'static str; 4] {
        match self {
            SafetensorsQuant::Awq4 => ["transformers", "safetensors", "awq", "4-bit"],
            SafetensorsQuant::Gptq4 => ["transformers", "safetensors", "gptq", "4-bit"],
            SafetensorsQuant::Gptq8 => ["transformers", "safetensors", "gptq", "8-bit"],
        }
    }
}

/// The GGUF file types of [`VariantSpec::Gguf`]: those testkit can write headers for.
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GgufQuant {
    /// `Q8_0` everywhere.
    Q8_0,
    /// `Q6_K` everywhere.
    Q6_K,
    /// `Q5_K`, with `Q6_K` for the output and some `attn_v` and `ffn_down`.
    Q5_K_M,
    /// `Q4_K`, with `Q6_K` for the output and some `attn_v` and `ffn_down`.
    Q4_K_M,
}

impl GgufQuant {
    /// The registry's file type.
    pub fn file_type(self) -> GgufFileType {
        match self {
            GgufQuant::Q8_0 => GgufFileType::Q8_0,
            GgufQuant::Q6_K => GgufFileType::Q6_K,
            GgufQuant::Q5_K_M => GgufFileType::Q5_K_M,
            GgufQuant::Q4_K_M => GgufFileType::Q4_K_M,
        }
    }
}

/// The model `repo` whose `config.json` is `config_json`, with one variant per spec,
/// as `HubClient::inspect` lists a model whose variants it sizes from their
/// quantization: bytes computed, tensor-parallel degrees 1 to 8 that the weights allow
/// (none for GGUF), sizes of the weight files on the hub (for GGUF, the model files
/// without the projector), best precision first.
///
/// Panics on an invalid config or repository id: these are fixtures.
pub fn model_info(repo: &str, config_json: &str, variants: &[VariantSpec]) -> ModelInfo {
    let model = Model::new(repo, config_json);
    let mut listed: Vec<Variant> = variants.iter().map(|&spec| model.variant(spec)).collect();
    sort_variants(&mut listed);
    ModelInfo {
        repo: model.repo.clone(),
        revision: "main".to_owned(),
        sha: sha_of(&model.repo),
        shape_source: ShapeSource::ConfigJson,
        tp_degrees: tp_degrees(&model.shape, None, MAX_LISTED_TP_DEGREE),
        shape: model.shape,
        variants: listed,
        skipped: Vec::new(),
        notes: Vec::new(),
        task: task_of(config_json),
    }
}

/// The task `inspect` tells from a repository whose only signal is its `config.json`.
fn task_of(config_json: &str) -> ModelTask {
    let config: Option<Value> = serde_json::from_str(config_json).ok();
    ModelTask::detect(&TaskSignals {
        config: config.as_ref(),
        ..TaskSignals::default()
    })
}

/// A parsed model and the text of its config.
struct Model<'a> {
    repo: RepoId,
    config_json: &'a str,
    config: ModelConfig,
    shape: ModelShape,
}

impl<'a> Model<'a> {
    fn new(repo: &str, config_json: &'a str) -> Model<'a> {
        let repo = RepoId::parse(repo).unwrap_or_else(|e| panic!("{repo}: {e}"));
        let config = ModelConfig::from_json(config_json).unwrap_or_else(|e| panic!("{repo}: config.json: {e}"));
        let shape = ModelShape::from_config(&config).unwrap_or_else(|e| panic!("{repo}: shape: {e}"));
        Model {
            repo,
            config_json,
            config,
            shape,
        }
    }

    /// `<owner>/<name>-<suffix>`.
    fn derivative(&self, suffix: &str) -> RepoId {
        RepoId::parse(&format!("{}-{suffix}", self.repo)).unwrap_or_else(|e| panic!("{}: {e}", self.repo))
    }

    /// The variant `spec`, classified as `inspect` classifies it without headers: from
    /// the derivative's `config.json` or from the GGUF file name.
    fn variant(&self, spec: VariantSpec) -> Variant {
        let (repo, source, quantization, gguf) = match spec {
            VariantSpec::Own => (self.repo.clone(), VariantSource::ThisRepo, stated(&self.config), None),
            VariantSpec::Safetensors(q) => {
                let json = quantized_config_json(self.config_json, q);
                let config = ModelConfig::from_json(&json).unwrap_or_else(|e| panic!("{}: {e}", self.repo));
                let own = ModelShape::from_config(&config).map(|s| s.params.total());
                // `inspect` skips a derivative whose config counts other parameters.
                assert_eq!(own.ok(), Some(self.shape.params.total()), "{q:?} of {}", self.repo);
                let repo = self.derivative(q.repo_suffix());
                (repo, VariantSource::QuantizedDerivative, stated(&config), None)
            }
            VariantSpec::Gguf(q) => {
                let stem = format!("{}-{}", self.repo.name(), q.file_type().name());
                let quantization = Quantization::from_gguf_file_name(&format!("{stem}.gguf"))
                    .unwrap_or_else(|| panic!("{stem}.gguf names no GGUF file type"));
                let repo = self.derivative("GGUF");
                (repo, VariantSource::QuantizedDerivative, quantization, Some(stem))
            }
        };
        let weights = WeightGroups::resolve(&self.shape, WeightsSource::Computed(quantization))
            .unwrap_or_else(|e| panic!("{}: {spec:?}: {e}", self.repo));
        let stored = weights.stored().expect("weights fit in u64").get();
        let (id, files, size) = match gguf {
            None => (repo.to_string(), safetensors_files(stored), stored),
            Some(stem) => {
                // The vision tower is in the projector file, which `inspect` lists but
                // does not count in the variant's size.
                let size = stored - weights.vision_layers.get() - weights.vision_other.get();
                let mut files = gguf_files(&stem, size);
                if self.shape.vision.is_some() {
                    files.push(mmproj_file(&self.repo));
                }
                (format!("{repo}:{}", files[0]), files, size)
            }
        };
        let tp_degrees = match quantization.format {
            WeightFormat::Gguf => Vec::new(),
            WeightFormat::Safetensors => tp_degrees(&self.shape, Some(&quantization), MAX_LISTED_TP_DEGREE)
                .into_iter()
                .filter(|d| d.is_valid())
                .map(|d| d.degree)
                .collect(),
        };
        Variant {
            id,
            sha: sha_of(&repo),
            repo,
            files,
            source,
            quantization,
            size: Bytes::new(size),
            weights,
            tp_degrees,
        }
    }

    /// The mock repositories holding `spec`'s files: configs, headers, virtual bodies.
    fn add_repo(&self, repos: &mut BTreeMap<RepoId, MockRepo>, spec: VariantSpec) {
        let variant = self.variant(spec);
        let id = variant.repo.as_str();
        let repo = match spec {
            VariantSpec::Own => {
                let dtype = match self.config.torch_dtype.as_deref() {
                    Some("float16") => SafetensorsDtype::F16,
                    Some("float32") => SafetensorsDtype::F32,
                    _ => SafetensorsDtype::BF16,
                };
                let repo = MockRepo::new(id)
                    .tags(&["transformers", "safetensors", self.config.architecture.model_type()])
                    .file("config.json", self.config_json);
                with_checkpoint(
                    repo,
                    &variant.files,
                    checkpoint_tensors(&self.config, Storage::Dense(dtype)),
                )
            }
            VariantSpec::Safetensors(q) => {
                let repo = MockRepo::new(id)
                    .tags(&q.tags())
                    .quantized_from(self.repo.as_str())
                    .file("config.json", quantized_config_json(self.config_json, q));
                with_checkpoint(repo, &variant.files, checkpoint_tensors(&self.config, q.storage()))
            }
            VariantSpec::Gguf(q) => {
                let mut repo = repos.remove(&variant.repo).unwrap_or_else(|| {
                    MockRepo::new(id)
                        .tags(&["gguf", self.config.architecture.model_type()])
                        .quantized_from(self.repo.as_str())
                });
                let (model, mmproj): (Vec<&String>, Vec<&String>) =
                    variant.files.iter().partition(|f| !f.contains("mmproj"));
                let (kvs, tensors) = gguf_model(&self.config, q.file_type());
                let parts = gguf_split_evenly(kvs, tensors, model.len());
                for (name, (prefix, len)) in model.into_iter().zip(parts) {
                    repo = repo.virtual_file(name, prefix, len);
                }
                for name in mmproj {
                    if !repo.files.contains_key(name) {
                        let (kvs, tensors) = gguf_mmproj(&self.config).expect("a projector for a vision model");
                        let (prefix, len) = gguf_prefix(&kvs, &tensors);
                        repo = repo.virtual_file(name, prefix, len);
                    }
                }
                repo
            }
        };
        repos.insert(variant.repo, repo);
    }
}

/// The quantization `config.json` states, as `inspect` reads it.
fn stated(config: &ModelConfig) -> Quantization {
    Quantization::from_config(config.quantization_config.as_ref(), config.torch_dtype.as_deref())
        .unwrap_or_else(|e| panic!("config.json: {e}"))
        .expect("config.json states a torch_dtype or a quantization_config")
}

/// The commit the mock hub gives `repo`.
pub(crate) fn sha_of(repo: &RepoId) -> CommitSha {
    // INVARIANT: hex40 returns 40 lowercase hex digits.
    CommitSha::parse(&hex40(repo.as_str())).expect("hex40 is a commit id")
}

/// The base model's `config.json` with `quantization_config` added and `torch_dtype`
/// float16, as AutoAWQ and AutoGPTQ save it.
pub fn quantized_config_json(base: &str, quant: SafetensorsQuant) -> String {
    let mut config: Value = serde_json::from_str(base).expect("config.json is JSON");
    let object = config.as_object_mut().expect("config.json is an object");
    object.insert("quantization_config".to_owned(), quant.quantization_config());
    object.insert("torch_dtype".to_owned(), Value::from("float16"));
    serde_json::to_string_pretty(&config).expect("JSON serializes")
}

/// A checkpoint's files as `save_pretrained` names them for `bytes` of tensors:
/// `model.safetensors`, or shards of at most [`MAX_SHARD_BYTES`] (in the order
/// `inspect` lists them) and their index.
fn safetensors_files(bytes: u64) -> Vec<String> {
    let n = bytes.div_ceil(MAX_SHARD_BYTES).max(1);
    if n == 1 {
        return vec!["model.safetensors".to_owned()];
    }
    let mut files: Vec<String> = (1..=n).map(|i| format!("model-{i:05}-of-{n:05}.safetensors")).collect();
    files.push("model.safetensors.index.json".to_owned());
    files
}

/// `<stem>.gguf`, or its splits when larger than [`MAX_HUB_FILE_BYTES`].
fn gguf_files(stem: &str, bytes: u64) -> Vec<String> {
    let n = bytes.div_ceil(MAX_HUB_FILE_BYTES).max(1);
    if n == 1 {
        return vec![format!("{stem}.gguf")];
    }
    (1..=n).map(|i| format!("{stem}-{i:05}-of-{n:05}.gguf")).collect()
}

fn mmproj_file(repo: &RepoId) -> String {
    format!("mmproj-{}-f16.gguf", repo.name())
}

/// `repo` with the checkpoint `tensors` written as `files` (shards and index, or one
/// file).
fn with_checkpoint(mut repo: MockRepo, files: &[String], tensors: Vec<crate::Tensor>) -> MockRepo {
    let names: Vec<&String> = files.iter().filter(|f| f.ends_with(".safetensors")).collect();
    if let [single] = names.as_slice() {
        let (prefix, len) = safetensors_prefix(&tensors);
        return repo.virtual_file(single, prefix, len);
    }
    let (shards, index) = shard_evenly(tensors, names.len());
    for (shard, name) in shards.into_iter().zip(names) {
        assert_eq!(&shard.name, name, "shard names of {}", repo.id);
        repo = repo.virtual_file(name, shard.prefix, shard.len);
    }
    repo.file("model.safetensors.index.json", index)
}

/// A reference model: a published repository, its `config.json`, and the variants the
/// fixtures give it.
#[derive(Debug, Clone, Copy)]
pub struct ReferenceModel {
    /// The repository.
    pub repo: &'static str,
    /// Its `config.json` (the keys the registry reads).
    pub config: &'static str,
    /// Its variants.
    pub variants: &'static [VariantSpec],
}

impl ReferenceModel {
    /// The model as `inspect` would list it ([`model_info`]).
    pub fn info(&self) -> ModelInfo {
        model_info(self.repo, self.config, self.variants)
    }

    /// The model's repositories on a mock hub: the base repository with its
    /// `config.json` and checkpoint, one repository per safetensors derivative, and one
    /// `-GGUF` repository holding every GGUF file (and the projector of a multimodal
    /// model), the derivatives listed as quantizations of the base. Only headers are
    /// real; every body is virtual.
    pub fn hub_repos(&self) -> Vec<MockRepo> {
        let model = Model::new(self.repo, self.config);
        let mut repos = BTreeMap::new();
        for &spec in self.variants {
            model.add_repo(&mut repos, spec);
        }
        repos.into_values().collect()
    }
}

/// `Qwen/Qwen2.5-0.5B-Instruct`.
pub const QWEN2_5_0_5B_INSTRUCT: &str = "Qwen/Qwen2.5-0.5B-Instruct";
/// `Qwen/Qwen2.5-7B-Instruct`.
pub const QWEN2_5_7B_INSTRUCT: &str = "Qwen/Qwen2.5-7B-Instruct";
/// `llava-hf/llava-v1.6-mistral-7b-hf`.
pub const LLAVA_V1_6_MISTRAL_7B: &str = "llava-hf/llava-v1.6-mistral-7b-hf";
/// `deepseek-ai/deepseek-coder-33b-instruct`.
pub const DEEPSEEK_CODER_33B_INSTRUCT: &str = "deepseek-ai/deepseek-coder-33b-instruct";
/// `meta-llama/Meta-Llama-3-70B-Instruct`.
pub const META_LLAMA_3_70B_INSTRUCT: &str = "meta-llama/Meta-Llama-3-70B-Instruct";

/// `Qwen/Qwen2.5-0.5B-Instruct`'s `config.json`: 24 layers, hidden 896, 14 heads, 2 KV
/// heads, tied embeddings.
pub const QWEN2_5_0_5B_INSTRUCT_CONFIG: &str = r#"{
  "architectures": ["Qwen2ForCausalLM"],
  "hidden_size": 896,
  "intermediate_size": 4864,
  "max_position_embeddings": 32768,
  "model_type": "qwen2",
  "num_attention_heads": 14,
  "num_hidden_layers": 24,
  "num_key_value_heads": 2,
  "rope_theta": 1000000.0,
  "sliding_window": 32768,
  "tie_word_embeddings": true,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.43.1",
  "use_sliding_window": false,
  "vocab_size": 151936
}"#;

/// `Qwen/Qwen2.5-7B-Instruct`'s `config.json`: 28 layers, hidden 3584, 28 heads, 4 KV
/// heads, untied.
pub const QWEN2_5_7B_INSTRUCT_CONFIG: &str = r#"{
  "architectures": ["Qwen2ForCausalLM"],
  "hidden_size": 3584,
  "intermediate_size": 18944,
  "max_position_embeddings": 32768,
  "model_type": "qwen2",
  "num_attention_heads": 28,
  "num_hidden_layers": 28,
  "num_key_value_heads": 4,
  "rope_theta": 1000000.0,
  "sliding_window": 131072,
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.43.1",
  "use_sliding_window": false,
  "vocab_size": 152064
}"#;

/// `llava-hf/llava-v1.6-mistral-7b-hf`'s `config.json`: LLaVA-NeXT with a CLIP
/// ViT-L/14-336 tower and Mistral-7B-Instruct-v0.2 (the `text_config` keys absent here
/// take MistralConfig's defaults). Saved in float16.
pub const LLAVA_V1_6_MISTRAL_7B_CONFIG: &str = r#"{
  "architectures": ["LlavaNextForConditionalGeneration"],
  "model_type": "llava_next",
  "text_config": {
    "architectures": ["MistralForCausalLM"],
    "intermediate_size": 14336,
    "max_position_embeddings": 32768,
    "model_type": "mistral",
    "num_key_value_heads": 8,
    "rope_theta": 1000000.0,
    "sliding_window": null,
    "torch_dtype": "bfloat16",
    "vocab_size": 32064
  },
  "torch_dtype": "float16",
  "transformers_version": "4.39.0.dev0",
  "vision_config": {
    "hidden_size": 1024,
    "image_size": 336,
    "intermediate_size": 4096,
    "model_type": "clip_vision_model",
    "num_attention_heads": 16,
    "num_hidden_layers": 24,
    "patch_size": 14
  },
  "vision_feature_layer": -2,
  "vocab_size": 32064
}"#;

/// `deepseek-ai/deepseek-coder-33b-instruct`'s `config.json`: a Llama with 62 layers,
/// hidden 7168, 56 heads, 8 KV heads, MLP 19200, a 32,256-token vocabulary, linear RoPE
/// scaling to 16k.
pub const DEEPSEEK_CODER_33B_INSTRUCT_CONFIG: &str = r#"{
  "architectures": ["LlamaForCausalLM"],
  "attention_bias": false,
  "hidden_size": 7168,
  "intermediate_size": 19200,
  "max_position_embeddings": 16384,
  "model_type": "llama",
  "num_attention_heads": 56,
  "num_hidden_layers": 62,
  "num_key_value_heads": 8,
  "rope_scaling": {"factor": 4.0, "type": "linear"},
  "rope_theta": 100000,
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.35.0",
  "vocab_size": 32256
}"#;

use GgufQuant::{Q4_K_M, Q6_K, Q8_0};
use SafetensorsQuant::{Awq4, Gptq8};
use VariantSpec::{Gguf, Own, Safetensors};

/// The five reference models, smallest first. Each has its own checkpoint, an AWQ
/// derivative, a GPTQ 8-bit derivative where one is commonly published (the 7B, 33B and
/// 70B text models), and `Q8_0`, `Q6_K` and `Q4_K_M` GGUF files.
/// `meta-llama/Meta-Llama-3-70B-Instruct` uses [`LLAMA_70B_CONFIG`] (the base model's
/// config: it differs from the instruct model's only in `eos_token_id`, which the
/// registry does not read).
pub const REFERENCE_MODELS: [ReferenceModel; 5] = [
    ReferenceModel {
        repo: QWEN2_5_0_5B_INSTRUCT,
        config: QWEN2_5_0_5B_INSTRUCT_CONFIG,
        variants: &[Own, Safetensors(Awq4), Gguf(Q8_0), Gguf(Q6_K), Gguf(Q4_K_M)],
    },
    ReferenceModel {
        repo: QWEN2_5_7B_INSTRUCT,
        config: QWEN2_5_7B_INSTRUCT_CONFIG,
        variants: &[
            Own,
            Safetensors(Awq4),
            Safetensors(Gptq8),
            Gguf(Q8_0),
            Gguf(Q6_K),
            Gguf(Q4_K_M),
        ],
    },
    ReferenceModel {
        repo: LLAVA_V1_6_MISTRAL_7B,
        config: LLAVA_V1_6_MISTRAL_7B_CONFIG,
        variants: &[Own, Safetensors(Awq4), Gguf(Q8_0), Gguf(Q6_K), Gguf(Q4_K_M)],
    },
    ReferenceModel {
        repo: DEEPSEEK_CODER_33B_INSTRUCT,
        config: DEEPSEEK_CODER_33B_INSTRUCT_CONFIG,
        variants: &[
            Own,
            Safetensors(Awq4),
            Safetensors(Gptq8),
            Gguf(Q8_0),
            Gguf(Q6_K),
            Gguf(Q4_K_M),
        ],
    },
    ReferenceModel {
        repo: META_LLAMA_3_70B_INSTRUCT,
        config: LLAMA_70B_CONFIG,
        variants: &[
            Own,
            Safetensors(Awq4),
            Safetensors(Gptq8),
            Gguf(Q8_0),
            Gguf(Q6_K),
            Gguf(Q4_K_M),
        ],
    },
];

/// The [`REFERENCE_MODELS`] as `inspect` would list them, in the same order.
pub fn reference_models() -> Vec<ModelInfo> {
    REFERENCE_MODELS.iter().map(ReferenceModel::info).collect()
}

/// [`reference_models`] by repository name, as the planner takes a catalog.
pub fn reference_catalog() -> std::collections::BTreeMap<String, ModelInfo> {
    reference_models()
        .into_iter()
        .map(|m| (m.repo.to_string(), m))
        .collect()
}

/// Every mock-hub repository of the [`REFERENCE_MODELS`] ([`ReferenceModel::hub_repos`]).
pub fn reference_hub_repos() -> Vec<MockRepo> {
    REFERENCE_MODELS.iter().flat_map(ReferenceModel::hub_repos).collect()
}
