//! The test MCP tool servers are real MCP servers: rmcp's client (the one the
//! orchestrator uses) starts each (Rust and Python, stdio and streamable HTTP), lists its
//! tools with their argument schemas and calls every one.

use std::path::Path;

use rmcp::model::{CallToolRequestParams, CallToolResult};
use rmcp::service::RunningService;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::{ConfigureCommandExt, StreamableHttpClientTransport, TokioChildProcess};
use rmcp::{RoleClient, ServiceExt};
use serde_json::{Value, json};
use skein_testkit::mcp::{HttpToolServer, mcp_python, mcp_tools_path, python_mcp_server_script};

type Client = RunningService<RoleClient, ()>;

/// A stdio tool server started as the orchestrator starts one: the program and its
/// arguments, an empty environment.
async fn stdio_client(program: &Path, args: &[&std::ffi::OsStr]) -> Client {
    let command = tokio::process::Command::new(program).configure(|cmd| {
        cmd.args(args).env_clear();
    });
    let transport = TokioChildProcess::new(command).expect("the tool server starts");
    ().serve(transport).await.expect("the MCP handshake over stdio")
}

async fn http_client(url: String, bearer: Option<&str>) -> Client {
    let mut config = StreamableHttpClientTransportConfig::with_uri(url);
    if let Some(token) = bearer {
        config = config.auth_header(token);
    }
    let transport = StreamableHttpClientTransport::from_config(config);
    ().serve(transport)
        .await
        .expect("the MCP handshake over streamable HTTP")
}

async fn call(client: &Client, tool: &str, arguments: Value) -> CallToolResult {
    let Value::Object(arguments) = arguments else {
        panic!("arguments are an object")
    };
    client
        .call_tool(CallToolRequestParams::new(tool.to_owned()).with_arguments(arguments))
        .await
        .unwrap_or_else(|e| panic!("calling {tool}: {e}"))
}

fn text(result: &CallToolResult) -> String {
    result
        .content
        .iter()
        .filter_map(|block| block.as_text())
        .map(|t| t.text.as_str())
        .collect()
}

/// Lists the five tools and their arguments, then calls each.
async fn exercise(client: Client, count_file: &Path) {
    let tools = client.list_all_tools().await.expect("tools/list");
    let mut names: Vec<&str> = tools.iter().map(|t| &*t.name).collect();
    names.sort_unstable();
    assert_eq!(names, ["add", "count", "echo", "fail", "sleep"]);
    for (tool, arguments) in [
        ("count", &[][..]),
        ("add", &["a", "b"][..]),
        ("echo", &["text"][..]),
        ("sleep", &["ms"][..]),
        ("fail", &["message"][..]),
    ] {
        let schema = &tools.iter().find(|t| t.name == tool).expect("listed").input_schema;
        assert_eq!(schema.get("type"), Some(&json!("object")), "{tool}: {schema:?}");
        let properties = schema.get("properties").and_then(Value::as_object);
        let mut listed: Vec<&str> = properties
            .map(|p| p.keys().map(String::as_str).collect())
            .unwrap_or_default();
        listed.sort_unstable();
        assert_eq!(listed, arguments, "{tool}'s arguments: {schema:?}");
        let mut required: Vec<&str> = schema
            .get("required")
            .and_then(Value::as_array)
            .map(|r| r.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        required.sort_unstable();
        assert_eq!(required, arguments, "{tool}'s required arguments: {schema:?}");
    }

    let first = call(&client, "count", json!({})).await;
    let second = call(&client, "count", json!({})).await;
    assert_eq!((text(&first), text(&second)), ("1".to_owned(), "2".to_owned()));
    assert_eq!(
        std::fs::read_to_string(count_file)
            .expect("the count file")
            .lines()
            .count(),
        2
    );

    let sum = call(&client, "add", json!({ "a": 2, "b": 3.5 })).await;
    assert_eq!((text(&sum), sum.is_error), ("5.5".to_owned(), Some(false)));
    assert_eq!(text(&call(&client, "add", json!({ "a": 2, "b": 3 })).await), "5");
    assert_eq!(
        text(&call(&client, "echo", json!({ "text": "héllo, tools" })).await),
        "héllo, tools"
    );
    assert_eq!(text(&call(&client, "sleep", json!({ "ms": 20 })).await), "slept 20 ms");
    // A sleep counts as a call, like `count`.
    assert_eq!(
        std::fs::read_to_string(count_file)
            .expect("the count file")
            .lines()
            .count(),
        3
    );

    let failed = call(&client, "fail", json!({ "message": "the disk is on fire" })).await;
    assert_eq!(failed.is_error, Some(true), "{failed:?}");
    assert!(text(&failed).contains("the disk is on fire"), "{failed:?}");

    client.cancel().await.expect("the client closes");
}

#[tokio::test]
async fn rust_server_over_stdio() {
    let dir = tempfile::tempdir().unwrap();
    let count_file = dir.path().join("count");
    let client = stdio_client(&mcp_tools_path(), &["--count-file".as_ref(), count_file.as_os_str()]).await;
    exercise(client, &count_file).await;
}

#[tokio::test]
async fn rust_server_over_http() {
    let dir = tempfile::tempdir().unwrap();
    let count_file = dir.path().join("count");
    let server = HttpToolServer::rust(&count_file, None);
    exercise(http_client(server.url(), None).await, &count_file).await;
}

#[tokio::test]
async fn rust_server_over_http_refuses_requests_without_its_bearer_token() {
    let dir = tempfile::tempdir().unwrap();
    let count_file = dir.path().join("count");
    let server = HttpToolServer::rust(&count_file, Some("s3cret"));
    let initialize = json!({
        "jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": { "protocolVersion": "2025-06-18", "capabilities": {},
                    "clientInfo": { "name": "test", "version": "1" } }
    });
    let http = reqwest::Client::new();
    for authorization in [None, Some("Bearer wrong"), Some("s3cret")] {
        let mut request = http
            .post(server.url())
            .header("accept", "application/json, text/event-stream")
            .json(&initialize);
        if let Some(value) = authorization {
            request = request.header("authorization", value);
        }
        let status = request.send().await.expect("the server answers").status();
        assert_eq!(status, reqwest::StatusCode::UNAUTHORIZED, "with {authorization:?}");
    }
    // rmcp's client without the token cannot even shake hands.
    let transport =
        StreamableHttpClientTransport::from_config(StreamableHttpClientTransportConfig::with_uri(server.url()));
    assert!(
        ().serve(transport).await.is_err(),
        "a client without the token was served"
    );
    assert!(!count_file.exists(), "nothing was called");
    // With it, everything works.
    exercise(http_client(server.url(), Some("s3cret")).await, &count_file).await;
}

#[tokio::test]
async fn python_server_over_stdio() {
    let dir = tempfile::tempdir().unwrap();
    let count_file = dir.path().join("count");
    let script = python_mcp_server_script();
    let args = [script.as_os_str(), "--count-file".as_ref(), count_file.as_os_str()];
    let client = stdio_client(&mcp_python(), &args).await;
    exercise(client, &count_file).await;
}

#[tokio::test]
async fn python_server_over_http() {
    let dir = tempfile::tempdir().unwrap();
    let count_file = dir.path().join("count");
    let server = HttpToolServer::python(&count_file);
    exercise(http_client(server.url(), None).await, &count_file).await;
}
