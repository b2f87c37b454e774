//! Live capture of CUDA graphs against the stand-in libcuda: graph launches enter snippets as
//! their kernels (issue 24).
//!
//! Needs root (loading eBPF programs); without it, or without the traces, the checks that need
//! them print SKIPPED and pass. Like `capture.rs`, the binary is its own replayer: run with
//! `PENROSE_GRAPHS_CHILD` set it replays (or builds a synthetic graph) through the stand-in in
//! a process of its own and writes the summary as JSON to a file.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::num::NonZeroU32;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};

use penrose_agent::capture::events::Pid;
use penrose_agent::capture::loader::is_root;
use penrose_agent::capture::locate::LibrarySources;
use penrose_agent::capture::window::Snippet;
use penrose_agent::capture::{Capture, CaptureConfig};
use penrose_agent::counters::SourceKind;
use penrose_core::counters::Catalogue;
use penrose_core::fingerprint::{FingerprintParams, Fingerprinter};
use penrose_core::sampling::SamplePeriod;
use penrose_standin::{
    Driver, EntryPoint, GraphUpdate, Loops, NextCounters, Pace, ProcessSelection, ReplayOptions,
    ReplayPlan, Resolve, SyntheticGraph, Via,
};
use serde_json::Value;

const CHILD: &str = "PENROSE_GRAPHS_CHILD";

/// The one reference trace that launches through graphs (70 graph launches, 135 kernels).
const GRAPH_TRACE: &str = "hta-negative_queue_length_values_check--rank0.json.gz";

fn main() {
    if let Ok(mode) = std::env::var(CHILD) {
        child(&mode);
        return;
    }
    if !is_root() {
        println!("SKIPPED: live graph tests need root (CI runs them as root)");
        return;
    }
    if std::env::var_os(penrose_standin::ring::GPUS_VAR).is_none() {
        one_gpu_host();
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let lib = penrose_standin::install_libcuda(dir.path()).unwrap();
    explicit_graphs_expand_and_updates_change_the_sequence(&lib);
    a_ten_thousand_node_graph_expands_without_drops(&lib);
    the_countdown_counts_a_known_graphs_kernels(&lib);
    match trace() {
        Some(trace) => {
            a_trace_replayed_eagerly_and_through_graphs_fingerprints_the_same(&lib, &trace);
        }
        None => println!("SKIPPED: 1 trace check (no {GRAPH_TRACE}; set PENROSE_TRACES)"),
    }
}

/// Re-runs this binary on a stand-in host of one GPU, so every sample is attributed to it even
/// when a replayer exits before its records are read (device attribution is `capture.rs`'s
/// subject); the stand-in's GPUs must be in the capture's environment from the start.
fn one_gpu_host() {
    let out = Command::new(std::env::current_exe().unwrap())
        .env(penrose_standin::ring::GPUS_VAR, "9.0")
        .output()
        .unwrap();
    print!("{}", String::from_utf8_lossy(&out.stdout));
    eprint!("{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "graph checks: {}", out.status);
}

fn trace() -> Option<PathBuf> {
    let path = penrose_traces::TraceFolder::default_dir().join(GRAPH_TRACE);
    path.exists().then_some(path)
}

fn standin_capture(lib: &Path, sample_period: u32) -> Capture {
    Capture::start(CaptureConfig {
        sources: LibrarySources {
            explicit: vec![lib.to_path_buf()],
            ldconfig: false,
            proc_maps: false,
            // The stand-in copy lives in a temporary directory under /tmp.
            allow_untrusted: true,
        },
        window_launches: usize::MAX,
        sample_period: SamplePeriod(NonZeroU32::new(sample_period).unwrap()),
        counters: SourceKind::TestStandinRing,
        seed: Some(11),
        ..CaptureConfig::default()
    })
    .unwrap()
}

struct Replayer {
    child: Child,
    out: tempfile::TempPath,
}

fn spawn(lib: &Path, mode: &str) -> Replayer {
    let out = tempfile::NamedTempFile::new().unwrap().into_temp_path();
    let child = Command::new(std::env::current_exe().unwrap())
        .env(CHILD, mode)
        .env(format!("{CHILD}_OUT"), &out)
        .env(format!("{CHILD}_LIB"), lib)
        .spawn()
        .unwrap();
    Replayer { child, out }
}

/// Runs one replayer inside a window opened before it starts; returns its snippet and summary.
fn capture_one(capture: &mut Capture, lib: &Path, mode: &str) -> (Snippet, Value) {
    capture.open_window().unwrap();
    let mut replayer = spawn(lib, mode);
    let mut status = None;
    capture.poll_until(|_| {
        status = replayer.child.try_wait().unwrap();
        status.is_some()
    });
    capture.drain_all();
    capture.close_window().unwrap();
    assert!(status.unwrap().success(), "replayer {mode}");
    let summary: Value = serde_json::from_slice(&std::fs::read(&replayer.out).unwrap()).unwrap();
    let pid = Pid(summary["pid"].as_u64().unwrap() as u32);
    let mut snippets: Vec<Snippet> = capture
        .take_snippets()
        .into_iter()
        .filter(|s| s.pid == pid)
        .collect();
    assert_eq!(snippets.len(), 1, "{mode}: one snippet");
    (snippets.remove(0), summary)
}

fn check(name: &str) {
    println!("test {name} ... ok");
}

/// An explicit graph of 40 nodes over 5 kernels, launched 6 times: each launch enters the
/// snippet as the 40 kernels it runs, in node order; with per-node parameter changes and
/// whole-exec updates between launches, each launch's kernels are the updated ones. Every
/// sample carries the values of the node it fell on.
fn explicit_graphs_expand_and_updates_change_the_sequence(lib: &Path) {
    for update in [
        GraphUpdate::None,
        GraphUpdate::NodeParams,
        GraphUpdate::Exec,
    ] {
        let spec = SyntheticGraph {
            nodes: 40,
            kernels: 5,
            launches: 6,
            update,
        };
        // S = 3: the first launches may come before the agent wrote the graph's kernel count
        // (they count as one launch each), and a sample must still fall in the six.
        let mut capture = standin_capture(lib, 3);
        let (snippet, summary) = capture_one(&mut capture, lib, &synthetic_mode(&spec));
        assert_eq!(summary["graph_launches"].as_u64(), Some(spec.launches));
        let expected: Vec<String> = (0..spec.launches)
            .flat_map(|j| spec.expected(j))
            .map(|node| SyntheticGraph::kernel_name(node.kernel))
            .collect();
        let names: Vec<String> = snippet.names.iter().map(|n| n.to_string()).collect();
        assert_eq!(names, expected, "{update:?}: the expanded sequence");
        let counts = capture.counts();
        assert_eq!(counts.graphs.launches_expanded, spec.launches, "{update:?}");
        assert_eq!(
            counts.graphs.launches_unknown + counts.graphs.launches_incomplete,
            0
        );
        assert!(
            !snippet.samples.is_empty(),
            "{update:?}: samples inside graphs: {counts:?}"
        );
        let duration = Catalogue::current()
            .counter_by_name("kernel_duration")
            .unwrap()
            .id;
        let nodes: Vec<_> = (0..spec.launches).flat_map(|j| spec.expected(j)).collect();
        for sample in &snippet.samples {
            let value = sample.values.iter().find(|v| v.counter == duration);
            assert_eq!(
                value.map(|v| v.value),
                Some(nodes[sample.position].duration_ns as f64),
                "{update:?}: the sample at {} has its own node's values",
                sample.position
            );
        }
        println!(
            "  explicit graph ({update:?}): {} launches -> {} kernels, {} samples with their node's values",
            spec.launches,
            names.len(),
            snippet.samples.len()
        );
    }
    check("explicit_graphs_expand_and_updates_change_the_sequence");
}

/// A graph of 10,000 nodes launched three times: 30,000 kernels in the snippet, no ring-buffer
/// drops, no bound reached, and any sample at the kernel the countdown fell on carries that
/// node's values.
fn a_ten_thousand_node_graph_expands_without_drops(lib: &Path) {
    let spec = SyntheticGraph {
        nodes: 10_000,
        kernels: 64,
        launches: 3,
        update: GraphUpdate::None,
    };
    let mut capture = standin_capture(lib, 10_000);
    let (snippet, _) = capture_one(&mut capture, lib, &synthetic_mode(&spec));
    assert_eq!(capture.drops().unwrap(), 0, "ring-buffer drops");
    assert_eq!(snippet.names.len(), 30_000);
    let counts = capture.counts();
    assert_eq!(counts.graphs.kernels_expanded, 30_000);
    assert_eq!(counts.graphs.over_bounds, 0);
    // A graph launch carries at most one sample. The launches here follow the instantiation
    // at once, before the agent has read the 20,000 records that built the graph and written
    // its kernel count, so the countdown counts each as one launch (the count taking effect is
    // `the_countdown_counts_a_known_graphs_kernels`).
    assert!(
        snippet.samples.len() <= spec.launches as usize,
        "{counts:?}"
    );
    let duration = Catalogue::current()
        .counter_by_name("kernel_duration")
        .unwrap()
        .id;
    for sample in &snippet.samples {
        let node = spec.node((sample.position % 10_000) as u32, 0);
        let value = sample.values.iter().find(|v| v.counter == duration);
        assert_eq!(value.map(|v| v.value), Some(node.duration_ns as f64));
    }
    println!(
        "  10,000-node graph x 3: 30,000 kernels expanded, {} samples (S = 10,000)",
        snippet.samples.len()
    );
    check("a_ten_thousand_node_graph_expands_without_drops");
}

/// A graph of 1,000 nodes, instantiated, then launched 20 times half a second later (the
/// agent has written its kernel count by then): with S = 500 the countdown, counting 1,000
/// kernels per launch, falls inside every launch, so there are exactly 20 samples, each at the
/// node it fell on with that node's values. Counting each launch as one, as before the kernel
/// count existed, would give at most one.
fn the_countdown_counts_a_known_graphs_kernels(lib: &Path) {
    let mut capture = standin_capture(lib, 500);
    let (snippet, _) = capture_one(&mut capture, lib, &format!("paced:{PACED_NODES}:20"));
    assert_eq!(snippet.names.len(), 20 * PACED_NODES as usize);
    let counts = capture.counts();
    assert_eq!(snippet.samples.len(), 20, "{counts:?}");
    let duration = Catalogue::current()
        .counter_by_name("kernel_duration")
        .unwrap()
        .id;
    for sample in &snippet.samples {
        let node = (sample.position % PACED_NODES as usize) as u64;
        let value = sample.values.iter().find(|v| v.counter == duration);
        assert_eq!(value.map(|v| v.value), Some(paced_duration_ns(node) as f64));
    }
    println!(
        "  1,000-node graph x 20 with S = 500: {} samples, one per launch, each with its node's values",
        snippet.samples.len()
    );
    check("the_countdown_counts_a_known_graphs_kernels");
}

/// Nodes of the paced graph.
const PACED_NODES: u32 = 1_000;

/// The duration the paced graph's node `i` carries.
fn paced_duration_ns(i: u64) -> u64 {
    10_000 + i
}

/// Builds a graph of `nodes` nodes of one kernel, instantiates it, waits half a second and
/// launches it `launches` times.
fn paced_graph(driver: &Driver, nodes: u32, launches: u32) -> Value {
    use penrose_standin::{KernelNode, NodeKernel, Present};
    driver.init().unwrap();
    driver.use_device(0).unwrap();
    let stream = driver.stream_create().unwrap();
    let module = driver.module_load_data(c"penrose graphs test").unwrap();
    let function = driver
        .module_get_function(module, c"paced_graph_kernel")
        .unwrap();
    let graph = driver.graph_create().unwrap();
    let mut previous = Vec::new();
    for i in 0..nodes {
        driver.set_next_counters(&NextCounters {
            duration_ns: paced_duration_ns(u64::from(i)),
            present: Present::DURATION,
            ..NextCounters::default()
        });
        let node = KernelNode {
            kernel: NodeKernel::Function(function),
            grid: [1 + i % 7, 1, 1],
            block: [128, 1, 1],
            shared_mem_bytes: 0,
        };
        previous = vec![
            driver
                .graph_add_kernel_node_v2(graph, &previous, &node)
                .unwrap(),
        ];
    }
    let exec = driver.graph_instantiate(graph, 0).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(500));
    for _ in 0..launches {
        driver.graph_launch(exec, stream).unwrap();
    }
    serde_json::json!({ "pid": std::process::id() })
}

/// The graph-launching reference trace replayed eagerly, then with its graph launches captured
/// once and replayed as graphs: the two snippets hold the same kernels in the same order, so
/// their fingerprints (hash and locator) are equal and they land in one class. Before
/// expansion the graph replay's snippet had a `<graph>` for each of the 70 graph launches.
fn a_trace_replayed_eagerly_and_through_graphs_fingerprints_the_same(lib: &Path, trace: &Path) {
    let mut capture = standin_capture(lib, 7);
    let eager_mode = format!("trace-eager:{}", trace.display());
    let graph_mode = format!("trace-graphs:{}", trace.display());
    let (eager, _) = capture_one(&mut capture, lib, &eager_mode);
    let before = capture.counts().graphs;
    let (graphs, summary) = capture_one(&mut capture, lib, &graph_mode);
    let after = capture.counts().graphs;
    let expanded = after.launches_expanded - before.launches_expanded;
    assert!(
        summary["graph_launches"].as_u64().unwrap() > 0,
        "the replay launched through graphs: {summary}"
    );
    assert_eq!(Some(expanded), summary["graph_launches"].as_u64());
    assert!(after.captured_launches > before.captured_launches);
    assert_eq!(
        graphs.names, eager.names,
        "the same kernels in the same order"
    );
    let fingerprinter = Fingerprinter::new(FingerprintParams::default()).unwrap();
    let (a, b) = (
        eager.fingerprint(&fingerprinter),
        graphs.fingerprint(&fingerprinter),
    );
    assert_eq!(a.hash, b.hash);
    assert_eq!(a.locator, b.locator);
    // Every sample has values and names its kernel. An eager launch's are its own trace
    // values; a graph replays what was captured (the first launch of that graph's shape), as
    // a real graph replays the same kernels, so a sample inside one has the values of the
    // kernel at its node in that first launch.
    let seq = replayed_sequence(trace);
    let duration = Catalogue::current()
        .counter_by_name("kernel_duration")
        .unwrap()
        .id;
    let mut inside = 0;
    for sample in &graphs.samples {
        let kernel = &seq[sample.position];
        assert_eq!(
            *sample.kernel, *kernel.name,
            "sample at {}",
            sample.position
        );
        let value = sample.values.iter().find(|v| v.counter == duration);
        assert!(value.is_some(), "sample at {}", sample.position);
        if kernel.graph_launch {
            inside += 1;
        } else {
            let expected = NextCounters::from_kernel(kernel);
            assert_eq!(value.map(|v| v.value), Some(expected.duration_ns as f64));
        }
    }
    println!(
        "  {GRAPH_TRACE}: eager and graph replays give one fingerprint ({} kernels; {expanded} graph launches expanded, {} samples, {inside} inside graphs)",
        eager.names.len(),
        graphs.samples.len()
    );
    check("a_trace_replayed_eagerly_and_through_graphs_fingerprints_the_same");
}

/// The largest process's kernels in launch order, as the replayer chooses them.
fn replayed_sequence(trace: &Path) -> Vec<penrose_traces::Kernel> {
    let trace = penrose_traces::read_trace(trace).unwrap();
    let seqs = trace.process_sequences();
    let (_, seq) = seqs
        .iter()
        .max_by(|a, b| a.1.len().cmp(&b.1.len()).then(b.0.cmp(a.0)))
        .unwrap();
    seq.iter().map(|k| (*k).clone()).collect()
}

fn synthetic_mode(spec: &SyntheticGraph) -> String {
    let update = match spec.update {
        GraphUpdate::None => "none",
        GraphUpdate::NodeParams => "node-params",
        GraphUpdate::Exec => "exec",
    };
    format!(
        "synthetic:{}:{}:{}:{update}",
        spec.nodes, spec.kernels, spec.launches
    )
}

/// The replayer side.
fn child(mode: &str) {
    let var = |k: &str| std::env::var(format!("{CHILD}_{k}")).unwrap();
    let driver = Driver::load(Path::new(&var("LIB"))).unwrap();
    let summary = match mode.split_once(':') {
        Some(("synthetic", spec)) => {
            let parts: Vec<&str> = spec.split(':').collect();
            let spec = SyntheticGraph {
                nodes: parts[0].parse().unwrap(),
                kernels: parts[1].parse().unwrap(),
                launches: parts[2].parse().unwrap(),
                update: match parts[3] {
                    "node-params" => GraphUpdate::NodeParams,
                    "exec" => GraphUpdate::Exec,
                    _ => GraphUpdate::None,
                },
            };
            serde_json::to_value(penrose_standin::run_synthetic_graph(&driver, &spec, 0).unwrap())
                .unwrap()
        }
        Some(("paced", spec)) => {
            let (nodes, launches) = spec.split_once(':').unwrap();
            paced_graph(&driver, nodes.parse().unwrap(), launches.parse().unwrap())
        }
        Some((how, trace)) => {
            let trace = penrose_traces::read_trace(Path::new(trace)).unwrap();
            let plan = ReplayPlan::from_trace(&trace, ProcessSelection::Largest)
                .unwrap()
                .with_graphs(how == "trace-graphs");
            let options = ReplayOptions {
                pace: Pace::Asap,
                loops: Loops::Count(1),
                resolve: Resolve::Module,
                via: Via::Entry(EntryPoint::LaunchKernel),
                stop: None,
                devices: penrose_standin::DevicePlan::default(),
            };
            serde_json::to_value(penrose_standin::replay(&driver, &plan, &options).unwrap())
                .unwrap()
        }
        None => panic!("unknown child mode {mode}"),
    };
    std::fs::write(var("OUT"), serde_json::to_vec(&summary).unwrap()).unwrap();
}
