//! Encryption. With g = n + 1, g^m = 1 + m n mod n^2, so the only exponentiation is the
//! randomiser:
//!
//! - Damgard-Jurik-Nielsen (the default): h_s^a with h_s = h^n fixed in the public key and a
//!   uniform exponent a of half the modulus bits, computed from a fixed-base table of h_s.
//! - plain Paillier: r^n for a uniform unit r, kept to measure what the table saves.

use rand::{CryptoRng, RngCore};
use rug::Integer;

use super::ciphertext::{Ciphertext, PackedCiphertexts};
use super::error::PaillierError;
use super::keys::PublicKey;
use super::packing::pack;
use super::random::random_unit;

/// Bits of the exponent consumed per table row. For the 1024-bit exponent of a 2048-bit key,
/// 6 bits means 171 rows of 63 entries (about 5.5 MiB, built in one pass of about 10,800
/// multiplications) and about 168 multiplications per encryption; 4 bits would need 240 with a
/// 1.9 MiB table and missed the 3 ms target, 8 bits 128 with 16.7 MiB.
const WINDOW_BITS: u32 = 6;

/// Powers h_s^(d 2^(WINDOW_BITS i)) for every window i and digit d in 1..2^WINDOW_BITS, so that
/// h_s^a is one multiplication per non-zero window of a, with no squaring.
pub(crate) struct FixedBaseTable {
    exponent_bits: u32,
    rows: Vec<Vec<Integer>>,
}

impl FixedBaseTable {
    pub(crate) fn new(base: &Integer, modulus: &Integer, exponent_bits: u32) -> Self {
        let digits = (1usize << WINDOW_BITS) - 1;
        let mut row_base = base.clone();
        let rows = (0..exponent_bits.div_ceil(WINDOW_BITS))
            .map(|_| {
                let mut row = Vec::with_capacity(digits);
                let mut power = row_base.clone();
                for _ in 0..digits {
                    let next = Integer::from(&power * &row_base) % modulus;
                    row.push(std::mem::replace(&mut power, next));
                }
                // `power` is now row_base^(2^WINDOW_BITS), the next row's base.
                row_base = power;
                row
            })
            .collect();
        Self {
            exponent_bits,
            rows,
        }
    }

    /// base^a mod modulus for a little-endian exponent of `exponent_bits / 8` bytes.
    fn pow(&self, exponent_le: &[u8], modulus: &Integer) -> Integer {
        let mut acc = Integer::from(1);
        for (i, row) in self.rows.iter().enumerate() {
            let digit = window(exponent_le, i as u32 * WINDOW_BITS);
            if let Some(entry) = digit.checked_sub(1).and_then(|d| row.get(d)) {
                acc *= entry;
                acc %= modulus;
            }
        }
        acc
    }
}

/// The WINDOW_BITS-bit digit of a little-endian byte string starting at bit `bit`.
fn window(bytes: &[u8], bit: u32) -> usize {
    let byte = (bit / 8) as usize;
    let low = u16::from(bytes.get(byte).copied().unwrap_or(0));
    let high = u16::from(bytes.get(byte + 1).copied().unwrap_or(0));
    usize::from(((low | high << 8) >> (bit % 8)) & ((1 << WINDOW_BITS) - 1))
}

impl PublicKey {
    /// Encrypts one report's bins (each at most [`MAX_BIN_VALUE`](super::MAX_BIN_VALUE)) with
    /// the Damgard-Jurik-Nielsen randomiser. The first call builds the fixed-base table.
    pub fn encrypt_packed<B, R>(
        &self,
        bins: &[B],
        rng: &mut R,
    ) -> Result<PackedCiphertexts, PaillierError>
    where
        B: Copy + Into<u64>,
        R: RngCore + CryptoRng + ?Sized,
    {
        let table = self.table();
        let mut exponent = vec![0u8; (table.exponent_bits / 8) as usize];
        self.encrypt_with(bins, |key| {
            rng.fill_bytes(&mut exponent);
            table.pow(&exponent, key.nn())
        })
    }

    /// Encrypts with the textbook randomiser r^n: the same ciphertext distribution as plain
    /// Paillier, several times slower. For comparison in benchmarks.
    pub fn encrypt_packed_plain<B, R>(
        &self,
        bins: &[B],
        rng: &mut R,
    ) -> Result<PackedCiphertexts, PaillierError>
    where
        B: Copy + Into<u64>,
        R: RngCore + CryptoRng + ?Sized,
    {
        self.encrypt_with(bins, |key| {
            let r = random_unit(rng, key.n());
            // r is a unit and n > 0, so pow_mod cannot fail; fall back to 1 only to stay total.
            r.pow_mod(key.n(), key.nn())
                .unwrap_or_else(|_| Integer::from(1))
        })
    }

    fn encrypt_with<B: Copy + Into<u64>>(
        &self,
        bins: &[B],
        mut randomiser: impl FnMut(&Self) -> Integer,
    ) -> Result<PackedCiphertexts, PaillierError> {
        let ciphertexts = pack(bins, self.size())?
            .into_iter()
            .map(|m| {
                // g^m = (1 + n)^m = 1 + m n mod n^2; m < n so 1 + m n < n^2.
                let gm = m * self.n() + 1u32;
                Ciphertext(gm * randomiser(self) % self.nn())
            })
            .collect();
        Ok(self.packed(ciphertexts))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn table_power_matches_pow_mod() {
        let modulus = Integer::from(1_000_003u32) * 999_983u32;
        let base = Integer::from(12_345u32);
        let table = FixedBaseTable::new(&base, &modulus, 64);
        for exponent in [0u64, 1, 15, 16, 0xdead_beef_1234_5678, u64::MAX] {
            let expected = base
                .clone()
                .pow_mod(&Integer::from(exponent), &modulus)
                .unwrap();
            assert_eq!(table.pow(&exponent.to_le_bytes(), &modulus), expected);
        }
    }
}
