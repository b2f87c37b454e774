//! Which launches are sampled for performance counters.
//!
//! One launch in S is sampled: launches fall into consecutive blocks of S, and each block's
//! sampled launch sits at a position drawn uniformly and afresh for that block (jittered
//! systematic sampling). The schedule is a countdown, which is also what the BPF side runs:
//! user space seeds the countdown and the probe decrements it and draws each block's position
//! with `bpf_get_prandom_u32` (`penrose-ebpf/src/sampling.rs`). A capture window starts a block
//! ([`SamplingSchedule::start_block`]), and a schedule that runs across windows is re-seeded
//! every O seconds with a state drawn as a random moment would find it, which changes no rate.
//!
//! Exactly one sample per block keeps the count in any run of launches within one of its
//! expectation, as a fixed gap of S does. The fresh position per block is what a fixed gap
//! lacks: applications repeat (a training step launches the same P kernels again and again),
//! and a fixed gap visits only the positions `offset + j S mod P` of that period (27 of the
//! 2,700 launches of the `nccl_data` trace at S = 1,000), however many samples are taken; a
//! release of such an application stayed 0.24 in total variation from its true histogram at
//! 10,000 samples (docs/evaluation.md, "How exact a released distribution is").

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
    state: Countdown,
    next_reoffset: Duration,
}

impl<R: Rng> SamplingSchedule<R> {
    /// Starts a schedule at time `now`, drawing the first offset.
    pub fn new(period: SamplePeriod, reoffset_every: Duration, mut rng: R, now: Duration) -> Self {
        let state = Countdown::offset(period, &mut rng);
        SamplingSchedule {
            period,
            reoffset_every,
            rng,
            state,
            next_reoffset: now.saturating_add(reoffset_every),
        }
    }

    /// Decides for one launch at time `now`.
    pub fn on_launch(&mut self, now: Duration) -> Decision {
        self.maybe_reoffset(now);
        if self.state.countdown == 0 {
            self.sampled();
            Decision::Sample
        } else {
            self.state.countdown -= 1;
            Decision::Skip
        }
    }

    /// A capture window opens: a block starts at its first launch, so that a window of u
    /// launches holds a sample with probability min(1, u / S), and one of S launches exactly
    /// one (the agent seeds the probe the same way at every window it opens).
    /// A block start is a re-seed: the next re-offset is O after `now`.
    pub fn start_block(&mut self, now: Duration) {
        self.state = Countdown::block_start(self.period, &mut self.rng);
        self.next_reoffset = now.saturating_add(self.reoffset_every);
    }

    /// The launch the countdown reached is sampled: on to the next block's.
    fn sampled(&mut self) {
        self.state = Countdown::after(self.state.tail, self.period, &mut self.rng);
    }

    /// Decides for `launches` consecutive launches at time `now` at once and returns how many of
    /// them are sampled: the same count, and the same state afterwards, as `launches` calls of
    /// [`Self::on_launch`] with that `now` (tested), in time proportional to the samples, not
    /// the launches. The fleet simulator (`penrose_design::simulate`) runs one capture window of
    /// a GPU through it.
    pub fn on_launches(&mut self, launches: u64, now: Duration) -> u64 {
        self.maybe_reoffset(now);
        let mut left = launches;
        let mut hits = 0;
        while left > u64::from(self.state.countdown) {
            // The countdown's launches pass, the next one is sampled.
            left -= u64::from(self.state.countdown) + 1;
            hits += 1;
            self.sampled();
        }
        // Below the countdown, so it fits in u32.
        self.state.countdown -= left as u32;
        hits
    }

    /// Launches that will pass before the next sampled one, as of `now`; this is the value the
    /// agent writes into the BPF countdown map.
    pub fn countdown(&mut self, now: Duration) -> u32 {
        self.maybe_reoffset(now);
        self.state.countdown
    }

    /// The period S.
    pub fn period(&self) -> SamplePeriod {
        self.period
    }

    fn maybe_reoffset(&mut self, now: Duration) {
        if now >= self.next_reoffset {
            self.state = Countdown::offset(self.period, &mut self.rng);
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

/// Where a schedule stands: launches to let pass before the next sample, and launches left in
/// that sample's block after it. The probe keeps the same pair in one per-CPU word
/// ([`Countdown::to_probe_word`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Countdown {
    /// Launches to let pass before the next sampled one.
    pub countdown: u32,
    /// Launches of the next sample's block that follow it.
    pub tail: u32,
}

impl Countdown {
    /// As a random moment finds a schedule of `period`: at a uniform position b of a block
    /// whose sample sits at a uniform position q, which is still ahead (q >= b) or came
    /// already (then the next block's). Seeding with it changes no sampling rate; a uniform
    /// countdown from 0 to S - 1 would give a fresh chance at every re-seed, and sample more
    /// than one launch in S when re-seeds come about as often as samples.
    pub fn offset(period: SamplePeriod, rng: &mut impl Rng) -> Self {
        let s = period.get();
        let b = rng.random_range(0..s);
        let q = rng.random_range(0..s);
        if q >= b {
            Countdown {
                countdown: q - b,
                tail: s - 1 - q,
            }
        } else {
            Countdown::after(s - 1 - b, period, rng)
        }
    }

    /// A block starting at the next launch: its sample at a uniform position.
    pub fn block_start(period: SamplePeriod, rng: &mut impl Rng) -> Self {
        Countdown::after(0, period, rng)
    }

    /// The state after a sample with `tail` launches left in its block: the next block's
    /// position drawn afresh.
    pub fn after(tail: u32, period: SamplePeriod, rng: &mut impl Rng) -> Self {
        let s = period.get();
        let q = rng.random_range(0..s);
        Countdown {
            countdown: tail.saturating_add(q),
            tail: s - 1 - q,
        }
    }

    /// The per-CPU word the probe decrements: the tail in the high half, the countdown plus
    /// one in the low half (the probe samples the launch that finds 1 or less there).
    pub fn to_probe_word(self) -> u64 {
        (u64::from(self.tail) << 32) | (u64::from(self.countdown) + 1).min(u64::from(u32::MAX))
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

    /// A schedule of period `s`, re-seeded every `reoffset` seconds, from `seed`, at time 0.
    fn schedule(s: u32, reoffset: u64, seed: u64) -> SamplingSchedule<ChaCha8Rng> {
        SamplingSchedule::new(
            period(s),
            Duration::from_secs(reoffset),
            ChaCha8Rng::seed_from_u64(seed),
            Duration::ZERO,
        )
    }

    #[test]
    fn one_in_each_block_of_s_at_a_position_that_varies() {
        let mut s = schedule(100, 600, 7);
        let hits: Vec<usize> = (0..100_000)
            .filter(|_| s.on_launch(Duration::from_secs(1)) == Decision::Sample)
            .collect();
        // The first block starts wherever the seed put it; every later block of 100 holds
        // exactly one sample.
        assert!((999..=1_001).contains(&hits.len()), "{}", hits.len());
        let gaps: Vec<usize> = hits.windows(2).map(|w| w[1] - w[0]).collect();
        assert!(gaps.iter().all(|&g| (1..=199).contains(&g)), "{gaps:?}");
        let mut distinct = gaps.clone();
        distinct.sort_unstable();
        distinct.dedup();
        assert!(distinct.len() > 150, "{} distinct gaps", distinct.len());
    }

    /// A window that starts a block holds a sample with probability min(1, u / S), and a
    /// window of S launches exactly one.
    #[test]
    fn a_window_that_starts_a_block_samples_with_probability_u_over_s() {
        let mut s = schedule(100, 600, 4);
        let mut windows_of = |u: u64| -> Vec<u64> {
            (0..4_000)
                .map(|_| {
                    s.start_block(Duration::from_secs(1));
                    s.on_launches(u, Duration::from_secs(1))
                })
                .collect()
        };
        assert!(windows_of(100).iter().all(|&h| h == 1));
        let hit = windows_of(30).iter().filter(|&&h| h > 0).count();
        // 1,200 expected, spread about 29.
        assert!((1_080..=1_320).contains(&hit), "{hit}");
    }

    /// Re-offsets as often as samples change nothing of the rate: one launch in S.
    #[test]
    fn frequent_re_offsets_keep_the_rate_at_one_in_s() {
        let mut s = schedule(100, 1, 9);
        // 2,000,000 launches, a re-offset every 50 (20,000 expected samples).
        let samples = (0..2_000_000u64)
            .filter(|i| s.on_launch(Duration::from_secs(i / 50)) == Decision::Sample)
            .count();
        assert!((19_400..=20_600).contains(&samples), "{samples}");
    }

    /// An application that repeats a period of P launches is sampled across its whole period
    /// within one offset interval; a fixed gap of S reaches only P / gcd(S, P) positions (27
    /// here), however many samples it takes.
    #[test]
    fn a_periodic_application_is_sampled_across_its_period() {
        let (p, s) = (2_700usize, 1_000);
        let mut schedule = schedule(s, 600, 3);
        let mut positions: Vec<usize> = (0..p * 1_000)
            .filter(|_| schedule.on_launch(Duration::from_secs(1)) == Decision::Sample)
            .map(|i| i % p)
            .collect();
        let samples = positions.len();
        positions.sort_unstable();
        positions.dedup();
        // About 2,700 samples over 2,700 positions: a uniform draw covers about 63% of them.
        assert!(samples > 2_400, "{samples}");
        assert!(positions.len() > 1_400, "{} positions", positions.len());
    }

    #[test]
    fn offset_is_redrawn_each_interval() {
        let mut s = schedule(10_000, 600, 1);
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
        assert!(offsets.iter().all(|&o| o < 20_000));
    }

    #[test]
    fn the_probe_word_holds_the_tail_high_and_the_countdown_plus_one_low() {
        let c = Countdown {
            countdown: 5,
            tail: 7,
        };
        assert_eq!(c.to_probe_word(), (7 << 32) | 6);
    }

    #[test]
    fn seeded_schedules_repeat() {
        let run = |seed| {
            let mut s = schedule(37, 1, seed);
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
            let start = || schedule(s, 600, seed);
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
