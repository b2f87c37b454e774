//! Capture windows and the snippets they produce.
//!
//! Launch probes cost a trap per launch, so they are attached only inside windows (DESIGN.md
//! section 3). A window lasts at most its duration; inside it each process contributes one
//! snippet: the kernel names it launched, up to L launches, ended early by the process's exit
//! or by the window's end.
//!
//! The scheduler here is the simple one: windows of a fixed duration every fixed period. The
//! overhead-budget scheduler (spacing windows from the measured probe cost) is not built yet.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use super::events::{Launch, Pid};

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

    /// Adds a launch to its process's snippet, named `name` (`None`: unnamed).
    pub fn record(&mut self, launch: &Launch, name: Option<&Arc<str>>) {
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
        });
        let name = match name {
            Some(n) => Arc::clone(n),
            None if launch.entry.is_graph() => Arc::from(GRAPH),
            None => {
                snippet.unnamed += 1;
                Arc::from(UNNAMED)
            }
        };
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

/// Fixed windows: `duration` out of every `period`, the first at start.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Schedule {
    /// Time from one window's start to the next one's.
    pub period: Duration,
    /// How long a window stays open at most.
    pub duration: Duration,
}

impl Schedule {
    /// Whether a window is open `elapsed` after the start.
    pub fn is_open_at(&self, elapsed: Duration) -> bool {
        let period = self.period.as_nanos().max(1);
        elapsed.as_nanos() % period < self.duration.as_nanos()
    }

    /// The fraction of time with launch probes attached.
    pub fn duty_cycle(&self) -> f64 {
        (self.duration.as_secs_f64() / self.period.as_secs_f64().max(f64::MIN_POSITIVE)).min(1.0)
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
        }
    }

    #[test]
    fn snippets_end_at_the_limit_and_ignore_the_rest_of_the_window() {
        let mut w = Window::new(3, 2);
        let a: Arc<str> = Arc::from("a");
        for _ in 0..5 {
            w.record(&launch(1, 10, EntryPoint::LaunchKernel), Some(&a));
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
        w.record(&launch(1, 10, EntryPoint::LaunchKernel), Some(&a));
        w.record(&launch(2, 10, EntryPoint::LaunchKernel), None);
        w.record(&launch(2, 11, EntryPoint::GraphLaunch), None);
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
    fn fixed_schedule_opens_the_first_part_of_each_period() {
        let s = Schedule {
            period: Duration::from_secs(10),
            duration: Duration::from_secs(2),
        };
        assert!(s.is_open_at(Duration::ZERO));
        assert!(s.is_open_at(Duration::from_millis(1999)));
        assert!(!s.is_open_at(Duration::from_secs(2)));
        assert!(s.is_open_at(Duration::from_secs(21)));
        assert!((s.duty_cycle() - 0.2).abs() < 1e-12);
    }
}
