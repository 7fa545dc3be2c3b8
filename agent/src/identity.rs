//! The node's identity: a credential of 32 random bytes the agent makes on its first
//! start, keeps in its state directory (one file per node name, mode 0600) and presents
//! on every registration and stream. The orchestrator ties the node name to it at the
//! first registration; an agent without it cannot take the name over.
//!
//! The agent makes the credential (rather than the orchestrator issuing one) and saves
//! it before it is first sent, so an answer lost on the way cannot leave the node
//! locked out of its own name.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};

/// Length of a credential in hex characters (32 bytes).
const HEX_CHARS: usize = 64;

/// A node credential. Its `Debug` never shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct NodeCredential(String);

impl std::fmt::Debug for NodeCredential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("NodeCredential(…)")
    }
}

/// Why the credential could not be read or kept.
#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    /// The state directory or the file could not be read or written.
    #[error(
        "cannot keep the node credential in {}; help: give a writable directory with --state-dir (SKEIN_AGENT_STATE_DIR)",
        .path.display()
    )]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The file holds something else than a credential.
    #[error(
        "{} does not hold a node credential ({HEX_CHARS} lowercase hex characters); help: restore it from a backup, or delete it and have an admin free the node name with `skein node reset NAME`",
        .path.display()
    )]
    Damaged {
        /// The file.
        path: PathBuf,
    },
}

impl NodeCredential {
    /// A fresh credential: 32 bytes from the operating system, hex.
    ///
    /// Errors: [`IdentityError::Io`] when `/dev/urandom` cannot be read.
    pub fn generate() -> Result<NodeCredential, IdentityError> {
        let random = Path::new("/dev/urandom");
        let mut bytes = [0u8; 32];
        std::fs::File::open(random)
            .and_then(|mut f| f.read_exact(&mut bytes))
            .map_err(|source| IdentityError::Io {
                path: random.to_owned(),
                source,
            })?;
        Ok(NodeCredential(bytes.iter().map(|b| format!("{b:02x}")).collect()))
    }

    /// The credential of node `node` kept in `dir`, made and saved (mode 0600, the
    /// directory 0700) when there is none yet.
    ///
    /// Errors: [`IdentityError::Io`], [`IdentityError::Damaged`].
    pub fn load_or_create(dir: &Path, node: &str) -> Result<NodeCredential, IdentityError> {
        let path = credential_path(dir, node);
        let io = |path: &Path| {
            let path = path.to_owned();
            move |source| IdentityError::Io { path, source }
        };
        match std::fs::read_to_string(&path) {
            Ok(text) => {
                let text = text.trim();
                let ok =
                    text.len() == HEX_CHARS && text.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
                return if ok {
                    Ok(NodeCredential(text.to_owned()))
                } else {
                    Err(IdentityError::Damaged { path })
                };
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io(&path)(e)),
        }
        create_private_dir(dir).map_err(io(dir))?;
        let credential = NodeCredential::generate()?;
        // Written whole to a file of this process's own, then linked into place: a crash
        // leaves no file or a whole one, never half a credential, and of two agents
        // starting at once for one node (they share the directory) the first link wins
        // and the other reads the winner's.
        let temporary = dir.join(format!(
            ".{}.{}.{}",
            path.file_name().and_then(|n| n.to_str()).unwrap_or("credential"),
            std::process::id(),
            &credential.0[..8]
        ));
        let written = private_file(&temporary)
            .and_then(|mut file| {
                file.write_all(format!("{}\n", credential.0).as_bytes())?;
                file.sync_all()
            })
            .and_then(|()| std::fs::hard_link(&temporary, &path));
        let _ = std::fs::remove_file(&temporary);
        match written {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => return Self::load_or_create(dir, node),
            Err(e) => return Err(io(&path)(e)),
        }
        if let Ok(dir) = std::fs::File::open(dir) {
            let _ = dir.sync_all();
        }
        tracing::info!(path = %path.display(), "made this node's credential");
        Ok(credential)
    }

    /// The text, for sending it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

/// Longest encoded node name kept whole in a file name (file systems allow 255 bytes).
const MAX_FILE_STEM: usize = 200;

/// Where the credential of node `node` lives in `dir`: `<dir>/<node>.credential`, the
/// name's characters other than letters, digits, `-`, `_` and `.` (and a leading `.`)
/// written `%XX`, so any node name is one file name; a name longer than that allows is
/// cut and followed by a hash of the whole name.
pub fn credential_path(dir: &Path, node: &str) -> PathBuf {
    let mut file = String::new();
    for (i, byte) in node.bytes().enumerate() {
        let plain = byte.is_ascii_alphanumeric() || byte == b'-' || byte == b'_' || (byte == b'.' && i > 0);
        if plain {
            file.push(char::from(byte));
        } else {
            file.push_str(&format!("%{byte:02X}"));
        }
    }
    if file.len() > MAX_FILE_STEM {
        // FNV-1a of the whole name: only names of one machine's agents share the
        // directory, so this tells apart names that differ after the cut.
        let hash = node.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        });
        let mut cut = MAX_FILE_STEM - 17;
        while !file.is_char_boundary(cut) {
            cut -= 1;
        }
        file.truncate(cut);
        file.push_str(&format!("~{hash:016x}"));
    }
    file.push_str(".credential");
    dir.join(file)
}

#[cfg(unix)]
fn create_private_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir)
}

#[cfg(not(unix))]
fn create_private_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)
}

#[cfg(unix)]
fn private_file(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
}

#[cfg(not(unix))]
fn private_file(path: &Path) -> std::io::Result<std::fs::File> {
    std::fs::OpenOptions::new().write(true).create_new(true).open(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_credential_is_made_once_kept_private_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("agent");
        let first = NodeCredential::load_or_create(&state, "rtx-1").unwrap();
        assert_eq!(first.expose().len(), HEX_CHARS);
        assert_eq!(NodeCredential::load_or_create(&state, "rtx-1").unwrap(), first);
        assert_ne!(NodeCredential::load_or_create(&state, "rtx-2").unwrap(), first);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode(&credential_path(&state, "rtx-1")), 0o600);
            assert_eq!(mode(&state), 0o700);
        }
        assert!(!format!("{first:?}").contains(first.expose()));

        std::fs::write(credential_path(&state, "rtx-3"), "not a credential").unwrap();
        let damaged = NodeCredential::load_or_create(&state, "rtx-3").unwrap_err();
        assert!(damaged.to_string().contains("skein node reset"), "{damaged}");
    }

    #[test]
    fn agents_starting_at_once_for_one_node_end_up_with_one_credential() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().to_owned();
        let made: Vec<NodeCredential> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..8)
                .map(|_| scope.spawn(|| NodeCredential::load_or_create(&state, "rtx-1").unwrap()))
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert!(made.iter().all(|c| *c == made[0]));
        assert_eq!(
            std::fs::read_dir(&state).unwrap().count(),
            1,
            "temporary files were left"
        );
    }

    #[test]
    fn every_node_name_is_one_file_in_the_directory() {
        let dir = Path::new("/state");
        assert_eq!(credential_path(dir, "rtx-1.lab"), dir.join("rtx-1.lab.credential"));
        assert_eq!(credential_path(dir, "../x"), dir.join("%2E.%2Fx.credential"));
        assert_eq!(credential_path(dir, "a/b"), dir.join("a%2Fb.credential"));
        let long = |last: char| format!("{}{last}", "n".repeat(252));
        let (a, b) = (credential_path(dir, &long('a')), credential_path(dir, &long('b')));
        assert_ne!(a, b);
        assert!(a.file_name().unwrap().len() <= 255, "{a:?}");
    }
}
