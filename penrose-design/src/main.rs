//! `penrose-design`: the design server's command line.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use penrose_core::paillier::Keypair;
use penrose_design::keyfile;

/// The Penrose design server: holds the private key, and decrypts only aggregates that enough
/// reports contributed to.
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
            ExitCode::from(1)
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
