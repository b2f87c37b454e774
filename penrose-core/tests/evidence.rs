//! Contributor evidence against the adversaries it is for (issue 26 item 2): the aggregation
//! server's operator, who holds the admission keys but not the auditor's, and a client with
//! every evidence token one credential can get. Each test builds real Paillier reports, real
//! VOPRF evidence tokens through the issuance encodings, and the released sum the aggregation
//! server would export, then asks `evidence::count` what the auditor would.
#![cfg(all(feature = "tokens", feature = "bundle"))]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashSet;

use penrose_core::bundle::{BundleEntry, ClassId, EpochId, Generation};
use penrose_core::counters::{CatalogueVersion, CounterId};
use penrose_core::evidence::{
    self, CapBelowFloor, Counted, EvidenceError, EvidenceRule, EvidencedReport, SumEvidence,
    TokenPeriod, TokensPerEpoch,
};
use penrose_core::fingerprint::{Locator, SnippetHash};
use penrose_core::gpu::GpuArch;
use penrose_core::histogram::SampleCount;
use penrose_core::paillier::{Accumulator, KeySize, Keypair, PublicKey};
use penrose_core::tokens::{
    IssueResponse, IssuerKey, KeyRing, KeySet, SpentId, Token, TokenEpoch, TokenRequest, TokenScope,
};
use penrose_core::wire::{AdmissionToken, Day, EvidenceToken, PackedBytes, Report, ReportId};
use rand::{RngCore, SeedableRng};
use rand_chacha::ChaCha20Rng;

const DAY: Day = Day(20_000);
const COUNTER: CounterId = CounterId(3);

struct Fixture {
    paillier: PublicKey,
    ring: KeyRing,
    rng: ChaCha20Rng,
    next_id: u64,
}

impl Fixture {
    /// A Paillier key and the auditor party's issuer keys for the day and each of its hours.
    fn new() -> Self {
        let mut rng = ChaCha20Rng::seed_from_u64(26);
        let paillier = Keypair::generate_with_size(KeySize::Bits1024, &mut rng)
            .public_key()
            .clone();
        let mut keys = vec![IssuerKey::generate(
            TokenEpoch(DAY.0),
            TokenScope(COUNTER.0),
            &mut rng,
        )];
        keys.push(IssuerKey::generate(
            TokenEpoch(DAY.0),
            TokenScope(9),
            &mut rng,
        ));
        for hour in 0..3 {
            let epoch = TokenEpoch(DAY.0 * 24 + hour);
            keys.push(IssuerKey::generate(epoch, TokenScope(COUNTER.0), &mut rng));
        }
        Fixture {
            paillier,
            ring: KeyRing::new(keys).unwrap(),
            rng,
            next_id: 0,
        }
    }

    /// `count` tokens of one credential, through the encodings, from the key of (epoch, scope).
    fn tokens(&mut self, epoch: TokenEpoch, scope: TokenScope, count: usize) -> Vec<Token> {
        let key = self.ring.get(epoch, scope).unwrap().clone();
        let published = KeySet::decode(&self.ring.key_set().encode()).unwrap();
        let entry = published.get(epoch, scope).unwrap();
        let pending = TokenRequest::new(entry, count, &mut self.rng).unwrap();
        let received =
            penrose_core::tokens::BlindedRequest::decode(&pending.request().encode(), &published)
                .unwrap();
        let response = key.issue(&received, &mut self.rng).unwrap();
        let answer = IssueResponse::decode(&response.encode(), &published).unwrap();
        pending.finalize(&answer).unwrap()
    }

    /// One report of `samples` samples in bin 0, with the evidence `token` spent on it.
    fn report(&mut self, samples: u32, token: Option<&Token>) -> Report {
        let mut bins = vec![0u64; 128];
        bins[0] = u64::from(samples);
        let ciphertexts = self.paillier.encrypt_packed(&bins, &mut self.rng).unwrap();
        let count = ciphertexts.ciphertexts().len();
        self.next_id += 1;
        let mut id = [0u8; 16];
        id[..8].copy_from_slice(&self.next_id.to_be_bytes());
        let mut report = Report {
            key_id: self.paillier.key_id(),
            report_id: ReportId(id),
            snippet: SnippetHash([7; 32]),
            locator: Locator::from_bytes(&[0; 200]),
            arch: GpuArch::from_bytes([9, 0]),
            counter: COUNTER,
            catalogue: CatalogueVersion(1),
            day: DAY,
            samples: SampleCount(samples),
            ciphertexts: PackedBytes::new(ciphertexts.to_bytes(), count).unwrap(),
            // The admission token is the aggregation server's business, not the auditor's.
            token: Some(AdmissionToken([0x5a; 100])),
            evidence: None,
        };
        report.evidence = token.map(|t| EvidenceToken(t.redeem(&report.token_binding()).encode()));
        report
    }

    /// `credentials` x 24 reports, each credential's whole day quota of tokens spent on them.
    fn full_quotas(&mut self, credentials: usize) -> Vec<Report> {
        let mut reports = Vec::new();
        for _ in 0..credentials {
            let tokens = self.tokens(DAY_EPOCH, SCOPE, 24);
            reports.extend(self.reports(&tokens));
        }
        reports
    }

    /// Reports each with one of `tokens`.
    fn reports(&mut self, tokens: &[Token]) -> Vec<Report> {
        tokens.iter().map(|t| self.report(10, Some(t))).collect()
    }

    /// What the auditor counts when `reports` are listed for their own released sum, under
    /// the day rule (T = 24).
    fn count_day(&self, reports: &[Report]) -> Result<Counted, EvidenceError> {
        evidence::count(
            &listed(reports),
            &released(&self.paillier, reports),
            &self.paillier,
            &self.rule(TokenPeriod::Day, 24),
            never,
        )
    }

    /// The auditor's rule over a copy of the ring (leaked: a test lives briefly), so that the
    /// fixture can go on making reports.
    fn rule(&self, period: TokenPeriod, cap: u32) -> EvidenceRule<'static> {
        EvidenceRule {
            keys: Box::leak(Box::new(self.ring.clone())),
            cap: TokensPerEpoch::new(period, cap).unwrap(),
        }
    }
}

/// The released sum of `reports`, as the aggregation server exports it.
fn released(key: &PublicKey, reports: &[Report]) -> BundleEntry {
    let mut sum = Accumulator::new(key);
    for report in reports {
        sum.absorb_bytes(report.ciphertexts.as_bytes(), u64::from(report.samples.0))
            .unwrap();
    }
    let sums = sum.sum().unwrap();
    BundleEntry {
        epoch: EpochId(1),
        class: ClassId(4),
        arch: GpuArch::from_bytes([9, 0]),
        key: 0,
        catalogue: CatalogueVersion(1),
        counter: COUNTER,
        generation: Generation(0),
        reports: sum.reports(),
        samples: sum.samples(),
        sums: PackedBytes::new(sums.to_bytes(), sums.ciphertexts().len()).unwrap(),
    }
}

fn listed(reports: &[Report]) -> SumEvidence {
    SumEvidence::new(reports.iter().map(EvidencedReport::of).collect())
}

fn never(_: &SpentId) -> bool {
    false
}

const DAY_EPOCH: TokenEpoch = TokenEpoch(DAY.0);
const SCOPE: TokenScope = TokenScope(COUNTER.0);

#[test]
fn ten_credentials_with_their_full_quota_prove_ten_contributors() {
    let mut f = Fixture::new();
    let reports = f.full_quotas(10);
    let counted = f.count_day(&reports).unwrap();
    assert_eq!(counted.reports, 240);
    assert_eq!(counted.evidenced, 240);
    assert_eq!(counted.contributors, 10);
    assert_eq!(counted.spent.iter().collect::<HashSet<_>>().len(), 240);
    // One report fewer is nine contributors: the bound is max_e ceil(r_e / T).
    let fewer = &reports[1..];
    let counted = f.count_day(fewer).unwrap();
    assert_eq!(counted.contributors, 10);
    let nine = &reports[24..];
    let counted = f.count_day(nine).unwrap();
    assert_eq!(counted.contributors, 9);
}

#[test]
fn the_operator_padding_a_victims_report_with_its_own_proves_one_contributor() {
    let mut f = Fixture::new();
    let victim_token = f.tokens(DAY_EPOCH, SCOPE, 1);
    let mut reports = f.reports(&victim_token);
    // 239 reports the operator made (admission tokens it minted itself), without evidence it
    // cannot make.
    for _ in 0..239 {
        reports.push(f.report(10, None));
    }
    let counted = f.count_day(&reports).unwrap();
    assert_eq!((counted.reports, counted.evidenced), (240, 1));
    assert_eq!(counted.contributors, 1);
}

#[test]
fn evidence_moved_from_other_reports_verifies_nothing() {
    let mut f = Fixture::new();
    // Honest reports of another class, each with its own token.
    let honest = f.full_quotas(10);
    // The operator's sum: the victim's report and 239 of its own, each wearing an honest
    // report's evidence token.
    let victim_token = f.tokens(DAY_EPOCH, SCOPE, 1);
    let mut reports = f.reports(&victim_token);
    for stolen in &honest[..239] {
        let mut fake = f.report(10, None);
        fake.evidence = stolen.evidence;
        reports.push(fake);
    }
    let counted = f.count_day(&reports).unwrap();
    assert_eq!(counted.evidenced, 1);
    assert_eq!(counted.contributors, 1);
}

#[test]
fn listing_reports_that_are_not_the_sum_is_refused() {
    let mut f = Fixture::new();
    let tokens = f.tokens(DAY_EPOCH, SCOPE, 24);
    let honest = f.reports(&tokens);
    let victim = vec![f.report(10, None)];
    // The sum is the victim's report alone; the evidence lists the honest reports.
    let entry = released(&f.paillier, &victim);
    let rule = f.rule(TokenPeriod::Day, 24);
    let refused = evidence::count(&listed(&honest), &entry, &f.paillier, &rule, never);
    assert!(matches!(
        refused,
        Err(EvidenceError::Counts {
            what: "reports",
            ..
        })
    ));
    // The same number of reports and samples, other ciphertexts: not the sum.
    let twin = vec![f.report(10, Some(&tokens[0]))];
    let refused = evidence::count(&listed(&twin), &entry, &f.paillier, &rule, never);
    assert_eq!(refused, Err(EvidenceError::NotTheSum));
    // Honest reports plus the victim's, claimed as the victim's sum with a report count
    // made to match: the samples or the product give it away.
    let mut padded_entry = released(&f.paillier, &victim);
    padded_entry.reports = 25;
    let mut padded = honest.clone();
    padded.push(victim[0].clone());
    let refused = evidence::count(&listed(&padded), &padded_entry, &f.paillier, &rule, never);
    assert!(matches!(
        refused,
        Err(EvidenceError::Counts {
            what: "samples",
            ..
        })
    ));
    padded_entry.samples = 250;
    let refused = evidence::count(&listed(&padded), &padded_entry, &f.paillier, &rule, never);
    assert_eq!(refused, Err(EvidenceError::NotTheSum));
}

#[test]
fn a_report_listed_twice_or_of_another_sum_is_refused() {
    let mut f = Fixture::new();
    let tokens = f.tokens(DAY_EPOCH, SCOPE, 3);
    let reports = f.reports(&tokens);
    let rule = f.rule(TokenPeriod::Day, 24);
    // Twice: the sum has it twice too, so only the repetition can refuse it.
    let twice = vec![reports[0].clone(), reports[1].clone(), reports[0].clone()];
    let refused = evidence::count(
        &listed(&twice),
        &released(&f.paillier, &twice),
        &f.paillier,
        &rule,
        never,
    );
    assert_eq!(refused, Err(EvidenceError::Repeated { index: 2 }));
    // Another counter, architecture or key, each in a sum of its own.
    let mut other = reports.clone();
    other[1].counter = CounterId(9);
    let entry = released(&f.paillier, &other);
    let refused = evidence::count(&listed(&other), &entry, &f.paillier, &rule, never);
    assert_eq!(
        refused,
        Err(EvidenceError::OtherSum {
            index: 1,
            field: "counter"
        })
    );
    let mut other = reports.clone();
    other[2].arch = GpuArch::from_bytes([8, 0]);
    let entry = released(&f.paillier, &other);
    let refused = evidence::count(&listed(&other), &entry, &f.paillier, &rule, never);
    assert_eq!(
        refused,
        Err(EvidenceError::OtherSum {
            index: 2,
            field: "GPU architecture"
        })
    );
    // A binding that is not a report.
    let mut broken = listed(&reports);
    let mut items = broken.reports().to_vec();
    items[0].binding.truncate(40);
    broken = SumEvidence::new(items);
    let refused = evidence::count(
        &broken,
        &released(&f.paillier, &reports),
        &f.paillier,
        &rule,
        never,
    );
    assert!(matches!(
        refused,
        Err(EvidenceError::Report { index: 0, .. })
    ));
}

#[test]
fn a_client_with_every_token_of_one_credential_is_one_contributor() {
    let mut f = Fixture::new();
    let tokens = f.tokens(DAY_EPOCH, SCOPE, 24);
    let reports = f.reports(&tokens);
    let counted = f.count_day(&reports).unwrap();
    assert_eq!(counted.contributors, 1);
    // Its tokens of another counter's key, and the same token spent on two reports, count
    // nothing more; junk evidence refuses nothing.
    let foreign = f.tokens(DAY_EPOCH, TokenScope(9), 24);
    let mut more = reports.clone();
    more.extend(f.reports(&foreign));
    let mut replayed = f.report(10, None);
    replayed.evidence = Some(EvidenceToken(
        tokens[0].redeem(&replayed.token_binding()).encode(),
    ));
    more.push(replayed);
    let mut junk = f.report(10, None);
    junk.evidence = Some(EvidenceToken([0xee; 100]));
    more.push(junk);
    let counted = f.count_day(&more).unwrap();
    assert_eq!((counted.reports, counted.evidenced), (50, 24));
    assert_eq!(counted.contributors, 1);
}

#[test]
fn tokens_the_auditor_counted_before_count_nothing_again() {
    let mut f = Fixture::new();
    let reports = f.full_quotas(10);
    let entry = released(&f.paillier, &reports);
    let rule = f.rule(TokenPeriod::Day, 24);
    let first = evidence::count(&listed(&reports), &entry, &f.paillier, &rule, never).unwrap();
    let spent: HashSet<SpentId> = first.spent.into_iter().collect();
    let again = evidence::count(&listed(&reports), &entry, &f.paillier, &rule, |id| {
        spent.contains(id)
    })
    .unwrap();
    assert_eq!((again.evidenced, again.contributors), (0, 0));
}

#[test]
fn hourly_tokens_count_per_hour_and_only_within_the_reports_day() {
    let mut f = Fixture::new();
    let hour = |h| TokenEpoch(DAY.0 * 24 + h);
    // Ten credentials, one token an hour each, over three hours: ten contributors.
    let mut reports = Vec::new();
    for h in 0..3 {
        for _ in 0..10 {
            let token = f.tokens(hour(h), SCOPE, 1);
            reports.extend(f.reports(&token));
        }
    }
    let rule = f.rule(TokenPeriod::Hour, 1);
    let counted = evidence::count(
        &listed(&reports),
        &released(&f.paillier, &reports),
        &f.paillier,
        &rule,
        never,
    )
    .unwrap();
    assert_eq!((counted.evidenced, counted.contributors), (30, 10));
    // The day's token is not an hour's; an hour token on a report of another day counts nothing.
    let day_tokens = f.tokens(DAY_EPOCH, SCOPE, 5);
    let mut other = f.reports(&day_tokens);
    let token = f.tokens(hour(0), SCOPE, 1);
    let mut late = f.report(10, None);
    late.day = Day(DAY.0 + 1);
    late.evidence = Some(EvidenceToken(
        token[0].redeem(&late.token_binding()).encode(),
    ));
    other.push(late);
    let counted = evidence::count(
        &listed(&other),
        &released(&f.paillier, &other),
        &f.paillier,
        &rule,
        never,
    )
    .unwrap();
    assert_eq!((counted.evidenced, counted.contributors), (0, 0));
    // The same reports under the day period count the day's five tokens only.
    let counted = f.count_day(&other).unwrap();
    assert_eq!((counted.evidenced, counted.contributors), (5, 1));
}

#[test]
fn the_cap_has_a_floor_per_period() {
    assert_eq!(
        TokensPerEpoch::new(TokenPeriod::Day, 23),
        Err(CapBelowFloor {
            period: TokenPeriod::Day,
            tokens: 23,
            floor: 24
        })
    );
    assert!(TokensPerEpoch::new(TokenPeriod::Hour, 0).is_err());
    assert_eq!(TokensPerEpoch::new(TokenPeriod::Hour, 1).unwrap().get(), 1);
}

#[test]
fn the_encoding_round_trips_and_every_damage_is_refused() {
    let mut f = Fixture::new();
    let tokens = f.tokens(DAY_EPOCH, SCOPE, 2);
    let mut reports = f.reports(&tokens);
    reports.push(f.report(3, None));
    let evidence = listed(&reports);
    let bytes = evidence.encode();
    assert_eq!(
        bytes.len(),
        5 + evidence
            .reports()
            .iter()
            .map(EvidencedReport::encoded_len)
            .sum::<usize>()
    );
    for report in evidence.reports() {
        let one = report.to_bytes();
        assert_eq!(EvidencedReport::from_bytes(&one).as_ref(), Ok(report));
        assert!(EvidencedReport::from_bytes(&one[..one.len() - 1]).is_err());
        assert!(EvidencedReport::from_bytes(&[one.as_slice(), &[0]].concat()).is_err());
    }
    assert_eq!(SumEvidence::decode(&bytes), Ok(evidence));
    for cut in 0..bytes.len() {
        assert!(SumEvidence::decode(&bytes[..cut]).is_err(), "cut at {cut}");
    }
    let mut longer = bytes.clone();
    longer.push(0);
    assert!(SumEvidence::decode(&longer).is_err());
    let mut version = bytes.clone();
    version[0] = 2;
    assert!(SumEvidence::decode(&version).is_err());
    // A count far beyond the bytes is refused before anything is reserved.
    let mut lie = bytes.clone();
    lie[1..5].copy_from_slice(&u32::MAX.to_be_bytes());
    assert_eq!(
        SumEvidence::decode(&lie),
        Err(EvidenceError::Malformed("more reports than bytes"))
    );
    let mut marker = vec![1, 0, 0, 0, 1, 0, 1, 0xaa, 7];
    assert!(SumEvidence::decode(&marker).is_err());
    marker[8] = 0;
    assert!(SumEvidence::decode(&marker).is_ok());
    let mut rng = ChaCha20Rng::seed_from_u64(5);
    for _ in 0..2000 {
        let mut noisy = bytes.clone();
        let at = (rng.next_u32() as usize) % noisy.len();
        noisy[at] ^= 1 << (rng.next_u32() % 8);
        let _ = SumEvidence::decode(&noisy);
    }
}

#[test]
fn evidence_file_headers_round_trip_and_other_files_are_refused() {
    use penrose_core::bundle::BundleHash;
    use penrose_core::evidence_file::{
        EVIDENCE_FILE_HEADER_BYTES, EvidenceFileError, EvidenceFileHeader, MAX_SUM_EVIDENCE_BYTES,
        entry_len, entry_prefix,
    };
    let header = EvidenceFileHeader {
        bundle: BundleHash([4; 32]),
        entries: 70_000,
    };
    let bytes: [u8; EVIDENCE_FILE_HEADER_BYTES] = header.encode().try_into().unwrap();
    assert_eq!(EvidenceFileHeader::decode(&bytes), Ok(header));
    let mut other = bytes;
    other[0] = b'P';
    assert_eq!(
        EvidenceFileHeader::decode(&other),
        Err(EvidenceFileError::NotEvidence)
    );
    let mut newer = bytes;
    newer[16] = 2;
    assert_eq!(
        EvidenceFileHeader::decode(&newer),
        Err(EvidenceFileError::Version(2))
    );
    assert_eq!(entry_len(entry_prefix(&[0; 300])), Ok(300));
    let too_long = u32::try_from(MAX_SUM_EVIDENCE_BYTES + 1)
        .unwrap()
        .to_be_bytes();
    assert!(entry_len(too_long).is_err());
}
