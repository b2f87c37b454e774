//! The C ABI shared with `csrc/standin.c`: the CUDA types the replayer passes and the stand-in's
//! own extras. The `#[repr(C)]` types here mirror structs in that file field for field.

use std::fmt;

/// A `CUresult`: 0 is success, anything else names a driver error.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CuResult(pub i32);

impl CuResult {
    /// `CUDA_SUCCESS`.
    pub const SUCCESS: Self = Self(0);
    /// `CUDA_ERROR_INVALID_VALUE`: a null pointer or a zero dimension.
    pub const INVALID_VALUE: Self = Self(1);
    /// `CUDA_ERROR_NOT_INITIALIZED`: `cuInit` was not called.
    pub const NOT_INITIALIZED: Self = Self(3);
    /// `CUDA_ERROR_OPERATING_SYSTEM`: the counter ring could not be created.
    pub const OPERATING_SYSTEM: Self = Self(304);
    /// `CUDA_ERROR_INVALID_HANDLE`: not a handle the stand-in made.
    pub const INVALID_HANDLE: Self = Self(400);
    /// `CUDA_ERROR_NOT_FOUND`: an empty kernel name.
    pub const NOT_FOUND: Self = Self(500);

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
            Self::NOT_INITIALIZED => "CUDA_ERROR_NOT_INITIALIZED",
            Self::OPERATING_SYSTEM => "CUDA_ERROR_OPERATING_SYSTEM",
            Self::INVALID_HANDLE => "CUDA_ERROR_INVALID_HANDLE",
            Self::NOT_FOUND => "CUDA_ERROR_NOT_FOUND",
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
    }

    #[test]
    fn durations_round_to_nanoseconds() {
        assert_eq!(duration_ns(1.2345), 1235);
        assert_eq!(duration_ns(0.0), 0);
        assert_eq!(duration_ns(-3.0), 0);
        assert_eq!(duration_ns(f64::NAN), 0);
    }
}
