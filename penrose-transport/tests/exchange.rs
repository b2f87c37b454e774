//! The request/answer endpoint on loopback: answers round trip, oversized requests never reach
//! the handler, the report and exchange endpoints cannot be confused, and each exchange comes
//! from a socket of its own.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use penrose_transport::exchange::{ExchangeClient, ExchangeHandler, Protocol, serve_exchange};
use penrose_transport::{Client, ClientConfig, ClientError, Identity, Limits, ServerConfig, Trust};

const PROTOCOL: Protocol = Protocol {
    alpn: b"penrose-test-exchange/1",
    max_body: 4096,
};

/// Answers each request with its bytes reversed and remembers how many it saw.
#[derive(Clone, Default)]
struct Reverser(Arc<Mutex<Vec<usize>>>);

impl ExchangeHandler for Reverser {
    async fn handle(&self, mut request: Vec<u8>) -> Vec<u8> {
        self.0.lock().unwrap().push(request.len());
        request.reverse();
        request
    }
}

fn server_config(identity: &Identity) -> ServerConfig {
    ServerConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        identity: identity.clone(),
        limits: Limits::default(),
        stream_listen: None,
    }
}

#[tokio::test]
async fn requests_get_their_answers_and_oversized_ones_never_reach_the_handler() {
    let identity = Identity::self_signed(["localhost"]).unwrap();
    let handler = Reverser::default();
    let server = serve_exchange(server_config(&identity), PROTOCOL, handler.clone())
        .await
        .unwrap();
    let mut config = ClientConfig::new(server.local_addr(), "localhost", Trust::pin(&identity));
    config.ack_timeout = Duration::from_secs(5);
    let client = ExchangeClient::new(config.clone(), PROTOCOL).unwrap();

    assert_eq!(client.exchange(b"abc").await.unwrap(), b"cba");
    let full = vec![7u8; PROTOCOL.max_body];
    assert_eq!(client.exchange(&full).await.unwrap(), full);
    assert_eq!(client.exchange(b"").await.unwrap(), b"");
    // Over the limit: the client refuses to send it ...
    assert!(matches!(
        client.exchange(&vec![0; PROTOCOL.max_body + 1]).await,
        Err(ClientError::RequestTooLarge(_))
    ));
    // ... and a peer that announces more anyway gets its stream reset, unread.
    let larger = Protocol {
        max_body: PROTOCOL.max_body * 2,
        ..PROTOCOL
    };
    let liar = ExchangeClient::new(config.clone(), larger).unwrap();
    assert!(
        liar.exchange(&vec![1; PROTOCOL.max_body + 1])
            .await
            .is_err()
    );
    assert_eq!(*handler.0.lock().unwrap(), [3, PROTOCOL.max_body, 0]);

    // A report client speaks another ALPN: the handshake fails, nothing is handled.
    let reports = Client::new(config).unwrap();
    let report_error = reports.connection().await.err();
    assert!(
        report_error.is_some(),
        "a report client must not reach an exchange endpoint"
    );
    assert_eq!(handler.0.lock().unwrap().len(), 3);
    let stats = server.stats();
    assert_eq!(stats.frames_too_large, 1);
    // Four exchanges and the failed report handshake: one connection per exchange.
    assert_eq!(stats.connections_accepted, 4);
    server.shutdown().await;
}

#[tokio::test]
async fn an_exchange_endpoint_refuses_the_report_alpn() {
    let identity = Identity::self_signed(["localhost"]).unwrap();
    let protocol = Protocol {
        alpn: penrose_transport::ALPN,
        max_body: 16,
    };
    assert!(
        serve_exchange(server_config(&identity), protocol, Reverser::default())
            .await
            .is_err()
    );
}

/// An exchange client keeps its configuration's route: over a carried route (Tor) every
/// exchange goes on a stream of its own and nothing is sent over UDP.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exchanges_over_a_carried_route_use_the_stream_port_only() {
    let identity = Identity::self_signed(["localhost"]).unwrap();
    let handler = Reverser::default();
    let mut config = server_config(&identity);
    config.stream_listen = Some("127.0.0.1:0".parse().unwrap());
    let server = serve_exchange(config, PROTOCOL, handler.clone())
        .await
        .unwrap();
    let stream_port = server.stream_addr().unwrap();
    let mut config = ClientConfig::new(
        penrose_transport::carrier::STREAM_SERVER,
        "localhost",
        Trust::pin(&identity),
    );
    config.route = penrose_transport::Route::Carried(Arc::new(
        penrose_transport::carrier::TcpDialer(stream_port),
    ));
    let client = ExchangeClient::new(config, PROTOCOL).unwrap();
    for request in [&b"abc"[..], b"de"] {
        let mut want = request.to_vec();
        want.reverse();
        assert_eq!(client.exchange(request).await.unwrap(), want);
    }
    let stats = server.stats();
    assert_eq!(stats.carrier.streams, 2, "a stream per exchange: {stats:?}");
    assert_eq!(stats.retries_sent, 0, "nothing came over UDP: {stats:?}");
    server.shutdown().await;
}
