//! Contributor evidence at the auditor (issue 26 item 2; `penrose_core::evidence`): with its
//! party's token key ring in the data directory, the auditor no longer takes the aggregation
//! server's report counts on trust. It counts each sum's contributors itself, from the reports
//! and evidence tokens the page carries, and decrypts a sum only when they reach its
//! threshold k.
//!
//! A token counts once, ever: the [`SpentStore`] keeps the id of every token counted for a
//! released sum, with the sum it was counted for (bundle hash and entry), so that the
//! aggregation server cannot lend one sum's honest reports to another (a victim's class, then
//! subtract), while the same page asked again (a lost answer) counts the same tokens again.
//!
//! ```text
//! DATA/evidence-keys   the auditor party's token key ring (secret, 0600), as its issuer exports it
//! DATA/spent           append-only: spent_id:[32] bundle_hash:[32] entry:u32be per counted token
//! ```

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use penrose_core::bundle::{BundleEntry, BundleHash};
use penrose_core::evidence::{self, EvidenceRule, SumEvidence, TokenPeriod, TokensPerEpoch};
use penrose_core::paillier::PublicKey;
use penrose_core::tokens::{KeyRing, SpentId};
use tracing::warn;

use crate::data_dir::DataDir;
use crate::error::AuditorError;
use crate::policy::Policy;

/// The sum a token was counted for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Owner {
    /// The bundle's hash.
    pub bundle: BundleHash,
    /// The entry's index in it.
    pub entry: u32,
}

/// One record of the spent file.
const RECORD: usize = 32 + 32 + 4;

/// Every token ever counted, with the sum it was counted for; appended to durably before an
/// answer leaves.
#[derive(Debug)]
pub struct SpentStore {
    path: PathBuf,
    owners: HashMap<SpentId, Owner>,
}

impl SpentStore {
    /// Reads the spent file (none yet: empty). A torn last record (a crash while appending,
    /// before the answer left) is dropped, and cut off the file before the next append.
    pub fn load(path: &Path) -> Result<Self, AuditorError> {
        let bytes = match std::fs::read(path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(AuditorError::io(path)(e)),
        };
        let whole = bytes.len() - bytes.len() % RECORD;
        if whole != bytes.len() {
            warn!(path = %path.display(), "dropping a torn last record of the spent file");
        }
        let owners = bytes[..whole]
            .chunks_exact(RECORD)
            .map(|r| {
                let (id, rest) = r.split_at(32);
                let (bundle, entry) = rest.split_at(32);
                let owner = Owner {
                    bundle: BundleHash(bundle.try_into().unwrap_or([0; 32])),
                    entry: u32::from_be_bytes(entry.try_into().unwrap_or([0; 4])),
                };
                (SpentId(id.try_into().unwrap_or([0; 32])), owner)
            })
            .collect();
        Ok(SpentStore {
            path: path.to_path_buf(),
            owners,
        })
    }

    /// The sum `id` was counted for, if any.
    pub fn owner(&self, id: &SpentId) -> Option<Owner> {
        self.owners.get(id).copied()
    }

    /// Tokens counted so far.
    pub fn len(&self) -> usize {
        self.owners.len()
    }

    /// Whether none was counted yet.
    pub fn is_empty(&self) -> bool {
        self.owners.is_empty()
    }

    /// Whether each id is free or already counted for the same sum (the page asked again).
    pub fn admits(&self, claims: &[(SpentId, Owner)]) -> bool {
        claims
            .iter()
            .all(|(id, owner)| self.owner(id).is_none_or(|o| o == *owner))
    }

    /// Records new claims durably (synced before this returns); the store in memory changes
    /// only once the file has. Claims already held for the same sum are not written again.
    pub fn append(&mut self, claims: &[(SpentId, Owner)]) -> Result<(), AuditorError> {
        let new: Vec<&(SpentId, Owner)> = claims
            .iter()
            .filter(|(id, _)| !self.owners.contains_key(id))
            .collect();
        if new.is_empty() {
            return Ok(());
        }
        let mut bytes = Vec::with_capacity(new.len() * RECORD);
        for (id, owner) in &new {
            bytes.extend_from_slice(&id.0);
            bytes.extend_from_slice(&owner.bundle.0);
            bytes.extend_from_slice(&owner.entry.to_be_bytes());
        }
        let mut file = self.open_whole()?;
        file.write_all(&bytes)
            .and_then(|()| file.sync_all())
            .map_err(AuditorError::io(&self.path))?;
        self.owners.extend(new.into_iter().copied());
        Ok(())
    }

    /// The file opened for appending, a torn last record cut off first.
    fn open_whole(&self) -> Result<File, AuditorError> {
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.path)
            .map_err(AuditorError::io(&self.path))?;
        let len = file.metadata().map_err(AuditorError::io(&self.path))?.len();
        let whole = len - len % RECORD as u64;
        if whole != len {
            file.set_len(whole).map_err(AuditorError::io(&self.path))?;
        }
        Ok(file)
    }
}

/// Far above any key ring (a key set holds at most a few thousand 38-byte keys).
const MAX_KEY_RING_BYTES: u64 = 1 << 20;

/// What the auditor counts with: its party's key ring and T per token epoch.
#[derive(Debug)]
pub struct EvidenceKeys {
    keys: KeyRing,
    cap: TokensPerEpoch,
}

impl EvidenceKeys {
    /// The data directory's evidence key ring, if it holds one (then every release needs
    /// evidence), counted with the policy's cap T per day.
    pub fn load(data: &DataDir, policy: &Policy) -> Result<Option<Self>, AuditorError> {
        let path = data.evidence_keys();
        if !path.exists() {
            return Ok(None);
        }
        let bytes = penrose_host::secret_file::read(&path, MAX_KEY_RING_BYTES)
            .map_err(AuditorError::Secret)?;
        let keys = KeyRing::decode(&bytes).map_err(|e| AuditorError::corrupt(&path, e))?;
        let cap = TokensPerEpoch::new(TokenPeriod::Day, policy.cap().get())
            .map_err(|e| AuditorError::corrupt(&path, e))?;
        Ok(Some(EvidenceKeys { keys, cap }))
    }

    /// The rule [`evidence::count`] applies.
    pub fn rule(&self) -> EvidenceRule<'_> {
        EvidenceRule {
            keys: &self.keys,
            cap: self.cap,
        }
    }
}

/// What one entry's evidence proves: the contributors counted, and the tokens they were
/// counted from, claimed for this entry.
pub struct EntryCount {
    /// Distinct credentials behind the sum, at least.
    pub contributors: u64,
    /// The tokens counted.
    pub claims: Vec<(SpentId, Owner)>,
}

/// Counts one entry of a page from its encoded evidence. A token counts when it is free, or
/// already counted for this very sum; `claimed` holds what earlier entries of the same page
/// counted, so that two entries of one page cannot share a token either. `None`: the evidence
/// does not decode or does not list exactly the sum's reports.
pub fn count_entry(
    keys: &EvidenceKeys,
    store: &SpentStore,
    claimed: &HashMap<SpentId, Owner>,
    owner: Owner,
    encoded: &[u8],
    entry: &BundleEntry,
    public: &PublicKey,
) -> Option<EntryCount> {
    let listed = SumEvidence::decode(encoded).ok()?;
    let taken_elsewhere = |id: &SpentId| {
        let other = |o: Owner| o != owner;
        store.owner(id).is_some_and(other) || claimed.get(id).copied().is_some_and(other)
    };
    let counted = evidence::count(&listed, entry, public, &keys.rule(), taken_elsewhere).ok()?;
    Some(EntryCount {
        contributors: counted.contributors,
        claims: counted.spent.into_iter().map(|id| (id, owner)).collect(),
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn claim(byte: u8, entry: u32) -> (SpentId, Owner) {
        let owner = Owner {
            bundle: BundleHash([byte; 32]),
            entry,
        };
        (SpentId([byte; 32]), owner)
    }

    #[test]
    fn claims_survive_a_restart_and_a_torn_last_record_is_dropped_and_cut() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("spent");
        let mut store = SpentStore::load(&path).unwrap();
        assert!(store.is_empty());
        store.append(&[claim(1, 0), claim(2, 3)]).unwrap();
        // Claimed again for the same sum: admitted, not written twice.
        assert!(store.admits(&[claim(1, 0)]));
        store.append(&[claim(1, 0)]).unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 2 * RECORD as u64);
        // Another sum's claim on a counted token is not admitted.
        let (id, _) = claim(2, 0);
        assert!(!store.admits(&[(id, claim(9, 9).1)]));
        // A crash in the middle of the next append.
        let mut torn = std::fs::read(&path).unwrap();
        torn.extend_from_slice(&[7; RECORD / 2]);
        std::fs::write(&path, &torn).unwrap();
        let mut store = SpentStore::load(&path).unwrap();
        assert_eq!(store.len(), 2);
        assert_eq!(store.owner(&SpentId([2; 32])), Some(claim(2, 3).1));
        store.append(&[claim(3, 1)]).unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 3 * RECORD as u64);
        assert_eq!(SpentStore::load(&path).unwrap().len(), 3);
    }
}
