//! Owner-only secret files, read and created one way by every tier.
//!
//! The design server's private key, the aggregation server's token key ring and bundle
//! signing key, the issuer's master seed and the hosts' enrolment credentials, the agent's
//! credential and admission tokens: each is a small file that only its owner may read. They
//! are all read through [`read`], which
//!
//! - opens the path without following a symbolic link (`O_NOFOLLOW`: a link planted where a
//!   secret belongs is refused, not followed to whatever it names), and without blocking
//!   (`O_NONBLOCK`: a FIFO planted there cannot hang the reader);
//! - refuses anything but a regular file;
//! - refuses a file owned by anyone but the reading process's effective user or root (another
//!   user could have read it, or chosen its contents);
//! - refuses a file that group or others may read, write or execute (mode `& 0o077 != 0`): a
//!   secret that others could read may be exposed, and must be replaced rather than used;
//! - refuses a file larger than the caller's bound, before reading more than that bound.
//!
//! Every refusal is a [`FileError`] that names the file and says why; each tier wraps it and
//! parses the bytes itself. A secret is written by [`create`] (once, never replacing
//! anything) or by [`crate::durable::replace_secret`] (a secret the tier rewrites).

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;

use crate::effective_uid;
use crate::error::FileError;

/// Opens the secret file at `path` and checks it (the module's rules), without reading it.
/// The caller reads at most what it needs.
pub fn open(path: &Path) -> Result<File, FileError> {
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
        .map_err(|source| {
            if source.raw_os_error() == Some(libc::ELOOP) {
                FileError::Symlink(path.to_owned())
            } else {
                FileError::Io {
                    path: path.to_owned(),
                    source,
                }
            }
        })?;
    let meta = file.metadata().map_err(|source| FileError::Io {
        path: path.to_owned(),
        source,
    })?;
    if !meta.file_type().is_file() {
        return Err(FileError::NotAFile(path.to_owned()));
    }
    let reader = effective_uid();
    if meta.uid() != reader && meta.uid() != 0 {
        return Err(FileError::WrongOwner {
            path: path.to_owned(),
            owner: meta.uid(),
            reader,
        });
    }
    let mode = meta.mode() & 0o7777;
    if mode & 0o077 != 0 {
        return Err(FileError::TooOpen {
            path: path.to_owned(),
            mode,
        });
    }
    Ok(file)
}

/// Creates the secret file `path` holding `bytes`: mode 0600 from the start (never readable by
/// others, even for a moment), never replacing anything there (`create_new`, which also
/// refuses a dangling symbolic link), synced with its directory before it returns.
pub fn create(path: &Path, bytes: &[u8]) -> Result<(), FileError> {
    crate::durable::create(path, bytes, crate::durable::Access::Owner)
}

/// Reads the whole secret file at `path`, at most `limit` bytes (a larger file is refused,
/// whether it was larger when opened or grew while being read).
pub fn read(path: &Path, limit: u64) -> Result<Vec<u8>, FileError> {
    crate::bounded::read_open(open(path)?, path, limit)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;
    use std::path::PathBuf;

    fn secret(dir: &Path, name: &str, bytes: &[u8], mode: u32) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, bytes).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        path
    }

    #[test]
    fn an_owner_only_file_is_read() {
        let dir = tempfile::tempdir().unwrap();
        let path = secret(dir.path(), "key", b"secret", 0o600);
        assert_eq!(read(&path, 6).unwrap(), b"secret");
        let path = secret(dir.path(), "ro", b"x", 0o400);
        assert_eq!(read(&path, 64).unwrap(), b"x");
        let empty = secret(dir.path(), "empty", b"", 0o600);
        assert_eq!(read(&empty, 0).unwrap(), b"");
    }

    #[test]
    fn group_or_other_access_is_refused_naming_the_mode() {
        let dir = tempfile::tempdir().unwrap();
        for mode in [0o644, 0o640, 0o604, 0o620, 0o602, 0o610, 0o601, 0o660] {
            let path = secret(dir.path(), "key", b"secret", mode);
            let err = read(&path, 64).unwrap_err();
            assert!(
                matches!(&err, FileError::TooOpen { mode: m, .. } if *m == mode),
                "{mode:o}: {err}"
            );
            assert!(err.is_unsafe());
            assert!(err.to_string().contains(&format!("{mode:o}")), "{err}");
            assert_eq!(err.path(), path);
        }
    }

    #[test]
    fn links_directories_and_fifos_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let target = secret(dir.path(), "key", b"secret", 0o600);
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        assert!(matches!(read(&link, 64), Err(FileError::Symlink(_))));
        let dangling = dir.path().join("dangling");
        std::os::unix::fs::symlink(dir.path().join("nowhere"), &dangling).unwrap();
        assert!(matches!(read(&dangling, 64), Err(FileError::Symlink(_))));

        let sub = dir.path().join("sub");
        std::fs::create_dir(&sub).unwrap();
        std::fs::set_permissions(&sub, std::fs::Permissions::from_mode(0o700)).unwrap();
        assert!(matches!(read(&sub, 64), Err(FileError::NotAFile(_))));

        // A FIFO with no writer: opened without blocking, then refused.
        let fifo = dir.path().join("fifo");
        crate::test_support::mkfifo(&fifo);
        assert!(matches!(read(&fifo, 64), Err(FileError::NotAFile(_))));

        let missing = read(&dir.path().join("missing"), 64).unwrap_err();
        assert!(matches!(&missing, FileError::Io { source, .. }
            if source.kind() == std::io::ErrorKind::NotFound));
        assert!(!missing.is_unsafe());
    }

    #[test]
    fn a_secret_is_created_owner_only_and_never_over_another() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("seed");
        create(&path, b"one").unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        assert!(matches!(create(&path, b"two"), Err(FileError::Exists(_))));
        assert_eq!(read(&path, 64).unwrap(), b"one");
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(dir.path().join("nowhere"), &link).unwrap();
        assert!(matches!(create(&link, b"x"), Err(FileError::Exists(_))));
        assert!(!dir.path().join("nowhere").exists());
    }

    #[test]
    fn a_file_larger_than_the_bound_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = secret(dir.path(), "key", &[7; 65], 0o600);
        assert!(matches!(
            read(&path, 64),
            Err(FileError::TooLarge { limit: 64, .. })
        ));
        assert_eq!(read(&path, 65).unwrap().len(), 65);
    }

    /// Another user's file is refused even when its mode is right (root only: it needs
    /// `chown`). Root's own files are accepted by every reader.
    #[test]
    fn another_users_file_is_refused() {
        if effective_uid() != 0 {
            // Straight to stderr: libtest captures `eprintln!`, and CI counts these lines.
            use std::io::Write as _;
            let _ = writeln!(
                std::io::stderr(),
                "SKIPPED: chown to another user needs root"
            );
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let path = secret(dir.path(), "key", b"secret", 0o600);
        std::os::unix::fs::chown(&path, Some(4242), Some(4242)).unwrap();
        let err = read(&path, 64).unwrap_err();
        assert!(
            matches!(
                err,
                FileError::WrongOwner {
                    owner: 4242,
                    reader: 0,
                    ..
                }
            ),
            "{err}"
        );
        std::os::unix::fs::chown(&path, Some(0), Some(0)).unwrap();
        assert_eq!(read(&path, 64).unwrap(), b"secret");
    }
}
