//! The unit check of many reports at once: one gcd per batch instead of one per ciphertext.
//!
//! A ciphertext c in [1, n^2) is a unit mod n^2 exactly when gcd(c, n) = 1, that is when
//! neither p nor q divides it. Whether p or q divides c depends only on c mod n, and p (or q)
//! divides a product mod n exactly when it divides one of the factors (both divide n). So the
//! product mod n of every ciphertext of every report of a batch is coprime to n exactly when
//! each ciphertext is: one multiplication mod n per report and one gcd per batch replace a gcd
//! per ciphertext (about 10 us each at 2048 bits, the largest share of the aggregator's
//! validation). Only when the batch fails (someone who knows the factorisation made a
//! non-unit on purpose) is each report checked on its own, which costs what the per-report
//! check always cost.
//!
//! The products are Montgomery products (`montgomery` module), which carry a factor R^-1 per
//! multiplication. R is a power of two and n is odd, so the factor is a unit and leaves the
//! answer to "is this coprime to n" unchanged: it never needs removing.

use rug::{Assign, Integer};

use super::ciphertext::{Ciphertext, PackedCiphertexts, assign_be};
use super::error::PaillierError;
use super::keys::PublicKey;
use super::montgomery::{Limb, from_limbs, to_limbs};

/// A report's ciphertexts that passed every check but the unit check, with the product of
/// their residues mod n, which is all that check needs. The ciphertexts are reachable only
/// through [`PublicKey::check_units`], so that an unchecked one cannot reach a sum.
#[derive(Clone, Debug)]
pub struct UnitPending {
    packed: PackedCiphertexts,
    /// The ciphertexts' residues mod n multiplied together (Montgomery products), as limbs.
    residue: Vec<Limb>,
}

impl PublicKey {
    /// Parses and checks a packed histogram like [`validate_packed`](Self::validate_packed)
    /// (length, non-zero, below n^2, not a multiple of n, with the same errors), except that
    /// gcd(c, n) = 1 is left to [`check_units`](Self::check_units) over a whole batch.
    pub fn validate_packed_deferring_units(
        &self,
        bytes: &[u8],
    ) -> Result<UnitPending, PaillierError> {
        let size = self.size();
        if bytes.len() != size.packed_bytes() {
            return Err(PaillierError::Length {
                expected: size.packed_bytes(),
                actual: bytes.len(),
            });
        }
        let mut limbs = Vec::new();
        let mont = self.mont_n();
        let mut scratch = mont.scratch();
        let mut residue: Vec<Limb> = vec![0; mont.limbs()];
        residue[0] = 1;
        let mut reduced_limbs: Vec<Limb> = vec![0; mont.limbs()];
        let mut reduced = Integer::new();
        let mut ciphertexts = Vec::with_capacity(size.ciphertexts_per_histogram());
        for chunk in bytes.chunks_exact(size.ciphertext_bytes()) {
            let mut value = Integer::new();
            assign_be(&mut value, chunk, &mut limbs);
            if value == 0 {
                return Err(PaillierError::CiphertextZero);
            }
            if &value >= self.nn() {
                return Err(PaillierError::CiphertextTooLarge);
            }
            reduced.assign(&value % self.n());
            if reduced == 0 {
                return Err(PaillierError::CiphertextNotUnit);
            }
            to_limbs(&reduced, &mut reduced_limbs);
            // Both are mont.limbs() long, as made above.
            if !mont.mul_assign(&mut residue, &reduced_limbs, &mut scratch) {
                return Err(PaillierError::Length {
                    expected: residue.len(),
                    actual: reduced_limbs.len(),
                });
            }
            ciphertexts.push(Ciphertext(value));
        }
        Ok(UnitPending {
            packed: self.packed(ciphertexts),
            residue,
        })
    }

    /// The unit check of a batch: for each report, its ciphertexts if every one is a unit mod
    /// n^2, else [`PaillierError::CiphertextNotUnit`]. One gcd for the whole batch when all
    /// pass (module docs); one per report otherwise.
    pub fn check_units<'a>(
        &self,
        batch: impl IntoIterator<Item = &'a UnitPending>,
    ) -> Vec<Result<&'a PackedCiphertexts, PaillierError>> {
        let batch: Vec<&UnitPending> = batch.into_iter().collect();
        let mont = self.mont_n();
        let mut scratch = mont.scratch();
        let mut product: Vec<Limb> = vec![0; mont.limbs()];
        product[0] = 1;
        // A residue of the wrong length (impossible: this key made it) fails the fast path.
        let mut all_units = batch
            .iter()
            .all(|pending| mont.mul_assign(&mut product, &pending.residue, &mut scratch));
        all_units = all_units && Integer::from(from_limbs(&product).gcd_ref(self.n())) == 1;
        batch
            .into_iter()
            .map(|pending| {
                if all_units || Integer::from(from_limbs(&pending.residue).gcd_ref(self.n())) == 1 {
                    Ok(&pending.packed)
                } else {
                    Err(PaillierError::CiphertextNotUnit)
                }
            })
            .collect()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use rand::SeedableRng;
    use rand_chacha::ChaCha20Rng;

    use super::*;
    use crate::paillier::{BIN_COUNT, KeySize, Keypair};

    fn fixed(value: &Integer, len: usize) -> Vec<u8> {
        let digits = value.to_digits::<u8>(rug::integer::Order::Msf);
        let mut out = vec![0u8; len - digits.len()];
        out.extend_from_slice(&digits);
        out
    }

    #[test]
    fn one_non_unit_fails_only_its_own_report() {
        let mut rng = ChaCha20Rng::seed_from_u64(7);
        let keys = Keypair::generate_with_size(KeySize::Bits1024, &mut rng);
        let public = keys.public_key();
        let len = public.size().ciphertext_bytes();
        let mut bins = [0u32; BIN_COUNT];
        bins[3] = 5;
        let good: Vec<Vec<u8>> = (0..5)
            .map(|_| public.encrypt_packed(&bins, &mut rng).unwrap().to_bytes())
            .collect();
        // A multiple of p below n^2 (not of n): only the key holder can make one.
        let p = keys.private_key().p.clone();
        let mut bad = good[2].clone();
        bad[len..2 * len].copy_from_slice(&fixed(&(p * 12_345u32), len));
        let wires = [&good[0], &good[1], &bad, &good[3], &good[4]];
        let pending: Vec<UnitPending> = wires
            .iter()
            .map(|w| public.validate_packed_deferring_units(w).unwrap())
            .collect();
        // The full check refuses the bad report; the deferred parse lets it through...
        assert!(matches!(
            public.validate_packed(&bad),
            Err(PaillierError::CiphertextNotUnit)
        ));
        let checked = public.check_units(&pending);
        // ...and the batch check catches it, and only it.
        for (i, result) in checked.iter().enumerate() {
            match result {
                Ok(packed) => {
                    assert_ne!(i, 2);
                    assert_eq!(packed.to_bytes(), *wires[i]);
                    assert_eq!(**packed, public.validate_packed(wires[i]).unwrap());
                }
                Err(e) => {
                    assert_eq!(i, 2);
                    assert!(matches!(e, PaillierError::CiphertextNotUnit));
                }
            }
        }
        assert!(public.check_units(&pending[..2]).iter().all(Result::is_ok));
        assert!(public.check_units([]).is_empty());
    }

    #[test]
    fn deferred_parse_keeps_the_cheap_checks() {
        let mut rng = ChaCha20Rng::seed_from_u64(8);
        let keys = Keypair::generate_with_size(KeySize::Bits1024, &mut rng);
        let public = keys.public_key();
        let len = public.size().ciphertext_bytes();
        let mut wire = public
            .encrypt_packed(&[0u32; BIN_COUNT], &mut rng)
            .unwrap()
            .to_bytes();
        wire[..len].fill(0);
        assert!(matches!(
            public.validate_packed_deferring_units(&wire),
            Err(PaillierError::CiphertextZero)
        ));
        wire[..len].fill(0xff);
        assert!(matches!(
            public.validate_packed_deferring_units(&wire),
            Err(PaillierError::CiphertextTooLarge)
        ));
        wire[..len].copy_from_slice(&fixed(public.n(), len));
        assert!(matches!(
            public.validate_packed_deferring_units(&wire),
            Err(PaillierError::CiphertextNotUnit)
        ));
        assert!(matches!(
            public.validate_packed_deferring_units(&wire[1..]),
            Err(PaillierError::Length { .. })
        ));
    }
}
