//! Feeds arbitrary bytes to the aggregator's ciphertext checks, which every report's payload
//! meets straight off the network, and sends whatever passes through the batch unit check and
//! the accumulator (the Montgomery kernels, IFMA where the CPU has it): nothing may panic,
//! what the deferred parse refuses the full one refuses too, and a sum of one accepted report
//! absorbed twice must be its ciphertexts squared, as plain arithmetic says.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use penrose_core::paillier::{Accumulator, KeySize, Keypair, PaillierError, PublicKey};
use rand::SeedableRng;
use rand_chacha::ChaCha20Rng;
use rug::Integer;
use rug::integer::Order;

/// One key for the whole run (a 2048-bit key takes seconds to make), and n^2.
fn key() -> &'static (PublicKey, Integer) {
    static KEY: OnceLock<(PublicKey, Integer)> = OnceLock::new();
    KEY.get_or_init(|| {
        let keys =
            Keypair::generate_with_size(KeySize::Bits2048, &mut ChaCha20Rng::seed_from_u64(1));
        let public = keys.public_key().clone();
        // The public key's encoding: 7 header bytes, then n (modulus_bytes, big-endian).
        let bytes = public.to_bytes();
        let n = Integer::from_digits(&bytes[7..7 + public.size().modulus_bytes()], Order::Msf);
        let nn = Integer::from(n.square_ref());
        (public, nn)
    })
}

fuzz_target!(|data: &[u8]| {
    let (public, nn) = key();
    let size = public.size();
    // Short inputs are stretched to a whole report by repetition, so that the fuzzer reaches
    // the arithmetic without having to find 1,024 bytes first; the raw input is tried too.
    let mut wire = data.to_vec();
    if !data.is_empty() && data.len() < size.packed_bytes() {
        wire = data
            .iter()
            .copied()
            .cycle()
            .take(size.packed_bytes())
            .collect();
    }
    let _ = public.validate_packed_deferring_units(data);
    let deferred = public.validate_packed_deferring_units(&wire);
    let full = public.validate_packed(&wire);
    let pending = match deferred {
        Ok(pending) => pending,
        Err(_) => {
            // The full check makes every check the deferred one does (and the gcd besides).
            assert!(full.is_err());
            return;
        }
    };
    let checked = public.check_units([&pending]);
    let Some(Ok(packed)) = checked.into_iter().next() else {
        assert!(matches!(full, Err(PaillierError::CiphertextNotUnit)));
        return;
    };
    let packed = packed.clone();
    assert_eq!(full.as_ref().ok(), Some(&packed));
    assert_eq!(packed.to_bytes(), wire);
    let mut acc = Accumulator::new(public);
    acc.absorb(&packed, 1)
        .expect("a checked report is absorbed");
    acc.absorb_bytes(&wire, 1)
        .expect("the same report from its bytes too");
    let sum = acc.sum().expect("units multiply to a unit");
    for (chunk, got) in wire
        .chunks_exact(size.ciphertext_bytes())
        .zip(sum.to_bytes().chunks_exact(size.ciphertext_bytes()))
    {
        let c = Integer::from_digits(chunk, Order::Msf);
        let want = Integer::from(c.square_ref()) % nn;
        assert_eq!(Integer::from_digits(got, Order::Msf), want);
    }
});
