//! Ring-buffer records decoded, and the per-process state they build.
//!
//! Records are read as bytes with explicit offsets (the layouts `penrose_ebpf_common` pins),
//! so a short or unknown record is counted and skipped instead of trusted.

use std::collections::HashMap;
use std::sync::Arc;

use penrose_ebpf_common::{
    ContextEvent, ContextOp, EntryPoint, EventKind, ExitEvent, GraphEvent, GraphOp, HandleKind,
    KernelFunctionEvent, LaunchEvent, NameHeader, RuntimeLaunchEvent, StubKernelEvent,
};

use super::graphs::{GraphChange, KernelNode};

/// Most handles (functions, kernels and stubs together) named per process; beyond it new
/// names are dropped and counted, so a process registering names without end cannot grow the
/// agent without end.
pub const MAX_NAMES_PER_PROCESS: usize = 131_072;

/// Most bytes of names kept per process (a name's bytes are shared by the handles it names).
pub const MAX_NAME_BYTES_PER_PROCESS: usize = 32 << 20;

/// Most bytes of names all processes' tables hold together: many processes, each near its own
/// bound, cannot grow the agent past it (a large training job's framework names a few MiB).
pub const MAX_NAME_BYTES_PER_HOST: usize = 128 << 20;

/// The bytes of names every process's table holds, against [`MAX_NAME_BYTES_PER_HOST`]: shared
/// by the tables of one capture, each giving its bytes back when its process exits.
#[derive(Clone, Debug)]
pub struct NameBudget {
    held: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    limit: usize,
}

impl Default for NameBudget {
    fn default() -> Self {
        Self::new(MAX_NAME_BYTES_PER_HOST)
    }
}

impl NameBudget {
    /// A budget of `limit` bytes.
    pub fn new(limit: usize) -> Self {
        Self {
            held: std::sync::Arc::default(),
            limit,
        }
    }

    /// Bytes held now, all tables together.
    pub fn held(&self) -> usize {
        self.held.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Takes `len` bytes if they fit.
    fn take(&self, len: usize) -> bool {
        use std::sync::atomic::Ordering;
        self.held
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |held| {
                held.checked_add(len).filter(|&total| total <= self.limit)
            })
            .is_ok()
    }

    fn give_back(&self, len: usize) {
        use std::sync::atomic::Ordering;
        let _ = self
            .held
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |held| {
                Some(held.saturating_sub(len))
            });
    }
}

/// A process id (tgid), as the kernel reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub struct Pid(pub u32);

/// A name record's name: read by the probe, or only located (the probe cannot fault a page
/// in; the agent reads such a name from the process, see [`super::memory`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NameText {
    /// The probe read it.
    Read {
        /// The name (lossily decoded: kernel names are ASCII in practice).
        name: String,
        /// The BPF side cut it at its capacity.
        truncated: bool,
    },
    /// The probe could not read it; it lies at `address` in the process.
    Unread {
        /// The name's address in the process's memory.
        address: u64,
    },
}

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
        /// The name, or where to read it.
        name: NameText,
    },
    /// `__cudaGetKernel`: the host stub `stub` launches through the kernel handle `kernel`.
    StubKernel {
        /// Process.
        pid: Pid,
        /// Host stub address.
        stub: u64,
        /// `CUkernel`, what driver launches then carry.
        kernel: u64,
    },
    /// `cudaLaunchKernel(function, ...)` on thread `tid`: the next launch of that thread is of
    /// `function` (a host stub on the legacy path).
    RuntimeLaunch {
        /// Process.
        pid: Pid,
        /// Thread.
        tid: u32,
        /// The runtime's `func` argument.
        function: u64,
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
    /// A driver call that bears on which device a thread's launches run on.
    Context(super::devices::ContextChange),
    /// A CUDA graph call: capture, nodes, instantiation, updates, destruction.
    Graph(GraphChange),
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
    /// For a sampled graph launch record, the position among the graph's kernels of the one
    /// the countdown fell on; for a kernel of an expanded graph launch, its own position in the
    /// graph; zero otherwise.
    pub graph_position: u32,
    /// A kernel of an expanded graph launch (the launch record was the graph's).
    pub in_graph: bool,
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
    /// The return address into the code that called the driver (zero when unreadable).
    pub caller: u64,
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
                graph_position: e.sampled.saturating_sub(1),
                in_graph: false,
                timestamp_ns: e.timestamp_ns,
                function: e.function,
                stream: e.stream,
                grid: e.grid,
                block: e.block,
                shared_mem_bytes: e.shared_mem_bytes,
                entry: EntryPoint::from_u32(e.entry_point)?,
                caller: e.caller,
            }))
        }
        EventKind::Name => {
            let (header, name) = NameHeader::parse(record)?;
            Some(Event::Name {
                pid: Pid(header.pid),
                kind: HandleKind::from_u32(header.handle_kind)?,
                handle: header.handle,
                name: if header.unread != 0 {
                    NameText::Unread {
                        address: header.address,
                    }
                } else {
                    NameText::Read {
                        name: String::from_utf8_lossy(name).into_owned(),
                        truncated: header.truncated != 0,
                    }
                },
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
        EventKind::StubKernel => {
            let e = StubKernelEvent::parse(record)?;
            Some(Event::StubKernel {
                pid: Pid(e.pid),
                stub: e.stub,
                kernel: e.kernel,
            })
        }
        EventKind::RuntimeLaunch => {
            let e = RuntimeLaunchEvent::parse(record)?;
            Some(Event::RuntimeLaunch {
                pid: Pid(e.pid),
                tid: e.tid,
                function: e.function,
            })
        }
        EventKind::Exit => Some(Event::Exit {
            pid: Pid(ExitEvent::parse(record)?.pid),
        }),
        EventKind::Context => {
            let e = ContextEvent::parse(record)?;
            Some(Event::Context(super::devices::ContextChange {
                pid: Pid(e.pid),
                tid: e.tid,
                op: ContextOp::from_u32(e.op)?,
                handle: e.handle,
                device: e.device,
                uuid: e.uuid,
            }))
        }
        EventKind::Graph => decode_graph(record).map(Event::Graph),
    }
}

/// A graph record; `None` for a short one or an unknown operation.
fn decode_graph(record: &[u8]) -> Option<GraphChange> {
    let e = GraphEvent::parse(record)?;
    Some(GraphChange {
        pid: Pid(e.pid),
        tid: e.tid,
        op: GraphOp::from_u32(e.op)?,
        timestamp_ns: e.timestamp_ns,
        graph: e.graph,
        exec: e.exec,
        stream: e.stream,
        node: KernelNode {
            node: e.node,
            function: e.function,
            kernel: e.kernel,
            grid: e.grid,
            block: e.block,
            shared_mem_bytes: e.shared_mem_bytes,
        },
    })
}

impl Launch {
    /// A graph launch not expanded into its kernels: one `<graph>` element.
    pub fn is_opaque_graph(&self) -> bool {
        self.entry.is_graph() && !self.in_graph
    }

    /// Kernel `index` of this graph launch, as `node` launches it.
    pub fn graph_kernel(&self, index: usize, node: &KernelNode) -> Self {
        Self {
            sampled: self.sampled && index == self.graph_position as usize,
            graph_position: u32::try_from(index).unwrap_or(u32::MAX),
            in_graph: true,
            function: match node.function {
                0 => node.kernel,
                function => function,
            },
            grid: node.grid,
            block: node.block,
            shared_mem_bytes: node.shared_mem_bytes,
            ..*self
        }
    }
}

/// What one process has told the name probes: which handle is which kernel.
///
/// Three sources join into the names of the handles launches carry (`functions`): the
/// driver's `cuModuleGetFunction` names a function directly; `cuLibraryGetKernel` names a
/// kernel that `cuKernelGetFunction` maps to a function; and the CUDA runtime registers host
/// stubs by name, which `__cudaGetKernel` maps to the kernel handle the driver then receives,
/// or (legacy path) which `cudaLaunchKernel` passes right before the driver launch on the same
/// thread. Bounded by [`MAX_NAMES_PER_PROCESS`] and [`MAX_NAME_BYTES_PER_PROCESS`], and with
/// every other table of its budget by [`MAX_NAME_BYTES_PER_HOST`].
#[derive(Debug, Default)]
pub struct ProcessNames {
    budget: NameBudget,
    functions: HashMap<u64, Arc<str>>,
    kernels: HashMap<u64, Arc<str>>,
    stubs: HashMap<u64, Arc<str>>,
    /// Per thread, the `func` of its last `cudaLaunchKernel` not yet matched to a launch.
    runtime_launch: HashMap<u32, u64>,
    bytes: usize,
    dropped: u64,
}

impl Drop for ProcessNames {
    fn drop(&mut self) {
        self.budget.give_back(self.bytes);
    }
}

impl ProcessNames {
    /// An empty table whose bytes count against `budget` (the capture's, shared by all
    /// processes).
    pub fn sharing(budget: &NameBudget) -> Self {
        let mut names = Self::default();
        names.budget = budget.clone();
        names
    }

    /// Records a name event.
    pub fn learn(&mut self, kind: HandleKind, handle: u64, name: &str) {
        let Some(name) = self.admit(name.len()).then(|| Arc::from(name)) else {
            return;
        };
        let map = match kind {
            HandleKind::Function => &mut self.functions,
            HandleKind::Kernel => &mut self.kernels,
            HandleKind::Stub => &mut self.stubs,
        };
        map.insert(handle, name);
    }

    /// Whether one more handle, with a name of `len` new bytes, fits the bounds; counts it as
    /// dropped when it does not.
    fn admit(&mut self, len: usize) -> bool {
        let handles = self.functions.len() + self.kernels.len() + self.stubs.len();
        if handles >= MAX_NAMES_PER_PROCESS
            || self.bytes + len > MAX_NAME_BYTES_PER_PROCESS
            || !self.budget.take(len)
        {
            self.dropped += 1;
            return false;
        }
        self.bytes += len;
        true
    }

    /// Names a handle launches carry after another's name, if there is room.
    fn alias(&mut self, function: u64, name: Arc<str>) {
        if self.functions.contains_key(&function) || self.admit(0) {
            self.functions.insert(function, name);
        }
    }

    /// Joins a library kernel's name to the function handle launches will carry. Returns
    /// false when the kernel's name was never seen (resolved before the agent attached).
    pub fn link(&mut self, kernel: u64, function: u64) -> bool {
        match self.kernels.get(&kernel).cloned() {
            Some(name) => {
                self.alias(function, name);
                true
            }
            None => false,
        }
    }

    /// Joins a registered stub's name to the kernel handle `__cudaGetKernel` gave for it,
    /// which driver launches carry. False when the stub's registration was not seen (it ran
    /// before the agent attached).
    pub fn link_stub(&mut self, stub: u64, kernel: u64) -> bool {
        match self.stubs.get(&stub).cloned() {
            Some(name) => {
                self.alias(kernel, name);
                true
            }
            None => false,
        }
    }

    /// `cudaLaunchKernel(function)` on thread `tid`; the thread's next launch is matched by
    /// [`launch`](Self::launch).
    pub fn runtime_launch(&mut self, tid: u32, function: u64) {
        self.runtime_launch.insert(tid, function);
    }

    /// A driver launch of `function` on `tid`: when the thread's pending runtime launch passed
    /// a registered stub (the legacy path), the stub's name becomes `function`'s. Returns the
    /// name the launch has now.
    pub fn launch(&mut self, tid: u32, function: u64) -> Option<&Arc<str>> {
        if let Some(passed) = self.runtime_launch.remove(&tid)
            && !self.functions.contains_key(&function)
            && let Some(name) = self.stubs.get(&passed).cloned()
        {
            self.alias(function, name);
        }
        self.functions.get(&function)
    }

    /// Forgets runtime launches not matched to a driver launch (a window closed between
    /// them), so that none can name a launch of a later window.
    pub fn forget_runtime_launches(&mut self) {
        self.runtime_launch.clear();
    }

    /// Names not kept because the bounds were reached.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    /// The name of a graph's kernel node by the handle it launches: a `CUfunction`, or the
    /// `CUkernel` of v2 parameters without one. Unlike [`launch`](Self::launch), pairs nothing with runtime calls.
    pub fn node(&self, handle: u64) -> Option<&Arc<str>> {
        self.functions
            .get(&handle)
            .or_else(|| self.kernels.get(&handle))
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
        let mut r = vec![0u8; 80];
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
        r[72..80].copy_from_slice(&0x7f00_1234u64.to_ne_bytes());
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
        assert_eq!(l.caller, 0x7f00_1234);
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

    #[test]
    fn runtime_stubs_name_the_kernel_handles_get_kernel_hands_out() {
        // CUDA >= 12.4: registration names the stub, __cudaGetKernel maps it to the handle
        // the driver's launch then carries.
        let mut names = ProcessNames::default();
        names.learn(HandleKind::Stub, 0x4000, "_Z6kernelPf");
        assert!(names.link_stub(0x4000, 0x9000));
        assert!(
            !names.link_stub(0x5000, 0x9100),
            "an unregistered stub names nothing"
        );
        assert_eq!(names.launch(7, 0x9000).map(|n| &**n), Some("_Z6kernelPf"));
        assert_eq!(names.launch(7, 0x9100), None);
    }

    #[test]
    fn legacy_runtime_launches_name_the_next_driver_launch_of_their_thread() {
        let mut names = ProcessNames::default();
        names.learn(HandleKind::Stub, 0x4000, "_Z4axpyPf");
        // Thread 7 passes the stub itself; its next driver launch carries handle 0x7777.
        names.runtime_launch(7, 0x4000);
        // Another thread's launch in between is not matched to it.
        assert_eq!(names.launch(8, 0x1234), None);
        assert_eq!(names.launch(7, 0x7777).map(|n| &**n), Some("_Z4axpyPf"));
        // Once learned, the handle stays named without the runtime probe.
        assert_eq!(names.launch(7, 0x7777).map(|n| &**n), Some("_Z4axpyPf"));
        // A runtime launch of something that is no stub names nothing.
        names.runtime_launch(7, 0xdead);
        assert_eq!(names.launch(7, 0x8888), None);
    }

    /// Many processes, each within its own bound, share the host's: once the tables hold the
    /// host's bytes, new names are dropped and counted, and an exited process's bytes are
    /// given back.
    #[test]
    fn names_of_all_processes_together_are_bounded_by_the_host_budget() {
        let budget = NameBudget::new(100);
        let mut first = ProcessNames::sharing(&budget);
        let mut second = ProcessNames::sharing(&budget);
        first.learn(HandleKind::Function, 1, &"a".repeat(60));
        second.learn(HandleKind::Function, 2, &"b".repeat(60));
        assert_eq!((first.len(), second.len(), second.dropped()), (1, 0, 1));
        assert_eq!(budget.held(), 60);
        second.learn(HandleKind::Function, 3, &"c".repeat(40));
        assert_eq!((second.len(), budget.held()), (1, 100));
        drop(first);
        assert_eq!(budget.held(), 40);
        second.learn(HandleKind::Function, 4, &"d".repeat(60));
        assert_eq!((second.len(), budget.held()), (2, 100));
    }

    #[test]
    fn names_per_process_are_bounded_and_drops_counted() {
        let mut names = ProcessNames::default();
        for handle in 0..MAX_NAMES_PER_PROCESS as u64 + 10 {
            names.learn(HandleKind::Function, handle, "k");
        }
        assert_eq!(names.len(), MAX_NAMES_PER_PROCESS);
        assert_eq!(names.dropped(), 10);
        let mut big = ProcessNames::default();
        let long = "x".repeat(1 << 20);
        for handle in 0..40 {
            big.learn(HandleKind::Stub, handle, &long);
        }
        assert_eq!(
            big.dropped(),
            40 - (MAX_NAME_BYTES_PER_PROCESS >> 20) as u64
        );
    }
}
