//! Constrained sampling and tool calls on the tiny generated Llama, whose random
//! weights never write JSON or tool calls on their own: `response_format` must give
//! JSON valid against its schema for every schema and seed (checked with the
//! `jsonschema` crate), a forced call must come back parsed in each family's format
//! (the tiny model given the real Qwen2.5, Llama 3.1 and Mistral Nemo templates), and
//! the HTTP routes carry both.

use std::path::{Path, PathBuf};

use serde_json::{Value, json};
use skein_inference::{
    DeviceSpec, Engine, FinishReason, GenerationRequest, ResponseFormat, ServeConfig, TemplateMessage, ToolFormat,
};
use skein_testkit::tiny_llama;

fn tiny_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    tiny_llama::write_dir(dir.path()).unwrap();
    dir
}

/// The tiny model with the chat template of fixture `file` in its
/// `tokenizer_config.json`, and a longer context.
fn tiny_with_template(file: &str) -> tempfile::TempDir {
    let dir = tiny_dir();
    let source = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/data/chat_templates")
            .join(file),
    )
    .unwrap();
    let path = dir.path().join("tokenizer_config.json");
    let mut config: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    config["chat_template"] = json!(source);
    std::fs::write(&path, serde_json::to_vec(&config).unwrap()).unwrap();
    // The real templates' tool prompts are long for the tiny model's 512 positions;
    // its rotary embeddings are computed for any length.
    let path = dir.path().join("config.json");
    let mut config: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    config["max_position_embeddings"] = json!(2048);
    std::fs::write(&path, serde_json::to_vec(&config).unwrap()).unwrap();
    dir
}

fn ask(text: &str, seed: u64) -> GenerationRequest {
    GenerationRequest {
        max_tokens: Some(160),
        temperature: Some(1.0),
        ..GenerationRequest::new(vec![TemplateMessage::new("user", text)], seed)
    }
}

/// Schemas whose valid documents are short (bounded strings, arrays and numbers), so
/// that a random model reaches the end within `max_tokens`.
fn schemas() -> Vec<Value> {
    vec![
        json!({
            "type": "object",
            "properties": {
                "title": {"type": "string", "maxLength": 12},
                "year": {"type": "integer", "minimum": 1900, "maximum": 2100},
            },
            "required": ["title", "year"],
            "additionalProperties": false,
        }),
        json!({
            "type": "object",
            "properties": {
                "tags": {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "minItems": 1, "maxItems": 3},
                "done": {"type": "boolean"},
            },
            "required": ["tags", "done"],
            "additionalProperties": false,
        }),
        json!({
            "type": "array",
            "items": {"type": "integer", "minimum": 0, "maximum": 99},
            "minItems": 2,
            "maxItems": 4,
        }),
        json!({"enum": ["yes", "no", 3]}),
        json!({
            "type": "object",
            "properties": {
                "point": {
                    "type": "object",
                    "properties": {"x": {"type": "number", "minimum": -1, "maximum": 1}, "label": {"type": "string", "pattern": "^[a-z]{1,5}$"}},
                    "required": ["x", "label"],
                    "additionalProperties": false,
                },
            },
            "required": ["point"],
            "additionalProperties": false,
        }),
    ]
}

fn valid(schema: &Value, text: &str) -> Result<(), String> {
    let document: Value = serde_json::from_str(text).map_err(|e| format!("not JSON ({e}): {text:?}"))?;
    let validator = jsonschema::validator_for(schema).unwrap();
    let errors: Vec<String> = validator.iter_errors(&document).map(|e| e.to_string()).collect();
    if errors.is_empty() {
        Ok(())
    } else {
        Err(format!("{text:?} is invalid: {}", errors.join("; ")))
    }
}

#[test]
fn a_json_schema_response_format_gives_valid_json_for_every_schema_and_seed() {
    let dir = tiny_dir();
    let mut engine = Engine::load(dir.path(), &candle_core::Device::Cpu).unwrap();
    let mut problems = Vec::new();
    let mut unconstrained_valid = 0;
    for (index, schema) in schemas().into_iter().enumerate() {
        for seed in 0..4 {
            let request = GenerationRequest {
                response_format: ResponseFormat::JsonSchema(schema.clone()),
                ..ask("Answer in JSON.", seed)
            };
            let mut pieces = String::new();
            let completion = engine.generate(&request, |p| pieces.push_str(p)).unwrap();
            assert_eq!(pieces, completion.text, "the streamed pieces are the text");
            assert_eq!(
                completion.finish_reason,
                FinishReason::Stop,
                "schema {index}, seed {seed}: {completion:?}"
            );
            if let Err(problem) = valid(&schema, &completion.text) {
                problems.push(format!("schema {index}, seed {seed}: {problem}"));
            }
            let same = engine.generate(&request, |_| {}).unwrap();
            assert_eq!(same, completion, "constrained sampling is deterministic");
            // The same request unconstrained: the random model writes no valid JSON.
            let free = engine.generate(&ask("Answer in JSON.", seed), |_| {}).unwrap();
            if valid(&schema, &free.text).is_ok() {
                unconstrained_valid += 1;
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    assert_eq!(
        unconstrained_valid, 0,
        "without the constraint the model writes no valid JSON"
    );
}

#[test]
fn a_json_object_response_format_gives_an_object() {
    let dir = tiny_dir();
    let mut engine = Engine::load(dir.path(), &candle_core::Device::Cpu).unwrap();
    let mut ended = 0;
    for seed in 0..6 {
        let request = GenerationRequest {
            response_format: ResponseFormat::JsonObject,
            max_tokens: Some(96),
            ..ask("Answer in JSON.", seed)
        };
        let completion = engine.generate(&request, |_| {}).unwrap();
        match completion.finish_reason {
            // Any object is allowed, so a random model may still be writing one.
            FinishReason::Length => {
                assert!(completion.text.starts_with('{'), "{completion:?}");
            }
            _ => {
                ended += 1;
                let value: Value = serde_json::from_str(&completion.text)
                    .unwrap_or_else(|e| panic!("seed {seed}: {e}: {:?}", completion.text));
                assert!(value.is_object(), "seed {seed}: {value}");
            }
        }
    }
    assert!(ended > 0, "some object was finished");
}

#[test]
fn a_schema_that_does_not_compile_is_a_grammar_error() {
    let dir = tiny_dir();
    let mut engine = Engine::load(dir.path(), &candle_core::Device::Cpu).unwrap();
    let request = GenerationRequest {
        response_format: ResponseFormat::JsonSchema(json!({"type": "string", "minLength": 5, "maxLength": 2})),
        ..ask("x", 0)
    };
    let error = engine.generate(&request, |_| {}).unwrap_err();
    assert!(matches!(error, skein_inference::Error::Grammar { .. }), "{error:?}");
}

fn weather_tools() -> Vec<Value> {
    vec![
        json!({"type": "function", "function": {
            "name": "get_weather",
            "description": "The weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "maxLength": 10},
                    "unit": {"enum": ["celsius", "fahrenheit"]},
                },
                "required": ["city", "unit"],
                "additionalProperties": false,
            },
        }}),
        json!({"type": "function", "function": {
            "name": "get_time",
            "parameters": {
                "type": "object",
                "properties": {"zone": {"enum": ["UTC", "CET"]}},
                "required": ["zone"],
                "additionalProperties": false,
            },
        }}),
    ]
}

#[test]
fn the_tiny_chatml_model_cannot_call_tools() {
    let dir = tiny_dir();
    let mut engine = Engine::load(dir.path(), &candle_core::Device::Cpu).unwrap();
    assert_eq!(engine.tool_format(), None);
    let request = GenerationRequest {
        tools: weather_tools(),
        ..ask("Weather?", 0)
    };
    let error = engine.generate(&request, |_| {}).unwrap_err();
    assert!(matches!(error, skein_inference::Error::CannotCallTools), "{error:?}");
}

#[test]
fn a_forced_call_comes_back_parsed_in_each_familys_format() {
    let cases = [
        ("Qwen-Qwen2.5-7B-Instruct.jinja", ToolFormat::Hermes),
        ("meta-llama-Llama-3.1-8B-Instruct.jinja", ToolFormat::Llama3Json),
        ("mistralai-Mistral-Nemo-Instruct-2407.jinja", ToolFormat::Mistral),
    ];
    let tools = weather_tools();
    for (template, format) in cases {
        let dir = tiny_with_template(template);
        let mut engine = Engine::load(dir.path(), &candle_core::Device::Cpu).unwrap();
        assert_eq!(engine.tool_format(), Some(format), "{template}");
        let prompt = engine
            .render_prompt_with_tools(&[TemplateMessage::new("user", "Weather in Oslo?")], &tools)
            .unwrap();
        assert!(prompt.contains("get_weather"), "{template} renders the tools: {prompt}");
        for seed in 0..3 {
            let request = GenerationRequest {
                tools: tools.clone(),
                force_tool_call: true,
                ..ask("Weather in Oslo?", seed)
            };
            let mut streamed = String::new();
            let completion = engine.generate(&request, |p| streamed.push_str(p)).unwrap();
            assert_eq!(streamed, completion.text);
            assert_eq!(
                completion.finish_reason,
                FinishReason::ToolCalls,
                "{template}, seed {seed}: {completion:?}"
            );
            assert_eq!(completion.tool_calls.len(), 1, "{completion:?}");
            let call = &completion.tool_calls[0];
            let tool = tools
                .iter()
                .find(|t| t["function"]["name"] == call.name.as_str())
                .unwrap_or_else(|| panic!("{template}: unknown function {:?}", call.name));
            valid(&tool["function"]["parameters"], &call.arguments)
                .unwrap_or_else(|e| panic!("{template}, seed {seed}: {e}"));
            assert_eq!(completion.text, "", "{template}: a forced call has no text around it");
        }
        // Unforced, the random model writes no call: its text comes back as text.
        let free = engine
            .generate(
                &GenerationRequest {
                    tools: tools.clone(),
                    ..ask("Weather in Oslo?", 0)
                },
                |_| {},
            )
            .unwrap();
        assert!(free.tool_calls.is_empty(), "{template}: {free:?}");
    }
}

async fn start(model: PathBuf) -> skein_inference::RunningEngine {
    let mut engine = skein_inference::serve(ServeConfig {
        model,
        served_name: "tiny".to_owned(),
        listen: "127.0.0.1:0".parse().unwrap(),
        seed: 0,
        device: DeviceSpec::Cpu,
        api_key: None,
    })
    .await
    .unwrap();
    engine.loaded().await.unwrap();
    engine
}

fn sse_data(body: &str) -> Vec<Value> {
    body.lines()
        .filter_map(|line| line.strip_prefix("data: "))
        .filter(|data| *data != "[DONE]")
        .map(|data| serde_json::from_str(data).unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_http_tools_and_response_formats_reach_the_engine() {
    let http = reqwest::Client::new();
    let post = |base: String, body: Value| {
        let http = http.clone();
        async move {
            http.post(format!("{base}/v1/chat/completions"))
                .json(&body)
                .send()
                .await
                .unwrap()
        }
    };

    // A model that cannot call tools refuses a request with tools, and says why.
    let plain = tiny_dir();
    let engine = start(plain.path().to_path_buf()).await;
    let base = format!("http://{}", engine.local_addr());
    let with_tools = json!({
        "model": "tiny",
        "messages": [{"role": "user", "content": "Weather?"}],
        "tools": weather_tools(),
        "max_tokens": 8,
    });
    let refused = post(base.clone(), with_tools.clone()).await;
    assert_eq!(refused.status(), 400);
    let body: Value = refused.json().await.unwrap();
    assert_eq!(body["error"]["code"], "tools_unsupported");
    assert!(
        body["error"]["message"].as_str().unwrap().contains("cannot call tools"),
        "{body}"
    );
    // `tool_choice: "none"` takes the tools away: answered.
    let mut none = with_tools.clone();
    none["tool_choice"] = json!("none");
    assert_eq!(post(base.clone(), none).await.status(), 200);

    // A JSON schema response format, whole and streamed.
    let schema = schemas().remove(0);
    let structured = json!({
        "model": "tiny",
        "messages": [{"role": "user", "content": "A film, in JSON."}],
        "max_tokens": 160,
        "seed": 5,
        "response_format": {"type": "json_schema", "json_schema": {"name": "film", "schema": schema}},
    });
    let whole: Value = post(base.clone(), structured.clone()).await.json().await.unwrap();
    let text = whole["choices"][0]["message"]["content"].as_str().unwrap();
    valid(&schema, text).unwrap();
    assert_eq!(whole["choices"][0]["finish_reason"], "stop");
    let mut streaming = structured.clone();
    streaming["stream"] = json!(true);
    let chunks = sse_data(&post(base.clone(), streaming).await.text().await.unwrap());
    let streamed: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(streamed, text);
    // A malformed response format is the client's fault.
    let mut bad = structured.clone();
    bad["response_format"] = json!({"type": "json_schema", "json_schema": {"name": "x"}});
    assert_eq!(post(base.clone(), bad).await.status(), 400);
    engine.stop().await;

    // A model with Qwen2.5's template: a required call comes back as OpenAI's
    // `tool_calls`, whole and streamed; a named function is the one called.
    let qwen = tiny_with_template("Qwen-Qwen2.5-7B-Instruct.jinja");
    let engine = start(qwen.path().to_path_buf()).await;
    let base = format!("http://{}", engine.local_addr());
    let mut required = with_tools.clone();
    required["tool_choice"] = json!({"type": "function", "function": {"name": "get_time"}});
    required["max_tokens"] = json!(160);
    required["seed"] = json!(3);
    let whole: Value = post(base.clone(), required.clone()).await.json().await.unwrap();
    let choice = &whole["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{whole}");
    assert_eq!(choice["message"]["content"], Value::Null, "{whole}");
    let call = &choice["message"]["tool_calls"][0];
    assert_eq!(call["type"], "function");
    assert_eq!(call["function"]["name"], "get_time");
    assert_eq!(call["id"].as_str().unwrap().len(), 9);
    let arguments: Value = serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
    assert!(
        ["UTC", "CET"].contains(&arguments["zone"].as_str().unwrap()),
        "{arguments}"
    );

    let mut streaming = required.clone();
    streaming["stream"] = json!(true);
    let chunks = sse_data(&post(base.clone(), streaming).await.text().await.unwrap());
    let deltas: Vec<&Value> = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["tool_calls"].get(0))
        .collect();
    assert_eq!(deltas.len(), 1, "{chunks:?}");
    // Another completion, so another id; the same call.
    assert_eq!(deltas[0]["id"].as_str().unwrap().len(), 9);
    assert_eq!(deltas[0]["type"], "function");
    assert_eq!(deltas[0]["function"]["name"], "get_time");
    assert_eq!(deltas[0]["function"]["arguments"], call["function"]["arguments"]);
    let finish: Vec<&Value> = chunks
        .iter()
        .filter_map(|c| {
            c["choices"][0]["finish_reason"]
                .as_str()
                .map(|_| &c["choices"][0]["finish_reason"])
        })
        .collect();
    assert_eq!(finish, [&json!("tool_calls")]);

    // The call and its result go back through the template on the next turn.
    let next = json!({
        "model": "tiny",
        "messages": [
            {"role": "user", "content": "Time?"},
            {"role": "assistant", "content": null, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": call["id"], "content": "12:00"},
        ],
        "tools": weather_tools(),
        "max_tokens": 4,
    });
    let answered = post(base.clone(), next).await;
    assert_eq!(answered.status(), 200);
    // A named function the request does not offer is refused.
    let mut unknown = required.clone();
    unknown["tool_choice"] = json!({"type": "function", "function": {"name": "nope"}});
    assert_eq!(post(base.clone(), unknown).await.status(), 400);
    engine.stop().await;
}
