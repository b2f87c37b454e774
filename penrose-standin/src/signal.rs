//! Stopping a looping replay cleanly on SIGINT and SIGTERM: the handlers set a flag the replay
//! loop polls, so the replayer still prints its summary and removes its ring when interrupted.
//! (The agent has handlers of its own; test equipment does not depend on the agent.)

use std::sync::atomic::{AtomicBool, Ordering};

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_signal: libc::c_int) {
    // Only an atomic store: async-signal-safe.
    STOP.store(true, Ordering::Relaxed);
}

/// Installs the handlers and returns the flag they set.
pub fn stop_on_signals() -> std::io::Result<&'static AtomicBool> {
    for sig in [libc::SIGINT, libc::SIGTERM] {
        let handler = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
        // SAFETY: installs a handler that only performs an atomic store.
        if unsafe { libc::signal(sig, handler) } == libc::SIG_ERR {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(&STOP)
}
