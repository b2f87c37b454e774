//! Keys: generation, byte formats and the id that names a public key on the wire.
//!
//! Byte formats (all integers big-endian, fixed length for the key size):
//!
//! - public key, version 1: `"PNPK" | 01 | bits: u16 | n: bits/8 | h_s: bits/4`
//! - private key, version 1: `"PNSK" | 01 | bits: u16 | p: bits/16 | q: bits/16 | h_s: bits/4`
//!
//! The four-byte tag tells the kinds apart: at 2048 bits both bodies are 768 bytes, and without
//! it a private key file would parse as a (wrong) public key.
//!
//! `h_s = h^n mod n^2` is the Damgard-Jurik-Nielsen base; it is public and lives in both.

use std::fmt;
use std::sync::{Arc, OnceLock};

use rand::{CryptoRng, RngCore};
use rug::Integer;
use rug::integer::{IsPrime, Order};
use sha2::{Digest, Sha256};

use super::decrypt::CrtKey;
use super::encrypt::FixedBaseTable;
use super::error::PaillierError;
use super::montgomery::Montgomery;
use super::params::KeySize;
use super::random::{random_bits, random_unit};

/// Version byte of both key formats and of the threshold formats (`threshold`).
const KEY_FORMAT_VERSION: u8 = 1;
/// Tag of a public key file.
const PUBLIC_TAG: [u8; 4] = *b"PNPK";
/// Tag of a private (secret) key file.
const PRIVATE_TAG: [u8; 4] = *b"PNSK";
/// Tag, version byte and the u16 modulus size.
pub(crate) const HEADER_BYTES: usize = 7;
/// Miller-Rabin rounds (after GMP's own Baillie-PSW) for generated and loaded primes.
const PRIME_TEST_ROUNDS: u32 = 32;

/// Identifies a public key: the SHA-256 of its serialised form ([`PublicKey::to_bytes`]), so
/// that a report names exactly the n and h_s it was encrypted under.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct KeyId(pub [u8; 32]);

// Its text form is the whole id in hex (64 digits; before, `Display` printed only the first
// 16, which no tool could parse back).
crate::hex::text_id!(KeyId, "key id");

/// What clients encrypt with and the aggregator validates and sums with.
#[derive(Clone)]
pub struct PublicKey {
    size: KeySize,
    n: Integer,
    nn: Integer,
    hs: Integer,
    id: KeyId,
    /// Built on first encryption: the aggregator, which never encrypts, never pays for it.
    /// Shared between clones, being several MiB.
    table: OnceLock<Arc<FixedBaseTable>>,
    /// Multiplication mod n^2 (the accumulator) and mod n (the batch unit check).
    mont_nn: Arc<Montgomery>,
    mont_n: Arc<Montgomery>,
}

impl fmt::Debug for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PublicKey")
            .field("size", &self.size)
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

impl PartialEq for PublicKey {
    fn eq(&self, other: &Self) -> bool {
        self.id == other.id
    }
}

impl Eq for PublicKey {}

impl PublicKey {
    fn new(size: KeySize, n: Integer, hs: Integer) -> Result<Self, PaillierError> {
        let nn = Integer::from(n.square_ref());
        let (Some(mont_n), Some(mont_nn)) = (Montgomery::new(&n), Montgomery::new(&nn)) else {
            return Err(PaillierError::InvalidKey("modulus is even"));
        };
        let mut key = Self {
            size,
            n,
            nn,
            hs,
            id: KeyId([0; 32]),
            table: OnceLock::new(),
            mont_nn: Arc::new(mont_nn),
            mont_n: Arc::new(mont_n),
        };
        key.id = KeyId(Sha256::digest(key.to_bytes()).into());
        Ok(key)
    }

    /// The modulus size.
    pub fn size(&self) -> KeySize {
        self.size
    }

    /// The id reports carry to say which key they were encrypted under.
    pub fn key_id(&self) -> KeyId {
        self.id
    }

    pub(crate) fn n(&self) -> &Integer {
        &self.n
    }

    pub(crate) fn nn(&self) -> &Integer {
        &self.nn
    }

    pub(crate) fn mont_nn(&self) -> &Arc<Montgomery> {
        &self.mont_nn
    }

    pub(crate) fn mont_n(&self) -> &Montgomery {
        &self.mont_n
    }

    pub(crate) fn table(&self) -> &FixedBaseTable {
        self.table.get_or_init(|| {
            Arc::new(FixedBaseTable::new(
                &self.hs,
                &self.nn,
                self.size.djn_exponent_bits(),
            ))
        })
    }

    /// Versioned encoding (module docs); hashing it gives the [`KeyId`].
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = header(PUBLIC_TAG, self.size);
        push_fixed(&mut out, &self.n, self.size.modulus_bytes());
        push_fixed(&mut out, &self.hs, self.size.ciphertext_bytes());
        out
    }

    /// Parses and checks a public key: known version and size, exact length, n odd with exactly
    /// the stated bits, h_s a unit below n^2.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, PaillierError> {
        let (size, body) = parse_header(PUBLIC_TAG, "not a public key (wrong file tag)", bytes)?;
        let expected = HEADER_BYTES + size.modulus_bytes() + size.ciphertext_bytes();
        check_len(bytes, expected)?;
        let (n_bytes, hs_bytes) = body.split_at(size.modulus_bytes());
        let n = Integer::from_digits(n_bytes, Order::Msf);
        let hs = Integer::from_digits(hs_bytes, Order::Msf);
        if n.significant_bits() != size.modulus_bits() || n.is_even() {
            return Err(PaillierError::InvalidKey(
                "modulus has the wrong size or is even",
            ));
        }
        let key = Self::new(size, n, hs)?;
        key.check_hs()?;
        Ok(key)
    }

    fn check_hs(&self) -> Result<(), PaillierError> {
        if self.hs <= 1 || self.hs >= self.nn || Integer::from(self.hs.gcd_ref(&self.n)) != 1 {
            return Err(PaillierError::InvalidKey("h_s is not a unit mod n^2"));
        }
        Ok(())
    }
}

/// The design server's key. Its `Debug` prints only the public key id.
#[derive(Clone)]
pub struct PrivateKey {
    public: PublicKey,
    pub(crate) p: Integer,
    q: Integer,
    crt: CrtKey,
}

impl fmt::Debug for PrivateKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PrivateKey")
            .field("size", &self.public.size)
            .field("id", &self.public.id)
            .finish_non_exhaustive()
    }
}

impl PrivateKey {
    fn from_parts(
        size: KeySize,
        p: Integer,
        q: Integer,
        hs: Integer,
    ) -> Result<Self, PaillierError> {
        let n = Integer::from(&p * &q);
        let public = PublicKey::new(size, n, hs)?;
        let crt = CrtKey::new(&p, &q, public.n());
        Ok(Self { public, p, q, crt })
    }

    /// The matching public key.
    pub fn public_key(&self) -> &PublicKey {
        &self.public
    }

    pub(crate) fn crt(&self) -> &CrtKey {
        &self.crt
    }

    /// lambda = lcm(p - 1, q - 1), Carmichael's function of n: the threshold dealer builds
    /// the shared exponent from it.
    pub(crate) fn carmichael(&self) -> Integer {
        Integer::from(&self.p - 1u32).lcm(&Integer::from(&self.q - 1u32))
    }

    /// Versioned encoding (module docs). Secret: store it readable by its owner only.
    pub fn to_bytes(&self) -> Vec<u8> {
        let size = self.public.size;
        let mut out = header(PRIVATE_TAG, size);
        push_fixed(&mut out, &self.p, size.prime_bytes());
        push_fixed(&mut out, &self.q, size.prime_bytes());
        push_fixed(&mut out, &self.public.hs, size.ciphertext_bytes());
        out
    }

    /// Parses and checks a private key: exact length, p and q distinct probable primes of half
    /// the size, n = p q of exactly the stated size, gcd(n, (p-1)(q-1)) = 1, and h_s an n-th
    /// residue (it must decrypt to 0, or encryptions under it would not decrypt).
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, PaillierError> {
        let (size, body) = parse_header(PRIVATE_TAG, "not a private key (wrong file tag)", bytes)?;
        let expected = HEADER_BYTES + 2 * size.prime_bytes() + size.ciphertext_bytes();
        check_len(bytes, expected)?;
        let (p_bytes, rest) = body.split_at(size.prime_bytes());
        let (q_bytes, hs_bytes) = rest.split_at(size.prime_bytes());
        let p = Integer::from_digits(p_bytes, Order::Msf);
        let q = Integer::from_digits(q_bytes, Order::Msf);
        let hs = Integer::from_digits(hs_bytes, Order::Msf);
        let half = size.modulus_bits() / 2;
        if p.significant_bits() != half || q.significant_bits() != half {
            return Err(PaillierError::InvalidKey(
                "a prime factor has the wrong size",
            ));
        }
        if p == q {
            return Err(PaillierError::InvalidKey("p equals q"));
        }
        if p.is_probably_prime(PRIME_TEST_ROUNDS) == IsPrime::No
            || q.is_probably_prime(PRIME_TEST_ROUNDS) == IsPrime::No
        {
            return Err(PaillierError::InvalidKey("a factor is not prime"));
        }
        let n = Integer::from(&p * &q);
        if n.significant_bits() != size.modulus_bits() {
            return Err(PaillierError::InvalidKey("n = p q has the wrong size"));
        }
        let phi = Integer::from(&p - 1u32) * Integer::from(&q - 1u32);
        if Integer::from(n.gcd_ref(&phi)) != 1 {
            return Err(PaillierError::InvalidKey("gcd(n, phi(n)) is not 1"));
        }
        let key = Self::from_parts(size, p, q, hs)?;
        key.public.check_hs()?;
        if key.crt.decrypt(&key.public.hs) != 0 {
            return Err(PaillierError::InvalidKey("h_s is not an n-th residue"));
        }
        Ok(key)
    }
}

/// A freshly generated key pair.
#[derive(Debug, Clone)]
pub struct Keypair {
    private: PrivateKey,
}

impl Keypair {
    /// A 2048-bit key pair (the deployed size).
    pub fn generate<R: RngCore + CryptoRng + ?Sized>(rng: &mut R) -> Self {
        Self::generate_with_size(KeySize::PRODUCTION, rng)
    }

    /// A key pair of the given size; sizes below 2048 bits are for tests only.
    ///
    /// p and q are random primes of exactly half the bits with their two top bits set, so n has
    /// exactly the stated size. h = -x^2 mod n for a random unit x, and h_s = h^n mod n^2, as in
    /// Damgard-Jurik-Nielsen.
    pub fn generate_with_size<R: RngCore + CryptoRng + ?Sized>(size: KeySize, rng: &mut R) -> Self {
        let half = size.modulus_bits() / 2;
        loop {
            let p = random_prime(rng, half);
            let q = random_prime(rng, half);
            if p == q {
                continue;
            }
            let n = Integer::from(&p * &q);
            let phi = Integer::from(&p - 1u32) * Integer::from(&q - 1u32);
            if n.significant_bits() != size.modulus_bits() || Integer::from(n.gcd_ref(&phi)) != 1 {
                continue;
            }
            let x = random_unit(rng, &n);
            let h = &n - Integer::from(x.square_ref()) % &n;
            let nn = Integer::from(n.square_ref());
            let Ok(hs) = h.pow_mod(&n, &nn) else {
                continue;
            };
            // n = p q is odd, so this cannot fail; a failure would only mean another try.
            let Ok(private) = PrivateKey::from_parts(size, p, q, hs) else {
                continue;
            };
            return Self { private };
        }
    }

    /// The public half.
    pub fn public_key(&self) -> &PublicKey {
        self.private.public_key()
    }

    /// The private half.
    pub fn private_key(&self) -> &PrivateKey {
        &self.private
    }

    /// Gives up the pair for its private key (which holds the public key).
    pub fn into_private_key(self) -> PrivateKey {
        self.private
    }
}

/// A random prime of exactly `bits` bits with its two top bits set.
fn random_prime<R: RngCore + CryptoRng + ?Sized>(rng: &mut R, bits: u32) -> Integer {
    loop {
        let mut candidate = random_bits(rng, bits);
        candidate.set_bit(bits - 1, true);
        candidate.set_bit(bits - 2, true);
        candidate.set_bit(0, true);
        candidate.next_prime_mut();
        // next_prime may step past the top: then draw again rather than bias the size.
        if candidate.significant_bits() == bits
            && candidate.get_bit(bits - 2)
            && candidate.is_probably_prime(PRIME_TEST_ROUNDS) != IsPrime::No
        {
            return candidate;
        }
    }
}

/// The header every Paillier file format starts with: its tag, the format version and the
/// modulus size.
pub(crate) fn header(tag: [u8; 4], size: KeySize) -> Vec<u8> {
    let mut out = tag.to_vec();
    out.push(KEY_FORMAT_VERSION);
    // Modulus sizes are 512..=2048 bits: they fit a u16.
    out.extend_from_slice(&(size.modulus_bits() as u16).to_be_bytes());
    out
}

/// Checks a [`header`] for `tag` (refusing another with `wrong_tag`, which names what the file
/// is not) and returns the size it names and the bytes after it.
pub(crate) fn parse_header<'a>(
    tag: [u8; 4],
    wrong_tag: &'static str,
    bytes: &'a [u8],
) -> Result<(KeySize, &'a [u8]), PaillierError> {
    let [t0, t1, t2, t3, version, hi, lo, body @ ..] = bytes else {
        return Err(PaillierError::Length {
            expected: HEADER_BYTES,
            actual: bytes.len(),
        });
    };
    if [*t0, *t1, *t2, *t3] != tag {
        return Err(PaillierError::InvalidKey(wrong_tag));
    }
    if *version != KEY_FORMAT_VERSION {
        return Err(PaillierError::UnsupportedVersion(*version));
    }
    let bits = u16::from_be_bytes([*hi, *lo]);
    let size = KeySize::from_bits(bits).ok_or(PaillierError::UnsupportedKeySize(bits))?;
    Ok((size, body))
}

pub(crate) fn check_len(bytes: &[u8], expected: usize) -> Result<(), PaillierError> {
    if bytes.len() == expected {
        Ok(())
    } else {
        Err(PaillierError::Length {
            expected,
            actual: bytes.len(),
        })
    }
}

/// Appends `value` big-endian, left-padded with zeros to `len` bytes (`value` fits by
/// construction: it is reduced modulo a number of at most `len` bytes).
pub(crate) fn push_fixed(out: &mut Vec<u8>, value: &Integer, len: usize) {
    let start = out.len();
    out.resize(start + len, 0);
    let digits = value.significant_digits::<u8>();
    let offset = start + len.saturating_sub(digits);
    value.write_digits(&mut out[offset..], Order::Msf);
}
