//! Lowering: the spanned [`Node`] tree → a [`Draft`] of the workflow, field
//! by field, reporting every shape problem (unknown keys, wrong types, bad
//! values) without stopping. Cross references and expressions are checked
//! next, by [`crate::check`], which turns a draft into the IR.

use std::collections::{BTreeMap, BTreeSet};

use crate::diag::{Code, Diagnostic};
use crate::ir::{Agent, Backend, Endpoint, Input, InputType, InputValue, Placement, ToolRef, ToolServer};
use crate::node::{Node, NodeKind};
use crate::read::{self, Cx, NameKind};
use crate::source::Span;

mod model;
mod reflex;
mod step;
mod tools;
pub use model::is_valid_repo_id;
use model::model_requirement;
pub use reflex::ReflexDraft;
use reflex::reflex;
pub use step::StepDraft;
use step::step;

/// The workflow format version this crate reads.
pub const FORMAT_VERSION: i64 = 1;

const TOP_KEYS: &[&str] = &[
    "version",
    "name",
    "description",
    "inputs",
    "agents",
    "steps",
    "reflexes",
    "placement",
    "tool_servers",
];
const INPUT_KEYS: &[&str] = &["type", "default", "description"];
const AGENT_KEYS: &[&str] = &[
    "model",
    "endpoint",
    "system",
    "temperature",
    "max_tokens",
    "tools",
    "max_turns",
    "tool_choice",
];
const MODEL_KEYS: &[&str] = &[
    "repo",
    "revision",
    "variants",
    "formats",
    "context",
    "concurrency",
    "min_precision",
    "prefer",
    "gpu",
    "engines",
    "adapter",
];
const VARIANT_KEYS: &[&str] = &["repo", "file", "revision"];
const GPU_KEYS: &[&str] = &["models", "nodes", "min_compute_capability", "min_memory", "max_gpus"];
/// `api_key_env` is read only to refuse it with a diagnostic that says what to write.
const ENDPOINT_KEYS: &[&str] = &["url", "model", "api_key_secret", "api_key_env"];
const PLACEMENT_KEYS: &[&str] = &["priority", "max_gpus_per_agent"];
const TOOL_SERVER_KEYS: &[&str] = &["command", "url", "api_key_secret", "in_flight"];

/// Default context length when a model requirement names none.
pub const DEFAULT_CONTEXT: u32 = 4096;

/// A name with where it is written.
pub type Named = (String, Span);

/// The workflow as read, with the spans the checks need.
pub struct Draft<'n> {
    /// Where the file starts (for problems of the whole file).
    pub root: Span,
    /// `name`.
    pub name: Option<String>,
    /// `description`.
    pub description: Option<String>,
    /// Inputs, with the span of their names.
    pub inputs: BTreeMap<String, (Input, Span)>,
    /// Agents, with the span of their names.
    pub agents: BTreeMap<String, (Agent, Span)>,
    /// Whether an `agents` key was present.
    pub agents_present: bool,
    /// Every validly named agent, including those whose body has errors,
    /// so that references to them are not reported as undefined too.
    pub declared_agents: BTreeSet<String>,
    /// Every validly named input, likewise.
    pub declared_inputs: BTreeSet<String>,
    /// Steps in order.
    pub steps: Vec<StepDraft<'n>>,
    /// Reflexes in order.
    pub reflexes: Vec<ReflexDraft<'n>>,
    /// `placement`.
    pub placement: Placement,
    /// Tool servers, with the span of their names.
    pub tool_servers: BTreeMap<String, (ToolServer, Span)>,
    /// Every validly named tool server, including those whose body has errors.
    pub declared_tool_servers: BTreeSet<String>,
    /// Each agent's `tools`, with where each is written, by agent.
    pub tool_refs: BTreeMap<String, Vec<(ToolRef, Span)>>,
}

/// Read the whole document.
pub fn workflow<'n>(cx: &mut Cx<'_>, root: &'n Node) -> Option<Draft<'n>> {
    let anchor = Span::point(root.span.start);
    let mut m = read::map(cx, root, anchor, "the workflow", TOP_KEYS)?;
    if let Some(v) = m.get("version")
        && let Some(n) = read::integer(cx, v, "`version`", 1, i64::MAX)
        && n != FORMAT_VERSION
    {
        cx.push(
            Diagnostic::error(
                Code::BadValue,
                v.span,
                format!("workflow format version {n} is not supported"),
            )
            .with_label("unsupported version")
            .with_help(format!(
                "this Skein reads `version: {FORMAT_VERSION}`; upgrade Skein or rewrite the file"
            )),
        );
    }
    let name = if cx.script && m.get("name").is_none() {
        cx.push(
            Diagnostic::error(
                Code::MissingKey,
                anchor,
                "the script never calls `workflow(...)`, so the workflow has no name",
            )
            .with_label("no `workflow(...)` call")
            .with_help("start the script with `workflow(\"my-workflow\");`"),
        );
        None
    } else {
        m.require(cx, "name", "my-workflow")
    }
    .and_then(|n| read::string(cx, n, "`name`").and_then(|s| read::name(cx, n.span, &s, NameKind::Workflow)));
    let description = m.get("description").and_then(|n| read::string(cx, n, "`description`"));
    let inputs_node = m.get("inputs");
    let inputs = inputs_node.map(|n| inputs(cx, n)).unwrap_or_default();
    let agents_node = m.entry("agents");
    let declared_agents = agents_node.map(|e| declared(&e.value)).unwrap_or_default();
    let declared_inputs = inputs_node.map(declared).unwrap_or_default();
    let servers_node = m.entry("tool_servers");
    let declared_tool_servers = servers_node.map(|e| declared(&e.value)).unwrap_or_default();
    let tool_servers = servers_node
        .map(|e| tools::tool_servers(cx, &e.value, e.key_span))
        .unwrap_or_default();
    let (agents, tool_refs) = agents_node
        .map(|e| agents(cx, &e.value, e.key_span))
        .unwrap_or_default();
    let steps = m
        .get("steps")
        .and_then(|n| read::seq(cx, n, "`steps`", "- { id: ask, agent: helper, prompt: \"...\" }"))
        .map(|items| items.iter().map(|n| step(cx, n)).collect())
        .unwrap_or_default();
    let reflexes = m
        .get("reflexes")
        .and_then(|n| {
            read::seq(
                cx,
                n,
                "`reflexes`",
                "- { name: hot, when: \"gpu.util > 0.8\", do: [notify] }",
            )
        })
        .map(|items| items.iter().map(|n| reflex(cx, n)).collect())
        .unwrap_or_default();
    let placement = m
        .entry("placement")
        .map(|e| placement(cx, &e.value, e.key_span))
        .unwrap_or_default();
    m.finish(cx);
    Some(Draft {
        root: anchor,
        name,
        description,
        inputs,
        agents,
        agents_present: agents_node.is_some(),
        declared_agents,
        declared_inputs,
        steps,
        reflexes,
        placement,
        tool_servers,
        declared_tool_servers,
        tool_refs,
    })
}

/// The valid names declared in an open-ended mapping (`agents`, `inputs`,
/// `tool_servers`).
fn declared(node: &Node) -> BTreeSet<String> {
    match &node.kind {
        NodeKind::Map(entries) => entries
            .iter()
            .filter(|e| crate::ir::is_valid_name(&e.key))
            .map(|e| e.key.clone())
            .collect(),
        _ => BTreeSet::new(),
    }
}

fn inputs(cx: &mut Cx<'_>, node: &Node) -> BTreeMap<String, (Input, Span)> {
    let mut out = BTreeMap::new();
    let Some(mut m) = read::map(cx, node, node.span, "`inputs`", &[]) else {
        return out;
    };
    for e in m.all() {
        let Some(name) = read::name(cx, e.key_span, &e.key, NameKind::Input) else {
            continue;
        };
        // `figure: string` is short for `figure: { type: string }`.
        let input = if matches!(e.value.kind, NodeKind::Scalar(_)) && !e.value.is_null() {
            input_type(cx, &e.value).map(|ty| Input {
                ty,
                default: None,
                description: None,
            })
        } else {
            input(cx, &e.value, e.key_span, &e.key)
        };
        if let Some(i) = input {
            out.insert(name, (i, e.key_span));
        }
    }
    out
}

fn input_type(cx: &mut Cx<'_>, node: &Node) -> Option<InputType> {
    const TYPES: [(&str, InputType); 5] = [
        ("string", InputType::String),
        ("integer", InputType::Integer),
        ("number", InputType::Number),
        ("boolean", InputType::Boolean),
        ("list", InputType::List),
    ];
    let names: Vec<&str> = TYPES.iter().map(|t| t.0).collect();
    read::choice(cx, node, "input type", &names).map(|i| TYPES[i].1)
}

fn input(cx: &mut Cx<'_>, node: &Node, anchor: Span, name: &str) -> Option<Input> {
    let what = format!("input `{name}`");
    let mut m = read::map(cx, node, anchor, what, INPUT_KEYS)?;
    let ty = m.require(cx, "type", "string").and_then(|n| input_type(cx, n));
    let default = match (m.get("default"), ty) {
        (Some(n), Some(ty)) => input_value(cx, n, ty),
        _ => None,
    };
    let description = m.get("description").and_then(|n| read::string(cx, n, "`description`"));
    m.finish(cx);
    Some(Input {
        ty: ty?,
        default,
        description,
    })
}

fn input_value(cx: &mut Cx<'_>, node: &Node, ty: InputType) -> Option<InputValue> {
    let what = "the default";
    match ty {
        InputType::String => read::string(cx, node, what).map(InputValue::String),
        InputType::Integer => read::integer(cx, node, what, i64::MIN, i64::MAX).map(InputValue::Integer),
        InputType::Number => read::number(cx, node, what, f64::MIN, f64::MAX).map(InputValue::Number),
        InputType::Boolean => read::boolean(cx, node, what).map(InputValue::Boolean),
        InputType::List => list_value(cx, node),
    }
}

/// A list default: strings, numbers and booleans, each typed as an unquoted
/// YAML scalar reads (`[a, 2, true]`); a quoted item is a string.
fn list_value(cx: &mut Cx<'_>, node: &Node) -> Option<InputValue> {
    let items = read::seq(cx, node, "the default of a `list` input", "[GPUs, TPUs]")?;
    if items.len() > crate::ir::MAX_ITEMS {
        cx.push(
            Diagnostic::error(
                Code::BadValue,
                node.span,
                format!(
                    "the default has {} items; a list holds at most {}",
                    items.len(),
                    crate::ir::MAX_ITEMS
                ),
            )
            .with_label("too many items")
            .with_help("shorten the list, or split the work into several runs"),
        );
        return None;
    }
    let mut out = Vec::with_capacity(items.len());
    for item in items {
        let value = match step::json(item) {
            serde_json::Value::Bool(b) => Some(InputValue::Boolean(b)),
            serde_json::Value::Number(n) => n
                .as_i64()
                .map(InputValue::Integer)
                .or_else(|| n.as_f64().map(InputValue::Number)),
            serde_json::Value::String(s) => Some(InputValue::String(s)),
            serde_json::Value::Null | serde_json::Value::Array(_) | serde_json::Value::Object(_) => None,
        };
        match value {
            Some(v) => out.push(v),
            None => cx.wrong_type(item, "an item of a `list` input", "a string, number or boolean", "GPUs"),
        }
    }
    (out.len() == items.len()).then_some(InputValue::List(out))
}

/// Agents and the tools each lists, with where they are written; an agent whose
/// body has an error still has its tools read.
type AgentsRead = (BTreeMap<String, (Agent, Span)>, BTreeMap<String, Vec<(ToolRef, Span)>>);

fn agents(cx: &mut Cx<'_>, node: &Node, anchor: Span) -> AgentsRead {
    let mut out = AgentsRead::default();
    let Some(mut m) = read::map(cx, node, anchor, "`agents`", &[]) else {
        return out;
    };
    for e in m.all() {
        let Some(name) = read::name(cx, e.key_span, &e.key, NameKind::Agent) else {
            continue;
        };
        let (a, tool_refs) = agent(cx, &e.value, e.key_span, &e.key);
        if let Some(a) = a {
            out.0.insert(name.clone(), (a, e.key_span));
        }
        if !tool_refs.is_empty() {
            out.1.insert(name, tool_refs);
        }
    }
    out
}

/// An agent, and the tools it lists even when the rest has an error.
fn agent(cx: &mut Cx<'_>, node: &Node, anchor: Span, name: &str) -> (Option<Agent>, Vec<(ToolRef, Span)>) {
    let what = format!("agent `{name}`");
    let Some(mut m) = read::map(cx, node, anchor, what, AGENT_KEYS) else {
        return (None, Vec::new());
    };
    let model = m.entry("model");
    let endpoint = m.entry("endpoint");
    let backend = match (model, endpoint) {
        (Some(mo), Some(en)) => {
            let (first, second) = if mo.key_span.start < en.key_span.start {
                (mo, en)
            } else {
                (en, mo)
            };
            cx.push(
                Diagnostic::error(
                    Code::ModelAndEndpoint,
                    second.key_span,
                    format!("agent `{name}` has both a `model` and an `endpoint`"),
                )
                .with_label(format!("`{}` here", second.key))
                .with_related(first.key_span, format!("`{}` here", first.key))
                .with_help("an agent is served by a model Skein places, or by a remote endpoint: keep one"),
            );
            None
        }
        (Some(mo), None) => model_requirement(cx, &mo.value, mo.key_span, name).map(Backend::Model),
        (None, Some(en)) => endpoint_spec(cx, &en.value, en.key_span, name).map(Backend::Endpoint),
        (None, None) if misspells(node, &["model", "endpoint"]) => None,
        (None, None) => {
            cx.push(
                Diagnostic::error(
                    Code::NoModelOrEndpoint,
                    anchor,
                    format!("agent `{name}` has neither a `model` nor an `endpoint`"),
                )
                .with_label("no model or endpoint")
                .with_help("add `model: { repo: owner/name }` or `endpoint: { url: ..., model: ... }`"),
            );
            None
        }
    };
    let system = m.get("system").and_then(|n| read::string(cx, n, "`system`"));
    let temperature = m
        .get("temperature")
        .and_then(|n| read::number(cx, n, "`temperature`", 0.0, 2.0));
    let max_tokens = m.get("max_tokens").and_then(|n| read::count(cx, n, "`max_tokens`", 1));
    let tool_refs = m.get("tools").map(|n| tools::tools(cx, n, name)).unwrap_or_default();
    let max_turns = m
        .get("max_turns")
        .and_then(|n| read::integer(cx, n, "`max_turns`", 1, i64::from(crate::ir::MAX_TURNS)))
        .and_then(|n| u32::try_from(n).ok());
    let tool_choice = m
        .get("tool_choice")
        .and_then(|n| tools::tool_choice(cx, n, name, &tool_refs, max_turns));
    m.finish(cx);
    let agent = backend.map(|backend| Agent {
        backend,
        system,
        temperature,
        max_tokens,
        tools: tool_refs.iter().map(|(r, _)| r.clone()).collect(),
        max_turns,
        tool_choice,
    });
    (agent, tool_refs)
}

/// Whether some key of the mapping `node` looks like a misspelling of one of
/// `keys` (it is then reported as unknown, with a suggestion, and problems
/// that only follow from the missing key are not reported again).
fn misspells(node: &Node, keys: &[&str]) -> bool {
    let NodeKind::Map(entries) = &node.kind else {
        return false;
    };
    entries
        .iter()
        .filter(|e| !keys.contains(&e.key.as_str()))
        .any(|e| skein_text::closest(&e.key, keys.iter().copied()).is_some())
}

fn endpoint_spec(cx: &mut Cx<'_>, node: &Node, anchor: Span, agent: &str) -> Option<Endpoint> {
    let what = format!("the endpoint of agent `{agent}`");
    let mut m = read::map(cx, node, anchor, what, ENDPOINT_KEYS)?;
    let url = m.require(cx, "url", "https://api.example.org/v1").and_then(|n| {
        http_url(
            cx,
            n,
            "give the base URL of an OpenAI-compatible API, e.g. `https://api.example.org/v1`",
        )
    });
    let model = m
        .require(cx, "model", "model-name")
        .and_then(|n| read::nonempty(cx, n, "`model`"));
    if let Some(n) = m.get("api_key_env") {
        cx.push(
            Diagnostic::error(
                Code::BadValue,
                n.span,
                "`api_key_env` is no longer read: a workflow cannot read the server's environment",
            )
            .with_label("a workflow names a secret, not a variable")
            .with_help(
                "store the key as a secret (`skein secret set NAME`, the value on standard input) and write `api_key_secret: NAME`",
            ),
        );
    }
    let api_key_secret = m.get("api_key_secret").and_then(|n| secret_reference(cx, n));
    if let Some(n) = m.get("url") {
        cx.endpoint_urls.insert(agent.to_owned(), n.span);
    }
    m.finish(cx);
    Some(Endpoint {
        url: url?,
        model: model?,
        api_key_secret,
    })
}

/// An `http` or `https` URL (any case) with something after the scheme and no
/// whitespace; `help` says what the URL should point at.
fn http_url(cx: &mut Cx<'_>, node: &Node, help: &str) -> Option<String> {
    let url = read::string(cx, node, "`url`")?;
    let ok = ["http://", "https://"]
        .iter()
        .any(|p| url.len() > p.len() && url.get(..p.len()).is_some_and(|s| s.eq_ignore_ascii_case(p)))
        && !url.chars().any(char::is_whitespace);
    if ok {
        return Some(url);
    }
    cx.push(
        Diagnostic::error(Code::BadValue, node.span, format!("`{url}` is not an http(s) URL"))
            .with_label("expected http:// or https://")
            .with_help(help),
    );
    None
}

/// `api_key_secret`: the name of a secret (`NAME` or `shared/NAME`), never the key.
fn secret_reference(cx: &mut Cx<'_>, node: &Node) -> Option<String> {
    let v = read::string(cx, node, "`api_key_secret`")?;
    if crate::ir::is_valid_secret_reference(&v) {
        return Some(v);
    }
    cx.push(
        Diagnostic::error(Code::BadValue, node.span, format!("`{v}` is not a secret name"))
            .with_label("invalid secret name")
            .with_help(
                "name a secret stored with `skein secret set NAME` (letters, digits, `-`, `_`, `.`), or `shared/NAME` for one the admin published; never write the key itself",
            ),
    );
    None
}

fn named(cx: &mut Cx<'_>, node: &Node, kind: NameKind) -> Option<Named> {
    let s = read::string(cx, node, &format!("{kind:?} name").to_lowercase())?;
    read::name(cx, node.span, &s, kind).map(|n| (n, node.span))
}

fn placement(cx: &mut Cx<'_>, node: &Node, anchor: Span) -> Placement {
    let Some(mut m) = read::map(cx, node, anchor, "`placement`", PLACEMENT_KEYS) else {
        return Placement::default();
    };
    let priority = m
        .get("priority")
        .and_then(|n| read::integer(cx, n, "`priority`", -1000, 1000))
        .and_then(|p| i32::try_from(p).ok())
        .unwrap_or(0);
    let max_gpus_per_agent = m
        .get("max_gpus_per_agent")
        .and_then(|n| read::count(cx, n, "`max_gpus_per_agent`", 1));
    m.finish(cx);
    Placement {
        priority,
        max_gpus_per_agent,
    }
}
