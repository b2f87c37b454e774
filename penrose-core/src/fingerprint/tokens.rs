//! Launch tokens that need no kernel names: what a launch is when the agent cannot name it.
//!
//! On real CUDA stacks many launches arrive through handles no name source resolves (kernels
//! the runtime registers through a private path, stripped libraries). A handle is only
//! meaningful inside its process: the same kernel has a different `CUfunction` value in every
//! process, on every host, in every run. So the name-free encoding uses the handle only to ask
//! "when did this same kernel last launch?", never its value:
//!
//! - the launch configuration the launch call passes: grid (x, y, z), block (x, y, z) and the
//!   shared memory in bytes ([`LaunchConfig`]);
//! - the distance, in launches of the same sequence, back to the previous launch with the same
//!   handle, as a logarithmic bucket ([`gap_bucket`]): 0 for the first launch of a handle in
//!   the sequence, otherwise `1 + floor(log2(distance))`, capped at [`MAX_GAP_BUCKET`].
//!
//! A token's digest is SHA-256 over a domain tag and a fixed little-endian encoding of those
//! fields; it plays the role of a kernel name's digest, so tokens are shingled, MinHashed and
//! packed into the 256-bit snippet hash exactly like names
//! ([`super::shingle_keys_of_digests`]). Renaming every handle of a sequence by a bijection
//! leaves the token sequence unchanged (tested below), which is what makes per-process handles
//! comparable across processes and hosts.
//!
//! Why a log bucket and not the exact distance: a dropped or an inserted launch shifts by one
//! the distance of every repetition that spans it, which with exact distances (even capped,
//! say at 64) changes one token per kernel that is live across the perturbed position; a log
//! bucket changes only when the shifted distance crosses a power of two, so a perturbation
//! still spoils about n shingles, as it does for names. The buckets still separate a kernel
//! launched back to back (1), within a short fused sequence (2 to 7), once per layer (tens)
//! and once per iteration (hundreds or thousands).
//!
//! The distances need not stop at a capture window's edge: [`RepetitionTracker`] keeps each
//! handle's last launch per process across windows, which the evaluation found worth about 5
//! points of accuracy.
//!
//! [`combined_digest`] is the "both" encoding: one token per launch made of the name digest
//! and the name-free token, so a named launch is told apart by its name and an unnamed one
//! (a fixed placeholder name) still by its configuration and repetition.

use std::collections::HashMap;
use std::hash::Hash;

use sha2::{Digest, Sha256};

use super::shingle::NameDigest;

/// Domain tag of a name-free token's digest (keeps token digests apart from name digests).
const TOKEN_TAG: &[u8] = b"penrose.launch-token.v1";

/// Domain tag of a combined (name plus name-free token) digest.
const COMBINED_TAG: &[u8] = b"penrose.named-launch-token.v1";

/// Largest gap bucket: every distance of at least 2^(MAX_GAP_BUCKET - 1) launches shares it.
/// 2^15 = 32,768 launches is longer than a training iteration of any trace we evaluated and
/// leaves the token alphabet bounded.
pub const MAX_GAP_BUCKET: u8 = 16;

/// What the launch call says about a launch's shape: the same for the same kernel launched
/// the same way in any process.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct LaunchConfig {
    /// Grid dimensions (x, y, z) in blocks.
    pub grid: [u32; 3],
    /// Block dimensions (x, y, z) in threads.
    pub block: [u32; 3],
    /// Shared memory per block in bytes. The agent sees the dynamic shared memory the launch
    /// call passes; profiler traces record static plus dynamic (a per-kernel constant more),
    /// which is what the evaluation uses.
    pub shared_mem_bytes: u64,
}

/// One name-free token: a launch configuration and the gap bucket of its handle.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LaunchToken {
    /// The launch's configuration.
    pub config: LaunchConfig,
    /// [`gap_bucket`] of the distance to the previous launch of the same handle.
    pub gap: u8,
}

impl LaunchToken {
    /// The fixed byte encoding the digests hash: grid, block (u32 each), shared memory (u64),
    /// all little-endian, then the gap bucket.
    fn encode(&self) -> [u8; 33] {
        let mut out = [0u8; 33];
        for (i, v) in self
            .config
            .grid
            .iter()
            .chain(&self.config.block)
            .enumerate()
        {
            out[i * 4..i * 4 + 4].copy_from_slice(&v.to_le_bytes());
        }
        out[24..32].copy_from_slice(&self.config.shared_mem_bytes.to_le_bytes());
        out[32] = self.gap;
        out
    }

    /// The token's digest, shingled in place of a name digest.
    pub fn digest(&self) -> NameDigest {
        let mut hasher = Sha256::new();
        hasher.update(TOKEN_TAG);
        hasher.update(self.encode());
        NameDigest(hasher.finalize().into())
    }
}

/// The digest of a launch in the "both" encoding: its name's digest and its name-free token
/// together, one token per launch. A launch without a name should pass one fixed placeholder
/// digest, so it is told apart by its token alone.
pub fn combined_digest(name: &NameDigest, token: &LaunchToken) -> NameDigest {
    let mut hasher = Sha256::new();
    hasher.update(COMBINED_TAG);
    hasher.update(name.0);
    hasher.update(token.encode());
    NameDigest(hasher.finalize().into())
}

/// The bucket of a repetition distance: 0 for a first occurrence (`None`), else
/// `1 + floor(log2(distance))` (1: back to back; 2: 2 to 3 launches; 3: 4 to 7; ...) capped at
/// [`MAX_GAP_BUCKET`].
pub fn gap_bucket(distance: Option<usize>) -> u8 {
    match distance {
        None | Some(0) => 0,
        Some(d) => (1 + d.ilog2()).min(u32::from(MAX_GAP_BUCKET)) as u8,
    }
}

/// For each launch of a sequence, the distance in launches back to the previous launch with
/// an equal handle (`None` for the first). Handles are compared for equality only.
pub fn repetition_distances<H: Eq + Hash>(
    handles: impl IntoIterator<Item = H>,
) -> Vec<Option<usize>> {
    let mut last: HashMap<H, usize> = HashMap::new();
    handles
        .into_iter()
        .enumerate()
        .map(|(i, h)| last.insert(h, i).map(|prev| i - prev))
        .collect()
}

/// The name-free tokens of a sequence of launches, each given as (handle, configuration).
/// Handles are per-process identities (a `CUfunction` value, or a kernel name standing for
/// one); only their equality is used.
pub fn name_free_tokens<H: Eq + Hash>(
    launches: impl IntoIterator<Item = (H, LaunchConfig)>,
) -> Vec<LaunchToken> {
    let (handles, configs): (Vec<H>, Vec<LaunchConfig>) = launches.into_iter().unzip();
    repetition_distances(handles)
        .into_iter()
        .zip(configs)
        .map(|(d, config)| LaunchToken {
            config,
            gap: gap_bucket(d),
        })
        .collect()
}

/// Name-free tokens of one process's launches as they arrive, with repetition distances
/// carried across capture windows: only a process's first launch of a handle gets bucket 0,
/// so windows at different offsets of a long run do not differ in the first launch of every
/// kernel (measured in `docs/evaluation.md`, "Names or name-free tokens"). Holds one entry
/// per distinct handle of the process.
#[derive(Clone, Debug)]
pub struct RepetitionTracker<H> {
    last: HashMap<H, u64>,
    next: u64,
}

impl<H: Eq + Hash> Default for RepetitionTracker<H> {
    fn default() -> Self {
        Self {
            last: HashMap::new(),
            next: 0,
        }
    }
}

impl<H: Eq + Hash> RepetitionTracker<H> {
    /// A tracker for a process that has launched nothing yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// The token of the process's next launch.
    pub fn token(&mut self, handle: H, config: LaunchConfig) -> LaunchToken {
        let i = self.next;
        self.next += 1;
        let distance = self
            .last
            .insert(handle, i)
            .map(|prev| usize::try_from(i - prev).unwrap_or(usize::MAX));
        LaunchToken {
            config,
            gap: gap_bucket(distance),
        }
    }

    /// Distinct handles remembered.
    pub fn handles(&self) -> usize {
        self.last.len()
    }
}

/// The digests of [`name_free_tokens`], ready for [`super::shingle_keys_of_digests`].
pub fn name_free_digests<H: Eq + Hash>(
    launches: impl IntoIterator<Item = (H, LaunchConfig)>,
) -> Vec<NameDigest> {
    name_free_tokens(launches)
        .iter()
        .map(LaunchToken::digest)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fingerprint::shingle_keys_of_digests;
    use rand::seq::SliceRandom;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    fn config(g: u32, b: u32, smem: u64) -> LaunchConfig {
        LaunchConfig {
            grid: [g, 1, 1],
            block: [b, 1, 1],
            shared_mem_bytes: smem,
        }
    }

    /// A looped sequence of launches of `kinds` kernels with a few configurations each.
    fn sequence(rng: &mut ChaCha8Rng, kinds: usize, len: usize) -> Vec<(String, LaunchConfig)> {
        let body: Vec<(String, LaunchConfig)> = (0..97)
            .map(|_| {
                let k = rng.random_range(0..kinds);
                let c = config(
                    1 + (k as u32 % 5) * rng.random_range(1..3),
                    128,
                    (k as u64 % 3) * 1024,
                );
                (format!("kernel_{k}"), c)
            })
            .collect();
        body.iter().cycle().take(len).cloned().collect()
    }

    #[test]
    fn renaming_handles_by_a_bijection_leaves_the_tokens_unchanged() {
        let mut rng = ChaCha8Rng::seed_from_u64(9);
        let kinds = 40;
        let seq = sequence(&mut rng, kinds, 2_000);
        // A random bijection of the kernel names onto other names (and onto integers, as
        // CUfunction values would be).
        let mut targets: Vec<usize> = (0..kinds).collect();
        targets.shuffle(&mut rng);
        let rename = |name: &str| -> String {
            let k: usize = name["kernel_".len()..].parse().unwrap();
            format!("_Z{}renamed_{}", targets[k], targets[k] * 7 + 3)
        };
        let renamed: Vec<(String, LaunchConfig)> =
            seq.iter().map(|(n, c)| (rename(n), *c)).collect();
        let as_pointers: Vec<(u64, LaunchConfig)> = seq
            .iter()
            .map(|(n, c)| {
                let k: u64 = n["kernel_".len()..].parse().unwrap();
                (0x7f00_dead_0000 + 0x40 * targets[k as usize] as u64, *c)
            })
            .collect();

        let tokens = name_free_tokens(seq.iter().cloned());
        assert_eq!(tokens, name_free_tokens(renamed.iter().cloned()));
        assert_eq!(tokens, name_free_tokens(as_pointers.iter().cloned()));
        // And so are the digests and the shingles built from them.
        let keys = |d: &[NameDigest]| shingle_keys_of_digests(d, 4);
        assert_eq!(
            keys(&name_free_digests(seq.iter().cloned())),
            keys(&name_free_digests(renamed))
        );
        // The tokens do use handle identity: merging two handles changes them.
        let a = seq[0].0.clone();
        let b = seq
            .iter()
            .map(|(n, _)| n)
            .find(|n| **n != a)
            .unwrap()
            .clone();
        let merged = seq
            .iter()
            .map(|(n, c)| (if *n == a { b.clone() } else { n.clone() }, *c));
        assert_ne!(tokens, name_free_tokens(merged));
    }

    #[test]
    fn tracker_carries_distances_across_windows() {
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        let seq = sequence(&mut rng, 20, 600);
        let mut tracker = RepetitionTracker::new();
        let tracked: Vec<LaunchToken> = seq
            .iter()
            .map(|(n, c)| tracker.token(n.as_str(), *c))
            .collect();
        // One sequence: the same tokens as the whole sequence at once.
        assert_eq!(tracked, name_free_tokens(seq.iter().cloned()));
        // The second window's tokens differ from that window tokenised alone only where a
        // kernel's first launch in the window had launched before it.
        let alone = name_free_tokens(seq[300..].iter().cloned());
        let distances = repetition_distances(seq[300..].iter().map(|(n, _)| n));
        for ((t, a), d) in tracked[300..].iter().zip(&alone).zip(distances) {
            if d.is_some() {
                assert_eq!(t, a);
            } else {
                assert_eq!(a.gap, 0);
                assert_ne!(t.gap, 0);
            }
        }
        assert!(tracker.handles() <= 20);
    }

    #[test]
    fn distances_and_buckets() {
        let d = repetition_distances(["a", "b", "a", "a", "c", "b"]);
        assert_eq!(d, vec![None, None, Some(2), Some(1), None, Some(4)]);
        let buckets: Vec<u8> = d.into_iter().map(gap_bucket).collect();
        assert_eq!(buckets, vec![0, 0, 2, 1, 0, 3]);
        assert_eq!(gap_bucket(Some(3)), 2);
        assert_eq!(gap_bucket(Some(7)), 3);
        assert_eq!(gap_bucket(Some(8)), 4);
        assert_eq!(gap_bucket(Some(1 << 14)), 15);
        assert_eq!(gap_bucket(Some(1 << 15)), MAX_GAP_BUCKET);
        assert_eq!(gap_bucket(Some(usize::MAX)), MAX_GAP_BUCKET);
    }

    #[test]
    fn every_field_of_the_configuration_counts() {
        let base = LaunchToken {
            config: LaunchConfig {
                grid: [1, 2, 3],
                block: [4, 5, 6],
                shared_mem_bytes: 7,
            },
            gap: 1,
        };
        let mut variants = vec![base];
        for i in 0..3 {
            let mut t = base;
            t.config.grid[i] += 1;
            variants.push(t);
            let mut t = base;
            t.config.block[i] += 1;
            variants.push(t);
        }
        let mut t = base;
        t.config.shared_mem_bytes += 1;
        variants.push(t);
        let mut t = base;
        t.gap += 1;
        variants.push(t);
        let digests: std::collections::HashSet<NameDigest> =
            variants.iter().map(LaunchToken::digest).collect();
        assert_eq!(digests.len(), variants.len());
        // Token digests never equal name digests of the same bytes, and the combined digest
        // depends on the name.
        assert_ne!(base.digest(), NameDigest::of("x"));
        assert_ne!(
            combined_digest(&NameDigest::of("a"), &base),
            combined_digest(&NameDigest::of("b"), &base)
        );
    }
}
