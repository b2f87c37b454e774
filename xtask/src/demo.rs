//! `cargo xtask demo`: the system end to end on this machine, with what exists today.
//!
//! Stand-in GPUs run the real traces (each GPU runs one application: one trace job); each GPU's
//! agent logic captures windows at random offsets of its looped launch sequence, fingerprints
//! them, samples launches, bins counter values derived from the trace's per-kernel fields,
//! seals and encrypts the histograms and encodes them as wire reports. The aggregator logic
//! decodes and validates every report, groups snippets into classes by estimated similarity
//! and adds ciphertexts per (class, counter). The design server logic decrypts the classes
//! with enough reports, and the demo checks every decrypted histogram, bin for bin, against
//! the plaintext histograms the agents sealed. All of it runs in one process: the network
//! services, the probes and the storage come with later issues.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail, ensure};
use indicatif::{ProgressBar, ProgressStyle};
use penrose_core::counters::{BIN_COUNT, Catalogue, Counter, CounterGroup, CounterId};
use penrose_core::fingerprint::{FingerprintParams, Fingerprinter, SnippetHash};
use penrose_core::histogram::{Histogram, SampleCount};
use penrose_core::paillier::{Accumulator, Keypair, MAX_REPORT_SAMPLES, PrivateKey, PublicKey};
use penrose_core::sampling::{Decision, SamplePeriod, SamplingSchedule};
use penrose_core::wire::{Day, Message, PackedBytes, Report, ReportId};
use penrose_traces::{Kernel, TraceFolder, job_name};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;

/// Arguments of `cargo xtask demo`.
#[derive(clap::Args)]
pub struct Args {
    /// Folder of profiler traces [default: $PENROSE_TRACES, else ../shared/traces next to the
    /// workspace]; a synthetic workload is used when it does not exist.
    #[arg(long)]
    traces: Option<PathBuf>,
    /// Stand-in GPUs per application.
    #[arg(long, default_value_t = 12)]
    gpus_per_app: usize,
    /// Capture windows per GPU.
    #[arg(long, default_value_t = 4)]
    windows: usize,
    /// Launches per capture window (L; the design's default is 10,000).
    #[arg(long, default_value_t = 2_500)]
    window_len: usize,
    /// Sample one launch in this many (S; compressed from the design's 10,000 so that a short
    /// run has samples to show).
    #[arg(long, default_value_t = 16)]
    sample_period: u32,
    /// Classes with fewer reports than this are not decrypted (the contributor threshold k).
    #[arg(long, default_value_t = 10)]
    min_reports: u64,
    /// Seed of the workload's random choices (window offsets, sampling offsets). Keys and
    /// report ids always come from the operating system's generator.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Print the result as JSON.
    #[arg(long)]
    json: bool,
}

/// One application of the workload: the launch sequences of its processes (ranks).
struct App {
    name: String,
    sequences: Vec<Vec<Kernel>>,
}

/// A sealed, encrypted report and, beside it, the plaintext the agent sealed: the record the
/// exactness check compares against (it never leaves the agent in the real system).
struct Sealed {
    frame: Vec<u8>,
    report_id: ReportId,
    plaintext: Histogram,
    app: usize,
}

#[derive(Serialize)]
struct ClassRow {
    class: usize,
    /// Ground truth the aggregator does not know: which applications' reports landed here.
    applications: Vec<String>,
    counter: &'static str,
    reports: u64,
    samples: u64,
    decrypted: bool,
    mean: Option<f64>,
    p50: Option<f64>,
    p90: Option<f64>,
    unit: &'static str,
    exact: Option<bool>,
}

#[derive(Serialize)]
struct Outcome {
    workload: String,
    applications: usize,
    gpus: usize,
    reports: usize,
    report_bytes: usize,
    classes: usize,
    mixed_classes: usize,
    split_applications: usize,
    decrypted_histograms: usize,
    withheld_histograms: usize,
    all_exact: bool,
    seconds: BTreeMap<&'static str, f64>,
    rows: Vec<ClassRow>,
}

/// Runs the demo.
pub fn run(args: Args) -> Result<()> {
    ensure!(args.sample_period > 0, "--sample-period must be at least 1");
    ensure!(args.window_len > 0, "--window-len must be at least 1");
    let mut seconds = BTreeMap::new();
    let say = |msg: &str| {
        if !args.json {
            eprintln!("{msg}");
        }
    };
    say("Penrose demo: stand-in GPUs -> agent logic -> aggregator logic -> design server logic");
    say(&format!(
        "compressed time: 1 launch in {} sampled (design: 10,000), windows of {} launches \
         (design: 10,000), {} windows per GPU",
        args.sample_period, args.window_len, args.windows
    ));

    let t = Instant::now();
    let (workload, apps) = load_workload(&args)?;
    seconds.insert("load workload", t.elapsed().as_secs_f64());
    say(&format!(
        "workload: {workload}: {} applications, {} GPUs each",
        apps.len(),
        args.gpus_per_app
    ));

    let t = Instant::now();
    say("design server: generating a 2048-bit Paillier key pair");
    let keys = Keypair::generate(&mut rand::rng());
    let public = keys.public_key().clone();
    let private = keys.into_private_key();
    seconds.insert("key generation", t.elapsed().as_secs_f64());
    say(&format!("  key id {}", public.key_id()));

    let fingerprinter = Fingerprinter::new(FingerprintParams::default())
        .context("default fingerprint parameters")?;
    let t = Instant::now();
    let sealed = run_agents(&args, &apps, &public, &fingerprinter)?;
    seconds.insert(
        "agents (capture, sample, encrypt)",
        t.elapsed().as_secs_f64(),
    );

    let t = Instant::now();
    let aggregate = aggregate(&sealed, &public, &fingerprinter)?;
    seconds.insert(
        "aggregator (decode, validate, add)",
        t.elapsed().as_secs_f64(),
    );

    let t = Instant::now();
    let rows = decrypt_and_check(&args, &apps, &sealed, &aggregate, &private)?;
    seconds.insert("design server (decrypt, check)", t.elapsed().as_secs_f64());

    let classes = aggregate.class_members.len();
    let mixed_classes = aggregate
        .class_members
        .values()
        .filter(|members| apps_of(members, &sealed).len() > 1)
        .count();
    let mut classes_of_app: HashMap<usize, Vec<usize>> = HashMap::new();
    for (&class, members) in &aggregate.class_members {
        for app in apps_of(members, &sealed) {
            classes_of_app.entry(app).or_default().push(class);
        }
    }
    let outcome = Outcome {
        workload,
        applications: apps.len(),
        gpus: apps.len() * args.gpus_per_app,
        reports: sealed.len(),
        report_bytes: sealed.first().map_or(0, |s| s.frame.len()),
        classes,
        mixed_classes,
        split_applications: classes_of_app.values().filter(|c| c.len() > 1).count(),
        decrypted_histograms: rows.iter().filter(|r| r.decrypted).count(),
        withheld_histograms: rows.iter().filter(|r| !r.decrypted).count(),
        all_exact: rows.iter().all(|r| r.exact != Some(false)),
        seconds,
        rows,
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&outcome)?);
    } else {
        print_outcome(&outcome);
    }
    if !outcome.all_exact {
        bail!("a decrypted histogram differs from what the agents sealed");
    }
    Ok(())
}

fn load_workload(args: &Args) -> Result<(String, Vec<App>)> {
    let dir = args.traces.clone().unwrap_or_else(TraceFolder::default_dir);
    if !dir.is_dir() {
        eprintln!(
            "note: {} does not exist; using a synthetic workload instead",
            dir.display()
        );
        return Ok(("synthetic".into(), synthetic_apps(args.seed)));
    }
    let folder = TraceFolder::open(&dir).with_context(|| format!("listing {}", dir.display()))?;
    ensure!(
        !folder.files().is_empty(),
        "no .json or .json.gz traces in {}",
        dir.display()
    );
    let bar = progress(folder.files().len() as u64, "reading traces", args.json);
    let mut by_job: BTreeMap<String, Vec<Vec<Kernel>>> = BTreeMap::new();
    for path in folder.files() {
        bar.set_message(
            path.file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default(),
        );
        let trace = penrose_traces::read_trace(path)?;
        // The process that launched the most kernels is the application's main process.
        let longest = trace
            .process_sequences()
            .into_values()
            .max_by_key(Vec::len)
            .unwrap_or_default();
        if !longest.is_empty() {
            by_job
                .entry(job_name(path))
                .or_default()
                .push(longest.into_iter().cloned().collect());
        }
        bar.inc(1);
    }
    bar.finish_and_clear();
    let apps = by_job
        .into_iter()
        .map(|(name, sequences)| App { name, sequences })
        .collect();
    Ok((format!("traces in {}", dir.display()), apps))
}

/// Three made-up applications, each repeating an iteration of kernels from its own alphabet,
/// so that the demo runs where the real traces are absent.
fn synthetic_apps(seed: u64) -> Vec<App> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x5eed);
    (0..3)
        .map(|a| {
            let names: Vec<Arc<str>> = (0..40)
                .map(|k| Arc::from(format!("synthetic_app{a}_kernel_{k}")))
                .collect();
            let iteration: Vec<Kernel> = (0..300)
                .map(|i| {
                    let name = names[rng.random_range(0..names.len())].clone();
                    synthetic_kernel(name, i as f64 * 10.0, &mut rng)
                })
                .collect();
            App {
                name: format!("synthetic-{a}"),
                sequences: vec![iteration],
            }
        })
        .collect()
}

fn synthetic_kernel(name: Arc<str>, ts_us: f64, rng: &mut impl Rng) -> Kernel {
    Kernel {
        name,
        ts_us,
        dur_us: rng.random_range(2.0..2_000.0),
        launch_ts_us: None,
        process: penrose_traces::ProcessId(1),
        stream: Some(penrose_traces::StreamId(7)),
        device: Some(penrose_traces::DeviceId(0)),
        correlation: None,
        grid: Some([rng.random_range(1..1024), 1, 1]),
        block: Some([128, 1, 1]),
        registers_per_thread: Some(rng.random_range(16..128)),
        shared_memory_bytes: Some(rng.random_range(0..49_152)),
        est_achieved_occupancy_pct: Some(rng.random_range(5.0..100.0)),
        blocks_per_sm: Some(rng.random_range(0.1..64.0)),
    }
}

/// The counter value a stand-in source derives from a kernel's trace fields, for the counters
/// of group 2 (what the launch itself tells); `None` when the trace lacks the field.
fn counter_value(counter: &Counter, kernel: &Kernel) -> Option<f64> {
    match counter.name {
        "achieved_occupancy" => kernel.est_achieved_occupancy_pct,
        "kernel_duration" => (kernel.dur_us > 0.0).then_some(kernel.dur_us * 1_000.0),
        "blocks_per_sm" => kernel.blocks_per_sm,
        "registers_per_thread" => kernel.registers_per_thread.map(f64::from),
        "shared_memory" => kernel.shared_memory_bytes.map(|b| b as f64),
        _ => None,
    }
}

/// One local application of one agent: its first snippet and its open histograms.
struct LocalApp {
    snippet: SnippetHash,
    histograms: BTreeMap<CounterId, Histogram>,
}

fn run_agents(
    args: &Args,
    apps: &[App],
    public: &PublicKey,
    fingerprinter: &Fingerprinter,
) -> Result<Vec<Sealed>> {
    let catalogue = Catalogue::current();
    let counters: Vec<&Counter> = catalogue.group(CounterGroup(2)).collect();
    let period = SamplePeriod(
        std::num::NonZeroU32::new(args.sample_period).context("sample period is zero")?,
    );
    let day = Day((SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs()
        / 86_400) as u32);
    let gpus = apps.len() * args.gpus_per_app;
    let bar = progress(gpus as u64, "stand-in GPUs", args.json);
    let mut sealed = Vec::new();
    let mut os_rng = rand::rng();
    for (app_index, app) in apps.iter().enumerate() {
        for gpu in 0..args.gpus_per_app {
            let mut rng =
                ChaCha8Rng::seed_from_u64(args.seed ^ ((app_index as u64) << 32) ^ gpu as u64);
            let sequence = &app.sequences[gpu % app.sequences.len()];
            let mut schedule = SamplingSchedule::new(
                period,
                Duration::from_secs(600),
                rng.clone(),
                Duration::ZERO,
            );
            let mut local: Vec<LocalApp> = Vec::new();
            for _ in 0..args.windows {
                let offset = rng.random_range(0..sequence.len());
                let window: Vec<&Kernel> = (0..args.window_len)
                    .map(|i| &sequence[(offset + i) % sequence.len()])
                    .collect();
                let names: Vec<&str> = window.iter().map(|k| &*k.name).collect();
                let snippet = fingerprinter.snippet_hash(&names);
                // The agent's own clustering: a window joins the local application it matches.
                let index = match local
                    .iter()
                    .position(|l| fingerprinter.same_application(&l.snippet, &snippet))
                {
                    Some(i) => i,
                    None => {
                        local.push(LocalApp {
                            snippet,
                            histograms: BTreeMap::new(),
                        });
                        local.len() - 1
                    }
                };
                for (i, kernel) in window.iter().enumerate() {
                    let now = Duration::from_micros(i as u64);
                    if schedule.on_launch(now) != Decision::Sample {
                        continue;
                    }
                    for counter in &counters {
                        let Some(value) = counter_value(counter, kernel) else {
                            continue;
                        };
                        let bin = counter.binning.bin(value)?;
                        let histograms = &mut local[index].histograms;
                        let h = histograms.entry(counter.id).or_default();
                        if u64::from(h.samples().0) >= MAX_REPORT_SAMPLES {
                            // Seal a full histogram before it could exceed a report's bound.
                            let full = std::mem::take(h);
                            sealed.push(seal(
                                full,
                                counter,
                                local[index].snippet,
                                app_index,
                                day,
                                public,
                                &mut os_rng,
                            )?);
                        }
                        local[index]
                            .histograms
                            .entry(counter.id)
                            .or_default()
                            .record(bin)?;
                    }
                }
            }
            for l in local {
                for (id, histogram) in l.histograms {
                    if histogram.samples().0 == 0 {
                        continue;
                    }
                    let counter = catalogue
                        .counter(id)
                        .context("counter vanished from the catalogue")?;
                    sealed.push(seal(
                        histogram,
                        counter,
                        l.snippet,
                        app_index,
                        day,
                        public,
                        &mut os_rng,
                    )?);
                }
            }
            bar.inc(1);
        }
    }
    bar.finish_and_clear();
    Ok(sealed)
}

fn seal(
    histogram: Histogram,
    counter: &Counter,
    snippet: SnippetHash,
    app: usize,
    day: Day,
    public: &PublicKey,
    rng: &mut impl rand::CryptoRng,
) -> Result<Sealed> {
    let packed = public.encrypt_packed(histogram.bins(), rng)?;
    let mut id = [0u8; 16];
    rng.fill_bytes(&mut id);
    let report_id = ReportId(id);
    let report = Report {
        key_id: public.key_id(),
        report_id,
        snippet,
        counter: counter.id,
        catalogue: Catalogue::current().version,
        day,
        samples: histogram.samples(),
        ciphertexts: PackedBytes::new(packed.to_bytes(), packed.ciphertexts().len())?,
    };
    Ok(Sealed {
        frame: Message::Report(report).to_frame()?,
        report_id,
        plaintext: histogram,
        app,
    })
}

struct Aggregate {
    /// Per (class, counter): the running ciphertext sum.
    sums: BTreeMap<(usize, CounterId), Accumulator>,
    /// Per class: the reports it holds (for the demo's check only).
    class_members: BTreeMap<usize, Vec<ReportId>>,
    /// Per (class, counter): the reports added into the sum.
    summed: BTreeMap<(usize, CounterId), Vec<ReportId>>,
}

/// What the aggregation server will do per report: decode, validate, classify, add.
fn aggregate(
    sealed: &[Sealed],
    public: &PublicKey,
    fingerprinter: &Fingerprinter,
) -> Result<Aggregate> {
    let mut representatives: Vec<SnippetHash> = Vec::new();
    let mut out = Aggregate {
        sums: BTreeMap::new(),
        class_members: BTreeMap::new(),
        summed: BTreeMap::new(),
    };
    for s in sealed {
        let (message, used) = Message::decode(&s.frame)?;
        ensure!(used == s.frame.len(), "frame has trailing bytes");
        let Message::Report(report) = message else {
            bail!("expected a report");
        };
        ensure!(
            report.key_id == public.key_id(),
            "report for an unknown key"
        );
        let catalogue = Catalogue::by_version(report.catalogue).context("unknown catalogue")?;
        catalogue
            .counter(report.counter)
            .context("counter not in the catalogue")?;
        let samples = u64::from(report.samples.0);
        ensure!(
            (1..=MAX_REPORT_SAMPLES).contains(&samples),
            "sample count out of range"
        );
        // Best matching class at or above tau, else a new class.
        let best = representatives
            .iter()
            .enumerate()
            .map(|(i, rep)| (i, fingerprinter.similarity(rep, &report.snippet)))
            .filter(|(_, sim)| *sim >= fingerprinter.params().tau)
            .max_by(|a, b| a.1.total_cmp(&b.1))
            .map(|(i, _)| i);
        let class = match best {
            Some(class) => class,
            None => {
                representatives.push(report.snippet);
                representatives.len() - 1
            }
        };
        let key = (class, report.counter);
        let accumulator = out
            .sums
            .entry(key)
            .or_insert_with(|| Accumulator::new(public));
        accumulator.absorb_bytes(report.ciphertexts.as_bytes(), samples)?;
        out.summed.entry(key).or_default().push(report.report_id);
        out.class_members
            .entry(class)
            .or_default()
            .push(report.report_id);
    }
    Ok(out)
}

fn decrypt_and_check(
    args: &Args,
    apps: &[App],
    sealed: &[Sealed],
    aggregate: &Aggregate,
    private: &PrivateKey,
) -> Result<Vec<ClassRow>> {
    let by_id: HashMap<ReportId, &Sealed> = sealed.iter().map(|s| (s.report_id, s)).collect();
    let catalogue = Catalogue::current();
    let mut rows = Vec::new();
    for (&(class, counter_id), accumulator) in &aggregate.sums {
        let counter = catalogue
            .counter(counter_id)
            .context("counter vanished from the catalogue")?;
        let members = aggregate
            .summed
            .get(&(class, counter_id))
            .map(Vec::as_slice)
            .unwrap_or_default();
        let applications = apps_of(members, sealed)
            .into_iter()
            .map(|a| apps[a].name.clone())
            .collect();
        let mut row = ClassRow {
            class,
            applications,
            counter: counter.name,
            reports: accumulator.reports(),
            samples: accumulator.samples(),
            decrypted: false,
            mean: None,
            p50: None,
            p90: None,
            unit: counter.unit.suffix(),
            exact: None,
        };
        if accumulator.reports() >= args.min_reports {
            let sums = private.decrypt_packed(&accumulator.sum()?)?;
            let mut expected = [0u64; BIN_COUNT];
            for id in members {
                let s = by_id
                    .get(id)
                    .context("report missing from the agents' record")?;
                for (e, &b) in expected.iter_mut().zip(s.plaintext.bins()) {
                    *e += u64::from(b);
                }
            }
            let bins: Vec<u32> = sums
                .iter()
                .map(|&v| u32::try_from(v))
                .collect::<Result<_, _>>()
                .context("decrypted bin does not fit 32 bits")?;
            let histogram = Histogram::from_bins(&bins)?;
            row.decrypted = true;
            row.exact = Some(sums == expected && histogram.samples() == sample_count(accumulator));
            row.mean = histogram.mean(&counter.binning);
            row.p50 = histogram.quantile(&counter.binning, 0.5);
            row.p90 = histogram.quantile(&counter.binning, 0.9);
        }
        rows.push(row);
    }
    Ok(rows)
}

fn sample_count(accumulator: &Accumulator) -> SampleCount {
    SampleCount(u32::try_from(accumulator.samples()).unwrap_or(u32::MAX))
}

fn apps_of(members: &[ReportId], sealed: &[Sealed]) -> Vec<usize> {
    let mut apps: Vec<usize> = sealed
        .iter()
        .filter(|s| members.contains(&s.report_id))
        .map(|s| s.app)
        .collect();
    apps.sort_unstable();
    apps.dedup();
    apps
}

fn print_outcome(o: &Outcome) {
    println!();
    println!(
        "{:>5}  {:<22} {:>7} {:>8}  {:>12} {:>12} {:>12}  {:<6} application (ground truth)",
        "class", "counter", "reports", "samples", "mean", "p50", "p90", "exact"
    );
    for r in &o.rows {
        let value = |v: Option<f64>| v.map_or_else(|| "-".into(), |v| with_unit(v, r.unit));
        println!(
            "{:>5}  {:<22} {:>7} {:>8}  {:>12} {:>12} {:>12}  {:<6} {}",
            r.class,
            r.counter,
            r.reports,
            r.samples,
            value(r.mean),
            value(r.p50),
            value(r.p90),
            match r.exact {
                Some(true) => "yes",
                Some(false) => "NO",
                None => "held",
            },
            r.applications.join(", ")
        );
    }
    println!();
    println!(
        "{} applications on {} stand-in GPUs sent {} reports of {} bytes each.",
        o.applications, o.gpus, o.reports, o.report_bytes
    );
    println!(
        "The aggregator formed {} classes ({} mixing applications; {} applications split \
         over several classes).",
        o.classes, o.mixed_classes, o.split_applications
    );
    println!(
        "The design server decrypted {} histograms ({} held back below the threshold); \
         every decrypted histogram equals the agents' sealed histograms bin for bin: {}.",
        o.decrypted_histograms,
        o.withheld_histograms,
        if o.all_exact { "yes" } else { "NO" }
    );
    for (stage, s) in &o.seconds {
        println!("  {stage:<38} {s:>7.2} s");
    }
}

/// A value with its unit, scaled to read at a glance (durations in s/ms/µs, sizes in KiB/MiB).
fn with_unit(v: f64, unit: &str) -> String {
    let scales: &[(f64, &str)] = match unit {
        "ns" => &[(1e9, "s"), (1e6, "ms"), (1e3, "µs"), (1.0, "ns")],
        "B" => &[(1_048_576.0, "MiB"), (1024.0, "KiB"), (1.0, "B")],
        other => return format!("{v:.1}{other}"),
    };
    let (div, name) = scales
        .iter()
        .find(|(div, _)| v.abs() >= *div)
        .or(scales.last())
        .copied()
        .unwrap_or((1.0, unit));
    format!("{:.1} {name}", v / div)
}

fn progress(len: u64, what: &'static str, hidden: bool) -> ProgressBar {
    if hidden {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(len);
    if let Ok(style) = ProgressStyle::with_template("{prefix} [{bar:30}] {pos}/{len} {msg}") {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.set_prefix(what);
    bar
}
