//! The inputs of a submission, checked against the workflow's declared inputs and typed.
//! Pure.

use std::collections::BTreeMap;

use skein_dsl::ir::{InputType, InputValue, Workflow};

/// A problem with the inputs given at submission.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InputError {
    /// A required input has no value.
    #[error("input `{name}` is required ({ty}); help: pass --input {name}=VALUE")]
    Missing {
        /// The input.
        name: String,
        /// Its type.
        ty: &'static str,
    },
    /// No input has this name.
    #[error("the workflow has no input `{name}`; its inputs are: {known}")]
    Unknown {
        /// The name given.
        name: String,
        /// The declared inputs.
        known: String,
    },
    /// The value is not of the input's type.
    #[error("input `{name}` must be {ty}, not `{value}`")]
    Type {
        /// The input.
        name: String,
        /// Its type.
        ty: &'static str,
        /// The value given.
        value: String,
    },
}

fn type_name(ty: InputType) -> &'static str {
    match ty {
        InputType::String => "a string",
        InputType::Integer => "an integer",
        InputType::Number => "a number",
        InputType::Boolean => "true or false",
        InputType::List => "a JSON list of strings, numbers or booleans",
    }
}

/// The inputs of a submission, typed: values given as text (`--input k=v`) or JSON are
/// converted to the declared type; defaults fill the rest.
///
/// Errors: an unknown name, a missing required input, a value of the wrong type.
pub fn typed_inputs(
    workflow: &Workflow,
    given: &BTreeMap<String, serde_json::Value>,
) -> Result<BTreeMap<String, InputValue>, InputError> {
    let mut out = BTreeMap::new();
    for name in given.keys() {
        if !workflow.inputs.contains_key(name) {
            let known: Vec<&str> = workflow.inputs.keys().map(String::as_str).collect();
            return Err(InputError::Unknown {
                name: name.clone(),
                known: if known.is_empty() {
                    "(none)".to_owned()
                } else {
                    known.join(", ")
                },
            });
        }
    }
    for (name, input) in &workflow.inputs {
        let value = match given.get(name) {
            Some(value) => convert(name, input.ty, value)?,
            None => match &input.default {
                Some(default) => default.clone(),
                None => {
                    return Err(InputError::Missing {
                        name: name.clone(),
                        ty: type_name(input.ty),
                    });
                }
            },
        };
        out.insert(name.clone(), value);
    }
    Ok(out)
}

fn convert(name: &str, ty: InputType, value: &serde_json::Value) -> Result<InputValue, InputError> {
    use serde_json::Value;
    let wrong = || InputError::Type {
        name: name.to_owned(),
        ty: type_name(ty),
        value: match value {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        },
    };
    let text = value.as_str().map(str::trim);
    match ty {
        InputType::String => match value {
            Value::String(s) => Ok(InputValue::String(s.clone())),
            Value::Number(n) => Ok(InputValue::String(n.to_string())),
            Value::Bool(b) => Ok(InputValue::String(b.to_string())),
            _ => Err(wrong()),
        },
        InputType::Integer => value
            .as_i64()
            .or_else(|| text.and_then(|t| t.parse().ok()))
            .map(InputValue::Integer)
            .ok_or_else(wrong),
        InputType::Number => value
            .as_f64()
            .or_else(|| text.and_then(|t| t.parse().ok()))
            .filter(|f| f.is_finite())
            .map(InputValue::Number)
            .ok_or_else(wrong),
        InputType::Boolean => value
            .as_bool()
            .or_else(|| text.and_then(|t| t.parse().ok()))
            .map(InputValue::Boolean)
            .ok_or_else(wrong),
        InputType::List => {
            // `--input topics='["a","b"]'` arrives as text.
            let parsed;
            let items = match value {
                Value::Array(items) => items,
                Value::String(text) => {
                    parsed = serde_json::from_str::<Value>(text).map_err(|_| wrong())?;
                    parsed.as_array().ok_or_else(wrong)?
                }
                _ => return Err(wrong()),
            };
            items
                .iter()
                .map(|item| list_item(item).ok_or_else(wrong))
                .collect::<Result<_, _>>()
                .map(InputValue::List)
        }
    }
}

/// An item of a list input: a string, number or boolean.
fn list_item(value: &serde_json::Value) -> Option<InputValue> {
    use serde_json::Value;
    match value {
        Value::String(s) => Some(InputValue::String(s.clone())),
        Value::Bool(b) => Some(InputValue::Boolean(*b)),
        Value::Number(n) => n
            .as_i64()
            .map(InputValue::Integer)
            .or_else(|| n.as_f64().map(InputValue::Number)),
        _ => None,
    }
}
