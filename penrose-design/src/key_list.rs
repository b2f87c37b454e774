//! Key rollover on the design server: its list-signing key, and the signed key list that says
//! which of its Paillier keys encrypts which day's reports (`penrose_core::key_list`).
//!
//! The flow (docs/operations.md, "Roll the design server's key"): `key-list-signer` once, and
//! its public half pinned by the aggregation server and every agent; `keygen` for each new
//! key; `key-list` with the current key and the next one from a day a few days ahead, signed;
//! the aggregation server loads the list (`reload-keys`) and hands it to agents, which switch
//! keys on that day; reports still under the old key are accepted for the list's grace days,
//! and the design server decrypts each sum with the key it is under (`report --key` names
//! every private key that sums may be under).

use std::path::{Path, PathBuf};

use ed25519_dalek::SigningKey;
use penrose_core::key_list::{KeyList, KeyListError, ScheduledKey};
use penrose_core::paillier::PublicKey;
use penrose_core::wire::Day;
use penrose_host::durable::{self, Access};
use rand::RngCore;
use thiserror::Error;

use crate::keyfile::{self, KeyFileError};

/// File name of the list-signing key inside its directory.
pub const SIGNING_KEY_FILE: &str = "list-signing.key";
/// File name of its public half (64 hex digits), which the aggregation server and agents pin.
pub const SIGNER_FILE: &str = "list-signing.pub";
/// What a list-signing key file starts with, before the 32-byte seed.
const SIGNING_KEY_TAG: &[u8] = b"penrose-key-list-signing-key 1\n";

/// Why a signing key or a list could not be made.
#[derive(Debug, Error)]
pub enum KeyListFileError {
    /// A file was not written.
    #[error("{0}")]
    File(#[from] penrose_host::FileError),
    /// A key file would be replaced.
    #[error("{0} already exists; move it away first (keys are never overwritten)")]
    Exists(PathBuf),
    /// The signing key file is unsafe or unreadable.
    #[error("list-signing key: {0}")]
    Secret(penrose_host::FileError),
    /// Not a list-signing key file.
    #[error("{0} is not a Penrose list-signing key")]
    NotASigningKey(PathBuf),
    /// A public key file.
    #[error(transparent)]
    Key(#[from] KeyFileError),
    /// The list is not valid.
    #[error(transparent)]
    List(#[from] KeyListError),
}

/// Writes a new list-signing key into `dir` (mode 0600) and its public half beside it;
/// refuses to replace either. Returns both paths.
pub fn create_signing_key(dir: &Path) -> Result<(PathBuf, PathBuf), KeyListFileError> {
    let secret = dir.join(SIGNING_KEY_FILE);
    let public = dir.join(SIGNER_FILE);
    for path in [&secret, &public] {
        if path.exists() {
            return Err(KeyListFileError::Exists(path.clone()));
        }
    }
    let mut seed = [0u8; 32];
    rand::rng().fill_bytes(&mut seed);
    let key = SigningKey::from_bytes(&seed);
    let mut bytes = SIGNING_KEY_TAG.to_vec();
    bytes.extend_from_slice(&seed);
    penrose_host::secret_file::create(&secret, &bytes).map_err(KeyListFileError::Secret)?;
    let text = penrose_core::key_list::signer_text(&key.verifying_key());
    durable::create(&public, text.as_bytes(), Access::Public)?;
    Ok((secret, public))
}

/// Reads a list-signing key (the shared secret-file reader: no symbolic link, the reader's own
/// file, mode 0600 or stricter).
pub fn read_signing_key(path: &Path) -> Result<SigningKey, KeyListFileError> {
    let bytes = penrose_host::secret_file::read(path, (SIGNING_KEY_TAG.len() + 32) as u64)
        .map_err(KeyListFileError::Secret)?;
    let seed: [u8; 32] = bytes
        .strip_prefix(SIGNING_KEY_TAG)
        .and_then(|s| s.try_into().ok())
        .ok_or_else(|| KeyListFileError::NotASigningKey(path.to_path_buf()))?;
    Ok(SigningKey::from_bytes(&seed))
}

/// One `--key` of `key-list`: a public key file and the first day it encrypts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyFrom {
    /// The public key file.
    pub path: PathBuf,
    /// Its first day.
    pub from: Day,
}

/// Builds the list of `keys` (by first day), signs it with the key in `signing` and writes it
/// to `out` (replacing it atomically: the aggregation server may read it at any time).
pub fn write_list(
    signing: &Path,
    keys: &[KeyFrom],
    sequence: u64,
    grace_days: u8,
    out: &Path,
) -> Result<KeyList, KeyListFileError> {
    let signer = read_signing_key(signing)?;
    let scheduled = keys
        .iter()
        .map(|k| {
            let key: PublicKey = keyfile::read_public_key(&k.path)?;
            Ok(ScheduledKey { from: k.from, key })
        })
        .collect::<Result<Vec<_>, KeyListFileError>>()?;
    let list = KeyList::new(sequence, grace_days, scheduled)?;
    let bytes = list.sign(&signer);
    durable::replace(out, &bytes, Access::Public)?;
    Ok(list)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use penrose_core::paillier::{KeySize, Keypair};

    use super::*;

    #[test]
    fn a_list_written_here_verifies_under_the_pinned_signer_and_keys_are_never_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let (secret, public) = create_signing_key(dir.path()).unwrap();
        assert!(matches!(
            create_signing_key(dir.path()),
            Err(KeyListFileError::Exists(_))
        ));
        let mode = std::os::unix::fs::MetadataExt::mode(&std::fs::metadata(&secret).unwrap());
        assert_eq!(mode & 0o777, 0o600);
        let mut keys = Vec::new();
        for (i, from) in [(0, 100), (1, 110)] {
            let sub = dir.path().join(format!("k{i}"));
            std::fs::create_dir(&sub).unwrap();
            let pair = Keypair::generate_with_size(KeySize::Bits2048, &mut rand::rng());
            keyfile::write_keypair(&sub, &pair).unwrap();
            keys.push(KeyFrom {
                path: sub.join(keyfile::PUBLIC_KEY_FILE),
                from: Day(from),
            });
        }
        let out = dir.path().join("keys.list");
        let list = write_list(&secret, &keys, 7, 2, &out).unwrap();
        let signer =
            penrose_core::key_list::parse_signer(&std::fs::read_to_string(&public).unwrap())
                .unwrap();
        let read = KeyList::verify(&std::fs::read(&out).unwrap(), &signer).unwrap();
        assert_eq!(read, list);
        assert_eq!(read.sequence(), 7);
        // Days out of order are refused, and nothing is written.
        keys.swap(0, 1);
        let other = dir.path().join("bad.list");
        assert!(matches!(
            write_list(&secret, &keys, 8, 2, &other),
            Err(KeyListFileError::List(KeyListError::Order(100, 110)))
        ));
        assert!(!other.exists());
    }
}
