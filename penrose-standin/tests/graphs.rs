//! CUDA graphs in the stand-in: stream capture, the explicit graph API, executable graph
//! updates, what a graph launch writes to the ring; and the replayer's graph replay of a real
//! trace and its synthetic graph.
//!
//! The in-process tests share one copy of the stand-in (and its ring) and run on threads of
//! their own, so each reads only the records its own thread wrote. They also take turns: some
//! use handles after destroying them, and the allocator may hand a freed address to another
//! test's new graph.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Mutex, MutexGuard, OnceLock};

use penrose_standin::{
    CaptureMode, CaptureStatus, CounterRecord, CounterRing, CuResult, Driver, EntryPoint,
    FunctionHandle, GraphExecHandle, GraphExecUpdateResult, GraphHandle, GraphNodeHandle,
    GraphUpdate, KernelNode, LIBCUDA_PATH, Launch, LaunchRecord, NextCounters, NodeKernel, Present,
    StandinError, StreamHandle, SyntheticGraph, install_libcuda, ring_path,
};
use penrose_traces::{Kernel, TraceFolder, read_trace};
use serde_json::Value;

const REPLAY: &str = env!("CARGO_BIN_EXE_penrose-replay");

/// The trace with graph launches: 70 of them, 135 kernels.
const GRAPH_TRACE: &str = "hta-negative_queue_length_values_check--rank0.json.gz";

fn driver() -> &'static Driver {
    static DRIVER: OnceLock<Driver> = OnceLock::new();
    DRIVER.get_or_init(|| {
        let d = Driver::load(Path::new(LIBCUDA_PATH)).unwrap();
        d.init().unwrap();
        d
    })
}

/// The calling thread's id, as the ring records it.
fn tid() -> u32 {
    let link = std::fs::read_link("/proc/thread-self").unwrap();
    link.file_name().unwrap().to_str().unwrap().parse().unwrap()
}

/// What a test needs: device 0 current on this thread, a stream of its own, a fresh module
/// (so its function handles are its own), and a ring reader past everything written so far.
struct Fixture {
    _turn: MutexGuard<'static, ()>,
    d: &'static Driver,
    stream: StreamHandle,
    module: penrose_standin::ModuleHandle,
    ring: CounterRing,
    tid: u32,
}

impl Fixture {
    fn new() -> Self {
        static TURNS: Mutex<()> = Mutex::new(());
        let turn = TURNS
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let d = driver();
        d.use_device(0).unwrap();
        let stream = d.stream_create().unwrap();
        let module = d.module_load_data(c"graph test image").unwrap();
        let mut ring = CounterRing::open(std::process::id()).unwrap();
        ring.skip_to_head().unwrap();
        Self {
            _turn: turn,
            d,
            stream,
            module,
            ring,
            tid: tid(),
        }
    }

    fn function(&self, name: &str) -> FunctionHandle {
        let c = std::ffi::CString::new(name).unwrap();
        self.d.module_get_function(self.module, &c).unwrap()
    }

    /// This thread's records since the last call, each with its launch configuration.
    fn records(&mut self) -> Vec<(CounterRecord, LaunchRecord)> {
        let records = self.ring.read_new().unwrap();
        assert_eq!(self.ring.lost(), 0);
        records
            .into_iter()
            .filter(|r| r.tid == self.tid)
            .map(|r| (r, self.ring.launch_record(r.seq).unwrap().unwrap()))
            .collect()
    }
}

fn node(f: FunctionHandle, gx: u32, bx: u32, smem: u32) -> KernelNode {
    KernelNode {
        kernel: NodeKernel::Function(f),
        grid: [gx, 1, 1],
        block: [bx, 1, 1],
        shared_mem_bytes: smem,
    }
}

fn counters(duration_ns: u64) -> NextCounters {
    NextCounters {
        duration_ns,
        present: Present::DURATION,
        ..NextCounters::default()
    }
}

fn cuda_code(e: &StandinError) -> Option<CuResult> {
    match e {
        StandinError::Cuda { code, .. } | StandinError::GraphExecUpdate { code, .. } => Some(*code),
        _ => None,
    }
}

/// (function, grid, block, smem, duration) of each record.
fn ran(records: &[(CounterRecord, LaunchRecord)]) -> Vec<(u64, u32, u32, u32, Option<u64>)> {
    records
        .iter()
        .map(|(r, l)| {
            (
                r.function,
                l.grid[0],
                l.block[0],
                l.shared_mem_bytes,
                r.duration_ns(),
            )
        })
        .collect()
}

#[test]
fn capture_records_nodes_instead_of_launching() {
    let mut fx = Fixture::new();
    let d = fx.d;
    let fs = ["capture_a", "capture_b", "capture_c"].map(|n| fx.function(n));
    let captured_before = d.captured_launch_count();
    d.begin_capture(fx.stream, CaptureMode::Global).unwrap();
    assert_eq!(d.is_capturing(fx.stream).unwrap(), CaptureStatus::Active);
    // Three launches through three entry points, each with its counters.
    let entries = [
        EntryPoint::LaunchKernel,
        EntryPoint::LaunchKernelEx,
        EntryPoint::LaunchCooperativeKernel,
    ];
    for (i, (f, entry)) in fs.iter().zip(entries).enumerate() {
        let i = i as u32;
        d.set_next_counters(&counters(100 + u64::from(i)));
        let launch = Launch {
            grid: [i + 1, 1, 1],
            block: [32 * (i + 1), 1, 1],
            shared_mem_bytes: 64 * i,
            stream: fx.stream,
        };
        d.launch(entry, *f, &launch).unwrap();
    }
    assert!(fx.records().is_empty(), "a captured launch ran");
    assert!(d.captured_launch_count() >= captured_before + 3);
    let graph = d.end_capture(fx.stream).unwrap();
    assert_eq!(d.is_capturing(fx.stream).unwrap(), CaptureStatus::None);
    let exec = d.graph_instantiate(graph, 0).unwrap();
    d.graph_destroy(graph).unwrap();
    // A launch after capture runs as usual, with no counters left over.
    let after = fx.function("after_capture");
    d.launch(
        EntryPoint::LaunchKernel,
        after,
        &Launch {
            grid: [1, 1, 1],
            block: [1, 1, 1],
            shared_mem_bytes: 0,
            stream: fx.stream,
        },
    )
    .unwrap();
    let nodes_before = d.graph_node_launch_count();
    for _ in 0..2 {
        d.graph_launch(exec, fx.stream).unwrap();
    }
    assert!(d.graph_node_launch_count() >= nodes_before + 6);
    let records = fx.records();
    assert_eq!(records.len(), 1 + 6);
    assert_eq!(records[0].0.function, after.0 as u64);
    assert_eq!(records[0].0.duration_ns(), None);
    let expected: Vec<_> = (0..3u32)
        .map(|i| {
            let f = fs[i as usize].0 as u64;
            (f, i + 1, 32 * (i + 1), 64 * i, Some(100 + u64::from(i)))
        })
        .collect();
    let graph_records = &records[1..];
    assert_eq!(ran(&graph_records[..3]), expected);
    assert_eq!(ran(&graph_records[3..]), expected);
    for (i, (r, l)) in graph_records.iter().enumerate() {
        assert_eq!(r.entry_point(), Some(EntryPoint::GraphLaunch));
        assert_eq!(r.stream, fx.stream.0 as u64);
        assert_eq!(r.device, records[0].0.device);
        assert_eq!(l.graph_exec, exec.0 as u64);
        assert_eq!(l.graph_node(), Some(i as u32 % 3));
    }
    d.graph_exec_destroy(exec).unwrap();
}

#[test]
fn capture_follows_cuda_rules() {
    let mut fx = Fixture::new();
    let d = fx.d;
    let f = fx.function("capture_rules");
    let code = |r: Result<(), StandinError>| cuda_code(&r.unwrap_err());
    // The default streams cannot be captured; a capturing stream cannot begin again.
    assert_eq!(
        code(d.begin_capture(StreamHandle(0), CaptureMode::Global)),
        Some(CuResult::STREAM_CAPTURE_UNSUPPORTED)
    );
    assert_eq!(
        code(d.end_capture(fx.stream).map(|_| ())),
        Some(CuResult::ILLEGAL_STATE)
    );
    d.begin_capture_ptsz(fx.stream, CaptureMode::ThreadLocal)
        .unwrap();
    assert_eq!(
        code(d.begin_capture(fx.stream, CaptureMode::Global)),
        Some(CuResult::ILLEGAL_STATE)
    );
    // A thread-local capture ends on its own thread only.
    let stream = fx.stream;
    let other = std::thread::spawn(move || driver().end_capture(stream).map(|_| ()))
        .join()
        .unwrap();
    assert_eq!(
        cuda_code(&other.unwrap_err()),
        Some(CuResult::STREAM_CAPTURE_WRONG_THREAD)
    );
    // An invalid launch invalidates the capture: no graph at the end.
    let zero = Launch {
        grid: [0, 1, 1],
        block: [1, 1, 1],
        shared_mem_bytes: 0,
        stream: fx.stream,
    };
    assert_eq!(
        code(d.launch(EntryPoint::LaunchKernel, f, &zero)),
        Some(CuResult::INVALID_VALUE)
    );
    assert_eq!(
        d.is_capturing(fx.stream).unwrap(),
        CaptureStatus::Invalidated
    );
    assert_eq!(
        code(d.end_capture_ptsz(fx.stream).map(|_| ())),
        Some(CuResult::STREAM_CAPTURE_INVALIDATED)
    );
    // A graph launched into a capturing stream is not supported, and invalidates it; a
    // relaxed capture may end on another thread.
    let exec = {
        let g = d.graph_create().unwrap();
        let e = d.graph_instantiate(g, 0).unwrap();
        d.graph_destroy(g).unwrap();
        e
    };
    d.begin_capture(fx.stream, CaptureMode::Relaxed).unwrap();
    assert_eq!(
        code(d.graph_launch(exec, fx.stream)),
        Some(CuResult::STREAM_CAPTURE_UNSUPPORTED)
    );
    let ended = std::thread::spawn(move || driver().end_capture(stream).map(|_| ()))
        .join()
        .unwrap();
    assert_eq!(
        cuda_code(&ended.unwrap_err()),
        Some(CuResult::STREAM_CAPTURE_INVALIDATED)
    );
    // An empty graph launches and writes nothing.
    d.graph_launch(exec, fx.stream).unwrap();
    assert!(fx.records().is_empty());
    d.graph_exec_destroy(exec).unwrap();
}

#[test]
fn explicit_graph_instantiates_and_launches_its_nodes_in_order() {
    let mut fx = Fixture::new();
    let d = fx.d;
    let f = fx.function("explicit_a");
    let library = d.library_load_data(c"graph test library").unwrap();
    let kernel = d.library_get_kernel(library, c"explicit_kernel").unwrap();
    let kernel_function = d.kernel_get_function(kernel).unwrap();
    let graph = d.graph_create().unwrap();
    d.set_next_counters(&counters(1));
    let n0 = d
        .graph_add_kernel_node(graph, &[], &node(f, 2, 64, 0))
        .unwrap();
    d.set_next_counters(&counters(2));
    let by_kernel = KernelNode {
        kernel: NodeKernel::Kernel(kernel),
        ..node(f, 3, 96, 128)
    };
    let n1 = d
        .graph_add_kernel_node_v2(graph, &[n0], &by_kernel)
        .unwrap();
    // No counters set: the node has none.
    let n2 = d
        .graph_add_kernel_node_v2(graph, &[n0, n1], &node(f, 4, 128, 256))
        .unwrap();
    assert_ne!(n1, n2);
    // Dependencies must be nodes of the same graph; made-up handles are refused.
    let other = d.graph_create().unwrap();
    for deps in [
        vec![n0],
        vec![GraphNodeHandle(0x1000)],
        vec![GraphNodeHandle(n0.0 + 8)],
    ] {
        let err = d
            .graph_add_kernel_node_v2(other, &deps, &node(f, 1, 1, 0))
            .unwrap_err();
        assert_eq!(cuda_code(&err), Some(CuResult::INVALID_VALUE), "{deps:?}");
    }
    let err = d
        .graph_add_kernel_node(GraphHandle(0x4000), &[], &node(f, 1, 1, 0))
        .unwrap_err();
    assert_eq!(cuda_code(&err), Some(CuResult::INVALID_VALUE));
    let err = d
        .graph_add_kernel_node(other, &[], &node(FunctionHandle(0x40), 1, 1, 0))
        .unwrap_err();
    assert_eq!(cuda_code(&err), Some(CuResult::INVALID_HANDLE));
    d.graph_destroy(other).unwrap();

    let exec = d
        .graph_instantiate_with_params(graph, 1, StreamHandle(0))
        .unwrap();
    // The exec is a copy: a node added later does not run.
    d.graph_add_kernel_node(graph, &[n2], &node(f, 9, 9, 0))
        .unwrap();
    d.graph_launch_ptsz(exec, fx.stream).unwrap();
    let records = fx.records();
    assert_eq!(
        ran(&records),
        [
            (f.0 as u64, 2, 64, 0, Some(1)),
            // A v2 node with only `kern` runs the function the kernel resolves to.
            (kernel_function.0 as u64, 3, 96, 128, Some(2)),
            (f.0 as u64, 4, 128, 256, None),
        ]
    );
    assert!(
        records
            .iter()
            .all(|(r, _)| r.entry_point() == Some(EntryPoint::GraphLaunchPtsz))
    );
    let nodes: Vec<_> = records.iter().map(|(_, l)| l.node).collect();
    assert_eq!(nodes, [1, 2, 3]);
    d.graph_destroy(graph).unwrap();
    // The exec outlives its graph.
    d.graph_launch(exec, fx.stream).unwrap();
    assert_eq!(fx.records().len(), 3);
    d.graph_exec_destroy(exec).unwrap();
}

/// A graph of `functions.len()` nodes, node i launching `functions[i]` with grid i + 1.
fn chain(d: &Driver, functions: &[FunctionHandle]) -> (GraphHandle, Vec<GraphNodeHandle>) {
    let graph = d.graph_create().unwrap();
    let mut nodes: Vec<GraphNodeHandle> = Vec::new();
    for (i, f) in functions.iter().enumerate() {
        let deps: Vec<_> = nodes.last().copied().into_iter().collect();
        d.set_next_counters(&counters(10 + i as u64));
        let n = d
            .graph_add_kernel_node_v2(graph, &deps, &node(*f, i as u32 + 1, 32, 0))
            .unwrap();
        nodes.push(n);
    }
    (graph, nodes)
}

#[test]
fn exec_kernel_node_set_params_changes_the_next_launch() {
    let mut fx = Fixture::new();
    let d = fx.d;
    let fs = ["set_a", "set_b", "set_c", "set_new"].map(|n| fx.function(n));
    let (graph, nodes) = chain(d, &fs[..3]);
    let exec = d.graph_instantiate(graph, 0).unwrap();
    d.set_next_counters(&counters(77));
    d.graph_exec_kernel_node_set_params(exec, nodes[1], &node(fs[3], 7, 256, 512))
        .unwrap();
    d.graph_launch(exec, fx.stream).unwrap();
    let (a, b, c, new) = (
        fs[0].0 as u64,
        fs[1].0 as u64,
        fs[2].0 as u64,
        fs[3].0 as u64,
    );
    assert_eq!(
        ran(&fx.records()),
        [
            (a, 1, 32, 0, Some(10)),
            (new, 7, 256, 512, Some(77)),
            (c, 3, 32, 0, Some(12)),
        ]
    );
    // The v2 parameters, and the graph itself untouched: a new exec of it runs the original.
    d.set_next_counters(&counters(88));
    d.graph_exec_kernel_node_set_params_v2(exec, nodes[2], &node(fs[0], 8, 64, 0))
        .unwrap();
    let fresh = d.graph_instantiate(graph, 0).unwrap();
    d.graph_launch(exec, fx.stream).unwrap();
    d.graph_launch(fresh, fx.stream).unwrap();
    assert_eq!(
        ran(&fx.records()),
        [
            (a, 1, 32, 0, Some(10)),
            (new, 7, 256, 512, Some(77)),
            (a, 8, 64, 0, Some(88)),
            (a, 1, 32, 0, Some(10)),
            (b, 2, 32, 0, Some(11)),
            (c, 3, 32, 0, Some(12)),
        ]
    );
    // A node of another graph, a made-up node, bad parameters: refused, nothing changes.
    let (other, other_nodes) = chain(d, &fs[..1]);
    for bad in [
        other_nodes[0],
        GraphNodeHandle(nodes[0].0 + 1),
        GraphNodeHandle(16),
    ] {
        let err = d
            .graph_exec_kernel_node_set_params(exec, bad, &node(fs[3], 1, 1, 0))
            .unwrap_err();
        assert_eq!(cuda_code(&err), Some(CuResult::INVALID_VALUE), "{bad:?}");
    }
    let err = d
        .graph_exec_kernel_node_set_params_v2(exec, nodes[0], &node(fs[3], 0, 1, 0))
        .unwrap_err();
    assert_eq!(cuda_code(&err), Some(CuResult::INVALID_VALUE));
    d.graph_launch(fresh, fx.stream).unwrap();
    assert_eq!(fx.records().len(), 3);
    for g in [graph, other] {
        d.graph_destroy(g).unwrap();
    }
    for e in [exec, fresh] {
        d.graph_exec_destroy(e).unwrap();
    }
}

#[test]
fn exec_update_takes_the_graph_or_changes_nothing() {
    let mut fx = Fixture::new();
    let d = fx.d;
    let fs = ["update_a", "update_b", "update_c", "update_d", "update_e"].map(|n| fx.function(n));
    let (first, _) = chain(d, &fs[..2]);
    let exec = d.graph_instantiate(first, 0).unwrap();
    let (same_size, _) = chain(d, &fs[2..4]);
    d.graph_exec_update_v2(exec, same_size).unwrap();
    d.graph_launch(exec, fx.stream).unwrap();
    let (c, dd) = (fs[2].0 as u64, fs[3].0 as u64);
    let updated = [(c, 1, 32, 0, Some(10)), (dd, 2, 32, 0, Some(11))];
    assert_eq!(ran(&fx.records()), updated);
    // Another number of nodes: CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE, topology changed, through
    // both signatures; the exec keeps what it had.
    let (bigger, _) = chain(d, &fs[..3]);
    for v2 in [false, true] {
        let err = if v2 {
            d.graph_exec_update_v2(exec, bigger)
        } else {
            d.graph_exec_update(exec, bigger)
        }
        .unwrap_err();
        match err {
            StandinError::GraphExecUpdate { code, result, .. } => {
                assert_eq!(code, CuResult::GRAPH_EXEC_UPDATE_FAILURE);
                assert_eq!(code.0, 910);
                assert_eq!(result, GraphExecUpdateResult::TOPOLOGY_CHANGED);
            }
            other => panic!("{other}"),
        }
    }
    d.graph_launch(exec, fx.stream).unwrap();
    assert_eq!(ran(&fx.records()), updated);
    // The v1 signature succeeds too; an unknown graph is an invalid value.
    d.graph_exec_update(exec, first).unwrap();
    let err = d.graph_exec_update(exec, GraphHandle(0x10)).unwrap_err();
    assert_eq!(cuda_code(&err), Some(CuResult::INVALID_VALUE));
    d.graph_launch(exec, fx.stream).unwrap();
    let (a, b) = (fs[0].0 as u64, fs[1].0 as u64);
    assert_eq!(
        ran(&fx.records()),
        [(a, 1, 32, 0, Some(10)), (b, 2, 32, 0, Some(11))]
    );
    for g in [first, same_size, bigger] {
        d.graph_destroy(g).unwrap();
    }
    d.graph_exec_destroy(exec).unwrap();
}

#[test]
fn unknown_and_destroyed_execs_are_refused() {
    let mut fx = Fixture::new();
    let d = fx.d;
    let f = fx.function("refused");
    let (graph, _) = chain(d, &[f]);
    let exec = d.graph_instantiate(graph, 0).unwrap();
    let invalid = |r: Result<(), StandinError>| {
        assert_eq!(cuda_code(&r.unwrap_err()), Some(CuResult::INVALID_VALUE));
    };
    for made_up in [0, 0x1234, f.0, graph.0, exec.0 + 8] {
        invalid(d.graph_launch(GraphExecHandle(made_up), fx.stream));
        invalid(d.graph_launch_ptsz(GraphExecHandle(made_up), fx.stream));
    }
    d.graph_exec_destroy(exec).unwrap();
    invalid(d.graph_launch(exec, fx.stream));
    invalid(d.graph_exec_destroy(exec));
    d.graph_destroy(graph).unwrap();
    invalid(d.graph_destroy(graph));
    invalid(d.graph_instantiate(graph, 0).map(|_| ()));
    // Unknown instantiate flags.
    let (graph, _) = chain(d, &[f]);
    invalid(d.graph_instantiate(graph, 0x10).map(|_| ()));
    d.graph_destroy(graph).unwrap();
    assert!(fx.records().is_empty());
}

// ---- The replayer ----

fn summary(out: &Output) -> Value {
    assert!(
        out.status.success(),
        "replayer failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn run_replayer(dir: &Path, args: &[&str]) -> Output {
    let lib = install_libcuda(dir).unwrap();
    Command::new(REPLAY)
        .arg("--lib")
        .arg(lib)
        .args(args)
        .output()
        .unwrap()
}

/// Every record the finished replayer left, with its launch configuration; removes the ring.
fn drain(s: &Value) -> Vec<(CounterRecord, LaunchRecord)> {
    let pid = u32::try_from(s["pid"].as_u64().unwrap()).unwrap();
    let mut ring = CounterRing::open(pid).unwrap();
    let records = ring.read_new().unwrap();
    let out = records
        .into_iter()
        .map(|r| (r, ring.launch_record(r.seq).unwrap().unwrap()))
        .collect();
    std::fs::remove_file(ring_path(pid)).unwrap();
    out
}

fn function_names(s: &Value) -> BTreeMap<u64, String> {
    s["functions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            let handle = f["handle"].as_u64().unwrap();
            (handle, f["name"].as_str().unwrap().to_owned())
        })
        .collect()
}

fn graph_trace() -> Option<PathBuf> {
    let path = TraceFolder::default_dir().join(GRAPH_TRACE);
    if path.is_file() {
        Some(path)
    } else {
        penrose_host::skip::skipped(format_args!(
            "SKIPPED: {} not found (set PENROSE_TRACES)",
            path.display()
        ));
        None
    }
}

/// (name, grid, block) of each record, in ring order.
fn sequence(
    s: &Value,
    records: &[(CounterRecord, LaunchRecord)],
) -> Vec<(String, [u32; 3], [u32; 3])> {
    let names = function_names(s);
    records
        .iter()
        .map(|(r, l)| (names[&r.function].clone(), l.grid, l.block))
        .collect()
}

#[test]
fn graph_replay_of_a_trace_runs_what_the_eager_replay_runs() {
    let Some(path) = graph_trace() else {
        return;
    };
    let trace = read_trace(&path).unwrap();
    let seqs = trace.process_sequences();
    let (_, seq) = seqs
        .iter()
        .max_by(|a, b| a.1.len().cmp(&b.1.len()).then(b.0.cmp(a.0)))
        .unwrap();
    let graph_kernels: Vec<&&Kernel> = seq.iter().filter(|k| k.graph_launch).collect();
    let graph_launches: std::collections::BTreeSet<_> =
        graph_kernels.iter().map(|k| k.correlation).collect();
    assert_eq!((graph_launches.len(), graph_kernels.len()), (70, 135));

    let dir = tempfile::tempdir().unwrap();
    let trace_arg = path.to_str().unwrap();
    let eager = summary(&run_replayer(
        dir.path(),
        &["--json", "--keep-ring", trace_arg],
    ));
    let eager_records = drain(&eager);
    let graphs = summary(&run_replayer(
        dir.path(),
        &["--json", "--keep-ring", "--graphs", trace_arg],
    ));
    let graph_records = drain(&graphs);

    let n = seq.len() as u64;
    assert_eq!(eager_records.len() as u64, n);
    assert_eq!(graph_records.len() as u64, n);
    assert_eq!(
        sequence(&eager, &eager_records),
        sequence(&graphs, &graph_records)
    );
    assert_eq!(graphs["replayed"], n);
    assert_eq!(graphs["graph_launches"], 70);
    assert_eq!(graphs["graph_kernels"], 135);
    assert_eq!(graphs["launches"]["cuGraphLaunch"], 70);
    assert_eq!(graphs["launches"]["cuLaunchKernel"], n - 135);
    // 14 distinct (name, grid, block) sequences, each captured once; their kernels are the
    // captured launches.
    let captured = graphs["graphs_captured"].as_u64().unwrap();
    assert!(captured > 0 && captured < 70, "{captured}");
    assert!(graphs["captured_launches"].as_u64().unwrap() < 135);
    assert_eq!(eager["graph_launches"], 0);
    // Each graph launch's records: its entry point, its exec, nodes 1, 2, ... in order; the
    // other records are plain launches.
    let mut graph_nodes = 0;
    for ((r, l), (e, _)) in graph_records.iter().zip(&eager_records) {
        if l.graph_exec == 0 {
            assert_eq!(r.entry_point(), Some(EntryPoint::LaunchKernel));
            assert_eq!(
                r.duration_ns(),
                e.duration_ns(),
                "an eager launch keeps its counters"
            );
        } else {
            assert_eq!(r.entry_point(), Some(EntryPoint::GraphLaunch));
            assert!(l.node >= 1);
            graph_nodes += 1;
        }
    }
    assert_eq!(graph_nodes, 135);
}

/// Checks that `records` are launch `j` of `spec`, from node `first` on.
fn check_synthetic(
    spec: &SyntheticGraph,
    s: &Value,
    records: &[(CounterRecord, LaunchRecord)],
    j: u64,
    first: usize,
) {
    let names = function_names(s);
    let expected = spec.expected(j);
    for (offset, (r, l)) in records.iter().enumerate() {
        let i = first + offset;
        let want = &expected[i];
        assert_eq!(l.graph_node(), Some(i as u32), "launch {j}");
        assert_eq!(
            names[&r.function],
            SyntheticGraph::kernel_name(want.kernel),
            "launch {j} node {i}"
        );
        assert_eq!(
            (l.grid, l.block),
            (want.grid, want.block),
            "launch {j} node {i}"
        );
        assert_eq!(l.shared_mem_bytes, want.shared_mem_bytes);
        assert_eq!(
            r.duration_ns(),
            Some(want.duration_ns),
            "launch {j} node {i}"
        );
        assert_eq!(r.registers_per_thread(), Some(want.registers_per_thread));
        assert_eq!(r.entry_point(), Some(EntryPoint::GraphLaunch));
    }
}

#[test]
fn a_synthetic_graph_of_100000_nodes_runs_its_node_updates() {
    let spec = SyntheticGraph {
        nodes: 100_000,
        kernels: 7,
        launches: 6,
        update: GraphUpdate::NodeParams,
    };
    let dir = tempfile::tempdir().unwrap();
    let s = summary(&run_replayer(
        dir.path(),
        &[
            "--json",
            "--keep-ring",
            "--synthetic-graph",
            "100000",
            "--graph-kernels",
            "7",
            "--graph-launches",
            "6",
            "--graph-update",
            "node-params",
        ],
    ));
    assert_eq!(s["graph_launches"], 6);
    assert_eq!(s["node_launches"], 600_000);
    assert_eq!(s["updates"], 5);
    assert_eq!(s["functions"].as_array().unwrap().len(), 7);
    let pid = u32::try_from(s["pid"].as_u64().unwrap()).unwrap();
    assert_eq!(CounterRing::open(pid).unwrap().head().unwrap(), 600_000);
    // The ring holds the last 65,536 records: the tail of the last launch, after five updates
    // (the last of which falls in the tail).
    let records = drain(&s);
    assert_eq!(records.len(), 65_536);
    let first = 100_000 - records.len();
    assert!(spec.updated_node(5) as usize >= first);
    check_synthetic(&spec, &s, &records, 5, first);
}

#[test]
fn a_synthetic_graph_takes_whole_exec_updates() {
    let spec = SyntheticGraph {
        nodes: 1_000,
        kernels: 5,
        launches: 4,
        update: GraphUpdate::Exec,
    };
    let dir = tempfile::tempdir().unwrap();
    let s = summary(&run_replayer(
        dir.path(),
        &[
            "--json",
            "--keep-ring",
            "--synthetic-graph",
            "1000",
            "--graph-kernels",
            "5",
            "--graph-launches",
            "4",
            "--graph-update",
            "exec",
        ],
    ));
    assert_eq!(s["updates"], 3);
    assert_eq!(s["launches"], Value::Null, "not a trace summary");
    let records = drain(&s);
    assert_eq!(records.len(), 4_000);
    for (j, launch) in records.chunks(1_000).enumerate() {
        check_synthetic(&spec, &s, launch, j as u64, 0);
        assert!(launch.iter().all(|(_, l)| l.graph_exec == s["graph_exec"]));
    }
}

#[test]
fn a_graph_holds_at_most_1048576_nodes() {
    let dir = tempfile::tempdir().unwrap();
    let out = run_replayer(
        dir.path(),
        &["--synthetic-graph", "1048577", "--graph-kernels", "1"],
    );
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("cuGraphAddKernelNode_v2") && err.contains("CUDA_ERROR_OUT_OF_MEMORY"),
        "{err}"
    );
}
