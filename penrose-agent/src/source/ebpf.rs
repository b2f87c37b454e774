//! The live capture as a snippet source: windows on the overhead-budget schedule.

use std::num::NonZeroU32;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use penrose_core::sampling::SamplePeriod;

use super::{SnippetSource, SourceBatch, SourceError, SourceInfo, WindowStat};
use crate::capture::locate::LibrarySources;
use crate::capture::schedule::{BudgetConfig, OverheadBudget, Schedule};
use crate::capture::{Capture, CaptureConfig, CaptureError, OBSERVE_EVERY};
use crate::config::{AgentConfig, seconds};

/// eBPF probes on libcuda, windows spaced by the overhead budget.
pub struct EbpfSource {
    capture: Capture,
    schedule: Schedule,
    seen_windows: usize,
}

impl EbpfSource {
    /// Loads the probes (needs root; the error says what is missing) and measures the probe
    /// cost when configured to.
    pub fn start(config: &AgentConfig) -> Result<Self, SourceError> {
        let c = &config.capture;
        let sample_period = NonZeroU32::new(c.sample_period)
            .map(SamplePeriod)
            .ok_or_else(|| CaptureError::Sampling("capture.sample_period is 0".into()))?;
        let capture = Capture::start(CaptureConfig {
            sources: LibrarySources {
                explicit: c.libraries.clone(),
                ldconfig: c.scan_system,
                proc_maps: c.scan_system,
            },
            window_launches: c.window_launches,
            poll_interval: Duration::from_millis(1),
            sample_period,
            reoffset_every: seconds(c.reoffset_seconds),
            group_period: seconds(c.group_seconds),
            counters: c.counters,
            calibrate: c.calibrate,
            seed: None,
        })?;
        let budget = OverheadBudget::new(c.budget_percent / 100.0).ok_or_else(|| {
            CaptureError::Sampling(format!("capture.budget_percent {}", c.budget_percent))
        })?;
        let schedule = Schedule::Budget {
            config: BudgetConfig {
                budget,
                max_window: seconds(c.max_window_seconds),
                min_gap: seconds(c.min_gap_seconds),
                max_gap: seconds(c.max_gap_seconds),
            },
            cost: capture.probe_cost(),
        };
        Ok(Self {
            capture,
            schedule,
            seen_windows: 0,
        })
    }
}

impl SnippetSource for EbpfSource {
    fn info(&self) -> SourceInfo {
        SourceInfo {
            kind: "ebpf".into(),
            counters: self.capture.counter_source().into(),
            probe_cost_ns: u64::try_from(self.capture.probe_cost().per_launch.as_nanos())
                .unwrap_or(u64::MAX),
            inputs: self
                .capture
                .libraries()
                .iter()
                .map(|l| l.path.display().to_string())
                .collect(),
        }
    }

    fn run(
        &mut self,
        stop: &AtomicBool,
        sink: &mut dyn FnMut(SourceBatch),
    ) -> Result<(), SourceError> {
        let seen = &mut self.seen_windows;
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
                if !snippets.is_empty() || !windows.is_empty() {
                    sink(SourceBatch { snippets, windows });
                }
            },
        )?;
        Ok(())
    }
}
