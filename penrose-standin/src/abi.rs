//! The C ABI shared with `csrc/standin.c`: the CUDA types the replayer passes and the stand-in's
//! own extras. The `#[repr(C)]` types here mirror structs in that file field for field.

use std::ffi::{c_int, c_void};
use std::fmt;

/// A `CUresult`: 0 is success, anything else names a driver error.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CuResult(pub i32);

impl CuResult {
    /// `CUDA_SUCCESS`.
    pub const SUCCESS: Self = Self(0);
    /// `CUDA_ERROR_INVALID_VALUE`: a null pointer, a zero dimension, or a graph, node or
    /// executable graph the stand-in does not hold.
    pub const INVALID_VALUE: Self = Self(1);
    /// `CUDA_ERROR_OUT_OF_MEMORY`: a table is full (a graph holds at most 1,048,576 nodes).
    pub const OUT_OF_MEMORY: Self = Self(2);
    /// `CUDA_ERROR_NOT_INITIALIZED`: `cuInit` was not called.
    pub const NOT_INITIALIZED: Self = Self(3);
    /// `CUDA_ERROR_INVALID_CONTEXT`: a stream of another context than the current one.
    pub const INVALID_CONTEXT: Self = Self(201);
    /// `CUDA_ERROR_OPERATING_SYSTEM`: the counter ring could not be created.
    pub const OPERATING_SYSTEM: Self = Self(304);
    /// `CUDA_ERROR_INVALID_HANDLE`: not a handle the stand-in made.
    pub const INVALID_HANDLE: Self = Self(400);
    /// `CUDA_ERROR_ILLEGAL_STATE`: capture begun on a capturing stream, or ended on one that
    /// is not capturing.
    pub const ILLEGAL_STATE: Self = Self(401);
    /// `CUDA_ERROR_NOT_FOUND`: an empty kernel name.
    pub const NOT_FOUND: Self = Self(500);
    /// `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED`: capturing a default stream, or launching a
    /// graph into a capturing stream.
    pub const STREAM_CAPTURE_UNSUPPORTED: Self = Self(900);
    /// `CUDA_ERROR_STREAM_CAPTURE_INVALIDATED`: a launch failed during capture, so the capture
    /// yields no graph.
    pub const STREAM_CAPTURE_INVALIDATED: Self = Self(901);
    /// `CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD`: a global or thread-local capture ended on
    /// another thread.
    pub const STREAM_CAPTURE_WRONG_THREAD: Self = Self(908);
    /// `CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE`: the graph does not fit the executable graph.
    pub const GRAPH_EXEC_UPDATE_FAILURE: Self = Self(910);

    /// Turns the code into a `Result` naming the call, so `?` works on driver calls.
    pub fn check(self, call: &'static str) -> Result<(), crate::StandinError> {
        if self == Self::SUCCESS {
            Ok(())
        } else {
            Err(crate::StandinError::Cuda { call, code: self })
        }
    }
}

impl fmt::Display for CuResult {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match *self {
            Self::SUCCESS => "CUDA_SUCCESS",
            Self::INVALID_VALUE => "CUDA_ERROR_INVALID_VALUE",
            Self::OUT_OF_MEMORY => "CUDA_ERROR_OUT_OF_MEMORY",
            Self::NOT_INITIALIZED => "CUDA_ERROR_NOT_INITIALIZED",
            Self::INVALID_CONTEXT => "CUDA_ERROR_INVALID_CONTEXT",
            Self::OPERATING_SYSTEM => "CUDA_ERROR_OPERATING_SYSTEM",
            Self::INVALID_HANDLE => "CUDA_ERROR_INVALID_HANDLE",
            Self::ILLEGAL_STATE => "CUDA_ERROR_ILLEGAL_STATE",
            Self::NOT_FOUND => "CUDA_ERROR_NOT_FOUND",
            Self::STREAM_CAPTURE_UNSUPPORTED => "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED",
            Self::STREAM_CAPTURE_INVALIDATED => "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED",
            Self::STREAM_CAPTURE_WRONG_THREAD => "CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD",
            Self::GRAPH_EXEC_UPDATE_FAILURE => "CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE",
            _ => "CUDA error",
        };
        write!(f, "{name} ({})", self.0)
    }
}

/// The launch entry points, shared with the probes (the same wire values); the stand-in counts
/// launches per entry point under these indices.
pub use penrose_ebpf_common::EntryPoint;

/// `CUlaunchConfig` as cuda.h declares it (CUDA 12), for `cuLaunchKernelEx`.
#[derive(Clone, Copy, Debug)]
#[repr(C)]
pub struct LaunchConfig {
    /// Grid width in blocks.
    pub grid_dim_x: u32,
    /// Grid height in blocks.
    pub grid_dim_y: u32,
    /// Grid depth in blocks.
    pub grid_dim_z: u32,
    /// Block width in threads.
    pub block_dim_x: u32,
    /// Block height in threads.
    pub block_dim_y: u32,
    /// Block depth in threads.
    pub block_dim_z: u32,
    /// Dynamic shared memory per block, bytes.
    pub shared_mem_bytes: u32,
    /// `CUstream`.
    pub h_stream: *mut std::ffi::c_void,
    /// `CUlaunchAttribute *`; the replayer passes none.
    pub attrs: *mut std::ffi::c_void,
    /// Number of attributes.
    pub num_attrs: u32,
}

/// `CUDA_KERNEL_NODE_PARAMS_v1` as cuda.h declares it (`cuGraphAddKernelNode`,
/// `cuGraphExecKernelNodeSetParams`).
#[derive(Clone, Copy, Debug)]
#[repr(C)]
pub struct KernelNodeParamsV1 {
    /// `CUfunction` (a `CUkernel` cast as one is accepted too).
    pub func: *mut c_void,
    /// Grid width in blocks.
    pub grid_dim_x: u32,
    /// Grid height in blocks.
    pub grid_dim_y: u32,
    /// Grid depth in blocks.
    pub grid_dim_z: u32,
    /// Block width in threads.
    pub block_dim_x: u32,
    /// Block height in threads.
    pub block_dim_y: u32,
    /// Block depth in threads.
    pub block_dim_z: u32,
    /// Dynamic shared memory per block, bytes.
    pub shared_mem_bytes: u32,
    /// `void **kernelParams`; the replayer passes none.
    pub kernel_params: *mut *mut c_void,
    /// `void **extra`; the replayer passes none.
    pub extra: *mut *mut c_void,
}

/// `CUDA_KERNEL_NODE_PARAMS_v2` (CUDA 12's `CUDA_KERNEL_NODE_PARAMS`): v1 plus `kern`, launched
/// when `func` is null, and `ctx`.
#[derive(Clone, Copy, Debug)]
#[repr(C)]
pub struct KernelNodeParamsV2 {
    /// `CUfunction`, or null to launch `kern`.
    pub func: *mut c_void,
    /// Grid width in blocks.
    pub grid_dim_x: u32,
    /// Grid height in blocks.
    pub grid_dim_y: u32,
    /// Grid depth in blocks.
    pub grid_dim_z: u32,
    /// Block width in threads.
    pub block_dim_x: u32,
    /// Block height in threads.
    pub block_dim_y: u32,
    /// Block depth in threads.
    pub block_dim_z: u32,
    /// Dynamic shared memory per block, bytes.
    pub shared_mem_bytes: u32,
    /// `void **kernelParams`; the replayer passes none.
    pub kernel_params: *mut *mut c_void,
    /// `void **extra`; the replayer passes none.
    pub extra: *mut *mut c_void,
    /// `CUkernel`, used only when `func` is null.
    pub kern: *mut c_void,
    /// `CUcontext` for `kern`; null for the current one.
    pub ctx: *mut c_void,
}

/// `CUDA_GRAPH_INSTANTIATE_PARAMS` (`cuGraphInstantiateWithParams`).
#[derive(Clone, Copy, Debug)]
#[repr(C)]
pub struct GraphInstantiateParams {
    /// `CUgraphInstantiate_flags` bits (1, 2, 4, 8).
    pub flags: u64,
    /// `CUstream hUploadStream`.
    pub upload_stream: *mut c_void,
    /// `CUgraphNode hErrNode_out` (the stand-in writes null).
    pub err_node_out: *mut c_void,
    /// `CUgraphInstantiateResult result_out`: 0 success, 1 error.
    pub result_out: c_int,
}

/// `CUgraphExecUpdateResultInfo` (`cuGraphExecUpdate_v2`).
#[derive(Clone, Copy, Debug)]
#[repr(C)]
pub struct GraphExecUpdateResultInfo {
    /// `CUgraphExecUpdateResult`.
    pub result: c_int,
    /// `CUgraphNode errorNode` (the stand-in writes null).
    pub error_node: *mut c_void,
    /// `CUgraphNode errorFromNode` (the stand-in writes null).
    pub error_from_node: *mut c_void,
}

/// `CUgraphExecUpdateResult`: why `cuGraphExecUpdate` refused a graph.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GraphExecUpdateResult(pub i32);

impl GraphExecUpdateResult {
    /// `CU_GRAPH_EXEC_UPDATE_SUCCESS`.
    pub const SUCCESS: Self = Self(0);
    /// `CU_GRAPH_EXEC_UPDATE_ERROR`: an invalid handle.
    pub const ERROR: Self = Self(1);
    /// `CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED`: another number of nodes.
    pub const TOPOLOGY_CHANGED: Self = Self(2);
}

impl fmt::Display for GraphExecUpdateResult {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match *self {
            Self::SUCCESS => "CU_GRAPH_EXEC_UPDATE_SUCCESS",
            Self::ERROR => "CU_GRAPH_EXEC_UPDATE_ERROR",
            Self::TOPOLOGY_CHANGED => "CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED",
            _ => "CUgraphExecUpdateResult",
        };
        write!(f, "{name} ({})", self.0)
    }
}

/// `CUstreamCaptureMode`: which other threads' unsafe calls a capture forbids (the stand-in
/// checks only that a global or thread-local capture ends on the thread that began it).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[repr(i32)]
pub enum CaptureMode {
    /// `CU_STREAM_CAPTURE_MODE_GLOBAL`.
    #[default]
    Global = 0,
    /// `CU_STREAM_CAPTURE_MODE_THREAD_LOCAL`.
    ThreadLocal = 1,
    /// `CU_STREAM_CAPTURE_MODE_RELAXED`.
    Relaxed = 2,
}

/// `CUstreamCaptureStatus`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CaptureStatus {
    /// `CU_STREAM_CAPTURE_STATUS_NONE`: not capturing.
    None,
    /// `CU_STREAM_CAPTURE_STATUS_ACTIVE`.
    Active,
    /// `CU_STREAM_CAPTURE_STATUS_INVALIDATED`: a launch failed; ending it yields no graph.
    Invalidated,
}

impl CaptureStatus {
    /// The status the C value names; `None` for a value cuda.h does not define.
    pub fn from_c(value: i32) -> Option<Self> {
        match value {
            0 => Some(Self::None),
            1 => Some(Self::Active),
            2 => Some(Self::Invalidated),
            _ => None,
        }
    }
}

/// Which fields of [`NextCounters`] (and of a ring record) hold a value: traces omit some.
pub use penrose_standin_ring::Present;

/// The trace fields of the next launch, passed through `penrose_standin_set_next_counters`
/// because a real launch call has no place for them. Mirrors `struct penrose_standin_counters`.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
#[repr(C)]
pub struct NextCounters {
    /// Kernel duration, ns.
    pub duration_ns: u64,
    /// The profiler's estimate of achieved occupancy, percent.
    pub est_achieved_occupancy_pct: f64,
    /// Blocks per streaming multiprocessor.
    pub blocks_per_sm: f64,
    /// Registers per thread.
    pub registers_per_thread: u32,
    /// Shared memory per block, bytes.
    pub shared_memory_bytes: u32,
    /// [`Present`] bits.
    pub present: u32,
    /// Zero; keeps the struct's size a multiple of 8 on every ABI.
    pub reserved: u32,
}

impl NextCounters {
    /// The counter fields of one trace kernel, as the stand-in will record them.
    pub fn from_kernel(kernel: &penrose_traces::Kernel) -> Self {
        let mut c = Self {
            duration_ns: duration_ns(kernel.dur_us),
            present: Present::DURATION,
            ..Self::default()
        };
        if let Some(v) = kernel.est_achieved_occupancy_pct {
            c.est_achieved_occupancy_pct = v;
            c.present |= Present::OCCUPANCY;
        }
        if let Some(v) = kernel.blocks_per_sm {
            c.blocks_per_sm = v;
            c.present |= Present::BLOCKS_PER_SM;
        }
        if let Some(v) = kernel.registers_per_thread {
            c.registers_per_thread = v;
            c.present |= Present::REGISTERS;
        }
        if let Some(v) = kernel.shared_memory_bytes {
            c.shared_memory_bytes = saturate_u32(v);
            c.present |= Present::SHARED_MEMORY;
        }
        c
    }
}

/// A trace duration (µs, fractional) in whole nanoseconds; negative or NaN becomes 0.
pub fn duration_ns(dur_us: f64) -> u64 {
    let ns = (dur_us * 1000.0).round();
    if ns.is_finite() && ns > 0.0 {
        // Float-to-int `as` saturates, which is what an absurd duration should do.
        ns as u64
    } else {
        0
    }
}

/// A byte count the 32-bit ABI field can hold (shared memory per block is far below 4 GiB).
pub fn saturate_u32(v: u64) -> u32 {
    u32::try_from(v).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_indices_round_trip() {
        for (i, e) in EntryPoint::ALL.iter().enumerate() {
            assert_eq!(EntryPoint::from_u32(i as u32), Some(*e));
            assert_eq!(*e as u32, i as u32);
        }
        assert_eq!(EntryPoint::from_u32(8), None);
    }

    #[test]
    fn layouts_match_the_c_side() {
        assert_eq!(std::mem::size_of::<NextCounters>(), 40);
        assert_eq!(std::mem::size_of::<LaunchConfig>(), 56);
        assert_eq!(std::mem::offset_of!(LaunchConfig, h_stream), 32);
        assert_eq!(std::mem::size_of::<KernelNodeParamsV1>(), 56);
        assert_eq!(std::mem::offset_of!(KernelNodeParamsV1, kernel_params), 40);
        assert_eq!(std::mem::size_of::<KernelNodeParamsV2>(), 72);
        assert_eq!(std::mem::offset_of!(KernelNodeParamsV2, kern), 56);
        assert_eq!(std::mem::size_of::<GraphInstantiateParams>(), 32);
        assert_eq!(std::mem::size_of::<GraphExecUpdateResultInfo>(), 24);
    }

    #[test]
    fn durations_round_to_nanoseconds() {
        assert_eq!(duration_ns(1.2345), 1235);
        assert_eq!(duration_ns(0.0), 0);
        assert_eq!(duration_ns(-3.0), 0);
        assert_eq!(duration_ns(f64::NAN), 0);
    }
}
