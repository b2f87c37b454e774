//! The auditor counting contributors from evidence (issue 26 item 2), with real split Paillier
//! keys, real VOPRF evidence tokens from the auditor party's key ring in the data directory,
//! and bundles signed as the aggregation server signs them. Each test plays the aggregation
//! server's operator, who can shape sums and their evidence but cannot make a token.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use std::os::unix::fs::PermissionsExt;

use common::{DAY, Setup, partials, snapshot};
use penrose_auditor::{Auditor, Policy};
use penrose_core::audit::{AuditAnswer, AuditRefusal, AuditRequest};
use penrose_core::bundle::{BundleEntry, ClassId, EpochId, Generation};
use penrose_core::counters::{CatalogueVersion, CounterId};
use penrose_core::evidence::{EvidencedReport, SumEvidence};
use penrose_core::fingerprint::{Locator, SnippetHash};
use penrose_core::gpu::GpuArch;
use penrose_core::histogram::SampleCount;
use penrose_core::paillier::{Accumulator, PublicKey};
use penrose_core::tokens::{
    BlindedRequest, IssueResponse, IssuerKey, KeyRing, KeySet, Token, TokenEpoch, TokenRequest,
    TokenScope,
};
use penrose_core::wire::{AdmissionToken, Day, EvidenceToken, PackedBytes, Report, ReportId};
use rand::SeedableRng;
use rand_chacha::ChaCha20Rng;

const COUNTER: CounterId = CounterId(5);

/// An auditor that counts evidence, and what the tests need to make reports for it.
struct World {
    setup: Setup,
    public: PublicKey,
    ring: KeyRing,
    rng: ChaCha20Rng,
    next_id: u64,
}

impl World {
    /// The default policy (k = 10, T = 24), and the auditor party's key ring for the day,
    /// placed in the data directory as its operator would (0600).
    fn new() -> Self {
        let setup = Setup::new(Policy::default(), None);
        let mut rng = ChaCha20Rng::seed_from_u64(26);
        let key = IssuerKey::generate(TokenEpoch(DAY), TokenScope(COUNTER.0), &mut rng);
        let ring = KeyRing::new([key]).unwrap();
        let path = setup.data.evidence_keys();
        std::fs::write(&path, ring.encode()).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        let public = setup.dealing.keys.public_key().clone();
        World {
            setup,
            public,
            ring,
            rng,
            next_id: 0,
        }
    }

    fn auditor(&self) -> Auditor {
        let auditor = self.setup.auditor();
        assert!(auditor.counts_evidence());
        auditor
    }

    /// `count` tokens of one credential, through the issuance encodings.
    fn tokens(&mut self, count: usize) -> Vec<Token> {
        let (epoch, scope) = (TokenEpoch(DAY), TokenScope(COUNTER.0));
        let key = self.ring.get(epoch, scope).unwrap().clone();
        let published = KeySet::decode(&self.ring.key_set().encode()).unwrap();
        let pending =
            TokenRequest::new(published.get(epoch, scope).unwrap(), count, &mut self.rng).unwrap();
        let received = BlindedRequest::decode(&pending.request().encode(), &published).unwrap();
        let response = key.issue(&received, &mut self.rng).unwrap();
        pending
            .finalize(&IssueResponse::decode(&response.encode(), &published).unwrap())
            .unwrap()
    }

    /// One report of 10 samples in bin 0 on day `DAY`, with `token` spent on it as evidence.
    fn report(&mut self, token: Option<&Token>) -> Report {
        let mut bins = vec![0u64; 128];
        bins[0] = 10;
        let ciphertexts = self.public.encrypt_packed(&bins, &mut self.rng).unwrap();
        let count = ciphertexts.ciphertexts().len();
        self.next_id += 1;
        let mut id = [0u8; 16];
        id[..8].copy_from_slice(&self.next_id.to_be_bytes());
        let mut report = Report {
            key_id: self.public.key_id(),
            report_id: ReportId(id),
            snippet: SnippetHash([7; 32]),
            locator: Locator::from_bytes(&[0; 200]),
            arch: GpuArch::new(9, 0),
            counter: COUNTER,
            catalogue: CatalogueVersion(1),
            day: Day(DAY),
            samples: SampleCount(10),
            ciphertexts: PackedBytes::new(ciphertexts.to_bytes(), count).unwrap(),
            token: Some(AdmissionToken([0x5a; 100])),
            evidence: None,
        };
        report.evidence = token.map(|t| EvidenceToken(t.redeem(&report.token_binding()).encode()));
        report
    }

    /// `credentials` credentials, each spending its whole day's 24 tokens on 24 reports.
    fn honest(&mut self, credentials: usize) -> Vec<Report> {
        let mut reports = Vec::new();
        for _ in 0..credentials {
            for token in self.tokens(24) {
                reports.push(self.report(Some(&token)));
            }
        }
        reports
    }

    /// One victim report with its token, padded with `pad` reports the operator made itself
    /// (admission tokens it can mint, but no evidence token).
    fn padded(&mut self, pad: usize) -> Vec<Report> {
        let token = self.tokens(1);
        let mut reports = vec![self.report(token.first())];
        for _ in 0..pad {
            reports.push(self.report(None));
        }
        reports
    }
}

/// The released sum of `reports` in epoch `epoch`, class `class`, as the aggregation server
/// exports it.
fn entry(public: &PublicKey, reports: &[Report], epoch: u32, class: u32) -> BundleEntry {
    let mut sum = Accumulator::new(public);
    for report in reports {
        sum.absorb_bytes(report.ciphertexts.as_bytes(), u64::from(report.samples.0))
            .unwrap();
    }
    let sums = sum.sum().unwrap();
    BundleEntry {
        epoch: EpochId(epoch),
        class: ClassId(class),
        arch: GpuArch::new(9, 0),
        key: 0,
        catalogue: CatalogueVersion(1),
        counter: COUNTER,
        generation: Generation(0),
        reports: sum.reports(),
        samples: sum.samples(),
        sums: PackedBytes::new(sums.to_bytes(), sums.ciphertexts().len()).unwrap(),
    }
}

fn evidence(reports: &[Report]) -> Vec<u8> {
    SumEvidence::new(reports.iter().map(EvidencedReport::of).collect()).encode()
}

fn ask(auditor: &Auditor, bundle: &[u8], first: u32, lists: Vec<Vec<u8>>) -> AuditAnswer {
    let request = AuditRequest::Release {
        bundle: bundle.to_vec(),
        first,
        count: lists.len().max(1) as u32,
        evidence: lists,
    };
    AuditAnswer::decode(&auditor.answer(&request.encode())).unwrap()
}

fn entries(answer: AuditAnswer) -> (Vec<u32>, Vec<u32>) {
    let (partials, withheld) = partials(answer);
    (partials.iter().map(|p| p.entry).collect(), withheld)
}

#[test]
fn ten_evidenced_contributors_release_and_a_victim_padded_with_the_operators_reports_does_not() {
    let mut w = World::new();
    let honest = w.honest(10);
    let padded = w.padded(239);
    let a = entry(&w.public, &honest, DAY, 1);
    let b = entry(&w.public, &padded, DAY, 2);
    // Both claim 240 reports: the aggregation server's count would release both.
    assert_eq!((a.reports, b.reports), (240, 240));
    let bundle = w.setup.chain(1).next(&[DAY], vec![a.clone(), b]);
    let auditor = w.auditor();
    let answer = ask(
        &auditor,
        &bundle,
        0,
        vec![evidence(&honest), evidence(&padded)],
    );
    let (partials_of, withheld) = match &answer {
        AuditAnswer::Partials {
            partials, withheld, ..
        } => (partials.clone(), withheld.clone()),
        other => panic!("{other:?}"),
    };
    assert_eq!(partials_of.iter().map(|p| p.entry).collect::<Vec<_>>(), [0]);
    assert_eq!(withheld, [1]);
    let bins = w.setup.dealing.combine(&a, &partials_of[0].partial);
    assert_eq!(
        bins[0], 2_400,
        "the released sum decrypts to its reports' samples"
    );
    assert_eq!(
        auditor.tokens_counted(),
        240,
        "only the released sum's tokens are spent"
    );
    // Durable: a restarted auditor knows them.
    assert_eq!(w.auditor().tokens_counted(), 240);
}

#[test]
fn tokens_lent_to_another_sum_count_nothing_and_the_same_page_asked_again_counts_the_same() {
    let mut w = World::new();
    let honest = w.honest(10);
    let first = entry(&w.public, &honest, DAY, 1);
    let mut chain = w.setup.chain(1);
    let one = chain.next(&[DAY], vec![first]);
    let auditor = w.auditor();
    assert_eq!(
        entries(ask(&auditor, &one, 0, vec![evidence(&honest)])).0,
        [0]
    );
    // A lost answer: the same page again is answered the same, its tokens its own.
    assert_eq!(
        entries(ask(&auditor, &one, 0, vec![evidence(&honest)])).0,
        [0]
    );
    assert_eq!(auditor.tokens_counted(), 240);
    // The next day's bundle: the honest reports added to a victim's class, then subtract.
    let mut lent = honest.clone();
    lent.extend(w.padded(0));
    let victim = entry(&w.public, &lent, DAY + 1, 7);
    let two = chain.next(&[DAY + 1], vec![victim]);
    assert_eq!(
        entries(ask(&auditor, &two, 0, vec![evidence(&lent)])),
        (vec![], vec![0]),
        "the lent tokens were counted before: one contributor"
    );
}

#[test]
fn two_entries_of_one_page_cannot_share_tokens() {
    let mut w = World::new();
    let honest = w.honest(10);
    let a = entry(&w.public, &honest, DAY, 1);
    let twin = entry(&w.public, &honest, DAY, 2);
    let bundle = w.setup.chain(1).next(&[DAY], vec![a, twin]);
    let auditor = w.auditor();
    let lists = vec![evidence(&honest), evidence(&honest)];
    assert_eq!(
        entries(ask(&auditor, &bundle, 0, lists)),
        (vec![0], vec![1])
    );
}

#[test]
fn evidence_that_is_not_the_sum_or_none_refuses_the_page_and_changes_nothing() {
    let mut w = World::new();
    let honest = w.honest(10);
    let a = entry(&w.public, &honest, DAY, 1);
    let bundle = w.setup.chain(1).next(&[DAY], vec![a]);
    let auditor = w.auditor();
    let before = snapshot(w.setup.data.path());
    let bad = AuditAnswer::Refused(AuditRefusal::BadEvidence { entry: 0 });
    // One report left out: the product is not the sum.
    assert_eq!(ask(&auditor, &bundle, 0, vec![evidence(&honest[1..])]), bad);
    // Junk bytes.
    assert_eq!(ask(&auditor, &bundle, 0, vec![vec![1, 0, 0]]), bad);
    // No evidence at all, from a design server that did not forward it.
    assert_eq!(ask(&auditor, &bundle, 0, Vec::new()), bad);
    assert_eq!(snapshot(w.setup.data.path()), before, "nothing changed");
    assert_eq!(auditor.tokens_counted(), 0);
    // The right evidence is still answered.
    assert_eq!(
        entries(ask(&auditor, &bundle, 0, vec![evidence(&honest)])).0,
        [0]
    );
}

/// The evidence file as `penrose-aggregator export-evidence` writes it.
fn evidence_file(bundle: &[u8], lists: &[Vec<u8>]) -> Vec<u8> {
    use penrose_core::bundle::BundleHash;
    use penrose_core::evidence_file::{EvidenceFileHeader, entry_prefix};
    let mut out = EvidenceFileHeader {
        bundle: BundleHash::of(bundle),
        entries: lists.len() as u32,
    }
    .encode();
    for list in lists {
        out.extend_from_slice(&entry_prefix(list));
        out.extend_from_slice(list);
    }
    out
}

/// The whole way, as the product runs it: the bundle and its evidence file imported into the
/// design server's archive (`evidence::import`), the auditor serving over QUIC, and
/// `audit::fetch` forwarding each page's evidence. Only the evidenced sum gets a partial,
/// and it combines with the design server's to its reports' samples. Evidence of another
/// bundle, or of another entry count, is refused at import; an auditor that counts evidence
/// refuses the archive's bundle while no evidence is kept for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn evidence_travels_from_the_file_through_the_design_server_to_the_auditor() {
    use penrose_auditor::service::{self, PROTOCOL, ServeOptions};
    use penrose_design::archive::Archive;
    use penrose_design::audit::{self, AuditError, AuditorPartials};
    use penrose_design::evidence::{self as design_evidence, EvidenceError};
    use penrose_transport::exchange::ExchangeClient;
    use penrose_transport::{ClientConfig, Trust};

    let mut w = World::new();
    let honest = w.honest(10);
    let padded = w.padded(239);
    let a = entry(&w.public, &honest, DAY, 1);
    let b = entry(&w.public, &padded, DAY, 2);
    let bundle = w.setup.chain(1).next(&[DAY], vec![a.clone(), b]);
    let dir = w.setup.dir.path().to_path_buf();
    let archive = Archive::open(&dir.join("archive")).unwrap();
    let bundle_file = dir.join("1.bundle");
    std::fs::write(&bundle_file, &bundle).unwrap();
    archive
        .import(
            &bundle_file,
            Some(&w.setup.aggregator.verifying_key()),
            false,
        )
        .unwrap();

    let running = service::start(ServeOptions::new(
        w.setup.data.clone(),
        "127.0.0.1:0".parse().unwrap(),
    ))
    .await
    .unwrap();
    let trust = Trust::load_pinned(running.certificate()).unwrap();
    let mut config = ClientConfig::new(running.local_addr(), "localhost", trust);
    config.ack_timeout = std::time::Duration::from_secs(60);
    let client = ExchangeClient::new(config, PROTOCOL).unwrap();

    // No evidence kept yet: the auditor counts evidence, so it refuses, and nothing is kept.
    let refused = audit::fetch(&archive, &client).await.unwrap_err();
    assert!(
        matches!(
            refused,
            AuditError::Refused {
                refusal: AuditRefusal::BadEvidence { entry: 0 },
                ..
            }
        ),
        "{refused}"
    );
    assert!(AuditorPartials::load(&archive).unwrap().is_empty());

    // Evidence of another bundle, and of the right bundle with an entry missing: refused.
    let lists = vec![evidence(&honest), evidence(&padded)];
    let wrong = dir.join("wrong.evidence");
    std::fs::write(&wrong, evidence_file(b"another bundle", &lists)).unwrap();
    let e = design_evidence::import(&archive, &wrong).unwrap_err();
    assert!(
        matches!(e, EvidenceError::NoSuchBundle { .. }) && e.is_refusal(),
        "{e}"
    );
    std::fs::write(&wrong, evidence_file(&bundle, &lists[..1])).unwrap();
    let e = design_evidence::import(&archive, &wrong).unwrap_err();
    assert!(matches!(e, EvidenceError::EntryCount { .. }), "{e}");

    let file = dir.join("1.evidence");
    std::fs::write(&file, evidence_file(&bundle, &lists)).unwrap();
    let kept = design_evidence::import(&archive, &file).unwrap();
    assert_eq!((kept.seq, kept.entries, kept.new), (1, 2, true));
    assert!(
        !design_evidence::import(&archive, &file).unwrap().new,
        "same file again"
    );

    let summary = audit::fetch(&archive, &client).await.unwrap();
    assert_eq!(
        (
            summary.bundles_with_evidence,
            summary.partials,
            summary.withheld
        ),
        (1, 1, 1)
    );
    let partials = AuditorPartials::load(&archive).unwrap();
    let merged = archive.merged().unwrap();
    let released: Vec<_> = merged
        .origins
        .iter()
        .filter_map(|(id, origin)| {
            let partial = partials.get(origin)?;
            Some((merged.entries[id].clone(), partial.to_vec()))
        })
        .collect();
    assert_eq!(released.len(), 1);
    assert_eq!(released[0].0, a);
    let bins = w.setup.dealing.combine(&released[0].0, &released[0].1);
    assert_eq!(bins[0], 2_400);
    running.shutdown().await;
}
