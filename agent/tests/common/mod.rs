//! What the engine tests share: the fake engine behind a script, as the program of a spec.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// A program that prints a line, then runs the fake engine with `settings` (its
/// `SKEIN_FAKE_ENGINE_*` variables) and the arguments it was given: the supervisor adds
/// only the spec's variables to the environment, so the test's settings travel in it.
pub fn engine_program(dir: &Path, settings: &[(&str, String)]) -> PathBuf {
    let mut script = String::from("#!/bin/sh\necho \"fake weights: loading $4\"\n");
    for (name, value) in settings {
        script.push_str(&format!("export {name}='{value}'\n"));
    }
    script.push_str(&format!(
        "exec '{}' \"$@\"\n",
        skein_testkit::fake_engine_path().display()
    ));
    let path = dir.join("engine.sh");
    std::fs::write(&path, script).expect("write the engine script");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("make it executable");
    path
}
