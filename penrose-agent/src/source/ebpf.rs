//! The live capture as a snippet source: windows on the overhead-budget schedule.

use std::sync::atomic::AtomicBool;
use std::time::Duration;

use super::{SnippetSource, SourceBatch, SourceError, SourceInfo, WindowStat};
use crate::capture::schedule::{BudgetConfig, Schedule};
use crate::capture::{Capture, CaptureConfig, OBSERVE_EVERY};

/// eBPF probes on libcuda, windows spaced by the overhead budget.
pub struct EbpfSource {
    capture: Capture,
    schedule: Schedule,
    seen_windows: usize,
}

impl EbpfSource {
    /// Loads the probes (needs root; the error says what is missing), opens the counter source
    /// (an error when it cannot be opened: no fallback) and measures the probe cost when
    /// configured to. The settings come resolved from
    /// [`crate::config::AgentConfig::source_plan`].
    pub fn start(capture: CaptureConfig, budget: BudgetConfig) -> Result<Self, SourceError> {
        let capture = Capture::start(capture)?;
        let schedule = Schedule::Budget {
            config: budget,
            cost: capture.probe_cost(),
        };
        Ok(Self {
            capture,
            schedule,
            seen_windows: 0,
        })
    }
}

fn info_of(capture: &Capture) -> SourceInfo {
    let counts = capture.counts();
    SourceInfo {
        kind: "ebpf".into(),
        counters: capture.counter_source().into(),
        gpu_arch: super::archs_text(&capture.gpu_archs()),
        probe_cost_ns: u64::try_from(capture.probe_cost().per_launch.as_nanos())
            .unwrap_or(u64::MAX),
        inputs: capture
            .libraries()
            .iter()
            .map(|l| l.path.display().to_string())
            .collect(),
        libraries_untrusted: counts.libraries_untrusted,
        libraries_over_cap: counts.libraries_over_cap,
        samples: super::SampleStatus {
            sampled: counts.sampled,
            with_values: counts.samples_with_values,
            missing: counts.samples_missing,
            devices: counts.devices,
        },
        graphs: counts.graphs,
    }
}

impl SnippetSource for EbpfSource {
    fn info(&self) -> SourceInfo {
        info_of(&self.capture)
    }

    fn gpu_archs(&self) -> Vec<penrose_core::gpu::GpuArch> {
        self.capture.gpu_archs()
    }

    fn run(
        &mut self,
        stop: &AtomicBool,
        sink: &mut dyn FnMut(SourceBatch),
    ) -> Result<(), SourceError> {
        let seen = &mut self.seen_windows;
        let mut last_info = info_of(&self.capture);
        self.capture.run_observed(
            Duration::MAX,
            &self.schedule,
            stop,
            OBSERVE_EVERY,
            &mut |c| {
                let snippets = c.take_snippets();
                let windows: Vec<WindowStat> =
                    c.history()[*seen..].iter().map(WindowStat::from).collect();
                *seen = c.history().len();
                let now = info_of(c);
                let info = (now != last_info).then(|| {
                    last_info = now.clone();
                    now
                });
                if !snippets.is_empty() || !windows.is_empty() || info.is_some() {
                    sink(SourceBatch {
                        snippets,
                        windows,
                        info,
                    });
                }
            },
        )?;
        Ok(())
    }
}
