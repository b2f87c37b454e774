//! `penrose-design`: parses the command line (its definition is `penrose_design::cli`) and runs
//! it.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::Parser;
use penrose_core::paillier::Keypair;
use penrose_core::release::{ReportsPerContributor, Threshold};
use penrose_design::archive::{self, Archive, Imported};
use penrose_design::cli::{Cli, Command};
use penrose_design::keyfile;
use penrose_design::report;

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
    println!("{}", report.admission_line());
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
