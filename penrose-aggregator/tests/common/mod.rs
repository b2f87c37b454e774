//! Helpers shared by the aggregator's integration tests: a fast test key (in-process tests) and
//! a 2048-bit one (tests of the `serve` binary, which refuses smaller keys), report frames with
//! known plaintexts stamped with the server's day, and decryption of what the server stored.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, LazyLock};

use penrose_aggregator::admission::{Admission, TokenRing};
use penrose_aggregator::epochs::EpochPolicy;
use penrose_aggregator::epochs::EpochRecord;
use penrose_aggregator::export;
use penrose_aggregator::ingest::{Ingest, IngestConfig, Writer};
use penrose_aggregator::metrics::Metrics;
use penrose_aggregator::serve::Listening;
use penrose_aggregator::state::{State, stored_throttle};
use penrose_aggregator::store::{RocksStore, Store, Table};
use penrose_core::bundle::{BundleEntry, ClassId};
use penrose_core::counters::{BIN_COUNT, CatalogueVersion, CounterId};
use penrose_core::fingerprint::{
    Fingerprint, FingerprintParams, Fingerprinter, LOCATOR_BANDS, Locator, SnippetHash,
};
use penrose_core::histogram::SampleCount;
use penrose_core::paillier::{ACCUMULATOR_REPORT_BOUND, KeySize, Keypair};
use penrose_core::tokens::{
    IssuerKey, KeyRing, MAX_BATCH, REDEMPTION_BYTES, Token, TokenEpoch, TokenRequest, TokenScope,
};
use penrose_core::wire::{
    AdmissionToken, Day, LENGTH_PREFIX, Message, PackedBytes, Report, ReportId,
};
use penrose_host::clock::today;
use rand::{Rng, RngCore, SeedableRng};
use rand_chacha::{ChaCha8Rng, ChaCha20Rng};

/// A 1024-bit key (insecure, fast) shared by all tests of a binary: for tests that run the
/// state and ingest in-process, which do not check the key size.
pub static KEYS: LazyLock<Keypair> = LazyLock::new(|| {
    Keypair::generate_with_size(KeySize::Bits1024, &mut ChaCha8Rng::seed_from_u64(41))
});

/// A 2048-bit key: the smallest `serve --public-key` accepts.
pub static KEYS_2048: LazyLock<Keypair> =
    LazyLock::new(|| Keypair::generate(&mut ChaCha8Rng::seed_from_u64(43)));

/// A report with the plaintext it carries.
#[derive(Clone)]
pub struct Sent {
    /// The frame body, as a transport hands it to the handler.
    pub frame: Vec<u8>,
    pub report_id: ReportId,
    pub snippet: SnippetHash,
    pub counter: CounterId,
    pub day: Day,
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

/// Fingerprints of `windows` windows of each of `apps` synthetic applications.
pub fn snippets(apps: usize, windows: usize) -> Vec<(usize, Fingerprint)> {
    let f = Fingerprinter::new(FingerprintParams::default()).unwrap();
    (0..apps)
        .flat_map(|app| {
            let f = f.clone();
            (0..windows).map(move |w| (app, f.fingerprint_of_names(&names(app, w * 41, 1_500))))
        })
        .collect()
}

/// What a report helper takes as its snippet: a fingerprint, or a bare snippet hash, which is
/// sent with a locator of zeros (for tests about one snippet or about malformed hashes, not
/// about class search: such snippets find each other only through that one shared key).
pub trait IntoFingerprint {
    fn into_fingerprint(self) -> Fingerprint;
}

impl IntoFingerprint for Fingerprint {
    fn into_fingerprint(self) -> Fingerprint {
        self
    }
}

impl IntoFingerprint for SnippetHash {
    fn into_fingerprint(self) -> Fingerprint {
        Fingerprint {
            hash: self,
            locator: Locator([0; LOCATOR_BANDS]),
        }
    }
}

/// Random bins of a report (samples = their sum).
pub fn random_bins(rng: &mut impl RngCore) -> [u32; BIN_COUNT] {
    let mut bins = [0u32; BIN_COUNT];
    for _ in 0..rng.random_range(1..20) {
        bins[rng.random_range(0..BIN_COUNT)] += rng.random_range(1..50);
    }
    bins
}

/// A valid report of random bins under [`KEYS`], stamped with the server's day.
pub fn report(snippet: impl IntoFingerprint, counter: CounterId, rng: &mut impl RngCore) -> Sent {
    let bins = random_bins(rng);
    report_with(snippet, counter, bins, rng)
}

/// A valid report of random bins under [`KEYS_2048`], stamped with the server's day.
pub fn report_2048(
    snippet: impl IntoFingerprint,
    counter: CounterId,
    rng: &mut impl RngCore,
) -> Sent {
    let bins = random_bins(rng);
    report_by(&KEYS_2048, snippet, counter, bins, today(), rng)
}

/// A valid report of the given bins under [`KEYS`], stamped with the server's day.
pub fn report_with(
    snippet: impl IntoFingerprint,
    counter: CounterId,
    bins: [u32; BIN_COUNT],
    rng: &mut impl RngCore,
) -> Sent {
    report_by(&KEYS, snippet, counter, bins, today(), rng)
}

/// A report of the given bins under `keys`, stamped `day`, with a fresh report id and a fresh
/// encryption.
pub fn report_by(
    keys: &Keypair,
    snippet: impl IntoFingerprint,
    counter: CounterId,
    bins: [u32; BIN_COUNT],
    day: Day,
    rng: &mut impl RngCore,
) -> Sent {
    let declared = SampleCount(bins.iter().sum());
    report_declaring(keys, snippet, counter, bins, declared, day, rng)
}

/// [`report_by`] declaring `samples` whatever the bins add up to: a report only the design
/// server can tell is bad (the aggregation server sees no plaintext).
pub fn report_declaring(
    keys: &Keypair,
    snippet: impl IntoFingerprint,
    counter: CounterId,
    bins: [u32; BIN_COUNT],
    samples: SampleCount,
    day: Day,
    rng: &mut impl RngCore,
) -> Sent {
    let snippet = snippet.into_fingerprint();
    let public = keys.public_key();
    let mut rng = ChaCha8Rng::seed_from_u64(rng.next_u64());
    let packed = public.encrypt_packed(&bins, &mut rng).unwrap();
    let mut id = [0u8; 16];
    rng.fill_bytes(&mut id);
    let report = Report {
        key_id: public.key_id(),
        report_id: ReportId(id),
        snippet: snippet.hash,
        locator: snippet.locator,
        arch: penrose_core::gpu::GpuArch::new(9, 0),
        counter,
        catalogue: CatalogueVersion(1),
        day,
        samples,
        ciphertexts: PackedBytes::new(packed.to_bytes(), packed.ciphertexts().len()).unwrap(),
        token: None,
        evidence: None,
    };
    Sent {
        frame: Message::Report(report).to_frame().unwrap()[LENGTH_PREFIX..].to_vec(),
        report_id: ReportId(id),
        snippet: snippet.hash,
        counter,
        day,
        bins,
    }
}

/// Where the report id sits in a frame body: after the kind (1), version (2) and key id (32).
pub const REPORT_ID_AT: usize = 1 + 2 + 32;

/// The same frame body with another report id: an exact copy of the report (same
/// ciphertexts) that dedup by report id alone would count again.
pub fn with_report_id(body: &[u8], id: [u8; 16]) -> Vec<u8> {
    let mut copy = body.to_vec();
    copy[REPORT_ID_AT..REPORT_ID_AT + 16].copy_from_slice(&id);
    copy
}

/// Opens a store and starts ingest over it (epochs as the store says; a new store: by day).
pub fn start(dir: &Path, bound: u64, config: IngestConfig) -> (Ingest, Writer, Arc<dyn Store>) {
    start_with(dir, bound, config, None)
}

/// Opens a store with an epoch policy and starts ingest over it, with open admission (these
/// tests are not about admission tokens; tests/tokens.rs is).
pub fn start_with(
    dir: &Path,
    bound: u64,
    config: IngestConfig,
    policy: Option<EpochPolicy>,
) -> (Ingest, Writer, Arc<dyn Store>) {
    start_admitting(dir, bound, config, policy, Admission::Open)
}

/// Opens a store and starts ingest over it, admitting reports as `admission` says.
pub fn start_admitting(
    dir: &Path,
    bound: u64,
    config: IngestConfig,
    policy: Option<EpochPolicy>,
    admission: Admission,
) -> (Ingest, Writer, Arc<dyn Store>) {
    let store: Arc<dyn Store> = Arc::new(RocksStore::open(dir).unwrap());
    let state = State::open(
        Arc::clone(&store),
        KEYS.public_key(),
        FingerprintParams::default(),
        bound,
        policy,
    )
    .unwrap();
    let throttle = stored_throttle(store.as_ref()).unwrap();
    let (ingest, writer) = Ingest::start(
        state,
        throttle,
        config,
        admission,
        Arc::new(Metrics::default()),
    )
    .unwrap();
    (ingest, writer, store)
}

/// Starts the `penrose-aggregator serve` binary on `data` with `key` and `args`, with open
/// admission (`--open-admission`: these tests are not about admission tokens) unless `args`
/// name a key ring (`--token-keys`), and waits for the JSON line it prints once it listens
/// (returned, with the child).
pub fn spawn_serve(data: &Path, key: &Path, args: &[&str]) -> (Child, Listening) {
    let admission: &[&str] = if args.contains(&"--token-keys") {
        &[]
    } else {
        &["--open-admission"]
    };
    let mut child = Command::new(env!("CARGO_BIN_EXE_penrose-aggregator"))
        .args(["serve", "--data-dir"])
        .arg(data)
        .arg("--public-key")
        .arg(key)
        .args(admission)
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

/// Ingest with the default accumulator bound and batching.
pub fn start_default(dir: &Path) -> (Ingest, Writer, Arc<dyn Store>) {
    start(dir, ACCUMULATOR_REPORT_BOUND, IngestConfig::default())
}

/// Decrypted sums per (class, counter), added over generations and epochs, with report and
/// sample counts, under [`KEYS`].
pub fn decrypt_entries(
    entries: &[BundleEntry],
) -> BTreeMap<(ClassId, CounterId), (Vec<u64>, u64, u64)> {
    decrypt_entries_with(&KEYS, entries)
}

/// [`decrypt_entries`] under `keys`.
pub fn decrypt_entries_with(
    keys: &Keypair,
    entries: &[BundleEntry],
) -> BTreeMap<(ClassId, CounterId), (Vec<u64>, u64, u64)> {
    let mut out: BTreeMap<(ClassId, CounterId), (Vec<u64>, u64, u64)> = BTreeMap::new();
    for e in entries {
        let bins = decrypt_one(keys, e);
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

/// The bins of one sum.
pub fn decrypt_one(keys: &Keypair, entry: &BundleEntry) -> Vec<u64> {
    let packed = keys
        .public_key()
        .validate_packed(entry.sums.as_bytes())
        .unwrap();
    keys.private_key().decrypt_packed(&packed).unwrap().to_vec()
}

/// Everything the store holds, open epochs included, decrypted under [`KEYS`].
pub fn decrypt_store(store: &dyn Store) -> BTreeMap<(ClassId, CounterId), (Vec<u64>, u64, u64)> {
    decrypt_store_with(&KEYS, store)
}

/// [`decrypt_store`] under `keys`.
pub fn decrypt_store_with(
    keys: &Keypair,
    store: &dyn Store,
) -> BTreeMap<(ClassId, CounterId), (Vec<u64>, u64, u64)> {
    let sums = export::all_sums(store).unwrap();
    decrypt_entries_with(keys, &sums)
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

/// Every row of every table: to check that something changed nothing.
pub fn dump(store: &dyn Store) -> Vec<(Table, Vec<u8>, Vec<u8>)> {
    let mut rows = Vec::new();
    store
        .scan(&Table::ALL, &mut |t, k, v| {
            rows.push((t, k.to_vec(), v.to_vec()));
            Ok(())
        })
        .unwrap();
    rows
}

/// Closes every open epoch that holds reports (the operator's `close-epoch`), from async code.
pub async fn close_all(ingest: &Ingest) -> Vec<EpochRecord> {
    let ingest = ingest.clone();
    tokio::task::spawn_blocking(move || ingest.close_epochs(true))
        .await
        .unwrap()
        .unwrap()
}

/// The state of `store` under [`KEYS`], with the default parameters.
pub fn open_state(store: &Arc<dyn Store>) -> State {
    State::open(
        Arc::clone(store),
        KEYS.public_key(),
        FingerprintParams::default(),
        ACCUMULATOR_REPORT_BOUND,
        None,
    )
    .unwrap()
}

/// The store a `serve` process left in `data` and the state rebuilt from it (under
/// [`KEYS_2048`], the key `serve` tests use), to check what a server run counted.
pub fn reopen_served(data: &Path) -> (Arc<dyn Store>, State) {
    let store: Arc<dyn Store> = Arc::new(RocksStore::open(&data.join("db")).unwrap());
    let state = State::open(
        Arc::clone(&store),
        KEYS_2048.public_key(),
        FingerprintParams::default(),
        ACCUMULATOR_REPORT_BOUND,
        None,
    )
    .unwrap();
    (store, state)
}

/// A seeded generator for a test.
pub fn rng(seed: u64) -> ChaCha8Rng {
    ChaCha8Rng::seed_from_u64(seed)
}

/// An issuer's key ring of `days` x `counters` (token epoch = day, scope = counter), from
/// `seed`.
pub fn token_ring(days: &[Day], counters: &[CounterId], seed: u64) -> KeyRing {
    let mut rng = ChaCha20Rng::seed_from_u64(seed);
    let keys = days.iter().flat_map(|day| {
        counters
            .iter()
            .map(|c| (TokenEpoch(day.0), TokenScope(c.0)))
            .collect::<Vec<_>>()
    });
    KeyRing::new(
        keys.map(|(epoch, scope)| IssuerKey::generate(epoch, scope, &mut rng))
            .collect::<Vec<_>>(),
    )
    .unwrap()
}

/// `n` tokens of `ring`'s key of (`day`, `counter`), issued as the issuer would (blinded
/// request, evaluation with its proof, the client's check and unblinding).
pub fn mint(ring: &KeyRing, day: Day, counter: CounterId, n: usize, seed: u64) -> Vec<Token> {
    let mut rng = ChaCha20Rng::seed_from_u64(seed);
    let key = ring.get(TokenEpoch(day.0), TokenScope(counter.0)).unwrap();
    let set = ring.key_set();
    let entry = set.get(key.epoch(), key.scope()).unwrap();
    let mut tokens = Vec::with_capacity(n);
    while tokens.len() < n {
        let batch = (n - tokens.len()).min(MAX_BATCH);
        let pending = TokenRequest::new(entry, batch, &mut rng).unwrap();
        let response = key.issue(pending.request(), &mut rng).unwrap();
        tokens.extend(pending.finalize(&response).unwrap());
    }
    tokens
}

/// The report in a frame body.
pub fn decode_report(body: &[u8]) -> Report {
    match Message::decode_body(body).unwrap() {
        Message::Report(r) => r,
        other => panic!("not a report: {other:?}"),
    }
}

/// A report's frame body.
pub fn report_body(report: Report) -> Vec<u8> {
    Message::Report(report).to_frame().unwrap()[LENGTH_PREFIX..].to_vec()
}

/// The frame body with `token` spent on it (its redemption over this very report).
pub fn with_token(body: &[u8], token: &Token) -> Vec<u8> {
    let mut report = decode_report(body);
    report.token = Some(AdmissionToken(
        token.redeem(&report.token_binding()).encode(),
    ));
    report_body(report)
}

/// The frame body carrying these 100 token bytes, whatever they are.
pub fn with_token_bytes(body: &[u8], bytes: [u8; REDEMPTION_BYTES]) -> Vec<u8> {
    let mut report = decode_report(body);
    report.token = Some(AdmissionToken(bytes));
    report_body(report)
}

/// Writes `ring` to `path` (mode 0600), as the issuer exports it.
pub fn write_ring(path: &Path, ring: &KeyRing) {
    penrose_aggregator::admission::write_key_ring(path, ring).unwrap();
}

/// Admission by tokens of `ring`.
pub fn by_tokens(ring: &KeyRing) -> Admission {
    Admission::Tokens(TokenRing::new(ring.clone()))
}

/// Resident memory of this process in KiB (VmRSS).
pub fn own_rss_kib() -> u64 {
    rss_kib_of("self")
}

/// Resident memory of process `pid` (or "self") in KiB (VmRSS).
pub fn rss_kib_of(pid: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

/// Whether the real traces are here (`penrose_traces::TraceFolder::default_dir`); says SKIPPED
/// on the process's own stderr (libtest captures `eprintln!`; CI counts these lines) when not:
/// a fresh clone has no `../shared`.
pub fn traces_present() -> bool {
    let dir = penrose_traces::TraceFolder::default_dir();
    let present = penrose_traces::TraceFolder::open(&dir).is_ok_and(|f| !f.files().is_empty());
    if !present {
        penrose_host::skip::skipped(format_args!(
            "SKIPPED: the real traces are not in {} (set PENROSE_TRACES)",
            dir.display()
        ));
    }
    present
}
