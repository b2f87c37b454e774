//! `penrose-replay`: replays a profiler trace's kernel launches through a stand-in libcuda
//! (`--graphs`: a trace's graph launches as graph launches), or launches one synthetic CUDA
//! graph (`--synthetic-graph NODES`).
//!
//! Exit status: 0 on success, 2 when the trace (or the process selection) is unusable, 1 for
//! anything else (library not loadable, a driver call failed).

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::AtomicBool;

use anyhow::Context;
use clap::{Parser, ValueEnum};
use penrose_standin::{
    DevicePlan, Driver, EntryPoint, GraphUpdate, LIBCUDA_PATH, LIBCUDART_PATH, Libraries, Loops,
    NVCC_APP_PATH, NvccApp, Pace, ProcessSelection, ReplayOptions, ReplayPlan, ReplaySummary,
    Resolve, Runtime, RuntimeVia, STATIC_LIB_PATH, StandinError, StaticLib, SyntheticGraph, Via,
    replay_with, ring_path, run_synthetic_graph, signal,
};

#[derive(Parser, Debug)]
#[command(
    version,
    about = "Replays a PyTorch profiler trace through a stand-in libcuda"
)]
struct Args {
    /// The stand-in library to dlopen (normally an installed libcuda.so.1); defaults to the
    /// one this crate built.
    #[arg(long)]
    lib: Option<PathBuf>,
    /// asap: back to back; trace: at the trace's own launch times divided by --speed.
    #[arg(long, value_enum, default_value_t = PaceArg::Asap)]
    pace: PaceArg,
    /// Time compression for --pace trace (2 replays twice as fast).
    #[arg(long, default_value_t = 1.0)]
    speed: f64,
    /// Replay the sequence this many times.
    #[arg(long = "loop", default_value_t = 1, conflicts_with = "loop_forever",
          value_parser = clap::value_parser!(u64).range(1..))]
    loops: u64,
    /// Replay until SIGINT or SIGTERM, then print the summary.
    #[arg(long)]
    loop_forever: bool,
    /// Which process's sequence: `largest`, `all` (merged by launch time) or a process id.
    #[arg(long, default_value = "largest")]
    process: ProcessSelection,
    /// How names become function handles.
    #[arg(long, value_enum, default_value_t = ResolveArg::Module)]
    resolve: ResolveArg,
    /// The launch entry point; `rotate` cycles through all six kernel launch variants. With
    /// `--via runtime*` only launch-kernel (cudaLaunchKernel) and launch-kernel-ptsz
    /// (cudaLaunchKernel_ptsz); with `--via static` only launch-kernel.
    #[arg(long, value_enum, default_value_t = EntryArg::LaunchKernel)]
    entry: EntryArg,
    /// driver: straight to the driver (names through --resolve); runtime: through the stand-in
    /// runtime and the test application's nvcc-named stubs (`__cudaRegisterFunction`,
    /// `__cudaGetKernel` handles); runtime-legacy: the same, launching with stub addresses;
    /// static: through the stripped library with a statically linked runtime.
    #[arg(long, value_enum, default_value_t = ViaArg::Driver)]
    via: ViaArg,
    /// With --via runtime*: register each stub under its own mangled name
    /// (`_Z13penrose_kNNNNPv`) instead of the trace's kernel name.
    #[arg(long)]
    self_named: bool,
    /// The stand-in runtime to dlopen (normally an installed libcudart.so.13); defaults to the
    /// one this crate built.
    #[arg(long)]
    cudart: Option<PathBuf>,
    /// The test application to dlopen (libpenrose_nvcc_app.so); defaults to the built one.
    #[arg(long)]
    app: Option<PathBuf>,
    /// The stripped library to dlopen (libpenrose_static.so); defaults to the built one.
    #[arg(long)]
    static_lib: Option<PathBuf>,
    /// The CUDA device ordinal to launch on (after CUDA_VISIBLE_DEVICES renumbers the
    /// stand-in host's GPUs, PENROSE_STANDIN_GPUS).
    #[arg(long, default_value_t = 0)]
    device: i32,
    /// Move to the next device ordinal (wrapping) after every N launches.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    switch_device_every: Option<u64>,
    /// Ask the driver for every device's UUID before launching (cuDeviceGetUuid_v2), as an
    /// application reading its devices' properties does.
    #[arg(long)]
    query_uuids: bool,
    /// With --query-uuids, ask with the older cuDeviceGetUuid instead (on a MIG instance it
    /// answers with the physical GPU's UUID), as applications built before CUDA 11.4 do.
    #[arg(long, requires = "query_uuids")]
    legacy_uuid_call: bool,
    /// Print the summary as JSON.
    #[arg(long)]
    json: bool,
    /// Leave /dev/shm/penrose-standin-<pid> in place for a reader (removed by default).
    #[arg(long)]
    keep_ring: bool,
    /// Replay each trace graph launch (the kernels one cudaGraphLaunch ran) as a graph launch:
    /// captured on the replay stream the first time its (name, grid, block) sequence is seen,
    /// then relaunched with cuGraphLaunch.
    #[arg(long)]
    graphs: bool,
    /// Instead of a trace: build one explicit graph of NODES kernel nodes (cuGraphCreate,
    /// cuGraphAddKernelNode_v2) and launch it --graph-launches times.
    #[arg(long, value_name = "NODES", conflicts_with_all = ["trace", "graphs"])]
    synthetic_graph: Option<u32>,
    /// Distinct kernels of the synthetic graph (graph_node_kernel_<i % M>).
    #[arg(long, value_name = "M", default_value_t = 16,
          value_parser = clap::value_parser!(u32).range(1..), requires = "synthetic_graph")]
    graph_kernels: u32,
    /// Launches of the synthetic graph.
    #[arg(
        long,
        value_name = "K",
        default_value_t = 1,
        requires = "synthetic_graph"
    )]
    graph_launches: u64,
    /// What changes between launches of the synthetic graph: node-params updates one node
    /// (cuGraphExecKernelNodeSetParams_v2), exec the whole exec (cuGraphExecUpdate_v2).
    #[arg(long, value_enum, default_value_t = UpdateArg::None, requires = "synthetic_graph")]
    graph_update: UpdateArg,
    /// The trace (.json or .json.gz).
    #[arg(required_unless_present = "synthetic_graph")]
    trace: Option<PathBuf>,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum UpdateArg {
    None,
    NodeParams,
    Exec,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum PaceArg {
    Asap,
    Trace,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum ResolveArg {
    Module,
    Library,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum ViaArg {
    Driver,
    Runtime,
    RuntimeLegacy,
    Static,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum EntryArg {
    LaunchKernel,
    LaunchKernelPtsz,
    LaunchKernelEx,
    LaunchKernelExPtsz,
    Cooperative,
    CooperativePtsz,
    Rotate,
}

impl EntryArg {
    fn driver_via(self) -> Via {
        match self {
            Self::LaunchKernel => Via::Entry(EntryPoint::LaunchKernel),
            Self::LaunchKernelPtsz => Via::Entry(EntryPoint::LaunchKernelPtsz),
            Self::LaunchKernelEx => Via::Entry(EntryPoint::LaunchKernelEx),
            Self::LaunchKernelExPtsz => Via::Entry(EntryPoint::LaunchKernelExPtsz),
            Self::Cooperative => Via::Entry(EntryPoint::LaunchCooperativeKernel),
            Self::CooperativePtsz => Via::Entry(EntryPoint::LaunchCooperativeKernelPtsz),
            Self::Rotate => Via::Rotate,
        }
    }
}

/// An error the exit status should set apart from the others.
enum Failure {
    BadInput(anyhow::Error),
    Other(anyhow::Error),
}

impl From<anyhow::Error> for Failure {
    fn from(e: anyhow::Error) -> Self {
        Self::Other(e)
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure::BadInput(e)) => {
            eprintln!("penrose-replay: error: {}", one_line(&e));
            ExitCode::from(2)
        }
        Err(Failure::Other(e)) => {
            eprintln!("penrose-replay: error: {}", one_line(&e));
            ExitCode::FAILURE
        }
    }
}

/// The error and its causes on one line, leaving out a cause whose text the message already
/// holds (the trace errors print their source themselves).
fn one_line(e: &anyhow::Error) -> String {
    let mut line = e.to_string();
    for cause in e.chain().skip(1) {
        let cause = cause.to_string();
        if !line.contains(&cause) {
            line.push_str(": ");
            line.push_str(&cause);
        }
    }
    line.replace('\n', " ")
}

/// A flag value as the command line spells it.
fn value_name<T: ValueEnum>(x: &T) -> String {
    x.to_possible_value()
        .map_or_else(String::new, |p| p.get_name().to_owned())
}

/// The replay path the flags ask for, or why they do not fit together.
fn via(args: &Args) -> Result<Via, String> {
    if args.self_named && !matches!(args.via, ViaArg::Runtime | ViaArg::RuntimeLegacy) {
        return Err("--self-named needs --via runtime or --via runtime-legacy".into());
    }
    let per_thread_stream = match (args.via, args.entry) {
        (ViaArg::Driver, _) => return Ok(args.entry.driver_via()),
        (ViaArg::Static, EntryArg::LaunchKernel) => return Ok(Via::Static),
        (ViaArg::Runtime | ViaArg::RuntimeLegacy, EntryArg::LaunchKernel) => false,
        (ViaArg::Runtime | ViaArg::RuntimeLegacy, EntryArg::LaunchKernelPtsz) => true,
        (v, e) => {
            return Err(format!(
                "--entry {} cannot be used with --via {}",
                value_name(&e),
                value_name(&v)
            ));
        }
    };
    Ok(Via::Runtime(RuntimeVia {
        legacy: args.via == ViaArg::RuntimeLegacy,
        per_thread_stream,
        self_named: args.self_named,
        names_untouched: false,
    }))
}

fn run(args: &Args) -> Result<(), Failure> {
    match (&args.trace, args.synthetic_graph) {
        (_, Some(nodes)) => run_synthetic(args, nodes),
        (Some(trace), None) => run_trace(args, trace),
        (None, None) => Err(Failure::BadInput(anyhow::anyhow!(
            "name a trace or --synthetic-graph"
        ))),
    }
}

/// Loads the stand-in the flags name (or the built one).
fn load_driver(args: &Args) -> Result<Driver, Failure> {
    let lib = args
        .lib
        .clone()
        .unwrap_or_else(|| PathBuf::from(LIBCUDA_PATH));
    Ok(Driver::load(&lib).with_context(|| format!("loading {}", lib.display()))?)
}

/// Builds and launches the synthetic graph.
fn run_synthetic(args: &Args, nodes: u32) -> Result<(), Failure> {
    let spec = SyntheticGraph {
        nodes,
        kernels: args.graph_kernels,
        launches: args.graph_launches,
        update: match args.graph_update {
            UpdateArg::None => GraphUpdate::None,
            UpdateArg::NodeParams => GraphUpdate::NodeParams,
            UpdateArg::Exec => GraphUpdate::Exec,
        },
    };
    let driver = load_driver(args)?;
    let result = run_synthetic_graph(&driver, &spec, args.device);
    if !args.keep_ring {
        let _ = std::fs::remove_file(ring_path(std::process::id()));
    }
    let summary = result.context("replaying the synthetic graph")?;
    if args.json {
        let json = serde_json::to_string_pretty(&summary).context("encoding the summary")?;
        println!("{json}");
    } else {
        println!(
            "synthetic graph: {} nodes of {} kernels, {} launches ({} updates): {} nodes in {:.3} s",
            nodes,
            spec.kernels,
            summary.graph_launches,
            summary.updates,
            summary.node_launches,
            summary.elapsed_s
        );
    }
    Ok(())
}

/// Replays a trace.
fn run_trace(args: &Args, trace_path: &std::path::Path) -> Result<(), Failure> {
    if !(args.speed.is_finite() && args.speed > 0.0) {
        return Err(Failure::BadInput(anyhow::anyhow!(
            "--speed must be a positive number, got {}",
            args.speed
        )));
    }
    let via = via(args).map_err(|e| Failure::BadInput(anyhow::anyhow!(e)))?;
    let plan = plan(args, trace_path)?;
    // Before the stand-in loads: loading it creates the counter ring, which is what a caller
    // waits for before it may send SIGTERM; a handler installed later let that signal kill
    // the process without its summary.
    let stop = if args.loop_forever {
        Some(signal::stop_on_signals().context("installing signal handlers")?)
    } else {
        None
    };
    let driver = load_driver(args)?;
    let loaded = Loaded::for_via(args, via, &driver)?;
    let libs = Libraries {
        driver: &driver,
        runtime: loaded.runtime.as_ref(),
        app: loaded.app.as_ref(),
        static_lib: loaded.static_lib.as_ref(),
    };
    let result = replay_with(&libs, &plan, &options(args, via, stop));
    if !args.keep_ring {
        // Absent when cuInit failed; nothing else to clean up then.
        let _ = std::fs::remove_file(ring_path(std::process::id()));
    }
    let summary = result.map_err(|e| match e {
        StandinError::TooManyKernels { .. } => Failure::BadInput(
            anyhow::Error::new(e).context(format!("replaying {}", trace_path.display())),
        ),
        other => Failure::Other(
            anyhow::Error::new(other).context(format!("replaying {}", trace_path.display())),
        ),
    })?;
    print_summary(args, trace_path, &plan, &summary)
}

/// The trace's launches of the process the flags pick; a trace that does not read, or has
/// nothing to replay, is bad input.
fn plan(args: &Args, trace_path: &std::path::Path) -> Result<ReplayPlan, Failure> {
    let trace = penrose_traces::read_trace(trace_path)
        .map_err(|e| Failure::BadInput(anyhow::Error::new(e)))?;
    Ok(ReplayPlan::from_trace(&trace, args.process)
        .map_err(|e| match e {
            StandinError::NameWithNul(_) | StandinError::NothingToReplay(_) => {
                Failure::BadInput(anyhow::Error::new(e))
            }
            other => Failure::Other(anyhow::Error::new(other)),
        })?
        .with_graphs(args.graphs))
}

/// The libraries besides the driver that a replay path needs, loaded.
struct Loaded {
    runtime: Option<Runtime>,
    app: Option<NvccApp>,
    static_lib: Option<StaticLib>,
}

impl Loaded {
    /// Loads what `via` needs in a real process's order: driver, runtime, application (each
    /// finds the one before by soname); or the static library.
    fn for_via(args: &Args, via: Via, driver: &Driver) -> Result<Self, Failure> {
        let path_or =
            |p: &Option<PathBuf>, default: &str| p.clone().unwrap_or_else(|| default.into());
        let (runtime, app) = if matches!(via, Via::Runtime(_)) {
            let cudart = path_or(&args.cudart, LIBCUDART_PATH);
            let runtime = Runtime::load(&cudart, driver)
                .with_context(|| format!("loading {}", cudart.display()))?;
            let app_path = path_or(&args.app, NVCC_APP_PATH);
            let app = NvccApp::load(&app_path, &runtime)
                .with_context(|| format!("loading {}", app_path.display()))?;
            (Some(runtime), Some(app))
        } else {
            (None, None)
        };
        let static_lib = if via == Via::Static {
            let path = path_or(&args.static_lib, STATIC_LIB_PATH);
            Some(
                StaticLib::load(&path, driver)
                    .with_context(|| format!("loading {}", path.display()))?,
            )
        } else {
            None
        };
        Ok(Self {
            runtime,
            app,
            static_lib,
        })
    }
}

/// The replay options the flags ask for, on path `via`, stopped by `stop` if given.
fn options(args: &Args, via: Via, stop: Option<&'static AtomicBool>) -> ReplayOptions<'static> {
    ReplayOptions {
        pace: match args.pace {
            PaceArg::Asap => Pace::Asap,
            PaceArg::Trace => Pace::Trace { speed: args.speed },
        },
        loops: if args.loop_forever {
            Loops::Forever
        } else {
            Loops::Count(args.loops)
        },
        resolve: match args.resolve {
            ResolveArg::Module => Resolve::Module,
            ResolveArg::Library => Resolve::Library,
        },
        via,
        stop,
        devices: DevicePlan {
            ordinal: args.device,
            switch_every: args.switch_device_every,
            query_uuids: args.query_uuids,
            legacy_uuid_call: args.legacy_uuid_call,
        },
    }
}

/// Prints the summary: as JSON with `--json`, else a line (and one for graphs with
/// `--graphs`).
fn print_summary(
    args: &Args,
    trace_path: &std::path::Path,
    plan: &ReplayPlan,
    summary: &ReplaySummary,
) -> Result<(), Failure> {
    if args.json {
        let json = serde_json::to_string_pretty(summary).context("encoding the summary")?;
        println!("{json}");
    } else {
        println!(
            "{}: replayed {} launches of {} distinct kernels ({} loops) in {:.3} s: {:.0} launches/s",
            trace_path.display(),
            summary.replayed,
            plan.names().len(),
            summary.loops,
            summary.elapsed_s,
            summary.launches_per_s
        );
        if args.graphs {
            println!(
                "graphs: {} graph launches of {} captured graphs ran {} kernels",
                summary.graph_launches, summary.graphs_captured, summary.graph_kernels
            );
        }
    }
    Ok(())
}
