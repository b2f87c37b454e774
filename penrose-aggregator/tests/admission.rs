//! What the aggregation server admits when reports cost their sender nothing (no admission
//! tokens yet): new classes are rationed, hand-made snippet hashes are refused, and the
//! deduplication record forgets days that can no longer be accepted without ever counting a
//! report twice. In-process, on a real RocksDB store (docs/threat-model.md, "Abusive
//! clients").
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::num::NonZeroU32;
use std::sync::Arc;

use common::*;
use penrose_aggregator::admission::Admission;
use penrose_aggregator::ingest::IngestConfig;
use penrose_aggregator::state::{Outcome, seen};
use penrose_aggregator::store::{RocksStore, Store, Table};
use penrose_aggregator::validate::{ValidReport, validate_body};
use penrose_core::counters::CounterId;
use penrose_core::fingerprint::SnippetHash;
use penrose_core::paillier::ACCUMULATOR_REPORT_BOUND;
use penrose_core::wire::{AckStatus, Day, RejectReason};
use penrose_host::clock::today;

fn valid(sent: &Sent, today: Day) -> ValidReport {
    validate_body(
        &sent.frame,
        &penrose_aggregator::design_keys::DesignKeys::single(KEYS.public_key().clone()),
        today,
        &Admission::Open,
    )
    .unwrap()
}

/// The Seen rows, as (day, kind) pairs.
fn seen_rows(store: &dyn Store) -> Vec<(u32, u8)> {
    let mut rows = Vec::new();
    store
        .scan(&[Table::Seen], &mut |_, k, _| {
            rows.push((u32::from_be_bytes(k[..4].try_into().unwrap()), k[4]));
            Ok(())
        })
        .unwrap();
    rows
}

/// With a budget of two classes an hour, the third application's report is refused with
/// `NewClassLimit` and changes nothing on disk; reports of existing classes still count; the
/// refused report is not remembered (sent again it is judged again, not called a duplicate),
/// and once the budget allows it, it counts exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_classes_beyond_the_budget_are_refused_and_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let budget = IngestConfig {
        new_classes_per_hour: NonZeroU32::new(2).unwrap(),
        ..IngestConfig::default()
    };
    let (ingest, writer, store) = start(dir.path(), ACCUMULATOR_REPORT_BOUND, budget);
    let apps = snippets(3, 2);
    let mut rng = rng(5);
    let first: Vec<Sent> = [0, 2]
        .iter()
        .map(|&i| report(apps[i].1, CounterId(4), &mut rng))
        .collect();
    for s in &first {
        assert_eq!(
            ingest.handle(s.frame.clone()).await.status,
            AckStatus::Accepted
        );
    }
    let before = dump(store.as_ref());
    let third = report(apps[4].1, CounterId(4), &mut rng);
    for _ in 0..3 {
        let ack = ingest.handle(third.frame.clone()).await;
        assert_eq!(ack.report_id, third.report_id);
        assert_eq!(
            ack.status,
            AckStatus::Rejected(RejectReason::NewClassLimit),
            "refused each time, never a duplicate"
        );
    }
    assert_eq!(
        dump(store.as_ref()),
        before,
        "a refused report changed the store"
    );
    {
        let state = ingest.state();
        assert_eq!(state.tables().class_count(), 2);
        assert_eq!(state.tables().snippet_count(), 2);
        assert_eq!(state.class_refusals(), 3);
    }
    assert_eq!(
        ingest.metrics().rejected_count(RejectReason::NewClassLimit),
        3
    );
    // Another window of an existing application joins its class: not rationed.
    let joining = report(apps[1].1, CounterId(5), &mut rng);
    assert_eq!(
        ingest.handle(joining.frame.clone()).await.status,
        AckStatus::Accepted
    );
    assert_eq!(ingest.state().tables().class_count(), 2);
    drop(ingest);
    writer.join().unwrap();

    // In one batch too, a copy of a refused report is refused, not answered Duplicate.
    let mut state = open_state(&store);
    state.set_new_classes_per_hour(NonZeroU32::new(1).unwrap());
    assert!(state.new_class_budget().try_take(std::time::Instant::now()));
    let outcomes = state
        .apply(&[valid(&third, today()), valid(&third, today())], today())
        .unwrap();
    assert_eq!(outcomes, [Outcome::NewClassLimit, Outcome::NewClassLimit]);
    drop(state);
    drop(store);

    // After a restart with room in the budget, the same bytes are counted once.
    let (ingest, writer, store) = start(
        dir.path(),
        ACCUMULATOR_REPORT_BOUND,
        IngestConfig::default(),
    );
    assert_eq!(
        ingest.handle(third.frame.clone()).await.status,
        AckStatus::Accepted
    );
    assert_eq!(
        ingest.handle(third.frame.clone()).await.status,
        AckStatus::Duplicate
    );
    let mut sent = first.clone();
    sent.push(joining);
    sent.push(third);
    let want = expected(&sent, |s| ingest.state().class_of(s).unwrap().unwrap());
    assert_eq!(decrypt_store(store.as_ref()), want);
    assert_eq!(ingest.state().accepted(), 4);
    drop(ingest);
    writer.join().unwrap();
}

/// Hand-made snippet hashes (all zeros, all ones, the empty window's, a bit past the 200 the
/// fingerprint uses) are refused at validation with `InvalidSnippet`, before any table.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_snippet_hashes_are_refused_before_any_table() {
    let dir = tempfile::tempdir().unwrap();
    let (ingest, writer, store) = start_default(dir.path());
    let mut rng = rng(6);
    let good = report(snippets(1, 1)[0].1, CounterId(4), &mut rng);
    assert_eq!(
        ingest.handle(good.frame.clone()).await.status,
        AckStatus::Accepted
    );
    let before = dump(store.as_ref());
    let mut past = good.snippet;
    past.0[25] |= 1;
    let mut empty = [0u8; 32];
    empty[..25].fill(0xff);
    for snippet in [
        SnippetHash([0; 32]),
        SnippetHash([0xff; 32]),
        SnippetHash(empty),
        past,
    ] {
        let bad = report(snippet, CounterId(4), &mut rng);
        let ack = ingest.handle(bad.frame).await;
        assert_eq!(ack.report_id, bad.report_id);
        assert_eq!(
            ack.status,
            AckStatus::Rejected(RejectReason::InvalidSnippet)
        );
    }
    assert_eq!(dump(store.as_ref()), before);
    assert_eq!(
        ingest
            .metrics()
            .rejected_count(RejectReason::InvalidSnippet),
        4
    );
    drop(ingest);
    writer.join().unwrap();
}

/// Seen keeps only the days a report may still have: as the server's day moves on, older
/// days' rows are deleted and the floor rises with them, in the same write. A retry of a
/// counted report is a duplicate while its day is kept, and refused (never counted) once it
/// is not, also when the clock goes back and across a restart; an exact copy claiming
/// another day is still folded. Over twenty days the table holds at most three days' rows.
#[test]
fn seen_expires_by_day_and_no_report_is_counted_twice() {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> = Arc::new(RocksStore::open(dir.path()).unwrap());
    let mut state = open_state(&store);
    let snippet = snippets(1, 1)[0].1;
    let mut rng = rng(7);
    let d = Day(20_000);
    let at = |day: Day, rng: &mut rand_chacha::ChaCha8Rng| {
        report_by(&KEYS, snippet, CounterId(4), random_bins(rng), day, rng)
    };
    let (a, b, c) = (
        at(Day(d.0 - 1), &mut rng),
        at(d, &mut rng),
        at(Day(d.0 + 1), &mut rng),
    );
    let outcomes = state
        .apply(&[valid(&a, d), valid(&b, d), valid(&c, d)], d)
        .unwrap();
    assert_eq!(outcomes, [Outcome::Accepted; 3]);
    assert_eq!(state.seen_floor(), Day(d.0 - 1));

    // Day d + 1: day d - 1 is gone, d and d + 1 are kept.
    let next = Day(d.0 + 1);
    // b again, and b's ciphertexts under a fresh id claiming day d + 1.
    let b_copy = {
        let mut copy = decode_report(&with_report_id(&b.frame, [0xb0; 16]));
        copy.day = next;
        validate_body(
            &report_body(copy),
            &penrose_aggregator::design_keys::DesignKeys::single(KEYS.public_key().clone()),
            next,
            &Admission::Open,
        )
        .unwrap()
    };
    assert_eq!(b_copy.report.day, next);
    let outcomes = state.apply(&[valid(&b, next), b_copy], next).unwrap();
    assert_eq!(outcomes, [Outcome::Duplicate, Outcome::Duplicate]);
    assert_eq!(state.seen_floor(), d);
    let rows = seen_rows(store.as_ref());
    assert!(rows.iter().all(|&(day, _)| day >= d.0), "{rows:?}");
    assert_eq!(rows.len(), 4, "b and c, id and digest each: {rows:?}");

    // Day d + 3: at the server's tick everything so far expires; a retry is refused, not
    // counted. (A retry in the very batch that raises the floor still finds its rows and is
    // answered Duplicate, which is true.)
    let later = Day(d.0 + 3);
    state.prepare_close(later, false).commit().unwrap();
    let outcomes = state.apply(&[valid(&c, Day(d.0 + 2))], later).unwrap();
    assert_eq!(outcomes, [Outcome::DayOutOfRange]);
    assert_eq!(state.seen_floor(), Day(d.0 + 2));
    assert!(seen_rows(store.as_ref()).is_empty());

    // The clock goes back to day d: b's day is acceptable to the clock, but below the
    // floor, so b is refused, not counted a second time; across a restart as well.
    let outcomes = state.apply(&[valid(&b, d)], d).unwrap();
    assert_eq!(outcomes, [Outcome::DayOutOfRange]);
    drop(state);
    let mut state = open_state(&store);
    assert_eq!(state.seen_floor(), Day(d.0 + 2));
    let outcomes = state.apply(&[valid(&b, d)], d).unwrap();
    assert_eq!(outcomes, [Outcome::DayOutOfRange]);
    assert_eq!(state.accepted(), 3);

    // Twenty more days of reports: the table never holds more than two days of rows (the
    // day before and today's; nothing is dated ahead here), and a retry of the last day's
    // reports is still a duplicate.
    let mut most = 0;
    let mut last = Vec::new();
    for day in (d.0 + 3)..(d.0 + 23) {
        let day = Day(day);
        last = (0..5).map(|_| at(day, &mut rng)).collect();
        let batch: Vec<ValidReport> = last.iter().map(|s| valid(s, day)).collect();
        assert_eq!(state.apply(&batch, day).unwrap(), [Outcome::Accepted; 5]);
        let rows = seen_rows(store.as_ref());
        assert!(
            rows.iter().all(|&(r, _)| r + 1 >= day.0),
            "day {}: {rows:?}",
            day.0
        );
        most = most.max(rows.len());
    }
    assert_eq!(
        most,
        2 * 2 * 5,
        "two days of five reports, id and digest each"
    );
    assert_eq!(state.accepted(), 3 + 20 * 5);
    let today = Day(d.0 + 22);
    let retries: Vec<ValidReport> = last.iter().map(|s| valid(s, today)).collect();
    assert_eq!(
        state.apply(&retries, today).unwrap(),
        [Outcome::Duplicate; 5]
    );
    let key = seen::id_key(today, &last[0].report_id);
    assert_eq!(store.contains_many(Table::Seen, &[&key]).unwrap(), [true]);
}
