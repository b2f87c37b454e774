//! Bounds that keep one slow or abusive peer from taking the server's memory, tasks or time.
//!
//! Each limit maps onto a mechanism that enforces it without the peer's help:
//! - connections: over [`Limits::max_connections`] a new connection is refused during the
//!   handshake (QUIC `CONNECTION_REFUSED`);
//! - concurrent streams: QUIC stream credit ([`Limits::max_concurrent_streams`]); a client
//!   cannot open more, it waits for one to finish;
//! - memory per stream: the receive window holds one frame, and the length prefix is checked
//!   against [`penrose_core::wire::MAX_FRAME_BODY`] before the body is allocated;
//! - time per stream: the whole frame must arrive within [`Limits::stream_read_timeout`], or
//!   the stream is reset (a slowloris peer trickling bytes loses its stream, nobody else
//!   notices);
//! - rate: at most [`Limits::reports_per_second`] new streams per connection per second; the
//!   server stops taking streams from a connection that goes faster, and flow control makes
//!   the peer wait;
//! - idle connections are closed after [`Limits::idle_timeout`].

use std::num::NonZeroU32;
use std::time::Duration;

/// Server-side limits. [`Limits::default`] suits a fleet of agents that each upload a few
/// reports a minute over one connection, and a load generator that sends thousands per second
/// over a few dozen.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Connections open at once, handshakes included.
    pub max_connections: usize,
    /// Report streams open at once on one connection.
    pub max_concurrent_streams: u32,
    /// Time for a whole frame (prefix, body and end of stream) to arrive once its stream is
    /// opened.
    pub stream_read_timeout: Duration,
    /// A connection with no traffic for this long is closed. It also bounds the handshake.
    pub idle_timeout: Duration,
    /// New streams per connection per second (also the burst allowed); `None` for no limit.
    pub reports_per_second: Option<NonZeroU32>,
    /// How long [`crate::Server::shutdown`] lets reports in flight finish before it closes
    /// the connections.
    pub shutdown_grace: Duration,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_connections: 10_000,
            max_concurrent_streams: 64,
            stream_read_timeout: Duration::from_secs(5),
            idle_timeout: Duration::from_secs(30),
            reports_per_second: NonZeroU32::new(5_000),
            shutdown_grace: Duration::from_secs(5),
        }
    }
}
