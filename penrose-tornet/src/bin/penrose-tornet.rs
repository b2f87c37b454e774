//! `penrose-tornet up`: a private Tor network on loopback for people and the demo (test
//! equipment). It prints the arti configuration and the relays once the network is
//! usable, and stops every tor it started on SIGINT or SIGTERM.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand};
use penrose_tornet::{Role, TorNetError, TorNetwork, TorNetworkOptions};
use tokio::signal::unix::{SignalKind, signal};

/// A private Tor network on loopback (test equipment; never for real traffic).
///
/// Runs 3 directory authorities, 2 middle relays and 2 exits (Debian's `tor`) on 127.0.0.1,
/// inside a network namespace that has only loopback: if this process is not in one already,
/// it makes one (needs root), so clients must join it, e.g.
/// `nsenter --net=/proc/PID/ns/net COMMAND` with the PID it prints.
///
/// Exit status: 0 after a clean stop on SIGINT/SIGTERM; 1 when the network cannot start, does
/// not become ready in time, or a tor exits; 2 for a usage error.
///
/// Example: `penrose-tornet up --dir /tmp/tornet --json`
#[derive(Debug, Parser)]
#[command(name = "penrose-tornet", version)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Start the network, print how to use it (arti TOML, relays) once ready, run until SIGINT/SIGTERM.
    Up {
        /// Directory for the nodes' keys, torrc files, state and logs (created if missing).
        #[arg(long)]
        dir: PathBuf,
        /// Print one JSON object (arti TOML, relays with their pids) instead of text.
        #[arg(long)]
        json: bool,
        /// First of 14 consecutive ports on 127.0.0.1 (default: a free block is probed).
        #[arg(long)]
        base_port: Option<u16>,
        /// Seconds between consensuses.
        #[arg(long, default_value_t = 10)]
        voting_interval: u64,
        /// Seconds to wait for the network to become usable.
        #[arg(long, default_value_t = 300)]
        ready_timeout: u64,
    },
}

/// What `--json` prints.
#[derive(serde::Serialize)]
struct Summary<'a> {
    /// This process: its network namespace is `/proc/PID/ns/net`.
    pid: u32,
    dir: &'a std::path::Path,
    ready_after_s: f64,
    arti_toml: String,
    relays: Vec<RelaySummary<'a>>,
}

#[derive(serde::Serialize)]
struct RelaySummary<'a> {
    nickname: &'a str,
    role: Role,
    or_port: u16,
    dir_port: u16,
    fingerprint: &'a str,
    pid: Option<u32>,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let Cmd::Up {
        dir,
        json,
        base_port,
        voting_interval,
        ready_timeout,
    } = cli.command;
    // Still single-threaded: the runtime starts after this.
    if penrose_tornet::check_loopback_only().is_err()
        && let Err(e) = penrose_tornet::enter_loopback_namespace()
    {
        eprintln!("penrose-tornet: {e}");
        return ExitCode::FAILURE;
    }
    let mut options =
        TorNetworkOptions::new(dir).voting_interval(Duration::from_secs(voting_interval));
    if let Some(base) = base_port {
        options = options.base_port(base);
    }
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("penrose-tornet: cannot start a runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(up(options, json, Duration::from_secs(ready_timeout))) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("penrose-tornet: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Why `up` ended without a clean stop.
#[derive(Debug, thiserror::Error)]
enum UpError {
    #[error(transparent)]
    Net(#[from] TorNetError),
    #[error("cannot listen for signals: {0}")]
    Signals(std::io::Error),
    #[error("cannot print the summary: {0}")]
    Json(serde_json::Error),
}

/// Starts the network, reports it once ready, runs until a signal, stops it.
async fn up(options: TorNetworkOptions, json: bool, timeout: Duration) -> Result<(), UpError> {
    // Handlers, not a blocked mask: the tors we spawn would inherit a blocked mask.
    let mut interrupt = signal(SignalKind::interrupt()).map_err(UpError::Signals)?;
    let mut terminate = signal(SignalKind::terminate()).map_err(UpError::Signals)?;
    let started = Instant::now();
    let mut network = TorNetwork::start(options)?;
    eprintln!(
        "penrose-tornet: started 7 tors under {} (pid {}), waiting for a consensus",
        network.dir().display(),
        std::process::id()
    );
    loop {
        let state = network.check_ready()?;
        if state.is_ready() {
            break;
        }
        if started.elapsed() > timeout {
            network.stop()?;
            return Err(TorNetError::NotReady {
                waited: started.elapsed(),
                state,
            }
            .into());
        }
        let stop = tokio::select! {
            _ = interrupt.recv() => true,
            _ = terminate.recv() => true,
            () = tokio::time::sleep(Duration::from_millis(500)) => false,
        };
        if stop {
            network.stop()?;
            eprintln!("penrose-tornet: stopped every tor before the network was ready");
            return Ok(());
        }
    }
    let ready_after = started.elapsed();
    print_summary(&network, ready_after, json)?;
    loop {
        tokio::select! {
            _ = interrupt.recv() => break,
            _ = terminate.recv() => break,
            () = tokio::time::sleep(Duration::from_secs(1)) => {
                if let Err(e) = network.check_running() {
                    network.stop()?;
                    return Err(e.into());
                }
            }
        }
    }
    network.stop()?;
    eprintln!("penrose-tornet: stopped every tor");
    Ok(())
}

/// Prints how to use the network.
fn print_summary(network: &TorNetwork, ready_after: Duration, json: bool) -> Result<(), UpError> {
    let pid = std::process::id();
    if json {
        let summary = Summary {
            pid,
            dir: network.dir(),
            ready_after_s: ready_after.as_secs_f64(),
            arti_toml: network.arti_toml(),
            relays: network
                .relays()
                .iter()
                .map(|r| RelaySummary {
                    nickname: r.nickname(),
                    role: r.role(),
                    or_port: r.or_port(),
                    dir_port: r.dir_port(),
                    fingerprint: r.fingerprint(),
                    pid: r.pid(),
                })
                .collect(),
        };
        let text = serde_json::to_string_pretty(&summary).map_err(UpError::Json)?;
        println!("{text}");
    } else {
        println!("# ready after {:.1} s", ready_after.as_secs_f64());
        println!("# network namespace: /proc/{pid}/ns/net (nsenter --net=/proc/{pid}/ns/net ...)");
        let exits: Vec<String> = network
            .relays()
            .iter()
            .filter(|r| r.role() == Role::Exit)
            .map(|r| format!("{} (pid {})", r.nickname(), r.pid().unwrap_or_default()))
            .collect();
        // Exit connections to loopback come from 127.0.0.1 like any other; their owner
        // process tells them apart (penrose_tornet::ExitFinder).
        println!("# exits: {}", exits.join(", "));
        print!("{}", network.arti_toml());
    }
    Ok(())
}
