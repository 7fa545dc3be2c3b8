//! The tokenizer and chat template of a GGUF file, built from its metadata as llama.cpp
//! builds them (`src/llama-vocab.cpp`), for GGUF-only repositories that publish no
//! `tokenizer.json`.
//!
//! - `tokenizer.ggml.model = gpt2` (byte-level BPE): the vocabulary of
//!   `tokenizer.ggml.tokens`, the ranked `tokenizer.ggml.merges`, the pre-tokenizer
//!   regexes llama.cpp uses for `tokenizer.ggml.pre` (applied one after the other, each
//!   match isolated, as `llm_tokenizer_bpe` does), then the byte-level mapping without
//!   its own regex. Built with the `tokenizers` crate's BPE model and pre-tokenizers.
//! - Tokens of type control, user-defined or unknown (`tokenizer.ggml.token_type` 3, 4,
//!   2) are matched whole in the text before the model sees it, as llama.cpp does with
//!   `parse_special`; control and unknown ones are special (skipped when decoding).
//! - The chat template is `tokenizer.chat_template`; `bos_token` and `eos_token` are the
//!   texts of `tokenizer.ggml.bos_token_id` and `.eos_token_id`.
//!
//! - `tokenizer.ggml.model = llama` (SentencePiece): see `sentencepiece_bpe`.
//!
//! Any other tokenizer model (`bert`, `t5`, `rwkv`, …), or a
//! `gpt2` pre-tokenizer type outside the table, is an error naming the key: never a
//! guess that would tokenize differently from the model's training.

use std::collections::HashMap;
use std::path::Path;

use candle_core::quantized::gguf_file::Value;
use tokenizers::decoders::DecoderWrapper;
use tokenizers::decoders::byte_fallback::ByteFallback;
use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::decoders::sequence::Sequence as DecoderSequence;
use tokenizers::decoders::strip::Strip;
use tokenizers::models::bpe::{BPE, Vocab};
use tokenizers::normalizers::{NormalizerWrapper, Prepend, Replace, Sequence as NormalizerSequence};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{AddedToken, PreTokenizerWrapper, SplitDelimiterBehavior, Tokenizer};

use crate::Error;

/// llama.cpp's token types (`llama_token_type`).
const TOKEN_TYPE_UNKNOWN: i32 = 2;
const TOKEN_TYPE_CONTROL: i32 = 3;
const TOKEN_TYPE_USER_DEFINED: i32 = 4;

/// The GPT-2 pre-tokenizer regex (llama.cpp's `LLAMA_VOCAB_PRE_TYPE_GPT2`).
const GPT2: &str = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)";

/// Llama 3's regex as llama.cpp adapts it (case-insensitive contractions spelled out).
const LLAMA3: &str = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

/// Qwen2's regex as llama.cpp adapts it (single digits).
const QWEN2: &str = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

/// The pre-tokenizer regexes of a `tokenizer.ggml.pre` value, in llama.cpp's order, and
/// whether the vocabulary's whole words skip the merges (`ignore_merges`, Llama 3).
/// `None` for a type this table does not carry.
pub(crate) fn pre_tokenizer(pre: &str) -> Option<(Vec<&'static str>, bool)> {
    let found = match pre {
        // llama.cpp's `LLAMA_VOCAB_PRE_TYPE_LLAMA3` and the types it shares with it.
        "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "pixtral" | "dbrx" | "smaug-bpe" => (vec![LLAMA3], true),
        // `STARCODER`, `REFACT`, `COMMAND_R`, `SMOLLM`, `CODESHELL`, `EXAONE`, `MINERVA`:
        // each digit alone, then GPT-2.
        "starcoder" | "refact" | "command-r" | "smollm" | "codeshell" | "exaone" | "minerva-7b" => {
            (vec!["\\p{N}", GPT2], false)
        }
        // `GPT2`, `MPT`, `OLMO`, `JAIS`.
        "gpt-2" | "phi-2" | "mpt" | "olmo" | "jais" => (vec![GPT2], false),
        // `QWEN2`, `STABLELM2`.
        "qwen2" | "deepseek-r1-qwen" | "stablelm2" => (vec![QWEN2], false),
        // `FALCON`.
        "falcon" => (vec!["[\\p{P}\\$\\+<=>\\^~\\|`]+", GPT2, "[0-9][0-9][0-9]"], false),
        // `DEFAULT` (no or an empty `tokenizer.ggml.pre`).
        "" | "default" => (
            vec!["[\\p{P}\\$\\+<=>\\^~\\|]+", GPT2, "\\p{N}+", "[0-9][0-9][0-9]"],
            false,
        ),
        _ => return None,
    };
    Some(found)
}

/// Whether the built-in engine can build the tokenizer of a GGUF whose
/// `tokenizer.ggml.model` is `model` and `tokenizer.ggml.pre` is `pre`.
pub fn gguf_tokenizer_supported(model: &str, pre: Option<&str>) -> bool {
    model == "llama" || (model == "gpt2" && pre_tokenizer(pre.unwrap_or_default()).is_some())
}

/// A GGUF file's tokenizer and chat template.
pub(crate) struct GgufVocab {
    pub tokenizer: Tokenizer,
    /// `tokenizer.chat_template`, if the file has one.
    pub chat_template: Option<String>,
    /// The beginning-of-sequence token's text.
    pub bos_token: Option<String>,
    /// The end-of-sequence token's text.
    pub eos_token: Option<String>,
    /// The end-of-sequence ids (`eos_token_id`, `eot_token_id`, `eom_token_id`).
    pub eos_ids: Vec<u32>,
}

/// Reads the metadata of the GGUF file at `path` and builds its vocabulary.
///
/// Errors: [`Error::Read`], and [`Error::Gguf`] naming the key at fault.
pub(crate) fn read(path: &Path) -> Result<GgufVocab, Error> {
    let mut file = std::fs::File::open(path).map_err(|source| Error::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let content = candle_core::quantized::gguf_file::Content::read(&mut file).map_err(|source| Error::Gguf {
        path: path.to_path_buf(),
        detail: format!("unreadable header ({source})"),
    })?;
    from_metadata(&content.metadata).map_err(|detail| Error::Gguf {
        path: path.to_path_buf(),
        detail,
    })
}

/// The tokenizer of a GGUF file, built from its metadata (see the module's
/// documentation).
///
/// Errors: [`Error::Read`], and [`Error::Gguf`] naming the key at fault.
pub fn gguf_tokenizer(path: &Path) -> Result<Tokenizer, Error> {
    read(path).map(|vocab| vocab.tokenizer)
}

fn string<'m>(metadata: &'m HashMap<String, Value>, key: &str) -> Result<Option<&'m str>, String> {
    match metadata.get(key) {
        None => Ok(None),
        Some(value) => value
            .to_string()
            .map(|s| Some(s.as_str()))
            .map_err(|_| format!("metadata key `{key}` is not a string")),
    }
}

fn id(metadata: &HashMap<String, Value>, key: &str) -> Result<Option<u32>, String> {
    match metadata.get(key) {
        None => Ok(None),
        Some(value) => match value {
            Value::U32(n) => Ok(Some(*n)),
            Value::I32(n) => u32::try_from(*n)
                .map(Some)
                .map_err(|_| format!("metadata key `{key}` is negative")),
            Value::U64(n) => u32::try_from(*n)
                .map(Some)
                .map_err(|_| format!("metadata key `{key}` is too large")),
            Value::I64(n) => u32::try_from(*n)
                .map(Some)
                .map_err(|_| format!("metadata key `{key}` is out of range")),
            _ => Err(format!("metadata key `{key}` is not an integer")),
        },
    }
}

fn strings<'m>(metadata: &'m HashMap<String, Value>, key: &str) -> Result<Vec<&'m str>, String> {
    let list = metadata
        .get(key)
        .ok_or_else(|| format!("metadata key `{key}` is missing"))?
        .to_vec()
        .map_err(|_| format!("metadata key `{key}` is not an array"))?;
    list.iter()
        .map(|value| {
            value
                .to_string()
                .map(String::as_str)
                .map_err(|_| format!("metadata key `{key}` holds a non-string"))
        })
        .collect()
}

/// The vocabulary as the BPE model's map (the first id of a repeated text wins).
fn vocab_of(tokens: &[&str]) -> Result<Vocab, String> {
    let mut vocab = Vocab::default();
    for (index, token) in tokens.iter().enumerate() {
        let index = u32::try_from(index).map_err(|_| "`tokenizer.ggml.tokens` is too long".to_owned())?;
        vocab.entry((*token).to_owned()).or_insert(index);
    }
    Ok(vocab)
}

/// `gpt2`: byte-level BPE with the ranked merges and llama.cpp's pre-tokenizer regexes.
fn byte_level_bpe(metadata: &HashMap<String, Value>, tokens: &[&str]) -> Result<Tokenizer, String> {
    let pre = string(metadata, "tokenizer.ggml.pre")?.unwrap_or_default();
    let (regexes, ignore_merges) = pre_tokenizer(pre).ok_or_else(|| {
        format!(
            "`tokenizer.ggml.pre` is `{pre}`, a pre-tokenizer the built-in engine does not know; help: put the \
             model's tokenizer.json beside the file, or serve it with llama.cpp"
        )
    })?;
    let merges = strings(metadata, "tokenizer.ggml.merges")?
        .iter()
        .map(|merge| {
            merge
                .split_once(' ')
                .map(|(a, b)| (a.to_owned(), b.to_owned()))
                .ok_or_else(|| format!("`tokenizer.ggml.merges` holds `{merge}`, not two tokens"))
        })
        .collect::<Result<Vec<_>, String>>()?;
    let bpe = BPE::builder()
        .vocab_and_merges(vocab_of(tokens)?, merges)
        .ignore_merges(ignore_merges)
        .build()
        .map_err(|e| format!("the BPE model does not build ({e})"))?;
    let mut pre_tokenizers = Vec::with_capacity(regexes.len() + 1);
    for regex in regexes {
        let split = Split::new(
            SplitPattern::Regex(regex.to_owned()),
            SplitDelimiterBehavior::Isolated,
            false,
        )
        .map_err(|e| format!("the pre-tokenizer regex of `{pre}` does not compile ({e})"))?;
        pre_tokenizers.push(PreTokenizerWrapper::Split(split));
    }
    pre_tokenizers.push(PreTokenizerWrapper::ByteLevel(ByteLevel::new(false, false, false)));
    let mut tokenizer = Tokenizer::new(bpe);
    tokenizer
        .with_pre_tokenizer(Some(Sequence::new(pre_tokenizers)))
        .with_decoder(Some(ByteLevelDecoder::default()));
    Ok(tokenizer)
}

/// `llama`: SentencePiece's BPE as llama.cpp runs it (`llm_tokenizer_spm`): spaces as
/// `▁`, one prefixed to the text and after each special token
/// (`tokenizer.ggml.add_space_prefix`, default on), the highest-scoring pair merged
/// first, and characters outside the vocabulary as `<0xXX>` byte tokens. As
/// `transformers` converts a SentencePiece model, the merges are every split of a
/// normal piece into two normal pieces, ranked by the piece's score
/// (`tokenizer.ggml.scores`).
fn sentencepiece_bpe(metadata: &HashMap<String, Value>, tokens: &[&str], types: &[i32]) -> Result<Tokenizer, String> {
    const TOKEN_TYPE_NORMAL: i32 = 1;
    let scores: Vec<f32> = metadata
        .get("tokenizer.ggml.scores")
        .ok_or("metadata key `tokenizer.ggml.scores` is missing")?
        .to_vec()
        .map_err(|_| "metadata key `tokenizer.ggml.scores` is not an array".to_owned())?
        .iter()
        .map(|v| {
            v.to_f32()
                .map_err(|_| "`tokenizer.ggml.scores` holds a non-number".to_owned())
        })
        .collect::<Result<_, _>>()?;
    let vocab = vocab_of(tokens)?;
    let normal = |id: u32| types.get(id as usize).is_none_or(|t| *t == TOKEN_TYPE_NORMAL);
    let mut ranked: Vec<(f32, u32, u32, &str, &str)> = Vec::new();
    for (piece, &id) in vocab.iter() {
        if !normal(id) {
            continue;
        }
        let score = scores.get(id as usize).copied().unwrap_or(0.0);
        for (at, _) in piece.char_indices().skip(1) {
            let (left, right) = piece.split_at(at);
            if let (Some(&l), Some(&r)) = (vocab.get(left), vocab.get(right))
                && normal(l)
                && normal(r)
            {
                ranked.push((score, l, r, left, right));
            }
        }
    }
    ranked.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
    let merges = ranked
        .into_iter()
        .map(|(_, _, _, l, r)| (l.to_owned(), r.to_owned()))
        .collect();
    let unk = id(metadata, "tokenizer.ggml.unknown_token_id")?
        .and_then(|id| tokens.get(id as usize))
        .map(|t| (*t).to_owned());
    let mut builder = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .byte_fallback(true)
        .fuse_unk(true);
    if let Some(unk) = unk {
        builder = builder.unk_token(unk);
    }
    let bpe = builder
        .build()
        .map_err(|e| format!("the BPE model does not build ({e})"))?;
    let add_space_prefix = match metadata.get("tokenizer.ggml.add_space_prefix") {
        None => true,
        Some(value) => value
            .to_bool()
            .map_err(|_| "metadata key `tokenizer.ggml.add_space_prefix` is not a boolean".to_owned())?,
    };
    let replace = |from: &str, to: &str| {
        Replace::new(from, to).map_err(|e| format!("the SentencePiece normalizer does not build ({e})"))
    };
    let mut normalizers = Vec::new();
    if add_space_prefix {
        normalizers.push(NormalizerWrapper::Prepend(Prepend::new("\u{2581}".to_owned())));
    }
    normalizers.push(NormalizerWrapper::Replace(replace(" ", "\u{2581}")?));
    let mut decoders = vec![
        DecoderWrapper::Replace(replace("\u{2581}", " ")?),
        DecoderWrapper::ByteFallback(ByteFallback::new()),
        DecoderWrapper::Fuse(Fuse::new()),
    ];
    if add_space_prefix {
        decoders.push(DecoderWrapper::Strip(Strip::new(' ', 1, 0)));
    }
    let mut tokenizer = Tokenizer::new(bpe);
    tokenizer
        .with_normalizer(Some(NormalizerSequence::new(normalizers)))
        .map_err(|e| format!("the SentencePiece normalizer does not set ({e})"))?
        .with_decoder(Some(DecoderSequence::new(decoders)));
    Ok(tokenizer)
}

/// Builds the vocabulary from parsed GGUF metadata; the error names the key.
pub(crate) fn from_metadata(metadata: &HashMap<String, Value>) -> Result<GgufVocab, String> {
    let model = string(metadata, "tokenizer.ggml.model")?.ok_or("metadata key `tokenizer.ggml.model` is missing")?;
    let tokens = strings(metadata, "tokenizer.ggml.tokens")?;
    let types: Vec<i32> = match metadata.get("tokenizer.ggml.token_type") {
        None => Vec::new(),
        Some(value) => value
            .to_vec()
            .map_err(|_| "metadata key `tokenizer.ggml.token_type` is not an array".to_owned())?
            .iter()
            .map(|v| match v {
                Value::I32(n) => Ok(*n),
                Value::U32(n) => i32::try_from(*n).map_err(|_| ()),
                _ => Err(()),
            })
            .collect::<Result<_, ()>>()
            .map_err(|()| "metadata key `tokenizer.ggml.token_type` holds a non-integer".to_owned())?,
    };
    let mut tokenizer = match model {
        "gpt2" => byte_level_bpe(metadata, &tokens)?,
        "llama" => sentencepiece_bpe(metadata, &tokens, &types)?,
        _ => {
            return Err(format!(
                "`tokenizer.ggml.model` is `{model}`; the built-in engine builds `gpt2` (byte-level BPE) and \
                 `llama` (SentencePiece) tokenizers from GGUF metadata; help: put the model's tokenizer.json and \
                 tokenizer_config.json beside the file, or serve it with llama.cpp"
            ));
        }
    };
    let (mut special, mut user_defined) = (Vec::new(), Vec::new());
    for (token, kind) in tokens.iter().zip(types.iter().copied()) {
        match kind {
            TOKEN_TYPE_CONTROL | TOKEN_TYPE_UNKNOWN => special.push(AddedToken::from(*token, true)),
            TOKEN_TYPE_USER_DEFINED => user_defined.push(AddedToken::from(*token, false)),
            _ => {}
        }
    }
    tokenizer
        .add_special_tokens(special)
        .and_then(|_| tokenizer.add_tokens(user_defined))
        .map_err(|e| format!("the special tokens of `tokenizer.ggml.tokens` do not add ({e})"))?;
    let text_of = |key: &str| -> Result<Option<String>, String> {
        Ok(id(metadata, key)?
            .and_then(|id| tokens.get(usize::try_from(id).unwrap_or(usize::MAX)))
            .map(|t| (*t).to_owned()))
    };
    let mut eos_ids = Vec::new();
    for key in [
        "tokenizer.ggml.eos_token_id",
        "tokenizer.ggml.eot_token_id",
        "tokenizer.ggml.eom_token_id",
    ] {
        eos_ids.extend(id(metadata, key)?);
    }
    Ok(GgufVocab {
        tokenizer,
        chat_template: string(metadata, "tokenizer.chat_template")?.map(str::to_owned),
        bos_token: text_of("tokenizer.ggml.bos_token_id")?,
        eos_token: text_of("tokenizer.ggml.eos_token_id")?,
        eos_ids,
    })
}
