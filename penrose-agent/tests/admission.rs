//! Admission tokens, end to end on loopback: the agent's fetcher and uploader (the library,
//! with a day the test moves) against an in-test issuer (`common::tokens`: penrose-core's
//! token keys behind `serve_exchange`, with a quota) and an aggregation stand-in that verifies
//! each report's token and records spent ones; and the daemon itself with both.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use std::collections::HashSet;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::tokens::*;
use common::*;
use penrose_agent::admission::{FetchTiming, Fetcher, ISSUER_PROTOCOL};
use penrose_agent::spool::Spool;
use penrose_agent::status::AgentStatus;
use penrose_agent::tokens::{TokenCount, TokenStore};
use penrose_agent::upload::{self, UploadConfig};
use penrose_core::counters::{CatalogueVersion, CounterId};
use penrose_core::fingerprint::SnippetHash;
use penrose_core::histogram::SampleCount;
use penrose_core::paillier::KeyId;
use penrose_core::tokens::TokenScope;
use penrose_core::tokens::protocol::{Credential, IssuerRequest};
use penrose_core::wire::{AckStatus, Day, Message, PackedBytes, RejectReason, Report, ReportId};
use penrose_host::clock::{Clock, ManualClock};
use penrose_transport::exchange::ExchangeClient;
use penrose_transport::{ClientConfig, Identity, RetryPolicy, Server, Trust};
use rand::RngCore;
use tokio::sync::Notify;

const DAY: u32 = 20_500;
const LONG: Duration = Duration::from_secs(60);
const CREDENTIAL: Credential = Credential([0x42; 32]);
/// This host's credential at the release auditor's party's issuer.
const EVIDENCE_CREDENTIAL: Credential = Credential([0x43; 32]);

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// A report as the pipeline seals one (two 512-byte ciphertexts: a 2048-bit key's size).
fn report(day: u32, counter: u16) -> Report {
    let mut id = [0u8; 16];
    rand::rng().fill_bytes(&mut id);
    let mut snippet = [0u8; 32];
    rand::rng().fill_bytes(&mut snippet);
    Report {
        key_id: KeyId([9; 32]),
        report_id: ReportId(id),
        snippet: SnippetHash(snippet),
        locator: penrose_core::fingerprint::Locator([0; penrose_core::fingerprint::LOCATOR_BANDS]),
        arch: penrose_core::gpu::GpuArch::new(9, 0),
        counter: CounterId(counter),
        catalogue: CatalogueVersion(1),
        day: Day(day),
        samples: SampleCount(40),
        ciphertexts: PackedBytes::new(vec![0x5a; 1024], 2).unwrap(),
        token: None,
        evidence: None,
    }
}

/// An agent's uploader and fetcher with their servers, on a day the test moves.
struct Rig {
    dir: tempfile::TempDir,
    issuer: Arc<IssuerState>,
    issuer_identity: Identity,
    issuer_server: Option<Server>,
    server: Arc<TokenServer>,
    _aggregator: Server,
    aggregator_identity: Identity,
    day: Arc<ManualClock>,
    spool: Arc<Mutex<Spool>>,
    status: Arc<Mutex<AgentStatus>>,
    store: Arc<Mutex<TokenStore>>,
    stop: Arc<AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    scopes: Vec<TokenScope>,
    /// The evidence token store the uploader spends from, if any.
    evidence: Option<Arc<Mutex<TokenStore>>>,
}

impl Rig {
    async fn new(days: &[u32], scopes: &[u16], quota: u16) -> Rig {
        let dir = tempfile::tempdir().unwrap();
        let issuer = IssuerState::new(days, scopes, quota, CREDENTIAL);
        let issuer_identity = Identity::self_signed(vec![ISSUER_NAME.to_string()]).unwrap();
        let issuer_server = start_issuer(&issuer_identity, Arc::clone(&issuer)).await;
        let aggregator_identity = Identity::self_signed(vec![SERVER_NAME.to_string()]).unwrap();
        let server = TokenServer::new(Arc::clone(&issuer));
        let aggregator = start_token_server(
            &aggregator_identity,
            "127.0.0.1:0".parse().unwrap(),
            Arc::clone(&server),
        )
        .await;
        let spool = Spool::open(&dir.path().join("spool"), 1 << 20).unwrap();
        let store = TokenStore::open(&dir.path().join("tokens")).unwrap();
        Rig {
            issuer,
            issuer_identity,
            issuer_server: Some(issuer_server),
            server,
            _aggregator: aggregator,
            aggregator_identity,
            day: Arc::new(ManualClock::at_day(Day(days[0]))),
            spool: Arc::new(Mutex::new(spool)),
            status: Arc::new(Mutex::new(AgentStatus::default())),
            store: Arc::new(Mutex::new(store)),
            stop: Arc::new(AtomicBool::new(false)),
            tasks: Vec::new(),
            scopes: scopes.iter().map(|&s| TokenScope(s)).collect(),
            evidence: None,
            dir,
        }
    }

    fn clock(&self) -> Arc<dyn Clock> {
        Arc::clone(&self.day) as Arc<dyn Clock>
    }

    fn push(&self, report: &Report) {
        let frame = Message::Report(report.clone()).to_frame().unwrap();
        self.spool
            .lock()
            .unwrap()
            .push(report.report_id, &frame)
            .unwrap();
    }

    fn fetcher(&self) -> Fetcher {
        let issuer = self.issuer_server.as_ref().unwrap().local_addr();
        let mut config = ClientConfig::new(issuer, ISSUER_NAME, Trust::pin(&self.issuer_identity));
        config.connect_timeout = Duration::from_secs(2);
        config.ack_timeout = Duration::from_secs(5);
        let client = ExchangeClient::new(config, ISSUER_PROTOCOL).unwrap();
        Fetcher::new(
            client,
            CREDENTIAL,
            Arc::clone(&self.store),
            Arc::clone(&self.status),
            self.clock(),
        )
        .with_scopes(self.scopes.clone())
    }

    /// Starts the uploader, and the fetcher unless `fetch` is false.
    fn start(&mut self, fetch: bool) {
        let wake = Arc::new(Notify::new());
        let mut shared = upload::Shared::new(
            Arc::clone(&self.spool),
            Arc::clone(&self.status),
            Arc::clone(&wake),
            Arc::clone(&self.stop),
        );
        shared.tokens = Some(Arc::clone(&self.store));
        shared.evidence = self.evidence.clone();
        shared.clock = self.clock();
        let mut client = ClientConfig::new(
            self._aggregator.local_addr(),
            SERVER_NAME,
            Trust::pin(&self.aggregator_identity),
        );
        client.retry = RetryPolicy {
            attempts: 2,
            base_delay: Duration::from_millis(50),
            max_delay: Duration::from_millis(200),
            jitter: 0.5,
        };
        client.connect_timeout = Duration::from_secs(2);
        client.ack_timeout = Duration::from_secs(5);
        let config = UploadConfig {
            client,
            delay_max: Duration::from_millis(10),
            backoff_base: Duration::from_millis(50),
            backoff_max: Duration::from_millis(300),
        };
        if fetch {
            let timing = FetchTiming {
                refresh_max: Duration::from_secs(3600),
                retry_min: Duration::from_millis(200),
            };
            self.tasks.push(tokio::spawn(penrose_agent::admission::run(
                self.fetcher(),
                timing,
                Arc::clone(&self.stop),
                wake,
            )));
        }
        self.tasks.push(tokio::spawn(upload::run(config, shared)));
    }

    async fn stop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        for task in self.tasks.drain(..) {
            task.await.unwrap();
        }
    }

    fn accepted(&self) -> usize {
        self.server.seen.lock().unwrap().accepted.len()
    }

    fn spooled(&self) -> usize {
        self.spool.lock().unwrap().entries().len()
    }

    fn counts(&self) -> Vec<(u32, u16, u32, u32)> {
        self.store
            .lock()
            .unwrap()
            .counts()
            .iter()
            .map(|c| (c.epoch, c.scope, c.unspent, c.in_flight))
            .collect()
    }
}

async fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < LONG, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Reports go with a token of their day and counter, each verified by the server; the key set
/// is asked for without a credential, on an exchange (a connection) of its own; the issuance
/// request carries the credential; every exchange had a connection of its own.
#[test]
fn reports_go_with_tokens_and_the_key_set_fetch_carries_no_credential() {
    runtime().block_on(async {
        let mut rig = Rig::new(&[DAY, DAY + 1], &[0, 3], 24).await;
        let reports: Vec<Report> = [0, 0, 3, 3].iter().map(|&c| report(DAY, c)).collect();
        for r in &reports {
            rig.push(r);
        }
        rig.start(true);
        wait_for("4 reports accepted", || rig.accepted() == 4).await;
        wait_for("an empty spool", || rig.spooled() == 0).await;
        rig.stop().await;

        // What the issuer received: first the key set request, two bytes, no credential; then
        // one issue request for 2 days x 2 counters, with the credential.
        let requests = rig.issuer.requests.lock().unwrap().clone();
        assert_eq!(requests[0], IssuerRequest::KeySet.encode());
        assert_eq!(requests[0].len(), 2);
        assert!(!requests[0].windows(4).any(|w| w == [0x42; 4]));
        assert_eq!(requests.len(), 2, "one key set, one issuance");
        match IssuerRequest::decode(&requests[1]).unwrap() {
            IssuerRequest::Issue {
                credential,
                batches,
            } => {
                assert_eq!(credential, CREDENTIAL);
                assert_eq!(batches.len(), 4);
            }
            IssuerRequest::KeySet => panic!("two key set requests"),
        }
        // A connection per exchange.
        let stats = rig.issuer_server.as_ref().unwrap().stats();
        assert_eq!(stats.connections_accepted, 2, "{stats:?}");

        // Every report arrived once, with a verified token of its day and counter.
        let seen = rig.server.seen.lock().unwrap();
        for r in &reports {
            let got = &seen.accepted[&r.report_id];
            assert!(got.token.is_some());
            assert_eq!((got.day, got.counter), (r.day, r.counter));
        }
        assert_eq!(seen.spent.len(), 4);
        // The frame grows by exactly the 100 bytes of the redemption.
        let plain = Message::Report(reports[0].clone())
            .to_frame()
            .unwrap()
            .len();
        let body = seen.received[0].2;
        assert_eq!(body + 4, plain + 100);
        eprintln!(
            "report frame: {plain} bytes without a token, {} with one (+100)",
            body + 4
        );
        drop(seen);

        // The store: the quota of both days, less the four spent; nothing in flight.
        assert_eq!(
            rig.counts(),
            vec![
                (DAY, 0, 22, 0),
                (DAY, 3, 22, 0),
                (DAY + 1, 0, 24, 0),
                (DAY + 1, 3, 24, 0)
            ]
        );
        let status = rig.status.lock().unwrap().tokens.clone();
        assert_eq!((status.issued, status.spent, status.discarded), (96, 4, 0));
        assert_eq!(status.partition_warnings, 0);
        assert_eq!(status.fetches, 1);
    });
}

/// With a quota of 3 per (day, counter), 3 of 5 reports of one counter and day go; the other
/// 2 wait in the spool (not sent, not lost) while the day lasts, and the next day they are
/// re-stamped to it and go with its tokens.
#[test]
fn with_a_quota_of_three_two_of_five_reports_wait_for_the_next_days_tokens() {
    runtime().block_on(async {
        let mut rig = Rig::new(&[DAY, DAY + 1, DAY + 2], &[5], 3).await;
        let reports: Vec<Report> = (0..5).map(|_| report(DAY, 5)).collect();
        for r in &reports {
            rig.push(r);
        }
        rig.start(true);
        wait_for("3 reports accepted", || rig.accepted() == 3).await;
        wait_for("2 reports waiting", || {
            rig.status.lock().unwrap().tokens.waiting == 2
        })
        .await;
        tokio::time::sleep(Duration::from_millis(1500)).await;
        assert_eq!(rig.accepted(), 3);
        assert_eq!(rig.spooled(), 2, "the other two are kept");
        assert_eq!(
            rig.server.seen.lock().unwrap().received.len(),
            3,
            "and not sent without a token"
        );
        // The issuer's quota: 24 asked for, 3 left, asked again for 3, for both days.
        assert_eq!(rig.counts(), vec![(DAY + 1, 5, 3, 0)]);
        assert_eq!(rig.status.lock().unwrap().tokens.issued, 6);

        rig.day.advance(penrose_host::clock::SECONDS_PER_DAY);
        wait_for("5 reports accepted", || rig.accepted() == 5).await;
        wait_for("an empty spool", || rig.spooled() == 0).await;
        rig.stop().await;
        let seen = rig.server.seen.lock().unwrap();
        let days: Vec<u32> = reports
            .iter()
            .map(|r| seen.accepted[&r.report_id].day.0)
            .collect();
        let mut sorted = days.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, vec![DAY, DAY, DAY, DAY + 1, DAY + 1], "{days:?}");
        assert_eq!(rig.status.lock().unwrap().tokens.restamped, 2);
        // No report was refused on the way.
        assert!(
            seen.received
                .iter()
                .all(|(_, status, _)| *status == AckStatus::Accepted)
        );
    });
}

/// A server answering TokenSpent, then InvalidToken: the agent discards the first refused
/// token and sends the report again once with another; refused again, the report is set aside
/// (moved to rejected) rather than fed a third token.
#[test]
fn a_report_refused_for_its_token_goes_again_once_then_is_set_aside() {
    runtime().block_on(async {
        let mut rig = Rig::new(&[DAY, DAY + 1], &[2], 24).await;
        rig.server
            .force
            .lock()
            .unwrap()
            .extend([RejectReason::TokenSpent, RejectReason::InvalidToken]);
        let r = report(DAY, 2);
        rig.push(&r);
        rig.start(true);
        wait_for("the report set aside", || {
            rig.status.lock().unwrap().uploads.rejected == 1
        })
        .await;
        wait_for("an empty spool", || rig.spooled() == 0).await;
        // Nothing more goes: no third token is offered.
        tokio::time::sleep(Duration::from_millis(800)).await;
        rig.stop().await;
        let seen = rig.server.seen.lock().unwrap();
        let attempts: Vec<_> = seen
            .received
            .iter()
            .map(|(report, status, _)| {
                assert_eq!(report.report_id, r.report_id);
                (report.token.unwrap().0[36..68].to_vec(), *status)
            })
            .collect();
        let statuses: Vec<_> = attempts.iter().map(|a| a.1).collect();
        assert_eq!(
            statuses,
            vec![
                AckStatus::Rejected(RejectReason::TokenSpent),
                AckStatus::Rejected(RejectReason::InvalidToken),
            ]
        );
        let nonces: HashSet<_> = attempts.iter().map(|a| a.0.clone()).collect();
        assert_eq!(nonces.len(), 2, "a new token for the one retry");
        assert!(seen.accepted.is_empty());
        let tokens = rig.status.lock().unwrap().tokens.clone();
        assert_eq!((tokens.discarded, tokens.spent), (2, 0));
        assert_eq!(rig.counts()[0], (DAY, 2, 22, 0));
    });
}

/// With an evidence store, each report goes with an evidence token of its day and counter
/// besides its admission token, and keeps that same evidence token when it goes again after
/// its admission token was refused (only the auditor can check it); a report whose counter
/// has no evidence token goes without one, counted, rather than waiting.
#[test]
fn reports_carry_evidence_tokens_kept_across_a_retry_and_go_without_when_none_is_held() {
    runtime().block_on(async {
        // One issuer serves both here (the daemon test keeps them apart): a quota of 48 leaves
        // the admission fetcher its 24 after the evidence fetch took its own.
        let mut rig = Rig::new(&[DAY, DAY + 1], &[2, 3], 48).await;
        let evidence = Arc::new(Mutex::new(
            TokenStore::open(&rig.dir.path().join("evidence-tokens")).unwrap(),
        ));
        // Evidence tokens of counter 2 only (the fetcher's own code, counted apart).
        let fetcher = Fetcher::new(
            {
                let issuer = rig.issuer_server.as_ref().unwrap().local_addr();
                let mut c =
                    ClientConfig::new(issuer, ISSUER_NAME, Trust::pin(&rig.issuer_identity));
                c.ack_timeout = Duration::from_secs(5);
                ExchangeClient::new(c, ISSUER_PROTOCOL).unwrap()
            },
            CREDENTIAL,
            Arc::clone(&evidence),
            Arc::clone(&rig.status),
            rig.clock(),
        )
        .with_scopes(vec![TokenScope(2)])
        .for_evidence();
        assert_eq!(
            fetcher.kind(),
            penrose_agent::admission::TokenKind::Evidence
        );
        fetcher.fetch().await.unwrap();
        rig.evidence = Some(Arc::clone(&evidence));
        rig.server
            .force
            .lock()
            .unwrap()
            .push_back(RejectReason::InvalidToken);
        let first = report(DAY, 2);
        rig.push(&first);
        rig.start(true);
        wait_for("the first report accepted", || rig.accepted() == 1).await;
        let other = report(DAY, 2);
        let without = report(DAY, 3);
        rig.push(&other);
        rig.push(&without);
        wait_for("all three accepted", || rig.accepted() == 3).await;
        rig.stop().await;
        let seen = rig.server.seen.lock().unwrap();
        let sends = |id: ReportId| -> Vec<Report> {
            seen.received
                .iter()
                .filter(|(r, _, _)| r.report_id == id)
                .map(|(r, _, _)| r.clone())
                .collect()
        };
        let tries = sends(first.report_id);
        assert_eq!(
            tries.len(),
            2,
            "refused once for its admission token, then accepted"
        );
        assert_ne!(tries[0].token, tries[1].token, "a new admission token");
        assert!(tries[0].evidence.is_some());
        assert_eq!(
            tries[0].evidence, tries[1].evidence,
            "the same evidence token"
        );
        assert!(sends(other.report_id)[0].evidence.is_some());
        assert_ne!(sends(other.report_id)[0].evidence, tries[0].evidence);
        assert_eq!(sends(without.report_id)[0].evidence, None);
        drop(seen);
        let status = rig.status.lock().unwrap().clone();
        assert_eq!(
            (
                status.evidence.spent,
                status.evidence.sent_without,
                status.evidence.discarded
            ),
            (2, 1, 0)
        );
        assert_eq!(status.evidence.fetches, 1);
        let left: u32 = evidence
            .lock()
            .unwrap()
            .counts()
            .iter()
            .map(|c| c.unspent)
            .sum();
        assert_eq!(left, 2 * 24 - 2, "today's and tomorrow's quota, two spent");
    });
}

/// Overloaded sets aside only the report it answered: the next report goes at once, and the
/// refused one goes again later. The server cannot stall a host's spool by refusing its oldest
/// report.
#[test]
fn an_overloaded_answer_defers_only_its_report_and_never_the_spool_behind_it() {
    runtime().block_on(async {
        let mut rig = Rig::new(&[DAY, DAY + 1], &[0], 24).await;
        rig.server
            .force
            .lock()
            .unwrap()
            .push_back(RejectReason::Overloaded);
        for _ in 0..3 {
            rig.push(&report(DAY, 0));
        }
        rig.start(true);
        wait_for("3 reports accepted", || rig.accepted() == 3).await;
        rig.stop().await;
        let seen = rig.server.seen.lock().unwrap();
        let order: Vec<_> = seen
            .received
            .iter()
            .map(|(report, status, _)| (report.report_id, *status))
            .collect();
        assert_eq!(order.len(), 4, "{order:?}");
        assert_eq!(order[0].1, AckStatus::Rejected(RejectReason::Overloaded));
        assert_ne!(
            order[1].0, order[0].0,
            "the spool behind the refused report waited for it: {order:?}"
        );
        assert_eq!(rig.status.lock().unwrap().uploads.overloaded, 1);
    });
}

/// Tokens the server made the agent discard leave none for today: the report that then waits
/// does not bring a fetch forward (the issuer, who sees the credential, would see the host the
/// aggregation server refused). The next fetch is the scheduled one.
#[test]
fn running_out_of_tokens_never_brings_a_fetch_forward() {
    runtime().block_on(async {
        let mut rig = Rig::new(&[DAY, DAY + 1], &[2], 2).await;
        rig.server
            .force
            .lock()
            .unwrap()
            .extend([RejectReason::TokenSpent, RejectReason::TokenSpent]);
        rig.push(&report(DAY, 2));
        rig.start(true);
        wait_for("the report set aside", || {
            rig.status.lock().unwrap().uploads.rejected == 1
        })
        .await;
        let requests = rig.issuer.requests.lock().unwrap().len();
        assert_eq!(rig.status.lock().unwrap().tokens.fetches, 1);
        assert!(
            rig.counts().iter().all(|c| c.0 != DAY || c.2 == 0),
            "{:?}",
            rig.counts()
        );
        // A report that now has no token waits, for longer than the fetcher's retry_min
        // several times over, without a fetch.
        rig.push(&report(DAY, 2));
        wait_for("a report waiting for a token", || {
            rig.status.lock().unwrap().tokens.waiting == 1
        })
        .await;
        tokio::time::sleep(Duration::from_millis(1500)).await;
        rig.stop().await;
        assert_eq!(rig.issuer.requests.lock().unwrap().len(), requests);
        assert_eq!(rig.status.lock().unwrap().tokens.fetches, 1);
        assert_eq!(rig.spooled(), 1, "the report waits, kept");
    });
}

/// Tokens fetched before a restart are spent after it (the issuer is gone by then); a token
/// file group may read, or a symbolic link in its place, stops the store from opening.
#[test]
fn tokens_survive_a_restart_and_unsafe_token_files_are_refused() {
    runtime().block_on(async {
        let mut rig = Rig::new(&[DAY, DAY + 1], &[1], 2).await;
        let fetched = rig.fetcher().fetch().await.unwrap();
        assert_eq!(fetched.issued, 4);
        let before = rig.counts();
        assert_eq!(before, vec![(DAY, 1, 2, 0), (DAY + 1, 1, 2, 0)]);
        // "Restart": the store is dropped and opened again from disk; the issuer is gone.
        rig.issuer_server.take().unwrap().shutdown().await;
        let dir = rig.dir.path().join("tokens");
        rig.store = Arc::new(Mutex::new(TokenStore::open(&dir).unwrap()));
        assert_eq!(rig.counts(), before);
        let reports = [report(DAY, 1), report(DAY, 1)];
        for r in &reports {
            rig.push(r);
        }
        rig.start(false);
        wait_for("2 reports accepted", || rig.accepted() == 2).await;
        rig.stop().await;
        assert_eq!(rig.counts(), vec![(DAY + 1, 1, 2, 0)]);

        let file = dir.join(format!("{}-1.tokens", DAY + 1));
        std::fs::set_permissions(&file, std::os::unix::fs::PermissionsExt::from_mode(0o640))
            .unwrap();
        let e = TokenStore::open(&dir).unwrap_err().to_string();
        assert!(
            e.contains("mode 640") && e.contains(&file.display().to_string()),
            "{e}"
        );
        let aside = rig.dir.path().join("aside");
        std::fs::rename(&file, &aside).unwrap();
        std::os::unix::fs::symlink(&aside, &file).unwrap();
        let e = TokenStore::open(&dir).unwrap_err().to_string();
        assert!(e.contains("symbolic link"), "{e}");
    });
}

/// A log writer the test reads back.
#[derive(Clone, Default)]
struct Log(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Log {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Log {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

/// An issuer that answers with a key it did not publish (under that key's own id, or under
/// the published key's id with a proof that fails) gets no token stored and a logged
/// partition warning; so does a key set that changes a key the agent saw before (no tokens
/// are then asked for at all).
#[test]
fn an_issuer_answering_with_unpublished_keys_yields_no_tokens_and_a_partition_warning() {
    let log = Log::default();
    let writer = log.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        for rogue in [Rogue::OwnKey, Rogue::PublishedKeyId] {
            let rig = Rig::new(&[DAY, DAY + 1], &[4], 24).await;
            *rig.issuer.rogue.lock().unwrap() = rogue;
            let fetched = rig.fetcher().fetch().await.unwrap();
            assert_eq!((fetched.issued, fetched.partition), (0, 2), "{rogue:?}");
            assert!(fetched.none_for_today);
            assert_eq!(rig.counts(), vec![], "{rogue:?}: no token kept");
            assert_eq!(rig.status.lock().unwrap().tokens.partition_warnings, 2);
            assert_eq!(log.text().matches("PARTITION ATTEMPT").count() % 2, 0);
        }
        assert_eq!(log.text().matches("PARTITION ATTEMPT").count(), 4);

        // A key that changes after it was seen: refused before any issue request.
        let rig = Rig::new(&[DAY, DAY + 1], &[4], 24).await;
        rig.fetcher().fetch().await.unwrap();
        let other = penrose_core::tokens::IssuerKey::generate(
            penrose_core::tokens::TokenEpoch(DAY),
            TokenScope(4),
            &mut rand::rng(),
        );
        *rig.issuer.set.lock().unwrap() = penrose_core::tokens::KeySet::of_keys([&other]).unwrap();
        let asked = rig.issuer.requests.lock().unwrap().len();
        let e = rig.fetcher().fetch().await.unwrap_err().to_string();
        assert!(
            e.contains("PARTITION ATTEMPT") && e.contains("changed"),
            "{e}"
        );
        assert_eq!(
            rig.issuer.requests.lock().unwrap().len(),
            asked + 1,
            "only the key set was asked for"
        );
        assert_eq!(rig.status.lock().unwrap().tokens.partition_warnings, 1);
        // The tokens of the first fetch are still there, the key set as first seen.
        assert_eq!(rig.counts(), vec![(DAY, 4, 24, 0), (DAY + 1, 4, 24, 0)]);
        assert_eq!(log.text().matches("PARTITION ATTEMPT").count(), 5);
    });
    // The credential never reaches the log.
    assert!(!log.text().contains(&"42".repeat(16)));
}

fn write_credential(path: &Path) {
    penrose_agent::spool::write_synced(path, CREDENTIAL.to_file("test host").as_bytes()).unwrap();
}

/// `penrose-agent run` with `[admission]` and `[evidence]`: it fetches tokens from both
/// issuers (each with its own credential), every report it delivers carries a verified
/// admission token and an evidence token that verifies under the evidence issuer's keys only
/// (the release auditor's party), and its status shows token counts per (day, counter),
/// nothing more.
#[test]
fn the_daemon_spends_a_token_on_every_report_and_shows_only_counts() {
    let Some(fixture) = Fixture::new() else {
        return;
    };
    let rt = runtime();
    let today = penrose_host::clock::today().0;
    let scopes: Vec<u16> = penrose_core::counters::Catalogue::current()
        .report_ids()
        .map(|id| id.0)
        .collect();
    let issuer = IssuerState::new(&[today, today + 1], &scopes, 24, CREDENTIAL);
    let issuer_identity = Identity::self_signed(vec![ISSUER_NAME.to_string()]).unwrap();
    let auditors = IssuerState::new(&[today, today + 1], &scopes, 24, EVIDENCE_CREDENTIAL);
    let auditors_identity = Identity::self_signed(vec![ISSUER_NAME.to_string()]).unwrap();
    let (issuer_server, aggregator, server, auditors_server) = rt.block_on(async {
        let issuer_server = start_issuer(&issuer_identity, Arc::clone(&issuer)).await;
        let auditors_server = start_issuer(&auditors_identity, Arc::clone(&auditors)).await;
        let server = TokenServer::new(Arc::clone(&issuer));
        let aggregator = start_token_server(
            &fixture.identity,
            "127.0.0.1:0".parse().unwrap(),
            Arc::clone(&server),
        )
        .await;
        (issuer_server, aggregator, server, auditors_server)
    });
    let issuer_cert = fixture.dir.path().join("issuer.pem");
    issuer_identity
        .save(
            &issuer_cert,
            &fixture.dir.path().join("issuer.key"),
            penrose_transport::Encoding::Pem,
        )
        .unwrap();
    let credential = fixture.dir.path().join("agent.credential");
    write_credential(&credential);
    let auditors_cert = fixture.dir.path().join("evidence-issuer.pem");
    auditors_identity
        .save(
            &auditors_cert,
            &fixture.dir.path().join("evidence-issuer.key"),
            penrose_transport::Encoding::Pem,
        )
        .unwrap();
    let evidence_credential = fixture.dir.path().join("agent-evidence.credential");
    penrose_agent::spool::write_synced(
        &evidence_credential,
        EVIDENCE_CREDENTIAL.to_file("test host").as_bytes(),
    )
    .unwrap();
    let section = |name: &str, addr: std::net::SocketAddr, cert: &Path, cred: &Path| {
        format!(
            "\n[{name}]\naddress = \"{addr}\"\nserver_name = \"{ISSUER_NAME}\"\ncertificate = \"{}\"\ncredential = \"{}\"\nretry_min_seconds = 0.5\n",
            cert.display(),
            cred.display()
        )
    };
    let config = fixture.config(
        aggregator.local_addr(),
        "",
        &(section(
            "admission",
            issuer_server.local_addr(),
            &issuer_cert,
            &credential,
        ) + &section(
            "evidence",
            auditors_server.local_addr(),
            &auditors_cert,
            &evidence_credential,
        )),
    );
    let log = fixture.dir.path().join("agent.log");
    let mut child = spawn_agent(&config, &log);
    wait_until(
        Duration::from_secs(90),
        || server.seen.lock().unwrap().accepted.len() >= 3,
        || std::fs::read_to_string(&log).unwrap_or_default(),
    );
    assert!(terminate(&mut child).success());
    let seen = server.seen.lock().unwrap();
    assert!(
        seen.received
            .iter()
            .all(|(r, status, _)| r.token.is_some() && *status == AckStatus::Accepted),
        "every report carried a token the server verified"
    );
    for (report, _, _) in &seen.received {
        assert!(
            verifies(&auditors, report) && !verifies(&issuer, report),
            "every report carried an evidence token of the auditor's party's issuer alone"
        );
    }
    let mut nonces: Vec<String> = seen
        .received
        .iter()
        .map(|(r, _, _)| penrose_core::hex::encode(&r.token.unwrap().0[36..68]))
        .collect();
    nonces.extend(
        seen.received
            .iter()
            .map(|(r, _, _)| penrose_core::hex::encode(&r.evidence.unwrap().0[36..68])),
    );
    drop(seen);
    let status = fixture.status().unwrap();
    assert!(status.tokens.configured);
    assert!(status.tokens.spent >= 3, "{:?}", status.tokens);
    assert!(status.evidence.configured);
    assert!(status.evidence.spent >= 3, "{:?}", status.evidence);
    assert_eq!(status.evidence.sent_without, 0);
    let held: u32 = status
        .tokens
        .held
        .iter()
        .map(|c: &TokenCount| c.unspent)
        .sum();
    assert!(held > 0, "{:?}", status.tokens.held);
    // What the owner sees holds counts, never a token.
    let shown = std::process::Command::new(agent_binary())
        .args(["status", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    let shown = String::from_utf8_lossy(&shown.stdout).into_owned();
    assert!(shown.contains("admission tokens: configured"), "{shown}");
    assert!(
        shown.contains("evidence tokens (release auditor)"),
        "{shown}"
    );
    assert!(shown.contains("unspent"), "{shown}");
    let inspected = std::process::Command::new(agent_binary())
        .args(["inspect", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    let inspected = String::from_utf8_lossy(&inspected.stdout).into_owned();
    assert!(
        inspected.contains("evidence token of the same form"),
        "{inspected}"
    );
    let status_file = std::fs::read_to_string(fixture.state_dir().join("status.json")).unwrap();
    let agent_log = std::fs::read_to_string(&log).unwrap();
    assert!(agent_log.contains("admission tokens from"), "{agent_log}");
    assert!(agent_log.contains("evidence tokens from"), "{agent_log}");
    assert!(
        agent_log.contains("received (today and tomorrow"),
        "{agent_log}"
    );
    eprintln!("{shown}");
    for text in [&shown, &inspected, &status_file, &agent_log] {
        for nonce in &nonces {
            assert!(!text.contains(nonce.as_str()), "a token's nonce is shown");
        }
        assert!(!text.contains(&"42".repeat(16)), "the credential is shown");
        assert!(
            !text.contains(&"43".repeat(16)),
            "the evidence credential is shown"
        );
    }
    drop(auditors_server);
    drop(issuer_server);
    drop(aggregator);
}

/// Whether the report's evidence token verifies under `issuer`'s key of its day and counter.
fn verifies(issuer: &IssuerState, report: &Report) -> bool {
    let Some(evidence) = &report.evidence else {
        return false;
    };
    let Ok(redemption) = penrose_core::tokens::Redemption::decode(&evidence.0, &issuer.key_set())
    else {
        return false;
    };
    issuer
        .key(redemption.epoch(), redemption.key_id())
        .filter(|key| {
            key.epoch() == penrose_core::tokens::TokenEpoch(report.day.0)
                && key.scope() == TokenScope(report.counter.0)
        })
        .is_some_and(|key| key.verify(&redemption, &report.token_binding()).is_ok())
}

/// `penrose-agent run` without `[admission]` against a server that requires tokens: every
/// report is answered TokenRequired and stays spooled, and the agent says why, once.
#[test]
fn without_admission_a_server_that_requires_tokens_leaves_reports_spooled_and_is_named_once() {
    let Some(fixture) = Fixture::new() else {
        return;
    };
    let rt = runtime();
    let issuer = IssuerState::new(&[DAY], &[0], 24, CREDENTIAL);
    let (aggregator, server) = rt.block_on(async {
        let server = TokenServer::new(issuer);
        let aggregator = start_token_server(
            &fixture.identity,
            "127.0.0.1:0".parse().unwrap(),
            Arc::clone(&server),
        )
        .await;
        (aggregator, server)
    });
    let config = fixture.config(aggregator.local_addr(), "", "");
    let log = fixture.dir.path().join("agent.log");
    let mut child = spawn_agent(&config, &log);
    wait_until(
        Duration::from_secs(90),
        || {
            fixture
                .status()
                .is_some_and(|s| s.tokens.token_required >= 3)
        },
        || std::fs::read_to_string(&log).unwrap_or_default(),
    );
    assert!(terminate(&mut child).success());
    assert!(server.seen.lock().unwrap().accepted.is_empty());
    assert!(!fixture.spool_ids().is_empty(), "the reports stay spooled");
    assert!(
        fixture
            .dir
            .path()
            .join("state/rejected")
            .read_dir()
            .is_err()
            || {
                fixture
                    .dir
                    .path()
                    .join("state/rejected")
                    .read_dir()
                    .unwrap()
                    .next()
                    .is_none()
            }
    );
    let text = std::fs::read_to_string(&log).unwrap();
    assert_eq!(
        text.matches("requires admission tokens").count(),
        1,
        "{text}"
    );
    let shown = std::process::Command::new(agent_binary())
        .args(["status", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    let shown = String::from_utf8_lossy(&shown.stdout).into_owned();
    assert!(shown.contains("NOT configured"), "{shown}");
    drop(aggregator);
}
