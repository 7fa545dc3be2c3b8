//! Tool servers over the Model Context Protocol: what an agent's steps call tools on.
//!
//! A [`ToolBox`] holds the connections of one agent loop to the servers its agent may
//! use, the tools they declare (filtered to those the agent lists), and calls them. A
//! stdio server is a program started with an empty environment, and only when the
//! admin allowed it ([`ToolAccess::commands`]); an HTTP server is reached under the
//! egress policy, with the run owner's secret as its bearer token.
//!
//! The model sees each tool as an OpenAI function named `server__tool` (see
//! [`offered_name`]); [`ToolBox::resolve`] maps a name back.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rmcp::ServiceExt;
use rmcp::model::{CallToolRequestParams, CallToolResult};
use rmcp::service::{RoleClient, RunningService};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::{StreamableHttpClientTransport, TokioChildProcess};
use serde_json::{Value, json};
use skein_dsl::ir::{ToolTransport, Workflow};

use crate::engine_client::Clients;

/// Longest a tool server may take to start and answer the handshake and tool list.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);

/// Most bytes of a tool's result fed back to the model (and recorded); longer text is
/// cut there with a note saying so.
pub const MAX_RESULT_BYTES: usize = 64 * 1024;

/// What the admin lets workflows reach: the programs a stdio tool server may be, and
/// the clients (egress policy, users' secrets) HTTP servers are reached with.
#[derive(Clone, Debug)]
pub struct ToolAccess {
    /// Programs a workflow's stdio tool server may run (`skein server
    /// --allow-tool-command`), compared with the command's first word as written.
    pub commands: Arc<Vec<PathBuf>>,
    /// The clients of endpoint agents: egress policy and secrets.
    pub clients: Clients,
}

/// Why a tool server could not be used, or a call did not come back.
#[derive(Debug, thiserror::Error)]
pub enum ToolError {
    /// The workflow's stdio server runs a program the admin did not allow.
    #[error(
        "tool server `{server}` runs `{program}`, which this server does not allow; the admin may allow it with `skein server --allow-tool-command {program}`"
    )]
    NotAllowed {
        /// The server's name.
        server: String,
        /// The program.
        program: String,
    },
    /// The server's secret or URL is refused (egress policy, a missing secret).
    #[error("tool server `{server}`: {reason}")]
    Denied {
        /// The server's name.
        server: String,
        /// Why.
        reason: String,
    },
    /// The server could not be started or reached, or broke the protocol.
    #[error("tool server `{server}`: {reason}")]
    Unavailable {
        /// The server's name.
        server: String,
        /// Why.
        reason: String,
    },
    /// The HTTP server answered 401: it needs a key that was not given.
    #[error("tool server `{server}` answered 401: it needs its key")]
    NeedsKey {
        /// The server's name.
        server: String,
    },
    /// An agent lists a tool its server does not declare.
    #[error("tool server `{server}` has no tool `{tool}` (it has: {available})")]
    NoSuchTool {
        /// The server's name.
        server: String,
        /// The tool named.
        tool: String,
        /// The tools it declares.
        available: String,
    },
}

/// A tool offered to the model.
#[derive(Debug, Clone, PartialEq)]
pub struct Offered {
    /// The tool server's name.
    pub server: String,
    /// The tool's name on its server.
    pub tool: String,
    /// What it does, as its server says.
    pub description: Option<String>,
    /// The JSON Schema of its arguments.
    pub parameters: Value,
}

/// What a call gave back: its text, and whether the tool reported an error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolOutcome {
    /// The result's text content (structured content as JSON when there is no text).
    pub text: String,
    /// The tool said it failed (`isError`).
    pub is_error: bool,
}

/// The program of a stdio server's `command` when the admin did not allow it (it is
/// compared as written with each of `allowed`); `None` when it may run.
pub fn disallowed_program<'a>(command: &'a [String], allowed: &[PathBuf]) -> Option<&'a str> {
    let program = command.first().map(String::as_str).unwrap_or_default();
    (!allowed.iter().any(|a| a.as_os_str() == program)).then_some(program)
}

/// `tool`, which the model calls `name`, as an OpenAI function.
fn definition(name: &str, tool: &Offered) -> Value {
    let mut function = json!({"name": name, "parameters": tool.parameters});
    if let Some(description) = &tool.description {
        function["description"] = json!(description);
    }
    json!({"type": "function", "function": function})
}

/// The name the model calls `tool` of `server` by: `server__tool`, with every
/// character outside OpenAI's `[A-Za-z0-9_-]` as `_`, cut to 64 characters.
pub fn offered_name(server: &str, tool: &str) -> String {
    format!("{server}__{tool}")
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .take(64)
        .collect()
}

/// The connections and tools of one agent loop.
pub struct ToolBox {
    servers: BTreeMap<String, RunningService<RoleClient, ()>>,
    offered: BTreeMap<String, Offered>,
}

impl std::fmt::Debug for ToolBox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ToolBox")
            .field("offered", &self.offered.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

impl ToolBox {
    /// Connects to the tool servers agent `agent` of `workflow` lists, for a run of
    /// `owner`, and lists their tools.
    ///
    /// Errors: a server not allowed, unreachable or refused, or a tool the agent lists
    /// that its server does not declare.
    pub async fn connect(
        workflow: &Workflow,
        agent: &str,
        owner: &str,
        access: &ToolAccess,
    ) -> Result<ToolBox, ToolError> {
        let mut toolbox = ToolBox {
            servers: BTreeMap::new(),
            offered: BTreeMap::new(),
        };
        let Some(definition) = workflow.agents.get(agent) else {
            return Ok(toolbox);
        };
        // The tools wanted of each server: `None` for all of them (`server.*`).
        let mut wanted: BTreeMap<&str, Vec<Option<&str>>> = BTreeMap::new();
        for reference in &definition.tools {
            wanted
                .entry(reference.server.as_str())
                .or_default()
                .push(reference.tool.as_deref());
        }
        for (server, names) in wanted {
            let unavailable = |reason: String| ToolError::Unavailable {
                server: server.to_owned(),
                reason,
            };
            let spec = workflow
                .tool_servers
                .get(server)
                .ok_or_else(|| unavailable("the workflow declares no such tool server".to_owned()))?;
            let service = tokio::time::timeout(CONNECT_TIMEOUT, connect(server, &spec.transport, owner, access))
                .await
                .map_err(|_| unavailable(format!("no answer within {}s", CONNECT_TIMEOUT.as_secs())))??;
            let declared = tokio::time::timeout(CONNECT_TIMEOUT, service.peer().list_all_tools())
                .await
                .map_err(|_| {
                    unavailable(format!(
                        "its tool list did not come within {}s",
                        CONNECT_TIMEOUT.as_secs()
                    ))
                })?
                .map_err(|e| unavailable(format!("cannot list its tools: {e}")))?;
            toolbox.servers.insert(server.to_owned(), service);
            for name in names {
                let tools: Vec<&rmcp::model::Tool> = match name {
                    None => declared.iter().collect(),
                    Some(name) => {
                        let tool = declared
                            .iter()
                            .find(|t| t.name == name)
                            .ok_or_else(|| ToolError::NoSuchTool {
                                server: server.to_owned(),
                                tool: name.to_owned(),
                                available: declared
                                    .iter()
                                    .map(|t| t.name.to_string())
                                    .collect::<Vec<_>>()
                                    .join(", "),
                            })?;
                        vec![tool]
                    }
                };
                for tool in tools {
                    toolbox.offered.insert(
                        offered_name(server, &tool.name),
                        Offered {
                            server: server.to_owned(),
                            tool: tool.name.to_string(),
                            description: tool.description.as_ref().map(|d| d.to_string()),
                            parameters: Value::Object((*tool.input_schema).clone()),
                        },
                    );
                }
            }
        }
        Ok(toolbox)
    }

    /// The tools in OpenAI's `tools` format, in name order.
    pub fn definitions(&self) -> Vec<Value> {
        self.offered.iter().map(|(name, tool)| definition(name, tool)).collect()
    }

    /// The tool the model calls `name`, in OpenAI's `tools` format.
    pub fn definition(&self, name: &str) -> Option<Value> {
        self.offered.get(name).map(|tool| definition(name, tool))
    }

    /// The tool the model calls `name`.
    pub fn resolve(&self, name: &str) -> Option<&Offered> {
        self.offered.get(name)
    }

    /// Calls `tool` of `server` with `arguments` (a JSON object), waiting at most
    /// `timeout`.
    pub async fn call(
        &self,
        server: &str,
        tool: &str,
        arguments: serde_json::Map<String, Value>,
        timeout: Duration,
    ) -> Result<ToolOutcome, ToolError> {
        let unavailable = |reason: String| ToolError::Unavailable {
            server: server.to_owned(),
            reason,
        };
        let service = self
            .servers
            .get(server)
            .ok_or_else(|| unavailable("not connected".to_owned()))?;
        let params = CallToolRequestParams::new(tool.to_owned()).with_arguments(arguments);
        let started = Instant::now();
        let result = tokio::time::timeout(timeout, service.call_tool(params))
            .await
            .map_err(|_| unavailable(format!("`{tool}` did not answer within {}s", timeout.as_secs())))?
            .map_err(|e| unavailable(format!("calling `{tool}` failed after {:?}: {e}", started.elapsed())))?;
        Ok(outcome(&result))
    }

    /// Closes every connection (a stdio server's process ends with it).
    pub async fn close(self) {
        for (_, service) in self.servers {
            let _ = service.cancel().await;
        }
    }
}

/// A call's result as text for the model.
fn outcome(result: &CallToolResult) -> ToolOutcome {
    let mut text: String = result
        .content
        .iter()
        .filter_map(|block| block.as_text().map(|t| t.text.as_str()))
        .collect::<Vec<_>>()
        .join("\n");
    if text.is_empty()
        && let Some(structured) = &result.structured_content
    {
        text = structured.to_string();
    }
    ToolOutcome {
        text: cut(text),
        is_error: result.is_error.unwrap_or(false),
    }
}

/// `text` cut to [`MAX_RESULT_BYTES`] at a character boundary, saying so.
fn cut(mut text: String) -> String {
    let total = text.len();
    if skein_text::truncate_at_char(&mut text, MAX_RESULT_BYTES) {
        text.push_str(&format!("\n[cut: {total} bytes in all]"));
    }
    text
}

/// One server's connection, handshake done.
async fn connect(
    server: &str,
    transport: &ToolTransport,
    owner: &str,
    access: &ToolAccess,
) -> Result<RunningService<RoleClient, ()>, ToolError> {
    let unavailable = |reason: String| ToolError::Unavailable {
        server: server.to_owned(),
        reason,
    };
    match transport {
        ToolTransport::Stdio { command } => {
            if let Some(program) = disallowed_program(command, &access.commands) {
                return Err(ToolError::NotAllowed {
                    server: server.to_owned(),
                    program: program.to_owned(),
                });
            }
            start_program(server, command).await
        }
        ToolTransport::Http { url, api_key_secret } => {
            let denied = |reason: String| ToolError::Denied {
                server: server.to_owned(),
                reason,
            };
            let http = access.clients.guarded(url).map_err(|e| denied(e.to_string()))?;
            let mut config = StreamableHttpClientTransportConfig::with_uri(url.as_str());
            if let Some(reference) = api_key_secret {
                let key = access
                    .clients
                    .secrets()
                    .resolve(owner, reference)
                    .map_err(|e| denied(e.to_string()))?;
                config = config.auth_header(key.expose().to_owned());
            }
            let transport = StreamableHttpClientTransport::with_client(http, config);
            ().serve(transport)
                .await
                .map_err(|e| unavailable(format!("the MCP handshake with {url} failed: {e}")))
        }
    }
}

/// A stdio server's program started with an empty environment, handshake done (the
/// process is killed when the service is dropped or cancelled).
async fn start_program(server: &str, command: &[String]) -> Result<RunningService<RoleClient, ()>, ToolError> {
    let unavailable = |reason: String| ToolError::Unavailable {
        server: server.to_owned(),
        reason,
    };
    let program = command.first().map(String::as_str).unwrap_or_default();
    let mut cmd = tokio::process::Command::new(program);
    cmd.args(command.get(1..).unwrap_or_default())
        .env_clear()
        .kill_on_drop(true);
    let (child, _) = TokioChildProcess::builder(cmd)
        .stderr(std::process::Stdio::null())
        .spawn()
        .map_err(|e| unavailable(format!("cannot start `{program}`: {e}")))?;
    ().serve(child)
        .await
        .map_err(|e| unavailable(format!("the MCP handshake failed: {e}")))
}

/// The names of the tools `server` declares, reached as `skein validate --check-tools`
/// reaches it: a stdio server's program is started here (whatever the admin's list of
/// programs), an HTTP one is called directly (no egress policy) with `bearer` when
/// given. All of it, the tool list included, within `timeout`; the connection is
/// closed (a program killed) before returning.
///
/// Errors: [`ToolError::NeedsKey`] for an HTTP 401, [`ToolError::Unavailable`] for a
/// server that cannot be started, reached or listed in time.
pub async fn list_tools(
    server: &str,
    transport: &ToolTransport,
    bearer: Option<&str>,
    timeout: Duration,
) -> Result<Vec<String>, ToolError> {
    let unavailable = |reason: String| ToolError::Unavailable {
        server: server.to_owned(),
        reason,
    };
    let listing = async {
        let service = match transport {
            ToolTransport::Stdio { command } => start_program(server, command).await?,
            ToolTransport::Http { url, .. } => {
                let http = reqwest::Client::builder()
                    .timeout(timeout)
                    .build()
                    .map_err(|e| unavailable(format!("no HTTP client: {e}")))?;
                let mut config = StreamableHttpClientTransportConfig::with_uri(url.as_str());
                if let Some(key) = bearer {
                    config = config.auth_header(key.to_owned());
                }
                let transport = StreamableHttpClientTransport::with_client(http.clone(), config);
                match ().serve(transport).await {
                    Ok(service) => service,
                    Err(_) if answers_401(&http, url.as_str(), bearer).await => {
                        return Err(ToolError::NeedsKey {
                            server: server.to_owned(),
                        });
                    }
                    Err(e) => return Err(unavailable(format!("the MCP handshake with {url} failed: {e}"))),
                }
            }
        };
        let listed = service.peer().list_all_tools().await;
        let _ = service.cancel().await;
        listed
            .map(|tools| tools.into_iter().map(|t| t.name.to_string()).collect())
            .map_err(|e| unavailable(format!("cannot list its tools: {e}")))
    };
    tokio::time::timeout(timeout, listing)
        .await
        .map_err(|_| unavailable(format!("no tool list within {}s", timeout.as_secs())))?
}

/// Whether `url` answers an MCP `initialize` request with 401 (asked after a failed
/// handshake, to tell a server that needs a key from one that is down).
async fn answers_401(http: &reqwest::Client, url: &str, bearer: Option<&str>) -> bool {
    let initialize = json!({
        "jsonrpc": "2.0",
        "id": 0,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-03-26",
            "capabilities": {},
            "clientInfo": {"name": "skein", "version": env!("CARGO_PKG_VERSION")},
        },
    });
    let mut request = http
        .post(url)
        .header(reqwest::header::ACCEPT, "application/json, text/event-stream")
        .json(&initialize);
    if let Some(key) = bearer {
        request = request.bearer_auth(key);
    }
    request
        .send()
        .await
        .is_ok_and(|r| r.status() == reqwest::StatusCode::UNAUTHORIZED)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offered_names_are_openai_function_names() {
        assert_eq!(offered_name("counter", "count"), "counter__count");
        assert_eq!(offered_name("web.search", "find page"), "web_search__find_page");
        assert_eq!(offered_name(&"s".repeat(40), &"t".repeat(40)).len(), 64);
    }

    /// A run resumed after the admin took a program off the list does not run it.
    #[tokio::test]
    async fn a_program_off_the_admins_list_is_not_started() {
        let yaml = "name: t\ntool_servers:\n  s: { command: [/bin/true] }\nagents:\n  a:\n    endpoint: { url: \"https://api.example.org/v1\", model: m }\n    tools: [s.x]\nsteps:\n  - { id: go, agent: a, prompt: hi }\n";
        let workflow = skein_dsl::parse("t.yaml", yaml).workflow.unwrap();
        let db = crate::store::Db::temporary().unwrap();
        let secrets = crate::secrets::Secrets::open(&db, &crate::secrets::SecretsKey::random().unwrap()).unwrap();
        let policy = crate::egress::EgressPolicy::new(crate::egress::EgressRules::default(), Vec::new());
        let access = ToolAccess {
            commands: Arc::new(Vec::new()),
            clients: Clients::new(Arc::new(policy), secrets),
        };
        let error = ToolBox::connect(&workflow, "a", "alice", &access).await.unwrap_err();
        assert!(error.to_string().contains("--allow-tool-command /bin/true"), "{error}");
    }

    #[test]
    fn long_results_are_cut_at_a_character_boundary_and_say_so() {
        let text = "é".repeat(MAX_RESULT_BYTES);
        let cut = cut(text);
        assert!(cut.ends_with(&format!("[cut: {} bytes in all]", 2 * MAX_RESULT_BYTES)));
        assert!(cut.len() < MAX_RESULT_BYTES + 40);
    }
}
