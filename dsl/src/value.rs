//! The values an expression's variables are bound to, and what an evaluation
//! gives back: the DSL's own type, so that callers bind `gpu.util` or
//! `steps.look.output` without knowing the engine underneath.
//!
//! [`crate::expr::Evaluator`] turns [`Bindings`] into Rhai values on its own
//! threads and a result back into a [`Value`]; nothing of Rhai leaves the crate.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use rhai::Dynamic;

use crate::truth::{Absent, Atoms};

/// The variables of one evaluation, by name (`gpu`, `node`, `agent`, `inputs`,
/// `steps`, `iteration`).
pub type Bindings = BTreeMap<String, Value>;

/// A value an expression reads or returns.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// No value: what an expression without a result gives (`()`).
    Unit,
    /// `true` or `false`.
    Bool(bool),
    /// A whole number.
    Int(i64),
    /// A floating-point number.
    Float(f64),
    /// Text.
    Text(String),
    /// An array.
    List(Vec<Value>),
    /// A map from field names to values (`gpu` with `util`, `temp`, …).
    Map(BTreeMap<String, Value>),
    /// A number metric with no data (a GPU before its first sample): any
    /// comparison on it is unknown ([`crate::expr::Truth`]).
    AbsentNumber,
    /// A true-or-false metric with no data (`gpu.throttled` of a remote agent).
    AbsentFlag,
}

impl Value {
    /// A map of `entries`.
    pub fn map<K: Into<String>>(entries: impl IntoIterator<Item = (K, Value)>) -> Value {
        Value::Map(entries.into_iter().map(|(k, v)| (k.into(), v)).collect())
    }

    /// The field `key` of a map; `None` for a missing field or a value that is
    /// not a map.
    pub fn get(&self, key: &str) -> Option<&Value> {
        match self {
            Value::Map(fields) => fields.get(key),
            _ => None,
        }
    }

    /// The number this value holds, a whole one widened; `None` for anything else.
    pub fn as_f64(&self) -> Option<f64> {
        match self {
            Value::Float(x) => Some(*x),
            Value::Int(i) => Some(*i as f64),
            _ => None,
        }
    }

    /// Whether this value is, or holds anywhere inside it, an absent metric.
    pub fn holds_absent(&self) -> bool {
        match self {
            Value::AbsentNumber | Value::AbsentFlag => true,
            Value::List(items) => items.iter().any(Value::holds_absent),
            Value::Map(fields) => fields.values().any(Value::holds_absent),
            Value::Unit | Value::Bool(_) | Value::Int(_) | Value::Float(_) | Value::Text(_) => false,
        }
    }
}

impl From<bool> for Value {
    fn from(b: bool) -> Self {
        Value::Bool(b)
    }
}

impl From<i64> for Value {
    fn from(i: i64) -> Self {
        Value::Int(i)
    }
}

impl From<f64> for Value {
    fn from(x: f64) -> Self {
        Value::Float(x)
    }
}

impl From<String> for Value {
    fn from(s: String) -> Self {
        Value::Text(s)
    }
}

impl From<&str> for Value {
    fn from(s: &str) -> Self {
        Value::Text(s.to_owned())
    }
}

/// `value` as Rhai sees it. An absent metric is labelled by its `path`
/// (`gpu.util`); with `atoms` (one evaluation of a condition whose metrics may be
/// absent) a number reads them and a flag is the truth they chose for it.
pub(crate) fn to_dynamic<'a>(value: &'a Value, path: &mut Vec<&'a str>, atoms: Option<&Arc<Mutex<Atoms>>>) -> Dynamic {
    match value {
        Value::Unit => Dynamic::UNIT,
        Value::Bool(b) => Dynamic::from_bool(*b),
        Value::Int(i) => Dynamic::from_int(*i),
        Value::Float(x) => Dynamic::from_float(*x),
        Value::Text(s) => Dynamic::from(s.clone()),
        Value::List(items) => Dynamic::from_array(items.iter().map(|v| to_dynamic(v, path, atoms)).collect()),
        Value::Map(fields) => Dynamic::from_map(
            fields
                .iter()
                .map(|(k, v)| {
                    path.push(k);
                    let d = to_dynamic(v, path, atoms);
                    path.pop();
                    (k.as_str().into(), d)
                })
                .collect(),
        ),
        Value::AbsentNumber => Dynamic::from(Absent::new(&path.join("."), false, atoms.cloned())),
        Value::AbsentFlag => match atoms {
            Some(atoms) => Dynamic::from_bool(crate::truth::lock(atoms).truth(path.join("."))),
            None => Dynamic::from(Absent::new(&path.join("."), true, None)),
        },
    }
}

/// `bindings` as `(name, value)` pairs for a Rhai scope.
pub(crate) fn scope_values(bindings: &Bindings, atoms: Option<&Arc<Mutex<Atoms>>>) -> Vec<(String, Dynamic)> {
    bindings
        .iter()
        .map(|(name, value)| {
            let mut path = vec![name.as_str()];
            (name.clone(), to_dynamic(value, &mut path, atoms))
        })
        .collect()
}

/// JSON as Rhai sees it: objects are maps, `null` is `()`, a whole number
/// that fits is an integer. `None` when `json` nests deeper than `depth`
/// levels of arrays and objects, or holds more than `budget` items and
/// entries in all (`budget` is what is left of it).
pub(crate) fn json_to_dynamic(json: &serde_json::Value, depth: usize, budget: &mut usize) -> Option<Dynamic> {
    use serde_json::Value as J;
    Some(match json {
        J::Null => Dynamic::UNIT,
        J::Bool(b) => Dynamic::from_bool(*b),
        J::Number(n) => match n.as_i64() {
            Some(i) => Dynamic::from_int(i),
            None => Dynamic::from_float(n.as_f64()?),
        },
        J::String(s) => Dynamic::from(s.clone()),
        J::Array(items) => {
            *budget = budget.checked_sub(items.len())?;
            let depth = depth.checked_sub(1)?;
            let mut out = rhai::Array::with_capacity(items.len());
            for v in items {
                out.push(json_to_dynamic(v, depth, budget)?);
            }
            Dynamic::from_array(out)
        }
        J::Object(fields) => {
            *budget = budget.checked_sub(fields.len())?;
            let depth = depth.checked_sub(1)?;
            let mut out = rhai::Map::new();
            for (k, v) in fields {
                out.insert(k.as_str().into(), json_to_dynamic(v, depth, budget)?);
            }
            Dynamic::from_map(out)
        }
    })
}

/// A Rhai result as a [`Value`]. What has no twin here (a function pointer) is
/// its text. The caller bounds how deep `d` nests.
pub(crate) fn from_dynamic(d: Dynamic) -> Value {
    if d.is_unit() {
        return Value::Unit;
    }
    if let Ok(b) = d.as_bool() {
        return Value::Bool(b);
    }
    if let Ok(i) = d.as_int() {
        return Value::Int(i);
    }
    if let Ok(x) = d.as_float() {
        return Value::Float(x);
    }
    if let Ok(c) = d.as_char() {
        return Value::Text(c.to_string());
    }
    if let Some(absent) = d.read_lock::<Absent>() {
        return if absent.is_flag() {
            Value::AbsentFlag
        } else {
            Value::AbsentNumber
        };
    }
    if d.is_string() {
        return Value::Text(d.into_string().unwrap_or_default());
    }
    if d.is_array() {
        return Value::List(
            d.into_array()
                .unwrap_or_default()
                .into_iter()
                .map(from_dynamic)
                .collect(),
        );
    }
    if d.is_map() {
        return Value::Map(
            d.try_cast::<rhai::Map>()
                .unwrap_or_default()
                .into_iter()
                .map(|(k, v)| (k.to_string(), from_dynamic(v)))
                .collect(),
        );
    }
    Value::Text(d.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_go_to_rhai_and_back_unchanged() {
        let value = Value::map([
            ("flag", Value::Bool(true)),
            ("count", Value::Int(3)),
            ("share", Value::Float(0.5)),
            ("name", Value::from("llama")),
            ("list", Value::List(vec![Value::Int(1), Value::Unit])),
            ("nested", Value::map([("deep", Value::Float(1.5))])),
            ("missing", Value::AbsentNumber),
            ("off", Value::AbsentFlag),
        ]);
        let back = from_dynamic(to_dynamic(&value, &mut vec!["x"], None));
        assert_eq!(back, value);
    }

    #[test]
    fn absent_metrics_are_found_at_any_depth() {
        assert!(!Value::map([("util", Value::Float(0.1))]).holds_absent());
        assert!(Value::map([("gpu", Value::map([("util", Value::AbsentNumber)]))]).holds_absent());
        assert!(Value::List(vec![Value::AbsentFlag]).holds_absent());
        assert_eq!(
            Value::map([("util", Value::Int(1))])
                .get("util")
                .and_then(Value::as_f64),
            Some(1.0)
        );
        assert_eq!(Value::Int(1).get("util"), None);
    }
}
