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

/// Split `text` into literal text and `{{ }}` expressions. Every problem is
/// returned, not only the first.
pub fn parse(text: &str) -> (Vec<RawPart>, Vec<TemplateError>) {
    let mut parts = Vec::new();
    let mut errors = Vec::new();
    let mut rest_start = 0;
    let mut literal = String::new();
    while let Some(open_rel) = text[rest_start..].find("{{") {
        let open = rest_start + open_rel;
        let close_rel = text[open + 2..].find("}}");
        let next_open = text[open + 2..].find("{{");
        literal.push_str(&text[rest_start..open]);
        match close_rel {
            Some(c) if next_open.is_none_or(|n| n > c) => {
                let inner_start = open + 2;
                let inner_end = inner_start + c;
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
            _ => {
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
    fn reports_every_unclosed_interpolation() {
        let (_, errors) = parse("a {{ x b {{ y }} c {{");
        assert_eq!(errors.iter().map(|e| e.start).collect::<Vec<_>>(), vec![2, 19]);
    }
}
