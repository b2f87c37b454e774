//! In-process aggregation at the deployed key size: the writer's whole per-batch work
//! (the batch's unit check, deduplication lookups, SST/EST, one multiplication per
//! ciphertext, the RocksDB write batch with its WAL sync) per report, and the validation each
//! report costs before it (which runs on the runtime's threads, beside the writer).
//!
//! Both also run with admission tokens (`..._with_tokens`): the writer then looks up and
//! records each report's spent token; validation then checks the token (its key, day and
//! counter, and its MAC: the VOPRF evaluation whose cost alone `penrose-core`'s `tokens`
//! bench measures, `verify_batch_of_24`).
//!
//! The writer benchmark runs twice: `ingest_2048/...` measures elapsed time, the sync's wait
//! included; `ingest_2048_cpu/...` the CPU time of the benchmarking thread (which does the
//! whole batch, WAL write and sync call included), which is what "per core" means and what
//! other load on a shared machine does not inflate.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::sync::Arc;

use criterion::measurement::Measurement;
use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use penrose_aggregator::admission::{Admission, SpentToken, TokenRing};
use penrose_aggregator::state::State;
use penrose_aggregator::store::{RocksStore, Store};
use penrose_aggregator::validate::{ValidReport, validate_body};
use penrose_core::counters::{BIN_COUNT, CatalogueVersion, CounterId};
use penrose_core::fingerprint::{FingerprintParams, Fingerprinter};
use penrose_core::histogram::SampleCount;
use penrose_core::paillier::Keypair;
use penrose_core::release::ReleaseRule;
use penrose_core::tokens::{IssuerKey, KeyRing, SpentId, TokenEpoch, TokenRequest, TokenScope};
use penrose_core::wire::{Day, LENGTH_PREFIX, Message, PackedBytes, Report, ReportId};
use rand::{Rng, RngCore, SeedableRng};
use rand_chacha::ChaCha20Rng;

const BATCH: usize = 1024;

#[path = "../../penrose-core/benches/support/thread_cpu.rs"]
mod thread_cpu;
use thread_cpu::ThreadCpuTime;

fn wall(c: &mut Criterion) {
    bench(c, "ingest_2048", true);
}

fn cpu(c: &mut Criterion<ThreadCpuTime>) {
    bench(c, "ingest_2048_cpu", false);
}

fn bench<M: Measurement + 'static>(c: &mut Criterion<M>, group_name: &str, validation: bool) {
    let mut rng = ChaCha20Rng::seed_from_u64(1);
    let keys = Keypair::generate(&mut rng);
    let key = keys.public_key().clone();
    let keys_for_validation = penrose_aggregator::design_keys::DesignKeys::single(key.clone());
    let f = Fingerprinter::new(FingerprintParams::default()).unwrap();
    // 50 applications, 4 snippets each: the mix of known and new snippets a busy server sees.
    let snippets: Vec<_> = (0..200)
        .map(|i| {
            let names: Vec<String> = (0..2_000)
                .map(|j| format!("app{}_k{}", i / 4, ((i % 4) * 37 + j) % 300 % 40))
                .collect();
            f.fingerprint_of_names(&names)
        })
        .collect();
    let pool: Vec<(Vec<u8>, u32)> = (0..32)
        .map(|_| {
            let mut bins = [0u32; BIN_COUNT];
            for _ in 0..20 {
                bins[rng.random_range(0..BIN_COUNT)] += rng.random_range(1..100);
            }
            (
                key.encrypt_packed(&bins, &mut rng).unwrap().to_bytes(),
                bins.iter().sum(),
            )
        })
        .collect();
    let body = |rng: &mut ChaCha20Rng| {
        let (ct, samples) = &pool[rng.random_range(0..pool.len())];
        let snippet = snippets[rng.random_range(0..snippets.len())];
        let mut id = [0u8; 16];
        rng.fill_bytes(&mut id);
        let report = Report {
            key_id: key.key_id(),
            report_id: ReportId(id),
            snippet: snippet.hash,
            locator: snippet.locator,
            arch: penrose_core::gpu::GpuArch::new(9, 0),
            counter: CounterId(rng.random_range(0..9)),
            catalogue: CatalogueVersion(1),
            day: Day(20_000),
            samples: SampleCount(*samples),
            ciphertexts: PackedBytes::new(ct.clone(), 2).unwrap(),
            token: None,
            evidence: None,
        };
        Message::Report(report).to_frame().unwrap()[LENGTH_PREFIX..].to_vec()
    };
    let template: Vec<ValidReport> = (0..BATCH)
        .map(|_| {
            validate_body(
                &body(&mut rng),
                &keys_for_validation,
                Day(20_000),
                &Admission::Open,
            )
            .unwrap()
        })
        .collect();

    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> = Arc::new(RocksStore::open(dir.path()).unwrap());
    let mut state = State::open(
        store,
        &key,
        FingerprintParams::default(),
        penrose_aggregator::export::sub_sum_reports(&ReleaseRule::default()),
        None,
    )
    .unwrap();

    let mut group = c.benchmark_group(group_name);
    group.sample_size(20);
    group.throughput(Throughput::Elements(BATCH as u64));
    group.bench_function("writer_apply_batch_of_1024_synced", |b| {
        b.iter_batched(
            || {
                // Fresh report ids and ciphertext digests, so that every report is new to the
                // deduplication record (which folds exact copies of a ciphertext by its digest;
                // the digest's own cost is validation's, measured below). The multiplications
                // are the same as for fresh ciphertexts.
                let mut batch = template.clone();
                for r in &mut batch {
                    rng.fill_bytes(&mut r.report.report_id.0);
                    rng.fill_bytes(&mut r.digest.0);
                }
                batch
            },
            |batch| state.apply(&batch, Day(20_000)).unwrap(),
            BatchSize::LargeInput,
        )
    });
    group.bench_function("writer_apply_batch_of_1024_synced_with_tokens", |b| {
        b.iter_batched(
            || {
                // As above, each report with a fresh spent token to look up and record.
                let mut batch = template.clone();
                for r in &mut batch {
                    rng.fill_bytes(&mut r.report.report_id.0);
                    rng.fill_bytes(&mut r.digest.0);
                    let mut id = [0u8; 32];
                    rng.fill_bytes(&mut id);
                    r.token = Some(SpentToken {
                        epoch: TokenEpoch(20_000),
                        id: SpentId(id),
                    });
                }
                batch
            },
            |batch| state.apply(&batch, Day(20_000)).unwrap(),
            BatchSize::LargeInput,
        )
    });
    group.finish();
    if !validation {
        return;
    }

    let mut group = c.benchmark_group(group_name);
    group.throughput(Throughput::Elements(1));
    let one = body(&mut rng);
    group.bench_function("validate_body_one_report", |b| {
        b.iter(|| validate_body(&one, &keys_for_validation, Day(20_000), &Admission::Open).unwrap())
    });
    // The same report with a token of the ring's key of its day and counter.
    let mut report = match Message::decode_body(&one).unwrap() {
        Message::Report(r) => r,
        _ => unreachable!(),
    };
    let (epoch, scope) = (TokenEpoch(20_000), TokenScope(report.counter.0));
    let issuer = IssuerKey::generate(epoch, scope, &mut rng);
    let ring = KeyRing::new([issuer.clone()]).unwrap();
    let set = ring.key_set();
    let pending = TokenRequest::new(set.get(epoch, scope).unwrap(), 1, &mut rng).unwrap();
    let response = issuer.issue(pending.request(), &mut rng).unwrap();
    let token = pending.finalize(&response).unwrap().remove(0);
    report.token = Some(penrose_core::wire::AdmissionToken(
        token.redeem(&report.token_binding()).encode(),
    ));
    let tokened = Message::Report(report).to_frame().unwrap()[LENGTH_PREFIX..].to_vec();
    let admission = Admission::Tokens(TokenRing::new(ring));
    group.bench_function("validate_body_one_report_with_token", |b| {
        b.iter(|| validate_body(&tokened, &keys_for_validation, Day(20_000), &admission).unwrap())
    });
    group.finish();
}

criterion_group!(wall_benches, wall);
criterion_group! {
    name = cpu_benches;
    config = Criterion::default().with_measurement(ThreadCpuTime);
    targets = cpu
}
criterion_main!(wall_benches, cpu_benches);
