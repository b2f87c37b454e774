//! Threshold decryption against CRT decryption, each share alone, and every refusal.

use std::sync::LazyLock;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha20Rng;

use super::*;
use crate::paillier::{Accumulator, Keypair, MAX_BIN_VALUE};

struct Dealt {
    pair: Keypair,
    shares: DealtShares,
}

fn deal(size: KeySize, seed: u64) -> Dealt {
    let mut rng = ChaCha20Rng::seed_from_u64(seed);
    let pair = Keypair::generate_with_size(size, &mut rng);
    let shares = split(pair.private_key(), &mut rng).unwrap();
    Dealt { pair, shares }
}

static SMALL: LazyLock<Dealt> = LazyLock::new(|| deal(KeySize::Bits512, 11));
static OTHER: LazyLock<Dealt> = LazyLock::new(|| deal(KeySize::Bits512, 12));
static MEDIUM: LazyLock<Dealt> = LazyLock::new(|| deal(KeySize::Bits1024, 13));

impl Dealt {
    fn public(&self) -> &PublicKey {
        self.pair.public_key()
    }

    fn verification(&self) -> &VerificationKey {
        self.shares.design.verification_key()
    }

    fn encrypt(&self, bins: &[u32], rng: &mut ChaCha20Rng) -> PackedCiphertexts {
        self.public().encrypt_packed(bins, rng).unwrap()
    }

    fn partials(
        &self,
        packed: &PackedCiphertexts,
        rng: &mut ChaCha20Rng,
    ) -> (PartialDecryption, PartialDecryption) {
        (
            self.shares.design.partial_decrypt(packed, rng).unwrap(),
            self.shares.auditor.partial_decrypt(packed, rng).unwrap(),
        )
    }

    /// Threshold decryption in both orders, checked equal to CRT decryption.
    fn decrypt_both_ways(&self, packed: &PackedCiphertexts, rng: &mut ChaCha20Rng) -> Vec<u64> {
        let (design, auditor) = self.partials(packed, rng);
        let combined = combine(self.verification(), packed, &design, &auditor).unwrap();
        let swapped = combine(self.verification(), packed, &auditor, &design).unwrap();
        let crt = self.pair.private_key().decrypt_packed(packed).unwrap();
        assert_eq!(combined, crt);
        assert_eq!(swapped, crt);
        combined.to_vec()
    }
}

fn random_bins(rng: &mut ChaCha20Rng) -> Vec<u32> {
    (0..BIN_COUNT)
        .map(|_| rng.random_range(0..=MAX_BIN_VALUE as u32))
        .collect()
}

fn widen(bins: &[u32]) -> Vec<u64> {
    bins.iter().map(|&bin| u64::from(bin)).collect()
}

#[test]
fn combination_equals_crt_decryption_of_random_histograms() {
    let mut rng = ChaCha20Rng::seed_from_u64(1);
    for dealt in [&*SMALL, &*MEDIUM] {
        for _ in 0..3 {
            let bins = random_bins(&mut rng);
            let packed = dealt.encrypt(&bins, &mut rng);
            assert_eq!(dealt.decrypt_both_ways(&packed, &mut rng), widen(&bins));
        }
    }
}

#[test]
fn combination_equals_crt_decryption_of_accumulated_sums() {
    let mut rng = ChaCha20Rng::seed_from_u64(2);
    let dealt = &*SMALL;
    let mut accumulator = Accumulator::new(dealt.public());
    let mut expected = vec![0u64; BIN_COUNT];
    for _ in 0..6 {
        let bins = random_bins(&mut rng);
        accumulator
            .absorb(&dealt.encrypt(&bins, &mut rng), 1)
            .unwrap();
        for (sum, bin) in expected.iter_mut().zip(&bins) {
            *sum += u64::from(*bin);
        }
    }
    let sum = accumulator.sum().unwrap();
    assert_eq!(dealt.decrypt_both_ways(&sum, &mut rng), expected);
    // Merged sums (PublicKey::add_packed) decrypt the same way.
    let twice = dealt.public().add_packed(&sum, &sum).unwrap();
    let doubled: Vec<u64> = expected.iter().map(|bin| 2 * bin).collect();
    assert_eq!(dealt.decrypt_both_ways(&twice, &mut rng), doubled);
}

#[test]
fn production_size_combination_equals_crt_decryption() {
    let dealt = deal(KeySize::Bits2048, 14);
    let mut rng = ChaCha20Rng::seed_from_u64(3);
    let bins = random_bins(&mut rng);
    let packed = dealt.encrypt(&bins, &mut rng);
    assert_eq!(dealt.decrypt_both_ways(&packed, &mut rng), widen(&bins));
    let (design, _) = dealt.partials(&packed, &mut rng);
    // The documented sizes at 2048 bits (docs/crypto.md).
    assert_eq!(dealt.verification().to_bytes().len(), 1_575);
    assert_eq!(dealt.shares.auditor.to_bytes().len(), 2_105);
    assert_eq!(design.to_bytes().len(), 2_218);
}

#[test]
fn one_share_alone_does_not_decrypt() {
    let mut rng = ChaCha20Rng::seed_from_u64(4);
    let dealt = &*SMALL;
    let packed = dealt.encrypt(&random_bins(&mut rng), &mut rng);
    let n = dealt.public().n();
    let (design, auditor) = dealt.partials(&packed, &mut rng);
    // A partial is not of the form 1 + m n, so L of it is no plaintext at all.
    for partial in [&design, &auditor] {
        for power in &partial.powers {
            assert_ne!(Integer::from(&power.value % n), 1);
        }
    }
    // Combining one partial with nothing (the empty share, c^0 = 1) is refused.
    let unit = vec![
        ProvenPower {
            value: Integer::from(1),
            challenge: [0; CHALLENGE_BYTES],
            response: Integer::new(),
        };
        packed.ciphertexts.len()
    ];
    for partial in [&design, &auditor] {
        assert_eq!(
            combine_powers(dealt.public(), &partial.powers, &unit),
            Err(PaillierError::PartialsInconsistent { ciphertext: 0 })
        );
    }
}

#[test]
fn shares_are_integers_far_beyond_n_lambda() {
    // Shares drawn mod n lambda would lie below n^2 and bound n lambda; dealt shares lie 128
    // bits above n^2, and each dealing draws new ones.
    let mut rng = ChaCha20Rng::seed_from_u64(5);
    let dealt = &*SMALL;
    let size = dealt.public().size();
    let floor = Integer::from(dealt.public().nn() << 64u32);
    let mut seen = Vec::new();
    for _ in 0..3 {
        let shares = split(dealt.pair.private_key(), &mut rng).unwrap();
        for share in [&shares.design, &shares.auditor] {
            assert!(share.exponent > floor);
            assert!(share.exponent.significant_bits() <= share_bits(size));
            assert!(!seen.contains(&share.exponent));
            seen.push(share.exponent.clone());
        }
        assert!(shares.design.exponent.significant_bits() <= mask_bits(size));
    }
}

#[test]
fn two_partials_from_one_holder_are_refused() {
    let mut rng = ChaCha20Rng::seed_from_u64(6);
    let dealt = &*SMALL;
    let packed = dealt.encrypt(&random_bins(&mut rng), &mut rng);
    for share in [&dealt.shares.design, &dealt.shares.auditor] {
        let once = share.partial_decrypt(&packed, &mut rng).unwrap();
        let again = share.partial_decrypt(&packed, &mut rng).unwrap();
        assert_ne!(once, again, "fresh proof nonces");
        for second in [&once, &again] {
            assert_eq!(
                combine(dealt.verification(), &packed, &once, second),
                Err(PaillierError::SameHolder(share.holder()))
            );
        }
    }
}

#[test]
fn another_keys_sums_shares_and_partials_are_refused() {
    let mut rng = ChaCha20Rng::seed_from_u64(7);
    let (dealt, other) = (&*SMALL, &*OTHER);
    let mismatch = |result: Result<(), PaillierError>| {
        assert!(
            matches!(result, Err(PaillierError::KeyMismatch { .. })),
            "{result:?}"
        );
    };
    let share_bytes = dealt.shares.design.to_bytes();
    mismatch(KeyShare::from_bytes(other.public(), &share_bytes).map(drop));
    let verification_bytes = dealt.verification().to_bytes();
    mismatch(VerificationKey::from_bytes(other.public(), &verification_bytes).map(drop));
    let packed = dealt.encrypt(&random_bins(&mut rng), &mut rng);
    let other_packed = other.encrypt(&random_bins(&mut rng), &mut rng);
    mismatch(
        dealt
            .shares
            .design
            .partial_decrypt(&other_packed, &mut rng)
            .map(drop),
    );
    let (design, auditor) = dealt.partials(&packed, &mut rng);
    mismatch(PartialDecryption::from_bytes(other.public(), &design.to_bytes()).map(drop));
    let (_, other_auditor) = other.partials(&other_packed, &mut rng);
    mismatch(combine(dealt.verification(), &packed, &design, &other_auditor).map(drop));
    mismatch(combine(other.verification(), &packed, &design, &auditor).map(drop));
    mismatch(combine(dealt.verification(), &other_packed, &design, &auditor).map(drop));
}

#[test]
fn partials_of_another_sum_or_another_dealing_are_refused() {
    let mut rng = ChaCha20Rng::seed_from_u64(8);
    let dealt = &*SMALL;
    let packed = dealt.encrypt(&random_bins(&mut rng), &mut rng);
    let other_sum = dealt.encrypt(&random_bins(&mut rng), &mut rng);
    let (design, _) = dealt.partials(&packed, &mut rng);
    let (_, auditor_of_other_sum) = dealt.partials(&other_sum, &mut rng);
    assert_eq!(
        combine(
            dealt.verification(),
            &packed,
            &design,
            &auditor_of_other_sum
        ),
        Err(PaillierError::PartialProofInvalid {
            holder: Holder::Auditor,
            ciphertext: 0
        })
    );
    // A share of the same key from another dealing: its verification key is another.
    let redealt = split(dealt.pair.private_key(), &mut rng).unwrap();
    let foreign = redealt.auditor.partial_decrypt(&packed, &mut rng).unwrap();
    assert!(matches!(
        combine(dealt.verification(), &packed, &design, &foreign),
        Err(PaillierError::PartialProofInvalid { .. })
    ));
    // And a share file whose exponent is one dealing's and verification key another's.
    let mut mixed = dealt.shares.design.to_bytes();
    let numbers = 3 * dealt.public().size().ciphertext_bytes();
    let start = mixed.len() - numbers;
    mixed[start..].copy_from_slice(&redealt.design.to_bytes()[start..]);
    assert_eq!(
        KeyShare::from_bytes(dealt.public(), &mixed).map(drop),
        Err(PaillierError::InvalidShare(
            "key share does not match its verification key"
        ))
    );
}

/// Every prefix and some extensions of `bytes` are refused with a length error.
fn assert_exact_length<T: fmt::Debug>(
    bytes: &[u8],
    decode: impl Fn(&[u8]) -> Result<T, PaillierError>,
) {
    for len in 0..bytes.len() {
        assert!(
            matches!(decode(&bytes[..len]), Err(PaillierError::Length { .. })),
            "prefix of {len} bytes"
        );
    }
    for extra in [1usize, 2, 17, 512] {
        let mut longer = bytes.to_vec();
        longer.resize(bytes.len() + extra, 0);
        assert!(
            matches!(decode(&longer), Err(PaillierError::Length { .. })),
            "{extra} bytes more"
        );
    }
}

#[test]
fn encodings_round_trip_and_refuse_every_truncation_and_extension() {
    let mut rng = ChaCha20Rng::seed_from_u64(9);
    let dealt = &*SMALL;
    let public = dealt.public();
    for share in [&dealt.shares.design, &dealt.shares.auditor] {
        let bytes = share.to_bytes();
        let decoded = KeyShare::from_bytes(public, &bytes).unwrap();
        assert_eq!(decoded.holder(), share.holder());
        assert_eq!(decoded.exponent, share.exponent);
        assert_eq!(decoded.verification_key(), share.verification_key());
        assert_exact_length(&bytes, |b| KeyShare::from_bytes(public, b));
    }
    let bytes = dealt.verification().to_bytes();
    assert_eq!(
        &VerificationKey::from_bytes(public, &bytes).unwrap(),
        dealt.verification()
    );
    assert_exact_length(&bytes, |b| VerificationKey::from_bytes(public, b));
    let packed = dealt.encrypt(&random_bins(&mut rng), &mut rng);
    let (design, auditor) = dealt.partials(&packed, &mut rng);
    for partial in [&design, &auditor] {
        let bytes = partial.to_bytes();
        assert_eq!(
            bytes.len(),
            HEADER_BYTES + KEY_ID_BYTES + partial_body_bytes(public.size())
        );
        assert_eq!(
            &PartialDecryption::from_bytes(public, &bytes).unwrap(),
            partial
        );
        assert_exact_length(&bytes, |b| PartialDecryption::from_bytes(public, b));
    }
}

#[test]
fn malformed_share_numbers_tags_and_versions_are_refused() {
    let dealt = &*SMALL;
    let public = dealt.public();
    let bytes = dealt.shares.design.to_bytes();
    let start = HEADER_BYTES + KEY_ID_BYTES + 1;
    let end = start + share_bytes(public.size());
    let with = |edit: &dyn Fn(&mut Vec<u8>)| {
        let mut edited = bytes.clone();
        edit(&mut edited);
        KeyShare::from_bytes(public, &edited).map(drop)
    };
    let invalid = |reason| Err(PaillierError::InvalidShare(reason));
    assert_eq!(
        with(&|b| b[start..end].fill(0)),
        invalid("key share is zero")
    );
    assert_eq!(
        with(&|b| b[start] = 0xff),
        invalid("key share is larger than any dealt share")
    );
    assert_eq!(
        with(&|b| b[end - 1] ^= 1),
        invalid("key share does not match its verification key")
    );
    for holder in [0u8, 3, 0xff] {
        assert_eq!(with(&|b| b[start - 1] = holder), invalid("unknown holder"));
    }
    // The other holder's code with this exponent: it matches the other verification key not.
    assert_eq!(
        with(&|b| b[start - 1] = Holder::Auditor.code()),
        invalid("key share does not match its verification key")
    );
    assert_eq!(
        with(&|b| b[4] = 2),
        Err(PaillierError::UnsupportedVersion(2))
    );
    assert_eq!(
        VerificationKey::from_bytes(public, &bytes).map(drop),
        Err(PaillierError::InvalidKey(
            "not a threshold verification key (wrong file tag)"
        ))
    );
    assert_eq!(
        KeyShare::from_bytes(public, &public.to_bytes()).map(drop),
        Err(PaillierError::InvalidKey(
            "not a threshold key share (wrong file tag)"
        ))
    );
}

#[test]
fn malformed_verification_keys_and_partial_values_are_refused() {
    let mut rng = ChaCha20Rng::seed_from_u64(10);
    let dealt = &*SMALL;
    let public = dealt.public();
    let len = public.size().ciphertext_bytes();
    let vk = dealt.verification().to_bytes();
    let start = HEADER_BYTES + KEY_ID_BYTES;
    // v_auditor replaced by v_design: the parts no longer recombine.
    let mut swapped = vk.clone();
    swapped.copy_within(start + len..start + 2 * len, start + 2 * len);
    assert_eq!(
        VerificationKey::from_bytes(public, &swapped).map(drop),
        Err(PaillierError::InvalidShare(
            "verification key does not belong to a sharing of this key"
        ))
    );
    let packed = dealt.encrypt(&random_bins(&mut rng), &mut rng);
    let partial = dealt
        .shares
        .design
        .partial_decrypt(&packed, &mut rng)
        .unwrap()
        .to_bytes();
    let value_start = start + 1;
    let not_units = [Integer::new(), public.nn().clone(), public.n().clone()].map(|value| {
        let mut bytes = Vec::new();
        push_fixed(&mut bytes, &value, len);
        bytes
    });
    for replacement in not_units.iter().chain([&vec![0xffu8; len]]) {
        let mut edited = partial.clone();
        edited[value_start..value_start + len].copy_from_slice(replacement);
        assert_eq!(
            PartialDecryption::from_bytes(public, &edited).map(drop),
            Err(PaillierError::InvalidShare(
                "partial decryption value is not a unit below n^2"
            ))
        );
    }
}

#[test]
fn a_shifted_partial_passes_the_unit_check_but_not_its_proof() {
    let mut rng = ChaCha20Rng::seed_from_u64(11);
    let dealt = &*SMALL;
    let public = dealt.public();
    let bins = random_bins(&mut rng);
    let packed = dealt.encrypt(&bins, &mut rng);
    let (mut design, auditor) = dealt.partials(&packed, &mut rng);
    // c^(d_design) (1 + n): the product stays 1 mod n and the plaintext grows by 1.
    let shift = Integer::from(public.n() + 1u32);
    design.powers[0].value = Integer::from(&design.powers[0].value * &shift) % public.nn();
    let unproven = combine_powers(public, &design.powers, &auditor.powers).unwrap();
    let shifted = unpack(unproven, public.size()).unwrap();
    assert_eq!(shifted[0], u64::from(bins[0]) + 1);
    assert_eq!(
        combine(dealt.verification(), &packed, &design, &auditor),
        Err(PaillierError::PartialProofInvalid {
            holder: Holder::Design,
            ciphertext: 0
        })
    );
}

#[test]
fn a_negated_partial_can_pass_its_proof_but_not_the_combination_check() {
    // -1 has order 2: a holder who tries proofs until the challenge is even proves -c^(d_i)
    // as well as c^(d_i). Only the 1 mod n check stops it.
    let mut rng = ChaCha20Rng::seed_from_u64(12);
    let dealt = &*SMALL;
    let public = dealt.public();
    let packed = dealt.encrypt(&random_bins(&mut rng), &mut rng);
    let (mut design, auditor) = dealt.partials(&packed, &mut rng);
    let share = &dealt.shares.design;
    let negated = Integer::from(public.nn() - &design.powers[0].value);
    let statement = Statement {
        verification: share.verification_key(),
        holder: Holder::Design,
        ciphertext: &packed.ciphertexts[0].0,
        value: &negated,
    };
    let (challenge, response) = loop {
        let (challenge, response) = statement.prove(&share.exponent, &mut rng);
        if challenge[CHALLENGE_BYTES - 1] % 2 == 0 {
            break (challenge, response);
        }
    };
    assert!(statement.verify(&challenge, &response));
    design.powers[0] = ProvenPower {
        value: negated,
        challenge,
        response,
    };
    assert_eq!(
        combine(dealt.verification(), &packed, &design, &auditor),
        Err(PaillierError::PartialsInconsistent { ciphertext: 0 })
    );
}

#[test]
fn damaged_values_and_proofs_are_refused() {
    let mut rng = ChaCha20Rng::seed_from_u64(13);
    let dealt = &*SMALL;
    let public = dealt.public();
    let packed = dealt.encrypt(&random_bins(&mut rng), &mut rng);
    let (design, auditor) = dealt.partials(&packed, &mut rng);
    let bytes = auditor.to_bytes();
    let k = public.size().ciphertext_bytes();
    let second =
        HEADER_BYTES + KEY_ID_BYTES + 1 + k + CHALLENGE_BYTES + response_bytes(public.size());
    // A flipped bit in the first value, the first challenge, the first response, the second value.
    let first = HEADER_BYTES + KEY_ID_BYTES + 1;
    for (offset, ciphertext) in [
        (first + 5, 0),
        (first + k, 0),
        (first + k + CHALLENGE_BYTES + 3, 0),
        (second + 9, 1),
    ] {
        let mut damaged = bytes.clone();
        damaged[offset] ^= 0x10;
        let damaged = PartialDecryption::from_bytes(public, &damaged).unwrap();
        assert_eq!(
            combine(dealt.verification(), &packed, &design, &damaged),
            Err(PaillierError::PartialProofInvalid {
                holder: Holder::Auditor,
                ciphertext
            })
        );
    }
}
