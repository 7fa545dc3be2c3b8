//! LoRA adapters of a base model: what one is, read from its config and the header of
//! its weight file, never its weights.
//!
//! An agent may name a LoRA adapter of a base model; agents whose adapters share a base
//! share one base instance serving all their adapters. The planner needs, per adapter,
//! the base model it belongs to, its rank (vLLM's slots are sized by the largest), its
//! tensors' sizes (what loading it costs) and the modules it adapts. [`AdapterInfo`]
//! carries that; the hub edge (`HubClient::inspect_adapter`) reads it, and
//! [`estimate::adapter`](crate::estimate) turns it into memory.
//!
//! # Layout
//!
//! - `config`: [`AdapterConfig`], a validated `adapter_config.json` (PEFT's
//!   `LoraConfig` fields), refusing other PEFT methods.
//! - `tensors`: [`lora_layout`], the `lora_A`/`lora_B` pairs of either format by module,
//!   ranks checked.
//! - this module: [`AdapterInfo`] from a PEFT config and safetensors header
//!   ([`AdapterInfo::from_peft`]) or a llama.cpp GGUF adapter's header
//!   ([`AdapterInfo::from_gguf`]).
//!
//! # Invariants
//!
//! Pure: values in, values out. Nothing here reads a file or the network.

mod config;
mod error;
mod tensors;

use serde::Serialize;

pub use config::{ADAPTER_CONFIG, AdapterConfig, ExpectedRank, LoraBias, MAX_LORA_RANK, TargetModules};
pub use error::AdapterError;
pub use tensors::{AdapterTensor, LoraLayout, LoraModule, lora_layout};

use crate::dtype::TensorDtype;
use crate::repo::{CommitSha, RepoId, ResolvedRepo};
use crate::safetensors::TensorTotals;
use crate::{Error, GgufHeader, SafetensorsHeader};

/// Name of a PEFT adapter's safetensors weight file.
pub const ADAPTER_SAFETENSORS: &str = "adapter_model.safetensors";

/// Name of a PEFT adapter's pickle weight file, which Skein never loads.
pub const ADAPTER_PICKLE: &str = "adapter_model.bin";

/// GGUF metadata of a llama.cpp adapter (`gguf-py` `Keys.General.TYPE`,
/// `Keys.Adapter.TYPE`, `Keys.Adapter.LORA_ALPHA`).
const GGUF_TYPE: &str = "general.type";
const GGUF_ADAPTER_TYPE: &str = "adapter.type";
const GGUF_LORA_ALPHA: &str = "adapter.lora.alpha";
/// The base model a GGUF converter found in the adapter's model card.
const GGUF_BASE_URL: &str = "general.base_model.0.repo_url";
const GGUF_BASE_NAME: &str = "general.base_model.0.name";

/// How the hub addresses a repository in a URL.
const HUB_URL_PREFIXES: [&str; 2] = ["https://huggingface.co/", "http://huggingface.co/"];

/// The format of an adapter's weights, and the files read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "format", rename_all = "snake_case")]
pub enum AdapterFormat {
    /// PEFT: `adapter_config.json` and `adapter_model.safetensors` (vLLM's
    /// `--lora-modules name=path` takes the folder).
    Peft {
        /// The config file.
        config: String,
        /// The safetensors weight file.
        weights: String,
    },
    /// llama.cpp's GGUF adapter (`--lora FILE`).
    Gguf {
        /// The GGUF file.
        file: String,
        /// `adapter_config.json`, when the repository has one too.
        config: Option<String>,
    },
}

/// The base model an adapter names.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BaseModel {
    /// As written (`base_model_name_or_path`, or the GGUF's base-model URL or name).
    pub written: String,
    /// The hub repository, when what is written is a hub id (or a hub URL); `None` for
    /// a local path of the trainer's machine.
    pub repo: Option<RepoId>,
    /// The base model's revision the adapter was trained on, when recorded.
    pub revision: Option<String>,
}

impl BaseModel {
    fn from_written(written: String, revision: Option<String>) -> BaseModel {
        let id = HUB_URL_PREFIXES
            .iter()
            .find_map(|prefix| written.strip_prefix(prefix))
            .unwrap_or(&written)
            .trim_end_matches('/');
        BaseModel {
            repo: RepoId::parse(id).ok(),
            written,
            revision,
        }
    }
}

/// Tensors of one storage type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct DtypeTotals {
    /// The type.
    pub dtype: TensorDtype,
    /// Its tensors' count, elements and bytes.
    pub totals: TensorTotals,
}

/// A LoRA adapter, from its config and the header of its weight file.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AdapterInfo {
    /// The adapter's repository.
    pub repo: RepoId,
    /// The revision asked for.
    pub revision: String,
    /// The commit it resolved to.
    pub sha: CommitSha,
    /// Its format and files.
    pub format: AdapterFormat,
    /// The base model it adapts, when the adapter names one.
    pub base_model: Option<BaseModel>,
    /// The PEFT method: `LORA` (GGUF adapters of `adapter.type = "lora"` too).
    pub peft_type: String,
    /// The rank: `r` from the config, or the largest of the tensors' ranks for a GGUF
    /// adapter without one. Modules of other ranks (`rank_pattern`) are in
    /// [`LoraLayout::ranks`].
    pub rank: u64,
    /// `lora_alpha` (GGUF `adapter.lora.alpha`; llama.cpp reads a missing one as 0,
    /// meaning no scaling).
    pub alpha: f64,
    /// Rank-stabilised scaling (`alpha / √r`).
    pub use_rslora: bool,
    /// Weight-decomposed LoRA.
    pub use_dora: bool,
    /// The base layers store weights transposed (the LoRA matrices do not).
    pub fan_in_fan_out: bool,
    /// `target_modules` from the config; for a GGUF adapter without one, the module
    /// kinds of its tensors.
    pub target_modules: TargetModules,
    /// `modules_to_save`.
    pub modules_to_save: Vec<String>,
    /// All tensors of the weight file: count, elements and bytes as stored.
    pub tensors: TensorTotals,
    /// The same per storage type, in the order first seen in the type's format.
    pub by_dtype: Vec<DtypeTotals>,
    /// The LoRA pairs: modules, layers, ranks (checked against the config and each
    /// other).
    pub lora: LoraLayout,
    /// Observations for the planner's explanation: what engines will refuse, what was
    /// assumed.
    pub notes: Vec<String>,
}

impl AdapterInfo {
    /// Bytes of the weight file's tensors as stored.
    pub fn stored_bytes(&self) -> crate::Bytes {
        self.tensors.bytes
    }

    /// Elements of all tensors: what an engine loads, converted to its dtype.
    pub fn elements(&self) -> u64 {
        self.tensors.params
    }

    /// The adapter of `resolved` from its validated PEFT config and the header of its
    /// safetensors weight file `weights`.
    ///
    /// Errors: those of [`lora_layout`]: a tensor of the wrong shape, a rank that
    /// disagrees with `r` or `rank_pattern`, an unpaired matrix, no LoRA tensors.
    pub fn from_peft(
        resolved: &ResolvedRepo,
        config: AdapterConfig,
        weights: &str,
        header: &SafetensorsHeader,
    ) -> Result<AdapterInfo, Error> {
        let tensors: Vec<AdapterTensor> = header
            .tensors()
            .iter()
            .map(|t| AdapterTensor {
                name: t.name.clone(),
                shape: t.shape.clone(),
                dtype: t.dtype.into(),
                elements: t.elements,
                bytes: t.bytes(),
            })
            .collect();
        let lora = lora_layout(&tensors, &|module| Some(config.expected_rank(module)))?;
        let by_dtype = header
            .by_dtype()
            .iter()
            .map(|(&dtype, &totals)| DtypeTotals {
                dtype: dtype.into(),
                totals,
            })
            .collect();
        let format = AdapterFormat::Peft {
            config: ADAPTER_CONFIG.to_owned(),
            weights: weights.to_owned(),
        };
        let read = WeightsRead {
            format,
            tensors: header.totals(),
            by_dtype,
            lora,
        };
        Ok(Self::assemble(resolved, Some(config), None, read))
    }

    /// The adapter of `resolved` from the header of its llama.cpp GGUF adapter `file`,
    /// and its `adapter_config.json` when the repository has one (which then gives the
    /// base model, `r`, alpha and target modules, and the ranks are checked against it).
    ///
    /// Errors: [`AdapterError::GgufNotAdapter`] unless `general.type` is `adapter` and
    /// `adapter.type` is `lora` (a model GGUF, a control vector), or when
    /// `adapter.lora.alpha` is not a number; those of [`lora_layout`].
    pub fn from_gguf(
        resolved: &ResolvedRepo,
        file: &str,
        header: &GgufHeader,
        config: Option<AdapterConfig>,
    ) -> Result<AdapterInfo, Error> {
        let text = |key: &'static str, expected: &'static str| -> Result<(), Error> {
            match header.get(key) {
                Some(value) if value.as_str() == Some(expected) => Ok(()),
                found => Err(AdapterError::GgufNotAdapter {
                    key,
                    found: found.map_or_else(|| "missing".to_owned(), shown),
                    expected: if key == GGUF_TYPE { "\"adapter\"" } else { "\"lora\"" },
                }
                .into()),
            }
        };
        text(GGUF_TYPE, "adapter")?;
        text(GGUF_ADAPTER_TYPE, "lora")?;
        let gguf_alpha = match header.get(GGUF_LORA_ALPHA) {
            None => None,
            Some(value) => {
                Some(
                    value
                        .as_f64()
                        .filter(|a| a.is_finite())
                        .ok_or_else(|| AdapterError::GgufNotAdapter {
                            key: GGUF_LORA_ALPHA,
                            found: shown(value),
                            expected: "a number",
                        })?,
                )
            }
        };

        let tensors: Vec<AdapterTensor> = header
            .tensors()
            .iter()
            .map(|t| AdapterTensor {
                name: t.name.clone(),
                shape: t.shape(),
                dtype: t.ggml_type.into(),
                elements: t.elements,
                bytes: t.bytes,
            })
            .collect();
        // GGUF module names are llama.cpp's (`blk.0.attn_q`), which no `rank_pattern`
        // key names: with a pattern, any rank the config names is accepted.
        let expected = |_: &str| {
            config.as_ref().map(|c| {
                if c.rank_pattern.is_empty() {
                    ExpectedRank::Exactly {
                        rank: c.rank,
                        pattern: None,
                    }
                } else {
                    let mut ranks: Vec<u64> = c.rank_pattern.values().copied().chain([c.rank]).collect();
                    ranks.sort_unstable();
                    ranks.dedup();
                    ExpectedRank::OneOf(ranks)
                }
            })
        };
        let lora = lora_layout(&tensors, &expected)?;
        let by_dtype = header
            .by_type()
            .iter()
            .map(|(&ggml_type, &totals)| DtypeTotals {
                dtype: ggml_type.into(),
                totals,
            })
            .collect();
        let base = header
            .get(GGUF_BASE_URL)
            .or_else(|| header.get(GGUF_BASE_NAME))
            .and_then(|v| v.as_str())
            .map(|written| BaseModel::from_written(written.to_owned(), None));
        let format = AdapterFormat::Gguf {
            file: file.to_owned(),
            config: config.as_ref().map(|_| ADAPTER_CONFIG.to_owned()),
        };
        let read = WeightsRead {
            format,
            tensors: header.totals(),
            by_dtype,
            lora,
        };
        let mut info = Self::assemble(resolved, config, base, read);
        if let Some(alpha) = gguf_alpha {
            info.alpha = alpha;
        } else if matches!(info.format, AdapterFormat::Gguf { config: None, .. }) {
            info.notes
                .push("the GGUF adapter has no adapter.lora.alpha: llama.cpp then applies it unscaled".to_owned());
        }
        Ok(info)
    }

    fn assemble(
        resolved: &ResolvedRepo,
        config: Option<AdapterConfig>,
        gguf_base: Option<BaseModel>,
        read: WeightsRead,
    ) -> AdapterInfo {
        let WeightsRead {
            format,
            tensors,
            by_dtype,
            lora,
        } = read;
        let mut notes = Vec::new();
        let info = match config {
            Some(config) => {
                if config.use_dora {
                    notes.push(
                        "DoRA (use_dora): vLLM's PEFT loader (vllm/lora/peft_helper.py) refuses DoRA adapters"
                            .to_owned(),
                    );
                }
                if !config.modules_to_save.is_empty() {
                    notes.push(format!(
                        "modules_to_save ({}) are stored whole in the adapter; vLLM's PEFT loader refuses them",
                        config.modules_to_save.join(", ")
                    ));
                }
                if config.bias != LoraBias::None {
                    notes.push(
                        "the adapter trains biases (`bias` is not `none`); engines ignore or refuse them".to_owned(),
                    );
                }
                let base = config
                    .base_model
                    .clone()
                    .map(|written| BaseModel::from_written(written, config.base_revision.clone()))
                    .or(gguf_base);
                if base.as_ref().is_some_and(|b| b.repo.is_none()) {
                    notes.push(
                        "the base model is a local path of the machine the adapter was trained on, not a hub id; \
                         name the base model's repository explicitly"
                            .to_owned(),
                    );
                }
                PartialInfo {
                    base_model: base,
                    peft_type: config.peft_type,
                    rank: config.rank,
                    alpha: config.alpha,
                    use_rslora: config.use_rslora,
                    use_dora: config.use_dora,
                    fan_in_fan_out: config.fan_in_fan_out,
                    target_modules: config.target_modules,
                    modules_to_save: config.modules_to_save,
                }
            }
            None => PartialInfo {
                base_model: gguf_base,
                peft_type: "LORA".to_owned(),
                rank: lora.max_rank(),
                alpha: 0.0,
                use_rslora: false,
                use_dora: false,
                fan_in_fan_out: false,
                target_modules: TargetModules::List(lora.kinds.clone()),
                modules_to_save: Vec::new(),
            },
        };
        if lora.ranks.len() > 1 {
            notes.push(format!(
                "modules have different ranks {:?}; engines size their slots for the largest",
                lora.ranks
            ));
        }
        if info.base_model.is_none() {
            notes.push("the adapter does not name its base model; name it explicitly".to_owned());
        }
        AdapterInfo {
            repo: resolved.repo.clone(),
            revision: resolved.revision.clone(),
            sha: resolved.sha.clone(),
            format,
            base_model: info.base_model,
            peft_type: info.peft_type,
            rank: info.rank,
            alpha: info.alpha,
            use_rslora: info.use_rslora,
            use_dora: info.use_dora,
            fan_in_fan_out: info.fan_in_fan_out,
            target_modules: info.target_modules,
            modules_to_save: info.modules_to_save,
            tensors,
            by_dtype,
            lora,
            notes,
        }
    }
}

/// GGUF metadata values are shown up to this many characters in errors.
const MAX_SHOWN_VALUE: usize = 80;

/// A metadata value as an error shows it: its type and value, shortened.
fn shown(value: &crate::GgufValue) -> String {
    let mut text = format!("{} {value}", value.value_type());
    if text.len() > MAX_SHOWN_VALUE {
        let mut cut = MAX_SHOWN_VALUE;
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        text.truncate(cut);
        text.push('…');
    }
    text
}

/// What the weight file's header gave.
struct WeightsRead {
    format: AdapterFormat,
    tensors: TensorTotals,
    by_dtype: Vec<DtypeTotals>,
    lora: LoraLayout,
}

/// The fields of an [`AdapterInfo`] that come from its config (or stand in for it).
struct PartialInfo {
    base_model: Option<BaseModel>,
    peft_type: String,
    rank: u64,
    alpha: f64,
    use_rslora: bool,
    use_dora: bool,
    fan_in_fan_out: bool,
    target_modules: TargetModules,
    modules_to_save: Vec<String>,
}
