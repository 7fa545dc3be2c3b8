//! What several DSL tests share.

/// `text` parsed as the file `name`, which must be valid without a warning; panics with
/// the rendered diagnostics otherwise.
pub fn parse_clean(name: &str, text: &str) -> skein_dsl::ir::Workflow {
    let parsed = skein_dsl::parse(name, text);
    assert!(
        parsed.is_valid() && parsed.diagnostics.is_empty(),
        "{}",
        parsed.render(skein_dsl::RenderOptions::default())
    );
    parsed.workflow.expect("a valid workflow")
}
