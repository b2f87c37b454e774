//! The agent's anonymous route to the Penrose servers: QUIC over Tor with arti
//! (docs/design.md section 5, docs/tor.md).
//!
//! Tor carries TCP streams only, so each QUIC connection runs on a Tor stream of its own
//! ([`penrose_transport::carrier`]), and each Tor stream is opened in an isolation group of its
//! own, so arti builds it a circuit of its own: two reports of one agent leave by unrelated
//! paths, and the server sees only exit relays.
//!
//! - [`network`]: which Tor network, and the one place the public network may be named.
//! - [`route`]: the Tor client, bootstrapped on demand with its state in the agent's state
//!   directory, and the [`TorDialer`] the transport opens its streams with.
//! - [`error`]: what can go wrong, typed.

pub mod error;
pub mod network;
pub mod route;

pub use error::TorError;
pub use network::TorNetwork;
pub use route::{StreamRecord, Tor, TorDialer};
