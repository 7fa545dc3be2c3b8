//! Constrained sampling for `response_format`: a JSON Schema (or any JSON object)
//! compiled by `llguidance` into a matcher over the model's own tokens, whose mask of
//! allowed tokens is applied to the logits before each token is sampled.
//!
//! The token trie is built once per engine, on the first constrained request, from the
//! bytes of every token of the tokenizer (ids the model has beyond the tokenizer are
//! never allowed).

use std::collections::BTreeSet;
use std::sync::Arc;

use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{ApproximateTokEnv, TokEnv, TokRxInfo, TokTrie};
use llguidance::{Matcher, ParserFactory};
use serde_json::{Value, json};
use tokenizers::Tokenizer;

use crate::Error;
use crate::tools::ToolFormat;

/// What the answer must be, from a request's `response_format`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum ResponseFormat {
    /// Free text (`{"type": "text"}`, or no `response_format`).
    #[default]
    Text,
    /// Any JSON object (`{"type": "json_object"}`).
    JsonObject,
    /// JSON valid against a schema
    /// (`{"type": "json_schema", "json_schema": {"schema": {…}}}`).
    JsonSchema(Value),
}

impl ResponseFormat {
    /// Reads a request's `response_format`.
    ///
    /// Errors: a message for the client when it is not one of the three shapes.
    pub fn from_request(value: &Value) -> Result<ResponseFormat, String> {
        match value.get("type").and_then(Value::as_str) {
            Some("text") => Ok(ResponseFormat::Text),
            Some("json_object") => Ok(ResponseFormat::JsonObject),
            Some("json_schema") => {
                let schema = value
                    .get("json_schema")
                    .and_then(|wrapper| wrapper.get("schema"))
                    .ok_or("`response_format.json_schema.schema` is missing")?;
                if !(schema.is_object() || schema.is_boolean()) {
                    return Err("`response_format.json_schema.schema` must be a JSON Schema (an object)".to_owned());
                }
                Ok(ResponseFormat::JsonSchema(schema.clone()))
            }
            Some(other) => Err(format!(
                "`response_format.type` is `{other}`; expected `text`, `json_object` or `json_schema`"
            )),
            None => Err("`response_format` needs a `type`".to_owned()),
        }
    }

    /// The schema the answer must satisfy, with our compile options: compact JSON (no
    /// whitespace between tokens, so that a model cannot pad forever), and keywords
    /// `llguidance` cannot enforce ignored rather than refused (the orchestrator
    /// validates answers against the whole schema).
    fn schema(&self) -> Option<Value> {
        let mut schema = match self {
            ResponseFormat::Text => return None,
            ResponseFormat::JsonObject => json!({ "type": "object" }),
            ResponseFormat::JsonSchema(Value::Bool(true)) => json!({}),
            ResponseFormat::JsonSchema(schema) => schema.clone(),
        };
        if let Some(object) = schema.as_object_mut() {
            object.insert(
                "x-guidance".to_owned(),
                json!({ "whitespace_flexible": false, "lenient": true }),
            );
        }
        Some(schema)
    }
}

/// The grammar compiler of one engine's vocabulary.
pub(crate) struct Grammars {
    factory: Arc<ParserFactory>,
}

impl Grammars {
    /// Builds the token trie of `tokenizer` for a model with `vocab_size` logits
    /// (`eos`: the tokens that end a completion).
    ///
    /// Errors: [`Error::Grammar`] when the tokenizer's kind is not one `llguidance`
    /// reads (byte-level BPE or byte-fallback).
    pub fn new(tokenizer: &Tokenizer, vocab_size: usize, eos: &BTreeSet<u32>) -> Result<Grammars, Error> {
        let unusable = |reason: String| Error::Grammar {
            reason: format!("this model's tokenizer cannot be constrained: {reason}"),
        };
        let text = tokenizer.to_string(false).map_err(|e| unusable(e.to_string()))?;
        let json: Value = serde_json::from_str(&text).map_err(|e| unusable(e.to_string()))?;
        let mut words = llguidance::token_bytes_from_tokenizer_json(&json).map_err(|e| unusable(e.to_string()))?;
        let size = vocab_size.max(words.len());
        words.resize(size, Vec::new());
        let eos: Vec<u32> = eos.iter().copied().collect();
        let first_eos = eos
            .first()
            .copied()
            .ok_or_else(|| unusable("no end-of-sequence token".to_owned()))?;
        let count = u32::try_from(size).map_err(|e| unusable(e.to_string()))?;
        let trie = TokTrie::from(&TokRxInfo::new(count, first_eos), &words).with_eos_tokens(&eos);
        let env: TokEnv = Arc::new(ApproximateTokEnv::new(trie));
        let mut factory = ParserFactory::new_simple(&env).map_err(|e| unusable(e.to_string()))?;
        factory.quiet();
        Ok(Grammars {
            factory: Arc::new(factory),
        })
    }

    /// A fresh matcher that lets the model write exactly one call, in `format`, of one
    /// of `tools` (OpenAI's definitions) with arguments valid against its
    /// `parameters`: what `tool_choice: "required"` (or a named function) asks for.
    ///
    /// Errors: [`Error::Grammar`] when a tool's parameters schema does not compile.
    pub fn call_matcher(&self, format: ToolFormat, tools: &[Value]) -> Result<Matcher, Error> {
        self.compile(TopLevelGrammar::from_lark(call_grammar(format, tools)))
    }

    fn compile(&self, grammar: TopLevelGrammar) -> Result<Matcher, Error> {
        let parser = self.factory.create_parser(grammar).map_err(|e| Error::Grammar {
            reason: format!("the response format's schema cannot be used: {e}"),
        })?;
        Ok(Matcher::new(Ok(parser)))
    }

    /// A fresh matcher for `format` (`None` for free text).
    ///
    /// Errors: [`Error::Grammar`] when the schema does not compile.
    pub fn matcher(&self, format: &ResponseFormat) -> Result<Option<Matcher>, Error> {
        let Some(schema) = format.schema() else {
            return Ok(None);
        };
        self.compile(TopLevelGrammar::from_json_schema(schema)).map(Some)
    }
}

/// The Lark grammar (llguidance's dialect) of one call of one of `tools` in `format`:
/// the format's markup around a JSON object whose schema is a choice of one object
/// per tool (its name as a constant, its parameters schema for the arguments).
pub(crate) fn call_grammar(format: ToolFormat, tools: &[Value]) -> String {
    let key = match format {
        ToolFormat::Llama3Json => "parameters",
        ToolFormat::Hermes | ToolFormat::Mistral => "arguments",
    };
    let choices: Vec<Value> = tools
        .iter()
        .filter_map(|tool| {
            let function = tool.get("function")?;
            let name = function.get("name")?.as_str()?;
            let parameters = function
                .get("parameters")
                .cloned()
                .unwrap_or_else(|| json!({ "type": "object" }));
            Some(json!({
                "type": "object",
                "properties": { "name": { "const": name }, key: parameters },
                "required": ["name", key],
                "additionalProperties": false,
            }))
        })
        .collect();
    let schema = json!({
        "anyOf": choices,
        "x-guidance": { "whitespace_flexible": false, "lenient": true },
    });
    let markup = match format {
        ToolFormat::Hermes => r#""<tool_call>\n" call "\n</tool_call>""#,
        ToolFormat::Llama3Json => "call",
        ToolFormat::Mistral => r#""[TOOL_CALLS][" call "]""#,
    };
    format!("start: {markup}\ncall: %json {schema}\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn response_formats_are_read_from_their_three_shapes() {
        assert_eq!(
            ResponseFormat::from_request(&json!({"type": "text"})),
            Ok(ResponseFormat::Text)
        );
        assert_eq!(
            ResponseFormat::from_request(&json!({"type": "json_object"})),
            Ok(ResponseFormat::JsonObject)
        );
        assert_eq!(
            ResponseFormat::from_request(
                &json!({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "integer"}}})
            ),
            Ok(ResponseFormat::JsonSchema(json!({"type": "integer"})))
        );
        assert!(ResponseFormat::from_request(&json!({"type": "json_schema", "json_schema": {}})).is_err());
        assert!(ResponseFormat::from_request(&json!({"type": "yaml"})).is_err());
        assert!(ResponseFormat::from_request(&json!({})).is_err());
    }
}
