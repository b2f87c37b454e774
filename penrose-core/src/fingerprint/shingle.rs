//! n-gram shingles of kernel names, digested with SHA-256.
//!
//! A shingle's digest is SHA-256 over the SHA-256 digests of its n names, so reversing one means
//! enumerating n-tuples of plausible kernel names. MinHash only needs 64 bits of each digest;
//! [`ShingleKey`] keeps those.

use std::collections::HashMap;
use std::hash::Hash;

use sha2::{Digest, Sha256};

/// SHA-256 of one kernel name. Computed once per distinct name, then reused by every shingle
/// that contains it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct NameDigest(pub [u8; 32]);

impl NameDigest {
    /// Digests a kernel name.
    pub fn of(name: &str) -> Self {
        Self(Sha256::digest(name.as_bytes()).into())
    }
}

/// The first 64 bits of a shingle's SHA-256 digest: what MinHash hashes. Distinct shingles
/// collide with probability 2^-64 per pair, far below MinHash's own error.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ShingleKey(pub u64);

impl ShingleKey {
    /// The key of the shingle made of these name digests, in order.
    pub fn of(names: &[NameDigest]) -> Self {
        let mut hasher = Sha256::new();
        for name in names {
            hasher.update(name.0);
        }
        let digest: [u8; 32] = hasher.finalize().into();
        let mut first = [0u8; 8];
        first.copy_from_slice(&digest[..8]);
        Self(u64::from_le_bytes(first))
    }
}

/// The key of every n-gram of `names`, in order (a multiset: repeated shingles repeat). A
/// sequence shorter than n yields one shingle of the whole sequence so that short snippets
/// still have a fingerprint; an empty one yields none.
///
/// A window repeats the same few n-grams many times, so each distinct name is digested once
/// and each distinct n-gram (recognised by the positions of its names in that list) once.
pub fn shingle_keys<S: AsRef<str>>(names: &[S], ngram_len: usize) -> Vec<ShingleKey> {
    memoised_keys(names.iter().map(AsRef::as_ref), ngram_len, |name: &&str| {
        NameDigest::of(name)
    })
}

/// One launch of a snippet as the shingler sees it: a kernel name (or a name-like label such as
/// an identity), digested here with SHA-256 as [`shingle_keys`] does, or a digest made elsewhere
/// (a launch shape's, [`super::LaunchShape::digest`]), used as it is. A sequence of names
/// only gives exactly the keys [`shingle_keys`] gives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Element<'a> {
    /// A name, digested with [`NameDigest::of`].
    Name(&'a str),
    /// A digest standing for a launch in place of its name's.
    Digest(NameDigest),
}

impl Element<'_> {
    /// The digest this element is shingled as.
    pub fn digest(&self) -> NameDigest {
        match self {
            Self::Name(name) => NameDigest::of(name),
            Self::Digest(digest) => *digest,
        }
    }
}

/// Like [`shingle_keys`] for a sequence that mixes names and precomputed digests: the keys
/// equal [`shingle_keys_of_digests`] over each element's [`Element::digest`].
pub fn shingle_keys_of_elements(elements: &[Element<'_>], ngram_len: usize) -> Vec<ShingleKey> {
    memoised_keys(elements.iter().copied(), ngram_len, |e| e.digest())
}

/// [`shingle_keys_of_digests`] over `digest` of each item, digesting each distinct item once and
/// each distinct n-gram once.
fn memoised_keys<K: Eq + Hash>(
    items: impl Iterator<Item = K>,
    ngram_len: usize,
    digest: impl Fn(&K) -> NameDigest,
) -> Vec<ShingleKey> {
    let n = ngram_len.max(1);
    let mut ids: HashMap<K, u32> = HashMap::new();
    let mut digests: Vec<NameDigest> = Vec::new();
    let seq: Vec<u32> = items
        .map(|item| {
            *ids.entry(item).or_insert_with_key(|item| {
                digests.push(digest(item));
                (digests.len() - 1) as u32
            })
        })
        .collect();
    let bits = (u32::BITS - (digests.len() as u32).leading_zeros()).max(1);
    if seq.len() < n || n as u32 * bits > u128::BITS {
        let all: Vec<NameDigest> = seq.iter().map(|&i| digests[i as usize]).collect();
        return shingle_keys_of_digests(&all, n);
    }
    let mut memo: HashMap<u128, ShingleKey> = HashMap::new();
    let mut gram_digests = Vec::with_capacity(n);
    seq.windows(n)
        .map(|gram| {
            let packed = gram
                .iter()
                .fold(0u128, |acc, &id| (acc << bits) | u128::from(id));
            *memo.entry(packed).or_insert_with(|| {
                gram_digests.clear();
                gram_digests.extend(gram.iter().map(|&i| digests[i as usize]));
                ShingleKey::of(&gram_digests)
            })
        })
        .collect()
}

/// Like [`shingle_keys`] for names already digested (the agent digests each name once, when
/// the module is loaded).
pub fn shingle_keys_of_digests(digests: &[NameDigest], ngram_len: usize) -> Vec<ShingleKey> {
    let n = ngram_len.max(1);
    if digests.is_empty() {
        return Vec::new();
    }
    if digests.len() < n {
        return vec![ShingleKey::of(digests)];
    }
    digests.windows(n).map(ShingleKey::of).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_shingle_per_position() {
        let names = ["a", "b", "c", "a", "b", "c"];
        let keys = shingle_keys(&names, 3);
        assert_eq!(keys.len(), 4);
        assert_eq!(keys[0], keys[3]);
        assert_ne!(keys[0], keys[1]);
    }

    #[test]
    fn memoised_keys_equal_direct_digests() {
        let names: Vec<String> = (0..500).map(|i| format!("k{}", (i * 7) % 23)).collect();
        let digests: Vec<NameDigest> = names.iter().map(|n| NameDigest::of(n)).collect();
        for n in [1, 4, 8] {
            assert_eq!(
                shingle_keys(&names, n),
                shingle_keys_of_digests(&digests, n)
            );
        }
    }

    #[test]
    fn elements_shingle_like_their_digests_and_names_like_names() {
        let names: Vec<String> = (0..400).map(|i| format!("k{}", (i * 5) % 17)).collect();
        // Every third launch stands as a precomputed digest instead of its name.
        let token = |i: usize| NameDigest::of(&format!("token {}", i % 4));
        let elements: Vec<Element<'_>> = names
            .iter()
            .enumerate()
            .map(|(i, n)| {
                if i % 3 == 0 {
                    Element::Digest(token(i))
                } else {
                    Element::Name(n)
                }
            })
            .collect();
        let digests: Vec<NameDigest> = elements.iter().map(Element::digest).collect();
        let only_names: Vec<Element<'_>> = names.iter().map(|n| Element::Name(n)).collect();
        for n in [1, 4, 8, 40] {
            assert_eq!(
                shingle_keys_of_elements(&elements, n),
                shingle_keys_of_digests(&digests, n)
            );
            // A sequence of names only: exactly the keys of the names.
            assert_eq!(
                shingle_keys_of_elements(&only_names, n),
                shingle_keys(&names, n)
            );
        }
        // A digest element equals the name element whose digest it is, and nothing else.
        assert_eq!(
            shingle_keys_of_elements(&[Element::Digest(NameDigest::of("a"))], 1),
            shingle_keys_of_elements(&[Element::Name("a")], 1)
        );
        assert!(shingle_keys_of_elements(&[], 4).is_empty());
    }

    #[test]
    fn order_matters_and_short_sequences_get_one_shingle() {
        assert_ne!(shingle_keys(&["a", "b"], 2), shingle_keys(&["b", "a"], 2));
        assert_eq!(shingle_keys(&["a", "b"], 8).len(), 1);
        assert!(shingle_keys::<&str>(&[], 8).is_empty());
    }
}
