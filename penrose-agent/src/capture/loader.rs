//! Loading the committed eBPF object and attaching its programs.
//!
//! Name probes and the exit tracepoint stay attached for the agent's lifetime; launch probes
//! are attached at a window's start and detached at its end (their links are kept for that).

use std::fs;
use std::path::Path;
use std::process::Command;

use aya::Ebpf;
use aya::maps::{Array, MapData, PerCpuArray, RingBuf};
use aya::programs::uprobe::{UProbeAttachLocation, UProbeLinkId, UProbeScope};
use aya::programs::{ProgramError, TracePoint, UProbe};
use penrose_ebpf_common::{PROCESS_EXIT, ProbeRole, USER_PROBES, UserProbe, maps};

use super::error::CaptureError;
use super::locate::LibraryFile;

/// The compiled programs (`cargo xtask build-ebpf` rebuilds them; docs/build.md).
static OBJECT: &[u8] = aya::include_bytes_aligned!("../../../penrose-ebpf/penrose.bpf.o");

/// Where the kernel exposes its BTF; aya and the verifier rely on it.
pub const KERNEL_BTF: &str = "/sys/kernel/btf/vmlinux";
/// tracefs, where aya reads a tracepoint's id.
pub const TRACEFS: &str = "/sys/kernel/tracing";

const CAP_SYS_ADMIN: u32 = 21;
const CAP_PERFMON: u32 = 38;
const CAP_BPF: u32 = 39;

/// Effective uid and capability set of this process, from `/proc/self/status`.
fn privileges() -> Option<(u32, u64)> {
    let status = fs::read_to_string("/proc/self/status").ok()?;
    let field = |key: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .map(str::trim)
    };
    let euid = field("Uid:")?.split_whitespace().nth(1)?.parse().ok()?;
    let caps = u64::from_str_radix(field("CapEff:")?, 16).ok()?;
    Some((euid, caps))
}

/// Whether this process runs as root (effective uid 0). Tools and tests use it to decide what
/// they can run; the daemon does not (its source is what its configuration names).
pub fn is_root() -> bool {
    privileges().is_some_and(|(euid, _)| euid == 0)
}

/// Checks what loading needs before trying, so the error names the missing piece instead of
/// a bare `EPERM` from the kernel.
pub fn preflight() -> Result<(), CaptureError> {
    let (euid, caps) = privileges().unwrap_or((u32::MAX, 0));
    let has = |cap: u32| caps & (1u64 << cap) != 0;
    let privileged = euid == 0 || has(CAP_SYS_ADMIN) || (has(CAP_BPF) && has(CAP_PERFMON));
    if !privileged {
        return Err(CaptureError::NotPrivileged { euid });
    }
    if !Path::new(KERNEL_BTF).exists() {
        return Err(CaptureError::NoBtf);
    }
    if !Path::new(TRACEFS).join("events").is_dir() {
        tracing::info!("tracefs not mounted; mounting it at {TRACEFS}");
        let mounted = Command::new("mount")
            .args(["-t", "tracefs", "nodev", TRACEFS])
            .status()
            .is_ok_and(|s| s.success());
        if !mounted || !Path::new(TRACEFS).join("events").is_dir() {
            return Err(CaptureError::NoTracefs);
        }
    }
    Ok(())
}

/// One program's run-time statistics.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProgramStats {
    /// Program name.
    pub program: String,
    /// Times it ran.
    pub runs: u64,
    /// Total time in the program (not counting the trap around it).
    pub run_time: std::time::Duration,
}

/// Turns on the kernel's BPF run-time statistics for as long as the returned descriptor
/// lives (they cost a clock read per program run, so they are off unless asked for).
pub fn enable_run_stats() -> Result<std::os::fd::OwnedFd, CaptureError> {
    aya::sys::enable_stats(aya::sys::Stats::RunTime).map_err(|e| CaptureError::Stats(e.to_string()))
}

/// Launch probes being detached on other threads.
#[derive(Debug)]
pub struct Detaching(std::thread::JoinHandle<()>);

impl Detaching {
    /// Every launch probe is gone: no launch record can follow.
    pub fn is_done(&self) -> bool {
        self.0.is_finished()
    }

    /// Waits for the detach to end.
    pub fn wait(self) {
        if self.0.join().is_err() {
            tracing::warn!("a thread detaching launch probes panicked");
        }
    }
}

/// `SAMPLE_CONFIG` (one `u64`, the layout of `SampleConfig`) and `SAMPLE_COUNTDOWN`.
pub type SamplingMaps = (Array<MapData, u64>, PerCpuArray<MapData, u64>);

/// The loaded object and the links the agent holds.
pub struct Probes {
    ebpf: Ebpf,
    libraries: Vec<LibraryFile>,
    launch_links: Vec<(&'static str, UProbeLinkId)>,
    launch_attached: bool,
    /// Whether the open window also has the runtime's launch-naming probes.
    naming_attached: bool,
}

impl Probes {
    /// Checks privileges, loads every program into the kernel and attaches the exit
    /// tracepoint. No uprobe is attached yet.
    pub fn load() -> Result<Self, CaptureError> {
        preflight()?;
        let mut ebpf = Ebpf::load(OBJECT).map_err(|e| CaptureError::Load(Box::new(e)))?;
        for probe in &USER_PROBES {
            uprobe(&mut ebpf, probe.program)?
                .load()
                .map_err(|e| program_error(probe.program, e))?;
        }
        let exit: &mut TracePoint = ebpf
            .program_mut(PROCESS_EXIT.program)
            .ok_or(CaptureError::MissingProgram(PROCESS_EXIT.program))?
            .try_into()
            .map_err(|e| program_error(PROCESS_EXIT.program, e))?;
        exit.load()
            .map_err(|e| program_error(PROCESS_EXIT.program, e))?;
        exit.attach(PROCESS_EXIT.category, PROCESS_EXIT.name)
            .map_err(|e| program_error(PROCESS_EXIT.program, e))?;
        Ok(Self {
            ebpf,
            libraries: Vec::new(),
            launch_links: Vec::new(),
            launch_attached: false,
            naming_attached: false,
        })
    }

    /// The ring buffer and the drop counter, handed to the reader (once).
    pub fn take_maps(
        &mut self,
    ) -> Result<(RingBuf<MapData>, PerCpuArray<MapData, u64>), CaptureError> {
        let events = self
            .ebpf
            .take_map(maps::EVENTS)
            .ok_or(CaptureError::MissingMap(maps::EVENTS))?;
        let drops = self
            .ebpf
            .take_map(maps::DROPS)
            .ok_or(CaptureError::MissingMap(maps::DROPS))?;
        Ok((
            RingBuf::try_from(events).map_err(CaptureError::Map)?,
            PerCpuArray::try_from(drops).map_err(CaptureError::Map)?,
        ))
    }

    /// The sampling period (an `Array` of one `u64`, the layout of `SampleConfig`) and the
    /// per-CPU countdowns, handed to the capture (once).
    pub fn take_sampling_maps(&mut self) -> Result<SamplingMaps, CaptureError> {
        let config = self
            .ebpf
            .take_map(maps::SAMPLE_CONFIG)
            .ok_or(CaptureError::MissingMap(maps::SAMPLE_CONFIG))?;
        let countdown = self
            .ebpf
            .take_map(maps::SAMPLE_COUNTDOWN)
            .ok_or(CaptureError::MissingMap(maps::SAMPLE_COUNTDOWN))?;
        Ok((
            Array::try_from(config).map_err(CaptureError::Map)?,
            PerCpuArray::try_from(countdown).map_err(CaptureError::Map)?,
        ))
    }

    /// The kernel count per executable graph (key: pid, `CUgraphExec`), handed to the capture
    /// (once).
    pub fn take_graph_map(
        &mut self,
    ) -> Result<aya::maps::HashMap<MapData, [u64; 2], u32>, CaptureError> {
        let map = self
            .ebpf
            .take_map(maps::GRAPH_KERNELS)
            .ok_or(CaptureError::MissingMap(maps::GRAPH_KERNELS))?;
        aya::maps::HashMap::try_from(map).map_err(CaptureError::Map)
    }

    /// Attaches the `cuLaunchKernel` program at `offset` in `path`, for this process only: the
    /// start-up calibration measures what a probed launch costs on this machine by calling a
    /// function of the agent's own through it.
    pub fn attach_calibration(
        &mut self,
        path: &Path,
        offset: u64,
    ) -> Result<UProbeLinkId, CaptureError> {
        let program = penrose_ebpf_common::programs::CU_LAUNCH_KERNEL;
        let pid = std::num::NonZeroU32::new(std::process::id())
            .ok_or(CaptureError::MissingProgram(program))?;
        uprobe(&mut self.ebpf, program)?
            .attach(
                UProbeAttachLocation::AbsoluteOffset(offset),
                path,
                UProbeScope::OneProcess(pid),
            )
            .map_err(|e| program_error(program, e))
    }

    /// Detaches the calibration probe (waits for the kernel to unregister it).
    pub fn detach_calibration(&mut self, link: UProbeLinkId) -> Result<(), CaptureError> {
        let program = penrose_ebpf_common::programs::CU_LAUNCH_KERNEL;
        uprobe(&mut self.ebpf, program)?
            .detach(link)
            .map_err(|e| program_error(program, e))
    }

    /// Libraries with name probes attached.
    pub fn libraries(&self) -> &[LibraryFile] {
        &self.libraries
    }

    /// Attaches the name and context probes of the library's kind (driver or runtime) to
    /// `library` (and its launch probes, inside a window). A library already probed (same
    /// file) is skipped. Returns how many probes attached; a symbol the library lacks is
    /// skipped, so a library that lacks them all attaches none.
    pub fn add_library(&mut self, library: LibraryFile) -> Result<usize, CaptureError> {
        if self.libraries.iter().any(|l| l.id == library.id) {
            return Ok(0);
        }
        let mut attached = 0;
        for probe in USER_PROBES.iter().filter(|p| {
            matches!(
                p.role,
                ProbeRole::Name | ProbeRole::Context | ProbeRole::Graph
            ) && p.library == library.kind
        }) {
            if self.attach(probe, &library)?.is_some() {
                attached += 1;
            }
        }
        if self.launch_attached {
            attached += self.attach_launch_to(&library)?;
        }
        tracing::info!(
            "probing {} ({:?}): {attached} probes",
            library.path.display(),
            library.origin
        );
        self.libraries.push(library);
        Ok(attached)
    }

    /// Attaches every launch probe to every library, and with `naming` the runtime's
    /// launch-naming probes too: a window opens. The naming probes go first, so that every
    /// driver launch the window records has its runtime launch recorded before it.
    pub fn attach_launch(&mut self, naming: bool) -> Result<usize, CaptureError> {
        if self.launch_attached {
            return Ok(0);
        }
        self.launch_attached = true;
        self.naming_attached = naming;
        let mut libraries = self.libraries.clone();
        libraries.sort_by_key(|l| l.kind != penrose_ebpf_common::Library::Runtime);
        let mut attached = 0;
        for library in libraries {
            attached += self.attach_launch_to(&library)?;
        }
        Ok(attached)
    }

    fn attach_launch_to(&mut self, library: &LibraryFile) -> Result<usize, CaptureError> {
        let mut attached = 0;
        let naming = self.naming_attached;
        for probe in USER_PROBES.iter().filter(|p| {
            p.library == library.kind
                && (p.role == ProbeRole::Launch || (naming && p.role == ProbeRole::LaunchNaming))
        }) {
            if let Some(link) = self.attach(probe, library)? {
                self.launch_links.push((probe.program, link));
                attached += 1;
            }
        }
        Ok(attached)
    }

    /// Attaches the runtime's naming probes inside an open window that has none yet (a
    /// process registered kernels while the window was open). Returns how many attached.
    pub fn attach_naming(&mut self) -> Result<usize, CaptureError> {
        if !self.launch_attached || self.naming_attached {
            return Ok(0);
        }
        self.naming_attached = true;
        let mut attached = 0;
        for library in self.libraries.clone() {
            for probe in USER_PROBES
                .iter()
                .filter(|p| p.library == library.kind && p.role == ProbeRole::LaunchNaming)
            {
                if let Some(link) = self.attach(probe, &library)? {
                    self.launch_links.push((probe.program, link));
                    attached += 1;
                }
            }
        }
        Ok(attached)
    }

    /// Starts detaching every launch probe: the window closes.
    ///
    /// The kernel waits for grace periods when it unregisters a uprobe (measured here: about
    /// 0.7-0.9 s for the eight launch probes), and launches keep trapping meanwhile, so the
    /// links are dropped on other threads (one each, so the waits can overlap) while the
    /// caller keeps draining the ring. The detach is complete when the handle has finished.
    pub fn detach_launch(&mut self) -> Result<Detaching, CaptureError> {
        self.launch_attached = false;
        self.naming_attached = false;
        let naming = |program: &str| {
            USER_PROBES
                .iter()
                .any(|p| p.program == program && p.role == ProbeRole::LaunchNaming)
        };
        let (mut launches, mut namings) = (Vec::new(), Vec::new());
        for (program, link) in std::mem::take(&mut self.launch_links) {
            let link = uprobe(&mut self.ebpf, program)?
                .take_link(link)
                .map_err(|e| program_error(program, e))?;
            if naming(program) {
                namings.push(link);
            } else {
                launches.push(link);
            }
        }
        // The driver's launch probes go first and the runtime's naming probes after them, so
        // that every driver launch the window records still has its runtime launch before it.
        let thread = std::thread::spawn(move || {
            for links in [launches, namings] {
                std::thread::scope(|scope| {
                    for link in links {
                        scope.spawn(move || drop(link));
                    }
                });
            }
        });
        Ok(Detaching(thread))
    }

    /// Each program's kernel run-time statistics (counted only while
    /// [`enable_run_stats`]'s descriptor is held): name, runs, total run time.
    pub fn run_stats(&self) -> Vec<ProgramStats> {
        self.ebpf
            .programs()
            .filter_map(|(name, program)| {
                let info = program.info().ok()?;
                Some(ProgramStats {
                    program: name.to_string(),
                    runs: info.run_count(),
                    run_time: info.run_time(),
                })
            })
            .collect()
    }

    /// Whether launch probes are attached.
    pub fn launch_attached(&self) -> bool {
        self.launch_attached
    }

    /// Attaches one probe; `None` when the library lacks the symbol or vanished (a container
    /// went away): the agent keeps running with the libraries it still has.
    fn attach(
        &mut self,
        probe: &UserProbe,
        library: &LibraryFile,
    ) -> Result<Option<UProbeLinkId>, CaptureError> {
        let program = uprobe(&mut self.ebpf, probe.program)?;
        match program.attach(probe.symbol, &library.path, UProbeScope::AllProcesses) {
            Ok(link) => Ok(Some(link)),
            // Context and graph entry points come and go with driver versions
            // (`cuCtxCreate_v4` is CUDA 12.5's): one a driver lacks is no warning.
            Err(e) if matches!(probe.role, ProbeRole::Context | ProbeRole::Graph) => {
                tracing::info!("{} on {}: {e}", probe.symbol, library.path.display());
                Ok(None)
            }
            Err(e) => {
                tracing::warn!("{} on {}: {e}", probe.symbol, library.path.display());
                Ok(None)
            }
        }
    }
}

fn uprobe<'a>(ebpf: &'a mut Ebpf, program: &'static str) -> Result<&'a mut UProbe, CaptureError> {
    ebpf.program_mut(program)
        .ok_or(CaptureError::MissingProgram(program))?
        .try_into()
        .map_err(|e| program_error(program, e))
}

fn program_error(program: &'static str, source: ProgramError) -> CaptureError {
    CaptureError::Program {
        program,
        source: Box::new(source),
    }
}
