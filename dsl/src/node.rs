//! The spanned document tree both front ends produce.
//!
//! YAML files and Rhai scripts are first turned into [`Node`]s — maps,
//! sequences and scalars, each with the span of source text it came from —
//! and one lowering pass (`lower`) turns that tree into the IR. Keeping one
//! lowering for both languages is what makes a `.yaml` and a `.rhai`
//! workflow yield equal IR and equal diagnostics.

use crate::source::Span;

/// One value of the document, with where it came from.
#[derive(Debug, Clone, PartialEq)]
pub struct Node {
    /// The source text of this value (for values built by a `.rhai` script:
    /// the call that declared them).
    pub span: Span,
    /// The value.
    pub kind: NodeKind,
}

/// The three shapes of a value.
#[derive(Debug, Clone, PartialEq)]
pub enum NodeKind {
    /// Key/value pairs in source order; keys are unique (the front ends
    /// report duplicates).
    Map(Vec<Entry>),
    /// Items in order.
    Seq(Vec<Node>),
    /// A leaf value, kept as text: its type is decided by the field it fills.
    Scalar(Scalar),
}

/// One `key: value` pair.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    /// The key text.
    pub key: String,
    /// Where the key is written.
    pub key_span: Span,
    /// The value.
    pub value: Node,
}

/// A leaf value.
#[derive(Debug, Clone, PartialEq)]
pub struct Scalar {
    /// The value text after YAML unescaping and folding.
    pub text: String,
    /// How it was written.
    pub style: ScalarStyle,
}

/// How a scalar was written, which decides its type where a field accepts
/// several (`"8192"` is a string, `8192` a number, `~` nothing).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScalarStyle {
    /// An unquoted YAML scalar, or a number or boolean from a script.
    Plain,
    /// A quoted YAML scalar, or a string from a script.
    Quoted,
    /// A YAML `|` or `>` block.
    Block,
}

impl Node {
    /// A human name for the node's shape, for "expected X, found Y".
    pub fn kind_name(&self) -> &'static str {
        match &self.kind {
            NodeKind::Map(_) => "a mapping",
            NodeKind::Seq(_) => "a list",
            NodeKind::Scalar(s) if s.is_null() => "nothing (null)",
            NodeKind::Scalar(s) if s.style != ScalarStyle::Plain => "a string",
            NodeKind::Scalar(s) if s.text.parse::<f64>().is_ok() => "a number",
            NodeKind::Scalar(s) if s.as_bool().is_some() => "a boolean",
            NodeKind::Scalar(_) => "a string",
        }
    }

    /// The scalar, when the node is one.
    pub fn as_scalar(&self) -> Option<&Scalar> {
        match &self.kind {
            NodeKind::Scalar(s) => Some(s),
            _ => None,
        }
    }

    /// Whether this is an explicit or implicit null.
    pub fn is_null(&self) -> bool {
        self.as_scalar().is_some_and(Scalar::is_null)
    }
}

impl Scalar {
    /// YAML 1.2 core-schema null: empty, `~` or `null` when unquoted.
    pub fn is_null(&self) -> bool {
        self.style == ScalarStyle::Plain && matches!(self.text.as_str(), "" | "~" | "null" | "Null" | "NULL")
    }

    /// YAML 1.2 core-schema boolean when unquoted.
    pub fn as_bool(&self) -> Option<bool> {
        if self.style != ScalarStyle::Plain {
            return None;
        }
        match self.text.as_str() {
            "true" | "True" | "TRUE" => Some(true),
            "false" | "False" | "FALSE" => Some(false),
            _ => None,
        }
    }
}
