//! Counter sources: where a sampled launch's performance counters come from (docs/design.md
//! section 3, "Sampling and counters").
//!
//! - [`nvml`]: [`NvmlSource`], GPM metrics through NVML, loaded at run time: the product's
//!   source, and the default. When it cannot be opened the capture fails (exit code 4); there
//!   is no fallback to another source.
//! - `standin`: `StandinSource`, test equipment, compiled in only with the `test-util`
//!   feature (tests and the demo; never in a packaged agent): counters derived from the
//!   replayed trace's fields, read from the stand-in libcuda's ring (`penrose-standin-ring`).
//!   Reached only by naming it, `capture.counters = "test-standin-ring"`, and announced with a
//!   warning when it starts.
//!
//! Hardware exposes a few counters at a time, so counters come in groups
//! ([`CounterGroup`], from the catalogue) and the agent reads the group active in the current
//! period; a source says which groups it can read and the agent rotates among those.

pub mod nvml;
#[cfg(feature = "test-util")]
pub mod standin;

use penrose_core::counters::{CounterGroup, CounterId};

use crate::capture::devices::HostDevice;
use crate::capture::events::{Launch, Pid};
pub use nvml::{NvmlSource, NvmlUnavailable};
#[cfg(feature = "test-util")]
pub use standin::StandinSource;

/// One counter's value for one sampled launch, in the catalogue's unit.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CounterValue {
    /// The counter (catalogue id).
    pub counter: CounterId,
    /// Its value.
    pub value: f64,
}

/// What a source made of one sampled launch.
#[derive(Clone, Debug, PartialEq)]
pub enum Reading {
    /// The values of the group's counters the source could read (possibly not all of them).
    Values(Vec<CounterValue>),
    /// Nothing for this launch; the reason is counted, not logged per launch.
    Missing(MissingReason),
}

/// Why a sampled launch has no counter values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MissingReason {
    /// The source cannot read this group.
    GroupNotSupported,
    /// The process has no counter record source (no stand-in ring, say).
    NoSource,
    /// The launch's record was not found (overwritten, or never written).
    NotFound,
    /// The first reading of an interval-based source (GPM needs two samples).
    Warmup,
    /// The device or library returned an error.
    DeviceError,
    /// The launch could not be attributed to one of the host's GPUs (its context was made
    /// before the agent attached, say): no values rather than another device's.
    DeviceUnknown,
    /// Another tool holds the GPU's performance counters (DCGM profiling, a profiler): the
    /// agent takes no sample rather than disturb it.
    CountersBusy,
    /// The device's previous reading is younger than the source's minimum interval (GPM: 100
    /// ms), so no new reading is taken.
    TooSoon,
}

/// A source of counter values for sampled launches.
pub trait CounterSource: Send {
    /// A short name for logs and `status`.
    fn name(&self) -> &'static str;

    /// The catalogue groups this source can read; the agent rotates among them.
    fn groups(&self) -> Vec<CounterGroup>;

    /// The host's GPUs this source reads, each with its compute capability (reports name
    /// only its generation, `GpuArch::generation`). Empty: no GPU, no values. A sampled launch
    /// is attributed to one of these before it is read (`capture::devices`).
    fn devices(&self) -> &[HostDevice];

    /// A process launched inside a window: sources that need per-process state open it now,
    /// while the process is certainly alive.
    fn watch(&mut self, _pid: Pid) {}

    /// The process exited; its state may go.
    fn forget(&mut self, _pid: Pid) {}

    /// The counters of `group` for one sampled launch, on `device`, the GPU it ran on.
    fn read(&mut self, launch: &Launch, device: &HostDevice, group: CounterGroup) -> Reading;
}

/// The groups among `groups`, each once, in catalogue order: what a source offers to rotate.
pub fn distinct_groups(groups: impl IntoIterator<Item = CounterGroup>) -> Vec<CounterGroup> {
    let mut groups: Vec<CounterGroup> = groups.into_iter().collect();
    groups.sort();
    groups.dedup();
    groups
}

/// A source that reads nothing: the operator turned counters off, or no source is present.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoCounters;

impl CounterSource for NoCounters {
    fn name(&self) -> &'static str {
        "none"
    }

    fn groups(&self) -> Vec<CounterGroup> {
        Vec::new()
    }

    fn devices(&self) -> &[HostDevice] {
        &[]
    }

    fn read(&mut self, _launch: &Launch, _device: &HostDevice, _group: CounterGroup) -> Reading {
        Reading::Missing(MissingReason::GroupNotSupported)
    }
}

/// Which counter source the agent uses (`capture.counters`, `capture --counters`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
#[derive(clap::ValueEnum)]
pub enum SourceKind {
    /// NVML/GPM on the GPU each launch runs on, the product's source (the default). If it cannot be opened the
    /// agent stops with an error instead of using another source.
    #[default]
    Nvml,
    /// No counters: launches are fingerprinted, but no sampled values are kept.
    None,
    /// TEST EQUIPMENT: the stand-in libcuda's counter ring (tests and the demo only).
    TestStandinRing,
}

impl SourceKind {
    /// The spelling in the configuration file and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Self::Nvml => "nvml",
            Self::None => "none",
            Self::TestStandinRing => "test-standin-ring",
        }
    }

    /// Whether this is test equipment (never a default, never a fallback).
    pub fn is_test_equipment(self) -> bool {
        matches!(self, Self::TestStandinRing)
    }
}

/// Opens the source `kind` names. There is no fallback: when NVML cannot be opened (no NVIDIA
/// driver, no GPU with GPM) the error is returned and the capture does not start. The
/// test-equipment source logs a warning saying so.
pub fn open(kind: SourceKind) -> Result<Box<dyn CounterSource>, CountersUnavailable> {
    Ok(match kind {
        SourceKind::None => Box::new(NoCounters),
        SourceKind::Nvml => Box::new(NvmlSource::open()?),
        SourceKind::TestStandinRing => open_standin()?,
    })
}

/// Why the configured counter source could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum CountersUnavailable {
    /// NVML could not be opened.
    #[error(transparent)]
    Nvml(#[from] NvmlUnavailable),
    /// The configuration names test equipment this build does not have.
    #[error("{0}")]
    TestEquipmentNotBuilt(String),
}

#[cfg(feature = "test-util")]
fn open_standin() -> Result<Box<dyn CounterSource>, CountersUnavailable> {
    crate::test_equipment::warn(
        "capture.counters = \"test-standin-ring\"",
        "counter values are read from the stand-in libcuda's ring, not from a GPU",
    );
    Ok(Box::new(StandinSource::new()))
}

/// A build without the test equipment has no stand-in ring: an error, never another source.
#[cfg(not(feature = "test-util"))]
fn open_standin() -> Result<Box<dyn CounterSource>, CountersUnavailable> {
    Err(CountersUnavailable::TestEquipmentNotBuilt(
        crate::test_equipment::not_built("capture.counters = \"test-standin-ring\""),
    ))
}
