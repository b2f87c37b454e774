//! What each launch of a window is shingled as: its kernel name, a launch shape
//! (`penrose_core::fingerprint::shapes`), or both in one element.

use std::collections::HashMap;

use penrose_core::fingerprint::{
    LaunchShape, NameDigest, combined_digest, gap_bucket, repetition_distances,
};
use serde::Serialize;

use super::corpus::{Corpus, LaunchId};

/// Largest repetition distance the `name-free-exact` variant keeps exactly.
pub const EXACT_GAP_CAP: usize = 64;

/// A launch encoding.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, clap::ValueEnum)]
pub enum Elements {
    /// The kernel name (what penrose-core shingles today).
    Named,
    /// Launch configuration plus the log bucket of the distance to the previous launch of the
    /// same handle (penrose-core's `LaunchShape`): no name at all.
    NameFree,
    /// One element of the name and the launch shape together (`combined_digest`).
    Both,
    /// Like `name-free`, with repetition distances counted from before the window: the agent
    /// keeps, per process, the index of each handle's last launch across windows, so only a
    /// process's very first launches of a kernel get bucket 0 (the window's history is the
    /// looped sequence before its offset).
    NameFreeCarried,
    /// Like `name-free` with the exact distance capped at 64 instead of its log bucket (the
    /// alternative the bucket is measured against).
    NameFreeExact,
    /// Like `name-free-carried` with the history the agent can actually keep: probes are
    /// detached between capture windows, so the launches before a window that it saw are
    /// its previous window's, not the ones right before it (the history is the process's
    /// previous window, L launches at an independent offset of the looped sequence).
    NameFreeSeen,
}

impl Elements {
    /// The label in the report.
    pub fn label(self) -> &'static str {
        match self {
            Self::Named => "names",
            Self::NameFree => "name-free",
            Self::Both => "both (name + shape in one element)",
            Self::NameFreeCarried => "name-free, gaps carried across windows",
            Self::NameFreeExact => "name-free, exact gap <= 64",
            Self::NameFreeSeen => "name-free, gaps carried across the agent's windows",
        }
    }
}

/// Turns windows of launches into element ids, interning the elements of one job so that
/// [`super::windows::Shingler`] can memoise n-grams of small ids.
pub struct ElementWriter<'a> {
    corpus: &'a Corpus,
    elements: Elements,
    ids: HashMap<(u32, u8), u32>,
    /// Digest of every element id handed out.
    pub digests: Vec<NameDigest>,
}

impl<'a> ElementWriter<'a> {
    /// A writer for one encoding.
    pub fn new(corpus: &'a Corpus, elements: Elements) -> Self {
        Self {
            corpus,
            elements,
            ids: HashMap::new(),
            digests: Vec::new(),
        }
    }

    /// Whether [`Self::elements_of`] reads the launches before the window.
    pub fn needs_history(&self) -> bool {
        matches!(
            self.elements,
            Elements::NameFreeCarried | Elements::NameFreeSeen
        )
    }

    /// The element ids of a window. Repetition distances are counted inside the window, as the
    /// agent counts them inside its capture window, with the kernel name standing for the
    /// per-process handle; for [`Elements::NameFreeCarried`] and [`Elements::NameFreeSeen`] they
    /// reach back into `history` (the launches the agent saw before the window, oldest
    /// first), which the other encodings ignore.
    pub fn elements_of(&mut self, window: &[LaunchId], history: &[LaunchId]) -> Vec<u32> {
        let corpus = self.corpus;
        let launch = |l: LaunchId| corpus.launches[l as usize];
        if self.elements == Elements::Named {
            return window
                .iter()
                .map(|&l| {
                    let name = launch(l).0;
                    self.intern((name, 0), || corpus.digests[name as usize])
                })
                .collect();
        }
        let history = if self.needs_history() { history } else { &[] };
        let mut distances =
            repetition_distances(history.iter().chain(window).map(|&l| launch(l).0));
        distances.drain(..history.len());
        window
            .iter()
            .zip(distances)
            .map(|(&l, d)| {
                let (name, config) = launch(l);
                let gap = match self.elements {
                    Elements::NameFreeExact => d.unwrap_or(0).min(EXACT_GAP_CAP) as u8,
                    _ => gap_bucket(d),
                };
                let shape = LaunchShape {
                    config: corpus.configs[config as usize],
                    gap,
                };
                match self.elements {
                    Elements::Both => self.intern((l, gap), || {
                        combined_digest(&corpus.digests[name as usize], &shape)
                    }),
                    _ => self.intern((config, gap), || shape.digest()),
                }
            })
            .collect()
    }

    fn intern(&mut self, key: (u32, u8), digest: impl FnOnce() -> NameDigest) -> u32 {
        let digests = &mut self.digests;
        *self.ids.entry(key).or_insert_with(|| {
            digests.push(digest());
            (digests.len() - 1) as u32
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use penrose_core::fingerprint::LaunchConfig;

    /// A corpus of `names` kernels, launch i being kernel i % names with one of two
    /// configurations.
    fn corpus(names: &[&str]) -> Corpus {
        let configs: Vec<LaunchConfig> = (0..2)
            .map(|i| LaunchConfig {
                grid: [1 + i, 1, 1],
                block: [256, 1, 1],
                shared_mem_bytes: 0,
            })
            .collect();
        Corpus {
            apps: vec!["app".into()],
            process: Vec::new(),
            stream: Vec::new(),
            digests: names.iter().map(|n| NameDigest::of(n)).collect(),
            launches: (0..names.len() as u32 * 2)
                .map(|l| (l / 2, l % 2))
                .collect(),
            configs,
            kernels: 0,
            kernels_without_config: 0,
        }
    }

    fn digests_of(corpus: &Corpus, elements: Elements, window: &[LaunchId]) -> Vec<NameDigest> {
        let mut t = ElementWriter::new(corpus, elements);
        let ids = t.elements_of(window, &[]);
        ids.iter().map(|&i| t.digests[i as usize]).collect()
    }

    #[test]
    fn renamed_kernels_change_names_but_not_launch_shapes() {
        let a = corpus(&["gemm", "softmax", "layernorm"]);
        // The same launches with every kernel renamed by a bijection.
        let b = corpus(&["_Z1xv", "_Z1yv", "_Z1zv"]);
        let window: Vec<LaunchId> = [0, 2, 5, 0, 1, 3, 4, 2, 0, 5, 5, 1].to_vec();
        for elements in [
            Elements::NameFree,
            Elements::NameFreeCarried,
            Elements::NameFreeExact,
            Elements::NameFreeSeen,
        ] {
            assert_eq!(
                digests_of(&a, elements, &window),
                digests_of(&b, elements, &window)
            );
        }
        for elements in [Elements::Named, Elements::Both] {
            assert_ne!(
                digests_of(&a, elements, &window),
                digests_of(&b, elements, &window)
            );
        }
    }

    #[test]
    fn gaps_count_launches_of_the_same_kernel_inside_the_window() {
        let c = corpus(&["a", "b"]);
        // Kernel a (launches 0, 1) at positions 0, 2, 3; b (launches 2, 3) at 1, 4.
        let window = [0, 2, 1, 0, 3];
        let mut t = ElementWriter::new(&c, Elements::NameFreeExact);
        let ids = t.elements_of(&window, &[]);
        let expect = |config: u32, gap: u8| {
            LaunchShape {
                config: c.configs[config as usize],
                gap,
            }
            .digest()
        };
        let got: Vec<NameDigest> = ids.iter().map(|&i| t.digests[i as usize]).collect();
        assert_eq!(
            got,
            vec![
                expect(0, 0),
                expect(0, 0),
                expect(1, 2),
                expect(0, 1),
                expect(1, 3)
            ]
        );
        // With history, the first launches of a and b get the distance back into it.
        let mut t = ElementWriter::new(&c, Elements::NameFreeCarried);
        let ids = t.elements_of(&window, &[3, 1, 2]);
        let got: Vec<NameDigest> = ids.iter().map(|&i| t.digests[i as usize]).collect();
        // History b a b, then a b a a b: a at -2, b at -1.
        assert_eq!(got[0], expect(0, gap_bucket(Some(2))));
        assert_eq!(got[1], expect(0, gap_bucket(Some(2))));
        assert_eq!(
            got[2..],
            [expect(1, 2), expect(0, 1), expect(1, gap_bucket(Some(3)))]
        );
        // The agent's variant reads the history it is given the same way (what differs is
        // which launches the caller passes as history).
        let mut seen = ElementWriter::new(&c, Elements::NameFreeSeen);
        let ids = seen.elements_of(&window, &[3, 1, 2]);
        let seen_digests: Vec<NameDigest> = ids.iter().map(|&i| seen.digests[i as usize]).collect();
        assert_eq!(seen_digests, got);
    }
}
