//! The transport that carries Penrose reports from agents to the aggregation server: QUIC
//! (quinn) with TLS 1.3 (rustls, ring provider) and ALPN [`ALPN`] (docs/design.md section 5).
//!
//! One bidirectional stream carries one report: the client writes one frame of
//! [`penrose_core::wire`] and finishes its side; the server checks the announced length before
//! it allocates, reads the body under a deadline, hands it to a [`ReportHandler`], and answers
//! with one ack frame. The handler decides what the ack says; the transport only refuses
//! frames it cannot read (too large, cut short, too slow), with a zero report id.
//!
//! - [`server`]: [`serve`] an endpoint with [`Limits`] against slow or abusive peers.
//! - [`client`]: a [`Client`] shared by many tasks, with retries and backoff; by default a
//!   fresh connection from a fresh UDP socket per report, so that uploads are unlinkable.
//! - [`identity`]: the server's certificate and key, and how the client trusts them.
//! - [`limits`]: the per-endpoint, per-source and per-connection bounds (per source: the
//!   private `sources` table).
//! - [`carrier`]: the same QUIC carried on byte streams (Tor carries nothing else): the
//!   client's [`carrier::Dialer`] and the server's stream port.
//! - [`exchange`]: a request/answer endpoint on the same settings, with an ALPN of its own
//!   (the token issuer's, the release auditor's), and [`exchange::Offloaded`], which computes
//!   a synchronous service's answers off the async threads.
//! - [`error`]: what can go wrong, typed.
//! - `socket`: the server's UDP socket, its receive buffer and the drops the kernel counts.

pub mod carrier;
pub mod client;
pub mod error;
pub mod exchange;
mod frame;
pub mod identity;
pub mod limits;
pub mod server;
mod socket;
mod sources;
mod tls;

pub use client::{Client, ClientConfig, RetryPolicy, Reuse, Route};
pub use error::{ClientError, IdentityError, TransportError};
pub use identity::{Encoding, Identity, Trust, load_certificates};
pub use limits::Limits;
pub use server::{Origin, ReportHandler, Server, ServerConfig, ServerStats, StatsHandle, serve};

/// The only application protocol an endpoint speaks; a peer that offers anything else fails
/// the handshake. The version in it changes only with an incompatible change of framing.
pub const ALPN: &[u8] = b"penrose/1";

/// The report id an ack carries when the transport refused a frame before anyone read its
/// report id (too large, cut short, or sent too slowly).
pub const UNREAD_REPORT_ID: penrose_core::wire::ReportId = penrose_core::wire::ReportId([0; 16]);
