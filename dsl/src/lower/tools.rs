//! Lowering `tool_servers` (how each MCP server is reached, what a resumed run does
//! with its calls that were in flight) and an agent's `tools` (`server.tool` or
//! `server.*`). Whether the servers an agent names exist is checked next, by
//! [`crate::check`].

use std::collections::BTreeMap;

use super::{TOOL_SERVER_KEYS, http_url, misspells, secret_reference};
use crate::diag::{Code, Diagnostic};
use crate::ir::{InFlight, ToolChoice, ToolRef, ToolServer, ToolTransport, is_valid_name, is_valid_tool_name};
use crate::node::{Node, NodeKind};
use crate::read::{self, Cx, NameKind};
use crate::source::Span;

/// The policies of `in_flight`, as written.
const POLICIES: [(&str, InFlight); 3] = [
    ("retry", InFlight::Retry),
    ("fail", InFlight::Fail),
    ("ask", InFlight::Ask),
];

/// The key of `in_flight` that sets the policy of every tool not named.
const EVERY_OTHER_TOOL: &str = "*";

/// `tool_servers:` — each server by name, with the span of its name.
pub(super) fn tool_servers(cx: &mut Cx<'_>, node: &Node, anchor: Span) -> BTreeMap<String, (ToolServer, Span)> {
    let mut out = BTreeMap::new();
    let Some(mut m) = read::map(cx, node, anchor, "`tool_servers`", &[]) else {
        return out;
    };
    for e in m.all() {
        let Some(name) = read::name(cx, e.key_span, &e.key, NameKind::ToolServer) else {
            continue;
        };
        if let Some(server) = tool_server(cx, &e.value, e.key_span, &name) {
            out.insert(name, (server, e.key_span));
        }
    }
    out
}

fn tool_server(cx: &mut Cx<'_>, node: &Node, anchor: Span, name: &str) -> Option<ToolServer> {
    let what = format!("tool server `{name}`");
    let mut m = read::map(cx, node, anchor, what, TOOL_SERVER_KEYS)?;
    let command = m.entry("command");
    let url = m.entry("url");
    let secret = m.entry("api_key_secret");
    let api_key_secret = secret.and_then(|e| secret_reference(cx, &e.value));
    let transport = match (command, url) {
        (Some(c), Some(u)) => {
            let (first, second) = if c.key_span.start < u.key_span.start {
                (c, u)
            } else {
                (u, c)
            };
            cx.push(
                Diagnostic::error(
                    Code::CommandAndUrl,
                    second.key_span,
                    format!("tool server `{name}` has both a `command` and a `url`"),
                )
                .with_label(format!("`{}` here", second.key))
                .with_related(first.key_span, format!("`{}` here", first.key))
                .with_help(
                    "a tool server is a program Skein starts (`command`) or an MCP endpoint it calls (`url`): keep one",
                ),
            );
            None
        }
        (Some(c), None) => {
            if let Some(s) = secret {
                cx.push(
                    Diagnostic::error(
                        Code::BadValue,
                        s.key_span,
                        format!("tool server `{name}` is started by `command`, so it takes no `api_key_secret`"),
                    )
                    .with_label("only for a server reached by `url`")
                    .with_help(
                        "a program started by `command` runs with an empty environment and is sent no secret: remove `api_key_secret`",
                    ),
                );
            }
            cx.tool_transports.insert(name.to_owned(), c.value.span);
            program(cx, &c.value).map(|command| ToolTransport::Stdio { command })
        }
        (None, Some(u)) => {
            cx.tool_transports.insert(name.to_owned(), u.value.span);
            http_url(
                cx,
                &u.value,
                "give the URL of a streamable-HTTP MCP endpoint, e.g. `https://mcp.example.org/mcp`",
            )
            .map(|url| ToolTransport::Http { url, api_key_secret })
        }
        (None, None) if misspells(node, &["command", "url"]) => None,
        (None, None) => {
            cx.push(
                Diagnostic::error(
                    Code::NoCommandOrUrl,
                    anchor,
                    format!("tool server `{name}` has neither a `command` nor a `url`"),
                )
                .with_label("no command or url")
                .with_help("add `command: [program, arg, ...]` for a program Skein starts, or `url: https://...` for an MCP endpoint"),
            );
            None
        }
    };
    let (in_flight, default_in_flight) = m.get("in_flight").map(|n| in_flight(cx, n)).unwrap_or_default();
    m.finish(cx);
    Some(ToolServer {
        transport: transport?,
        in_flight,
        default_in_flight,
    })
}

/// `command:` — a program and its arguments: a list whose first item is not empty.
fn program(cx: &mut Cx<'_>, node: &Node) -> Option<Vec<String>> {
    let items = read::seq(cx, node, "`command`", "[mcp-tools, --count-file, /tmp/count]")?;
    let mut command = Vec::with_capacity(items.len());
    let mut ok = true;
    for item in items {
        match read::string(cx, item, "an item of `command`") {
            Some(s) if s.contains('\0') => {
                ok = false;
                cx.push(
                    Diagnostic::error(
                        Code::BadValue,
                        item.span,
                        "a program's argument cannot hold a NUL character",
                    )
                    .with_label("NUL character")
                    .with_help("remove the `\\0` escape"),
                );
            }
            Some(s) => command.push(s),
            None => ok = false,
        }
    }
    if items.is_empty() || command.first().is_some_and(|p| p.trim().is_empty()) {
        let at = items.first().map_or(node.span, |n| n.span);
        cx.push(
            Diagnostic::error(Code::BadValue, at, "the `command` names no program")
                .with_label(if items.is_empty() {
                    "empty list"
                } else {
                    "empty program"
                })
                .with_help(
                    "list the program first, then its arguments: `command: [mcp-tools, --count-file, /tmp/count]`",
                ),
        );
        return None;
    }
    ok.then_some(command)
}

/// `in_flight:` — one policy for every tool, or a mapping of tool name (or `*`, every
/// other tool) to policy. Every tool not given one fails.
fn in_flight(cx: &mut Cx<'_>, node: &Node) -> (BTreeMap<String, InFlight>, InFlight) {
    let names: Vec<&str> = POLICIES.iter().map(|p| p.0).collect();
    let policy = |cx: &mut Cx<'_>, n: &Node| read::choice(cx, n, "in-flight policy", &names).map(|i| POLICIES[i].1);
    if matches!(node.kind, NodeKind::Scalar(_)) && !node.is_null() {
        return (BTreeMap::new(), policy(cx, node).unwrap_or_default());
    }
    if matches!(node.kind, NodeKind::Seq(_)) {
        cx.wrong_type(
            node,
            "`in_flight`",
            "`retry`, `fail`, `ask` or a mapping",
            "{ count: retry, \"*\": fail }",
        );
        return Default::default();
    }
    let mut tools = BTreeMap::new();
    let mut default = InFlight::default();
    let Some(mut m) = read::map(cx, node, node.span, "`in_flight`", &[]) else {
        return (tools, default);
    };
    for e in m.all() {
        let Some(p) = policy(cx, &e.value) else {
            continue;
        };
        if e.key == EVERY_OTHER_TOOL {
            default = p;
        } else if is_valid_tool_name(&e.key) {
            tools.insert(e.key.clone(), p);
        } else {
            cx.push(
                Diagnostic::error(Code::BadName, e.key_span, format!("`{}` is not a tool name", e.key))
                    .with_label("invalid tool name")
                    .with_help(
                        "tool names are 1 to 128 letters, digits, `-` and `_`; `\"*\"` (quoted in YAML) sets the policy of every other tool",
                    ),
            );
        }
    }
    (tools, default)
}

/// An agent's `tools:` — each `server.tool` or `server.*` with where it is written,
/// without repeats (a repeat, or a tool its server's `*` already gives, is reported).
pub(super) fn tools(cx: &mut Cx<'_>, node: &Node, agent: &str) -> Vec<(ToolRef, Span)> {
    let parsed: Vec<(ToolRef, Span)> = read::list(node)
        .into_iter()
        .filter_map(|n| tool_ref(cx, n).map(|r| (r, n.span)))
        .collect();
    let every: BTreeMap<&str, Span> = parsed
        .iter()
        .rev()
        .filter(|(r, _)| r.tool.is_none())
        .map(|(r, span)| (r.server.as_str(), *span))
        .collect();
    let mut out: Vec<(ToolRef, Span)> = Vec::with_capacity(parsed.len());
    for (r, span) in &parsed {
        let written = written(r);
        if let Some((_, first)) = out.iter().find(|(o, _)| o == r) {
            cx.push(
                Diagnostic::error(
                    Code::DuplicateTool,
                    *span,
                    format!("agent `{agent}` lists `{written}` twice"),
                )
                .with_label("listed again")
                .with_related(*first, "first here")
                .with_help(format!("remove the second `{written}`")),
            );
        } else if let (Some(_), Some(all)) = (&r.tool, every.get(r.server.as_str())) {
            cx.push(
                Diagnostic::error(
                    Code::DuplicateTool,
                    *span,
                    format!(
                        "agent `{agent}` lists `{written}`, which `{}.*` already gives it",
                        r.server
                    ),
                )
                .with_label("already given")
                .with_related(*all, format!("every tool of `{}`", r.server))
                .with_help(format!(
                    "remove `{written}`, or replace `{}.*` with the tools the agent needs",
                    r.server
                )),
            );
        } else {
            out.push((r.clone(), *span));
        }
    }
    out
}

/// An agent's `tool_choice`: `auto`, `required`, or one `server.tool` among the tools
/// `listed` (its `tools`). Anything but `auto` needs tools and a second model call (the
/// loop's last call must answer, and `max_turns: 1` leaves only that one).
pub(super) fn tool_choice(
    cx: &mut Cx<'_>,
    node: &Node,
    agent: &str,
    listed: &[(ToolRef, Span)],
    max_turns: Option<u32>,
) -> Option<ToolChoice> {
    let text = read::string(cx, node, "`tool_choice`")?;
    let choice = if text.eq_ignore_ascii_case("auto") {
        ToolChoice::Auto
    } else if text.eq_ignore_ascii_case("required") {
        ToolChoice::Required
    } else {
        let r = tool_ref(cx, node)?;
        if r.tool.is_none() {
            cx.push(
                Diagnostic::error(
                    Code::BadValue,
                    node.span,
                    format!("`tool_choice` of agent `{agent}` names every tool of `{}`", r.server),
                )
                .with_label("one tool, `auto` or `required`")
                .with_help("write `required` to make the model call one of its tools, or `SERVER.TOOL` for one tool"),
            );
            return None;
        }
        ToolChoice::Tool(r)
    };
    if choice == ToolChoice::Auto {
        return Some(choice);
    }
    let problem = if listed.is_empty() {
        Some((
            format!("agent `{agent}` sets `tool_choice` but lists no `tools`"),
            "no tools to choose",
            "give the agent `tools`, or remove `tool_choice`".to_owned(),
        ))
    } else if max_turns == Some(1) {
        Some((
            format!("agent `{agent}` has `max_turns: 1`, so its only model call must answer and cannot call a tool"),
            "needs a second model call",
            "raise `max_turns`, or remove `tool_choice`".to_owned(),
        ))
    } else {
        match &choice {
            ToolChoice::Tool(wanted)
                if !listed
                    .iter()
                    .any(|(r, _)| r.server == wanted.server && (r.tool.is_none() || r.tool == wanted.tool)) =>
            {
                let written = written(wanted);
                Some((
                    format!("`tool_choice` of agent `{agent}` names `{written}`, which is not among its `tools`"),
                    "not in `tools`",
                    format!("add `{written}` to the agent's `tools`, or choose one of them"),
                ))
            }
            _ => None,
        }
    };
    if let Some((message, label, help)) = problem {
        cx.push(
            Diagnostic::error(Code::BadValue, node.span, message)
                .with_label(label)
                .with_help(help),
        );
        return None;
    }
    Some(choice)
}

/// `server.tool` or `server.*` as written.
fn written(r: &ToolRef) -> String {
    format!("{}.{}", r.server, r.tool.as_deref().unwrap_or(EVERY_OTHER_TOOL))
}

/// One `server.tool` or `server.*`.
fn tool_ref(cx: &mut Cx<'_>, node: &Node) -> Option<ToolRef> {
    let text = read::string(cx, node, "a tool")?;
    let parts: Vec<&str> = text.split('.').collect();
    let problem = match parts.as_slice() {
        [server] => Some((
            format!("`{text}` names no tool"),
            format!("write `{server}.TOOL` for one tool of server `{server}`, or `{server}.*` for every tool it has"),
        )),
        [server, ""] => Some((
            format!("`{text}` names no tool"),
            format!("write `{server}.TOOL` for one tool, or `{server}.*` for every tool of the server"),
        )),
        ["", tool] => Some((
            format!("`{text}` names no tool server"),
            format!("write `SERVER.{tool}`, with a server declared under `tool_servers`"),
        )),
        [_, _] => None,
        _ => Some((
            format!("`{text}` has more than one `.`"),
            "a tool is written `server.tool` (tool names in workflows have no `.`); `server.*` gives every tool of a server, whatever its names".to_owned(),
        )),
    };
    let problem = problem.or_else(|| match parts.as_slice() {
        [server, _] if !is_valid_name(server) => Some((
            format!("`{server}` is not a valid tool server name"),
            "tool server names start with a letter and use only letters, digits, `-` and `_` (at most 64)".to_owned(),
        )),
        [server, tool] if *tool != EVERY_OTHER_TOOL && !is_valid_tool_name(tool) => Some((
            format!("`{tool}` is not a tool name"),
            format!(
                "tool names are 1 to 128 letters, digits, `-` and `_`; `{server}.*` gives every tool of `{server}`"
            ),
        )),
        _ => None,
    });
    if let Some((message, help)) = problem {
        cx.push(
            Diagnostic::error(Code::BadToolRef, node.span, message)
                .with_label("expected `server.tool` or `server.*`")
                .with_help(help),
        );
        return None;
    }
    let (server, tool) = text.split_once('.')?;
    Some(ToolRef {
        server: server.to_owned(),
        tool: (tool != EVERY_OTHER_TOOL).then(|| tool.to_owned()),
    })
}
