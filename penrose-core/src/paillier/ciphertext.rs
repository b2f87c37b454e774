//! Validated ciphertexts and their wire encoding: fixed length, big-endian, mod n^2 (512 bytes
//! for a 2048-bit n), so that a report's size never depends on its content.

use rug::Integer;
use rug::integer::Order;

/// Sets `target` to the big-endian `bytes`, through native 64-bit limbs: GMP imports whole
/// native limbs with a copy, while importing single bytes goes through a much slower general
/// loop (a sizeable share of the aggregator's per-report cost).
pub(crate) fn assign_be(target: &mut Integer, bytes: &[u8], limbs: &mut Vec<u64>) {
    limbs.clear();
    limbs.extend(bytes.rchunks(8).map(|chunk| {
        let mut limb = [0u8; 8];
        limb[8 - chunk.len()..].copy_from_slice(chunk);
        u64::from_be_bytes(limb)
    }));
    target.assign_digits(limbs, Order::Lsf);
}

use super::error::PaillierError;
use super::keys::{KeyId, PublicKey, push_fixed};

/// One ciphertext that passed validation for a key: a unit in [1, n^2). Only encryption,
/// validation and the accumulator make them, so holding one means the checks were done.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ciphertext(pub(crate) Integer);

/// A whole histogram: `ciphertexts_per_histogram` ciphertexts for one key, in bin order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PackedCiphertexts {
    pub(crate) key_id: KeyId,
    pub(crate) ciphertexts: Vec<Ciphertext>,
    pub(crate) ciphertext_bytes: usize,
}

impl PackedCiphertexts {
    /// The key these ciphertexts were made or validated for.
    pub fn key_id(&self) -> KeyId {
        self.key_id
    }

    /// The ciphertexts, in bin order.
    pub fn ciphertexts(&self) -> &[Ciphertext] {
        &self.ciphertexts
    }

    /// The wire encoding: the ciphertexts concatenated, each fixed length.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.ciphertexts.len() * self.ciphertext_bytes);
        for ciphertext in &self.ciphertexts {
            push_fixed(&mut out, &ciphertext.0, self.ciphertext_bytes);
        }
        out
    }
}

impl PublicKey {
    /// The encryption of the bin-wise sum of two encrypted histograms: their ciphertexts
    /// multiplied mod n^2. For an aggregator that releases the sums of two classes as one (a
    /// merge); the caller keeps the combined report count within the accumulator bound, which
    /// is what keeps slots from carrying. Refuses sums under another key or of another length.
    pub fn add_packed(
        &self,
        a: &PackedCiphertexts,
        b: &PackedCiphertexts,
    ) -> Result<PackedCiphertexts, PaillierError> {
        for sum in [a, b] {
            if sum.key_id != self.key_id() {
                return Err(PaillierError::KeyMismatch {
                    expected: self.key_id(),
                    actual: sum.key_id,
                });
            }
        }
        if a.ciphertexts.len() != b.ciphertexts.len() {
            return Err(PaillierError::Length {
                expected: a.ciphertexts.len() * a.ciphertext_bytes,
                actual: b.ciphertexts.len() * b.ciphertext_bytes,
            });
        }
        let ciphertexts = a
            .ciphertexts
            .iter()
            .zip(&b.ciphertexts)
            .map(|(x, y)| Ciphertext(Integer::from(&x.0 * &y.0) % self.nn()))
            .collect();
        Ok(PackedCiphertexts {
            key_id: a.key_id,
            ciphertexts,
            ciphertext_bytes: a.ciphertext_bytes,
        })
    }

    /// Parses and checks one ciphertext: exact length, not zero, below n^2, coprime to n.
    pub fn validate_ciphertext(&self, bytes: &[u8]) -> Result<Ciphertext, PaillierError> {
        let expected = self.size().ciphertext_bytes();
        if bytes.len() != expected {
            return Err(PaillierError::Length {
                expected,
                actual: bytes.len(),
            });
        }
        let mut value = Integer::new();
        assign_be(&mut value, bytes, &mut Vec::new());
        if value == 0 {
            return Err(PaillierError::CiphertextZero);
        }
        if &value >= self.nn() {
            return Err(PaillierError::CiphertextTooLarge);
        }
        if Integer::from(value.gcd_ref(self.n())) != 1 {
            return Err(PaillierError::CiphertextNotUnit);
        }
        Ok(Ciphertext(value))
    }

    /// Parses and checks a packed histogram as it arrives in a report.
    pub fn validate_packed(&self, bytes: &[u8]) -> Result<PackedCiphertexts, PaillierError> {
        let size = self.size();
        if bytes.len() != size.packed_bytes() {
            return Err(PaillierError::Length {
                expected: size.packed_bytes(),
                actual: bytes.len(),
            });
        }
        let ciphertexts = bytes
            .chunks_exact(size.ciphertext_bytes())
            .map(|chunk| self.validate_ciphertext(chunk))
            .collect::<Result<_, _>>()?;
        Ok(self.packed(ciphertexts))
    }

    pub(crate) fn packed(&self, ciphertexts: Vec<Ciphertext>) -> PackedCiphertexts {
        PackedCiphertexts {
            key_id: self.key_id(),
            ciphertexts,
            ciphertext_bytes: self.size().ciphertext_bytes(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limb_import_matches_byte_import() {
        for len in [0usize, 1, 7, 8, 9, 64, 511, 512] {
            let bytes: Vec<u8> = (0..len).map(|i| (i * 37 + 11) as u8).collect();
            let mut value = Integer::from(12345);
            assign_be(&mut value, &bytes, &mut Vec::new());
            assert_eq!(
                value,
                Integer::from_digits(&bytes, Order::Msf),
                "length {len}"
            );
        }
    }
}
