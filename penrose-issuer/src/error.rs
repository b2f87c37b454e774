//! What can go wrong in the issuer, typed: one error for the crate, each variant with what an
//! operator needs to act on it.

use std::path::PathBuf;

use penrose_core::tokens::{CredentialFileError, TokenError};

/// Why an issuer operation failed.
#[derive(Debug, thiserror::Error)]
pub enum IssuerError {
    /// RocksDB refused.
    #[error("store: {0}")]
    Store(rocksdb::Error),
    /// Another process holds the store (RocksDB's lock).
    #[error(
        "{0} is open in another process (an issuer serving this state directory?); admin \
         commands reach a running issuer through its control socket"
    )]
    Busy(PathBuf),
    /// A column family is missing from an opened store.
    #[error("store: column family {0} missing")]
    MissingTable(&'static str),
    /// The state directory holds no store yet.
    #[error("{0} holds no issuer store; create one with `penrose-issuer init --state DIR`")]
    NotInitialised(PathBuf),
    /// `init` on a state directory that already has a seed or a store.
    #[error("{0} is already initialised (it has a seed or a store); nothing was changed")]
    AlreadyInitialised(PathBuf),
    /// A store written by another format version.
    #[error(
        "{path} is an issuer store of format {found}; this build reads format {expected} only \
         (run the build that wrote it, or start a new state directory and enrol again)"
    )]
    Format {
        /// The store.
        path: PathBuf,
        /// The version found (0 when the store has none).
        found: u32,
        /// The version this build reads.
        expected: u32,
    },
    /// A stored row that does not decode: the store is damaged or not an issuer's.
    #[error("store: damaged {table} row: {what}")]
    Corrupt {
        /// The table.
        table: &'static str,
        /// What is wrong.
        what: &'static str,
    },
    /// The seed file is not the one the store was created with.
    #[error(
        "{0} is not the seed this store was created with: its keys would not match the tokens \
         already issued or the key rings already exported"
    )]
    SeedMismatch(PathBuf),
    /// The seed file is unsafe to use (a symbolic link, not a regular file, another user's,
    /// accessible to group or others) or unreadable: [`penrose_host::secret_file::read`] says which.
    /// A seed that may have been exposed is replaced by starting a new issuer (new seed, new
    /// key set, enrol again).
    #[error("master seed: {0}")]
    Seed(penrose_host::FileError),
    /// The seed file does not hold exactly 32 bytes.
    #[error("{path} holds {len} bytes; a master seed is exactly 32")]
    SeedLength {
        /// The file.
        path: PathBuf,
        /// Its length.
        len: u64,
    },
    /// A file was not read or written.
    #[error("{0}")]
    File(penrose_host::FileError),
    /// A secret file that already exists is never overwritten.
    #[error("{0} already exists; move it away first (secrets are never overwritten)")]
    Exists(PathBuf),
    /// A credential file that does not read.
    #[error("{path}: {source}")]
    CredentialFile {
        /// The file.
        path: PathBuf,
        /// Why.
        source: CredentialFileError,
    },
    /// The token core refused (deriving keys, building a key set or ring).
    #[error("tokens: {0}")]
    Token(#[from] TokenError),
    /// No enrolled credential matches an id given to `revoke`.
    #[error("no enrolled credential has the id {0}")]
    UnknownId(String),
    /// An id prefix that matches several credentials.
    #[error("the id {0} matches several credentials; give more of it")]
    AmbiguousId(String),
    /// Text that is not a credential id (16 to 64 hex digits).
    #[error("{0:?} is not a credential id (16 to 64 hex digits)")]
    BadId(String),
    /// A running issuer refused an admin request (its reason).
    #[error("{0}")]
    Refused(String),
    /// A label that is too long or not printable.
    #[error("a label is 1 to 64 printable characters without line breaks")]
    BadLabel,
    /// A setting out of its range.
    #[error("{0}")]
    Config(String),
    /// The control socket of a running issuer failed or answered nonsense.
    #[error("control socket: {0}")]
    Control(String),
    /// The transport refused to start.
    #[error("transport: {0}")]
    Transport(#[from] penrose_transport::TransportError),
    /// The TLS identity could not be made or read.
    #[error("TLS identity: {0}")]
    Identity(#[from] penrose_transport::IdentityError),
}

/// The shared store layer's refusals, told as the issuer's (its own words for a busy store).
impl From<penrose_kv::KvError> for IssuerError {
    fn from(e: penrose_kv::KvError) -> Self {
        match e {
            penrose_kv::KvError::Rocks(e) => IssuerError::Store(e),
            penrose_kv::KvError::MissingTable(name) => IssuerError::MissingTable(name),
            penrose_kv::KvError::Busy(path) => IssuerError::Busy(path),
        }
    }
}

impl IssuerError {
    /// Whether the error refuses what was asked (an unknown or ambiguous id, a bad id or
    /// label) rather than reporting a failure: `revoke` exits with code 3 for these.
    pub fn is_refusal(&self) -> bool {
        matches!(
            self,
            IssuerError::UnknownId(_)
                | IssuerError::AmbiguousId(_)
                | IssuerError::BadId(_)
                | IssuerError::BadLabel
                | IssuerError::Refused(_)
        )
    }

    /// An I/O error on `path`.
    pub fn io(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> IssuerError {
        let path = path.into();
        move |source| IssuerError::File(penrose_host::FileError::Io { path, source })
    }
}
