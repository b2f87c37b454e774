//! A trace turned into launches ([`ReplayPlan`]) and the loop that replays them ([`replay`]).
//!
//! The plan resolves everything a launch needs before the clock starts (names as C strings,
//! stream handles, counter fields), so that at full speed the loop does nothing but call the
//! driver: the replayer's launch rate is the workload the probes are measured against.
//!
//! With [`ReplayPlan::with_graphs`], the kernels of each trace graph launch are replayed as a
//! graph launch: captured on the replay stream the first time their sequence of (name, grid,
//! block) is seen, relaunched with `cuGraphLaunch` after that (see [`crate::graphs`]).

use std::collections::BTreeMap;
use std::ffi::CString;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use penrose_traces::{Kernel, ProcessId, StreamId, Trace};
use serde::Serialize;

use crate::abi::{EntryPoint, NextCounters, saturate_u32};
use crate::driver::{Driver, FunctionHandle, Launch, StreamHandle};
use crate::graphs::{GraphCache, GraphKey, GraphLaunch, GraphSteps, Step, graph_key};
use crate::runtime::{
    AppLaunch, NvccApp, Runtime, RuntimeCounter, StaticLib, StubAddress, UntouchedNames,
};

/// The entry points that launch one kernel (all but the graph launches), rotated through by
/// `Via::Rotate`.
const KERNEL_LAUNCHES: [EntryPoint; 6] = [
    EntryPoint::LaunchKernel,
    EntryPoint::LaunchKernelPtsz,
    EntryPoint::LaunchKernelEx,
    EntryPoint::LaunchKernelExPtsz,
    EntryPoint::LaunchCooperativeKernel,
    EntryPoint::LaunchCooperativeKernelPtsz,
];
use crate::error::StandinError;

/// Which of a trace's processes to replay.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ProcessSelection {
    /// The process with the most kernels (a trace usually has one application process).
    #[default]
    Largest,
    /// Every process, merged into one sequence by launch time.
    All,
    /// The process with this id.
    Pid(i64),
}

impl FromStr for ProcessSelection {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "largest" => Ok(Self::Largest),
            "all" => Ok(Self::All),
            _ => s
                .parse()
                .map(Self::Pid)
                .map_err(|_| format!("expected `largest`, `all` or a process id, got {s:?}")),
        }
    }
}

/// How launches are spaced in time.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Pace {
    /// Back to back: the probes' worst case.
    Asap,
    /// At the trace's own launch times divided by `speed` (2.0 replays twice as fast).
    Trace {
        /// Time compression factor, > 0.
        speed: f64,
    },
}

/// How often the sequence is replayed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Loops {
    /// This many times.
    Count(u64),
    /// Until the stop flag is set.
    Forever,
}

/// Which API resolves kernel names to function handles.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Resolve {
    /// `cuModuleLoadData` + `cuModuleGetFunction`.
    #[default]
    Module,
    /// CUDA 12: `cuLibraryLoadData` + `cuLibraryGetKernel` + `cuKernelGetFunction`.
    Library,
}

/// Which path launches take to the driver.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Via {
    /// Straight to the driver, always through this entry point (names resolved with
    /// [`Resolve`]).
    Entry(EntryPoint),
    /// Straight to the driver; launch i goes through the (i mod 6)-th kernel launch entry
    /// point, so one replay exercises every variant a probe must cover.
    Rotate,
    /// Through the stand-in runtime and the test application's nvcc-named stubs, as an
    /// application built with CUDA 12.4 or later launches: kernels registered with `__cudaRegisterFunction` (the
    /// driver's private path; no public name function), then `cudaLaunchKernel` with the
    /// handle from `__cudaGetKernel` (or, legacy, with the stub), which calls `cuLaunchKernel`
    /// (or `_ptsz`). Needs [`Libraries::runtime`] and [`Libraries::app`].
    Runtime(RuntimeVia),
    /// Through the stripped library with a statically linked runtime: trace kernel name i is
    /// launched as that library's kernel `i mod kernel_count` (`cuLaunchKernel`). Needs
    /// [`Libraries::static_lib`].
    Static,
}

/// The options of [`Via::Runtime`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RuntimeVia {
    /// The legacy launch (`__NV_LEGACY_LAUNCH`): `cudaLaunchKernel(stub, ...)`, no
    /// `__cudaGetKernel`.
    pub legacy: bool,
    /// `cudaLaunchKernel_ptsz` and `cuLaunchKernel_ptsz` (per-thread default stream).
    pub per_thread_stream: bool,
    /// Register each stub under its own mangled name (`_Z13penrose_kNNNNPv`) instead of the
    /// trace's kernel name, so that names recovered from the application's `.symtab` match
    /// what registration said.
    pub self_named: bool,
    /// Pass each name from a page this process has not touched, as a large library does at
    /// load (the agent's probe cannot read such a name; see `UntouchedNames`).
    pub names_untouched: bool,
}

impl Via {
    fn label(self) -> &'static str {
        match self {
            Self::Entry(_) | Self::Rotate => "the driver",
            Self::Runtime(r) if r.legacy => "the runtime (legacy)",
            Self::Runtime(_) => "the runtime",
            Self::Static => "the static library",
        }
    }
}

/// The loaded libraries a replay may go through; only the driver is always needed.
#[derive(Clone, Copy)]
pub struct Libraries<'a> {
    /// The stand-in libcuda.
    pub driver: &'a Driver,
    /// The stand-in runtime, for [`Via::Runtime`].
    pub runtime: Option<&'a Runtime>,
    /// The test application, for [`Via::Runtime`].
    pub app: Option<&'a NvccApp>,
    /// The stripped library, for [`Via::Static`].
    pub static_lib: Option<&'a StaticLib>,
}

impl<'a> Libraries<'a> {
    /// Only the driver (the direct paths).
    pub fn driver(driver: &'a Driver) -> Self {
        Self {
            driver,
            runtime: None,
            app: None,
            static_lib: None,
        }
    }
}

impl Default for Via {
    fn default() -> Self {
        Self::Entry(EntryPoint::LaunchKernel)
    }
}

/// Everything [`replay`] needs besides the plan.
#[derive(Clone, Copy, Debug)]
pub struct ReplayOptions<'a> {
    /// Spacing.
    pub pace: Pace,
    /// Repetitions.
    pub loops: Loops,
    /// Name resolution API.
    pub resolve: Resolve,
    /// Launch entry point(s).
    pub via: Via,
    /// Polled between launches; set it to end a replay early (required for [`Loops::Forever`]
    /// to end).
    pub stop: Option<&'a AtomicBool>,
    /// Which devices it launches on.
    pub devices: DevicePlan,
}

/// Which devices a replay launches on, picked as an application picks them: the CUDA
/// runtime's way (`cuDevicePrimaryCtxRetain`, then `cuCtxSetCurrent`), with the trace's streams
/// created in each device's context (`cuStreamCreate`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DevicePlan {
    /// The CUDA ordinal (after `CUDA_VISIBLE_DEVICES`) the replay starts on.
    pub ordinal: i32,
    /// Moves to the next ordinal (wrapping) after every this many launches: a process that
    /// switches devices.
    pub switch_every: Option<u64>,
    /// Asks the driver for every visible device's UUID first (`cuDeviceGetUuid_v2`), as an
    /// application reading its devices' properties does.
    pub query_uuids: bool,
    /// With `query_uuids`, asks with the older `cuDeviceGetUuid` instead, as applications
    /// built before CUDA 11.4 do: on a MIG instance it answers with the physical GPU's UUID,
    /// which a tool mapping UUIDs to devices must cope with. Ignored without `query_uuids`.
    pub legacy_uuid_call: bool,
}

/// The device a replay is on now, and the streams made in each device's context.
struct OnDevice {
    ordinal: i32,
    count: i32,
    streams: std::collections::HashMap<i32, Vec<StreamHandle>>,
    /// Device switches made so far.
    switches: u64,
}

impl OnDevice {
    /// Makes `plan.ordinal` current and creates its streams.
    fn start(driver: &Driver, plan: DevicePlan, streams: usize) -> Result<Self, StandinError> {
        let count = driver.device_count()?;
        if plan.query_uuids {
            for ordinal in 0..count {
                if plan.legacy_uuid_call {
                    driver.device_uuid_v1(ordinal)?;
                } else {
                    driver.device_uuid(ordinal)?;
                }
            }
        }
        let mut on = Self {
            ordinal: plan.ordinal,
            count,
            streams: std::collections::HashMap::new(),
            switches: 0,
        };
        on.switch_to(driver, plan.ordinal, streams)?;
        Ok(on)
    }

    fn switch_to(
        &mut self,
        driver: &Driver,
        ordinal: i32,
        streams: usize,
    ) -> Result<(), StandinError> {
        driver.use_device(ordinal)?;
        self.ordinal = ordinal;
        if let std::collections::hash_map::Entry::Vacant(slot) = self.streams.entry(ordinal) {
            let made = (0..streams)
                .map(|_| driver.stream_create())
                .collect::<Result<Vec<_>, _>>()?;
            slot.insert(made);
        }
        Ok(())
    }

    /// Moves to the next ordinal (wrapping).
    fn next(&mut self, driver: &Driver, streams: usize) -> Result<(), StandinError> {
        let next = (self.ordinal + 1) % self.count.max(1);
        self.switch_to(driver, next, streams)
    }

    fn streams(&self) -> &[StreamHandle] {
        self.streams.get(&self.ordinal).map_or(&[], Vec::as_slice)
    }
}

/// One launch, resolved ahead of time.
#[derive(Clone, Debug)]
struct PlannedLaunch {
    name: usize,
    stream: Option<usize>,
    grid: [u32; 3],
    block: [u32; 3],
    shared_mem_bytes: u32,
    /// µs after the sequence's first launch.
    offset_us: f64,
    counters: NextCounters,
    /// The trace graph launch that launched it, if any.
    graph: Option<GraphKey>,
}

/// A trace's chosen kernel sequence, ready to replay.
#[derive(Clone, Debug)]
pub struct ReplayPlan {
    names: Vec<CString>,
    streams: Vec<StreamId>,
    processes: Vec<ProcessId>,
    launches: Vec<PlannedLaunch>,
    period_us: f64,
    /// Set by [`ReplayPlan::with_graphs`]: the launches as steps, graph launches gathered.
    graphs: Option<GraphSteps>,
}

impl ReplayPlan {
    /// The launches of `selection` in `trace`, in launch order.
    pub fn from_trace(trace: &Trace, selection: ProcessSelection) -> Result<Self, StandinError> {
        let (processes, kernels) = select(trace, selection)?;
        if kernels.is_empty() {
            return Err(StandinError::NothingToReplay(format!(
                "{}: the trace has no kernels",
                trace.path().display()
            )));
        }
        let Planned {
            names,
            streams,
            launches,
        } = plan_launches(&kernels)?;
        let last = kernels[kernels.len() - 1];
        // One loop lasts until the last launch plus its kernel's run time.
        let period_us = launches[launches.len() - 1].offset_us + last.dur_us.max(0.0);
        Ok(Self {
            names,
            streams,
            processes,
            launches,
            period_us,
            graphs: None,
        })
    }

    /// Replays each trace graph launch (the kernels of one process launched by one
    /// `cudaGraphLaunch`, sharing its correlation id) as a graph launch when `on`, else every
    /// kernel with its own launch (the default).
    pub fn with_graphs(mut self, on: bool) -> Self {
        self.graphs = on.then(|| {
            let keys: Vec<Option<GraphKey>> = self.launches.iter().map(|l| l.graph).collect();
            let kernels: Vec<_> = self
                .launches
                .iter()
                .map(|l| (l.name, l.grid, l.block))
                .collect();
            GraphSteps::plan(&keys, &kernels)
        });
        self
    }

    /// The steps a graph replay takes ([`ReplayPlan::with_graphs`]); `None` when every kernel
    /// is launched on its own.
    pub fn graph_steps(&self) -> Option<&GraphSteps> {
        self.graphs.as_ref()
    }

    /// Trace graph launches in one loop (replayed as graph launches only
    /// [`ReplayPlan::with_graphs`]).
    pub fn graph_launches(&self) -> usize {
        let keys: std::collections::HashSet<GraphKey> =
            self.launches.iter().filter_map(|l| l.graph).collect();
        keys.len()
    }

    /// Launches per loop.
    pub fn len(&self) -> usize {
        self.launches.len()
    }

    /// Whether there is nothing to launch (never, for a plan built from a trace).
    pub fn is_empty(&self) -> bool {
        self.launches.is_empty()
    }

    /// Distinct kernel names, in order of first launch.
    pub fn names(&self) -> &[CString] {
        &self.names
    }

    /// The trace streams used, in order of first launch.
    pub fn streams(&self) -> &[StreamId] {
        &self.streams
    }

    /// The processes replayed.
    pub fn processes(&self) -> &[ProcessId] {
        &self.processes
    }

    /// How long one loop lasts at the trace's own pace.
    pub fn period(&self) -> Duration {
        Duration::from_secs_f64(self.period_us / 1e6)
    }
}

/// The processes `selection` picks in `trace` and their kernels, in launch order; an error
/// names a trace without kernels or a process it does not have.
fn select(
    trace: &Trace,
    selection: ProcessSelection,
) -> Result<(Vec<ProcessId>, Vec<&Kernel>), StandinError> {
    let sequences = trace.process_sequences();
    Ok(match selection {
        ProcessSelection::Largest => {
            let (pid, seq) = sequences
                .iter()
                // Ties go to the lowest id, so the choice is stable.
                .max_by(|a, b| a.1.len().cmp(&b.1.len()).then(b.0.cmp(a.0)))
                .ok_or_else(|| {
                    StandinError::NothingToReplay(format!(
                        "{}: the trace has no kernels",
                        trace.path().display()
                    ))
                })?;
            (vec![*pid], seq.clone())
        }
        ProcessSelection::Pid(pid) => {
            let seq = sequences.get(&ProcessId(pid)).ok_or_else(|| {
                let known: Vec<String> = sequences.keys().map(|p| p.0.to_string()).collect();
                StandinError::NothingToReplay(format!(
                    "{}: no process {pid}; processes with kernels: {}",
                    trace.path().display(),
                    known.join(", ")
                ))
            })?;
            (vec![ProcessId(pid)], seq.clone())
        }
        ProcessSelection::All => {
            let mut all: Vec<&Kernel> = sequences.values().flatten().copied().collect();
            all.sort_by(|a, b| a.launch_order_ts_us().total_cmp(&b.launch_order_ts_us()));
            (sequences.keys().copied().collect(), all)
        }
    })
}

/// A kernel sequence resolved for replay: its distinct names and streams, in order of first
/// launch, and each launch by their indices.
struct Planned {
    names: Vec<CString>,
    streams: Vec<StreamId>,
    launches: Vec<PlannedLaunch>,
}

/// Resolves `kernels` (not empty) into launches, timed from the first; a name with a NUL
/// byte is an error.
fn plan_launches(kernels: &[&Kernel]) -> Result<Planned, StandinError> {
    let first_ts = kernels[0].launch_order_ts_us();
    let mut name_index: BTreeMap<&str, usize> = BTreeMap::new();
    let mut names = Vec::new();
    let mut stream_index: BTreeMap<StreamId, usize> = BTreeMap::new();
    let mut streams = Vec::new();
    let mut launches = Vec::with_capacity(kernels.len());
    for k in kernels {
        let name = match name_index.get(&*k.name) {
            Some(&i) => i,
            None => {
                let c = CString::new(k.name.as_bytes())
                    .map_err(|_| StandinError::NameWithNul(k.name.to_string()))?;
                names.push(c);
                name_index.insert(&k.name, names.len() - 1);
                names.len() - 1
            }
        };
        let stream = k.stream.map(|s| {
            *stream_index.entry(s).or_insert_with(|| {
                streams.push(s);
                streams.len() - 1
            })
        });
        // Profilers record 0 for an unknown dimension; a driver refuses 0, so use 1.
        let dims = |d: Option<[u32; 3]>| d.unwrap_or([1, 1, 1]).map(|v| v.max(1));
        launches.push(PlannedLaunch {
            name,
            stream,
            grid: dims(k.grid),
            block: dims(k.block),
            shared_mem_bytes: saturate_u32(k.shared_memory_bytes.unwrap_or(0)),
            offset_us: (k.launch_order_ts_us() - first_ts).max(0.0),
            counters: NextCounters::from_kernel(k),
            graph: graph_key(k),
        });
    }
    Ok(Planned {
        names,
        streams,
        launches,
    })
}

/// What a replay did, as `penrose-replay --json` prints it.
#[derive(Clone, Debug, Serialize)]
pub struct ReplaySummary {
    /// The replaying process (its ring is `/dev/shm/penrose-standin-<pid>`).
    pub pid: u32,
    /// Kernels the replay launched, on their own or as graph nodes (a graph's kernels count
    /// once per graph launch).
    pub replayed: u64,
    /// Loops completed (the last may be partial when stopped).
    pub loops: u64,
    /// Launches per entry point symbol, as the stand-in counted them.
    pub launches: BTreeMap<&'static str, u64>,
    /// Distinct function handles the stand-in made (every path, private included).
    pub distinct_functions: u64,
    /// Calls of the driver's public name functions (`cuModuleGetFunction`,
    /// `cuLibraryGetKernel`, `cuKernelGetFunction`) in this process.
    pub name_calls: u64,
    /// Distinct kernels made through the driver's private path in this process.
    pub private_kernels: u64,
    /// Graph launches the replay made (`cuGraphLaunch`; with [`ReplayPlan::with_graphs`]).
    pub graph_launches: u64,
    /// Graphs captured: distinct (name, grid, block) sequences, each captured and instantiated
    /// once.
    pub graphs_captured: u64,
    /// Kernels launched through graph launches (each graph launch counts its kernels).
    pub graph_kernels: u64,
    /// Kernel launches the stand-in recorded as graph nodes while capturing.
    pub captured_launches: u64,
    /// The stand-in runtime's counters, for [`Via::Runtime`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub runtime: Option<RuntimeCounts>,
    /// Each handle the driver sees and its kernel name, in order of first launch (empty for
    /// [`Via::Static`], whose handles are the library's secret).
    pub functions: Vec<FunctionName>,
    /// Each trace stream and the fake `CUstream` it was replayed on.
    pub streams: Vec<StreamName>,
    /// Wall time of the launch loop, seconds.
    pub elapsed_s: f64,
    /// `replayed / elapsed_s`.
    pub launches_per_s: f64,
}

/// A function handle and the name it was resolved from.
#[derive(Clone, Debug, Serialize)]
pub struct FunctionName {
    /// The `CUfunction` value (a `CUkernel` on the runtime paths).
    pub handle: u64,
    /// The kernel name, exactly as the trace has it.
    pub name: String,
    /// The runtime paths: the stub address registered for it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stub: Option<u64>,
    /// The runtime paths: the name `__cudaRegisterFunction` was given (the trace's, or the
    /// stub's own mangled name with `self_named`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub registered_name: Option<String>,
}

/// The stand-in runtime's counters after a replay ([`RuntimeCounter`]).
#[derive(Clone, Copy, Debug, Serialize)]
pub struct RuntimeCounts {
    /// `__cudaRegisterFunction` registrations.
    pub register_function: u64,
    /// `__cudaGetKernel` calls.
    pub get_kernel: u64,
    /// Launches with a CUkernel handle.
    pub launch_by_handle: u64,
    /// Launches with a stub address (legacy).
    pub launch_by_stub: u64,
}

/// What each distinct name of the plan launches with.
enum Targets<'a> {
    /// A driver handle per name.
    Driver(Vec<FunctionHandle>),
    /// Stub i of the application per name i.
    App(&'a NvccApp, AppLaunch),
    /// The static library's kernel per name.
    Static(&'a StaticLib, Vec<u32>),
}

/// A trace stream id and its fake handle.
#[derive(Clone, Debug, Serialize)]
pub struct StreamName {
    /// The stream id in the trace.
    pub trace_stream: i64,
    /// The `CUstream` value passed to launches.
    pub handle: u64,
}

/// Initialises the driver, resolves every name, then launches the plan straight through the
/// driver (`options.via` must be [`Via::Entry`] or [`Via::Rotate`]; see [`replay_with`]).
pub fn replay(
    driver: &Driver,
    plan: &ReplayPlan,
    options: &ReplayOptions<'_>,
) -> Result<ReplaySummary, StandinError> {
    replay_with(&Libraries::driver(driver), plan, options)
}

/// Initialises the driver, resolves or registers every name as `options.via` says, then
/// launches the plan through the chosen path.
pub fn replay_with(
    libs: &Libraries<'_>,
    plan: &ReplayPlan,
    options: &ReplayOptions<'_>,
) -> Result<ReplaySummary, StandinError> {
    let driver = libs.driver;
    driver.init()?;
    // A graph replay makes one more stream, for graph launches of kernels with no stream (the
    // default stream cannot be captured).
    let stream_count = plan.streams.len() + usize::from(plan.graphs.is_some());
    let on = OnDevice::start(driver, options.devices, stream_count)?;
    let first_streams = on.streams().to_vec();
    let (targets, functions) = targets(libs, plan, options)?;
    let eager;
    let steps = match &plan.graphs {
        Some(steps) => steps,
        None => {
            eager = GraphSteps::eager(plan.launches.len());
            &eager
        }
    };
    let mut run = Run {
        driver,
        targets: &targets,
        via: options.via,
        on,
        streams: stream_count,
        switch_every: options.devices.switch_every.map(|e| e.max(1)),
        replayed: 0,
        graph_launches: 0,
        graph_kernels: 0,
    };
    let mut cache = GraphCache::default();

    let start = Instant::now();
    let loops = run.loops(plan, steps, options, &mut cache, start)?;
    let elapsed_s = start.elapsed().as_secs_f64();
    let graphs_captured = cache.captured;
    cache.destroy(driver)?;
    let done = Done {
        loops,
        elapsed_s,
        graphs_captured,
        replayed: run.replayed,
        graph_launches: run.graph_launches,
        graph_kernels: run.graph_kernels,
    };
    Ok(summary(
        libs,
        plan,
        options.via,
        done,
        functions,
        &first_streams,
    ))
}

/// What each distinct name of `plan` launches with on the path `options.via` takes, and each
/// name's handle as the driver sees it; an error names a library the path needs and `libs`
/// lacks.
fn targets<'a>(
    libs: &Libraries<'a>,
    plan: &ReplayPlan,
    options: &ReplayOptions<'_>,
) -> Result<(Targets<'a>, Vec<FunctionName>), StandinError> {
    let missing = |what| StandinError::MissingLibrary {
        via: options.via.label(),
        what,
    };
    Ok(match options.via {
        Via::Entry(_) | Via::Rotate => {
            let handles = resolve_names(libs.driver, plan, options.resolve)?;
            let functions = handles
                .iter()
                .zip(&plan.names)
                .map(|(f, n)| FunctionName {
                    handle: f.0 as u64,
                    name: n.to_string_lossy().into_owned(),
                    stub: None,
                    registered_name: None,
                })
                .collect();
            (Targets::Driver(handles), functions)
        }
        Via::Runtime(how) => {
            let runtime = libs
                .runtime
                .ok_or_else(|| missing("the stand-in runtime"))?;
            let app = libs.app.ok_or_else(|| missing("the test application"))?;
            let functions = register_stubs(runtime, app, plan, &how)?;
            let how = AppLaunch {
                legacy: how.legacy,
                per_thread_stream: how.per_thread_stream,
            };
            (Targets::App(app, how), functions)
        }
        Via::Static => {
            let lib = libs
                .static_lib
                .ok_or_else(|| missing("the static library"))?;
            let n = lib.kernel_count().max(1);
            let kernels = (0..plan.names.len()).map(|i| stub_index(i) % n).collect();
            (Targets::Static(lib, kernels), Vec::new())
        }
    })
}

/// Each of the plan's names resolved to a function handle through the driver's public name
/// functions, by `resolve`.
fn resolve_names(
    driver: &Driver,
    plan: &ReplayPlan,
    resolve: Resolve,
) -> Result<Vec<FunctionHandle>, StandinError> {
    let image = c"penrose-standin module image";
    match resolve {
        Resolve::Module => {
            let module = driver.module_load_data(image)?;
            plan.names
                .iter()
                .map(|n| driver.module_get_function(module, n))
                .collect()
        }
        Resolve::Library => {
            let library = driver.library_load_data(image)?;
            plan.names
                .iter()
                .map(|n| driver.kernel_get_function(driver.library_get_kernel(library, n)?))
                .collect()
        }
    }
}

/// What a finished replay's loop did.
struct Done {
    loops: u64,
    elapsed_s: f64,
    graphs_captured: u64,
    replayed: u64,
    graph_launches: u64,
    graph_kernels: u64,
}

/// The summary of a finished replay: `done`, with the driver's and (on the runtime path) the
/// runtime's counters, the names' handles and the streams of the first device.
fn summary(
    libs: &Libraries<'_>,
    plan: &ReplayPlan,
    via: Via,
    done: Done,
    functions: Vec<FunctionName>,
    first_streams: &[StreamHandle],
) -> ReplaySummary {
    let driver = libs.driver;
    ReplaySummary {
        pid: std::process::id(),
        replayed: done.replayed,
        loops: done.loops,
        launches: EntryPoint::ALL
            .into_iter()
            .map(|e| (e.symbol(), driver.launch_count(e)))
            .collect(),
        distinct_functions: driver.function_count(),
        name_calls: driver.name_call_count(),
        private_kernels: driver.private_kernel_count(),
        graph_launches: done.graph_launches,
        graphs_captured: done.graphs_captured,
        graph_kernels: done.graph_kernels,
        captured_launches: driver.captured_launch_count(),
        runtime: match (via, libs.runtime) {
            (Via::Runtime(_), Some(r)) => Some(RuntimeCounts {
                register_function: r.count(RuntimeCounter::RegisterFunction),
                get_kernel: r.count(RuntimeCounter::GetKernel),
                launch_by_handle: r.count(RuntimeCounter::LaunchByHandle),
                launch_by_stub: r.count(RuntimeCounter::LaunchByStub),
            }),
            _ => None,
        },
        functions,
        streams: plan
            .streams
            .iter()
            .zip(first_streams)
            .map(|(s, h)| StreamName {
                trace_stream: s.0,
                handle: h.0 as u64,
            })
            .collect(),
        elapsed_s: done.elapsed_s,
        launches_per_s: if done.elapsed_s > 0.0 {
            done.replayed as f64 / done.elapsed_s
        } else {
            0.0
        },
    }
}

/// A replay in progress: the path launches take, the device it is on, and what it has done.
struct Run<'r, 'a> {
    driver: &'a Driver,
    targets: &'r Targets<'a>,
    via: Via,
    on: OnDevice,
    /// Streams made per device (the plan's, plus the graph stream in a graph replay).
    streams: usize,
    switch_every: Option<u64>,
    replayed: u64,
    graph_launches: u64,
    graph_kernels: u64,
}

impl Run<'_, '_> {
    /// The handle on the current device of trace stream index `stream` (none: the default
    /// stream).
    fn stream_of(&self, stream: Option<usize>) -> StreamHandle {
        stream
            .and_then(|s| self.on.streams().get(s).copied())
            .unwrap_or(StreamHandle(0))
    }

    /// Moves to the next device once `switch_every` more kernels have been launched (checked
    /// between steps: a graph is never split across devices).
    fn switch_device_if_due(&mut self) -> Result<(), StandinError> {
        if let Some(every) = self.switch_every
            && self.replayed > 0
            && self.replayed / every > self.on.switches
        {
            self.on.switches = self.replayed / every;
            self.on.next(self.driver, self.streams)?;
        }
        Ok(())
    }

    /// Replays `steps` of `plan` as `options` say (paced from `start`, until the loop count
    /// or the stop flag); returns how many loops ran to their end.
    fn loops(
        &mut self,
        plan: &ReplayPlan,
        steps: &GraphSteps,
        options: &ReplayOptions<'_>,
        cache: &mut GraphCache,
        start: Instant,
    ) -> Result<u64, StandinError> {
        let stopped = || options.stop.is_some_and(|s| s.load(Ordering::Relaxed));
        let mut loops = 0u64;
        'outer: loop {
            if let Loops::Count(n) = options.loops
                && loops >= n
            {
                break;
            }
            let loop_offset_us = loops as f64 * plan.period_us;
            for step in &steps.steps {
                if stopped() {
                    break 'outer;
                }
                let first = match *step {
                    Step::Kernel(i) => i,
                    // A graph launch is paced by its first kernel (it has at least one).
                    Step::Graph(g) => steps.graphs[g].launches.first().copied().unwrap_or(0),
                };
                if let Pace::Trace { speed } = options.pace {
                    wait_until(
                        start,
                        (loop_offset_us + plan.launches[first].offset_us) / speed,
                    );
                }
                self.switch_device_if_due()?;
                match *step {
                    Step::Kernel(i) => {
                        let l = &plan.launches[i];
                        self.launch(l, self.stream_of(l.stream))?;
                    }
                    Step::Graph(g) => self.graph(plan, cache, &steps.graphs[g])?,
                }
            }
            loops += 1;
            if stopped() {
                break;
            }
        }
        Ok(loops)
    }

    /// Launches one planned kernel on `stream` with its counters.
    fn launch(&mut self, l: &PlannedLaunch, stream: StreamHandle) -> Result<(), StandinError> {
        // The thread's next driver launch takes these, whichever library makes it.
        self.driver.set_next_counters(&l.counters);
        let launch = Launch {
            grid: l.grid,
            block: l.block,
            shared_mem_bytes: l.shared_mem_bytes,
            stream,
        };
        match self.targets {
            Targets::Driver(handles) => {
                let entry = match self.via {
                    Via::Rotate => {
                        KERNEL_LAUNCHES[(self.replayed % KERNEL_LAUNCHES.len() as u64) as usize]
                    }
                    Via::Entry(e) => e,
                    Via::Runtime(_) | Via::Static => EntryPoint::LaunchKernel,
                };
                self.driver.launch(entry, handles[l.name], &launch)?;
            }
            Targets::App(app, how) => app.launch(stub_index(l.name), &launch, *how)?,
            Targets::Static(lib, kernels) => lib.launch(kernels[l.name], &launch)?,
        }
        self.replayed += 1;
        Ok(())
    }

    /// One trace graph launch: its shape's exec (captured now if this is the shape's first
    /// launch), launched with `cuGraphLaunch` on the stream of its first kernel.
    fn graph(
        &mut self,
        plan: &ReplayPlan,
        cache: &mut GraphCache,
        graph: &GraphLaunch,
    ) -> Result<(), StandinError> {
        let first = graph.launches.first().map(|&i| &plan.launches[i]);
        let stream = self.stream_of(first.and_then(|l| l.stream).or(Some(plan.streams.len())));
        let exec = match cache.get(graph.shape) {
            Some(exec) => {
                self.replayed += graph.launches.len() as u64;
                exec
            }
            None => {
                let driver = self.driver;
                cache.capture(driver, graph.shape, stream, || {
                    graph
                        .launches
                        .iter()
                        .try_for_each(|&i| self.launch(&plan.launches[i], stream))
                })?
            }
        };
        self.driver.graph_launch(exec, stream)?;
        self.graph_launches += 1;
        self.graph_kernels += graph.launches.len() as u64;
        Ok(())
    }
}

/// The application stub that stands for the plan's name `i`.
fn stub_index(i: usize) -> u32 {
    u32::try_from(i).unwrap_or(u32::MAX)
}

/// Registers stub i of the application under the plan's name i (or the stub's own mangled
/// name), as nvcc's registration callback does at load: one fat binary, one
/// `__cudaRegisterFunction` per kernel. Returns each name's handle as the driver will see it.
fn register_stubs(
    runtime: &Runtime,
    app: &NvccApp,
    plan: &ReplayPlan,
    how: &RuntimeVia,
) -> Result<Vec<FunctionName>, StandinError> {
    let stubs = app.stub_count();
    if plan.names.len() > stubs as usize {
        return Err(StandinError::TooManyKernels {
            names: plan.names.len(),
            stubs,
        });
    }
    let registered_names = plan
        .names
        .iter()
        .enumerate()
        .map(|(i, name)| match app.kernel_name(stub_index(i)) {
            Some(own) if how.self_named => Ok(own),
            Some(_) => Ok(name.clone()),
            None => Err(StandinError::TooManyKernels {
                names: plan.names.len(),
                stubs,
            }),
        })
        .collect::<Result<Vec<CString>, _>>()?;
    let untouched = how
        .names_untouched
        .then(|| UntouchedNames::map(&registered_names))
        .transpose()?;
    let fat_binary = runtime.register_fat_binary()?;
    let mut registered = Vec::with_capacity(plan.names.len());
    for (i, registered_name) in registered_names.into_iter().enumerate() {
        let Some(stub) = app.stub(stub_index(i)) else {
            return Err(StandinError::TooManyKernels {
                names: plan.names.len(),
                stubs,
            });
        };
        match &untouched {
            Some(names) => runtime.register_function_untouched(fat_binary, stub, names, i)?,
            None => runtime.register_function(fat_binary, stub, &registered_name)?,
        }
        registered.push((stub, registered_name));
    }
    runtime.register_fat_binary_end(fat_binary);
    registered
        .into_iter()
        .zip(&plan.names)
        .map(
            |((stub, registered_name), name): ((StubAddress, CString), _)| {
                Ok(FunctionName {
                    handle: runtime.lookup(stub)?.0 as u64,
                    name: name.to_string_lossy().into_owned(),
                    stub: Some(stub.0 as u64),
                    registered_name: Some(registered_name.to_string_lossy().into_owned()),
                })
            },
        )
        .collect()
}

/// Sleeps until `offset_us` after `start`; returns at once when already late (a late replay
/// catches up rather than skipping launches).
fn wait_until(start: Instant, offset_us: f64) {
    let target = start + Duration::from_secs_f64(offset_us.max(0.0) / 1e6);
    let now = Instant::now();
    if target > now {
        std::thread::sleep(target - now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn kernel(name: &str, pid: i64, ts: f64, stream: i64) -> Kernel {
        Kernel {
            name: Arc::from(name),
            ts_us: ts,
            dur_us: 2.5,
            launch_ts_us: Some(ts - 1.0),
            graph_launch: false,
            process: ProcessId(pid),
            stream: Some(StreamId(stream)),
            device: None,
            correlation: None,
            grid: Some([0, 2, 1]),
            block: None,
            registers_per_thread: Some(40),
            shared_memory_bytes: None,
            est_achieved_occupancy_pct: Some(12.5),
            blocks_per_sm: None,
        }
    }

    fn trace() -> Trace {
        Trace::new(
            "t.json".into(),
            vec![
                kernel("a", 1, 10.0, 7),
                kernel("b", 1, 20.0, 8),
                kernel("a", 1, 30.0, 7),
                kernel("c", 2, 15.0, 7),
            ],
        )
    }

    #[test]
    fn largest_process_is_planned_in_launch_order() {
        let plan = ReplayPlan::from_trace(&trace(), ProcessSelection::Largest).unwrap();
        assert_eq!(plan.len(), 3);
        assert_eq!(plan.processes(), &[ProcessId(1)]);
        assert_eq!(plan.names(), &[c"a".to_owned(), c"b".to_owned()]);
        assert_eq!(plan.streams(), &[StreamId(7), StreamId(8)]);
        assert_eq!(plan.launches[0].grid, [1, 2, 1], "0 dims become 1");
        assert_eq!(plan.launches[0].block, [1, 1, 1]);
        assert_eq!(plan.launches[2].offset_us, 20.0);
        assert_eq!(plan.period(), Duration::from_secs_f64(22.5e-6));
        assert_eq!(plan.launches[1].counters.duration_ns, 2500);
    }

    #[test]
    fn all_merges_processes_and_a_missing_pid_is_an_error() {
        let plan = ReplayPlan::from_trace(&trace(), ProcessSelection::All).unwrap();
        assert_eq!(plan.len(), 4);
        assert_eq!(plan.names().len(), 3);
        assert_eq!(plan.launches[1].name, 1, "c (launched at 14) comes second");
        let err = ReplayPlan::from_trace(&trace(), ProcessSelection::Pid(9)).unwrap_err();
        assert!(err.to_string().contains("no process 9"), "{err}");
        assert_eq!("all".parse(), Ok(ProcessSelection::All));
        assert_eq!("42".parse(), Ok(ProcessSelection::Pid(42)));
        assert!("x".parse::<ProcessSelection>().is_err());
    }
}
