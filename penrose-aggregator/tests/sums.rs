//! Sums per (class, GPU architecture, counter), and accumulators loaded when touched: nothing is
//! read at start, a bounded number is held, and evicted ones reload with their exact state.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;

use common::*;
use penrose_aggregator::admission::Admission;
use penrose_aggregator::export;
use penrose_aggregator::state::{Outcome, State};
use penrose_aggregator::store::{RocksStore, Store};
use penrose_aggregator::validate::{ValidReport, validate_body};
use penrose_core::bundle::{ClassId, EpochId};
use penrose_core::counters::{BIN_COUNT, CounterId};
use penrose_core::gpu::GpuArch;
use penrose_core::paillier::ACCUMULATOR_REPORT_BOUND;
use penrose_core::wire::Day;

const TODAY: Day = Day(20_000);
const HOPPER: GpuArch = GpuArch::new(9, 0);
const AMPERE: GpuArch = GpuArch::new(8, 0);

/// A report of `counter` for `snippet` on `arch`, stamped [`TODAY`].
fn sent_on(
    arch: GpuArch,
    snippet: penrose_core::fingerprint::Fingerprint,
    counter: u16,
    rng: &mut impl rand::RngCore,
) -> Sent {
    let bins = random_bins(rng);
    let mut sent = report_by(&KEYS, snippet, CounterId(counter), bins, TODAY, rng);
    let mut report = decode_report(&sent.frame);
    report.arch = arch;
    sent.frame = report_body(report);
    sent
}

fn valid(sent: &[Sent]) -> Vec<ValidReport> {
    sent.iter()
        .map(|s| {
            validate_body(
                &s.frame,
                &penrose_aggregator::design_keys::DesignKeys::single(KEYS.public_key().clone()),
                TODAY,
                &Admission::Open,
            )
            .unwrap()
        })
        .collect()
}

fn accept(state: &mut State, sent: &[Sent]) {
    let outcomes = state.apply(&valid(sent), TODAY).unwrap();
    assert!(
        outcomes.iter().all(|o| *o == Outcome::Accepted),
        "{outcomes:?}"
    );
}

type Totals = BTreeMap<(ClassId, GpuArch, CounterId), (Vec<u64>, u64, u64)>;

/// Everything the store holds, open epochs included, per (class, architecture, counter).
fn store_totals(store: &dyn Store) -> Totals {
    let mut out = Totals::new();
    for e in export::all_sums(store).unwrap() {
        let bins = decrypt_one(&KEYS, &e);
        let slot = out
            .entry((e.class, e.arch, e.counter))
            .or_insert_with(|| (vec![0; BIN_COUNT], 0, 0));
        for (s, b) in slot.0.iter_mut().zip(bins) {
            *s += b;
        }
        slot.1 += e.reports;
        slot.2 += e.samples;
    }
    out
}

/// What the sums must be: `sent` (with the architecture each names) added up by class.
fn expected_totals(sent: &[(GpuArch, Sent)], state: &State) -> Totals {
    let mut out = Totals::new();
    for (arch, s) in sent {
        let class = state.class_of(&s.snippet).unwrap().unwrap();
        let slot = out
            .entry((class, *arch, s.counter))
            .or_insert_with(|| (vec![0; BIN_COUNT], 0, 0));
        for (e, b) in slot.0.iter_mut().zip(s.bins.iter()) {
            *e += u64::from(*b);
        }
        slot.1 += 1;
        slot.2 += u64::from(s.bins.iter().sum::<u32>());
    }
    out
}

#[test]
fn two_architectures_of_one_class_land_in_two_sums() {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> = Arc::new(RocksStore::open(dir.path()).unwrap());
    let mut state = open_state(&store);
    let snippet = snippets(1, 1)[0].1;
    let mut rng = rng(71);
    let mut sent = Vec::new();
    for i in 0..30 {
        let arch = if i % 3 == 0 { AMPERE } else { HOPPER };
        sent.push((arch, sent_on(arch, snippet, 4, &mut rng)));
    }
    let batch: Vec<Sent> = sent.iter().map(|(_, s)| s.clone()).collect();
    accept(&mut state, &batch);
    assert_eq!(
        state.tables().class_count(),
        1,
        "one application, one class"
    );
    assert_eq!(
        state.sums().open_count(),
        2,
        "one accumulator per architecture"
    );
    let totals = store_totals(store.as_ref());
    let class = state.class_of(&snippet.hash).unwrap().unwrap();
    assert_eq!(
        totals.keys().copied().collect::<Vec<_>>(),
        [(class, AMPERE, CounterId(4)), (class, HOPPER, CounterId(4))]
    );
    assert_eq!(totals[&(class, AMPERE, CounterId(4))].1, 10);
    assert_eq!(totals[&(class, HOPPER, CounterId(4))].1, 20);
    assert_eq!(totals, expected_totals(&sent, &state));

    // Closed and exported, the bundle carries the two sums apart, each with its architecture.
    let prepared = state.prepare_close(TODAY, true);
    prepared.commit().unwrap();
    let all = export::all_sums(store.as_ref()).unwrap();
    let mut arches: Vec<GpuArch> = all
        .iter()
        .filter(|e| e.epoch == EpochId(TODAY.0))
        .map(|e| e.arch)
        .collect();
    arches.sort();
    assert_eq!(arches, [AMPERE, HOPPER]);
}

/// Many sums, a restart: nothing is read at start, a key's first report reads its latest
/// state, and the totals are the same as before the restart plus what came after.
#[test]
fn a_restart_loads_no_accumulator_until_touched_and_the_totals_are_unchanged() {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> = Arc::new(RocksStore::open(dir.path()).unwrap());
    let mut state = open_state(&store);
    let apps = snippets(40, 1);
    let mut rng = rng(72);
    let mut sent = Vec::new();
    // 40 classes x 2 architectures x 3 counters = 240 sums, two batches.
    for round in 0..2 {
        let mut batch = Vec::new();
        for (_, snippet) in &apps {
            for arch in [AMPERE, HOPPER] {
                for counter in [4, 5, 6] {
                    let s = sent_on(arch, *snippet, counter, &mut rng);
                    batch.push(s.clone());
                    sent.push((arch, s));
                }
            }
        }
        accept(&mut state, &batch);
        assert_eq!(state.sums().open_count(), 240, "round {round}");
    }
    let before = store_totals(store.as_ref());
    assert_eq!(before, expected_totals(&sent, &state));
    assert_eq!(before.values().map(|t| t.1).sum::<u64>(), 480);
    drop(state);

    let mut state = open_state(&store);
    assert_eq!(
        state.sums().open_count(),
        0,
        "an accumulator was loaded at start"
    );
    assert_eq!(state.sums().loads(), 0);
    assert_eq!(store_totals(store.as_ref()), before);

    // One report on 3 of the 240 sums loads exactly those 3, each with its stored state.
    let (_, snippet) = apps[7];
    let mut batch = Vec::new();
    for counter in [4, 5] {
        let s = sent_on(HOPPER, snippet, counter, &mut rng);
        batch.push(s.clone());
        sent.push((HOPPER, s));
    }
    let s = sent_on(AMPERE, apps[20].1, 6, &mut rng);
    batch.push(s.clone());
    sent.push((AMPERE, s));
    accept(&mut state, &batch);
    assert_eq!(state.sums().open_count(), 3);
    assert_eq!(state.sums().loads(), 3);
    // A sum no report of the store had is not a load: it starts fresh.
    let fresh = snippets(41, 1)[40].1;
    let s = sent_on(HOPPER, fresh, 4, &mut rng);
    accept(&mut state, std::slice::from_ref(&s));
    sent.push((HOPPER, s));
    assert_eq!((state.sums().open_count(), state.sums().loads()), (4, 3));

    let after = store_totals(store.as_ref());
    assert_eq!(after, expected_totals(&sent, &state));
    assert_eq!(after.values().map(|t| t.1).sum::<u64>(), 484);
    // And again after a second restart, with nothing touched.
    drop(state);
    let state = open_state(&store);
    assert_eq!(state.sums().open_count(), 0);
    assert_eq!(store_totals(store.as_ref()), after);
}

/// With room for 4 accumulators, 60 sums touched over and over: clean ones are evicted, each
/// reloads with the reports and samples it had, and the totals stay exact, also across a
/// restart. An accumulator written by a batch still syncing is never evicted.
#[test]
fn evicted_accumulators_reload_exactly_and_unsynced_ones_are_kept() {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> = Arc::new(RocksStore::open(dir.path()).unwrap());
    let mut state = open_state(&store);
    state.set_held_accumulators(4);
    let apps = snippets(20, 1);
    let mut rng = rng(73);
    let mut sent = Vec::new();
    for round in 0..4 {
        for (i, (_, snippet)) in apps.iter().enumerate() {
            // Each batch touches 3 sums (one class, three counters).
            let arch = if (i + round) % 2 == 0 { HOPPER } else { AMPERE };
            let batch: Vec<Sent> = [4, 5, 6]
                .iter()
                .map(|&c| sent_on(arch, *snippet, c, &mut rng))
                .collect();
            sent.extend(batch.iter().map(|s| (arch, s.clone())));
            accept(&mut state, &batch);
            // Eviction runs before a batch: at most the capacity plus the last batch's 3.
            assert!(
                state.sums().open_count() <= 4 + 3,
                "{}",
                state.sums().open_count()
            );
        }
    }
    assert!(state.sums().evictions() > 0);
    assert!(state.sums().loads() > 0, "no evicted sum was touched again");
    assert_eq!(store_totals(store.as_ref()), expected_totals(&sent, &state));

    // Batch A touches a sum and is prepared but not committed; batch B, prepared meanwhile
    // with room for 1, must not evict A's sum (the store does not hold its state yet).
    state.set_held_accumulators(1);
    let a = sent_on(HOPPER, apps[0].1, 7, &mut rng);
    let b: Vec<Sent> = (1..4)
        .map(|i| sent_on(HOPPER, apps[i].1, 7, &mut rng))
        .collect();
    let prepared_a = state
        .prepare(&valid(std::slice::from_ref(&a)), TODAY)
        .unwrap();
    let evicted_before = state.sums().evictions();
    let prepared_b = state.prepare(&valid(&b), TODAY).unwrap();
    let dropped = state.sums().evictions() - evicted_before;
    assert!(state.sums().open_count() > 3, "A's sum and B's are held");
    assert!(dropped > 0, "clean sums were evicted");
    assert!(
        prepared_a
            .commit()
            .unwrap()
            .iter()
            .all(|o| *o == Outcome::Accepted)
    );
    assert!(
        prepared_b
            .commit()
            .unwrap()
            .iter()
            .all(|o| *o == Outcome::Accepted)
    );
    sent.push((HOPPER, a.clone()));
    sent.extend(b.iter().map(|s| (HOPPER, s.clone())));
    // A second report on A's sum adds to the state A wrote.
    let a2 = sent_on(HOPPER, apps[0].1, 7, &mut rng);
    accept(&mut state, std::slice::from_ref(&a2));
    sent.push((HOPPER, a2));
    let want = expected_totals(&sent, &state);
    assert_eq!(store_totals(store.as_ref()), want);
    let class = state.class_of(&apps[0].1.hash).unwrap().unwrap();
    assert_eq!(want[&(class, HOPPER, CounterId(7))].1, 2);

    drop(state);
    let mut state = open_state(&store);
    assert_eq!(state.sums().open_count(), 0);
    let a3 = sent_on(HOPPER, apps[0].1, 7, &mut rng);
    accept(&mut state, std::slice::from_ref(&a3));
    sent.push((HOPPER, a3));
    assert_eq!(state.sums().loads(), 1);
    let want = expected_totals(&sent, &state);
    assert_eq!(want[&(class, HOPPER, CounterId(7))].1, 3);
    assert_eq!(store_totals(store.as_ref()), want);
}

/// Measures what one held accumulator costs in resident memory under a 2048-bit key (the
/// figure docs/operations.md states): `cargo test -p penrose-aggregator --test sums --
/// --ignored --nocapture`.
#[test]
#[ignore = "a measurement, not a check"]
fn measure_held_accumulator_bytes() {
    use penrose_core::paillier::Accumulator;
    const N: usize = 20_000;
    let key = KEYS_2048.public_key();
    let mut rng = rng(74);
    let bins = random_bins(&mut rng);
    let packed = key.encrypt_packed(&bins, &mut rng).unwrap();
    let mut one = Accumulator::with_bound(key, ACCUMULATOR_REPORT_BOUND).unwrap();
    one.absorb_bytes(&packed.to_bytes(), u64::from(bins.iter().sum::<u32>()))
        .unwrap();
    let state = one.state_bytes();
    let before = own_rss_kib();
    let held: Vec<Accumulator> = (0..N)
        .map(|_| {
            Accumulator::restore(key, ACCUMULATOR_REPORT_BOUND, &state, 1, one.samples()).unwrap()
        })
        .collect();
    let after = own_rss_kib();
    println!(
        "{N} accumulators: {} KiB resident, {:.0} bytes each",
        after - before,
        (after - before) as f64 * 1024.0 / N as f64
    );
    drop(held);
}
