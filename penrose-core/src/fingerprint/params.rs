//! Fingerprint parameters and their defaults.
//!
//! The paper we compete with uses 8-grams, k = 100 MinHash functions and tau = 0.85 over shingle
//! sets. Our defaults come from `cargo xtask eval-fingerprints` on real traces (results and
//! reasoning in `docs/evaluation.md`): over shingle *sets*, 1% of perturbed launches already
//! drops same-application similarity below 0.85, so we use weighted MinHash over shingle
//! counts, 4-grams (which survive perturbation far better than 8-grams) and tau = 0.46, the
//! lowest threshold at which the 256-bit hash of an unrelated snippet (true similarity 0.05)
//! matches a given class of up to 8 representatives with probability below 1e-9. Every parameter can be changed: the usual
//! advice when unrelated applications collide is to raise k (for example to 150).

/// Length of a shingle in kernel names (the paper: 8).
pub const DEFAULT_NGRAM_LEN: usize = 4;

/// Number of MinHash functions (k), as in the paper; 2 bits of each fit in the snippet hash.
pub const DEFAULT_NUM_HASHES: usize = 100;

/// Estimated (weighted) Jaccard similarity at or above which two snippets are the same
/// application (the paper: 0.85 over sets).
pub const DEFAULT_TAU: f64 = 0.46;

/// Whether MinHash runs over shingle sets or shingle counts (the paper: sets).
pub const DEFAULT_WEIGHTING: Weighting = Weighting::Counts;

/// Size of the snippet hash a report carries.
pub const SNIPPET_HASH_BITS: usize = 256;

/// What the MinHash values summarise.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Weighting {
    /// The set of distinct shingles: estimates set Jaccard |A ∩ B| / |A ∪ B|.
    Set,
    /// The multiset of shingles with their counts: estimates weighted Jaccard
    /// Σ min(a, b) / Σ max(a, b), which a few perturbed launches move much less.
    Counts,
}

/// Why a parameter set is unusable.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ParamsError {
    /// Shingles need at least one name.
    #[error("n-gram length must be at least 1")]
    ZeroNgram,
    /// Every MinHash value needs at least one bit of the snippet hash.
    #[error("number of hashes must be between 1 and {SNIPPET_HASH_BITS}, got {0}")]
    NumHashes(usize),
    /// tau is a similarity.
    #[error("tau must lie in [0, 1], got {0}")]
    Tau(f64),
}

/// The fingerprint's parameters. Agents and the aggregator must use the same values.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FingerprintParams {
    /// Shingle length n in kernel names. Shorter shingles survive perturbation better but are
    /// easier to reverse by enumerating name tuples.
    pub ngram_len: usize,
    /// Number of MinHash functions k; each gets `256 / k` bits of the snippet hash.
    pub num_hashes: usize,
    /// Same-application threshold on estimated similarity.
    pub tau: f64,
    /// Set or weighted MinHash.
    pub weighting: Weighting,
}

impl Default for FingerprintParams {
    fn default() -> Self {
        Self {
            ngram_len: DEFAULT_NGRAM_LEN,
            num_hashes: DEFAULT_NUM_HASHES,
            tau: DEFAULT_TAU,
            weighting: DEFAULT_WEIGHTING,
        }
    }
}

impl FingerprintParams {
    /// Checks that the parameters can be encoded in a snippet hash.
    pub fn validate(&self) -> Result<(), ParamsError> {
        if self.ngram_len == 0 {
            return Err(ParamsError::ZeroNgram);
        }
        if !(1..=SNIPPET_HASH_BITS).contains(&self.num_hashes) {
            return Err(ParamsError::NumHashes(self.num_hashes));
        }
        if !(0.0..=1.0).contains(&self.tau) {
            return Err(ParamsError::Tau(self.tau));
        }
        Ok(())
    }

    /// Bits kept of each MinHash value in the snippet hash (b of b-bit MinHash): as many as fit,
    /// at most 64. k = 100 gives b = 2 (200 of 256 bits used); k = 150 gives b = 1.
    pub fn bits_per_value(&self) -> u32 {
        let bits = SNIPPET_HASH_BITS / self.num_hashes.max(1);
        bits.clamp(1, 64) as u32
    }

    /// Probability that two b-bit values agree although their MinHash values differ: the
    /// chance collision the estimator subtracts.
    pub fn chance_collision(&self) -> f64 {
        (-f64::from(self.bits_per_value())).exp2()
    }

    /// Standard deviation of the snippet-hash Jaccard estimate when the true similarity is `j`:
    /// the k b-bit matches are Bernoulli with p = j + (1 - j) r, and the estimate rescales p̂
    /// by 1 / (1 - r).
    pub fn estimate_std_dev(&self, j: f64) -> f64 {
        let r = self.chance_collision();
        let p = j + (1.0 - j) * r;
        (p * (1.0 - p) / self.num_hashes as f64).sqrt() / (1.0 - r)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_fit_256_bits() {
        let p = FingerprintParams::default();
        p.validate().unwrap();
        assert!(p.num_hashes * p.bits_per_value() as usize <= SNIPPET_HASH_BITS);
    }

    #[test]
    fn bits_per_value_follows_k() {
        let with_k = |num_hashes| FingerprintParams {
            num_hashes,
            ..FingerprintParams::default()
        };
        assert_eq!(with_k(100).bits_per_value(), 2);
        assert_eq!(with_k(150).bits_per_value(), 1);
        assert_eq!(with_k(64).bits_per_value(), 4);
        assert_eq!(with_k(4).bits_per_value(), 64);
        assert!(with_k(257).validate().is_err());
        assert!(with_k(0).validate().is_err());
    }
}
