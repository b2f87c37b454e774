//! A flood against the real server binary on loopback (docs/threat-model.md, "Abusive
//! clients"): a client without valid reports, on its own address (127.0.0.2), sends many
//! thousands of frames (random garbage, and well-formed reports whose snippet hashes cannot
//! come from a fingerprint) and thousands of connection attempts, while an agent on 127.0.0.1
//! keeps delivering.
//!
//! 1. The agent delivers some reports; the server is stopped and its store dumped.
//! 2. Flood alone, against a restarted server: afterwards the store is the same, row for row,
//!    and the server's resident memory grew little.
//! 3. Flood and agent together, the flood also sending valid reports with fresh snippet
//!    hashes: every agent report is acked and counted once, the sums decrypt to exactly the
//!    agent's, and the flood's valid reports founded no more classes than the budget allows.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;
use std::process::Child;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::*;
use penrose_aggregator::state::seen;
use penrose_aggregator::store::{RocksStore, Store, Table};
use penrose_core::counters::CounterId;
use penrose_core::fingerprint::SnippetHash;
use penrose_core::wire::{AckStatus, Message, RejectReason, Report};
use penrose_transport::{Client, ClientConfig, RetryPolicy, Trust};
use rand::{Rng, RngCore};

const FLOODER: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2));
/// Where the snippet hash sits in a report body: kind, version, key id, report id.
const SNIPPET_AT: usize = 1 + 2 + 32 + 16;
/// Flood frames sent in the flood-alone phase (a fifth of it with the agent).
const FLOOD_FRAMES: usize = 100_352;
/// Connection attempts in the flood-alone phase (half of it with the agent).
const FLOOD_ATTEMPTS: usize = 4_000;
/// The class budget the server runs with.
const CLASSES_PER_HOUR: u64 = 4;

struct Server {
    child: Child,
    addr: SocketAddr,
    metrics: SocketAddr,
}

fn start_server(data: &Path, key: &Path) -> Server {
    let (child, started) = spawn_serve(
        data,
        key,
        &[
            "--listen",
            "127.0.0.1:0",
            "--metrics",
            "127.0.0.1:0",
            "--connections-per-source",
            "8",
            "--new-connections-per-source",
            "50",
            "--new-classes-per-hour",
            &CLASSES_PER_HOUR.to_string(),
        ],
    );
    Server {
        child,
        addr: started.listening,
        metrics: started.metrics.unwrap(),
    }
}

impl Server {
    fn stop(mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }

    /// Resident memory in KiB (VmRSS).
    fn rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap()
    }

    /// The metrics page, as name{labels} -> value.
    fn metrics(&self) -> BTreeMap<String, u64> {
        let mut stream = std::net::TcpStream::connect(self.metrics).unwrap();
        stream
            .write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            .unwrap();
        let mut page = String::new();
        stream.read_to_string(&mut page).unwrap();
        page.lines()
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| {
                let (name, value) = l.rsplit_once(' ')?;
                Some((name.to_string(), value.parse().ok()?))
            })
            .collect()
    }
}

fn config(data: &Path, server: &Server) -> ClientConfig {
    let trust = Trust::load_pinned(&data.join("tls").join("cert.pem")).unwrap();
    let mut config = ClientConfig::new(server.addr, "localhost", trust);
    config.connect_timeout = Duration::from_secs(3);
    config.ack_timeout = Duration::from_secs(10);
    config
}

fn framed(body: &[u8]) -> Vec<u8> {
    let mut frame = (body.len() as u32).to_be_bytes().to_vec();
    frame.extend_from_slice(body);
    frame
}

/// One flood frame: random bytes (some announcing a frame length, some not), or a report
/// body (from `template`) with a fresh report id and a snippet hash no fingerprint makes.
fn flood_frame(template: &[u8], rng: &mut impl RngCore) -> Vec<u8> {
    match rng.random_range(0..6) {
        0 => {
            let mut junk = vec![0u8; rng.random_range(1..1_500)];
            rng.fill_bytes(&mut junk);
            junk
        }
        1 => {
            let mut junk = vec![0u8; rng.random_range(1..1_500)];
            rng.fill_bytes(&mut junk);
            framed(&junk)
        }
        kind => {
            let mut body = with_report_id(template, rng.random());
            let snippet = &mut body[SNIPPET_AT..SNIPPET_AT + 32];
            match kind {
                2 => snippet.fill(0),
                3 => snippet.fill(0xff),
                4 => {
                    // A fine-looking hash with bits set past the 200 it may use.
                    rng.fill_bytes(&mut snippet[..25]);
                    snippet[25..].fill(0);
                    snippet[25 + rng.random_range(0..7)] |= 1 << rng.random_range(0..8);
                }
                _ => {
                    // One value repeated 100 times (the empty window's hash has all threes).
                    let v: u8 = rng.random_range(0..4);
                    snippet[..25].fill(v * 0b0101_0101);
                    snippet[25..].fill(0);
                }
            }
            framed(&body)
        }
    }
}

#[derive(Default)]
struct Tally {
    frames: AtomicU64,
    connections: AtomicU64,
    accepted: AtomicU64,
}

/// Sends `frames` flood frames over `connections` connections from 127.0.0.2, and
/// `attempts` frames each on a fresh connection (a connection attempt each) from there too.
async fn flood(
    mut base: ClientConfig,
    template: Arc<Vec<u8>>,
    frames: usize,
    connections: usize,
    attempts: usize,
    tally: Arc<Tally>,
) {
    base.local_ip = Some(FLOODER);
    base.retry = RetryPolicy::none();
    base.connect_timeout = Duration::from_secs(2);
    let mut tasks = Vec::new();
    for c in 0..connections {
        let config = base.clone().shared_connection_for_load_testing();
        let (template, tally) = (template.clone(), tally.clone());
        tasks.push(tokio::spawn(async move {
            let client = Client::new(config).unwrap();
            let mut workers = Vec::new();
            for w in 0..16 {
                let (client, template, tally) = (client.clone(), template.clone(), tally.clone());
                workers.push(tokio::spawn(async move {
                    let mut rng = rng((c * 16 + w) as u64);
                    for _ in 0..frames / connections / 16 {
                        let frame = flood_frame(&template, &mut rng);
                        if let Ok(ack) = client.send_raw(&frame).await {
                            tally.frames.fetch_add(1, Ordering::Relaxed);
                            if ack.status == AckStatus::Accepted {
                                tally.accepted.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    }
                }));
            }
            for w in workers {
                w.await.unwrap();
            }
            client.close().await;
        }));
    }
    for t in 0..8 {
        let client = Client::new(base.clone()).unwrap();
        let (template, tally) = (template.clone(), tally.clone());
        tasks.push(tokio::spawn(async move {
            let mut rng = rng(1_000 + t);
            for _ in 0..attempts / 8 {
                tally.connections.fetch_add(1, Ordering::Relaxed);
                let frame = flood_frame(&template, &mut rng);
                if let Ok(ack) = client.send_raw(&frame).await
                    && ack.status == AckStatus::Accepted
                {
                    tally.accepted.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
}

/// Sends `reports` as an agent would (a fresh connection each, retries), four at a time;
/// returns how many were acked Accepted.
async fn deliver(data: &Path, server: &Server, reports: &[Sent]) -> usize {
    let agent = Client::new(config(data, server)).unwrap();
    let mut tasks = Vec::new();
    for chunk in reports.chunks(reports.len().div_ceil(4)) {
        let (agent, chunk) = (agent.clone(), chunk.to_vec());
        tasks.push(tokio::spawn(async move {
            let mut accepted = 0;
            for s in chunk {
                let ack = agent.send_with_retry(&decode(&s.frame)).await;
                let ack = ack.unwrap_or_else(|e| panic!("an agent report was not delivered: {e}"));
                assert_eq!(ack.report_id, s.report_id);
                assert_eq!(ack.status, AckStatus::Accepted, "an agent report");
                accepted += 1;
            }
            accepted
        }));
    }
    let mut accepted = 0;
    for t in tasks {
        accepted += t.await.unwrap();
    }
    accepted
}

fn decode(body: &[u8]) -> Report {
    match Message::decode_body(body).unwrap() {
        Message::Report(r) => r,
        _ => unreachable!(),
    }
}

fn open_store(data: &Path) -> Arc<dyn Store> {
    Arc::new(RocksStore::open(&data.join("db")).unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_changes_nothing_and_every_agent_report_is_counted_once() {
    let started = Instant::now();
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let key = dir.path().join("public.key");
    std::fs::write(&key, KEYS_2048.public_key().to_bytes()).unwrap();
    let apps = snippets(3, 4);
    let mut rng = rng(17);
    let agent_reports: Vec<Sent> = (0..60)
        .map(|i| {
            report_2048(
                apps[i % apps.len()].1,
                CounterId(4 + (i % 3) as u16),
                &mut rng,
            )
        })
        .collect();
    // The flood's template: a valid report never sent as it is.
    let template = Arc::new(report_2048(apps[0].1, CounterId(4), &mut rng).frame);
    // Valid reports with fresh, well-formed snippet hashes (each would found a class).
    let founders: Vec<Sent> = (0..40)
        .map(|_| {
            let mut hash = [0u8; 32];
            rng.fill_bytes(&mut hash[..25]);
            report_2048(SnippetHash(hash), CounterId(4), &mut rng)
        })
        .collect();
    eprintln!("reports encrypted after {:?}", started.elapsed());

    // 1. The agent alone.
    let server = start_server(&data, &key);
    assert_eq!(deliver(&data, &server, &agent_reports[..20]).await, 20);
    server.stop();
    let before = dump(open_store(&data).as_ref());

    // 2. The flood alone.
    let server = start_server(&data, &key);
    // Let start-up settle before taking the baseline.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let rss_before = server.rss_kib();
    let flood_started = Instant::now();
    let tally = Arc::new(Tally::default());
    flood(
        config(&data, &server),
        template.clone(),
        FLOOD_FRAMES,
        4,
        FLOOD_ATTEMPTS,
        tally.clone(),
    )
    .await;
    let flood_took = flood_started.elapsed();
    let rss_after = server.rss_kib();
    let metrics = server.metrics();
    server.stop();
    let frames = tally.frames.load(Ordering::Relaxed);
    let refused_invalid_snippet =
        metrics["penrose_reports_rejected_total{reason=\"invalid_snippet\"}"];
    let refused_rate =
        metrics["penrose_transport_connections_total{outcome=\"refused_source_rate\"}"];
    let retries = metrics["penrose_transport_connections_total{outcome=\"retry_sent\"}"];
    eprintln!(
        "flood alone: {frames} frames acked and {} connection attempts in {flood_took:?}; \
         {refused_invalid_snippet} refused as invalid snippets, {retries} Retries sent, \
         {refused_rate} connections refused by the per-source rate; \
         server RSS {rss_before} KiB -> {rss_after} KiB",
        tally.connections.load(Ordering::Relaxed),
    );
    assert_eq!(
        tally.accepted.load(Ordering::Relaxed),
        0,
        "a flood frame was accepted"
    );
    assert!(
        frames >= FLOOD_FRAMES as u64 * 99 / 100,
        "{frames} flood frames acked"
    );
    assert!(
        refused_invalid_snippet >= frames / 2,
        "{refused_invalid_snippet} of {frames}"
    );
    assert!(
        refused_rate > 0,
        "the connection attempts outran the per-source rate"
    );
    assert_eq!(metrics["penrose_reports_accepted_total"], 0);
    let after = dump(open_store(&data).as_ref());
    assert!(
        before == after,
        "the flood changed the store: {} rows before, {} after",
        before.len(),
        after.len()
    );
    let growth_mib = rss_after.saturating_sub(rss_before) / 1024;
    assert!(
        growth_mib < 64,
        "the server grew by {growth_mib} MiB under the flood"
    );

    // 3. The flood, the class founders and the agent together.
    let server = start_server(&data, &key);
    let tally = Arc::new(Tally::default());
    let flooding = tokio::spawn(flood(
        config(&data, &server),
        template.clone(),
        FLOOD_FRAMES / 5,
        4,
        FLOOD_ATTEMPTS / 2,
        tally.clone(),
    ));
    let founding = {
        let mut config = config(&data, &server);
        config.local_ip = Some(FLOODER);
        let founders = founders.clone();
        tokio::spawn(async move {
            let client = Client::new(config.shared_connection_for_load_testing()).unwrap();
            let mut statuses = Vec::new();
            for s in &founders {
                let ack = client.send_with_retry(&decode(&s.frame)).await.unwrap();
                statuses.push(ack.status);
            }
            client.close().await;
            statuses
        })
    };
    assert_eq!(deliver(&data, &server, &agent_reports[20..]).await, 40);
    let statuses = founding.await.unwrap();
    flooding.await.unwrap();
    let metrics = server.metrics();
    server.stop();
    let founded = statuses
        .iter()
        .filter(|s| **s == AckStatus::Accepted)
        .count() as u64;
    let limited = statuses
        .iter()
        .filter(|s| **s == AckStatus::Rejected(RejectReason::NewClassLimit))
        .count() as u64;
    eprintln!(
        "flood with the agent: {} flood frames, {founded} classes founded by the flood's valid \
         reports, {limited} refused by the class budget",
        tally.frames.load(Ordering::Relaxed)
    );
    assert_eq!(tally.accepted.load(Ordering::Relaxed), 0);
    assert_eq!(
        (founded, limited),
        (CLASSES_PER_HOUR, 40 - CLASSES_PER_HOUR)
    );
    assert_eq!(
        metrics["penrose_reports_rejected_total{reason=\"new_class_limit\"}"],
        limited
    );

    // Every agent report counted once, the sums exactly the agent's.
    let (store, state) = reopen_served(&data);
    assert_eq!(state.accepted(), 60 + founded);
    assert_eq!(state.tables().class_count() as u64, 3 + founded);
    let keys: Vec<Vec<u8>> = agent_reports
        .iter()
        .map(|s| seen::id_key(s.day, &s.report_id))
        .collect();
    let keys: Vec<&[u8]> = keys.iter().map(Vec::as_slice).collect();
    assert!(
        store
            .contains_many(Table::Seen, &keys)
            .unwrap()
            .iter()
            .all(|&b| b)
    );
    let want = expected(&agent_reports, |s| state.class_of(s).unwrap().unwrap());
    let mut got = decrypt_store_with(&KEYS_2048, store.as_ref());
    got.retain(|(class, _), _| want.keys().any(|(c, _)| c == class));
    assert_eq!(got, want);
    eprintln!("whole test: {:?}", started.elapsed());
}
