//! `penrose-design simulate`: arguments, progress bar and outputs around [`super::Params`].

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use super::fleet::Mix;
use super::gpu::SamplerModel;
use super::params::Rule;
use super::steer::Policy;
use super::{Params, svg, table};

/// How long until a fleet's applications are covered: simulate N GPUs running A applications
/// with the agent's sampler, budget scheduler and sealing, and the servers' release rule.
///
/// An application is covered when every counter group has, within one epoch, enough reports
/// at the aggregation server for its sum to be released: at least k contributors counted as
/// reports / T (217 reports with the defaults). The table also gives the hours until every
/// group has one report (reported) and one sampled launch (sampled), and the plot the share
/// released over time. The model and every assumption: docs/evaluation.md, "Fleet coverage
/// (simulated)". A run is seeded and reproducible; the thread count does not change it.
///
/// Examples (the paper's table; one cell at three budgets; JSON and the plot):
///
///   penrose-design simulate
///
///   penrose-design simulate --apps 2000 --mixes small-kernel --budget 0.02,0.05,0.1
///
///   penrose-design simulate --json --svg coverage.svg > coverage.json
///
/// Steering by the ack (what the aggregation server's ack could ask of agents; not in the
/// shipped agent): the small-kernel mix with each policy:
///
///   penrose-design simulate --mixes small-kernel --steer seal-age
#[derive(Args, Debug)]
pub struct SimulateArgs {
    /// N: GPUs in the fleet.
    #[arg(long, default_value_t = 100_000)]
    gpus: u64,
    /// A: application counts, one scenario each (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "500,1000,2000")]
    apps: Vec<u32>,
    /// Workload mixes: uniform, small-kernel, large-kernel (comma-separated).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "uniform,small-kernel,large-kernel"
    )]
    mixes: Vec<Mix>,
    /// Zipf exponent s of application popularity (rank r runs on a share proportional to
    /// r^-s; 0 is uniform).
    #[arg(long, default_value_t = 1.0)]
    zipf: f64,
    /// Share of GPUs busy with an application; the rest are idle for the whole run.
    #[arg(long, default_value_t = 1.0)]
    load: f64,
    /// Simulated hours.
    #[arg(long, default_value_t = 24.0)]
    hours: f64,
    /// countdown (the agent's sampler: every S-th launch from a random offset) or bernoulli
    /// (each launch with probability 1/S, the P_hit model).
    #[arg(long, value_enum, default_value = "countdown")]
    sampler: SamplerArg,
    /// S: one launch in S sampled.
    #[arg(long, default_value_t = Params::default().sample_period)]
    sample_period: u32,
    /// O: the countdown's random offset is re-drawn this often, seconds.
    #[arg(long, default_value_t = Params::default().reoffset_seconds)]
    reoffset_seconds: f64,
    /// Overhead budgets, percent of the probed processes' CPU time, one scenario each.
    #[arg(long, value_delimiter = ',', default_value = "0.02")]
    budget: Vec<f64>,
    /// The probe cost of one launch, microseconds (the agent calibrates it; 10 assumed, about
    /// 12 measured on a VM, about 1 on bare metal).
    #[arg(long, default_value_t = Params::default().probe_cost_us)]
    probe_cost_us: f64,
    /// L: launches per process per window.
    #[arg(long, default_value_t = Params::default().window_launches)]
    window_launches: u64,
    /// Longest window, seconds.
    #[arg(long, default_value_t = Params::default().max_window_seconds)]
    max_window_seconds: f64,
    /// Shortest gap between windows, seconds.
    #[arg(long, default_value_t = Params::default().min_gap_seconds)]
    min_gap_seconds: f64,
    /// Longest gap between windows, seconds.
    #[arg(long, default_value_t = Params::default().max_gap_seconds)]
    max_gap_seconds: f64,
    /// CPU cores the probed process keeps busy (its CPU time per second).
    #[arg(long, default_value_t = 1.0)]
    process_cpu: f64,
    /// Counter groups the agent rotates through (the catalogue's by default).
    #[arg(long, default_value_t = Params::default().groups)]
    groups: u8,
    /// How long each counter group stays active, seconds.
    #[arg(long, default_value_t = Params::default().group_seconds)]
    group_seconds: f64,
    /// A histogram is sealed at this many samples ...
    #[arg(long, default_value_t = Params::default().seal_samples)]
    seal_samples: u64,
    /// ... or this many seconds after it opened.
    #[arg(long, default_value_t = Params::default().seal_max_age_seconds)]
    seal_max_age_seconds: f64,
    /// T: reports per (counter, day) an agent sends at most, and the servers count with.
    #[arg(long, default_value_t = Params::default().reports_per_day)]
    reports_per_day: u32,
    /// k: contributors a released sum needs (the servers' floor is 10; lower values only show
    /// what the threshold costs).
    #[arg(long, default_value_t = Params::default().threshold)]
    threshold: u64,
    /// The release rule: daily (today's: T reports per counter and day, one-day epochs, a sum
    /// released once its epoch's bound reaches k) or hourly (issue 25's proposal: q tokens per
    /// counter and hour, a sum released the moment its bound reaches k).
    #[arg(long, value_enum, default_value_t = Rule::Daily)]
    rule: Rule,
    /// q: reports per (counter, hour) an agent sends at most under --rule hourly.
    #[arg(long, default_value_t = Params::default().reports_per_hour)]
    reports_per_hour: u32,
    /// Epoch length, hours (the aggregation server's default policy: one day).
    #[arg(long, default_value_t = 24.0)]
    epoch_hours: f64,
    /// The uploader's longest random delay, seconds.
    #[arg(long, default_value_t = Params::default().upload_delay_seconds)]
    upload_delay_seconds: f64,
    /// Time resolution of report arrivals (the released times are rounded up to it), seconds.
    #[arg(long, default_value_t = Params::default().resolution_seconds)]
    resolution_seconds: f64,
    /// Steering by the ack, a policy not in the shipped agent: the aggregation server's ack
    /// says, per counter group of the report's class, whether this epoch's reports are still
    /// short of release; the agent then changes, for that application: none (nothing, the
    /// shipped agent), rate (samples 1 in S / f while short, 1 in S x f once released),
    /// seal-age (seals at --steer-seal-age-seconds while short), both. The cap T and the
    /// threshold k hold either way. Steered runs advance all GPUs together in steps and are
    /// slower.
    #[arg(long, default_value = "none")]
    steer: Policy,
    /// f for --steer rate and both.
    #[arg(long, default_value_t = Params::default().steer_factor)]
    steer_factor: u32,
    /// The seal age of a class short of release, seconds, for --steer seal-age and both.
    #[arg(long, default_value_t = Params::default().steer_seal_age_seconds)]
    steer_seal_age_seconds: f64,
    /// How often the simulated server's counts behind the hints are brought up to date,
    /// seconds (at least 60).
    #[arg(long, default_value_t = Params::default().steer_step_seconds)]
    steer_step_seconds: f64,
    /// Seed.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Worker threads (default: the CPUs available); the results do not depend on it.
    #[arg(long)]
    threads: Option<usize>,
    /// Print JSON (parameters, each scenario's hours and coverage curve) instead of the table.
    #[arg(long)]
    json: bool,
    /// Also write the plot to this SVG file.
    #[arg(long)]
    svg: Option<PathBuf>,
    /// No progress bar.
    #[arg(long)]
    quiet: bool,
}

/// The sampler, as named on the command line.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
enum SamplerArg {
    Countdown,
    Bernoulli,
}

impl SimulateArgs {
    /// The parameters these arguments ask for (checked by [`Params::check`]).
    pub fn params(&self) -> Params {
        Params {
            gpus: self.gpus,
            apps: self.apps.clone(),
            mixes: self.mixes.clone(),
            zipf: self.zipf,
            load: self.load,
            hours: self.hours,
            sampler: match self.sampler {
                SamplerArg::Countdown => SamplerModel::Countdown,
                SamplerArg::Bernoulli => SamplerModel::Bernoulli,
            },
            sample_period: self.sample_period,
            reoffset_seconds: self.reoffset_seconds,
            budgets_percent: self.budget.clone(),
            probe_cost_us: self.probe_cost_us,
            window_launches: self.window_launches,
            max_window_seconds: self.max_window_seconds,
            min_gap_seconds: self.min_gap_seconds,
            max_gap_seconds: self.max_gap_seconds,
            process_cpu: self.process_cpu,
            groups: self.groups,
            group_seconds: self.group_seconds,
            seal_samples: self.seal_samples,
            seal_max_age_seconds: self.seal_max_age_seconds,
            reports_per_day: self.reports_per_day,
            threshold: self.threshold,
            rule: self.rule,
            reports_per_hour: self.reports_per_hour,
            epoch_hours: self.epoch_hours,
            upload_delay_seconds: self.upload_delay_seconds,
            resolution_seconds: self.resolution_seconds,
            steer: self.steer,
            steer_factor: self.steer_factor,
            steer_seal_age_seconds: self.steer_seal_age_seconds,
            steer_step_seconds: self.steer_step_seconds,
            seed: self.seed,
        }
    }
}

/// Runs the simulation the arguments ask for and prints (and writes) its outputs.
pub fn main(args: &SimulateArgs) -> Result<()> {
    let checked = args.params().check()?;
    let threads = args
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
        .max(1);
    let total = checked.params.gpus * checked.scenarios.len() as u64;
    let bar = if args.quiet {
        ProgressBar::hidden()
    } else {
        // Drawn on stderr only when it is a terminal.
        ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr())
    };
    bar.set_style(
        ProgressStyle::with_template(
            "{elapsed_precise} [{bar:40}] {human_pos}/{human_len} GPU runs ({eta} left)",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let sim = checked.run(threads, &|n| bar.inc(n));
    bar.finish_and_clear();
    if let Some(path) = &args.svg {
        std::fs::write(path, svg(&sim)).with_context(|| format!("writing {}", path.display()))?;
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&sim)?);
    } else {
        print!("{}", table(&sim));
    }
    Ok(())
}
