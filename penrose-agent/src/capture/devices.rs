//! Which GPU a launch runs on (docs/architecture.md, "Devices").
//!
//! A launch runs in its thread's current context, and a context lives on one device. The
//! context probes (`penrose_ebpf_common::ContextOp`) report, per process, which context each
//! thread made current (set, push, pop, create), which device ordinal each context is on,
//! which context each stream was created under, and which UUID the driver gave an ordinal.
//! [`Devices`] keeps that state and attributes a sampled launch to one of the host's GPUs:
//!
//! 1. the thread's current context, or, when the agent never saw the thread make one current,
//!    the context of the launch's stream (a stream belongs to the context it was created in,
//!    and the driver launches on a stream only in its own context);
//! 2. the context's CUDA ordinal;
//! 3. the ordinal's GPU: by the UUID the driver answered the process for that ordinal, or else
//!    by the process's visible devices (`CUDA_VISIBLE_DEVICES` and `CUDA_DEVICE_ORDER` in its
//!    start environment, read at its first context record, resolved against the host's GPUs:
//!    a process's ordinal is not NVML's index).
//!
//! Where a step has no certain answer the launch is [`Unattributed`], and its sample gets no
//! counter values: never another device's. Two shortcuts: a host with a single GPU, and a
//! process whose contexts were made before the agent attached but whose start environment
//! makes one GPU visible (the usual one process per GPU). State is bounded per host
//! ([`MAX_ENTRIES`]); what does not fit is counted, not kept.

use std::collections::HashMap;
use std::fmt;
use std::io::Read;

use penrose_core::gpu::GpuArch;
use penrose_ebpf_common::ContextOp;

use super::events::{Launch, Pid};
use super::mapped_file::BoundedReads;

/// Context, thread, stream and UUID entries kept for all processes together; beyond it new
/// entries are dropped and counted ([`DeviceCounts::entries_dropped`]), so processes that
/// create contexts or streams without end cannot grow the agent without end.
pub const MAX_ENTRIES: usize = 262_144;

/// Deepest context stack kept per thread (the driver's own limit is far higher, but an
/// application nests a few at most).
pub const MAX_STACK: usize = 64;

/// Most bytes of a process's start environment read for its visible devices.
pub const MAX_ENVIRON_BYTES: u64 = 256 << 10;

/// `CU_STREAM_LEGACY` and `CU_STREAM_PER_THREAD`: special handles, not streams of a context.
const SPECIAL_STREAMS: [u64; 3] = [0, 1, 2];

/// A GPU's UUID, as the driver and NVML give it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GpuUuid(pub [u8; 16]);

impl fmt::Display for GpuUuid {
    /// `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`, NVML's and `CUDA_VISIBLE_DEVICES`' spelling.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text("GPU-"))
    }
}

impl GpuUuid {
    /// Parses NVML's spelling of a GPU's UUID (`GPU-` and 32 hex digits with or without
    /// dashes).
    pub fn parse(text: &str) -> Option<Self> {
        Self::from_hex(text.strip_prefix("GPU-")?)
    }

    /// Parses NVML's spelling of a MIG instance's UUID (`MIG-` and 32 hex digits, R470 and
    /// later drivers; the older `MIG-GPU-.../gi/ci` names no UUID of its own).
    pub fn parse_mig(text: &str) -> Option<Self> {
        Self::from_hex(text.strip_prefix("MIG-")?)
    }

    fn from_hex(digits: &str) -> Option<Self> {
        let hex: Vec<u8> = digits.bytes().filter(|b| *b != b'-').collect();
        if hex.len() != 32 {
            return None;
        }
        let mut uuid = [0u8; 16];
        for (byte, pair) in uuid.iter_mut().zip(hex.chunks(2)) {
            *byte = u8::from_str_radix(std::str::from_utf8(pair).ok()?, 16).ok()?;
        }
        Some(Self(uuid))
    }

    /// `prefix` and the UUID's 32 hex digits, dashed 8-4-4-4-12.
    fn text(&self, prefix: &str) -> String {
        let mut out = String::with_capacity(prefix.len() + 36);
        out.push_str(prefix);
        for (i, byte) in self.0.iter().enumerate() {
            if matches!(i, 4 | 6 | 8 | 10) {
                out.push('-');
            }
            out.push_str(&format!("{byte:02x}"));
        }
        out
    }
}

/// A MIG instance: a slice of a GPU in MIG mode that CUDA shows as a device of its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MigInstance {
    /// The UUID of the GPU it is a slice of.
    pub parent: GpuUuid,
    /// Its GPU instance id (what NVML's MIG GPM calls take).
    pub gpu_instance: u32,
    /// Its compute instance id within the GPU instance.
    pub compute_instance: u32,
}

/// What a host device is to CUDA.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceKind {
    /// A GPU not in MIG mode: one CUDA device.
    Whole,
    /// A GPU in MIG mode: launches run on its instances, never on it. It is listed so that an
    /// answer naming it (`cuDeviceGetUuid` on an instance names its GPU) is known as no answer.
    Partitioned,
    /// A MIG instance of the GPU of the same host index.
    Instance(MigInstance),
}

/// A device of this host, as the counter source enumerates it: a GPU, or a MIG instance of
/// one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HostDevice {
    /// Its host index (NVML's index: PCI bus order); an instance has its GPU's.
    pub index: u32,
    /// Its UUID (a MIG instance's own).
    pub uuid: GpuUuid,
    /// Its compute capability (an instance's is its GPU's).
    pub arch: GpuArch,
    /// A GPU, a GPU in MIG mode, or a MIG instance.
    pub kind: DeviceKind,
}

impl HostDevice {
    /// Whether launches can run on it: a whole GPU or a MIG instance, not a partitioned GPU.
    pub fn runs_kernels(&self) -> bool {
        !matches!(self.kind, DeviceKind::Partitioned)
    }

    /// Its MIG instance, if it is one.
    pub fn instance(&self) -> Option<MigInstance> {
        match self.kind {
            DeviceKind::Instance(instance) => Some(instance),
            _ => None,
        }
    }

    /// Its UUID as NVML and `CUDA_VISIBLE_DEVICES` spell it: `MIG-...` for an instance,
    /// `GPU-...` otherwise.
    pub fn uuid_text(&self) -> String {
        match self.kind {
            DeviceKind::Instance(_) => self.uuid.text("MIG-"),
            _ => self.uuid.text("GPU-"),
        }
    }
}

/// A process's CUDA ordinal (`CUdevice`): an index into the devices *it* sees.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Ordinal(pub i32);

/// Why a launch was not attributed to a GPU; its sample gets no counter values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Unattributed {
    /// Neither the thread's current context nor the stream's is known (made before the agent
    /// attached, say).
    NoContext,
    /// The thread's current context and the stream's disagree.
    StreamConflict,
    /// The context's device ordinal is not known (created before the agent attached).
    UnknownOrdinal,
    /// The ordinal has no certain GPU: no UUID answer, and the visible devices cannot be
    /// resolved (a MIG entry, an ambiguous order, an ordinal past the list).
    UnresolvedOrdinal,
    /// The host has no GPU the counter source reads.
    NoDevices,
}

/// What the per-host device state holds and dropped, for `status`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DeviceCounts {
    /// Context records read.
    pub context_events: u64,
    /// Entries dropped because [`MAX_ENTRIES`] were held.
    pub entries_dropped: u64,
    /// Sampled launches attributed through a UUID the driver gave.
    pub by_uuid: u64,
    /// Sampled launches attributed through the process's visible devices.
    pub by_visible_devices: u64,
    /// Sampled launches attributed because the host has one GPU.
    pub single_device: u64,
    /// Sampled launches of a process whose contexts the agent never saw (made before it
    /// attached), attributed because its start environment makes one GPU visible.
    #[serde(default)]
    pub single_visible: u64,
    /// Sampled launches not attributed, by reason ([`Unattributed`]).
    pub unattributed: UnattributedCounts,
}

/// Sampled launches not attributed to a GPU, by [`Unattributed`] reason.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct UnattributedCounts {
    /// [`Unattributed::NoContext`].
    pub no_context: u64,
    /// [`Unattributed::StreamConflict`].
    pub stream_conflict: u64,
    /// [`Unattributed::UnknownOrdinal`].
    pub unknown_ordinal: u64,
    /// [`Unattributed::UnresolvedOrdinal`].
    pub unresolved_ordinal: u64,
    /// [`Unattributed::NoDevices`].
    pub no_devices: u64,
}

impl UnattributedCounts {
    fn count(&mut self, why: Unattributed) {
        let slot = match why {
            Unattributed::NoContext => &mut self.no_context,
            Unattributed::StreamConflict => &mut self.stream_conflict,
            Unattributed::UnknownOrdinal => &mut self.unknown_ordinal,
            Unattributed::UnresolvedOrdinal => &mut self.unresolved_ordinal,
            Unattributed::NoDevices => &mut self.no_devices,
        };
        *slot += 1;
    }
}

/// The devices a process sees, from its start environment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VisibleSpec {
    /// `CUDA_VISIBLE_DEVICES`, if set.
    pub visible: Option<String>,
    /// `CUDA_DEVICE_ORDER`, if set.
    pub order: Option<String>,
}

impl VisibleSpec {
    /// Reads the two variables out of a `/proc/PID/environ` image (NUL-separated).
    pub fn from_environ(environ: &[u8]) -> Self {
        let mut spec = Self {
            visible: None,
            order: None,
        };
        for entry in environ.split(|b| *b == 0) {
            let text = String::from_utf8_lossy(entry);
            if let Some(v) = text.strip_prefix("CUDA_VISIBLE_DEVICES=") {
                spec.visible = Some(v.to_owned());
            } else if let Some(v) = text.strip_prefix("CUDA_DEVICE_ORDER=") {
                spec.order = Some(v.to_owned());
            }
        }
        spec
    }

    /// The devices of the process's ordinals 0, 1, ..., as CUDA numbers them, by UUID; `None`
    /// when that cannot be known for certain. The enumeration order is PCI order (NVML's)
    /// with `CUDA_DEVICE_ORDER=PCI_BUS_ID`; CUDA's default, `FASTEST_FIRST`, is a heuristic
    /// whose order is taken as PCI order only when all the host's GPUs have one architecture.
    /// Entries are enumeration indices or UUID prefixes; the list ends at its first invalid
    /// entry, as CUDA's does. On a host with a GPU in MIG mode, only a list of MIG entries is
    /// certain: CUDA runs a process on one MIG instance, the list's first.
    pub fn resolve(&self, host: &[HostDevice]) -> Option<Vec<GpuUuid>> {
        let gpus: Vec<&HostDevice> = host.iter().filter(|d| d.instance().is_none()).collect();
        let pci_order = self.order.as_deref() == Some("PCI_BUS_ID");
        let uniform = gpus.windows(2).all(|w| w[0].arch == w[1].arch);
        let order_known = pci_order || uniform;
        let partitioned = gpus.iter().any(|d| !d.runs_kernels());
        let Some(list) = &self.visible else {
            // Which instances CUDA shows of a GPU in MIG mode is its own choice.
            return (order_known && !partitioned).then(|| gpus.iter().map(|d| d.uuid).collect());
        };
        let entries: Vec<&str> = list.split(',').map(str::trim).collect();
        let mig = entries.iter().filter(|e| e.starts_with("MIG-")).count();
        if mig > 0 {
            return (mig == entries.len()).then(|| {
                mig_entry(entries[0], host)
                    .map(|d| d.uuid)
                    .into_iter()
                    .collect()
            });
        }
        let mut out: Vec<GpuUuid> = Vec::new();
        for entry in entries {
            let device = if entry.starts_with("GPU-") {
                unique_prefix(entry, gpus.iter().copied())
            } else {
                match entry.parse::<usize>() {
                    Ok(n) if !order_known && n < gpus.len() => return None,
                    Ok(n) => gpus.get(n).copied(),
                    Err(_) => None,
                }
            };
            match device {
                // A GPU in MIG mode named whole: which of its instances CUDA takes is its own.
                Some(d) if !d.runs_kernels() => return None,
                Some(d) if !out.contains(&d.uuid) => out.push(d.uuid),
                _ => break,
            }
        }
        Some(out)
    }
}

/// The one device among `devices` whose UUID text starts with `prefix`; none when no device or
/// several match.
fn unique_prefix<'h>(
    prefix: &str,
    devices: impl Iterator<Item = &'h HostDevice>,
) -> Option<&'h HostDevice> {
    let mut matching = devices.filter(|d| d.uuid_text().starts_with(prefix));
    match (matching.next(), matching.next()) {
        (Some(d), None) => Some(d),
        _ => None,
    }
}

/// The MIG instance a `CUDA_VISIBLE_DEVICES` entry names: `MIG-<uuid prefix>`, or the older
/// `MIG-GPU-<gpu uuid>/<gpu instance>/<compute instance>`.
fn mig_entry<'h>(entry: &str, host: &'h [HostDevice]) -> Option<&'h HostDevice> {
    let instances = || host.iter().filter(|d| d.instance().is_some());
    let Some(old) = entry.strip_prefix("MIG-GPU-") else {
        return unique_prefix(entry, instances());
    };
    let mut parts = old.split('/');
    let parent = GpuUuid::parse(&format!("GPU-{}", parts.next()?))?;
    let gpu_instance: u32 = parts.next()?.parse().ok()?;
    let compute_instance: u32 = parts.next()?.parse().ok()?;
    let wanted = MigInstance {
        parent,
        gpu_instance,
        compute_instance,
    };
    instances().find(|d| d.instance() == Some(wanted))
}

/// Reads a process's start environment, bounded in bytes and, on a thread of its own, in
/// time (a process can map a never-answering FUSE file over its own environment block:
/// `mapped_file::BoundedReads`); `None` when it cannot be read (the process is gone, say: its
/// launches then have no certain device unless it asked for UUIDs).
fn read_environ(pid: Pid) -> Option<Vec<u8>> {
    static READS: std::sync::LazyLock<BoundedReads> =
        std::sync::LazyLock::new(BoundedReads::default);
    let path = std::path::PathBuf::from(format!("/proc/{}/environ", pid.0));
    let at = path.clone();
    let read = READS.run(&path, move || {
        let file = std::fs::File::open(&at).map_err(|e| e.to_string())?;
        let mut bytes = Vec::new();
        file.take(MAX_ENVIRON_BYTES)
            .read_to_end(&mut bytes)
            .map_err(|e| e.to_string())?;
        Ok(bytes)
    });
    read.map_err(|e| tracing::debug!("start environment: {e}"))
        .ok()
}

/// The UUID the driver gave an ordinal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct UuidAnswer {
    uuid: GpuUuid,
    /// From `cuDeviceGetUuid_v2`, which names a MIG instance itself (the older call names its
    /// GPU): a later answer of the older call does not replace it.
    v2: bool,
}

/// One process's contexts, threads, streams and ordinals.
#[derive(Debug, Default)]
struct ProcessDevices {
    /// Context -> the ordinal it lives on.
    contexts: HashMap<u64, Ordinal>,
    /// Thread -> its context stack, top last.
    threads: HashMap<u32, Vec<u64>>,
    /// Stream -> the context it was created in.
    streams: HashMap<u64, u64>,
    /// Ordinal -> the UUID the driver answered, and whether `cuDeviceGetUuid_v2` answered it.
    uuids: HashMap<Ordinal, UuidAnswer>,
    /// The start environment's device variables, read at the process's first context record
    /// (CUDA starting: the process is alive then, and may be gone by its first sample).
    environ: Option<VisibleSpec>,
}

impl ProcessDevices {
    fn entries(&self) -> usize {
        self.contexts.len()
            + self.threads.values().map(Vec::len).sum::<usize>()
            + self.streams.len()
            + self.uuids.len()
    }
}

/// The per-host device state: every process's contexts, streams and ordinals.
#[derive(Debug)]
pub struct Devices {
    processes: HashMap<Pid, ProcessDevices>,
    entries: usize,
    counts: DeviceCounts,
    /// Reads a process's start environment (`/proc/PID/environ`; tests give their own).
    environ_of: fn(Pid) -> Option<Vec<u8>>,
}

impl Default for Devices {
    fn default() -> Self {
        Self::with_environ(read_environ)
    }
}

/// One context record, decoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ContextChange {
    /// Process.
    pub pid: Pid,
    /// Thread.
    pub tid: u32,
    /// What happened.
    pub op: ContextOp,
    /// The context (or stream).
    pub handle: u64,
    /// The ordinal named (-1: none).
    pub device: i32,
    /// The UUID, for [`ContextOp::DeviceUuid`].
    pub uuid: [u8; 16],
}

impl Devices {
    /// Device state that reads start environments with `environ_of`.
    pub fn with_environ(environ_of: fn(Pid) -> Option<Vec<u8>>) -> Self {
        Self {
            processes: HashMap::new(),
            entries: 0,
            counts: DeviceCounts::default(),
            environ_of,
        }
    }

    /// Counts so far.
    pub fn counts(&self) -> DeviceCounts {
        self.counts
    }

    /// Entries held now, all processes together.
    pub fn entries(&self) -> usize {
        self.entries
    }

    /// Takes one context record in.
    pub fn apply(&mut self, change: ContextChange) {
        self.counts.context_events += 1;
        let full = self.entries >= MAX_ENTRIES;
        let process = process_in(&mut self.processes, self.environ_of, change.pid);
        let before = process.entries();
        let dropped = apply_to(process, &change, full);
        self.entries = self.entries + process.entries() - before;
        if dropped {
            self.counts.entries_dropped += 1;
        }
    }

    /// The process exited: its state goes.
    pub fn exited(&mut self, pid: Pid) {
        if let Some(process) = self.processes.remove(&pid) {
            self.entries = self.entries.saturating_sub(process.entries());
        }
    }

    /// The host GPU `launch` ran on, among `host` (the counter source's GPUs); a launch with
    /// none is counted by reason.
    pub fn attribute<'h>(
        &mut self,
        launch: &Launch,
        host: &'h [HostDevice],
    ) -> Result<&'h HostDevice, Unattributed> {
        let found = self.find(launch, host);
        if let Err(why) = found {
            self.counts.unattributed.count(why);
        }
        found
    }

    fn find<'h>(
        &mut self,
        launch: &Launch,
        host: &'h [HostDevice],
    ) -> Result<&'h HostDevice, Unattributed> {
        let mut runnable = host.iter().filter(|d| d.runs_kernels());
        match (runnable.next(), runnable.next()) {
            (None, _) => return Err(Unattributed::NoDevices),
            (Some(only), None) => {
                self.counts.single_device += 1;
                return Ok(only);
            }
            _ => {}
        }
        let process = process_in(&mut self.processes, self.environ_of, launch.pid);
        let visible = process.environ.as_ref().and_then(|spec| spec.resolve(host));
        let ordinal = match current_context(process, launch).and_then(|context| {
            process
                .contexts
                .get(&context)
                .copied()
                .ok_or(Unattributed::UnknownOrdinal)
        }) {
            Ok(ordinal) => ordinal,
            // Contexts made before the agent attached: a process that can see one device only
            // runs there.
            Err(why) => {
                let only = match visible.as_deref() {
                    Some([only]) => *only,
                    _ => return Err(why),
                };
                self.counts.single_visible += 1;
                return by_uuid(host, only);
            }
        };
        if let Some(answer) = process.uuids.get(&ordinal) {
            match host.iter().find(|d| d.uuid == answer.uuid) {
                Some(device) if device.runs_kernels() => {
                    self.counts.by_uuid += 1;
                    return Ok(device);
                }
                // `cuDeviceGetUuid` on a MIG instance named its GPU: the instance can still be
                // known from the visible devices.
                Some(_) => {}
                None => return Err(Unattributed::UnresolvedOrdinal),
            }
        }
        let uuid = usize::try_from(ordinal.0)
            .ok()
            .and_then(|o| visible?.get(o).copied())
            .ok_or(Unattributed::UnresolvedOrdinal)?;
        self.counts.by_visible_devices += 1;
        by_uuid(host, uuid)
    }
}

/// The host device that runs kernels with UUID `uuid`.
fn by_uuid(host: &[HostDevice], uuid: GpuUuid) -> Result<&HostDevice, Unattributed> {
    host.iter()
        .find(|d| d.uuid == uuid && d.runs_kernels())
        .ok_or(Unattributed::UnresolvedOrdinal)
}

/// A process's state in `processes`, made (with its start environment read by `environ_of`)
/// at its first record.
fn process_in(
    processes: &mut HashMap<Pid, ProcessDevices>,
    environ_of: fn(Pid) -> Option<Vec<u8>>,
    pid: Pid,
) -> &mut ProcessDevices {
    processes.entry(pid).or_insert_with(|| ProcessDevices {
        environ: environ_of(pid).map(|e| VisibleSpec::from_environ(&e)),
        ..ProcessDevices::default()
    })
}

/// The context `launch` ran in: its thread's current one, checked against its stream's.
fn current_context(process: &ProcessDevices, launch: &Launch) -> Result<u64, Unattributed> {
    let thread = process
        .threads
        .get(&launch.tid)
        .and_then(|stack| stack.last().copied());
    let stream = (!SPECIAL_STREAMS.contains(&launch.stream))
        .then(|| process.streams.get(&launch.stream).copied())
        .flatten();
    match (thread, stream) {
        (Some(t), Some(s)) if t != s => Err(Unattributed::StreamConflict),
        (Some(context), _) | (None, Some(context)) => Ok(context),
        (None, None) => Err(Unattributed::NoContext),
    }
}

/// Applies one change; true when it had to drop an entry because the host's state is full.
fn apply_to(process: &mut ProcessDevices, change: &ContextChange, full: bool) -> bool {
    let ordinal = Ordinal(change.device);
    match change.op {
        ContextOp::SetCurrent => {
            let stack = process.threads.entry(change.tid).or_default();
            match (change.handle, stack.last_mut()) {
                (0, _) => {
                    stack.pop();
                }
                (context, Some(top)) => *top = context,
                (context, None) if !full => stack.push(context),
                (_, None) => return true,
            }
            false
        }
        ContextOp::Push => push(process, change.tid, change.handle, full),
        ContextOp::Pop => {
            if let Some(stack) = process.threads.get_mut(&change.tid) {
                stack.pop();
                if stack.is_empty() {
                    process.threads.remove(&change.tid);
                }
            }
            false
        }
        ContextOp::PrimaryRetained => insert(&mut process.contexts, change.handle, ordinal, full),
        ContextOp::Created => {
            insert(&mut process.contexts, change.handle, ordinal, full)
                | push(process, change.tid, change.handle, full)
        }
        ContextOp::StreamCreated => {
            let context = process
                .threads
                .get(&change.tid)
                .and_then(|stack| stack.last().copied());
            match context {
                Some(context) => insert(&mut process.streams, change.handle, context, full),
                // Created under a context the agent never saw: unknown, and a stale entry of
                // a reused handle must not stand for it.
                None => {
                    process.streams.remove(&change.handle);
                    false
                }
            }
        }
        ContextOp::DeviceUuid | ContextOp::DeviceUuidV2 => {
            let answer = UuidAnswer {
                uuid: GpuUuid(change.uuid),
                v2: change.op == ContextOp::DeviceUuidV2,
            };
            if process
                .uuids
                .get(&ordinal)
                .is_some_and(|held| held.v2 && !answer.v2)
            {
                return false;
            }
            insert(&mut process.uuids, ordinal, answer, full)
        }
    }
}

fn push(process: &mut ProcessDevices, tid: u32, context: u64, full: bool) -> bool {
    let stack = process.threads.entry(tid).or_default();
    if full || stack.len() >= MAX_STACK {
        // The stack's top must still be right: a push that cannot be kept makes the thread's
        // context unknown rather than leave the old one current.
        process.threads.remove(&tid);
        return true;
    }
    stack.push(context);
    false
}

fn insert<K: std::hash::Hash + Eq, V>(
    map: &mut HashMap<K, V>,
    key: K,
    value: V,
    full: bool,
) -> bool {
    if full && !map.contains_key(&key) {
        return true;
    }
    map.insert(key, value);
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use penrose_ebpf_common::EntryPoint;

    /// The live reader reads this process's own start environment (through a reader thread).
    #[test]
    fn the_start_environment_is_read_through_the_bounded_reader() {
        let environ = read_environ(Pid(std::process::id())).unwrap();
        assert!(environ.split(|b| *b == 0).any(|e| e.starts_with(b"PATH=")));
        assert!(read_environ(Pid(u32::MAX)).is_none());
    }

    fn host(archs: &[(u8, u8)]) -> Vec<HostDevice> {
        archs
            .iter()
            .zip(0u32..)
            .map(|(&(major, minor), index)| HostDevice {
                index,
                uuid: GpuUuid([index as u8; 16]),
                arch: GpuArch::new(major, minor),
                kind: DeviceKind::Whole,
            })
            .collect()
    }

    /// The host indices of the devices `resolved` names, in order.
    fn indices(host: &[HostDevice], resolved: Option<Vec<GpuUuid>>) -> Option<Vec<u32>> {
        resolved.map(|uuids| {
            uuids
                .iter()
                .map(|u| host.iter().find(|d| d.uuid == *u).unwrap().index)
                .collect()
        })
    }

    fn change(tid: u32, op: ContextOp, handle: u64, device: i32) -> ContextChange {
        ContextChange {
            pid: Pid(7),
            tid,
            op,
            handle,
            device,
            uuid: [0; 16],
        }
    }

    fn launch(tid: u32, stream: u64) -> Launch {
        Launch {
            pid: Pid(7),
            tid,
            sampled: true,
            graph_position: 0,
            in_graph: false,
            timestamp_ns: 0,
            function: 0xf,
            stream,
            grid: [1; 3],
            block: [1; 3],
            shared_mem_bytes: 0,
            entry: EntryPoint::LaunchKernel,
            caller: 0,
        }
    }

    fn with_uuids(devices: &mut Devices, host: &[HostDevice], ordinals: &[(i32, usize)]) {
        for &(ordinal, index) in ordinals {
            devices.apply(ContextChange {
                uuid: host[index].uuid.0,
                ..change(1, ContextOp::DeviceUuid, 0, ordinal)
            });
        }
    }

    #[test]
    fn uuids_print_and_parse_as_nvml_spells_them() {
        let uuid = GpuUuid(*b"PNSG\0\0\0\0\0\0\0\0\0\0\x01\x02");
        let text = uuid.to_string();
        assert_eq!(text, "GPU-504e5347-0000-0000-0000-000000000102");
        assert_eq!(GpuUuid::parse(&text), Some(uuid));
        assert_eq!(GpuUuid::parse("GPU-504e"), None);
        assert_eq!(
            GpuUuid::parse("MIG-504e5347-0000-0000-0000-000000000102"),
            None
        );
    }

    #[test]
    fn a_thread_switching_devices_is_attributed_launch_by_launch() {
        let host = host(&[(9, 0); 4]);
        let mut devices = Devices::with_environ(|_| None);
        with_uuids(&mut devices, &host, &[(0, 2), (1, 3)]);
        devices.apply(change(1, ContextOp::PrimaryRetained, 0xa, 0));
        devices.apply(change(1, ContextOp::PrimaryRetained, 0xb, 1));
        devices.apply(change(1, ContextOp::SetCurrent, 0xa, -1));
        assert_eq!(
            devices.attribute(&launch(1, 0), &host).map(|d| d.index),
            Ok(2)
        );
        devices.apply(change(1, ContextOp::SetCurrent, 0xb, -1));
        assert_eq!(
            devices.attribute(&launch(1, 0), &host).map(|d| d.index),
            Ok(3)
        );
        devices.apply(change(1, ContextOp::Push, 0xa, -1));
        assert_eq!(
            devices.attribute(&launch(1, 0), &host).map(|d| d.index),
            Ok(2)
        );
        devices.apply(change(1, ContextOp::Pop, 0, -1));
        assert_eq!(
            devices.attribute(&launch(1, 0), &host).map(|d| d.index),
            Ok(3)
        );
        // Another thread has made nothing current.
        assert_eq!(
            devices.attribute(&launch(2, 0), &host),
            Err(Unattributed::NoContext)
        );
        assert_eq!(devices.counts().by_uuid, 4);
    }

    #[test]
    fn streams_name_their_context_and_a_conflict_is_refused() {
        let host = host(&[(9, 0); 2]);
        let mut devices = Devices::with_environ(|_| None);
        with_uuids(&mut devices, &host, &[(0, 0), (1, 1)]);
        devices.apply(change(1, ContextOp::Created, 0xa, 0));
        devices.apply(change(1, ContextOp::StreamCreated, 0x5a, -1));
        devices.apply(change(1, ContextOp::Created, 0xb, 1));
        devices.apply(change(1, ContextOp::StreamCreated, 0x5b, -1));
        // A thread the agent never saw, launching on a known stream: the stream's context.
        assert_eq!(
            devices.attribute(&launch(9, 0x5a), &host).map(|d| d.index),
            Ok(0)
        );
        // The creating thread's current context is 0xb; a launch on 0xa's stream conflicts.
        assert_eq!(
            devices.attribute(&launch(1, 0x5a), &host),
            Err(Unattributed::StreamConflict)
        );
        assert_eq!(
            devices.attribute(&launch(1, 0x5b), &host).map(|d| d.index),
            Ok(1)
        );
        assert_eq!(
            devices.attribute(&launch(1, 0), &host).map(|d| d.index),
            Ok(1)
        );
        assert_eq!(
            devices.attribute(&launch(9, 0x77), &host),
            Err(Unattributed::NoContext)
        );
    }

    #[test]
    fn a_context_of_unknown_ordinal_or_a_process_never_seen_gets_no_device() {
        let host = host(&[(9, 0); 2]);
        let mut devices = Devices::with_environ(|_| None);
        assert_eq!(
            devices.attribute(&launch(1, 0), &host),
            Err(Unattributed::NoContext)
        );
        devices.apply(change(1, ContextOp::SetCurrent, 0xa, -1));
        assert_eq!(
            devices.attribute(&launch(1, 0), &host),
            Err(Unattributed::UnknownOrdinal)
        );
        // One GPU: nothing else it could be.
        assert_eq!(
            devices
                .attribute(&launch(5, 9), &host[..1])
                .map(|d| d.index),
            Ok(0)
        );
        assert_eq!(
            devices.attribute(&launch(1, 0), &[]),
            Err(Unattributed::NoDevices)
        );
    }

    /// A process whose contexts the agent never saw (started before it attached) is
    /// attributed only when its start environment makes a single GPU visible.
    #[test]
    fn a_process_started_before_the_agent_is_attributed_only_to_its_one_visible_gpu() {
        let host = host(&[(9, 0); 8]);
        let mut pinned = Devices::with_environ(|_| Some(b"CUDA_VISIBLE_DEVICES=5\0".to_vec()));
        assert_eq!(
            pinned.attribute(&launch(1, 0), &host).map(|d| d.index),
            Ok(5)
        );
        assert_eq!(pinned.counts().single_visible, 1);
        // A context it was seen to make on another ordinal is not overruled by the shortcut
        // (ordinal 0 of a one-GPU list is that GPU; ordinal 1 exists nowhere).
        pinned.apply(change(2, ContextOp::Created, 0xa, 1));
        assert_eq!(
            pinned.attribute(&launch(2, 0), &host),
            Err(Unattributed::UnresolvedOrdinal)
        );
        let mut all = Devices::with_environ(|_| Some(b"HOME=/\0".to_vec()));
        assert_eq!(
            all.attribute(&launch(1, 0), &host),
            Err(Unattributed::NoContext)
        );
        let mut two = Devices::with_environ(|_| Some(b"CUDA_VISIBLE_DEVICES=1,2\0".to_vec()));
        assert_eq!(
            two.attribute(&launch(1, 0), &host),
            Err(Unattributed::NoContext)
        );
        assert_eq!(two.counts().unattributed.no_context, 1);
    }

    /// GPU 0 whole, GPU 1 in MIG mode with instances 1 and 2, GPU 2 whole; all Hoppers.
    fn mig_host() -> Vec<HostDevice> {
        let mut host = host(&[(9, 0); 3]);
        host[1].kind = DeviceKind::Partitioned;
        for gpu_instance in [1u32, 2] {
            let mut uuid = [0xa0; 16];
            uuid[15] = gpu_instance as u8;
            host.push(HostDevice {
                index: 1,
                uuid: GpuUuid(uuid),
                arch: host[1].arch,
                kind: DeviceKind::Instance(MigInstance {
                    parent: host[1].uuid,
                    gpu_instance,
                    compute_instance: 0,
                }),
            });
        }
        host
    }

    #[test]
    fn mig_entries_name_one_instance_and_a_partitioned_gpu_named_whole_is_unknown() {
        let host = mig_host();
        let spec = |visible: Option<&str>| VisibleSpec {
            visible: visible.map(str::to_owned),
            order: Some("PCI_BUS_ID".to_owned()),
        };
        let second = host[4].uuid_text();
        assert!(second.starts_with("MIG-a0a0a0a0-"), "{second}");
        assert_eq!(GpuUuid::parse_mig(&second), Some(host[4].uuid));
        assert_eq!(spec(Some(&second)).resolve(&host), Some(vec![host[4].uuid]));
        let old_form = format!("MIG-{}/2/0", host[1].uuid);
        assert_eq!(
            spec(Some(&old_form)).resolve(&host),
            Some(vec![host[4].uuid])
        );
        // CUDA runs a process on one instance, the list's first.
        let both = format!("{},{}", host[3].uuid_text(), second);
        assert_eq!(spec(Some(&both)).resolve(&host), Some(vec![host[3].uuid]));
        // An instance that does not exist ends the list; the old form needs its compute
        // instance.
        assert_eq!(spec(Some("MIG-ffff")).resolve(&host), Some(vec![]));
        let no_ci = format!("MIG-{}/2", host[1].uuid);
        assert_eq!(spec(Some(&no_ci)).resolve(&host), Some(vec![]));
        // GPUs and instances mixed, a GPU in MIG mode named whole, or no list at all: which
        // instance CUDA takes is its own choice.
        let mixed = format!("0,{second}");
        assert_eq!(spec(Some(&mixed)).resolve(&host), None);
        assert_eq!(spec(Some("1")).resolve(&host), None);
        assert_eq!(spec(Some(&host[1].uuid.to_string())).resolve(&host), None);
        assert_eq!(spec(None).resolve(&host), None);
        // Whole GPUs named alone resolve as before, numbered among the GPUs, not instances.
        assert_eq!(
            spec(Some("2,0")).resolve(&host),
            Some(vec![host[2].uuid, host[0].uuid])
        );
    }

    #[test]
    fn a_launch_on_a_mig_instance_is_attributed_to_the_instance_never_its_gpu() {
        let host = mig_host();
        let answer = |devices: &mut Devices, op: ContextOp, uuid: GpuUuid| {
            devices.apply(ContextChange {
                uuid: uuid.0,
                ..change(1, op, 0, 0)
            });
        };
        let on_ordinal_0 = |devices: &mut Devices| {
            devices.apply(change(1, ContextOp::PrimaryRetained, 0xc0, 0));
            devices.apply(change(1, ContextOp::SetCurrent, 0xc0, 0));
        };
        // cuDeviceGetUuid_v2 names the instance itself, and a later older call (naming the
        // GPU) does not replace it.
        let mut devices = Devices::with_environ(|_| None);
        on_ordinal_0(&mut devices);
        answer(&mut devices, ContextOp::DeviceUuidV2, host[4].uuid);
        answer(&mut devices, ContextOp::DeviceUuid, host[1].uuid);
        assert_eq!(devices.attribute(&launch(1, 0), &host), Ok(&host[4]));
        assert_eq!(devices.counts().by_uuid, 1);
        // The older call names the partitioned GPU: no device, unless the environment names
        // the instance.
        let mut devices = Devices::with_environ(|_| None);
        on_ordinal_0(&mut devices);
        answer(&mut devices, ContextOp::DeviceUuid, host[1].uuid);
        assert_eq!(
            devices.attribute(&launch(1, 0), &host),
            Err(Unattributed::UnresolvedOrdinal)
        );
        let mut devices = Devices::with_environ(|_| {
            let mut environ = b"CUDA_VISIBLE_DEVICES=".to_vec();
            environ.extend_from_slice(mig_host()[3].uuid_text().as_bytes());
            Some(environ)
        });
        on_ordinal_0(&mut devices);
        answer(&mut devices, ContextOp::DeviceUuid, host[1].uuid);
        assert_eq!(devices.attribute(&launch(1, 0), &host), Ok(&host[3]));
        assert_eq!(devices.counts().by_visible_devices, 1);
        // A GPU in MIG mode with one instance is a host of one device.
        let single = vec![host[1], host[3]];
        let mut devices = Devices::with_environ(|_| None);
        assert_eq!(devices.attribute(&launch(1, 0), &single), Ok(&single[1]));
        assert_eq!(devices.counts().single_device, 1);
    }

    #[test]
    fn visible_devices_renumber_as_cuda_does() {
        let uniform = host(&[(9, 0); 4]);
        let spec = |visible: Option<&str>, order: Option<&str>| VisibleSpec {
            visible: visible.map(str::to_owned),
            order: order.map(str::to_owned),
        };
        assert_eq!(
            indices(&uniform, spec(None, None).resolve(&uniform)),
            Some(vec![0, 1, 2, 3])
        );
        assert_eq!(
            indices(&uniform, spec(Some("3,1"), None).resolve(&uniform)),
            Some(vec![3, 1])
        );
        // The list ends at its first invalid entry (an unknown index, a repeat, junk).
        assert_eq!(
            indices(&uniform, spec(Some("2,9,1"), None).resolve(&uniform)),
            Some(vec![2])
        );
        assert_eq!(
            indices(&uniform, spec(Some("2,2,1"), None).resolve(&uniform)),
            Some(vec![2])
        );
        assert_eq!(
            indices(&uniform, spec(Some("x"), None).resolve(&uniform)),
            Some(vec![])
        );
        let by_uuid = uniform[3].uuid.to_string();
        assert_eq!(
            indices(&uniform, spec(Some(&by_uuid[..12]), None).resolve(&uniform)),
            Some(vec![3])
        );
        assert_eq!(
            indices(&uniform, spec(Some("MIG-1234"), None).resolve(&uniform)),
            Some(vec![])
        );
        // Mixed architectures: FASTEST_FIRST's order is CUDA's heuristic, not known here.
        let mixed = host(&[(8, 0), (9, 0)]);
        assert_eq!(indices(&mixed, spec(None, None).resolve(&mixed)), None);
        assert_eq!(indices(&mixed, spec(Some("0"), None).resolve(&mixed)), None);
        assert_eq!(
            indices(
                &mixed,
                spec(Some("1,0"), Some("PCI_BUS_ID")).resolve(&mixed)
            ),
            Some(vec![1, 0])
        );
        let by_uuid = mixed[1].uuid.to_string();
        assert_eq!(
            indices(&mixed, spec(Some(&by_uuid), None).resolve(&mixed)),
            Some(vec![1])
        );
        let environ = b"HOME=/root\0CUDA_VISIBLE_DEVICES=3,1\0CUDA_DEVICE_ORDER=PCI_BUS_ID\0";
        assert_eq!(
            VisibleSpec::from_environ(environ),
            spec(Some("3,1"), Some("PCI_BUS_ID"))
        );
    }

    #[test]
    fn the_state_is_bounded_per_host_and_exits_free_it() {
        let mut devices = Devices::with_environ(|_| None);
        for i in 0..(MAX_ENTRIES as u64 + 10) {
            devices.apply(ContextChange {
                pid: Pid((i % 3) as u32),
                ..change(1, ContextOp::PrimaryRetained, 0x1000 + i, 0)
            });
        }
        assert_eq!(devices.entries(), MAX_ENTRIES);
        assert_eq!(devices.counts().entries_dropped, 10);
        devices.exited(Pid(0));
        devices.exited(Pid(1));
        devices.exited(Pid(2));
        assert_eq!(devices.entries(), 0);
    }
}
