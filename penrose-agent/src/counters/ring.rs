//! The stand-in driver's per-process shared-memory ring of counter records, and its reader.
//!
//! The stand-in libcuda (test equipment, `penrose-standin`) appends one [`CounterRecord`] per
//! launch to `/dev/shm/penrose-standin-<pid>` (created by `cuInit`), carrying counter values
//! derived from the replayed trace. The agent's stand-in counter source reads it here; the
//! reader lives with the agent (the product) and the test equipment depends on it, never the
//! other way round. Layout, little-endian, mirrored by `penrose-standin/csrc/standin.c`:
//!
//! ```text
//! offset 0     RingHeader (64 bytes): magic, version, record_size, capacity, pid, head
//! offset 64    capacity x CounterRecord (80 bytes each); record i lives in slot i % capacity
//! ```
//!
//! `head` counts records ever written and is stored with release order after each record.
//! Each slot is a seqlock: the writer sets `seq` to 0, writes the fields, then stores
//! `seq = i + 1`; a reader copies the record and accepts it only if `seq` read before and after
//! the copy is `i + 1`. A reader that falls more than `capacity` records behind loses the
//! oldest ones and counts them. Records are written under one lock per process with the
//! CLOCK_MONOTONIC time taken inside it, so their timestamps never decrease with `seq`; a
//! probe's timestamp (also CLOCK_MONOTONIC, `bpf_ktime_get_ns`) is taken before its launch's
//! record, which is how [`CounterRing::find_launch`] pairs the two exactly.

// FFI: the ring is a shared-memory mapping (mmap) read with volatile copies and atomics; every
// block says why it is sound.
#![allow(unsafe_code)]

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering, fence};

use penrose_ebpf_common::EntryPoint;

/// `"PNSRING1"` read as a little-endian `u64`; 0 until the writer has filled in the header.
pub const RING_MAGIC: u64 = u64::from_le_bytes(*b"PNSRING1");
/// The ring layout (and stand-in ABI) version. 2 added `timestamp_ns` and `tid`.
pub const RING_VERSION: u32 = 2;

/// Where the ring of process `pid` lives.
pub fn ring_path(pid: u32) -> PathBuf {
    PathBuf::from(format!("/dev/shm/penrose-standin-{pid}"))
}

/// Why a ring could not be read.
#[derive(Debug, thiserror::Error)]
pub enum RingError {
    /// The file could not be opened or mapped.
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
#[derive(Clone, Copy, Debug)]
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
    /// Position in the process's launch order, from 1.
    pub seq: u64,
    /// `CUfunction` (the `CUgraphExec` for a graph launch).
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
    /// [`EntryPoint`] index.
    pub entry: u32,
    /// [`Present`] bits.
    pub present: u32,
    /// CLOCK_MONOTONIC when the stand-in wrote the record, inside the launch call.
    pub timestamp_ns: u64,
    /// The launching thread.
    pub tid: u32,
    /// Zero.
    pub reserved: u32,
}

const HEADER_SIZE: usize = std::mem::size_of::<RingHeader>();
const RECORD_SIZE: usize = std::mem::size_of::<CounterRecord>();
const _: () = assert!(HEADER_SIZE == 64);
const _: () = assert!(RECORD_SIZE == 80);

impl CounterRecord {
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

/// A read-only mapping of one process's ring, with a cursor: the agent's stand-in counter
/// source reads each launch's counters through it, tests check a replay with it.
pub struct CounterRing {
    base: *const u8,
    len: usize,
    capacity: u64,
    pid: u32,
    next: u64,
    lost: u64,
}

// SAFETY: the mapping is read-only and owned by this value; moving it to another thread is as
// safe as reading it from this one.
unsafe impl Send for CounterRing {}

impl CounterRing {
    /// Opens the ring of process `pid`, positioned at its oldest record still held.
    pub fn open(pid: u32) -> Result<Self, RingError> {
        Self::open_path(&ring_path(pid))
    }

    /// Opens a ring file by path, positioned at its oldest record still held.
    pub fn open_path(path: &Path) -> Result<Self, RingError> {
        let io = |source| RingError::Io {
            path: path.to_owned(),
            source,
        };
        let layout = |reason: String| RingError::Layout {
            path: path.to_owned(),
            reason,
        };
        let file = std::fs::File::open(path).map_err(io)?;
        let len = usize::try_from(file.metadata().map_err(io)?.len())
            .map_err(|_| layout("larger than the address space".into()))?;
        if len < HEADER_SIZE {
            return Err(layout(format!("{len} bytes, shorter than a header")));
        }
        // SAFETY: maps `len` bytes of a file we opened, read-only and shared; the mapping is
        // unmapped in Drop and never handed out beyond `self`'s lifetime.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_SHARED,
                std::os::fd::AsRawFd::as_raw_fd(&file),
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(io(std::io::Error::last_os_error()));
        }
        let mut ring = Self {
            base: base.cast(),
            len,
            capacity: 0,
            pid: 0,
            next: 0,
            lost: 0,
        };
        if ring.atomic(0).load(Ordering::Acquire) != RING_MAGIC {
            return Err(layout(
                "no ring magic (not a ring, or not initialised yet)".into(),
            ));
        }
        // SAFETY: at least 64 bytes are mapped and the magic (stored last, with release order)
        // says the header is complete; it does not change afterwards except `head`.
        let header = unsafe { std::ptr::read_volatile(ring.base.cast::<RingHeader>()) };
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
        if !header.capacity.is_power_of_two() || (len as u64) < needed {
            return Err(layout(format!(
                "capacity {} does not fit {len} bytes",
                header.capacity
            )));
        }
        ring.capacity = capacity;
        ring.pid = header.pid;
        ring.next = ring.head().saturating_sub(capacity);
        Ok(ring)
    }

    /// An atomic view of the 8 bytes at `offset` (8-aligned, inside the mapping).
    fn atomic(&self, offset: usize) -> &AtomicU64 {
        debug_assert!(offset.is_multiple_of(8) && offset + 8 <= self.len);
        // SAFETY: the mapping is page-aligned, so an 8-aligned offset is an aligned u64 that
        // lives as long as `self`; the writer updates it only with atomic stores.
        unsafe { &*self.base.add(offset).cast::<AtomicU64>() }
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
    pub fn head(&self) -> u64 {
        self.atomic(std::mem::offset_of!(RingHeader, head))
            .load(Ordering::Acquire)
    }

    /// Records this reader missed because the writer overtook it.
    pub fn lost(&self) -> u64 {
        self.lost
    }

    /// Moves the cursor past everything written so far, so later reads return only new
    /// launches.
    pub fn skip_to_head(&mut self) {
        self.next = self.head();
    }

    /// Every complete record written since the last read, oldest first.
    pub fn read_new(&mut self) -> Vec<CounterRecord> {
        let head = self.head();
        let mut out = Vec::with_capacity(usize::try_from(head - self.next).unwrap_or(0));
        while self.next < head {
            let index = self.next;
            if head - index > self.capacity {
                let skip = head - index - self.capacity;
                self.lost += skip;
                self.next += skip;
                continue;
            }
            match self.read_slot(index) {
                Some(record) => out.push(record),
                // Overwritten while we copied it: the writer lapped us.
                None => self.lost += 1,
            }
            self.next += 1;
        }
        out
    }

    /// The record of the launch a probe saw on thread `tid` at `timestamp_ns` of function
    /// `function`: the first record of that thread and function written at or after the
    /// probe's time. A thread cannot make another launch between its probe firing and its
    /// record being written, so this is that launch's own record.
    ///
    /// Launches are looked up in the order they happened; the search starts where the last
    /// one was found, so records before it are never considered again.
    pub fn find_launch(&mut self, tid: u32, function: u64, timestamp_ns: u64) -> Lookup {
        let head = self.head();
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
            match self.read_slot(mid) {
                Some(r) if r.timestamp_ns < timestamp_ns => lo = mid + 1,
                Some(_) => hi = mid,
                // Lapped mid-search: everything up to here is gone.
                None => lo = mid + 1,
            }
        }
        for index in lo..head {
            let Some(record) = self.read_slot(index) else {
                continue;
            };
            if record.tid == tid && record.function == function {
                self.next = index + 1;
                return Lookup::Found(record);
            }
        }
        if lo < head && self.records_of_thread_after(tid, lo, head) {
            // The thread has launched again since, without this launch's record.
            return Lookup::Gone;
        }
        Lookup::NotYet
    }

    fn records_of_thread_after(&self, tid: u32, from: u64, head: u64) -> bool {
        (from..head).any(|i| self.read_slot(i).is_some_and(|r| r.tid == tid))
    }

    /// Copies record `index` if its slot still holds it, completely written.
    fn read_slot(&self, index: u64) -> Option<CounterRecord> {
        let slot = usize::try_from(index & (self.capacity - 1)).ok()?;
        let offset = HEADER_SIZE + slot * RECORD_SIZE;
        let seq = self.atomic(offset);
        if seq.load(Ordering::Acquire) != index + 1 {
            return None;
        }
        // SAFETY: the slot is inside the mapping (capacity checked at open) and 8-aligned; a
        // torn copy is detected by the second `seq` load below and discarded.
        let record =
            unsafe { std::ptr::read_volatile(self.base.add(offset).cast::<CounterRecord>()) };
        fence(Ordering::Acquire);
        (seq.load(Ordering::Relaxed) == index + 1).then_some(record)
    }
}

impl Drop for CounterRing {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping made in `open_path`; nothing borrows it any more.
        unsafe {
            libc::munmap(self.base.cast_mut().cast(), self.len);
        }
    }
}

impl std::fmt::Debug for CounterRing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CounterRing")
            .field("pid", &self.pid)
            .field("capacity", &self.capacity)
            .field("next", &self.next)
            .field("lost", &self.lost)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn write_ring(dir: &Path, capacity: u32, records: &[CounterRecord], head: u64) -> PathBuf {
        let path = dir.join("ring");
        let mut bytes = Vec::new();
        bytes.extend_from_slice(&RING_MAGIC.to_le_bytes());
        bytes.extend_from_slice(&RING_VERSION.to_le_bytes());
        bytes.extend_from_slice(&(RECORD_SIZE as u32).to_le_bytes());
        bytes.extend_from_slice(&capacity.to_le_bytes());
        bytes.extend_from_slice(&77u32.to_le_bytes());
        bytes.extend_from_slice(&head.to_le_bytes());
        bytes.resize(HEADER_SIZE + capacity as usize * RECORD_SIZE, 0);
        for r in records {
            let slot = ((r.seq - 1) % u64::from(capacity)) as usize;
            let at = HEADER_SIZE + slot * RECORD_SIZE;
            let mut rec = Vec::new();
            for v in [r.seq, r.function, r.stream, r.duration_ns] {
                rec.extend_from_slice(&v.to_le_bytes());
            }
            rec.extend_from_slice(&r.est_achieved_occupancy_pct.to_le_bytes());
            rec.extend_from_slice(&r.blocks_per_sm.to_le_bytes());
            for v in [
                r.registers_per_thread,
                r.shared_memory_bytes,
                r.entry,
                r.present,
            ] {
                rec.extend_from_slice(&v.to_le_bytes());
            }
            rec.extend_from_slice(&r.timestamp_ns.to_le_bytes());
            rec.extend_from_slice(&r.tid.to_le_bytes());
            rec.extend_from_slice(&r.reserved.to_le_bytes());
            bytes[at..at + RECORD_SIZE].copy_from_slice(&rec);
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
            reserved: 0,
        }
    }

    #[test]
    fn reads_records_written_in_the_documented_layout() {
        let dir = tempfile::tempdir().unwrap();
        let records: Vec<_> = (1..=3).map(record).collect();
        let path = write_ring(dir.path(), 4, &records, 3);
        let mut ring = CounterRing::open_path(&path).unwrap();
        assert_eq!(ring.pid(), 77);
        assert_eq!(ring.read_new(), records);
        assert!(ring.read_new().is_empty());
        assert_eq!(records[0].est_achieved_occupancy_pct(), Some(50.0));
        assert_eq!(records[0].blocks_per_sm(), None);
    }

    #[test]
    fn a_lapped_reader_starts_at_the_oldest_record_still_held() {
        let dir = tempfile::tempdir().unwrap();
        // 6 written into 4 slots: records 3..=6 remain.
        let records: Vec<_> = (3..=6).map(record).collect();
        let path = write_ring(dir.path(), 4, &records, 6);
        let mut ring = CounterRing::open_path(&path).unwrap();
        assert_eq!(ring.read_new(), records);
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
        assert_eq!(ring.find_launch(101, 0xf01, 6_500), Lookup::Found(r7));
        // The cursor moved past 7: the next launch of that pair is record 13.
        assert_eq!(
            ring.find_launch(101, 0xf01, 6_600),
            Lookup::Found(records[12])
        );
        // No record of thread 101 after 16,000 ns yet.
        assert_eq!(ring.find_launch(101, 0xf01, 16_500), Lookup::NotYet);
        // Thread 100 launched (record 14) after this probe time without a record of 0xf02:
        // that launch's record is not coming.
        let mut fresh = CounterRing::open_path(&path).unwrap();
        assert_eq!(fresh.find_launch(100, 0xf09, 13_500), Lookup::Gone);
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
    }
}
