//! Which program attaches where: the table the loader iterates.
//!
//! Launch probes are attached only inside capture windows; name probes and the exit
//! tracepoint stay attached (DESIGN.md section 3), so each entry says its [`ProbeRole`].

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
    /// Tracepoint `sched:sched_process_exit`.
    pub const SCHED_PROCESS_EXIT: &str = "sched_process_exit";
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
}

/// One program of the object and the libcuda symbol it attaches to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UserProbe {
    /// Program name in the object.
    pub program: &'static str,
    /// Exported symbol in libcuda.
    pub symbol: &'static str,
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
            kind: ProbeKind::Uprobe,
            role: ProbeRole::Launch,
        }
    }

    const fn name(program: &'static str, symbol: &'static str, kind: ProbeKind) -> Self {
        Self {
            program,
            symbol,
            kind,
            role: ProbeRole::Name,
        }
    }
}

/// Every uprobe and uretprobe in the object: eight launch probes, then an entry and a return
/// probe for each of the three name functions.
pub const USER_PROBES: [UserProbe; 14] = [
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
    fn program_names_are_unique() {
        for (i, a) in USER_PROBES.iter().enumerate() {
            assert_ne!(a.program, PROCESS_EXIT.program);
            for b in &USER_PROBES[i + 1..] {
                assert_ne!(a.program, b.program);
            }
        }
    }
}
