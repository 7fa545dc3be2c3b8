//! Lowering one step: its agent and prompt, or the text a person approves
//! (`approval`); `after`, `when`, `repeat`, `timeout`, `retries`; the JSON
//! Schema its answer must satisfy (`output_schema`, compiled here so a bad
//! schema is reported where it is written); and `for_each`. Keys that cannot
//! go together are reported here; expressions and references are checked
//! next, by [`crate::check`].

use std::time::Duration;

use serde_json::Value;

use super::{Named, misspells, named};
use crate::diag::{Code, Diagnostic};
use crate::ir::{Approval, DEFAULT_MAX_PARALLEL, MAX_PARALLEL, OnTimeout};
use crate::node::{Entry, Node, NodeKind, ScalarStyle};
use crate::read::{self, Cx, NameKind};
use crate::schema::OutputSchema;
use crate::source::Span;

const STEP_KEYS: &[&str] = &[
    "id",
    "agent",
    "prompt",
    "after",
    "when",
    "repeat",
    "timeout",
    "retries",
    "output_schema",
    "for_each",
    "approval",
];
const REPEAT_KEYS: &[&str] = &["back_to", "until", "max"];
const FOR_EACH_KEYS: &[&str] = &["over", "max_parallel"];
const APPROVAL_KEYS: &[&str] = &["text", "timeout", "on_timeout"];

/// What an approval nobody answered in time counts as, as written.
const ON_TIMEOUT: [(&str, OnTimeout); 2] = [("reject", OnTimeout::Reject), ("approve", OnTimeout::Approve)];

/// Keys an approval step may not have, each with why.
const NOT_WITH_APPROVAL: [(&str, &str); 7] = [
    (
        "agent",
        "a person answers an approval step, not an agent: remove `agent`, or make it two steps",
    ),
    (
        "prompt",
        "the text to approve is `approval`'s own (`approval: \"Publish {{ steps.draft.output }}?\"`): remove `prompt`",
    ),
    (
        "for_each",
        "a person approves once per step: remove `for_each`, or approve the list as a whole",
    ),
    (
        "output_schema",
        "the output of an approval step is the approver's comment, not JSON: remove `output_schema`",
    ),
    (
        "retries",
        "a rejection is final, so there is nothing to retry: remove `retries`",
    ),
    (
        "timeout",
        "write how long to wait as `approval: { text: ..., timeout: 2h }`",
    ),
    (
        "repeat",
        "a rejection fails the run, so there is nothing to repeat: remove `repeat`",
    ),
];

/// A step as read.
pub struct StepDraft<'n> {
    /// Where the step is written (its `id` value, else the item).
    pub anchor: Span,
    /// `id`.
    pub id: Option<Named>,
    /// `agent` (absent for an approval step).
    pub agent: Option<Named>,
    /// `prompt` (a template), or `approval`'s text.
    pub prompt: Option<&'n Node>,
    /// `after`.
    pub after: Vec<Named>,
    /// `when` (an expression).
    pub when: Option<&'n Node>,
    /// `repeat`.
    pub repeat: Option<RepeatDraft<'n>>,
    /// `timeout`.
    pub timeout: Option<Duration>,
    /// `retries`.
    pub retries: u32,
    /// `output_schema`, as JSON, when it compiled.
    pub output_schema: Option<Value>,
    /// `for_each`.
    pub for_each: Option<ForEachDraft<'n>>,
    /// `approval` (its text is in `prompt`).
    pub approval: Option<Approval>,
}

/// `repeat:` as read.
pub struct RepeatDraft<'n> {
    /// `back_to`.
    pub back_to: Option<Named>,
    /// `until`.
    pub until: Option<&'n Node>,
    /// `max`.
    pub max: Option<u32>,
}

/// `for_each:` as read.
pub struct ForEachDraft<'n> {
    /// The expression giving the list.
    pub over: Option<&'n Node>,
    /// `max_parallel`, or the default.
    pub max_parallel: Option<u32>,
}

pub(super) fn step<'n>(cx: &mut Cx<'_>, node: &'n Node) -> StepDraft<'n> {
    let mut draft = StepDraft {
        anchor: Span::point(node.span.start),
        id: None,
        agent: None,
        prompt: None,
        after: Vec::new(),
        when: None,
        repeat: None,
        timeout: None,
        retries: 0,
        output_schema: None,
        for_each: None,
        approval: None,
    };
    let Some(mut m) = read::map(cx, node, draft.anchor, "a step", STEP_KEYS) else {
        return draft;
    };
    draft.id = m
        .require(cx, "id", "my_step")
        .and_then(|n| named(cx, n, NameKind::Step));
    if let Some((_, span)) = &draft.id {
        m.anchor = *span;
        draft.anchor = *span;
    }
    let approval = m.entry("approval");
    if let Some(a) = approval {
        // Every key an approval step cannot have, reported once each; the step
        // is then read as an approval step.
        for (key, help) in NOT_WITH_APPROVAL {
            if let Some(e) = m.entry(key) {
                cx.push(
                    Diagnostic::error(
                        Code::ApprovalConflict,
                        e.key_span,
                        format!("an approval step has no `{key}`"),
                    )
                    .with_label(format!("`{key}` on an approval step"))
                    .with_related(a.key_span, "a person answers this step")
                    .with_help(help),
                );
            }
        }
        let (text, approval) = approval_spec(cx, a);
        draft.prompt = text;
        draft.approval = approval;
    } else {
        let agent = m.entry("agent");
        if agent.is_none() && !misspells(node, &["agent", "approval"]) {
            cx.push(
                Diagnostic::error(
                    Code::NoAgentOrApproval,
                    m.anchor,
                    "the step has neither an `agent` nor an `approval`",
                )
                .with_label("who answers this step?")
                .with_help(
                    "add `agent: NAME` for an agent to answer its `prompt`, or `approval: \"text\"` for a person to approve",
                ),
            );
        }
        draft.agent = agent.and_then(|e| named(cx, &e.value, NameKind::Agent));
        draft.prompt = m.require(cx, "prompt", "\"...\"");
    }
    let what = if draft.approval.is_some() {
        "`approval`"
    } else {
        "`prompt`"
    };
    if let Some(p) = draft.prompt
        && read::string(cx, p, what).is_none()
    {
        draft.prompt = None;
    }
    draft.after = m
        .get("after")
        .map(|n| {
            read::list(n)
                .into_iter()
                .filter_map(|a| named(cx, a, NameKind::Step))
                .collect()
        })
        .unwrap_or_default();
    draft.when = m.get("when").filter(|n| read::string(cx, n, "`when`").is_some());
    let repeat = m.entry("repeat");
    draft.repeat = repeat.and_then(|e| {
        let mut r = read::map(cx, &e.value, e.key_span, "`repeat`", REPEAT_KEYS)?;
        let back_to = r
            .require(cx, "back_to", "step_id")
            .and_then(|n| named(cx, n, NameKind::Step));
        let until = r
            .require(cx, "until", "'steps.review.output.contains(\"LGTM\")'")
            .filter(|n| read::string(cx, n, "`until`").is_some());
        let max = r.require(cx, "max", "3").and_then(|n| read::count(cx, n, "`max`", 1));
        r.finish(cx);
        Some(RepeatDraft { back_to, until, max })
    });
    draft.timeout = m.get("timeout").and_then(|n| {
        positive_duration(
            cx,
            n,
            ("`timeout`", "would fail every attempt"),
            "give the longest an attempt may take, e.g. `10m`, or remove `timeout`",
        )
    });
    draft.retries = m
        .get("retries")
        .and_then(|n| read::count(cx, n, "`retries`", 0))
        .unwrap_or(0);
    draft.output_schema = m.entry("output_schema").and_then(|e| output_schema(cx, e));
    let for_each = m.entry("for_each");
    if let (Some(f), Some(r)) = (for_each, repeat)
        && draft.approval.is_none()
    {
        let (first, second) = if f.key_span.start < r.key_span.start {
            (f, r)
        } else {
            (r, f)
        };
        cx.push(
            Diagnostic::error(
                Code::ForEachAndRepeat,
                second.key_span,
                "a step cannot have both `for_each` and `repeat`",
            )
            .with_label(format!("`{}` here", second.key))
            .with_related(first.key_span, format!("`{}` here", first.key))
            .with_help(
                "`for_each` runs the step once per item, `repeat` runs steps again until a condition holds: keep one, or put the loop in a step of its own",
            ),
        );
    }
    draft.for_each = for_each.map(|e| for_each_spec(cx, &e.value, e.key_span));
    m.finish(cx);
    draft
}

/// A duration greater than zero: `what` names it and says what zero would do.
fn positive_duration(cx: &mut Cx<'_>, node: &Node, (what, zero): (&str, &str), help: &str) -> Option<Duration> {
    let d = read::duration(cx, node, what)?;
    if d.is_zero() {
        cx.push(
            Diagnostic::error(Code::BadValue, node.span, format!("a {what} of zero {zero}"))
                .with_label("zero")
                .with_help(help),
        );
        return None;
    }
    Some(d)
}

/// `approval:` — text, or `{ text, timeout, on_timeout }`: the text's node and
/// the IR's approval.
fn approval_spec<'n>(cx: &mut Cx<'_>, e: &'n Entry) -> (Option<&'n Node>, Option<Approval>) {
    let node = &e.value;
    if matches!(node.kind, NodeKind::Scalar(_)) && !node.is_null() {
        return (
            Some(node),
            Some(Approval {
                timeout: None,
                on_timeout: OnTimeout::default(),
            }),
        );
    }
    if matches!(node.kind, NodeKind::Seq(_)) {
        cx.wrong_type(
            node,
            "`approval`",
            "text or a mapping",
            "{ text: \"Publish it?\", timeout: 2h, on_timeout: reject }",
        );
        return (None, None);
    }
    let Some(mut m) = read::map(cx, node, e.key_span, "`approval`", APPROVAL_KEYS) else {
        return (None, None);
    };
    let text = m.require(cx, "text", "\"Publish {{ steps.draft.output }}?\"");
    let timeout = m.get("timeout").map(|n| {
        positive_duration(
            cx,
            n,
            ("`timeout`", "would end the wait at once"),
            "give how long to wait for an answer, e.g. `2h`, or remove `timeout` to wait until someone answers",
        )
    });
    let on_timeout = m.get("on_timeout").map(|n| {
        let names: Vec<&str> = ON_TIMEOUT.iter().map(|o| o.0).collect();
        read::choice(cx, n, "`on_timeout`", &names).map(|i| ON_TIMEOUT[i].1)
    });
    if let (Some(_), None) = (&on_timeout, &timeout)
        && let Some(n) = m.get("on_timeout")
    {
        cx.push(
            Diagnostic::error(Code::BadValue, n.span, "`on_timeout` without a `timeout` never applies")
                .with_label("no `timeout` to run out")
                .with_help("add `timeout: 2h` (how long to wait), or remove `on_timeout`"),
        );
    }
    m.finish(cx);
    let approval = match (timeout, on_timeout) {
        (Some(None), _) | (_, Some(None)) => None,
        (timeout, on_timeout) => Some(Approval {
            timeout: timeout.flatten(),
            on_timeout: on_timeout.flatten().unwrap_or_default(),
        }),
    };
    (text, approval)
}

/// `for_each:` — an expression, or `{ over: EXPR, max_parallel: N }`.
fn for_each_spec<'n>(cx: &mut Cx<'_>, node: &'n Node, anchor: Span) -> ForEachDraft<'n> {
    let expression = |cx: &mut Cx<'_>, n: &'n Node| {
        if matches!(n.kind, NodeKind::Seq(_)) {
            cx.wrong_type(n, "`for_each`", "an expression that gives a list", "inputs.topics");
            return None;
        }
        read::string(cx, n, "`for_each`").map(|_| n)
    };
    if !matches!(node.kind, NodeKind::Map(_)) {
        return ForEachDraft {
            over: expression(cx, node),
            max_parallel: Some(DEFAULT_MAX_PARALLEL),
        };
    }
    let Some(mut m) = read::map(cx, node, anchor, "`for_each`", FOR_EACH_KEYS) else {
        return ForEachDraft {
            over: None,
            max_parallel: None,
        };
    };
    let over = m
        .require(cx, "over", "steps.plan.output.json.topics")
        .and_then(|n| expression(cx, n));
    let max_parallel = match m.get("max_parallel") {
        Some(n) => {
            read::integer(cx, n, "`max_parallel`", 1, i64::from(MAX_PARALLEL)).and_then(|n| u32::try_from(n).ok())
        }
        None => Some(DEFAULT_MAX_PARALLEL),
    };
    m.finish(cx);
    ForEachDraft { over, max_parallel }
}

/// `output_schema:` — a mapping read as JSON and compiled as a JSON Schema; a
/// schema that does not compile is reported at the place the error names.
fn output_schema(cx: &mut Cx<'_>, e: &Entry) -> Option<Value> {
    if !matches!(e.value.kind, NodeKind::Map(_)) {
        cx.wrong_type(
            &e.value,
            "`output_schema`",
            "a mapping (a JSON Schema)",
            "{ type: object, properties: { topics: { type: array, items: { type: string } } } }",
        );
        return None;
    }
    let schema = json(&e.value);
    match OutputSchema::compile_at(&schema) {
        Ok(_) => Some(schema),
        Err(err) => {
            let at = if err.pointer.is_empty() {
                e.key_span
            } else {
                at_pointer(&e.value, &err.pointer).span
            };
            cx.push(
                Diagnostic::error(Code::BadSchema, at, format!("the output schema is not a valid JSON Schema: {}", err.message))
                    .with_label(if err.pointer.is_empty() {
                        "invalid schema".to_owned()
                    } else {
                        format!("invalid at {}", err.pointer)
                    })
                    .with_help(
                        "write a JSON Schema (json-schema.org, draft 2020-12 unless `$schema` says otherwise), e.g. `{ type: object, properties: { topics: { type: array, items: { type: string } } }, required: [topics] }`",
                    ),
            );
            None
        }
    }
}

/// A tree as JSON: mappings are objects, lists arrays; an unquoted scalar is
/// null, a boolean or a number when it reads as one (as YAML's core schema
/// reads it), else a string, and a quoted one is always a string. Object keys
/// are put in sorted order (a script's maps have no other), so that the IR is
/// the same whether or not serde_json keeps insertion order.
pub(crate) fn json(node: &Node) -> Value {
    match &node.kind {
        NodeKind::Map(entries) => {
            let mut sorted: Vec<&Entry> = entries.iter().collect();
            sorted.sort_by(|a, b| a.key.cmp(&b.key));
            Value::Object(sorted.into_iter().map(|e| (e.key.clone(), json(&e.value))).collect())
        }
        NodeKind::Seq(items) => Value::Array(items.iter().map(json).collect()),
        NodeKind::Scalar(s) if s.style != ScalarStyle::Plain => Value::String(s.text.clone()),
        NodeKind::Scalar(s) if s.is_null() => Value::Null,
        NodeKind::Scalar(s) => {
            if let Some(b) = s.as_bool() {
                Value::Bool(b)
            } else if let Ok(i) = s.text.parse::<i64>() {
                Value::from(i)
            } else if let Some(n) = s
                .text
                .parse::<f64>()
                .ok()
                .and_then(serde_json::Number::from_f64)
                .filter(|_| s.text.bytes().any(|b| b.is_ascii_digit()))
            {
                Value::Number(n)
            } else {
                Value::String(s.text.clone())
            }
        }
    }
}

/// The node a JSON pointer (`/properties/a/type`) reaches in `node`, or the
/// deepest one on its way.
fn at_pointer<'n>(node: &'n Node, pointer: &str) -> &'n Node {
    let mut at = node;
    for part in pointer.split('/').skip(1) {
        let key = part.replace("~1", "/").replace("~0", "~");
        let next = match &at.kind {
            NodeKind::Map(entries) => entries.iter().find(|e| e.key == key).map(|e| &e.value),
            NodeKind::Seq(items) => key.parse::<usize>().ok().and_then(|i| items.get(i)),
            NodeKind::Scalar(_) => None,
        };
        match next {
            Some(n) => at = n,
            None => break,
        }
    }
    at
}
