//! YAML front end: text → spanned [`Node`] tree.
//!
//! Built on `saphyr-parser`'s event stream so that every node keeps its exact
//! span, scalars keep their quoting style, and resource limits are ours:
//! nesting depth and the node count after alias expansion are bounded, so an
//! alias bomb or a pathological nesting ends with a diagnostic instead of
//! exhausting memory or the stack (the builder uses an explicit stack).

use std::collections::HashMap;

use saphyr_parser::{Event, Marker, Parser, ScalarStyle as YStyle, Tag};

use crate::diag::{Code, Diagnostic, Diagnostics};
use crate::node::{Entry, Node, NodeKind, Scalar, ScalarStyle};
use crate::source::{SourceFile, Span};

/// Deepest nesting of maps and lists accepted.
pub const MAX_DEPTH: usize = 64;
/// Most nodes a document may hold once aliases are expanded.
pub const MAX_NODES: usize = 100_000;

enum Frame {
    Map {
        start: usize,
        anchor: usize,
        entries: Vec<Entry>,
        /// Index of each key in `entries`, for duplicate detection.
        seen: HashMap<String, usize>,
        key: Option<(String, Span)>,
        /// A non-scalar key was seen: its value is dropped.
        skip_value: bool,
    },
    Seq {
        start: usize,
        anchor: usize,
        items: Vec<Node>,
    },
}

/// Parse `file` as one YAML document. Returns the tree when the text is
/// well-formed YAML; every problem found is pushed into `diags`.
pub fn parse(file: &SourceFile, diags: &mut Diagnostics) -> Option<Node> {
    let mut builder = Builder {
        file,
        diags,
        stack: Vec::new(),
        anchors: HashMap::new(),
        nodes: 0,
        root: None,
    };
    let mut documents = 0usize;
    for event in Parser::new_from_str(file.text()) {
        let (event, span) = match event {
            Ok(ev) => ev,
            Err(e) => {
                let at = builder.offset(e.marker());
                if e.info() == "recursion limit exceeded" {
                    // The scanner counts open `[`/`{` in a byte and reads
                    // ahead, so deep flow nesting fails here, before the
                    // builder sees the collections.
                    builder.diags.push(too_deep(Span::point(at)));
                    return None;
                }
                let d = Diagnostic::error(Code::YamlSyntax, Span::point(at), format!("invalid YAML: {}", e.info()))
                    .with_label("here");
                // A `{` or `[` left open is found only where the parser gives
                // up, often a line later: show where it was opened.
                let d = match builder.open_flow() {
                    Some((open, [open_c, close_c], what)) => d
                        .with_related(
                            Span::new(open, open + 1),
                            format!("this {what} is not closed before the error"),
                        )
                        .with_help(format!(
                            "check that this `{open_c}` is closed by `{close_c}`, and the quoting inside it"
                        )),
                    None => d.with_help("check the indentation and quoting around this point"),
                };
                builder.diags.push(d);
                return None;
            }
        };
        let span = Span::new(builder.offset(&span.start), builder.offset(&span.end));
        let flow = match event {
            Event::DocumentStart(_) => {
                documents += 1;
                if documents > 1 {
                    builder.diags.push(
                        Diagnostic::error(
                            Code::UnsupportedYaml,
                            span,
                            "a workflow file holds one YAML document, this is a second one",
                        )
                        .with_label("second document starts here")
                        .with_help("put each workflow in its own file"),
                    );
                    return None;
                }
                Ok(())
            }
            Event::Scalar(text, style, anchor, tag) => {
                builder.scalar(span, text.into_owned(), style, anchor, tag.as_deref())
            }
            Event::MappingStart(anchor, tag) => builder.open(span, anchor, tag.as_deref(), true),
            Event::SequenceStart(anchor, tag) => builder.open(span, anchor, tag.as_deref(), false),
            Event::MappingEnd | Event::SequenceEnd => builder.close(span),
            Event::Alias(id) => builder.alias(span, id),
            Event::StreamStart | Event::StreamEnd | Event::DocumentEnd | Event::Nothing => Ok(()),
        };
        if flow.is_err() {
            return None;
        }
    }
    if builder.root.is_none() && !builder.diags.has_errors() {
        builder.diags.push(
            Diagnostic::error(Code::MissingKey, Span::point(0), "the workflow file is empty")
                .with_label("nothing here")
                .with_help("start with `name: my-workflow` and an `agents:` section (see docs/workflows.md)"),
        );
    }
    builder.root
}

/// Stop building: a limit was hit and reported.
struct Stop;

struct Builder<'a> {
    file: &'a SourceFile,
    diags: &'a mut Diagnostics,
    stack: Vec<Frame>,
    anchors: HashMap<usize, (Node, usize)>,
    nodes: usize,
    root: Option<Node>,
}

impl Builder<'_> {
    fn offset(&self, m: &Marker) -> usize {
        self.file.offset_of_char(m.index())
    }

    /// The innermost open collection when it is a flow one (`{ ... }` or
    /// `[ ... ]`): where it opens, its brackets and what it is.
    fn open_flow(&self) -> Option<(usize, [char; 2], &'static str)> {
        let start = match self.stack.last()? {
            Frame::Map { start, .. } | Frame::Seq { start, .. } => *start,
        };
        match self.file.text().get(start..)?.chars().next()? {
            '{' => Some((start, ['{', '}'], "mapping")),
            '[' => Some((start, ['[', ']'], "list")),
            _ => None,
        }
    }

    fn count(&mut self, n: usize, span: Span) -> Result<(), Stop> {
        self.nodes += n;
        if self.nodes > MAX_NODES {
            self.diags.push(
                Diagnostic::error(
                    Code::YamlLimit,
                    span,
                    format!("the document expands to more than {MAX_NODES} values"),
                )
                .with_label("limit reached here")
                .with_help("a workflow is small; check for aliases (`*name`) that expand recursively"),
            );
            return Err(Stop);
        }
        Ok(())
    }

    fn check_tag(&mut self, tag: Option<&Tag>, span: Span, allowed: &[&str]) -> Option<String> {
        let tag = tag?;
        if tag.is_yaml_core_schema() && allowed.contains(&tag.suffix.as_str()) {
            return Some(tag.suffix.clone());
        }
        self.diags.push(
            Diagnostic::error(
                Code::UnsupportedYaml,
                span,
                format!("the YAML tag `{tag}` is not supported here"),
            )
            .with_label("unsupported tag")
            .with_help("remove the tag; values are typed by the field they fill"),
        );
        None
    }

    fn scalar(
        &mut self,
        span: Span,
        text: String,
        style: YStyle,
        anchor: usize,
        tag: Option<&Tag>,
    ) -> Result<(), Stop> {
        self.count(1, span)?;
        let mut style = match style {
            YStyle::Plain => ScalarStyle::Plain,
            YStyle::SingleQuoted | YStyle::DoubleQuoted => ScalarStyle::Quoted,
            YStyle::Literal | YStyle::Folded => ScalarStyle::Block,
        };
        // A core-schema tag types the scalar as its style would: `!!str`
        // makes it text, the others make a quoted value read as unquoted.
        match self
            .check_tag(tag, span, &["str", "int", "float", "bool", "null"])
            .as_deref()
        {
            Some("str") => style = ScalarStyle::Quoted,
            Some(_) => style = ScalarStyle::Plain,
            None => {}
        }
        let node = Node {
            span,
            kind: NodeKind::Scalar(Scalar { text, style }),
        };
        self.finish(node, anchor, 1)
    }

    fn open(&mut self, span: Span, anchor: usize, tag: Option<&Tag>, map: bool) -> Result<(), Stop> {
        self.check_tag(tag, span, if map { &["map"] } else { &["seq"] });
        if self.stack.len() >= MAX_DEPTH {
            self.diags.push(too_deep(span));
            return Err(Stop);
        }
        self.count(1, span)?;
        self.stack.push(if map {
            Frame::Map {
                start: span.start,
                anchor,
                entries: Vec::new(),
                seen: HashMap::new(),
                key: None,
                skip_value: false,
            }
        } else {
            Frame::Seq {
                start: span.start,
                anchor,
                items: Vec::new(),
            }
        });
        Ok(())
    }

    fn close(&mut self, span: Span) -> Result<(), Stop> {
        let Some(frame) = self.stack.pop() else {
            return Ok(());
        };
        let (start, anchor, kind) = match frame {
            Frame::Map {
                start, anchor, entries, ..
            } => (start, anchor, NodeKind::Map(entries)),
            Frame::Seq { start, anchor, items } => (start, anchor, NodeKind::Seq(items)),
        };
        // Block collections end where their last item ends; the end event of
        // a block collection may sit at the start of the next line.
        let end = match &kind {
            NodeKind::Map(e) => e.last().map(|e| e.value.span.end),
            NodeKind::Seq(i) => i.last().map(|n| n.span.end),
            NodeKind::Scalar(_) => None,
        }
        .map_or(span.end, |last| {
            if span.end > last && !span.is_empty() {
                span.end
            } else {
                last.max(start)
            }
        });
        let size = node_count(&kind);
        let node = Node {
            span: Span::new(start, end),
            kind,
        };
        self.finish(node, anchor, size)
    }

    fn alias(&mut self, span: Span, id: usize) -> Result<(), Stop> {
        let Some((node, size)) = self.anchors.get(&id).cloned() else {
            self.diags.push(
                Diagnostic::error(Code::YamlSyntax, span, "this alias refers to no anchor")
                    .with_label("unknown alias")
                    .with_help("define the anchor (`&name`) before using it"),
            );
            return Err(Stop);
        };
        self.count(size, span)?;
        // The copy points at the alias, so problems in it are reported where
        // it is used.
        let node = Node { span, ..node };
        self.finish(node, 0, size)
    }

    fn finish(&mut self, node: Node, anchor: usize, size: usize) -> Result<(), Stop> {
        if anchor != 0 {
            self.anchors.insert(anchor, (node.clone(), size));
        }
        match self.stack.last_mut() {
            None => self.root = Some(node),
            Some(Frame::Seq { items, .. }) => items.push(node),
            Some(Frame::Map {
                entries,
                seen,
                key,
                skip_value,
                ..
            }) => match key.take() {
                None if *skip_value => *skip_value = false,
                None => match node.kind {
                    NodeKind::Scalar(s) => *key = Some((s.text, node.span)),
                    _ => {
                        *skip_value = true;
                        self.diags.push(
                            Diagnostic::error(
                                Code::UnsupportedYaml,
                                node.span,
                                "keys must be plain names, not lists or mappings",
                            )
                            .with_label("complex key")
                            .with_help("write the key as a name, e.g. `model:`"),
                        );
                    }
                },
                Some((k, key_span)) => {
                    if let Some(&first) = seen.get(&k) {
                        let first_span = entries[first].key_span;
                        self.diags.push(
                            Diagnostic::error(
                                Code::DuplicateKey,
                                key_span,
                                format!("the key `{k}` appears twice in this mapping"),
                            )
                            .with_label("second occurrence")
                            .with_related(first_span, "first occurrence")
                            .with_help("remove one of them; YAML keeps only one value per key"),
                        );
                    } else {
                        seen.insert(k.clone(), entries.len());
                        entries.push(Entry {
                            key: k,
                            key_span,
                            value: node,
                        });
                    }
                }
            },
        }
        Ok(())
    }
}

fn too_deep(span: Span) -> Diagnostic {
    Diagnostic::error(
        Code::YamlLimit,
        span,
        format!("values are nested more than {MAX_DEPTH} levels deep"),
    )
    .with_label("too deep")
    .with_help("a workflow needs only a few levels of nesting")
}

fn node_count(kind: &NodeKind) -> usize {
    // Children were counted as they were built; only the total for aliases
    // needs the size of a subtree.
    1 + match kind {
        NodeKind::Map(e) => e.iter().map(|e| 1 + node_count(&e.value.kind)).sum(),
        NodeKind::Seq(i) => i.iter().map(|n| node_count(&n.kind)).sum(),
        NodeKind::Scalar(_) => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_ok(text: &str) -> Node {
        let f = SourceFile::new("t.yaml", text);
        let mut d = Diagnostics::default();
        let n = parse(&f, &mut d);
        assert!(d.is_empty(), "{d:?}");
        n.expect("tree")
    }

    #[test]
    fn spans_point_at_values() {
        let text = "name: hello\nagents:\n  a: { model: { repo: x/y } }\n";
        let n = parse_ok(text);
        let NodeKind::Map(entries) = &n.kind else { panic!() };
        assert_eq!(entries[0].key, "name");
        assert_eq!(&text[entries[0].value.span.start..entries[0].value.span.end], "hello");
        assert_eq!(&text[entries[1].key_span.start..entries[1].key_span.end], "agents");
    }

    #[test]
    fn alias_bomb_is_refused() {
        let mut text = String::from("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
        for i in 1..10 {
            text.push_str(&format!(
                "a{i}: &a{i} [*a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}]\n",
                p = i - 1
            ));
        }
        let f = SourceFile::new("bomb.yaml", text);
        let mut d = Diagnostics::default();
        assert!(parse(&f, &mut d).is_none());
        assert_eq!(d.iter().next().map(|d| d.code), Some(Code::YamlLimit));
    }

    #[test]
    fn deep_nesting_is_refused_without_recursion() {
        let text = format!("{}{}", "[".repeat(10_000), "]".repeat(10_000));
        let f = SourceFile::new("deep.yaml", text);
        let mut d = Diagnostics::default();
        assert!(parse(&f, &mut d).is_none());
        assert!(d.iter().any(|d| d.code == Code::YamlLimit), "{d:?}");
    }
}
