//! Capture windows and the snippets they produce.
//!
//! Launch probes cost a trap per launch, so they are attached only inside windows (DESIGN.md
//! section 3). A window lasts at most its duration; inside it each process contributes one
//! snippet: the kernel names it launched, up to L launches, ended early by the process's exit
//! or by the window's end.
//!
//! When windows open is [`super::schedule`]'s business.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use penrose_core::counters::CounterGroup;

use super::events::{Launch, Pid};
use crate::counters::CounterValue;

/// L of DESIGN.md: launches per process per window.
pub const DEFAULT_WINDOW_LAUNCHES: usize = 10_000;

/// Why a snippet ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SnippetEnd {
    /// It reached L launches.
    Limit,
    /// The process exited inside the window.
    Exit,
    /// The window closed first.
    WindowEnd,
}

/// The kernel names one process launched in one window.
#[derive(Clone, Debug)]
pub struct Snippet {
    /// The process.
    pub pid: Pid,
    /// Index of the window (0 for the agent's first).
    pub window: u64,
    /// Kernel names in launch order. A launch whose handle was never named is
    /// [`UNNAMED`]; a graph launch is [`GRAPH`].
    pub names: Vec<Arc<str>>,
    /// Launches among `names` whose function handle had no name.
    pub unnamed: u64,
    /// Why it ended.
    pub end: SnippetEnd,
    /// The launches among `names` that the BPF countdown sampled and that have counter values.
    pub samples: Vec<Sample>,
}

/// A sampled launch and its counter values.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    /// Its position in the snippet's `names`.
    pub position: usize,
    /// Its kernel name (as in `names`).
    pub kernel: Arc<str>,
    /// The counter group that was active.
    pub group: CounterGroup,
    /// The values the counter source read.
    pub values: Vec<CounterValue>,
}

/// Stands for a launch of a handle the name probes never saw (resolved before the agent
/// attached, or by an API the agent does not probe).
pub const UNNAMED: &str = "<unnamed>";
/// Stands for a `cuGraphLaunch`: its handle names a graph, not a kernel.
pub const GRAPH: &str = "<graph>";

/// One open window: snippets being built.
#[derive(Debug)]
pub struct Window {
    index: u64,
    limit: usize,
    open: HashMap<Pid, Snippet>,
    at_limit: HashSet<Pid>,
    finished: Vec<Snippet>,
    beyond_limit: u64,
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

    /// Adds a launch to its process's snippet, named `name` (`None`: unnamed), with its
    /// counter values when it was sampled.
    pub fn record(
        &mut self,
        launch: &Launch,
        name: Option<&Arc<str>>,
        sample: Option<(CounterGroup, Vec<crate::counters::CounterValue>)>,
    ) {
        if self.at_limit.contains(&launch.pid) {
            self.beyond_limit += 1;
            return;
        }
        let index = self.index;
        let snippet = self.open.entry(launch.pid).or_insert_with(|| Snippet {
            pid: launch.pid,
            window: index,
            names: Vec::new(),
            unnamed: 0,
            end: SnippetEnd::WindowEnd,
            samples: Vec::new(),
        });
        let name = match name {
            Some(n) => Arc::clone(n),
            None if launch.entry.is_graph() => Arc::from(GRAPH),
            None => {
                snippet.unnamed += 1;
                Arc::from(UNNAMED)
            }
        };
        if let Some((group, values)) = sample {
            snippet.samples.push(Sample {
                position: snippet.names.len(),
                kernel: Arc::clone(&name),
                group,
                values,
            });
        }
        snippet.names.push(name);
        if snippet.names.len() >= self.limit {
            self.finish(launch.pid, SnippetEnd::Limit);
            self.at_limit.insert(launch.pid);
        }
    }

    /// The process exited: its snippet ends here. A later process with the same pid starts a
    /// new one.
    pub fn exit(&mut self, pid: Pid) {
        self.finish(pid, SnippetEnd::Exit);
        self.at_limit.remove(&pid);
    }

    fn finish(&mut self, pid: Pid, end: SnippetEnd) {
        if let Some(mut s) = self.open.remove(&pid) {
            s.end = end;
            self.finished.push(s);
        }
    }

    /// Snippets that have ended, leaving the open ones.
    pub fn take_finished(&mut self) -> Vec<Snippet> {
        std::mem::take(&mut self.finished)
    }

    /// Launches ignored because their process had already reached L in this window.
    pub fn beyond_limit(&self) -> u64 {
        self.beyond_limit
    }

    /// Closes the window: every open snippet ends with [`SnippetEnd::WindowEnd`].
    pub fn close(mut self) -> Vec<Snippet> {
        let mut open: Vec<Snippet> = self.open.drain().map(|(_, s)| s).collect();
        open.sort_by_key(|s| s.pid);
        self.finished.extend(open);
        self.finished
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use penrose_ebpf_common::EntryPoint;

    fn launch(pid: u32, function: u64, entry: EntryPoint) -> Launch {
        Launch {
            pid: Pid(pid),
            tid: pid,
            sampled: false,
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

    #[test]
    fn snippets_end_at_the_limit_and_ignore_the_rest_of_the_window() {
        let mut w = Window::new(3, 2);
        let a: Arc<str> = Arc::from("a");
        for _ in 0..5 {
            w.record(&launch(1, 10, EntryPoint::LaunchKernel), Some(&a), None);
        }
        let done = w.take_finished();
        assert_eq!(done.len(), 1);
        assert_eq!(done[0].end, SnippetEnd::Limit);
        assert_eq!(done[0].names.len(), 2);
        assert_eq!(done[0].window, 3);
        assert_eq!(w.beyond_limit(), 3);
        assert!(w.close().is_empty());
    }

    #[test]
    fn exits_and_window_ends_close_snippets_per_process() {
        let mut w = Window::new(0, 100);
        let a: Arc<str> = Arc::from("a");
        w.record(&launch(1, 10, EntryPoint::LaunchKernel), Some(&a), None);
        w.record(&launch(2, 10, EntryPoint::LaunchKernel), None, None);
        w.record(&launch(2, 11, EntryPoint::GraphLaunch), None, None);
        w.exit(Pid(1));
        w.exit(Pid(99));
        let exited = w.take_finished();
        assert_eq!(exited.len(), 1);
        assert_eq!((exited[0].pid, exited[0].end), (Pid(1), SnippetEnd::Exit));
        let rest = w.close();
        assert_eq!(rest.len(), 1);
        assert_eq!(rest[0].end, SnippetEnd::WindowEnd);
        assert_eq!(rest[0].unnamed, 1);
        let names: Vec<&str> = rest[0].names.iter().map(|n| &**n).collect();
        assert_eq!(names, [UNNAMED, GRAPH]);
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
        w.record(&launch(1, 10, EntryPoint::LaunchKernel), Some(&a), None);
        w.record(
            &launch(1, 11, EntryPoint::LaunchKernel),
            Some(&b),
            Some((CounterGroup(2), vec![value])),
        );
        assert!(!w.all_at_limit());
        w.record(&launch(1, 10, EntryPoint::LaunchKernel), Some(&a), None);
        assert!(w.is_at_limit(Pid(1)));
        assert!(w.all_at_limit());
        let done = w.take_finished();
        assert_eq!(
            done[0].samples,
            vec![Sample {
                position: 1,
                kernel: Arc::clone(&b),
                group: CounterGroup(2),
                values: vec![value],
            }]
        );
        // A second process still open keeps the window useful.
        w.record(&launch(2, 10, EntryPoint::LaunchKernel), Some(&a), None);
        assert!(!w.all_at_limit());
    }
}
