//! Launch entry points: decode each one's arguments, then queue one [`LaunchEvent`].

use aya_ebpf::{
    bindings::BPF_RB_NO_WAKEUP,
    helpers::{bpf_get_current_pid_tgid, bpf_ktime_get_ns, bpf_probe_read_user},
    macros::uprobe,
    programs::ProbeContext,
};
use aya_log_ebpf::debug;
use penrose_ebpf_common::{EntryPoint, EventKind, GraphKey, LaunchEvent};

use crate::{
    maps::{EVENTS, GRAPH_KERNELS, count_drop},
    sampling,
};

/// What a launch entry point passes, already decoded from registers, stack or config.
struct LaunchArgs {
    function: u64,
    grid: [u32; 3],
    block: [u32; 3],
    shared_mem_bytes: u32,
    stream: u64,
    caller: u64,
}

/// The top of the stack at `cuLaunchKernel`'s (and `cuLaunchCooperativeKernel`'s) entry, as the
/// System V x86-64 ABI leaves it: the return address into the caller, then the seventh to
/// ninth arguments, one 8-byte slot each.
#[repr(C)]
struct StackArgs {
    return_address: u64,
    block_z: u64,
    shared_mem_bytes: u64,
    stream: u64,
}

/// The leading fields of CUDA's `CUlaunchConfig` (cuda.h, CUDA 11.8 and later): seven
/// `unsigned int`s, padding to 8, then `CUstream hStream` at offset 32. The attribute list
/// that follows is not read.
#[repr(C)]
struct LaunchConfigHead {
    grid: [u32; 3],
    block: [u32; 3],
    shared_mem_bytes: u32,
    stream: u64,
}

const _: () = assert!(core::mem::offset_of!(LaunchConfigHead, stream) == 32);
const _: () = assert!(core::mem::size_of::<LaunchConfigHead>() == 40);

/// `cuLaunchKernel(f, gridX, gridY, gridZ, blockX, blockY, blockZ, sharedMem, stream, ...)`.
#[uprobe]
pub fn cu_launch_kernel(ctx: ProbeContext) -> u32 {
    on_launch(
        &ctx,
        EntryPoint::LaunchKernel,
        read_launch_kernel_args(&ctx),
    )
}

/// `cuLaunchKernel_ptsz`: the same arguments, on the per-thread default stream.
#[uprobe]
pub fn cu_launch_kernel_ptsz(ctx: ProbeContext) -> u32 {
    on_launch(
        &ctx,
        EntryPoint::LaunchKernelPtsz,
        read_launch_kernel_args(&ctx),
    )
}

/// `cuLaunchKernelEx(const CUlaunchConfig* config, CUfunction f, void** params, void** extra)`.
#[uprobe]
pub fn cu_launch_kernel_ex(ctx: ProbeContext) -> u32 {
    on_launch(
        &ctx,
        EntryPoint::LaunchKernelEx,
        read_launch_kernel_ex_args(&ctx),
    )
}

/// `cuLaunchKernelEx_ptsz`: the same arguments, on the per-thread default stream.
#[uprobe]
pub fn cu_launch_kernel_ex_ptsz(ctx: ProbeContext) -> u32 {
    on_launch(
        &ctx,
        EntryPoint::LaunchKernelExPtsz,
        read_launch_kernel_ex_args(&ctx),
    )
}

/// `cuLaunchCooperativeKernel(f, gridX, gridY, gridZ, blockX, blockY, blockZ, sharedMem,
/// stream, kernelParams)`: the first nine arguments are `cuLaunchKernel`'s.
#[uprobe]
pub fn cu_launch_cooperative_kernel(ctx: ProbeContext) -> u32 {
    on_launch(
        &ctx,
        EntryPoint::LaunchCooperativeKernel,
        read_launch_kernel_args(&ctx),
    )
}

/// `cuLaunchCooperativeKernel_ptsz`.
#[uprobe]
pub fn cu_launch_cooperative_kernel_ptsz(ctx: ProbeContext) -> u32 {
    on_launch(
        &ctx,
        EntryPoint::LaunchCooperativeKernelPtsz,
        read_launch_kernel_args(&ctx),
    )
}

/// `cuGraphLaunch(CUgraphExec hGraphExec, CUstream hStream)`: one event for the whole graph,
/// which the agent expands into the graph's kernels when it saw the graph built.
#[uprobe]
pub fn cu_graph_launch(ctx: ProbeContext) -> u32 {
    on_graph_launch(&ctx, EntryPoint::GraphLaunch)
}

/// `cuGraphLaunch_ptsz`.
#[uprobe]
pub fn cu_graph_launch_ptsz(ctx: ProbeContext) -> u32 {
    on_graph_launch(&ctx, EntryPoint::GraphLaunchPtsz)
}

#[inline(always)]
fn on_launch(ctx: &ProbeContext, entry: EntryPoint, args: Option<LaunchArgs>) -> u32 {
    match args {
        Some(args) => submit(entry, &args, || u32::from(sampling::tick())),
        None => debug!(ctx, "penrose: unreadable launch arguments"),
    }
    0
}

/// A graph launch: the countdown counts the kernels the agent says the graph runs (one when
/// it does not know the graph).
#[inline(always)]
fn on_graph_launch(ctx: &ProbeContext, entry: EntryPoint) -> u32 {
    match read_graph_launch_args(ctx) {
        Some(args) => {
            let key = GraphKey {
                pid: (bpf_get_current_pid_tgid() >> 32) as u32,
                reserved: 0,
                exec: args.function,
            };
            // SAFETY: the value is copied out at once; the agent may update it concurrently,
            // and a torn read of one `u32` is not possible.
            let kernels = unsafe { GRAPH_KERNELS.get(&key) }.copied().unwrap_or(1);
            submit(entry, &args, || sampling::tick_graph(u64::from(kernels)))
        }
        None => debug!(ctx, "penrose: unreadable graph launch arguments"),
    }
    0
}

/// Where the launch was called from: the return address at the top of the stack at entry. The
/// agent maps it to the object that made the call, whose build id identifies launches that no
/// name reaches (a stripped library with the runtime linked in). Zero when unreadable.
#[inline(always)]
fn return_address(ctx: &ProbeContext) -> u64 {
    // SAFETY: `regs` is the probe's own register snapshot, valid for the whole program run.
    let rsp = unsafe { (*ctx.regs).rsp };
    // SAFETY: `bpf_probe_read_user` checks the user address and fails instead of faulting.
    unsafe { bpf_probe_read_user(rsp as *const u64) }.unwrap_or(0)
}

/// Six arguments from registers, the return address and three arguments from the stack in
/// one read.
#[inline(always)]
fn read_launch_kernel_args(ctx: &ProbeContext) -> Option<LaunchArgs> {
    let reg = |n| ctx.arg::<u64>(n);
    // SAFETY: `regs` is the probe's own register snapshot, valid for the whole program run.
    let rsp = unsafe { (*ctx.regs).rsp };
    // At function entry the return address is at `rsp`; the stack arguments follow it.
    let stack = rsp as *const StackArgs;
    // SAFETY: `bpf_probe_read_user` checks the user address and fails instead of faulting.
    let stack = unsafe { bpf_probe_read_user(stack) }.ok()?;
    Some(LaunchArgs {
        function: reg(0)?,
        grid: [reg(1)? as u32, reg(2)? as u32, reg(3)? as u32],
        block: [reg(4)? as u32, reg(5)? as u32, stack.block_z as u32],
        shared_mem_bytes: stack.shared_mem_bytes as u32,
        stream: stack.stream,
        caller: stack.return_address,
    })
}

/// The function from a register, everything else from the caller's `CUlaunchConfig`.
#[inline(always)]
fn read_launch_kernel_ex_args(ctx: &ProbeContext) -> Option<LaunchArgs> {
    let config = ctx.arg::<u64>(0)? as *const LaunchConfigHead;
    // SAFETY: `bpf_probe_read_user` checks the user address and fails instead of faulting.
    let config = unsafe { bpf_probe_read_user(config) }.ok()?;
    Some(LaunchArgs {
        function: ctx.arg::<u64>(1)?,
        grid: config.grid,
        block: config.block,
        shared_mem_bytes: config.shared_mem_bytes,
        stream: config.stream,
        caller: return_address(ctx),
    })
}

/// A graph has no single grid: the graph handle stands in for the function.
#[inline(always)]
fn read_graph_launch_args(ctx: &ProbeContext) -> Option<LaunchArgs> {
    Some(LaunchArgs {
        function: ctx.arg::<u64>(0)?,
        grid: [0; 3],
        block: [0; 3],
        shared_mem_bytes: 0,
        stream: ctx.arg::<u64>(1)?,
        caller: return_address(ctx),
    })
}

/// Stamps, samples and queues one launch; a full ring buffer counts a drop instead.
#[inline(always)]
fn submit(entry: EntryPoint, args: &LaunchArgs, sampled: impl FnOnce() -> u32) {
    let Some(mut slot) = EVENTS.reserve::<LaunchEvent>(0) else {
        count_drop();
        return;
    };
    let pid_tgid = bpf_get_current_pid_tgid();
    slot.write(LaunchEvent {
        kind: EventKind::Launch as u32,
        pid: (pid_tgid >> 32) as u32,
        tid: pid_tgid as u32,
        sampled: sampled(),
        // SAFETY: `bpf_ktime_get_ns` has no preconditions.
        timestamp_ns: unsafe { bpf_ktime_get_ns() },
        function: args.function,
        stream: args.stream,
        grid: args.grid,
        block: args.block,
        shared_mem_bytes: args.shared_mem_bytes,
        entry_point: entry as u32,
        caller: args.caller,
    });
    slot.submit(u64::from(BPF_RB_NO_WAKEUP));
}
