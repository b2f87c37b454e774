//! The proof that a partial decryption used the holder's share: equality of two discrete
//! logarithms, log_v(v_i) = log_c(c_i), made non-interactive with SHA-256 (Fiat-Shamir).
//!
//! Prover: r uniform below 2^(share bits + 256), a = v^r, b = c^r, e = H(statement, a, b)
//! truncated to 128 bits, z = r + e d_i over the integers. Verifier: a = v^z v_i^-e,
//! b = c^z c_i^-e, and e must equal H(statement, a, b). The nonce is 128 bits wider than
//! e d_i, so z is within 2^-128 of a distribution that does not depend on d_i. Why the proof
//! together with the combination's 1 mod n check pins the plaintext: `docs/crypto.md`,
//! "Threshold decryption (2-of-2)".

use rand::{CryptoRng, RngCore};
use rug::Integer;
use rug::integer::Order;
use sha2::{Digest, Sha256};

use super::{Holder, STATISTICAL_BITS, VerificationKey, share_bits};
use crate::paillier::keys::push_fixed;
use crate::paillier::params::KeySize;
use crate::paillier::random::random_bits;

/// Bytes of a challenge. 128 bits: far below the smallest prime factor of n, which is what
/// makes a wrong plaintext part unprovable (two challenges for one commitment would need
/// their difference to be a multiple of p or q).
pub(super) const CHALLENGE_BYTES: usize = 16;

/// Separates these hashes from any other use of SHA-256 on the same numbers.
const DOMAIN: &[u8] = b"penrose/paillier/threshold/partial-decryption-proof/v1";

/// Bits of the prover's nonce: wider than any e d_i by [`STATISTICAL_BITS`].
fn nonce_bits(size: KeySize) -> u32 {
    share_bits(size) + 8 * CHALLENGE_BYTES as u32 + STATISTICAL_BITS
}

/// Bytes of a response z = r + e d_i, below 2^(nonce bits + 1).
pub(super) fn response_bytes(size: KeySize) -> usize {
    (nonce_bits(size) + 1).div_ceil(8) as usize
}

/// What one proof is about: that `value` = `ciphertext`^(d_i) mod n^2 for the d_i behind the
/// verification key of `holder`.
pub(super) struct Statement<'a> {
    pub(super) verification: &'a VerificationKey,
    pub(super) holder: Holder,
    pub(super) ciphertext: &'a Integer,
    pub(super) value: &'a Integer,
}

impl Statement<'_> {
    /// (challenge, response) for `exponent`, the holder's share.
    pub(super) fn prove<R: RngCore + CryptoRng + ?Sized>(
        &self,
        exponent: &Integer,
        rng: &mut R,
    ) -> ([u8; CHALLENGE_BYTES], Integer) {
        let public = self.verification.public_key();
        let nn = public.nn();
        // secure_pow_mod needs a positive exponent; a zero nonce has probability 2^-4000.
        let nonce = loop {
            let candidate = random_bits(rng, nonce_bits(public.size()));
            if candidate != 0 {
                break candidate;
            }
        };
        let a = self.verification.base().clone().secure_pow_mod(&nonce, nn);
        let b = self.ciphertext.clone().secure_pow_mod(&nonce, nn);
        let challenge = self.challenge(&a, &b);
        let response = nonce + challenge_integer(&challenge) * exponent;
        (challenge, response)
    }

    /// Whether (challenge, response) proves the statement.
    pub(super) fn verify(&self, challenge: &[u8; CHALLENGE_BYTES], response: &Integer) -> bool {
        let nn = self.verification.public_key().nn();
        let e = challenge_integer(challenge);
        let image = self.verification.of(self.holder);
        let commitments = (
            commitment(self.verification.base(), image, &e, response, nn),
            commitment(self.ciphertext, self.value, &e, response, nn),
        );
        let (Some(a), Some(b)) = commitments else {
            return false;
        };
        self.challenge(&a, &b) == *challenge
    }

    /// H(domain, key id, holder, v, v_i, c, c_i, a, b), every number at fixed length, cut to
    /// [`CHALLENGE_BYTES`].
    fn challenge(&self, a: &Integer, b: &Integer) -> [u8; CHALLENGE_BYTES] {
        let public = self.verification.public_key();
        let len = public.size().ciphertext_bytes();
        let mut input = DOMAIN.to_vec();
        input.extend_from_slice(&public.key_id().0);
        input.push(self.holder.code());
        let numbers = [
            self.verification.base(),
            self.verification.of(self.holder),
            self.ciphertext,
            self.value,
            a,
            b,
        ];
        for number in numbers {
            push_fixed(&mut input, number, len);
        }
        let digest = Sha256::digest(&input);
        let mut challenge = [0u8; CHALLENGE_BYTES];
        challenge.copy_from_slice(&digest[..CHALLENGE_BYTES]);
        challenge
    }
}

fn challenge_integer(challenge: &[u8; CHALLENGE_BYTES]) -> Integer {
    Integer::from_digits(challenge, Order::Msf)
}

/// base^z (image^e)^-1 mod n^2: the commitment an honest prover made. None when image is not
/// invertible, which validated inputs never are.
fn commitment(
    base: &Integer,
    image: &Integer,
    e: &Integer,
    response: &Integer,
    nn: &Integer,
) -> Option<Integer> {
    let lifted = base.clone().pow_mod(response, nn).ok()?;
    let removed = image.clone().pow_mod(e, nn).ok()?.invert(nn).ok()?;
    Some(lifted * removed % nn)
}
