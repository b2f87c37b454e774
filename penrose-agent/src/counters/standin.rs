//! Counter values for launches made through the stand-in driver, read from its ring. Test
//! equipment: used only with `capture.counters = "test-standin-ring"` (tests and the demo).
//!
//! The stand-in writes, for every launch, values the replayer took from the trace (duration,
//! estimated achieved occupancy, blocks per SM, registers per thread, shared memory). Those map
//! onto the catalogue's per-launch group; the other groups (SM, tensor and DRAM activity, L2
//! hit rate) have no source in a trace, so this source does not offer them.
//!
//! The stand-in host has several GPUs (`PENROSE_STANDIN_GPUS`, default eight Hoppers; the
//! stand-in libcuda reads the same variable), and stamps each record with the GPU the launch
//! ran on, or the MIG instance where a GPU is partitioned (`9.0/3`: three instances). This
//! source reads device d's counters as the records stamped d: a launch the agent attributes to
//! another GPU or instance than the one it ran on finds nothing there
//! ([`MissingReason::NotFound`]), as GPM on the wrong GPU would have read the wrong activity.
//! A file [`busy_path`] marks GPU d's counters as held by another tool
//! ([`MissingReason::CountersBusy`]) while it exists.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use penrose_core::counters::{Catalogue, CounterGroup, CounterId};
use penrose_core::gpu::GpuArch;

use super::{CounterSource, CounterValue, MissingReason, Reading};
use crate::capture::devices::{DeviceKind, GpuUuid, HostDevice, MigInstance};
use crate::capture::events::{Launch, Pid};
use penrose_standin_ring::{CounterRecord, CounterRing, Lookup};

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

/// The compute capability the stand-in names for the GPU it stands in for
/// ([`penrose_standin_ring::COMPUTE_CAPABILITY`], a Hopper): test equipment's architecture,
/// named explicitly, never a product fallback.
pub fn standin_arch() -> GpuArch {
    let (major, minor) = penrose_standin_ring::COMPUTE_CAPABILITY;
    GpuArch::new(major, minor)
}

/// While this file exists, the stand-in GPU `index`'s counters count as held by another tool.
pub fn busy_path(index: u32) -> std::path::PathBuf {
    std::path::PathBuf::from(format!("/dev/shm/penrose-standin-busy-{index}"))
}

/// The stand-in host's devices, as `PENROSE_STANDIN_GPUS` in this process's environment lists
/// them (the stand-in libcuda of the launching processes must see the same value): each GPU,
/// and after a GPU in MIG mode (`9.0/3`) its instances, as NVML enumerates them.
pub fn standin_devices() -> Vec<HostDevice> {
    let spec = std::env::var(penrose_standin_ring::GPUS_VAR).ok();
    penrose_standin_ring::standin_gpus(spec.as_deref())
        .into_iter()
        .flat_map(|g| {
            let gpu = HostDevice {
                index: g.index,
                uuid: GpuUuid(g.uuid),
                arch: GpuArch::new(g.compute_capability.0, g.compute_capability.1),
                kind: DeviceKind::Whole,
            };
            if g.mig_instances == 0 {
                return vec![gpu];
            }
            let instances = (1..=u32::from(g.mig_instances)).map(move |gpu_instance| HostDevice {
                uuid: GpuUuid(penrose_standin_ring::standin_mig_uuid(
                    g.index,
                    gpu_instance,
                )),
                kind: DeviceKind::Instance(MigInstance {
                    parent: gpu.uuid,
                    gpu_instance,
                    compute_instance: 0,
                }),
                ..gpu
            });
            std::iter::once(HostDevice {
                kind: DeviceKind::Partitioned,
                ..gpu
            })
            .chain(instances)
            .collect()
        })
        .collect()
}

/// Per-process rings of the stand-in driver.
#[derive(Debug)]
pub struct StandinSource {
    rings: HashMap<Pid, Option<CounterRing>>,
    counters: Vec<(CounterId, CounterGroup, Field)>,
    devices: Vec<HostDevice>,
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
            devices: standin_devices(),
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
        "test-standin-ring"
    }

    fn groups(&self) -> Vec<CounterGroup> {
        super::distinct_groups(self.counters.iter().map(|c| c.1))
    }

    fn devices(&self) -> &[HostDevice] {
        &self.devices
    }

    fn watch(&mut self, pid: Pid) {
        let _ = self.ring(pid);
    }

    fn forget(&mut self, pid: Pid) {
        self.rings.remove(&pid);
    }

    fn read(&mut self, launch: &Launch, device: &HostDevice, group: CounterGroup) -> Reading {
        if !self.counters.iter().any(|c| c.1 == group) {
            return Reading::Missing(MissingReason::GroupNotSupported);
        }
        if busy_path(device.index).exists() {
            return Reading::Missing(MissingReason::CountersBusy);
        }
        let Some(ring) = self.ring(launch.pid) else {
            return Reading::Missing(MissingReason::NoSource);
        };
        let started = Instant::now();
        let record = loop {
            match ring.find_launch(launch.tid, launch.function, launch.timestamp_ns) {
                // A graph runs a kernel at several nodes: its own node's record, not the first.
                Ok(Lookup::Found(record)) if !is_own_node(ring, launch, &record) => continue,
                Ok(Lookup::Found(record)) => break record,
                Ok(Lookup::Gone) => return Reading::Missing(MissingReason::NotFound),
                Ok(Lookup::NotYet) if started.elapsed() < Duration::from_micros(200) => {
                    std::thread::yield_now()
                }
                Ok(Lookup::NotYet) if started.elapsed() < RECORD_WAIT => {
                    std::thread::sleep(Duration::from_micros(100))
                }
                Ok(Lookup::NotYet) => return Reading::Missing(MissingReason::NotFound),
                Err(e) => {
                    // Truncated or gone under us (its owner controls the file): this
                    // process's ring is not read again.
                    tracing::debug!("pid {}: {e}", launch.pid.0);
                    self.rings.insert(launch.pid, None);
                    return Reading::Missing(MissingReason::DeviceError);
                }
            }
        };
        let ran_on = (record.host_device(), record.gpu_instance());
        if ran_on
            != (
                Some(device.index),
                device.instance().map(|i| i.gpu_instance),
            )
        {
            return Reading::Missing(MissingReason::NotFound);
        }
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

/// Whether `record` is the one of `launch`: always for a kernel launch; for a kernel of an
/// expanded graph launch, when the record's launch record names the same node (a ring without
/// launch records cannot tell, and is taken at its word).
fn is_own_node(ring: &CounterRing, launch: &Launch, record: &CounterRecord) -> bool {
    if !launch.in_graph {
        return true;
    }
    match ring.launch_record(record.seq) {
        Ok(Some(written)) => written.graph_node() == Some(launch.graph_position),
        Ok(None) | Err(_) => true,
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use std::io::Write;

    use penrose_ebpf_common::EntryPoint;
    use penrose_standin_ring::{
        HEADER_SIZE, Present, RECORD_SIZE, RING_MAGIC, RING_VERSION, RingHeader, ring_path,
    };

    use super::*;

    /// Removes the ring file however the test ends.
    struct Remove(std::path::PathBuf);

    impl Drop for Remove {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }

    fn launch(pid: u32, timestamp_ns: u64) -> Launch {
        Launch {
            pid: Pid(pid),
            tid: 100,
            sampled: true,
            graph_position: 0,
            in_graph: false,
            timestamp_ns,
            function: 0xf00,
            stream: 0,
            grid: [1, 1, 1],
            block: [32, 1, 1],
            shared_mem_bytes: 0,
            entry: EntryPoint::ALL[0],
            caller: 0,
        }
    }

    /// The ring's owner (any user) truncates it while the agent reads it: the sampled launch
    /// has no values (counted as a device error), the agent stops reading that ring, and
    /// nothing crashes (the mapping this reader used before raised SIGBUS here).
    #[test]
    fn a_ring_truncated_while_the_agent_reads_it_gives_no_values_not_a_crash() {
        // This test process's pid: no stand-in is loaded in the agent's unit tests.
        let pid = std::process::id();
        let path = ring_path(pid);
        let _remove = Remove(path.clone());
        let capacity = 16u32;
        let header = RingHeader {
            magic: RING_MAGIC,
            version: RING_VERSION,
            record_size: RECORD_SIZE as u32,
            capacity,
            pid,
            head: 4,
            reserved: [0; 4],
        };
        let mut bytes = header.to_bytes().to_vec();
        bytes.resize(HEADER_SIZE + capacity as usize * RECORD_SIZE, 0);
        for seq in 1..=4u64 {
            let record = CounterRecord {
                seq,
                function: 0xf00,
                stream: 0,
                duration_ns: 1_000 * seq,
                est_achieved_occupancy_pct: 0.0,
                blocks_per_sm: 0.0,
                registers_per_thread: 0,
                shared_memory_bytes: 0,
                entry: 0,
                present: Present::DURATION,
                timestamp_ns: 1_000 * seq,
                tid: 100,
                device: 1,
            };
            let at = HEADER_SIZE + (seq as usize - 1) * RECORD_SIZE;
            bytes[at..at + RECORD_SIZE].copy_from_slice(&record.to_bytes());
        }
        std::fs::File::create(&path)
            .unwrap()
            .write_all(&bytes)
            .unwrap();
        let catalogue = Catalogue::current();
        let duration = catalogue.counter_by_name("kernel_duration").unwrap();
        let mut source = StandinSource::new();
        source.watch(Pid(pid));
        // The probe fired just before record 2 was written.
        match source.read(&launch(pid, 1_500), &standin_devices()[0], duration.group) {
            Reading::Values(values) => assert!(
                values
                    .iter()
                    .any(|v| v.counter == duration.id && v.value == 2_000.0),
                "{values:?}"
            ),
            other => panic!("{other:?}"),
        }
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(0)
            .unwrap();
        assert_eq!(
            source.read(&launch(pid, 2_500), &standin_devices()[0], duration.group),
            Reading::Missing(MissingReason::DeviceError)
        );
        // Forgotten: later launches of that process are not looked up in it again.
        assert_eq!(
            source.read(&launch(pid, 3_500), &standin_devices()[0], duration.group),
            Reading::Missing(MissingReason::NoSource)
        );
    }
}
