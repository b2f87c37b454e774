//! Typed errors of the stand-in, its ring and the replayer.

use std::path::PathBuf;

use crate::abi::CuResult;

/// What went wrong; each variant says where, so a failing test points at the cause.
#[derive(Debug, thiserror::Error)]
pub enum StandinError {
    /// The library could not be loaded or lacks a symbol the stand-in exports.
    #[error("cannot load the stand-in libcuda: {0}")]
    Load(#[from] libloading::Error),
    /// The loaded library is a stand-in of another ABI version (a stale build).
    #[error("stand-in ABI version {found}, this crate speaks {expected}")]
    AbiMismatch {
        /// What the library reports.
        found: u32,
        /// What this crate was built for.
        expected: u32,
    },
    /// A driver call returned an error code.
    #[error("{call} failed: {code}")]
    Cuda {
        /// The driver function.
        call: &'static str,
        /// Its result.
        code: CuResult,
    },
    /// `cuGraphExecUpdate` refused the graph (`CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE`); the
    /// executable graph is unchanged.
    #[error("{call} failed: {code}: {result}")]
    GraphExecUpdate {
        /// The driver function.
        call: &'static str,
        /// Its result.
        code: CuResult,
        /// Why, as `CUgraphExecUpdateResult`.
        result: crate::abi::GraphExecUpdateResult,
    },
    /// A stand-in runtime call returned a `cudaError_t`.
    #[error("{call} failed: cudaError_t {code}")]
    Runtime {
        /// The runtime function (or test application entry point).
        call: &'static str,
        /// Its result.
        code: i32,
    },
    /// The replay path needs a library the caller did not load.
    #[error("replaying {via} needs {what}")]
    MissingLibrary {
        /// The replay path.
        via: &'static str,
        /// The library it needs.
        what: &'static str,
    },
    /// The trace has more distinct kernels than the test application has stubs.
    #[error("the trace has {names} distinct kernels, the test application only {stubs} stubs")]
    TooManyKernels {
        /// Distinct kernel names in the plan.
        names: usize,
        /// Stubs in the application's pool.
        stubs: u32,
    },
    /// Copying the library into place failed.
    #[error("cannot install the stand-in as {path}: {source}")]
    Install {
        /// The destination.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The trace could not be read.
    #[error(transparent)]
    Trace(#[from] penrose_traces::TraceError),
    /// The selected process has no kernels in the trace.
    #[error("{0}")]
    NothingToReplay(String),
    /// A synthetic graph that cannot be built as asked (no kernels).
    #[error("synthetic graph: {0}")]
    BadGraph(String),
    /// A kernel name holds a NUL byte, so it cannot be passed as a C string.
    #[error("kernel name {0:?} contains a NUL byte")]
    NameWithNul(String),
    /// A kernel name too long to lie alone on a page ([`crate::runtime::UntouchedNames`]).
    #[error("kernel name of {0} bytes does not fit a page")]
    NameTooLong(usize),
}
