//! Which program attaches where: the table the loader iterates.
//!
//! Launch probes are attached only inside capture windows; name probes and the exit
//! tracepoint stay attached (docs/design.md section 3), so each entry says its [`ProbeRole`], and
//! which [`Library`] it attaches to: the driver (libcuda) or the CUDA runtime (libcudart),
//! through which kernels registered by nvcc's host stubs get their names.

use crate::EntryPoint;

/// Names of the programs in the compiled object.
pub mod programs {
    /// Uprobe on `cuLaunchKernel`.
    pub const CU_LAUNCH_KERNEL: &str = "cu_launch_kernel";
    /// Uprobe on `cuLaunchKernel_ptsz` (per-thread default stream; same arguments).
    pub const CU_LAUNCH_KERNEL_PTSZ: &str = "cu_launch_kernel_ptsz";
    /// Uprobe on `cuLaunchKernelEx`.
    pub const CU_LAUNCH_KERNEL_EX: &str = "cu_launch_kernel_ex";
    /// Uprobe on `cuLaunchKernelEx_ptsz`.
    pub const CU_LAUNCH_KERNEL_EX_PTSZ: &str = "cu_launch_kernel_ex_ptsz";
    /// Uprobe on `cuLaunchCooperativeKernel`.
    pub const CU_LAUNCH_COOPERATIVE_KERNEL: &str = "cu_launch_cooperative_kernel";
    /// Uprobe on `cuLaunchCooperativeKernel_ptsz`.
    pub const CU_LAUNCH_COOPERATIVE_KERNEL_PTSZ: &str = "cu_launch_cooperative_kernel_ptsz";
    /// Uprobe on `cuGraphLaunch`.
    pub const CU_GRAPH_LAUNCH: &str = "cu_graph_launch";
    /// Uprobe on `cuGraphLaunch_ptsz`.
    pub const CU_GRAPH_LAUNCH_PTSZ: &str = "cu_graph_launch_ptsz";
    /// Uprobe on `cuModuleGetFunction`: stashes the out-pointer and the name pointer.
    pub const CU_MODULE_GET_FUNCTION: &str = "cu_module_get_function";
    /// Uretprobe on `cuModuleGetFunction`: emits the function handle's name.
    pub const CU_MODULE_GET_FUNCTION_RET: &str = "cu_module_get_function_ret";
    /// Uprobe on `cuLibraryGetKernel`: stashes the out-pointer and the name pointer.
    pub const CU_LIBRARY_GET_KERNEL: &str = "cu_library_get_kernel";
    /// Uretprobe on `cuLibraryGetKernel`: emits the kernel handle's name.
    pub const CU_LIBRARY_GET_KERNEL_RET: &str = "cu_library_get_kernel_ret";
    /// Uprobe on `cuKernelGetFunction`: stashes the out-pointer and the kernel handle.
    pub const CU_KERNEL_GET_FUNCTION: &str = "cu_kernel_get_function";
    /// Uretprobe on `cuKernelGetFunction`: emits the kernel-to-function mapping.
    pub const CU_KERNEL_GET_FUNCTION_RET: &str = "cu_kernel_get_function_ret";
    /// Uprobe on the runtime's `__cudaRegisterFunction`: emits the host stub's name.
    pub const CUDART_REGISTER_FUNCTION: &str = "cudart_register_function";
    /// Uprobe on the runtime's `__cudaGetKernel`: stashes the out-pointer and the stub.
    pub const CUDART_GET_KERNEL: &str = "cudart_get_kernel";
    /// Uretprobe on `__cudaGetKernel`: emits the stub-to-kernel mapping.
    pub const CUDART_GET_KERNEL_RET: &str = "cudart_get_kernel_ret";
    /// Uprobe on the runtime's `cudaLaunchKernel`: emits the function it was given.
    pub const CUDART_LAUNCH_KERNEL: &str = "cudart_launch_kernel";
    /// Uprobe on the runtime's `cudaLaunchKernel_ptsz`.
    pub const CUDART_LAUNCH_KERNEL_PTSZ: &str = "cudart_launch_kernel_ptsz";
    /// Uprobe on `cuCtxSetCurrent`.
    pub const CU_CTX_SET_CURRENT: &str = "cu_ctx_set_current";
    /// Uprobe on `cuCtxPushCurrent_v2`.
    pub const CU_CTX_PUSH_CURRENT: &str = "cu_ctx_push_current";
    /// Uprobe on `cuCtxPopCurrent_v2`.
    pub const CU_CTX_POP_CURRENT: &str = "cu_ctx_pop_current";
    /// Uprobe on `cuDevicePrimaryCtxRetain`: stashes the out-pointer and the ordinal.
    pub const CU_DEVICE_PRIMARY_CTX_RETAIN: &str = "cu_device_primary_ctx_retain";
    /// Uretprobe on `cuDevicePrimaryCtxRetain`: emits the context and its ordinal.
    pub const CU_DEVICE_PRIMARY_CTX_RETAIN_RET: &str = "cu_device_primary_ctx_retain_ret";
    /// Uprobe on `cuCtxCreate_v2`.
    pub const CU_CTX_CREATE_V2: &str = "cu_ctx_create_v2";
    /// Uretprobe on `cuCtxCreate_v2`.
    pub const CU_CTX_CREATE_V2_RET: &str = "cu_ctx_create_v2_ret";
    /// Uprobe on `cuCtxCreate_v3`.
    pub const CU_CTX_CREATE_V3: &str = "cu_ctx_create_v3";
    /// Uretprobe on `cuCtxCreate_v3`.
    pub const CU_CTX_CREATE_V3_RET: &str = "cu_ctx_create_v3_ret";
    /// Uprobe on `cuCtxCreate_v4`.
    pub const CU_CTX_CREATE_V4: &str = "cu_ctx_create_v4";
    /// Uretprobe on `cuCtxCreate_v4`.
    pub const CU_CTX_CREATE_V4_RET: &str = "cu_ctx_create_v4_ret";
    /// Uprobe on `cuStreamCreate`.
    pub const CU_STREAM_CREATE: &str = "cu_stream_create";
    /// Uretprobe on `cuStreamCreate`.
    pub const CU_STREAM_CREATE_RET: &str = "cu_stream_create_ret";
    /// Uprobe on `cuStreamCreateWithPriority`.
    pub const CU_STREAM_CREATE_WITH_PRIORITY: &str = "cu_stream_create_with_priority";
    /// Uretprobe on `cuStreamCreateWithPriority`.
    pub const CU_STREAM_CREATE_WITH_PRIORITY_RET: &str = "cu_stream_create_with_priority_ret";
    /// Uprobe on `cuDeviceGetUuid`.
    pub const CU_DEVICE_GET_UUID: &str = "cu_device_get_uuid";
    /// Uretprobe on `cuDeviceGetUuid`.
    pub const CU_DEVICE_GET_UUID_RET: &str = "cu_device_get_uuid_ret";
    /// Uprobe on `cuDeviceGetUuid_v2`.
    pub const CU_DEVICE_GET_UUID_V2: &str = "cu_device_get_uuid_v2";
    /// Uretprobe on `cuDeviceGetUuid_v2`.
    pub const CU_DEVICE_GET_UUID_V2_RET: &str = "cu_device_get_uuid_v2_ret";
    /// Uprobe on `cuStreamBeginCapture_v2`.
    pub const CU_STREAM_BEGIN_CAPTURE_V2: &str = "cu_stream_begin_capture_v2";
    /// Uprobe on `cuStreamBeginCapture_v2_ptsz`.
    pub const CU_STREAM_BEGIN_CAPTURE_V2_PTSZ: &str = "cu_stream_begin_capture_v2_ptsz";
    /// Uprobe on `cuStreamEndCapture`.
    pub const CU_STREAM_END_CAPTURE: &str = "cu_stream_end_capture";
    /// Uretprobe on `cuStreamEndCapture`.
    pub const CU_STREAM_END_CAPTURE_RET: &str = "cu_stream_end_capture_ret";
    /// Uprobe on `cuStreamEndCapture_ptsz`.
    pub const CU_STREAM_END_CAPTURE_PTSZ: &str = "cu_stream_end_capture_ptsz";
    /// Uretprobe on `cuStreamEndCapture_ptsz`.
    pub const CU_STREAM_END_CAPTURE_PTSZ_RET: &str = "cu_stream_end_capture_ptsz_ret";
    /// Uprobe on `cuGraphAddKernelNode`.
    pub const CU_GRAPH_ADD_KERNEL_NODE: &str = "cu_graph_add_kernel_node";
    /// Uretprobe on `cuGraphAddKernelNode`.
    pub const CU_GRAPH_ADD_KERNEL_NODE_RET: &str = "cu_graph_add_kernel_node_ret";
    /// Uprobe on `cuGraphAddKernelNode_v2`.
    pub const CU_GRAPH_ADD_KERNEL_NODE_V2: &str = "cu_graph_add_kernel_node_v2";
    /// Uretprobe on `cuGraphAddKernelNode_v2`.
    pub const CU_GRAPH_ADD_KERNEL_NODE_V2_RET: &str = "cu_graph_add_kernel_node_v2_ret";
    /// Uprobe on `cuGraphInstantiateWithFlags`.
    pub const CU_GRAPH_INSTANTIATE_WITH_FLAGS: &str = "cu_graph_instantiate_with_flags";
    /// Uretprobe on `cuGraphInstantiateWithFlags`.
    pub const CU_GRAPH_INSTANTIATE_WITH_FLAGS_RET: &str = "cu_graph_instantiate_with_flags_ret";
    /// Uprobe on `cuGraphInstantiateWithParams`.
    pub const CU_GRAPH_INSTANTIATE_WITH_PARAMS: &str = "cu_graph_instantiate_with_params";
    /// Uretprobe on `cuGraphInstantiateWithParams`.
    pub const CU_GRAPH_INSTANTIATE_WITH_PARAMS_RET: &str = "cu_graph_instantiate_with_params_ret";
    /// Uprobe on `cuGraphExecKernelNodeSetParams`.
    pub const CU_GRAPH_EXEC_KERNEL_NODE_SET_PARAMS: &str = "cu_graph_exec_kernel_node_set_params";
    /// Uprobe on `cuGraphExecKernelNodeSetParams_v2`.
    pub const CU_GRAPH_EXEC_KERNEL_NODE_SET_PARAMS_V2: &str =
        "cu_graph_exec_kernel_node_set_params_v2";
    /// Uprobe on `cuGraphExecUpdate`.
    pub const CU_GRAPH_EXEC_UPDATE: &str = "cu_graph_exec_update";
    /// Uretprobe on `cuGraphExecUpdate`.
    pub const CU_GRAPH_EXEC_UPDATE_RET: &str = "cu_graph_exec_update_ret";
    /// Uprobe on `cuGraphExecUpdate_v2`.
    pub const CU_GRAPH_EXEC_UPDATE_V2: &str = "cu_graph_exec_update_v2";
    /// Uretprobe on `cuGraphExecUpdate_v2`.
    pub const CU_GRAPH_EXEC_UPDATE_V2_RET: &str = "cu_graph_exec_update_v2_ret";
    /// Uprobe on `cuGraphDestroy`.
    pub const CU_GRAPH_DESTROY: &str = "cu_graph_destroy";
    /// Uprobe on `cuGraphExecDestroy`.
    pub const CU_GRAPH_EXEC_DESTROY: &str = "cu_graph_exec_destroy";
    /// Tracepoint `sched:sched_process_exit`.
    pub const SCHED_PROCESS_EXIT: &str = "sched_process_exit";
}

/// Which library a probe attaches to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Library {
    /// The user-space driver, `libcuda.so*`.
    Driver,
    /// The CUDA runtime, `libcudart.so*` (a shared copy; one linked statically into another
    /// library has no symbols to attach to).
    Runtime,
}

impl Library {
    /// The library a file name is, if any: `libcuda.so`, `libcuda.so.1`,
    /// `libcuda.so.580.159.04`; `libcudart.so`, `libcudart.so.13`, `libcudart.so.12.4.127`.
    pub fn of_file_name(name: &str) -> Option<Self> {
        let is = |stem: &str| {
            name == stem || name.strip_prefix(stem).is_some_and(|r| r.starts_with('.'))
        };
        if is("libcuda.so") {
            Some(Library::Driver)
        } else if is("libcudart.so") {
            Some(Library::Runtime)
        } else {
            None
        }
    }
}

/// How a program attaches to its symbol.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProbeKind {
    /// At the function's entry (`UProbe` with `retprobe = false`).
    Uprobe,
    /// At the function's return (`UProbe` with `retprobe = true`).
    Uretprobe,
}

/// When the agent keeps a probe attached.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProbeRole {
    /// Launch probe: attached only inside capture windows (they cost a trap per launch).
    Launch,
    /// Name probe: fires only at module load, so it stays attached for the agent's lifetime.
    Name,
    /// Context probe: a driver call that says which device a thread's launches run on
    /// (contexts, streams, device UUIDs). Such calls are rare (start-up, device switches), and
    /// a context made current before a window opened must be known inside it, so these stay
    /// attached like name probes.
    Context,
    /// Graph probe: a driver call that builds, instantiates, updates or destroys a CUDA graph,
    /// so a graph launch can enter a snippet as the kernels it runs. Graphs are built at
    /// start-up (warm-up and capture) and rarely after, and a graph built before a window
    /// opened is launched inside it, so these stay attached like name probes.
    Graph,
    /// A runtime launch probe that only helps name launches (the legacy path passes host
    /// stubs to `cudaLaunchKernel`): attached inside windows, and only while launches remain
    /// unnamed, since it doubles the traps of the launches it sees.
    LaunchNaming,
}

/// One program of the object and the libcuda symbol it attaches to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UserProbe {
    /// Program name in the object.
    pub program: &'static str,
    /// Exported symbol in the library.
    pub symbol: &'static str,
    /// The library that exports it.
    pub library: Library,
    /// Entry or return probe.
    pub kind: ProbeKind,
    /// Whether it follows capture windows or stays attached.
    pub role: ProbeRole,
}

impl UserProbe {
    const fn launch(entry: EntryPoint) -> Self {
        Self {
            program: entry.program(),
            symbol: entry.symbol(),
            library: Library::Driver,
            kind: ProbeKind::Uprobe,
            role: ProbeRole::Launch,
        }
    }

    const fn name(program: &'static str, symbol: &'static str, kind: ProbeKind) -> Self {
        Self {
            program,
            symbol,
            library: Library::Driver,
            kind,
            role: ProbeRole::Name,
        }
    }

    const fn context(program: &'static str, symbol: &'static str, kind: ProbeKind) -> Self {
        Self {
            program,
            symbol,
            library: Library::Driver,
            kind,
            role: ProbeRole::Context,
        }
    }

    const fn graph(program: &'static str, symbol: &'static str, kind: ProbeKind) -> Self {
        Self {
            program,
            symbol,
            library: Library::Driver,
            kind,
            role: ProbeRole::Graph,
        }
    }

    const fn runtime(
        program: &'static str,
        symbol: &'static str,
        kind: ProbeKind,
        role: ProbeRole,
    ) -> Self {
        Self {
            program,
            symbol,
            library: Library::Runtime,
            kind,
            role,
        }
    }
}

/// Every uprobe and uretprobe in the object: eight launch probes and an entry and a return
/// probe for each of the three name functions on the driver; on the runtime, the stub
/// registration, `__cudaGetKernel` (entry and return) and the two `cudaLaunchKernel`s; then
/// the context probes on the driver (three entry probes, eight entry and return pairs); then
/// the graph probes on the driver (six entry probes, eight entry and return pairs).
pub const USER_PROBES: [UserProbe; 60] = [
    UserProbe::launch(EntryPoint::LaunchKernel),
    UserProbe::launch(EntryPoint::LaunchKernelPtsz),
    UserProbe::launch(EntryPoint::LaunchKernelEx),
    UserProbe::launch(EntryPoint::LaunchKernelExPtsz),
    UserProbe::launch(EntryPoint::LaunchCooperativeKernel),
    UserProbe::launch(EntryPoint::LaunchCooperativeKernelPtsz),
    UserProbe::launch(EntryPoint::GraphLaunch),
    UserProbe::launch(EntryPoint::GraphLaunchPtsz),
    UserProbe::name(
        programs::CU_MODULE_GET_FUNCTION,
        "cuModuleGetFunction",
        ProbeKind::Uprobe,
    ),
    UserProbe::name(
        programs::CU_MODULE_GET_FUNCTION_RET,
        "cuModuleGetFunction",
        ProbeKind::Uretprobe,
    ),
    UserProbe::name(
        programs::CU_LIBRARY_GET_KERNEL,
        "cuLibraryGetKernel",
        ProbeKind::Uprobe,
    ),
    UserProbe::name(
        programs::CU_LIBRARY_GET_KERNEL_RET,
        "cuLibraryGetKernel",
        ProbeKind::Uretprobe,
    ),
    UserProbe::name(
        programs::CU_KERNEL_GET_FUNCTION,
        "cuKernelGetFunction",
        ProbeKind::Uprobe,
    ),
    UserProbe::name(
        programs::CU_KERNEL_GET_FUNCTION_RET,
        "cuKernelGetFunction",
        ProbeKind::Uretprobe,
    ),
    UserProbe::runtime(
        programs::CUDART_REGISTER_FUNCTION,
        "__cudaRegisterFunction",
        ProbeKind::Uprobe,
        ProbeRole::Name,
    ),
    UserProbe::runtime(
        programs::CUDART_GET_KERNEL,
        "__cudaGetKernel",
        ProbeKind::Uprobe,
        ProbeRole::Name,
    ),
    UserProbe::runtime(
        programs::CUDART_GET_KERNEL_RET,
        "__cudaGetKernel",
        ProbeKind::Uretprobe,
        ProbeRole::Name,
    ),
    UserProbe::runtime(
        programs::CUDART_LAUNCH_KERNEL,
        "cudaLaunchKernel",
        ProbeKind::Uprobe,
        ProbeRole::LaunchNaming,
    ),
    UserProbe::runtime(
        programs::CUDART_LAUNCH_KERNEL_PTSZ,
        "cudaLaunchKernel_ptsz",
        ProbeKind::Uprobe,
        ProbeRole::LaunchNaming,
    ),
    UserProbe::context(
        programs::CU_CTX_SET_CURRENT,
        "cuCtxSetCurrent",
        ProbeKind::Uprobe,
    ),
    UserProbe::context(
        programs::CU_CTX_PUSH_CURRENT,
        "cuCtxPushCurrent_v2",
        ProbeKind::Uprobe,
    ),
    UserProbe::context(
        programs::CU_CTX_POP_CURRENT,
        "cuCtxPopCurrent_v2",
        ProbeKind::Uprobe,
    ),
    UserProbe::context(
        programs::CU_DEVICE_PRIMARY_CTX_RETAIN,
        "cuDevicePrimaryCtxRetain",
        ProbeKind::Uprobe,
    ),
    UserProbe::context(
        programs::CU_DEVICE_PRIMARY_CTX_RETAIN_RET,
        "cuDevicePrimaryCtxRetain",
        ProbeKind::Uretprobe,
    ),
    UserProbe::context(
        programs::CU_CTX_CREATE_V2,
        "cuCtxCreate_v2",
        ProbeKind::Uprobe,
    ),
    UserProbe::context(
        programs::CU_CTX_CREATE_V2_RET,
        "cuCtxCreate_v2",
        ProbeKind::Uretprobe,
    ),
    UserProbe::context(
        programs::CU_CTX_CREATE_V3,
        "cuCtxCreate_v3",
        ProbeKind::Uprobe,
    ),
    UserProbe::context(
        programs::CU_CTX_CREATE_V3_RET,
        "cuCtxCreate_v3",
        ProbeKind::Uretprobe,
    ),
    UserProbe::context(
        programs::CU_CTX_CREATE_V4,
        "cuCtxCreate_v4",
        ProbeKind::Uprobe,
    ),
    UserProbe::context(
        programs::CU_CTX_CREATE_V4_RET,
        "cuCtxCreate_v4",
        ProbeKind::Uretprobe,
    ),
    UserProbe::context(
        programs::CU_STREAM_CREATE,
        "cuStreamCreate",
        ProbeKind::Uprobe,
    ),
    UserProbe::context(
        programs::CU_STREAM_CREATE_RET,
        "cuStreamCreate",
        ProbeKind::Uretprobe,
    ),
    UserProbe::context(
        programs::CU_STREAM_CREATE_WITH_PRIORITY,
        "cuStreamCreateWithPriority",
        ProbeKind::Uprobe,
    ),
    UserProbe::context(
        programs::CU_STREAM_CREATE_WITH_PRIORITY_RET,
        "cuStreamCreateWithPriority",
        ProbeKind::Uretprobe,
    ),
    UserProbe::context(
        programs::CU_DEVICE_GET_UUID,
        "cuDeviceGetUuid",
        ProbeKind::Uprobe,
    ),
    UserProbe::context(
        programs::CU_DEVICE_GET_UUID_RET,
        "cuDeviceGetUuid",
        ProbeKind::Uretprobe,
    ),
    UserProbe::context(
        programs::CU_DEVICE_GET_UUID_V2,
        "cuDeviceGetUuid_v2",
        ProbeKind::Uprobe,
    ),
    UserProbe::context(
        programs::CU_DEVICE_GET_UUID_V2_RET,
        "cuDeviceGetUuid_v2",
        ProbeKind::Uretprobe,
    ),
    UserProbe::graph(
        programs::CU_STREAM_BEGIN_CAPTURE_V2,
        "cuStreamBeginCapture_v2",
        ProbeKind::Uprobe,
    ),
    UserProbe::graph(
        programs::CU_STREAM_BEGIN_CAPTURE_V2_PTSZ,
        "cuStreamBeginCapture_v2_ptsz",
        ProbeKind::Uprobe,
    ),
    UserProbe::graph(
        programs::CU_STREAM_END_CAPTURE,
        "cuStreamEndCapture",
        ProbeKind::Uprobe,
    ),
    UserProbe::graph(
        programs::CU_STREAM_END_CAPTURE_RET,
        "cuStreamEndCapture",
        ProbeKind::Uretprobe,
    ),
    UserProbe::graph(
        programs::CU_STREAM_END_CAPTURE_PTSZ,
        "cuStreamEndCapture_ptsz",
        ProbeKind::Uprobe,
    ),
    UserProbe::graph(
        programs::CU_STREAM_END_CAPTURE_PTSZ_RET,
        "cuStreamEndCapture_ptsz",
        ProbeKind::Uretprobe,
    ),
    UserProbe::graph(
        programs::CU_GRAPH_ADD_KERNEL_NODE,
        "cuGraphAddKernelNode",
        ProbeKind::Uprobe,
    ),
    UserProbe::graph(
        programs::CU_GRAPH_ADD_KERNEL_NODE_RET,
        "cuGraphAddKernelNode",
        ProbeKind::Uretprobe,
    ),
    UserProbe::graph(
        programs::CU_GRAPH_ADD_KERNEL_NODE_V2,
        "cuGraphAddKernelNode_v2",
        ProbeKind::Uprobe,
    ),
    UserProbe::graph(
        programs::CU_GRAPH_ADD_KERNEL_NODE_V2_RET,
        "cuGraphAddKernelNode_v2",
        ProbeKind::Uretprobe,
    ),
    UserProbe::graph(
        programs::CU_GRAPH_INSTANTIATE_WITH_FLAGS,
        "cuGraphInstantiateWithFlags",
        ProbeKind::Uprobe,
    ),
    UserProbe::graph(
        programs::CU_GRAPH_INSTANTIATE_WITH_FLAGS_RET,
        "cuGraphInstantiateWithFlags",
        ProbeKind::Uretprobe,
    ),
    UserProbe::graph(
        programs::CU_GRAPH_INSTANTIATE_WITH_PARAMS,
        "cuGraphInstantiateWithParams",
        ProbeKind::Uprobe,
    ),
    UserProbe::graph(
        programs::CU_GRAPH_INSTANTIATE_WITH_PARAMS_RET,
        "cuGraphInstantiateWithParams",
        ProbeKind::Uretprobe,
    ),
    UserProbe::graph(
        programs::CU_GRAPH_EXEC_KERNEL_NODE_SET_PARAMS,
        "cuGraphExecKernelNodeSetParams",
        ProbeKind::Uprobe,
    ),
    UserProbe::graph(
        programs::CU_GRAPH_EXEC_KERNEL_NODE_SET_PARAMS_V2,
        "cuGraphExecKernelNodeSetParams_v2",
        ProbeKind::Uprobe,
    ),
    UserProbe::graph(
        programs::CU_GRAPH_EXEC_UPDATE,
        "cuGraphExecUpdate",
        ProbeKind::Uprobe,
    ),
    UserProbe::graph(
        programs::CU_GRAPH_EXEC_UPDATE_RET,
        "cuGraphExecUpdate",
        ProbeKind::Uretprobe,
    ),
    UserProbe::graph(
        programs::CU_GRAPH_EXEC_UPDATE_V2,
        "cuGraphExecUpdate_v2",
        ProbeKind::Uprobe,
    ),
    UserProbe::graph(
        programs::CU_GRAPH_EXEC_UPDATE_V2_RET,
        "cuGraphExecUpdate_v2",
        ProbeKind::Uretprobe,
    ),
    UserProbe::graph(
        programs::CU_GRAPH_DESTROY,
        "cuGraphDestroy",
        ProbeKind::Uprobe,
    ),
    UserProbe::graph(
        programs::CU_GRAPH_EXEC_DESTROY,
        "cuGraphExecDestroy",
        ProbeKind::Uprobe,
    ),
];

/// A tracepoint program and where it attaches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TracePoint {
    /// Program name in the object.
    pub program: &'static str,
    /// Tracepoint category (the directory under `events/`).
    pub category: &'static str,
    /// Tracepoint name.
    pub name: &'static str,
}

/// Process exit: closes the process's state in the agent. Always attached.
pub const PROCESS_EXIT: TracePoint = TracePoint {
    program: programs::SCHED_PROCESS_EXIT,
    category: "sched",
    name: "sched_process_exit",
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_launch_entry_point_has_exactly_one_launch_probe() {
        for entry in EntryPoint::ALL {
            let probes: usize = USER_PROBES
                .iter()
                .filter(|p| p.symbol == entry.symbol())
                .inspect(|p| {
                    assert_eq!(p.role, ProbeRole::Launch);
                    assert_eq!(p.kind, ProbeKind::Uprobe);
                    assert_eq!(p.program, entry.program());
                })
                .count();
            assert_eq!(probes, 1, "{}", entry.symbol());
        }
    }

    #[test]
    fn every_name_symbol_has_an_entry_and_a_return_probe() {
        for symbol in [
            "cuModuleGetFunction",
            "cuLibraryGetKernel",
            "cuKernelGetFunction",
        ] {
            let kinds = |kind| {
                USER_PROBES
                    .iter()
                    .filter(|p| p.symbol == symbol && p.kind == kind)
                    .inspect(|p| assert_eq!(p.role, ProbeRole::Name))
                    .count()
            };
            assert_eq!(kinds(ProbeKind::Uprobe), 1, "{symbol}");
            assert_eq!(kinds(ProbeKind::Uretprobe), 1, "{symbol}");
        }
    }

    #[test]
    fn context_probes_stay_on_the_driver_and_returns_follow_entries() {
        let context = || USER_PROBES.iter().filter(|p| p.role == ProbeRole::Context);
        assert_eq!(context().count(), 19);
        for probe in context() {
            assert_eq!(probe.library, Library::Driver, "{}", probe.symbol);
            if probe.kind == ProbeKind::Uretprobe {
                let entry = context()
                    .find(|p| p.symbol == probe.symbol && p.kind == ProbeKind::Uprobe)
                    .unwrap_or_else(|| panic!("{} has no entry", probe.symbol));
                assert_eq!(probe.program.strip_suffix("_ret"), Some(entry.program));
            }
        }
    }

    #[test]
    fn graph_probes_stay_on_the_driver_and_returns_follow_entries() {
        let graph = || USER_PROBES.iter().filter(|p| p.role == ProbeRole::Graph);
        assert_eq!(graph().count(), 22);
        for probe in graph() {
            assert_eq!(probe.library, Library::Driver, "{}", probe.symbol);
            if probe.kind == ProbeKind::Uretprobe {
                let entry = graph()
                    .find(|p| p.symbol == probe.symbol && p.kind == ProbeKind::Uprobe)
                    .unwrap_or_else(|| panic!("{} has no entry", probe.symbol));
                assert_eq!(probe.program.strip_suffix("_ret"), Some(entry.program));
            }
        }
    }

    #[test]
    fn library_file_names_are_recognised() {
        for (name, library) in [
            ("libcuda.so", Some(Library::Driver)),
            ("libcuda.so.1", Some(Library::Driver)),
            ("libcuda.so.580.159.04", Some(Library::Driver)),
            ("libcudart.so.13", Some(Library::Runtime)),
            ("libcudart.so.12.4.127", Some(Library::Runtime)),
            ("libcudart.so", Some(Library::Runtime)),
            ("libcudart_static.a", None),
            ("libcuda.sox", None),
            ("libcudnn.so.9", None),
        ] {
            assert_eq!(Library::of_file_name(name), library, "{name}");
        }
    }

    #[test]
    fn runtime_probes_attach_to_the_runtime_and_driver_probes_to_the_driver() {
        for probe in &USER_PROBES {
            let runtime = probe.symbol.starts_with("__cuda") || probe.symbol.starts_with("cuda");
            assert_eq!(
                probe.library == Library::Runtime,
                runtime,
                "{}",
                probe.symbol
            );
        }
    }

    #[test]
    fn program_names_are_unique() {
        for (i, a) in USER_PROBES.iter().enumerate() {
            assert_ne!(a.program, PROCESS_EXIT.program);
            for b in &USER_PROBES[i + 1..] {
                assert_ne!(a.program, b.program);
            }
        }
    }
}
