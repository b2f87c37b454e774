//! Crash safety: the real server binary under load over QUIC on loopback, killed with SIGKILL
//! at random moments (10 times) and restarted, while clients keep sending and retrying. After
//! the last restart every report must have been counted exactly once: each one that was ever
//! acked is answered as a duplicate, and the decrypted sums equal the sum of all reports.
//!
//! Every third report is queued twice, so that two clients send it at nearly the same moment:
//! the second copy often lands in the batch after the first, while the first is still syncing
//! (the writer aggregates batch n+1 while batch n syncs). Its `Duplicate` ack counts as an ack
//! here, so a server that answered it before the first copy was durable would lose it at the
//! next kill, and the test would fail.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::Path;
use std::process::Child;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use penrose_core::counters::CounterId;
use penrose_core::wire::{AckStatus, ReportId};
use penrose_transport::{Client, ClientConfig, RetryPolicy, Trust};
use rand::Rng;

const KILLS: usize = 10;
/// New reports the clients get each round, on top of the ones not yet acked.
const CHUNK: usize = 300;

fn free_udp_port() -> u16 {
    std::net::UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn start_server(data: &Path, key: &Path, addr: SocketAddr) -> Child {
    let addr = addr.to_string();
    let (child, started) = spawn_serve(
        data,
        key,
        &[
            "--listen",
            &addr,
            "--max-batch",
            "64",
            "--reports-per-second",
            "0",
        ],
    );
    assert_eq!(
        started.listening.to_string(),
        addr,
        "server did not start: {started:?}"
    );
    child
}

async fn client(data: &Path, addr: SocketAddr) -> Client {
    let trust = Trust::load_pinned(&data.join("tls").join("cert.pem")).unwrap();
    // Many tasks keep the server under load: the load generator's shared connection.
    let mut config =
        ClientConfig::new(addr, "localhost", trust).shared_connection_for_load_testing();
    config.retry = RetryPolicy::none();
    config.connect_timeout = Duration::from_secs(2);
    config.ack_timeout = Duration::from_secs(3);
    config.idle_timeout = Duration::from_secs(3);
    Client::connect(config).await.unwrap()
}

/// The indexes of `range` for the pending queue (popped from the back, so in order), every
/// third one twice in a row (module docs).
fn queue(range: std::ops::Range<usize>) -> impl Iterator<Item = usize> {
    range
        .rev()
        .flat_map(|i| std::iter::repeat_n(i, if i % 3 == 0 { 2 } else { 1 }))
}

fn full_frame(body: &[u8]) -> Vec<u8> {
    let mut frame = (body.len() as u32).to_be_bytes().to_vec();
    frame.extend_from_slice(body);
    frame
}

/// Sends every pending report (each client task takes the next), putting back those that got
/// no ack. With `keep_going`, once the queue is empty the tasks resend reports already acked
/// (which must come back as duplicates), so that the server is under load whenever it is
/// killed; they stop when the server is gone. Without, they stop when the queue is empty.
async fn send_pending(
    client: Arc<Client>,
    sent: Arc<Vec<Sent>>,
    pending: Arc<Mutex<Vec<usize>>>,
    acked: Arc<Mutex<HashSet<ReportId>>>,
    tasks: usize,
    keep_going: bool,
) {
    let mut handles = Vec::new();
    for _ in 0..tasks {
        let (client, sent, pending, acked) = (
            Arc::clone(&client),
            Arc::clone(&sent),
            Arc::clone(&pending),
            Arc::clone(&acked),
        );
        handles.push(tokio::spawn(async move {
            let mut rng = rng(rand::random());
            loop {
                let next = pending.lock().unwrap().pop();
                let (i, resend) = match next {
                    Some(i) => (i, false),
                    None if keep_going => {
                        let i = rng.random_range(0..sent.len());
                        if !acked.lock().unwrap().contains(&sent[i].report_id) {
                            continue;
                        }
                        (i, true)
                    }
                    None => return,
                };
                match client.send_raw(&full_frame(&sent[i].frame)).await {
                    Ok(ack) => {
                        assert_eq!(ack.report_id, sent[i].report_id);
                        if resend {
                            assert_eq!(
                                ack.status,
                                AckStatus::Duplicate,
                                "an acked report was lost"
                            );
                        } else {
                            assert!(
                                matches!(ack.status, AckStatus::Accepted | AckStatus::Duplicate),
                                "{:?}",
                                ack.status
                            );
                        }
                        acked.lock().unwrap().insert(sent[i].report_id);
                    }
                    Err(_) => {
                        // Not acked: the client retries it in a later round.
                        if !resend {
                            pending.lock().unwrap().push(i);
                        }
                        return;
                    }
                }
            }
        }));
    }
    for h in handles {
        h.await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_under_load_loses_no_acked_report_and_counts_none_twice() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let key = dir.path().join("public.key");
    // The server refuses keys under 2048 bits.
    std::fs::write(&key, KEYS_2048.public_key().to_bytes()).unwrap();
    let addr: SocketAddr = format!("127.0.0.1:{}", free_udp_port()).parse().unwrap();

    let snippets = snippets(3, 2);
    let mut rng = rng(9);
    let sent: Arc<Vec<Sent>> = Arc::new(
        (0..CHUNK * (KILLS + 1))
            .map(|i| {
                report_2048(
                    snippets[i % snippets.len()].1,
                    CounterId(4 + (i % 5) as u16),
                    &mut rng,
                )
            })
            .collect(),
    );
    let pending = Arc::new(Mutex::new(Vec::new()));
    let acked = Arc::new(Mutex::new(HashSet::new()));
    let mut acked_before_kill = Vec::new();

    for round in 0..KILLS {
        pending
            .lock()
            .unwrap()
            .extend(queue(round * CHUNK..(round + 1) * CHUNK));
        let mut server = start_server(&data, &key, addr);
        let client = Arc::new(client(&data, addr).await);
        let sender = tokio::spawn(send_pending(
            Arc::clone(&client),
            Arc::clone(&sent),
            Arc::clone(&pending),
            Arc::clone(&acked),
            24,
            true,
        ));
        tokio::time::sleep(Duration::from_millis(rng.random_range(20..400))).await;
        server.kill().unwrap();
        server.wait().unwrap();
        let _ = tokio::time::timeout(Duration::from_secs(20), sender).await;
        client.close().await;
        acked_before_kill.push(acked.lock().unwrap().len());
        eprintln!(
            "round {round}: killed with {} of {} acked, {} pending",
            acked_before_kill[round],
            sent.len(),
            pending.lock().unwrap().len()
        );
    }
    assert!(
        acked_before_kill.windows(2).any(|w| w[1] > w[0]),
        "reports must have been acked between kills: {acked_before_kill:?}"
    );

    // Restart once more; the clients deliver the rest, then resend everything: every report,
    // acked before a crash or not, is now known to the server.
    pending
        .lock()
        .unwrap()
        .extend(queue(KILLS * CHUNK..sent.len()));
    let mut server = start_server(&data, &key, addr);
    let client = Arc::new(client(&data, addr).await);
    while !pending.lock().unwrap().is_empty() {
        send_pending(
            Arc::clone(&client),
            Arc::clone(&sent),
            Arc::clone(&pending),
            Arc::clone(&acked),
            24,
            false,
        )
        .await;
    }
    assert_eq!(acked.lock().unwrap().len(), sent.len());
    for s in sent.iter() {
        let ack = client.send_raw(&full_frame(&s.frame)).await.unwrap();
        assert_eq!(ack.status, AckStatus::Duplicate, "an acked report was lost");
    }
    client.close().await;
    server.kill().unwrap();
    server.wait().unwrap();

    // Exactly once: the decrypted sums are those of every report once, and the counts agree.
    let (store, state) = reopen_served(&data);
    assert_eq!(state.accepted(), sent.len() as u64);
    let want = expected(&sent, |s| state.class_of(s).unwrap().unwrap());
    assert_eq!(decrypt_store_with(&KEYS_2048, store.as_ref()), want);
}
