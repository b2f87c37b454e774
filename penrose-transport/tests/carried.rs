//! QUIC carried on TCP streams (`penrose_transport::carrier`), the path Tor takes, tested on
//! plain TCP over loopback: reports are acked once each, every connection has a stream of its
//! own, the server names each stream's TCP peer, and the stream port's bounds hold (malformed
//! announcements, idle streams, the connection limit). The same over a real private Tor network
//! is in `penrose-tor`'s tests.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
use common::report;

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use penrose_core::wire::{Ack, AckStatus, Message, ReportId, ThrottleHint};
use penrose_transport::carrier::TcpDialer;
use penrose_transport::{
    Client, ClientConfig, ClientError, Identity, Limits, Origin, ReportHandler, Reuse, Route,
    Server, ServerConfig, Trust, serve,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

#[derive(Default)]
struct Origins {
    seen: Mutex<Vec<Origin>>,
    reports: Mutex<Vec<ReportId>>,
}

impl ReportHandler for Origins {
    fn arrived_from(&self, origin: Origin) {
        self.seen.lock().unwrap().push(origin);
    }

    async fn handle(&self, body: Vec<u8>) -> Ack {
        let report_id = match Message::decode_body(&body) {
            Ok(Message::Report(r)) => r.report_id,
            _ => ReportId([0; 16]),
        };
        self.reports.lock().unwrap().push(report_id);
        Ack {
            report_id,
            status: AckStatus::Accepted,
            throttle: ThrottleHint::FULL_RATE,
        }
    }
}

async fn start(limits: Limits) -> (Server, Arc<Origins>, Identity) {
    let identity = Identity::self_signed(["localhost"]).unwrap();
    let handler = Arc::new(Origins::default());
    let server = serve(
        ServerConfig {
            listen: "127.0.0.1:0".parse().unwrap(),
            identity: identity.clone(),
            limits: Limits {
                shutdown_grace: Duration::from_millis(200),
                ..limits
            },
            stream_listen: Some("127.0.0.1:0".parse().unwrap()),
        },
        handler.clone(),
    )
    .await
    .unwrap();
    (server, handler, identity)
}

fn carried_config(server: &Server, identity: &Identity) -> ClientConfig {
    let stream_addr = server.stream_addr().expect("the server has a stream port");
    let mut config = ClientConfig::new(server.local_addr(), "localhost", Trust::pin(identity));
    config.route = Route::Carried(Arc::new(TcpDialer(stream_addr)));
    config.connect_timeout = Duration::from_secs(5);
    config.ack_timeout = Duration::from_secs(5);
    config
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn carried_reports_are_acked_once_each_on_streams_of_their_own() {
    let (server, origins, identity) = start(Limits::default()).await;
    let client = Client::new(carried_config(&server, &identity)).unwrap();
    let sent: Vec<_> = (0..12).map(report).collect();
    let mut tasks = Vec::new();
    for report in sent.clone() {
        let client = client.clone();
        tasks.push(tokio::spawn(async move {
            client.send_with_retry(&report).await
        }));
    }
    for (task, report) in tasks.into_iter().zip(&sent) {
        let ack = task.await.unwrap().unwrap();
        assert_eq!(ack.report_id, report.report_id);
        assert_eq!(ack.status, AckStatus::Accepted);
    }
    let mut got = origins.reports.lock().unwrap().clone();
    got.sort();
    let mut want: Vec<_> = sent.iter().map(|r| r.report_id).collect();
    want.sort();
    assert_eq!(got, want, "every report arrived exactly once");

    let seen = origins.seen.lock().unwrap().clone();
    let carriers: HashSet<SocketAddr> = seen.iter().map(|o| o.carrier.unwrap()).collect();
    let connections: HashSet<u64> = seen.iter().map(|o| o.connection).collect();
    let remotes: HashSet<SocketAddr> = seen.iter().map(|o| o.remote).collect();
    assert_eq!(carriers.len(), 12, "each report on a TCP stream of its own");
    assert_eq!(
        connections.len(),
        12,
        "each report on a QUIC connection of its own"
    );
    assert_eq!(
        remotes.len(),
        12,
        "each stream has its own address at the endpoint"
    );
    assert!(carriers.iter().all(|c| c.ip().is_loopback()));
    assert!(
        remotes.iter().all(|r| !r.ip().is_loopback()),
        "the endpoint's peer addresses are the carrier's, not real ones: {remotes:?}"
    );

    let stats = server.stats();
    assert_eq!(stats.carrier.streams, 12);
    assert_eq!(stats.retries_sent, 0, "a TCP stream needs no QUIC Retry");
    assert_eq!(stats.frames_handled, 12);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_direct_client_still_reaches_a_server_with_a_stream_port() {
    let (server, origins, identity) = start(Limits::default()).await;
    let config = ClientConfig::new(server.local_addr(), "localhost", Trust::pin(&identity));
    let client = Client::new(config).unwrap();
    let sent = report(99);
    let ack = client.send_with_retry(&sent).await.unwrap();
    assert_eq!(ack.report_id, sent.report_id);
    assert_eq!(origins.seen.lock().unwrap()[0].carrier, None);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_connection_over_a_carried_route_is_refused() {
    let (server, _origins, identity) = start(Limits::default()).await;
    let config = carried_config(&server, &identity).shared_connection_for_load_testing();
    assert!(matches!(
        Client::new(config),
        Err(ClientError::Unsupported(_))
    ));
    let config = carried_config(&server, &identity);
    assert_eq!(config.reuse(), Reuse::FreshPerReport);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dialer_that_cannot_connect_is_a_retryable_error() {
    // A port nobody listens on: bind one, note it, close it.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = closed.local_addr().unwrap();
    drop(closed);
    let identity = Identity::self_signed(["localhost"]).unwrap();
    let mut config = ClientConfig::new(addr, "localhost", Trust::pin(&identity));
    config.route = Route::Carried(Arc::new(TcpDialer(addr)));
    let client = Client::new(config).unwrap();
    let err = client.send(&report(1)).await.unwrap_err();
    assert!(matches!(err, ClientError::Carrier(_)), "{err}");
    assert!(err.is_retryable());
}

/// Reads until the server closes the stream; fails if it stays open for `within`.
async fn closed_within(stream: &mut TcpStream, within: Duration) {
    let mut sink = Vec::new();
    tokio::time::timeout(within, stream.read_to_end(&mut sink))
        .await
        .expect("the server closes the stream")
        .ok();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_idle_and_excess_streams_are_closed_and_counted() {
    let (server, origins, _identity) = start(Limits {
        max_connections: 2,
        idle_timeout: Duration::from_millis(400),
        ..Limits::default()
    })
    .await;
    let port = server.stream_addr().unwrap();

    // An empty datagram and an oversized one end their streams.
    for prefix in [[0u8, 0], [0xff, 0xff]] {
        let mut stream = TcpStream::connect(port).await.unwrap();
        stream.write_all(&prefix).await.unwrap();
        closed_within(&mut stream, Duration::from_secs(5)).await;
    }
    // A stream that sends nothing is closed after the idle timeout.
    let mut idle = TcpStream::connect(port).await.unwrap();
    let started = std::time::Instant::now();
    closed_within(&mut idle, Duration::from_secs(5)).await;
    assert!(started.elapsed() >= Duration::from_millis(300));
    // So is one that trickles a byte every 100 ms and never completes a datagram.
    let mut trickle = TcpStream::connect(port).await.unwrap();
    let started = std::time::Instant::now();
    trickle.write_all(&[0x04]).await.unwrap();
    for _ in 0..20 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        if trickle.write_all(&[0]).await.is_err() {
            break;
        }
    }
    closed_within(&mut trickle, Duration::from_secs(5)).await;
    assert!(
        started.elapsed() < Duration::from_millis(1_500),
        "a trickle does not keep the stream open: {:?}",
        started.elapsed()
    );

    // With two streams open, a third is closed at once.
    let _a = TcpStream::connect(port).await.unwrap();
    let _b = TcpStream::connect(port).await.unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    let mut third = TcpStream::connect(port).await.unwrap();
    closed_within(&mut third, Duration::from_millis(300)).await;

    let stats = server.stats().carrier;
    assert_eq!(stats.streams_malformed, 2, "{stats:?}");
    assert_eq!(stats.streams_idle, 2, "{stats:?}");
    assert_eq!(stats.streams_refused, 1, "{stats:?}");
    assert!(origins.seen.lock().unwrap().is_empty());
    server.shutdown().await;
}
