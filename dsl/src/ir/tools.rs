//! Tool servers, the tools an agent may call, and what its loop must do with them.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// A tool server an agent's steps call tools on, over the Model Context Protocol.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolServer {
    /// How the orchestrator reaches it.
    pub transport: ToolTransport,
    /// What a resumed run does with a call of each tool that was in flight when the
    /// orchestrator stopped (by tool name); a tool not listed gets `default_in_flight`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub in_flight: BTreeMap<String, InFlight>,
    /// The policy of the tools `in_flight` does not name.
    #[serde(default)]
    pub default_in_flight: InFlight,
}

/// How a tool server is reached.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolTransport {
    /// A program the orchestrator starts and speaks to over its stdin and stdout.
    /// It runs only if the server's admin allowed that program
    /// (`skein server --allow-tool-command`), with an empty environment.
    Stdio {
        /// The program and its arguments.
        command: Vec<String>,
    },
    /// A streamable-HTTP MCP endpoint, reached under the egress policy like an
    /// endpoint agent.
    Http {
        /// `http` or `https` URL of the MCP endpoint.
        url: String,
        /// The secret holding a bearer token for it (`NAME` or `shared/NAME`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        api_key_secret: Option<String>,
    },
}

/// What a resumed run does with a tool call that was sent but whose result was never
/// recorded (the orchestrator stopped while it was in flight).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum InFlight {
    /// Send it again: the tool is idempotent.
    Retry,
    /// Fail the step's attempt with the interrupted call as the reason (the step's
    /// `retries` then apply to the whole attempt, which starts a new loop).
    #[default]
    Fail,
    /// Ask a person: the step (or its `for_each` item) waits for approval naming the
    /// call; approved, the call is sent again; rejected, the attempt fails as under
    /// `Fail`.
    Ask,
}

/// A tool an agent may call: `server.tool`, or every tool of `server`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ToolRef {
    /// The tool server's name in `tool_servers`.
    pub server: String,
    /// The tool's name, or `None` for all of the server's tools (`server.*`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool: Option<String>,
}

impl ToolServer {
    /// The in-flight policy of tool `tool`.
    pub fn in_flight_of(&self, tool: &str) -> InFlight {
        self.in_flight.get(tool).copied().unwrap_or(self.default_in_flight)
    }
}

/// An agent's `tool_choice`: whether its loop's first model call must call a tool.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolChoice {
    /// The model decides (OpenAI's `auto`).
    Auto,
    /// The model must call one of the agent's tools (OpenAI's `required`).
    Required,
    /// The model must call this tool (a `server.tool` the agent lists, or one its
    /// `server.*` gives it).
    Tool(ToolRef),
}
