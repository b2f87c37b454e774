//! Penrose eBPF programs: uprobes on the CUDA driver's launch entry points.
//!
//! One program per entry point, because each has its own argument layout; they share
//! [`launch::submit`], which stamps, samples and queues the event. The agent attaches and
//! detaches these programs to open and close capture windows (DESIGN.md section 3).
#![no_std]
#![no_main]

mod launch;
mod maps;
mod sampling;

/// The verifier rejects any program that could reach a panic, so none can at run time; this
/// only satisfies `no_std`.
#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo<'_>) -> ! {
    loop {}
}
