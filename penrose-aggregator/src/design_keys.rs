//! The design server's public keys the sums are under, and which of them a report may use.
//!
//! A report names its key by id. Which key a report of a given day may use is the design
//! server's signed key list (`penrose_core::key_list`): the day's key, or the one it replaced
//! within the grace days. The server holds every key it has ever summed under, each in a
//! *slot* (a byte, stored in the meta table and in every ASH key), so that sums under
//! different keys never meet in one accumulator and the sums of a retired key can still be
//! exported after the list has dropped it.
//!
//! The server only passes the signed list on (to agents that ask for it) and applies it; it
//! cannot add a key, since the list is verified under the design server's signing key that the
//! configuration pins. A server configured with a single public key instead of a list
//! (`public_key`) accepts that key for every day, as before lists existed.

use std::path::{Path, PathBuf};

use ed25519_dalek::VerifyingKey;
use penrose_core::key_list::{KeyList, KeyListError};
use penrose_core::paillier::{KeyId, PublicKey};
use penrose_core::release::check_key_bits;
use penrose_core::wire::Day;
use thiserror::Error;

use crate::store::{Store, StoreError, Table, WriteSet};

/// A key's place in the store: the byte every ASH key of its sums carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct KeySlot(pub u8);

/// Meta-table keys.
pub mod meta {
    /// Prefix of one record per slot: `design_key/` + slot (u8) -> the public key's bytes.
    pub const SLOT: &[u8] = b"design_key/";
    /// The signed key list last applied (its bytes), so that a server started without key
    /// settings goes on with it.
    pub const LIST: &[u8] = b"design_keys/list";
    /// The signing key that list was verified under (32 bytes).
    pub const SIGNER: &[u8] = b"design_keys/signer";
}

/// Why the keys could not be loaded or a list applied.
#[derive(Debug, Error)]
pub enum DesignKeyError {
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A stored key does not parse.
    #[error("damaged stored design key in slot {0}")]
    Damaged(u8),
    /// Every slot is used.
    #[error("this store has summed under 256 design keys; no slot is left for another")]
    SlotsFull,
    /// A stored list no longer verifies.
    #[error("the stored key list: {0}")]
    StoredList(KeyListError),
    /// A single key given for a store that sums under others.
    #[error(
        "this data directory aggregates for key {stored}, but the server was given key {given}; \
         roll keys over with a signed key list (key_list), or use a new data directory"
    )]
    KeyMismatch {
        /// The store's latest key.
        stored: KeyId,
        /// The key given.
        given: KeyId,
    },
    /// A list older than the one applied.
    #[error(transparent)]
    List(#[from] KeyListError),
    /// A list file that is not a valid signed list.
    #[error("key list {path}: {source}")]
    ListFile {
        /// The file.
        path: PathBuf,
        /// Why.
        source: KeyListError,
    },
    /// A file could not be read.
    #[error(transparent)]
    File(#[from] penrose_host::FileError),
    /// The signer file is refused.
    #[error(transparent)]
    Signer(#[from] penrose_host::key_file::KeyFileError),
    /// `reload-keys` with no list file to read again.
    #[error("the design keys were not read from a key list file; nothing to reload")]
    NoListFile,
    /// A listed key under the size floor (`penrose_core::release::MIN_KEY_BITS`), at start or
    /// at a reload alike.
    #[error("key {key} of {path}: {source}")]
    WeakKey {
        /// The list file.
        path: PathBuf,
        /// The key.
        key: KeyId,
        /// Why.
        source: penrose_core::release::PolicyError,
    },
}

/// The meta key of `slot`'s record.
pub fn slot_record_key(slot: KeySlot) -> Vec<u8> {
    let mut k = meta::SLOT.to_vec();
    k.push(slot.0);
    k
}

/// Every key the store has summed under, by slot.
pub fn stored_keys(store: &dyn Store) -> Result<Vec<PublicKey>, DesignKeyError> {
    let mut keys = Vec::new();
    for slot in 0..=u8::MAX {
        match store.get(Table::Meta, &slot_record_key(KeySlot(slot)))? {
            None => break,
            Some(bytes) => {
                keys.push(PublicKey::from_bytes(&bytes).map_err(|_| DesignKeyError::Damaged(slot))?)
            }
        }
    }
    Ok(keys)
}

/// The signed list the store last applied, verified again, if any.
pub fn stored_list(
    store: &dyn Store,
) -> Result<Option<(KeyList, Vec<u8>, VerifyingKey)>, DesignKeyError> {
    let (Some(bytes), Some(signer)) = (
        store.get(Table::Meta, meta::LIST)?,
        store.get(Table::Meta, meta::SIGNER)?,
    ) else {
        return Ok(None);
    };
    let signer = <[u8; 32]>::try_from(signer.as_slice())
        .ok()
        .and_then(|b| VerifyingKey::from_bytes(&b).ok())
        .ok_or(DesignKeyError::StoredList(KeyListError::BadSignature))?;
    let list = KeyList::verify(&bytes, &signer).map_err(DesignKeyError::StoredList)?;
    Ok(Some((list, bytes, signer)))
}

/// Which keys a server is told to apply: one public key for every day, or the design server's
/// signed list (verified).
#[derive(Clone, Debug)]
pub struct KeySettings {
    list: KeyList,
    signed: Option<(Vec<u8>, VerifyingKey)>,
    source: Option<ListSource>,
}

/// Where a signed list was read from, so that `reload-keys` reads it again.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListSource {
    /// The list file.
    pub list: PathBuf,
    /// The design server's list-signing key it is verified under.
    pub signer: VerifyingKey,
}

impl KeySettings {
    /// One key for every day (`public_key`).
    pub fn single(key: PublicKey) -> Self {
        Self {
            list: KeyList::single(key),
            signed: None,
            source: None,
        }
    }

    /// The signed list `bytes`, verified under `signer`.
    pub fn signed(bytes: Vec<u8>, signer: VerifyingKey) -> Result<Self, KeyListError> {
        let list = KeyList::verify(&bytes, &signer)?;
        Ok(Self {
            list,
            signed: Some((bytes, signer)),
            source: None,
        })
    }

    /// The signed list in file `list`, verified under the key in file `signer` (`key_list`,
    /// `key_list_signer`); remembered, so that a reload reads the file again.
    pub fn from_files(list: &Path, signer: &Path) -> Result<Self, DesignKeyError> {
        let signer = penrose_host::key_file::read_signer(signer)?;
        Self::from_file(list, signer)
    }

    /// The signed list in file `list`, verified under `signer`, every key at or over the size
    /// floor: the one reader of list files, at start and at `reload-keys`.
    pub fn from_file(list: &Path, signer: VerifyingKey) -> Result<Self, DesignKeyError> {
        let bytes =
            penrose_host::bounded::read(list, penrose_core::key_list::MAX_LIST_BYTES as u64)?;
        let mut settings = Self::signed(bytes, signer).map_err(|e| DesignKeyError::ListFile {
            path: list.to_path_buf(),
            source: e,
        })?;
        for k in settings.list.keys() {
            check_key_bits(k.key.size().modulus_bits()).map_err(|source| {
                DesignKeyError::WeakKey {
                    path: list.to_path_buf(),
                    key: k.key.key_id(),
                    source,
                }
            })?;
        }
        settings.source = Some(ListSource {
            list: list.to_path_buf(),
            signer,
        });
        Ok(settings)
    }

    /// The list.
    pub fn list(&self) -> &KeyList {
        &self.list
    }

    /// Whether this is a signed list (not one configured key).
    pub fn is_signed(&self) -> bool {
        self.signed.is_some()
    }
}

impl From<&PublicKey> for KeySettings {
    fn from(key: &PublicKey) -> Self {
        Self::single(key.clone())
    }
}

/// What a store was last told to apply, for a server started without key settings: its
/// signed list, else its latest key for every day; `None` for a store never served.
pub fn stored_settings(store: &dyn Store) -> Result<Option<KeySettings>, DesignKeyError> {
    if let Some((list, bytes, signer)) = stored_list(store)? {
        return Ok(Some(KeySettings {
            list,
            signed: Some((bytes, signer)),
            source: None,
        }));
    }
    Ok(stored_keys(store)?.pop().map(KeySettings::single))
}

/// The keys a server applies: the list, and every key by slot.
#[derive(Clone, Debug)]
pub struct DesignKeys {
    list: KeyList,
    /// The signed list as the design server wrote it (`None`: a single configured key).
    signed: Option<Vec<u8>>,
    /// Where it was read from (reloads read it again).
    source: Option<ListSource>,
    slots: Vec<PublicKey>,
}

impl DesignKeys {
    /// Reads the stored slots and gives every key of the settings' list that has none the
    /// next one; the new slots (and a signed list's bytes, with the key it verified under) go
    /// into `set`, which the caller writes before any report is summed under them. A list
    /// older than the one the store holds is refused; so is a single key the store has never
    /// summed under while it holds sums under others (a wrong key file, most likely: a key
    /// rollover goes through a signed list, whose grace days keep the old key's reports).
    pub fn load(
        store: &dyn Store,
        settings: KeySettings,
        set: &mut WriteSet,
    ) -> Result<Self, DesignKeyError> {
        let KeySettings {
            list,
            signed,
            source,
        } = settings;
        let mut slots = stored_keys(store)?;
        if let Some((held, _, _)) = stored_list(store)?
            && signed.is_some()
        {
            list.check_not_older_than(&held)?;
        }
        if signed.is_none()
            && let Some(given) = list.keys().first()
            && let Some(stored) = slots.last()
            && !slots.iter().any(|k| k.key_id() == given.key.key_id())
        {
            return Err(DesignKeyError::KeyMismatch {
                stored: stored.key_id(),
                given: given.key.key_id(),
            });
        }
        for scheduled in list.keys() {
            let id = scheduled.key.key_id();
            if slots.iter().any(|k| k.key_id() == id) {
                continue;
            }
            let slot = u8::try_from(slots.len()).map_err(|_| DesignKeyError::SlotsFull)?;
            set.put(
                Table::Meta,
                slot_record_key(KeySlot(slot)),
                scheduled.key.to_bytes(),
            );
            slots.push(scheduled.key.clone());
        }
        let signed = signed.map(|(bytes, signer)| {
            set.put(Table::Meta, meta::LIST, bytes.clone());
            set.put(Table::Meta, meta::SIGNER, signer.to_bytes().to_vec());
            bytes
        });
        Ok(Self {
            list,
            signed,
            source,
            slots,
        })
    }

    /// One key for every day in slot 0, with nothing read or stored: for tools and tests that
    /// validate reports without a store.
    pub fn single(key: PublicKey) -> Self {
        Self {
            list: KeyList::single(key.clone()),
            signed: None,
            source: None,
            slots: vec![key],
        }
    }

    /// The key and slot a report of `day` under key `id` is summed with, if the list lets
    /// that day use that key.
    pub fn accepts(&self, id: KeyId, day: Day) -> Option<(KeySlot, &PublicKey)> {
        let key = self.list.accepts(id, day)?;
        self.slot_of(id).map(|slot| (slot, key))
    }

    /// The slot of key `id`, if the store has summed under it or the list names it.
    pub fn slot_of(&self, id: KeyId) -> Option<KeySlot> {
        self.slots
            .iter()
            .position(|k| k.key_id() == id)
            .and_then(|i| u8::try_from(i).ok())
            .map(KeySlot)
    }

    /// The key in `slot`.
    pub fn key(&self, slot: KeySlot) -> Option<&PublicKey> {
        self.slots.get(usize::from(slot.0))
    }

    /// Every key by slot.
    pub fn by_slot(&self) -> &[PublicKey] {
        &self.slots
    }

    /// The list applied.
    pub fn list(&self) -> &KeyList {
        &self.list
    }

    /// The signed list, as agents are given it (`None`: a single configured key, which
    /// agents are configured with directly).
    pub fn signed(&self) -> Option<&[u8]> {
        self.signed.as_deref()
    }

    /// The file the list was read from, if it was.
    pub fn source(&self) -> Option<&ListSource> {
        self.source.as_ref()
    }

    /// The key reports of `day` are encrypted under.
    pub fn current(&self, day: Day) -> Option<&PublicKey> {
        self.list.key_for(day)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use ed25519_dalek::SigningKey;
    use penrose_core::key_list::ScheduledKey;
    use penrose_core::paillier::{KeySize, Keypair};

    use super::*;
    use crate::store::RocksStore;

    fn key() -> PublicKey {
        Keypair::generate_with_size(KeySize::Bits512, &mut rand::rng())
            .public_key()
            .clone()
    }

    #[test]
    fn a_list_file_with_a_key_under_the_floor_is_refused_at_start_and_at_reload() {
        let dir = tempfile::tempdir().unwrap();
        let signing = SigningKey::from_bytes(&[3; 32]);
        let strong = Keypair::generate_with_size(KeySize::Bits2048, &mut rand::rng())
            .public_key()
            .clone();
        let weak = key();
        let path = dir.path().join("key-list");
        let at = |d, k: &PublicKey| ScheduledKey {
            from: Day(d),
            key: k.clone(),
        };
        let good = KeyList::new(1, 2, vec![at(10, &strong)]).unwrap();
        std::fs::write(&path, good.sign(&signing)).unwrap();
        let settings = KeySettings::from_file(&path, signing.verifying_key()).unwrap();
        assert_eq!(settings.list(), &good);
        // The file a reload reads again now holds a 512-bit key: refused, whoever reads it.
        let bad = KeyList::new(2, 2, vec![at(10, &strong), at(20, &weak)]).unwrap();
        std::fs::write(&path, bad.sign(&signing)).unwrap();
        let err = KeySettings::from_file(&path, signing.verifying_key()).unwrap_err();
        assert!(
            matches!(&err, DesignKeyError::WeakKey { key, .. } if *key == weak.key_id()),
            "{err}"
        );
    }

    #[test]
    fn keys_keep_their_slots_across_lists_and_an_older_list_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let store = RocksStore::open(dir.path()).unwrap();
        let signing = SigningKey::from_bytes(&[3; 32]);
        let (a, b, c) = (key(), key(), key());
        let at = |d, k: &PublicKey| ScheduledKey {
            from: Day(d),
            key: k.clone(),
        };
        let first = KeyList::new(1, 2, vec![at(10, &a), at(20, &b)]).unwrap();
        let mut set = WriteSet::new();
        let bytes = first.sign(&signing);
        let settings = KeySettings::signed(bytes, signing.verifying_key()).unwrap();
        assert_eq!(settings.list(), &first);
        let keys = DesignKeys::load(&store, settings, &mut set).unwrap();
        store.write(set).unwrap();
        assert_eq!(keys.slot_of(a.key_id()), Some(KeySlot(0)));
        assert_eq!(keys.slot_of(b.key_id()), Some(KeySlot(1)));
        assert_eq!(keys.accepts(b.key_id(), Day(20)).unwrap().0, KeySlot(1));
        assert!(keys.accepts(b.key_id(), Day(19)).is_none());
        // The next list drops a and adds c: a keeps its slot (its sums may still be exported).
        let second = KeyList::new(2, 2, vec![at(20, &b), at(30, &c)]).unwrap();
        let mut set = WriteSet::new();
        let bytes = second.sign(&signing);
        let settings = KeySettings::signed(bytes, signing.verifying_key()).unwrap();
        let keys = DesignKeys::load(&store, settings, &mut set).unwrap();
        store.write(set).unwrap();
        assert_eq!(keys.slot_of(a.key_id()), Some(KeySlot(0)));
        assert_eq!(keys.slot_of(c.key_id()), Some(KeySlot(2)));
        assert!(
            keys.accepts(a.key_id(), Day(15)).is_none(),
            "a is no longer listed"
        );
        assert_eq!(stored_keys(&store).unwrap().len(), 3);
        assert_eq!(stored_list(&store).unwrap().unwrap().0, second);
        // A single key the store never summed under is refused; one it did is accepted.
        let err =
            DesignKeys::load(&store, KeySettings::single(key()), &mut WriteSet::new()).unwrap_err();
        assert!(matches!(err, DesignKeyError::KeyMismatch { .. }), "{err}");
        DesignKeys::load(&store, KeySettings::single(b.clone()), &mut WriteSet::new()).unwrap();
        let old = KeyList::new(1, 2, vec![at(10, &a)]).unwrap();
        let bytes = old.sign(&signing);
        let settings = KeySettings::signed(bytes, signing.verifying_key()).unwrap();
        let err = DesignKeys::load(&store, settings, &mut WriteSet::new()).unwrap_err();
        assert!(
            matches!(
                err,
                DesignKeyError::List(KeyListError::Rollback {
                    offered: 1,
                    held: 2
                })
            ),
            "{err}"
        );
        // The held sequence with other contents is a fork of the signed history: refused,
        // and the held list stays.
        let fork = KeyList::new(2, 2, vec![at(20, &b), at(40, &a)]).unwrap();
        let settings = KeySettings::signed(fork.sign(&signing), signing.verifying_key()).unwrap();
        let err = DesignKeys::load(&store, settings, &mut WriteSet::new()).unwrap_err();
        assert!(
            matches!(
                err,
                DesignKeyError::List(KeyListError::Fork { sequence: 2 })
            ),
            "{err}"
        );
        assert_eq!(stored_list(&store).unwrap().unwrap().0, second);
    }
}
