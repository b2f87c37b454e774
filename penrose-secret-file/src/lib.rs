//! Owner-only secret files, read one way by every tier.
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
//! Every refusal is a [`SecretFileError`] that names the file and says why; each tier wraps
//! it in its own error type and parses the bytes itself. Each tier writes its own format;
//! a secret written once (a signing key) goes through [`create`], the others are created
//! with mode 0600 and `create_new` or a rename.
//!
//! No `penrose-core` here: the core does no I/O, and the design server depends on nothing
//! else that every tier shares (docs/architecture.md, "Crates").

use std::fs::{File, OpenOptions};
use std::io::Read;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use thiserror::Error;

/// Why a secret file was not read.
#[derive(Debug, Error)]
pub enum SecretFileError {
    /// The file system refused (no such file, no permission, an I/O error).
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The path is a symbolic link, which is never followed.
    #[error("{0} is a symbolic link (never followed for a secret); name the file itself")]
    Symlink(PathBuf),
    /// A directory, a FIFO, a device: not a regular file.
    #[error("{0} is not a regular file")]
    NotAFile(PathBuf),
    /// Owned by a user other than the reader and root.
    #[error(
        "{path} is owned by uid {owner}, not by this process's user (uid {reader}) or root; \
         another user could have read it or chosen what it holds: run as its owner, or \
         `chown` it to the user that reads it"
    )]
    WrongOwner {
        /// The file.
        path: PathBuf,
        /// Its owner.
        owner: u32,
        /// The reading process's effective user id.
        reader: u32,
    },
    /// Group or others may access it.
    #[error(
        "{path} is accessible to group or others (mode {mode:o}); the secret in it may be \
         exposed: replace it, or `chmod 600` it only if you are sure nobody else read it"
    )]
    TooOpen {
        /// The file.
        path: PathBuf,
        /// Its permission bits (`& 0o7777`).
        mode: u32,
    },
    /// Larger than the caller's bound.
    #[error("{path} holds more than {limit} bytes, more than such a file ever does")]
    TooLarge {
        /// The file.
        path: PathBuf,
        /// The bound.
        limit: u64,
    },
}

impl SecretFileError {
    /// The file the error is about.
    pub fn path(&self) -> &Path {
        match self {
            SecretFileError::Io { path, .. }
            | SecretFileError::WrongOwner { path, .. }
            | SecretFileError::TooOpen { path, .. }
            | SecretFileError::TooLarge { path, .. } => path,
            SecretFileError::Symlink(path) | SecretFileError::NotAFile(path) => path,
        }
    }

    /// Whether the file exists but is unsafe to use (link, not a file, owner, mode): the
    /// operator must fix or replace it, as opposed to an I/O error or a missing file.
    pub fn is_unsafe(&self) -> bool {
        !matches!(
            self,
            SecretFileError::Io { .. } | SecretFileError::TooLarge { .. }
        )
    }
}

/// This process's effective user id.
#[allow(unsafe_code)]
pub fn effective_uid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// Opens the secret file at `path` and checks it (the module's rules), without reading it.
/// The caller reads at most what it needs.
pub fn open(path: &Path) -> Result<File, SecretFileError> {
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
        .map_err(|source| {
            if source.raw_os_error() == Some(libc::ELOOP) {
                SecretFileError::Symlink(path.to_owned())
            } else {
                SecretFileError::Io {
                    path: path.to_owned(),
                    source,
                }
            }
        })?;
    let meta = file.metadata().map_err(|source| SecretFileError::Io {
        path: path.to_owned(),
        source,
    })?;
    if !meta.file_type().is_file() {
        return Err(SecretFileError::NotAFile(path.to_owned()));
    }
    let reader = effective_uid();
    if meta.uid() != reader && meta.uid() != 0 {
        return Err(SecretFileError::WrongOwner {
            path: path.to_owned(),
            owner: meta.uid(),
            reader,
        });
    }
    let mode = meta.mode() & 0o7777;
    if mode & 0o077 != 0 {
        return Err(SecretFileError::TooOpen {
            path: path.to_owned(),
            mode,
        });
    }
    Ok(file)
}

/// Creates the secret file `path` holding `bytes`: mode 0600, never replacing anything there
/// (`create_new`), without following a symbolic link, synced before it returns.
pub fn create(path: &Path, bytes: &[u8]) -> Result<(), SecretFileError> {
    let io = |source| SecretFileError::Io {
        path: path.to_owned(),
        source,
    };
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .map_err(io)?;
    std::io::Write::write_all(&mut file, bytes).map_err(io)?;
    file.sync_all().map_err(io)
}

/// Reads the whole secret file at `path`, at most `limit` bytes (a larger file is refused,
/// whether it was larger when opened or grew while being read).
pub fn read(path: &Path, limit: u64) -> Result<Vec<u8>, SecretFileError> {
    let file = open(path)?;
    let too_large = || SecretFileError::TooLarge {
        path: path.to_owned(),
        limit,
    };
    let len = file
        .metadata()
        .map_err(|source| SecretFileError::Io {
            path: path.to_owned(),
            source,
        })?
        .len();
    if len > limit {
        return Err(too_large());
    }
    let mut bytes = Vec::with_capacity(usize::try_from(len).unwrap_or(0));
    file.take(limit.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(|source| SecretFileError::Io {
            path: path.to_owned(),
            source,
        })?;
    if bytes.len() as u64 > limit {
        return Err(too_large());
    }
    Ok(bytes)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

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
                matches!(&err, SecretFileError::TooOpen { mode: m, .. } if *m == mode),
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
        assert!(matches!(read(&link, 64), Err(SecretFileError::Symlink(_))));
        let dangling = dir.path().join("dangling");
        std::os::unix::fs::symlink(dir.path().join("nowhere"), &dangling).unwrap();
        assert!(matches!(
            read(&dangling, 64),
            Err(SecretFileError::Symlink(_))
        ));

        let sub = dir.path().join("sub");
        std::fs::create_dir(&sub).unwrap();
        std::fs::set_permissions(&sub, std::fs::Permissions::from_mode(0o700)).unwrap();
        assert!(matches!(read(&sub, 64), Err(SecretFileError::NotAFile(_))));

        // A FIFO with no writer: opened without blocking, then refused.
        let fifo = dir.path().join("fifo");
        let name = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
        #[allow(unsafe_code)]
        // SAFETY: `name` is a NUL-terminated path that outlives the call.
        let made = unsafe { libc::mkfifo(name.as_ptr(), 0o600) };
        assert_eq!(made, 0);
        assert!(matches!(read(&fifo, 64), Err(SecretFileError::NotAFile(_))));

        let missing = read(&dir.path().join("missing"), 64).unwrap_err();
        assert!(matches!(&missing, SecretFileError::Io { source, .. }
            if source.kind() == std::io::ErrorKind::NotFound));
        assert!(!missing.is_unsafe());
    }

    #[test]
    fn a_file_larger_than_the_bound_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = secret(dir.path(), "key", &[7; 65], 0o600);
        assert!(matches!(
            read(&path, 64),
            Err(SecretFileError::TooLarge { limit: 64, .. })
        ));
        assert_eq!(read(&path, 65).unwrap().len(), 65);
    }

    /// Another user's file is refused even when its mode is right (root only: it needs
    /// `chown`). Root's own files are accepted by every reader.
    #[test]
    fn another_users_file_is_refused() {
        if effective_uid() != 0 {
            eprintln!("SKIPPED: chown to another user needs root");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let path = secret(dir.path(), "key", b"secret", 0o600);
        std::os::unix::fs::chown(&path, Some(4242), Some(4242)).unwrap();
        let err = read(&path, 64).unwrap_err();
        assert!(
            matches!(
                err,
                SecretFileError::WrongOwner {
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
