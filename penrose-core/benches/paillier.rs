//! Packed Paillier costs at the deployed 2048-bit size: what one client pays to encrypt a
//! histogram, what the aggregator pays per report, what the design server pays per decryption,
//! and what each holder and the combiner pay for a threshold (2-of-2) decryption.
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
use penrose_core::paillier::threshold::{self, split};
use penrose_core::paillier::{
    Accumulator, BIN_COUNT, KeySize, Keypair, MAX_BIN_VALUE, PackedCiphertexts, PublicKey,
};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha20Rng;
use rug::Integer;
use rug::integer::Order;

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

    threshold_decryption(c, clock, &pair, &bins, &mut rng);
}

/// Threshold decryption of an accumulated sum of a few reports, beside CRT decryption of the
/// same sum (the ratio is what docs/crypto.md reports). Run alone with the filter `threshold`.
fn threshold_decryption<M: Measurement + 'static>(
    c: &mut Criterion<M>,
    clock: &str,
    pair: &Keypair,
    bins: &[u32],
    rng: &mut ChaCha20Rng,
) {
    let public = pair.public_key();
    let shares = split(pair.private_key(), rng).unwrap();
    let mut accumulator = Accumulator::new(public);
    for _ in 0..4 {
        let report = public.encrypt_packed(bins, rng).unwrap();
        accumulator.absorb(&report, 1).unwrap();
    }
    let sum = accumulator.sum().unwrap();
    let verification = shares.design.verification_key();
    let design = shares.design.partial_decrypt(&sum, rng).unwrap();
    let auditor = shares.auditor.partial_decrypt(&sum, rng).unwrap();
    let combined = threshold::combine(verification, &sum, &design, &auditor).unwrap();
    assert_eq!(combined, pair.private_key().decrypt_packed(&sum).unwrap());

    let mut group = c.benchmark_group(format!("{clock}/threshold_decrypt_histogram_2048"));
    group.sample_size(10);
    group.bench_function("crt_reference", |b| {
        b.iter(|| pair.private_key().decrypt_packed(black_box(&sum)).unwrap())
    });
    group.bench_function("partial_decrypt_with_proof_one_holder", |b| {
        b.iter(|| {
            shares
                .auditor
                .partial_decrypt(black_box(&sum), rng)
                .unwrap()
        })
    });
    let (ciphertexts, exponent, nn) = bare_share_powers(public, &sum, rng);
    group.bench_function("share_powers_alone_without_proof", |b| {
        b.iter(|| {
            for ciphertext in &ciphertexts {
                black_box(ciphertext.clone().secure_pow_mod(&exponent, &nn));
            }
        })
    });
    group.bench_function("combine_checking_both_proofs", |b| {
        b.iter(|| threshold::combine(verification, black_box(&sum), &design, &auditor).unwrap())
    });
    group.finish();
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

/// What a partial decryption costs without its proof: the sum's ciphertexts, an exponent of a
/// share's size (2 |n| + 129 bits) and n^2, for c^(d_i) mod n^2 with `mpz_powm_sec`.
fn bare_share_powers(
    public: &PublicKey,
    sum: &PackedCiphertexts,
    rng: &mut ChaCha20Rng,
) -> (Vec<Integer>, Integer, Integer) {
    let size = public.size();
    // The public key format: 7 header bytes, then n.
    let n_bytes = &public.to_bytes()[7..7 + size.modulus_bytes()];
    let nn = Integer::from_digits(n_bytes, Order::Msf).square();
    let share_bits = 2 * size.modulus_bits() + 129;
    let mut exponent_bytes = vec![0u8; share_bits.div_ceil(8) as usize];
    rng.fill(&mut exponent_bytes[..]);
    let exponent = Integer::from_digits(&exponent_bytes, Order::Msf).keep_bits(share_bits);
    let ciphertexts = sum
        .to_bytes()
        .chunks(size.ciphertext_bytes())
        .map(|chunk| Integer::from_digits(chunk, Order::Msf))
        .collect();
    (ciphertexts, exponent, nn)
}
