//! Launch shapes: what stands for a kernel name: what a launch is when the agent cannot name it.
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
//! A shape's digest is SHA-256 over a domain tag and a fixed little-endian encoding of those
//! fields; it plays the role of a kernel name's digest, so shapes are shingled, MinHashed and
//! packed into the 256-bit snippet hash exactly like names
//! ([`super::shingle_keys_of_digests`]). Renaming every handle of a sequence by a bijection
//! leaves the shape sequence unchanged (tested below), which is what makes per-process handles
//! comparable across processes and hosts.
//!
//! Why a log bucket and not the exact distance: a dropped or an inserted launch shifts by one
//! the distance of every repetition that spans it, which with exact distances (even capped,
//! say at 64) changes one shape per kernel that is live across the perturbed position; a log
//! bucket changes only when the shifted distance crosses a power of two, so a perturbation
//! still spoils about n shingles, as it does for names. The buckets still separate a kernel
//! launched back to back (1), within a short fused sequence (2 to 7), once per layer (tens)
//! and once per iteration (hundreds or thousands).
//!
//! [`RepetitionTracker`] computes the same shapes launch by launch, as an agent sees them, with
//! a bound on the handles it remembers. Fed a whole run without gaps it carries the distances
//! across capture windows, which the evaluation found worth about 4.5 points of accuracy; the
//! agent cannot do that, because its probes are detached between windows and the launches it
//! misses there are part of every distance that spans them. Carrying distances across the
//! windows it does see scores below counting inside the window (`docs/evaluation.md`,
//! "What the agent ships for launches without a name"), so the agent gives each snippet its own
//! tracker.
//!
//! [`combined_digest`] is the "both" encoding: one element per launch made of the name digest
//! and the launch shape, so a named launch is told apart by its name and an unnamed one
//! (a fixed placeholder name) still by its configuration and repetition.

use std::collections::{BTreeMap, HashMap};
use std::hash::Hash;

use sha2::{Digest, Sha256};

use super::shingle::NameDigest;

/// Domain tag of a launch shape's digest (keeps shape digests apart from name digests). The
/// bytes keep the name these were first given, "launch tokens": changing them would change every
/// unnamed launch's digest, and so every fingerprint, between agent versions.
const SHAPE_TAG: &[u8] = b"penrose.launch-token.v1";

/// Domain tag of a combined (name plus launch shape) digest (bytes kept, as above).
const COMBINED_TAG: &[u8] = b"penrose.named-launch-token.v1";

/// Largest gap bucket: every distance of at least 2^(MAX_GAP_BUCKET - 1) launches shares it.
/// 2^15 = 32,768 launches is longer than a training iteration of any trace we evaluated and
/// leaves the shape alphabet bounded.
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

/// One launch shape: a launch configuration and the gap bucket of its handle.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LaunchShape {
    /// The launch's configuration.
    pub config: LaunchConfig,
    /// [`gap_bucket`] of the distance to the previous launch of the same handle.
    pub gap: u8,
}

impl LaunchShape {
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

    /// The shape's digest, shingled in place of a name digest.
    pub fn digest(&self) -> NameDigest {
        let mut hasher = Sha256::new();
        hasher.update(SHAPE_TAG);
        hasher.update(self.encode());
        NameDigest(hasher.finalize().into())
    }
}

/// The digest of a launch in the "both" encoding: its name's digest and its launch shape
/// together, one element per launch. A launch without a name should pass one fixed placeholder
/// digest, so it is told apart by its shape alone.
pub fn combined_digest(name: &NameDigest, shape: &LaunchShape) -> NameDigest {
    let mut hasher = Sha256::new();
    hasher.update(COMBINED_TAG);
    hasher.update(name.0);
    hasher.update(shape.encode());
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

/// The launch shapes of a sequence of launches, each given as (handle, configuration).
/// Handles are per-process identities (a `CUfunction` value, or a kernel name standing for
/// one); only their equality is used.
pub fn launch_shapes<H: Eq + Hash>(
    launches: impl IntoIterator<Item = (H, LaunchConfig)>,
) -> Vec<LaunchShape> {
    let (handles, configs): (Vec<H>, Vec<LaunchConfig>) = launches.into_iter().unzip();
    repetition_distances(handles)
        .into_iter()
        .zip(configs)
        .map(|(d, config)| LaunchShape {
            config,
            gap: gap_bucket(d),
        })
        .collect()
}

/// Launch shapes of one sequence of launches as they arrive (a process's launches in a
/// capture window for the agent): the same shapes as [`launch_shapes`] over the whole
/// sequence, as long as no handle was evicted. Launches that get no shape (the agent's named
/// launches) still count in the distances ([`Self::skip`]), so an unnamed kernel's shapes do
/// not depend on which of its neighbours had names.
///
/// Bounded: it remembers at most `max_handles` handles (one entry each, about 60 bytes); a new
/// handle beyond that evicts the handle launched longest ago, whose next launch then counts
/// as a first one (bucket 0), and the eviction is counted. The evicted handle's last launch is
/// at least `max_handles` launches back, so with a bound of 2^15 or more (the distance of the
/// top bucket, [`MAX_GAP_BUCKET`]) an eviction only ever turns a top-bucket shape into a
/// first-launch one.
#[derive(Clone, Debug)]
pub struct RepetitionTracker<H> {
    /// Each handle's last launch index.
    last: HashMap<H, u64>,
    /// The same, by index (oldest first), to evict in O(log n).
    order: BTreeMap<u64, H>,
    next: u64,
    max_handles: usize,
    evictions: u64,
}

impl<H: Eq + Hash + Clone> Default for RepetitionTracker<H> {
    fn default() -> Self {
        Self::bounded(usize::MAX)
    }
}

impl<H: Eq + Hash + Clone> RepetitionTracker<H> {
    /// A tracker for a sequence that has launched nothing yet, remembering every handle.
    pub fn new() -> Self {
        Self::default()
    }

    /// A tracker remembering at most `max_handles` handles (at least 1).
    pub fn bounded(max_handles: usize) -> Self {
        Self {
            last: HashMap::new(),
            order: BTreeMap::new(),
            next: 0,
            max_handles: max_handles.max(1),
            evictions: 0,
        }
    }

    /// The shape of the sequence's next launch.
    pub fn shape(&mut self, handle: H, config: LaunchConfig) -> LaunchShape {
        let i = self.next;
        self.next += 1;
        let previous = self.last.insert(handle.clone(), i);
        if let Some(prev) = previous {
            self.order.remove(&prev);
        } else if self.last.len() > self.max_handles
            && let Some((_, oldest)) = self.order.pop_first()
        {
            self.last.remove(&oldest);
            self.evictions += 1;
        }
        self.order.insert(i, handle);
        let distance = previous.map(|prev| usize::try_from(i - prev).unwrap_or(usize::MAX));
        LaunchShape {
            config,
            gap: gap_bucket(distance),
        }
    }

    /// The sequence's next launch gets no shape (it has a name) but counts in the distances of
    /// the launches around it.
    pub fn skip(&mut self) {
        self.next += 1;
    }

    /// Distinct handles remembered.
    pub fn handles(&self) -> usize {
        self.last.len()
    }

    /// Handles forgotten to stay within the bound.
    pub fn evictions(&self) -> u64 {
        self.evictions
    }
}

/// The digests of [`launch_shapes`], ready for [`super::shingle_keys_of_digests`].
pub fn name_free_digests<H: Eq + Hash>(
    launches: impl IntoIterator<Item = (H, LaunchConfig)>,
) -> Vec<NameDigest> {
    launch_shapes(launches)
        .iter()
        .map(LaunchShape::digest)
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
    fn renaming_handles_by_a_bijection_leaves_the_shapes_unchanged() {
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

        let shapes = launch_shapes(seq.iter().cloned());
        assert_eq!(shapes, launch_shapes(renamed.iter().cloned()));
        assert_eq!(shapes, launch_shapes(as_pointers.iter().cloned()));
        // And so are the digests and the shingles built from them.
        let keys = |d: &[NameDigest]| shingle_keys_of_digests(d, 4);
        assert_eq!(
            keys(&name_free_digests(seq.iter().cloned())),
            keys(&name_free_digests(renamed))
        );
        // The shapes do use handle identity: merging two handles changes them.
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
        assert_ne!(shapes, launch_shapes(merged));
    }

    #[test]
    fn tracker_carries_distances_across_windows() {
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        let seq = sequence(&mut rng, 20, 600);
        let mut tracker = RepetitionTracker::new();
        let tracked: Vec<LaunchShape> = seq
            .iter()
            .map(|(n, c)| tracker.shape(n.as_str(), *c))
            .collect();
        // One sequence: the same shapes as the whole sequence at once.
        assert_eq!(tracked, launch_shapes(seq.iter().cloned()));
        // The second window's shapes differ from that window shaped alone only where a
        // kernel's first launch in the window had launched before it.
        let alone = launch_shapes(seq[300..].iter().cloned());
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
    fn skipped_launches_count_in_the_distances() {
        let configs = [config(1, 32, 0), config(2, 64, 0), config(3, 128, 0)];
        let seq: Vec<(usize, LaunchConfig)> = [0, 1, 2, 0, 0, 1, 2, 2, 0, 1]
            .iter()
            .map(|&k| (k, configs[k]))
            .collect();
        let whole = launch_shapes(seq.iter().copied());
        // Handle 1 has a name: its launches are skipped, the others' shapes are unchanged.
        let mut tracker = RepetitionTracker::new();
        for ((k, c), expected) in seq.iter().zip(&whole) {
            if *k == 1 {
                tracker.skip();
            } else {
                assert_eq!(tracker.shape(*k, *c), *expected);
            }
        }
        assert_eq!(tracker.handles(), 2);
    }

    #[test]
    fn the_bound_holds_and_evicts_the_handle_launched_longest_ago() {
        let c = config(1, 1, 0);
        let mut tracker = RepetitionTracker::bounded(3);
        for h in [10u64, 11, 12, 10] {
            tracker.shape(h, c);
        }
        assert_eq!((tracker.handles(), tracker.evictions()), (3, 0));
        // A fourth handle evicts 11 (launched longest ago), not 10.
        tracker.shape(13, c);
        assert_eq!((tracker.handles(), tracker.evictions()), (3, 1));
        assert_eq!(tracker.shape(10, c).gap, gap_bucket(Some(2)));
        // 11 was forgotten: its launch counts as a first one (and evicts 12).
        assert_eq!(tracker.shape(11, c).gap, 0);
        assert_eq!((tracker.handles(), tracker.evictions()), (3, 2));
        // Many distinct handles: never more than the bound, every eviction counted.
        let mut tracker = RepetitionTracker::bounded(64);
        for h in 0..10_000u64 {
            tracker.shape(h % 1_000, c);
            assert!(tracker.handles() <= 64);
        }
        assert_eq!(tracker.evictions(), 10_000 - 64);
        // Handles within the bound are never evicted, and shapes equal the unbounded ones.
        let mut rng = ChaCha8Rng::seed_from_u64(5);
        let seq = sequence(&mut rng, 30, 3_000);
        let mut bounded = RepetitionTracker::bounded(30);
        let shapes: Vec<LaunchShape> = seq
            .iter()
            .map(|(n, c)| bounded.shape(n.clone(), *c))
            .collect();
        assert_eq!(shapes, launch_shapes(seq.iter().cloned()));
        assert_eq!(bounded.evictions(), 0);
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
        let base = LaunchShape {
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
            variants.iter().map(LaunchShape::digest).collect();
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
