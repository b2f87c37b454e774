//! A request/answer endpoint on the same QUIC and TLS settings as the report endpoint, for
//! services that answer with more than an ack: the token issuer (`penrose-issuer`).
//!
//! One bidirectional stream carries one exchange: the client writes `length:u32be body` and
//! finishes its side; the server checks the length against its own limit before it allocates,
//! reads the body under [`Limits::stream_read_timeout`], and answers with `length:u32be body`
//! from its [`ExchangeHandler`]. A frame the server cannot read (too large, cut short, too
//! slow) gets the stream reset, not an answer. Address validation, per-source limits,
//! connection slots, the handshake timeout and pacing are the report endpoint's
//! ([`crate::server`]), with the endpoint's own ALPN.
//!
//! The client ([`ExchangeClient`]) dials a fresh connection from a fresh UDP socket for every
//! exchange, as the agent's report uploads do, so two exchanges are not linked by the
//! transport (what their bodies say is the caller's business).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use penrose_core::wire::LENGTH_PREFIX;
use quinn::{RecvStream, SendStream};
use tracing::debug;

use crate::client::{Client, ClientConfig, codes as client_codes};
use crate::error::{ClientError, TransportError};
use crate::frame::{self, FrameRead};
use crate::server::{self, Origin, Server, ServerConfig, Service, Shared, bump, codes};

/// What an exchange endpoint does with each request body.
pub trait ExchangeHandler: Send + Sync + 'static {
    /// One request body (at most the endpoint's limit, complete). Returns the answer body; it
    /// must not be longer than the clients' answer limit.
    fn handle(&self, request: Vec<u8>) -> impl Future<Output = Vec<u8>> + Send;
}

/// A service whose answers are computed synchronously: CPU-bound work or synced writes that
/// must not run on the async threads (the token issuer's scalar multiplications, the release
/// auditor's partial decryptions). [`Offloaded`] serves it.
pub trait BlockingAnswers: Send + Sync + 'static {
    /// The answer to one request body.
    fn answer(&self, request: &[u8]) -> Vec<u8>;

    /// The answer when none could be computed (the blocking task failed, or the service is
    /// shutting down), in the service's own refusal encoding.
    fn unavailable(&self) -> Vec<u8>;
}

/// An [`ExchangeHandler`] that computes each answer of a [`BlockingAnswers`] on tokio's
/// blocking threads, at most a few at once (the rest wait their turn), never on the async
/// executor.
pub struct Offloaded<A> {
    service: Arc<A>,
    permits: Arc<tokio::sync::Semaphore>,
}

impl<A> Clone for Offloaded<A> {
    fn clone(&self) -> Self {
        Offloaded {
            service: Arc::clone(&self.service),
            permits: Arc::clone(&self.permits),
        }
    }
}

impl<A: BlockingAnswers> Offloaded<A> {
    /// Serves `service` computing at most `concurrent` answers at once (at least 1).
    pub fn new(service: Arc<A>, concurrent: usize) -> Self {
        Offloaded {
            service,
            permits: Arc::new(tokio::sync::Semaphore::new(concurrent.max(1))),
        }
    }
}

impl<A: BlockingAnswers> ExchangeHandler for Offloaded<A> {
    async fn handle(&self, request: Vec<u8>) -> Vec<u8> {
        let Ok(_permit) = Arc::clone(&self.permits).acquire_owned().await else {
            return self.service.unavailable();
        };
        let service = Arc::clone(&self.service);
        match tokio::task::spawn_blocking(move || service.answer(&request)).await {
            Ok(answer) => answer,
            Err(e) => {
                tracing::error!(error = %e, "an exchange answer failed");
                self.service.unavailable()
            }
        }
    }
}

/// The protocol an exchange endpoint speaks: its ALPN and the largest body either side reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Protocol {
    /// The one ALPN of the endpoint (never the report endpoint's [`crate::ALPN`]).
    pub alpn: &'static [u8],
    /// The largest request or answer body, checked from the length prefix before allocating.
    pub max_body: usize,
}

struct Exchanges<H> {
    handler: H,
    protocol: Protocol,
}

impl<H: ExchangeHandler> Service for Exchanges<H> {
    fn alpn(&self) -> &'static [u8] {
        self.protocol.alpn
    }

    fn stream(
        shared: Arc<Shared<Self>>,
        send: SendStream,
        recv: RecvStream,
        origin: Origin,
    ) -> impl Future<Output = ()> + Send {
        let _ = origin;
        exchange_stream(shared, send, recv)
    }
}

/// Binds an exchange endpoint for `handler` and starts accepting connections; must run inside
/// a tokio runtime. Refuses the report endpoint's ALPN, so that the two cannot be confused.
pub async fn serve_exchange<H: ExchangeHandler>(
    config: ServerConfig,
    protocol: Protocol,
    handler: H,
) -> Result<Server, TransportError> {
    if protocol.alpn == crate::ALPN
        || protocol.max_body == 0
        || protocol.max_body > u32::MAX as usize
    {
        return Err(TransportError::InvalidLimits(
            "an exchange endpoint needs an ALPN of its own and a body limit of 1 to 4 GiB",
        ));
    }
    server::start(config, Exchanges { handler, protocol }).await
}

async fn exchange_stream<H: ExchangeHandler>(
    shared: Arc<Shared<Exchanges<H>>>,
    mut send: SendStream,
    mut recv: RecvStream,
) {
    let counters = &shared.counters;
    let deadline = shared.limits.stream_read_timeout;
    let read = frame::read_frame(&mut recv, shared.service.protocol.max_body);
    let body = match tokio::time::timeout(deadline, read).await {
        Ok(Ok(FrameRead::Body(body))) => body,
        Err(_) => {
            bump(&counters.read_timeouts);
            let _ = recv.stop(codes::READ_TIMEOUT);
            let _ = send.reset(codes::READ_TIMEOUT);
            return;
        }
        Ok(Ok(FrameRead::TooLarge(announced))) => {
            bump(&counters.frames_too_large);
            debug!(announced, "exchange request too large");
            let _ = recv.stop(codes::REFUSED);
            let _ = send.reset(codes::REFUSED);
            return;
        }
        Ok(Ok(FrameRead::Truncated | FrameRead::Trailing)) => {
            bump(&counters.frames_malformed);
            let _ = recv.stop(codes::REFUSED);
            let _ = send.reset(codes::REFUSED);
            return;
        }
        Ok(Err(e)) => {
            bump(&counters.stream_errors);
            debug!(error = %e, "exchange stream failed");
            let _ = send.reset(codes::INTERNAL);
            return;
        }
    };
    bump(&counters.frames_handled);
    let answer = shared.service.handler.handle(body).await;
    let mut framed = Vec::with_capacity(LENGTH_PREFIX + answer.len());
    let Ok(len) = u32::try_from(answer.len()) else {
        let _ = send.reset(codes::INTERNAL);
        return;
    };
    framed.extend_from_slice(&len.to_be_bytes());
    framed.extend_from_slice(&answer);
    server::write_answer(send, &framed, deadline, counters).await;
}

/// A client of one exchange endpoint: every [`exchange`](Self::exchange) on a fresh connection
/// from a fresh UDP socket, closed once the answer is in.
#[derive(Clone)]
pub struct ExchangeClient {
    client: Client,
    protocol: Protocol,
}

impl ExchangeClient {
    /// A client that dials on each exchange; must be called inside a tokio runtime. The
    /// configuration's reuse mode is ignored: exchanges always use fresh connections.
    pub fn new(mut config: ClientConfig, protocol: Protocol) -> Result<Self, ClientError> {
        // Everything else as configured (the route above all: over Tor, each exchange on a
        // stream and circuit of its own).
        config.force_fresh();
        Ok(ExchangeClient {
            client: Client::speaking(config, protocol.alpn)?,
            protocol,
        })
    }

    /// Sends one request and returns the answer body. Waits at most the configuration's ack
    /// timeout once connected; one attempt (callers that must get through retry).
    pub async fn exchange(&self, request: &[u8]) -> Result<Vec<u8>, ClientError> {
        if request.len() > self.protocol.max_body {
            return Err(ClientError::RequestTooLarge(request.len()));
        }
        let conn = self.client.dial_fresh().await?;
        let timeout = self.client.config().ack_timeout;
        let result = exchange_on(&conn, request, self.protocol.max_body, timeout).await;
        let code = if result.is_ok() {
            client_codes::DONE
        } else {
            client_codes::ABANDONED
        };
        conn.close(code, b"");
        result
    }
}

async fn exchange_on(
    conn: &quinn::Connection,
    request: &[u8],
    max_body: usize,
    timeout: Duration,
) -> Result<Vec<u8>, ClientError> {
    let exchange = async {
        let (mut send, mut recv) = conn.open_bi().await?;
        // Bounded by max_body, itself at most u32::MAX (checked by the caller's protocol).
        let len = u32::try_from(request.len())
            .map_err(|_| ClientError::RequestTooLarge(request.len()))?;
        send.write_all(&len.to_be_bytes()).await?;
        send.write_all(request).await?;
        let _ = send.finish();
        let reply = recv.read_to_end(LENGTH_PREFIX + max_body).await?;
        let Some((prefix, body)) = reply.split_first_chunk::<LENGTH_PREFIX>() else {
            return Err(ClientError::BadAnswer("shorter than its length prefix"));
        };
        if u32::from_be_bytes(*prefix) as usize != body.len() {
            return Err(ClientError::BadAnswer(
                "length prefix does not match the body",
            ));
        }
        Ok(body.to_vec())
    };
    match tokio::time::timeout(timeout, exchange).await {
        Ok(result) => result,
        Err(_) => Err(ClientError::AckTimeout(timeout)),
    }
}
