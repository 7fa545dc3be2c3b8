//! Typed readers over the [`Node`] tree: each reads one field, reports what is
//! wrong with it (wrong type, bad value, unknown key) and returns `None`, so
//! that lowering goes on and finds the next problem.

use std::time::Duration;

use crate::diag::{did_you_mean, Code, Diagnostic, Diagnostics};
use crate::ir::is_valid_name;
use crate::node::{Entry, Node, NodeKind, ScalarStyle};
use crate::source::{SourceFile, Span};

/// Lowering context: the file and the diagnostics being collected.
pub struct Cx<'a> {
    /// The file being lowered.
    pub file: &'a SourceFile,
    /// Where problems go.
    pub diags: &'a mut Diagnostics,
    /// Whether the tree was built by a `.rhai` script: its values are not
    /// written in the source, so positions inside them map to the call that
    /// declared them.
    pub script: bool,
}

impl Cx<'_> {
    /// Record a problem.
    pub fn push(&mut self, d: Diagnostic) {
        self.diags.push(d);
    }

    /// "expected X, found Y" at `node`.
    pub fn wrong_type(&mut self, node: &Node, what: &str, expected: &str, example: &str) {
        self.push(
            Diagnostic::error(
                Code::WrongType,
                node.span,
                format!("{what} must be {expected}, found {}", node.kind_name()),
            )
            .with_label(format!("expected {expected}"))
            .with_help(format!("write it like `{example}`")),
        );
    }

    /// Byte offset in the file of byte `offset` of the scalar `node`'s value
    /// text. Exact for plain scalars, quoted scalars without escapes and
    /// block scalars; for script values, the call that declared them.
    pub fn locate(&self, node: &Node, offset: usize) -> usize {
        let Some(s) = node.as_scalar() else {
            return node.span.start;
        };
        if self.script {
            return node.span.start;
        }
        let raw = self.file.slice(node.span);
        let value = s.text.as_str();
        let offset = offset.min(value.len());
        // Find the value's lines, in order, inside the raw source text; the
        // offset falls in one of them.
        let mut cursor = 0usize;
        let mut line_start_in_value = 0usize;
        for line in value.split_inclusive('\n') {
            let content = line.trim_end_matches('\n');
            let line_end_in_value = line_start_in_value + line.len();
            let found = if content.is_empty() {
                None
            } else {
                raw.get(cursor..).and_then(|r| r.find(content)).map(|i| cursor + i)
            };
            if offset < line_end_in_value || line_end_in_value == value.len() {
                let within = offset - line_start_in_value;
                return match found {
                    Some(at) if within <= content.len() => node.span.start + at + within,
                    Some(at) => node.span.start + at,
                    None => node.span.start,
                };
            }
            if let Some(at) = found {
                cursor = at + content.len();
            }
            line_start_in_value = line_end_in_value;
        }
        node.span.start
    }

    /// A span inside a scalar's value, mapped into the file.
    pub fn locate_span(&self, node: &Node, start: usize, end: usize) -> Span {
        let s = self.locate(node, start);
        if self.script {
            return node.span;
        }
        Span::new(s, self.locate(node, end).max(s))
    }
}

/// A mapping being read: tracks which keys were used so the rest can be
/// reported as unknown, with a "did you mean".
pub struct MapReader<'n> {
    entries: &'n [Entry],
    used: Vec<bool>,
    /// Where the mapping is introduced (the key naming it), for "missing
    /// key" diagnostics.
    pub anchor: Span,
    what: String,
    allowed: &'static [&'static str],
}

/// Start reading `node` as a mapping of `what` (e.g. "agent `coder`") whose
/// keys must be among `allowed`. A null node reads as an empty mapping.
pub fn map<'n>(
    cx: &mut Cx<'_>,
    node: &'n Node,
    anchor: Span,
    what: impl Into<String>,
    allowed: &'static [&'static str],
) -> Option<MapReader<'n>> {
    let what = what.into();
    let entries: &'n [Entry] = match &node.kind {
        NodeKind::Map(e) => e,
        _ if node.is_null() => &[],
        _ => {
            let example = allowed.first().map_or(String::new(), |k| format!("{k}: ..."));
            cx.wrong_type(node, &what, "a mapping", &format!("{{ {example} }}"));
            return None;
        }
    };
    Some(MapReader {
        entries,
        used: vec![false; entries.len()],
        anchor,
        what,
        allowed,
    })
}

impl<'n> MapReader<'n> {
    /// The entry for `key`, marked as used.
    pub fn entry(&mut self, key: &str) -> Option<&'n Entry> {
        debug_assert!(self.allowed.contains(&key), "reader for {} asked for undeclared key {key}", self.what);
        let i = self.entries.iter().position(|e| e.key == key)?;
        self.used[i] = true;
        Some(&self.entries[i])
    }

    /// The value for `key`, marked as used.
    pub fn get(&mut self, key: &str) -> Option<&'n Node> {
        self.entry(key).map(|e| &e.value)
    }

    /// The value for `key`, or a "missing key" diagnostic.
    pub fn require(&mut self, cx: &mut Cx<'_>, key: &str, example: &str) -> Option<&'n Node> {
        let v = self.get(key);
        if v.is_none() {
            cx.push(
                Diagnostic::error(Code::MissingKey, self.anchor, format!("{} has no `{key}`", self.what))
                    .with_label(format!("`{key}` missing here"))
                    .with_help(format!("add `{key}: {example}`")),
            );
        }
        v
    }

    /// Entries in source order (for open-ended maps such as `agents`).
    pub fn all(&mut self) -> &'n [Entry] {
        self.used.iter_mut().for_each(|u| *u = true);
        self.entries
    }

    /// Report every key that was not read.
    pub fn finish(self, cx: &mut Cx<'_>) {
        for (e, used) in self.entries.iter().zip(&self.used) {
            if !used {
                cx.push(
                    Diagnostic::error(Code::UnknownKey, e.key_span, format!("unknown key `{}` in {}", e.key, self.what))
                        .with_label("unknown key")
                        .with_help(did_you_mean(&e.key, self.allowed.iter().copied(), "keys")),
                );
            }
        }
    }
}

/// A string value: any scalar but null.
pub fn string(cx: &mut Cx<'_>, node: &Node, what: &str) -> Option<String> {
    match node.as_scalar() {
        Some(s) if !node.is_null() => Some(s.text.clone()),
        _ => {
            cx.wrong_type(node, what, "text", "\"...\"");
            None
        }
    }
}

/// A name (agent, step, input, reflex): letters, digits, `-`, `_`.
pub fn name(cx: &mut Cx<'_>, node: &Node, span: Span, text: &str, what: &str) -> Option<String> {
    if is_valid_name(text) {
        return Some(text.to_owned());
    }
    cx.push(
        Diagnostic::error(Code::BadName, span, format!("`{text}` is not a valid {what} name"))
            .with_label("invalid name")
            .with_help("names start with a letter and use only letters, digits, `-` and `_` (at most 64)"),
    );
    let _ = node;
    None
}

/// A whole number in `[min, max]`.
pub fn integer(cx: &mut Cx<'_>, node: &Node, what: &str, min: i64, max: i64) -> Option<i64> {
    let parsed = node
        .as_scalar()
        .filter(|s| s.style == ScalarStyle::Plain)
        .and_then(|s| s.text.replace('_', "").parse::<i64>().ok());
    match parsed {
        Some(n) if (min..=max).contains(&n) => Some(n),
        Some(n) => {
            cx.push(
                Diagnostic::error(Code::BadValue, node.span, format!("{what} must be between {min} and {max}, found {n}"))
                    .with_label("out of range")
                    .with_help(format!("use a whole number from {min} to {max}")),
            );
            None
        }
        None => {
            cx.wrong_type(node, what, "a whole number", &min.max(1).to_string());
            None
        }
    }
}

/// A non-negative whole number that fits `u32`, at least `min`.
pub fn count(cx: &mut Cx<'_>, node: &Node, what: &str, min: u32) -> Option<u32> {
    integer(cx, node, what, i64::from(min), i64::from(u32::MAX)).and_then(|n| u32::try_from(n).ok())
}

/// A number in `[min, max]`.
pub fn number(cx: &mut Cx<'_>, node: &Node, what: &str, min: f64, max: f64) -> Option<f64> {
    let parsed = node
        .as_scalar()
        .filter(|s| s.style == ScalarStyle::Plain)
        .and_then(|s| s.text.replace('_', "").parse::<f64>().ok())
        .filter(|n| n.is_finite());
    match parsed {
        Some(n) if n >= min && n <= max => Some(n),
        Some(n) => {
            cx.push(
                Diagnostic::error(Code::BadValue, node.span, format!("{what} must be between {min} and {max}, found {n}"))
                    .with_label("out of range")
                    .with_help(format!("use a number from {min} to {max}")),
            );
            None
        }
        None => {
            cx.wrong_type(node, what, "a number", &format!("{max}"));
            None
        }
    }
}

/// `true` or `false`.
pub fn boolean(cx: &mut Cx<'_>, node: &Node, what: &str) -> Option<bool> {
    let b = node.as_scalar().and_then(|s| s.as_bool());
    if b.is_none() {
        cx.wrong_type(node, what, "true or false", "true");
    }
    b
}

/// A duration such as `5s`, `500ms`, `1m 30s`.
pub fn duration(cx: &mut Cx<'_>, node: &Node, what: &str) -> Option<Duration> {
    let text = string(cx, node, what)?;
    match humantime::parse_duration(text.trim()) {
        Ok(d) => Some(d),
        Err(e) => {
            cx.push(
                Diagnostic::error(Code::BadDuration, node.span, format!("{what} `{text}` is not a duration: {e}"))
                    .with_label("not a duration")
                    .with_help("write a number and a unit: `500ms`, `5s`, `2m`, `1h 30m`"),
            );
            None
        }
    }
}

/// A memory size such as `24GiB` or `80 GB`, in bytes.
pub fn size(cx: &mut Cx<'_>, node: &Node, what: &str) -> Option<u64> {
    let text = string(cx, node, what)?;
    let trimmed = text.trim();
    let parsed = if trimmed.chars().all(|c| c.is_ascii_digit()) {
        // A bare number would be ambiguous (bytes? GB?): require a unit.
        None
    } else {
        trimmed.parse::<bytesize::ByteSize>().ok()
    };
    match parsed {
        Some(b) if b.as_u64() > 0 => Some(b.as_u64()),
        _ => {
            cx.push(
                Diagnostic::error(Code::BadSize, node.span, format!("{what} `{text}` is not a memory size"))
                    .with_label("not a size")
                    .with_help("write a number and a unit: `24GiB`, `80 GB`, `512MiB`"),
            );
            None
        }
    }
}

/// One of `names`, returning its index.
pub fn choice(cx: &mut Cx<'_>, node: &Node, what: &str, names: &[&str]) -> Option<usize> {
    let text = string(cx, node, what)?;
    if let Some(i) = names.iter().position(|n| n.eq_ignore_ascii_case(text.trim())) {
        return Some(i);
    }
    cx.push(
        Diagnostic::error(Code::BadValue, node.span, format!("`{text}` is not a valid {what}"))
            .with_label(format!("unknown {what}"))
            .with_help(did_you_mean(&text, names.iter().copied(), "values")),
    );
    None
}

/// A list, or a single value standing for a one-item list.
pub fn list(node: &Node) -> Vec<&Node> {
    match &node.kind {
        NodeKind::Seq(items) => items.iter().collect(),
        _ if node.is_null() => Vec::new(),
        _ => vec![node],
    }
}

/// A list of strings (or one string).
pub fn strings(cx: &mut Cx<'_>, node: &Node, what: &str) -> Vec<(String, Span)> {
    list(node)
        .into_iter()
        .filter_map(|n| string(cx, n, what).map(|s| (s, n.span)))
        .collect()
}

/// A list that must be a list (not a single value).
pub fn seq<'n>(cx: &mut Cx<'_>, node: &'n Node, what: &str, example: &str) -> Option<&'n [Node]> {
    match &node.kind {
        NodeKind::Seq(items) => Some(items),
        _ if node.is_null() => Some(&[]),
        _ => {
            cx.wrong_type(node, what, "a list", example);
            None
        }
    }
}
