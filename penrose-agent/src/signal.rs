//! Stopping cleanly on SIGINT and SIGTERM: the handlers set a flag the work loop polls, so a
//! capture still prints what it saw (and the stand-in replayer its summary) when interrupted.

// FFI: installing a signal handler; the block says why it is sound.
#![allow(unsafe_code)]

use std::sync::atomic::{AtomicBool, Ordering};

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_signal: libc::c_int) {
    // Only an atomic store: async-signal-safe.
    STOP.store(true, Ordering::Relaxed);
}

/// Installs the handlers and returns the flag they set. SIGHUP, which would otherwise end the
/// process without its summary or final status, is ignored: the agent reads its configuration
/// only at start (docs/architecture.md, "Signals": every tier handles SIGINT and SIGTERM as a
/// clean stop and never dies of SIGHUP).
pub fn stop_on_signals() -> std::io::Result<&'static AtomicBool> {
    for sig in [libc::SIGINT, libc::SIGTERM] {
        let handler = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
        // SAFETY: installs a handler that only performs an atomic store.
        if unsafe { libc::signal(sig, handler) } == libc::SIG_ERR {
            return Err(std::io::Error::last_os_error());
        }
    }
    // SAFETY: SIG_IGN installs no code; the disposition is inherited by nothing (no exec).
    if unsafe { libc::signal(libc::SIGHUP, libc::SIG_IGN) } == libc::SIG_ERR {
        return Err(std::io::Error::last_os_error());
    }
    Ok(&STOP)
}
