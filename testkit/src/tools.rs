//! The real programs and files the tests run against, prepared by the project's own
//! scripts (`tests/engines/*.sh`: built or installed once per machine, cached outside
//! the clone). A script that fails fails the test that needs it: nothing is skipped.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The workspace's root (where `tests/engines/` is).
fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map_or_else(|| PathBuf::from("."), Path::to_path_buf)
}

/// Runs one of `tests/engines/*.sh` and returns the path it prints last; panics with
/// its output when it fails or prints a path that does not exist.
pub fn prepared(script: &str) -> PathBuf {
    let path = workspace().join("tests/engines").join(script);
    let output = Command::new("bash")
        .arg(&path)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", path.display()));
    assert!(
        output.status.success(),
        "{} failed ({}):\n{}",
        path.display(),
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    let printed = String::from_utf8_lossy(&output.stdout).trim().to_owned();
    let found = PathBuf::from(printed.lines().last().unwrap_or_default().trim());
    assert!(
        found.exists(),
        "{} printed `{printed}`, which does not exist",
        path.display()
    );
    found
}

/// The folder holding the real CPU `llama-server` and `ggml-rpc-server` (built from
/// source on first use: minutes).
pub fn llama_cpp_bin() -> PathBuf {
    prepared("llama-cpp.sh")
}

/// The python of the virtual environment with the pinned vLLM, `transformers` and
/// `tokenizers` (installed by `tests/engines/vllm.sh` on first use: minutes).
pub fn vllm_python() -> PathBuf {
    prepared("vllm.sh")
}

/// The pinned Ray's `ray` program (installed by `tests/engines/ray.sh` on first use);
/// its venv's `python` is beside it.
pub fn ray_program() -> PathBuf {
    prepared("ray.sh")
}
