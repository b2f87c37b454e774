//! Event types that cross the ring buffer between the eBPF programs and the agent.
//!
//! Both sides compile this crate, so a layout change is a compile-time change on both sides;
//! `#[repr(C)]` keeps the layout the one the BPF verifier and the agent agree on.
#![no_std]

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
