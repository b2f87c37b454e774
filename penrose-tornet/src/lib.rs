//! Test equipment: a private Tor network on loopback, so that the Tor path (arti-client
//! streams through an exit, docs/design.md section 5) is tested against real tor relays, in CI
//! too, without ever touching the public Tor network.
//!
//! [`TorNetwork::start`] creates, in a directory of the caller's, the keys of 3 directory
//! authorities (`tor-gencert`) and of every relay (`tor --list-fingerprint`), writes their
//! torrc files and starts 7 `tor` processes on 127.0.0.1: the 3 authorities (also guards and
//! middles), 2 middle relays (also guards) and 2 exits, with `TestingTorNetwork 1` and a short
//! voting interval. [`TorNetwork::wait_ready`] waits until the authorities serve a consensus
//! listing them all with their flags, and their microdescriptors; [`TorNetwork::arti_toml`]
//! is the arti-client configuration that uses this network and nothing else;
//! [`TorNetwork::exit_finder`] tells a test server on 127.0.0.1 which exit, if any, made a
//! connection it accepted. Dropping the network stops every tor by its process id.
//!
//! The safety rule: everything here refuses to start unless the process is in a network
//! namespace that has only loopback ([`check_loopback_only`]); [`enter_loopback_namespace`]
//! makes one, first thing in `main`.
//!
//! It is never a dependency of the product crates.
//!
//! - [`namespace`]: the loopback-only network namespace, entered and checked.
//! - [`network`]: keys, torrc files, processes; starting, stopping, restarting.
//! - [`consensus`]: what the authorities serve, and whether a client can use it yet.
//! - [`exits`]: which exit made a connection a server accepted.
//! - `arti`: [`TorNetwork::arti_toml`].
//! - [`error`]: what can go wrong, as typed errors.

#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used))]

mod arti;
pub mod consensus;
pub mod error;
pub mod exits;
pub mod namespace;
pub mod network;
mod torrc;

pub use consensus::Readiness;
pub use error::TorNetError;
pub use exits::{ExitFinder, Holder, connections_to};
pub use namespace::{check_loopback_only, enter_loopback_namespace};
pub use network::{Relay, TorNetwork, TorNetworkOptions};
pub use torrc::Role;

/// Whether `tor` and `tor-gencert` can be run here (tests say SKIPPED without them).
#[must_use]
pub fn tor_installed() -> bool {
    let runs = |program: &str, arg: &str| {
        std::process::Command::new(program)
            .arg(arg)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok()
    };
    runs("tor", "--version") && runs("tor-gencert", "--help")
}
