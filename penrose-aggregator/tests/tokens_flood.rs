//! A client without tokens against a server admitting by tokens (docs/threat-model.md,
//! "Abusive clients"): 100,000 well-formed reports without a token, through the ingest handler
//! of this process (its own test binary, so that its resident memory is this test's alone),
//! then a slice of the same over QUIC against the `serve` binary with `--token-keys`. Nothing
//! changes on disk or in the tables, and memory stays bounded.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use penrose_aggregator::ingest::IngestConfig;
use penrose_aggregator::store::{RocksStore, Store};
use penrose_core::counters::CounterId;
use penrose_core::fingerprint::SnippetHash;
use penrose_core::paillier::ACCUMULATOR_REPORT_BOUND;
use penrose_core::tokens::{KeyRing, REDEMPTION_BYTES};
use penrose_core::wire::{AckStatus, Day, RejectReason};
use penrose_host::clock::today;
use penrose_transport::{Client, ClientConfig, RetryPolicy, Trust};
use rand::{Rng, RngCore};

/// Reports without a token sent through the handler.
const REPORTS: usize = 100_000;
/// Of them (and of tokened reports) over QUIC.
const QUIC_SLICE: usize = 4_096;
/// Where the snippet hash and the counter sit in a report body: kind, version, key id,
/// report id; then the 32-byte snippet.
const SNIPPET_AT: usize = 1 + 2 + 32 + 16;
const COUNTER_AT: usize = SNIPPET_AT + 32;

const COUNTERS: [CounterId; 3] = [CounterId(4), CounterId(5), CounterId(6)];

fn ring() -> KeyRing {
    let t = today();
    token_ring(&[Day(t.0 - 1), t, Day(t.0 + 1)], &COUNTERS, 51)
}

/// A copy of `template` with a fresh report id, one of `snippets` (real fingerprints: each
/// would found or join a class if it got that far) and one of the counters.
fn variant(template: &[u8], snippets: &[[u8; 32]], rng: &mut impl RngCore) -> Vec<u8> {
    let mut body = with_report_id(template, rng.random());
    body[SNIPPET_AT..SNIPPET_AT + 32]
        .copy_from_slice(&snippets[rng.random_range(0..snippets.len())]);
    let counter = COUNTERS[rng.random_range(0..COUNTERS.len())];
    body[COUNTER_AT..COUNTER_AT + 2].copy_from_slice(&counter.0.to_be_bytes());
    body
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_without_tokens_changes_nothing_and_memory_stays_bounded() {
    let snippets: Vec<[u8; 32]> = snippets(64, 4).into_iter().map(|(_, s)| s.hash.0).collect();
    let ring = ring();

    // 1. In-process: one tokened report counted, then 100,000 without a token.
    let dir = tempfile::tempdir().unwrap();
    let (ingest, writer, store) = start_admitting(
        dir.path(),
        ACCUMULATOR_REPORT_BOUND,
        IngestConfig::default(),
        None,
        by_tokens(&ring),
    );
    let mut rng = rng(52);
    let token = mint(&ring, today(), CounterId(4), 1, 53).remove(0);
    let first = report(SnippetHash(snippets[0]), CounterId(4), &mut rng).frame;
    assert_eq!(
        ingest.handle(with_token(&first, &token)).await.status,
        AckStatus::Accepted
    );
    let template = Arc::new(report(SnippetHash(snippets[0]), CounterId(4), &mut rng).frame);
    let before = dump(store.as_ref());
    let tables_before = {
        let state = ingest.state();
        (
            state.tables().class_count(),
            state.tables().snippet_count(),
            state.accepted(),
        )
    };
    // Warm the allocator and the runtime with a first thousand, then measure.
    let send = |count: usize, seed: u64| {
        let (ingest, template, snippets) =
            (ingest.clone(), Arc::clone(&template), snippets.clone());
        async move {
            let mut tasks = Vec::new();
            for t in 0..8u64 {
                let (ingest, template, snippets) =
                    (ingest.clone(), Arc::clone(&template), snippets.clone());
                tasks.push(tokio::spawn(async move {
                    let mut rng = common::rng(seed * 100 + t);
                    let mut statuses: BTreeMap<String, usize> = BTreeMap::new();
                    for _ in 0..count / 8 {
                        let body = variant(&template, &snippets, &mut rng);
                        let status = ingest.handle(body).await.status;
                        *statuses.entry(format!("{status:?}")).or_default() += 1;
                    }
                    statuses
                }));
            }
            let mut all: BTreeMap<String, usize> = BTreeMap::new();
            for task in tasks {
                for (k, v) in task.await.unwrap() {
                    *all.entry(k).or_default() += v;
                }
            }
            all
        }
    };
    let warm = send(1_000, 1).await;
    let rss_before = own_rss_kib();
    let statuses = send(REPORTS, 2).await;
    let rss_after = own_rss_kib();
    let refused = format!("{:?}", AckStatus::Rejected(RejectReason::TokenRequired));
    assert_eq!(warm, BTreeMap::from([(refused.clone(), 1_000)]));
    assert_eq!(statuses, BTreeMap::from([(refused, REPORTS)]));
    assert_eq!(dump(store.as_ref()), before, "the store changed");
    {
        let state = ingest.state();
        assert_eq!(
            (
                state.tables().class_count(),
                state.tables().snippet_count(),
                state.accepted()
            ),
            tables_before
        );
    }
    assert_eq!(
        ingest.metrics().rejected_count(RejectReason::TokenRequired),
        (REPORTS + 1_000) as u64
    );
    let grew = rss_after.saturating_sub(rss_before);
    eprintln!(
        "{REPORTS} reports without tokens: resident memory {rss_before} -> {rss_after} KiB \
         (+{grew} KiB)"
    );
    assert!(
        grew < 32 * 1024,
        "resident memory grew by {grew} KiB over {REPORTS} refused reports"
    );
    drop(ingest);
    writer.join().unwrap();

    // 2. A slice over QUIC against the server binary admitting by tokens.
    quic_slice(&ring, &snippets).await;
}

async fn quic_slice(ring: &KeyRing, snippets: &[[u8; 32]]) {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let key = dir.path().join("public.key");
    std::fs::write(&key, KEYS_2048.public_key().to_bytes()).unwrap();
    let ring_path = dir.path().join("token-keys");
    write_ring(&ring_path, ring);
    let mut rng = rng(60);
    let t = today();
    let tokens = mint(ring, t, CounterId(4), 3, 61);
    let sent: Vec<Sent> = (0..3)
        .map(|_| report_2048(SnippetHash(snippets[0]), CounterId(4), &mut rng))
        .collect();

    // One tokened report counted, then the store as it is.
    let server = Server::start(&data, &key, &ring_path);
    let client = Client::new(server.config(&data)).unwrap();
    let ack = client
        .send_raw(&framed(&with_token(&sent[0].frame, &tokens[0])))
        .await
        .unwrap();
    assert_eq!(ack.status, AckStatus::Accepted);
    client.close().await;
    server.stop();
    let before = dump_at(&data);

    // The slice: reports without a token and with forged ones, then the honest ones.
    let server = Server::start(&data, &key, &ring_path);
    let rss_before = rss_kib_of(&server.child.id().to_string());
    let client = Client::new(server.config(&data).shared_connection_for_load_testing()).unwrap();
    let template = Arc::new(sent[1].frame.clone());
    let mut workers = Vec::new();
    for w in 0..16u64 {
        let (client, template, snippets) = (client.clone(), template.clone(), snippets.to_vec());
        workers.push(tokio::spawn(async move {
            let mut rng = common::rng(70 + w);
            let mut statuses: BTreeMap<String, usize> = BTreeMap::new();
            for i in 0..QUIC_SLICE / 16 {
                let mut body = variant(&template, &snippets, &mut rng);
                if i % 4 == 3 {
                    let mut forged = [0u8; REDEMPTION_BYTES];
                    rng.fill_bytes(&mut forged);
                    body = with_token_bytes(&body, forged);
                }
                let status = client.send_raw(&framed(&body)).await.unwrap().status;
                *statuses.entry(format!("{status:?}")).or_default() += 1;
            }
            statuses
        }));
    }
    let mut statuses: BTreeMap<String, usize> = BTreeMap::new();
    for w in workers {
        for (k, v) in w.await.unwrap() {
            *statuses.entry(k).or_default() += v;
        }
    }
    let rss_after = rss_kib_of(&server.child.id().to_string());
    client.close().await;
    assert_eq!(
        statuses,
        BTreeMap::from([
            (
                format!("{:?}", AckStatus::Rejected(RejectReason::TokenRequired)),
                QUIC_SLICE * 3 / 4
            ),
            (
                format!("{:?}", AckStatus::Rejected(RejectReason::InvalidToken)),
                QUIC_SLICE / 4
            ),
        ])
    );
    eprintln!(
        "{QUIC_SLICE} reports over QUIC without valid tokens: server resident memory \
         {rss_before} -> {rss_after} KiB"
    );
    assert!(
        rss_after.saturating_sub(rss_before) < 32 * 1024,
        "the server's resident memory grew from {rss_before} to {rss_after} KiB"
    );
    server.stop();
    assert_eq!(dump_at(&data), before, "the store changed");

    // The honest reports still get through, each token once.
    let server = Server::start(&data, &key, &ring_path);
    let client = Client::new(server.config(&data)).unwrap();
    for (s, token) in sent.iter().zip(&tokens).skip(1) {
        let ack = client
            .send_raw(&framed(&with_token(&s.frame, token)))
            .await
            .unwrap();
        assert_eq!(ack.status, AckStatus::Accepted);
    }
    let ack = client
        .send_raw(&framed(&with_token(&sent[0].frame, &tokens[1])))
        .await
        .unwrap();
    assert_eq!(ack.status, AckStatus::Rejected(RejectReason::TokenSpent));
    client.close().await;
    server.stop();
    let (_, state) = reopen_served(&data);
    assert_eq!(state.accepted(), 3);
}

fn framed(body: &[u8]) -> Vec<u8> {
    let mut frame = (body.len() as u32).to_be_bytes().to_vec();
    frame.extend_from_slice(body);
    frame
}

fn dump_at(data: &Path) -> Vec<(penrose_aggregator::store::Table, Vec<u8>, Vec<u8>)> {
    let store = RocksStore::open(&data.join("db")).unwrap();
    dump(&store as &dyn Store)
}

struct Server {
    child: std::process::Child,
    addr: std::net::SocketAddr,
}

impl Server {
    fn start(data: &Path, key: &Path, ring: &Path) -> Server {
        let (child, started) = spawn_serve(
            data,
            key,
            &[
                "--listen",
                "127.0.0.1:0",
                "--token-keys",
                ring.to_str().unwrap(),
            ],
        );
        Server {
            child,
            addr: started.listening,
        }
    }

    fn config(&self, data: &Path) -> ClientConfig {
        let trust = Trust::load_pinned(&data.join("tls").join("cert.pem")).unwrap();
        let mut config = ClientConfig::new(self.addr, "localhost", trust);
        config.connect_timeout = Duration::from_secs(3);
        config.ack_timeout = Duration::from_secs(10);
        config.retry = RetryPolicy::none();
        config
    }

    fn stop(mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }
}
