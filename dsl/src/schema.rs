//! A step's `output_schema`: a JSON Schema compiled once, and the check of an
//! agent's answer against it.
//!
//! Pure: the schema's `$ref`s resolve only inside the schema (no file or HTTP
//! retrieval is compiled in), and nothing here reads a clock or does IO. The
//! checker compiles every schema when the workflow is validated; the
//! orchestrator compiles it again at run time and checks each answer with
//! [`OutputSchema::check`].
//!
//! ```
//! use skein_dsl::schema::OutputSchema;
//! let schema = serde_json::json!({
//!     "type": "object",
//!     "properties": { "topics": { "type": "array", "items": { "type": "string" } } },
//!     "required": ["topics"]
//! });
//! let schema = OutputSchema::compile(&schema).unwrap();
//! let value = schema.check("```json\n{\"topics\": [\"GPUs\"]}\n```").unwrap();
//! assert_eq!(value["topics"][0], "GPUs");
//! let e = schema.check("{\"topics\": [1]}").unwrap_err();
//! assert!(e.contains("/topics/0"), "{e}");
//! ```

use serde_json::Value;

/// Longest error message [`OutputSchema::check`] and [`OutputSchema::compile`]
/// return, in characters (an answer or a schema can be long; a message stays
/// one readable line).
pub const MAX_MESSAGE_CHARS: usize = 300;

/// A compiled JSON Schema.
#[derive(Debug, Clone)]
pub struct OutputSchema {
    validator: jsonschema::Validator,
}

/// A problem with a schema itself, found when compiling it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SchemaError {
    /// What is wrong, in one line of at most [`MAX_MESSAGE_CHARS`] characters.
    pub message: String,
    /// Where in the schema (a JSON pointer such as `/properties/topics/type`;
    /// empty for the whole schema).
    pub pointer: String,
}

impl std::fmt::Display for SchemaError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.pointer.is_empty() {
            f.write_str(&self.message)
        } else {
            write!(f, "at {}: {}", self.pointer, self.message)
        }
    }
}

impl OutputSchema {
    /// Compile `schema`; a schema that is not valid JSON Schema (draft
    /// detected from `$schema`, 2020-12 when absent) is an error saying
    /// where, in one line.
    pub fn compile(schema: &Value) -> Result<OutputSchema, String> {
        Self::compile_at(schema).map_err(|e| e.to_string())
    }

    /// [`OutputSchema::compile`] with the error's place apart, for a
    /// diagnostic that points at it.
    pub fn compile_at(schema: &Value) -> Result<OutputSchema, SchemaError> {
        if !matches!(schema, Value::Object(_) | Value::Bool(_)) {
            return Err(SchemaError {
                message: "a JSON Schema is an object (or `true`/`false`)".to_owned(),
                pointer: String::new(),
            });
        }
        jsonschema::validator_for(schema)
            .map(|validator| OutputSchema { validator })
            .map_err(|e| SchemaError {
                message: one_line(&e.to_string()),
                pointer: e.instance_path().to_string(),
            })
    }

    /// Parse `answer` as JSON — surrounding whitespace and one Markdown code
    /// fence (```` ```json ```` or ```` ``` ````) around it are tolerated —
    /// and validate it. The error says what was wrong and where (a JSON
    /// pointer into the answer), in one line of at most
    /// [`MAX_MESSAGE_CHARS`] characters.
    pub fn check(&self, answer: &str) -> Result<Value, String> {
        let text = unfenced(answer);
        let value: Value = serde_json::from_str(text).map_err(|e| {
            one_line(&format!(
                "the answer is not JSON: {e} (the answer begins {:?})",
                text.chars().take(40).collect::<String>()
            ))
        })?;
        if self.validator.is_valid(&value) {
            return Ok(value);
        }
        let mut errors = self.validator.iter_errors(&value);
        let Some(first) = errors.next() else {
            return Err("the answer does not match the output schema".to_owned());
        };
        let more = errors.count();
        let at = first.instance_path().to_string();
        let place = if at.is_empty() {
            "the answer".to_owned()
        } else {
            format!("at {at}")
        };
        let also = match more {
            0 => String::new(),
            1 => " (and 1 more problem)".to_owned(),
            n => format!(" (and {n} more problems)"),
        };
        Err(one_line(&format!(
            "the answer does not match the output schema: {place}: {first}{also}"
        )))
    }
}

/// `answer` without surrounding whitespace and one code fence around it.
fn unfenced(answer: &str) -> &str {
    let text = answer.trim();
    let Some(rest) = text.strip_prefix("```") else {
        return text;
    };
    let Some(body) = rest.strip_suffix("```") else {
        return text;
    };
    // The fence's info string (`json`) runs to the end of its line.
    match body.split_once('\n') {
        Some((info, inner)) if !info.trim_start().starts_with(['{', '[']) => inner.trim(),
        _ => body.trim(),
    }
}

/// `text` on one line (line breaks and runs of whitespace made one space),
/// cut to [`MAX_MESSAGE_CHARS`] characters with `…` when longer.
fn one_line(text: &str) -> String {
    let flat = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if flat.chars().count() <= MAX_MESSAGE_CHARS {
        return flat;
    }
    let mut cut: String = flat.chars().take(MAX_MESSAGE_CHARS - 1).collect();
    cut.push('…');
    cut
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn topics() -> OutputSchema {
        OutputSchema::compile(&json!({
            "type": "object",
            "properties": {
                "topics": { "type": "array", "items": { "type": "string" }, "maxItems": 3 },
                "done": { "type": "boolean" }
            },
            "required": ["topics"],
            "additionalProperties": false
        }))
        .unwrap()
    }

    #[test]
    fn answers_are_parsed_through_whitespace_and_one_fence() {
        let s = topics();
        for answer in [
            "{\"topics\": [\"a\"]}",
            "  \n{\"topics\": [\"a\"]}\n\n",
            "```json\n{\"topics\": [\"a\"]}\n```",
            "```\n{\"topics\": [\"a\"]}\n```",
            "```{\"topics\": [\"a\"]}```",
            "\n```JSON  \n{\"topics\": [\"a\"]}\n```\n",
        ] {
            assert_eq!(s.check(answer), Ok(json!({"topics": ["a"]})), "{answer:?}");
        }
        // Two fences, or text around the fence: not JSON.
        assert!(s.check("Here it is:\n```json\n{\"topics\": []}\n```").is_err());
        assert!(s.check("```json\n```json\n{}\n```\n```").is_err());
    }

    #[test]
    fn errors_say_what_and_where_in_one_bounded_line() {
        let s = topics();
        let e = s.check("{\"topics\": [\"a\", 7]}").unwrap_err();
        assert!(e.contains("at /topics/1") && e.contains("string"), "{e}");
        let e = s.check("{\"done\": true}").unwrap_err();
        assert!(e.contains("the answer:") && e.contains("topics"), "{e}");
        let e = s.check("{\"topics\": [1, 2], \"extra\": 1}").unwrap_err();
        assert!(e.contains("more problem"), "{e}");
        let e = s.check("Sure! Here are the topics: GPUs, TPUs").unwrap_err();
        assert!(e.starts_with("the answer is not JSON:"), "{e}");
        let long = format!("{{\"topics\": [\"{}\", 1]}}\n\n", "x".repeat(5_000));
        for e in [s.check(&long).unwrap_err(), s.check(&"[".repeat(10_000)).unwrap_err()] {
            assert!(e.chars().count() <= MAX_MESSAGE_CHARS && !e.contains('\n'), "{e}");
        }
    }

    #[test]
    fn bad_schemas_are_refused_with_their_place() {
        let e = OutputSchema::compile_at(&json!({"properties": {"a": {"type": "strin"}}})).unwrap_err();
        assert_eq!(e.pointer, "/properties/a/type", "{e}");
        let e = OutputSchema::compile_at(&json!({"type": "object", "minProperties": -1})).unwrap_err();
        assert_eq!(e.pointer, "/minProperties", "{e}");
        assert!(OutputSchema::compile(&json!("object")).is_err());
        assert!(OutputSchema::compile(&json!({"pattern": "("})).is_err());
        // References resolve inside the schema only.
        assert!(OutputSchema::compile(&json!({"$ref": "https://example.org/s.json"})).is_err());
        assert!(OutputSchema::compile(&json!({"$defs": {"a": {"type": "integer"}}, "$ref": "#/$defs/a"})).is_ok());
        assert!(OutputSchema::compile(&json!(true)).is_ok());
    }
}
