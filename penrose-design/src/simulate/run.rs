//! Running a scenario: every GPU through [`super::gpu::run`] on a few threads, tallied per
//! (application, counter group), then the coverage times.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;

use super::fleet::{Apps, Mix};
use super::gpu::{self, Gpu, GpuSetup, Sink};
use super::params::{Checked, HOUR, Params, Rule, Scenario};
use super::steer::Counts;

/// GPUs a worker takes at a time.
const CHUNK: u64 = 1024;

/// SplitMix64's finaliser: spreads related seeds over unrelated streams.
fn mix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn seed_of(parts: &[u64]) -> u64 {
    parts.iter().fold(0, |acc, &p| mix64(acc ^ mix64(p)))
}

/// One scenario's fleet, ready to run GPU by GPU.
pub struct Fleet<'a> {
    checked: &'a Checked,
    scenario: Scenario,
    /// The applications: popularity and capture profiles.
    pub apps: Apps,
}

impl<'a> Fleet<'a> {
    /// Draws the scenario's applications.
    pub fn new(checked: &'a Checked, scenario: Scenario) -> Self {
        let p = &checked.params;
        let mix_tag = match scenario.mix {
            Mix::Uniform => 1,
            Mix::SmallKernel => 2,
            Mix::LargeKernel => 3,
        };
        let seed = seed_of(&[p.seed, 1, u64::from(scenario.apps), mix_tag]);
        let apps = Apps::draw(scenario.apps, p.zipf, scenario.mix, &scenario.capture, seed);
        Self {
            checked,
            scenario,
            apps,
        }
    }

    /// GPU `index`'s draws, or `None` when it is idle; and its random stream, as the run
    /// continues it.
    pub fn setup(&self, index: u64) -> (Option<GpuSetup>, ChaCha8Rng) {
        let p = &self.checked.params;
        let seed = seed_of(&[p.seed, 2, u64::from(self.scenario.apps), index]);
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let busy = rng.random::<f64>() < p.load;
        let app = self.apps.popularity.pick(rng.random());
        let cycle = self.apps.profiles[app as usize].cycle_seconds;
        let first_window = rng.random::<f64>() * cycle;
        let rotation = p.group_seconds * f64::from(p.groups);
        let group_phase = rng.random::<f64>() * rotation;
        let sampler_seed = rng.random();
        let setup = GpuSetup {
            app,
            first_window,
            group_phase,
            sampler_seed,
        };
        (busy.then_some(setup), rng)
    }

    /// Runs GPU `index` into `sink`, unsteered, in one stretch.
    pub fn run_gpu(&self, index: u64, sink: &mut impl Sink) {
        let (setup, rng) = self.setup(index);
        if let Some(setup) = setup {
            sink.gpu(index);
            let profile = &self.apps.profiles[setup.app as usize];
            gpu::run(
                &self.checked.agent,
                &setup,
                profile,
                self.checked.horizon,
                rng,
                sink,
            );
        }
    }

    /// Runs every GPU together, a step (`--steer-step-seconds`) at a time, on as many threads
    /// as `sinks` holds (one sink per thread, returned). After each step the reports that
    /// reached the aggregation server by its end are counted per (application, group, epoch);
    /// an ack that arrives during the next step carries the hint from those counts. So a hint
    /// is at most about one step (plus a window cycle, until the agent's next window) old. The
    /// result does not depend on the number of threads: within a step the GPUs do not interact.
    pub fn run_steered<S: Sink + Send>(
        &self,
        sinks: Vec<S>,
        progress: &(dyn Fn(u64) + Sync),
    ) -> Vec<S> {
        let checked = self.checked;
        let horizon = checked.horizon;
        let mut server = self.server_counts();
        let mut gpus = self.busy_gpus();
        let mut logged: Vec<Logged<S>> = sinks
            .into_iter()
            .map(|inner| Logged {
                inner,
                log: Vec::new(),
            })
            .collect();
        let per = gpus.len().div_ceil(logged.len().max(1)).max(1);
        let step = checked.params.steer_step_seconds;
        let steps = (horizon / step).ceil().max(1.0) as u64;
        // Reports sealed but not yet at the server: (index into the counts, arrival).
        let mut pending: Vec<(usize, f64)> = Vec::new();
        let mut done = 0;
        for i in 0..steps {
            let end = ((i + 1) as f64 * step).min(horizon);
            advance_step(&mut gpus, &mut logged, per, end, &server);
            deliver(&mut server, &mut pending, &mut logged, end);
            let target = checked.params.gpus * (i + 1) / steps;
            progress(target - done);
            done = target;
        }
        for (chunk, sink) in gpus.chunks_mut(per).zip(logged.iter_mut()) {
            for (index, gpu) in chunk {
                sink.gpu(*index);
                gpu.finish(sink);
            }
        }
        logged.into_iter().map(|l| l.inner).collect()
    }

    /// The aggregation server's counts for a steered run: none yet, each epoch needing the
    /// reports its days ask for.
    fn server_counts(&self) -> Counts {
        let checked = self.checked;
        let need = (0..checked.epochs)
            .map(|e| checked.reports_needed(checked.epoch_days(e)))
            .collect();
        Counts::new(
            self.scenario.apps,
            checked.params.groups,
            checked.epoch,
            need,
        )
    }

    /// Every GPU that is not idle, with its index, ready to advance.
    fn busy_gpus(&self) -> Vec<(u64, Gpu<'_>)> {
        let checked = self.checked;
        (0..checked.params.gpus)
            .filter_map(|index| {
                let (setup, rng) = self.setup(index);
                let setup = setup?;
                let profile = &self.apps.profiles[setup.app as usize];
                Some((
                    index,
                    Gpu::new(&checked.agent, &setup, profile, checked.horizon, rng),
                ))
            })
            .collect()
    }
}

/// Advances every GPU to `end`, `per` GPUs to a sink, each sink's on its own thread (the
/// first on this one), against the server's counts as they stood at the step's start.
fn advance_step<S: Sink + Send>(
    gpus: &mut [(u64, Gpu<'_>)],
    logged: &mut [Logged<S>],
    per: usize,
    end: f64,
    server: &Counts,
) {
    std::thread::scope(|s| {
        let mut work = gpus.chunks_mut(per).zip(logged.iter_mut());
        let first = work.next();
        let handles: Vec<_> = work
            .map(|(chunk, sink)| s.spawn(move || advance_all(chunk, sink, end, server)))
            .collect();
        if let Some((chunk, sink)) = first {
            advance_all(chunk, sink, end, server);
        }
        for h in handles {
            h.join().unwrap_or_else(|e| std::panic::resume_unwind(e));
        }
    });
}

/// Moves the step's logged reports to `pending`, then counts at the server those that arrived
/// by `end`, keeping the rest pending.
fn deliver<S>(
    server: &mut Counts,
    pending: &mut Vec<(usize, f64)>,
    logged: &mut [Logged<S>],
    end: f64,
) {
    for sink in logged {
        for (app, group, sealed, arrives) in sink.log.drain(..) {
            pending.push((server.index(app, group, server.epoch_of(sealed)), arrives));
        }
    }
    pending.retain(|&(index, arrives)| {
        let arrived = arrives <= end;
        if arrived {
            server.count(index);
        }
        !arrived
    });
}

/// Advances a worker's GPUs to `end`.
fn advance_all<S: Sink>(
    gpus: &mut [(u64, Gpu<'_>)],
    sink: &mut Logged<S>,
    end: f64,
    server: &Counts,
) {
    for (index, gpu) in gpus {
        sink.gpu(*index);
        gpu.advance(end, server, sink);
    }
}

/// A worker's sink that also logs the reports of the current step for the server's counts.
struct Logged<S> {
    inner: S,
    /// (application, group, sealed, arrives).
    log: Vec<(u32, u8, f64, f64)>,
}

impl<S: Sink> Sink for Logged<S> {
    fn window(&mut self, app: u32, group: u8, at: f64, launches: u64, sampled: u64) {
        self.inner.window(app, group, at, launches, sampled);
    }

    fn report(&mut self, app: u32, group: u8, sealed: f64, arrives: f64) {
        self.log.push((app, group, sealed, arrives));
        self.inner.report(app, group, sealed, arrives);
    }

    fn gpu(&mut self, index: u64) {
        self.inner.gpu(index);
    }
}

/// The days epoch `e` spans when epochs last `epoch` seconds each.
fn days_of_epoch(epoch: f64, e: usize) -> u32 {
    let start = e as f64 * epoch;
    let end = start + epoch;
    ((end / gpu::DAY).ceil() - (start / gpu::DAY).floor()).max(1.0) as u32
}

/// What the GPUs of one scenario did, per (application, group) and in all.
#[derive(Clone, Debug)]
pub struct Tally {
    groups: usize,
    epochs: usize,
    bins: usize,
    epoch: f64,
    resolution: f64,
    horizon: f64,
    /// GPUs per application.
    pub gpus: Vec<u64>,
    /// Windows opened, all GPUs.
    pub windows: u64,
    /// Launches probed, all GPUs.
    pub launches: u64,
    /// Sampled launches per (application, group): index `app * groups + group`.
    pub samples: Vec<u64>,
    /// Reports sealed before the horizon per (application, group).
    pub reports: Vec<u64>,
    /// First sampled launch per (application, group), seconds (infinite: none).
    pub first_sample: Vec<f64>,
    /// First report at the aggregation server per (application, group), seconds.
    pub first_report: Vec<f64>,
    /// Reports arrived per (application, group, epoch, time bin within the epoch).
    arrivals: Vec<u32>,
}

impl Tally {
    fn new(checked: &Checked, apps: u32) -> Self {
        let groups = usize::from(checked.params.groups);
        let cells = apps as usize * groups;
        Self {
            groups,
            epochs: checked.epochs,
            bins: checked.bins,
            epoch: checked.epoch,
            resolution: checked.params.resolution_seconds,
            horizon: checked.horizon,
            gpus: vec![0; apps as usize],
            windows: 0,
            launches: 0,
            samples: vec![0; cells],
            reports: vec![0; cells],
            first_sample: vec![f64::INFINITY; cells],
            first_report: vec![f64::INFINITY; cells],
            arrivals: vec![0; cells * checked.epochs * checked.bins],
        }
    }

    fn merge(&mut self, other: &Tally) {
        let add = |a: &mut [u64], b: &[u64]| a.iter_mut().zip(b).for_each(|(x, y)| *x += y);
        let min = |a: &mut [f64], b: &[f64]| a.iter_mut().zip(b).for_each(|(x, y)| *x = x.min(*y));
        add(&mut self.gpus, &other.gpus);
        add(&mut self.samples, &other.samples);
        add(&mut self.reports, &other.reports);
        min(&mut self.first_sample, &other.first_sample);
        min(&mut self.first_report, &other.first_report);
        self.arrivals
            .iter_mut()
            .zip(&other.arrivals)
            .for_each(|(x, y)| *x += y);
        self.windows += other.windows;
        self.launches += other.launches;
    }

    fn cell(&self, app: u32, group: u8) -> usize {
        app as usize * self.groups + usize::from(group)
    }

    /// When (application, group)'s reports of one epoch first reach `need(days)` reports,
    /// seconds (infinite: never within the run).
    fn release_time(&self, cell: usize, need: impl Fn(u32) -> u64) -> f64 {
        let mut best = f64::INFINITY;
        for e in 0..self.epochs {
            let start = e as f64 * self.epoch;
            let need = need(days_of_epoch(self.epoch, e));
            let base = (cell * self.epochs + e) * self.bins;
            let mut total = 0u64;
            for (b, &n) in self.arrivals[base..base + self.bins].iter().enumerate() {
                total += u64::from(n);
                if total >= need {
                    let at = (start + (b + 1) as f64 * self.resolution).min(self.horizon);
                    best = best.min(at);
                    break;
                }
            }
        }
        best
    }

    /// When (application, group)'s first sum is released under the hourly rule (epochs are
    /// hours, a report's epoch its token's hour): the first arrival after which the bound
    /// reaches `k`; seconds (infinite: never within the run).
    fn release_time_hourly(&self, cell: usize, q: u64, k: u64) -> f64 {
        self.hourly_sums(cell, q, k)
            .iter()
            .filter_map(|a| a.released)
            .fold(f64::INFINITY, f64::min)
    }

    /// (application, group)'s reports under the hourly rule, in arrival order, each with the
    /// release of the sum it fell in: a sum takes every report that arrives until its bound,
    /// the larger of `max_h ceil(r_h / q)` and `ceil(r / (q x H))` over the H hours its
    /// reports span, reaches `k`; it is released then and the next sum begins.
    fn hourly_sums(&self, cell: usize, q: u64, k: u64) -> Vec<Arrival> {
        let mut arrivals: Vec<(f64, usize, u64)> = Vec::new();
        for hour in 0..self.epochs {
            let base = (cell * self.epochs + hour) * self.bins;
            let start = hour as f64 * self.epoch;
            for (b, &n) in self.arrivals[base..base + self.bins].iter().enumerate() {
                if n > 0 {
                    let at = start + (b + 1) as f64 * self.resolution;
                    arrivals.push((at.min(self.horizon), hour, u64::from(n)));
                }
            }
        }
        arrivals.sort_by(|a, b| a.0.total_cmp(&b.0));
        let mut out: Vec<Arrival> = Vec::with_capacity(arrivals.len());
        let mut bound = HourlyBound::new(self.epochs, q);
        let mut open_from = 0;
        for (at, hour, n) in arrivals {
            out.push(Arrival {
                at,
                reports: n,
                released: None,
            });
            if bound.add(hour, n) >= k {
                out[open_from..]
                    .iter_mut()
                    .for_each(|a| a.released = Some(at));
                open_from = out.len();
                bound = HourlyBound::new(self.epochs, q);
            }
        }
        out
    }
}

/// Reports of one (application, group) that arrived together, and when their sum was
/// released (`None`: not within the run).
#[derive(Clone, Copy, Debug)]
struct Arrival {
    at: f64,
    reports: u64,
    released: Option<f64>,
}

/// The hourly rule's contributor bound of one running sum, as reports arrive.
struct HourlyBound {
    q: u64,
    per_hour: Vec<u64>,
    busiest: u64,
    total: u64,
    first: usize,
    last: usize,
}

impl HourlyBound {
    fn new(hours: usize, q: u64) -> Self {
        Self {
            q: q.max(1),
            per_hour: vec![0; hours],
            busiest: 0,
            total: 0,
            first: usize::MAX,
            last: 0,
        }
    }

    /// Adds `n` reports of `hour`; the bound afterwards.
    fn add(&mut self, hour: usize, n: u64) -> u64 {
        self.per_hour[hour] += n;
        self.busiest = self.busiest.max(self.per_hour[hour]);
        self.total += n;
        self.first = self.first.min(hour);
        self.last = self.last.max(hour);
        let span = (self.last - self.first + 1) as u64;
        self.busiest
            .div_ceil(self.q)
            .max(self.total.div_ceil(self.q * span))
    }
}

impl Sink for Tally {
    fn window(&mut self, app: u32, group: u8, at: f64, launches: u64, sampled: u64) {
        self.windows += 1;
        self.launches += launches;
        if sampled > 0 {
            let c = self.cell(app, group);
            self.samples[c] += sampled;
            self.first_sample[c] = self.first_sample[c].min(at);
        }
    }

    fn report(&mut self, app: u32, group: u8, sealed: f64, arrives: f64) {
        let c = self.cell(app, group);
        self.reports[c] += 1;
        if arrives >= self.horizon {
            return;
        }
        self.first_report[c] = self.first_report[c].min(arrives);
        let e = ((sealed / self.epoch).floor() as usize).min(self.epochs - 1);
        let offset = arrives - e as f64 * self.epoch;
        let b = ((offset / self.resolution).floor() as usize).min(self.bins - 1);
        self.arrivals[(c * self.epochs + e) * self.bins + b] += 1;
    }
}

/// Applications on at least this many GPUs are the ones issue 25's latency target speaks of.
pub const LATENCY_GPUS: u64 = 30;

/// From a report's arrival to the release of its sum, under the hourly rule, for the
/// applications on at least [`LATENCY_GPUS`] GPUs (times rounded to the run's resolution).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Latency {
    /// Applications on at least [`LATENCY_GPUS`] GPUs.
    pub apps: u32,
    /// Their reports that arrived within the run.
    pub reports: u64,
    /// The share of those released within the run.
    pub released_share: f64,
    /// The median over those applications of each one's median wait, hours.
    pub median: Option<f64>,
    /// The largest of those medians, hours.
    pub worst: Option<f64>,
}

/// The `share` quantile of `(value, weight)` pairs (sorted here); `None` when they weigh
/// nothing.
fn weighted_quantile(values: &mut [(f64, u64)], share: f64) -> Option<f64> {
    values.sort_by(|a, b| a.0.total_cmp(&b.0));
    let total: u64 = values.iter().map(|v| v.1).sum();
    let rank = ((share * total as f64).ceil() as u64).max(1);
    let mut seen = 0;
    values.iter().find_map(|&(value, weight)| {
        seen += weight;
        (seen >= rank).then_some(value)
    })
}

/// Hours until a share of applications is covered; `None`: not within the run.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Quantiles {
    /// 97.5% of the applications.
    pub p97_5: Option<f64>,
    /// All of them.
    pub p100: Option<f64>,
}

/// One scenario's outcome.
#[derive(Clone, Debug, Serialize)]
pub struct ScenarioResult {
    /// A.
    pub apps: u32,
    /// The mix.
    pub mix: Mix,
    /// The budget, percent.
    pub budget_percent: f64,
    /// GPUs busy with an application.
    pub gpus_busy: u64,
    /// Applications that some busy GPU runs: the ones coverage is counted over.
    pub apps_present: u32,
    /// Applications on 1 to k - 1 GPUs: never released however long the run.
    pub apps_under_k_gpus: u32,
    /// Mean sampled launches per busy GPU and hour.
    pub samples_per_gpu_hour: f64,
    /// Mean reports per busy GPU and hour (all groups).
    pub reports_per_gpu_hour: f64,
    /// Launches probed per busy GPU and hour, mean.
    pub probed_per_gpu_hour: f64,
    /// Released (k contributors in one epoch, every group).
    pub released: Quantiles,
    /// Released, among the applications on at least k GPUs (the others never can be).
    pub released_on_k_gpus: Quantiles,
    /// Arrival to release under the hourly rule (`None` under the daily one, where a sum is
    /// decryptable only after its epoch closes).
    pub latency: Option<Latency>,
    /// At least one report of every group at the aggregation server.
    pub reported: Quantiles,
    /// At least one sampled launch of every group in the fleet.
    pub sampled: Quantiles,
    /// (hour, share of applications released) at regular steps, for plots.
    pub curve: Vec<(f64, f64)>,
    /// Wall-clock seconds this scenario took.
    pub seconds: f64,
}

/// The applications' coverage times (hours, infinite: never) under the three definitions.
#[derive(Clone, Debug)]
pub struct AppTimes {
    /// Released.
    pub released: Vec<f64>,
    /// Reported.
    pub reported: Vec<f64>,
    /// Sampled.
    pub sampled: Vec<f64>,
}

/// Points of the coverage curve.
const CURVE_POINTS: usize = 240;

/// Hours until 97.5% and 100% of the applications `present` are covered.
fn quantiles(times: &[f64], present: &[bool]) -> Quantiles {
    let mut sorted: Vec<f64> = times
        .iter()
        .zip(present)
        .filter_map(|(&t, &p)| p.then_some(t))
        .collect();
    sorted.sort_by(f64::total_cmp);
    let at = |q: f64| {
        let rank = ((q * sorted.len() as f64).ceil() as usize).max(1);
        sorted.get(rank - 1).copied().filter(|t| t.is_finite())
    };
    Quantiles {
        p97_5: at(0.975),
        p100: at(1.0),
    }
}

impl Checked {
    /// The contributors' rule of `penrose_core::release` for T = `reports_per_day`: the fewest
    /// reports of one epoch spanning `days` days whose bound `ceil(r / (T x days))` reaches k.
    pub fn reports_needed(&self, days: u32) -> u64 {
        let per_owner = u64::from(self.params.reports_per_day) * u64::from(days.max(1));
        (self.params.threshold - 1) * per_owner + 1
    }

    /// Arrival-to-release times of the reports of applications on at least [`LATENCY_GPUS`]
    /// GPUs, under the hourly rule: each application's median over its reports, and those
    /// medians' median and largest.
    fn latency(&self, tally: &Tally) -> Latency {
        let q = u64::from(self.params.reports_per_hour);
        let mut medians: Vec<f64> = Vec::new();
        let (mut reports, mut released) = (0, 0);
        for (app, _) in tally
            .gpus
            .iter()
            .enumerate()
            .filter(|(_, n)| **n >= LATENCY_GPUS)
        {
            let mut waits: Vec<(f64, u64)> = Vec::new();
            for cell in app * tally.groups..(app + 1) * tally.groups {
                for a in tally.hourly_sums(cell, q, self.params.threshold) {
                    reports += a.reports;
                    if let Some(at) = a.released {
                        released += a.reports;
                        waits.push(((at - a.at) / HOUR, a.reports));
                    }
                }
            }
            medians.extend(weighted_quantile(&mut waits, 0.5));
        }
        let mut weighted: Vec<(f64, u64)> = medians.iter().map(|&m| (m, 1)).collect();
        Latency {
            apps: medians.len() as u32,
            reports,
            released_share: released as f64 / reports.max(1) as f64,
            median: weighted_quantile(&mut weighted, 0.5),
            worst: medians.iter().copied().reduce(f64::max),
        }
    }

    /// Coverage times per application from a scenario's tally.
    pub fn app_times(&self, tally: &Tally) -> AppTimes {
        let apps = tally.gpus.len();
        let groups = tally.groups;
        let worst = |f: &dyn Fn(usize) -> f64| -> Vec<f64> {
            (0..apps)
                .map(|a| (0..groups).map(|g| f(a * groups + g)).fold(0.0, f64::max) / HOUR)
                .collect()
        };
        let released = |c: usize| match self.params.rule {
            Rule::Daily => tally.release_time(c, |days| self.reports_needed(days)),
            Rule::Hourly => tally.release_time_hourly(
                c,
                u64::from(self.params.reports_per_hour),
                self.params.threshold,
            ),
        };
        AppTimes {
            released: worst(&released),
            reported: worst(&|c| tally.first_report[c]),
            sampled: worst(&|c| tally.first_sample[c]),
        }
    }

    /// Runs one scenario on `threads` threads; `progress` is told how many GPUs were done.
    pub fn run_scenario(
        &self,
        scenario: Scenario,
        threads: usize,
        progress: &(dyn Fn(u64) + Sync),
    ) -> (ScenarioResult, Tally) {
        let started = Instant::now();
        let fleet = Fleet::new(self, scenario);
        let mut tallies = if self.agent.steering.is_on() {
            let sinks = (0..threads.max(1))
                .map(|_| Tally::new(self, scenario.apps))
                .collect();
            fleet.run_steered(sinks, progress)
        } else {
            self.run_independent(&fleet, threads, progress)
        };
        let mut tally = tallies.swap_remove(0);
        for other in &tallies {
            tally.merge(other);
        }
        // The applications each GPU runs, counted apart from the workers (idle GPUs too).
        for index in 0..self.params.gpus {
            if let (Some(setup), _) = fleet.setup(index) {
                tally.gpus[setup.app as usize] += 1;
            }
        }
        let result = self.summarise(&scenario, &tally, started.elapsed().as_secs_f64());
        (result, tally)
    }

    /// Runs each GPU alone from start to end (no steering), the GPUs shared out in chunks
    /// among `threads` workers; one tally per worker.
    fn run_independent(
        &self,
        fleet: &Fleet<'_>,
        threads: usize,
        progress: &(dyn Fn(u64) + Sync),
    ) -> Vec<Tally> {
        let scenario = fleet.scenario;
        let next = AtomicU64::new(0);
        let gpus = self.params.gpus;
        let work = || {
            let mut tally = Tally::new(self, scenario.apps);
            loop {
                let from = next.fetch_add(CHUNK, Ordering::Relaxed);
                if from >= gpus {
                    return tally;
                }
                let to = (from + CHUNK).min(gpus);
                for index in from..to {
                    fleet.run_gpu(index, &mut tally);
                }
                progress(to - from);
            }
        };
        std::thread::scope(|s| {
            let handles: Vec<_> = (1..threads.max(1)).map(|_| s.spawn(work)).collect();
            let mut all = vec![work()];
            // A worker that panicked takes the run down with it rather than leave a hole.
            all.extend(
                handles
                    .into_iter()
                    .map(|h| h.join().unwrap_or_else(|e| std::panic::resume_unwind(e))),
            );
            all
        })
    }

    /// The days epoch `e` spans (a report of it counts as 1 / (T x days) of a contributor).
    pub fn epoch_days(&self, e: usize) -> u32 {
        days_of_epoch(self.epoch, e)
    }

    fn summarise(&self, scenario: &Scenario, tally: &Tally, seconds: f64) -> ScenarioResult {
        let times = self.app_times(tally);
        let busy: u64 = tally.gpus.iter().sum();
        let gpu_hours = (busy as f64 * self.horizon / HOUR).max(f64::MIN_POSITIVE);
        let k = self.params.threshold;
        let present: Vec<bool> = tally.gpus.iter().map(|&n| n > 0).collect();
        let on_k_gpus: Vec<bool> = tally.gpus.iter().map(|&n| n >= k).collect();
        let apps_present = present.iter().filter(|&&p| p).count();
        let curve = (0..=CURVE_POINTS)
            .map(|i| {
                let hour = self.horizon / HOUR * i as f64 / CURVE_POINTS as f64;
                let covered = times.released.iter().filter(|&&t| t <= hour).count();
                (hour, covered as f64 / apps_present.max(1) as f64)
            })
            .collect();
        ScenarioResult {
            apps: scenario.apps,
            mix: scenario.mix,
            budget_percent: scenario.budget_percent,
            gpus_busy: busy,
            apps_present: apps_present as u32,
            apps_under_k_gpus: tally.gpus.iter().filter(|&&n| n > 0 && n < k).count() as u32,
            samples_per_gpu_hour: tally.samples.iter().sum::<u64>() as f64 / gpu_hours,
            reports_per_gpu_hour: tally.reports.iter().sum::<u64>() as f64 / gpu_hours,
            probed_per_gpu_hour: tally.launches as f64 / gpu_hours,
            released: quantiles(&times.released, &present),
            released_on_k_gpus: quantiles(&times.released, &on_k_gpus),
            latency: (self.params.rule == Rule::Hourly).then(|| self.latency(tally)),
            reported: quantiles(&times.reported, &present),
            sampled: quantiles(&times.sampled, &present),
            curve,
            seconds,
        }
    }

    /// Runs every scenario in order.
    pub fn run(&self, threads: usize, progress: &(dyn Fn(u64) + Sync)) -> Simulation {
        let started = Instant::now();
        let scenarios = self
            .scenarios
            .iter()
            .map(|&s| self.run_scenario(s, threads, progress).0)
            .collect();
        Simulation {
            params: self.params.clone(),
            threads,
            scenarios,
            seconds: started.elapsed().as_secs_f64(),
        }
    }
}

/// A whole run: its parameters and each scenario's outcome.
#[derive(Clone, Debug, Serialize)]
pub struct Simulation {
    /// The parameters.
    pub params: Params,
    /// Worker threads used.
    pub threads: usize,
    /// Per (A, mix, budget).
    pub scenarios: Vec<ScenarioResult>,
    /// Wall-clock seconds of the whole run.
    pub seconds: f64,
}
