//! Checks across the workflow — names resolve, `after` has no cycle,
//! `repeat.back_to` is upstream, expressions compile and reference only what
//! exists and is upstream — and the final assembly of the IR.

use std::collections::{BTreeMap, BTreeSet};

use crate::diag::{Code, Diagnostic, did_you_mean};
use crate::expr::{self, Context, Evaluator, ExprErrorKind};
use crate::ir::{Action, Expr, ForEach, Reflex, Repeat, Scope, Step, Template, TemplatePart, Workflow};
use crate::lower::{Draft, ReflexDraft, StepDraft};
use crate::node::Node;
use crate::read::Cx;
use crate::template::{self, RawPart};

mod fields;
use fields::Shape;

/// What an expression may reference.
struct Refs<'a> {
    context: Context,
    inputs: &'a BTreeSet<String>,
    /// Every defined step.
    steps: &'a BTreeSet<&'a str>,
    /// Steps whose results exist when the expression runs.
    visible: &'a BTreeSet<&'a str>,
    /// The step the expression belongs to, for messages.
    owner: Option<&'a str>,
    /// For reflexes: the scope, which decides whether `agent.*` metrics
    /// exist (only where the scope serves an agent).
    scope: Option<&'a Scope>,
    /// What each step's `.json` holds, by step id.
    shapes: &'a BTreeMap<&'a str, Shape<'a>>,
    /// Whether the owner step runs `for_each` (for the message when `item` is
    /// read outside its prompt).
    for_each: bool,
}

/// Check the draft and build the IR when nothing is wrong.
pub fn check(cx: &mut Cx<'_>, draft: Draft<'_>) -> Option<Workflow> {
    let evaluator = Evaluator::default();
    if !draft.agents_present {
        cx.push(
            Diagnostic::error(Code::MissingKey, draft.root, "the workflow has no `agents`")
                .with_label("`agents` missing")
                .with_help(if cx.script {
                    "declare at least one agent, e.g. `agent(\"helper\", #{ model: \"Qwen/Qwen2.5-0.5B-Instruct\" });`"
                } else {
                    "declare at least one agent, e.g. `agents: { helper: { model: Qwen/Qwen2.5-0.5B-Instruct } }`"
                }),
        );
    } else if draft.declared_agents.is_empty() && !cx.diags.has_errors() {
        // Only when nothing else explains it: an agent whose name is invalid
        // is reported as such, not as "no agent".
        cx.push(
            Diagnostic::error(Code::EmptyWorkflow, draft.root, "the workflow declares no agent")
                .with_label("no agents")
                .with_help("add an agent under `agents:`"),
        );
    }

    let first_id = unique(
        cx,
        draft.steps.iter().filter_map(|s| s.id.as_ref()),
        ("step", "steps", "id"),
    );
    let step_ids: BTreeSet<&str> = first_id.keys().copied().collect();
    let agent_names: Vec<&str> = draft.declared_agents.iter().map(String::as_str).collect();

    // References from steps: agents and `after`.
    for s in &draft.steps {
        if let Some((agent, span)) = &s.agent
            && !draft.declared_agents.contains(agent)
        {
            cx.push(
                Diagnostic::error(Code::UndefinedAgent, *span, format!("no agent is named `{agent}`"))
                    .with_label("undefined agent")
                    .with_help(did_you_mean(agent, agent_names.iter().copied(), "agents")),
            );
        }
        for (a, span) in &s.after {
            if s.id.as_ref().is_some_and(|(id, _)| id == a) {
                cx.push(
                    Diagnostic::error(Code::Cycle, *span, format!("step `{a}` waits for itself"))
                        .with_label("a step cannot come after itself")
                        .with_help("remove it from `after`; to run a step again use `repeat`"),
                );
            } else if !step_ids.contains(a.as_str()) {
                cx.push(undefined_step(a, *span, &step_ids));
            }
        }
    }
    report_cycles(cx, &draft.steps);
    let upstream = upstream_sets(&draft.steps);

    let mut steps = Vec::new();
    let empty = BTreeSet::new();
    let shapes: BTreeMap<&str, Shape<'_>> = draft
        .steps
        .iter()
        .filter_map(|s| {
            let (id, _) = s.id.as_ref()?;
            let shape = Shape {
                schema: s.output_schema.as_ref(),
                for_each: s.for_each.is_some(),
                approval: s.approval.is_some(),
            };
            Some((id.as_str(), shape))
        })
        .collect();
    for s in &draft.steps {
        let id = s.id.as_ref().map(|(id, _)| id.as_str());
        let up = id.and_then(|id| upstream.get(id)).unwrap_or(&empty);
        let refs = Refs {
            context: Context::Step,
            inputs: &draft.declared_inputs,
            steps: &step_ids,
            visible: up,
            owner: id,
            scope: None,
            shapes: &shapes,
            for_each: s.for_each.is_some(),
        };
        // A `for_each` step's prompt reads its item; nothing else does.
        let prompt_refs = Refs {
            context: if s.for_each.is_some() {
                Context::Item
            } else {
                Context::Step
            },
            ..refs
        };
        let prompt = s.prompt.and_then(|p| template(cx, &evaluator, p, &prompt_refs));
        let when = s.when.and_then(|w| expression(cx, &evaluator, w, &refs));
        let for_each = s.for_each.as_ref().and_then(|f| {
            let over = f.over.and_then(|o| expression(cx, &evaluator, o, &refs));
            Some(ForEach {
                over: over?,
                max_parallel: f.max_parallel?,
            })
        });
        let repeat = s.repeat.as_ref().and_then(|r| {
            if let (Some((back, span)), Some(id)) = (&r.back_to, id)
                && back != id
                && !up.contains(back.as_str())
            {
                if step_ids.contains(back.as_str()) {
                    cx.push(
                        Diagnostic::error(
                            Code::NotUpstream,
                            *span,
                            format!("`repeat.back_to` names `{back}`, which does not run before `{id}`"),
                        )
                        .with_label("not upstream")
                        .with_help(format!(
                            "`back_to` must be `{id}` or a step it depends on through `after`"
                        )),
                    );
                } else {
                    cx.push(undefined_step(back, *span, &step_ids));
                }
            }
            let mut with_self = up.clone();
            with_self.extend(id);
            let until_refs = Refs {
                context: Context::Until,
                visible: &with_self,
                ..refs
            };
            let until = r.until.and_then(|u| expression(cx, &evaluator, u, &until_refs));
            Some(Repeat {
                back_to: r.back_to.clone()?.0,
                until: until?,
                max: r.max?,
            })
        });
        // An approval step has no agent; any other step needs one.
        let agent = match (&s.agent, &s.approval) {
            (Some((agent, _)), None) => Some(agent.clone()),
            (None, Some(_)) => Some(String::new()),
            _ => None,
        };
        if let (Some((id, _)), Some(agent), Some(prompt)) = (&s.id, agent, prompt)
            && (s.when.is_none() || when.is_some())
            && (s.repeat.is_none() || repeat.is_some())
            && (s.for_each.is_none() || for_each.is_some())
        {
            steps.push(Step {
                id: id.clone(),
                agent,
                prompt,
                after: s.after.iter().map(|(a, _)| a.clone()).collect(),
                when,
                repeat,
                timeout: s.timeout,
                retries: s.retries,
                output_schema: s.output_schema.clone(),
                for_each,
                approval: s.approval.clone(),
            });
        }
    }

    let reflexes = reflexes(cx, &evaluator, &draft, &agent_names);
    tool_servers(cx, &draft);

    if cx.diags.has_errors() {
        return None;
    }
    Some(Workflow {
        name: draft.name?,
        description: draft.description,
        inputs: draft.inputs.into_iter().map(|(k, (v, _))| (k, v)).collect(),
        agents: draft.agents.into_iter().map(|(k, (v, _))| (k, v)).collect(),
        steps,
        reflexes,
        placement: draft.placement,
        tool_servers: draft.tool_servers.into_iter().map(|(k, (v, _))| (k, v)).collect(),
    })
}

/// Every tool server an agent lists is declared; a declared one no agent lists is
/// a warning (its program would never start, its URL never be called).
fn tool_servers(cx: &mut Cx<'_>, draft: &Draft<'_>) {
    let declared: Vec<&str> = draft.declared_tool_servers.iter().map(String::as_str).collect();
    for refs in draft.tool_refs.values() {
        for (r, span) in refs {
            if draft.declared_tool_servers.contains(&r.server) {
                continue;
            }
            let server = &r.server;
            let help = match (declared.is_empty(), cx.script) {
                (false, _) => did_you_mean(server, declared.iter().copied(), "tool servers"),
                (true, false) => format!(
                    "declare it under `tool_servers:`, e.g. `{server}: {{ command: [program, arg] }}` or `{server}: {{ url: https://... }}`"
                ),
                (true, true) => {
                    format!("declare it, e.g. `tool_server(\"{server}\", #{{ command: [\"program\", \"arg\"] }});`")
                }
            };
            cx.push(
                Diagnostic::error(
                    Code::UndefinedToolServer,
                    *span,
                    format!("no tool server is named `{server}`"),
                )
                .with_label("undefined tool server")
                .with_help(help),
            );
        }
    }
    for (name, (_, span)) in &draft.tool_servers {
        let used = draft.tool_refs.values().flatten().any(|(r, _)| &r.server == name);
        if !used {
            cx.push(
                Diagnostic::warning(
                    Code::UnusedToolServer,
                    *span,
                    format!("no agent lists a tool of tool server `{name}`"),
                )
                .with_label("never used")
                .with_help(format!(
                    "add `{name}.TOOL` or `{name}.*` to an agent's `tools`, or remove the server"
                )),
            );
        }
    }
}

/// Report every name given twice (the kind of item, its plural, and the key
/// that names it); returns each name with its first place.
fn unique<'a>(
    cx: &mut Cx<'_>,
    names: impl Iterator<Item = &'a crate::lower::Named>,
    (item, items, key): (&str, &str, &str),
) -> BTreeMap<&'a str, crate::source::Span> {
    let mut first: BTreeMap<&str, crate::source::Span> = BTreeMap::new();
    for (name, span) in names {
        if let Some(f) = first.get(name.as_str()) {
            cx.push(
                Diagnostic::error(
                    Code::DuplicateName,
                    *span,
                    format!("two {items} have the {key} `{name}`"),
                )
                .with_label(format!("second {item} with this {key}"))
                .with_related(*f, "first one")
                .with_help(format!("give every {item} its own `{key}`")),
            );
        } else {
            first.insert(name, *span);
        }
    }
    first
}

fn undefined_step(name: &str, span: crate::source::Span, ids: &BTreeSet<&str>) -> Diagnostic {
    Diagnostic::error(Code::UndefinedStep, span, format!("no step has the id `{name}`"))
        .with_label("undefined step")
        .with_help(did_you_mean(name, ids.iter().copied(), "step ids"))
}

/// Report each cycle of `after` once, at the reference that closes it.
fn report_cycles(cx: &mut Cx<'_>, steps: &[StepDraft<'_>]) {
    let index: BTreeMap<&str, usize> = steps
        .iter()
        .enumerate()
        .filter_map(|(i, s)| s.id.as_ref().map(|(id, _)| (id.as_str(), i)))
        .collect();
    // 0 = unvisited, 1 = on the path, 2 = done. Iterative depth-first search,
    // so a long chain of steps cannot overflow the stack.
    let mut state = vec![0u8; steps.len()];
    let mut reported: BTreeSet<BTreeSet<usize>> = BTreeSet::new();
    for root in 0..steps.len() {
        if state[root] != 0 {
            continue;
        }
        let mut path: Vec<(usize, usize)> = vec![(root, 0)];
        state[root] = 1;
        while let Some(&mut (node, ref mut next)) = path.last_mut() {
            let after = &steps[node].after;
            if *next >= after.len() {
                state[node] = 2;
                path.pop();
                continue;
            }
            let (name, span) = &after[*next];
            *next += 1;
            let Some(&dep) = index.get(name.as_str()) else { continue };
            if dep == node {
                continue; // reported as "waits for itself"
            }
            match state[dep] {
                0 => {
                    state[dep] = 1;
                    path.push((dep, 0));
                }
                1 => {
                    let from = path.iter().position(|(n, _)| *n == dep).unwrap_or(0);
                    let members: BTreeSet<usize> = path[from..].iter().map(|(n, _)| *n).collect();
                    if reported.insert(members) {
                        let mut names: Vec<&str> = path[from..]
                            .iter()
                            .filter_map(|(n, _)| steps[*n].id.as_ref().map(|(id, _)| id.as_str()))
                            .collect();
                        names.push(name);
                        names.reverse();
                        cx.push(
                            Diagnostic::error(
                                Code::Cycle,
                                *span,
                                format!("steps wait for each other in a cycle: {}", names.join(" → ")),
                            )
                            .with_label("this `after` closes the cycle")
                            .with_help(
                                "remove one of these `after` references; to loop back use `repeat: { back_to: ... }`",
                            ),
                        );
                    }
                }
                _ => {}
            }
        }
    }
}

/// For each step id, every step that finishes before it (transitively through
/// `after`).
fn upstream_sets<'a>(steps: &'a [StepDraft<'_>]) -> BTreeMap<&'a str, BTreeSet<&'a str>> {
    let direct: BTreeMap<&str, Vec<&str>> = steps
        .iter()
        .filter_map(|s| {
            let (id, _) = s.id.as_ref()?;
            Some((id.as_str(), s.after.iter().map(|(a, _)| a.as_str()).collect()))
        })
        .collect();
    direct
        .keys()
        .map(|&id| {
            let mut seen = BTreeSet::new();
            let mut todo: Vec<&str> = direct[id].clone();
            while let Some(n) = todo.pop() {
                if n != id && seen.insert(n) {
                    todo.extend(direct.get(n).into_iter().flatten().copied());
                }
            }
            (id, seen)
        })
        .collect()
}

/// Compile an expression in `node` (or part of it: `offset`, `text`) and
/// check what it references. Reports every problem; `None` if any.
fn check_expr(cx: &mut Cx<'_>, ev: &Evaluator, node: &Node, offset: usize, text: &str, refs: &Refs<'_>) -> bool {
    let at = |cx: &Cx<'_>, start: usize, end: usize| cx.locate_span(node, offset + start, offset + end);
    match ev.compile(text, refs.context) {
        Ok(_) => {}
        Err(e) => {
            // An error at the very end (`a &&`) points just after the last
            // character, not at the line break or indentation that follows.
            let start = e.offset.unwrap_or(0).min(text.trim_end().len());
            let end = text[start.min(text.len())..]
                .char_indices()
                .nth(1)
                .map_or(text.len(), |(i, _)| start + i);
            let span = at(cx, start, end.max(start));
            let d = match &e.kind {
                ExprErrorKind::UndefinedVariable(v) if matches!(v.as_str(), "item" | "index") => {
                    let end = start + v.len();
                    Diagnostic::error(
                        Code::UnknownVariable,
                        at(cx, start, end),
                        format!("`{v}` is defined only in the prompt of a step with `for_each`"),
                    )
                    .with_label("no item here")
                    .with_help(if refs.for_each {
                        "`item` and `index` are bound once per item, in the prompt only: this expression is read once for the whole step".to_owned()
                    } else {
                        "add `for_each: inputs.topics` (an expression that gives a list) to run the step's prompt once per item, as `item` at `index`".to_owned()
                    })
                }
                ExprErrorKind::UndefinedVariable(v) => {
                    let end = start + v.len();
                    Diagnostic::error(
                        Code::UnknownVariable,
                        at(cx, start, end),
                        format!("`{v}` is not defined here"),
                    )
                    .with_label("unknown variable")
                    .with_help(if text.contains(&format!("let {v}")) {
                        // `let g = ..; || g.call()`: the variable exists, outside the function.
                        format!(
                            "`{v}` is defined outside the function that uses it, and functions here cannot capture variables (closures are not available); pass it as an argument"
                        )
                    } else {
                        did_you_mean(
                            v,
                            refs.context.variables().iter().copied(),
                            "variables available here",
                        )
                    })
                }
                ExprErrorKind::Limit => Diagnostic::error(
                    Code::ScriptLimit,
                    span,
                    format!("expression too complex: {}", e.message),
                )
                .with_label("limit reached")
                .with_help("simplify the expression"),
                _ => {
                    // Python's `and`, `or` and `not` are a common slip.
                    let word: String = text[start.min(text.len())..]
                        .chars()
                        .take_while(char::is_ascii_alphabetic)
                        .collect();
                    let rhai = match word.as_str() {
                        "and" => Some("&&"),
                        "or" => Some("||"),
                        "not" => Some("!"),
                        _ => None,
                    };
                    let message = format!("invalid expression: {}", e.message);
                    match rhai {
                        Some(op) => Diagnostic::error(Code::ExprSyntax, at(cx, start, start + word.len()), message)
                            .with_label(format!("`{word}` is not a Rhai operator"))
                            .with_help(format!("write `{op}` instead of `{word}`")),
                        None if e.message.contains("'curry'")
                            || text.get(start..).unwrap_or("").trim_start_matches('.').starts_with("curry") =>
                        {
                            Diagnostic::error(Code::ExprSyntax, span, message)
                            .with_label("not available")
                            .with_help(
                                "`curry` is not available in workflows: pass every argument when calling the function",
                            )
                        }
                        None => Diagnostic::error(Code::ExprSyntax, span, message)
                            .with_label("here")
                            .with_help(format!("write a Rhai expression, e.g. `{}`", example(refs.context))),
                    }
                }
            };
            cx.push(d);
            return false;
        }
    }
    let before = cx.diags.error_count();
    for p in expr::paths(text) {
        // An index by a number (`[0]`) names no input, step or metric.
        let seg = |i: usize| p.segments.get(i).map(String::as_str).filter(|s| !s.starts_with('['));
        let span_of = |cx: &Cx<'_>, i: usize| {
            let s = p.offsets[i];
            at(cx, s, s + p.segments[i].len())
        };
        match (refs.context, seg(0)) {
            (Context::Step | Context::Until | Context::Item, Some("inputs")) => {
                if let Some(name) = seg(1)
                    && !refs.inputs.contains(name)
                {
                    let span = span_of(cx, 1);
                    cx.push(
                        Diagnostic::error(Code::UndefinedInput, span, format!("no input is named `{name}`"))
                            .with_label("undefined input")
                            .with_help(did_you_mean(name, refs.inputs.iter().map(String::as_str), "inputs")),
                    );
                }
            }
            (Context::Step | Context::Until | Context::Item, Some("steps")) => {
                let Some(name) = seg(1) else { continue };
                let span = span_of(cx, 1);
                if !refs.steps.contains(name) {
                    cx.push(undefined_step(name, span, refs.steps));
                } else if !refs.visible.contains(name) {
                    let owner = refs.owner.unwrap_or("this step");
                    let help = if refs.owner == Some(name) {
                        format!(
                            "a step's own output exists only in `repeat.until`; here use a step `{owner}` depends on"
                        )
                    } else {
                        format!("add `{name}` to the `after` of `{owner}` (directly or through another step)")
                    };
                    cx.push(
                        Diagnostic::error(
                            Code::NotUpstream,
                            span,
                            format!("step `{name}` has not run when `{owner}` reads it"),
                        )
                        .with_label("not upstream")
                        .with_help(help),
                    );
                } else if let Some(field) = seg(2)
                    && !expr::STEP_FIELDS.contains(&field)
                {
                    let span = span_of(cx, 2);
                    cx.push(
                        Diagnostic::error(
                            Code::UnknownVariable,
                            span,
                            format!("a step result has no field `{field}`"),
                        )
                        .with_label("unknown field")
                        .with_help(did_you_mean(
                            field,
                            expr::STEP_FIELDS.iter().copied(),
                            "fields",
                        )),
                    );
                } else if let (Some("output"), Some("json"), Some(shape)) = (seg(2), seg(3), refs.shapes.get(name)) {
                    let fields: Vec<(&str, crate::source::Span)> = (4..p.segments.len())
                        .map(|i| (p.segments[i].as_str(), span_of(cx, i)))
                        .collect();
                    // Only the last segment can be a method (`.len()`): a call ends the path.
                    let last = p.segments.len() - 1;
                    let after_last = p.offsets[last] + p.segments[last].len();
                    let last_is_call = text[after_last..].trim_start().starts_with('(');
                    if last == 3 && last_is_call {
                        continue;
                    }
                    fields::check(cx, name, shape, span_of(cx, 3), &fields, last_is_call);
                }
            }
            (Context::Reflex, Some(scope @ ("gpu" | "node" | "agent"))) => {
                let metrics = match scope {
                    "gpu" => expr::GPU_METRICS,
                    "node" => expr::NODE_METRICS,
                    _ => expr::AGENT_METRICS,
                };
                let agent_scope = matches!(refs.scope, None | Some(Scope::Agent(_) | Scope::Instance(_)));
                match seg(1) {
                    Some(m) if scope == "agent" && metrics.contains(&m) && !agent_scope => {
                        let span = span_of(cx, 0);
                        cx.push(
                            Diagnostic::error(
                                Code::UnknownMetric,
                                span,
                                format!("`agent.{m}` is not measured in a node or zone scope"),
                            )
                            .with_label("no agent in this scope")
                            .with_help("`agent.*` metrics need `scope: { agent: ... }` or `{ instance: ... }`; here use `gpu.*` or `node.*`"),
                        );
                    }
                    Some(m) if metrics.contains(&m) => {}
                    Some(m) => {
                        let span = span_of(cx, 1);
                        cx.push(
                            Diagnostic::error(Code::UnknownMetric, span, format!("`{scope}.{m}` is not a metric"))
                                .with_label("unknown metric")
                                .with_help(did_you_mean(m, metrics.iter().copied(), &format!("`{scope}` metrics"))),
                        );
                    }
                    None => {}
                }
            }
            _ => {}
        }
    }
    cx.diags.error_count() == before
}

/// A valid expression in `context`, for help texts: a reflex condition sees
/// telemetry, not steps.
fn example(context: Context) -> &'static str {
    match context {
        Context::Step => "steps.code.output.len() > 0",
        Context::Item => "item.to_upper()",
        Context::Until => "steps.review.output.contains(\"LGTM\")",
        Context::Reflex => "gpu.util > 0.8 && agent.queue_depth > 4",
    }
}

fn expression(cx: &mut Cx<'_>, ev: &Evaluator, node: &Node, refs: &Refs<'_>) -> Option<Expr> {
    let text = node.as_scalar()?.text.clone();
    if text.trim().is_empty() {
        cx.push(
            Diagnostic::error(Code::ExprSyntax, node.span, "the expression is empty")
                .with_label("empty")
                .with_help(format!(
                    "write a condition, e.g. `{}`, or remove the key",
                    example(refs.context)
                )),
        );
        return None;
    }
    check_expr(cx, ev, node, 0, &text, refs).then_some(Expr(text))
}

fn template(cx: &mut Cx<'_>, ev: &Evaluator, node: &Node, refs: &Refs<'_>) -> Option<Template> {
    let source = node.as_scalar()?.text.clone();
    let (raw, errors) = template::parse(&source);
    let mut ok = errors.is_empty();
    for e in errors {
        let span = cx.locate_span(node, e.start, e.end);
        cx.push(
            Diagnostic::error(Code::TemplateSyntax, span, e.message)
                .with_label("here")
                .with_help(e.help),
        );
    }
    let mut parts = Vec::new();
    for p in raw {
        match p {
            RawPart::Text(t) => parts.push(TemplatePart::Text(t)),
            RawPart::Expr { text, offset } => {
                ok &= check_expr(cx, ev, node, offset, &text, refs);
                parts.push(TemplatePart::Expr(Expr(text)));
            }
        }
    }
    ok.then_some(Template { source, parts })
}

fn reflexes(cx: &mut Cx<'_>, ev: &Evaluator, draft: &Draft<'_>, agent_names: &[&str]) -> Vec<Reflex> {
    let mut out = Vec::new();
    unique(
        cx,
        draft.reflexes.iter().filter_map(|r| r.name.as_ref()),
        ("reflex", "reflexes", "name"),
    );
    let no_steps = BTreeSet::new();
    let no_shapes = BTreeMap::new();
    for r in &draft.reflexes {
        let refs = Refs {
            context: Context::Reflex,
            inputs: &draft.declared_inputs,
            steps: &no_steps,
            visible: &no_steps,
            owner: None,
            scope: r.scope.as_ref().map(|(s, _)| s),
            shapes: &no_shapes,
            for_each: false,
        };

        if let Some((Scope::Agent(a), span)) = &r.scope
            && !draft.declared_agents.contains(a)
        {
            cx.push(
                Diagnostic::error(
                    Code::UndefinedAgent,
                    *span,
                    format!("the reflex scope names `{a}`, but no agent has that name"),
                )
                .with_label("undefined agent")
                .with_help(did_you_mean(a, agent_names.iter().copied(), "agents")),
            );
        }
        if let Some((scope, _)) = &r.scope {
            endpoint_actions(cx, draft, r, scope);
        }
        let when = r.when.and_then(|w| expression(cx, ev, w, &refs));
        let release = r.release.and_then(|w| expression(cx, ev, w, &refs));
        if let (Some((name, _)), Some(when), Some((scope, _))) = (&r.name, when, &r.scope)
            && (r.release.is_none() || release.is_some())
        {
            out.push(Reflex {
                name: name.clone(),
                when,
                hold: r.hold,
                release,
                aggregate: r.aggregate,
                scope: scope.clone(),
                actions: r.actions.clone(),
                cooldown: r.cooldown,
                max_replicas: r.max_replicas,
                dry_run: r.dry_run,
            });
        }
    }
    out
}

/// Reflexes scoped to an agent served by a remote endpoint (or an instance of one): it
/// runs on no GPU of the fleet, so only `notify` can act there (`clone` would fail;
/// `reroute`, `decay`, `migrate` and `drain` find nothing to change).
fn endpoint_actions(cx: &mut Cx<'_>, draft: &Draft<'_>, r: &ReflexDraft<'_>, scope: &Scope) {
    let names: Vec<&str> = match scope {
        Scope::Agent(a) => vec![a.as_str()],
        Scope::Instance(i) => i.split('+').collect(),
        Scope::Node(_) | Scope::Zone(_) => return,
    };
    let Some(endpoint) = names.into_iter().find(|name| {
        draft
            .agents
            .get(*name)
            .is_some_and(|(agent, _)| matches!(agent.backend, crate::ir::Backend::Endpoint(_)))
    }) else {
        return;
    };
    for (action, span) in r.actions.iter().zip(&r.action_spans) {
        let name = match action {
            Action::Notify { .. } => continue,
            Action::Clone { .. } => "clone",
            Action::Reroute(_) => "reroute",
            Action::Decay { .. } => "decay",
            Action::Migrate { .. } => "migrate",
            Action::Drain => "drain",
        };
        cx.push(
            Diagnostic::error(
                Code::CannotAct,
                *span,
                format!(
                    "`{name}` cannot act on agent `{endpoint}`: it is served by a remote endpoint, on no GPU of this fleet"
                ),
            )
            .with_label("nothing here to act on")
            .with_help(format!(
                "on an endpoint agent only `notify` works: replace `{name}` with `notify`, or scope the reflex to an agent served by a model"
            )),
        );
    }
}
