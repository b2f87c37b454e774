//! CPU time of the probed processes, read from `/proc/<pid>/stat`.
//!
//! The overhead budget is a share of the CPU time the probed processes use, so each window
//! notes, for every process that launched in it, its user + system time when first seen and
//! when the window closes (or when it exits: after that `/proc` may no longer have it).

use std::collections::HashMap;
use std::time::Duration;

use super::events::Pid;

/// User + system CPU time of process `pid`, or `None` when `/proc` no longer has it.
pub fn process_cpu_time(pid: Pid) -> Option<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{}/stat", pid.0)).ok()?;
    parse_stat(&stat, clock_ticks_per_second())
}

/// Fields 14 and 15 (utime, stime, in clock ticks) of a `/proc/<pid>/stat` line. The command
/// name (field 2) may hold spaces and parentheses, so fields are counted after its last `)`.
pub fn parse_stat(stat: &str, ticks_per_second: u64) -> Option<Duration> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    // After the name: field 3 (state) is the first; utime is field 14, the 12th here.
    let utime: u64 = fields.nth(11)?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    let ticks = utime.checked_add(stime)?;
    Some(Duration::from_nanos(
        ticks.saturating_mul(1_000_000_000) / ticks_per_second.max(1),
    ))
}

fn clock_ticks_per_second() -> u64 {
    // SAFETY: sysconf reads a constant of the running system; no memory is passed.
    #[allow(unsafe_code)]
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    u64::try_from(ticks).unwrap_or(100)
}

/// Per-window CPU readings of the processes seen in it.
#[derive(Debug, Default)]
pub struct CpuTracker {
    readings: HashMap<Pid, (Option<Duration>, Option<Duration>)>,
}

impl CpuTracker {
    /// Forgets the last window's processes.
    pub fn clear(&mut self) {
        self.readings.clear();
    }

    /// Notes `pid`'s CPU time the first time it is seen in the window; true when it was new.
    pub fn watch(&mut self, pid: Pid) -> bool {
        if self.readings.contains_key(&pid) {
            return false;
        }
        let now = process_cpu_time(pid);
        self.readings.insert(pid, (now, now));
        true
    }

    /// The process exits: its last reading is taken now, while `/proc` may still have it.
    pub fn exited(&mut self, pid: Pid) {
        if let Some((_, last)) = self.readings.get_mut(&pid)
            && let Some(now) = process_cpu_time(pid)
        {
            *last = Some(now);
        }
    }

    /// CPU time the window's processes used since each was first seen; `None` when none could
    /// be read.
    pub fn total(&mut self) -> Option<Duration> {
        let mut total = None;
        for (pid, (first, last)) in &mut self.readings {
            if let Some(now) = process_cpu_time(*pid) {
                *last = Some(now);
            }
            if let (Some(first), Some(last)) = (first, last) {
                *total.get_or_insert(Duration::ZERO) += last.saturating_sub(*first);
            }
        }
        total
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_lines_give_user_plus_system_time() {
        // A name with spaces and a parenthesis, utime 250 and stime 50 ticks at 100 Hz.
        let line =
            "4242 (my (odd) name) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 1 0 1 1 1";
        assert_eq!(parse_stat(line, 100), Some(Duration::from_secs(3)));
        assert_eq!(parse_stat("4242 (x) S 1 2", 100), None);
        assert_eq!(parse_stat("no parenthesis", 100), None);
    }

    #[test]
    fn this_process_has_a_cpu_time() {
        let mut spin = 0u64;
        for i in 0..5_000_000u64 {
            spin = spin.wrapping_add(std::hint::black_box(i));
        }
        std::hint::black_box(spin);
        assert!(process_cpu_time(Pid(std::process::id())).is_some());
        assert_eq!(process_cpu_time(Pid(u32::MAX)), None);
    }
}
