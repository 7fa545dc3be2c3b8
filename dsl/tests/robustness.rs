//! Properties over many inputs: the front ends never panic, every diagnostic
//! points inside its file and says something, and a valid file's IR does not
//! depend on comments and blank lines.

use proptest::prelude::*;
use skein_dsl::{RenderOptions, SourceKind};

const LAB_YAML: &str = include_str!("../../workflows/lab-research.yaml");
const LAB_RHAI: &str = include_str!("../../workflows/lab-research.rhai");
const REFLEX_YAML: &str = include_str!("../../workflows/reflex-demo.yaml");

fn check_wellformed(text: &str, kind: SourceKind) {
    let parsed = skein_dsl::parse_as("p", text, kind);
    for d in parsed.diagnostics.iter() {
        assert!(d.span.start <= d.span.end && d.span.end <= text.len(), "{d:?}");
        assert!(!d.message.is_empty());
    }
    assert_eq!(parsed.workflow.is_some(), !parsed.diagnostics.has_errors());
    let rendered = parsed.render(RenderOptions::default());
    assert_eq!(rendered.is_empty(), parsed.diagnostics.is_empty());
}

/// Apply an edit to a valid workflow: delete, duplicate or replace a line,
/// or insert a string at a character position.
fn mutate(base: &str, op: u8, at: usize, insert: &str) -> String {
    let lines: Vec<&str> = base.lines().collect();
    let i = at % lines.len();
    match op % 4 {
        0 => lines
            .iter()
            .enumerate()
            .filter(|(j, _)| *j != i)
            .map(|(_, l)| *l)
            .collect::<Vec<_>>()
            .join("\n"),
        1 => {
            let mut v = lines.clone();
            v.insert(i, lines[i]);
            v.join("\n")
        }
        2 => {
            let mut v = lines.clone();
            v[i] = insert;
            v.join("\n")
        }
        _ => {
            let mut chars: Vec<char> = base.chars().collect();
            let pos = at % (chars.len() + 1);
            for (k, c) in insert.chars().enumerate() {
                chars.insert(pos + k, c);
            }
            chars.into_iter().collect()
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn any_text_is_handled(text in "\\PC{0,300}") {
        check_wellformed(&text, SourceKind::Yaml);
        check_wellformed(&text, SourceKind::Rhai);
    }

    #[test]
    fn edited_workflows_are_handled(
        op in 0u8..4,
        at in 0usize..10_000,
        insert in prop::sample::select(vec![
            "", "  ", "\t", ":", "- ", "{", "}", "[", "]", "'", "\"", "{{", "}}", "&a", "*a", "!!int",
            "---", "#", "|", ">", "agent: nobody", "after: [review]", "when: 'gpu.util >'",
            "for: 5 parsecs", "é", "\u{0}", "#{", "\");", "loop {}", "let x = ",
        ]),
    ) {
        check_wellformed(&mutate(LAB_YAML, op, at, insert), SourceKind::Yaml);
        check_wellformed(&mutate(REFLEX_YAML, op, at, insert), SourceKind::Yaml);
        check_wellformed(&mutate(LAB_RHAI, op, at, insert), SourceKind::Rhai);
    }

    #[test]
    fn comments_and_blank_lines_do_not_change_the_ir(
        edits in prop::collection::vec((0usize..200, 0u8..3), 1..12),
    ) {
        // reflex-demo.yaml has no block scalars, so a comment, a blank line or
        // trailing spaces may go after any line without changing a value.
        let mut lines: Vec<String> = REFLEX_YAML.lines().map(str::to_owned).collect();
        for (at, kind) in edits {
            let i = at % lines.len();
            match kind {
                0 => lines.insert(i, "# a comment".to_owned()),
                1 => lines.insert(i, String::new()),
                _ => lines[i].push_str("   "),
            }
        }
        let edited = lines.join("\n");
        let a = skein_dsl::parse("a.yaml", REFLEX_YAML).workflow;
        let b = skein_dsl::parse("b.yaml", &edited).workflow;
        prop_assert!(a.is_some());
        prop_assert_eq!(a, b);
    }
}
