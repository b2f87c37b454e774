//! The ingest pipeline in-process, on a real RocksDB store: many concurrent clients, every
//! kind of invalid report, restarts, accumulator generations, throttle, and export while
//! reports keep arriving.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::{BTreeMap, HashSet};

use common::*;
use penrose_aggregator::export;
use penrose_aggregator::ingest::IngestConfig;
use penrose_aggregator::store::{Store, Table};
use penrose_core::bundle::{Bundle, Cursor};
use penrose_core::counters::{CatalogueVersion, CounterId};
use penrose_core::histogram::SampleCount;
use penrose_core::paillier::{KeyId, KeySize, MAX_REPORT_SAMPLES};
use penrose_core::wire::{
    Ack, AckStatus, LENGTH_PREFIX, Message, PackedBytes, RejectReason, Report, ThrottleHint,
};
use rand::Rng;

fn decode(body: &[u8]) -> Report {
    match Message::decode_body(body).unwrap() {
        Message::Report(r) => r,
        Message::Ack(_) => unreachable!(),
    }
}

fn frame(report: Report) -> Vec<u8> {
    Message::Report(report).to_frame().unwrap()[LENGTH_PREFIX..].to_vec()
}

fn dump(store: &dyn Store) -> Vec<(Table, Vec<u8>, Vec<u8>)> {
    let mut rows = Vec::new();
    store
        .scan(&Table::ALL, &mut |t, k, v| {
            rows.push((t, k.to_vec(), v.to_vec()));
            Ok(())
        })
        .unwrap();
    rows
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_clients_are_all_acked_and_the_sums_decrypt_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let (ingest, writer, store) = start_default(dir.path());
    let snippets = snippets(4, 3);
    let mut rng = rng(1);
    let sent: Vec<Sent> = (0..320)
        .map(|i| {
            let (_, snippet) = snippets[i % snippets.len()];
            report(snippet, CounterId(4 + (i % 5) as u16), &mut rng)
        })
        .collect();
    let mut clients = Vec::new();
    for chunk in sent.chunks(10) {
        let ingest = ingest.clone();
        let chunk = chunk.to_vec();
        clients.push(tokio::spawn(async move {
            let mut acks = Vec::new();
            for s in chunk {
                acks.push((s.report_id, ingest.handle(s.frame).await));
            }
            acks
        }));
    }
    for client in clients {
        for (id, ack) in client.await.unwrap() {
            assert_eq!(ack.report_id, id);
            assert_eq!(ack.status, AckStatus::Accepted);
            assert_eq!(ack.throttle, ThrottleHint::FULL_RATE);
        }
    }
    // Windows of one application share a class; the four applications have four classes.
    let class_of = {
        let state = ingest.state();
        let tables = state.tables();
        assert_eq!(tables.class_count(), 4);
        let classes: BTreeMap<_, _> = snippets
            .iter()
            .map(|(app, s)| (*s, (*app, tables.snippet(s).unwrap().class)))
            .collect();
        for (app, class) in classes.values() {
            let same: HashSet<_> = classes
                .values()
                .filter(|(a, _)| a == app)
                .map(|(_, c)| c)
                .collect();
            assert_eq!(same.len(), 1, "application {app} split");
            let _ = class;
        }
        classes
    };
    let want = expected(&sent, |s| class_of[s].1);
    assert_eq!(decrypt_store(store.as_ref()), want);

    // Resending everything is answered as duplicates and changes no sum.
    let before = dump(store.as_ref());
    for s in sent.iter().take(50) {
        assert_eq!(
            ingest.handle(s.frame.clone()).await.status,
            AckStatus::Duplicate
        );
    }
    assert_eq!(dump(store.as_ref()), before);
    assert_eq!(ingest.state().accepted(), 320);
    drop(ingest);
    writer.join().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_invalid_report_is_rejected_with_its_code_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (ingest, writer, store) = start_default(dir.path());
    let snippets = snippets(1, 1);
    let mut rng = rng(2);
    // One valid report first, so that the store is not trivially empty.
    let first = report(snippets[0].1, CounterId(4), &mut rng);
    assert_eq!(
        ingest.handle(first.frame.clone()).await.status,
        AckStatus::Accepted
    );
    let good = report(snippets[0].1, CounterId(5), &mut rng);
    let base = decode(&good.frame);

    let ct_len = base.ciphertexts.ciphertext_len();
    let with_first_ciphertext = |fill: &dyn Fn(&mut [u8])| {
        let mut r = base.clone();
        let mut bytes = r.ciphertexts.as_bytes().to_vec();
        fill(&mut bytes[..ct_len]);
        r.ciphertexts = PackedBytes::new(bytes, r.ciphertexts.count()).unwrap();
        frame(r)
    };
    let n = {
        let key = KEYS.public_key().to_bytes();
        let n_bytes = KeySize::Bits1024.modulus_bytes();
        key[7..7 + n_bytes].to_vec()
    };
    let mut cases: Vec<(&str, Vec<u8>, RejectReason)> = Vec::new();
    let mut r = base.clone();
    r.key_id = KeyId([9; 32]);
    cases.push(("unknown key", frame(r), RejectReason::UnknownKey));
    let mut r = base.clone();
    r.catalogue = CatalogueVersion(77);
    cases.push(("unknown catalogue", frame(r), RejectReason::UnknownCounter));
    let mut r = base.clone();
    r.counter = CounterId(999);
    cases.push(("unknown counter", frame(r), RejectReason::UnknownCounter));
    for samples in [0, MAX_REPORT_SAMPLES as u32 + 1] {
        let mut r = base.clone();
        r.samples = SampleCount(samples);
        cases.push((
            "sample count",
            frame(r),
            RejectReason::SampleCountOutOfRange,
        ));
    }
    cases.push((
        "zero ciphertext",
        with_first_ciphertext(&|c| c.fill(0)),
        RejectReason::InvalidCiphertext,
    ));
    cases.push((
        "ciphertext >= n^2",
        with_first_ciphertext(&|c| c.fill(0xff)),
        RejectReason::InvalidCiphertext,
    ));
    cases.push((
        "ciphertext not a unit",
        with_first_ciphertext(&|c| {
            c.fill(0);
            let at = c.len() - n.len();
            c[at..].copy_from_slice(&n);
        }),
        RejectReason::InvalidCiphertext,
    ));
    let mut r = base.clone();
    r.ciphertexts = PackedBytes::new(vec![3; ct_len], 1).unwrap();
    cases.push((
        "wrong ciphertext length",
        frame(r),
        RejectReason::InvalidCiphertext,
    ));
    cases.push((
        "truncated frame",
        good.frame[..good.frame.len() - 10].to_vec(),
        RejectReason::Malformed,
    ));
    let mut trailing = good.frame.clone();
    trailing.extend_from_slice(b"xx");
    cases.push(("trailing bytes", trailing, RejectReason::Malformed));
    cases.push(("oversized body", vec![1; 9_000], RejectReason::TooLarge));
    let mut version = good.frame.clone();
    version[2] = 9;
    cases.push((
        "unsupported version",
        version,
        RejectReason::UnsupportedVersion,
    ));
    cases.push((
        "garbage",
        b"\x07\x00\x01zz".to_vec(),
        RejectReason::Malformed,
    ));
    cases.push((
        "garbage, bad version",
        b"hello".to_vec(),
        RejectReason::UnsupportedVersion,
    ));
    cases.push(("empty", Vec::new(), RejectReason::Malformed));
    let ack = Message::Ack(Ack {
        report_id: base.report_id,
        status: AckStatus::Accepted,
        throttle: ThrottleHint::FULL_RATE,
    });
    cases.push((
        "an ack, not a report",
        ack.to_frame().unwrap()[LENGTH_PREFIX..].to_vec(),
        RejectReason::Malformed,
    ));

    let before = dump(store.as_ref());
    for (what, bytes, reason) in &cases {
        let ack = ingest.handle(bytes.clone()).await;
        assert_eq!(ack.status, AckStatus::Rejected(*reason), "{what}");
        assert!(ingest.metrics().rejected_count(*reason) > 0, "{what}");
    }
    assert_eq!(
        dump(store.as_ref()),
        before,
        "a rejected report changed the store"
    );
    // Rejections do not consume report ids: the valid report with the same id is accepted.
    assert_eq!(
        ingest.handle(good.frame.clone()).await.status,
        AckStatus::Accepted
    );
    let want = expected(&[first, good], |s| {
        ingest.state().tables().snippet(s).unwrap().class
    });
    assert_eq!(decrypt_store(store.as_ref()), want);
    drop(ingest);
    writer.join().unwrap();
}

/// The unit check runs per batch (one gcd for all): a ciphertext that is a multiple of p (only
/// the key holder can make one) sent among many valid reports at once is refused with its
/// code, and only it; the valid reports of the same batches are counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_non_unit_in_a_batch_is_refused_alone() {
    let dir = tempfile::tempdir().unwrap();
    let (ingest, writer, store) = start_default(dir.path());
    let snippets = snippets(2, 1);
    let mut rng = rng(11);
    let good: Vec<Sent> = (0..48)
        .map(|i| report(snippets[i % 2].1, CounterId(4 + (i % 3) as u16), &mut rng))
        .collect();
    // p from the private key's encoding (7-byte header, then p), right-aligned in the second
    // ciphertext: non-zero, below n^2, not a multiple of n, but not a unit.
    let size = KeySize::Bits1024;
    let secret = KEYS.private_key().to_bytes();
    let p = &secret[7..7 + size.prime_bytes()];
    let bad: Vec<Vec<u8>> = (0..3)
        .map(|i| {
            let mut r = decode(&report(snippets[0].1, CounterId(4), &mut rng).frame);
            let ct = r.ciphertexts.ciphertext_len();
            let mut bytes = r.ciphertexts.as_bytes().to_vec();
            bytes[ct..2 * ct].fill(0);
            bytes[2 * ct - p.len()..2 * ct].copy_from_slice(p);
            r.report_id.0[0] = 0xb0 + i;
            r.ciphertexts = PackedBytes::new(bytes, r.ciphertexts.count()).unwrap();
            frame(r)
        })
        .collect();
    let mut tasks = Vec::new();
    for (i, frame) in good.iter().map(|s| s.frame.clone()).enumerate() {
        let handle = ingest.clone();
        tasks.push(tokio::spawn(
            async move { (false, handle.handle(frame).await) },
        ));
        if i % 16 == 7 {
            let handle = ingest.clone();
            let frame = bad[i / 16].clone();
            tasks.push(tokio::spawn(
                async move { (true, handle.handle(frame).await) },
            ));
        }
    }
    for task in tasks {
        let (is_bad, ack) = task.await.unwrap();
        let want = if is_bad {
            AckStatus::Rejected(RejectReason::InvalidCiphertext)
        } else {
            AckStatus::Accepted
        };
        assert_eq!(ack.status, want);
    }
    assert_eq!(
        ingest
            .metrics()
            .rejected_count(RejectReason::InvalidCiphertext),
        3
    );
    assert_eq!(ingest.state().accepted(), good.len() as u64);
    let want = expected(&good, |s| ingest.state().tables().snippet(s).unwrap().class);
    assert_eq!(decrypt_store(store.as_ref()), want);
    // Refused reports are not remembered: nothing of them is in the deduplication record.
    let ids: Vec<Vec<u8>> = bad.iter().map(|f| decode(f).report_id.0.to_vec()).collect();
    let ids: Vec<&[u8]> = ids.iter().map(Vec::as_slice).collect();
    assert_eq!(
        store.contains_many(Table::Seen, &ids).unwrap(),
        [false, false, false]
    );
    drop(ingest);
    writer.join().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_rebuilds_tables_and_sums_and_still_deduplicates() {
    let dir = tempfile::tempdir().unwrap();
    let snippets = snippets(3, 2);
    let mut rng = rng(3);
    let sent: Vec<Sent> = (0..60)
        .map(|i| {
            report(
                snippets[i % snippets.len()].1,
                CounterId(4 + (i % 2) as u16),
                &mut rng,
            )
        })
        .collect();
    let classes_before;
    {
        let (ingest, writer, _store) = start_default(dir.path());
        for s in &sent[..30] {
            assert_eq!(
                ingest.handle(s.frame.clone()).await.status,
                AckStatus::Accepted
            );
        }
        ingest
            .set_throttle(ThrottleHint::from_permille(800).unwrap())
            .unwrap();
        classes_before = ingest.state().tables().class_count();
        drop(ingest);
        writer.join().unwrap();
    }
    let (ingest, writer, store) = start_default(dir.path());
    assert_eq!(ingest.state().tables().class_count(), classes_before);
    assert_eq!(
        ingest.throttle().permille(),
        800,
        "throttle survives a restart"
    );
    for (i, s) in sent.iter().enumerate() {
        let ack = ingest.handle(s.frame.clone()).await;
        let want = if i < 30 {
            AckStatus::Duplicate
        } else {
            AckStatus::Accepted
        };
        assert_eq!(ack.status, want, "report {i}");
        assert_eq!(ack.throttle.permille(), 800);
    }
    let want = expected(&sent, |s| ingest.state().tables().snippet(s).unwrap().class);
    assert_eq!(decrypt_store(store.as_ref()), want);
    drop(ingest);
    writer.join().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_accumulator_starts_the_next_generation() {
    let dir = tempfile::tempdir().unwrap();
    let snippet = snippets(1, 1)[0].1;
    let mut rng = rng(4);
    let sent: Vec<Sent> = (0..10)
        .map(|_| report(snippet, CounterId(6), &mut rng))
        .collect();
    {
        let (ingest, writer, store) = start(dir.path(), 3, IngestConfig::default());
        for s in &sent[..5] {
            assert_eq!(
                ingest.handle(s.frame.clone()).await.status,
                AckStatus::Accepted
            );
        }
        drop(ingest);
        writer.join().unwrap();
        drop(store);
    }
    // The generation in progress continues after a restart.
    let (ingest, writer, store) = start(dir.path(), 3, IngestConfig::default());
    for s in &sent[5..] {
        assert_eq!(
            ingest.handle(s.frame.clone()).await.status,
            AckStatus::Accepted
        );
    }
    let bundle = export::collect(store.as_ref(), KEYS.public_key(), Cursor(0)).unwrap();
    let mut generations: Vec<(u32, u64)> = bundle
        .entries
        .iter()
        .map(|e| (e.generation.0, e.reports))
        .collect();
    generations.sort_unstable();
    assert_eq!(generations, [(0, 3), (1, 3), (2, 3), (3, 1)]);
    let want = expected(&sent, |_| bundle.entries[0].class);
    assert_eq!(decrypt_bundle(&bundle), want);
    drop(ingest);
    writer.join().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn export_while_serving_verifies_and_matches_the_tables() {
    let dir = tempfile::tempdir().unwrap();
    let (ingest, writer, store) = start(
        dir.path(),
        penrose_core::paillier::ACCUMULATOR_REPORT_BOUND,
        IngestConfig {
            max_batch: 8,
            queue: 1024,
        },
    );
    let signing = export::load_or_create_signing_key(&dir.path().join("server.key")).unwrap();
    let snippets = snippets(3, 2);
    let mut rng = rng(5);
    let sent: Vec<Sent> = (0..240)
        .map(|i| {
            report(
                snippets[i % snippets.len()].1,
                CounterId(rng.random_range(4..9)),
                &mut rng,
            )
        })
        .collect();
    let mut clients = Vec::new();
    for chunk in sent.chunks(30) {
        let ingest = ingest.clone();
        let chunk = chunk.to_vec();
        clients.push(tokio::spawn(async move {
            for s in chunk {
                assert_eq!(ingest.handle(s.frame).await.status, AckStatus::Accepted);
            }
        }));
    }
    // Export repeatedly while the clients send; every bundle verifies and its counts never
    // go backwards.
    let mut last_cursor = Cursor(0);
    let mut exports = 0;
    while clients.iter().any(|c| !c.is_finished()) || exports < 3 {
        let store = std::sync::Arc::clone(&store);
        let key = signing.clone();
        let (bundle, bytes) = tokio::task::spawn_blocking(move || {
            export::export(store.as_ref(), KEYS.public_key(), Cursor(0), &key)
        })
        .await
        .unwrap()
        .unwrap();
        let verified = Bundle::verify(&bytes, Some(&signing.verifying_key())).unwrap();
        assert_eq!(verified, bundle);
        assert!(verified.cursor >= last_cursor);
        last_cursor = verified.cursor;
        exports += 1;
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    for c in clients {
        c.await.unwrap();
    }
    let (full, bytes) =
        export::export(store.as_ref(), KEYS.public_key(), Cursor(0), &signing).unwrap();
    let verified = Bundle::verify(&bytes, Some(&signing.verifying_key())).unwrap();
    let want = expected(&sent, |s| ingest.state().tables().snippet(s).unwrap().class);
    assert_eq!(decrypt_bundle(&verified), want);
    // The bundle's contributor counts are the tables' report counts, class by class.
    {
        let state = ingest.state();
        for class in 0..state.tables().class_count() as u32 {
            let class = penrose_core::bundle::ClassId(class);
            assert_eq!(
                full.reports_of(class),
                state.tables().class(class).unwrap().reports
            );
        }
    }

    // An export since the last cursor holds only what changed after it.
    let more = report(snippets[0].1, CounterId(4), &mut rng);
    assert_eq!(
        ingest.handle(more.frame.clone()).await.status,
        AckStatus::Accepted
    );
    let delta = export::collect(store.as_ref(), KEYS.public_key(), full.cursor).unwrap();
    assert_eq!(delta.entries.len(), 1);
    assert_eq!(delta.since, full.cursor);
    assert_eq!(delta.cursor, Cursor(full.cursor.0 + 1));
    let entry = &delta.entries[0];
    assert_eq!(entry.counter, CounterId(4));
    let old = full
        .entries
        .iter()
        .find(|e| {
            (e.class, e.counter, e.generation) == (entry.class, entry.counter, entry.generation)
        })
        .unwrap();
    assert_eq!(entry.reports, old.reports + 1);
    drop(ingest);
    writer.join().unwrap();
}
