//! The state directory's layout.
//!
//! ```text
//! STATE/               0700, created by `init`
//! STATE/seed           the master seed: 32 random bytes, 0600; every issuer key derives from it
//! STATE/db/            RocksDB: credentials (by hash), issued counts, request rates, meta
//! STATE/tls/cert.pem   the QUIC certificate agents pin (self-signed on the first `serve`
//! STATE/tls/key.pem    unless --cert/--key name others), key 0600
//! STATE/control.sock   the admin channel while `serve` runs (0600)
//! ```
//!
//! What to back up: `seed` (without it no key can be derived again, and a new seed means new
//! keys, so every exported key ring and every issued token stops matching) and `db/` (the
//! enrolments; copy it while the issuer is stopped; losing only the counts lets hosts ask
//! again for the current day's tokens). docs/operations.md, "The token issuer".

use std::path::{Path, PathBuf};

use crate::error::IssuerError;

/// Paths inside a state directory.
#[derive(Clone, Debug)]
pub struct StateDir(pub PathBuf);

impl StateDir {
    /// The state directory at `path`.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        StateDir(path.into())
    }

    /// The directory itself.
    pub fn path(&self) -> &Path {
        &self.0
    }

    /// The master seed file.
    pub fn seed(&self) -> PathBuf {
        self.0.join("seed")
    }

    /// The RocksDB directory.
    pub fn db(&self) -> PathBuf {
        self.0.join("db")
    }

    /// The default TLS certificate.
    pub fn tls_cert(&self) -> PathBuf {
        self.0.join("tls").join("cert.pem")
    }

    /// The default TLS key.
    pub fn tls_key(&self) -> PathBuf {
        self.0.join("tls").join("key.pem")
    }

    /// The admin socket.
    pub fn control_socket(&self) -> PathBuf {
        self.0.join("control.sock")
    }

    /// Creates the directory (0700: it holds the seed) if it does not exist.
    pub fn create(&self) -> Result<(), IssuerError> {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&self.0)
            .map_err(IssuerError::io(&self.0))
    }
}
