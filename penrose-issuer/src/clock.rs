//! The issuer's clock: the day decides which keys are published and issued (token epochs are
//! days) and which counts are pruned; the second decides the request rate. Injected, so that
//! tests can move time; production uses [`SystemClock`].

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use penrose_core::wire::Day;

/// Seconds in a day.
pub const SECONDS_PER_DAY: u64 = 86_400;

/// Where the issuer reads the time.
pub trait Clock: Send + Sync + 'static {
    /// Seconds since the Unix epoch.
    fn now(&self) -> u64;

    /// Days since the Unix epoch (the token epoch of today).
    fn today(&self) -> Day {
        day_of(self.now())
    }
}

/// The day of a time in seconds since the Unix epoch.
pub fn day_of(seconds: u64) -> Day {
    Day(u32::try_from(seconds / SECONDS_PER_DAY).unwrap_or(u32::MAX))
}

/// The system's clock.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0)
    }
}

/// A clock that stands still until told to move (tests, benchmarks).
#[derive(Debug, Default)]
pub struct ManualClock(AtomicU64);

impl ManualClock {
    /// A clock at `seconds` since the Unix epoch.
    pub fn at(seconds: u64) -> Self {
        ManualClock(AtomicU64::new(seconds))
    }

    /// A clock at noon of `day`.
    pub fn at_day(day: Day) -> Self {
        Self::at(u64::from(day.0) * SECONDS_PER_DAY + SECONDS_PER_DAY / 2)
    }

    /// Moves the clock to `seconds`.
    pub fn set(&self, seconds: u64) {
        self.0.store(seconds, Ordering::SeqCst);
    }

    /// Moves the clock forward by `seconds`.
    pub fn advance(&self, seconds: u64) {
        self.0.fetch_add(seconds, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }
}

impl<C: Clock> Clock for std::sync::Arc<C> {
    fn now(&self) -> u64 {
        C::now(self)
    }
}

/// A day as `YYYY-MM-DD` (proleptic Gregorian, UTC).
pub fn date_of(day: Day) -> String {
    // Howard Hinnant's civil_from_days.
    let z = i64::from(day.0) + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}")
}

/// The day of a `YYYY-MM-DD` date; `None` for anything else or a date before 1970.
pub fn day_of_date(text: &str) -> Option<Day> {
    let mut parts = text.split('-');
    let (y, m, d) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() || y.len() != 4 || m.len() != 2 || d.len() != 2 {
        return None;
    }
    let (y, m, d): (i64, i64, i64) = (y.parse().ok()?, m.parse().ok()?, d.parse().ok()?);
    if !(1..=12).contains(&m) || !(1..=31).contains(&d) {
        return None;
    }
    // Howard Hinnant's days_from_civil.
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = if m > 2 { m - 3 } else { m + 9 };
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let day = Day(u32::try_from(days).ok()?);
    // Refuse dates that do not exist (2026-02-30) rather than roll them over.
    (date_of(day) == text).then_some(day)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_round_trip_and_impossible_ones_are_refused() {
        assert_eq!(date_of(Day(0)), "1970-01-01");
        assert_eq!(date_of(Day(20_423)), "2025-12-01");
        for day in [0, 59, 60, 365, 11_016, 20_423, 20_513, 40_000] {
            assert_eq!(day_of_date(&date_of(Day(day))), Some(Day(day)));
        }
        for bad in [
            "2026-02-30",
            "2026-13-01",
            "1969-12-31",
            "2026-1-01",
            "x",
            "2026-01-01-1",
        ] {
            assert_eq!(day_of_date(bad), None, "{bad}");
        }
        let clock = ManualClock::at_day(Day(20_000));
        assert_eq!(clock.today(), Day(20_000));
        clock.advance(SECONDS_PER_DAY);
        assert_eq!(clock.today(), Day(20_001));
    }
}
