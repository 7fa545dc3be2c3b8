//! Any text through the Rhai workflow-script front end (sandboxed), lowering, checks and rendering:
//! never a panic, and every diagnostic points inside the file.
#![no_main]

use libfuzzer_sys::fuzz_target;
use skein_dsl::{RenderOptions, SourceKind};

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let parsed = skein_dsl::parse_as("fuzz.rhai", &text, SourceKind::Rhai);
    for d in parsed.diagnostics.iter() {
        assert!(d.span.start <= d.span.end && d.span.end <= text.len(), "{d:?}");
    }
    let _ = parsed.render(RenderOptions::default());
    let _ = skein_dsl::diag::to_json(&parsed.diagnostics, &parsed.file);
});
