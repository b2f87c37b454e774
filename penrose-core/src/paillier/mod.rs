//! Packed Paillier: how a client hides its histogram from the aggregator while the aggregator
//! still adds histograms up.
//!
//! - [`params`]: key sizes, slot width, the accumulator bound (the numbers `docs/crypto.md`
//!   justifies).
//! - [`keys`]: key generation, the byte formats of both keys, [`KeyId`].
//! - [`ciphertext`]: validated ciphertexts and their fixed-length wire encoding.
//! - `packing`: bins <-> plaintext integers, one `SLOT_BITS`-wide slot per bin.
//! - `encrypt`: Damgard-Jurik-Nielsen encryption with a fixed-base table, and the plain form.
//! - `decrypt`: CRT decryption with constants computed once at key load.
//! - [`accumulator`]: the aggregator's homomorphic running sum, refusing to overflow a slot.
//! - `montgomery`: multiplication mod n^2 without a division (the accumulator's hot loop).
//! - [`units`]: the unit check of a whole batch of reports with one gcd.
//! - [`threshold`]: the private key split between the design server and the release auditor,
//!   so that decrypting a sum takes a proven partial decryption from each.
//!
//! The scheme is Paillier with g = n + 1 on a 2048-bit modulus; the crate works on GMP through
//! `rug` directly (why not `kzen-paillier`: `docs/crypto.md`).

pub mod accumulator;
pub mod ciphertext;
mod decrypt;
mod encrypt;
mod error;
pub mod keys;
mod montgomery;
mod packing;
pub mod params;
mod random;
pub mod threshold;
pub mod units;

pub use accumulator::Accumulator;
pub use ciphertext::{Ciphertext, PackedCiphertexts};
pub use error::PaillierError;
pub use keys::{KeyId, Keypair, PrivateKey, PublicKey};
pub use params::{
    ACCUMULATOR_REPORT_BOUND, BIN_COUNT, KeySize, MAX_BIN_VALUE, MAX_REPORT_SAMPLES, SLOT_BITS,
};
pub use units::UnitPending;
