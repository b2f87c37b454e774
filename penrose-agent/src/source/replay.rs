//! Profiler traces replayed as if captured: no probes, no root. Test equipment: reached only
//! with `capture.source = "test-replay"` (tests and the demo), announced with a warning when
//! it opens.
//!
//! Each process of each trace is one replayed process that loops over its launch sequence, as
//! the stand-in replayer does in its looping mode. Every window, each replayed process
//! contributes one snippet of L consecutive launches, continuing where its previous window
//! ended; 1 launch per block of S is sampled (a block started at every window, as the BPF
//! countdown does) and its counter values are the trace's fields for the active counter group, computed as the
//! stand-in driver computes them ([`crate::counters::standin::trace_values`]). So the pipeline
//! sees what it would see if these traces ran through the stand-in with the agent attached,
//! without root; the live path is tested against the stand-in separately.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use penrose_core::counters::CounterGroup;
use penrose_core::sampling::{Decision, SamplingSchedule};
use penrose_traces::{Kernel, TraceFolder};
use rand::SeedableRng;
use rand::rngs::StdRng;

use super::{SnippetSource, SourceBatch, SourceError, SourceInfo, WindowStat};
use crate::capture::events::Pid;
use crate::capture::window::{Sample, Snippet, SnippetEnd};
use crate::counters::standin::{trace_groups, trace_values};
use crate::source::ReplayConfig;

/// Pids of replayed processes start here (they name no real process).
const FIRST_PID: u32 = 1_000_000;

struct Replayed {
    pid: Pid,
    names: Vec<Arc<str>>,
    kernels: Vec<Kernel>,
    position: usize,
}

/// The trace-replay source.
pub struct ReplaySource {
    config: ReplayConfig,
    processes: Vec<Replayed>,
    inputs: Vec<String>,
    groups: Vec<CounterGroup>,
}

impl ReplaySource {
    /// Reads every trace in `dir`; each process with launches becomes a replayed process.
    pub fn open(dir: &Path, config: ReplayConfig) -> Result<Self, SourceError> {
        crate::test_equipment::warn(
            "capture.source = \"test-replay\"",
            &format!(
                "snippets are profiler traces from {} replayed as if captured, not launches on \
                 this host",
                dir.display()
            ),
        );
        if config.sample_counters {
            crate::test_equipment::warn(
                "capture.counters = \"test-standin-ring\"",
                "counter values are the traces' own fields, as the stand-in libcuda's ring gives \
                 them, not readings of a GPU",
            );
        }
        let folder = TraceFolder::open(dir)
            .map_err(|e| SourceError::Traces(format!("{}: {e}", dir.display())))?;
        if folder.files().is_empty() {
            return Err(SourceError::Traces(format!(
                "{}: no .json or .json.gz traces",
                dir.display()
            )));
        }
        let mut processes = Vec::new();
        let mut inputs = Vec::new();
        for path in folder.files() {
            let trace = penrose_traces::read_trace(path)
                .map_err(|e| SourceError::Traces(format!("{}: {e}", path.display())))?;
            for sequence in trace.process_sequences().into_values() {
                if sequence.is_empty() {
                    continue;
                }
                let kernels: Vec<Kernel> = sequence.into_iter().cloned().collect();
                processes.push(Replayed {
                    pid: Pid(FIRST_PID + processes.len() as u32),
                    names: kernels.iter().map(|k| Arc::clone(&k.name)).collect(),
                    kernels,
                    position: 0,
                });
            }
            inputs.push(path.display().to_string());
        }
        let groups = if config.sample_counters {
            trace_groups()
        } else {
            Vec::new()
        };
        Ok(Self {
            config,
            processes,
            inputs,
            groups,
        })
    }

    /// Replayed processes.
    pub fn processes(&self) -> usize {
        self.processes.len()
    }
}

impl SnippetSource for ReplaySource {
    fn info(&self) -> SourceInfo {
        SourceInfo {
            kind: "test-replay".into(),
            counters: if self.groups.is_empty() {
                "none".into()
            } else {
                "test-standin-ring (trace fields)".into()
            },
            gpu_arch: super::archs_text(&self.gpu_archs()),
            probe_cost_ns: 0,
            inputs: self.inputs.clone(),
            libraries_untrusted: 0,
            libraries_over_cap: 0,
            samples: super::SampleStatus::default(),
            graphs: Default::default(),
        }
    }

    /// The stand-in's GPU when the traces' counter values are sampled (as the stand-in ring
    /// would give them), none otherwise.
    fn gpu_archs(&self) -> Vec<penrose_core::gpu::GpuArch> {
        if self.groups.is_empty() {
            Vec::new()
        } else {
            vec![crate::counters::standin::standin_arch()]
        }
    }

    fn run(
        &mut self,
        stop: &AtomicBool,
        sink: &mut dyn FnMut(SourceBatch),
    ) -> Result<(), SourceError> {
        let rng = match self.config.seed {
            Some(seed) => StdRng::seed_from_u64(seed),
            None => StdRng::from_os_rng(),
        };
        let started = Instant::now();
        let mut sampling = SamplingSchedule::new(
            self.config.sample_period,
            self.config.reoffset_every,
            rng,
            Duration::ZERO,
        );
        let limit = self.config.window_launches.max(1);
        let mut index = 0u64;
        while !stop.load(Ordering::Relaxed) && self.config.windows.is_none_or(|n| index < n) {
            let opened = Instant::now();
            let now = started.elapsed();
            let group = (!self.groups.is_empty()).then(|| {
                let turn = now.as_nanos() / self.config.group_period.as_nanos().max(1);
                self.groups[usize::try_from(turn % self.groups.len() as u128).unwrap_or(0)]
            });
            // As the capture seeds the probe at every window it opens.
            sampling.start_block(now);
            let mut snippets = Vec::with_capacity(self.processes.len());
            let mut launches = 0u64;
            for p in &mut self.processes {
                let mut names = Vec::with_capacity(limit);
                let mut samples = Vec::new();
                for i in 0..limit {
                    let at = (p.position + i) % p.kernels.len();
                    if sampling.on_launch(now) == Decision::Sample
                        && let Some(group) = group
                    {
                        samples.push(Sample {
                            position: i,
                            kernel: Arc::clone(&p.names[at]),
                            group,
                            arch: crate::counters::standin::standin_arch(),
                            values: trace_values(&p.kernels[at], group),
                        });
                    }
                    names.push(Arc::clone(&p.names[at]));
                }
                p.position = (p.position + limit) % p.kernels.len();
                launches += limit as u64;
                snippets.push(Snippet {
                    names,
                    end: SnippetEnd::Limit,
                    samples,
                    ..Snippet::new(p.pid, index)
                });
            }
            let window = WindowStat {
                index,
                launches,
                open_s: opened.elapsed().as_secs_f64(),
                probe_s: 0.0,
                process_cpu_s: None,
                gap_s: self.config.window_every.as_secs_f64(),
            };
            sink(SourceBatch {
                snippets,
                windows: vec![window],
                info: None,
            });
            index += 1;
            let next = opened + self.config.window_every;
            while Instant::now() < next && !stop.load(Ordering::Relaxed) {
                std::thread::sleep(
                    next.saturating_duration_since(Instant::now())
                        .min(Duration::from_millis(50)),
                );
            }
        }
        Ok(())
    }
}
