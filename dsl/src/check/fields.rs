//! Fields of a step's JSON answer read in expressions
//! (`steps.plan.output.json.topics[0].name`), checked against the step's
//! `output_schema` as far as the schema says what the answer holds.
//!
//! The walk follows `properties` of objects and `prefixItems`/`items` of
//! arrays (a whole-number index). A field an object's `properties` does not
//! list is an error even without `additionalProperties: false` (an agent asked
//! for the schema answers with its fields; a name outside them is most likely a
//! typo). The walk stops, accepting the rest, wherever the schema leaves the
//! answer open: no `properties`, other properties allowed
//! (`additionalProperties` or `patternProperties` other than `false`), or a
//! combination it does not resolve (`$ref`, `allOf`, `anyOf`, `oneOf`, `if`,
//! `dependentSchemas`, `unevaluatedProperties`).

use serde_json::Value;

use crate::diag::{Code, Diagnostic, did_you_mean};
use crate::read::Cx;
use crate::source::Span;

/// What a later expression can know of a step's `.json`.
pub struct Shape<'a> {
    /// The step's `output_schema`.
    pub schema: Option<&'a Value>,
    /// Whether the step runs `for_each` (its output is then the list of the
    /// items' answers).
    pub for_each: bool,
    /// Whether a person answers it (its output is a comment).
    pub approval: bool,
}

/// Keywords under which an object may hold fields the walk cannot list.
const OPEN_ENDED: &[&str] = &[
    "$ref",
    "$dynamicRef",
    "allOf",
    "anyOf",
    "oneOf",
    "if",
    "dependentSchemas",
    "patternProperties",
];

/// Check the path after `steps.<step>.output.json`: `fields` are its segments
/// with their spans (`[0]` for an index), `json` the span of `json` itself;
/// `last_is_call` when the path ends in a method call (`.len()`).
pub fn check(cx: &mut Cx<'_>, step: &str, shape: &Shape<'_>, json: Span, fields: &[(&str, Span)], last_is_call: bool) {
    let Some(schema) = shape.schema else {
        if !shape.for_each {
            let what = if shape.approval {
                "an approval step: its output is the approver's comment"
            } else {
                "no `output_schema`: its answer is free text"
            };
            cx.push(
                Diagnostic::warning(
                    Code::JsonWithoutSchema,
                    json,
                    format!("step `{step}` has {what}, which may not be JSON"),
                )
                .with_label("parsed as JSON at run time")
                .with_help(format!(
                    "give `{step}` an `output_schema` so that its answer is asked for, and checked, as JSON"
                )),
            );
        }
        return;
    };
    // A `for_each` step's output is the list of its items' answers.
    let wrapped;
    let mut at = if shape.for_each {
        wrapped = serde_json::json!({ "type": "array", "items": schema });
        &wrapped
    } else {
        schema
    };
    for (i, (field, span)) in fields.iter().enumerate() {
        let Some(object) = at.as_object() else { return };
        if let Some(index) = field.strip_prefix('[').and_then(|f| f.strip_suffix(']')) {
            let Ok(index) = index.parse::<usize>() else { return };
            let tuple = object.get("prefixItems").and_then(Value::as_array);
            let next = match tuple.and_then(|t| t.get(index)) {
                Some(item) => Some(item),
                None => object.get("items").filter(|items| items.is_object()),
            };
            match next {
                Some(next) => at = next,
                None => return,
            }
            continue;
        }
        let Some(properties) = object.get("properties").and_then(Value::as_object) else {
            return;
        };
        if let Some(next) = properties.get(*field) {
            at = next;
            continue;
        }
        let closed = OPEN_ENDED.iter().all(|k| !object.contains_key(*k))
            && object
                .get("additionalProperties")
                .is_none_or(|a| a == &Value::Bool(false))
            && object
                .get("unevaluatedProperties")
                .is_none_or(|a| a == &Value::Bool(false));
        // `json.topics.len()`: a method of the value, not a field.
        if !closed || (last_is_call && i + 1 == fields.len()) {
            return;
        }
        let path: String = fields[..i]
            .iter()
            .map(|(f, _)| {
                if f.starts_with('[') {
                    (*f).to_owned()
                } else {
                    format!(".{f}")
                }
            })
            .collect();
        cx.push(
            Diagnostic::error(
                Code::UnknownField,
                *span,
                format!("the output schema of step `{step}` has no field `{field}` in `json{path}`"),
            )
            .with_label("not in the schema")
            .with_help(did_you_mean(field, properties.keys().map(String::as_str), "fields")),
        );
        return;
    }
}
