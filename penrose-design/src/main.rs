//! `penrose-design`: the design server's command line.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use penrose_core::paillier::Keypair;
use penrose_design::archive::{self, Archive, Imported};
use penrose_design::keyfile;
use penrose_design::report::{self, DEFAULT_THRESHOLD, Threshold};

/// The Penrose design server: holds the private key, and decrypts only aggregates that enough
/// reports contributed to.
///
/// The flow: `keygen` once; give public.key to the aggregation server and the agents; `import`
/// each bundle the aggregation server exports (`penrose-aggregator export`); `report`.
///
/// Exit codes: 0 success, 1 error, 2 usage, 3 a bundle was refused (bad signature, another
/// server, malformed).
#[derive(Parser)]
#[command(version, about, long_about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Generate a 2048-bit Paillier key pair.
    ///
    /// Writes DIR/private.key (mode 0600; keep it on this server only) and DIR/public.key (give
    /// it to the aggregation server and ship it with the agents). Existing keys are never
    /// overwritten. Prints the key id that every report will carry. Example:
    ///   penrose-design keygen --out /etc/penrose/keys
    Keygen {
        /// Directory to write the two key files into (created if missing).
        #[arg(long)]
        out: PathBuf,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Import export bundles from the aggregation server into the archive.
    ///
    /// Each bundle's ed25519 signature is checked against the aggregation server's key: pass
    /// its `.pub` file (printed by `penrose-aggregator serve`, next to its signing key) with
    /// --signer at the first import, which pins it; later imports are checked against the
    /// pinned key. A refused bundle changes nothing. Importing a bundle twice is harmless.
    /// Example:
    ///   penrose-design import --archive /var/lib/penrose-design --signer agg.pub b1.bundle
    Import {
        /// The archive directory.
        #[arg(long)]
        archive: PathBuf,
        /// The aggregation server's public signing key (64 hex digits).
        #[arg(long)]
        signer: Option<PathBuf>,
        /// Bundle files.
        #[arg(required = true)]
        bundles: Vec<PathBuf>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Decrypt the archive's aggregates above the contributor threshold and print them.
    ///
    /// Per class and counter: reports, samples, mean and percentiles at bin resolution, and
    /// (with --json or --csv) the 128 bin sums. An aggregate with fewer than --threshold
    /// reports is not decrypted; it is listed as held back. Example:
    ///   penrose-design report --archive /var/lib/penrose-design --key keys/private.key
    Report {
        /// The archive directory.
        #[arg(long)]
        archive: PathBuf,
        /// The private key (mode 0600).
        #[arg(long)]
        key: PathBuf,
        /// k: the fewest reports an aggregate must hold to be decrypted.
        #[arg(long, default_value_t = DEFAULT_THRESHOLD.0)]
        threshold: u64,
        /// Print JSON (every bin).
        #[arg(long, conflicts_with = "csv")]
        json: bool,
        /// Print CSV: one row per non-empty bin.
        #[arg(long)]
        csv: bool,
    },
    /// Show a key file's id and size; a private key file is also checked for its permissions.
    KeyInfo {
        /// A private.key or public.key file.
        file: PathBuf,
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
            let refused = e.downcast_ref::<archive::ArchiveError>().is_some_and(|a| {
                matches!(
                    a,
                    archive::ArchiveError::Bundle { .. }
                        | archive::ArchiveError::OtherSigner { .. }
                )
            });
            ExitCode::from(if refused { 3 } else { 1 })
        }
    }
}

fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Keygen { out, json } => {
            std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
            tracing::info!("generating a 2048-bit key pair");
            let keys = Keypair::generate(&mut rand::rng());
            let (private, public) = keyfile::write_keypair(&out, &keys)?;
            let id = keys.public_key().key_id();
            if json {
                let doc = serde_json::json!({
                    "key_id": id.to_string(), "private": private, "public": public,
                });
                println!("{doc}");
            } else {
                println!("key id {id}");
                println!("private key: {} (mode 0600)", private.display());
                println!("public key:  {}", public.display());
            }
        }
        Command::Import {
            archive,
            signer,
            bundles,
            json,
        } => import(&archive, signer.as_deref(), &bundles, json)?,
        Command::Report {
            archive,
            key,
            threshold,
            json,
            csv,
        } => print_report(&archive, &key, Threshold(threshold), json, csv)?,
        Command::KeyInfo { file, json } => {
            // Either kind of file; a private key is only read through the permission check.
            let (kind, key) = match keyfile::read_public_key(&file) {
                Ok(public) => ("public", public),
                Err(keyfile::KeyFileError::Invalid { .. }) => (
                    "private",
                    keyfile::read_private_key(&file)?.public_key().clone(),
                ),
                Err(e) => return Err(e.into()),
            };
            let bits = key.size().modulus_bits();
            if json {
                let doc = serde_json::json!({
                    "kind": kind, "key_id": key.key_id().to_string(), "modulus_bits": bits,
                });
                println!("{doc}");
            } else {
                println!("{kind} key, {bits}-bit modulus, key id {}", key.key_id());
            }
        }
    }
    Ok(())
}

fn import(dir: &Path, signer: Option<&Path>, bundles: &[PathBuf], json: bool) -> Result<()> {
    let archive = Archive::open(dir)?;
    let signer = signer.map(archive::read_signer).transpose()?;
    let mut results = Vec::new();
    for path in bundles {
        let outcome = archive.import(path, signer.as_ref())?;
        match outcome {
            Imported::New { cursor, entries } => tracing::info!(
                "{}: imported, cursor {cursor}, {entries} accumulators",
                path.display()
            ),
            Imported::AlreadyImported { cursor } => {
                tracing::info!("{}: cursor {cursor} was already imported", path.display())
            }
        }
        results.push(serde_json::json!({"bundle": path, "outcome": outcome}));
    }
    let merged = archive.merged()?;
    if json {
        let doc = serde_json::json!({
            "imports": results,
            "bundles": merged.bundles,
            "accumulators": merged.entries.len(),
            "cursor": merged.cursor.0,
        });
        println!("{doc}");
    } else {
        println!(
            "archive {}: {} bundles, {} accumulators, up to cursor {}",
            dir.display(),
            merged.bundles,
            merged.entries.len(),
            merged.cursor.0
        );
    }
    Ok(())
}

fn print_report(dir: &Path, key: &Path, threshold: Threshold, json: bool, csv: bool) -> Result<()> {
    let archive = Archive::open(dir)?;
    let merged = archive.merged()?;
    let key = keyfile::read_private_key(key)?;
    let report = report::build(&merged, &key, threshold).context("decrypting the aggregates")?;
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(());
    }
    if csv {
        print!("{}", report::to_csv(&report));
        return Ok(());
    }
    println!(
        "{} bundles; threshold k = {} reports; {} (class, counter) aggregates decrypted in {} classes, {} held back",
        report.bundles,
        threshold.0,
        report.decrypted.len(),
        report.classes(),
        report.held_back.len()
    );
    let fmt = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.4}"));
    for c in &report.decrypted {
        println!(
            "class {:>4}  {:<22} {:>6} reports {:>9} samples  mean {:>12}{u}  p50 {:>12}{u}  p90 {:>12}{u}  p99 {:>12}{u}",
            c.class,
            c.name,
            c.reports,
            c.samples,
            fmt(c.mean),
            fmt(c.p50),
            fmt(c.p90),
            fmt(c.p99),
            u = c.unit
        );
    }
    for h in &report.held_back {
        println!(
            "class {:>4}  counter {:>3}: {} reports, under the threshold: not decrypted",
            h.class, h.counter, h.reports
        );
    }
    Ok(())
}
