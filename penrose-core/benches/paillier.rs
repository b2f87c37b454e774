//! Packed Paillier costs at the deployed 2048-bit size: what one client pays to encrypt a
//! histogram, what the aggregator pays per report, what the design server pays per decryption.
//!
//! Run: `cargo bench -p penrose-core --bench paillier`. Targets (docs/design.md section 4):
//! encrypt <= 3 ms, aggregate >= 60,000 histograms/s/core, report <= 2 KB.
//!
//! Every benchmark runs twice: `wall/...` measures elapsed time, `cpu/...` the CPU time of the
//! benchmarking thread. On a shared machine the wall figures grow with the load of other
//! processes; the CPU figures are what one core spends, which is what "per core" means.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::hint::black_box;

use criterion::measurement::Measurement;
use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use penrose_core::paillier::{Accumulator, BIN_COUNT, KeySize, Keypair, MAX_BIN_VALUE, PublicKey};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha20Rng;

#[path = "support/thread_cpu.rs"]
mod thread_cpu;
use thread_cpu::ThreadCpuTime;

fn setup() -> (Keypair, Vec<u32>, ChaCha20Rng) {
    let mut rng = ChaCha20Rng::seed_from_u64(2048);
    let pair = Keypair::generate_with_size(KeySize::Bits2048, &mut rng);
    let bins = (0..BIN_COUNT)
        .map(|_| rng.random_range(0..=MAX_BIN_VALUE as u32))
        .collect();
    (pair, bins, rng)
}

fn paillier<M: Measurement + 'static>(c: &mut Criterion<M>, clock: &str) {
    let (pair, bins, mut rng) = setup();
    let public = pair.public_key();

    let report = public.encrypt_packed(&bins, &mut rng).unwrap();
    let wire = report.to_bytes();
    let size = KeySize::PRODUCTION;
    println!(
        "packed report: {} bytes ({} ciphertexts x {} bytes, {} slots each)",
        wire.len(),
        size.ciphertexts_per_histogram(),
        size.ciphertext_bytes(),
        size.slots_per_ciphertext()
    );
    assert!(wire.len() <= 2048, "a packed report must stay within 2 KB");

    let mut encrypt = c.benchmark_group(format!("{clock}/encrypt_histogram_2048"));
    encrypt.bench_function("djn_fixed_base", |b| {
        b.iter(|| public.encrypt_packed(black_box(&bins), &mut rng).unwrap())
    });
    encrypt.bench_function("plain_r_pow_n", |b| {
        b.iter(|| {
            public
                .encrypt_packed_plain(black_box(&bins), &mut rng)
                .unwrap()
        })
    });
    encrypt.sample_size(10);
    let public_bytes = public.to_bytes();
    encrypt.bench_function("djn_first_use_with_table_build", |b| {
        b.iter_batched(
            || PublicKey::from_bytes(&public_bytes).unwrap(),
            |fresh| fresh.encrypt_packed(black_box(&bins), &mut rng).unwrap(),
            BatchSize::PerIteration,
        )
    });
    encrypt.finish();

    let mut aggregate = c.benchmark_group(format!("{clock}/aggregate_histogram_2048"));
    aggregate.throughput(Throughput::Elements(1));
    let mut accumulator = Accumulator::new(public);
    aggregate.bench_function("absorb_bytes_from_wire", |b| {
        b.iter(|| {
            if accumulator.is_full() {
                accumulator = Accumulator::new(public);
            }
            accumulator.absorb_bytes(black_box(&wire), 1).unwrap();
        })
    });
    aggregate.bench_function("validate_packed_with_gcd_then_absorb", |b| {
        b.iter(|| {
            if accumulator.is_full() {
                accumulator = Accumulator::new(public);
            }
            let received = public.validate_packed(black_box(&wire)).unwrap();
            accumulator.absorb(&received, 1).unwrap();
        })
    });
    aggregate.bench_function("validate_only", |b| {
        b.iter(|| public.validate_packed(black_box(&wire)).unwrap())
    });
    aggregate.bench_function("absorb_only", |b| {
        b.iter(|| {
            if accumulator.is_full() {
                accumulator = Accumulator::new(public);
            }
            accumulator.absorb(black_box(&report), 1).unwrap();
        })
    });
    aggregate.finish();

    let sum = accumulator.sum().unwrap();
    c.bench_function(&format!("{clock}/decrypt_histogram_2048_crt"), |b| {
        b.iter(|| pair.private_key().decrypt_packed(black_box(&sum)).unwrap())
    });
}

fn wall(c: &mut Criterion) {
    paillier(c, "wall");
}

fn cpu(c: &mut Criterion<ThreadCpuTime>) {
    paillier(c, "cpu");
}

criterion_group!(wall_benches, wall);
criterion_group! {
    name = cpu_benches;
    config = Criterion::default().with_measurement(ThreadCpuTime);
    targets = cpu
}
criterion_main!(wall_benches, cpu_benches);
