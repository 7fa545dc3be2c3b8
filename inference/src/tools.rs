//! Tool calling: which tool-call format a model writes ([`ToolFormat::of`], from its
//! model type and chat template), and reading the calls back out of the text it
//! generated ([`ToolFormat::parse`]) as OpenAI's `tool_calls` want them.
//!
//! Pure: no model, no IO. The planner asks [`ToolFormat::of`] whether a model can call
//! tools; the engine asks it once when it loads a model.

use serde_json::{Map, Value};

/// A family's way of writing tool calls in its answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ToolFormat {
    /// Hermes, as Qwen2 and Qwen2.5 write it: each call a JSON object
    /// `{"name": …, "arguments": {…}}` between `<tool_call>` and `</tool_call>`.
    Hermes,
    /// Llama 3.x: the answer is a JSON object `{"name": …, "parameters": {…}}`
    /// (optionally after `<|python_tag|>`; several separated by `;`).
    Llama3Json,
    /// Mistral: `[TOOL_CALLS]` then a JSON list of `{"name": …, "arguments": {…}}`
    /// (or, from newer tokenizers, `[TOOL_CALLS]name[ARGS]{…}` per call).
    Mistral,
}

/// One call read from a model's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedCall {
    /// The function's name.
    pub name: String,
    /// Its arguments: a JSON object, as text.
    pub arguments: String,
}

/// A model's answer split into its text and its tool calls.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ParsedAnswer {
    /// The text outside the calls (the whole answer when it calls nothing).
    pub content: String,
    /// The calls, in order.
    pub calls: Vec<ParsedCall>,
}

/// Whether a Jinja template reads the variable `tools` inside one of its `{{ }}` or
/// `{% %}` blocks (a whole identifier: `custom_tools` or `tools_in_user_message` do
/// not count).
pub fn template_takes_tools(chat_template: &str) -> bool {
    let mut rest = chat_template;
    while let Some(open) = rest.find(['{']) {
        let after = &rest[open + 1..];
        let close = match after.chars().next() {
            Some('{') => "}}",
            Some('%') => "%}",
            _ => {
                rest = after;
                continue;
            }
        };
        let Some(end) = after.find(close) else {
            return false;
        };
        if has_identifier(&after[1..end], "tools") {
            return true;
        }
        rest = &after[end + close.len()..];
    }
    false
}

/// Whether `code` holds `name` as a whole identifier.
fn has_identifier(code: &str, name: &str) -> bool {
    let is_ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    code.match_indices(name).any(|(at, _)| {
        let before = code[..at].chars().next_back();
        let after = code[at + name.len()..].chars().next();
        !before.is_some_and(is_ident) && !after.is_some_and(is_ident)
    })
}

impl ToolFormat {
    /// The format a model writes tool calls in, from its `model_type` (`config.json`'s,
    /// or a GGUF file's `general.architecture`) and its chat template; `None` when it
    /// cannot call tools: its template takes no `tools`, or neither the template's
    /// markers nor the model type name a known format.
    ///
    /// The template decides first (a template that writes `<tool_call>` or
    /// `[TOOL_CALLS]`, or a Llama 3 template that asks for `"parameters"`), then the
    /// model type: `qwen2`, `qwen2_moe`, `qwen3`, `qwen3_moe` → Hermes; `llama` →
    /// Llama 3 JSON; `mistral`, `mixtral` → Mistral.
    pub fn of(model_type: &str, chat_template: &str) -> Option<ToolFormat> {
        if !template_takes_tools(chat_template) {
            return None;
        }
        if chat_template.contains("<tool_call>") {
            return Some(ToolFormat::Hermes);
        }
        if chat_template.contains("[TOOL_CALLS]") {
            return Some(ToolFormat::Mistral);
        }
        if chat_template.contains("<|start_header_id|>") && chat_template.contains("\"parameters\"") {
            return Some(ToolFormat::Llama3Json);
        }
        match model_type.to_ascii_lowercase().as_str() {
            "qwen2" | "qwen2_moe" | "qwen3" | "qwen3_moe" => Some(ToolFormat::Hermes),
            "llama" => Some(ToolFormat::Llama3Json),
            "mistral" | "mixtral" => Some(ToolFormat::Mistral),
            _ => None,
        }
    }

    /// The format's name, as vLLM's `--tool-call-parser` spells it.
    pub fn name(self) -> &'static str {
        match self {
            ToolFormat::Hermes => "hermes",
            ToolFormat::Llama3Json => "llama3_json",
            ToolFormat::Mistral => "mistral",
        }
    }

    /// Splits an answer into its text and its calls. An answer whose call markup does
    /// not parse (a call cut short by `max_tokens`, arguments that are not a JSON
    /// object) is all text, with no calls: what the model wrote is never lost.
    pub fn parse(self, text: &str) -> ParsedAnswer {
        let parsed = match self {
            ToolFormat::Hermes => parse_hermes(text),
            ToolFormat::Llama3Json => parse_llama3(text),
            ToolFormat::Mistral => parse_mistral(text),
        };
        parsed.unwrap_or_else(|| ParsedAnswer {
            content: text.to_owned(),
            calls: Vec::new(),
        })
    }
}

/// A call from a JSON object with `name` and an object of arguments under one of
/// `keys`.
fn call_of(value: &Value, keys: &[&str]) -> Option<ParsedCall> {
    let object = value.as_object()?;
    let name = object.get("name")?.as_str()?;
    let arguments = keys
        .iter()
        .find_map(|key| object.get(*key))
        .cloned()
        .unwrap_or_else(|| Value::Object(Map::new()));
    let arguments = match arguments {
        // Some models write the arguments as JSON text.
        Value::String(text) => serde_json::from_str::<Value>(&text).ok()?,
        other => other,
    };
    if !arguments.is_object() || name.is_empty() {
        return None;
    }
    Some(ParsedCall {
        name: name.to_owned(),
        arguments: arguments.to_string(),
    })
}

fn parse_hermes(text: &str) -> Option<ParsedAnswer> {
    const OPEN: &str = "<tool_call>";
    const CLOSE: &str = "</tool_call>";
    let first = text.find(OPEN)?;
    let mut content = text[..first].to_owned();
    let mut calls = Vec::new();
    let mut rest = &text[first..];
    while let Some(open) = rest.find(OPEN) {
        content.push_str(&rest[..open]);
        let body = &rest[open + OPEN.len()..];
        // The last call may end at the end-of-sequence token, without its closing tag.
        let (json, next) = match body.find(CLOSE) {
            Some(close) => (&body[..close], &body[close + CLOSE.len()..]),
            None => (body, ""),
        };
        calls.push(call_of(
            &serde_json::from_str(json.trim()).ok()?,
            &["arguments", "parameters"],
        )?);
        rest = next;
    }
    content.push_str(rest);
    Some(ParsedAnswer {
        content: content.trim().to_owned(),
        calls,
    })
}

fn parse_llama3(text: &str) -> Option<ParsedAnswer> {
    let trimmed = text.trim();
    let body = trimmed.strip_prefix("<|python_tag|>").unwrap_or(trimmed).trim_start();
    if !body.starts_with('{') {
        return None;
    }
    let mut calls = Vec::new();
    let mut rest = body;
    while !rest.is_empty() {
        let mut stream = serde_json::Deserializer::from_str(rest).into_iter::<Value>();
        let value = stream.next()?.ok()?;
        calls.push(call_of(&value, &["parameters", "arguments"])?);
        rest = rest[stream.byte_offset()..].trim_start();
        rest = rest.strip_prefix(';').unwrap_or(rest).trim_start();
    }
    Some(ParsedAnswer {
        content: String::new(),
        calls,
    })
}

fn parse_mistral(text: &str) -> Option<ParsedAnswer> {
    const MARKER: &str = "[TOOL_CALLS]";
    let at = text.find(MARKER)?;
    let content = text[..at].trim().to_owned();
    let mut calls = Vec::new();
    for part in text[at..].split(MARKER).map(str::trim).filter(|part| !part.is_empty()) {
        if part.starts_with('[') {
            // `[{"name": …, "arguments": {…}}, …]`
            let mut stream = serde_json::Deserializer::from_str(part).into_iter::<Value>();
            let list = stream.next()?.ok()?;
            for value in list.as_array()? {
                calls.push(call_of(value, &["arguments", "parameters"])?);
            }
        } else {
            // `name[ARGS]{…}` or `name[CALL_ID]id[ARGS]{…}`
            let (head, arguments) = part.split_once("[ARGS]")?;
            let name = head.split("[CALL_ID]").next()?.trim();
            let mut stream = serde_json::Deserializer::from_str(arguments.trim()).into_iter::<Value>();
            let arguments = stream.next()?.ok()?;
            let value = serde_json::json!({ "name": name, "arguments": arguments });
            calls.push(call_of(&value, &["arguments"])?);
        }
    }
    (!calls.is_empty()).then_some(ParsedAnswer { content, calls })
}

/// The id of call `index` of completion `completion_id`: 9 letters and digits (what
/// Mistral's templates demand of ids they are given back), the same for the same
/// completion and index.
pub fn call_id(completion_id: &str, index: usize) -> String {
    // FNV-1a over the completion id and the index.
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in completion_id.bytes().chain(index.to_le_bytes()) {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    const DIGITS: &[u8; 62] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
    (0..9)
        .map(|_| {
            let digit = DIGITS[(hash % 62) as usize];
            hash /= 62;
            char::from(digit)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tools_are_found_only_in_template_code() {
        assert!(template_takes_tools("{% if tools %}x{% endif %}"));
        assert!(template_takes_tools("{{- tools | tojson }}"));
        assert!(!template_takes_tools("tools are mentioned in text only"));
        assert!(!template_takes_tools(
            "{% if custom_tools %}{{ tools_in_user_message }}{% endif %}"
        ));
        assert!(!template_takes_tools("{{ unclosed tools"));
    }

    #[test]
    fn call_ids_are_nine_letters_and_digits_and_differ_by_index() {
        let a = call_id("chatcmpl-1", 0);
        assert_eq!(a.len(), 9);
        assert!(a.chars().all(|c| c.is_ascii_alphanumeric()));
        assert_eq!(a, call_id("chatcmpl-1", 0));
        assert_ne!(a, call_id("chatcmpl-1", 1));
        assert_ne!(a, call_id("chatcmpl-2", 0));
    }
}
