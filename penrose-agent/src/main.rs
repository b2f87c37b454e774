//! `penrose-agent`: the agent's command line.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use penrose_core::counters::Catalogue;
use penrose_core::fingerprint::{FingerprintParams, Fingerprinter};

/// The Penrose agent: watches kernel launches on this machine's GPUs, fingerprints and samples
/// them, and ships only encrypted histograms.
///
/// The capture daemon arrives with the capture issue; today the agent can show, offline, the
/// fingerprints it would compute and the counters it would sample.
///
/// Exit codes: 0 success, 1 error, 2 usage.
#[derive(Parser)]
#[command(version, about, long_about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Fingerprint a PyTorch profiler trace offline, as the agent would fingerprint the same
    /// launches captured live.
    ///
    /// Each process's launch sequence (or each stream's, with --per-stream) is cut into
    /// windows of L launches; each window's snippet hash is printed with its similarity to the
    /// sequence's first window. Example:
    ///   penrose-agent fingerprint ../shared/traces/hta-trace_diff--control--control.json.gz
    Fingerprint {
        /// A `.json` or `.json.gz` trace.
        trace: PathBuf,
        /// Launches per window (L).
        #[arg(long, default_value_t = 10_000)]
        window: usize,
        /// One sequence per CUDA stream instead of per process.
        #[arg(long)]
        per_stream: bool,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// List the counters the agent samples, their units and binning.
    Catalogue {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    match run(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(1)
        }
    }
}

fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Fingerprint {
            trace,
            window,
            per_stream,
            json,
        } => fingerprint(&trace, window, per_stream, json),
        Command::Catalogue { json } => catalogue(json),
    }
}

fn fingerprint(path: &Path, window: usize, per_stream: bool, json: bool) -> Result<()> {
    anyhow::ensure!(window > 0, "--window must be at least 1");
    let trace = penrose_traces::read_trace(path)?;
    let fingerprinter = Fingerprinter::new(FingerprintParams::default())?;
    let sequences: Vec<(String, Vec<&str>)> = if per_stream {
        trace
            .stream_sequences()
            .into_iter()
            .map(|((pid, stream), ks)| {
                let label = format!("pid {} stream {}", pid.0, stream.0);
                (label, ks.iter().map(|k| &*k.name).collect())
            })
            .collect()
    } else {
        trace
            .process_sequences()
            .into_iter()
            .map(|(pid, ks)| {
                (
                    format!("pid {}", pid.0),
                    ks.iter().map(|k| &*k.name).collect(),
                )
            })
            .collect()
    };
    let mut out = Vec::new();
    for (label, names) in &sequences {
        let mut first = None;
        for (index, chunk) in names.chunks(window).enumerate() {
            let hash = fingerprinter.snippet_hash(chunk);
            let first = *first.get_or_insert(hash);
            out.push(serde_json::json!({
                "sequence": label,
                "window": index,
                "launches": chunk.len(),
                "snippet_hash": hex(&hash.0),
                "similarity_to_first": fingerprinter.similarity(&first, &hash),
            }));
        }
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }
    let params = fingerprinter.params();
    println!(
        "{}: {} kernels; {}-grams, k = {}, {:?} MinHash, tau = {}",
        path.display(),
        trace.kernels().len(),
        params.ngram_len,
        params.num_hashes,
        params.weighting,
        params.tau
    );
    for row in &out {
        println!(
            "{:<24} window {:>3} ({:>5} launches)  {}  sim to first {:.2}",
            row["sequence"].as_str().unwrap_or_default(),
            row["window"],
            row["launches"],
            row["snippet_hash"].as_str().unwrap_or_default(),
            row["similarity_to_first"].as_f64().unwrap_or_default()
        );
    }
    Ok(())
}

fn catalogue(json: bool) -> Result<()> {
    let catalogue = Catalogue::current();
    if json {
        let counters: Vec<_> = catalogue
            .counters
            .iter()
            .map(|c| {
                serde_json::json!({
                    "id": c.id.0, "name": c.name, "unit": c.unit.suffix(),
                    "group": c.group.0, "binning": format!("{:?}", c.binning),
                    "description": c.description,
                })
            })
            .collect();
        let doc = serde_json::json!({"version": catalogue.version.0, "counters": counters});
        println!(
            "{}",
            serde_json::to_string_pretty(&doc).context("encoding JSON")?
        );
        return Ok(());
    }
    println!("counter catalogue version {}", catalogue.version.0);
    for c in catalogue.counters {
        println!(
            "{:>3}  {:<22} group {}  {:<4} {:?}\n     {}",
            c.id.0,
            c.name,
            c.group.0,
            c.unit.suffix(),
            c.binning,
            c.description
        );
    }
    Ok(())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
