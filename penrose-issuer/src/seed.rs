//! The master seed: 32 random bytes from which every issuer key is derived, one per (day,
//! counter) (`IssuerKey::derive(epoch, scope, seed)`, RFC 9497 DeriveKeyPair). Whoever holds it
//! can mint tokens for any day, so its file is created readable by its owner alone, and loading
//! (with the reader every tier uses for its secrets, `penrose_host::secret_file`) refuses a file that
//! group or others may access, another user's file, a symbolic link, or anything but a plain
//! file of exactly 32 bytes: a seed that was exposed must be replaced, not used.

use std::path::Path;

use penrose_core::tokens::{IssuerKey, TokenEpoch, TokenError, TokenScope};
use rand::RngCore;
use sha2::{Digest, Sha256};

use crate::error::IssuerError;

/// Bytes of a master seed.
pub const SEED_BYTES: usize = 32;

/// Domain tag of the seed's id (what the store records to recognise its seed).
const SEED_ID_DOMAIN: &[u8] = b"penrose/issuer/v1/seed-id";

/// The master seed. Never printed: `Debug` shows nothing of it.
#[derive(Clone)]
pub struct MasterSeed([u8; SEED_BYTES]);

impl std::fmt::Debug for MasterSeed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MasterSeed(..)")
    }
}

impl MasterSeed {
    /// A fresh seed from the operating system's generator (through `rand`'s thread generator,
    /// seeded from it).
    pub fn generate() -> Self {
        let mut seed = [0u8; SEED_BYTES];
        rand::rng().fill_bytes(&mut seed);
        MasterSeed(seed)
    }

    /// A seed of given bytes (tests and benchmarks that need fixed keys).
    pub fn from_bytes(bytes: [u8; SEED_BYTES]) -> Self {
        MasterSeed(bytes)
    }

    /// The issuer key of `epoch` and `scope`.
    pub fn key(&self, epoch: TokenEpoch, scope: TokenScope) -> Result<IssuerKey, TokenError> {
        IssuerKey::derive(epoch, scope, &self.0)
    }

    /// `SHA-256("penrose/issuer/v1/seed-id" || seed)`: what the store keeps to refuse another
    /// seed. Reveals nothing of the seed.
    pub fn id(&self) -> [u8; 32] {
        Sha256::new()
            .chain_update(SEED_ID_DOMAIN)
            .chain_update(self.0)
            .finalize()
            .into()
    }

    /// Writes a new seed file at `path`, mode 0600, never replacing anything (not even a
    /// dangling symbolic link), synced with its directory.
    pub fn create(&self, path: &Path) -> Result<(), IssuerError> {
        create_secret(path, &self.0)
    }

    /// Reads a seed file; refuses a symbolic link, anything but a regular file, another
    /// user's file, a file that group or others may access, and a length other than 32 bytes.
    pub fn load(path: &Path) -> Result<Self, IssuerError> {
        // A little more than a seed, so that a longer file is named with its length.
        const READ_LIMIT: u64 = 4096;
        let bytes = penrose_host::secret_file::read(path, READ_LIMIT).map_err(|e| match e {
            penrose_host::FileError::TooLarge { .. } => IssuerError::SeedLength {
                path: path.to_owned(),
                len: READ_LIMIT + 1,
            },
            e => IssuerError::Seed(e),
        })?;
        let seed: [u8; SEED_BYTES] =
            bytes
                .as_slice()
                .try_into()
                .map_err(|_| IssuerError::SeedLength {
                    path: path.to_owned(),
                    len: bytes.len() as u64,
                })?;
        Ok(MasterSeed(seed))
    }
}

/// Writes a new secret file at `path` (the seed, a host's credential): mode 0600, never
/// replacing anything (not even a dangling symbolic link), synced with its directory.
pub(crate) fn create_secret(path: &Path, bytes: &[u8]) -> Result<(), IssuerError> {
    penrose_host::secret_file::create(path, bytes).map_err(|e| match e {
        penrose_host::FileError::Exists(path) => IssuerError::Exists(path),
        e => IssuerError::File(e),
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use penrose_host::FileError;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn created_owner_only_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("seed");
        let seed = MasterSeed::generate();
        seed.create(&path).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let read = MasterSeed::load(&path).unwrap();
        assert_eq!(read.id(), seed.id());
        assert!(matches!(seed.create(&path), Err(IssuerError::Exists(_))));
        assert_eq!(format!("{seed:?}"), "MasterSeed(..)");
    }

    #[test]
    fn open_links_odd_sizes_and_directories_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("seed");
        MasterSeed::generate().create(&path).unwrap();
        for mode in [0o644, 0o640, 0o604, 0o620, 0o602] {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
            let err = MasterSeed::load(&path).unwrap_err();
            assert!(
                matches!(err, IssuerError::Seed(FileError::TooOpen { mode: m, .. }) if m == mode),
                "{mode:o}: {err}"
            );
        }
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();

        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&path, &link).unwrap();
        assert!(matches!(
            MasterSeed::load(&link),
            Err(IssuerError::Seed(FileError::Symlink(_)))
        ));
        // Creating through a dangling link is refused too.
        let dangling = dir.path().join("dangling");
        std::os::unix::fs::symlink(dir.path().join("nowhere"), &dangling).unwrap();
        assert!(MasterSeed::generate().create(&dangling).is_err());
        assert!(!dir.path().join("nowhere").exists());

        let short = dir.path().join("short");
        std::fs::write(&short, [1u8; 31]).unwrap();
        std::fs::set_permissions(&short, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert!(matches!(
            MasterSeed::load(&short),
            Err(IssuerError::SeedLength { len: 31, .. })
        ));
        let sub = dir.path().join("sub");
        std::fs::create_dir(&sub).unwrap();
        std::fs::set_permissions(&sub, std::fs::Permissions::from_mode(0o700)).unwrap();
        assert!(matches!(
            MasterSeed::load(&sub),
            Err(IssuerError::Seed(FileError::NotAFile(_)))
        ));
    }
}
