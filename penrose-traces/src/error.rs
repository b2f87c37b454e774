//! Typed errors for malformed trace files.

use std::path::PathBuf;

/// Why a trace could not be read. Each variant names the file so that a folder-wide run points
/// at the culprit.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    /// The file or folder could not be opened or read.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file or folder.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// The gzip stream is corrupt or ends early (a truncated download).
    #[error("{path}: gzip stream is corrupt or truncated: {source}")]
    Gzip {
        /// The file.
        path: PathBuf,
        /// The decompressor's error.
        #[source]
        source: std::io::Error,
    },
    /// The content is not JSON (or is cut off).
    #[error("{path}: not valid JSON: {source}")]
    NotJson {
        /// The file.
        path: PathBuf,
        /// The parser's error, with line and column.
        #[source]
        source: serde_json::Error,
    },
    /// The JSON has no `traceEvents` array, so it is not a profiler trace.
    #[error("{path}: no `traceEvents` array; not a PyTorch profiler trace")]
    NoTraceEvents {
        /// The file.
        path: PathBuf,
    },
    /// `traceEvents` has the wrong shape (for example a string where an event object belongs).
    #[error("{path}: `traceEvents` is malformed: {source}")]
    MalformedEvents {
        /// The file.
        path: PathBuf,
        /// What did not fit, with line and column.
        #[source]
        source: serde_json::Error,
    },
    /// A kernel event lacks a field every kernel must have.
    #[error("{path}: kernel event {index} has no `{field}`")]
    KernelMissingField {
        /// The file.
        path: PathBuf,
        /// Position of the event in `traceEvents`.
        index: usize,
        /// The missing field (`name` or `ts`).
        field: &'static str,
    },
}
