//! The bad-input corpus: every file in `tests/bad/` is a small workflow with
//! one intended problem, declared on its first line as
//! `# expect: <code> <line>:<col>` (`// expect: ...` in `.rhai` files), with
//! a 1-based line and a column in characters.
//!
//! Each file must be rejected with a diagnostic of that code starting at that
//! position, and its whole rendering (message, underline, label, help) is
//! snapshotted, so a change in any of them shows up in review.

use std::collections::BTreeSet;
use std::path::Path;

use skein_dsl::{Parsed, RenderOptions};

/// Where the corpus lives, relative to the crate (`insta::glob!` takes the
/// same directory relative to this file: `bad/`).
const CORPUS: &str = "tests/bad";

/// What a corpus file says it must produce.
#[derive(Debug, PartialEq, Eq)]
struct Expect {
    code: String,
    line: usize,
    column: usize,
}

/// Read the `expect:` declaration from the first line of `text`.
fn expectation(text: &str) -> Result<Expect, String> {
    let first = text.lines().next().unwrap_or_default();
    let rest = first
        .strip_prefix("# expect:")
        .or_else(|| first.strip_prefix("// expect:"))
        .ok_or_else(|| format!("the first line must be `# expect: <code> <line>:<col>`, found {first:?}"))?;
    let mut words = rest.split_whitespace();
    let (Some(code), Some(at), None) = (words.next(), words.next(), words.next()) else {
        return Err(format!(
            "expected `<code> <line>:<col>` after `expect:`, found {rest:?}"
        ));
    };
    let (line, column) = at
        .split_once(':')
        .and_then(|(l, c)| Some((l.parse().ok()?, c.parse().ok()?)))
        .ok_or_else(|| format!("expected `<line>:<col>`, found {at:?}"))?;
    Ok(Expect {
        code: code.to_owned(),
        line,
        column,
    })
}

/// Every diagnostic in the grep-friendly one-line form, for failure messages.
fn one_lines(parsed: &Parsed) -> String {
    parsed
        .diagnostics
        .sorted()
        .into_iter()
        .map(|d| skein_dsl::diag::one_line(d, &parsed.file))
        .collect::<Vec<_>>()
        .join("\n")
}

fn check(path: &Path) {
    let file_name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
    // A stable name, so snapshots do not depend on where the repository is.
    let name = format!("bad/{file_name}");
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    let expect = expectation(&text).unwrap_or_else(|e| panic!("{name}: {e}"));

    let parsed = skein_dsl::parse(&name, &text);
    let rendered = parsed.render(RenderOptions::default());
    assert!(
        !parsed.is_valid(),
        "{name} was accepted; it should fail with {expect:?}"
    );
    assert!(
        parsed.workflow.is_none(),
        "{name} is invalid but still produced a workflow"
    );
    let hit = parsed.diagnostics.iter().any(|d| {
        let at = parsed.file.line_col(d.span.start);
        d.code.name() == expect.code && (at.line, at.column) == (expect.line, expect.column)
    });
    assert!(
        hit,
        "{name}: expected `{}` at {}:{}, got:\n{}\n\n{rendered}",
        expect.code,
        expect.line,
        expect.column,
        one_lines(&parsed)
    );
    insta::assert_snapshot!("diagnostics", rendered);
}

#[test]
fn bad_inputs_give_the_intended_diagnostic() {
    insta::glob!("bad/*.{yaml,rhai}", check);
}

#[test]
fn corpus_is_large_and_varied() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join(CORPUS);
    let mut files = 0;
    let mut codes = BTreeSet::new();
    for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("reading {}: {e}", dir.display())) {
        let path = entry.expect("directory entry").path();
        if !matches!(path.extension().and_then(|e| e.to_str()), Some("yaml" | "rhai")) {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
        let expect = expectation(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        files += 1;
        codes.insert(expect.code);
    }
    assert!(files >= 25, "the corpus has {files} files; it should have at least 25");
    assert!(
        codes.len() >= 20,
        "the corpus covers {} codes ({codes:?}); it should cover at least 20",
        codes.len()
    );
}

#[test]
fn expectations_parse() {
    assert_eq!(
        expectation("# expect: unknown-key 3:5\nname: x\n"),
        Ok(Expect {
            code: "unknown-key".into(),
            line: 3,
            column: 5
        })
    );
    assert_eq!(expectation("// expect: script-error 10:1").map(|e| e.line), Ok(10));
    assert!(expectation("name: x\n").is_err());
    assert!(expectation("# expect: unknown-key 3\n").is_err());
}
