//! Release: epochs, the contributor threshold, the bundle chain, re-export, backups as new
//! chains, exact copies folded, the day check, and restarts. Most tests drive the state with an
//! explicit day (so that the clock cannot move under them); those about the whole pipeline go
//! through `Ingest` with the server's own day.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::HashSet;
use std::num::NonZeroU64;
use std::sync::Arc;

use common::*;
use ed25519_dalek::SigningKey;
use penrose_aggregator::admission::Admission;
use penrose_aggregator::control::reply::BackupReply;
use penrose_aggregator::control::{self, Admin, Request};
use penrose_aggregator::epochs::EpochPolicy;
use penrose_aggregator::export::{self, ExportError};
use penrose_aggregator::state::{Outcome, State, StateError};
use penrose_aggregator::store::{RocksStore, Store};
use penrose_aggregator::validate::{ValidReport, validate_body};
use penrose_core::bundle::{Bundle, BundleEntry, BundleHash, EpochId, EpochKind, InstanceId};
use penrose_core::counters::{BIN_COUNT, CounterId};
use penrose_core::fingerprint::{Fingerprint, FingerprintParams};
use penrose_core::paillier::ACCUMULATOR_REPORT_BOUND;
use penrose_core::release::ReleaseRule;
use penrose_core::wire::{AckStatus, Day, RejectReason};
use penrose_host::clock::today;

/// The day the state-level tests run on.
const TODAY: Day = Day(20_000);

fn open(store: &Arc<dyn Store>, policy: Option<EpochPolicy>) -> Result<State, StateError> {
    State::open(
        Arc::clone(store),
        KEYS.public_key(),
        FingerprintParams::default(),
        ACCUMULATOR_REPORT_BOUND,
        policy,
    )
}

fn rocks(path: &std::path::Path) -> Arc<dyn Store> {
    Arc::new(RocksStore::open(path).unwrap())
}

fn signing() -> SigningKey {
    SigningKey::from_bytes(&[7; 32])
}

fn export_next(store: &Arc<dyn Store>) -> Option<(Bundle, Vec<u8>)> {
    export::export(store.as_ref(), ReleaseRule::default(), &signing()).unwrap()
}

/// `n` reports of `counter` for `snippet`, stamped `day`.
fn reports(
    n: usize,
    snippet: Fingerprint,
    counter: u16,
    day: Day,
    rng: &mut impl rand::RngCore,
) -> Vec<Sent> {
    (0..n)
        .map(|_| {
            let bins = random_bins(rng);
            report_by(&KEYS, snippet, CounterId(counter), bins, day, rng)
        })
        .collect()
}

fn valid(sent: &[Sent], today: Day) -> Vec<ValidReport> {
    sent.iter()
        .map(|s| {
            validate_body(
                &s.frame,
                &penrose_aggregator::design_keys::DesignKeys::single(KEYS.public_key().clone()),
                today,
                &Admission::Open,
            )
            .unwrap()
        })
        .collect()
}

/// Applies `sent` as one batch on `today`; every report must be accepted.
fn accept(state: &mut State, sent: &[Sent], today: Day) {
    let outcomes = state.apply(&valid(sent, today), today).unwrap();
    assert!(
        outcomes.iter().all(|o| *o == Outcome::Accepted),
        "{outcomes:?}"
    );
}

/// The operator's close-now.
fn close_now(state: &mut State, today: Day) -> Vec<EpochId> {
    let prepared = state.prepare_close(today, true);
    let closed = prepared.closed().iter().map(|e| e.id).collect();
    prepared.commit().unwrap();
    closed
}

/// Plain bin sums of `sent`.
fn plain_sum(sent: &[&Sent]) -> Vec<u64> {
    let mut out = vec![0u64; BIN_COUNT];
    for s in sent {
        for (o, b) in out.iter_mut().zip(s.bins.iter()) {
            *o += u64::from(*b);
        }
    }
    out
}

/// A store with two bundles exported, by day on [`TODAY`]:
/// - bundle 1: epoch TODAY, closed by the operator, 100 reports of counter 4 and 5 of
///   counter 5: both sums below the threshold (217 reports for 10 contributors).
/// - bundle 2: epoch TODAY + 1 (reports of TODAY after its epoch closed join the next one),
///   230 reports of counter 4 (released) and 3 of counter 5 (withheld).
struct TwoBundles {
    _dir: tempfile::TempDir,
    store: Arc<dyn Store>,
    state: State,
    snippet: Fingerprint,
    second: Vec<Sent>,
    b1: (Bundle, Vec<u8>),
    b2: (Bundle, Vec<u8>),
}

fn two_bundles(seed: u64) -> TwoBundles {
    let dir = tempfile::tempdir().unwrap();
    let store = rocks(dir.path());
    let mut state = open(&store, None).unwrap();
    let snippet = snippets(1, 1)[0].1;
    let mut rng = rng(seed);
    let mut first = reports(100, snippet, 4, TODAY, &mut rng);
    first.extend(reports(5, snippet, 5, TODAY, &mut rng));
    accept(&mut state, &first, TODAY);
    assert!(
        export_next(&store).is_none(),
        "an open epoch is never exported"
    );
    assert_eq!(close_now(&mut state, TODAY), [EpochId(TODAY.0)]);
    let b1 = export_next(&store).unwrap();

    let mut second = reports(230, snippet, 4, TODAY, &mut rng);
    second.extend(reports(3, snippet, 5, TODAY, &mut rng));
    for chunk in second.chunks(64) {
        accept(&mut state, chunk, TODAY);
    }
    assert_eq!(close_now(&mut state, TODAY), [EpochId(TODAY.0 + 1)]);
    let b2 = export_next(&store).unwrap();
    TwoBundles {
        _dir: dir,
        store,
        state,
        snippet,
        second,
        b1,
        b2,
    }
}

#[test]
fn sums_below_the_threshold_are_withheld_and_released_sums_never_overlap() {
    let mut t = two_bundles(21);
    let (b1, b2) = (&t.b1.0, &t.b2.0);

    // Bundle 1: the epoch is released with no sum in it; both are counted as withheld.
    assert_eq!(b1.epochs.len(), 1);
    let e1 = b1.epochs[0];
    assert_eq!(
        (e1.id, e1.reports, e1.withheld_sums, e1.withheld_reports),
        (EpochId(TODAY.0), 105, 2, 105)
    );
    assert!(
        b1.entries.is_empty(),
        "a sum below the threshold was released"
    );

    // Bundle 2: the next epoch; its counter-4 sum passes and is exactly its 230 reports.
    assert_eq!(b2.epochs.len(), 1);
    let e2 = b2.epochs[0];
    assert_eq!(
        (e2.id, e2.first_day, e2.last_day, e2.reports),
        (EpochId(TODAY.0 + 1), TODAY, TODAY, 233)
    );
    assert_eq!((e2.withheld_sums, e2.withheld_reports), (1, 3));
    assert_eq!(b2.entries.len(), 1);
    let entry = &b2.entries[0];
    assert_eq!((entry.counter, entry.epoch), (CounterId(4), e2.id));
    let counter4: Vec<&Sent> = t.second.iter().filter(|s| s.counter.0 == 4).collect();
    assert_eq!(entry.reports, 230);
    assert_eq!(
        entry.samples,
        counter4
            .iter()
            .map(|s| u64::from(s.bins.iter().sum::<u32>()))
            .sum::<u64>()
    );
    assert_eq!(
        decrypt_one(&KEYS, entry),
        plain_sum(&counter4),
        "the released sum is exactly the reports of its epoch"
    );

    // No two released sums overlap: every epoch once, every report in exactly one.
    let mut epochs = HashSet::new();
    let mut keys = HashSet::new();
    let mut reports_in_epochs = 0;
    for b in [b1, b2] {
        for e in &b.epochs {
            assert!(epochs.insert(e.id));
            reports_in_epochs += e.reports;
        }
        for x in &b.entries {
            assert!(keys.insert(x.key()));
        }
    }
    assert_eq!(reports_in_epochs, 105 + 233);

    // Nothing closed since: no bundle. Reports of an open epoch: still no bundle.
    assert!(export_next(&t.store).is_none());
    let mut rng = rng(22);
    let more = reports(10, t.snippet, 4, TODAY, &mut rng);
    accept(&mut t.state, &more, TODAY);
    assert!(
        export_next(&t.store).is_none(),
        "an open epoch is never exported"
    );
    let open_sums: Vec<BundleEntry> = export::all_sums(t.store.as_ref())
        .unwrap()
        .into_iter()
        .filter(|e| e.epoch == EpochId(TODAY.0 + 2))
        .collect();
    assert_eq!(open_sums.iter().map(|e| e.reports).sum::<u64>(), 10);
}

#[test]
fn reexport_rebuilds_bundle_1_byte_for_byte_after_bundle_2() {
    let t = two_bundles(23);
    let key = signing();
    let again = export::reexport(t.store.as_ref(), 1, &key).unwrap();
    assert_eq!(again.1, t.b1.1);
    assert_eq!(again.0, t.b1.0);
    let again = export::reexport(t.store.as_ref(), 2, &key).unwrap();
    assert_eq!(again.1, t.b2.1);
    // And after a restart.
    let TwoBundles {
        _dir, store, state, ..
    } = t;
    drop(state);
    let _state = open(&store, None).unwrap();
    let again = export::reexport(store.as_ref(), 1, &key).unwrap();
    assert_eq!(again.1, t.b1.1);
    for seq in [0, 3] {
        assert!(
            matches!(
                export::reexport(store.as_ref(), seq, &key),
                Err(ExportError::NoSuchBundle { seq: s, last: 2 }) if s == seq
            ),
            "seq {seq}"
        );
    }
}

#[test]
fn bundles_chain_by_the_hash_of_the_previous_bundle_under_one_instance() {
    let t = two_bundles(24);
    let trusted = signing().verifying_key();
    let b1 = Bundle::verify(&t.b1.1, Some(&trusted)).unwrap();
    let b2 = Bundle::verify(&t.b2.1, Some(&trusted)).unwrap();
    assert_eq!((b1.link.seq, b2.link.seq), (1, 2));
    assert_eq!(b1.link.prev, BundleHash::default());
    assert_eq!(b2.link.prev, BundleHash::of(&t.b1.1));
    assert_ne!(b2.link.prev, BundleHash::of(&t.b2.1));
    assert_eq!(b1.link.instance, t.state.instance());
    assert_eq!(b2.link.instance, t.state.instance());
    assert_eq!((b1.link.parent, b2.link.parent), (None, None));
    assert_eq!(b1.rule.epochs, EpochKind::Day);
    assert_eq!((b1.rule.threshold, b1.rule.cap), (10, 24));
}

#[test]
fn count_epochs_close_as_they_fill_and_only_closed_ones_are_exported() {
    let dir = tempfile::tempdir().unwrap();
    let store = rocks(dir.path());
    let policy = EpochPolicy::Count(NonZeroU64::new(5).unwrap());
    let mut state = open(&store, Some(policy)).unwrap();
    let snippet = snippets(1, 1)[0].1;
    let mut rng = rng(25);
    let sent = reports(12, snippet, 4, TODAY, &mut rng);
    for s in &sent {
        accept(&mut state, std::slice::from_ref(s), TODAY);
    }
    let open_epochs: Vec<(EpochId, u64)> =
        state.epochs().open().map(|e| (e.id, e.reports)).collect();
    assert_eq!(open_epochs, [(EpochId(3), 2)]);
    let (bundle, _) = export_next(&store).unwrap();
    assert_eq!(bundle.rule.epochs, EpochKind::Count);
    let released: Vec<(EpochId, u64)> = bundle.epochs.iter().map(|e| (e.id, e.reports)).collect();
    assert_eq!(released, [(EpochId(1), 5), (EpochId(2), 5)]);
    assert!(
        bundle.entries.is_empty(),
        "5 reports are below the threshold"
    );
    assert!(export_next(&store).is_none());
    // A batch that fills the open epoch closes it with the batch: all of it is in it.
    accept(&mut state, &reports(6, snippet, 4, TODAY, &mut rng), TODAY);
    let (bundle, _) = export_next(&store).unwrap();
    let released: Vec<(EpochId, u64)> = bundle.epochs.iter().map(|e| (e.id, e.reports)).collect();
    assert_eq!(released, [(EpochId(3), 8)]);
    assert_eq!(bundle.link.seq, 2);
}

/// Exact copies of a counted report (the same ciphertext bytes under any report id) are
/// answered Duplicate and counted once. A re-encryption of the same plaintext is a new
/// ciphertext and is counted again: the server cannot tell it from another agent's report of
/// the same histogram. That is the limit of folding by digest, which anonymous admission
/// tokens (a later issue) will address by bounding what one agent can submit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exact_copies_under_a_fresh_report_id_are_folded_but_re_encryptions_count() {
    let dir = tempfile::tempdir().unwrap();
    let (ingest, writer, store) = start_default(dir.path());
    let snippet = snippets(1, 1)[0].1;
    let mut rng = rng(26);
    let bins = random_bins(&mut rng);
    let original = report_by(&KEYS, snippet, CounterId(4), bins, today(), &mut rng);
    assert_eq!(
        ingest.handle(original.frame.clone()).await.status,
        AckStatus::Accepted
    );
    let before = dump(store.as_ref());
    for i in 0..3u8 {
        let copy = with_report_id(&original.frame, [0xc0 + i; 16]);
        let ack = ingest.handle(copy).await;
        assert_eq!(ack.report_id.0, [0xc0 + i; 16]);
        assert_eq!(ack.status, AckStatus::Duplicate, "copy {i}");
    }
    assert_eq!(
        dump(store.as_ref()),
        before,
        "a folded copy changed the store"
    );
    assert_eq!(ingest.state().accepted(), 1);

    let again = report_by(&KEYS, snippet, CounterId(4), bins, today(), &mut rng);
    assert_eq!(
        ingest.handle(again.frame.clone()).await.status,
        AckStatus::Accepted,
        "a re-encryption is a new ciphertext"
    );
    assert_eq!(ingest.state().accepted(), 2);
    let sums = decrypt_store(store.as_ref());
    let class = ingest.state().class_of(&snippet.hash).unwrap().unwrap();
    let (got, reports, _) = &sums[&(class, CounterId(4))];
    assert_eq!(*reports, 2);
    assert_eq!(*got, plain_sum(&[&original, &again]));
    drop(ingest);
    writer.join().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reports_more_than_a_day_off_are_rejected_and_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (ingest, writer, store) = start_default(dir.path());
    let snippet = snippets(1, 1)[0].1;
    let mut rng = rng(27);
    let now = today();
    let first = report_by(
        &KEYS,
        snippet,
        CounterId(4),
        random_bins(&mut rng),
        now,
        &mut rng,
    );
    assert_eq!(ingest.handle(first.frame).await.status, AckStatus::Accepted);
    let before = dump(store.as_ref());
    for day in [Day(now.0 - 2), Day(now.0 + 2), Day(now.0 - 30), Day(0)] {
        let s = report_by(
            &KEYS,
            snippet,
            CounterId(4),
            random_bins(&mut rng),
            day,
            &mut rng,
        );
        assert_eq!(
            ingest.handle(s.frame).await.status,
            AckStatus::Rejected(RejectReason::DayOutOfRange),
            "day {} on day {}",
            day.0,
            now.0
        );
    }
    assert_eq!(
        dump(store.as_ref()),
        before,
        "a rejected report changed the store"
    );
    assert_eq!(
        ingest.metrics().rejected_count(RejectReason::DayOutOfRange),
        4
    );
    for day in [Day(now.0 - 1), Day(now.0 + 1)] {
        let s = report_by(
            &KEYS,
            snippet,
            CounterId(4),
            random_bins(&mut rng),
            day,
            &mut rng,
        );
        assert_eq!(
            ingest.handle(s.frame).await.status,
            AckStatus::Accepted,
            "day {}",
            day.0
        );
    }
    assert_eq!(ingest.state().accepted(), 3);
    drop(ingest);
    writer.join().unwrap();
}

/// The writer checks the day again: a report validated just before the server's day turned
/// twice is refused by the batch and changes nothing.
#[test]
fn the_writer_refuses_a_report_whose_day_passed_since_validation() {
    let dir = tempfile::tempdir().unwrap();
    let store = rocks(dir.path());
    let mut state = open(&store, None).unwrap();
    let snippet = snippets(1, 1)[0].1;
    let mut rng = rng(28);
    let sent = reports(1, snippet, 4, TODAY, &mut rng);
    let checked = valid(&sent, TODAY);
    let later = Day(TODAY.0 + 2);
    // The server's tick at the later day (which expires deduplication rows of past days and
    // records that) comes first, so that what follows is the report's doing alone.
    state.prepare_close(later, false).commit().unwrap();
    let before = dump(store.as_ref());
    assert_eq!(
        state.apply(&checked, later).unwrap(),
        [Outcome::DayOutOfRange]
    );
    assert_eq!(dump(store.as_ref()), before);
    assert_eq!(state.accepted(), 0);
}

#[test]
fn closed_epochs_stay_closed_across_a_restart_and_late_reports_join_the_next() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("db");
    let store = rocks(&db);
    let mut state = open(&store, None).unwrap();
    let snippet = snippets(1, 1)[0].1;
    let mut rng = rng(29);
    accept(&mut state, &reports(20, snippet, 4, TODAY, &mut rng), TODAY);
    assert_eq!(close_now(&mut state, TODAY), [EpochId(TODAY.0)]);
    let closed_sums = |store: &Arc<dyn Store>| -> Vec<BundleEntry> {
        export::all_sums(store.as_ref())
            .unwrap()
            .into_iter()
            .filter(|e| e.epoch == EpochId(TODAY.0))
            .collect()
    };
    let sums_before = closed_sums(&store);
    // The bundle before the restart; the store must rebuild it byte for byte after.
    let (before, before_bytes) = export_next(&store).unwrap();

    drop(state);
    let mut state = open(&store, None).unwrap();
    assert_eq!(state.epochs().closed_through(), Some(EpochId(TODAY.0)));
    assert_eq!(state.epochs().open().count(), 0, "a closed epoch reopened");
    assert_eq!(state.sums().open_count(), 0);
    // A late report of the closed day joins the first open epoch.
    accept(&mut state, &reports(1, snippet, 4, TODAY, &mut rng), TODAY);
    let open_epochs: Vec<_> = state
        .epochs()
        .open()
        .map(|e| (e.id, e.first_day, e.last_day, e.reports))
        .collect();
    assert_eq!(open_epochs, [(EpochId(TODAY.0 + 1), TODAY, TODAY, 1)]);
    assert_eq!(
        closed_sums(&store),
        sums_before,
        "a closed epoch's sums changed"
    );
    // Nothing new to release, and the same bundle as before the restart, byte for byte.
    assert!(export_next(&store).is_none());
    let (after, after_bytes) = export::reexport(store.as_ref(), 1, &signing()).unwrap();
    assert_eq!(after, before);
    assert_eq!(after_bytes, before_bytes);
    drop(state);
    let state = open(&store, None).unwrap();
    let open_epochs: Vec<_> = state.epochs().open().map(|e| (e.id, e.reports)).collect();
    assert_eq!(open_epochs, [(EpochId(TODAY.0 + 1), 1)]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_is_a_new_chain_that_does_not_re_export_its_parents_epochs() {
    let dir = tempfile::tempdir().unwrap();
    let (ingest, writer, store) = start_default(&dir.path().join("db"));
    let original = ingest.state().instance();
    let snippet = snippets(1, 1)[0].1;
    let mut rng = rng(30);
    for s in reports(3, snippet, 4, today(), &mut rng) {
        assert_eq!(ingest.handle(s.frame).await.status, AckStatus::Accepted);
    }
    let first_epoch = close_all(&ingest).await;
    assert_eq!(first_epoch.len(), 1);
    let (b1, _) = export_next(&store).unwrap();
    assert_eq!((b1.link.instance, b1.link.seq), (original, 1));
    for s in reports(2, snippet, 4, today(), &mut rng) {
        assert_eq!(ingest.handle(s.frame).await.status, AckStatus::Accepted);
    }

    let admin = Admin {
        ingest: ingest.clone(),
        store: Arc::clone(&store),
        signing: signing(),
        release: ReleaseRule::default(),
        serving: true,
    };
    let backup = dir.path().join("backup");
    let request = Request::Backup {
        dir: backup.clone(),
    };
    let response = tokio::task::spawn_blocking(move || control::execute(&admin, &request))
        .await
        .unwrap()
        .unwrap();
    let response = BackupReply::try_from(response.reply).unwrap();
    assert_eq!(response.parent, original.to_string());

    let copy = rocks(&backup);
    let mut copy_state = open(&copy, None).unwrap();
    let new = copy_state.instance();
    assert_ne!(new, original);
    assert_eq!(response.instance, new.to_string());
    // Every epoch the copy holds is released elsewhere: the exported one and the open one.
    let open_at_backup = ingest
        .state()
        .epochs()
        .open()
        .map(|e| e.id.0)
        .collect::<Vec<_>>();
    let mut held: Vec<u32> = open_at_backup.clone();
    held.push(first_epoch[0].id.0);
    held.sort();
    assert_eq!(response.released_elsewhere, held);
    assert!(export_next(&copy).is_none());
    // The copy's own report joins an epoch of its own; the parent's reports never leave it.
    let copy_only = reports(1, snippet, 4, today(), &mut rng);
    accept(&mut copy_state, &copy_only, today());
    let closed = close_now(&mut copy_state, today());
    assert_eq!(closed.len(), 1);
    assert!(
        !held.contains(&closed[0].0),
        "{closed:?} reused a parent's epoch"
    );
    let (c1, c1_bytes) = export_next(&copy).unwrap();
    let c1_verified = Bundle::verify(&c1_bytes, Some(&signing().verifying_key())).unwrap();
    assert_eq!(c1_verified, c1);
    assert_eq!(c1.link.instance, new);
    assert_eq!(c1.link.parent, Some(original));
    assert_eq!(c1.link.seq, 1);
    assert_eq!(c1.link.prev, BundleHash::default());
    let epochs: Vec<EpochId> = c1.epochs.iter().map(|e| e.id).collect();
    assert_eq!(epochs, closed);
    assert_eq!(c1.epochs[0].reports, 1, "only the copy's own report");
    drop(copy_state);
    drop(copy);

    // The original's chain goes on unchanged, with the reports it held at backup time.
    for s in reports(1, snippet, 4, today(), &mut rng) {
        assert_eq!(ingest.handle(s.frame).await.status, AckStatus::Accepted);
    }
    close_all(&ingest).await;
    let (b2, _) = export_next(&store).unwrap();
    assert_eq!(
        (b2.link.instance, b2.link.parent, b2.link.seq),
        (original, None, 2)
    );
    assert_ne!(InstanceId::default(), original);
    // Across both chains every report is in exactly one bundle: 3 + 2 + 1 + 1.
    let released: u64 = [&b1, &b2, &c1]
        .iter()
        .flat_map(|b| b.epochs.iter().map(|e| e.reports))
        .sum();
    assert_eq!(released, 7);
    drop(ingest);
    writer.join().unwrap();
}

/// Reports per chain: the sum of its bundles' epoch summaries, after every epoch is closed.
fn released_reports(store: &Arc<dyn Store>, state: &mut State) -> u64 {
    close_now(state, TODAY);
    let mut total = 0;
    while let Some((bundle, _)) = export_next(store) {
        total += bundle.epochs.iter().map(|e| e.reports).sum::<u64>();
    }
    total
}

/// A backup of `store` made a new instance, as `penrose-aggregator backup` does, opened.
fn backup_as_served(store: &Arc<dyn Store>, to: &std::path::Path) -> (Arc<dyn Store>, State) {
    store.backup(to).unwrap();
    let copy = rocks(to);
    penrose_aggregator::copies::make_new_instance(copy.as_ref()).unwrap();
    let state = open(&copy, None).unwrap();
    (copy, state)
}

#[test]
fn backups_at_two_moments_never_release_a_report_twice_in_any_chain() {
    // The difference attack: a backup before and one after some reports, each served and
    // exported on its own, then archived apart. Every chain is counted, not one.
    let dir = tempfile::tempdir().unwrap();
    let store = rocks(&dir.path().join("db"));
    let mut state = open(&store, None).unwrap();
    let snippet = snippets(1, 1)[0].1;
    let mut rng = rng(31);
    accept(&mut state, &reports(4, snippet, 4, TODAY, &mut rng), TODAY);
    let (copy1, mut state1) = backup_as_served(&store, &dir.path().join("copy1"));
    accept(&mut state, &reports(3, snippet, 4, TODAY, &mut rng), TODAY);
    let (copy2, mut state2) = backup_as_served(&store, &dir.path().join("copy2"));
    accept(&mut state, &reports(2, snippet, 4, TODAY, &mut rng), TODAY);
    accept(&mut state1, &reports(1, snippet, 4, TODAY, &mut rng), TODAY);
    accept(&mut state2, &reports(1, snippet, 4, TODAY, &mut rng), TODAY);

    let per_chain = [
        released_reports(&store, &mut state),
        released_reports(&copy1, &mut state1),
        released_reports(&copy2, &mut state2),
    ];
    assert_eq!(
        per_chain,
        [9, 1, 1],
        "reports per chain: original, copy 1, copy 2"
    );
}

/// Copies every file under `from` into `to` (what `cp -a` of a stopped store makes).
fn copy_tree(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        match entry.file_type().unwrap().is_dir() {
            true => copy_tree(&entry.path(), &target),
            false => {
                std::fs::copy(entry.path(), &target).unwrap();
            }
        }
    }
}

#[test]
fn a_directory_copied_around_the_product_is_refused_until_adopted() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let store = rocks(&data.join("db"));
    let mut state = open(&store, None).unwrap();
    let snippet = snippets(1, 1)[0].1;
    let mut rng = rng(32);
    accept(&mut state, &reports(5, snippet, 4, TODAY, &mut rng), TODAY);
    drop(state);
    drop(store);
    let copied = dir.path().join("copied");
    copy_tree(&data, &copied);

    // Neither serve nor export takes the copy.
    let copy = rocks(&copied.join("db"));
    assert!(matches!(open(&copy, None), Err(StateError::Copied { .. })));
    assert!(matches!(
        export::export(copy.as_ref(), ReleaseRule::default(), &signing()),
        Err(ExportError::State(StateError::Copied { .. }))
    ));
    drop(copy);

    // The CLI adopts the copy, and refuses the original (it is no copy).
    let adopt = |data: &std::path::Path| {
        std::process::Command::new(env!("CARGO_BIN_EXE_penrose-aggregator"))
            .args(["adopt-copy", "--json", "-d"])
            .arg(data)
            .output()
            .unwrap()
    };
    let refused = adopt(&data);
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("not a copy"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
    let adopted = adopt(&copied);
    assert!(
        adopted.status.success(),
        "{}",
        String::from_utf8_lossy(&adopted.stderr)
    );
    let reply: BackupReply = serde_json::from_slice(&adopted.stdout).unwrap();
    assert_eq!(reply.released_elsewhere, [TODAY.0]);

    // Renamed on one file system, the original is still itself; the adopted copy releases
    // only what it accepts from now on.
    let moved = dir.path().join("moved");
    std::fs::rename(&data, &moved).unwrap();
    let store = rocks(&moved.join("db"));
    let mut state = open(&store, None).unwrap();
    let copy = rocks(&copied.join("db"));
    let mut copy_state = open(&copy, None).unwrap();
    assert_ne!(copy_state.instance(), state.instance());
    accept(
        &mut copy_state,
        &reports(2, snippet, 4, TODAY, &mut rng),
        TODAY,
    );
    assert_eq!(released_reports(&store, &mut state), 5);
    assert_eq!(released_reports(&copy, &mut copy_state), 2);
}

#[test]
fn a_store_cut_by_day_refuses_the_count_policy_and_is_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    let store = rocks(dir.path());
    let mut state = open(&store, None).unwrap();
    let snippet = snippets(1, 1)[0].1;
    let mut rng = rng(31);
    accept(&mut state, &reports(3, snippet, 4, TODAY, &mut rng), TODAY);
    drop(state);
    let before = dump(store.as_ref());
    let count = EpochPolicy::Count(NonZeroU64::new(5).unwrap());
    match open(&store, Some(count)) {
        Err(StateError::EpochKindMismatch { stored, given }) => {
            assert_eq!((stored, given), (EpochKind::Day, count));
        }
        Err(e) => panic!("wrong error: {e}"),
        Ok(_) => panic!("a day store opened with the count policy"),
    }
    assert_eq!(dump(store.as_ref()), before);
    // Its own kind still opens, with its reports.
    let state = open(&store, Some(EpochPolicy::Day)).unwrap();
    assert_eq!(state.accepted(), 3);

    // And the other way round.
    let dir = tempfile::tempdir().unwrap();
    let store = rocks(dir.path());
    drop(open(&store, Some(count)).unwrap());
    let before = dump(store.as_ref());
    assert!(matches!(
        open(&store, Some(EpochPolicy::Day)),
        Err(StateError::EpochKindMismatch {
            stored: EpochKind::Count,
            ..
        })
    ));
    assert_eq!(dump(store.as_ref()), before);
}

#[test]
fn a_backup_carried_off_the_machine_and_adopted_still_descends_from_the_original() {
    let dir = tempfile::tempdir().unwrap();
    let store = rocks(&dir.path().join("db"));
    let mut state = open(&store, None).unwrap();
    let original = state.instance();
    let snippet = snippets(1, 1)[0].1;
    let mut rng = rng(33);
    accept(&mut state, &reports(3, snippet, 4, TODAY, &mut rng), TODAY);
    let (backup, backup_state) = backup_as_served(&store, &dir.path().join("backup"));
    let backup_instance = backup_state.instance();
    drop(backup_state);
    drop(backup);
    let brought_back = dir.path().join("brought-back");
    copy_tree(&dir.path().join("backup"), &brought_back);
    let copy = rocks(&brought_back);
    assert!(matches!(open(&copy, None), Err(StateError::Copied { .. })));
    let adopted = penrose_aggregator::copies::make_new_instance(copy.as_ref()).unwrap();
    // The backup never exported, so the design server, which follows the original's chain,
    // must see the restored chain descend from the original.
    assert_eq!(adopted.parent, original);
    assert_ne!(adopted.instance, backup_instance);
    assert_eq!(adopted.released_elsewhere, [EpochId(TODAY.0)]);
    let mut copy_state = open(&copy, None).unwrap();
    accept(
        &mut copy_state,
        &reports(1, snippet, 4, TODAY, &mut rng),
        TODAY,
    );
    assert_eq!(released_reports(&copy, &mut copy_state), 1);
    let (c1, _) = export::reexport(copy.as_ref(), 1, &signing()).unwrap();
    assert_eq!(c1.link.parent, Some(original));
}

/// Issue 26 item 8: one report whose bins do not add up to the samples it declares (which the
/// aggregation server cannot see) costs the design server the sub-sum it landed in, not the
/// whole (class, counter, epoch). The sum is kept as sub-sums of 2 k T reports, each released
/// alone since each meets the threshold, and the short last one is folded into the one before;
/// every report is in exactly one released sum. Decrypted and checked as the design server
/// does (bins adding up to the declared samples), the honest reports lost are one sub-sum's.
#[test]
fn one_bad_report_costs_one_sub_sum_not_the_whole_sum() {
    let release = ReleaseRule::default();
    let sub = export::sub_sum_reports(&release);
    assert_eq!(sub, 2 * 10 * 24);
    let dir = tempfile::tempdir().unwrap();
    let store = rocks(dir.path());
    let mut state = State::open(
        Arc::clone(&store),
        KEYS.public_key(),
        FingerprintParams::default(),
        sub,
        None,
    )
    .unwrap();
    let snippet = snippets(1, 1)[0].1;
    let mut rng = rng(26);
    let total = 3 * sub + 100;
    let mut sent = reports(total as usize, snippet, 4, TODAY, &mut rng);
    let bad_at = sub as usize + 17;
    let mut lie = [0u32; BIN_COUNT];
    lie[7] = 400;
    sent[bad_at] = report_declaring(
        &KEYS,
        snippet,
        CounterId(4),
        lie,
        penrose_core::histogram::SampleCount(1),
        TODAY,
        &mut rng,
    );
    for chunk in sent.chunks(64) {
        accept(&mut state, chunk, TODAY);
    }
    close_now(&mut state, TODAY);
    let (bundle, _) = export_next(&store).unwrap();
    let sizes: Vec<u64> = bundle.entries.iter().map(|e| e.reports).collect();
    assert_eq!(sizes, [sub, sub, sub + 100]);
    let (mut lost, mut kept) = (0u64, 0u64);
    let mut kept_bins = vec![0u64; BIN_COUNT];
    for entry in &bundle.entries {
        let bins = decrypt_one(&KEYS, entry);
        if bins.iter().sum::<u64>() == entry.samples {
            kept += entry.reports;
            kept_bins.iter_mut().zip(&bins).for_each(|(k, b)| *k += b);
        } else {
            lost += entry.reports;
        }
    }
    let honest_lost = lost - 1;
    eprintln!(
        "one bad report among {total}: {honest_lost} honest reports lost with its sub-sum, \
         {kept} decrypted (with one whole sum: {} lost)",
        total - 1
    );
    assert_eq!((honest_lost, kept), (sub - 1, total - sub));
    let survivors: Vec<&Sent> = sent
        .iter()
        .enumerate()
        .filter(|(i, _)| !(sub as usize..2 * sub as usize).contains(i))
        .map(|(_, s)| s)
        .collect();
    assert_eq!(kept_bins, plain_sum(&survivors));
}

/// Generations (sub-sums) that fill and begin within one write batch are each written whole.
/// Before sub-sums made generations small this was reached only past 214,748 reports of one
/// sum, and the batch that filled a generation lost the reports it had added to it (the full
/// generation's last state was never written): here 10 reports in one batch at 3 a generation
/// kept 1.
#[test]
fn generations_that_fill_within_one_batch_are_each_written_whole() {
    let dir = tempfile::tempdir().unwrap();
    let store = rocks(dir.path());
    let mut state = State::open(
        Arc::clone(&store),
        KEYS.public_key(),
        FingerprintParams::default(),
        3,
        None,
    )
    .unwrap();
    let snippet = snippets(1, 1)[0].1;
    let mut rng = rng(27);
    let sent = reports(10, snippet, 6, TODAY, &mut rng);
    accept(&mut state, &sent, TODAY);
    let sums = export::all_sums(store.as_ref()).unwrap();
    let mut generations: Vec<(u32, u64)> =
        sums.iter().map(|e| (e.generation.0, e.reports)).collect();
    generations.sort_unstable();
    assert_eq!(generations, [(0, 3), (1, 3), (2, 3), (3, 1)]);
    assert_eq!(decrypt_entries(&sums), expected(&sent, |_| sums[0].class));
}
