//! The 1-in-S countdown: BPF marks sampled launches so user space need not count them.

use crate::maps::{SAMPLE_CONFIG, SAMPLE_COUNTDOWN};

/// Counts one launch on this CPU; true when it is the one in `period` to sample.
///
/// A countdown of 0 (fresh map, or the agent reset it) reloads from the period, so a new
/// period takes effect at the next reload; the agent seeds random offsets by writing the
/// countdown directly.
#[inline(always)]
pub(crate) fn tick() -> bool {
    let period = match SAMPLE_CONFIG.get(0) {
        Some(config) if config.period != 0 => config.period,
        _ => return false,
    };
    let Some(countdown) = SAMPLE_COUNTDOWN.get_ptr_mut(0) else {
        return false;
    };
    // SAFETY: the pointer comes from a per-CPU array lookup, so it is valid and only this CPU
    // touches it while the program runs (BPF programs do not migrate mid-run).
    let left = unsafe { &mut *countdown };
    if *left <= 1 {
        *left = period;
        true
    } else {
        *left -= 1;
        false
    }
}
