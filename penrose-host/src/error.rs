//! [`FileError`]: why a file was not read or written, naming the file. Each tier wraps it in
//! its own error type (`#[from]`), so that the path and the cause are told the same way
//! everywhere, and none writes its own `Io { path, source }`.

use std::path::{Path, PathBuf};

use thiserror::Error;

/// Why a file was not read or written.
#[derive(Debug, Error)]
pub enum FileError {
    /// The file system refused (no such file, no permission, an I/O error).
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The path is a symbolic link where one is never followed (a secret, a file read from
    /// another user's directory).
    #[error("{0} is a symbolic link (never followed here); name the file itself")]
    Symlink(PathBuf),
    /// A directory, a FIFO, a device: not a regular file.
    #[error("{0} is not a regular file")]
    NotAFile(PathBuf),
    /// A secret owned by a user other than the reader and root.
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
    /// A secret that group or others may access.
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
    /// A file that is written once (a secret, a key) is already there, and is never replaced.
    #[error("{0} already exists; it is never overwritten: move it away first if you mean to")]
    Exists(PathBuf),
}

impl FileError {
    /// The error-mapping closure for I/O on `path`: `.map_err(FileError::at(path))`.
    pub fn at(path: &Path) -> impl FnOnce(std::io::Error) -> FileError + '_ {
        move |source| FileError::Io {
            path: path.to_owned(),
            source,
        }
    }

    /// The file the error is about.
    pub fn path(&self) -> &Path {
        match self {
            FileError::Io { path, .. }
            | FileError::WrongOwner { path, .. }
            | FileError::TooOpen { path, .. }
            | FileError::TooLarge { path, .. } => path,
            FileError::Symlink(path) | FileError::NotAFile(path) | FileError::Exists(path) => path,
        }
    }

    /// Whether the file exists but is unsafe to use (link, not a file, owner, mode): the
    /// operator must fix or replace it, as opposed to an I/O error or a missing file.
    pub fn is_unsafe(&self) -> bool {
        matches!(
            self,
            FileError::Symlink(_)
                | FileError::NotAFile(_)
                | FileError::WrongOwner { .. }
                | FileError::TooOpen { .. }
        )
    }

    /// Whether the file is simply not there (as opposed to there and refused).
    pub fn is_missing(&self) -> bool {
        matches!(self, FileError::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound)
    }
}
