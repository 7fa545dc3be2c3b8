//! A remote OpenAI-compatible endpoint on loopback, as a workflow's endpoint agent
//! reaches one: it answers every request with one whole chat completion
//! (`application/json`, even when `stream: true` was asked, as some hosted services
//! do) and keeps every request it was sent, whole (headers included), so tests can
//! check what the server sent there (its key, its body) and how often.
//!
//! [`WholeAnswer::tool_caller`] is a model that calls tools: while a request offers
//! tools and carries fewer tool results than its rounds, it asks for one call; then it
//! answers with the last result. Agent loops' tests drive real tool servers with it.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};

/// The endpoint: its port and what it was sent. It serves until the test process ends.
pub struct WholeAnswer {
    /// Its port on 127.0.0.1.
    pub port: u16,
    requests: Arc<Mutex<Vec<String>>>,
}

impl WholeAnswer {
    /// Starts one answering `content` to every request.
    pub fn start(content: &str) -> WholeAnswer {
        let body = completion(json!({"role": "assistant", "content": content}), "stop");
        WholeAnswer::serve(move |_| body.clone())
    }

    /// Starts a model that calls function `function` with `arguments` (JSON text) once
    /// per model call while the request offers `tools` and holds fewer than `rounds`
    /// tool results; then it answers `done: ` and the last tool result. Each answer
    /// takes `delay`.
    pub fn tool_caller(function: &str, arguments: &str, rounds: usize, delay: Duration) -> WholeAnswer {
        let (function, arguments) = (function.to_owned(), arguments.to_owned());
        WholeAnswer::serve(move |request| {
            std::thread::sleep(delay);
            let body: Value = serde_json::from_str(request).unwrap_or(Value::Null);
            let messages = body["messages"].as_array().cloned().unwrap_or_default();
            let results: Vec<&Value> = messages.iter().filter(|m| m["role"] == "tool").collect();
            let offered = body["tools"].as_array().is_some_and(|t| !t.is_empty()) && body["tool_choice"] != "none";
            if offered && results.len() < rounds {
                let call = json!({
                    "id": format!("call_{}", results.len()),
                    "type": "function",
                    "function": {"name": function, "arguments": arguments},
                });
                return completion(
                    json!({"role": "assistant", "content": null, "tool_calls": [call]}),
                    "tool_calls",
                );
            }
            let last = results.last().and_then(|m| m["content"].as_str()).unwrap_or("nothing");
            completion(json!({"role": "assistant", "content": format!("done: {last}")}), "stop")
        })
    }

    /// Starts a model that answers `answer(prompt)`, the prompt being the text of the
    /// request's last user message, after `delay`.
    pub fn answering(delay: Duration, answer: impl Fn(&str) -> String + Send + Sync + 'static) -> WholeAnswer {
        WholeAnswer::serve(move |request| {
            std::thread::sleep(delay);
            let body: Value = serde_json::from_str(request).unwrap_or(Value::Null);
            let prompt = body["messages"]
                .as_array()
                .and_then(|m| m.iter().rev().find(|m| m["role"] == "user"))
                .and_then(|m| m["content"].as_str())
                .unwrap_or_default()
                .to_owned();
            completion(json!({"role": "assistant", "content": answer(&prompt)}), "stop")
        })
    }

    /// The prompts (last user messages) of the requests it answered so far, in order.
    pub fn prompts(&self) -> Vec<String> {
        self.requests()
            .iter()
            .filter_map(|request| {
                let body: Value = serde_json::from_str(request.split("\r\n\r\n").nth(1)?).ok()?;
                let last = body["messages"]
                    .as_array()?
                    .iter()
                    .rev()
                    .find(|m| m["role"] == "user")?;
                Some(last["content"].as_str()?.to_owned())
            })
            .collect()
    }

    /// Starts one answering each request's body with `reply(body)`.
    fn serve(reply: impl Fn(&str) -> String + Send + Sync + 'static) -> WholeAnswer {
        let listener = TcpListener::bind("127.0.0.1:0").expect("a loopback port for the endpoint");
        let port = listener.local_addr().expect("the endpoint's address").port();
        let requests = Arc::new(Mutex::new(Vec::new()));
        let kept = Arc::clone(&requests);
        let reply = Arc::new(reply);
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                let kept = Arc::clone(&kept);
                let reply = Arc::clone(&reply);
                std::thread::spawn(move || answer(stream, &kept, &*reply));
            }
        });
        WholeAnswer { port, requests }
    }

    /// Its base URL on 127.0.0.1 (`http://127.0.0.1:PORT/v1`).
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}/v1", self.port)
    }

    /// Every request it answered so far, whole, in the order they came.
    pub fn requests(&self) -> Vec<String> {
        self.requests
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// The `Authorization` header of every request it answered (`None` where absent).
    pub fn authorizations(&self) -> Vec<Option<String>> {
        self.requests()
            .iter()
            .map(|request| header(request.split("\r\n\r\n").next().unwrap_or_default(), "authorization"))
            .collect()
    }
}

/// A whole chat completion of `message`.
fn completion(message: Value, finish_reason: &str) -> String {
    json!({
        "id": "whole", "object": "chat.completion",
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason}],
        "usage": {"prompt_tokens": 4, "completion_tokens": 3}
    })
    .to_string()
}

/// One connection: reads the request (its head, then the body its Content-Length
/// announces), keeps it and answers with `reply` of its body. A connection closed
/// before a whole request is dropped unanswered.
fn answer(mut stream: TcpStream, kept: &Mutex<Vec<String>>, reply: &(dyn Fn(&str) -> String + Send + Sync)) {
    let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
    let mut request = Vec::new();
    let mut buffer = [0u8; 4096];
    loop {
        let Ok(n) = stream.read(&mut buffer) else { return };
        if n == 0 {
            return;
        }
        request.extend_from_slice(&buffer[..n]);
        let text = String::from_utf8_lossy(&request);
        if let Some(end) = text.find("\r\n\r\n") {
            let length = header(&text[..end], "content-length")
                .and_then(|v| v.parse::<usize>().ok())
                .unwrap_or(0);
            if request.len() >= end + 4 + length {
                break;
            }
        }
    }
    let request = String::from_utf8_lossy(&request).into_owned();
    let body = reply(request.split_once("\r\n\r\n").map_or("", |(_, body)| body));
    kept.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .push(request);
    let _ = write!(
        stream,
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
}

/// The value of header `name` (any case) in an HTTP head.
fn header(head: &str, name: &str) -> Option<String> {
    head.lines().find_map(|line| {
        let (key, value) = line.split_once(':')?;
        key.eq_ignore_ascii_case(name).then(|| value.trim().to_owned())
    })
}
