//! Contributor evidence kept for the release auditor (issue 26 item 2): the aggregation server
//! keeps every report it multiplies into a sum, with the evidence token it cannot verify, and
//! gives back, per entry of an exported bundle, exactly the reports that entry adds up. Each
//! test checks what it gives back the way the auditor will, with `penrose_core::evidence::count`
//! and the auditor party's key ring, which the server never holds.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::HashSet;
use std::sync::Arc;

use common::*;
use ed25519_dalek::SigningKey;
use penrose_aggregator::admission::Admission;
use penrose_aggregator::export;
use penrose_aggregator::state::{Outcome, State};
use penrose_aggregator::store::{RocksStore, Store};
use penrose_aggregator::validate::validate_body;
use penrose_core::bundle::Bundle;
use penrose_core::counters::CounterId;
use penrose_core::evidence::{
    self, EvidenceError, EvidenceRule, SumEvidence, TokenPeriod, TokensPerEpoch,
};
use penrose_core::fingerprint::FingerprintParams;
use penrose_core::release::ReleaseRule;
use penrose_core::tokens::{KeyRing, SpentId};
use penrose_core::wire::{Day, EvidenceToken};

const TODAY: Day = Day(20_000);
const COUNTER: CounterId = CounterId(4);

fn signing() -> SigningKey {
    SigningKey::from_bytes(&[7; 32])
}

/// A state whose generations hold `per_generation` reports, keeping evidence or not.
fn state(store: &Arc<dyn Store>, per_generation: u64, keep: bool) -> State {
    let mut state = State::open(
        Arc::clone(store),
        KEYS.public_key(),
        FingerprintParams::default(),
        per_generation,
        None,
    )
    .unwrap();
    state.set_keep_evidence(keep);
    state
}

/// `credentials` x 24 reports of one application, each with one evidence token of the auditor
/// party's `ring` (24 per credential, its whole quota), and `lone` reports of another
/// application without evidence.
fn frames(ring: &KeyRing, credentials: usize, lone: usize) -> Vec<Vec<u8>> {
    frames_on(TODAY, ring, credentials, lone)
}

/// [`frames`] of day `day`.
fn frames_on(day: Day, ring: &KeyRing, credentials: usize, lone: usize) -> Vec<Vec<u8>> {
    let mut rng = rng(26 + u64::from(day.0 - TODAY.0));
    let apps = snippets(2, 1);
    let mut out = Vec::new();
    for credential in 0..credentials {
        for token in mint(ring, day, COUNTER, 24, credential as u64) {
            let sent = report_by(
                &KEYS,
                apps[0].1,
                COUNTER,
                random_bins(&mut rng),
                day,
                &mut rng,
            );
            let mut report = decode_report(&sent.frame);
            report.evidence = Some(EvidenceToken(
                token.redeem(&report.token_binding()).encode(),
            ));
            out.push(report_body(report));
        }
    }
    for _ in 0..lone {
        let sent = report_by(
            &KEYS,
            apps[1].1,
            COUNTER,
            random_bins(&mut rng),
            day,
            &mut rng,
        );
        out.push(sent.frame);
    }
    out
}

/// Applies `frames` in batches of 50 and closes the day's epoch.
fn ingest(state: &mut State, frames: &[Vec<u8>]) {
    apply(state, frames, TODAY);
    let prepared = state.prepare_close(TODAY, true);
    prepared.commit().unwrap();
}

/// Applies `frames` of day `day` in batches of 50, leaving the epoch open.
fn apply(state: &mut State, frames: &[Vec<u8>], day: Day) {
    let keys = penrose_aggregator::design_keys::DesignKeys::single(KEYS.public_key().clone());
    for batch in frames.chunks(50) {
        let valid: Vec<_> = batch
            .iter()
            .map(|f| validate_body(f, &keys, day, &Admission::Open).unwrap())
            .collect();
        let outcomes = state.apply(&valid, day).unwrap();
        assert!(outcomes.iter().all(|o| *o == Outcome::Accepted));
    }
}

fn rule(ring: &KeyRing) -> EvidenceRule<'_> {
    EvidenceRule {
        keys: ring,
        cap: TokensPerEpoch::new(TokenPeriod::Day, 24).unwrap(),
    }
}

/// What the auditor would count for each entry of `bundle`.
fn audit(
    bundle: &Bundle,
    evidence: &[SumEvidence],
    ring: &KeyRing,
) -> Vec<Result<evidence::Counted, EvidenceError>> {
    let spent = std::cell::RefCell::new(HashSet::<SpentId>::new());
    bundle
        .entries
        .iter()
        .zip(evidence)
        .map(|(entry, listed)| {
            let counted = evidence::count(listed, entry, KEYS.public_key(), &rule(ring), |id| {
                spent.borrow().contains(id)
            })?;
            spent.borrow_mut().extend(counted.spent.iter().copied());
            Ok(counted)
        })
        .collect()
}

#[test]
fn every_released_sum_comes_with_exactly_its_reports_and_their_evidence() {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> = Arc::new(RocksStore::open(dir.path()).unwrap());
    // Generations of 100 reports: a released sum adds several (at least 217 reports for 10
    // contributors), and each generation's reports must come back with it.
    let mut state = state(&store, 100, true);
    let auditors_ring = token_ring(&[TODAY], &[COUNTER], 99);
    ingest(&mut state, &frames(&auditors_ring, 30, 5));
    let (bundle, _) = export::export(store.as_ref(), ReleaseRule::default(), &signing())
        .unwrap()
        .unwrap();
    let (again, evidence) = export::evidence(store.as_ref(), 1, &signing()).unwrap();
    assert_eq!(again, bundle);
    assert_eq!(evidence.len(), bundle.entries.len());
    assert!(
        bundle.entries.len() >= 2,
        "{} entries",
        bundle.entries.len()
    );
    let counted = audit(&bundle, &evidence, &auditors_ring);
    let mut evidenced = 0;
    for (entry, counted) in bundle.entries.iter().zip(&counted) {
        let counted = counted.as_ref().unwrap();
        assert_eq!(counted.reports, entry.reports);
        assert_eq!(counted.evidenced, entry.reports);
        assert!(counted.contributors >= 10, "{counted:?}");
        evidenced += counted.evidenced;
    }
    // Every report of the application in exactly one released sum's evidence; the lone
    // application's five are withheld and listed nowhere.
    assert_eq!(evidenced, 720);
    // The evidence of one sum is not another's.
    let swapped = evidence::count(
        &evidence[1],
        &bundle.entries[0],
        KEYS.public_key(),
        &rule(&auditors_ring),
        |_| false,
    );
    assert!(swapped.is_err(), "{swapped:?}");
    // After a restart the evidence is still there, the same.
    drop(state);
    drop(store);
    let store: Arc<dyn Store> = Arc::new(RocksStore::open(dir.path()).unwrap());
    let (_, reopened) = export::evidence(store.as_ref(), 1, &signing()).unwrap();
    assert_eq!(reopened, evidence);
}

#[test]
fn a_server_that_keeps_no_evidence_gives_the_auditor_nothing_to_count() {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> = Arc::new(RocksStore::open(dir.path()).unwrap());
    let mut state = state(&store, 1000, false);
    let auditors_ring = token_ring(&[TODAY], &[COUNTER], 99);
    ingest(&mut state, &frames(&auditors_ring, 10, 0));
    let (bundle, _) = export::export(store.as_ref(), ReleaseRule::default(), &signing())
        .unwrap()
        .unwrap();
    let (_, evidence) = export::evidence(store.as_ref(), 1, &signing()).unwrap();
    assert_eq!(bundle.entries.len(), 1);
    assert!(evidence[0].reports().is_empty());
    let counted = audit(&bundle, &evidence, &auditors_ring);
    assert!(matches!(
        counted[0],
        Err(EvidenceError::Counts {
            what: "reports",
            listed: 0,
            claimed: 240
        })
    ));
}

#[test]
fn tokens_of_another_issuer_count_nothing_at_the_auditor() {
    // The operator's own issuer (or its admission ring) is not the auditor's: evidence made
    // with it verifies nothing, though every product checks.
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> = Arc::new(RocksStore::open(dir.path()).unwrap());
    let mut state = state(&store, 1000, true);
    let operators_ring = token_ring(&[TODAY], &[COUNTER], 5);
    ingest(&mut state, &frames(&operators_ring, 10, 0));
    export::export(store.as_ref(), ReleaseRule::default(), &signing())
        .unwrap()
        .unwrap();
    let (bundle, evidence) = export::evidence(store.as_ref(), 1, &signing()).unwrap();
    let auditors_ring = token_ring(&[TODAY], &[COUNTER], 99);
    let counted = audit(&bundle, &evidence, &auditors_ring);
    let counted = counted[0].as_ref().unwrap();
    assert_eq!((counted.reports, counted.evidenced), (240, 0));
    assert_eq!(counted.contributors, 0);
}

#[test]
fn the_evidence_file_names_its_bundle_and_holds_each_entrys_evidence_in_order() {
    use penrose_core::bundle::BundleHash;
    use penrose_core::evidence_file::{EVIDENCE_FILE_HEADER_BYTES, EvidenceFileHeader, entry_len};
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> = Arc::new(RocksStore::open(dir.path()).unwrap());
    let mut state = state(&store, 100, true);
    let auditors_ring = token_ring(&[TODAY], &[COUNTER], 99);
    ingest(&mut state, &frames(&auditors_ring, 20, 3));
    let (bundle, bytes) = export::export(store.as_ref(), ReleaseRule::default(), &signing())
        .unwrap()
        .unwrap();
    let (_, lists) = export::evidence(store.as_ref(), 1, &signing()).unwrap();
    let mut file = Vec::new();
    let path = dir.path().join("0001.evidence");
    let written = export::write_evidence(store.as_ref(), 1, &signing(), &mut file, &path).unwrap();
    assert_eq!(written.bytes, file.len() as u64);
    assert_eq!(written.entries, bundle.entries.len() as u64);
    assert_eq!((written.reports, written.with_tokens), (480, 480));
    let (head, mut rest) = file.split_at(EVIDENCE_FILE_HEADER_BYTES);
    let header = EvidenceFileHeader::decode(head.try_into().unwrap()).unwrap();
    assert_eq!(header.bundle, BundleHash::of(&bytes));
    assert_eq!(header.entries as usize, bundle.entries.len());
    for list in &lists {
        let len = entry_len(rest[..4].try_into().unwrap()).unwrap();
        assert_eq!(&rest[4..4 + len], list.encode().as_slice());
        rest = &rest[4 + len..];
    }
    assert!(rest.is_empty(), "nothing after the last entry");
    // A bundle never exported has no evidence, and nothing is written for it.
    let mut none = Vec::new();
    assert!(matches!(
        export::write_evidence(store.as_ref(), 2, &signing(), &mut none, &path),
        Err(export::ExportError::NoSuchBundle { seq: 2, last: 1 })
    ));
    assert!(none.is_empty());
}

#[test]
fn forgetting_a_bundles_evidence_deletes_its_epochs_rows_and_no_other() {
    use penrose_aggregator::store::Table;
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> = Arc::new(RocksStore::open(dir.path()).unwrap());
    let mut state = state(&store, 100, true);
    let ring = token_ring(&[TODAY, Day(TODAY.0 + 1)], &[COUNTER], 99);
    ingest(&mut state, &frames(&ring, 12, 2));
    let (bundle, _) = export::export(store.as_ref(), ReleaseRule::default(), &signing())
        .unwrap()
        .unwrap();
    // The next day's reports, in an epoch still open.
    apply(
        &mut state,
        &frames_on(Day(TODAY.0 + 1), &ring, 3, 0),
        Day(TODAY.0 + 1),
    );
    let rows = || {
        let mut n = 0u64;
        store
            .scan(&[Table::Evidence], &mut |_, _, _| {
                n += 1;
                Ok(())
            })
            .unwrap();
        n
    };
    assert_eq!(rows(), 12 * 24 + 2 + 3 * 24);
    assert!(matches!(
        export::epochs_exported_through(store.as_ref(), 2),
        Err(export::ExportError::NoSuchBundle { seq: 2, last: 1 })
    ));
    let epochs = export::epochs_exported_through(store.as_ref(), 1).unwrap();
    assert_eq!(epochs.len(), 1);
    // Every row of the released epoch goes, the withheld lone reports' too; the open epoch's
    // stay.
    let deleted = penrose_aggregator::evidence::forget(store.as_ref(), &epochs).unwrap();
    assert_eq!(deleted, 12 * 24 + 2);
    assert_eq!(rows(), 3 * 24);
    let (_, lists) = export::evidence(store.as_ref(), 1, &signing()).unwrap();
    assert_eq!(lists.len(), bundle.entries.len());
    assert!(lists.iter().all(|l| l.reports().is_empty()));
    assert_eq!(
        penrose_aggregator::evidence::forget(store.as_ref(), &epochs).unwrap(),
        0,
        "forgetting again deletes nothing"
    );
}
