//! The clock every tier reads. The day is the only time a report carries, the epoch of a
//! token and of a key, and what decides pruning; the second decides rates. Code that decides
//! by the time takes a [`Clock`], so that tests can move time ([`ManualClock`]); production
//! uses [`SystemClock`], and code with nothing to inject calls [`today`].

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use penrose_core::wire::Day;

/// Seconds in a day.
pub const SECONDS_PER_DAY: u64 = 86_400;

/// Where a server or the agent reads the time.
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

/// Today by the system clock: the day of [`SystemClock`].
pub fn today() -> Day {
    SystemClock.today()
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

impl<C: Clock + ?Sized> Clock for std::sync::Arc<C> {
    fn now(&self) -> u64 {
        C::now(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_system_clock_reads_a_day_after_this_code_was_written() {
        // 2026-12-01 is day 20,788: a clock that reads 0 (a failed read) cannot pass.
        assert!(today().0 >= 20_788, "{:?}", today());
        assert_eq!(day_of(SystemClock.now()), today());
    }

    #[test]
    fn the_manual_clock_moves_by_days() {
        let clock = ManualClock::at_day(Day(20_000));
        assert_eq!(clock.today(), Day(20_000));
        clock.advance(SECONDS_PER_DAY);
        assert_eq!(clock.today(), Day(20_001));
    }
}
