//! Export bundles: the encrypted sums the aggregation server hands to the design server, signed
//! by the aggregation server so that the design server imports only what its own aggregator
//! produced.
//!
//! ```text
//! bundle  = "PNBD"  version:u8  body  signature:[64]      (ed25519 over everything before it)
//! body    = signer:[32]  key_id:[32]  since:u64be  cursor:u64be  day:u32be  count:u32be
//!           entry * count
//! entry   = class:u32be  catalogue:u16be  counter:u16be  generation:u32be
//!           reports:u64be  samples:u64be  n:u8  ct_len:u16be  sums:[n * ct_len]
//! ```
//!
//! An entry is the *current* value of one accumulator (class, catalogue, counter, generation),
//! not a delta: a bundle exported `since` an older cursor carries every accumulator that changed
//! after it, so importing keeps, per accumulator, the entry of the bundle with the highest
//! cursor, and importing a bundle twice changes nothing. `reports` is the contributor count the
//! design server's threshold reads.
//!
//! This module lives in the I/O-free core (behind the `bundle` feature) so that the design
//! server can decode and verify bundles without linking the aggregator's storage.

use ed25519_dalek::{Signature, Signer, SigningKey, VerifyingKey};
use thiserror::Error;

use crate::counters::{CatalogueVersion, CounterId};
use crate::paillier::KeyId;
use crate::wire::{Day, MAX_CIPHERTEXTS, PackedBytes, WireError};

/// The bundle format version this build writes and reads.
pub const BUNDLE_VERSION: u8 = 1;

const MAGIC: [u8; 4] = *b"PNBD";
const HEADER_BYTES: usize = 4 + 1 + 32 + 32 + 8 + 8 + 4 + 4;
const ENTRY_FIXED_BYTES: usize = 4 + 2 + 2 + 4 + 8 + 8 + 1 + 2;
const SIGNATURE_BYTES: usize = 64;

/// An application class: the aggregator's name for a group of similar snippets. Numbered from
/// 0 in the order classes were founded; stable for the life of an aggregator's data directory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ClassId(pub u32);

/// Which accumulator of a (class, counter) this is: a fresh one starts whenever the previous
/// one reached its report bound, so every generation decrypts on its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Generation(pub u32);

/// A point in the aggregator's history (its count of committed write batches): a bundle holds
/// every accumulator changed after `since` up to and including `cursor`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Cursor(pub u64);

/// One accumulator's encrypted sums and contributor counts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BundleEntry {
    /// The class the reports were assigned to.
    pub class: ClassId,
    /// The catalogue the counter belongs to.
    pub catalogue: CatalogueVersion,
    /// The counter.
    pub counter: CounterId,
    /// Which accumulator of this (class, counter).
    pub generation: Generation,
    /// Distinct reports multiplied into the sums: the contributor count.
    pub reports: u64,
    /// Samples those reports claimed, summed.
    pub samples: u64,
    /// The packed ciphertext sums, in a report's encoding.
    pub sums: PackedBytes,
}

/// A decoded bundle.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Bundle {
    /// The aggregation server's ed25519 public key, which signed the bundle.
    pub signer: [u8; 32],
    /// The Paillier key the sums are under.
    pub key_id: KeyId,
    /// The bundle holds accumulators changed after this cursor (0: everything).
    pub since: Cursor,
    /// The aggregator's cursor when the bundle was taken; pass it as the next `since`.
    pub cursor: Cursor,
    /// The day the bundle was written.
    pub day: Day,
    /// The accumulators.
    pub entries: Vec<BundleEntry>,
}

/// Why bytes are not a bundle this build accepts.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum BundleError {
    /// The file does not start with the bundle tag.
    #[error("not a Penrose bundle (bad magic)")]
    BadMagic,
    /// Written by a format version this build does not read.
    #[error("unsupported bundle version {0} (this build reads {BUNDLE_VERSION})")]
    UnsupportedVersion(u8),
    /// The bytes end before a field.
    #[error("bundle truncated while reading {0}")]
    Truncated(&'static str),
    /// The entry count cannot fit in the bytes present.
    #[error("bundle announces {announced} entries, but only {room} could fit")]
    TooManyEntries {
        /// Entries announced.
        announced: u32,
        /// Entries the remaining bytes could hold at most.
        room: usize,
    },
    /// An entry's ciphertexts are malformed.
    #[error("entry {index}: {source}")]
    Entry {
        /// Which entry.
        index: usize,
        /// What is wrong.
        source: WireError,
    },
    /// Bytes between the last entry and the signature.
    #[error("{0} unexpected bytes after the entries")]
    TrailingBytes(usize),
    /// The signer field is not an ed25519 public key.
    #[error("the signer is not a valid ed25519 public key")]
    BadSigner,
    /// The signature does not verify under the signer's key: the bundle was altered.
    #[error("signature does not verify: the bundle was altered or damaged")]
    BadSignature,
    /// The bundle verifies, but under a key other than the one the caller trusts.
    #[error("signed by an aggregation server this design server does not trust")]
    UntrustedSigner,
    /// The bundle is too large to encode.
    #[error("more than u32::MAX entries")]
    TooLarge,
}

impl Bundle {
    /// Encodes the bundle and signs it with `key`; the signer field is set from `key`.
    pub fn sign(&self, key: &SigningKey) -> Result<Vec<u8>, BundleError> {
        let count = u32::try_from(self.entries.len()).map_err(|_| BundleError::TooLarge)?;
        let mut out = Vec::with_capacity(
            HEADER_BYTES
                + self
                    .entries
                    .iter()
                    .map(|e| ENTRY_FIXED_BYTES + e.sums.as_bytes().len())
                    .sum::<usize>()
                + SIGNATURE_BYTES,
        );
        out.extend_from_slice(&MAGIC);
        out.push(BUNDLE_VERSION);
        out.extend_from_slice(key.verifying_key().as_bytes());
        out.extend_from_slice(&self.key_id.0);
        out.extend_from_slice(&self.since.0.to_be_bytes());
        out.extend_from_slice(&self.cursor.0.to_be_bytes());
        out.extend_from_slice(&self.day.0.to_be_bytes());
        out.extend_from_slice(&count.to_be_bytes());
        for e in &self.entries {
            out.extend_from_slice(&e.class.0.to_be_bytes());
            out.extend_from_slice(&e.catalogue.0.to_be_bytes());
            out.extend_from_slice(&e.counter.0.to_be_bytes());
            out.extend_from_slice(&e.generation.0.to_be_bytes());
            out.extend_from_slice(&e.reports.to_be_bytes());
            out.extend_from_slice(&e.samples.to_be_bytes());
            // PackedBytes guarantees count <= MAX_CIPHERTEXTS and length <= u16::MAX.
            out.push(e.sums.count() as u8);
            out.extend_from_slice(&(e.sums.ciphertext_len() as u16).to_be_bytes());
            out.extend_from_slice(e.sums.as_bytes());
        }
        let signature = key.sign(&out);
        out.extend_from_slice(&signature.to_bytes());
        Ok(out)
    }

    /// Decodes a bundle and checks its signature (strict ed25519 verification) under the key it
    /// names; with `trusted`, also that this key is the trusted one. Nothing is returned from a
    /// bundle that fails any check.
    pub fn verify(bytes: &[u8], trusted: Option<&VerifyingKey>) -> Result<Bundle, BundleError> {
        if bytes.len() < 5 {
            return Err(BundleError::Truncated("header"));
        }
        if bytes[..4] != MAGIC {
            return Err(BundleError::BadMagic);
        }
        if bytes[4] != BUNDLE_VERSION {
            return Err(BundleError::UnsupportedVersion(bytes[4]));
        }
        if bytes.len() < HEADER_BYTES + SIGNATURE_BYTES {
            return Err(BundleError::Truncated("header"));
        }
        let (signed, signature) = bytes.split_at(bytes.len() - SIGNATURE_BYTES);
        let mut r = Reader(&signed[5..]);
        let signer: [u8; 32] = r.array("signer")?;
        let verifying = VerifyingKey::from_bytes(&signer).map_err(|_| BundleError::BadSigner)?;
        let mut sig = [0u8; SIGNATURE_BYTES];
        sig.copy_from_slice(signature);
        verifying
            .verify_strict(signed, &Signature::from_bytes(&sig))
            .map_err(|_| BundleError::BadSignature)?;
        if let Some(trusted) = trusted
            && trusted != &verifying
        {
            return Err(BundleError::UntrustedSigner);
        }
        let key_id = KeyId(r.array("key id")?);
        let since = Cursor(u64::from_be_bytes(r.array("since")?));
        let cursor = Cursor(u64::from_be_bytes(r.array("cursor")?));
        let day = Day(u32::from_be_bytes(r.array("day")?));
        let count = u32::from_be_bytes(r.array("entry count")?);
        let room = r.0.len() / ENTRY_FIXED_BYTES;
        if count as usize > room {
            return Err(BundleError::TooManyEntries {
                announced: count,
                room,
            });
        }
        let mut entries = Vec::with_capacity(count as usize);
        for index in 0..count as usize {
            entries.push(decode_entry(&mut r, index)?);
        }
        if !r.0.is_empty() {
            return Err(BundleError::TrailingBytes(r.0.len()));
        }
        Ok(Bundle {
            signer,
            key_id,
            since,
            cursor,
            day,
            entries,
        })
    }

    /// Reports in all of one class's entries (every counter and generation). A report is one
    /// counter's histogram, so this counts reports, not agents.
    pub fn reports_of(&self, class: ClassId) -> u64 {
        self.entries
            .iter()
            .filter(|e| e.class == class)
            .map(|e| e.reports)
            .sum()
    }
}

fn decode_entry(r: &mut Reader<'_>, index: usize) -> Result<BundleEntry, BundleError> {
    let class = ClassId(u32::from_be_bytes(r.array("class")?));
    let catalogue = CatalogueVersion(u16::from_be_bytes(r.array("catalogue")?));
    let counter = CounterId(u16::from_be_bytes(r.array("counter")?));
    let generation = Generation(u32::from_be_bytes(r.array("generation")?));
    let reports = u64::from_be_bytes(r.array("reports")?);
    let samples = u64::from_be_bytes(r.array("samples")?);
    let [n] = r.array::<1>("ciphertext count")?;
    let len = usize::from(u16::from_be_bytes(r.array("ciphertext length")?));
    let n = usize::from(n);
    if n == 0 || n > MAX_CIPHERTEXTS {
        return Err(BundleError::Entry {
            index,
            source: WireError::CiphertextCount(n),
        });
    }
    let bytes = r.bytes(n * len, "sums")?;
    let sums = PackedBytes::new(bytes.to_vec(), n)
        .map_err(|source| BundleError::Entry { index, source })?;
    Ok(BundleEntry {
        class,
        catalogue,
        counter,
        generation,
        reports,
        samples,
        sums,
    })
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn bytes(&mut self, n: usize, field: &'static str) -> Result<&'a [u8], BundleError> {
        if self.0.len() < n {
            return Err(BundleError::Truncated(field));
        }
        let (head, tail) = self.0.split_at(n);
        self.0 = tail;
        Ok(head)
    }

    fn array<const N: usize>(&mut self, field: &'static str) -> Result<[u8; N], BundleError> {
        let (head, tail) = self
            .0
            .split_first_chunk::<N>()
            .ok_or(BundleError::Truncated(field))?;
        self.0 = tail;
        Ok(*head)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn bundle() -> Bundle {
        Bundle {
            signer: [0; 32],
            key_id: KeyId([7; 32]),
            since: Cursor(3),
            cursor: Cursor(9),
            day: Day(20_000),
            entries: (0..3)
                .map(|i| BundleEntry {
                    class: ClassId(i),
                    catalogue: CatalogueVersion(1),
                    counter: CounterId(i as u16 + 4),
                    generation: Generation(0),
                    reports: 10 + u64::from(i),
                    samples: 1000,
                    sums: PackedBytes::new(vec![i as u8 + 1; 64], 2).unwrap(),
                })
                .collect(),
        }
    }

    fn key(seed: u8) -> SigningKey {
        SigningKey::from_bytes(&[seed; 32])
    }

    #[test]
    fn round_trip_verifies_under_the_signer() {
        let key = key(1);
        let bytes = bundle().sign(&key).unwrap();
        let decoded = Bundle::verify(&bytes, Some(&key.verifying_key())).unwrap();
        let mut expected = bundle();
        expected.signer = *key.verifying_key().as_bytes();
        assert_eq!(decoded, expected);
        assert_eq!(decoded.reports_of(ClassId(2)), 12);
    }

    #[test]
    fn any_flipped_byte_is_refused() {
        let key = key(1);
        let bytes = bundle().sign(&key).unwrap();
        for i in 0..bytes.len() {
            let mut altered = bytes.clone();
            altered[i] ^= 0x01;
            assert!(Bundle::verify(&altered, None).is_err(), "byte {i}");
        }
        for cut in 0..bytes.len() {
            assert!(Bundle::verify(&bytes[..cut], None).is_err(), "cut {cut}");
        }
    }

    #[test]
    fn another_servers_bundle_is_untrusted() {
        let bytes = bundle().sign(&key(1)).unwrap();
        assert_eq!(
            Bundle::verify(&bytes, Some(&key(2).verifying_key())),
            Err(BundleError::UntrustedSigner)
        );
    }

    #[test]
    fn re_signed_alterations_are_still_refused_by_a_pinned_key() {
        // An attacker who changes a count and re-signs with their own key is caught by pinning.
        let mut altered = bundle();
        altered.entries[0].reports = 1_000_000;
        let bytes = altered.sign(&key(3)).unwrap();
        assert!(Bundle::verify(&bytes, None).is_ok());
        assert_eq!(
            Bundle::verify(&bytes, Some(&key(1).verifying_key())),
            Err(BundleError::UntrustedSigner)
        );
    }
}
