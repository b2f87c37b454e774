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

/// Counts the `kernels` launches of one graph launch on this CPU; 0 when none of them is the
/// one to sample, else one more than the position of the first that is. A graph launch carries
/// at most one sample: when a graph holds more than S kernels, the later ones the countdown
/// would have sampled are skipped, and the countdown keeps its phase.
#[inline(always)]
pub(crate) fn tick_graph(kernels: u64) -> u32 {
    let period = match SAMPLE_CONFIG.get(0) {
        Some(config) if config.period != 0 => config.period,
        _ => return 0,
    };
    let Some(countdown) = SAMPLE_COUNTDOWN.get_ptr_mut(0) else {
        return 0;
    };
    // SAFETY: as in `tick`: a per-CPU array slot, only this CPU touches it during the run.
    let left = unsafe { &mut *countdown };
    let kernels = kernels.max(1);
    let due = (*left).max(1);
    if due <= kernels {
        let after = kernels - due;
        *left = period - after % period;
        due as u32
    } else {
        *left = due - kernels;
        0
    }
}
