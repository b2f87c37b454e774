//! The simulator's parameters, checked once into the models the GPUs run.

use std::time::Duration;

use penrose_core::counters::Catalogue;
use penrose_core::histogram::DEFAULT_SEAL_MAX_AGE;
use penrose_core::release::{ReportsPerContributor, Threshold};
use penrose_core::sampling::{DEFAULT_REOFFSET_INTERVAL, DEFAULT_SAMPLE_PERIOD, SamplePeriod};
use penrose_core::schedule::{BudgetConfig, DEFAULT_BUDGET, OverheadBudget, ProbeCost};
use serde::Serialize;
use thiserror::Error;

use super::fleet::{CaptureModel, Mix};
use super::gpu::{AgentModel, Cap, DAY, SamplerModel};
use super::steer::{Policy, Steering};

/// Seconds in an hour.
pub(super) const HOUR: f64 = 3600.0;
/// The most report counters (applications x groups x epochs x time bins) a run may keep.
const MAX_BINS: u64 = 400_000_000;

/// Why a simulation could not run.
#[derive(Debug, Error, PartialEq)]
pub enum SimulateError {
    /// A parameter is out of range.
    #[error("{name}: {why}")]
    Parameter {
        /// The parameter (as on the command line).
        name: &'static str,
        /// What is wrong.
        why: String,
    },
}

fn bad(name: &'static str, why: impl Into<String>) -> SimulateError {
    SimulateError::Parameter {
        name,
        why: why.into(),
    }
}

/// The release rule the servers apply, and the cap the agent keeps to with it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Rule {
    /// Today's: T reports per (counter, day); a sum holds one epoch's reports, and its
    /// bound `ceil(r / (T x days))` must reach k (`penrose_core::release`).
    Daily,
    /// Issue 25's: q admission tokens per (counter, hour), so an agent seals at most q reports
    /// per (counter, hour); a sum is released the moment its bound reaches k, the bound being
    /// the larger of `max over hours h of ceil(r_h / q)` (one credential spends at most q
    /// tokens of hour h) and `ceil(r / (q x H))` over the H hours its reports span.
    Hourly,
}

impl std::fmt::Display for Rule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Rule::Daily => "daily",
            Rule::Hourly => "hourly",
        })
    }
}

/// Every parameter of a run, in plain units; [`Params::check`] validates them once.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Params {
    /// N: GPUs in the fleet.
    pub gpus: u64,
    /// A: applications, one scenario per value.
    pub apps: Vec<u32>,
    /// Workload mixes, one scenario per value.
    pub mixes: Vec<Mix>,
    /// Zipf exponent of application popularity (0: uniform).
    pub zipf: f64,
    /// Share of GPUs busy with an application (the rest idle for the whole run).
    pub load: f64,
    /// Simulated hours.
    pub hours: f64,
    /// The sampler model.
    pub sampler: SamplerModel,
    /// S.
    pub sample_period: u32,
    /// O, seconds.
    pub reoffset_seconds: f64,
    /// Overhead budgets, percent of the probed processes' CPU time; one scenario per value.
    pub budgets_percent: Vec<f64>,
    /// Probe cost per launch, microseconds.
    pub probe_cost_us: f64,
    /// L: launches per process per window.
    pub window_launches: u64,
    /// Longest window, seconds.
    pub max_window_seconds: f64,
    /// Shortest gap, seconds.
    pub min_gap_seconds: f64,
    /// Longest gap, seconds.
    pub max_gap_seconds: f64,
    /// CPU cores the probed process keeps busy.
    pub process_cpu: f64,
    /// Counter groups rotated.
    pub groups: u8,
    /// How long each group stays active, seconds.
    pub group_seconds: f64,
    /// Seal size, samples.
    pub seal_samples: u64,
    /// Seal age, seconds.
    pub seal_max_age_seconds: f64,
    /// T: reports per (counter, day) an agent sends at most, and the servers count with.
    pub reports_per_day: u32,
    /// k: contributors a released sum needs.
    pub threshold: u64,
    /// The release rule.
    pub rule: Rule,
    /// q: reports per (counter, hour) an agent sends at most under [`Rule::Hourly`].
    pub reports_per_hour: u32,
    /// Epoch length, hours (the daily rule's; the hourly rule's epochs are hours).
    pub epoch_hours: f64,
    /// Longest random upload delay, seconds.
    pub upload_delay_seconds: f64,
    /// Time resolution of report arrivals, seconds.
    pub resolution_seconds: f64,
    /// Steering by the ack (`none`: the shipped agent).
    pub steer: Policy,
    /// f: a class short of release samples 1 in S / f, a released one 1 in S x f (policies
    /// `rate` and `both`).
    pub steer_factor: u32,
    /// The seal age of a class short of release, seconds (policies `seal-age` and `both`).
    pub steer_seal_age_seconds: f64,
    /// How often the simulated server's counts are brought up to date for the hints, seconds.
    pub steer_step_seconds: f64,
    /// Seed.
    pub seed: u64,
}

impl Default for Params {
    /// The paper's fleet and the shipped defaults of the agent and the servers.
    fn default() -> Self {
        let schedule = BudgetConfig::default();
        Self {
            gpus: 100_000,
            apps: vec![500, 1_000, 2_000],
            mixes: Mix::ALL.to_vec(),
            zipf: 1.0,
            load: 1.0,
            hours: 24.0,
            sampler: SamplerModel::Countdown,
            sample_period: DEFAULT_SAMPLE_PERIOD.get(),
            reoffset_seconds: DEFAULT_REOFFSET_INTERVAL.as_secs_f64(),
            budgets_percent: vec![DEFAULT_BUDGET.fraction() * 100.0],
            probe_cost_us: ProbeCost::ASSUMED.per_launch.as_secs_f64() * 1e6,
            // The agent's `capture::window::DEFAULT_WINDOW_LAUNCHES`.
            window_launches: 10_000,
            max_window_seconds: schedule.max_window.as_secs_f64(),
            min_gap_seconds: schedule.min_gap.as_secs_f64(),
            max_gap_seconds: schedule.max_gap.as_secs_f64(),
            process_cpu: 1.0,
            groups: Catalogue::current().groups().len() as u8,
            // The agent's `capture.group_seconds`, `seal.samples`, `seal.max_age_seconds` and
            // `upload.delay_max_seconds` defaults.
            group_seconds: 600.0,
            seal_samples: 10_000,
            seal_max_age_seconds: DEFAULT_SEAL_MAX_AGE.as_secs_f64(),
            reports_per_day: ReportsPerContributor::DEFAULT.get(),
            threshold: Threshold::DEFAULT.get(),
            rule: Rule::Daily,
            reports_per_hour: 1,
            epoch_hours: 24.0,
            upload_delay_seconds: 60.0,
            resolution_seconds: 60.0,
            steer: Policy::None,
            steer_factor: 10,
            steer_seal_age_seconds: 300.0,
            steer_step_seconds: 300.0,
            seed: 1,
        }
    }
}

fn positive(name: &'static str, v: f64) -> Result<f64, SimulateError> {
    if v.is_finite() && v > 0.0 {
        Ok(v)
    } else {
        Err(bad(name, format!("must be a positive number, not {v}")))
    }
}

fn non_negative(name: &'static str, v: f64) -> Result<f64, SimulateError> {
    if v.is_finite() && v >= 0.0 {
        Ok(v)
    } else {
        Err(bad(name, format!("must be zero or more, not {v}")))
    }
}

fn duration(name: &'static str, seconds: f64) -> Result<Duration, SimulateError> {
    Duration::try_from_secs_f64(non_negative(name, seconds)?)
        .map_err(|e| bad(name, format!("{seconds} s: {e}")))
}

impl Params {
    /// Checks every parameter and derives the models the GPUs run.
    pub fn check(&self) -> Result<Checked, SimulateError> {
        let hours = self.check_fleet()?;
        let schedule = self.check_schedule()?;
        self.check_agent()?;
        let epoch = self.epoch_seconds()?;
        let upload_delay = non_negative("--upload-delay-seconds", self.upload_delay_seconds)?;
        let horizon = hours * HOUR;
        let epochs = (horizon / epoch).ceil() as u64;
        let bins = self.bins(epochs, epoch + upload_delay)?;
        let agent = AgentModel {
            sampler: self.sampler,
            period: schedule.period,
            reoffset: duration("--reoffset-seconds", self.reoffset_seconds)?,
            groups: self.groups,
            group_seconds: self.group_seconds,
            seal_samples: self.seal_samples,
            seal_age: self.seal_max_age_seconds,
            cap: self.cap()?,
            upload_delay,
            steering: self.steering()?,
        };
        Ok(Checked {
            params: self.clone(),
            agent,
            scenarios: self.scenarios(&schedule),
            horizon,
            epoch,
            epochs: epochs as usize,
            bins: bins as usize,
        })
    }

    /// The fleet: GPUs, applications, mixes, popularity, load and hours (returned).
    fn check_fleet(&self) -> Result<f64, SimulateError> {
        if self.gpus == 0 {
            return Err(bad("--gpus", "at least one GPU"));
        }
        if self.apps.is_empty() || self.apps.contains(&0) {
            return Err(bad(
                "--apps",
                "one or more application counts, each at least 1",
            ));
        }
        if self.mixes.is_empty() {
            return Err(bad("--mixes", "at least one mix"));
        }
        non_negative("--zipf", self.zipf)?;
        if !(self.load > 0.0 && self.load <= 1.0) {
            return Err(bad(
                "--load",
                format!("a share in (0, 1], not {}", self.load),
            ));
        }
        let hours = positive("--hours", self.hours)?;
        if hours > 24.0 * 366.0 {
            return Err(bad("--hours", "at most a year"));
        }
        Ok(hours)
    }

    /// The capture schedule: S, budgets, probe cost, window and gap lengths.
    fn check_schedule(&self) -> Result<Schedule, SimulateError> {
        let period = std::num::NonZeroU32::new(self.sample_period)
            .map(SamplePeriod)
            .ok_or_else(|| bad("--sample-period", "S is at least 1"))?;
        if self.budgets_percent.is_empty() {
            return Err(bad("--budget", "at least one budget"));
        }
        for &b in &self.budgets_percent {
            OverheadBudget::new(b / 100.0)
                .ok_or_else(|| bad("--budget", format!("a percentage in (0, 100], not {b}")))?;
        }
        let cost = duration(
            "--probe-cost-us",
            positive("--probe-cost-us", self.probe_cost_us)? / 1e6,
        )?;
        let max_window = duration(
            "--max-window-seconds",
            positive("--max-window-seconds", self.max_window_seconds)?,
        )?;
        // The simulator steps window by window; gaps under a second would make that a replay.
        if non_negative("--min-gap-seconds", self.min_gap_seconds)? < 1.0 {
            return Err(bad(
                "--min-gap-seconds",
                format!("at least 1 s here, not {}", self.min_gap_seconds),
            ));
        }
        let min_gap = duration("--min-gap-seconds", self.min_gap_seconds)?;
        let max_gap = duration("--max-gap-seconds", self.max_gap_seconds)?;
        if max_gap < min_gap {
            return Err(bad("--max-gap-seconds", "below --min-gap-seconds"));
        }
        Ok(Schedule {
            period,
            cost,
            max_window,
            min_gap,
            max_gap,
        })
    }

    /// The agent and release parameters that have floors of their own.
    fn check_agent(&self) -> Result<(), SimulateError> {
        if self.window_launches == 0 {
            return Err(bad("--window-launches", "L is at least 1"));
        }
        positive("--process-cpu", self.process_cpu)?;
        if self.groups == 0 {
            return Err(bad("--groups", "at least one counter group"));
        }
        positive("--group-seconds", self.group_seconds)?;
        if self.seal_samples == 0 {
            return Err(bad("--seal-samples", "at least 1"));
        }
        positive("--seal-max-age-seconds", self.seal_max_age_seconds)?;
        if self.reports_per_day == 0 {
            return Err(bad("--reports-per-day", "T is at least 1"));
        }
        if self.threshold == 0 {
            return Err(bad("--threshold", "k is at least 1"));
        }
        Ok(())
    }

    /// Time bins per epoch (an epoch and its upload delay at the resolution), refused when
    /// the report counters they need would not fit.
    fn bins(&self, epochs: u64, span: f64) -> Result<u64, SimulateError> {
        let resolution = positive("--resolution-seconds", self.resolution_seconds)?;
        let bins = (span / resolution).ceil() as u64 + 1;
        let needed = u64::from(self.apps.iter().copied().max().unwrap_or(1))
            * u64::from(self.groups)
            * epochs
            * bins;
        if needed > MAX_BINS {
            return Err(bad(
                "--resolution-seconds",
                format!("{needed} report counters would be kept; make the resolution coarser"),
            ));
        }
        Ok(bins)
    }

    /// One scenario per (applications, mix, budget).
    fn scenarios(&self, schedule: &Schedule) -> Vec<Scenario> {
        let capture = |budget: OverheadBudget| CaptureModel {
            schedule: BudgetConfig {
                budget,
                max_window: schedule.max_window,
                min_gap: schedule.min_gap,
                max_gap: schedule.max_gap,
            },
            cost: ProbeCost {
                per_launch: schedule.cost,
                bpf_run: None,
                unprobed_call: Duration::ZERO,
                probed_call: schedule.cost,
            },
            window_launches: self.window_launches,
            process_cpu: self.process_cpu,
        };
        let mut scenarios = Vec::new();
        for &apps in &self.apps {
            for &mix in &self.mixes {
                for &b in &self.budgets_percent {
                    let budget = OverheadBudget::new(b / 100.0).unwrap_or(DEFAULT_BUDGET);
                    scenarios.push(Scenario {
                        apps,
                        mix,
                        budget_percent: b,
                        capture: capture(budget),
                    });
                }
            }
        }
        scenarios
    }
}

/// The capture schedule's checked parameters.
struct Schedule {
    period: SamplePeriod,
    cost: Duration,
    max_window: Duration,
    min_gap: Duration,
    max_gap: Duration,
}

impl Params {
    /// The epoch length in seconds: `--epoch-hours` under the daily rule, an hour under the
    /// hourly one (which takes no other).
    fn epoch_seconds(&self) -> Result<f64, SimulateError> {
        let hours = positive("--epoch-hours", self.epoch_hours)?;
        match self.rule {
            Rule::Daily => Ok(hours * HOUR),
            Rule::Hourly if hours == 24.0 || hours == 1.0 => Ok(HOUR),
            Rule::Hourly => Err(bad(
                "--epoch-hours",
                "the hourly rule's epochs are hours (leave --epoch-hours out)",
            )),
        }
    }

    /// The steering policy, checked: none, or its factor, seal age and step in range (and
    /// only under the daily rule).
    fn steering(&self) -> Result<Steering, SimulateError> {
        if self.steer_factor == 0 {
            return Err(bad("--steer-factor", "f is at least 1"));
        }
        let short_seal_age = positive("--steer-seal-age-seconds", self.steer_seal_age_seconds)?;
        // A step under a minute would only slow the run: hints are at least a window old.
        if positive("--steer-step-seconds", self.steer_step_seconds)? < 60.0 {
            return Err(bad(
                "--steer-step-seconds",
                format!("at least 60 s, not {}", self.steer_step_seconds),
            ));
        }
        Ok(match self.steer {
            Policy::None => Steering::OFF,
            _ if self.rule == Rule::Hourly => {
                return Err(bad(
                    "--steer",
                    "steering is modelled for the daily rule only",
                ));
            }
            policy => Steering {
                policy,
                rate_factor: self.steer_factor,
                short_seal_age,
            },
        })
    }

    /// The agent's cap: T per day, or q per hour.
    fn cap(&self) -> Result<Cap, SimulateError> {
        match self.rule {
            Rule::Daily => Ok(Cap {
                reports: self.reports_per_day,
                period: DAY,
            }),
            Rule::Hourly if self.reports_per_hour == 0 => {
                Err(bad("--reports-per-hour", "q is at least 1"))
            }
            Rule::Hourly => Ok(Cap {
                reports: self.reports_per_hour,
                period: HOUR,
            }),
        }
    }
}

/// Validated parameters and the scenarios they span.
#[derive(Clone, Debug)]
pub struct Checked {
    /// What was asked.
    pub params: Params,
    /// The agent every GPU runs.
    pub agent: AgentModel,
    /// One per (A, mix, budget), in that order.
    pub scenarios: Vec<Scenario>,
    /// The simulated time, seconds.
    pub(super) horizon: f64,
    /// Epoch length, seconds.
    pub(super) epoch: f64,
    /// Epochs that start within the run.
    pub(super) epochs: usize,
    /// Time bins of report arrivals per epoch.
    pub(super) bins: usize,
}

/// One (A, mix, budget) combination.
#[derive(Clone, Copy, Debug)]
pub struct Scenario {
    /// A.
    pub apps: u32,
    /// The mix.
    pub mix: Mix,
    /// The budget, percent.
    pub budget_percent: f64,
    /// The capture settings with that budget.
    pub capture: CaptureModel,
}
