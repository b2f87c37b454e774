//! `cargo xtask eval-exactness`: how exact a released distribution is (issue 25, item 7).
//!
//! The real traces hold every launch's duration and launch shape: ground truth for the counters
//! the stand-in reads from them (`penrose_agent::counters::standin::trace_values`). For each
//! trace (one application) and each such counter, this task bins every launch as the agent does
//! (the catalogue's binning) into the histogram of all launches, then draws releases: `hosts`
//! simulated hosts each replay the trace from a random launch (looping, time running on), run
//! the agent's own sampler (`SamplingSchedule`, one launch per block of S) over it, and bin
//! their samples; a release adds the hosts' histograms, as the design server's decrypted sum
//! does. The released histogram is compared with the histogram of all launches: mean, p50 and
//! p90 (each as the histogram states it), and the bins' total variation distance, at a ladder
//! of sample counts per release.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use clap::Parser;
use penrose_agent::counters::standin::trace_values;
use penrose_core::counters::{Binning, Catalogue, Counter};
use penrose_core::histogram::Histogram;
use penrose_core::sampling::{
    DEFAULT_REOFFSET_INTERVAL, DEFAULT_SAMPLE_PERIOD, SamplePeriod, SamplingSchedule,
};
use penrose_traces::{Trace, TraceFolder, job_name};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;

/// The counters whose every value the traces hold (what the stand-in reads from them).
const COUNTERS: [&str; 5] = [
    "kernel_duration",
    "achieved_occupancy",
    "blocks_per_sm",
    "registers_per_thread",
    "shared_memory",
];

/// The relative error the paper's "99.3% within 1%" counts with.
const WITHIN: f64 = 0.01;

/// Arguments.
#[derive(Debug, Parser)]
pub struct Args {
    /// Folder of `.json` / `.json.gz` profiler traces [default: $PENROSE_TRACES, else
    /// ../shared/traces next to the workspace].
    #[arg(long)]
    traces: Option<PathBuf>,
    /// S: one launch in S is sampled (the agent's default).
    #[arg(long, default_value_t = DEFAULT_SAMPLE_PERIOD.get())]
    period: u32,
    /// Hosts whose histograms one release adds (k contributors, one report each).
    #[arg(long, default_value_t = 10)]
    hosts: u32,
    /// Samples per release to measure at (split evenly among the hosts).
    #[arg(long, value_delimiter = ',', default_values_t = [100, 300, 1_000, 3_000, 10_000, 30_000])]
    samples: Vec<u64>,
    /// Releases drawn per (application, counter, sample count).
    #[arg(long, default_value_t = 20)]
    trials: u32,
    /// Traces with fewer launches are left out (a few launches make no application).
    #[arg(long, default_value_t = 1_000)]
    min_launches: usize,
    /// The sampler: the agent's (`countdown`), or each launch independently with probability
    /// 1/S (`independent`), for comparison.
    #[arg(long, value_enum, default_value_t = Sampler::Countdown)]
    sampler: Sampler,
    /// Seed of every random choice.
    #[arg(long, default_value_t = 20_261_204)]
    seed: u64,
    /// Write the Markdown report here as well.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Print the measurements as JSON instead of Markdown.
    #[arg(long)]
    json: bool,
}

/// Which launches a host samples.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum Sampler {
    /// The agent's `SamplingSchedule`: one launch per block of S, at a fresh position.
    Countdown,
    /// Each launch independently with probability 1/S (geometric gaps).
    Independent,
}

/// One application's launches for one counter, in launch order, with the histogram of all.
struct Series {
    app: String,
    counter: &'static Counter,
    /// (launch time, µs from the trace's first launch; value).
    launches: Vec<(f64, f64)>,
    /// The trace's span, µs, and the gap added at each loop.
    span_us: f64,
    all: Histogram,
    exact_mean: f64,
}

/// The errors of one released histogram against the histogram of all launches.
#[derive(Clone, Copy, Debug, Serialize)]
struct Errors {
    mean: f64,
    p50: f64,
    p90: f64,
    tv: f64,
}

/// What one (application, counter, sample count) measured over its trials.
#[derive(Debug, Serialize)]
struct Cell {
    app: String,
    counter: &'static str,
    launches: usize,
    samples: u64,
    trials: u32,
    /// Medians over the trials.
    median: Errors,
    /// Worst over the trials.
    worst: Errors,
    /// Statistics (mean, p50, p90) of the trials within 1%, out of 3 x trials.
    within: u32,
    /// The mean of all launches as binned, against their exact mean (the bins' own error).
    binning_error: f64,
}

/// Runs the task.
pub fn run(args: Args) -> Result<()> {
    ensure!(args.period > 0, "--period must be at least 1");
    ensure!(args.hosts > 0, "--hosts must be at least 1");
    ensure!(args.trials > 0, "--trials must be at least 1");
    let dir = args.traces.clone().unwrap_or_else(TraceFolder::default_dir);
    let folder =
        TraceFolder::open(&dir).with_context(|| format!("reading traces in {}", dir.display()))?;
    let traces = folder.read_all()?;
    ensure!(!traces.is_empty(), "no traces in {}", dir.display());
    let period = SamplePeriod(std::num::NonZeroU32::new(args.period).context("period")?);
    let series: Vec<Series> = traces
        .iter()
        .filter(|t| t.kernels().len() >= args.min_launches)
        .flat_map(series_of)
        .collect();
    ensure!(
        !series.is_empty(),
        "no trace with {} launches or more",
        args.min_launches
    );
    let mut rng = ChaCha8Rng::seed_from_u64(args.seed);
    let mut cells = Vec::new();
    for s in &series {
        for &n in &args.samples {
            cells.push(measure(s, n, period, &args, &mut rng)?);
        }
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&cells)?);
        return Ok(());
    }
    let text = markdown(&args, &dir, &cells);
    if let Some(out) = &args.out {
        std::fs::write(out, &text).with_context(|| format!("writing {}", out.display()))?;
    }
    println!("{text}");
    Ok(())
}

/// The series of one trace: one per counter the trace holds for every launch.
fn series_of(trace: &Trace) -> Vec<Series> {
    let catalogue = Catalogue::current();
    let mut kernels: Vec<_> = trace.kernels().iter().collect();
    kernels.sort_by(|a, b| a.launch_order_ts_us().total_cmp(&b.launch_order_ts_us()));
    let first = kernels.first().map_or(0.0, |k| k.launch_order_ts_us());
    let last = kernels.last().map_or(0.0, |k| k.launch_order_ts_us());
    COUNTERS
        .iter()
        .filter_map(|name| catalogue.counter_by_name(name))
        .filter_map(|counter| {
            let launches: Option<Vec<(f64, f64)>> = kernels
                .iter()
                .map(|k| {
                    let value = trace_values(k, counter.group)
                        .into_iter()
                        .find(|v| v.counter == counter.id)?
                        .value;
                    Some((k.launch_order_ts_us() - first, value))
                })
                .collect();
            let launches = launches?;
            let all = histogram(&counter.binning, launches.iter().map(|l| l.1))?;
            let exact_mean = launches.iter().map(|l| l.1).sum::<f64>() / launches.len() as f64;
            Some(Series {
                app: job_name(trace.path()),
                counter,
                span_us: (last - first) * (1.0 + 1.0 / launches.len() as f64) + 1.0,
                launches,
                all,
                exact_mean,
            })
        })
        .collect()
}

/// The histogram of `values` binned by `binning`; `None` if a value cannot be binned.
fn histogram(binning: &Binning, values: impl Iterator<Item = f64>) -> Option<Histogram> {
    let mut h = Histogram::new();
    for v in values {
        h.record(binning.bin(v).ok()?).ok()?;
    }
    Some(h)
}

/// Draws `args.trials` releases of `samples` samples for one series.
fn measure(
    s: &Series,
    samples: u64,
    period: SamplePeriod,
    args: &Args,
    rng: &mut ChaCha8Rng,
) -> Result<Cell> {
    let mut trials = Vec::new();
    for _ in 0..args.trials {
        let released = release(s, samples, args.hosts, period, args.sampler, rng)?;
        trials.push(errors(&released, s)?);
    }
    let within = trials
        .iter()
        .map(|e| {
            [e.mean, e.p50, e.p90]
                .iter()
                .filter(|x| **x <= WITHIN)
                .count() as u32
        })
        .sum();
    let binned_mean = s.all.mean(&s.counter.binning).context("empty histogram")?;
    Ok(Cell {
        app: s.app.clone(),
        counter: s.counter.name,
        launches: s.launches.len(),
        samples,
        trials: args.trials,
        median: fold(&trials, median),
        worst: fold(&trials, |v| v.iter().copied().fold(0.0, f64::max)),
        within,
        binning_error: relative(binned_mean, s.exact_mean),
    })
}

/// One release: `hosts` hosts, each sampling its share of `samples` with the agent's sampler
/// from a random launch of the looped trace.
fn release(
    s: &Series,
    samples: u64,
    hosts: u32,
    period: SamplePeriod,
    sampler: Sampler,
    rng: &mut ChaCha8Rng,
) -> Result<Histogram> {
    let mut released = Histogram::new();
    let hosts = u64::from(hosts);
    for h in 0..hosts {
        // The first hosts take one more when the count does not divide evenly.
        let share = samples / hosts + u64::from(h < samples % hosts);
        let host = match sampler {
            Sampler::Countdown => sample_host(s, share, period, rng)?,
            Sampler::Independent => sample_independent(s, share, period, rng)?,
        };
        released.merge(&host)?;
    }
    Ok(released)
}

/// One host's histogram of `want` samples with the agent's sampler.
fn sample_host(
    s: &Series,
    want: u64,
    period: SamplePeriod,
    rng: &mut ChaCha8Rng,
) -> Result<Histogram> {
    let mut schedule = SamplingSchedule::new(
        period,
        DEFAULT_REOFFSET_INTERVAL,
        ChaCha8Rng::seed_from_u64(rng.random()),
        Duration::ZERO,
    );
    walk(s, want, rng, |now| {
        // The countdown's launches pass and the next one is sampled, all at `now`.
        let skip = schedule.countdown(now);
        schedule.on_launches(u64::from(skip) + 1, now);
        skip as usize
    })
}

/// One host's histogram of `want` samples, each launch sampled independently with
/// probability 1/S: the gaps are geometric.
fn sample_independent(
    s: &Series,
    want: u64,
    period: SamplePeriod,
    rng: &mut ChaCha8Rng,
) -> Result<Histogram> {
    let p = 1.0 / f64::from(period.get());
    let mut draws = ChaCha8Rng::seed_from_u64(rng.random());
    walk(s, want, rng, |_| {
        let u: f64 = draws.random_range(f64::MIN_POSITIVE..1.0);
        if p >= 1.0 {
            0
        } else {
            (u.ln() / (1.0 - p).ln()).floor() as usize
        }
    })
}

/// Walks the looped trace from a random launch, the clock (from 0 there) running on across
/// loops, and bins `want` samples: `gap` says how many launches pass before the next sampled
/// one, given the time of the launch the walk stands at.
fn walk(
    s: &Series,
    want: u64,
    rng: &mut ChaCha8Rng,
    mut gap: impl FnMut(Duration) -> usize,
) -> Result<Histogram> {
    let n = s.launches.len();
    let mut index = rng.random_range(0..n);
    let start = s.launches[index].0;
    let mut loops = 0usize;
    let mut h = Histogram::new();
    while u64::from(h.samples().0) < want {
        let us = s.launches[index].0 - start + loops as f64 * s.span_us;
        let at = index + gap(Duration::from_secs_f64(us.max(0.0) / 1e6));
        loops += at / n;
        index = at % n;
        h.record(s.counter.binning.bin(s.launches[index].1)?)?;
        loops += (index + 1) / n;
        index = (index + 1) % n;
    }
    Ok(h)
}

/// The errors of `released` against the series' histogram of all launches.
fn errors(released: &Histogram, s: &Series) -> Result<Errors> {
    let b = &s.counter.binning;
    let stat = |h: &Histogram, q: Option<f64>| -> Result<f64> {
        match q {
            None => h.mean(b),
            Some(q) => h.quantile(b, q),
        }
        .context("empty histogram")
    };
    let rel = |q| -> Result<f64> { Ok(relative(stat(released, q)?, stat(&s.all, q)?)) };
    Ok(Errors {
        mean: rel(None)?,
        p50: rel(Some(0.5))?,
        p90: rel(Some(0.9))?,
        tv: total_variation(released, &s.all),
    })
}

/// |a - b| / |b| (0 when both are 0).
fn relative(a: f64, b: f64) -> f64 {
    if b == 0.0 {
        if a == 0.0 { 0.0 } else { f64::INFINITY }
    } else {
        (a - b).abs() / b.abs()
    }
}

/// Half the L1 distance between the two histograms' bin shares.
fn total_variation(a: &Histogram, b: &Histogram) -> f64 {
    let (na, nb) = (f64::from(a.samples().0), f64::from(b.samples().0));
    if na == 0.0 || nb == 0.0 {
        return 1.0;
    }
    let l1: f64 = a
        .bins()
        .iter()
        .zip(b.bins())
        .map(|(x, y)| (f64::from(*x) / na - f64::from(*y) / nb).abs())
        .sum();
    l1 / 2.0
}

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// Applies `f` to each field's values over the trials.
fn fold(trials: &[Errors], f: impl Fn(&[f64]) -> f64) -> Errors {
    let field = |g: fn(&Errors) -> f64| f(&trials.iter().map(g).collect::<Vec<_>>());
    Errors {
        mean: field(|e| e.mean),
        p50: field(|e| e.p50),
        p90: field(|e| e.p90),
        tv: field(|e| e.tv),
    }
}

/// The summary per sample count, then every cell.
fn markdown(args: &Args, dir: &std::path::Path, cells: &[Cell]) -> String {
    let mut out = format!(
        "`cargo xtask eval-exactness --period {} --hosts {} --trials {} --sampler {:?} --seed {}` \
         on {} ({} application/counter series): each release adds {} hosts' histograms, each \
         host sampling 1 in {} launches of its looped trace from a random launch; errors \
         against the histogram of every launch, binned alike.\n\n",
        args.period,
        args.hosts,
        args.trials,
        args.sampler,
        args.seed,
        dir.file_name().and_then(|n| n.to_str()).unwrap_or("traces"),
        cells.len() / args.samples.len().max(1),
        args.hosts,
        args.period,
    );
    out.push_str(&summary(args, cells));
    out.push_str("\n| application | counter | launches | samples | mean err (median / worst) | p50 err | p90 err | TV (median / worst) | within 1% | bins' own mean error |\n|---|---|---|---|---|---|---|---|---|---|\n");
    for c in cells {
        out.push_str(&format!(
            "| {} | {} | {} | {} | {:.2}% / {:.2}% | {:.2}% / {:.2}% | {:.2}% / {:.2}% | {:.3} / {:.3} | {} of {} | {:.2}% |\n",
            c.app,
            c.counter,
            c.launches,
            c.samples,
            100.0 * c.median.mean,
            100.0 * c.worst.mean,
            100.0 * c.median.p50,
            100.0 * c.worst.p50,
            100.0 * c.median.p90,
            100.0 * c.worst.p90,
            c.median.tv,
            c.worst.tv,
            c.within,
            3 * c.trials,
            100.0 * c.binning_error,
        ));
    }
    out
}

/// Per sample count: the share of (series, trial, statistic) within 1%, and the median TV.
fn summary(args: &Args, cells: &[Cell]) -> String {
    let mut out = String::from(
        "| samples per release | statistics within 1% | mean within 1% | median TV | worst TV |\n|---|---|---|---|---|\n",
    );
    for &n in &args.samples {
        let at: Vec<&Cell> = cells.iter().filter(|c| c.samples == n).collect();
        let within: u32 = at.iter().map(|c| c.within).sum();
        let total: u32 = at.iter().map(|c| 3 * c.trials).sum();
        let tvs: Vec<f64> = at.iter().map(|c| c.median.tv).collect();
        let worst = at.iter().map(|c| c.worst.tv).fold(0.0, f64::max);
        let means = at.iter().filter(|c| c.median.mean <= WITHIN).count();
        out.push_str(&format!(
            "| {n} | {:.1}% ({within} of {total}) | {means} of {} series (median) | {:.3} | {:.3} |\n",
            100.0 * f64::from(within) / f64::from(total.max(1)),
            at.len(),
            median(&tvs),
            worst,
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn total_variation_is_zero_for_equal_shares_and_one_for_disjoint() {
        let b = Binning::Linear {
            min: 0.0,
            max: 128.0,
        };
        let a = histogram(&b, [1.0, 2.0].into_iter()).unwrap();
        let same = histogram(&b, [1.0, 1.0, 2.0, 2.0].into_iter()).unwrap();
        let other = histogram(&b, [50.0].into_iter()).unwrap();
        assert_eq!(total_variation(&a, &same), 0.0);
        assert_eq!(total_variation(&a, &other), 1.0);
        assert!(relative(1.005, 1.0) <= WITHIN);
        assert!(relative(1.02, 1.0) > WITHIN);
    }
}
