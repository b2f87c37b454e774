//! Reads PyTorch profiler (Kineto) JSON traces into kernel sequences.
//!
//! Penrose is tested on workloads nobody on the project wrote: real profiler traces. This crate
//! does the file I/O so that `penrose-core` stays pure; it turns a `.json` or `.json.gz` trace
//! into [`Kernel`] records and orders them the way the agent would see them:
//!
//! - [`error`]: what can be wrong with a trace file, as typed errors.
//! - [`kernel`]: one kernel execution with its launch configuration and occupancy fields.
//! - [`trace`]: a parsed trace and its per-process and per-stream launch sequences.
//! - [`read`]: opening, decompressing and parsing a file.
//! - [`job`]: which files are ranks of one job (one application).
//!
//! # Launch order
//!
//! Kineto records `"cat": "kernel"` events per stream in execution order. A process's launch
//! order is the order of its CUDA runtime launch calls, so [`Trace::process_sequences`] sorts
//! each kernel by the timestamp of the `cuda_runtime` event with the same correlation id, and
//! falls back to the kernel's own start time when a trace has no such event for it (some traces
//! lose launch events, for example 705 of 6,080 in one of the test traces; those kernels are
//! then placed by execution start, which is a few µs after their launch).

#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used))]

pub mod error;
pub mod job;
pub mod kernel;
pub mod read;
pub mod trace;

pub use error::TraceError;
pub use job::job_name;
pub use kernel::{CorrelationId, DeviceId, Kernel, ProcessId, StreamId};
pub use read::{read_trace, read_trace_bytes};
pub use trace::{Trace, TraceFolder};
