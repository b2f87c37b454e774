//! Key files. The private key never leaves the design server, so its file is created readable
//! by its owner alone, and loading refuses a file that anyone else could read: a key that was
//! exposed must be replaced, not used. It is read by the reader every tier uses for its
//! secrets (`penrose_host::secret_file`: no symbolic link, the reader's own file, mode 0600 or
//! stricter).

use std::path::{Path, PathBuf};

use penrose_core::paillier::threshold::{self, Holder, KeyShare, VerificationKey};
use penrose_core::paillier::{Keypair, PaillierError, PrivateKey, PublicKey};
use penrose_core::release::PolicyError;
use penrose_host::FileError;
use penrose_host::durable::{self, Access};
use penrose_host::key_file::{KeyFileError as PublicKeyFileError, MAX_KEY_FILE};
use thiserror::Error;

/// File name of the private key inside a key directory.
pub const PRIVATE_KEY_FILE: &str = "private.key";
/// File name of the public key inside a key directory.
pub const PUBLIC_KEY_FILE: &str = "public.key";
/// File name of the threshold verification key (public: both holders' v^(d_i)), written by a
/// split key generation beside the public key.
pub const VERIFICATION_KEY_FILE: &str = "verification.key";
/// File name of the design server's share of a split key.
pub const DESIGN_SHARE_FILE: &str = "design.share";
/// File name of the release auditor's share of a split key: handed to the auditor's operator
/// and deleted here (`penrose-auditor init --share`).
pub const AUDITOR_SHARE_FILE: &str = "auditor.share";

/// Why a key file could not be written or read.
#[derive(Debug, Error)]
pub enum KeyFileError {
    /// A file was not read or written (missing, not a file, too large, ...).
    #[error("{0}")]
    File(FileError),
    /// Writing would replace an existing key, which would orphan everything encrypted to it.
    #[error("{0} already exists; move it away first (keys are never overwritten)")]
    Exists(PathBuf),
    /// The private key file is unsafe to use (a symbolic link, another user's, open to group
    /// or others) or unreadable: [`penrose_host::secret_file::read`] says which.
    #[error("private key: {0}")]
    Secret(FileError),
    /// The contents are not a key of the expected kind.
    #[error("{path} is not a valid key: {source}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        source: PaillierError,
    },
    /// A share that is not the design server's (the auditor's belongs to the auditor alone).
    #[error("{0} is not the design server's share of the key (is it the auditor's?)")]
    NotDesignShare(PathBuf),
    /// A valid key, but smaller than every tier accepts.
    #[error("{path}: {source}")]
    Weak {
        /// The file.
        path: PathBuf,
        /// The policy it fails.
        source: PolicyError,
    },
}

// Not `#[from]`: the message already shows the inner error, which would otherwise also be the
// source and print twice in a chain.
impl From<FileError> for KeyFileError {
    fn from(e: FileError) -> Self {
        match e {
            FileError::Exists(path) => KeyFileError::Exists(path),
            e => KeyFileError::File(e),
        }
    }
}

/// The shared public key reader's refusals, told as this module's.
impl From<PublicKeyFileError> for KeyFileError {
    fn from(e: PublicKeyFileError) -> Self {
        match e {
            PublicKeyFileError::File(e) => KeyFileError::File(e),
            PublicKeyFileError::NotAKey { path, source } => KeyFileError::Invalid { path, source },
            PublicKeyFileError::Weak { path, source } => KeyFileError::Weak { path, source },
            // Only the signer reader says this; no key file of this module is read by it.
            PublicKeyFileError::NotASigner(path) => KeyFileError::File(FileError::NotAFile(path)),
        }
    }
}

fn strong_enough(path: &Path, key: &PublicKey) -> Result<(), KeyFileError> {
    Ok(penrose_host::key_file::check_floor(path, key)?)
}

/// Writes `private.key` (mode 0600) and `public.key` (mode 0644) into `dir`, refusing to
/// replace either. Returns their paths.
pub fn write_keypair(dir: &Path, keys: &Keypair) -> Result<(PathBuf, PathBuf), KeyFileError> {
    let private = dir.join(PRIVATE_KEY_FILE);
    let public = dir.join(PUBLIC_KEY_FILE);
    for path in [&private, &public] {
        if path.exists() {
            return Err(KeyFileError::Exists(path.clone()));
        }
    }
    write_new(&private, Access::Owner, &keys.private_key().to_bytes())?;
    write_new(&public, Access::Public, &keys.public_key().to_bytes())?;
    Ok((private, public))
}

/// The files of a split key generation.
#[derive(Clone, Debug)]
pub struct SplitKeyFiles {
    /// `public.key` (mode 0644): for the aggregation server and the agents.
    pub public: PathBuf,
    /// `verification.key` (mode 0644): for the design server and the auditor.
    pub verification: PathBuf,
    /// `design.share` (mode 0600): stays with the design server.
    pub design: PathBuf,
    /// `auditor.share` (mode 0600): goes to the auditor, and is deleted here.
    pub auditor: PathBuf,
}

/// The dealer ceremony's output: the public key, the verification key and the two shares
/// ([`penrose_core::paillier::threshold::split`]) in `dir`, refusing to replace any. The whole
/// private key is never written: it lives in this process only while the shares are dealt.
pub fn write_split(
    dir: &Path,
    keys: &Keypair,
    rng: &mut impl rand::CryptoRng,
) -> Result<SplitKeyFiles, KeyFileError> {
    let files = SplitKeyFiles {
        public: dir.join(PUBLIC_KEY_FILE),
        verification: dir.join(VERIFICATION_KEY_FILE),
        design: dir.join(DESIGN_SHARE_FILE),
        auditor: dir.join(AUDITOR_SHARE_FILE),
    };
    for path in [
        &files.public,
        &files.verification,
        &files.design,
        &files.auditor,
    ] {
        if path.exists() {
            return Err(KeyFileError::Exists(path.clone()));
        }
    }
    let dealt =
        threshold::split(keys.private_key(), rng).map_err(|source| KeyFileError::Invalid {
            path: dir.to_owned(),
            source,
        })?;
    write_new(&files.design, Access::Owner, &dealt.design.to_bytes())?;
    write_new(&files.auditor, Access::Owner, &dealt.auditor.to_bytes())?;
    let verification = dealt.design.verification_key().to_bytes();
    write_new(&files.verification, Access::Public, &verification)?;
    write_new(&files.public, Access::Public, &keys.public_key().to_bytes())?;
    Ok(files)
}

/// Reads the design server's share of `public` with the shared secret-file reader (as a
/// private key), refusing the auditor's share: the design server must never hold both.
pub fn read_design_share(path: &Path, public: &PublicKey) -> Result<KeyShare, KeyFileError> {
    let bytes =
        penrose_host::secret_file::read(path, MAX_KEY_FILE).map_err(KeyFileError::Secret)?;
    let invalid = |source| KeyFileError::Invalid {
        path: path.to_owned(),
        source,
    };
    let share = KeyShare::from_bytes(public, &bytes).map_err(invalid)?;
    if share.holder() != Holder::Design {
        return Err(KeyFileError::NotDesignShare(path.to_owned()));
    }
    Ok(share)
}

/// Reads a verification key of `public`.
pub fn read_verification_key(
    path: &Path,
    public: &PublicKey,
) -> Result<VerificationKey, KeyFileError> {
    let bytes = penrose_host::bounded::read(path, MAX_KEY_FILE)?;
    VerificationKey::from_bytes(public, &bytes).map_err(|source| KeyFileError::Invalid {
        path: path.to_owned(),
        source,
    })
}

fn write_new(path: &Path, access: Access, bytes: &[u8]) -> Result<(), KeyFileError> {
    // Never follow or replace an existing file; the mode applies at creation, so a secret is
    // never briefly readable by others.
    Ok(durable::create(path, bytes, access)?)
}

/// Reads a private key with the shared secret-file reader: refuses a symbolic link, another
/// user's file and a file that group or others can access.
pub fn read_private_key(path: &Path) -> Result<PrivateKey, KeyFileError> {
    let bytes =
        penrose_host::secret_file::read(path, MAX_KEY_FILE).map_err(KeyFileError::Secret)?;
    let key = PrivateKey::from_bytes(&bytes).map_err(|source| KeyFileError::Invalid {
        path: path.to_owned(),
        source,
    })?;
    strong_enough(path, key.public_key())?;
    Ok(key)
}

/// Reads a public key with the reader every tier uses, which refuses one under the floor.
pub fn read_public_key(path: &Path) -> Result<PublicKey, KeyFileError> {
    Ok(penrose_host::key_file::read_public_key(path)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use penrose_core::paillier::KeySize;
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;
    use std::os::unix::fs::PermissionsExt;

    fn keys() -> Keypair {
        Keypair::generate_with_size(KeySize::Bits512, &mut ChaCha8Rng::seed_from_u64(11))
    }

    #[test]
    fn weak_keys_are_refused_on_read() {
        let dir = tempfile::tempdir().unwrap();
        let (private, public) = write_keypair(dir.path(), &keys()).unwrap();
        for result in [
            read_private_key(&private).map(|_| ()),
            read_public_key(&public).map(|_| ()),
        ] {
            match result {
                Err(KeyFileError::Weak { source, .. }) => {
                    assert_eq!(source, PolicyError::WeakKey(512))
                }
                other => panic!("a 512-bit key was not refused as weak: {other:?}"),
            }
        }
    }

    #[test]
    fn round_trip_with_owner_only_private_key() {
        let dir = tempfile::tempdir().unwrap();
        let keys =
            Keypair::generate_with_size(KeySize::Bits2048, &mut ChaCha8Rng::seed_from_u64(12));
        let (private, public) = write_keypair(dir.path(), &keys).unwrap();
        let mode = std::fs::metadata(&private).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let read = read_private_key(&private).unwrap();
        assert_eq!(read.public_key().key_id(), keys.public_key().key_id());
        assert_eq!(read_public_key(&public).unwrap(), *keys.public_key());
    }

    #[test]
    fn never_overwrites_and_refuses_open_private_keys() {
        let dir = tempfile::tempdir().unwrap();
        let (private, _) = write_keypair(dir.path(), &keys()).unwrap();
        let before = std::fs::read(&private).unwrap();
        assert!(matches!(
            write_keypair(dir.path(), &keys()),
            Err(KeyFileError::Exists(_))
        ));
        assert_eq!(std::fs::read(&private).unwrap(), before);
        std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o640)).unwrap();
        assert!(matches!(
            read_private_key(&private),
            Err(KeyFileError::Secret(FileError::TooOpen { mode: 0o640, .. }))
        ));
        // A symbolic link to a good key is refused too (never followed).
        std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o600)).unwrap();
        let link = dir.path().join("link.key");
        std::os::unix::fs::symlink(&private, &link).unwrap();
        assert!(matches!(
            read_private_key(&link),
            Err(KeyFileError::Secret(FileError::Symlink(_)))
        ));
    }

    /// The dealer writes the public key, the verification key and both shares, never the
    /// private key, refuses to overwrite, and the design server refuses the auditor's share.
    #[test]
    fn a_split_key_generation_writes_two_shares_and_no_private_key() {
        let dir = tempfile::tempdir().unwrap();
        let keys = keys();
        let mut rng = ChaCha8Rng::seed_from_u64(13);
        let files = write_split(dir.path(), &keys, &mut rng).unwrap();
        assert!(!dir.path().join(PRIVATE_KEY_FILE).exists());
        for (path, mode) in [(&files.design, 0o600), (&files.auditor, 0o600)] {
            assert_eq!(
                std::fs::metadata(path).unwrap().permissions().mode() & 0o777,
                mode
            );
        }
        let public = keys.public_key();
        let share = read_design_share(&files.design, public).unwrap();
        assert_eq!(share.holder(), Holder::Design);
        assert!(matches!(
            read_design_share(&files.auditor, public),
            Err(KeyFileError::NotDesignShare(_))
        ));
        let vk = read_verification_key(&files.verification, public).unwrap();
        assert_eq!(vk.key_id(), public.key_id());
        let before = std::fs::read(&files.design).unwrap();
        assert!(matches!(
            write_split(dir.path(), &keys, &mut rng),
            Err(KeyFileError::Exists(_))
        ));
        assert_eq!(std::fs::read(&files.design).unwrap(), before);
    }

    #[test]
    fn wrong_or_truncated_files_are_invalid() {
        let dir = tempfile::tempdir().unwrap();
        let (private, public) = write_keypair(dir.path(), &keys()).unwrap();
        // A public key where a private key is expected, and a truncated public key.
        let swapped = dir.path().join("swapped.key");
        write_new(&swapped, Access::Owner, &std::fs::read(&public).unwrap()).unwrap();
        assert!(matches!(
            read_private_key(&swapped),
            Err(KeyFileError::Invalid { .. })
        ));
        let bytes = std::fs::read(&private).unwrap();
        let truncated = dir.path().join("truncated.key");
        write_new(&truncated, Access::Owner, &bytes[..bytes.len() / 2]).unwrap();
        assert!(matches!(
            read_private_key(&truncated),
            Err(KeyFileError::Invalid { .. })
        ));
        assert!(matches!(
            read_public_key(&dir.path().join("missing")),
            Err(KeyFileError::File(e)) if e.is_missing()
        ));
    }
}
