//! Writes that a crash leaves whole or not at all: a temporary file in the same directory,
//! written and synced, renamed over the target, and the directory synced, so that the new name
//! is on disk before the caller acts on it (answers a request, deletes what it replaced).
//!
//! The temporary file is `.NAME.tmp` beside the target, opened without following a symbolic
//! link; a stale one (left by a crash) is replaced. A failed write removes it and leaves the
//! old file as it was.

use std::fs::OpenOptions;
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::error::FileError;

/// Who may read the file a write leaves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// Mode 0644: public keys, lists, reports, records anyone on the host may read.
    Public,
    /// Mode 0600 from the moment the temporary file exists: secrets, and what only the
    /// owner should see (spooled reports, the agent's tokens).
    Owner,
}

impl Access {
    fn mode(self) -> u32 {
        match self {
            Access::Public => 0o644,
            Access::Owner => 0o600,
        }
    }
}

/// Replaces `path` with `bytes`: readers, and a restart after a crash, see the old contents
/// or the new ones, and the new ones are durable when this returns. On failure the old file
/// is untouched.
pub fn replace(path: &Path, bytes: &[u8], access: Access) -> Result<(), FileError> {
    let temp = temp_path(path)?;
    let written = write_synced(&temp, bytes, access)
        .and_then(|()| std::fs::rename(&temp, path).map_err(FileError::at(path)))
        .and_then(|()| sync_dir(parent(path)));
    if written.is_err() {
        // Nothing to do if it is not there (or is not a file: then it is not ours).
        let _ = std::fs::remove_file(&temp);
    }
    written
}

/// Creates `path` holding `bytes`, once: never replacing anything there (`create_new`, which
/// also refuses a dangling symbolic link), with `access`'s mode from the start (a secret is
/// never readable by others, even for a moment), synced with its directory before it
/// returns. For what is written once and never changed: keys, shares, seeds.
pub fn create(path: &Path, bytes: &[u8], access: Access) -> Result<(), FileError> {
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(access.mode())
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .map_err(|source| match source.kind() {
            std::io::ErrorKind::AlreadyExists => FileError::Exists(path.to_owned()),
            _ => FileError::Io {
                path: path.to_owned(),
                source,
            },
        })?;
    file.write_all(bytes)
        .and_then(|()| file.sync_all())
        .map_err(FileError::at(path))?;
    sync_dir(parent(path))
}

/// Places a secret at `path` once: mode 0600 from the start, refusing to replace anything
/// there, durable when this returns (the temporary file is renamed only when whole, so a
/// crash never leaves a truncated secret under the real name).
pub fn place_secret(path: &Path, bytes: &[u8]) -> Result<(), FileError> {
    if path.symlink_metadata().is_ok() {
        return Err(FileError::Exists(path.to_owned()));
    }
    let temp = temp_path(path)?;
    // A temporary file left by a crash is ours and incomplete.
    let _ = std::fs::remove_file(&temp);
    let placed = crate::secret_file::create(&temp, bytes)
        .and_then(|()| rename_new(&temp, path))
        .and_then(|()| sync_dir(parent(path)));
    if placed.is_err() {
        let _ = std::fs::remove_file(&temp);
    }
    placed
}

/// Syncs a directory, so that names created, renamed or removed in it are on disk.
pub fn sync_dir(dir: &Path) -> Result<(), FileError> {
    OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_CLOEXEC)
        .open(dir)
        .and_then(|d| d.sync_all())
        .map_err(FileError::at(dir))
}

/// Whether a directory entry named `name` is a temporary file of [`replace`] or
/// [`place_secret`] (whole or not, never the file itself): a reader of the directory skips
/// it, and a repair removes it.
pub fn is_temp_name(name: &str) -> bool {
    name.starts_with('.') && name.ends_with(".tmp")
}

/// The directory a file is in (`.` for a bare name).
pub fn parent(path: &Path) -> &Path {
    match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    }
}

/// Renames `from` to `to` unless `to` exists (a link made, then the temporary name removed:
/// `link` fails on an existing target where `rename` would replace it).
fn rename_new(from: &Path, to: &Path) -> Result<(), FileError> {
    std::fs::hard_link(from, to).map_err(|source| match source.kind() {
        std::io::ErrorKind::AlreadyExists => FileError::Exists(to.to_owned()),
        _ => FileError::Io {
            path: to.to_owned(),
            source,
        },
    })?;
    std::fs::remove_file(from).map_err(FileError::at(from))
}

fn write_synced(path: &Path, bytes: &[u8], access: Access) -> Result<(), FileError> {
    let mut file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(access.mode())
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .map_err(FileError::at(path))?;
    // A stale temporary file keeps its old mode through `open`: set it.
    file.set_permissions(std::fs::Permissions::from_mode(access.mode()))
        .and_then(|()| file.write_all(bytes))
        .and_then(|()| file.sync_all())
        .map_err(FileError::at(path))
}

fn temp_path(path: &Path) -> Result<PathBuf, FileError> {
    let name = path.file_name().ok_or_else(|| {
        FileError::at(path)(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "no file name",
        ))
    })?;
    let mut temp = std::ffi::OsString::from(".");
    temp.push(name);
    temp.push(".tmp");
    Ok(parent(path).join(temp))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn mode(path: &Path) -> u32 {
        std::fs::metadata(path).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn a_failed_replace_leaves_the_old_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("record.json");
        replace(&path, b"one", Access::Public).unwrap();
        replace(&path, b"two", Access::Public).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"two");
        assert_eq!(mode(&path), 0o644);
        // A directory where the temporary file goes makes the write fail, even as root.
        std::fs::create_dir(dir.path().join(".record.json.tmp")).unwrap();
        assert!(replace(&path, b"three", Access::Public).is_err());
        assert_eq!(std::fs::read(&path).unwrap(), b"two");
    }

    #[test]
    fn a_stale_temporary_file_gets_the_owner_mode_before_the_secret_is_written() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokens");
        let stale = dir.path().join(".tokens.tmp");
        std::fs::write(&stale, b"half").unwrap();
        std::fs::set_permissions(&stale, std::fs::Permissions::from_mode(0o666)).unwrap();
        replace(&path, b"secret", Access::Owner).unwrap();
        assert_eq!(mode(&path), 0o600);
        assert_eq!(std::fs::read(&path).unwrap(), b"secret");
        assert!(!stale.exists());
        assert!(is_temp_name(".tokens.tmp"));
        assert!(!is_temp_name("tokens"));
    }

    #[test]
    fn a_link_where_the_temporary_file_goes_is_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim");
        std::fs::write(&victim, b"theirs").unwrap();
        std::os::unix::fs::symlink(&victim, dir.path().join(".out.tmp")).unwrap();
        assert!(replace(&dir.path().join("out"), b"mine", Access::Public).is_err());
        assert_eq!(std::fs::read(&victim).unwrap(), b"theirs");
    }

    #[test]
    fn secrets_are_placed_once_and_owner_only() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.share");
        place_secret(&path, b"secret").unwrap();
        assert_eq!(mode(&path), 0o600);
        assert!(matches!(
            place_secret(&path, b"other"),
            Err(FileError::Exists(_))
        ));
        assert_eq!(std::fs::read(&path).unwrap(), b"secret");
        assert!(!dir.path().join(".a.share.tmp").exists());
    }
}
