//! Where the pipeline's snippets come from.
//!
//! - [`ebpf`]: [`EbpfSource`], the live capture (eBPF uprobes on libcuda; needs root): the
//!   product's source and the default.
//! - `replay`: `ReplaySource`, test equipment, compiled in only with the `test-util` feature
//!   (tests and the demo; never in a packaged agent): profiler traces replayed as if captured
//!   (no root, no probes), the same snippets and sampled counter values an agent would see if
//!   those traces ran through the stand-in driver. Only `capture.source = "test-replay"`
//!   reaches it; a live capture that cannot start is an error, never a reason to replay.
//!
//! A source runs in a thread of its own (the capture blocks, polling its ring buffer) and hands
//! its output to a sink as it comes.

pub mod ebpf;
#[cfg(feature = "test-util")]
pub mod replay;

use std::sync::atomic::AtomicBool;
use std::time::Duration;

use penrose_core::sampling::SamplePeriod;
use thiserror::Error;

use crate::capture::window::Snippet;
use crate::capture::{CaptureError, WindowRecord};
pub use ebpf::EbpfSource;
#[cfg(feature = "test-util")]
pub use replay::ReplaySource;

/// Why a source stopped or could not start.
#[derive(Debug, Error)]
pub enum SourceError {
    /// The live capture failed.
    #[error(transparent)]
    Capture(#[from] CaptureError),
    /// The traces could not be read.
    #[error("trace replay: {0}")]
    Traces(String),
    /// The configuration names test equipment this build does not have.
    #[error("{0}")]
    TestEquipmentNotBuilt(String),
}

/// How a trace replay runs (test equipment: `crate::source::replay`, in builds with the
/// `test-util` feature).
#[derive(Clone, Debug)]
pub struct ReplayConfig {
    /// L.
    pub window_launches: usize,
    /// S.
    pub sample_period: SamplePeriod,
    /// O.
    pub reoffset_every: Duration,
    /// Counter groups take turns of this length.
    pub group_period: Duration,
    /// Time between windows.
    pub window_every: Duration,
    /// Windows before the source ends (`None`: no end).
    pub windows: Option<u64>,
    /// Sample the traces' own counter values, as the stand-in ring would give them
    /// (`capture.counters = "test-standin-ring"`); `false` keeps none (`"none"`).
    pub sample_counters: bool,
    /// Seed of the sampling offsets (`None`: from the OS).
    pub seed: Option<u64>,
}

/// Opens the trace replay of `traces` (test equipment).
#[cfg(feature = "test-util")]
pub fn open_replay(
    traces: &std::path::Path,
    replay: ReplayConfig,
) -> Result<Box<dyn SnippetSource>, SourceError> {
    Ok(Box::new(ReplaySource::open(traces, replay)?))
}

/// A build without the test equipment has no replay to open: an error, never another source
/// (the configuration refuses `capture.source = "test-replay"` before this is reached).
#[cfg(not(feature = "test-util"))]
pub fn open_replay(
    _traces: &std::path::Path,
    _replay: ReplayConfig,
) -> Result<Box<dyn SnippetSource>, SourceError> {
    Err(SourceError::TestEquipmentNotBuilt(
        crate::test_equipment::not_built("capture.source = \"test-replay\""),
    ))
}

/// One closed window, for `status` and the overhead figures.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct WindowStat {
    /// The window's index.
    pub index: u64,
    /// Launches the probes saw.
    pub launches: u64,
    /// How long it was open, seconds.
    pub open_s: f64,
    /// Probe time (launches times the calibrated per-launch cost), seconds.
    pub probe_s: f64,
    /// CPU time of the probed processes while it was open, seconds, when known.
    pub process_cpu_s: Option<f64>,
    /// The gap the schedule chose after it, seconds.
    pub gap_s: f64,
}

impl From<&WindowRecord> for WindowStat {
    fn from(w: &WindowRecord) -> Self {
        Self {
            index: w.index,
            launches: w.cost.launches,
            open_s: w.cost.open_for.as_secs_f64(),
            probe_s: w.probe_time.as_secs_f64(),
            process_cpu_s: w.cost.process_cpu.map(|d| d.as_secs_f64()),
            gap_s: w.gap.as_secs_f64(),
        }
    }
}

/// What a source hands over at a time.
#[derive(Debug, Default)]
pub struct SourceBatch {
    /// Snippets that ended.
    pub snippets: Vec<Snippet>,
    /// Windows that closed.
    pub windows: Vec<WindowStat>,
    /// What the source says about itself now, when that changed (libraries probed or
    /// refused since the start).
    pub info: Option<SourceInfo>,
}

/// What a source says about itself in `status`.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SourceInfo {
    /// `ebpf`, or `test-replay` (test equipment).
    pub kind: String,
    /// Where counter values come from.
    pub counters: String,
    /// The compute capabilities of the host's GPUs the counter values are read on, as read
    /// (`sm_86, sm_90`; `None` without counters). Reports name only their generations
    /// (`AgentStatus::arch`).
    #[serde(default)]
    pub gpu_arch: Option<String>,
    /// Per-launch probe cost the schedule uses, nanoseconds (0 for the replay).
    pub probe_cost_ns: u64,
    /// libcuda files probed, or traces replayed.
    pub inputs: Vec<String>,
    /// Library files not probed because root does not control them.
    #[serde(default)]
    pub libraries_untrusted: u64,
    /// Library files not probed because `capture.max_libraries` were probed already.
    #[serde(default)]
    pub libraries_over_cap: u64,
    /// Sampled launches, and how many got counter values (live capture only).
    #[serde(default)]
    pub samples: SampleStatus,
    /// How graph launches entered snippets (live capture only).
    #[serde(default)]
    pub graphs: crate::capture::graphs::GraphCounts,
}

/// What became of the launches the sampler picked: values, or the reason there are none, and
/// how they were attributed to the host's GPUs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SampleStatus {
    /// Launches sampled.
    pub sampled: u64,
    /// Of those, launches with counter values.
    pub with_values: u64,
    /// The others, by reason (`counters_busy`: another tool held the GPU's counters).
    pub missing: crate::capture::MissingCounts,
    /// How sampled launches were attributed to GPUs.
    pub devices: crate::capture::devices::DeviceCounts,
}

/// Architectures as `status` shows them: `sm_86, sm_90`; `None` for none.
pub fn archs_text(archs: &[penrose_core::gpu::GpuArch]) -> Option<String> {
    (!archs.is_empty()).then(|| {
        archs
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    })
}

/// A producer of snippets.
pub trait SnippetSource: Send {
    /// What it is, for `status`.
    fn info(&self) -> SourceInfo;

    /// The compute capabilities of the host's GPUs its counter values are read on, each once
    /// (empty: it yields no counter values).
    fn gpu_archs(&self) -> Vec<penrose_core::gpu::GpuArch>;

    /// Runs until `stop` is set or the source has nothing more, handing output to `sink`.
    fn run(
        &mut self,
        stop: &AtomicBool,
        sink: &mut dyn FnMut(SourceBatch),
    ) -> Result<(), SourceError>;
}
