//! An Anthropic Messages request as the OpenAI request the engines take. Pure.
//!
//! - `system` (a string or text blocks) is the first, system message.
//! - A user message's `tool_result` blocks become `tool` messages (first, since OpenAI
//!   wants them right after the assistant's calls), its text blocks one user message.
//! - An assistant message's text blocks are its content, its `tool_use` blocks its
//!   `tool_calls` (the input as JSON text).
//! - `tools` become functions (`input_schema` is their `parameters`); `tool_choice`
//!   `auto`, `any`, `tool` and `none` become `auto`, `required`, the named function and
//!   `none`; `disable_parallel_tool_use` becomes `parallel_tool_calls: false`.

use axum::http::StatusCode;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::api::error::ApiError;
use crate::session::{Prompt, Sampling};

/// The most tools one request may offer.
const MAX_TOOLS: usize = 128;

/// `POST /v1/messages`: the fields Skein honours; others are ignored.
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
pub(crate) struct MessagesRequest {
    /// An agent of your newest run that has it, or a Hugging Face model (`owner/name`).
    pub(crate) model: String,
    /// The conversation: `user` and `assistant` messages, alternating.
    pub(crate) messages: Vec<AnthropicMessage>,
    /// Instructions: a string or text blocks.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub(crate) system: Option<Value>,
    /// The most tokens to generate (required, as by Anthropic).
    #[serde(default)]
    #[schema(minimum = 1)]
    pub(crate) max_tokens: Option<u64>,
    /// 0 to 1 in Anthropic's clients (up to 2 is taken).
    #[serde(default)]
    pub(crate) temperature: Option<f64>,
    /// Nucleus sampling, in (0, 1].
    #[serde(default)]
    pub(crate) top_p: Option<f64>,
    /// Strings that end the answer.
    #[serde(default)]
    pub(crate) stop_sequences: Option<Vec<String>>,
    /// Tools the model may call: `name`, `description`, `input_schema`.
    #[serde(default)]
    #[schema(value_type = Option<Vec<Object>>)]
    pub(crate) tools: Option<Vec<Value>>,
    /// `{"type": "auto" | "any" | "none"}` or `{"type": "tool", "name": …}`.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub(crate) tool_choice: Option<Value>,
    /// Anthropic's server-sent events instead of one JSON body.
    #[serde(default)]
    pub(crate) stream: bool,
}

/// One message.
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
pub(crate) struct AnthropicMessage {
    /// `user` or `assistant`.
    pub(crate) role: String,
    /// A string, or blocks: `text`, `tool_use` (assistant), `tool_result` (user).
    #[schema(value_type = Object)]
    pub(crate) content: Value,
}

/// 400 naming `field`.
fn bad(field: &str, what: &str) -> ApiError {
    ApiError::new(StatusCode::BAD_REQUEST, format!("`{field}` {what}"))
}

/// The string at `key` of `block`, or 400 naming `field.key`.
fn string<'a>(block: &'a Value, field: &str, key: &str) -> Result<&'a str, ApiError> {
    block
        .get(key)
        .and_then(Value::as_str)
        .ok_or_else(|| bad(&format!("{field}.{key}"), "is missing or not a string"))
}

/// The text of `content` (a string, or text blocks), at `field`.
fn text(content: &Value, field: &str) -> Result<String, ApiError> {
    match content {
        Value::String(text) => Ok(text.clone()),
        Value::Array(blocks) => {
            let mut text = String::new();
            for (i, block) in blocks.iter().enumerate() {
                let at = format!("{field}[{i}]");
                match block.get("type").and_then(Value::as_str) {
                    Some("text") => text.push_str(string(block, &at, "text")?),
                    Some(other) => {
                        return Err(bad(
                            &format!("{at}.type"),
                            &format!("is `{other}`; only text is taken here"),
                        ));
                    }
                    None => return Err(bad(&format!("{at}.type"), "is missing")),
                }
            }
            Ok(text)
        }
        Value::Null => Ok(String::new()),
        _ => Err(bad(field, "must be a string or a list of blocks")),
    }
}

/// The OpenAI messages of Anthropic message `index`.
fn message(index: usize, m: &AnthropicMessage, out: &mut Vec<Value>) -> Result<(), ApiError> {
    let field = format!("messages[{index}].content");
    let blocks = match &m.content {
        Value::String(text) => vec![json!({"type": "text", "text": text})],
        Value::Array(blocks) => blocks.clone(),
        _ => return Err(bad(&field, "must be a string or a list of blocks")),
    };
    let mut content = String::new();
    let mut calls = Vec::new();
    let mut results = Vec::new();
    for (i, block) in blocks.iter().enumerate() {
        let at = format!("{field}[{i}]");
        match (m.role.as_str(), block.get("type").and_then(Value::as_str)) {
            (_, Some("text")) => content.push_str(string(block, &at, "text")?),
            ("assistant", Some("tool_use")) => {
                let input = block.get("input").cloned().unwrap_or_else(|| json!({}));
                if !input.is_object() {
                    return Err(bad(&format!("{at}.input"), "must be an object"));
                }
                calls.push(json!({
                    "id": string(block, &at, "id")?,
                    "type": "function",
                    "function": {"name": string(block, &at, "name")?, "arguments": input.to_string()},
                }));
            }
            ("user", Some("tool_result")) => {
                let id = string(block, &at, "tool_use_id")?;
                let mut result = text(block.get("content").unwrap_or(&Value::Null), &format!("{at}.content"))?;
                if block.get("is_error").and_then(Value::as_bool) == Some(true) {
                    result = format!("error: {result}");
                }
                results.push(json!({"role": "tool", "tool_call_id": id, "content": result}));
            }
            (role, Some(kind)) => {
                return Err(bad(
                    &format!("{at}.type"),
                    &format!(
                        "is `{kind}` in a `{role}` message; take text, tool_use (assistant) and tool_result (user) blocks"
                    ),
                ));
            }
            (_, None) => return Err(bad(&format!("{at}.type"), "is missing")),
        }
    }
    match m.role.as_str() {
        "user" => {
            let only_results = !results.is_empty() && content.is_empty();
            out.extend(results);
            if !only_results {
                out.push(json!({"role": "user", "content": content}));
            }
        }
        "assistant" if calls.is_empty() => out.push(json!({"role": "assistant", "content": content})),
        "assistant" => {
            let content = (!content.is_empty()).then_some(content);
            out.push(json!({"role": "assistant", "content": content, "tool_calls": calls}));
        }
        other => {
            return Err(bad(
                &format!("messages[{index}].role"),
                &format!("is `{other}`; give user or assistant (instructions go in `system`)"),
            ));
        }
    }
    Ok(())
}

/// Anthropic's tools as OpenAI's functions.
fn tools(tools: &[Value]) -> Result<Vec<Value>, ApiError> {
    if tools.len() > MAX_TOOLS {
        return Err(bad(
            "tools",
            &format!("has {} tools; at most {MAX_TOOLS} are taken", tools.len()),
        ));
    }
    tools
        .iter()
        .enumerate()
        .map(|(i, tool)| {
            let at = format!("tools[{i}]");
            let name = string(tool, &at, "name")?;
            let schema = tool
                .get("input_schema")
                .cloned()
                .unwrap_or_else(|| json!({"type": "object"}));
            if !schema.is_object() {
                return Err(bad(&format!("{at}.input_schema"), "must be a JSON schema object"));
            }
            let mut function = json!({"name": name, "parameters": schema});
            if let Some(description) = tool.get("description").and_then(Value::as_str) {
                function["description"] = json!(description);
            }
            Ok(json!({"type": "function", "function": function}))
        })
        .collect()
}

/// Anthropic's `tool_choice` as OpenAI's, and whether parallel calls are refused.
fn tool_choice(choice: &Value) -> Result<(Value, bool), ApiError> {
    let parallel_off = choice.get("disable_parallel_tool_use").and_then(Value::as_bool) == Some(true);
    let openai = match choice.get("type").and_then(Value::as_str) {
        Some("auto") => json!("auto"),
        Some("any") => json!("required"),
        Some("none") => json!("none"),
        Some("tool") => json!({"type": "function", "function": {"name": string(choice, "tool_choice", "name")?}}),
        _ => return Err(bad("tool_choice.type", "must be auto, any, tool or none")),
    };
    Ok((openai, parallel_off))
}

/// The request as the OpenAI prompt and sampling the engines take.
///
/// Errors: 400 naming the field that is missing or wrong.
pub(crate) fn to_openai(request: MessagesRequest) -> Result<(Prompt, Sampling), ApiError> {
    let max_tokens = match request.max_tokens {
        Some(0) | None => {
            return Err(bad(
                "max_tokens",
                "is required: the most tokens to generate, at least 1",
            ));
        }
        Some(n) => u32::try_from(n).unwrap_or(u32::MAX),
    };
    if request.messages.is_empty() {
        return Err(bad("messages", "is empty; give at least one user message"));
    }
    let mut messages = Vec::new();
    if let Some(system) = &request.system {
        let system = text(system, "system")?;
        if !system.is_empty() {
            messages.push(json!({"role": "system", "content": system}));
        }
    }
    for (index, m) in request.messages.iter().enumerate() {
        message(index, m, &mut messages)?;
    }
    let mut fields = serde_json::Map::new();
    if let Some(offered) = &request.tools {
        fields.insert("tools".to_owned(), Value::Array(tools(offered)?));
    }
    if let Some(choice) = &request.tool_choice {
        let (choice, parallel_off) = tool_choice(choice)?;
        fields.insert("tool_choice".to_owned(), choice);
        if parallel_off {
            fields.insert("parallel_tool_calls".to_owned(), json!(false));
        }
    }
    let sampling = Sampling {
        temperature: request.temperature,
        max_tokens: Some(max_tokens),
        top_p: request.top_p,
        seed: None,
        stop: request
            .stop_sequences
            .unwrap_or_default()
            .into_iter()
            .filter(|s| !s.is_empty())
            .collect(),
    };
    Ok((Prompt { messages, fields }, sampling))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(body: Value) -> Result<(Prompt, Sampling), ApiError> {
        to_openai(serde_json::from_value(body).unwrap())
    }

    #[test]
    fn a_tool_round_trip_becomes_openai_messages() {
        let (prompt, sampling) = request(json!({
            "model": "m", "max_tokens": 64, "system": [{"type": "text", "text": "Be brief."}],
            "stop_sequences": ["END"],
            "tools": [{"name": "add", "description": "Adds", "input_schema": {"type": "object"}}],
            "tool_choice": {"type": "any", "disable_parallel_tool_use": true},
            "messages": [
                {"role": "user", "content": "2+3?"},
                {"role": "assistant", "content": [
                    {"type": "text", "text": "Let me add."},
                    {"type": "tool_use", "id": "t1", "name": "add", "input": {"a": 2, "b": 3}}]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text", "text": "5"}]},
                    {"type": "text", "text": "and?"}]},
            ],
        }))
        .unwrap();
        assert_eq!(
            Value::Array(prompt.messages),
            json!([
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "2+3?"},
                {"role": "assistant", "content": "Let me add.", "tool_calls": [
                    {"id": "t1", "type": "function", "function": {"name": "add", "arguments": "{\"a\":2,\"b\":3}"}}]},
                {"role": "tool", "tool_call_id": "t1", "content": "5"},
                {"role": "user", "content": "and?"},
            ])
        );
        assert_eq!(
            prompt.fields["tools"],
            json!([{"type": "function", "function": {"name": "add", "description": "Adds", "parameters": {"type": "object"}}}])
        );
        assert_eq!(prompt.fields["tool_choice"], "required");
        assert_eq!(prompt.fields["parallel_tool_calls"], false);
        assert_eq!(sampling.max_tokens, Some(64));
        assert_eq!(sampling.stop, ["END"]);
    }

    #[test]
    fn bad_requests_name_the_field() {
        let message = |body: Value| request(body).unwrap_err().message;
        let user = json!([{"role": "user", "content": "hi"}]);
        assert!(message(json!({"model": "m", "messages": user})).contains("`max_tokens` is required"));
        assert!(
            message(
                json!({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "image"}]}]})
            )
            .contains("`messages[0].content[0].type` is `image`")
        );
        assert!(
            message(json!({"model": "m", "max_tokens": 5, "messages": user, "tools": [{"description": "x"}]}))
                .contains("`tools[0].name`")
        );
        assert!(
            message(json!({"model": "m", "max_tokens": 5, "messages": user, "tool_choice": {"type": "tool"}}))
                .contains("`tool_choice.name`")
        );
        assert!(
            message(json!({"model": "m", "max_tokens": 5, "messages": [{"role": "system", "content": "x"}]}))
                .contains("`messages[0].role`")
        );
    }
}
