//! When capture windows open: a fixed schedule, or one spaced by an overhead budget.
//!
//! A probed launch costs a trap (docs/design.md section 3), so the agent attaches launch probes
//! only inside windows. [`Schedule::Budget`] spaces windows so that the probe cost stays under a
//! share of the probed processes' CPU time: after a window that cost `C` (its launches times
//! the calibrated per-launch cost, [`ProbeCost`]) while those processes used `T` of CPU time,
//! the next window opens only when `C / (T * (window + gap) / window) <= budget`, that is after
//! `gap = window * (C / (budget * T) - 1)`, clamped to `[min_gap, max_gap]`. The processes' CPU
//! rate is assumed steady between windows; the next window measures it again.
//!
//! Pure logic: the agent (`penrose_agent::capture`, which measures [`ProbeCost`] at start and
//! re-exports this module as `capture::schedule`) and the design server's fleet simulator
//! (`penrose_design::simulate`) run the same scheduler.

use std::time::Duration;

/// The measured cost of one probed launch (the agent's start-up calibration measures it).
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ProbeCost {
    /// What a probe hit adds to a launch: trap plus BPF program, median of the rounds.
    pub per_launch: Duration,
    /// The BPF program's own run time per hit (kernel statistics), when they could be read.
    pub bpf_run: Option<Duration>,
    /// One call of the calibration target without the probe.
    pub unprobed_call: Duration,
    /// One call with the probe attached.
    pub probed_call: Duration,
}

impl ProbeCost {
    /// The cost assumed when calibration cannot run (docs/design.md section 3: a trap costs about
    /// 10 us on a VM), so that a scheduler without a measurement errs towards fewer windows.
    pub const ASSUMED: ProbeCost = ProbeCost {
        per_launch: Duration::from_micros(10),
        bpf_run: None,
        unprobed_call: Duration::ZERO,
        probed_call: Duration::from_micros(10),
    };
}

/// The default budget: 0.02% of the probed processes' CPU time (docs/design.md section 3; the
/// paper we compete with reports 0.045% overall).
pub const DEFAULT_BUDGET: OverheadBudget = OverheadBudget(0.0002);

/// A share of the probed processes' CPU time the probes may cost, in (0, 1].
#[derive(Clone, Copy, Debug, PartialEq, PartialOrd, serde::Serialize)]
pub struct OverheadBudget(f64);

impl OverheadBudget {
    /// A budget of `fraction` (0.0002 = 0.02%); `None` outside (0, 1].
    pub fn new(fraction: f64) -> Option<Self> {
        (fraction > 0.0 && fraction <= 1.0).then_some(Self(fraction))
    }

    /// The share.
    pub fn fraction(self) -> f64 {
        self.0
    }
}

/// Settings of the budget scheduler.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct BudgetConfig {
    /// The overhead budget.
    pub budget: OverheadBudget,
    /// The longest a window stays open (it closes earlier when every process reached L).
    pub max_window: Duration,
    /// The shortest gap between windows, even when a window cost nothing (attaching and
    /// detaching probes costs the agent itself about a second of kernel time).
    pub min_gap: Duration,
    /// The longest gap, so that even a heavy launcher is seen now and then.
    pub max_gap: Duration,
}

impl Default for BudgetConfig {
    fn default() -> Self {
        Self {
            budget: DEFAULT_BUDGET,
            max_window: Duration::from_secs(10),
            min_gap: Duration::from_secs(60),
            max_gap: Duration::from_secs(6 * 3600),
        }
    }
}

/// What one closed window cost and what the probed processes did meanwhile.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct WindowCost {
    /// How long the window was open.
    pub open_for: Duration,
    /// Launches the probes trapped.
    pub launches: u64,
    /// CPU time (user + system) the probed processes used while it was open; `None` when it
    /// could not be read (the scheduler then assumes one CPU for the window's length).
    pub process_cpu: Option<Duration>,
}

/// When windows open.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Schedule {
    /// `duration` out of every `period`, the first at start (debugging, benchmarks).
    Fixed {
        /// Time from one window's start to the next one's.
        period: Duration,
        /// How long a window stays open at most.
        duration: Duration,
    },
    /// Windows spaced by the overhead budget and the calibrated probe cost.
    Budget {
        /// The settings.
        config: BudgetConfig,
        /// The calibrated cost of one probed launch.
        cost: ProbeCost,
    },
}

impl Schedule {
    /// The longest a window stays open.
    pub fn max_window(&self) -> Duration {
        match self {
            Schedule::Fixed { duration, .. } => *duration,
            Schedule::Budget { config, .. } => config.max_window,
        }
    }

    /// The gap before the next window, given what the last one cost.
    pub fn gap_after(&self, window: &WindowCost) -> Duration {
        match self {
            Schedule::Fixed { period, .. } => period.saturating_sub(window.open_for),
            Schedule::Budget { config, cost } => budget_gap(config, cost, window),
        }
    }

    /// The share of time with launch probes attached if every window lasts its maximum
    /// (fixed schedules only; a budget schedule's duty cycle depends on the load).
    pub fn fixed_duty_cycle(&self) -> Option<f64> {
        match self {
            Schedule::Fixed { period, duration } => Some(
                (duration.as_secs_f64() / period.as_secs_f64().max(f64::MIN_POSITIVE)).min(1.0),
            ),
            Schedule::Budget { .. } => None,
        }
    }
}

/// The probe cost of a window, from its launch count and the calibrated cost.
pub fn probe_time(cost: &ProbeCost, launches: u64) -> Duration {
    Duration::from_secs_f64(cost.per_launch.as_secs_f64() * launches as f64)
}

fn budget_gap(config: &BudgetConfig, cost: &ProbeCost, window: &WindowCost) -> Duration {
    let spent = probe_time(cost, window.launches).as_secs_f64();
    let open = window.open_for.as_secs_f64();
    let cpu = window
        .process_cpu
        .map(|c| c.as_secs_f64())
        .filter(|c| *c > 0.0)
        .unwrap_or(open);
    let gap = if cpu > 0.0 {
        open * (spent / (config.budget.fraction() * cpu) - 1.0)
    } else {
        0.0
    };
    let gap = Duration::try_from_secs_f64(gap.max(0.0)).unwrap_or(config.max_gap);
    gap.clamp(config.min_gap, config.max_gap.max(config.min_gap))
}

/// The overhead a sequence of windows and gaps actually cost: probe time over the probed
/// processes' CPU time, extrapolated over the gaps at each window's CPU rate.
pub fn achieved_overhead(cost: &ProbeCost, windows: &[(WindowCost, Duration)]) -> Option<f64> {
    let mut spent = 0.0;
    let mut cpu = 0.0;
    for (w, gap) in windows {
        let open = w.open_for.as_secs_f64();
        let used = w.process_cpu?.as_secs_f64();
        spent += probe_time(cost, w.launches).as_secs_f64();
        if open > 0.0 {
            cpu += used * (open + gap.as_secs_f64()) / open;
        }
    }
    (cpu > 0.0).then(|| spent / cpu)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cost(us: u64) -> ProbeCost {
        ProbeCost {
            per_launch: Duration::from_micros(us),
            ..ProbeCost::ASSUMED
        }
    }

    fn budget(config: BudgetConfig, us: u64) -> Schedule {
        Schedule::Budget {
            config,
            cost: cost(us),
        }
    }

    #[test]
    fn the_gap_keeps_the_overhead_at_the_budget() {
        let config = BudgetConfig {
            min_gap: Duration::ZERO,
            max_gap: Duration::from_secs(100_000),
            ..BudgetConfig::default()
        };
        // 10,000 launches at 16 us = 0.16 s of probe time, while the process used 1 CPU-s
        // over a 1 s window: at 0.02% the cycle must hold 800 CPU-s, so the gap is 799 s.
        let window = WindowCost {
            open_for: Duration::from_secs(1),
            launches: 10_000,
            process_cpu: Some(Duration::from_secs(1)),
        };
        let schedule = budget(config, 16);
        let gap = schedule.gap_after(&window);
        assert!((gap.as_secs_f64() - 799.0).abs() < 1e-6, "{gap:?}");
        let achieved = achieved_overhead(&cost(16), &[(window, gap)]).unwrap();
        assert!((achieved - 0.0002).abs() < 1e-12, "{achieved}");
        // Twice the budget halves the cycle.
        let wide = budget(
            BudgetConfig {
                budget: OverheadBudget::new(0.0004).unwrap(),
                ..config
            },
            16,
        );
        assert!((wide.gap_after(&window).as_secs_f64() - 399.0).abs() < 1e-6);
    }

    #[test]
    fn gaps_are_clamped_and_an_idle_window_waits_the_minimum() {
        let config = BudgetConfig::default();
        let schedule = budget(config, 16);
        let idle = WindowCost {
            open_for: Duration::from_secs(10),
            launches: 0,
            process_cpu: Some(Duration::ZERO),
        };
        assert_eq!(schedule.gap_after(&idle), config.min_gap);
        // 0.16 s of probe time against 0.1 ms of CPU: the budget asks for 80,000 s.
        let heavy = WindowCost {
            open_for: Duration::from_millis(10),
            launches: 10_000,
            process_cpu: Some(Duration::from_micros(100)),
        };
        assert_eq!(schedule.gap_after(&heavy), config.max_gap);
    }

    #[test]
    fn unknown_cpu_time_assumes_one_cpu_for_the_window() {
        let config = BudgetConfig {
            min_gap: Duration::ZERO,
            ..BudgetConfig::default()
        };
        let known = WindowCost {
            open_for: Duration::from_secs(2),
            launches: 1_000,
            process_cpu: Some(Duration::from_secs(2)),
        };
        let unknown = WindowCost {
            process_cpu: None,
            ..known
        };
        let s = budget(config, 10);
        assert_eq!(s.gap_after(&known), s.gap_after(&unknown));
    }

    #[test]
    fn budgets_outside_zero_to_one_are_refused() {
        assert!(OverheadBudget::new(0.0).is_none());
        assert!(OverheadBudget::new(-1.0).is_none());
        assert!(OverheadBudget::new(1.5).is_none());
        assert!(OverheadBudget::new(f64::NAN).is_none());
        assert_eq!(OverheadBudget::new(0.5).map(|b| b.fraction()), Some(0.5));
    }

    #[test]
    fn a_fixed_schedule_waits_the_rest_of_its_period() {
        let s = Schedule::Fixed {
            period: Duration::from_secs(10),
            duration: Duration::from_secs(2),
        };
        let w = WindowCost {
            open_for: Duration::from_secs(2),
            launches: 5,
            process_cpu: None,
        };
        assert_eq!(s.gap_after(&w), Duration::from_secs(8));
        assert!((s.fixed_duty_cycle().unwrap() - 0.2).abs() < 1e-12);
    }
}
