//! What can go wrong, as one typed error for the crate.

use std::io;
use std::path::PathBuf;
use std::process::ExitStatus;
use std::time::Duration;

use crate::consensus::Readiness;

/// Why the private Tor network could not be set up, started, checked or stopped.
#[derive(Debug, thiserror::Error)]
pub enum TorNetError {
    /// The safety rule: this thread's network namespace has more than loopback, so a tor or
    /// arti started here could reach other machines.
    #[error(
        "refusing to run Tor outside a loopback-only network namespace: interfaces {interfaces:?} \
         (call penrose_tornet::enter_loopback_namespace first thing in main, as root)"
    )]
    NotIsolated {
        /// The interfaces this thread's namespace lists.
        interfaces: Vec<String>,
    },
    /// The namespace has only `lo`, but it is down: nothing could connect, not even locally.
    #[error("lo is down in this network namespace (bring it up: enter_loopback_namespace does)")]
    LoopbackDown,
    /// A namespace is per thread; entering one while other threads run would leave them out.
    #[error(
        "the process has {threads} threads; enter the namespace while it has one (first thing \
         in main, before a runtime starts)"
    )]
    NotSingleThreaded {
        /// Threads counted in `/proc/self/status`.
        threads: usize,
    },
    /// A system call of entering the namespace failed (`EPERM` without root).
    #[error("could not {step}: {source}")]
    Namespace {
        /// What was being done.
        step: &'static str,
        /// The system's error.
        source: io::Error,
    },
    /// A file or directory of the network could not be read or written.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The system's error.
        source: io::Error,
    },
    /// `tor` or `tor-gencert` could not be run (Debian: `apt-get install tor`).
    #[error("cannot run {} (is the tor package installed?): {source}", program.display())]
    ToolMissing {
        /// The program.
        program: PathBuf,
        /// The system's error.
        source: io::Error,
    },
    /// A key-generation run of `tor` or `tor-gencert` failed.
    #[error("{what} failed ({status}): {output}")]
    ToolFailed {
        /// The command, in words.
        what: String,
        /// How it exited.
        status: ExitStatus,
        /// The end of what it printed.
        output: String,
    },
    /// No block of free ports on 127.0.0.1 was found.
    #[error("no block of {count} free ports on 127.0.0.1 found in {tries} tries")]
    NoFreePorts {
        /// Ports needed, consecutive.
        count: u16,
        /// Blocks probed.
        tries: u32,
    },
    /// A tor process of the network exited while it should be running.
    #[error("tor {nickname} exited ({status}); the end of {}:\n{tail}", log.display())]
    Exited {
        /// The relay's nickname.
        nickname: String,
        /// How it exited.
        status: ExitStatus,
        /// Its log file.
        log: PathBuf,
        /// The last lines of its log.
        tail: String,
    },
    /// The network did not become usable in time.
    #[error("the Tor network was not ready after {waited:?}: {state}")]
    NotReady {
        /// How long [`crate::TorNetwork::wait_ready`] waited.
        waited: Duration,
        /// What the last check saw.
        state: Readiness,
    },
    /// A tor process could not be stopped (it survived SIGKILL, or waiting for it failed).
    #[error("could not stop tor {nickname} (pid {pid}): {source}")]
    Stop {
        /// The relay's nickname.
        nickname: String,
        /// Its process id.
        pid: u32,
        /// The system's error.
        source: io::Error,
    },
    /// A file or answer of tor's was not what this crate expects.
    #[error("unexpected {what}: {detail}")]
    Parse {
        /// What was read.
        what: String,
        /// What was wrong with it.
        detail: String,
    },
}
