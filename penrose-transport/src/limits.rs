//! Bounds that keep one slow or abusive peer from taking the server's memory, tasks or time.
//!
//! Each limit maps onto a mechanism that enforces it without the peer's help:
//! - address validation: a connection attempt from an address QUIC has not validated is
//!   answered with a stateless Retry ([`Limits::require_address_validation`]); only a peer
//!   that receives at its address and comes back with the Retry token gets any further, so a
//!   flood of Initial packets (spoofed or not) takes no slot and no state;
//! - per source (an IPv4 address or an IPv6 /64), after validation: at most
//!   [`Limits::max_connections_per_source`] open at once and
//!   [`Limits::new_connections_per_source_per_second`] new ones; beyond either the attempt is
//!   refused (QUIC `CONNECTION_REFUSED`) before a slot is taken;
//! - connections: over [`Limits::max_connections`] a new connection is refused during the
//!   handshake (QUIC `CONNECTION_REFUSED`);
//! - handshakes: a handshake not complete within [`Limits::handshake_timeout`] is abandoned
//!   and its slot given back, so half-open connections do not wait for the idle timeout;
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
//! - idle connections are closed after [`Limits::idle_timeout`];
//! - bursts: the UDP socket asks the kernel for a receive buffer of
//!   [`Limits::udp_receive_buffer`] bytes, so that a burst of datagrams (the top of the hour,
//!   many agents at once) waits in the buffer instead of being dropped and sent again.

use std::num::NonZeroU32;
use std::time::Duration;

/// Server-side limits. [`Limits::default`] suits a fleet of agents that each upload a few
/// reports a minute, each over its own connection (many of them behind one NAT address), and a
/// load generator that sends thousands per second over a few dozen connections.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Connections open at once, handshakes included.
    pub max_connections: usize,
    /// Answer every connection attempt from an address QUIC has not validated with a Retry
    /// (RFC 9000, section 8.1.2), so that nothing is kept for it until it comes back with the
    /// token. The Retry token is good for that one connection attempt only (it names the
    /// address, port and original connection id, expires after 15 s, and the client never
    /// stores it), so it links nothing. Off only for tests that need the old behaviour as a
    /// control.
    pub require_address_validation: bool,
    /// Connections one source (IPv4 address, IPv6 /64) may have open at once.
    pub max_connections_per_source: usize,
    /// New connections one source may open per second (also its burst); `None` for no limit.
    pub new_connections_per_source_per_second: Option<NonZeroU32>,
    /// Time from the first packet of a validated connection attempt to the end of its
    /// handshake; a slower handshake is abandoned and its slot given back.
    pub handshake_timeout: Duration,
    /// Report streams open at once on one connection.
    pub max_concurrent_streams: u32,
    /// Time for a whole frame (prefix, body and end of stream) to arrive once its stream is
    /// opened.
    pub stream_read_timeout: Duration,
    /// A connection with no traffic for this long is closed.
    pub idle_timeout: Duration,
    /// New streams per connection per second (also the burst allowed); `None` for no limit.
    pub reports_per_second: Option<NonZeroU32>,
    /// How long [`crate::Server::shutdown`] lets reports in flight finish before it closes
    /// the connections.
    pub shutdown_grace: Duration,
    /// Bytes of UDP receive buffer asked of the kernel (`SO_RCVBUF`). Linux grants at most
    /// `net.core.rmem_max`; the server logs a warning when it got less than it asked, and
    /// reports what it got ([`crate::ServerStats::udp_receive_buffer`]).
    pub udp_receive_buffer: usize,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_connections: 10_000,
            require_address_validation: true,
            max_connections_per_source: 512,
            new_connections_per_source_per_second: NonZeroU32::new(500),
            handshake_timeout: Duration::from_secs(5),
            max_concurrent_streams: 64,
            stream_read_timeout: Duration::from_secs(5),
            idle_timeout: Duration::from_secs(30),
            reports_per_second: NonZeroU32::new(5_000),
            shutdown_grace: Duration::from_secs(5),
            // The kernel's default (208 KiB on most hosts) dropped one datagram in eight
            // under the load generator's bursts (docs/benchmarks.md).
            udp_receive_buffer: 8 << 20,
        }
    }
}
