//! QUIC carried on byte streams, for networks that carry TCP streams only, such as Tor
//! (docs/design.md section 5).
//!
//! The same QUIC + TLS protocol as the direct path runs unchanged; only its datagrams travel
//! differently: each one is written on a stream as a 2-byte big-endian length and its bytes
//! ([`penrose_core::datagrams`]).
//! A stream is reliable and ordered, so nothing is lost or reordered on it, and QUIC's own
//! loss recovery only ever acts on datagrams this module drops when a queue is full (as a UDP
//! socket drops them when its buffer is).
//!
//! - The client side ([`Dialer`]): each QUIC connection gets a stream of its own from the
//!   dialer (the agent's opens one on a fresh Tor circuit) and an endpoint of its own over it,
//!   so two reports share nothing below QUIC either.
//! - The server side ([`StreamIntake`]): a TCP listener whose accepted streams all feed one
//!   QUIC endpoint. Each stream gets an address of its own that the endpoint sees as the
//!   peer's ([`carrier_address`]), so QUIC's per-connection state and the per-source limits
//!   apply per stream; the stream's real TCP peer (over Tor: the exit relay) is what
//!   [`crate::Origin::carrier`] reports.
//!
//! Bounds on the server side: at most [`crate::Limits::max_connections`] streams open at once
//! (one more is accepted and closed at once), a stream that carries no datagram for
//! [`crate::Limits::idle_timeout`] is closed, a datagram longer than [`MAX_DATAGRAM`] closes
//! its stream, and a stream's queues hold at most [`QUEUE_DATAGRAMS`] datagrams each way.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::io::{self, IoSliceMut};
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use penrose_core::datagrams::{self, Decoder};
use quinn::udp::{RecvMeta, Transmit};
use quinn::{AsyncUdpSocket, UdpPoller};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, mpsc};
use tokio::task::AbortHandle;
use tracing::debug;

/// The longest datagram a stream carries ([`penrose_core::datagrams`], which frames them): the
/// largest UDP payload QUIC can ask for. quinn sends at most 1,452 by default.
pub const MAX_DATAGRAM: usize = datagrams::MAX_DATAGRAM;

/// Bytes read from a stream at a time.
const READ_CHUNK: usize = 16 * 1024;

/// Datagrams a stream's outbound queue, and an endpoint's inbound queue per stream, hold
/// before further ones are dropped (QUIC then sends them again, more slowly).
pub const QUEUE_DATAGRAMS: usize = 256;

/// A byte stream that can carry a QUIC connection: a TCP stream, a Tor stream.
pub trait ByteStream: AsyncRead + AsyncWrite + Send + Unpin + 'static {}

impl<T: AsyncRead + AsyncWrite + Send + Unpin + 'static> ByteStream for T {}

/// A boxed stream, as a [`Dialer`] returns it.
pub type BoxedStream = Box<dyn ByteStream>;

/// The future [`Dialer::open`] returns.
pub type OpenFuture<'a> = Pin<Box<dyn Future<Output = io::Result<BoxedStream>> + Send + 'a>>;

/// Opens a new stream to the server for each QUIC connection a client makes. The agent's
/// opens each on a Tor circuit of its own, so that no two reports share a path; tests use
/// plain TCP on loopback.
pub trait Dialer: Send + Sync + fmt::Debug + 'static {
    /// A new stream to the server, on a path of its own. [`crate::ClientConfig::connect_timeout`]
    /// bounds this and the QUIC handshake together.
    fn open(&self) -> OpenFuture<'_>;
}

/// A dialer of plain TCP connections: for tests, and for a server's stream port reached
/// without Tor.
#[derive(Clone, Debug)]
pub struct TcpDialer(pub SocketAddr);

impl Dialer for TcpDialer {
    fn open(&self) -> OpenFuture<'_> {
        Box::pin(async move {
            let stream = tokio::net::TcpStream::connect(self.0).await?;
            stream.set_nodelay(true)?;
            Ok(Box::new(stream) as BoxedStream)
        })
    }
}

/// The address a server's endpoint sees as the peer of the `n`-th stream it accepted: unique
/// per stream and in a /64 of its own (the per-source limits count IPv6 sources by /64), under
/// the unique-local prefix fd70::/16 that no real peer of the server uses. Over Tor every
/// stream comes from some exit, so the real TCP peer would lump unrelated agents together;
/// per-sender bounds over Tor come from admission tokens instead. (A client calls the server
/// whatever its configuration says: [`STREAM_SERVER`] over Tor.)
pub fn carrier_address(n: u64) -> SocketAddr {
    let [a, b, c] = [(n >> 32) as u16, (n >> 16) as u16, n as u16];
    SocketAddr::new(IpAddr::V6(Ipv6Addr::new(0xfd70, a, b, c, 0, 0, 0, 1)), 443)
}

/// The address a client endpoint calls the server by when its only path is a stream: the
/// real address is the dialer's business (over Tor the exit resolves it; this host never
/// does). Nothing is ever sent to it but on the stream.
pub const STREAM_SERVER: SocketAddr = SocketAddr::V6(std::net::SocketAddrV6::new(
    Ipv6Addr::new(0xfd70, 0, 0, 0, 0, 0, 0, 1),
    443,
    0,
    0,
));

/// Counters of a stream socket, for metrics and tests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CarrierStats {
    /// Streams attached (accepted, on a server).
    pub streams: u64,
    /// Streams accepted and closed at once because [`crate::Limits::max_connections`] were
    /// open.
    pub streams_refused: u64,
    /// Streams closed because nothing arrived on them for the idle timeout.
    pub streams_idle: u64,
    /// Streams closed because they announced a datagram that is empty or too long.
    pub streams_malformed: u64,
    /// Datagrams dropped because a queue was full or their stream was gone.
    pub datagrams_dropped: u64,
}

#[derive(Default)]
struct Counters {
    streams: AtomicU64,
    streams_refused: AtomicU64,
    streams_idle: AtomicU64,
    streams_malformed: AtomicU64,
    datagrams_dropped: AtomicU64,
}

fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

/// One attached stream: where its outbound datagrams go, and its two tasks.
struct Route {
    outbound: mpsc::Sender<Vec<u8>>,
    tasks: [AbortHandle; 2],
    carrier: Option<SocketAddr>,
}

/// What the socket and its stream tasks share.
struct Inner {
    routes: Mutex<HashMap<SocketAddr, Route>>,
    inbound: mpsc::Sender<(SocketAddr, Vec<u8>)>,
    counters: Counters,
    /// How long a stream may carry nothing before it is closed; `None` on the client side,
    /// where the QUIC connection's own idle timeout ends it.
    idle: Option<Duration>,
}

impl Inner {
    fn routes(&self) -> std::sync::MutexGuard<'_, HashMap<SocketAddr, Route>> {
        // A panic while the lock was held leaves the map consistent (every change is a
        // single insert or remove), so a poisoned lock is still usable.
        self.routes.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Forgets a stream and stops its tasks (dropping the stream closes it).
    fn detach(&self, peer: SocketAddr) {
        if let Some(route) = self.routes().remove(&peer) {
            for task in route.tasks {
                task.abort();
            }
        }
    }

    /// Starts the tasks that move datagrams between `stream` and the endpoint, which sees
    /// them as coming from `peer`.
    fn attach(
        self: &Arc<Self>,
        stream: BoxedStream,
        peer: SocketAddr,
        carrier: Option<SocketAddr>,
        slot: Option<tokio::sync::OwnedSemaphorePermit>,
    ) {
        bump(&self.counters.streams);
        let (read_half, write_half) = tokio::io::split(stream);
        let (outbound, queue) = mpsc::channel(QUEUE_DATAGRAMS);
        // Held while the tasks start, so that a stream that ends at once is forgotten after
        // it was recorded, not before.
        let mut routes = self.routes();
        let reader = tokio::spawn(read_datagrams(self.clone(), read_half, peer, slot));
        let writer = tokio::spawn(write_datagrams(self.clone(), write_half, queue, peer));
        routes.insert(
            peer,
            Route {
                outbound,
                tasks: [reader.abort_handle(), writer.abort_handle()],
                carrier,
            },
        );
    }

    fn snapshot(&self) -> CarrierStats {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let c = &self.counters;
        CarrierStats {
            streams: get(&c.streams),
            streams_refused: get(&c.streams_refused),
            streams_idle: get(&c.streams_idle),
            streams_malformed: get(&c.streams_malformed),
            datagrams_dropped: get(&c.datagrams_dropped),
        }
    }
}

/// Reads length-prefixed datagrams off a stream into the endpoint's inbound queue until the
/// stream ends, fails, idles or misbehaves; then forgets the stream.
async fn read_datagrams(
    inner: Arc<Inner>,
    mut stream: tokio::io::ReadHalf<BoxedStream>,
    peer: SocketAddr,
    slot: Option<tokio::sync::OwnedSemaphorePermit>,
) {
    let mut decoder = Decoder::new();
    let mut chunk = vec![0u8; READ_CHUNK];
    // Idle is counted from the last whole datagram, not the last byte, so that a peer
    // trickling a byte now and then cannot hold a stream (and its slot) without ever
    // completing one.
    let mut last_datagram = tokio::time::Instant::now();
    let result: io::Result<()> = async {
        loop {
            let read = match inner.idle {
                None => stream.read(&mut chunk).await?,
                Some(idle) => {
                    let deadline = last_datagram + idle;
                    match tokio::time::timeout_at(deadline, stream.read(&mut chunk)).await {
                        Ok(read) => read?,
                        Err(_) => {
                            bump(&inner.counters.streams_idle);
                            return Err(io::Error::new(
                                io::ErrorKind::TimedOut,
                                "no datagram within the idle timeout",
                            ));
                        }
                    }
                }
            };
            if read == 0 {
                return Ok(());
            }
            decoder.push(&chunk[..read]);
            loop {
                match decoder.next_datagram() {
                    Ok(Some(datagram)) => {
                        last_datagram = tokio::time::Instant::now();
                        if inner.inbound.try_send((peer, datagram)).is_err() {
                            bump(&inner.counters.datagrams_dropped);
                        }
                    }
                    Ok(None) => break,
                    Err(e) => {
                        bump(&inner.counters.streams_malformed);
                        return Err(io::Error::new(io::ErrorKind::InvalidData, e));
                    }
                }
            }
        }
    }
    .await;
    if let Err(e) = result {
        debug!(%peer, error = %e, "carrier stream ended");
    }
    drop(slot);
    inner.detach(peer);
}

/// Writes queued datagrams on a stream, flushing whenever the queue runs dry (a Tor stream
/// sends a partial cell only when flushed).
async fn write_datagrams(
    inner: Arc<Inner>,
    mut stream: tokio::io::WriteHalf<BoxedStream>,
    mut queue: mpsc::Receiver<Vec<u8>>,
    peer: SocketAddr,
) {
    let mut framed = Vec::new();
    let result: io::Result<()> = async {
        while let Some(datagram) = queue.recv().await {
            write_one(&mut stream, &datagram, &mut framed).await?;
            while let Ok(datagram) = queue.try_recv() {
                write_one(&mut stream, &datagram, &mut framed).await?;
            }
            stream.flush().await?;
        }
        stream.shutdown().await
    }
    .await;
    if let Err(e) = result {
        debug!(%peer, error = %e, "carrier stream write failed");
    }
    inner.detach(peer);
}

async fn write_one(
    stream: &mut tokio::io::WriteHalf<BoxedStream>,
    datagram: &[u8],
    framed: &mut Vec<u8>,
) -> io::Result<()> {
    framed.clear();
    datagrams::encode(datagram, framed)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    stream.write_all(framed).await
}

/// A `quinn::AsyncUdpSocket` whose datagrams travel on byte streams.
struct StreamSocket {
    inner: Arc<Inner>,
    inbound: Mutex<mpsc::Receiver<(SocketAddr, Vec<u8>)>>,
    local: SocketAddr,
    /// The server's accept task, stopped with the socket.
    accept: Option<AbortHandle>,
}

impl StreamSocket {
    fn new(local: SocketAddr, idle: Option<Duration>) -> StreamSocket {
        let (inbound_tx, inbound) = mpsc::channel(QUEUE_DATAGRAMS);
        StreamSocket {
            inner: Arc::new(Inner {
                routes: Mutex::new(HashMap::new()),
                inbound: inbound_tx,
                counters: Counters::default(),
                idle,
            }),
            inbound: Mutex::new(inbound),
            local,
            accept: None,
        }
    }
}

impl fmt::Debug for StreamSocket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StreamSocket")
            .field("local", &self.local)
            .field("streams", &self.inner.routes().len())
            .finish()
    }
}

impl Drop for StreamSocket {
    fn drop(&mut self) {
        if let Some(accept) = &self.accept {
            accept.abort();
        }
        let peers: Vec<SocketAddr> = self.inner.routes().keys().copied().collect();
        for peer in peers {
            self.inner.detach(peer);
        }
    }
}

/// Always writable: a full queue drops the datagram instead of blocking, so that one slow
/// stream never holds up the endpoint's other connections.
#[derive(Debug)]
struct AlwaysWritable;

impl UdpPoller for AlwaysWritable {
    fn poll_writable(self: Pin<&mut Self>, _cx: &mut Context) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

impl AsyncUdpSocket for StreamSocket {
    fn create_io_poller(self: Arc<Self>) -> Pin<Box<dyn UdpPoller>> {
        Box::pin(AlwaysWritable)
    }

    fn try_send(&self, transmit: &Transmit) -> io::Result<()> {
        let routes = self.inner.routes();
        let sent = routes
            .get(&transmit.destination)
            .is_some_and(|route| route.outbound.try_send(transmit.contents.to_vec()).is_ok());
        if !sent {
            // As a UDP socket would: a datagram to a peer that is gone, or beyond a full
            // buffer, is lost and QUIC recovers.
            bump(&self.inner.counters.datagrams_dropped);
        }
        Ok(())
    }

    fn poll_recv(
        &self,
        cx: &mut Context,
        bufs: &mut [IoSliceMut<'_>],
        meta: &mut [RecvMeta],
    ) -> Poll<io::Result<usize>> {
        let mut inbound = self.inbound.lock().unwrap_or_else(PoisonError::into_inner);
        let mut filled = 0;
        while filled < bufs.len().min(meta.len()) {
            let next = if filled == 0 {
                match inbound.poll_recv(cx) {
                    Poll::Ready(Some(next)) => next,
                    // The sender lives in `inner`, which this socket holds: never closed.
                    Poll::Ready(None) | Poll::Pending => return Poll::Pending,
                }
            } else {
                match inbound.try_recv() {
                    Ok(next) => next,
                    Err(_) => break,
                }
            };
            let (peer, datagram) = next;
            let buf = &mut bufs[filled];
            if datagram.len() > buf.len() {
                bump(&self.inner.counters.datagrams_dropped);
                continue;
            }
            buf[..datagram.len()].copy_from_slice(&datagram);
            meta[filled] = RecvMeta {
                addr: peer,
                len: datagram.len(),
                stride: datagram.len(),
                ecn: None,
                dst_ip: None,
            };
            filled += 1;
        }
        Poll::Ready(Ok(filled))
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        Ok(self.local)
    }

    fn may_fragment(&self) -> bool {
        false
    }
}

/// A client endpoint whose only path is `stream`, to a server the endpoint addresses as
/// `server` (its real address, for logs; nothing is sent to it but on the stream).
pub(crate) fn client_endpoint(
    stream: BoxedStream,
    server: SocketAddr,
) -> io::Result<quinn::Endpoint> {
    let local = match server {
        SocketAddr::V4(_) => SocketAddr::from(([0, 0, 0, 0], 0)),
        SocketAddr::V6(_) => SocketAddr::from((Ipv6Addr::UNSPECIFIED, 0)),
    };
    let socket = StreamSocket::new(local, None);
    socket.inner.attach(stream, server, None, None);
    quinn::Endpoint::new_with_abstract_socket(
        quinn::EndpointConfig::default(),
        None,
        Arc::new(socket),
        Arc::new(quinn::TokioRuntime),
    )
}

/// The server side: a TCP listener whose streams feed one QUIC endpoint.
pub(crate) struct StreamIntake {
    pub(crate) endpoint: quinn::Endpoint,
    pub(crate) local_addr: SocketAddr,
    inner: Arc<Inner>,
}

impl StreamIntake {
    /// Binds `listen` (TCP) and an endpoint that answers with `server_config`.
    pub(crate) async fn bind(
        listen: SocketAddr,
        server_config: quinn::ServerConfig,
        max_streams: usize,
        idle: Duration,
    ) -> io::Result<StreamIntake> {
        let listener = TcpListener::bind(listen).await?;
        let local_addr = listener.local_addr()?;
        let mut socket = StreamSocket::new(local_addr, Some(idle));
        let inner = socket.inner.clone();
        let accept = tokio::spawn(accept_streams(listener, inner.clone(), max_streams));
        socket.accept = Some(accept.abort_handle());
        let endpoint = quinn::Endpoint::new_with_abstract_socket(
            quinn::EndpointConfig::default(),
            Some(server_config),
            Arc::new(socket),
            Arc::new(quinn::TokioRuntime),
        )?;
        Ok(StreamIntake {
            endpoint,
            local_addr,
            inner,
        })
    }

    /// What the accept loop uses to name the TCP peer behind each connection.
    pub(crate) fn lookup(&self) -> CarrierLookup {
        CarrierLookup(self.inner.clone())
    }
}

/// Finds the TCP peer behind a stream's address; cheap to clone.
#[derive(Clone)]
pub(crate) struct CarrierLookup(Arc<Inner>);

impl CarrierLookup {
    /// The TCP peer of the stream the endpoint knows as `peer`, while that stream is open.
    pub(crate) fn carrier_of(&self, peer: SocketAddr) -> Option<SocketAddr> {
        self.0.routes().get(&peer).and_then(|route| route.carrier)
    }

    pub(crate) fn stats(&self) -> CarrierStats {
        self.0.snapshot()
    }
}

async fn accept_streams(listener: TcpListener, inner: Arc<Inner>, max_streams: usize) {
    let slots = Arc::new(Semaphore::new(max_streams));
    let mut accepted: u64 = 0;
    loop {
        let (stream, remote) = match listener.accept().await {
            Ok(pair) => pair,
            Err(e) => {
                // Out of file descriptors and the like: wait a little rather than spin.
                debug!(error = %e, "carrier accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            bump(&inner.counters.streams_refused);
            debug!(%remote, "carrier stream refused: at the connection limit");
            drop(stream);
            continue;
        };
        let _ = stream.set_nodelay(true);
        accepted += 1;
        inner.attach(
            Box::new(stream),
            carrier_address(accepted),
            Some(remote),
            Some(slot),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn carrier_addresses_are_unique_and_never_real() {
        let a = carrier_address(1);
        let b = carrier_address(2);
        assert_ne!(a, b);
        assert_ne!(carrier_address(1 << 40), carrier_address(1));
        let IpAddr::V6(ip) = a.ip() else {
            panic!("carrier addresses are IPv6")
        };
        assert_eq!(ip.segments()[0] & 0xfe00, 0xfc00, "unique-local prefix");
    }

    #[tokio::test]
    async fn a_stream_carries_datagrams_both_ways_with_their_boundaries() {
        let (near, far) = tokio::io::duplex(4096);
        let socket = Arc::new(StreamSocket::new(SocketAddr::from(([0, 0, 0, 0], 0)), None));
        let peer = SocketAddr::from(([127, 0, 0, 1], 4433));
        socket.inner.attach(Box::new(near), peer, None, None);
        let (mut far_read, mut far_write) = tokio::io::split(far);

        for size in [1usize, 1200, 5000] {
            let payload = vec![size as u8; size];
            socket
                .try_send(&Transmit {
                    destination: peer,
                    ecn: None,
                    contents: &payload,
                    segment_size: None,
                    src_ip: None,
                })
                .unwrap();
            let mut prefix = [0u8; 2];
            far_read.read_exact(&mut prefix).await.unwrap();
            assert_eq!(usize::from(u16::from_be_bytes(prefix)), size);
            let mut body = vec![0u8; size];
            far_read.read_exact(&mut body).await.unwrap();
            assert_eq!(body, payload);
        }

        far_write
            .write_all(&[0, 3, 7, 8, 9, 0, 1, 42])
            .await
            .unwrap();
        let mut storage = [[0u8; 2048]; 2];
        let [first, second] = &mut storage;
        let mut bufs = [IoSliceMut::new(first), IoSliceMut::new(second)];
        let mut meta = [RecvMeta::default(); 2];
        let mut got = Vec::new();
        while got.len() < 2 {
            let n = std::future::poll_fn(|cx| socket.poll_recv(cx, &mut bufs, &mut meta))
                .await
                .unwrap();
            for i in 0..n {
                assert_eq!(meta[i].addr, peer);
                got.push(bufs[i][..meta[i].len].to_vec());
            }
        }
        assert_eq!(got, [vec![7, 8, 9], vec![42]]);
    }

    #[tokio::test]
    async fn an_empty_or_oversized_announcement_closes_the_stream() {
        for prefix in [[0u8, 0], [0xff, 0xff]] {
            let (near, far) = tokio::io::duplex(4096);
            let socket = StreamSocket::new(SocketAddr::from(([0, 0, 0, 0], 0)), None);
            let peer = SocketAddr::from(([127, 0, 0, 1], 4433));
            socket.inner.attach(Box::new(near), peer, None, None);
            let (mut far_read, mut far_write) = tokio::io::split(far);
            far_write.write_all(&prefix).await.unwrap();
            // The socket closes its side: the far end reads end of stream.
            let mut rest = Vec::new();
            tokio::time::timeout(Duration::from_secs(5), far_read.read_to_end(&mut rest))
                .await
                .expect("the stream is closed")
                .unwrap();
            assert_eq!(socket.inner.snapshot().streams_malformed, 1);
            assert!(socket.inner.routes().is_empty());
        }
    }
}
