//! The stand-in libcuda's per-process ring of counter records: its layout and a reader.
//!
//! The stand-in libcuda (test equipment, `penrose-standin`) appends one [`CounterRecord`] per
//! launch to `/dev/shm/penrose-standin-<pid>` (created by `cuInit`), carrying counter values
//! derived from the replayed trace. Two sides use it: the agent's test-only counter source
//! (`capture.counters = "test-standin-ring"`) reads it, and the stand-in writes it (in C,
//! `penrose-standin/csrc/standin.c`, which mirrors this layout) and checks its own records in
//! its tests.
//!
//! Why a crate of its own: if the layout lived in the agent, the test equipment would depend on
//! the whole agent; if it lived in the stand-in, the product would depend on the test
//! equipment. `penrose-ebpf-common` is the contract between the eBPF programs and the agent
//! (`no_std`, also compiled for the BPF target by the probes' own toolchain); this ring never
//! crosses the kernel and its reader needs files, so it does not belong there. Its one job is
//! this file format.
//!
//! Layout, little-endian:
//!
//! ```text
//! offset 0     RingHeader (64 bytes): magic, version, record_size, capacity, pid, head
//! offset 64    capacity x CounterRecord (80 bytes each); record i lives in slot i % capacity
//! then         capacity x LaunchRecord (48 bytes each): record i's launch configuration
//! ```
//!
//! A graph launch (`cuGraphLaunch`) writes one record per kernel node of the executable graph,
//! in node order, back to back: each carries the node's function and counters, and its
//! [`LaunchRecord`] the node's grid, block and shared memory, the `CUgraphExec` and the node's
//! position. A kernel launch writes one record with its own configuration.
//!
//! `head` counts records ever written and is stored with release order after each record.
//! Each slot is a seqlock: the writer sets `seq` to 0, writes the fields, then stores
//! `seq = i + 1`; a reader copies the record and accepts it only if `seq` read before the copy,
//! the copy's own `seq` and `seq` read after it are all `i + 1`. A reader that falls more than
//! `capacity` records behind loses the oldest ones and counts them. Records are written under
//! one lock per process with the CLOCK_MONOTONIC time taken inside it, so their timestamps
//! never decrease with `seq`; a probe's timestamp (also CLOCK_MONOTONIC, `bpf_ktime_get_ns`)
//! is taken before its launch's record, which is how [`CounterRing::find_launch`] pairs the
//! two exactly.
//!
//! The file belongs to the process that launches (any user), and the agent reads it as root.
//! So the reader never maps it (a mapping of a file its owner truncates raises SIGBUS in the
//! reader): every read is a positional read (`pread`) of the header word or the record it
//! needs, and a file that became shorter is an error ([`RingError::Truncated`]). It is opened
//! without following symbolic links and without blocking, must be a regular file, and its
//! header must describe at most [`MAX_CAPACITY`] records.

#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used))]

use std::fs::{File, OpenOptions};
use std::io::ErrorKind;
use std::mem::{offset_of, size_of};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{Ordering, fence};

use penrose_ebpf_common::EntryPoint;

/// `"PNSRING1"` read as a little-endian `u64`; 0 until the writer has filled in the header.
pub const RING_MAGIC: u64 = u64::from_le_bytes(*b"PNSRING1");
/// The ring layout (and stand-in ABI) version. 2 added `timestamp_ns` and `tid`; 3 the
/// `device` a launch ran on; 4 the [`LaunchRecord`]s after the records, and graph launches
/// recorded per kernel node (before, one record carried the `CUgraphExec`).
pub const RING_VERSION: u32 = 4;
/// The header's size in bytes.
pub const HEADER_SIZE: usize = size_of::<RingHeader>();
/// One record's size in bytes.
pub const RECORD_SIZE: usize = size_of::<CounterRecord>();
/// One launch configuration's size in bytes.
pub const LAUNCH_RECORD_SIZE: usize = size_of::<LaunchRecord>();
/// The most slots a reader accepts (the stand-in writes 65,536): a header claiming more is
/// refused rather than searched.
pub const MAX_CAPACITY: u32 = 1 << 20;

/// The compute capability (major, minor) of the GPU the stand-in stands in for: a Hopper
/// (9.0), the generation the stand-in's traces were recorded on. The agent's test-only
/// counter source names it as the architecture its values were "read" on.
pub const COMPUTE_CAPABILITY: (u8, u8) = (9, 0);

const _: () = assert!(HEADER_SIZE == 64);
const _: () = assert!(RECORD_SIZE == 80);
const _: () = assert!(LAUNCH_RECORD_SIZE == 48);

/// The environment variable that lists the stand-in host's GPUs by compute capability, in
/// host (PCI bus) order: `9.0,9.0,8.0`; `9.0/3` is a GPU in MIG mode with three GPU instances.
/// The stand-in libcuda reads it in `cuInit`, the agent's stand-in counter source when it
/// opens; both sides must see the same value.
pub const GPUS_VAR: &str = "PENROSE_STANDIN_GPUS";

/// GPUs of a stand-in host when [`GPUS_VAR`] is unset or names none: a data-centre server's
/// eight.
pub const DEFAULT_GPUS: usize = 8;

/// The most GPU instances a stand-in GPU in MIG mode has (`MAJOR.MINOR/N`, N in 1..=7): an
/// H100's or A100's most, seven 1g slices.
pub const MAX_MIG_INSTANCES: u8 = 7;

/// The most GPUs [`GPUS_VAR`] lists; entries after that are ignored, as the stand-in's fixed
/// arrays ignore them.
const MAX_GPUS: usize = 64;

/// One GPU of the stand-in host.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StandinGpu {
    /// Its host index (NVML's index: PCI bus order).
    pub index: u32,
    /// (major, minor).
    pub compute_capability: (u8, u8),
    /// Its UUID, as `cuDeviceGetUuid` and NVML give it (for a GPU in MIG mode, too: the
    /// instances have UUIDs of their own, [`standin_mig_uuid`]).
    pub uuid: [u8; 16],
    /// GPU instances when it is in MIG mode (`9.0/3`: 3, ids 1..=3, each with one compute
    /// instance, id 0); 0 when it is not. Each instance is a CUDA device of its own.
    pub mig_instances: u8,
}

/// The UUID of the stand-in's GPU `index`: `PNSG`, zeros, then the index (big-endian).
pub fn standin_uuid(index: u32) -> [u8; 16] {
    let mut uuid = [0u8; 16];
    uuid[..4].copy_from_slice(b"PNSG");
    uuid[14] = (index >> 8) as u8;
    uuid[15] = index as u8;
    uuid
}

/// The UUID of MIG instance `gpu_instance` (compute instance 0) of the stand-in's GPU
/// `index`, as `cuDeviceGetUuid_v2` and NVML give it: `PNSM`, zeros, the parent's index
/// (big-endian) in bytes 12 and 13, the GPU instance id in byte 14, the compute instance id
/// (0) in byte 15. Distinct from every GPU UUID, so an instance is never mistaken for a GPU.
pub fn standin_mig_uuid(index: u32, gpu_instance: u32) -> [u8; 16] {
    let mut uuid = [0u8; 16];
    uuid[..4].copy_from_slice(b"PNSM");
    uuid[12] = (index >> 8) as u8;
    uuid[13] = index as u8;
    uuid[14] = gpu_instance as u8;
    uuid
}

/// The host's GPUs as `spec` (the value of [`GPUS_VAR`]) lists them, one entry per physical
/// GPU (a GPU in MIG mode included once, with its [`StandinGpu::mig_instances`]), parsed as the
/// stand-in parses it: comma-separated entries `MAJOR.MINOR` or `MAJOR.MINOR/N` (decimal
/// digits only, MAJOR at most 25, MINOR at most 9, N in 1..=[`MAX_MIG_INSTANCES`], white space
/// allowed before an entry), up to the first entry that is not one; none at all means
/// [`DEFAULT_GPUS`] of [`COMPUTE_CAPABILITY`], none partitioned.
pub fn standin_gpus(spec: Option<&str>) -> Vec<StandinGpu> {
    let mut gpus = Vec::new();
    for entry in spec.unwrap_or("").split(',') {
        match parse_gpu_entry(entry) {
            Some(gpu) if gpus.len() < MAX_GPUS => gpus.push(gpu),
            _ => break,
        }
    }
    if gpus.is_empty() {
        gpus = vec![(COMPUTE_CAPABILITY, 0); DEFAULT_GPUS];
    }
    gpus.into_iter()
        .zip(0u32..)
        .map(|((compute_capability, mig_instances), index)| StandinGpu {
            index,
            compute_capability,
            uuid: standin_uuid(index),
            mig_instances,
        })
        .collect()
}

/// One entry of [`GPUS_VAR`]: its compute capability and MIG instances (0: not in MIG mode).
fn parse_gpu_entry(entry: &str) -> Option<((u8, u8), u8)> {
    // C's isspace() set, which the stand-in skips (Rust's trim_start would skip more).
    let entry = entry.trim_start_matches([' ', '\t', '\n', '\x0b', '\x0c', '\r']);
    let (cc, instances) = match entry.split_once('/') {
        Some((cc, n)) => (cc, Some(n)),
        None => (entry, None),
    };
    let (major, minor) = cc.split_once('.')?;
    let major = decimal(major).filter(|m| *m <= 25)?;
    let minor = decimal(minor).filter(|m| *m <= 9)?;
    let mig_instances = match instances {
        None => 0,
        Some(n) => decimal(n).filter(|n| (1..=MAX_MIG_INSTANCES).contains(n))?,
    };
    Some(((major, minor), mig_instances))
}

/// A run of decimal digits and nothing else (no sign, unlike `str::parse`, as the stand-in
/// reads them); `None` when it is empty or does not fit.
fn decimal(s: &str) -> Option<u8> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

/// Where the ring of process `pid` lives.
pub fn ring_path(pid: u32) -> PathBuf {
    PathBuf::from(format!("/dev/shm/penrose-standin-{pid}"))
}

/// Why a ring could not be read.
#[derive(Debug, thiserror::Error)]
pub enum RingError {
    /// The file could not be opened or read.
    #[error("counter ring {path}: {source}")]
    Io {
        /// The ring's file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The file is not (yet) a ring of the layout this reader knows.
    #[error("counter ring {path}: {reason}")]
    Layout {
        /// The ring's file.
        path: PathBuf,
        /// What does not match.
        reason: String,
    },
    /// The file became shorter than its header says (its owner truncated it) while it was
    /// being read.
    #[error("counter ring {path}: truncated (nothing to read at offset {offset})")]
    Truncated {
        /// The ring's file.
        path: PathBuf,
        /// Where the read started.
        offset: u64,
    },
}

/// Which fields of a record (and of the stand-in's `penrose_standin_counters`) hold a value:
/// traces omit some.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Present(pub u32);

impl Present {
    /// `duration_ns` holds the kernel's duration.
    pub const DURATION: u32 = 1;
    /// `est_achieved_occupancy_pct` holds a value.
    pub const OCCUPANCY: u32 = 2;
    /// `blocks_per_sm` holds a value.
    pub const BLOCKS_PER_SM: u32 = 4;
    /// `registers_per_thread` holds a value.
    pub const REGISTERS: u32 = 8;
    /// `shared_memory_bytes` holds a value.
    pub const SHARED_MEMORY: u32 = 16;

    /// Whether `bit` is set.
    pub fn has(self, bit: u32) -> bool {
        self.0 & bit != 0
    }
}

/// The ring's first 64 bytes. Mirrors `struct ring_header`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C)]
pub struct RingHeader {
    /// [`RING_MAGIC`] once the header is complete.
    pub magic: u64,
    /// [`RING_VERSION`].
    pub version: u32,
    /// `size_of::<CounterRecord>()`.
    pub record_size: u32,
    /// Slots, a power of two.
    pub capacity: u32,
    /// The writing process.
    pub pid: u32,
    /// Records ever written.
    pub head: u64,
    /// Zero.
    pub reserved: [u64; 4],
}

/// One launch as the stand-in recorded it: the handles the probes also see, and the counter
/// values the replayer passed from the trace. Mirrors `struct ring_record`.
#[derive(Clone, Copy, Debug, PartialEq)]
#[repr(C)]
pub struct CounterRecord {
    /// Position in the process's launch order, from 1 (a graph launch has one per node).
    pub seq: u64,
    /// `CUfunction` as the launch passed it (a `CUkernel` cast as one is recorded as passed);
    /// for a graph launch, the kernel node's function.
    pub function: u64,
    /// `CUstream`.
    pub stream: u64,
    /// Kernel duration, ns.
    pub duration_ns: u64,
    /// Estimated achieved occupancy, percent.
    pub est_achieved_occupancy_pct: f64,
    /// Blocks per SM.
    pub blocks_per_sm: f64,
    /// Registers per thread.
    pub registers_per_thread: u32,
    /// Shared memory per block, bytes.
    pub shared_memory_bytes: u32,
    /// [`EntryPoint`] index (`cuGraphLaunch` or `_ptsz` for every node of a graph launch).
    pub entry: u32,
    /// [`Present`] bits.
    pub present: u32,
    /// CLOCK_MONOTONIC when the stand-in wrote the record, inside the launch call.
    pub timestamp_ns: u64,
    /// The launching thread.
    pub tid: u32,
    /// The device the launch ran on (its current context's device). Bits 0..16: the host
    /// index of the GPU, plus one (0 when the thread had no current context); bits 16..24: the
    /// MIG GPU instance id when the device is an instance of that GPU, 0 for a whole GPU.
    /// Rings written before MIG instances existed have 0 there, so they read the same (no
    /// [`RING_VERSION`] change). Read it with [`CounterRecord::host_device`] and
    /// [`CounterRecord::gpu_instance`].
    pub device: u32,
}

/// The launch configuration of the record with the same `seq`: what a probe reads from the
/// launch call's arguments, so tests can check what ran. Mirrors `struct ring_launch`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[repr(C)]
pub struct LaunchRecord {
    /// The record's `seq` when complete.
    pub seq: u64,
    /// The `CUgraphExec` of a graph launch; 0 for a kernel launch.
    pub graph_exec: u64,
    /// Grid dimensions, blocks.
    pub grid: [u32; 3],
    /// Block dimensions, threads.
    pub block: [u32; 3],
    /// The launch's (or kernel node's) `sharedMemBytes`.
    pub shared_mem_bytes: u32,
    /// A graph launch's node: its index in the executable graph plus one; 0 for a kernel
    /// launch.
    pub node: u32,
}

impl LaunchRecord {
    /// Decodes a launch record's bytes (little-endian, the `#[repr(C)]` field offsets).
    pub fn from_bytes(b: &[u8; LAUNCH_RECORD_SIZE]) -> Self {
        let dims = |at: usize| [0, 1, 2].map(|i| get_u32(b, at + 4 * i));
        Self {
            seq: get_u64(b, offset_of!(Self, seq)),
            graph_exec: get_u64(b, offset_of!(Self, graph_exec)),
            grid: dims(offset_of!(Self, grid)),
            block: dims(offset_of!(Self, block)),
            shared_mem_bytes: get_u32(b, offset_of!(Self, shared_mem_bytes)),
            node: get_u32(b, offset_of!(Self, node)),
        }
    }

    /// Encodes the launch record as the writer lays it out (tests build rings with it).
    pub fn to_bytes(&self) -> [u8; LAUNCH_RECORD_SIZE] {
        let mut b = [0u8; LAUNCH_RECORD_SIZE];
        put(&mut b, offset_of!(Self, seq), &self.seq.to_le_bytes());
        put(
            &mut b,
            offset_of!(Self, graph_exec),
            &self.graph_exec.to_le_bytes(),
        );
        for i in 0..3 {
            put(
                &mut b,
                offset_of!(Self, grid) + 4 * i,
                &self.grid[i].to_le_bytes(),
            );
            put(
                &mut b,
                offset_of!(Self, block) + 4 * i,
                &self.block[i].to_le_bytes(),
            );
        }
        put(
            &mut b,
            offset_of!(Self, shared_mem_bytes),
            &self.shared_mem_bytes.to_le_bytes(),
        );
        put(&mut b, offset_of!(Self, node), &self.node.to_le_bytes());
        b
    }

    /// The node's index in the executable graph, for a graph launch.
    pub fn graph_node(&self) -> Option<u32> {
        self.node.checked_sub(1)
    }
}

fn get_u64(bytes: &[u8], at: usize) -> u64 {
    let mut word = [0u8; 8];
    word.copy_from_slice(&bytes[at..at + 8]);
    u64::from_le_bytes(word)
}

fn get_u32(bytes: &[u8], at: usize) -> u32 {
    let mut word = [0u8; 4];
    word.copy_from_slice(&bytes[at..at + 4]);
    u32::from_le_bytes(word)
}

fn put(bytes: &mut [u8], at: usize, value: &[u8]) {
    bytes[at..at + value.len()].copy_from_slice(value);
}

impl RingHeader {
    /// Decodes the header's bytes (little-endian, the `#[repr(C)]` field offsets).
    pub fn from_bytes(b: &[u8; HEADER_SIZE]) -> Self {
        let mut reserved = [0u64; 4];
        for (i, r) in reserved.iter_mut().enumerate() {
            *r = get_u64(b, offset_of!(Self, reserved) + 8 * i);
        }
        Self {
            magic: get_u64(b, offset_of!(Self, magic)),
            version: get_u32(b, offset_of!(Self, version)),
            record_size: get_u32(b, offset_of!(Self, record_size)),
            capacity: get_u32(b, offset_of!(Self, capacity)),
            pid: get_u32(b, offset_of!(Self, pid)),
            head: get_u64(b, offset_of!(Self, head)),
            reserved,
        }
    }

    /// Encodes the header as the writer lays it out (tests build rings with it).
    pub fn to_bytes(&self) -> [u8; HEADER_SIZE] {
        let mut b = [0u8; HEADER_SIZE];
        put(&mut b, offset_of!(Self, magic), &self.magic.to_le_bytes());
        put(
            &mut b,
            offset_of!(Self, version),
            &self.version.to_le_bytes(),
        );
        put(
            &mut b,
            offset_of!(Self, record_size),
            &self.record_size.to_le_bytes(),
        );
        put(
            &mut b,
            offset_of!(Self, capacity),
            &self.capacity.to_le_bytes(),
        );
        put(&mut b, offset_of!(Self, pid), &self.pid.to_le_bytes());
        put(&mut b, offset_of!(Self, head), &self.head.to_le_bytes());
        for (i, r) in self.reserved.iter().enumerate() {
            put(&mut b, offset_of!(Self, reserved) + 8 * i, &r.to_le_bytes());
        }
        b
    }
}

impl CounterRecord {
    /// Decodes a record's bytes (little-endian, the `#[repr(C)]` field offsets).
    pub fn from_bytes(b: &[u8; RECORD_SIZE]) -> Self {
        Self {
            seq: get_u64(b, offset_of!(Self, seq)),
            function: get_u64(b, offset_of!(Self, function)),
            stream: get_u64(b, offset_of!(Self, stream)),
            duration_ns: get_u64(b, offset_of!(Self, duration_ns)),
            est_achieved_occupancy_pct: f64::from_bits(get_u64(
                b,
                offset_of!(Self, est_achieved_occupancy_pct),
            )),
            blocks_per_sm: f64::from_bits(get_u64(b, offset_of!(Self, blocks_per_sm))),
            registers_per_thread: get_u32(b, offset_of!(Self, registers_per_thread)),
            shared_memory_bytes: get_u32(b, offset_of!(Self, shared_memory_bytes)),
            entry: get_u32(b, offset_of!(Self, entry)),
            present: get_u32(b, offset_of!(Self, present)),
            timestamp_ns: get_u64(b, offset_of!(Self, timestamp_ns)),
            tid: get_u32(b, offset_of!(Self, tid)),
            device: get_u32(b, offset_of!(Self, device)),
        }
    }

    /// Encodes the record as the writer lays it out (tests build rings with it).
    pub fn to_bytes(&self) -> [u8; RECORD_SIZE] {
        let mut b = [0u8; RECORD_SIZE];
        put(&mut b, offset_of!(Self, seq), &self.seq.to_le_bytes());
        put(
            &mut b,
            offset_of!(Self, function),
            &self.function.to_le_bytes(),
        );
        put(&mut b, offset_of!(Self, stream), &self.stream.to_le_bytes());
        put(
            &mut b,
            offset_of!(Self, duration_ns),
            &self.duration_ns.to_le_bytes(),
        );
        put(
            &mut b,
            offset_of!(Self, est_achieved_occupancy_pct),
            &self.est_achieved_occupancy_pct.to_le_bytes(),
        );
        put(
            &mut b,
            offset_of!(Self, blocks_per_sm),
            &self.blocks_per_sm.to_le_bytes(),
        );
        put(
            &mut b,
            offset_of!(Self, registers_per_thread),
            &self.registers_per_thread.to_le_bytes(),
        );
        put(
            &mut b,
            offset_of!(Self, shared_memory_bytes),
            &self.shared_memory_bytes.to_le_bytes(),
        );
        put(&mut b, offset_of!(Self, entry), &self.entry.to_le_bytes());
        put(
            &mut b,
            offset_of!(Self, present),
            &self.present.to_le_bytes(),
        );
        put(
            &mut b,
            offset_of!(Self, timestamp_ns),
            &self.timestamp_ns.to_le_bytes(),
        );
        put(&mut b, offset_of!(Self, tid), &self.tid.to_le_bytes());
        put(&mut b, offset_of!(Self, device), &self.device.to_le_bytes());
        b
    }

    /// The host index of the GPU the launch ran on (the parent GPU, for a MIG instance);
    /// `None` when it ran with no context.
    pub fn host_device(&self) -> Option<u32> {
        (self.device & 0xffff).checked_sub(1)
    }

    /// The MIG GPU instance the launch ran on; `None` for a whole GPU (or no context).
    pub fn gpu_instance(&self) -> Option<u32> {
        Some((self.device >> 16) & 0xff).filter(|gi| *gi != 0)
    }

    fn field<T>(&self, bit: u32, value: T) -> Option<T> {
        Present(self.present).has(bit).then_some(value)
    }

    /// The entry point the launch came through.
    pub fn entry_point(&self) -> Option<EntryPoint> {
        EntryPoint::from_u32(self.entry)
    }

    /// Kernel duration, ns, when the replayer passed one.
    pub fn duration_ns(&self) -> Option<u64> {
        self.field(Present::DURATION, self.duration_ns)
    }

    /// Estimated achieved occupancy, percent, when the trace has it.
    pub fn est_achieved_occupancy_pct(&self) -> Option<f64> {
        self.field(Present::OCCUPANCY, self.est_achieved_occupancy_pct)
    }

    /// Blocks per SM, when the trace has it.
    pub fn blocks_per_sm(&self) -> Option<f64> {
        self.field(Present::BLOCKS_PER_SM, self.blocks_per_sm)
    }

    /// Registers per thread, when the trace has it.
    pub fn registers_per_thread(&self) -> Option<u32> {
        self.field(Present::REGISTERS, self.registers_per_thread)
    }

    /// Shared memory per block, bytes, when the trace has it.
    pub fn shared_memory_bytes(&self) -> Option<u32> {
        self.field(Present::SHARED_MEMORY, self.shared_memory_bytes)
    }
}

/// What [`CounterRing::find_launch`] concluded about one probed launch.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Lookup {
    /// The launch's own record.
    Found(CounterRecord),
    /// Not written yet (the probe fires before the driver writes): ask again later.
    NotYet,
    /// The ring no longer holds it (the writer lapped the reader), or it never existed.
    Gone,
}

/// One process's ring, open for reading, with a cursor: the agent's test-only counter source
/// reads each launch's counters through it, the stand-in's tests check a replay with it.
#[derive(Debug)]
pub struct CounterRing {
    file: File,
    path: PathBuf,
    capacity: u64,
    pid: u32,
    next: u64,
    lost: u64,
    /// Whether the file holds the launch records after the counter records.
    has_launches: bool,
}

impl CounterRing {
    /// Opens the ring of process `pid`, positioned at its oldest record still held.
    pub fn open(pid: u32) -> Result<Self, RingError> {
        Self::open_path(&ring_path(pid))
    }

    /// Opens a ring file by path, positioned at its oldest record still held. A symbolic link
    /// is not followed, and anything but a regular file is refused.
    pub fn open_path(path: &Path) -> Result<Self, RingError> {
        let io = |source| RingError::Io {
            path: path.to_owned(),
            source,
        };
        let layout = |reason: String| RingError::Layout {
            path: path.to_owned(),
            reason,
        };
        let file = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
            .open(path)
            .map_err(io)?;
        let meta = file.metadata().map_err(io)?;
        if !meta.is_file() {
            return Err(layout("not a regular file".into()));
        }
        let len = meta.len();
        let mut ring = Self {
            file,
            path: path.to_owned(),
            capacity: 0,
            pid: 0,
            next: 0,
            lost: 0,
            has_launches: false,
        };
        if len < HEADER_SIZE as u64 {
            return Err(layout(format!("{len} bytes, shorter than a header")));
        }
        let mut bytes = [0u8; HEADER_SIZE];
        ring.read_at(&mut bytes, 0)?;
        let header = RingHeader::from_bytes(&bytes);
        if header.magic != RING_MAGIC {
            return Err(layout(
                "no ring magic (not a ring, or not initialised yet)".into(),
            ));
        }
        if header.version != RING_VERSION {
            return Err(layout(format!(
                "version {}, this reader knows {RING_VERSION}",
                header.version
            )));
        }
        if header.record_size as usize != RECORD_SIZE {
            return Err(layout(format!("record size {}", header.record_size)));
        }
        let capacity = u64::from(header.capacity);
        let needed = HEADER_SIZE as u64 + capacity * RECORD_SIZE as u64;
        if !header.capacity.is_power_of_two() || header.capacity > MAX_CAPACITY || len < needed {
            return Err(layout(format!(
                "capacity {} does not fit {len} bytes (or exceeds {MAX_CAPACITY})",
                header.capacity
            )));
        }
        ring.capacity = capacity;
        ring.pid = header.pid;
        ring.has_launches = len >= needed + capacity * LAUNCH_RECORD_SIZE as u64;
        ring.next = ring.head()?.saturating_sub(capacity);
        Ok(ring)
    }

    /// Fills `buf` from `offset`; a short file is [`RingError::Truncated`].
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<(), RingError> {
        match self.file.read_exact_at(buf, offset) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == ErrorKind::UnexpectedEof => Err(RingError::Truncated {
                path: self.path.clone(),
                offset,
            }),
            Err(source) => Err(RingError::Io {
                path: self.path.clone(),
                source,
            }),
        }
    }

    fn read_u64(&self, offset: u64) -> Result<u64, RingError> {
        let mut word = [0u8; 8];
        self.read_at(&mut word, offset)?;
        Ok(u64::from_le_bytes(word))
    }

    /// The writing process.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Slots in the ring.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Records the process has written so far (its launch count since `cuInit`).
    pub fn head(&self) -> Result<u64, RingError> {
        let head = self.read_u64(offset_of!(RingHeader, head) as u64)?;
        // The records up to `head` are read after it (see `read_slot`).
        fence(Ordering::Acquire);
        Ok(head)
    }

    /// Records this reader missed because the writer overtook it.
    pub fn lost(&self) -> u64 {
        self.lost
    }

    /// Moves the cursor past everything written so far, so later reads return only new
    /// launches.
    pub fn skip_to_head(&mut self) -> Result<(), RingError> {
        self.next = self.head()?;
        Ok(())
    }

    /// Every complete record written since the last read, oldest first.
    pub fn read_new(&mut self) -> Result<Vec<CounterRecord>, RingError> {
        let head = self.head()?;
        let pending = head.saturating_sub(self.next).min(self.capacity);
        let mut out = Vec::with_capacity(usize::try_from(pending.min(4096)).unwrap_or(0));
        while self.next < head {
            let index = self.next;
            if head - index > self.capacity {
                let skip = head - index - self.capacity;
                self.lost += skip;
                self.next += skip;
                continue;
            }
            match self.read_slot(index)? {
                Some(record) => out.push(record),
                // Overwritten while we copied it: the writer lapped us.
                None => self.lost += 1,
            }
            self.next += 1;
        }
        Ok(out)
    }

    /// The record of the launch a probe saw on thread `tid` at `timestamp_ns` of function
    /// `function`: the first record of that thread and function written at or after the
    /// probe's time. A thread cannot make another launch between its probe firing and its
    /// record being written, so this is that launch's own record.
    ///
    /// Launches are looked up in the order they happened; the search starts where the last
    /// one was found, so records before it are never considered again.
    pub fn find_launch(
        &mut self,
        tid: u32,
        function: u64,
        timestamp_ns: u64,
    ) -> Result<Lookup, RingError> {
        let head = self.head()?;
        let oldest = head.saturating_sub(self.capacity);
        if self.next < oldest {
            self.lost += oldest - self.next;
            self.next = oldest;
        }
        // Records before the probe's time cannot be its launch's: skip them by binary search
        // (timestamps never decrease with the index).
        let (mut lo, mut hi) = (self.next, head);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            match self.read_slot(mid)? {
                Some(r) if r.timestamp_ns < timestamp_ns => lo = mid + 1,
                Some(_) => hi = mid,
                // Lapped mid-search: everything up to here is gone.
                None => lo = mid + 1,
            }
        }
        for index in lo..head {
            let Some(record) = self.read_slot(index)? else {
                continue;
            };
            if record.tid == tid && record.function == function {
                self.next = index + 1;
                return Ok(Lookup::Found(record));
            }
        }
        if lo < head && self.records_of_thread_after(tid, lo, head)? {
            // The thread has launched again since, without this launch's record.
            return Ok(Lookup::Gone);
        }
        Ok(Lookup::NotYet)
    }

    fn records_of_thread_after(&self, tid: u32, from: u64, head: u64) -> Result<bool, RingError> {
        for index in from..head {
            if self.read_slot(index)?.is_some_and(|r| r.tid == tid) {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// The launch configuration of the record numbered `seq` ([`CounterRecord::seq`]), if the
    /// ring still holds it completely written; `None` once the writer has lapped it, and for a
    /// ring without launch records (one a test wrote with the counter records only).
    pub fn launch_record(&self, seq: u64) -> Result<Option<LaunchRecord>, RingError> {
        let Some(index) = seq.checked_sub(1) else {
            return Ok(None);
        };
        if !self.has_launches {
            return Ok(None);
        }
        let slot = index & (self.capacity - 1);
        let offset = HEADER_SIZE as u64
            + self.capacity * RECORD_SIZE as u64
            + slot * LAUNCH_RECORD_SIZE as u64;
        if self.read_u64(offset)? != seq {
            return Ok(None);
        }
        fence(Ordering::Acquire);
        let mut bytes = [0u8; LAUNCH_RECORD_SIZE];
        self.read_at(&mut bytes, offset)?;
        let launch = LaunchRecord::from_bytes(&bytes);
        fence(Ordering::Acquire);
        let after = self.read_u64(offset)?;
        Ok((launch.seq == seq && after == seq).then_some(launch))
    }

    /// Copies record `index` if its slot still holds it, completely written: `seq` read
    /// before the copy, the copy's own `seq` and `seq` read after it must all be `index + 1`
    /// (a copy torn by the writer fails one of them). Each read is a system call of its own;
    /// the fences keep the hardware from reordering the kernel's loads across them.
    fn read_slot(&self, index: u64) -> Result<Option<CounterRecord>, RingError> {
        let slot = index & (self.capacity - 1);
        let offset = HEADER_SIZE as u64 + slot * RECORD_SIZE as u64;
        if self.read_u64(offset)? != index + 1 {
            return Ok(None);
        }
        fence(Ordering::Acquire);
        let mut bytes = [0u8; RECORD_SIZE];
        self.read_at(&mut bytes, offset)?;
        let record = CounterRecord::from_bytes(&bytes);
        fence(Ordering::Acquire);
        let after = self.read_u64(offset)?;
        Ok((record.seq == index + 1 && after == index + 1).then_some(record))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn header(capacity: u32, head: u64) -> RingHeader {
        RingHeader {
            magic: RING_MAGIC,
            version: RING_VERSION,
            record_size: RECORD_SIZE as u32,
            capacity,
            pid: 77,
            head,
            reserved: [0; 4],
        }
    }

    fn write_ring(dir: &Path, capacity: u32, records: &[CounterRecord], head: u64) -> PathBuf {
        let path = dir.join("ring");
        let mut bytes = header(capacity, head).to_bytes().to_vec();
        bytes.resize(HEADER_SIZE + capacity as usize * RECORD_SIZE, 0);
        for r in records {
            let slot = ((r.seq - 1) % u64::from(capacity)) as usize;
            let at = HEADER_SIZE + slot * RECORD_SIZE;
            bytes[at..at + RECORD_SIZE].copy_from_slice(&r.to_bytes());
        }
        std::fs::File::create(&path)
            .unwrap()
            .write_all(&bytes)
            .unwrap();
        path
    }

    fn record(seq: u64) -> CounterRecord {
        CounterRecord {
            seq,
            function: 0xf00 + seq % 3,
            stream: 7,
            duration_ns: seq * 10,
            est_achieved_occupancy_pct: 50.0,
            blocks_per_sm: 1.5,
            registers_per_thread: 64,
            shared_memory_bytes: 0,
            entry: 0,
            present: Present::DURATION | Present::OCCUPANCY,
            timestamp_ns: 1_000 * seq,
            tid: 100 + (seq % 2) as u32,
            device: 1,
        }
    }

    /// The cases the C parser (`parse_gpus` in csrc/standin.c) decides the same way.
    #[test]
    fn gpu_lists_parse_as_the_stand_in_parses_them() {
        let eight = standin_gpus(None);
        assert_eq!(eight.len(), DEFAULT_GPUS);
        assert!(
            eight
                .iter()
                .all(|g| g.compute_capability == COMPUTE_CAPABILITY && g.mig_instances == 0)
        );
        assert_eq!(standin_gpus(Some("")).len(), DEFAULT_GPUS);
        let mixed = standin_gpus(Some("9.0,9.0,8.0,x,8.6"));
        let ccs: Vec<(u8, u8)> = mixed.iter().map(|g| g.compute_capability).collect();
        assert_eq!(ccs, [(9, 0), (9, 0), (8, 0)]);
        assert_eq!(mixed[2].index, 2);
        assert_eq!(mixed[2].uuid, standin_uuid(2));
        assert_ne!(standin_uuid(1), standin_uuid(2));
        assert_eq!(&standin_uuid(300)[..4], b"PNSG");
        assert_eq!(standin_gpus(Some("26.0")).len(), DEFAULT_GPUS);
        // Trailing garbage, a sign or a second dot end the list too.
        for bad in ["9.0x", "+9.0", "9.0.1", "9. 0", "9.0 "] {
            assert_eq!(
                standin_gpus(Some(&format!("8.0,{bad},9.0"))).len(),
                1,
                "{bad}"
            );
        }
        assert_eq!(standin_gpus(Some(" \t8.0,  9.0")).len(), 2);
    }

    #[test]
    fn mig_entries_partition_a_gpu_and_bad_ones_end_the_list() {
        let gpus = standin_gpus(Some("9.0,9.0/3,8.0/2,9.0, 8.0/07"));
        let parsed: Vec<((u8, u8), u8)> = gpus
            .iter()
            .map(|g| (g.compute_capability, g.mig_instances))
            .collect();
        assert_eq!(
            parsed,
            [
                ((9, 0), 0),
                ((9, 0), 3),
                ((8, 0), 2),
                ((9, 0), 0),
                ((8, 0), 7)
            ]
        );
        // One entry per physical GPU, with the GPU's own UUID.
        assert_eq!(gpus[1].index, 1);
        assert_eq!(gpus[1].uuid, standin_uuid(1));
        for bad in [
            "9.0/0", "9.0/8", "9.0/", "9.0/x", "9.0/+3", "9.0/3x", "9.0/3/0", "9/3.0",
        ] {
            let gpus = standin_gpus(Some(&format!("8.0/2,{bad},9.0")));
            assert_eq!(gpus.len(), 1, "{bad}");
            assert_eq!(gpus[0].mig_instances, 2);
        }
        // A first entry that is bad leaves none: the default host, unpartitioned.
        let default = standin_gpus(Some("9.0/9"));
        assert_eq!(default.len(), DEFAULT_GPUS);
        assert!(default.iter().all(|g| g.mig_instances == 0));
    }

    #[test]
    fn mig_uuids_name_parent_and_instance() {
        let u = standin_mig_uuid(0x0102, 3);
        assert_eq!(&u[..4], b"PNSM");
        assert_eq!(u[4..12], [0; 8]);
        assert_eq!(u[12..], [0x01, 0x02, 3, 0]);
        assert_ne!(standin_mig_uuid(1, 2), standin_mig_uuid(1, 3));
        assert_ne!(standin_mig_uuid(1, 2), standin_mig_uuid(2, 2));
        assert_ne!(standin_mig_uuid(1, 0), standin_uuid(1));
    }

    #[test]
    fn device_field_carries_host_index_and_gpu_instance() {
        let on = |device| CounterRecord {
            device,
            ..record(1)
        };
        assert_eq!(on(0).host_device(), None);
        assert_eq!(on(0).gpu_instance(), None);
        // A ring written before MIG: host index + 1, nothing above.
        assert_eq!(on(3).host_device(), Some(2));
        assert_eq!(on(3).gpu_instance(), None);
        let instance = on(3 | (5 << 16));
        assert_eq!(instance.host_device(), Some(2));
        assert_eq!(instance.gpu_instance(), Some(5));
        assert_eq!(on(0x1_0000 | 64).host_device(), Some(63));
    }

    /// The byte layout is the C struct's, field by field (offsets of `struct ring_record`).
    #[test]
    fn the_encoding_is_the_c_layout() {
        let r = record(5);
        let b = r.to_bytes();
        assert_eq!(b[0..8], 5u64.to_le_bytes());
        assert_eq!(b[32..40], 50.0f64.to_le_bytes());
        assert_eq!(b[48..52], 64u32.to_le_bytes());
        assert_eq!(b[64..72], 5_000u64.to_le_bytes());
        assert_eq!(b[72..76], 101u32.to_le_bytes());
        assert_eq!(CounterRecord::from_bytes(&b), r);
        let h = header(16, 9);
        let hb = h.to_bytes();
        assert_eq!(hb[0..8], *b"PNSRING1");
        assert_eq!(hb[24..32], 9u64.to_le_bytes());
        assert_eq!(RingHeader::from_bytes(&hb), h);
    }

    #[test]
    fn reads_records_written_in_the_documented_layout() {
        let dir = tempfile::tempdir().unwrap();
        let records: Vec<_> = (1..=3).map(record).collect();
        let path = write_ring(dir.path(), 4, &records, 3);
        let mut ring = CounterRing::open_path(&path).unwrap();
        assert_eq!(ring.pid(), 77);
        assert_eq!(ring.read_new().unwrap(), records);
        assert!(ring.read_new().unwrap().is_empty());
        assert_eq!(records[0].est_achieved_occupancy_pct(), Some(50.0));
        assert_eq!(records[0].blocks_per_sm(), None);
    }

    #[test]
    fn launch_records_follow_the_counter_records() {
        let dir = tempfile::tempdir().unwrap();
        let capacity = 4u32;
        let records: Vec<_> = (1..=6).map(record).collect();
        let path = write_ring(dir.path(), capacity, &records[2..], 6);
        // Without the launch records (a ring written with the counter records only).
        let ring = CounterRing::open_path(&path).unwrap();
        assert_eq!(ring.launch_record(5).unwrap(), None);
        // With them: slot i % capacity after the records, each with its own seq.
        let mut bytes = std::fs::read(&path).unwrap();
        let base = bytes.len();
        bytes.resize(base + capacity as usize * LAUNCH_RECORD_SIZE, 0);
        let launch = |seq: u64| LaunchRecord {
            seq,
            graph_exec: if seq.is_multiple_of(2) { 0xe000 } else { 0 },
            grid: [seq as u32, 2, 3],
            block: [128, 1, 1],
            shared_mem_bytes: 256,
            node: (seq % 2 * seq) as u32,
        };
        for seq in 3..=6u64 {
            let at = base + ((seq - 1) % u64::from(capacity)) as usize * LAUNCH_RECORD_SIZE;
            bytes[at..at + LAUNCH_RECORD_SIZE].copy_from_slice(&launch(seq).to_bytes());
        }
        std::fs::write(&path, &bytes).unwrap();
        let ring = CounterRing::open_path(&path).unwrap();
        for seq in 3..=6 {
            assert_eq!(ring.launch_record(seq).unwrap(), Some(launch(seq)));
        }
        // Lapped (slot 1 holds 5, not 1), and never written.
        assert_eq!(ring.launch_record(1).unwrap(), None);
        assert_eq!(ring.launch_record(0).unwrap(), None);
        assert_eq!(launch(5).graph_node(), Some(4));
        assert_eq!(launch(4).graph_node(), None);
        let b = launch(3).to_bytes();
        assert_eq!(b[16..20], 3u32.to_le_bytes());
        assert_eq!(b[28..32], 128u32.to_le_bytes());
        assert_eq!(b[44..48], 3u32.to_le_bytes());
    }

    #[test]
    fn a_lapped_reader_starts_at_the_oldest_record_still_held() {
        let dir = tempfile::tempdir().unwrap();
        // 6 written into 4 slots: records 3..=6 remain.
        let records: Vec<_> = (3..=6).map(record).collect();
        let path = write_ring(dir.path(), 4, &records, 6);
        let mut ring = CounterRing::open_path(&path).unwrap();
        assert_eq!(ring.read_new().unwrap(), records);
        assert_eq!(ring.lost(), 0);
    }

    #[test]
    fn a_probed_launch_finds_its_own_record_by_thread_function_and_time() {
        let dir = tempfile::tempdir().unwrap();
        let records: Vec<_> = (1..=16).map(record).collect();
        let path = write_ring(dir.path(), 16, &records, 16);
        let mut ring = CounterRing::open_path(&path).unwrap();
        // Record 7: tid 101, function 0xf01, written at 7,000 ns; the probe fired a little
        // earlier. Record 1 has the same thread and function but is older.
        let r7 = records[6];
        assert_eq!((r7.tid, r7.function), (101, 0xf01));
        assert_eq!(
            ring.find_launch(101, 0xf01, 6_500).unwrap(),
            Lookup::Found(r7)
        );
        // The cursor moved past 7: the next launch of that pair is record 13.
        assert_eq!(
            ring.find_launch(101, 0xf01, 6_600).unwrap(),
            Lookup::Found(records[12])
        );
        // No record of thread 101 after 16,000 ns yet.
        assert_eq!(
            ring.find_launch(101, 0xf01, 16_500).unwrap(),
            Lookup::NotYet
        );
        // Thread 100 launched (record 14) after this probe time without a record of 0xf02:
        // that launch's record is not coming.
        let mut fresh = CounterRing::open_path(&path).unwrap();
        assert_eq!(fresh.find_launch(100, 0xf09, 13_500).unwrap(), Lookup::Gone);
    }

    #[test]
    fn a_file_that_is_not_a_ring_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("junk");
        std::fs::write(&path, vec![0u8; 4096]).unwrap();
        let err = CounterRing::open_path(&path).unwrap_err().to_string();
        assert!(err.contains("no ring magic"), "{err}");
        std::fs::write(&path, b"short").unwrap();
        assert!(CounterRing::open_path(&path).is_err());
        // A header that claims more slots than any stand-in writes.
        let mut bytes = header(MAX_CAPACITY * 2, 0).to_bytes().to_vec();
        bytes.resize(4096, 0);
        std::fs::write(&path, bytes).unwrap();
        let err = CounterRing::open_path(&path).unwrap_err().to_string();
        assert!(err.contains("capacity"), "{err}");
        // A directory is not a ring.
        assert!(CounterRing::open_path(dir.path()).is_err());
    }

    /// A symbolic link (a user could plant one at the ring's name) is not followed.
    #[test]
    fn a_symbolic_link_is_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let records: Vec<_> = (1..=3).map(record).collect();
        let path = write_ring(dir.path(), 4, &records, 3);
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&path, &link).unwrap();
        let err = CounterRing::open_path(&link).unwrap_err();
        assert!(matches!(err, RingError::Io { .. }), "{err}");
    }

    /// The ring's owner truncates it while the reader holds it open: every read after that is
    /// an error naming the truncation, never a crash (a mapping would raise SIGBUS here).
    #[test]
    fn a_ring_truncated_under_the_reader_is_an_error_not_a_crash() {
        let dir = tempfile::tempdir().unwrap();
        let records: Vec<_> = (1..=8).map(record).collect();
        let path = write_ring(dir.path(), 8, &records, 8);
        let mut ring = CounterRing::open_path(&path).unwrap();
        let mut searching = CounterRing::open_path(&path).unwrap();
        assert_eq!(ring.read_new().unwrap().len(), 8);
        // Cut into the records, then to nothing.
        let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        file.set_len((HEADER_SIZE + 2 * RECORD_SIZE) as u64)
            .unwrap();
        let mut fresh = CounterRing::open_path(&path);
        assert!(fresh.is_err(), "a ring shorter than its capacity opens");
        let err = searching.find_launch(101, 0xf01, 6_500).unwrap_err();
        assert!(matches!(err, RingError::Truncated { .. }), "{err}");
        assert!(err.to_string().contains("truncated"), "{err}");
        file.set_len(0).unwrap();
        let err = ring.read_new().unwrap_err();
        assert!(
            matches!(err, RingError::Truncated { offset: 24, .. }),
            "{err}"
        );
        assert!(ring.head().is_err());
        fresh = CounterRing::open_path(&path);
        assert!(fresh.is_err());
    }
}
