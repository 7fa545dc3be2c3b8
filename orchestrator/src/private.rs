//! Files and folders only their owner may read: the data directory (0700) and what Skein
//! keeps in it (0600): the database, tokens, keys.
//!
//! A process that writes them also sets its umask to 077 (the binary does, for `skein
//! server`, `skein up` and `skein agent`), so files made by libraries (sled's snapshots
//! and logs) are private too; these helpers say so explicitly and tighten what an older
//! version, or another umask, left open.
//!
//! Invariant: nothing here loosens a mode; it only takes group and other bits away.

use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

/// The mode of private folders.
pub const DIR_MODE: u32 = 0o700;
/// The mode of private files.
pub const FILE_MODE: u32 = 0o600;

/// The bits a private file or folder must not have.
const OPEN_BITS: u32 = 0o077;

/// Creates `dir` (and missing parents) with mode 0700; an existing `dir` that group or
/// others may enter is tightened to 0700, with a log line. Returns whether it was.
///
/// Errors: the IO error of creating or changing it.
pub fn private_dir(dir: &Path) -> io::Result<bool> {
    std::fs::DirBuilder::new().recursive(true).mode(DIR_MODE).create(dir)?;
    let mode = std::fs::metadata(dir)?.permissions().mode() & 0o7777;
    if mode & OPEN_BITS == 0 {
        return Ok(false);
    }
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode & !OPEN_BITS))?;
    tracing::warn!(
        dir = %dir.display(),
        was = format!("{mode:04o}"),
        now = format!("{:04o}", mode & !OPEN_BITS),
        "tightened the permissions of a private folder: other local users could read it"
    );
    Ok(true)
}

/// Writes `bytes` to `file` with mode 0600: to a temporary file beside it first, then
/// renamed over it, so a reader sees the old content or the new, never a part, and never
/// a moment with a wider mode.
///
/// Errors: the IO error of writing or renaming.
pub fn write_private(file: &Path, bytes: &[u8]) -> io::Result<()> {
    let mut name = file.file_name().unwrap_or_default().to_os_string();
    name.push(format!(".{}.new", std::process::id()));
    let temporary = file.with_file_name(name);
    let _ = std::fs::remove_file(&temporary);
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(FILE_MODE)
        .open(&temporary)
        .and_then(|mut out| {
            out.write_all(bytes)?;
            out.sync_all()
        })
        .and_then(|()| std::fs::rename(&temporary, file));
    if written.is_err() {
        let _ = std::fs::remove_file(&temporary);
    }
    written
}

/// Creates `file` with `bytes` and mode 0600, durably; never over an existing file (the
/// error is then `AlreadyExists`), so two creators cannot replace each other's content.
///
/// Errors: the IO error of creating or writing it.
pub fn create_private(file: &Path, bytes: &[u8]) -> io::Result<()> {
    let mut out = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(FILE_MODE)
        .open(file)?;
    out.write_all(bytes)?;
    out.sync_all()
}

/// Takes group and other bits away from everything under `dir` (files 0600, folders
/// 0700, `dir` included), without following symbolic links. Returns how many entries
/// were tightened.
///
/// Errors: the first IO error met.
pub fn tighten_tree(dir: &Path) -> io::Result<usize> {
    let mut tightened = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(path) = stack.pop() {
        let meta = std::fs::symlink_metadata(&path)?;
        if meta.file_type().is_symlink() {
            continue;
        }
        if meta.is_dir() {
            for entry in std::fs::read_dir(&path)? {
                stack.push(entry?.path());
            }
        }
        let mode = meta.permissions().mode() & 0o7777;
        if mode & OPEN_BITS != 0 {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode & !OPEN_BITS))?;
            tightened += 1;
        }
    }
    Ok(tightened)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(path: &Path) -> u32 {
        std::fs::symlink_metadata(path).unwrap().permissions().mode() & 0o7777
    }

    #[test]
    fn a_new_folder_is_private_and_an_open_one_is_tightened() {
        let root = tempfile::tempdir().unwrap();
        let fresh = root.path().join("a/b");
        assert!(!private_dir(&fresh).unwrap());
        assert_eq!(mode(&fresh), DIR_MODE);

        let open = root.path().join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert!(private_dir(&open).unwrap());
        assert_eq!(mode(&open), 0o700);
        assert!(!private_dir(&open).unwrap(), "a second call has nothing to do");
    }

    #[test]
    fn written_files_are_private_and_replace_the_old_content() {
        let root = tempfile::tempdir().unwrap();
        let file = root.path().join("key");
        std::fs::write(&file, "old").unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
        write_private(&file, b"new").unwrap();
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "new");
        assert_eq!(mode(&file), FILE_MODE);
        assert_eq!(
            std::fs::read_dir(root.path()).unwrap().count(),
            1,
            "no temporary file is left"
        );
    }

    #[test]
    fn a_tree_loses_its_group_and_other_bits_and_links_are_not_followed() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("db");
        std::fs::create_dir_all(dir.join("blobs")).unwrap();
        std::fs::write(dir.join("conf"), "x").unwrap();
        std::fs::write(dir.join("blobs/1"), "x").unwrap();
        let outside = root.path().join("outside");
        std::fs::write(&outside, "x").unwrap();
        std::fs::set_permissions(&outside, std::fs::Permissions::from_mode(0o644)).unwrap();
        std::os::unix::fs::symlink(&outside, dir.join("link")).unwrap();
        for path in [dir.join("conf"), dir.join("blobs/1")] {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        }
        for path in [&dir, &dir.join("blobs")] {
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        assert_eq!(tighten_tree(&dir).unwrap(), 4);
        assert_eq!(mode(&dir), 0o700);
        assert_eq!(mode(&dir.join("blobs")), 0o700);
        assert_eq!(mode(&dir.join("conf")), 0o600);
        assert_eq!(mode(&dir.join("blobs/1")), 0o600);
        assert_eq!(mode(&outside), 0o644, "a link's target is not the tree's");
    }
}
