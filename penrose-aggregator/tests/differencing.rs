//! Differencing, through both servers: the aggregation server ingests, closes epochs and
//! exports; the design server imports each bundle and reports after each. Whatever the order
//! of imports and reports, two of the design server's reports differ by nothing or by whole
//! released sums of at least k contributors (k x T = 240 reports here at the least, since T =
//! 24 and k = 10), never by a few reports. And one client alone, resending its reports as
//! exact copies, never reaches a decryption.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;

use common::*;
use ed25519_dalek::SigningKey;
use penrose_aggregator::export;
use penrose_aggregator::ingest::{Ingest, Writer};
use penrose_aggregator::store::Store;
use penrose_core::counters::CounterId;
use penrose_core::release::ReleaseRule;
use penrose_core::release::{ReportsPerContributor, Threshold};
use penrose_core::wire::AckStatus;
use penrose_design::archive::Archive;
use penrose_design::report::{self, Report};

const COUNTER: CounterId = CounterId(4);

struct Servers {
    /// `None` only while dropping.
    ingest: Option<Ingest>,
    /// Joined on drop, after `ingest`: a writer left running while the process exits can
    /// crash it inside RocksDB.
    writer: Option<Writer>,
    store: Arc<dyn Store>,
    archive: Archive,
    dir: tempfile::TempDir,
    signing: SigningKey,
    rng: rand_chacha::ChaCha8Rng,
    bundles: usize,
}

impl Drop for Servers {
    fn drop(&mut self) {
        // The writer ends once the last ingest handle is gone.
        self.ingest.take();
        if let Some(writer) = self.writer.take() {
            writer.join().unwrap();
        }
    }
}

impl Servers {
    fn ingest(&self) -> &Ingest {
        self.ingest.as_ref().unwrap()
    }

    /// An aggregation server (its writer runs until `ingest` is dropped) and a design
    /// archive in a fresh directory; `seed` picks the signing key and the reports.
    fn new(seed: u8) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let (ingest, writer, store) = start_default(&dir.path().join("agg"));
        Self {
            ingest: Some(ingest),
            writer: Some(writer),
            store,
            archive: Archive::open(&dir.path().join("design")).unwrap(),
            dir,
            signing: SigningKey::from_bytes(&[seed; 32]),
            rng: rng(70 + u64::from(seed)),
            bundles: 0,
        }
    }

    async fn send(&mut self, n: usize) {
        let snippet = snippets(1, 1)[0].1;
        for _ in 0..n {
            let sent = report(snippet, COUNTER, &mut self.rng);
            let ack = self.ingest().handle(sent.frame).await;
            assert_eq!(ack.status, AckStatus::Accepted);
        }
    }

    /// Closes the open epochs, exports what closed, imports it, and reports.
    async fn close_export_import_report(&mut self) -> Report {
        close_all(self.ingest()).await;
        let made =
            export::export(self.store.as_ref(), ReleaseRule::default(), &self.signing).unwrap();
        if let Some((_, bytes)) = made {
            self.bundles += 1;
            let path = self.dir.path().join(format!("{}.bundle", self.bundles));
            std::fs::write(&path, bytes).unwrap();
            self.archive
                .import(&path, Some(&self.signing.verifying_key()), false)
                .unwrap();
        }
        report::build(
            &self.archive.merged().unwrap(),
            std::slice::from_ref(KEYS.private_key()),
            Threshold::DEFAULT,
            ReportsPerContributor::DEFAULT,
        )
        .unwrap()
    }
}

fn decrypted_reports(report: &Report) -> u64 {
    report.decrypted.iter().map(|c| c.reports).sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_two_reports_differ_by_fewer_than_k_contributors() {
    let mut servers = Servers::new(3);
    let min_step = 10 * 24;
    let mut seen = Vec::new();
    // Enough for one release; then a few more (the attack: difference them out); then again
    // a few more after a report was taken in between; then enough once more.
    for (batch, expect_release) in [
        (240, true),
        (5, false),
        (1, false),
        (17, false),
        (241, true),
    ] {
        servers.send(batch).await;
        let report = servers.close_export_import_report().await;
        let total = decrypted_reports(&report);
        if expect_release {
            assert!(
                seen.last().is_none_or(|&last| total >= last + min_step),
                "{batch} reports released: {total} after {seen:?}"
            );
        }
        seen.push(total);
    }
    // Every pair of reports differs by 0 or by at least k x T reports.
    for (i, a) in seen.iter().enumerate() {
        for b in &seen[i + 1..] {
            let d = a.abs_diff(*b);
            assert!(d == 0 || d >= min_step, "reports {seen:?} differ by {d}");
        }
    }
    assert_eq!(seen, vec![240, 240, 240, 240, 481]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_client_alone_never_reaches_a_decryption() {
    let mut servers = Servers::new(4);
    // One client, the most an agent may send in a day for a counter: 24 reports, each sent
    // ten times under fresh report ids (exact copies are folded).
    let snippet = snippets(1, 1)[0].1;
    let mut accepted = 0;
    for i in 0..24u8 {
        let sent = report(snippet, COUNTER, &mut servers.rng);
        for copy in 0..10u8 {
            let mut id = [0xee; 16];
            (id[0], id[1]) = (i, copy);
            let frame = with_report_id(&sent.frame, id);
            if servers.ingest().handle(frame).await.status == AckStatus::Accepted {
                accepted += 1;
            }
        }
    }
    assert_eq!(accepted, 24, "copies are counted once");
    let report = servers.close_export_import_report().await;
    assert!(report.decrypted.is_empty(), "{:?}", report.decrypted);
    assert_eq!(report.withheld_reports, 24);
}
