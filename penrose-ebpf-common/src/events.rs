//! Records that cross the ring buffer. Every record starts with its [`EventKind`] as a `u32`,
//! so the reader looks at four bytes before it knows the rest of the layout.

use core::mem::size_of;

/// Sampling settings the agent writes into [`crate::maps::SAMPLE_CONFIG`].
///
/// Counting happens in BPF so that user space sees which launch was sampled without having
/// to receive (or count) every launch itself.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SampleConfig {
    /// Sample one launch in `period` on each CPU; 0 disables sampling.
    pub period: u64,
}

/// What a ring-buffer record describes; the first field of every record.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventKind {
    /// A [`LaunchEvent`]: a kernel (or graph) launch through one of the launch entry points.
    Launch = 1,
    /// A [`NameHeader`] and its name bytes: a function or kernel handle resolved to a name.
    Name = 2,
    /// An [`ExitEvent`]: a process exited; its per-process state can be dropped.
    Exit = 3,
    /// A [`KernelFunctionEvent`]: a `CUkernel` handle's `CUfunction` in the current context.
    KernelFunction = 4,
    /// A [`StubKernelEvent`]: the CUDA runtime handed out a `CUkernel` for a host stub
    /// (`__cudaGetKernel`, CUDA 12.4 and later).
    StubKernel = 5,
    /// A [`RuntimeLaunchEvent`]: `cudaLaunchKernel` was called; the driver launch that follows
    /// on the same thread is of the function it names.
    RuntimeLaunch = 6,
    /// A [`ContextEvent`]: a driver call that changes which device a thread's launches run on
    /// (contexts made current, pushed, popped or created, streams created, device UUIDs asked).
    Context = 7,
    /// A [`crate::GraphEvent`]: a CUDA graph call (stream capture, kernel nodes,
    /// instantiation, updates, destruction).
    Graph = 8,
}

impl EventKind {
    /// Decodes a wire value; `None` for a kind this build does not know.
    pub const fn from_u32(value: u32) -> Option<Self> {
        match value {
            1 => Some(Self::Launch),
            2 => Some(Self::Name),
            3 => Some(Self::Exit),
            4 => Some(Self::KernelFunction),
            5 => Some(Self::StubKernel),
            6 => Some(Self::RuntimeLaunch),
            7 => Some(Self::Context),
            8 => Some(Self::Graph),
            _ => None,
        }
    }

    /// The kind of a raw ring-buffer record; `None` when it is shorter than four bytes or of
    /// an unknown kind.
    pub fn of_record(record: &[u8]) -> Option<Self> {
        Self::from_u32(read_u32(record, 0)?)
    }
}

/// One kernel launch as the uprobe saw it.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LaunchEvent {
    /// Always [`EventKind::Launch`] as `u32`.
    pub kind: u32,
    /// Process id (tgid) of the launching process.
    pub pid: u32,
    /// Thread id of the launching thread.
    pub tid: u32,
    /// Non-zero when the BPF-side countdown marked this launch for sampling: 1 for a kernel
    /// launch; for a graph launch, one more than the position of the sampled kernel among the
    /// graph's kernels (the countdown counts a graph's kernels, [`crate::GraphKey`]).
    pub sampled: u32,
    /// `bpf_ktime_get_ns` at the probe.
    pub timestamp_ns: u64,
    /// The `CUfunction` handle, or the `CUgraphExec` handle for graph launches
    /// ([`crate::EntryPoint::is_graph`]).
    pub function: u64,
    /// The `CUstream` handle.
    pub stream: u64,
    /// Grid dimensions (zero for graph launches).
    pub grid: [u32; 3],
    /// Block dimensions (zero for graph launches).
    pub block: [u32; 3],
    /// Dynamic shared memory in bytes (zero for graph launches).
    pub shared_mem_bytes: u32,
    /// Which entry point fired: a [`crate::EntryPoint`] wire value.
    pub entry_point: u32,
    /// The return address at entry: where in the caller's code the launch was made (zero
    /// when unreadable). Names no kernel, but its object's build id identifies launches that
    /// no name reaches.
    pub caller: u64,
}

/// Which kind of driver handle a [`NameHeader`] names.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HandleKind {
    /// A `CUfunction`, from `cuModuleGetFunction`; launch events carry these.
    Function = 1,
    /// A `CUkernel`, from `cuLibraryGetKernel`; a [`KernelFunctionEvent`] maps it to the
    /// `CUfunction` that launches carry.
    Kernel = 2,
    /// A host stub's address, from the CUDA runtime's `__cudaRegisterFunction`; a
    /// [`StubKernelEvent`] or a [`RuntimeLaunchEvent`] joins it to what launches carry.
    Stub = 3,
}

impl HandleKind {
    /// Decodes [`NameHeader::handle_kind`].
    pub const fn from_u32(value: u32) -> Option<Self> {
        match value {
            1 => Some(Self::Function),
            2 => Some(Self::Kernel),
            3 => Some(Self::Stub),
            _ => None,
        }
    }
}

/// Longest name a [`NameEvent`] holds, including the terminating NUL the kernel writes.
///
/// Demangled PyTorch kernel names in the reference traces reach 1,956 bytes (the median is
/// about 200, and 40% exceed 255), and a 256-byte bound would cut many templated names to a
/// shared prefix. Names longer than `NAME_CAPACITY - 1` bytes are cut to that length and
/// flagged [`NameHeader::truncated`]. Records carry only the bytes used, so the bound costs
/// per-CPU scratch space, not ring-buffer space.
pub const NAME_CAPACITY: usize = 2048;

/// The fixed part of a name record; `name_len` name bytes (no NUL) follow it directly.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NameHeader {
    /// Always [`EventKind::Name`] as `u32`.
    pub kind: u32,
    /// Process id (tgid): handles are per process.
    pub pid: u32,
    /// Thread id of the resolving thread.
    pub tid: u32,
    /// A [`HandleKind`] wire value.
    pub handle_kind: u32,
    /// `bpf_ktime_get_ns` at the function's return.
    pub timestamp_ns: u64,
    /// The handle the driver wrote to the caller's out-pointer.
    pub handle: u64,
    /// Where the name lies in the process's memory. An unread record carries only this, so
    /// that user space can read the name from the (still running) process instead.
    pub address: u64,
    /// Name bytes that follow the header, without the NUL.
    pub name_len: u32,
    /// Non-zero when the name filled the buffer, so it may have been longer than
    /// `NAME_CAPACITY - 1` bytes (a name of exactly that length is flagged too).
    pub truncated: u32,
    /// Non-zero when the probe could not read the name (no bytes follow). A probe cannot
    /// fault pages in: the names of a large library that registers its kernels at load lie in
    /// pages nobody has touched yet (seen on a real CUDA 13 stack, most of PyTorch's names).
    pub unread: u32,
    /// Zero; keeps the header a multiple of 8 bytes.
    pub reserved: u32,
}

impl NameHeader {
    /// Size of the header in a record; the name starts here.
    pub const SIZE: usize = size_of::<Self>();

    /// Splits a name record into its header and its name bytes. `None` when the record is
    /// not a name record or is shorter than its header says.
    pub fn parse(record: &[u8]) -> Option<(Self, &[u8])> {
        let header = Self {
            kind: read_u32(record, 0)?,
            pid: read_u32(record, 4)?,
            tid: read_u32(record, 8)?,
            handle_kind: read_u32(record, 12)?,
            timestamp_ns: read_u64(record, 16)?,
            handle: read_u64(record, 24)?,
            address: read_u64(record, 32)?,
            name_len: read_u32(record, 40)?,
            truncated: read_u32(record, 44)?,
            unread: read_u32(record, 48)?,
            reserved: read_u32(record, 52)?,
        };
        if header.kind != EventKind::Name as u32 {
            return None;
        }
        let end = Self::SIZE.checked_add(usize::try_from(header.name_len).ok()?)?;
        Some((header, record.get(Self::SIZE..end)?))
    }
}

/// A name record at its largest: what the BPF side assembles in per-CPU scratch before it
/// copies `NameHeader::SIZE + name_len` bytes into the ring buffer.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct NameEvent {
    /// The fixed part.
    pub header: NameHeader,
    /// Room for the name and its NUL.
    pub name: [u8; NAME_CAPACITY],
}

/// `cuKernelGetFunction` returned: in this process, launches of `function` are launches of
/// the library kernel `kernel`, whose name a [`NameHeader`] with [`HandleKind::Kernel`] gave.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelFunctionEvent {
    /// Always [`EventKind::KernelFunction`] as `u32`.
    pub kind: u32,
    /// Process id (tgid).
    pub pid: u32,
    /// Thread id.
    pub tid: u32,
    /// Zero; keeps the handles 8-byte aligned.
    pub reserved: u32,
    /// `bpf_ktime_get_ns` at the function's return.
    pub timestamp_ns: u64,
    /// The `CUkernel` handle passed in.
    pub kernel: u64,
    /// The `CUfunction` handle the driver wrote out.
    pub function: u64,
}

/// `__cudaGetKernel` returned: in this process the host stub `stub` launches through the
/// `CUkernel` handle `kernel`, which the driver's launch entry points then receive (cast as a
/// `CUfunction`). Its name came with the stub's registration ([`HandleKind::Stub`]).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StubKernelEvent {
    /// Always [`EventKind::StubKernel`] as `u32`.
    pub kind: u32,
    /// Process id (tgid).
    pub pid: u32,
    /// Thread id.
    pub tid: u32,
    /// Zero; keeps the handles 8-byte aligned.
    pub reserved: u32,
    /// `bpf_ktime_get_ns` at the function's return.
    pub timestamp_ns: u64,
    /// The host stub's address passed in.
    pub stub: u64,
    /// The `CUkernel` handle the runtime wrote out.
    pub kernel: u64,
}

/// `cudaLaunchKernel` (or `_ptsz`) was entered with `function`: a host stub's address on the
/// legacy path (before CUDA 12.4, or `__NV_LEGACY_LAUNCH`), else the handle `__cudaGetKernel`
/// gave. The runtime then calls the driver on the same thread, so the next launch record of
/// this thread carries the driver's handle for the same kernel.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RuntimeLaunchEvent {
    /// Always [`EventKind::RuntimeLaunch`] as `u32`.
    pub kind: u32,
    /// Process id (tgid).
    pub pid: u32,
    /// Thread id.
    pub tid: u32,
    /// Zero; keeps the handle 8-byte aligned.
    pub reserved: u32,
    /// `bpf_ktime_get_ns` at the probe.
    pub timestamp_ns: u64,
    /// The `func` argument.
    pub function: u64,
}

/// What a [`ContextEvent`] reports; the wire value is [`ContextEvent::op`].
///
/// Together they give, per process, thread -> context stack -> device ordinal, stream ->
/// context, and device ordinal -> UUID: what the agent needs to attribute a launch to the GPU
/// it runs on (a launch runs in its thread's current context).
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ContextOp {
    /// `cuCtxSetCurrent(ctx)`: `handle` replaces the top of the thread's context stack (a
    /// null `handle` pops it).
    SetCurrent = 1,
    /// `cuCtxPushCurrent(ctx)`: `handle` is pushed on the thread's stack.
    Push = 2,
    /// `cuCtxPopCurrent(&ctx)`: the top of the thread's stack is popped.
    Pop = 3,
    /// `cuDevicePrimaryCtxRetain(&ctx, dev)` returned: context `handle` is on ordinal `device`.
    /// It is not made current (the caller does that).
    PrimaryRetained = 4,
    /// `cuCtxCreate*(&ctx, ..., dev)` returned: context `handle` is on ordinal `device` and is
    /// now the top of the thread's stack.
    Created = 5,
    /// `cuStreamCreate*(&stream, ...)` returned: stream `handle` belongs to the thread's
    /// current context.
    StreamCreated = 6,
    /// `cuDeviceGetUuid(&uuid, dev)` returned: ordinal `device` is on the GPU `uuid`. On a MIG
    /// instance this older call answers the physical GPU's UUID, not the instance's.
    DeviceUuid = 7,
    /// `cuDeviceGetUuid_v2(&uuid, dev)` returned: ordinal `device` is the device `uuid`, a MIG
    /// instance's own UUID where the ordinal is one (CUDA documents the difference).
    DeviceUuidV2 = 8,
}

impl ContextOp {
    /// Decodes [`ContextEvent::op`]; `None` for a value this build does not know.
    pub const fn from_u32(value: u32) -> Option<Self> {
        match value {
            1 => Some(Self::SetCurrent),
            2 => Some(Self::Push),
            3 => Some(Self::Pop),
            4 => Some(Self::PrimaryRetained),
            5 => Some(Self::Created),
            6 => Some(Self::StreamCreated),
            7 => Some(Self::DeviceUuid),
            8 => Some(Self::DeviceUuidV2),
            _ => None,
        }
    }
}

/// One driver call that bears on which device a thread's launches run on ([`ContextOp`]).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ContextEvent {
    /// Always [`EventKind::Context`] as `u32`.
    pub kind: u32,
    /// Process id (tgid).
    pub pid: u32,
    /// Thread id.
    pub tid: u32,
    /// A [`ContextOp`] wire value.
    pub op: u32,
    /// `bpf_ktime_get_ns` at the probe.
    pub timestamp_ns: u64,
    /// The `CUcontext` (or, for [`ContextOp::StreamCreated`], the `CUstream`); zero when the
    /// call has none.
    pub handle: u64,
    /// The `CUdevice` ordinal the call named (-1 when it named none).
    pub device: i32,
    /// Zero; keeps `uuid` 8-byte aligned.
    pub reserved: u32,
    /// The device's UUID for [`ContextOp::DeviceUuid`] and [`ContextOp::DeviceUuidV2`]; zero
    /// otherwise.
    pub uuid: [u8; 16],
}

impl ContextEvent {
    /// Reads a context record; `None` when it is not one or is too short.
    pub fn parse(record: &[u8]) -> Option<Self> {
        use core::mem::offset_of;
        let at = offset_of!(Self, uuid);
        let uuid: [u8; 16] = record.get(at..at.checked_add(16)?)?.try_into().ok()?;
        let event = Self {
            kind: read_u32(record, offset_of!(Self, kind))?,
            pid: read_u32(record, offset_of!(Self, pid))?,
            tid: read_u32(record, offset_of!(Self, tid))?,
            op: read_u32(record, offset_of!(Self, op))?,
            timestamp_ns: read_u64(record, offset_of!(Self, timestamp_ns))?,
            handle: read_u64(record, offset_of!(Self, handle))?,
            device: read_u32(record, offset_of!(Self, device))? as i32,
            reserved: read_u32(record, offset_of!(Self, reserved))?,
            uuid,
        };
        (event.kind == EventKind::Context as u32).then_some(event)
    }
}

/// A thread group leader exited (`sched:sched_process_exit` with pid == tgid).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExitEvent {
    /// Always [`EventKind::Exit`] as `u32`.
    pub kind: u32,
    /// The process (tgid) that exited.
    pub pid: u32,
    /// `bpf_ktime_get_ns` at the tracepoint.
    pub timestamp_ns: u64,
}

impl LaunchEvent {
    /// Reads a launch record without unsafe code. `None` when the record is not a launch
    /// record or is too short.
    pub fn parse(record: &[u8]) -> Option<Self> {
        use core::mem::offset_of;
        let u32_of = |at| read_u32(record, at);
        let event = Self {
            kind: u32_of(offset_of!(Self, kind))?,
            pid: u32_of(offset_of!(Self, pid))?,
            tid: u32_of(offset_of!(Self, tid))?,
            sampled: u32_of(offset_of!(Self, sampled))?,
            timestamp_ns: read_u64(record, offset_of!(Self, timestamp_ns))?,
            function: read_u64(record, offset_of!(Self, function))?,
            stream: read_u64(record, offset_of!(Self, stream))?,
            grid: read_u32x3(record, offset_of!(Self, grid))?,
            block: read_u32x3(record, offset_of!(Self, block))?,
            shared_mem_bytes: u32_of(offset_of!(Self, shared_mem_bytes))?,
            entry_point: u32_of(offset_of!(Self, entry_point))?,
            caller: read_u64(record, offset_of!(Self, caller))?,
        };
        (event.kind == EventKind::Launch as u32).then_some(event)
    }
}

impl KernelFunctionEvent {
    /// Reads a kernel-to-function record; `None` when it is not one or is too short.
    pub fn parse(record: &[u8]) -> Option<Self> {
        use core::mem::offset_of;
        let event = Self {
            kind: read_u32(record, offset_of!(Self, kind))?,
            pid: read_u32(record, offset_of!(Self, pid))?,
            tid: read_u32(record, offset_of!(Self, tid))?,
            reserved: read_u32(record, offset_of!(Self, reserved))?,
            timestamp_ns: read_u64(record, offset_of!(Self, timestamp_ns))?,
            kernel: read_u64(record, offset_of!(Self, kernel))?,
            function: read_u64(record, offset_of!(Self, function))?,
        };
        (event.kind == EventKind::KernelFunction as u32).then_some(event)
    }
}

impl StubKernelEvent {
    /// Reads a stub-to-kernel record; `None` when it is not one or is too short.
    pub fn parse(record: &[u8]) -> Option<Self> {
        use core::mem::offset_of;
        let event = Self {
            kind: read_u32(record, offset_of!(Self, kind))?,
            pid: read_u32(record, offset_of!(Self, pid))?,
            tid: read_u32(record, offset_of!(Self, tid))?,
            reserved: read_u32(record, offset_of!(Self, reserved))?,
            timestamp_ns: read_u64(record, offset_of!(Self, timestamp_ns))?,
            stub: read_u64(record, offset_of!(Self, stub))?,
            kernel: read_u64(record, offset_of!(Self, kernel))?,
        };
        (event.kind == EventKind::StubKernel as u32).then_some(event)
    }
}

impl RuntimeLaunchEvent {
    /// Reads a runtime-launch record; `None` when it is not one or is too short.
    pub fn parse(record: &[u8]) -> Option<Self> {
        use core::mem::offset_of;
        let event = Self {
            kind: read_u32(record, offset_of!(Self, kind))?,
            pid: read_u32(record, offset_of!(Self, pid))?,
            tid: read_u32(record, offset_of!(Self, tid))?,
            reserved: read_u32(record, offset_of!(Self, reserved))?,
            timestamp_ns: read_u64(record, offset_of!(Self, timestamp_ns))?,
            function: read_u64(record, offset_of!(Self, function))?,
        };
        (event.kind == EventKind::RuntimeLaunch as u32).then_some(event)
    }
}

impl ExitEvent {
    /// Reads an exit record; `None` when it is not one or is too short.
    pub fn parse(record: &[u8]) -> Option<Self> {
        use core::mem::offset_of;
        let event = Self {
            kind: read_u32(record, offset_of!(Self, kind))?,
            pid: read_u32(record, offset_of!(Self, pid))?,
            timestamp_ns: read_u64(record, offset_of!(Self, timestamp_ns))?,
        };
        (event.kind == EventKind::Exit as u32).then_some(event)
    }
}

pub(crate) fn read_u32x3(record: &[u8], at: usize) -> Option<[u32; 3]> {
    Some([
        read_u32(record, at)?,
        read_u32(record, at.checked_add(4)?)?,
        read_u32(record, at.checked_add(8)?)?,
    ])
}

pub(crate) fn read_u32(record: &[u8], at: usize) -> Option<u32> {
    let bytes = record.get(at..at.checked_add(4)?)?;
    Some(u32::from_ne_bytes(bytes.try_into().ok()?))
}

pub(crate) fn read_u64(record: &[u8], at: usize) -> Option<u64> {
    let bytes = record.get(at..at.checked_add(8)?)?;
    Some(u64::from_ne_bytes(bytes.try_into().ok()?))
}

// Both sides read the records by size and offset; a change here must be deliberate.
const _: () = {
    use core::mem::{align_of, offset_of};
    assert!(size_of::<LaunchEvent>() == 80);
    assert!(align_of::<LaunchEvent>() == 8);
    assert!(offset_of!(LaunchEvent, kind) == 0);
    assert!(offset_of!(LaunchEvent, function) == 24);
    assert!(offset_of!(LaunchEvent, entry_point) == 68);
    assert!(offset_of!(LaunchEvent, caller) == 72);
    assert!(size_of::<NameHeader>() == 56);
    assert!(offset_of!(NameHeader, kind) == 0);
    assert!(offset_of!(NameHeader, handle) == 24);
    assert!(offset_of!(NameHeader, address) == 32);
    assert!(offset_of!(NameHeader, name_len) == 40);
    assert!(offset_of!(NameHeader, truncated) == 44);
    assert!(offset_of!(NameHeader, unread) == 48);
    assert!(offset_of!(NameEvent, name) == NameHeader::SIZE);
    assert!(size_of::<NameEvent>() == NameHeader::SIZE + NAME_CAPACITY);
    assert!(NAME_CAPACITY.is_power_of_two());
    assert!(size_of::<KernelFunctionEvent>() == 40);
    assert!(offset_of!(KernelFunctionEvent, kind) == 0);
    assert!(offset_of!(KernelFunctionEvent, kernel) == 24);
    assert!(offset_of!(KernelFunctionEvent, function) == 32);
    assert!(size_of::<StubKernelEvent>() == 40);
    assert!(offset_of!(StubKernelEvent, stub) == 24);
    assert!(offset_of!(StubKernelEvent, kernel) == 32);
    assert!(size_of::<RuntimeLaunchEvent>() == 32);
    assert!(offset_of!(RuntimeLaunchEvent, function) == 24);
    assert!(size_of::<ExitEvent>() == 16);
    assert!(size_of::<ContextEvent>() == 56);
    assert!(offset_of!(ContextEvent, op) == 12);
    assert!(offset_of!(ContextEvent, handle) == 24);
    assert!(offset_of!(ContextEvent, device) == 32);
    assert!(offset_of!(ContextEvent, uuid) == 40);
    assert!(offset_of!(ExitEvent, kind) == 0);
    assert!(offset_of!(ExitEvent, timestamp_ns) == 8);
};

#[cfg(test)]
mod tests {
    use core::mem::offset_of;

    use super::*;

    #[test]
    fn launch_event_offsets_are_the_ones_the_object_was_built_with() {
        assert_eq!(offset_of!(LaunchEvent, sampled), 12);
        assert_eq!(offset_of!(LaunchEvent, timestamp_ns), 16);
        assert_eq!(offset_of!(LaunchEvent, stream), 32);
        assert_eq!(offset_of!(LaunchEvent, grid), 40);
        assert_eq!(offset_of!(LaunchEvent, block), 52);
        assert_eq!(offset_of!(LaunchEvent, shared_mem_bytes), 64);
        assert_eq!(offset_of!(LaunchEvent, entry_point), 68);
    }

    #[test]
    fn event_kinds_round_trip_and_lead_every_record() {
        for kind in [
            EventKind::Launch,
            EventKind::Name,
            EventKind::Exit,
            EventKind::KernelFunction,
            EventKind::StubKernel,
            EventKind::RuntimeLaunch,
            EventKind::Context,
            EventKind::Graph,
        ] {
            let mut record = [0u8; 16];
            record[..4].copy_from_slice(&(kind as u32).to_ne_bytes());
            assert_eq!(EventKind::of_record(&record), Some(kind));
        }
        assert_eq!(EventKind::of_record(&[2, 0, 0]), None);
        assert_eq!(EventKind::of_record(&0u32.to_ne_bytes()), None);
        assert_eq!(
            HandleKind::from_u32(HandleKind::Kernel as u32),
            Some(HandleKind::Kernel)
        );
        assert_eq!(HandleKind::from_u32(0), None);
    }

    /// A record laid out field by field as the BPF program writes it.
    fn name_record(buf: &mut [u8; 80], name: &[u8], claimed_len: u32) -> usize {
        let fields: [(usize, &[u8]); 10] = [
            (0, &(EventKind::Name as u32).to_ne_bytes()),
            (4, &7u32.to_ne_bytes()),
            (8, &9u32.to_ne_bytes()),
            (12, &(HandleKind::Function as u32).to_ne_bytes()),
            (16, &11u64.to_ne_bytes()),
            (24, &0xdead_beef_u64.to_ne_bytes()),
            (32, &0x7f00_1000_u64.to_ne_bytes()),
            (40, &claimed_len.to_ne_bytes()),
            (44, &0u32.to_ne_bytes()),
            (48, &u32::from(name.is_empty()).to_ne_bytes()),
        ];
        for (at, bytes) in fields {
            buf[at..at + bytes.len()].copy_from_slice(bytes);
        }
        buf[NameHeader::SIZE..NameHeader::SIZE + name.len()].copy_from_slice(name);
        NameHeader::SIZE + name.len()
    }

    #[test]
    fn name_records_parse_into_header_and_exact_name() {
        let mut buf = [0u8; 80];
        let len = name_record(&mut buf, b"_Z3addPf", 8);
        let (header, name) = NameHeader::parse(&buf[..len]).unwrap();
        assert_eq!(name, b"_Z3addPf");
        assert_eq!((header.pid, header.tid, header.timestamp_ns), (7, 9, 11));
        assert_eq!((header.handle, header.address), (0xdead_beef, 0x7f00_1000));
        assert_eq!(header.unread, 0);
        assert_eq!(
            HandleKind::from_u32(header.handle_kind),
            Some(HandleKind::Function)
        );
    }

    #[test]
    fn context_records_round_trip_and_short_ones_are_rejected() {
        let mut buf = [0u8; size_of::<ContextEvent>()];
        let fields: [(usize, &[u8]); 6] = [
            (0, &(EventKind::Context as u32).to_ne_bytes()),
            (4, &42u32.to_ne_bytes()),
            (12, &(ContextOp::DeviceUuid as u32).to_ne_bytes()),
            (24, &0xc0ffee_u64.to_ne_bytes()),
            (32, &(-1i32).to_ne_bytes()),
            (40, &[7u8; 16]),
        ];
        for (at, bytes) in fields {
            buf[at..at + bytes.len()].copy_from_slice(bytes);
        }
        let event = ContextEvent::parse(&buf).unwrap();
        assert_eq!((event.pid, event.handle, event.device), (42, 0xc0ffee, -1));
        assert_eq!(ContextOp::from_u32(event.op), Some(ContextOp::DeviceUuid));
        assert_eq!(event.uuid, [7u8; 16]);
        assert_eq!(ContextEvent::parse(&buf[..buf.len() - 1]), None);
        assert_eq!(ContextOp::from_u32(0), None);
        assert_eq!(ContextOp::from_u32(8), Some(ContextOp::DeviceUuidV2));
        assert_eq!(ContextOp::from_u32(9), None);
    }

    #[test]
    fn unread_name_records_carry_the_address_and_no_name() {
        let mut buf = [0u8; 80];
        let len = name_record(&mut buf, b"", 0);
        assert_eq!(len, NameHeader::SIZE);
        let (header, name) = NameHeader::parse(&buf[..len]).unwrap();
        assert!(name.is_empty());
        assert_eq!((header.unread, header.address), (1, 0x7f00_1000));
    }

    #[test]
    fn name_records_shorter_than_their_length_are_rejected() {
        let mut buf = [0u8; 80];
        let len = name_record(&mut buf, b"_Z3addPf", 9);
        assert_eq!(NameHeader::parse(&buf[..len]), None);
        assert_eq!(NameHeader::parse(&buf[..NameHeader::SIZE - 1]), None);
        buf[0] = EventKind::Launch as u8;
        assert_eq!(NameHeader::parse(&buf), None);
    }
}
