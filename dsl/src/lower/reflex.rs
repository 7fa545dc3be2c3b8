//! Lowering of `reflexes:` — conditions, scopes and actions.

use std::collections::BTreeMap;
use std::time::Duration;

use super::{Named, named};
use crate::diag::{Code, Diagnostic};
use crate::ir::{Action, Aggregate, DecayTarget, MigrateTarget, Reroute, Scope, SessionCount};
use crate::node::{Node, NodeKind, ScalarStyle};
use crate::read::{self, Cx, MapReader, NameKind};
use crate::source::Span;

/// Default reflex cooldown.
pub const DEFAULT_COOLDOWN: Duration = Duration::from_secs(30);

const REFLEX_KEYS: &[&str] = &[
    "name",
    "when",
    "for",
    "release",
    "aggregate",
    "scope",
    "do",
    "cooldown",
    "max_replicas",
    "dry_run",
];
const SCOPE_KEYS: &[&str] = &["agent", "instance", "node", "zone"];
const ACTION_KEYS: &[&str] = &["clone", "reroute", "decay", "migrate", "drain", "notify"];
const DECAY_KEYS: &[&str] = &["target", "capacity"];
const MIGRATE_KEYS: &[&str] = &["sessions", "to"];
const GPU_REF_KEYS: &[&str] = &["node", "gpu"];
/// A reflex as read.
pub struct ReflexDraft<'n> {
    /// Where the reflex is written.
    pub anchor: Span,
    /// `name`.
    pub name: Option<Named>,
    /// `when`.
    pub when: Option<&'n Node>,
    /// `release`.
    pub release: Option<&'n Node>,
    /// `for`.
    pub hold: Duration,
    /// `aggregate`.
    pub aggregate: Aggregate,
    /// `scope`, with the span of the scope's value.
    pub scope: Option<(Scope, Span)>,
    /// `do`.
    pub actions: Vec<Action>,
    /// Where each of `actions` is written.
    pub action_spans: Vec<Span>,
    /// `cooldown`.
    pub cooldown: Duration,
    /// `max_replicas`.
    pub max_replicas: Option<u32>,
    /// `dry_run`.
    pub dry_run: bool,
}

pub(super) fn reflex<'n>(cx: &mut Cx<'_>, node: &'n Node) -> ReflexDraft<'n> {
    let mut draft = ReflexDraft {
        anchor: Span::point(node.span.start),
        name: None,
        when: None,
        release: None,
        hold: Duration::ZERO,
        aggregate: Aggregate::Max,
        scope: None,
        actions: Vec::new(),
        action_spans: Vec::new(),
        cooldown: DEFAULT_COOLDOWN,
        max_replicas: None,
        dry_run: false,
    };
    let Some(mut m) = read::map(cx, node, draft.anchor, "a reflex", REFLEX_KEYS) else {
        return draft;
    };
    draft.name = m
        .require(cx, "name", "hot-gpu")
        .and_then(|n| named(cx, n, NameKind::Reflex));
    if let Some((_, span)) = &draft.name {
        m.anchor = *span;
        draft.anchor = *span;
    }
    draft.when = m
        .require(cx, "when", "'gpu.util > 0.8'")
        .filter(|n| read::string(cx, n, "`when`").is_some());
    draft.release = m.get("release").filter(|n| read::string(cx, n, "`release`").is_some());
    draft.hold = m
        .get("for")
        .and_then(|n| read::duration(cx, n, "`for`"))
        .unwrap_or(Duration::ZERO);
    draft.aggregate = m
        .get("aggregate")
        .and_then(|n| {
            const AGG: [Aggregate; 3] = [Aggregate::Max, Aggregate::Avg, Aggregate::Min];
            read::choice(cx, n, "aggregation", &["max", "avg", "min"]).map(|i| AGG[i])
        })
        .unwrap_or(Aggregate::Max);
    draft.scope = m.require(cx, "scope", "{ agent: coder }").and_then(|n| scope(cx, n));
    let actions: Vec<(Action, Span)> = m
        .require(cx, "do", "[ { clone: 1 } ]")
        .map(|n| {
            let items = read::list(n);
            if items.is_empty() {
                cx.push(
                    Diagnostic::error(Code::BadValue, n.span, "`do` lists no action")
                        .with_label("empty")
                        .with_help("list at least one action, e.g. `do: [ notify ]`"),
                );
            }
            items
                .into_iter()
                .filter_map(|a| Some((action(cx, a)?, a.span)))
                .collect()
        })
        .unwrap_or_default();
    (draft.actions, draft.action_spans) = actions.into_iter().unzip();
    draft.cooldown = m
        .get("cooldown")
        .and_then(|n| read::duration(cx, n, "`cooldown`"))
        .unwrap_or(DEFAULT_COOLDOWN);
    draft.max_replicas = m
        .get("max_replicas")
        .and_then(|n| read::count(cx, n, "`max_replicas`", 1));
    draft.dry_run = m
        .get("dry_run")
        .and_then(|n| read::boolean(cx, n, "`dry_run`"))
        .unwrap_or(false);
    m.finish(cx);
    draft
}

fn scope(cx: &mut Cx<'_>, node: &Node) -> Option<(Scope, Span)> {
    let mut m = read::map(cx, node, node.span, "`scope`", SCOPE_KEYS)?;
    let mut found: Vec<(Scope, Span)> = Vec::new();
    let mut given = 0;
    for key in SCOPE_KEYS {
        if let Some(v) = m.get(key) {
            given += 1;
            let Some(name) = read::nonempty(cx, v, "a scope name") else {
                continue;
            };
            let s = match *key {
                "agent" => Scope::Agent(name),
                "instance" => Scope::Instance(name),
                "node" => Scope::Node(name),
                _ => Scope::Zone(name),
            };
            found.push((s, v.span));
        }
    }
    m.finish(cx);
    if given != 1 {
        cx.push(
            Diagnostic::error(
                Code::BadValue,
                node.span,
                format!("a scope names exactly one of agent, instance, node or zone; this one names {given}"),
            )
            .with_label("ambiguous scope")
            .with_help("write e.g. `scope: { agent: coder }`; use several reflexes for several scopes"),
        );
        return None;
    }
    found.pop()
}

fn action(cx: &mut Cx<'_>, node: &Node) -> Option<Action> {
    // A bare word is an action without arguments: `drain`, `notify`.
    let (key, key_span, value) = match &node.kind {
        NodeKind::Scalar(s) if !node.is_null() => (s.text.as_str(), node.span, None),
        NodeKind::Map(entries) if entries.len() == 1 => {
            (entries[0].key.as_str(), entries[0].key_span, Some(&entries[0].value))
        }
        _ => {
            cx.push(
                Diagnostic::error(
                    Code::WrongType,
                    node.span,
                    format!(
                        "an action must be one name or a one-key mapping, found {}",
                        node.kind_name()
                    ),
                )
                .with_label("not an action")
                .with_help("write each action as its own list item: `- { clone: 1 }`, `- drain`"),
            );
            return None;
        }
    };
    let missing = |cx: &mut Cx<'_>, example: &str| {
        cx.push(
            Diagnostic::error(Code::MissingKey, key_span, format!("the `{key}` action needs a value"))
                .with_label("no value")
                .with_help(format!("write `{{ {key}: {example} }}`")),
        );
    };
    match key {
        "clone" => match value {
            Some(v) if !v.is_null() => read::count(cx, v, "`clone`", 1).map(|count| Action::Clone { count }),
            _ => Some(Action::Clone { count: 1 }),
        },
        "reroute" => {
            let Some(v) = value else {
                missing(cx, "new");
                return None;
            };
            reroute(cx, v).map(Action::Reroute)
        }
        "decay" => {
            let Some(v) = value else {
                missing(cx, "{ target: original, capacity: 0.5 }");
                return None;
            };
            let mut m = read::map(cx, v, key_span, "`decay`", DECAY_KEYS)?;
            let target = m.require(cx, "target", "original").and_then(|n| {
                read::choice(cx, n, "decay target", &["original", "clones"]).map(|i| {
                    if i == 0 {
                        DecayTarget::Original
                    } else {
                        DecayTarget::Clones
                    }
                })
            });
            let capacity = m.require(cx, "capacity", "0.5").and_then(|n| {
                let c = read::number(cx, n, "`capacity`", 0.0, 1.0)?;
                if c == 0.0 {
                    cx.push(
                        Diagnostic::error(
                            Code::BadValue,
                            n.span,
                            "`capacity` 0 would remove the replica, not decay it",
                        )
                        .with_label("must be above 0")
                        .with_help("use a share in (0, 1]; to stop a GPU use `drain`"),
                    );
                    return None;
                }
                Some(c)
            });
            m.finish(cx);
            Some(Action::Decay {
                target: target?,
                capacity: capacity?,
            })
        }
        "migrate" => {
            let Some(v) = value else {
                return Some(Action::Migrate {
                    sessions: SessionCount::All,
                    to: MigrateTarget::Auto,
                });
            };
            let mut m = read::map(cx, v, key_span, "`migrate`", MIGRATE_KEYS)?;
            let sessions = match m.get("sessions") {
                None => Some(SessionCount::All),
                Some(n) if n.as_scalar().is_some_and(|s| s.text.trim().eq_ignore_ascii_case("all")) => {
                    Some(SessionCount::All)
                }
                Some(n) => read::count(cx, n, "`sessions` (a number or `all`)", 1).map(SessionCount::Count),
            };
            let to = match m.get("to") {
                None => Some(MigrateTarget::Auto),
                Some(n) => migrate_target(cx, n),
            };
            m.finish(cx);
            Some(Action::Migrate {
                sessions: sessions?,
                to: to?,
            })
        }
        "drain" => match value {
            Some(v) if !v.is_null() && v.as_scalar().and_then(|s| s.as_bool()) != Some(true) => {
                cx.wrong_type(v, "`drain`", "no value", "drain");
                None
            }
            _ => Some(Action::Drain),
        },
        "notify" => {
            let message = value
                .filter(|v| !v.is_null())
                .and_then(|v| read::string(cx, v, "`notify`"));
            Some(Action::Notify { message })
        }
        other => {
            cx.push(
                Diagnostic::error(Code::BadValue, key_span, format!("`{other}` is not a reflex action"))
                    .with_label("unknown action")
                    .with_help(crate::diag::did_you_mean(other, ACTION_KEYS.iter().copied(), "actions")),
            );
            None
        }
    }
}

fn reroute(cx: &mut Cx<'_>, node: &Node) -> Option<Reroute> {
    if let Some(s) = node.as_scalar().filter(|s| s.style != ScalarStyle::Block) {
        return match read::choice(cx, node, "reroute", &["new", "all"]) {
            Some(0) => Some(Reroute::New),
            Some(_) => Some(Reroute::All),
            None => {
                let _ = s;
                None
            }
        };
    }
    let mut m = read::map(cx, node, node.span, "`reroute` weights", &["original", "clones"])?;
    let mut weights = BTreeMap::new();
    for key in ["original", "clones"] {
        if let Some(n) = m.get(key)
            && let Some(w) = read::number(cx, n, "a weight", 0.0, f64::MAX)
        {
            weights.insert(key.to_owned(), w);
        }
    }
    m.finish(cx);
    if weights.values().sum::<f64>() <= 0.0 {
        cx.push(
            Diagnostic::error(Code::BadValue, node.span, "reroute weights must not all be zero")
                .with_label("no traffic would go anywhere")
                .with_help("give at least one positive weight, e.g. `{ original: 1, clones: 3 }`"),
        );
        return None;
    }
    Some(Reroute::Weights(weights))
}

fn migrate_target(cx: &mut Cx<'_>, node: &Node) -> Option<MigrateTarget> {
    if let Some(s) = node.as_scalar() {
        let text = s.text.trim();
        if text.eq_ignore_ascii_case("auto") {
            return Some(MigrateTarget::Auto);
        }
        if let Some((n, g)) = text.rsplit_once(':')
            && let Ok(gpu) = g.parse::<u32>()
            && !n.is_empty()
        {
            return Some(MigrateTarget::Gpu {
                node: n.to_owned(),
                gpu,
            });
        }
        cx.push(
            Diagnostic::error(Code::BadValue, node.span, format!("`{text}` is not a migration target"))
                .with_label("expected `auto` or `node:gpu`")
                .with_help("write `to: auto`, `to: rtx-1:2` or `to: { node: rtx-1, gpu: 2 }`"),
        );
        return None;
    }
    let mut m: MapReader<'_> = read::map(cx, node, node.span, "`to`", GPU_REF_KEYS)?;
    let n = m
        .require(cx, "node", "rtx-1")
        .and_then(|n| read::nonempty(cx, n, "`node`"));
    let gpu = m.require(cx, "gpu", "0").and_then(|n| read::count(cx, n, "`gpu`", 0));
    m.finish(cx);
    Some(MigrateTarget::Gpu { node: n?, gpu: gpu? })
}
