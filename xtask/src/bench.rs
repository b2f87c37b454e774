//! `cargo xtask bench`: runs the criterion benchmarks, then turns criterion's estimates into
//! one table (printed, and written to `docs/benchmarks.md` with the machine it ran on), set
//! against the targets the issues give.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};
use serde::Deserialize;
use serde::de::IgnoredAny;
use xtask::machine;
use xtask::workspace::{target_dir, workspace_root};

/// Arguments of `cargo xtask bench`.
#[derive(clap::Args)]
pub struct Args {
    /// Only run benchmarks whose id contains this (criterion's filter).
    #[arg(long)]
    filter: Option<String>,
    /// Do not run the benchmarks; summarise the estimates criterion already wrote.
    #[arg(long)]
    no_run: bool,
    /// Where to write the report.
    #[arg(long, default_value = "docs/benchmarks.md")]
    out: PathBuf,
    /// Print the table as JSON instead of text.
    #[arg(long)]
    json: bool,
}

/// A target from the issues: a benchmark id it applies to and the bound it must meet.
struct Target {
    id_contains: &'static str,
    bound: Bound,
    paper: &'static str,
}

enum Bound {
    /// Median time per iteration at most this many seconds.
    AtMostSeconds(f64),
    /// Throughput at least this many elements per second.
    AtLeastPerSecond(f64),
}

const TARGETS: &[Target] = &[
    Target {
        // Wall and thread-CPU rows (`ingest_2048/`, `ingest_2048_cpu/`); per core is the CPU one.
        id_contains: "writer_apply_batch",
        bound: Bound::AtLeastPerSecond(60_000.0),
        paper: "8,075 /s/core",
    },
    Target {
        id_contains: "encrypt_histogram_2048/djn_fixed_base",
        bound: Bound::AtMostSeconds(3e-3),
        paper: "105 ms",
    },
    Target {
        id_contains: "aggregate_histogram_2048/absorb_bytes_from_wire",
        bound: Bound::AtLeastPerSecond(60_000.0),
        paper: "8,075 /s/core",
    },
];

#[derive(Deserialize)]
struct Estimates {
    median: Estimate,
}

#[derive(Deserialize)]
struct Estimate {
    point_estimate: f64,
    confidence_interval: Interval,
}

#[derive(Deserialize)]
struct Interval {
    lower_bound: f64,
    upper_bound: f64,
}

#[derive(Deserialize)]
struct BenchmarkInfo {
    full_id: String,
    throughput: Option<Throughput>,
}

#[derive(Deserialize)]
enum Throughput {
    Elements(u64),
    Bytes(IgnoredAny),
    BytesDecimal(IgnoredAny),
    ElementsAndBytes { elements: u64 },
}

/// One benchmark's result, as printed.
#[derive(serde::Serialize)]
struct Row {
    id: String,
    median_ns: f64,
    low_ns: f64,
    high_ns: f64,
    /// Elements per second at the median, when the benchmark declares a throughput.
    per_second: Option<f64>,
    target: Option<String>,
    met: Option<bool>,
}

/// Runs the task.
pub fn run(args: Args) -> Result<()> {
    let root = workspace_root()?;
    // Criterion keeps estimates of benchmarks that no longer exist; a run reports only what
    // it measured itself.
    let started = std::time::SystemTime::now();
    if !args.no_run {
        let mut cmd = Command::new(env!("CARGO"));
        cmd.current_dir(&root)
            .args(["bench", "--workspace", "--bench", "*", "--"]);
        if let Some(filter) = &args.filter {
            cmd.arg(filter);
        }
        let status = cmd.status().context("running cargo bench")?;
        if !status.success() {
            bail!("cargo bench failed: {status}");
        }
    }
    let criterion = target_dir(&root).join("criterion");
    let since = (!args.no_run).then_some(started);
    let mut rows = collect(&criterion, since)?;
    if rows.is_empty() {
        bail!(
            "no criterion estimates under {} (run without --no-run)",
            criterion.display()
        );
    }
    rows.sort_by(|a, b| a.id.cmp(&b.id));
    if args.json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
    } else {
        print!("{}", table(&rows));
    }
    let sizes = report_sizes()?;
    if !args.json {
        println!("\n{sizes}");
    }
    let report = report(&root, &rows, &machine::describe(), &sizes);
    let out = root.join(&args.out);
    std::fs::write(&out, report).with_context(|| format!("writing {}", out.display()))?;
    eprintln!("wrote {}", out.display());
    Ok(())
}

fn collect(criterion: &Path, since: Option<std::time::SystemTime>) -> Result<Vec<Row>> {
    let mut rows = Vec::new();
    let mut stack = vec![criterion.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if !path.is_dir() {
                continue;
            }
            let estimates = path.join("new/estimates.json");
            let info = path.join("new/benchmark.json");
            if estimates.is_file() && info.is_file() {
                let fresh = match since {
                    Some(since) => std::fs::metadata(&estimates)
                        .and_then(|m| m.modified())
                        .is_ok_and(|t| t >= since),
                    None => true,
                };
                if fresh {
                    rows.push(row(&estimates, &info)?);
                }
            } else if path.file_name().is_some_and(|n| n != "report") {
                stack.push(path);
            }
        }
    }
    Ok(rows)
}

fn row(estimates: &Path, info: &Path) -> Result<Row> {
    let read = |p: &Path| std::fs::read_to_string(p).with_context(|| format!("{}", p.display()));
    let est: Estimates = serde_json::from_str(&read(estimates)?)
        .with_context(|| format!("parsing {}", estimates.display()))?;
    let info: BenchmarkInfo = serde_json::from_str(&read(info)?)
        .with_context(|| format!("parsing {}", info.display()))?;
    let median_ns = est.median.point_estimate;
    let elements = match info.throughput {
        Some(Throughput::Elements(n)) | Some(Throughput::ElementsAndBytes { elements: n, .. }) => {
            Some(n)
        }
        Some(Throughput::Bytes(_)) | Some(Throughput::BytesDecimal(_)) | None => None,
    };
    let per_second = elements.map(|n| n as f64 / (median_ns * 1e-9));
    let target = TARGETS
        .iter()
        .find(|t| info.full_id.contains(t.id_contains));
    let (target_text, met) = match target {
        Some(t) => match t.bound {
            Bound::AtMostSeconds(s) => (
                Some(format!("<= {} (paper {})", seconds(s * 1e9), t.paper)),
                Some(median_ns * 1e-9 <= s),
            ),
            Bound::AtLeastPerSecond(r) => (
                Some(format!(">= {r:.0}/s (paper {})", t.paper)),
                Some(per_second.unwrap_or(1e9 / median_ns) >= r),
            ),
        },
        None => (None, None),
    };
    Ok(Row {
        id: info.full_id,
        median_ns,
        low_ns: est.median.confidence_interval.lower_bound,
        high_ns: est.median.confidence_interval.upper_bound,
        per_second,
        target: target_text,
        met,
    })
}

/// Bytes of one real report on the wire: a fresh 2048-bit key, one encrypted histogram, the
/// frame the agent would send. Sizes are exact, so they are computed rather than benchmarked.
fn report_sizes() -> Result<String> {
    use penrose_core::counters::{Catalogue, CounterId};
    use penrose_core::fingerprint::SnippetHash;
    use penrose_core::histogram::SampleCount;
    use penrose_core::paillier::{BIN_COUNT, Keypair};
    use penrose_core::wire::{Day, Message, PackedBytes, Report, ReportId};

    let mut rng = rand::rng();
    let keys = Keypair::generate(&mut rng);
    let packed = keys
        .public_key()
        .encrypt_packed(&[1u32; BIN_COUNT], &mut rng)?;
    let ciphertext_bytes = packed.to_bytes().len();
    let report = Report {
        key_id: keys.public_key().key_id(),
        report_id: ReportId([0; 16]),
        snippet: SnippetHash([0; 32]),
        locator: penrose_core::fingerprint::Locator([0; penrose_core::fingerprint::LOCATOR_BANDS]),
        arch: penrose_core::gpu::GpuArch::new(9, 0),
        counter: CounterId(0),
        catalogue: Catalogue::current().version,
        day: Day(0),
        samples: SampleCount(BIN_COUNT as u32),
        ciphertexts: PackedBytes::new(packed.to_bytes(), packed.ciphertexts().len())?,
        token: None,
        evidence: None,
    };
    let frame = Message::Report(report).to_frame()?;
    Ok(format!(
        "Report size (computed, 2048-bit key): {} bytes per report frame, of which {} are the \
         {} packed ciphertexts; target <= 2 KB (paper: 32 KB per histogram).",
        frame.len(),
        ciphertext_bytes,
        packed.ciphertexts().len()
    ))
}

fn seconds(ns: f64) -> String {
    if ns >= 1e9 {
        format!("{:.2} s", ns / 1e9)
    } else if ns >= 1e6 {
        format!("{:.2} ms", ns / 1e6)
    } else if ns >= 1e3 {
        format!("{:.2} µs", ns / 1e3)
    } else {
        format!("{ns:.0} ns")
    }
}

fn table(rows: &[Row]) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "| benchmark | median | 95% CI of median | throughput | target | met |"
    );
    let _ = writeln!(s, "|---|---|---|---|---|---|");
    for r in rows {
        let _ = writeln!(
            s,
            "| {} | {} | {} - {} | {} | {} | {} |",
            r.id,
            seconds(r.median_ns),
            seconds(r.low_ns),
            seconds(r.high_ns),
            r.per_second
                .map(|p| format!("{p:.0} /s"))
                .unwrap_or_default(),
            r.target.as_deref().unwrap_or(""),
            match r.met {
                Some(true) => "yes",
                Some(false) => "NO",
                None => "",
            }
        );
    }
    s
}

fn report(root: &Path, rows: &[Row], machine: &str, sizes: &str) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "# Benchmarks\n");
    let _ = writeln!(
        s,
        "Written by `cargo xtask bench` from criterion's estimates (medians, with criterion's \
         95% confidence interval of the median). These machines are noisy: compare ratios and \
         medians, not single runs. Throughput is elements per second at the median, on one \
         core (criterion runs one benchmark at a time).\n"
    );
    let _ = writeln!(s, "Machine: {machine}\n");
    s.push_str(&table(rows));
    let _ = writeln!(s, "\n{sizes}");
    // Capture is measured by `cargo xtask bench-capture` (root, eBPF), kept in its own file.
    if let Ok(capture) = std::fs::read_to_string(root.join("docs/benchmarks-capture.md")) {
        let _ = writeln!(s, "\n{capture}");
    }
    // The aggregation server end to end: `cargo xtask bench-ingest --out
    // docs/benchmarks-ingest.md` (processes and QUIC, not criterion), also its own file.
    if let Ok(ingest) = std::fs::read_to_string(root.join("docs/benchmarks-ingest.md")) {
        let _ = writeln!(s, "\n## Aggregation server end to end\n\n{ingest}");
    }
    // Placement and the writer at fleet scale (issue 15): `cargo xtask bench-fleet` and
    // `cargo xtask bench-ingest --fleet-apps`, with their reading, kept in their own file.
    if let Ok(fleet) = std::fs::read_to_string(root.join("docs/benchmarks-fleet.md")) {
        let _ = writeln!(s, "\n{fleet}");
    }
    let notes = root.join("docs/benchmarks-notes.md");
    if let Ok(extra) = std::fs::read_to_string(&notes) {
        let _ = writeln!(s, "\n{extra}");
    }
    // The Tor route (issue 12): `cargo xtask bench-tor` (as root, a private Tor network) and
    // figures measured by hand (binary size, build time), kept in its own file.
    if let Ok(tor) = std::fs::read_to_string(root.join("docs/benchmarks-tor.md")) {
        let _ = writeln!(s, "\n{tor}");
    }
    s
}
