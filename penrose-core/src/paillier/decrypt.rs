//! CRT decryption (Paillier 1999, section 7) with every constant computed once, when the
//! private key is built or loaded. The exponentiations with secret exponents p - 1 and q - 1
//! use GMP's `mpz_powm_sec`, whose timing and memory access do not depend on the exponent.

use rug::Integer;
use rug::ops::RemRounding;

use super::ciphertext::PackedCiphertexts;
use super::error::PaillierError;
use super::keys::PrivateKey;
use super::packing::unpack;
use super::params::BIN_COUNT;

/// One prime's half of CRT decryption.
#[derive(Clone)]
struct PrimeHalf {
    prime: Integer,
    /// prime^2: the half works mod prime^2.
    square: Integer,
    /// prime - 1: the secret exponent.
    exponent: Integer,
    /// L_prime(g^(prime - 1) mod prime^2)^-1 mod prime.
    h: Integer,
}

impl PrimeHalf {
    fn new(prime: &Integer, n: &Integer) -> Self {
        let square = Integer::from(prime.square_ref());
        let exponent = Integer::from(prime - 1u32);
        let g = Integer::from(n + 1u32);
        let l = l_function(g.secure_pow_mod(&exponent, &square), prime);
        // For g = n + 1 this is (-n/prime)^-1 mod prime, which exists because gcd(p, q) = 1.
        let h = l.invert(prime).unwrap_or_default();
        Self {
            prime: prime.clone(),
            square,
            exponent,
            h,
        }
    }

    /// m mod prime.
    fn decrypt(&self, c: &Integer) -> Integer {
        let reduced = Integer::from(c % &self.square);
        let x = reduced.secure_pow_mod(&self.exponent, &self.square);
        l_function(x, &self.prime) * &self.h % &self.prime
    }
}

/// L(x) = (x - 1) / d, exact for x = 1 mod d.
fn l_function(x: Integer, d: &Integer) -> Integer {
    (x - 1u32).div_exact(d)
}

/// Everything decryption needs beyond p and q, computed once.
#[derive(Clone)]
pub(crate) struct CrtKey {
    p: PrimeHalf,
    q: PrimeHalf,
    /// q^-1 mod p, to recombine the halves.
    q_inv_p: Integer,
}

impl CrtKey {
    pub(crate) fn new(p: &Integer, q: &Integer, n: &Integer) -> Self {
        Self {
            p: PrimeHalf::new(p, n),
            q: PrimeHalf::new(q, n),
            q_inv_p: q.clone().invert(p).unwrap_or_default(),
        }
    }

    /// The plaintext in [0, n) of a unit c mod n^2.
    pub(crate) fn decrypt(&self, c: &Integer) -> Integer {
        let mp = self.p.decrypt(c);
        let mq = self.q.decrypt(c);
        // m = mq + q ((mp - mq) q^-1 mod p)
        let t = ((mp - &mq) * &self.q_inv_p).rem_euc(&self.p.prime);
        mq + t * &self.q.prime
    }
}

impl PrivateKey {
    /// Decrypts a packed histogram (one report's or a whole accumulator's) into bin sums.
    pub fn decrypt_packed(
        &self,
        packed: &PackedCiphertexts,
    ) -> Result<[u64; BIN_COUNT], PaillierError> {
        let public = self.public_key();
        if packed.key_id != public.key_id() {
            return Err(PaillierError::KeyMismatch {
                expected: public.key_id(),
                actual: packed.key_id,
            });
        }
        let plaintexts = packed
            .ciphertexts
            .iter()
            .map(|c| self.crt().decrypt(&c.0))
            .collect();
        unpack(plaintexts, public.size())
    }
}
