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

pub use penrose_core::calendar::{date_of, day_of_date};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_manual_clock_moves_by_days() {
        let clock = ManualClock::at_day(Day(20_000));
        assert_eq!(clock.today(), Day(20_000));
        clock.advance(SECONDS_PER_DAY);
        assert_eq!(clock.today(), Day(20_001));
    }
}
