//! The web page's unit tests: `node --test` on `web/tests/*.test.mjs` (the SSE parser,
//! the ELK graph builder and the fleet's figures, on fixtures from a simulated fleet;
//! the pure modules of `web/` need no browser). Node is required: without it this test
//! fails, it does not skip.

use std::path::Path;
use std::process::Command;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

#[test]
fn the_pages_modules_pass_their_node_tests() {
    let dir = Path::new(ROOT).join("web/tests");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .expect("web/tests is a folder")
        .map(|entry| entry.expect("an entry of web/tests").path())
        .filter(|path| path.to_string_lossy().ends_with(".test.mjs"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no web/tests/*.test.mjs");
    let output = skein_testkit::process::output_within(
        Command::new("node").arg("--test").args(&files).current_dir(&dir),
        std::time::Duration::from_secs(300),
        "node --test (the web page's unit tests need Node.js 18 or newer on the PATH)",
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "node --test failed on {} file(s):\n{stdout}\n{stderr}",
        files.len()
    );
    // Each file's tests ran (a file that fails to load fails above).
    assert!(stdout.contains("# fail 0"), "node --test said:\n{stdout}\n{stderr}");
}
