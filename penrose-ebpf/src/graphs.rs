//! CUDA graph calls: probes on the driver calls that build, instantiate, update and destroy
//! graphs, so a graph launch can enter a snippet as the kernels it runs. Each call sends one
//! [`GraphEvent`]; the agent keeps the per-process graphs. The calls are rare (start-up, shape
//! changes), so the probes stay attached like the name probes.

use aya_ebpf::{
    bindings::BPF_RB_NO_WAKEUP,
    helpers::{bpf_get_current_pid_tgid, bpf_ktime_get_ns, bpf_probe_read_user},
    macros::{uprobe, uretprobe},
    programs::{ProbeContext, RetProbeContext},
};
use penrose_ebpf_common::{EventKind, GraphEvent, GraphOp};

use crate::maps::{EVENTS, count_drop};
use crate::names::{NameCall, stash, take, take_any, take_pending};

/// The leading fields of `CUDA_KERNEL_NODE_PARAMS` (v1 and v2 alike): `CUfunction func`, seven
/// `unsigned int`s, padding to 8. `kernelParams` follows at offset 40.
#[repr(C)]
struct NodeParamsHead {
    function: u64,
    grid: [u32; 3],
    block: [u32; 3],
    shared_mem_bytes: u32,
}

/// `CUDA_KERNEL_NODE_PARAMS_v2` up to `CUkernel kern` (offset 56); `CUcontext ctx` follows.
#[repr(C)]
struct NodeParamsV2 {
    head: NodeParamsHead,
    kernel_params: u64,
    extra: u64,
    kernel: u64,
}

const _: () = assert!(core::mem::size_of::<NodeParamsHead>() == 40);
const _: () = assert!(core::mem::offset_of!(NodeParamsV2, kernel) == 56);

/// A record of `op` by the calling thread with every handle zero.
#[inline(always)]
fn record(pid_tgid: u64, op: GraphOp) -> GraphEvent {
    GraphEvent {
        kind: EventKind::Graph as u32,
        pid: (pid_tgid >> 32) as u32,
        tid: pid_tgid as u32,
        op: op as u32,
        // SAFETY: `bpf_ktime_get_ns` has no preconditions.
        timestamp_ns: unsafe { bpf_ktime_get_ns() },
        graph: 0,
        exec: 0,
        node: 0,
        stream: 0,
        function: 0,
        kernel: 0,
        grid: [0; 3],
        block: [0; 3],
        shared_mem_bytes: 0,
        reserved: 0,
    }
}

/// Queues one graph record.
#[inline(always)]
fn emit(event: &GraphEvent) {
    let Some(mut slot) = EVENTS.reserve::<GraphEvent>(0) else {
        count_drop();
        return;
    };
    slot.write(*event);
    slot.submit(u64::from(BPF_RB_NO_WAKEUP));
}

/// Copies a node's kernel and launch configuration into `event`; false when unreadable.
#[inline(always)]
fn read_params(event: &mut GraphEvent, params: u64, v2: bool) -> bool {
    if v2 {
        // SAFETY: `bpf_probe_read_user` checks the user address and fails instead of faulting.
        let Ok(p) = (unsafe { bpf_probe_read_user(params as *const NodeParamsV2) }) else {
            return false;
        };
        event.kernel = p.kernel;
        fill(event, &p.head);
    } else {
        // SAFETY: as above.
        let Ok(p) = (unsafe { bpf_probe_read_user(params as *const NodeParamsHead) }) else {
            return false;
        };
        fill(event, &p);
    }
    true
}

#[inline(always)]
fn fill(event: &mut GraphEvent, head: &NodeParamsHead) {
    event.function = head.function;
    event.grid = head.grid;
    event.block = head.block;
    event.shared_mem_bytes = head.shared_mem_bytes;
}

/// `cuStreamBeginCapture_v2(CUstream hStream, CUstreamCaptureMode mode)` and its `_ptsz` form.
#[inline(always)]
fn on_begin_capture(ctx: &ProbeContext) -> u32 {
    let mut event = record(bpf_get_current_pid_tgid(), GraphOp::CaptureBegin);
    event.stream = ctx.arg::<u64>(0).unwrap_or(0);
    emit(&event);
    0
}

/// Return of `cuStreamEndCapture*`: reported whatever it returned, so the agent never keeps a
/// failed capture's stream as capturing; the graph is zero when the call failed.
#[inline(always)]
fn on_end_capture_return(ctx: &RetProbeContext, call: NameCall) -> u32 {
    let Some((pid_tgid, pending, succeeded)) = take_any(ctx, call) else {
        return 0;
    };
    let mut event = record(pid_tgid, GraphOp::CaptureEnd);
    event.stream = pending.arg;
    if succeeded {
        // SAFETY: `bpf_probe_read_user` checks the user address and fails instead of faulting.
        event.graph = unsafe { bpf_probe_read_user(pending.out as *const u64) }.unwrap_or(0);
    }
    emit(&event);
    0
}

/// Entry of `cuGraphAddKernelNode*(CUgraphNode* phGraphNode, CUgraph hGraph, const
/// CUgraphNode* dependencies, size_t numDependencies, const CUDA_KERNEL_NODE_PARAMS* p)`.
#[inline(always)]
fn on_add_kernel_node(ctx: &ProbeContext, call: NameCall, v2: bool) -> u32 {
    let (Some(graph), Some(params)) = (ctx.arg::<u64>(1), ctx.arg::<u64>(4)) else {
        return 0;
    };
    let mut event = record(bpf_get_current_pid_tgid(), GraphOp::KernelNodeParams);
    event.graph = graph;
    if read_params(&mut event, params, v2) {
        emit(&event);
        stash(ctx, call, 0, 1);
    }
    0
}

/// Return of `cuGraphAddKernelNode*`: the node's handle.
#[inline(always)]
fn on_add_kernel_node_return(ctx: &RetProbeContext, call: NameCall) -> u32 {
    if let Some(resolved) = take(ctx, call) {
        let mut event = record(resolved.pid_tgid, GraphOp::KernelNodeAdded);
        event.graph = resolved.arg;
        event.node = resolved.handle;
        emit(&event);
    }
    0
}

/// Return of `cuGraphInstantiate*(CUgraphExec* phGraphExec, CUgraph hGraph, ...)`.
#[inline(always)]
fn on_instantiate_return(ctx: &RetProbeContext, call: NameCall) -> u32 {
    if let Some(resolved) = take(ctx, call) {
        let mut event = record(resolved.pid_tgid, GraphOp::Instantiated);
        event.graph = resolved.arg;
        event.exec = resolved.handle;
        emit(&event);
    }
    0
}

/// `cuGraphExecKernelNodeSetParams*(CUgraphExec hGraphExec, CUgraphNode hNode, const
/// CUDA_KERNEL_NODE_PARAMS* nodeParams)`.
#[inline(always)]
fn on_exec_node_params(ctx: &ProbeContext, v2: bool) -> u32 {
    let (Some(exec), Some(node), Some(params)) =
        (ctx.arg::<u64>(0), ctx.arg::<u64>(1), ctx.arg::<u64>(2))
    else {
        return 0;
    };
    let mut event = record(bpf_get_current_pid_tgid(), GraphOp::ExecNodeParams);
    event.exec = exec;
    event.node = node;
    if read_params(&mut event, params, v2) {
        emit(&event);
    }
    0
}

/// Return of `cuGraphExecUpdate*(CUgraphExec hGraphExec, CUgraph hGraph, ...)`: the entry
/// stashed the exec where other calls stash an out-pointer, and the graph.
#[inline(always)]
fn on_exec_update_return(ctx: &RetProbeContext, call: NameCall) -> u32 {
    if let Some((pid_tgid, pending)) = take_pending(ctx, call) {
        let mut event = record(pid_tgid, GraphOp::ExecUpdated);
        event.exec = pending.out;
        event.graph = pending.arg;
        emit(&event);
    }
    0
}

/// A destroy call: its one argument is the handle.
#[inline(always)]
fn on_destroy(ctx: &ProbeContext, op: GraphOp) -> u32 {
    let handle = ctx.arg::<u64>(0).unwrap_or(0);
    let mut event = record(bpf_get_current_pid_tgid(), op);
    match op {
        GraphOp::ExecDestroyed => event.exec = handle,
        _ => event.graph = handle,
    }
    emit(&event);
    0
}

/// `cuStreamBeginCapture_v2`.
#[uprobe]
pub fn cu_stream_begin_capture_v2(ctx: ProbeContext) -> u32 {
    on_begin_capture(&ctx)
}

/// `cuStreamBeginCapture_v2_ptsz`.
#[uprobe]
pub fn cu_stream_begin_capture_v2_ptsz(ctx: ProbeContext) -> u32 {
    on_begin_capture(&ctx)
}

/// `cuStreamEndCapture(CUstream hStream, CUgraph* phGraph)`.
#[uprobe]
pub fn cu_stream_end_capture(ctx: ProbeContext) -> u32 {
    stash(&ctx, NameCall::StreamEndCapture, 1, 0);
    0
}

/// Return of `cuStreamEndCapture`.
#[uretprobe]
pub fn cu_stream_end_capture_ret(ctx: RetProbeContext) -> u32 {
    on_end_capture_return(&ctx, NameCall::StreamEndCapture)
}

/// `cuStreamEndCapture_ptsz`.
#[uprobe]
pub fn cu_stream_end_capture_ptsz(ctx: ProbeContext) -> u32 {
    stash(&ctx, NameCall::StreamEndCapturePtsz, 1, 0);
    0
}

/// Return of `cuStreamEndCapture_ptsz`.
#[uretprobe]
pub fn cu_stream_end_capture_ptsz_ret(ctx: RetProbeContext) -> u32 {
    on_end_capture_return(&ctx, NameCall::StreamEndCapturePtsz)
}

/// `cuGraphAddKernelNode` (v1 parameters).
#[uprobe]
pub fn cu_graph_add_kernel_node(ctx: ProbeContext) -> u32 {
    on_add_kernel_node(&ctx, NameCall::GraphAddKernelNode, false)
}

/// Return of `cuGraphAddKernelNode`.
#[uretprobe]
pub fn cu_graph_add_kernel_node_ret(ctx: RetProbeContext) -> u32 {
    on_add_kernel_node_return(&ctx, NameCall::GraphAddKernelNode)
}

/// `cuGraphAddKernelNode_v2` (v2 parameters: a `CUkernel` may stand in for the function).
#[uprobe]
pub fn cu_graph_add_kernel_node_v2(ctx: ProbeContext) -> u32 {
    on_add_kernel_node(&ctx, NameCall::GraphAddKernelNodeV2, true)
}

/// Return of `cuGraphAddKernelNode_v2`.
#[uretprobe]
pub fn cu_graph_add_kernel_node_v2_ret(ctx: RetProbeContext) -> u32 {
    on_add_kernel_node_return(&ctx, NameCall::GraphAddKernelNodeV2)
}

/// `cuGraphInstantiateWithFlags(CUgraphExec* phGraphExec, CUgraph hGraph, unsigned long long
/// flags)`.
#[uprobe]
pub fn cu_graph_instantiate_with_flags(ctx: ProbeContext) -> u32 {
    stash(&ctx, NameCall::GraphInstantiateWithFlags, 0, 1);
    0
}

/// Return of `cuGraphInstantiateWithFlags`.
#[uretprobe]
pub fn cu_graph_instantiate_with_flags_ret(ctx: RetProbeContext) -> u32 {
    on_instantiate_return(&ctx, NameCall::GraphInstantiateWithFlags)
}

/// `cuGraphInstantiateWithParams(CUgraphExec* phGraphExec, CUgraph hGraph,
/// CUDA_GRAPH_INSTANTIATE_PARAMS* instantiateParams)`.
#[uprobe]
pub fn cu_graph_instantiate_with_params(ctx: ProbeContext) -> u32 {
    stash(&ctx, NameCall::GraphInstantiateWithParams, 0, 1);
    0
}

/// Return of `cuGraphInstantiateWithParams`.
#[uretprobe]
pub fn cu_graph_instantiate_with_params_ret(ctx: RetProbeContext) -> u32 {
    on_instantiate_return(&ctx, NameCall::GraphInstantiateWithParams)
}

/// `cuGraphExecKernelNodeSetParams` (v1 parameters).
#[uprobe]
pub fn cu_graph_exec_kernel_node_set_params(ctx: ProbeContext) -> u32 {
    on_exec_node_params(&ctx, false)
}

/// `cuGraphExecKernelNodeSetParams_v2`.
#[uprobe]
pub fn cu_graph_exec_kernel_node_set_params_v2(ctx: ProbeContext) -> u32 {
    on_exec_node_params(&ctx, true)
}

/// `cuGraphExecUpdate(CUgraphExec hGraphExec, CUgraph hGraph, CUgraphNode* hErrorNode_out,
/// CUgraphExecUpdateResult* updateResult_out)`.
#[uprobe]
pub fn cu_graph_exec_update(ctx: ProbeContext) -> u32 {
    stash(&ctx, NameCall::GraphExecUpdate, 0, 1);
    0
}

/// Return of `cuGraphExecUpdate`.
#[uretprobe]
pub fn cu_graph_exec_update_ret(ctx: RetProbeContext) -> u32 {
    on_exec_update_return(&ctx, NameCall::GraphExecUpdate)
}

/// `cuGraphExecUpdate_v2(CUgraphExec hGraphExec, CUgraph hGraph, CUgraphExecUpdateResultInfo*
/// resultInfo)`.
#[uprobe]
pub fn cu_graph_exec_update_v2(ctx: ProbeContext) -> u32 {
    stash(&ctx, NameCall::GraphExecUpdateV2, 0, 1);
    0
}

/// Return of `cuGraphExecUpdate_v2`.
#[uretprobe]
pub fn cu_graph_exec_update_v2_ret(ctx: RetProbeContext) -> u32 {
    on_exec_update_return(&ctx, NameCall::GraphExecUpdateV2)
}

/// `cuGraphDestroy(CUgraph hGraph)`.
#[uprobe]
pub fn cu_graph_destroy(ctx: ProbeContext) -> u32 {
    on_destroy(&ctx, GraphOp::GraphDestroyed)
}

/// `cuGraphExecDestroy(CUgraphExec hGraphExec)`.
#[uprobe]
pub fn cu_graph_exec_destroy(ctx: ProbeContext) -> u32 {
    on_destroy(&ctx, GraphOp::ExecDestroyed)
}
