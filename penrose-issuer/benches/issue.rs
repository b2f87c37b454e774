//! Issuance per token per core in the issuer service: `Issuer::handle` on a whole issue request
//! as it arrives from the transport (decode the protocol message, look the credential up, take
//! from its rate bucket, and per batch decode the blinded elements, read the quota, evaluate
//! and prove; then one synced RocksDB write of the new counts, and encode the answer). The
//! QUIC handshake and the client's work are not in it (the client's costs are in
//! `penrose-core/benches/tokens.rs`, the evaluation alone as `issuer_issue_from_wire` there).
//!
//! Run: `cargo bench -p penrose-issuer --bench issue`. Each iteration is a fresh enrolled
//! credential (its quota full), made outside the measurement. Throughput (criterion's
//! elements/s) is per token. As in the other benchmarks, `wall/...` is elapsed time (the WAL
//! sync's wait included) and `cpu/...` the benchmarking thread's CPU time (it does the whole
//! request, the write and the sync call included): what one core spends.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::sync::Arc;
use std::time::Duration;

use criterion::measurement::Measurement;
use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use penrose_core::tokens::protocol::{BatchOutcome, IssuerAnswer, IssuerRequest};
use penrose_core::tokens::{KeySet, TokenEpoch, TokenRequest, TokenScope};
use penrose_core::wire::Day;
use penrose_host::clock::ManualClock;
use penrose_issuer::credential::{self, CredentialId};
use penrose_issuer::keys::scopes;
use penrose_issuer::{Issuer, IssuerConfig, StateDir, admin};

#[path = "../../penrose-core/benches/support/thread_cpu.rs"]
mod thread_cpu;
use thread_cpu::ThreadCpuTime;

const DAY: Day = Day(20_400);

/// A request for `per_batch` tokens of each of `batches` counters of today, by a credential
/// enrolled just now.
fn request(issuer: &Issuer, set: &KeySet, batches: usize, per_batch: usize) -> Vec<u8> {
    let secret = credential::generate();
    admin::enrol(issuer.store(), &[CredentialId::of(&secret)], None, DAY).unwrap();
    let mut rng = rand::rng();
    let batches = scopes()
        .into_iter()
        .take(batches)
        .map(|TokenScope(scope)| {
            let entry = set.get(TokenEpoch(DAY.0), TokenScope(scope)).unwrap();
            TokenRequest::new(entry, per_batch, &mut rng)
                .unwrap()
                .request()
                .encode()
        })
        .collect();
    IssuerRequest::Issue {
        credential: secret,
        batches,
    }
    .encode()
}

fn bench<M: Measurement + 'static>(c: &mut Criterion<M>, clock: &str) {
    let dir = tempfile::tempdir().unwrap();
    let state = StateDir::new(dir.path().join("state"));
    admin::init(&state).unwrap();
    let issuer = Issuer::open(
        &state,
        Arc::new(ManualClock::at_day(DAY)),
        IssuerConfig::new(24, 1_000_000).unwrap(),
    )
    .unwrap();
    let set = issuer.published().unwrap().set.clone();
    let counters = scopes().len();

    let mut group = c.benchmark_group(format!("{clock}/issuer_handle"));
    group.sample_size(30);
    group.measurement_time(Duration::from_secs(10));
    for (name, batches, per_batch) in [
        ("one_batch_of_24", 1, 24),
        ("day_all_counters_batches_of_24", counters, 24),
    ] {
        // What is measured issues every token it asks for.
        let answer = issuer.handle(&request(&issuer, &set, batches, per_batch));
        assert!(matches!(
            IssuerAnswer::decode(&answer),
            Ok(IssuerAnswer::Issued(outcomes))
                if outcomes.len() == batches
                    && outcomes.iter().all(|o| matches!(o, BatchOutcome::Issued(_)))
        ));
        group.throughput(Throughput::Elements((batches * per_batch) as u64));
        group.bench_function(name, |b| {
            b.iter_batched(
                || request(&issuer, &set, batches, per_batch),
                |bytes| issuer.handle(&bytes),
                BatchSize::PerIteration,
            )
        });
    }
    group.finish();
}

fn wall(c: &mut Criterion) {
    bench(c, "wall");
}

fn cpu(c: &mut Criterion<ThreadCpuTime>) {
    bench(c, "cpu");
}

criterion_group!(wall_benches, wall);
criterion_group! {
    name = cpu_benches;
    config = Criterion::default().with_measurement(ThreadCpuTime);
    targets = cpu
}
criterion_main!(wall_benches, cpu_benches);
