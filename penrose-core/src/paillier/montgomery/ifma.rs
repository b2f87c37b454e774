//! The AVX-512 IFMA kernel behind [`Montgomery`](super::Montgomery): the same function as the
//! GMP path, `acc = acc * x * R^-1 mod N` fully reduced, computed on 52-bit digits with
//! `vpmadd52luq`/`vpmadd52huq` in C (`csrc/mont_ifma.c`, which documents the algorithm and the
//! bound that keeps its lazy carries from overflowing).
//!
//! R is a whole number of 52-bit digits as well as of 64-bit limbs (see `r_bits_for`), so
//! both kernels compute the same number and give identical limbs; the tests below check that.
//! The C entry point takes and returns 64-bit limbs and converts to digits and back itself.
//!
//! The kernel exists only when the build script compiled the C file (`cfg(penrose_ifma)`,
//! x86-64), and [`IfmaKernel::new`] only succeeds on a CPU with `avx512f` and `avx512ifma`
//! (detected at run time), so holding an `IfmaKernel` proves the instructions are there.
//!
//! `unsafe` here is the FFI call only; the intrinsics live in C.
#![allow(unsafe_code)]

use super::{LIMB_BITS, Limb, neg_inverse};

/// Bits of one digit (one 64-bit lane of the C kernel).
const DIGIT_BITS: u32 = 52;
const DIGIT_MASK: u64 = (1 << DIGIT_BITS) - 1;
/// The C kernel's block: 16 digits are 13 limbs (832 bits); sizes are whole blocks.
const BLOCK_BITS: usize = 832;
/// The largest size the C kernel takes (PENROSE_IFMA_MAX_DIGITS in csrc/mont_ifma.c): R up to
/// 2^13312, moduli up to 13310 bits. Larger ones use GMP.
const MAX_DIGITS: usize = 256;

#[cfg(penrose_ifma)]
const _: () = assert!(LIMB_BITS == 64, "the C kernel takes 64-bit limbs");

#[cfg(penrose_ifma)]
mod ffi {
    unsafe extern "C" {
        /// `acc = acc * x * R^-1 mod N`, R = 2^(52 digits). Reads `13 digits / 16` limbs from
        /// `acc` and `x` and `digits` digits from `modulus`, writes `13 digits / 16` limbs to
        /// `acc` (which may equal `x`). Returns 0, or -1 (nothing written) for an unsupported
        /// `digits`. Executes AVX-512F and AVX-512 IFMA instructions.
        pub(super) fn penrose_mont_mul_ifma(
            acc: *mut u64,
            x: *const u64,
            modulus: *const u64,
            k0: u64,
            digits: usize,
        ) -> core::ffi::c_int;
    }
}

/// Whether this build has the kernel and this CPU can run it.
fn available() -> bool {
    #[cfg(penrose_ifma)]
    {
        std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512ifma")
    }
    #[cfg(not(penrose_ifma))]
    {
        false
    }
}

/// Digit `j` (bits 52 j .. 52 j + 51) of the number `limbs` hold; 0 past its end.
fn digit(limbs: &[Limb], j: usize) -> u64 {
    let bit = j * DIGIT_BITS as usize;
    let (q, s) = (bit / LIMB_BITS as usize, bit % LIMB_BITS as usize);
    let low = limbs.get(q).map_or(0, |&l| l >> s);
    let high = match limbs.get(q + 1) {
        Some(&l) if s + DIGIT_BITS as usize > LIMB_BITS as usize => l << (LIMB_BITS as usize - s),
        _ => 0,
    };
    (low | high) & DIGIT_MASK
}

/// The modulus in the C kernel's form, for one modulus; only exists where the kernel runs.
#[derive(Clone, Debug)]
#[cfg_attr(not(penrose_ifma), allow(dead_code))]
pub(super) struct IfmaKernel {
    /// N as digits of 52 bits, as many as R has.
    modulus_digits: Box<[u64]>,
    /// -N^-1 mod 2^52.
    k0: u64,
    /// Limbs of every operand (R's limbs).
    limbs: usize,
}

impl IfmaKernel {
    /// The kernel for the modulus `modulus` (zero-padded to R's limbs, as
    /// [`Montgomery`](super::Montgomery) keeps it), or `None` when this build or this CPU has
    /// no IFMA kernel, or the size is one it does not take: R must be a whole number of
    /// 832-bit blocks, at most `MAX_DIGITS` digits, and N odd with 4N < R.
    pub(super) fn new(modulus: &[Limb]) -> Option<Self> {
        if !available() {
            return None;
        }
        let limbs = modulus.len();
        let bits = limbs * LIMB_BITS as usize;
        let digits = bits / DIGIT_BITS as usize;
        let top = *modulus.last()?;
        if !bits.is_multiple_of(BLOCK_BITS)
            || digits > MAX_DIGITS
            || modulus[0] & 1 == 0
            || top >> 62 != 0
        {
            return None;
        }
        Some(Self {
            modulus_digits: (0..digits).map(|j| digit(modulus, j)).collect(),
            k0: neg_inverse(modulus[0]) & DIGIT_MASK,
            limbs,
        })
    }

    /// `acc = acc * x * R^-1 mod N`, fully reduced, exactly like the GMP path: needs `acc < N`
    /// and `x < R`, both [`limbs`](super::Montgomery::limbs) long. Returns `false`, changing
    /// nothing, if a length is wrong.
    #[must_use]
    pub(super) fn mul_assign(&self, acc: &mut [Limb], x: &[Limb]) -> bool {
        if acc.len() != self.limbs || x.len() != self.limbs {
            return false;
        }
        #[cfg(penrose_ifma)]
        {
            // SAFETY: `new` only builds an IfmaKernel after detecting avx512f and avx512ifma on
            // this CPU, so the C code's instructions exist. `modulus_digits` holds `digits`
            // digits, where digits = 64 limbs / 52 is a multiple of 16 (`new` checked 832 | 64
            // limbs) and at most MAX_DIGITS, so the C side reads `digits` digits from it and
            // 13 digits / 16 = limbs limbs from `acc` and `x`, and writes `limbs` limbs to
            // `acc`: exactly their lengths, checked above. `acc` is a unique borrow, so
            // nothing else reads or writes it meanwhile; the C side keeps no pointer.
            let status = unsafe {
                ffi::penrose_mont_mul_ifma(
                    acc.as_mut_ptr(),
                    x.as_ptr(),
                    self.modulus_digits.as_ptr(),
                    self.k0,
                    self.modulus_digits.len(),
                )
            };
            status == 0
        }
        #[cfg(not(penrose_ifma))]
        {
            false
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use std::time::Instant;

    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha20Rng;
    use rug::Integer;
    use rug::integer::Order;

    use super::super::{Kernel, Montgomery, from_limbs, r_bits_for, to_limbs};
    use super::*;

    fn random_bits(bits: u32, rng: &mut ChaCha20Rng) -> Integer {
        let bytes: Vec<u8> = (0..bits.div_ceil(8)).map(|_| rng.random()).collect();
        Integer::from_digits(&bytes, Order::Lsf).keep_bits(bits)
    }

    fn random_below(bound: &Integer, rng: &mut ChaCha20Rng) -> Integer {
        random_bits(bound.significant_bits() + 64, rng) % bound
    }

    /// Odd, exactly `bits` bits.
    fn modulus(bits: u32, rng: &mut ChaCha20Rng) -> Integer {
        let mut m = random_bits(bits, rng);
        m.set_bit(bits - 1, true);
        m.set_bit(0, true);
        m
    }

    fn prime(bits: u32, rng: &mut ChaCha20Rng) -> Integer {
        let mut p = modulus(bits, rng);
        p.set_bit(bits - 2, true); // so that p q has 2 bits - 1 or 2 bits bits, as keygen's
        p.next_prime()
    }

    /// The moduli the tests run on: random ones of the sizes the crate uses (n^2 of 512,
    /// 1024 and 2048-bit keys, and n), Paillier-shaped n and n^2, and the extremes.
    fn moduli(rng: &mut ChaCha20Rng) -> Vec<(String, Integer)> {
        let mut out = Vec::new();
        for bits in [1024, 2048, 4095, 4096] {
            out.push((format!("random {bits}-bit"), modulus(bits, rng)));
        }
        for half in [512, 1024] {
            let n = prime(half, rng) * prime(half, rng);
            let nn = Integer::from(n.square_ref());
            out.push((format!("n = pq, {} bits", n.significant_bits()), n));
            out.push((format!("n^2, {} bits", nn.significant_bits()), nn));
        }
        let two = |e: u32| Integer::from(Integer::u_pow_u(2, e));
        out.push(("2^4096 - 1 (every digit full)".into(), two(4096) - 1));
        out.push(("2^4095 + 1".into(), two(4095) + 1));
        out.push(("2^4094 - 1 (two bits below R/4)".into(), two(4094) - 1));
        out
    }

    /// The reference: a b R^-1 mod N from rug.
    struct Reference {
        n: Integer,
        r_inv: Integer,
        r: Integer,
    }

    impl Reference {
        fn new(n: &Integer) -> Self {
            let r = Integer::from(Integer::u_pow_u(2, r_bits_for(n.significant_bits())));
            let r_inv = Integer::from(r.invert_ref(n).unwrap());
            Self {
                n: n.clone(),
                r_inv,
                r,
            }
        }

        fn product(&self, a: &Integer, b: &Integer) -> Integer {
            Integer::from(a * b) * &self.r_inv % &self.n
        }
    }

    /// The IFMA kernel for `gmp`'s modulus, or `None` after saying why only GMP is tested.
    fn ifma_for(gmp: &Montgomery, what: &str) -> Option<IfmaKernel> {
        assert_eq!(gmp.kernel_name(), "gmp");
        let kernel = IfmaKernel::new(&gmp.modulus);
        if kernel.is_none() {
            println!(
                "IFMA kernel unavailable (cfg(penrose_ifma) {}, avx512f+avx512ifma {}): {what}: \
                 testing the GMP path only",
                cfg!(penrose_ifma),
                available()
            );
        }
        kernel
    }

    /// Multiplies `a` by `b` with GMP, checks it against rug and, when present, IFMA against
    /// GMP limb for limb.
    fn check(
        gmp: &Montgomery,
        ifma: Option<&IfmaKernel>,
        reference: &Reference,
        a: &Integer,
        b: &Integer,
        what: &str,
    ) {
        let mut scratch = gmp.scratch();
        let (mut acc, mut x) = (vec![0; gmp.limbs()], vec![0; gmp.limbs()]);
        to_limbs(a, &mut acc);
        to_limbs(b, &mut x);
        let mut acc_ifma = acc.clone();
        assert!(gmp.mul_assign(&mut acc, &x, &mut scratch));
        assert_eq!(
            from_limbs(&acc),
            reference.product(a, b),
            "GMP wrong: {what}, a = {a:x}, b = {b:x}"
        );
        if let Some(kernel) = ifma {
            assert!(kernel.mul_assign(&mut acc_ifma, &x));
            assert_eq!(
                acc_ifma, acc,
                "IFMA differs from GMP: {what}, a = {a:x}, b = {b:x}"
            );
        }
    }

    /// Values of `acc` (below N) and of `x` (below R) where carries and the final
    /// subtraction are most likely to go wrong.
    fn edges(n: &Integer, r: &Integer) -> (Vec<Integer>, Vec<Integer>) {
        let one = Integer::from(1u32);
        // The largest 2^(52 k) - 1 below N: every digit of it at its maximum.
        let mut full = Integer::new();
        let mut k = 1;
        while Integer::from(Integer::u_pow_u(2, 52 * k)) - 1u32 < *n {
            full = Integer::from(Integer::u_pow_u(2, 52 * k)) - 1u32;
            k += 1;
        }
        // The largest number below N whose lowest digit is full (2^52 - 1).
        let low_full = Integer::from(n >> 52u32) << 52u32;
        let mut below_n = vec![
            Integer::new(),
            one.clone(),
            Integer::from(2u32),
            Integer::from(n - 1u32),
            Integer::from(n - 2u32),
            full.clone(),
            Integer::from(&full >> 1u32),
            Integer::from(&low_full - 1u32),
            Integer::from(n >> 1u32),
            n - (one << 52u32),
        ];
        let mut below_r = below_n.clone();
        let r_mod = Integer::from(r % n);
        below_r.extend([
            n.clone(),
            Integer::from(n + 1u32),
            Integer::from(r - 1u32),
            Integer::from(r - n),
            Integer::from(r >> 1u32),
            // x = R mod N makes the result acc itself: results N - 1, all digits full, 0, ...
            r_mod.clone(),
            Integer::from(r_mod.square_ref()) % n,
        ]);
        // For N = n^2, n times n: the AMM output is exactly N, reduced to 0.
        if n.is_perfect_square() {
            let root = Integer::from(n.sqrt_ref());
            below_r.push(Integer::from(&root * 3u32));
            below_n.push(root.clone());
            below_r.push(root);
        }
        (below_n, below_r)
    }

    #[test]
    fn ifma_matches_gmp_on_edges_and_random_pairs() {
        let mut rng = ChaCha20Rng::seed_from_u64(52);
        for (what, n) in moduli(&mut rng) {
            let gmp = Montgomery::with_kernel(&n, Kernel::Gmp).unwrap();
            let ifma = ifma_for(&gmp, &what);
            let reference = Reference::new(&n);
            let (below_n, below_r) = edges(&n, &reference.r);
            for a in &below_n {
                for b in &below_r {
                    check(&gmp, ifma.as_ref(), &reference, a, b, &what);
                }
            }
            for i in 0..400 {
                let a = random_below(&n, &mut rng);
                // Mostly below N like a ciphertext, sometimes anywhere below R.
                let b = if i % 4 == 0 {
                    random_below(&reference.r, &mut rng)
                } else {
                    random_below(&n, &mut rng)
                };
                check(&gmp, ifma.as_ref(), &reference, &a, &b, &what);
            }
        }
    }

    #[test]
    fn ifma_matches_gmp_over_a_chain_of_10000_products() {
        let mut rng = ChaCha20Rng::seed_from_u64(53);
        for (what, n) in moduli(&mut rng) {
            let gmp = Montgomery::with_kernel(&n, Kernel::Gmp).unwrap();
            let ifma = ifma_for(&gmp, &what);
            let mut scratch = gmp.scratch();
            let limbs = gmp.limbs();
            // Like the accumulator: start at 1, multiply by ciphertext after ciphertext.
            let mut acc_gmp = vec![0; limbs];
            acc_gmp[0] = 1;
            let mut acc_ifma = acc_gmp.clone();
            let mut plain = Integer::from(1);
            let mut x = vec![0; limbs];
            let steps = 10_000u64;
            for step in 1..=steps {
                let c = random_below(&n, &mut rng);
                to_limbs(&c, &mut x);
                plain = plain * &c % &n;
                assert!(gmp.mul_assign(&mut acc_gmp, &x, &mut scratch));
                if let Some(kernel) = &ifma {
                    assert!(kernel.mul_assign(&mut acc_ifma, &x));
                    if step % 1000 == 0 {
                        assert_eq!(acc_ifma, acc_gmp, "{what}: after {step}");
                    }
                }
            }
            assert_eq!(gmp.unscale(&from_limbs(&acc_gmp), steps), plain, "{what}");
            if ifma.is_some() {
                assert_eq!(acc_ifma, acc_gmp, "{what}: at the end");
            }
        }
    }

    #[test]
    fn sizes_outside_the_unrolled_ones_match_too() {
        // 16, 96 and 256 digits take the C kernel's generic loop; 272 digits are beyond it.
        let mut rng = ChaCha20Rng::seed_from_u64(54);
        for bits in [128u32, 830, 4159, 6000, 13310] {
            let n = modulus(bits, &mut rng);
            let what = format!("random {bits}-bit");
            let gmp = Montgomery::with_kernel(&n, Kernel::Gmp).unwrap();
            let ifma = ifma_for(&gmp, &what);
            let reference = Reference::new(&n);
            let (below_n, below_r) = edges(&n, &reference.r);
            for a in below_n.iter().take(6) {
                for b in &below_r {
                    check(&gmp, ifma.as_ref(), &reference, a, b, &what);
                }
            }
            for _ in 0..50 {
                let (a, b) = (random_below(&n, &mut rng), random_below(&n, &mut rng));
                check(&gmp, ifma.as_ref(), &reference, &a, &b, &what);
            }
        }
        let too_big = modulus(13311, &mut rng);
        let auto = Montgomery::with_kernel(&too_big, Kernel::Auto).unwrap();
        assert_eq!(
            auto.kernel_name(),
            "gmp",
            "272 digits are beyond the C kernel"
        );
    }

    #[test]
    fn the_automatic_choice_is_ifma_exactly_when_available() {
        let mut rng = ChaCha20Rng::seed_from_u64(55);
        let n = modulus(4096, &mut rng);
        let auto = Montgomery::with_kernel(&n, Kernel::Auto).unwrap();
        let want = if available() { "ifma" } else { "gmp" };
        if !available() {
            println!("IFMA kernel unavailable on this build or CPU: the automatic choice is GMP");
        }
        assert_eq!(auto.kernel_name(), want);
        assert_eq!(
            Montgomery::with_kernel(&n, Kernel::Gmp)
                .unwrap()
                .kernel_name(),
            "gmp"
        );
    }

    #[test]
    fn refuses_what_the_c_kernel_does_not_take() {
        // Even, top bits of R not clear (4N >= R), and not whole 832-bit blocks.
        let mut limbs = vec![0; 13];
        limbs[0] = 2;
        assert!(IfmaKernel::new(&limbs).is_none());
        limbs[0] = 3;
        limbs[12] = 1 << 62;
        assert!(IfmaKernel::new(&limbs).is_none());
        assert!(IfmaKernel::new(&[3; 12]).is_none());
        assert!(IfmaKernel::new(&[]).is_none());
        limbs[12] = 1 << 61;
        let Some(kernel) = IfmaKernel::new(&limbs) else {
            println!("IFMA kernel unavailable on this build or CPU: nothing more to check");
            return;
        };
        let mut short = vec![1; 12];
        assert!(!kernel.mul_assign(&mut short, &[1; 13]));
        assert_eq!(short, vec![1; 12]);
        let mut acc = vec![1; 13];
        assert!(!kernel.mul_assign(&mut acc, &[1; 14]));
        assert_eq!(acc, vec![1; 13]);
    }

    #[test]
    fn digits_split_limbs_at_every_52nd_bit() {
        let limbs = [u64::MAX, 0, 0x0123_4567_89ab_cdef];
        assert_eq!(digit(&limbs, 0), DIGIT_MASK);
        assert_eq!(digit(&limbs, 1), 0xfff); // bits 52..63 set, 64..103 clear
        assert_eq!(digit(&limbs, 2), 0x89ab_cdef << 24 & DIGIT_MASK); // bits 104..155
        assert_eq!(digit(&limbs, 3), 0x1234_5678); // bits 156..191, then past the end
        assert_eq!(digit(&limbs, 4), 0);
        let mut rng = ChaCha20Rng::seed_from_u64(56);
        let value = random_bits(4160, &mut rng);
        let mut words = vec![0; 65];
        to_limbs(&value, &mut words);
        let mut rebuilt = Integer::new();
        for j in (0..80).rev() {
            rebuilt <<= 52;
            rebuilt += digit(&words, j);
        }
        assert_eq!(rebuilt, value);
    }

    /// The benchmark: `cargo test -p penrose-core --release --lib -- --ignored --nocapture
    /// montgomery_4096_timing`. Median ns per multiplication over 51 runs of 2000, for each
    /// kernel, on a 4096-bit modulus (n^2 of the deployed 2048-bit key size).
    #[test]
    #[ignore = "timing, not a check: run with --ignored --nocapture"]
    fn montgomery_4096_timing() {
        let mut rng = ChaCha20Rng::seed_from_u64(57);
        let n = modulus(4096, &mut rng);
        let median = |m: &Montgomery| {
            let mut scratch = m.scratch();
            let mut acc = vec![0; m.limbs()];
            let mut x = vec![0; m.limbs()];
            to_limbs(
                &random_below(&n, &mut ChaCha20Rng::seed_from_u64(1)),
                &mut acc,
            );
            to_limbs(
                &random_below(&n, &mut ChaCha20Rng::seed_from_u64(2)),
                &mut x,
            );
            let per_run = 2000u32;
            let mut runs: Vec<f64> = (0..51)
                .map(|_| {
                    let start = Instant::now();
                    for _ in 0..per_run {
                        assert!(m.mul_assign(
                            std::hint::black_box(&mut acc),
                            std::hint::black_box(&x),
                            &mut scratch
                        ));
                    }
                    start.elapsed().as_nanos() as f64 / f64::from(per_run)
                })
                .collect();
            runs.sort_by(f64::total_cmp);
            runs[runs.len() / 2]
        };
        let gmp = Montgomery::with_kernel(&n, Kernel::Gmp).unwrap();
        let gmp_ns = median(&gmp);
        println!("montgomery_4096/gmp: {gmp_ns:.0} ns per mul_assign (median)");
        let auto = Montgomery::with_kernel(&n, Kernel::Auto).unwrap();
        if auto.kernel_name() != "ifma" {
            println!("montgomery_4096/ifma: unavailable on this build or CPU");
            return;
        }
        let ifma_ns = median(&auto);
        println!("montgomery_4096/ifma: {ifma_ns:.0} ns per mul_assign (median)");
        println!("montgomery_4096: gmp / ifma = {:.2}", gmp_ns / ifma_ns);
    }
}
