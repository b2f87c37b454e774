//! Packed Paillier (placeholder until the crypto work lands).

/// Identifies a public key: the SHA-256 of its serialised modulus.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct KeyId(pub [u8; 32]);
