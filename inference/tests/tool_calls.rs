//! Tool-call formats: which one each real chat template (and model type) gets, and the
//! calls parsed out of fixed answers in each, as OpenAI's `tool_calls` want them.

use std::path::Path;

use serde_json::{Value, json};
use skein_inference::{ParsedAnswer, ParsedCall, ToolFormat};

fn template(file: &str) -> String {
    std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/data/chat_templates")
            .join(file),
    )
    .unwrap()
}

fn call(name: &str, arguments: Value) -> ParsedCall {
    ParsedCall {
        name: name.to_owned(),
        arguments: arguments.to_string(),
    }
}

fn answer(content: &str, calls: Vec<ParsedCall>) -> ParsedAnswer {
    ParsedAnswer {
        content: content.to_owned(),
        calls,
    }
}

/// An answer without calls: the text, whole.
fn text(content: &str) -> ParsedAnswer {
    answer(content, Vec::new())
}

#[test]
fn each_real_template_gets_its_familys_format_or_none() {
    let cases = [
        ("Qwen-Qwen2.5-7B-Instruct.jinja", "qwen2", Some(ToolFormat::Hermes)),
        (
            "meta-llama-Llama-3.1-8B-Instruct.jinja",
            "llama",
            Some(ToolFormat::Llama3Json),
        ),
        (
            "meta-llama-Llama-3.2-3B-Instruct.jinja",
            "llama",
            Some(ToolFormat::Llama3Json),
        ),
        (
            "mistralai-Mistral-Nemo-Instruct-2407.jinja",
            "mistral",
            Some(ToolFormat::Mistral),
        ),
        // Templates that take no tools: whatever the model type, no tools.
        ("google-gemma-2-2b-it.jinja", "gemma2", None),
        ("microsoft-Phi-3.5-mini-instruct.jinja", "phi3", None),
        ("google-gemma-2-2b-it.jinja", "qwen2", None),
    ];
    for (file, model_type, expected) in cases {
        assert_eq!(
            ToolFormat::of(model_type, &template(file)),
            expected,
            "{file} as {model_type}"
        );
    }
    // The tiny test model's ChatML template takes no tools.
    assert_eq!(ToolFormat::of("llama", skein_testkit::tiny_llama::CHAT_TEMPLATE), None);
    // A template that takes tools without a known marker: the model type decides.
    let generic = "{% if tools %}{{ tools | tojson }}{% endif %}{% for m in messages %}{{ m.content }}{% endfor %}";
    assert_eq!(ToolFormat::of("qwen2", generic), Some(ToolFormat::Hermes));
    assert_eq!(ToolFormat::of("Mixtral", generic), Some(ToolFormat::Mistral));
    assert_eq!(ToolFormat::of("llama", generic), Some(ToolFormat::Llama3Json));
    assert_eq!(ToolFormat::of("gpt2", generic), None);
    assert_eq!(ToolFormat::Hermes.name(), "hermes");
    assert_eq!(ToolFormat::Llama3Json.name(), "llama3_json");
    assert_eq!(ToolFormat::Mistral.name(), "mistral");
}

#[test]
fn hermes_calls_are_read_between_their_tags() {
    let parse = |t: &str| ToolFormat::Hermes.parse(t);
    assert_eq!(
        parse("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>"),
        answer("", vec![call("get_weather", json!({"city": "Oslo"}))])
    );
    // Text before, two calls (parallel), the last one without its closing tag (the
    // end-of-sequence token came first).
    assert_eq!(
        parse(
            "Let me check.\n<tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n</tool_call>\n\
             <tool_call>\n{\"name\": \"b\", \"arguments\": {\"n\": [1, 2], \"s\": \"ü <x>\"}}"
        ),
        answer(
            "Let me check.",
            vec![call("a", json!({})), call("b", json!({"n": [1, 2], "s": "ü <x>"}))]
        )
    );
    // Arguments written as JSON text are read as the object they hold.
    assert_eq!(
        parse("<tool_call>{\"name\": \"a\", \"arguments\": \"{\\\"x\\\": 1}\"}</tool_call>"),
        answer("", vec![call("a", json!({"x": 1}))])
    );
    // Broken markup stays text: a call cut short, arguments that are not an object,
    // no name, no call at all.
    for broken in [
        "<tool_call>\n{\"name\": \"a\", \"argu",
        "<tool_call>{\"name\": \"a\", \"arguments\": [1]}</tool_call>",
        "<tool_call>{\"arguments\": {}}</tool_call>",
        "It is sunny in Oslo.",
    ] {
        assert_eq!(parse(broken), text(broken), "{broken:?}");
    }
}

#[test]
fn llama3_calls_are_json_objects_with_parameters() {
    let parse = |t: &str| ToolFormat::Llama3Json.parse(t);
    assert_eq!(
        parse("{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\", \"unit\": \"celsius\"}}"),
        answer(
            "",
            vec![call("get_weather", json!({"city": "Oslo", "unit": "celsius"}))]
        )
    );
    assert_eq!(
        parse("<|python_tag|>{\"name\": \"a\", \"parameters\": {}}; {\"name\": \"b\", \"arguments\": {\"x\": 1}}"),
        answer("", vec![call("a", json!({})), call("b", json!({"x": 1}))])
    );
    assert_eq!(
        parse("  {\"name\": \"a\", \"parameters\": {\"q\": \"x\"}}\n"),
        answer("", vec![call("a", json!({"q": "x"}))])
    );
    for plain in [
        "The weather is fine.",
        "{\"name\": \"a\", \"parameters\": {}} and then some text",
        "{\"title\": \"not a call\"}",
        "{\"name\": \"a\", \"parameters\": {\"cut",
    ] {
        assert_eq!(parse(plain), text(plain), "{plain:?}");
    }
}

#[test]
fn mistral_calls_follow_their_marker() {
    let parse = |t: &str| ToolFormat::Mistral.parse(t);
    assert_eq!(
        parse("[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}]"),
        answer("", vec![call("get_weather", json!({"city": "Oslo"}))])
    );
    assert_eq!(
        parse(
            "Checking. [TOOL_CALLS] [{\"name\": \"a\", \"arguments\": {}}, {\"name\": \"b\", \"arguments\": {\"x\": true}, \"id\": \"abc123XYZ\"}]"
        ),
        answer("Checking.", vec![call("a", json!({})), call("b", json!({"x": true}))])
    );
    // The newer tokenizers' form: one marker per call, name then `[ARGS]`.
    assert_eq!(
        parse("[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Oslo\"}[TOOL_CALLS]get_time[CALL_ID]abc123XYZ[ARGS]{}"),
        answer(
            "",
            vec![
                call("get_weather", json!({"city": "Oslo"})),
                call("get_time", json!({}))
            ]
        )
    );
    for plain in [
        "No tools needed.",
        "[TOOL_CALLS][{\"name\": \"a\", \"arguments\": {\"cut",
        "[TOOL_CALLS]",
    ] {
        assert_eq!(parse(plain), text(plain), "{plain:?}");
    }
}
