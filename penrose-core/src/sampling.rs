//! Which launches are sampled for performance counters.
//!
//! One launch in S is sampled. The position of the sampled launch within each run of S is a
//! random offset, re-drawn every O seconds, so that an application whose launch pattern has
//! period S cannot hide (or always expose) the same kernel. The schedule is a countdown, which
//! is also what the BPF side runs: user space computes the countdown and the probe decrements
//! it.

use std::num::NonZeroU32;
use std::time::Duration;

use rand::Rng;

/// The agent's sampling period: 1 launch in 1,000 (the paper's is 10,000). Chosen from the fleet
/// simulator together with [`crate::histogram::DEFAULT_SEAL_MAX_AGE`]: at the same probe
/// budget, 97.5% of 500 small-kernel applications on 100,000 GPUs are released after 3.7 h
/// instead of 12.2 h (docs/evaluation.md, "Steering by the ack").
pub const DEFAULT_SAMPLE_PERIOD: SamplePeriod = SamplePeriod(match NonZeroU32::new(1_000) {
    Some(p) => p,
    None => unreachable!(),
});

/// The paper's re-offset interval: a new random offset every 600 s.
pub const DEFAULT_REOFFSET_INTERVAL: Duration = Duration::from_secs(600);

/// S: one launch in this many is sampled.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SamplePeriod(pub NonZeroU32);

impl SamplePeriod {
    /// The period as a plain number.
    pub fn get(self) -> u32 {
        self.0.get()
    }
}

/// Whether a launch was chosen for sampling.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Read the counters for this launch.
    Sample,
    /// Let it pass.
    Skip,
}

/// The 1-in-S schedule with a random offset re-drawn every O.
///
/// Time is passed in by the caller as the duration since an arbitrary fixed start, which keeps
/// this module free of clocks and lets tests drive it.
#[derive(Debug)]
pub struct SamplingSchedule<R> {
    period: SamplePeriod,
    reoffset_every: Duration,
    rng: R,
    /// Launches to let pass before the next sampled one.
    countdown: u32,
    next_reoffset: Duration,
}

impl<R: Rng> SamplingSchedule<R> {
    /// Starts a schedule at time `now`, drawing the first offset.
    pub fn new(period: SamplePeriod, reoffset_every: Duration, mut rng: R, now: Duration) -> Self {
        let countdown = rng.random_range(0..period.get());
        SamplingSchedule {
            period,
            reoffset_every,
            rng,
            countdown,
            next_reoffset: now.saturating_add(reoffset_every),
        }
    }

    /// Decides for one launch at time `now`.
    pub fn on_launch(&mut self, now: Duration) -> Decision {
        self.maybe_reoffset(now);
        if self.countdown == 0 {
            self.countdown = self.period.get() - 1;
            Decision::Sample
        } else {
            self.countdown -= 1;
            Decision::Skip
        }
    }

    /// Decides for `launches` consecutive launches at time `now` at once and returns how many of
    /// them are sampled: the same count, and the same state afterwards, as `launches` calls of
    /// [`Self::on_launch`] with that `now` (tested), in constant time. The fleet simulator
    /// (`penrose_design::simulate`) runs one capture window of a GPU through it.
    pub fn on_launches(&mut self, launches: u64, now: Duration) -> u64 {
        self.maybe_reoffset(now);
        let countdown = u64::from(self.countdown);
        if launches <= countdown {
            // Fits in u32: at most the countdown, which is one.
            self.countdown = (countdown - launches) as u32;
            return 0;
        }
        let period = u64::from(self.period.get());
        // The launch after the countdown is sampled; then every period-th one.
        let after_first = launches - countdown - 1;
        // Below the period, so it fits in u32.
        self.countdown = (period - 1 - after_first % period) as u32;
        1 + after_first / period
    }

    /// Launches that will pass before the next sampled one, as of `now`; this is the value the
    /// agent writes into the BPF countdown map.
    pub fn countdown(&mut self, now: Duration) -> u32 {
        self.maybe_reoffset(now);
        self.countdown
    }

    /// The period S.
    pub fn period(&self) -> SamplePeriod {
        self.period
    }

    fn maybe_reoffset(&mut self, now: Duration) {
        if now >= self.next_reoffset {
            self.countdown = self.rng.random_range(0..self.period.get());
            // Skip whole intervals that passed without launches, so the offset changes once
            // per interval boundary crossed rather than once per missed interval.
            while self.next_reoffset <= now && !self.reoffset_every.is_zero() {
                self.next_reoffset = self.next_reoffset.saturating_add(self.reoffset_every);
            }
            if self.reoffset_every.is_zero() {
                self.next_reoffset = now;
            }
        }
    }
}

/// P_hit = 1 - (1 - 1/S)^u: the probability that at least one of `launches` launches of an
/// application is sampled. The simulator and capacity planning rest on it.
///
/// Computed as `-expm1(u * ln1p(-1/S))`, which stays accurate when the probability is tiny.
pub fn hit_probability(period: SamplePeriod, launches: u64) -> f64 {
    let per_launch = -1.0 / f64::from(period.get());
    -((launches as f64) * per_launch.ln_1p()).exp_m1()
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;

    fn period(s: u32) -> SamplePeriod {
        SamplePeriod(NonZeroU32::new(s).unwrap())
    }

    #[test]
    fn exactly_one_in_s_within_an_interval() {
        let mut s = SamplingSchedule::new(
            period(100),
            Duration::from_secs(600),
            ChaCha8Rng::seed_from_u64(7),
            Duration::ZERO,
        );
        let hits: Vec<usize> = (0..10_000)
            .filter(|_| s.on_launch(Duration::from_secs(1)) == Decision::Sample)
            .collect();
        assert_eq!(hits.len(), 100);
        // Evenly spaced by S within one offset interval.
        assert!(hits.windows(2).all(|w| w[1] - w[0] == 100));
    }

    #[test]
    fn offset_is_redrawn_each_interval() {
        let mut s = SamplingSchedule::new(
            period(10_000),
            Duration::from_secs(600),
            ChaCha8Rng::seed_from_u64(1),
            Duration::ZERO,
        );
        let mut offsets = Vec::new();
        for interval in 0..20u64 {
            let now = Duration::from_secs(interval * 600 + 1);
            offsets.push(s.countdown(now));
        }
        offsets.sort_unstable();
        offsets.dedup();
        // 20 draws from 10,000 values: a repeat is possible but 5 or fewer distinct would mean
        // the offset is not being re-drawn.
        assert!(offsets.len() > 15, "{offsets:?}");
        assert!(offsets.iter().all(|&o| o < 10_000));
    }

    #[test]
    fn seeded_schedules_repeat() {
        let run = |seed| {
            let mut s = SamplingSchedule::new(
                period(37),
                Duration::from_secs(1),
                ChaCha8Rng::seed_from_u64(seed),
                Duration::ZERO,
            );
            (0..2000u64)
                .map(|i| s.on_launch(Duration::from_millis(i * 3)) == Decision::Sample)
                .collect::<Vec<_>>()
        };
        assert_eq!(run(5), run(5));
        assert_ne!(run(5), run(6));
    }

    #[test]
    fn a_batch_of_launches_counts_as_launches_one_by_one() {
        for (s, seed) in [(1, 1), (2, 2), (7, 3), (100, 4), (10_000, 5)] {
            let start = || {
                SamplingSchedule::new(
                    period(s),
                    Duration::from_secs(600),
                    ChaCha8Rng::seed_from_u64(seed),
                    Duration::ZERO,
                )
            };
            let (mut batch, mut single) = (start(), start());
            let mut rng = ChaCha8Rng::seed_from_u64(seed + 100);
            for step in 0..400u64 {
                // Windows of 0 to 30,000 launches, 100 s apart (a re-offset every 6 windows).
                let now = Duration::from_secs(step * 100);
                let launches = rng.random_range(0..30_000u64);
                let hits = batch.on_launches(launches, now);
                let direct = (0..launches)
                    .filter(|_| single.on_launch(now) == Decision::Sample)
                    .count() as u64;
                assert_eq!(
                    hits, direct,
                    "S = {s}, window {step} of {launches} launches"
                );
                assert_eq!(batch.countdown(now), single.countdown(now));
            }
        }
    }

    #[test]
    fn hit_probability_matches_formula() {
        let s = period(10_000);
        assert_eq!(hit_probability(s, 0), 0.0);
        let direct = 1.0 - (1.0 - 1.0 / 10_000f64).powf(5_000.0);
        assert!((hit_probability(s, 5_000) - direct).abs() < 1e-12);
        // About 1 - 1/e after S launches.
        assert!((hit_probability(s, 10_000) - (1.0 - (-1f64).exp())).abs() < 1e-4);
        assert!(hit_probability(s, 1_000_000) > 0.9999);
        assert_eq!(hit_probability(period(1), 1), 1.0);
    }
}
