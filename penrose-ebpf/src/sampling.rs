//! The 1-in-S countdown: BPF marks sampled launches so user space need not count them.
//!
//! Launches fall into blocks of S, and each block's sample sits at a position drawn afresh
//! (`penrose_core::sampling`, which mirrors this and says why). Each CPU's word holds, low
//! half, the countdown plus one (the launch that finds 1 or less is sampled) and, high half,
//! the launches of that sample's block that follow it.

use aya_ebpf::helpers::bpf_get_prandom_u32;

use crate::maps::{SAMPLE_CONFIG, SAMPLE_COUNTDOWN};

const LOW: u64 = 0xffff_ffff;

/// The word after a sample with `tail` launches left in its block: the next block's position
/// drawn uniformly from 0 to `period` - 1.
#[inline(always)]
fn next_block(tail: u64, period: u64) -> u64 {
    // SAFETY: a BPF helper without arguments or memory access; it returns a pseudo-random u32.
    let q = u64::from(unsafe { bpf_get_prandom_u32() }) % period;
    let left = (tail + q + 1).min(LOW);
    ((period - 1 - q) << 32) | left
}

/// Counts one launch on this CPU; true when it is its block's sampled one.
///
/// A word of 0 (fresh map, or the agent reset it) samples at once and draws the next block,
/// so a new period takes effect at the next sample; the agent seeds the word directly.
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
    let word = unsafe { &mut *countdown };
    if *word & LOW <= 1 {
        *word = next_block(*word >> 32, period);
        true
    } else {
        *word -= 1;
        false
    }
}

/// Counts the `kernels` launches of one graph launch on this CPU; 0 when none of them is the
/// one to sample, else one more than the position of the first that is. A graph launch carries
/// at most one sample: when the next block's sample would fall within the same graph launch,
/// it is skipped and a block starts at the launch's end.
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
    let word = unsafe { &mut *countdown };
    let kernels = kernels.max(1);
    let due = (*word & LOW).max(1);
    if due <= kernels {
        let after = kernels - due;
        let next = next_block(*word >> 32, period);
        *word = if next & LOW > after {
            next - after
        } else {
            next_block(0, period)
        };
        due as u32
    } else {
        *word -= kernels;
        0
    }
}
