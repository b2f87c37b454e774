//! Writes that a crash leaves whole or not at all: a temporary file in the same directory,
//! synced, renamed over the target, and the directory synced, so that the new name is on disk
//! before the caller acts on it (the auditor answers only after its record is).

use std::fs::OpenOptions;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use crate::error::AuditorError;

/// Replaces `path` with `bytes` (a new file gets `mode`): readers, and a restart after a
/// crash, see the old contents or the new ones, and the new ones are durable when this
/// returns. On failure the old file is untouched.
pub fn replace(path: &Path, bytes: &[u8], mode: u32) -> Result<(), AuditorError> {
    let temp = temp_path(path)?;
    let written = write_synced(&temp, bytes, mode)
        .and_then(|()| std::fs::rename(&temp, path).map_err(AuditorError::io(path)))
        .and_then(|()| sync_dir(parent(path)));
    if written.is_err() {
        // Nothing to do if it is not there (or is not a file: then it is not ours).
        let _ = std::fs::remove_file(&temp);
    }
    written
}

/// Places a secret file at `path` (mode 0600, through `penrose_secret_file::create`, so never
/// readable by others even for a moment), durably, refusing to replace one that is there.
pub fn place_secret(path: &Path, bytes: &[u8]) -> Result<(), AuditorError> {
    if path.exists() {
        return Err(AuditorError::io(path)(std::io::Error::new(
            std::io::ErrorKind::AlreadyExists,
            "a secret is never overwritten",
        )));
    }
    let temp = temp_path(path)?;
    // A temporary file left by a crash is ours and incomplete.
    let _ = std::fs::remove_file(&temp);
    let placed = penrose_secret_file::create(&temp, bytes)
        .map_err(AuditorError::from)
        .and_then(|()| std::fs::rename(&temp, path).map_err(AuditorError::io(path)))
        .and_then(|()| sync_dir(parent(path)));
    if placed.is_err() {
        let _ = std::fs::remove_file(&temp);
    }
    placed
}

/// Syncs a directory, so that names created, renamed or removed in it are on disk.
pub fn sync_dir(dir: &Path) -> Result<(), AuditorError> {
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(AuditorError::io(dir))
}

fn write_synced(path: &Path, bytes: &[u8], mode: u32) -> Result<(), AuditorError> {
    let mut file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .open(path)
        .map_err(AuditorError::io(path))?;
    file.write_all(bytes)
        .and_then(|()| file.sync_all())
        .map_err(AuditorError::io(path))
}

fn temp_path(path: &Path) -> Result<PathBuf, AuditorError> {
    let name = path.file_name().ok_or_else(|| {
        AuditorError::io(path)(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "no file name",
        ))
    })?;
    let mut temp = std::ffi::OsString::from(".");
    temp.push(name);
    temp.push(".tmp");
    Ok(parent(path).join(temp))
}

fn parent(path: &Path) -> &Path {
    match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_replace_leaves_the_old_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("record.json");
        replace(&path, b"one", 0o644).unwrap();
        replace(&path, b"two", 0o644).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"two");
        // A directory where the temporary file goes makes the write fail, even as root.
        std::fs::create_dir(dir.path().join(".record.json.tmp")).unwrap();
        assert!(replace(&path, b"three", 0o644).is_err());
        assert_eq!(std::fs::read(&path).unwrap(), b"two");
    }

    #[test]
    fn secrets_are_placed_once_and_owner_only() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.share");
        place_secret(&path, b"secret").unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        assert!(place_secret(&path, b"other").is_err());
        assert_eq!(std::fs::read(&path).unwrap(), b"secret");
    }
}
