//! One kernel execution as the profiler recorded it.

use std::sync::Arc;

/// The process a kernel belongs to: the `pid` of its CUDA runtime launch event when the trace
/// links one; for a kernel without a linked launch, the one process that launched the other
/// kernels of its device if there is exactly one, else the kernel event's own `pid` (which
/// Kineto sets to the device).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ProcessId(pub i64);

/// A CUDA stream within a process; kernels on one stream run in launch order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StreamId(pub i64);

/// The GPU a kernel ran on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DeviceId(pub i64);

/// Links a kernel to the runtime call that launched it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CorrelationId(pub i64);

/// One kernel execution. Optional fields are those some profiler versions omit; the stand-in
/// counter source derives synthetic counter values from them.
#[derive(Clone, Debug, PartialEq)]
pub struct Kernel {
    /// The kernel's (often mangled) name, shared between kernels of the same name.
    pub name: Arc<str>,
    /// Start of execution on the GPU, µs.
    pub ts_us: f64,
    /// Execution time, µs (0 when absent).
    pub dur_us: f64,
    /// Start of the runtime launch call linked by correlation id, µs, when the trace has it.
    pub launch_ts_us: Option<f64>,
    /// Launched by a graph launch (`cudaGraphLaunch`): the kernel ran as a node of a CUDA
    /// graph, and its correlation id is the graph launch's, shared by the graph's kernels.
    pub graph_launch: bool,
    /// See [`ProcessId`].
    pub process: ProcessId,
    /// The stream (`args.stream`, else the event's `tid`).
    pub stream: Option<StreamId>,
    /// `args.device`.
    pub device: Option<DeviceId>,
    /// `args.correlation`.
    pub correlation: Option<CorrelationId>,
    /// Grid dimensions.
    pub grid: Option<[u32; 3]>,
    /// Block dimensions.
    pub block: Option<[u32; 3]>,
    /// Registers per thread.
    pub registers_per_thread: Option<u32>,
    /// Static plus dynamic shared memory per block, bytes.
    pub shared_memory_bytes: Option<u64>,
    /// The profiler's estimate of achieved occupancy, percent.
    pub est_achieved_occupancy_pct: Option<f64>,
    /// Blocks per streaming multiprocessor.
    pub blocks_per_sm: Option<f64>,
}

impl Kernel {
    /// The time that orders this kernel among its process's launches: the launch call's start
    /// when known, else the kernel's own start.
    pub fn launch_order_ts_us(&self) -> f64 {
        self.launch_ts_us.unwrap_or(self.ts_us)
    }
}
