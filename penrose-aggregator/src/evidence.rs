//! Contributor evidence kept for the release auditor (issue 26 item 2;
//! `penrose_core::evidence`, docs/crypto.md "Contributor evidence").
//!
//! The auditor counts a released sum's contributors itself, from evidence tokens only it can
//! verify, and checks that the reports it is shown multiply to the released sum. So the
//! aggregation server, which cannot verify those tokens, keeps every report it multiplies into
//! a sum: its binding (`Report::token_binding`, ciphertexts included) and its evidence token,
//! if it carried one, in the Evidence table, in the same synced write as the report
//! (`crate::state`). A row's key is the sum's ASH key (class, architecture, catalogue,
//! counter, epoch, key slot, generation) and the report id, so one generation's reports are
//! one key range; [`sum_evidence`] reads the generations a released sum was made of.
//!
//! Keeping is off unless the server is told to (`State::set_keep_evidence`): about 1.4 KB a
//! report, against about 60 bytes of Seen rows. Rows go when the operator says the auditor has
//! answered a bundle ([`forget`], `penrose-aggregator forget-evidence --through SEQ`): every
//! row of the epochs released in it and before, withheld sums' included (a closed epoch is
//! never released again).

use std::collections::{BTreeSet, HashSet};

use penrose_core::bundle::{EpochId, Generation};
use penrose_core::evidence::{EvidenceError, EvidencedReport, SumEvidence};
use penrose_core::wire::{Report, ReportId};

use crate::aggregate::{ASH_KEY_BYTES, AshRecord, SumKey};
use crate::store::{Store, StoreError, Table, WriteSet};

/// Bytes of an Evidence row key: the ASH key and the report id.
pub const EVIDENCE_KEY_BYTES: usize = ASH_KEY_BYTES + 16;

/// The row key of `report` in generation `generation` of `key`.
pub fn row_key(key: SumKey, generation: Generation, report: &ReportId) -> Vec<u8> {
    let mut out = Vec::with_capacity(EVIDENCE_KEY_BYTES);
    out.extend_from_slice(&AshRecord::store_key(key, generation));
    out.extend_from_slice(&report.0);
    out
}

/// The row value of `report`: its binding and evidence token.
pub fn row_value(report: &Report) -> Vec<u8> {
    EvidencedReport::of(report).to_bytes()
}

/// Why evidence could not be read.
#[derive(Debug, thiserror::Error)]
pub enum EvidenceReadError {
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A row does not decode (a damaged store).
    #[error("evidence row of a sum does not decode: {0}")]
    Row(#[from] EvidenceError),
}

/// Every report kept for the generations `pieces`, in key order: the evidence of the released
/// sum they were added into.
pub fn sum_evidence(
    store: &dyn Store,
    pieces: &[(SumKey, Generation)],
) -> Result<SumEvidence, EvidenceReadError> {
    let mut evidence = SumEvidence::default();
    let mut bad = None;
    for &(key, generation) in pieces {
        let prefix = AshRecord::store_key(key, generation);
        store.scan_prefix(Table::Evidence, &prefix, &mut |_, _, value| {
            match EvidencedReport::from_bytes(value) {
                Ok(report) => evidence.push(report),
                Err(e) => bad = Some(e),
            }
            Ok(())
        })?;
    }
    match bad {
        Some(e) => Err(e.into()),
        None => Ok(evidence),
    }
}

/// The epoch of an Evidence row key (bytes 10..14 of its ASH key).
fn row_epoch(key: &[u8]) -> Option<EpochId> {
    let bytes: [u8; 4] = key.get(10..14)?.try_into().ok()?;
    Some(EpochId(u32::from_be_bytes(bytes)))
}

/// Deletes every Evidence row of `epochs`, one key range per generation, in one synced write;
/// the rows deleted.
pub fn forget(store: &dyn Store, epochs: &BTreeSet<EpochId>) -> Result<u64, StoreError> {
    let mut rows = 0u64;
    let mut generations: HashSet<Vec<u8>> = HashSet::new();
    store.scan(&[Table::Evidence], &mut |_, key, _| {
        if row_epoch(key).is_some_and(|e| epochs.contains(&e)) {
            rows += 1;
            generations.insert(key[..ASH_KEY_BYTES].to_vec());
        }
        Ok(())
    })?;
    if generations.is_empty() {
        return Ok(0);
    }
    let mut set = WriteSet::new();
    for prefix in generations {
        // Past every row key of the generation: the ASH key and 16 bytes of report id.
        let mut end = prefix.clone();
        end.extend_from_slice(&[0xff; 17]);
        set.delete_range(Table::Evidence, prefix, end);
    }
    store.write(set)?;
    Ok(rows)
}
