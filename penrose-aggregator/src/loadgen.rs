//! The load generator: many concurrent clients sending valid encrypted reports built from the
//! real traces' fingerprints, plus a share of invalid ones, over the real QUIC transport.
//!
//! Snippet hashes come from capture windows at random offsets of each trace's main process
//! (as an agent would see them). Encrypting a histogram costs an agent about 2 ms, which a
//! generator sending tens of thousands of reports a second cannot pay per report, so the
//! plaintexts come from a pool of `--pool` histograms encrypted up front. The server folds
//! exact copies of a ciphertext (a resent histogram counts once), so every report still needs
//! ciphertexts of its own: before the timed phase, report i's are its pool histogram
//! multiplied by a combination of encryptions of zero chosen by i (a few multiplications mod
//! n^2 instead of an encryption), distinct for every report of the run. Every report also has
//! its own random report id, snippet and counter and is stamped with today's day, and the
//! server does the full work for each (validation with the unit checks, deduplication,
//! classes, multiplication, write).
//!
//! With `--token-keys` (the key ring the server verifies with) the generator is its own
//! issuer: before the timed phase it mints one admission token per report, for the report's
//! day and counter, through the real issuance protocol (blinded request, evaluation with its
//! proof, the client's check and unblinding), and in the timed phase spends each on its
//! report (one MAC over the report body, as an agent does). The invalid share then also holds
//! reports without a token and with a forged one. This is test equipment: it holds the
//! issuer's secret keys, which no agent ever does.
//!
//! Two connection modes ([`ConnectionMode`]). `shared` (the default) spreads `--clients` tasks
//! over `--connections` QUIC connections, many reports per connection: what every ingest
//! figure before issue 26 measured, and what no agent does. `fresh-per-report` sends as
//! agents do: every report on a connection of its own from a UDP socket of its own (the
//! server's address-validation Retry, a full TLS 1.3 handshake, one stream, close), with
//! `--clients` reports in flight at once.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use crate::fleet::{SimilarityProfile, SyntheticFleet};
use anyhow::{Context, Result, ensure};
use indicatif::{ProgressBar, ProgressStyle};
use penrose_core::counters::{BIN_COUNT, Catalogue, CounterId};
use penrose_core::fingerprint::{Fingerprint, FingerprintParams, Fingerprinter};
use penrose_core::gpu::GpuArch;
use penrose_core::histogram::SampleCount;
use penrose_core::paillier::{Accumulator, KeyId, PackedCiphertexts, PublicKey};
use penrose_core::tokens::{KeyRing, MAX_BATCH, Token, TokenEpoch, TokenRequest, TokenScope};
use penrose_core::wire::{AckStatus, AdmissionToken, Day, Message, PackedBytes, Report, ReportId};
use penrose_traces::TraceFolder;
use penrose_transport::{Client, ClientConfig, RetryPolicy, Reuse, Trust};
use rand::{Rng, RngCore, SeedableRng};

use crate::metrics::reason_label;

/// How the load generator's reports use QUIC connections (module docs).
#[derive(clap::ValueEnum, serde::Serialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum ConnectionMode {
    /// Load-testing only: `--clients` tasks share `--connections` connections, many reports
    /// on each (which links them at the transport layer). No agent sends this way.
    #[default]
    Shared,
    /// As agents send: every report on a fresh connection from a fresh UDP socket (the
    /// server's Retry, a full TLS 1.3 handshake without resumption, one stream, close once the
    /// ack is in); `--clients` reports in flight at once; `--connections` is not used.
    FreshPerReport,
}

/// Arguments of `penrose-aggregator loadgen`.
#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    /// The server's QUIC address.
    #[arg(long, default_value = "127.0.0.1:4433")]
    pub server: SocketAddr,
    /// The server's certificate to pin (DATA/tls/cert.pem).
    #[arg(long)]
    pub cert: PathBuf,
    /// The design server's public key, to encrypt with.
    #[arg(long)]
    pub public_key: PathBuf,
    /// Reports to send in all (their ciphertexts are made before sending and held in memory,
    /// about 1 KiB each at 2048 bits).
    #[arg(long, default_value_t = 20_000)]
    pub reports: u64,
    /// Concurrent clients (tasks, each with one report in flight at a time): the reports in
    /// flight at once, in either connection mode.
    #[arg(long, default_value_t = 256)]
    pub clients: usize,
    /// How reports use QUIC connections. `shared`: the clients share --connections
    /// connections, many reports on each (load testing only: it links reports at the
    /// transport layer, which no agent does). `fresh-per-report`: as agents send, every report
    /// on a connection and UDP socket of its own, with the server's Retry and a full TLS 1.3
    /// handshake each; against a server on one address raise its --connections-per-source and
    /// --new-connections-per-source (0: no limit), which every report counts against.
    #[arg(long, value_enum, default_value_t = ConnectionMode::Shared)]
    pub connection_mode: ConnectionMode,
    /// With --connection-mode shared: the QUIC connections the clients share. Not used with
    /// fresh-per-report.
    #[arg(long, default_value_t = 8)]
    pub connections: usize,
    /// Share of reports made invalid (wrong key, unknown counter, bad sample count, bad
    /// ciphertext, garbage), in turn.
    #[arg(long, default_value_t = 0.05)]
    pub invalid_share: f64,
    /// Distinct histograms encrypted up front; each report's ciphertexts are derived from one
    /// of them and are still distinct from every other report's (module docs).
    #[arg(long, default_value_t = 64)]
    pub pool: usize,
    /// Capture windows per trace, each a distinct snippet hash.
    #[arg(long, default_value_t = 8)]
    pub windows: usize,
    /// Launches per capture window (L).
    #[arg(long, default_value_t = 10_000)]
    pub window_len: usize,
    /// Folder of traces [default: $PENROSE_TRACES, else ../shared/traces].
    #[arg(long)]
    pub traces: Option<PathBuf>,
    /// Draw reports from a synthetic fleet of this many applications (`crate::fleet`) instead
    /// of the traces' windows: each application first founds its class (one report each,
    /// before the timed phase; the server's new-class budget must allow them), then every
    /// report carries a fresh fingerprint near its application's.
    #[arg(long)]
    pub fleet_apps: Option<u32>,
    /// With --fleet-apps: the share of reports from applications never seen (each founds a
    /// class).
    #[arg(long, default_value_t = 0.01)]
    pub new_app_share: f64,
    /// With --fleet-apps: the server already holds the fleet's classes (an earlier run with the
    /// same seed sent the founders), so send only the reports. Lets a benchmark measure the
    /// server's CPU over the reports alone.
    #[arg(long, requires = "fleet_apps")]
    pub founded: bool,
    /// Seed of the workload's choices (report ids and tokens always come from the OS generator
    /// too).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// The admission key ring the server verifies with (`serve --token-keys`): mint a token
    /// per report from it before sending, and spend it on the report (module docs). Test
    /// equipment only: it is the issuer's secret.
    #[arg(long)]
    pub token_keys: Option<PathBuf>,
    /// Print the result as JSON.
    #[arg(long)]
    pub json: bool,
}

/// Fingerprints of `windows` capture windows at random offsets of each trace's main
/// process (looped, as a long run repeats its iterations), labelled with the trace's file
/// name.
pub fn trace_snippets(
    dir: &Path,
    windows: usize,
    window_len: usize,
    seed: u64,
) -> Result<Vec<(String, Fingerprint)>> {
    let f = Fingerprinter::new(FingerprintParams::default())?;
    let mut out = Vec::new();
    crate::fleet::for_each_trace_window(dir, windows, window_len, seed, |label, window| {
        out.push((label.to_owned(), f.fingerprint_of_names(window)));
    })?;
    Ok(out)
}

/// Encrypted histograms and encryptions of zero, from which every report of a run gets
/// ciphertexts of its own (module docs).
struct Pool {
    histograms: Vec<(PackedCiphertexts, SampleCount)>,
    /// Three sets of encryptions of zero: report i multiplies in one of each, chosen by the
    /// digits of i / histograms.len() in base `zeros[k].len()`.
    zeros: [Vec<PackedCiphertexts>; 3],
}

fn encrypt_pool(key: &PublicKey, size: usize, reports: u64, seed: u64) -> Result<Pool> {
    let mut rng = rand_chacha::ChaCha20Rng::seed_from_u64(seed);
    let size = size.max(1);
    let mut histograms = Vec::with_capacity(size);
    for _ in 0..size {
        let mut bins = [0u32; BIN_COUNT];
        for _ in 0..rng.random_range(1..40) {
            bins[rng.random_range(0..BIN_COUNT)] += rng.random_range(1..100);
        }
        let packed = key.encrypt_packed(&bins, &mut rng)?;
        histograms.push((packed, SampleCount(bins.iter().sum())));
    }
    // Enough zeros that size * zeros^3 >= reports: every report's combination is distinct.
    let combinations = reports.div_ceil(size as u64).max(1);
    let mut zeros_each = 2u64;
    while zeros_each.saturating_pow(3) < combinations {
        zeros_each += 1;
    }
    let mut zero_set = || -> Result<Vec<PackedCiphertexts>> {
        (0..zeros_each)
            .map(|_| Ok(key.encrypt_packed(&[0u32; BIN_COUNT], &mut rng)?))
            .collect()
    };
    let zeros = [zero_set()?, zero_set()?, zero_set()?];
    Ok(Pool { histograms, zeros })
}

impl Pool {
    /// Report i's ciphertexts and sample count: distinct from every other report's of the run.
    fn ciphertexts(&self, key: &PublicKey, i: u64) -> Result<(PackedBytes, SampleCount)> {
        let count = self.histograms.len() as u64;
        let (histogram, samples) = &self.histograms[(i % count) as usize];
        let mut sum = Accumulator::new(key);
        sum.absorb(histogram, u64::from(samples.0))?;
        let mut digits = i / count;
        for zeros in &self.zeros {
            let base = zeros.len() as u64;
            sum.absorb(&zeros[(digits % base) as usize], 0)?;
            digits /= base;
        }
        let packed = sum.sum()?;
        Ok((
            PackedBytes::new(packed.to_bytes(), packed.ciphertexts().len())?,
            *samples,
        ))
    }

    /// The ciphertexts of reports 0..reports, made on every core before the timed phase.
    fn all_ciphertexts(
        &self,
        key: &PublicKey,
        reports: u64,
    ) -> Result<Vec<(PackedBytes, SampleCount)>> {
        let threads = std::thread::available_parallelism().map_or(1, usize::from) as u64;
        let per = reports.div_ceil(threads).max(1);
        std::thread::scope(|scope| {
            let parts: Vec<_> = (0..threads)
                .map(|t| {
                    let range = (t * per).min(reports)..((t + 1) * per).min(reports);
                    scope.spawn(move || {
                        range
                            .map(|i| self.ciphertexts(key, i))
                            .collect::<Result<Vec<_>>>()
                    })
                })
                .collect();
            let mut all = Vec::with_capacity(reports as usize);
            for part in parts {
                let part = part
                    .join()
                    .map_err(|_| anyhow::anyhow!("a ciphertext thread panicked"))??;
                all.extend(part);
            }
            Ok(all)
        })
    }
}

#[derive(Default)]
struct Tally {
    accepted: AtomicU64,
    duplicate: AtomicU64,
    rejected_valid: AtomicU64,
    rejected_invalid: AtomicU64,
    invalid_accepted: AtomicU64,
    errors: AtomicU64,
}

/// What a run measured.
#[derive(serde::Serialize)]
pub struct Outcome {
    /// Reports sent.
    pub reports: u64,
    /// Valid reports sent.
    pub valid: u64,
    /// Invalid reports sent.
    pub invalid: u64,
    /// Valid reports acked Accepted.
    pub accepted: u64,
    /// Valid reports acked Duplicate.
    pub duplicate: u64,
    /// Valid reports refused (Overloaded, for instance).
    pub rejected_valid: u64,
    /// Invalid reports refused, as they must be.
    pub rejected_invalid: u64,
    /// Invalid reports the server accepted (must be 0).
    pub invalid_accepted: u64,
    /// Transport failures (no ack).
    pub errors: u64,
    /// Reject reasons seen, with counts.
    pub reasons: BTreeMap<String, u64>,
    /// Wall time of the sending phase.
    pub seconds: f64,
    /// Acked reports (all kinds) per second.
    pub reports_per_second: f64,
    /// Accepted reports per second.
    pub accepted_per_second: f64,
    /// Latency from send to ack, milliseconds.
    pub latency_ms: BTreeMap<&'static str, f64>,
    /// Distinct snippet hashes used.
    pub snippets: usize,
    /// Traces they came from (0 with a synthetic fleet).
    pub traces: usize,
    /// Applications of the synthetic fleet, if one was used.
    pub fleet_apps: Option<u32>,
    /// Founding reports sent before the timed phase (one per fleet application).
    pub founders: u64,
    /// Seconds the founders took.
    pub founding_seconds: f64,
    /// Whether every valid report carried an admission token.
    pub tokens: bool,
    /// Seconds spent minting tokens before the timed phase.
    pub minting_seconds: f64,
    /// How reports used connections.
    pub connection_mode: ConnectionMode,
}

/// One token per report of the run, for `day` and the report's counter in `plan`, minted with
/// `ring` on every core (module docs).
fn mint_tokens(ring: &KeyRing, day: Day, plan: &[CounterId], seed: u64) -> Result<Vec<Token>> {
    let set = ring.key_set();
    let mut by_counter: BTreeMap<CounterId, Vec<usize>> = BTreeMap::new();
    for (i, counter) in plan.iter().enumerate() {
        by_counter.entry(*counter).or_default().push(i);
    }
    // Batches of at most MAX_BATCH tokens of one counter, spread over the threads.
    let mut batches: Vec<(CounterId, Vec<usize>)> = Vec::new();
    for (counter, indices) in by_counter {
        for chunk in indices.chunks(MAX_BATCH) {
            batches.push((counter, chunk.to_vec()));
        }
    }
    let threads = std::thread::available_parallelism().map_or(1, usize::from);
    let per = batches.len().div_ceil(threads).max(1);
    // Blinding from the OS generator as well as the seed: two runs with the same seed (a
    // fleet's founders, then its reports with --founded) must not mint the same tokens.
    let seed = seed ^ rand::rng().next_u64();
    let minted: Vec<Vec<(usize, Token)>> = std::thread::scope(|scope| {
        let parts: Vec<_> = batches
            .chunks(per)
            .enumerate()
            .map(|(t, part)| {
                let set = &set;
                scope.spawn(move || -> Result<Vec<(usize, Token)>> {
                    let mut rng =
                        rand_chacha::ChaCha20Rng::seed_from_u64(seed ^ ((t as u64) << 32));
                    let mut out = Vec::new();
                    for (counter, indices) in part {
                        let (epoch, scope) = (TokenEpoch(day.0), TokenScope(counter.0));
                        let key = ring.get(epoch, scope).with_context(|| {
                            format!(
                                "the key ring holds no key of day {} and counter {}",
                                day.0, counter.0
                            )
                        })?;
                        let entry = set.get(epoch, scope).context("key set")?;
                        let pending = TokenRequest::new(entry, indices.len(), &mut rng)?;
                        let response = key.issue(pending.request(), &mut rng)?;
                        out.extend(indices.iter().copied().zip(pending.finalize(&response)?));
                    }
                    Ok(out)
                })
            })
            .collect();
        parts
            .into_iter()
            .map(|part| {
                part.join()
                    .map_err(|_| anyhow::anyhow!("a minting thread panicked"))?
            })
            .collect::<Result<Vec<_>>>()
    })?;
    let mut tokens: Vec<Option<Token>> = vec![None; plan.len()];
    for (i, token) in minted.into_iter().flatten() {
        if let Some(slot) = tokens.get_mut(i) {
            *slot = Some(token);
        }
    }
    tokens
        .into_iter()
        .map(|t| t.context("a report without a token"))
        .collect()
}

/// An invalid variant of `report` of kind `kind`: wrong key, unknown counter, zero samples, a
/// zero ciphertext, garbage; with tokens also no token and a forged one.
fn invalid_frame(kind: u64, mut report: Report, tokens: bool) -> Vec<u8> {
    let kinds = if tokens { 7 } else { 5 };
    match kind % kinds {
        0 => report.key_id = KeyId([0xee; 32]),
        1 => report.counter = CounterId(60_000),
        2 => report.samples = SampleCount(0),
        3 => {
            let mut bytes = report.ciphertexts.as_bytes().to_vec();
            let len = report.ciphertexts.ciphertext_len();
            bytes[..len].fill(0);
            if let Ok(p) = PackedBytes::new(bytes, report.ciphertexts.count()) {
                report.ciphertexts = p;
            }
        }
        4 => return b"\x00\x00\x00\x08not a report".to_vec(),
        5 => report.token = None,
        _ => {
            if let Some(token) = &mut report.token {
                token.0[99] ^= 1;
            }
        }
    }
    Message::Report(report).to_frame().unwrap_or_default()
}

/// Runs the load generator; exit code 3 when a valid report was not accepted or an invalid
/// one was.
pub async fn run(args: Args) -> Result<ExitCode> {
    let outcome = generate(&args).await?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&outcome)?);
    } else {
        let connections = match args.connection_mode {
            ConnectionMode::Shared => format!("over {} shared connections", args.connections),
            ConnectionMode::FreshPerReport => "each on a fresh connection".to_string(),
        };
        println!(
            "{} reports ({} valid, {} invalid) from {} clients {connections} in {:.2} s",
            outcome.reports, outcome.valid, outcome.invalid, args.clients, outcome.seconds
        );
        println!(
            "throughput: {:.0} reports/s acked, {:.0} accepted/s",
            outcome.reports_per_second, outcome.accepted_per_second
        );
        println!(
            "latency ms: p50 {:.2}  p90 {:.2}  p99 {:.2}  max {:.2}",
            outcome.latency_ms["p50"],
            outcome.latency_ms["p90"],
            outcome.latency_ms["p99"],
            outcome.latency_ms["max"]
        );
        println!(
            "valid: {} accepted, {} duplicate, {} refused; invalid: {} refused, {} accepted; {} transport errors",
            outcome.accepted,
            outcome.duplicate,
            outcome.rejected_valid,
            outcome.rejected_invalid,
            outcome.invalid_accepted,
            outcome.errors
        );
        println!("reject reasons: {:?}", outcome.reasons);
        if outcome.tokens {
            println!(
                "admission tokens: one per report, minted in {:.2} s before sending",
                outcome.minting_seconds
            );
        }
    }
    let ok = outcome.accepted == outcome.valid
        && outcome.invalid_accepted == 0
        && outcome.rejected_invalid == outcome.invalid;
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(3)
    })
}

/// Sends the load and measures it.
pub async fn generate(args: &Args) -> Result<Outcome> {
    ensure!(args.clients > 0, "need at least one client");
    ensure!(
        args.connections > 0 || args.connection_mode == ConnectionMode::FreshPerReport,
        "need at least one connection"
    );
    let key_bytes = std::fs::read(&args.public_key)
        .with_context(|| format!("reading {}", args.public_key.display()))?;
    let key = PublicKey::from_bytes(&key_bytes)
        .with_context(|| format!("{} is not a Penrose public key", args.public_key.display()))?;
    let trust = Trust::load_pinned(&args.cert).context("loading the server certificate")?;
    let snippets = Snippets::draw(args)?;
    let total = snippets.founders + args.reports;
    let pool = encrypt_pool(&key, args.pool, total, args.seed)?;
    let ciphertexts = pool.all_ciphertexts(&key, total)?;
    drop(pool);
    let counters = counter_plan(args.seed, total)?;
    let day = penrose_host::clock::today();
    let minting = Instant::now();
    let tokens: Option<Vec<Token>> = match &args.token_keys {
        Some(path) => {
            let ring = crate::admission::read_key_ring(path)?;
            Some(mint_tokens(&ring, day, &counters, args.seed)?)
        }
        None => None,
    };
    let minting_seconds = minting.elapsed().as_secs_f64();
    let clients = connect(args, &trust).await?;
    let plan = Arc::new(Plan {
        clients,
        snippets: snippets.snippets,
        ciphertexts,
        counters,
        tokens,
        key_id: key.key_id(),
        day,
    });
    // The founders found the fleet's classes before the timed phase, all valid.
    let founding = Instant::now();
    let sent_founders = if args.founded { 0 } else { snippets.founders };
    let founded = send_phase(&plan, 0..sent_founders, u64::MAX, args, "founders").await?;
    let founding_seconds = founding.elapsed().as_secs_f64();
    ensure!(
        founded.tally.accepted.load(Ordering::Relaxed) == sent_founders,
        "the server accepted {} of {sent_founders} founders (is its new-class budget large \
         enough?)",
        founded.tally.accepted.load(Ordering::Relaxed)
    );
    let invalid_every = if args.invalid_share > 0.0 {
        (1.0 / args.invalid_share).round().max(1.0) as u64
    } else {
        u64::MAX
    };
    let start = Instant::now();
    let timed = send_phase(
        &plan,
        snippets.founders..total,
        invalid_every,
        args,
        "reports",
    )
    .await?;
    let seconds = start.elapsed().as_secs_f64();
    for client in &plan.clients {
        client.close().await;
    }
    let before = BeforeTimed {
        distinct: snippets.distinct,
        traces: snippets.traces,
        sent_founders,
        founding_seconds,
        minting_seconds,
    };
    Ok(outcome(args, timed, seconds, invalid_every, &before))
}

/// Every report's snippet and architecture, founders (with `--fleet-apps`) first.
struct Snippets {
    snippets: Vec<(Fingerprint, GpuArch)>,
    /// Founding reports: one per fleet application (0 without a fleet).
    founders: u64,
    /// Distinct snippet hashes drawn from.
    distinct: usize,
    /// Traces they came from (0 with a synthetic fleet).
    traces: usize,
}

impl Snippets {
    /// Windows of the traces, or a synthetic fleet's founders and fresh snippets.
    fn draw(args: &Args) -> Result<Self> {
        let dir = args.traces.clone().unwrap_or_else(TraceFolder::default_dir);
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(args.seed ^ 0x736e_6970);
        let Some(apps) = args.fleet_apps else {
            let windows = trace_snippets(&dir, args.windows, args.window_len, args.seed)?;
            let traces = windows
                .iter()
                .map(|(a, _)| a.as_str())
                .collect::<std::collections::BTreeSet<_>>()
                .len();
            let snippets: Vec<(Fingerprint, GpuArch)> = (0..args.reports)
                .map(|_| {
                    (
                        windows[rng.random_range(0..windows.len())].1,
                        GpuArch::new(9, 0),
                    )
                })
                .collect();
            return Ok(Self {
                snippets,
                founders: 0,
                distinct: windows.len(),
                traces,
            });
        };
        let profile = SimilarityProfile::from_traces(&dir, 12, args.window_len, args.seed)?;
        let fleet = SyntheticFleet::new(apps, args.new_app_share, profile, args.seed)?;
        let mut snippets: Vec<(Fingerprint, GpuArch)> = (0..apps)
            .map(|app| fleet.founder(app, &mut rng))
            .map(|d| (d.fingerprint, d.arch))
            .collect();
        let mut seen: std::collections::HashSet<_> = snippets.iter().map(|(f, _)| f.hash).collect();
        snippets.extend(
            (0..args.reports)
                .map(|_| fleet.draw_fresh(&mut seen, &mut rng))
                .map(|d| (d.fingerprint, d.arch)),
        );
        let distinct = snippets.len();
        Ok(Self {
            snippets,
            founders: u64::from(apps),
            distinct,
            traces: 0,
        })
    }
}

/// Every report's counter, chosen up front so that tokens can be minted for it.
fn counter_plan(seed: u64, total: u64) -> Result<Vec<CounterId>> {
    let counters: Vec<CounterId> = Catalogue::current().report_ids().collect();
    ensure!(!counters.is_empty(), "the catalogue has no counters");
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed ^ 0x706c_616e);
    Ok((0..total)
        .map(|_| counters[rng.random_range(0..counters.len())])
        .collect())
}

/// The clients reports are sent with: `--connections` shared connections, or one client
/// that dials a fresh connection per report.
async fn connect(args: &Args, trust: &Trust) -> Result<Vec<Client>> {
    let mut clients = Vec::with_capacity(args.connections);
    match args.connection_mode {
        ConnectionMode::Shared => {
            for _ in 0..args.connections {
                // Throughput over privacy: test data only, never an agent's reports.
                let mut config = ClientConfig::new(args.server, "localhost", trust.clone())
                    .shared_connection_for_load_testing();
                config.retry = RetryPolicy::none();
                clients.push(
                    Client::connect(config)
                        .await
                        .context("connecting to the server")?,
                );
            }
        }
        ConnectionMode::FreshPerReport => {
            // The client's default, as agents use it: each send dials its own connection from
            // its own socket. No probe connection, so that the server sees exactly one
            // connection per report (an unreachable server shows as transport errors).
            let mut config = ClientConfig::new(args.server, "localhost", trust.clone());
            config.retry = RetryPolicy::none();
            ensure!(
                config.reuse() == Reuse::FreshPerReport,
                "the client's default is no longer a fresh connection per report"
            );
            clients.push(Client::new(config).context("making the client")?);
        }
    }
    Ok(clients)
}

/// What a run did before its timed phase, as its outcome reports it.
struct BeforeTimed {
    distinct: usize,
    traces: usize,
    sent_founders: u64,
    founding_seconds: f64,
    minting_seconds: f64,
}

/// The run's outcome from its timed phase (`seconds` long, every `invalid_every`-th report
/// invalid) and what came before it.
fn outcome(
    args: &Args,
    timed: Phase,
    seconds: f64,
    invalid_every: u64,
    before: &BeforeTimed,
) -> Outcome {
    let mut latencies = timed.latencies;
    latencies.sort_unstable();
    let quantile = |q: f64| -> f64 {
        if latencies.is_empty() {
            return 0.0;
        }
        let i = ((latencies.len() - 1) as f64 * q).round() as usize;
        latencies[i].as_secs_f64() * 1e3
    };
    let tally = &timed.tally;
    let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
    let invalid = if invalid_every == u64::MAX {
        0
    } else {
        args.reports / invalid_every
    };
    let acked = get(&tally.accepted)
        + get(&tally.duplicate)
        + get(&tally.rejected_valid)
        + get(&tally.rejected_invalid)
        + get(&tally.invalid_accepted);
    Outcome {
        reports: args.reports,
        valid: args.reports - invalid,
        invalid,
        accepted: get(&tally.accepted),
        duplicate: get(&tally.duplicate),
        rejected_valid: get(&tally.rejected_valid),
        rejected_invalid: get(&tally.rejected_invalid),
        invalid_accepted: get(&tally.invalid_accepted),
        errors: get(&tally.errors),
        reasons: timed.reasons,
        seconds,
        reports_per_second: acked as f64 / seconds.max(1e-9),
        accepted_per_second: get(&tally.accepted) as f64 / seconds.max(1e-9),
        latency_ms: [
            ("p50", quantile(0.5)),
            ("p90", quantile(0.9)),
            ("p99", quantile(0.99)),
            ("max", quantile(1.0)),
        ]
        .into_iter()
        .collect(),
        snippets: before.distinct,
        traces: before.traces,
        fleet_apps: args.fleet_apps,
        founders: before.sent_founders,
        founding_seconds: before.founding_seconds,
        tokens: args.token_keys.is_some(),
        minting_seconds: before.minting_seconds,
        connection_mode: args.connection_mode,
    }
}

/// Everything a run sends, by report index (founders first).
struct Plan {
    clients: Vec<Client>,
    snippets: Vec<(Fingerprint, GpuArch)>,
    ciphertexts: Vec<(PackedBytes, SampleCount)>,
    counters: Vec<CounterId>,
    tokens: Option<Vec<Token>>,
    key_id: KeyId,
    day: Day,
}

impl Plan {
    /// Report `i` of the plan, with a fresh random report id and no token yet.
    fn report(&self, i: u64) -> Report {
        let (snippet, arch) = self.snippets[i as usize];
        let (ciphertexts, samples) = self.ciphertexts[i as usize].clone();
        let mut id = [0u8; 16];
        rand::rng().fill_bytes(&mut id);
        Report {
            key_id: self.key_id,
            report_id: ReportId(id),
            snippet: snippet.hash,
            locator: snippet.locator,
            arch,
            counter: self.counters[i as usize],
            catalogue: Catalogue::current().version,
            day: self.day,
            samples,
            ciphertexts,
            token: None,
            evidence: None,
        }
    }
}

/// What one phase saw.
struct Phase {
    tally: Tally,
    reasons: BTreeMap<String, u64>,
    latencies: Vec<std::time::Duration>,
}

/// Sends reports `range` of the plan from `args.clients` tasks; every `invalid_every`-th is
/// made invalid.
async fn send_phase(
    plan: &Arc<Plan>,
    range: std::ops::Range<u64>,
    invalid_every: u64,
    args: &Args,
    label: &str,
) -> Result<Phase> {
    let senders = Senders {
        plan: Arc::clone(plan),
        tally: Arc::new(Tally::default()),
        reasons: Arc::new(std::sync::Mutex::new(BTreeMap::new())),
        next: Arc::new(AtomicU64::new(range.start)),
        bar: progress_bar(args, &range, label),
    };
    let mut tasks = Vec::with_capacity(args.clients);
    for task in 0..args.clients {
        let senders = senders.clone();
        let range = range.clone();
        tasks.push(tokio::spawn(senders.send(task, range, invalid_every)));
    }
    let mut latencies = Vec::with_capacity((range.end - range.start) as usize);
    for task in tasks {
        latencies.extend(task.await?);
    }
    let Senders {
        tally,
        reasons,
        bar,
        ..
    } = senders;
    bar.finish_and_clear();
    let reasons = reasons.lock().map(|r| r.clone()).unwrap_or_default();
    let tally = Arc::try_unwrap(tally).unwrap_or_default();
    Ok(Phase {
        tally,
        reasons,
        latencies,
    })
}

/// A phase's progress bar, labelled `label` (hidden with `--json` or nothing to send).
fn progress_bar(args: &Args, range: &std::ops::Range<u64>, label: &str) -> ProgressBar {
    if args.json || range.is_empty() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(range.end - range.start);
    if let Ok(style) = ProgressStyle::with_template(&format!(
        "{label} [{{bar:30}}] {{pos}}/{{len}} {{per_sec}} {{msg}}"
    )) {
        bar.set_style(style.progress_chars("=> "));
    }
    bar
}

/// What the sending tasks of one phase share: the plan, the next report to send, and what
/// the acks said.
#[derive(Clone)]
struct Senders {
    plan: Arc<Plan>,
    tally: Arc<Tally>,
    reasons: Arc<std::sync::Mutex<BTreeMap<String, u64>>>,
    next: Arc<AtomicU64>,
    bar: ProgressBar,
}

impl Senders {
    /// Task `task`'s loop: takes the next report of `range` until none is left, sends it on
    /// its client (invalid every `invalid_every`-th) and counts the ack; returns each
    /// report's latency from send to ack.
    async fn send(
        self,
        task: usize,
        range: std::ops::Range<u64>,
        invalid_every: u64,
    ) -> Vec<std::time::Duration> {
        let client = &self.plan.clients[task % self.plan.clients.len()];
        let mut latencies = Vec::new();
        loop {
            let i = self.next.fetch_add(1, Ordering::Relaxed);
            if i >= range.end {
                break;
            }
            let mut report = self.plan.report(i);
            let nth = i - range.start;
            let invalid = nth % invalid_every == invalid_every - 1;
            let sent = Instant::now();
            // Spending the token is the sender's work, inside the timed phase.
            if let Some(token) = self.plan.tokens.as_ref().and_then(|t| t.get(i as usize)) {
                let redemption = token.redeem(&report.token_binding());
                report.token = Some(AdmissionToken(redemption.encode()));
            }
            let ack = if invalid {
                let frame = invalid_frame(nth / invalid_every, report, self.plan.tokens.is_some());
                client.send_raw(&frame).await
            } else {
                client.send(&report).await
            };
            latencies.push(sent.elapsed());
            self.count(ack.map(|a| a.status), invalid);
            self.bar.inc(1);
        }
        latencies
    }

    /// Counts one ack (or transport failure) of a valid or `invalid` report.
    fn count<E>(&self, status: Result<AckStatus, E>, invalid: bool) {
        let tally = &self.tally;
        match (status, invalid) {
            (Ok(AckStatus::Accepted), false) => {
                tally.accepted.fetch_add(1, Ordering::Relaxed);
            }
            (Ok(AckStatus::Duplicate), false) => {
                tally.duplicate.fetch_add(1, Ordering::Relaxed);
            }
            (Ok(AckStatus::Rejected(r)), invalid) => {
                let counter = if invalid {
                    &tally.rejected_invalid
                } else {
                    &tally.rejected_valid
                };
                counter.fetch_add(1, Ordering::Relaxed);
                if let Ok(mut reasons) = self.reasons.lock() {
                    *reasons.entry(reason_label(r).to_string()).or_default() += 1;
                }
            }
            (Ok(_), true) => {
                tally.invalid_accepted.fetch_add(1, Ordering::Relaxed);
            }
            (Err(_), _) => {
                tally.errors.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}
