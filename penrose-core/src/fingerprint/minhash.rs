//! MinHash over shingle keys, set or weighted.
//!
//! Weighted MinHash for integer counts: the i-th occurrence of a shingle becomes its own element
//! `(shingle, i)`, and set MinHash over those elements estimates Σ min(a, b) / Σ max(a, b)
//! exactly in expectation (the multiset Jaccard). Counts here are small (a shingle occurs a few
//! times per window), so this costs about as much as set MinHash over the window.

use super::params::Weighting;
use super::shingle::ShingleKey;

/// Seed of the hash family. Every agent and server must derive the same functions, so it is a
/// constant, not a secret; changing it changes every snippet hash.
const FAMILY_SEED: u64 = 0x5045_4e52_4f53_4531; // "PENROSE1"

/// Separates occurrence numbers of a repeated shingle (the 64-bit golden ratio).
const OCCURRENCE_STRIDE: u64 = 0x9e37_79b9_7f4a_7c15;

/// The splitmix64 finaliser: a bijection on u64 with full avalanche, used both to expand seeds
/// and as the hash family `h_s(x) = mix(x ^ s)`.
#[inline]
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The k minima: one per hash function. The probability that two signatures agree at a
/// position is the (set or weighted) Jaccard similarity of what they summarise.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct MinHashSignature(pub Vec<u64>);

impl MinHashSignature {
    /// Share of positions that agree: an unbiased Jaccard estimate with variance J(1-J)/k.
    pub fn similarity(&self, other: &Self) -> f64 {
        let k = self.0.len().min(other.0.len());
        if k == 0 {
            return 0.0;
        }
        let same = self.0.iter().zip(&other.0).filter(|(a, b)| a == b).count();
        same as f64 / k as f64
    }
}

/// k hash functions, fixed for a given k.
#[derive(Clone, Debug)]
pub struct MinHasher {
    seeds: Vec<u64>,
}

impl MinHasher {
    /// The family of `num_hashes` functions every tier shares.
    pub fn new(num_hashes: usize) -> Self {
        let seeds = (1..=num_hashes as u64)
            .map(|i| mix(FAMILY_SEED.wrapping_add(i.wrapping_mul(OCCURRENCE_STRIDE))))
            .collect();
        Self { seeds }
    }

    /// Number of hash functions (k).
    pub fn num_hashes(&self) -> usize {
        self.seeds.len()
    }

    /// The signature of a multiset of shingles (as [`super::shingle_keys`] returns it).
    pub fn signature(&self, keys: &[ShingleKey], weighting: Weighting) -> MinHashSignature {
        let mut sorted: Vec<u64> = keys.iter().map(|k| k.0).collect();
        sorted.sort_unstable();
        let mut elements = Vec::with_capacity(sorted.len());
        let mut occurrence = 0u64;
        for (i, &key) in sorted.iter().enumerate() {
            occurrence = if i > 0 && sorted[i - 1] == key {
                occurrence + 1
            } else {
                0
            };
            match weighting {
                Weighting::Set if occurrence > 0 => {}
                _ => elements.push(mix(
                    key.wrapping_add(occurrence.wrapping_mul(OCCURRENCE_STRIDE))
                )),
            }
        }
        self.signature_of_elements(&elements)
    }

    fn signature_of_elements(&self, elements: &[u64]) -> MinHashSignature {
        let mut minima = vec![u64::MAX; self.seeds.len()];
        for &element in elements {
            for (min, &seed) in minima.iter_mut().zip(&self.seeds) {
                *min = (*min).min(mix(element ^ seed));
            }
        }
        MinHashSignature(minima)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(v: &[u64]) -> Vec<ShingleKey> {
        v.iter().copied().map(ShingleKey).collect()
    }

    #[test]
    fn set_ignores_counts_weighted_does_not() {
        let h = MinHasher::new(64);
        let once = keys(&[1, 2, 3]);
        let twice = keys(&[1, 1, 2, 2, 3, 3]);
        assert_eq!(
            h.signature(&once, Weighting::Set),
            h.signature(&twice, Weighting::Set)
        );
        assert_ne!(
            h.signature(&once, Weighting::Counts),
            h.signature(&twice, Weighting::Counts)
        );
        // Order of shingles does not matter.
        let shuffled = keys(&[3, 1, 2, 1, 3, 2]);
        assert_eq!(
            h.signature(&twice, Weighting::Counts),
            h.signature(&shuffled, Weighting::Counts)
        );
    }

    #[test]
    fn disjoint_sets_rarely_agree_and_equal_sets_always_do() {
        let h = MinHasher::new(100);
        let a = h.signature(&keys(&(0..500).collect::<Vec<_>>()), Weighting::Set);
        let b = h.signature(&keys(&(500..1000).collect::<Vec<_>>()), Weighting::Set);
        assert!(a.similarity(&b) < 0.05);
        assert_eq!(a.similarity(&a), 1.0);
    }
}
