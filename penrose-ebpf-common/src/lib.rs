//! Event types that cross the ring buffer between the eBPF programs and the agent.
//!
//! Both sides compile this crate, so a layout change is a compile-time change on both sides;
//! `#[repr(C)]` keeps the layout the one the BPF verifier and the agent agree on.
#![no_std]

/// Names of the maps in the compiled object, so the loader looks them up by the same spelling.
pub mod maps {
    /// The ring buffer every event goes through.
    pub const EVENTS: &str = "EVENTS";
    /// Per-CPU `u64`, index 0: events the ring buffer had no room for.
    pub const DROPS: &str = "DROPS";
    /// Array of one [`crate::SampleConfig`], written by the agent.
    pub const SAMPLE_CONFIG: &str = "SAMPLE_CONFIG";
    /// Per-CPU `u64`, index 0: launches left until the next sampled one on this CPU. The agent
    /// may seed it with a random offset; the programs reload it from [`crate::SampleConfig`].
    pub const SAMPLE_COUNTDOWN: &str = "SAMPLE_COUNTDOWN";
}

/// Names of the programs in the compiled object, one per probed entry point.
pub mod programs {
    /// Uprobe on `cuLaunchKernel`.
    pub const CU_LAUNCH_KERNEL: &str = "cu_launch_kernel";
    /// Uprobe on `cuLaunchKernel_ptsz` (per-thread default stream; same arguments).
    pub const CU_LAUNCH_KERNEL_PTSZ: &str = "cu_launch_kernel_ptsz";
}

/// Launch entry points, as carried in [`LaunchEvent::entry_point`].
///
/// The discriminant is the wire value; new entry points get new values, old ones keep theirs.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EntryPoint {
    /// `cuLaunchKernel`.
    LaunchKernel = 0,
    /// `cuLaunchKernel_ptsz`.
    LaunchKernelPtsz = 1,
}

impl EntryPoint {
    /// The driver symbol this entry point is attached to.
    pub const fn symbol(self) -> &'static str {
        match self {
            Self::LaunchKernel => "cuLaunchKernel",
            Self::LaunchKernelPtsz => "cuLaunchKernel_ptsz",
        }
    }

    /// The program in the compiled object that probes this entry point.
    pub const fn program(self) -> &'static str {
        match self {
            Self::LaunchKernel => programs::CU_LAUNCH_KERNEL,
            Self::LaunchKernelPtsz => programs::CU_LAUNCH_KERNEL_PTSZ,
        }
    }

    /// Decodes [`LaunchEvent::entry_point`]; `None` for a value this build does not know.
    pub const fn from_u32(value: u32) -> Option<Self> {
        match value {
            0 => Some(Self::LaunchKernel),
            1 => Some(Self::LaunchKernelPtsz),
            _ => None,
        }
    }
}

/// Sampling settings the agent writes into [`maps::SAMPLE_CONFIG`].
///
/// Counting happens in BPF so that user space sees which launch was sampled without having
/// to receive (or count) every launch itself.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SampleConfig {
    /// Sample one launch in `period` on each CPU; 0 disables sampling.
    pub period: u64,
}

/// What a ring-buffer record describes; the first field of every record.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventKind {
    /// A kernel launch through one of the launch entry points.
    Launch = 1,
    /// A function handle resolved to a kernel name.
    Name = 2,
    /// A process exited; its per-process state can be dropped.
    Exit = 3,
}

/// One kernel launch as the uprobe saw it.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LaunchEvent {
    /// Always [`EventKind::Launch`] as `u32`.
    pub kind: u32,
    /// Process id (tgid) of the launching process.
    pub pid: u32,
    /// Thread id of the launching thread.
    pub tid: u32,
    /// Non-zero when the BPF-side countdown marked this launch for sampling.
    pub sampled: u32,
    /// `bpf_ktime_get_ns` at the probe.
    pub timestamp_ns: u64,
    /// The `CUfunction` handle (or graph handle for graph launches).
    pub function: u64,
    /// The `CUstream` handle.
    pub stream: u64,
    /// Grid dimensions.
    pub grid: [u32; 3],
    /// Block dimensions.
    pub block: [u32; 3],
    /// Dynamic shared memory in bytes.
    pub shared_mem_bytes: u32,
    /// Which entry point fired (index into the agent's list of launch symbols).
    pub entry_point: u32,
}

// Both sides read the record by size and offset; a change here must be deliberate.
const _: () = assert!(core::mem::size_of::<LaunchEvent>() == 72);
const _: () = assert!(core::mem::align_of::<LaunchEvent>() == 8);

#[cfg(test)]
mod tests {
    use core::mem::offset_of;

    use super::*;

    #[test]
    fn entry_points_round_trip_through_their_wire_value() {
        for entry in [EntryPoint::LaunchKernel, EntryPoint::LaunchKernelPtsz] {
            assert_eq!(EntryPoint::from_u32(entry as u32), Some(entry));
            assert!(entry.symbol().starts_with("cuLaunch"));
        }
        assert_eq!(EntryPoint::from_u32(u32::MAX), None);
    }

    #[test]
    fn launch_event_offsets_are_the_ones_the_object_was_built_with() {
        assert_eq!(offset_of!(LaunchEvent, sampled), 12);
        assert_eq!(offset_of!(LaunchEvent, timestamp_ns), 16);
        assert_eq!(offset_of!(LaunchEvent, stream), 32);
        assert_eq!(offset_of!(LaunchEvent, grid), 40);
        assert_eq!(offset_of!(LaunchEvent, block), 52);
        assert_eq!(offset_of!(LaunchEvent, shared_mem_bytes), 64);
        assert_eq!(offset_of!(LaunchEvent, entry_point), 68);
    }
}
