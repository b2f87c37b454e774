//! Test equipment for Penrose's capture path: a stand-in `libcuda` and a trace replayer.
//!
//! The agent's probes attach to a real driver library by symbol name and read launch arguments
//! from registers and the stack. To test them without a GPU, this crate builds a small C shared
//! library (`csrc/standin.c`) that exports the real CUDA driver symbols with their real C
//! signatures, and a replayer (`penrose-replay`) that drives it with the kernel sequences of
//! real profiler traces. It is never a dependency of the product crates.
//!
//! - [`abi`]: the C ABI both sides agree on: entry points, result codes, launch arguments.
//! - [`driver`]: the stand-in loaded with `dlopen`, behind safe methods.
//! - [`ring`]: the per-process shared-memory ring of counter records; its layout and reader
//!   are the crate `penrose-standin-ring`, which the agent's test-only counter source shares.
//! - [`runtime`]: the stand-in CUDA runtime (`libcudart.so.13`), the test application whose
//!   stubs carry nvcc's symbol names, and the stripped library with a statically linked
//!   runtime, each behind safe methods.
//! - [`replay`]: a trace turned into launches, and the loop that replays them.
//! - [`graphs`]: CUDA graphs in replays: a trace's graph launches captured once and relaunched,
//!   and a synthetic explicit graph with updates between launches.
//! - [`signal`]: stopping a looping replay cleanly on SIGINT/SIGTERM.
//! - [`error`]: what can go wrong, as typed errors.
//!
//! The libraries are built by `build.rs`; [`LIBCUDA_PATH`], [`LIBCUDART_PATH`],
//! [`NVCC_APP_PATH`] and [`STATIC_LIB_PATH`] say where, and the `install_*` functions put a
//! copy in a directory of the caller's own.

// FFI crate: calling into the dlopen'ed stand-in and installing a signal handler need `unsafe`;
// every block says why it is sound.
#![allow(unsafe_code)]
#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used))]

pub mod abi;
pub mod driver;
pub mod error;
pub mod graphs;
pub mod replay;
pub mod runtime;
pub mod signal;
/// The counter ring's layout and reader (shared with the agent's test-only counter source).
pub use penrose_standin_ring as ring;

use std::path::{Path, PathBuf};

pub use abi::{
    CaptureMode, CaptureStatus, CuResult, EntryPoint, GraphExecUpdateResult, LaunchConfig,
    NextCounters, Present,
};
pub use driver::{
    Driver, FunctionHandle, GraphExecHandle, GraphHandle, GraphNodeHandle, KernelHandle,
    KernelNode, Launch, LibraryHandle, ModuleHandle, NodeKernel, StreamHandle,
};
pub use error::StandinError;
pub use graphs::{GraphUpdate, NodeSpec, SyntheticGraph, SyntheticSummary, run_synthetic_graph};
pub use replay::{
    DevicePlan, Libraries, Loops, Pace, ProcessSelection, ReplayOptions, ReplayPlan, ReplaySummary,
    Resolve, RuntimeVia, Via, replay, replay_with,
};
pub use ring::{CounterRecord, CounterRing, LaunchRecord, RingError, RingHeader, ring_path};
pub use runtime::{
    AppLaunch, Dim3, FatBinaryHandle, NvccApp, Runtime, RuntimeCounter, StaticLib, StubAddress,
    UntouchedNames,
};

/// The stand-in library `build.rs` compiled (its file name is already `libcuda.so.1`).
pub const LIBCUDA_PATH: &str = env!("PENROSE_STANDIN_LIBCUDA");

/// The stand-in runtime `build.rs` compiled (file name and soname `libcudart.so.13`).
pub const LIBCUDART_PATH: &str = env!("PENROSE_STANDIN_LIBCUDART");

/// The test application with nvcc's symbol names (`libpenrose_nvcc_app.so`, not stripped).
pub const NVCC_APP_PATH: &str = env!("PENROSE_STANDIN_NVCC_APP");

/// The stripped library with a statically linked runtime (`libpenrose_static.so`).
pub const STATIC_LIB_PATH: &str = env!("PENROSE_STANDIN_STATIC");

fn install(from: &str, dir: &Path) -> Result<PathBuf, StandinError> {
    let name = Path::new(from).file_name().unwrap_or_default();
    let target = dir.join(name);
    std::fs::copy(from, &target).map_err(|source| StandinError::Install {
        path: target.clone(),
        source,
    })?;
    Ok(target)
}

/// Copies the stand-in into `dir` as `libcuda.so.1` and returns that path, so a test can point
/// the agent (which finds libcuda by path) at a library in a directory the test owns.
pub fn install_libcuda(dir: &Path) -> Result<PathBuf, StandinError> {
    install(LIBCUDA_PATH, dir)
}

/// Copies the stand-in runtime into `dir` as `libcudart.so.13` and returns that path.
pub fn install_libcudart(dir: &Path) -> Result<PathBuf, StandinError> {
    install(LIBCUDART_PATH, dir)
}

/// Copies the test application into `dir` as `libpenrose_nvcc_app.so` and returns that path
/// (install the runtime next to it: its `RUNPATH` is `$ORIGIN`).
pub fn install_nvcc_app(dir: &Path) -> Result<PathBuf, StandinError> {
    install(NVCC_APP_PATH, dir)
}

/// Copies the stripped library into `dir` as `libpenrose_static.so` and returns that path.
pub fn install_static_lib(dir: &Path) -> Result<PathBuf, StandinError> {
    install(STATIC_LIB_PATH, dir)
}
