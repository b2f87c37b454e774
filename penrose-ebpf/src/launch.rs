//! Launch entry points: decode each one's arguments, then queue one [`LaunchEvent`].

use aya_ebpf::{
    bindings::BPF_RB_NO_WAKEUP,
    helpers::{bpf_get_current_pid_tgid, bpf_ktime_get_ns, bpf_probe_read_user},
    macros::uprobe,
    programs::ProbeContext,
};
use aya_log_ebpf::debug;
use penrose_ebpf_common::{EntryPoint, EventKind, LaunchEvent};

use crate::{
    maps::{DROPS, EVENTS},
    sampling,
};

/// What a launch entry point passes, already decoded from registers and stack.
struct LaunchArgs {
    function: u64,
    grid: [u32; 3],
    block: [u32; 3],
    shared_mem_bytes: u32,
    stream: u64,
}

/// The seventh to ninth arguments of `cuLaunchKernel` as the System V x86-64 ABI leaves them
/// on the stack: one 8-byte slot each, starting just above the return address.
#[repr(C)]
struct StackArgs {
    block_z: u64,
    shared_mem_bytes: u64,
    stream: u64,
}

/// `cuLaunchKernel(f, gridX, gridY, gridZ, blockX, blockY, blockZ, sharedMem, stream, ...)`.
#[uprobe]
pub fn cu_launch_kernel(ctx: ProbeContext) -> u32 {
    on_launch_kernel(&ctx, EntryPoint::LaunchKernel)
}

/// `cuLaunchKernel_ptsz`: the same arguments, on the per-thread default stream.
#[uprobe]
pub fn cu_launch_kernel_ptsz(ctx: ProbeContext) -> u32 {
    on_launch_kernel(&ctx, EntryPoint::LaunchKernelPtsz)
}

#[inline(always)]
fn on_launch_kernel(ctx: &ProbeContext, entry: EntryPoint) -> u32 {
    match read_launch_kernel_args(ctx) {
        Some(args) => submit(entry, &args),
        None => debug!(ctx, "penrose: unreadable launch arguments"),
    }
    0
}

/// Six arguments from registers, three from the stack in one read.
#[inline(always)]
fn read_launch_kernel_args(ctx: &ProbeContext) -> Option<LaunchArgs> {
    let reg = |n| ctx.arg::<u64>(n);
    // SAFETY: `regs` is the probe's own register snapshot, valid for the whole program run.
    let rsp = unsafe { (*ctx.regs).rsp };
    // At function entry the return address is at `rsp`; the stack arguments follow it.
    let stack = (rsp + 8) as *const StackArgs;
    // SAFETY: `bpf_probe_read_user` checks the user address and fails instead of faulting.
    let stack = unsafe { bpf_probe_read_user(stack) }.ok()?;
    Some(LaunchArgs {
        function: reg(0)?,
        grid: [reg(1)? as u32, reg(2)? as u32, reg(3)? as u32],
        block: [reg(4)? as u32, reg(5)? as u32, stack.block_z as u32],
        shared_mem_bytes: stack.shared_mem_bytes as u32,
        stream: stack.stream,
    })
}

/// Stamps, samples and queues one launch; a full ring buffer counts a drop instead.
#[inline(always)]
fn submit(entry: EntryPoint, args: &LaunchArgs) {
    let Some(mut slot) = EVENTS.reserve::<LaunchEvent>(0) else {
        count_drop();
        return;
    };
    let pid_tgid = bpf_get_current_pid_tgid();
    slot.write(LaunchEvent {
        kind: EventKind::Launch as u32,
        pid: (pid_tgid >> 32) as u32,
        tid: pid_tgid as u32,
        sampled: u32::from(sampling::tick()),
        // SAFETY: `bpf_ktime_get_ns` has no preconditions.
        timestamp_ns: unsafe { bpf_ktime_get_ns() },
        function: args.function,
        stream: args.stream,
        grid: args.grid,
        block: args.block,
        shared_mem_bytes: args.shared_mem_bytes,
        entry_point: entry as u32,
    });
    slot.submit(u64::from(BPF_RB_NO_WAKEUP));
}

#[inline(always)]
fn count_drop() {
    if let Some(drops) = DROPS.get_ptr_mut(0) {
        // SAFETY: a per-CPU array slot, touched only by this CPU while the program runs.
        unsafe { *drops += 1 };
    }
}
