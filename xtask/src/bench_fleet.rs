//! `cargo xtask bench-fleet`: what placing a report costs as the number of classes grows, with
//! every report a fresh snippet fingerprint (`penrose_aggregator::fleet`, at the similarities
//! measured on the real traces).
//!
//! For each class count N (a child process each, so that resident memory is its own):
//!
//! 1. **Placement** (the class tables alone): N applications found their classes, then
//!    `--reports` reports are placed. Measured: time and candidate classes per report, and
//!    recall (a report placed in its application's class), both for all reports and for those
//!    whose estimated similarity to their application is at or above tau. Beside it the
//!    2-bit banding the server used before the locator (`LshBands` over the snippet hash,
//!    33 bands of 3 values) runs on the same reports against the same N representatives:
//!    candidates and time per report, and its recall.
//! 2. **Writer** (the aggregation server's whole batch work in process, RocksDB and its synced
//!    WAL included, as `cargo bench -p penrose-aggregator --bench ingest` measures it): the N
//!    founders, then the same number of reports in batches of 1,024. Measured: reports/s, the
//!    writer thread's CPU per report, resident memory, bytes on disk, and the time and memory
//!    of a restart on that data directory (a fresh process opens it).
//!
//! The end-to-end figures (QUIC, validation, load generator) come from
//! `cargo xtask bench-ingest --fleet-apps N`.

use std::collections::HashSet;
use std::fmt::Write as _;
use std::num::NonZeroU32;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use penrose_aggregator::admission::Admission;
use penrose_aggregator::fleet::{
    Drawn, Origin, SimilarityProfile, SyntheticFleet, for_each_trace_window,
};
use penrose_aggregator::state::{Outcome, State};
use penrose_aggregator::store::{RocksStore, Store};
use penrose_aggregator::tables::{ClassId, IndexStats, SearchStats, Tables};
use penrose_aggregator::validate::{ValidReport, validate_body};
use penrose_core::counters::{BIN_COUNT, Catalogue, CounterId};
use penrose_core::fingerprint::{BandKey, FingerprintParams, LshBands, SnippetHash};
use penrose_core::histogram::SampleCount;
use penrose_core::paillier::{Keypair, PublicKey};
use penrose_core::release::ReleaseRule;
use penrose_core::wire::{Day, LENGTH_PREFIX, Message, PackedBytes, Report, ReportId};
use penrose_traces::TraceFolder;
use rand::{Rng, RngCore, SeedableRng};
use rand_chacha::ChaCha20Rng;
use serde::{Deserialize, Serialize};

use xtask::machine::{self, today_utc};
use xtask::measure::{dir_bytes, rss_mib};

/// Arguments of `cargo xtask bench-fleet`.
#[derive(clap::Args)]
pub struct Args {
    /// Class counts to measure (one application founds each class).
    #[arg(long, value_delimiter = ',', default_values_t = [1_000u32, 10_000, 100_000])]
    classes: Vec<u32>,
    /// Reports placed (and written) per class count after the founders.
    #[arg(long, default_value_t = 50_000)]
    reports: usize,
    /// Share of reports from applications never seen before (each founds a class).
    #[arg(long, default_value_t = 0.01)]
    new_share: f64,
    /// Reports the 2-bit banding is measured on (it compares far more per report).
    #[arg(long, default_value_t = 2_000)]
    banding_reports: usize,
    /// Seed of the fleet and the reports.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Write the result as Markdown here as well (for example docs/benchmarks-fleet.md).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Draw the cost per report against N as SVG here (for example docs/fleet-placement.svg).
    #[arg(long)]
    svg: Option<PathBuf>,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
    /// (internal) Measure one class count and print its JSON.
    #[arg(long, hide = true)]
    single: Option<u32>,
    /// (internal) Open the data directory and print the time and memory it took.
    #[arg(long, hide = true)]
    reopen: Option<PathBuf>,
}

/// The measurements of one class count.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Row {
    classes: u32,
    reports: usize,
    profile_pairs: usize,
    profile_median: f64,
    profile_p1: f64,
    profile_share_below_tau: f64,
    founding_us_per_class: f64,
    placement_us_per_report: f64,
    candidates_per_report: f64,
    estimates_per_report: f64,
    recall_at_or_above_tau: f64,
    reports_at_or_above_tau: usize,
    recall_all_known: f64,
    recall_drawn_at_tau: f64,
    reports_drawn_at_tau: usize,
    classes_after: usize,
    new_reports: usize,
    merges: usize,
    every_band_us_per_report: f64,
    every_band_classes_after: usize,
    every_band_merges: usize,
    /// Full-bucket displacements, entries left out of full buckets and foundings left out by
    /// a key's daily ration, over founders and reports (`penrose_aggregator::tables::IndexStats`).
    bucket_displaced: u64,
    bucket_left_out_full: u64,
    bucket_left_out_rationed: u64,
    banding_reports: usize,
    banding_us_per_report: f64,
    banding_candidates_per_report: f64,
    banding_recall_at_or_above_tau: f64,
    writer_reports_per_second: f64,
    writer_cpu_us_per_report: f64,
    writer_accepted: usize,
    rss_mib: f64,
    tables_heap_mib: f64,
    disk_mib: f64,
    restart_seconds: f64,
    restart_rss_mib: f64,
}

/// Recall of the candidate search on the real traces' windows.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct TraceRecall {
    window_len: usize,
    pairs: usize,
    pairs_at_or_above_tau: usize,
    locator_at_or_above_tau: f64,
    banding_at_or_above_tau: f64,
    locator_all: f64,
    banding_all: f64,
}

/// For pairs of windows of one trace's main process: the share that the locator (a shared
/// band key) and the 2-bit banding make candidates, among all pairs and among those whose
/// estimated similarity is at or above tau (the pairs a search must find).
fn trace_recall(window_len: usize, windows: usize, seed: u64) -> Result<TraceRecall> {
    let params = FingerprintParams::default();
    let f = penrose_core::fingerprint::Fingerprinter::new(params)?;
    let bands = LshBands::for_params(&params);
    type Searched = (
        penrose_core::fingerprint::Fingerprint,
        std::collections::HashSet<penrose_core::fingerprint::LocatorKey>,
        std::collections::HashSet<BandKey>,
    );
    let mut per_trace: std::collections::BTreeMap<String, Vec<Searched>> = Default::default();
    for_each_trace_window(
        &TraceFolder::default_dir(),
        windows,
        window_len,
        seed,
        |label, window| {
            let fp = f.fingerprint_of_names(window);
            let keys = fp.locator.keys(&params).collect();
            let band_keys = bands.band_keys(&fp.hash, &params).into_iter().collect();
            per_trace
                .entry(label.to_owned())
                .or_default()
                .push((fp, keys, band_keys));
        },
    )?;
    let (mut pairs, mut at_tau) = (0usize, 0usize);
    let (mut loc_tau, mut band_tau, mut loc_all, mut band_all) = (0usize, 0usize, 0usize, 0usize);
    for fps in per_trace.values() {
        for (i, (a, ka, ba)) in fps.iter().enumerate() {
            for (b, kb, bb) in &fps[i + 1..] {
                let locator = !ka.is_disjoint(kb);
                let banding = !ba.is_disjoint(bb);
                pairs += 1;
                loc_all += usize::from(locator);
                band_all += usize::from(banding);
                if a.hash.estimate_jaccard(&b.hash, &params) >= params.tau {
                    at_tau += 1;
                    loc_tau += usize::from(locator);
                    band_tau += usize::from(banding);
                }
            }
        }
    }
    let share = |n: usize, of: usize| n as f64 / of.max(1) as f64;
    Ok(TraceRecall {
        window_len,
        pairs,
        pairs_at_or_above_tau: at_tau,
        locator_at_or_above_tau: share(loc_tau, at_tau),
        banding_at_or_above_tau: share(band_tau, at_tau),
        locator_all: share(loc_all, pairs),
        banding_all: share(band_all, pairs),
    })
}

/// What a reopen child prints.
#[derive(Serialize, Deserialize)]
struct Reopen {
    seconds: f64,
    rss_mib: f64,
}

/// Runs the task.
pub fn run(args: Args) -> Result<()> {
    if let Some(dir) = &args.reopen {
        let reopen = reopen(dir)?;
        println!("{}", serde_json::to_string(&reopen)?);
        return Ok(());
    }
    if let Some(n) = args.single {
        let row = single(&args, n)?;
        println!("{}", serde_json::to_string(&row)?);
        return Ok(());
    }
    ensure!(!args.classes.is_empty(), "--classes names no class count");
    let exe = std::env::current_exe().context("finding this program")?;
    let mut rows = Vec::new();
    for &n in &args.classes {
        if !args.json {
            eprintln!("measuring {n} classes");
        }
        let mut child = Command::new(&exe);
        child.args([
            "bench-fleet",
            "--single",
            &n.to_string(),
            "--reports",
            &args.reports.to_string(),
            "--new-share",
            &args.new_share.to_string(),
            "--banding-reports",
            &args.banding_reports.to_string(),
            "--seed",
            &args.seed.to_string(),
        ]);
        let output = child.output().context("running the measuring child")?;
        if !output.status.success() {
            bail!(
                "measuring {n} classes failed ({}): {}",
                output.status,
                String::from_utf8_lossy(&output.stderr)
            );
        }
        let row: Row = serde_json::from_slice(&output.stdout)
            .context("reading the measuring child's result")?;
        rows.push(row);
    }
    let recall = [10_000, 2_500]
        .into_iter()
        .map(|len| trace_recall(len, 40, args.seed))
        .collect::<Result<Vec<_>>>()?;
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({"classes": rows, "traces": recall}))?
        );
    }
    let markdown = markdown(&args, &rows, &recall);
    if !args.json {
        print!("{markdown}");
    }
    if let Some(out) = &args.out {
        std::fs::write(out, &markdown).with_context(|| format!("writing {}", out.display()))?;
    }
    if let Some(svg) = &args.svg {
        std::fs::write(svg, plot(&rows)).with_context(|| format!("writing {}", svg.display()))?;
    }
    Ok(())
}

/// The sub-sum size the server runs with (`penrose-aggregator serve`).
fn sub_sum() -> u64 {
    penrose_aggregator::export::sub_sum_reports(&ReleaseRule::default())
}

fn single(args: &Args, n: u32) -> Result<Row> {
    let params = FingerprintParams::default();
    let profile = SimilarityProfile::from_traces(&TraceFolder::default_dir(), 12, 10_000, 7)
        .context("measuring the similarity profile on the real traces")?;
    let fleet = SyntheticFleet::new(n, args.new_share, profile, args.seed)?;
    let mut rng = ChaCha20Rng::seed_from_u64(args.seed);
    let day = Day(20_000);

    // 1. Placement.
    let mut drawing = Drawing::new(&fleet, n, args.reports, &mut rng);
    let every_band = every_band(params, &drawing, day);
    let mut placement = Placement::run(params, &drawing, day);
    let recall = placement.recall(&drawing, params.tau);
    let (hard, hard_right) =
        drawn_at_tau(args, n, params, day, &mut placement, &mut drawing, &mut rng)?;
    let banding = banding(params, &drawing, n, args.banding_reports);

    // 2. Writer.
    let writer = writer(params, &drawing, &mut rng)?;
    let profile = fleet.profile();
    let Placement {
        founding,
        placing,
        merges,
        classes_after,
        before,
        after,
        buckets,
        ..
    } = placement;
    let searches = (after.searches - before.searches).max(1) as f64;
    let banding_n = banding.reports.max(1) as f64;
    let draws = &drawing.draws;
    Ok(Row {
        classes: n,
        reports: args.reports,
        profile_pairs: profile.len(),
        profile_median: profile.quantile(0.5),
        profile_p1: profile.quantile(0.01),
        profile_share_below_tau: profile.share_below(params.tau),
        founding_us_per_class: founding.as_secs_f64() * 1e6 / f64::from(n),
        placement_us_per_report: placing.as_secs_f64() * 1e6 / args.reports as f64,
        candidates_per_report: (after.candidates - before.candidates) as f64 / searches,
        estimates_per_report: (after.estimates - before.estimates) as f64 / searches,
        recall_at_or_above_tau: recall.at_tau_right as f64 / recall.at_tau.max(1) as f64,
        reports_at_or_above_tau: recall.at_tau,
        recall_all_known: recall.known_right as f64 / f64::from(recall.known.max(1)),
        recall_drawn_at_tau: hard_right as f64 / hard.max(1) as f64,
        reports_drawn_at_tau: hard,
        classes_after,
        new_reports: draws.iter().filter(|d| d.origin == Origin::New).count(),
        merges,
        every_band_us_per_report: every_band.us_per_report,
        every_band_classes_after: every_band.classes_after,
        every_band_merges: every_band.merges,
        bucket_displaced: buckets.displaced,
        bucket_left_out_full: buckets.left_out_full,
        bucket_left_out_rationed: buckets.left_out_rationed,
        banding_reports: banding.reports,
        banding_us_per_report: banding.elapsed.as_secs_f64() * 1e6 / banding_n,
        banding_candidates_per_report: banding.candidates as f64 / banding_n,
        banding_recall_at_or_above_tau: banding.found as f64 / banding.at_tau.max(1) as f64,
        writer_reports_per_second: draws.len() as f64 / writer.wall,
        writer_cpu_us_per_report: writer.cpu * 1e6 / draws.len() as f64,
        writer_accepted: writer.accepted,
        rss_mib: writer.rss,
        tables_heap_mib: writer.heap,
        disk_mib: writer.disk,
        restart_seconds: writer.reopened.seconds,
        restart_rss_mib: writer.reopened.rss_mib,
    })
}

/// The fleet's founders and reports, drawn once for every measurement of a class count.
struct Drawing {
    /// One founder per application.
    founders: Vec<Drawn>,
    /// The snippet hashes drawn so far: every report a fresh one.
    seen: HashSet<SnippetHash>,
    /// The reports.
    draws: Vec<Drawn>,
    /// Each report's estimated similarity to its application (`None` for new applications).
    estimates: Vec<Option<f64>>,
}

impl Drawing {
    fn new(fleet: &SyntheticFleet, n: u32, reports: usize, rng: &mut ChaCha20Rng) -> Self {
        let founders: Vec<Drawn> = (0..n).map(|app| fleet.founder(app, rng)).collect();
        let mut seen: HashSet<_> = founders.iter().map(|f| f.fingerprint.hash).collect();
        let draws: Vec<Drawn> = (0..reports)
            .map(|_| fleet.draw_fresh(&mut seen, rng))
            .collect();
        let estimates = draws.iter().map(|d| fleet.estimate_to_center(d)).collect();
        Self {
            founders,
            seen,
            draws,
            estimates,
        }
    }
}

/// What the search that probes every band (no early stop) does with the same founders and
/// reports: what the stop saves, and what it costs in merges.
struct EveryBand {
    us_per_report: f64,
    classes_after: usize,
    merges: usize,
}

fn every_band(params: FingerprintParams, drawing: &Drawing, day: Day) -> EveryBand {
    let mut tables = Tables::new(params);
    tables.probe_every_band();
    for chunk in drawing.founders.chunks(1024) {
        for f in chunk {
            tables.record(f.fingerprint, day);
        }
        std::hint::black_box(tables.take_dirty());
    }
    let started = Instant::now();
    let mut merges = 0;
    for chunk in drawing.draws.chunks(1024) {
        for d in chunk {
            tables.record(d.fingerprint, day);
        }
        std::hint::black_box(tables.take_dirty());
        merges += tables.take_merges().len();
    }
    EveryBand {
        us_per_report: started.elapsed().as_secs_f64() * 1e6 / drawing.draws.len() as f64,
        classes_after: tables.class_count(),
        merges,
    }
}

/// The class tables after placing the founders, then the reports, as the writer does (the
/// changed rows taken every batch of 1,024).
struct Placement {
    tables: Tables,
    /// Each application's class: its founder's.
    class_of_app: Vec<ClassId>,
    founding: Duration,
    placing: Duration,
    /// Each report's class.
    placed: Vec<ClassId>,
    merges: usize,
    classes_after: usize,
    /// The search statistics before and after the reports.
    before: SearchStats,
    after: SearchStats,
    buckets: IndexStats,
}

/// Reports of known applications placed in their application's class.
struct Recall {
    /// Reports estimated at >= tau, and those of them placed right.
    at_tau: usize,
    at_tau_right: usize,
    /// Every report of a known application, and those placed right.
    known: u32,
    known_right: usize,
}

impl Placement {
    fn run(params: FingerprintParams, drawing: &Drawing, day: Day) -> Self {
        let mut tables = Tables::new(params);
        let started = Instant::now();
        let mut class_of_app = Vec::with_capacity(drawing.founders.len());
        for chunk in drawing.founders.chunks(1024) {
            class_of_app.extend(
                chunk
                    .iter()
                    .map(|f| tables.record(f.fingerprint, day).class),
            );
            std::hint::black_box(tables.take_dirty());
        }
        let founding = started.elapsed();
        let before = tables.search_stats();
        let started = Instant::now();
        let mut placed = Vec::with_capacity(drawing.draws.len());
        let mut merges = 0;
        for chunk in drawing.draws.chunks(1024) {
            placed.extend(
                chunk
                    .iter()
                    .map(|d| tables.record(d.fingerprint, day).class),
            );
            std::hint::black_box(tables.take_dirty());
            merges += tables.take_merges().len();
        }
        let placing = started.elapsed();
        Self {
            class_of_app,
            founding,
            placing,
            placed,
            merges,
            classes_after: tables.class_count(),
            before,
            after: tables.search_stats(),
            buckets: tables.index_stats(),
            tables,
        }
    }

    /// Whether `class` is (merged into) application `app`'s class.
    fn is_own(&self, class: ClassId, app: u32) -> bool {
        self.tables.root(class) == self.tables.root(self.class_of_app[app as usize])
    }

    fn recall(&self, drawing: &Drawing, tau: f64) -> Recall {
        let (mut at_tau, mut at_tau_right, mut known, mut known_right) = (0usize, 0usize, 0, 0);
        let placed = drawing.draws.iter().zip(&self.placed);
        for ((d, class), estimate) in placed.zip(&drawing.estimates) {
            let Origin::Known(app) = d.origin else {
                continue;
            };
            let right = self.is_own(*class, app);
            known += 1;
            known_right += usize::from(right);
            if estimate.is_some_and(|e| e >= tau) {
                at_tau += 1;
                at_tau_right += usize::from(right);
            }
        }
        Recall {
            at_tau,
            at_tau_right,
            known,
            known_right,
        }
    }
}

/// Reports drawn at similarity tau exactly (the hardest a search must still find): of those
/// estimated at >= tau, how many, and how many land in their application's class.
fn drawn_at_tau(
    args: &Args,
    n: u32,
    params: FingerprintParams,
    day: Day,
    placement: &mut Placement,
    drawing: &mut Drawing,
    rng: &mut ChaCha20Rng,
) -> Result<(usize, usize)> {
    let at_tau_fleet =
        SyntheticFleet::new(n, 0.0, SimilarityProfile::new(vec![params.tau])?, args.seed)?;
    let (mut hard, mut hard_right) = (0usize, 0usize);
    for _ in 0..args.banding_reports {
        let d = at_tau_fleet.draw_fresh(&mut drawing.seen, rng);
        let Origin::Known(app) = d.origin else {
            continue;
        };
        if at_tau_fleet
            .estimate_to_center(&d)
            .is_some_and(|e| e >= params.tau)
        {
            hard += 1;
            let class = placement.tables.record(d.fingerprint, day).class;
            hard_right += usize::from(placement.is_own(class, app));
        }
    }
    Ok((hard, hard_right))
}

/// The 2-bit banding the server used before the locator, on the same representatives and the
/// first `banding_reports` reports.
struct Banding {
    /// Reports searched.
    reports: usize,
    elapsed: Duration,
    /// Representatives compared with, over all searches.
    candidates: u64,
    /// Reports estimated at >= tau, and those of them whose application was a candidate.
    at_tau: usize,
    found: usize,
}

fn banding(
    params: FingerprintParams,
    drawing: &Drawing,
    n: u32,
    banding_reports: usize,
) -> Banding {
    let bands = LshBands::for_params(&params);
    let mut index: std::collections::HashMap<BandKey, Vec<u32>> = Default::default();
    for (app, f) in drawing.founders.iter().enumerate() {
        for key in bands.band_keys(&f.fingerprint.hash, &params) {
            index.entry(key).or_default().push(app as u32);
        }
    }
    let queries: Vec<(&Drawn, &Option<f64>)> = drawing
        .draws
        .iter()
        .zip(&drawing.estimates)
        .take(banding_reports)
        .collect();
    let mut marks = vec![u32::MAX; n as usize];
    let (mut candidates, mut at_tau, mut found) = (0u64, 0usize, 0usize);
    let started = Instant::now();
    for (round, (d, estimate)) in queries.iter().enumerate() {
        let mut best = None::<(u32, f64)>;
        let mut own = false;
        for key in bands.band_keys(&d.fingerprint.hash, &params) {
            let Some(bucket) = index.get(&key) else {
                continue;
            };
            for &app in bucket {
                let mark = &mut marks[app as usize];
                if *mark == round as u32 {
                    continue;
                }
                *mark = round as u32;
                candidates += 1;
                let similarity = drawing.founders[app as usize]
                    .fingerprint
                    .hash
                    .estimate_jaccard(&d.fingerprint.hash, &params);
                if similarity >= params.tau && best.is_none_or(|(_, s)| similarity > s) {
                    best = Some((app, similarity));
                }
                own |= d.origin == Origin::Known(app);
            }
        }
        if estimate.is_some_and(|e| e >= params.tau) {
            at_tau += 1;
            found += usize::from(own);
        }
        std::hint::black_box(best);
    }
    Banding {
        reports: queries.len(),
        elapsed: started.elapsed(),
        candidates,
        at_tau,
        found,
    }
}

/// The writer's figures: its whole batch work in process, its memory and disk, and a restart
/// on its data directory.
struct WriterRun {
    /// Wall and writer-thread CPU seconds over the reports (the founders not counted).
    wall: f64,
    cpu: f64,
    accepted: usize,
    /// The class tables' heap, MiB.
    heap: f64,
    /// Resident memory the writer phase added, MiB.
    rss: f64,
    disk: f64,
    reopened: Reopen,
}

fn writer(
    params: FingerprintParams,
    drawing: &Drawing,
    rng: &mut ChaCha20Rng,
) -> Result<WriterRun> {
    let rss_start = rss_mib(std::process::id())?;
    let key = Keypair::generate(rng).public_key().clone();
    let template = template_report(&key, rng)?;
    let dir = tempfile::tempdir()?;
    let applied = apply_reports(dir.path(), &key, params, &template, drawing, rng)?;
    let rss = rss_mib(std::process::id())? - rss_start;
    let disk = dir_bytes(dir.path())? as f64 / 1_048_576.0;
    let reopened = reopen_child(dir.path())?;
    Ok(WriterRun {
        wall: applied.wall,
        cpu: applied.cpu,
        accepted: applied.accepted,
        heap: applied.heap,
        rss,
        disk,
        reopened,
    })
}

/// What [`apply_reports`] measured.
struct Applied {
    wall: f64,
    cpu: f64,
    accepted: usize,
    heap: f64,
}

/// The founders, then the reports, through the aggregation server's state in batches of
/// 1,024, each report a copy of `template` with the drawn fingerprint; the reports timed.
fn apply_reports(
    dir: &Path,
    key: &PublicKey,
    params: FingerprintParams,
    template: &ValidReport,
    drawing: &Drawing,
    rng: &mut ChaCha20Rng,
) -> Result<Applied> {
    let store: Arc<dyn Store> = Arc::new(RocksStore::open(dir)?);
    let mut state = State::open(store, key, params, sub_sum(), None)?;
    state.set_new_classes_per_hour(NonZeroU32::MAX);
    let today = penrose_host::clock::today();
    for chunk in drawing.founders.chunks(1024) {
        let batch = batch_of(template, chunk, rng, today);
        state.apply(&batch, today)?;
    }
    let batches: Vec<Vec<ValidReport>> = drawing
        .draws
        .chunks(1024)
        .map(|chunk| batch_of(template, chunk, rng, today))
        .collect();
    let cpu_start = thread_cpu_seconds()?;
    let started = Instant::now();
    let mut accepted = 0;
    for batch in &batches {
        let outcomes = state.apply(batch, today)?;
        accepted += outcomes.iter().filter(|o| **o == Outcome::Accepted).count();
    }
    let wall = started.elapsed().as_secs_f64();
    let cpu = thread_cpu_seconds()? - cpu_start;
    let heap = state.tables().heap_bytes() as f64 / 1_048_576.0;
    Ok(Applied {
        wall,
        cpu,
        accepted,
        heap,
    })
}

/// Copies of `template`, one per drawn report: fresh ids, the drawn fingerprint and
/// architecture, a random counter, today.
fn batch_of(
    template: &ValidReport,
    drawn: &[Drawn],
    rng: &mut ChaCha20Rng,
    today: Day,
) -> Vec<ValidReport> {
    drawn
        .iter()
        .map(|d| {
            let mut r = template.clone();
            rng.fill_bytes(&mut r.report.report_id.0);
            rng.fill_bytes(&mut r.digest.0);
            r.report.snippet = d.fingerprint.hash;
            r.report.locator = d.fingerprint.locator;
            r.report.arch = d.arch;
            r.report.counter = CounterId(rng.random_range(0..9));
            r.report.day = today;
            r
        })
        .collect()
}

/// A restart on the data directory, in a fresh process (`--reopen`): its time and memory.
fn reopen_child(dir: &Path) -> Result<Reopen> {
    let output = Command::new(std::env::current_exe()?)
        .arg("bench-fleet")
        .arg("--reopen")
        .arg(dir)
        .output()
        .context("running the restart child")?;
    ensure!(
        output.status.success(),
        "the restart failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(serde_json::from_slice::<Reopen>(&output.stdout)?)
}

/// A valid report (2048-bit key, two ciphertexts) that the writer phase copies.
fn template_report(key: &PublicKey, rng: &mut ChaCha20Rng) -> Result<ValidReport> {
    let mut bins = [0u32; BIN_COUNT];
    for _ in 0..20 {
        bins[rng.random_range(0..BIN_COUNT)] += rng.random_range(1..100);
    }
    let packed = key.encrypt_packed(&bins, rng)?;
    let report = Report {
        key_id: key.key_id(),
        report_id: ReportId([1; 16]),
        snippet: penrose_core::fingerprint::Fingerprinter::new(FingerprintParams::default())?
            .snippet_hash(&["a", "b", "c", "d", "e"]),
        locator: penrose_core::fingerprint::Locator([0; penrose_core::fingerprint::LOCATOR_BANDS]),
        arch: penrose_core::gpu::GpuArch::new(9, 0),
        counter: CounterId(4),
        catalogue: Catalogue::current().version,
        day: Day(20_000),
        samples: SampleCount(bins.iter().sum()),
        ciphertexts: PackedBytes::new(packed.to_bytes(), packed.ciphertexts().len())?,
        token: None,
        evidence: None,
    };
    let frame = Message::Report(report).to_frame()?;
    Ok(validate_body(
        &frame[LENGTH_PREFIX..],
        &penrose_aggregator::design_keys::DesignKeys::single(key.clone()),
        Day(20_000),
        &Admission::Open,
    )?)
}

fn reopen(dir: &Path) -> Result<Reopen> {
    let before = rss_mib(std::process::id())?;
    let started = Instant::now();
    let store: Arc<dyn Store> = Arc::new(RocksStore::open(dir)?);
    let keys = penrose_aggregator::design_keys::stored_settings(store.as_ref())?
        .context("the data directory holds no key")?;
    let state = State::open(store, keys, FingerprintParams::default(), sub_sum(), None)?;
    let seconds = started.elapsed().as_secs_f64();
    std::hint::black_box(state.tables().class_count());
    Ok(Reopen {
        seconds,
        rss_mib: rss_mib(std::process::id())? - before,
    })
}

/// CPU seconds of the calling thread (its first schedstat field, in nanoseconds).
fn thread_cpu_seconds() -> Result<f64> {
    let stat = std::fs::read_to_string("/proc/thread-self/schedstat")?;
    let ns: f64 = stat
        .split_whitespace()
        .next()
        .context("empty schedstat")?
        .parse()?;
    Ok(ns / 1e9)
}

fn markdown(args: &Args, rows: &[Row], recall: &[TraceRecall]) -> String {
    let mut out = header(args, rows);
    out.push_str(&placement_table(rows));
    out.push_str(&early_stop_table(rows));
    out.push_str(&trace_recall_table(recall));
    out.push_str(&growth(rows));
    out
}

/// The command, the machine and the date, and the similarity profile the fleet was drawn from.
fn header(args: &Args, rows: &[Row]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "`cargo xtask bench-fleet --classes {} --reports {} --new-share {}` on {}, {}.\n",
        args.classes
            .iter()
            .map(u32::to_string)
            .collect::<Vec<_>>()
            .join(","),
        args.reports,
        args.new_share,
        machine::describe(),
        today_utc(),
    );
    if let Some(r) = rows.first() {
        let _ = writeln!(
            out,
            "Similarity profile (same-application window pairs of the real traces, L = 10,000): \
             {} pairs, median {:.2}, 1st percentile {:.2}, {:.1}% below tau.\n",
            r.profile_pairs,
            r.profile_median,
            r.profile_p1,
            r.profile_share_below_tau * 100.0
        );
    }
    out
}

/// Placement, the 2-bit banding and the writer, one row per class count.
fn placement_table(rows: &[Row]) -> String {
    let mut out = String::from(
        "| classes | placement us/report | candidates/report | recall >= tau | recall, all | \
         recall, drawn at tau | \
         2-bit bands us/report | 2-bit candidates/report | 2-bit recall >= tau | writer reports/s | \
         writer CPU us/report | RSS MiB | tables MiB | disk MiB | restart s | restart RSS MiB |\n",
    );
    out.push_str("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for r in rows {
        let _ = writeln!(
            out,
            "| {} | {:.2} | {:.2} | {:.4} ({}) | {:.4} | {:.4} ({}) | {:.1} | {:.0} | {:.4} | {:.0} | {:.1} | \
             {:.0} | {:.1} | {:.0} | {:.2} | {:.0} |",
            r.classes,
            r.placement_us_per_report,
            r.candidates_per_report,
            r.recall_at_or_above_tau,
            r.reports_at_or_above_tau,
            r.recall_all_known,
            r.recall_drawn_at_tau,
            r.reports_drawn_at_tau,
            r.banding_us_per_report,
            r.banding_candidates_per_report,
            r.banding_recall_at_or_above_tau,
            r.writer_reports_per_second,
            r.writer_cpu_us_per_report,
            r.rss_mib,
            r.tables_heap_mib,
            r.disk_mib,
            r.restart_seconds,
            r.restart_rss_mib,
        );
    }
    out
}

/// The early stop against probing every band, and the index's buckets.
fn early_stop_table(rows: &[Row]) -> String {
    let mut out = String::from(
        "\nThe early stop (a search ends at the first band with a confident match) against \
         probing every band, on the same founders and reports: classes left after the reports \
         (N founders, about 1% new applications, and reports below tau found classes) and \
         merges made.\n\n\
         | classes | reports of new applications | us/report, early stop | us/report, every band | \
         classes after, early stop | classes after, every band | merges, early stop | \
         merges, every band | bucket displacements | left out of full buckets | \
         foundings left out by a key's daily ration |\n\
         |---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for r in rows {
        let _ = writeln!(
            out,
            "| {} | {} | {:.2} | {:.2} | {} | {} | {} | {} | {} | {} | {} |",
            r.classes,
            r.new_reports,
            r.placement_us_per_report,
            r.every_band_us_per_report,
            r.classes_after,
            r.every_band_classes_after,
            r.merges,
            r.every_band_merges,
            r.bucket_displaced,
            r.bucket_left_out_full,
            r.bucket_left_out_rationed
        );
    }
    out
}

/// What each search makes candidates among pairs of windows of the real traces.
fn trace_recall_table(recall: &[TraceRecall]) -> String {
    let mut out = String::from(
        "\nOn the real traces (40 windows at random offsets of each trace's main process, every \
         pair of one trace): the share of pairs each search makes candidates.\n\n\
         | window L | pairs | pairs at >= tau | locator, >= tau | 2-bit bands, >= tau | locator, all | 2-bit bands, all |\n\
         |---|---|---|---|---|---|---|\n",
    );
    for r in recall {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {:.4} | {:.4} | {:.4} | {:.4} |",
            r.window_len,
            r.pairs,
            r.pairs_at_or_above_tau,
            r.locator_at_or_above_tau,
            r.banding_at_or_above_tau,
            r.locator_all,
            r.banding_all
        );
    }
    out
}

/// How the costs grow from the fewest classes to the most (nothing for one class count).
fn growth(rows: &[Row]) -> String {
    let mut out = String::new();
    if let (Some(first), Some(last)) = (rows.first(), rows.last())
        && rows.len() > 1
    {
        let _ = writeln!(
            out,
            "\nFrom {} to {} classes: placement {:.2}x, 2-bit banding {:.1}x, writer CPU per report \
             {:.2}x.",
            first.classes,
            last.classes,
            last.placement_us_per_report / first.placement_us_per_report,
            last.banding_us_per_report / first.banding_us_per_report,
            last.writer_cpu_us_per_report / first.writer_cpu_us_per_report,
        );
    }
    out
}

/// A line of the plot: its name, colour and values (us per report, one per row).
type Series = (&'static str, &'static str, Vec<f64>);

/// Placement cost per report against N, both indexes, log-log.
fn plot(rows: &[Row]) -> String {
    let xs: Vec<f64> = rows.iter().map(|r| f64::from(r.classes).log10()).collect();
    let series: [Series; 3] = [
        (
            "locator",
            "#1f77b4",
            rows.iter()
                .map(|r| r.placement_us_per_report)
                .collect::<Vec<_>>(),
        ),
        (
            "2-bit bands",
            "#d62728",
            rows.iter().map(|r| r.banding_us_per_report).collect(),
        ),
        (
            "writer CPU",
            "#2ca02c",
            rows.iter().map(|r| r.writer_cpu_us_per_report).collect(),
        ),
    ];
    let frame = Frame::new(&xs, &series);
    let mut svg = frame.canvas();
    for (i, line) in series.iter().enumerate() {
        frame.draw(&mut svg, i, line, &xs);
    }
    svg.push_str("</svg>\n");
    svg
}

/// The plot's canvas and margins, and the whole decades its axes span (log10 of classes and of
/// us per report).
struct Frame {
    x0: f64,
    x1: f64,
    y0: f64,
    y1: f64,
}

impl Frame {
    const W: f64 = 640.0;
    const H: f64 = 360.0;
    const LEFT: f64 = 70.0;
    const BOTTOM: f64 = 50.0;
    const TOP: f64 = 30.0;
    const RIGHT: f64 = 180.0;

    fn new(xs: &[f64], series: &[Series]) -> Self {
        let ys: Vec<f64> = series
            .iter()
            .flat_map(|(_, _, v)| v.iter().map(|y| y.max(0.01).log10()))
            .collect();
        Self {
            x0: xs.iter().copied().fold(f64::MAX, f64::min).floor(),
            x1: xs.iter().copied().fold(f64::MIN, f64::max).ceil(),
            y0: ys.iter().copied().fold(f64::MAX, f64::min).floor(),
            y1: ys.iter().copied().fold(f64::MIN, f64::max).ceil(),
        }
    }

    fn px(&self, x: f64) -> f64 {
        Self::LEFT
            + (x - self.x0) / (self.x1 - self.x0).max(1e-9) * (Self::W - Self::LEFT - Self::RIGHT)
    }

    fn py(&self, y: f64) -> f64 {
        Self::H
            - Self::BOTTOM
            - (y - self.y0) / (self.y1 - self.y0).max(1e-9) * (Self::H - Self::BOTTOM - Self::TOP)
    }

    /// The SVG up to its lines: background, title, a grid line per decade, the x axis' name.
    fn canvas(&self) -> String {
        let (w, h, left, bottom, top, right) = (
            Self::W,
            Self::H,
            Self::LEFT,
            Self::BOTTOM,
            Self::TOP,
            Self::RIGHT,
        );
        let mut svg = format!(
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" \
             viewBox=\"0 0 {w} {h}\" font-family=\"sans-serif\" font-size=\"12\">\n\
             <rect width=\"{w}\" height=\"{h}\" fill=\"white\"/>\n\
             <text x=\"{left}\" y=\"18\" font-size=\"14\">Cost per report against the number of \
             classes (log-log)</text>\n"
        );
        let mut decade = self.x0;
        while decade <= self.x1 {
            let x = self.px(decade);
            let _ = writeln!(
                svg,
                "<line x1=\"{x:.1}\" y1=\"{:.1}\" x2=\"{x:.1}\" y2=\"{top}\" stroke=\"#ddd\"/>\
                 <text x=\"{x:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{:.0}</text>",
                h - bottom,
                h - bottom + 16.0,
                10f64.powf(decade)
            );
            decade += 1.0;
        }
        let mut decade = self.y0;
        while decade <= self.y1 {
            let y = self.py(decade);
            let _ = writeln!(
                svg,
                "<line x1=\"{left}\" y1=\"{y:.1}\" x2=\"{:.1}\" y2=\"{y:.1}\" stroke=\"#ddd\"/>\
                 <text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{} us</text>",
                w - right,
                left - 6.0,
                y + 4.0,
                10f64.powf(decade)
            );
            decade += 1.0;
        }
        let _ = writeln!(
            svg,
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">classes</text>",
            (left + w - right) / 2.0,
            h - 12.0
        );
        svg
    }

    /// Line `i` of the plot: its polyline, a dot per point, its entry in the legend.
    fn draw(&self, svg: &mut String, i: usize, (name, color, values): &Series, xs: &[f64]) {
        let (w, top, right) = (Self::W, Self::TOP, Self::RIGHT);
        let points: Vec<String> = xs
            .iter()
            .zip(values)
            .map(|(x, y)| format!("{:.1},{:.1}", self.px(*x), self.py(y.max(0.01).log10())))
            .collect();
        let _ = writeln!(
            svg,
            "<polyline points=\"{}\" fill=\"none\" stroke=\"{color}\" stroke-width=\"2\"/>",
            points.join(" ")
        );
        for p in &points {
            let (x, y) = p.split_once(',').unwrap_or(("0", "0"));
            let _ = writeln!(
                svg,
                "<circle cx=\"{x}\" cy=\"{y}\" r=\"3\" fill=\"{color}\"/>"
            );
        }
        let ly = top + 20.0 + i as f64 * 18.0;
        let _ = writeln!(
            svg,
            "<line x1=\"{:.1}\" y1=\"{ly:.1}\" x2=\"{:.1}\" y2=\"{ly:.1}\" stroke=\"{color}\" \
             stroke-width=\"2\"/><text x=\"{:.1}\" y=\"{:.1}\">{name}</text>",
            w - right + 10.0,
            w - right + 30.0,
            w - right + 36.0,
            ly + 4.0
        );
    }
}

/// The reports' text on fixed, made-up results.
#[cfg(test)]
mod report_tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: Args,
    }

    fn row(n: u32) -> Row {
        let x = f64::from(n).log10();
        Row {
            classes: n,
            reports: 5000,
            profile_pairs: 66,
            profile_median: 0.81234,
            profile_p1: 0.3456,
            profile_share_below_tau: 0.0789,
            founding_us_per_class: 3.3 * x,
            placement_us_per_report: 1.2345 * x,
            candidates_per_report: 2.5 * x,
            estimates_per_report: 3.1 * x,
            recall_at_or_above_tau: 0.99876,
            reports_at_or_above_tau: 4321 + n as usize,
            recall_all_known: 0.95432,
            recall_drawn_at_tau: 0.91234,
            reports_drawn_at_tau: 1234,
            classes_after: n as usize + 50,
            new_reports: 50,
            merges: 3,
            every_band_us_per_report: 2.3456 * x,
            every_band_classes_after: n as usize + 48,
            every_band_merges: 5,
            bucket_displaced: 7,
            bucket_left_out_full: 8,
            bucket_left_out_rationed: 9,
            banding_reports: 2000,
            banding_us_per_report: 12.345 * x * x,
            banding_candidates_per_report: 123.4 * x,
            banding_recall_at_or_above_tau: 0.87654,
            writer_reports_per_second: 45678.9 / x,
            writer_cpu_us_per_report: 21.234 * x,
            writer_accepted: 4999,
            rss_mib: 123.4 * x,
            tables_heap_mib: 45.67 * x,
            disk_mib: 234.5 * x,
            restart_seconds: 0.1234 * x,
            restart_rss_mib: 98.7 * x,
        }
    }

    fn recall() -> Vec<TraceRecall> {
        vec![
            TraceRecall {
                window_len: 10_000,
                pairs: 780,
                pairs_at_or_above_tau: 700,
                locator_at_or_above_tau: 0.99,
                banding_at_or_above_tau: 0.95,
                locator_all: 0.9,
                banding_all: 0.85,
            },
            TraceRecall {
                window_len: 2500,
                pairs: 780,
                pairs_at_or_above_tau: 500,
                locator_at_or_above_tau: 0.97,
                banding_at_or_above_tau: 0.9,
                locator_all: 0.7,
                banding_all: 0.6,
            },
        ]
    }

    #[test]
    fn markdown_has_a_row_per_count_in_each_table_and_the_growth_for_several() {
        let args = Cli::parse_from(["x", "--classes", "1000,10000,100000"]).args;
        let rows: Vec<Row> = [1000, 10_000, 100_000].map(row).to_vec();
        let text = markdown(&args, &rows, &recall());
        assert!(text.starts_with("`cargo xtask bench-fleet --classes 1000,10000,100000 "));
        assert!(text.contains("Similarity profile (same-application window pairs"));
        let (tables, traces) = text.split_at(text.find("\nOn the real traces").expect("traces"));
        for n in [1000, 10_000, 100_000] {
            // The placement table and the early-stop table.
            assert_eq!(tables.matches(&format!("\n| {n} | ")).count(), 2, "{n}");
        }
        assert!(traces.contains("| 2500 | 780 | 500 | 0.9700 | 0.9000 | 0.7000 | 0.6000 |"));
        assert!(text.contains("\nFrom 1000 to 100000 classes: placement 1.67x"));
        let one = markdown(&args, &rows[..1], &recall());
        assert!(!one.contains("\nFrom "));
        let none = markdown(&args, &[], &[]);
        assert!(!none.contains("Similarity profile"));
        assert!(none.contains("| window L | pairs |"));
    }

    #[test]
    fn plot_draws_each_series_with_a_point_per_count_and_a_legend() {
        let rows: Vec<Row> = [1000, 10_000, 100_000].map(row).to_vec();
        let svg = plot(&rows);
        assert!(svg.starts_with("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"640\""));
        assert!(svg.ends_with("</svg>\n"));
        assert_eq!(svg.matches("<polyline ").count(), 3);
        assert_eq!(svg.matches("<circle ").count(), 9);
        for name in ["locator", "2-bit bands", "writer CPU"] {
            assert!(svg.contains(&format!(">{name}</text>")), "{name}");
        }
        // Three decades of classes, 10^3 to 10^5.
        for label in [">1000</text>", ">10000</text>", ">100000</text>"] {
            assert!(svg.contains(label), "{label}");
        }
    }
}
