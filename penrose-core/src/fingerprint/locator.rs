//! The locator: band keys over full MinHash values, so that the aggregator finds a snippet's
//! class among any number of classes by a fixed number of look-ups.
//!
//! **Why a report carries it.** The snippet hash keeps 2 bits of each MinHash value, and two
//! unrelated snippets agree on a 2-bit value one time in four. Any banding of those values
//! therefore has to choose between recall at tau and selectivity: bands of 3 values (the
//! longest that still find a pair at tau = 0.46 with probability 0.99) let an unrelated class
//! through with probability about 0.4, so placement cost grows with the number of classes
//! (measured in `docs/benchmarks.md`, "Placement at fleet scale"). No server-side index over
//! 2-bit values escapes this: the collision probabilities at tau and at 0 (0.595 and 0.25 per
//! value) fix the exponent of any LSH scheme at ln(1/0.595) / ln(1/0.25) = 0.37, so cost grows
//! as N^0.37 at best (5.5x from 1,000 to 100,000 classes).
//!
//! Full MinHash values of unrelated snippets agree only by a 2^-64 accident, so a band of two
//! of them separates: a pair at weighted Jaccard J shares a band with probability J^2, and
//! [`LOCATOR_BANDS`] = 50 disjoint bands (all 100 values) find a pair at J = tau = 0.46 with
//! probability 1 - (1 - 0.46^2)^50 > 0.99999, and at J = 0.33 (an estimate of 0.46 two standard
//! deviations high) with probability 0.997, while an unrelated class shares a band only
//! through a 32-bit key collision (50 x 2^-32 per representative).
//!
//! **What it reveals** (docs/threat-model.md, "The locator"). A band key is the first 32 bits
//! of SHA-256 over the band index and the band's two 64-bit minima: it does not give the
//! minima, and so not the shingles, back. What it does give is *equality*: the server learns
//! that two snippets have the same two minima in a band, where the snippet hash alone says that
//! two 2-bit values agree (true one time in four by chance). Someone holding a reference
//! window (their own run of an application) can therefore test a report against it more
//! sharply than with the hash: about 2^-32 false matches per band instead of 1/4 per value.
//! That sharpens what the classes already tell (which application a report belongs to); it
//! tells nothing about who sent it, and it is computed from the same shingles as the hash, so
//! a name that is not in the window cannot show up in it.

use sha2::{Digest, Sha256};

use super::minhash::MinHashSignature;
use super::params::FingerprintParams;

/// Bands a locator carries: one per pair of the k = 100 MinHash values.
pub const LOCATOR_BANDS: usize = 50;

/// MinHash values per band.
pub const ROWS_PER_BAND: usize = 2;

/// Bytes of a locator on the wire.
pub const LOCATOR_BYTES: usize = LOCATOR_BANDS * 4;

/// Domain separation of the band digests.
const DOMAIN: &[u8] = b"penrose locator v1";

/// One 32-bit key per band.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Locator(pub [u32; LOCATOR_BANDS]);

impl std::fmt::Debug for Locator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Locator({:08x}..)", self.0[0])
    }
}

/// A band key together with its band: the key of the aggregator's candidate table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LocatorKey(pub u64);

impl Locator {
    /// The locator of a signature. Bands whose values the signature lacks (k < 100) are 0 and
    /// ignored by [`Locator::keys`].
    pub fn from_signature(signature: &MinHashSignature) -> Self {
        let mut out = [0u32; LOCATOR_BANDS];
        for (band, slot) in out.iter_mut().enumerate() {
            let first = band * ROWS_PER_BAND;
            let Some(values) = signature.0.get(first..first + ROWS_PER_BAND) else {
                break;
            };
            let mut hasher = Sha256::new();
            hasher.update(DOMAIN);
            hasher.update((band as u32).to_be_bytes());
            for value in values {
                hasher.update(value.to_be_bytes());
            }
            let digest: [u8; 32] = hasher.finalize().into();
            *slot = u32::from_be_bytes([digest[0], digest[1], digest[2], digest[3]]);
        }
        Self(out)
    }

    /// Bands that carry a key under `params` (k / 2, at most [`LOCATOR_BANDS`]).
    pub fn bands(params: &FingerprintParams) -> usize {
        (params.num_hashes / ROWS_PER_BAND).min(LOCATOR_BANDS)
    }

    /// The keys to look up or index: the band number with its key, so that equal keys of
    /// different bands do not meet.
    pub fn keys(&self, params: &FingerprintParams) -> impl Iterator<Item = LocatorKey> + '_ {
        self.0
            .iter()
            .take(Self::bands(params))
            .enumerate()
            .map(|(band, &key)| LocatorKey(((band as u64) << 32) | u64::from(key)))
    }

    /// Probability that two snippets at weighted Jaccard `j` share at least one band.
    pub fn candidate_probability(j: f64, params: &FingerprintParams) -> f64 {
        let band = j.clamp(0.0, 1.0).powi(ROWS_PER_BAND as i32);
        1.0 - (1.0 - band).powi(Self::bands(params) as i32)
    }

    /// The wire form: the keys big-endian, in band order.
    pub fn to_bytes(&self) -> [u8; LOCATOR_BYTES] {
        let mut out = [0u8; LOCATOR_BYTES];
        for (chunk, key) in out.chunks_exact_mut(4).zip(self.0) {
            chunk.copy_from_slice(&key.to_be_bytes());
        }
        out
    }

    /// Reads the wire form; every 200-byte value is a locator (a server cannot tell a forged
    /// one, and needs not: a candidate it names is confirmed with the snippet hash).
    pub fn from_bytes(bytes: &[u8; LOCATOR_BYTES]) -> Self {
        let mut out = [0u32; LOCATOR_BANDS];
        for (key, chunk) in out.iter_mut().zip(bytes.chunks_exact(4)) {
            *key = u32::from_be_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
        }
        Self(out)
    }
}

/// What a report carries about its snippet: the hash the server compares, and the locator it
/// searches with. Both come from one signature.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Fingerprint {
    /// The 256-bit b-bit MinHash hash.
    pub hash: super::SnippetHash,
    /// The band keys.
    pub locator: Locator,
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn signature(seed: u64) -> MinHashSignature {
        MinHashSignature((0..100).map(|i| seed.wrapping_mul(1_000_003) + i).collect())
    }

    #[test]
    fn equal_values_give_equal_keys_and_one_changed_value_changes_one_band() {
        let a = signature(1);
        let mut b = a.clone();
        b.0[7] ^= 1;
        let (la, lb) = (Locator::from_signature(&a), Locator::from_signature(&b));
        assert_eq!(la, Locator::from_signature(&a));
        let differing: Vec<usize> = (0..LOCATOR_BANDS).filter(|&i| la.0[i] != lb.0[i]).collect();
        assert_eq!(differing, vec![3]);
    }

    #[test]
    fn keys_name_their_band_and_follow_k() {
        let params = FingerprintParams::default();
        let l = Locator::from_signature(&signature(2));
        let keys: Vec<LocatorKey> = l.keys(&params).collect();
        assert_eq!(keys.len(), 50);
        assert_eq!(keys[3].0 >> 32, 3);
        assert_eq!(keys[3].0 as u32, l.0[3]);
        let small = FingerprintParams {
            num_hashes: 20,
            ..params
        };
        let short = Locator::from_signature(&MinHashSignature(signature(2).0[..20].to_vec()));
        assert_eq!(short.keys(&small).count(), 10);
        assert!(short.0[10..].iter().all(|&k| k == 0));
    }

    #[test]
    fn bytes_round_trip() {
        let l = Locator::from_signature(&signature(3));
        assert_eq!(Locator::from_bytes(&l.to_bytes()), l);
    }

    #[test]
    fn recall_at_tau_and_below() {
        let params = FingerprintParams::default();
        assert!(Locator::candidate_probability(params.tau, &params) > 0.99999);
        assert!(Locator::candidate_probability(0.33, &params) > 0.99);
        assert!(Locator::candidate_probability(0.0, &params) == 0.0);
    }
}
