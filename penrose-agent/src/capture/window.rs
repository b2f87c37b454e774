//! Capture windows and the snippets they produce.
//!
//! Launch probes cost a trap per launch, so they are attached only inside windows (docs/design.md
//! section 3). A window lasts at most its duration; inside it each process contributes one
//! snippet: the kernel names it launched, up to L launches, ended early by the process's exit
//! or by the window's end.
//!
//! A launch with neither a name nor an identity ([`super::identity`]) is fingerprinted by its
//! launch shape ([`penrose_core::fingerprint::shapes`]): its grid, block and dynamic shared
//! memory and the gap bucket of the distance, in launches of the snippet, back to the previous
//! launch of the same function handle. So a snippet of mostly unnamed launches still has a
//! fingerprint that tells applications apart, where a fixed placeholder made every such
//! launch the same. The distances are counted *inside the snippet* (each snippet has its own
//! [`RepetitionTracker`], dropped when the snippet ends): the probes are detached between
//! windows, so a distance carried across windows would leave out every launch of the gap, and
//! the evaluation measured that carrying below counting inside the window
//! (`docs/evaluation.md`, "What the agent ships for launches without a name"). Named launches
//! keep their names and count in the distances.
//!
//! When windows open is [`super::schedule`]'s business.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use penrose_core::counters::CounterGroup;
use penrose_core::fingerprint::{
    Element, Fingerprint, Fingerprinter, LaunchConfig, LaunchShape, NameDigest, RepetitionTracker,
    SnippetHash,
};
use penrose_core::gpu::GpuArch;

use super::events::{Launch, Pid};
use crate::counters::CounterValue;

/// L of docs/design.md: launches per process per window.
pub const DEFAULT_WINDOW_LAUNCHES: usize = 10_000;

/// Most function handles a snippet's repetition tracker remembers (about 60 bytes each): more
/// distinct unnamed kernels than one process launches in a window in practice; beyond it the
/// handle launched longest ago (at least this many launches back) is forgotten and counted.
pub const MAX_SHAPE_HANDLES: usize = 4096;

/// Most distinct shapes whose digest and label a window keeps for reuse (beyond it they are
/// computed per launch).
pub const MAX_SHAPE_CACHE: usize = 4096;

/// Why a snippet ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SnippetEnd {
    /// It reached L launches.
    Limit,
    /// The process exited inside the window.
    Exit,
    /// The window closed first.
    WindowEnd,
}

impl SnippetEnd {
    /// Its name, as in JSON (`limit`, `exit`, `window_end`), for text that names it too.
    pub fn name(self) -> &'static str {
        match self {
            Self::Limit => "limit",
            Self::Exit => "exit",
            Self::WindowEnd => "window_end",
        }
    }
}

/// The kernel names one process launched in one window.
#[derive(Clone, Debug)]
pub struct Snippet {
    /// The process.
    pub pid: Pid,
    /// Index of the window (0 for the agent's first).
    pub window: u64,
    /// Kernel names in launch order. A launch without a name is its identity (`<bid:...>`)
    /// or, with neither, its shape's label ([`shape_label`]; fingerprinted by the shape's
    /// digest, see [`Self::shapes`]); a graph launch is [`GRAPH`].
    pub names: Vec<Arc<str>>,
    /// Launches among `names` whose function handle had no name (with an identity or a
    /// shape).
    pub unnamed: u64,
    /// Of those, launches given an identity.
    pub identified: u64,
    /// Of those, the launches with neither a name nor an identity, in launch order: their
    /// position in `names` and their launch shape's digest, which the fingerprint
    /// shingles in place of a name's digest.
    pub shapes: Vec<ShapeAt>,
    /// Why it ended.
    pub end: SnippetEnd,
    /// The launches among `names` that the BPF countdown sampled and that have counter values.
    pub samples: Vec<Sample>,
}

/// A launch fingerprinted by its launch shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShapeAt {
    /// Its position in the snippet's `names`.
    pub position: usize,
    /// [`LaunchShape::digest`].
    pub digest: NameDigest,
}

impl Snippet {
    /// An empty snippet of `pid` in window `window`.
    pub fn new(pid: Pid, window: u64) -> Self {
        Self {
            pid,
            window,
            names: Vec::new(),
            unnamed: 0,
            identified: 0,
            shapes: Vec::new(),
            end: SnippetEnd::WindowEnd,
            samples: Vec::new(),
        }
    }

    /// What the fingerprint shingles, launch by launch: names (identities and placeholders
    /// included) as names, shape launches as their shapes' digests.
    pub fn elements(&self) -> Vec<Element<'_>> {
        let mut shapes = self.shapes.iter().peekable();
        self.names
            .iter()
            .enumerate()
            .map(|(i, name)| match shapes.next_if(|t| t.position == i) {
                Some(t) => Element::Digest(t.digest),
                None => Element::Name(name),
            })
            .collect()
    }

    /// The snippet's hash: for a snippet of names only, exactly
    /// [`Fingerprinter::snippet_hash`] of its names.
    pub fn snippet_hash(&self, fingerprinter: &Fingerprinter) -> SnippetHash {
        fingerprinter.snippet_hash_of_elements(&self.elements())
    }

    /// What a report of this snippet carries: its hash and its locator, from one signature.
    pub fn fingerprint(&self, fingerprinter: &Fingerprinter) -> Fingerprint {
        fingerprinter.fingerprint_of_elements(&self.elements())
    }
}

/// A sampled launch and its counter values.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    /// Its position in the snippet's `names`.
    pub position: usize,
    /// Its kernel name (as in `names`: a shape launch's label).
    pub kernel: Arc<str>,
    /// The counter group that was active.
    pub group: CounterGroup,
    /// The compute capability of the GPU the launch ran on (its values are that GPU's;
    /// reports name only its generation).
    pub arch: GpuArch,
    /// The values the counter source read.
    pub values: Vec<CounterValue>,
}

/// What the counter source read for one sampled launch: on which GPU architecture, for which
/// group, which values.
#[derive(Clone, Debug, PartialEq)]
pub struct SampledValues {
    /// The counter group that was active.
    pub group: CounterGroup,
    /// The compute capability of the GPU the launch ran on.
    pub arch: GpuArch,
    /// The values.
    pub values: Vec<CounterValue>,
}

/// Stands for a launch of a handle the name probes never saw (resolved before the agent
/// attached, or by an API the agent does not probe) in name maps; in snippets such a launch is
/// its identity or its shape.
pub const UNNAMED: &str = "<unnamed>";
/// Stands for a `cuGraphLaunch`: its handle names a graph, not a kernel.
pub const GRAPH: &str = "<graph>";
/// How a shape launch's label starts.
pub const SHAPE_PREFIX: &str = "<shape:";

/// The label a shape launch has in `names` and samples, for local inspection: the first 8
/// bytes of the shape's digest in hex, which tells no more than the shape (its
/// configuration and gap bucket) and never leaves the host.
pub fn shape_label(digest: &NameDigest) -> Arc<str> {
    let hex: String = digest.0[..8].iter().map(|b| format!("{b:02x}")).collect();
    Arc::from(format!("{SHAPE_PREFIX}{hex}>"))
}

/// What a launch has to go by when it is recorded.
#[derive(Clone, Copy, Debug)]
pub enum Naming<'a> {
    /// Its kernel name.
    Name(&'a Arc<str>),
    /// No name, but an identity from its call site.
    Identity(&'a Arc<str>),
    /// Neither (a graph launch, or a kernel that gets a launch shape).
    None,
}

/// What [`Window::record`] made of a launch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Recorded {
    /// Recorded with its name.
    Name,
    /// Recorded with its identity.
    Identity,
    /// Recorded with a launch shape.
    Shape,
    /// Recorded as [`GRAPH`].
    Graph,
    /// Not recorded: its process already had L launches in this window.
    BeyondLimit,
}

/// A snippet being built and its repetition tracker.
#[derive(Debug)]
struct Open {
    snippet: Snippet,
    repetitions: RepetitionTracker<u64>,
}

/// One open window: snippets being built.
#[derive(Debug)]
pub struct Window {
    index: u64,
    limit: usize,
    open: HashMap<Pid, Open>,
    at_limit: HashSet<Pid>,
    finished: Vec<Snippet>,
    beyond_limit: u64,
    shape_evictions: u64,
    shapes: HashMap<LaunchShape, (NameDigest, Arc<str>)>,
}

impl Window {
    /// Opens window `index` with L = `limit` (at least 1).
    pub fn new(index: u64, limit: usize) -> Self {
        Self {
            index,
            limit: limit.max(1),
            open: HashMap::new(),
            at_limit: HashSet::new(),
            finished: Vec::new(),
            beyond_limit: 0,
            shape_evictions: 0,
            shapes: HashMap::new(),
        }
    }

    /// Whether `pid` already has L launches in this window (later ones are not recorded).
    pub fn is_at_limit(&self, pid: Pid) -> bool {
        self.at_limit.contains(&pid)
    }

    /// Every process that launched in this window has reached L (and none is still open): the
    /// window has nothing left to record and may close early.
    pub fn all_at_limit(&self) -> bool {
        self.open.is_empty() && !self.at_limit.is_empty()
    }

    /// Adds a launch to its process's snippet, with its counter values when it was sampled.
    /// A launch with neither a name nor an identity gets a launch shape.
    pub fn record(
        &mut self,
        launch: &Launch,
        naming: Naming<'_>,
        sample: Option<SampledValues>,
    ) -> Recorded {
        if self.at_limit.contains(&launch.pid) {
            self.beyond_limit += 1;
            return Recorded::BeyondLimit;
        }
        let index = self.index;
        let open = self.open.entry(launch.pid).or_insert_with(|| Open {
            snippet: Snippet::new(launch.pid, index),
            repetitions: RepetitionTracker::bounded(MAX_SHAPE_HANDLES),
        });
        let snippet = &mut open.snippet;
        let position = snippet.names.len();
        let (name, recorded) = match naming {
            Naming::Name(n) => {
                open.repetitions.skip();
                (Arc::clone(n), Recorded::Name)
            }
            Naming::Identity(n) => {
                open.repetitions.skip();
                snippet.unnamed += 1;
                snippet.identified += 1;
                (Arc::clone(n), Recorded::Identity)
            }
            Naming::None if launch.is_opaque_graph() => {
                open.repetitions.skip();
                (Arc::from(GRAPH), Recorded::Graph)
            }
            Naming::None => {
                let shape = open.repetitions.shape(launch.function, config_of(launch));
                let (digest, label) = match self.shapes.get(&shape) {
                    Some((digest, label)) => (*digest, Arc::clone(label)),
                    None => {
                        let digest = shape.digest();
                        let label = shape_label(&digest);
                        if self.shapes.len() < MAX_SHAPE_CACHE {
                            self.shapes.insert(shape, (digest, Arc::clone(&label)));
                        }
                        (digest, label)
                    }
                };
                snippet.unnamed += 1;
                snippet.shapes.push(ShapeAt { position, digest });
                (label, Recorded::Shape)
            }
        };
        if let Some(SampledValues {
            group,
            arch,
            values,
        }) = sample
        {
            snippet.samples.push(Sample {
                position,
                kernel: Arc::clone(&name),
                group,
                arch,
                values,
            });
        }
        snippet.names.push(name);
        if snippet.names.len() >= self.limit {
            self.finish(launch.pid, SnippetEnd::Limit);
            self.at_limit.insert(launch.pid);
        }
        recorded
    }

    /// The process exited: its snippet ends here. A later process with the same pid starts a
    /// new one.
    pub fn exit(&mut self, pid: Pid) {
        self.finish(pid, SnippetEnd::Exit);
        self.at_limit.remove(&pid);
    }

    fn finish(&mut self, pid: Pid, end: SnippetEnd) {
        if let Some(open) = self.open.remove(&pid) {
            let mut s = self.ended(open);
            s.end = end;
            self.finished.push(s);
        }
    }

    /// A snippet's tracker is dropped with it; its evictions are counted.
    fn ended(&mut self, open: Open) -> Snippet {
        self.shape_evictions += open.repetitions.evictions();
        open.snippet
    }

    /// Snippets that have ended, leaving the open ones.
    pub fn take_finished(&mut self) -> Vec<Snippet> {
        std::mem::take(&mut self.finished)
    }

    /// Launches ignored because their process had already reached L in this window.
    pub fn beyond_limit(&self) -> u64 {
        self.beyond_limit
    }

    /// Handles the repetition trackers of this window's ended snippets forgot to stay within
    /// [`MAX_SHAPE_HANDLES`].
    pub fn shape_evictions(&self) -> u64 {
        self.shape_evictions
    }

    /// Closes the window: every open snippet ends with [`SnippetEnd::WindowEnd`]. Returns them
    /// and the window's shape evictions.
    pub fn close(mut self) -> (Vec<Snippet>, u64) {
        let mut open: Vec<Open> = self.open.drain().map(|(_, s)| s).collect();
        open.sort_by_key(|s| s.snippet.pid);
        for o in open {
            let s = self.ended(o);
            self.finished.push(s);
        }
        (self.finished, self.shape_evictions)
    }
}

/// What a launch call says about the launch's shape.
fn config_of(launch: &Launch) -> LaunchConfig {
    LaunchConfig {
        grid: launch.grid,
        block: launch.block,
        shared_mem_bytes: u64::from(launch.shared_mem_bytes),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use penrose_core::fingerprint::FingerprintParams;
    use penrose_ebpf_common::EntryPoint;

    fn launch(pid: u32, function: u64, entry: EntryPoint) -> Launch {
        Launch {
            pid: Pid(pid),
            tid: pid,
            sampled: false,
            graph_position: 0,
            in_graph: false,
            timestamp_ns: 0,
            function,
            stream: 0,
            grid: [1; 3],
            block: [1; 3],
            shared_mem_bytes: 0,
            entry,
            caller: 0,
        }
    }

    fn shaped(pid: u32, function: u64, grid: u32, block: u32, smem: u32) -> Launch {
        Launch {
            grid: [grid, 1, 1],
            block: [block, 1, 1],
            shared_mem_bytes: smem,
            ..launch(pid, function, EntryPoint::LaunchKernel)
        }
    }

    fn fingerprinter() -> Fingerprinter {
        Fingerprinter::new(FingerprintParams::default()).unwrap()
    }

    /// A looped pattern of 12 kernels over 5 launch configurations: kernel k at step i of the
    /// loop, each kernel with its own configuration, some named (`named` of the 12).
    fn pattern(len: usize) -> Vec<(usize, (u32, u32, u32))> {
        let order = [0, 1, 2, 3, 1, 4, 5, 6, 7, 1, 8, 9, 10, 11, 2, 3, 0, 4];
        (0..len)
            .map(|i| {
                let k = order[i % order.len()];
                let config = (
                    1 + (k as u32 % 5) * 16,
                    128 << (k % 2),
                    (k as u32 % 3) * 1024,
                );
                (k, config)
            })
            .collect()
    }

    /// Records `pattern` for `pid`, kernel k launched through handle `handle(k)`; kernels
    /// below `named` with the name `k<k>`, the others with no name.
    fn record_pattern(
        w: &mut Window,
        pid: u32,
        pattern: &[(usize, (u32, u32, u32))],
        named: usize,
        handle: impl Fn(usize) -> u64,
    ) {
        let names: Vec<Arc<str>> = (0..12).map(|k| Arc::from(format!("k{k}"))).collect();
        for &(k, (g, b, smem)) in pattern {
            let naming = if k < named {
                Naming::Name(&names[k])
            } else {
                Naming::None
            };
            w.record(&shaped(pid, handle(k), g, b, smem), naming, None);
        }
    }

    #[test]
    fn snippets_end_at_the_limit_and_ignore_the_rest_of_the_window() {
        let mut w = Window::new(3, 2);
        let a: Arc<str> = Arc::from("a");
        for i in 0..5 {
            let recorded = w.record(
                &launch(1, 10, EntryPoint::LaunchKernel),
                Naming::Name(&a),
                None,
            );
            let expected = if i < 2 {
                Recorded::Name
            } else {
                Recorded::BeyondLimit
            };
            assert_eq!(recorded, expected);
        }
        let done = w.take_finished();
        assert_eq!(done.len(), 1);
        assert_eq!(done[0].end, SnippetEnd::Limit);
        assert_eq!(done[0].names.len(), 2);
        assert_eq!(done[0].window, 3);
        assert_eq!(w.beyond_limit(), 3);
        assert!(w.close().0.is_empty());
    }

    #[test]
    fn exits_and_window_ends_close_snippets_per_process() {
        let mut w = Window::new(0, 100);
        let a: Arc<str> = Arc::from("a");
        let id: Arc<str> = Arc::from("<bid:00ff+0x10 g1x1x1 b1x1x1 s0>");
        w.record(
            &launch(1, 10, EntryPoint::LaunchKernel),
            Naming::Name(&a),
            None,
        );
        assert_eq!(
            w.record(&launch(2, 10, EntryPoint::LaunchKernel), Naming::None, None),
            Recorded::Shape
        );
        assert_eq!(
            w.record(&launch(2, 11, EntryPoint::GraphLaunch), Naming::None, None),
            Recorded::Graph
        );
        assert_eq!(
            w.record(
                &launch(2, 12, EntryPoint::LaunchKernel),
                Naming::Identity(&id),
                None
            ),
            Recorded::Identity
        );
        w.exit(Pid(1));
        w.exit(Pid(99));
        let exited = w.take_finished();
        assert_eq!(exited.len(), 1);
        assert_eq!((exited[0].pid, exited[0].end), (Pid(1), SnippetEnd::Exit));
        let (rest, evictions) = w.close();
        assert_eq!(evictions, 0);
        assert_eq!(rest.len(), 1);
        assert_eq!(rest[0].end, SnippetEnd::WindowEnd);
        assert_eq!((rest[0].unnamed, rest[0].identified), (2, 1));
        assert_eq!(rest[0].shapes.len(), 1);
        assert_eq!(rest[0].shapes[0].position, 0);
        let names: Vec<&str> = rest[0].names.iter().map(|n| &**n).collect();
        let shape = LaunchShape {
            config: LaunchConfig {
                grid: [1; 3],
                block: [1; 3],
                shared_mem_bytes: 0,
            },
            gap: 0,
        };
        assert_eq!(names, [&*shape_label(&shape.digest()), GRAPH, &*id]);
        assert_eq!(rest[0].shapes[0].digest, shape.digest());
    }

    #[test]
    fn samples_keep_their_position_and_the_window_knows_when_all_reached_the_limit() {
        use penrose_core::counters::CounterId;
        let mut w = Window::new(0, 3);
        let a: Arc<str> = Arc::from("a");
        let b: Arc<str> = Arc::from("b");
        let value = CounterValue {
            counter: CounterId(5),
            value: 1234.0,
        };
        w.record(
            &launch(1, 10, EntryPoint::LaunchKernel),
            Naming::Name(&a),
            None,
        );
        w.record(
            &launch(1, 11, EntryPoint::LaunchKernel),
            Naming::Name(&b),
            Some(SampledValues {
                group: CounterGroup(2),
                arch: GpuArch::new(9, 0),
                values: vec![value],
            }),
        );
        assert!(!w.all_at_limit());
        w.record(
            &launch(1, 10, EntryPoint::LaunchKernel),
            Naming::Name(&a),
            None,
        );
        assert!(w.is_at_limit(Pid(1)));
        assert!(w.all_at_limit());
        let done = w.take_finished();
        assert_eq!(
            done[0].samples,
            vec![Sample {
                position: 1,
                kernel: Arc::clone(&b),
                group: CounterGroup(2),
                arch: GpuArch::new(9, 0),
                values: vec![value],
            }]
        );
        // A second process still open keeps the window useful.
        w.record(
            &launch(2, 10, EntryPoint::LaunchKernel),
            Naming::Name(&a),
            None,
        );
        assert!(!w.all_at_limit());
    }

    #[test]
    fn a_sampled_shape_launch_is_labelled_by_its_shape() {
        let mut w = Window::new(0, 10);
        let value = CounterValue {
            counter: penrose_core::counters::CounterId(5),
            value: 1.0,
        };
        w.record(
            &shaped(1, 0x7f00, 64, 256, 0),
            Naming::None,
            Some(SampledValues {
                group: CounterGroup(1),
                arch: GpuArch::new(8, 0),
                values: vec![value],
            }),
        );
        let (snippets, _) = w.close();
        let s = &snippets[0];
        assert_eq!(s.samples[0].kernel, s.names[0]);
        assert!(s.names[0].starts_with(SHAPE_PREFIX), "{}", s.names[0]);
        assert_eq!(s.names[0].len(), SHAPE_PREFIX.len() + 16 + 1);
        // The label is the digest's prefix: it holds no handle, address or configuration.
        assert!(!s.names[0].contains("7f00") && !s.names[0].contains("256"));
    }

    /// (a) Two processes launching the same kernels in the same pattern, through different
    /// handle values (as every process has its own), partly named: equal snippet hashes.
    /// Another pattern of the same configurations: another hash.
    #[test]
    fn equal_unnamed_patterns_under_different_handles_give_equal_snippet_hashes() {
        let f = fingerprinter();
        let seq = pattern(3_000);
        let mut w = Window::new(0, 10_000);
        record_pattern(&mut w, 1, &seq, 3, |k| 0x7f00_1000_0000 + 0x40 * k as u64);
        // A bijection of the handles onto other values.
        record_pattern(&mut w, 2, &seq, 3, |k| {
            0x5555_0000_0000 + 0x1000 * ((k as u64 * 7) % 12)
        });
        // The same launches in another order (so other repetition distances).
        let mut shuffled = seq.clone();
        shuffled.sort_by_key(|&(k, _)| k);
        record_pattern(&mut w, 3, &shuffled, 3, |k| {
            0x7f00_1000_0000 + 0x40 * k as u64
        });
        let (snippets, _) = w.close();
        let [a, b, c] = &snippets[..] else {
            panic!("three snippets");
        };
        assert_eq!(a.shapes.len(), seq.iter().filter(|(k, _)| *k >= 3).count());
        assert_eq!(a.unnamed, a.shapes.len() as u64);
        assert_eq!(a.names, b.names, "equal labels too");
        assert_eq!(a.snippet_hash(&f), b.snippet_hash(&f));
        assert!(f.similarity(&a.snippet_hash(&f), &c.snippet_hash(&f)) < 0.5);
        // The shapes, not the placeholder: with every unnamed launch as one fixed name, the
        // fingerprint would be another one.
        let placeholder: Vec<Arc<str>> = a
            .elements()
            .iter()
            .map(|e| match e {
                Element::Name(n) => Arc::from(*n),
                Element::Digest(_) => Arc::from(UNNAMED),
            })
            .collect();
        assert_ne!(a.snippet_hash(&f), f.snippet_hash(&placeholder));
    }

    /// (b) Launch configurations that differ in any field give different shapes; so does the
    /// same configuration at another repetition distance.
    #[test]
    fn different_launch_configurations_give_different_shapes() {
        let mut w = Window::new(0, 100);
        let launches = [
            shaped(1, 1, 64, 256, 0),
            shaped(1, 2, 65, 256, 0),
            shaped(1, 3, 64, 128, 0),
            shaped(1, 4, 64, 256, 1024),
            Launch {
                grid: [64, 2, 1],
                ..shaped(1, 5, 64, 256, 0)
            },
            Launch {
                block: [256, 1, 2],
                ..shaped(1, 6, 64, 256, 0)
            },
        ];
        for l in &launches {
            assert_eq!(w.record(l, Naming::None, None), Recorded::Shape);
        }
        // Handle 1 again, same configuration, 6 launches later: another gap bucket.
        w.record(&launches[0], Naming::None, None);
        // A new handle with handle 1's configuration: a first launch, the same shape as
        // handle 1's first.
        w.record(&shaped(1, 99, 64, 256, 0), Naming::None, None);
        let (snippets, _) = w.close();
        let digests: Vec<NameDigest> = snippets[0].shapes.iter().map(|t| t.digest).collect();
        let distinct: HashSet<NameDigest> = digests[..7].iter().copied().collect();
        assert_eq!(distinct.len(), 7);
        assert_eq!(digests[7], digests[0]);
        let labels: HashSet<&Arc<str>> = snippets[0].names[..7].iter().collect();
        assert_eq!(labels.len(), 7);
    }

    /// (c) A window of named launches (and identities) fingerprints exactly as before shapes:
    /// the snippet hash of its names.
    #[test]
    fn named_launches_fingerprint_as_before() {
        let f = fingerprinter();
        let mut w = Window::new(0, 10_000);
        record_pattern(&mut w, 1, &pattern(2_500), 12, |k| 0x1000 + k as u64);
        let id: Arc<str> = Arc::from("<bid:abcd+0x40 g1x1x1 b32x1x1 s0>");
        for i in 0..50 {
            w.record(
                &launch(2, 0x2000, EntryPoint::LaunchKernel),
                Naming::Identity(&id),
                None,
            );
            if i % 5 == 0 {
                w.record(
                    &launch(2, 0x3000, EntryPoint::GraphLaunch),
                    Naming::None,
                    None,
                );
            }
        }
        let (snippets, _) = w.close();
        for s in &snippets {
            assert!(s.shapes.is_empty());
            assert!(s.elements().iter().all(|e| matches!(e, Element::Name(_))));
            assert_eq!(s.snippet_hash(&f), f.snippet_hash(&s.names));
        }
        assert_eq!(snippets[0].unnamed, 0);
        assert_eq!((snippets[1].unnamed, snippets[1].identified), (50, 50));
    }

    /// (d) A snippet's tracker holds at most [`MAX_SHAPE_HANDLES`] handles, evictions are
    /// counted, and its state goes with the snippet (a process's exit, the window's end).
    #[test]
    fn the_repetition_tracker_is_bounded_and_dropped_with_its_snippet() {
        let mut w = Window::new(0, usize::MAX);
        let extra = 100;
        for h in 0..(MAX_SHAPE_HANDLES + extra) as u64 {
            w.record(&shaped(1, h, 1, 32, 0), Naming::None, None);
            // A second process repeating few handles never evicts.
            w.record(&shaped(2, h % 8, 1, 32, 0), Naming::None, None);
        }
        assert_eq!(w.open[&Pid(1)].repetitions.handles(), MAX_SHAPE_HANDLES);
        assert_eq!(w.open[&Pid(2)].repetitions.handles(), 8);
        // The handle launched longest ago was forgotten: its launch counts as a first one.
        w.record(&shaped(1, 0, 1, 32, 0), Naming::None, None);
        w.exit(Pid(1));
        assert!(!w.open.contains_key(&Pid(1)), "state dropped at exit");
        assert_eq!(w.shape_evictions(), extra as u64 + 1);
        let exited = w.take_finished();
        let first = exited[0].shapes[0].digest;
        assert_eq!(exited[0].shapes.last().map(|t| t.digest), Some(first));
        // A new process with the same pid starts afresh.
        w.record(&shaped(1, 5, 1, 32, 0), Naming::None, None);
        assert_eq!(w.open[&Pid(1)].repetitions.handles(), 1);
        let (rest, evictions) = w.close();
        assert_eq!(evictions, extra as u64 + 1);
        assert_eq!(rest.len(), 2);
        assert_eq!((rest[0].pid, rest[0].shapes.len()), (Pid(1), 1));
        assert_eq!(rest[1].shapes.len(), rest[1].names.len());
    }

    #[test]
    fn a_snippet_end_is_named_as_in_json() {
        for end in [SnippetEnd::Limit, SnippetEnd::Exit, SnippetEnd::WindowEnd] {
            assert_eq!(
                serde_json::to_value(end).unwrap(),
                serde_json::Value::from(end.name())
            );
            let back: SnippetEnd = serde_json::from_value(end.name().into()).unwrap();
            assert_eq!(back, end);
        }
    }
}
