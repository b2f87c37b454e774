//! The layout every server's own directory shares: the aggregation server's data directory,
//! the issuer's state directory and the release auditor's data directory hold their RocksDB
//! (or records), their QUIC identity and their admin socket in the same places, so that an
//! operator who knows one knows all three. Each tier adds its own files on top
//! (`Deref<Target = ServerDir>`).
//!
//! ```text
//! DIR/                 0700 (it holds secrets: a signing key, a seed, shares)
//! DIR/db/              RocksDB
//! DIR/tls/cert.pem     the QUIC certificate clients pin (self-signed on the first `serve`
//! DIR/tls/key.pem      unless --cert/--key name others), key 0600
//! DIR/control.sock     the admin channel while `serve` runs (0600)
//! ```

use std::path::{Path, PathBuf};

use crate::error::FileError;

/// Paths inside a server's directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerDir(PathBuf);

impl ServerDir {
    /// The directory at `path`.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        ServerDir(path.into())
    }

    /// The directory itself.
    pub fn path(&self) -> &Path {
        &self.0
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

    /// A file of the tier's own, directly inside the directory.
    pub fn file(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }

    /// Creates the directory (0700: it holds secrets) if it does not exist; an existing one
    /// keeps its mode.
    pub fn create(&self) -> Result<(), FileError> {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&self.0)
            .map_err(FileError::at(&self.0))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    #[test]
    fn a_new_directory_is_owner_only_and_holds_the_shared_layout() {
        let root = tempfile::tempdir().unwrap();
        let dir = ServerDir::new(root.path().join("a/b"));
        dir.create().unwrap();
        dir.create().unwrap();
        let mode = std::fs::metadata(dir.path()).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700);
        assert_eq!(dir.db(), root.path().join("a/b/db"));
        assert_eq!(dir.tls_key(), root.path().join("a/b/tls/key.pem"));
        assert_eq!(dir.control_socket(), root.path().join("a/b/control.sock"));
        assert_eq!(dir.file("seed"), root.path().join("a/b/seed"));
    }
}
