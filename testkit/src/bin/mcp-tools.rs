//! A real MCP tool server for tests, built on rmcp (the official Rust SDK): the tools an
//! agent's tool calls are tested against.
//!
//! `mcp-tools [--count-file PATH] [--http ADDR [--bearer TOKEN]]`
//!
//! - Without `--http`: MCP over stdio (the orchestrator starts stdio servers this way,
//!   with an empty environment: nothing here reads one).
//! - `--http 127.0.0.1:PORT`: streamable HTTP at `http://ADDR/mcp`; `listening on ADDR`
//!   goes to stdout once bound (port 0 picks one, and the line says which).
//! - `--bearer TOKEN` (with `--http`): requests without `Authorization: Bearer TOKEN`
//!   are answered 401, as a hosted tool server does.
//!
//! Tools: `count` (appends a line to the count file, synced, and answers the number of
//! lines: tests count invocations through it, across restarts of this server; without
//! `--count-file` it counts this process's calls), `add {a, b}`, `echo {text}`,
//! `sleep {ms}` (counted like `count`, before it sleeps, so that a call cut short still
//! counts; answers `slept MS ms`) and `fail {message}` (a tool error result with the
//! message).
//!
//! Exit codes: 0 when the client closes stdio, 1 when serving fails, 2 for bad usage.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::Request;
use axum::http::StatusCode;
use axum::http::header::AUTHORIZATION;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{CallToolResult, ContentBlock, Implementation, ServerCapabilities, ServerConfig};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{ServerHandler, ServiceExt, schemars, tool, tool_handler, tool_router};
use tokio::sync::Mutex;

const USAGE: &str = "usage: mcp-tools [--count-file PATH] [--http 127.0.0.1:PORT [--bearer TOKEN]]";

/// The longest `sleep` a test may ask for, so a mistaken argument cannot hang a run.
const MAX_SLEEP_MS: u64 = 600_000;

#[derive(Debug, rmcp::serde::Deserialize, schemars::JsonSchema)]
#[serde(crate = "rmcp::serde")]
#[schemars(crate = "rmcp::schemars")]
struct AddArgs {
    /// The first addend.
    a: f64,
    /// The second addend.
    b: f64,
}

#[derive(Debug, rmcp::serde::Deserialize, schemars::JsonSchema)]
#[serde(crate = "rmcp::serde")]
#[schemars(crate = "rmcp::schemars")]
struct EchoArgs {
    /// The text to answer.
    text: String,
}

#[derive(Debug, rmcp::serde::Deserialize, schemars::JsonSchema)]
#[serde(crate = "rmcp::serde")]
#[schemars(crate = "rmcp::schemars")]
struct SleepArgs {
    /// How long to sleep, in milliseconds.
    ms: u64,
}

#[derive(Debug, rmcp::serde::Deserialize, schemars::JsonSchema)]
#[serde(crate = "rmcp::serde")]
#[schemars(crate = "rmcp::schemars")]
struct FailArgs {
    /// The error message to answer.
    message: String,
}

#[derive(Clone)]
struct Tools {
    count_file: Option<PathBuf>,
    /// One count at a time per process, so that the number it answers is its own line's;
    /// the calls counted in memory when there is no count file.
    counting: Arc<Mutex<u64>>,
    tool_router: ToolRouter<Self>,
}

#[tool_router]
impl Tools {
    fn new(count_file: Option<PathBuf>) -> Self {
        Self {
            count_file,
            counting: Arc::new(Mutex::new(0)),
            tool_router: Self::tool_router(),
        }
    }

    /// Counts one call (a line in the count file, or in memory): the number of calls
    /// counted so far.
    async fn count_call(&self) -> Result<String, String> {
        let mut in_memory = self.counting.lock().await;
        let Some(path) = self.count_file.clone() else {
            *in_memory += 1;
            return Ok(in_memory.to_string());
        };
        tokio::task::spawn_blocking(move || append_and_count(&path))
            .await
            .map_err(|e| format!("counting: {e}"))?
    }

    #[tool(description = "Count this call: appends a line to the count file and answers how many lines it has")]
    async fn count(&self) -> Result<String, String> {
        self.count_call().await
    }

    #[tool(description = "Add two numbers")]
    fn add(&self, Parameters(AddArgs { a, b }): Parameters<AddArgs>) -> String {
        (a + b).to_string()
    }

    #[tool(description = "Answer the text given")]
    fn echo(&self, Parameters(EchoArgs { text }): Parameters<EchoArgs>) -> String {
        text
    }

    #[tool(description = "Count this call (a line in the count file), sleep for ms milliseconds, then answer")]
    async fn sleep(&self, Parameters(SleepArgs { ms }): Parameters<SleepArgs>) -> Result<String, String> {
        if ms > MAX_SLEEP_MS {
            return Err(format!("sleep: {ms} ms is over the limit of {MAX_SLEEP_MS} ms"));
        }
        self.count_call().await?;
        tokio::time::sleep(Duration::from_millis(ms)).await;
        Ok(format!("slept {ms} ms"))
    }

    #[tool(description = "Fail with the message given (a tool error result)")]
    fn fail(&self, Parameters(FailArgs { message }): Parameters<FailArgs>) -> CallToolResult {
        CallToolResult::error(vec![ContentBlock::text(message)])
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for Tools {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("mcp-tools", env!("CARGO_PKG_VERSION")))
    }
}

/// Appends one line to `path` (created if missing), syncs it, and answers the number of
/// lines the file then has.
fn append_and_count(path: &std::path::Path) -> Result<String, String> {
    let fail = |e: std::io::Error| format!("count file {}: {e}", path.display());
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(fail)?;
    file.write_all(b"called\n").map_err(fail)?;
    file.sync_all().map_err(fail)?;
    let lines = std::fs::read(path)
        .map_err(fail)?
        .iter()
        .filter(|&&b| b == b'\n')
        .count();
    Ok(lines.to_string())
}

struct Options {
    count_file: Option<PathBuf>,
    http: Option<String>,
    bearer: Option<String>,
}

fn parse(mut args: impl Iterator<Item = String>) -> Result<Options, String> {
    let (mut count_file, mut http, mut bearer) = (None, None, None);
    while let Some(arg) = args.next() {
        let slot = match arg.as_str() {
            "--count-file" => &mut count_file,
            "--http" => &mut http,
            "--bearer" => &mut bearer,
            other => return Err(format!("unknown argument `{other}`")),
        };
        *slot = Some(args.next().ok_or_else(|| format!("{arg} needs a value"))?);
    }
    if bearer.is_some() && http.is_none() {
        return Err("--bearer needs --http".to_owned());
    }
    Ok(Options {
        count_file: count_file.map(PathBuf::from),
        http,
        bearer,
    })
}

#[tokio::main]
async fn main() -> ExitCode {
    let options = match parse(std::env::args().skip(1)) {
        Ok(options) => options,
        Err(message) => {
            eprintln!("mcp-tools: {message}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    match serve(options).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("mcp-tools: {message}");
            ExitCode::FAILURE
        }
    }
}

async fn serve(options: Options) -> Result<(), String> {
    let tools = Tools::new(options.count_file);
    let Some(addr) = options.http else {
        let running = tools
            .serve(rmcp::transport::stdio())
            .await
            .map_err(|e| format!("stdio: {e}"))?;
        running.waiting().await.map_err(|e| format!("stdio: {e}"))?;
        return Ok(());
    };
    let service: StreamableHttpService<Tools, LocalSessionManager> = StreamableHttpService::new(
        move || Ok(tools.clone()),
        Arc::default(),
        StreamableHttpServerConfig::default().with_sse_keep_alive(None),
    );
    let mut router = axum::Router::new().nest_service("/mcp", service);
    if let Some(token) = options.bearer {
        let expected: Arc<str> = format!("Bearer {token}").into();
        router = router.layer(axum::middleware::from_fn(move |request: Request, next: Next| {
            let expected = Arc::clone(&expected);
            async move { authorize(&expected, request, next).await }
        }));
    }
    let listener = tokio::net::TcpListener::bind(&addr)
        .await
        .map_err(|e| format!("cannot listen on {addr}: {e}"))?;
    let bound = listener.local_addr().map_err(|e| format!("{addr}: {e}"))?;
    println!("listening on {bound}");
    std::io::stdout().flush().map_err(|e| format!("stdout: {e}"))?;
    axum::serve(listener, router)
        .await
        .map_err(|e| format!("serving on {bound}: {e}"))
}

/// Passes the request on when it carries `expected` as its `Authorization`; 401 otherwise.
async fn authorize(expected: &str, request: Request, next: Next) -> Response {
    let authorized = request
        .headers()
        .get(AUTHORIZATION)
        .is_some_and(|value| value.as_bytes() == expected.as_bytes());
    if authorized {
        next.run(request).await
    } else {
        (StatusCode::UNAUTHORIZED, "missing or wrong bearer token").into_response()
    }
}
