//! Live capture of kernel launches through eBPF uprobes on libcuda (docs/design.md section 3).
//!
//! - [`locate`]: which libcuda files exist (ldconfig, configuration, running processes).
//! - [`loader`]: the committed eBPF object loaded, probes attached and detached.
//! - [`events`]: ring-buffer records decoded; per-process handle names.
//! - [`devices`]: which of the host's GPUs a launch runs on (contexts, streams, ordinals).
//! - [`graphs`]: which kernels each CUDA graph runs (stream capture, kernel nodes,
//!   instantiation, updates), so a graph launch enters a snippet as its kernels.
//! - [`identity`]: a stable identity (build id, call site, launch configuration) for launches
//!   that no name reaches.
//! - [`launch_log`]: every recorded launch in order, when asked for (comparing with a
//!   profiler).
//! - [`procmaps`]: `/proc/<pid>/maps` lines parsed once for those that read them.
//! - [`mapped_file`]: opening a mapped file of another user's process as that mapping's own
//!   file (never what its path names now), and refusing ELF tables too large to read.
//! - [`late`]: names of kernels registered before the agent attached, from the processes'
//!   ELF symbols and memory.
//! - [`window`]: capture windows, snippets and their sampled launches; launches with neither a
//!   name nor an identity fingerprinted by launch shapes.
//! - [`schedule`]: when windows open (fixed, or spaced by the overhead budget).
//! - [`calibrate`]: the start-up measurement of what a probed launch costs.
//! - [`cpu`]: the probed processes' CPU time, which the budget is a share of.
//! - [`error`]: why a capture cannot run.
//!
//! [`Capture`] ties them together: it owns the probes and the ring buffer, opens and closes
//! windows, sets the BPF sampling countdown, reads the counters of sampled launches and turns
//! records into snippets.

pub mod calibrate;
pub mod cpu;
pub mod devices;
pub mod error;
pub mod events;
pub mod graphs;
pub mod identity;
pub mod late;
pub mod launch_log;
pub mod loader;
pub mod locate;
pub mod mapped_file;
pub mod memory;
pub mod procmaps;
pub mod schedule;
pub mod window;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use aya::maps::{Array, MapData, PerCpuArray, RingBuf};
use penrose_core::counters::CounterGroup;
use penrose_core::sampling::{
    Countdown, DEFAULT_REOFFSET_INTERVAL, DEFAULT_SAMPLE_PERIOD, SamplePeriod,
};
use penrose_ebpf_common::HandleKind;
use rand::{SeedableRng, rngs::StdRng};

use crate::counters::{self, CounterSource, MissingReason, Reading, SourceKind};
pub use calibrate::ProbeCost;
pub use error::CaptureError;
use events::{Event, NameBudget, NameText, Pid, ProcessNames};
use loader::Probes;
use locate::{LibraryFile, LibrarySources};
use schedule::{Schedule, WindowCost};
use window::{Snippet, Window};

/// How often [`Capture::run_observed`] calls its observer between windows, at the most.
pub const OBSERVE_EVERY: Duration = Duration::from_secs(1);

/// Most records one [`Capture::drain`] reads: a full ring buffer (1 MiB of 80-byte records
/// holds about 13,000) and then some.
pub const MAX_DRAIN: u64 = 65_536;

/// How a capture runs.
#[derive(Clone, Debug)]
pub struct CaptureConfig {
    /// Where to look for libcuda, and whether libraries root does not control are probed.
    pub sources: LibrarySources,
    /// Most distinct library files probed; further ones are counted
    /// ([`Counts::libraries_over_cap`]), not probed.
    pub max_libraries: usize,
    /// L: launches per process per window.
    pub window_launches: usize,
    /// How long the reader sleeps when the ring is empty. Records are submitted without a
    /// wake-up (a wake-up per launch would cost more than the probe), so this bounds the
    /// latency and, with the ring's size, the launch rate the agent keeps up with.
    pub poll_interval: Duration,
    /// S: one launch in S is sampled (per CPU, counted in BPF).
    pub sample_period: SamplePeriod,
    /// How long each counter group stays active before the next one's turn.
    pub group_period: Duration,
    /// Where counter values come from. The capture does not start when this source cannot be
    /// opened.
    pub counters: SourceKind,
    /// Measure the probe cost at start (otherwise [`ProbeCost::ASSUMED`] is used).
    pub calibrate: bool,
    /// Seed of the sampling offsets; `None` draws one from the OS.
    pub seed: Option<u64>,
}

impl Default for CaptureConfig {
    fn default() -> Self {
        Self {
            sources: LibrarySources::default(),
            max_libraries: locate::DEFAULT_MAX_LIBRARIES,
            window_launches: window::DEFAULT_WINDOW_LAUNCHES,
            poll_interval: Duration::from_millis(1),
            sample_period: DEFAULT_SAMPLE_PERIOD,
            group_period: DEFAULT_REOFFSET_INTERVAL,
            counters: SourceKind::Nvml,
            calibrate: true,
            seed: None,
        }
    }
}

/// One window as it happened, for `status`, logs and the overhead figures.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct WindowRecord {
    /// Its index.
    pub index: u64,
    /// What it cost and what the probed processes used.
    pub cost: WindowCost,
    /// Probe time: its launches times the calibrated cost.
    pub probe_time: Duration,
    /// The gap the schedule chose after it.
    pub gap: Duration,
    /// It closed early because every process had reached L.
    pub closed_early: bool,
}

/// What the reader has seen so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Counts {
    /// Records read from the ring.
    pub events: u64,
    /// Launch records.
    pub launches: u64,
    /// Launch records that arrived with no window open (none are expected).
    pub launches_outside_window: u64,
    /// Name and kernel-function records.
    pub names: u64,
    /// Names the probe could not read (their page not yet in memory) that were read from the
    /// process instead.
    #[serde(default)]
    pub names_read_from_process: u64,
    /// Names neither the probe nor the agent could read (the process gone, the address
    /// unmapped): their launches stay unnamed.
    #[serde(default)]
    pub names_unreadable: u64,
    /// `cudaLaunchKernel` records (the runtime's launch probe, attached while launches stay
    /// unnamed).
    pub runtime_launches: u64,
    /// Launches inside windows whose handle had no name.
    pub unnamed_launches: u64,
    /// Of those, launches given an identity from their call site ([`identity`]).
    pub identified_launches: u64,
    /// Of those, launches with no identity either, recorded with a launch shape (launch
    /// configuration and repetition gap, see [`window`]); unnamed launches past L are not
    /// recorded and get none.
    pub shape_launches: u64,
    /// Function handles the per-snippet repetition trackers forgot to stay within
    /// [`window::MAX_SHAPE_HANDLES`] (counted when the snippet ends).
    pub shape_evictions: u64,
    /// Exit records of any process.
    pub exits: u64,
    /// Records that did not decode.
    pub malformed: u64,
    /// Windows opened.
    pub windows: u64,
    /// Launches the BPF countdown marked as sampled, inside windows and below L.
    pub sampled: u64,
    /// Sampled launches that got counter values.
    pub samples_with_values: u64,
    /// Sampled launches without values, by reason.
    pub samples_missing: MissingCounts,
    /// Library files not probed because root does not control them (each counted once;
    /// `capture.allow_untrusted_libs` probes them).
    pub libraries_untrusted: u64,
    /// Library files not probed because `max_libraries` were probed already (each counted
    /// once).
    pub libraries_over_cap: u64,
    /// Context records and how sampled launches were attributed to GPUs.
    #[serde(default)]
    pub devices: devices::DeviceCounts,
    /// Graph records, captures, and how graph launches entered snippets.
    #[serde(default)]
    pub graphs: graphs::GraphCounts,
}

/// Sampled launches without counter values, by [`MissingReason`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct MissingCounts {
    /// The source cannot read the active group.
    pub group_not_supported: u64,
    /// The process has no counter source.
    pub no_source: u64,
    /// The launch's record was not found.
    pub not_found: u64,
    /// An interval source's first reading.
    pub warmup: u64,
    /// The device returned an error.
    pub device_error: u64,
    /// The launch was not attributed to one of the host's GPUs.
    #[serde(default)]
    pub device_unknown: u64,
    /// Another tool held the GPU's counters.
    #[serde(default)]
    pub counters_busy: u64,
    /// The device's previous reading was younger than the source's minimum interval.
    #[serde(default)]
    pub too_soon: u64,
}

impl MissingCounts {
    fn count(&mut self, reason: MissingReason) {
        match reason {
            MissingReason::GroupNotSupported => self.group_not_supported += 1,
            MissingReason::NoSource => self.no_source += 1,
            MissingReason::NotFound => self.not_found += 1,
            MissingReason::Warmup => self.warmup += 1,
            MissingReason::DeviceError => self.device_error += 1,
            MissingReason::DeviceUnknown => self.device_unknown += 1,
            MissingReason::CountersBusy => self.counters_busy += 1,
            MissingReason::TooSoon => self.too_soon += 1,
        }
    }
}

/// Each architecture of `archs` once, in order.
pub fn distinct_archs(
    archs: impl IntoIterator<Item = penrose_core::gpu::GpuArch>,
) -> Vec<penrose_core::gpu::GpuArch> {
    let mut archs: Vec<_> = archs.into_iter().collect();
    archs.sort();
    archs.dedup();
    archs
}

/// A running capture.
pub struct Capture {
    config: CaptureConfig,
    probes: Probes,
    ring: RingBuf<MapData>,
    drops: PerCpuArray<MapData, u64>,
    sample_period_map: Array<MapData, u64>,
    countdown: PerCpuArray<MapData, u64>,
    rng: StdRng,
    counters: Box<dyn CounterSource>,
    groups: Vec<CounterGroup>,
    started: Instant,
    cost: ProbeCost,
    names: HashMap<Pid, ProcessNames>,
    /// The bytes all processes' name tables hold together (`MAX_NAME_BYTES_PER_HOST`).
    name_budget: NameBudget,
    devices: devices::Devices,
    graphs: graphs::Graphs,
    /// The BPF side's kernel count per executable graph ([`graphs::KernelCount`]).
    graph_kernels: aya::maps::HashMap<MapData, [u64; 2], u32>,
    /// When the launch probes were last attached (CLOCK_MONOTONIC ns, the clock of the
    /// records); `None` while they are not: captures that began before miss launches.
    launch_probes_since: Option<u64>,
    /// Ring drops already accounted for in the graph state.
    drops_seen: u64,
    late: late::LateNamer,
    identities: identity::Identities,
    /// Processes whose pre-attach registrations were read (once each).
    late_named: std::collections::HashSet<Pid>,
    /// Processes with unnamed launches in the open window.
    window_unnamed_pids: std::collections::HashSet<Pid>,
    window: Option<Window>,
    window_opened: Instant,
    window_launches: u64,
    /// Probe hits of the runtime's launch probe in the open window: traps the budget pays.
    window_runtime_launches: u64,
    /// Launches of the open window that had no name.
    window_unnamed: u64,
    /// Whether the next window attaches the runtime's launch probe (the legacy path needs it
    /// to name launches; it doubles their traps): while the last window left launches
    /// unnamed, or stubs were registered since it (a new process or module).
    naming_needed: bool,
    cpu: cpu::CpuTracker,
    history: Vec<WindowRecord>,
    finished: Vec<Snippet>,
    counts: Counts,
    beyond_limit: u64,
    own_pid: Pid,
    launch_log: launch_log::LaunchLog,
    /// Library files refused so far (untrusted, or over the cap), so each is counted and
    /// logged once; at most [`MAX_REFUSED_REMEMBERED`].
    refused: std::collections::HashSet<locate::FileId>,
    /// Whether the set of refused files filled up (said once).
    refused_full: bool,
}

/// Refused library files remembered (each is counted and logged once); beyond this many,
/// further refusals are neither counted nor logged (said once).
const MAX_REFUSED_REMEMBERED: usize = 4096;

impl Capture {
    /// Loads the probes, attaches the name probes to every libcuda found and the exit
    /// tracepoint. Finding no library is not an error: [`Capture::rescan`] looks again.
    pub fn start(config: CaptureConfig) -> Result<Self, CaptureError> {
        let mut probes = Probes::load()?;
        let (ring, drops) = probes.take_maps()?;
        let (sample_period_map, countdown) = probes.take_sampling_maps()?;
        let graph_kernels = probes.take_graph_map()?;
        let counters = counters::open(config.counters).map_err(|e| CaptureError::Counters {
            counters: config.counters.name(),
            reason: e.to_string(),
        })?;
        let groups = counters.groups();
        let rng = match config.seed {
            Some(seed) => StdRng::seed_from_u64(seed),
            None => StdRng::from_os_rng(),
        };
        let now = Instant::now();
        let mut capture = Self {
            probes,
            ring,
            drops,
            sample_period_map,
            countdown,
            rng,
            counters,
            groups,
            started: now,
            cost: ProbeCost::ASSUMED,
            names: HashMap::new(),
            name_budget: NameBudget::default(),
            devices: devices::Devices::default(),
            graphs: graphs::Graphs::default(),
            graph_kernels,
            launch_probes_since: None,
            drops_seen: 0,
            late: late::LateNamer::default(),
            identities: identity::Identities::default(),
            late_named: std::collections::HashSet::new(),
            window_unnamed_pids: std::collections::HashSet::new(),
            window: None,
            window_opened: now,
            window_launches: 0,
            window_runtime_launches: 0,
            window_unnamed: 0,
            naming_needed: true,
            cpu: cpu::CpuTracker::default(),
            history: Vec::new(),
            finished: Vec::new(),
            counts: Counts::default(),
            beyond_limit: 0,
            own_pid: Pid(std::process::id()),
            launch_log: launch_log::LaunchLog::default(),
            refused: std::collections::HashSet::new(),
            refused_full: false,
            config,
        };
        capture
            .sample_period_map
            .set(0, u64::from(capture.config.sample_period.get()), 0)
            .map_err(CaptureError::Map)?;
        if capture.config.calibrate {
            capture.cost = capture.calibrate()?;
        }
        capture.log_settings();
        capture.rescan()?;
        if capture.libraries().is_empty() {
            tracing::warn!("no libcuda found yet; looking again at each window");
        }
        Ok(capture)
    }

    /// Says at start how the capture runs.
    fn log_settings(&self) {
        tracing::info!(
            "capture: L = {}, 1 in each block of {} launches sampled (each block's position drawn afresh, a block started at every window), counters from {} (groups {:?}), probe cost {:?} per launch{}",
            self.config.window_launches,
            self.config.sample_period.get(),
            self.counters.name(),
            self.groups.iter().map(|g| g.0).collect::<Vec<_>>(),
            self.cost.per_launch,
            if self.config.calibrate {
                " (measured)"
            } else {
                " (assumed)"
            },
        );
    }

    /// Looks for libcuda files again (new containers) and probes the new ones that root
    /// controls (unless `allow_untrusted`), up to `max_libraries`; the others are counted once
    /// each ([`Counts::libraries_untrusted`], [`Counts::libraries_over_cap`]) and logged.
    pub fn rescan(&mut self) -> Result<usize, CaptureError> {
        let mut added = 0;
        let located = locate::locate(&self.config.sources);
        for untrusted in located.untrusted {
            if self.refuse(untrusted.id) {
                self.counts.libraries_untrusted += 1;
                let message = format!(
                    "not probing {} ({:?}): {} (capture.allow_untrusted_libs = true would)",
                    untrusted.path.display(),
                    untrusted.origin,
                    untrusted.reason
                );
                if untrusted.origin == locate::Origin::Explicit {
                    tracing::warn!("{message}");
                } else {
                    tracing::info!("{message}");
                }
            }
        }
        for library in located.files {
            if self.probes.libraries().iter().any(|l| l.id == library.id) {
                continue;
            }
            if self.probes.libraries().len() >= self.config.max_libraries {
                if self.refuse(library.id) {
                    self.counts.libraries_over_cap += 1;
                    tracing::warn!(
                        "not probing {}: {} libraries are probed already (capture.max_libraries)",
                        library.path.display(),
                        self.config.max_libraries
                    );
                }
                continue;
            }
            self.probes.add_library(library)?;
            added += 1;
        }
        // Processes that were running before the name probes attached: read what they had
        // registered from their symbols and memory.
        for pid in late::cuda_processes() {
            self.name_late(pid);
        }
        Ok(added)
    }

    /// Remembers a refused library file: true the first time (count and log it then).
    fn refuse(&mut self, id: locate::FileId) -> bool {
        if self.refused.contains(&id) {
            return false;
        }
        if self.refused.len() >= MAX_REFUSED_REMEMBERED {
            if !self.refused_full {
                self.refused_full = true;
                tracing::warn!(
                    "{MAX_REFUSED_REMEMBERED} library files refused; further ones are not counted"
                );
            }
            return false;
        }
        self.refused.insert(id)
    }

    /// Reads a process's pre-attach registrations once (see [`late`]).
    fn name_late(&mut self, pid: Pid) {
        if pid == self.own_pid || !self.late_named.insert(pid) {
            return;
        }
        let names = self
            .names
            .entry(pid)
            .or_insert_with(|| ProcessNames::sharing(&self.name_budget));
        let found = self.late.name_process(pid, names);
        if found.handles_named + found.stubs_named > 0 {
            tracing::info!(
                "pid {}: {} kernel handles and {} stubs named from {} objects' symbols",
                pid.0,
                found.handles_named,
                found.stubs_named,
                found.objects
            );
        }
    }

    /// What reading pre-attach registrations found, over all processes.
    pub fn late_counts(&self) -> late::LateCounts {
        self.late.counts()
    }

    /// The libraries being probed.
    pub fn libraries(&self) -> &[LibraryFile] {
        self.probes.libraries()
    }

    /// Whether a window is open.
    pub fn window_open(&self) -> bool {
        self.window.is_some()
    }

    /// Measures the probe cost on this machine (see [`calibrate`]), discarding the
    /// calibration's own records.
    fn calibrate(&mut self) -> Result<ProbeCost, CaptureError> {
        let ring = &mut self.ring;
        let cost = calibrate::calibrate(&mut self.probes, || while ring.next().is_some() {})?;
        tracing::info!(
            "calibration: a probed call costs {:?} more than an unprobed one ({:?} vs {:?}); BPF program {:?}",
            cost.per_launch,
            cost.probed_call,
            cost.unprobed_call,
            cost.bpf_run
        );
        Ok(cost)
    }

    /// The probe cost the scheduler uses.
    pub fn probe_cost(&self) -> ProbeCost {
        self.cost
    }

    /// Seeds each CPU's sampling countdown at a window's opening: a block of S starts at the
    /// window's first launch on every CPU, its sample at a position of its own
    /// (`penrose_core::sampling`), so which launch is sampled cannot be predicted and a window
    /// of u launches on a CPU holds a sample with probability min(1, u / S).
    fn seed_countdowns(&mut self) -> Result<(), CaptureError> {
        let period = self.config.sample_period;
        let cpus = aya::util::nr_cpus()
            .map_err(|(what, e)| CaptureError::Sampling(format!("{what}: {e}")))?;
        let words: Vec<u64> = (0..cpus)
            .map(|_| Countdown::block_start(period, &mut self.rng).to_probe_word())
            .collect();
        let values = aya::maps::PerCpuValues::try_from(words)
            .map_err(|e| CaptureError::Sampling(e.to_string()))?;
        self.countdown
            .set(0, values, 0)
            .map_err(CaptureError::Map)?;
        Ok(())
    }

    /// The counter group active now; groups take turns of `group_period`.
    pub fn active_group(&self) -> Option<CounterGroup> {
        if self.groups.is_empty() {
            return None;
        }
        let period = self.config.group_period.as_nanos().max(1);
        let turn = self.started.elapsed().as_nanos() / period;
        let index = usize::try_from(turn % self.groups.len() as u128).unwrap_or(0);
        self.groups.get(index).copied()
    }

    /// Opens a window: launch probes attached.
    pub fn open_window(&mut self) -> Result<(), CaptureError> {
        if self.window.is_some() {
            return Ok(());
        }
        self.drain();
        self.seed_countdowns()?;
        self.window = Some(Window::new(
            self.counts.windows,
            self.config.window_launches,
        ));
        self.window_opened = Instant::now();
        self.window_launches = 0;
        self.window_runtime_launches = 0;
        self.window_unnamed = 0;
        self.cpu.clear();
        self.counts.windows += 1;
        let started = Instant::now();
        let since = monotonic_ns();
        let attached = self.probes.attach_launch(self.naming_needed)?;
        self.launch_probes_since = Some(since);
        tracing::debug!(
            "window opened: {attached} launch probes in {:?}",
            started.elapsed()
        );
        Ok(())
    }

    /// Closes the window: launch probes detached, the ring drained of what they wrote, every
    /// open snippet ended. Returns what it cost (`None` when no window was open).
    pub fn close_window(&mut self) -> Result<Option<WindowCost>, CaptureError> {
        if self.window.is_none() {
            return Ok(None);
        }
        let started = Instant::now();
        let detaching = self.probes.detach_launch()?;
        // Keep draining: launches trap until the kernel has unregistered every probe.
        while !detaching.is_done() {
            if self.drain() == 0 {
                std::thread::sleep(self.config.poll_interval);
            }
        }
        detaching.wait();
        tracing::debug!(
            "window closed: launch probes detached in {:?}",
            started.elapsed()
        );
        self.drain();
        self.launch_probes_since = None;
        self.graphs.probes_detached();
        let cost = WindowCost {
            open_for: self.window_opened.elapsed(),
            // Every probe hit is a trap the budget pays for, the runtime's included.
            launches: self.window_launches + self.window_runtime_launches,
            process_cpu: self.cpu.total(),
        };
        self.naming_needed = self.window_unnamed > 0;
        for names in self.names.values_mut() {
            names.forget_runtime_launches();
        }
        // A process that launched unnamed kernels and was not read yet (it started after the
        // last rescan) is read now, for the next windows.
        for pid in std::mem::take(&mut self.window_unnamed_pids) {
            self.name_late(pid);
        }
        if let Some(window) = self.window.take() {
            self.beyond_limit += window.beyond_limit();
            let (snippets, shape_evictions) = window.close();
            self.counts.shape_evictions += shape_evictions;
            self.finished.extend(snippets);
        }
        Ok(Some(cost))
    }

    /// Reads the records now in the ring; returns how many.
    ///
    /// At most [`MAX_DRAIN`] records are read per call, so that probed processes launching
    /// faster than the agent reads cannot keep it inside one call: the loops around it check
    /// the stop flag and the window's deadline between calls.
    pub fn drain(&mut self) -> u64 {
        let mut read = 0u64;
        while read < MAX_DRAIN {
            let event = match self.ring.next() {
                Some(item) => events::decode(&item),
                None => break,
            };
            read += 1;
            match event {
                Some(event) => self.handle(event),
                None => self.counts.malformed += 1,
            }
        }
        self.counts.events += read;
        if read > 0 {
            self.check_drops();
        }
        if let Some(window) = &mut self.window {
            self.finished.extend(window.take_finished());
        }
        read
    }

    fn on_name(&mut self, pid: Pid, kind: HandleKind, handle: u64, name: NameText) {
        self.counts.names += 1;
        let (name, truncated) = match name {
            NameText::Read { name, truncated } => (name, truncated),
            NameText::Unread { address } => match memory::read_c_string(pid, address) {
                Some(read) => {
                    self.counts.names_read_from_process += 1;
                    read
                }
                None => {
                    // The process is gone or the address unmapped: its launches stay
                    // unnamed (an identity or a shape), never a wrong name.
                    self.counts.names_unreadable += 1;
                    return;
                }
            },
        };
        if kind == HandleKind::Stub {
            // Registered kernels may launch on the legacy path, which only the runtime's
            // naming probe names: attach it now if a window is open, else at the next one.
            if self.window.is_some() {
                if let Err(e) = self.probes.attach_naming() {
                    tracing::warn!("attaching the runtime's naming probes: {e}");
                }
            } else {
                self.naming_needed = true;
            }
        }
        if truncated {
            tracing::debug!("pid {}: kernel name cut at {} bytes", pid.0, name.len());
        }
        self.names
            .entry(pid)
            .or_insert_with(|| ProcessNames::sharing(&self.name_budget))
            .learn(kind, handle, &name);
    }

    fn handle(&mut self, event: Event) {
        match event {
            Event::Launch(launch) => self.on_launch(launch),
            Event::Graph(change) => self.on_graph(&change),
            Event::Name {
                pid,
                kind,
                handle,
                name,
            } => self.on_name(pid, kind, handle, name),
            Event::KernelFunction {
                pid,
                kernel,
                function,
            } => {
                self.counts.names += 1;
                let names = self
                    .names
                    .entry(pid)
                    .or_insert_with(|| ProcessNames::sharing(&self.name_budget));
                if !names.link(kernel, function) {
                    // Its launches stay unnamed (an identity or a launch shape), not a
                    // placeholder name that every such kernel would share.
                    tracing::debug!("pid {}: kernel {kernel:#x} has no name", pid.0);
                }
            }
            Event::StubKernel { pid, stub, kernel } => {
                self.counts.names += 1;
                let names = self
                    .names
                    .entry(pid)
                    .or_insert_with(|| ProcessNames::sharing(&self.name_budget));
                if !names.link_stub(stub, kernel) {
                    tracing::debug!("pid {}: stub {stub:#x} was registered unseen", pid.0);
                }
            }
            Event::RuntimeLaunch { pid, tid, function } => {
                self.counts.runtime_launches += 1;
                if self.window.is_some() {
                    self.window_runtime_launches += 1;
                }
                self.names
                    .entry(pid)
                    .or_insert_with(|| ProcessNames::sharing(&self.name_budget))
                    .runtime_launch(tid, function);
            }
            Event::Context(change) => self.devices.apply(change),
            Event::Exit { pid } => {
                self.counts.exits += 1;
                for exec in self.graphs.exited(pid) {
                    self.set_kernel_count(graphs::KernelCount::Remove { pid, exec });
                }
                self.names.remove(&pid);
                self.devices.exited(pid);
                self.late_named.remove(&pid);
                self.identities.exited(pid);
                self.cpu.exited(pid);
                self.counters.forget(pid);
                if let Some(window) = &mut self.window {
                    window.exit(pid);
                }
            }
        }
    }

    /// A launch record: recorded into a capture when its stream is capturing, expanded into
    /// its kernels when it is a launch of a graph the agent saw built, else recorded as is.
    fn on_launch(&mut self, launch: events::Launch) {
        if launch.pid == self.own_pid {
            // The calibration's own calls.
            return;
        }
        self.counts.launches += 1;
        if self.window.is_none() {
            self.counts.launches_outside_window += 1;
            return;
        }
        self.window_launches += 1;
        if self.cpu.watch(launch.pid) {
            self.counters.watch(launch.pid);
        }
        if !launch.entry.is_graph() && self.graphs.capturing(launch.pid, launch.stream) {
            self.graphs.captured(&launch);
            return;
        }
        if !launch.entry.is_graph() {
            self.record_launch(&launch);
            return;
        }
        match self.graphs.expansion(launch.pid, launch.function) {
            graphs::Expansion::Kernels(nodes) => {
                for (index, node) in nodes.iter().enumerate() {
                    if self
                        .window
                        .as_ref()
                        .is_some_and(|w| w.is_at_limit(launch.pid))
                    {
                        break;
                    }
                    self.record_launch(&launch.graph_kernel(index, node));
                }
            }
            graphs::Expansion::Opaque(why) => {
                tracing::trace!("pid {}: graph launch stays opaque ({why:?})", launch.pid.0);
                self.record_launch(&launch);
            }
        }
    }

    /// Adds one kernel (or opaque graph) launch to its window: its name, identity or shape,
    /// and its counter values when sampled.
    fn record_launch(&mut self, launch: &events::Launch) {
        let at_limit = self
            .window
            .as_ref()
            .is_some_and(|w| w.is_at_limit(launch.pid));
        let sample = if launch.sampled && !at_limit {
            self.read_sample(launch)
        } else {
            None
        };
        let name = self.name_of(launch);
        let identity = match name {
            Some(_) => None,
            None if launch.is_opaque_graph() => None,
            None => {
                self.window_unnamed += 1;
                self.counts.unnamed_launches += 1;
                self.window_unnamed_pids.insert(launch.pid);
                let identity = self.identities.of(launch);
                if identity.is_some() {
                    self.counts.identified_launches += 1;
                }
                identity
            }
        };
        if !at_limit {
            let index = self.counts.windows.saturating_sub(1);
            self.launch_log
                .record(index, launch, name.as_ref().or(identity.as_ref()));
        }
        let naming = match (&name, &identity) {
            (Some(name), _) => window::Naming::Name(name),
            (None, Some(identity)) => window::Naming::Identity(identity),
            (None, None) => window::Naming::None,
        };
        if let Some(window) = &mut self.window
            && window.record(launch, naming, sample) == window::Recorded::Shape
        {
            self.counts.shape_launches += 1;
        }
    }

    /// A launch's kernel name: a graph's kernel by its node's handle, any other launch through
    /// the runtime pairing of its thread.
    fn name_of(&mut self, launch: &events::Launch) -> Option<std::sync::Arc<str>> {
        let names = self.names.get_mut(&launch.pid)?;
        match launch.in_graph {
            true => names.node(launch.function),
            false => names.launch(launch.tid, launch.function),
        }
        .cloned()
    }

    /// Records lost since the last look make every graph the agent holds unsure.
    fn check_drops(&mut self) {
        let Ok(drops) = self.drops() else { return };
        if drops > self.drops_seen {
            self.drops_seen = drops;
            for (pid, exec) in self.graphs.records_lost() {
                self.set_kernel_count(graphs::KernelCount::Remove { pid, exec });
            }
        }
    }

    /// A graph record: the graph state changes, and with it the BPF side's kernel count.
    fn on_graph(&mut self, change: &graphs::GraphChange) {
        if let Some(count) = self.graphs.apply(change, self.launch_probes_since) {
            self.set_kernel_count(count);
        }
    }

    /// Writes (or removes) an executable graph's kernel count in the BPF map; a full map
    /// leaves its launches counted as one by the countdown, which is logged.
    fn set_kernel_count(&mut self, count: graphs::KernelCount) {
        let result = match count {
            graphs::KernelCount::Set { pid, exec, kernels } => {
                self.graph_kernels
                    .insert([u64::from(pid.0), exec], kernels, 0)
            }
            graphs::KernelCount::Remove { pid, exec } => {
                match self.graph_kernels.remove(&[u64::from(pid.0), exec]) {
                    Err(aya::maps::MapError::KeyNotFound) => Ok(()),
                    other => other,
                }
            }
        };
        if let Err(e) = result {
            tracing::debug!("graph kernel count {count:?}: {e}");
        }
    }

    /// The counter values of a sampled launch for the group active now, read on the GPU it
    /// ran on; a launch without values (none attributed among them) is counted by reason.
    fn read_sample(&mut self, launch: &events::Launch) -> Option<window::SampledValues> {
        self.counts.sampled += 1;
        let Some(group) = self.active_group() else {
            self.counts
                .samples_missing
                .count(MissingReason::GroupNotSupported);
            return None;
        };
        let device = match self.devices.attribute(launch, self.counters.devices()) {
            Ok(device) => *device,
            Err(why) => {
                tracing::trace!(
                    "pid {} tid {}: no device ({why:?})",
                    launch.pid.0,
                    launch.tid
                );
                self.counts
                    .samples_missing
                    .count(MissingReason::DeviceUnknown);
                return None;
            }
        };
        match self.counters.read(launch, &device, group) {
            Reading::Values(values) => {
                self.counts.samples_with_values += 1;
                Some(window::SampledValues {
                    group,
                    arch: device.arch,
                    values,
                })
            }
            Reading::Missing(reason) => {
                self.counts.samples_missing.count(reason);
                None
            }
        }
    }

    /// Drains until `until` returns true, sleeping the poll interval whenever the ring is
    /// empty.
    pub fn poll_until(&mut self, mut until: impl FnMut(&mut Self) -> bool) {
        let mut checked = Instant::now();
        loop {
            let read = self.drain();
            // Checked whenever the ring is empty, and at least every poll interval while
            // launchers fill it faster than it drains (the caller drains the rest).
            if read == 0 || checked.elapsed() >= self.config.poll_interval {
                if until(self) {
                    return;
                }
                checked = Instant::now();
            }
            if read == 0 {
                std::thread::sleep(self.config.poll_interval);
            }
        }
    }

    /// Drains until the ring is empty (it may never be while launchers outpace the reader;
    /// callers use it once the launchers stopped).
    pub fn drain_all(&mut self) -> u64 {
        let mut total = 0;
        loop {
            let read = self.drain();
            total += read;
            if read == 0 {
                return total;
            }
        }
    }

    /// Runs windows on `schedule` for `total`, then closes any open window. A window closes at
    /// the schedule's maximum length or as soon as every process in it reached L; the gap
    /// before the next one is the schedule's answer to what the window cost.
    pub fn run_for(&mut self, total: Duration, schedule: &Schedule) -> Result<(), CaptureError> {
        self.run_until(total, schedule, &std::sync::atomic::AtomicBool::new(false))
    }

    /// [`Capture::run_for`], ending early once `stop` is set (a signal handler's flag).
    pub fn run_until(
        &mut self,
        total: Duration,
        schedule: &Schedule,
        stop: &std::sync::atomic::AtomicBool,
    ) -> Result<(), CaptureError> {
        self.run_observed(total, schedule, stop, OBSERVE_EVERY, &mut |_| {})
    }

    /// [`Capture::run_until`], calling `observe` after every window closes and at least every
    /// `every` otherwise, so that a daemon can take finished snippets and window records as
    /// they come (it must be quick: the ring is not drained meanwhile).
    pub fn run_observed(
        &mut self,
        total: Duration,
        schedule: &Schedule,
        stop: &std::sync::atomic::AtomicBool,
        every: Duration,
        observe: &mut dyn FnMut(&mut Self),
    ) -> Result<(), CaptureError> {
        let start = Instant::now();
        let mut observed = start;
        let mut next_open = start;
        while start.elapsed() < total && !stop.load(std::sync::atomic::Ordering::Relaxed) {
            let now = Instant::now();
            if let Some(window) = &self.window {
                let timed_out = self.window_opened.elapsed() >= schedule.max_window();
                let early = window.all_at_limit();
                if timed_out || early {
                    let index = self.counts.windows.saturating_sub(1);
                    if let Some(cost) = self.close_window()? {
                        let gap = schedule.gap_after(&cost);
                        next_open = Instant::now() + gap;
                        self.record_window(index, cost, gap, early && !timed_out);
                        observe(self);
                        observed = Instant::now();
                    }
                }
            } else if now >= next_open {
                self.rescan()?;
                self.open_window()?;
            }
            if self.drain() == 0 {
                std::thread::sleep(self.config.poll_interval);
            }
            if observed.elapsed() >= every {
                observe(self);
                observed = Instant::now();
            }
        }
        let index = self.counts.windows.saturating_sub(1);
        if let Some(cost) = self.close_window()? {
            let gap = schedule.gap_after(&cost);
            self.record_window(index, cost, gap, false);
        }
        observe(self);
        Ok(())
    }

    fn record_window(&mut self, index: u64, cost: WindowCost, gap: Duration, early: bool) {
        let record = WindowRecord {
            index,
            cost,
            probe_time: schedule::probe_time(&self.cost, cost.launches),
            gap,
            closed_early: early,
        };
        tracing::info!(
            "window {index}: {} launches in {:?}{}, probe time {:?}, probed processes' CPU {:?}; next in {:?}",
            cost.launches,
            cost.open_for,
            if early {
                " (every process reached L)"
            } else {
                ""
            },
            record.probe_time,
            cost.process_cpu,
            gap
        );
        self.history.push(record);
    }

    /// Every window closed by [`Capture::run_for`] so far.
    pub fn history(&self) -> &[WindowRecord] {
        &self.history
    }

    /// The counter source's name.
    pub fn counter_source(&self) -> &'static str {
        self.counters.name()
    }

    /// The compute capabilities of the host's GPUs the counter source reads, each once, in
    /// order (empty: no counters).
    pub fn gpu_archs(&self) -> Vec<penrose_core::gpu::GpuArch> {
        distinct_archs(self.counters.devices().iter().map(|d| d.arch))
    }

    /// The host's GPUs the counter source reads.
    pub fn host_devices(&self) -> &[devices::HostDevice] {
        self.counters.devices()
    }

    /// Snippets that have ended since the last call.
    pub fn take_snippets(&mut self) -> Vec<Snippet> {
        std::mem::take(&mut self.finished)
    }

    /// Records the BPF side could not put into the full ring, summed over CPUs.
    pub fn drops(&self) -> Result<u64, CaptureError> {
        let values = self.drops.get(&0, 0).map_err(CaptureError::Map)?;
        Ok(values.iter().sum())
    }

    /// Run-time statistics of every program (zero unless enabled with
    /// [`loader::enable_run_stats`]).
    pub fn run_stats(&self) -> Vec<loader::ProgramStats> {
        self.probes.run_stats()
    }

    /// Counts so far.
    pub fn counts(&self) -> Counts {
        Counts {
            devices: self.devices.counts(),
            graphs: self.graphs.counts(),
            ..self.counts
        }
    }

    /// Launches ignored because their process had reached L in a closed window.
    pub fn beyond_limit(&self) -> u64 {
        self.beyond_limit
    }

    /// From now on keeps every launch recorded in a window, up to `limit` (see
    /// [`launch_log`]; 0 stops it). What was kept so far is dropped.
    pub fn log_launches(&mut self, limit: usize) {
        self.launch_log = launch_log::LaunchLog::new(limit);
    }

    /// The launches kept since [`Capture::log_launches`].
    pub fn launch_log(&self) -> &launch_log::LaunchLog {
        &self.launch_log
    }
}

/// CLOCK_MONOTONIC now, in nanoseconds: the clock of `bpf_ktime_get_ns` and so of the records.
fn monotonic_ns() -> u64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: FFI: `now` is a valid, writable timespec; CLOCK_MONOTONIC always exists on Linux.
    #[allow(unsafe_code)]
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
    if rc != 0 {
        return u64::MAX;
    }
    u64::try_from(now.tv_sec)
        .unwrap_or(0)
        .saturating_mul(1_000_000_000)
        .saturating_add(u64::try_from(now.tv_nsec).unwrap_or(0))
}
