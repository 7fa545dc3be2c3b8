//! LoRA adapters as PEFT writes them, for a base model of the Llama family: the
//! `adapter_config.json`, the safetensors header of `adapter_model.safetensors`, the
//! mock-hub repository holding both, and the [`AdapterInfo`] the registry reads from
//! them (what the planner takes).

use serde_json::json;
use skein_model_registry::adapter::{ADAPTER_CONFIG, ADAPTER_SAFETENSORS, AdapterConfig, AdapterInfo};
use skein_model_registry::config::ModelConfig;
use skein_model_registry::estimate::ModelShape;
use skein_model_registry::repo::{RepoId, ResolvedRepo};
use skein_model_registry::{SafetensorsDtype, safetensors};

use crate::mock_hub::MockRepo;
use crate::{Tensor, safetensors_prefix};

/// `meta-llama/Meta-Llama-3-8B-Instruct`: the 8B base of the adapter examples.
pub const LLAMA_3_8B_INSTRUCT: &str = "meta-llama/Meta-Llama-3-8B-Instruct";

/// Its `config.json`: 32 layers, hidden 4096, 32 heads of 128 with 8 KV heads, a gated
/// MLP of 14,336, a 128,256-token vocabulary, in BF16.
pub const LLAMA_3_8B_INSTRUCT_CONFIG: &str = r#"{
  "architectures": ["LlamaForCausalLM"],
  "attention_bias": false,
  "hidden_size": 4096,
  "intermediate_size": 14336,
  "max_position_embeddings": 8192,
  "model_type": "llama",
  "num_attention_heads": 32,
  "num_hidden_layers": 32,
  "num_key_value_heads": 8,
  "rope_theta": 500000.0,
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "vocab_size": 128256
}"#;

/// The projections PEFT adapts on a Llama, by their `target_modules` names.
pub const ALL_PROJECTIONS: [&str; 7] = [
    "q_proj",
    "k_proj",
    "v_proj",
    "o_proj",
    "gate_proj",
    "up_proj",
    "down_proj",
];

/// A PEFT LoRA adapter of a base model.
#[derive(Debug, Clone)]
pub struct PeftAdapter {
    /// Its repository.
    pub repo: String,
    /// The base model's repository, as `base_model_name_or_path` names it.
    pub base: String,
    /// The base model's `config.json`.
    pub base_config: &'static str,
    /// `r`.
    pub rank: u64,
    /// `target_modules`, of [`ALL_PROJECTIONS`].
    pub targets: Vec<&'static str>,
}

impl PeftAdapter {
    /// A rank-`rank` adapter `repo` of `base` on q, k, v and o (PEFT's usual targets).
    pub fn new(repo: &str, base: &str, base_config: &'static str, rank: u64) -> PeftAdapter {
        PeftAdapter {
            repo: repo.to_owned(),
            base: base.to_owned(),
            base_config,
            rank,
            targets: vec!["q_proj", "k_proj", "v_proj", "o_proj"],
        }
    }

    /// `adapter_config.json` as PEFT 0.13 writes it.
    pub fn config_json(&self) -> Vec<u8> {
        let config = json!({
            "base_model_name_or_path": self.base,
            "bias": "none",
            "fan_in_fan_out": false,
            "inference_mode": true,
            "lora_alpha": self.rank * 2,
            "lora_dropout": 0.05,
            "modules_to_save": null,
            "peft_type": "LORA",
            "r": self.rank,
            "rank_pattern": {},
            "alpha_pattern": {},
            "revision": null,
            "target_modules": self.targets,
            "task_type": "CAUSAL_LM",
            "use_dora": false,
            "use_rslora": false
        });
        serde_json::to_vec_pretty(&config).expect("JSON")
    }

    /// The tensors `save_pretrained` writes, in BF16: per layer and target,
    /// `lora_A.weight` `[r, in]` and `lora_B.weight` `[out, r]`.
    ///
    /// Panics on a base config the registry refuses, or a target not of
    /// [`ALL_PROJECTIONS`]: these are fixtures.
    pub fn tensors(&self) -> Vec<Tensor> {
        let config = ModelConfig::from_json(self.base_config).expect("a valid base config");
        let shape = ModelShape::from_config(&config).expect("a known architecture");
        let (h, q, kv, inter) = (shape.hidden, shape.q_width(), shape.kv_width(), shape.intermediate);
        let mut tensors = Vec::new();
        for layer in 0..shape.layers {
            for &target in &self.targets {
                let (part, inp, out) = match target {
                    "q_proj" => ("self_attn", h, q),
                    "k_proj" | "v_proj" => ("self_attn", h, kv),
                    "o_proj" => ("self_attn", q, h),
                    "gate_proj" | "up_proj" => ("mlp", h, inter),
                    "down_proj" => ("mlp", inter, h),
                    other => panic!("{other} is not a Llama projection"),
                };
                let module = format!("base_model.model.model.layers.{layer}.{part}.{target}");
                tensors.push((
                    format!("{module}.lora_A.weight"),
                    SafetensorsDtype::BF16,
                    vec![self.rank, inp],
                ));
                tensors.push((
                    format!("{module}.lora_B.weight"),
                    SafetensorsDtype::BF16,
                    vec![out, self.rank],
                ));
            }
        }
        tensors
    }

    /// The mock-hub repository: the config and the weight file's header (its data
    /// virtual).
    pub fn hub_repo(&self) -> MockRepo {
        let (prefix, len) = safetensors_prefix(&self.tensors());
        MockRepo::new(&self.repo)
            .file(ADAPTER_CONFIG, self.config_json())
            .virtual_file(ADAPTER_SAFETENSORS, prefix, len)
    }

    /// What `HubClient::inspect_adapter` reads of [`hub_repo`](Self::hub_repo), at a
    /// commit made of the repository's name.
    pub fn info(&self) -> AdapterInfo {
        let (prefix, _) = safetensors_prefix(&self.tensors());
        let header = safetensors::parse_header(&prefix[8..]).expect("a valid header");
        let config = AdapterConfig::from_json(&self.config_json()).expect("a valid adapter config");
        let repo = RepoId::parse(&self.repo).expect("a repository id");
        let resolved = ResolvedRepo {
            sha: crate::models::sha_of(&repo),
            repo,
            revision: "main".to_owned(),
            files: Vec::new(),
        };
        AdapterInfo::from_peft(&resolved, config, ADAPTER_SAFETENSORS, &header).expect("a valid adapter")
    }
}

/// The courses of `workflows/lora-tutors.yaml`, one adapter each.
pub const TUTOR_COURSES: [&str; 5] = ["algebra", "chemistry", "physics", "statistics", "writing"];

/// The adapters of `workflows/lora-tutors.yaml`: rank 16 on q, k, v and o of
/// [`LLAMA_3_8B_INSTRUCT`], `lab-tutors/llama3-8b-<course>-lora`.
pub fn tutor_adapters() -> Vec<PeftAdapter> {
    TUTOR_COURSES
        .iter()
        .map(|course| {
            PeftAdapter::new(
                &format!("lab-tutors/llama3-8b-{course}-lora"),
                LLAMA_3_8B_INSTRUCT,
                LLAMA_3_8B_INSTRUCT_CONFIG,
                16,
            )
        })
        .collect()
}

/// [`tutor_adapters`] as the planner takes them, by repository (the workflow's pins).
pub fn tutor_adapter_catalog() -> std::collections::BTreeMap<String, AdapterInfo> {
    tutor_adapters()
        .into_iter()
        .map(|a| (a.repo.clone(), a.info()))
        .collect()
}

/// [`LLAMA_3_8B_INSTRUCT`] as `inspect` lists it: its BF16 checkpoint and `Q8_0` and
/// `Q4_K_M` GGUF files.
pub fn llama_3_8b_info() -> skein_model_registry::catalog::ModelInfo {
    use crate::models::{GgufQuant, VariantSpec};
    crate::models::model_info(
        LLAMA_3_8B_INSTRUCT,
        LLAMA_3_8B_INSTRUCT_CONFIG,
        &[
            VariantSpec::Own,
            VariantSpec::Gguf(GgufQuant::Q8_0),
            VariantSpec::Gguf(GgufQuant::Q4_K_M),
        ],
    )
}
