//! Name resolution: entry and return probes on the driver functions that hand out function
//! and kernel handles, so the agent can name the handles that launch events carry.
//!
//! The entry probe stashes the caller's out-pointer (and the name pointer or kernel handle)
//! under the thread's id; the return probe, if the call returned `CUDA_SUCCESS`, reads the
//! handle the driver wrote and emits a record. Handles are per process, and so are records.

use aya_ebpf::{
    bindings::BPF_RB_NO_WAKEUP,
    helpers::{
        bpf_get_current_pid_tgid, bpf_ktime_get_ns, bpf_probe_read_user,
        generated::bpf_probe_read_user_str,
    },
    macros::{uprobe, uretprobe},
    programs::{ProbeContext, RetProbeContext},
};
use penrose_ebpf_common::{
    EventKind, HandleKind, KernelFunctionEvent, NAME_CAPACITY, NameEvent, NameHeader,
};

use crate::maps::{EVENTS, NAME_SCRATCH, PENDING_CALLS, count_drop};

/// Which name function a stashed call belongs to; part of the key, so a driver that calls
/// one exported name function from inside another keeps both calls apart.
#[repr(u64)]
#[derive(Clone, Copy)]
pub(crate) enum NameCall {
    ModuleGetFunction = 1,
    LibraryGetKernel = 2,
    KernelGetFunction = 3,
    /// The runtime's `__cudaGetKernel` (see `runtime`).
    GetKernel = 4,
    /// `cuDevicePrimaryCtxRetain` (see `devices`).
    PrimaryCtxRetain = 5,
    /// `cuCtxCreate_v2`.
    CtxCreateV2 = 6,
    /// `cuCtxCreate_v3`.
    CtxCreateV3 = 7,
    /// `cuCtxCreate_v4`.
    CtxCreateV4 = 8,
    /// `cuStreamCreate`.
    StreamCreate = 9,
    /// `cuStreamCreateWithPriority`.
    StreamCreateWithPriority = 10,
    /// `cuDeviceGetUuid`.
    DeviceGetUuid = 11,
    /// `cuDeviceGetUuid_v2`.
    DeviceGetUuidV2 = 12,
    /// `cuStreamEndCapture` (see `graphs`).
    StreamEndCapture = 13,
    /// `cuStreamEndCapture_ptsz`.
    StreamEndCapturePtsz = 14,
    /// `cuGraphAddKernelNode`.
    GraphAddKernelNode = 15,
    /// `cuGraphAddKernelNode_v2`.
    GraphAddKernelNodeV2 = 16,
    /// `cuGraphInstantiateWithFlags`.
    GraphInstantiateWithFlags = 17,
    /// `cuGraphInstantiateWithParams`.
    GraphInstantiateWithParams = 18,
    /// `cuGraphExecUpdate`.
    GraphExecUpdate = 19,
    /// `cuGraphExecUpdate_v2`.
    GraphExecUpdateV2 = 20,
}

/// Key of [`PENDING_CALLS`]: one call in flight per thread and function.
#[repr(C)]
pub(crate) struct PendingKey {
    pid_tgid: u64,
    call: u64,
}

/// What the return probe needs from the entry: where the handle will be written, and the
/// name pointer (or, for `cuKernelGetFunction`, the kernel handle).
#[repr(C)]
pub(crate) struct PendingCall {
    pub(crate) out: u64,
    pub(crate) arg: u64,
}

/// `CUDA_SUCCESS`.
const CUDA_SUCCESS: u32 = 0;

/// `cuModuleGetFunction(CUfunction* hfunc, CUmodule hmod, const char* name)`.
#[uprobe]
pub fn cu_module_get_function(ctx: ProbeContext) -> u32 {
    stash(&ctx, NameCall::ModuleGetFunction, 0, 2);
    0
}

/// Return of `cuModuleGetFunction`: names the new `CUfunction`.
#[uretprobe]
pub fn cu_module_get_function_ret(ctx: RetProbeContext) -> u32 {
    if let Some(call) = take(&ctx, NameCall::ModuleGetFunction) {
        emit_name(HandleKind::Function, &call);
    }
    0
}

/// `cuLibraryGetKernel(CUkernel* pKernel, CUlibrary library, const char* name)`.
#[uprobe]
pub fn cu_library_get_kernel(ctx: ProbeContext) -> u32 {
    stash(&ctx, NameCall::LibraryGetKernel, 0, 2);
    0
}

/// Return of `cuLibraryGetKernel`: names the new `CUkernel`.
#[uretprobe]
pub fn cu_library_get_kernel_ret(ctx: RetProbeContext) -> u32 {
    if let Some(call) = take(&ctx, NameCall::LibraryGetKernel) {
        emit_name(HandleKind::Kernel, &call);
    }
    0
}

/// `cuKernelGetFunction(CUfunction* pFunc, CUkernel kernel)`.
#[uprobe]
pub fn cu_kernel_get_function(ctx: ProbeContext) -> u32 {
    stash(&ctx, NameCall::KernelGetFunction, 0, 1);
    0
}

/// Return of `cuKernelGetFunction`: maps the kernel to the function launches will carry.
#[uretprobe]
pub fn cu_kernel_get_function_ret(ctx: RetProbeContext) -> u32 {
    if let Some(call) = take(&ctx, NameCall::KernelGetFunction) {
        emit_kernel_function(&call);
    }
    0
}

/// A call with its stashed arguments and the handle it produced.
pub(crate) struct Resolved {
    pub(crate) pid_tgid: u64,
    pub(crate) handle: u64,
    pub(crate) arg: u64,
}

#[inline(always)]
pub(crate) fn stash(ctx: &ProbeContext, call: NameCall, out_arg: usize, other_arg: usize) {
    let (Some(out), Some(arg)) = (ctx.arg::<u64>(out_arg), ctx.arg::<u64>(other_arg)) else {
        return;
    };
    let key = PendingKey {
        pid_tgid: bpf_get_current_pid_tgid(),
        call: call as u64,
    };
    // A full map evicts the oldest entry (LRU); nothing to count here.
    let _ = PENDING_CALLS.insert(&key, &PendingCall { out, arg }, 0);
}

/// Removes the thread's stashed call; `Some` only when the call succeeded and the handle
/// it wrote is readable.
#[inline(always)]
pub(crate) fn take(ctx: &RetProbeContext, call: NameCall) -> Option<Resolved> {
    let (pid_tgid, pending) = take_pending(ctx, call)?;
    // SAFETY: `bpf_probe_read_user` checks the user address and fails instead of faulting.
    let handle = unsafe { bpf_probe_read_user(pending.out as *const u64) }.ok()?;
    Some(Resolved {
        pid_tgid,
        handle,
        arg: pending.arg,
    })
}

/// Removes the thread's stashed call; `Some` (the thread and what the entry stashed) only
/// when the call returned `CUDA_SUCCESS`.
#[inline(always)]
pub(crate) fn take_pending(ctx: &RetProbeContext, call: NameCall) -> Option<(u64, PendingCall)> {
    let (pid_tgid, pending, succeeded) = take_any(ctx, call)?;
    succeeded.then_some((pid_tgid, pending))
}

/// Removes the thread's stashed call whatever it returned: the thread, what the entry stashed
/// and whether the call returned `CUDA_SUCCESS`.
#[inline(always)]
pub(crate) fn take_any(ctx: &RetProbeContext, call: NameCall) -> Option<(u64, PendingCall, bool)> {
    let key = PendingKey {
        pid_tgid: bpf_get_current_pid_tgid(),
        call: call as u64,
    };
    // SAFETY: the value is copied out before the entry is removed below.
    let pending = unsafe { PENDING_CALLS.get(&key) }.map(|p| PendingCall {
        out: p.out,
        arg: p.arg,
    });
    let _ = PENDING_CALLS.remove(&key);
    let pending = pending?;
    let result: u64 = ctx.ret();
    Some((key.pid_tgid, pending, result as u32 == CUDA_SUCCESS))
}

/// Assembles a name record in per-CPU scratch and copies header plus name into the ring.
/// When the name cannot be read here (its page not yet faulted in, which a probe cannot do),
/// the record carries only its address and `unread`, and user space reads it from the process.
#[inline(always)]
pub(crate) fn emit_name(handle_kind: HandleKind, call: &Resolved) {
    let Some(scratch) = NAME_SCRATCH.get_ptr_mut(0) else {
        return;
    };
    // SAFETY: a per-CPU array slot, only touched by this CPU while the program runs.
    let event: &mut NameEvent = unsafe { &mut *scratch };
    // SAFETY: the helper bounds the copy by the buffer size it is given and checks the user
    // address; it returns the bytes copied including the NUL, or a negative error.
    let copied = unsafe {
        bpf_probe_read_user_str(
            event.name.as_mut_ptr().cast(),
            NAME_CAPACITY as u32,
            call.arg as *const _,
        )
    };
    let (name_len, truncated, unread) = if copied <= 0 || copied as usize > NAME_CAPACITY {
        (0, 0, 1)
    } else {
        let with_nul = copied as usize;
        (with_nul - 1, u32::from(with_nul == NAME_CAPACITY), 0)
    };
    event.header = NameHeader {
        kind: EventKind::Name as u32,
        pid: (call.pid_tgid >> 32) as u32,
        tid: call.pid_tgid as u32,
        handle_kind: handle_kind as u32,
        // SAFETY: `bpf_ktime_get_ns` has no preconditions.
        timestamp_ns: unsafe { bpf_ktime_get_ns() },
        handle: call.handle,
        address: call.arg,
        name_len: name_len as u32,
        truncated,
        unread,
        reserved: 0,
    };
    let size = NameHeader::SIZE + name_len;
    if size > NameHeader::SIZE + NAME_CAPACITY - 1 {
        return;
    }
    // SAFETY: `size` is at most `NameHeader::SIZE + NAME_CAPACITY - 1` (checked above), inside
    // the scratch value that `event` points to.
    let record = unsafe { core::slice::from_raw_parts(scratch.cast::<u8>(), size) };
    if EVENTS
        .output::<[u8]>(record, u64::from(BPF_RB_NO_WAKEUP))
        .is_err()
    {
        count_drop();
    }
}

#[inline(always)]
fn emit_kernel_function(call: &Resolved) {
    let Some(mut slot) = EVENTS.reserve::<KernelFunctionEvent>(0) else {
        count_drop();
        return;
    };
    slot.write(KernelFunctionEvent {
        kind: EventKind::KernelFunction as u32,
        pid: (call.pid_tgid >> 32) as u32,
        tid: call.pid_tgid as u32,
        reserved: 0,
        // SAFETY: `bpf_ktime_get_ns` has no preconditions.
        timestamp_ns: unsafe { bpf_ktime_get_ns() },
        kernel: call.arg,
        function: call.handle,
    });
    slot.submit(u64::from(BPF_RB_NO_WAKEUP));
}
