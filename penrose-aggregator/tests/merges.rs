//! Healing a split application through both servers: windows of one application that founded
//! two classes are joined by a window that matches both. Sums the absorbed class accumulated
//! before the merge are released added into the survivor's (so a part that alone is under the
//! threshold is not lost), earlier bundles stay byte for byte what they were, the merge
//! survives a restart, and the design server reports everything of both classes as one.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use ed25519_dalek::SigningKey;
use penrose_aggregator::export;
use penrose_aggregator::tables::ClassId;
use penrose_core::bundle::{Bundle, ClassMerge};
use penrose_core::counters::CounterId;
use penrose_core::fingerprint::{Fingerprint, FingerprintParams, Fingerprinter};
use penrose_core::paillier::BIN_COUNT;
use penrose_core::release::ReleaseRule;
use penrose_core::release::{ReportsPerContributor, Threshold};
use penrose_core::wire::AckStatus;
use penrose_design::archive::Archive;
use penrose_design::report;

const COUNTER: CounterId = CounterId(4);

/// Windows of one long application: `a`, `b` and `c` far enough apart that the server must
/// put each in a class of its own, `ab` between a and b and `bc` between b and c, each similar
/// to both of its neighbours only. Checked with the server's own estimator, so that this
/// tests merging and not the luck of one hash.
struct Split {
    a: Fingerprint,
    b: Fingerprint,
    c: Fingerprint,
    ab: Fingerprint,
    bc: Fingerprint,
}

fn split_application() -> Split {
    let f = Fingerprinter::new(FingerprintParams::default()).unwrap();
    let params = FingerprintParams::default();
    let similar =
        |x: &Fingerprint, y: &Fingerprint| x.hash.estimate_jaccard(&y.hash, &params) >= params.tau;
    (1..200u64)
        .map(|seed| {
            let seq: Vec<String> = (0..2_200u64)
                .map(|i| format!("kernel_{}", (i * 7_919 + seed * 104_729) % 3_001))
                .collect();
            let window = |at: usize| f.fingerprint_of_names(&seq[at..at + 1_000]);
            Split {
                a: window(0),
                b: window(550),
                c: window(1_100),
                ab: window(275),
                bc: window(825),
            }
        })
        .find(|s| {
            let all = [s.a, s.b, s.c, s.ab, s.bc];
            let want = |i: usize, j: usize| matches!((i, j), (0, 3) | (1, 3) | (1, 4) | (2, 4));
            (0..5).all(|i| (i + 1..5).all(|j| similar(&all[i], &all[j]) == want(i, j)))
        })
        .unwrap()
}

/// Closes every open epoch and exports the next bundle (there must be one).
async fn close_and_export(
    ingest: &penrose_aggregator::ingest::Ingest,
    store: &dyn penrose_aggregator::store::Store,
    signing: &SigningKey,
) -> (Bundle, Vec<u8>) {
    close_all(ingest).await;
    export::export(store, ReleaseRule::default(), signing)
        .unwrap()
        .unwrap()
}

/// The design server's report under the default release rule.
fn decrypt_report(merged: &penrose_design::archive::Aggregates) -> report::Report {
    report::build(
        merged,
        std::slice::from_ref(KEYS.private_key()),
        Threshold::DEFAULT,
        ReportsPerContributor::DEFAULT,
    )
    .unwrap()
}

/// The bin-wise sum of what `sent` carried.
fn bin_sums(sent: &[Sent]) -> Vec<u64> {
    let mut out = vec![0u64; BIN_COUNT];
    for s in sent {
        for (w, b) in out.iter_mut().zip(s.bins) {
            *w += u64::from(b);
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_split_application_is_healed_and_released_as_one() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("agg");
    let signing = SigningKey::from_bytes(&[21; 32]);
    let mut rng = rng(2_100);
    let Split { a, b, c, ab, bc } = split_application();
    let mut sent = Vec::new();
    let (ingest, writer, store) = start_default(&data);
    let send = |snippet: Fingerprint, n: usize, rng: &mut rand_chacha::ChaCha8Rng| {
        (0..n)
            .map(|_| report(snippet, COUNTER, rng))
            .collect::<Vec<_>>()
    };
    let accept = async |batch: Vec<Sent>, sent: &mut Vec<Sent>| {
        for s in batch {
            assert_eq!(
                ingest.handle(s.frame.clone()).await.status,
                AckStatus::Accepted
            );
            sent.push(s);
        }
    };

    // Epoch 1: both parts, each enough for a release on its own, in two classes.
    accept(send(a, 240, &mut rng), &mut sent).await;
    accept(send(b, 240, &mut rng), &mut sent).await;
    let (class_a, class_b) = {
        let state = ingest.state();
        let t = state.tables();
        (t.class_of(&a.hash).unwrap(), t.class_of(&b.hash).unwrap())
    };
    assert_ne!(class_a, class_b, "the parts must found two classes");
    let (first, first_bytes) = close_and_export(&ingest, store.as_ref(), &signing).await;
    let classes: Vec<ClassId> = first.entries.iter().map(|e| e.class).collect();
    assert_eq!(classes, vec![class_a, class_b]);
    assert!(first.merges.is_empty());

    // Epoch 2: 120 reports of b while it is its own class (alone under the threshold: 120
    // reports are at least 5 contributors), then the bridge joins the classes, then more of b.
    // And c, still a class of its own.
    accept(send(a, 120, &mut rng), &mut sent).await;
    accept(send(b, 120, &mut rng), &mut sent).await;
    accept(send(ab, 1, &mut rng), &mut sent).await;
    {
        let state = ingest.state();
        let t = state.tables();
        assert_eq!(t.class_of(&b.hash), Some(class_a.min(class_b)));
        assert_eq!(t.class_of(&ab.hash), Some(class_a.min(class_b)));
        assert_eq!(t.class_count(), 1);
    }
    let survivor = class_a.min(class_b);
    let absorbed = class_a.max(class_b);
    accept(send(b, 120, &mut rng), &mut sent).await;
    let c_reports = send(c, 240, &mut rng);
    accept(c_reports.clone(), &mut sent).await;
    let class_c = ingest.state().class_of(&c.hash).unwrap().unwrap();
    assert!(class_c > survivor);
    let (second, second_bytes) = close_and_export(&ingest, store.as_ref(), &signing).await;
    assert_eq!(
        second.merges,
        vec![ClassMerge {
            absorbed,
            into: survivor
        }]
    );
    // The survivor's and the absorbed class's pieces added in one sum, c's apart; nothing
    // withheld.
    assert_eq!(second.entries.len(), 2);
    assert_eq!(second.entries[0].class, survivor);
    assert_eq!(second.entries[0].reports, 361);
    assert_eq!(second.entries[1].class, class_c);
    assert_eq!(second.epochs[0].withheld_sums, 0);
    let epoch2 = &sent[480..841];
    assert_eq!(decrypt_one(&KEYS, &second.entries[0]), bin_sums(epoch2));

    // A restart keeps the merge. A later merge (c into the survivor) changes nothing released:
    // both bundles re-export byte for byte.
    drop(ingest);
    drop(store);
    writer.join().unwrap();
    let (ingest, writer, store) = start_default(&data);
    assert_eq!(ingest.state().class_of(&b.hash).unwrap(), Some(survivor));
    let late = report(bc, COUNTER, &mut rng);
    assert_eq!(ingest.handle(late.frame).await.status, AckStatus::Accepted);
    assert_eq!(ingest.state().class_of(&c.hash).unwrap(), Some(survivor));
    for (seq, bytes) in [(1, &first_bytes), (2, &second_bytes)] {
        let (_, again) = export::reexport(store.as_ref(), seq, &signing).unwrap();
        assert_eq!(&again, bytes, "bundle {seq}");
    }

    // The design server reports both classes as one, with every report of both epochs.
    let archive = Archive::open(&dir.path().join("design")).unwrap();
    for (i, bytes) in [&first_bytes, &second_bytes].into_iter().enumerate() {
        let path = dir.path().join(format!("{i}.bundle"));
        std::fs::write(&path, bytes).unwrap();
        archive
            .import(&path, Some(&signing.verifying_key()), false)
            .unwrap();
        Bundle::verify(bytes, Some(&signing.verifying_key())).unwrap();
    }
    let merged = archive.merged().unwrap();
    assert_eq!(merged.root(absorbed), survivor);
    // The design server learns of c's merge only with the bundle that first applies it.
    assert_eq!(merged.root(class_c), class_c);
    let report = decrypt_report(&merged);
    assert_eq!(report.decrypted.len(), 2, "{:?}", report.decrypted);
    let only = &report.decrypted[0];
    assert_eq!(only.class, survivor.0);
    assert_eq!(only.merged_from, vec![absorbed.0]);
    assert_eq!(only.reports, 841);
    assert_eq!(report.decrypted[1].class, class_c.0);
    assert_eq!(only.bins, bin_sums(&sent[..841]));

    // The next bundle applies c's merge: the design server then counts c's earlier release
    // under the survivor too.
    let (third, third_bytes) = close_and_export(&ingest, store.as_ref(), &signing).await;
    assert_eq!(
        third.merges,
        vec![ClassMerge {
            absorbed: class_c,
            into: survivor
        }]
    );
    let path = dir.path().join("3.bundle");
    std::fs::write(&path, &third_bytes).unwrap();
    archive
        .import(&path, Some(&signing.verifying_key()), false)
        .unwrap();
    let report = decrypt_report(&archive.merged().unwrap());
    assert_eq!(report.decrypted.len(), 1, "{:?}", report.decrypted);
    assert_eq!(report.decrypted[0].reports, 841 + 240);
    assert_eq!(report.decrypted[0].merged_from, vec![absorbed.0, class_c.0]);
    drop(ingest);
    drop(store);
    writer.join().unwrap();
}
