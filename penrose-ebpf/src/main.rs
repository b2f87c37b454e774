//! Penrose eBPF programs: uprobes on the CUDA driver's launch and name entry points and on
//! the CUDA runtime's stub registration and launch ([`runtime`]), and the process-exit
//! tracepoint, all feeding one ring buffer.
//!
//! One program per launch entry point, because each has its own argument layout; they share
//! [`launch`]'s `submit`, which stamps, samples and queues the event. The agent attaches and
//! detaches those to open and close capture windows (docs/design.md section 3). The name probes
//! ([`names`]), the context probes that attribute launches to devices ([`devices`]), the graph
//! probes that tell which kernels a graph launch runs ([`graphs`]) and the exit tracepoint
//! ([`exit`]) stay attached.
#![no_std]
#![no_main]

mod devices;
mod exit;
mod graphs;
mod launch;
mod maps;
mod names;
mod runtime;
mod sampling;

/// The verifier rejects any program that could reach a panic, so none can at run time; this
/// only satisfies `no_std`.
#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo<'_>) -> ! {
    loop {}
}
