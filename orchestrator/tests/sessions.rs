//! Sessions over REST in a real server, with test agents at the edge (simulated GPUs,
//! in-process OpenAI fakes that record what they were sent): create, chat, idempotent
//! retries, streaming, a move between GPUs mid-conversation with the whole history
//! served by the new instance, isolation between users; a session driven by an OpenAI
//! client's tool loop, its tool calls and results stored, retried, streamed and moved.

mod common;

use common::{API, TOKEN, quick, setup};
use reqwest::Method;
use serde_json::{Value, json};
use skein_testkit::agent::{EngineBehaviour, TestAgent};

const MODEL: &str = "Qwen/Qwen2.5-0.5B-Instruct";

/// The server-sent events of a streamed answer: `(event, data)`.
fn events(text: &str) -> Vec<(String, Value)> {
    text.split("\n\n")
        .filter_map(|block| {
            let mut event = None;
            let mut data = String::new();
            for line in block.lines() {
                if let Some(name) = line.strip_prefix("event:") {
                    event = Some(name.trim().to_owned());
                } else if let Some(d) = line.strip_prefix("data:") {
                    data.push_str(d.trim());
                }
            }
            Some((event?, serde_json::from_str(&data).unwrap_or(Value::Null)))
        })
        .collect()
}

/// The chunks of a streamed OpenAI completion, which must end in `[DONE]` (left out),
/// and the text their deltas carry.
fn openai_chunks(streamed: &str) -> (Vec<Value>, String) {
    let data: Vec<&str> = streamed.lines().filter_map(|l| l.strip_prefix("data: ")).collect();
    assert_eq!(data.last(), Some(&"[DONE]"), "{streamed}");
    let chunks: Vec<Value> = data[..data.len() - 1]
        .iter()
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    let text = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    (chunks, text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_chats_moves_to_another_gpu_mid_conversation_and_keeps_its_history() {
    let s = setup(quick(), None).await;
    let engines = EngineBehaviour::default();
    let _a = TestAgent::join(s.server.grpc_addr, TOKEN, "node-a", 2, engines.clone()).await;
    let _b = TestAgent::join(s.server.grpc_addr, TOKEN, "node-b", 2, engines.clone()).await;
    s.wait_nodes(2).await;
    let ada = s.token_for("ada").await;
    let bob = s.token_for("bob").await;

    let (status, session) = s
        .call(
            Method::POST,
            "/v1/sessions",
            Some(&ada),
            Some(json!({"model": MODEL, "system": "Be brief.", "metadata": {"topic": "gpus"}})),
        )
        .await;
    assert_eq!(status, 201, "{session}");
    let id = session["id"].as_str().unwrap().to_owned();
    assert_eq!(session["owner"], "ada");
    assert!(session["binding"].is_null(), "placed at the first message");
    let turn = |content: &str| json!({ "content": content });
    let messages_path = format!("/v1/sessions/{id}/messages");

    // The first turn places an instance and binds the session to it.
    let (status, first) = s
        .call(Method::POST, &messages_path, Some(&ada), Some(turn("hello")))
        .await;
    assert_eq!(status, 200, "{first}");
    assert_eq!(first["message"]["content"], "echo: hello");
    assert_eq!(first["message"]["seq"], 1);
    let before = first["session"]["binding"].clone();
    assert!(before["instance"].is_string(), "{first}");

    // A retried turn (same Idempotency-Key) writes nothing and answers the same.
    let keyed = |key: &str, content: &str| {
        s.http
            .post(s.url(&messages_path))
            .bearer_auth(&ada)
            .header("Idempotency-Key", key)
            .json(&turn(content))
            .send()
    };
    let once: Value = keyed("k-2", "second").await.unwrap().json().await.unwrap();
    let twice: Value = keyed("k-2", "second").await.unwrap().json().await.unwrap();
    assert_eq!(once["replayed"], false);
    assert_eq!(twice["replayed"], true);
    assert_eq!(once["message"], twice["message"]);
    let requests = engines.seen.lock().unwrap().len();
    assert_eq!(requests, 2, "the replay did not reach the engine");

    // Move it to a GPU of the other node.
    let other = if before["node"] == "node-a" { "node-b" } else { "node-a" };
    let asked = std::time::Instant::now();
    let (status, moved) = s
        .call(
            Method::POST,
            &format!("/v1/sessions/{id}/migrate"),
            Some(&ada),
            Some(json!({"to": {"node": other, "gpu": 1}})),
        )
        .await;
    assert_eq!(status, 200, "{moved}");
    assert_eq!(moved["from"], before);
    assert_eq!(moved["to"]["node"], other);
    assert_eq!(moved["to"]["gpus"], json!([1]));
    assert_eq!(moved["session"]["migrations"], 1);
    // The downtime is measured within the move: no longer than the call that made it.
    let downtime = moved["downtime_ms"].as_f64().expect("downtime_ms");
    assert!(
        (0.0..=asked.elapsed().as_secs_f64() * 1000.0).contains(&downtime),
        "{moved:#}"
    );

    // The next turn is served there, with the whole history.
    let (status, third) = s
        .call(Method::POST, &messages_path, Some(&ada), Some(turn("third")))
        .await;
    assert_eq!(status, 200, "{third}");
    assert_eq!(third["message"]["instance"], moved["to"]["instance"]);
    let (_, instances) = s.call(Method::GET, "/v1/instances", Some(API), None).await;
    let new_url = instances
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["name"] == moved["to"]["instance"])
        .unwrap()["base_url"]
        .clone();
    let (url, body) = engines.seen.lock().unwrap().last().cloned().unwrap();
    assert_eq!(json!(url), new_url, "served by the new instance");
    let sent: Vec<(String, String)> = body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["role"].as_str().unwrap().to_owned(),
                m["content"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    let expected = [
        ("system", "Be brief."),
        ("user", "hello"),
        ("assistant", "echo: hello"),
        ("user", "second"),
        ("assistant", "echo: second"),
        ("user", "third"),
    ];
    assert_eq!(
        sent,
        expected.map(|(r, c)| (r.to_owned(), c.to_owned())),
        "the full history, in order, once"
    );

    // Streaming: tokens as generated, then the stored message.
    let streamed = s
        .http
        .post(s.url(&messages_path))
        .bearer_auth(&ada)
        .json(&json!({"content": "stream this please", "stream": true}))
        .send()
        .await
        .unwrap();
    assert_eq!(streamed.status(), 200);
    let events = events(&streamed.text().await.unwrap());
    let tokens: String = events
        .iter()
        .filter(|(e, _)| e == "token")
        .map(|(_, d)| d["delta"].as_str().unwrap())
        .collect();
    assert!(events.iter().filter(|(e, _)| e == "token").count() > 1, "{events:?}");
    let (last, message) = events.last().unwrap();
    assert_eq!(last, "message");
    assert_eq!(tokens, "echo: stream this please");
    assert_eq!(message["message"]["content"], tokens);

    // The history as stored: every message once, in order.
    let (_, history) = s.call(Method::GET, &messages_path, Some(&ada), None).await;
    let seqs: Vec<u64> = history["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["seq"].as_u64().unwrap())
        .collect();
    assert_eq!(seqs, (0..8).collect::<Vec<_>>());

    // Another user sees nothing of it; no token, no answer.
    for (method, path) in [
        (Method::GET, format!("/v1/sessions/{id}")),
        (Method::GET, messages_path.clone()),
        (Method::POST, format!("/v1/sessions/{id}/migrate")),
        (Method::DELETE, format!("/v1/sessions/{id}")),
    ] {
        let body = (method == Method::POST).then(|| json!({"to": "auto"}));
        let (status, answer) = s.call(method, &path, Some(&bob), body).await;
        assert_eq!(status, 404, "{path}: {answer}");
    }
    let (status, turn_answer) = s
        .call(Method::POST, &messages_path, Some(&bob), Some(turn("mine?")))
        .await;
    assert_eq!(status, 404, "{turn_answer}");
    let (_, listed) = s.call(Method::GET, "/v1/sessions", Some(&bob), None).await;
    assert_eq!(listed["data"], json!([]));
    let (_, listed) = s.call(Method::GET, "/v1/sessions", Some(API), None).await;
    assert_eq!(listed["data"].as_array().unwrap().len(), 1, "the admin sees all");
    let (status, _) = s.call(Method::GET, "/v1/sessions", None, None).await;
    assert_eq!(status, 401);

    // `auto` moves it off its GPU; then it is deleted with its messages.
    let (status, auto) = s
        .call(
            Method::POST,
            &format!("/v1/sessions/{id}/migrate"),
            Some(&ada),
            Some(json!({"to": "auto"})),
        )
        .await;
    assert_eq!(status, 200, "{auto}");
    assert_ne!(
        (&auto["to"]["node"], &auto["to"]["gpus"]),
        (&moved["to"]["node"], &moved["to"]["gpus"])
    );
    let (status, _) = s
        .call(Method::DELETE, &format!("/v1/sessions/{id}"), Some(&ada), None)
        .await;
    assert_eq!(status, 204);
    let (status, _) = s
        .call(Method::GET, &format!("/v1/sessions/{id}"), Some(&ada), None)
        .await;
    assert_eq!(status, 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_session_requests_say_what_is_wrong() {
    let s = setup(quick(), None).await;
    let cases = [
        (json!({}), 400, "give either `model`"),
        (json!({"model": MODEL, "agent": "a"}), 400, "not both"),
        (json!({"agent": "coder"}), 404, "none of your runs has an agent `coder`"),
        (json!({"agent": "coder", "run": "r-nope"}), 404, "no run `r-nope`"),
        (json!({"model": "not a repo"}), 400, "owner/name"),
        (json!({"modle": MODEL}), 400, "unknown field `modle`"),
    ];
    for (body, status, needle) in cases {
        let (got, answer) = s
            .call(Method::POST, "/v1/sessions", Some(API), Some(body.clone()))
            .await;
        assert_eq!(got, status, "{body} → {answer}");
        let message = answer["error"]["message"].as_str().unwrap();
        assert!(message.contains(needle), "{body} → {message}");
    }
    // No agent has joined: the first turn cannot be placed, and says so with a
    // Retry-After, and the user's message is kept.
    let (_, session) = s
        .call(Method::POST, "/v1/sessions", Some(API), Some(json!({"model": MODEL})))
        .await;
    let id = session["id"].as_str().unwrap();
    let response = s
        .http
        .post(s.url(&format!("/v1/sessions/{id}/messages")))
        .bearer_auth(API)
        .json(&json!({"content": "anyone?"}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 503);
    assert!(response.headers().get("retry-after").is_some());
    let (_, history) = s
        .call(Method::GET, &format!("/v1/sessions/{id}/messages"), Some(API), None)
        .await;
    assert_eq!(history["data"][0]["content"], "anyone?");
    let (status, answer) = s
        .call(
            Method::POST,
            &format!("/v1/sessions/{id}/messages"),
            Some(API),
            Some(json!({"messages": [{"role": "assistant", "content": "I said"}]})),
        )
        .await;
    assert_eq!(status, 400, "{answer}");
    let (status, answer) = s
        .call(
            Method::POST,
            &format!("/v1/sessions/{id}/migrate"),
            Some(API),
            Some(json!({"to": "there"})),
        )
        .await;
    assert_eq!(status, 400, "{answer}");
    // A move with nowhere to go is a conflict; to a place the fleet lacks, not found;
    // either way the session stays as it was.
    let cases = [
        (json!("auto"), 409, "no_room"),
        (json!({"node": "nowhere"}), 404, "not_found"),
        (json!({"node": "x", "gpu": 0, "extra": 1}), 400, "bad_request"),
    ];
    for (to, status, code) in cases {
        let (got, answer) = s
            .call(
                Method::POST,
                &format!("/v1/sessions/{id}/migrate"),
                Some(API),
                Some(json!({ "to": to })),
            )
            .await;
        assert_eq!(
            (got, answer["error"]["code"].as_str()),
            (status, Some(code)),
            "{to} → {answer}"
        );
    }
    let (_, after) = s
        .call(Method::GET, &format!("/v1/sessions/{id}"), Some(API), None)
        .await;
    assert_eq!(after["migrations"], 0, "{after}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openai_routes_serve_agents_models_and_sessions() {
    let s = setup(quick(), None).await;
    let engines = EngineBehaviour::default();
    let _a = TestAgent::join(s.server.grpc_addr, TOKEN, "node-a", 2, engines.clone()).await;
    s.wait_nodes(1).await;
    let ada = s.token_for("ada").await;
    let completions = "/v1/chat/completions";

    // A model by its hub id: an instance is placed for it.
    let request = json!({"model": MODEL, "messages": [{"role": "user", "content": "hi there"}]});
    let (status, answer) = s.call(Method::POST, completions, Some(&ada), Some(request)).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["object"], "chat.completion");
    assert_eq!(answer["model"], MODEL);
    assert_eq!(answer["choices"][0]["message"]["content"], "echo: hi there");
    assert_eq!(answer["usage"]["total_tokens"], 8);

    // Streamed, with usage: the OpenAI chunks, then [DONE].
    let streamed = s
        .http
        .post(s.url(completions))
        .bearer_auth(&ada)
        .json(
            &json!({"model": MODEL, "stream": true, "stream_options": {"include_usage": true},
                      "messages": [{"role": "user", "content": "one two three"}]}),
        )
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let (chunks, text) = openai_chunks(&streamed);
    assert_eq!(text, "echo: one two three");
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    assert!(chunks.iter().any(|c| c["choices"][0]["finish_reason"] == "stop"));
    assert_eq!(chunks.last().unwrap()["usage"]["completion_tokens"], 5);

    // An agent of a run, by its name; its system prompt goes first.
    let workflow = "name: w\nagents:\n  helper: { model: Qwen/Qwen2.5-0.5B-Instruct, system: \"Be kind.\" }\nsteps:\n  - { id: s, agent: helper, prompt: go }\n";
    let (status, _) = s
        .call(
            Method::POST,
            "/v1/runs",
            Some(&ada),
            Some(json!({"workflow": workflow})),
        )
        .await;
    assert_eq!(status, 202);
    let request = json!({"model": "helper", "messages": [{"role": "user", "content": "hello helper"}]});
    let (status, answer) = s
        .call(Method::POST, completions, Some(&ada), Some(request.clone()))
        .await;
    assert_eq!(status, 200, "{answer}");
    let (_, sent) = engines.seen.lock().unwrap().last().cloned().unwrap();
    assert_eq!(sent["messages"][0], json!({"role": "system", "content": "Be kind."}));
    let (_, listed) = s.call(Method::GET, "/v1/models", Some(&ada), None).await;
    let ids: Vec<&str> = listed["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert!(ids.contains(&"helper") && ids.contains(&MODEL), "{ids:?}");
    // Another user has no such agent.
    let bob = s.token_for("bob").await;
    let (status, _) = s.call(Method::POST, completions, Some(&bob), Some(request)).await;
    assert_eq!(status, 404);

    // A session continued through the OpenAI route: only the new message is sent, the
    // session holds the history.
    let (_, session) = s
        .call(Method::POST, "/v1/sessions", Some(&ada), Some(json!({"model": MODEL})))
        .await;
    let id = session["id"].as_str().unwrap();
    for word in ["first", "second"] {
        let request = json!({"model": MODEL, "session_id": id, "messages": [{"role": "user", "content": word}]});
        let (status, answer) = s.call(Method::POST, completions, Some(&ada), Some(request)).await;
        assert_eq!(status, 200, "{answer}");
        assert_eq!(answer["choices"][0]["message"]["content"], format!("echo: {word}"));
    }
    let (_, sent) = engines.seen.lock().unwrap().last().cloned().unwrap();
    assert_eq!(sent["messages"].as_array().unwrap().len(), 3, "{sent}");
    let (_, history) = s
        .call(Method::GET, &format!("/v1/sessions/{id}/messages"), Some(&ada), None)
        .await;
    assert_eq!(history["data"].as_array().unwrap().len(), 4);
}

/// A streamed completion in a session, retried with the same Idempotency-Key (a client
/// whose connection broke before the end): the retry streams the reply the first
/// request stored, with its usage, as OpenAI chunks, and neither reaches the engine
/// nor stores anything again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_streamed_completion_streams_the_stored_reply() {
    let s = setup(quick(), None).await;
    let engines = EngineBehaviour::default();
    let _a = TestAgent::join(s.server.grpc_addr, TOKEN, "node-a", 1, engines.clone()).await;
    s.wait_nodes(1).await;
    let (_, session) = s
        .call(Method::POST, "/v1/sessions", Some(API), Some(json!({"model": MODEL})))
        .await;
    let id = session["id"].as_str().unwrap();
    let request = json!({"model": MODEL, "session_id": id, "stream": true, "stream_options": {"include_usage": true},
                         "messages": [{"role": "user", "content": "one two three"}]});
    let send = || async {
        let response = s
            .http
            .post(s.url("/v1/chat/completions"))
            .bearer_auth(API)
            .header("Idempotency-Key", "k-1")
            .json(&request)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        response.text().await.unwrap()
    };

    let (first, text) = openai_chunks(&send().await);
    assert_eq!(text, "echo: one two three");
    assert!(
        first.last().unwrap()["usage"]["completion_tokens"].is_u64(),
        "{first:?}"
    );
    let requests = engines.seen.lock().unwrap().len();

    let streamed = send().await;
    let (again, replayed) = openai_chunks(&streamed);
    assert_eq!(replayed, text, "the retry streams the stored reply: {streamed}");
    assert_eq!(again[0]["choices"][0]["delta"]["role"], "assistant");
    assert!(
        again.iter().any(|c| c["choices"][0]["finish_reason"] == "stop"),
        "{streamed}"
    );
    assert_eq!(
        again.last().unwrap()["usage"],
        first.last().unwrap()["usage"],
        "{streamed}"
    );
    assert_eq!(
        engines.seen.lock().unwrap().len(),
        requests,
        "the retry did not reach the engine"
    );
    let (_, history) = s
        .call(Method::GET, &format!("/v1/sessions/{id}/messages"), Some(API), None)
        .await;
    assert_eq!(history["data"].as_array().unwrap().len(), 2, "stored once: {history}");
}

/// An engine that refuses a prompt longer than its context (history whose bytes
/// under-promised its tokens): the turn is sent again with less history and succeeds,
/// the newest message always included; a message that alone does not fit is the
/// client's error (400, with the engine's reason), and sampling out of bounds is refused
/// before any engine sees it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_the_engine_finds_too_long_is_sent_with_less_history() {
    let s = setup(quick(), None).await;
    let engines = EngineBehaviour {
        context_bytes: Some(120),
        ..EngineBehaviour::default()
    };
    let _a = TestAgent::join(s.server.grpc_addr, TOKEN, "node-a", 1, engines.clone()).await;
    s.wait_nodes(1).await;
    let (_, session) = s
        .call(Method::POST, "/v1/sessions", Some(API), Some(json!({"model": MODEL})))
        .await;
    let path = format!("/v1/sessions/{}/messages", session["id"].as_str().unwrap());
    for i in 0..6 {
        let content = format!("message {i} {}", "x".repeat(30));
        let (status, answer) = s
            .call(Method::POST, &path, Some(API), Some(json!({ "content": content })))
            .await;
        assert_eq!(status, 200, "turn {i}: {answer}");
        assert_eq!(answer["message"]["content"], format!("echo: {content}"));
    }
    let seen = engines.seen.lock().unwrap().clone();
    let (_, last) = seen.last().unwrap();
    let sent = last["messages"].as_array().unwrap();
    let bytes: usize = sent.iter().map(|m| m["content"].as_str().unwrap().len()).sum();
    assert!(bytes <= 120, "{last}");
    assert!(
        sent.last().unwrap()["content"]
            .as_str()
            .unwrap()
            .starts_with("message 5")
    );
    assert!(
        seen.len() > 6,
        "some turns were refused and sent again: {} requests",
        seen.len()
    );

    let (status, answer) = s
        .call(
            Method::POST,
            &path,
            Some(API),
            Some(json!({ "content": "y".repeat(200) })),
        )
        .await;
    assert_eq!(
        (status, answer["error"]["code"].as_str()),
        (400, Some("bad_request")),
        "{answer}"
    );
    assert!(
        answer["error"]["message"].as_str().unwrap().contains("context"),
        "{answer}"
    );

    let requests = engines.seen.lock().unwrap().len();
    for bad in [
        json!({"content": "hi", "temperature": 3}),
        json!({"content": "hi", "max_tokens": 0}),
    ] {
        let (status, answer) = s.call(Method::POST, &path, Some(API), Some(bad.clone())).await;
        assert_eq!(status, 400, "{bad} → {answer}");
    }
    let completion = json!({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "top_p": 0});
    let (status, answer) = s
        .call(Method::POST, "/v1/chat/completions", Some(API), Some(completion))
        .await;
    assert_eq!(status, 400, "{answer}");
    assert_eq!(engines.seen.lock().unwrap().len(), requests, "no engine saw them");
}

fn weather_tool() -> Value {
    json!({"type": "function", "function": {
        "name": "weather", "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"text": {"type": "string"}}}}})
}

/// The first tool call of a streamed completion, assembled from its pieces: its id,
/// name and arguments.
fn streamed_call(chunks: &[Value]) -> (Value, Value, String) {
    let pieces: Vec<&Value> = chunks
        .iter()
        .map(|c| &c["choices"][0]["delta"]["tool_calls"][0])
        .filter(|c| c.is_object())
        .collect();
    assert!(!pieces.is_empty(), "{chunks:?}");
    let arguments = pieces
        .iter()
        .filter_map(|c| c["function"]["arguments"].as_str())
        .collect();
    (
        pieces[0]["id"].clone(),
        pieces[0]["function"]["name"].clone(),
        arguments,
    )
}

/// A session driven the way an OpenAI client's tool loop drives one (the fake engine
/// calls the offered tool until it is sent a result): the tool fields reach the engine,
/// the reply's call is stored and answered again, whole or streamed, to a retry; a
/// result of no call is refused; the client's loop sends the call back with its result;
/// a streamed call is stored whole; the history lists calls and results; after a move,
/// the new instance gets them all in OpenAI's form.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_keeps_tool_calls_through_retries_streams_and_a_move() {
    let s = setup(quick(), None).await;
    let engines = EngineBehaviour::default();
    let _a = TestAgent::join(s.server.grpc_addr, TOKEN, "node-a", 2, engines.clone()).await;
    let _b = TestAgent::join(s.server.grpc_addr, TOKEN, "node-b", 2, engines.clone()).await;
    s.wait_nodes(2).await;
    let (_, session) = s
        .call(
            Method::POST,
            "/v1/sessions",
            Some(API),
            Some(json!({"model": MODEL, "system": "Be brief."})),
        )
        .await;
    let id = session["id"].as_str().unwrap().to_owned();
    let completions = "/v1/chat/completions";
    let keyed = |key: &str, body: &Value| {
        s.http
            .post(s.url(completions))
            .bearer_auth(API)
            .header("Idempotency-Key", key)
            .json(body)
            .send()
    };
    let seen = || engines.seen.lock().unwrap().len();
    let last_sent = || engines.seen.lock().unwrap().last().cloned().unwrap();

    // A user turn offering a tool: the model calls it, the fields reach the engine.
    let first = json!({"model": MODEL, "session_id": id, "messages": [{"role": "user", "content": "Paris?"}],
                       "tools": [weather_tool()], "tool_choice": "required", "parallel_tool_calls": false,
                       "response_format": {"type": "json_object"}});
    let answer: Value = keyed("k-1", &first).await.unwrap().json().await.unwrap();
    let choice = answer["choices"][0].clone();
    assert_eq!(choice["finish_reason"], "tool_calls", "{answer}");
    assert!(choice["message"]["content"].is_null(), "{answer}");
    let call = choice["message"]["tool_calls"][0].clone();
    assert_eq!(call["function"]["name"], "weather");
    assert_eq!(call["function"]["arguments"], r#"{"text":"Paris?"}"#);
    let paris = call["id"].as_str().unwrap().to_owned();
    let (_, sent) = last_sent();
    for field in ["tools", "tool_choice", "parallel_tool_calls", "response_format"] {
        assert_eq!(sent[field], first[field], "{field} reaches the engine unchanged");
    }

    // Retried (the same key), whole and streamed: the stored call, no engine asked.
    let requests = seen();
    let again: Value = keyed("k-1", &first).await.unwrap().json().await.unwrap();
    assert_eq!(again["choices"][0]["message"], choice["message"]);
    assert_eq!(again["choices"][0]["finish_reason"], "tool_calls");
    let mut streamed_first = first.clone();
    streamed_first["stream"] = json!(true);
    let streamed = keyed("k-1", &streamed_first).await.unwrap().text().await.unwrap();
    let (chunks, _) = openai_chunks(&streamed);
    assert_eq!(
        streamed_call(&chunks),
        (json!(paris), json!("weather"), r#"{"text":"Paris?"}"#.to_owned())
    );
    assert!(chunks.iter().any(|c| c["choices"][0]["finish_reason"] == "tool_calls"));
    assert_eq!(seen(), requests, "the retries did not reach the engine");

    // A result of no call of the session: refused, naming the id and what to do.
    let stray = json!({"model": MODEL, "session_id": id,
                       "messages": [{"role": "tool", "tool_call_id": "call_nope", "content": "x"}]});
    let (status, refused) = s.call(Method::POST, completions, Some(API), Some(stray)).await;
    assert_eq!(status, 400, "{refused}");
    let message = refused["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("`call_nope`") && message.contains("help:"),
        "{message}"
    );

    // The client's loop sends the model's message back with the tool's result,
    // streamed: the final answer, the call stored once.
    let results = json!({"model": MODEL, "session_id": id, "tools": [weather_tool()], "stream": true,
                         "messages": [choice["message"],
                                      {"role": "tool", "tool_call_id": paris, "content": "sunny, 21 C"}]});
    let streamed = keyed("k-2", &results).await.unwrap().text().await.unwrap();
    assert_eq!(openai_chunks(&streamed).1, "echo: sunny, 21 C");
    let (_, sent) = last_sent();
    assert_eq!(
        sent["messages"],
        json!([
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Paris?"},
            {"role": "assistant", "content": null, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": paris, "content": "sunny, 21 C"},
        ])
    );

    // A streamed reply that calls a tool: the call, assembled from its pieces, is stored.
    let rome = json!({"model": MODEL, "session_id": id, "tools": [weather_tool()], "stream": true,
                      "messages": [{"role": "user", "content": "Rome?"}]});
    let streamed = keyed("k-3", &rome).await.unwrap().text().await.unwrap();
    let (rome_id, _, rome_arguments) = streamed_call(&openai_chunks(&streamed).0);
    assert_eq!(rome_arguments, r#"{"text":"Rome?"}"#);

    // The history, as the REST API lists it: calls and results in place.
    let messages_path = format!("/v1/sessions/{id}/messages");
    let (_, history) = s.call(Method::GET, &messages_path, Some(API), None).await;
    let history = history["data"].as_array().unwrap().clone();
    let roles: Vec<&str> = history.iter().map(|m| m["role"].as_str().unwrap()).collect();
    assert_eq!(roles, ["user", "assistant", "tool", "assistant", "user", "assistant"]);
    assert_eq!(
        history[1]["tool_calls"],
        json!([{"id": paris, "name": "weather", "arguments": r#"{"text":"Paris?"}"#}])
    );
    assert_eq!(history[2]["tool_call_id"], json!(paris));
    assert_eq!(history[2]["content"], "sunny, 21 C");
    assert_eq!(
        history[5]["tool_calls"],
        json!([{"id": rome_id, "name": "weather", "arguments": rome_arguments}])
    );

    // Moved to the other node: the result of the Rome call goes to the new instance
    // with the whole history, calls and results in OpenAI's form.
    let (_, shown) = s
        .call(Method::GET, &format!("/v1/sessions/{id}"), Some(API), None)
        .await;
    let other = if shown["binding"]["node"] == "node-a" {
        "node-b"
    } else {
        "node-a"
    };
    let (status, moved) = s
        .call(
            Method::POST,
            &format!("/v1/sessions/{id}/migrate"),
            Some(API),
            Some(json!({"to": {"node": other, "gpu": 1}})),
        )
        .await;
    assert_eq!(status, 200, "{moved}");
    let rain = json!({"model": MODEL, "session_id": id,
                      "messages": [{"role": "tool", "tool_call_id": rome_id, "content": "rain"}]});
    let (status, answer) = s.call(Method::POST, completions, Some(API), Some(rain)).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["choices"][0]["message"]["content"], "echo: rain");
    let (_, instances) = s.call(Method::GET, "/v1/instances", Some(API), None).await;
    let new_url = instances
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["name"] == moved["to"]["instance"])
        .unwrap()["base_url"]
        .clone();
    let (url, sent) = last_sent();
    assert_eq!(json!(url), new_url, "served by the new instance");
    let rome_call = json!({"id": rome_id, "type": "function",
                           "function": {"name": "weather", "arguments": rome_arguments}});
    assert_eq!(
        sent["messages"],
        json!([
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Paris?"},
            {"role": "assistant", "content": null, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": paris, "content": "sunny, 21 C"},
            {"role": "assistant", "content": "echo: sunny, 21 C"},
            {"role": "user", "content": "Rome?"},
            {"role": "assistant", "content": null, "tool_calls": [rome_call]},
            {"role": "tool", "tool_call_id": rome_id, "content": "rain"},
        ])
    );
}
