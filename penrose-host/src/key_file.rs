//! The public key files every tier reads, one reader each: the design server's Paillier
//! public key (refused under the key floor, [`penrose_core::release::MIN_KEY_BITS`]), and the
//! ed25519 signer files (the design server's list signer, the aggregation server's bundle
//! signer), both one line of 64 hex digits, comment lines starting with `#` allowed.
//!
//! Both are public: they are read with [`crate::bounded`], which bounds the read and refuses
//! what is not a regular file. Private keys and shares are secrets, read with
//! [`crate::secret_file`] and parsed by the tier that holds them.

use std::path::{Path, PathBuf};

use ed25519_dalek::VerifyingKey;
use penrose_core::paillier::{PaillierError, PublicKey};
use thiserror::Error;

use crate::error::FileError;

/// The most bytes a key file holds: a 16,384-bit public key is about 4 KiB.
pub const MAX_KEY_FILE: u64 = 64 * 1024;

/// Why a key file was refused.
#[derive(Debug, Error)]
pub enum KeyFileError {
    /// Not read (missing, not a file, too large, ...).
    #[error(transparent)]
    File(#[from] FileError),
    /// Read, but not a Penrose key.
    #[error("{path} is not a Penrose public key: {source}")]
    NotAKey {
        /// The file.
        path: PathBuf,
        /// Why it does not parse.
        source: PaillierError,
    },
    /// A key under the floor: its modulus can be factored, and every report under it read.
    #[error("{path}: {source}")]
    Weak {
        /// The file.
        path: PathBuf,
        /// The floor it is under.
        source: penrose_core::release::PolicyError,
    },
    /// Read, but not one line of 64 hex digits that is an ed25519 public key.
    #[error(
        "{0} is not a signer file: one line of 64 hex digits (an ed25519 public key) was \
         expected, as `penrose-design key-list-signer` and the aggregation server's \
         `.pub` file hold"
    )]
    NotASigner(PathBuf),
}

impl KeyFileError {
    /// The file the error is about.
    pub fn path(&self) -> &Path {
        match self {
            KeyFileError::File(e) => e.path(),
            KeyFileError::NotAKey { path, .. } | KeyFileError::Weak { path, .. } => path,
            KeyFileError::NotASigner(path) => path,
        }
    }
}

/// Reads a Paillier public key, refusing one under the key floor.
pub fn read_public_key(path: &Path) -> Result<PublicKey, KeyFileError> {
    let bytes = crate::bounded::read(path, MAX_KEY_FILE)?;
    let key = PublicKey::from_bytes(&bytes).map_err(|source| KeyFileError::NotAKey {
        path: path.to_owned(),
        source,
    })?;
    check_floor(path, &key)?;
    Ok(key)
}

/// Refuses `key` (read from `path`) if it is under the key floor.
pub fn check_floor(path: &Path, key: &PublicKey) -> Result<(), KeyFileError> {
    penrose_core::release::check_key_bits(key.size().modulus_bits()).map_err(|source| {
        KeyFileError::Weak {
            path: path.to_owned(),
            source,
        }
    })
}

/// Reads a signer file: the design server's list-signing key or the aggregation server's
/// bundle-signing key.
pub fn read_signer(path: &Path) -> Result<VerifyingKey, KeyFileError> {
    let text = crate::bounded::read(path, penrose_core::key_list::MAX_SIGNER_FILE)?;
    std::str::from_utf8(&text)
        .ok()
        .and_then(penrose_core::key_list::parse_signer)
        .ok_or_else(|| KeyFileError::NotASigner(path.to_owned()))
}

/// A bundle signer's file text for `key`: its 64 hex digits on one line, as the aggregation
/// server writes the `.pub` file beside its signing key and [`read_signer`] reads it. (The
/// design server's list signer carries a comment line too:
/// [`penrose_core::key_list::signer_text`].)
pub fn signer_line(key: &VerifyingKey) -> String {
    format!("{}\n", penrose_core::hex::encode(key.as_bytes()))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use penrose_core::paillier::{KeySize, Keypair};
    use rand::SeedableRng as _;
    use rand_chacha::ChaCha8Rng;

    use super::*;

    #[test]
    fn a_public_key_reads_back_and_a_weak_or_damaged_one_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("design.pub");
        let strong =
            Keypair::generate_with_size(KeySize::Bits2048, &mut ChaCha8Rng::seed_from_u64(1))
                .public_key()
                .clone();
        std::fs::write(&path, strong.to_bytes()).unwrap();
        assert_eq!(read_public_key(&path).unwrap(), strong);

        let weak = Keypair::generate_with_size(KeySize::Bits512, &mut ChaCha8Rng::seed_from_u64(2))
            .public_key()
            .clone();
        std::fs::write(&path, weak.to_bytes()).unwrap();
        assert!(matches!(
            read_public_key(&path),
            Err(KeyFileError::Weak { .. })
        ));

        std::fs::write(&path, b"not a key").unwrap();
        let err = read_public_key(&path).unwrap_err();
        assert!(matches!(err, KeyFileError::NotAKey { .. }), "{err}");
        assert_eq!(err.path(), path);

        std::fs::write(&path, vec![0; MAX_KEY_FILE as usize + 1]).unwrap();
        assert!(matches!(
            read_public_key(&path),
            Err(KeyFileError::File(FileError::TooLarge { .. }))
        ));
    }

    #[test]
    fn signer_files_are_64_hex_digits_of_a_valid_key() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("signer");
        let key = ed25519_dalek::SigningKey::from_bytes(&[7; 32]).verifying_key();
        std::fs::write(&path, signer_line(&key)).unwrap();
        assert_eq!(read_signer(&path).unwrap(), key);
        std::fs::write(&path, penrose_core::key_list::signer_text(&key)).unwrap();
        assert_eq!(read_signer(&path).unwrap(), key);
        std::fs::write(
            &path,
            format!(
                "# list signer\n{}",
                penrose_core::key_list::signer_text(&key)
            ),
        )
        .unwrap();
        assert_eq!(read_signer(&path).unwrap(), key);
        for bad in ["", "abcd\n", &"zz".repeat(32)] {
            std::fs::write(&path, bad).unwrap();
            assert!(
                matches!(read_signer(&path), Err(KeyFileError::NotASigner(_))),
                "{bad:?}"
            );
        }
        std::fs::write(&path, vec![b'#'; 5000]).unwrap();
        assert!(matches!(
            read_signer(&path),
            Err(KeyFileError::File(FileError::TooLarge { .. }))
        ));
    }
}
