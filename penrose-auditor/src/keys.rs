//! The auditor's key material: its shares of the design server's split Paillier keys (one per
//! key, several during a key rollover), the files they arrive in from the dealer, and the
//! aggregation server's bundle-signing key it pins.
//!
//! A share is taken only with the public key and the dealing's verification key beside it,
//! and only if it is the auditor's (`Holder::Auditor`: the design server's share must never
//! be on the same machine), of that public key, proven by that verification key, and of a key
//! of at least `MIN_KEY_BITS` bits. The size floor is checked where a key enters from outside
//! ([`read_offered`]); the data directory holds only what was checked on the way in.

use std::collections::BTreeMap;
use std::path::Path;

use ed25519_dalek::VerifyingKey;
use penrose_core::paillier::threshold::{Holder, KeyShare, VerificationKey};
use penrose_core::paillier::{KeyId, PaillierError, PublicKey};
use penrose_core::release::check_key_bits;

use crate::data_dir::DataDir;
use crate::error::AuditorError;
use penrose_host::durable::{self, Access};

/// The largest key file read: a 2048-bit share is 2,105 bytes.
pub use penrose_host::key_file::MAX_KEY_FILE;

/// The shares held, by key id: what a bundle's entries are checked against and decrypted
/// with.
#[derive(Clone, Debug, Default)]
pub struct Shares {
    by_id: BTreeMap<KeyId, KeyShare>,
}

impl Shares {
    /// The shares held in a data directory. A file that does not read as `init` or
    /// `add-share` wrote it is reported as damaged.
    pub fn load(data: &DataDir) -> Result<Self, AuditorError> {
        let mut by_id = BTreeMap::new();
        for id in data.held_key_ids()? {
            let share_path = data.share(&id);
            let share = read_key_files(
                &share_path,
                &data.public_key(&id),
                &data.verification_key(&id),
            )
            .map_err(|e| AuditorError::corrupt(&share_path, e))?;
            if share.key_id() != id {
                return Err(AuditorError::corrupt(share_path, "a share of another key"));
            }
            by_id.insert(id, share);
        }
        if by_id.is_empty() {
            return Err(AuditorError::corrupt(data.shares(), "no key share"));
        }
        Ok(Shares { by_id })
    }

    /// The share of key `id`, if one is held.
    pub fn get(&self, id: &KeyId) -> Option<&KeyShare> {
        self.by_id.get(id)
    }

    /// The ids of the keys held.
    pub fn ids(&self) -> Vec<KeyId> {
        self.by_id.keys().copied().collect()
    }
}

/// Reads a share the dealer handed over, with its public key and the dealing's verification
/// key: refuses another key's share or verification key, the design server's share, and a
/// key under the size floor every tier enforces.
pub fn read_offered(
    share: &Path,
    public: &Path,
    verification: &Path,
) -> Result<KeyShare, AuditorError> {
    let key = read_key_files(share, public, verification)?;
    let bits = key.verification_key().public_key().size().modulus_bits();
    check_key_bits(bits).map_err(|source| AuditorError::WeakKey {
        path: public.to_owned(),
        source,
    })?;
    Ok(key)
}

fn read_key_files(
    share: &Path,
    public: &Path,
    verification: &Path,
) -> Result<KeyShare, AuditorError> {
    let public_key = PublicKey::from_bytes(&read_limited(public)?).map_err(invalid(public))?;
    let verification_key = VerificationKey::from_bytes(&public_key, &read_limited(verification)?)
        .map_err(invalid(verification))?;
    let bytes =
        penrose_host::secret_file::read(share, MAX_KEY_FILE).map_err(AuditorError::Secret)?;
    let key = KeyShare::from_bytes(&public_key, &bytes).map_err(invalid(share))?;
    if key.holder() != Holder::Auditor {
        return Err(AuditorError::NotAuditorShare(share.to_owned()));
    }
    if key.verification_key() != &verification_key {
        return Err(AuditorError::VerificationMismatch(verification.to_owned()));
    }
    Ok(key)
}

/// Writes a share into the data directory: the public and verification keys first, then the
/// share, whose file is what makes the key held. Refuses a key already held.
pub fn store(data: &DataDir, share: &KeyShare) -> Result<(), AuditorError> {
    let id = share.key_id();
    if data.share(&id).exists() {
        return Err(AuditorError::KeyHeld(id));
    }
    let verification = share.verification_key();
    let public = verification.public_key().to_bytes();
    durable::replace(&data.public_key(&id), &public, Access::Public)?;
    durable::replace(
        &data.verification_key(&id),
        &verification.to_bytes(),
        Access::Public,
    )?;
    Ok(durable::place_secret(&data.share(&id), &share.to_bytes())?)
}

fn invalid(path: &Path) -> impl FnOnce(PaillierError) -> AuditorError + '_ {
    move |source| AuditorError::Key {
        path: path.to_owned(),
        source,
    }
}

fn read_limited(path: &Path) -> Result<Vec<u8>, AuditorError> {
    Ok(penrose_host::bounded::read(path, MAX_KEY_FILE)?)
}

/// Reads the aggregation server's bundle-signing public key, as the aggregation server writes
/// the `.pub` file beside its signing key ([`penrose_host::key_file::read_signer`]).
pub fn read_aggregator_key(path: &Path) -> Result<VerifyingKey, AuditorError> {
    use penrose_host::key_file::KeyFileError;
    penrose_host::key_file::read_signer(path).map_err(|e| match e {
        KeyFileError::File(e) => AuditorError::File(e),
        _ => AuditorError::AggregatorKey(path.to_owned()),
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use ed25519_dalek::SigningKey;

    #[test]
    fn the_aggregator_key_reads_as_the_aggregation_server_writes_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("aggregator.pub");
        let key = SigningKey::from_bytes(&[3; 32]).verifying_key();
        std::fs::write(&path, penrose_host::key_file::signer_line(&key)).unwrap();
        assert_eq!(read_aggregator_key(&path).unwrap(), key);
        for bad in ["", "abc", &"zz".repeat(32), &"00".repeat(31)] {
            std::fs::write(&path, bad).unwrap();
            assert!(matches!(
                read_aggregator_key(&path),
                Err(AuditorError::AggregatorKey(_))
            ));
        }
    }
}
