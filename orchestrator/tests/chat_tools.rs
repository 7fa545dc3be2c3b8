//! Tool calls through the chat routes of a real server, with a test agent's fake engine
//! (it calls the offered tool until it is sent the tool's result, whole or streamed as
//! OpenAI streams calls): OpenAI's `/v1/chat/completions` passes `tools` and the rest to
//! the engine unchanged, answers `tool_calls` (whole and streamed) and takes the tool's
//! result back; Anthropic's `/v1/messages` does the same in Anthropic's shapes and
//! events, with the token as `x-api-key`.

mod common;

use common::{API, TOKEN, quick, setup};
use reqwest::Method;
use serde_json::{Value, json};
use skein_testkit::agent::{EngineBehaviour, TestAgent};

const MODEL: &str = "Qwen/Qwen2.5-0.5B-Instruct";

/// The data of each `data:` line of a stream, `[DONE]` left as a string.
fn data(streamed: &str) -> Vec<Value> {
    streamed
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .map(|d| serde_json::from_str(d).unwrap_or_else(|_| Value::String(d.to_owned())))
        .collect()
}

/// The `(event, data)` pairs of an Anthropic stream.
fn events(streamed: &str) -> Vec<(String, Value)> {
    streamed
        .split("\n\n")
        .filter_map(|block| {
            let name = block.lines().find_map(|l| l.strip_prefix("event: "))?;
            let data = block.lines().find_map(|l| l.strip_prefix("data: "))?;
            Some((name.to_owned(), serde_json::from_str(data).unwrap()))
        })
        .collect()
}

fn weather_tool() -> Value {
    json!({"type": "function", "function": {
        "name": "weather", "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"text": {"type": "string"}}}}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_tool_calls_round_trip_whole_and_streamed() {
    let s = setup(quick(), None).await;
    let engines = EngineBehaviour::default();
    let _a = TestAgent::join(s.server.grpc_addr, TOKEN, "node-a", 2, engines.clone()).await;
    s.wait_nodes(1).await;
    let path = "/v1/chat/completions";
    let format = json!({"type": "json_schema", "json_schema": {"name": "w", "schema": {"type": "object"}}});
    let first = json!({"model": MODEL, "messages": [{"role": "user", "content": "Paris?"}],
                       "tools": [weather_tool()], "tool_choice": "required", "parallel_tool_calls": false,
                       "response_format": format});

    // Whole: the call in OpenAI's shape; the engine saw the fields as sent.
    let (status, answer) = s.call(Method::POST, path, Some(API), Some(first.clone())).await;
    assert_eq!(status, 200, "{answer}");
    let choice = &answer["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls");
    assert!(choice["message"]["content"].is_null(), "{answer}");
    let call = &choice["message"]["tool_calls"][0];
    assert_eq!(call["type"], "function");
    assert_eq!(call["function"]["name"], "weather");
    assert_eq!(call["function"]["arguments"], r#"{"text":"Paris?"}"#);
    let sent = engines.seen.lock().unwrap().last().unwrap().1.clone();
    for field in ["tools", "tool_choice", "parallel_tool_calls", "response_format"] {
        assert_eq!(sent[field], first[field], "{field} reaches the engine unchanged");
    }

    // The tool's result goes back with the assistant's call: the final answer.
    let id = call["id"].as_str().unwrap();
    let second = json!({"model": MODEL, "tools": [weather_tool()], "messages": [
        {"role": "user", "content": "Paris?"},
        {"role": "assistant", "content": null, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": id, "content": "sunny, 21 C"}]});
    let (status, answer) = s.call(Method::POST, path, Some(API), Some(second.clone())).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["choices"][0]["message"]["content"], "echo: sunny, 21 C");
    assert_eq!(answer["choices"][0]["finish_reason"], "stop");
    let sent = engines.seen.lock().unwrap().last().unwrap().1.clone();
    assert_eq!(sent["messages"][1]["tool_calls"][0]["id"], id);
    assert_eq!(
        sent["messages"][2],
        json!({"role": "tool", "tool_call_id": id, "content": "sunny, 21 C"})
    );

    // Streamed: the call's id and name, then pieces of its arguments, as OpenAI streams.
    let mut streamed_request = first.clone();
    streamed_request["stream"] = json!(true);
    let streamed = s
        .http
        .post(s.url(path))
        .bearer_auth(API)
        .json(&streamed_request)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let chunks = data(&streamed);
    assert_eq!(chunks.last().unwrap(), "[DONE]", "{streamed}");
    let calls: Vec<&Value> = chunks
        .iter()
        .filter_map(|c| {
            c["choices"][0]["delta"]["tool_calls"][0]
                .as_object()
                .map(|_| &c["choices"][0]["delta"]["tool_calls"][0])
        })
        .collect();
    assert!(calls.len() >= 2, "{streamed}");
    assert_eq!(calls[0]["index"], 0);
    assert_eq!(calls[0]["id"], json!(format!("call_echo_{}", 1)));
    assert_eq!(calls[0]["function"]["name"], "weather");
    let arguments: String = calls
        .iter()
        .filter_map(|c| c["function"]["arguments"].as_str())
        .collect();
    assert_eq!(arguments, r#"{"text":"Paris?"}"#);
    assert!(calls[1..].iter().all(|c| c.get("id").is_none() && c["index"] == 0));
    assert!(
        chunks.iter().any(|c| c["choices"][0]["finish_reason"] == "tool_calls"),
        "{streamed}"
    );

    // Streamed final answer after the tool's result.
    let mut final_request = second;
    final_request["stream"] = json!(true);
    let streamed = s
        .http
        .post(s.url(path))
        .bearer_auth(API)
        .json(&final_request)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let text: String = data(&streamed)
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str().map(str::to_owned))
        .collect();
    assert_eq!(text, "echo: sunny, 21 C");

    // Refused with the field named: a tool message without its call id, a tool without
    // a name. (Sessions with tools: tests/sessions.rs.)
    let bad = [
        (
            json!({"model": MODEL, "messages": [{"role": "tool", "content": "x"}]}),
            "messages[0].tool_call_id",
        ),
        (
            json!({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]}),
            "tools[0].function.name",
        ),
    ];
    for (request, named) in bad {
        let (status, answer) = s.call(Method::POST, path, Some(API), Some(request)).await;
        assert_eq!(status, 400, "{answer}");
        let message = answer["error"]["message"].as_str().unwrap();
        assert!(message.contains(named), "{message}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anthropic_messages_call_tools_whole_and_streamed() {
    let s = setup(quick(), None).await;
    let engines = EngineBehaviour::default();
    let _a = TestAgent::join(s.server.grpc_addr, TOKEN, "node-a", 2, engines.clone()).await;
    s.wait_nodes(1).await;
    let tool = json!({"name": "weather", "description": "The weather in a city",
                      "input_schema": {"type": "object", "properties": {"text": {"type": "string"}}}});
    let first = json!({"model": MODEL, "max_tokens": 64, "system": "Be brief.", "tools": [tool],
                       "tool_choice": {"type": "any"}, "stop_sequences": ["END"],
                       "messages": [{"role": "user", "content": "Paris?"}]});
    let post = |body: Value| {
        s.http
            .post(s.url("/v1/messages"))
            .header("x-api-key", API)
            .header("anthropic-version", "2023-06-01")
            .json(&body)
            .send()
    };

    // Whole: a tool_use block with its input object.
    let response = post(first.clone()).await.unwrap();
    assert_eq!(response.status(), 200);
    let answer: Value = response.json().await.unwrap();
    assert_eq!(answer["type"], "message");
    assert_eq!(answer["stop_reason"], "tool_use");
    assert_eq!(answer["usage"], json!({"input_tokens": 3, "output_tokens": 5}));
    let call = &answer["content"][0];
    assert_eq!(call["type"], "tool_use");
    assert_eq!(call["name"], "weather");
    assert_eq!(call["input"], json!({"text": "Paris?"}));
    let sent = engines.seen.lock().unwrap().last().unwrap().1.clone();
    assert_eq!(sent["messages"][0], json!({"role": "system", "content": "Be brief."}));
    assert_eq!(sent["tool_choice"], "required");
    assert_eq!(sent["tools"][0]["function"]["parameters"], tool["input_schema"]);
    assert_eq!(sent["max_tokens"], 64);
    assert_eq!(sent["stop"], json!(["END"]));

    // The tool's result: the final text answer.
    let second = json!({"model": MODEL, "max_tokens": 64, "tools": [tool], "messages": [
        {"role": "user", "content": "Paris?"},
        {"role": "assistant", "content": [call]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call["id"], "content": "sunny"}]}]});
    let answer: Value = post(second.clone()).await.unwrap().json().await.unwrap();
    assert_eq!(answer["stop_reason"], "end_turn", "{answer}");
    assert_eq!(answer["content"], json!([{"type": "text", "text": "echo: sunny"}]));

    // Streamed: Anthropic's events, the call's input in input_json_delta pieces.
    let mut streamed_request = first;
    streamed_request["stream"] = json!(true);
    let streamed = post(streamed_request).await.unwrap().text().await.unwrap();
    let events = events(&streamed);
    let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names.first(), Some(&"message_start"), "{streamed}");
    assert_eq!(
        &names[names.len() - 3..],
        ["content_block_stop", "message_delta", "message_stop"]
    );
    let start = events.iter().find(|(n, _)| n == "content_block_start").unwrap();
    assert_eq!(start.1["content_block"]["type"], "tool_use");
    assert_eq!(start.1["content_block"]["name"], "weather");
    let json: String = events
        .iter()
        .filter(|(n, _)| n == "content_block_delta")
        .map(|(_, d)| d["delta"]["partial_json"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(serde_json::from_str::<Value>(&json).unwrap(), json!({"text": "Paris?"}));
    let delta = &events[events.len() - 2].1;
    assert_eq!(delta["delta"]["stop_reason"], "tool_use");

    let mut streamed_request = second;
    streamed_request["stream"] = json!(true);
    let streamed = post(streamed_request).await.unwrap().text().await.unwrap();
    let text: String = self::events(&streamed)
        .iter()
        .filter(|(n, _)| n == "content_block_delta")
        .map(|(_, d)| d["delta"]["text"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(text, "echo: sunny");

    // Errors in Anthropic's shape.
    let response = post(json!({"model": MODEL, "messages": [{"role": "user", "content": "x"}]}))
        .await
        .unwrap();
    assert_eq!(response.status(), 400);
    let error: Value = response.json().await.unwrap();
    assert_eq!(error["type"], "error");
    assert_eq!(error["error"]["type"], "invalid_request_error");
    assert!(error["error"]["message"].as_str().unwrap().contains("max_tokens"));
    let unauthorized = s
        .http
        .post(s.url("/v1/messages"))
        .header("x-api-key", "wrong")
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(unauthorized.status(), 401);
    // Other routes do not take x-api-key.
    let elsewhere = s
        .http
        .get(s.url("/v1/models"))
        .header("x-api-key", API)
        .send()
        .await
        .unwrap();
    assert_eq!(elsewhere.status(), 401);
}
