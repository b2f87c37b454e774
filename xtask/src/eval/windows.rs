//! Capture windows drawn from looped sequences, perturbed the way real runs differ.

use std::collections::HashMap;

use penrose_core::fingerprint::{NameDigest, ShingleKey, shingle_keys_of_digests};
use rand::Rng;

use super::corpus::LaunchId;

/// What happens to a perturbed launch; each is equally likely.
#[derive(Clone, Copy, Debug)]
enum Perturbation {
    /// The launch is missing (a data-dependent branch not taken).
    Drop,
    /// Another application's kernel takes its place (a renamed or substituted kernel).
    Replace,
    /// Another application's kernel follows it (an interleaved process or extra kernel).
    Insert,
}

/// The first `len` launches an agent would record starting at a random offset of the looped
/// sequence, with each launch perturbed with probability `p` by a kernel from `foreign`, and
/// that offset.
pub fn draw<R: Rng>(
    seq: &[LaunchId],
    len: usize,
    p: f64,
    foreign: &[LaunchId],
    rng: &mut R,
) -> (usize, Vec<LaunchId>) {
    if seq.is_empty() {
        return (0, Vec::new());
    }
    let offset = rng.random_range(0..seq.len());
    (offset, draw_at(seq, offset, len, p, foreign, rng))
}

/// Like [`draw`] from a given offset.
pub fn draw_at<R: Rng>(
    seq: &[LaunchId],
    offset: usize,
    len: usize,
    p: f64,
    foreign: &[LaunchId],
    rng: &mut R,
) -> Vec<LaunchId> {
    let mut out = Vec::with_capacity(len + 1);
    if seq.is_empty() {
        return out;
    }
    let mut pos = offset;
    while out.len() < len {
        let kernel = seq[pos % seq.len()];
        pos += 1;
        if p > 0.0 && !foreign.is_empty() && rng.random_bool(p) {
            let other = foreign[rng.random_range(0..foreign.len())];
            match [
                Perturbation::Drop,
                Perturbation::Replace,
                Perturbation::Insert,
            ][rng.random_range(0..3)]
            {
                Perturbation::Drop => {}
                Perturbation::Replace => out.push(other),
                Perturbation::Insert => {
                    out.push(kernel);
                    out.push(other);
                }
            }
        } else {
            out.push(kernel);
        }
    }
    out.truncate(len);
    out
}

/// Shingle keys with a memo: windows of one trace repeat the same n-grams, so each is digested
/// once. Works on element ids (indices into the digests it is given): names or launch shapes.
pub struct Shingler<'a> {
    n: usize,
    digests: &'a [NameDigest],
    bits: u32,
    memo: HashMap<u128, ShingleKey>,
}

impl<'a> Shingler<'a> {
    /// A shingler for n-grams over elements with these digests.
    pub fn new(n: usize, digests: &'a [NameDigest]) -> Self {
        let bits = usize::BITS - digests.len().leading_zeros();
        Self {
            n,
            digests,
            bits: bits.max(1),
            memo: HashMap::new(),
        }
    }

    /// The shingle keys of a window, as `penrose_core::fingerprint::shingle_keys` would give.
    pub fn keys(&mut self, names: &[u32]) -> Vec<ShingleKey> {
        let packable = self.n as u32 * self.bits <= 128;
        if names.len() < self.n || !packable {
            let digests: Vec<NameDigest> =
                names.iter().map(|&i| self.digests[i as usize]).collect();
            return shingle_keys_of_digests(&digests, self.n);
        }
        let mut buf = Vec::with_capacity(self.n);
        names
            .windows(self.n)
            .map(|gram| {
                let packed = gram
                    .iter()
                    .fold(0u128, |acc, &id| (acc << self.bits) | u128::from(id));
                *self.memo.entry(packed).or_insert_with(|| {
                    buf.clear();
                    buf.extend(gram.iter().map(|&i| self.digests[i as usize]));
                    ShingleKey::of(&buf)
                })
            })
            .collect()
    }
}

/// Exact set and weighted Jaccard similarity of two shingle multisets.
pub fn exact_jaccard(a: &[ShingleKey], b: &[ShingleKey]) -> (f64, f64) {
    let mut counts: HashMap<ShingleKey, (u32, u32)> = HashMap::new();
    for k in a {
        counts.entry(*k).or_default().0 += 1;
    }
    for k in b {
        counts.entry(*k).or_default().1 += 1;
    }
    let (mut inter, mut union, mut min_sum, mut max_sum) = (0u64, 0u64, 0u64, 0u64);
    for &(x, y) in counts.values() {
        union += 1;
        inter += u64::from(x > 0 && y > 0);
        min_sum += u64::from(x.min(y));
        max_sum += u64::from(x.max(y));
    }
    let ratio = |a: u64, b: u64| if b == 0 { 0.0 } else { a as f64 / b as f64 };
    (ratio(inter, union), ratio(min_sum, max_sum))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;

    #[test]
    fn unperturbed_windows_are_rotations_of_the_loop() {
        let seq: Vec<LaunchId> = (0..10).collect();
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let (_, w) = draw(&seq, 25, 0.0, &[99], &mut rng);
        assert_eq!(w.len(), 25);
        assert!(w.windows(2).all(|p| p[1] == (p[0] + 1) % 10));
    }

    #[test]
    fn perturbation_brings_in_foreign_kernels_at_about_the_rate() {
        let seq: Vec<LaunchId> = (0..10).collect();
        let mut rng = ChaCha8Rng::seed_from_u64(2);
        let (_, w) = draw(&seq, 100_000, 0.05, &[99], &mut rng);
        let foreign = w.iter().filter(|&&k| k == 99).count() as f64 / w.len() as f64;
        // Two of three perturbations add a foreign kernel: about 3.3% of the window.
        assert!((0.025..0.042).contains(&foreign), "{foreign}");
    }

    #[test]
    fn exact_jaccard_counts() {
        let k = |v: &[u64]| v.iter().copied().map(ShingleKey).collect::<Vec<_>>();
        let (set, weighted) = exact_jaccard(&k(&[1, 1, 2]), &k(&[1, 2, 2, 3]));
        assert!((set - 2.0 / 3.0).abs() < 1e-12);
        assert!((weighted - 2.0 / 5.0).abs() < 1e-12);
    }
}
