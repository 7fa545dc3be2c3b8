//! Real chat templates rendered by [`ChatTemplate`] against `transformers`' own
//! rendering of the same conversations.
//!
//! The templates are model data, kept as fixtures under `tests/data/chat_templates/`
//! (their source repositories are listed in the README there), plus SmolLM2's, read
//! from the real GGUF file and from its conversion's `tokenizer_config.json`. The
//! reference is `tokenizer.apply_chat_template(tokenize=False)` of `transformers`,
//! run by `render_chat_template.py` in the virtual environment that
//! `tests/engines/vllm.sh` installs; when it cannot be installed, the test fails.
//!
//! Every conversation must render to the same text, or fail in both; where the
//! template itself refuses one with `raise_exception` (broken alternation, a system
//! turn a model does not take), our error must carry the template's message.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::{Value, json};
use skein_inference::{ChatTemplate, TemplateMessage};
use skein_testkit::smollm2;

fn data() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/chat_templates")
}

/// A template with the special tokens of its `tokenizer_config.json`.
struct Fixture {
    name: String,
    path: PathBuf,
    source: String,
    /// `bos_token` as the config holds it: a string, an `AddedToken` object, or null.
    bos_token: Value,
    eos_token: Value,
}

impl Fixture {
    fn file(file: &str, bos_token: Value, eos_token: Value) -> Fixture {
        let path = data().join(file);
        let source = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
        Fixture {
            name: file.to_owned(),
            path,
            source,
            bos_token,
            eos_token,
        }
    }

    /// The token's text, as `transformers` sees it.
    fn text(token: &Value) -> Value {
        match token {
            Value::Object(object) => object.get("content").cloned().unwrap_or(Value::Null),
            other => other.clone(),
        }
    }

    /// Compiled as the engine compiles a model's `tokenizer_config.json`.
    fn compile(&self) -> ChatTemplate {
        let config = json!({
            "chat_template": self.source,
            "bos_token": self.bos_token,
            "eos_token": self.eos_token,
        });
        ChatTemplate::from_tokenizer_config(&self.path, &config)
            .unwrap_or_else(|e| panic!("{}: {}", self.name, skein_model_registry::error_chain(&e)))
    }
}

fn added_token(content: &str) -> Value {
    json!({
        "__type": "AddedToken", "content": content, "lstrip": false,
        "normalized": false, "rstrip": false, "single_word": false,
    })
}

fn fixtures() -> Vec<Fixture> {
    let s = |text: &str| Value::String(text.to_owned());
    let mut fixtures = vec![
        Fixture::file(
            "meta-llama-Llama-3.1-8B-Instruct.jinja",
            s("<|begin_of_text|>"),
            s("<|eot_id|>"),
        ),
        Fixture::file(
            "meta-llama-Llama-3.2-3B-Instruct.jinja",
            s("<|begin_of_text|>"),
            s("<|eot_id|>"),
        ),
        Fixture::file("mistralai-Mistral-Nemo-Instruct-2407.jinja", s("<s>"), s("</s>")),
        Fixture::file("Qwen-Qwen2.5-7B-Instruct.jinja", Value::Null, s("<|im_end|>")),
        Fixture::file("google-gemma-2-2b-it.jinja", added_token("<bos>"), added_token("<eos>")),
        Fixture::file("microsoft-Phi-3.5-mini-instruct.jinja", s("<s>"), s("<|endoftext|>")),
    ];
    // SmolLM2's, as the real GGUF carries it and as the conversion's config does.
    let gguf = smollm2::gguf_path();
    let mut file = std::fs::File::open(&gguf).unwrap();
    let content = candle_core::quantized::gguf_file::Content::read(&mut file).unwrap();
    let source = content.metadata["tokenizer.chat_template"].to_string().unwrap().clone();
    fixtures.push(Fixture {
        name: "SmolLM2 (GGUF)".to_owned(),
        path: gguf,
        source,
        bos_token: s("<|im_start|>"),
        eos_token: s("<|im_end|>"),
    });
    let config_path = smollm2::bf16_dir(Path::new(env!("CARGO_TARGET_TMPDIR"))).join("tokenizer_config.json");
    let config: Value = serde_json::from_slice(&std::fs::read(&config_path).unwrap()).unwrap();
    fixtures.push(Fixture {
        name: "SmolLM2 (converted tokenizer_config.json)".to_owned(),
        path: config_path,
        source: config["chat_template"].as_str().unwrap().to_owned(),
        bos_token: config["bos_token"].clone(),
        eos_token: config["eos_token"].clone(),
    });
    fixtures
}

fn message(role: &str, content: &str) -> TemplateMessage {
    TemplateMessage::new(role, content)
}

/// The conversations rendered, each with and without the generation prompt.
fn conversations() -> Vec<Vec<TemplateMessage>> {
    vec![
        vec![message("user", "Hello!")],
        vec![message("system", "You are terse."), message("user", "What is 2+2?")],
        vec![
            message("system", "  Be brief.  "),
            message("user", "Hi ünïcode 🙂"),
            message("assistant", "Hello!"),
            message("user", "2+2?"),
        ],
        vec![
            message("user", "first"),
            message("assistant", "one"),
            message("user", "second"),
            message("assistant", "two"),
        ],
        // Whitespace some templates trim and others keep; text that looks like markup.
        vec![
            message("user", "  spaced\n\nlines \t"),
            message("assistant", " padded answer \n"),
            message(
                "user",
                "{{ not a template }} {% raw %} 'single' \"double\" <b>&amp;</b> \\n",
            ),
        ],
        // Broken alternation: Mistral and Gemma refuse it with `raise_exception`.
        vec![message("user", "a"), message("user", "b")],
        vec![message("assistant", "I speak first."), message("user", "ok")],
        // A system turn alone, and two of them: Gemma refuses system turns.
        vec![message("system", "Only a system turn.")],
        vec![
            message("system", "one"),
            message("system", "two"),
            message("user", "hi"),
        ],
        vec![message("user", "")],
    ]
}

/// `transformers`' renderings of `cases` with `fixture`'s template, offering `tools`
/// (none when empty).
fn reference(python: &Path, fixture: &Fixture, cases: &[(Vec<TemplateMessage>, bool)], tools: &[Value]) -> Vec<Value> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/render_chat_template.py");
    let request = json!({
        "template": fixture.source,
        "bos_token": Fixture::text(&fixture.bos_token),
        "eos_token": Fixture::text(&fixture.eos_token),
        "tools": (!tools.is_empty()).then_some(tools),
        "cases": cases
            .iter()
            .map(|(messages, add_generation_prompt)| json!({
                "messages": messages,
                "add_generation_prompt": add_generation_prompt,
            }))
            .collect::<Vec<_>>(),
    });
    let mut child = Command::new(python)
        .arg(&script)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("run {}: {e}", python.display()));
    serde_json::to_writer(child.stdin.take().unwrap(), &request).unwrap();
    let output = child.wait_with_output().unwrap();
    assert!(
        output.status.success(),
        "{} failed on {}:\n{}",
        script.display(),
        fixture.name,
        String::from_utf8_lossy(&output.stderr)
    );
    let rendered: Vec<Value> = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(rendered.len(), cases.len());
    rendered
}

#[test]
fn real_chat_templates_render_as_transformers_renders_them() {
    let python = smollm2::vllm_python();
    let cases: Vec<(Vec<TemplateMessage>, bool)> = conversations()
        .into_iter()
        .flat_map(|messages| [(messages.clone(), true), (messages, false)])
        .collect();
    let mut problems = Vec::new();
    let (mut rendered, mut refused) = (0, 0);
    for fixture in fixtures() {
        let template = fixture.compile();
        // Rendered before and after `transformers` renders: a template that writes
        // today's date (`strftime_now`) matches one of them even across midnight.
        let before: Vec<Option<String>> = cases
            .iter()
            .map(|(m, generation)| template.render(m, *generation).ok())
            .collect();
        let expected = reference(&python, &fixture, &cases, &[]);
        for (((messages, add_generation_prompt), expected), before) in cases.iter().zip(expected).zip(before) {
            let ours = template.render(messages, *add_generation_prompt);
            let case = format!(
                "{}, add_generation_prompt {add_generation_prompt}, {:?}",
                fixture.name,
                messages.iter().map(|m| (&m.role, &m.content)).collect::<Vec<_>>()
            );
            match (&ours, expected.get("text").and_then(Value::as_str)) {
                (Ok(ours), Some(theirs)) => {
                    rendered += 1;
                    if ours != theirs && before.as_deref() != Some(theirs) {
                        problems.push(format!("{case}:\n  ours:         {ours:?}\n  transformers: {theirs:?}"));
                    }
                }
                (Ok(ours), None) => problems.push(format!(
                    "{case}: transformers refuses it ({expected}), we render {ours:?}"
                )),
                (Err(error), Some(theirs)) => problems.push(format!(
                    "{case}: transformers renders {theirs:?}, we fail: {}",
                    skein_model_registry::error_chain(error)
                )),
                (Err(error), None) => {
                    refused += 1;
                    let ours = skein_model_registry::error_chain(error);
                    // The template's own refusal reaches the client word for word.
                    if expected["kind"] == "TemplateError" {
                        let message = expected["error"].as_str().unwrap();
                        if !ours.contains(message) {
                            problems.push(format!(
                                "{case}: transformers refuses with {message:?}, our error is {ours:?}"
                            ));
                        }
                    }
                }
            }
        }
    }
    assert!(
        problems.is_empty(),
        "{} of {} renderings differ:\n{}",
        problems.len(),
        rendered + refused + problems.len(),
        problems.join("\n")
    );
    eprintln!("{rendered} renderings equal to transformers', {refused} refused by both");
    assert!(refused >= 8, "the refusals were exercised ({refused})");
}

/// OpenAI tool definitions, keys in the order clients write them.
fn tools() -> Vec<Value> {
    vec![
        json!({"type": "function", "function": {
            "name": "get_weather",
            "description": "The weather in a city, now.",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "description": "A city, e.g. Zürich"},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                },
                "required": ["city"],
            },
        }}),
        json!({"type": "function", "function": {
            "name": "get_time",
            "description": "The time in a zone.",
            "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}, "required": []},
        }}),
    ]
}

/// An assistant turn that calls `get_weather`, as the engine hands it to a template:
/// the arguments as an object, the id nine letters and digits (Mistral's demand).
fn calling() -> TemplateMessage {
    TemplateMessage {
        tool_calls: Some(vec![json!({
            "id": "abc123XYZ",
            "type": "function",
            "function": {"name": "get_weather", "arguments": {"city": "Oslo", "unit": "celsius"}},
        })]),
        ..message("assistant", "")
    }
}

fn result(content: &str) -> TemplateMessage {
    TemplateMessage {
        tool_call_id: Some("abc123XYZ".to_owned()),
        ..message("tool", content)
    }
}

#[test]
fn real_chat_templates_render_tools_calls_and_results_as_transformers_renders_them() {
    let python = smollm2::vllm_python();
    let cases: Vec<(Vec<TemplateMessage>, bool)> = vec![
        (vec![message("user", "Weather in Oslo?")], true),
        (
            vec![message("system", "You are terse."), message("user", "Weather in Oslo?")],
            true,
        ),
        (
            vec![message("user", "Weather in Oslo?"), calling(), result("{\"temp\": 3}")],
            true,
        ),
        (
            vec![
                message("system", "You are terse."),
                message("user", "Weather in Oslo?"),
                calling(),
                result("3 degrees, ünïcode <b>"),
                message("assistant", "It is 3 degrees."),
            ],
            false,
        ),
    ];
    let mut problems = Vec::new();
    let mut with_tools = 0;
    for fixture in fixtures() {
        let template = fixture.compile();
        let expected = reference(&python, &fixture, &cases, &tools());
        for ((messages, add_generation_prompt), expected) in cases.iter().zip(expected) {
            let ours = template.render_with_tools(messages, &tools(), *add_generation_prompt);
            let case = format!("{}, {} messages", fixture.name, messages.len());
            match (&ours, expected.get("text").and_then(Value::as_str)) {
                (Ok(ours), Some(theirs)) => {
                    if ours != theirs {
                        problems.push(format!("{case}:\n  ours:         {ours:?}\n  transformers: {theirs:?}"));
                    } else if ours.contains("get_time") {
                        with_tools += 1;
                    }
                }
                (Ok(ours), None) => problems.push(format!(
                    "{case}: transformers refuses it ({expected}), we render {ours:?}"
                )),
                (Err(error), Some(_)) => problems.push(format!(
                    "{case}: transformers renders it, we fail: {}",
                    skein_model_registry::error_chain(error)
                )),
                (Err(_), None) => {}
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    // Qwen2.5, Llama 3.1 and 3.2 and Mistral Nemo write the tools into the prompt.
    assert!(with_tools >= 12, "{with_tools} renderings carried the tools");
}
