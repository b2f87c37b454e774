//! Admission by tokens (issue 11; docs/threat-model.md, "Thresholds count contributors, not
//! reports"): every report must carry an admission token of the issuer's key of its day and
//! counter, bound to its body, verified before any table is touched and spent once, in the
//! same synced write as the report. In-process, on a real RocksDB store.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;

use common::*;
use penrose_aggregator::admission::Admission;
use penrose_aggregator::ingest::{Ingest, IngestConfig, Writer};
use penrose_aggregator::state::{Outcome, spent};
use penrose_aggregator::store::{RocksStore, Store, Table};
use penrose_aggregator::validate::{ValidReport, validate_body};
use penrose_core::counters::CounterId;
use penrose_core::paillier::ACCUMULATOR_REPORT_BOUND;
use penrose_core::tokens::{KeyRing, REDEMPTION_BYTES, Token, TokenEpoch};
use penrose_core::wire::{AckStatus, Day, RejectReason, ReportId};
use penrose_host::clock::today;
use rand::RngCore;

const COUNTER: CounterId = CounterId(4);
const OTHER_COUNTER: CounterId = CounterId(5);

/// The issuer's ring of yesterday, today and tomorrow, for counters 4 and 5.
fn ring() -> KeyRing {
    let t = today();
    token_ring(
        &[Day(t.0 - 1), t, Day(t.0 + 1)],
        &[COUNTER, OTHER_COUNTER],
        11,
    )
}

fn start_tokens(dir: &std::path::Path, ring: &KeyRing) -> (Ingest, Writer, Arc<dyn Store>) {
    start_admitting(
        dir,
        ACCUMULATOR_REPORT_BOUND,
        IngestConfig::default(),
        None,
        by_tokens(ring),
    )
}

/// The Spent rows as (epoch, report id).
fn spent_rows(store: &dyn Store) -> Vec<(u32, ReportId)> {
    let mut rows = Vec::new();
    store
        .scan(&[Table::Spent], &mut |_, k, v| {
            rows.push((
                u32::from_be_bytes(k[..4].try_into().unwrap()),
                spent::decode_value(v).unwrap(),
            ));
            Ok(())
        })
        .unwrap();
    rows
}

async fn status(ingest: &Ingest, body: &[u8]) -> AckStatus {
    ingest.handle(body.to_vec()).await.status
}

/// A token admits one report. The same token redeemed by its holder (a malicious agent, who
/// can compute a fresh MAC) on a second, different report is refused `TokenSpent` and changes
/// nothing, and still after a restart of the server; the first report's retry is a duplicate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_is_spent_once_and_its_second_spend_is_refused_also_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let ring = ring();
    let (ingest, writer, store) = start_tokens(dir.path(), &ring);
    let snippet = snippets(1, 1)[0].1;
    let mut rng = rng(1);
    let token = mint(&ring, today(), COUNTER, 1, 2).remove(0);
    let first = with_token(&report(snippet, COUNTER, &mut rng).frame, &token);
    let second = with_token(&report(snippet, COUNTER, &mut rng).frame, &token);
    assert_ne!(first, second);

    assert_eq!(status(&ingest, &first).await, AckStatus::Accepted);
    assert_eq!(
        ingest
            .metrics()
            .tokens_verified
            .load(std::sync::atomic::Ordering::Relaxed),
        1
    );
    let first_id = decode_report(&first).report_id;
    assert_eq!(spent_rows(store.as_ref()), [(today().0, first_id)]);
    let before = dump(store.as_ref());
    assert_eq!(
        status(&ingest, &second).await,
        AckStatus::Rejected(RejectReason::TokenSpent)
    );
    assert_eq!(status(&ingest, &first).await, AckStatus::Duplicate);
    assert_eq!(dump(store.as_ref()), before);
    assert_eq!(ingest.metrics().rejected_count(RejectReason::TokenSpent), 1);
    drop((ingest, store));
    writer.join().unwrap();

    let (ingest, writer, store) = start_tokens(dir.path(), &ring);
    assert_eq!(
        status(&ingest, &second).await,
        AckStatus::Rejected(RejectReason::TokenSpent)
    );
    assert_eq!(status(&ingest, &first).await, AckStatus::Duplicate);
    assert_eq!(dump(store.as_ref()), before);
    assert_eq!(ingest.state().accepted(), 1);
    drop(ingest);
    writer.join().unwrap();
}

/// Each kind of bad token, and no token, is refused with its reason before any table is
/// touched: the store is the same row for row. A token refused on another report's body is
/// not spent by the refusal: it still admits its own report afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_tokens_and_missing_tokens_are_refused_with_their_reason_and_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let ring = ring();
    let (ingest, writer, store) = start_tokens(dir.path(), &ring);
    let snippet = snippets(1, 1)[0].1;
    let mut rng = rng(3);
    let t = today();
    let mut tokens = mint(&ring, t, COUNTER, 3, 4);
    // One report first, so that the store is not trivially empty.
    let counted = with_token(
        &report(snippet, COUNTER, &mut rng).frame,
        &tokens.pop().unwrap(),
    );
    assert_eq!(status(&ingest, &counted).await, AckStatus::Accepted);
    let before = dump(store.as_ref());

    let plain = report(snippet, COUNTER, &mut rng).frame;
    let own = tokens.pop().unwrap();
    let elsewhere = report(snippet, COUNTER, &mut rng).frame;
    // A forged token: the right epoch and key id, a nonce and tag of the forger's choosing.
    let mut forged = own.redeem(b"anything").encode();
    rng.fill_bytes(&mut forged[36..]);
    // A token of a key no issuer of this server holds (another ring, same epoch and scope).
    let foreign_ring = token_ring(&[t], &[COUNTER], 99);
    let foreign = mint(&foreign_ring, t, COUNTER, 1, 5).remove(0);
    // Tokens of yesterday's and tomorrow's keys (both in the ring) on a report of today.
    let yesterday = mint(&ring, Day(t.0 - 1), COUNTER, 1, 6).remove(0);
    let tomorrow = mint(&ring, Day(t.0 + 1), COUNTER, 1, 7).remove(0);
    // A token of counter 5's key on a report of counter 4.
    let other_scope = mint(&ring, t, OTHER_COUNTER, 1, 8).remove(0);
    // `own`, bound to another report's body, moved onto `plain`.
    let moved = {
        let body = decode_report(&elsewhere).token_binding();
        own.redeem(&body).encode()
    };
    let cases: Vec<(&str, Vec<u8>, RejectReason)> = vec![
        ("no token", plain.clone(), RejectReason::TokenRequired),
        (
            "forged",
            with_token_bytes(&plain, forged),
            RejectReason::InvalidToken,
        ),
        (
            "foreign key",
            with_token(&plain, &foreign),
            RejectReason::InvalidToken,
        ),
        (
            "yesterday's key",
            with_token(&plain, &yesterday),
            RejectReason::InvalidToken,
        ),
        (
            "tomorrow's key",
            with_token(&plain, &tomorrow),
            RejectReason::InvalidToken,
        ),
        (
            "another counter's key",
            with_token(&plain, &other_scope),
            RejectReason::InvalidToken,
        ),
        (
            "bound to another report",
            with_token_bytes(&plain, moved),
            RejectReason::InvalidToken,
        ),
        (
            "garbage",
            with_token_bytes(&plain, [0x5a; REDEMPTION_BYTES]),
            RejectReason::InvalidToken,
        ),
    ];
    for (what, body, reason) in &cases {
        assert_eq!(
            status(&ingest, body).await,
            AckStatus::Rejected(*reason),
            "{what}"
        );
        assert_eq!(dump(store.as_ref()), before, "{what} changed the store");
    }
    let metrics = ingest.metrics();
    assert_eq!(metrics.rejected_count(RejectReason::TokenRequired), 1);
    assert_eq!(metrics.rejected_count(RejectReason::InvalidToken), 7);
    assert_eq!(ingest.state().accepted(), 1);

    // The refusals spent nothing: `own` and the day-and-counter tokens still admit their own
    // reports.
    assert_eq!(
        status(&ingest, &with_token(&elsewhere, &own)).await,
        AckStatus::Accepted
    );
    let other = report(snippet, OTHER_COUNTER, &mut rng).frame;
    assert_eq!(
        status(&ingest, &with_token(&other, &other_scope)).await,
        AckStatus::Accepted
    );
    assert_eq!(ingest.state().accepted(), 3);
    drop(ingest);
    writer.join().unwrap();
}

/// A retry of the same report with the same token is answered `Duplicate`, whether it comes
/// after the report was durable, while its batch may still be syncing, or in the same batch;
/// the report is counted once and its token recorded once.
#[test]
fn a_retry_with_the_same_token_is_a_duplicate() {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> = Arc::new(RocksStore::open(dir.path()).unwrap());
    let mut state = open_state(&store);
    let d = Day(20_000);
    let ring = token_ring(&[d], &[COUNTER], 12);
    let admission = by_tokens(&ring);
    let snippet = snippets(1, 1)[0].1;
    let mut rng = rng(13);
    let tokens = mint(&ring, d, COUNTER, 2, 14);
    let at = |token: &Token, rng: &mut rand_chacha::ChaCha8Rng| {
        let sent = report_by(&KEYS, snippet, COUNTER, random_bins(rng), d, rng);
        with_token(&sent.frame, token)
    };
    let a = at(&tokens[0], &mut rng);
    let b = at(&tokens[1], &mut rng);
    let valid = |body: &[u8]| {
        validate_body(
            body,
            &penrose_aggregator::design_keys::DesignKeys::single(KEYS.public_key().clone()),
            d,
            &admission,
        )
        .unwrap()
    };
    // In one batch.
    assert_eq!(
        state.apply(&[valid(&a), valid(&a)], d).unwrap(),
        [Outcome::Accepted, Outcome::Duplicate]
    );
    // In the next batch, prepared before the first is durable... (here: after).
    assert_eq!(state.apply(&[valid(&a)], d).unwrap(), [Outcome::Duplicate]);
    // ...and while the batch that counted it is still syncing.
    let syncing = state.prepare(&[valid(&b)], d).unwrap();
    let retry = state.prepare(&[valid(&b)], d).unwrap();
    assert_eq!(syncing.commit().unwrap(), [Outcome::Accepted]);
    assert_eq!(retry.commit().unwrap(), [Outcome::Duplicate]);
    assert_eq!(state.accepted(), 2);
    assert_eq!(spent_rows(store.as_ref()).len(), 2);
}

/// Two reports with one token in one batch (or the second in a batch prepared while the
/// first's syncs): one is accepted, the other refused `TokenSpent`. Over the handler, two
/// clients racing with one token: exactly one is accepted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_reports_with_one_token_one_is_accepted_and_one_refused() {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> = Arc::new(RocksStore::open(dir.path()).unwrap());
    let mut state = open_state(&store);
    let d = Day(20_000);
    let ring = token_ring(&[d], &[COUNTER], 15);
    let admission = by_tokens(&ring);
    let snippet = snippets(1, 1)[0].1;
    let mut rng = rng(16);
    let tokens = mint(&ring, d, COUNTER, 2, 17);
    let valid = |token: &Token, rng: &mut rand_chacha::ChaCha8Rng| -> ValidReport {
        let sent = report_by(&KEYS, snippet, COUNTER, random_bins(rng), d, rng);
        validate_body(
            &with_token(&sent.frame, token),
            &penrose_aggregator::design_keys::DesignKeys::single(KEYS.public_key().clone()),
            d,
            &admission,
        )
        .unwrap()
    };
    let (a, b) = (valid(&tokens[0], &mut rng), valid(&tokens[0], &mut rng));
    assert_eq!(a.token, b.token, "one token, one spent id");
    assert_ne!(a.report.report_id, b.report.report_id);
    assert_eq!(
        state.apply(&[a.clone(), b.clone()], d).unwrap(),
        [Outcome::Accepted, Outcome::TokenSpent]
    );
    let (c, e) = (valid(&tokens[1], &mut rng), valid(&tokens[1], &mut rng));
    let first = state.prepare(&[c], d).unwrap();
    let second = state.prepare(&[e], d).unwrap();
    assert_eq!(first.commit().unwrap(), [Outcome::Accepted]);
    assert_eq!(second.commit().unwrap(), [Outcome::TokenSpent]);
    assert_eq!(state.accepted(), 2);
    assert_eq!(spent_rows(store.as_ref()).len(), 2);
    let epoch = state.epochs().open().next().copied().unwrap();
    assert_eq!((epoch.reports, epoch.reports_with_tokens), (2, 2));
    drop(state);

    // Racing clients over the handler, many times.
    let dir = tempfile::tempdir().unwrap();
    let ring = self::ring();
    let (ingest, writer, store) = start_tokens(dir.path(), &ring);
    let tokens = mint(&ring, today(), COUNTER, 20, 18);
    for token in &tokens {
        let x = with_token(&report(snippet, COUNTER, &mut rng).frame, token);
        let y = with_token(&report(snippet, COUNTER, &mut rng).frame, token);
        let (i1, i2) = (ingest.clone(), ingest.clone());
        let (sx, sy) = tokio::join!(
            tokio::spawn(async move { i1.handle(x).await.status }),
            tokio::spawn(async move { i2.handle(y).await.status })
        );
        let mut got = [sx.unwrap(), sy.unwrap()];
        got.sort_by_key(|s| format!("{s:?}"));
        assert_eq!(
            got,
            [
                AckStatus::Accepted,
                AckStatus::Rejected(RejectReason::TokenSpent)
            ]
        );
    }
    assert_eq!(ingest.state().accepted(), 20);
    assert_eq!(spent_rows(store.as_ref()).len(), 20);
    drop(ingest);
    writer.join().unwrap();
}

/// Spent rows expire with their day, with the Seen rows and behind the same floor: over
/// twenty days the table holds at most the days still acceptable, a spent token of an expired
/// day can never admit a report again (its report's day is below the floor), also across a
/// restart, and a token of a day still kept stays spent.
#[test]
fn spent_tokens_expire_with_their_day_and_are_never_spent_twice() {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> = Arc::new(RocksStore::open(dir.path()).unwrap());
    let mut state = open_state(&store);
    let d = Day(20_000);
    let days: Vec<Day> = (d.0 - 1..d.0 + 24).map(Day).collect();
    let ring = token_ring(&days, &[COUNTER], 19);
    let admission = by_tokens(&ring);
    let snippet = snippets(1, 1)[0].1;
    let mut rng = rng(20);
    let body = |day: Day, token: &Token, rng: &mut rand_chacha::ChaCha8Rng| {
        let sent = report_by(&KEYS, snippet, COUNTER, random_bins(rng), day, rng);
        with_token(&sent.frame, token)
    };
    let valid = |body: &[u8], today: Day| {
        validate_body(
            body,
            &penrose_aggregator::design_keys::DesignKeys::single(KEYS.public_key().clone()),
            today,
            &admission,
        )
        .unwrap()
    };
    // Day d: reports of d - 1, d and d + 1, each with its day's token.
    let tokens: Vec<_> = [d.0 - 1, d.0, d.0 + 1]
        .iter()
        .enumerate()
        .map(|(i, &day)| mint(&ring, Day(day), COUNTER, 1, 21 + i as u64).remove(0))
        .collect();
    let bodies: Vec<Vec<u8>> = [d.0 - 1, d.0, d.0 + 1]
        .iter()
        .zip(&tokens)
        .map(|(&day, token)| body(Day(day), token, &mut rng))
        .collect();
    let batch: Vec<ValidReport> = bodies.iter().map(|b| valid(b, d)).collect();
    assert_eq!(state.apply(&batch, d).unwrap(), [Outcome::Accepted; 3]);
    let epochs =
        |store: &dyn Store| -> Vec<u32> { spent_rows(store).into_iter().map(|(e, _)| e).collect() };
    assert_eq!(epochs(store.as_ref()), [d.0 - 1, d.0, d.0 + 1]);

    // Day d + 1: day d - 1's spent row is gone; day d's token is still spent.
    let next = Day(d.0 + 1);
    let again = body(d, &tokens[1], &mut rng);
    assert_eq!(
        state.apply(&[valid(&again, next)], next).unwrap(),
        [Outcome::TokenSpent]
    );
    assert_eq!(epochs(store.as_ref()), [d.0, d.0 + 1]);

    // Day d + 3: everything so far expired. Day d + 1's token on a new report of its day is
    // refused by its day, never counted, also when the clock goes back, and after a restart.
    let later = Day(d.0 + 3);
    state.prepare_close(later, false).commit().unwrap();
    assert!(epochs(store.as_ref()).is_empty());
    let late = body(next, &tokens[2], &mut rng);
    let late_valid = valid(&late, Day(d.0 + 2));
    assert_eq!(late_valid.token.map(|t| t.epoch), Some(TokenEpoch(next.0)));
    assert_eq!(
        state
            .apply(std::slice::from_ref(&late_valid), later)
            .unwrap(),
        [Outcome::DayOutOfRange]
    );
    assert_eq!(
        state
            .apply(std::slice::from_ref(&late_valid), next)
            .unwrap(),
        [Outcome::DayOutOfRange]
    );
    drop(state);
    let mut state = open_state(&store);
    assert_eq!(
        state.apply(&[late_valid], next).unwrap(),
        [Outcome::DayOutOfRange]
    );
    assert_eq!(state.accepted(), 3);

    // Twenty days of five tokened reports each: the spent table never holds more than the
    // two days still kept.
    let mut most = 0;
    for day in (d.0 + 3)..(d.0 + 23) {
        let day = Day(day);
        let tokens = mint(&ring, day, COUNTER, 5, u64::from(day.0));
        let batch: Vec<ValidReport> = tokens
            .iter()
            .map(|t| valid(&body(day, t, &mut rng), day))
            .collect();
        assert_eq!(state.apply(&batch, day).unwrap(), [Outcome::Accepted; 5]);
        let rows = epochs(store.as_ref());
        assert!(
            rows.iter().all(|&e| e + 1 >= day.0),
            "day {}: {rows:?}",
            day.0
        );
        most = most.max(rows.len());
    }
    assert_eq!(most, 2 * 5, "two days of five tokens");
    assert_eq!(state.accepted(), 3 + 20 * 5);
}

/// Open admission counts reports without tokens and ignores any token a report carries
/// (nothing is verified or spent); the epoch records say how many reports came with a token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_admission_needs_no_token_and_spends_none() {
    let dir = tempfile::tempdir().unwrap();
    let (ingest, writer, store) = start_admitting(
        dir.path(),
        ACCUMULATOR_REPORT_BOUND,
        IngestConfig::default(),
        None,
        Admission::Open,
    );
    let ring = ring();
    let snippet = snippets(1, 1)[0].1;
    let mut rng = rng(30);
    let token = mint(&ring, today(), COUNTER, 1, 31).remove(0);
    let plain = report(snippet, COUNTER, &mut rng).frame;
    let tokened = with_token(&report(snippet, COUNTER, &mut rng).frame, &token);
    assert_eq!(status(&ingest, &plain).await, AckStatus::Accepted);
    assert_eq!(status(&ingest, &tokened).await, AckStatus::Accepted);
    assert!(spent_rows(store.as_ref()).is_empty());
    let epoch = ingest.state().epochs().open().next().copied().unwrap();
    assert_eq!((epoch.reports, epoch.reports_with_tokens), (2, 0));
    assert!(
        ingest
            .replace_key_ring(penrose_aggregator::admission::TokenRing::new(ring))
            .is_err()
    );
    drop(ingest);
    writer.join().unwrap();
}

/// A bundle says per epoch how many of its reports were admitted by tokens: all of them for a
/// server admitting by tokens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bundles_count_the_reports_admitted_by_tokens() {
    let dir = tempfile::tempdir().unwrap();
    let ring = ring();
    let (ingest, writer, store) = start_tokens(dir.path(), &ring);
    let apps = snippets(2, 1);
    let mut rng = rng(40);
    let tokens = mint(&ring, today(), COUNTER, 240, 41);
    for (i, token) in tokens.iter().enumerate() {
        let body = with_token(&report(apps[i % 2].1, COUNTER, &mut rng).frame, token);
        assert_eq!(status(&ingest, &body).await, AckStatus::Accepted);
    }
    let closed = close_all(&ingest).await;
    assert_eq!(closed.len(), 1);
    assert_eq!(closed[0].reports_with_tokens, 240);
    let signing = ed25519_dalek::SigningKey::from_bytes(&[7; 32]);
    let (bundle, bytes) = penrose_aggregator::export::export(
        store.as_ref(),
        penrose_core::release::ReleaseRule::default(),
        &signing,
    )
    .unwrap()
    .unwrap();
    let read =
        penrose_core::bundle::Bundle::verify(&bytes, Some(&signing.verifying_key())).unwrap();
    assert_eq!(read.epochs, bundle.epochs);
    assert_eq!(
        (read.epochs[0].reports, read.epochs[0].reports_with_tokens),
        (240, 240)
    );
    assert!(read.epochs[0].bound_enforced_by_tokens());
    drop(ingest);
    writer.join().unwrap();
}

/// A token of the report's day when the server's ring holds no key of that day (the operator
/// has not loaded it yet) is answered "retry later", not "invalid": the agent keeps the token,
/// which is good, and once a ring with that day is loaded the same bytes are accepted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_of_a_day_the_ring_does_not_hold_yet_is_retried_not_burnt() {
    let dir = tempfile::tempdir().unwrap();
    let t = today();
    // The issuer's keys of today; the server was only given yesterday's.
    let issuer = token_ring(&[Day(t.0 - 1), t], &[COUNTER], 11);
    let stale = token_ring(&[Day(t.0 - 1)], &[COUNTER], 11);
    let token = mint(&issuer, t, COUNTER, 1, 3).remove(0);
    let mut rng = rng(3);
    let frame = with_token(
        &report(snippets(1, 1)[0].1, COUNTER, &mut rng).frame,
        &token,
    );

    let (ingest, writer, store) = start_tokens(dir.path(), &stale);
    let before = dump(store.as_ref());
    let refused = status(&ingest, &frame).await;
    assert_eq!(refused, AckStatus::Rejected(RejectReason::TokenKeyMissing));
    assert!(RejectReason::TokenKeyMissing.retry_later());
    assert_eq!(dump(store.as_ref()), before);
    drop((ingest, store));
    writer.join().unwrap();

    let (ingest, writer, store) = start_tokens(dir.path(), &issuer);
    assert_eq!(status(&ingest, &frame).await, AckStatus::Accepted);
    assert_eq!(spent_rows(store.as_ref()).len(), 1);
    drop((ingest, store));
    writer.join().unwrap();
}
