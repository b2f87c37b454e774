//! The host layer: what every tier does with the operating system, written once.
//!
//! `penrose-core` does no I/O; each tier (agent, aggregation server, design server, issuer,
//! auditor) used to carry its own clock, its own secret-file writer, its own reader of the
//! design server's public key and its own temp-file-and-rename. This crate is the one answer to
//! each of those questions, one floor above the core and below every tier: it depends on
//! `penrose-core` only, and holds no tier's logic.
//!
//! - [`clock`]: the time and the day (a [`Clock`] trait, the system clock, a manual clock for
//!   tests).
//! - [`data_dir`]: the layout every server's directory shares (db, TLS identity, admin
//!   socket).
//! - [`error`]: [`FileError`], the one way a file refusal is told; each tier wraps it.
//! - [`secret_file`]: owner-only files (keys, seeds, credentials), read and created one way.
//! - [`bounded`]: public files read with a bound (no FIFO can hang the reader, no file can
//!   exhaust memory).
//! - [`key_file`]: the design server's public key and the signer files (list and bundle
//!   signers), one reader each, with the key floor.
//! - [`durable`]: replace a file so that a crash leaves it whole, old or new.
//! - [`output`]: a command's result as text or `--json`, the same way in every CLI.
//! - [`exit`]: the exit codes every binary shares, and how `main` ends.
//! - [`skip`]: how a test that cannot run here says so, past libtest's capture, for CI to count.
//! - [`process`]: start-up and stop: logs, the ready line, the stop and reload signals.

pub mod bounded;
pub mod clock;
pub mod data_dir;
pub mod durable;
pub mod error;
pub mod exit;
pub mod key_file;
pub mod output;
pub mod process;
pub mod secret_file;
pub mod skip;

pub use clock::{Clock, ManualClock, SystemClock};
pub use error::FileError;
pub use exit::Exit;

/// This process's effective user id.
#[allow(unsafe_code)]
pub fn effective_uid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// What the module tests share.
#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod test_support {
    /// Makes a FIFO at `path` (with no writer: opening it for reading would block).
    pub(crate) fn mkfifo(path: &std::path::Path) {
        let name = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
        #[allow(unsafe_code)]
        // SAFETY: `name` is a NUL-terminated path that outlives the call.
        let made = unsafe { libc::mkfifo(name.as_ptr(), 0o600) };
        assert_eq!(made, 0);
    }
}
