//! A synthetic fleet for load generation and benchmarks: N applications whose reports each carry
//! a fresh snippet fingerprint near their application's, at the similarities measured on the
//! real traces. Test equipment (`loadgen` and `cargo xtask bench-fleet` use it); the server
//! never does.
//!
//! **Model.** Application a has a *center*: k MinHash values derived from (seed, a), so that
//! 100,000 applications cost no memory. A report of a draws a similarity J from the
//! [`SimilarityProfile`] and keeps each of the center's values with probability J, replacing the
//! others with fresh random values: its weighted Jaccard to the center is J in expectation, as
//! MinHash positions agree with probability J. (A draw that kept every value gets two fresh
//! values, so that every report is a snippet the server has not seen: windows of real traces
//! are often identical, which would make part of the load cheap look-ups.) The first report of every application is the
//! center itself ([`SyntheticFleet::founder`]), so the server's class representative is the
//! center, and every later report relates to it as same-application windows of the real traces
//! relate to each other. A share of reports comes from applications never seen before
//! (all-fresh values), which found classes.
//!
//! Popularity follows Zipf with exponent 1 (as the design server's fleet simulator assumes),
//! and each report names a GPU architecture drawn from a fixed mix.

use std::collections::HashSet;
use std::path::Path;

use anyhow::{Context, Result, ensure};
use penrose_core::fingerprint::{
    Fingerprint, FingerprintParams, Fingerprinter, MinHashSignature, SnippetHash,
};
use penrose_core::gpu::GpuArch;
use penrose_traces::{TraceFolder, job_name};
use rand::{Rng, SeedableRng};

/// Calls `visit(label, window)` for `windows` capture windows of `window_len` launches at random
/// offsets of each trace's main process (its longest launch sequence, looped, as a long run
/// repeats its iterations), labelled with the trace's file name: how every tool that draws
/// windows from the real traces draws them.
pub fn for_each_trace_window(
    dir: &Path,
    windows: usize,
    window_len: usize,
    seed: u64,
    mut visit: impl FnMut(&str, &[&str]),
) -> Result<()> {
    let folder = TraceFolder::open(dir).with_context(|| format!("listing {}", dir.display()))?;
    ensure!(!folder.files().is_empty(), "no traces in {}", dir.display());
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    for path in folder.files() {
        let trace = penrose_traces::read_trace(path)?;
        let Some(longest) = trace.process_sequences().into_values().max_by_key(Vec::len) else {
            continue;
        };
        if longest.is_empty() {
            continue;
        }
        let names: Vec<&str> = longest.iter().map(|k| &*k.name).collect();
        let label = path
            .file_name()
            .map_or_else(|| job_name(path), |n| n.to_string_lossy().into_owned());
        for _ in 0..windows {
            let offset = rng.random_range(0..names.len());
            let window: Vec<&str> = (0..window_len.min(names.len()))
                .map(|i| names[(offset + i) % names.len()])
                .collect();
            visit(&label, &window);
        }
    }
    Ok(())
}

/// Same-application similarities (weighted Jaccard between two windows of one application's
/// main process), sorted, from which reports draw theirs.
#[derive(Clone, Debug)]
pub struct SimilarityProfile {
    sorted: Vec<f64>,
}

impl SimilarityProfile {
    /// Measures the profile on the real traces: `windows` windows of `window_len` launches at
    /// random offsets of each trace's longest process, compared pairwise within a trace by their
    /// full MinHash signatures (the share of equal values: an unbiased estimate of weighted
    /// Jaccard, without the 2-bit hash's chance agreements).
    pub fn from_traces(dir: &Path, windows: usize, window_len: usize, seed: u64) -> Result<Self> {
        let f = Fingerprinter::new(FingerprintParams::default())?;
        let mut per_trace: std::collections::BTreeMap<String, Vec<MinHashSignature>> =
            std::collections::BTreeMap::new();
        for_each_trace_window(dir, windows, window_len, seed, |label, window| {
            per_trace
                .entry(label.to_owned())
                .or_default()
                .push(f.signature(window));
        })?;
        let mut sorted = Vec::new();
        for signatures in per_trace.values() {
            for (i, a) in signatures.iter().enumerate() {
                for b in &signatures[i + 1..] {
                    sorted.push(a.similarity(b));
                }
            }
        }
        Self::new(sorted)
    }

    /// A profile of the given similarities (each in [0, 1]).
    pub fn new(mut similarities: Vec<f64>) -> Result<Self> {
        ensure!(!similarities.is_empty(), "an empty similarity profile");
        ensure!(
            similarities.iter().all(|s| (0.0..=1.0).contains(s)),
            "similarities must lie in [0, 1]"
        );
        similarities.sort_by(f64::total_cmp);
        Ok(Self {
            sorted: similarities,
        })
    }

    /// One similarity, drawn uniformly from the measured ones.
    pub fn draw(&self, rng: &mut impl Rng) -> f64 {
        self.sorted[rng.random_range(0..self.sorted.len())]
    }

    /// The `q`-quantile (0 = lowest).
    pub fn quantile(&self, q: f64) -> f64 {
        let i = ((self.sorted.len() - 1) as f64 * q.clamp(0.0, 1.0)).round() as usize;
        self.sorted[i]
    }

    /// The share of similarities below `j`.
    pub fn share_below(&self, j: f64) -> f64 {
        self.sorted.partition_point(|&s| s < j) as f64 / self.sorted.len() as f64
    }

    /// Number of pairs measured.
    pub fn len(&self) -> usize {
        self.sorted.len()
    }

    /// Whether no pair was measured (never, for a constructed profile).
    pub fn is_empty(&self) -> bool {
        self.sorted.is_empty()
    }
}

/// The architectures reports name, with their shares of the fleet.
pub const ARCH_MIX: [(GpuArch, f64); 3] = [
    (GpuArch::new(8, 0), 0.4),
    (GpuArch::new(9, 0), 0.45),
    (GpuArch::new(10, 0), 0.15),
];

/// Who sent a synthetic report.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    /// One of the fleet's applications.
    Known(u32),
    /// An application never seen before (founds a class).
    New,
}

/// One synthetic report's snippet.
#[derive(Clone, Copy, Debug)]
pub struct Drawn {
    /// Its fingerprint.
    pub fingerprint: Fingerprint,
    /// Whose it is.
    pub origin: Origin,
    /// The similarity it was drawn at (1 for a founder, 0 for a new application).
    pub similarity: f64,
    /// The GPU architecture it names.
    pub arch: GpuArch,
}

/// N applications and how their reports are drawn (module docs).
pub struct SyntheticFleet {
    apps: u32,
    seed: u64,
    new_share: f64,
    profile: SimilarityProfile,
    /// Zipf's cumulative shares, for drawing an application by popularity.
    cumulative: Vec<f64>,
    fingerprinter: Fingerprinter,
}

/// The splitmix64 finaliser (a bijection with full avalanche): application centers from
/// (seed, application, position) without storing them.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl SyntheticFleet {
    /// A fleet of `apps` applications; `new_share` of reports come from unseen applications.
    pub fn new(apps: u32, new_share: f64, profile: SimilarityProfile, seed: u64) -> Result<Self> {
        ensure!(apps > 0, "a fleet needs at least one application");
        ensure!(
            (0.0..=1.0).contains(&new_share),
            "the share of new applications must lie in [0, 1]"
        );
        let mut cumulative = Vec::with_capacity(apps as usize);
        let mut total = 0.0;
        for rank in 1..=apps {
            total += 1.0 / f64::from(rank);
            cumulative.push(total);
        }
        for c in &mut cumulative {
            *c /= total;
        }
        Ok(Self {
            apps,
            seed,
            new_share,
            profile,
            cumulative,
            fingerprinter: Fingerprinter::new(FingerprintParams::default())?,
        })
    }

    /// Number of applications.
    pub fn apps(&self) -> u32 {
        self.apps
    }

    /// The similarity profile reports are drawn from.
    pub fn profile(&self) -> &SimilarityProfile {
        &self.profile
    }

    fn center_value(&self, app: u32, position: usize) -> u64 {
        mix(self.seed ^ mix((u64::from(app) << 16) | position as u64))
    }

    fn center(&self, app: u32) -> MinHashSignature {
        let k = self.fingerprinter.params().num_hashes;
        MinHashSignature((0..k).map(|i| self.center_value(app, i)).collect())
    }

    /// The first report of application `app`: its center (becomes its class's representative).
    pub fn founder(&self, app: u32, rng: &mut impl Rng) -> Drawn {
        Drawn {
            fingerprint: self.fingerprinter.fingerprint(&self.center(app)),
            origin: Origin::Known(app),
            similarity: 1.0,
            arch: draw_arch(rng),
        }
    }

    /// A later report: an application by popularity (or a new one), a fresh fingerprint near it.
    pub fn draw(&self, rng: &mut impl Rng) -> Drawn {
        let k = self.fingerprinter.params().num_hashes;
        if rng.random_bool(self.new_share) {
            let signature = MinHashSignature((0..k).map(|_| rng.random()).collect());
            return Drawn {
                fingerprint: self.fingerprinter.fingerprint(&signature),
                origin: Origin::New,
                similarity: 0.0,
                arch: draw_arch(rng),
            };
        }
        let u: f64 = rng.random();
        let app = self
            .cumulative
            .partition_point(|&c| c < u)
            .min(self.apps as usize - 1) as u32;
        let similarity = self.profile.draw(rng);
        let mut signature = MinHashSignature(
            (0..k)
                .map(|i| {
                    if rng.random_bool(similarity) {
                        self.center_value(app, i)
                    } else {
                        rng.random()
                    }
                })
                .collect(),
        );
        // Every report a fresh snippet: a draw that kept every value (the real traces have
        // identical windows, similarity 1) gets two values of its own (one would leave only
        // 300 distinct 2-bit hashes per application, which a popular one soon uses up).
        if (0..k).all(|i| signature.0[i] == self.center_value(app, i)) {
            for _ in 0..2 {
                signature.0[rng.random_range(0..k)] = rng.random();
            }
        }
        Drawn {
            fingerprint: self.fingerprinter.fingerprint(&signature),
            origin: Origin::Known(app),
            similarity,
            arch: draw_arch(rng),
        }
    }

    /// [`SyntheticFleet::draw`] until the snippet hash is one not in `seen` (which it joins):
    /// the load the server sees when every report is a snippet it has not met. Founders go
    /// into `seen` by the caller. Redrawing skews the similarities a little low: two 2-bit
    /// hashes of windows that differ in one or two minima coincide one time in four or
    /// sixteen.
    pub fn draw_fresh(&self, seen: &mut HashSet<SnippetHash>, rng: &mut impl Rng) -> Drawn {
        loop {
            let drawn = self.draw(rng);
            if seen.insert(drawn.fingerprint.hash) {
                return drawn;
            }
        }
    }

    /// The estimated similarity of a drawn report to its application's center (what the server
    /// compares), or `None` for a new application.
    pub fn estimate_to_center(&self, drawn: &Drawn) -> Option<f64> {
        let Origin::Known(app) = drawn.origin else {
            return None;
        };
        let center = self.fingerprinter.encode(&self.center(app));
        Some(
            self.fingerprinter
                .similarity(&center, &drawn.fingerprint.hash),
        )
    }
}

fn draw_arch(rng: &mut impl Rng) -> GpuArch {
    let mut u: f64 = rng.random();
    for (arch, share) in ARCH_MIX {
        if u < share {
            return arch;
        }
        u -= share;
    }
    ARCH_MIX[0].0
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use rand_chacha::ChaCha8Rng;

    fn fleet(apps: u32, new_share: f64, similarity: f64) -> SyntheticFleet {
        let profile = SimilarityProfile::new(vec![similarity]).unwrap();
        SyntheticFleet::new(apps, new_share, profile, 7).unwrap()
    }

    #[test]
    fn reports_relate_to_their_center_at_the_drawn_similarity() {
        let f = fleet(10, 0.0, 0.7);
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let fp = Fingerprinter::new(FingerprintParams::default()).unwrap();
        let mut total = 0.0;
        let n = 400;
        for _ in 0..n {
            let d = f.draw(&mut rng);
            let Origin::Known(app) = d.origin else {
                panic!("no new applications asked for")
            };
            let center = f.center(app);
            assert_eq!(center.0.len(), 100);
            let drawn_again = f.founder(app, &mut rng);
            assert_eq!(
                drawn_again.fingerprint,
                fp.fingerprint(&center),
                "founders are the center"
            );
            total += f.estimate_to_center(&d).unwrap();
        }
        let mean = total / f64::from(n);
        // The 2-bit estimate is unbiased; 400 draws of sd 0.07 give a mean within 0.02.
        assert!((mean - 0.7).abs() < 0.02, "mean estimate {mean}");
    }

    #[test]
    fn new_applications_come_at_their_share_and_relate_to_nothing() {
        let f = fleet(10, 0.25, 0.9);
        let mut rng = ChaCha8Rng::seed_from_u64(2);
        let drawn: Vec<Drawn> = (0..2_000).map(|_| f.draw(&mut rng)).collect();
        let new = drawn.iter().filter(|d| d.origin == Origin::New).count();
        assert!((400..600).contains(&new), "{new} of 2000 new");
        // Distinct fingerprints: every report has a fresh one.
        let mut hashes: Vec<_> = drawn.iter().map(|d| d.fingerprint.hash).collect();
        hashes.sort_unstable();
        hashes.dedup();
        assert_eq!(hashes.len(), drawn.len());
    }

    #[test]
    fn popularity_falls_with_rank_and_architectures_follow_the_mix() {
        let f = fleet(1_000, 0.0, 0.9);
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        let mut first = 0;
        let mut hopper = 0;
        let n = 20_000;
        for _ in 0..n {
            let d = f.draw(&mut rng);
            if d.origin == Origin::Known(0) {
                first += 1;
            }
            if d.arch == GpuArch::new(9, 0) {
                hopper += 1;
            }
        }
        // Zipf(1) over 1,000: the first has 1 / H(1000) = 13.4% of reports.
        let share = f64::from(first) / f64::from(n);
        assert!((0.12..0.15).contains(&share), "{share}");
        let share = f64::from(hopper) / f64::from(n);
        assert!((0.43..0.47).contains(&share), "{share}");
    }

    #[test]
    fn profiles_refuse_nonsense_and_answer_quantiles() {
        assert!(SimilarityProfile::new(vec![]).is_err());
        assert!(SimilarityProfile::new(vec![1.5]).is_err());
        let p = SimilarityProfile::new(vec![0.9, 0.5, 0.7]).unwrap();
        assert_eq!(p.quantile(0.0), 0.5);
        assert_eq!(p.quantile(1.0), 0.9);
        assert!((p.share_below(0.8) - 2.0 / 3.0).abs() < 1e-12);
    }
}
