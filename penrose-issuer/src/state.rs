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

use std::path::PathBuf;

use penrose_host::data_dir::ServerDir;

use crate::error::IssuerError;

/// Paths inside a state directory: the layout every server shares
/// ([`penrose_host::data_dir::ServerDir`]: `db/`, `tls/`, `control.sock`), and the seed.
#[derive(Clone, Debug)]
pub struct StateDir(ServerDir);

impl StateDir {
    /// The state directory at `path`.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        StateDir(ServerDir::new(path))
    }

    /// The master seed file.
    pub fn seed(&self) -> PathBuf {
        self.0.file("seed")
    }

    /// Creates the directory (0700: it holds the seed) if it does not exist.
    pub fn create(&self) -> Result<(), IssuerError> {
        self.0.create().map_err(IssuerError::File)
    }
}

impl std::ops::Deref for StateDir {
    type Target = ServerDir;

    fn deref(&self) -> &ServerDir {
        &self.0
    }
}
