//! Start-up calibration: what one probed launch costs on this machine.
//!
//! The overhead budget is a share of the probed processes' CPU time, so the scheduler needs
//! the cost of one probe hit: the uprobe trap (an int3, a context switch into the kernel and
//! back; about 10 us on this project's VM, about 1 us on bare metal) plus the BPF program's
//! run time. Neither is known in advance, so the agent measures both when it starts: it attaches
//! the real `cuLaunchKernel` program, for its own process only, to [`calibration_target`] (a
//! function of the agent with `cuLaunchKernel`'s signature), calls it with and without the
//! probe, and reads the kernel's BPF run-time statistics for the probed calls.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use super::error::CaptureError;
use super::loader::{self, Probes};

/// Calls per measured round; a round's events fit the ring buffer with room to spare.
const CALLS_PER_ROUND: u32 = 2_000;
/// Rounds per measurement; the median round is kept (these machines are noisy).
const ROUNDS: usize = 5;

/// The measured cost of one probed launch: the type lives in [`penrose_core::schedule`] with
/// the scheduler that consumes it.
pub use penrose_core::schedule::ProbeCost;

/// The function the calibration probe attaches to. Its signature is `cuLaunchKernel`'s, so the
/// launch program reads registers and stack slots exactly as it does on a driver.
#[inline(never)]
#[allow(clippy::too_many_arguments)]
pub extern "C" fn calibration_target(
    function: u64,
    grid_x: u32,
    grid_y: u32,
    grid_z: u32,
    block_x: u32,
    block_y: u32,
    block_z: u32,
    shared_mem_bytes: u32,
    stream: u64,
    params: u64,
    extra: u64,
) -> u32 {
    let sum = function
        ^ u64::from(grid_x ^ grid_y ^ grid_z ^ block_x ^ block_y ^ block_z ^ shared_mem_bytes)
        ^ stream
        ^ params
        ^ extra;
    std::hint::black_box(sum) as u32
}

/// Where [`calibration_target`] lives as a file offset in its mapped file: uprobes attach by
/// file and offset, and this avoids relying on a symbol table a packager may strip.
fn target_location() -> Result<(PathBuf, u64), CaptureError> {
    let address = calibration_target as *const () as usize as u64;
    let maps = std::fs::read_to_string("/proc/self/maps")
        .map_err(|e| CaptureError::Calibration(format!("reading /proc/self/maps: {e}")))?;
    for line in maps.lines() {
        let mut fields = line.split_whitespace();
        let (Some(range), Some(perms), Some(offset), _, _, Some(path)) = (
            fields.next(),
            fields.next(),
            fields.next(),
            fields.next(),
            fields.next(),
            fields.next(),
        ) else {
            continue;
        };
        let Some((start, end)) = range.split_once('-') else {
            continue;
        };
        let (Ok(start), Ok(end), Ok(offset)) = (
            u64::from_str_radix(start, 16),
            u64::from_str_radix(end, 16),
            u64::from_str_radix(offset, 16),
        ) else {
            continue;
        };
        if perms.contains('x') && (start..end).contains(&address) {
            return Ok((PathBuf::from(path), address - start + offset));
        }
    }
    Err(CaptureError::Calibration(format!(
        "no executable mapping holds the calibration target at {address:#x}"
    )))
}

/// One round: the mean time per call over `CALLS_PER_ROUND` calls.
fn round() -> Duration {
    let started = Instant::now();
    for i in 0..CALLS_PER_ROUND {
        std::hint::black_box(calibration_target(
            std::hint::black_box(u64::from(i)),
            1,
            1,
            1,
            128,
            1,
            1,
            0,
            0,
            0,
            0,
        ));
    }
    started.elapsed() / CALLS_PER_ROUND
}

fn median(mut rounds: Vec<Duration>) -> Duration {
    rounds.sort();
    rounds[rounds.len() / 2]
}

/// Measures the probe cost. `drain` is called after every probed round to read and discard
/// the calibration's own launch records, so they neither fill the ring nor reach a window.
pub fn calibrate(probes: &mut Probes, mut drain: impl FnMut()) -> Result<ProbeCost, CaptureError> {
    let (path, offset) = target_location()?;
    let unprobed = median((0..ROUNDS).map(|_| round()).collect());
    let stats = loader::enable_run_stats().ok();
    let before = bpf_totals(probes);
    let link = probes.attach_calibration(&path, offset)?;
    let mut probed_rounds = Vec::with_capacity(ROUNDS);
    for _ in 0..ROUNDS {
        probed_rounds.push(round());
        drain();
    }
    let after = bpf_totals(probes);
    probes.detach_calibration(link)?;
    drop(stats);
    drain();
    let probed = median(probed_rounds);
    let bpf_run = match (before, after) {
        (Some((runs0, time0)), Some((runs1, time1))) if runs1 > runs0 => {
            Some((time1.saturating_sub(time0)) / u32::try_from(runs1 - runs0).unwrap_or(u32::MAX))
        }
        _ => None,
    };
    Ok(ProbeCost {
        per_launch: probed.saturating_sub(unprobed),
        bpf_run,
        unprobed_call: unprobed,
        probed_call: probed,
    })
}

fn bpf_totals(probes: &Probes) -> Option<(u64, Duration)> {
    let program = penrose_ebpf_common::programs::CU_LAUNCH_KERNEL;
    probes
        .run_stats()
        .into_iter()
        .find(|p| p.program == program)
        .map(|p| (p.runs, p.run_time))
}
