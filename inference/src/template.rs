//! The chat template: the Jinja template of `tokenizer_config.json`, rendered with
//! minijinja as `transformers` renders it (blocks trimmed, Python string methods,
//! `raise_exception`), with `bos_token`, `eos_token` and `add_generation_prompt`.

use std::path::{Path, PathBuf};

use minijinja::{Environment, ErrorKind, context};
use serde::Serialize;
use serde_json::Value;

use crate::Error;

const TEMPLATE_NAME: &str = "chat_template";

/// One message of a conversation, as the template sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TemplateMessage {
    /// `system`, `user`, `assistant` or `tool`.
    pub role: String,
    /// The text.
    pub content: String,
}

/// A compiled chat template and the special tokens it may refer to.
pub struct ChatTemplate {
    env: Environment<'static>,
    path: PathBuf,
    /// The beginning-of-sequence token's text (may be empty).
    pub bos_token: String,
    /// The end-of-sequence token's text (may be empty).
    pub eos_token: String,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

/// A special token's text: a string, or an object with `content` (older configs).
pub(crate) fn token_text(config: &Value, key: &str) -> Option<String> {
    match config.get(key)? {
        Value::String(text) => Some(text.clone()),
        Value::Object(object) => object.get("content").and_then(Value::as_str).map(str::to_owned),
        _ => None,
    }
}

impl ChatTemplate {
    /// Compiles the template of a parsed `tokenizer_config.json` at `path`. A list of
    /// named templates yields the one named `default` (else the first).
    ///
    /// Errors: [`Error::ChatTemplateMissing`] without a template,
    /// [`Error::ChatTemplate`] when it does not compile.
    pub fn from_tokenizer_config(path: &Path, config: &Value) -> Result<ChatTemplate, Error> {
        let missing = || Error::ChatTemplateMissing {
            path: path.to_path_buf(),
        };
        let source = match config.get("chat_template").ok_or_else(missing)? {
            Value::String(source) => source.clone(),
            Value::Array(named) => {
                let source_of = |entry: &Value| entry.get("template").and_then(Value::as_str).map(str::to_owned);
                named
                    .iter()
                    .find(|entry| entry.get("name").and_then(Value::as_str) == Some("default"))
                    .and_then(source_of)
                    .or_else(|| named.first().and_then(source_of))
                    .ok_or_else(missing)?
            }
            _ => return Err(missing()),
        };
        ChatTemplate::from_source(
            path,
            source,
            token_text(config, "bos_token").unwrap_or_default(),
            token_text(config, "eos_token").unwrap_or_default(),
        )
    }

    /// Compiles the template `source`, read from `path` (a `tokenizer_config.json`, or
    /// a GGUF file's `tokenizer.chat_template`), with the special tokens' texts.
    ///
    /// Errors: [`Error::ChatTemplate`] when it does not compile.
    pub fn from_source(
        path: &Path,
        source: String,
        bos_token: String,
        eos_token: String,
    ) -> Result<ChatTemplate, Error> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function(
            "raise_exception",
            |message: String| -> Result<String, minijinja::Error> {
                Err(minijinja::Error::new(ErrorKind::InvalidOperation, message))
            },
        );
        env.add_template_owned(TEMPLATE_NAME, source)
            .map_err(|source| Error::ChatTemplate {
                path: path.to_path_buf(),
                source,
            })?;
        Ok(ChatTemplate {
            env,
            path: path.to_path_buf(),
            bos_token,
            eos_token,
        })
    }

    /// Renders `messages`, ending with the assistant's turn opened when
    /// `add_generation_prompt` is set.
    ///
    /// Errors: [`Error::ChatTemplate`] when rendering fails (an unexpected role order
    /// that the template refuses with `raise_exception`, among others).
    pub fn render(&self, messages: &[TemplateMessage], add_generation_prompt: bool) -> Result<String, Error> {
        let error = |source| Error::ChatTemplate {
            path: self.path.clone(),
            source,
        };
        let template = self.env.get_template(TEMPLATE_NAME).map_err(error)?;
        template
            .render(context! {
                messages => messages,
                bos_token => &self.bos_token,
                eos_token => &self.eos_token,
                add_generation_prompt => add_generation_prompt,
            })
            .map_err(error)
    }
}
