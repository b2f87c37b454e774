//! Key rollover through both servers: under the design server's signed key list the
//! aggregation server accepts a day's key and, within the grace days, the key it replaced;
//! keeps their sums apart in one epoch; releases them in one bundle that names both keys; and
//! the design server decrypts each sum with its own key. A key the list does not give the
//! report's day is refused, a list the pinned signer did not sign is refused, and an older
//! list cannot replace a newer one. A format 7 store (one key) is migrated when opened.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::{Arc, LazyLock};

use common::*;
use ed25519_dalek::SigningKey;
use penrose_aggregator::admission::Admission;
use penrose_aggregator::design_keys::{DesignKeyError, DesignKeys, KeySettings, KeySlot};
use penrose_aggregator::export;
use penrose_aggregator::ingest::{Ingest, IngestConfig, Writer};
use penrose_aggregator::metrics::Metrics;
use penrose_aggregator::state::{State, StateError, meta, stored_throttle};
use penrose_aggregator::store::{RocksStore, Store, Table, WriteSet};
use penrose_aggregator::validate::{Rejection, validate_body};
use penrose_core::counters::CounterId;
use penrose_core::fingerprint::{FingerprintParams, Fingerprinter};
use penrose_core::key_list::{KeyList, KeyListError, ScheduledKey};
use penrose_core::paillier::{ACCUMULATOR_REPORT_BOUND, KeySize, Keypair};
use penrose_core::release::ReleaseRule;
use penrose_core::release::{ReportsPerContributor, Threshold};
use penrose_core::wire::{AckStatus, Day, RejectReason};
use penrose_design::archive::Archive;
use penrose_design::report::{self, ReportError};
use penrose_host::clock::today;
use rand::SeedableRng;

const COUNTER: CounterId = CounterId(4);

/// The key that replaces [`KEYS`] today.
static NEW: LazyLock<Keypair> = LazyLock::new(|| {
    Keypair::generate_with_size(
        KeySize::Bits1024,
        &mut rand_chacha::ChaCha8Rng::seed_from_u64(77),
    )
});

/// A 2048-bit key to replace [`common::KEYS_2048`] in list files, which must hold keys at the
/// size floor.
static NEW_2048: LazyLock<Keypair> =
    LazyLock::new(|| Keypair::generate(&mut rand_chacha::ChaCha8Rng::seed_from_u64(78)));

fn signer() -> SigningKey {
    SigningKey::from_bytes(&[31; 32])
}

/// [`KEYS`] from day 0, [`NEW`] from `switch`, two grace days.
fn list(sequence: u64, switch: Day) -> KeyList {
    KeyList::new(
        sequence,
        2,
        vec![
            ScheduledKey {
                from: Day(0),
                key: KEYS.public_key().clone(),
            },
            ScheduledKey {
                from: switch,
                key: NEW.public_key().clone(),
            },
        ],
    )
    .unwrap()
}

fn settings(list: &KeyList) -> KeySettings {
    KeySettings::signed(list.sign(&signer()), signer().verifying_key()).unwrap()
}

/// A running ingest pipeline; the caller joins the writer after dropping the ingest handle, so
/// that no thread still uses the store when the test process exits.
fn start(dir: &std::path::Path, keys: KeySettings) -> (Ingest, Writer, Arc<dyn Store>) {
    let store: Arc<dyn Store> = Arc::new(RocksStore::open(dir).unwrap());
    let state = State::open(
        Arc::clone(&store),
        keys,
        FingerprintParams::default(),
        ACCUMULATOR_REPORT_BOUND,
        None,
    )
    .unwrap();
    let throttle = stored_throttle(store.as_ref()).unwrap();
    let (ingest, writer) = Ingest::start(
        state,
        throttle,
        IngestConfig::default(),
        Admission::Open,
        Arc::new(Metrics::default()),
    )
    .unwrap();
    (ingest, writer, store)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sums_under_two_keys_stay_apart_and_each_decrypts_with_its_own() {
    let dir = tempfile::tempdir().unwrap();
    let today = today();
    let (ingest, writer, store) = start(&dir.path().join("agg"), settings(&list(1, today)));
    let snippet = Fingerprinter::new(FingerprintParams::default())
        .unwrap()
        .fingerprint_of_names(&names(3, 0, 1_500));
    let mut rng = rng(5);
    let mut old = Vec::new();
    let mut new = Vec::new();
    for i in 0..480 {
        let keys: &Keypair = if i % 2 == 0 { &KEYS } else { &NEW };
        let sent = report_by(
            keys,
            snippet,
            COUNTER,
            random_bins(&mut rng),
            today,
            &mut rng,
        );
        assert_eq!(
            ingest.handle(sent.frame.clone()).await.status,
            AckStatus::Accepted,
            "report {i}"
        );
        if i % 2 == 0 { &mut old } else { &mut new }.push(sent);
    }
    // The new key before its first day, and a key nobody listed, are refused.
    let early = report_by(
        &NEW,
        snippet,
        COUNTER,
        random_bins(&mut rng),
        Day(today.0 - 1),
        &mut rng,
    );
    assert_eq!(
        ingest.handle(early.frame).await.status,
        AckStatus::Rejected(RejectReason::UnknownKey)
    );
    let stranger = Keypair::generate_with_size(KeySize::Bits1024, &mut rng);
    let unknown = report_by(
        &stranger,
        snippet,
        COUNTER,
        random_bins(&mut rng),
        today,
        &mut rng,
    );
    assert_eq!(
        ingest.handle(unknown.frame).await.status,
        AckStatus::Rejected(RejectReason::UnknownKey)
    );
    assert_eq!(
        ingest.answer(
            &penrose_core::wire::Message::KeyListRequest
                .to_frame()
                .unwrap()[4..]
        ),
        Some(
            penrose_core::wire::Message::KeyList(list(1, today).sign(&signer()))
                .to_frame()
                .unwrap()
        ),
        "the signed list is passed on as signed"
    );

    close_all(&ingest).await;
    let signing = SigningKey::from_bytes(&[9; 32]);
    let (bundle, bytes) = export::export(store.as_ref(), ReleaseRule::default(), &signing)
        .unwrap()
        .unwrap();
    assert_eq!(
        bundle.keys,
        vec![KEYS.public_key().key_id(), NEW.public_key().key_id()]
    );
    assert_eq!(bundle.entries.len(), 2, "one sum per key");
    for (entry, (keys, sent)) in bundle.entries.iter().zip([(&*KEYS, &old), (&*NEW, &new)]) {
        assert_eq!(
            bundle.keys[usize::from(entry.key)],
            keys.public_key().key_id()
        );
        assert_eq!(entry.reports, 240);
        let mut want = vec![0u64; penrose_core::counters::BIN_COUNT];
        for s in sent.iter() {
            for (w, b) in want.iter_mut().zip(s.bins) {
                *w += u64::from(b);
            }
        }
        assert_eq!(decrypt_one(keys, entry), want);
    }

    let archive = Archive::open(&dir.path().join("design")).unwrap();
    let path = dir.path().join("1.bundle");
    std::fs::write(&path, &bytes).unwrap();
    archive
        .import(&path, Some(&signing.verifying_key()), false)
        .unwrap();
    let merged = archive.merged().unwrap();
    let only_old = report::build(
        &merged,
        std::slice::from_ref(KEYS.private_key()),
        Threshold::DEFAULT,
        ReportsPerContributor::DEFAULT,
    );
    assert!(
        matches!(only_old, Err(ReportError::WrongKey { archive, .. }) if archive == NEW.public_key().key_id())
    );
    let both = report::build(
        &merged,
        &[KEYS.private_key().clone(), NEW.private_key().clone()],
        Threshold::DEFAULT,
        ReportsPerContributor::DEFAULT,
    )
    .unwrap();
    assert_eq!(
        both.decrypted.len(),
        1,
        "one (class, counter): the keys add up"
    );
    assert_eq!(both.decrypted[0].reports, 480);
    assert!(both.quarantined.is_empty());
    drop(ingest);
    writer.join().unwrap();
}

#[test]
fn the_old_key_is_accepted_only_within_the_grace_days() {
    let today = Day(20_000);
    let list = list(1, Day(today.0 - 2));
    let dir = tempfile::tempdir().unwrap();
    let store = RocksStore::open(dir.path()).unwrap();
    let mut set = WriteSet::new();
    let keys = DesignKeys::load(&store, settings(&list), &mut set).unwrap();
    let snippet = Fingerprinter::new(FingerprintParams::default())
        .unwrap()
        .fingerprint_of_names(&names(1, 0, 1_500));
    let mut rng = rng(6);
    let on = |k: &Keypair, day: Day, rng: &mut rand_chacha::ChaCha8Rng| {
        let sent = report_by(k, snippet, COUNTER, random_bins(rng), day, rng);
        validate_body(&sent.frame, &keys, today, &Admission::Open)
    };
    // Switched two days ago, two grace days: yesterday's reports may still use the old key,
    // today's may not.
    assert_eq!(
        on(&KEYS, Day(today.0 - 1), &mut rng).unwrap().key,
        KeySlot(0)
    );
    assert!(matches!(
        on(&KEYS, today, &mut rng),
        Err(Rejection::UnknownKey { expected: Some(k), day, .. })
            if k == NEW.public_key().key_id() && day == today.0
    ));
    assert_eq!(on(&NEW, today, &mut rng).unwrap().key, KeySlot(1));
}

#[test]
fn a_forged_or_older_list_is_refused_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> = Arc::new(RocksStore::open(dir.path()).unwrap());
    let open = |keys: KeySettings| {
        State::open(
            Arc::clone(&store),
            keys,
            FingerprintParams::default(),
            ACCUMULATOR_REPORT_BOUND,
            None,
        )
    };
    let mut state = open(settings(&list(5, Day(100)))).unwrap();
    // Signed by someone else (the aggregation server itself, say): refused before use.
    let mallory = SigningKey::from_bytes(&[66; 32]);
    assert_eq!(
        KeySettings::signed(list(6, Day(100)).sign(&mallory), signer().verifying_key())
            .unwrap_err(),
        KeyListError::BadSignature
    );
    // Older than the one applied: refused by a running server and at the next start.
    let err = state
        .replace_keys(settings(&list(4, Day(100))))
        .unwrap_err();
    assert!(
        matches!(
            err,
            StateError::Keys(DesignKeyError::List(KeyListError::Rollback {
                offered: 4,
                held: 5
            }))
        ),
        "{err}"
    );
    assert_eq!(state.keys().list().sequence(), 5);
    drop(state);
    assert!(open(settings(&list(4, Day(100)))).is_err());
    // A newer one is applied; without key settings the store goes on with it.
    let mut state = open(settings(&list(5, Day(100)))).unwrap();
    state.replace_keys(settings(&list(7, Day(90)))).unwrap();
    drop(state);
    let stored = penrose_aggregator::design_keys::stored_settings(store.as_ref())
        .unwrap()
        .unwrap();
    assert_eq!(stored.list().sequence(), 7);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_format_7_store_is_migrated_and_keeps_its_sums() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("agg");
    let snippet = Fingerprinter::new(FingerprintParams::default())
        .unwrap()
        .fingerprint_of_names(&names(2, 0, 1_500));
    let mut rng = rng(8);
    let before = {
        let (ingest, writer, store) = start_default(&data);
        for _ in 0..30 {
            let sent = report(snippet, COUNTER, &mut rng);
            assert_eq!(ingest.handle(sent.frame).await.status, AckStatus::Accepted);
        }
        let sums = export::all_sums(store.as_ref()).unwrap();
        drop(ingest);
        writer.join().unwrap();
        drop(store);
        sums
    };
    // Write it back as format 7 wrote it: one key in meta, 18-byte ASH keys.
    {
        let store = RocksStore::open(&data).unwrap();
        let mut rows = Vec::new();
        store
            .scan(&[Table::Ash], &mut |_, k, v| {
                rows.push((k.to_vec(), v.to_vec()));
                Ok(())
            })
            .unwrap();
        assert!(!rows.is_empty());
        let mut set = WriteSet::new();
        for (k, v) in &rows {
            let mut end = k.clone();
            end.push(0);
            set.delete_range(Table::Ash, k.clone(), end);
            let mut old = k[..14].to_vec();
            old.extend_from_slice(&k[15..]);
            set.put(Table::Ash, old, v.clone());
        }
        let slot = penrose_aggregator::design_keys::slot_record_key(KeySlot(0));
        let mut end = slot.clone();
        end.push(0);
        set.delete_range(Table::Meta, slot, end);
        set.put(
            Table::Meta,
            meta::KEY_ID,
            KEYS.public_key().key_id().0.to_vec(),
        );
        set.put(Table::Meta, meta::PUBLIC_KEY, KEYS.public_key().to_bytes());
        set.put(Table::Meta, meta::FORMAT, 7u32.to_be_bytes().to_vec());
        store.write(set).unwrap();
    }
    let (ingest, writer, store) = start_default(&data);
    assert_eq!(
        store.get(Table::Meta, meta::FORMAT).unwrap(),
        Some(8u32.to_be_bytes().to_vec())
    );
    assert_eq!(export::all_sums(store.as_ref()).unwrap(), before);
    // And it goes on summing into the migrated accumulators.
    let sent = report(snippet, COUNTER, &mut rng);
    assert_eq!(ingest.handle(sent.frame).await.status, AckStatus::Accepted);
    let after = export::all_sums(store.as_ref()).unwrap();
    assert_eq!(after.len(), before.len());
    assert_eq!(after[0].reports, before[0].reports + 1);
    drop(ingest);
    writer.join().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_reads_the_list_file_again_and_a_bad_file_leaves_the_list_in_use() {
    let dir = tempfile::tempdir().unwrap();
    let list_path = dir.path().join("keys.list");
    let signer_path = dir.path().join("list-signing.pub");
    std::fs::write(
        &signer_path,
        format!(
            "# pinned\n{}\n",
            penrose_core::hex::encode(signer().verifying_key().as_bytes())
        ),
    )
    .unwrap();
    // List files hold keys at the size floor: a reload checks it like a start does.
    let strong = |sequence, switch| {
        KeyList::new(
            sequence,
            2,
            vec![
                ScheduledKey {
                    from: Day(0),
                    key: common::KEYS_2048.public_key().clone(),
                },
                ScheduledKey {
                    from: switch,
                    key: NEW_2048.public_key().clone(),
                },
            ],
        )
        .unwrap()
    };
    std::fs::write(&list_path, strong(1, Day(100)).sign(&signer())).unwrap();
    let settings = KeySettings::from_files(&list_path, &signer_path).unwrap();
    let (ingest, writer, _store) = start(&dir.path().join("agg"), settings);
    assert_eq!(ingest.design_keys().list().sequence(), 1);
    std::fs::write(&list_path, strong(2, Day(90)).sign(&signer())).unwrap();
    ingest.reload_design_keys().unwrap();
    assert_eq!(ingest.design_keys().list().sequence(), 2);
    assert_eq!(
        ingest.design_keys().current(Day(95)).map(|k| k.key_id()),
        Some(NEW_2048.public_key().key_id())
    );
    for bad in [
        b"not a list".to_vec(),
        strong(3, Day(90)).sign(&SigningKey::from_bytes(&[1; 32])),
        strong(1, Day(100)).sign(&signer()),
        // Newer and well signed, but its keys are 1024-bit: under the floor.
        list(3, Day(90)).sign(&signer()),
    ] {
        std::fs::write(&list_path, bad).unwrap();
        assert!(ingest.reload_design_keys().is_err());
        assert_eq!(ingest.design_keys().list().sequence(), 2);
    }
    drop(ingest);
    writer.join().unwrap();
}
