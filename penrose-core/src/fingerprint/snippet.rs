//! The 256-bit snippet hash and its Jaccard estimator.
//!
//! b-bit MinHash: of each of the k MinHash values only the lowest b = 256 / k bits are kept
//! (k = 100: b = 2, 200 bits used, the rest zero). Two b-bit values agree when the MinHash
//! values agree (probability J) or by chance (probability r = 2^-b otherwise), so the share
//! of agreeing values p̂ estimates J + (1 - J) r and Ĵ = (p̂ - r) / (1 - r). Keeping few bits
//! also means a report reveals little about any single minimum shingle.
//!
//! Not every 256-bit value is a snippet hash: [`SnippetHash::check`] refuses the ones the
//! fingerprinter cannot produce (unused bits set, all values equal), which the aggregation
//! server uses to turn away hand-made hashes before they touch its tables.

use thiserror::Error;

use super::locator::{Fingerprint, Locator};
use super::minhash::{MinHashSignature, MinHasher};
use super::params::{FingerprintParams, ParamsError, SNIPPET_HASH_BITS};
use super::shingle::{Element, ShingleKey, shingle_keys, shingle_keys_of_elements};

/// The 256-bit fingerprint of a snippet carried in reports: b-bit MinHash values packed from
/// bit 0 upwards (value i at bits i*b .. (i+1)*b, little-endian within bytes).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SnippetHash(pub [u8; 32]);

crate::hex::text_id!(SnippetHash, "snippet hash");

/// Why 256 bits cannot be a snippet hash of the given parameters ([`SnippetHash::check`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Error)]
pub enum MalformedSnippet {
    /// A bit beyond the k b-bit values is set; the fingerprinter leaves those bits zero.
    #[error("bit {first} is set, but a snippet hash uses only bits 0 to {}", used - 1)]
    UnusedBits {
        /// The lowest unused bit that is set.
        first: usize,
        /// Bits in use (k x b).
        used: usize,
    },
    /// All k b-bit values are the same: all zeros, or the hash of an empty window (every
    /// minimum u64::MAX, so every value all ones). A real window's values are those of k
    /// independent hash functions, so this happens by chance with probability 2^-(b (k - 1))
    /// (2^-198 for the shipped k = 100, b = 2).
    #[error("all {k} values are {value}")]
    Constant {
        /// The number of values (k).
        k: usize,
        /// The value every field holds.
        value: u64,
    },
}

impl SnippetHash {
    /// Whether these bits can be a snippet hash made with `params` (k values of b bits from
    /// bit 0, the rest zero, not all values equal). Cheap: a few word operations.
    pub fn check(&self, params: &FingerprintParams) -> Result<(), MalformedSnippet> {
        let bits = params.bits_per_value();
        let k = params
            .num_hashes
            .clamp(1, SNIPPET_HASH_BITS / bits as usize);
        let used = k * bits as usize;
        if let Some(first) = (used..SNIPPET_HASH_BITS).find(|&pos| self.bit(pos)) {
            return Err(MalformedSnippet::UnusedBits { first, used });
        }
        // With one value nothing can be compared; every parameter set the tiers ship has many.
        let value = self.value(0, bits);
        if k > 1 && (1..k).all(|i| self.value(i, bits) == value) {
            return Err(MalformedSnippet::Constant { k, value });
        }
        Ok(())
    }

    fn bit(&self, pos: usize) -> bool {
        (self.0[pos / 8] >> (pos % 8)) & 1 == 1
    }

    /// Keeps the lowest `bits` bits of each MinHash value that fits in 256 bits.
    pub fn from_signature(signature: &MinHashSignature, bits: u32) -> Self {
        let bits = bits.clamp(1, 64) as usize;
        let mut out = [0u8; 32];
        for (i, &value) in signature.0.iter().enumerate() {
            let start = i * bits;
            if start + bits > out.len() * 8 {
                break;
            }
            for bit in 0..bits {
                if (value >> bit) & 1 == 1 {
                    let pos = start + bit;
                    out[pos / 8] |= 1 << (pos % 8);
                }
            }
        }
        Self(out)
    }

    /// The `index`-th b-bit value.
    pub fn value(&self, index: usize, bits: u32) -> u64 {
        let bits = bits.clamp(1, 64) as usize;
        let mut v = 0u64;
        for bit in 0..bits {
            let pos = index * bits + bit;
            if pos < 256 && (self.0[pos / 8] >> (pos % 8)) & 1 == 1 {
                v |= 1 << bit;
            }
        }
        v
    }

    /// Share of the k b-bit values that agree (before chance correction).
    pub fn agreement(&self, other: &Self, params: &FingerprintParams) -> f64 {
        let bits = params.bits_per_value();
        let k = params.num_hashes.min(256 / bits as usize);
        if k == 0 {
            return 0.0;
        }
        let same = if bits.is_power_of_two() {
            self.agreeing_fields(other, bits, k)
        } else {
            (0..k)
                .filter(|&i| self.value(i, bits) == other.value(i, bits))
                .count()
        };
        same as f64 / k as f64
    }

    /// Counts equal b-bit fields among the first `k` with word operations (b a power of two,
    /// so no field straddles a 64-bit word): the aggregator compares many pairs.
    fn agreeing_fields(&self, other: &Self, bits: u32, k: usize) -> usize {
        let per_word = (64 / bits) as usize;
        let mut field_starts = 0u64;
        for i in 0..per_word {
            field_starts |= 1 << (i as u32 * bits);
        }
        let mut same = 0;
        for word in 0..4 {
            let first_field = word * per_word;
            if first_field >= k {
                break;
            }
            let mut a = [0u8; 8];
            let mut b = [0u8; 8];
            a.copy_from_slice(&self.0[word * 8..word * 8 + 8]);
            b.copy_from_slice(&other.0[word * 8..word * 8 + 8]);
            // A field differs iff any of its bits differs: fold each field's bits onto its
            // lowest bit.
            let mut diff = u64::from_le_bytes(a) ^ u64::from_le_bytes(b);
            let mut shift = 1;
            while shift < bits {
                diff |= diff >> shift;
                shift *= 2;
            }
            let fields = per_word.min(k - first_field);
            let mask = if fields == per_word {
                field_starts
            } else {
                field_starts & ((1u64 << (fields as u32 * bits)) - 1)
            };
            same += fields - (diff & mask).count_ones() as usize;
        }
        same
    }

    /// Estimated Jaccard similarity (set or weighted, as the hashes were made), corrected for
    /// chance b-bit collisions and clamped to [0, 1]. Its standard deviation is
    /// [`FingerprintParams::estimate_std_dev`].
    pub fn estimate_jaccard(&self, other: &Self, params: &FingerprintParams) -> f64 {
        let r = params.chance_collision();
        ((self.agreement(other, params) - r) / (1.0 - r)).clamp(0.0, 1.0)
    }
}

/// Turns kernel-name sequences into fingerprints with one fixed parameter set.
#[derive(Clone, Debug)]
pub struct Fingerprinter {
    params: FingerprintParams,
    hasher: MinHasher,
}

impl Fingerprinter {
    /// A fingerprinter for valid parameters.
    pub fn new(params: FingerprintParams) -> Result<Self, ParamsError> {
        params.validate()?;
        Ok(Self {
            params,
            hasher: MinHasher::new(params.num_hashes),
        })
    }

    /// The parameters in use.
    pub fn params(&self) -> &FingerprintParams {
        &self.params
    }

    /// Full 64-bit MinHash values of a snippet (kept by the agent's local clustering; never
    /// sent).
    pub fn signature<S: AsRef<str>>(&self, names: &[S]) -> MinHashSignature {
        self.signature_of_keys(&shingle_keys(names, self.params.ngram_len))
    }

    /// Like [`Self::signature`] for a snippet whose launches are names or precomputed digests
    /// (launch shapes); a snippet of names only gives [`Self::signature`]'s values.
    pub fn signature_of_elements(&self, elements: &[Element<'_>]) -> MinHashSignature {
        self.signature_of_keys(&shingle_keys_of_elements(elements, self.params.ngram_len))
    }

    /// Like [`Self::signature`] for shingles already computed.
    pub fn signature_of_keys(&self, keys: &[ShingleKey]) -> MinHashSignature {
        self.hasher.signature(keys, self.params.weighting)
    }

    /// The snippet hash of a kernel-name sequence.
    pub fn snippet_hash<S: AsRef<str>>(&self, names: &[S]) -> SnippetHash {
        self.encode(&self.signature(names))
    }

    /// The snippet hash of a sequence of names and precomputed digests.
    pub fn snippet_hash_of_elements(&self, elements: &[Element<'_>]) -> SnippetHash {
        self.encode(&self.signature_of_elements(elements))
    }

    /// Packs a signature into a snippet hash.
    pub fn encode(&self, signature: &MinHashSignature) -> SnippetHash {
        SnippetHash::from_signature(signature, self.params.bits_per_value())
    }

    /// What a report carries about a snippet: its hash and its locator.
    pub fn fingerprint(&self, signature: &MinHashSignature) -> Fingerprint {
        Fingerprint {
            hash: self.encode(signature),
            locator: Locator::from_signature(signature),
        }
    }

    /// The fingerprint of a sequence of names and precomputed digests.
    pub fn fingerprint_of_elements(&self, elements: &[Element<'_>]) -> Fingerprint {
        self.fingerprint(&self.signature_of_elements(elements))
    }

    /// The fingerprint of a kernel-name sequence.
    pub fn fingerprint_of_names<S: AsRef<str>>(&self, names: &[S]) -> Fingerprint {
        self.fingerprint(&self.signature(names))
    }

    /// Estimated Jaccard similarity of two snippet hashes.
    pub fn similarity(&self, a: &SnippetHash, b: &SnippetHash) -> f64 {
        a.estimate_jaccard(b, &self.params)
    }

    /// Whether two snippets are taken for the same application (estimate >= tau).
    pub fn same_application(&self, a: &SnippetHash, b: &SnippetHash) -> bool {
        self.similarity(a, b) >= self.params.tau
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn packing_round_trips() {
        let sig = MinHashSignature((0..100u64).map(|i| i * 7 + 1).collect());
        let hash = SnippetHash::from_signature(&sig, 2);
        for (i, v) in sig.0.iter().enumerate() {
            assert_eq!(hash.value(i, 2), v & 3);
        }
        // Bits past k * b stay zero.
        assert!(hash.0[25..].iter().all(|&b| b == 0));
    }

    #[test]
    fn real_snippet_hashes_pass_the_check_and_hand_made_ones_fail() {
        let params = FingerprintParams::default();
        let f = Fingerprinter::new(params).unwrap();
        // Real windows of every length, down to one launch (a single shingle).
        for len in [1, 2, 3, 4, 10, 1_000] {
            let names: Vec<String> = (0..len).map(|i| format!("k{}", i % 37)).collect();
            assert_eq!(f.snippet_hash(&names).check(&params), Ok(()), "len {len}");
        }
        let good = f.snippet_hash(&["a", "b", "c", "d", "e"]);
        // Any bit at or past k * b = 200.
        for pos in [200, 201, 207, 208, 255] {
            let mut bad = good;
            bad.0[pos / 8] |= 1 << (pos % 8);
            assert_eq!(
                bad.check(&params),
                Err(MalformedSnippet::UnusedBits {
                    first: pos,
                    used: 200
                })
            );
        }
        // All zeros, all ones, the hash of an empty window (every value all ones), and any
        // other constant.
        let empty = f.snippet_hash::<&str>(&[]);
        assert_eq!(
            empty.check(&params),
            Err(MalformedSnippet::Constant { k: 100, value: 3 })
        );
        assert_eq!(
            SnippetHash([0; 32]).check(&params),
            Err(MalformedSnippet::Constant { k: 100, value: 0 })
        );
        assert!(matches!(
            SnippetHash([0xff; 32]).check(&params),
            Err(MalformedSnippet::UnusedBits { first: 200, .. })
        ));
        let mut twos = [0u8; 32];
        twos[..25].fill(0b1010_1010);
        assert_eq!(
            SnippetHash(twos).check(&params),
            Err(MalformedSnippet::Constant { k: 100, value: 2 })
        );
        // One value off the constant is enough to pass.
        twos[24] = 0b0110_1010;
        assert_eq!(SnippetHash(twos).check(&params), Ok(()));
        // With k = 150, b = 1 bits 150.. are the unused ones.
        let wide = FingerprintParams {
            num_hashes: 150,
            ..params
        };
        let wide_hash = Fingerprinter::new(wide)
            .unwrap()
            .snippet_hash(&["a", "b", "c", "d"]);
        assert_eq!(wide_hash.check(&wide), Ok(()));
        let mut high = wide_hash;
        high.0[18] |= 1 << 6; // bit 150
        assert_eq!(
            high.check(&wide),
            Err(MalformedSnippet::UnusedBits {
                first: 150,
                used: 150
            })
        );
    }

    #[test]
    fn word_agreement_matches_field_by_field() {
        for bits in [1u32, 2, 4, 8, 16, 32, 64] {
            let k = 256 / bits as usize;
            let a = SnippetHash(std::array::from_fn(|i| (i as u8).wrapping_mul(37)));
            let b = SnippetHash(std::array::from_fn(|i| {
                if i % 3 == 0 {
                    (i as u8).wrapping_mul(37)
                } else {
                    i as u8
                }
            }));
            for k in [1, k / 2 + 1, k] {
                let slow = (0..k)
                    .filter(|&i| a.value(i, bits) == b.value(i, bits))
                    .count();
                assert_eq!(a.agreeing_fields(&b, bits, k), slow, "bits {bits} k {k}");
            }
        }
    }

    #[test]
    fn identical_snippets_estimate_one_and_unrelated_near_zero() {
        let f = Fingerprinter::new(FingerprintParams::default()).unwrap();
        let a: Vec<String> = (0..2000).map(|i| format!("k{}", i % 37)).collect();
        let b: Vec<String> = (0..2000).map(|i| format!("z{}", i % 41)).collect();
        let (ha, hb) = (f.snippet_hash(&a), f.snippet_hash(&b));
        assert_eq!(f.similarity(&ha, &ha), 1.0);
        assert!(f.same_application(&ha, &ha));
        let sd = f.params().estimate_std_dev(0.0);
        assert!(
            f.similarity(&ha, &hb) <= 4.0 * sd,
            "{}",
            f.similarity(&ha, &hb)
        );
    }
}
