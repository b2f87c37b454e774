//! An agent's uploads cannot be linked at the transport layer (docs/transport.md, "What one
//! upload looks like on the wire"): each report comes from its own UDP port on its own
//! connection, no TLS session is resumed and no 0-RTT is possible, no address-validation
//! token is kept, and two uploads share no connection id and no run of bytes on the wire.
//!
//! Each test also runs a control that shows its instrument can see the thing it looks for:
//! the load generator's shared connection, or a server configured with rustls' and quinn's
//! resumption-friendly defaults. Everything runs on 127.0.0.1.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
use common::report;

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use penrose_core::wire::{Ack, AckStatus, Message, ReportId, ThrottleHint};
use penrose_transport::{
    ALPN, Client, ClientConfig, Identity, Limits, Origin, ReportHandler, Reuse, Server,
    ServerConfig, Trust, serve,
};
use quinn::crypto::rustls::{QuicClientConfig, QuicServerConfig};
use tokio::net::UdpSocket;

fn loopback() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

fn accepted(report_id: ReportId) -> Ack {
    Ack {
        report_id,
        status: AckStatus::Accepted,
        throttle: ThrottleHint::FULL_RATE,
    }
}

/// Acks every report and records where each frame came from (the server's view). With
/// `hang_first`, the first call never answers, so its ack times out and the client retries.
#[derive(Default)]
struct Origins {
    seen: Mutex<Vec<Origin>>,
    calls: AtomicUsize,
    hang_first: bool,
}

impl ReportHandler for Origins {
    fn arrived_from(&self, origin: Origin) {
        self.seen.lock().unwrap().push(origin);
    }

    async fn handle(&self, body: Vec<u8>) -> Ack {
        if self.calls.fetch_add(1, Ordering::SeqCst) == 0 && self.hang_first {
            std::future::pending::<()>().await;
        }
        match Message::decode_body(&body) {
            Ok(Message::Report(r)) => accepted(r.report_id),
            _ => accepted(ReportId([0; 16])),
        }
    }
}

async fn start(handler: Origins) -> (Server, Arc<Origins>, Identity) {
    let identity = Identity::self_signed(["localhost"]).unwrap();
    let handler = Arc::new(handler);
    let limits = Limits {
        shutdown_grace: Duration::from_millis(200),
        ..Limits::default()
    };
    let server = serve(
        ServerConfig {
            listen: loopback(),
            identity: identity.clone(),
            limits,
            stream_listen: None,
        },
        handler.clone(),
    )
    .await
    .unwrap();
    (server, handler, identity)
}

fn agent_config(server: SocketAddr, identity: &Identity) -> ClientConfig {
    let mut config = ClientConfig::new(server, "localhost", Trust::pin(identity));
    config.connect_timeout = Duration::from_secs(2);
    config.ack_timeout = Duration::from_secs(5);
    config
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_uploads_arrive_from_different_ports_on_different_connections() {
    let (server, origins, identity) = start(Origins::default()).await;
    let config = agent_config(server.local_addr(), &identity);
    assert_eq!(config.reuse(), Reuse::FreshPerReport, "the default mode");
    let agent = Client::new(config.clone()).unwrap();
    for seed in [1, 2] {
        let sent = report(seed);
        assert_eq!(
            agent.send_with_retry(&sent).await.unwrap(),
            accepted(sent.report_id)
        );
    }
    let seen = origins.seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert_ne!(
        seen[0].remote.port(),
        seen[1].remote.port(),
        "two uploads from one source port: {seen:?}"
    );
    assert_ne!(
        seen[0].connection, seen[1].connection,
        "two uploads on one connection: {seen:?}"
    );
    assert_eq!(server.stats().connections_accepted, 2);

    // Control: the load generator's shared connection is seen by the same instrument.
    origins.seen.lock().unwrap().clear();
    let tool = Client::new(config.shared_connection_for_load_testing()).unwrap();
    for seed in [3, 4] {
        tool.send(&report(seed)).await.unwrap();
    }
    let seen = origins.seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 2);
    assert_eq!(
        seen[0], seen[1],
        "the shared mode links uploads, as documented"
    );
    tool.close().await;
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_dials_a_fresh_connection_from_a_fresh_port() {
    let (server, origins, identity) = start(Origins {
        hang_first: true,
        ..Origins::default()
    })
    .await;
    let mut config = agent_config(server.local_addr(), &identity);
    config.ack_timeout = Duration::from_millis(300);
    config.retry = penrose_transport::RetryPolicy {
        attempts: 3,
        base_delay: Duration::from_millis(50),
        max_delay: Duration::from_millis(100),
        jitter: 0.0,
    };
    let agent = Client::new(config).unwrap();
    let sent = report(5);
    assert_eq!(
        agent.send_with_retry(&sent).await.unwrap(),
        accepted(sent.report_id)
    );
    let seen = origins.seen.lock().unwrap().clone();
    assert_eq!(
        seen.len(),
        2,
        "one attempt hung, the retry was acked: {seen:?}"
    );
    assert_ne!(seen[0].remote.port(), seen[1].remote.port(), "{seen:?}");
    assert_ne!(seen[0].connection, seen[1].connection, "{seen:?}");
    server.shutdown().await;
}

/// A client session store that keeps what rustls gives it (rustls' default in-memory cache)
/// and counts the TLS 1.3 tickets it receives and hands back.
#[derive(Debug)]
struct CountingSessions {
    inner: rustls::client::ClientSessionMemoryCache,
    tickets_received: AtomicUsize,
    tickets_offered: AtomicUsize,
}

impl CountingSessions {
    fn new() -> Arc<CountingSessions> {
        Arc::new(CountingSessions {
            inner: rustls::client::ClientSessionMemoryCache::new(256),
            tickets_received: AtomicUsize::new(0),
            tickets_offered: AtomicUsize::new(0),
        })
    }
}

impl rustls::client::ClientSessionStore for CountingSessions {
    fn set_kx_hint(&self, name: rustls_pki_types::ServerName<'static>, group: rustls::NamedGroup) {
        self.inner.set_kx_hint(name, group);
    }
    fn kx_hint(&self, name: &rustls_pki_types::ServerName<'_>) -> Option<rustls::NamedGroup> {
        self.inner.kx_hint(name)
    }
    fn set_tls12_session(
        &self,
        name: rustls_pki_types::ServerName<'static>,
        value: rustls::client::Tls12ClientSessionValue,
    ) {
        self.inner.set_tls12_session(name, value);
    }
    fn tls12_session(
        &self,
        name: &rustls_pki_types::ServerName<'_>,
    ) -> Option<rustls::client::Tls12ClientSessionValue> {
        self.inner.tls12_session(name)
    }
    fn remove_tls12_session(&self, name: &rustls_pki_types::ServerName<'static>) {
        self.inner.remove_tls12_session(name);
    }
    fn insert_tls13_ticket(
        &self,
        name: rustls_pki_types::ServerName<'static>,
        value: rustls::client::Tls13ClientSessionValue,
    ) {
        self.tickets_received.fetch_add(1, Ordering::SeqCst);
        self.inner.insert_tls13_ticket(name, value);
    }
    fn take_tls13_ticket(
        &self,
        name: &rustls_pki_types::ServerName<'static>,
    ) -> Option<rustls::client::Tls13ClientSessionValue> {
        let ticket = self.inner.take_tls13_ticket(name);
        if ticket.is_some() {
            self.tickets_offered.fetch_add(1, Ordering::SeqCst);
        }
        ticket
    }
}

/// A QUIC token store that keeps tokens (quinn's default cache) and counts them.
struct CountingTokens {
    inner: quinn::TokenMemoryCache,
    received: AtomicUsize,
}

impl quinn::TokenStore for CountingTokens {
    fn insert(&self, server_name: &str, token: bytes::Bytes) {
        self.received.fetch_add(1, Ordering::SeqCst);
        self.inner.insert(server_name, token);
    }
    fn take(&self, server_name: &str) -> Option<bytes::Bytes> {
        self.inner.take(server_name)
    }
}

fn ring() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A client that wants to resume: rustls' default session cache (counted), early data on,
/// quinn's default token cache (counted).
fn hungry_client(
    identity: &Identity,
    sessions: Arc<CountingSessions>,
    tokens: Arc<CountingTokens>,
) -> quinn::ClientConfig {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(identity.certificate().clone()).unwrap();
    let mut tls = rustls::ClientConfig::builder_with_provider(ring())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    tls.alpn_protocols = vec![ALPN.to_vec()];
    tls.enable_early_data = true;
    tls.resumption = rustls::client::Resumption::store(sessions);
    let mut config = quinn::ClientConfig::new(Arc::new(QuicClientConfig::try_from(tls).unwrap()));
    config.token_store(tokens);
    config
}

/// Connects twice with `config`, each time sending one report on a stream and reading the
/// ack (so that tickets and tokens sent after the handshake have arrived). Returns whether
/// the second connection could start 0-RTT (it had a ticket that allows early data).
async fn connect_twice(config: &quinn::ClientConfig, server: SocketAddr) -> bool {
    let endpoint = quinn::Endpoint::client(loopback()).unwrap();
    let mut zero_rtt = false;
    for round in 0..2 {
        let connecting = endpoint
            .connect_with(config.clone(), server, "localhost")
            .unwrap();
        let conn = match connecting.into_0rtt() {
            Ok((conn, accepted)) => {
                assert_eq!(round, 1, "0-RTT on a first connection");
                zero_rtt = true;
                // Wait for the handshake to finish; whether the server took the early data
                // does not matter here.
                let _ = accepted.await;
                conn
            }
            Err(connecting) => connecting.await.unwrap(),
        };
        let sent = report(10 + round);
        let (mut send, mut recv) = conn.open_bi().await.unwrap();
        send.write_all(&Message::Report(sent.clone()).to_frame().unwrap())
            .await
            .unwrap();
        send.finish().unwrap();
        let reply = recv.read_to_end(64).await.unwrap();
        let (ack, _) = Message::decode(&reply).unwrap();
        assert!(matches!(ack, Message::Ack(a) if a.report_id == sent.report_id));
        // Give the post-handshake messages (tickets, NEW_TOKEN) time to be processed.
        tokio::time::sleep(Duration::from_millis(100)).await;
        conn.close(0u32.into(), b"");
    }
    endpoint.wait_idle().await;
    zero_rtt
}

/// Counts the sessions a server stores for resumption (each ticket it issues names one) and
/// the ones clients come back for, around rustls' in-memory server session cache. (Stateful
/// tickets: rustls allows 0-RTT only with those.)
#[derive(Debug)]
struct CountingStore {
    inner: Arc<rustls::server::ServerSessionMemoryCache>,
    issued: AtomicUsize,
    shown: AtomicUsize,
}

impl rustls::server::StoresServerSessions for CountingStore {
    fn put(&self, key: Vec<u8>, value: Vec<u8>) -> bool {
        self.issued.fetch_add(1, Ordering::SeqCst);
        self.inner.put(key, value)
    }
    fn get(&self, key: &[u8]) -> Option<Vec<u8>> {
        self.shown.fetch_add(1, Ordering::SeqCst);
        self.inner.get(key)
    }
    fn take(&self, key: &[u8]) -> Option<Vec<u8>> {
        self.shown.fetch_add(1, Ordering::SeqCst);
        self.inner.take(key)
    }
    fn can_cache(&self) -> bool {
        self.inner.can_cache()
    }
}

/// A server configured the way rustls and quinn would let it be: rustls' session cache and
/// its two tickets per handshake (counted), 0-RTT allowed, two address-validation tokens per
/// connection. It acks every report it reads, so that a penrose client can upload to it.
async fn resuming_server(identity: &Identity) -> (SocketAddr, Arc<CountingStore>) {
    let store = Arc::new(CountingStore {
        inner: rustls::server::ServerSessionMemoryCache::new(256),
        issued: AtomicUsize::new(0),
        shown: AtomicUsize::new(0),
    });
    let mut tls = rustls::ServerConfig::builder_with_provider(ring())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(identity.chain().to_vec(), identity.key().clone_key())
        .unwrap();
    tls.alpn_protocols = vec![ALPN.to_vec()];
    tls.session_storage = store.clone();
    tls.max_early_data_size = u32::MAX;
    let mut config =
        quinn::ServerConfig::with_crypto(Arc::new(QuicServerConfig::try_from(tls).unwrap()));
    let mut tokens = quinn::ValidationTokenConfig::default();
    tokens.sent(2);
    config.validation_token_config(tokens);
    let endpoint = quinn::Endpoint::server(config, loopback()).unwrap();
    let addr = endpoint.local_addr().unwrap();
    tokio::spawn(async move {
        while let Some(incoming) = endpoint.accept().await {
            tokio::spawn(async move {
                let Ok(conn) = incoming.await else { return };
                while let Ok((mut send, mut recv)) = conn.accept_bi().await {
                    let Ok(frame) = recv.read_to_end(16 * 1024).await else {
                        continue;
                    };
                    let Ok((Message::Report(r), _)) = Message::decode(&frame) else {
                        continue;
                    };
                    let ack = Message::Ack(accepted(r.report_id)).to_frame().unwrap();
                    let _ = send.write_all(&ack).await;
                    let _ = send.finish();
                    let _ = send.stopped().await;
                }
            });
        }
    });
    (addr, store)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_issues_no_ticket_and_no_token_so_nothing_resumes() {
    let (server, _, identity) = start(Origins::default()).await;
    let sessions = CountingSessions::new();
    let tokens = Arc::new(CountingTokens {
        inner: quinn::TokenMemoryCache::default(),
        received: AtomicUsize::new(0),
    });
    let hungry = hungry_client(&identity, sessions.clone(), tokens.clone());
    let zero_rtt = connect_twice(&hungry, server.local_addr()).await;
    assert!(!zero_rtt, "the second connection could start 0-RTT");
    assert_eq!(
        sessions.tickets_received.load(Ordering::SeqCst),
        0,
        "a ticket was issued"
    );
    assert_eq!(sessions.tickets_offered.load(Ordering::SeqCst), 0);
    assert_eq!(
        tokens.received.load(Ordering::SeqCst),
        0,
        "a NEW_TOKEN was sent"
    );
    assert_eq!(server.stats().connections_accepted, 2);
    server.shutdown().await;

    // Control: against a server left with rustls' and quinn's resumption-friendly settings,
    // the same client gets tickets and tokens, offers a ticket and can start 0-RTT.
    let (control, store) = resuming_server(&identity).await;
    let sessions = CountingSessions::new();
    let tokens = Arc::new(CountingTokens {
        inner: quinn::TokenMemoryCache::default(),
        received: AtomicUsize::new(0),
    });
    let hungry = hungry_client(&identity, sessions.clone(), tokens.clone());
    assert!(
        connect_twice(&hungry, control).await,
        "the control allowed no 0-RTT"
    );
    assert!(sessions.tickets_received.load(Ordering::SeqCst) > 0);
    assert!(sessions.tickets_offered.load(Ordering::SeqCst) > 0);
    assert!(store.shown.load(Ordering::SeqCst) > 0);
    assert!(tokens.received.load(Ordering::SeqCst) > 0);
}

/// Datagrams between one client and the server, as a relay on loopback saw them.
#[derive(Clone, Debug)]
struct Datagram {
    phase: usize,
    to_server: bool,
    bytes: Vec<u8>,
}

/// A UDP relay on 127.0.0.1 between clients and `server`, recording every datagram in both
/// directions with the phase (the upload) the test is in. Each client address gets its own
/// upstream socket, so the server sees one address per client address.
struct Relay {
    addr: SocketAddr,
    phase: Arc<AtomicUsize>,
    log: Arc<Mutex<Vec<Datagram>>>,
}

async fn start_relay(server: SocketAddr) -> Relay {
    let front = Arc::new(UdpSocket::bind(loopback()).await.unwrap());
    let addr = front.local_addr().unwrap();
    let phase = Arc::new(AtomicUsize::new(0));
    let log = Arc::new(Mutex::new(Vec::new()));
    let (p, l) = (phase.clone(), log.clone());
    tokio::spawn(async move {
        let mut upstream: HashMap<SocketAddr, Arc<UdpSocket>> = HashMap::new();
        let mut buf = vec![0u8; 65_536];
        loop {
            let Ok((n, from)) = front.recv_from(&mut buf).await else {
                return;
            };
            l.lock().unwrap().push(Datagram {
                phase: p.load(Ordering::SeqCst),
                to_server: true,
                bytes: buf[..n].to_vec(),
            });
            let up = match upstream.get(&from) {
                Some(up) => up.clone(),
                None => {
                    let up = Arc::new(UdpSocket::bind(loopback()).await.unwrap());
                    up.connect(server).await.unwrap();
                    upstream.insert(from, up.clone());
                    let (front, up2, p, l) = (front.clone(), up.clone(), p.clone(), l.clone());
                    tokio::spawn(async move {
                        let mut buf = vec![0u8; 65_536];
                        while let Ok(n) = up2.recv(&mut buf).await {
                            l.lock().unwrap().push(Datagram {
                                phase: p.load(Ordering::SeqCst),
                                to_server: false,
                                bytes: buf[..n].to_vec(),
                            });
                            let _ = front.send_to(&buf[..n], from).await;
                        }
                    });
                    up
                }
            };
            let _ = up.send(&buf[..n]).await;
        }
    });
    Relay { addr, phase, log }
}

impl Relay {
    fn datagrams(&self, phase: usize, to_server: bool) -> Vec<Vec<u8>> {
        self.log
            .lock()
            .unwrap()
            .iter()
            .filter(|d| d.phase == phase && d.to_server == to_server)
            .map(|d| d.bytes.clone())
            .collect()
    }
}

/// A QUIC variable-length integer at `at`: (value, bytes used).
fn varint(bytes: &[u8], at: usize) -> Option<(u64, usize)> {
    let first = *bytes.get(at)?;
    let len = 1usize << (first >> 6);
    let mut value = u64::from(first & 0x3f);
    for i in 1..len {
        value = (value << 8) | u64::from(*bytes.get(at + i)?);
    }
    Some((value, len))
}

/// What the cleartext headers of the packets in one datagram show (RFC 9000, section 17).
#[derive(Debug, Default)]
struct Headers {
    /// Destination and source connection ids of long-header packets.
    long_cids: Vec<Vec<u8>>,
    /// Tokens of Initial packets (empty when there is none).
    initial_tokens: Vec<Vec<u8>>,
    /// Tokens of Retry packets (the server's, to validate the client's address).
    retry_tokens: Vec<Vec<u8>>,
    /// Whether a short-header (1-RTT) packet is in the datagram; its destination connection
    /// id is the first bytes after the first byte, of a length the peer chose.
    short: bool,
}

fn parse(datagram: &[u8]) -> Headers {
    let mut headers = Headers::default();
    let mut at = 0;
    while at < datagram.len() {
        let first = datagram[at];
        if first & 0x80 == 0 {
            headers.short = true;
            break;
        }
        let mut p = at + 5; // first byte, version
        let dcid_len = usize::from(datagram[p]);
        headers
            .long_cids
            .push(datagram[p + 1..p + 1 + dcid_len].to_vec());
        p += 1 + dcid_len;
        let scid_len = usize::from(datagram[p]);
        headers
            .long_cids
            .push(datagram[p + 1..p + 1 + scid_len].to_vec());
        p += 1 + scid_len;
        match (first >> 4) & 0x3 {
            0 => {
                let (token_len, used) = varint(datagram, p).unwrap();
                let token = &datagram[p + used..p + used + token_len as usize];
                headers.initial_tokens.push(token.to_vec());
                p += used + token_len as usize;
            }
            3 => {
                // Retry: the rest is the retry token and a 16-byte integrity tag.
                headers
                    .retry_tokens
                    .push(datagram[p..datagram.len() - 16].to_vec());
                break;
            }
            _ => {}
        }
        let (length, used) = varint(datagram, p).unwrap();
        at = p + used + length as usize;
    }
    headers
}

/// Every connection id in the cleartext headers of one upload's datagrams: the long headers'
/// DCID and SCID both ways, and the DCID of the client's short-header packets (as long as the
/// server's SCID in its long headers, which is the id the server chose for itself).
fn connection_ids(relay: &Relay, phase: usize) -> HashSet<Vec<u8>> {
    let mut ids = HashSet::new();
    for d in relay.datagrams(phase, false) {
        ids.extend(parse(&d).long_cids);
    }
    let server_cid_len = server_cid_len(relay, phase);
    for d in relay.datagrams(phase, true) {
        let h = parse(&d);
        ids.extend(h.long_cids);
        if h.short {
            // A short-header packet is the last in its datagram; find where it starts.
            let start = short_start(&d);
            ids.insert(d[start + 1..start + 1 + server_cid_len].to_vec());
        }
    }
    ids.retain(|id| !id.is_empty());
    ids
}

/// The length of the connection ids the server chose for itself: its SCID in the long
/// headers it sent in `phase`.
fn server_cid_len(relay: &Relay, phase: usize) -> usize {
    relay
        .datagrams(phase, false)
        .iter()
        .find_map(|d| parse(d).long_cids.get(1).map(Vec::len))
        .expect("the server answered in long headers")
}

fn short_start(datagram: &[u8]) -> usize {
    let mut at = 0;
    while datagram[at] & 0x80 != 0 {
        let mut p = at + 5;
        p += 1 + usize::from(datagram[p]);
        p += 1 + usize::from(datagram[p]);
        if (datagram[at] >> 4) & 0x3 == 0 {
            let (token_len, used) = varint(datagram, p).unwrap();
            p += used + token_len as usize;
        }
        let (length, used) = varint(datagram, p).unwrap();
        at = p + used + length as usize;
    }
    at
}

/// Length of the runs of bytes compared between uploads.
const RUN: usize = 16;

/// The 16-byte runs of one upload's client-to-server datagrams that also occur in another's.
fn shared_runs(first: &[Vec<u8>], second: &[Vec<u8>]) -> Vec<Vec<u8>> {
    let runs: HashSet<&[u8]> = first.iter().flat_map(|d| d.windows(RUN)).collect();
    let mut shared: Vec<Vec<u8>> = second
        .iter()
        .flat_map(|d| d.windows(RUN))
        .filter(|w| runs.contains(w))
        .map(<[u8]>::to_vec)
        .collect();
    shared.dedup();
    shared
}

/// Sends reports `seeds` through `relay`, one per phase, waiting between them until the
/// previous upload's connection has gone quiet (its close sent), so that no datagram of one
/// upload is counted with the next.
async fn upload_through(relay: &Relay, client: &Client, seeds: &[u64]) {
    for (phase, seed) in seeds.iter().enumerate() {
        relay.phase.store(phase, Ordering::SeqCst);
        let sent = report(*seed);
        let ack = client.send(&sent).await.unwrap();
        assert_eq!(ack.report_id, sent.report_id);
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_uploads_share_no_connection_id_and_no_bytes_on_the_wire() {
    let (server, _, identity) = start(Origins::default()).await;
    let relay = start_relay(server.local_addr()).await;
    let agent = Client::new(agent_config(relay.addr, &identity)).unwrap();
    upload_through(&relay, &agent, &[21, 22]).await;

    let (a, b) = (connection_ids(&relay, 0), connection_ids(&relay, 1));
    assert!(!a.is_empty() && !b.is_empty());
    let common: Vec<_> = a.intersection(&b).collect();
    assert!(
        common.is_empty(),
        "connection ids in both uploads: {common:02x?}"
    );
    // The server validates each client address with a Retry (Limits::require_address_
    // validation): the client's second Initial of the same upload echoes that Retry's token.
    // Every Initial token is the Retry token of its own upload, and no upload shows one that
    // was issued in another: a Retry token is good for one connection attempt and is never
    // kept (nothing like a NEW_TOKEN, which would be carried to the next connection).
    let mut retry_tokens = Vec::new();
    for phase in [0, 1] {
        let issued: Vec<Vec<u8>> = relay
            .datagrams(phase, false)
            .iter()
            .flat_map(|d| parse(d).retry_tokens)
            .collect();
        assert_eq!(issued.len(), 1, "one Retry per upload");
        for d in relay.datagrams(phase, true) {
            for token in parse(&d).initial_tokens {
                assert!(
                    token.is_empty() || token == issued[0],
                    "an Initial with a token that is not this upload's Retry token"
                );
            }
        }
        retry_tokens.push(issued[0].clone());
    }
    assert_ne!(retry_tokens[0], retry_tokens[1]);
    // No exemptions are needed, and none are made: QUIC encrypts every packet, the Initial
    // ones too (with keys derived from the client's random initial DCID, RFC 9001 section
    // 5.2), so the ClientHello with its ALPN and server name never appears in clear, and
    // the cleartext left (first byte, version, lengths) is shorter than a run.
    let shared = shared_runs(&relay.datagrams(0, true), &relay.datagrams(1, true));
    assert!(
        shared.is_empty(),
        "{} runs of {RUN} bytes in both uploads, the first: {:02x?}",
        shared.len(),
        shared.first()
    );

    // Control: the load generator's two uploads on one connection share connection ids, and
    // the instrument sees it.
    let relay = start_relay(server.local_addr()).await;
    let tool =
        Client::new(agent_config(relay.addr, &identity).shared_connection_for_load_testing())
            .unwrap();
    upload_through(&relay, &tool, &[23, 24]).await;
    // The second upload needs no handshake, so it has only short headers.
    let len = server_cid_len(&relay, 0);
    let second: HashSet<Vec<u8>> = relay
        .datagrams(1, true)
        .iter()
        .filter(|d| d[0] & 0x80 == 0)
        .map(|d| d[1..1 + len].to_vec())
        .collect();
    let first = connection_ids(&relay, 0);
    assert!(
        second.iter().any(|id| first.contains(id)),
        "the shared connection's ids were not seen again"
    );
    tool.close().await;
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_client_resumes_nothing_even_when_a_server_offers_it() {
    let identity = Identity::self_signed(["localhost"]).unwrap();
    let (control, store) = resuming_server(&identity).await;
    let relay = start_relay(control).await;
    let agent = Client::new(agent_config(relay.addr, &identity)).unwrap();
    upload_through(&relay, &agent, &[31, 32]).await;
    assert!(
        store.issued.load(Ordering::SeqCst) > 0,
        "the control server issued tickets"
    );
    assert_eq!(
        store.shown.load(Ordering::SeqCst),
        0,
        "the agent's client offered a session ticket"
    );
    // (The control server sends no Retry, so any token here would be a kept NEW_TOKEN.)
    for d in relay.datagrams(1, true) {
        assert!(
            parse(&d).initial_tokens.iter().all(Vec::is_empty),
            "the agent's second upload showed an address-validation token"
        );
    }

    // Control: a client that keeps tokens shows one on its second connection, in the
    // Initial's token field that the check above reads.
    let sessions = CountingSessions::new();
    let tokens = Arc::new(CountingTokens {
        inner: quinn::TokenMemoryCache::default(),
        received: AtomicUsize::new(0),
    });
    let relay = start_relay(control).await;
    let hungry = hungry_client(&identity, sessions, tokens);
    relay.phase.store(0, Ordering::SeqCst);
    connect_twice(&hungry, relay.addr).await;
    let with_token = relay
        .datagrams(0, true)
        .iter()
        .flat_map(|d| parse(d).initial_tokens)
        .filter(|token| !token.is_empty())
        .count();
    assert!(with_token > 0, "the control client's token was not seen");
}
