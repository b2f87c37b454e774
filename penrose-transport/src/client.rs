//! The sending side: one stream per report, retries with exponential backoff and jitter for
//! uploads that must get through, and a choice of how reports share connections ([`Reuse`]).
//!
//! By default ([`Reuse::FreshPerReport`]) every report, and every retry of it, travels on a
//! connection of its own, dialled from a UDP socket of its own (a new ephemeral source port),
//! with a full handshake (no TLS resumption, no QUIC address-validation token) and new random
//! connection ids, and closed once its ack is in: the server cannot tell from the transport
//! whether two reports came from one agent. That is what agents use. Load generators that need
//! tens of thousands of reports a second opt into
//! [`ClientConfig::shared_connection_for_load_testing`], which links every upload of a client.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use penrose_core::wire::{Ack, AckStatus, LENGTH_PREFIX, MAX_FRAME_BODY, Message, Report};
use rand::Rng;
use tokio::sync::Mutex;
use tracing::{debug, warn};

use crate::carrier::{self, Dialer};
use crate::error::{ClientError, TransportError};
use crate::identity::Trust;
use crate::{ALPN, UNREAD_REPORT_ID};

/// Application error codes the client closes its connections with.
pub mod codes {
    use quinn::VarInt;

    /// The client has the acks of every report it sent on this connection.
    pub const DONE: VarInt = VarInt::from_u32(0);
    /// The client gives up on the connection (an ack timed out, a stream failed).
    pub const ABANDONED: VarInt = VarInt::from_u32(1);
}

/// How a client's reports use QUIC connections. An enum rather than a flag so that the mode
/// that links uploads has to be named where it is chosen.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Reuse {
    /// Every report, and every retry of it, on a fresh connection from a fresh UDP socket
    /// (new ephemeral source port, new random connection ids, full handshake without TLS
    /// resumption or address-validation token), closed once the ack is in. Nothing at the
    /// transport layer links two uploads of the same client. The default, and the only mode
    /// the agent accepts.
    #[default]
    FreshPerReport,
    /// **Links every upload of the client**: one connection (one source port, one set of
    /// connection ids, one TLS session) carries all the reports of the client and its clones,
    /// each on a stream of its own, so the server sees at once which reports came together.
    /// For load generators and benchmarks on test data only, never for agents; chosen with
    /// [`ClientConfig::shared_connection_for_load_testing`].
    SharedConnectionLinksUploads,
}

/// How a client's QUIC connections reach the server.
#[derive(Clone, Debug, Default)]
pub enum Route {
    /// QUIC over UDP, from the host's own address.
    #[default]
    Direct,
    /// QUIC carried on a stream that the dialer opens for each connection
    /// ([`crate::carrier`]); the agent's dialer opens each on a Tor circuit of its own. Only
    /// with [`Reuse::FreshPerReport`].
    Carried(Arc<dyn Dialer>),
}

/// Where to send and whom to trust.
#[derive(Clone, Debug)]
pub struct ClientConfig {
    /// The aggregator's UDP address.
    pub server: SocketAddr,
    /// The name the server's certificate must carry (checked with [`Trust::Ca`]; a pinned
    /// certificate is matched whatever its names).
    pub server_name: String,
    /// What certificate to accept.
    pub trust: Trust,
    /// UDP from this host, or a stream per connection (over Tor); direct by default.
    pub route: Route,
    /// How [`Client::send_with_retry`] retries.
    pub retry: RetryPolicy,
    /// Longest wait for a handshake before the attempt counts as failed.
    pub connect_timeout: Duration,
    /// Longest wait from opening a report's stream to having its ack (includes waiting for
    /// stream credit when the server is pacing this connection).
    pub ack_timeout: Duration,
    /// A connection that hears nothing from the server for this long is given up (the server
    /// may hold it for less). It is also how long a client takes to notice a server that
    /// vanished without closing, such as one that was killed.
    pub idle_timeout: Duration,
    /// The local address the client's UDP sockets bind to (always on a new ephemeral port);
    /// `None`, the default: loopback for a server on loopback, else any address. Tests use it
    /// to send from another loopback address (127.0.0.2), as a second host would.
    pub local_ip: Option<IpAddr>,
    /// Fresh connection per report unless a tool asked otherwise (read with
    /// [`ClientConfig::reuse`]); private so that only
    /// [`ClientConfig::shared_connection_for_load_testing`] can change it.
    reuse: Reuse,
}

impl ClientConfig {
    /// A configuration with the default retry policy and timeouts (5 s to connect, 10 s for
    /// an ack, 30 s idle) and a fresh connection per report ([`Reuse::FreshPerReport`]).
    pub fn new(server: SocketAddr, server_name: impl Into<String>, trust: Trust) -> ClientConfig {
        ClientConfig {
            server,
            server_name: server_name.into(),
            trust,
            route: Route::Direct,
            retry: RetryPolicy::default(),
            connect_timeout: Duration::from_secs(5),
            ack_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(30),
            local_ip: None,
            reuse: Reuse::FreshPerReport,
        }
    }

    /// **Links uploads.** This configuration with one connection shared by every report of
    /// the client ([`Reuse::SharedConnectionLinksUploads`]), for load generators and
    /// benchmarks that need many thousands of reports a second. The server then sees which
    /// reports came from the same client; an agent must never use it (its uploader refuses).
    pub fn shared_connection_for_load_testing(mut self) -> ClientConfig {
        self.reuse = Reuse::SharedConnectionLinksUploads;
        self
    }

    /// How reports use connections.
    pub fn reuse(&self) -> Reuse {
        self.reuse
    }

    /// Back to a fresh connection per exchange, whatever a tool asked for.
    pub(crate) fn force_fresh(&mut self) {
        self.reuse = Reuse::FreshPerReport;
    }
}

/// Exponential backoff with jitter: retry `k` (from 0) waits `min(max_delay, base_delay *
/// 2^k)`, less a random share of up to `jitter` of it, so that a fleet cut off by the same
/// outage does not come back in step.
#[derive(Clone, Debug, PartialEq)]
pub struct RetryPolicy {
    /// Attempts in all, the first included; at least 1.
    pub attempts: u32,
    /// The wait before the first retry, before jitter.
    pub base_delay: Duration,
    /// No wait is longer than this.
    pub max_delay: Duration,
    /// Fraction (0 to 1) of each wait that is drawn at random.
    pub jitter: f64,
}

impl Default for RetryPolicy {
    fn default() -> RetryPolicy {
        RetryPolicy {
            attempts: 8,
            base_delay: Duration::from_millis(200),
            max_delay: Duration::from_secs(30),
            jitter: 0.5,
        }
    }
}

impl RetryPolicy {
    /// One attempt, no retries.
    pub fn none() -> RetryPolicy {
        RetryPolicy {
            attempts: 1,
            ..RetryPolicy::default()
        }
    }

    /// The wait before retry `retry` (0 for the first retry), jittered with `rng`.
    pub fn delay(&self, retry: u32, rng: &mut impl Rng) -> Duration {
        let full = self
            .base_delay
            .saturating_mul(2u32.saturating_pow(retry.min(31)))
            .min(self.max_delay);
        let jitter = self.jitter.clamp(0.0, 1.0);
        if jitter == 0.0 {
            return full;
        }
        full.mul_f64(1.0 - jitter * rng.random::<f64>())
    }
}

/// A client of one aggregator. Cheap to clone. With [`Reuse::FreshPerReport`] (the default)
/// each report dials its own connection from its own UDP socket and closes it after the ack;
/// with [`Reuse::SharedConnectionLinksUploads`] clones share one connection, each report on
/// its own stream, and a lost connection is dialled again by the next send.
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

struct Inner {
    quic: quinn::ClientConfig,
    config: ClientConfig,
    /// Where each new endpoint binds (port 0: the system picks a new ephemeral port).
    bind: SocketAddr,
    /// The one connection and its endpoint, in shared mode only.
    shared: Option<SharedConnection>,
}

struct SharedConnection {
    endpoint: quinn::Endpoint,
    connection: Mutex<Option<quinn::Connection>>,
}

/// Largest reply a client reads on a stream; an ack is 24 bytes.
const REPLY_LIMIT: usize = LENGTH_PREFIX + MAX_FRAME_BODY;

impl Client {
    /// A client that dials on its first send; must be called inside a tokio runtime. Local
    /// UDP sockets are bound to loopback when the server is on loopback, so tests never open
    /// a socket on another interface. In fresh mode nothing is bound until a report is sent.
    pub fn new(config: ClientConfig) -> Result<Client, ClientError> {
        Client::speaking(config, ALPN)
    }

    /// A client of an endpoint that speaks `alpn` (the report endpoint's, or an exchange
    /// endpoint's: [`crate::exchange`]).
    pub(crate) fn speaking(config: ClientConfig, alpn: &[u8]) -> Result<Client, ClientError> {
        let quic = crate::tls::client_config(&config.trust, alpn, config.idle_timeout)?;
        let bind = config.local_ip.unwrap_or(match config.server.ip() {
            IpAddr::V4(ip) if ip.is_loopback() => IpAddr::V4(Ipv4Addr::LOCALHOST),
            IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
            IpAddr::V6(ip) if ip.is_loopback() => IpAddr::V6(Ipv6Addr::LOCALHOST),
            IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
        });
        let bind = SocketAddr::new(bind, 0);
        if matches!(config.route, Route::Carried(_))
            && config.reuse == Reuse::SharedConnectionLinksUploads
        {
            return Err(ClientError::Unsupported(
                "a shared connection over a carried route",
            ));
        }
        let shared = match config.reuse {
            Reuse::FreshPerReport => None,
            Reuse::SharedConnectionLinksUploads => Some(SharedConnection {
                endpoint: bind_endpoint(bind)?,
                connection: Mutex::new(None),
            }),
        };
        Ok(Client {
            inner: Arc::new(Inner {
                quic,
                config,
                bind,
                shared,
            }),
        })
    }

    /// A client that has already shaken hands with the server, so that a wrong pin or an
    /// absent server shows up here rather than at the first report. In shared mode that
    /// connection is kept for the reports; in fresh mode it was a connection of its own,
    /// closed at once, that carries no report.
    pub async fn connect(config: ClientConfig) -> Result<Client, ClientError> {
        let client = Client::new(config)?;
        let conn = client.connection().await?;
        if client.inner.shared.is_none() {
            conn.close(codes::DONE, b"");
        }
        Ok(client)
    }

    /// The configuration this client was made with.
    pub fn config(&self) -> &ClientConfig {
        &self.inner.config
    }

    /// Sends one report on its own stream and waits for its ack. Whatever the ack says is
    /// returned as `Ok`: Rejected is the server's answer, not a transport failure.
    pub async fn send(&self, report: &Report) -> Result<Ack, ClientError> {
        let frame = encode(report)?;
        self.exchange_checked(&frame, report).await
    }

    /// Sends one report until it is delivered: an ack of Accepted or Duplicate (the server
    /// had it already, from an attempt whose ack was lost) ends it, and so does Rejected,
    /// which a retry would only repeat. Lost connections, timeouts and resets are retried
    /// after [`RetryPolicy::delay`]; in fresh mode each attempt dials a fresh connection from
    /// a fresh socket, in shared mode a new connection when the old one is gone.
    pub async fn send_with_retry(&self, report: &Report) -> Result<Ack, ClientError> {
        let frame = encode(report)?;
        let policy = &self.inner.config.retry;
        let attempts = policy.attempts.max(1);
        let mut attempt = 0;
        loop {
            attempt += 1;
            match self.exchange_checked(&frame, report).await {
                Ok(ack) => return Ok(ack),
                Err(e) if !e.is_retryable() => return Err(e),
                Err(e) if attempt >= attempts => {
                    return Err(ClientError::RetriesExhausted {
                        attempts: attempt,
                        last: Box::new(e),
                    });
                }
                Err(e) => {
                    if matches!(e, ClientError::AckTimeout(_)) {
                        // The server may be gone without a word (killed, or the path lost);
                        // dial afresh rather than wait out the idle timeout.
                        self.forget_connection().await;
                    }
                    let delay = policy.delay(attempt - 1, &mut rand::rng());
                    warn!(attempt, error = %e, ?delay, "report not delivered; retrying");
                    tokio::time::sleep(delay).await;
                }
            }
        }
    }

    /// Writes `bytes` as they are on a fresh stream, finishes it and reads the reply as an
    /// ack: for tests and for the load generator's invalid reports. No check that the ack
    /// names any report.
    pub async fn send_raw(&self, bytes: &[u8]) -> Result<Ack, ClientError> {
        self.exchange(bytes).await
    }

    /// Asks for the design server's signed key list ([`Message::KeyListRequest`]) on a
    /// connection of its own (fresh mode: a new one, like a report's, so the request links to
    /// nothing) and returns the list's bytes as the server sent them, unverified: the caller
    /// checks the signature. One attempt; the caller retries on its own schedule.
    pub async fn fetch_key_list(&self) -> Result<Vec<u8>, ClientError> {
        let frame = Message::KeyListRequest
            .to_frame()
            .map_err(ClientError::Encode)?;
        let reply = self.exchange_reply(&frame).await?;
        let (message, used) = Message::decode(&reply).map_err(ClientError::BadAck)?;
        if used != reply.len() {
            return Err(ClientError::BadAck(
                penrose_core::wire::WireError::TrailingBytes(reply.len() - used),
            ));
        }
        match message {
            Message::KeyList(list) => Ok(list),
            Message::Ack(ack) => Err(ClientError::Refused(ack.status)),
            Message::Report(_) | Message::KeyListRequest => Err(ClientError::NotAnAck),
        }
    }

    /// A connection for tools that need streams of their own (a peer that trickles bytes,
    /// for instance). In shared mode the client's connection, dialled if there is none or it
    /// was lost; in fresh mode a new connection from a new socket, which the caller owns and
    /// should close.
    pub async fn connection(&self) -> Result<quinn::Connection, ClientError> {
        let Some(shared) = &self.inner.shared else {
            return self.dial_fresh().await;
        };
        let mut current = shared.connection.lock().await;
        if let Some(conn) = current.as_ref() {
            if conn.close_reason().is_none() {
                return Ok(conn.clone());
            }
            debug!(reason = ?conn.close_reason(), "connection lost; dialling again");
        }
        let conn = self.dial(&shared.endpoint).await?;
        *current = Some(conn.clone());
        Ok(conn)
    }

    /// Closes the shared connection politely and waits (briefly) for the server to hear it.
    /// In fresh mode every report's connection was closed after its ack, so there is nothing
    /// left to do.
    pub async fn close(&self) {
        let Some(shared) = &self.inner.shared else {
            return;
        };
        if let Some(conn) = shared.connection.lock().await.take() {
            conn.close(codes::DONE, b"client done");
        }
        let _ = tokio::time::timeout(Duration::from_secs(1), shared.endpoint.wait_idle()).await;
    }

    /// In shared mode, makes the next send dial a new connection; streams still open on the
    /// old one carry on. (In fresh mode every send dials anyway.)
    async fn forget_connection(&self) {
        if let Some(shared) = &self.inner.shared {
            shared.connection.lock().await.take();
        }
    }

    /// A new endpoint on a new UDP socket (a new ephemeral port) and a connection from it.
    /// The endpoint handle is dropped here: quinn keeps its socket and driver alive for as
    /// long as the connection lives, including the draining period after it is closed.
    /// Over a carried route, the endpoint's only path is a new stream from the dialer.
    pub(crate) async fn dial_fresh(&self) -> Result<quinn::Connection, ClientError> {
        let endpoint = match &self.inner.config.route {
            Route::Direct => bind_endpoint(self.inner.bind)?,
            Route::Carried(dialer) => {
                let timeout = self.inner.config.connect_timeout;
                let stream = match tokio::time::timeout(timeout, dialer.open()).await {
                    Ok(Ok(stream)) => stream,
                    Ok(Err(e)) => return Err(ClientError::Carrier(e)),
                    Err(_) => return Err(ClientError::ConnectTimeout(timeout)),
                };
                carrier::client_endpoint(stream, self.inner.config.server)
                    .map_err(ClientError::Carrier)?
            }
        };
        self.dial(&endpoint).await
    }

    async fn dial(&self, endpoint: &quinn::Endpoint) -> Result<quinn::Connection, ClientError> {
        let config = &self.inner.config;
        let connecting =
            endpoint.connect_with(self.inner.quic.clone(), config.server, &config.server_name)?;
        match tokio::time::timeout(config.connect_timeout, connecting).await {
            Ok(conn) => Ok(conn?),
            Err(_) => Err(ClientError::ConnectTimeout(config.connect_timeout)),
        }
    }

    async fn exchange_checked(&self, frame: &[u8], report: &Report) -> Result<Ack, ClientError> {
        let ack = self.exchange(frame).await?;
        let transport_refusal =
            ack.report_id == UNREAD_REPORT_ID && matches!(ack.status, AckStatus::Rejected(_));
        if ack.report_id != report.report_id && !transport_refusal {
            return Err(ClientError::AckMismatch);
        }
        Ok(ack)
    }

    async fn exchange(&self, frame: &[u8]) -> Result<Ack, ClientError> {
        decode_ack(&self.exchange_reply(frame).await?)
    }

    /// Writes `frame` on a stream and reads the whole reply (shared or fresh connection as
    /// configured).
    async fn exchange_reply(&self, frame: &[u8]) -> Result<Vec<u8>, ClientError> {
        let timeout = self.inner.config.ack_timeout;
        if self.inner.shared.is_some() {
            let conn = self.connection().await?;
            return exchange_on(&conn, frame, timeout).await;
        }
        // Fresh mode: this report's own connection, closed whatever the outcome, so that a
        // retry cannot reuse it.
        let conn = self.dial_fresh().await?;
        let result = exchange_on(&conn, frame, timeout).await;
        let code = if result.is_ok() {
            codes::DONE
        } else {
            codes::ABANDONED
        };
        conn.close(code, b"");
        result
    }
}

fn bind_endpoint(bind: SocketAddr) -> Result<quinn::Endpoint, ClientError> {
    quinn::Endpoint::client(bind)
        .map_err(|source| ClientError::Setup(TransportError::Bind { addr: bind, source }))
}

/// One report's stream on `conn`: write the frame, finish, read the reply, within `timeout`.
async fn exchange_on(
    conn: &quinn::Connection,
    frame: &[u8],
    timeout: Duration,
) -> Result<Vec<u8>, ClientError> {
    let exchange = async {
        let (mut send, mut recv) = conn.open_bi().await?;
        match send.write_all(frame).await {
            Ok(()) => {}
            // The server refused the frame and stopped reading; its ack says why.
            Err(quinn::WriteError::Stopped(_)) => {}
            Err(e) => return Err(ClientError::Write(e)),
        }
        // Fails only if the stream is already stopped or reset, which the read reports.
        let _ = send.finish();
        Ok(recv.read_to_end(REPLY_LIMIT).await?)
    };
    match tokio::time::timeout(timeout, exchange).await {
        Ok(result) => result,
        Err(_) => Err(ClientError::AckTimeout(timeout)),
    }
}

fn encode(report: &Report) -> Result<Vec<u8>, ClientError> {
    Message::Report(report.clone())
        .to_frame()
        .map_err(ClientError::Encode)
}

fn decode_ack(reply: &[u8]) -> Result<Ack, ClientError> {
    let (message, used) = Message::decode(reply).map_err(ClientError::BadAck)?;
    if used != reply.len() {
        return Err(ClientError::BadAck(
            penrose_core::wire::WireError::TrailingBytes(reply.len() - used),
        ));
    }
    match message {
        Message::Ack(ack) => Ok(ack),
        Message::Report(_) | Message::KeyListRequest | Message::KeyList(_) => {
            Err(ClientError::NotAnAck)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn backoff_doubles_up_to_the_cap_and_jitter_only_shortens() {
        let policy = RetryPolicy {
            attempts: 10,
            base_delay: Duration::from_millis(100),
            max_delay: Duration::from_secs(1),
            jitter: 0.0,
        };
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let waits: Vec<_> = (0..6).map(|k| policy.delay(k, &mut rng)).collect();
        assert_eq!(
            waits,
            [100, 200, 400, 800, 1000, 1000].map(Duration::from_millis)
        );
        let jittered = RetryPolicy {
            jitter: 0.5,
            ..policy
        };
        let draws: Vec<_> = (0..200).map(|_| jittered.delay(2, &mut rng)).collect();
        assert!(
            draws
                .iter()
                .all(|d| *d >= Duration::from_millis(200) && *d <= Duration::from_millis(400))
        );
        assert!(
            draws.iter().any(|d| *d != draws[0]),
            "jitter varies the waits"
        );
        assert_eq!(policy.delay(u32::MAX, &mut rng), Duration::from_secs(1));
    }
}
