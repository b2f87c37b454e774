//! Helpers shared by the aggregator's integration tests: a fast test key, report frames with
//! known plaintexts, and decryption of what the server stored.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, LazyLock};

use penrose_aggregator::export;
use penrose_aggregator::ingest::{Ingest, IngestConfig, Writer};
use penrose_aggregator::metrics::Metrics;
use penrose_aggregator::state::{State, stored_throttle};
use penrose_aggregator::store::{RocksStore, Store};
use penrose_core::bundle::{Bundle, ClassId};
use penrose_core::counters::{BIN_COUNT, CatalogueVersion, CounterId};
use penrose_core::fingerprint::{FingerprintParams, Fingerprinter, SnippetHash};
use penrose_core::histogram::SampleCount;
use penrose_core::paillier::{ACCUMULATOR_REPORT_BOUND, KeySize, Keypair};
use penrose_core::wire::{Day, LENGTH_PREFIX, Message, PackedBytes, Report, ReportId};
use rand::{Rng, RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// A 1024-bit key (insecure, fast) shared by all tests of a binary.
pub static KEYS: LazyLock<Keypair> = LazyLock::new(|| {
    Keypair::generate_with_size(KeySize::Bits1024, &mut ChaCha8Rng::seed_from_u64(41))
});

/// A report with the plaintext it carries.
#[derive(Clone)]
pub struct Sent {
    /// The frame body, as a transport hands it to the handler.
    pub frame: Vec<u8>,
    pub report_id: ReportId,
    pub snippet: SnippetHash,
    pub counter: CounterId,
    pub bins: [u32; BIN_COUNT],
}

/// Kernel names of a synthetic application: an iteration of 300 launches over 40 kernels.
pub fn names(app: usize, offset: usize, len: usize) -> Vec<String> {
    (0..len)
        .map(|i| {
            let step = (offset + i) % 300;
            format!("app{app}_k{}", (step * 7 + step / 13) % 40)
        })
        .collect()
}

/// Snippet hashes of `windows` windows of each of `apps` synthetic applications.
pub fn snippets(apps: usize, windows: usize) -> Vec<(usize, SnippetHash)> {
    let f = Fingerprinter::new(FingerprintParams::default()).unwrap();
    (0..apps)
        .flat_map(|app| {
            let f = f.clone();
            (0..windows).map(move |w| (app, f.snippet_hash(&names(app, w * 41, 1_500))))
        })
        .collect()
}

/// A valid report of random bins (samples = their sum) for `snippet` and `counter`.
pub fn report(snippet: SnippetHash, counter: CounterId, rng: &mut impl RngCore) -> Sent {
    let mut bins = [0u32; BIN_COUNT];
    for _ in 0..rng.random_range(1..20) {
        bins[rng.random_range(0..BIN_COUNT)] += rng.random_range(1..50);
    }
    report_with(snippet, counter, bins, rng)
}

/// A valid report of the given bins.
pub fn report_with(
    snippet: SnippetHash,
    counter: CounterId,
    bins: [u32; BIN_COUNT],
    rng: &mut impl RngCore,
) -> Sent {
    let public = KEYS.public_key();
    let mut rng = ChaCha8Rng::seed_from_u64(rng.next_u64());
    let packed = public.encrypt_packed(&bins, &mut rng).unwrap();
    let mut id = [0u8; 16];
    rng.fill_bytes(&mut id);
    let report = Report {
        key_id: public.key_id(),
        report_id: ReportId(id),
        snippet,
        counter,
        catalogue: CatalogueVersion(1),
        day: Day(20_000),
        samples: SampleCount(bins.iter().sum()),
        ciphertexts: PackedBytes::new(packed.to_bytes(), packed.ciphertexts().len()).unwrap(),
    };
    Sent {
        frame: Message::Report(report).to_frame().unwrap()[LENGTH_PREFIX..].to_vec(),
        report_id: ReportId(id),
        snippet,
        counter,
        bins,
    }
}

/// Opens a store and starts ingest over it.
pub fn start(dir: &Path, bound: u64, config: IngestConfig) -> (Ingest, Writer, Arc<dyn Store>) {
    let store: Arc<dyn Store> = Arc::new(RocksStore::open(dir).unwrap());
    let state = State::open(
        Arc::clone(&store),
        KEYS.public_key(),
        FingerprintParams::default(),
        bound,
    )
    .unwrap();
    let throttle = stored_throttle(store.as_ref()).unwrap();
    let (ingest, writer) =
        Ingest::start(state, throttle, config, Arc::new(Metrics::default())).unwrap();
    (ingest, writer, store)
}

/// Ingest with the default accumulator bound and batching.
/// Starts the `penrose-aggregator serve` binary on `data` with `key` and `args`, and waits for
/// the JSON line it prints once it listens (returned, with the child).
pub fn spawn_serve(data: &Path, key: &Path, args: &[&str]) -> (Child, serde_json::Value) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_penrose-aggregator"))
        .args(["serve", "--data-dir"])
        .arg(data)
        .arg("--public-key")
        .arg(key)
        .args(args)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let started = serde_json::from_str(&line)
        .unwrap_or_else(|e| panic!("server did not start ({e}): {line:?}"));
    (child, started)
}

pub fn start_default(dir: &Path) -> (Ingest, Writer, Arc<dyn Store>) {
    start(dir, ACCUMULATOR_REPORT_BOUND, IngestConfig::default())
}

/// Decrypted sums per (class, counter), added over generations, with report counts.
pub fn decrypt_bundle(bundle: &Bundle) -> BTreeMap<(ClassId, CounterId), (Vec<u64>, u64, u64)> {
    let mut out: BTreeMap<(ClassId, CounterId), (Vec<u64>, u64, u64)> = BTreeMap::new();
    for e in &bundle.entries {
        let packed = KEYS
            .public_key()
            .validate_packed(e.sums.as_bytes())
            .unwrap();
        let bins = KEYS.private_key().decrypt_packed(&packed).unwrap();
        let slot = out
            .entry((e.class, e.counter))
            .or_insert_with(|| (vec![0; BIN_COUNT], 0, 0));
        for (s, b) in slot.0.iter_mut().zip(bins.iter()) {
            *s += *b;
        }
        slot.1 += e.reports;
        slot.2 += e.samples;
    }
    out
}

/// Everything the store holds, decrypted.
pub fn decrypt_store(store: &dyn Store) -> BTreeMap<(ClassId, CounterId), (Vec<u64>, u64, u64)> {
    let bundle = export::collect(store, KEYS.public_key(), Default::default()).unwrap();
    decrypt_bundle(&bundle)
}

/// What the sums must be: `sent` added up by the class the server gave each snippet.
pub fn expected(
    sent: &[Sent],
    class_of: impl Fn(&SnippetHash) -> ClassId,
) -> BTreeMap<(ClassId, CounterId), (Vec<u64>, u64, u64)> {
    let mut out: BTreeMap<(ClassId, CounterId), (Vec<u64>, u64, u64)> = BTreeMap::new();
    for s in sent {
        let slot = out
            .entry((class_of(&s.snippet), s.counter))
            .or_insert_with(|| (vec![0; BIN_COUNT], 0, 0));
        for (e, b) in slot.0.iter_mut().zip(s.bins.iter()) {
            *e += u64::from(*b);
        }
        slot.1 += 1;
        slot.2 += u64::from(s.bins.iter().sum::<u32>());
    }
    out
}

/// A seeded generator for a test.
pub fn rng(seed: u64) -> ChaCha8Rng {
    ChaCha8Rng::seed_from_u64(seed)
}
