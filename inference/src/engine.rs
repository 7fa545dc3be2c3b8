//! [`Engine`]: a loaded model with its tokenizer and chat template, generating one
//! completion at a time. Synchronous and CPU-bound: the server runs it on a thread of
//! its own.

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;

use candle_core::{Device, Tensor};
use candle_transformers::generation::{LogitsProcessor, Sampling};
use serde_json::Value;
use tokenizers::Tokenizer;

use crate::Error;
use crate::checkpoint::{self, ModelFiles, read_json};
use crate::constrain::{Grammars, ResponseFormat};
use crate::gguf_vocab;
use crate::model::{self, Model};
use crate::template::{ChatTemplate, TemplateMessage, token_text};
use crate::tools::{ParsedCall, ToolFormat};

/// Completion length when a request does not set `max_tokens`.
pub const DEFAULT_MAX_TOKENS: usize = 256;

/// What to generate.
#[derive(Debug, Clone, PartialEq)]
pub struct GenerationRequest {
    /// The conversation so far.
    pub messages: Vec<TemplateMessage>,
    /// The most tokens to generate (capped by the context left after the prompt).
    pub max_tokens: Option<usize>,
    /// Sampling temperature; 0 is greedy. `None` is 1, as in the OpenAI API.
    pub temperature: Option<f64>,
    /// Nucleus sampling: the smallest set of tokens whose probability reaches `top_p`.
    pub top_p: Option<f64>,
    /// The sampler's seed: equal requests with equal seeds give equal completions.
    pub seed: u64,
    /// Strings that end the completion (not included in it).
    pub stop: Vec<String>,
    /// The tools offered (OpenAI's definitions, rendered by the chat template); with
    /// any, the answer is parsed for calls in the model's format.
    pub tools: Vec<Value>,
    /// What the answer must be; anything but text constrains sampling.
    pub response_format: ResponseFormat,
    /// The answer must be one call of one of `tools` (`tool_choice: "required"` or a
    /// named function): sampling is constrained to the model's call format, and
    /// `response_format` does not apply.
    pub force_tool_call: bool,
}

impl GenerationRequest {
    /// A request for free text with no tools.
    pub fn new(messages: Vec<TemplateMessage>, seed: u64) -> GenerationRequest {
        GenerationRequest {
            messages,
            max_tokens: None,
            temperature: None,
            top_p: None,
            seed,
            stop: Vec::new(),
            tools: Vec::new(),
            response_format: ResponseFormat::Text,
            force_tool_call: false,
        }
    }
}

/// Why generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// An end-of-sequence token or a stop string.
    Stop,
    /// `max_tokens` (or the context) was reached.
    Length,
    /// The answer calls tools.
    ToolCalls,
}

impl FinishReason {
    /// The OpenAI name: `stop` or `length`.
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::ToolCalls => "tool_calls",
        }
    }
}

/// A finished completion.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Completion {
    /// The generated text, without the stop string or end-of-sequence token.
    pub text: String,
    /// Tokens of the rendered prompt.
    pub prompt_tokens: usize,
    /// Tokens generated (an end-of-sequence token counts; text cut at a stop string
    /// still counts the tokens that produced it).
    pub completion_tokens: usize,
    /// Why it ended.
    pub finish_reason: FinishReason,
    /// The tools the answer calls (then [`Completion::text`] is the text around the
    /// calls, and the reason is [`FinishReason::ToolCalls`]).
    pub tool_calls: Vec<ParsedCall>,
}

/// A model ready to generate.
pub struct Engine {
    model: Model,
    tokenizer: Tokenizer,
    template: ChatTemplate,
    eos: BTreeSet<u32>,
    context: usize,
    device: Device,
    vocab_size: usize,
    tool_format: Option<ToolFormat>,
    /// Built on the first constrained request (or the reason it cannot be).
    grammars: Option<Result<Arc<Grammars>, String>>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("template", &self.template)
            .field("eos", &self.eos)
            .field("context", &self.context)
            .finish_non_exhaustive()
    }
}

/// Every id `value` (an integer or a list of them) names.
fn ids(value: Option<&Value>) -> Vec<u32> {
    match value {
        Some(Value::Number(n)) => n.as_u64().and_then(|id| u32::try_from(id).ok()).into_iter().collect(),
        Some(Value::Array(list)) => list.iter().flat_map(|v| ids(Some(v))).collect(),
        _ => Vec::new(),
    }
}

impl Engine {
    /// Loads the model at `model` (see [`crate::serve`] for what it may be) onto
    /// `device`, after checking every file and tensor.
    ///
    /// Errors: any loading [`Error`], naming the file at fault.
    pub fn load(model: &Path, device: &Device) -> Result<Engine, Error> {
        let files = checkpoint::locate(model)?;
        Engine::load_files(&files, device)
    }

    fn load_files(files: &ModelFiles, device: &Device) -> Result<Engine, Error> {
        // A GGUF file's own vocabulary and template, read only when a file beside it
        // does not give them.
        let gguf = match &files.weights {
            checkpoint::Weights::Gguf { path } if files.tokenizer.is_none() || files.tokenizer_config.is_none() => {
                Some((path, gguf_vocab::read(path)?))
            }
            _ => None,
        };
        let mut eos = BTreeSet::new();
        let tokenizer = match (&files.tokenizer, &gguf) {
            (Some(path), _) => Tokenizer::from_file(path).map_err(|source| Error::Tokenizer {
                path: path.clone(),
                source,
            })?,
            (None, Some((_, vocab))) => vocab.tokenizer.clone(),
            (None, None) => {
                return Err(Error::MissingFile {
                    dir: files.dir.clone(),
                    file: "tokenizer.json".to_owned(),
                    help: "download the model's tokenizer files too (tokenizer.json, tokenizer_config.json)",
                });
            }
        };
        let (template, eos_token, eos_source) = match (&files.tokenizer_config, &gguf) {
            (Some(path), _) => {
                let tokenizer_config = read_json(path, "tokenizer config")?;
                let template = ChatTemplate::from_tokenizer_config(path, &tokenizer_config)?;
                (template, token_text(&tokenizer_config, "eos_token"), path.clone())
            }
            (None, Some((path, vocab))) => {
                let source = vocab
                    .chat_template
                    .clone()
                    .ok_or_else(|| Error::ChatTemplateMissing { path: (*path).clone() })?;
                let template = ChatTemplate::from_source(
                    path,
                    source,
                    vocab.bos_token.clone().unwrap_or_default(),
                    vocab.eos_token.clone().unwrap_or_default(),
                )?;
                eos.extend(vocab.eos_ids.iter().copied());
                (template, vocab.eos_token.clone(), (*path).clone())
            }
            (None, None) => {
                return Err(Error::MissingFile {
                    dir: files.dir.clone(),
                    file: "tokenizer_config.json".to_owned(),
                    help: "download the model's tokenizer files too (tokenizer.json, tokenizer_config.json)",
                });
            }
        };
        if let Some(path) = &files.generation_config {
            eos.extend(ids(read_json(path, "generation config")?.get("eos_token_id")));
        }
        if let checkpoint::Weights::Safetensors { config, .. } = &files.weights {
            eos.extend(ids(config.get("eos_token_id")));
        }
        if let Some(token) = eos_token {
            let id = tokenizer
                .token_to_id(&token)
                .ok_or_else(|| Error::UnknownSpecialToken {
                    path: eos_source.clone(),
                    role: "eos_token",
                    token,
                })?;
            eos.insert(id);
        }
        let model_type = match &files.weights {
            checkpoint::Weights::Safetensors { config, family, .. } => config
                .get("model_type")
                .and_then(Value::as_str)
                .map_or_else(|| family.model_type().to_owned(), str::to_owned),
            // Only Llama GGUF files load.
            checkpoint::Weights::Gguf { .. } => "llama".to_owned(),
        };
        let tool_format = ToolFormat::of(&model_type, template.source());
        tracing::info!(dir = %files.dir.display(), "loading weights");
        let loaded = model::load(&files.weights, device)?;
        let tokenizer_vocab = tokenizer.get_vocab_size(true);
        if loaded.vocab_size != 0 && tokenizer_vocab > loaded.vocab_size {
            return Err(Error::VocabMismatch {
                tokenizer: files.tokenizer.clone().unwrap_or_else(|| files.dir.clone()),
                tokenizer_vocab,
                model_vocab: loaded.vocab_size,
            });
        }
        Ok(Engine {
            model: loaded.model,
            tokenizer,
            template,
            eos,
            context: loaded.context,
            device: device.clone(),
            vocab_size: loaded.vocab_size.max(tokenizer_vocab),
            tool_format,
            grammars: None,
        })
    }

    /// The tokenizer: the model's `tokenizer.json`, or the one built from a GGUF
    /// file's metadata.
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// The `count` tokens the model picks greedily after `prompt` (token ids), not
    /// stopping at an end-of-sequence token, each with its margin: how far its logit is
    /// above the runner-up's (a near tie flips under rounding). The reference
    /// comparisons and the benchmark drive the model with it.
    ///
    /// Errors: [`Error::ContextOverflow`] when they do not fit the context,
    /// [`Error::Candle`] if the model fails.
    pub fn greedy(&mut self, prompt: &[u32], count: usize) -> Result<Vec<(u32, f32)>, Error> {
        if prompt.is_empty() || prompt.len() + count > self.context {
            return Err(Error::ContextOverflow {
                prompt_tokens: prompt.len(),
                max_tokens: count,
                context: self.context,
            });
        }
        self.model.reset()?;
        let mut generated = Vec::with_capacity(count);
        let mut input = prompt.to_vec();
        let mut position = 0;
        while generated.len() < count {
            let logits = self.model.forward(&input, position, &self.device)?;
            position += input.len();
            let logits = logits.to_vec1::<f32>().map_err(|source| Error::Candle {
                action: "read the logits".to_owned(),
                source,
            })?;
            let (mut best, mut first, mut second) = (0u32, f32::NEG_INFINITY, f32::NEG_INFINITY);
            for (id, &logit) in (0u32..).zip(logits.iter()) {
                if logit > first {
                    (best, second, first) = (id, first, logit);
                } else if logit > second {
                    second = logit;
                }
            }
            generated.push((best, first - second));
            input = vec![best];
        }
        Ok(generated)
    }

    /// The format this model writes tool calls in; `None`: it cannot call tools.
    pub fn tool_format(&self) -> Option<ToolFormat> {
        self.tool_format
    }

    /// The grammar compiler of this model's vocabulary, built once.
    fn grammars(&mut self) -> Result<Arc<Grammars>, Error> {
        let built = self.grammars.get_or_insert_with(|| {
            Grammars::new(&self.tokenizer, self.vocab_size, &self.eos)
                .map(Arc::new)
                .map_err(|error| error.to_string())
        });
        built.clone().map_err(|reason| Error::Grammar { reason })
    }

    /// The end-of-sequence token ids.
    pub fn eos_ids(&self) -> &BTreeSet<u32> {
        &self.eos
    }

    /// The prompt a conversation renders to, with the assistant's turn opened.
    ///
    /// Errors: [`Error::ChatTemplate`].
    pub fn render_prompt(&self, messages: &[TemplateMessage]) -> Result<String, Error> {
        self.template.render(messages, true)
    }

    /// The prompt a conversation renders to with `tools` offered.
    ///
    /// Errors: [`Error::ChatTemplate`].
    pub fn render_prompt_with_tools(&self, messages: &[TemplateMessage], tools: &[Value]) -> Result<String, Error> {
        self.template.render_with_tools(messages, tools, true)
    }

    /// Generates a completion, handing each new piece of text to `on_text` as soon as
    /// it is final (never a part of a stop string, never half a character). The pieces
    /// concatenate to [`Completion::text`]. With tools offered, the text is handed
    /// over at the end, once the calls are parsed out of it.
    ///
    /// With a `response_format`, each token is sampled among those the format allows
    /// and generation stops when the format is complete.
    ///
    /// Errors: [`Error::ChatTemplate`], [`Error::Tokenize`], [`Error::ContextOverflow`]
    /// for a prompt that fills the context, [`Error::CannotCallTools`] for tools offered
    /// to a model that cannot call them, [`Error::Grammar`] for a response format that
    /// cannot be used, [`Error::Candle`] if the model fails.
    pub fn generate(
        &mut self,
        request: &GenerationRequest,
        mut on_text: impl FnMut(&str),
    ) -> Result<Completion, Error> {
        let tool_format = match (request.tools.is_empty(), self.tool_format) {
            (true, _) => None,
            (false, Some(format)) => Some(format),
            (false, None) => return Err(Error::CannotCallTools),
        };
        let mut matcher = match (tool_format, &request.response_format) {
            (Some(format), _) if request.force_tool_call => {
                Some(self.grammars()?.call_matcher(format, &request.tools)?)
            }
            (_, ResponseFormat::Text) => None,
            (_, response_format) => self.grammars()?.matcher(response_format)?,
        };
        let prompt = self.render_prompt_with_tools(&request.messages, &request.tools)?;
        // The template writes the special tokens itself (`bos_token` among them), so
        // the tokenizer must not add its own.
        let encoding = self
            .tokenizer
            .encode(prompt, false)
            .map_err(|source| Error::Tokenize { source })?;
        let prompt_ids = encoding.get_ids().to_vec();
        let prompt_tokens = prompt_ids.len();
        let wanted = request.max_tokens.unwrap_or(DEFAULT_MAX_TOKENS);
        if prompt_tokens == 0 || prompt_tokens >= self.context {
            return Err(Error::ContextOverflow {
                prompt_tokens,
                max_tokens: wanted,
                context: self.context,
            });
        }
        let max_tokens = wanted.min(self.context - prompt_tokens);
        let mut sampler = LogitsProcessor::from_sampling(request.seed, sampling(request));
        self.model.reset()?;

        let mut generated: Vec<u32> = Vec::new();
        let mut text = String::new();
        let mut emitted = 0usize;
        let mut input = prompt_ids;
        let mut position = 0usize;
        let mut finish_reason = FinishReason::Length;
        while generated.len() < max_tokens {
            let mut logits = self.model.forward(&input, position, &self.device)?;
            position += input.len();
            if let Some(matcher) = matcher.as_mut() {
                logits = masked(matcher, &logits)?;
            }
            let next = sampler.sample(&logits).map_err(|source| Error::Candle {
                action: "sample the next token".to_owned(),
                source,
            })?;
            generated.push(next);
            if self.eos.contains(&next) {
                finish_reason = FinishReason::Stop;
                break;
            }
            // Tool-call markers may be special tokens (Mistral's `[TOOL_CALLS]`): kept
            // for the parser when tools are offered.
            text = self
                .tokenizer
                .decode(&generated, tool_format.is_none())
                .map_err(|source| Error::Tokenize { source })?;
            if let Some(at) = request.stop.iter().filter_map(|stop| text.find(stop.as_str())).min() {
                text.truncate(at);
                finish_reason = FinishReason::Stop;
                break;
            }
            let safe = final_len(&text, &request.stop);
            if safe > emitted && tool_format.is_none() {
                on_text(text.get(emitted..safe).unwrap_or_default());
                emitted = safe;
            }
            if let Some(matcher) = matcher.as_mut() {
                matcher
                    .consume_token(next)
                    .map_err(|e| Error::Constraint { reason: e.to_string() })?;
                if matcher.is_stopped() {
                    finish_reason = FinishReason::Stop;
                    break;
                }
            }
            input = vec![next];
        }
        let mut tool_calls = Vec::new();
        if let Some(format) = tool_format {
            let parsed = format.parse(&text);
            if !parsed.calls.is_empty() {
                text = parsed.content;
                tool_calls = parsed.calls;
                finish_reason = FinishReason::ToolCalls;
            }
        }
        if let Some(rest) = text.get(emitted..).filter(|rest| !rest.is_empty()) {
            on_text(rest);
        }
        Ok(Completion {
            text,
            prompt_tokens,
            completion_tokens: generated.len(),
            finish_reason,
            tool_calls,
        })
    }
}

/// `logits` with every token the matcher does not allow now at minus infinity.
fn masked(matcher: &mut llguidance::Matcher, logits: &Tensor) -> Result<Tensor, Error> {
    let constraint = |e: &dyn std::fmt::Display| Error::Constraint { reason: e.to_string() };
    let mask = matcher.compute_mask_or_eos().map_err(|e| constraint(&e))?;
    let mut values = logits.to_vec1::<f32>().map_err(|source| Error::Candle {
        action: "read the logits".to_owned(),
        source,
    })?;
    for (id, value) in (0u32..).zip(values.iter_mut()) {
        if !mask.is_allowed(id) {
            *value = f32::NEG_INFINITY;
        }
    }
    Tensor::new(values, logits.device()).map_err(|source| Error::Candle {
        action: "mask the logits".to_owned(),
        source,
    })
}

/// The sampler a request asks for.
fn sampling(request: &GenerationRequest) -> Sampling {
    let temperature = request.temperature.unwrap_or(1.0);
    match request.top_p {
        _ if temperature <= 0.0 => Sampling::ArgMax,
        Some(p) if p > 0.0 && p < 1.0 => Sampling::TopP { p, temperature },
        _ => Sampling::All { temperature },
    }
}

/// How much of `text` is final: everything but a trailing replacement character (half
/// of a multi-byte character whose other bytes are still to come) and a trailing part
/// that could begin a stop string.
fn final_len(text: &str, stops: &[String]) -> usize {
    let mut end = text.trim_end_matches('\u{FFFD}').len();
    let held = stops
        .iter()
        .map(|stop| {
            (1..stop.len())
                .rev()
                .find(|&n| stop.is_char_boundary(n) && text.get(..end).is_some_and(|t| t.ends_with(&stop[..n])))
                .unwrap_or(0)
        })
        .max()
        .unwrap_or(0);
    end -= held;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    end
}

#[cfg(test)]
mod tests {
    use super::final_len;

    #[test]
    fn final_len_holds_back_a_possible_stop_string_and_half_characters() {
        let stops = vec!["</s>".to_owned(), "END".to_owned()];
        assert_eq!(final_len("hello", &stops), 5);
        assert_eq!(final_len("hello</", &stops), 5);
        assert_eq!(final_len("hello E", &stops), 6);
        assert_eq!(final_len("hello \u{FFFD}", &stops), 6);
        assert_eq!(final_len("hello", &[]), 5);
    }
}
