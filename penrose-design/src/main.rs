//! (being written)
use clap::Parser;

/// Penrose.
#[derive(Parser)]
#[command(version, about)]
struct Cli {}

fn main() -> anyhow::Result<()> {
    let _ = Cli::parse();
    Ok(())
}
