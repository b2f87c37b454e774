//! What can stop a capture.

/// Why the capture could not start or continue. The first five are missing prerequisites
/// (the CLI exits with status 3 for them); the rest are unexpected.
#[derive(Debug, thiserror::Error)]
pub enum CaptureError {
    /// The configured counter source cannot be opened (no NVIDIA driver, no GPU with GPM).
    /// The capture does not fall back to another source.
    #[error(
        "capture.counters = \"{counters}\" cannot be used on this host: {reason}. The agent does not fall back to another counter source; set capture.counters = \"none\" (or capture --counters none) to run without counter values"
    )]
    Counters {
        /// The configured source's name.
        counters: &'static str,
        /// Why it cannot be opened.
        reason: String,
    },
    /// Loading BPF programs and attaching uprobes needs root or CAP_BPF + CAP_PERFMON.
    #[error(
        "capture needs root (or CAP_BPF and CAP_PERFMON) to load eBPF programs; effective uid is {euid}"
    )]
    NotPrivileged {
        /// This process's effective uid.
        euid: u32,
    },
    /// The kernel exposes no BTF.
    #[error(
        "kernel BTF is missing ({}): a kernel built with CONFIG_DEBUG_INFO_BTF is needed",
        super::loader::KERNEL_BTF
    )]
    NoBtf,
    /// tracefs is not mounted and could not be mounted.
    #[error(
        "tracefs is not mounted at {} and mounting it failed (mount -t tracefs nodev {})",
        super::loader::TRACEFS,
        super::loader::TRACEFS
    )]
    NoTracefs,
    /// The kernel refused the object.
    #[error("the kernel refused the eBPF object: {0}")]
    Load(#[source] Box<aya::EbpfError>),
    /// A program failed to load, attach or detach.
    #[error("eBPF program {program}: {source}")]
    Program {
        /// Program name.
        program: &'static str,
        /// aya's error.
        #[source]
        source: Box<aya::programs::ProgramError>,
    },
    /// The object lacks a program the table names (an object from another build).
    #[error("the eBPF object has no program {0}")]
    MissingProgram(&'static str),
    /// The object lacks a map.
    #[error("the eBPF object has no map {0}")]
    MissingMap(&'static str),
    /// BPF run-time statistics could not be enabled.
    #[error("enabling BPF run-time statistics: {0}")]
    Stats(String),
    /// The start-up measurement of the probe cost could not run.
    #[error("probe-cost calibration: {0}")]
    Calibration(String),
    /// The sampling countdown could not be seeded.
    #[error("seeding the sampling countdown: {0}")]
    Sampling(String),
    /// A map operation failed.
    #[error("eBPF map: {0}")]
    Map(#[source] aya::maps::MapError),
}

impl CaptureError {
    /// A prerequisite of the host is missing (as opposed to a fault): the operator must act.
    pub fn is_missing_prerequisite(&self) -> bool {
        matches!(
            self,
            Self::Counters { .. }
                | Self::NotPrivileged { .. }
                | Self::NoBtf
                | Self::NoTracefs
                | Self::Load(_)
        )
    }
}
