//! Workflow files on disk → [`skein_dsl::Parsed`].
//!
//! The DSL is a pure core that takes text; this module is the thin edge that
//! reads the file, refusing oversized or non-UTF-8 input with an error that
//! names the file.

use std::io::Read;
use std::path::{Path, PathBuf};

use skein_dsl::{MAX_FILE_BYTES, Parsed, SourceKind};

/// Why a workflow file could not be read (its content is judged by the
/// diagnostics of [`Parsed`], not here).
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The file could not be opened or read.
    #[error("cannot read workflow file {}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The file is not UTF-8 text.
    #[error("workflow file {} is not UTF-8 text (byte {valid_up_to} is invalid)", path.display())]
    NotUtf8 {
        /// The file.
        path: PathBuf,
        /// Length of the valid prefix.
        valid_up_to: usize,
    },
    /// The file is larger than any workflow.
    #[error("workflow file {} is larger than {max} bytes", path.display())]
    TooLarge {
        /// The file.
        path: PathBuf,
        /// The limit.
        max: usize,
    },
    /// The extension names no workflow language.
    #[error("workflow file {} must end in .yaml, .yml or .rhai", path.display())]
    UnknownKind {
        /// The file.
        path: PathBuf,
    },
}

/// Read and validate the workflow file at `path`. The language follows the
/// extension: `.yaml`/`.yml` or `.rhai`.
pub fn load(path: &Path) -> Result<Parsed, LoadError> {
    let name = path.display().to_string();
    let kind = SourceKind::from_name(&name).ok_or_else(|| LoadError::UnknownKind { path: path.to_owned() })?;
    let io = |source| LoadError::Io {
        path: path.to_owned(),
        source,
    };
    let file = std::fs::File::open(path).map_err(io)?;
    // Read one byte past the limit to tell "exactly at the limit" from "over".
    let mut bytes = Vec::new();
    file.take(MAX_FILE_BYTES as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(io)?;
    if bytes.len() > MAX_FILE_BYTES {
        return Err(LoadError::TooLarge {
            path: path.to_owned(),
            max: MAX_FILE_BYTES,
        });
    }
    let text = String::from_utf8(bytes).map_err(|e| LoadError::NotUtf8 {
        path: path.to_owned(),
        valid_up_to: e.utf8_error().valid_up_to(),
    })?;
    Ok(skein_dsl::parse_as(&name, &text, kind))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_valid_and_refuses_unreadable_files() {
        let dir = tempfile::tempdir().expect("tempdir");
        let good = dir.path().join("w.yaml");
        std::fs::write(&good, "name: w\nagents:\n  a: { model: x/y }\n").expect("write");
        assert!(load(&good).expect("loads").is_valid());

        let binary = dir.path().join("b.yaml");
        std::fs::write(&binary, [b'n', 0xff, 0xfe]).expect("write");
        assert!(matches!(load(&binary), Err(LoadError::NotUtf8 { valid_up_to: 1, .. })));

        let other = dir.path().join("w.json");
        assert!(matches!(load(&other), Err(LoadError::UnknownKind { .. })));
        assert!(matches!(
            load(&dir.path().join("missing.yaml")),
            Err(LoadError::Io { .. })
        ));
    }
}
