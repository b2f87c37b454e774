//! CUDA graphs per process: which kernels each executable graph runs, so a graph launch enters
//! a snippet as its kernels (docs/architecture.md, "Graphs").
//!
//! The graph probes report how graphs are built and changed; this module keeps, per process:
//! - the streams being captured, with the kernels launched on them meanwhile (the driver
//!   records them instead of running them);
//! - graphs, as their kernel nodes in the order they were added (a topological order: a node
//!   is added after its dependencies, and capture order follows stream order);
//! - executable graphs, each with the kernels it runs now (instantiation copies a graph;
//!   per-node parameter changes and whole updates change the copy, not the graph).
//!
//! A graph whose construction was not fully seen is *incomplete*: a capture that began before
//! the launch probes were attached (or outlived them), or one over the bounds. Its launches
//! stay one opaque `<graph>` element, as before expansion existed, and are counted.
//!
//! Memory is bounded per graph ([`Limits::per_graph`]), per process and per host: a node
//! costs one unit and so does each graph, executable graph and capture, and node lists are
//! shared between a graph and the executable graphs made from it until one of them changes.

use std::collections::HashMap;
use std::sync::Arc;

use penrose_ebpf_common::GraphOp;

use super::events::{Launch, Pid};

/// How much graph state the agent keeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Most kernel nodes in one graph (graphs of 100,000 nodes exist).
    pub per_graph: usize,
    /// Most units (nodes, graphs, executable graphs, captures) per process.
    pub per_process: usize,
    /// Most units on the host, all processes together.
    pub per_host: usize,
}

impl Default for Limits {
    /// About 56 bytes a unit: at most 7 MiB per graph, 14 MiB per process, 56 MiB per host.
    fn default() -> Self {
        Self {
            per_graph: 131_072,
            per_process: 262_144,
            per_host: 1_048_576,
        }
    }
}

/// One kernel node: what it launches and how.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelNode {
    /// The `CUgraphNode` (zero for a node recorded by stream capture: nothing names it).
    pub node: u64,
    /// The `CUfunction`, or zero when the node names a `CUkernel` instead.
    pub function: u64,
    /// The `CUkernel` of v2 node parameters; zero otherwise.
    pub kernel: u64,
    /// Grid dimensions.
    pub grid: [u32; 3],
    /// Block dimensions.
    pub block: [u32; 3],
    /// Dynamic shared memory, bytes.
    pub shared_mem_bytes: u32,
}

impl KernelNode {
    /// A launch recorded by stream capture.
    pub fn captured(launch: &Launch) -> Self {
        Self {
            node: 0,
            function: launch.function,
            kernel: 0,
            grid: launch.grid,
            block: launch.block,
            shared_mem_bytes: launch.shared_mem_bytes,
        }
    }
}

/// A decoded graph record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GraphChange {
    /// Process.
    pub pid: Pid,
    /// Thread.
    pub tid: u32,
    /// What happened.
    pub op: GraphOp,
    /// `bpf_ktime_get_ns` at the probe.
    pub timestamp_ns: u64,
    /// The `CUgraph`.
    pub graph: u64,
    /// The `CUgraphExec`.
    pub exec: u64,
    /// The `CUstream` of a capture.
    pub stream: u64,
    /// The node and its parameters (node parameter records).
    pub node: KernelNode,
}

/// What a graph launch enters a snippet as.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Expansion {
    /// Its kernels, in order.
    Kernels(Arc<Vec<KernelNode>>),
    /// One opaque element, for this reason.
    Opaque(Opaque),
}

/// Why a graph launch stays one opaque element.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Opaque {
    /// The executable graph was made before the agent attached (or its record was lost).
    Unknown,
    /// Some of its construction was not seen (a capture outside a window) or exceeded the
    /// bounds.
    Incomplete,
}

/// What the BPF side's kernel counts need after a change.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KernelCount {
    /// `exec` of `pid` runs this many kernels.
    Set {
        /// Process.
        pid: Pid,
        /// The `CUgraphExec`.
        exec: u64,
        /// Its kernels.
        kernels: u32,
    },
    /// `exec` of `pid` is gone or no longer known: launches count as one.
    Remove {
        /// Process.
        pid: Pid,
        /// The `CUgraphExec`.
        exec: u64,
    },
}

/// What the graph state has seen, for `status`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct GraphCounts {
    /// Graph records read.
    pub graph_events: u64,
    /// Launches recorded into a capture (not run, so neither recorded nor sampled).
    pub captured_launches: u64,
    /// Executable graphs made from a fully seen graph.
    pub instantiated: u64,
    /// Executable graphs made from a graph not fully seen.
    pub instantiated_incomplete: u64,
    /// Graph launches that entered snippets as their kernels.
    pub launches_expanded: u64,
    /// Kernels those launches entered as.
    pub kernels_expanded: u64,
    /// Graph launches that stayed `<graph>` because the graph was never seen.
    pub launches_unknown: u64,
    /// Graph launches that stayed `<graph>` because the graph was not fully seen.
    pub launches_incomplete: u64,
    /// Nodes or graphs not kept because a bound was reached.
    pub over_bounds: u64,
}

/// A node list and whether it is the whole of its graph.
#[derive(Clone, Debug)]
struct Body {
    nodes: Arc<Vec<KernelNode>>,
    complete: bool,
}

impl Body {
    fn empty(complete: bool) -> Self {
        Self {
            nodes: Arc::new(Vec::new()),
            complete,
        }
    }
}

/// One process's captures, graphs and executable graphs.
#[derive(Debug, Default)]
struct ProcessGraphs {
    captures: HashMap<u64, Body>,
    graphs: HashMap<u64, Body>,
    execs: HashMap<u64, Body>,
    /// Per thread, the parameters of the node being added, until its handle comes back.
    adding: HashMap<u32, (u64, KernelNode)>,
    units: usize,
}

/// Most threads with a node addition in flight per process.
const MAX_ADDING: usize = 4096;

/// Every process's graphs, within [`Limits`].
#[derive(Debug, Default)]
pub struct Graphs {
    processes: HashMap<Pid, ProcessGraphs>,
    limits: Limits,
    units: usize,
    counts: GraphCounts,
}

impl Graphs {
    /// Empty state with these bounds.
    pub fn new(limits: Limits) -> Self {
        Self {
            limits,
            ..Self::default()
        }
    }

    /// What has been seen so far.
    pub fn counts(&self) -> GraphCounts {
        self.counts
    }

    /// Units held on the host (nodes, graphs, executable graphs, captures).
    pub fn units(&self) -> usize {
        self.units
    }

    /// Applies one graph record. `probes_since` is when the launch probes were last attached
    /// (`None` while they are not): a capture that began before then is incomplete. Returns
    /// what the BPF side's kernel count of an executable graph must become, if anything.
    pub fn apply(
        &mut self,
        change: &GraphChange,
        probes_since: Option<u64>,
    ) -> Option<KernelCount> {
        self.counts.graph_events += 1;
        match change.op {
            GraphOp::CaptureBegin => {
                let complete = probes_since.is_some_and(|since| since <= change.timestamp_ns);
                self.begin_capture(change, complete);
                None
            }
            GraphOp::CaptureEnd => {
                self.end_capture(change);
                None
            }
            GraphOp::KernelNodeParams => {
                self.node_params(change);
                None
            }
            GraphOp::KernelNodeAdded => {
                self.node_added(change);
                None
            }
            GraphOp::Instantiated | GraphOp::ExecUpdated => self.instantiate(change),
            GraphOp::ExecNodeParams => self.exec_node_params(change),
            GraphOp::GraphDestroyed => {
                self.remove(change.pid, Place::Graph(change.graph));
                None
            }
            GraphOp::ExecDestroyed => {
                self.remove(change.pid, Place::Exec(change.exec));
                Some(KernelCount::Remove {
                    pid: change.pid,
                    exec: change.exec,
                })
            }
        }
    }

    /// Whether `stream` of `pid` is being captured: its launches are recorded, not run.
    pub fn capturing(&self, pid: Pid, stream: u64) -> bool {
        self.processes
            .get(&pid)
            .is_some_and(|p| p.captures.contains_key(&stream))
    }

    /// Records a launch on a capturing stream into its capture.
    pub fn captured(&mut self, launch: &Launch) {
        self.counts.captured_launches += 1;
        let node = KernelNode::captured(launch);
        self.push_node(launch.pid, Place::Capture(launch.stream), node);
    }

    /// What a launch of `exec` by `pid` enters a snippet as; counted.
    pub fn expansion(&mut self, pid: Pid, exec: u64) -> Expansion {
        let body = self.processes.get(&pid).and_then(|p| p.execs.get(&exec));
        match body {
            Some(body) if body.complete => {
                self.counts.launches_expanded += 1;
                self.counts.kernels_expanded += body.nodes.len() as u64;
                Expansion::Kernels(Arc::clone(&body.nodes))
            }
            Some(_) => {
                self.counts.launches_incomplete += 1;
                Expansion::Opaque(Opaque::Incomplete)
            }
            None => {
                self.counts.launches_unknown += 1;
                Expansion::Opaque(Opaque::Unknown)
            }
        }
    }

    /// The launch probes were detached: captures still open miss their later launches.
    pub fn probes_detached(&mut self) {
        for process in self.processes.values_mut() {
            for capture in process.captures.values_mut() {
                capture.complete = false;
            }
        }
    }

    /// The ring lost records: any graph state may have missed a node, a change or a
    /// destruction, so every capture, graph and executable graph is no longer whole (its later
    /// launches stay `<graph>` until it is built again). Returns the executable graphs, whose
    /// BPF-side kernel counts must go.
    pub fn records_lost(&mut self) -> Vec<(Pid, u64)> {
        let mut execs = Vec::new();
        for (pid, process) in &mut self.processes {
            let bodies = process
                .captures
                .values_mut()
                .chain(process.graphs.values_mut());
            for body in bodies {
                body.complete = false;
            }
            for (exec, body) in &mut process.execs {
                body.complete = false;
                execs.push((*pid, *exec));
            }
        }
        execs
    }

    /// The process exited: its state goes. Returns its executable graphs, whose BPF-side
    /// kernel counts must go too.
    pub fn exited(&mut self, pid: Pid) -> Vec<u64> {
        let Some(process) = self.processes.remove(&pid) else {
            return Vec::new();
        };
        self.units -= process.units;
        process.execs.into_keys().collect()
    }

    fn begin_capture(&mut self, change: &GraphChange, complete: bool) {
        let pid = change.pid;
        self.remove(pid, Place::Capture(change.stream));
        if self.charge(pid, 1) {
            self.process(pid)
                .captures
                .insert(change.stream, Body::empty(complete));
        }
    }

    fn end_capture(&mut self, change: &GraphChange) {
        let pid = change.pid;
        let Some(body) = self
            .processes
            .get_mut(&pid)
            .and_then(|p| p.captures.remove(&change.stream))
        else {
            return;
        };
        if change.graph == 0 {
            self.release(pid, &body);
            return;
        }
        self.remove(pid, Place::Graph(change.graph));
        self.process(pid).graphs.insert(change.graph, body);
    }

    fn node_params(&mut self, change: &GraphChange) {
        let earlier = self
            .processes
            .get(&change.pid)
            .and_then(|p| p.adding.get(&change.tid))
            .map(|(graph, _)| *graph);
        if let Some(graph) = earlier {
            // The thread's previous addition never returned a node: it failed, or its record
            // was lost. Either way that graph may lack a node.
            self.incomplete(change.pid, Place::Graph(graph));
        }
        let process = self.process(change.pid);
        if process.adding.len() < MAX_ADDING || process.adding.contains_key(&change.tid) {
            process
                .adding
                .insert(change.tid, (change.graph, change.node));
        }
    }

    fn node_added(&mut self, change: &GraphChange) {
        let pending = self
            .processes
            .get_mut(&change.pid)
            .and_then(|p| p.adding.remove(&change.tid));
        let Some((graph, mut node)) = pending.filter(|(graph, _)| *graph == change.graph) else {
            // A node whose parameters were not seen (a lost record): the graph lacks it.
            self.incomplete(change.pid, Place::Graph(change.graph));
            return;
        };
        node.node = change.node.node;
        let known = self
            .processes
            .get(&change.pid)
            .is_some_and(|p| p.graphs.contains_key(&graph));
        if !known {
            // A graph made by `cuGraphCreate` (not probed): it starts empty, and so is whole.
            if !self.charge(change.pid, 1) {
                return;
            }
            self.process(change.pid)
                .graphs
                .insert(graph, Body::empty(true));
        }
        self.push_node(change.pid, Place::Graph(graph), node);
    }

    fn instantiate(&mut self, change: &GraphChange) -> Option<KernelCount> {
        let pid = change.pid;
        let body = self
            .processes
            .get(&pid)
            .and_then(|p| p.graphs.get(&change.graph))
            .cloned();
        let updating = change.op == GraphOp::ExecUpdated;
        let body = match body {
            Some(body) => body,
            // An update from a graph never seen leaves an exec that runs who knows what.
            None if updating => Body::empty(false),
            None => return None,
        };
        if body.complete {
            self.counts.instantiated += 1;
        } else {
            self.counts.instantiated_incomplete += 1;
        }
        self.remove(pid, Place::Exec(change.exec));
        if !self.charge(pid, 1) {
            return Some(KernelCount::Remove {
                pid,
                exec: change.exec,
            });
        }
        let count = kernel_count(pid, change.exec, &body);
        self.process(pid).execs.insert(change.exec, body);
        Some(count)
    }

    fn exec_node_params(&mut self, change: &GraphChange) -> Option<KernelCount> {
        let (pid, place) = (change.pid, Place::Exec(change.exec));
        let body = self.body(pid, place)?;
        let position = body.nodes.iter().position(|n| n.node == change.node.node);
        let shared = Arc::strong_count(&body.nodes) > 1;
        let len = body.nodes.len();
        // A node the agent does not know (a captured one), or no room for the exec's own copy:
        // what the exec runs is unsure.
        let Some(position) = position.filter(|_| !shared || self.charge(pid, len)) else {
            self.incomplete(pid, place);
            return Some(KernelCount::Remove {
                pid,
                exec: change.exec,
            });
        };
        let body = self.body(pid, place)?;
        Arc::make_mut(&mut body.nodes)[position] = change.node;
        None
    }

    fn push_node(&mut self, pid: Pid, place: Place, node: KernelNode) {
        let Some(body) = self.body(pid, place) else {
            return;
        };
        let len = body.nodes.len();
        let shared = Arc::strong_count(&body.nodes) > 1;
        let cost = if shared { len + 1 } else { 1 };
        if len >= self.limits.per_graph || !self.charge(pid, cost) {
            self.counts.over_bounds += 1;
            self.incomplete(pid, place);
            return;
        }
        if let Some(body) = self.body(pid, place) {
            Arc::make_mut(&mut body.nodes).push(node);
        }
    }

    fn incomplete(&mut self, pid: Pid, place: Place) {
        if let Some(body) = self.body(pid, place) {
            body.complete = false;
        }
    }

    fn body(&mut self, pid: Pid, place: Place) -> Option<&mut Body> {
        let process = self.processes.get_mut(&pid)?;
        match place {
            Place::Capture(stream) => process.captures.get_mut(&stream),
            Place::Graph(graph) => process.graphs.get_mut(&graph),
            Place::Exec(exec) => process.execs.get_mut(&exec),
        }
    }

    fn remove(&mut self, pid: Pid, place: Place) {
        let removed = self.processes.get_mut(&pid).and_then(|p| match place {
            Place::Capture(stream) => p.captures.remove(&stream),
            Place::Graph(graph) => p.graphs.remove(&graph),
            Place::Exec(exec) => p.execs.remove(&exec),
        });
        if let Some(body) = removed {
            self.release(pid, &body);
        }
    }

    /// Gives back a removed body's units: its own, and its nodes when no one else holds them.
    fn release(&mut self, pid: Pid, body: &Body) {
        let nodes = if Arc::strong_count(&body.nodes) == 1 {
            body.nodes.len()
        } else {
            0
        };
        let units = nodes + 1;
        self.units = self.units.saturating_sub(units);
        if let Some(process) = self.processes.get_mut(&pid) {
            process.units = process.units.saturating_sub(units);
        }
    }

    /// Takes `units` for `pid` if the bounds allow; counts a refusal.
    fn charge(&mut self, pid: Pid, units: usize) -> bool {
        let held = self.processes.get(&pid).map_or(0, |p| p.units);
        if held + units > self.limits.per_process || self.units + units > self.limits.per_host {
            self.counts.over_bounds += 1;
            return false;
        }
        self.units += units;
        self.process(pid).units += units;
        true
    }

    fn process(&mut self, pid: Pid) -> &mut ProcessGraphs {
        self.processes.entry(pid).or_default()
    }
}

/// Which node list: a capture's (by stream), a graph's or an executable graph's.
#[derive(Clone, Copy, Debug)]
enum Place {
    Capture(u64),
    Graph(u64),
    Exec(u64),
}

fn kernel_count(pid: Pid, exec: u64, body: &Body) -> KernelCount {
    match u32::try_from(body.nodes.len()) {
        Ok(kernels) if body.complete => KernelCount::Set { pid, exec, kernels },
        _ => KernelCount::Remove { pid, exec },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use penrose_ebpf_common::EntryPoint;

    const PID: Pid = Pid(7);
    const STREAM: u64 = 0x5000;

    fn change(op: GraphOp) -> GraphChange {
        GraphChange {
            pid: PID,
            tid: 70,
            op,
            timestamp_ns: 1_000,
            graph: 0,
            exec: 0,
            stream: 0,
            node: KernelNode::captured(&launch(0)),
        }
    }

    fn launch(function: u64) -> Launch {
        Launch {
            pid: PID,
            tid: 70,
            sampled: false,
            graph_position: 0,
            in_graph: false,
            timestamp_ns: 2_000,
            function,
            stream: STREAM,
            grid: [function as u32, 1, 1],
            block: [128, 1, 1],
            shared_mem_bytes: 0,
            entry: EntryPoint::LaunchKernel,
            caller: 0,
        }
    }

    /// Captures `functions` on [`STREAM`] into `graph` and instantiates it as `exec`.
    fn capture(
        graphs: &mut Graphs,
        probes_since: Option<u64>,
        functions: &[u64],
        graph: u64,
        exec: u64,
    ) -> Option<KernelCount> {
        let begin = GraphChange {
            stream: STREAM,
            ..change(GraphOp::CaptureBegin)
        };
        graphs.apply(&begin, probes_since);
        for &f in functions {
            assert!(graphs.capturing(PID, STREAM));
            graphs.captured(&launch(f));
        }
        let end = GraphChange {
            stream: STREAM,
            graph,
            ..change(GraphOp::CaptureEnd)
        };
        graphs.apply(&end, probes_since);
        assert!(!graphs.capturing(PID, STREAM));
        let instantiated = GraphChange {
            graph,
            exec,
            ..change(GraphOp::Instantiated)
        };
        graphs.apply(&instantiated, probes_since)
    }

    fn functions(expansion: &Expansion) -> Vec<u64> {
        match expansion {
            Expansion::Kernels(nodes) => nodes.iter().map(|n| n.function).collect(),
            Expansion::Opaque(why) => panic!("opaque: {why:?}"),
        }
    }

    fn add_node(graphs: &mut Graphs, graph: u64, node: u64, function: u64) {
        let params = GraphChange {
            graph,
            node: KernelNode {
                function,
                ..KernelNode::captured(&launch(function))
            },
            ..change(GraphOp::KernelNodeParams)
        };
        graphs.apply(&params, None);
        let added = GraphChange {
            graph,
            node: KernelNode {
                node,
                ..KernelNode::captured(&launch(0))
            },
            ..change(GraphOp::KernelNodeAdded)
        };
        graphs.apply(&added, None);
    }

    #[test]
    fn a_capture_seen_whole_expands_into_its_kernels_in_order() {
        let mut graphs = Graphs::default();
        let count = capture(&mut graphs, Some(500), &[3, 1, 2, 1], 0x6a, 0xe0);
        assert_eq!(
            count,
            Some(KernelCount::Set {
                pid: PID,
                exec: 0xe0,
                kernels: 4
            })
        );
        assert_eq!(functions(&graphs.expansion(PID, 0xe0)), [3, 1, 2, 1]);
        let counts = graphs.counts();
        assert_eq!(counts.captured_launches, 4);
        assert_eq!((counts.launches_expanded, counts.kernels_expanded), (1, 4));
    }

    #[test]
    fn a_capture_begun_before_the_probes_or_outliving_them_stays_opaque() {
        let mut graphs = Graphs::default();
        // Probes attached after the capture began (at 1,000 ns).
        let count = capture(&mut graphs, Some(1_500), &[3, 1], 0x6a, 0xe0);
        assert_eq!(
            count,
            Some(KernelCount::Remove {
                pid: PID,
                exec: 0xe0
            })
        );
        assert_eq!(
            graphs.expansion(PID, 0xe0),
            Expansion::Opaque(Opaque::Incomplete)
        );
        // Probes not attached at all.
        capture(&mut graphs, None, &[], 0x6b, 0xe1);
        assert_eq!(
            graphs.expansion(PID, 0xe1),
            Expansion::Opaque(Opaque::Incomplete)
        );
        // Detached in the middle.
        let begin = GraphChange {
            stream: STREAM,
            ..change(GraphOp::CaptureBegin)
        };
        graphs.apply(&begin, Some(0));
        graphs.probes_detached();
        let end = GraphChange {
            stream: STREAM,
            graph: 0x6c,
            ..change(GraphOp::CaptureEnd)
        };
        graphs.apply(&end, None);
        let instantiated = GraphChange {
            graph: 0x6c,
            exec: 0xe2,
            ..change(GraphOp::Instantiated)
        };
        graphs.apply(&instantiated, None);
        assert_eq!(
            graphs.expansion(PID, 0xe2),
            Expansion::Opaque(Opaque::Incomplete)
        );
        assert_eq!(
            graphs.expansion(PID, 0xe3),
            Expansion::Opaque(Opaque::Unknown)
        );
        assert_eq!(graphs.counts().instantiated_incomplete, 3);
        assert_eq!(graphs.counts().launches_unknown, 1);
    }

    #[test]
    fn a_failed_capture_leaves_nothing_and_gives_its_units_back() {
        let mut graphs = Graphs::default();
        let begin = GraphChange {
            stream: STREAM,
            ..change(GraphOp::CaptureBegin)
        };
        graphs.apply(&begin, Some(0));
        graphs.captured(&launch(1));
        assert_eq!(graphs.units(), 2);
        let end = GraphChange {
            stream: STREAM,
            ..change(GraphOp::CaptureEnd)
        };
        graphs.apply(&end, Some(0));
        assert!(!graphs.capturing(PID, STREAM));
        assert_eq!(graphs.units(), 0);
    }

    #[test]
    fn explicit_graphs_set_params_and_updates_change_the_exec_not_the_graph() {
        let mut graphs = Graphs::default();
        for (node, function) in [(0xa1, 11), (0xa2, 12), (0xa3, 13)] {
            add_node(&mut graphs, 0x6a, node, function);
        }
        let instantiate = |exec| GraphChange {
            graph: 0x6a,
            exec,
            ..change(GraphOp::Instantiated)
        };
        graphs.apply(&instantiate(0xe0), None);
        assert_eq!(functions(&graphs.expansion(PID, 0xe0)), [11, 12, 13]);
        let set = GraphChange {
            exec: 0xe0,
            node: KernelNode {
                node: 0xa2,
                function: 99,
                ..KernelNode::captured(&launch(99))
            },
            ..change(GraphOp::ExecNodeParams)
        };
        assert_eq!(graphs.apply(&set, None), None);
        assert_eq!(functions(&graphs.expansion(PID, 0xe0)), [11, 99, 13]);
        // The graph is unchanged: a second instantiation runs the original.
        graphs.apply(&instantiate(0xe1), None);
        assert_eq!(functions(&graphs.expansion(PID, 0xe1)), [11, 12, 13]);
        // A whole update from another graph.
        add_node(&mut graphs, 0x6b, 0xb1, 21);
        let update = GraphChange {
            graph: 0x6b,
            exec: 0xe0,
            ..change(GraphOp::ExecUpdated)
        };
        assert_eq!(
            graphs.apply(&update, None),
            Some(KernelCount::Set {
                pid: PID,
                exec: 0xe0,
                kernels: 1
            })
        );
        assert_eq!(functions(&graphs.expansion(PID, 0xe0)), [21]);
        // Destroying everything gives every unit back.
        for (op, graph, exec) in [
            (GraphOp::GraphDestroyed, 0x6a, 0),
            (GraphOp::GraphDestroyed, 0x6b, 0),
            (GraphOp::ExecDestroyed, 0, 0xe0),
            (GraphOp::ExecDestroyed, 0, 0xe1),
        ] {
            graphs.apply(
                &GraphChange {
                    graph,
                    exec,
                    ..change(op)
                },
                None,
            );
        }
        assert_eq!(graphs.units(), 0);
    }

    #[test]
    fn a_node_the_agent_does_not_know_makes_the_exec_opaque() {
        let mut graphs = Graphs::default();
        capture(&mut graphs, Some(0), &[1, 2], 0x6a, 0xe0);
        let set = GraphChange {
            exec: 0xe0,
            node: KernelNode {
                node: 0xdead,
                ..KernelNode::captured(&launch(5))
            },
            ..change(GraphOp::ExecNodeParams)
        };
        assert_eq!(
            graphs.apply(&set, None),
            Some(KernelCount::Remove {
                pid: PID,
                exec: 0xe0
            })
        );
        assert_eq!(
            graphs.expansion(PID, 0xe0),
            Expansion::Opaque(Opaque::Incomplete)
        );
    }

    #[test]
    fn a_hundred_thousand_node_graph_fits_and_bounds_hold_per_graph_process_and_host() {
        let mut graphs = Graphs::default();
        let big: Vec<u64> = (0..100_000).map(|i| i % 37 + 1).collect();
        capture(&mut graphs, Some(0), &big, 0x6a, 0xe0);
        match graphs.expansion(PID, 0xe0) {
            Expansion::Kernels(nodes) => assert_eq!(nodes.len(), 100_000),
            other => panic!("{other:?}"),
        }
        // The exec shares the graph's nodes: 100,000 nodes, one graph, one exec.
        assert_eq!(graphs.units(), 100_002);
        assert_eq!(graphs.exited(PID), [0xe0]);
        assert_eq!(graphs.units(), 0);

        let limits = Limits {
            per_graph: 4,
            per_process: 8,
            per_host: 10,
        };
        let mut graphs = Graphs::new(limits);
        capture(&mut graphs, Some(0), &[1, 2, 3, 4, 5], 0x6a, 0xe0);
        assert_eq!(
            graphs.expansion(PID, 0xe0),
            Expansion::Opaque(Opaque::Incomplete)
        );
        assert!(graphs.counts().over_bounds >= 1);
        assert!(graphs.units() <= limits.per_process);
        // Another process is held to what is left of the host.
        let other = GraphChange {
            pid: Pid(8),
            stream: STREAM,
            ..change(GraphOp::CaptureBegin)
        };
        graphs.apply(&other, Some(0));
        for f in 1..=8 {
            graphs.captured(&Launch {
                pid: Pid(8),
                ..launch(f)
            });
        }
        assert!(graphs.units() <= limits.per_host);
        graphs.exited(PID);
        graphs.exited(Pid(8));
        assert_eq!(graphs.units(), 0);
    }

    #[test]
    fn lost_records_leave_no_graph_taken_for_whole() {
        let mut graphs = Graphs::default();
        add_node(&mut graphs, 0x6a, 0xa1, 11);
        // Parameters whose node never came back, then the next node: the graph may lack one.
        let params = GraphChange {
            graph: 0x6a,
            ..change(GraphOp::KernelNodeParams)
        };
        graphs.apply(&params, None);
        add_node(&mut graphs, 0x6a, 0xa3, 13);
        let instantiate = GraphChange {
            graph: 0x6a,
            exec: 0xe0,
            ..change(GraphOp::Instantiated)
        };
        graphs.apply(&instantiate, None);
        assert_eq!(
            graphs.expansion(PID, 0xe0),
            Expansion::Opaque(Opaque::Incomplete)
        );
        // A node handle whose parameters were lost.
        let added = GraphChange {
            graph: 0x6b,
            ..change(GraphOp::KernelNodeAdded)
        };
        add_node(&mut graphs, 0x6b, 0xb1, 21);
        graphs.apply(&added, None);
        graphs.apply(
            &GraphChange {
                graph: 0x6b,
                exec: 0xe1,
                ..change(GraphOp::Instantiated)
            },
            None,
        );
        assert_eq!(
            graphs.expansion(PID, 0xe1),
            Expansion::Opaque(Opaque::Incomplete)
        );
        // Records lost anywhere in the ring: nothing is whole any more.
        capture(&mut graphs, Some(0), &[1, 2], 0x6c, 0xe2);
        assert!(matches!(graphs.expansion(PID, 0xe2), Expansion::Kernels(_)));
        let execs = graphs.records_lost();
        assert!(execs.contains(&(PID, 0xe2)));
        assert_eq!(
            graphs.expansion(PID, 0xe2),
            Expansion::Opaque(Opaque::Incomplete)
        );
    }

    #[test]
    fn a_sampled_graph_launch_samples_the_kernel_the_countdown_fell_on() {
        let graph_launch = Launch {
            sampled: true,
            graph_position: 2,
            entry: EntryPoint::GraphLaunch,
            ..launch(0xe0)
        };
        let node = KernelNode::captured(&launch(5));
        let kernels: Vec<Launch> = (0..4)
            .map(|i| graph_launch.graph_kernel(i, &node))
            .collect();
        let sampled: Vec<bool> = kernels.iter().map(|k| k.sampled).collect();
        assert_eq!(sampled, [false, false, true, false]);
        assert!(
            kernels
                .iter()
                .all(|k| k.in_graph && !k.is_opaque_graph() && k.function == 5)
        );
        assert!(graph_launch.is_opaque_graph());
        let by_kernel = KernelNode {
            function: 0,
            kernel: 0x4b,
            ..node
        };
        assert_eq!(graph_launch.graph_kernel(0, &by_kernel).function, 0x4b);
    }
}
