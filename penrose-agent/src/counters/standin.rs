//! Counter values for launches made through the stand-in driver, read from its ring.
//!
//! The stand-in writes, for every launch, values the replayer took from the trace (duration,
//! estimated achieved occupancy, blocks per SM, registers per thread, shared memory). Those map
//! onto the catalogue's per-launch group; the other groups (SM, tensor and DRAM activity, L2
//! hit rate) have no source in a trace, so this source does not offer them.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use penrose_core::counters::{Catalogue, CounterGroup, CounterId};

use super::ring::{CounterRecord, CounterRing, Lookup};
use super::{CounterSource, CounterValue, MissingReason, Reading};
use crate::capture::events::{Launch, Pid};

/// How long a read waits for the stand-in to write a record the probe has already announced.
/// The probe fires at the call's entry and the record follows within microseconds, unless the
/// launching thread is preempted in between: on a loaded 2-core machine that was seen to take
/// more than 2 ms, so the wait is generous (it ends as soon as the record is there, and only a
/// process that dies inside a launch call makes the agent wait it out).
const RECORD_WAIT: Duration = Duration::from_millis(250);

/// Reads one counter's value out of a record, when the trace had it.
type Field = fn(&CounterRecord) -> Option<f64>;

/// The catalogue counters this source fills, by name, with the record field each comes from.
const FIELDS: [(&str, Field); 5] = [
    ("kernel_duration", |r| r.duration_ns().map(|v| v as f64)),
    ("achieved_occupancy", |r| r.est_achieved_occupancy_pct()),
    ("blocks_per_sm", |r| r.blocks_per_sm()),
    ("registers_per_thread", |r| {
        r.registers_per_thread().map(f64::from)
    }),
    ("shared_memory", |r| r.shared_memory_bytes().map(f64::from)),
];

/// Per-process rings of the stand-in driver.
#[derive(Debug)]
pub struct StandinSource {
    rings: HashMap<Pid, Option<CounterRing>>,
    counters: Vec<(CounterId, CounterGroup, Field)>,
}

impl Default for StandinSource {
    fn default() -> Self {
        Self::new()
    }
}

impl StandinSource {
    /// A source for the current catalogue.
    pub fn new() -> Self {
        let catalogue = Catalogue::current();
        let counters = FIELDS
            .iter()
            .filter_map(|(name, field)| {
                let c = catalogue.counter_by_name(name)?;
                Some((c.id, c.group, *field))
            })
            .collect();
        Self {
            rings: HashMap::new(),
            counters,
        }
    }

    fn ring(&mut self, pid: Pid) -> Option<&mut CounterRing> {
        self.rings
            .entry(pid)
            .or_insert_with(|| match CounterRing::open(pid.0) {
                Ok(ring) => Some(ring),
                Err(e) => {
                    tracing::debug!("pid {}: no stand-in counter ring ({e})", pid.0);
                    None
                }
            })
            .as_mut()
    }
}

impl CounterSource for StandinSource {
    fn name(&self) -> &'static str {
        "standin"
    }

    fn groups(&self) -> Vec<CounterGroup> {
        super::distinct_groups(self.counters.iter().map(|c| c.1))
    }

    fn watch(&mut self, pid: Pid) {
        let _ = self.ring(pid);
    }

    fn forget(&mut self, pid: Pid) {
        self.rings.remove(&pid);
    }

    fn read(&mut self, launch: &Launch, group: CounterGroup) -> Reading {
        if !self.counters.iter().any(|c| c.1 == group) {
            return Reading::Missing(MissingReason::GroupNotSupported);
        }
        let Some(ring) = self.ring(launch.pid) else {
            return Reading::Missing(MissingReason::NoSource);
        };
        let started = Instant::now();
        let record = loop {
            match ring.find_launch(launch.tid, launch.function, launch.timestamp_ns) {
                Lookup::Found(record) => break record,
                Lookup::Gone => return Reading::Missing(MissingReason::NotFound),
                Lookup::NotYet if started.elapsed() < Duration::from_micros(200) => {
                    std::thread::yield_now()
                }
                Lookup::NotYet if started.elapsed() < RECORD_WAIT => {
                    std::thread::sleep(Duration::from_micros(100))
                }
                Lookup::NotYet => return Reading::Missing(MissingReason::NotFound),
            }
        };
        let values = self
            .counters
            .iter()
            .filter(|c| c.1 == group)
            .filter_map(|&(counter, _, field)| {
                field(&record).map(|value| CounterValue { counter, value })
            })
            .collect();
        Reading::Values(values)
    }
}

/// The values this source would read for a launch of `kernel` replayed through the stand-in,
/// computed from the trace directly: what the trace-replay snippet source samples. Same fields
/// and conversions as the stand-in's record (duration in whole nanoseconds, shared memory
/// saturated to 32 bits), restricted to `group`.
pub fn trace_values(kernel: &penrose_traces::Kernel, group: CounterGroup) -> Vec<CounterValue> {
    let catalogue = Catalogue::current();
    let duration_ns = {
        let ns = (kernel.dur_us * 1000.0).round();
        if ns.is_finite() && ns > 0.0 { ns } else { 0.0 }
    };
    let fields: [(&str, Option<f64>); 5] = [
        ("kernel_duration", Some(duration_ns)),
        ("achieved_occupancy", kernel.est_achieved_occupancy_pct),
        ("blocks_per_sm", kernel.blocks_per_sm),
        (
            "registers_per_thread",
            kernel.registers_per_thread.map(f64::from),
        ),
        (
            "shared_memory",
            kernel
                .shared_memory_bytes
                .map(|b| f64::from(u32::try_from(b).unwrap_or(u32::MAX))),
        ),
    ];
    fields
        .iter()
        .filter_map(|&(name, value)| {
            let c = catalogue.counter_by_name(name)?;
            (c.group == group).then_some(CounterValue {
                counter: c.id,
                value: value?,
            })
        })
        .collect()
}

/// The groups [`trace_values`] fills.
pub fn trace_groups() -> Vec<CounterGroup> {
    StandinSource::new().groups()
}
