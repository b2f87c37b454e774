//! Two-of-two threshold decryption: the private key is split at a dealer ceremony between the
//! design server and the release auditor, so that decrypting a sum needs a partial decryption
//! from each, and neither share alone decrypts anything.
//!
//! Construction (`docs/crypto.md`, "Threshold decryption (2-of-2)", says why it is correct and
//! why one share reveals nothing): d = lambda (lambda^-1 mod n), so d = 0 mod lambda and
//! d = 1 mod n, and c^d = 1 + m n mod n^2 for every unit c. The dealer ([`split`]) draws the
//! design server's share uniform below 2^(2 |n| + 128) and gives the auditor
//! d + t n lambda - d_design, where t n lambda is the first multiple of n lambda at or above
//! that bound: both are positive integers, and each alone is within 2^-127 of a distribution
//! that does not depend on the key. A partial decryption
//! ([`KeyShare::partial_decrypt`]) is c^(d_i) mod n^2 per ciphertext with a proof that it used
//! the exponent behind the holder's verification key v^(d_i) (`proof`); [`combine`] checks
//! both proofs, multiplies the partials, checks the product is 1 mod n and applies L.
//!
//! Byte formats (version 1; integers big-endian, fixed length for the key size: `k` bytes per
//! number mod n^2, `s` per share, `z` per proof response, 16 per challenge):
//!
//! - verification key: `"PNTV" | 01 | bits: u16 | key id: 32 | v: k | v_design: k |
//!   v_auditor: k`
//! - key share: `"PNTS" | 01 | bits: u16 | key id: 32 | holder: u8 | d_i: s | v: k |
//!   v_design: k | v_auditor: k`
//! - partial decryption: `"PNPD" | 01 | bits: u16 | key id: 32 | holder: u8 |` then per
//!   ciphertext `c^(d_i): k | challenge: 16 | response: z`
//!
//! Holders are coded 1 (design server) and 2 (release auditor).

mod proof;

use std::fmt;

use rand::{CryptoRng, RngCore};
use rug::Integer;
use rug::integer::Order;

use super::ciphertext::PackedCiphertexts;
use super::error::PaillierError;
use super::keys::{
    HEADER_BYTES, KeyId, PrivateKey, PublicKey, check_len, header, parse_header, push_fixed,
};
use super::packing::unpack;
use super::params::{BIN_COUNT, KeySize};
use super::random::{random_bits, random_unit};
use proof::{CHALLENGE_BYTES, Statement, response_bytes};

const VERIFICATION_TAG: [u8; 4] = *b"PNTV";
const SHARE_TAG: [u8; 4] = *b"PNTS";
const PARTIAL_TAG: [u8; 4] = *b"PNPD";
const KEY_ID_BYTES: usize = 32;

/// How far below 2^-x the statistical distance of anything a share or a proof reveals must
/// be: masks and nonces are this many bits wider than what they hide.
const STATISTICAL_BITS: u32 = 128;

/// How many bases v the dealer draws before concluding the shares do not recombine (a random
/// v fails with probability about 2 / sqrt(n), so a valid key never gets near it).
const BASE_ATTEMPTS: usize = 64;

/// The design server's share is uniform below 2^mask_bits: 128 bits above n^2, which bounds
/// d + n lambda, the part it hides.
fn mask_bits(size: KeySize) -> u32 {
    2 * size.modulus_bits() + STATISTICAL_BITS
}

/// Every dealt share is below 2^share_bits (the auditor's is below 2^mask_bits + 2 n^2).
fn share_bits(size: KeySize) -> u32 {
    mask_bits(size) + 1
}

fn share_bytes(size: KeySize) -> usize {
    share_bits(size).div_ceil(8) as usize
}

/// Who holds a share. Two distinct holders are what makes a decryption need both.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Holder {
    /// The design server, which asks for decryptions and publishes what they release.
    Design,
    /// The release auditor, whose partial decryption is its consent to a release.
    Auditor,
}

impl Holder {
    fn code(self) -> u8 {
        match self {
            Self::Design => 1,
            Self::Auditor => 2,
        }
    }

    fn from_code(code: u8) -> Result<Self, PaillierError> {
        match code {
            1 => Ok(Self::Design),
            2 => Ok(Self::Auditor),
            _ => Err(PaillierError::InvalidShare("unknown holder")),
        }
    }
}

impl fmt::Display for Holder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Design => "design server",
            Self::Auditor => "release auditor",
        })
    }
}

/// What checking a partial decryption needs: a base v and each holder's v^(d_i). Public, made
/// by the dealer; whoever combines must get it as authentically as the public key, since
/// proofs against a forged one prove nothing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VerificationKey {
    public: PublicKey,
    base: Integer,
    design: Integer,
    auditor: Integer,
}

impl VerificationKey {
    /// The public key the shares belong to.
    pub fn public_key(&self) -> &PublicKey {
        &self.public
    }

    /// The id of that public key, which every share and partial decryption carries.
    pub fn key_id(&self) -> KeyId {
        self.public.key_id()
    }

    fn base(&self) -> &Integer {
        &self.base
    }

    fn of(&self, holder: Holder) -> &Integer {
        match holder {
            Holder::Design => &self.design,
            Holder::Auditor => &self.auditor,
        }
    }

    /// Versioned encoding (module docs), for the combiner and anyone auditing a release.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = keyed_header(VERIFICATION_TAG, &self.public);
        self.push_numbers(&mut out);
        out
    }

    /// Parses a verification key for `public`: refuses another key's, a wrong length, and
    /// numbers that are not units below n^2 or whose holders' parts do not recombine to a v
    /// whose decryption is a unit mod n (the proofs are sound only for such a v).
    pub fn from_bytes(public: &PublicKey, bytes: &[u8]) -> Result<Self, PaillierError> {
        let mut fields = open(
            VERIFICATION_TAG,
            "not a threshold verification key (wrong file tag)",
            public,
            bytes,
            |size| 3 * size.ciphertext_bytes(),
        )?;
        Self::read(public, &mut fields)
    }

    fn push_numbers(&self, out: &mut Vec<u8>) {
        let len = self.public.size().ciphertext_bytes();
        for number in [&self.base, &self.design, &self.auditor] {
            push_fixed(out, number, len);
        }
    }

    fn read(public: &PublicKey, fields: &mut Fields<'_>) -> Result<Self, PaillierError> {
        let len = public.size().ciphertext_bytes();
        let key = Self {
            public: public.clone(),
            base: fields.integer(len)?,
            design: fields.integer(len)?,
            auditor: fields.integer(len)?,
        };
        key.check()?;
        Ok(key)
    }

    /// v^(d_design) v^(d_auditor) = v^d = 1 + a n mod n^2 where a is v's decryption, which
    /// must be a unit mod n.
    fn check(&self) -> Result<(), PaillierError> {
        for number in [&self.base, &self.design, &self.auditor] {
            check_unit(
                number,
                &self.public,
                "verification key number is not a unit below n^2",
            )?;
        }
        let n = self.public.n();
        let product = Integer::from(&self.design * &self.auditor) % self.public.nn();
        let recombines = Integer::from(&product % n) == 1
            && Integer::from((product - 1u32).div_exact(n).gcd_ref(n)) == 1;
        if !recombines {
            return Err(PaillierError::InvalidShare(
                "verification key does not belong to a sharing of this key",
            ));
        }
        Ok(())
    }
}

/// One holder's share of the decryption exponent, with the verification key its proofs are
/// checked against. Secret: its `Debug` prints only the holder and the key id.
#[derive(Clone)]
pub struct KeyShare {
    holder: Holder,
    verification: VerificationKey,
    exponent: Integer,
}

impl fmt::Debug for KeyShare {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyShare")
            .field("holder", &self.holder)
            .field("id", &self.verification.key_id())
            .finish_non_exhaustive()
    }
}

impl KeyShare {
    /// Whose share this is.
    pub fn holder(&self) -> Holder {
        self.holder
    }

    /// The key this share decrypts (with the other holder's).
    pub fn key_id(&self) -> KeyId {
        self.verification.key_id()
    }

    /// The public verification key, for the combiner.
    pub fn verification_key(&self) -> &VerificationKey {
        &self.verification
    }

    /// Versioned encoding (module docs). Secret: store it readable by its holder only.
    pub fn to_bytes(&self) -> Vec<u8> {
        let size = self.verification.public.size();
        let mut out = keyed_header(SHARE_TAG, &self.verification.public);
        out.push(self.holder.code());
        push_fixed(&mut out, &self.exponent, share_bytes(size));
        self.verification.push_numbers(&mut out);
        out
    }

    /// Parses a share of `public`'s key: refuses another key's share, a wrong length, an
    /// unknown holder, a zero share or one larger than any dealt, and a share that does not
    /// match its verification key (damaged, or paired with another sharing's). The last check
    /// costs one exponentiation mod n^2.
    pub fn from_bytes(public: &PublicKey, bytes: &[u8]) -> Result<Self, PaillierError> {
        let size = public.size();
        let mut fields = open(
            SHARE_TAG,
            "not a threshold key share (wrong file tag)",
            public,
            bytes,
            |size| 1 + share_bytes(size) + 3 * size.ciphertext_bytes(),
        )?;
        let holder = Holder::from_code(fields.byte()?)?;
        let exponent = fields.integer(share_bytes(size))?;
        let verification = VerificationKey::read(public, &mut fields)?;
        let share = Self {
            holder,
            verification,
            exponent,
        };
        share.check()?;
        Ok(share)
    }

    fn check(&self) -> Result<(), PaillierError> {
        if self.exponent == 0 {
            return Err(PaillierError::InvalidShare("key share is zero"));
        }
        if self.exponent.significant_bits() > share_bits(self.verification.public.size()) {
            return Err(PaillierError::InvalidShare(
                "key share is larger than any dealt share",
            ));
        }
        let image = (self.verification.base.clone())
            .secure_pow_mod(&self.exponent, self.verification.public.nn());
        if &image != self.verification.of(self.holder) {
            return Err(PaillierError::InvalidShare(
                "key share does not match its verification key",
            ));
        }
        Ok(())
    }

    /// This holder's partial decryption of a packed histogram (one report's or an
    /// accumulator's sum), with its proofs: what the holder sends the combiner when it agrees
    /// to the release. Refuses sums of another key.
    pub fn partial_decrypt<R: RngCore + CryptoRng + ?Sized>(
        &self,
        packed: &PackedCiphertexts,
        rng: &mut R,
    ) -> Result<PartialDecryption, PaillierError> {
        let public = &self.verification.public;
        check_packed(public, packed)?;
        let powers = packed
            .ciphertexts
            .iter()
            .map(|ciphertext| self.proven_power(&ciphertext.0, rng))
            .collect();
        Ok(PartialDecryption {
            holder: self.holder,
            size: public.size(),
            key_id: public.key_id(),
            powers,
        })
    }

    /// c^(d_i) mod n^2 with `mpz_powm_sec`, whose timing does not depend on the share.
    fn proven_power<R: RngCore + CryptoRng + ?Sized>(
        &self,
        ciphertext: &Integer,
        rng: &mut R,
    ) -> ProvenPower {
        let nn = self.verification.public.nn();
        let value = ciphertext.clone().secure_pow_mod(&self.exponent, nn);
        let statement = Statement {
            verification: &self.verification,
            holder: self.holder,
            ciphertext,
            value: &value,
        };
        let (challenge, response) = statement.prove(&self.exponent, rng);
        ProvenPower {
            value,
            challenge,
            response,
        }
    }
}

/// The two shares a dealing produces. The ceremony hands each to its holder and then destroys
/// the private key: from then on no single machine can decrypt.
#[derive(Debug)]
pub struct DealtShares {
    /// The design server's share.
    pub design: KeyShare,
    /// The release auditor's share.
    pub auditor: KeyShare,
}

/// Splits `private` into a design server's and a release auditor's share (module docs: how
/// they are drawn; `docs/crypto.md`: why neither alone reveals anything). Fails only for a key
/// whose lambda is not invertible mod n, which generation and loading never produce.
pub fn split<R: RngCore + CryptoRng + ?Sized>(
    private: &PrivateKey,
    rng: &mut R,
) -> Result<DealtShares, PaillierError> {
    let public = private.public_key();
    let lambda = private.carmichael();
    let inverse = Integer::from(
        lambda
            .invert_ref(public.n())
            .ok_or(PaillierError::InvalidKey("lambda is not invertible mod n"))?,
    );
    // Every unit's order divides n lambda, so adding a multiple of it changes no power.
    let period = Integer::from(public.n() * &lambda);
    let d = lambda * inverse;
    let bound = Integer::from(1) << mask_bits(public.size());
    let lift = (bound + &period - 1u32) / &period * &period;
    let design = loop {
        let candidate = random_bits(rng, mask_bits(public.size()));
        if candidate != 0 {
            break candidate;
        }
    };
    // Positive: lift >= 2^mask_bits > design.
    let auditor = d + lift - &design;
    let verification = deal_verification_key(public, &design, &auditor, rng)?;
    Ok(DealtShares {
        design: KeyShare {
            holder: Holder::Design,
            verification: verification.clone(),
            exponent: design,
        },
        auditor: KeyShare {
            holder: Holder::Auditor,
            verification,
            exponent: auditor,
        },
    })
}

/// A random unit v with v^(d_design) and v^(d_auditor), redrawn until it passes the check
/// every loaded verification key must (so a dealing whose shares do not recombine fails here).
fn deal_verification_key<R: RngCore + CryptoRng + ?Sized>(
    public: &PublicKey,
    design: &Integer,
    auditor: &Integer,
    rng: &mut R,
) -> Result<VerificationKey, PaillierError> {
    let nn = public.nn();
    for _ in 0..BASE_ATTEMPTS {
        let base = random_unit(rng, nn);
        let key = VerificationKey {
            public: public.clone(),
            design: base.clone().secure_pow_mod(design, nn),
            auditor: base.clone().secure_pow_mod(auditor, nn),
            base,
        };
        if key.check().is_ok() {
            return Ok(key);
        }
    }
    Err(PaillierError::InvalidKey(
        "the dealt shares do not recombine to the decryption exponent",
    ))
}

/// One holder's partial decryption of a packed histogram: c^(d_i) mod n^2 per ciphertext, each
/// with its proof. Alone it says nothing about the plaintext (`docs/crypto.md`), so it may
/// travel in the clear from its holder to the combiner.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PartialDecryption {
    holder: Holder,
    size: KeySize,
    key_id: KeyId,
    powers: Vec<ProvenPower>,
}

/// c^(d_i) mod n^2 and the proof that d_i is the holder's share.
#[derive(Clone, Debug, PartialEq, Eq)]
struct ProvenPower {
    value: Integer,
    challenge: [u8; CHALLENGE_BYTES],
    response: Integer,
}

impl PartialDecryption {
    /// Who made it.
    pub fn holder(&self) -> Holder {
        self.holder
    }

    /// The key of the sum it decrypts.
    pub fn key_id(&self) -> KeyId {
        self.key_id
    }

    /// Versioned encoding (module docs): fixed length for the key size.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = header(PARTIAL_TAG, self.size);
        out.extend_from_slice(&self.key_id.0);
        out.push(self.holder.code());
        for power in &self.powers {
            push_fixed(&mut out, &power.value, self.size.ciphertext_bytes());
            out.extend_from_slice(&power.challenge);
            push_fixed(&mut out, &power.response, response_bytes(self.size));
        }
        out
    }

    /// Parses a partial decryption under `public`'s key: refuses another key's, a wrong
    /// length, an unknown holder and values that are not units below n^2. Whether it is a
    /// correct one is for [`combine`] to check, against the sum it claims to decrypt.
    pub fn from_bytes(public: &PublicKey, bytes: &[u8]) -> Result<Self, PaillierError> {
        let size = public.size();
        let mut fields = open(
            PARTIAL_TAG,
            "not a partial decryption (wrong file tag)",
            public,
            bytes,
            partial_body_bytes,
        )?;
        let holder = Holder::from_code(fields.byte()?)?;
        let powers = (0..size.ciphertexts_per_histogram())
            .map(|_| read_power(public, &mut fields))
            .collect::<Result<_, _>>()?;
        Ok(Self {
            holder,
            size,
            key_id: public.key_id(),
            powers,
        })
    }
}

fn partial_body_bytes(size: KeySize) -> usize {
    let per_ciphertext = size.ciphertext_bytes() + CHALLENGE_BYTES + response_bytes(size);
    1 + size.ciphertexts_per_histogram() * per_ciphertext
}

fn read_power(public: &PublicKey, fields: &mut Fields<'_>) -> Result<ProvenPower, PaillierError> {
    let size = public.size();
    let value = fields.integer(size.ciphertext_bytes())?;
    check_unit(
        &value,
        public,
        "partial decryption value is not a unit below n^2",
    )?;
    Ok(ProvenPower {
        value,
        challenge: fields.array()?,
        response: fields.integer(response_bytes(size))?,
    })
}

/// The bin sums of `packed` from the two holders' partial decryptions of it: exactly what
/// [`PrivateKey::decrypt_packed`] returns. Refuses sums or partials of another key, two
/// partials from one holder, a partial whose proof does not verify for this sum (a wrong or
/// shifted value, a partial of another sum) and a combination that is not 1 mod n (which
/// catches what the proofs leave open; `docs/crypto.md`).
pub fn combine(
    verification: &VerificationKey,
    packed: &PackedCiphertexts,
    first: &PartialDecryption,
    second: &PartialDecryption,
) -> Result<[u64; BIN_COUNT], PaillierError> {
    let public = verification.public_key();
    check_packed(public, packed)?;
    if first.holder == second.holder {
        return Err(PaillierError::SameHolder(first.holder));
    }
    for partial in [first, second] {
        verify_partial(verification, packed, partial)?;
    }
    let plaintexts = combine_powers(public, &first.powers, &second.powers)?;
    unpack(plaintexts, public.size())
}

fn verify_partial(
    verification: &VerificationKey,
    packed: &PackedCiphertexts,
    partial: &PartialDecryption,
) -> Result<(), PaillierError> {
    if partial.key_id != verification.key_id() {
        return Err(PaillierError::KeyMismatch {
            expected: verification.key_id(),
            actual: partial.key_id,
        });
    }
    if partial.powers.len() != packed.ciphertexts.len() {
        return Err(PaillierError::Length {
            expected: packed.ciphertexts.len(),
            actual: partial.powers.len(),
        });
    }
    for (index, (power, ciphertext)) in partial.powers.iter().zip(&packed.ciphertexts).enumerate() {
        let statement = Statement {
            verification,
            holder: partial.holder,
            ciphertext: &ciphertext.0,
            value: &power.value,
        };
        if !statement.verify(&power.challenge, &power.response) {
            return Err(PaillierError::PartialProofInvalid {
                holder: partial.holder,
                ciphertext: index,
            });
        }
    }
    Ok(())
}

/// c^(d_design) c^(d_auditor) = c^d = 1 + m n mod n^2, so m = L(product); a product that is
/// not 1 mod n is no decryption.
fn combine_powers(
    public: &PublicKey,
    first: &[ProvenPower],
    second: &[ProvenPower],
) -> Result<Vec<Integer>, PaillierError> {
    let n = public.n();
    first
        .iter()
        .zip(second)
        .enumerate()
        .map(|(index, (a, b))| {
            let product = Integer::from(&a.value * &b.value) % public.nn();
            if Integer::from(&product % n) != 1 {
                return Err(PaillierError::PartialsInconsistent { ciphertext: index });
            }
            Ok((product - 1u32).div_exact(n))
        })
        .collect()
}

fn check_packed(public: &PublicKey, packed: &PackedCiphertexts) -> Result<(), PaillierError> {
    if packed.key_id != public.key_id() {
        return Err(PaillierError::KeyMismatch {
            expected: public.key_id(),
            actual: packed.key_id,
        });
    }
    let size = public.size();
    if packed.ciphertexts.len() != size.ciphertexts_per_histogram() {
        return Err(PaillierError::Length {
            expected: size.packed_bytes(),
            actual: packed.ciphertexts.len() * size.ciphertext_bytes(),
        });
    }
    Ok(())
}

fn check_unit(
    value: &Integer,
    public: &PublicKey,
    what: &'static str,
) -> Result<(), PaillierError> {
    if *value == 0 || value >= public.nn() || Integer::from(value.gcd_ref(public.n())) != 1 {
        return Err(PaillierError::InvalidShare(what));
    }
    Ok(())
}

fn keyed_header(tag: [u8; 4], public: &PublicKey) -> Vec<u8> {
    let mut out = header(tag, public.size());
    out.extend_from_slice(&public.key_id().0);
    out
}

/// Checks the header, the exact length (`body_bytes` after the key id) and that the key id is
/// `public`'s, and returns the fields after the key id.
fn open<'a>(
    tag: [u8; 4],
    wrong_tag: &'static str,
    public: &PublicKey,
    bytes: &'a [u8],
    body_bytes: fn(KeySize) -> usize,
) -> Result<Fields<'a>, PaillierError> {
    let (size, rest) = parse_header(tag, wrong_tag, bytes)?;
    check_len(bytes, HEADER_BYTES + KEY_ID_BYTES + body_bytes(size))?;
    let mut fields = Fields { rest };
    let key_id = KeyId(fields.array()?);
    if key_id != public.key_id() {
        return Err(PaillierError::KeyMismatch {
            expected: public.key_id(),
            actual: key_id,
        });
    }
    Ok(fields)
}

/// Reads fixed-length fields in order; running out is a length error, never a panic.
struct Fields<'a> {
    rest: &'a [u8],
}

impl<'a> Fields<'a> {
    fn take(&mut self, len: usize) -> Result<&'a [u8], PaillierError> {
        let (head, tail) = self
            .rest
            .split_at_checked(len)
            .ok_or(PaillierError::Length {
                expected: len,
                actual: self.rest.len(),
            })?;
        self.rest = tail;
        Ok(head)
    }

    fn byte(&mut self) -> Result<u8, PaillierError> {
        Ok(self.array::<1>()?[0])
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], PaillierError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }

    fn integer(&mut self, len: usize) -> Result<Integer, PaillierError> {
        Ok(Integer::from_digits(self.take(len)?, Order::Msf))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests;
