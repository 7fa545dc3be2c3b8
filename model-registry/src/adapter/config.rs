//! `adapter_config.json`: a typed, validated view of a PEFT LoRA adapter's config.
//!
//! The fields and their defaults follow PEFT's `LoraConfig` (`peft/tuners/lora/config.py`)
//! and its base `PeftConfig` (`peft/config.py`): `peft_type` is the one key PEFT itself
//! requires; `r` defaults to 8, `lora_alpha` to 8, `bias` to `none`, the booleans to
//! false. Keys this crate does not use (`lora_dropout`, `init_lora_weights`,
//! `megatron_config`, …) are ignored, as PEFT's own loader ignores unknown ones.

use crate::adapter::AdapterError;
use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::{Map, Value};

use crate::Error;

/// Name of a PEFT adapter's config file.
pub const ADAPTER_CONFIG: &str = "adapter_config.json";

/// The largest LoRA rank accepted. Real adapters use 4 to 512; anything larger is a
/// corrupt config, refused before any arithmetic is done with it.
pub const MAX_LORA_RANK: u64 = 1 << 16;

/// `peft_type` of a LoRA adapter.
const LORA: &str = "LORA";

/// PEFT's default `r` and `lora_alpha`.
const PEFT_DEFAULT_RANK: u64 = 8;
const PEFT_DEFAULT_ALPHA: f64 = 8.0;

/// Which modules of the base model carry LoRA matrices, as `target_modules` says.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", content = "value", rename_all = "snake_case")]
pub enum TargetModules {
    /// Absent or `null`: PEFT chose them from the base model's architecture. The
    /// adapter's tensors say which it chose.
    ArchitectureDefault,
    /// A list of module names (`["q_proj", "v_proj"]`), each matching a module whose
    /// name is it or ends with `.` and it.
    List(Vec<String>),
    /// PEFT's wildcard `all-linear`: every linear layer but the output projection.
    AllLinear,
    /// Any other string: a regular expression PEFT matched against full module names.
    Regex(String),
}

/// PEFT's `bias`: which biases were trained and saved with the adapter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LoraBias {
    /// No biases (the default).
    None,
    /// Every bias of the base model.
    All,
    /// The biases of the LoRA-adapted layers only.
    LoraOnly,
}

/// The rank a module's LoRA matrices must have, by the config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExpectedRank {
    /// Exactly this rank (`r`, or the `rank_pattern` entry that names the module).
    Exactly {
        /// The rank.
        rank: u64,
        /// The `rank_pattern` key that gave it; `None` for `r`.
        pattern: Option<String>,
    },
    /// One of these ranks: `rank_pattern` has keys that are regular expressions, which
    /// this crate does not evaluate, so any rank the config names is accepted.
    OneOf(Vec<u64>),
}

/// A validated `adapter_config.json` of a LoRA adapter.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AdapterConfig {
    /// `peft_type`: always `LORA` here (other types are refused by
    /// [`AdapterConfig::from_json`]).
    pub peft_type: String,
    /// `base_model_name_or_path`, as written: a hub id, or a local path of the trainer's
    /// machine.
    pub base_model: Option<String>,
    /// `revision`: the base model's revision the adapter was trained on, when recorded.
    pub base_revision: Option<String>,
    /// `task_type` (`CAUSAL_LM`, …).
    pub task_type: Option<String>,
    /// `r`: the LoRA rank.
    pub rank: u64,
    /// `lora_alpha`: the scaling numerator.
    pub alpha: f64,
    /// `target_modules`.
    pub target_modules: TargetModules,
    /// `modules_to_save`: modules stored whole (fully trained) besides the LoRA
    /// matrices, such as `lm_head`.
    pub modules_to_save: Vec<String>,
    /// `fan_in_fan_out`: the base layers store their weights transposed (GPT-2's
    /// `Conv1D`). The LoRA matrices keep their layout either way.
    pub fan_in_fan_out: bool,
    /// `bias`.
    pub bias: LoraBias,
    /// `use_dora`: weight-decomposed LoRA, with a magnitude vector per module.
    pub use_dora: bool,
    /// `use_rslora`: rank-stabilised scaling, `alpha / √r` instead of `alpha / r`.
    pub use_rslora: bool,
    /// `rank_pattern`: ranks of the modules whose rank is not `r`, keyed by module name
    /// or regular expression.
    pub rank_pattern: BTreeMap<String, u64>,
    /// `alpha_pattern`: the same for `lora_alpha`.
    pub alpha_pattern: BTreeMap<String, f64>,
    /// `layers_to_transform`: the only decoder layers adapted, when restricted.
    pub layers_to_transform: Vec<u64>,
}

impl AdapterConfig {
    /// Parses and validates `adapter_config.json`.
    ///
    /// Errors: [`AdapterError::AdapterConfigJson`] for bytes that are not JSON;
    /// [`AdapterError::AdapterConfigField`] naming the field for a config that is not an
    /// object, a missing `peft_type`, or a field of the wrong type or out of range (a
    /// rank of 0 or above [`MAX_LORA_RANK`], a non-finite alpha); [`AdapterError::NotLora`] for
    /// another PEFT method (`ADALORA`, `IA3`, `LOHA`, `PREFIX_TUNING`, …).
    pub fn from_json(json: &[u8]) -> Result<AdapterConfig, Error> {
        let value: Value = serde_json::from_slice(json).map_err(|source| AdapterError::AdapterConfigJson { source })?;
        let object = match value {
            Value::Object(object) => object,
            other => return Err(field_error("(root)", &other, "a JSON object")),
        };
        let fields = Fields(&object);

        let peft_type = match fields.get("peft_type") {
            Some(Value::String(peft_type)) => peft_type.clone(),
            Some(other) => return Err(field_error("peft_type", other, "a string, `LORA` for a LoRA adapter")),
            None => {
                return Err(AdapterError::AdapterConfigField {
                    field: "peft_type".to_owned(),
                    found: "missing".to_owned(),
                    expected: "the PEFT method, `LORA` for a LoRA adapter",
                }
                .into());
            }
        };
        if peft_type != LORA {
            return Err(AdapterError::NotLora { peft_type }.into());
        }

        let rank = match fields.get("r") {
            None => PEFT_DEFAULT_RANK,
            Some(value) => rank_value("r", value)?,
        };
        let alpha = match fields.get("lora_alpha") {
            None => PEFT_DEFAULT_ALPHA,
            Some(value) => alpha_value("lora_alpha", value)?,
        };
        let target_modules = match fields.get("target_modules") {
            None => TargetModules::ArchitectureDefault,
            Some(Value::String(all)) if all == "all-linear" => TargetModules::AllLinear,
            Some(Value::String(regex)) => TargetModules::Regex(regex.clone()),
            Some(value @ Value::Array(_)) => TargetModules::List(strings("target_modules", value)?),
            Some(other) => {
                return Err(field_error(
                    "target_modules",
                    other,
                    "a list of module names or a regular expression",
                ));
            }
        };
        let modules_to_save = match fields.get("modules_to_save") {
            None => Vec::new(),
            Some(value) => strings("modules_to_save", value)?,
        };
        let bias = match fields.get("bias") {
            None => LoraBias::None,
            Some(Value::String(s)) if s == "none" => LoraBias::None,
            Some(Value::String(s)) if s == "all" => LoraBias::All,
            Some(Value::String(s)) if s == "lora_only" => LoraBias::LoraOnly,
            Some(other) => return Err(field_error("bias", other, "`none`, `all` or `lora_only`")),
        };
        let mut rank_pattern = BTreeMap::new();
        if let Some(value) = fields.get("rank_pattern") {
            for (key, rank) in object_entries("rank_pattern", value)? {
                rank_pattern.insert(key.clone(), rank_value(&format!("rank_pattern.{key}"), rank)?);
            }
        }
        let mut alpha_pattern = BTreeMap::new();
        if let Some(value) = fields.get("alpha_pattern") {
            for (key, alpha) in object_entries("alpha_pattern", value)? {
                alpha_pattern.insert(key.clone(), alpha_value(&format!("alpha_pattern.{key}"), alpha)?);
            }
        }
        let layers_to_transform = match fields.get("layers_to_transform") {
            None => Vec::new(),
            Some(Value::Array(items)) => items
                .iter()
                .enumerate()
                .map(|(i, item)| {
                    item.as_u64().ok_or_else(|| {
                        field_error(&format!("layers_to_transform[{i}]"), item, "a layer index (0 or more)")
                    })
                })
                .collect::<Result<Vec<u64>, Error>>()?,
            Some(value) => vec![value.as_u64().ok_or_else(|| {
                field_error("layers_to_transform", value, "a layer index or a list of layer indices")
            })?],
        };

        Ok(AdapterConfig {
            peft_type,
            base_model: fields.optional_string("base_model_name_or_path")?,
            base_revision: fields.optional_string("revision")?,
            task_type: fields.optional_string("task_type")?,
            rank,
            alpha,
            target_modules,
            modules_to_save,
            fan_in_fan_out: fields.flag("fan_in_fan_out")?,
            bias,
            use_dora: fields.flag("use_dora")?,
            use_rslora: fields.flag("use_rslora")?,
            rank_pattern,
            alpha_pattern,
            layers_to_transform,
        })
    }

    /// The factor the LoRA product `B·A` is scaled by for a module of rank `r`:
    /// `alpha / r`, or `alpha / √r` with rsLoRA (PEFT's `LoraLayer.update_layer`, which
    /// vLLM's `PEFTHelper` follows). `None` for a rank of 0.
    pub fn scaling(&self) -> Option<f64> {
        if self.rank == 0 {
            return None;
        }
        // Ranks are at most MAX_LORA_RANK (2^16), exact in an f64.
        let rank = self.rank as f64;
        Some(if self.use_rslora {
            self.alpha / rank.sqrt()
        } else {
            self.alpha / rank
        })
    }

    /// The rank the LoRA matrices of `module` (a full module name, such as
    /// `base_model.model.model.layers.0.self_attn.q_proj`) must have.
    ///
    /// PEFT matches a `rank_pattern` key `k` as the regular expression `(.*\.)?(k)$`
    /// against the module name. Keys that are plain names (letters, digits, `_`, `-`,
    /// `.`, an optional leading `^`) are matched here exactly as that expression would
    /// match them; when the config has other keys, which are real regular expressions,
    /// a module no plain key matches may have `r` or any rank the pattern names.
    pub fn expected_rank(&self, module: &str) -> ExpectedRank {
        let mut has_regex = false;
        for (key, &rank) in &self.rank_pattern {
            match plain_pattern(key) {
                Some(plain)
                    if module == plain || module.strip_suffix(plain).is_some_and(|rest| rest.ends_with('.')) =>
                {
                    return ExpectedRank::Exactly {
                        rank,
                        pattern: Some(key.clone()),
                    };
                }
                Some(_) => {}
                None => has_regex = true,
            }
        }
        if has_regex {
            let mut ranks: Vec<u64> = self.rank_pattern.values().copied().chain([self.rank]).collect();
            ranks.sort_unstable();
            ranks.dedup();
            ExpectedRank::OneOf(ranks)
        } else {
            ExpectedRank::Exactly {
                rank: self.rank,
                pattern: None,
            }
        }
    }
}

/// A `rank_pattern` key as a literal module name (or name suffix), when it is one:
/// letters, digits, `_`, `-` and `.`, with an optional leading `^`. A `.` is a regex
/// wildcard, but in a module path it is the separator, and matching any character
/// instead of a dot changes nothing for real module names. `^` anchors no more than
/// PEFT's own `(.*\.)?` prefix does.
fn plain_pattern(key: &str) -> Option<&str> {
    let plain = key.strip_prefix('^').unwrap_or(key);
    let literal = !plain.is_empty()
        && plain
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'));
    literal.then_some(plain)
}

/// The object's fields, `null` read as absent (PEFT writes `null` for unset options).
struct Fields<'a>(&'a Map<String, Value>);

impl Fields<'_> {
    fn get(&self, key: &str) -> Option<&Value> {
        self.0.get(key).filter(|value| !value.is_null())
    }

    fn flag(&self, key: &str) -> Result<bool, Error> {
        match self.get(key) {
            None => Ok(false),
            Some(Value::Bool(flag)) => Ok(*flag),
            Some(other) => Err(field_error(key, other, "true or false")),
        }
    }

    fn optional_string(&self, key: &str) -> Result<Option<String>, Error> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(other) => Err(field_error(key, other, "a string")),
        }
    }
}

fn rank_value(field: &str, value: &Value) -> Result<u64, Error> {
    value
        .as_u64()
        .filter(|rank| (1..=MAX_LORA_RANK).contains(rank))
        .ok_or_else(|| field_error(field, value, "a whole number from 1 to 65536 (the LoRA rank)"))
}

fn alpha_value(field: &str, value: &Value) -> Result<f64, Error> {
    value
        .as_f64()
        .filter(|alpha| alpha.is_finite())
        .ok_or_else(|| field_error(field, value, "a finite number (the LoRA alpha)"))
}

fn strings(field: &str, value: &Value) -> Result<Vec<String>, Error> {
    let Value::Array(items) = value else {
        return Err(field_error(field, value, "a list of module names"));
    };
    items
        .iter()
        .enumerate()
        .map(|(i, item)| match item {
            Value::String(s) => Ok(s.clone()),
            other => Err(field_error(&format!("{field}[{i}]"), other, "a module name (a string)")),
        })
        .collect()
}

fn object_entries<'a>(field: &str, value: &'a Value) -> Result<&'a Map<String, Value>, Error> {
    match value {
        Value::Object(entries) => Ok(entries),
        other => Err(field_error(field, other, "an object of module names to values")),
    }
}

/// JSON values are shown up to this many characters in errors.
const MAX_SHOWN_JSON: usize = 80;

fn field_error(field: &str, found: &Value, expected: &'static str) -> Error {
    let mut shown = found.to_string();
    if shown.len() > MAX_SHOWN_JSON {
        let mut cut = MAX_SHOWN_JSON;
        while !shown.is_char_boundary(cut) {
            cut -= 1;
        }
        shown.truncate(cut);
        shown.push('…');
    }
    AdapterError::AdapterConfigField {
        field: field.to_owned(),
        found: shown,
        expected,
    }
    .into()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(json: &str) -> Result<AdapterConfig, Error> {
        AdapterConfig::from_json(json.as_bytes())
    }

    #[test]
    fn a_peft_config_reads_with_peft_defaults() {
        let config = parse(
            r#"{"peft_type": "LORA", "base_model_name_or_path": "meta-llama/Meta-Llama-3-8B",
                "r": 16, "lora_alpha": 32, "target_modules": ["q_proj", "v_proj"],
                "lora_dropout": 0.05, "modules_to_save": null, "rank_pattern": {}, "revision": null}"#,
        )
        .unwrap();
        assert_eq!(config.rank, 16);
        assert_eq!(config.alpha, 32.0);
        assert_eq!(config.scaling(), Some(2.0));
        assert_eq!(
            config.target_modules,
            TargetModules::List(vec!["q_proj".into(), "v_proj".into()])
        );
        assert_eq!(config.base_model.as_deref(), Some("meta-llama/Meta-Llama-3-8B"));
        assert_eq!(config.bias, LoraBias::None);
        assert!(config.modules_to_save.is_empty());

        let defaults = parse(r#"{"peft_type": "LORA"}"#).unwrap();
        assert_eq!((defaults.rank, defaults.alpha), (8, 8.0));
        assert_eq!(defaults.target_modules, TargetModules::ArchitectureDefault);

        let rslora = parse(r#"{"peft_type": "LORA", "r": 16, "lora_alpha": 16, "use_rslora": true}"#).unwrap();
        assert_eq!(rslora.scaling(), Some(4.0));
        let regex = parse(r#"{"peft_type": "LORA", "target_modules": ".*(q|v)_proj$"}"#).unwrap();
        assert_eq!(regex.target_modules, TargetModules::Regex(".*(q|v)_proj$".into()));
        let all = parse(r#"{"peft_type": "LORA", "target_modules": "all-linear", "layers_to_transform": 3}"#).unwrap();
        assert_eq!(all.target_modules, TargetModules::AllLinear);
        assert_eq!(all.layers_to_transform, [3]);
    }

    #[test]
    fn other_peft_methods_and_bad_fields_are_refused_by_name() {
        let err = parse(r#"{"peft_type": "IA3", "r": 8}"#).unwrap_err();
        assert!(
            matches!(&err, Error::Adapter(AdapterError::NotLora { peft_type }) if peft_type == "IA3"),
            "{err}"
        );
        assert!(err.to_string().contains("not a LoRA adapter"), "{err}");

        let cases = [
            (r#"{"r": 8}"#, "peft_type"),
            (r#"{"peft_type": 7}"#, "peft_type"),
            (r#"{"peft_type": "LORA", "r": 0}"#, "r"),
            (r#"{"peft_type": "LORA", "r": -4}"#, "r"),
            (r#"{"peft_type": "LORA", "r": 1e30}"#, "r"),
            (r#"{"peft_type": "LORA", "r": "16"}"#, "r"),
            (r#"{"peft_type": "LORA", "lora_alpha": "x"}"#, "lora_alpha"),
            (r#"{"peft_type": "LORA", "target_modules": 3}"#, "target_modules"),
            (
                r#"{"peft_type": "LORA", "target_modules": ["q", 1]}"#,
                "target_modules[1]",
            ),
            (r#"{"peft_type": "LORA", "bias": "some"}"#, "bias"),
            (r#"{"peft_type": "LORA", "use_dora": "yes"}"#, "use_dora"),
            (
                r#"{"peft_type": "LORA", "rank_pattern": {"q_proj": 0}}"#,
                "rank_pattern.q_proj",
            ),
            (
                r#"{"peft_type": "LORA", "layers_to_transform": [1, -2]}"#,
                "layers_to_transform[1]",
            ),
            (r#"[1, 2]"#, "(root)"),
        ];
        for (json, field) in cases {
            match parse(json) {
                Err(Error::Adapter(AdapterError::AdapterConfigField { field: f, .. })) => {
                    assert_eq!(f, field, "{json}")
                }
                other => panic!("{json}: {other:?}"),
            }
        }
        assert!(matches!(
            parse("{"),
            Err(Error::Adapter(AdapterError::AdapterConfigJson { .. }))
        ));
        let long = format!(r#"{{"peft_type": "LORA", "r": "{}"}}"#, "9".repeat(500));
        let err = parse(&long).unwrap_err().to_string();
        assert!(err.len() < 300, "{err}");
    }

    #[test]
    fn rank_pattern_keys_match_module_name_suffixes() {
        let config = parse(
            r#"{"peft_type": "LORA", "r": 8,
                "rank_pattern": {"v_proj": 16, "^model.layers.0.self_attn.q_proj": 32}}"#,
        )
        .unwrap();
        let exactly = |rank, pattern: Option<&str>| ExpectedRank::Exactly {
            rank,
            pattern: pattern.map(str::to_owned),
        };
        assert_eq!(
            config.expected_rank("base_model.model.model.layers.3.self_attn.v_proj"),
            exactly(16, Some("v_proj"))
        );
        assert_eq!(
            config.expected_rank("base_model.model.model.layers.0.self_attn.q_proj"),
            exactly(32, Some("^model.layers.0.self_attn.q_proj"))
        );
        assert_eq!(
            config.expected_rank("base_model.model.model.layers.1.self_attn.q_proj"),
            exactly(8, None)
        );
        // `xv_proj` does not end in `.v_proj`.
        assert_eq!(config.expected_rank("layers.1.xv_proj"), exactly(8, None));

        let regex =
            parse(r#"{"peft_type": "LORA", "r": 8, "rank_pattern": {"layers\\.(0|1)\\..*q_proj": 4}}"#).unwrap();
        assert_eq!(
            regex.expected_rank("model.layers.0.q_proj"),
            ExpectedRank::OneOf(vec![4, 8])
        );
    }
}
