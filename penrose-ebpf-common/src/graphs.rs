//! Records of the CUDA graph calls: how the kernels a graph launch runs became that graph's.
//!
//! A graph is built by stream capture (the driver records, rather than runs, the launches on
//! a capturing stream between `cuStreamBeginCapture*` and `cuStreamEndCapture`) or node by node
//! (`cuGraphAddKernelNode*`); `cuGraphInstantiate*` turns it into the executable graph that
//! `cuGraphLaunch` names; `cuGraphExecKernelNodeSetParams*` and `cuGraphExecUpdate*` change what
//! an executable graph runs. The agent keeps the per-process state; the BPF side only reports
//! the calls, and reads the kernel count of an executable graph at its launches
//! ([`GraphKey`], [`crate::maps::GRAPH_KERNELS`]) so the sampling countdown counts kernels.

use crate::EventKind;
use crate::events::{read_u32, read_u32x3, read_u64};

/// What a [`GraphEvent`] reports; the wire value is [`GraphEvent::op`].
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GraphOp {
    /// `cuStreamBeginCapture_v2*`: `stream` starts recording.
    CaptureBegin = 1,
    /// `cuStreamEndCapture*` returned: `stream` stopped recording into `graph` (zero when
    /// the capture failed or was invalidated: nothing it recorded becomes a graph).
    CaptureEnd = 2,
    /// Entry of `cuGraphAddKernelNode*`: the parameters of a node of `graph`; the
    /// [`GraphOp::KernelNodeAdded`] of the same thread that follows gives its handle.
    KernelNodeParams = 3,
    /// `cuGraphAddKernelNode*` returned success: `node` was added to `graph`.
    KernelNodeAdded = 4,
    /// `cuGraphInstantiate*` returned success: `exec` runs `graph`'s kernels.
    Instantiated = 5,
    /// Entry of `cuGraphExecKernelNodeSetParams*`: `exec`'s copy of `node` runs these
    /// parameters from the next launch on.
    ExecNodeParams = 6,
    /// `cuGraphExecUpdate*` returned success: `exec` now runs `graph`'s kernels.
    ExecUpdated = 7,
    /// `cuGraphDestroy`.
    GraphDestroyed = 8,
    /// `cuGraphExecDestroy`.
    ExecDestroyed = 9,
}

impl GraphOp {
    /// Decodes [`GraphEvent::op`]; `None` for a value this build does not know.
    pub const fn from_u32(value: u32) -> Option<Self> {
        match value {
            1 => Some(Self::CaptureBegin),
            2 => Some(Self::CaptureEnd),
            3 => Some(Self::KernelNodeParams),
            4 => Some(Self::KernelNodeAdded),
            5 => Some(Self::Instantiated),
            6 => Some(Self::ExecNodeParams),
            7 => Some(Self::ExecUpdated),
            8 => Some(Self::GraphDestroyed),
            9 => Some(Self::ExecDestroyed),
            _ => None,
        }
    }
}

/// One graph call ([`GraphOp`]); handles a call does not name are zero.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GraphEvent {
    /// Always [`EventKind::Graph`] as `u32`.
    pub kind: u32,
    /// Process id (tgid).
    pub pid: u32,
    /// Thread id.
    pub tid: u32,
    /// A [`GraphOp`] wire value.
    pub op: u32,
    /// `bpf_ktime_get_ns` at the probe.
    pub timestamp_ns: u64,
    /// The `CUgraph`.
    pub graph: u64,
    /// The `CUgraphExec`.
    pub exec: u64,
    /// The `CUgraphNode`.
    pub node: u64,
    /// The `CUstream` of a capture.
    pub stream: u64,
    /// The node's `CUfunction` (`func` of `CUDA_KERNEL_NODE_PARAMS`).
    pub function: u64,
    /// The node's `CUkernel` (`kern` of `CUDA_KERNEL_NODE_PARAMS_v2`, used when `func` is
    /// null); zero for the v1 parameters.
    pub kernel: u64,
    /// Grid dimensions of the node.
    pub grid: [u32; 3],
    /// Block dimensions of the node.
    pub block: [u32; 3],
    /// Dynamic shared memory of the node, bytes.
    pub shared_mem_bytes: u32,
    /// Zero; keeps the size a multiple of 8.
    pub reserved: u32,
}

impl GraphEvent {
    /// Reads a graph record; `None` when it is not one or is too short.
    pub fn parse(record: &[u8]) -> Option<Self> {
        use core::mem::offset_of;
        let event = Self {
            kind: read_u32(record, offset_of!(Self, kind))?,
            pid: read_u32(record, offset_of!(Self, pid))?,
            tid: read_u32(record, offset_of!(Self, tid))?,
            op: read_u32(record, offset_of!(Self, op))?,
            timestamp_ns: read_u64(record, offset_of!(Self, timestamp_ns))?,
            graph: read_u64(record, offset_of!(Self, graph))?,
            exec: read_u64(record, offset_of!(Self, exec))?,
            node: read_u64(record, offset_of!(Self, node))?,
            stream: read_u64(record, offset_of!(Self, stream))?,
            function: read_u64(record, offset_of!(Self, function))?,
            kernel: read_u64(record, offset_of!(Self, kernel))?,
            grid: read_u32x3(record, offset_of!(Self, grid))?,
            block: read_u32x3(record, offset_of!(Self, block))?,
            shared_mem_bytes: read_u32(record, offset_of!(Self, shared_mem_bytes))?,
            reserved: read_u32(record, offset_of!(Self, reserved))?,
        };
        (event.kind == EventKind::Graph as u32).then_some(event)
    }
}

/// Key of [`crate::maps::GRAPH_KERNELS`]: an executable graph of one process.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GraphKey {
    /// Process id (tgid).
    pub pid: u32,
    /// Zero.
    pub reserved: u32,
    /// The `CUgraphExec`.
    pub exec: u64,
}

/// Most executable graphs whose kernel counts the BPF side holds at once (host-wide); a
/// graph beyond it is counted as one launch by the countdown until room is made.
pub const GRAPH_KERNELS_ENTRIES: u32 = 16_384;

const _: () = {
    use core::mem::{offset_of, size_of};
    assert!(size_of::<GraphEvent>() == 104);
    assert!(offset_of!(GraphEvent, op) == 12);
    assert!(offset_of!(GraphEvent, graph) == 24);
    assert!(offset_of!(GraphEvent, function) == 56);
    assert!(offset_of!(GraphEvent, grid) == 72);
    assert!(offset_of!(GraphEvent, shared_mem_bytes) == 104 - 8);
    assert!(size_of::<GraphKey>() == 16);
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn graph_records_round_trip_and_short_or_foreign_ones_are_rejected() {
        let mut buf = [0u8; core::mem::size_of::<GraphEvent>()];
        let fields: [(usize, &[u8]); 6] = [
            (0, &(EventKind::Graph as u32).to_ne_bytes()),
            (4, &42u32.to_ne_bytes()),
            (12, &(GraphOp::Instantiated as u32).to_ne_bytes()),
            (24, &0x6a_u64.to_ne_bytes()),
            (32, &0xe0_u64.to_ne_bytes()),
            (96, &48u32.to_ne_bytes()),
        ];
        for (at, bytes) in fields {
            buf[at..at + bytes.len()].copy_from_slice(bytes);
        }
        let event = GraphEvent::parse(&buf).unwrap();
        assert_eq!((event.pid, event.graph, event.exec), (42, 0x6a, 0xe0));
        assert_eq!(event.shared_mem_bytes, 48);
        assert_eq!(GraphOp::from_u32(event.op), Some(GraphOp::Instantiated));
        assert_eq!(GraphEvent::parse(&buf[..buf.len() - 1]), None);
        buf[0] = EventKind::Context as u8;
        assert_eq!(GraphEvent::parse(&buf), None);
        assert_eq!(GraphOp::from_u32(0), None);
        assert_eq!(GraphOp::from_u32(10), None);
    }
}
