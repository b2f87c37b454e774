//! The auditor over QUIC on loopback, as the design server reaches it: a client built from
//! `penrose_transport::exchange::ExchangeClient` pinning the certificate the auditor made on
//! its first start asks for the chain position and for a bundle's partials, which combine
//! with the design server's to the exact sums; the data directory is held by one serving
//! process at a time; a restart answers from the record it left.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use std::time::Duration;

use common::{DAY, ENOUGH, Setup, partials};
use penrose_auditor::service::{self, PROTOCOL, Running, ServeOptions};
use penrose_auditor::{AuditorError, Policy, admin};
use penrose_core::audit::{AuditAnswer, AuditRequest};
use penrose_core::bundle::{BundleHash, InstanceId};
use penrose_transport::exchange::ExchangeClient;
use penrose_transport::{ClientConfig, Trust};

async fn start(setup: &Setup) -> Running {
    let options = ServeOptions::new(setup.data.clone(), "127.0.0.1:0".parse().unwrap());
    service::start(options).await.unwrap()
}

fn client(running: &Running) -> ExchangeClient {
    let trust = Trust::load_pinned(running.certificate()).unwrap();
    let mut config = ClientConfig::new(running.local_addr(), "localhost", trust);
    config.ack_timeout = Duration::from_secs(60);
    ExchangeClient::new(config, PROTOCOL).unwrap()
}

async fn ask(client: &ExchangeClient, request: &AuditRequest) -> AuditAnswer {
    AuditAnswer::decode(&client.exchange(&request.encode()).await.unwrap()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_design_server_gets_status_and_partials_over_quic() {
    let mut setup = Setup::new(Policy::default(), None);
    let (a, a_bins) = setup.sum(DAY, 0, ENOUGH);
    let (b, _) = setup.sum(DAY, 1, ENOUGH - 1);
    let bundle = setup.chain(1).next(&[DAY], vec![a.clone(), b]);
    let running = start(&setup).await;
    assert!(running.certificate().starts_with(setup.data.path()));
    let client = client(&running);

    let AuditAnswer::Status(status) = ask(&client, &AuditRequest::Status).await else {
        panic!("no status");
    };
    assert_eq!((status.instance, status.seq), (None, 0));
    let request = AuditRequest::Release {
        bundle: bundle.clone(),
        first: 0,
        count: 2,
        evidence: Vec::new(),
    };
    let (got, withheld) = partials(ask(&client, &request).await);
    assert_eq!(withheld, [1]);
    assert_eq!(setup.dealing.combine(&a, &got[0].partial), a_bins);

    // One serving process at a time: a second start, and a re-pin, are refused.
    let second = service::start(ServeOptions::new(
        setup.data.clone(),
        "127.0.0.1:0".parse().unwrap(),
    ))
    .await;
    assert!(matches!(second, Err(AuditorError::Busy(_))));
    assert!(matches!(
        admin::follow(&setup.data, InstanceId([2; 16])),
        Err(AuditorError::Busy(_))
    ));
    let certificate = std::fs::read(running.certificate()).unwrap();
    running.shutdown().await;

    // A restart answers from the record it left, with the same certificate.
    let running = start(&setup).await;
    assert_eq!(std::fs::read(running.certificate()).unwrap(), certificate);
    let client = self::client(&running);
    let AuditAnswer::Status(status) = ask(&client, &AuditRequest::Status).await else {
        panic!("no status");
    };
    assert_eq!(status.instance, Some(InstanceId([1; 16])));
    assert_eq!((status.seq, status.hash), (1, BundleHash::of(&bundle)));
    running.shutdown().await;
}

/// A client pinning another certificate does not get an answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_pinning_another_certificate_is_refused() {
    let setup = Setup::new(Policy::default(), None);
    let running = start(&setup).await;
    let other = penrose_transport::Identity::self_signed(["localhost"]).unwrap();
    let config = ClientConfig::new(running.local_addr(), "localhost", Trust::pin(&other));
    let client = ExchangeClient::new(config, PROTOCOL).unwrap();
    assert!(
        client
            .exchange(&AuditRequest::Status.encode())
            .await
            .is_err()
    );
    running.shutdown().await;
}
