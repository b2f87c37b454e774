//! Connection floods on loopback: what a peer that opens connections it never completes, or
//! opens too many, can and cannot take from the server (docs/threat-model.md, "Abusive
//! clients").
//!
//! A second host is played by 127.0.0.2 (Linux routes all of 127/8 to loopback). A relay in
//! front of the server stands for a peer that cannot receive at its address (a spoofed one)
//! or that stops answering in the middle of a handshake: it forwards what clients send and
//! drops what the server answers, all of it or everything after the first datagram (the
//! Retry). Each test that shows a limit working also runs the control that shows what
//! happens without it, or shows the same measurement failing first.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
use common::report;

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::num::NonZeroU32;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use penrose_core::wire::{Ack, AckStatus, Message, ReportId, ThrottleHint};
use penrose_transport::{
    ALPN, Client, ClientConfig, ClientError, Identity, Limits, ReportHandler, RetryPolicy, Server,
    ServerConfig, ServerStats, Trust, serve,
};
use tokio::net::UdpSocket;

const SECOND_HOST: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2));

/// Acks every report it reads and counts them.
#[derive(Default)]
struct Counter {
    handled: AtomicUsize,
}

impl ReportHandler for Counter {
    async fn handle(&self, body: Vec<u8>) -> Ack {
        self.handled.fetch_add(1, Ordering::SeqCst);
        let report_id = match Message::decode_body(&body) {
            Ok(Message::Report(r)) => r.report_id,
            _ => ReportId([0; 16]),
        };
        Ack {
            report_id,
            status: AckStatus::Accepted,
            throttle: ThrottleHint::FULL_RATE,
        }
    }
}

struct Fixture {
    server: Server,
    handler: Arc<Counter>,
    identity: Identity,
}

async fn start(limits: Limits) -> Fixture {
    let identity = Identity::self_signed(["localhost"]).unwrap();
    let handler = Arc::new(Counter::default());
    let server = serve(
        ServerConfig {
            listen: "127.0.0.1:0".parse().unwrap(),
            identity: identity.clone(),
            limits: Limits {
                shutdown_grace: Duration::from_millis(200),
                ..limits
            },
            stream_listen: None,
        },
        handler.clone(),
    )
    .await
    .unwrap();
    Fixture {
        server,
        handler,
        identity,
    }
}

impl Fixture {
    /// An agent's client on `local` (None: 127.0.0.1), one attempt per send.
    fn client_from(&self, local: Option<IpAddr>) -> Client {
        let mut config = ClientConfig::new(
            self.server.local_addr(),
            "localhost",
            Trust::pin(&self.identity),
        );
        config.connect_timeout = Duration::from_secs(2);
        config.ack_timeout = Duration::from_secs(5);
        config.retry = RetryPolicy::none();
        config.local_ip = local;
        Client::new(config).unwrap()
    }

    /// A tool's client on `local` holding one connection open.
    async fn connection_from(&self, local: IpAddr) -> Result<Client, ClientError> {
        let mut config = ClientConfig::new(
            self.server.local_addr(),
            "localhost",
            Trust::pin(&self.identity),
        );
        config.connect_timeout = Duration::from_secs(2);
        config.local_ip = Some(local);
        Client::connect(config.shared_connection_for_load_testing()).await
    }

    /// A bare quinn client configuration (ALPN penrose/1, trusting the fixture's
    /// certificate) for peers that start handshakes and never finish them.
    fn quinn_client(&self) -> quinn::ClientConfig {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(self.identity.certificate().clone()).unwrap();
        let mut tls = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
        tls.alpn_protocols = vec![ALPN.to_vec()];
        let crypto = quinn::crypto::rustls::QuicClientConfig::try_from(tls).unwrap();
        quinn::ClientConfig::new(Arc::new(crypto))
    }
}

/// The server's stats once `done` holds, or the last ones after `limit`.
async fn eventually(
    server: &Server,
    limit: Duration,
    done: impl Fn(&ServerStats) -> bool,
) -> ServerStats {
    let end = Instant::now() + limit;
    while Instant::now() < end {
        let stats = server.stats();
        if done(&stats) {
            return stats;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    server.stats()
}

fn is_refused(result: &Result<Ack, ClientError>) -> bool {
    matches!(
        result,
        Err(ClientError::Connection(quinn::ConnectionError::ConnectionClosed(close)))
            if close.error_code == quinn::TransportErrorCode::CONNECTION_REFUSED
    )
}

/// What the relay does with the server's datagrams.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Back {
    /// Drops them all: a peer that cannot receive at its address (spoofed).
    DropAll,
    /// Passes the first one of each client (the Retry) and drops the rest: a peer that
    /// validates its address and then stops answering mid-handshake.
    PassFirst,
}

/// A UDP relay on 127.0.0.1 that forwards each client's datagrams to `server` from its own
/// socket on `upstream` (so the server sees that address) and treats the answers as `back`
/// says. Returns its address.
async fn start_relay(server: SocketAddr, upstream: IpAddr, back: Back) -> SocketAddr {
    let front = Arc::new(UdpSocket::bind("127.0.0.1:0").await.unwrap());
    let addr = front.local_addr().unwrap();
    tokio::spawn(async move {
        let mut flows: HashMap<SocketAddr, Arc<UdpSocket>> = HashMap::new();
        let mut buf = vec![0u8; 65_536];
        loop {
            let Ok((n, from)) = front.recv_from(&mut buf).await else {
                return;
            };
            let up = match flows.get(&from) {
                Some(up) => up.clone(),
                None => {
                    let up = Arc::new(UdpSocket::bind((upstream, 0)).await.unwrap());
                    up.connect(server).await.unwrap();
                    flows.insert(from, up.clone());
                    let (front, up2) = (front.clone(), up.clone());
                    tokio::spawn(async move {
                        let mut buf = vec![0u8; 65_536];
                        let mut answered = 0;
                        while let Ok(n) = up2.recv(&mut buf).await {
                            if back == Back::PassFirst && answered == 0 {
                                let _ = front.send_to(&buf[..n], from).await;
                            }
                            answered += 1;
                        }
                    });
                    up
                }
            };
            let _ = up.send(&buf[..n]).await;
        }
    });
    addr
}

/// Starts `attempts` connection attempts from one quinn endpoint through `relay` and leaves
/// each after `patience`; returns once all are left.
async fn attempts_through(
    config: quinn::ClientConfig,
    relay: SocketAddr,
    attempts: usize,
    patience: Duration,
) {
    let endpoint = quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).unwrap();
    let mut tasks = Vec::new();
    for _ in 0..attempts {
        let connecting = endpoint
            .connect_with(config.clone(), relay, "localhost")
            .unwrap();
        tasks.push(tokio::spawn(async move {
            let result = tokio::time::timeout(patience, connecting).await;
            assert!(
                !matches!(result, Ok(Ok(_))),
                "a handshake through the relay completed"
            );
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
}

/// A flood of connection attempts from an address that never receives: with address
/// validation each costs the server one Retry and nothing else, no slot is taken, and an
/// agent keeps delivering through it. Control: without validation the same flood holds every
/// slot for the handshake timeout and the agent is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unvalidated_addresses_get_a_retry_and_take_no_slot() {
    let limits = Limits {
        max_connections: 4,
        handshake_timeout: Duration::from_secs(10),
        ..Limits::default()
    };
    let fx = start(limits.clone()).await;
    let relay = start_relay(fx.server.local_addr(), SECOND_HOST, Back::DropAll).await;
    let flood = tokio::spawn(attempts_through(
        fx.quinn_client(),
        relay,
        1_000,
        Duration::from_millis(1_500),
    ));
    // While it runs, an agent delivers one report after another from 127.0.0.1, each once
    // the server has let go of the one before (so that only the flood could fill the slots).
    // Datagrams can be lost while a thousand handshakes' Initials fill the server's socket
    // buffer, so the agent retries lost handshakes as it always does; refusals it would not
    // survive, and there are none.
    let mut agent = fx.client_from(None);
    agent = {
        let mut config = agent.config().clone();
        config.retry = RetryPolicy {
            attempts: 5,
            base_delay: Duration::from_millis(50),
            max_delay: Duration::from_millis(200),
            jitter: 0.0,
        };
        Client::new(config).unwrap()
    };
    let mut delivered = 0;
    while !flood.is_finished() {
        let sent = report(1_000 + delivered);
        let ack = agent
            .send_with_retry(&sent)
            .await
            .expect("the agent is served");
        assert_eq!(ack.report_id, sent.report_id);
        delivered += 1;
        let stats = eventually(&fx.server, Duration::from_secs(2), |s| {
            s.connections_open == 0
        })
        .await;
        assert_eq!(stats.connections_open, 0);
    }
    flood.await.unwrap();
    let stats = fx.server.stats();
    assert!(
        stats.retries_sent >= 1_000,
        "every attempt got a Retry: {stats:?}"
    );
    assert_eq!(stats.connections_refused, 0, "{stats:?}");
    assert_eq!(stats.handshake_timeouts, 0, "{stats:?}");
    assert!(delivered > 0);
    // Every connection the server accepted was one of the agent's (a handshake the agent
    // gave up on may still have completed), and none was refused.
    assert!(
        (delivered..=2 * delivered).contains(&stats.connections_accepted),
        "{delivered} delivered: {stats:?}"
    );
    assert!(fx.handler.handled.load(Ordering::SeqCst) as u64 >= delivered);
    fx.server.shutdown().await;

    // Control: the same flood against a server that does not validate addresses takes every
    // slot, and the agent is refused.
    let fx = start(Limits {
        require_address_validation: false,
        ..limits
    })
    .await;
    let relay = start_relay(fx.server.local_addr(), SECOND_HOST, Back::DropAll).await;
    let endpoint = quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).unwrap();
    let pending: Vec<_> = (0..8)
        .map(|_| {
            endpoint
                .connect_with(fx.quinn_client(), relay, "localhost")
                .unwrap()
        })
        .collect();
    let stats = eventually(&fx.server, Duration::from_secs(5), |s| {
        s.connections_refused >= 4
    })
    .await;
    assert!(stats.connections_refused >= 4, "{stats:?}");
    let refused = fx.client_from(None).send(&report(1)).await;
    assert!(is_refused(&refused), "{refused:?}");
    assert_eq!(fx.server.stats().retries_sent, 0);
    drop(pending);
    fx.server.shutdown().await;
}

/// A peer that validates its address and then goes silent mid-handshake holds a slot only
/// for the handshake timeout (here 600 ms), not for the idle timeout (30 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_handshake_gives_its_slot_back_after_the_handshake_timeout() {
    let fx = start(Limits {
        max_connections: 2,
        handshake_timeout: Duration::from_millis(600),
        idle_timeout: Duration::from_secs(30),
        ..Limits::default()
    })
    .await;
    // Two stalled peers, each its own flow through the relay (so each gets its Retry).
    let mut stalled = Vec::new();
    for _ in 0..2 {
        let relay = start_relay(fx.server.local_addr(), SECOND_HOST, Back::PassFirst).await;
        let endpoint = quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).unwrap();
        stalled.push((
            endpoint
                .connect_with(fx.quinn_client(), relay, "localhost")
                .unwrap(),
            endpoint,
        ));
    }
    let started = Instant::now();
    let stats = eventually(&fx.server, Duration::from_secs(2), |s| s.retries_sent >= 2).await;
    assert_eq!(stats.retries_sent, 2, "{stats:?}");
    // The validated second Initials arrive right after the Retries; give them a moment.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let agent = fx.client_from(None);
    let refused = agent.send(&report(7)).await;
    assert!(
        is_refused(&refused),
        "both slots are held by the stalled handshakes: {refused:?}"
    );
    let stats = eventually(&fx.server, Duration::from_secs(5), |s| {
        s.handshake_timeouts >= 2
    })
    .await;
    let held = started.elapsed();
    assert_eq!(stats.handshake_timeouts, 2, "{stats:?}");
    assert!(held < Duration::from_secs(3), "slots held for {held:?}");
    let sent = report(8);
    let ack = agent
        .send(&sent)
        .await
        .expect("a slot is free once the stalled handshakes were abandoned");
    assert_eq!(ack.report_id, sent.report_id);
    assert_eq!(fx.server.stats().connections_accepted, 1);
    drop(stalled);
    fx.server.shutdown().await;
}

/// One source may hold at most `max_connections_per_source` connections: the next is refused
/// before it takes a slot, other sources are still served, and a closed connection frees its
/// source's place.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_source_cannot_take_every_slot() {
    let fx = start(Limits {
        max_connections: 8,
        max_connections_per_source: 3,
        ..Limits::default()
    })
    .await;
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(fx.connection_from(SECOND_HOST).await.unwrap());
    }
    let fourth = fx.connection_from(SECOND_HOST).await;
    assert!(
        matches!(
            fourth,
            Err(ClientError::Connection(quinn::ConnectionError::ConnectionClosed(ref close)))
                if close.error_code == quinn::TransportErrorCode::CONNECTION_REFUSED
        ),
        "{:?}",
        fourth.err()
    );
    let stats = fx.server.stats();
    assert_eq!(
        (stats.refused_source_open, stats.connections_refused),
        (1, 0),
        "{stats:?}"
    );
    // Another source is served while the first holds its three.
    let agent = fx.client_from(None);
    for seed in 0..5 {
        let ack = agent.send(&report(seed)).await.unwrap();
        assert_eq!(ack.status, AckStatus::Accepted);
    }
    for client in &held {
        assert_eq!(
            client.send(&report(50)).await.unwrap().status,
            AckStatus::Accepted
        );
    }
    // Closing one gives the source its place back (once the server has seen the close).
    held.pop().unwrap().close().await;
    let mut again = None;
    for _ in 0..50 {
        if let Ok(client) = fx.connection_from(SECOND_HOST).await {
            again = Some(client);
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let again = again.expect("a closed connection frees its source's place");
    assert_eq!(
        again.send(&report(51)).await.unwrap().status,
        AckStatus::Accepted
    );
    fx.server.shutdown().await;
}

/// A source that opens connections faster than `new_connections_per_source_per_second` has
/// the excess refused, counted; another source's allowance is its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_source_opening_connections_too_fast_is_refused_and_others_are_not() {
    let fx = start(Limits {
        new_connections_per_source_per_second: NonZeroU32::new(5),
        ..Limits::default()
    })
    .await;
    let fast = fx.client_from(Some(SECOND_HOST));
    let burst: Vec<_> = (0..20)
        .map(|seed| {
            let fast = fast.clone();
            tokio::spawn(async move { fast.send(&report(100 + seed)).await })
        })
        .collect();
    let mut outcomes = Vec::new();
    for task in burst {
        outcomes.push(task.await.unwrap());
    }
    let refused = outcomes.iter().filter(|o| is_refused(o)).count();
    let accepted = outcomes
        .iter()
        .filter(|o| matches!(o, Ok(a) if a.status == AckStatus::Accepted))
        .count();
    assert_eq!(refused + accepted, 20, "{outcomes:?}");
    // Five at once, and at most a few more as the bucket refills while the burst arrives.
    assert!((5..=10).contains(&accepted), "{accepted} accepted");
    let stats = fx.server.stats();
    assert_eq!(stats.refused_source_rate, refused as u64, "{stats:?}");
    // 127.0.0.1 has its own five.
    let agent = fx.client_from(None);
    for seed in 0..5 {
        let ack = agent.send(&report(200 + seed)).await.unwrap();
        assert_eq!(ack.status, AckStatus::Accepted);
    }
    // And the fast source gets more once its bucket has refilled.
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let ack = fast.send(&report(300)).await.unwrap();
    assert_eq!(ack.status, AckStatus::Accepted);
    fx.server.shutdown().await;
}
