//! Properties of packed Paillier: round trips, homomorphic sums, the accumulator bound,
//! ciphertext validation and key encodings. Most cases use small (insecure, fast) keys; a few
//! use the deployed 2048-bit size.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::LazyLock;

use penrose_core::paillier::{
    ACCUMULATOR_REPORT_BOUND, Accumulator, BIN_COUNT, KeySize, Keypair, MAX_BIN_VALUE,
    PaillierError, PrivateKey, PublicKey,
};
use proptest::prelude::*;
use rand::SeedableRng;
use rand_chacha::ChaCha20Rng;
use rug::Integer;
use rug::integer::Order;

/// Bytes before the numbers in both key formats: tag, version, modulus size.
const HEADER: usize = 7;
use sha2::{Digest, Sha256};

fn keypair(size: KeySize, seed: u64) -> Keypair {
    Keypair::generate_with_size(size, &mut ChaCha20Rng::seed_from_u64(seed))
}

static KEY_512: LazyLock<Keypair> = LazyLock::new(|| keypair(KeySize::Bits512, 1));
static KEY_1024: LazyLock<Keypair> = LazyLock::new(|| keypair(KeySize::Bits1024, 2));
static KEY_2048: LazyLock<Keypair> = LazyLock::new(|| keypair(KeySize::Bits2048, 3));

fn histogram() -> impl Strategy<Value = Vec<u32>> {
    prop::collection::vec(0..=MAX_BIN_VALUE as u32, BIN_COUNT)
}

/// p from the documented private key layout: version, u16 bits, then p.
fn prime_p(key: &PrivateKey) -> Integer {
    let bytes = key.to_bytes();
    let len = key.public_key().size().prime_bytes();
    Integer::from_digits(&bytes[HEADER..HEADER + len], Order::Msf)
}

fn fixed_bytes(value: &Integer, len: usize) -> Vec<u8> {
    let mut out = vec![0u8; len];
    value.write_digits(&mut out, Order::Msf);
    out
}

fn modulus_squared(key: &PublicKey) -> Integer {
    let bytes = key.to_bytes();
    let n = Integer::from_digits(
        &bytes[HEADER..HEADER + key.size().modulus_bytes()],
        Order::Msf,
    );
    n.square()
}

fn round_trip(pair: &Keypair, bins: &[u32], seed: u64, plain: bool) {
    let public = pair.public_key();
    let mut rng = ChaCha20Rng::seed_from_u64(seed);
    let packed = if plain {
        public.encrypt_packed_plain(bins, &mut rng).unwrap()
    } else {
        public.encrypt_packed(bins, &mut rng).unwrap()
    };
    assert_eq!(
        packed.ciphertexts().len(),
        public.size().ciphertexts_per_histogram()
    );
    let wire = packed.to_bytes();
    assert_eq!(wire.len(), public.size().packed_bytes());
    let received = public.validate_packed(&wire).unwrap();
    assert_eq!(received, packed);
    let decrypted = pair.private_key().decrypt_packed(&received).unwrap();
    let expected: Vec<u64> = bins.iter().map(|&b| u64::from(b)).collect();
    assert_eq!(decrypted.to_vec(), expected);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    #[test]
    fn packing_round_trips_small_keys(bins in histogram(), seed: u64, plain: bool) {
        round_trip(&KEY_512, &bins, seed, plain);
        round_trip(&KEY_1024, &bins, seed, plain);
    }

    #[test]
    fn decrypted_sum_is_the_sum_of_histograms(
        histograms in prop::collection::vec(histogram(), 1..12),
        seed: u64,
    ) {
        let pair = &*KEY_1024;
        let public = pair.public_key();
        let mut rng = ChaCha20Rng::seed_from_u64(seed);
        let mut accumulator = Accumulator::new(public);
        let mut expected = [0u64; BIN_COUNT];
        let mut samples = 0;
        for (i, bins) in histograms.iter().enumerate() {
            let packed = if i % 3 == 0 {
                public.encrypt_packed_plain(bins, &mut rng).unwrap()
            } else {
                public.encrypt_packed(bins, &mut rng).unwrap()
            };
            let report_samples = bins.iter().map(|&b| u64::from(b)).max().unwrap_or(0);
            if i % 2 == 0 {
                accumulator.absorb_bytes(&packed.to_bytes(), report_samples).unwrap();
            } else {
                let validated = public.validate_packed(&packed.to_bytes()).unwrap();
                accumulator.absorb(&validated, report_samples).unwrap();
            }
            samples += report_samples;
            for (sum, &bin) in expected.iter_mut().zip(bins) {
                *sum += u64::from(bin);
            }
        }
        prop_assert_eq!(accumulator.reports(), histograms.len() as u64);
        prop_assert_eq!(accumulator.samples(), samples);
        let decrypted = pair.private_key().decrypt_packed(&accumulator.sum().unwrap()).unwrap();
        prop_assert_eq!(decrypted, expected);
    }

    #[test]
    fn accumulator_refuses_past_its_bound(bound in 1u64..16, bins in histogram(), seed: u64) {
        let pair = &*KEY_512;
        let public = pair.public_key();
        let mut rng = ChaCha20Rng::seed_from_u64(seed);
        let packed = public.encrypt_packed(&bins, &mut rng).unwrap();
        let mut accumulator = Accumulator::with_bound(public, bound).unwrap();
        for _ in 0..bound {
            accumulator.absorb(&packed, 1).unwrap();
        }
        prop_assert!(accumulator.is_full());
        prop_assert_eq!(
            accumulator.absorb(&packed, 1),
            Err(PaillierError::AccumulatorFull { bound })
        );
        prop_assert_eq!(accumulator.reports(), bound);
        prop_assert_eq!(accumulator.samples(), bound);
        let decrypted = pair.private_key().decrypt_packed(&accumulator.sum().unwrap()).unwrap();
        for (sum, &bin) in decrypted.iter().zip(&bins) {
            prop_assert_eq!(*sum, u64::from(bin) * bound);
        }
    }

    #[test]
    fn validation_rejects_malformed_ciphertexts(
        seed: u64,
        excess in 0u64..u64::MAX,
        length in 0usize..1200,
    ) {
        let pair = &*KEY_512;
        let public = pair.public_key();
        let len = public.size().ciphertext_bytes();
        let mut rng = ChaCha20Rng::seed_from_u64(seed);
        let nn = modulus_squared(public);

        prop_assert_eq!(
            public.validate_ciphertext(&vec![0u8; len]),
            Err(PaillierError::CiphertextZero)
        );
        // n^2 + excess still fits the fixed length for a 512-bit key (n^2 < 2^1024 - 2^64).
        let too_large = Integer::from(&nn + excess);
        prop_assert_eq!(
            public.validate_ciphertext(&fixed_bytes(&too_large, len)),
            Err(PaillierError::CiphertextTooLarge)
        );
        let p = prime_p(pair.private_key());
        let multiple = Integer::from(&p * (excess % 1_000_000 + 1));
        prop_assert_eq!(
            public.validate_ciphertext(&fixed_bytes(&multiple, len)),
            Err(PaillierError::CiphertextNotUnit)
        );
        if length != len {
            prop_assert_eq!(
                public.validate_ciphertext(&vec![1u8; length]),
                Err(PaillierError::Length { expected: len, actual: length })
            );
            let packed_len = public.size().packed_bytes();
            if length != packed_len {
                let refused = matches!(
                    public.validate_packed(&vec![1u8; length]),
                    Err(PaillierError::Length { .. })
                );
                prop_assert!(refused);
            }
        }
        // The hot path refuses the same inputs, except multiples of p, which poison the sum
        // and are caught there.
        let genuine = public.encrypt_packed(&[1u32; BIN_COUNT], &mut rng).unwrap().to_bytes();
        let multiple_of_n = Integer::from(nn.sqrt_ref()) * (excess % 1_000_000 + 1);
        for (bad, error) in [
            (vec![0u8; len], PaillierError::CiphertextZero),
            (fixed_bytes(&too_large, len), PaillierError::CiphertextTooLarge),
            (fixed_bytes(&multiple_of_n, len), PaillierError::CiphertextNotUnit),
        ] {
            let mut wire = genuine.clone();
            wire[len..2 * len].copy_from_slice(&bad);
            let mut accumulator = Accumulator::new(public);
            prop_assert_eq!(accumulator.absorb_bytes(&wire, 1), Err(error));
            prop_assert_eq!(accumulator.reports(), 0);
            let unchanged = pair.private_key().decrypt_packed(&accumulator.sum().unwrap()).unwrap();
            prop_assert_eq!(unchanged, [0u64; BIN_COUNT]);
        }
        let mut short = Accumulator::new(public);
        let refused = matches!(
            short.absorb_bytes(&genuine[1..], 1),
            Err(PaillierError::Length { .. })
        );
        prop_assert!(refused);
        let mut poisoned = Accumulator::new(public);
        let mut wire = genuine.clone();
        wire[..len].copy_from_slice(&fixed_bytes(&multiple, len));
        poisoned.absorb_bytes(&wire, 1).unwrap();
        poisoned.absorb_bytes(&genuine, 1).unwrap();
        prop_assert_eq!(poisoned.sum(), Err(PaillierError::CiphertextNotUnit));

        // A genuine ciphertext is accepted and re-encodes to the same bytes.
        let packed = public.encrypt_packed(&[0u32; BIN_COUNT], &mut rng).unwrap();
        let wire = packed.to_bytes();
        let one = public.validate_ciphertext(&wire[..len]).unwrap();
        prop_assert_eq!(&one, &packed.ciphertexts()[0]);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(3))]

    #[test]
    fn packing_round_trips_2048(bins in histogram(), seed: u64, plain: bool) {
        round_trip(&KEY_2048, &bins, seed, plain);
    }
}

#[test]
fn deployed_size_sends_two_ciphertexts_of_512_bytes() {
    let public = KEY_2048.public_key();
    let packed = public
        .encrypt_packed(
            &[MAX_BIN_VALUE; BIN_COUNT],
            &mut ChaCha20Rng::seed_from_u64(9),
        )
        .unwrap();
    assert_eq!(packed.ciphertexts().len(), 2);
    assert_eq!(packed.to_bytes().len(), 1024);
    let decrypted = KEY_2048.private_key().decrypt_packed(&packed).unwrap();
    assert_eq!(decrypted, [MAX_BIN_VALUE; BIN_COUNT]);
}

/// The bound is tight: the full bound of maximal reports fills every slot to just below
/// 2^31 and decrypts exactly; one more report is refused.
#[test]
fn full_accumulator_of_maximal_reports_decrypts_exactly() {
    let pair = &*KEY_512;
    let public = pair.public_key();
    let packed = public
        .encrypt_packed(
            &[MAX_BIN_VALUE; BIN_COUNT],
            &mut ChaCha20Rng::seed_from_u64(4),
        )
        .unwrap();
    let mut accumulator = Accumulator::new(public);
    while !accumulator.is_full() {
        accumulator.absorb(&packed, MAX_BIN_VALUE).unwrap();
    }
    assert_eq!(accumulator.reports(), ACCUMULATOR_REPORT_BOUND);
    assert!(matches!(
        accumulator.absorb(&packed, 1),
        Err(PaillierError::AccumulatorFull { .. })
    ));
    let decrypted = pair
        .private_key()
        .decrypt_packed(&accumulator.sum().unwrap())
        .unwrap();
    assert_eq!(
        decrypted,
        [ACCUMULATOR_REPORT_BOUND * MAX_BIN_VALUE; BIN_COUNT]
    );
}

#[test]
fn encryption_refuses_bins_outside_the_bound() {
    let public = KEY_512.public_key();
    let mut rng = ChaCha20Rng::seed_from_u64(5);
    let mut bins = [0u64; BIN_COUNT];
    bins[BIN_COUNT - 1] = MAX_BIN_VALUE + 1;
    assert_eq!(
        public.encrypt_packed(&bins, &mut rng),
        Err(PaillierError::BinTooLarge {
            index: BIN_COUNT - 1,
            value: MAX_BIN_VALUE + 1,
            max: MAX_BIN_VALUE
        })
    );
    assert!(matches!(
        public.encrypt_packed(&[0u32; BIN_COUNT + 1], &mut rng),
        Err(PaillierError::BinCount { .. })
    ));
}

#[test]
fn accumulator_checks_key_samples_and_bound() {
    let other = keypair(KeySize::Bits512, 77);
    let public = KEY_512.public_key();
    let mut rng = ChaCha20Rng::seed_from_u64(6);
    let foreign = other
        .public_key()
        .encrypt_packed(&[1u32; BIN_COUNT], &mut rng)
        .unwrap();
    let mut accumulator = Accumulator::new(public);
    assert!(matches!(
        accumulator.absorb(&foreign, 1),
        Err(PaillierError::KeyMismatch { .. })
    ));
    assert!(matches!(
        KEY_512.private_key().decrypt_packed(&foreign),
        Err(PaillierError::KeyMismatch { .. })
    ));
    let own = public.encrypt_packed(&[1u32; BIN_COUNT], &mut rng).unwrap();
    assert!(matches!(
        accumulator.absorb(&own, MAX_BIN_VALUE + 1),
        Err(PaillierError::TooManySamples { .. })
    ));
    assert_eq!(accumulator.reports(), 0);
    assert!(matches!(
        Accumulator::with_bound(public, ACCUMULATOR_REPORT_BOUND + 1),
        Err(PaillierError::BoundTooLarge { .. })
    ));
}

#[test]
fn keys_round_trip_and_key_id_hashes_the_public_key() {
    for pair in [&*KEY_512, &*KEY_2048] {
        let public = pair.public_key();
        let bytes = public.to_bytes();
        assert_eq!(
            bytes.len(),
            HEADER + public.size().modulus_bytes() + public.size().ciphertext_bytes()
        );
        let id: [u8; 32] = Sha256::digest(&bytes).into();
        assert_eq!(public.key_id().0, id);
        let parsed = PublicKey::from_bytes(&bytes).unwrap();
        assert_eq!(parsed.key_id(), public.key_id());
        assert_eq!(parsed.to_bytes(), bytes);

        let private = PrivateKey::from_bytes(&pair.private_key().to_bytes()).unwrap();
        assert_eq!(private.public_key().key_id(), public.key_id());
        let packed = parsed
            .encrypt_packed(&[7u32; BIN_COUNT], &mut ChaCha20Rng::seed_from_u64(8))
            .unwrap();
        assert_eq!(private.decrypt_packed(&packed).unwrap(), [7; BIN_COUNT]);
    }
}

#[test]
fn key_parsing_rejects_malformed_keys() {
    let pair = &*KEY_512;
    let public = pair.public_key().to_bytes();
    let private = pair.private_key().to_bytes();

    let mut bad = public.clone();
    bad[4] = 2;
    assert_eq!(
        PublicKey::from_bytes(&bad),
        Err(PaillierError::UnsupportedVersion(2))
    );
    // Each kind refuses the other's file, although both are the same length.
    assert_eq!(public.len(), private.len());
    assert!(matches!(
        PublicKey::from_bytes(&private),
        Err(PaillierError::InvalidKey(_))
    ));
    assert!(matches!(
        PrivateKey::from_bytes(&public),
        Err(PaillierError::InvalidKey(_))
    ));
    let mut bad = public.clone();
    bad[5..7].copy_from_slice(&1536u16.to_be_bytes());
    assert_eq!(
        PublicKey::from_bytes(&bad),
        Err(PaillierError::UnsupportedKeySize(1536))
    );
    assert!(matches!(
        PublicKey::from_bytes(&public[..public.len() - 1]),
        Err(PaillierError::Length { .. })
    ));
    assert!(matches!(
        PublicKey::from_bytes(&[1]),
        Err(PaillierError::Length { .. })
    ));
    let mut even = public.clone();
    even[HEADER + 63] &= 0xfe;
    assert!(matches!(
        PublicKey::from_bytes(&even),
        Err(PaillierError::InvalidKey(_))
    ));
    let mut zero_h = public.clone();
    zero_h[HEADER + 64..].fill(0);
    assert!(matches!(
        PublicKey::from_bytes(&zero_h),
        Err(PaillierError::InvalidKey(_))
    ));

    assert!(matches!(
        PrivateKey::from_bytes(&private[..private.len() - 1]),
        Err(PaillierError::Length { .. })
    ));
    // q := p.
    let mut same = private.clone();
    let (head, tail) = same.split_at_mut(HEADER + 32);
    tail[..32].copy_from_slice(&head[HEADER..]);
    assert_eq!(
        PrivateKey::from_bytes(&same).err(),
        Some(PaillierError::InvalidKey("p equals q"))
    );
    // p + 2 is (almost surely) composite or at least not the key's factor.
    let mut composite = private.clone();
    composite[HEADER + 31] ^= 0x02;
    assert!(matches!(
        PrivateKey::from_bytes(&composite),
        Err(PaillierError::InvalidKey(_))
    ));
    // An h_s from another key is not an n-th residue for this one.
    let other = keypair(KeySize::Bits512, 78).private_key().to_bytes();
    let mut foreign_h = private.clone();
    foreign_h[HEADER + 64..].copy_from_slice(&other[HEADER + 64..]);
    assert!(matches!(
        PrivateKey::from_bytes(&foreign_h),
        Err(PaillierError::InvalidKey(_))
    ));
}

#[test]
fn private_key_debug_shows_no_secret() {
    let private = KEY_512.private_key();
    let debug = format!("{private:?} {:?}", &*KEY_512);
    let p = prime_p(private);
    assert!(!debug.contains(&p.to_string()));
    assert!(!debug.contains(&p.to_string_radix(16)));
    assert!(debug.contains("PrivateKey"));
}

#[test]
fn accumulator_state_restores_and_keeps_summing() {
    let public = KEY_512.public_key();
    let mut rng = ChaCha20Rng::seed_from_u64(8);
    let mut bins = [0u32; BIN_COUNT];
    bins[3] = 5;
    bins[127] = 2;
    let one = public.encrypt_packed(&bins, &mut rng).unwrap();
    let mut accumulator = Accumulator::new(public);
    accumulator.absorb(&one, 7).unwrap();
    let state = accumulator.state_bytes();
    let mut restored =
        Accumulator::restore(public, ACCUMULATOR_REPORT_BOUND, &state, 1, 7).unwrap();
    restored.absorb(&one, 7).unwrap();
    assert_eq!((restored.reports(), restored.samples()), (2, 14));
    let sums = KEY_512
        .private_key()
        .decrypt_packed(&restored.sum().unwrap())
        .unwrap();
    assert_eq!((sums[3], sums[127], sums.iter().sum::<u64>()), (10, 4, 14));

    assert!(matches!(
        Accumulator::restore(public, ACCUMULATOR_REPORT_BOUND, &state[1..], 1, 7),
        Err(PaillierError::Length { .. })
    ));
    assert!(matches!(
        Accumulator::restore(
            public,
            ACCUMULATOR_REPORT_BOUND,
            &vec![0; state.len()],
            1,
            7
        ),
        Err(PaillierError::CiphertextZero)
    ));
    assert!(matches!(
        Accumulator::restore(
            public,
            ACCUMULATOR_REPORT_BOUND,
            &vec![0xff; state.len()],
            1,
            7
        ),
        Err(PaillierError::CiphertextTooLarge)
    ));
    assert!(matches!(
        Accumulator::restore(
            public,
            ACCUMULATOR_REPORT_BOUND,
            &state,
            1,
            MAX_BIN_VALUE + 1
        ),
        Err(PaillierError::TooManySamples { .. })
    ));
    assert!(matches!(
        Accumulator::restore(
            public,
            ACCUMULATOR_REPORT_BOUND,
            &state,
            ACCUMULATOR_REPORT_BOUND + 1,
            1
        ),
        Err(PaillierError::AccumulatorFull { .. })
    ));
}

/// Two accumulated sums added with `add_packed` decrypt to the bin-wise sum of every report in
/// either (what export does when it releases a merged class's sums with its survivor's), and
/// sums under another key are refused.
#[test]
fn added_sums_decrypt_to_the_sum_of_both() {
    let pair = &*KEY_512;
    let public = pair.public_key();
    let mut rng = ChaCha20Rng::seed_from_u64(9);
    let mut expected = vec![0u64; BIN_COUNT];
    let mut sums = Vec::new();
    for part in 0..2u32 {
        let mut acc = Accumulator::new(public);
        for report in 0..3u32 {
            let bins: Vec<u32> = (0..BIN_COUNT as u32)
                .map(|b| (b * 7 + report * 13 + part * 5) % 50)
                .collect();
            for (e, b) in expected.iter_mut().zip(&bins) {
                *e += u64::from(*b);
            }
            let packed = public.encrypt_packed(&bins, &mut rng).unwrap();
            acc.absorb(&packed, 1).unwrap();
        }
        sums.push(acc.sum().unwrap());
    }
    let both = public.add_packed(&sums[0], &sums[1]).unwrap();
    let decrypted = pair.private_key().decrypt_packed(&both).unwrap();
    assert_eq!(decrypted.to_vec(), expected);

    let other = keypair(KeySize::Bits512, 78);
    let foreign = other
        .public_key()
        .encrypt_packed(&[1u32; BIN_COUNT], &mut rng)
        .unwrap();
    assert!(matches!(
        public.add_packed(&sums[0], &foreign),
        Err(PaillierError::KeyMismatch { .. })
    ));
}
