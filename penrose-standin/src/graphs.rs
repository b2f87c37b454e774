//! CUDA graphs in replays.
//!
//! - [`GraphSteps`]: a plan's launches split into steps, a kernel launched alone or the kernels
//!   of one trace graph launch (same process, launched by a `cudaGraphLaunch`, same correlation
//!   id), each graph launch tagged with its shape: its sequence of (kernel name, grid, block).
//! - [`GraphCache`]: the executable graph of each shape, captured the first time the shape is
//!   replayed and relaunched after that.
//! - [`SyntheticGraph`]: one explicit graph of N kernel nodes launched K times, optionally
//!   updated between launches, so tests can check large graphs and updates.

use std::collections::HashMap;
use std::ffi::CString;
use std::time::Instant;

use penrose_traces::{CorrelationId, Kernel, ProcessId};
use serde::Serialize;

use crate::abi::{CaptureMode, NextCounters, Present};
use crate::driver::{
    Driver, FunctionHandle, GraphExecHandle, GraphHandle, GraphNodeHandle, KernelNode, NodeKernel,
    StreamHandle,
};
use crate::error::StandinError;

/// The trace graph launch a kernel belongs to: its process and the graph launch's correlation
/// id (shared by the kernels of that one launch).
pub type GraphKey = (ProcessId, CorrelationId);

/// What identifies a captured graph: each kernel's name index, grid and block, in order.
pub type Shape = Vec<(usize, [u32; 3], [u32; 3])>;

/// The graph launch `kernel` belongs to, if a graph launch launched it.
pub fn graph_key(kernel: &Kernel) -> Option<GraphKey> {
    if kernel.graph_launch {
        kernel.correlation.map(|c| (kernel.process, c))
    } else {
        None
    }
}

/// One step of a replay.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Launch `i` of the plan, on its own.
    Kernel(usize),
    /// Graph launch `i` of [`GraphSteps::graphs`].
    Graph(usize),
}

/// The launches of one trace graph launch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GraphLaunch {
    /// Indices into the plan's launches, in launch order.
    pub launches: Vec<usize>,
    /// Index of its shape among [`GraphSteps::shapes`].
    pub shape: usize,
}

/// A plan's launches as steps, graph launches gathered.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GraphSteps {
    /// In launch order; a graph launch stands where its first kernel was launched.
    pub steps: Vec<Step>,
    /// The graph launches.
    pub graphs: Vec<GraphLaunch>,
    /// Distinct shapes, in order of first launch.
    pub shapes: Vec<Shape>,
}

impl GraphSteps {
    /// Splits launches into steps: `keys[i]` is launch i's graph launch (if any), `shapes[i]`
    /// its (name index, grid, block). Kernels of one graph launch join the step of the first.
    pub fn plan(keys: &[Option<GraphKey>], kernels: &[(usize, [u32; 3], [u32; 3])]) -> Self {
        let mut out = Self::default();
        let mut open: HashMap<GraphKey, usize> = HashMap::new();
        for (i, key) in keys.iter().enumerate() {
            match key {
                None => out.steps.push(Step::Kernel(i)),
                Some(key) => match open.get(key) {
                    Some(&g) => out.graphs[g].launches.push(i),
                    None => {
                        open.insert(*key, out.graphs.len());
                        out.steps.push(Step::Graph(out.graphs.len()));
                        out.graphs.push(GraphLaunch {
                            launches: vec![i],
                            shape: 0,
                        });
                    }
                },
            }
        }
        out.assign_shapes(kernels);
        out
    }

    /// Gives each graph launch the index of its shape, numbering shapes by first launch.
    fn assign_shapes(&mut self, kernels: &[(usize, [u32; 3], [u32; 3])]) {
        let mut index: HashMap<Shape, usize> = HashMap::new();
        for graph in &mut self.graphs {
            let shape: Shape = graph.launches.iter().map(|&i| kernels[i]).collect();
            graph.shape = *index.entry(shape.clone()).or_insert_with(|| {
                self.shapes.push(shape);
                self.shapes.len() - 1
            });
        }
    }

    /// Every launch on its own: no graphs.
    pub fn eager(launches: usize) -> Self {
        Self {
            steps: (0..launches).map(Step::Kernel).collect(),
            ..Self::default()
        }
    }

    /// Kernels launched by graph launches.
    pub fn graph_kernels(&self) -> usize {
        self.graphs.iter().map(|g| g.launches.len()).sum()
    }
}

/// The executable graph of each shape, made on first use.
#[derive(Debug, Default)]
pub struct GraphCache {
    execs: HashMap<usize, GraphExecHandle>,
    /// Graphs captured (each instantiated once).
    pub captured: u64,
}

impl GraphCache {
    /// The exec of `shape`, or `None` when it has to be captured first.
    pub fn get(&self, shape: usize) -> Option<GraphExecHandle> {
        self.execs.get(&shape).copied()
    }

    /// Captures a graph on `stream`: `launch` makes the graph's launches (with their counters
    /// set) on that stream between `cuStreamBeginCapture_v2` and `cuStreamEndCapture`; the
    /// graph is instantiated (`cuGraphInstantiateWithFlags`), then destroyed (the exec stays).
    pub fn capture(
        &mut self,
        driver: &Driver,
        shape: usize,
        stream: StreamHandle,
        launch: impl FnOnce() -> Result<(), StandinError>,
    ) -> Result<GraphExecHandle, StandinError> {
        driver.begin_capture(stream, CaptureMode::Global)?;
        let launched = launch();
        let graph = driver.end_capture(stream);
        launched?;
        let graph = graph?;
        let exec = driver.graph_instantiate(graph, 0);
        driver.graph_destroy(graph)?;
        let exec = exec?;
        self.execs.insert(shape, exec);
        self.captured += 1;
        Ok(exec)
    }

    /// Destroys every exec.
    pub fn destroy(self, driver: &Driver) -> Result<(), StandinError> {
        self.execs
            .into_values()
            .try_for_each(|e| driver.graph_exec_destroy(e))
    }
}

/// How a [`SyntheticGraph`] changes between launches.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum GraphUpdate {
    /// Every launch runs the graph as built.
    #[default]
    None,
    /// Before launch j (j >= 1), node [`SyntheticGraph::updated_node`]`(j)` gets version j of
    /// its parameters (`cuGraphExecKernelNodeSetParams_v2`).
    NodeParams,
    /// Before launch j (j >= 1), the exec takes a new graph whose every node has version j of
    /// its parameters (`cuGraphExecUpdate_v2`).
    Exec,
}

/// One kernel node of a synthetic graph.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct NodeSpec {
    /// Which of the graph's kernels (`graph_node_kernel_<kernel>`).
    pub kernel: u32,
    /// Grid dimensions.
    pub grid: [u32; 3],
    /// Block dimensions.
    pub block: [u32; 3],
    /// Dynamic shared memory, bytes.
    pub shared_mem_bytes: u32,
    /// The node's counters: its duration, ns.
    pub duration_ns: u64,
    /// The node's counters: registers per thread.
    pub registers_per_thread: u32,
}

impl NodeSpec {
    /// The counters the node carries (set before it is added or updated).
    pub fn counters(&self) -> NextCounters {
        NextCounters {
            duration_ns: self.duration_ns,
            registers_per_thread: self.registers_per_thread,
            present: Present::DURATION | Present::REGISTERS,
            ..NextCounters::default()
        }
    }
}

/// One explicit graph of `nodes` kernel nodes (`cuGraphCreate`, `cuGraphAddKernelNode_v2`,
/// each node after the one before), its `kernels` distinct kernels resolved with
/// `cuModuleGetFunction`, instantiated once and launched `launches` times on one stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct SyntheticGraph {
    /// Kernel nodes (the stand-in holds at most 1,048,576 per graph).
    pub nodes: u32,
    /// Distinct kernels; node i launches kernel `i % kernels` at first. At least 1.
    pub kernels: u32,
    /// Graph launches.
    pub launches: u64,
    /// What changes between launches.
    pub update: GraphUpdate,
}

impl SyntheticGraph {
    /// The name of kernel `k`: `graph_node_kernel_<k>`.
    pub fn kernel_name(k: u32) -> String {
        format!("graph_node_kernel_{k}")
    }

    /// Version `v` of node `i`'s parameters (version 0: as built; version j: as updated before
    /// launch j).
    pub fn node(&self, i: u32, v: u64) -> NodeSpec {
        let v32 = (v % u64::from(u32::MAX)) as u32;
        let shifted = i.wrapping_add(v32);
        NodeSpec {
            kernel: shifted % self.kernels.max(1),
            grid: [1 + shifted % 64, 1 + v32 % 4, 1],
            block: [32 * (1 + i % 8), 1, 1],
            shared_mem_bytes: 256 * (i % 4),
            duration_ns: 1_000 + u64::from(i) + 1_000_000 * v,
            registers_per_thread: 16 + (shifted % 48),
        }
    }

    /// The node whose parameters change before launch `j` with [`GraphUpdate::NodeParams`].
    pub fn updated_node(&self, j: u64) -> u32 {
        let n = u64::from(self.nodes.max(1));
        // A large odd step reaches nodes far apart in a large graph.
        (j.wrapping_mul(7_919) % n) as u32
    }

    /// What launch `j` (from 0) runs, node by node.
    pub fn expected(&self, j: u64) -> Vec<NodeSpec> {
        match self.update {
            GraphUpdate::None => (0..self.nodes).map(|i| self.node(i, 0)).collect(),
            GraphUpdate::Exec => (0..self.nodes).map(|i| self.node(i, j)).collect(),
            GraphUpdate::NodeParams => {
                let mut nodes: Vec<NodeSpec> = (0..self.nodes).map(|i| self.node(i, 0)).collect();
                for u in 1..=j {
                    let i = self.updated_node(u);
                    if let Some(slot) = nodes.get_mut(i as usize) {
                        *slot = self.node(i, u);
                    }
                }
                nodes
            }
        }
    }
}

/// What [`run_synthetic_graph`] did, as `penrose-replay --synthetic-graph --json` prints it.
#[derive(Clone, Debug, Serialize)]
pub struct SyntheticSummary {
    /// The process (its ring is `/dev/shm/penrose-standin-<pid>`).
    pub pid: u32,
    /// The graph as asked for.
    pub graph: SyntheticGraph,
    /// Each kernel's function handle and name, kernel k at index k.
    pub functions: Vec<crate::replay::FunctionName>,
    /// The stream the graph was launched on.
    pub stream: u64,
    /// The executable graph.
    pub graph_exec: u64,
    /// Graph launches the stand-in counted (`cuGraphLaunch`).
    pub graph_launches: u64,
    /// Kernel nodes the stand-in ran.
    pub node_launches: u64,
    /// Updates made between launches.
    pub updates: u64,
    /// Wall time of the launches (updates included), seconds.
    pub elapsed_s: f64,
    /// `node_launches / elapsed_s`.
    pub nodes_per_s: f64,
}

/// The kernel node of `spec`, with the graph's functions.
fn kernel_node(spec: &NodeSpec, functions: &[FunctionHandle]) -> Result<KernelNode, StandinError> {
    let function = functions
        .get(spec.kernel as usize)
        .copied()
        .ok_or_else(|| StandinError::BadGraph(format!("no kernel {}", spec.kernel)))?;
    Ok(KernelNode {
        kernel: NodeKernel::Function(function),
        grid: spec.grid,
        block: spec.block,
        shared_mem_bytes: spec.shared_mem_bytes,
    })
}

/// Builds a graph of version `v` of every node, each after the one before.
fn build_graph(
    driver: &Driver,
    spec: &SyntheticGraph,
    functions: &[FunctionHandle],
    v: u64,
) -> Result<(GraphHandle, Vec<GraphNodeHandle>), StandinError> {
    let graph = driver.graph_create()?;
    let mut nodes: Vec<GraphNodeHandle> = Vec::with_capacity(spec.nodes as usize);
    for i in 0..spec.nodes {
        let node = spec.node(i, v);
        driver.set_next_counters(&node.counters());
        let deps = nodes.last().map(std::slice::from_ref).unwrap_or(&[]);
        let added = driver.graph_add_kernel_node_v2(graph, deps, &kernel_node(&node, functions)?);
        match added {
            Ok(handle) => nodes.push(handle),
            Err(e) => {
                let _ = driver.graph_destroy(graph);
                return Err(e);
            }
        }
    }
    Ok((graph, nodes))
}

/// Makes the change [`GraphUpdate`] asks for before launch `j`.
fn apply_update(
    driver: &Driver,
    spec: &SyntheticGraph,
    functions: &[FunctionHandle],
    exec: GraphExecHandle,
    nodes: &[GraphNodeHandle],
    j: u64,
) -> Result<bool, StandinError> {
    match spec.update {
        GraphUpdate::None => Ok(false),
        GraphUpdate::NodeParams => {
            let i = spec.updated_node(j);
            let Some(&node) = nodes.get(i as usize) else {
                return Ok(false);
            };
            let params = spec.node(i, j);
            driver.set_next_counters(&params.counters());
            driver.graph_exec_kernel_node_set_params_v2(
                exec,
                node,
                &kernel_node(&params, functions)?,
            )?;
            Ok(true)
        }
        GraphUpdate::Exec => {
            let (graph, _) = build_graph(driver, spec, functions, j)?;
            let updated = driver.graph_exec_update_v2(exec, graph);
            driver.graph_destroy(graph)?;
            updated.map(|()| true)
        }
    }
}

/// Resolves the graph's kernels through `cuModuleGetFunction`.
fn resolve_kernels(
    driver: &Driver,
    spec: &SyntheticGraph,
) -> Result<Vec<crate::replay::FunctionName>, StandinError> {
    let module = driver.module_load_data(c"penrose-standin synthetic graph")?;
    (0..spec.kernels)
        .map(|k| {
            let name = SyntheticGraph::kernel_name(k);
            let c =
                CString::new(name.clone()).map_err(|_| StandinError::NameWithNul(name.clone()))?;
            Ok(crate::replay::FunctionName {
                handle: driver.module_get_function(module, &c)?.0 as u64,
                name,
                stub: None,
                registered_name: None,
            })
        })
        .collect()
}

/// Initialises the driver, makes device `ordinal` current with a stream of its own, builds the
/// graph, instantiates it and launches it `spec.launches` times, updating it between launches
/// as `spec.update` says.
pub fn run_synthetic_graph(
    driver: &Driver,
    spec: &SyntheticGraph,
    ordinal: i32,
) -> Result<SyntheticSummary, StandinError> {
    if spec.kernels == 0 {
        return Err(StandinError::BadGraph(
            "a graph needs at least one kernel".into(),
        ));
    }
    driver.init()?;
    driver.use_device(ordinal)?;
    let stream = driver.stream_create()?;
    let names = resolve_kernels(driver, spec)?;
    let functions: Vec<FunctionHandle> = names
        .iter()
        .map(|f| FunctionHandle(f.handle as usize))
        .collect();
    let (graph, nodes) = build_graph(driver, spec, &functions, 0)?;
    let exec = driver.graph_instantiate(graph, 0);
    let exec = match exec {
        Ok(e) => e,
        Err(e) => {
            let _ = driver.graph_destroy(graph);
            return Err(e);
        }
    };
    let (launches_before, nodes_before) =
        (graph_launch_count(driver), driver.graph_node_launch_count());
    let start = Instant::now();
    let mut updates = 0u64;
    let mut run = || -> Result<(), StandinError> {
        for j in 0..spec.launches {
            if j > 0 && apply_update(driver, spec, &functions, exec, &nodes, j)? {
                updates += 1;
            }
            driver.graph_launch(exec, stream)?;
        }
        Ok(())
    };
    let ran = run();
    let elapsed_s = start.elapsed().as_secs_f64();
    driver.graph_exec_destroy(exec)?;
    driver.graph_destroy(graph)?;
    ran?;
    let node_launches = driver
        .graph_node_launch_count()
        .saturating_sub(nodes_before);
    Ok(SyntheticSummary {
        pid: std::process::id(),
        graph: *spec,
        functions: names,
        stream: stream.0 as u64,
        graph_exec: exec.0 as u64,
        graph_launches: graph_launch_count(driver).saturating_sub(launches_before),
        node_launches,
        updates,
        elapsed_s,
        nodes_per_s: if elapsed_s > 0.0 {
            node_launches as f64 / elapsed_s
        } else {
            0.0
        },
    })
}

/// Graph launches through either graph entry point so far.
fn graph_launch_count(driver: &Driver) -> u64 {
    use crate::abi::EntryPoint;
    driver.launch_count(EntryPoint::GraphLaunch) + driver.launch_count(EntryPoint::GraphLaunchPtsz)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(c: i64) -> Option<GraphKey> {
        Some((ProcessId(1), CorrelationId(c)))
    }

    #[test]
    fn graph_launches_are_gathered_and_shapes_shared() {
        let a = (0, [1, 1, 1], [32, 1, 1]);
        let b = (1, [2, 1, 1], [64, 1, 1]);
        // eager, graph 7 (a, b), eager, graph 9 (a, b) with a stray eager kernel between its
        // kernels, graph 11 (b).
        let keys = [None, key(7), key(7), None, key(9), None, key(9), key(11)];
        let kernels = [a, a, b, b, a, a, b, b];
        let steps = GraphSteps::plan(&keys, &kernels);
        assert_eq!(
            steps.steps,
            [
                Step::Kernel(0),
                Step::Graph(0),
                Step::Kernel(3),
                Step::Graph(1),
                Step::Kernel(5),
                Step::Graph(2)
            ]
        );
        assert_eq!(steps.graphs[1].launches, [4, 6]);
        assert_eq!(steps.graphs[0].shape, steps.graphs[1].shape);
        assert_eq!(steps.graphs[2].shape, 1);
        assert_eq!(steps.shapes, [vec![a, b], vec![b]]);
        assert_eq!(steps.graph_kernels(), 5);
    }

    #[test]
    fn synthetic_expectations_follow_the_updates() {
        let mut g = SyntheticGraph {
            nodes: 10,
            kernels: 3,
            launches: 4,
            update: GraphUpdate::None,
        };
        assert_eq!(SyntheticGraph::kernel_name(2), "graph_node_kernel_2");
        assert_eq!(g.expected(3), g.expected(0));
        assert_eq!(g.node(4, 0).kernel, 1);
        g.update = GraphUpdate::Exec;
        assert_eq!(g.expected(2)[4], g.node(4, 2));
        g.update = GraphUpdate::NodeParams;
        let e = g.expected(2);
        let (u1, u2) = (g.updated_node(1), g.updated_node(2));
        assert_ne!(u1, u2);
        assert_eq!(e[u1 as usize], g.node(u1, 1));
        assert_eq!(e[u2 as usize], g.node(u2, 2));
        let changed = (0..10).filter(|&i| e[i as usize] != g.node(i, 0)).count();
        assert_eq!(changed, 2);
    }
}
