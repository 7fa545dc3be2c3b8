//! The OpenAI chat-completions and embeddings wire format every engine speaks, and the
//! orchestrator's OpenAI-compatible routes too: the request as clients send it, and the
//! response, stream chunk and error bodies as clients expect them.

//!
//! With the `openapi` feature the types also describe themselves for OpenAPI documents
//! (utoipa).

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// `POST /v1/chat/completions`: the fields Skein honours; others are ignored.
#[derive(Debug, Clone, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ChatCompletionRequest {
    /// The served model name.
    pub model: String,
    /// The conversation.
    pub messages: Vec<ChatMessage>,
    /// Server-sent events instead of one JSON body.
    #[serde(default)]
    pub stream: bool,
    /// `include_usage` adds a usage chunk before `[DONE]`.
    #[serde(default)]
    pub stream_options: Option<StreamOptions>,
    /// The most tokens to generate.
    #[cfg_attr(feature = "openapi", schema(minimum = 1))]
    pub max_tokens: Option<usize>,
    /// The newer name of `max_tokens`; wins when both are set.
    #[cfg_attr(feature = "openapi", schema(minimum = 1))]
    pub max_completion_tokens: Option<usize>,
    /// 0 to 2; 0 is greedy.
    #[cfg_attr(feature = "openapi", schema(minimum = 0.0, maximum = 2.0))]
    pub temperature: Option<f64>,
    /// Nucleus sampling, in (0, 1].
    #[cfg_attr(feature = "openapi", schema(exclusive_minimum = 0.0, maximum = 1.0))]
    pub top_p: Option<f64>,
    /// Overrides the server's seed.
    pub seed: Option<u64>,
    /// One stop string or several.
    pub stop: Option<Stop>,
    /// The tools the model may call (OpenAI's `{"type": "function", "function": {…}}`),
    /// passed to the engine as given.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Vec<Object>>))]
    pub tools: Option<Vec<Value>>,
    /// `none`, `auto`, `required` or `{"type": "function", "function": {"name": …}}`,
    /// passed to the engine as given.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Object>))]
    pub tool_choice: Option<Value>,
    /// Whether the model may ask for several calls in one answer.
    #[serde(default)]
    pub parallel_tool_calls: Option<bool>,
    /// `{"type": "json_object"}` or `{"type": "json_schema", "json_schema": {…}}`,
    /// passed to the engine as given.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Object>))]
    pub response_format: Option<Value>,
}

/// `stream_options`.
#[derive(Debug, Clone, Default, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct StreamOptions {
    /// Send a last chunk with `usage`.
    #[serde(default)]
    pub include_usage: bool,
}

/// `stop`: a string or a list.
#[derive(Debug, Clone, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(untagged)]
pub enum Stop {
    /// One stop string.
    One(String),
    /// Several.
    Many(Vec<String>),
}

impl Stop {
    /// The stop strings, empty ones dropped.
    pub fn into_vec(self) -> Vec<String> {
        let all = match self {
            Stop::One(one) => vec![one],
            Stop::Many(many) => many,
        };
        all.into_iter().filter(|stop| !stop.is_empty()).collect()
    }
}

/// A message: `content` is a string, a list of parts (whose text parts are joined), or
/// null (an assistant turn that only called tools).
#[derive(Debug, Clone, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ChatMessage {
    /// `system`, `user`, `assistant` or `tool`.
    pub role: String,
    /// The content.
    #[serde(default)]
    pub content: Option<Content>,
    /// The calls an assistant message asked for.
    #[serde(default)]
    pub tool_calls: Option<Vec<ToolCall>>,
    /// The call a `tool` message answers.
    #[serde(default)]
    pub tool_call_id: Option<String>,
}

/// A tool call, as an assistant message carries it (`ChatToolCall` in OpenAPI
/// documents, apart from other tool calls there).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "openapi", schema(as = ChatToolCall))]
pub struct ToolCall {
    /// The call's id, which the tool message with its result names.
    pub id: String,
    /// Always `function`.
    #[serde(rename = "type", default = "function_kind")]
    pub kind: String,
    /// The function and its arguments.
    pub function: FunctionCall,
}

fn function_kind() -> String {
    "function".to_owned()
}

impl ToolCall {
    /// A call of function `name` with `arguments` (JSON text).
    pub fn new(id: impl Into<String>, name: impl Into<String>, arguments: impl Into<String>) -> ToolCall {
        ToolCall {
            id: id.into(),
            kind: function_kind(),
            function: FunctionCall {
                name: name.into(),
                arguments: arguments.into(),
            },
        }
    }
}

/// The function a tool call names.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct FunctionCall {
    /// The function's name.
    pub name: String,
    /// Its arguments: JSON text, as the model wrote it.
    #[serde(default)]
    pub arguments: String,
}

/// A message's content.
#[derive(Debug, Clone, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(untagged)]
pub enum Content {
    /// Plain text.
    Text(String),
    /// Content parts; only `{"type": "text", "text": …}` parts are understood.
    Parts(Vec<ContentPart>),
}

/// One content part.
#[derive(Debug, Clone, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ContentPart {
    /// `text`, `image_url`, …
    #[serde(rename = "type")]
    pub kind: String,
    /// The text of a text part.
    #[serde(default)]
    pub text: Option<String>,
}

impl Content {
    /// The text, or the name of the first part kind the engine cannot take.
    pub fn text(self) -> Result<String, String> {
        match self {
            Content::Text(text) => Ok(text),
            Content::Parts(parts) => {
                let mut text = String::new();
                for part in parts {
                    match (part.kind.as_str(), part.text) {
                        ("text", Some(part)) => text.push_str(&part),
                        (kind, _) => return Err(kind.to_owned()),
                    }
                }
                Ok(text)
            }
        }
    }
}

/// Token counts of a completion.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Usage {
    /// Tokens of the rendered prompt.
    pub prompt_tokens: usize,
    /// Tokens generated.
    pub completion_tokens: usize,
    /// Their sum.
    pub total_tokens: usize,
}

/// What every response and chunk of one completion shares.
#[derive(Debug, Clone)]
pub struct ResponseMeta {
    /// `chatcmpl-…`.
    pub id: String,
    /// Unix seconds.
    pub created: u64,
    /// The served name.
    pub model: String,
}

/// The non-streaming response body.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ChatCompletion {
    /// `chatcmpl-…`.
    pub id: String,
    /// Always `chat.completion`.
    pub object: String,
    /// Unix seconds.
    pub created: u64,
    /// The served name.
    pub model: String,
    /// The one answer.
    pub choices: Vec<Choice>,
    /// Token counts, when the engine gave them.
    pub usage: Option<Usage>,
}

/// One answer of a completion.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Choice {
    /// Its place, from 0.
    pub index: u32,
    /// The assistant's message.
    pub message: AnswerMessage,
    /// `stop`, `length` or `tool_calls`.
    pub finish_reason: String,
}

/// The assistant's message of a completion.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct AnswerMessage {
    /// Always `assistant`.
    pub role: String,
    /// The text (null in an answer that only calls tools).
    pub content: Option<String>,
    /// The tools the model asked to call.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
}

/// The non-streaming response body.
pub fn response_body(meta: &ResponseMeta, text: &str, finish_reason: &str, usage: Option<Usage>) -> ChatCompletion {
    ChatCompletion {
        id: meta.id.clone(),
        object: "chat.completion".to_owned(),
        created: meta.created,
        model: meta.model.clone(),
        choices: vec![Choice {
            index: 0,
            message: AnswerMessage {
                role: "assistant".to_owned(),
                content: Some(text.to_owned()),
                tool_calls: Vec::new(),
            },
            finish_reason: finish_reason.to_owned(),
        }],
        usage,
    }
}

/// The non-streaming response body of an answer that may call tools: its content is
/// null when it only calls tools.
pub fn tool_response_body(
    meta: &ResponseMeta,
    text: &str,
    tool_calls: Vec<ToolCall>,
    finish_reason: &str,
    usage: Option<Usage>,
) -> ChatCompletion {
    let mut body = response_body(meta, text, finish_reason, usage);
    for choice in &mut body.choices {
        if text.is_empty() && !tool_calls.is_empty() {
            choice.message.content = None;
        }
        choice.message.tool_calls = tool_calls.clone();
    }
    body
}

/// A stream chunk's `delta` with a piece of tool call `index`: the first piece of a
/// call carries its id and name, the rest only pieces of its arguments.
pub fn tool_call_delta(index: usize, id: Option<&str>, name: Option<&str>, arguments: &str) -> Value {
    let mut call = json!({ "index": index, "function": { "arguments": arguments } });
    if let Some(id) = id {
        call["id"] = json!(id);
        call["type"] = json!("function");
    }
    if let Some(name) = name {
        call["function"]["name"] = json!(name);
    }
    json!({ "tool_calls": [call] })
}

/// `GET /v1/models`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ModelList {
    /// Always `list`.
    pub object: String,
    /// The models.
    pub data: Vec<ModelCard>,
}

impl ModelList {
    /// A list of `data`.
    pub fn new(data: Vec<ModelCard>) -> ModelList {
        ModelList {
            object: "list".to_owned(),
            data,
        }
    }
}

/// One model of `GET /v1/models`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ModelCard {
    /// The name to send as `model`.
    pub id: String,
    /// Always `model`.
    pub object: String,
    /// Unix seconds.
    pub created: i64,
    /// Who provides it.
    pub owned_by: String,
}

impl ModelCard {
    /// The card of `id`.
    pub fn new(id: impl Into<String>, created: i64, owned_by: impl Into<String>) -> ModelCard {
        ModelCard {
            id: id.into(),
            object: "model".to_owned(),
            created,
            owned_by: owned_by.into(),
        }
    }
}

/// A stream chunk with `delta` and `finish_reason`.
pub fn chunk_body(meta: &ResponseMeta, delta: Value, finish_reason: Option<&str>) -> Value {
    json!({
        "id": meta.id,
        "object": "chat.completion.chunk",
        "created": meta.created,
        "model": meta.model,
        "choices": [{ "index": 0, "delta": delta, "finish_reason": finish_reason }],
    })
}

/// The last chunk of a stream asked to include usage: no choices, only `usage`.
pub fn usage_chunk_body(meta: &ResponseMeta, usage: Usage) -> Value {
    json!({
        "id": meta.id,
        "object": "chat.completion.chunk",
        "created": meta.created,
        "model": meta.model,
        "choices": [],
        "usage": usage,
    })
}

/// An OpenAI error body.
pub fn error_body(message: &str, kind: &str, code: &str) -> Value {
    json!({ "error": { "message": message, "type": kind, "code": code } })
}

/// `POST /v1/embeddings`: the fields Skein honours; others are ignored.
#[derive(Debug, Clone, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct EmbeddingRequest {
    /// The served model name.
    pub model: String,
    /// What to embed: one text, several, or token ids (one list or several).
    pub input: EmbeddingInput,
    /// `float` (the default) or `base64` (little-endian f32s), passed to the engine.
    #[serde(default)]
    pub encoding_format: Option<EncodingFormat>,
    /// Fewer dimensions, for models trained to be cut (Matryoshka), passed to the engine.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(minimum = 1))]
    pub dimensions: Option<u32>,
    /// The end user, for the client's own records; not passed on.
    #[serde(default)]
    pub user: Option<String>,
}

/// The `input` of an embedding request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(untagged)]
pub enum EmbeddingInput {
    /// One text.
    Text(String),
    /// Several texts, one vector each.
    Texts(Vec<String>),
    /// One text as token ids.
    Tokens(Vec<u32>),
    /// Several texts as token ids.
    TokenLists(Vec<Vec<u32>>),
}

impl EmbeddingInput {
    /// How many vectors it asks for.
    pub fn count(&self) -> usize {
        match self {
            EmbeddingInput::Text(_) | EmbeddingInput::Tokens(_) => 1,
            EmbeddingInput::Texts(texts) => texts.len(),
            EmbeddingInput::TokenLists(lists) => lists.len(),
        }
    }

    /// The first input that is empty (a text or a token list), by its place.
    pub fn first_empty(&self) -> Option<usize> {
        match self {
            EmbeddingInput::Text(text) => text.is_empty().then_some(0),
            EmbeddingInput::Tokens(tokens) => tokens.is_empty().then_some(0),
            EmbeddingInput::Texts(texts) => texts.iter().position(String::is_empty),
            EmbeddingInput::TokenLists(lists) => lists.iter().position(Vec::is_empty),
        }
    }
}

/// How vectors are written in an embedding answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum EncodingFormat {
    /// JSON numbers.
    Float,
    /// Base64 of the little-endian f32s.
    Base64,
}

/// The answer to `POST /v1/embeddings`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct EmbeddingList {
    /// Always `list`.
    #[serde(default)]
    pub object: String,
    /// One vector per input, in the inputs' order.
    pub data: Vec<Embedding>,
    /// The model as the request named it.
    pub model: String,
    /// Tokens read.
    #[serde(default)]
    pub usage: EmbeddingUsage,
}

/// One vector of an [`EmbeddingList`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Embedding {
    /// Always `embedding`.
    #[serde(default)]
    pub object: String,
    /// The input's place in the request.
    pub index: usize,
    /// The vector: numbers, or with `encoding_format: base64` a base64 string.
    pub embedding: EmbeddingVector,
}

/// A vector as an embedding answer writes it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(untagged)]
pub enum EmbeddingVector {
    /// JSON numbers.
    Floats(Vec<f64>),
    /// Base64 of the little-endian f32s.
    Base64(String),
}

/// The tokens an embedding request read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct EmbeddingUsage {
    /// Tokens of the inputs.
    #[serde(default)]
    pub prompt_tokens: u64,
    /// The same (nothing is generated).
    #[serde(default)]
    pub total_tokens: u64,
}
