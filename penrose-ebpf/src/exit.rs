//! Process exit: tells the agent to close a process's state (names, open snippet).

use aya_ebpf::{
    bindings::BPF_RB_NO_WAKEUP,
    helpers::{bpf_get_current_pid_tgid, bpf_ktime_get_ns},
    macros::tracepoint,
    programs::TracePointContext,
};
use penrose_ebpf_common::{EventKind, ExitEvent};

use crate::maps::{EVENTS, count_drop};

/// `sched:sched_process_exit` fires once per exiting thread; only the thread group leader's
/// exit (pid == tgid) is reported, once per process. A leader that leaves early through
/// `pthread_exit` is reported then, while its other threads may still run.
#[tracepoint(category = "sched", name = "sched_process_exit")]
pub fn sched_process_exit(_ctx: TracePointContext) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    if tgid != pid_tgid as u32 {
        return 0;
    }
    let Some(mut slot) = EVENTS.reserve::<ExitEvent>(0) else {
        count_drop();
        return 0;
    };
    slot.write(ExitEvent {
        kind: EventKind::Exit as u32,
        pid: tgid,
        // SAFETY: `bpf_ktime_get_ns` has no preconditions.
        timestamp_ns: unsafe { bpf_ktime_get_ns() },
    });
    slot.submit(u64::from(BPF_RB_NO_WAKEUP));
    0
}
