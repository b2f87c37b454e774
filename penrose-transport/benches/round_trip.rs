//! Report round trips over QUIC on loopback, client and server in one process, with a handler
//! that acks at once: the cost of the transport alone (TLS, QUIC, a stream per report), to
//! compare with the aggregator's end-to-end figure, which adds validation and RocksDB.
//!
//! Run: `cargo bench -p penrose-transport --bench round_trip`. `sequential` is one report at a
//! time (latency); `concurrent/N` keeps N reports in flight on one connection (throughput);
//! `connections/N` spreads them over N connections.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use penrose_core::counters::{CatalogueVersion, CounterId};
use penrose_core::fingerprint::SnippetHash;
use penrose_core::histogram::SampleCount;
use penrose_core::paillier::KeyId;
use penrose_core::wire::{
    Ack, AckStatus, Day, PackedBytes, Report, ReportId, ThrottleHint, body_length,
};
use penrose_transport::{
    Client, ClientConfig, Identity, Limits, ReportHandler, ServerConfig, Trust, serve,
};

/// Acks every frame as accepted, echoing the report id at its fixed offset.
struct AckAll;

impl ReportHandler for AckAll {
    async fn handle(&self, body: Vec<u8>) -> Ack {
        let mut id = [0; 16];
        // kind (1) + version (2) + key id (32), then the report id.
        if let Some(bytes) = body.get(35..51) {
            id.copy_from_slice(bytes);
        }
        Ack {
            report_id: ReportId(id),
            status: AckStatus::Accepted,
            throttle: ThrottleHint::FULL_RATE,
        }
    }
}

/// A report the size of a deployed one: two 512-byte ciphertexts (1,126-byte frame).
fn report(i: u64) -> Report {
    let mut id = [0; 16];
    id[..8].copy_from_slice(&i.to_be_bytes());
    Report {
        key_id: KeyId([1; 32]),
        report_id: ReportId(id),
        snippet: SnippetHash([2; 32]),
        locator: penrose_core::fingerprint::Locator([0; penrose_core::fingerprint::LOCATOR_BANDS]),
        arch: penrose_core::gpu::GpuArch::new(9, 0),
        counter: CounterId(1),
        catalogue: CatalogueVersion(1),
        day: Day(20_000),
        samples: SampleCount(100),
        ciphertexts: PackedBytes::new(vec![0x5a; 1024], 2).unwrap(),
        token: None,
        evidence: None,
    }
}

fn bench(c: &mut Criterion) {
    let frame = penrose_core::wire::Message::Report(report(0))
        .to_frame()
        .unwrap();
    assert_eq!(body_length(&frame).unwrap() + 4, 1126);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let identity = Identity::self_signed(["localhost"]).unwrap();
    let limits = Limits {
        reports_per_second: None,
        max_concurrent_streams: 256,
        ..Limits::default()
    };
    let server = rt
        .block_on(serve(
            ServerConfig {
                listen: SocketAddr::from(([127, 0, 0, 1], 0)),
                identity: identity.clone(),
                limits,
                stream_listen: None,
            },
            Arc::new(AckAll),
        ))
        .unwrap();
    let fresh = ClientConfig::new(server.local_addr(), "localhost", Trust::pin(&identity));
    // The throughput cases measure streams over long-lived connections: the load-testing mode.
    let config = fresh.clone().shared_connection_for_load_testing();
    let connect = |n: usize| -> Vec<Client> {
        rt.block_on(async {
            let mut clients = Vec::new();
            for _ in 0..n {
                clients.push(Client::connect(config.clone()).await.unwrap());
            }
            clients
        })
    };

    let mut group = c.benchmark_group("round_trip");
    group.measurement_time(Duration::from_secs(5));
    let one = connect(1).remove(0);
    let mut next = 0u64;
    group.throughput(Throughput::Elements(1));
    group.bench_function("sequential", |b| {
        b.iter(|| {
            next += 1;
            let ack = rt.block_on(one.send(&report(next))).unwrap();
            assert_eq!(ack.status, AckStatus::Accepted);
        })
    });
    // What an agent does: a new socket, a full handshake and a close for every report.
    let agent = Client::new(fresh).unwrap();
    group.bench_function("sequential_fresh", |b| {
        b.iter(|| {
            next += 1;
            let ack = rt.block_on(agent.send(&report(next))).unwrap();
            assert_eq!(ack.status, AckStatus::Accepted);
        })
    });
    let burst = |clients: &[Client], n: u64, next: &mut u64| {
        let base = *next;
        *next += n;
        rt.block_on(async {
            let tasks: Vec<_> = (0..n)
                .map(|i| {
                    let client = clients[i as usize % clients.len()].clone();
                    tokio::spawn(async move { client.send(&report(base + i)).await })
                })
                .collect();
            for task in tasks {
                assert_eq!(task.await.unwrap().unwrap().status, AckStatus::Accepted);
            }
        })
    };
    for n in [16u64, 64, 256] {
        group.throughput(Throughput::Elements(n));
        group.bench_function(format!("concurrent/{n}"), |b| {
            b.iter(|| burst(std::slice::from_ref(&one), n, &mut next))
        });
    }
    let many = connect(16);
    group.throughput(Throughput::Elements(256));
    group.bench_function("connections/16", |b| {
        b.iter(|| burst(&many, 256, &mut next))
    });
    group.finish();
    rt.block_on(server.shutdown());
}

criterion_group!(benches, bench);
criterion_main!(benches);
