//! Every example workflow in `workflows/` validates, its IR is snapshotted,
//! and the YAML and Rhai forms of the reference story are equal.

use std::path::Path;

fn parse_example(rel: &str) -> skein_dsl::Parsed {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../workflows").join(rel);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    skein_dsl::parse(&format!("workflows/{rel}"), &text)
}

#[test]
fn every_example_is_valid_and_its_ir_is_stable() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../workflows");
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .expect("workflows/ exists")
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".yaml") || n.ends_with(".rhai"))
        .collect();
    names.sort();
    assert!(names.len() >= 4, "expected the example workflows, found {names:?}");
    for name in names {
        let parsed = parse_example(&name);
        assert!(
            parsed.is_valid() && parsed.diagnostics.is_empty(),
            "{name} should validate cleanly:\n{}",
            parsed.render(skein_dsl::RenderOptions::default())
        );
        let snap = name.replace('.', "_");
        insta::assert_yaml_snapshot!(snap, parsed.workflow);
    }
}

#[test]
fn yaml_and_rhai_forms_yield_equal_ir() {
    let yaml = parse_example("lab-research.yaml").workflow.expect("yaml is valid");
    let rhai = parse_example("lab-research.rhai").workflow.expect("rhai is valid");
    assert_eq!(yaml, rhai);
}

#[test]
fn topological_order_follows_after() {
    let w = parse_example("lab-research.yaml").workflow.expect("valid");
    assert_eq!(w.topological_order(), ["look", "code", "review", "report"]);
}
