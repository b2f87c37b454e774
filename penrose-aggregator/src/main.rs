//! `penrose-aggregator`: the aggregation server's command line.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use penrose_aggregator::validate::validate_frame;
use penrose_core::paillier::PublicKey;
use penrose_core::wire;

/// The Penrose aggregation server: validates encrypted reports and adds them up per
/// application class, without ever holding a private key.
///
/// Exit codes: 0 success, 1 error, 2 usage, 3 some input was rejected.
#[derive(Parser)]
#[command(version, about, long_about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Check report frames saved to files, exactly as the server checks what it receives.
    ///
    /// Each file holds one or more length-delimited frames back to back. Every frame is
    /// decoded and validated against the public key (format version, sizes, key id, counter
    /// catalogue, sample count, ciphertext range and unit check). Example:
    ///   penrose-aggregator check-report --key public.key captured.frames
    CheckReport {
        /// The design server's public key file (`penrose-design keygen` writes it).
        #[arg(long)]
        key: PathBuf,
        /// Files of frames.
        #[arg(required = true)]
        files: Vec<PathBuf>,
        /// Print one JSON object per frame.
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
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(1)
        }
    }
}

fn run(cli: Cli) -> Result<ExitCode> {
    match cli.command {
        Command::CheckReport { key, files, json } => check_reports(&key, &files, json),
    }
}

fn check_reports(key: &Path, files: &[PathBuf], json: bool) -> Result<ExitCode> {
    let bytes = std::fs::read(key).with_context(|| format!("reading {}", key.display()))?;
    let key = PublicKey::from_bytes(&bytes)
        .with_context(|| format!("{} is not a Penrose public key", key.display()))?;
    let mut rejected = 0usize;
    for file in files {
        let data = std::fs::read(file).with_context(|| format!("reading {}", file.display()))?;
        let mut offset = 0;
        let mut index = 0;
        while offset < data.len() {
            let rest = &data[offset..];
            // A frame's extent comes from its prefix; a bad prefix ends the file's frames.
            let len = match wire::body_length(rest) {
                Ok(body) => (wire::LENGTH_PREFIX + body).min(rest.len()),
                Err(_) => rest.len(),
            };
            let verdict = validate_frame(&rest[..len], &key);
            if verdict.is_err() {
                rejected += 1;
            }
            if json {
                let line = match &verdict {
                    Ok(v) => serde_json::json!({
                        "file": file, "frame": index, "offset": offset, "valid": true,
                        "counter": v.report.counter.0, "samples": v.report.samples.0,
                    }),
                    Err(e) => serde_json::json!({
                        "file": file, "frame": index, "offset": offset, "valid": false,
                        "reason": format!("{:?}", e.reason()), "detail": e.to_string(),
                    }),
                };
                println!("{line}");
            } else {
                match &verdict {
                    Ok(v) => println!(
                        "{}#{index}: valid (counter {}, {} samples)",
                        file.display(),
                        v.report.counter.0,
                        v.report.samples.0
                    ),
                    Err(e) => println!(
                        "{}#{index}: rejected ({:?}): {e}",
                        file.display(),
                        e.reason()
                    ),
                }
            }
            offset += len;
            index += 1;
        }
    }
    Ok(if rejected > 0 {
        ExitCode::from(3)
    } else {
        ExitCode::SUCCESS
    })
}
