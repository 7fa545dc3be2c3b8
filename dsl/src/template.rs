//! Prompt templates: literal text with `{{ expr }}` interpolations, where
//! `expr` is a Rhai expression (`{{ steps.look.output }}`).

/// A piece of a template as written, with byte offsets into the template
/// text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RawPart {
    /// Literal text.
    Text(String),
    /// An interpolated expression: its trimmed text and where it starts.
    Expr {
        /// The expression text, trimmed.
        text: String,
        /// Byte offset of `text` in the template.
        offset: usize,
    },
}

/// A template syntax problem: what, and the byte range in the template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TemplateError {
    /// What is wrong.
    pub message: String,
    /// Start of the offending text.
    pub start: usize,
    /// End of the offending text.
    pub end: usize,
    /// How to fix it.
    pub help: &'static str,
}

/// The template of `text`, its expressions unchecked (a workflow's are checked against
/// its inputs and steps as it is lowered): for programs that build a workflow's IR
/// themselves, such as tests and benches. Errors: every syntax problem of `text`.
pub fn unchecked(text: &str) -> Result<crate::ir::Template, Vec<TemplateError>> {
    use crate::ir::{Expr, Template, TemplatePart};
    let (raw, errors) = parse(text);
    if !errors.is_empty() {
        return Err(errors);
    }
    let parts = raw
        .into_iter()
        .map(|p| match p {
            RawPart::Text(t) => TemplatePart::Text(t),
            RawPart::Expr { text, .. } => TemplatePart::Expr(Expr(text)),
        })
        .collect();
    Ok(Template {
        source: text.to_owned(),
        parts,
    })
}

/// Split `text` into literal text and `{{ }}` expressions. Every problem is
/// returned, not only the first.
pub fn parse(text: &str) -> (Vec<RawPart>, Vec<TemplateError>) {
    let mut parts = Vec::new();
    let mut errors = Vec::new();
    let mut rest_start = 0;
    let mut literal = String::new();
    while let Some(open_rel) = text[rest_start..].find("{{") {
        let open = rest_start + open_rel;
        literal.push_str(&text[rest_start..open]);
        let inner_start = open + 2;
        match close_of(text, inner_start) {
            Some(inner_end) => {
                let inner = &text[inner_start..inner_end];
                let lead = inner.len() - inner.trim_start().len();
                let trimmed = inner.trim();
                if trimmed.is_empty() {
                    errors.push(TemplateError {
                        message: "empty interpolation `{{ }}`".to_owned(),
                        start: open,
                        end: inner_end + 2,
                        help: "put an expression inside, e.g. `{{ inputs.figure }}`, or remove the braces",
                    });
                } else {
                    if !literal.is_empty() {
                        parts.push(RawPart::Text(std::mem::take(&mut literal)));
                    }
                    parts.push(RawPart::Expr {
                        text: trimmed.to_owned(),
                        offset: inner_start + lead,
                    });
                }
                rest_start = inner_end + 2;
            }
            None => {
                errors.push(TemplateError {
                    message: "`{{` is not closed by `}}`".to_owned(),
                    start: open,
                    end: open + 2,
                    help: "close the interpolation with `}}`; for literal braces write `{{ \"{{\" }}`",
                });
                literal.push_str("{{");
                rest_start = open + 2;
            }
        }
    }
    literal.push_str(&text[rest_start..]);
    if !literal.is_empty() {
        parts.push(RawPart::Text(literal));
    }
    (parts, errors)
}

/// Where the interpolation whose expression starts at `from` ends: the
/// offset of its closing `}}`. Braces inside string literals and balanced
/// braces of the expression itself (`#{ a: 1 }`) do not close it; a `{{`
/// outside a string means the previous one was never closed.
fn close_of(text: &str, from: usize) -> Option<usize> {
    let bytes = text.as_bytes();
    let mut depth = 0usize;
    let mut i = from;
    while i < bytes.len() {
        match bytes[i] {
            q @ (b'"' | b'\'' | b'`') => {
                i += 1;
                while i < bytes.len() && bytes[i] != q {
                    i += if bytes[i] == b'\\' { 2 } else { 1 };
                }
            }
            b'{' if depth == 0 && bytes.get(i + 1) == Some(&b'{') => return None,
            b'{' => depth += 1,
            b'}' if depth > 0 => depth -= 1,
            b'}' if bytes.get(i + 1) == Some(&b'}') => return Some(i),
            _ => {}
        }
        i += 1;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_text_and_expressions() {
        let (parts, errors) = parse("Describe: {{ inputs.figure }}!");
        assert!(errors.is_empty());
        assert_eq!(
            parts,
            vec![
                RawPart::Text("Describe: ".into()),
                RawPart::Expr {
                    text: "inputs.figure".into(),
                    offset: 13
                },
                RawPart::Text("!".into()),
            ]
        );
    }

    #[test]
    fn braces_in_strings_and_maps_do_not_close() {
        let (parts, errors) = parse(r#"a {{ "{{" }} b {{ #{ x: 1 }.x }} c {{ "}}" }}"#);
        assert!(errors.is_empty(), "{errors:?}");
        let exprs: Vec<&str> = parts
            .iter()
            .filter_map(|p| match p {
                RawPart::Expr { text, .. } => Some(text.as_str()),
                RawPart::Text(_) => None,
            })
            .collect();
        assert_eq!(exprs, [r#""{{""#, "#{ x: 1 }.x", r#""}}""#]);
    }

    #[test]
    fn reports_every_unclosed_interpolation() {
        let (_, errors) = parse("a {{ x b {{ y }} c {{");
        assert_eq!(errors.iter().map(|e| e.start).collect::<Vec<_>>(), vec![2, 19]);
    }
}
