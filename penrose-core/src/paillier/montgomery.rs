//! Montgomery multiplication mod an odd modulus, on GMP's documented low-level (`mpn`)
//! functions: the aggregator's one multiplication per ciphertext.
//!
//! `a * b mod N` the plain way is a product and a division. Montgomery's reduction replaces
//! the division with one multiply-and-add row per limb (`mpn_addmul_1`), at the price of a
//! factor R^-1 in every product: `mul(a, b) = a b R^-1 mod N`.
//!
//! R is 2^(832 k), the smallest such power above 4N: a whole number of 64-bit limbs (13 k)
//! and of 52-bit digits (16 k), so that a kernel on 52-bit digits (AVX-512 IFMA) can use the
//! same R as GMP's 64-bit limbs, and a stored state means the same whichever kernel wrote it.
//!
//! The accumulator does not convert in and out of Montgomery form per report; it lets the
//! factors pile up and removes them once, when the sum is read: after k reports its state is
//! `S R^-k`, and `S = state * R^k mod N` (see [`Montgomery::r_power`]). Because R is a unit
//! mod N, a state is a unit exactly when its sum is, so unit checks can run on states
//! directly.
//!
//! Two kernels compute the same function, limb for limb:
//!
//! - GMP (`mpn_mul_n` and one `mpn_addmul_1` row per limb), everywhere;
//! - AVX-512 IFMA (module `ifma`, C in `csrc/mont_ifma.c`), used when the build compiled it
//!   (x86-64) and the CPU has `avx512f` and `avx512ifma`: for a 4096-bit N about 1.0 us per
//!   multiplication against GMP's 4.9 us on a Sapphire Rapids core (the ignored test
//!   `montgomery_4096_timing` measures both).
//!
//! [`Montgomery::new`] picks IFMA when it can. The environment variable
//! `PENROSE_MONTGOMERY=gmp` forces the GMP kernel (for A/B benchmarks on one machine, or to
//! rule the IFMA kernel out); it is read when a context is built (that is, when a key is
//! loaded), and any other value, or none, means the automatic choice.
//!
//! This module and `ifma` hold the crate's only `unsafe`: calls into GMP through
//! `gmp-mpfr-sys` and into the IFMA kernel, with lengths checked before each call.
#![allow(unsafe_code)]

mod ifma;

use std::ffi::OsStr;

use gmp_mpfr_sys::gmp;
use rug::Integer;
use rug::integer::Order;

use ifma::IfmaKernel;

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
    /// The IFMA kernel, when this context uses it; otherwise the GMP path runs.
    ifma: Option<IfmaKernel>,
}

/// Which kernel a context should use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kernel {
    /// IFMA where the build and the CPU have it, else GMP.
    Auto,
    /// GMP always.
    Gmp,
}

impl Kernel {
    /// The environment variable that can force the GMP kernel (module docs).
    const ENV: &'static str = "PENROSE_MONTGOMERY";

    /// The choice `PENROSE_MONTGOMERY` asks for.
    fn from_env() -> Self {
        Self::parse(std::env::var_os(Self::ENV).as_deref())
    }

    /// `gmp` (any case, surrounding spaces ignored) forces GMP; anything else is automatic.
    fn parse(value: Option<&OsStr>) -> Self {
        match value.and_then(OsStr::to_str) {
            Some(v) if v.trim().eq_ignore_ascii_case("gmp") => Self::Gmp,
            _ => Self::Auto,
        }
    }
}

/// Buffers one multiplication needs; kept by the caller so that the hot loop never allocates.
#[derive(Clone, Debug)]
pub(crate) struct Scratch {
    product: Vec<Limb>,
    carries: Vec<Limb>,
}

impl Montgomery {
    /// The context for `modulus`, or `None` if it is not odd and above 1 (Montgomery
    /// reduction needs N coprime to 2^64). Uses the IFMA kernel where it can, unless
    /// `PENROSE_MONTGOMERY=gmp` (module docs).
    pub(crate) fn new(modulus: &Integer) -> Option<Self> {
        Self::with_kernel(modulus, Kernel::from_env())
    }

    /// [`new`](Self::new) with the kernel chosen by the caller instead of the environment.
    pub(crate) fn with_kernel(modulus: &Integer, kernel: Kernel) -> Option<Self> {
        if *modulus <= 1 || modulus.is_even() {
            return None;
        }
        let r_bits = r_bits_for(modulus.significant_bits());
        let mut limbs = vec![0; (r_bits / LIMB_BITS) as usize].into_boxed_slice();
        to_limbs(modulus, &mut limbs);
        let r_mod = Integer::from(Integer::u_pow_u(2, r_bits)) % modulus;
        let ifma = match kernel {
            Kernel::Auto => IfmaKernel::new(&limbs),
            Kernel::Gmp => None,
        };
        Some(Self {
            neg_inv: neg_inverse(limbs[0]),
            modulus: limbs,
            r_mod,
            modulus_int: modulus.clone(),
            ifma,
        })
    }

    /// The kernel [`mul_assign`](Self::mul_assign) runs: `"ifma"` or `"gmp"`. (Only the tests
    /// and the timing test ask, so far.)
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) fn kernel_name(&self) -> &'static str {
        if self.ifma.is_some() { "ifma" } else { "gmp" }
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

    /// `acc = acc * x * R^-1 mod N`, fully reduced (`acc < N` afterwards), on whichever
    /// kernel this context uses (both give the same limbs).
    ///
    /// Needs `acc < N` and `x < R` (any L-limb value; a validated ciphertext is below N); both
    /// exactly [`limbs`](Self::limbs) long. Returns `false`, changing nothing, if a length is
    /// wrong, which only a caller's bug can cause.
    #[must_use]
    pub(crate) fn mul_assign(&self, acc: &mut [Limb], x: &[Limb], scratch: &mut Scratch) -> bool {
        let n = self.limbs();
        if acc.len() != n
            || x.len() != n
            || scratch.product.len() != 2 * n
            || scratch.carries.len() != n
        {
            return false;
        }
        if let Some(kernel) = &self.ifma {
            return kernel.mul_assign(acc, x);
        }
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

/// -N^-1 mod 2^64 for an odd `low` (N's lowest limb): the multiplier that zeroes one low limb
/// per reduction row (its low 52 bits do the same for one 52-bit digit).
fn neg_inverse(low: Limb) -> Limb {
    // Newton's iteration for the inverse mod 2^64 of an odd number: each step doubles the
    // correct low bits, starting from 1 bit (x = 1 is its own inverse mod 2).
    let mut inv: Limb = 1;
    for _ in 0..6 {
        inv = inv.wrapping_mul((2 as Limb).wrapping_sub(low.wrapping_mul(inv)));
    }
    debug_assert_eq!(low.wrapping_mul(inv), 1);
    inv.wrapping_neg()
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

/// Appends the number `limbs` hold (least significant limb first) as exactly `len`
/// big-endian bytes, as [`push_fixed`](super::keys::push_fixed) does for an `Integer`, without
/// building one: the aggregator writes every touched accumulator's state after each batch.
/// The number must fit `len` bytes; limbs beyond them must be zero.
pub(crate) fn push_limbs_be(out: &mut Vec<u8>, limbs: &[Limb], len: usize) {
    let start = out.len();
    out.resize(start + len, 0);
    let field = &mut out[start..];
    let little_endian = limbs.iter().flat_map(|limb| limb.to_le_bytes());
    for (byte, slot) in little_endian.zip(field.iter_mut().rev()) {
        *slot = byte;
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha20Rng;

    use super::*;

    #[test]
    fn limbs_are_written_big_endian_like_an_integer() {
        let mut rng = ChaCha20Rng::seed_from_u64(17);
        for (count, len) in [
            (0usize, 0usize),
            (1, 8),
            (1, 3),
            (3, 24),
            (3, 20),
            (64, 512),
            (66, 512),
        ] {
            for _ in 0..8 {
                let mut limbs: Vec<Limb> = (0..count).map(|_| rng.random()).collect();
                // Zero what does not fit `len` bytes, as a state below n^2 has.
                let bits = len * 8;
                for (i, limb) in limbs.iter_mut().enumerate() {
                    let low = i * Limb::BITS as usize;
                    if low >= bits {
                        *limb = 0;
                    } else if bits - low < Limb::BITS as usize {
                        *limb &= (1 << (bits - low)) - 1;
                    }
                }
                let mut want = vec![9u8];
                crate::paillier::keys::push_fixed(&mut want, &from_limbs(&limbs), len);
                let mut got = vec![9u8];
                push_limbs_be(&mut got, &limbs, len);
                assert_eq!(got, want, "{count} limbs in {len} bytes");
            }
        }
    }

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
        for (bits, kernel) in [128u32, 1024, 2048, 4096]
            .into_iter()
            .flat_map(|bits| [(bits, Kernel::Auto), (bits, Kernel::Gmp)])
        {
            let n = modulus(bits, &mut rng);
            let m = Montgomery::with_kernel(&n, kernel).unwrap();
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
                    assert_eq!(from_limbs(&acc), want, "{bits} bits, {}", m.kernel_name());
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
    fn only_gmp_in_the_environment_forces_gmp() {
        for (value, want) in [
            (None, Kernel::Auto),
            (Some("gmp"), Kernel::Gmp),
            (Some(" GMP\n"), Kernel::Gmp),
            (Some("ifma"), Kernel::Auto),
            (Some(""), Kernel::Auto),
            (Some("gmpx"), Kernel::Auto),
        ] {
            assert_eq!(Kernel::parse(value.map(OsStr::new)), want, "{value:?}");
        }
    }

    #[test]
    fn neg_inverse_inverts_odd_limbs() {
        let mut rng = ChaCha20Rng::seed_from_u64(13);
        for low in [1, 3, Limb::MAX]
            .into_iter()
            .chain((0..100).map(|_| rng.random::<Limb>() | 1))
        {
            assert_eq!(low.wrapping_mul(neg_inverse(low)), Limb::MAX, "{low:x}");
        }
    }

    #[test]
    fn refuses_even_moduli_and_wrong_lengths() {
        assert!(Montgomery::new(&Integer::from(1_000_000)).is_none());
        assert!(Montgomery::new(&Integer::from(1)).is_none());
        assert!(Montgomery::new(&Integer::from(0)).is_none());
        for kernel in [Kernel::Auto, Kernel::Gmp] {
            let modulus = Integer::from(Integer::u_pow_u(2, 200)) + 1;
            let m = Montgomery::with_kernel(&modulus, kernel).unwrap();
            let mut scratch = m.scratch();
            let mut acc = vec![1; m.limbs() - 1];
            let before = acc.clone();
            assert!(!m.mul_assign(&mut acc, &vec![1; m.limbs()], &mut scratch));
            assert_eq!(acc, before);
        }
    }
}
