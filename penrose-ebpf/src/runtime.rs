//! The CUDA runtime's side of naming: kernels that nvcc's host stubs register never pass
//! through the driver's public name functions, so the runtime is probed too.
//!
//! - `__cudaRegisterFunction(fatCubinHandle, hostFun, deviceFun, deviceName, ...)` runs once
//!   per kernel at load: the stub's address (`hostFun`) and the kernel's name.
//! - `__cudaGetKernel(&handle, stub)` (CUDA 12.4 and later) runs once per kernel and process
//!   from the stub: the `CUkernel` handle the driver's launch entry points will then receive.
//! - `cudaLaunchKernel(func, ...)` on the legacy path receives the stub itself; the driver
//!   launch that follows on the same thread carries the driver's handle. This probe fires per
//!   launch, so the agent attaches it only inside windows and only while launches stay
//!   unnamed.

use aya_ebpf::{
    bindings::BPF_RB_NO_WAKEUP,
    helpers::{bpf_get_current_pid_tgid, bpf_ktime_get_ns},
    macros::{uprobe, uretprobe},
    programs::{ProbeContext, RetProbeContext},
};
use penrose_ebpf_common::{EventKind, HandleKind, RuntimeLaunchEvent, StubKernelEvent};

use crate::maps::{EVENTS, count_drop};
use crate::names::{NameCall, Resolved, emit_name, stash, take};

/// `__cudaRegisterFunction(void **fatCubinHandle, const char *hostFun, char *deviceFun,
/// const char *deviceName, int thread_limit, uint3 *tid, uint3 *bid, dim3 *bDim, dim3 *gDim,
/// int *wSize)`: names the stub `hostFun` with `deviceName`.
#[uprobe]
pub fn cudart_register_function(ctx: ProbeContext) -> u32 {
    let (Some(stub), Some(name)) = (ctx.arg::<u64>(1), ctx.arg::<u64>(3)) else {
        return 0;
    };
    emit_name(
        HandleKind::Stub,
        &Resolved {
            pid_tgid: bpf_get_current_pid_tgid(),
            handle: stub,
            arg: name,
        },
    );
    0
}

/// `__cudaGetKernel(cudaKernel_t *kernel, const void *entryFuncAddr)`.
#[uprobe]
pub fn cudart_get_kernel(ctx: ProbeContext) -> u32 {
    stash(&ctx, NameCall::GetKernel, 0, 1);
    0
}

/// Return of `__cudaGetKernel`: the stub's `CUkernel`.
#[uretprobe]
pub fn cudart_get_kernel_ret(ctx: RetProbeContext) -> u32 {
    let Some(call) = take(&ctx, NameCall::GetKernel) else {
        return 0;
    };
    let Some(mut slot) = EVENTS.reserve::<StubKernelEvent>(0) else {
        count_drop();
        return 0;
    };
    slot.write(StubKernelEvent {
        kind: EventKind::StubKernel as u32,
        pid: (call.pid_tgid >> 32) as u32,
        tid: call.pid_tgid as u32,
        reserved: 0,
        // SAFETY: `bpf_ktime_get_ns` has no preconditions.
        timestamp_ns: unsafe { bpf_ktime_get_ns() },
        stub: call.arg,
        kernel: call.handle,
    });
    slot.submit(u64::from(BPF_RB_NO_WAKEUP));
    0
}

/// `cudaLaunchKernel(const void *func, dim3 gridDim, dim3 blockDim, void **args,
/// size_t sharedMem, cudaStream_t stream)`: only `func` is read.
#[uprobe]
pub fn cudart_launch_kernel(ctx: ProbeContext) -> u32 {
    on_runtime_launch(&ctx)
}

/// `cudaLaunchKernel_ptsz`: the same arguments.
#[uprobe]
pub fn cudart_launch_kernel_ptsz(ctx: ProbeContext) -> u32 {
    on_runtime_launch(&ctx)
}

#[inline(always)]
fn on_runtime_launch(ctx: &ProbeContext) -> u32 {
    let Some(function) = ctx.arg::<u64>(0) else {
        return 0;
    };
    let pid_tgid = bpf_get_current_pid_tgid();
    let Some(mut slot) = EVENTS.reserve::<RuntimeLaunchEvent>(0) else {
        count_drop();
        return 0;
    };
    slot.write(RuntimeLaunchEvent {
        kind: EventKind::RuntimeLaunch as u32,
        pid: (pid_tgid >> 32) as u32,
        tid: pid_tgid as u32,
        reserved: 0,
        // SAFETY: `bpf_ktime_get_ns` has no preconditions.
        timestamp_ns: unsafe { bpf_ktime_get_ns() },
        function,
    });
    slot.submit(u64::from(BPF_RB_NO_WAKEUP));
    0
}
