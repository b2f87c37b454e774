//! `penrose-design`: the design server's command line.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use penrose_core::paillier::Keypair;
use penrose_core::release::{ReportsPerContributor, Threshold};
use penrose_design::archive::{self, Archive, Imported};
use penrose_design::keyfile;
use penrose_design::report;
use penrose_design::simulate::cli::SimulateArgs;

/// The Penrose design server: holds the private key, and decrypts only released sums that
/// enough contributors are behind.
///
/// The flow: `keygen` once; give public.key to the aggregation server and the agents; `import`
/// each bundle the aggregation server exports (`penrose-aggregator export`), in order; `report`.
///
/// Exit codes: 0 success, 1 error, 2 usage, 3 a bundle was refused (bad signature, another
/// server, malformed, a fork, a gap, an unannounced new chain).
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
    /// Import export bundles from the aggregation server into the archive, in chain order.
    ///
    /// Each bundle's ed25519 signature is checked against the aggregation server's key: pass
    /// its `.pub` file (printed by `penrose-aggregator serve`, next to its signing key) with
    /// --signer at the first import, which pins it; later imports are checked against the
    /// pinned key. Bundles form a chain per aggregator store: bundle n+1 is accepted only
    /// after bundle n, and must name its hash. A fork (same number, other bytes), a gap, or a
    /// bundle of another chain is refused and changes nothing; importing the same bundle again
    /// is harmless. An aggregation server restored from a backup starts a new chain: import its
    /// first bundle with --new-chain (epochs the old chain released are then skipped, never
    /// merged twice). Example:
    ///   penrose-design import --archive /var/lib/penrose-design --signer agg.pub 1.bundle 2.bundle
    Import {
        /// The archive directory.
        #[arg(long)]
        archive: PathBuf,
        /// The aggregation server's public signing key (64 hex digits).
        #[arg(long)]
        signer: Option<PathBuf>,
        /// Accept the first bundle of a new chain descending from the one followed (a restore).
        #[arg(long)]
        new_chain: bool,
        /// Bundle files.
        #[arg(required = true)]
        bundles: Vec<PathBuf>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Decrypt the released sums above the contributor threshold and print them.
    ///
    /// Per class and counter: reports, samples, the contributor bound, mean and percentiles
    /// at bin resolution, and (with --json or --csv) the 128 bin sums. A released sum is
    /// decrypted only when at least --threshold contributors are behind it, counted as
    /// reports / (T x days of its epoch) rounded up, T = --reports-per-contributor; others are
    /// listed as held back. A sum whose bins do not add up to the samples its reports declared
    /// is quarantined (listed, not added); the rest still decrypt. Example:
    ///   penrose-design report --archive /var/lib/penrose-design --key keys/private.key
    Report {
        /// The archive directory.
        #[arg(long)]
        archive: PathBuf,
        /// The private key (mode 0600).
        #[arg(long)]
        key: PathBuf,
        /// k: the fewest contributors a sum must have to be decrypted (at least 10).
        #[arg(long, default_value_t = Threshold::DEFAULT.get())]
        threshold: u64,
        /// T: the most reports one agent sends per counter and day (at least 24).
        #[arg(long, default_value_t = ReportsPerContributor::DEFAULT.get())]
        reports_per_contributor: u32,
        /// Print JSON (every bin).
        #[arg(long, conflicts_with = "csv")]
        json: bool,
        /// Print CSV: one row per non-empty bin.
        #[arg(long)]
        csv: bool,
    },
    // Its help is `SimulateArgs`'s documentation; boxed, it keeps `Command` small.
    Simulate(Box<SimulateArgs>),
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
            let refused = e
                .downcast_ref::<archive::ArchiveError>()
                .is_some_and(archive::ArchiveError::is_refusal);
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
            new_chain,
            bundles,
            json,
        } => import(&archive, signer.as_deref(), new_chain, &bundles, json)?,
        Command::Report {
            archive,
            key,
            threshold,
            reports_per_contributor,
            json,
            csv,
        } => {
            let threshold = Threshold::new(threshold)?;
            let cap = ReportsPerContributor::for_servers(reports_per_contributor)?;
            print_report(&archive, &key, threshold, cap, json, csv)?
        }
        Command::Simulate(args) => penrose_design::simulate::cli::main(&args)?,
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

fn import(
    dir: &Path,
    signer: Option<&Path>,
    new_chain: bool,
    bundles: &[PathBuf],
    json: bool,
) -> Result<()> {
    let archive = Archive::open(dir)?;
    let signer = signer.map(archive::read_signer).transpose()?;
    let mut results = Vec::new();
    for path in bundles {
        let outcome = archive.import(path, signer.as_ref(), new_chain)?;
        match &outcome {
            Imported::New {
                instance,
                seq,
                epochs,
                entries,
                skipped_epochs,
            } => {
                tracing::info!(
                    "{}: imported bundle {seq} of chain {instance}: {epochs} epochs, {entries} sums",
                    path.display()
                );
                if !skipped_epochs.is_empty() {
                    tracing::warn!(
                        "{}: epochs {skipped_epochs:?} were already released by an earlier chain \
                         and are skipped",
                        path.display()
                    );
                }
            }
            Imported::AlreadyImported { instance, seq } => tracing::info!(
                "{}: bundle {seq} of chain {instance} was already imported (same bytes)",
                path.display()
            ),
        }
        results.push(serde_json::json!({"bundle": path, "outcome": outcome}));
    }
    let merged = archive.merged()?;
    let chains: Vec<serde_json::Value> = merged
        .chains
        .iter()
        .map(|(i, seq)| serde_json::json!({"instance": i.to_string(), "bundles": seq}))
        .collect();
    if json {
        let doc = serde_json::json!({
            "imports": results,
            "bundles": merged.bundles,
            "epochs": merged.epochs.len(),
            "sums": merged.entries.len(),
            "chains": chains,
            "skipped_epochs": merged.skipped.len(),
        });
        println!("{doc}");
    } else {
        println!(
            "archive {}: {} bundles in {} chain(s), {} epochs, {} released sums",
            dir.display(),
            merged.bundles,
            merged.chains.len(),
            merged.epochs.len(),
            merged.entries.len(),
        );
    }
    Ok(())
}

fn print_report(
    dir: &Path,
    key: &Path,
    threshold: Threshold,
    cap: ReportsPerContributor,
    json: bool,
    csv: bool,
) -> Result<()> {
    let archive = Archive::open(dir)?;
    let merged = archive.merged()?;
    let key = keyfile::read_private_key(key)?;
    let report = report::build(&merged, &key, threshold, cap)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(());
    }
    if csv {
        print!("{}", report::to_csv(&report));
        return Ok(());
    }
    println!(
        "{} bundles, {} epochs; threshold k = {} contributors (T = {} reports per contributor and \
         day); {} (class, counter) aggregates decrypted in {} classes, {} held back, {} sums \
         quarantined; {} sums ({} reports) withheld by the aggregation server under its threshold",
        report.bundles,
        report.epochs,
        threshold.get(),
        cap.get(),
        report.decrypted.len(),
        report.classes(),
        report.held_back.len(),
        report.quarantined.len(),
        report.withheld_sums,
        report.withheld_reports,
    );
    let fmt = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.4}"));
    for c in &report.decrypted {
        println!(
            "class {:>4}  {:<22} {:>6} reports {:>4}+ owners {:>9} samples  mean {:>12}{u}  p50 {:>12}{u}  p90 {:>12}{u}  p99 {:>12}{u}",
            c.class,
            c.name,
            c.reports,
            c.contributors_at_least,
            c.samples,
            fmt(c.mean),
            fmt(c.p50),
            fmt(c.p90),
            fmt(c.p99),
            u = c.unit
        );
        if !c.merged_from.is_empty() {
            let merged: Vec<String> = c.merged_from.iter().map(u32::to_string).collect();
            println!(
                "           (with classes {} that the aggregator merged into it)",
                merged.join(", ")
            );
        }
    }
    for h in &report.held_back {
        println!(
            "class {:>4}  counter {:>3}: {} reports, at least {} contributors: under the threshold, not decrypted",
            h.class, h.counter, h.reports, h.contributors_at_least
        );
    }
    for q in &report.quarantined {
        println!(
            "class {:>4}  counter {:>3}  epoch {} generation {}: QUARANTINED ({} reports): {}",
            q.class, q.counter, q.epoch, q.generation, q.reports, q.reason
        );
    }
    for (chain, epoch) in &report.skipped_epochs {
        println!("epoch {epoch} of chain {chain}: skipped, an earlier chain released it");
    }
    Ok(())
}
