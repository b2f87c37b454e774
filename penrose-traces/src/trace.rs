//! A parsed trace and the launch sequences the agent would see in it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use crate::error::TraceError;
use crate::kernel::{Kernel, ProcessId, StreamId};
use crate::read::read_trace;

/// All kernel executions of one trace file, in file order.
#[derive(Clone, Debug)]
pub struct Trace {
    path: PathBuf,
    kernels: Vec<Kernel>,
}

impl Trace {
    /// Wraps kernels read from `path`.
    pub fn new(path: PathBuf, kernels: Vec<Kernel>) -> Self {
        Self { path, kernels }
    }

    /// The file this trace came from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Kernels in the order the file lists them (Kineto: per stream, by start time).
    pub fn kernels(&self) -> &[Kernel] {
        &self.kernels
    }

    /// How many distinct kernel names the trace holds: the alphabet its snippets are made of.
    pub fn distinct_names(&self) -> usize {
        self.kernels
            .iter()
            .map(|k| &*k.name)
            .collect::<BTreeSet<_>>()
            .len()
    }

    /// Each process's kernels in launch order: by the timestamp of the runtime launch call
    /// linked through the correlation id, or by the kernel's start when no call is linked.
    /// This is the order the agent's launch probes observe.
    pub fn process_sequences(&self) -> BTreeMap<ProcessId, Vec<&Kernel>> {
        let mut out: BTreeMap<ProcessId, Vec<&Kernel>> = BTreeMap::new();
        for kernel in &self.kernels {
            out.entry(kernel.process).or_default().push(kernel);
        }
        for seq in out.values_mut() {
            // Stable sort: kernels with equal timestamps keep file order.
            seq.sort_by(|a, b| a.launch_order_ts_us().total_cmp(&b.launch_order_ts_us()));
        }
        out
    }

    /// Each (process, stream)'s kernels in execution order, which on one stream is also its
    /// launch order. Kernels without a stream are left out.
    pub fn stream_sequences(&self) -> BTreeMap<(ProcessId, StreamId), Vec<&Kernel>> {
        let mut out: BTreeMap<(ProcessId, StreamId), Vec<&Kernel>> = BTreeMap::new();
        for kernel in &self.kernels {
            if let Some(stream) = kernel.stream {
                out.entry((kernel.process, stream))
                    .or_default()
                    .push(kernel);
            }
        }
        for seq in out.values_mut() {
            seq.sort_by(|a, b| a.ts_us.total_cmp(&b.ts_us));
        }
        out
    }
}

/// The trace files of a folder, so that tools run on any folder of traces.
#[derive(Clone, Debug)]
pub struct TraceFolder {
    files: Vec<PathBuf>,
}

impl TraceFolder {
    /// The folder tests, benchmarks and tools read when none is named: `$PENROSE_TRACES` if set,
    /// else `shared/traces` beside the workspace (`../shared/traces`, the project's layout).
    /// A checkout elsewhere (CI clones into a temporary directory) names the folder in
    /// `PENROSE_TRACES`, which `ci/test.sh` sets. Traces are never copied into the repository.
    pub fn default_dir() -> PathBuf {
        if let Some(dir) = std::env::var_os("PENROSE_TRACES") {
            return PathBuf::from(dir);
        }
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/traces")
    }

    /// Lists the `.json` and `.json.gz` files directly in `dir`, sorted by name.
    pub fn open(dir: &Path) -> Result<Self, TraceError> {
        let io = |source| TraceError::Io {
            path: dir.to_owned(),
            source,
        };
        let mut files = Vec::new();
        for entry in std::fs::read_dir(dir).map_err(io)? {
            let path = entry.map_err(io)?.path();
            let is_trace = path
                .file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.ends_with(".json") || n.ends_with(".json.gz"));
            if is_trace && path.is_file() {
                files.push(path);
            }
        }
        files.sort();
        Ok(Self { files })
    }

    /// The trace files found.
    pub fn files(&self) -> &[PathBuf] {
        &self.files
    }

    /// Reads every trace, stopping at the first malformed one.
    pub fn read_all(&self) -> Result<Vec<Trace>, TraceError> {
        self.files.iter().map(|p| read_trace(p)).collect()
    }
}
