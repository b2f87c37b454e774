//! Device attribution: probes on the driver calls that decide which GPU a thread's launches
//! run on. A launch runs in its thread's current context, and a context lives on one device;
//! these probes report context changes (set, push, pop), context creation with its device
//! ordinal, stream creation (a stream belongs to the context current at its creation) and the
//! UUID the driver gives an ordinal. The agent keeps the per-process state; nothing here runs
//! per launch, and the calls are rare (start-up, device switches), so the probes stay attached.

use aya_ebpf::{
    bindings::BPF_RB_NO_WAKEUP,
    helpers::{bpf_get_current_pid_tgid, bpf_ktime_get_ns, bpf_probe_read_user},
    macros::{uprobe, uretprobe},
    programs::{ProbeContext, RetProbeContext},
};
use penrose_ebpf_common::{ContextEvent, ContextOp, EventKind};

use crate::maps::{EVENTS, count_drop};
use crate::names::{NameCall, stash, take, take_pending};

/// No device ordinal in the event.
const NO_DEVICE: i32 = -1;

/// Queues one context record.
#[inline(always)]
fn emit(pid_tgid: u64, op: ContextOp, handle: u64, device: i32, uuid: [u8; 16]) {
    let Some(mut slot) = EVENTS.reserve::<ContextEvent>(0) else {
        count_drop();
        return;
    };
    slot.write(ContextEvent {
        kind: EventKind::Context as u32,
        pid: (pid_tgid >> 32) as u32,
        tid: pid_tgid as u32,
        op: op as u32,
        // SAFETY: `bpf_ktime_get_ns` has no preconditions.
        timestamp_ns: unsafe { bpf_ktime_get_ns() },
        handle,
        device,
        reserved: 0,
        uuid,
    });
    slot.submit(u64::from(BPF_RB_NO_WAKEUP));
}

/// An entry-only call whose first argument is the context (or nothing).
#[inline(always)]
fn on_entry(ctx: &ProbeContext, op: ContextOp) -> u32 {
    let handle = ctx.arg::<u64>(0).unwrap_or(0);
    emit(bpf_get_current_pid_tgid(), op, handle, NO_DEVICE, [0; 16]);
    0
}

/// A return whose out-pointer received a handle, with the ordinal the entry stashed.
#[inline(always)]
fn on_handle_return(ctx: &RetProbeContext, call: NameCall, op: ContextOp) -> u32 {
    if let Some(resolved) = take(ctx, call) {
        let device = match op {
            ContextOp::StreamCreated => NO_DEVICE,
            _ => resolved.arg as i32,
        };
        emit(resolved.pid_tgid, op, resolved.handle, device, [0; 16]);
    }
    0
}

/// A return of `cuDeviceGetUuid*`: 16 bytes at the out-pointer, reported as `op` (the two
/// calls answer differently on a MIG instance).
#[inline(always)]
fn on_uuid_return(ctx: &RetProbeContext, call: NameCall, op: ContextOp) -> u32 {
    let Some((pid_tgid, pending)) = take_pending(ctx, call) else {
        return 0;
    };
    // SAFETY: `bpf_probe_read_user` checks the user address and fails instead of faulting.
    let Ok(uuid) = (unsafe { bpf_probe_read_user(pending.out as *const [u8; 16]) }) else {
        return 0;
    };
    emit(pid_tgid, op, 0, pending.arg as i32, uuid);
    0
}

/// `cuCtxSetCurrent(CUcontext ctx)`.
#[uprobe]
pub fn cu_ctx_set_current(ctx: ProbeContext) -> u32 {
    on_entry(&ctx, ContextOp::SetCurrent)
}

/// `cuCtxPushCurrent_v2(CUcontext ctx)`.
#[uprobe]
pub fn cu_ctx_push_current(ctx: ProbeContext) -> u32 {
    on_entry(&ctx, ContextOp::Push)
}

/// `cuCtxPopCurrent_v2(CUcontext* pctx)`: the pointer is not needed, the stack is.
#[uprobe]
pub fn cu_ctx_pop_current(_ctx: ProbeContext) -> u32 {
    emit(
        bpf_get_current_pid_tgid(),
        ContextOp::Pop,
        0,
        NO_DEVICE,
        [0; 16],
    );
    0
}

/// `cuDevicePrimaryCtxRetain(CUcontext* pctx, CUdevice dev)`.
#[uprobe]
pub fn cu_device_primary_ctx_retain(ctx: ProbeContext) -> u32 {
    stash(&ctx, NameCall::PrimaryCtxRetain, 0, 1);
    0
}

/// Return of `cuDevicePrimaryCtxRetain`.
#[uretprobe]
pub fn cu_device_primary_ctx_retain_ret(ctx: RetProbeContext) -> u32 {
    on_handle_return(&ctx, NameCall::PrimaryCtxRetain, ContextOp::PrimaryRetained)
}

/// `cuCtxCreate_v2(CUcontext* pctx, unsigned int flags, CUdevice dev)`.
#[uprobe]
pub fn cu_ctx_create_v2(ctx: ProbeContext) -> u32 {
    stash(&ctx, NameCall::CtxCreateV2, 0, 2);
    0
}

/// Return of `cuCtxCreate_v2`.
#[uretprobe]
pub fn cu_ctx_create_v2_ret(ctx: RetProbeContext) -> u32 {
    on_handle_return(&ctx, NameCall::CtxCreateV2, ContextOp::Created)
}

/// `cuCtxCreate_v3(CUcontext* pctx, CUexecAffinityParam* params, int numParams, unsigned int
/// flags, CUdevice dev)`.
#[uprobe]
pub fn cu_ctx_create_v3(ctx: ProbeContext) -> u32 {
    stash(&ctx, NameCall::CtxCreateV3, 0, 4);
    0
}

/// Return of `cuCtxCreate_v3`.
#[uretprobe]
pub fn cu_ctx_create_v3_ret(ctx: RetProbeContext) -> u32 {
    on_handle_return(&ctx, NameCall::CtxCreateV3, ContextOp::Created)
}

/// `cuCtxCreate_v4(CUcontext* pctx, CUctxCreateParams* params, unsigned int flags, CUdevice
/// dev)` (CUDA 12.5 and later).
#[uprobe]
pub fn cu_ctx_create_v4(ctx: ProbeContext) -> u32 {
    stash(&ctx, NameCall::CtxCreateV4, 0, 3);
    0
}

/// Return of `cuCtxCreate_v4`.
#[uretprobe]
pub fn cu_ctx_create_v4_ret(ctx: RetProbeContext) -> u32 {
    on_handle_return(&ctx, NameCall::CtxCreateV4, ContextOp::Created)
}

/// `cuStreamCreate(CUstream* phStream, unsigned int flags)`.
#[uprobe]
pub fn cu_stream_create(ctx: ProbeContext) -> u32 {
    stash(&ctx, NameCall::StreamCreate, 0, 0);
    0
}

/// Return of `cuStreamCreate`.
#[uretprobe]
pub fn cu_stream_create_ret(ctx: RetProbeContext) -> u32 {
    on_handle_return(&ctx, NameCall::StreamCreate, ContextOp::StreamCreated)
}

/// `cuStreamCreateWithPriority(CUstream* phStream, unsigned int flags, int priority)`.
#[uprobe]
pub fn cu_stream_create_with_priority(ctx: ProbeContext) -> u32 {
    stash(&ctx, NameCall::StreamCreateWithPriority, 0, 0);
    0
}

/// Return of `cuStreamCreateWithPriority`.
#[uretprobe]
pub fn cu_stream_create_with_priority_ret(ctx: RetProbeContext) -> u32 {
    on_handle_return(
        &ctx,
        NameCall::StreamCreateWithPriority,
        ContextOp::StreamCreated,
    )
}

/// `cuDeviceGetUuid(CUuuid* uuid, CUdevice dev)`.
#[uprobe]
pub fn cu_device_get_uuid(ctx: ProbeContext) -> u32 {
    stash(&ctx, NameCall::DeviceGetUuid, 0, 1);
    0
}

/// Return of `cuDeviceGetUuid`.
#[uretprobe]
pub fn cu_device_get_uuid_ret(ctx: RetProbeContext) -> u32 {
    on_uuid_return(&ctx, NameCall::DeviceGetUuid, ContextOp::DeviceUuid)
}

/// `cuDeviceGetUuid_v2(CUuuid* uuid, CUdevice dev)`.
#[uprobe]
pub fn cu_device_get_uuid_v2(ctx: ProbeContext) -> u32 {
    stash(&ctx, NameCall::DeviceGetUuidV2, 0, 1);
    0
}

/// Return of `cuDeviceGetUuid_v2`.
#[uretprobe]
pub fn cu_device_get_uuid_v2_ret(ctx: RetProbeContext) -> u32 {
    on_uuid_return(&ctx, NameCall::DeviceGetUuidV2, ContextOp::DeviceUuidV2)
}
