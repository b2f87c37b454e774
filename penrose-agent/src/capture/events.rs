//! Ring-buffer records decoded, and the per-process state they build.
//!
//! Records are read as bytes with explicit offsets (the layouts `penrose_ebpf_common` pins),
//! so a short or unknown record is counted and skipped instead of trusted.

use std::collections::HashMap;
use std::sync::Arc;

use penrose_ebpf_common::{
    EntryPoint, EventKind, ExitEvent, HandleKind, KernelFunctionEvent, LaunchEvent, NameHeader,
};

/// A process id (tgid), as the kernel reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub struct Pid(pub u32);

/// One decoded ring-buffer record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// A kernel or graph launch.
    Launch(Launch),
    /// A function (`cuModuleGetFunction`) or kernel (`cuLibraryGetKernel`) handle's name.
    Name {
        /// Process.
        pid: Pid,
        /// Function or kernel handle.
        kind: HandleKind,
        /// The handle value.
        handle: u64,
        /// The name (lossily decoded: kernel names are ASCII in practice).
        name: String,
        /// The BPF side cut it at its capacity.
        truncated: bool,
    },
    /// `cuKernelGetFunction`: launches of `function` are launches of `kernel`.
    KernelFunction {
        /// Process.
        pid: Pid,
        /// `CUkernel`.
        kernel: u64,
        /// `CUfunction`.
        function: u64,
    },
    /// A process exited.
    Exit {
        /// Process.
        pid: Pid,
    },
}

/// The fields of a launch record the agent uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Launch {
    /// Process.
    pub pid: Pid,
    /// Thread.
    pub tid: u32,
    /// Marked by the BPF sampling countdown.
    pub sampled: bool,
    /// `bpf_ktime_get_ns`.
    pub timestamp_ns: u64,
    /// `CUfunction` (the `CUgraphExec` for a graph launch).
    pub function: u64,
    /// `CUstream`.
    pub stream: u64,
    /// Grid dimensions.
    pub grid: [u32; 3],
    /// Block dimensions.
    pub block: [u32; 3],
    /// Dynamic shared memory, bytes.
    pub shared_mem_bytes: u32,
    /// Which entry point was called.
    pub entry: EntryPoint,
}

/// Decodes one record; `None` for a short, malformed or unknown one.
pub fn decode(record: &[u8]) -> Option<Event> {
    match EventKind::of_record(record)? {
        EventKind::Launch => {
            let e = LaunchEvent::parse(record)?;
            Some(Event::Launch(Launch {
                pid: Pid(e.pid),
                tid: e.tid,
                sampled: e.sampled != 0,
                timestamp_ns: e.timestamp_ns,
                function: e.function,
                stream: e.stream,
                grid: e.grid,
                block: e.block,
                shared_mem_bytes: e.shared_mem_bytes,
                entry: EntryPoint::from_u32(e.entry_point)?,
            }))
        }
        EventKind::Name => {
            let (header, name) = NameHeader::parse(record)?;
            Some(Event::Name {
                pid: Pid(header.pid),
                kind: HandleKind::from_u32(header.handle_kind)?,
                handle: header.handle,
                name: String::from_utf8_lossy(name).into_owned(),
                truncated: header.truncated != 0,
            })
        }
        EventKind::KernelFunction => {
            let e = KernelFunctionEvent::parse(record)?;
            Some(Event::KernelFunction {
                pid: Pid(e.pid),
                kernel: e.kernel,
                function: e.function,
            })
        }
        EventKind::Exit => Some(Event::Exit {
            pid: Pid(ExitEvent::parse(record)?.pid),
        }),
    }
}

/// What one process has told the name probes: which handle is which kernel.
#[derive(Debug, Default)]
pub struct ProcessNames {
    functions: HashMap<u64, Arc<str>>,
    kernels: HashMap<u64, Arc<str>>,
}

impl ProcessNames {
    /// Records a name event.
    pub fn learn(&mut self, kind: HandleKind, handle: u64, name: &str) {
        let map = match kind {
            HandleKind::Function => &mut self.functions,
            HandleKind::Kernel => &mut self.kernels,
        };
        map.insert(handle, Arc::from(name));
    }

    /// Joins a library kernel's name to the function handle launches will carry. Returns
    /// false when the kernel's name was never seen (resolved before the agent attached).
    pub fn link(&mut self, kernel: u64, function: u64) -> bool {
        match self.kernels.get(&kernel) {
            Some(name) => {
                self.functions.insert(function, Arc::clone(name));
                true
            }
            None => false,
        }
    }

    /// The name a launch's function handle was resolved from.
    pub fn function(&self, handle: u64) -> Option<&Arc<str>> {
        self.functions.get(&handle)
    }

    /// Distinct function handles named.
    pub fn len(&self) -> usize {
        self.functions.len()
    }

    /// No function named yet.
    pub fn is_empty(&self) -> bool {
        self.functions.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn launch_record(pid: u32, function: u64, entry: u32) -> Vec<u8> {
        let mut r = vec![0u8; 72];
        r[0..4].copy_from_slice(&1u32.to_ne_bytes());
        r[4..8].copy_from_slice(&pid.to_ne_bytes());
        r[8..12].copy_from_slice(&(pid + 1).to_ne_bytes());
        r[12..16].copy_from_slice(&1u32.to_ne_bytes());
        r[16..24].copy_from_slice(&77u64.to_ne_bytes());
        r[24..32].copy_from_slice(&function.to_ne_bytes());
        r[32..40].copy_from_slice(&0x5e00u64.to_ne_bytes());
        for (i, v) in [1u32, 2, 3, 32, 4, 1, 4096].iter().enumerate() {
            r[40 + 4 * i..44 + 4 * i].copy_from_slice(&v.to_ne_bytes());
        }
        r[68..72].copy_from_slice(&entry.to_ne_bytes());
        r
    }

    #[test]
    fn launch_records_decode_field_by_field() {
        let Some(Event::Launch(l)) = decode(&launch_record(42, 0xabc, 2)) else {
            panic!("not a launch");
        };
        assert_eq!(l.pid, Pid(42));
        assert_eq!(l.tid, 43);
        assert!(l.sampled);
        assert_eq!(l.timestamp_ns, 77);
        assert_eq!(l.function, 0xabc);
        assert_eq!(l.stream, 0x5e00);
        assert_eq!(l.grid, [1, 2, 3]);
        assert_eq!(l.block, [32, 4, 1]);
        assert_eq!(l.shared_mem_bytes, 4096);
        assert_eq!(l.entry, EntryPoint::LaunchKernelEx);
    }

    #[test]
    fn short_or_unknown_records_are_rejected() {
        let r = launch_record(1, 2, 0);
        assert_eq!(decode(&r[..71]), None);
        assert_eq!(decode(&launch_record(1, 2, 99)), None);
        let mut unknown = r.clone();
        unknown[0] = 9;
        assert_eq!(decode(&unknown), None);
        assert_eq!(decode(&[]), None);
    }

    #[test]
    fn exit_and_kernel_function_records_decode() {
        let mut exit = vec![0u8; 16];
        exit[0] = 3;
        exit[4..8].copy_from_slice(&7u32.to_ne_bytes());
        assert_eq!(decode(&exit), Some(Event::Exit { pid: Pid(7) }));
        let mut kf = vec![0u8; 40];
        kf[0] = 4;
        kf[4..8].copy_from_slice(&7u32.to_ne_bytes());
        kf[24..32].copy_from_slice(&11u64.to_ne_bytes());
        kf[32..40].copy_from_slice(&12u64.to_ne_bytes());
        assert_eq!(
            decode(&kf),
            Some(Event::KernelFunction {
                pid: Pid(7),
                kernel: 11,
                function: 12
            })
        );
    }

    #[test]
    fn library_kernels_name_their_functions_only_once_linked() {
        let mut names = ProcessNames::default();
        names.learn(HandleKind::Kernel, 1, "gemm");
        assert_eq!(names.function(100), None);
        assert!(names.link(1, 100));
        assert!(!names.link(2, 200));
        assert_eq!(names.function(100).map(|n| &**n), Some("gemm"));
        names.learn(HandleKind::Function, 300, "relu");
        assert_eq!(names.function(300).map(|n| &**n), Some("relu"));
        assert_eq!(names.len(), 2);
    }
}
