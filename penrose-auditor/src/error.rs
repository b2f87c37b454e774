//! What can go wrong in the auditor's commands, typed: one error for the crate, each variant
//! with what an operator needs to act on it. Refusals of a request from the design server are
//! not errors: they are answers (`penrose_core::audit::AuditRefusal`).

use std::path::PathBuf;

use penrose_core::paillier::{KeyId, PaillierError};
use penrose_core::release::PolicyError;
use penrose_host::FileError;

/// Why an auditor command failed.
#[derive(Debug, thiserror::Error)]
pub enum AuditorError {
    /// A file was not read or written.
    #[error("{0}")]
    File(FileError),
    /// A share file is unsafe to use (a symbolic link, another user's, readable by group or
    /// others) or unreadable: [`penrose_host::secret_file::read`] says which. A share that others
    /// may have read must be replaced by a new dealing, not used.
    #[error("key share: {0}")]
    Secret(FileError),
    /// A key file given to `init` or `add-share` that is not what it claims (wrong kind, another
    /// key's share or verification key, damaged).
    #[error("{path} is not a valid key file for this key: {source}")]
    Key {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        source: PaillierError,
    },
    /// A valid key, but smaller than every tier accepts.
    #[error("{path}: {source}")]
    WeakKey {
        /// The public key file.
        path: PathBuf,
        /// The floor it fails.
        source: PolicyError,
    },
    /// The design server's share: the auditor must never hold both.
    #[error(
        "{0} is not the release auditor's share (is it the design server's?); the auditor \
         holds only its own, or the two shares would be on one machine"
    )]
    NotAuditorShare(PathBuf),
    /// A verification key of another dealing than the share's.
    #[error("{0} is not the verification key of the share's dealing")]
    VerificationMismatch(PathBuf),
    /// `add-share` of a key the auditor already holds a share of.
    #[error("the auditor already holds a share of key {0}; nothing was changed")]
    KeyHeld(KeyId),
    /// Not the aggregation server's bundle-signing public key.
    #[error(
        "{0} does not hold an ed25519 public key: expected 64 hex digits, as the aggregation \
         server writes the .pub file beside its signing key"
    )]
    AggregatorKey(PathBuf),
    /// A threshold or cap under the floors every tier enforces.
    #[error("{0}")]
    Policy(#[from] PolicyError),
    /// `init` on a path that already holds something.
    #[error("{0} already exists and is not an empty directory; nothing was changed")]
    Exists(PathBuf),
    /// A data directory `init` did not make.
    #[error(
        "{0} is not a release auditor's data directory; create one with `penrose-auditor init`"
    )]
    NotInitialised(PathBuf),
    /// Another process (a serving auditor, another command) holds the data directory.
    #[error(
        "{0} is in use by another penrose-auditor process (serve?); stop it first: the data \
         directory is changed by one process at a time"
    )]
    Busy(PathBuf),
    /// A file of the data directory that does not read as the auditor wrote it.
    #[error("{path}: damaged: {what}")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        what: String,
    },
    /// The transport refused to start.
    #[error("transport: {0}")]
    Transport(#[from] penrose_transport::TransportError),
    /// The TLS identity could not be made or read.
    #[error("TLS identity: {0}")]
    Identity(#[from] penrose_transport::IdentityError),
}

// Not `#[from]`: the message already shows the inner error, which would otherwise also be the
// source and print twice in a chain.
impl From<FileError> for AuditorError {
    fn from(e: FileError) -> Self {
        AuditorError::File(e)
    }
}

impl AuditorError {
    /// Whether the command refused what it was given (a share that is not the auditor's, a
    /// key of another dealing, a weak key, a threshold under the floor, a data directory that
    /// exists, a key already held), as opposed to a failure: exit code 3.
    pub fn is_refusal(&self) -> bool {
        matches!(
            self,
            AuditorError::Key { .. }
                | AuditorError::WeakKey { .. }
                | AuditorError::NotAuditorShare(_)
                | AuditorError::VerificationMismatch(_)
                | AuditorError::KeyHeld(_)
                | AuditorError::AggregatorKey(_)
                | AuditorError::Policy(_)
                | AuditorError::Exists(_)
        )
    }

    /// Whether another process holds the data directory: exit code 4.
    pub fn is_busy(&self) -> bool {
        matches!(self, AuditorError::Busy(_))
    }

    /// An I/O error on `path`.
    pub fn io(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> AuditorError {
        let path = path.into();
        move |source| AuditorError::File(penrose_host::FileError::Io { path, source })
    }

    /// A damaged file of the data directory.
    pub fn corrupt(path: impl Into<PathBuf>, what: impl ToString) -> AuditorError {
        AuditorError::Corrupt {
            path: path.into(),
            what: what.to_string(),
        }
    }
}
