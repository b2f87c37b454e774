//! Event types and names shared by the Penrose eBPF programs and the agent that loads them.
//!
//! Both sides compile this crate, so a layout change is a compile-time change on both sides;
//! `#[repr(C)]` keeps the layout the one the BPF verifier and the agent agree on, and
//! compile-time assertions pin every size and offset the committed object was built with.
#![no_std]

mod entry_point;
mod events;
mod graphs;
pub mod maps;
pub mod probes;

pub use entry_point::EntryPoint;
pub use events::{
    ContextEvent, ContextOp, EventKind, ExitEvent, HandleKind, KernelFunctionEvent, LaunchEvent,
    NAME_CAPACITY, NameEvent, NameHeader, RuntimeLaunchEvent, SampleConfig, StubKernelEvent,
};
pub use graphs::{GRAPH_KERNELS_ENTRIES, GraphEvent, GraphKey, GraphOp};
pub use probes::{
    Library, PROCESS_EXIT, ProbeKind, ProbeRole, TracePoint, USER_PROBES, UserProbe, programs,
};
