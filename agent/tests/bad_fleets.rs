//! The bad fleet file corpus: every `tests/bad_fleets/*.yaml` has one intended
//! problem (a few have several), declared on its first line as `# expect: <line>:<col>`
//! — where the first diagnostic must point. The whole rendering (message, excerpt,
//! caret, help) is snapshotted, so any change to a message shows up in review.

use std::path::Path;

use skein_agent::{FleetError, load_fleet};

fn expectation(text: &str) -> (u64, u64) {
    let first = text.lines().next().unwrap_or_default();
    let at = first
        .strip_prefix("# expect: ")
        .unwrap_or_else(|| panic!("the first line must be `# expect: <line>:<col>`, found {first:?}"));
    let (line, column) = at.trim().split_once(':').expect("<line>:<col>");
    (line.parse().expect("line"), column.parse().expect("column"))
}

fn check(path: &Path) {
    let text = std::fs::read_to_string(path).unwrap();
    let expect = expectation(&text);
    // Relative to the crate (the test's working directory), so names are stable.
    let file_name = path.file_name().unwrap().to_string_lossy();
    let relative = Path::new("tests/bad_fleets").join(&*file_name);
    let error = match load_fleet(&relative) {
        Ok(_) => panic!("{file_name} was accepted"),
        Err(error) => error,
    };
    let FleetError::Invalid(diagnostics) = &error else {
        panic!("{file_name}: expected diagnostics, got {error:?}");
    };
    let first = diagnostics.0.first().expect("at least one diagnostic");
    assert_eq!(
        (first.line, first.column),
        expect,
        "{file_name}: first diagnostic is {}\n\n{error}",
        first.one_line()
    );
    assert!(diagnostics.0.iter().all(|d| d.line > 0 && d.column > 0), "{error}");
    insta::assert_snapshot!("diagnostics", error.to_string());
}

#[test]
fn bad_fleet_files_are_refused_with_the_intended_message() {
    insta::glob!("bad_fleets/*.yaml", check);
}

#[test]
fn several_problems_are_reported_together() {
    let error = load_fleet("tests/bad_fleets/18-several-problems.yaml").unwrap_err();
    let lines: Vec<String> = error.diagnostics().iter().map(|d| d.one_line()).collect();
    assert_eq!(lines.len(), 4, "{error}");
}
