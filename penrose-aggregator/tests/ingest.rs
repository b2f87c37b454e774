//! The ingest pipeline in-process, on a real RocksDB store: many concurrent clients, every
//! kind of invalid report, restarts, accumulator generations, throttle, and export of closed
//! epochs while reports keep arriving.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::{BTreeMap, HashSet};
use std::num::NonZeroU64;

use common::*;
use penrose_aggregator::epochs::EpochPolicy;
use penrose_aggregator::export;
use penrose_aggregator::ingest::IngestConfig;
use penrose_aggregator::state::seen;
use penrose_aggregator::store::Table;
use penrose_core::bundle::{Bundle, BundleHash};
use penrose_core::counters::{CatalogueVersion, CounterId};
use penrose_core::histogram::SampleCount;
use penrose_core::paillier::{KeyId, KeySize, MAX_REPORT_SAMPLES};
use penrose_core::release::ReleaseRule;
use penrose_core::wire::{
    Ack, AckStatus, FORMAT_VERSION, LENGTH_PREFIX, Message, PackedBytes, RejectReason, Report,
    ThrottleHint,
};

fn decode(body: &[u8]) -> Report {
    match Message::decode_body(body).unwrap() {
        Message::Report(r) => r,
        _ => unreachable!(),
    }
}

fn frame(report: Report) -> Vec<u8> {
    Message::Report(report).to_frame().unwrap()[LENGTH_PREFIX..].to_vec()
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
            .map(|(app, s)| (s.hash, (*app, tables.class_of(&s.hash).unwrap())))
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
    for arch in [
        penrose_core::gpu::GpuArch::UNKNOWN,
        penrose_core::gpu::GpuArch::new(8, 6),
        penrose_core::gpu::GpuArch::new(13, 0),
    ] {
        let mut r = base.clone();
        r.arch = arch;
        cases.push((
            "architecture no report may name",
            frame(r),
            RejectReason::InvalidArch,
        ));
    }
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
        [b"\x07".as_slice(), &FORMAT_VERSION.to_be_bytes(), b"zz"].concat(),
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
        ingest.state().class_of(s).unwrap().unwrap()
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
    let want = expected(&good, |s| ingest.state().class_of(s).unwrap().unwrap());
    assert_eq!(decrypt_store(store.as_ref()), want);
    // Refused reports are not remembered: nothing of them is in the deduplication record.
    let ids: Vec<Vec<u8>> = bad
        .iter()
        .map(|f| {
            let r = decode(f);
            seen::id_key(r.day, &r.report_id)
        })
        .collect();
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
    let want = expected(&sent, |s| ingest.state().class_of(s).unwrap().unwrap());
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
    let sums = export::all_sums(store.as_ref()).unwrap();
    let mut generations: Vec<(u32, u64)> =
        sums.iter().map(|e| (e.generation.0, e.reports)).collect();
    generations.sort_unstable();
    assert_eq!(generations, [(0, 3), (1, 3), (2, 3), (3, 1)]);
    let want = expected(&sent, |_| sums[0].class);
    assert_eq!(decrypt_entries(&sums), want);
    drop(ingest);
    writer.join().unwrap();
}

/// Export while reports keep arriving, on epochs of 250 reports that close as they fill: every
/// bundle verifies and chains onto the one before, releases each closed epoch once and only
/// closed ones, releases exactly the sums at or above the threshold, and all bundles together
/// account for every report once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn export_while_serving_releases_each_closed_epoch_once_and_chains() {
    let dir = tempfile::tempdir().unwrap();
    let policy = EpochPolicy::Count(NonZeroU64::new(250).unwrap());
    let (ingest, writer, store) = start_with(
        dir.path(),
        penrose_core::paillier::ACCUMULATOR_REPORT_BOUND,
        IngestConfig {
            max_batch: 8,
            queue: 1024,
            ..IngestConfig::default()
        },
        Some(policy),
    );
    let signing = export::load_or_create_signing_key(&dir.path().join("server.key")).unwrap();
    let snippet = snippets(1, 1)[0].1;
    let mut rng = rng(5);
    // One class; counter 4 in all but 32 of 800 reports, so that every full epoch (at least
    // 250 reports) holds at least 218 of counter 4, above the 217 that 10 contributors at 24
    // reports a day need; counter 5's sums never reach it.
    let sent: Vec<Sent> = (0..800)
        .map(|i| {
            let counter = if i % 25 == 0 { 5 } else { 4 };
            report(snippet, CounterId(counter), &mut rng)
        })
        .collect();
    let mut clients = Vec::new();
    for chunk in sent.chunks(100) {
        let ingest = ingest.clone();
        let chunk = chunk.to_vec();
        clients.push(tokio::spawn(async move {
            for s in chunk {
                assert_eq!(ingest.handle(s.frame).await.status, AckStatus::Accepted);
            }
        }));
    }
    let export_now = || {
        let store = std::sync::Arc::clone(&store);
        let key = signing.clone();
        tokio::task::spawn_blocking(move || {
            export::export(store.as_ref(), ReleaseRule::default(), &key)
        })
    };
    let mut bundles: Vec<(Bundle, Vec<u8>)> = Vec::new();
    let mut check = |bundle: Bundle, bytes: Vec<u8>| {
        let verified = Bundle::verify(&bytes, Some(&signing.verifying_key())).unwrap();
        assert_eq!(verified, bundle);
        let seq = bundles.len() as u64 + 1;
        assert_eq!(verified.link.seq, seq);
        let prev = bundles
            .last()
            .map_or_else(BundleHash::default, |(_, b)| BundleHash::of(b));
        assert_eq!(verified.link.prev, prev);
        bundles.push((verified, bytes));
    };
    while clients.iter().any(|c| !c.is_finished()) {
        if let Some((bundle, bytes)) = export_now().await.unwrap().unwrap() {
            check(bundle, bytes);
        }
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    for c in clients {
        c.await.unwrap();
    }
    // The last epoch is not full: the operator closes it.
    let closed = close_all(&ingest).await;
    assert_eq!(closed.len(), 1);
    assert!(closed[0].reports < 250);
    if let Some((bundle, bytes)) = export_now().await.unwrap().unwrap() {
        check(bundle, bytes);
    }
    assert!(
        export_now().await.unwrap().unwrap().is_none(),
        "nothing closed since"
    );

    let sums = export::all_sums(store.as_ref()).unwrap();
    let mut epochs_seen = HashSet::new();
    let mut released_keys = HashSet::new();
    let mut reports = 0;
    for (bundle, _) in &bundles {
        for e in &bundle.epochs {
            assert!(epochs_seen.insert(e.id), "epoch {} released twice", e.id.0);
            reports += e.reports;
            let entries: Vec<_> = bundle.entries.iter().filter(|x| x.epoch == e.id).collect();
            let in_store: Vec<_> = sums.iter().filter(|x| x.epoch == e.id).collect();
            // Released and withheld sums partition the epoch's sums and reports.
            assert_eq!(
                entries.len() as u64 + u64::from(e.withheld_sums),
                in_store.len() as u64
            );
            assert_eq!(
                entries.iter().map(|x| x.reports).sum::<u64>() + e.withheld_reports,
                e.reports
            );
            for x in &entries {
                assert!(x.reports >= 217, "{} reports released", x.reports);
                assert!(released_keys.insert(x.key()));
                // A released sum is the store's sum of that epoch, byte for byte.
                assert!(in_store.contains(x));
            }
            for s in in_store {
                if !entries.iter().any(|x| x.key() == s.key()) {
                    assert!(s.reports < 217, "a releasable sum was withheld");
                }
            }
        }
    }
    assert_eq!(reports, 800, "every report in exactly one released epoch");
    assert_eq!(epochs_seen.len(), 4);
    // The full epochs' counter-4 sums were released: 768 reports minus the last epoch's.
    let released: u64 = bundles
        .iter()
        .flat_map(|(b, _)| &b.entries)
        .map(|x| x.reports)
        .sum();
    assert!(released >= 3 * 218, "{released}");
    // All sums together decrypt to everything sent.
    let want = expected(&sent, |s| ingest.state().class_of(s).unwrap().unwrap());
    assert_eq!(decrypt_entries(&sums), want);
    drop(ingest);
    writer.join().unwrap();
}
