//! The fleet file as written: serde types that keep every value's position.
//!
//! Values whose checks deserve a better message than serde's ("invalid i64") are read
//! as [`RawScalar`] and checked in `resolve`, which can report all problems at once;
//! serde itself reports only the structural ones (unknown or missing keys, duplicate
//! keys, YAML syntax), one at a time.

use std::fmt;
use std::marker::PhantomData;

use serde::Deserialize;
use serde::de::value::MapAccessDeserializer;
use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_saphyr::Spanned;

/// A value with its position in the file.
pub(super) type S<T> = Spanned<T>;

/// The whole file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawFleet {
    pub fleet: S<RawScalar>,
    pub nodes: S<Entries<S<String>, RawNode>>,
}

/// One node.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawNode {
    #[serde(default)]
    pub gpus: Option<S<GpuGroups>>,
    #[serde(default)]
    pub telemetry: Option<S<RawTelemetry>>,
    #[serde(default)]
    pub host: Option<S<RawHost>>,
    /// `labels: { zone: lab-a }`.
    #[serde(default)]
    pub labels: Option<S<Entries<S<String>, S<RawScalar>>>>,
}

/// `gpus:` — one group (a mapping) or several (a list of mappings).
#[derive(Debug, Default)]
pub(super) struct GpuGroups(pub Vec<RawGpus>);

/// One group of identical GPUs.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawGpus {
    pub model: Option<S<String>>,
    pub name: Option<S<String>>,
    pub memory: Option<S<RawScalar>>,
    pub count: Option<S<RawScalar>>,
    pub nvlink: Option<S<RawScalar>>,
    pub compute_capability: Option<S<RawScalar>>,
    pub power_limit: Option<S<RawScalar>>,
    pub slowdown_temperature: Option<S<RawScalar>>,
    pub pcie: Option<S<RawPcie>>,
    pub ecc: Option<S<bool>>,
    pub mig: Option<S<bool>>,
}

/// `pcie: { generation: 4, width: 16 }`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawPcie {
    pub generation: S<RawScalar>,
    pub width: S<RawScalar>,
}

/// `host:` — what the simulated node says about its CPU side.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawHost {
    pub cpu_cores: Option<S<RawScalar>>,
    pub memory: Option<S<RawScalar>>,
    pub network: Option<S<RawScalar>>,
}

/// `telemetry:` — a model per metric, and overrides per GPU.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTelemetry {
    #[serde(alias = "util")]
    pub utilization: Option<S<RawModel>>,
    pub memory_utilization: Option<S<RawModel>>,
    pub memory_used: Option<S<RawModel>>,
    pub foreign_memory: Option<S<RawModel>>,
    pub temperature: Option<S<RawModel>>,
    pub power: Option<S<RawModel>>,
    pub sm_clock: Option<S<RawModel>>,
    pub ecc_corrected: Option<S<RawModel>>,
    pub ecc_uncorrected: Option<S<RawModel>>,
    pub throttle: Option<S<RawModel>>,
    pub per_gpu: Option<S<Entries<S<RawScalar>, S<RawTelemetry>>>>,
}

/// A metric's model as written.
#[derive(Debug)]
pub(super) enum RawModel {
    /// `idle`.
    Idle,
    /// A bare value: shorthand for `constant`.
    Value(RawScalar),
    /// `{ constant: v }`.
    Constant(S<RawScalar>),
    /// `{ ramp: {...} }`.
    Ramp(RawRamp),
    /// `{ square: {...} }`.
    Square(RawSquare),
    /// `{ spike: {...} }`.
    Spike(RawSpike),
    /// `{ replay: {...} }`.
    Replay(RawReplay),
}

/// The model names a mapping may use, in the order docs list them.
pub(super) const MODEL_NAMES: [&str; 6] = ["idle", "constant", "ramp", "square", "spike", "replay"];

// The keys of each model are optional here so that a missing one is reported by
// `resolve` at the model, with an example, rather than by serde at the last key read.

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRamp {
    pub from: Option<S<RawScalar>>,
    pub to: Option<S<RawScalar>>,
    pub over: Option<S<RawScalar>>,
    pub start: Option<S<RawScalar>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawSquare {
    pub low: Option<S<RawScalar>>,
    pub high: Option<S<RawScalar>>,
    pub period: Option<S<RawScalar>>,
    pub duty: Option<S<RawScalar>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawSpike {
    pub base: Option<S<RawScalar>>,
    pub peak: Option<S<RawScalar>>,
    pub at: Option<S<RawScalar>>,
    pub duration: Option<S<RawScalar>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawReplay {
    pub csv: Option<S<String>>,
    pub column: Option<S<String>>,
    pub time_column: Option<S<String>>,
    pub scale: Option<S<RawScalar>>,
    #[serde(rename = "loop")]
    pub repeat: Option<S<bool>>,
}

/// A scalar or a list of scalars, whatever its YAML type; checked later.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum RawScalar {
    Null,
    Bool(bool),
    Number(f64),
    Text(String),
    List(Vec<RawScalar>),
}

impl RawScalar {
    /// How the value looks in a message: `4`, `"four"`, `[a, b]`.
    pub fn shown(&self) -> String {
        match self {
            RawScalar::Null => "an empty value".to_owned(),
            RawScalar::Bool(b) => b.to_string(),
            RawScalar::Number(n) => n.to_string(),
            RawScalar::Text(t) => format!("\"{t}\""),
            RawScalar::List(items) => {
                format!(
                    "[{}]",
                    items.iter().map(RawScalar::shown).collect::<Vec<_>>().join(", ")
                )
            }
        }
    }
}

/// Entries of a mapping in file order, keys kept as written (duplicates are refused by
/// the YAML reader before they get here).
#[derive(Debug)]
pub(super) struct Entries<K, V>(pub Vec<(K, V)>);

impl<'de, K: Deserialize<'de>, V: Deserialize<'de>> Deserialize<'de> for Entries<K, V> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct EntriesVisitor<K, V>(PhantomData<(K, V)>);

        impl<'de, K: Deserialize<'de>, V: Deserialize<'de>> Visitor<'de> for EntriesVisitor<K, V> {
            type Value = Entries<K, V>;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a mapping")
            }

            fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
                Ok(Entries(Vec::new()))
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut entries = Vec::new();
                while let Some(key) = map.next_key()? {
                    entries.push((key, map.next_value()?));
                }
                Ok(Entries(entries))
            }
        }

        deserializer.deserialize_map(EntriesVisitor(PhantomData))
    }
}

impl<'de> Deserialize<'de> for GpuGroups {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct GroupsVisitor;

        impl<'de> Visitor<'de> for GroupsVisitor {
            type Value = GpuGroups;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a GPU group such as `{ model: A100-80GB, count: 4 }`, or a list of them")
            }

            fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
                Ok(GpuGroups(Vec::new()))
            }

            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
                Ok(GpuGroups(vec![RawGpus::deserialize(MapAccessDeserializer::new(map))?]))
            }

            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let mut groups = Vec::new();
                while let Some(group) = seq.next_element()? {
                    groups.push(group);
                }
                Ok(GpuGroups(groups))
            }
        }

        deserializer.deserialize_any(GroupsVisitor)
    }
}

impl<'de> Deserialize<'de> for RawScalar {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct ScalarVisitor;

        impl<'de> Visitor<'de> for ScalarVisitor {
            type Value = RawScalar;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a number, a word or a list")
            }

            fn visit_unit<E: de::Error>(self) -> Result<RawScalar, E> {
                Ok(RawScalar::Null)
            }

            fn visit_none<E: de::Error>(self) -> Result<RawScalar, E> {
                Ok(RawScalar::Null)
            }

            fn visit_bool<E: de::Error>(self, v: bool) -> Result<RawScalar, E> {
                Ok(RawScalar::Bool(v))
            }

            fn visit_i64<E: de::Error>(self, v: i64) -> Result<RawScalar, E> {
                Ok(RawScalar::Number(v as f64))
            }

            fn visit_u64<E: de::Error>(self, v: u64) -> Result<RawScalar, E> {
                Ok(RawScalar::Number(v as f64))
            }

            fn visit_f64<E: de::Error>(self, v: f64) -> Result<RawScalar, E> {
                Ok(RawScalar::Number(v))
            }

            fn visit_str<E: de::Error>(self, v: &str) -> Result<RawScalar, E> {
                Ok(RawScalar::Text(v.to_owned()))
            }

            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<RawScalar, A::Error> {
                let mut items = Vec::new();
                while let Some(item) = seq.next_element()? {
                    items.push(item);
                }
                Ok(RawScalar::List(items))
            }

            fn visit_map<A: MapAccess<'de>>(self, _map: A) -> Result<RawScalar, A::Error> {
                Err(de::Error::custom(
                    "expected a number, a word or a list here, not a mapping",
                ))
            }
        }

        deserializer.deserialize_any(ScalarVisitor)
    }
}

impl<'de> Deserialize<'de> for RawModel {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct ModelVisitor;

        impl<'de> Visitor<'de> for ModelVisitor {
            type Value = RawModel;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("`idle`, a value, or a model such as `{ ramp: { from: 0, to: 1, over: 60s } }`")
            }

            fn visit_unit<E: de::Error>(self) -> Result<RawModel, E> {
                Ok(RawModel::Value(RawScalar::Null))
            }

            fn visit_bool<E: de::Error>(self, v: bool) -> Result<RawModel, E> {
                Ok(RawModel::Value(RawScalar::Bool(v)))
            }

            fn visit_i64<E: de::Error>(self, v: i64) -> Result<RawModel, E> {
                Ok(RawModel::Value(RawScalar::Number(v as f64)))
            }

            fn visit_u64<E: de::Error>(self, v: u64) -> Result<RawModel, E> {
                Ok(RawModel::Value(RawScalar::Number(v as f64)))
            }

            fn visit_f64<E: de::Error>(self, v: f64) -> Result<RawModel, E> {
                Ok(RawModel::Value(RawScalar::Number(v)))
            }

            fn visit_str<E: de::Error>(self, v: &str) -> Result<RawModel, E> {
                if v == "idle" {
                    Ok(RawModel::Idle)
                } else {
                    Ok(RawModel::Value(RawScalar::Text(v.to_owned())))
                }
            }

            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<RawModel, A::Error> {
                let mut items = Vec::new();
                while let Some(item) = seq.next_element()? {
                    items.push(item);
                }
                Ok(RawModel::Value(RawScalar::List(items)))
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<RawModel, A::Error> {
                let Some(kind) = map.next_key::<String>()? else {
                    return Err(de::Error::custom(format!(
                        "empty model; expected one of {}",
                        MODEL_NAMES.join(", ")
                    )));
                };
                let model = match kind.as_str() {
                    "constant" => RawModel::Constant(map.next_value()?),
                    "ramp" => RawModel::Ramp(map.next_value()?),
                    "square" => RawModel::Square(map.next_value()?),
                    "spike" => RawModel::Spike(map.next_value()?),
                    "replay" => RawModel::Replay(map.next_value()?),
                    other => {
                        let hint = match skein_text::closest(other, MODEL_NAMES) {
                            Some(close) => format!(" (did you mean `{close}`?)"),
                            None => String::new(),
                        };
                        return Err(de::Error::custom(format!(
                            "unknown telemetry model `{other}`{hint}; expected one of {}",
                            MODEL_NAMES.join(", ")
                        )));
                    }
                };
                if let Some(extra) = map.next_key::<String>()? {
                    return Err(de::Error::custom(format!(
                        "a metric has one model, but `{extra}` follows `{kind}`; write each model under its own metric"
                    )));
                }
                Ok(model)
            }
        }

        deserializer.deserialize_any(ModelVisitor)
    }
}
