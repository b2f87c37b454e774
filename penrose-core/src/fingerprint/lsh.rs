//! LSH banding of snippet hashes, for candidate search.
//!
//! The k b-bit values are cut into bands of r values; two hashes become candidates when any
//! band agrees entirely. A pair at similarity J agrees on one value with probability
//! p = J + (1 - J) 2^-b, on a band with p^r, and is a candidate with 1 - (1 - p^r)^bands.
//! [`LshBands::for_params`] takes the longest bands that still find a pair at tau with
//! probability [`MIN_RECALL_AT_TAU`], so that as few unrelated classes as possible come back as
//! candidates. With the defaults (k = 100, b = 2, tau = 0.46) that is 33 bands of 3 values, and
//! an unrelated class (J = 0) is still a candidate with probability about 0.4: the index halves
//! the comparisons rather than removing them, and candidates are always confirmed with the
//! estimator.

use sha2::{Digest, Sha256};

use super::params::FingerprintParams;
use super::snippet::SnippetHash;

/// Probability with which a pair at exactly tau must become a candidate.
pub const MIN_RECALL_AT_TAU: f64 = 0.99;

/// The key of one band: an index into the aggregator's candidate table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BandKey(pub u64);

/// How snippet hashes are cut into bands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LshBands {
    /// Values per band (r).
    pub rows_per_band: usize,
    /// Number of bands; `rows_per_band * bands <= k`.
    pub bands: usize,
}

impl LshBands {
    /// The longest bands that keep recall at tau >= [`MIN_RECALL_AT_TAU`].
    pub fn for_params(params: &FingerprintParams) -> Self {
        let k = params.num_hashes.max(1);
        let mut best = Self {
            rows_per_band: 1,
            bands: k,
        };
        for rows in 1..=k {
            let candidate = Self {
                rows_per_band: rows,
                bands: k / rows,
            };
            if candidate.candidate_probability(params.tau, params) >= MIN_RECALL_AT_TAU {
                best = candidate;
            }
        }
        best
    }

    /// Probability that two hashes at similarity `j` share at least one band.
    pub fn candidate_probability(&self, j: f64, params: &FingerprintParams) -> f64 {
        let p = j + (1.0 - j) * params.chance_collision();
        let band = p.powi(self.rows_per_band as i32);
        1.0 - (1.0 - band).powi(self.bands as i32)
    }

    /// The band keys of a hash; equal keys mean a candidate pair. The band index is part of the
    /// key so that equal values in different bands do not collide.
    pub fn band_keys(&self, hash: &SnippetHash, params: &FingerprintParams) -> Vec<BandKey> {
        let bits = params.bits_per_value();
        (0..self.bands)
            .map(|band| {
                let mut hasher = Sha256::new();
                hasher.update((band as u64).to_le_bytes());
                for row in 0..self.rows_per_band {
                    let value = hash.value(band * self.rows_per_band + row, bits);
                    hasher.update(value.to_le_bytes());
                }
                let digest: [u8; 32] = hasher.finalize().into();
                let mut first = [0u8; 8];
                first.copy_from_slice(&digest[..8]);
                BandKey(u64::from_le_bytes(first))
            })
            .collect()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::fingerprint::Fingerprinter;

    #[test]
    fn recall_at_tau_and_selectivity_far_below() {
        let params = FingerprintParams::default();
        let lsh = LshBands::for_params(&params);
        assert!(lsh.rows_per_band * lsh.bands <= params.num_hashes);
        assert!(lsh.candidate_probability(params.tau, &params) >= MIN_RECALL_AT_TAU);
        // With 2-bit values and a low tau the bands are short, so pruning is modest: an
        // unrelated class (J = 0) comes back as a candidate less than half the time.
        assert!(lsh.candidate_probability(0.0, &params) < 0.5);
        assert!(
            lsh.candidate_probability(0.0, &params)
                < lsh.candidate_probability(params.tau, &params)
        );
    }

    #[test]
    fn default_bands() {
        let lsh = LshBands::for_params(&FingerprintParams::default());
        assert_eq!((lsh.rows_per_band, lsh.bands), (3, 33));
    }

    #[test]
    fn equal_hashes_share_all_bands_unrelated_few() {
        let params = FingerprintParams::default();
        let f = Fingerprinter::new(params).unwrap();
        let lsh = LshBands::for_params(&params);
        let a: Vec<String> = (0..3000).map(|i| format!("k{}", i % 53)).collect();
        let b: Vec<String> = (0..3000).map(|i| format!("z{}", (i * 7) % 61)).collect();
        let (ka, kb) = (
            lsh.band_keys(&f.snippet_hash(&a), &params),
            lsh.band_keys(&f.snippet_hash(&b), &params),
        );
        assert_eq!(ka, lsh.band_keys(&f.snippet_hash(&a), &params));
        let shared = ka.iter().zip(&kb).filter(|(x, y)| x == y).count();
        assert!(shared < lsh.bands / 2, "{shared} of {}", lsh.bands);
    }
}
