//! Release policy: the rules every tier applies before a sum may reach the key holder, in one
//! place so that the agent, the aggregation server and the design server cannot disagree.
//!
//! - **Epochs.** A report belongs to exactly one epoch; a sum is released only once its epoch
//!   is closed, and a released sum never changes. So no two released sums differ by a few
//!   reports: they are disjoint.
//! - **Contributors, not reports.** Reports carry no identity, so the number of owners behind
//!   a sum is bounded from below: an agent sends at most [`ReportsPerContributor`] reports per
//!   (counter, day), so a sum of `r` reports spanning `d` days has at least
//!   `ceil(r / (T * d))` contributors ([`contributors_at_least`]). Honest agents enforce T on
//!   themselves (`penrose-agent`); anonymous admission tokens (a later issue) will enforce it
//!   on everyone. The threshold k applies to that bound.
//! - **Floors.** k is at least [`MIN_CONTRIBUTORS`] and T at least
//!   [`ReportsPerContributor::DEFAULT`] on every tier: configuration can only make release
//!   stricter. Public keys are at least [`MIN_KEY_BITS`] bits. A report's day must be within
//!   [`DAY_TOLERANCE`] days of the server's.

use thiserror::Error;

use crate::wire::Day;

/// The fewest contributors a released sum may have, whatever the configuration says
/// (docs/design.md section 7).
pub const MIN_CONTRIBUTORS: u64 = 10;

/// The smallest Paillier modulus any tier accepts.
pub const MIN_KEY_BITS: u32 = 2048;

/// What agents cap their reports at per (counter, day): [`ReportsPerContributor::DEFAULT`].
pub const DEFAULT_CAP: u32 = 24;

/// How many days a report's day may differ from the receiving server's, either way.
pub const DAY_TOLERANCE: u32 = 1;

/// k: the fewest contributors (owners) a sum must have to be released and decrypted. Read
/// back (a report's JSON) through [`Threshold::new`], so that a value under the floor is
/// refused there too.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
#[serde(try_from = "u64")]
pub struct Threshold(u64);

impl Threshold {
    /// The floor, which is also the default.
    pub const DEFAULT: Self = Self(MIN_CONTRIBUTORS);

    /// A threshold of `k` contributors; refused below the floor.
    pub fn new(k: u64) -> Result<Self, PolicyError> {
        if k < MIN_CONTRIBUTORS {
            return Err(PolicyError::ThresholdBelowFloor(k));
        }
        Ok(Self(k))
    }

    /// k.
    pub fn get(self) -> u64 {
        self.0
    }
}

impl TryFrom<u64> for Threshold {
    type Error = PolicyError;
    fn try_from(k: u64) -> Result<Self, PolicyError> {
        Self::new(k)
    }
}

/// T: the most reports one agent sends per (counter, day). Agents enforce it on themselves;
/// servers count contributors with it. Read back (a report's JSON) as the servers' cap,
/// through [`ReportsPerContributor::for_servers`]: only servers write it.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
#[serde(try_from = "u32")]
pub struct ReportsPerContributor(u32);

impl ReportsPerContributor {
    /// What agents ship with: on average one sealed histogram per hour of the day per counter,
    /// shared by all of the host's applications (the seal's maximum age is shorter, so a busy
    /// host reaches the cap and holds the rest for the next day).
    pub const DEFAULT: Self = Self(DEFAULT_CAP);

    /// A cap of `t` reports per (counter, day). Servers refuse values under the default,
    /// since a smaller T would count each report as more owners.
    pub fn for_servers(t: u32) -> Result<Self, PolicyError> {
        if t < Self::DEFAULT.0 {
            return Err(PolicyError::CapBelowFloor(t));
        }
        Ok(Self(t))
    }

    /// A cap an agent applies to itself: any value from 1 to the default (a smaller cap only
    /// sends less).
    pub fn for_agent(t: u32) -> Result<Self, PolicyError> {
        if t == 0 || t > Self::DEFAULT.0 {
            return Err(PolicyError::AgentCap(t));
        }
        Ok(Self(t))
    }

    /// T.
    pub fn get(self) -> u32 {
        self.0
    }
}

/// The release rule: k contributors, counted with T reports per contributor per (counter,
/// day). One type for every tier that applies it: the aggregation server before it exports a
/// sum, the release auditor before it decrypts its share, the design server when it checks
/// what a bundle says was applied. Both values are checked against their floors when made and
/// when read back from JSON, so a rule in hand is never weaker than the floors.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(try_from = "RuleValues", into = "RuleValues")]
pub struct ReleaseRule {
    /// k.
    pub threshold: Threshold,
    /// T.
    pub cap: ReportsPerContributor,
}

impl ReleaseRule {
    /// A rule of `k` contributors counted with a cap of `t`; refused under the floors.
    pub fn new(k: u64, t: u32) -> Result<Self, PolicyError> {
        Ok(Self {
            threshold: Threshold::new(k)?,
            cap: ReportsPerContributor::for_servers(t)?,
        })
    }

    /// Whether a sum of `reports` reports spanning `days` days may be released.
    pub fn releases(&self, reports: u64, days: u32) -> bool {
        releasable(reports, days, self.threshold, self.cap)
    }
}

impl Default for ReleaseRule {
    /// The floors, which are also what every tier ships with.
    fn default() -> Self {
        Self {
            threshold: Threshold::DEFAULT,
            cap: ReportsPerContributor::DEFAULT,
        }
    }
}

/// A rule's JSON form: the two numbers, checked against the floors when read.
#[derive(serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct RuleValues {
    threshold: u64,
    reports_per_contributor: u32,
}

impl TryFrom<RuleValues> for ReleaseRule {
    type Error = PolicyError;

    fn try_from(v: RuleValues) -> Result<Self, PolicyError> {
        Self::new(v.threshold, v.reports_per_contributor)
    }
}

impl From<ReleaseRule> for RuleValues {
    fn from(rule: ReleaseRule) -> Self {
        Self {
            threshold: rule.threshold.get(),
            reports_per_contributor: rule.cap.get(),
        }
    }
}

impl TryFrom<u32> for ReportsPerContributor {
    type Error = PolicyError;
    fn try_from(t: u32) -> Result<Self, PolicyError> {
        Self::for_servers(t)
    }
}

/// Why a policy value was refused.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub enum PolicyError {
    /// k below the floor.
    #[error("threshold {0} is below the floor of {MIN_CONTRIBUTORS} contributors")]
    ThresholdBelowFloor(u64),
    /// T below the floor.
    #[error(
        "reports per contributor {0} is below the agents' cap of {DEFAULT_CAP}: each report would \
         count as more owners than it can be"
    )]
    CapBelowFloor(u32),
    /// An agent cap outside 1..=default.
    #[error("an agent's report cap must be 1..={DEFAULT_CAP} per counter and day, not {0}")]
    AgentCap(u32),
    /// A key under the minimum size.
    #[error("a {0}-bit Paillier key is too weak; every tier requires at least {MIN_KEY_BITS} bits")]
    WeakKey(u32),
}

/// The fewest owners that can be behind `reports` reports whose days span `days` days, when
/// each owner sends at most `cap` per (counter, day): `ceil(reports / (cap * days))`.
pub fn contributors_at_least(reports: u64, days: u32, cap: ReportsPerContributor) -> u64 {
    let per_owner = u64::from(cap.get()) * u64::from(days.max(1));
    reports.div_ceil(per_owner)
}

/// Whether a sum of `reports` reports spanning `days` days may be released under `k` and `cap`.
pub fn releasable(reports: u64, days: u32, k: Threshold, cap: ReportsPerContributor) -> bool {
    contributors_at_least(reports, days, cap) >= k.get()
}

/// Refuses a modulus under [`MIN_KEY_BITS`].
pub fn check_key_bits(bits: u32) -> Result<(), PolicyError> {
    if bits < MIN_KEY_BITS {
        return Err(PolicyError::WeakKey(bits));
    }
    Ok(())
}

/// Whether a report stamped `day` may be accepted by a server whose day is `today`.
pub fn day_acceptable(day: Day, today: Day) -> bool {
    day.0.abs_diff(today.0) <= DAY_TOLERANCE
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_rule_under_the_floors_is_refused_also_from_json() {
        assert_eq!(
            ReleaseRule::new(MIN_CONTRIBUTORS - 1, DEFAULT_CAP),
            Err(PolicyError::ThresholdBelowFloor(MIN_CONTRIBUTORS - 1))
        );
        let weak = r#"{"threshold":10,"reports_per_contributor":1}"#;
        assert!(serde_json::from_str::<ReleaseRule>(weak).is_err());
        let rule = ReleaseRule::new(12, 30).unwrap();
        let text = serde_json::to_string(&rule).unwrap();
        assert_eq!(text, r#"{"threshold":12,"reports_per_contributor":30}"#);
        assert_eq!(serde_json::from_str::<ReleaseRule>(&text).unwrap(), rule);
    }

    #[test]
    fn a_rule_releases_at_k_contributors_counted_with_t() {
        let rule = ReleaseRule::default();
        // k - 1 contributors' worth of reports could all come from k - 1 owners; one more
        // report needs a k-th.
        let below = (MIN_CONTRIBUTORS - 1) * u64::from(DEFAULT_CAP);
        assert!(!rule.releases(below, 1));
        assert!(rule.releases(below + 1, 1));
        // Over two days each owner may send twice as many.
        assert!(!rule.releases(below + 1, 2));
    }

    #[test]
    fn floors_hold() {
        assert!(Threshold::new(9).is_err());
        assert_eq!(Threshold::new(10).map(Threshold::get), Ok(10));
        assert!(ReportsPerContributor::for_servers(23).is_err());
        assert!(ReportsPerContributor::for_servers(48).is_ok());
        assert!(ReportsPerContributor::for_agent(0).is_err());
        assert!(ReportsPerContributor::for_agent(25).is_err());
        assert!(ReportsPerContributor::for_agent(3).is_ok());
        assert!(check_key_bits(1024).is_err());
        assert!(check_key_bits(2048).is_ok());
    }

    /// Both are plain numbers in JSON, and read back through the same floors.
    #[test]
    fn policy_values_read_back_as_written_and_through_the_floors() {
        let k = Threshold::new(12).unwrap();
        let t = ReportsPerContributor::for_servers(48).unwrap();
        assert_eq!(serde_json::to_string(&(k, t)).unwrap(), "[12,48]");
        let back: (Threshold, ReportsPerContributor) = serde_json::from_str("[12,48]").unwrap();
        assert_eq!(back, (k, t));
        assert!(serde_json::from_str::<Threshold>("9").is_err());
        assert!(serde_json::from_str::<ReportsPerContributor>("23").is_err());
    }

    #[test]
    fn contributor_bound_is_the_ceiling() {
        let t = ReportsPerContributor::DEFAULT;
        assert_eq!(contributors_at_least(0, 1, t), 0);
        assert_eq!(contributors_at_least(1, 1, t), 1);
        assert_eq!(contributors_at_least(24, 1, t), 1);
        assert_eq!(contributors_at_least(25, 1, t), 2);
        assert_eq!(contributors_at_least(240, 1, t), 10);
        assert_eq!(contributors_at_least(240, 2, t), 5);
        assert!(releasable(217, 1, Threshold::DEFAULT, t));
        assert!(!releasable(216, 1, Threshold::DEFAULT, t));
    }

    #[test]
    fn days_within_tolerance() {
        assert!(day_acceptable(Day(100), Day(101)));
        assert!(day_acceptable(Day(102), Day(101)));
        assert!(!day_acceptable(Day(99), Day(101)));
        assert!(!day_acceptable(Day(103), Day(101)));
    }
}
