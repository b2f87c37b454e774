//! Every launch a capture recorded, in the order the agent read it, with its launch
//! configuration: what `penrose-agent capture --json --launches` prints so that an operator
//! can set the agent's view against a profiler's, launch by launch, on their own machine
//! (`ci/gpu-check.sh`). Off unless asked for, bounded, and never part of what the agent sends.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::events::Launch;
use super::window::{GRAPH, UNNAMED};

/// Most launches a log keeps; later ones are only counted.
pub const MAX_LOGGED_LAUNCHES: usize = 1_000_000;

/// One launch as the agent saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoggedLaunch {
    /// The window it was recorded in.
    pub window: u64,
    /// What the snippet holds for it: the kernel name, the identity of a launch no name
    /// reaches (`<bid:...>`), [`UNNAMED`] or [`GRAPH`].
    pub name: Arc<str>,
    /// The launch record.
    pub launch: Launch,
}

impl LoggedLaunch {
    /// Its line in `capture --json --launches` (`launch_log`).
    pub fn line(&self) -> LaunchLine {
        let l = &self.launch;
        LaunchLine {
            pid: l.pid.0,
            tid: l.tid,
            ts_ns: l.timestamp_ns,
            window: self.window,
            entry: l.entry.symbol().to_string(),
            name: self.name.to_string(),
            grid: l.grid,
            block: l.block,
            smem: l.shared_mem_bytes,
            stream: l.stream,
        }
    }
}

/// One launch as `capture --json --launches` prints it, and as a reader of that output (the
/// GPU check's comparison with a profiler) takes it back.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LaunchLine {
    /// The process.
    pub pid: u32,
    /// The thread.
    pub tid: u32,
    /// `bpf_ktime_get_ns` (CLOCK_MONOTONIC), nanoseconds.
    pub ts_ns: u64,
    /// The window it was recorded in.
    pub window: u64,
    /// The driver entry point called (`cuLaunchKernel`, ...).
    pub entry: String,
    /// The name the snippet gives it (see [`LoggedLaunch::name`]).
    pub name: String,
    /// Grid dimensions.
    pub grid: [u32; 3],
    /// Block dimensions.
    pub block: [u32; 3],
    /// Dynamic shared memory, bytes.
    pub smem: u32,
    /// `CUstream`.
    pub stream: u64,
}

/// The launches of a capture in reading order, up to a limit.
#[derive(Debug, Default)]
pub struct LaunchLog {
    limit: usize,
    launches: Vec<LoggedLaunch>,
    beyond_limit: u64,
}

impl LaunchLog {
    /// A log that keeps up to `limit` launches (0: an empty log that records nothing).
    pub fn new(limit: usize) -> Self {
        Self {
            limit,
            launches: Vec::new(),
            beyond_limit: 0,
        }
    }

    /// Whether it records anything.
    pub fn is_on(&self) -> bool {
        self.limit > 0
    }

    /// Records a launch of window `window` under the name its snippet gives it (`None`:
    /// unnamed, or a graph).
    pub fn record(&mut self, window: u64, launch: &Launch, name: Option<&Arc<str>>) {
        if !self.is_on() {
            return;
        }
        if self.launches.len() >= self.limit {
            self.beyond_limit += 1;
            return;
        }
        let name = match name {
            Some(n) => Arc::clone(n),
            None if launch.is_opaque_graph() => Arc::from(GRAPH),
            None => Arc::from(UNNAMED),
        };
        self.launches.push(LoggedLaunch {
            window,
            name,
            launch: *launch,
        });
    }

    /// The launches kept, in reading order.
    pub fn launches(&self) -> &[LoggedLaunch] {
        &self.launches
    }

    /// Launches not kept because the log was full.
    pub fn beyond_limit(&self) -> u64 {
        self.beyond_limit
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capture::events::Pid;
    use penrose_ebpf_common::EntryPoint;

    fn launch(ts: u64, entry: EntryPoint) -> Launch {
        Launch {
            pid: Pid(7),
            tid: 8,
            sampled: false,
            graph_position: 0,
            in_graph: false,
            timestamp_ns: ts,
            function: 0xf00,
            stream: 0x5,
            grid: [4, 2, 1],
            block: [128, 1, 1],
            shared_mem_bytes: 1024,
            entry,
            caller: 0x1234,
        }
    }

    #[test]
    fn keeps_launches_in_order_with_their_names_and_configurations_up_to_the_limit() {
        let mut log = LaunchLog::new(3);
        let named: Arc<str> = Arc::from("_Z6kernelPf");
        let identity: Arc<str> = Arc::from("<bid:ab+0x10 g4x2x1 b128x1x1 s1024>");
        log.record(0, &launch(1, EntryPoint::LaunchKernel), Some(&named));
        log.record(0, &launch(2, EntryPoint::LaunchKernelEx), Some(&identity));
        log.record(1, &launch(3, EntryPoint::LaunchKernel), None);
        log.record(1, &launch(4, EntryPoint::GraphLaunch), None);
        assert_eq!(log.beyond_limit(), 1);
        let lines: Vec<LaunchLine> = log.launches().iter().map(LoggedLaunch::line).collect();
        let names: Vec<&str> = lines.iter().map(|l| l.name.as_str()).collect();
        assert_eq!(names, [&*named, &*identity, UNNAMED]);
        let json: Vec<serde_json::Value> = lines
            .iter()
            .map(|l| serde_json::to_value(l).unwrap())
            .collect();
        assert_eq!(
            json[1],
            serde_json::json!({
                "pid": 7, "tid": 8, "ts_ns": 2, "window": 0, "entry": "cuLaunchKernelEx",
                "name": &*identity, "grid": [4, 2, 1], "block": [128, 1, 1], "smem": 1024,
                "stream": 5,
            })
        );
        assert_eq!(json[2]["window"], 1);
        let back: LaunchLine = serde_json::from_value(json[1].clone()).unwrap();
        assert_eq!(back, lines[1]);
    }

    #[test]
    fn graph_launches_are_named_as_in_snippets_and_an_off_log_records_nothing() {
        let mut log = LaunchLog::new(10);
        log.record(0, &launch(1, EntryPoint::GraphLaunchPtsz), None);
        assert_eq!(&*log.launches()[0].name, GRAPH);
        let mut off = LaunchLog::default();
        assert!(!off.is_on());
        off.record(0, &launch(1, EntryPoint::LaunchKernel), None);
        assert!(off.launches().is_empty());
        assert_eq!(off.beyond_limit(), 0);
    }
}
