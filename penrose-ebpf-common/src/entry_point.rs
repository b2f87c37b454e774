//! The launch entry points of the CUDA driver, as carried in [`crate::LaunchEvent`].

use crate::probes::programs;

/// Launch entry points, as carried in [`crate::LaunchEvent::entry_point`].
///
/// The discriminant is the wire value; new entry points get new values, old ones keep theirs.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EntryPoint {
    /// `cuLaunchKernel`.
    LaunchKernel = 0,
    /// `cuLaunchKernel_ptsz`.
    LaunchKernelPtsz = 1,
    /// `cuLaunchKernelEx`: grid, block, shared memory and stream come from a `CUlaunchConfig`.
    LaunchKernelEx = 2,
    /// `cuLaunchKernelEx_ptsz`.
    LaunchKernelExPtsz = 3,
    /// `cuLaunchCooperativeKernel`: `cuLaunchKernel`'s arguments without `extra`.
    LaunchCooperativeKernel = 4,
    /// `cuLaunchCooperativeKernel_ptsz`.
    LaunchCooperativeKernelPtsz = 5,
    /// `cuGraphLaunch`: one event for a whole graph; the function field holds the
    /// `CUgraphExec` handle and grid, block and shared memory are zero.
    GraphLaunch = 6,
    /// `cuGraphLaunch_ptsz`.
    GraphLaunchPtsz = 7,
}

impl EntryPoint {
    /// Every entry point, in wire-value order.
    pub const ALL: [Self; 8] = [
        Self::LaunchKernel,
        Self::LaunchKernelPtsz,
        Self::LaunchKernelEx,
        Self::LaunchKernelExPtsz,
        Self::LaunchCooperativeKernel,
        Self::LaunchCooperativeKernelPtsz,
        Self::GraphLaunch,
        Self::GraphLaunchPtsz,
    ];

    /// The driver symbol this entry point is attached to.
    pub const fn symbol(self) -> &'static str {
        match self {
            Self::LaunchKernel => "cuLaunchKernel",
            Self::LaunchKernelPtsz => "cuLaunchKernel_ptsz",
            Self::LaunchKernelEx => "cuLaunchKernelEx",
            Self::LaunchKernelExPtsz => "cuLaunchKernelEx_ptsz",
            Self::LaunchCooperativeKernel => "cuLaunchCooperativeKernel",
            Self::LaunchCooperativeKernelPtsz => "cuLaunchCooperativeKernel_ptsz",
            Self::GraphLaunch => "cuGraphLaunch",
            Self::GraphLaunchPtsz => "cuGraphLaunch_ptsz",
        }
    }

    /// The program in the compiled object that probes this entry point.
    pub const fn program(self) -> &'static str {
        match self {
            Self::LaunchKernel => programs::CU_LAUNCH_KERNEL,
            Self::LaunchKernelPtsz => programs::CU_LAUNCH_KERNEL_PTSZ,
            Self::LaunchKernelEx => programs::CU_LAUNCH_KERNEL_EX,
            Self::LaunchKernelExPtsz => programs::CU_LAUNCH_KERNEL_EX_PTSZ,
            Self::LaunchCooperativeKernel => programs::CU_LAUNCH_COOPERATIVE_KERNEL,
            Self::LaunchCooperativeKernelPtsz => programs::CU_LAUNCH_COOPERATIVE_KERNEL_PTSZ,
            Self::GraphLaunch => programs::CU_GRAPH_LAUNCH,
            Self::GraphLaunchPtsz => programs::CU_GRAPH_LAUNCH_PTSZ,
        }
    }

    /// True for graph launches, whose event names a graph rather than one kernel.
    pub const fn is_graph(self) -> bool {
        matches!(self, Self::GraphLaunch | Self::GraphLaunchPtsz)
    }

    /// Decodes [`crate::LaunchEvent::entry_point`]; `None` for a value this build does not know.
    pub const fn from_u32(value: u32) -> Option<Self> {
        match value {
            0 => Some(Self::LaunchKernel),
            1 => Some(Self::LaunchKernelPtsz),
            2 => Some(Self::LaunchKernelEx),
            3 => Some(Self::LaunchKernelExPtsz),
            4 => Some(Self::LaunchCooperativeKernel),
            5 => Some(Self::LaunchCooperativeKernelPtsz),
            6 => Some(Self::GraphLaunch),
            7 => Some(Self::GraphLaunchPtsz),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_points_round_trip_through_their_wire_value() {
        for (index, entry) in EntryPoint::ALL.into_iter().enumerate() {
            assert_eq!(entry as u32 as usize, index);
            assert_eq!(EntryPoint::from_u32(entry as u32), Some(entry));
            assert!(entry.symbol().starts_with("cu"));
        }
        assert_eq!(EntryPoint::from_u32(EntryPoint::ALL.len() as u32), None);
        assert_eq!(EntryPoint::from_u32(u32::MAX), None);
    }

    #[test]
    fn per_thread_stream_variants_differ_only_by_suffix() {
        for pair in EntryPoint::ALL.chunks(2) {
            let (plain, ptsz) = (pair[0], pair[1]);
            assert_eq!(ptsz.symbol().strip_suffix("_ptsz"), Some(plain.symbol()));
            assert_eq!(ptsz.program().strip_suffix("_ptsz"), Some(plain.program()));
            assert_eq!(plain.is_graph(), ptsz.is_graph());
        }
    }

    #[test]
    fn only_graph_launches_are_graphs() {
        let graphs: usize = EntryPoint::ALL.iter().filter(|e| e.is_graph()).count();
        assert_eq!(graphs, 2);
        assert!(EntryPoint::GraphLaunch.symbol().starts_with("cuGraph"));
    }
}
