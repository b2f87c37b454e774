//! The maps shared by all programs; their names are spelled in `penrose_ebpf_common::maps`.

use aya_ebpf::{
    macros::map,
    maps::{Array, HashMap, LruHashMap, PerCpuArray, RingBuf},
};
use penrose_ebpf_common::{GRAPH_KERNELS_ENTRIES, GraphKey, NameEvent, SampleConfig};

use crate::names::{PendingCall, PendingKey};

/// 4 MiB holds about 47,000 launch records (80 bytes plus an 8-byte header): more than one
/// capture window of one process (L = 10,000) even when the runtime's naming probe doubles the
/// records of legacy-path launches, and more than a whole replay of the largest reference
/// trace (19,370 launches) if the reader falls behind. Uprobes whose first instruction the
/// kernel emulates cost far less than a trap, so launchers can fill the ring faster than the
/// calibration suggests; 4 MiB of locked kernel memory is the price.
const EVENTS_BYTES: u32 = 1 << 22;

/// Threads that may be inside a name function at once. LRU, so a call whose return probe
/// never ran (the thread died inside it) is evicted instead of filling the map.
const PENDING_ENTRIES: u32 = 4096;

/// Every event, in order per CPU. Submitted without wake-up: the agent polls.
#[map]
pub(crate) static EVENTS: RingBuf = RingBuf::with_byte_size(EVENTS_BYTES, 0);

/// Index 0: events lost because [`EVENTS`] was full. Per-CPU so counting needs no atomics.
#[map]
pub(crate) static DROPS: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

/// Index 0: the sampling period the agent chose.
#[map]
pub(crate) static SAMPLE_CONFIG: Array<SampleConfig> = Array::with_max_entries(1, 0);

/// Index 0: this CPU's sampling word: low half, launches left until the next sampled one
/// plus one; high half, the launches of that sample's block that follow it (`sampling.rs`).
#[map]
pub(crate) static SAMPLE_COUNTDOWN: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

/// A name call's arguments, from its entry probe to its return probe on the same thread.
#[map]
pub(crate) static PENDING_CALLS: LruHashMap<PendingKey, PendingCall> =
    LruHashMap::with_max_entries(PENDING_ENTRIES, 0);

/// Index 0: where a name record is assembled; too large for the 512-byte BPF stack.
#[map]
pub(crate) static NAME_SCRATCH: PerCpuArray<NameEvent> = PerCpuArray::with_max_entries(1, 0);

/// How many kernels each executable graph runs, written by the agent (which learns graphs from
/// the graph probes), read at graph launches so the sampling countdown counts kernels.
#[map]
pub(crate) static GRAPH_KERNELS: HashMap<GraphKey, u32> =
    HashMap::with_max_entries(GRAPH_KERNELS_ENTRIES, 0);

/// Counts one event that found [`EVENTS`] full.
#[inline(always)]
pub(crate) fn count_drop() {
    if let Some(drops) = DROPS.get_ptr_mut(0) {
        // SAFETY: a per-CPU array slot, touched only by this CPU while the program runs.
        unsafe { *drops += 1 };
    }
}
