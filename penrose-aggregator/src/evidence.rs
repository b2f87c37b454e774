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
//! report, against about 60 bytes of Seen rows. Rows are not deleted yet; they go when the
//! auditor's answer for their sum is in, which is not wired (docs/crypto.md).

use penrose_core::bundle::Generation;
use penrose_core::evidence::{EvidenceError, EvidencedReport, SumEvidence};
use penrose_core::wire::{Report, ReportId};

use crate::aggregate::{ASH_KEY_BYTES, AshRecord, SumKey};
use crate::store::{Store, StoreError, Table};

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
