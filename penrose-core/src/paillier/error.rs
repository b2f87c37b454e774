//! Everything that can go wrong with keys, ciphertexts and sums, as one typed error.

use super::keys::KeyId;
use super::threshold::Holder;

/// Why a Paillier operation refused its input.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PaillierError {
    /// A histogram must have exactly [`BIN_COUNT`](super::BIN_COUNT) bins.
    #[error("expected {expected} bins, got {actual}")]
    BinCount {
        /// Bins required.
        expected: usize,
        /// Bins given.
        actual: usize,
    },
    /// A bin larger than [`MAX_BIN_VALUE`](super::MAX_BIN_VALUE) would break the accumulator
    /// bound, so it is refused at encryption time.
    #[error("bin {index} holds {value}, more than the maximum {max}")]
    BinTooLarge {
        /// Which bin.
        index: usize,
        /// Its value.
        value: u64,
        /// The largest value a single report may hold in one bin.
        max: u64,
    },
    /// The byte encoding of a ciphertext (or of a packed histogram) has the wrong length.
    #[error("expected {expected} bytes, got {actual}")]
    Length {
        /// Bytes required.
        expected: usize,
        /// Bytes given.
        actual: usize,
    },
    /// Zero is not a Paillier ciphertext.
    #[error("ciphertext is zero")]
    CiphertextZero,
    /// A ciphertext must be reduced mod n^2.
    #[error("ciphertext is not below n^2")]
    CiphertextTooLarge,
    /// A ciphertext sharing a factor with n is not a unit; multiplying it in would poison a sum.
    #[error("ciphertext shares a factor with the modulus")]
    CiphertextNotUnit,
    /// Ciphertexts or sums made under one key were used with another.
    #[error("ciphertexts are for key {actual}, expected key {expected}")]
    KeyMismatch {
        /// The key in use.
        expected: KeyId,
        /// The key the ciphertexts were made for.
        actual: KeyId,
    },
    /// A decrypted plaintext has bits outside its slots: some slot overflowed (the accumulator
    /// bound was broken, or a client encrypted something other than a packed histogram).
    #[error("decrypted plaintext {ciphertext} does not fit its slots")]
    PlaintextOverflow {
        /// Index of the offending ciphertext in the packed histogram.
        ciphertext: usize,
    },
    /// The accumulator already holds as many reports as its slots can take.
    #[error("accumulator is full ({bound} reports)")]
    AccumulatorFull {
        /// The bound it reached.
        bound: u64,
    },
    /// An accumulator bound above [`ACCUMULATOR_REPORT_BOUND`](super::ACCUMULATOR_REPORT_BOUND)
    /// would let a slot carry.
    #[error("accumulator bound {bound} exceeds the safe maximum {max}")]
    BoundTooLarge {
        /// Bound asked for.
        bound: u64,
        /// The safe maximum.
        max: u64,
    },
    /// A report claims more samples than a sealed histogram can hold.
    #[error("report claims {samples} samples, more than {max}")]
    TooManySamples {
        /// Samples claimed.
        samples: u64,
        /// The most a report may hold.
        max: u64,
    },
    /// A key encoding starts with a version this code does not know.
    #[error("unsupported key format version {0}")]
    UnsupportedVersion(u8),
    /// A key encoding names a modulus size this code does not support.
    #[error("unsupported modulus size {0} bits")]
    UnsupportedKeySize(u16),
    /// A key encoding is well formed but its numbers are not a valid key.
    #[error("invalid key: {0}")]
    InvalidKey(&'static str),
    /// A threshold key share, verification key or partial decryption is well formed but its
    /// numbers are not valid ones.
    #[error("invalid threshold decryption material: {0}")]
    InvalidShare(&'static str),
    /// Combining needs one partial decryption from each holder; two from one would be a
    /// decryption by one holder alone.
    #[error("both partial decryptions are from the {0}")]
    SameHolder(Holder),
    /// A partial decryption's proof does not verify against the holder's verification key and
    /// this sum: the value is wrong (damaged, shifted to change the plaintext) or belongs to
    /// another sum.
    #[error("the {holder}'s partial decryption of ciphertext {ciphertext} is not proven correct")]
    PartialProofInvalid {
        /// Who sent it.
        holder: Holder,
        /// Index of the ciphertext whose proof failed.
        ciphertext: usize,
    },
    /// The two partial decryptions multiply to something that is not 1 mod n, so it is no
    /// decryption: one of them was tampered with in a way its proof cannot see (module
    /// `threshold`, docs/crypto.md).
    #[error("partial decryptions of ciphertext {ciphertext} do not combine (product not 1 mod n)")]
    PartialsInconsistent {
        /// Index of the ciphertext whose partials disagree.
        ciphertext: usize,
    },
}
