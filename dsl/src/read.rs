//! Typed readers over the [`Node`] tree: each reads one field, reports what is
//! wrong with it (wrong type, bad value, unknown key) and returns `None`, so
//! that lowering goes on and finds the next problem.

use std::time::Duration;

use crate::diag::{Code, Diagnostic, Diagnostics, did_you_mean};
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
    /// Where each endpoint agent's `url` is written, by agent.
    pub endpoint_urls: std::collections::BTreeMap<String, Span>,
    /// Where each tool server's `command` or `url` is written, by server.
    pub tool_transports: std::collections::BTreeMap<String, Span>,
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

    /// The span of bytes `start..end` of the scalar `node`'s value text,
    /// mapped into the file. The value is matched against the source text it
    /// was read from, so positions stay exact through quotes, escapes,
    /// indentation and folded lines; for script values, the call that
    /// declared them.
    pub fn locate_span(&self, node: &Node, start: usize, end: usize) -> Span {
        let Some(s) = node.as_scalar() else {
            return Span::point(node.span.start);
        };
        let raw = self.file.slice(node.span);
        // A script value, or an alias (`*name`) whose text is elsewhere:
        // point at the whole node.
        if self.script || raw.starts_with('*') {
            return node.span;
        }
        let chars = align(raw, &s.text);
        let after_last = chars.last().map_or(0, |c| c.2);
        let from = chars.iter().find(|c| c.0 >= start).map_or(after_last, |c| c.1);
        let to = chars.iter().rev().find(|c| c.0 < end).map_or(from, |c| c.2);
        Span::new(node.span.start + from, node.span.start + to.max(from))
    }
}

/// Match each character of a scalar's value to the source text it was read
/// from: `(offset in the value, start and end in the source)`. Source text
/// that makes no character (quotes, a block header, indentation, an escaped
/// line break) is skipped; an escape sequence makes one character; a space
/// made by folding a line break matches the line break.
fn align(raw: &str, value: &str) -> Vec<(usize, usize, usize)> {
    // Skip an anchor or tag (`&name`, `!!str`) and the opening quote, which
    // could otherwise match the value's first characters.
    let mut r = 0;
    while raw[r..].starts_with(['&', '!']) {
        r = raw[r..].find(char::is_whitespace).map_or(raw.len(), |i| r + i);
        r += raw[r..].len() - raw[r..].trim_start().len();
    }
    let double = raw[r..].starts_with('"');
    if raw[r..].starts_with(['"', '\'']) {
        r += 1;
    }
    let mut out = Vec::with_capacity(value.len());
    let mut values = value.char_indices().peekable();
    while let Some(&(v, vc)) = values.peek() {
        let Some(rc) = raw.get(r..).and_then(|rest| rest.chars().next()) else {
            // Text the source does not hold, such as a block scalar's final
            // line break.
            out.push((v, raw.len(), raw.len()));
            values.next();
            continue;
        };
        if rc == vc {
            out.push((v, r, r + rc.len_utf8()));
            r += rc.len_utf8();
            values.next();
        } else if double && rc == '\\' {
            let esc = raw[r + 1..].chars().next();
            let digits = match esc {
                Some('x') => 2,
                Some('u') => 4,
                Some('U') => 8,
                _ => 0,
            };
            let len = 1 + esc.map_or(0, char::len_utf8) + digits;
            let len = if raw.is_char_boundary((r + len).min(raw.len())) {
                len
            } else {
                1
            };
            let end = (r + len).min(raw.len());
            if !matches!(esc, Some('\n' | '\r')) {
                out.push((v, r, end));
                values.next();
            }
            r = end;
        } else if vc.is_whitespace() && !rc.is_whitespace() {
            out.push((v, r, r));
            values.next();
        } else {
            r += rc.len_utf8();
        }
    }
    out
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
        debug_assert!(
            self.allowed.contains(&key),
            "reader for {} asked for undeclared key {key}",
            self.what
        );
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
                    Diagnostic::error(
                        Code::UnknownKey,
                        e.key_span,
                        format!("unknown key `{}` in {}", e.key, self.what),
                    )
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

/// A string that is not empty or blank.
pub fn nonempty(cx: &mut Cx<'_>, node: &Node, what: &str) -> Option<String> {
    let s = string(cx, node, what)?;
    if s.trim().is_empty() {
        cx.push(
            Diagnostic::error(Code::BadValue, node.span, format!("{what} is empty"))
                .with_label("empty")
                .with_help("give a name"),
        );
        return None;
    }
    Some(s)
}

/// A name (agent, step, input, reflex): letters, digits, `-`, `_`.
pub fn name(cx: &mut Cx<'_>, span: Span, text: &str, kind: NameKind) -> Option<String> {
    let what = kind.what();
    if kind.is_identifier() {
        if is_valid_name(text) && !text.contains('-') {
            return Some(text.to_owned());
        }
        let help = if is_valid_name(text) {
            format!(
                "{what} names are used in expressions (`{}.{}`), where `-` means minus: write `{}`",
                kind.variable(),
                text,
                text.replace('-', "_")
            )
        } else {
            format!("{what} names start with a letter and use only letters, digits and `_` (at most 64)")
        };
        cx.push(
            Diagnostic::error(Code::BadName, span, format!("`{text}` is not a valid {what} name"))
                .with_label("invalid name")
                .with_help(help),
        );
        return None;
    }
    if is_valid_name(text) {
        return Some(text.to_owned());
    }
    cx.push(
        Diagnostic::error(Code::BadName, span, format!("`{text}` is not a valid {what} name"))
            .with_label("invalid name")
            .with_help("names start with a letter and use only letters, digits, `-` and `_` (at most 64)"),
    );
    None
}

/// What a name names, which decides the characters it may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NameKind {
    /// The workflow itself.
    Workflow,
    /// An agent.
    Agent,
    /// A step: referenced in expressions as `steps.<id>`.
    Step,
    /// An input: referenced in expressions as `inputs.<name>`.
    Input,
    /// A reflex.
    Reflex,
    /// A tool server.
    ToolServer,
}

impl NameKind {
    fn what(self) -> &'static str {
        match self {
            NameKind::Workflow => "workflow",
            NameKind::Agent => "agent",
            NameKind::Step => "step",
            NameKind::Input => "input",
            NameKind::Reflex => "reflex",
            NameKind::ToolServer => "tool server",
        }
    }

    /// Names used as identifiers in expressions may not contain `-`.
    fn is_identifier(self) -> bool {
        matches!(self, NameKind::Step | NameKind::Input)
    }

    fn variable(self) -> &'static str {
        match self {
            NameKind::Input => "inputs",
            _ => "steps",
        }
    }
}

fn out_of_range<T: std::fmt::Display>(
    cx: &mut Cx<'_>,
    node: &Node,
    what: &str,
    (min, max): (T, T),
    found: T,
    kind: &str,
) {
    cx.push(
        Diagnostic::error(
            Code::BadValue,
            node.span,
            format!("{what} must be between {min} and {max}, found {found}"),
        )
        .with_label("out of range")
        .with_help(format!("use {kind} from {min} to {max}")),
    );
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
            out_of_range(cx, node, what, (min, max), n, "a whole number");
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
            out_of_range(cx, node, what, (min, max), n, "a number");
            None
        }
        None => {
            // `50%` is a share written as a percentage: show the fraction.
            let example = node
                .as_scalar()
                .and_then(|s| s.text.trim().strip_suffix('%')?.trim().parse::<f64>().ok())
                .map_or_else(|| format!("{max}"), |p| format!("{}", p / 100.0));
            cx.wrong_type(node, what, "a number", &example);
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
                Diagnostic::error(
                    Code::BadDuration,
                    node.span,
                    format!("{what} `{text}` is not a duration: {e}"),
                )
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
    // A bare number would be ambiguous (bytes? GB?): `parse_size` requires a unit.
    match skein_text::parse_size(&text) {
        Some(bytes) if bytes > 0 => Some(bytes),
        _ => {
            cx.push(
                Diagnostic::error(
                    Code::BadSize,
                    node.span,
                    format!("{what} `{text}` is not a memory size"),
                )
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

#[cfg(test)]
mod tests {
    use super::align;

    /// The source text each value character was matched to.
    fn matched(raw: &str, value: &str) -> Vec<String> {
        align(raw, value)
            .into_iter()
            .map(|(_, start, end)| raw[start..end].to_owned())
            .collect()
    }

    #[test]
    fn escapes_make_one_character() {
        let raw = r#""a\tb\"c\x41""#;
        assert_eq!(matched(raw, "a\tb\"cA"), ["a", "\\t", "b", "\\\"", "c", "\\x41"]);
    }

    #[test]
    fn folded_and_indented_lines_match_their_source() {
        // A folded block: the line break between `x` and `y` became a space.
        let spans = align("x &&\n  y\n", "x && y\n");
        let y = spans.iter().find(|c| c.0 == 5).map(|c| c.1);
        assert_eq!(y, Some(7));
        // A single-quoted scalar: `''` is one quote.
        assert_eq!(matched("'it''s'", "it's"), ["i", "t", "'", "s"]);
        // An anchor and a tag come before the value.
        assert_eq!(matched("&a !!str \"ab\"", "ab"), ["a", "b"]);
    }
}
