//! The traces as labelled sequences of interned launches (kernel name and launch
//! configuration).

use std::collections::HashMap;
use std::path::Path;

use penrose_core::fingerprint::{LaunchConfig, NameDigest};
use penrose_traces::{Kernel, TraceFolder};

/// Index of a kernel name in [`Corpus::digests`].
pub type NameId = u32;

/// Index of a distinct (kernel name, launch configuration) in [`Corpus::launches`]: what
/// windows are drawn as, so that every launch encoding can be derived from one window.
pub type LaunchId = u32;

/// Index of a launch configuration in [`Corpus::configs`].
pub type ConfigId = u32;

/// Streams shorter than this are left out of the per-stream experiment: looping a few dozen
/// launches would make a window of nothing but one short pattern.
pub const MIN_STREAM_KERNELS: usize = 500;

/// How a trace is cut into sequences.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum Mode {
    /// All of a process's launches in launch order.
    Process,
    /// Each CUDA stream separately.
    Stream,
}

/// One looped sequence windows are drawn from.
#[derive(Clone)]
pub struct Source {
    /// The trace file it came from.
    pub file: String,
    /// Ground truth: files whose names differ only in a rank number are one job.
    pub app: usize,
    /// Ground truth for clustering: the application, plus the stream id in per-stream mode.
    pub label: usize,
    /// Stricter ground truth: every file (and stream) is its own application.
    pub file_label: usize,
    /// The sequence of launches.
    pub seq: Vec<LaunchId>,
    /// Per launch of `seq`, the graph launch that launched it (its correlation id), `None`
    /// for a kernel launched on its own; empty for per-stream sources (see [`super::graphs`]).
    pub graph: Vec<Option<i64>>,
}

/// Every trace in a folder, interned.
pub struct Corpus {
    /// Application (job) names, indexed by `Source::app`.
    pub apps: Vec<String>,
    /// Per-process sources, one per (file, process).
    pub process: Vec<Source>,
    /// Per-stream sources with at least [`MIN_STREAM_KERNELS`] launches.
    pub stream: Vec<Source>,
    /// SHA-256 of every name, by id.
    pub digests: Vec<NameDigest>,
    /// Every distinct launch: its name (which stands for the per-process handle) and its
    /// configuration.
    pub launches: Vec<(NameId, ConfigId)>,
    /// Every distinct launch configuration.
    pub configs: Vec<LaunchConfig>,
    /// Total kernels read.
    pub kernels: usize,
    /// Kernels that lack grid, block or shared memory in the trace (their missing fields read
    /// as 0).
    pub kernels_without_config: usize,
}

impl Corpus {
    /// Reads every trace of `dir`.
    pub fn read(dir: &Path) -> anyhow::Result<Self> {
        let folder = TraceFolder::open(dir)?;
        anyhow::ensure!(
            !folder.files().is_empty(),
            "no .json or .json.gz traces in {}",
            dir.display()
        );
        let mut interner = Interner::default();
        let mut sequences = Sequences::default();
        for path in folder.files() {
            sequences.add(path, &mut interner)?;
        }
        let process = sequences
            .process
            .into_iter()
            .filter(|s| !s.seq.is_empty())
            .collect();
        Ok(Self {
            apps: sequences.apps,
            process,
            stream: sequences.stream,
            digests: interner.digests,
            launches: interner.launches,
            configs: interner.configs,
            kernels: sequences.kernels,
            kernels_without_config: interner.kernels_without_config,
        })
    }

    /// The sources of a mode.
    pub fn sources(&self, mode: Mode) -> &[Source] {
        match mode {
            Mode::Process => &self.process,
            Mode::Stream => &self.stream,
        }
    }
}

/// Interns names, configurations and launches as the traces are read (see [`Corpus`]).
#[derive(Default)]
struct Interner {
    ids: HashMap<String, NameId>,
    digests: Vec<NameDigest>,
    config_ids: HashMap<LaunchConfig, ConfigId>,
    configs: Vec<LaunchConfig>,
    launch_ids: HashMap<(NameId, ConfigId), LaunchId>,
    launches: Vec<(NameId, ConfigId)>,
    kernels_without_config: usize,
}

impl Interner {
    /// The kernel's launch, interned with its name and configuration.
    fn intern(&mut self, k: &Kernel) -> LaunchId {
        let name = match self.ids.get(&*k.name) {
            Some(&id) => id,
            None => {
                let id = self.digests.len() as NameId;
                self.digests.push(NameDigest::of(&k.name));
                self.ids.insert(k.name.to_string(), id);
                id
            }
        };
        if k.grid.is_none() || k.block.is_none() || k.shared_memory_bytes.is_none() {
            self.kernels_without_config += 1;
        }
        let config = LaunchConfig {
            grid: k.grid.unwrap_or_default(),
            block: k.block.unwrap_or_default(),
            shared_mem_bytes: k.shared_memory_bytes.unwrap_or_default(),
        };
        let configs = &mut self.configs;
        let config = *self.config_ids.entry(config).or_insert_with(|| {
            configs.push(config);
            (configs.len() - 1) as ConfigId
        });
        let launches = &mut self.launches;
        *self.launch_ids.entry((name, config)).or_insert_with(|| {
            launches.push((name, config));
            (launches.len() - 1) as LaunchId
        })
    }
}

/// The sources of the traces read so far, labelled.
#[derive(Default)]
struct Sequences {
    apps: Vec<String>,
    /// Each (application, stream id)'s label.
    stream_labels: HashMap<(usize, i64), usize>,
    process: Vec<Source>,
    stream: Vec<Source>,
    stream_files: usize,
    kernels: usize,
}

impl Sequences {
    /// Reads the trace at `path`: its processes and its streams long enough.
    fn add(&mut self, path: &Path, interner: &mut Interner) -> anyhow::Result<()> {
        let trace = penrose_traces::read_trace(path)?;
        self.kernels += trace.kernels().len();
        let file = file_stem(path);
        let app = self.app(penrose_traces::job_name(path));
        for seq in trace.process_sequences().into_values() {
            self.process.push(Source {
                file: file.clone(),
                app,
                label: app,
                file_label: self.process.len(),
                graph: seq.iter().map(|k| graph_launch_of(k)).collect(),
                seq: seq.into_iter().map(|k| interner.intern(k)).collect(),
            });
        }
        for ((_, stream_id), seq) in trace.stream_sequences() {
            if seq.len() < MIN_STREAM_KERNELS {
                continue;
            }
            let next = self.stream_labels.len();
            let label = *self.stream_labels.entry((app, stream_id.0)).or_insert(next);
            self.stream_files += 1;
            self.stream.push(Source {
                file: format!("{file} stream {}", stream_id.0),
                app,
                label,
                file_label: self.stream_files,
                seq: seq.into_iter().map(|k| interner.intern(k)).collect(),
                graph: Vec::new(),
            });
        }
        Ok(())
    }

    /// The application (job) `job`'s index, a new one if it is new.
    fn app(&mut self, job: String) -> usize {
        match self.apps.iter().position(|a| *a == job) {
            Some(i) => i,
            None => {
                self.apps.push(job);
                self.apps.len() - 1
            }
        }
    }
}

/// The graph launch a kernel ran under: its correlation id, which all kernels of one graph
/// launch share. A graph kernel without one cannot occur (the flag comes from the linked
/// launch) and would count as launched on its own.
fn graph_launch_of(kernel: &Kernel) -> Option<i64> {
    kernel
        .correlation
        .filter(|_| kernel.graph_launch)
        .map(|c| c.0)
}

fn file_stem(path: &Path) -> String {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    name.trim_end_matches(".gz")
        .trim_end_matches(".json")
        .to_owned()
}

#[cfg(test)]
pub mod tests {
    use super::*;

    /// A corpus of one application whose kernels are `names`, all with one configuration
    /// (launch i is kernel i), and one per-process source per (sequence, graph launches).
    pub fn corpus_of(names: &[&str], sources: &[(Vec<LaunchId>, Vec<Option<i64>>)]) -> Corpus {
        let process = sources
            .iter()
            .enumerate()
            .map(|(i, (seq, graph))| Source {
                file: format!("file{i}"),
                app: 0,
                label: 0,
                file_label: i,
                seq: seq.clone(),
                graph: graph.clone(),
            })
            .collect();
        Corpus {
            apps: vec!["app".into()],
            process,
            stream: Vec::new(),
            digests: names.iter().map(|n| NameDigest::of(n)).collect(),
            launches: (0..names.len() as u32).map(|l| (l, 0)).collect(),
            configs: vec![LaunchConfig::default()],
            kernels: 0,
            kernels_without_config: 0,
        }
    }
}
