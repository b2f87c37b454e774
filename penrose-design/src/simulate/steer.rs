//! Steering by the ack (`--steer`): the aggregation server's ack to a report carries a hint
//! for the report's class, and the agent applies it to the local application the report came
//! from.
//!
//! The server knows, per (class, counter group, epoch), how many reports it has counted. The
//! hint says, for each counter group of the class, whether the current epoch's count is still
//! short of the release rule's r >= (k - 1) x T x days + 1 reports ([`Hint::Short`]) or has
//! reached it ([`Hint::Enough`]). One bit per group, from a count every agent of the class
//! shares, so that the hint is the same for every agent of the class at a given moment (what
//! a server that gives different hints could do instead is in docs/evaluation.md, "Steering by
//! the ack").
//!
//! The agent maps the hint onto levers it really has, per counter group of that application:
//!
//! - **rate**: the sampling period S / f while short, S x f once enough (the wording:
//!   sample rare classes more, common ones less). It changes samples, not probed launches, so
//!   the overhead budget, which charges probed launches, is untouched.
//! - **seal age**: a shorter seal age while short (more, smaller reports an hour), the
//!   configured one once enough. The cap of T reports per (counter, day) still holds: the
//!   shorter age only reaches it sooner.
//! - **both** together.
//!
//! An agent that has had no ack yet (just started) treats its class as short: its first
//! reports then leave minutes after start, and the acks to them relax the common classes at
//! once; waiting for the first ack at an hour's seal age (the default when steering was
//! measured) would cost a rare class its first hour. A new epoch starts every count at zero,
//! so every class is short again until it is released anew.
//!
//! Not levers: the threshold k and the cap T (privacy guarantees: steering must never let one
//! GPU count as more contributors), the overhead budget (a promise to each host, not a fleet
//! average), and the counter-group rotation (every group is needed and all are alike here, so a
//! turn given to one group is taken from another).

use std::fmt;
use std::num::NonZeroU32;
use std::str::FromStr;

use penrose_core::sampling::SamplePeriod;
use serde::Serialize;

/// What the ack asks of the agent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Policy {
    /// No hints: the shipped agent.
    None,
    /// The sampling period.
    Rate,
    /// The seal age.
    SealAge,
    /// Both.
    Both,
}

impl Policy {
    /// The name used on the command line and in tables.
    pub fn name(self) -> &'static str {
        match self {
            Policy::None => "none",
            Policy::Rate => "rate",
            Policy::SealAge => "seal-age",
            Policy::Both => "both",
        }
    }
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Policy {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "none" => Ok(Policy::None),
            "rate" => Ok(Policy::Rate),
            "seal-age" => Ok(Policy::SealAge),
            "both" => Ok(Policy::Both),
            other => Err(format!(
                "unknown steering policy {other:?}: expected none, rate, seal-age or both"
            )),
        }
    }
}

/// The hint for one counter group of a class.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hint {
    /// The current epoch's reports are short of release (or the agent has heard nothing yet).
    Short,
    /// Released: enough reports this epoch.
    Enough,
}

/// A policy with its settings, as the agent applies it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Steering {
    /// Which levers.
    pub policy: Policy,
    /// f: a short class samples 1 in S / f, a released one 1 in S x f.
    pub rate_factor: u32,
    /// The seal age of a short class, seconds (never longer than the configured one).
    pub short_seal_age: f64,
}

impl Steering {
    /// No steering.
    pub const OFF: Steering = Steering {
        policy: Policy::None,
        rate_factor: 1,
        short_seal_age: f64::INFINITY,
    };

    /// Whether acks carry hints at all.
    pub fn is_on(self) -> bool {
        self.policy != Policy::None
    }

    /// The sampling period for a group with `hint`, from the configured `base`.
    pub fn period(self, base: SamplePeriod, hint: Hint) -> SamplePeriod {
        if !matches!(self.policy, Policy::Rate | Policy::Both) {
            return base;
        }
        let f = self.rate_factor.max(1);
        let s = match hint {
            Hint::Short => base.get() / f,
            Hint::Enough => base.get().saturating_mul(f),
        };
        SamplePeriod(NonZeroU32::new(s).unwrap_or(NonZeroU32::MIN))
    }

    /// The seal age for a group with `hint`, from the configured `base` (seconds).
    pub fn seal_age(self, base: f64, hint: Hint) -> f64 {
        match (self.policy, hint) {
            (Policy::SealAge | Policy::Both, Hint::Short) => base.min(self.short_seal_age),
            _ => base,
        }
    }
}

/// The aggregation server as an ack sees it.
pub trait Server {
    /// The hint for (`app`, `group`) in an ack that arrives at `at` seconds.
    fn hint(&self, app: u32, group: u8, at: f64) -> Hint;
}

/// The server of an unsteered run, never asked.
pub struct Unsteered;

impl Server for Unsteered {
    fn hint(&self, _: u32, _: u8, _: f64) -> Hint {
        Hint::Short
    }
}

/// The server's report counts per (application, group, epoch) as of the end of the last step.
#[derive(Clone, Debug)]
pub struct Counts {
    groups: usize,
    epochs: usize,
    epoch: f64,
    /// Reports needed for release, per epoch.
    need: Vec<u64>,
    /// Index `(app * groups + group) * epochs + epoch`.
    counts: Vec<u64>,
}

impl Counts {
    /// Zero counts for `apps` applications; `need[e]`: the reports epoch `e` needs.
    pub fn new(apps: u32, groups: u8, epoch: f64, need: Vec<u64>) -> Self {
        let groups = usize::from(groups);
        let epochs = need.len().max(1);
        Self {
            groups,
            epochs,
            epoch,
            need,
            counts: vec![0; apps as usize * groups * epochs],
        }
    }

    /// The epoch of time `t` (the last one for times past the run).
    pub fn epoch_of(&self, t: f64) -> usize {
        ((t / self.epoch).floor().max(0.0) as usize).min(self.epochs - 1)
    }

    /// The index of (application, group, epoch) in the counts.
    pub fn index(&self, app: u32, group: u8, epoch: usize) -> usize {
        (app as usize * self.groups + usize::from(group)) * self.epochs + epoch
    }

    /// Counts one report that reached the server, by its index.
    pub fn count(&mut self, index: usize) {
        if let Some(c) = self.counts.get_mut(index) {
            *c += 1;
        }
    }
}

impl Server for Counts {
    fn hint(&self, app: u32, group: u8, at: f64) -> Hint {
        let e = self.epoch_of(at);
        let have = self
            .counts
            .get(self.index(app, group, e))
            .copied()
            .unwrap_or(0);
        if have >= self.need.get(e).copied().unwrap_or(u64::MAX) {
            Hint::Enough
        } else {
            Hint::Short
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levers_move_only_for_their_policy() {
        let s = SamplePeriod(NonZeroU32::new(10_000).unwrap_or(NonZeroU32::MIN));
        let steer = |policy| Steering {
            policy,
            rate_factor: 10,
            short_seal_age: 300.0,
        };
        assert_eq!(steer(Policy::Rate).period(s, Hint::Short).get(), 1_000);
        assert_eq!(steer(Policy::Rate).period(s, Hint::Enough).get(), 100_000);
        assert_eq!(steer(Policy::Rate).seal_age(3600.0, Hint::Short), 3600.0);
        assert_eq!(steer(Policy::SealAge).period(s, Hint::Short), s);
        assert_eq!(steer(Policy::SealAge).seal_age(3600.0, Hint::Short), 300.0);
        assert_eq!(
            steer(Policy::SealAge).seal_age(3600.0, Hint::Enough),
            3600.0
        );
        assert_eq!(steer(Policy::SealAge).seal_age(120.0, Hint::Short), 120.0);
        assert_eq!(steer(Policy::Both).period(s, Hint::Short).get(), 1_000);
        assert_eq!(Steering::OFF.period(s, Hint::Short), s);
        assert_eq!(Steering::OFF.seal_age(3600.0, Hint::Short), 3600.0);
        let one = SamplePeriod(NonZeroU32::MIN);
        assert_eq!(steer(Policy::Rate).period(one, Hint::Short), one);
        for p in [Policy::None, Policy::Rate, Policy::SealAge, Policy::Both] {
            assert_eq!(p.name().parse::<Policy>(), Ok(p));
        }
    }

    #[test]
    fn the_hint_turns_at_the_release_count() {
        let mut c = Counts::new(2, 3, 86_400.0, vec![2, 2]);
        assert_eq!(c.hint(1, 2, 10.0), Hint::Short);
        c.count(c.index(1, 2, 0));
        c.count(c.index(1, 2, 0));
        assert_eq!(c.hint(1, 2, 10.0), Hint::Enough);
        assert_eq!(c.hint(1, 1, 10.0), Hint::Short);
        assert_eq!(c.hint(0, 2, 10.0), Hint::Short);
        // A new epoch starts from zero.
        assert_eq!(c.hint(1, 2, 86_400.0 + 10.0), Hint::Short);
    }
}
