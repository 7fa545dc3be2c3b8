//! Finding the `fake-engine` binary (and the testkit's other binaries, through
//! `testkit_binary`) from another crate's tests.
//!
//! `CARGO_BIN_EXE_fake-engine` exists only in this crate's own tests. Other crates'
//! tests find the binary next to their own executable (`target/<profile>/deps/…` →
//! `target/<profile>/fake-engine`). `cargo test --workspace` builds it; `cargo test -p
//! skein-agent` builds only the testkit library, so when the binary is missing or older
//! than its source, cargo is asked to build it. (Not every time: a build of the testkit
//! alone unifies features differently and would recompile its dependencies.)

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The path of a current `fake-engine` binary, built once per test process.
///
/// # Panics
///
/// When the test executable's location is not a cargo target directory, or when the
/// binary can be neither built nor found (a test helper: failing loudly is the point).
pub fn fake_engine_path() -> PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| testkit_binary("fake-engine")).clone()
}

/// The path of a current build of the testkit's binary `name` (`src/bin/NAME.rs`),
/// built here when missing or older than its source; panics as [`fake_engine_path`].
pub(crate) fn testkit_binary(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("the test executable's path");
    // target/<profile>/deps/<test>-<hash> → target/<profile>
    let profile_dir = exe
        .parent()
        .filter(|deps| deps.ends_with("deps"))
        .and_then(Path::parent)
        .unwrap_or_else(|| panic!("{} is not under a cargo target/<profile>/deps directory", exe.display()));
    let binary = profile_dir.join(format!("{name}{}", std::env::consts::EXE_SUFFIX));
    if is_current(&binary, name) {
        return binary;
    }
    match build(profile_dir, name) {
        Ok(()) if binary.exists() => binary,
        // Cargo unavailable (a test binary run by hand): a binary already built will do.
        _ if binary.exists() => binary,
        Ok(()) => panic!("cargo built {name} but {} does not exist", binary.display()),
        Err(why) => panic!("{name} is not built and building it failed: {why}"),
    }
}

/// Whether `binary` exists and is newer than the source of the testkit's binary `name`.
fn is_current(binary: &Path, name: &str) -> bool {
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("src/bin/{name}.rs"));
    let modified = |path: &Path| std::fs::metadata(path).and_then(|m| m.modified()).ok();
    match (modified(binary), modified(&source)) {
        (Some(built), Some(written)) => built >= written,
        (Some(_), None) => true,
        (None, _) => false,
    }
}

/// `cargo build -p skein-testkit --bin NAME` into the same target directory and profile
/// as the running test.
fn build(profile_dir: &Path, name: &str) -> Result<(), String> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| env!("CARGO").into());
    let profile = profile_dir
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| format!("{} has no profile name", profile_dir.display()))?;
    // The directory above the profile: `target`, or `target/<triple>` when building for
    // an explicit target — either way the binary lands in `profile_dir`.
    let target_dir = profile_dir
        .parent()
        .ok_or_else(|| format!("{} has no parent", profile_dir.display()))?;
    let mut command = Command::new(cargo);
    command
        .args(["build", "--quiet", "-p", "skein-testkit", "--bin", name])
        .arg("--manifest-path")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml"))
        .arg("--target-dir")
        .arg(target_dir);
    // The `debug` directory is the `dev` profile; the others are named after theirs.
    if profile != "debug" {
        command.args(["--profile", profile]);
    }
    let status = command.status().map_err(|e| format!("cannot run cargo: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("cargo build exited with {status}"))
    }
}
