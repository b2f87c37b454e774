//! Anonymous token costs (`penrose_core::tokens`): what the issuer pays per token issued in a
//! batch of 24, what the agent pays to request and finalize them and to spend one on a report,
//! and what the aggregation server pays to verify one (decode and verify, the per-report cost
//! it adds to ingest).
//!
//! Run: `cargo bench -p penrose-core --features tokens --bench tokens`. Batch benchmarks
//! report time per batch; their throughput (criterion's elements/s) is per token.
//!
//! Every benchmark runs twice, as in the Paillier benchmark: `wall/...` measures elapsed time,
//! `cpu/...` the CPU time of the benchmarking thread (what one core spends).
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::hint::black_box;

use criterion::measurement::Measurement;
use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use penrose_core::tokens::{
    BlindedRequest, IssueResponse, IssuerKey, KeySet, Redemption, TokenEpoch, TokenRequest,
    TokenScope,
};
use rand::{RngCore, SeedableRng};
use rand_chacha::ChaCha20Rng;

#[path = "support/thread_cpu.rs"]
mod thread_cpu;
use thread_cpu::ThreadCpuTime;

/// Tokens per issuance batch: the agent's report cap per counter and day (T = 24).
const BATCH: usize = 24;

/// About the size of a report body today (1,126-byte frame, docs/benchmarks.md).
const REPORT_BODY_BYTES: usize = 1126;

fn tokens<M: Measurement + 'static>(c: &mut Criterion<M>, clock: &str) {
    let mut rng = ChaCha20Rng::seed_from_u64(9497);
    let key = IssuerKey::generate(TokenEpoch(1), TokenScope(0), &mut rng);
    let set = KeySet::of_keys([&key]).unwrap();
    let entry = set.get(TokenEpoch(1), TokenScope(0)).unwrap().clone();
    let mut body = vec![0u8; REPORT_BODY_BYTES];
    rng.fill_bytes(&mut body);

    let mut group = c.benchmark_group(format!("{clock}/tokens_batch_{BATCH}"));
    group.throughput(Throughput::Elements(BATCH as u64));
    // Client: nonces, token inputs, hash to the group and blind.
    group.bench_function("client_request", |b| {
        b.iter(|| TokenRequest::new(black_box(&entry), BATCH, &mut rng).unwrap())
    });
    // Issuer: decode the request from the wire, evaluate, prove, encode the response.
    let pending = TokenRequest::new(&entry, BATCH, &mut rng).unwrap();
    let request_bytes = pending.request().encode();
    group.bench_function("issuer_issue_from_wire", |b| {
        b.iter(|| {
            let request = BlindedRequest::decode(black_box(&request_bytes), &set).unwrap();
            key.issue(&request, &mut rng).unwrap().encode()
        })
    });
    // Client: decode the response, verify the proof, unblind, hash.
    group.bench_function("client_finalize_from_wire", |b| {
        b.iter_batched(
            || {
                let pending = TokenRequest::new(&entry, BATCH, &mut rng).unwrap();
                let response = key.issue(pending.request(), &mut rng).unwrap().encode();
                (pending, response)
            },
            |(pending, response)| {
                let answer = IssueResponse::decode(black_box(&response), &set).unwrap();
                pending.finalize(&answer).unwrap()
            },
            BatchSize::SmallInput,
        )
    });
    group.finish();

    let tokens = TokenRequest::new(&entry, BATCH, &mut rng)
        .and_then(|pending| {
            let response = key.issue(pending.request(), &mut rng)?;
            pending.finalize(&response)
        })
        .unwrap();
    let token = &tokens[0];
    let wire = token.redeem(&body).encode();

    let mut group = c.benchmark_group(format!("{clock}/tokens_one"));
    group.throughput(Throughput::Elements(1));
    // Client: bind a token to a report body.
    group.bench_function("client_redeem", |b| {
        b.iter(|| token.redeem(black_box(&body)))
    });
    // Aggregation server: decode the redemption, recompute the output, check the tag.
    group.bench_function("server_verify_from_wire", |b| {
        b.iter(|| {
            let redemption = Redemption::decode(black_box(&wire), &set).unwrap();
            key.verify(&redemption, black_box(&body)).unwrap()
        })
    });
    group.finish();
}

fn wall(c: &mut Criterion) {
    tokens(c, "wall");
}

fn cpu(c: &mut Criterion<ThreadCpuTime>) {
    tokens(c, "cpu");
}

criterion_group!(wall_benches, wall);
criterion_group! {
    name = cpu_benches;
    config = Criterion::default().with_measurement(ThreadCpuTime);
    targets = cpu
}
criterion_main!(wall_benches, cpu_benches);
