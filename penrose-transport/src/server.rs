//! The ingest endpoint: accepts connections and report streams within [`Limits`], reads each
//! frame safely, and answers with the ack its [`ReportHandler`] returns.
//!
//! A connection attempt goes through, in order: address validation (an unvalidated address
//! gets a stateless Retry and nothing else), the per-source limits ([`crate::sources`]), the
//! global connection limit, and a handshake under [`Limits::handshake_timeout`]. Each refusal
//! is counted in [`ServerStats`]; none of them costs the server more than the packet that
//! answers it.

use std::future::Future;
use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use penrose_core::wire::{Ack, AckStatus, Message, RejectReason, ThrottleHint};
use quinn::{Connection, Incoming, RecvStream, SendStream};
use tokio::sync::{Semaphore, watch};
use tokio::task::{JoinHandle, JoinSet};
use tracing::{debug, info, warn};

use crate::carrier::{CarrierLookup, CarrierStats, StreamIntake};
use crate::error::TransportError;
use crate::frame::{self, FrameRead};
use crate::identity::Identity;
use crate::limits::Limits;
use crate::sources::{Refusal, Sources};
use crate::{ALPN, UNREAD_REPORT_ID};

/// QUIC application error codes this server closes connections and resets streams with.
pub mod codes {
    use quinn::VarInt;

    /// Normal close: the server is shutting down.
    pub const SHUTDOWN: VarInt = VarInt::from_u32(0);
    /// The peer did not negotiate ALPN `penrose/1`.
    pub const WRONG_ALPN: VarInt = VarInt::from_u32(1);
    /// The frame did not arrive within the per-stream read timeout.
    pub const READ_TIMEOUT: VarInt = VarInt::from_u32(2);
    /// The server stopped reading a stream whose frame it refused.
    pub const REFUSED: VarInt = VarInt::from_u32(3);
    /// The stream failed on the server's side.
    pub const INTERNAL: VarInt = VarInt::from_u32(4);
}

/// What the ingest does with each frame body the transport has read. The aggregator's
/// implementation validates, deduplicates and stores the report; the transport only
/// guarantees the body is at most [`penrose_core::wire::MAX_FRAME_BODY`] bytes and arrived
/// whole, in time, on a stream of its own.
pub trait ReportHandler: Send + Sync + 'static {
    /// One frame body (length already checked). Returns the ack; it must say Accepted only
    /// once the report is durable.
    fn handle(&self, body: Vec<u8>) -> impl Future<Output = Ack> + Send;

    /// A frame body that is a request, not a report ([`Message::KeyListRequest`]), answered
    /// with a whole frame instead of an ack; `None` (the default) hands every body to
    /// [`ReportHandler::handle`].
    fn answer(&self, body: &[u8]) -> Option<Vec<u8>> {
        let _ = body;
        None
    }

    /// Told, just before [`ReportHandler::handle`], where the body came from. The default
    /// ignores it, and the aggregator leaves it so: it never sees peer addresses. Tests use it
    /// to check that an agent's uploads arrive from different ports on different connections.
    fn arrived_from(&self, origin: Origin) {
        let _ = origin;
    }

    /// The throttle hint on acks the transport writes itself (frames it refused before the
    /// handler saw them), so those carry the server's current rate too.
    fn throttle(&self) -> ThrottleHint {
        ThrottleHint::FULL_RATE
    }
}

/// Where a frame body came from, as the transport saw it ([`ReportHandler::arrived_from`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Origin {
    /// The peer's UDP address (source address and port) when its stream was accepted.
    pub remote: SocketAddr,
    /// The connection, numbered by this server from 1 in the order connections were
    /// accepted; meaningful within one server only.
    pub connection: u64,
    /// For a connection carried on a stream ([`ServerConfig::stream_listen`]), the stream's
    /// TCP peer: over Tor, the exit relay, never the agent. `None` for plain QUIC over UDP.
    pub carrier: Option<SocketAddr>,
}

/// Where to listen, as whom, within which limits.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// The UDP address to bind; port 0 picks a free one ([`Server::local_addr`] tells which).
    pub listen: SocketAddr,
    /// The certificate and key the server proves itself with.
    pub identity: Identity,
    /// Bounds against slow or abusive peers.
    pub limits: Limits,
    /// A TCP address whose streams carry QUIC connections too ([`crate::carrier`]): where Tor
    /// exits deliver agents' reports. `None` for UDP only.
    pub stream_listen: Option<SocketAddr>,
}

/// Counters since the server started, for metrics and tests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ServerStats {
    /// Connections that completed the handshake with ALPN `penrose/1`.
    pub connections_accepted: u64,
    /// Connections refused because [`Limits::max_connections`] were open.
    pub connections_refused: u64,
    /// Connection attempts from unvalidated addresses answered with a Retry (each costs the
    /// server one packet and no state).
    pub retries_sent: u64,
    /// Connections refused because their source had [`Limits::max_connections_per_source`]
    /// open.
    pub refused_source_open: u64,
    /// Connections refused because their source opened connections faster than
    /// [`Limits::new_connections_per_source_per_second`].
    pub refused_source_rate: u64,
    /// Handshakes abandoned after [`Limits::handshake_timeout`].
    pub handshake_timeouts: u64,
    /// Handshakes that failed (bad TLS, wrong ALPN, the peer gave up).
    pub handshakes_failed: u64,
    /// Connections open now.
    pub connections_open: u64,
    /// Report streams accepted.
    pub streams: u64,
    /// Frame bodies handed to the handler.
    pub frames_handled: u64,
    /// Frames refused as too large from their length prefix alone.
    pub frames_too_large: u64,
    /// Frames cut short or followed by extra bytes.
    pub frames_malformed: u64,
    /// Streams reset because the frame did not arrive in time.
    pub read_timeouts: u64,
    /// Streams that failed otherwise (reset by the peer, connection lost).
    pub stream_errors: u64,
    /// Times a connection was made to wait because it opened streams faster than
    /// [`Limits::reports_per_second`].
    pub streams_paced: u64,
    /// Acks written and finished (the peer may still lose them with its connection).
    pub acks_sent: u64,
    /// Bytes of UDP receive buffer the kernel granted ([`Limits::udp_receive_buffer`] asks);
    /// below the ask, bursts are dropped at the socket before QUIC sees them.
    pub udp_receive_buffer: u64,
    /// Datagrams the kernel dropped at the UDP socket since it was bound (a full receive
    /// buffer): each is sent again by its peer, late. Zero where the system does not say.
    pub udp_drops: u64,
    /// The stream port's own counters (all zero without [`ServerConfig::stream_listen`]);
    /// connections it carried are counted above too.
    pub carrier: CarrierStats,
}

#[derive(Default)]
pub(crate) struct Counters {
    pub(crate) connections_accepted: AtomicU64,
    pub(crate) connections_refused: AtomicU64,
    pub(crate) retries_sent: AtomicU64,
    pub(crate) refused_source_open: AtomicU64,
    pub(crate) refused_source_rate: AtomicU64,
    pub(crate) handshake_timeouts: AtomicU64,
    pub(crate) handshakes_failed: AtomicU64,
    pub(crate) connections_open: AtomicU64,
    pub(crate) streams: AtomicU64,
    pub(crate) frames_handled: AtomicU64,
    pub(crate) frames_too_large: AtomicU64,
    pub(crate) frames_malformed: AtomicU64,
    pub(crate) read_timeouts: AtomicU64,
    pub(crate) stream_errors: AtomicU64,
    pub(crate) streams_paced: AtomicU64,
    pub(crate) acks_sent: AtomicU64,
    pub(crate) udp_receive_buffer: AtomicU64,
    /// The UDP socket's inode, 0 if unknown (`crate::socket::drops`).
    pub(crate) udp_inode: AtomicU64,
}

pub(crate) fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

impl Counters {
    fn snapshot(&self, carrier: Option<&CarrierLookup>) -> ServerStats {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        ServerStats {
            connections_accepted: get(&self.connections_accepted),
            connections_refused: get(&self.connections_refused),
            retries_sent: get(&self.retries_sent),
            refused_source_open: get(&self.refused_source_open),
            refused_source_rate: get(&self.refused_source_rate),
            handshake_timeouts: get(&self.handshake_timeouts),
            handshakes_failed: get(&self.handshakes_failed),
            connections_open: get(&self.connections_open),
            streams: get(&self.streams),
            frames_handled: get(&self.frames_handled),
            frames_too_large: get(&self.frames_too_large),
            frames_malformed: get(&self.frames_malformed),
            read_timeouts: get(&self.read_timeouts),
            stream_errors: get(&self.stream_errors),
            streams_paced: get(&self.streams_paced),
            acks_sent: get(&self.acks_sent),
            udp_receive_buffer: get(&self.udp_receive_buffer),
            udp_drops: match get(&self.udp_inode) {
                0 => 0,
                inode => crate::socket::drops(inode).unwrap_or(0),
            },
            carrier: carrier.map(CarrierLookup::stats).unwrap_or_default(),
        }
    }
}

/// What an endpoint does with each accepted stream, and the one ALPN it speaks: the report
/// endpoint ([`serve`]) and the request/answer endpoint ([`crate::exchange`]) share everything
/// else (address validation, per-source limits, connection slots, handshake timeout, pacing).
pub(crate) trait Service: Send + Sync + 'static {
    /// The only ALPN the endpoint accepts.
    fn alpn(&self) -> &'static [u8];

    /// Reads one stream's request and writes its answer.
    fn stream(
        shared: Arc<Shared<Self>>,
        send: SendStream,
        recv: RecvStream,
        origin: Origin,
    ) -> impl Future<Output = ()> + Send
    where
        Self: Sized;
}

pub(crate) struct Shared<S> {
    pub(crate) service: S,
    pub(crate) limits: Limits,
    pub(crate) counters: Arc<Counters>,
    sources: Sources,
}

/// The report endpoint's service: frames of [`penrose_core::wire`], answered with acks.
struct Reports<H>(Arc<H>);

impl<H: ReportHandler> Service for Reports<H> {
    fn alpn(&self) -> &'static [u8] {
        ALPN
    }

    fn stream(
        shared: Arc<Shared<Self>>,
        send: SendStream,
        recv: RecvStream,
        origin: Origin,
    ) -> impl Future<Output = ()> + Send {
        report_stream(send, recv, origin, shared)
    }
}

/// A handle on a server's counters that outlives borrowing the [`Server`] (for a metrics
/// page served by another task). Cheap to clone.
#[derive(Clone)]
pub struct StatsHandle(Arc<Counters>, Option<CarrierLookup>);

impl StatsHandle {
    /// Counters so far.
    pub fn snapshot(&self) -> ServerStats {
        self.0.snapshot(self.1.as_ref())
    }
}

/// A running endpoint. Dropping it also stops the server (in the background, with the same
/// grace as [`Server::shutdown`]); `shutdown` waits for that to finish.
pub struct Server {
    endpoint: quinn::Endpoint,
    local_addr: SocketAddr,
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
    counters: Arc<Counters>,
    streams: Option<StreamPort>,
}

/// The stream port's endpoint and accept loop, beside the UDP one.
struct StreamPort {
    endpoint: quinn::Endpoint,
    local_addr: SocketAddr,
    task: JoinHandle<()>,
    lookup: CarrierLookup,
}

/// Binds the endpoint and starts accepting connections; must run inside a tokio runtime.
pub async fn serve<H: ReportHandler>(
    config: ServerConfig,
    handler: Arc<H>,
) -> Result<Server, TransportError> {
    start(config, Reports(handler)).await
}

/// Binds an endpoint for `service` and starts accepting connections.
pub(crate) async fn start<S: Service>(
    config: ServerConfig,
    service: S,
) -> Result<Server, TransportError> {
    let quic = crate::tls::server_config(&config.identity, &config.limits, service.alpn())?;
    let bind_error = |source| TransportError::Bind {
        addr: config.listen,
        source,
    };
    let bound =
        crate::socket::bind(config.listen, config.limits.udp_receive_buffer).map_err(bind_error)?;
    let endpoint = quinn::Endpoint::new(
        quinn::EndpointConfig::default(),
        Some(quic.clone()),
        bound.socket,
        Arc::new(quinn::TokioRuntime),
    )
    .map_err(bind_error)?;
    let local_addr = endpoint
        .local_addr()
        .map_err(|source| TransportError::Bind {
            addr: config.listen,
            source,
        })?;
    let counters = Arc::new(Counters::default());
    counters
        .udp_receive_buffer
        .store(bound.granted as u64, Ordering::Relaxed);
    counters
        .udp_inode
        .store(bound.inode.unwrap_or(0), Ordering::Relaxed);
    let shared = Arc::new(Shared {
        service,
        sources: Sources::new(&config.limits),
        limits: config.limits,
        counters: counters.clone(),
    });
    let (stop, stopped) = watch::channel(false);
    let streams = match config.stream_listen {
        None => None,
        Some(listen) => {
            let intake = StreamIntake::bind(
                listen,
                quic,
                shared.limits.max_connections,
                shared.limits.idle_timeout,
            )
            .await
            .map_err(|source| TransportError::Bind {
                addr: listen,
                source,
            })?;
            let lookup = intake.lookup();
            let task = tokio::spawn(accept_loop(
                intake.endpoint.clone(),
                shared.clone(),
                stopped.clone(),
                Some(lookup.clone()),
            ));
            info!(local_addr = %intake.local_addr, "penrose transport listening for QUIC on streams");
            Some(StreamPort {
                endpoint: intake.endpoint,
                local_addr: intake.local_addr,
                task,
                lookup,
            })
        }
    };
    let task = tokio::spawn(accept_loop(endpoint.clone(), shared, stopped, None));
    info!(%local_addr, "penrose transport listening");
    Ok(Server {
        endpoint,
        local_addr,
        stop,
        task,
        counters,
        streams,
    })
}

impl Server {
    /// The address the endpoint is bound to.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The TCP address whose streams carry QUIC ([`ServerConfig::stream_listen`]), if any.
    pub fn stream_addr(&self) -> Option<SocketAddr> {
        self.streams.as_ref().map(|port| port.local_addr)
    }

    /// Counters so far.
    pub fn stats(&self) -> ServerStats {
        self.counters
            .snapshot(self.streams.as_ref().map(|port| &port.lookup))
    }

    /// A handle that reads the counters from elsewhere.
    pub fn stats_handle(&self) -> StatsHandle {
        StatsHandle(
            self.counters.clone(),
            self.streams.as_ref().map(|port| port.lookup.clone()),
        )
    }

    /// Stops taking connections and streams, lets the reports in flight be handled and acked
    /// (for at most [`Limits::shutdown_grace`]), then closes every connection. Clients see
    /// the close and retry elsewhere or later; a report whose ack did not go out is simply
    /// sent again, and the handler's deduplication counts it once.
    pub async fn shutdown(self) {
        let _ = self.stop.send(true);
        if let Err(e) = self.task.await {
            warn!(error = %e, "accept loop ended abnormally");
        }
        if let Some(port) = self.streams {
            if let Err(e) = port.task.await {
                warn!(error = %e, "stream accept loop ended abnormally");
            }
            let _ = tokio::time::timeout(Duration::from_secs(1), port.endpoint.wait_idle()).await;
        }
        let _ = tokio::time::timeout(Duration::from_secs(1), self.endpoint.wait_idle()).await;
    }
}

/// Accepts connections on one endpoint. `carriers` is set for the stream port's endpoint:
/// its peers' addresses were proven by their TCP handshakes (so no Retry), and each
/// connection's origin names the stream's TCP peer.
async fn accept_loop<S: Service>(
    endpoint: quinn::Endpoint,
    shared: Arc<Shared<S>>,
    mut stop: watch::Receiver<bool>,
    carriers: Option<CarrierLookup>,
) {
    let slots = Arc::new(Semaphore::new(shared.limits.max_connections));
    let mut connections = JoinSet::new();
    loop {
        let incoming = tokio::select! {
            incoming = endpoint.accept() => match incoming {
                Some(incoming) => incoming,
                None => break,
            },
            _ = stop.changed() => break,
        };
        while connections.try_join_next().is_some() {}
        let remote = incoming.remote_address();
        let carrier = carriers.as_ref().and_then(|c| c.carrier_of(remote));
        if carriers.is_none()
            && shared.limits.require_address_validation
            && !incoming.remote_address_validated()
        {
            // Stateless: the Retry carries everything the server needs to recognise the
            // attempt when it comes back, so a flood of Initials (spoofed sources included)
            // costs one small packet each and holds nothing.
            match incoming.retry() {
                Ok(()) => bump(&shared.counters.retries_sent),
                // Only possible for an attempt that was already retried (and is then
                // validated); drop it without an answer.
                Err(e) => e.into_incoming().ignore(),
            }
            continue;
        }
        let source = match shared.sources.admit(remote.ip(), Instant::now()) {
            Ok(source) => source,
            Err(refusal) => {
                let counter = match refusal {
                    Refusal::Open => &shared.counters.refused_source_open,
                    Refusal::Rate => &shared.counters.refused_source_rate,
                };
                bump(counter);
                debug!(%remote, ?refusal, "connection refused: per-source limit");
                incoming.refuse();
                continue;
            }
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            bump(&shared.counters.connections_refused);
            debug!(%remote, "connection refused: at the connection limit");
            incoming.refuse();
            continue;
        };
        let shared = shared.clone();
        let stop = stop.clone();
        connections.spawn(async move {
            connection(incoming, shared, stop, carrier).await;
            drop(slot);
            drop(source);
        });
    }
    let drained = tokio::time::timeout(shared.limits.shutdown_grace, async {
        while connections.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        warn!("shutdown grace over; abandoning reports still in flight");
        connections.abort_all();
    }
    endpoint.close(codes::SHUTDOWN, b"server shutting down");
}

/// Decrements the open-connection gauge however the connection task ends.
struct OpenGuard(Arc<Counters>);

impl Drop for OpenGuard {
    fn drop(&mut self) {
        self.0.connections_open.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Serves one accepted connection attempt: the handshake, then its streams until the peer
/// ends it or the server stops (then it is closed once its streams are done).
async fn connection<S: Service>(
    incoming: Incoming,
    shared: Arc<Shared<S>>,
    mut stop: watch::Receiver<bool>,
    carrier: Option<SocketAddr>,
) {
    let remote = incoming.remote_address();
    let Some(conn) = handshake(incoming, &shared, remote).await else {
        return;
    };
    let number = shared
        .counters
        .connections_accepted
        .fetch_add(1, Ordering::Relaxed)
        + 1;
    shared
        .counters
        .connections_open
        .fetch_add(1, Ordering::Relaxed);
    let _open = OpenGuard(shared.counters.clone());
    debug!(%remote, "connection accepted");
    let ended = streams(&conn, &shared, &mut stop, remote, number, carrier).await;
    if ended == Ended::Stopping {
        conn.close(codes::SHUTDOWN, b"server shutting down");
    }
}

/// The handshake of an accepted attempt, within the handshake timeout and with the
/// service's ALPN; `None` (counted, and the connection closed) when it fails.
async fn handshake<S: Service>(
    incoming: Incoming,
    shared: &Shared<S>,
    remote: SocketAddr,
) -> Option<Connection> {
    let connecting = match incoming.accept() {
        Ok(connecting) => connecting,
        Err(e) => {
            bump(&shared.counters.handshakes_failed);
            debug!(%remote, error = %e, "handshake failed");
            return None;
        }
    };
    // Dropping an unfinished `Connecting` closes the connection at once.
    let conn = match tokio::time::timeout(shared.limits.handshake_timeout, connecting).await {
        Ok(Ok(conn)) => conn,
        Ok(Err(e)) => {
            bump(&shared.counters.handshakes_failed);
            debug!(%remote, error = %e, "handshake failed");
            return None;
        }
        Err(_) => {
            bump(&shared.counters.handshake_timeouts);
            debug!(%remote, "handshake not complete within {:?}; abandoned", shared.limits.handshake_timeout);
            return None;
        }
    };
    if negotiated_alpn(&conn).as_deref() != Some(shared.service.alpn()) {
        // rustls already refuses a mismatching offer; this catches a client that offered none.
        bump(&shared.counters.handshakes_failed);
        debug!(%remote, "closing connection without the endpoint's ALPN");
        conn.close(codes::WRONG_ALPN, b"ALPN required");
        return None;
    }
    Some(conn)
}

/// How a connection's stream loop ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ended {
    /// The connection ended (the peer closed it, or it failed or timed out).
    Connection,
    /// The server is stopping: the connection is closed with `SHUTDOWN`.
    Stopping,
}

/// Accepts the streams of connection `number` (first seen from `remote`), each served on its
/// own task, paced when the limits ask; returns once every stream task is done.
async fn streams<S: Service>(
    conn: &Connection,
    shared: &Arc<Shared<S>>,
    stop: &mut watch::Receiver<bool>,
    remote: SocketAddr,
    number: u64,
    carrier: Option<SocketAddr>,
) -> Ended {
    let mut pace = shared.limits.reports_per_second.map(Pace::new);
    let mut streams = JoinSet::new();
    let mut ended = Ended::Connection;
    loop {
        let (send, recv) = tokio::select! {
            accepted = conn.accept_bi() => match accepted {
                Ok(pair) => pair,
                Err(e) => {
                    debug!(%remote, reason = %e, "connection ended");
                    break;
                }
            },
            _ = stop.changed() => {
                ended = Ended::Stopping;
                break;
            }
        };
        while streams.try_join_next().is_some() {}
        bump(&shared.counters.streams);
        let origin = Origin {
            remote: conn.remote_address(),
            connection: number,
            carrier,
        };
        streams.spawn(S::stream(shared.clone(), send, recv, origin));
        if let Some(wait) = pace.as_mut().and_then(Pace::take) {
            bump(&shared.counters.streams_paced);
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = stop.changed() => {
                    ended = Ended::Stopping;
                    break;
                }
            }
        }
    }
    while streams.join_next().await.is_some() {}
    ended
}

fn negotiated_alpn(conn: &Connection) -> Option<Vec<u8>> {
    conn.handshake_data()?
        .downcast::<quinn::crypto::rustls::HandshakeData>()
        .ok()?
        .protocol
}

async fn report_stream<H: ReportHandler>(
    mut send: SendStream,
    mut recv: RecvStream,
    origin: Origin,
    shared: Arc<Shared<Reports<H>>>,
) {
    let handler = &shared.service.0;
    let counters = &shared.counters;
    let deadline = shared.limits.stream_read_timeout;
    let refused = |reason| Ack {
        report_id: UNREAD_REPORT_ID,
        status: AckStatus::Rejected(reason),
        throttle: handler.throttle(),
    };
    let read = frame::read_frame(&mut recv, penrose_core::wire::MAX_FRAME_BODY);
    let ack = match tokio::time::timeout(deadline, read).await {
        Err(_) => {
            bump(&counters.read_timeouts);
            debug!(stream = %recv.id(), "frame not complete within {deadline:?}; resetting");
            let _ = recv.stop(codes::READ_TIMEOUT);
            let _ = send.reset(codes::READ_TIMEOUT);
            return;
        }
        Ok(Err(e)) => {
            bump(&counters.stream_errors);
            debug!(stream = %recv.id(), error = %e, "report stream failed");
            let _ = send.reset(codes::INTERNAL);
            return;
        }
        Ok(Ok(FrameRead::TooLarge(announced))) => {
            bump(&counters.frames_too_large);
            debug!(stream = %recv.id(), announced, "frame too large");
            let _ = recv.stop(codes::REFUSED);
            refused(RejectReason::TooLarge)
        }
        Ok(Ok(FrameRead::Truncated | FrameRead::Trailing)) => {
            bump(&counters.frames_malformed);
            debug!(stream = %recv.id(), "frame cut short or followed by extra bytes");
            let _ = recv.stop(codes::REFUSED);
            refused(RejectReason::Malformed)
        }
        Ok(Ok(FrameRead::Body(body))) => {
            bump(&counters.frames_handled);
            handler.arrived_from(origin);
            if let Some(frame) = handler.answer(&body) {
                write_answer(send, &frame, deadline, counters).await;
                return;
            }
            handler.handle(body).await
        }
    };
    let frame = match Message::Ack(ack).to_frame() {
        Ok(frame) => frame,
        Err(e) => {
            // An ack is a fixed 24 bytes; this cannot happen, but a stream is no reason to panic.
            warn!(error = %e, "cannot encode an ack");
            let _ = send.reset(codes::INTERNAL);
            return;
        }
    };
    write_answer(send, &frame, deadline, counters).await;
}

/// Writes an answer on a stream, finishes it and waits (within `deadline`) until the peer has
/// it, so that a shutdown does not close the connection under it.
pub(crate) async fn write_answer(
    mut send: SendStream,
    answer: &[u8],
    deadline: Duration,
    counters: &Counters,
) {
    let written = tokio::time::timeout(deadline, async {
        send.write_all(answer).await?;
        send.finish()?;
        bump(&counters.acks_sent);
        // Wait until the peer has the ack, so a shutdown does not close the connection under it.
        match send.stopped().await {
            Ok(_) => Ok::<_, Box<dyn std::error::Error + Send + Sync>>(()),
            // A client closes its connection with DONE once it has read its acks, possibly
            // before its acknowledgement of the last ack bytes left: that ack was delivered.
            Err(quinn::StoppedError::ConnectionLost(
                quinn::ConnectionError::ApplicationClosed(close),
            )) if close.error_code == crate::client::codes::DONE => Ok(()),
            Err(e) => Err(e.into()),
        }
    })
    .await;
    match written {
        Ok(Ok(())) => {}
        Ok(Err(e)) => {
            bump(&counters.stream_errors);
            debug!(error = %e, "ack not delivered");
        }
        Err(_) => {
            bump(&counters.stream_errors);
            debug!("ack not acknowledged within {deadline:?}");
        }
    }
}

/// A token bucket of new streams per connection: `rate` per second, bursts of up to `rate`.
struct Pace {
    rate: f64,
    tokens: f64,
    last: Instant,
}

impl Pace {
    fn new(rate: NonZeroU32) -> Pace {
        let rate = f64::from(rate.get());
        Pace {
            rate,
            tokens: rate,
            last: Instant::now(),
        }
    }

    /// Takes one token; returns how long to wait first if the bucket is in debt.
    fn take(&mut self) -> Option<Duration> {
        let now = Instant::now();
        let elapsed = now.duration_since(self.last).as_secs_f64();
        self.last = now;
        self.tokens = (self.tokens + elapsed * self.rate).min(self.rate) - 1.0;
        (self.tokens < 0.0).then(|| Duration::from_secs_f64(-self.tokens / self.rate))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pace_allows_a_burst_then_spaces_streams() {
        let mut pace = Pace::new(NonZeroU32::new(10).unwrap());
        for _ in 0..10 {
            assert_eq!(pace.take(), None);
        }
        let wait = pace
            .take()
            .expect("the eleventh stream in a burst of ten waits");
        assert!(wait > Duration::from_millis(50) && wait <= Duration::from_millis(100));
    }
}
