//! The fleet: which application each GPU runs (popularity), how each application launches
//! kernels (the workload mix), and the capture windows the agent's budget scheduler gives it.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use penrose_core::schedule::{BudgetConfig, ProbeCost, Schedule, WindowCost};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;

/// Application popularity: Zipf over ranks 1..=A, the share of rank r proportional to r^-s
/// (s = 0 is uniform). Each GPU draws its application from it independently.
#[derive(Clone, Debug)]
pub struct Popularity {
    /// Cumulative shares, rank 1 first; the last is 1.
    cdf: Vec<f64>,
}

impl Popularity {
    /// Zipf with `exponent` over `apps` applications (`apps` >= 1, `exponent` >= 0, finite).
    pub fn zipf(apps: u32, exponent: f64) -> Self {
        let weights: Vec<f64> = (1..=apps.max(1))
            .map(|r| f64::from(r).powf(-exponent))
            .collect();
        let total: f64 = weights.iter().sum();
        let mut acc = 0.0;
        let mut cdf: Vec<f64> = weights
            .iter()
            .map(|w| {
                acc += w / total;
                acc
            })
            .collect();
        if let Some(last) = cdf.last_mut() {
            *last = 1.0;
        }
        Self { cdf }
    }

    /// The number of applications.
    pub fn apps(&self) -> u32 {
        self.cdf.len() as u32
    }

    /// The share of GPUs that run application `app` (0-based rank).
    pub fn share(&self, app: u32) -> f64 {
        let i = app as usize;
        match i {
            0 => self.cdf.first().copied().unwrap_or(0.0),
            _ => self.cdf.get(i).map_or(0.0, |c| c - self.cdf[i - 1]),
        }
    }

    /// The application a uniform draw `u` in [0, 1) picks.
    pub fn pick(&self, u: f64) -> u32 {
        let i = self.cdf.partition_point(|&c| c <= u);
        i.min(self.cdf.len() - 1) as u32
    }
}

/// Shortest and longest mean kernel duration an application can have (seconds): 5 us (a
/// launch-bound element-wise kernel) to 50 ms (a large GEMM or a fused attention block).
pub const KERNEL_RANGE: (f64, f64) = (5e-6, 50e-3);
/// Mean kernel durations of small-kernel applications (seconds).
pub const SMALL_KERNELS: (f64, f64) = (5e-6, 50e-6);
/// Mean kernel durations of large-kernel applications (seconds).
pub const LARGE_KERNELS: (f64, f64) = (1e-3, 50e-3);
/// Share of a dominated mix's applications drawn from the dominating range.
pub const DOMINANT_SHARE: f64 = 0.8;
/// Share of the time the GPU is busy with the application's kernels.
pub const GPU_BUSY: f64 = 0.9;
/// Host-side cost of one launch: the fastest an application can launch is one per 5 us.
pub const LAUNCH_OVERHEAD: f64 = 5e-6;

/// A workload mix: how the fleet's applications' mean kernel durations are distributed. An
/// application launches `GPU_BUSY / mean kernel duration` kernels per second (at most one per
/// `LAUNCH_OVERHEAD`), steadily, on every GPU that runs it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mix {
    /// Mean kernel duration log-uniform over 5 us..50 ms: 18 to 180,000 launches/s.
    Uniform,
    /// 80% of applications log-uniform over 5..50 us (18,000 to 180,000 launches/s), the rest
    /// as in `Uniform`.
    SmallKernel,
    /// 80% of applications log-uniform over 1..50 ms (18 to 900 launches/s), the rest as in
    /// `Uniform`.
    LargeKernel,
}

impl Mix {
    /// All three, in table order.
    pub const ALL: [Mix; 3] = [Mix::Uniform, Mix::SmallKernel, Mix::LargeKernel];

    /// The name used on the command line and in tables.
    pub fn name(self) -> &'static str {
        match self {
            Mix::Uniform => "uniform",
            Mix::SmallKernel => "small-kernel",
            Mix::LargeKernel => "large-kernel",
        }
    }

    /// Draws one application's mean kernel duration (seconds).
    pub fn draw_kernel(self, rng: &mut impl Rng) -> f64 {
        let dominant = match self {
            Mix::Uniform => None,
            Mix::SmallKernel => Some(SMALL_KERNELS),
            Mix::LargeKernel => Some(LARGE_KERNELS),
        };
        let range = match dominant {
            Some(range) if rng.random::<f64>() < DOMINANT_SHARE => range,
            _ => KERNEL_RANGE,
        };
        log_uniform(rng, range)
    }
}

impl fmt::Display for Mix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Mix {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "uniform" => Ok(Mix::Uniform),
            "small" | "small-kernel" => Ok(Mix::SmallKernel),
            "large" | "large-kernel" => Ok(Mix::LargeKernel),
            other => Err(format!(
                "unknown mix {other:?}: expected uniform, small-kernel or large-kernel"
            )),
        }
    }
}

fn log_uniform(rng: &mut impl Rng, (lo, hi): (f64, f64)) -> f64 {
    let u: f64 = rng.random();
    (lo.ln() + u * (hi.ln() - lo.ln())).exp()
}

/// Launches per second of an application whose mean kernel lasts `kernel` seconds.
pub fn launch_rate(kernel: f64) -> f64 {
    (GPU_BUSY / kernel).min(1.0 / LAUNCH_OVERHEAD)
}

/// What the agent's capture does with one application, window after window.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct AppProfile {
    /// Mean kernel duration, seconds.
    pub kernel_seconds: f64,
    /// Launches per second.
    pub launch_rate: f64,
    /// How long a window stays open: until the process reached L, or the longest window.
    pub window_seconds: f64,
    /// Launches probed in one window.
    pub window_launches: u64,
    /// From one window's opening to the next one's: the window plus the scheduler's gap.
    pub cycle_seconds: f64,
}

/// The capture settings the scheduler needs.
#[derive(Clone, Copy, Debug)]
pub struct CaptureModel {
    /// The budget scheduler's settings.
    pub schedule: BudgetConfig,
    /// The calibrated probe cost.
    pub cost: ProbeCost,
    /// L: launches per process per window.
    pub window_launches: u64,
    /// CPU cores the probed process keeps busy (its CPU time over wall time).
    pub process_cpu: f64,
}

impl CaptureModel {
    /// The windows of an application with mean kernel `kernel` seconds: the window closes at L
    /// launches or at the longest window, and the agent's own scheduler
    /// (`penrose_core::schedule::Schedule::Budget`) computes the gap from what it cost.
    pub fn profile(&self, kernel: f64) -> AppProfile {
        let rate = launch_rate(kernel);
        let longest = self.schedule.max_window.as_secs_f64();
        // Launches in the longest window, with a little slack for rounding (50/s for 10 s is
        // 500, not 499.99...).
        let in_longest = (rate * longest * (1.0 + 1e-12)).floor();
        let (window, launches) = if in_longest >= self.window_launches as f64 {
            (self.window_launches as f64 / rate, self.window_launches)
        } else {
            (longest, in_longest as u64)
        };
        let open_for = Duration::from_secs_f64(window);
        let schedule = Schedule::Budget {
            config: self.schedule,
            cost: self.cost,
        };
        let gap = schedule.gap_after(&WindowCost {
            open_for,
            launches,
            process_cpu: Some(Duration::from_secs_f64(window * self.process_cpu)),
        });
        AppProfile {
            kernel_seconds: kernel,
            launch_rate: rate,
            window_seconds: window,
            window_launches: launches,
            cycle_seconds: window + gap.as_secs_f64(),
        }
    }
}

/// The applications of one scenario: popularity and each one's capture profile. The profiles
/// depend only on the seed, A and the mix, so that budgets and fleets compare on equal terms.
#[derive(Clone, Debug)]
pub struct Apps {
    /// Popularity by rank.
    pub popularity: Popularity,
    /// Profile by rank.
    pub profiles: Vec<AppProfile>,
}

impl Apps {
    /// Draws `count` applications' kernels from `mix` with `seed`, Zipf `exponent`.
    pub fn draw(count: u32, exponent: f64, mix: Mix, capture: &CaptureModel, seed: u64) -> Self {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let profiles = (0..count)
            .map(|_| capture.profile(mix.draw_kernel(&mut rng)))
            .collect();
        Self {
            popularity: Popularity::zipf(count, exponent),
            profiles,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zipf_shares_add_up_and_fall_with_rank() {
        let p = Popularity::zipf(1000, 1.0);
        let total: f64 = (0..1000).map(|a| p.share(a)).sum();
        assert!((total - 1.0).abs() < 1e-9);
        // Rank 1 has twice rank 2's share and ten times rank 10's.
        assert!((p.share(0) / p.share(1) - 2.0).abs() < 1e-9);
        assert!((p.share(0) / p.share(9) - 10.0).abs() < 1e-9);
        assert_eq!(p.pick(0.0), 0);
        assert_eq!(p.pick(0.999_999_999), 999);
        let uniform = Popularity::zipf(4, 0.0);
        assert_eq!([0.1, 0.3, 0.6, 0.9].map(|u| uniform.pick(u)), [0, 1, 2, 3]);
    }

    #[test]
    fn windows_follow_the_budget() {
        let capture = CaptureModel {
            schedule: BudgetConfig::default(),
            cost: ProbeCost::ASSUMED,
            window_launches: 10_000,
            process_cpu: 1.0,
        };
        // 100,000 launches/s fills L in 0.1 s; 10,000 x 10 us = 0.1 s of probes; at 0.02% of one
        // CPU the cycle is 500 s.
        let fast = capture.profile(GPU_BUSY / 100_000.0);
        assert_eq!(fast.window_launches, 10_000);
        assert!((fast.window_seconds - 0.1).abs() < 1e-9);
        assert!((fast.cycle_seconds - 500.0).abs() < 1e-6, "{fast:?}");
        // 50 launches/s: 500 launches in the longest window (10 s), cost 5 ms, which the budget
        // would allow every 25 s; the minimum gap (60 s) rules.
        let slow = capture.profile(GPU_BUSY / 50.0);
        assert_eq!(slow.window_launches, 500);
        assert!((slow.cycle_seconds - 70.0).abs() < 1e-6, "{slow:?}");
    }

    #[test]
    fn mixes_draw_from_their_ranges() {
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        for mix in Mix::ALL {
            let kernels: Vec<f64> = (0..10_000).map(|_| mix.draw_kernel(&mut rng)).collect();
            assert!(
                kernels
                    .iter()
                    .all(|k| (KERNEL_RANGE.0..=KERNEL_RANGE.1).contains(k))
            );
            let small = kernels.iter().filter(|&&k| k <= SMALL_KERNELS.1).count() as f64;
            let large = kernels.iter().filter(|&&k| k >= LARGE_KERNELS.0).count() as f64;
            // Log-uniform over 4 decades: 5-50 us is 1 of them, 1-50 ms 1.7.
            let (want_small, want_large) = match mix {
                Mix::Uniform => (0.25, 0.425),
                Mix::SmallKernel => (0.8 + 0.2 * 0.25, 0.2 * 0.425),
                Mix::LargeKernel => (0.2 * 0.25, 0.8 + 0.2 * 0.425),
            };
            assert!(
                (small / 10_000.0 - want_small).abs() < 0.02,
                "{mix} {small}"
            );
            assert!(
                (large / 10_000.0 - want_large).abs() < 0.02,
                "{mix} {large}"
            );
            assert_eq!(mix.name().parse::<Mix>(), Ok(mix));
        }
    }
}
