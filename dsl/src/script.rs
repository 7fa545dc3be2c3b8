//! Rhai front end: a `.rhai` workflow script → the same [`Node`] tree the
//! YAML front end builds.
//!
//! A script calls a small registered API — `workflow`, `description`,
//! `input`, `agent`, `tool_server`, `step`, `reflex`, `placement` — whose arguments are the
//! same values a YAML file would hold (object maps, arrays, strings,
//! numbers). Each call's values are recorded with the call's position; the
//! tree then goes through the one lowering and checking path, so a script
//! and a YAML file that say the same thing give equal IR. Scripts run in the
//! sandbox of [`crate::expr::SCRIPT_LIMITS`].

use std::sync::{Arc, Mutex, PoisonError};

use rhai::{Dynamic, EvalAltResult, NativeCallContext, Position};

use crate::diag::{Code, Diagnostic, Diagnostics};
use crate::expr::{self, ExprErrorKind, SCRIPT_LIMITS};
use crate::node::{Entry, Node, NodeKind, Scalar, ScalarStyle};
use crate::source::{SourceFile, Span};
use crate::yaml::{MAX_DEPTH, MAX_NODES};

/// What the script's calls declared so far.
#[derive(Default)]
struct State {
    top: Vec<Entry>,
    inputs: Vec<Entry>,
    agents: Vec<Entry>,
    tool_servers: Vec<Entry>,
    steps: Vec<Node>,
    reflexes: Vec<Node>,
    diags: Vec<Diagnostic>,
    nodes: usize,
}

type Shared = Arc<Mutex<State>>;
type CallResult = Result<(), Box<EvalAltResult>>;

/// Run the script in `file` and build the workflow tree. Problems (syntax,
/// runtime errors, limits, wrong values) are pushed into `diags`.
pub fn parse(file: &SourceFile, diags: &mut Diagnostics) -> Option<Node> {
    let state: Shared = Arc::default();
    let mut engine = expr::sandbox(SCRIPT_LIMITS);
    register(&mut engine, file, &state);

    // On a pool thread (see `crate::parse_as`), within the script's budget.
    let result = expr::with_budget(SCRIPT_LIMITS.budget_ms, || engine.run(file.text()));
    let mut st = std::mem::take(&mut *state.lock().unwrap_or_else(PoisonError::into_inner));
    for d in st.diags.drain(..) {
        diags.push(d);
    }
    if let Err(e) = result {
        let err = expr::eval_error(file.text(), &e);
        let at = err.offset.unwrap_or(0);
        let end = file.text()[at.min(file.text().len())..]
            .char_indices()
            .nth(1)
            .map_or(file.text().len(), |(i, _)| at + i);
        let span = Span::new(at, end);
        let d = match err.kind {
            ExprErrorKind::Limit => Diagnostic::error(Code::ScriptLimit, span, format!("the script was stopped: {}", err.message))
                .with_label("limit reached here")
                .with_help(format!(
                    "a workflow script runs at most {} operations for at most {} ms, nests calls at most {} deep, builds strings of at most {} bytes and declares at most {MAX_NODES} values; look for a loop that never ends",
                    SCRIPT_LIMITS.max_operations, SCRIPT_LIMITS.budget_ms, SCRIPT_LIMITS.max_call_levels, SCRIPT_LIMITS.max_string_size
                )),
            ExprErrorKind::Syntax => {
                let help = match keyword_key(file, at) {
                    Some(k) => format!("`{k}` is a Rhai keyword: as a map key it must be quoted, `\"{k}\": ...`"),
                    None if err.message.contains("'curry'")
                        || file.text().get(at..).unwrap_or("").trim_start_matches('.').starts_with("curry") =>
                    {
                        "`curry` is not available in workflow scripts: pass every argument when calling the function".to_owned()
                    }
                    None if err.message.contains("name of a property") => {
                        "a map key that is a Rhai keyword (`for`, `do`, `until`, `default`, ...) must be quoted: `\"for\": \"5s\"`".to_owned()
                    }
                    None => "see docs/workflows.md for the workflow script API".to_owned(),
                };
                Diagnostic::error(Code::ScriptError, span, format!("invalid Rhai: {}", err.message))
                    .with_label("here")
                    .with_help(help)
            }
            ExprErrorKind::UndefinedVariable(v) => Diagnostic::error(Code::ScriptError, span, format!("invalid Rhai: `{v}` is not defined here"))
                .with_label("unknown variable")
                .with_help(format!(
                    "define `{v}` with `let` before this line; a function cannot see variables outside it (closures that capture are not available): pass `{v}` as an argument"
                )),
            _ => Diagnostic::error(Code::ScriptError, span, format!("the script failed: {}", err.message))
                .with_label("here")
                .with_help("see docs/workflows.md for the workflow script API"),
        };
        diags.push(d);
        return None;
    }

    let root_span = Span::point(0);
    let mut entries = std::mem::take(&mut st.top);
    let section = |key: &str, kind: NodeKind| Entry {
        key: key.to_owned(),
        key_span: root_span,
        value: Node { span: root_span, kind },
    };
    if !st.inputs.is_empty() {
        entries.push(section("inputs", NodeKind::Map(st.inputs)));
    }
    if !st.agents.is_empty() {
        entries.push(section("agents", NodeKind::Map(st.agents)));
    }
    if !st.tool_servers.is_empty() {
        entries.push(section("tool_servers", NodeKind::Map(st.tool_servers)));
    }
    if !st.steps.is_empty() {
        entries.push(section("steps", NodeKind::Seq(st.steps)));
    }
    if !st.reflexes.is_empty() {
        entries.push(section("reflexes", NodeKind::Seq(st.reflexes)));
    }
    Some(Node {
        span: root_span,
        kind: NodeKind::Map(entries),
    })
}

/// Workflow keys that are reserved words in Rhai.
const KEYWORD_KEYS: &[&str] = &[
    "for", "do", "until", "default", "loop", "while", "if", "else", "switch", "fn", "let",
];

/// A workflow key that is a Rhai keyword, written unquoted as a map key on
/// the line of `at` (the usual cause of a syntax error there).
fn keyword_key(file: &SourceFile, at: usize) -> Option<&'static str> {
    let line = file.line_col(at).line;
    let text = file.text().lines().nth(line - 1)?;
    KEYWORD_KEYS.iter().copied().find(|k| {
        text.match_indices(k).any(|(i, _)| {
            let before = text[..i].chars().next_back();
            let after = text[i + k.len()..].trim_start();
            !before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '"') && after.starts_with(':')
        })
    })
}

fn register(engine: &mut rhai::Engine, file: &SourceFile, state: &Shared) {
    let text: Arc<str> = Arc::from(file.text());

    // Each registered function records values at the call's position.
    let call_span = {
        let text = text.clone();
        move |ctx: &NativeCallContext, name: &str| -> Span {
            let start = expr::offset_of_position(&text, ctx.call_position()).unwrap_or(0);
            Span::new(start, (start + name.len()).min(text.len()))
        }
    };

    {
        let (st, at) = (state.clone(), call_span.clone());
        engine.register_fn("workflow", move |ctx: NativeCallContext, name: &str| -> CallResult {
            let span = at(&ctx, "workflow");
            with(&st, |s| set_top(s, "name", span, scalar_str(name, span)))
        });
    }
    {
        let (st, at) = (state.clone(), call_span.clone());
        engine.register_fn("description", move |ctx: NativeCallContext, text: &str| -> CallResult {
            let span = at(&ctx, "description");
            with(&st, |s| set_top(s, "description", span, scalar_str(text, span)))
        });
    }
    {
        let (st, at) = (state.clone(), call_span.clone());
        engine.register_fn(
            "placement",
            move |ctx: NativeCallContext, spec: rhai::Map| -> CallResult {
                let span = at(&ctx, "placement");
                with(&st, |s| {
                    let node = convert(s, &Dynamic::from_map(spec), span, 0)?;
                    set_top(s, "placement", span, node)
                })
            },
        );
    }
    for (func, section) in [
        ("input", Section::Inputs),
        ("agent", Section::Agents),
        ("tool_server", Section::ToolServers),
    ] {
        let (st, at) = (state.clone(), call_span.clone());
        engine.register_fn(
            func,
            move |ctx: NativeCallContext, name: &str, spec: Dynamic| -> CallResult {
                let span = at(&ctx, func);
                with(&st, |s| {
                    let node = convert(s, &spec, span, 0)?;
                    named(s, section, name, span, node)
                })
            },
        );
    }
    for (func, section, key) in [("step", Section::Steps, "id"), ("reflex", Section::Reflexes, "name")] {
        let (st, at) = (state.clone(), call_span.clone());
        engine.register_fn(
            func,
            move |ctx: NativeCallContext, name: &str, spec: rhai::Map| -> CallResult {
                let span = at(&ctx, func);
                with(&st, |s| {
                    let mut node = convert(s, &Dynamic::from_map(spec), span, 0)?;
                    if let NodeKind::Map(entries) = &mut node.kind {
                        entries.retain(|e| e.key != key);
                        entries.insert(
                            0,
                            Entry {
                                key: key.to_owned(),
                                key_span: span,
                                value: scalar_str(name, span),
                            },
                        );
                    }
                    match section {
                        Section::Steps => s.steps.push(node),
                        _ => s.reflexes.push(node),
                    }
                    Ok(())
                })
            },
        );
    }
}

#[derive(Clone, Copy)]
enum Section {
    Inputs,
    Agents,
    ToolServers,
    Steps,
    Reflexes,
}

fn with(state: &Shared, f: impl FnOnce(&mut State) -> CallResult) -> CallResult {
    let mut guard = state.lock().unwrap_or_else(PoisonError::into_inner);
    f(&mut guard)
}

fn scalar_str(text: &str, span: Span) -> Node {
    Node {
        span,
        kind: NodeKind::Scalar(Scalar {
            text: text.to_owned(),
            style: ScalarStyle::Quoted,
        }),
    }
}

fn set_top(s: &mut State, key: &str, span: Span, value: Node) -> CallResult {
    if let Some(first) = s.top.iter().find(|e| e.key == key) {
        s.diags.push(
            Diagnostic::error(Code::DuplicateKey, span, format!("`{key}` is set twice"))
                .with_label("second call")
                .with_related(first.key_span, "first call")
                .with_help("call it once"),
        );
        return Ok(());
    }
    s.top.push(Entry {
        key: key.to_owned(),
        key_span: span,
        value,
    });
    Ok(())
}

fn named(s: &mut State, section: Section, name: &str, span: Span, value: Node) -> CallResult {
    let (list, what) = match section {
        Section::Inputs => (&mut s.inputs, "input"),
        Section::ToolServers => (&mut s.tool_servers, "tool server"),
        _ => (&mut s.agents, "agent"),
    };
    if let Some(first) = list.iter().find(|e| e.key == name) {
        let first = first.key_span;
        s.diags.push(
            Diagnostic::error(
                Code::DuplicateKey,
                span,
                format!("the {what} `{name}` is declared twice"),
            )
            .with_label("second declaration")
            .with_related(first, "first declaration")
            .with_help(format!("give each {what} its own name")),
        );
        return Ok(());
    }
    list.push(Entry {
        key: name.to_owned(),
        key_span: span,
        value,
    });
    Ok(())
}

/// A Rhai value as a tree node at `span`. Bounded in depth and total size.
fn convert(s: &mut State, v: &Dynamic, span: Span, depth: usize) -> Result<Node, Box<EvalAltResult>> {
    s.nodes += 1;
    if depth > MAX_DEPTH || s.nodes > MAX_NODES {
        return Err(Box::new(EvalAltResult::ErrorDataTooLarge(
            "Workflow".to_owned(),
            Position::NONE,
        )));
    }
    let scalar = |text: String, style| Node {
        span,
        kind: NodeKind::Scalar(Scalar { text, style }),
    };
    if v.is_unit() {
        return Ok(scalar(String::new(), ScalarStyle::Plain));
    }
    if let Ok(b) = v.as_bool() {
        return Ok(scalar(b.to_string(), ScalarStyle::Plain));
    }
    if let Ok(i) = v.as_int() {
        return Ok(scalar(i.to_string(), ScalarStyle::Plain));
    }
    if let Ok(f) = v.as_float() {
        // `{:?}` keeps the fraction (`8.0`, not `8`), as the script wrote it.
        return Ok(scalar(format!("{f:?}"), ScalarStyle::Plain));
    }
    if let Ok(c) = v.as_char() {
        return Ok(scalar(c.to_string(), ScalarStyle::Quoted));
    }
    if v.is_string() {
        return Ok(scalar(v.clone().into_string().unwrap_or_default(), ScalarStyle::Quoted));
    }
    if let Some(map) = v.read_lock::<rhai::Map>() {
        let mut entries = Vec::with_capacity(map.len());
        for (k, val) in map.iter() {
            entries.push(Entry {
                key: k.to_string(),
                key_span: span,
                value: convert(s, val, span, depth + 1)?,
            });
        }
        return Ok(Node {
            span,
            kind: NodeKind::Map(entries),
        });
    }
    if let Some(arr) = v.read_lock::<rhai::Array>() {
        let mut items = Vec::with_capacity(arr.len());
        for val in arr.iter() {
            items.push(convert(s, val, span, depth + 1)?);
        }
        return Ok(Node {
            span,
            kind: NodeKind::Seq(items),
        });
    }
    Err(Box::new(EvalAltResult::ErrorMismatchDataType(
        "a string, number, boolean, array or object map".to_owned(),
        v.type_name().to_owned(),
        Position::NONE,
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_build_a_tree() {
        let f = SourceFile::new(
            "t.rhai",
            "workflow(\"t\");\nagent(\"a\", #{ model: \"x/y\" });\nstep(\"s\", #{ agent: \"a\", prompt: \"hi\" });\n",
        );
        let mut d = Diagnostics::default();
        let n = parse(&f, &mut d).expect("tree");
        assert!(d.is_empty(), "{d:?}");
        let NodeKind::Map(e) = n.kind else { panic!() };
        let keys: Vec<&str> = e.iter().map(|e| e.key.as_str()).collect();
        assert_eq!(keys, ["name", "agents", "steps"]);
        // The agent points at its call, on line 2.
        assert_eq!(f.line_col(e[1].value.span.start).line, 1);
        let NodeKind::Map(agents) = &e[1].value.kind else {
            panic!()
        };
        assert_eq!(f.line_col(agents[0].key_span.start).line, 2);
    }
}
