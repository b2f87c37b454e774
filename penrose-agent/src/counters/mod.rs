//! Counter sources: where a sampled launch's performance counters come from (DESIGN.md
//! section 3, "Sampling and counters").
//!
//! - [`ring`]: the stand-in driver's shared-memory ring of per-launch counter records.
//! - [`standin`]: [`StandinSource`], counters derived from the replayed trace's fields, read
//!   from that ring (used with the stand-in libcuda, in tests and the demo).
//! - [`nvml`]: [`NvmlSource`], GPM metrics through NVML, loaded at run time.
//!
//! Hardware exposes a few counters at a time, so counters come in groups
//! ([`CounterGroup`], from the catalogue) and the agent reads the group active in the current
//! period; a source says which groups it can read and the agent rotates among those.

pub mod nvml;
pub mod ring;
pub mod standin;

use penrose_core::counters::{CounterGroup, CounterId};

use crate::capture::events::{Launch, Pid};
pub use nvml::NvmlSource;
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
}

/// A source of counter values for sampled launches.
pub trait CounterSource: Send {
    /// A short name for logs and `status`.
    fn name(&self) -> &'static str;

    /// The catalogue groups this source can read; the agent rotates among them.
    fn groups(&self) -> Vec<CounterGroup>;

    /// A process launched inside a window: sources that need per-process state open it now,
    /// while the process is certainly alive.
    fn watch(&mut self, _pid: Pid) {}

    /// The process exited; its state may go.
    fn forget(&mut self, _pid: Pid) {}

    /// The counters of `group` for one sampled launch.
    fn read(&mut self, launch: &Launch, group: CounterGroup) -> Reading;
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

    fn read(&mut self, _launch: &Launch, _group: CounterGroup) -> Reading {
        Reading::Missing(MissingReason::GroupNotSupported)
    }
}

/// Which counter source the agent uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
#[derive(clap::ValueEnum)]
pub enum SourceKind {
    /// NVML when an NVIDIA library loads, otherwise the stand-in ring reader.
    Auto,
    /// NVML/GPM only.
    Nvml,
    /// The stand-in driver's ring only.
    Standin,
    /// No counters.
    None,
}

/// Opens the source `kind` names. `Auto` and `Nvml` try NVML first; when no NVIDIA library is
/// present that is said once at info level (it is the normal case on a machine without a GPU)
/// and `Auto` falls back to the stand-in reader.
pub fn open(kind: SourceKind) -> Box<dyn CounterSource> {
    match kind {
        SourceKind::None => Box::new(NoCounters),
        SourceKind::Standin => Box::new(StandinSource::new()),
        SourceKind::Nvml | SourceKind::Auto => match NvmlSource::open() {
            Ok(source) => Box::new(source),
            Err(e) => {
                tracing::info!("counters: NVML not used ({e})");
                if kind == SourceKind::Auto {
                    Box::new(StandinSource::new())
                } else {
                    Box::new(NoCounters)
                }
            }
        },
    }
}
