//! Uniform big integers from a caller-supplied cryptographic RNG (so tests can seed it).

use rand::{CryptoRng, RngCore};
use rug::Integer;
use rug::integer::Order;

/// A uniform integer with exactly `bits` random bits (top bits may be zero).
pub(crate) fn random_bits<R: RngCore + CryptoRng + ?Sized>(rng: &mut R, bits: u32) -> Integer {
    let len = bits.div_ceil(8) as usize;
    let mut buf = vec![0u8; len];
    rng.fill_bytes(&mut buf);
    let excess = (len * 8) as u32 - bits;
    if let Some(first) = buf.first_mut() {
        *first &= 0xff >> excess;
    }
    Integer::from_digits(&buf, Order::Msf)
}

/// A uniform integer in [1, bound) coprime to `bound` (rejection sampling).
pub(crate) fn random_unit<R: RngCore + CryptoRng + ?Sized>(
    rng: &mut R,
    bound: &Integer,
) -> Integer {
    let bits = bound.significant_bits();
    loop {
        let x = random_bits(rng, bits);
        if x != 0 && &x < bound && Integer::from(x.gcd_ref(bound)) == 1 {
            return x;
        }
    }
}
