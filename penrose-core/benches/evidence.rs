//! What contributor evidence costs the release auditor (`penrose_core::evidence::count`): one
//! released sub-sum of 480 reports (2 k T, what `serve` releases) under a 2048-bit key, each
//! report with a verified evidence token: decoding every binding, multiplying the ciphertexts
//! and comparing with the sum, and verifying every token. Also prints the bytes the evidence
//! adds per report and per sum.
//!
//! Run: `cargo bench -p penrose-core --features tokens,bundle --bench evidence`. Throughput
//! (criterion's elements/s) is per report.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use penrose_core::bundle::{BundleEntry, ClassId, EpochId, Generation};
use penrose_core::counters::{CatalogueVersion, CounterId};
use penrose_core::evidence::{
    self, EvidenceRule, EvidencedReport, SumEvidence, TokenPeriod, TokensPerEpoch,
};
use penrose_core::fingerprint::{Locator, SnippetHash};
use penrose_core::gpu::GpuArch;
use penrose_core::histogram::SampleCount;
use penrose_core::paillier::{Accumulator, KeySize, Keypair};
use penrose_core::tokens::{
    BlindedRequest, IssueResponse, IssuerKey, KeyRing, KeySet, TokenEpoch, TokenRequest, TokenScope,
};
use penrose_core::wire::{EvidenceToken, PackedBytes, Report, ReportId};
use rand::SeedableRng;
use rand_chacha::ChaCha20Rng;

/// Reports in one released sub-sum (`export::sub_sum_reports`, 2 k T).
const REPORTS: usize = 480;
const DAY: u32 = 20_000;

fn evidence(c: &mut Criterion) {
    let mut rng = ChaCha20Rng::seed_from_u64(26);
    let paillier = Keypair::generate_with_size(KeySize::Bits2048, &mut rng)
        .public_key()
        .clone();
    let issuer = IssuerKey::generate(TokenEpoch(DAY), TokenScope(3), &mut rng);
    let set = KeySet::of_keys([&issuer]).unwrap();
    let entry_key = set.get(TokenEpoch(DAY), TokenScope(3)).unwrap().clone();
    let mut tokens = Vec::new();
    while tokens.len() < REPORTS {
        let pending = TokenRequest::new(&entry_key, 24, &mut rng).unwrap();
        let request = BlindedRequest::decode(&pending.request().encode(), &set).unwrap();
        let response = issuer.issue(&request, &mut rng).unwrap();
        let answer = IssueResponse::decode(&response.encode(), &set).unwrap();
        tokens.extend(pending.finalize(&answer).unwrap());
    }
    let mut sum = Accumulator::new(&paillier);
    let mut listed = Vec::new();
    for (i, token) in tokens.iter().enumerate() {
        let mut bins = vec![0u64; 128];
        bins[i % 128] = 40;
        let ciphertexts = paillier.encrypt_packed(&bins, &mut rng).unwrap();
        let mut id = [0u8; 16];
        id[..8].copy_from_slice(&(i as u64).to_be_bytes());
        let mut report = Report {
            key_id: paillier.key_id(),
            report_id: ReportId(id),
            snippet: SnippetHash([7; 32]),
            locator: Locator::from_bytes(&[1; 200]),
            arch: GpuArch::from_bytes([9, 0]),
            counter: CounterId(3),
            catalogue: CatalogueVersion(1),
            day: penrose_core::wire::Day(DAY),
            samples: SampleCount(40),
            ciphertexts: PackedBytes::new(ciphertexts.to_bytes(), ciphertexts.ciphertexts().len())
                .unwrap(),
            token: None,
            evidence: None,
        };
        report.evidence = Some(EvidenceToken(
            token.redeem(&report.token_binding()).encode(),
        ));
        sum.absorb(&ciphertexts, 40).unwrap();
        listed.push(EvidencedReport::of(&report));
    }
    let sums = sum.sum().unwrap();
    let entry = BundleEntry {
        epoch: EpochId(1),
        class: ClassId(1),
        arch: GpuArch::from_bytes([9, 0]),
        key: 0,
        catalogue: CatalogueVersion(1),
        counter: CounterId(3),
        generation: Generation(0),
        reports: sum.reports(),
        samples: sum.samples(),
        sums: PackedBytes::new(sums.to_bytes(), sums.ciphertexts().len()).unwrap(),
    };
    let evidence = SumEvidence::new(listed);
    let encoded = evidence.encode();
    println!(
        "evidence: {} bytes per report listed, {} bytes per sum of {REPORTS}; the token adds {} \
         bytes to a report on the wire",
        evidence.reports()[0].encoded_len(),
        encoded.len(),
        penrose_core::wire::ADMISSION_TOKEN_BYTES,
    );
    let ring = KeyRing::new([issuer]).unwrap();
    let rule = EvidenceRule {
        keys: &ring,
        cap: TokensPerEpoch::new(TokenPeriod::Day, 24).unwrap(),
    };
    let counted = evidence::count(&evidence, &entry, &paillier, &rule, |_| false).unwrap();
    assert_eq!(counted.contributors, 20);
    let mut group = c.benchmark_group("evidence");
    group.sample_size(10);
    group.throughput(Throughput::Elements(REPORTS as u64));
    group.bench_function("decode_and_count_480", |b| {
        b.iter(|| {
            let decoded = SumEvidence::decode(black_box(&encoded)).unwrap();
            evidence::count(&decoded, &entry, &paillier, &rule, |_| false).unwrap()
        })
    });
    group.finish();
}

criterion_group!(benches, evidence);
criterion_main!(benches);
