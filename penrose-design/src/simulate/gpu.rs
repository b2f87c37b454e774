//! One GPU's agent over the simulated time, window by window: the sampler decides how many of
//! the window's launches are sampled, the samples go into the histogram of the counter group
//! active then, and histograms are sealed (size or age, within the daily cap) into reports.

use std::time::Duration;

use penrose_core::sampling::{SamplePeriod, SamplingSchedule};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::fleet::AppProfile;
use super::steer::{Hint, Server, Steering};

/// Seconds in a day: reports are stamped with their day and capped per (counter, day).
pub const DAY: f64 = 86_400.0;

/// The agent's cap: at most `reports` per (counter, period).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Cap {
    /// Reports per (counter, period): T a day, or q an hour.
    pub reports: u32,
    /// The period, seconds.
    pub period: f64,
}

/// How the sampler picks launches.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum SamplerModel {
    /// The agent's sampler, `penrose_core::sampling::SamplingSchedule`: one launch in each block
    /// of S, at a position drawn afresh per block, a block started at every window. Its hit
    /// probability for a window of u launches is min(1, u / S).
    Countdown,
    /// Each launch independently with probability 1/S, the model behind
    /// P_hit = 1 - (1 - 1/S)^u (`penrose_core::sampling::hit_probability`).
    Bernoulli,
}

impl SamplerModel {
    /// The name used on the command line and in tables.
    pub fn name(self) -> &'static str {
        match self {
            SamplerModel::Countdown => "countdown",
            SamplerModel::Bernoulli => "bernoulli",
        }
    }
}

/// The agent settings one GPU runs with.
#[derive(Clone, Copy, Debug)]
pub struct AgentModel {
    /// The sampler.
    pub sampler: SamplerModel,
    /// S.
    pub period: SamplePeriod,
    /// O: a schedule running across windows is re-seeded this often (each window starts a
    /// block anyway).
    pub reoffset: Duration,
    /// Counter groups, rotated.
    pub groups: u8,
    /// How long each group stays active, seconds.
    pub group_seconds: f64,
    /// A histogram is sealed at this many samples ...
    pub seal_samples: u64,
    /// ... or this old (seconds), whichever comes first.
    pub seal_age: f64,
    /// Reports sealed per (counter, period) at most.
    pub cap: Cap,
    /// The uploader's longest random delay, seconds.
    pub upload_delay: f64,
    /// What the agent does with the hints in the aggregation server's acks.
    pub steering: Steering,
}

/// One GPU's draws: what it runs and when its cycles fall.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GpuSetup {
    /// The application (0-based popularity rank).
    pub app: u32,
    /// When its first window opens, seconds (uniform over its first cycle).
    pub first_window: f64,
    /// Where its group rotation stands at time 0, seconds into a full rotation.
    pub group_phase: f64,
    /// Seeds the sampler's offsets.
    pub sampler_seed: u64,
}

impl GpuSetup {
    /// The counter group active at `t` seconds.
    pub fn group_at(&self, agent: &AgentModel, t: f64) -> u8 {
        let period = (t + self.group_phase) / agent.group_seconds;
        (period.floor() as u64 % u64::from(agent.groups.max(1))) as u8
    }
}

/// Where the GPU's events go.
pub trait Sink {
    /// A window opened at `at` probed `launches` launches, `sampled` of them sampled for
    /// counter group `group`.
    fn window(&mut self, app: u32, group: u8, at: f64, launches: u64, sampled: u64);
    /// A report of (`app`, `group`) was sealed at `sealed` and reaches the aggregation server
    /// at `arrives`.
    fn report(&mut self, app: u32, group: u8, sealed: f64, arrives: f64);
    /// The events that follow, until the next call, are GPU `index`'s (a steered run advances
    /// the GPUs a step at a time, so one sink sees several GPUs' events interleaved).
    fn gpu(&mut self, _index: u64) {}
}

/// An open histogram of one counter group (its counters are sealed together).
#[derive(Clone, Copy, Debug)]
struct Open {
    /// When it opened; a steering hint that shortens the seal age moves it forward so that an
    /// open histogram already older than the new age seals when the hint arrives, not before.
    opened: f64,
    samples: u64,
    /// The cap period it was held back in: it seals at the next period's first tick.
    held_on: Option<u64>,
}

/// The state of one GPU's agent.
struct Agent<'a> {
    model: &'a AgentModel,
    app: u32,
    open: Vec<Option<Open>>,
    /// Per group: the cap period of its last seal and how many it sealed in it (a group's
    /// seals come in time order; two groups' need not).
    sealed: Vec<(u64, u32)>,
    /// Per group: the seal age in force (the model's, unless a hint changed it).
    seal_age: Vec<f64>,
    /// Arrival times of sealed reports whose acks (and hints) the agent has not acted on yet;
    /// kept only when steering is on.
    acks: Vec<f64>,
}

impl Agent<'_> {
    fn period_of(&self, t: f64) -> u64 {
        (t / self.model.cap.period).floor() as u64
    }

    /// Seals group `g`'s histogram at `t` unless the period's cap is reached (then it is
    /// held).
    fn try_seal(&mut self, g: usize, t: f64, rng: &mut ChaCha8Rng, sink: &mut impl Sink) -> bool {
        let period = self.period_of(t);
        let sealed = &mut self.sealed[g];
        if sealed.0 != period {
            *sealed = (period, 0);
        }
        if sealed.1 >= self.model.cap.reports {
            if let Some(open) = self.open[g].as_mut() {
                open.held_on = Some(period);
            }
            return false;
        }
        sealed.1 += 1;
        self.open[g] = None;
        let delay = if self.model.upload_delay > 0.0 {
            rng.random::<f64>() * self.model.upload_delay
        } else {
            0.0
        };
        if self.model.steering.is_on() {
            self.acks.push(t + delay);
        }
        sink.report(self.app, g as u8, t, t + delay);
        true
    }

    /// Seals every histogram due before `now` (the daemon ticks often enough that a histogram
    /// seals the moment it is due).
    fn seal_due(&mut self, now: f64, rng: &mut ChaCha8Rng, sink: &mut impl Sink) {
        for g in 0..self.open.len() {
            while let Some(open) = self.open[g] {
                let due = match open.held_on {
                    Some(period) => (period + 1) as f64 * self.model.cap.period,
                    None => open.opened + self.seal_age[g],
                };
                if due >= now || self.try_seal(g, due, rng, sink) {
                    break;
                }
            }
        }
    }

    /// Adds `hits` samples to group `g` at `t`, sealing at the seal size within the cap; values
    /// for a full histogram the cap holds back are dropped (as the agent does).
    fn add(&mut self, g: usize, t: f64, mut hits: u64, rng: &mut ChaCha8Rng, sink: &mut impl Sink) {
        let limit = self.model.seal_samples;
        while hits > 0 {
            let open = self.open[g].get_or_insert(Open {
                opened: t,
                samples: 0,
                held_on: None,
            });
            if open.samples >= limit {
                if !self.try_seal(g, t, rng, sink) {
                    return;
                }
                continue;
            }
            let take = hits.min(limit - open.samples);
            open.samples += take;
            hits -= take;
            if open.samples >= limit {
                self.try_seal(g, t, rng, sink);
            }
        }
    }
}

/// Draws a binomial(`n`, 1/S) count by skipping geometric gaps between sampled launches.
fn bernoulli_hits(rng: &mut ChaCha8Rng, n: u64, period: SamplePeriod) -> u64 {
    if period.get() == 1 {
        return n;
    }
    let miss = (-1.0 / f64::from(period.get())).ln_1p();
    let (mut hits, mut at) = (0u64, 0u64);
    loop {
        let u: f64 = rng.random();
        // Launches up to and including the next sampled one: 1 + floor(ln U / ln(1 - p)).
        let gap = ((1.0 - u).ln() / miss).floor();
        if gap >= (n - at) as f64 {
            return hits;
        }
        at += gap as u64 + 1;
        hits += 1;
    }
}

/// One GPU's agent that can be run a stretch of time at a time, so that the fleet's GPUs can be
/// advanced together and steered by what the aggregation server has counted
/// ([`super::steer`]). Without steering, running it to the horizon in one stretch or in many
/// gives the same events (windows are processed in the same order and nothing happens at a
/// stretch's end).
pub struct Gpu<'a> {
    agent: Agent<'a>,
    setup: GpuSetup,
    profile: AppProfile,
    horizon: f64,
    countdown: Option<SamplingSchedule<ChaCha8Rng>>,
    rng: ChaCha8Rng,
    /// The next window's opening.
    next: f64,
    /// When the last window closed: nothing before it can change any more.
    settled: f64,
    /// Per group: the last hint received (an agent that has none yet treats its class as
    /// short of reports; [`super::steer`] says why).
    hints: Vec<Hint>,
}

impl<'a> Gpu<'a> {
    /// A GPU at time 0: `setup` from the scenario, `profile` its application's windows, `rng`
    /// its own stream (upload delays, Bernoulli draws, re-seeded countdowns).
    pub fn new(
        model: &'a AgentModel,
        setup: &GpuSetup,
        profile: &AppProfile,
        horizon: f64,
        rng: ChaCha8Rng,
    ) -> Self {
        let groups = usize::from(model.groups);
        let countdown = match model.sampler {
            SamplerModel::Countdown => Some(SamplingSchedule::new(
                model.steering.period(model.period, Hint::Short),
                model.reoffset,
                ChaCha8Rng::seed_from_u64(setup.sampler_seed),
                Duration::from_secs_f64(setup.first_window),
            )),
            SamplerModel::Bernoulli => None,
        };
        let initial_age = model.steering.seal_age(model.seal_age, Hint::Short);
        Self {
            agent: Agent {
                model,
                app: setup.app,
                open: vec![None; groups],
                sealed: vec![(0, 0); groups],
                seal_age: vec![initial_age; groups],
                acks: Vec::new(),
            },
            setup: *setup,
            profile: *profile,
            horizon,
            countdown,
            rng,
            next: setup.first_window,
            settled: 0.0,
            hints: vec![Hint::Short; groups],
        }
    }

    /// Acts on the acks that arrived by `now`: the hints for every group of the class, as the
    /// server counted at `server`'s time. Histograms due before the ack's arrival (or the last
    /// window's close, whichever is later) seal under the old age first; a new age applies to
    /// the open ones from then on.
    fn take_acks(&mut self, now: f64, server: &dyn Server, sink: &mut impl Sink) {
        let Some(first) = self
            .agent
            .acks
            .iter()
            .copied()
            .filter(|&a| a <= now)
            .min_by(f64::total_cmp)
        else {
            return;
        };
        self.agent.acks.retain(|&a| a > now);
        let at = first.max(self.settled);
        self.agent.seal_due(at, &mut self.rng, sink);
        let steering = self.agent.model.steering;
        for g in 0..self.hints.len() {
            let hint = server.hint(self.setup.app, g as u8, first);
            self.hints[g] = hint;
            let age = steering.seal_age(self.agent.model.seal_age, hint);
            self.agent.seal_age[g] = age;
            if let Some(open) = self.agent.open[g].as_mut() {
                open.opened = open.opened.max(at - age);
            }
        }
    }

    /// Runs the windows that open before `until` (and before the horizon); `server` answers
    /// the acks when steering is on.
    pub fn advance(&mut self, until: f64, server: &dyn Server, sink: &mut impl Sink) {
        let model = self.agent.model;
        let until = until.min(self.horizon);
        while self.next < until {
            let t = self.next;
            let group = self.setup.group_at(model, t);
            let launches = self.profile.window_launches;
            let hits = if model.steering.is_on() {
                self.take_acks(t, server, sink);
                let period = model
                    .steering
                    .period(model.period, self.hints[usize::from(group)]);
                match self.countdown.as_mut() {
                    Some(schedule) => {
                        if schedule.period() != period {
                            // The agent writes a fresh countdown for the new period.
                            *schedule = SamplingSchedule::new(
                                period,
                                model.reoffset,
                                ChaCha8Rng::seed_from_u64(self.rng.random()),
                                Duration::from_secs_f64(t),
                            );
                        }
                        schedule.start_block(Duration::from_secs_f64(t));
                        schedule.on_launches(launches, Duration::from_secs_f64(t))
                    }
                    None => bernoulli_hits(&mut self.rng, launches, period),
                }
            } else {
                match self.countdown.as_mut() {
                    Some(schedule) => {
                        // The agent starts a block of S at every window it opens.
                        schedule.start_block(Duration::from_secs_f64(t));
                        schedule.on_launches(launches, Duration::from_secs_f64(t))
                    }
                    None => bernoulli_hits(&mut self.rng, launches, model.period),
                }
            };
            sink.window(self.setup.app, group, t, launches, hits);
            // The window's snippet reaches the pipeline when the window closes.
            let closed = t + self.profile.window_seconds;
            self.agent
                .seal_due(closed.min(self.horizon), &mut self.rng, sink);
            if hits > 0 && closed < self.horizon {
                self.agent
                    .add(usize::from(group), closed, hits, &mut self.rng, sink);
            }
            self.settled = closed;
            self.next += self.profile.cycle_seconds;
        }
    }

    /// Seals what is due by the horizon; call once, after the last stretch.
    pub fn finish(&mut self, sink: &mut impl Sink) {
        self.agent.seal_due(self.horizon, &mut self.rng, sink);
    }
}

/// Runs one GPU from time 0 to `horizon` seconds in one stretch, unsteered: `setup` from the
/// scenario, `profile` its application's windows, `rng` its own stream (upload delays,
/// Bernoulli draws).
pub fn run(
    model: &AgentModel,
    setup: &GpuSetup,
    profile: &AppProfile,
    horizon: f64,
    rng: ChaCha8Rng,
    sink: &mut impl Sink,
) {
    let mut gpu = Gpu::new(model, setup, profile, horizon, rng);
    gpu.advance(horizon, &super::steer::Unsteered, sink);
    gpu.finish(sink);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::num::NonZeroU32;

    #[test]
    fn bernoulli_counts_have_the_binomial_mean() {
        let mut rng = ChaCha8Rng::seed_from_u64(9);
        let s = SamplePeriod(NonZeroU32::new(100).unwrap());
        let total: u64 = (0..20_000).map(|_| bernoulli_hits(&mut rng, 250, s)).sum();
        // Mean 2.5 per draw, 50,000 in all; sd sqrt(20,000 x 250 x 0.01 x 0.99) = 222.
        assert!((total as f64 - 50_000.0).abs() < 5.0 * 222.0, "{total}");
        assert_eq!(
            bernoulli_hits(&mut rng, 17, SamplePeriod(NonZeroU32::MIN)),
            17
        );
    }
}
