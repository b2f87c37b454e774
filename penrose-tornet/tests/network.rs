//! Starts the private Tor network for real, checks its consensus, stops it and checks that
//! every tor is gone. `harness = false`: it enters a loopback-only network namespace first
//! thing, while the process is single-threaded (libtest would have started threads).

use std::path::Path;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use penrose_tornet::consensus::parse_microdesc_consensus;
use penrose_tornet::{Role, TorNetwork, TorNetworkOptions};

/// Generous for a CI machine of two cores (it takes well under a minute here).
const READY_TIMEOUT: Duration = Duration::from_secs(240);

fn main() -> ExitCode {
    // `cargo test -- --list` (and friends) asks what tests exist; say there is one.
    if std::env::args().any(|a| a == "--list") {
        println!("network: test");
        return ExitCode::SUCCESS;
    }
    if !penrose_tornet::tor_installed() {
        penrose_host::skip::skipped(format_args!(
            "SKIPPED: tor and tor-gencert are not installed (Debian: apt-get install tor)"
        ));
        return ExitCode::SUCCESS;
    }
    if let Err(e) = penrose_tornet::enter_loopback_namespace() {
        if is_permission(&e) {
            penrose_host::skip::skipped(format_args!(
                "SKIPPED: a network namespace needs root here: {e}"
            ));
            return ExitCode::SUCCESS;
        }
        eprintln!("network: cannot enter a loopback-only namespace: {e}");
        return ExitCode::FAILURE;
    }
    match run() {
        Ok(()) => {
            println!("test network ... ok");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("test network ... FAILED: {e}");
            ExitCode::FAILURE
        }
    }
}

fn is_permission(e: &penrose_tornet::TorNetError) -> bool {
    matches!(e, penrose_tornet::TorNetError::Namespace { source, .. }
        if source.kind() == std::io::ErrorKind::PermissionDenied)
}

fn run() -> Result<(), String> {
    let dir = tempfile::tempdir().map_err(|e| format!("tempdir: {e}"))?;
    let started = Instant::now();
    let mut network =
        TorNetwork::start(TorNetworkOptions::new(dir.path())).map_err(|e| e.to_string())?;
    let pids = network.pids();
    if pids.len() != 7 {
        return Err(format!("expected 7 tors, got pids {pids:?}"));
    }
    let state = network
        .wait_ready(READY_TIMEOUT)
        .map_err(|e| format!("{e}\n{}", logs(&network)))?;
    eprintln!(
        "network: ready after {:.1} s: {state}",
        started.elapsed().as_secs_f64()
    );
    check_consensus(&network)?;
    check_not_an_exit(&network)?;
    network.stop().map_err(|e| e.to_string())?;
    if !network.pids().is_empty() {
        return Err(format!("still running after stop: {:?}", network.pids()));
    }
    for pid in pids {
        if Path::new(&format!("/proc/{pid}")).exists() {
            return Err(format!("tor pid {pid} is still there after stop"));
        }
    }
    Ok(())
}

/// Reads an authority's own consensus file and checks every relay's flags in it.
fn check_consensus(network: &TorNetwork) -> Result<(), String> {
    let auth = network
        .relays()
        .iter()
        .find(|r| r.role() == Role::Authority)
        .ok_or("no authority")?;
    let path = auth.dir().join("cached-microdesc-consensus");
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let entries = parse_microdesc_consensus(&text).map_err(|e| e.to_string())?;
    if entries.len() != 7 {
        return Err(format!("{} entries in the consensus", entries.len()));
    }
    for relay in network.relays() {
        let entry = entries
            .iter()
            .find(|e| e.nickname == relay.nickname())
            .ok_or_else(|| format!("{} is not in the consensus", relay.nickname()))?;
        let want_guard = relay.role() != Role::Exit;
        let ok = entry.has("Running")
            && entry.has("Valid")
            && entry.has("Guard") == want_guard
            && entry.has("Exit") == (relay.role() == Role::Exit)
            && entry.or_port == relay.or_port()
            && entry.microdesc.is_some();
        if !ok {
            return Err(format!("{}: {entry:?}", relay.nickname()));
        }
    }
    Ok(())
}

/// The end of every tor's log, for a failure message.
fn logs(network: &TorNetwork) -> String {
    network
        .relays()
        .iter()
        .map(|r| {
            let text = std::fs::read_to_string(r.log()).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            format!(
                "--- {} ---\n{}",
                r.nickname(),
                lines[lines.len().saturating_sub(8)..].join("\n")
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// A connection the test makes itself is not attributed to an exit (arti's streams through
/// the exits are checked where arti is a dependency).
fn check_not_an_exit(network: &TorNetwork) -> Result<(), String> {
    let finder = network.exit_finder();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    let _client = std::net::TcpStream::connect(addr).map_err(|e| e.to_string())?;
    let (_conn, peer) = listener.accept().map_err(|e| e.to_string())?;
    match finder.exit_of(peer, addr) {
        Ok(None) => Ok(()),
        other => Err(format!(
            "our own connection from {peer} attributed: {other:?}"
        )),
    }
}
