//! Montgomery multiplication mod an odd modulus, on GMP's documented low-level (`mpn`)
//! functions: the aggregator's one multiplication per ciphertext.
//!
//! `a * b mod N` the plain way is a product and a division. Montgomery's reduction replaces
//! the division with one multiply-and-add row per limb (`mpn_addmul_1`), at the price of a
//! factor R^-1 in every product: `mul(a, b) = a b R^-1 mod N`.
//!
//! R is 2^(832 k), the smallest such power above 4N: a whole number of 64-bit limbs (13 k)
//! and of 52-bit digits (16 k), so that a kernel on 52-bit digits (AVX-512 IFMA) can use the
//! same R as GMP's 64-bit limbs, and a stored state means the same whichever kernel wrote it. The accumulator does not convert in and out of Montgomery
//! form per report; it lets the factors pile up and removes them once, when the sum is read:
//! after k reports its state is `S R^-k`, and `S = state * R^k mod N` (see
//! [`Montgomery::unscale`]). Because R is a unit mod N, a state is a unit exactly when its
//! sum is, so unit checks can run on states directly.
//!
//! This is the crate's only `unsafe`: calls into GMP through `gmp-mpfr-sys`, with lengths
//! fixed when the context is built.
#![allow(unsafe_code)]

use gmp_mpfr_sys::gmp;
use rug::Integer;
use rug::integer::Order;

/// One machine word of a number, least significant first: GMP's limb.
pub(crate) type Limb = gmp::limb_t;

const LIMB_BITS: u32 = Limb::BITS;

/// What multiplying mod one fixed odd modulus needs, computed once per key.
#[derive(Clone, Debug)]
pub(crate) struct Montgomery {
    modulus: Box<[Limb]>,
    /// -N^-1 mod 2^64: the multiplier that zeroes one low limb per reduction row.
    neg_inv: Limb,
    /// R mod N, raised to a power to undo that many multiplications' R^-1.
    r_mod: Integer,
    modulus_int: Integer,
}

/// Buffers one multiplication needs; kept by the caller so that the hot loop never allocates.
#[derive(Clone, Debug)]
pub(crate) struct Scratch {
    product: Vec<Limb>,
    carries: Vec<Limb>,
}

impl Montgomery {
    /// The context for `modulus`, or `None` if it is not odd and above 1 (Montgomery
    /// reduction needs N coprime to 2^64).
    pub(crate) fn new(modulus: &Integer) -> Option<Self> {
        if *modulus <= 1 || modulus.is_even() {
            return None;
        }
        let r_bits = r_bits_for(modulus.significant_bits());
        let mut limbs = vec![0; (r_bits / LIMB_BITS) as usize].into_boxed_slice();
        to_limbs(modulus, &mut limbs);
        // Newton's iteration for the inverse mod 2^64 of an odd number: each step doubles
        // the correct low bits, starting from 1 bit (x = 1 is its own inverse mod 2).
        let low = limbs[0];
        let mut inv: Limb = 1;
        for _ in 0..6 {
            inv = inv.wrapping_mul((2 as Limb).wrapping_sub(low.wrapping_mul(inv)));
        }
        debug_assert_eq!(low.wrapping_mul(inv), 1);
        let r_mod = Integer::from(Integer::u_pow_u(2, r_bits)) % modulus;
        Some(Self {
            modulus: limbs,
            neg_inv: inv.wrapping_neg(),
            r_mod,
            modulus_int: modulus.clone(),
        })
    }

    /// Limbs of R (the modulus zero-padded to it), and so of every operand and result.
    pub(crate) fn limbs(&self) -> usize {
        self.modulus.len()
    }

    /// Buffers for [`mul_assign`](Self::mul_assign).
    pub(crate) fn scratch(&self) -> Scratch {
        Scratch {
            product: vec![0; 2 * self.limbs()],
            carries: vec![0; self.limbs()],
        }
    }

    /// `acc = acc * x * R^-1 mod N`, fully reduced (`acc < N` afterwards).
    ///
    /// Needs `acc < N` and `x < R` (any L-limb value; a validated ciphertext is below N); both
    /// exactly [`limbs`](Self::limbs) long. Returns `false`, changing nothing, if a length is
    /// wrong, which only a caller's bug can cause.
    #[must_use]
    pub(crate) fn mul_assign(&self, acc: &mut [Limb], x: &[Limb], scratch: &mut Scratch) -> bool {
        let n = self.limbs();
        if acc.len() != n || x.len() != n || scratch.product.len() != 2 * n {
            return false;
        }
        scratch.carries.resize(n, 0);
        let size = n as gmp::size_t;
        let product = scratch.product.as_mut_ptr();
        // SAFETY: `product` holds 2n limbs and overlaps neither operand; `acc` and `x` hold n
        // limbs each (checked above), which is what mpn_mul_n reads and writes.
        unsafe { gmp::mpn_mul_n(product, acc.as_ptr(), x.as_ptr(), size) };
        // One row per low limb: adding u N at limb j, with u chosen so that limb j becomes
        // zero, divides by 2^64 once more without changing the residue. Each row's carry
        // lands at limb j + n, which no later row's u depends on, so the carries are added
        // together at the end (as GMP's own mpn_redc_1 does).
        for j in 0..n {
            let u = scratch.product[j].wrapping_mul(self.neg_inv);
            // SAFETY: the row writes limbs j..j+n of `product` (2n long, j < n), reads n
            // limbs of the modulus, and neither overlaps the other.
            scratch.carries[j] =
                unsafe { gmp::mpn_addmul_1(product.add(j), self.modulus.as_ptr(), size, u) };
        }
        // The result (< 2N) is the high half plus the carries.
        // SAFETY: `acc` (n limbs) is written from the high half of `product` (limbs n..2n)
        // and `carries` (n limbs); mpn_add_n allows neither source to overlap the result
        // except exactly, and here none does.
        let top = unsafe {
            gmp::mpn_add_n(
                acc.as_mut_ptr(),
                product.add(n).cast_const(),
                scratch.carries.as_ptr(),
                size,
            )
        };
        // SAFETY: both operands are n limbs long.
        let at_least_n =
            top != 0 || unsafe { gmp::mpn_cmp(acc.as_ptr(), self.modulus.as_ptr(), size) } >= 0;
        if at_least_n {
            // SAFETY: in place (result == first source, which mpn_sub_n allows), n limbs each;
            // a borrow out of the top limb cancels `top`.
            unsafe { gmp::mpn_sub_n(acc.as_mut_ptr(), acc.as_ptr(), self.modulus.as_ptr(), size) };
        }
        true
    }

    /// R^k mod N: what turns a state that went through `k` multiplications back into the
    /// plain product (`product = state * R^k mod N`).
    pub(crate) fn r_power(&self, k: u64) -> Integer {
        let mut factor = self.r_mod.clone();
        // A non-negative exponent never fails (only a negative one needs an inverse).
        if factor
            .pow_mod_mut(&Integer::from(k), &self.modulus_int)
            .is_err()
        {
            factor = Integer::from(1);
        }
        factor
    }

    /// `value * R^k mod N` (see [`r_power`](Self::r_power)).
    #[cfg(test)]
    pub(crate) fn unscale(&self, value: &Integer, k: u64) -> Integer {
        (self.r_power(k) * value) % &self.modulus_int
    }
}

/// Bits of R for a modulus of `bits` bits: the smallest multiple of 832 (13 limbs, 16
/// digits of 52 bits) at least `bits + 2` (R > 4N, which a 52-bit-digit kernel needs).
pub(crate) fn r_bits_for(bits: u32) -> u32 {
    (bits + 2).div_ceil(832) * 832
}

/// Copies `value` (below R) into `out` as exactly `out.len()` limbs, zero-padded.
pub(crate) fn to_limbs(value: &Integer, out: &mut [Limb]) {
    let limbs = value.as_limbs();
    let len = limbs.len().min(out.len());
    out[..len].copy_from_slice(&limbs[..len]);
    out[len..].fill(0);
}

/// The number `limbs` hold.
pub(crate) fn from_limbs(limbs: &[Limb]) -> Integer {
    Integer::from_digits(limbs, Order::Lsf)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha20Rng;

    use super::*;

    fn random_below(modulus: &Integer, rng: &mut ChaCha20Rng) -> Integer {
        let bytes: Vec<u8> = (0..modulus.significant_bits().div_ceil(8) + 8)
            .map(|_| rng.random())
            .collect();
        Integer::from_digits(&bytes, Order::Lsf) % modulus
    }

    fn modulus(bits: u32, rng: &mut ChaCha20Rng) -> Integer {
        let bytes: Vec<u8> = (0..bits / 8).map(|_| rng.random()).collect();
        let mut m = Integer::from_digits(&bytes, Order::Lsf);
        m.set_bit(bits - 1, true);
        m.set_bit(0, true);
        m
    }

    #[test]
    fn products_match_plain_modular_multiplication() {
        let mut rng = ChaCha20Rng::seed_from_u64(11);
        for bits in [128u32, 1024, 2048, 4096] {
            let n = modulus(bits, &mut rng);
            let m = Montgomery::new(&n).unwrap();
            let r_inv = Integer::from(m.r_mod.invert_ref(&n).unwrap());
            let mut scratch = m.scratch();
            let edges = [
                Integer::from(1),
                Integer::from(2),
                Integer::from(&n - 1),
                Integer::from(&n - 2),
            ];
            let mut values: Vec<Integer> = edges.to_vec();
            values.extend((0..20).map(|_| random_below(&n, &mut rng)));
            for a in &values {
                for b in values.iter().take(8) {
                    let mut acc = vec![0; m.limbs()];
                    let mut x = vec![0; m.limbs()];
                    to_limbs(a, &mut acc);
                    to_limbs(b, &mut x);
                    assert!(m.mul_assign(&mut acc, &x, &mut scratch));
                    let want = Integer::from(a * b) * &r_inv % &n;
                    assert_eq!(from_limbs(&acc), want, "{bits} bits");
                    assert!(from_limbs(&acc) < n);
                }
            }
        }
    }

    #[test]
    fn unscale_undoes_a_chain_of_products() {
        let mut rng = ChaCha20Rng::seed_from_u64(12);
        let n = modulus(2048, &mut rng);
        let m = Montgomery::new(&n).unwrap();
        let mut scratch = m.scratch();
        let mut acc = vec![0; m.limbs()];
        to_limbs(&Integer::from(1), &mut acc);
        let mut plain = Integer::from(1);
        let mut x = vec![0; m.limbs()];
        for k in 1..=300u64 {
            let c = random_below(&n, &mut rng);
            to_limbs(&c, &mut x);
            assert!(m.mul_assign(&mut acc, &x, &mut scratch));
            plain = plain * &c % &n;
            if k % 50 == 0 || k < 3 {
                assert_eq!(m.unscale(&from_limbs(&acc), k), plain, "after {k}");
            }
        }
        assert_eq!(m.unscale(&Integer::from(5), 0), 5);
    }

    #[test]
    fn r_is_a_whole_number_of_limbs_and_of_52_bit_digits_above_4n() {
        for (bits, want) in [
            (1024, 1664),
            (2048, 2496),
            (4095, 4160),
            (4096, 4160),
            (4159, 4992),
        ] {
            let r = r_bits_for(bits);
            assert_eq!(r, want, "{bits} bits");
            assert_eq!(r % 64, 0);
            assert_eq!(r % 52, 0);
            assert!(r >= bits + 2);
        }
    }

    #[test]
    fn refuses_even_moduli_and_wrong_lengths() {
        assert!(Montgomery::new(&Integer::from(1_000_000)).is_none());
        assert!(Montgomery::new(&Integer::from(1)).is_none());
        assert!(Montgomery::new(&Integer::from(0)).is_none());
        let m = Montgomery::new(&(Integer::from(Integer::u_pow_u(2, 200)) + 1)).unwrap();
        let mut scratch = m.scratch();
        let mut acc = vec![1; m.limbs() - 1];
        let before = acc.clone();
        assert!(!m.mul_assign(&mut acc, &vec![1; m.limbs()], &mut scratch));
        assert_eq!(acc, before);
    }
}
