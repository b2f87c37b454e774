//! The transport end to end on loopback: real QUIC, real TLS, a handler that records and
//! deduplicates what it is given, and peers that misbehave in each way the server must survive.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
use common::report;

use std::collections::HashMap;
use std::net::{SocketAddr, UdpSocket};
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use penrose_core::counters::BIN_COUNT;
use penrose_core::paillier::{KeySize, Keypair};
use penrose_core::wire::{
    Ack, AckStatus, MAX_FRAME_BODY, Message, PackedBytes, RejectReason, Report, ReportId,
    ThrottleHint,
};
use penrose_transport::{
    ALPN, Client, ClientConfig, ClientError, Encoding, Identity, Limits, ReportHandler,
    RetryPolicy, Server, ServerConfig, ServerStats, Trust, UNREAD_REPORT_ID, serve,
};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha20Rng;

/// Records every report it is given, answers Duplicate for a report id it has, and can be
/// told to be slow on the first delivery (to lose that ack) or to reject everything.
#[derive(Default)]
struct Recorder {
    reports: Mutex<HashMap<ReportId, Report>>,
    calls: AtomicUsize,
    slow_first: Option<Duration>,
    hang_first: bool,
    reject: Option<RejectReason>,
}

const THROTTLE: u16 = 750;

fn ack(report_id: ReportId, status: AckStatus) -> Ack {
    Ack {
        report_id,
        status,
        throttle: ThrottleHint::from_permille(THROTTLE).unwrap(),
    }
}

impl ReportHandler for Recorder {
    async fn handle(&self, body: Vec<u8>) -> Ack {
        let call = self.calls.fetch_add(1, Ordering::SeqCst);
        if call == 0 && self.hang_first {
            // A server that took the report and then went silent, like one that was killed.
            std::future::pending::<()>().await;
        }
        let report = match Message::decode_body(&body) {
            Ok(Message::Report(report)) => report,
            Ok(Message::Ack(_) | Message::KeyListRequest | Message::KeyList(_)) => {
                return ack(
                    UNREAD_REPORT_ID,
                    AckStatus::Rejected(RejectReason::Malformed),
                );
            }
            Err(e) => return ack(UNREAD_REPORT_ID, AckStatus::Rejected(e.reject_reason())),
        };
        let id = report.report_id;
        if let Some(reason) = self.reject {
            return ack(id, AckStatus::Rejected(reason));
        }
        let fresh = self.reports.lock().unwrap().insert(id, report).is_none();
        if let (0, Some(delay)) = (call, self.slow_first) {
            tokio::time::sleep(delay).await;
        }
        ack(
            id,
            if fresh {
                AckStatus::Accepted
            } else {
                AckStatus::Duplicate
            },
        )
    }
}

impl Recorder {
    fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }
    fn stored(&self) -> usize {
        self.reports.lock().unwrap().len()
    }
}

fn loopback() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

struct Fixture {
    server: Server,
    handler: Arc<Recorder>,
    identity: Identity,
}

async fn start(limits: Limits, handler: Recorder) -> Fixture {
    start_on(loopback(), limits, handler).await
}

async fn start_on(listen: SocketAddr, limits: Limits, handler: Recorder) -> Fixture {
    let identity = Identity::self_signed(["localhost"]).unwrap();
    let handler = Arc::new(handler);
    let server = serve(
        ServerConfig {
            listen,
            identity: identity.clone(),
            limits,
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
    fn client_config(&self) -> ClientConfig {
        let mut config = ClientConfig::new(
            self.server.local_addr(),
            "localhost",
            Trust::pin(&self.identity),
        );
        config.connect_timeout = Duration::from_secs(2);
        config.ack_timeout = Duration::from_secs(5);
        config
    }

    /// An agent's client: a fresh connection per report.
    async fn client(&self) -> Client {
        Client::connect(self.client_config()).await.unwrap()
    }

    /// A tool's client: one connection for all its reports (links them; tests of streams,
    /// pacing and connection limits need it).
    async fn shared_client(&self) -> Client {
        Client::connect(self.client_config().shared_connection_for_load_testing())
            .await
            .unwrap()
    }
}

/// The server's stats once `done` holds, or the last ones after two seconds.
async fn eventually(server: &Server, done: impl Fn(&ServerStats) -> bool) -> ServerStats {
    for _ in 0..200 {
        let stats = server.stats();
        if done(&stats) {
            return stats;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    server.stats()
}

fn rejected(ack: &Ack, reason: RejectReason) {
    assert_eq!(ack.status, AckStatus::Rejected(reason), "{ack:?}");
    assert_eq!(ack.report_id, UNREAD_REPORT_ID);
}

#[tokio::test]
async fn a_paillier_report_round_trips_to_the_handler() {
    let fx = start(Limits::default(), Recorder::default()).await;
    let client = Client::new(fx.client_config()).unwrap();
    let pair = Keypair::generate_with_size(KeySize::Bits1024, &mut ChaCha20Rng::seed_from_u64(1));
    let bins: Vec<u32> = (0..BIN_COUNT as u32).collect();
    let packed = pair
        .public_key()
        .encrypt_packed(&bins, &mut ChaCha20Rng::seed_from_u64(2))
        .unwrap();
    let mut sent = report(1);
    sent.key_id = packed.key_id();
    sent.ciphertexts = PackedBytes::new(packed.to_bytes(), packed.ciphertexts().len()).unwrap();

    let got = client.send(&sent).await.unwrap();
    assert_eq!(got, ack(sent.report_id, AckStatus::Accepted));
    assert_eq!(
        fx.handler.reports.lock().unwrap().get(&sent.report_id),
        Some(&sent)
    );
    let again = client.send(&sent).await.unwrap();
    assert_eq!(again.status, AckStatus::Duplicate);
    // An agent's client: each report came on a connection of its own.
    let stats = eventually(&fx.server, |s| s.connections_open == 0).await;
    assert_eq!((stats.frames_handled, stats.connections_accepted), (2, 2));
    assert_eq!(stats.stream_errors, 0, "{stats:?}");
    client.close().await;
    fx.server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_clients_with_many_streams_are_all_acked() {
    let fx = start(Limits::default(), Recorder::default()).await;
    let mut tasks = Vec::new();
    for c in 0..8u64 {
        let client = fx.shared_client().await;
        for r in 0..50u64 {
            let client = client.clone();
            tasks.push(tokio::spawn(async move {
                let report = report(1000 * c + r);
                let ack = client.send(&report).await.unwrap();
                (report.report_id, ack)
            }));
        }
    }
    for task in tasks {
        let (id, ack) = task.await.unwrap();
        assert_eq!(ack.report_id, id);
        assert_eq!(ack.status, AckStatus::Accepted);
    }
    assert_eq!(fx.handler.stored(), 400);
    assert_eq!(fx.handler.calls(), 400);
    // The server counts an ack just after the client may already have read it.
    let stats = eventually(&fx.server, |s| s.acks_sent == 400).await;
    assert_eq!(stats.connections_accepted, 8);
    assert_eq!(stats.streams, 400);
    fx.server.shutdown().await;
}

#[tokio::test]
async fn an_oversized_announcement_is_refused_from_the_prefix_alone() {
    let fx = start(Limits::default(), Recorder::default()).await;
    let client = fx.client().await;
    // Announces 4 GiB and sends a little: refused without waiting for (or allocating) the body.
    let mut huge = u32::MAX.to_be_bytes().to_vec();
    huge.extend_from_slice(&[1; 100]);
    rejected(
        &client.send_raw(&huge).await.unwrap(),
        RejectReason::TooLarge,
    );
    // One byte over the limit, with the whole body actually sent (more than a stream window).
    let mut over = ((MAX_FRAME_BODY + 1) as u32).to_be_bytes().to_vec();
    over.resize(4 + MAX_FRAME_BODY + 1, 0xAB);
    rejected(
        &client.send_raw(&over).await.unwrap(),
        RejectReason::TooLarge,
    );
    assert_eq!(
        fx.handler.calls(),
        0,
        "the handler never sees an oversized frame"
    );
    assert_eq!(fx.server.stats().frames_too_large, 2);
    // Exactly the limit is read and handed over (the handler's decoder then refuses the
    // zeros: kind 0, version 0).
    let mut max = (MAX_FRAME_BODY as u32).to_be_bytes().to_vec();
    max.resize(4 + MAX_FRAME_BODY, 0);
    rejected(
        &client.send_raw(&max).await.unwrap(),
        RejectReason::UnsupportedVersion,
    );
    assert_eq!(fx.handler.calls(), 1);
    fx.server.shutdown().await;
}

#[tokio::test]
async fn truncated_and_overlong_frames_are_malformed_without_a_handler_call() {
    let fx = start(Limits::default(), Recorder::default()).await;
    let client = fx.shared_client().await;
    let frame = Message::Report(report(5)).to_frame().unwrap();
    let cases: Vec<Vec<u8>> = vec![
        Vec::new(),                              // finished at once
        frame[..2].to_vec(),                     // half a prefix
        frame[..4].to_vec(),                     // a prefix and no body
        frame[..frame.len() - 1].to_vec(),       // one byte short
        [frame.clone(), vec![0]].concat(),       // a byte after the frame
        [frame.clone(), frame.clone()].concat(), // two frames on one stream
    ];
    for case in &cases {
        rejected(
            &client.send_raw(case).await.unwrap(),
            RejectReason::Malformed,
        );
    }
    assert_eq!(fx.handler.calls(), 0);
    assert_eq!(fx.server.stats().frames_malformed, cases.len() as u64);
    // The connection is still good for a valid report.
    let r = report(5);
    assert_eq!(client.send(&r).await.unwrap().status, AckStatus::Accepted);
    fx.server.shutdown().await;
}

#[tokio::test]
async fn garbage_is_rejected_and_changes_nothing() {
    let fx = start(Limits::default(), Recorder::default()).await;
    let client = fx.shared_client().await;
    let mut rng = ChaCha20Rng::seed_from_u64(99);
    for i in 0..60 {
        let len = rng.random_range(0..3000);
        let mut bytes: Vec<u8> = (0..len).map(|_| rng.random()).collect();
        if i % 2 == 0 && bytes.len() >= 4 {
            // Half the cases announce exactly the bytes that follow, so the handler sees them.
            let body = (bytes.len() - 4) as u32;
            bytes[..4].copy_from_slice(&body.to_be_bytes());
        }
        let ack = client.send_raw(&bytes).await.unwrap();
        assert!(
            matches!(ack.status, AckStatus::Rejected(_)),
            "garbage {i} was not rejected: {ack:?}"
        );
    }
    assert_eq!(fx.handler.stored(), 0);
    assert!(
        fx.handler.calls() > 0,
        "some garbage reached the handler's decoder"
    );
    let r = report(6);
    assert_eq!(client.send(&r).await.unwrap().status, AckStatus::Accepted);
    fx.server.shutdown().await;
}

/// A QUIC client that trusts the fixture's certificate as a root and offers `alpn`.
fn foreign_client(
    identity: &Identity,
    alpn: Option<&[u8]>,
) -> (quinn::Endpoint, quinn::ClientConfig) {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(identity.certificate().clone()).unwrap();
    let mut tls = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_protocol_versions(&[&rustls::version::TLS13])
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    tls.alpn_protocols = alpn.into_iter().map(<[u8]>::to_vec).collect();
    let crypto = quinn::crypto::rustls::QuicClientConfig::try_from(tls).unwrap();
    let endpoint = quinn::Endpoint::client(loopback()).unwrap();
    (endpoint, quinn::ClientConfig::new(Arc::new(crypto)))
}

#[tokio::test]
async fn a_peer_without_penrose_alpn_cannot_send() {
    let fx = start(Limits::default(), Recorder::default()).await;
    let addr = fx.server.local_addr();
    // Control: the same hand-made client with the right ALPN gets through.
    let (endpoint, config) = foreign_client(&fx.identity, Some(ALPN));
    let conn = endpoint
        .connect_with(config, addr, "localhost")
        .unwrap()
        .await
        .expect("the control client with penrose/1 connects");
    conn.close(0u32.into(), b"");

    let (endpoint, config) = foreign_client(&fx.identity, Some(b"penrose/2"));
    let wrong = endpoint
        .connect_with(config, addr, "localhost")
        .unwrap()
        .await;
    assert!(wrong.is_err(), "a wrong ALPN must fail the handshake");

    // Offering no ALPN at all: the handshake fails, or the server closes at once and no
    // stream is ever read.
    let (endpoint, config) = foreign_client(&fx.identity, None);
    if let Ok(conn) = endpoint
        .connect_with(config, addr, "localhost")
        .unwrap()
        .await
    {
        let outcome = async {
            let (mut send, mut recv) = conn.open_bi().await?;
            send.write_all(&Message::Report(report(8)).to_frame().unwrap())
                .await?;
            send.finish()?;
            recv.read_to_end(64).await?;
            Ok::<_, Box<dyn std::error::Error>>(())
        }
        .await;
        assert!(outcome.is_err(), "a connection without ALPN was served");
    }
    assert_eq!(fx.handler.calls(), 0);
    assert_eq!(fx.server.stats().connections_accepted, 1);
    let stats = eventually(&fx.server, |s| s.handshakes_failed >= 2).await;
    assert!(stats.handshakes_failed >= 2, "{stats:?}");
    fx.server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_client_times_out_and_others_are_served_meanwhile() {
    let limits = Limits {
        stream_read_timeout: Duration::from_millis(400),
        ..Limits::default()
    };
    let fx = start(limits, Recorder::default()).await;
    let slow = fx.shared_client().await;
    let conn = slow.connection().await.unwrap();
    let frame = Message::Report(report(9)).to_frame().unwrap();
    let trickle = tokio::spawn(async move {
        let (mut send, mut recv) = conn.open_bi().await.unwrap();
        for chunk in frame.chunks(8) {
            if send.write_all(chunk).await.is_err() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let _ = send.finish();
        recv.read_to_end(64).await
    });
    // An agent's client: 40 connections, one after the other.
    let fast = fx.client().await;
    for seed in 100..140 {
        let r = report(seed);
        assert_eq!(fast.send(&r).await.unwrap().status, AckStatus::Accepted);
    }
    let slow_outcome = trickle.await.unwrap();
    assert!(
        matches!(
            slow_outcome,
            Err(quinn::ReadToEndError::Read(quinn::ReadError::Reset(code)))
                if code == penrose_transport::server::codes::READ_TIMEOUT
        ),
        "the trickling stream was reset by the read timeout: {slow_outcome:?}"
    );
    assert_eq!(fx.server.stats().read_timeouts, 1);
    assert_eq!(
        fx.handler.calls(),
        40,
        "the slow frame never reached the handler"
    );
    // The slow client's connection is still usable for a report sent at normal speed.
    assert_eq!(
        slow.send(&report(9)).await.unwrap().status,
        AckStatus::Accepted
    );
    fx.server.shutdown().await;
}

#[tokio::test]
async fn connections_over_the_limit_are_refused_until_one_closes() {
    let limits = Limits {
        max_connections: 2,
        ..Limits::default()
    };
    let fx = start(limits, Recorder::default()).await;
    let a = fx.shared_client().await;
    let b = fx.shared_client().await;
    let third = Client::connect(fx.client_config().shared_connection_for_load_testing()).await;
    assert!(
        matches!(
            third,
            Err(ClientError::Connection(
                quinn::ConnectionError::ConnectionClosed(ref close)
            )) if close.error_code == quinn::TransportErrorCode::CONNECTION_REFUSED
        ),
        "{:?}",
        third.err()
    );
    assert_eq!(fx.server.stats().connections_refused, 1);
    assert_eq!(
        a.send(&report(10)).await.unwrap().status,
        AckStatus::Accepted
    );
    a.close().await;
    // The slot frees once the server has seen the close.
    let mut fourth = None;
    for _ in 0..50 {
        if let Ok(c) =
            Client::connect(fx.client_config().shared_connection_for_load_testing()).await
        {
            fourth = Some(c);
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let fourth = fourth.expect("a slot frees after a client closes");
    assert_eq!(
        fourth.send(&report(11)).await.unwrap().status,
        AckStatus::Accepted
    );
    assert_eq!(
        b.send(&report(12)).await.unwrap().status,
        AckStatus::Accepted
    );
    fx.server.shutdown().await;
}

#[tokio::test]
async fn a_certificate_that_does_not_match_the_pin_is_refused() {
    let fx = start(Limits::default(), Recorder::default()).await;
    let impostor_pin = Identity::self_signed(["localhost"]).unwrap();
    let mut config = fx.client_config();
    config.trust = Trust::pin(&impostor_pin);
    let err = Client::connect(config.clone())
        .await
        .err()
        .expect("pin mismatch must fail");
    assert!(matches!(err, ClientError::Connection(_)), "{err:?}");
    assert!(
        !err.is_retryable(),
        "a wrong certificate does not get better: {err:?}"
    );
    // send_with_retry gives up at once rather than retrying a certificate failure.
    config.retry = RetryPolicy {
        attempts: 5,
        base_delay: Duration::from_secs(5),
        ..RetryPolicy::default()
    };
    let client = Client::new(config).unwrap();
    let started = std::time::Instant::now();
    assert!(client.send_with_retry(&report(13)).await.is_err());
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "no backoff wait was taken"
    );
    assert_eq!(fx.handler.calls(), 0);
    fx.server.shutdown().await;
}

#[tokio::test]
async fn a_ca_signed_certificate_is_trusted_by_its_ca_only_for_its_name() {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let issuer = rcgen::Issuer::new(ca_params, ca_key);
    let leaf_key = rcgen::KeyPair::generate().unwrap();
    let leaf = rcgen::CertificateParams::new(vec!["aggregator.test".to_owned()])
        .unwrap()
        .signed_by(&leaf_key, &issuer)
        .unwrap();
    let identity = Identity::new(
        vec![leaf.der().clone(), ca.der().clone()],
        rustls_pki_types::PrivateKeyDer::Pkcs8(leaf_key.serialize_der().into()),
    )
    .unwrap();
    let handler = Arc::new(Recorder::default());
    let server = serve(
        ServerConfig {
            listen: loopback(),
            identity,
            limits: Limits::default(),
            stream_listen: None,
        },
        handler.clone(),
    )
    .await
    .unwrap();
    let trust = Trust::Ca(vec![ca.der().clone()]);
    let good = Client::connect(ClientConfig::new(
        server.local_addr(),
        "aggregator.test",
        trust.clone(),
    ))
    .await
    .unwrap();
    assert_eq!(
        good.send(&report(14)).await.unwrap().status,
        AckStatus::Accepted
    );
    let wrong_name =
        Client::connect(ClientConfig::new(server.local_addr(), "other.test", trust)).await;
    assert!(wrong_name.is_err(), "the name is checked under a CA");
    let other_ca = Identity::self_signed(["aggregator.test"]).unwrap();
    let wrong_ca = Client::connect(ClientConfig::new(
        server.local_addr(),
        "aggregator.test",
        Trust::Ca(vec![other_ca.certificate().clone()]),
    ))
    .await;
    assert!(wrong_ca.is_err(), "another CA is not trusted");
    server.shutdown().await;
}

fn quick_retries(attempts: u32) -> RetryPolicy {
    RetryPolicy {
        attempts,
        base_delay: Duration::from_millis(50),
        max_delay: Duration::from_millis(200),
        jitter: 0.5,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_starts_before_the_server_delivers_exactly_once() {
    // Reserve a port, free it, and point the client at it before anything listens there.
    let addr = UdpSocket::bind(loopback()).unwrap().local_addr().unwrap();
    let identity = Identity::self_signed(["localhost"]).unwrap();
    let mut config = ClientConfig::new(addr, "localhost", Trust::pin(&identity));
    config.connect_timeout = Duration::from_millis(200);
    config.retry = quick_retries(40);
    let client = Client::new(config).unwrap();
    let sent = report(15);
    let sending = {
        let client = client.clone();
        let sent = sent.clone();
        tokio::spawn(async move { client.send_with_retry(&sent).await })
    };
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert!(
        !sending.is_finished(),
        "nothing listens yet, so the client is still retrying"
    );
    let handler = Arc::new(Recorder::default());
    let server = serve(
        ServerConfig {
            listen: addr,
            identity,
            limits: Limits::default(),
            stream_listen: None,
        },
        handler.clone(),
    )
    .await
    .unwrap();
    let ack = sending.await.unwrap().unwrap();
    assert_eq!(ack.report_id, sent.report_id);
    assert_eq!(ack.status, AckStatus::Accepted);
    assert_eq!(handler.stored(), 1);
    assert_eq!(handler.calls(), 1);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_ack_is_retried_and_the_report_is_stored_once() {
    let fx = start(
        Limits::default(),
        Recorder {
            slow_first: Some(Duration::from_millis(800)),
            ..Recorder::default()
        },
    )
    .await;
    let mut config = fx.client_config();
    config.ack_timeout = Duration::from_millis(300);
    config.retry = quick_retries(10);
    let client = Client::connect(config).await.unwrap();
    let sent = report(16);
    let ack = client.send_with_retry(&sent).await.unwrap();
    // The first delivery stored it but its ack came too late; a retry got Duplicate, which
    // counts as delivered.
    assert_eq!(ack.report_id, sent.report_id);
    assert_eq!(ack.status, AckStatus::Duplicate);
    assert_eq!(fx.handler.stored(), 1);
    assert!(fx.handler.calls() >= 2);
    fx.server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_an_ack_timeout_the_retry_dials_a_new_connection() {
    let fx = start(
        Limits {
            shutdown_grace: Duration::from_millis(100),
            ..Limits::default()
        },
        Recorder {
            hang_first: true,
            ..Recorder::default()
        },
    )
    .await;
    let mut config = fx.client_config();
    config.ack_timeout = Duration::from_millis(300);
    config.retry = quick_retries(5);
    // The shared connection is the one that could be trusted again (a fresh-per-report client
    // dials every attempt anyway: tests/unlinkable.rs).
    let client = Client::connect(config.shared_connection_for_load_testing())
        .await
        .unwrap();
    let sent = report(21);
    let ack = client.send_with_retry(&sent).await.unwrap();
    assert_eq!(ack.status, AckStatus::Accepted);
    assert_eq!(fx.handler.stored(), 1);
    // The silent connection was not trusted again: the retry came on a second one.
    assert_eq!(fx.server.stats().connections_accepted, 2);
    fx.server.shutdown().await;
}

#[tokio::test]
async fn a_rejected_report_is_not_retried() {
    let fx = start(
        Limits::default(),
        Recorder {
            reject: Some(RejectReason::UnknownKey),
            ..Recorder::default()
        },
    )
    .await;
    let mut config = fx.client_config();
    config.retry = quick_retries(10);
    let client = Client::connect(config).await.unwrap();
    let sent = report(17);
    let ack = client.send_with_retry(&sent).await.unwrap();
    assert_eq!(ack.status, AckStatus::Rejected(RejectReason::UnknownKey));
    assert_eq!(ack.throttle.permille(), THROTTLE);
    assert_eq!(fx.handler.calls(), 1);
    fx.server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_faster_than_its_rate_is_paced_not_refused() {
    let limits = Limits {
        reports_per_second: NonZeroU32::new(20),
        ..Limits::default()
    };
    let fx = start(limits, Recorder::default()).await;
    let client = fx.shared_client().await;
    let tasks: Vec<_> = (0..40)
        .map(|seed| {
            let client = client.clone();
            tokio::spawn(async move { client.send(&report(200 + seed)).await })
        })
        .collect();
    for task in tasks {
        assert_eq!(task.await.unwrap().unwrap().status, AckStatus::Accepted);
    }
    assert!(fx.server.stats().streams_paced > 0);
    assert_eq!(fx.handler.stored(), 40);
    fx.server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_closes_connections_and_a_retrying_client_reaches_the_next_server() {
    let fx = start(Limits::default(), Recorder::default()).await;
    let addr = fx.server.local_addr();
    let mut config = fx.client_config();
    config.connect_timeout = Duration::from_millis(200);
    config.retry = quick_retries(40);
    let client = Client::connect(config.shared_connection_for_load_testing())
        .await
        .unwrap();
    assert_eq!(
        client.send(&report(18)).await.unwrap().status,
        AckStatus::Accepted
    );
    let Fixture {
        server, identity, ..
    } = fx;
    server.shutdown().await;
    let err = client
        .send(&report(19))
        .await
        .expect_err("the server is gone");
    assert!(err.is_retryable(), "{err:?}");
    let handler = Arc::new(Recorder::default());
    let next = serve(
        ServerConfig {
            listen: addr,
            identity,
            limits: Limits::default(),
            stream_listen: None,
        },
        handler.clone(),
    )
    .await
    .unwrap();
    let ack = client.send_with_retry(&report(19)).await.unwrap();
    assert_eq!(ack.status, AckStatus::Accepted);
    assert_eq!(handler.stored(), 1);
    next.shutdown().await;
}

#[tokio::test]
async fn identities_saved_as_pem_or_der_load_and_serve() {
    let dir = tempfile::tempdir().unwrap();
    let original = Identity::self_signed(["localhost"]).unwrap();
    for encoding in [Encoding::Pem, Encoding::Der] {
        let cert = dir.path().join(format!("{encoding:?}.cert"));
        let key = dir.path().join(format!("{encoding:?}.key"));
        original.save(&cert, &key, encoding).unwrap();
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&key).unwrap().permissions().mode();
            assert_eq!(mode & 0o077, 0, "the key file is private");
        }
        let loaded = Identity::load(&cert, &key).unwrap();
        assert_eq!(loaded.certificate(), original.certificate());
        assert_eq!(loaded.key().secret_der(), original.key().secret_der());
        let handler = Arc::new(Recorder::default());
        let server = serve(
            ServerConfig {
                listen: loopback(),
                identity: loaded,
                limits: Limits::default(),
                stream_listen: None,
            },
            handler,
        )
        .await
        .unwrap();
        let trust = Trust::load_pinned(&cert).unwrap();
        let client = Client::connect(ClientConfig::new(server.local_addr(), "localhost", trust))
            .await
            .unwrap();
        assert_eq!(
            client.send(&report(20)).await.unwrap().status,
            AckStatus::Accepted
        );
        server.shutdown().await;
    }
    let junk = dir.path().join("junk");
    std::fs::write(&junk, b"not a certificate").unwrap();
    assert!(Identity::load(&junk, &junk).is_err());
    assert!(Trust::load_pinned(&junk).is_err());
    assert!(Trust::load_ca(&dir.path().join("missing")).is_err());
}

#[tokio::test]
async fn limits_that_cannot_work_are_refused() {
    let identity = Identity::self_signed(["localhost"]).unwrap();
    for limits in [
        Limits {
            max_connections: 0,
            ..Limits::default()
        },
        Limits {
            max_connections: usize::MAX,
            ..Limits::default()
        },
        Limits {
            max_concurrent_streams: 0,
            ..Limits::default()
        },
        Limits {
            stream_read_timeout: Duration::ZERO,
            ..Limits::default()
        },
    ] {
        let result = serve(
            ServerConfig {
                listen: loopback(),
                identity: identity.clone(),
                limits,
                stream_listen: None,
            },
            Arc::new(Recorder::default()),
        )
        .await;
        assert!(result.is_err());
    }
}

/// The kernel's cap on a socket's receive buffer, in the units asked (Linux).
fn rmem_max() -> Option<u64> {
    std::fs::read_to_string("/proc/sys/net/core/rmem_max")
        .ok()?
        .trim()
        .parse()
        .ok()
}

#[tokio::test]
async fn the_udp_socket_gets_the_receive_buffer_the_limits_ask_for() {
    let Some(cap) = rmem_max() else {
        eprintln!("no /proc/sys/net/core/rmem_max: not Linux, nothing to check");
        return;
    };
    // Within the cap the kernel grants the ask exactly; above it, the cap. Either way far more
    // than the kernel's default the socket had before (208 KiB), when the cap allows it.
    for asked in [96u64 << 10, 8 << 20] {
        let limits = Limits {
            udp_receive_buffer: asked as usize,
            ..Limits::default()
        };
        let fx = start(limits, Recorder::default()).await;
        let stats = fx.server.stats();
        assert_eq!(stats.udp_receive_buffer, asked.min(cap), "{stats:?}");
        assert_eq!(stats.udp_drops, 0);
        fx.server.shutdown().await;
    }
}
