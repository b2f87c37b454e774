//! Durations as the configuration file writes them: a number of seconds, fractions allowed.
//! They are checked when the file is read (finite, in range), so that the daemon holds
//! [`Duration`]s and converts nothing: a value out of range is refused with its key and line
//! like any other bad value.

use std::fmt;
use std::time::Duration;

use serde::Deserialize;

/// Longest duration a setting may hold: about 31 years, far beyond any useful wait, and well
/// inside what [`Duration`] and the timers it feeds can represent.
const MAX_SECONDS: f64 = 1e9;

/// A duration above zero (a timeout, a period, an age).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Deserialize)]
#[serde(try_from = "f64")]
pub struct Seconds(pub(super) Duration);

/// A duration that may be zero, where zero means "none" (no delay, no minimum gap, no
/// pause between replayed windows).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Deserialize)]
#[serde(try_from = "f64")]
pub struct SecondsOrZero(Duration);

impl Seconds {
    /// A default written in the source (not read from a file): `v` must be in range.
    pub(super) fn secs(v: f64) -> Self {
        Self(Duration::from_secs_f64(v))
    }

    /// The duration.
    pub fn get(self) -> Duration {
        self.0
    }
}

impl SecondsOrZero {
    /// A default written in the source (not read from a file): `v` must be in range.
    pub(super) fn secs(v: f64) -> Self {
        Self(Duration::from_secs_f64(v))
    }

    /// The duration.
    pub fn get(self) -> Duration {
        self.0
    }
}

/// Why a number is not a duration; the message the configuration error carries.
fn refuse(v: f64, zero_ok: bool) -> String {
    let floor = if zero_ok { "at least 0" } else { "above 0" };
    format!("{v} is not a duration in seconds (must be {floor} and finite)")
}

fn duration(v: f64, zero_ok: bool) -> Result<Duration, String> {
    let ok = v.is_finite() && (v > 0.0 || (zero_ok && v == 0.0)) && v < MAX_SECONDS;
    if ok {
        Duration::try_from_secs_f64(v).map_err(|_| refuse(v, zero_ok))
    } else {
        Err(refuse(v, zero_ok))
    }
}

impl TryFrom<f64> for Seconds {
    type Error = String;

    fn try_from(v: f64) -> Result<Self, String> {
        duration(v, false).map(Self)
    }
}

impl TryFrom<f64> for SecondsOrZero {
    type Error = String;

    fn try_from(v: f64) -> Result<Self, String> {
        duration(v, true).map(Self)
    }
}

impl fmt::Display for Seconds {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} s", self.0.as_secs_f64())
    }
}

impl fmt::Display for SecondsOrZero {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} s", self.0.as_secs_f64())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_is_a_duration_only_where_it_means_none() {
        assert!(Seconds::try_from(0.0).is_err());
        assert_eq!(
            SecondsOrZero::try_from(0.0),
            Ok(SecondsOrZero(Duration::ZERO))
        );
        assert_eq!(
            Seconds::try_from(0.25).map(Seconds::get),
            Ok(Duration::from_millis(250))
        );
    }

    #[test]
    fn negative_infinite_and_huge_values_are_refused_with_the_value() {
        for v in [-1.0, f64::NAN, f64::INFINITY, 2e9] {
            let e = SecondsOrZero::try_from(v).unwrap_err();
            assert!(e.contains("is not a duration in seconds"), "{e}");
            assert!(Seconds::try_from(v).is_err(), "{v}");
        }
    }
}
