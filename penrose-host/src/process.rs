//! What every binary does when it starts and stops: logs on stderr (filtered by `RUST_LOG`),
//! one ready line on stdout for whoever started a server (scripts, tests, systemd units), and
//! the signals that stop or reload it, handled from before the ready line on, so that a
//! signal sent as soon as a server says it listens is never fatal by default.

use std::io::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};

use serde::{Deserialize, Serialize};
use tokio::signal::unix::{Signal, SignalKind, signal};

/// Sends `tracing` output to stderr, at `default` (`"info"`, `"error"`) unless `RUST_LOG`
/// says otherwise; stdout stays for results and the ready line.
pub fn init_logging(default: &str) {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default)),
        )
        .with_writer(std::io::stderr)
        .init();
}

/// The line every server prints on stdout once it listens: one JSON object, the same shape for
/// the aggregation server, the token issuer and the release auditor, so that a script, a test
/// or a unit reads each server's addresses one way. What only one server says (a signing key,
/// a key set's digest, a release rule) sits beside the shared fields, in `details`, flattened
/// into the same object.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ready<T> {
    /// Which server: `aggregator`, `issuer` or `auditor`.
    pub server: String,
    /// The QUIC address (the port the system chose for `:0`).
    pub listening: SocketAddr,
    /// The stream port's TCP address, when the server has one.
    #[serde(default)]
    pub stream_listening: Option<SocketAddr>,
    /// The certificate clients pin.
    pub certificate: PathBuf,
    /// The admin socket, when the server has one.
    #[serde(default)]
    pub control: Option<PathBuf>,
    /// The metrics responder's address, when it has one.
    #[serde(default)]
    pub metrics: Option<SocketAddr>,
    /// What only this server says.
    #[serde(flatten)]
    pub details: T,
}

/// Prints a server's ready line: `line` as one JSON object on one line of stdout, flushed, so
/// that a reader waiting for it (a script, a test) gets it at once even through a pipe.
pub fn print_ready<T: Serialize>(line: &Ready<T>) -> std::io::Result<()> {
    let text = serde_json::to_string(line).map_err(std::io::Error::other)?;
    let mut out = std::io::stdout().lock();
    writeln!(out, "{text}")?;
    out.flush()
}

/// The flag SIGINT and SIGTERM set for work that runs without a runtime (the agent's capture
/// and daemon threads poll it), so that interrupted work still seals, spools and prints what
/// it has.
static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_stop_signal(_signal: libc::c_int) {
    // Only an atomic store: async-signal-safe.
    STOP.store(true, Ordering::Relaxed);
}

/// Installs SIGINT and SIGTERM handlers that set one stop flag, and returns it; the sync
/// counterpart of [`Signals`]. SIGHUP, which would otherwise end the process without its
/// summary or final status, is ignored: a process that uses this reads its configuration only
/// at start (every tier handles SIGINT and SIGTERM as a clean stop and never dies of SIGHUP).
#[allow(unsafe_code)]
pub fn stop_on_signals() -> std::io::Result<&'static AtomicBool> {
    for sig in [libc::SIGINT, libc::SIGTERM] {
        let handler = on_stop_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
        // SAFETY: installs a handler that only performs an atomic store.
        if unsafe { libc::signal(sig, handler) } == libc::SIG_ERR {
            return Err(std::io::Error::last_os_error());
        }
    }
    // SAFETY: SIG_IGN installs no code.
    if unsafe { libc::signal(libc::SIGHUP, libc::SIG_IGN) } == libc::SIG_ERR {
        return Err(std::io::Error::last_os_error());
    }
    Ok(&STOP)
}

/// What a signal asks of a server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Request {
    /// SIGTERM or SIGINT: stop cleanly.
    Stop,
    /// SIGHUP: reload what can be reloaded (a server with nothing to reload logs it).
    Reload,
}

/// The stop and reload signals, installed once before a server says it is ready.
#[derive(Debug)]
pub struct Signals {
    term: Signal,
    interrupt: Signal,
    hangup: Signal,
}

impl Signals {
    /// Installs the handlers (inside a tokio runtime). From here on SIGTERM, SIGINT and SIGHUP
    /// no longer end the process by default: [`Signals::next`] reports them.
    pub fn install() -> std::io::Result<Self> {
        Ok(Self {
            term: signal(SignalKind::terminate())?,
            interrupt: signal(SignalKind::interrupt())?,
            hangup: signal(SignalKind::hangup())?,
        })
    }

    /// Waits for the next signal.
    pub async fn next(&mut self) -> Request {
        tokio::select! {
            _ = self.term.recv() => Request::Stop,
            _ = self.interrupt.recv() => Request::Stop,
            _ = self.hangup.recv() => Request::Reload,
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn raise(signal: libc::c_int) {
        #[allow(unsafe_code)]
        // SAFETY: kill(2) on this process with a signal whose handler `Signals` installed.
        let sent = unsafe { libc::kill(libc::getpid(), signal) };
        assert_eq!(sent, 0);
    }

    #[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
    struct Only {
        signer: String,
    }

    #[test]
    fn a_ready_line_is_one_flat_object_that_reads_back() {
        let ready = Ready {
            server: "aggregator".into(),
            listening: "127.0.0.1:4433".parse().unwrap(),
            stream_listening: None,
            certificate: PathBuf::from("data/tls/cert.pem"),
            control: Some(PathBuf::from("data/control.sock")),
            metrics: Some("127.0.0.1:9464".parse().unwrap()),
            details: Only {
                signer: "ab".into(),
            },
        };
        let line = serde_json::to_string(&ready).unwrap();
        let value: serde_json::Value = serde_json::from_str(&line).unwrap();
        // What one server alone says sits beside the shared fields, not under a key of its own.
        assert_eq!(value["signer"], "ab");
        assert_eq!(value["listening"], "127.0.0.1:4433");
        assert!(value.get("details").is_none(), "{line}");
        assert_eq!(serde_json::from_str::<Ready<Only>>(&line).unwrap(), ready);
    }

    #[tokio::test]
    async fn signals_are_told_apart_and_none_ends_the_process() {
        let mut signals = Signals::install().unwrap();
        raise(libc::SIGHUP);
        assert_eq!(signals.next().await, Request::Reload);
        raise(libc::SIGTERM);
        assert_eq!(signals.next().await, Request::Stop);
        raise(libc::SIGINT);
        assert_eq!(signals.next().await, Request::Stop);
    }
}
