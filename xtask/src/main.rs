//! `cargo xtask`: the project's automation, in Rust so it runs wherever cargo does.

use clap::{Parser, Subcommand};

mod bench;
mod bench_capture;
mod bench_fleet;
mod bench_ingest;
mod bench_tor;
mod build_ebpf;
mod demo;
mod dist;
mod eval;
mod eval_exactness;

/// Project automation for Penrose.
#[derive(Parser)]
#[command(version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Rebuild the committed eBPF object with the BPF toolchain (docs/design.md section 8).
    BuildEbpf(build_ebpf::Args),
    /// Measure how well fingerprints identify applications on a folder of traces.
    EvalFingerprints(eval::Args),
    /// Measure how exact a released histogram is against every launch of the real traces,
    /// sampled with the agent's sampler across the hosts of a release.
    EvalExactness(eval_exactness::Args),
    /// Run the criterion benchmarks and write docs/benchmarks.md.
    Bench(bench::Args),
    /// Measure what capture costs (as root) and write docs/benchmarks-capture.md.
    BenchCapture(bench_capture::Args),
    /// Measure the aggregation server end to end under the load generator (A/B with
    /// `--binary LABEL=PATH` twice).
    BenchIngest(bench_ingest::Args),
    /// Measure class placement and the writer as the number of classes grows (1,000 to
    /// 100,000), every report a fresh fingerprint, against the old 2-bit banding.
    BenchFleet(bench_fleet::Args),
    /// Measure the Tor route on a private Tor network (as root, in a loopback-only network
    /// namespace): bootstrap, isolated streams, reports over Tor against direct, the agent's
    /// memory.
    BenchTor(bench_tor::Args),
    /// Run the system end to end on this machine.
    Demo(demo::Args),
    /// Build the Debian packages of the three product binaries (man pages, completions and
    /// the agent's conffile generated from the code; docs/operations.md).
    Dist(dist::Args),
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    // The safety rule (docs/design.md section 5): bench-tor and demo --tor run tor and arti,
    // so they leave the host's network first thing, while the process still has one thread (a
    // network namespace belongs to a thread; everything started afterwards inherits it).
    if matches!(cli.command, Command::BenchTor(_)) {
        bench_tor::enter_loopback_namespace()?;
    }
    if let Command::Demo(args) = &cli.command
        && args.tor
    {
        demo::enter_tor_namespace()?;
    }
    match cli.command {
        Command::BuildEbpf(args) => build_ebpf::run(args),
        Command::EvalFingerprints(args) => eval::run(args),
        Command::EvalExactness(args) => eval_exactness::run(args),
        Command::Bench(args) => bench::run(args),
        Command::BenchCapture(args) => bench_capture::run(args),
        Command::BenchIngest(args) => bench_ingest::run(args),
        Command::BenchFleet(args) => bench_fleet::run(args),
        Command::BenchTor(args) => bench_tor::run(args),
        Command::Demo(args) => demo::run(args),
        Command::Dist(args) => dist::run(args),
    }
}
