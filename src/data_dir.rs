//! Skein's data directory and the private files in it: where the directory is, the
//! umask that keeps what this process creates private, and the secret (token) files.

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use skein_orchestrator::agents::Secret;

/// Makes what this process creates private to its user (umask 077): the data directory's
/// files, sled's own files, logs, and what engines started by an agent write (they
/// inherit it). Returns the mask it replaces.
pub fn private_umask() -> u32 {
    use rustix::fs::Mode;
    rustix::process::umask(Mode::from_raw_mode(0o077)).as_raw_mode()
}

/// Skein's data directory: `--data-dir`, else `$SKEIN_DATA_DIR`, else
/// `$XDG_DATA_HOME/skein`, else `~/.local/share/skein`.
pub fn data_dir(flag: Option<&Path>) -> anyhow::Result<PathBuf> {
    if let Some(dir) = flag {
        return Ok(dir.to_owned());
    }
    let env = |key: &str| std::env::var_os(key).filter(|v| !v.is_empty()).map(PathBuf::from);
    if let Some(dir) = env("SKEIN_DATA_DIR") {
        return Ok(dir);
    }
    if let Some(dir) = env("XDG_DATA_HOME") {
        return Ok(dir.join("skein"));
    }
    match env("HOME") {
        Some(home) => Ok(home.join(".local/share/skein")),
        None => bail!("no data directory: set --data-dir, SKEIN_DATA_DIR or HOME"),
    }
}

/// The secret in `file`, created (random, mode 0600) when absent.
pub fn load_or_create_secret(file: &Path) -> anyhow::Result<Secret> {
    match std::fs::read_to_string(file) {
        Ok(text) => {
            Secret::new(text).with_context(|| format!("{} is empty; delete it to get a new token", file.display()))
        }
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
            if let Some(dir) = file.parent() {
                std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
            }
            let secret = Secret::generate().context("cannot read random bytes for a token")?;
            write_private(file, secret.expose())?;
            Ok(secret)
        }
        Err(error) => Err(error).with_context(|| format!("cannot read {}", file.display())),
    }
}

/// Writes `text` to `file` readable by its owner only.
fn write_private(file: &Path, text: &str) -> anyhow::Result<()> {
    skein_orchestrator::private::create_private(file, format!("{text}\n").as_bytes())
        .with_context(|| format!("cannot create {}", file.display()))
}

/// A secret from a flag, else a file.
pub fn secret_from(flag: Option<&str>, file: &Path) -> anyhow::Result<Secret> {
    match flag.and_then(Secret::new) {
        Some(secret) => Ok(secret),
        None => load_or_create_secret(file),
    }
}
